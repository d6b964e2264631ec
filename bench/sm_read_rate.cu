/*
 * sm_read_rate.cu - how fast N SMs read 64 MiB from the GPU's memory and check
 * it for non-finite bf16 elements, as the NaN rule's scan of K/V rows does:
 * one block an SM (its shared memory allows no second), N from 1 to every
 * SM, the L2 cold before each launch (256 MiB read between, so that no
 * dirty line is written back during it). Two ways:
 *
 *   ldg:  each thread keeps U 16-byte loads in flight (T threads a block);
 *   bulk: one thread keeps S copies of C bytes in flight into shared memory
 *         (cp.async.bulk completing on an mbarrier a stage), every thread
 *         checks a landed stage there.
 *
 * It prints each launch's time (the best of 4 after one warm-up) and GB/s,
 * of the N SMs and of one (their mean). Standalone (not part of
 * the library's build), sm_90:
 *
 *   nvcc -O3 -arch=sm_90a -o sm_read_rate bench/sm_read_rate.cu && ./sm_read_rate
 */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(x)                                                                                                    \
    do {                                                                                                            \
        cudaError_t e_ = (x);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                    \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                                                \
            exit(1);                                                                                                \
        }                                                                                                           \
    } while (0)

/* non-zero when a bf16 of the chunk has an all-ones exponent (NaN, infinity) */
__device__ __forceinline__ uint32_t nonfinite_bf16x8(uint4 x)
{
    const uint32_t e = 0x7f807f80u;
    return __vcmpeq2(x.x & e, e) | __vcmpeq2(x.y & e, e) | __vcmpeq2(x.z & e, e) | __vcmpeq2(x.w & e, e);
}

/* block b reads the b-th of gridDim.x equal parts */
template <int U> __global__ void __launch_bounds__(1024) ldg_read(const uint4 *src, size_t chunks, uint32_t *bad_out)
{
    const size_t per = (chunks + gridDim.x - 1) / gridDim.x;
    const size_t b0 = blockIdx.x * per, b1 = b0 + per < chunks ? b0 + per : chunks;
    uint32_t bad = 0;
    for (size_t i = b0 + threadIdx.x; i < b1; i += (size_t)blockDim.x * U) {
        uint4 x[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const size_t j = i + (size_t)u * blockDim.x;
            x[u] = j < b1 ? __ldg(src + j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) bad |= nonfinite_bf16x8(x[u]);
    }
    if (bad) atomicOr(bad_out, 1u);
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* stage c % S of chunk c (C bytes, the last may be shorter) */
__device__ __forceinline__ void bulk_issue(uint8_t *stage, const uint8_t *src, uint32_t bytes, uint64_t *full)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(full)), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(stage)),
                 "l"(src), "r"(bytes), "r"(smem_addr(full))
                 : "memory");
}

__global__ void bulk_read(const uint8_t *src, size_t bytes, int S, int C, uint32_t *bad_out)
{
    extern __shared__ __align__(128) uint8_t sm[];
    uint64_t *full = (uint64_t *)(sm + (size_t)S * C);
    /* whole copies dealt evenly: block b takes copies [c0, c1) */
    const size_t copies = (bytes + C - 1) / C;
    const size_t c0 = blockIdx.x * copies / gridDim.x, c1 = (blockIdx.x + 1) * copies / gridDim.x;
    const size_t b0 = c0 * C, b1 = c1 * C < bytes ? c1 * C : bytes;
    const int n = (int)(c1 - c0);
    auto len = [&](int c) { return (uint32_t)(b1 - (b0 + (size_t)c * C) < (size_t)C ? b1 - (b0 + (size_t)c * C) : C); };
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&full[s])));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int c = 0; c < S && c < n; c++) bulk_issue(sm + (size_t)c * C, src + b0 + (size_t)c * C, len(c), &full[c]);
    uint32_t bad = 0;
    for (int c = 0; c < n; c++) {
        const int s = c % S;
        uint32_t done = 0;
        while (!done)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done)
                         : "r"(smem_addr(&full[s])), "r"((c / S) & 1)
                         : "memory");
        const uint4 *p = (const uint4 *)(sm + (size_t)s * C);
        for (uint32_t i = threadIdx.x; i < len(c) / 16; i += blockDim.x) bad |= nonfinite_bf16x8(p[i]);
        __syncthreads(); /* the stage read before it is refilled */
        if (threadIdx.x == 0 && c + S < n)
            bulk_issue(sm + (size_t)s * C, src + b0 + (size_t)(c + S) * C, len(c + S), &full[s]);
    }
    if (bad) atomicOr(bad_out, 1u);
}

