/*
 * simd.h - the vector vocabulary of the cpu backend's kernels: one set of
 * names (vf_load, vf_fma, vf_exp, ...) over three instruction sets, chosen by
 * the file that includes it (each kernels_*.c includes it exactly once):
 *
 *   AK_CPU_ISA_AVX512   16 floats per vector (AVX-512F)
 *   AK_CPU_ISA_AVX2      8 floats per vector (AVX2 + FMA + F16C)
 *   neither              1 float per "vector": portable C, the fallback
 *
 * Besides the vector type it fixes each ISA's register blocking of the two
 * micro-kernels (AK_QK_MR, AK_PV_MR, AK_PV_NV): how many accumulators fit in
 * the register file is a property of the ISA, not of the algorithm.
 *
 * vf_exp and vf_tanh are polynomial approximations good to a few ulp over the
 * range the kernels use; they are not general-purpose libm replacements, but
 * both pass NaN through (a NaN logit must reach the row's sum, see
 * attn_cpu_kernel.h).
 */
#ifndef AK_CPU_SIMD_H
#define AK_CPU_SIMD_H

#include "dtype.h"

#include <math.h>
#include <stdint.h>

#define AK_INLINE static inline __attribute__((always_inline))

/* exp(x) below this is 0 in the kernels: exp(-87) = 1.6e-38 is still a normal
 * float, so 2^n scaling never has to build a subnormal. */
#define AK_EXP_MIN (-87.0f)
#define AK_LOG2E 1.44269504088896341f
/* ln 2 split in two so that n * ln2_hi is exact for |n| < 2^11 */
#define AK_LN2_HI 0.693145751953125f
#define AK_LN2_LO 1.42860682030941723212e-6f
/* Taylor coefficients 1/k! of exp(r) for |r| <= ln2 / 2: degree 7 leaves a
 * truncation error of r^8 / 8! < 5e-9, below f32 rounding. */
#define AK_EXP_C2 (1.0f / 2.0f)
#define AK_EXP_C3 (1.0f / 6.0f)
#define AK_EXP_C4 (1.0f / 24.0f)
#define AK_EXP_C5 (1.0f / 120.0f)
#define AK_EXP_C6 (1.0f / 720.0f)
#define AK_EXP_C7 (1.0f / 5040.0f)

/* vf_load_e4m3 on AVX2 and AVX-512 (AK_E4M3_VIA_F16): an e4m3 byte
 * S.EEEE.MMM becomes the f16 S.0EEEE.MMM0000000, whose exponent bias (15) is
 * 8 above e4m3's (7), so the f16 conversion unit (exact, subnormals
 * included: m * 2^-17 for EEEE = 0) gives x / 2^8, and one multiply by 2^8
 * restores it; the NaN code S.1111.111 gets the all-ones f16 exponent. Equal
 * to ak_e4m3_to_f32 for every byte (test_core checks all 256). */
#define AK_E4M3_VIA_F16_SCALE 256.0f

/* The keys per QK block is 4 on every ISA: vf_hsum4 reduces four dot products
 * at once. */
#define AK_QK_NR 4

/* ======================================================================== */
#if defined(AK_CPU_ISA_AVX512)
/* ======================================================================== */
#include <immintrin.h>

typedef __m512 vf;
typedef __m512i vi;
#define AK_VW 16
/* 32 zmm registers: QK keeps 6 x 4 accumulators + 4 key vectors + 1 query;
 * PV keeps 6 x 4 accumulators + 4 value vectors + 1 broadcast. */
#define AK_QK_MR 6
#define AK_PV_MR 6
#define AK_PV_NV 4
/* Rows per KV head up to which K/V are read straight from the cache (else a
 * tile is converted and transposed once into scratch). 8 covers a GQA group
 * of 8 (QK blocks 6 + 2, so K is converted twice): decode 64/8 heads, f16,
 * fraction of a streaming read 0.42-0.43 with 6, 0.51-0.60 with 8. */
#define AK_IN_PLACE_ROWS 8

