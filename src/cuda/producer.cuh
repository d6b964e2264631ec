/*
 * producer.cuh - the copies of a producer warpgroup (the warp-specialized
 * kernels prefill_wgmma.cu and mla_wgmma.cu): a tile of K/V rows through the
 * block table (or the ragged rows) into a stage of wgmma.cuh's swizzled
 * layout, with cp.async, from a warpgroup that holds few registers.
 */
#ifndef AK_CUDA_PRODUCER_CUH
#define AK_CUDA_PRODUCER_CUH

#include "attn.cuh"

/* The producer's copies of a tile: TPR threads a key row, each every TPR-th
 * 16-byte chunk of it, so a thread's copies of a row differ only by
 * immediate offsets (the swizzle of chunk TPR j + q is the thread's base XOR
 * a constant): a block lookup a row, one instruction a copy. load_kv_tile
 * (one chunk a thread, rows strided over the threads, a lookup per copy)
 * made a producer at its registers the kernel's bottleneck. */
template <int DP, int KEYS, int THREADS> struct producer_rows {
    /* measured (H100, 4 x 4096): 2 at DP 64 (32-byte runs of a row), 4
     * above (64 bytes); 8 (128 bytes, more rows a thread) was slower at
     * each, 2 at DP 128 and 256 by 10% and 25% */
    static constexpr int TPR = DP <= 64 ? 2 : 4;
    static constexpr int N = KEYS * TPR / THREADS; /* rows a thread copies */
    int32_t block[N];
};

template <int DP, int KEYS, int THREADS, int ADDR>
__device__ __forceinline__ void tile_blocks(const attn_params &p, const int32_t *table, int page_base, int t0,
                                            int kv_end, producer_rows<DP, KEYS, THREADS> &r)
{
    constexpr int TPR = producer_rows<DP, KEYS, THREADS>::TPR;
    const int tid = threadIdx.x % THREADS;
#pragma unroll
    for (int i = 0; i < r.N; i++) {
        int slot;
        r.block[i] = (int32_t)kv_block_of<ADDR>(p, table, page_base,
                                               min(t0 + tid / TPR + i * (THREADS / TPR), kv_end - 1), slot);
    }
}

/* Keys [t0, t0 + KEYS) of K (V_: of V) into a stage, in wgmma.cuh's layout
 * (sw128<KEYS>: DP / 64 column blocks of KEYS rows), from the blocks of r;
 * keys from kv_end on are zero-filled (no read). Only the 16-byte chunks
 * [C0, C1) of each row (multiples of TPR): a caller that signals column
 * blocks one by one copies a block a call. */
template <int D, int DP, int KEYS, int THREADS, bool V_, typename T, int C0 = 0, int C1 = DP / 8>
__device__ __forceinline__ void producer_copy(const attn_params &p, const producer_rows<DP, KEYS, THREADS> &r,
                                              int kv_head, int t0, int kv_end, T *dst)
{
    constexpr int CHUNKS = DP / 8, TPR = producer_rows<DP, KEYS, THREADS>::TPR;
    static_assert(r.N >= 1 && TPR <= 8 && CHUNKS % TPR == 0, "TPR threads a row");
    static_assert(C0 % TPR == 0 && C1 % TPR == 0 && 0 <= C0 && C0 < C1 && C1 <= CHUNKS, "whole chunks of TPR");
    const int tid = threadIdx.x % THREADS, q = tid % TPR;
#pragma unroll
    for (int i = 0; i < r.N; i++) {
        const int row = tid / TPR + i * (THREADS / TPR);
        int slot;
        kv_page_of(p, min(t0 + row, kv_end - 1), slot);
        const int64_t block = r.block[i];
        const T *src = V_ ? (const T *)p.v_pool + block * p.v_block_stride + (int64_t)slot * p.v_stride_slot +
                                (int64_t)kv_head * p.v_stride_head + q * 8
                          : (const T *)p.k_pool + block * p.k_block_stride + (int64_t)slot * p.k_stride_slot +
                                (int64_t)kv_head * p.k_stride_head + q * 8;
        const int bytes = t0 + row < kv_end ? 16 : 0;
        const int base = row * 64 + ((q ^ (row & 7)) << 3); /* chunk q's element offset */
#pragma unroll
        for (int j = C0 / TPR; j < C1 / TPR; j++) /* chunk TPR j + q: column block of 8, slot (c % 8) ^ (row % 8) */
            if ((D / 8) % TPR == 0 ? TPR * j < D / 8 : TPR * j + q < D / 8)
                cp_async_16(dst + (TPR * j / 8) * (KEYS * 64) + (base ^ ((TPR * j % 8) << 3)), src + TPR * j * 8,
                            bytes);
    }
}

#endif /* AK_CUDA_PRODUCER_CUH */
