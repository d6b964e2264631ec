/*
 * kv_update.c - ak_kv_update: writes a step's new K/V rows at their slots.
 * The CPU path validates every slot before writing anything; the CUDA path is
 * a kernel (src/cuda/kv_update.cu).
 */
#include "internal.h"
#include "kv_addr.h"

#include <string.h>

static ak_status check_rows(const ak_tensor *t, const char *name, const ak_paged_kv *kv,
                            int num_tokens, int head_dim)
{
    AK_TRY(ak_tensor_validate(t, name));
    if (t->dtype != kv->dtype)
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->dtype = %s, expected kv->dtype = %s", name,
                            ak_dtype_name(t->dtype), ak_dtype_name(kv->dtype));
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

ak_status ak_kv_update(const ak_paged_kv *kv, const ak_tensor *k, const ak_tensor *v,
                       const int64_t *slot_mapping, int num_tokens, ak_stream stream)
{
    if (num_tokens < 0) return ak_set_error(AK_ERR_INVALID_ARG, "num_tokens = %d is negative", num_tokens);
    AK_TRY(ak_paged_kv_validate(kv, "kv"));
    AK_TRY(check_rows(k, "k", kv, num_tokens, kv->head_dim_qk));
    AK_TRY(check_rows(v, "v", kv, num_tokens, kv->head_dim_vo));
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

    const size_t esz = ak_dtype_size(kv->dtype);
    const ak_kv_strides ka = ak_paged_k_strides(kv), va = ak_paged_v_strides(kv);
    for (int i = 0; i < num_tokens; i++) {
        const int64_t slot = slot_mapping[i];
        if (slot < 0) continue;
        const int64_t block = slot / kv->page_size;
        const int off = (int)(slot % kv->page_size);
        for (int h = 0; h < kv->num_kv_heads; h++) {
            const char *ks = (const char *)k->data + (i * k->stride[0] + h * k->stride[1]) * esz;
            const char *vs = (const char *)v->data + (i * v->stride[0] + h * v->stride[1]) * esz;
            char *kd = (char *)kv->k_data + ak_kv_offset(ka, block, off, h) * esz;
            char *vd = (char *)kv->v_data + ak_kv_offset(va, block, off, h) * esz;
            memcpy(kd, ks, esz * (size_t)kv->head_dim_qk);
            memcpy(vd, vs, esz * (size_t)kv->head_dim_vo);
        }
    }
    return AK_OK;
}