AK_INLINE vf vf_zero(void) { return _mm512_setzero_ps(); }
AK_INLINE vf vf_set1(float x) { return _mm512_set1_ps(x); }
AK_INLINE vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
AK_INLINE void vf_store(float *p, vf x) { _mm512_storeu_ps(p, x); }
AK_INLINE vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
AK_INLINE vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
AK_INLINE vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
AK_INLINE vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
/* b where either is NaN (MAXPS), on every ISA: vf_max(c, x) passes a NaN x */
AK_INLINE vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
AK_INLINE vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
AK_INLINE vf vf_fnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
AK_INLINE vf vf_abs(vf a) { return _mm512_abs_ps(a); }
AK_INLINE vf vf_copysign(vf mag, vf sign)
{
    const vi m = _mm512_set1_epi32((int)0x80000000u);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_andnot_si512(m, _mm512_castps_si512(mag)),
                                               _mm512_and_si512(m, _mm512_castps_si512(sign))));
}
AK_INLINE float vf_hsum(vf a) { return _mm512_reduce_add_ps(a); }
AK_INLINE float vf_first(vf a) { return _mm512_cvtss_f32(a); }
AK_INLINE float vf_hmax(vf a) { return _mm512_reduce_max_ps(a); }

/* 2^n * p for integral-valued n (as floats) in [-126, 127]. */
AK_INLINE vf vf_ldexp(vf p, vf n)
{
    const vi e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
AK_INLINE vf vf_round(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* a where x < lim, else b (b where x is NaN) */
AK_INLINE vf vf_select_lt(vf x, float lim, vf a, vf b)
{
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(lim), _CMP_LT_OQ), b, a);
}
/* r, but 0 where x < lo (a NaN x keeps r) */
AK_INLINE vf vf_zero_below(vf r, vf x, float lo)
{
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(lo), _CMP_NLT_UQ), r);
}
/* x where finite, else NaN */
AK_INLINE vf vf_nan_unless_finite(vf x)
{
    const __mmask16 finite = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
    return _mm512_mask_mov_ps(_mm512_set1_ps(NAN), finite, x);
}
/* NaN in every lane if any lane of x is not finite, else 0 */
AK_INLINE vf vf_nonfinite_mark(vf x) { return _mm512_mul_ps(x, _mm512_setzero_ps()); }

AK_INLINE vf vf_load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
/* 16 fp8 e4m3 values (unscaled), by way of f16 (see AK_E4M3_VIA_F16). */
AK_INLINE vf vf_load_e4m3(const uint8_t *p)
{
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi16(0x7f));
    __m256i h = _mm256_or_si256(_mm256_slli_epi16(mag, 7),
                                _mm256_and_si256(_mm256_slli_epi16(b, 8), _mm256_set1_epi16((short)0x8000)));
    h = _mm256_or_si256(h, _mm256_and_si256(_mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f)),
                                            _mm256_set1_epi16(0x7c00)));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(AK_E4M3_VIA_F16_SCALE));
}
AK_INLINE vf vf_load_bf16(const uint16_t *p)
{
    const vi w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
AK_INLINE void vf_store_f16(uint16_t *p, vf x)
{
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
AK_INLINE void vf_store_bf16(uint16_t *p, vf x)
{
    /* round to nearest even on the bits, as ak_f32_to_bf16; NaN stays quiet */
    const vi u = _mm512_castps_si512(x);
    const vi lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    vi r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(r));
}

/* out[i] = sum of the lanes of the i-th argument */
AK_INLINE void vf_hsum4(vf a, vf b, vf c, vf d, float *out)
{
    /* fold 512 -> 256 bits, then the AVX2 pairwise tree */
#define AK_FOLD256(x)                                                                              \
    _mm256_add_ps(_mm512_castps512_ps256(x),                                                       \
                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)))
    const __m256 a8 = AK_FOLD256(a), b8 = AK_FOLD256(b), c8 = AK_FOLD256(c), d8 = AK_FOLD256(d);
#undef AK_FOLD256
    const __m256 ab = _mm256_hadd_ps(a8, b8), cd = _mm256_hadd_ps(c8, d8);
    const __m256 abcd = _mm256_hadd_ps(ab, cd);
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}

/* r[0..15] = the columns of the 16 x 16 block whose rows were r[0..15]:
 * 32-bit, 64-bit and two 128-bit-lane interleaves, 64 shuffles. */
