/*
 * merge.cu - combines the split-KV partial states of each split query token
 * into its output row: o = sum_i w_i o_i, lse = log sum_i exp(lse_i), w_i =
 * exp(lse_i - lse) (softmax_state.h's algebra). A thread block serves one query head
 * (grid.y) and loops over the plan's merge tasks (one per split token); a
 * token that was not split has no task and was written by its kernel.
 *
 * Measured on an H200 for one request split 33 ways (B=1, kv_len 4096): the
 * first version walked the partials one dependent load after another (17 us,
 * longer than the decode); a warp-parallel LSE and unrolled loads gave 7.7 us.
 * Now groups of threads split the partials too (each group owns every dim, 4
 * per thread), so the loads of a block are all in flight at once, and the
 * kernel is launched as a programmatic dependent of the kernel before it
 * (decode or prefill) on sm_90; prefill waits for decode before it exits, so
 * waiting for the kernel before is waiting for both.
 */
#include "attn.cuh"

/* LANES threads cover the D dims (4 each); GROUPS groups of them split the
 * partials and add their sums in shared memory. */
template <int D> struct merge_traits {
    static constexpr int THREADS = 128;
    static constexpr int LANES = D / 4;
    static constexpr int GROUPS = THREADS / LANES;
    static_assert(THREADS % LANES == 0 && LANES <= THREADS, "dims must tile the block");
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

template <int D, typename T> __global__ void __launch_bounds__(merge_traits<D>::THREADS) merge_kernel(const attn_params p)
{
    typedef merge_traits<D> tr;
    extern __shared__ float weight[];            /* [max_splits] */
    __shared__ float4 group_sum[tr::GROUPS][tr::LANES];
#if __CUDA_ARCH__ >= 900
    /* launched early as a programmatic dependent: wait for the kernels before */
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    const int head = blockIdx.y;
    const int num_tasks = p.counts[COUNT_MERGE];
    const int group = threadIdx.x / tr::LANES, lane = threadIdx.x % tr::LANES;
    for (int t = blockIdx.x; t < num_tasks; t += gridDim.x) {
        const merge_task task = p.tasks[t];
        const int n = task.n;
        const int64_t step = (int64_t)task.stride * p.num_qo_heads; /* between partial rows */
        const float *lse_part = p.lse_tmp + (int64_t)task.first * p.num_qo_heads + head;
        __syncthreads(); /* the previous task is done with weight[] and group_sum */
        /* lse = log sum exp(lse_i), by the first warp: max, then the scaled sum */
        if (threadIdx.x < 32) {
            float mx = -INFINITY;
            for (int i = threadIdx.x; i < n; i += 32) mx = fmaxf(mx, lse_part[i * step]);
            mx = warp_max(mx);
            float sum = 0.0f;
            for (int i = threadIdx.x; i < n; i += 32) {
                const float l = lse_part[i * step];
                weight[i] = l == -INFINITY ? 0.0f : __expf(l - mx);
                sum += weight[i];
            }
            sum = warp_sum(sum);
            const float lse = sum > 0.0f ? mx + __logf(sum) : -INFINITY;
            const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
            for (int i = threadIdx.x; i < n; i += 32) weight[i] *= inv; /* w_i = exp(lse_i - lse) */
            if (threadIdx.x == 0 && p.lse) p.lse[task.tok * p.lse_stride_tok + head] = lse;
        }
        __syncthreads();
        /* every partial slot was written in this run (empty parts as zeros),
         * so no slot can poison the sum */
        const float *o_part = p.o_tmp + ((int64_t)task.first * p.num_qo_heads + head) * D + lane * 4;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
        for (int i = group; i < n; i += tr::GROUPS) {
            const float w = weight[i];
            const float4 v = *(const float4 *)(o_part + i * step * D);
            acc.x += w * v.x;
            acc.y += w * v.y;
            acc.z += w * v.z;
            acc.w += w * v.w;
        }
        group_sum[group][lane] = acc;
        __syncthreads();
        if (group == 0) {
#pragma unroll
            for (int g = 1; g < tr::GROUPS; g++) {
                const float4 v = group_sum[g][lane];
                acc.x += v.x;
                acc.y += v.y;
                acc.z += v.z;
                acc.w += v.w;
            }
            T *dst = (T *)p.o + task.tok * p.o_stride_tok + head * p.o_stride_head + lane * 4;
            *(uint2 *)dst = make_uint2(dtype_traits<T>::pack(acc.x, acc.y), dtype_traits<T>::pack(acc.z, acc.w));
        }
    }
}

template <int D, typename T> static ak_status launch_dim(const attn_params *p, int ctas, int pdl, cudaStream_t stream)
{
    return launch_kernel(merge_kernel<D, T>, dim3(ctas, p->num_qo_heads), merge_traits<D>::THREADS,
                         (int)(sizeof(float) * (size_t)p->max_splits), pdl, stream, *p);
}

template <typename T>
static ak_status launch(const attn_params *p, int head_dim, int ctas, int pdl, cudaStream_t stream)
{
    switch (head_dim) {
    case 64: return launch_dim<64, T>(p, ctas, pdl, stream);
    case 128: return launch_dim<128, T>(p, ctas, pdl, stream);
    case 256: return launch_dim<256, T>(p, ctas, pdl, stream);
    }
    return ak_set_error(AK_ERR_INTERNAL, "no merge kernel for head_dim %d", head_dim);
}

ak_status ak_cuda_merge_launch(const attn_params *p, int head_dim, ak_dtype dtype, int ctas, int pdl,
                               cudaStream_t stream)
{
    return dtype == AK_F16 ? launch<__half>(p, head_dim, ctas, pdl, stream)
                           : launch<__nv_bfloat16>(p, head_dim, ctas, pdl, stream);
}
