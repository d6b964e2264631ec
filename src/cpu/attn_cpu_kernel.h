/*
 * attn_cpu_kernel.h - the body of the cpu backend's kernel, compiled once per
 * instruction set. kernels_scalar.c, kernels_avx2.c, kernels_avx512.c,
 * kernels_avx512_bf16.c and kernels_amx.c each define the ISA macro (simd.h;
 * AK_CPU_BF16 for VDPBF16PS, AK_CPU_AMX for the tile unit),
 * AK_CPU_KERNELS_NAME and AK_CPU_ISA_NAME, then include this file, which
 * defines that kernel table.
 *
 * One work item (attn_cpu.h) is flash attention over tiles of keys:
 *
 *   load_q            the item's query rows as f32, pre-scaled by sm_scale
 *   for each tile of keys:
 *     load_kv_tile    row pointers of the tile's keys (block table walked once)
 *     qk              S = Q K^T, by one of
 *                       in place (few rows per KV head: decode, short verify):
 *                         K read from the cache and converted as loaded,
 *                         AK_QK_MR rows x 4 keys of dot products (qk_block)
 *                       converted (prefill): K converted and transposed once
 *                         (load_kt), then broadcast-FMA blocks like PV (qk_nn)
 *                       AMX (kernels_amx.c, q and K/V bf16): bf16 tiles, K/V
 *                         packed once per request by run() (amx_pack_tile)
 *                       MLA items (mla_run_tiles): every head against each
 *                         tile of latent rows, which are K and (their first
 *                         head_dim_vo values) V at once; VDPBF16PS where q and
 *                         K are bf16, else f32 FMAs
 *     online_softmax  soft-cap, mask, running max m, P = exp(S - m), d,
 *                     rescale O when m grows (AMX: fused with scaling S and
 *                     rounding P to bf16, amx_softmax)
 *     pv              O += P V, AK_PV_MR rows x AK_PV_NV vectors (V in place or
 *                     converted once), or bf16 tiles (AMX)
 *   store             o = O / d and lse = m + log d (or the partial state)
 *
 * A split item's partial states are merged afterwards by merge_task, a few of
 * its rows at a time.
 * fp8 K/V are read unscaled (vf_load_e4m3) on every path, and the scales are
 * folded where they cost nothing: KV head g's k_scale into its q rows at
 * load_q (s = sm_scale * q . (k_scale x) = (sm_scale k_scale q) . x), its
 * v_scale into its o rows at store (sum p (v_scale x) = v_scale sum p x).
 *
 * Row m = (i * ntok + t) * group + h is KV head i of the item, query token t,
 * query head h of its GQA group: each KV head's rows are one block, and one
 * K/V row serves the whole group. Only one tile of scores exists at a time,
 * whatever the context length.
 */
#include "attn_cpu.h"
#include "softmax_state.h"

#include <math.h>
#include <string.h>

#define AK_CACHE_LINE 64
/* __builtin_prefetch locality of the K/V prefetches: 2 (prefetcht1, towards
 * L2) beat 3 (into L1) by 2-5% on the decode case, the L1 being needed for
 * the rows being computed. */
#define AK_PREFETCH_LOCALITY 2

#if !defined(AK_CPU_KERNELS_NAME) || !defined(AK_CPU_ISA_NAME)
#error "define AK_CPU_KERNELS_NAME and AK_CPU_ISA_NAME before including attn_cpu_kernel.h"
#endif

/* ---- rows: convert in, convert out ---------------------------------------- */

/* dst[0, npad) = scale * src[0, n) as f32, then zeros: padded dims add 0 to
 * every dot product. */
static void load_row(float *dst, const void *src, ak_dtype t, float scale, int n, int npad)
{
    const vf sc = vf_set1(scale);
    int i = 0;
    switch (t) {
    case AK_F16:
        for (; i + AK_VW <= n; i += AK_VW) vf_store(dst + i, vf_mul(sc, vf_load_f16((const uint16_t *)src + i)));
        break;
    case AK_BF16:
        for (; i + AK_VW <= n; i += AK_VW) vf_store(dst + i, vf_mul(sc, vf_load_bf16((const uint16_t *)src + i)));
        break;
    default:
        for (; i + AK_VW <= n; i += AK_VW) vf_store(dst + i, vf_mul(sc, vf_load((const float *)src + i)));
        break;
    }
    for (; i < n; i++) dst[i] = scale * ak_load_as_f32(src, t, i);
    for (; i < npad; i++) dst[i] = 0.0f;
}

/* K/V rows need no scaling (fp8 scales are folded elsewhere): the same
 * conversion without the multiply. */
static void convert_row(float *dst, const void *src, ak_dtype t, int n, int npad)
{
    int i = 0;
    switch (t) {
    case AK_F16:
        for (; i + AK_VW <= n; i += AK_VW) vf_store(dst + i, vf_load_f16((const uint16_t *)src + i));
        break;
    case AK_BF16:
        for (; i + AK_VW <= n; i += AK_VW) vf_store(dst + i, vf_load_bf16((const uint16_t *)src + i));
        break;
    case AK_FP8_E4M3:
        for (; i + AK_VW <= n; i += AK_VW) vf_store(dst + i, vf_load_e4m3((const uint8_t *)src + i));
        break;
    default:
        for (; i + AK_VW <= n; i += AK_VW) vf_store(dst + i, vf_load((const float *)src + i));
        break;
    }
    for (; i < n; i++) dst[i] = ak_load_as_f32(src, t, i);
    for (; i < npad; i++) dst[i] = 0.0f;
}

/* dst[0, n) = scale * src[0, n) in dtype t. */
static void store_row(void *dst, ak_dtype t, const float *src, float scale, int n)
{
    const vf sc = vf_set1(scale);
    int i = 0;
    switch (t) {
    case AK_F16:
        for (; i + AK_VW <= n; i += AK_VW) vf_store_f16((uint16_t *)dst + i, vf_mul(sc, vf_load(src + i)));
        break;
    case AK_BF16:
        for (; i + AK_VW <= n; i += AK_VW) vf_store_bf16((uint16_t *)dst + i, vf_mul(sc, vf_load(src + i)));
        break;
    default:
        for (; i + AK_VW <= n; i += AK_VW) vf_store((float *)dst + i, vf_mul(sc, vf_load(src + i)));
        break;
    }
    for (; i < n; i++) ak_store_from_f32(dst, t, i, scale * src[i]);
}

/* Element i of a row of dtype t as a vector; t is a constant wherever this is
 * inlined, so the switch disappears. */
AK_INLINE vf vf_load_as(const void *row, int64_t i, const ak_dtype t)
{
    switch (t) {
    case AK_F16: return vf_load_f16((const uint16_t *)row + i);
    case AK_BF16: return vf_load_bf16((const uint16_t *)row + i);
    case AK_FP8_E4M3: return vf_load_e4m3((const uint8_t *)row + i);
    default: return vf_load((const float *)row + i);
    }
}

/* ---- load_kv_tile ------------------------------------------------------------ */

/* Element offsets, in the K and V pools, of keys [j0, j0 + n) of request r at
 * KV head 0 (add g * head_stride for head g): one block-table lookup per
 * page and no division per key. */
static void key_offsets(const ak_cpu_ctx *c, int r, int j0, int n, int64_t *koff, int64_t *voff)
{
    if (n <= 0) return;
    if (c->page_size == 0) {
        for (int j = 0; j < n; j++) {
            const int64_t row = (int64_t)c->kv_indptr[r] + j0 + j;
            koff[j] = row * c->k_addr.block; /* a ragged row is a block of one slot */
            voff[j] = row * c->v_addr.block;
        }
        return;
    }
    /* request r's block list starts at its block kv_first_block[r] */
    const int32_t *blocks = c->kv_indices + c->kv_indptr[r];
    int b = j0 / c->page_size - (c->kv_first_block ? c->kv_first_block[r] : 0), slot = j0 % c->page_size;
    int64_t kb = blocks[b] * c->k_addr.block, vb = blocks[b] * c->v_addr.block;
    for (int j = 0; j < n; j++) {
        koff[j] = kb + slot * c->k_addr.slot;
        voff[j] = vb + slot * c->v_addr.slot;
        if (++slot == c->page_size && j + 1 < n) {
            slot = 0;
            b++;
            kb = blocks[b] * c->k_addr.block;
            vb = blocks[b] * c->v_addr.block;
        }
    }
}

/* rows[0, n) = the K (is_v = 0) or V rows of KV head g at offsets off[0, n):
 * pointers into the cache when in_place (the kernels then convert as they
 * load), else into buf after conversion to zero-padded f32. */
static void load_kv_tile(const ak_cpu_ctx *c, int g, int n, int is_v, int in_place, const int64_t *off, float *buf,
                         const void **rows)
{
    const char *base = is_v ? c->v_base : c->k_base;
    const int64_t head_off = (int64_t)g * (is_v ? c->v_addr.head : c->k_addr.head);
    const int dim = is_v ? c->head_dim_vo : c->head_dim_qk;
    const int dpad = is_v ? c->dvo_pad : c->dqk_pad;
    const int64_t esz = (int64_t)ak_dtype_size(c->kv_dtype);
    for (int j = 0; j < n; j++) {
        const char *src = base + (off[j] + head_off) * esz;
        if (in_place) {
            rows[j] = src;
        } else {
            float *dst = buf + (int64_t)j * dpad;
            convert_row(dst, src, c->kv_dtype, dim, dpad);
            rows[j] = dst;
        }
    }
}

/* The cache lines of the K rows, then the V rows, of keys at offsets koff /
 * voff[0, n) x KV heads [g0, g0 + nh), key-major (the address order of NHD),
 * into lines[]; returns how many. The rows of one head sit num_kv_heads rows
 * apart in NHD (256 bytes every 2 KB for llama3-8b f16): too sparse for the
 * hardware prefetchers, and without prefetching a decode waited on memory
 * latency. */
static int prefetch_lines(const ak_cpu_ctx *c, int g0, int nh, const int64_t *koff, const int64_t *voff, int n,
                          const char **lines)
{
    const int64_t esz = (int64_t)ak_dtype_size(c->kv_dtype);
    int count = 0;
    /* MLA's V rows are the K rows' first lines, fetched with them */
    for (int is_v = 0; is_v < 2 - c->v_in_k; is_v++) {
        const int64_t bytes = (is_v ? c->head_dim_vo : c->head_dim_qk) * esz;
        const char *base = is_v ? c->v_base : c->k_base;
        const int64_t head_stride = is_v ? c->v_addr.head : c->k_addr.head;
        const int64_t *off = is_v ? voff : koff;
        for (int j = 0; j < n; j++)
            for (int h = 0; h < nh; h++) {
                const char *row = base + (off[j] + (g0 + h) * head_stride) * esz;
                for (int64_t x = 0; x < bytes; x += AK_CACHE_LINE) lines[count++] = row + x;
            }
    }
    return count;
}