AK_INLINE void vf_transpose(vf r[AK_VW])
{
    vf u[16], v[16], w[16];
    for (int k = 0; k < 8; k++) {
        u[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        u[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    /* v[4k + c], lane L: rows 4k .. 4k + 3 of column 4L + c */
    for (int k = 0; k < 4; k++) {
        const __m512d a = _mm512_castps_pd(u[4 * k]), b = _mm512_castps_pd(u[4 * k + 1]);
        const __m512d c = _mm512_castps_pd(u[4 * k + 2]), d = _mm512_castps_pd(u[4 * k + 3]);
        v[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        v[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        v[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        v[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; c++) {
        w[c] = _mm512_shuffle_f32x4(v[c], v[4 + c], 0x88);
        w[4 + c] = _mm512_shuffle_f32x4(v[c], v[4 + c], 0xdd);
        w[8 + c] = _mm512_shuffle_f32x4(v[8 + c], v[12 + c], 0x88);
        w[12 + c] = _mm512_shuffle_f32x4(v[8 + c], v[12 + c], 0xdd);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_f32x4(w[c], w[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(w[c], w[8 + c], 0xdd);
        r[4 + c] = _mm512_shuffle_f32x4(w[4 + c], w[12 + c], 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(w[4 + c], w[12 + c], 0xdd);
    }
}

/* ======================================================================== */
#elif defined(AK_CPU_ISA_AVX2)
/* ======================================================================== */
#include <immintrin.h>

typedef __m256 vf;
typedef __m256i vi;
#define AK_VW 8
/* 16 ymm registers: QK keeps 3 x 4 accumulators + 4 key vectors (the query
 * comes in as the FMA's memory operand); PV keeps 4 x 3 accumulators + 3
 * value vectors + 1 broadcast. Both: 12 FMAs per 7 loads. */
#define AK_QK_MR 3
#define AK_PV_MR 4
#define AK_PV_NV 3
/* Rows per KV head up to which K/V are read straight from the cache: a GQA
 * group of 4 (llama3) is one PV block and two QK blocks (3 + 1), so K is
 * converted twice, which still beats a round trip through scratch. */
#define AK_IN_PLACE_ROWS 4

AK_INLINE vf vf_zero(void) { return _mm256_setzero_ps(); }
AK_INLINE vf vf_set1(float x) { return _mm256_set1_ps(x); }
AK_INLINE vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
AK_INLINE void vf_store(float *p, vf x) { _mm256_storeu_ps(p, x); }
AK_INLINE vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
AK_INLINE vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
AK_INLINE vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
AK_INLINE vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
AK_INLINE vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
AK_INLINE vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
AK_INLINE vf vf_fnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
AK_INLINE vf vf_abs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
AK_INLINE vf vf_copysign(vf mag, vf sign)
{
    const vf m = _mm256_set1_ps(-0.0f);
    return _mm256_or_ps(_mm256_andnot_ps(m, mag), _mm256_and_ps(m, sign));
}
AK_INLINE float vf_first(vf a) { return _mm256_cvtss_f32(a); }
AK_INLINE float vf_hsum(vf a)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
AK_INLINE float vf_hmax(vf a)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

AK_INLINE vf vf_ldexp(vf p, vf n)
{
    const vi e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
AK_INLINE vf vf_round(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
AK_INLINE vf vf_select_lt(vf x, float lim, vf a, vf b)
{
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, _mm256_set1_ps(lim), _CMP_LT_OQ));
}
AK_INLINE vf vf_zero_below(vf r, vf x, float lo)
{
    return _mm256_and_ps(r, _mm256_cmp_ps(x, _mm256_set1_ps(lo), _CMP_NLT_UQ));
}
AK_INLINE vf vf_nan_unless_finite(vf x)
{
    const vf finite = _mm256_cmp_ps(vf_abs(x), _mm256_set1_ps(INFINITY), _CMP_LT_OQ);
    return _mm256_blendv_ps(_mm256_set1_ps(NAN), x, finite);
}
AK_INLINE vf vf_nonfinite_mark(vf x) { return _mm256_mul_ps(x, _mm256_setzero_ps()); }

AK_INLINE vf vf_load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
/* 8 fp8 e4m3 values (unscaled), by way of f16 (see AK_E4M3_VIA_F16). */
AK_INLINE vf vf_load_e4m3(const uint8_t *p)
{
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    const __m128i mag = _mm_and_si128(b, _mm_set1_epi16(0x7f));
    __m128i h = _mm_or_si128(_mm_slli_epi16(mag, 7), _mm_and_si128(_mm_slli_epi16(b, 8), _mm_set1_epi16((short)0x8000)));
    h = _mm_or_si128(h, _mm_and_si128(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7c00)));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(AK_E4M3_VIA_F16_SCALE));
}
AK_INLINE vf vf_load_bf16(const uint16_t *p)
{
    const vi w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
AK_INLINE void vf_store_f16(uint16_t *p, vf x)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
AK_INLINE void vf_store_bf16(uint16_t *p, vf x)
{
    /* round to nearest even on the bits, as ak_f32_to_bf16; NaN stays quiet */
    const vi u = _mm256_castps_si256(x);
    const vi lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    vi r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const vi nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
    /* packus works per 128-bit lane: gather the two low quadwords afterwards */
    const vi packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(packed));
}

AK_INLINE void vf_hsum4(vf a, vf b, vf c, vf d, float *out)
{
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    const __m256 abcd = _mm256_hadd_ps(ab, cd);
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}

/* r[0..7] = the columns of the 8 x 8 block whose rows were r[0..7]: 24 shuffles. */
AK_INLINE void vf_transpose(vf r[AK_VW])
{
    vf u[8], v[8];
    for (int k = 0; k < 4; k++) {
        u[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        u[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    /* v[4k + c], lane L: rows 4k .. 4k + 3 of column 4L + c */
    for (int k = 0; k < 2; k++) {
        v[4 * k] = _mm256_shuffle_ps(u[4 * k], u[4 * k + 2], 0x44);
        v[4 * k + 1] = _mm256_shuffle_ps(u[4 * k], u[4 * k + 2], 0xee);
        v[4 * k + 2] = _mm256_shuffle_ps(u[4 * k + 1], u[4 * k + 3], 0x44);
        v[4 * k + 3] = _mm256_shuffle_ps(u[4 * k + 1], u[4 * k + 3], 0xee);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(v[c], v[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(v[c], v[4 + c], 0x31);
    }
}

/* ======================================================================== */
#else /* portable C: a "vector" is one float */
/* ======================================================================== */

typedef float vf;
#define AK_VW 1
/* Blocking still lets the compiler keep a few accumulators in registers. */
#define AK_QK_MR 2
#define AK_PV_MR 2
#define AK_PV_NV 4
#define AK_IN_PLACE_ROWS 2

AK_INLINE vf vf_zero(void) { return 0.0f; }
AK_INLINE vf vf_set1(float x) { return x; }
AK_INLINE vf vf_load(const float *p) { return *p; }
AK_INLINE void vf_store(float *p, vf x) { *p = x; }
AK_INLINE vf vf_add(vf a, vf b) { return a + b; }
AK_INLINE vf vf_sub(vf a, vf b) { return a - b; }
AK_INLINE vf vf_mul(vf a, vf b) { return a * b; }
AK_INLINE vf vf_div(vf a, vf b) { return a / b; }
AK_INLINE vf vf_max(vf a, vf b) { return a > b ? a : b; }
/* a * b + c, not fmaf: without hardware FMA fmaf is a slow library call */
AK_INLINE vf vf_fma(vf a, vf b, vf c) { return a * b + c; }
AK_INLINE vf vf_fnma(vf a, vf b, vf c) { return c - a * b; }
AK_INLINE vf vf_abs(vf a) { return fabsf(a); }
AK_INLINE vf vf_copysign(vf mag, vf sign) { return copysignf(mag, sign); }
AK_INLINE float vf_hsum(vf a) { return a; }
AK_INLINE float vf_first(vf a) { return a; }
AK_INLINE float vf_hmax(vf a) { return a; }
/* (int)n of a NaN or infinite n is undefined in C: p * n is the answer there */
AK_INLINE vf vf_ldexp(vf p, vf n) { return fabsf(n) < 256.0f ? ldexpf(p, (int)n) : p * n; }
AK_INLINE vf vf_round(vf x) { return nearbyintf(x); }
AK_INLINE vf vf_select_lt(vf x, float lim, vf a, vf b) { return x < lim ? a : b; }
AK_INLINE vf vf_zero_below(vf r, vf x, float lo) { return x < lo ? 0.0f : r; }
AK_INLINE vf vf_nan_unless_finite(vf x) { return fabsf(x) < INFINITY ? x : NAN; }
AK_INLINE vf vf_nonfinite_mark(vf x) { return x * 0.0f; }
AK_INLINE vf vf_load_f16(const uint16_t *p) { return ak_f16_to_f32(*p); }
AK_INLINE vf vf_load_e4m3(const uint8_t *p) { return ak_e4m3_to_f32(*p); }
AK_INLINE vf vf_load_bf16(const uint16_t *p) { return ak_bf16_to_f32(*p); }
AK_INLINE void vf_store_f16(uint16_t *p, vf x) { *p = ak_f32_to_f16(x); }
AK_INLINE void vf_store_bf16(uint16_t *p, vf x) { *p = ak_f32_to_bf16(x); }
AK_INLINE void vf_transpose(vf r[AK_VW]) { (void)r; }
AK_INLINE void vf_hsum4(vf a, vf b, vf c, vf d, float *out)
{
    out[0] = a;
    out[1] = b;
    out[2] = c;
    out[3] = d;
}

#endif

/* ---- shared by every ISA ------------------------------------------------- */

/* exp(x) for x <= 88; exactly 0 for x < AK_EXP_MIN (and for -inf); NaN for
 * NaN (a NaN logit must reach the row's sum, not vanish as exp = 0).
 * x = n ln2 + r with |r| <= ln2 / 2, exp(x) = 2^n * poly(r). */
AK_INLINE vf vf_exp(vf x)
{
    const vf xc = vf_max(vf_set1(AK_EXP_MIN), x);
    const vf n = vf_round(vf_mul(xc, vf_set1(AK_LOG2E)));
    vf r = vf_fnma(n, vf_set1(AK_LN2_HI), xc);
    r = vf_fnma(n, vf_set1(AK_LN2_LO), r);
    vf p = vf_fma(vf_set1(AK_EXP_C7), r, vf_set1(AK_EXP_C6));
    p = vf_fma(p, r, vf_set1(AK_EXP_C5));
    p = vf_fma(p, r, vf_set1(AK_EXP_C4));
    p = vf_fma(p, r, vf_set1(AK_EXP_C3));
    p = vf_fma(p, r, vf_set1(AK_EXP_C2));
    p = vf_fma(p, r, vf_set1(1.0f));
    p = vf_fma(p, r, vf_set1(1.0f));
    return vf_zero_below(vf_ldexp(p, n), x, AK_EXP_MIN);
}

/* tanh(x) for |x| below AK_TANH_SMALL: x + x^3 P(x^2), P the degree-4
 * minimax polynomial of Cephes' tanhf (relative error ~1e-7). The soft-cap
 * evaluates tanh(s / cap), and for a large cap every argument is tiny: there
 * (1 - e) / (1 + e) with e = exp(-2|x|) rounds e to 1 and returns 0 (at cap
 * 1e8 every capped logit was 0, o off by 0.16). */
#define AK_TANH_SMALL 0.625f
#define AK_TANH_P4 (-5.70498872745e-3f)
#define AK_TANH_P3 2.06390887954e-2f
#define AK_TANH_P2 (-5.37397155531e-2f)
#define AK_TANH_P1 1.33314422036e-1f
#define AK_TANH_P0 (-3.33332819422e-1f)

/* tanh(x), relative error ~1e-7 everywhere: the odd polynomial below
 * AK_TANH_SMALL; above it sign(x) (1 - e) / (1 + e), e = exp(-2|x|), which
 * cannot overflow and loses nothing there (e <= 0.29). tanh(+-inf) = +-1,
 * tanh(NaN) = NaN. */
AK_INLINE vf vf_tanh(vf x)
{
    const vf ax = vf_abs(x), z = vf_mul(x, x);
    vf p = vf_fma(vf_set1(AK_TANH_P4), z, vf_set1(AK_TANH_P3));
    p = vf_fma(p, z, vf_set1(AK_TANH_P2));
    p = vf_fma(p, z, vf_set1(AK_TANH_P1));
    p = vf_fma(p, z, vf_set1(AK_TANH_P0));
    const vf small = vf_fma(vf_mul(p, z), x, x);
    const vf e = vf_exp(vf_mul(vf_set1(-2.0f), ax));
    const vf one = vf_set1(1.0f);
    const vf large = vf_copysign(vf_div(vf_sub(one, e), vf_add(one, e)), x);
    return vf_select_lt(ax, AK_TANH_SMALL, small, large);
}

#endif /* AK_CPU_SIMD_H */
