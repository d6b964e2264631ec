/*
 * test_bad_input.c - the bad-input table. Each case breaks one thing; the call
 * must return the expected status, the message must name the field, and no
 * output or cache byte may change. A case runs on a paged baseline, or on a
 * ragged one (contiguous K/V) for backends that read only ragged K/V and for
 * the cases about the ragged tensors.
 */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum where { AT_CREATE, AT_PLAN, AT_RUN, AT_KV_UPDATE } where;

/* The K/V storage a case is about. */
typedef enum kv_need {
    KV_EITHER = 0, /* the backend's baseline: paged if it reads a cache, else ragged */
    KV_PAGED = 1,  /* the paged cache, block table, slots: backends that read a cache */
    KV_RAGGED = 2, /* the ragged K/V tensors: backends that read them */
} kv_need;

/* Everything a bad case may break, copied from a valid baseline. */
typedef struct inputs {
    ak_attn_config cfg;
    ak_limits lim;
    const char *name;   /* backend name passed to create (NULL = selector) */
    ak_batch batch;
    int32_t qo[8], kvl[8], bt[8 * 8];
    ak_run_args args;
    ak_tensor q, o, lse;
    ak_tensor k, v;     /* ragged K/V */
    ak_paged_kv kv;
    int64_t slots[8];   /* kv_update slot mapping (host copy) */
    int num_new;        /* kv_update tokens */
    int update_v;       /* kv_update is given v (0 on a K-only MLA baseline) */
} inputs;

typedef struct bad_case {
    const char *name;
    where at;
    ak_status expect;
    const char *field; /* must appear in ak_last_error() */
    void (*breaks)(inputs *in);
    kv_need kv;
    const char *only;  /* run only on backends whose name starts with this (NULL: all) */
    int fp8;           /* 1: on an fp8 baseline (K/V fp8_e4m3 with per-head scales) */
    int mla;           /* 1: on an MLA baseline (one KV head, a K-only cache, no ragged V) */
    int has_v;         /* 1: the case is about V (or two KV heads): not on the MLA baseline a
                          backend serving MLA only (cuda_mla) runs the other cases on */
} bad_case;

