/*
 * wgmma.cuh - Hopper warpgroup MMA (wgmma.mma_async, sm_90a only) for
 * prefill_wgmma.cu: shared-memory matrix descriptors of the 128-byte swizzled
 * layout, the fences, and the MMA wrappers (generated: wgmma_ops.inc).
 *
 * The one shared-memory layout used (for Q, K and V alike): a tile of R rows
 * of D 16-bit elements is stored as D / 64 column blocks, each R rows of 128
 * bytes (64 elements); 16-byte chunk c of row r sits at chunk (c ^ r % 8) of
 * its row. That is the hardware's 128-byte swizzle (byte address bits 4-6
 * XOR bits 7-9) when a block starts on a 1024-byte boundary, so the same
 * bytes serve as a K-major operand (rows = M or N, 64 K-elements a row: Q
 * and K) and as an MN-major one (rows = K, 64 N-elements a row: V).
 */
#ifndef AK_CUDA_WGMMA_CUH
#define AK_CUDA_WGMMA_CUH

#include "attn.cuh"
#include "common.cuh"

/* Element offset of chunk c (8 elements) of row r in a tile of R rows. */
template <int R> __device__ __forceinline__ int sw128(int r, int c)
{
    return (c >> 3) * (R * 64) + r * 64 + (((c & 7) ^ (r & 7)) << 3);
}

/* A descriptor of a 128-byte-swizzled operand at smem: lbo (bytes) is the
 * distance between 64-element column blocks of an MN-major operand (unused
 * K-major), sbo the distance between groups of 8 rows. */
__device__ __forceinline__ uint64_t wgmma_desc(const void *smem, uint32_t lbo, uint32_t sbo)
{
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(smem);
    uint64_t d = (uint64_t)((addr & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo >> 4) & 0x3FFF) << 16;
    d |= (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
    d |= (uint64_t)1 << 62; /* 128-byte swizzle */
    return d;
}

/* The descriptor of the operand `bytes` further on than desc's (the
 * address field counts 16 bytes; a block's shared memory never carries out
 * of it). */
__device__ __forceinline__ uint64_t wgmma_desc_add(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

/* desc, as a value the compiler cannot see through: descriptors derived
 * from it are computed where they are used, not hoisted out of a loop
 * (where they would hold registers across it). */
__device__ __forceinline__ uint64_t wgmma_opaque(uint64_t desc)
{
    asm volatile("" : "+l"(desc));
    return desc;
}

/* Orders this thread's earlier register writes (accumulators, A operands)
 * before the wgmma that follow. */
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* Waits until at most N committed groups are in flight. */
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Keeps the compiler from moving reads or writes of an accumulator across
 * a wgmma wait (it does not know the asynchronous MMA writes it). */
template <int R> __device__ __forceinline__ void wgmma_hold(float (&d)[R])
{
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* Makes this thread's generic-proxy writes to shared memory (cp.async, plain
 * stores) visible to the async proxy that wgmma reads through; a barrier
 * after it publishes them to the other threads. */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* ---- shared-memory barriers (mbarrier) and named barriers ---- */

__device__ __forceinline__ void mbar_init(uint64_t *bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar)),
                 "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar))
                 : "memory");
}
/* count arrivals at once (one thread for a warpgroup) */
__device__ __forceinline__ void mbar_arrive_n(uint64_t *bar, uint32_t count)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar)),
                 "r"(count)
                 : "memory");
}
/* Arrives on bar once every cp.async this thread issued so far has landed. */
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t *bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(bar))
                 : "memory");
}
/* Arrives on bar and adds bytes to the transaction count its phase waits
 * for (the TMA copies that complete on it). */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(bar)),
                 "r"(bytes)
                 : "memory");
}
/* A TMA copy of the box at (c0, c1, c2) of the tensor map (a
 * __grid_constant__ parameter's address) into shared memory at dst,
 * completing its bytes on bar. */
