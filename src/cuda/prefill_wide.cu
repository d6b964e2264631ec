/*
 * prefill_wide.cu - prefill / extend / verify at head dim 512 (Q/K and V) on
 * Hopper warpgroup MMA (sm_90a): prefill_wgmma.cu's work items, producer,
 * masks, online softmax, NaN rule and outputs, with o split over two
 * consumer warpgroups as mla_wgmma.cu splits it. A 64-row o accumulator of
 * 512 floats a row is 256 registers a thread in one warpgroup; in two it is
 * 128 each.
 *
 * A block serves 64 query rows (tokens x query heads of a KV head's group,
 * packed as in prefill.cu) over 64-key tiles. Three warpgroups:
 *   producer (2)  prefill_producer (producer.cuh): the K and V tiles and
 *                 the item's q rows by cp.async through the page table;
 *   scores (0)    S = q K^T (64 x 64 over 512, both operands read by the
 *                 tensor cores from shared memory), the masks and the
 *                 online softmax, P in registers and in shared memory for
 *                 warpgroup 1, and o[:, 0:256] += P V;
 *   values (1)    the NaN rule's scan of a mixed tile's V (a tile some of
 *                 whose keys some row does not see), then
 *                 o[:, 256:512] += P V with P read from shared memory.
 *
 * Shared memory holds q (64 KB) and one K and one V tile (64 KB each), K
 * and V freed apart: the producer copies K of tile t + 1 while P V of tile t
 * runs, and V of tile t + 1 while S of tile t + 1 does. Two stages of each
 * would not fit beside q.
 *
 * Every item runs the NaN rule's checked path (as prefill_wgmma.cu does at
 * head dim 256): one fused multiply-add a logit and a scan of mixed tiles.
 *
 * Built only for sm_90a, with prefill_wgmma.cu; elsewhere the kernel is
 * empty and ak_cuda_prefill_wide_kernel reports none (head dim 512 prefill
 * then runs on the portable kernel).
 */
#include "attn.cuh"
#include "producer.cuh"
#include "wgmma.cuh"

