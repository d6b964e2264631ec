/*
 * prefill.cu - paged prefill / extend / verify on tensor cores: any number of
 * query tokens per request against the request's paged K/V, causal masking
 * aligned to the end of the KV (a chunk of q_len tokens sees the prefix of
 * kv_len - q_len keys and itself).
 *
 * FlashAttention-2's scheme on mma.sync m16n8k16: a thread block owns a tile
 * of ROWS query rows, packed as (token, query head of the KV head's group) so
 * a GQA group shares every K/V load; its 4 warps each own 16 * MT rows and
 * stream over every key of the tile's range with their own online softmax in
 * registers (no cross-warp merge). Q sits in shared memory (ldmatrix per k
 * step); K/V tiles of TILE keys stream in through cp.async, STAGES deep, read
 * through the page table with load_kv_tile (attn.cuh). Scores never leave
 * registers: the S accumulator becomes the A operand of P.V directly.
 *
 * The grid is fixed when the backend is created (one wave of thread blocks per
 * KV head and row tile) and each block loops over the plan's work items, so a
 * captured graph replays after any later plan. plan() orders the items
 * heaviest first and splits the keys of items that would dominate the wave
 * (split-KV; partials merged by merge.cu).
 */
#include "attn.cuh"

#include <limits.h>

/* ---- tile traits ------------------------------------------------------------ */

template <int D> struct prefill_traits {
    static constexpr int WARPS = 4;
    static constexpr int THREADS = WARPS * 32;
    /* 16-row m tiles per warp: two let each K/V fragment feed two mma (half
     * the shared-memory reads per FLOP); at D = 256 the o accumulator of two
     * (256 floats a thread) would not fit in registers */
    static constexpr int MT = D <= 128 ? 2 : 1;
    static constexpr int WARP_ROWS = 16 * MT;
    static constexpr int ROWS = WARPS * WARP_ROWS;
    static constexpr int TILE = D <= 128 ? 64 : 32; /* keys per K/V stage */
    static constexpr int STAGES = D <= 64 ? 3 : 2;
    static constexpr int CHUNKS = D / 8; /* 16-byte chunks per row */
    static constexpr int Q_BYTES = ROWS * D * 2;
    static constexpr int STAGE_BYTES = 2 * TILE * D * 2;
    static constexpr int SMEM_BYTES = Q_BYTES + STAGES * STAGE_BYTES;
    /* two blocks per SM at D = 128 and 256 (96 KB of shared memory each, at
     * most 255 registers a thread: 2 x 128 x 256 fills the register file;
     * ptxas: D = 128 uses 255 with ~20 bytes spilled, D = 256 none), three
     * at D = 64 (64 KB each, 168 registers, ~24 bytes spilled) */
    static constexpr int MIN_CTAS = D <= 64 ? 3 : 2;
    static_assert(D % 64 == 0, "head dims are multiples of 64 (the swizzle needs 8 chunks)");
    static_assert((ROWS * CHUNKS) % THREADS == 0, "q chunks divide among the threads");
};

/* How far (base 2) a row's max may pass its softmax reference before o is
 * rescaled: p stays below 2^8. */
#define RESCALE_SLACK 8.0f

/* ---- the kernel --------------------------------------------------------------- */