static void qo_not_monotone(inputs *in) { in->qo[2] = in->qo[1] - 1; }
static void qo_not_zero(inputs *in) { in->qo[0] = 1; }
static void q_longer_than_kv(inputs *in) { in->kvl[1] = (in->qo[2] - in->qo[1]) - 1; }
static void kv_beyond_blocks(inputs *in) { in->kvl[0] = in->batch.block_table_stride * in->cfg.page_size + 1; }
static void block_id_high(inputs *in) { in->bt[1] = in->lim.num_cache_blocks; }
static void block_id_negative(inputs *in) { in->bt[in->batch.block_table_stride] = -1; }
static void kv_negative(inputs *in) { in->kvl[2] = -3; }
static void decode_gets_prefill(inputs *in) { in->cfg.workload = AK_WORKLOAD_DECODE; }
static void too_many_reqs(inputs *in) { in->lim.max_reqs = 2; }
static void too_many_tokens(inputs *in) { in->lim.max_tokens = in->qo[3] - 1; }
static void too_many_blocks(inputs *in) { in->lim.max_blocks_per_req = 1; }
static void heads_dont_divide(inputs *in) { in->cfg.num_qo_heads = 6; in->cfg.num_kv_heads = 4; }
static void head_dim_zero(inputs *in) { in->cfg.head_dim_qk = 0; }
static void head_dim_huge(inputs *in) { in->cfg.head_dim_vo = 4096; }
static void unknown_backend(inputs *in) { in->name = "nope"; }
static void misspelt_backend(inputs *in) { in->name = "cpu_rf"; }
static void page_size_zero(inputs *in) { in->cfg.page_size = 0; }
static void limits_zero(inputs *in) { in->lim.max_reqs = 0; }
static void q_wrong_tokens(inputs *in) { in->q.shape[0] += 1; }
/* MLA's q is 576 wide: an engine passing q_nope alone (512) is the mistake */
static void q_narrow(inputs *in) { in->q.shape[2] -= 64; }
static void o_wide(inputs *in) { in->o.shape[2] += 64; }
static void q_wrong_dtype(inputs *in) { in->q.dtype = in->q.dtype == AK_F32 ? AK_F16 : AK_F32; }
static void o_wrong_heads(inputs *in) { in->o.shape[1] = 3; }
static void o_inner_stride(inputs *in) { in->o.stride[2] = 2; }
static void lse_wrong_dtype(inputs *in) { in->lse.dtype = AK_BF16; }
static void kv_view_small(inputs *in) { in->kv.num_blocks = in->lim.num_cache_blocks - 1; }
static void kv_view_page(inputs *in) { in->kv.page_size *= 2; }
static void kv_missing(inputs *in) { in->args.kv = NULL; }
static void slot_out_of_range(inputs *in) { in->slots[1] = (int64_t)in->kv.num_blocks * in->kv.page_size; }
static void slot_negative(inputs *in) { in->slots[0] = -2; }
static void k_missing(inputs *in) { in->args.k = NULL; }
static void v_wrong_tokens(inputs *in) { in->v.shape[0] -= 1; }
static void k_wrong_dtype(inputs *in) { in->k.dtype = in->k.dtype == AK_F32 ? AK_F16 : AK_F32; }
static void v_head_stride_differs(inputs *in) { in->v.stride[1] = 2 * in->k.stride[1]; }
static const float some_scales[2] = {1.0f, 1.0f};
static void q_fp8(inputs *in) { in->cfg.q_dtype = AK_FP8_E4M3; }
static void o_fp8(inputs *in) { in->cfg.o_dtype = AK_FP8_E4M3; }
static void kv_k_scale_null(inputs *in) { in->kv.k_scale = NULL; }
static void kv_v_scale_null(inputs *in) { in->kv.v_scale = NULL; }
static void kv_scale_kind_unknown(inputs *in) { in->kv.scale_kind = (ak_kv_scale_kind)7; }
static void kv_scale_misaligned(inputs *in) { in->kv.k_scale = (const float *)((const char *)in->kv.k_scale + 1); }
static void kv_marks_misaligned(inputs *in) { in->kv.marks = (uint32_t *)((char *)in->kv.k_data + 2); }
static void kv_scale_without_kind(inputs *in) { in->kv.scale_kind = AK_KV_SCALE_NONE; }
static void kv_scales_not_fp8(inputs *in)
{
    in->kv.scale_kind = AK_KV_SCALE_PER_LAYER;
    in->kv.k_scale = in->kv.v_scale = some_scales;
}
static void ragged_v_scale_null(inputs *in) { in->args.v_scale = NULL; }
static void ragged_k_scale_without_kind(inputs *in) { in->args.k_scale = some_scales; }
static void mla_not_bool(inputs *in) { in->cfg.mla = 2; }
static void mla_two_kv_heads(inputs *in) { in->cfg.mla = 1; }
static void mla_vo_above_qk(inputs *in)
{
    in->cfg.mla = 1;
    in->cfg.num_kv_heads = 1;
    in->cfg.head_dim_vo = in->cfg.head_dim_qk + 8;
}
/* a V pool (any other memory: the call must refuse before reading it) */
static void mla_v_pool(inputs *in) { in->kv.v_data = in->o.data; }
static void mla_ragged_v(inputs *in) { in->args.v = &in->k; }
static void mla_update_with_v(inputs *in) { in->update_v = 1; }
static void v_pool_missing(inputs *in) { in->kv.v_data = NULL; }
static void update_without_v(inputs *in) { in->update_v = 0; }
static void mla_v_scale(inputs *in) { in->kv.v_scale = in->kv.k_scale; }

