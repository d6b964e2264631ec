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
 * (64 for 192), a block each: a block a whole head of 512 left one split
 * token with few blocks and few loads in flight (MLA, one request split 64
 * ways, H200: 68.8 us before, 53.2 with slices). A block keeps 128 threads:
 * blocks of 512 threads (more groups) with grid.x divided by the slices
 * were as fast on that token and slower on many tokens split two or three
 * ways (64 heads, 64 x 8192: 244 us against 192).
 *
 * A plan with few tasks (under a block an SM) merges in narrow slices of 32
 * dims instead, 16 groups of 8 threads a block: one request of an 8/1
 * group split across the whole wave (264 partials) merged in 8 blocks of a
 * whole head each was slower than 64 splits; in narrow slices it gains
 * (BENCHMARKS.md, the merge's two shapes). Many tasks keep the wide slices,
 * since each narrow block recomputes its token's weights.
 */
#include "attn.cuh"

/* A block covers SLICE of the D dims: LANES threads cover the slice (4 dims
 * each) and GROUPS groups of them split the partials and add their sums in
 * shared memory. Two shapes, chosen per plan (plan_head.merge_narrow):
 *   wide: slices of W dims (all of them up to 128, else 128, or 64 for
 *     192); a plan with many tasks, where each block recomputing a token's
 *     weights for fewer dims would cost;
 *   narrow: slices of N = 32 dims (D of 64, 96 or 128), 8 lanes and 15-16
 *     groups: a plan with few tasks (one request split across the wave)
 *     gets D / 32 blocks a head, each with more partials in flight. Wider
 *     rows have no narrow shape: at MLA's 512 it was no faster (16 heads,
 *     one request split 132 ways) and its larger grid cost 2% at 128 heads.
 * The grid is fixed (graphs), so its y counts heads x D / N; in the wide
 * shape the SUB = W / N blocks of a wide slice take every SUB-th task. */
template <int D> struct merge_traits {
    static constexpr int W = D <= 128 ? D : D % 128 == 0 ? 128 : 64;
    static constexpr int N = D <= 128 && D % 32 == 0 ? 32 : W;
    static constexpr int ROWS = D / N; /* blocks a head (grid.y) */
    static constexpr int SUB = W / N;
    static constexpr int THREADS = 128 / (W / 4) * (W / 4); /* 120 at D = 80 or 96: whole groups */
    static_assert(D % 4 == 0 && D % W == 0 && W % N == 0 && THREADS >= 32 && THREADS % (N / 4) == 0,
                  "dims must tile the block");
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
 * plan's count and shape and its first task before the wait (plan() copied
 * them before any kernel of the step); a block with no task exits there,
 * but for one that always waits. */
__device__ __forceinline__ void merge_wait()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* One task's merge over SLICE of its D dims from dim0, by THREADS threads:
 * the weights (merge_weights), then the weighted sum. A thread's first PRE
 * partials are loaded before the weights are known, so their latency and
 * the LSEs' overlap instead of following one another. */
template <int D, int SLICE, int THREADS, typename T>
__device__ __forceinline__ void merge_slice(const attn_params &p, const merge_task &task, int head, int dim0,
                                            const float *lse_part, int64_t step, float *weight, float4 *group_sum)
{
    constexpr int LANES = SLICE / 4, GROUPS = THREADS / LANES, PRE = 4;
    const int group = threadIdx.x / LANES, lane = threadIdx.x % LANES;
    /* every partial slot was written in this run (empty parts as zeros), so
     * no slot can poison the sum */
    const float *o_part = p.o_tmp + ((int64_t)task.first * p.num_qo_heads + head) * D + dim0 + lane * 4;
    const int64_t row = step * D;
    float4 pre[PRE];
#pragma unroll
    for (int k = 0; k < PRE; k++) {
        const int i = group + k * GROUPS;
        pre[k] = i < task.n ? *(const float4 *)(o_part + i * row) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    merge_weights(p, task, head, lse_part, step, weight);
    __syncthreads();
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < PRE; k++) {
        const int i = group + k * GROUPS;
        const float w = i < task.n ? weight[i] : 0.0f;
        acc.x += w * pre[k].x;
        acc.y += w * pre[k].y;
        acc.z += w * pre[k].z;
        acc.w += w * pre[k].w;
    }
#pragma unroll 8
    for (int i = group + PRE * GROUPS; i < task.n; i += GROUPS) {
        const float w = weight[i];
        const float4 v = *(const float4 *)(o_part + i * row);
        acc.x += w * v.x;
        acc.y += w * v.y;
        acc.z += w * v.z;
        acc.w += w * v.w;
    }
    /* the groups' sums: first a warp's groups by shuffles (where groups tile
     * whole warps), then the warps' (or the groups') through shared memory */
    constexpr bool SHFL = LANES < 32 && 32 % LANES == 0 && THREADS % 32 == 0;
    constexpr int PARTS = SHFL ? THREADS / 32 : GROUPS; /* sums left for group 0 to add */
    if (SHFL) {
#pragma unroll
        for (int o = LANES; o < 32; o *= 2) {
            acc.x += __shfl_xor_sync(0xffffffffu, acc.x, o);
            acc.y += __shfl_xor_sync(0xffffffffu, acc.y, o);
            acc.z += __shfl_xor_sync(0xffffffffu, acc.z, o);
            acc.w += __shfl_xor_sync(0xffffffffu, acc.w, o);
        }
    }
    const int part = SHFL ? threadIdx.x / 32 : group;
    if (!SHFL || threadIdx.x % 32 < LANES) group_sum[part * LANES + lane] = acc;
    __syncthreads();
    if (group == 0) {
#pragma unroll
        for (int g = 1; g < PARTS; g++) {
            const float4 v = group_sum[g * LANES + lane];
            acc.x += v.x;
            acc.y += v.y;
            acc.z += v.z;
            acc.w += v.w;
        }
        T *dst = (T *)p.o + task.tok * p.o_stride_tok + head * p.o_stride_head + dim0 + lane * 4;
        *(uint2 *)dst = make_uint2(dtype_traits<T>::pack(acc.x, acc.y), dtype_traits<T>::pack(acc.z, acc.w));
    }
}

template <int D, typename T> __global__ void __launch_bounds__(merge_traits<D>::THREADS) merge_kernel(const attn_params p)
{
    typedef merge_traits<D> tr;
    extern __shared__ float weight[]; /* [max_splits] */
    __shared__ float4 group_sum[tr::THREADS];
    const int num_tasks = p.head->counts[COUNT_MERGE];
    const int narrow = tr::SUB > 1 && p.head->merge_narrow;
    const int head = blockIdx.y / tr::ROWS, r = blockIdx.y % tr::ROWS;
    /* narrow: slice r, every task from blockIdx.x; wide: slice r / SUB, the
     * tasks of stream blockIdx.x x SUB + r % SUB */
    const int dim0 = narrow ? r * tr::N : r / tr::SUB * tr::W;
    const int t0 = narrow ? blockIdx.x : blockIdx.x * tr::SUB + r % tr::SUB;
    const int stride = narrow ? gridDim.x : gridDim.x * tr::SUB;
    /* A block with no task exits before the wait (which lets the kernel
     * after it launch), except block (0, 0): this grid must not finish
     * before the kernels it depends on, even when the plan has no task.
     * Block (0, 0) has task 0 in either shape, and p.tasks has one entry
     * at least. */
    if (t0 >= num_tasks && (blockIdx.x | blockIdx.y) != 0) return;
    const merge_task first = p.tasks[t0 < num_tasks ? t0 : 0];
    merge_wait();
    for (int t = t0; t < num_tasks; t += stride) {
        const merge_task task = t == t0 ? first : p.tasks[t];
        const int64_t step = (int64_t)task.stride * p.num_qo_heads; /* between partial rows */
        const float *lse_part = p.lse_tmp + (int64_t)task.first * p.num_qo_heads + head;
        __syncthreads(); /* the previous task is done with weight[] and group_sum */
        if (narrow)
            merge_slice<D, tr::N, tr::THREADS, T>(p, task, head, dim0, lse_part, step, weight, group_sum);
        else
            merge_slice<D, tr::W, tr::THREADS, T>(p, task, head, dim0, lse_part, step, weight, group_sum);
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
    const attn_kernel k = {merge_kernel<D, T>, merge_traits<D>::THREADS, 0, merge_traits<D>::ROWS, 0, 0,
                           merge_traits<D>::SUB};
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
