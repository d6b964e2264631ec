/*
 * bench_scene.c - the batch, the multi-layer paged cache, q/o per layer, the
 * accounting of one layer call, and the cpu_ref check. See bench_scene.h.
 */
#include "bench_scene.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- models ------------------------------------------------------------------ */

/* Per-GPU attention shapes of the models engines serve. window_left counts
 * the keys left of the token: Mistral's sliding window of 4096 keys (the
 * token's own included) is window_left 4095. Gemma-2 alternates 4096-window
 * and global layers, gpt-oss 128-window and full ones; the presets model the
 * global ones of Gemma-2 (soft-cap 50) and the windowed ones of gpt-oss
 * (--window -1 gives its full ones). deepseek-v3-prefill is the expanded
 * form of its MLA prefill (head dims 192/128), 128 heads over 8 GPUs;
 * deepseek-v3 and -tp8 its absorbed MLA (cfg.mla: one latent row of 576
 * values per token, V its first 512, a K-only cache), 128 and 16 heads. */
const bench_model bench_models[] = {
    /* name                  Hq  Hkv  Dqk  Dvo  window soft-cap sinks layers mla non-causal */
    {"llama3-8b",            32, 8,   128, 128, -1,    0.0f,    0,    32, 0, 0},
    {"llama3-70b-tp8",       8,  1,   128, 128, -1,    0.0f,    0,    80, 0, 0}, /* 64/8 heads over 8 GPUs */
    {"qwen2.5-7b",           28, 4,   128, 128, -1,    0.0f,    0,    28, 0, 0},
    {"mistral-7b",           32, 8,   128, 128, 4095,  0.0f,    0,    32, 0, 0},
    {"gemma2-9b",            16, 8,   256, 256, -1,    50.0f,   0,    42, 0, 0},
    {"phi3-mini",            32, 32,  96,  96,  -1,    0.0f,    0,    32, 0, 0},
    {"gpt-oss-20b",          64, 8,   64,  64,  127,   0.0f,    1,    24, 0, 0},
    {"deepseek-v3-prefill",  16, 16,  192, 128, -1,    0.0f,    0,    61, 0, 0},
    /* MLA decode in the absorbed form: one latent row of 512 + 64 per token */
    {"deepseek-v3",          128, 1,  576, 512, -1,    0.0f,    0,    61, 1, 0},
    {"deepseek-v3-tp8",      16, 1,   576, 512, -1,    0.0f,    0,    61, 1, 0}, /* 128 heads over 8 GPUs */
};
const int bench_num_models = (int)(sizeof bench_models / sizeof bench_models[0]);

const bench_model *bench_model_find(const char *name)
{
    for (int i = 0; i < bench_num_models; i++)
        if (!strcmp(bench_models[i].name, name)) return &bench_models[i];
    return NULL;
}

static const char *const workload_names[BW_COUNT] = {"decode", "prefill", "extend", "mixed", "verify"};

const char *bench_workload_name(bench_workload w)
{
    return w >= 0 && w < BW_COUNT ? workload_names[w] : "unknown";
}

int bench_workload_parse(const char *s, bench_workload *w)
{
    for (int i = 0; i < BW_COUNT; i++)
        if (!strcmp(s, workload_names[i])) {
            *w = (bench_workload)i;
            return 0;
        }
    return -1;
}

/* ---- random data ---------------------------------------------------------------- */

/* A seed per (run seed, tensor, layer), so every buffer differs. */
static uint64_t derive_seed(uint64_t seed, uint64_t tensor, uint64_t layer)
{
    uint64_t s = seed ^ (tensor * 0xd1b54a32d192ed03ull) ^ (layer * 0x8cb92ba72f3d8dd7ull);
    return scn_rng_next(&s);
}

/* Elements per independently seeded chunk: the values depend only on the seed
 * and the element index, whatever the thread count or staging size. */
#define FILL_CHUNK ((size_t)1 << 16)
/* Host staging for filling device memory (elements, a multiple of FILL_CHUNK). */
#define STAGE_ELEMS (FILL_CHUNK * 128)

/* Values generated at a time before their conversion to the dtype. */
#define FILL_BATCH 1024

/* Writes n random values (scale * [-1, 1), rounded to t) at dst, which holds
 * elements first .. first + n - 1 of the tensor; first % FILL_CHUNK == 0. */
static void fill_random_host(void *dst, ak_dtype t, size_t first, size_t n, float scale, uint64_t seed)
{
    const long long nchunks = (long long)((n + FILL_CHUNK - 1) / FILL_CHUNK);
    const size_t esz = ak_dtype_size(t);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(ak_cpu_num_threads())
#endif
    for (long long c = 0; c < nchunks; c++) {
        uint64_t s = seed ^ ((first / FILL_CHUNK + (size_t)c) * 0x9e3779b97f4a7c15ull);
        scn_rng_next(&s);
        const size_t lo = (size_t)c * FILL_CHUNK, hi = lo + FILL_CHUNK < n ? lo + FILL_CHUNK : n;
        float vals[FILL_BATCH];
        for (size_t i = lo; i < hi; i += FILL_BATCH) {
            const size_t m = hi - i < FILL_BATCH ? hi - i : FILL_BATCH;
            for (size_t j = 0; j < m; j++) vals[j] = scale * scn_uniform(&s);
            ak_convert(vals, AK_F32, (char *)dst + i * esz, t, m); /* from f32 to a known dtype: cannot fail */
        }
    }
}

/* Fills n elements of device memory (through a host staging buffer on the GPU). */
static int fill_random(const bd_ctx *ctx, void *dst, ak_dtype t, size_t n, float scale, uint64_t seed)
{
    if (ctx->dev.kind == AK_DEVICE_CPU) {
        fill_random_host(dst, t, 0, n, scale, seed);
        return 0;
    }
    const size_t esz = ak_dtype_size(t);
    const size_t stage_n = n < STAGE_ELEMS ? n : STAGE_ELEMS;
    void *stage = malloc(stage_n * esz + 1);
    if (!stage) {
        fprintf(stderr, "attnkit-bench: cannot allocate %zu bytes of staging\n", stage_n * esz);
        return -1;
    }
    int rc = 0;
    for (size_t off = 0; off < n && rc == 0; off += stage_n) {
        const size_t m = n - off < stage_n ? n - off : stage_n;
        fill_random_host(stage, t, off, m, scale, seed);
        rc = bd_upload(ctx, (char *)dst + off * esz, stage, m * esz);
    }
    free(stage);
    return rc;
}

