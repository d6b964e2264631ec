/*
 * prefill_wgmma.cu - the prefill kernel of prefill.cu for Hopper (sm_90a):
 * the same work items, masks, online softmax and outputs, with the two
 * matrix products on warpgroup MMA (wgmma.mma_async) instead of mma.sync.
 *
 * A thread block is two warpgroups of 4 warps; warpgroup g owns query rows
 * [64 g, 64 g + 64) of the tile's 128 (packed (token, query head) as in
 * prefill.cu), each warp 16 of them with their softmax state in registers.
 * Per tile of KEYS keys, a warpgroup computes S = Q K^T with both operands
 * read by the tensor cores from shared memory (descriptors; no ldmatrix, no
 * register copies of K), turns S into P in registers, and accumulates
 * O += P V with P from registers and V from shared memory. mma.sync spends
 * about six warp instructions per MMA on operand movement (ncu on the sm_80
 * kernel: issue-bound); a wgmma of m64n128k16 is one instruction for 32 of
 * them.
 *
 * Q, K and V tiles share one layout (wgmma.cuh: 64-element column blocks,
 * 128-byte swizzle), filled with cp.async through the page table by the
 * same loader as the other kernels (load_kv_tile, attn.cuh), STAGES deep.
 *
 * Built only for sm_90a (CMake compiles this file for that target alone
 * when the build includes sm_90); elsewhere its kernels are empty and
 * ak_cuda_prefill_wgmma_kernel reports none.
 */
#include "attn.cuh"
#include "wgmma.cuh"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

template <int D, int STAGES_ = 2, int KEYS_ = (D <= 128 ? 128 : 64)> struct wg_traits {
    static constexpr int THREADS = 256; /* two warpgroups */
    static constexpr int ROWS = 128;
    /* keys per K/V stage: the S accumulator is KEYS / 2 floats a thread and
     * o is D / 2; at D = 256 a 64-key tile keeps both within 255 registers */
    static constexpr int KEYS = KEYS_;
    static constexpr int STAGES = STAGES_;
    static constexpr int CHUNKS = D / 8;
    static constexpr int Q_BYTES = ROWS * D * 2;
    static constexpr int STAGE_BYTES = 2 * KEYS * D * 2;
    /* + 1024: the tiles start on a 1024-byte boundary (the swizzle) */
    static constexpr int SMEM_BYTES = Q_BYTES + STAGES * STAGE_BYTES + 1024;
    static_assert(D % 64 == 0, "head dims are multiples of 64 (one swizzle block)");
    static_assert((ROWS * CHUNKS) % THREADS == 0, "q chunks divide among the threads");
};

#define RESCALE_SLACK 8.0f /* as in prefill.cu */

