/*
 * test_hostile.c - what a careless or hostile caller may pass: sizes at the
 * edges of int32 and int64, views that would point outside their memory,
 * counts that would overflow. Every such call must fail with a status and a
 * message naming the field, and change nothing; nothing may crash or write
 * outside the memory the call was given.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "harness.h"
#include "dtype.h"
#include "internal.h" /* ak_kv_cache_debug_set_refcount */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- plan(): block counts and totals near INT32_MAX ------------------------ */

/* One plan on backend `name`: requests with q_len 1 and the given kv_lens,
 * paged (page_size > 0; a block table of `stride` entries per request, every
 * id 0) or ragged (page_size 0), on `threads` OpenMP threads (0: the default).
 * Returns the status, with ak_last_error() in msg; *run_after: the status of a
 * run() after it, which must be AK_ERR_NOT_PLANNED when the plan failed (NULL:
 * not tried). */
static ak_status plan_status(const test_ctx *t, const char *name, int page_size, const int32_t *kv_lens, int n,
                             int stride, int threads, char *msg, size_t cap, ak_status *run_after)
{
    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.num_qo_heads = 4;
    cfg.num_kv_heads = 2;
    cfg.head_dim_qk = cfg.head_dim_vo = 64;
    cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = t->device.kind == AK_DEVICE_CUDA ? AK_BF16 : AK_F32;
    cfg.device = t->device;
    cfg.kv_storage = page_size > 0 ? AK_KV_PAGED : AK_KV_RAGGED;
    cfg.page_size = page_size;
    ak_limits lim;
    ak_limits_init(&lim);
    lim.max_reqs = n;
    lim.max_tokens = n;
    lim.max_blocks_per_req = 2048;
    lim.num_cache_blocks = 4;
    lim.max_splits = 64;
    char old_threads[32] = "";
    if (threads > 0) {
        /* the cpu backend reads AK_NUM_THREADS at create */
        if (getenv("AK_NUM_THREADS")) snprintf(old_threads, sizeof old_threads, "%s", getenv("AK_NUM_THREADS"));
        char v[16];
        snprintf(v, sizeof v, "%d", threads);
        setenv("AK_NUM_THREADS", v, 1);
    }
    ak_backend *b = NULL;
    ak_status st = ak_backend_create(&cfg, &lim, name, &b);
    if (threads > 0) {
        if (old_threads[0]) setenv("AK_NUM_THREADS", old_threads, 1);
        else unsetenv("AK_NUM_THREADS");
    }
    if (st == AK_OK) {
        int32_t *bt = calloc((size_t)n * (size_t)(stride > 0 ? stride : 1), sizeof(int32_t));
        int32_t *qo = calloc((size_t)n + 1, sizeof(int32_t));
        for (int r = 0; r < n; r++) qo[r + 1] = r + 1;
        ak_batch batch;
        ak_batch_init(&batch);
        batch.num_reqs = n;
        batch.qo_indptr = qo;
        batch.kv_lens = kv_lens;
        batch.block_table = page_size > 0 ? bt : NULL;
        batch.block_table_stride = page_size > 0 ? stride : 0;
        st = ak_backend_plan(b, &batch, NULL);
        snprintf(msg, cap, "%s", ak_last_error());
        if (run_after) {
            /* the tensors are never read: a failed plan must refuse before them */
            ak_run_args args;
            ak_run_args_init(&args);
            *run_after = ak_backend_run(b, &args, NULL);
        }
        free(bt);
        free(qo);
    } else {
        snprintf(msg, cap, "%s", ak_last_error());
    }
    ak_backend_destroy(b);
    return st;
}

/* A plan that must fail with `want` and a message holding both `field` and
 * `detail`, and leave no plan in force. */
static void expect_plan_fails(test_ctx *t, const char *name, const char *case_name, int page_size,
                              const int32_t *kv_lens, int n, int stride, ak_status want, const char *field,
                              const char *detail)
{
    if (!t_selected(t, case_name)) return;
    char msg[4096];
    ak_status run_after = AK_OK;
    const ak_status st = plan_status(t, name, page_size, kv_lens, n, stride, 0, msg, sizeof msg, &run_after);
    if (st == AK_ERR_UNSUPPORTED && strstr(msg, "cannot serve")) {
        t_skip(t, name, case_name, "unsupported");
        return;
    }
    if (st == want && strstr(msg, field) && strstr(msg, detail) && run_after == AK_ERR_NOT_PLANNED)
        t_pass(t, name, case_name, "%s", msg);
    else
        t_fail(t, name, case_name, "status %s (want %s), message \"%s\" (want %s, %s), run after it: %s",
               ak_status_str(st), ak_status_str(want), msg, field, detail, ak_status_str(run_after));
}

/* kv_len + page_size - 1 above INT32_MAX wrapped the block count negative
 * past every check and the metadata copy then crashed; the ragged kv_indptr
 * summed kv_lens in int32 unchecked. */
static void hostile_plan_sizes(test_ctx *t, const char *name)
{
    char detail[64];
    const int32_t max_len = AK_MAX_LEN, huge = INT32_MAX, above = AK_MAX_LEN + 1;
    expect_plan_fails(t, name, "plan kv_len INT32_MAX, block table of 1", 16, &huge, 1, 1, AK_ERR_LIMIT_EXCEEDED,
                      "batch.kv_lens[0] = 2147483647", "AK_MAX_LEN");
    expect_plan_fails(t, name, "plan kv_len AK_MAX_LEN + 1, block table of 2048", 16, &above, 1, 2048,
                      AK_ERR_LIMIT_EXCEEDED, "batch.kv_lens[0]", "AK_MAX_LEN");
    snprintf(detail, sizeof detail, "needs %lld blocks", ((long long)AK_MAX_LEN + 15) / 16);
    expect_plan_fails(t, name, "plan kv_len AK_MAX_LEN, block table of 1", 16, &max_len, 1, 1, AK_ERR_INVALID_ARG,
                      "batch.kv_lens[0]", detail);
    const int32_t halves[3] = {5, 1 << 30, 1 << 30};
    expect_plan_fails(t, name, "plan ragged, sum of kv_lens 2^31 + 5", 0, halves, 3, 0, AK_ERR_LIMIT_EXCEEDED,
                      "batch.kv_lens[2]", "AK_MAX_LEN");

    /* the largest ragged request plans, split over 4 threads' chunks (cpu_ref's
     * plan would allocate a score row of 2^31 doubles: not asked) */
    const char *case_name = "plan ragged kv_len AK_MAX_LEN, 4 threads";
    if (t_selected(t, case_name) && strcmp(name, "cpu_ref") != 0) {
        char msg[4096];
        const ak_status st = plan_status(t, name, 0, &max_len, 1, 0, 4, msg, sizeof msg, NULL);
        if (st == AK_OK)
            t_pass(t, name, case_name, "ok");
        else if (st == AK_ERR_UNSUPPORTED)
            t_skip(t, name, case_name, "unsupported");
        else
            t_fail(t, name, case_name, "status %s: %s", ak_status_str(st), msg);
    }
}

