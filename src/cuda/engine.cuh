/*
 * engine.cuh - the planner and launcher of the CUDA attention kernels
 * (engine.cu). Every CUDA attention backend is this engine in one mode, plus
 * its vtable (backend_*.cu); no backend includes another.
 *
 *   ENGINE_MODE_PAGED  (cuda_paged): any batch; the decode kernel for q_len
 *                      1, the prefill kernel for the rest, split-KV with a
 *                      merge pass; K/V paged (block table) or ragged
 *                      (contiguous rows);
 *   ENGINE_MODE_VARLEN (cuda_varlen): ragged K/V only; every request through
 *                      the prefill kernel, no split-KV and no merge, so run()
 *                      is one launch (FlashAttention's varlen scheme);
 *   ENGINE_MODE_MLA    (cuda_mla): multi-head latent attention (cfg.mla),
 *                      every query token a decode item on the wide-row
 *                      kernel (causal among a request's tokens), split-KV
 *                      with a merge pass.
 *
 * Both keep the same plan/run protocol: plan() fills fixed device buffers
 * from pinned staging, run() launches fixed grids that read the work-list
 * lengths from the device (graph support ALWAYS).
 */
#ifndef AK_CUDA_ENGINE_CUH
#define AK_CUDA_ENGINE_CUH

#include "attn.cuh"
#include "backend.h"

typedef enum engine_mode { ENGINE_MODE_PAGED = 0, ENGINE_MODE_VARLEN = 1, ENGINE_MODE_MLA = 2 } engine_mode;

/* The reasons every kernel of the engine shares (device, dtypes, head dims). */
int ak_cuda_engine_check(const ak_attn_config *cfg, const ak_device_info *dev, ak_reasons *why);
/* cuda_mla's reasons (it serves cfg.mla only). */
int ak_cuda_mla_check(const ak_attn_config *cfg, const ak_device_info *dev, ak_reasons *why);
ak_status ak_cuda_engine_create(const ak_attn_config *cfg, const ak_limits *lim, engine_mode mode, void **state);
/* The vtable slots (backend.h) every mode shares. */
ak_status ak_cuda_engine_meta_buffers(void *state, ak_batch_meta *meta);
ak_status ak_cuda_engine_plan(void *state, const ak_batch *batch, const ak_batch_meta *meta, ak_stream stream);
ak_status ak_cuda_engine_run(void *state, const ak_run_args *args, ak_stream stream);
void ak_cuda_engine_destroy(void *state);
const int64_t *ak_cuda_engine_slot_mapping(void *state);
/* One line on how a mode serves cfg on dev: kernels, tiles, splits. */
void ak_cuda_engine_explain(const ak_attn_config *cfg, const ak_device_info *dev, engine_mode mode, char *buf,
                            size_t cap);

#endif /* AK_CUDA_ENGINE_CUH */