template <int D, typename T>
__global__ void __launch_bounds__(prefill_traits<D>::THREADS, prefill_traits<D>::MIN_CTAS)
    prefill_kernel(const attn_params p)
{
    typedef prefill_traits<D> tr;
    constexpr int MT = tr::MT, NT = tr::TILE / 8; /* n tiles (8 keys) of a K/V tile */
    extern __shared__ uint4 smem[];
    T *qs = (T *)smem;
    T *stages = (T *)((char *)smem + tr::Q_BYTES);
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;"); /* the merge may start launching */
#endif
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int mi = lane / 8, r8 = lane % 8; /* ldmatrix: matrix and row this lane addresses */
    const int kv_head = blockIdx.y / p.prow_tiles, row_tile = blockIdx.y % p.prow_tiles;
    const int hb = p.prow_heads;
    const int head0 = kv_head * p.group + row_tile * hb;
    const int heads = min(hb, p.group - row_tile * hb);
    const int64_t lane_off = kv_head * p.kv_stride_head + (threadIdx.x % tr::CHUNKS) * 8;
    const int warp_row0 = warp * tr::WARP_ROWS;
    const int num_items = p.counts[COUNT_PREFILL];

    /* No return before the griddepcontrol.wait at the end: the merge after
     * this kernel sees decode's partials only because prefill cannot finish
     * before decode. */
    for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
        const prefill_item it = p.pitems[w];
        if (it.ntok == 0) continue; /* padding */
        const int n_tiles = (it.kv_end - it.kv_begin + tr::TILE - 1) / tr::TILE;
        __syncthreads(); /* every warp is done with the previous item's shared memory */

        /* q rows (zero past the tile's tokens and heads), in the first group */
        load_q_tile<tr::ROWS, tr::THREADS, tr::CHUNKS>(p, it, head0, hb, heads, qs,
                                                       [](int row, int c) { return swz<D>(row, c); });
#pragma unroll
        for (int s = 0; s < tr::STAGES - 1; s++) {
            if (s < n_tiles)
                load_kv_tile<D, tr::TILE, tr::THREADS, T>(p, it.page_base, lane_off, it.kv_begin + s * tr::TILE,
                                                          it.kv_end,
                                                          stages + s * 2 * tr::TILE * D,
                                                          stages + (s * 2 + 1) * tr::TILE * D);
            cp_async_commit();
        }

        const int pos_last = it.pos0 + it.ntok - 1;

        float o[MT][D / 8][4];
        float m[MT][2], d[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int n = 0; n < D / 8; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
            m[mt][0] = m[mt][1] = -INFINITY;
            d[mt][0] = d[mt][1] = 0.0f;
        }

        for (int t = 0; t < n_tiles; t++) {
            cp_async_wait<tr::STAGES - 2>();
            __syncthreads(); /* tile t (and q) landed; every warp is done with tile t - 1 */
            const int next = t + tr::STAGES - 1;
            if (next < n_tiles) {
                const int s = next % tr::STAGES;
                load_kv_tile<D, tr::TILE, tr::THREADS, T>(p, it.page_base, lane_off, it.kv_begin + next * tr::TILE,
                                                          it.kv_end, stages + s * 2 * tr::TILE * D,
                                                          stages + (s * 2 + 1) * tr::TILE * D);
            }
            cp_async_commit();
            const T *ks = stages + (t % tr::STAGES) * 2 * tr::TILE * D;
            const T *vs = ks + tr::TILE * D;
            const int t0 = it.kv_begin + t * tr::TILE;

            /* s = q . k: this warp's rows x the tile's keys */
            float s[MT][NT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < NT; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    ldmatrix_x4(a[mt], qs + swz<D>(warp_row0 + mt * 16 + (mi % 2) * 8 + r8, 2 * kk + mi / 2));
#pragma unroll
                for (int nb = 0; nb < NT / 2; nb++) {
                    uint32_t b[4];
                    ldmatrix_x4(b, ks + swz<D>(nb * 16 + (mi / 2) * 8 + r8, 2 * kk + mi % 2));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma_16816<T>(s[mt][2 * nb], a[mt], b);
                        mma_16816<T>(s[mt][2 * nb + 1], a[mt], b + 2);
                    }
                }
            }

            /* soft-cap before the masks: tanh(-inf) would unmask */
            if (p.soft_cap > 0.0f) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int n = 0; n < NT; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) s[mt][n][e] = p.cap_log2 * tanhf(s[mt][n][e] * p.cap_scale);
            }
            /* masks only where some key of the tile is hidden from some row:
             * the tile's end, the diagonal, the window */
            const bool masked = t0 + tr::TILE > it.kv_end || (p.causal && t0 + tr::TILE - 1 > it.pos0) ||
                                (p.window_left >= 0 && t0 < pos_last - p.window_left);
            if (masked) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        mask_row(p, s[mt], h, it.pos0 + (warp_row0 + mt * 16 + lane / 4 + h * 8) / hb, t0,
                                 it.kv_end, lane);
            }
            /* s is now a logit in base 2 (soft-capped) or a raw dot product
             * whose logit is s * scale: exp2 takes one FFMA either way */
            const float sc = p.soft_cap > 0.0f ? 1.0f : p.scale_log2;

            /* online softmax per row (rows lane/4 and lane/4 + 8 of each m tile).
             * The reference m is raised only when a tile's max passes it by
             * more than RESCALE_SLACK (base 2): p = exp2(logit - m) then stays
             * below 2^RESCALE_SLACK, harmless in f32 sums and in the 16-bit P
             * (relative precision), and the o rescale (D / 2 multiplies per
             * row) runs on a few tiles instead of all: ncu showed it at 1 in
             * 12 instructions of the loop (d128), as many as the mma at d256.
             * The decision is warp-wide so the branch never diverges. A row
             * with nothing visible yet keeps m = -inf and uses 0 as its
             * reference, so exp2 sees -inf - 0 and never -inf - -inf. */
            uint32_t pa[MT][NT / 2][4];
            float tmax[MT][2];
            bool raise = false;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float x = -INFINITY;