int main()
{
    const size_t bytes = (size_t)64 << 20; /* 64 MiB: K and V of 32/8 heads, d128, 16 x 1024 tokens, bf16 */
    const size_t flush_bytes = (size_t)256 << 20;
    uint8_t *pool, *flush;
    uint32_t *bad;
    CHECK(cudaMalloc(&pool, bytes));
    CHECK(cudaMalloc(&flush, flush_bytes));
    CHECK(cudaMalloc(&bad, sizeof(uint32_t)));
    CHECK(cudaMemset(pool, 0x3c, bytes)); /* bf16 0x3c3c, about 0.0115: finite */
    CHECK(cudaMemset(bad, 0, sizeof(uint32_t)));
    CHECK(cudaMemset(flush, 0, flush_bytes));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int ldg_smem = 200 << 10; /* one block an SM */
    CHECK(cudaFuncSetAttribute(ldg_read<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, ldg_smem));
    CHECK(cudaFuncSetAttribute(ldg_read<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, ldg_smem));
    CHECK(cudaFuncSetAttribute(bulk_read, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 << 10));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    struct way {
        const char *name;
        int kind, threads, s, c; /* kind 0: ldg U8, 1: ldg U16, 2: bulk S x C */
    } ways[] = {{"ldg, U 8, 384 threads", 0, 384, 0, 0},     {"ldg, U 16, 384 threads", 1, 384, 0, 0},
                {"ldg, U 8, 1024 threads", 0, 1024, 0, 0},   {"bulk, 12 x 16 KB, 384 threads", 2, 384, 12, 16384},
                {"bulk, 6 x 32 KB, 384 threads", 2, 384, 6, 32768}, {"bulk, 24 x 8 KB, 384 threads", 2, 384, 24, 8192}};
    int counts[] = {1, 2, 4, 8, 16, 24, 32, 48, 66, 132, 0};
    counts[10] = sms != 132 ? sms : 0; /* (every SM, where there are not 132) */
    printf("%d SMs, %zu MiB\n%-32s %5s %10s %10s %12s\n", sms, bytes >> 20, "way", "SMs", "us", "GB/s", "GB/s an SM");
    for (const way &w : ways)
        for (int n : counts) {
            if (n == 0 || n > sms) continue;
            float best = 1e30f;
            for (int rep = 0; rep < 5; rep++) {
                ldg_read<8><<<sms, 1024, ldg_smem>>>((const uint4 *)flush, flush_bytes / 16, bad); /* the L2 cold */
                CHECK(cudaEventRecord(e0));
                if (w.kind == 0) ldg_read<8><<<n, w.threads, ldg_smem>>>((const uint4 *)pool, bytes / 16, bad);
                else if (w.kind == 1) ldg_read<16><<<n, w.threads, ldg_smem>>>((const uint4 *)pool, bytes / 16, bad);
                else bulk_read<<<n, w.threads, (size_t)w.s * w.c + 8 * (size_t)w.s>>>(pool, bytes, w.s, w.c, bad);
                CHECK(cudaGetLastError());
                CHECK(cudaEventRecord(e1));
                CHECK(cudaEventSynchronize(e1));
                float ms = 0.0f;
                CHECK(cudaEventElapsedTime(&ms, e0, e1));
                if (rep > 0 && ms < best) best = ms; /* (the first warms up) */
            }
            const double us = best * 1e3, gbs = (double)bytes / (us * 1e3);
            printf("%-32s %5d %10.1f %10.1f %12.1f\n", w.name, n, us, gbs, gbs / n);
        }
    uint32_t found = 1;
    CHECK(cudaMemcpy(&found, bad, sizeof found, cudaMemcpyDeviceToHost));
    printf("non-finite found: %u (0 expected)\n", found);
    return found != 0;
}