/* ---- prefetch cursor ------------------------------------------------------------- */

/* Cache lines of the next tile still to prefetch. The micro-kernels of the
 * in-place (decode) path issue per_step of them per inner step, chosen so
 * that the tile's lines spread over its steps: the requests trickle out
 * between FMAs instead of in bursts. A burst fills the line-fill buffers,
 * the prefetches waiting for one stall retirement, and memory stops
 * overlapping compute. Decode llama3-8b B8 L4096 f16, shuffled blocks,
 * fraction of a streaming read: bursts per head 0.59-0.60, 1 line per step
 * 0.57-0.58, 2 (about lines / steps) 0.62-0.63, 4 0.56-0.59. */
typedef struct ak_pf {
    const char *const *next, *const *end;
    int per_step;
} ak_pf;

AK_INLINE void pf_step(ak_pf *pf)
{
    if (!pf) return;
    for (int i = 0; i < pf->per_step && pf->next < pf->end; i++)
        __builtin_prefetch(*pf->next++, 0, AK_PREFETCH_LOCALITY);
}

/* ---- qk: S = Q K^T --------------------------------------------------------- */

/* mr query rows x 4 keys of dtype kt, over the whole (padded) head dim: 4 * mr
 * accumulators stay in registers, each key vector is loaded (and converted)
 * once for mr rows and each query vector once for 4 keys; the 4 dot products
 * of a row are reduced together at the end. */
AK_INLINE void qk_block(const float *q, int ldq, const void *const *kp, const ak_dtype kt, int dpad, float *s,
                        int lds, const int mr, ak_pf *pf)
{
    vf acc[AK_QK_MR][AK_QK_NR];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
        acc[i][0] = vf_zero();
        acc[i][1] = vf_zero();
        acc[i][2] = vf_zero();
        acc[i][3] = vf_zero();
    }
    const void *k0 = kp[0], *k1 = kp[1], *k2 = kp[2], *k3 = kp[3];
    for (int d = 0; d < dpad; d += AK_VW) {
        pf_step(pf);
        const vf b0 = vf_load_as(k0, d, kt), b1 = vf_load_as(k1, d, kt);
        const vf b2 = vf_load_as(k2, d, kt), b3 = vf_load_as(k3, d, kt);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            const vf a = vf_load(q + (int64_t)i * ldq + d);
            acc[i][0] = vf_fma(a, b0, acc[i][0]);
            acc[i][1] = vf_fma(a, b1, acc[i][1]);
            acc[i][2] = vf_fma(a, b2, acc[i][2]);
            acc[i][3] = vf_fma(a, b3, acc[i][3]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) vf_hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3], s + (int64_t)i * lds);
}

/* S[rows, nkeys4] for nkeys4 a multiple of 4 (padding keys point at zeros). */
AK_INLINE void qk_t(const float *q, int ldq, int rows, const void *const *kp, const ak_dtype kt, int nkeys4,
                    int dpad, float *s, int lds, ak_pf *pf)
{
    for (int j = 0; j < nkeys4; j += AK_QK_NR) {
        int i = 0;
        for (; i + AK_QK_MR <= rows; i += AK_QK_MR)
            qk_block(q + (int64_t)i * ldq, ldq, kp + j, kt, dpad, s + (int64_t)i * lds + j, lds, AK_QK_MR, pf);
        const float *qi = q + (int64_t)i * ldq;
        float *si = s + (int64_t)i * lds + j;
        switch (rows - i) {
        case 1: qk_block(qi, ldq, kp + j, kt, dpad, si, lds, 1, pf); break;
#if AK_QK_MR > 2
        case 2: qk_block(qi, ldq, kp + j, kt, dpad, si, lds, 2, pf); break;
#endif
#if AK_QK_MR > 3
        case 3: qk_block(qi, ldq, kp + j, kt, dpad, si, lds, 3, pf); break;
#endif
#if AK_QK_MR > 4
        case 4: qk_block(qi, ldq, kp + j, kt, dpad, si, lds, 4, pf); break;
#endif
#if AK_QK_MR > 5
        case 5: qk_block(qi, ldq, kp + j, kt, dpad, si, lds, 5, pf); break;
#endif
        default: break;
        }
    }
}

static void qk(const float *q, int ldq, int rows, const void *const *kp, ak_dtype kt, int nkeys4, int dpad,
               float *s, int lds, ak_pf *pf)
{
    switch (kt) {
    case AK_F16: qk_t(q, ldq, rows, kp, AK_F16, nkeys4, dpad, s, lds, pf); break;
    case AK_BF16: qk_t(q, ldq, rows, kp, AK_BF16, nkeys4, dpad, s, lds, pf); break;
    case AK_FP8_E4M3: qk_t(q, ldq, rows, kp, AK_FP8_E4M3, nkeys4, dpad, s, lds, pf); break;
    default: qk_t(q, ldq, rows, kp, AK_F32, nkeys4, dpad, s, lds, pf); break;
    }
}

/* ---- pv: O += P V ------------------------------------------------------------ */

/* mr rows x nv vectors of O at column d0, over the tile's keys (V rows of
 * dtype vt): the accumulators stay in registers for the whole tile; each V
 * vector is loaded (and converted) once for mr rows, each probability
 * broadcast once for nv vectors. */
AK_INLINE void pv_block(const float *p, int ldp, const void *const *vp, const ak_dtype vt, int nkeys, float *o,
                        int ldo, int d0, const int mr, const int nv, const int accumulate, ak_pf *pf)
{
    vf acc[AK_PV_MR][AK_PV_NV];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int c = 0; c < nv; c++)
            acc[i][c] = accumulate ? vf_load(o + (int64_t)i * ldo + d0 + c * AK_VW) : vf_zero();
    for (int j = 0; j < nkeys; j++) {
        pf_step(pf);
        vf b[AK_PV_NV];
#pragma GCC unroll 8
        for (int c = 0; c < nv; c++) b[c] = vf_load_as(vp[j], d0 + c * AK_VW, vt);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            const vf a = vf_set1(p[(int64_t)i * ldp + j]);
#pragma GCC unroll 8
            for (int c = 0; c < nv; c++) acc[i][c] = vf_fma(a, b[c], acc[i][c]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int c = 0; c < nv; c++) vf_store(o + (int64_t)i * ldo + d0 + c * AK_VW, acc[i][c]);
}

/* mr rows across the whole (padded) head dim: full AK_PV_NV-vector blocks,
 * then one narrower block for the rest. */
AK_INLINE void pv_rows(const float *p, int ldp, const void *const *vp, const ak_dtype vt, int nkeys, float *o,
                       int ldo, int dpad, const int mr, const int acc, ak_pf *pf)
{
    int d0 = 0;
    for (; d0 + AK_PV_NV * AK_VW <= dpad; d0 += AK_PV_NV * AK_VW)
        pv_block(p, ldp, vp, vt, nkeys, o, ldo, d0, mr, AK_PV_NV, acc, pf);
    switch ((dpad - d0) / AK_VW) {
    case 1: pv_block(p, ldp, vp, vt, nkeys, o, ldo, d0, mr, 1, acc, pf); break;
#if AK_PV_NV > 2
    case 2: pv_block(p, ldp, vp, vt, nkeys, o, ldo, d0, mr, 2, acc, pf); break;
#endif
#if AK_PV_NV > 3
    case 3: pv_block(p, ldp, vp, vt, nkeys, o, ldo, d0, mr, 3, acc, pf); break;
#endif
    default: break;
    }
}

AK_INLINE void pv_t(const float *p, int ldp, int rows, const void *const *vp, const ak_dtype vt, int nkeys,
                    float *o, int ldo, int dpad, const int acc, ak_pf *pf)
{
    int i = 0;
    for (; i + AK_PV_MR <= rows; i += AK_PV_MR)
        pv_rows(p + (int64_t)i * ldp, ldp, vp, vt, nkeys, o + (int64_t)i * ldo, ldo, dpad, AK_PV_MR, acc, pf);
    const float *pi = p + (int64_t)i * ldp;
    float *oi = o + (int64_t)i * ldo;
    switch (rows - i) {
    case 1: pv_rows(pi, ldp, vp, vt, nkeys, oi, ldo, dpad, 1, acc, pf); break;
#if AK_PV_MR > 2
    case 2: pv_rows(pi, ldp, vp, vt, nkeys, oi, ldo, dpad, 2, acc, pf); break;
#endif
#if AK_PV_MR > 3
    case 3: pv_rows(pi, ldp, vp, vt, nkeys, oi, ldo, dpad, 3, acc, pf); break;
#endif
#if AK_PV_MR > 4
    case 4: pv_rows(pi, ldp, vp, vt, nkeys, oi, ldo, dpad, 4, acc, pf); break;
#endif
#if AK_PV_MR > 5
    case 5: pv_rows(pi, ldp, vp, vt, nkeys, oi, ldo, dpad, 5, acc, pf); break;
#endif
    default: break;
    }
}

static void pv(const float *p, int ldp, int rows, const void *const *vp, ak_dtype vt, int nkeys, float *o, int ldo,
               int dpad, ak_pf *pf)
{
    switch (vt) {
    case AK_F16: pv_t(p, ldp, rows, vp, AK_F16, nkeys, o, ldo, dpad, 1, pf); break;
    case AK_BF16: pv_t(p, ldp, rows, vp, AK_BF16, nkeys, o, ldo, dpad, 1, pf); break;
    case AK_FP8_E4M3: pv_t(p, ldp, rows, vp, AK_FP8_E4M3, nkeys, o, ldo, dpad, 1, pf); break;
    default: pv_t(p, ldp, rows, vp, AK_F32, nkeys, o, ldo, dpad, 1, pf); break;
    }
}

/* ---- qk_nn: S = Q K^T on a transposed tile ------------------------------------ */

/* Element d of a row of `dim` elements as a vector block [d, d + AK_VW),
 * zeros past dim. */