__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, int c0, int c1, int c2, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                 "%3, %4}], [%5];\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"((uint32_t)__cvta_generic_to_shared(bar))
                 : "memory");
}
/* tma_load_3d with an L2 policy (common.cuh's l2_evict_first) */
__device__ __forceinline__ void tma_load_3d_pol(void *dst, const CUtensorMap *map, int c0, int c1, int c2,
                                                uint64_t *bar, uint64_t pol)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint "
                 "[%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"((uint32_t)__cvta_generic_to_shared(bar)), "l"(pol)
                 : "memory");
}
/* The same for a 4-dimensional map. */
__device__ __forceinline__ void tma_load_4d(void *dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                            uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                 "%3, %4, %5}], [%6];\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"((uint32_t)__cvta_generic_to_shared(bar))
                 : "memory");
}
/* A box of a 3-dimensional map from src (shared memory, the map's swizzle)
 * to global memory, in this thread's bulk group (elements outside the map
 * are not written); bulk_commit closes the group, bulk_wait_read waits until
 * this thread's groups have read their shared memory, bulk_wait until they
 * are done. src's generic writes need fence_proxy_async first. */
__device__ __forceinline__ void tma_store_3d(const CUtensorMap *map, int c0, int c1, int c2, const void *src)
{
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(map),
                 "r"(c0), "r"(c1), "r"(c2), "r"((uint32_t)__cvta_generic_to_shared(src))
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
/* Waits until the phase of bar with this parity has completed. (With a
 * suspend-time hint on try_wait, as CUTLASS's barriers have, the prefill
 * was up to 7% slower: BENCHMARKS.md.) */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, int parity)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(bar);
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}
/* Both barriers' phases complete: their first tests issued together (one
 * round trip where both have), then each polled as mbar_wait. */
__device__ __forceinline__ void mbar_wait2(uint64_t *bar0, int parity0, uint64_t *bar1, int parity1)
{
    const uint32_t a0 = (uint32_t)__cvta_generic_to_shared(bar0), a1 = (uint32_t)__cvta_generic_to_shared(bar1);
    uint32_t d0, d1;
    asm volatile("{\n.reg .pred p, q;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%2], %3;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 q, [%4], %5;\nselp.u32 %0, 1, 0, p;\nselp.u32 %1, 1, 0, q;\n}\n"
                 : "=r"(d0), "=r"(d1)
                 : "r"(a0), "r"(parity0), "r"(a1), "r"(parity1)
                 : "memory");
    if (!d0) mbar_wait(bar0, parity0);
    if (!d1) mbar_wait(bar1, parity1);
}
/* Named barrier `id` (1..15) over `threads` threads: sync waits, arrive
 * does not. */
__device__ __forceinline__ void bar_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/* The same without .aligned: for a barrier its threads reach from different
 * instructions (bar.sync is barrier.sync.aligned, which requires one
 * instruction for all; compute-sanitizer's synccheck reports the others as
 * divergence). */
__device__ __forceinline__ void bar_sync_any(int id, int threads)
{
    asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* Moves registers between the warpgroups of a block (each warp of the
 * warpgroup runs it): dec gives up all but N a thread, inc waits for N. */
template <int N> __device__ __forceinline__ void setmaxnreg_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <int N, typename T>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d);
template <int N, typename T>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b);

#include "wgmma_ops.inc"

/* ---- fragments of the attention kernels (prefill_wgmma.cu, prefill_wide.cu, mla_wgmma.cu) ---- */

/* P (in s, f32) as the A operand of P.V. The accumulator layout of S is the
 * A-register layout: n tiles 2k and 2k + 1 are k step k. Done only once no
 * P.V is in flight: the compiler may give the new P the registers of the one
 * an unfinished wgmma still reads, and ptxas then serialises every wgmma. */
template <int NT, typename T>
__device__ __forceinline__ void pack_p(const float (&s)[NT][4], uint32_t (&pa)[NT / 2][4])
{
#pragma unroll
    for (int n = 0; n < NT; n++) {
        pa[n / 2][(n % 2) * 2] = dtype_traits<T>::pack(s[n][0], s[n][1]);
        pa[n / 2][(n % 2) * 2 + 1] = dtype_traits<T>::pack(s[n][2], s[n][3]);
    }
}

