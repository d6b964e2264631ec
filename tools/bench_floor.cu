/*
 * bench_floor.cu - the floor of a shape on the GPU: the K/V bytes a layer
 * call reads, read by a kernel that does nothing else (16-byte streaming
 * loads, four in flight a thread, a grid of four 512-thread blocks an SM),
 * optionally followed by a one-block kernel that depends on it, as a
 * split's merge depends on its decode. Both launches are programmatic
 * dependents of the kernel before them on sm_90, as the library's are, so
 * a graph of layers pays what a split-and-merge design cannot avoid: the
 * bytes, a launch, and a grid's drain before its dependent starts.
 */
extern "C" {
#include "bench_device.h"
}

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

namespace {

constexpr int FLOOR_THREADS = 512;
constexpr int FLOOR_BLOCKS_PER_SM = 4;
constexpr int FLOOR_IN_FLIGHT = 4;       /* loads a thread issues before using any */
constexpr unsigned FLOOR_MAGIC = 0x9e3779b9u; /* a sum the data never gives in practice */

__device__ __forceinline__ void dep_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void dep_launch()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__device__ __forceinline__ uint4 load_span(const uint4 *a, size_t na, const uint4 *b, size_t i)
{
    return i < na ? __ldcs(a + i) : __ldcs(b + (i - na));
}

/* Reads a[0, na) then b[0, nb) as one index space; sink is written only if
 * the XOR of everything read is FLOOR_MAGIC, so no load can be dropped. */
__global__ void __launch_bounds__(FLOOR_THREADS) floor_read(const uint4 *a, size_t na, const uint4 *b, size_t nb,
                                                            unsigned *sink)
{
    dep_launch();
    dep_wait();
    const size_t n = na + nb, stride = (size_t)gridDim.x * FLOOR_THREADS;
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * FLOOR_THREADS + threadIdx.x; i < n; i += FLOOR_IN_FLIGHT * stride) {
        uint4 v[FLOOR_IN_FLIGHT];
#pragma unroll
        for (int u = 0; u < FLOOR_IN_FLIGHT; u++) {
            const size_t j = i + u * stride;
            v[u] = j < n ? load_span(a, na, b, j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < FLOOR_IN_FLIGHT; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == FLOOR_MAGIC) sink[0] = acc;
}

/* The dependent: one block that reads what the read kernel might have
 * written, after it has finished. */
__global__ void floor_tail(unsigned *sink)
{
    dep_launch();
    dep_wait();
    if (threadIdx.x == 0 && sink[0] == FLOOR_MAGIC) sink[1] = FLOOR_MAGIC;
}

/* One launch of a floor kernel with its arguments' addresses (args), as a
 * programmatic dependent when pdl is set. */
int launch(const void *fn, int blocks, int threads, cudaStream_t s, int pdl, void **args)
{
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3(blocks);
    lc.blockDim = dim3(threads);
    lc.stream = s;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    lc.attrs = &attr;
    lc.numAttrs = pdl ? 1 : 0;
    const cudaError_t e = cudaLaunchKernelExC(&lc, fn, args);
    if (e != cudaSuccess) {
        fprintf(stderr, "attnkit-bench: floor kernel launch: %s\n", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

/* Programmatic launches as the library makes them: on sm_90+, and only
 * when the kernels were compiled for it (a build for sm_80 has no
 * griddepcontrol, so a dependent launched early would not wait). Asked
 * once, at the first enqueue (an eager one: measure_floor warms up before
 * it captures a graph); the bench uses one device. */
int floor_pdl(const bd_ctx *ctx)
{
    static int pdl = -1;
    if (pdl < 0) {
        cudaFuncAttributes fa;
        pdl = ctx->info.cc_major >= 9 && cudaFuncGetAttributes(&fa, (const void *)floor_read) == cudaSuccess &&
              fa.ptxVersion >= 90;
    }
    return pdl;
}

} // namespace

extern "C" int bd_floor_enqueue(const bd_ctx *ctx, const void *a, size_t a_bytes, const void *b, size_t b_bytes,
                                int tail, void *sink)
{
    const size_t na = a_bytes / sizeof(uint4), nb = b ? b_bytes / sizeof(uint4) : 0;
    const size_t per_block = (size_t)FLOOR_THREADS * FLOOR_IN_FLIGHT;
    const size_t most = (size_t)ctx->info.num_sms * FLOOR_BLOCKS_PER_SM;
    size_t blocks = (na + nb + per_block - 1) / per_block;
    if (blocks > most) blocks = most;
    if (blocks < 1) blocks = 1;
    cudaStream_t s = (cudaStream_t)ctx->stream;
    const int pdl = floor_pdl(ctx);
    const uint4 *pa = (const uint4 *)a, *pb = (const uint4 *)b;
    unsigned *ps = (unsigned *)sink;
    void *read_args[5] = {&pa, (void *)&na, &pb, (void *)&nb, &ps};
    if (launch((const void *)floor_read, (int)blocks, FLOOR_THREADS, s, pdl, read_args)) return -1;
    void *tail_args[1] = {&ps};
    return tail ? launch((const void *)floor_tail, 1, 32, s, pdl, tail_args) : 0;
}