/* ---- the batch and its accounting ---------------------------------------------------- */

int scene_init(bench_scene *sc, const bd_ctx *ctx, const bench_model *m, const bench_shape *shape,
               ak_dtype dtype, ak_dtype kv_dtype, int page_size, ak_kv_layout layout, int batch_invariant,
               uint64_t seed)
{
    memset(sc, 0, sizeof *sc);
    sc->ctx = ctx;
    sc->model = m;
    sc->shape = *shape;
    const bench_shape *s = shape;
    if (s->batch < 1 || s->q_len < 1 || s->kv_len < 1 || page_size < 1) {
        fprintf(stderr, "attnkit-bench: batch, q_len, kv_len and page size must be positive\n");
        return -1;
    }
    if (s->q_len > s->kv_len) {
        fprintf(stderr, "attnkit-bench: q_len %d > kv_len %d: the new tokens are part of the KV\n", s->q_len,
                s->kv_len);
        return -1;
    }
    if (s->workload == BW_MIXED && (s->num_prefills < 0 || s->num_prefills > s->batch)) {
        fprintf(stderr, "attnkit-bench: mixed batch of %d requests cannot hold %d prefill chunks\n", s->batch,
                s->num_prefills);
        return -1;
    }

    ak_attn_config *c = &sc->cfg;
    ak_attn_config_init(c);
    c->num_qo_heads = m->num_qo_heads;
    c->num_kv_heads = m->num_kv_heads;
    c->head_dim_qk = m->head_dim_qk;
    c->head_dim_vo = m->head_dim_vo;
    c->causal = !m->non_causal;
    c->window_left = m->window_left;
    c->logits_soft_cap = m->soft_cap;
    c->use_sinks = m->sinks;
    c->mla = m->mla;
    c->batch_invariant = batch_invariant;
    c->q_dtype = c->o_dtype = dtype;
    c->kv_dtype = kv_dtype;
    c->device = ctx->dev;
    c->kv_storage = AK_KV_PAGED;
    c->kv_layout = layout;
    c->page_size = page_size;
    /* an all-decode batch goes to a decode instance, as an engine plans it */
    c->workload = s->workload == BW_DECODE ? AK_WORKLOAD_DECODE : AK_WORKLOAD_ANY;

    /* requests: decodes first, then the prefill chunks (the order engines use
     * when decode and prefill kernels share one batch); each its own blocks,
     * shuffled, and spare blocks that hold random data a wrong id would read */
    const int R = s->batch;
    const int first_chunk = s->workload == BW_MIXED ? R - s->num_prefills : 0;
    int32_t *q_lens = malloc(sizeof(int32_t) * (size_t)R), *kv_lens = malloc(sizeof(int32_t) * (size_t)R);
    if (!q_lens || !kv_lens) {
        free(q_lens);
        free(kv_lens);
        goto oom;
    }
    int64_t tokens = 0, blocks = 0;
    for (int r = 0; r < R; r++) {
        const int decode = s->workload == BW_DECODE || (s->workload == BW_MIXED && r < first_chunk);
        q_lens[r] = decode ? 1 : s->q_len;
        kv_lens[r] = decode && s->workload == BW_MIXED && s->decode_kv_len ? s->decode_kv_len : s->kv_len;
        if (r == 0 && s->lead_kv_len) {
            kv_lens[0] = s->lead_kv_len;
            if (s->workload == BW_PREFILL) q_lens[0] = s->lead_kv_len;
        }
        tokens += q_lens[r];
        blocks += ((int64_t)kv_lens[r] + page_size - 1) / page_size;
    }
    uint64_t rs = derive_seed(seed, 1, 0);
    const int built = tokens <= INT32_MAX ? scn_batch_build(&sc->b, R, q_lens, kv_lens, page_size, 0, 0, &rs) : -1;
    free(q_lens);
    free(kv_lens);
    if (built) {
        fprintf(stderr,
                "attnkit-bench: a batch of %lld query tokens over %lld blocks of %d keys does not fit in memory or "
                "int32 (each count must be below 2^31)\n",
                (long long)tokens, (long long)blocks, page_size);
        return -1;
    }
    sc->lim = sc->b.lim;

    /* accounting: keys each query sees, and KV rows read (each once per request) */
    const int Hq = c->num_qo_heads, Hk = c->num_kv_heads, Dqk = c->head_dim_qk, Dvo = c->head_dim_vo;
    int64_t kv_rows_read = 0;
    for (int r = 0; r < R; r++) {
        const int Q = sc->b.qo_indptr[r + 1] - sc->b.qo_indptr[r], L = sc->b.kv_lens[r];
        int first_lo = 0, last_hi = -1;
        for (int i = 0; i < Q; i++) {
            int lo, hi;
            scn_visible(c, L, L - Q + i, &lo, &hi);
            if (hi >= lo) sc->visible_keys += hi - lo + 1;
            if (i == 0) first_lo = lo;
            if (i == Q - 1) last_hi = hi;
        }
        /* the visible ranges slide right with p, so their union is one range */
        if (Q > 0 && last_hi >= first_lo) kv_rows_read += last_hi - first_lo + 1;
    }
    sc->flops = 2.0 * ((double)Dqk + Dvo) * (double)Hq * (double)sc->visible_keys;
    /* MLA: a key's value is part of its K row, read once */
    const size_t kv_esz = ak_dtype_size(c->kv_dtype);
    sc->k_read_bytes = (size_t)kv_rows_read * Hk * Dqk * kv_esz;
    sc->v_read_bytes = c->mla ? 0 : (size_t)kv_rows_read * Hk * Dvo * kv_esz;
    sc->bytes = (double)kv_rows_read * Hk * (Dqk + (c->mla ? 0 : Dvo)) * (double)ak_dtype_size(c->kv_dtype) +
                (double)sc->b.num_tokens * Hq *
                    ((double)Dqk * ak_dtype_size(c->q_dtype) + (double)Dvo * ak_dtype_size(c->o_dtype));
    return 0;
oom:
    fprintf(stderr, "attnkit-bench: out of host memory for the batch\n");
    return -1;
}