template <int D, typename T, int STAGES = 2, int KEYS = (D <= 128 ? 128 : 64)>
__global__ void __launch_bounds__(256, 1) prefill_wgmma_kernel(const attn_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef wg_traits<D, STAGES, KEYS> tr;
    constexpr int ROWS = tr::ROWS;
    constexpr int NT = KEYS / 8; /* n tiles (8 keys) of S */
    constexpr int DN = D / 8;    /* n tiles of o */
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    T *qs = (T *)(smem_raw + ((1024 - (raw & 1023)) & 1023));
    T *stages = qs + ROWS * D;
    asm volatile("griddepcontrol.launch_dependents;"); /* the merge may start launching */
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wg = warp / 4;
    const int kv_head = blockIdx.y / p.prow_tiles, row_tile = blockIdx.y % p.prow_tiles;
    const int hb = p.prow_heads;
    const int head0 = kv_head * p.group + row_tile * hb;
    const int heads = min(hb, p.group - row_tile * hb);
    const int64_t lane_off = kv_head * p.kv_stride_head + (threadIdx.x % tr::CHUNKS) * 8;
    const int warp_row0 = warp * 16;
    const int num_items = p.counts[COUNT_PREFILL];

    /* No return before the griddepcontrol.wait at the end (see prefill.cu). */
    for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
        const prefill_item it = p.pitems[w];
        if (it.ntok == 0) continue; /* padding */
        const int32_t *pages = p.kv_indices + it.page_base;
        const int n_tiles = (it.kv_end - it.kv_begin + KEYS - 1) / KEYS;
        __syncthreads(); /* every warp is done with the previous item's shared memory */

        {
            const int c = threadIdx.x % tr::CHUNKS;
#pragma unroll 4
            for (int row = threadIdx.x / tr::CHUNKS; row < ROWS; row += tr::THREADS / tr::CHUNKS) {
                const int i = row / hb, g = row - i * hb;
                const bool valid = i < it.ntok && g < heads;
                const T *src = (const T *)p.q + (valid ? (it.tok0 + i) * p.q_stride_tok +
                                                             (head0 + g) * p.q_stride_head + c * 8
                                                       : 0);
                cp_async_16(qs + sw128<ROWS>(row, c), src, valid ? 16 : 0);
            }
        }
#pragma unroll
        for (int s = 0; s < tr::STAGES - 1; s++) {
            if (s < n_tiles)
                load_kv_tile<D, KEYS, tr::THREADS, T, true>(p, pages, lane_off, it.kv_begin + s * KEYS, it.kv_end,
                                                            stages + s * 2 * KEYS * D,
                                                            stages + (s * 2 + 1) * KEYS * D);
            cp_async_commit();
        }

        const int pos_last = it.pos0 + it.ntok - 1;
        /* this warp's first and last query tokens: which tiles need masks */
        const int warp_pos0 = it.pos0 + warp_row0 / hb;
        const int warp_pos1 = it.pos0 + (warp_row0 + 15) / hb;

        float o[DN][4];
        float m[2] = {-INFINITY, -INFINITY}, d[2] = {0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < DN; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

        for (int t = 0; t < n_tiles; t++) {
            cp_async_wait<tr::STAGES - 2>();
            fence_proxy_async(); /* this thread's copies, visible to wgmma */
            __syncthreads();     /* tile t (and q) landed; every warpgroup is done with tile t - 1 */
            const int next = t + tr::STAGES - 1;
            if (next < n_tiles) {
                const int s = next % tr::STAGES;
                load_kv_tile<D, KEYS, tr::THREADS, T, true>(p, pages, lane_off, it.kv_begin + next * KEYS, it.kv_end,
                                                            stages + s * 2 * KEYS * D,
                                                            stages + (s * 2 + 1) * KEYS * D);
            }
            cp_async_commit();
            const T *ks = stages + (t % tr::STAGES) * 2 * KEYS * D;
            const T *vs = ks + KEYS * D;
            const int t0 = it.kv_begin + t * KEYS;

            /* s = q . k for this warpgroup's 64 rows: K-major operands, 16
             * elements (32 bytes) of the head dim a step */
            float s[NT][4];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const uint64_t a = wgmma_desc(qs + (kk / 4) * ROWS * 64 + wg * 64 * 64 + (kk % 4) * 16, 16, 1024);
                const uint64_t b = wgmma_desc(ks + (kk / 4) * KEYS * 64 + (kk % 4) * 16, 16, 1024);
                wgmma_ss<KEYS, T>(reinterpret_cast<float(&)[KEYS / 2]>(s), a, b, kk > 0);
            }
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_hold(reinterpret_cast<float(&)[KEYS / 2]>(s));

            if (p.soft_cap > 0.0f) {
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[n][e] = p.cap_log2 * tanhf(s[n][e] * p.cap_scale);
            }
            /* masks where some key of the tile is hidden from some row of
             * this warp: the tile's end, the diagonal, the window */
            const bool masked = t0 + KEYS > it.kv_end || (p.causal && t0 + KEYS - 1 > warp_pos0) ||
                                (p.window_left >= 0 && t0 < min(warp_pos1, pos_last) - p.window_left);
            if (masked) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int pos = it.pos0 + (warp_row0 + lane / 4 + h * 8) / hb;
                    const int hi = min(p.causal ? pos : INT_MAX, it.kv_end - 1);
                    const int lo = p.window_left >= 0 ? pos - p.window_left : INT_MIN;
#pragma unroll
                    for (int n = 0; n < NT; n++)
#pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; e++) {
                            const int key = t0 + n * 8 + (lane % 4) * 2 + (e & 1);
                            if (key > hi || key < lo) s[n][e] = -INFINITY;
                        }
                }
            }
            const float sc = p.soft_cap > 0.0f ? 1.0f : p.scale_log2;

            /* online softmax of rows lane / 4 and lane / 4 + 8 of this warp,
             * with prefill.cu's lazy rescale */
            float tmax[2];
            bool raise = false;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float x = -INFINITY;
#pragma unroll
                for (int n = 0; n < NT; n++) x = fmaxf(x, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
                x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
                x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
                tmax[h] = x * sc;
                raise |= tmax[h] > m[h] + RESCALE_SLACK || (m[h] == -INFINITY && x > -INFINITY);
            }
            if (__any_sync(0xffffffffu, raise)) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const float m_new = fmaxf(m[h], tmax[h]);
                    const float f = m_new == -INFINITY ? 1.0f : exp2f(m[h] - m_new);
                    m[h] = m_new;
                    d[h] *= f;
#pragma unroll
                    for (int n = 0; n < DN; n++) {
                        o[n][2 * h] *= f;
                        o[n][2 * h + 1] *= f;
                    }
                }
            }
            uint32_t pa[NT / 2][4];
            {
                const float ref0 = m[0] == -INFINITY ? 0.0f : m[0], ref1 = m[1] == -INFINITY ? 0.0f : m[1];
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const float p0 = exp2f(fmaf(s[n][0], sc, -ref0)), p1 = exp2f(fmaf(s[n][1], sc, -ref0));
                    const float p2 = exp2f(fmaf(s[n][2], sc, -ref1)), p3 = exp2f(fmaf(s[n][3], sc, -ref1));
                    d[0] += p0 + p1;
                    d[1] += p2 + p3;
                    /* the accumulator layout of S is the A-register layout
                     * of P: n tiles 2k and 2k + 1 are k step k */
                    pa[n / 2][(n % 2) * 2] = dtype_traits<T>::pack(p0, p1);
                    pa[n / 2][(n % 2) * 2 + 1] = dtype_traits<T>::pack(p2, p3);
                }
            }

            /* o += p . v: V MN-major, 16 keys (two 8-row groups) a step */
            wgmma_fence();