#pragma unroll
                    for (int n = 0; n < NT; n++) x = fmaxf(x, fmaxf(s[mt][n][2 * h], s[mt][n][2 * h + 1]));
                    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
                    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
                    tmax[mt][h] = x * sc; /* in base-2 logits */
                    raise |= tmax[mt][h] > m[mt][h] + RESCALE_SLACK || (m[mt][h] == -INFINITY && x > -INFINITY);
                }
            if (__any_sync(0xffffffffu, raise)) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const float m_new = fmaxf(m[mt][h], tmax[mt][h]);
                        const float f = m_new == -INFINITY ? 1.0f : exp2f(m[mt][h] - m_new);
                        m[mt][h] = m_new;
                        d[mt][h] *= f;
#pragma unroll
                        for (int n = 0; n < D / 8; n++) {
                            o[mt][n][2 * h] *= f;
                            o[mt][n][2 * h + 1] *= f;
                        }
                    }
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const float ref[2] = {m[mt][0] == -INFINITY ? 0.0f : m[mt][0], m[mt][1] == -INFINITY ? 0.0f : m[mt][1]};
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const float p0 = exp2f(fmaf(s[mt][n][0], sc, -ref[0])), p1 = exp2f(fmaf(s[mt][n][1], sc, -ref[0]));
                    const float p2 = exp2f(fmaf(s[mt][n][2], sc, -ref[1])), p3 = exp2f(fmaf(s[mt][n][3], sc, -ref[1]));
                    d[mt][0] += p0 + p1;
                    d[mt][1] += p2 + p3;
                    /* A fragment of P for k step n / 2: n even -> regs 0, 1; odd -> 2, 3 */
                    pa[mt][n / 2][(n % 2) * 2] = dtype_traits<T>::pack(p0, p1);
                    pa[mt][n / 2][(n % 2) * 2 + 1] = dtype_traits<T>::pack(p2, p3);
                }
            }

            /* o += p . v */
#pragma unroll
            for (int kb = 0; kb < NT / 2; kb++)
