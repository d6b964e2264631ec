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
 *
 * Rows wider than 128 (192, 256, MLA's 512) are cut into slices of 128 dims
 * (64 for 192), a block each (grid.y = heads x slices): a block a whole
 * head of 512 left one split token with few blocks and few loads in flight
 * (MLA, one request split 64 ways, H200: 68.8 us before, 53.2 with slices).
 * A block keeps 128 threads, and grid.x counts by heads alone: blocks of
 * 512 threads (more groups) with grid.x divided by the slices were as fast
 * on that token and slower on many tokens split two or three ways (64
 * heads, 64 x 8192: 244 us against 192).
 */
#include "attn.cuh"

/* A block covers SLICE of the D dims (all of them up to 128, else slices
 * of 128, or of 64 for 192): LANES threads cover the slice (4 dims each) and GROUPS groups of
 * them split the partials and add their sums in shared memory. */
template <int D> struct merge_traits {
    static constexpr int SLICE = D <= 128 ? D : D % 128 == 0 ? 128 : 64;
    static constexpr int SLICES = D / SLICE;
    static constexpr int LANES = SLICE / 4;
    static constexpr int GROUPS = 128 / LANES;
    static constexpr int THREADS = GROUPS * LANES; /* 120 at D = 80: whole groups */
    static_assert(D % 4 == 0 && D % SLICE == 0 && THREADS >= 32, "dims must tile the block");
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

/* By the first warp: the task's merged LSE (natural log), written to p.lse,
 * and each partial's weight w_i = exp(lse_i - lse) into weight[]. A sink
 * (p.sinks) joins the denominator here, once: the partials were finished
 * without it. */
__device__ __forceinline__ void merge_weights(const attn_params &p, const merge_task &task, int head,
                                              const float *lse_part, int64_t step, float *weight)
{
    if (threadIdx.x >= 32) return;
    const int n = task.n;
    const float z = p.sinks ? p.sinks[head] : -INFINITY;
    float mx = z;
    for (int i = threadIdx.x; i < n; i += 32) mx = fmaxf(mx, lse_part[i * step]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += 32) {
        const float l = lse_part[i * step];
        weight[i] = l == -INFINITY ? 0.0f : __expf(l - mx);
        sum += weight[i];
    }
    sum = warp_sum(sum);
    if (p.sinks) sum += __expf(z - mx);
    /* a NaN or +inf partial LSE makes sum NaN (exp(NaN), or inf - inf), and
     * so the row (the NaN rule); only sum == 0 is "no key" */
    const float lse = sum == 0.0f ? -INFINITY : mx + __logf(sum);
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int i = threadIdx.x; i < n; i += 32) weight[i] *= inv; /* w_i = exp(lse_i - lse) */
    if (threadIdx.x == 0 && p.lse) p.lse[task.tok * p.lse_stride_tok + head] = lse;
}

/* Launched early as a programmatic dependent (sm_90): the kernel after this
 * one (the next layer's decode, a dependent too) may start launching at
 * once, and this one waits for the kernels before it. Each block reads the
 * plan's count and its first task before the wait: plan() copied them
 * before any kernel of the step, and the grid never has more blocks than
 * the plan has room for tasks. */
__device__ __forceinline__ void merge_wait()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <int D, typename T> __global__ void __launch_bounds__(merge_traits<D>::THREADS) merge_kernel(const attn_params p)
{
    typedef merge_traits<D> tr;
    extern __shared__ float weight[];            /* [max_splits] */
    __shared__ float4 group_sum[tr::GROUPS][tr::LANES];
    const int num_tasks = p.head->counts[COUNT_MERGE];
    const merge_task first = p.tasks[blockIdx.x];
    merge_wait();
    const int head = blockIdx.y / tr::SLICES, dim0 = blockIdx.y % tr::SLICES * tr::SLICE;
    const int group = threadIdx.x / tr::LANES, lane = threadIdx.x % tr::LANES;
    for (int t = blockIdx.x; t < num_tasks; t += gridDim.x) {
        const merge_task task = t == (int)blockIdx.x ? first : p.tasks[t];
        const int n = task.n;
        const int64_t step = (int64_t)task.stride * p.num_qo_heads; /* between partial rows */
        const float *lse_part = p.lse_tmp + (int64_t)task.first * p.num_qo_heads + head;
        __syncthreads(); /* the previous task is done with weight[] and group_sum */
        merge_weights(p, task, head, lse_part, step, weight);
        __syncthreads();
        /* every partial slot was written in this run (empty parts as zeros),
         * so no slot can poison the sum */
        const float *o_part = p.o_tmp + ((int64_t)task.first * p.num_qo_heads + head) * D + dim0 + lane * 4;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
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
            T *dst = (T *)p.o + task.tok * p.o_stride_tok + head * p.o_stride_head + dim0 + lane * 4;
            *(uint2 *)dst = make_uint2(dtype_traits<T>::pack(acc.x, acc.y), dtype_traits<T>::pack(acc.z, acc.w));
        }
    }
}

