/*
 * bench_scene.h - one benchmark shape made real: the batch (host arrays), the
 * paged KV cache with several layers to rotate through, q and o per layer on
 * the device, the work and bytes of one layer call, and the reference check
 * (cpu_ref on the same data, on a sample of the batch when it is large).
 */
#ifndef AK_BENCH_SCENE_H
#define AK_BENCH_SCENE_H

#include "attnkit.h"
#include "bench_device.h"
#include "scene_core.h"

#include <stddef.h>
#include <stdint.h>

/* ---- models and workloads -------------------------------------------------- */

typedef struct bench_model {
    const char *name;
    int num_qo_heads;  /* per GPU for tensor-parallel presets */
    int num_kv_heads;
    int head_dim_qk;
    int head_dim_vo;
    int window_left;   /* -1: full context */
    float soft_cap;    /* 0: off */
    int sinks;         /* attention sinks (cfg.use_sinks) */
    int num_layers;    /* the model's layers (said when the rotation needs more) */
    int mla;           /* multi-head latent attention (cfg.mla): one KV head, a K-only cache */
    int non_causal;    /* cfg.causal = 0 (an encoder's attention; --non-causal) */
} bench_model;

extern const bench_model bench_models[];
extern const int bench_num_models;
const bench_model *bench_model_find(const char *name); /* NULL if unknown */

typedef enum bench_workload {
    BW_DECODE = 0,  /* every request: one new token on kv_len keys */
    BW_PREFILL = 1, /* every request: a whole prompt, q_len = kv_len */
    BW_EXTEND = 2,  /* every request: a chunk of q_len tokens on a cached prefix */
    BW_MIXED = 3,   /* num_prefills chunks (q_len on a prefix) + decodes, one batch */
    BW_VERIFY = 4,  /* every request: q_len speculative tokens to verify */
    BW_COUNT = 5,
} bench_workload;

const char *bench_workload_name(bench_workload w);
int bench_workload_parse(const char *s, bench_workload *w /* OUT */); /* 0 or -1 */

typedef struct bench_shape {
    bench_workload workload;
    int batch;        /* requests */
    int q_len;        /* new tokens per request (mixed: per prefill chunk) */
    int kv_len;       /* keys per request, new tokens included */
    int num_prefills; /* mixed only: requests that are prefill chunks; the rest decode */
    int decode_kv_len; /* mixed only: keys of each decode (0: kv_len) */
    int lead_kv_len;   /* the first request's keys instead (prefill: its prompt's tokens; 0: as the
                          others): one long request beside short ones */
} bench_shape;

/* ---- the scene ---------------------------------------------------------------- */

typedef struct bench_scene {
    const bd_ctx *ctx;
    const bench_model *model;
    bench_shape shape;
    ak_attn_config cfg;
    ak_limits lim;

    /* the batch, host arrays: shuffled block ids (scene_core.h); b.num_blocks
     * blocks in each layer's pool */
    scn_batch b;

    /* the work of one layer call */
    int64_t visible_keys; /* sum over query tokens of the keys each sees after masking */
    double flops;         /* 2 * (dqk + dvo) * num_qo_heads * visible_keys */
    double bytes;         /* KV rows read (each once) + q + o */
    size_t k_read_bytes;  /* of which K rows */
    size_t v_read_bytes;  /* and V rows (0 for MLA, whose value is in the K row) */

    /* storage, allocated by scene_alloc */
    int num_layers;
    char layers_why[160];
    ak_kv_cache *cache;
    ak_paged_kv *kv;      /* [num_layers] views */
    void *q;              /* device: [num_layers][num_tokens, Hq, Dqk], q_dtype */
    void *o;              /* device: [num_layers][num_tokens, Hq, Dvo], o_dtype */
    size_t q_layer_bytes, o_layer_bytes;
    void *k_new, *v_new;  /* device: [num_tokens, Hk, D] new K/V rows, kv dtype (fp8 KV: q dtype,
                             quantized by ak_kv_update) */
    int64_t *slots;       /* device: [num_tokens] slot mapping of the batch */
    void *q0_host;        /* host copy of layer 0's q */
    /* ragged K/V, when ragged_kv is set before scene_alloc (prompt prefills
     * without prefix only: the step's own K/V are every key): per layer a
     * copy of k_new / v_new, so ragged runs rotate through cold memory as the
     * paged ones do */
    int ragged_kv;
    /* kv_marks, set before scene_alloc: every layer's view carries
     * finiteness marks (ak_paged_kv.marks), zeroed (the random pools are
     * finite), so that run() reads them as an engine's do */
    int kv_marks;
    uint32_t *marks;      /* device: [num_layers][ak_kv_marks_words] */
    void *k_rag, *v_rag;  /* device: [num_layers][num_kv_tokens, Hk, D] */
    size_t k_rag_layer_bytes, v_rag_layer_bytes;
    float *sinks_host;    /* [Hq] sink logits (cfg.use_sinks), one set for every layer */
    void *sinks;          /* device copy */
    /* fp8 KV: per-head scales of 1 (the values are random fp8 codes as they
     * are), so that run() and ak_kv_update read scales as an engine's do */
    float *kv_scales_host; /* [Hk] */
    float *kv_scales;      /* device copy, K's and V's */
} bench_scene;