namespace {

struct wide_wg {
    static constexpr int DQK = 512, DVO = 512, DP = 512, HALF = DVO / 2;
    static constexpr int ROWS = 64, KEYS = 64, STAGES = 1;
    static constexpr int PRODUCERS = 128, CONSUMERS = 256, THREADS = 384;
    /* as prefill_wgmma.cu's split: within the 168 a thread of 384 */
    static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
    static constexpr int PSTRIDE = KEYS + 8; /* P's row (elements): conflict-free stores and ldmatrix */
    /* + 1024: the tiles start on a 1024-byte boundary (the swizzle); then
     * P, three rows of floats (the tile's rescale factors, the NaN rule's
     * sums of warpgroup 1, 1/d) and the barriers */
    static constexpr int SMEM_BYTES = 1024 + ROWS * DP * 2 + STAGES * 2 * KEYS * DP * 2 + ROWS * PSTRIDE * 2 +
                                      3 * ROWS * 4 + (int)sizeof(ws_barriers<STAGES>);
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory per block on sm_90");
    static_assert(DQK == DP && DVO == DP, "one row width");
    static_assert(PRODUCERS * PRODUCER_REGS + CONSUMERS * CONSUMER_REGS <= THREADS * (65536 / THREADS / 8 * 8),
                  "the register file");
};

/* Named barriers between the two consumer warpgroups (256 threads, synced
 * from different code: bar_sync_any): P of a tile is in shared memory;
 * warpgroup 1 has read the last one; warpgroup 1's NaN-rule sums are
 * written; 1/d is; a mixed tile's V is scanned and its bad keys marked. */
enum { BAR_P_READY = 1, BAR_P_FREE = 2, BAR_BAD_READY = 3, BAR_INV_READY = 4, BAR_SCANNED = 5 };

/* A tile of keys from t0 may have keys some row of the block does not see
 * (the causal diagonal, a window's edge): the NaN rule scans its V. Both
 * consumer warpgroups ask it of every tile and agree. */
template <int KEYS> __device__ __forceinline__ bool mixed_tile(const attn_params &p, const prefill_item &it, int t0)
{
    const int pos_last = it.pos0 + it.ntok - 1;
    return (p.causal && t0 + KEYS - 1 > it.pos0) ||
           (p.window_left >= 0 && t0 < (int64_t)pos_last - p.window_left); /* (64 bits: any window) */
}

/* This thread's columns of o (half h) for its rows r and r + 8, scaled by
 * inv: the output rows, or the item's partial slots. */
template <typename T>
__device__ __forceinline__ void wide_store(const attn_params &p, const prefill_item &it,
                                           const float (&o)[wide_wg::HALF / 8][4], int h, int head0, int hb,
                                           int heads, int r, const float (&inv)[2])
{
    store_o_half<wide_wg::HALF, wide_wg::DVO, T>(p, o, h, r, inv, it.out >= 0,
                                                 [&](int row, int64_t &tok, int &head, int64_t &slot) {
                                                     const int i = row / hb, g = row - i * hb;
                                                     tok = it.tok0 + i;
                                                     head = head0 + g;
                                                     slot = it.out + i;
                                                     return i < it.ntok && g < heads;
                                                 });
}

/* Warpgroup 0: the scores, the masks and softmax, and the first half of o. */
template <typename T>
__device__ __forceinline__ void wide_scores(const attn_params &p, const T *qs, const T *stages, T *ps, float *fs,
                                            const float *bad_s, float *inv_s, ws_barriers<wide_wg::STAGES> &bar,
                                            uint32_t (*bad_keys)[wide_wg::KEYS / 32])
{
    typedef wide_wg W;
    constexpr int NT = W::KEYS / 8;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int warp_row0 = warp * 16, r = warp_row0 + lane / 4; /* this thread's rows: r and r + 8 */
    const int num_items = p.head->counts[COUNT_PREFILL];
    const T *ks = stages, *vs = stages + W::KEYS * W::DP;
    int g = 0, nq = 0, mk = 0; /* tiles, items and mixed tiles so far */
    for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
        const prefill_item it = p.pitems[w];
        if (it.ntok == 0) continue; /* padding */
        const item_heads ih = heads_of(p, it);
        const int head0 = ih.head0, heads = ih.heads, hb = p.prow_heads;
        const int n_tiles = (it.kv_end - it.kv_begin + W::KEYS - 1) / W::KEYS;
        const int pos_last = it.pos0 + it.ntok - 1;
        const int row_pos0 = it.pos0 + r / hb, row_pos1 = it.pos0 + (r + 8) / hb;
        const int warp_pos0 = it.pos0 + warp_row0 / hb;
        const int warp_pos1 = min(it.pos0 + (warp_row0 + 15) / hb, pos_last);
        /* (q tested together with the first tile's K: 1.012 of the time,
         * H200, BENCHMARKS.md) */
        mbar_wait(&bar.q_full, nq & 1);
        nq++;
        float o[W::HALF / 8][4];
        zero(o);
        float m[2] = {-INFINITY, -INFINITY}, d[2] = {0.0f, 0.0f};
        for (int t = 0; t < n_tiles; t++) {
            const int gt = g + t, t0 = it.kv_begin + t * W::KEYS;
            float s[NT][4], f[2];
            mbar_wait(&bar.k_full[0], gt & 1);
            if (t == 0) { /* q landed: the NaN rule's check of this warp's q rows */
                const uint32_t qb = q_rows_bad<W::DQK, T>(
                    qs, [](int row, int c) { return sw128<W::ROWS>(row, c); }, warp_row0, lane);
#pragma unroll
                for (int h = 0; h < 2; h++)
                    if ((qb >> (2 * (lane / 4 + 8 * h))) & 1u) d[h] = __int_as_float(0x7fc00000);
            }
            fence_proxy_async(); /* the producer's copies, visible to wgmma */
            /* s = q k^T: K-major operands, 16 of the 512 a step. The
             * descriptors are offsets from two bases, q's made opaque at each
             * tile (mla_wgmma.cu: hoisted, q's 32 descriptors would spill o) */
            {
                const uint64_t a0 = wgmma_opaque(wgmma_desc(qs, 16, 1024));
                const uint64_t b0 = wgmma_desc(ks, 16, 1024);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < W::DQK / 16; kk++) {
                    const uint64_t a = wgmma_desc_add(a0, ((kk / 4) * W::ROWS * 64 + (kk % 4) * 16) * 2);
                    const uint64_t b = wgmma_desc_add(b0, ((kk / 4) * W::KEYS * 64 + (kk % 4) * 16) * 2);
                    wgmma_ss<W::KEYS, T>(reinterpret_cast<float(&)[W::KEYS / 2]>(s), a, b, kk > 0);
                }
                wgmma_commit();
            }
            wgmma_wait<0>();
            wgmma_hold(reinterpret_cast<float(&)[W::KEYS / 2]>(s));
            mbar_arrive(&bar.k_empty[0]);
            if (t == n_tiles - 1) mbar_arrive(&bar.q_empty); /* q is read no more */
            int set = -1;
            if (mixed_tile<W::KEYS>(p, it, t0)) { /* warpgroup 1 scanned V and marked its bad keys */
                bar_sync_any(BAR_SCANNED, W::CONSUMERS);
                set = mk % 3;
                mk++;
            }
            const bool masked = t0 + W::KEYS > it.kv_end || (p.causal && t0 + W::KEYS - 1 > warp_pos0) ||
                                (p.window_left >= 0 && t0 < (int64_t)warp_pos1 - p.window_left);
            if (tile_softmax<NT, T, true>(p, s, masked, t0, row_pos0, row_pos1, it.kv_end,
                                          set >= 0 ? bad_keys[set] : NULL, m, d, f))
                scale_rows(o, f);
            uint32_t pa[W::KEYS / 16][4];
            pack_p<NT, T>(s, pa);
            /* P and the factors to warpgroup 1, once it has read the last P */
            if (gt > 0) bar_sync_any(BAR_P_FREE, W::CONSUMERS);
#pragma unroll
            for (int k = 0; k < W::KEYS / 16; k++) {
                T *row0 = ps + r * W::PSTRIDE + k * 16 + (lane % 4) * 2, *row1 = row0 + 8 * W::PSTRIDE;
                *(uint32_t *)row0 = pa[k][0];
                *(uint32_t *)row1 = pa[k][1];
                *(uint32_t *)(row0 + 8) = pa[k][2];
                *(uint32_t *)(row1 + 8) = pa[k][3];
            }
            if (lane % 4 == 0) {
                fs[r] = f[0];
                fs[r + 8] = f[1];
            }
            bar_sync_any(BAR_P_READY, W::CONSUMERS);
            mbar_wait(&bar.v_full[0], gt & 1);
            fence_proxy_async();
            issue_pv<W::HALF, W::KEYS, T>(o, pa, vs); /* o[:, 0:256]: V's column blocks 0 to 3 */
            wgmma_wait<0>();
            wgmma_hold(reinterpret_cast<float(&)[W::HALF / 2]>(o));
            mbar_arrive(&bar.v_empty[0]);
        }
        if (n_tiles == 0) mbar_arrive(&bar.q_empty);
        g += n_tiles;