/* 2^30 query and KV heads: the cpu backend's create multiplied them into int
 * row counts; every backend refuses such a config. */
static void hostile_huge_heads(test_ctx *t, const char *name)
{
    const char *case_name = "create with 2^30 heads";
    if (!t_selected(t, case_name)) return;
    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.num_qo_heads = cfg.num_kv_heads = 1 << 30;
    cfg.head_dim_qk = cfg.head_dim_vo = 64;
    cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = t->device.kind == AK_DEVICE_CUDA ? AK_BF16 : AK_F32;
    cfg.device = t->device;
    ak_limits lim;
    ak_limits_init(&lim);
    ak_backend *b = NULL;
    const ak_status st = ak_backend_create(&cfg, &lim, name, &b);
    if (st == AK_ERR_UNSUPPORTED && strstr(ak_last_error(), "cfg.num_qo_heads = 1073741824") && !b)
        t_pass(t, name, case_name, "%s", ak_last_error());
    else
        t_fail(t, name, case_name, "status %s: %s", ak_status_str(st), ak_last_error());
    ak_backend_destroy(b);
}

/* A page of INT32_MAX tokens: kv_len + page_size - 1 overflowed and the
 * request got 0 blocks (device-independent: the metadata on the host). */
static void hostile_meta_huge_page(test_ctx *t)
{
    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.page_size = INT32_MAX;
    const int32_t qo[3] = {0, 1, 3}, kvl[2] = {5, 2}, bt[2] = {3, 1};
    ak_batch b;
    ak_batch_init(&b);
    b.num_reqs = 2;
    b.qo_indptr = qo;
    b.kv_lens = kvl;
    b.block_table = bt;
    b.block_table_stride = 1;
    int32_t qoi[3], kvi[3], idx[2], last[2], pos[3];
    int64_t slots[3];
    memset(kvi, 0xff, sizeof kvi);
    ak_batch_meta m = {qoi, kvi, idx, last, pos, slots, NULL};
    const ak_status st = ak_batch_build_meta(&b, &cfg, NULL, &m);
    const int ok = st == AK_OK && kvi[0] == 0 && kvi[1] == 1 && kvi[2] == 2 && idx[0] == 3 && idx[1] == 1 &&
                   last[0] == 5 && last[1] == 2 && slots[0] == 3LL * INT32_MAX + 4 && slots[2] == (int64_t)INT32_MAX + 1;
    if (ok)
        t_pass(t, NULL, "meta with page_size INT32_MAX", "ok");
    else
        t_fail(t, NULL, "meta with page_size INT32_MAX", "status %s %s; kv_indptr %d %d %d, last page %d %d",
               ak_status_str(st), ak_last_error(), kvi[0], kvi[1], kvi[2], last[0], last[1]);
}

/* ---- paged views: strides and sizes that would address outside the pool ------ */

typedef struct view_case {
    const char *name;
    const char *field; /* must appear in the message, after "kv->" or "args.kv->" */
    void (*breaks)(ak_paged_kv *kv);
} view_case;

static int64_t block_elems(const ak_paged_kv *kv, int is_v)
{
    return (int64_t)kv->page_size * kv->num_kv_heads * (is_v ? kv->head_dim_vo : kv->head_dim_qk);
}
static void k_stride_minus_block(ak_paged_kv *kv) { kv->k_block_stride = -block_elems(kv, 0); }
static void v_stride_below_block(ak_paged_kv *kv) { kv->v_block_stride = block_elems(kv, 1) - 1; }
static void k_stride_int64_min(ak_paged_kv *kv) { kv->k_block_stride = INT64_MIN; }
static void v_stride_past_int64(ak_paged_kv *kv) { kv->v_block_stride = INT64_MAX / 2; }
static void page_size_zero(ak_paged_kv *kv) { kv->page_size = 0; }
static void heads_negative(ak_paged_kv *kv) { kv->num_kv_heads = -1; }
static void layout_unknown(ak_paged_kv *kv) { kv->layout = (ak_kv_layout)7; }
static void block_past_int64(ak_paged_kv *kv) { kv->page_size = INT32_MAX; kv->head_dim_qk = INT32_MAX; }
static void no_v_data(ak_paged_kv *kv) { kv->v_data = NULL; }

static const view_case view_cases[] = {
    {"k_block_stride = -block", "k_block_stride", k_stride_minus_block},
    {"v_block_stride = block - 1", "v_block_stride", v_stride_below_block},
    {"k_block_stride = INT64_MIN", "k_block_stride", k_stride_int64_min},
    {"v_block_stride: the pool passes int64 bytes", "v_block_stride", v_stride_past_int64},
    {"page_size 0", "page_size", page_size_zero},
    {"num_kv_heads -1", "num_kv_heads", heads_negative},
    {"layout 7", "layout", layout_unknown},
    {"a block of more than int64 bytes", "int64", block_past_int64},
    {"v_data NULL", "v_data", no_v_data},
};

static uint64_t bytes_hash(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* ak_kv_update trusted the view's block strides (run() checked them, it did
 * not): a negative one wrote before the pool. Both now validate the view with
 * one function; a rejected view writes nothing, in or around the pool. The
 * pools are guarded buffers, so a write a block before or after them lands in
 * checked guard bytes. */