#pragma unroll
                for (int np = 0; np < D / 16; np++) {
                    uint32_t b[4];
                    ldmatrix_x4_trans(b, vs + swz<D>(kb * 16 + (mi % 2) * 8 + r8, 2 * np + mi / 2));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma_16816<T>(o[mt][2 * np], pa[mt][kb], b);
                        mma_16816<T>(o[mt][2 * np + 1], pa[mt][kb], b + 2);
                    }
                }
        }
        /* every copy into shared memory has landed (with no key tiles, q's
         * had not been waited for) and every warp is done with the tiles:
         * the epilogue may reuse q's rows */
        cp_async_wait<0>();
        __syncthreads();

        /* epilogue: row sums across the quad, normalise, write */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                d[mt][h] += __shfl_xor_sync(0xffffffffu, d[mt][h], 1);
                d[mt][h] += __shfl_xor_sync(0xffffffffu, d[mt][h], 2);
            }
        if (it.out < 0) {
            /* through this warp's own q rows in shared memory (no other warp
             * reads them), then 16-byte stores of whole rows */
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const float inv0 = d[mt][0] > 0.0f ? 1.0f / d[mt][0] : 0.0f;
                const float inv1 = d[mt][1] > 0.0f ? 1.0f / d[mt][1] : 0.0f;
                const int row = warp_row0 + mt * 16 + lane / 4;
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    *(uint32_t *)(qs + swz<D>(row, n) + (lane % 4) * 2) =
                        dtype_traits<T>::pack(o[mt][n][0] * inv0, o[mt][n][1] * inv0);
                    *(uint32_t *)(qs + swz<D>(row + 8, n) + (lane % 4) * 2) =
                        dtype_traits<T>::pack(o[mt][n][2] * inv1, o[mt][n][3] * inv1);
                }
            }
            __syncwarp();
            for (int idx = lane; idx < tr::WARP_ROWS * tr::CHUNKS; idx += 32) {
                const int row = warp_row0 + idx / tr::CHUNKS, c = idx % tr::CHUNKS;
                const int i = row / hb, g = row - i * hb;
                if (i < it.ntok && g < heads)
                    *(uint4 *)((T *)p.o + (it.tok0 + i) * p.o_stride_tok + (head0 + g) * p.o_stride_head + c * 8) =
                        *(const uint4 *)(qs + swz<D>(row, c));
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = warp_row0 + mt * 16 + lane / 4 + h * 8;
                const int i = row / hb, g = row - i * hb;
                if (i >= it.ntok || g >= heads) continue;
                const float lse = d[mt][h] > 0.0f ? (m[mt][h] + log2f(d[mt][h])) * LN2 : -INFINITY;
                if (it.out < 0) {
                    if (p.lse && lane % 4 == 0) p.lse[(it.tok0 + i) * p.lse_stride_tok + head0 + g] = lse;
                    continue;
                }
                /* a split part: f32 partial state of token i in slot out + i */
                const int64_t slot = (int64_t)(it.out + i) * p.num_qo_heads + head0 + g;
                const float inv = d[mt][h] > 0.0f ? 1.0f / d[mt][h] : 0.0f;
                float *dst = p.o_tmp + slot * D + (lane % 4) * 2;
#pragma unroll
                for (int n = 0; n < D / 8; n++)
                    *(float2 *)(dst + n * 8) = make_float2(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
                if (lane % 4 == 0) p.lse_tmp[slot] = lse;
            }
    }
#if __CUDA_ARCH__ >= 900
    /* launched as a programmatic dependent of decode: finish only after it,
     * so the merge (which waits for this grid) sees decode's partials too */
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* ---- the launcher ------------------------------------------------------------- */

template <int D, typename T> struct mma_prefill_info {
    static prefill_kernel_info get()
    {
        const prefill_kernel_info k = {prefill_kernel<D, T>, prefill_traits<D>::THREADS, prefill_traits<D>::SMEM_BYTES,
                                       prefill_traits<D>::ROWS};
        return k;
    }
};

prefill_kernel_info ak_cuda_prefill_kernel(prefill_family f, int head_dim, ak_dtype dtype)
{
    if (f == PREFILL_WGMMA) return ak_cuda_prefill_wgmma_kernel(head_dim, dtype);
    return prefill_table<mma_prefill_info>(head_dim, dtype);
}

ak_status ak_cuda_prefill_occupancy(prefill_family f, int head_dim, ak_dtype dtype, int *ctas_per_sm)
{
    const prefill_kernel_info k = ak_cuda_prefill_kernel(f, head_dim, dtype);
    if (!k.fn) return ak_set_error(AK_ERR_INTERNAL, "no prefill kernel for head_dim %d", head_dim);
    AK_CUDA_TRY(cudaFuncSetAttribute((const void *)k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem));
    AK_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, (const void *)k.fn, k.threads, k.smem));
    return AK_OK;
}

ak_status ak_cuda_prefill_launch(const attn_params *p, prefill_family f, int head_dim, ak_dtype dtype, int ctas,
                                 int after_decode, cudaStream_t stream)
{
    const prefill_kernel_info k = ak_cuda_prefill_kernel(f, head_dim, dtype);
    if (!k.fn) return ak_set_error(AK_ERR_INTERNAL, "no prefill kernel for head_dim %d", head_dim);
    return launch_kernel(k.fn, dim3(ctas, p->num_kv_heads * p->prow_tiles), k.threads, k.smem, after_decode, stream,
                         *p);
}
