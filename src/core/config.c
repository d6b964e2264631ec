/*
 * config.c - defaults and validation of the public structs: dtypes, tensors,
 * ak_attn_config, ak_limits, ak_run_args.
 */
#include "dtype.h"
#include "internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- dtypes and tensors -------------------------------------------------- */

const char *ak_dtype_name(ak_dtype t)
{
    switch (t) {
    case AK_F32: return "f32";
    case AK_F16: return "f16";
    case AK_BF16: return "bf16";
    case AK_FP8_E4M3: return "fp8_e4m3";
    }
    return "unknown";
}

size_t ak_dtype_size(ak_dtype t)
{
    switch (t) {
    case AK_F32: return 4;
    case AK_F16:
    case AK_BF16: return 2;
    case AK_FP8_E4M3: return 1;
    }
    return 0;
}

ak_status ak_convert(const void *src, ak_dtype src_dtype, void *dst, ak_dtype dst_dtype, size_t n)
{
    if (n > 0 && (!src || !dst)) return ak_set_error(AK_ERR_INVALID_ARG, "%s is NULL", src ? "dst" : "src");
    const int src_ok = ak_dtype_size(src_dtype) != 0, dst_ok = ak_dtype_size(dst_dtype) != 0;
    if (!src_ok || !dst_ok)
        return ak_set_error(AK_ERR_INVALID_ARG, "ak_convert: %s_dtype = %d is not a dtype", src_ok ? "dst" : "src",
                            (int)(src_ok ? dst_dtype : src_dtype));
    /* in place to a wider dtype, element i's bytes overlap those of later
     * elements of src: the last element first */
    const int last_first = src == dst && ak_dtype_size(dst_dtype) > ak_dtype_size(src_dtype);
    for (size_t k = 0; k < n; k++) {
        const int64_t i = (int64_t)(last_first ? n - 1 - k : k);
        ak_store_from_f32(dst, dst_dtype, i, ak_load_as_f32(src, src_dtype, i));
    }
    return AK_OK;
}

/* Row-major strides; a negative dim, or dims whose bytes pass INT64_MAX, give
 * the invalid tensor attnkit.h describes: data NULL, ndim 0, the shape as
 * given and stride[d] = -1 at the dim d that failed, so that the call the
 * tensor reaches can name it (ak_tensor_validate). */
static ak_tensor tensor_nd(void *data, ak_dtype dtype, int ndim, const int64_t *shape)
{
    ak_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.ndim = ndim;
    const int64_t esz = ak_dtype_size(dtype) ? (int64_t)ak_dtype_size(dtype) : 1;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = stride;
        int64_t bytes;
        if (shape[i] < 0 || __builtin_mul_overflow(stride, shape[i] > 0 ? shape[i] : 1, &stride) ||
            __builtin_mul_overflow(stride, esz, &bytes)) {
            for (int j = 0; j < ndim; j++) t.shape[j] = shape[j];
            memset(t.stride, 0, sizeof t.stride);
            t.stride[i] = -1;
            t.data = NULL;
            t.ndim = 0;
            return t;
        }
    }
    return t;
}

ak_tensor ak_tensor_1d(void *data, ak_dtype dtype, int64_t d0) { return tensor_nd(data, dtype, 1, &d0); }

ak_tensor ak_tensor_2d(void *data, ak_dtype dtype, int64_t d0, int64_t d1)
{
    const int64_t s[2] = {d0, d1};
    return tensor_nd(data, dtype, 2, s);
}

ak_tensor ak_tensor_3d(void *data, ak_dtype dtype, int64_t d0, int64_t d1, int64_t d2)
{
    const int64_t s[3] = {d0, d1, d2};
    return tensor_nd(data, dtype, 3, s);
}

ak_tensor ak_tensor_4d(void *data, ak_dtype dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    const int64_t s[4] = {d0, d1, d2, d3};
    return tensor_nd(data, dtype, 4, s);
}

