/*
 * kv_update.c - ak_kv_update: writes a step's new K/V rows at their slots.
 * The CPU path validates every slot before writing anything, then copies
 * rows (or, into fp8 pools, quantizes them with the view's scales); the CUDA
 * path is a kernel (src/cuda/service/kv_update.cu). A K-only view (v_data
 * NULL: multi-head latent attention, whose value is part of the K row)
 * takes no v and writes K alone.
 */
#include "dtype.h"
#include "internal.h"
#include "kv_addr.h"

#include <math.h>
#include <string.h>

/* The dtype the rows of k and v may have: the pool's, or for an fp8 pool
 * also f32, f16 or bf16 (quantized as they are written). */
static int row_dtype_ok(ak_dtype rows, ak_dtype pool)
{
    return rows == pool || (pool == AK_FP8_E4M3 && (rows == AK_F32 || rows == AK_F16 || rows == AK_BF16));
}

static ak_status check_rows(const ak_tensor *t, const char *name, const ak_paged_kv *kv,
                            int num_tokens, int head_dim)
{
    AK_TRY(ak_tensor_validate(t, name));
    if (!row_dtype_ok(t->dtype, kv->dtype))
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->dtype = %s, expected kv->dtype = %s%s", name,
                            ak_dtype_name(t->dtype), ak_dtype_name(kv->dtype),
                            kv->dtype == AK_FP8_E4M3 ? " (or f32, f16, bf16 to quantize)" : "");
    const int64_t want[3] = {num_tokens, kv->num_kv_heads, head_dim};
    if (t->ndim != 3)
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->ndim = %d, expected 3", name, t->ndim);
    for (int i = 0; i < 3; i++)
        if (t->shape[i] != want[i])
            return ak_set_error(AK_ERR_INVALID_ARG, "%s->shape[%d] = %lld, expected %lld", name, i,
                                (long long)t->shape[i], (long long)want[i]);
    if (t->stride[2] != 1 || t->stride[0] < 0 || t->stride[1] < 0)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "%s strides must be non-negative with stride[2] = 1", name);
    if (num_tokens > 0 && !t->data) return ak_set_error(AK_ERR_INVALID_ARG, "%s->data is NULL", name);
    return AK_OK;
}

/* dst[0, n) = src[0, n) of dtype t quantized to e4m3 with `scale`. */
/* One row of n elements into the pool: a copy, or (rows of another dtype
 * into an fp8 pool) quantized with head h's scale. */
static void write_row(char *dst, const char *src, ak_dtype src_dtype, const ak_paged_kv *kv, const float *scales,
                      int h, int n)
{
    if (src_dtype == kv->dtype) {
        memcpy(dst, src, ak_dtype_size(kv->dtype) * (size_t)n);
        return;
    }
    const float scale = ak_kv_scale_at(kv->scale_kind, scales, h);
    for (int d = 0; d < n; d++) ((uint8_t *)dst)[d] = ak_e4m3_quantize(ak_load_as_f32(src, src_dtype, d), scale);
}

int64_t ak_kv_marks_words(int num_blocks, int num_kv_heads, int page_size)
{
    int64_t words;
    if (num_blocks <= 0 || num_kv_heads <= 0 || page_size <= 0 ||
        __builtin_mul_overflow((int64_t)num_blocks * num_kv_heads, ak_kv_mark_words_per_head(page_size), &words))
        return -1;
    return words;
}

/* Whether any of the n elements of a pool row (of the pool's dtype) is NaN
 * or infinite (fp8: the NaN byte). */
static int row_nonfinite(const char *row, ak_dtype dtype, int n)
{
    for (int d = 0; d < n; d++)
        if (!isfinite(ak_load_as_f32(row, dtype, d))) return 1;
    return 0;
}

