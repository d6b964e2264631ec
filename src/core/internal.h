/*
 * internal.h - what the library's own files share: error reporting, reasons,
 * validation of the public structs, metadata capacity, device memory and the
 * CUDA services the core calls (src/cuda/service/). The backend protocol has
 * its own header, backend.h.
 * Never included by users (the public API is include/attnkit.h).
 */
#ifndef AK_INTERNAL_H
#define AK_INTERNAL_H

#include "attnkit.h"

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors -------------------------------------------------------------- */

/* Records a formatted message for ak_last_error() and returns s. */
ak_status ak_set_error(ak_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* ak_last_error()'s message, kept across an internal call whose failure
 * answers a question (a device probe) rather than failing the caller's call:
 * the last failed call's message stays what the caller reads. */
#define AK_ERROR_LEN 2048 /* ak_last_error()'s buffer, a thread's */
typedef struct ak_error_kept {
    char text[AK_ERROR_LEN];
} ak_error_kept;
void ak_error_keep(ak_error_kept *k /* OUT */);
void ak_error_restore(const ak_error_kept *k);

/* Propagates a failing status unchanged (its message is already recorded). */
#define AK_TRY(expr)                                                           \
    do {                                                                       \
        ak_status ak_try_s_ = (expr);                                          \
        if (ak_try_s_ != AK_OK) return ak_try_s_;                              \
    } while (0)

/* ---- reasons: why a backend cannot serve a config ------------------------ */

#define AK_MAX_REASONS 8
#define AK_REASON_LEN 160

typedef struct ak_reasons {
    int count;
    char text[AK_MAX_REASONS][AK_REASON_LEN];
} ak_reasons;

/* Appends one reason (dropped silently past AK_MAX_REASONS; count still grows). */
void ak_reason_add(ak_reasons *why, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- config and batch helpers ------------------------------------------- */

/* Checks cfg for what no backend could serve (head counts that don't divide,
 * non-positive sizes, unknown enums). Records the error naming the field. */
ak_status ak_config_validate(const ak_attn_config *cfg);
ak_status ak_limits_validate(const ak_limits *lim);
/* cfg with sm_scale resolved (0 -> 1/sqrt(head_dim_qk)). */
ak_attn_config ak_config_normalized(const ak_attn_config *cfg);

/* Checks one tensor on its own: not an invalid tensor from ak_tensor_*d (the
 * message names the dim), ndim in [1, AK_MAX_DIMS], no negative shape or
 * stride, and every element's byte offset within int64. `name` is the field
 * in messages ("args.q"). */
ak_status ak_tensor_validate(const ak_tensor *t, const char *name);

/* Checks one paged K/V view on its own (ak_kv_update and run() both call
 * it): data, dtype, layout, positive sizes, block strides 0 (packed) or at
 * least a block, and a pool that int64 addresses. A K-only view (v_data
 * NULL, MLA) has v_block_stride 0, no v_scale and head_dim_vo <=
 * head_dim_qk. `name` is the field in messages ("args.kv", "kv"). */
ak_status ak_paged_kv_validate(const ak_paged_kv *kv, const char *name);
/* The scales of fp8 K/V (attnkit.h, ak_kv_scale_kind): a known kind, none
 * unless dtype is fp8, both pointers given (float-aligned) exactly when the
 * kind says; has_v 0 (MLA: the value is read from the K rows) wants
 * v_scale NULL whatever the kind. Messages name prefix + kind_field /
 * k_scale / v_scale. */
ak_status ak_kv_scales_validate(ak_dtype dtype, int num_kv_heads, ak_kv_scale_kind kind, const float *k_scale,
                                const float *v_scale, int has_v, const char *prefix, const char *kind_field);

/* Checks the tensors of one run against cfg, the plan's token count and the
 * limits; names the field on failure. */
ak_status ak_run_args_validate(const ak_attn_config *cfg, const ak_limits *lim,
                               int num_tokens, int64_t num_kv_tokens,
                               const ak_run_args *args);

/* 1 if the batch names its block table by batch.device_block_table on a GPU
 * config (paged): the host cannot read it, so plan() builds no kv_indices or
 * slot mapping from it (the backend reads the table in place). */
int ak_batch_table_on_device(const ak_batch *b, const ak_attn_config *cfg);

/* Host metadata arrays sized by the limits, for backends that keep a host copy
 * of the plan (CPU backends; CUDA backends use pinned memory of the same shape). */
typedef struct ak_meta_capacity {
    int max_reqs;
    int max_tokens;
    int64_t max_kv_indices;
} ak_meta_capacity;
ak_meta_capacity ak_meta_capacity_of(const ak_limits *lim);

/* Allocates every array of meta on the host for cap (ak_meta_free releases). */
ak_status ak_meta_alloc_host(const ak_meta_capacity *cap, ak_batch_meta *meta);
void ak_meta_free_host(ak_batch_meta *meta);

/* ---- device memory and the CUDA side (src/cuda/runtime.cu) -------------- */

/* Allocates / frees memory on dev (host malloc for the CPU). */
ak_status ak_dev_malloc(ak_device dev, size_t bytes, void **out);
ak_status ak_dev_calloc(ak_device dev, size_t bytes, void **out); /* zeroed (CUDA: done on return) */
void ak_dev_free(ak_device dev, void *p);

#ifdef AK_HAVE_CUDA
int ak_cuda_device_count(void);
ak_status ak_cuda_get_info(int index, ak_device_info *info);
ak_status ak_cuda_malloc(int index, size_t bytes, void **out);
ak_status ak_cuda_zero(int index, void *p, size_t bytes); /* done on return (this thread's stream) */
void ak_cuda_free(int index, void *p);
ak_status ak_cuda_kv_update(const ak_paged_kv *kv, const ak_tensor *k, const ak_tensor *v,
                            const int64_t *slot_mapping, int num_tokens, ak_stream stream);
#endif

/* What the CPU offers the cpu backend's kernels (device.c, the one place
 * that asks): each 1 if the CPU has it and this process may use it. */
typedef struct ak_cpu_features {
    int avx2_fma_f16c; /* AVX2 + FMA + F16C */
    int avx512f;       /* AVX-512F (with the above) */
    int amx_bf16;      /* AMX-TILE + AMX-BF16 + AVX512BW + AVX512_BF16, tile state granted */
    int avx512_bf16;   /* AVX-512F + AVX512BW + AVX512_BF16 (VDPBF16PS) */
} ak_cpu_features;
ak_cpu_features ak_cpu_features_get(void);

/* Test support (tests and fuzz targets, never the library): sets the count of
 * an allocated block, so the overflow edge of ak_kv_cache_share is reached
 * without 2^31 calls. */
ak_status ak_kv_cache_debug_set_refcount(ak_kv_cache *cache, int32_t block_id, int32_t refs);

/* ---- small utilities ----------------------------------------------------- */

/* ceil(a / b) for a >= 0, b > 0. Not (a + b - 1) / b: that overflows for a
 * within b of the type's maximum (kv_len near INT32_MAX). */
static inline int ak_ceil_div(int a, int b) { return a / b + (a % b != 0); }
static inline int64_t ak_ceil_div64(int64_t a, int64_t b) { return a / b + (a % b != 0); }

#ifdef __cplusplus
}
#endif

#endif /* AK_INTERNAL_H */
