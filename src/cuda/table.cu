/*
 * table.cu - a plan over a device block table (ak_batch.device_block_table):
 * the cache slots of the step's new tokens, computed on the device from the
 * table the kernels will read in place, so plan() copies O(requests) of
 * metadata and never O(blocks).
 */
#include "attn.cuh"

#define TABLE_SLOT_THREADS 256

/* Token t of the plan (one thread each; t in [num_tokens, total): -1, the
 * rows a larger earlier plan left behind, so a kv_update captured with more
 * tokens skips them). Its request r is found by bisection of qo_indptr; it
 * is key pos = kv_lens[r] - q_len + (t - qo_indptr[r]) of the request, in
 * block table[r * stride + pos / page_size]. A block outside [0,
 * num_blocks) (the host could not check the table) or a key before the
 * start (a non-causal query beyond its keys) gives -1. */
__global__ void __launch_bounds__(TABLE_SLOT_THREADS)
    table_slots_kernel(const int32_t *table, int stride, int page_size, int num_blocks, const int32_t *qo_indptr,
                       const int32_t *kv_lens, int num_reqs, int num_tokens, int total, int64_t *slots)
{
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
        int64_t slot = -1;
        if (t < num_tokens) {
            int lo = 0, hi = num_reqs - 1; /* the last r with qo_indptr[r] <= t */
            while (lo < hi) {
                const int mid = (lo + hi + 1) / 2;
                if (qo_indptr[mid] <= t)
                    lo = mid;
                else
                    hi = mid - 1;
            }
            const int q0 = qo_indptr[lo], q_len = qo_indptr[lo + 1] - q0;
            const int pos = kv_lens[lo] - q_len + (t - q0);
            if (pos >= 0) {
                const int32_t id = table[(int64_t)lo * stride + pos / page_size];
                if ((uint32_t)id < (uint32_t)num_blocks) slot = (int64_t)id * page_size + pos % page_size;
            }
        }
        slots[t] = slot;
    }
}

ak_status ak_cuda_table_slots(const int32_t *table, int stride, int page_size, int num_blocks,
                              const int32_t *qo_indptr, const int32_t *kv_lens, int num_reqs, int num_tokens,
                              int total, int64_t *slots, cudaStream_t stream)
{
    if (total <= 0) return AK_OK;
    const int blocks = (total + TABLE_SLOT_THREADS - 1) / TABLE_SLOT_THREADS;
    table_slots_kernel<<<blocks < 1024 ? blocks : 1024, TABLE_SLOT_THREADS, 0, stream>>>(
        table, stride, page_size, num_blocks, qo_indptr, kv_lens, num_reqs, num_tokens, total, slots);
    AK_CUDA_TRY(cudaGetLastError());
    return AK_OK;
}