static void hostile_views(test_ctx *t)
{
    const ak_dtype dt = t->device.kind == AK_DEVICE_CUDA ? AK_BF16 : AK_F32;
    const size_t esz = ak_dtype_size(dt);
    enum { BLOCKS = 4, PAGE = 4, HEADS = 2, DQK = 8, DVO = 16, NEW = 2 };
    tbuf kp, vp, kn, vn, sl;
    tbuf_alloc(&kp, t->device, esz * BLOCKS * PAGE * HEADS * DQK);
    tbuf_alloc(&vp, t->device, esz * BLOCKS * PAGE * HEADS * DVO);
    tbuf_alloc(&kn, t->device, esz * NEW * HEADS * DQK);
    tbuf_alloc(&vn, t->device, esz * NEW * HEADS * DVO);
    tbuf_alloc(&sl, t->device, sizeof(int64_t) * NEW);
    uint64_t rng = t->seed ^ scn_name_hash("hostile views");
    tbuf *fill[4] = {&kp, &vp, &kn, &vn};
    for (int b = 0; b < 4; b++) {
        for (size_t i = 0; i < fill[b]->bytes / esz; i++)
            ak_store_from_f32(tbuf_host(fill[b]), dt, (int64_t)i, scn_uniform(&rng));
        tbuf_upload(fill[b]);
    }
    /* block 1 slot 1 and block 3 slot 3: a negative stride lands a block before the pool */
    const int64_t slots[NEW] = {PAGE + 1, 3 * PAGE + 3};
    memcpy(tbuf_host(&sl), slots, sizeof slots);
    tbuf_upload(&sl);
    const size_t k_all = kp.bytes + 2 * GUARD_BYTES, v_all = vp.bytes + 2 * GUARD_BYTES;
    const uint64_t k_before = bytes_hash(kp.host, k_all), v_before = bytes_hash(vp.host, v_all);
    unsigned char *k_image = malloc(k_all), *v_image = malloc(v_all);
    memcpy(k_image, kp.host, k_all);
    memcpy(v_image, vp.host, v_all);

    ak_paged_kv base;
    memset(&base, 0, sizeof base);
    base.k_data = tbuf_data(&kp);
    base.v_data = tbuf_data(&vp);
    base.dtype = dt;
    base.layout = AK_LAYOUT_NHD;
    base.device = t->device;
    base.num_blocks = BLOCKS;
    base.page_size = PAGE;
    base.num_kv_heads = HEADS;
    base.head_dim_qk = DQK;
    base.head_dim_vo = DVO;
    const ak_tensor k = ak_tensor_3d(tbuf_data(&kn), dt, NEW, HEADS, DQK);
    const ak_tensor v = ak_tensor_3d(tbuf_data(&vn), dt, NEW, HEADS, DVO);

    for (size_t c = 0; c < sizeof view_cases / sizeof *view_cases; c++) {
        char name[128];
        snprintf(name, sizeof name, "kv_update view: %s", view_cases[c].name);
        if (!t_selected(t, name)) continue;
        ak_paged_kv kv = base;
        view_cases[c].breaks(&kv);
        const ak_status st = ak_kv_update(&kv, &k, &v, tbuf_data(&sl), NEW, NULL);
        dev_sync(t->device);
        tbuf_download(&kp);
        tbuf_download(&vp);
        const int same = bytes_hash(kp.host, k_all) == k_before && bytes_hash(vp.host, v_all) == v_before;
        const int named = strstr(ak_last_error(), view_cases[c].field) != NULL && strstr(ak_last_error(), "kv->");
        if (st == AK_ERR_INVALID_ARG && named && same)
            t_pass(t, NULL, name, "%s", ak_last_error());
        else
            t_fail(t, NULL, name, "status %s, message \"%s\" (want %s), pool and guards %s", ak_status_str(st),
                   st ? ak_last_error() : "", view_cases[c].field, same ? "unchanged" : "WRITTEN");
        /* undo whatever a faulty call wrote, for the next case */
        memcpy(kp.host, k_image, k_all);
        memcpy(vp.host, v_image, v_all);
        tbuf_upload(&kp);
        tbuf_upload(&vp);
    }
    /* the new rows' tensors: one from a constructor given too large a dim, and
     * strides whose addresses pass int64 */
    for (int c = 0; c < 3; c++) {
        static const char *const what[3] = {"kv_update k: ak_tensor_3d dims overflow",
                                            "kv_update k: stride[0] past int64 bytes",
                                            "kv_update v: stride[1] past int64 bytes"};
        static const char *const field[3] = {"shape[1]", "k->stride[0]", "v->stride[1]"};
        if (!t_selected(t, what[c])) continue;
        ak_tensor kb = k, vb = v;
        if (c == 0) kb = ak_tensor_3d(tbuf_data(&kn), dt, NEW, (int64_t)1 << 62, DQK);
        if (c == 1) kb.stride[0] = (int64_t)1 << 62;
        if (c == 2) vb.stride[1] = (int64_t)1 << 62;
        const ak_status st = ak_kv_update(&base, &kb, &vb, tbuf_data(&sl), NEW, NULL);
        dev_sync(t->device);
        tbuf_download(&kp);
        tbuf_download(&vp);
        const int same = bytes_hash(kp.host, k_all) == k_before && bytes_hash(vp.host, v_all) == v_before;
        if (st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), field[c]) && same)
            t_pass(t, NULL, what[c], "%s", ak_last_error());
        else
            t_fail(t, NULL, what[c], "status %s, message \"%s\" (want %s), pool and guards %s", ak_status_str(st),
                   st ? ak_last_error() : "", field[c], same ? "unchanged" : "WRITTEN");
        memcpy(kp.host, k_image, k_all);
        memcpy(vp.host, v_image, v_all);
        tbuf_upload(&kp);
        tbuf_upload(&vp);
    }
    free(k_image);
    free(v_image);
    tbuf_free(&kp);
    tbuf_free(&vp);
    tbuf_free(&kn);
    tbuf_free(&vn);
    tbuf_free(&sl);
}

/* run() rejects the same views through the same function, before it reads
 * anything: o stays poison. */