        /* the rows' final state: this half's NaN-rule sums, then the other's */
        add_bad_o(o, d);
        float inv[2], lse[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            d[h] += __shfl_xor_sync(0xffffffffu, d[h], 1);
            d[h] += __shfl_xor_sync(0xffffffffu, d[h], 2);
        }
        bar_sync_any(BAR_BAD_READY, W::CONSUMERS);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = r + 8 * h, i = row / hb, gi = row - i * hb;
            d[h] += bad_s[row];
            finish_row(p, head0 + min(gi, heads - 1), it.out >= 0, m[h], d[h], inv[h], lse[h]);
            if (lane % 4 == 0) {
                inv_s[row] = inv[h];
                if (i < it.ntok && gi < heads) {
                    if (it.out < 0) {
                        if (p.lse) p.lse[(int64_t)(it.tok0 + i) * p.lse_stride_tok + head0 + gi] = lse[h];
                    } else {
                        p.lse_tmp[(int64_t)(it.out + i) * p.num_qo_heads + head0 + gi] = lse[h];
                    }
                }
            }
        }
        bar_sync_any(BAR_INV_READY, W::CONSUMERS);
        wide_store<T>(p, it, o, 0, head0, hb, heads, r, inv);
    }
    if (g > 0) bar_sync_any(BAR_P_FREE, W::CONSUMERS); /* pairs with warpgroup 1's last */
}