static const bad_case cases[] = {
    {"non-monotone qo_indptr", AT_PLAN, AK_ERR_INVALID_ARG, "qo_indptr", qo_not_monotone, KV_EITHER, NULL},
    {"qo_indptr[0] != 0", AT_PLAN, AK_ERR_INVALID_ARG, "qo_indptr[0]", qo_not_zero, KV_EITHER, NULL},
    {"q_len > kv_len", AT_PLAN, AK_ERR_INVALID_ARG, "kv_lens[1]", q_longer_than_kv, KV_EITHER, NULL},
    {"kv_len beyond the blocks given", AT_PLAN, AK_ERR_INVALID_ARG, "kv_lens[0]", kv_beyond_blocks, KV_PAGED, NULL},
    {"block id >= num_cache_blocks", AT_PLAN, AK_ERR_INVALID_ARG, "block_table[0][1]", block_id_high, KV_PAGED, NULL},
    {"negative block id", AT_PLAN, AK_ERR_INVALID_ARG, "block_table[1][0]", block_id_negative, KV_PAGED, NULL},
    {"negative kv_len", AT_PLAN, AK_ERR_INVALID_ARG, "kv_lens[2]", kv_negative, KV_EITHER, NULL},
    {"decode instance given a chunk", AT_PLAN, AK_ERR_INVALID_ARG, "cfg.workload", decode_gets_prefill, KV_EITHER, NULL},
    {"more requests than limits", AT_PLAN, AK_ERR_LIMIT_EXCEEDED, "max_reqs", too_many_reqs, KV_EITHER, NULL},
    {"more tokens than limits", AT_PLAN, AK_ERR_LIMIT_EXCEEDED, "max_tokens", too_many_tokens, KV_EITHER, NULL},
    {"more blocks than limits", AT_PLAN, AK_ERR_LIMIT_EXCEEDED, "max_blocks_per_req", too_many_blocks, KV_PAGED, NULL},
    {"head counts don't divide", AT_CREATE, AK_ERR_INVALID_ARG, "num_qo_heads", heads_dont_divide, KV_EITHER, NULL},
    {"head dim 0", AT_CREATE, AK_ERR_UNSUPPORTED, "head_dim_qk", head_dim_zero, KV_EITHER, NULL},
    {"head dim 4096", AT_CREATE, AK_ERR_UNSUPPORTED, "head_dim_vo", head_dim_huge, KV_EITHER, NULL},
    {"unknown backend name", AT_CREATE, AK_ERR_BACKEND_NOT_FOUND, "cpu_ref", unknown_backend, KV_EITHER, NULL},
    {"misspelt backend name", AT_CREATE, AK_ERR_BACKEND_NOT_FOUND, "names no backend (did you mean cpu_ref?)",
     misspelt_backend, KV_EITHER, NULL},
    {"page size 0", AT_CREATE, AK_ERR_INVALID_ARG, "page_size", page_size_zero, KV_PAGED, NULL},
    {"limits.max_reqs 0", AT_CREATE, AK_ERR_INVALID_ARG, "max_reqs", limits_zero, KV_EITHER, NULL},
    {"q has the wrong token count", AT_RUN, AK_ERR_INVALID_ARG, "args.q->shape[0]", q_wrong_tokens, KV_EITHER, NULL},
    {"q rows 64 narrower than head_dim_qk", AT_RUN, AK_ERR_INVALID_ARG, "args.q->shape[2]", q_narrow, KV_EITHER,
     NULL},
    {"o rows 64 wider than head_dim_vo", AT_RUN, AK_ERR_INVALID_ARG, "args.o->shape[2]", o_wide, KV_EITHER, NULL},
    {"q has the wrong dtype", AT_RUN, AK_ERR_INVALID_ARG, "args.q->dtype", q_wrong_dtype, KV_EITHER, NULL},
    {"o has the wrong head count", AT_RUN, AK_ERR_INVALID_ARG, "args.o->shape[1]", o_wrong_heads, KV_EITHER, NULL},
    {"o inner stride != 1", AT_RUN, AK_ERR_INVALID_ARG, "args.o->stride[2]", o_inner_stride, KV_EITHER, NULL},
    {"lse not f32", AT_RUN, AK_ERR_INVALID_ARG, "args.lse->dtype", lse_wrong_dtype, KV_EITHER, NULL},
    {"cache view smaller than limits", AT_RUN, AK_ERR_INVALID_ARG, "num_blocks", kv_view_small, KV_PAGED, NULL},
    {"cache view page size differs", AT_RUN, AK_ERR_INVALID_ARG, "page_size", kv_view_page, KV_PAGED, NULL},
    {"no cache given", AT_RUN, AK_ERR_INVALID_ARG, "args.kv", kv_missing, KV_PAGED, NULL},
    {"slot beyond the cache", AT_KV_UPDATE, AK_ERR_INVALID_ARG, "slot_mapping[1]", slot_out_of_range, KV_PAGED, NULL},
    {"slot below -1", AT_KV_UPDATE, AK_ERR_INVALID_ARG, "slot_mapping[0]", slot_negative, KV_PAGED, NULL},
    {"ragged: no k tensor", AT_RUN, AK_ERR_INVALID_ARG, "args.k", k_missing, KV_RAGGED, NULL},
    {"ragged: v has the wrong token count", AT_RUN, AK_ERR_INVALID_ARG, "args.v->shape[0]", v_wrong_tokens,
     KV_RAGGED, NULL, 0, 0, 1},
    {"ragged: k has the wrong dtype", AT_RUN, AK_ERR_INVALID_ARG, "args.k->dtype", k_wrong_dtype, KV_RAGGED, NULL},
    /* the CUDA loader keeps one head offset for K and V */
    {"ragged: v head stride differs from k's", AT_RUN, AK_ERR_INVALID_ARG, "args.v->stride[1]",
     v_head_stride_differs, KV_RAGGED, "cuda", 0, 0, 1},
    /* fp8: q and o stay 16/32-bit; scales exactly as the kind says */
    {"q in fp8", AT_CREATE, AK_ERR_UNSUPPORTED, "cfg.q_dtype", q_fp8, KV_EITHER, NULL},
    {"o in fp8", AT_CREATE, AK_ERR_UNSUPPORTED, "cfg.o_dtype", o_fp8, KV_EITHER, NULL},
    {"scales on a view that is not fp8", AT_RUN, AK_ERR_INVALID_ARG, "args.kv->scale_kind", kv_scales_not_fp8,
     KV_PAGED, NULL},
    {"scales on a pool that is not fp8", AT_KV_UPDATE, AK_ERR_INVALID_ARG, "kv->scale_kind", kv_scales_not_fp8,
     KV_PAGED, NULL},
    {"ragged: k_scale without a kind", AT_RUN, AK_ERR_INVALID_ARG, "args.k_scale", ragged_k_scale_without_kind,
     KV_RAGGED, NULL},
    {"fp8: per-head k_scale NULL", AT_RUN, AK_ERR_INVALID_ARG, "args.kv->k_scale", kv_k_scale_null, KV_PAGED, NULL,
     1},
    {"fp8: kv_update with v_scale NULL", AT_KV_UPDATE, AK_ERR_INVALID_ARG, "kv->v_scale", kv_v_scale_null, KV_PAGED,
     NULL, 1, 0, 1},
    {"fp8: unknown scale kind", AT_RUN, AK_ERR_INVALID_ARG, "args.kv->scale_kind", kv_scale_kind_unknown, KV_PAGED,
     NULL, 1},
    {"fp8: kv_update scale not float-aligned", AT_KV_UPDATE, AK_ERR_INVALID_ARG, "kv->k_scale", kv_scale_misaligned,
     KV_PAGED, NULL, 1},
    {"fp8: scale pointers with kind none", AT_RUN, AK_ERR_INVALID_ARG, "args.kv->k_scale", kv_scale_without_kind,
     KV_PAGED, NULL, 1},
    {"fp8: ragged v_scale NULL", AT_RUN, AK_ERR_INVALID_ARG, "args.v_scale", ragged_v_scale_null, KV_RAGGED, NULL,
     1, 0, 1},
    /* multi-head latent attention: one KV head, value <= key, and no V anywhere */
    {"mla = 2", AT_CREATE, AK_ERR_INVALID_ARG, "cfg.mla", mla_not_bool, KV_EITHER, NULL},
    {"mla with 2 KV heads", AT_CREATE, AK_ERR_INVALID_ARG, "cfg.num_kv_heads", mla_two_kv_heads, KV_EITHER, NULL, 0,
     0, 1},
    {"mla with head_dim_vo > head_dim_qk", AT_CREATE, AK_ERR_INVALID_ARG, "cfg.head_dim_vo", mla_vo_above_qk,
     KV_EITHER, NULL},
    {"mla: a V pool in the view", AT_RUN, AK_ERR_INVALID_ARG, "args.kv->v_data", mla_v_pool, KV_PAGED, NULL, 0, 1},
    {"mla: ragged v given", AT_RUN, AK_ERR_INVALID_ARG, "args.v", mla_ragged_v, KV_RAGGED, NULL, 0, 1},
    {"mla: kv_update with v on a K-only view", AT_KV_UPDATE, AK_ERR_INVALID_ARG, "kv->v_data", mla_update_with_v,
     KV_PAGED, NULL, 0, 1},
    {"mla fp8: v_scale on a K-only view", AT_RUN, AK_ERR_INVALID_ARG, "args.kv->v_scale", mla_v_scale, KV_PAGED,
     NULL, 1, 1},
    {"K-only view without cfg.mla", AT_RUN, AK_ERR_INVALID_ARG, "args.kv->v_data", v_pool_missing, KV_PAGED, NULL, 0,
     0, 1},
    {"finiteness marks not 4-byte aligned", AT_RUN, AK_ERR_INVALID_ARG, "args.kv->marks", kv_marks_misaligned,
     KV_PAGED, NULL},
    {"kv_update: finiteness marks not 4-byte aligned", AT_KV_UPDATE, AK_ERR_INVALID_ARG, "kv->marks",
     kv_marks_misaligned, KV_PAGED, NULL},
    {"kv_update without v on a view with V", AT_KV_UPDATE, AK_ERR_INVALID_ARG, "v is NULL", update_without_v,
     KV_PAGED, NULL, 0, 0, 1},
};