ak_status ak_kv_update(const ak_paged_kv *kv, const ak_tensor *k, const ak_tensor *v,
                       const int64_t *slot_mapping, int num_tokens, ak_stream stream)
{
    if (num_tokens < 0) return ak_set_error(AK_ERR_INVALID_ARG, "num_tokens = %d is negative", num_tokens);
    AK_TRY(ak_paged_kv_validate(kv, "kv"));
    AK_TRY(check_rows(k, "k", kv, num_tokens, kv->head_dim_qk));
    const int has_v = kv->v_data != NULL;
    if (!has_v && v)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "v is given, but kv->v_data is NULL: a K-only view (MLA) holds the value in the K "
                            "rows, so v must be NULL");
    if (has_v && !v)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "v is NULL, but kv->v_data is given: pass v (only a K-only view, v_data NULL, "
                            "takes no v)");
    if (has_v) AK_TRY(check_rows(v, "v", kv, num_tokens, kv->head_dim_vo));
    if (has_v && k->dtype != v->dtype)
        return ak_set_error(AK_ERR_INVALID_ARG, "k->dtype = %s but v->dtype = %s: one dtype for both",
                            ak_dtype_name(k->dtype), ak_dtype_name(v->dtype));
    if (num_tokens > 0 && !slot_mapping)
        return ak_set_error(AK_ERR_INVALID_ARG, "slot_mapping is NULL");
    if (num_tokens == 0) return AK_OK;

    if (kv->device.kind == AK_DEVICE_CUDA) {
#ifdef AK_HAVE_CUDA
        return ak_cuda_kv_update(kv, k, v, slot_mapping, num_tokens, stream);
#else
        (void)stream;
        return ak_set_error(AK_ERR_NO_DEVICE, "kv->device is CUDA but attnkit was built without CUDA");
#endif
    }
    (void)stream;
    const int64_t num_slots = (int64_t)kv->num_blocks * kv->page_size;
    for (int i = 0; i < num_tokens; i++)
        if (slot_mapping[i] < -1 || slot_mapping[i] >= num_slots)
            return ak_set_error(AK_ERR_INVALID_ARG,
                                "slot_mapping[%d] = %lld is out of range [-1, %lld)", i,
                                (long long)slot_mapping[i], (long long)num_slots);

    const size_t src_esz = ak_dtype_size(k->dtype), dst_esz = ak_dtype_size(kv->dtype);
    const ak_kv_strides ka = ak_paged_k_strides(kv), va = ak_paged_v_strides(kv);
    for (int i = 0; i < num_tokens; i++) {
        const int64_t slot = slot_mapping[i];
        if (slot < 0) continue;
        const int64_t block = slot / kv->page_size;
        const int off = (int)(slot % kv->page_size);
        for (int h = 0; h < kv->num_kv_heads; h++) {
            char *kd = (char *)kv->k_data + ak_kv_offset(ka, block, off, h) * dst_esz;
            char *vd = has_v ? (char *)kv->v_data + ak_kv_offset(va, block, off, h) * dst_esz : NULL;
            write_row(kd, (const char *)k->data + (i * k->stride[0] + h * k->stride[1]) * src_esz, k->dtype, kv,
                      kv->k_scale, h, kv->head_dim_qk);
            if (has_v)
                write_row(vd, (const char *)v->data + (i * v->stride[0] + h * v->stride[1]) * src_esz, v->dtype,
                          kv, kv->v_scale, h, kv->head_dim_vo);
            if (kv->marks) { /* the slot's bit, by the rows as stored */
                const int bad = row_nonfinite(kd, kv->dtype, kv->head_dim_qk) ||
                                (has_v && row_nonfinite(vd, kv->dtype, kv->head_dim_vo));
                uint32_t *w = kv->marks + ak_kv_mark_word(block, kv->num_kv_heads, h, kv->page_size, off);
                /* (atomic: calls that write other slots of the word may run at once) */
                if (bad) __atomic_fetch_or(w, 1u << (off % 32), __ATOMIC_RELAXED);
                else __atomic_fetch_and(w, ~(1u << (off % 32)), __ATOMIC_RELAXED);
            }
        }
    }
    return AK_OK;
}