const char *ak_graph_support_name(ak_graph_support g)
{
    switch (g) {
    case AK_GRAPH_NEVER: return "never";
    case AK_GRAPH_DECODE_ONLY: return "decode_only";
    case AK_GRAPH_UNIFORM_BATCH: return "uniform_batch";
    case AK_GRAPH_ALWAYS: return "always";
    }
    return "unknown";
}

/* ---- defaults ------------------------------------------------------------ */

void ak_attn_config_init(ak_attn_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
    cfg->num_qo_heads = 1;
    cfg->num_kv_heads = 1;
    cfg->head_dim_qk = 128;
    cfg->head_dim_vo = 128;
    cfg->sm_scale = 0.0f;
    cfg->causal = 1;
    cfg->window_left = -1;
    cfg->logits_soft_cap = 0.0f;
    cfg->q_dtype = AK_F32;
    cfg->kv_dtype = AK_F32;
    cfg->o_dtype = AK_F32;
    cfg->device.kind = AK_DEVICE_CPU;
    cfg->device.index = 0;
    cfg->kv_storage = AK_KV_PAGED;
    cfg->kv_layout = AK_LAYOUT_NHD;
    cfg->page_size = 16;
}

void ak_mla_config_init(ak_attn_config *cfg, int num_heads, int kv_lora_rank, int rope_dim, float sm_scale)
{
    ak_attn_config_init(cfg);
    cfg->num_qo_heads = num_heads;
    cfg->num_kv_heads = 1;
    cfg->head_dim_qk = kv_lora_rank + rope_dim;
    cfg->head_dim_vo = kv_lora_rank;
    cfg->sm_scale = sm_scale;
    cfg->mla = 1;
}

int ak_mla_prefer_absorbed(const ak_attn_config *cfg, int q_len)
{
    return cfg && cfg->mla && q_len >= 1 && q_len <= AK_MLA_ABSORBED_MAX_Q_LEN;
}

void ak_limits_init(ak_limits *lim)
{
    memset(lim, 0, sizeof *lim);
    lim->struct_size = sizeof *lim;
    lim->max_reqs = 256;
    lim->max_tokens = 16384;
    lim->max_blocks_per_req = 2048;
    lim->num_cache_blocks = 65536;
    lim->max_splits = 0;
}

void ak_batch_init(ak_batch *batch)
{
    memset(batch, 0, sizeof *batch);
    batch->struct_size = sizeof *batch;
}

void ak_run_args_init(ak_run_args *args)
{
    memset(args, 0, sizeof *args);
    args->struct_size = sizeof *args;
}