AK_INLINE vf load_seg(const void *row, int d, int dim, ak_dtype t)
{
    if (d + AK_VW <= dim) {
        switch (t) {
        case AK_F16: return vf_load_f16((const uint16_t *)row + d);
        case AK_BF16: return vf_load_bf16((const uint16_t *)row + d);
        case AK_FP8_E4M3: return vf_load_e4m3((const uint8_t *)row + d);
        default: return vf_load((const float *)row + d);
        }
    }
    float tmp[AK_VW];
    for (int i = 0; i < AK_VW; i++) tmp[i] = d + i < dim ? ak_load_as_f32(row, t, d + i) : 0.0f;
    return vf_load(tmp);
}

/* kt[d * ldk + j] = element d of key row j as f32, for keys [0, n) (zeros up
 * to the next whole vector of keys) and d in [0, dpad): the tile converted
 * and transposed in AK_VW x AK_VW register blocks, so that S = Q K^T becomes
 * the same broadcast-and-FMA product as PV, with no horizontal sums. */
static void load_kt(float *kt, int ldk, const void *const *rows, ak_dtype t, int n, int dim, int dpad)
{
    for (int jb = 0; jb < n; jb += AK_VW)
        for (int db = 0; db < dpad; db += AK_VW) {
            vf r[AK_VW];
            for (int i = 0; i < AK_VW; i++) r[i] = jb + i < n ? load_seg(rows[jb + i], db, dim, t) : vf_zero();
            vf_transpose(r);
            for (int i = 0; i < AK_VW; i++) vf_store(kt + (int64_t)(db + i) * ldk + jb, r[i]);
        }
}

/* S[rows, ncols] = Q K^T from the transposed tile (ktp[d]: row d of it),
 * ncols the tile's keys rounded up to whole vectors. */
static void qk_nn(const float *q, int ldq, int rows, const void *const *ktp, int dim, float *s, int lds, int ncols)
{
    pv_t(q, ldq, rows, ktp, AK_F32, dim, s, lds, ncols, 0, NULL);
}

/* ---- bf16 pairs: AVX512-BF16 (kernels_avx512_bf16.c, kernels_amx.c) ---------- */

#if defined(AK_CPU_BF16)
/* qk_bf16 and pv_bf16's remainder switches are written for AVX-512's blocks */
_Static_assert(AK_QK_MR == 6 && AK_PV_MR == 6 && AK_PV_NV == 4, "the bf16 blocks' remainder cases");
/* 32 bf16 (one 64-byte vector, an AMX tile row) of a row of `dim` elements
 * from d, zeros past dim (a masked load: nothing past the row is read). */
AK_INLINE __m512i bf16_load32(const void *row, int d, int dim)
{
    if (d + 32 <= dim) return _mm512_loadu_si512((const uint16_t *)row + d);
    const __mmask32 keep = d < dim ? (__mmask32)((1ull << (dim - d)) - 1) : 0;
    return _mm512_maskz_loadu_epi16(keep, (const uint16_t *)row + d);
}

/* The query rows of KV head g0 as raw bf16 into dst, [ntok * group][dq32]
 * (row t * group + h), dims zero-padded to 32. */
static void bf16_load_q(const ak_cpu_ctx *c, uint16_t *dst, int64_t tok0, int g0, int ntok, int dq32)
{
    for (int t = 0; t < ntok; t++)
        for (int h = 0; h < c->group; h++) {
            const int64_t head = (int64_t)g0 * c->group + h;
            const uint16_t *src = (const uint16_t *)c->q + (tok0 + t) * c->q_stride0 + head * c->q_stride1;
            uint16_t *row = dst + (int64_t)(t * c->group + h) * dq32;
            for (int d = 0; d < dq32; d += 32) _mm512_storeu_si512(row + d, bf16_load32(src, d, c->head_dim_qk));
        }
}

/* Key pairs [0, pairs) of a value tile in the B layout of TDPBF16PS (and of
 * VDPBF16PS with a broadcast pair of probabilities): vv[p * ldv + 2d + e] =
 * V[2p + e][d], the two keys of a pair interleaved per dim (ldv = 2 *
 * dvo_pad); keys from n on are zeros. */
static void bf16_load_v(uint16_t *vv, int ldv, const void *const *rows, int n, int pairs, int dim, int dvo_pad)
{
    /* word indices into (a, b): a0 b0 a1 b1 ... for dims d .. d + 15, then d + 16 .. */
    static const uint16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    static const uint16_t hi_idx[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                        24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
    const __m512i lo = _mm512_loadu_si512(lo_idx), hi = _mm512_loadu_si512(hi_idx);
    for (int p = 0; p < pairs; p++) {
        const int ja = 2 * p, jb = 2 * p + 1;
        for (int d = 0; d < dvo_pad; d += 32) {
            const __m512i a = ja < n ? bf16_load32(rows[ja], d, dim) : _mm512_setzero_si512();
            const __m512i b = jb < n ? bf16_load32(rows[jb], d, dim) : _mm512_setzero_si512();
            uint16_t *dst = vv + (int64_t)p * ldv + 2 * d;
            _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(a, lo, b));
            if (d + 16 < dvo_pad) _mm512_storeu_si512(dst + 32, _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}

/* VDPBF16PS: acc + a . b over each lane's pair of bf16 (products exact in
 * f32, summed in f32; bf16 denormals count as zero, as on the AMX unit). */
AK_INLINE vf vf_dot_bf16(vf acc, __m512i a, __m512i b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }

/* qk_block with bf16 q and K on VDPBF16PS: mr query rows (raw bf16, zero-padded
 * to whole 32-value steps) x 4 keys read in place, over dims [0, dim) in
 * steps of 32 (K's last one masked); the 4 sums of a row are reduced together
 * and scaled by `scale` (sm_scale: q enters unscaled, to stay exact). */
AK_INLINE void qk_bf16_block(const uint16_t *q, int ldq, const void *const *kp, int dim, float scale, float *s,
                             int lds, const int mr, ak_pf *pf)
{
    vf acc[AK_QK_MR][AK_QK_NR];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
        acc[i][0] = vf_zero();
        acc[i][1] = vf_zero();
        acc[i][2] = vf_zero();
        acc[i][3] = vf_zero();
    }
    for (int d = 0; d < dim; d += 32) {
        pf_step(pf);
        const __m512i b0 = bf16_load32(kp[0], d, dim), b1 = bf16_load32(kp[1], d, dim);
        const __m512i b2 = bf16_load32(kp[2], d, dim), b3 = bf16_load32(kp[3], d, dim);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            const __m512i a = _mm512_loadu_si512(q + (int64_t)i * ldq + d);
            acc[i][0] = vf_dot_bf16(acc[i][0], a, b0);
            acc[i][1] = vf_dot_bf16(acc[i][1], a, b1);
            acc[i][2] = vf_dot_bf16(acc[i][2], a, b2);
            acc[i][3] = vf_dot_bf16(acc[i][3], a, b3);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
        float *si = s + (int64_t)i * lds;
        vf_hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3], si);
        for (int j = 0; j < AK_QK_NR; j++) si[j] *= scale;
    }
}

/* S[rows, nkeys4] = scale Q K^T for nkeys4 a multiple of 4 (padding keys
 * point at zeros). */
static void qk_bf16(const uint16_t *q, int ldq, int rows, const void *const *kp, int nkeys4, int dim, float scale,
                    float *s, int lds, ak_pf *pf)
{
    for (int j = 0; j < nkeys4; j += AK_QK_NR) {
        int i = 0;
        for (; i + AK_QK_MR <= rows; i += AK_QK_MR)
            qk_bf16_block(q + (int64_t)i * ldq, ldq, kp + j, dim, scale, s + (int64_t)i * lds + j, lds, AK_QK_MR, pf);
        const uint16_t *qi = q + (int64_t)i * ldq;
        float *si = s + (int64_t)i * lds + j;
        switch (rows - i) {
        case 1: qk_bf16_block(qi, ldq, kp + j, dim, scale, si, lds, 1, pf); break;
        case 2: qk_bf16_block(qi, ldq, kp + j, dim, scale, si, lds, 2, pf); break;
        case 3: qk_bf16_block(qi, ldq, kp + j, dim, scale, si, lds, 3, pf); break;
        case 4: qk_bf16_block(qi, ldq, kp + j, dim, scale, si, lds, 4, pf); break;
        case 5: qk_bf16_block(qi, ldq, kp + j, dim, scale, si, lds, 5, pf); break;
        default: break;
        }
    }
}

/* pp[m * ldp + p] = P[m][2p], P[m][2p + 1] as one pair of bf16 (rounded to
 * nearest even), for key pairs [0, pairs) of the rows' probabilities (s:
 * [rows][lds]); keys from n on are zeros. */
static void bf16_pairs_p(const float *s, int lds, int rows, int n, int pairs, uint32_t *pp, int ldp)
{
    for (int m = 0; m < rows; m++) {
        const float *row = s + (int64_t)m * lds;
        for (int j = 0; j < 2 * pairs; j += 32) {
            const __mmask16 k0 = n - j >= 16 ? 0xffff : n > j ? (__mmask16)((1u << (n - j)) - 1) : 0;
            const __mmask16 k1 = n - j >= 32 ? 0xffff : n > j + 16 ? (__mmask16)((1u << (n - j - 16)) - 1) : 0;
            const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(k1, row + j + 16),
                                                           _mm512_maskz_loadu_ps(k0, row + j));
            /* 16 pairs at a time: only those below `pairs` are stored */
            const int left = pairs - j / 2;
            _mm512_mask_storeu_epi32(pp + (int64_t)m * ldp + j / 2, left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1), w);
        }
    }
}

/* mr rows x nv vectors of O at column d0 += P V over key pairs [0, pairs):
 * each V vector (16 dims of a key pair, vv in the layout of bf16_load_v) is
 * loaded once for mr rows, each probability pair broadcast once for nv
 * vectors; the accumulators stay in registers over the tile. */
AK_INLINE void pv_bf16_block(const uint32_t *pp, int ldp, const uint16_t *vv, int ldv, int pairs, float *o, int ldo,
                             int d0, const int mr, const int nv)
{
    vf acc[AK_PV_MR][AK_PV_NV];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int c = 0; c < nv; c++) acc[i][c] = vf_load(o + (int64_t)i * ldo + d0 + c * AK_VW);
    for (int p = 0; p < pairs; p++) {
        __m512i b[AK_PV_NV];
#pragma GCC unroll 8
        for (int c = 0; c < nv; c++) b[c] = _mm512_loadu_si512(vv + (int64_t)p * ldv + 2 * (d0 + c * AK_VW));
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            const __m512i a = _mm512_set1_epi32((int)pp[(int64_t)i * ldp + p]);
#pragma GCC unroll 8
            for (int c = 0; c < nv; c++) acc[i][c] = vf_dot_bf16(acc[i][c], a, b[c]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int c = 0; c < nv; c++) vf_store(o + (int64_t)i * ldo + d0 + c * AK_VW, acc[i][c]);
}