/* The same for any head_dim_vo (the portable kernel's partials): each thread
 * sums its dims over every partial, element by element. */
#define MERGE_ANY_THREADS 128
template <typename T> __global__ void __launch_bounds__(MERGE_ANY_THREADS) merge_kernel_any(const attn_params p)
{
    extern __shared__ float weight[]; /* [max_splits] */
    const int num_tasks = p.head->counts[COUNT_MERGE];
    const merge_task first = p.tasks[blockIdx.x];
    merge_wait();
    const int head = blockIdx.y, D = p.head_dim_vo;
    for (int t = blockIdx.x; t < num_tasks; t += gridDim.x) {
        const merge_task task = t == (int)blockIdx.x ? first : p.tasks[t];
        const int64_t step = (int64_t)task.stride * p.num_qo_heads;
        const float *lse_part = p.lse_tmp + (int64_t)task.first * p.num_qo_heads + head;
        __syncthreads();
        merge_weights(p, task, head, lse_part, step, weight);
        __syncthreads();
        const float *o_part = p.o_tmp + ((int64_t)task.first * p.num_qo_heads + head) * D;
        T *dst = (T *)p.o + task.tok * p.o_stride_tok + head * p.o_stride_head;
        for (int d = threadIdx.x; d < D; d += MERGE_ANY_THREADS) {
            float acc = 0.0f;
            for (int i = 0; i < task.n; i++) acc += weight[i] * o_part[i * step * D + d];
            dst[d] = dtype_traits<T>::from_float(acc);
        }
    }
}

template <int D, typename T> static attn_kernel merge_of(void)
{
    const attn_kernel k = {merge_kernel<D, T>, merge_traits<D>::THREADS, 0, merge_traits<D>::SLICES};
    return k;
}

template <typename T> static attn_kernel merge_table(int dvo)
{
    switch (dvo) {
    case 64: return merge_of<64, T>();
    case 80: return merge_of<80, T>();
    case 96: return merge_of<96, T>();
    case 112: return merge_of<112, T>();
    case 128: return merge_of<128, T>();
    case 192: return merge_of<192, T>();
    case 256: return merge_of<256, T>();
    case 512: return merge_of<512, T>();
    }
    const attn_kernel k = {merge_kernel_any<T>, MERGE_ANY_THREADS, 0, 1};
    return k;
}

/* smem: the engine launches with max_splits floats (the weights); grid.y is
 * num_qo_heads x rows (the slices of a head). */
attn_kernel ak_cuda_merge_kernel(int dvo, int vec, ak_dtype dtype)
{
    if (!vec) {
        const attn_kernel k = {dtype == AK_F16 ? merge_kernel_any<__half> : merge_kernel_any<__nv_bfloat16>,
                               MERGE_ANY_THREADS, 0, 1};
        return k;
    }
    return dtype == AK_F16 ? merge_table<__half>(dvo) : merge_table<__nv_bfloat16>(dvo);
}
