#define _POSIX_C_SOURCE 200809L /* clock_gettime */
/*
 * test_threads.c - attnkit from several threads at once (CPU backends; the
 * statements are in attnkit.h, "Threads"):
 *   - 8 threads, each with its own backends (cpu or cpu_ref) and data, create,
 *     plan and run random batches for a bounded time, each result checked
 *     against cpu_ref (cpu_ref's own against the dense formula);
 *   - 8 threads share one ak_kv_cache and churn its allocator (alloc, share,
 *     free, and the count readers); a block the allocator hands out must be
 *     held by nobody, and at the end every block is free.
 * `make tsan` runs both under ThreadSanitizer (AK_NUM_THREADS=1 there: see
 * the Makefile). AK_TEST_THREAD_SECONDS sets each test's length (1.5 s).
 */
#include "harness.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NUM_WORKERS 8

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double test_seconds(void)
{
    const char *env = getenv("AK_TEST_THREAD_SECONDS");
    const double s = env ? atof(env) : 1.5;
    return s > 0 ? s : 1.5;
}

/* ---- 8 threads, each its own backends and data ------------------------------- */

typedef struct backend_worker {
    const char *backend; /* cpu or cpu_ref */
    uint64_t seed;
    double deadline;
    int runs;
    char why[512];       /* the first failure, "" if none */
} backend_worker;

/* A small random batch: heads, head dim, dtype, page, mask, soft-cap and up
 * to 4 requests of random lengths. */
static attn_case random_case(uint64_t *rng)
{
    static const int heads[3][2] = {{4, 2}, {8, 8}, {8, 1}};
    static const ak_dtype dtypes[3] = {AK_F32, AK_F16, AK_BF16};
    attn_case tc;
    memset(&tc, 0, sizeof tc);
    tc.name = "threads";
    const int h = scn_rng_int(rng, 0, 2);
    tc.num_qo_heads = heads[h][0];
    tc.num_kv_heads = heads[h][1];
    tc.head_dim_qk = tc.head_dim_vo = scn_rng_int(rng, 0, 1) ? 64 : 128;
    tc.dtype = dtypes[scn_rng_int(rng, 0, 2)];
    tc.causal = scn_rng_int(rng, 0, 3) != 0;
    tc.window_left = scn_rng_int(rng, 0, 3) == 0 ? scn_rng_int(rng, 0, 40) : -1;
    tc.soft_cap = scn_rng_int(rng, 0, 3) == 0 ? 20.0f : 0.0f;
    tc.page_size = scn_rng_int(rng, 0, 1) ? 16 : 3;
    tc.layout = scn_rng_int(rng, 0, 1) ? AK_LAYOUT_NHD : AK_LAYOUT_HND;
    tc.storage = AK_KV_PAGED;
    tc.num_reqs = scn_rng_int(rng, 1, 4);
    for (int r = 0; r < tc.num_reqs; r++) {
        const int kv = scn_rng_int(rng, 0, 600);
        int q = scn_rng_int(rng, 0, 2) ? 1 : scn_rng_int(rng, 0, 70);
        if (tc.causal && q > kv) q = kv;
        tc.reqs[r].q_len = q;
        tc.reqs[r].kv_len = kv;
    }
    return tc;
}

