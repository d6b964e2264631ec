/*
 * merge.cu - combines the split-KV partial states of each request into its
 * output row: o = sum_i w_i o_i, lse = log sum_i exp(lse_i), w_i = exp(lse_i -
 * lse) (softmax_state.h). One thread block per (request, query head); a
 * request that was not split has no partial rows and was written by decode.
 */
#include "decode.cuh"
#include "softmax_state.h"

template <int D, typename T> __global__ void merge_kernel(const decode_params p)
{
    const int req = blockIdx.x, head = blockIdx.y;
    const int begin = p.merge_indptr[req], end = p.merge_indptr[req + 1];
    if (end - begin < 2) return;
    float lse = -INFINITY;
    for (int i = begin; i < end; i++) lse = ak_lse_add(lse, p.lse_tmp[(int64_t)i * p.num_qo_heads + head]);
    /* each thread owns 4 consecutive dims */
    const int d0 = threadIdx.x * 4;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i = begin; i < end; i++) {
        const float w = ak_lse_weight(p.lse_tmp[(int64_t)i * p.num_qo_heads + head], lse);
        if (w == 0.0f) continue; /* an empty part's row is never read */
        const float4 v = *(const float4 *)(p.o_tmp + ((int64_t)i * p.num_qo_heads + head) * D + d0);
        acc.x += w * v.x;
        acc.y += w * v.y;
        acc.z += w * v.z;
        acc.w += w * v.w;
    }
    const int tok = p.qo_indptr[req];
    T *dst = (T *)p.o + tok * p.o_stride_tok + head * p.o_stride_head + d0;
    const uint2 packed = make_uint2(dtype_traits<T>::pack(acc.x, acc.y), dtype_traits<T>::pack(acc.z, acc.w));
    *(uint2 *)dst = packed;
    if (p.lse && threadIdx.x == 0) p.lse[tok * p.lse_stride_tok + head] = lse;
}

template <typename T> static ak_status launch(const decode_params *p, int head_dim, cudaStream_t stream)
{
    const dim3 grid(p->num_reqs, p->num_qo_heads);
    switch (head_dim) {
    case 64: merge_kernel<64, T><<<grid, 16, 0, stream>>>(*p); break;
    case 128: merge_kernel<128, T><<<grid, 32, 0, stream>>>(*p); break;
    case 256: merge_kernel<256, T><<<grid, 64, 0, stream>>>(*p); break;
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