/* mr rows across the whole (padded) value dim: AK_PV_NV-vector blocks, then
 * one narrower block for the rest. */
AK_INLINE void pv_bf16_rows(const uint32_t *pp, int ldp, const uint16_t *vv, int ldv, int pairs, float *o, int ldo,
                            int dpad, const int mr)
{
    int d0 = 0;
    for (; d0 + AK_PV_NV * AK_VW <= dpad; d0 += AK_PV_NV * AK_VW)
        pv_bf16_block(pp, ldp, vv, ldv, pairs, o, ldo, d0, mr, AK_PV_NV);
    switch ((dpad - d0) / AK_VW) {
    case 1: pv_bf16_block(pp, ldp, vv, ldv, pairs, o, ldo, d0, mr, 1); break;
    case 2: pv_bf16_block(pp, ldp, vv, ldv, pairs, o, ldo, d0, mr, 2); break;
    case 3: pv_bf16_block(pp, ldp, vv, ldv, pairs, o, ldo, d0, mr, 3); break;
    default: break;
    }
}

/* O[rows, dpad] += P V with P as bf16 pairs and V as interleaved pairs. */
static void pv_bf16(const uint32_t *pp, int ldp, int rows, const uint16_t *vv, int ldv, int pairs, float *o, int ldo,
                    int dpad)
{
    int i = 0;
    for (; i + AK_PV_MR <= rows; i += AK_PV_MR)
        pv_bf16_rows(pp + (int64_t)i * ldp, ldp, vv, ldv, pairs, o + (int64_t)i * ldo, ldo, dpad, AK_PV_MR);
    const uint32_t *pi = pp + (int64_t)i * ldp;
    float *oi = o + (int64_t)i * ldo;
    switch (rows - i) {
    case 1: pv_bf16_rows(pi, ldp, vv, ldv, pairs, oi, ldo, dpad, 1); break;
    case 2: pv_bf16_rows(pi, ldp, vv, ldv, pairs, oi, ldo, dpad, 2); break;
    case 3: pv_bf16_rows(pi, ldp, vv, ldv, pairs, oi, ldo, dpad, 3); break;
    case 4: pv_bf16_rows(pi, ldp, vv, ldv, pairs, oi, ldo, dpad, 4); break;
    case 5: pv_bf16_rows(pi, ldp, vv, ldv, pairs, oi, ldo, dpad, 5); break;
    default: break;
    }
}
#endif /* AK_CPU_BF16 */

/* The keys of the tile from j0 of an item whose keys end at k_hi: at most
 * `tile`, none past k_hi. */
static inline int tile_keys(int j0, int k_hi, int tile)
{
    return j0 > k_hi ? 0 : k_hi - j0 + 1 < tile ? k_hi - j0 + 1 : tile;
}

/* Whether some row of an item of ntok tokens (their visible keys
 * [sc->lo[t], sc->hi[t]], later tokens seeing more) misses part of the tile
 * [j0, j0 + n). */
static inline int tile_masked(const ak_cpu_scratch *sc, int ntok, int j0, int n)
{
    return j0 < sc->lo[ntok - 1] || j0 + n - 1 > sc->hi[0];
}

/* ---- AMX: bf16 tiles for prefill (kernels_amx.c only) ------------------------ */

#if defined(AK_CPU_AMX)
/* With q and K/V in bf16, a converted-path item runs QK and PV on the AMX
 * tile unit (TDPBF16PS: 16 x 16 f32 += 16 x 32 bf16 . 32 x 16 bf16, exact
 * bf16 products, f32 sums). Q and K enter unscaled and unrounded (sm_scale
 * is applied to S in f32); P is rounded to bf16 for PV, as tensor-core
 * kernels do. Tile registers: 0-3 C (2 x 2 blocks of 16 x 16 f32), 4-5 A,
 * 6-7 B; every tile is 16 rows x 64 bytes. Per 128-key tile of a 256-row
 * item (llama3-8b prefill 2048, one thread, ~660 GFLOP/s) the time goes
 * about a third each to QK, softmax and PV. */
#define AK_AMX_ROWS 16 /* rows of a tile; row blocks go in pairs, so buffers round rows up to 32 */

typedef struct ak_amx_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ak_amx_config;

static void amx_configure(void)
{
    ak_amx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = AK_AMX_ROWS;
    }
    _tile_loadconfig(&cfg);
}

/* The key tile in the B layout of TDPBF16PS: kt[p * TILE_KEYS_AMX + j] =
 * dims (2p, 2p + 1) of key j as one 32-bit pair, i.e. a 32-bit transpose of
 * the rows; keys from n to the next multiple of 32 are zeros. */
static void amx_load_kt(uint32_t *kt, const void *const *rows, int n, int dim, int dq32)
{
    for (int jb = 0; jb < (n + 31) / 32 * 32; jb += 16)
        for (int pb = 0; pb < dq32 / 2; pb += 16) {
            vf r[16];
            for (int i = 0; i < 16; i++)
                r[i] = jb + i < n ? _mm512_castsi512_ps(bf16_load32(rows[jb + i], 2 * pb, dim)) : vf_zero();
            vf_transpose(r);
            for (int i = 0; i < 16; i++) vf_store((float *)kt + (int64_t)(pb + i) * AK_CPU_TILE_KEYS_AMX + jb, r[i]);
        }
}

/* S[rows_pad32, n rounded up to 32] = Q K^T (unscaled); keys past n are 0. */
static void amx_qk(const uint16_t *q, int dq32, int rows, const uint32_t *kt, int n, float *s, int lds)
{
    const int ldq = dq32 * 2, ldk = AK_CPU_TILE_KEYS_AMX * 4, ls = lds * 4; /* bytes */
    for (int m0 = 0; m0 < rows; m0 += 2 * AK_AMX_ROWS)
        for (int n0 = 0; n0 < n; n0 += 32) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int c = 0; c < dq32; c += 32) {
                _tile_loadd(4, q + (int64_t)m0 * dq32 + c, ldq);
                _tile_loadd(5, q + (int64_t)(m0 + AK_AMX_ROWS) * dq32 + c, ldq);
                _tile_loadd(6, kt + (int64_t)(c / 2) * AK_CPU_TILE_KEYS_AMX + n0, ldk);
                _tile_loadd(7, kt + (int64_t)(c / 2) * AK_CPU_TILE_KEYS_AMX + n0 + 16, ldk);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            float *s0 = s + (int64_t)m0 * lds + n0, *s1 = s0 + (int64_t)AK_AMX_ROWS * lds;
            _tile_stored(0, s0, ls);
            _tile_stored(1, s0 + 16, ls);
            _tile_stored(2, s1, ls);
            _tile_stored(3, s1 + 16, ls);
        }
}

/* How far the running max m may lag behind a row's true max before the AMX
 * softmax raises it (natural-log units): P = exp(S - m) then stays below
 * e^8 ~ 3000, harmless in f32 sums and in bf16 (same exponent range), and O
 * is rescaled only when a tile's max jumps by more than this, not whenever
 * it grows (each rescale is a pass over the row's O). The result is exact
 * either way: o = O / d and lse = m + log d do not need m to be the max. */
#define AK_AMX_MAX_LAG 8.0f

/* 2^t for t far below the f32 range too (VSCALEFPS makes 2^n * p exact, and
 * 0 where it underflows): n = round(t), 2^(t - n) by its Taylor series in
 * (t - n) ln 2, degree 6, relative error < 2e-7 for |t - n| <= 1/2. */
AK_INLINE vf amx_exp2(vf t)
{
    const vf n = vf_round(t), f = vf_sub(t, n);
    vf p = vf_fma(vf_set1(1.5403530393381609e-4f), f, vf_set1(1.3333558146428443e-3f));
    p = vf_fma(p, f, vf_set1(9.6181291076284772e-3f));
    p = vf_fma(p, f, vf_set1(5.5504108664821580e-2f));
    p = vf_fma(p, f, vf_set1(2.4022650695910071e-1f));
    p = vf_fma(p, f, vf_set1(6.9314718055994531e-1f));
    p = vf_fma(p, f, vf_set1(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Lanes i of the 16 keys from j with lo <= j + i < hi. */
AK_INLINE __mmask16 amx_key_mask(int j, int lo, int hi)
{
    const int a = lo - j > 0 ? lo - j : 0, b = hi - j < 16 ? hi - j : 16;
    return b > a ? (__mmask16)(((1u << b) - 1) & ~((1u << a) - 1)) : 0;
}

/* P = 2^(S c2 - m2) for 32 keys from j, zero outside the lanes k0 / k1,
 * rounded to bf16 at hi (and the remainder at lo); adds P to *sum and
 * returns the largest exponent S c2 - m2 of a visible key. */
AK_INLINE vf amx_exp_keys(const float *row, int j, __mmask16 k0, __mmask16 k1, vf c2, vf m2, uint16_t *hi,
                          uint16_t *lo, vf *sum)
{
    const vf t0 = _mm512_fmsub_ps(vf_load(row + j), c2, m2), t1 = _mm512_fmsub_ps(vf_load(row + j + 16), c2, m2);
    const vf p0 = _mm512_maskz_mov_ps(k0, amx_exp2(t0)), p1 = _mm512_maskz_mov_ps(k1, amx_exp2(t1));
    *sum = vf_add(*sum, vf_add(p0, p1));
    /* VCVTNE2PS2BF16 rounds 32 floats to nearest even in one instruction;
     * the bit-twiddling vf_store_bf16 took ~10 per 16 */
    const __m512i hw = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
    _mm512_storeu_si512(hi + j, hw);
    if (lo) {
        const vf h0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hw)), 16));
        const vf h1 =
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hw, 1)), 16));
        _mm512_storeu_si512(lo + j, (__m512i)_mm512_cvtne2ps_pbh(vf_sub(p1, h1), vf_sub(p0, h0)));
    }
    return vf_max(_mm512_mask_mov_ps(vf_set1(-INFINITY), k0, t0), _mm512_mask_mov_ps(vf_set1(-INFINITY), k1, t1));
}

