/*
 * backend_paged.cu - cuda_paged, the NVIDIA default: FlashInfer-style paged
 * attention with plan-then-replay, for any batch: decodes, prefills, chunks
 * on a cached prefix, multi-token verification, and mixes of them, in one
 * plan and one run. K/V come from a paged cache (block table) or, with
 * cfg.kv_storage ragged, from contiguous rows. It is the CUDA engine
 * (engine.cu) in ENGINE_MODE_PAGED: the decode kernel for q_len 1, the
 * prefill kernel for the rest, split-KV with a merge pass.
 */
#include "engine.cuh"

static int paged_check(const ak_attn_config *cfg, const ak_device_info *dev, ak_reasons *why)
{
    return ak_cuda_engine_check(cfg, dev, why);
}

static ak_status paged_create(const ak_attn_config *cfg, const ak_limits *lim, void **out)
{
    return ak_cuda_engine_create(cfg, lim, ENGINE_MODE_PAGED, out);
}

static void paged_explain(const ak_attn_config *cfg, const ak_device_info *dev, char *buf, size_t cap)
{
    ak_cuda_engine_explain(cfg, dev, ENGINE_MODE_PAGED, buf, cap);
}

extern "C" const ak_backend_vtbl ak_backend_cuda_paged = {
    /* .api_version = */ AK_API_VERSION,
    /* .name = */ "cuda_paged",
    /* .device = */ AK_DEVICE_CUDA,
    /* .forward_includes_kv_update = */ 0,
    /* .graph_support = */ AK_GRAPH_ALWAYS,
    /* .check = */ paged_check,
    /* .create = */ paged_create,
    /* .plan = */ ak_cuda_engine_plan,
    /* .run = */ ak_cuda_engine_run,
    /* .destroy = */ ak_cuda_engine_destroy,
    /* .slot_mapping = */ ak_cuda_engine_slot_mapping,
    /* .explain = */ paged_explain,
    /* .meta_buffers = */ ak_cuda_engine_meta_buffers,
};