int ak_cpu_num_threads(void)
{
    const char *env = getenv("AK_NUM_THREADS");
    char *end = NULL;
    const long n = env ? strtol(env, &end, 10) : 0;
    if (env && end != env && *end == '\0' && n > 0) return n < AK_MAX_CPU_THREADS ? (int)n : AK_MAX_CPU_THREADS;
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* ---- validation ---------------------------------------------------------- */

/* The largest head dim any backend is asked to consider; beyond it a config
 * is rejected before any backend sees it. */
#define AK_MAX_HEAD_DIM 1024
/* Likewise the most query heads: rows of a work item (tokens x heads) and
 * grid sizes stay far inside int (the largest models have 128). */
#define AK_MAX_HEADS 65536

static int dtype_known(ak_dtype t) { return ak_dtype_size(t) != 0; }

ak_status ak_config_validate(const ak_attn_config *cfg)
{
    if (!cfg) return ak_set_error(AK_ERR_INVALID_ARG, "cfg is NULL");
    if (cfg->struct_size != sizeof *cfg)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "cfg.struct_size = %u, expected %zu (call ak_attn_config_init)",
                            cfg->struct_size, sizeof *cfg);
    if (cfg->num_kv_heads <= 0)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.num_kv_heads = %d must be positive",
                            cfg->num_kv_heads);
    if (cfg->num_qo_heads > AK_MAX_HEADS)
        return ak_set_error(AK_ERR_UNSUPPORTED, "cfg.num_qo_heads = %d is above %d", cfg->num_qo_heads,
                            AK_MAX_HEADS);
    if (cfg->num_qo_heads <= 0 || cfg->num_qo_heads % cfg->num_kv_heads != 0)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "cfg.num_qo_heads = %d is not a positive multiple of "
                            "cfg.num_kv_heads = %d",
                            cfg->num_qo_heads, cfg->num_kv_heads);
    if (cfg->head_dim_qk <= 0 || cfg->head_dim_qk > AK_MAX_HEAD_DIM)
        return ak_set_error(AK_ERR_UNSUPPORTED, "cfg.head_dim_qk = %d is outside [1, %d]",
                            cfg->head_dim_qk, AK_MAX_HEAD_DIM);
    if (cfg->head_dim_vo <= 0 || cfg->head_dim_vo > AK_MAX_HEAD_DIM)
        return ak_set_error(AK_ERR_UNSUPPORTED, "cfg.head_dim_vo = %d is outside [1, %d]",
                            cfg->head_dim_vo, AK_MAX_HEAD_DIM);
    if (!(cfg->sm_scale >= 0.0f) || isinf(cfg->sm_scale))
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "cfg.sm_scale = %g must be finite and >= 0 (0 = 1/sqrt(head_dim_qk))",
                            cfg->sm_scale);
    if (cfg->causal != 0 && cfg->causal != 1)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.causal = %d must be 0 or 1", cfg->causal);
    if (cfg->window_left < -1)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.window_left = %d must be -1 (full) or >= 0",
                            cfg->window_left);
    if (!(cfg->logits_soft_cap >= 0.0f) || isinf(cfg->logits_soft_cap))
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "cfg.logits_soft_cap = %g must be finite and >= 0 (0 = off)",
                            cfg->logits_soft_cap);
    if (!dtype_known(cfg->q_dtype))
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.q_dtype = %d is not a dtype", cfg->q_dtype);
    if (!dtype_known(cfg->kv_dtype))
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.kv_dtype = %d is not a dtype", cfg->kv_dtype);
    if (!dtype_known(cfg->o_dtype))
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.o_dtype = %d is not a dtype", cfg->o_dtype);
    if (cfg->q_dtype == AK_FP8_E4M3 || cfg->o_dtype == AK_FP8_E4M3)
        return ak_set_error(AK_ERR_UNSUPPORTED,
                            "cfg.%s_dtype = fp8_e4m3: fp8 is a KV dtype only (q and o are f32, f16 or bf16)",
                            cfg->q_dtype == AK_FP8_E4M3 ? "q" : "o");
    if (cfg->device.kind != AK_DEVICE_CPU && cfg->device.kind != AK_DEVICE_CUDA)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.device.kind = %d is not a device kind",
                            cfg->device.kind);
    if (cfg->device.index < 0)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.device.index = %d is negative",
                            cfg->device.index);
    if (cfg->workload != AK_WORKLOAD_ANY && cfg->workload != AK_WORKLOAD_DECODE)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.workload = %d is not a workload", cfg->workload);
    if (cfg->use_sinks != 0 && cfg->use_sinks != 1)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.use_sinks = %d must be 0 or 1", cfg->use_sinks);
    if (cfg->batch_invariant != 0 && cfg->batch_invariant != 1)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.batch_invariant = %d must be 0 or 1", cfg->batch_invariant);
    if (cfg->mla != 0 && cfg->mla != 1)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.mla = %d must be 0 or 1", cfg->mla);
    if (cfg->mla && cfg->num_kv_heads != 1)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.num_kv_heads = %d: MLA has one latent KV head (cfg.mla = 1)",
                            cfg->num_kv_heads);
    if (cfg->mla && cfg->head_dim_vo > cfg->head_dim_qk)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "cfg.head_dim_vo = %d is above cfg.head_dim_qk = %d: with cfg.mla = 1 the value is "
                            "the first head_dim_vo values of each K row",
                            cfg->head_dim_vo, cfg->head_dim_qk);
    if (cfg->kv_storage != AK_KV_PAGED && cfg->kv_storage != AK_KV_RAGGED)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.kv_storage = %d is not a storage kind",
                            cfg->kv_storage);
    if (cfg->kv_storage == AK_KV_PAGED) {
        if (cfg->kv_layout != AK_LAYOUT_NHD && cfg->kv_layout != AK_LAYOUT_HND)
            return ak_set_error(AK_ERR_INVALID_ARG, "cfg.kv_layout = %d is not a layout",
                                cfg->kv_layout);
        if (cfg->page_size <= 0)
            return ak_set_error(AK_ERR_INVALID_ARG, "cfg.page_size = %d must be positive",
                                cfg->page_size);
    }
    return AK_OK;
}