/* online_softmax for the AMX path, fused with the rounding of P: for each of
 * the ntok x group rows, P = exp(S sm_scale - m) computed as
 * 2^(S sm_scale log2e - m log2e) (S enters unscaled) and written straight to
 * bf16 [rows][TILE_KEYS_AMX] (zeros for hidden keys and up to the next 32),
 * d = d f + sum P and O *= f with f = exp(m_old - m_new). With lo, also the
 * rounding remainder P - bf16(P), so that P V = P_hi V + P_lo V keeps about
 * 16 bits of P, for an f32 or f16 output (bf16 P alone gave a relative
 * error of 1.4e-3, and in f16 o up to 2 of its units in the last place, at
 * 2^-11 each, from a bf16 q and K/V: the fuzz target found it).
 *
 * m is the row's max after its first tile; later tiles are computed against
 * the m they find and raise it (and redo the row) only when a score passes it
 * by AK_AMX_MAX_LAG, which after the first few tiles is rare: no max pass and
 * no horizontal max per row and tile. d is kept as AK_CPU_AMX_SUM_LANES
 * partial sums in sc->amx_d, added up by the caller after the last tile. */
static void amx_softmax(const ak_cpu_ctx *c, const ak_cpu_scratch *sc, int ntok, int j0, int n, int masked,
                        uint16_t *hi, uint16_t *lo)
{
    const int group = c->group, lds = sc->s_stride, dvo = c->dvo_pad, n32 = (n + 31) / 32 * 32;
    const int ldp = AK_CPU_TILE_KEYS_AMX;
    const float cap = c->soft_cap, lag2 = AK_AMX_MAX_LAG * AK_LOG2E;
    for (int t = 0; t < ntok; t++) {
        int vlo = 0, vhi = n; /* visible columns [vlo, vhi) */
        if (masked) {
            vlo = sc->lo[t] - j0 > 0 ? sc->lo[t] - j0 : 0;
            vhi = sc->hi[t] - j0 + 1 < n ? sc->hi[t] - j0 + 1 : n;
        }
        for (int h = 0; h < group; h++) {
            const int m = t * group + h;
            float *row = sc->s + (int64_t)m * lds;
            uint16_t *ph = hi + (int64_t)m * ldp, *pl = lo ? lo + (int64_t)m * ldp : NULL;
            if (vlo >= vhi) {
                memset(ph, 0, sizeof(uint16_t) * (size_t)n32);
                if (pl) memset(pl, 0, sizeof(uint16_t) * (size_t)n32);
                continue;
            }
            float scale = c->sm_scale;
            /* a score that is not finite becomes NaN, before the cap (which
             * would turn +-inf into +-cap); masked lanes never reach P */
            if (cap > 0.0f) {
                const vf sv = vf_set1(scale / cap), vcap = vf_set1(cap);
                for (int j = 0; j < n; j += AK_VW)
                    vf_store(row + j, vf_mul(vcap, vf_tanh(vf_mul(sv, vf_nan_unless_finite(vf_load(row + j))))));
                scale = 1.0f;
            } else {
                for (int j = 0; j < n; j += AK_VW) vf_store(row + j, vf_nan_unless_finite(vf_load(row + j)));
            }
            const float m_old = sc->row_max[m];
            float m_new = m_old;
            if (m_old == -INFINITY) {
                vf mx = vf_set1(-INFINITY);
                for (int j = vlo / 16 * 16; j < vhi; j += 16)
                    mx = _mm512_mask_max_ps(mx, amx_key_mask(j, vlo, vhi), mx, vf_load(row + j));
                m_new = scale * vf_hmax(mx);
            }
            const vf c2 = vf_set1(scale * AK_LOG2E);
            vf sum;
            /* a second pass only when the first met a score past m + lag:
             * with m raised to that row max, none passes it again */
            for (int pass = 0; pass < 2; pass++) {
                const vf m2 = vf_set1(m_new * AK_LOG2E);
                vf top = vf_set1(-INFINITY);
                sum = vf_zero();
                if (vlo == 0 && vhi == n32) {
                    for (int j = 0; j < n32; j += 32)
                        top = vf_max(top, amx_exp_keys(row, j, 0xffff, 0xffff, c2, m2, ph, pl, &sum));
                } else {
                    for (int j = 0; j < n32; j += 32)
                        top = vf_max(top, amx_exp_keys(row, j, amx_key_mask(j, vlo, vhi),
                                                       amx_key_mask(j + 16, vlo, vhi), c2, m2, ph, pl, &sum));
                }
                if (pass == 1 || !_mm512_cmp_ps_mask(top, vf_set1(lag2), _CMP_GT_OQ)) break;
                m_new += vf_hmax(top) / AK_LOG2E; /* the row's max: P peaks at 1 */
            }
            const float f = m_old == m_new ? 1.0f
                            : m_old == -INFINITY ? 0.0f
                                                 : vf_first(amx_exp2(vf_set1((m_old - m_new) * AK_LOG2E)));
            float *d = sc->amx_d + (int64_t)m * AK_CPU_AMX_SUM_LANES;
            vf_store(d, vf_fma(vf_load(d), vf_set1(f), sum));
            sc->row_max[m] = m_new;
            if (f != 1.0f) {
                float *orow = sc->o + (int64_t)m * dvo;
                const vf fv = vf_set1(f);
                for (int d = 0; d < dvo; d += AK_VW) vf_store(orow + d, vf_mul(fv, vf_load(orow + d)));
            }
        }
    }
}

/* O[rows_pad32, dvo_pad] += P V over the tile's keys in chunks of 32 (16
 * key pairs); P is hi (+ lo when given). */