/* A small valid baseline: 3 requests (decode, chunk, prefill), 8 heads / 2;
 * for a backend that serves decode only, three decodes. The same on ragged
 * K/V for the backends (and cases) that read ragged tensors. */
static const attn_case baseline = {
    "bad-input baseline", 8, 2, 64, 64, AK_F32, 0, 0, 1, -1, 0, 16, AK_LAYOUT_NHD, AK_KV_PAGED, 3,
    {{1, 40}, {5, 20}, {6, 6}}};
static const attn_case decode_baseline = {
    "bad-input decode baseline", 8, 2, 64, 64, AK_F32, 0, 0, 1, -1, 0, 16, AK_LAYOUT_NHD, AK_KV_PAGED, 3,
    {{1, 40}, {1, 20}, {1, 6}}};
/* MLA: head dims 64/64 keep o's shape the baselines' (the value is the whole K row) */
static const attn_case mla_baseline = {
    "bad-input mla baseline", 8, 1, 64, 64, AK_F32, 0, 0, 1, -1, 0, 16, AK_LAYOUT_NHD, AK_KV_PAGED, 3,
    {{1, 40}, {5, 20}, {6, 6}}, .mla = 1};
/* DeepSeek's 576/512: for a backend that serves MLA at those dims only
 * (cuda_mla), every case but those about V runs on it */