/* Warpgroup 1: a mixed tile's V scan, and the second half of o with the P
 * and factors warpgroup 0 shares. */
template <typename T>
__device__ __forceinline__ void wide_values(const attn_params &p, T *stages, const T *ps, const float *fs,
                                            float *bad_s, const float *inv_s, ws_barriers<wide_wg::STAGES> &bar,
                                            uint32_t (*bad_keys)[wide_wg::KEYS / 32])
{
    typedef wide_wg W;
    const int tid = threadIdx.x % 128, lane = threadIdx.x % 32, warp = tid / 32;
    const int r = warp * 16 + lane / 4;
    const int num_items = p.head->counts[COUNT_PREFILL];
    T *vs = stages + W::KEYS * W::DP;
    int g = 0, mk = 0;
    for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
        const prefill_item it = p.pitems[w];
        if (it.ntok == 0) continue;
        const item_heads ih = heads_of(p, it);
        const int head0 = ih.head0, heads = ih.heads, hb = p.prow_heads;
        const int n_tiles = (it.kv_end - it.kv_begin + W::KEYS - 1) / W::KEYS;
        float o[W::HALF / 8][4];
        zero(o);
        for (int t = 0; t < n_tiles; t++) {
            const int gt = g + t, t0 = it.kv_begin + t * W::KEYS;
            bool landed = false;
            if (mixed_tile<W::KEYS>(p, it, t0)) {
                /* rule 3 (attn.cuh): zero V's non-finite elements and mark
                 * their keys in set mk % 3, for warpgroup 0's softmax; the
                 * set before it (read by warpgroup 0 before this barrier) is
                 * cleared for the one after */
                mbar_wait(&bar.v_full[0], gt & 1);
                landed = true;
                scan_v_tile<W::DVO, W::DP, W::KEYS, 128>(
                    vs, [](int row, int c) { return sw128<W::KEYS>(row, c); }, bad_keys[mk % 3], tid);
                fence_proxy_async(); /* its zeros, visible to wgmma */
                bar_sync_any(BAR_SCANNED, W::CONSUMERS);
                if (tid < W::KEYS / 32) bad_keys[(mk + 2) % 3][tid] = 0;
                mk++;
            }
            if (gt > 0) bar_sync_any(BAR_P_FREE, W::CONSUMERS); /* P of the tile before is read */
            bar_sync_any(BAR_P_READY, W::CONSUMERS);
            uint32_t pa[W::KEYS / 16][4];
            const int mi = lane / 8;
#pragma unroll
            for (int k = 0; k < W::KEYS / 16; k++)
                ldmatrix_x4(pa[k], ps + (warp * 16 + (mi % 2) * 8 + lane % 8) * W::PSTRIDE + (2 * k + mi / 2) * 8);
            const float f[2] = {fs[r], fs[r + 8]};
            if (__any_sync(0xffffffffu, f[0] != 1.0f || f[1] != 1.0f)) scale_rows(o, f);
            if (!landed) mbar_wait(&bar.v_full[0], gt & 1);
            fence_proxy_async();
            issue_pv<W::HALF, W::KEYS, T>(o, pa, vs + 4 * W::KEYS * 64); /* o[:, 256:512]: blocks 4 to 7 */
            wgmma_wait<0>();
            wgmma_hold(reinterpret_cast<float(&)[W::HALF / 2]>(o));
            mbar_arrive(&bar.v_empty[0]);
        }
        g += n_tiles;
        share_bad_o(o, bad_s, r);
        bar_sync_any(BAR_BAD_READY, W::CONSUMERS);
        bar_sync_any(BAR_INV_READY, W::CONSUMERS);
        const float inv[2] = {inv_s[r], inv_s[r + 8]};
        wide_store<T>(p, it, o, 1, head0, hb, heads, r, inv);
    }
    if (g > 0) bar_sync_any(BAR_P_FREE, W::CONSUMERS); /* pairs with warpgroup 0's last */
}