static void hostile_run_views(test_ctx *t, const char *name)
{
    attn_case tc = {"hostile run views", 4, 2, 64, 64, AK_F32, 0, 0, 1, -1, 0, 16, AK_LAYOUT_NHD, AK_KV_PAGED, 2,
                    {{1, 20}, {3, 9}}};
    if (t->device.kind == AK_DEVICE_CUDA) tc.dtype = AK_BF16;
    uint64_t rng = t->seed ^ scn_name_hash(tc.name);
    scene sc;
    ak_backend *b = NULL;
    if (scene_build(&sc, &tc, t->device, &rng) || ak_backend_create(&sc.cfg, &sc.lim, name, &b) != AK_OK ||
        ak_backend_plan(b, &sc.b.batch, NULL) != AK_OK) {
        if (b) t_fail(t, name, "run view", "cannot plan the baseline: %s", ak_last_error());
        ak_backend_destroy(b);
        scene_free(&sc);
        return;
    }
    const size_t esz = ak_dtype_size(tc.dtype);
    tbuf ob;
    tbuf_alloc(&ob, t->device, esz * (size_t)sc.b.num_tokens * tc.num_qo_heads * tc.head_dim_vo);
    ak_tensor q = ak_tensor_3d(tbuf_data(&sc.q_buf), tc.dtype, sc.b.num_tokens, tc.num_qo_heads, tc.head_dim_qk);
    q.stride[1] = tc.head_dim_qk + 8; /* the scene pads q's rows */
    q.stride[0] = (int64_t)tc.num_qo_heads * q.stride[1];
    ak_tensor o = ak_tensor_3d(tbuf_data(&ob), tc.dtype, sc.b.num_tokens, tc.num_qo_heads, tc.head_dim_vo);
    for (size_t c = 0; c < sizeof view_cases / sizeof *view_cases; c++) {
        char case_name[128];
        snprintf(case_name, sizeof case_name, "run view: %s", view_cases[c].name);
        if (!t_selected(t, case_name)) continue;
        tbuf_poison(&ob);
        ak_paged_kv kv = sc.kv;
        view_cases[c].breaks(&kv);
        ak_run_args a;
        ak_run_args_init(&a);
        a.q = &q;
        a.o = &o;
        a.kv = &kv;
        const ak_status st = ak_backend_run(b, &a, NULL);
        dev_sync(t->device);
        tbuf_download(&ob);
        int untouched = tbuf_guards_ok(&ob);
        for (size_t i = 0; i < ob.bytes && untouched; i++) untouched = ((unsigned char *)tbuf_host(&ob))[i] == POISON_BYTE;
        const int named = strstr(ak_last_error(), view_cases[c].field) != NULL && strstr(ak_last_error(), "args.kv");
        if (st == AK_ERR_INVALID_ARG && named && untouched)
            t_pass(t, name, case_name, "%s", ak_last_error());
        else
            t_fail(t, name, case_name, "status %s, message \"%s\" (want %s), o %s", ak_status_str(st),
                   st ? ak_last_error() : "", view_cases[c].field, untouched ? "untouched" : "WRITTEN");
    }
    tbuf_free(&ob);
    ak_backend_destroy(b);
    scene_free(&sc);
}

/* ---- a device block table the host cannot check ------------------------------ */

/* One plan + run over `batch` into o (poisoned first); the backend's slot
 * mapping after it goes to slots (num_tokens of them). */
static ak_status table_run(ak_backend *b, const ak_batch *batch, const scene *sc, tbuf *ob, int64_t *slots)
{
    const ak_attn_config *c = &sc->cfg;
    const int T = sc->b.num_tokens;
    ak_tensor q = ak_tensor_3d(tbuf_data(&sc->q_buf), c->q_dtype, T, c->num_qo_heads, c->head_dim_qk);
    q.stride[1] = c->head_dim_qk + 8; /* the scene pads q's rows */
    q.stride[0] = (int64_t)c->num_qo_heads * q.stride[1];
    ak_tensor o = ak_tensor_3d(tbuf_data(ob), c->o_dtype, T, c->num_qo_heads, c->head_dim_vo);
    tbuf_poison(ob);
    ak_run_args a;
    ak_run_args_init(&a);
    a.q = &q;
    a.o = &o;
    a.kv = &sc->kv;
    ak_status st = ak_backend_plan(b, batch, NULL);
    if (st == AK_OK) st = ak_backend_run(b, &a, NULL);
    dev_sync(c->device);
    tbuf_download(ob);
    if (st == AK_OK) dev_copy_from(c->device, slots, ak_backend_slot_mapping(b), sizeof(int64_t) * (size_t)T);
    return st;
}

/* An engine's device block table is read as it is: plan() cannot check its
 * ids. Ids out of range (negative, INT32_MAX, num_blocks) in a decode's and
 * a chunk's rows are clamped into the pools, so no kernel reads outside them
 * (compute-sanitizer runs this case clean): run() succeeds, every o row is
 * written and finite, the rows of a request with valid ids are bit for bit
 * those of the host-table plan, and the new tokens in bad blocks get slot
 * -1 (kv_update skips them).
 * Memory the kernels cannot read (a host array) and two tables at once are
 * refused at plan(), naming the field. On the CPU the "device" table is host
 * memory, checked as block_table is. */
