/*
 * ref.c - cpu_ref, the golden reference: plain attention, one query row at a
 * time, fp64 accumulation, every feature. Never optimised; every other backend
 * is tested against it.
 *
 * For query token i of request r (position p = kv_len - q_len + i) and query
 * head h (KV head g = h / (num_qo_heads / num_kv_heads)):
 *     s_j = sm_scale * q . k_j            for visible keys j
 *     s_j = cap * tanh(s_j / cap)         if soft-cap is on
 *     o   = sum_j exp(s_j - lse) v_j,  lse = log (sum_j exp(s_j) + exp(sink_h))
 * (the sink term only with cfg.use_sinks)
 * visible: j <= p when causal, and j >= p - window_left when windowed.
 * A row that sees a key is NaN (o and lse) when q, or the K or V row of a
 * key it sees, holds a NaN or an infinity (attnkit.h): in fp64 such an
 * element, and only such an element, makes a score s_j or an o_d not finite.
 * fp8 K/V are dequantized first, the definition: k = x * k_scale[g] and
 * v = x * v_scale[g] in fp64 (exact: 4 significant bits times 24), then the
 * same formulas; a NaN or infinite scale thus counts as a bad element.
 * Multi-head latent attention (cfg.mla): v_j is the first head_dim_vo values
 * of K row j (scaled, for fp8, by k_scale); no V pool or tensor is read.
 */
#include "backend.h"
#include "dtype.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref_state {
    ak_attn_config cfg;
    ak_limits lim;
    ak_batch_meta meta; /* the plan's metadata (the core's arrays) */
    int32_t *kv_lens;   /* [max_reqs] */
    int num_reqs;
    double *scores;     /* [max keys of one request] */
    int scores_cap;
} ref_state;

static int ref_check(const ak_attn_config *cfg, const ak_device_info *dev, ak_reasons *why)
{
    (void)cfg;
    (void)dev;
    return why->count;
}

static void ref_destroy(void *state)
{
    ref_state *s = state;
    if (!s) return;
    free(s->kv_lens);
    free(s->scores);
    free(s);
}

static ak_status ref_create(const ak_attn_config *cfg, const ak_limits *lim, void **out)
{
    ref_state *s = calloc(1, sizeof *s);
    if (!s) return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate cpu_ref state");
    s->cfg = *cfg;
    s->lim = *lim;
    s->kv_lens = malloc(sizeof(int32_t) * (size_t)lim->max_reqs);
    if (!s->kv_lens) {
        ref_destroy(s);
        return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate kv_lens");
    }
    *out = s;
    return AK_OK;
}

static ak_status ref_plan(void *state, const ak_batch *batch, const ak_batch_meta *meta, ak_stream stream)
{
    (void)stream;
    ref_state *s = state;
    int max_kv = 0;
    for (int r = 0; r < batch->num_reqs; r++) {
        s->kv_lens[r] = batch->kv_lens[r];
        if (batch->kv_lens[r] > max_kv) max_kv = batch->kv_lens[r];
    }
    /* the scores row is the only buffer sized by the batch; plan may allocate */
    if (max_kv > s->scores_cap) {
        double *p = realloc(s->scores, sizeof(double) * (size_t)max_kv);
        if (!p) return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate %d scores", max_kv);
        s->scores = p;
        s->scores_cap = max_kv;
    }
    s->meta = *meta;
    s->num_reqs = batch->num_reqs;
    return AK_OK;
}

/* Address of key/value j (0-based in the request) of KV head g. */
static const void *kv_row(const ref_state *s, const ak_run_args *a, int r, int j, int g, int is_v)
{
    /* MLA: a key's value is the start of its K row */
    if (s->cfg.mla) is_v = 0;
    const size_t esz = ak_dtype_size(s->cfg.kv_dtype);
    if (s->cfg.kv_storage == AK_KV_RAGGED) {
        const ak_tensor *t = is_v ? a->v : a->k;
        const int64_t row = s->meta.kv_indptr[r] + j;
        return (const char *)t->data + (row * t->stride[0] + g * t->stride[1]) * esz;
    }
    /* the layouts of ak_paged_kv as attnkit.h states them, written out here
     * rather than shared with the fast backends: the oracle stays independent */
    const ak_paged_kv *kv = a->kv;
    const int page = kv->page_size, dim = is_v ? kv->head_dim_vo : kv->head_dim_qk;
    /* a windowed plan's block list starts at the request's first visible block */
    const int first = s->meta.kv_first_block ? s->meta.kv_first_block[r] : 0;
    const int64_t block = s->meta.kv_indices[s->meta.kv_indptr[r] + j / page - first], slot = j % page;
    int64_t block_stride = is_v ? kv->v_block_stride : kv->k_block_stride;
    if (block_stride == 0) block_stride = (int64_t)page * kv->num_kv_heads * dim;
    const int64_t row = kv->layout == AK_LAYOUT_NHD ? slot * kv->num_kv_heads + g : (int64_t)g * page + slot;
    return (const char *)(is_v ? kv->v_data : kv->k_data) + (block * block_stride + row * dim) * esz;
}

