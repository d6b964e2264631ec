/*
 * backend_paged.cuh - the planner and launcher of backend_paged.cu, shared by
 * the two CUDA attention backends built on the same kernels:
 *
 *   cuda_paged  (ATTN_MODE_PAGED): any batch; decode kernel for q_len 1,
 *               prefill kernel for the rest, split-KV with a merge pass; K/V
 *               paged (block table) or ragged (contiguous rows);
 *   cuda_varlen (ATTN_MODE_VARLEN): ragged K/V only; every request through
 *               the prefill kernel, no split-KV and no merge, so run() is one
 *               launch (FlashAttention's varlen scheme).
 *
 * Both keep the same plan/run protocol: plan() fills fixed device buffers
 * from pinned staging, run() launches fixed grids that read the work-list
 * lengths from the device (graph support ALWAYS).
 */
#ifndef AK_CUDA_BACKEND_PAGED_CUH
#define AK_CUDA_BACKEND_PAGED_CUH

#include "attn.cuh"

typedef enum attn_mode { ATTN_MODE_PAGED = 0, ATTN_MODE_VARLEN = 1 } attn_mode;

/* The reasons every kernel of the family shares (device, dtypes, head dims). */
int ak_cuda_attn_check(const ak_attn_config *cfg, const ak_device_info *dev, ak_reasons *why);
ak_status ak_cuda_attn_create(const ak_attn_config *cfg, const ak_limits *lim, attn_mode mode, void **state);
ak_status ak_cuda_attn_plan(void *state, const ak_batch *batch, ak_stream stream, ak_plan_info *info);
ak_status ak_cuda_attn_run(void *state, const ak_run_args *args, ak_stream stream);
void ak_cuda_attn_destroy(void *state);
/* The prefill row tile of cfg on dev: query rows, tokens and heads of a
 * tile, and which kernel (fails on a bad AK_CUDA_PREFILL). */
ak_status ak_cuda_attn_prefill_tile(const ak_attn_config *cfg, const ak_device_info *dev, int *rows, int *tokens,
                                    int *heads, const char **kernel);

#endif /* AK_CUDA_BACKEND_PAGED_CUH */
