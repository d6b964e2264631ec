/*
 * portable.cu - attention for any head dims up to AK_PORTABLE_MAX_DIM, on
 * CUDA cores: the kernel that serves every (head_dim_qk, head_dim_vo) pair
 * the tensor-core kernels are not compiled for (512 among them), over the
 * same work lists (decode items or prefill items), with the same masks,
 * outputs, split-KV partial states and sinks as the others.
 *
 * A thread block loops over the plan's items (grid.x), each for one KV head
 * and row tile: grid.y's for decode items, the item's own for prefill items
 * (prefill_item.row). An item has at most ROWS query rows: the heads of
 * the row tile for a decode item, (token, head) pairs for a prefill item.
 * K/V stream through shared memory in tiles of KEYS keys, double-buffered
 * (cp.async of 16 bytes when both head dims are multiples of 8, element
 * copies otherwise). The four warps split the head dims, not the rows, so
 * that all of them work on a decode's single row as on a prefill tile:
 *   q.k   warp w owns the 8-element chunks w, w + 4, ... of every K row;
 *         lane (key, half) sums every other one of them for every row, from
 *         16-byte reads of its K row (rows padded by 16 bytes, so the 8
 *         lanes of a read phase hit 8 different bank groups) and of q (f32,
 *         broadcast); the four warps' partial sums meet in shared memory;
 *   softmax every warp runs the same online softmax on the summed logits of
 *         every row (the same numbers in the same order: no exchange needed);
 *   p.v   warp w's lane l owns the output dims d with d % 128 = 32 w + l.
 * fp8 K/V: the same, the tiles holding fp8 rows (16 elements a cp.async when
 * both dims are multiples of 16), each element converted as it is read;
 * k_scale multiplies the dots, v_scale the finished rows.
 */
#include "attn.cuh"

#include <limits.h>

#define PT_THREADS 128
#define PT_WARPS 4
#define PT_ROWS 8   /* query rows of an item */
#define PT_KEYS 16  /* keys per K/V tile */
#define PT_ODIMS ((AK_PORTABLE_MAX_DIM + 127) / 128) /* output dims a lane owns at most */

/* The shared-memory layout, from the head dims: the K/V row offsets of two
 * tiles, q rows as f32, the warps' partial logits, then two K/V stages. Row lengths in elements, multiples
 * of 8 (16-byte chunks). */
struct pt_layout {
    int qs;   /* q row: dqk rounded up to 8 */
    int ks;   /* K row: qs + 8 (the padding spreads the lanes' reads over the banks); fp8: whole 16-byte
                 chunks, + 16 */
    int vs;   /* V row: dvo rounded up to 8 (fp8: 16) */
    int bytes;
};

static __host__ __device__ __forceinline__ pt_layout pt_layout_of(int dqk, int dvo, int fp8)
{
    pt_layout l;
    l.qs = (dqk + 7) / 8 * 8;
    l.ks = fp8 ? (dqk + 15) / 16 * 16 + 16 : l.qs + 8;
    l.vs = fp8 ? (dvo + 15) / 16 * 16 : (dvo + 7) / 8 * 8;
    l.bytes = 2 * 2 * PT_KEYS * 8 + PT_ROWS * l.qs * 4 + PT_WARPS * PT_ROWS * PT_KEYS * 4 +
              2 * PT_KEYS * (l.ks + l.vs) * (fp8 ? 1 : 2);
    return l;
}

/* The element offsets of the K and V rows of keys [t0, t0 + KEYS) of KV
 * head kv_head, into off[0, KEYS) and off[KEYS, 2 KEYS): one block-id load
 * per key, by the first KEYS threads side by side. (With every thread
 * looking up the block of each 16 bytes it copies, one dependent load at a
 * time, a d512 decode moved a quarter of the copy bandwidth.) */
__device__ __forceinline__ void pt_rows(const attn_params &p, int kv_head, int page_base, int t0, int kv_end,
                                        int64_t *off)
{
    if (threadIdx.x >= PT_KEYS) return;
    const int key = min(t0 + (int)threadIdx.x, kv_end - 1);
    int slot;
    const int64_t block = kv_block_of(p, p.head->kv_table, page_base, key, slot);
    off[threadIdx.x] = block * p.k_block_stride + slot * p.k_stride_slot + kv_head * p.k_stride_head;
    off[PT_KEYS + threadIdx.x] = block * p.v_block_stride + slot * p.v_stride_slot + kv_head * p.v_stride_head;
}