void scene_describe(const bench_scene *sc, char *buf, size_t cap)
{
    const bench_shape *s = &sc->shape;
    const bench_model *m = sc->model;
    const ak_attn_config *c = &sc->cfg;
    char what[192];
    const char *es = s->batch == 1 ? "" : "s"; /* plural of a request kind */
    switch (s->workload) {
    case BW_DECODE: snprintf(what, sizeof what, "%d decode%s on %d keys", s->batch, es, s->kv_len); break;
    case BW_PREFILL: snprintf(what, sizeof what, "%d prefill%s of %d tokens", s->batch, es, s->q_len); break;
    case BW_EXTEND:
        snprintf(what, sizeof what, "%d chunk%s of %d tokens on a %d-token prefix", s->batch, es, s->q_len,
                 s->kv_len - s->q_len);
        break;
    case BW_VERIFY:
        snprintf(what, sizeof what, "%d verification%s of %d tokens on %d keys", s->batch, es, s->q_len,
                 s->kv_len);
        break;
    case BW_MIXED:
        snprintf(what, sizeof what, "%d decodes on %d keys + %d prefill chunks of %d tokens on a %d-token prefix",
                 s->batch - s->num_prefills, s->decode_kv_len ? s->decode_kv_len : s->kv_len, s->num_prefills,
                 s->q_len, s->kv_len - s->q_len);
        break;
    default: snprintf(what, sizeof what, "?"); break;
    }
    char extra[96] = "";
    if (s->lead_kv_len) snprintf(extra, sizeof extra, ", the first on %d keys", s->lead_kv_len);
    if (c->window_left >= 0)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", window %d", c->window_left + 1);
    if (c->logits_soft_cap > 0)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", soft-cap %g", c->logits_soft_cap);
    if (c->use_sinks) snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", sinks");
    if (c->batch_invariant) snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", batch-invariant");
    if (sc->kv_marks) snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", kv marks");
    char dims[24];
    if (c->head_dim_qk == c->head_dim_vo) snprintf(dims, sizeof dims, "%d", c->head_dim_qk);
    else snprintf(dims, sizeof dims, "%d/%d", c->head_dim_qk, c->head_dim_vo);
    snprintf(buf, cap, "%s %s (%d/%d heads, head_dim %s%s) %s page %d: %s; %d query tokens, %lld keys",
             bench_workload_name(s->workload), m->name, c->num_qo_heads, c->num_kv_heads, dims, extra,
             ak_dtype_name(c->kv_dtype), c->page_size, what, sc->b.num_tokens, (long long)sc->b.num_kv_tokens);
}

/* ---- storage ------------------------------------------------------------------------ */

/* Layers whose KV together exceed this many times the cache (L2 / LLC), so a
 * timed call finds its layer's data in memory, not in cache, as in a real step. */
#define ROTATE_CACHE_FACTOR 4.0
/* An upper bound on the rotation, for batches of a few keys. */
#define MAX_ROTATE_LAYERS 4096

ak_tensor scene_q(const bench_scene *sc, int layer)
{
    return ak_tensor_3d((char *)sc->q + (size_t)layer * sc->q_layer_bytes, sc->cfg.q_dtype, sc->b.num_tokens,
                        sc->cfg.num_qo_heads, sc->cfg.head_dim_qk);
}

ak_tensor scene_o(const bench_scene *sc, int layer)
{
    return ak_tensor_3d((char *)sc->o + (size_t)layer * sc->o_layer_bytes, sc->cfg.o_dtype, sc->b.num_tokens,
                        sc->cfg.num_qo_heads, sc->cfg.head_dim_vo);
}

/* The dtype of the step's new K/V rows: the cache's, or for an fp8 cache the
 * projections' (q's), which ak_kv_update quantizes. */
static ak_dtype new_rows_dtype(const ak_attn_config *c)
{
    return c->kv_dtype == AK_FP8_E4M3 ? c->q_dtype : c->kv_dtype;
}

ak_tensor scene_k_new(const bench_scene *sc)
{
    return ak_tensor_3d(sc->k_new, new_rows_dtype(&sc->cfg), sc->b.num_tokens, sc->cfg.num_kv_heads,
                        sc->cfg.head_dim_qk);
}

ak_tensor scene_v_new(const bench_scene *sc)
{
    return ak_tensor_3d(sc->v_new, new_rows_dtype(&sc->cfg), sc->b.num_tokens, sc->cfg.num_kv_heads,
                        sc->cfg.head_dim_vo);
}

void scene_ragged_scales(const bench_scene *sc, ak_run_args *args)
{
    if (sc->cfg.kv_dtype != AK_FP8_E4M3) return;
    args->kv_scale_kind = AK_KV_SCALE_PER_HEAD;
    args->k_scale = sc->kv_scales;
    args->v_scale = sc->cfg.mla ? NULL : sc->kv_scales; /* MLA: k_scale scales the value too */
}

ak_tensor scene_sinks(const bench_scene *sc)
{
    return ak_tensor_1d(sc->sinks, AK_F32, sc->cfg.num_qo_heads);
}

ak_tensor scene_k_rag(const bench_scene *sc, int layer)
{
    return ak_tensor_3d((char *)sc->k_rag + (size_t)layer * sc->k_rag_layer_bytes, sc->cfg.kv_dtype,
                        sc->b.num_kv_tokens, sc->cfg.num_kv_heads, sc->cfg.head_dim_qk);
}

ak_tensor scene_v_rag(const bench_scene *sc, int layer)
{
    return ak_tensor_3d((char *)sc->v_rag + (size_t)layer * sc->v_rag_layer_bytes, sc->cfg.kv_dtype,
                        sc->b.num_kv_tokens, sc->cfg.num_kv_heads, sc->cfg.head_dim_vo);
}

/* Random tensors' ids for derive_seed. */
enum { SEED_K = 2, SEED_V = 3, SEED_Q = 4, SEED_K_NEW = 5, SEED_V_NEW = 6, SEED_SINKS = 7 };