ak_status ak_limits_validate(const ak_limits *lim)
{
    if (!lim) return ak_set_error(AK_ERR_INVALID_ARG, "limits is NULL");
    if (lim->struct_size != sizeof *lim)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "limits.struct_size = %u, expected %zu (call ak_limits_init)",
                            lim->struct_size, sizeof *lim);
    if (lim->max_reqs <= 0)
        return ak_set_error(AK_ERR_INVALID_ARG, "limits.max_reqs = %d must be positive",
                            lim->max_reqs);
    if (lim->max_tokens <= 0 || lim->max_tokens > AK_MAX_LEN)
        return ak_set_error(AK_ERR_INVALID_ARG, "limits.max_tokens = %d is outside [1, AK_MAX_LEN = %d]",
                            lim->max_tokens, AK_MAX_LEN);
    if (lim->max_blocks_per_req <= 0)
        return ak_set_error(AK_ERR_INVALID_ARG, "limits.max_blocks_per_req = %d must be positive",
                            lim->max_blocks_per_req);
    if (lim->num_cache_blocks <= 0)
        return ak_set_error(AK_ERR_INVALID_ARG, "limits.num_cache_blocks = %d must be positive",
                            lim->num_cache_blocks);
    if (lim->max_splits < 0)
        return ak_set_error(AK_ERR_INVALID_ARG, "limits.max_splits = %d must be >= 0",
                            lim->max_splits);
    return AK_OK;
}

ak_attn_config ak_config_normalized(const ak_attn_config *cfg)
{
    ak_attn_config c = *cfg;
    if (c.sm_scale == 0.0f) c.sm_scale = 1.0f / sqrtf((float)c.head_dim_qk);
    return c;
}

ak_meta_capacity ak_meta_capacity_of(const ak_limits *lim)
{
    ak_meta_capacity cap;
    cap.max_reqs = lim->max_reqs;
    cap.max_tokens = lim->max_tokens;
    cap.max_kv_indices = (int64_t)lim->max_reqs * lim->max_blocks_per_req;
    return cap;
}

ak_status ak_meta_alloc_host(const ak_meta_capacity *cap, ak_batch_meta *meta)
{
    memset(meta, 0, sizeof *meta);
    meta->qo_indptr = malloc(sizeof(int32_t) * ((size_t)cap->max_reqs + 1));
    meta->kv_indptr = malloc(sizeof(int32_t) * ((size_t)cap->max_reqs + 1));
    meta->kv_indices = malloc(sizeof(int32_t) * ((size_t)cap->max_kv_indices + 1));
    meta->kv_last_page_len = malloc(sizeof(int32_t) * ((size_t)cap->max_reqs + 1));
    /* positions stay NULL: no backend reads them, so plan() skips them */
    meta->slot_mapping = malloc(sizeof(int64_t) * ((size_t)cap->max_tokens + 1));
    /* windowed configs: the blocks no query sees are left out (batch.c) */
    meta->kv_first_block = malloc(sizeof(int32_t) * ((size_t)cap->max_reqs + 1));
    if (!meta->qo_indptr || !meta->kv_indptr || !meta->kv_indices || !meta->kv_last_page_len ||
        !meta->slot_mapping || !meta->kv_first_block) {
        ak_meta_free_host(meta);
        return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate batch metadata for %d requests",
                            cap->max_reqs);
    }
    return AK_OK;
}