static void hostile_device_table(test_ctx *t, const char *name)
{
    /* a decode that splits, a chunk on a prefix (the prefill kernel), a clean decode */
    attn_case tc = {"hostile device table", 8, 2, 128, 128, AK_BF16, 0, 0, 1, -1, 0, 16, AK_LAYOUT_NHD, AK_KV_PAGED,
                    3, {{1, 700}, {5, 90}, {1, 300}}};
    if (t->device.kind == AK_DEVICE_CPU) tc.dtype = AK_F32;
    if (!t_selected(t, tc.name)) return;
    uint64_t rng = t->seed ^ scn_name_hash(tc.name);
    scene sc;
    ak_backend *b = NULL;
    if (scene_build(&sc, &tc, t->device, &rng)) {
        t_fail(t, name, tc.name, "cannot build the scene");
        return;
    }
    if (ak_backend_create(&sc.cfg, &sc.lim, name, &b) != AK_OK) {
        scene_free(&sc);
        return; /* a backend that cannot serve the case (cpu_ref's limits, a ragged-only one) */
    }
    const int T = sc.b.num_tokens, Hq = tc.num_qo_heads, D = tc.head_dim_vo, stride = sc.b.bt_stride;
    const size_t esz = ak_dtype_size(tc.dtype), row = esz * (size_t)Hq * D;
    const int nb = sc.lim.num_cache_blocks;
    tbuf ob, tab;
    tbuf_alloc(&ob, t->device, row * (size_t)T);
    tbuf_alloc(&tab, t->device, sizeof(int32_t) * (size_t)sc.b.num_reqs * stride);
    int64_t slots_host[8], slots_dev[8];
    unsigned char *o_host = malloc(row * (size_t)T);

    ak_status st = table_run(b, &sc.b.batch, &sc, &ob, slots_host);
    memcpy(o_host, tbuf_host(&ob), row * (size_t)T);

    /* the same table with bad ids in request 0 (blocks 3, 10, 43 of 44)
     * and request 1 (its first and last) */
    int32_t *bt = tbuf_host(&tab);
    memcpy(bt, sc.b.block_table, sizeof(int32_t) * (size_t)sc.b.num_reqs * stride);
    bt[3] = -5;
    bt[10] = INT32_MAX;
    bt[43] = nb; /* request 0's last block: its new token's slot */
    bt[stride + 0] = INT32_MIN;
    bt[stride + 5] = nb + 1000; /* request 1's last block (keys 80-89): its 5 new tokens' */
    tbuf_upload(&tab);
    ak_batch batch = sc.b.batch;
    batch.block_table = NULL;
    batch.device_block_table = tbuf_data(&tab);
    const ak_status st2 = st == AK_OK ? table_run(b, &batch, &sc, &ob, slots_dev) : st;
    const int gpu = t->device.kind != AK_DEVICE_CPU;
    if (!gpu) {
        /* host memory: checked like block_table */
        const int named = strstr(ak_last_error(), "device_block_table[0][3]") != NULL;
        if (st == AK_OK && st2 == AK_ERR_INVALID_ARG && named)
            t_pass(t, name, tc.name, "%s", ak_last_error());
        else
            t_fail(t, name, tc.name, "status %s / %s: %s (want device_block_table[0][3] named)",
                   ak_status_str(st), ak_status_str(st2), ak_last_error());
    } else {
        char why[200] = "";
        if (st != AK_OK || st2 != AK_OK) snprintf(why, sizeof why, "status %s / %s: %s", ak_status_str(st),
                                                  ak_status_str(st2), ak_last_error());
        if (!why[0] && !tbuf_guards_ok(&ob)) snprintf(why, sizeof why, "write outside o");
        for (int i = 0; !why[0] && i < T * Hq * D; i++) {
            const float x = ak_load_as_f32(tbuf_host(&ob), tc.dtype, i);
            if (!isfinite(x)) snprintf(why, sizeof why, "o element %d is %g", i, x);
        }
        /* request 2 (token 6) has only valid ids: the same bits as with the host table */
        if (!why[0] && memcmp(o_host + row * 6, (unsigned char *)tbuf_host(&ob) + row * 6, row))
            snprintf(why, sizeof why, "request 2's o differs from the host-table plan's");
        /* slots: tokens 0-5 (in request 0's and request 1's last blocks) are -1 */
        for (int i = 0; !why[0] && i < T; i++) {
            const int64_t want = i <= 5 ? -1 : slots_host[i];
            if (slots_dev[i] != want)
                snprintf(why, sizeof why, "slot of token %d is %lld, want %lld", i, (long long)slots_dev[i],
                         (long long)want);
        }
        if (why[0])
            t_fail(t, name, tc.name, "%s", why);
        else
            t_pass(t, name, tc.name, "bad ids clamped into the pools, their slots -1");

        /* host memory named as a device table, and two tables at once */
        batch.device_block_table = sc.b.block_table;
        const ak_status h = ak_backend_plan(b, &batch, NULL);
        const int h_named = strstr(ak_last_error(), "device_block_table") && strstr(ak_last_error(), "host memory");
        CHECK(t, "hostile device table: host memory", h == AK_ERR_INVALID_ARG && h_named, "status %s: %s",
              ak_status_str(h), ak_last_error());
    }
    batch.block_table = sc.b.block_table;
    batch.device_block_table = tbuf_data(&tab);
    const ak_status both = ak_backend_plan(b, &batch, NULL);
    CHECK(t, "hostile device table: both tables", both == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "both"),
          "status %s: %s", ak_status_str(both), ak_last_error());
    free(o_host);
    tbuf_free(&ob);
    tbuf_free(&tab);
    ak_backend_destroy(b);
    scene_free(&sc);
}

/* ---- tensors: shapes whose sizes or addresses pass int64 --------------------- */

/* ak_tensor_*d multiplied dims into int64 strides unchecked. A negative dim,
 * or dims whose bytes pass INT64_MAX, now give an invalid tensor (data NULL,
 * ndim 0, stride -1 at the failing dim) that every call rejects naming the
 * dim. */