/* The scale of KV head g's K (is_v = 0) or V values, as attnkit.h states it
 * (ak_kv_scale_kind): 1 unless fp8 K/V carry scales. */
static double kv_scale(const ref_state *s, const ak_run_args *a, int g, int is_v)
{
    const int ragged = s->cfg.kv_storage == AK_KV_RAGGED;
    const ak_kv_scale_kind kind = ragged ? a->kv_scale_kind : a->kv->scale_kind;
    if (s->cfg.mla) is_v = 0; /* the value is part of the K row, and so is its scale */
    const float *scale = ragged ? (is_v ? a->v_scale : a->k_scale) : (is_v ? a->kv->v_scale : a->kv->k_scale);
    if (kind == AK_KV_SCALE_NONE) return 1.0;
    return scale[kind == AK_KV_SCALE_PER_HEAD ? g : 0];
}

static ak_status ref_run(void *state, const ak_run_args *a, ak_stream stream)
{
    (void)stream;
    ref_state *s = state;
    const ak_attn_config *c = &s->cfg;
    const int group = c->num_qo_heads / c->num_kv_heads;
    double *sc = s->scores;
    for (int r = 0; r < s->num_reqs; r++) {
        const int q0 = s->meta.qo_indptr[r], q_len = s->meta.qo_indptr[r + 1] - q0;
        const int keys = s->kv_lens[r];
        for (int i = 0; i < q_len; i++) {
            const int t = q0 + i, p = keys - q_len + i;
            /* visible keys [lo, hi] */
            const int lo = c->window_left >= 0 && p > c->window_left ? p - c->window_left : 0;
            const int hi = c->causal && p < keys - 1 ? p : keys - 1;
            for (int h = 0; h < c->num_qo_heads; h++) {
                const int g = h / group;
                const double k_scale = kv_scale(s, a, g, 0), v_scale = kv_scale(s, a, g, 1);
                const void *q = (const char *)a->q->data +
                                (t * a->q->stride[0] + h * a->q->stride[1]) * ak_dtype_size(c->q_dtype);
                double m = -INFINITY;
                int bad = 0; /* a NaN or infinity met: the row is NaN */
                for (int j = lo; j <= hi; j++) {
                    const void *k = kv_row(s, a, r, j, g, 0);
                    double dot = 0.0;
                    for (int d = 0; d < c->head_dim_qk; d++)
                        dot += (double)ak_load_as_f32(q, c->q_dtype, d) * (ak_load_as_f32(k, c->kv_dtype, d) * k_scale);
                    double x = dot * c->sm_scale;
                    bad |= !isfinite(x); /* before the cap, which would make +-inf finite */
                    if (c->logits_soft_cap > 0.0f) x = c->logits_soft_cap * tanh(x / c->logits_soft_cap);
                    sc[j] = x;
                    if (x > m) m = x;
                }
                /* a sink is one more logit, with no value */
                const double sink = c->use_sinks ? ((const float *)a->sinks->data)[h] : -INFINITY;
                if (sink > m) m = sink;
                double denom = c->use_sinks && m > -INFINITY ? exp(sink - m) : 0.0;
                for (int j = lo; j <= hi; j++) denom += exp(sc[j] - m);
                void *o = (char *)a->o->data + (t * a->o->stride[0] + h * a->o->stride[1]) * ak_dtype_size(c->o_dtype);
                for (int d = 0; d < c->head_dim_vo; d++) {
                    double acc = 0.0;
                    for (int j = lo; j <= hi; j++)
                        acc += exp(sc[j] - m) * (ak_load_as_f32(kv_row(s, a, r, j, g, 1), c->kv_dtype, d) * v_scale);
                    bad |= !isfinite(acc);
                    ak_store_from_f32(o, c->o_dtype, d, denom > 0.0 ? (float)(acc / denom) : 0.0f);
                }
                for (int d = 0; d < c->head_dim_vo && bad; d++) ak_store_from_f32(o, c->o_dtype, d, NAN);
                if (a->lse)
                    ((float *)a->lse->data)[t * a->lse->stride[0] + h * a->lse->stride[1]] =
                        bad ? NAN : denom > 0.0 ? (float)(m + log(denom)) : -INFINITY;
            }
        }
    }
    return AK_OK;
}

static const int64_t *ref_slot_mapping(void *state) { return ((ref_state *)state)->meta.slot_mapping; }

const ak_backend_vtbl ak_backend_cpu_ref = {
    /* .api_version = */ AK_API_VERSION,
    /* .name = */ "cpu_ref",
    /* .device = */ AK_DEVICE_CPU,
    /* .forward_includes_kv_update = */ 0,
    /* .graph_support = */ AK_GRAPH_NEVER,
    /* .check = */ ref_check,
    /* .create = */ ref_create,
    /* .plan = */ ref_plan,
    /* .run = */ ref_run,
    /* .destroy = */ ref_destroy,
    /* .slot_mapping = */ ref_slot_mapping,
    /* .explain = */ NULL,      /* (optional) */
    /* .meta_buffers = */ NULL, /* (optional) the core's host arrays */
};