void ak_meta_free_host(ak_batch_meta *meta)
{
    free(meta->qo_indptr);
    free(meta->kv_indptr);
    free(meta->kv_indices);
    free(meta->kv_last_page_len);
    free(meta->positions);
    free(meta->slot_mapping);
    free(meta->kv_first_block);
    memset(meta, 0, sizeof *meta);
}

ak_status ak_tensor_validate(const ak_tensor *t, const char *name)
{
    if (!t) return ak_set_error(AK_ERR_INVALID_ARG, "%s is NULL", name);
    if (t->ndim == 0 && !t->data)
        for (int i = 0; i < AK_MAX_DIMS; i++)
            if (t->stride[i] == -1)
                return ak_set_error(AK_ERR_INVALID_ARG,
                                    "%s is invalid: ak_tensor_*d was given shape[%d] = %lld, %s", name, i,
                                    (long long)t->shape[i],
                                    t->shape[i] < 0 ? "which is negative"
                                                    : "and the tensor's bytes pass INT64_MAX there");
    if (t->ndim < 1 || t->ndim > AK_MAX_DIMS)
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->ndim = %d is outside [1, %d]", name, t->ndim, AK_MAX_DIMS);
    /* the last element's offset, and the bytes up to it, must be int64 */
    const int64_t esz = ak_dtype_size(t->dtype) ? (int64_t)ak_dtype_size(t->dtype) : 1;
    int64_t last = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || t->stride[i] < 0)
            return ak_set_error(AK_ERR_INVALID_ARG, "%s->%s[%d] = %lld is negative", name,
                                t->shape[i] < 0 ? "shape" : "stride", i,
                                (long long)(t->shape[i] < 0 ? t->shape[i] : t->stride[i]));
        int64_t span;
        if (t->shape[i] > 0 && (__builtin_mul_overflow(t->shape[i] - 1, t->stride[i], &span) ||
                                __builtin_add_overflow(last, span, &last) || last > INT64_MAX / esz - 1))
            return ak_set_error(AK_ERR_INVALID_ARG,
                                "%s->stride[%d] = %lld with shape[%d] = %lld: the tensor spans more than "
                                "INT64_MAX bytes",
                                name, i, (long long)t->stride[i], i, (long long)t->shape[i]);
    }
    return AK_OK;
}

/* One tensor of a run: dtype, rank, exact shape, innermost stride 1,
 * non-negative strides. `name` is the field ("args.q"). */
static ak_status check_tensor(const ak_tensor *t, const char *name, ak_dtype dtype, int ndim,
                              const int64_t *shape)
{
    AK_TRY(ak_tensor_validate(t, name));
    int empty = 0;
    for (int i = 0; i < ndim; i++) empty |= shape[i] == 0;
    /* an empty plan (every request q_len 0) may pass views of no memory */
    if (!t->data && !empty) return ak_set_error(AK_ERR_INVALID_ARG, "%s->data is NULL", name);
    if (t->dtype != dtype)
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->dtype = %s, expected %s", name,
                            ak_dtype_name(t->dtype), ak_dtype_name(dtype));
    if (t->ndim != ndim)
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->ndim = %d, expected %d", name, t->ndim, ndim);
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] != shape[i])
            return ak_set_error(AK_ERR_INVALID_ARG, "%s->shape[%d] = %lld, expected %lld", name, i,
                                (long long)t->shape[i], (long long)shape[i]);
        if (t->stride[i] < 0)
            return ak_set_error(AK_ERR_INVALID_ARG, "%s->stride[%d] = %lld is negative", name, i,
                                (long long)t->stride[i]);
    }
    if (t->stride[ndim - 1] != 1 && shape[ndim - 1] > 1)
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->stride[%d] = %lld, the innermost stride must be 1",
                            name, ndim - 1, (long long)t->stride[ndim - 1]);
    return AK_OK;
}