/* One tile of keys [t0, t0 + KEYS) of K and V into a stage, at the row
 * offsets pt_rows wrote; keys at or past kv_end are zero (and masked). VEC:
 * 16-byte cp.async (dims whole 16-byte chunks of T), else element loads,
 * with K's padding columns up to qs zeroed (the dot product reads whole
 * chunks of 8 elements). */
template <typename T, bool VEC>
__device__ __forceinline__ void pt_load_tile(const attn_params &p, const pt_layout &l, const int64_t *off, int t0,
                                             int kv_end, T *ks, T *vs)
{
    constexpr int EPC = 16 / sizeof(T); /* elements a 16-byte chunk */
    const int dqk = p.head_dim_qk, dvo = p.head_dim_vo;
    const int kc = VEC ? dqk / EPC : l.qs, vc = VEC ? dvo / EPC : dvo; /* units a row: chunks or elements */
    for (int u = threadIdx.x; u < PT_KEYS * (kc + vc); u += PT_THREADS) {
        const bool is_v = u >= PT_KEYS * kc;
        const int w = is_v ? u - PT_KEYS * kc : u;
        const int per_row = is_v ? vc : kc;
        const int row = w / per_row, c = w - row * per_row;
        const T *src = (const T *)(is_v ? p.v_pool : p.k_pool) + off[(is_v ? PT_KEYS : 0) + row];
        T *dst = is_v ? vs + row * l.vs : ks + row * l.ks;
        const bool live = t0 + row < kv_end;
        if (VEC) {
            cp_async_16(dst + c * EPC, src + c * EPC, live ? 16 : 0);
        } else {
            const int dim = is_v ? dvo : dqk;
            dst[c] = live && c < dim ? src[c] : T(0.0f); /* fp8: the byte 0 */
        }
    }
}

/* 8 K elements (a chunk of the dot product) and one V element as floats. */
template <typename KV> struct pt_elems {
    static __device__ __forceinline__ void k8(const KV *k, float (&x)[8])
    {
        const uint4 raw = *(const uint4 *)k;
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 f = dtype_traits<KV>::unpack(w[j]);
            x[2 * j] = f.x;
            x[2 * j + 1] = f.y;
        }
    }
    static __device__ __forceinline__ float v1(const KV *v) { return dtype_traits<KV>::to_float(*v); }
};
template <> struct pt_elems<uint8_t> {
    static __device__ __forceinline__ void k8(const uint8_t *k, float (&x)[8])
    {
        const uint2 raw = *(const uint2 *)k;
        const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 f = fp8x2_to_float2((uint16_t)(w[j / 2] >> (16 * (j % 2))));
            x[2 * j] = f.x;
            x[2 * j + 1] = f.y;
        }
    }
    static __device__ __forceinline__ float v1(const uint8_t *v) { return fp8_to_float(*v); }
};

