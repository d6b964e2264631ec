/*
 * dtype.h - scalar conversions between f32 and f16 / bf16 / fp8 e4m3, for
 * host code and CUDA device code alike. Round to nearest even, NaN kept
 * quiet, inf kept (f16, bf16); e4m3 has no inf: see ak_e4m3_quantize.
 */
#ifndef AK_DTYPE_H
#define AK_DTYPE_H

#include "hostdev.h"

#include <stdint.h>
#include <string.h>

AK_HD uint32_t ak_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

AK_HD float ak_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

AK_HD float ak_bf16_to_f32(uint16_t h) { return ak_bits_f32((uint32_t)h << 16); }

AK_HD uint16_t ak_f32_to_bf16(float f)
{
    uint32_t u = ak_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

AK_HD float ak_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return ak_bits_f32(sign | 0x7f800000u | (man << 13)); /* inf/NaN */
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 is exact in f32 */
        const float mag = (float)man * (1.0f / 16777216.0f);
        return sign ? -mag : mag;
    }
    return ak_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

AK_HD uint16_t ak_f32_to_f16(float f)
{
    const uint32_t u = ak_f32_bits(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);   /* NaN */
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* rounds to inf */
    if (abs < 0x38800000u) {
        /* subnormal or zero in f16: round abs * 2^24 to an integer, ties to even */
        const float scaled = ak_bits_f32(abs) * 16777216.0f;
        uint32_t q = (uint32_t)scaled;
        const float rem = scaled - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias the exponent and round the 13 dropped mantissa bits */
    uint32_t r = abs - ((uint32_t)(127 - 15) << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

/* ---- fp8 e4m3 (e4m3fn: bias 7, no infinities, S.1111.111 = NaN) ---------- */

/* The largest finite e4m3 value, 1.75 * 2^8, and its code. */
#define AK_E4M3_MAX 448.0f
#define AK_E4M3_MAX_CODE 0x7eu
#define AK_E4M3_NAN_CODE 0x7fu

AK_HD float ak_e4m3_to_f32(uint8_t b)
{
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24, mag = b & 0x7fu;
    if (mag == AK_E4M3_NAN_CODE) return ak_bits_f32(sign | 0x7fc00000u);
    if (mag < 8u) return ak_bits_f32(sign | ak_f32_bits((float)mag * (1.0f / 512.0f))); /* m * 2^-9 */
    return ak_bits_f32(sign | ((mag + (120u << 3)) << 20)); /* exponent bias 7 -> 127 */
}

/* y rounded to the nearest e4m3 value, ties to even; beyond +-448 (+-inf
 * included) saturates to +-448; NaN stays NaN. */
AK_HD uint8_t ak_f32_to_e4m3(float y)
{
    const uint32_t u = ak_f32_bits(y), abs = u & 0x7fffffffu;
    const uint32_t sign = (u >> 24) & 0x80u;
    if (abs > 0x7f800000u) return (uint8_t)(sign | AK_E4M3_NAN_CODE);
    if (abs >= 0x43e00000u) return (uint8_t)(sign | AK_E4M3_MAX_CODE); /* >= 448 */
    if (abs < 0x3c800000u) {
        /* below 2^-6, the subnormals: round abs * 2^9 to an integer, ties to
         * even (8 is 2^-6, the first normal code) */
        const float scaled = ak_bits_f32(abs) * 512.0f;
        uint32_t q = (uint32_t)scaled;
        const float rem = scaled - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
        return (uint8_t)(sign | q);
    }
    /* normal: rebias the exponent, round the 20 dropped mantissa bits */
    uint32_t r = abs - (120u << 23);
    r += 0x7ffffu + ((r >> 20) & 1u);
    return (uint8_t)(sign | (r >> 20));
}

/* What ak_kv_update stores for x under a scale (attnkit.h): NaN for a NaN or
 * infinite x (an infinity is never hidden as 448), else e4m3 of x / scale
 * divided in IEEE f32 (correctly rounded on the device too, whatever
 * --use_fast_math makes of '/'). */
AK_HD uint8_t ak_e4m3_quantize(float x, float scale)
{
    const uint32_t u = ak_f32_bits(x);
    if ((u & 0x7fffffffu) >= 0x7f800000u) return (uint8_t)(((u >> 24) & 0x80u) | AK_E4M3_NAN_CODE);
#if defined(__CUDA_ARCH__)
    return ak_f32_to_e4m3(__fdiv_rn(x, scale));
#else
    return ak_f32_to_e4m3(x / scale);
#endif
}

#if !defined(__CUDACC__)
#include "attnkit.h"

/* Element i of a buffer of dtype t, as f32 (host code; fp8 unscaled). */
static inline float ak_load_as_f32(const void *p, ak_dtype t, int64_t i)
{
    switch (t) {
    case AK_F16: return ak_f16_to_f32(((const uint16_t *)p)[i]);
    case AK_BF16: return ak_bf16_to_f32(((const uint16_t *)p)[i]);
    case AK_FP8_E4M3: return ak_e4m3_to_f32(((const uint8_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* (fp8: quantized with a scale of 1) */
static inline void ak_store_from_f32(void *p, ak_dtype t, int64_t i, float x)
{
    switch (t) {
    case AK_F16: ((uint16_t *)p)[i] = ak_f32_to_f16(x); break;
    case AK_BF16: ((uint16_t *)p)[i] = ak_f32_to_bf16(x); break;
    case AK_FP8_E4M3: ((uint8_t *)p)[i] = ak_e4m3_quantize(x, 1.0f); break;
    default: ((float *)p)[i] = x; break;
    }
}
#endif

#endif /* AK_DTYPE_H */