/* K is drawn from a wider range than q and V so that the softmax is peaked
 * enough for a wrong key to show in the error (as the test harness does). */
#define K_SCALE 2.0f

/* Writes the batch's new K/V rows into every layer through ak_kv_update, with
 * the slot mapping the public batch metadata gives. */
static int write_new_tokens(bench_scene *sc, uint64_t seed)
{
    const bd_ctx *ctx = sc->ctx;
    const ak_attn_config *c = &sc->cfg;
    const int T = sc->b.num_tokens;
    int nt = 0, nidx = 0;
    if (ak_batch_meta_sizes(&sc->b.batch, c, &sc->lim, &nt, &nidx) != AK_OK) {
        fprintf(stderr, "attnkit-bench: batch metadata: %s\n", ak_last_error());
        return -1;
    }
    ak_batch_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.qo_indptr = malloc(sizeof(int32_t) * ((size_t)sc->b.num_reqs + 1));
    meta.kv_indptr = malloc(sizeof(int32_t) * ((size_t)sc->b.num_reqs + 1));
    meta.kv_indices = malloc(sizeof(int32_t) * ((size_t)nidx + 1));
    meta.kv_last_page_len = malloc(sizeof(int32_t) * ((size_t)sc->b.num_reqs + 1));
    meta.positions = malloc(sizeof(int32_t) * ((size_t)nt + 1));
    meta.slot_mapping = malloc(sizeof(int64_t) * ((size_t)nt + 1));
    int rc = -1;
    if (!meta.qo_indptr || !meta.kv_indptr || !meta.kv_indices || !meta.kv_last_page_len || !meta.positions ||
        !meta.slot_mapping) {
        fprintf(stderr, "attnkit-bench: out of host memory for the batch metadata\n");
        goto done;
    }
    if (ak_batch_build_meta(&sc->b.batch, c, &sc->lim, &meta) != AK_OK) {
        fprintf(stderr, "attnkit-bench: batch metadata: %s\n", ak_last_error());
        goto done;
    }
    sc->slots = bd_malloc(ctx, sizeof(int64_t) * (size_t)T);
    const ak_dtype rows = new_rows_dtype(c);
    sc->k_new = bd_malloc(ctx, ak_dtype_size(rows) * (size_t)T * c->num_kv_heads * c->head_dim_qk);
    if (!c->mla) sc->v_new = bd_malloc(ctx, ak_dtype_size(rows) * (size_t)T * c->num_kv_heads * c->head_dim_vo);
    if (!sc->slots || !sc->k_new || (!c->mla && !sc->v_new)) goto done;
    if (bd_upload(ctx, sc->slots, meta.slot_mapping, sizeof(int64_t) * (size_t)T)) goto done;
    if (fill_random(ctx, sc->k_new, rows, (size_t)T * c->num_kv_heads * c->head_dim_qk, K_SCALE,
                    derive_seed(seed, SEED_K_NEW, 0)) ||
        (!c->mla && fill_random(ctx, sc->v_new, rows, (size_t)T * c->num_kv_heads * c->head_dim_vo, 1.0f,
                                derive_seed(seed, SEED_V_NEW, 0))))
        goto done;
    const ak_tensor k = scene_k_new(sc), v = scene_v_new(sc);
    for (int l = 0; l < sc->num_layers; l++) {
        if (ak_kv_update(&sc->kv[l], &k, c->mla ? NULL : &v, sc->slots, T, ctx->stream) != AK_OK) {
            fprintf(stderr, "attnkit-bench: ak_kv_update(layer %d): %s\n", l, ak_last_error());
            goto done;
        }
    }
    rc = bd_sync(ctx);
done:
    free(meta.qo_indptr);
    free(meta.kv_indptr);
    free(meta.kv_indices);
    free(meta.kv_last_page_len);
    free(meta.positions);
    free(meta.slot_mapping);
    return rc;
}