/* T: q and o; KV: K/V (T, or uint8_t for fp8 e4m3) */
template <typename T, typename KV, int DECODE, bool VEC>
__global__ void __launch_bounds__(PT_THREADS) portable_kernel(const attn_params p)
{
    constexpr bool FP8 = sizeof(KV) == 1;
    extern __shared__ float4 smem4[];
    const int dqk = p.head_dim_qk, dvo = p.head_dim_vo;
    const pt_layout l = pt_layout_of(dqk, dvo, FP8);
    int64_t *rowoff = (int64_t *)smem4;           /* [2][2 KEYS] K/V row offsets of tiles t % 2 */
    float *qs = (float *)(rowoff + 2 * 2 * PT_KEYS); /* [ROWS][qs] */
    float *part = qs + PT_ROWS * l.qs;            /* [WARPS][ROWS][KEYS] partial logits */
    KV *kst = (KV *)(part + PT_WARPS * PT_ROWS * PT_KEYS);
    KV *vst = kst + 2 * PT_KEYS * l.ks;
    if (DECODE) {
        decode_grid_start();
    } else {
#if __CUDA_ARCH__ >= 900
        /* prefill, decode's dependent, waits at its end; the kernel after
         * may start launching now */
        asm volatile("griddepcontrol.launch_dependents;");
#endif
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    /* decode: the KV head and row tile of grid.y; prefill: the item's (its row) */
    const int hb = DECODE ? PT_ROWS : p.prow_heads; /* heads a row tile holds */
    int kv_head = 0, head0 = 0, heads = 0;
    if (DECODE) {
        const int row_tile = blockIdx.y % p.row_tiles;
        kv_head = blockIdx.y / p.row_tiles;
        head0 = kv_head * p.group + row_tile * hb;
        heads = min(hb, p.group - row_tile * hb);
    }
    const int num_items = p.head->counts[DECODE ? COUNT_DECODE : COUNT_PREFILL];
    const int key_l = lane % PT_KEYS, half = lane / PT_KEYS;
    const int qc = l.qs / 8; /* 8-element chunks of a q / K row */
    kv_scales sc = {1.0f, 1.0f};
    if (FP8 && DECODE) sc = kv_scales_of(p, kv_head);

    /* No return before the griddepcontrol.wait at the end (see prefill.cu). */
    for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
        /* the item: rows (token tok0 + i, head head0 + g), row = i * hb + g */
        int tok0, ntok, pos0, page_base, kv_begin, kv_end, out, lo_all;
        if (DECODE) {
            const decode_item it = p.items[w];
            if (it.req < 0) continue;
            tok0 = it.tok, ntok = 1, pos0 = INT_MAX, page_base = it.page_base;
            kv_begin = it.kv_begin, kv_end = it.kv_end, out = it.out, lo_all = it.lo;
        } else {
            const prefill_item it = p.pitems[w];
            if (it.ntok == 0) continue;
            tok0 = it.tok0, ntok = it.ntok, pos0 = it.pos0, page_base = it.page_base;
            kv_begin = it.kv_begin, kv_end = it.kv_end, out = it.out, lo_all = 0;
            const item_heads ih = heads_of(p, it);
            kv_head = ih.kv_head, head0 = ih.head0, heads = ih.heads;
            if (FP8) sc = kv_scales_of(p, kv_head);
        }
        const int rows = min(PT_ROWS, ntok * hb); /* rows past the item's are skipped (warp-uniform) */
        __syncthreads(); /* every warp is done with the previous item's shared memory */

        /* q rows as f32, zero past dqk and in rows past the item's */
        for (int idx = threadIdx.x; idx < PT_ROWS * l.qs; idx += PT_THREADS) {
            const int row = idx / l.qs, c = idx - row * l.qs;
            const int i = row / hb, g = row - i * hb;
            float x = 0.0f;
            if (i < ntok && g < heads && c < dqk)
                x = dtype_traits<T>::to_float(((const T *)p.q)[(tok0 + i) * p.q_stride_tok +
                                                               (head0 + g) * p.q_stride_head + c]);
            qs[idx] = x;
        }

        /* row offsets of tiles 0 and 1 (each later tile's are written two
         * tiles ahead, once the loop's barrier says the slot is free) */
        const int n_tiles = (kv_end - kv_begin + PT_KEYS - 1) / PT_KEYS;
        for (int t = 0; t < 2 && t < n_tiles; t++)
            pt_rows(p, kv_head, page_base, kv_begin + t * PT_KEYS, kv_end, rowoff + t * 2 * PT_KEYS);
        __syncthreads();
        if (n_tiles > 0) pt_load_tile<KV, VEC>(p, l, rowoff, kv_begin, kv_end, kst, vst);
        cp_async_commit();

        float m[PT_ROWS], d[PT_ROWS], o[PT_ROWS][PT_ODIMS];
#pragma unroll
        for (int r = 0; r < PT_ROWS; r++) {
            m[r] = -INFINITY;
            d[r] = 0.0f;
#pragma unroll
            for (int i = 0; i < PT_ODIMS; i++) o[r][i] = 0.0f;
        }

        for (int t = 0; t < n_tiles; t++) {
            cp_async_wait<0>();
            __syncthreads(); /* tile t landed; every warp is done with tile t - 1 and its partials */
            if (t + 1 < n_tiles)
                pt_load_tile<KV, VEC>(p, l, rowoff + ((t + 1) % 2) * 2 * PT_KEYS, kv_begin + (t + 1) * PT_KEYS,
                                     kv_end, kst + ((t + 1) % 2) * PT_KEYS * l.ks,
                                     vst + ((t + 1) % 2) * PT_KEYS * l.vs);
            cp_async_commit();
            const KV *ks = kst + (t % 2) * PT_KEYS * l.ks, *vs = vst + (t % 2) * PT_KEYS * l.vs;
            const int t0 = kv_begin + t * PT_KEYS, key = t0 + key_l;

            /* q.k: this warp's chunks, every row, lane (key, half) */
            const KV *krow = ks + key_l * l.ks;
#pragma unroll
            for (int r = 0; r < PT_ROWS; r++) {
                if (r >= rows) break;
                const float *q = qs + r * l.qs;
                float dot = 0.0f;
                for (int c = warp + PT_WARPS * half; c < qc; c += 2 * PT_WARPS) {
                    float kx[8];
                    pt_elems<KV>::k8(krow + c * 8, kx);
                    const float4 qa = *(const float4 *)(q + c * 8), qb = *(const float4 *)(q + c * 8 + 4);
                    const float qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
                    for (int j = 0; j < 4; j++) dot = fmaf(qv[2 * j], kx[2 * j], fmaf(qv[2 * j + 1], kx[2 * j + 1], dot));
                }
                dot += __shfl_xor_sync(0xffffffffu, dot, PT_KEYS);
                if (FP8) dot *= sc.k; /* the raw product the NaN rule sees */
                if (half == 0) part[(warp * PT_ROWS + r) * PT_KEYS + key_l] = dot;
            }
            __syncthreads(); /* every warp's partial logits are in */

            /* online softmax, the same in every warp; p.v over this warp's dims */
#pragma unroll
            for (int r = 0; r < PT_ROWS; r++) {
                if (r >= rows) break;
                const int i = r / hb;
                float dot = 0.0f;
#pragma unroll
                for (int w2 = 0; w2 < PT_WARPS; w2++) dot += part[(w2 * PT_ROWS + r) * PT_KEYS + key_l];
                /* masks: the chunk, the window, causality (visible.h) */
                int lo = max(kv_begin, lo_all), hi = kv_end - 1;
                if (!DECODE) {
                    lo = max(lo, ak_visible_lo(pos0 + i, p.window_left));
                    hi = ak_visible_hi(pos0 + i, kv_end, p.causal);
                }
                const bool seen = key >= lo && key <= hi;
                const float x = seen ? to_logit2(p, dot) : -INFINITY;
                /* the keys this row sees (lanes 16-31 repeat 0-15): P.V skips
                 * the others, whose V may hold a NaN that 0 * NaN would let in */
                const uint32_t seen_keys = __ballot_sync(0xffffffffu, seen);
                float tmax = x;
#pragma unroll
                for (int s = 1; s < PT_KEYS; s *= 2) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, s));
                const float m_new = fmaxf(m[r], tmax);
                const float f = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - m_new);
                const float pk = x == -INFINITY ? 0.0f : exp2f(x - m_new);
                float psum = seen ? fmaf(dot, 0.0f, pk) : pk; /* the NaN rule: the raw product (attn.cuh) */
#pragma unroll
                for (int s = 1; s < PT_KEYS; s *= 2) psum += __shfl_xor_sync(0xffffffffu, psum, s);
                m[r] = m_new;
                d[r] = d[r] * f + psum;
#pragma unroll
                for (int i2 = 0; i2 < PT_ODIMS; i2++) o[r][i2] *= f;
#pragma unroll 4
                for (int j = 0; j < PT_KEYS; j++) {
                    const float pj = __shfl_sync(0xffffffffu, pk, j);
                    if (!((seen_keys >> j) & 1u)) continue;
                    const KV *vrow = vs + j * l.vs;
#pragma unroll
                    for (int i2 = 0; i2 < PT_ODIMS; i2++) {
                        const int dim = 128 * i2 + 32 * warp + lane;
                        if (dim < dvo) o[r][i2] = fmaf(pj, pt_elems<KV>::v1(vrow + dim), o[r][i2]);
                    }
                }
            }
            /* tile t + 2's row offsets into the slot tile t's copies used
             * (every thread passed this tile's first barrier after them) */
            if (t + 2 < n_tiles)
                pt_rows(p, kv_head, page_base, kv_begin + (t + 2) * PT_KEYS, kv_end, rowoff + (t % 2) * 2 * PT_KEYS);
        }
        cp_async_wait<0>();

        /* the NaN rule: a non-finite o element makes its row NaN; a row's o
         * is spread over the warps, whose checks meet in `part` */
        __syncthreads(); /* every warp is done with the last tile's partial logits */
