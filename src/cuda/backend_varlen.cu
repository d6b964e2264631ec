/*
 * backend_varlen.cu - cuda_varlen: FlashAttention-style ragged ("varlen")
 * attention over contiguous K/V given by cumulative lengths (no page table):
 * prompt prefill with no cached prefix (run() reads the step's own K/V; the
 * scatter into a paged cache stays the separate ak_kv_update), encoder
 * self-attention (non-causal), cross-attention (q_len and kv_len differ per
 * request, kv_len may be 0).
 *
 * It is the CUDA engine (engine.cu) in ENGINE_MODE_VARLEN. What differs from
 * cuda_paged's ragged mode:
 *   - every request with a query token goes through the prefill kernel (a
 *     q_len 1 request is a tile of one token), so run() is one launch;
 *   - nothing is split along the keys, so there is no merge pass and no
 *     partial-state buffer; plan() only cuts query tiles, orders them
 *     request by request (each request's heaviest first) and deals them to
 *     the fixed grid.
 * A prompt prefill without prefix has no long key range for a few query rows,
 * which is what split-KV is for; a decode-heavy or long-context cross batch
 * is better served by cuda_paged (see the selector's table in registry.c).
 *
 * Graph support ALWAYS: the grid is fixed at create() and the kernel reads
 * its list length from device memory. A capture reads the tensors given at
 * capture: q/o sized for the largest plan (as for cuda_paged), and K/V
 * buffers that hold every later plan's sum of kv_len.
 */
#include "engine.cuh"

static int varlen_check(const ak_attn_config *cfg, const ak_device_info *dev, ak_reasons *why)
{
    ak_cuda_engine_check(cfg, dev, why);
    if (cfg->kv_storage != AK_KV_RAGGED)
        ak_reason_add(why, "reads contiguous (ragged) K/V only; cfg.kv_storage is paged (cuda_paged reads a cache)");
    return why->count;
}

static ak_status varlen_create(const ak_attn_config *cfg, const ak_limits *lim, void **out)
{
    return ak_cuda_engine_create(cfg, lim, ENGINE_MODE_VARLEN, out);
}

static void varlen_explain(const ak_attn_config *cfg, const ak_device_info *dev, char *buf, size_t cap)
{
    ak_cuda_engine_explain(cfg, dev, ENGINE_MODE_VARLEN, buf, cap);
}

extern "C" const ak_backend_vtbl ak_backend_cuda_varlen = {
    /* .api_version = */ AK_API_VERSION,
    /* .name = */ "cuda_varlen",
    /* .device = */ AK_DEVICE_CUDA,
    /* .forward_includes_kv_update = */ 0,
    /* .graph_support = */ AK_GRAPH_ALWAYS,
    /* .check = */ varlen_check,
    /* .create = */ varlen_create,
    /* .plan = */ ak_cuda_engine_plan,
    /* .run = */ ak_cuda_engine_run,
    /* .destroy = */ ak_cuda_engine_destroy,
    /* .slot_mapping = */ NULL, /* (optional) ragged K/V have no cache slots */
    /* .explain = */ varlen_explain,
    /* .meta_buffers = */ ak_cuda_engine_meta_buffers,
};