static const char *scale_kind_name(ak_kv_scale_kind kind)
{
    switch (kind) {
    case AK_KV_SCALE_NONE: return "none";
    case AK_KV_SCALE_PER_LAYER: return "per_layer";
    case AK_KV_SCALE_PER_HEAD: return "per_head";
    }
    return "unknown";
}

ak_status ak_kv_scales_validate(ak_dtype dtype, int num_kv_heads, ak_kv_scale_kind kind, const float *k_scale,
                                const float *v_scale, int has_v, const char *prefix, const char *kind_field)
{
    if (kind != AK_KV_SCALE_NONE && kind != AK_KV_SCALE_PER_LAYER && kind != AK_KV_SCALE_PER_HEAD)
        return ak_set_error(AK_ERR_INVALID_ARG, "%s%s = %d is not an ak_kv_scale_kind", prefix, kind_field,
                            (int)kind);
    if (kind != AK_KV_SCALE_NONE && dtype != AK_FP8_E4M3)
        return ak_set_error(AK_ERR_INVALID_ARG, "%s%s = %s, but the K/V dtype is %s: scales belong to fp8_e4m3 only",
                            prefix, kind_field, scale_kind_name(kind), ak_dtype_name(dtype));
    for (int is_v = 0; is_v < 2; is_v++) {
        const float *p = is_v ? v_scale : k_scale;
        const char *field = is_v ? "v_scale" : "k_scale";
        if (is_v && !has_v) {
            /* MLA: the value is part of the K row, scaled by k_scale */
            if (p)
                return ak_set_error(AK_ERR_INVALID_ARG,
                                    "%sv_scale is given, but the value is read from the K rows (MLA), scaled by "
                                    "%sk_scale: pass NULL",
                                    prefix, prefix);
            continue;
        }
        if (kind == AK_KV_SCALE_NONE && p)
            return ak_set_error(AK_ERR_INVALID_ARG,
                                "%s%s is given but %s%s = none (say AK_KV_SCALE_PER_LAYER or _PER_HEAD)", prefix,
                                field, prefix, kind_field);
        if (kind != AK_KV_SCALE_NONE && !p)
            return ak_set_error(AK_ERR_INVALID_ARG, "%s%s is NULL, but %s%s = %s needs [%d] floats", prefix, field,
                                prefix, kind_field, scale_kind_name(kind),
                                kind == AK_KV_SCALE_PER_HEAD ? num_kv_heads : 1);
        if ((uintptr_t)p % sizeof(float) != 0)
            return ak_set_error(AK_ERR_INVALID_ARG, "%s%s = %p is not aligned to a float", prefix, field,
                                (const void *)p);
    }
    return AK_OK;
}

ak_status ak_paged_kv_validate(const ak_paged_kv *kv, const char *name)
{
    if (!kv) return ak_set_error(AK_ERR_INVALID_ARG, "%s is NULL", name);
    if (!kv->k_data) return ak_set_error(AK_ERR_INVALID_ARG, "%s->k_data is NULL", name);
    /* v_data NULL: a K-only view, whose values are the first head_dim_vo of each K row */
    const int has_v = kv->v_data != NULL;
    const size_t esz = ak_dtype_size(kv->dtype);
    if (esz == 0)
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->dtype = %d is not a dtype", name, (int)kv->dtype);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s->", name);
    AK_TRY(ak_kv_scales_validate(kv->dtype, kv->num_kv_heads, kv->scale_kind, kv->k_scale, kv->v_scale, has_v,
                                 prefix, "scale_kind"));
    if (kv->layout != AK_LAYOUT_NHD && kv->layout != AK_LAYOUT_HND)
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->layout = %d is not a layout", name, kv->layout);
    if (kv->device.kind != AK_DEVICE_CPU && kv->device.kind != AK_DEVICE_CUDA)
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->device.kind = %d is not a device kind", name, kv->device.kind);
#define AK_POSITIVE_(field)                                                    \
    if (kv->field <= 0)                                                        \
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->" #field " = %d must be positive", name, kv->field);
    AK_POSITIVE_(num_blocks)
    AK_POSITIVE_(page_size)
    AK_POSITIVE_(num_kv_heads)
    AK_POSITIVE_(head_dim_qk)
    AK_POSITIVE_(head_dim_vo)