template <typename T, int ADDR> __device__ __forceinline__ void prefill_wide_body(const attn_params &p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef wide_wg W;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    T *qs = (T *)(smem_raw + ((1024 - (raw & 1023)) & 1023));
    T *stages = qs + W::ROWS * W::DP;
    T *ps = stages + W::STAGES * 2 * W::KEYS * W::DP;
    float *fs = (float *)(ps + W::ROWS * W::PSTRIDE), *bad_s = fs + W::ROWS, *inv_s = bad_s + W::ROWS;
    ws_barriers<W::STAGES> &bar = *(ws_barriers<W::STAGES> *)(inv_s + W::ROWS);
    /* the NaN rule's marks of a mixed tile's bad V keys, three sets in turn
     * (written before a scan barrier, read after it, cleared after the next) */
    __shared__ uint32_t bad_keys[3][W::KEYS / 32];
    if (threadIdx.x < 3 * (W::KEYS / 32)) bad_keys[threadIdx.x / (W::KEYS / 32)][threadIdx.x % (W::KEYS / 32)] = 0;
    if (threadIdx.x == 0) {
        mbar_init(&bar.k_full[0], W::PRODUCERS);
        mbar_init(&bar.k_empty[0], 128); /* warpgroup 0 alone reads K */
        mbar_init(&bar.v_full[0], W::PRODUCERS);
        mbar_init(&bar.v_empty[0], W::CONSUMERS);
        mbar_init(&bar.q_full, W::PRODUCERS);
        mbar_init(&bar.q_empty, 128); /* and q */
    }
    __syncthreads();
    asm volatile("griddepcontrol.launch_dependents;"); /* the merge may start launching */
    const int wg = threadIdx.x / 128;
    /* No return before the griddepcontrol.wait at the end (see prefill.cu). */
    if (wg == 2) {
        setmaxnreg_dec<W::PRODUCER_REGS>();
        prefill_producer<W, T, ADDR>(p, qs, stages, bar);
    } else {
        setmaxnreg_inc<W::CONSUMER_REGS>();
        if (wg == 0) wide_scores<T>(p, qs, stages, ps, fs, bad_s, inv_s, bar, bad_keys);
        else wide_values<T>(p, stages, ps, fs, bad_s, inv_s, bar, bad_keys);
    }
    /* finish only after decode (see prefill.cu) */
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <typename T> __global__ void __launch_bounds__(384, 1) prefill_wide_kernel(const attn_params p)
{
    if (p.ragged) prefill_wide_body<T, 1>(p);
    else prefill_wide_body<T, 0>(p);
}

template <typename T> attn_kernel wide_kernel_of()
{
    const attn_kernel k = {prefill_wide_kernel<T>, wide_wg::THREADS, wide_wg::SMEM_BYTES, wide_wg::ROWS, 0};
    return k;
}

} // namespace

attn_kernel ak_cuda_prefill_wide_kernel(ak_dtype dtype)
{
#if defined(AK_WGMMA)
    if (dtype == AK_BF16) return wide_kernel_of<__nv_bfloat16>();
    if (dtype == AK_F16) return wide_kernel_of<__half>();
#else
    (void)dtype;
#endif
    const attn_kernel none = {NULL, 0, 0, 0, 0};
    return none;
}
