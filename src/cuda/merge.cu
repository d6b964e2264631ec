/*
 * merge.cu - combines the split-KV partial states of each request into its
 * output row: o = sum_i w_i o_i, lse = log sum_i exp(lse_i), w_i = exp(lse_i -
 * lse) (softmax_state.h). One thread block per (request, query head); a
 * request that was not split has no partial rows and was written by decode.
 *
 * The first version walked the partials serially, one dependent global load
 * after another: 17 us for 33 partials (ncu, H200), longer than the decode it
 * follows. Now the LSEs are loaded in parallel and reduced with shuffles, the
 * weights sit in shared memory, and the o loads of different partials are
 * independent and unrolled.
 */
#include "decode.cuh"
#include "softmax_state.h"

/* Threads per block: D / 4 (each owns 4 output dims), at least a warp. */
template <int D> struct merge_traits {
    static constexpr int THREADS = D / 4 >= 32 ? D / 4 : 32;
};

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

template <int D, typename T> __global__ void __launch_bounds__(merge_traits<D>::THREADS) merge_kernel(const decode_params p)
{
    extern __shared__ float weight[]; /* [max_splits] */
    const int req = blockIdx.x, head = blockIdx.y;
    const int begin = p.merge_indptr[req], n = p.merge_indptr[req + 1] - begin;
    if (n < 2) return;
    const float *lse_part = p.lse_tmp + (int64_t)begin * p.num_qo_heads + head;
    /* lse = log sum exp(lse_i), by the first warp: max, then the scaled sum */
    if (threadIdx.x < 32) {
        float mx = -INFINITY;
        for (int i = threadIdx.x; i < n; i += 32) mx = fmaxf(mx, lse_part[(int64_t)i * p.num_qo_heads]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int i = threadIdx.x; i < n; i += 32) {
            const float l = lse_part[(int64_t)i * p.num_qo_heads];
            weight[i] = l == -INFINITY ? 0.0f : __expf(l - mx);
            sum += weight[i];
        }
        sum = warp_sum(sum);
        const float lse = sum > 0.0f ? mx + __logf(sum) : -INFINITY;
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int i = threadIdx.x; i < n; i += 32) weight[i] *= inv; /* w_i = exp(lse_i - lse) */
        if (threadIdx.x == 0 && p.lse) p.lse[p.qo_indptr[req] * p.lse_stride_tok + head] = lse;
    }
    __syncthreads();
    const int d0 = threadIdx.x * 4;
    if (d0 >= D) return;
    /* every partial row was written by its decode item in this run (empty
     * parts as zeros), so no row can poison the sum */
    const float *o_part = p.o_tmp + ((int64_t)begin * p.num_qo_heads + head) * D + d0;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (int i = 0; i < n; i++) {
        const float w = weight[i];
        const float4 v = *(const float4 *)(o_part + (int64_t)i * p.num_qo_heads * D);
        acc.x += w * v.x;
        acc.y += w * v.y;
        acc.z += w * v.z;
        acc.w += w * v.w;
    }
    const int tok = p.qo_indptr[req];
    T *dst = (T *)p.o + tok * p.o_stride_tok + head * p.o_stride_head + d0;
    *(uint2 *)dst = make_uint2(dtype_traits<T>::pack(acc.x, acc.y), dtype_traits<T>::pack(acc.z, acc.w));
}

template <typename T> static ak_status launch(const decode_params *p, int head_dim, cudaStream_t stream)
{
    const dim3 grid(p->num_reqs, p->num_qo_heads);
    const size_t smem = sizeof(float) * (size_t)p->max_splits;
    switch (head_dim) {
    case 64: merge_kernel<64, T><<<grid, merge_traits<64>::THREADS, smem, stream>>>(*p); break;
    case 128: merge_kernel<128, T><<<grid, merge_traits<128>::THREADS, smem, stream>>>(*p); break;
    case 256: merge_kernel<256, T><<<grid, merge_traits<256>::THREADS, smem, stream>>>(*p); break;
    default: return ak_set_error(AK_ERR_INTERNAL, "no merge kernel for head_dim %d", head_dim);
    }
    AK_CUDA_CHECK_LAUNCH();
    return AK_OK;
}

ak_status ak_cuda_merge_launch(const decode_params *p, int head_dim, ak_dtype dtype, cudaStream_t stream)
{
    if (p->num_reqs == 0) return AK_OK;
    return dtype == AK_F16 ? launch<__half>(p, head_dim, stream) : launch<__nv_bfloat16>(p, head_dim, stream);
}