int scene_alloc(bench_scene *sc, int layers_override, uint64_t seed)
{
    const bd_ctx *ctx = sc->ctx;
    const ak_attn_config *c = &sc->cfg;
    const int Hq = c->num_qo_heads, Hk = c->num_kv_heads, Dqk = c->head_dim_qk, Dvo = c->head_dim_vo;
    const size_t kv_esz = ak_dtype_size(c->kv_dtype);
    /* MLA: K pools only */
    const size_t block_elems_k = (size_t)c->page_size * Hk * Dqk,
                 block_elems_v = c->mla ? 0 : (size_t)c->page_size * Hk * Dvo;
    const size_t pool_bytes = (size_t)sc->b.num_blocks * (block_elems_k + block_elems_v) * kv_esz;
    sc->q_layer_bytes = ak_dtype_size(c->q_dtype) * (size_t)sc->b.num_tokens * Hq * Dqk;
    sc->o_layer_bytes = ak_dtype_size(c->o_dtype) * (size_t)sc->b.num_tokens * Hq * Dvo;
    if (sc->ragged_kv) {
        /* the step's K/V are all the keys only when no request has a prefix */
        if (sc->b.num_kv_tokens != sc->b.num_tokens) {
            fprintf(stderr, "attnkit-bench: ragged K/V need prompts without a prefix (q_len = kv_len)\n");
            return -1;
        }
        sc->k_rag_layer_bytes = kv_esz * (size_t)sc->b.num_kv_tokens * Hk * Dqk;
        sc->v_rag_layer_bytes = c->mla ? 0 : kv_esz * (size_t)sc->b.num_kv_tokens * Hk * Dvo;
    }
    const size_t per_layer =
        pool_bytes + sc->q_layer_bytes + sc->o_layer_bytes + sc->k_rag_layer_bytes + sc->v_rag_layer_bytes;
    const size_t fixed =
        (size_t)sc->b.num_tokens * (Hk * (size_t)(Dqk + (c->mla ? 0 : Dvo)) * ak_dtype_size(new_rows_dtype(c)) +
                                    sizeof(int64_t));

    /* how many layers to rotate through */
    const double cache = (double)ctx->cache_bytes;
    const char *cache_name = ctx->dev.kind == AK_DEVICE_CUDA ? "L2" : "LLC";
    const double want = ceil(ROTATE_CACHE_FACTOR * cache / sc->bytes);
    int layers = want < 1 ? 1 : want > MAX_ROTATE_LAYERS ? MAX_ROTATE_LAYERS : (int)want;
    if (layers_override > 0) {
        layers = layers_override;
        snprintf(sc->layers_why, sizeof sc->layers_why, "--layers; together %.0f MB, %.1fx the %s",
                 layers * sc->bytes / 1e6, layers * sc->bytes / cache, cache_name);
    } else if (want > MAX_ROTATE_LAYERS) {
        snprintf(sc->layers_why, sizeof sc->layers_why, "the cap; together %.0f MB, %.1fx the %s",
                 layers * sc->bytes / 1e6, layers * sc->bytes / cache, cache_name);
    } else {
        /* more layers than the model has: a real step of so small a batch
         * would find part of its KV in the cache; the figure is the cold one */
        snprintf(sc->layers_why, sizeof sc->layers_why, "%d x %.3g MB read > %.0fx the %s (%.0f MB)%s", layers,
                 sc->bytes / 1e6, ROTATE_CACHE_FACTOR, cache_name, cache / 1e6,
                 layers > sc->model->num_layers ? "; more than the model's layers" : "");
    }
    const size_t budget = bd_mem_budget(ctx);
    if (fixed + per_layer > budget) {
        fprintf(stderr, "attnkit-bench: one layer needs %.2f GiB, %.2f GiB may be used on this device\n",
                (double)(fixed + per_layer) / (1 << 30), (double)budget / (1 << 30));
        return -1;
    }
    if (fixed + per_layer * (size_t)layers > budget) {
        layers = (int)((budget - fixed) / per_layer);
        snprintf(sc->layers_why, sizeof sc->layers_why, "as many as memory allows; fewer than the cache wants");
    }
    sc->num_layers = layers;

    /* every block is allocated, as an engine's running requests hold them; the
     * batch uses them in the shuffled order of its block table */
    if (scn_cache_create(c, layers, sc->b.num_blocks, &sc->cache)) {
        fprintf(stderr, "attnkit-bench: KV cache of %d layers x %.2f GiB: %s\n", layers,
                (double)pool_bytes / (1 << 30), ak_last_error());
        return -1;
    }

    sc->kv = calloc((size_t)layers, sizeof *sc->kv);
    sc->q = bd_malloc(ctx, sc->q_layer_bytes * (size_t)layers);
    sc->o = bd_malloc(ctx, sc->o_layer_bytes * (size_t)layers);
    sc->q0_host = malloc(sc->q_layer_bytes + 1);
    if (!sc->kv || !sc->q || !sc->o || !sc->q0_host) {
        fprintf(stderr, "attnkit-bench: cannot allocate q/o for %d layers\n", layers);
        return -1;
    }
    /* every layer's o written once before any timing: a timed call that is
     * the first to write its layer's o also times the OS faulting in and
     * zeroing those pages (16 MB a call for llama3-8b prefill 2048, about
     * 3 ms here, the same on 1 or 2 threads), which an engine reusing its
     * output buffers never pays; one warm-up call cannot cover 48 layers */
    if (bd_memset(ctx, sc->o, 0, sc->o_layer_bytes * (size_t)layers)) return -1;
    if (c->kv_dtype == AK_FP8_E4M3) {
        sc->kv_scales_host = malloc(sizeof(float) * (size_t)Hk);
        sc->kv_scales = bd_malloc(ctx, sizeof(float) * (size_t)Hk);
        if (!sc->kv_scales_host || !sc->kv_scales) return -1;
        for (int h = 0; h < Hk; h++) sc->kv_scales_host[h] = 1.0f;
        if (bd_upload(ctx, sc->kv_scales, sc->kv_scales_host, sizeof(float) * (size_t)Hk)) return -1;
    }
    const int64_t mark_words = ak_kv_marks_words(sc->b.num_blocks, Hk, c->page_size);
    if (sc->kv_marks) {
        const size_t bytes = sizeof(uint32_t) * (size_t)mark_words * (size_t)layers;
        sc->marks = bd_malloc(ctx, bytes);
        if (!sc->marks || bd_memset(ctx, sc->marks, 0, bytes)) return -1;
    }
    for (int l = 0; l < layers; l++) {
        if (ak_kv_cache_layer(sc->cache, l, &sc->kv[l]) != AK_OK) {
            fprintf(stderr, "attnkit-bench: %s\n", ak_last_error());
            return -1;
        }
        if (sc->marks) sc->kv[l].marks = sc->marks + (size_t)l * (size_t)mark_words;
        if (sc->kv_scales) {
            sc->kv[l].scale_kind = AK_KV_SCALE_PER_HEAD;
            sc->kv[l].k_scale = sc->kv_scales;
            sc->kv[l].v_scale = c->mla ? NULL : sc->kv_scales; /* MLA: k_scale scales the value too */
        }
        /* whole pools, unused blocks too: never zeros, and a stray read finds noise */
        if (fill_random(ctx, sc->kv[l].k_data, c->kv_dtype, (size_t)sc->b.num_blocks * block_elems_k, K_SCALE,
                        derive_seed(seed, SEED_K, (uint64_t)l)) ||
            (!c->mla && fill_random(ctx, sc->kv[l].v_data, c->kv_dtype, (size_t)sc->b.num_blocks * block_elems_v,
                                    1.0f, derive_seed(seed, SEED_V, (uint64_t)l))) ||
            fill_random(ctx, (char *)sc->q + (size_t)l * sc->q_layer_bytes, c->q_dtype,
                        (size_t)sc->b.num_tokens * Hq * Dqk, 1.0f, derive_seed(seed, SEED_Q, (uint64_t)l)))
            return -1;
    }
    if (bd_download(ctx, sc->q0_host, sc->q, sc->q_layer_bytes)) return -1;
    if (c->use_sinks) {
        /* sink logits in [-2, 4), one set for every layer */
        uint64_t rs = derive_seed(seed, SEED_SINKS, 0);
        sc->sinks_host = malloc(sizeof(float) * (size_t)Hq);
        sc->sinks = bd_malloc(ctx, sizeof(float) * (size_t)Hq);
        if (!sc->sinks_host || !sc->sinks) return -1;
        for (int h = 0; h < Hq; h++) sc->sinks_host[h] = 1.0f + 3.0f * scn_uniform(&rs);
        if (bd_upload(ctx, sc->sinks, sc->sinks_host, sizeof(float) * (size_t)Hq)) return -1;
    }
    if (sc->ragged_kv) {
        sc->k_rag = bd_malloc(ctx, sc->k_rag_layer_bytes * (size_t)layers);
        if (!c->mla) sc->v_rag = bd_malloc(ctx, sc->v_rag_layer_bytes * (size_t)layers);
        if (!sc->k_rag || (!c->mla && !sc->v_rag)) return -1;
        /* the seeds of k_new / v_new: the same values as the cache's rows */
        for (int l = 0; l < layers; l++)
            if (fill_random(ctx, (char *)sc->k_rag + (size_t)l * sc->k_rag_layer_bytes, c->kv_dtype,
                            (size_t)sc->b.num_kv_tokens * Hk * Dqk, K_SCALE, derive_seed(seed, SEED_K_NEW, 0)) ||
                (!c->mla && fill_random(ctx, (char *)sc->v_rag + (size_t)l * sc->v_rag_layer_bytes, c->kv_dtype,
                                        (size_t)sc->b.num_kv_tokens * Hk * Dvo, 1.0f,
                                        derive_seed(seed, SEED_V_NEW, 0))))
                return -1;
    }
    return write_new_tokens(sc, seed);
}