static const attn_case mla_wide_baseline = {
    "bad-input mla 576/512 baseline", 8, 1, 576, 512, AK_F32, 0, 0, 1, -1, 0, 16, AK_LAYOUT_NHD, AK_KV_PAGED, 3,
    {{1, 40}, {5, 20}, {6, 6}}, .mla = 1};

/* 0 when backend `name` reports cfg unsupported, else 1 (any other failure
 * is left for the case itself to show). */
static int serves(const attn_case *tc, ak_device dev, const char *name)
{
    const ak_attn_config cfg = case_config(tc, dev);
    ak_limits lim;
    ak_limits_init(&lim);
    ak_backend *b = NULL;
    const ak_status st = ak_backend_create(&cfg, &lim, name, &b);
    ak_backend_destroy(b);
    return st != AK_ERR_UNSUPPORTED;
}

/* The baseline of `storage` that backend `name` serves on the device under
 * test (the mixed batch, else the decode one); -1 if it serves neither. */
static int baseline_of(const test_ctx *t, const char *name, ak_kv_storage storage, int fp8, int mla,
                       attn_case *out)
{
    const attn_case *const tries[3] = {mla ? &mla_baseline : &baseline, mla ? &mla_wide_baseline : &decode_baseline,
                                       &mla_wide_baseline};
    for (int i = 0; i < 3 - mla; i++) {
        attn_case tc = *tries[i];
        if (t->device.kind == AK_DEVICE_CUDA) tc.dtype = AK_BF16;
        tc.kv_fp8 = fp8;
        tc.kv_scale = fp8 ? AK_KV_SCALE_PER_HEAD : AK_KV_SCALE_NONE;
        tc.storage = storage;
        if (storage == AK_KV_RAGGED) tc.page_size = 0;
        if (serves(&tc, t->device, name)) {
            *out = tc;
            return 0;
        }
    }
    return -1;
}