static void hostile_tensor_constructors(test_ctx *t)
{
    float x[4];
    const int64_t big = (int64_t)1 << 62;
    struct {
        const char *name;
        ak_tensor got;
        int bad_dim; /* -1: valid */
    } cases[] = {
        {"ak_tensor_3d(2, 2^62, 8) f32", ak_tensor_3d(x, AK_F32, 2, big, 8), 1},
        {"ak_tensor_2d(-1, 4)", ak_tensor_2d(x, AK_F32, -1, 4), 0},
        {"ak_tensor_4d(2^20, 2^20, 2^20, 4) f32: 2^62 elements, 2^64 bytes",
         ak_tensor_4d(x, AK_F32, 1 << 20, 1 << 20, 1 << 20, 4), 0},
        {"ak_tensor_4d(2^20, 2^20, 2^20, 8) bf16", ak_tensor_4d(x, AK_BF16, 1 << 20, 1 << 20, 1 << 20, 8), 0},
        {"ak_tensor_3d(0, 2^40, 2^40): no elements, strides past int64",
         ak_tensor_3d(x, AK_F32, 0, (int64_t)1 << 40, (int64_t)1 << 40), 1},
        {"ak_tensor_2d(2^30, 2^30) f32: 2^62 bytes", ak_tensor_2d(x, AK_F32, 1 << 30, 1 << 30), -1},
        {"ak_tensor_4d(0, 3, 0, 5)", ak_tensor_4d(x, AK_F32, 0, 3, 0, 5), -1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char name[160];
        snprintf(name, sizeof name, "tensor: %s", cases[c].name);
        if (!t_selected(t, name)) continue;
        const ak_tensor *g = &cases[c].got;
        const int d = cases[c].bad_dim;
        int ok;
        if (d < 0) {
            ok = g->data == x && g->ndim >= 2 && g->stride[g->ndim - 1] == 1;
            for (int i = 0; i + 1 < g->ndim; i++) ok &= g->stride[i] == g->stride[i + 1] * (g->shape[i + 1] ? g->shape[i + 1] : 1);
        } else {
            ok = g->data == NULL && g->ndim == 0 && g->stride[d] == -1;
            for (int i = 0; i < AK_MAX_DIMS; i++) ok &= i == d || g->stride[i] == 0;
        }
        if (ok)
            t_pass(t, NULL, name, "ok");
        else
            t_fail(t, NULL, name, "data %s, ndim %d, strides %lld %lld %lld %lld (want dim %d marked)",
                   g->data ? "set" : "NULL", g->ndim, (long long)g->stride[0], (long long)g->stride[1],
                   (long long)g->stride[2], (long long)g->stride[3], d);
    }

    /* merge_states given such tensors, or strides past int64 */
    enum { T = 2, S = 3, H = 2, D = 4 };
    float v[T * S * H * D], sv[T * S * H], vo[T * H * D], so[T * H];
    uint64_t rng = t->seed;
    for (int i = 0; i < T * S * H * D; i++) v[i] = scn_uniform(&rng);
    for (int i = 0; i < T * S * H; i++) sv[i] = scn_uniform(&rng);
    for (int c = 0; c < 3; c++) {
        static const char *const what[3] = {"merge_states v: ak_tensor_4d dims overflow",
                                            "merge_states v: stride[1] past int64 bytes",
                                            "merge_states v_out: stride[0] past int64 bytes"};
        static const char *const field[3] = {"v is invalid", "v->stride[1]", "v_out->stride[0]"};
        if (!t_selected(t, what[c])) continue;
        ak_tensor vt = ak_tensor_4d(v, AK_F32, T, S, H, D), st_ = ak_tensor_3d(sv, AK_F32, T, S, H);
        ak_tensor vot = ak_tensor_3d(vo, AK_F32, T, H, D), sot = ak_tensor_2d(so, AK_F32, T, H);
        if (c == 0) vt = ak_tensor_4d(v, AK_F32, T, big, H, D);
        if (c == 1) vt.stride[1] = (int64_t)1 << 62;
        if (c == 2) vot.stride[0] = (int64_t)1 << 62;
        memset(vo, 0xff, sizeof vo);
        memset(so, 0xff, sizeof so);
        const ak_device cpu = {AK_DEVICE_CPU, 0};
        const ak_status st = ak_merge_states(&vt, &st_, &vot, &sot, cpu, NULL);
        int untouched = 1;
        for (size_t i = 0; i < sizeof vo; i++) untouched &= ((unsigned char *)vo)[i] == 0xff;
        for (size_t i = 0; i < sizeof so; i++) untouched &= ((unsigned char *)so)[i] == 0xff;
        if (st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), field[c]) && untouched)
            t_pass(t, NULL, what[c], "%s", ak_last_error());
        else
            t_fail(t, NULL, what[c], "status %s, message \"%s\" (want %s), outputs %s", ak_status_str(st),
                   st ? ak_last_error() : "", field[c], untouched ? "untouched" : "WRITTEN");
    }
}

/* run() given an invalid q, or o / lse strides past int64 bytes: rejected,
 * naming the field, before anything is read or written. */
static void hostile_run_tensors(test_ctx *t, const char *name)
{
    attn_case tc = {"hostile run tensors", 4, 2, 64, 64, AK_F32, 0, 0, 1, -1, 0, 16, AK_LAYOUT_NHD, AK_KV_PAGED, 2,
                    {{1, 20}, {3, 9}}};
    if (t->device.kind == AK_DEVICE_CUDA) tc.dtype = AK_BF16;
    uint64_t rng = t->seed ^ scn_name_hash(tc.name);
    scene sc;
    ak_backend *b = NULL;
    if (scene_build(&sc, &tc, t->device, &rng) || ak_backend_create(&sc.cfg, &sc.lim, name, &b) != AK_OK ||
        ak_backend_plan(b, &sc.b.batch, NULL) != AK_OK) {
        if (b) t_fail(t, name, "run tensors", "cannot plan the baseline: %s", ak_last_error());
        ak_backend_destroy(b);
        scene_free(&sc);
        return;
    }
    const int T = sc.b.num_tokens, Hq = tc.num_qo_heads, D = tc.head_dim_qk;
    const size_t esz = ak_dtype_size(tc.dtype);
    tbuf ob, lb;
    tbuf_alloc(&ob, t->device, esz * (size_t)T * Hq * D);
    tbuf_alloc(&lb, t->device, sizeof(float) * (size_t)T * Hq);
    static const char *const what[4] = {"run q: ak_tensor_3d dims overflow", "run q: stride[0] past int64 bytes",
                                        "run o: stride[1] past int64 bytes", "run lse: stride[0] past int64 bytes"};
    static const char *const field[4] = {"args.q is invalid", "args.q->stride[0]", "args.o->stride[1]",
                                         "args.lse->stride[0]"};
    for (int c = 0; c < 4; c++) {
        if (!t_selected(t, what[c])) continue;
        tbuf_poison(&ob);
        tbuf_poison(&lb);
        ak_tensor q = ak_tensor_3d(tbuf_data(&sc.q_buf), tc.dtype, T, Hq, D);
        q.stride[1] = D + 8; /* the scene pads q's rows */
        q.stride[0] = (int64_t)Hq * q.stride[1];
        ak_tensor o = ak_tensor_3d(tbuf_data(&ob), tc.dtype, T, Hq, D);
        ak_tensor l = ak_tensor_2d(tbuf_data(&lb), AK_F32, T, Hq);
        if (c == 0) q = ak_tensor_3d(tbuf_data(&sc.q_buf), tc.dtype, T, (int64_t)1 << 62, D);
        if (c == 1) q.stride[0] = (int64_t)1 << 62;
        if (c == 2) o.stride[1] = (int64_t)1 << 62;
        if (c == 3) l.stride[0] = (int64_t)1 << 62;
        ak_run_args a;
        ak_run_args_init(&a);
        a.q = &q;
        a.o = &o;
        a.lse = &l;
        a.kv = &sc.kv;
        const ak_status st = ak_backend_run(b, &a, NULL);
        dev_sync(t->device);
        tbuf_download(&ob);
        tbuf_download(&lb);
        int untouched = tbuf_guards_ok(&ob) && tbuf_guards_ok(&lb);
        for (size_t i = 0; i < ob.bytes && untouched; i++) untouched = ((unsigned char *)tbuf_host(&ob))[i] == POISON_BYTE;
        for (size_t i = 0; i < lb.bytes && untouched; i++) untouched = ((unsigned char *)tbuf_host(&lb))[i] == POISON_BYTE;
        if (st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), field[c]) && untouched)
            t_pass(t, name, what[c], "%s", ak_last_error());
        else
            t_fail(t, name, what[c], "status %s, message \"%s\" (want %s), outputs %s", ak_status_str(st),
                   st ? ak_last_error() : "", field[c], untouched ? "untouched" : "WRITTEN");
    }
    tbuf_free(&ob);
    tbuf_free(&lb);
    ak_backend_destroy(b);
    scene_free(&sc);
}