/* o's two rows a thread times their factors f. */
template <int DN> __device__ __forceinline__ void scale_rows(float (&o)[DN][4], const float (&f)[2])
{
#pragma unroll
    for (int n = 0; n < DN; n++) {
        o[n][0] *= f[0];
        o[n][1] *= f[0];
        o[n][2] *= f[1];
        o[n][3] *= f[1];
    }
}

/* o += P . V of one K/V stage: V MN-major, 16 keys (two 8-row groups) a
 * step, N = DVN columns. */
template <int DVN, int KEYS, typename T>
__device__ __forceinline__ void issue_pv(float (&o)[DVN / 8][4], const uint32_t (&pa)[KEYS / 16][4], const T *vs)
{
    wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < KEYS / 16; kb++)
        wgmma_rs<DVN, T>(reinterpret_cast<float(&)[DVN / 2]>(o), pa[kb],
                         wgmma_desc(vs + kb * 16 * 64, KEYS * 128, 1024));
    wgmma_commit();
}

template <int N> __device__ __forceinline__ void zero(float (&o)[N][4])
{
#pragma unroll
    for (int n = 0; n < N; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
}

/* The NaN rule on an accumulator (o, or raw scores; attn.cuh): this
 * thread's part of its two rows, added to bad. */
template <int N> __device__ __forceinline__ void add_bad_o(const float (&o)[N][4], float (&bad)[2])
{
#pragma unroll
    for (int n = 0; n < N; n++) {
        add_bad(bad[0], o[n][0]);
        add_bad(bad[0], o[n][1]);
        add_bad(bad[1], o[n][2]);
        add_bad(bad[1], o[n][3]);
    }
}

/* The NaN rule on the columns of o a warpgroup holds: the sums of its rows r
 * and r + 8 over the thread's quad, into bad_s[r] and bad_s[r + 8] (for
 * the warpgroup that finishes the rows to add). */
template <int N> __device__ __forceinline__ void share_bad_o(const float (&o)[N][4], float *bad_s, int r)
{
    float bad[2] = {0.0f, 0.0f};
    add_bad_o(o, bad);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        bad[h] += __shfl_xor_sync(0xffffffffu, bad[h], 1);
        bad[h] += __shfl_xor_sync(0xffffffffu, bad[h], 2);
    }
    if (threadIdx.x % 4 == 0) {
        bad_s[r] = bad[0];
        bad_s[r + 8] = bad[1];
    }
}

/* This thread's columns of o (half h of a DVO-wide row) in its rows r and
 * r + 8, scaled by inv: the output rows, or (partial) partial slots.
 * where(row, tok, head, slot) says whether a row of the tile is a real one,
 * and its token, query head and partial slot (read only when partial). */
template <int HALF, int DVO, typename T, typename Where>
__device__ __forceinline__ void store_o_half(const attn_params &p, const float (&o)[HALF / 8][4], int h, int r,
                                             const float (&inv)[2], bool partial, Where where)
{
    const int col = h * HALF + (threadIdx.x % 4) * 2;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        int64_t tok, slot;
        int head;
        if (!where(r + 8 * e, tok, head, slot)) continue;
        if (!partial) {
            T *dst = (T *)p.o + tok * p.o_stride_tok + (int64_t)head * p.o_stride_head + col;
#pragma unroll
            for (int n = 0; n < HALF / 8; n++)
                *(uint32_t *)(dst + n * 8) = dtype_traits<T>::pack(o[n][2 * e] * inv[e], o[n][2 * e + 1] * inv[e]);
        } else {
            float *dst = p.o_tmp + (slot * p.num_qo_heads + head) * DVO + col;
#pragma unroll
            for (int n = 0; n < HALF / 8; n++)
                *(float2 *)(dst + n * 8) = make_float2(o[n][2 * e] * inv[e], o[n][2 * e + 1] * inv[e]);
        }
    }
}

#endif /* AK_CUDA_WGMMA_CUH */
