/*
 * common.cuh - what every CUDA file shares: error checking, dtype traits,
 * vector loads, and (for the tensor-core kernels) mma/ldmatrix/cp.async wrappers.
 */
#ifndef AK_CUDA_COMMON_CUH
#define AK_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "internal.h"

/* Records the failing expression, file and line, and returns AK_ERR_CUDA. */
#define AK_CUDA_TRY(expr)                                                      \
    do {                                                                       \
        cudaError_t ak_cuda_e_ = (expr);                                       \
        if (ak_cuda_e_ != cudaSuccess)                                         \
            return ak_set_error(AK_ERR_CUDA, "%s failed at %s:%d: %s", #expr,  \
                                __FILE__, __LINE__, cudaGetErrorString(ak_cuda_e_)); \
    } while (0)

/* After a launch: configuration errors surface here, without a sync. */
#define AK_CUDA_CHECK_LAUNCH() AK_CUDA_TRY(cudaGetLastError())

static inline cudaStream_t ak_cuda_stream(ak_stream s) { return (cudaStream_t)s; }

/* ---- dtype traits --------------------------------------------------------- */

/* The 16-bit element types the kernels are instantiated for, with the
 * conversions and the packed-pair type mma.sync consumes. */
template <typename T> struct dtype_traits;

template <> struct dtype_traits<__half> {
    typedef __half2 pair;
    static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t u)
    {
        return __half22float2(*reinterpret_cast<__half2 *>(&u));
    }
};

template <> struct dtype_traits<__nv_bfloat16> {
    typedef __nv_bfloat162 pair;
    static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t u)
    {
        return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u));
    }
};

/* ---- asynchronous copies (sm80+) ------------------------------------------- */

/* 16 bytes global -> shared, bypassing L1. src_bytes = 0 zero-fills the
 * destination without reading the source (used for rows past the end). */
__device__ __forceinline__ void cp_async_16(void *smem, const void *gmem, int src_bytes)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}

/* An L2 policy for bytes a kernel reads once (a decode's K/V rows: no other
 * block of the step reads them): their lines go first when L2 needs room,
 * so what is read again (split-KV partials, q, the block table, a second
 * row tile's latent rows) stays. Measured (H100, graphs, bf16): decode
 * llama3-70b-tp8 64 x 4096 56.3 -> 54.8 us, qwen2.5-7b 1 x 32768 32.2 ->
 * 31.3, llama3-8b 1 x 32768 54.7 -> 53.9, the rest the same; MLA (TMA, page
 * 64) 16 heads 64 x 8192 228.4 -> 219.9 us, 128 x 4096 225.9 -> 215.3, 1 x
 * 32768 37.9 -> 32.4, 128 heads 1 x 32768 50.7 -> 42.0, 64 x 8192 2-3%.
 * A pure function of nothing: the compiler may hoist it. */
__device__ __forceinline__ uint64_t l2_evict_first()
{
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    return pol;
}

/* cp_async_16 with an L2 policy (l2_evict_first) */
__device__ __forceinline__ void cp_async_16_pol(void *smem, const void *gmem, int src_bytes, uint64_t pol)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes), "l"(pol));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/* Waits until at most N groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); /* shared-memory reads stay after it */
}

/* ---- tensor cores ------------------------------------------------------------ */

/* Four 8x8 matrices of 16-bit elements from shared memory; lane i gives the
 * address of row i % 8 of matrix i / 8. */
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *smem)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* The same, each matrix transposed (for a B operand stored k-major). */
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *smem)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* D = A * B + D, m16n8k16, fp32 accumulate. A: 4 regs (row-major 16x16),
 * B: 2 regs (col-major 16x8), D: 4 floats. */
template <typename T> __device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]);

template <> __device__ __forceinline__ void mma_16816<__half>(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* ---- swizzled shared-memory tiles ---------------------------------------------- */

/* A tile of rows of D 16-bit elements, stored as 16-byte chunks with chunk c of
 * row r at position c ^ (r % 8): eight consecutive rows read at the same
 * logical chunk hit eight different bank groups, for cp.async stores,
 * ldmatrix and per-row vector loads alike. Needs D >= 64. */
template <int D> __device__ __forceinline__ int swz(int row, int chunk)
{
    return row * D + ((chunk ^ (row & 7)) << 3);
}

#endif /* AK_CUDA_COMMON_CUH */