void scene_free(bench_scene *sc)
{
    const bd_ctx *ctx = sc->ctx;
    if (ctx) {
        bd_sync(ctx); /* nothing may still read what is freed */
        bd_free(ctx, sc->q);
        bd_free(ctx, sc->o);
        bd_free(ctx, sc->k_new);
        bd_free(ctx, sc->v_new);
        bd_free(ctx, sc->slots);
        bd_free(ctx, sc->k_rag);
        bd_free(ctx, sc->v_rag);
        bd_free(ctx, sc->sinks);
        bd_free(ctx, sc->kv_scales);
        bd_free(ctx, sc->marks);
    }
    free(sc->sinks_host);
    free(sc->kv_scales_host);
    ak_kv_cache_destroy(sc->cache);
    free(sc->kv);
    free(sc->q0_host);
    scn_batch_free(&sc->b);
    memset(sc, 0, sizeof *sc);
}

/* ---- the reference ---------------------------------------------------------------------- */

/* cpu_ref's work budget for one check, in multiply-adds (query head x visible
 * key x (dqk + dvo)). cpu_ref does about 1e8 of them per second on one core
 * (fp64, a block-table lookup per element), so the check stays at a few seconds. */
#define CHECK_BUDGET_MACS 2e8
/* A request with more query tokens than this is checked on its last ones. */
#define CHECK_TAIL_TOKENS 4
/* Single earlier tokens checked per long request (beside its tail), at most. */
#define CHECK_SINGLES 8
/* Even over budget, at least this many sub-requests are checked. */
#define CHECK_MIN_SUBS 2

typedef struct sub_req {
    int req;    /* request of the batch */
    int t0, n;  /* its query tokens t0 .. t0 + n - 1 */
    int kv_len; /* keys of the sub-request: the request's, cut after the last token when causal */
} sub_req;

static double sub_cost(const bench_scene *sc, const sub_req *s)
{
    const ak_attn_config *c = &sc->cfg;
    int64_t keys = 0;
    for (int i = 0; i < s->n; i++) {
        int lo, hi;
        scn_visible(c, s->kv_len, s->kv_len - s->n + i, &lo, &hi);
        if (hi >= lo) keys += hi - lo + 1;
    }
    return (double)keys * c->num_qo_heads * (c->head_dim_qk + c->head_dim_vo);
}

/* The base-2 van der Corput sequence: i's bits mirrored behind the binary
 * point (0, 1/2, 1/4, 3/4, 1/8, ...); any prefix covers [0, 1) evenly. */
static double van_der_corput(unsigned i)
{
    double frac = 0, bit = 0.5;
    for (; i; i >>= 1, bit *= 0.5)
        if (i & 1) frac += bit;
    return frac;
}

/* Requests lo .. lo + cnt - 1 in a spread order: first, last, then by the van
 * der Corput sequence, so any prefix of the order covers the range evenly.
 * Returns how many were written to order (cnt), or -1. */
static int spread_order(int lo, int cnt, int *order)
{
    if (cnt <= 0) return 0;
    char *seen = calloc((size_t)cnt, 1);
    if (!seen) return -1;
    int n = 0;
    const int ends[2] = {0, cnt - 1};
    for (int e = 0; e < 2; e++)
        if (!seen[ends[e]]) {
            seen[ends[e]] = 1;
            order[n++] = lo + ends[e];
        }
    for (unsigned i = 1; i < 2u * (unsigned)cnt && n < cnt; i++) {
        const int k = (int)(van_der_corput(i) * cnt);
        if (!seen[k]) {
            seen[k] = 1;
            order[n++] = lo + k;
        }
    }
    for (int k = 0; k < cnt; k++)
        if (!seen[k]) order[n++] = lo + k;
    free(seen);
    return n;
}

/* Candidate sub-requests of a group of requests (in spread order): first each
 * request's tail (or the whole request when short); then, for causal
 * configs, single earlier tokens of the long ones at van der Corput positions
 * (first, middle, quarters, ...), one round over the requests per position.
 * Writes at most n * (1 + CHECK_SINGLES); returns how many. */
static int group_candidates(const bench_scene *sc, const int *reqs, int n, sub_req *out)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        const int r = reqs[i], Q = sc->b.qo_indptr[r + 1] - sc->b.qo_indptr[r], L = sc->b.kv_lens[r];
        if (Q <= CHECK_TAIL_TOKENS) out[k++] = (sub_req){r, 0, Q, L};
        else out[k++] = (sub_req){r, Q - CHECK_TAIL_TOKENS, CHECK_TAIL_TOKENS, L};
    }
    if (!sc->cfg.causal) return k;
    /* causal: a token's keys end at its position, so cutting the KV after it
     * leaves what it sees unchanged */
    for (unsigned round = 0; round < CHECK_SINGLES; round++)
        for (int i = 0; i < n; i++) {
            const int r = reqs[i], Q = sc->b.qo_indptr[r + 1] - sc->b.qo_indptr[r], L = sc->b.kv_lens[r];
            const int before_tail = Q - CHECK_TAIL_TOKENS;
            if (before_tail <= 0) continue;
            const int t = (int)(van_der_corput(round) * before_tail);
            int repeat = 0; /* a short head maps several positions to one token */
            for (unsigned j = 0; j < round && !repeat; j++) repeat = (int)(van_der_corput(j) * before_tail) == t;
            if (!repeat) out[k++] = (sub_req){r, t, 1, L - Q + t + 1};
        }
    return k;
}