static void *run_backend_worker(void *arg)
{
    backend_worker *w = arg;
    const ak_device cpu = {AK_DEVICE_CPU, 0};
    uint64_t rng = w->seed;
    while (!w->why[0] && (w->runs < 2 || now_s() < w->deadline)) {
        const attn_case tc = random_case(&rng);
        scene sc;
        if (scene_build(&sc, &tc, cpu, &rng)) {
            snprintf(w->why, sizeof w->why, "run %d: cannot build the scene", w->runs);
            scene_free(&sc);
            break;
        }
        const int64_t n_o = (int64_t)sc.b.num_tokens * tc.num_qo_heads * tc.head_dim_vo;
        const int64_t n_l = (int64_t)sc.b.num_tokens * tc.num_qo_heads;
        float *o = malloc(sizeof(float) * (size_t)(n_o + 1)), *l = malloc(sizeof(float) * (size_t)(n_l + 1));
        double *ref_o = malloc(sizeof(double) * (size_t)(n_o + 1)), *ref_l = malloc(sizeof(double) * (size_t)(n_l + 1));
        char bad[256];
        ak_status st;
        if (!strcmp(w->backend, "cpu_ref")) {
            dense_attention(&sc, ref_o, ref_l);
        } else {
            float *ro = malloc(sizeof(float) * (size_t)(n_o + 1)), *rl = malloc(sizeof(float) * (size_t)(n_l + 1));
            st = scene_run(&sc, "cpu_ref", ro, rl, bad, sizeof bad);
            if (st != AK_OK || bad[0])
                snprintf(w->why, sizeof w->why, "run %d: cpu_ref: %s %s %s", w->runs, ak_status_str(st),
                         st ? ak_last_error() : "", bad);
            for (int64_t i = 0; i < n_o; i++) ref_o[i] = ro[i];
            for (int64_t i = 0; i < n_l; i++) ref_l[i] = rl[i];
            free(ro);
            free(rl);
        }
        if (!w->why[0]) {
            st = scene_run(&sc, w->backend, o, l, bad, sizeof bad);
            const double tol = tolerance(tc.dtype), lse_tol = tc.dtype == AK_F32 ? 1e-4 : 2e-3;
            const double e = st == AK_OK ? rel_err_f(o, ref_o, n_o) : INFINITY;
            const double le = st == AK_OK ? max_lse_err(l, ref_l, n_l) : INFINITY;
            if (st != AK_OK || bad[0] || !(e <= tol) || !(le <= lse_tol))
                snprintf(w->why, sizeof w->why,
                         "run %d (%d requests, heads %d/%d, d %d, %s): status %s %s %s, rel err %.2e, lse err %.2e",
                         w->runs, tc.num_reqs, tc.num_qo_heads, tc.num_kv_heads, tc.head_dim_qk,
                         ak_dtype_name(tc.dtype), ak_status_str(st), st ? ak_last_error() : "", bad, e, le);
        }
        free(o);
        free(l);
        free(ref_o);
        free(ref_l);
        scene_free(&sc);
        w->runs++;
    }
    return NULL;
}

static void threads_backends(test_ctx *t)
{
    const char *name = "threads: 8 threads plan and run their own backends";
    if (!t_selected(t, name)) return;
    backend_worker w[NUM_WORKERS];
    pthread_t th[NUM_WORKERS];
    const double deadline = now_s() + test_seconds();
    for (int i = 0; i < NUM_WORKERS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].backend = i % 2 ? "cpu_ref" : "cpu";
        w[i].seed = t->seed ^ scn_name_hash(name) ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
        w[i].deadline = deadline;
        if (pthread_create(&th[i], NULL, run_backend_worker, &w[i]) != 0) {
            t_fail(t, NULL, name, "cannot start thread %d", i);
            for (int j = 0; j < i; j++) pthread_join(th[j], NULL);
            return;
        }
    }
    int runs = 0, failed = 0;
    for (int i = 0; i < NUM_WORKERS; i++) {
        pthread_join(th[i], NULL);
        runs += w[i].runs;
        if (w[i].why[0]) {
            failed = 1;
            t_fail(t, w[i].backend, name, "thread %d: %s", i, w[i].why);
        }
    }
    if (!failed) t_pass(t, NULL, name, "%d runs", runs);
}

/* ---- 8 threads, one allocator ------------------------------------------------ */

#define CACHE_BLOCKS 64
#define HELD_MAX 24 /* references one thread holds at most */

typedef struct alloc_shared {
    ak_kv_cache *cache;
    atomic_int held[CACHE_BLOCKS]; /* references the threads hold, per block */
    double deadline;
} alloc_shared;

typedef struct alloc_worker {
    alloc_shared *sh;
    uint64_t seed;
    long ops;
    char why[256];
} alloc_worker;