#pragma unroll
        for (int r = 0; r < PT_ROWS; r++) {
            float bad = 0.0f;
#pragma unroll
            for (int i2 = 0; i2 < PT_ODIMS; i2++) add_bad(bad, o[r][i2]);
#pragma unroll
            for (int x = 1; x < 32; x *= 2) bad += __shfl_xor_sync(0xffffffffu, bad, x);
            if (lane == 0) part[warp * PT_ROWS + r] = bad;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < PT_ROWS; r++)
#pragma unroll
            for (int w2 = 0; w2 < PT_WARPS; w2++) d[r] += part[w2 * PT_ROWS + r];

        /* epilogue: each row's o and lse (warp 0 lane 0), or its partial state */
#pragma unroll
        for (int r = 0; r < PT_ROWS; r++) {
            const int i = r / hb, g = r - i * hb;
            if (r >= rows || g >= heads) continue;
            const int head = head0 + g;
            float inv, lse;
            if (FP8) v_scale_rule(sc.v, d[r]);
            finish_row(p, head, out >= 0, m[r], d[r], inv, lse);
            if (FP8) inv *= sc.v;
            if (out < 0) {
                T *dst = (T *)p.o + (tok0 + i) * p.o_stride_tok + head * p.o_stride_head;
#pragma unroll
                for (int i2 = 0; i2 < PT_ODIMS; i2++) {
                    const int dim = 128 * i2 + 32 * warp + lane;
                    if (dim < dvo) dst[dim] = dtype_traits<T>::from_float(o[r][i2] * inv);
                }
                if (p.lse && threadIdx.x == 0) p.lse[(tok0 + i) * p.lse_stride_tok + head] = lse;
            } else {
                const int64_t slot = (int64_t)(out + i) * p.num_qo_heads + head;
                float *dst = p.o_tmp + slot * dvo;
#pragma unroll
                for (int i2 = 0; i2 < PT_ODIMS; i2++) {
                    const int dim = 128 * i2 + 32 * warp + lane;
                    if (dim < dvo) dst[dim] = o[r][i2] * inv;
                }
                if (threadIdx.x == 0) p.lse_tmp[slot] = lse;
            }
        }
    }