/* Picks the sub-requests to check (cap >= num_reqs * (1 + CHECK_SINGLES)). Every token when the
 * whole batch fits the budget; else candidates taken alternately from the
 * prefill chunks of a mixed batch and from the other requests, each kept if it
 * still fits the budget. Returns how many, or -1. */
static int choose_subs(const bench_scene *sc, sub_req *subs, int cap, int *sampled)
{
    const int R = sc->b.num_reqs;
    double full = 0;
    for (int r = 0; r < R; r++) {
        subs[r] = (sub_req){r, 0, sc->b.qo_indptr[r + 1] - sc->b.qo_indptr[r], sc->b.kv_lens[r]};
        full += sub_cost(sc, &subs[r]);
    }
    *sampled = full > CHECK_BUDGET_MACS;
    if (!*sampled) return R;

    const int first_chunk = sc->shape.workload == BW_MIXED ? R - sc->shape.num_prefills : R;
    int *order = malloc(sizeof(int) * (size_t)R);
    const size_t per_group = (size_t)R * (1 + CHECK_SINGLES);
    sub_req *cand[2] = {malloc(sizeof(sub_req) * per_group), malloc(sizeof(sub_req) * per_group)};
    int ncand[2] = {0, 0};
    int rc = -1;
    if (!order || !cand[0] || !cand[1]) goto done;
    /* group 0: the prefill chunks of a mixed batch; group 1: the rest */
    const int n0 = spread_order(first_chunk, R - first_chunk, order);
    if (n0 < 0) goto done;
    const int n1 = spread_order(0, first_chunk, order + n0);
    if (n1 < 0) goto done;
    ncand[0] = group_candidates(sc, order, n0, cand[0]);
    ncand[1] = group_candidates(sc, order + n0, n1, cand[1]);

    int n = 0, next[2] = {0, 0};
    double cost = 0;
    for (int turn = 0; next[0] < ncand[0] || next[1] < ncand[1]; turn ^= 1) {
        if (next[turn] >= ncand[turn]) continue;
        const sub_req *c = &cand[turn][next[turn]++];
        const double ci = sub_cost(sc, c);
        if (n >= CHECK_MIN_SUBS && cost + ci > CHECK_BUDGET_MACS) continue; /* a cheaper one may still fit */
        if (n >= cap) break;
        subs[n++] = *c;
        cost += ci;
    }
    rc = n;
done:
    free(order);
    free(cand[0]);
    free(cand[1]);
    return rc;
}

int ref_build(bench_ref *ref, const bench_scene *sc)
{
    memset(ref, 0, sizeof *ref);
    const bd_ctx *ctx = sc->ctx;
    const ak_attn_config *c = &sc->cfg;
    const int Hq = c->num_qo_heads, Dqk = c->head_dim_qk, Dvo = c->head_dim_vo;
    const int cap = sc->b.num_reqs * (1 + CHECK_SINGLES);
    sub_req *subs = malloc(sizeof *subs * (size_t)cap);
    if (!subs) return -1;
    const int ns = choose_subs(sc, subs, cap, &ref->sampled);
    int rc = -1;
    ak_backend *b = NULL;
    int32_t *kv_lens = NULL, *bt = NULL;
    void *q = NULL, *kpool = NULL, *vpool = NULL;
    char *seen = calloc((size_t)sc->b.num_reqs, 1);
    if (ns <= 0 || !seen) goto done;

    ref->num_subs = ns;
    ref->sub_indptr = malloc(sizeof(int32_t) * ((size_t)ns + 1));
    kv_lens = malloc(sizeof(int32_t) * (size_t)ns);
    bt = malloc(sizeof(int32_t) * (size_t)ns * sc->b.bt_stride);
    if (!ref->sub_indptr || !kv_lens || !bt) goto done;
    ref->sub_indptr[0] = 0;
    for (int s = 0; s < ns; s++) {
        ref->sub_indptr[s + 1] = ref->sub_indptr[s] + subs[s].n;
        kv_lens[s] = subs[s].kv_len;
        memcpy(bt + (size_t)s * sc->b.bt_stride, sc->b.block_table + (size_t)subs[s].req * sc->b.bt_stride,
               sizeof(int32_t) * (size_t)sc->b.bt_stride);
        if (!seen[subs[s].req]) ref->num_src_reqs++;
        seen[subs[s].req] = 1;
    }
    const int T = ref->sub_indptr[ns];
    ref->num_sub_tokens = T;
    ref->src_token = malloc(sizeof(int32_t) * (size_t)T);
    ref->o = malloc(sizeof(float) * (size_t)T * Hq * Dvo);
    const size_t q_row = ak_dtype_size(c->q_dtype) * (size_t)Hq * Dqk;
    q = malloc(q_row * (size_t)T);
    if (!ref->src_token || !ref->o || !q) goto done;
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < subs[s].n; i++) {
            const int t = ref->sub_indptr[s] + i, src = sc->b.qo_indptr[subs[s].req] + subs[s].t0 + i;
            ref->src_token[t] = src;
            memcpy((char *)q + q_row * (size_t)t, (const char *)sc->q0_host + q_row * (size_t)src, q_row);
        }

    /* layer 0's pools on the host */
    ak_paged_kv kv = sc->kv[0];
    if (ctx->dev.kind != AK_DEVICE_CPU) {
        kv.marks = NULL; /* (the device's: the host copy has none) */
        const size_t esz = ak_dtype_size(c->kv_dtype);
        const size_t kb = esz * (size_t)sc->b.num_blocks * c->page_size * c->num_kv_heads * Dqk;
        const size_t vb = c->mla ? 1 : esz * (size_t)sc->b.num_blocks * c->page_size * c->num_kv_heads * Dvo;
        kpool = malloc(kb);
        vpool = malloc(vb);
        if (!kpool || !vpool) {
            fprintf(stderr, "attnkit-bench: check: cannot hold layer 0's KV (%.2f GiB) on the host\n",
                    (double)(kb + vb) / (1 << 30));
            goto done;
        }
        if (bd_download(ctx, kpool, kv.k_data, kb) || (!c->mla && bd_download(ctx, vpool, kv.v_data, vb)))
            goto done;
        kv.k_data = kpool;
        kv.v_data = c->mla ? NULL : vpool;
        if (sc->kv_scales) {
            kv.k_scale = sc->kv_scales_host;
            kv.v_scale = c->mla ? NULL : sc->kv_scales_host;
        }
        kv.device.kind = AK_DEVICE_CPU;
        kv.device.index = 0;
    }

    ak_attn_config rc_cfg = *c;
    rc_cfg.device.kind = AK_DEVICE_CPU;
    rc_cfg.device.index = 0;
    rc_cfg.o_dtype = AK_F32; /* the reference keeps its fp64 result to f32, not to the bench's o dtype */
    rc_cfg.workload = AK_WORKLOAD_ANY;
    ak_limits lim;
    ak_limits_init(&lim);
    lim.max_reqs = ns;
    lim.max_tokens = T;
    lim.max_blocks_per_req = sc->b.bt_stride;
    lim.num_cache_blocks = sc->b.num_blocks;
    ak_batch batch;
    ak_batch_init(&batch);
    batch.num_reqs = ns;
    batch.qo_indptr = ref->sub_indptr;
    batch.kv_lens = kv_lens;
    batch.block_table = bt;
    batch.block_table_stride = sc->b.bt_stride;
    ak_tensor qt = ak_tensor_3d(q, c->q_dtype, T, Hq, Dqk);
    ak_tensor ot = ak_tensor_3d(ref->o, AK_F32, T, Hq, Dvo);
    ak_tensor st = ak_tensor_1d(sc->sinks_host, AK_F32, c->num_qo_heads);
    ak_run_args args;
    ak_run_args_init(&args);
    args.q = &qt;
    args.kv = &kv;
    args.o = &ot;
    if (c->use_sinks) args.sinks = &st;
    const double t0 = bd_now();
    if (ak_backend_create(&rc_cfg, &lim, "cpu_ref", &b) != AK_OK || ak_backend_plan(b, &batch, NULL) != AK_OK ||
        ak_backend_run(b, &args, NULL) != AK_OK) {
        fprintf(stderr, "attnkit-bench: check: cpu_ref: %s\n", ak_last_error());
        goto done;
    }
    ref->seconds = bd_now() - t0;
    rc = 0;
