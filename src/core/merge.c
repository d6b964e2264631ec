/*
 * merge.c - ak_merge_states on the CPU: combines partial {o, lse} states with
 * the shared softmax-state algebra (softmax_state.h), and the rule of
 * attnkit.h for NaN and infinities.
 */
#include "dtype.h"
#include "internal.h"
#include "softmax_state.h"

#include <math.h>

static ak_status check_shape(const ak_tensor *t, const char *name, int ndim, const int64_t *shape)
{
    AK_TRY(ak_tensor_validate(t, name));
    int empty = 0; /* (an empty tensor, as run() takes them, may have no data) */
    for (int i = 0; i < t->ndim; i++) empty |= t->shape[i] == 0;
    if (!t->data && !empty) return ak_set_error(AK_ERR_INVALID_ARG, "%s->data is NULL", name);
    if (t->ndim != ndim)
        return ak_set_error(AK_ERR_INVALID_ARG, "%s->ndim = %d, expected %d", name, t->ndim, ndim);
    for (int i = 0; i < ndim; i++) {
        if (shape && t->shape[i] != shape[i])
            return ak_set_error(AK_ERR_INVALID_ARG, "%s->shape[%d] = %lld, expected %lld", name, i,
                                (long long)t->shape[i], (long long)shape[i]);
        if (t->shape[i] < 0 || t->stride[i] < 0)
            return ak_set_error(AK_ERR_INVALID_ARG, "%s->shape/stride[%d] is negative", name, i);
    }
    if (t->dtype == AK_FP8_E4M3 || ak_dtype_size(t->dtype) == 0)
        return ak_set_error(AK_ERR_UNSUPPORTED, "%s->dtype = %s is not supported", name,
                            ak_dtype_name(t->dtype));
    return AK_OK;
}

/* The lse of state i of (token t, head h), and element d of its v. */
static float state_lse(const ak_tensor *s, int64_t t, int64_t i, int64_t h)
{
    return ((const float *)s->data)[t * s->stride[0] + i * s->stride[1] + h * s->stride[2]];
}
static float state_v(const ak_tensor *v, int64_t t, int64_t i, int64_t h, int64_t d)
{
    return ak_load_as_f32(v->data, v->dtype, t * v->stride[0] + i * v->stride[1] + h * v->stride[2] + d * v->stride[3]);
}

ak_status ak_merge_states(const ak_tensor *v, const ak_tensor *s, ak_tensor *v_out,
                          ak_tensor *s_out, ak_device dev, ak_stream stream)
{
    (void)stream;
    if (dev.kind != AK_DEVICE_CPU)
        return ak_set_error(AK_ERR_UNSUPPORTED, "dev: ak_merge_states runs on the CPU only for now");
    AK_TRY(check_shape(v, "v", 4, NULL));
    const int64_t T = v->shape[0], S = v->shape[1], H = v->shape[2], D = v->shape[3];
    const int64_t s_shape[3] = {T, S, H}, vo_shape[3] = {T, H, D}, so_shape[2] = {T, H};
    AK_TRY(check_shape(s, "s", 3, s_shape));
    if (s->dtype != AK_F32) return ak_set_error(AK_ERR_INVALID_ARG, "s->dtype must be f32");
    AK_TRY(check_shape(v_out, "v_out", 3, vo_shape));
    if (s_out) {
        AK_TRY(check_shape(s_out, "s_out", 2, so_shape));
        if (s_out->dtype != AK_F32) return ak_set_error(AK_ERR_INVALID_ARG, "s_out->dtype must be f32");
    }
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < H; h++) {
            /* a NaN (or +inf) lse anywhere makes lse NaN; a NaN or infinity in
             * the v of a state that is not empty makes the row NaN (attnkit.h);
             * an empty state (lse -inf) is never read */
            float lse = -INFINITY;
            for (int64_t i = 0; i < S; i++) lse = ak_lse_add(lse, state_lse(s, t, i, h));
            int bad = isnan(lse);
            for (int64_t i = 0; i < S && !bad; i++)
                for (int64_t d = 0; d < D && state_lse(s, t, i, h) != -INFINITY && !bad; d++)
                    bad = !isfinite(state_v(v, t, i, h, d));
            for (int64_t d = 0; d < D; d++) {
                float acc = bad ? NAN : 0.0f;
                for (int64_t i = 0; i < S && !bad; i++)
                    if (state_lse(s, t, i, h) != -INFINITY)
                        acc += ak_lse_weight(state_lse(s, t, i, h), lse) * state_v(v, t, i, h, d);
                ak_store_from_f32(v_out->data, v_out->dtype,
                                  t * v_out->stride[0] + h * v_out->stride[1] + d * v_out->stride[2], acc);
            }
            if (s_out) ((float *)s_out->data)[t * s_out->stride[0] + h * s_out->stride[1]] = bad ? NAN : lse;
        }
    }
    return AK_OK;
}