#undef AK_POSITIVE_
    if (!has_v && kv->head_dim_vo > kv->head_dim_qk)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "%s->head_dim_vo = %d is above head_dim_qk = %d, but v_data is NULL (a K-only view: "
                            "the value is the first head_dim_vo values of each K row)",
                            name, kv->head_dim_vo, kv->head_dim_qk);
    if ((uintptr_t)kv->marks % sizeof(uint32_t))
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->marks = %p is not 4-byte aligned (uint32 words)", name,
                            (void *)kv->marks);
    if (!has_v && kv->v_block_stride != 0)
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->v_block_stride = %lld, but v_data is NULL (a K-only view has no "
                            "V pool: 0)", name, (long long)kv->v_block_stride);
    /* a block's elements, and the pool's bytes (num_blocks blocks at the block
     * stride), must be int64: every address is block * stride + offset */
    const int64_t max_elems = INT64_MAX / (int64_t)esz;
    for (int is_v = 0; is_v < 1 + has_v; is_v++) {
        const char *field = is_v ? "v_block_stride" : "k_block_stride";
        const int64_t stride = is_v ? kv->v_block_stride : kv->k_block_stride;
        const int head_dim = is_v ? kv->head_dim_vo : kv->head_dim_qk;
        int64_t block, pool;
        if (__builtin_mul_overflow((int64_t)kv->page_size * kv->num_kv_heads, (int64_t)head_dim, &block) ||
            block > max_elems)
            return ak_set_error(AK_ERR_INVALID_ARG,
                                "%s->page_size = %d x num_kv_heads = %d x head_dim_%s = %d: a block of more than "
                                "int64 bytes",
                                name, kv->page_size, kv->num_kv_heads, is_v ? "vo" : "qk", head_dim);
        if (stride != 0 && stride < block)
            return ak_set_error(AK_ERR_INVALID_ARG, "%s->%s = %lld is below a block (%lld elements; 0 = packed)", name,
                                field, (long long)stride, (long long)block);
        if (__builtin_mul_overflow((int64_t)(kv->num_blocks - 1), stride ? stride : block, &pool) ||
            pool > max_elems - block)
            return ak_set_error(AK_ERR_INVALID_ARG,
                                "%s->%s = %lld: %d blocks span more than int64 bytes", name, field,
                                (long long)stride, kv->num_blocks);
    }
    return AK_OK;
}