#pragma unroll
            for (int kb = 0; kb < KEYS / 16; kb++) {
                const uint64_t b = wgmma_desc(vs + kb * 16 * 64, KEYS * 128, 1024);
                wgmma_rs<D, T>(reinterpret_cast<float(&)[D / 2]>(o), pa[kb], b);
            }
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_hold(reinterpret_cast<float(&)[D / 2]>(o));
        }
        cp_async_wait<0>();
        __syncthreads();

        /* epilogue (prefill.cu's, one m tile a warp) */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            d[h] += __shfl_xor_sync(0xffffffffu, d[h], 1);
            d[h] += __shfl_xor_sync(0xffffffffu, d[h], 2);
        }
        if (it.out < 0) {
            const float inv0 = d[0] > 0.0f ? 1.0f / d[0] : 0.0f;
            const float inv1 = d[1] > 0.0f ? 1.0f / d[1] : 0.0f;
            const int row = warp_row0 + lane / 4;
#pragma unroll
            for (int n = 0; n < DN; n++) {
                *(uint32_t *)(qs + sw128<ROWS>(row, n) + (lane % 4) * 2) =
                    dtype_traits<T>::pack(o[n][0] * inv0, o[n][1] * inv0);
                *(uint32_t *)(qs + sw128<ROWS>(row + 8, n) + (lane % 4) * 2) =
                    dtype_traits<T>::pack(o[n][2] * inv1, o[n][3] * inv1);
            }
            __syncwarp();
            for (int idx = lane; idx < 16 * tr::CHUNKS; idx += 32) {
                const int row = warp_row0 + idx / tr::CHUNKS, c = idx % tr::CHUNKS;
                const int i = row / hb, g = row - i * hb;
                if (i < it.ntok && g < heads)
                    *(uint4 *)((T *)p.o + (it.tok0 + i) * p.o_stride_tok + (head0 + g) * p.o_stride_head + c * 8) =
                        *(const uint4 *)(qs + sw128<ROWS>(row, c));
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = warp_row0 + lane / 4 + h * 8;
            const int i = row / hb, g = row - i * hb;
            if (i >= it.ntok || g >= heads) continue;
            const float lse = d[h] > 0.0f ? (m[h] + log2f(d[h])) * LN2 : -INFINITY;
            if (it.out < 0) {
                if (p.lse && lane % 4 == 0) p.lse[(it.tok0 + i) * p.lse_stride_tok + head0 + g] = lse;
                continue;
            }
            const int64_t slot = (int64_t)(it.out + i) * p.num_qo_heads + head0 + g;
            const float inv = d[h] > 0.0f ? 1.0f / d[h] : 0.0f;
            float *dst = p.o_tmp + slot * D + (lane % 4) * 2;
#pragma unroll
            for (int n = 0; n < DN; n++)
                *(float2 *)(dst + n * 8) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
            if (lane % 4 == 0) p.lse_tmp[slot] = lse;
        }
    }
    /* finish only after decode (see prefill.cu) */
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <int D, typename T, int S = 2, int K = (D <= 128 ? 128 : 64)> static prefill_kernel_info wg_kernel()
{
    prefill_kernel_info k = {prefill_wgmma_kernel<D, T, S, K>, wg_traits<D, S, K>::THREADS,
                             wg_traits<D, S, K>::SMEM_BYTES, wg_traits<D, S, K>::ROWS};
    return k;
}

template <typename T> static prefill_kernel_info wg_pick(int head_dim)
{
    switch (head_dim) {
    case 64: return wg_kernel<64, T>();
    case 128: {
        /* EXPERIMENT (tuning on the GPU): AK_WG_TUNE=stages,keys */
        const char *e = getenv("AK_WG_TUNE");
        if (e && !strcmp(e, "3,128")) return wg_kernel<128, T, 3, 128>();
        if (e && !strcmp(e, "2,64")) return wg_kernel<128, T, 2, 64>();
        if (e && !strcmp(e, "3,64")) return wg_kernel<128, T, 3, 64>();
        if (e && !strcmp(e, "4,64")) return wg_kernel<128, T, 4, 64>();
        return wg_kernel<128, T>();
    }
    case 256: return wg_kernel<256, T>();
    }
    const prefill_kernel_info none = {NULL, 0, 0, 0};
    return none;
}

prefill_kernel_info ak_cuda_prefill_wgmma_kernel(int head_dim, ak_dtype dtype)
{
#if defined(AK_WGMMA)
    return dtype == AK_BF16 ? wg_pick<__nv_bfloat16>(head_dim) : wg_pick<__half>(head_dim);
#else
    (void)head_dim;
    (void)dtype;
    const prefill_kernel_info none = {NULL, 0, 0, 0};
    return none;
#endif
}