done:
    ak_backend_destroy(b);
    free(subs);
    free(seen);
    free(kv_lens);
    free(bt);
    free(q);
    free(kpool);
    free(vpool);
    if (rc != 0) ref_free(ref);
    return rc;
}

void ref_free(bench_ref *ref)
{
    free(ref->sub_indptr);
    free(ref->src_token);
    free(ref->o);
    memset(ref, 0, sizeof *ref);
}

void ref_describe(const bench_ref *ref, const bench_scene *sc, char *buf, size_t cap)
{
    if (!ref->sampled)
        snprintf(buf, cap, "check: cpu_ref on every token (%d), layer 0, %.1f s", ref->num_sub_tokens, ref->seconds);
    else
        snprintf(buf, cap,
                 "check: cpu_ref on a SAMPLE, %d of %d query tokens from %d of %d requests (the last <= %d tokens "
                 "of each%s, within a work budget), layer 0, %.1f s",
                 ref->num_sub_tokens, sc->b.num_tokens, ref->num_src_reqs, sc->b.num_reqs, CHECK_TAIL_TOKENS,
                 sc->cfg.causal ? "; single earlier tokens of longer ones" : "", ref->seconds);
}

double ref_tolerance(ak_dtype t)
{
    /* relative (Frobenius) error of o, as tests/harness.c allows: f32 for the
     * accumulation order and a fast exp; f16/bf16 for the output rounding and
     * probabilities rounded for the P.V product on tensor cores */
    switch (t) {
    case AK_F16: return 4e-3;
    case AK_BF16: return 2e-2;
    default: return 1e-4;
    }
}

double ref_compare(const bench_ref *ref, const bench_scene *sc, const void *o_host, char *bad, size_t cap)
{
    const ak_attn_config *c = &sc->cfg;
    const int Hq = c->num_qo_heads, Dvo = c->head_dim_vo;
    const int64_t row = (int64_t)Hq * Dvo, n = (int64_t)sc->b.num_tokens * row;
    bad[0] = '\0';
    float *o = malloc(sizeof(float) * (size_t)(n + 1));
    if (!o || ak_convert(o_host, c->o_dtype, o, AK_F32, (size_t)n) != AK_OK) {
        snprintf(bad, cap, "cannot convert o to f32: %s", o ? ak_last_error() : "out of host memory");
        free(o);
        return INFINITY;
    }
    for (int64_t i = 0; i < n; i++)
        if (isnan(o[i])) {
            snprintf(bad, cap, "o[token %lld][head %lld][%lld] is NaN (computed so, or never written)",
                     (long long)(i / row), (long long)(i % row / Dvo), (long long)(i % Dvo));
            free(o);
            return INFINITY;
        }
    double worst = 0;
    for (int s = 0; s < ref->num_subs; s++) {
        double num = 0, den = 0;
        for (int t = ref->sub_indptr[s]; t < ref->sub_indptr[s + 1]; t++) {
            const int64_t src = ref->src_token[t];
            for (int64_t e = 0; e < row; e++) {
                const double want = ref->o[(int64_t)t * row + e];
                const double d = (double)o[src * row + e] - want;
                num += d * d;
                den += want * want;
            }
        }
        const double err = den > 0 ? sqrt(num / den) : sqrt(num);
        if (!(err <= worst)) worst = err;
    }
    free(o);
    return worst;
}