static void *run_alloc_worker(void *arg)
{
    alloc_worker *w = arg;
    alloc_shared *sh = w->sh;
    int32_t mine[HELD_MAX]; /* the references this thread holds (a block may appear twice) */
    int n = 0;
    uint64_t rng = w->seed;
    while (!w->why[0] && (w->ops < 1000 || now_s() < sh->deadline)) {
        const int op = scn_rng_int(&rng, 0, 9);
        if (op < 4 && n < HELD_MAX) { /* alloc 1..4 */
            int32_t ids[4];
            const int k = scn_rng_int(&rng, 1, HELD_MAX - n < 4 ? HELD_MAX - n : 4);
            const ak_status st = ak_kv_cache_alloc(sh->cache, k, ids);
            if (st == AK_OK) {
                for (int i = 0; i < k; i++) {
                    if (atomic_fetch_add(&sh->held[ids[i]], 1) != 0)
                        snprintf(w->why, sizeof w->why, "block %d was handed out while held", ids[i]);
                    mine[n++] = ids[i];
                }
            } else if (st != AK_ERR_OUT_OF_BLOCKS) {
                snprintf(w->why, sizeof w->why, "alloc: %s", ak_last_error());
            }
        } else if (op < 6 && n > 0 && n < HELD_MAX) { /* share one held block */
            const int32_t id = mine[scn_rng_int(&rng, 0, n - 1)];
            atomic_fetch_add(&sh->held[id], 1);
            if (ak_kv_cache_share(sh->cache, 1, &id) != AK_OK)
                snprintf(w->why, sizeof w->why, "share of held block %d: %s", id, ak_last_error());
            mine[n++] = id;
        } else if (op < 9 && n > 0) { /* free 1..3 held references */
            int32_t ids[3];
            const int k = scn_rng_int(&rng, 1, n < 3 ? n : 3);
            for (int i = 0; i < k; i++) {
                const int at = scn_rng_int(&rng, 0, n - 1);
                ids[i] = mine[at];
                mine[at] = mine[--n];
                /* no longer ours before the allocator can hand it out again */
                atomic_fetch_sub(&sh->held[ids[i]], 1);
            }
            if (ak_kv_cache_free(sh->cache, k, ids) != AK_OK)
                snprintf(w->why, sizeof w->why, "free of held blocks: %s", ak_last_error());
        } else { /* the readers */
            const int free_now = ak_kv_cache_num_free(sh->cache);
            const int32_t id = (int32_t)scn_rng_int(&rng, 0, CACHE_BLOCKS - 1);
            const int refs = ak_kv_cache_refcount(sh->cache, id);
            if (free_now < 0 || free_now > CACHE_BLOCKS || refs < 0)
                snprintf(w->why, sizeof w->why, "readers: %d free, block %d has %d references", free_now, id, refs);
        }
        w->ops++;
    }
    if (n > 0) {
        for (int i = 0; i < n; i++) atomic_fetch_sub(&sh->held[mine[i]], 1);
        if (ak_kv_cache_free(sh->cache, n, mine) != AK_OK && !w->why[0])
            snprintf(w->why, sizeof w->why, "final free: %s", ak_last_error());
    }
    return NULL;
}

static void threads_allocator(test_ctx *t)
{
    const char *name = "threads: 8 threads share one cache's allocator";
    if (!t_selected(t, name)) return;
    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.num_blocks = CACHE_BLOCKS;
    kc.num_kv_heads = 1;
    kc.head_dim_qk = kc.head_dim_vo = 8;
    static alloc_shared sh;
    memset(&sh, 0, sizeof sh);
    if (ak_kv_cache_create(&kc, &sh.cache) != AK_OK) {
        t_fail(t, NULL, name, "cannot create the cache: %s", ak_last_error());
        return;
    }
    for (int b = 0; b < CACHE_BLOCKS; b++) atomic_init(&sh.held[b], 0);
    sh.deadline = now_s() + test_seconds();
    alloc_worker w[NUM_WORKERS];
    pthread_t th[NUM_WORKERS];
    int started = 0;
    for (int i = 0; i < NUM_WORKERS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].sh = &sh;
        w[i].seed = t->seed ^ scn_name_hash(name) ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
        if (pthread_create(&th[i], NULL, run_alloc_worker, &w[i]) != 0) break;
        started++;
    }
    long ops = 0;
    int failed = started < NUM_WORKERS;
    if (failed) t_fail(t, NULL, name, "started %d of %d threads", started, NUM_WORKERS);
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        ops += w[i].ops;
        if (w[i].why[0]) {
            failed = 1;
            t_fail(t, NULL, name, "thread %d: %s", i, w[i].why);
        }
    }
    /* every reference was given back: every block free, and once */
    int counted = 0;
    for (int b = 0; b < CACHE_BLOCKS; b++) counted += ak_kv_cache_refcount(sh.cache, b) != 0;
    const int free_end = ak_kv_cache_num_free(sh.cache);
    int32_t all[CACHE_BLOCKS];
    int distinct = ak_kv_cache_alloc(sh.cache, CACHE_BLOCKS, all) == AK_OK;
    for (int i = 0; i < CACHE_BLOCKS && distinct; i++)
        for (int j = 0; j < i; j++) distinct &= all[i] != all[j];
    if (!failed && (free_end != CACHE_BLOCKS || counted != 0 || !distinct)) {
        failed = 1;
        t_fail(t, NULL, name, "after %ld operations: %d of %d blocks free, %d still counted, the pool %s", ops,
               free_end, CACHE_BLOCKS, counted, distinct ? "intact" : "hands out a block twice");
    }
    if (!failed) t_pass(t, NULL, name, "%ld operations", ops);
    ak_kv_cache_destroy(sh.cache);
}