/* The baseline a case runs on for backend `name`; -1 (and why) when the
 * backend does not read the storage the case is about. */
static int pick_baseline(const test_ctx *t, const char *name, const bad_case *bc, attn_case *tc, const char **why)
{
    const int paged = bc->kv != KV_RAGGED && baseline_of(t, name, AK_KV_PAGED, bc->fp8, bc->mla, tc) == 0;
    if (paged) return 0;
    if (bc->kv == KV_PAGED) {
        *why = "reads no paged cache";
        return -1;
    }
    if (baseline_of(t, name, AK_KV_RAGGED, bc->fp8, bc->mla, tc) == 0) return 0;
    *why = bc->kv == KV_RAGGED ? "reads no ragged K/V" : "serves neither baseline";
    return -1;
}

static uint64_t checksum(ak_device dev, const void *p, size_t bytes)
{
    unsigned char *h = malloc(bytes);
    dev_copy_from(dev, h, p, bytes);
    uint64_t x = 1469598103934665603ull;
    for (size_t i = 0; i < bytes; i++) x = (x ^ h[i]) * 1099511628211ull;
    free(h);
    return x;
}

static void run_bad(test_ctx *t, const char *backend, const bad_case *bc)
{
    if (!t_selected(t, bc->name)) return;
    if (bc->only && strncmp(backend, bc->only, strlen(bc->only)) != 0) return;
    attn_case tc;
    const char *why = "";
    if (pick_baseline(t, backend, bc, &tc, &why)) {
        t_skip(t, backend, bc->name, "%s", why);
        return;
    }
    if (tc.mla && !bc->mla && bc->has_v) {
        t_skip(t, backend, bc->name, "serves MLA only, and the case is about V");
        return;
    }
    if (!t_storage_selected(t, tc.storage)) return;
    const int ragged = tc.storage == AK_KV_RAGGED;
    if (bc->breaks == decode_gets_prefill && tc.reqs[1].q_len == 1) {
        t_skip(t, backend, bc->name, "the baseline is already a decode batch");
        return;
    }
    uint64_t rng = t->seed ^ scn_name_hash(bc->name);
    scene sc;
    if (scene_build(&sc, &tc, t->device, &rng)) {
        t_fail(t, backend, bc->name, "cannot build the scene");
        return;
    }
    inputs in;
    memset(&in, 0, sizeof in);
    in.cfg = sc.cfg;
    in.lim = sc.lim;
    in.name = backend;
    in.batch = sc.b.batch;
    memcpy(in.qo, sc.b.qo_indptr, sizeof(int32_t) * 4);
    memcpy(in.kvl, sc.b.kv_lens, sizeof(int32_t) * 3);
    if (!ragged) memcpy(in.bt, sc.b.block_table, sizeof(int32_t) * 3 * (size_t)sc.b.bt_stride);
    in.batch.qo_indptr = in.qo;
    in.batch.kv_lens = in.kvl;
    in.batch.block_table = in.bt;
    in.kv = sc.kv;
    const int T = sc.b.num_tokens, Hq = tc.num_qo_heads, D = tc.head_dim_qk;
    const size_t esz = ak_dtype_size(tc.dtype);
    tbuf ob, lb, nb;
    tbuf_alloc(&ob, t->device, esz * (size_t)T * Hq * D);
    tbuf_alloc(&lb, t->device, 4 * (size_t)T * Hq);
    tbuf_alloc(&nb, t->device, esz * 2 * 2 * D); /* 2 new tokens' K (and V) rows */
    tbuf_poison(&ob);
    tbuf_poison(&lb);
    tbuf_poison(&nb);
    in.q = ak_tensor_3d(tbuf_data(&sc.q_buf), tc.dtype, T, Hq, D);
    in.q.stride[1] = D + 8;
    in.q.stride[0] = (int64_t)Hq * (D + 8);
    in.o = ak_tensor_3d(tbuf_data(&ob), tc.dtype, T, Hq, tc.head_dim_vo);
    in.lse = ak_tensor_2d(tbuf_data(&lb), AK_F32, T, Hq);
    ak_run_args_init(&in.args);
    in.args.q = &in.q;
    in.args.o = &in.o;
    in.args.lse = &in.lse;
    if (ragged) {
        in.k = ak_tensor_3d(tbuf_data(&sc.k_rag), sc.cfg.kv_dtype, sc.b.num_kv_tokens, tc.num_kv_heads, D);
        in.v = ak_tensor_3d(tbuf_data(&sc.v_rag), sc.cfg.kv_dtype, sc.b.num_kv_tokens, tc.num_kv_heads,
                            tc.head_dim_vo);
        in.args.k = &in.k;
        in.args.v = tc.mla ? NULL : &in.v;
        if (tc.kv_fp8) {
            in.args.kv_scale_kind = tc.kv_scale;
            in.args.k_scale = tbuf_data(&sc.k_scale_buf);
            in.args.v_scale = tc.mla ? NULL : tbuf_data(&sc.v_scale_buf);
        }
    } else {
        in.args.kv = &in.kv;
    }
    in.num_new = 2;
    in.update_v = !tc.mla;
    in.slots[0] = 3;
    in.slots[1] = 17;

    /* K/V (the cache, or the ragged tensors) must not change either */
    const size_t kbytes =
        ragged ? sc.k_rag.bytes
               : ak_dtype_size(sc.cfg.kv_dtype) * (size_t)sc.kv.num_blocks * tc.page_size * tc.num_kv_heads * D;
    const void *k_data = ragged ? tbuf_data(&sc.k_rag) : sc.kv.k_data;
    /* MLA: no V anywhere (K twice, so the sizes agree) */
    const void *v_data = tc.mla ? k_data : ragged ? tbuf_data(&sc.v_rag) : sc.kv.v_data;
    const uint64_t k_before = checksum(t->device, k_data, kbytes);
    const uint64_t v_before = checksum(t->device, v_data, kbytes);

    ak_backend *b = NULL;
    ak_status st = AK_OK;
    char msg[4096] = "";
    if (bc->at == AT_CREATE) {
        bc->breaks(&in);
        st = ak_backend_create(&in.cfg, &in.lim, in.name, &b);
    } else if (bc->at == AT_PLAN) {
        st = ak_backend_create(&in.cfg, &in.lim, in.name, &b);
        if (st == AK_OK) {
            bc->breaks(&in);
            if (in.lim.max_reqs != sc.lim.max_reqs || in.lim.max_tokens != sc.lim.max_tokens ||
                in.lim.max_blocks_per_req != sc.lim.max_blocks_per_req ||
                in.cfg.workload != sc.cfg.workload) {
                /* a limits or workload case: the backend is made with the changed values */
                ak_backend_destroy(b);
                st = ak_backend_create(&in.cfg, &in.lim, in.name, &b);
            }
            if (st == AK_OK) st = ak_backend_plan(b, &in.batch, NULL);
            if (st != AK_OK) {
                snprintf(msg, sizeof msg, "%s", ak_last_error());
                /* a failed plan leaves no plan: run must refuse, say why without
                 * repeating its status text, and write nothing */
                const ak_status st2 = ak_backend_run(b, &in.args, NULL);
                if (st2 != AK_ERR_NOT_PLANNED || !strstr(ak_last_error(), "its last plan() failed") ||
                    strstr(ak_last_error(), "before a successful plan")) {
                    snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "; run() after it: %s: %s",
                             ak_status_str(st2), ak_last_error());
                    st = AK_ERR_INTERNAL;
                }
            }
        }
    } else if (bc->at == AT_RUN) {
        st = ak_backend_create(&in.cfg, &in.lim, in.name, &b);
        if (st == AK_OK) st = ak_backend_plan(b, &in.batch, NULL);
        if (st == AK_OK) {
            bc->breaks(&in);
            st = ak_backend_run(b, &in.args, NULL);
        }
    } else {
        bc->breaks(&in);
        /* on the GPU make every slot bad, so "nothing written" is exact */
        if (t->device.kind == AK_DEVICE_CUDA) {
            if (in.slots[0] != 3)
                in.slots[1] = in.slots[0];
            else
                in.slots[0] = in.slots[1];
        }
        /* slots live on the cache's device */
        tbuf slot_buf;
        tbuf_alloc(&slot_buf, t->device, sizeof in.slots);
        memcpy(tbuf_host(&slot_buf), in.slots, sizeof in.slots);
        tbuf_upload(&slot_buf);
        ak_tensor kt = ak_tensor_3d(tbuf_data(&nb), tc.dtype, 2, tc.num_kv_heads, D);
        st = ak_kv_update(&in.kv, &kt, in.update_v ? &kt : NULL, tbuf_data(&slot_buf), in.num_new, NULL);
        dev_sync(t->device);
        tbuf_free(&slot_buf);
    }
    dev_sync(t->device);
    tbuf_download(&ob);
    tbuf_download(&lb);
    /* o and lse must still be all poison; the cache unchanged */
    int untouched = tbuf_guards_ok(&ob) && tbuf_guards_ok(&lb);
    for (size_t i = 0; i < ob.bytes && untouched; i++) untouched = ((unsigned char *)tbuf_host(&ob))[i] == POISON_BYTE;
    for (size_t i = 0; i < lb.bytes && untouched; i++) untouched = ((unsigned char *)tbuf_host(&lb))[i] == POISON_BYTE;
    const int cache_same = checksum(t->device, k_data, kbytes) == k_before &&
                           checksum(t->device, v_data, kbytes) == v_before;

    /* on the GPU a bad slot cannot be seen without reading device memory: the
     * kernel skips it, so only "nothing written" is required there */
    const int gpu_slot = bc->at == AT_KV_UPDATE && t->device.kind == AK_DEVICE_CUDA;
    if (!msg[0]) snprintf(msg, sizeof msg, "%s", ak_last_error());
    const int status_ok = gpu_slot ? (st == AK_OK || st == bc->expect) : st == bc->expect;
    const int names_field = gpu_slot || strstr(msg, bc->field) != NULL;
    if (status_ok && names_field && untouched && cache_same)
        t_pass(t, backend, bc->name, "%s", gpu_slot ? "(skipped by the kernel)" : ak_status_str(st));
    else
        t_fail(t, backend, bc->name, "status %s (want %s), message %s \"%s\", outputs %s, cache %s",
               ak_status_str(st), ak_status_str(bc->expect), names_field ? "names the field" : "lacks",
               msg, untouched ? "untouched" : "WRITTEN", cache_same ? "unchanged" : "CHANGED");
    ak_backend_destroy(b);
    tbuf_free(&ob);
    tbuf_free(&lb);
    tbuf_free(&nb);
    scene_free(&sc);
}

void test_bad_input(test_ctx *t)
{
    const char *names[16];
    const int nb = t_backends(t, names, 16);
    for (int i = 0; i < nb; i++)
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            /* kv_update is backend-independent: run its cases once */
            if (cases[c].at == AT_KV_UPDATE && i > 0) continue;
            run_bad(t, names[i], &cases[c]);
        }
}