static void amx_pv(const uint16_t *hi, const uint16_t *lo, int rows, int n, const uint16_t *vv, int ldv, float *o,
                   int dvo_pad)
{
    const int lp = AK_CPU_TILE_KEYS_AMX * 2, lv = ldv * 2, lo_b = dvo_pad * 4; /* bytes */
    const int chunks = (n + 31) / 32;
    for (int m0 = 0; m0 < rows; m0 += 2 * AK_AMX_ROWS)
        for (int d0 = 0; d0 < dvo_pad; d0 += 32) {
            const int two = d0 + 16 < dvo_pad;
            float *o0 = o + (int64_t)m0 * dvo_pad + d0, *o1 = o0 + (int64_t)AK_AMX_ROWS * dvo_pad;
            _tile_loadd(0, o0, lo_b);
            _tile_loadd(2, o1, lo_b);
            if (two) {
                _tile_loadd(1, o0 + 16, lo_b);
                _tile_loadd(3, o1 + 16, lo_b);
            }
            for (int c = 0; c < chunks; c++) {
                _tile_loadd(6, vv + (int64_t)(16 * c) * ldv + 2 * d0, lv);
                if (two) _tile_loadd(7, vv + (int64_t)(16 * c) * ldv + 2 * (d0 + 16), lv);
                for (int part = 0; part < (lo ? 2 : 1); part++) {
                    const uint16_t *p = part ? lo : hi;
                    _tile_loadd(4, p + (int64_t)m0 * AK_CPU_TILE_KEYS_AMX + 32 * c, lp);
                    _tile_loadd(5, p + (int64_t)(m0 + AK_AMX_ROWS) * AK_CPU_TILE_KEYS_AMX + 32 * c, lp);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(2, 5, 6);
                    if (two) {
                        _tile_dpbf16ps(1, 4, 7);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                }
            }
            _tile_stored(0, o0, lo_b);
            _tile_stored(2, o1, lo_b);
            if (two) {
                _tile_stored(1, o0 + 16, lo_b);
                _tile_stored(3, o1 + 16, lo_b);
            }
        }
}

/* Element d of key j of a value tile in the B layout of bf16_load_v. */
AK_INLINE float amx_v_at(const uint16_t *vv, int ldv, int j, int d)
{
    return ak_bf16_to_f32(vv[(int64_t)(j / 2) * ldv + 2 * d + (j & 1)]);
}

/* unseen_v_nonfinite (below) for a value tile in the B layout: its keys
 * [0, n) where masked, and [n, n_read), which amx_pv reads with P = 0 (a
 * packed tile's keys past the item's last: the request's next rows, which
 * may hold a NaN that only later rows see). */
static int amx_unseen_v_nonfinite(const ak_cpu_ctx *c, const ak_cpu_scratch *sc, int ntok, int j0, int n, int masked,
                                  int n_read, const uint16_t *vv, int ldv)
{
    const int all_lo = sc->lo[ntok - 1] - j0, all_hi = sc->hi[0] - j0;
    for (int j = masked ? 0 : n; j < n_read; j++) {
        if (j < n && j >= all_lo && j <= all_hi) continue;
        for (int d = 0; d < c->head_dim_vo; d++)
            if (!isfinite(amx_v_at(vv, ldv, j, d))) return 1;
    }
    return 0;
}

/* amx_pv with each row over only the keys it sees, in f32 (the rare path of
 * a tile where a key some row does not see holds a NaN or infinity in V):
 * P = hi (+ lo). */
static void amx_pv_visible(const ak_cpu_ctx *c, const ak_cpu_scratch *sc, int ntok, int j0, int n, const uint16_t *vv,
                           int ldv, const uint16_t *hi, const uint16_t *lo)
{
    const int ldp = AK_CPU_TILE_KEYS_AMX;
    for (int t = 0; t < ntok; t++) {
        const int vlo = sc->lo[t] - j0 > 0 ? sc->lo[t] - j0 : 0;
        const int vhi = sc->hi[t] - j0 + 1 < n ? sc->hi[t] - j0 + 1 : n;
        for (int h = 0; h < c->group; h++) {
            const int64_t m = (int64_t)t * c->group + h;
            float *orow = sc->o + m * c->dvo_pad;
            for (int j = vlo; j < vhi; j++) {
                const float p = ak_bf16_to_f32(hi[m * ldp + j]) + (lo ? ak_bf16_to_f32(lo[m * ldp + j]) : 0.0f);
                for (int d = 0; d < c->head_dim_vo; d++) orow[d] += p * amx_v_at(vv, ldv, j, d);
            }
        }
    }
}

/* One tile of keys [j0, j0 + n) of an AMX item: S = Q K^T, the fused
 * softmax, O += P V; kt and vv are the tile in the B layouts of
 * amx_load_kt / bf16_load_v. packed: vv is a packed tile, whose keys past
 * n up to the next 32 are the request's (bf16_load_v's are zeros). */
static void amx_tile(const ak_cpu_ctx *c, const ak_cpu_scratch *sc, int ntok, int j0, int n, int packed,
                     const uint32_t *kt, const uint16_t *vv, uint16_t *p_lo)
{
    const int rows1 = ntok * c->group, dq32 = (c->head_dim_qk + 31) / 32 * 32;
    /* every row sees the whole tile unless it starts before the last row's
     * first key or ends after the first row's last key */
    const int masked = tile_masked(sc, ntok, j0, n), n_read = packed ? (n + 31) / 32 * 32 : n;
    amx_qk(sc->amx_q, dq32, rows1, kt, n, sc->s, sc->s_stride);
    amx_softmax(c, sc, ntok, j0, n, masked, sc->amx_p, p_lo);
    if ((masked || n_read > n) && amx_unseen_v_nonfinite(c, sc, ntok, j0, n, masked, n_read, vv, 2 * c->dvo_pad))
        amx_pv_visible(c, sc, ntok, j0, n, vv, 2 * c->dvo_pad, sc->amx_p, p_lo);
    else
        amx_pv(sc->amx_p, p_lo, rows1, n, vv, 2 * c->dvo_pad, sc->o, c->dvo_pad);
}

/* The key tiles of a single-head item with bf16 q and K/V, on the AMX unit.
 * A request that plan() packed (c->pack) has its K/V tiles in the B layouts
 * already, on the grid of whole TILE_KEYS_AMX tiles from key 0 (the masks
 * hide the keys of a grid tile this item does not see); any other converts
 * each tile from the cache here. */
static void amx_run_tiles(const ak_cpu_ctx *c, const ak_cpu_work *w, const ak_cpu_scratch *sc, int64_t tok0,
                          int ntok)
{
    const int r = w->req, g = w->kv_head, tile = AK_CPU_TILE_KEYS_AMX;
    const int rows1 = ntok * c->group, dvo = c->dvo_pad, dq32 = (c->head_dim_qk + 31) / 32 * 32;
    const int rows_pad = (rows1 + 2 * AK_AMX_ROWS - 1) / (2 * AK_AMX_ROWS) * (2 * AK_AMX_ROWS);
    uint16_t *p_lo = c->o_dtype != AK_BF16 ? sc->amx_p + (int64_t)rows_pad * tile : NULL; /* (amx_softmax) */
    const int k_lo = sc->lo[0], k_hi = sc->hi[ntok - 1];
    const ak_cpu_pack *pk = c->pack ? &c->pack[r] : NULL;
    memset(sc->amx_d, 0, sizeof(float) * AK_CPU_AMX_SUM_LANES * (size_t)rows1);
    amx_configure();
    bf16_load_q(c, sc->amx_q, tok0, g, ntok, dq32);
    if (pk && pk->first >= 0) {
        for (int j0 = k_lo / tile * tile; j0 <= k_hi; j0 += tile) {
            const int n = tile_keys(j0, k_hi, tile);
            const uint16_t *kt = c->kv_pack + (pk->first + (int64_t)g * pk->tiles + j0 / tile - pk->t0) * c->pack_tile_elems;
            amx_tile(c, sc, ntok, j0, n, 1, (const uint32_t *)kt, kt + (int64_t)dq32 * tile, p_lo);
        }
    } else {
        for (int j0 = k_lo; j0 <= k_hi; j0 += tile) {
            const int n = tile_keys(j0, k_hi, tile);
            key_offsets(c, r, j0, n, sc->koff[0], sc->voff[0]);
            load_kv_tile(c, g, n, 0, 1, sc->koff[0], NULL, sc->kp);
            load_kv_tile(c, g, n, 1, 1, sc->voff[0], NULL, sc->vp);
            amx_load_kt(sc->amx_kt, sc->kp, n, c->head_dim_qk, dq32);
            bf16_load_v(sc->amx_v, 2 * dvo, sc->vp, n, (n + 31) / 32 * 16, c->head_dim_vo, dvo);
            amx_tile(c, sc, ntok, j0, n, 0, sc->amx_kt, sc->amx_v, p_lo);
        }
    }
    _tile_release();
    for (int m = 0; m < rows1; m++) sc->row_sum[m] = vf_hsum(vf_load(sc->amx_d + (int64_t)m * AK_CPU_AMX_SUM_LANES));
}

/* Key tile t (keys [t * TILE_KEYS_AMX, ...) up to kv_len) of KV head g of a
 * packed request r into its place in c->kv_pack: K then V in the B layouts,
 * keys past kv_len zero up to the next 32. */
static void amx_pack_tile(const ak_cpu_ctx *c, int r, int g, int t, const ak_cpu_scratch *sc)
{
    const ak_cpu_pack *pk = &c->pack[r];
    const int tile = AK_CPU_TILE_KEYS_AMX, dq32 = (c->head_dim_qk + 31) / 32 * 32;
    const int j0 = t * tile, n = c->kv_lens[r] - j0 < tile ? c->kv_lens[r] - j0 : tile;
    uint16_t *dst = c->kv_pack + (pk->first + (int64_t)g * pk->tiles + t - pk->t0) * c->pack_tile_elems;
    /* keys before the request's first listed block (a window's trimmed
     * blocks: no row sees them, and the list has no id for them) are zeros */
    const int listed = c->kv_first_block ? c->kv_first_block[r] * c->page_size : 0;
    const int skip = listed <= j0 ? 0 : listed - j0 < n ? listed - j0 : n;
    key_offsets(c, r, j0 + skip, n - skip, sc->koff[0] + skip, sc->voff[0] + skip);
    load_kv_tile(c, g, n - skip, 0, 1, sc->koff[0] + skip, NULL, sc->kp + skip);
    load_kv_tile(c, g, n - skip, 1, 1, sc->voff[0] + skip, NULL, sc->vp + skip);
    for (int j = 0; j < skip; j++) sc->kp[j] = sc->vp[j] = sc->zero_row;
    amx_load_kt((uint32_t *)dst, sc->kp, n, c->head_dim_qk, dq32);
    bf16_load_v(dst + (int64_t)dq32 * tile, 2 * c->dvo_pad, sc->vp, n, (n + 31) / 32 * 16, c->head_dim_vo, c->dvo_pad);
}
#endif /* AK_CPU_AMX */

/* ---- online_softmax ------------------------------------------------------------ */

/* Folds the scores of keys [j0, j0 + n) into each row's {m, d, O}: a score
 * that is not finite becomes NaN (before the soft-cap, which would turn +-inf
 * into +-cap), soft-cap, mask the keys a row does not see (masked = 0: every
 * row sees every key), raise m to the tile's max, P = exp(S - m) in place,
 * d = d * f + sum P and O *= f with f = exp(m_old - m_new). A NaN score makes
 * P, d and so the row NaN; a masked key's score, whatever it was, is -inf. A
 * row that sees none of these keys keeps its state and gets P = 0. (The AMX
 * path has its own, amx_softmax.) */
static void online_softmax(const ak_cpu_ctx *c, const ak_cpu_scratch *sc, int nheads, int ntok, int j0, int n,
                           int masked)
{
    const int group = c->group, lds = sc->s_stride, dvo = c->dvo_pad;
    const int nvec = (n + AK_VW - 1) / AK_VW * AK_VW;
    const float cap = c->soft_cap;
    for (int gt = 0; gt < nheads * ntok; gt++) {
        const int t = gt % ntok;
        int vlo = 0, vhi = n; /* visible columns [vlo, vhi) */
        if (masked) {
            vlo = sc->lo[t] - j0;
            vhi = sc->hi[t] - j0 + 1;
            if (vlo < 0) vlo = 0;
            if (vhi > n) vhi = n;
        }
        for (int h = 0; h < group; h++) {
            const int m = gt * group + h;
            float *row = sc->s + (int64_t)m * lds;
            if (vlo >= vhi) {
                memset(row, 0, sizeof(float) * (size_t)n);
                continue;
            }
            if (cap > 0.0f) {
                const vf vcap = vf_set1(cap), inv = vf_set1(1.0f / cap);
                for (int j = 0; j < nvec; j += AK_VW)
                    vf_store(row + j, vf_mul(vcap, vf_tanh(vf_mul(inv, vf_nan_unless_finite(vf_load(row + j))))));
            } else {
                for (int j = 0; j < nvec; j += AK_VW) vf_store(row + j, vf_nan_unless_finite(vf_load(row + j)));
            }
            for (int j = 0; j < vlo; j++) row[j] = -INFINITY;
            for (int j = vhi; j < nvec; j++) row[j] = -INFINITY;
            vf mx = vf_set1(-INFINITY);
            for (int j = 0; j < nvec; j += AK_VW) mx = vf_max(mx, vf_load(row + j));
            const float m_old = sc->row_max[m], tile_max = vf_hmax(mx);
            const float m_new = m_old > tile_max ? m_old : tile_max;
            const vf mv = vf_set1(m_new);
            vf sum = vf_zero();
            for (int j = 0; j < nvec; j += AK_VW) {
                const vf pj = vf_exp(vf_sub(vf_load(row + j), mv));
                vf_store(row + j, pj);
                sum = vf_add(sum, pj);
            }
            /* ak_rescale_factor's value, without a libm call per row and tile
             * (at AMX speed expf here cost as much as the tile products) */
            const float f = m_old == m_new ? 1.0f : m_old == -INFINITY ? 0.0f : vf_first(vf_exp(vf_set1(m_old - m_new)));
            sc->row_sum[m] = sc->row_sum[m] * f + vf_hsum(sum);
            sc->row_max[m] = m_new;
            if (f != 1.0f) {
                float *orow = sc->o + (int64_t)m * dvo;
                const vf fv = vf_set1(f);
                for (int d = 0; d < dvo; d += AK_VW) vf_store(orow + d, vf_mul(fv, vf_load(orow + d)));
            }
        }
    }
}

/* ---- the work item ------------------------------------------------------------ */

/* In a tile that some row does not wholly see, P is 0 at the keys a row does
 * not see, and 0 * NaN = NaN: a NaN or infinity in the V row of such a key
 * would reach rows that never saw it. 1 if a key outside [lo[ntok - 1],
 * hi[0]] (the keys every row sees) has one in its V row (vt: the dtype of
 * sc->vp's rows). */
static int unseen_v_nonfinite(const ak_cpu_ctx *c, const ak_cpu_scratch *sc, int ntok, int j0, int n, ak_dtype vt)
{
    const int all_lo = sc->lo[ntok - 1] - j0, all_hi = sc->hi[0] - j0;
    for (int j = 0; j < n; j++) {
        if (j >= all_lo && j <= all_hi) continue;
        for (int d = 0; d < c->head_dim_vo; d++)
            if (!isfinite(ak_load_as_f32(sc->vp[j], vt, d))) return 1;
    }
    return 0;
}

/* O += P V of one KV head's rows (s, o: its first row), each token's group
 * of rows over only the keys it sees: the rare path of unseen_v_nonfinite. */
static void pv_visible(const ak_cpu_ctx *c, const ak_cpu_scratch *sc, const float *s, float *o, int ntok, int j0,
                       int n, ak_dtype vt)
{
    const int group = c->group, lds = sc->s_stride, dvo = c->dvo_pad;
    for (int t = 0; t < ntok; t++) {
        const int vlo = sc->lo[t] - j0 > 0 ? sc->lo[t] - j0 : 0;
        const int vhi = sc->hi[t] - j0 + 1 < n ? sc->hi[t] - j0 + 1 : n;
        if (vlo >= vhi) continue;
        const int64_t m0 = (int64_t)t * group;
        pv(s + m0 * lds + vlo, lds, group, sc->vp + vlo, vt, vhi - vlo, o + m0 * dvo, dvo, dvo, NULL);
    }
}

/* 1 if the row's O holds no NaN or infinity. */
static int o_row_finite(const float *o, int dpad)
{
    vf mark = vf_zero();
    for (int d = 0; d < dpad; d += AK_VW) mark = vf_add(mark, vf_nonfinite_mark(vf_load(o + d)));
    return vf_hsum(mark) == 0.0f;
}

/* The key tiles of an item on the vector units (see the top of the file):
 * K/V rows are read in place (converted as loaded) when they are whole
 * vectors and either need no conversion or serve a single block of rows
 * (decode: the group); otherwise each tile is converted once into f32
 * scratch and then serves every row block. */
static void run_tiles(const ak_cpu_ctx *c, const ak_cpu_work *w, const ak_cpu_scratch *sc, int ntok)
{
    const int r = w->req, g0 = w->kv_head, nheads = w->kv_heads;
    const int rows1 = ntok * c->group;
    const int dqk = c->dqk_pad, dvo = c->dvo_pad, lds = sc->s_stride;
    const int k_in_place = c->whole_k && rows1 <= AK_IN_PLACE_ROWS;
    const int v_in_place = c->whole_v && rows1 <= AK_IN_PLACE_ROWS;
    const ak_dtype vt = v_in_place ? c->kv_dtype : AK_F32;
    const int tile = nheads > 1 ? AK_CPU_TILE_KEYS_ALL_HEADS : AK_CPU_TILE_KEYS;
    const int k_lo = sc->lo[0], k_hi = sc->hi[ntok - 1];
    int cur = 0; /* which of the two offset lists holds this tile's */
    if (k_lo <= k_hi)
        key_offsets(c, r, k_lo, tile_keys(k_lo, k_hi, tile), sc->koff[0], sc->voff[0]);
    for (int j0 = k_lo; j0 <= k_hi; j0 += tile, cur ^= 1) {
        const int n = tile_keys(j0, k_hi, tile);
        const int n4 = (n + AK_QK_NR - 1) / AK_QK_NR * AK_QK_NR;
        /* every row sees the whole tile unless it starts before the last row's
         * first key or ends after the first row's last key */
        const int masked = tile_masked(sc, ntok, j0, n);
        /* in-place items (decode) prefetch the next tile's lines from inside
         * the micro-kernels (ak_pf); converted tiles go without: for prefill
         * it measured neutral (FMA) to 1-2% slower (AMX) */
        const int pj = j0 + tile;
        const int pn = tile_keys(pj, k_hi, tile);
        key_offsets(c, r, pj, pn, sc->koff[cur ^ 1], sc->voff[cur ^ 1]);
        ak_pf pf = {sc->pf_lines, sc->pf_lines, 0};
        if (k_in_place && pn > 0) {
            const int lines = prefetch_lines(c, g0, nheads, sc->koff[cur ^ 1], sc->voff[cur ^ 1], pn, sc->pf_lines);
            /* inner steps of this tile: QK d-steps per 4 keys and row block,
             * PV keys per column block and row block */
            const int qk_steps = nheads * (n4 / AK_QK_NR) * (dqk / AK_VW) * ((rows1 + AK_QK_MR - 1) / AK_QK_MR);
            const int pv_steps = v_in_place ? nheads * n * ((dvo + AK_PV_NV * AK_VW - 1) / (AK_PV_NV * AK_VW)) *
                                                  ((rows1 + AK_PV_MR - 1) / AK_PV_MR)
                                            : 0;
            pf.end += lines;
            pf.per_step = (lines + qk_steps + pv_steps - 1) / (qk_steps + pv_steps);
        }

        for (int i = 0; i < nheads; i++) {
            const float *qi = sc->q + (int64_t)i * rows1 * dqk;
            float *si = sc->s + (int64_t)i * rows1 * lds;
            load_kv_tile(c, g0 + i, n, 0, 1, sc->koff[cur], NULL, sc->kp);
            if (k_in_place) {
                for (int j = n; j < n4; j++) sc->kp[j] = sc->zero_row;
                qk(qi, dqk, rows1, sc->kp, c->kv_dtype, n4, dqk, si, lds, &pf);
            } else {
                load_kt(sc->k, AK_CPU_TILE_KEYS, sc->kp, c->kv_dtype, n, c->head_dim_qk, dqk);
                qk_nn(qi, dqk, rows1, sc->ktp, c->head_dim_qk, si, lds, (n + AK_VW - 1) / AK_VW * AK_VW);
            }
        }
        online_softmax(c, sc, nheads, ntok, j0, n, masked);
        for (int i = 0; i < nheads; i++) {
            load_kv_tile(c, g0 + i, n, 1, v_in_place, sc->voff[cur], sc->v, sc->vp);
            const float *si = sc->s + (int64_t)i * rows1 * lds;
            float *oi = sc->o + (int64_t)i * rows1 * dvo;
            if (masked && unseen_v_nonfinite(c, sc, ntok, j0, n, vt))
                pv_visible(c, sc, si, oi, ntok, j0, n, vt);
            else
                pv(si, lds, rows1, sc->vp, vt, n, oi, dvo, dvo, v_in_place ? &pf : NULL);
        }
        while (pf.next < pf.end) __builtin_prefetch(*pf.next++, 0, AK_PREFETCH_LOCALITY);
    }
}

/* ---- MLA decode: each latent row read once for every head ------------------- */

/* The key tiles of an MLA item (cfg.mla, one KV head; attn_cpu.h): all
 * ntok x group rows of the item against each tile of AK_CPU_MLA_TILE_KEYS
 * latent rows, which serve both as K (all head_dim_qk values) and as V (the
 * first head_dim_vo), so each row comes from memory once, the next tile's
 * lines prefetched from inside QK.
 *   bf16_dot (bf16 q and K on a kernel with AVX512-BF16): QK on VDPBF16PS
 *     over the rows in place and q as raw bf16 (sc->q holds bf16 then); PV on
 *     VDPBF16PS too when o is bf16 (P rounded to bf16, as tensor-core
 *     kernels do: o's own rounding is as coarse; against cpu_ref the
 *     relative error of bf16 o goes from ~1e-5 to ~1e-3, within one bf16
 *     ulp), else in f32 (P V in f32 instead: deepseek-v3-tp8 8 x 4096
 *     2.49 ms against 2.09, deepseek-v3 8 x 4096 16.9 against 12.5; Zen 5,
 *     2 threads);
 *   otherwise f32 FMAs: the rows read in place when they need no conversion
 *     or serve one block of rows, else converted once per tile into
 *     sc->k, which then serves QK and PV for every row. */
static void mla_run_tiles(const ak_cpu_ctx *c, const ak_cpu_work *w, const ak_cpu_scratch *sc, int ntok,
                          int bf16_dot)
{
    const int r = w->req, rows = ntok * c->group;
    const int dqk = c->dqk_pad, dvo = c->dvo_pad, lds = sc->s_stride;
    const int tile = AK_CPU_MLA_TILE_KEYS;
    const int convert = !bf16_dot && (!c->whole_k || (c->kv_dtype != AK_F32 && rows > AK_QK_MR));
    const ak_dtype kt = convert ? AK_F32 : c->kv_dtype;
    /* a value row is the start of its K row when the value dims are whole
     * vectors; else it is converted (zero-padded) on its own */
    const ak_dtype vt = c->whole_v ? kt : AK_F32;
#if defined(AK_CPU_BF16)
    const int pv_pairs = bf16_dot && c->o_dtype == AK_BF16;
    const int dq32 = (c->head_dim_qk + 31) / 32 * 32;
    /* q enters unscaled: S is scaled as load_q scales q rows elsewhere */
    const float qk_scale = c->sm_scale * ak_kv_scale_at(c->kv_scale_kind, c->k_scale, 0);
#endif
    const int qk_dsteps = bf16_dot ? (c->head_dim_qk + 31) / 32 : dqk / AK_VW;
    const int k_lo = sc->lo[0], k_hi = sc->hi[ntok - 1];
    int cur = 0; /* which of the two offset lists holds this tile's */
    if (k_lo <= k_hi)
        key_offsets(c, r, k_lo, tile_keys(k_lo, k_hi, tile), sc->koff[0], sc->voff[0]);
    for (int j0 = k_lo; j0 <= k_hi; j0 += tile, cur ^= 1) {
        const int n = tile_keys(j0, k_hi, tile);
        const int n4 = (n + AK_QK_NR - 1) / AK_QK_NR * AK_QK_NR;
        const int masked = tile_masked(sc, ntok, j0, n);
        /* the next tile's rows, prefetched a few lines per QK step */
        const int pj = j0 + tile;
        const int pn = tile_keys(pj, k_hi, tile);
        key_offsets(c, r, pj, pn, sc->koff[cur ^ 1], sc->voff[cur ^ 1]);
        ak_pf pf = {sc->pf_lines, sc->pf_lines, 0};
        if (pn > 0) {
            const int lines = prefetch_lines(c, 0, 1, sc->koff[cur ^ 1], sc->voff[cur ^ 1], pn, sc->pf_lines);
            const int qk_steps = (n4 / AK_QK_NR) * qk_dsteps * ((rows + AK_QK_MR - 1) / AK_QK_MR);
            pf.end += lines;
            pf.per_step = (lines + qk_steps - 1) / qk_steps;
        }

        /* K rows in place, or converted once into sc->k; keys up to n4 read zeros */
        load_kv_tile(c, 0, n, 0, !convert, sc->koff[cur], sc->k, sc->kp);
        for (int j = n; j < n4; j++) sc->kp[j] = sc->zero_row;
#if defined(AK_CPU_BF16)
        if (bf16_dot)
            qk_bf16((const uint16_t *)sc->q, dq32, rows, sc->kp, n4, c->head_dim_qk, qk_scale, sc->s, lds, &pf);
        else
#endif
            qk(sc->q, dqk, rows, sc->kp, kt, n4, dqk, sc->s, lds, &pf);
        online_softmax(c, sc, 1, ntok, j0, n, masked);

        if (c->whole_v)
            for (int j = 0; j < n; j++) sc->vp[j] = sc->kp[j];
        else
            load_kv_tile(c, 0, n, 1, 0, sc->voff[cur], sc->v, sc->vp);
        if (masked && unseen_v_nonfinite(c, sc, ntok, j0, n, vt)) {
            pv_visible(c, sc, sc->s, sc->o, ntok, j0, n, vt);
        } else {
#if defined(AK_CPU_BF16)
            if (pv_pairs) {
                const int pairs = (n + 1) / 2;
                bf16_pairs_p(sc->s, lds, rows, n, pairs, sc->mla_p, AK_CPU_MLA_TILE_KEYS / 2);
                /* from the bf16 rows in place (sc->vp may hold f32 copies) */
                bf16_load_v(sc->mla_v, 2 * dvo, sc->kp, n, pairs, c->head_dim_vo, dvo);
                pv_bf16(sc->mla_p, AK_CPU_MLA_TILE_KEYS / 2, rows, sc->mla_v, 2 * dvo, pairs, sc->o, dvo, dvo);
            } else
#endif
                pv(sc->s, lds, rows, sc->vp, vt, n, sc->o, dvo, dvo, NULL);
        }
        while (pf.next < pf.end) __builtin_prefetch(*pf.next++, 0, AK_PREFETCH_LOCALITY);
    }
}

static void run_item(const ak_cpu_ctx *c, const ak_cpu_work *w, const ak_cpu_scratch *sc)
{
    const int group = c->group, r = w->req, g0 = w->kv_head, nheads = w->kv_heads;
    const int kv_len = c->kv_lens[r];
    const int q_len = c->qo_indptr[r + 1] - c->qo_indptr[r];
    const int ntok = w->q_count;
    const int rows1 = ntok * group, rows = rows1 * nheads; /* rows of one KV head, of all */
    const int64_t tok0 = (int64_t)c->qo_indptr[r] + w->q_begin;
    const int dqk = c->dqk_pad, dvo = c->dvo_pad;

    /* visible keys of each token, cut to this chunk; lo and hi both grow
     * with t, so the tile's keys are [lo[0], hi[ntok - 1]] */
    for (int t = 0; t < ntok; t++) {
        const int p = kv_len - q_len + w->q_begin + t;
        int lo = ak_visible_lo(p, c->window_left);
        int hi = ak_visible_hi(p, kv_len, c->causal);
        if (lo < w->kv_begin) lo = w->kv_begin;
        if (hi > w->kv_end - 1) hi = w->kv_end - 1;
        sc->lo[t] = lo;
        sc->hi[t] = hi;
    }

    /* bf16 prefill tiles go to the AMX unit; decode-sized rows stay on the
     * vector path (run_tiles reads their K/V in place); MLA items of
     * AK_CPU_MLA_AMX_ROWS rows or more go to the AMX unit too */
#if defined(AK_CPU_BF16)
    const int bf16 = c->q_dtype == AK_BF16 && c->kv_dtype == AK_BF16;
#endif
#if defined(AK_CPU_AMX)
    const int amx = nheads == 1 && bf16 &&
                    (w->mla ? rows1 >= AK_CPU_MLA_AMX_ROWS : !(c->whole_k && rows1 <= AK_IN_PLACE_ROWS));
#else
    const int amx = 0;
#endif
#if defined(AK_CPU_BF16)
    const int bf16_dot = w->mla && bf16 && !amx;
    if (bf16_dot) bf16_load_q(c, (uint16_t *)sc->q, tok0, 0, ntok, (c->head_dim_qk + 31) / 32 * 32);
#else
    const int bf16_dot = 0;
#endif

    /* load_q: row m = (head i of the item, token t, query head h of the group)
     * = (i * ntok + t) * group + h, so each KV head's rows are one block;
     * fp8 K's scale joins sm_scale */
    const size_t qesz = ak_dtype_size(c->q_dtype);
    for (int gt = 0; gt < nheads * ntok && !amx && !bf16_dot; gt++) {
        const int g = g0 + gt / ntok;
        const float scale = c->sm_scale * ak_kv_scale_at(c->kv_scale_kind, c->k_scale, g);
        for (int h = 0; h < group; h++) {
            const int t = gt % ntok;
            const int64_t head = (int64_t)g * group + h;
            const char *src = c->q + ((tok0 + t) * c->q_stride0 + head * c->q_stride1) * (int64_t)qesz;
            load_row(sc->q + (int64_t)(gt * group + h) * dqk, src, c->q_dtype, scale, c->head_dim_qk, dqk);
        }
    }
    for (int m = 0; m < rows; m++) {
        sc->row_max[m] = -INFINITY;
        sc->row_sum[m] = 0.0f;
    }
    memset(sc->o, 0, sizeof(float) * (size_t)rows * (size_t)dvo);

#if defined(AK_CPU_AMX)
    if (amx)
        amx_run_tiles(c, w, sc, tok0, ntok);
    else
#endif
    if (w->mla)
        mla_run_tiles(c, w, sc, ntok, bf16_dot);
    else
        run_tiles(c, w, sc, ntok);

    /* store: o = O / d (with the sink, ak_state_finish); a row that saw no
     * key has d = 0, O = 0 -> o = 0, lse = -inf (with a sink: lse = sink). A
     * NaN d (a NaN score) or a NaN or infinity in O (from a V row it saw)
     * makes the whole row and its lse NaN (attnkit.h). fp8 V's scale joins
     * 1 / d; one that is not finite makes every V element it scales NaN or
     * infinite, so a row that saw a key is NaN. */
    const size_t oesz = ak_dtype_size(c->o_dtype);
    for (int gt = 0; gt < nheads * ntok; gt++)
        for (int h = 0; h < group; h++) {
            const int t = gt % ntok, m = gt * group + h;
            const int64_t head = (int64_t)(g0 + gt / ntok) * group + h;
            const float v_scale = ak_kv_scale_at(c->kv_scale_kind, c->v_scale, g0 + gt / ntok);
            /* the sink joins whole rows only: a split part's joins at the merge */
            const float sink = c->sinks && w->part < 0 ? c->sinks[head] : -INFINITY;
            const float d = sc->row_sum[m];
            const float *orow = sc->o + (int64_t)m * dvo;
            float inv, lse;
            const int saw_key = sc->row_max[m] != -INFINITY;
            ak_state_finish(sc->row_max[m], d, sink, &inv, &lse);
            if (saw_key) inv *= v_scale;
            if (d != d || !o_row_finite(orow, dvo) || (saw_key && !isfinite(v_scale))) inv = lse = NAN;
            if (w->part < 0) {
                char *dst = c->o + ((tok0 + t) * c->o_stride0 + head * c->o_stride1) * (int64_t)oesz;
                store_row(dst, c->o_dtype, orow, inv, c->head_dim_vo);
                if (c->lse) c->lse[(tok0 + t) * c->lse_stride0 + head * c->lse_stride1] = lse;
            } else {
                const int64_t slot_row = (int64_t)w->part + m;
                store_row(c->part_o + slot_row * dvo, AK_F32, orow, inv, c->head_dim_vo);
                c->part_lse[slot_row] = lse;
            }
        }
}

/* ---- merge of split items ------------------------------------------------------- */

/* Rows [row_begin, row_end) of a split item from its parts' states (shared
 * softmax state: lse = log sum exp lse_i, o = sum exp(lse_i - lse) o_i) into
 * o and lse, a vector of the row at a time; sc->o's first row accumulates.
 * An empty part (lse -inf) is skipped; a NaN part (the kernel writes a
 * corrupted row's partial state as NaN) makes lse, and so every weight and
 * o, NaN. */
static void merge_task(const ak_cpu_ctx *c, const ak_cpu_merge *mg, const ak_cpu_scratch *sc)
{
    const int group = c->group, dvo = c->dvo_pad;
    const size_t oesz = ak_dtype_size(c->o_dtype);
    const int64_t tok0 = (int64_t)c->qo_indptr[mg->req] + mg->q_begin;
    float *acc = sc->o;
    for (int m = mg->row_begin; m < mg->row_end; m++) {
        const int gt = m / group, h = m % group, t = gt % mg->q_count; /* rows as in the kernel */
        const int64_t head = (int64_t)(mg->kv_head + gt / mg->q_count) * group + h;
        /* the parts were finished without the sink: it joins here, once */
        float lse = c->sinks ? c->sinks[head] : -INFINITY;
        for (int i = 0; i < mg->num_parts; i++)
            lse = ak_lse_add(lse, c->part_lse[(int64_t)mg->first_row + i * mg->rows + m]);
        for (int d = 0; d < dvo; d += AK_VW) vf_store(acc + d, vf_zero());
        for (int i = 0; i < mg->num_parts; i++) {
            const int64_t slot_row = (int64_t)mg->first_row + i * mg->rows + m;
            if (c->part_lse[slot_row] == -INFINITY) continue;
            const vf w = vf_set1(ak_lse_weight(c->part_lse[slot_row], lse));
            const float *po = c->part_o + slot_row * dvo;
            for (int d = 0; d < dvo; d += AK_VW) vf_store(acc + d, vf_fma(w, vf_load(po + d), vf_load(acc + d)));
        }
        char *dst = c->o + ((tok0 + t) * c->o_stride0 + head * c->o_stride1) * (int64_t)oesz;
        store_row(dst, c->o_dtype, acc, 1.0f, c->head_dim_vo);
        if (c->lse) c->lse[(tok0 + t) * c->lse_stride0 + head * c->lse_stride1] = lse;
    }
}

const ak_cpu_kernels AK_CPU_KERNELS_NAME = {
    /* .isa = */ AK_CPU_ISA_NAME,
    /* .vec_width = */ AK_VW,
    /* .in_place_rows = */ AK_IN_PLACE_ROWS,
#if defined(AK_CPU_AMX)
    /* .amx = */ 1,
#else
    /* .amx = */ 0,
#endif
#if defined(AK_CPU_BF16)
    /* .bf16_dot = */ 1,
#else
    /* .bf16_dot = */ 0,
#endif
    /* .run_item = */ run_item,
    /* .merge = */ merge_task,
#if defined(AK_CPU_AMX)
    /* .pack_tile = */ amx_pack_tile,
#else
    /* .pack_tile = */ NULL,
#endif
};