/* 8 threads write disjoint slots of one view with finiteness marks, the
 * slots of each 32-bit word shared among all of them (thread i: slot % 8 ==
 * i), each its rows finite or not at random; at the end every slot's bit is
 * its last row's (a word updated without atomics loses bits). */
enum { MK_BLOCKS = 4, MK_PAGE = 64, MK_D = 8, MK_SLOTS = MK_BLOCKS * MK_PAGE, MK_ROUNDS = 200 };
typedef struct marks_worker {
    ak_paged_kv kv;
    int id;
    uint64_t seed;
    int last[MK_SLOTS / NUM_WORKERS]; /* each of its slots' last row: 1 if not finite */
    char why[160];
} marks_worker;

static void *run_marks_worker(void *arg)
{
    marks_worker *w = arg;
    enum { N = MK_SLOTS / NUM_WORKERS };
    float k[N][MK_D], v[N][MK_D];
    int64_t slots[N];
    for (int j = 0; j < N; j++) slots[j] = (int64_t)j * NUM_WORKERS + w->id;
    for (int r = 0; r < MK_ROUNDS && !w->why[0]; r++) {
        for (int j = 0; j < N; j++) {
            for (int d = 0; d < MK_D; d++) k[j][d] = v[j][d] = scn_uniform(&w->seed);
            w->last[j] = scn_rng_int(&w->seed, 0, 1);
            if (w->last[j]) (scn_rng_int(&w->seed, 0, 1) ? k : v)[j][scn_rng_int(&w->seed, 0, MK_D - 1)] = INFINITY;
        }
        ak_tensor kt = ak_tensor_3d(k, AK_F32, N, 1, MK_D), vt = ak_tensor_3d(v, AK_F32, N, 1, MK_D);
        if (ak_kv_update(&w->kv, &kt, &vt, slots, N, NULL) != AK_OK)
            snprintf(w->why, sizeof w->why, "ak_kv_update: %s", ak_last_error());
    }
    return NULL;
}

static void threads_marks(test_ctx *t)
{
    const char *name = "threads: 8 threads keep one view's finiteness marks";
    if (!t_selected(t, name)) return;
    static float kp[MK_SLOTS * MK_D], vp[MK_SLOTS * MK_D];
    static uint32_t marks[MK_BLOCKS * 2];
    memset(marks, 0xff, sizeof marks);
    ak_paged_kv kv;
    memset(&kv, 0, sizeof kv);
    kv.k_data = kp;
    kv.v_data = vp;
    kv.dtype = AK_F32;
    kv.layout = AK_LAYOUT_NHD;
    kv.device.kind = AK_DEVICE_CPU;
    kv.num_blocks = MK_BLOCKS;
    kv.page_size = MK_PAGE;
    kv.num_kv_heads = 1;
    kv.head_dim_qk = kv.head_dim_vo = MK_D;
    kv.marks = marks;
    static marks_worker w[NUM_WORKERS];
    pthread_t th[NUM_WORKERS];
    int started = 0;
    for (int i = 0; i < NUM_WORKERS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].kv = kv;
        w[i].id = i;
        w[i].seed = t->seed ^ scn_name_hash(name) ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
        if (pthread_create(&th[i], NULL, run_marks_worker, &w[i]) != 0) break;
        started++;
    }
    int failed = started < NUM_WORKERS;
    if (failed) t_fail(t, NULL, name, "started %d of %d threads", started, NUM_WORKERS);
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        if (w[i].why[0]) {
            failed = 1;
            t_fail(t, NULL, name, "thread %d: %s", i, w[i].why);
        }
    }
    for (int s = 0; s < MK_SLOTS && !failed; s++) {
        const int want = w[s % NUM_WORKERS].last[s / NUM_WORKERS];
        const int got = (marks[(s / MK_PAGE) * 2 + (s % MK_PAGE) / 32] >> (s % 32)) & 1;
        if (got != want) {
            failed = 1;
            t_fail(t, NULL, name, "slot %d's bit is %d, its last row %s", s, got, want ? "not finite" : "finite");
        }
    }
    if (!failed) t_pass(t, NULL, name, "%d rounds of %d threads", MK_ROUNDS, NUM_WORKERS);
}

void test_threads(test_ctx *t)
{
    if (t->device.kind != AK_DEVICE_CPU) return; /* the CPU backends and the host allocator */
    threads_backends(t);
    threads_allocator(t);
    threads_marks(t);
}