/* Fills cfg, lim, the batch and the accounting for a shape (host only, cheap):
 * q and o in dtype, K/V in kv_dtype. Returns 0, or -1 after printing why the
 * shape is invalid. */
int scene_init(bench_scene *sc, const bd_ctx *ctx, const bench_model *m, const bench_shape *shape,
               ak_dtype dtype, ak_dtype kv_dtype, int page_size, ak_kv_layout layout, int batch_invariant,
               uint64_t seed);
/* The fp8 scales of the scene's K/V into ragged run arguments (nothing for
 * other dtypes; paged views carry their own). */
void scene_ragged_scales(const bench_scene *sc, ak_run_args *args);

/* Allocates and fills the storage: layers (layers_override > 0, else enough
 * that together they exceed 4x the cache, as far as memory allows), random K/V everywhere, the new tokens' rows written
 * with ak_kv_update, random q per layer, and (ragged_kv) each layer's ragged
 * K/V holding the same values as k_new / v_new. Returns 0 or -1. */
int scene_alloc(bench_scene *sc, int layers_override, uint64_t seed);
void scene_free(bench_scene *sc);

/* q, o of layer l as tensors for ak_run_args. */
ak_tensor scene_q(const bench_scene *sc, int layer);
ak_tensor scene_o(const bench_scene *sc, int layer);
/* The new K/V rows as tensors for ak_kv_update. */
ak_tensor scene_k_new(const bench_scene *sc);
ak_tensor scene_v_new(const bench_scene *sc);
/* The sink logits as a tensor for ak_run_args.sinks (cfg.use_sinks). */
ak_tensor scene_sinks(const bench_scene *sc);
/* Layer l's ragged K/V (ragged_kv scenes) as tensors for ak_run_args. */
ak_tensor scene_k_rag(const bench_scene *sc, int layer);
ak_tensor scene_v_rag(const bench_scene *sc, int layer);

/* One-line description of the batch ("64 requests: 62 decodes + 2 chunks of ...").  */
void scene_describe(const bench_scene *sc, char *buf, size_t cap);

/* ---- the reference ---------------------------------------------------------------- */

typedef struct bench_ref {
    int num_subs;          /* sub-requests checked */
    int num_sub_tokens;
    int num_src_reqs;      /* distinct requests of the batch they come from */
    int sampled;           /* 1: a sample, not every token of the batch */
    int32_t *sub_indptr;   /* [num_subs + 1] into src_token */
    int32_t *src_token;    /* [num_sub_tokens] token index in the batch */
    float *o;              /* [num_sub_tokens, Hq, Dvo] cpu_ref output, f32 */
    double seconds;        /* cpu_ref time */
} bench_ref;

/* Runs cpu_ref on layer 0 of the scene: every token when that is cheap,
 * else tails (and, causal, a head and a middle token) of a spread of
 * requests, prefill chunks first. Returns 0 or -1. */
int ref_build(bench_ref *ref, const bench_scene *sc);
void ref_free(bench_ref *ref);
void ref_describe(const bench_ref *ref, const bench_scene *sc, char *buf, size_t cap);

/* Compares layer 0's o (host copy, o_dtype, [num_tokens, Hq, Dvo]) with the
 * reference: the largest relative (Frobenius) error over the sub-requests;
 * +inf and a message in bad when a value is NaN (anywhere in o: the output
 * was poisoned before the run, so NaN also means "not written"). */
double ref_compare(const bench_ref *ref, const bench_scene *sc, const void *o_host, char *bad, size_t cap);

/* Relative error a backend may have in this dtype (as the test harness). */
double ref_tolerance(ak_dtype o_dtype);

#endif