static ak_status check_paged_kv(const ak_attn_config *cfg, const ak_limits *lim,
                                const ak_paged_kv *kv)
{
    if (!kv) return ak_set_error(AK_ERR_INVALID_ARG, "args.kv is NULL (paged storage)");
    if (cfg->mla && kv->v_data && kv->v_data != kv->k_data)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "args.kv->v_data is given (and is not k_data), but cfg.mla = 1 reads the value from "
                            "the K rows: pass a K-only view (v_data NULL)");
    if (!cfg->mla && !kv->v_data)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "args.kv->v_data is NULL: a K-only view serves cfg.mla = 1 only (multi-head latent "
                            "attention)");
    /* cfg.mla with v_data == k_data is a K-only view too: V's fields are not read */
    ak_paged_kv k_only;
    if (cfg->mla && kv->v_data) {
        k_only = *kv;
        k_only.v_data = NULL;
        k_only.v_block_stride = 0;
        k_only.v_scale = NULL;
        kv = &k_only;
    }
    AK_TRY(ak_paged_kv_validate(kv, "args.kv"));
    if (kv->dtype != cfg->kv_dtype)
        return ak_set_error(AK_ERR_INVALID_ARG, "args.kv->dtype = %s, expected cfg.kv_dtype = %s",
                            ak_dtype_name(kv->dtype), ak_dtype_name(cfg->kv_dtype));
    if (kv->layout != cfg->kv_layout)
        return ak_set_error(AK_ERR_INVALID_ARG, "args.kv->layout = %d, expected cfg.kv_layout = %d",
                            kv->layout, cfg->kv_layout);
    if (kv->device.kind != cfg->device.kind || kv->device.index != cfg->device.index)
        return ak_set_error(AK_ERR_INVALID_ARG, "args.kv->device does not match cfg.device");
    if (kv->page_size != cfg->page_size)
        return ak_set_error(AK_ERR_INVALID_ARG, "args.kv->page_size = %d, expected cfg.page_size = %d",
                            kv->page_size, cfg->page_size);
    if (kv->num_kv_heads != cfg->num_kv_heads)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "args.kv->num_kv_heads = %d, expected cfg.num_kv_heads = %d",
                            kv->num_kv_heads, cfg->num_kv_heads);
    if (kv->head_dim_qk != cfg->head_dim_qk || kv->head_dim_vo != cfg->head_dim_vo)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "args.kv head dims %d/%d, expected cfg.head_dim_qk/vo = %d/%d",
                            kv->head_dim_qk, kv->head_dim_vo, cfg->head_dim_qk, cfg->head_dim_vo);
    if (kv->num_blocks < lim->num_cache_blocks)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "args.kv->num_blocks = %d is below limits.num_cache_blocks = %d "
                            "(planned block ids could fall outside the cache)",
                            kv->num_blocks, lim->num_cache_blocks);
    return AK_OK;
}

ak_status ak_run_args_validate(const ak_attn_config *cfg, const ak_limits *lim, int num_tokens,
                               int64_t num_kv_tokens, const ak_run_args *args)
{
    if (!args) return ak_set_error(AK_ERR_INVALID_ARG, "args is NULL");
    if (args->struct_size != sizeof *args)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "args.struct_size = %u, expected %zu (call ak_run_args_init)",
                            args->struct_size, sizeof *args);
    const int64_t q_shape[3] = {num_tokens, cfg->num_qo_heads, cfg->head_dim_qk};
    const int64_t o_shape[3] = {num_tokens, cfg->num_qo_heads, cfg->head_dim_vo};
    const int64_t lse_shape[2] = {num_tokens, cfg->num_qo_heads};
    AK_TRY(check_tensor(args->q, "args.q", cfg->q_dtype, 3, q_shape));
    AK_TRY(check_tensor(args->o, "args.o", cfg->o_dtype, 3, o_shape));
    if (args->lse) AK_TRY(check_tensor(args->lse, "args.lse", AK_F32, 2, lse_shape));
    if (cfg->use_sinks) {
        const int64_t sinks_shape[1] = {cfg->num_qo_heads};
        AK_TRY(check_tensor(args->sinks, "args.sinks", AK_F32, 1, sinks_shape));
    } else if (args->sinks) {
        return ak_set_error(AK_ERR_INVALID_ARG, "args.sinks is given but cfg.use_sinks is 0");
    }
    if (cfg->kv_storage == AK_KV_PAGED) return check_paged_kv(cfg, lim, args->kv);
    const int64_t k_shape[3] = {num_kv_tokens, cfg->num_kv_heads, cfg->head_dim_qk};
    const int64_t v_shape[3] = {num_kv_tokens, cfg->num_kv_heads, cfg->head_dim_vo};
    AK_TRY(check_tensor(args->k, "args.k", cfg->kv_dtype, 3, k_shape));
    if (cfg->mla && args->v)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "args.v is given, but cfg.mla = 1 reads the value from the K rows: pass NULL");
    if (!cfg->mla) AK_TRY(check_tensor(args->v, "args.v", cfg->kv_dtype, 3, v_shape));
    return ak_kv_scales_validate(cfg->kv_dtype, cfg->num_kv_heads, args->kv_scale_kind, args->k_scale,
                                 args->v_scale, !cfg->mla, "args.", "kv_scale_kind");
}
