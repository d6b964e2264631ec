/*
 * backend_mla.cu - cuda_mla: multi-head latent attention (cfg.mla,
 * DeepSeek-V2/V3, Kimi K2) in its absorbed form, over a latent cache of
 * 576-value rows (512 latent + 64 rotary) whose first 512 values are the
 * value. Decode, multi-token prediction and chunks on a cached prefix: every
 * query token is one decode item on the wide-row kernel (decode_wide.cu),
 * all heads of a block sharing each latent row load, split-KV with a merge.
 * It is the CUDA engine (engine.cu) in ENGINE_MODE_MLA.
 */
#include "engine.cuh"

static ak_status mla_create(const ak_attn_config *cfg, const ak_limits *lim, void **out)
{
    return ak_cuda_engine_create(cfg, lim, ENGINE_MODE_MLA, out);
}

static void mla_explain(const ak_attn_config *cfg, const ak_device_info *dev, char *buf, size_t cap)
{
    ak_cuda_engine_explain(cfg, dev, ENGINE_MODE_MLA, buf, cap);
}

extern "C" const ak_backend_vtbl ak_backend_cuda_mla = {
    /* .api_version = */ AK_API_VERSION,
    /* .name = */ "cuda_mla",
    /* .device = */ AK_DEVICE_CUDA,
    /* .forward_includes_kv_update = */ 0,
    /* .graph_support = */ AK_GRAPH_ALWAYS,
    /* .check = */ ak_cuda_mla_check,
    /* .create = */ mla_create,
    /* .plan = */ ak_cuda_engine_plan,
    /* .run = */ ak_cuda_engine_run,
    /* .destroy = */ ak_cuda_engine_destroy,
    /* .slot_mapping = */ ak_cuda_engine_slot_mapping,
    /* .explain = */ mla_explain,
    /* .meta_buffers = */ ak_cuda_engine_meta_buffers,
};
