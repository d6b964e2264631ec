/*
 * backend.h - the backend protocol: what a backend provides (one const
 * ak_backend_vtbl), what the core guarantees before it calls each slot, and
 * the backend object the public calls (registry.c) wrap. Included by the
 * core and by each backend's vtable file; never by users.
 *
 * What a backend may assume, slot by slot (the core checks the rest):
 *   check(cfg, dev)   cfg passed ak_config_validate; dev describes cfg.device,
 *                     which is present and of the backend's device kind.
 *   create(cfg, lim)  check() gave no reason for cfg; cfg is normalised
 *                     (sm_scale filled in); lim passed ak_limits_validate.
 *                     Every static buffer is sized here, from lim.
 *   meta_buffers      (optional) called first by every plan: where the core
 *                     is to build the batch metadata (e.g. pinned staging
 *                     the backend copies to the device). NULL: the core
 *                     builds it in host arrays of its own.
 *   plan(batch, meta) the batch passed ak_batch_build_meta against cfg and
 *                     lim (lengths, limits, block ids in range, q_len <=
 *                     kv_len when causal, q_len <= 1 for a decode workload),
 *                     and meta holds its metadata: qo_indptr, kv_indptr
 *                     (paged: in blocks; ragged: in tokens), and for paged
 *                     storage kv_indices and slot_mapping (the arrays
 *                     meta_buffers gave, or the core's). The batch's own
 *                     arrays are valid during the call only; the core's
 *                     meta arrays stay valid and unchanged until the next
 *                     plan or destroy. A failing plan leaves no plan in force.
 *   run(args)         a plan succeeded and is in force; every tensor of args
 *                     matches cfg and the plan (shape, dtype, strides, the
 *                     cache view's geometry and at least lim.num_cache_blocks
 *                     blocks). run() allocates nothing and never syncs.
 */
#ifndef AK_BACKEND_H
#define AK_BACKEND_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ak_backend_vtbl {
    int api_version;       /* AK_API_VERSION */
    const char *name;
    ak_device_kind device;
    int forward_includes_kv_update; /* explicit in every backend, no default */
    ak_graph_support graph_support;
    /* Appends one reason per unsupported aspect of cfg; returns how many. */
    int (*check)(const ak_attn_config *cfg, const ak_device_info *dev, ak_reasons *why);
    ak_status (*create)(const ak_attn_config *cfg, const ak_limits *lim, void **state);
    /* Fills the static buffers from a validated batch and its metadata. */
    ak_status (*plan)(void *state, const ak_batch *batch, const ak_batch_meta *meta, ak_stream stream);
    ak_status (*run)(void *state, const ak_run_args *args, ak_stream stream);
    void (*destroy)(void *state);
    /* (optional) the static slot-mapping buffer, on cfg.device */
    const int64_t *(*slot_mapping)(void *state);
    /* (optional) one line on how the backend will serve cfg (kernel choice) */
    void (*explain)(const ak_attn_config *cfg, const ak_device_info *dev, char *buf, size_t cap);
    /* (optional) where the next plan's metadata is built (see above) */
    ak_status (*meta_buffers)(void *state, ak_batch_meta *meta /* OUT */);
} ak_backend_vtbl;

struct ak_backend {
    const ak_backend_vtbl *vt;
    void *state;
    ak_attn_config cfg;  /* normalised: sm_scale filled in */
    ak_limits lim;       /* as given: max_splits 0 means the backend's own default */
    ak_batch_meta meta;  /* the core's metadata arrays (backends without meta_buffers) */
    int planned;         /* a plan() has succeeded (and no later one failed) */
    ak_status failed_plan; /* the status of the last plan() if it failed, else AK_OK */
    int num_tokens;      /* of that plan: sum of q_len */
    int64_t num_kv_tokens; /* sum of kv_len */
};

/* The registry: every backend compiled in, in one table (registry.c). */
extern const ak_backend_vtbl ak_backend_cpu_ref;
extern const ak_backend_vtbl ak_backend_cpu;
#ifdef AK_HAVE_CUDA
extern const ak_backend_vtbl ak_backend_cuda_paged;
extern const ak_backend_vtbl ak_backend_cuda_varlen;
extern const ak_backend_vtbl ak_backend_cuda_mla;
#endif

#ifdef __cplusplus
}
#endif

#endif /* AK_BACKEND_H */