#if __CUDA_ARCH__ >= 900
    /* as prefill: when launched as decode's programmatic dependent, finish
     * only after it (the merge waits for this grid) */
    if (!DECODE) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <typename T, typename KV> static attn_kernel portable_of(int decode, int dqk, int dvo)
{
    constexpr int EPC = 16 / sizeof(KV);
    const bool vec = dqk % EPC == 0 && dvo % EPC == 0;
    attn_kernel k;
    k.fn = decode ? (vec ? portable_kernel<T, KV, 1, true> : portable_kernel<T, KV, 1, false>)
                  : (vec ? portable_kernel<T, KV, 0, true> : portable_kernel<T, KV, 0, false>);
    k.threads = PT_THREADS;
    k.smem = pt_layout_of(dqk, dvo, sizeof(KV) == 1).bytes;
    k.rows = PT_ROWS;
    k.unchecked = 0;
    return k;
}

attn_kernel ak_cuda_portable_kernel(int decode, int dqk, int dvo, ak_dtype dtype, int fp8)
{
    if (dqk < 1 || dvo < 1 || dqk > AK_PORTABLE_MAX_DIM || dvo > AK_PORTABLE_MAX_DIM) {
        const attn_kernel none = {NULL, 0, 0, 0};
        return none;
    }
    if (fp8)
        return dtype == AK_BF16 ? portable_of<__nv_bfloat16, uint8_t>(decode, dqk, dvo)
                                : portable_of<__half, uint8_t>(decode, dqk, dvo);
    return dtype == AK_BF16 ? portable_of<__nv_bfloat16, __nv_bfloat16>(decode, dqk, dvo)
                            : portable_of<__half, __half>(decode, dqk, dvo);
}
