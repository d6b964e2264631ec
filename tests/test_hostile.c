/*
 * test_hostile.c - what a careless or hostile caller may pass: sizes at the
 * edges of int32 and int64, views that would point outside their memory,
 * counts that would overflow. Every such call must fail with a status and a
 * message naming the field, and change nothing; nothing may crash or write
 * outside the memory the call was given.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "harness.h"
#include "internal.h" /* ak_kv_cache_debug_set_refcount */

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
    ak_batch_meta m = {qoi, kvi, idx, last, pos, slots};
    const ak_status st = ak_batch_build_meta(&b, &cfg, NULL, &m);
    const int ok = st == AK_OK && kvi[0] == 0 && kvi[1] == 1 && kvi[2] == 2 && idx[0] == 3 && idx[1] == 1 &&
                   last[0] == 5 && last[1] == 2 && slots[0] == 3LL * INT32_MAX + 4 && slots[2] == (int64_t)INT32_MAX + 1;
    if (ok)
        t_pass(t, NULL, "meta with page_size INT32_MAX", "ok");
    else
        t_fail(t, NULL, "meta with page_size INT32_MAX", "status %s %s; kv_indptr %d %d %d, last page %d %d",
               ak_status_str(st), ak_last_error(), kvi[0], kvi[1], kvi[2], last[0], last[1]);
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

#define CHECK(t, name, cond, ...)                                              \
    do {                                                                       \
        if (cond)                                                              \
            t_pass(t, NULL, name, "ok");                                       \
        else                                                                   \
            t_fail(t, NULL, name, __VA_ARGS__);                                \
    } while (0)

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

void test_hostile(test_ctx *t)
{
    for (size_t i = 0; i < sizeof edge_cases / sizeof *edge_cases; i++) run_case(t, &edge_cases[i]);

    const char *names[16];
    const int nb = t_backends(t, names, 16);
    for (int i = 0; i < nb; i++) hostile_plan_sizes(t, names[i]);
    if (t->device.kind != AK_DEVICE_CPU) return; /* device-independent: once, in the CPU run */
    if (t_selected(t, "meta with page_size INT32_MAX")) hostile_meta_huge_page(t);
    if (t_selected(t, "allocator")) hostile_refcount_overflow(t);
}
