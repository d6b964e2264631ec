/*
 * dtype.h - scalar conversions between f32 and f16 / bf16, for host code and
 * CUDA device code alike. Round to nearest even, NaN kept quiet, inf kept.
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


#if !defined(__CUDACC__)
#include "attnkit.h"

/* Element i of a buffer of dtype t, as f32 (host code; f32/f16/bf16). */
static inline float ak_load_as_f32(const void *p, ak_dtype t, int64_t i)
{
    switch (t) {
    case AK_F16: return ak_f16_to_f32(((const uint16_t *)p)[i]);
    case AK_BF16: return ak_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static inline void ak_store_from_f32(void *p, ak_dtype t, int64_t i, float x)
{
    switch (t) {
    case AK_F16: ((uint16_t *)p)[i] = ak_f32_to_f16(x); break;
    case AK_BF16: ((uint16_t *)p)[i] = ak_f32_to_bf16(x); break;
    default: ((float *)p)[i] = x; break;
    }
}
#endif

#endif /* AK_DTYPE_H */
