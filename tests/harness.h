/*
 * harness.h - the test harness shared by every test file: results, random
 * inputs, buffers on the CPU or the GPU with guard bytes, the test scene
 * (a paged cache filled from logical per-request K/V), and the dense oracle.
 */
#ifndef AK_TEST_HARNESS_H
#define AK_TEST_HARNESS_H

#include "attnkit.h"
#include "scene_core.h"

#include <stddef.h>
#include <stdint.h>

/* ---- results ----------------------------------------------------------- */

typedef struct test_ctx {
    ak_device device;     /* which device's backends are under test */
    const char *backend;  /* only this backend (NULL = all) */
    const char *filter;   /* only cases whose name contains this */
    const char *skip[8];  /* ... and none of these (num_skip of them) */
    int num_skip;
    int shard, shards;    /* only cases whose name hashes to shard (mod shards); shards 0: all */
    int storage;          /* -1: every case; else only cases on this ak_kv_storage */
    uint64_t seed;
    int verbose;
    int passed, failed, skipped;
} test_ctx;

void t_pass(test_ctx *t, const char *backend, const char *name, const char *fmt, ...);
void t_fail(test_ctx *t, const char *backend, const char *name, const char *fmt, ...);

/* One named check of a suite without a backend: a pass, or a failure with
 * the message the format arguments make. */
#define CHECK(t, name, cond, ...)                                              \
    do {                                                                       \
        if (cond)                                                              \
            t_pass(t, NULL, name, "ok");                                       \
        else                                                                   \
            t_fail(t, NULL, name, __VA_ARGS__);                                \
    } while (0)
void t_skip(test_ctx *t, const char *backend, const char *name, const char *fmt, ...);
int t_selected(const test_ctx *t, const char *name);
/* 0 when --storage excludes cases on K/V storage s. */
int t_storage_selected(const test_ctx *t, ak_kv_storage s);

/* Runs fn(arg) with the environment variable var set to value (NULL:
 * unset), then restores var as it was: for the engines' switches read at
 * create (AK_CUDA_SCAN_SHORT, ...). */
void t_with_env(const char *var, const char *value, void (*fn)(void *), void *arg);

/* Backends of the device under test (in registry order). */
int t_backends(const test_ctx *t, const char **names, int cap);

/* Random values (scn_rng_next, scn_uniform, scn_rng_int, scn_shuffle_i32,
 * scn_name_hash), device memory and batches come from tools/scene_core.h,
 * shared with attnkit-bench. */

/* ---- buffers: host mirror + device copy, with guard bytes --------------- */

#define GUARD_BYTES 256
#define GUARD_BYTE 0xA5
#define POISON_BYTE 0xFF /* all-ones is NaN in f32, f16 and bf16 */

typedef struct tbuf {
    ak_device dev;
    size_t bytes;      /* payload */
    unsigned char *host; /* [GUARD | payload | GUARD] */
    unsigned char *raw;  /* device (or host) allocation with the same layout */
} tbuf;

int tbuf_alloc(tbuf *b, ak_device dev, size_t bytes);
void tbuf_free(tbuf *b);
void *tbuf_data(const tbuf *b);    /* payload address on b->dev */
void *tbuf_host(const tbuf *b);    /* payload address in the host mirror */
void tbuf_upload(tbuf *b);         /* host mirror (with guards) -> device */
void tbuf_download(tbuf *b);       /* device -> host mirror */
void tbuf_poison(tbuf *b);         /* payload POISON, guards GUARD, uploaded */
int tbuf_guards_ok(const tbuf *b); /* after download */
void dev_sync(ak_device dev);
void dev_copy_to(ak_device dev, void *dst, const void *src, size_t bytes);   /* host -> dev */
void dev_copy_from(ak_device dev, void *dst, const void *src, size_t bytes); /* dev -> host */

/* ---- the scene: one batch on a paged (or ragged) cache ------------------- */

typedef struct req_spec {
    int q_len, kv_len;
} req_spec;

#define MAX_REQS 80
/* The most KV heads of a case. */
#define AK_TEST_MAX_KV_HEADS 64