/* ---- the block allocator: counts that would overflow --------------------------- */

/* A cache of 6 blocks of 1 head of 8 (f16), CPU. */
static ak_kv_cache *small_cache(void)
{
    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.num_blocks = 6;
    kc.num_kv_heads = 1;
    kc.head_dim_qk = kc.head_dim_vo = 8;
    ak_kv_cache *c = NULL;
    return ak_kv_cache_create(&kc, &c) == AK_OK ? c : NULL;
}

/* ak_kv_cache_share added to an int32 count with no check: a block shared
 * 2^31 times had a negative count. A rejected list changes nothing. */
static void hostile_refcount_overflow(test_ctx *t)
{
    ak_kv_cache *c = small_cache();
    int32_t a[3];
    if (!c || ak_kv_cache_alloc(c, 3, a) != AK_OK) {
        t_fail(t, NULL, "allocator: share past INT32_MAX references", "cannot make the cache: %s", ak_last_error());
        ak_kv_cache_destroy(c);
        return;
    }
    ak_kv_cache_debug_set_refcount(c, a[0], INT32_MAX - 1);
    const int32_t list[3] = {a[1], a[0], a[0]};
    ak_status st = ak_kv_cache_share(c, 3, list);
    CHECK(t, "allocator: share past INT32_MAX references", st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "block_ids[2]") &&
          strstr(ak_last_error(), "INT32_MAX"), "status %s: %s", ak_status_str(st), ak_last_error());
    CHECK(t, "allocator: a rejected share changes nothing",
          ak_kv_cache_refcount(c, a[0]) == INT32_MAX - 1 && ak_kv_cache_refcount(c, a[1]) == 1 &&
              ak_kv_cache_num_free(c) == 3,
          "refcounts %d %d, %d free", ak_kv_cache_refcount(c, a[0]), ak_kv_cache_refcount(c, a[1]),
          ak_kv_cache_num_free(c));
    st = ak_kv_cache_share(c, 1, &a[0]);
    CHECK(t, "allocator: share up to INT32_MAX references", st == AK_OK && ak_kv_cache_refcount(c, a[0]) == INT32_MAX,
          "status %s, refcount %d", ak_status_str(st), ak_kv_cache_refcount(c, a[0]));
    st = ak_kv_cache_share(c, 1, &a[0]);
    CHECK(t, "allocator: share at INT32_MAX references", st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "block_ids[0]") &&
          ak_kv_cache_refcount(c, a[0]) == INT32_MAX, "status %s, refcount %d", ak_status_str(st),
          ak_kv_cache_refcount(c, a[0]));

    /* free: a list naming a block more often than it has references is
     * rejected where it fails, and nothing it freed before that stays freed */
    const int32_t too_many[4] = {a[2], a[1], a[2], a[1]};
    st = ak_kv_cache_free(c, 4, too_many);
    CHECK(t, "allocator: a rejected free changes nothing",
          st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "block_ids[2]") && ak_kv_cache_refcount(c, a[1]) == 1 &&
              ak_kv_cache_refcount(c, a[2]) == 1 && ak_kv_cache_num_free(c) == 3,
          "status %s (%s), refcounts %d %d, %d free", ak_status_str(st), ak_last_error(),
          ak_kv_cache_refcount(c, a[1]), ak_kv_cache_refcount(c, a[2]), ak_kv_cache_num_free(c));
    /* the pool still hands out exactly the 3 free blocks, none of a[] */
    int32_t rest[4];
    st = ak_kv_cache_alloc(c, 3, rest);
    int fresh = st == AK_OK;
    for (int i = 0; i < 3 && fresh; i++)
        for (int j = 0; j < 3; j++) fresh &= rest[i] != a[j] && (j >= i || rest[i] != rest[j]);
    CHECK(t, "allocator: after a rejected free the pool is intact", fresh && ak_kv_cache_alloc(c, 1, &rest[3]) ==
          AK_ERR_OUT_OF_BLOCKS, "status %s, ids %d %d %d", ak_status_str(st), rest[0], rest[1], rest[2]);
    ak_kv_cache_destroy(c);
}

/* ---- the case table: configs at the edges of int32 --------------------------- */

#define NHD AK_LAYOUT_NHD
#define PAGED AK_KV_PAGED

/* name, Hq, Hkv, Dqk, Dvo, dtype, o_dtype(unused), o_f32, causal, window, cap,
 * page, layout, storage, num_reqs, {q_len, kv_len}... */
static const attn_case edge_cases[] = {
    /* non-causal queries past their keys sit at negative positions p, and
     * p - window_left overflowed int: the rows then saw no key */
    {"window INT32_MAX, non-causal q_len > kv_len", 4, 2, 64, 64, AK_F32, 0, 0, 0, INT32_MAX, 0, 16, NHD, PAGED, 3,
     {{5, 2}, {1, 3}, {3, 0}}},
    {"window INT32_MAX, non-causal q_len > kv_len bf16", 8, 2, 128, 128, AK_BF16, 0, 0, 0, INT32_MAX, 0, 16, NHD,
     PAGED, 3, {{40, 7}, {1, 3}, {70, 100}}},
    {"window INT32_MAX - 1, causal", 4, 2, 64, 64, AK_F16, 0, 0, 1, INT32_MAX - 1, 0, 16, NHD, PAGED, 2,
     {{1, 40}, {20, 20}}},
};

/* Soft-caps from far below the logits to far above them, on every backend
 * against cpu_ref: the cpu kernel's tanh lost every digit for small
 * arguments, so a large cap flattened every logit to 0 (o off by 0.16 at
 * 1e8). A decode, a chunk on a prefix, a prefill, and a long decode that
 * splits over its keys. */
static void run_soft_caps(test_ctx *t)
{
    static const float caps[] = {1e-3f, 1e-1f, 1.0f, 30.0f, 1e2f, 1e4f, 1e6f, 1e8f};
    static const ak_dtype dtypes[] = {AK_F32, AK_BF16, AK_F16};
    static char name[96];
    for (size_t c = 0; c < sizeof caps / sizeof *caps; c++)
        for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
            attn_case tc = {NULL, 8, 2, 128, 128, dtypes[d], 0, 0, 1, -1, caps[c], 16, NHD, PAGED, 4,
                            {{1, 300}, {20, 60}, {33, 33}, {1, 1100}}};
            snprintf(name, sizeof name, "soft-cap %g %s", caps[c], ak_dtype_name(dtypes[d]));
            tc.name = name;
            run_case(t, &tc);
        }
}

/* The shapes of the logit tables below, as cases: prefills over several
 * key tiles, a chunk on a prefix and a decode (short requests: on CUDA the
 * NaN rule's checked path, and its clean one by run_logit_case); named
 * WHAT and the shape. */
static const struct {
    int hq, hk, d, causal;
    ak_dtype dtype;
} logit_shapes[] = {{8, 2, 128, 1, AK_BF16}, {6, 2, 64, 1, AK_BF16}, {4, 2, 96, 1, AK_F16}, {4, 4, 128, 0, AK_F16}};

static attn_case logit_case(size_t h, const char *what)
{
    static char name[96];
    snprintf(name, sizeof name, "%s d%d %s%s", what, logit_shapes[h].d, ak_dtype_name(logit_shapes[h].dtype),
             logit_shapes[h].causal ? "" : " non-causal");
    attn_case tc = {name, logit_shapes[h].hq, logit_shapes[h].hk, logit_shapes[h].d, logit_shapes[h].d,
                    logit_shapes[h].dtype, 0, 0, logit_shapes[h].causal, -1, 0.0f, 16, NHD, PAGED, 4,
                    {{300, 300}, {200, 700}, {1, 1100}, {24, 24}}};
    return tc;
}

/* run_case, and on a CUDA device again with the shorter requests' K/V rows
 * scanned (AK_CUDA_SCAN_SHORT_ROWS=1, "scanned" in the name): their items
 * then take the NaN rule's clean path (a loop of its own in the kernels
 * that have one), where without it these short requests run checked. */
static void run_logit_case(test_ctx *t, const attn_case *tc)
{
    run_case(t, tc);
    if (t->device.kind != AK_DEVICE_CUDA) return;
    char name[128];
    snprintf(name, sizeof name, "%s scanned", tc->name);
    attn_case scanned = *tc;
    scanned.name = name;
    run_case_env(t, &scanned, "AK_CUDA_SCAN_SHORT_ROWS", "1");
}

/* Logits far apart: sm_scale up to 4096 / sqrt(d), where a later key
 * tile's maximum passes a row's running one by hundreds (base 2), on every
 * backend against cpu_ref: the online softmax's raises (attn.cuh's lazy
 * rescale) far past its margin. */
static void run_logit_scales(test_ctx *t)
{
    static const float scales[] = {16.0f, 256.0f, 4096.0f};
    char what[48];
    for (size_t s = 0; s < sizeof scales / sizeof *scales; s++)
        for (size_t h = 0; h < sizeof logit_shapes / sizeof *logit_shapes; h++) {
            snprintf(what, sizeof what, "logit scale %g", scales[s]);
            attn_case tc = logit_case(h, what);
            tc.logit_scale = scales[s];
            run_logit_case(t, &tc);
        }
}

/* Logits that climb or fall from key tile to key tile (attn_case's
 * key_drift): a ramp (the reference max raised on many tiles, by a few
 * units at a time) and a step halfway (raised once, by 4-12 units base 2
 * for most rows: a tile of P all past 8 and none past 2^8, then all past
 * 2^8). */
static void run_logit_drifts(test_ctx *t)
{
    static const struct {
        float drift;
        int step;
    } drifts[] = {{40.0f, 0}, {200.0f, 0}, {5.0f, 1}, {12.0f, 1}};
    char what[48];
    for (size_t k = 0; k < sizeof drifts / sizeof *drifts; k++)
        for (size_t h = 0; h < sizeof logit_shapes / sizeof *logit_shapes; h++) {
            snprintf(what, sizeof what, "logit drift %s %g", drifts[k].step ? "step" : "ramp", drifts[k].drift);
            attn_case tc = logit_case(h, what);
            tc.key_drift = drifts[k].drift;
            tc.drift_step = drifts[k].step;
            run_logit_case(t, &tc);
        }
}

void test_hostile(test_ctx *t)
{
    for (size_t i = 0; i < sizeof edge_cases / sizeof *edge_cases; i++) run_case(t, &edge_cases[i]);
    run_soft_caps(t);
    run_logit_scales(t);
    run_logit_drifts(t);

    const char *names[16];
    const int nb = t_backends(t, names, 16);
    for (int i = 0; i < nb; i++) {
        hostile_plan_sizes(t, names[i]);
        hostile_huge_heads(t, names[i]);
        hostile_run_views(t, names[i]);
        hostile_run_tensors(t, names[i]);
        hostile_device_table(t, names[i]);
    }
    hostile_views(t);
    if (t->device.kind != AK_DEVICE_CPU) return; /* device-independent: once, in the CPU run */
    if (t_selected(t, "meta with page_size INT32_MAX")) hostile_meta_huge_page(t);
    hostile_tensor_constructors(t);
    if (t_selected(t, "allocator")) hostile_refcount_overflow(t);
}