typedef struct attn_case {
    const char *name;
    int num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo;
    ak_dtype dtype;      /* q, kv and o */
    int sinks;           /* 1: cfg.use_sinks, a random sink logit per query head */
    int o_f32;           /* 1: o in f32 whatever dtype is (else o in dtype) */
    int causal, window_left;
    float soft_cap;
    int page_size;
    ak_kv_layout layout;
    ak_kv_storage storage;
    int num_reqs;
    req_spec reqs[MAX_REQS];
    /* fp8 KV (kv_fp8 = 1): K/V in fp8_e4m3 with scales of kind kv_scale
     * (random per head or per layer), q and o in dtype; the logical K/V are
     * the dequantized values */
    int kv_fp8;
    ak_kv_scale_kind kv_scale;
    /* multi-head latent attention (mla = 1, one KV head): the logical V rows
     * are the first head_dim_vo values of the K rows; the cache is K-only
     * (ragged: no V tensor) */
    int mla;
    /* logit_scale > 0: cfg.sm_scale = logit_scale / sqrt(head_dim_qk) (else
     * 0, the default 1 / sqrt(head_dim_qk)) */
    float logit_scale;
    /* key_drift > 0: K row j of a request of L keys gets key_drift x j / L
     * (drift_step: key_drift from key L / 2 on, 0 before) added along a
     * fixed direction of alternating signs, so that a query row's logits
     * climb (or fall, as its q leans along that direction) from key tile to
     * key tile: the online softmax raises its reference max again and again
     * (or once, at the step) */
    float key_drift;
    int drift_step;
} attn_case;

/* Case tables list attn_case's fields in order up to the last they need
 * (reqs, for most): the rest are 0. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

typedef struct scene {
    attn_case tc;
    ak_attn_config cfg;
    ak_limits lim;
    scn_batch b;          /* the batch: lengths, block table of shuffled ids */
    /* logical data, already rounded to the dtype, as f32 */
    float *q;             /* [num_tokens, Hq, Dqk] */
    float **k, **v;       /* per request [kv_len, Hkv, D] */
    /* storage on the device */
    ak_kv_cache *cache;   /* paged */
    ak_paged_kv kv;
    tbuf q_buf, k_rag, v_rag; /* ragged K/V */
    float *sinks;         /* [Hq] sink logits (tc.sinks), else NULL */
    tbuf sinks_buf;       /* the same on the device, f32 */
    float k_scale[AK_TEST_MAX_KV_HEADS], v_scale[AK_TEST_MAX_KV_HEADS]; /* fp8: each KV head's scale */
    tbuf k_scale_buf, v_scale_buf; /* fp8 with scales: [1] or [Hkv] on the device */
    /* paged: scene_run plans with the block table on the host (0), or with
     * the same table in device memory as batch.device_block_table (1) */
    int device_table;
} scene;

ak_attn_config case_config(const attn_case *tc, ak_device dev);
/* Builds a scene: random inputs, the batch (scn_batch_build: shuffled block
 * ids, an unused column, spare blocks), unused cache slots filled with random
 * values, K/V written through the block table by the test's own scatter (not
 * ak_kv_update). Returns 0 on success. */
int scene_build(scene *sc, const attn_case *tc, ak_device dev, uint64_t *rng);
void scene_free(scene *sc);

/* Dense oracle from the logical arrays: o [num_tokens, Hq, Dvo], lse
 * [num_tokens, Hq], fp64. Independent of every backend (no paging). */
void dense_attention(const scene *sc, double *o, double *lse);

/* Runs backend `name` on the scene (with its table as sc->device_table says). On success fills o (f32, [tokens, Hq, Dvo])
 * and lse; returns AK_ERR_UNSUPPORTED (with the reasons in ak_last_error) if
 * the backend cannot serve, another status on failure; guards/NaN problems are
 * reported through *bad (a message, "" if none). */
ak_status scene_run(const scene *sc, const char *name, float *o, float *lse, char *bad, size_t cap);

/* Runs a case on every backend of the device under test whose check()
 * accepts it, against cpu_ref (itself against dense_attention): the case
 * table's runner (test_attn.c), for case tables in other files too. */
void run_case(test_ctx *t, const attn_case *tc);
/* run_case with the environment variable var set to value (NULL: unset)
 * while it runs (the backends read their switches at create), as before
 * after it. */
void run_case_env(test_ctx *t, const attn_case *tc, const char *var, const char *value);

/* Error measures. */
double rel_err_f(const float *x, const double *ref, int64_t n);
/* The largest |x - ref| of an LSE, in units of max(1, |ref| / 64):
 * absolute up to 64, relative past it, where an f32 LSE's own rounding
 * (2^-24 |ref|) outgrows an absolute bound; inf where one is infinite and
 * the other not. */
double max_lse_err(const float *x, const double *ref, int64_t n);
double tolerance(ak_dtype dtype);  /* relative error allowed for o in this dtype */

/* Test suites. */
void test_core(test_ctx *t);
void test_attn_cases(test_ctx *t);
void test_props(test_ctx *t);
void test_bad_input(test_ctx *t);
void test_graphs(test_ctx *t);
void test_hostile(test_ctx *t);
void test_nonfinite(test_ctx *t);
void test_threads(test_ctx *t);
void test_fp8(test_ctx *t);
void test_mla(test_ctx *t);

#endif
