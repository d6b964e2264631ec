#define _POSIX_C_SOURCE 200809L /* setenv */
/*
 * test_graph.c - plan-then-replay under CUDA graphs. For each CUDA backend
 * that declares graph support: capture kv_update + run for every layer of a
 * step into one graph, then for ten steps whose lengths, block tables and
 * split counts all differ, plan() and replay the same graph; every step's
 * outputs are checked against cpu_ref on a copy of the cache the graph wrote,
 * the new tokens' K/V must be at their slots (kv_update ran in the graph),
 * and nothing else in the cache may change.
 *
 * Mixed cases need graph support ALWAYS: each step mixes decodes, 2-8 token
 * verifications and prompt chunks on a prefix, with fewer query tokens than
 * the capture. The capture is made with the largest step (as an engine pads
 * its batch to a captured size); later steps leave the rows past their
 * tokens alone, and their padded slots (-1) make kv_update skip them.
 *
 * Interleaved cases alternate layers between a windowed and a full backend
 * (Gemma, gpt-oss), both planned every step and captured in one graph.
 *
 * Ragged cases (contiguous K/V: cuda_varlen, cuda_paged's ragged mode)
 * capture run() alone, with q/o sized for the largest step and K/V buffers
 * that hold its sum of kv_len, and replay it after plans of prompt prefills
 * (or cross-attention) of other lengths; a growing case captures its
 * smallest step instead, views of buffers that hold every later step.
 *
 * Scan cases capture a step of short chunks (no scan task in the plan) and
 * replay it over steps whose chunks pass the scan pass's threshold, one
 * request of each with a -inf in a key of its new tokens: the scan pass,
 * and at DP 256 the clean items' kernel, have work only in the replays.
 * A row cpu_ref makes NaN (the NaN rule) must be NaN; steps without a
 * non-finite input must have no such row.
 */
#include "harness.h"

#include "dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef AK_HAVE_CUDA
#include <cuda_runtime_api.h>

/* Steps and layers per case, and the longest lengths. Paged: MAX_CHUNK keeps
 * the reference cheap (cpu_ref, one thread, f64, over 3 layers x 10 steps of
 * chunks of 300 on contexts of 3000 took minutes). Ragged: the longest
 * prompt (causal cases) or query (cross), and the longest cross K/V. */
enum { LAYERS = 3, STEPS = 10, MAX_KV = 3000, MAX_CHUNK = 64 };
enum { RG_LAYERS = 2, RG_STEPS = 8, RG_MAX_Q = 96, RG_MAX_KV = 200 };
/* Scan cases: the capture and three replays (cpu_ref's time); the
 * capture's chunk length; a replay's chunk under the scan pass's threshold
 * (x 64 heads: 1984 rows, under 2048: not scanned from K/V rows, checked;
 * from marks where its tasks are in the plan: scan_short); the token of
 * a replay's corrupted request whose key is -inf (the request's rows from it
 * on see it; that request's chunk is MAX_CHUNK). */
enum { SCAN_STEPS = 4, SCAN_CAPTURE_Q = 8, SCAN_SHORT_Q = 31, SCAN_BAD_TOKEN = 37 };

typedef struct graph_case {
    const char *name;
    ak_kv_storage storage;
    int num_qo_heads, num_kv_heads, head_dim;
    ak_dtype dtype;
    int num_reqs;
    int causal;        /* ragged: 1 prompt prefills (kv_len = q_len), 0 cross-attention (kv_len may be 0) */
    int window_left;
    int page_size;     /* paged */
    ak_kv_layout layout; /* paged */
    int mixed;         /* paged: steps mix decodes, verifications and chunks (needs ALWAYS) */
    int sinks;         /* cfg.use_sinks: every layer its own sink logits */
    int interleave;    /* layers alternate between two backends, windowed and full (Gemma,
                          gpt-oss), both planned each step, captured in one graph */
    int fp8;           /* paged: fp8 e4m3 pools, each layer its own k_scale and v_scale on the
                          device, new values every step (the replay must read them) */
    int mla;           /* paged: multi-head latent attention (cfg.mla), one latent KV head of
                          head_dim values, the value its first head_dim - 64; a K-only cache */
    int device_table;  /* paged: each step's block table in device memory
                          (batch.device_block_table), in one of two buffers by turns, so
                          the replays follow the table each plan names */
    int grow;          /* ragged: the capture is the smallest step (every request at a quarter
                          of its longest) and later ones grow past it, so the replays read
                          K/V rows past the captured step's (nothing captured may bound them) */
    int scan;          /* paged, mixed: the capture's chunks are short (SCAN_CAPTURE_Q), each later
                          step's MAX_CHUNK x the group >= 4096 rows (past the scan pass's threshold, 2048), one
                          request with -inf in K (SCAN_BAD_TOKEN) */
    int marks;         /* paged: the views carry finiteness marks (ak_paged_kv.marks), zeroed with
                          each step's fresh pools (finite) and kept by the captured kv_update, so
                          the scan pass reads its bits (the -inf key's among them) */
    int scan_short;    /* AK_CUDA_SCAN_SHORT=1 at create: the shorter chunks (the capture's, a replay's
                          SCAN_SHORT_Q) get scan tasks too, which a run with marks scans; 2:
                          AK_CUDA_SCAN_SHORT_ROWS=1, a run without marks scans their K/V rows too */
} graph_case;

#define PAGED AK_KV_PAGED
#define RAGGED AK_KV_RAGGED
#define NHD AK_LAYOUT_NHD
#define HND AK_LAYOUT_HND
static const graph_case graph_cases[] = {
    {"graph replay gqa4 bf16 d128 (tensor cores)", PAGED, 16, 4, 128, AK_BF16, 5, 1, -1, 16, NHD, 0, 0, 0},
    {"graph replay mha f16 d64 hnd (CUDA cores)", PAGED, 4, 4, 64, AK_F16, 3, 1, -1, 16, HND, 0, 0, 0},
    {"graph replay gqa8 bf16 d256 page 1 window", PAGED, 16, 2, 256, AK_BF16, 2, 1, 700, 1, NHD, 0, 0, 0},
    {"graph replay batch 1 long context hnd", PAGED, 32, 8, 128, AK_BF16, 1, 1, -1, 16, HND, 0, 0, 0},
    {"graph replay mixed gqa4 bf16 d128", PAGED, 16, 4, 128, AK_BF16, 6, 1, -1, 16, NHD, 1, 0, 0},
    {"graph replay mixed mha f16 d64 hnd page 1 window", PAGED, 4, 4, 64, AK_F16, 4, 1, 500, 1, HND, 1, 0, 0},
    {"graph replay mixed gqa8 bf16 d256 page 64", PAGED, 16, 2, 256, AK_BF16, 3, 1, -1, 64, NHD, 1, 0, 0},
    {"graph replay ragged prefill gqa4 bf16 d128", RAGGED, 16, 4, 128, AK_BF16, 4, 1, -1, 0, NHD, 0, 0, 0},
    {"graph replay ragged cross mqa f16 d64 window", RAGGED, 8, 1, 64, AK_F16, 3, 0, 50, 0, NHD, 0, 0, 0},
    {"graph replay ragged prefill gqa2 bf16 d256", RAGGED, 8, 4, 256, AK_BF16, 2, 1, -1, 0, NHD, 0, 0, 0},
    {"graph replay ragged cross gqa4 bf16 d128 growing past the capture", RAGGED, 16, 4, 128, AK_BF16, 3, 0, -1, 0,
     NHD, 0, 0, 0, 0, 0, 0, 1},
    /* qwen2.5-7b's 28/4 heads: the Hopper prefill's tiles of two warpgroups
     * of 9 tokens x 7 heads, q and o by TMA boxes a warpgroup */
    {"graph replay mixed qwen gqa7 bf16 d128 page 128", PAGED, 28, 4, 128, AK_BF16, 4, 1, -1, 128, NHD, 1, 0, 0},
    /* one KV head of 8 (llama3-70b at TP8): steps split a few ways or
     * 40+ ways, the merge in either of its shapes */
    {"graph replay mqa8 bf16 d128", PAGED, 8, 1, 128, AK_BF16, 2, 1, -1, 16, NHD, 0, 0, 0},
    {"graph replay mixed mqa8 bf16 d128", PAGED, 8, 1, 128, AK_BF16, 3, 1, -1, 16, NHD, 1, 0, 0},
    {"graph replay mixed gqa4 bf16 d512 page 16", PAGED, 8, 2, 512, AK_BF16, 3, 1, -1, 16, NHD, 1, 0, 0},
    /* gpt-oss-shaped: 64/8 heads, head dim 64, sinks, window-128 and full layers */
    {"graph replay interleaved window/full sinks (gpt-oss)", PAGED, 64, 8, 64, AK_BF16, 4, 1, 127, 16, NHD, 0, 1, 1},
    {"graph replay mixed sinks d96 page 1", PAGED, 8, 8, 96, AK_F16, 2, 1, -1, 1, NHD, 1, 1, 0},
    /* fp8 K/V: kv_update quantizes the step's rows with the layer's scales */
    {"graph replay fp8 gqa4 bf16 d128 scales per step", PAGED, 16, 4, 128, AK_BF16, 5, 1, -1, 16, NHD, 0, 0, 0, 1},
    {"graph replay mixed fp8 gqa8 f16 d64 hnd", PAGED, 16, 2, 64, AK_F16, 4, 1, -1, 16, HND, 1, 0, 0, 1},
    /* MLA (DeepSeek, absorbed): decodes, multi-token verifications and chunks over a latent cache */
    {"graph replay mla 576/512 h16 bf16 page 64 mixed", PAGED, 16, 1, 576, AK_BF16, 3, 1, -1, 64, NHD, 1, 0, 0, 0,
     1},
    {"graph replay mla 576/512 h128 f16 page 16 decode", PAGED, 128, 1, 576, AK_F16, 1, 1, -1, 16, NHD, 0, 0, 0, 0,
     1},
    /* the block table on the device, read in place (vLLM's block_table, SGLang's req_to_token) */
    {"graph replay mixed gqa4 bf16 d128 device table", PAGED, 16, 4, 128, AK_BF16, 6, 1, -1, 16, NHD, 1, 0, 0, 0, 0,
     1},
    {"graph replay gqa4 bf16 d128 page 1 window device table", PAGED, 16, 4, 128, AK_BF16, 4, 1, 300, 1, NHD, 0, 0, 0,
     0, 0, 1},
    {"graph replay mla 576/512 h16 bf16 page 64 mixed device table", PAGED, 16, 1, 576, AK_BF16, 3, 1, -1, 64, NHD, 1,
     0, 0, 0, 1, 1},
    /* A scan pass (64 heads a KV head: a chunk of MAX_CHUNK is 4096 rows),
     * at DP 256 the clean requests' items in the clean kernel, the
     * corrupted one's checked; at d64 both in one kernel; planned only after
     * the capture */
    {"graph replay scan mqa64 bf16 d256 clean and checked passes", PAGED, 64, 1, 256, AK_BF16, 3, 1, -1, 16, NHD, 1,
     0, 0, 0, 0, 0, 0, 1},
    {"graph replay scan mqa64 bf16 d64 clean and checked items", PAGED, 64, 1, 64, AK_BF16, 3, 1, -1, 16, NHD, 1,
     0, 0, 0, 0, 0, 0, 1},
    /* the same with the pools' finiteness marks: the pass reads bits, the
     * -inf key's set by the captured kv_update */
    {"graph replay scan mqa64 bf16 d256 marks", PAGED, 64, 1, 256, AK_BF16, 3, 1, -1, 16, NHD, 1, 0, 0, 0, 0, 0, 0, 1,
     1},
    {"graph replay scan mqa64 bf16 d128 marks page 128", PAGED, 64, 1, 128, AK_BF16, 3, 1, -1, 128, NHD, 1, 0, 0, 0,
     0, 0, 0, 1, 1},
    /* ... and every chunk's tasks in the plan: the capture's short chunks
     * scanned from the marks too, and at DP 256 in the clean kernel */
    {"graph replay scan mqa64 bf16 d256 marks, short chunks scanned", PAGED, 64, 1, 256, AK_BF16, 3, 1, -1, 16, NHD, 1,
     0, 0, 0, 0, 0, 0, 1, 1, 1},
    {"graph replay scan mqa64 bf16 d128 marks page 128, short chunks scanned", PAGED, 64, 1, 128, AK_BF16, 3, 1, -1,
     128, NHD, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1},
    /* ... and without marks, every chunk's K/V rows scanned */
    {"graph replay scan mqa64 bf16 d256 rows, short chunks scanned", PAGED, 64, 1, 256, AK_BF16, 3, 1, -1, 16, NHD, 1,
     0, 0, 0, 0, 0, 0, 1, 0, 2},
    {"graph replay scan mqa64 bf16 d128 rows page 128, short chunks scanned", PAGED, 64, 1, 128, AK_BF16, 3, 1, -1,
     128, NHD, 1, 0, 0, 0, 0, 0, 0, 1, 0, 2},
};

#define CUDA_OK(x) ((x) == cudaSuccess)

/* The lengths of step s. Paged: query lengths 1 for decode cases; for mixed
 * ones a chunk of MAX_CHUNK for every request at step 0 (the capture, the
 * largest step), then a mix of decodes, verifications (2-8) and chunks; the
 * kv lengths mix changes every step (all short, one long, ...). Ragged: the
 * capture (s = 0) has every request at its longest; later steps are random,
 * some requests empty (growing cases: the capture is the shortest). */
static void step_lengths(uint64_t *rng, int s, const graph_case *gc, int32_t *q_lens, int32_t *kv_lens)
{
    const int n = gc->num_reqs;
    for (int r = 0; r < n; r++) {
        if (gc->scan) {
            /* the capture: short chunks; then chunks of MAX_CHUNK on short
             * prefixes (4096 rows, scanned), at even steps one of
             * SCAN_SHORT_Q (under the threshold for K/V rows) */
            q_lens[r] = s == 0 ? SCAN_CAPTURE_Q : s % 2 == 0 && r == s / 2 % n ? SCAN_SHORT_Q : MAX_CHUNK;
            kv_lens[r] = q_lens[r] + scn_rng_int(rng, 0, s == 0 ? 300 : 64);
            continue;
        }
        if (gc->storage == AK_KV_RAGGED) {
            if (gc->grow) { /* (cross-attention) */
                q_lens[r] = s == 0 ? RG_MAX_Q / 4 : scn_rng_int(rng, 1, RG_MAX_Q);
                kv_lens[r] = s == 0 ? RG_MAX_KV / 4 : scn_rng_int(rng, RG_MAX_KV / 2, RG_MAX_KV);
                continue;
            }
            const int q = s == 0 ? RG_MAX_Q : scn_rng_int(rng, 0, 7) == 0 ? 0 : scn_rng_int(rng, 1, RG_MAX_Q);
            q_lens[r] = q;
            kv_lens[r] = gc->causal ? q
                         : s == 0   ? RG_MAX_KV
                                    : (scn_rng_int(rng, 0, 4) == 0 ? 0 : scn_rng_int(rng, 1, RG_MAX_KV));
            continue;
        }
        const int long_one = (s % 3 == 1 && r == s % n) || (s % 3 == 2);
        int q = 1;
        if (gc->mixed) {
            const int kind = s == 0 ? 2 : scn_rng_int(rng, 0, 2);
            q = kind == 0 ? 1 : kind == 1 ? scn_rng_int(rng, 2, 8) : s == 0 ? MAX_CHUNK : scn_rng_int(rng, 9, MAX_CHUNK);
        }
        kv_lens[r] = long_one ? scn_rng_int(rng, 1000, MAX_KV) : scn_rng_int(rng, 1, s % 2 ? 64 : 300);
        if (kv_lens[r] < q) kv_lens[r] = q + scn_rng_int(rng, 0, 40);
        q_lens[r] = q;
    }
}

/* Layer l's o and lse as a replay left them (on the device: T rows captured,
 * the step's first N) against cpu_ref's o_ref / l_ref: a row cpu_ref makes
 * NaN (lse NaN) is NaN in every element and lse, and left out of the errors
 * (*nan_rows counts them); any other row holds no NaN; rows past the step's
 * keep their 0xff poison. Raises *worst and *worst_lse; returns 0, with why
 * filled, when a row is wrong. */
static int check_graph_output(ak_dtype dtype, const void *o_dev, const void *lse_dev, int N, int T, int Hq, int D,
                              const float *o_ref, const float *l_ref, double *worst, double *worst_lse, int *nan_rows,
                              int s, int l, char *why, size_t why_cap)
{
    const size_t esz = ak_dtype_size(dtype);
    char *oh = malloc(esz * T * Hq * D);
    float *lh = malloc(sizeof(float) * T * Hq), *of = malloc(sizeof(float) * T * Hq * D);
    double *rd = malloc(sizeof(double) * T * Hq * D), *ld = malloc(sizeof(double) * T * Hq);
    cudaMemcpy(oh, o_dev, esz * T * Hq * D, cudaMemcpyDeviceToHost);
    cudaMemcpy(lh, lse_dev, 4 * (size_t)T * Hq, cudaMemcpyDeviceToHost);
    int nan_ok = 1, past_ok = 1;
    *nan_rows = 0;
    for (int row = 0; row < N * Hq; row++) {
        const int want_nan = isnan(l_ref[row]) != 0;
        *nan_rows += want_nan;
        if (want_nan != (isnan(lh[row]) != 0)) nan_ok = 0;
        for (int i = row * D; i < (row + 1) * D; i++) {
            of[i] = ak_load_as_f32(oh, dtype, i);
            rd[i] = o_ref[i];
            if (want_nan != (isnan(of[i]) != 0)) nan_ok = 0;
            if (want_nan) { /* (out of the error measure) */
                of[i] = 0.0f;
                rd[i] = 0.0;
            }
        }
        ld[row] = want_nan ? 0.0 : l_ref[row];
        if (want_nan) lh[row] = 0.0f;
    }
    /* rows past the step's tokens (a capture of more) keep their poison */
    for (size_t i = esz * N * Hq * D; i < esz * T * Hq * D; i++)
        if ((unsigned char)oh[i] != 0xff) past_ok = 0;
    for (int i = N * Hq; i < T * Hq; i++)
        if (!isnan(lh[i])) past_ok = 0;
    const double e = rel_err_f(of, rd, (int64_t)N * Hq * D), le = max_lse_err(lh, ld, (int64_t)N * Hq);
    if (e > *worst) *worst = e;
    if (le > *worst_lse) *worst_lse = le;
    if (!nan_ok)
        snprintf(why, why_cap, "step %d layer %d: o or lse NaN where cpu_ref's is not, or the reverse", s, l);
    else if (!past_ok)
        snprintf(why, why_cap, "step %d layer %d: rows past the step's tokens written", s, l);
    free(oh);
    free(lh);
    free(of);
    free(rd);
    free(ld);
    return nan_ok && past_ok;
}

/* The backend `name` for a graph case, or NULL after reporting why the case
 * does not run: unsupported, a failed create, or graph support below need. */
static ak_backend *create_for_graphs(test_ctx *t, const char *name, const char *case_name, const ak_attn_config *cfg,
                                     const ak_limits *lim, ak_graph_support need)
{
    ak_backend *b = NULL;
    const ak_status st = ak_backend_create(cfg, lim, name, &b);
    if (st == AK_ERR_UNSUPPORTED) {
        t_skip(t, name, case_name, "unsupported");
        return NULL;
    }
    if (st != AK_OK) {
        t_fail(t, name, case_name, "create: %s", ak_last_error());
        return NULL;
    }
    if (ak_backend_graph_support(b) < need) {
        t_skip(t, name, case_name, "backend declares graph support %s",
               ak_graph_support_name(ak_backend_graph_support(b)));
        ak_backend_destroy(b);
        return NULL;
    }
    return b;
}

/* The fixed device buffers a captured graph reads and writes, per layer: q
 * and o [tokens, Hq, D], lse [tokens, Hq] f32, K and V [kv_rows, Hk, D]. */
#define GRAPH_MAX_LAYERS 4
typedef struct graph_bufs {
    void *q[GRAPH_MAX_LAYERS], *o[GRAPH_MAX_LAYERS], *lse[GRAPH_MAX_LAYERS], *k[GRAPH_MAX_LAYERS],
        *v[GRAPH_MAX_LAYERS];
    int layers;
} graph_bufs;
_Static_assert(LAYERS <= GRAPH_MAX_LAYERS && RG_LAYERS <= GRAPH_MAX_LAYERS, "graph_bufs holds every layer of a case");

static void graph_bufs_alloc(graph_bufs *g, int layers, size_t esz, int tokens, int Hq, int kv_rows, int Hk, int D)
{
    g->layers = layers;
    for (int l = 0; l < layers; l++) {
        cudaMalloc(&g->q[l], esz * tokens * Hq * D);
        cudaMalloc(&g->o[l], esz * tokens * Hq * D);
        cudaMalloc(&g->lse[l], 4 * (size_t)tokens * Hq);
        cudaMalloc(&g->k[l], esz * kv_rows * Hk * D);
        cudaMalloc(&g->v[l], esz * kv_rows * Hk * D);
    }
}

static void graph_bufs_free(graph_bufs *g)
{
    for (int l = 0; l < g->layers; l++) {
        cudaFree(g->q[l]);
        cudaFree(g->o[l]);
        cudaFree(g->lse[l]);
        cudaFree(g->k[l]);
        cudaFree(g->v[l]);
    }
}

/* The verdict of a graph case: every check passed and the worst errors are
 * within the dtype's tolerance. */
static void report_graph_case(test_ctx *t, const char *name, const char *case_name, ak_dtype dtype, int ok,
                              const char *why, double worst, double worst_lse, int steps, int layers)
{
    const double tol = tolerance(dtype);
    if (ok && worst <= tol && worst_lse <= 2e-3)
        t_pass(t, name, case_name, "%d steps x %d layers, worst rel err %.2e, lse err %.2e", steps, layers, worst,
               worst_lse);
    else
        t_fail(t, name, case_name, "%s worst rel err %.2e (tol %.0e), lse err %.2e", why, worst, tol, worst_lse);
}

/* Paged cases: every new token's K/V must be at its slot in layer l's pools
 * (hk / hv: a host copy of what the replay left), and nothing else in them may
 * differ from the pools as uploaded (before_k / before_v). */
static int check_cache_writes(const graph_case *gc, const scn_batch *sb, const char *hk, const char *hv,
                              const char *before_k, const char *before_v, const char *kh, const char *vh,
                              size_t pool_bytes, int s, int l, const float *scales, char *why, size_t why_cap)
{
    const int Hk = gc->num_kv_heads, D = gc->head_dim, P = gc->page_size;
    const size_t esz = gc->fp8 ? 1 : ak_dtype_size(gc->dtype), resz = ak_dtype_size(gc->dtype);
    const int has_v = !gc->mla; /* MLA: K pools only */
    uint8_t qk[512], qv[512]; /* fp8: the rows as ak_kv_update quantizes them */
    char *k_fix = malloc(pool_bytes), *v_fix = malloc(pool_bytes);
    memcpy(k_fix, hk, pool_bytes);
    memcpy(v_fix, hv, pool_bytes);
    int ok = 1;
    for (int r = 0; r < sb->num_reqs && ok; r++)
        for (int i = sb->qo_indptr[r]; i < sb->qo_indptr[r + 1] && ok; i++) {
            const int pos = sb->kv_lens[r] - (sb->qo_indptr[r + 1] - sb->qo_indptr[r]) + (i - sb->qo_indptr[r]);
            const int64_t block = sb->block_table[(int64_t)r * sb->bt_stride + pos / P];
            for (int h = 0; h < Hk; h++) {
                /* the test's own address of (block, slot, head), by layout */
                const int64_t row = gc->layout == AK_LAYOUT_NHD ? (block * P + pos % P) * Hk + h
                                                                : (block * Hk + h) * P + pos % P;
                const size_t src = ((size_t)i * Hk + h) * D * resz, at = (size_t)row * D * esz;
                const char *ek = kh + src, *ev = vh + src;
                if (gc->fp8) {
                    for (int d = 0; d < D; d++) {
                        qk[d] = ak_e4m3_quantize(ak_load_as_f32(kh, gc->dtype, (int64_t)((size_t)i * Hk + h) * D + d),
                                                 scales[0]);
                        qv[d] = ak_e4m3_quantize(ak_load_as_f32(vh, gc->dtype, (int64_t)((size_t)i * Hk + h) * D + d),
                                                 scales[1]);
                    }
                    ek = (const char *)qk;
                    ev = (const char *)qv;
                }
                if (memcmp(hk + at, ek, D * esz) || (has_v && memcmp(hv + at, ev, D * esz))) {
                    snprintf(why, why_cap, "step %d layer %d: token %d's new K/V is not at its slot", s, l, i);
                    ok = 0;
                }
                /* put the old row back: the pools must then equal the upload */
                memcpy(k_fix + at, before_k + at, D * esz);
                memcpy(v_fix + at, before_v + at, D * esz);
            }
        }
    if (ok && (memcmp(k_fix, before_k, pool_bytes) || (has_v && memcmp(v_fix, before_v, pool_bytes)))) {
        snprintf(why, why_cap, "step %d layer %d: the cache changed outside the step's slots", s, l);
        ok = 0;
    }
    free(k_fix);
    free(v_fix);
    return ok;
}

/* One case on one backend: capture a step of every layer once (kv_update +
 * run on the paged cache, or run on ragged K/V), then plan and replay it over
 * steps of other lengths, each checked against cpu_ref. */
static void run_graph_case(test_ctx *t, const char *name, const graph_case *gc)
{
    const int paged = gc->storage == AK_KV_PAGED;
    const int R = gc->num_reqs, Hq = gc->num_qo_heads, Hk = gc->num_kv_heads, D = gc->head_dim, P = gc->page_size;
    const int Dv = gc->mla ? D - 64 : D; /* o's rows (MLA: the latent part of the K row) */
    const int layers = paged ? LAYERS : RG_LAYERS, steps = gc->scan ? SCAN_STEPS : paged ? STEPS : RG_STEPS;
    /* the capture's query tokens (the most of any step), and K/V rows its
     * buffers hold: the new tokens' rows (paged), every key (ragged) */
    const int T = paged ? (gc->mixed ? R * MAX_CHUNK : R) : R * RG_MAX_Q;
    const int KT = paged ? T : R * (gc->causal ? RG_MAX_Q : RG_MAX_KV);
    const size_t esz = ak_dtype_size(gc->dtype);
    const int max_blocks = paged ? (MAX_KV + P - 1) / P : 0;
    const int num_blocks = paged ? R * max_blocks + 3 : 0;
    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.num_qo_heads = Hq;
    cfg.num_kv_heads = Hk;
    cfg.head_dim_qk = D;
    cfg.head_dim_vo = Dv;
    cfg.mla = gc->mla;
    cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = gc->dtype;
    if (gc->fp8) cfg.kv_dtype = AK_FP8_E4M3;
    cfg.device = t->device;
    cfg.causal = gc->causal;
    cfg.window_left = gc->window_left;
    cfg.kv_storage = gc->storage;
    if (paged) {
        cfg.page_size = P;
        cfg.kv_layout = gc->layout;
        cfg.workload = gc->mixed ? AK_WORKLOAD_ANY : AK_WORKLOAD_DECODE;
    }
    ak_limits lim;
    ak_limits_init(&lim);
    lim.max_reqs = R;
    lim.max_tokens = T;
    if (paged) {
        lim.max_blocks_per_req = max_blocks;
        lim.num_cache_blocks = num_blocks;
    }

    cfg.use_sinks = gc->sinks;
    /* an interleaved case: layer l runs on backend l % 2, the second one
     * with the full context (each planned every step, as an engine does) */
    const int nbk = gc->interleave ? 2 : 1;
    ak_attn_config cfgs[2] = {cfg, cfg}, ref_cfg[2];
    cfgs[1].window_left = -1;
    ak_backend *bk[2] = {NULL, NULL};
    for (int i = 0; i < nbk; i++) {
        /* a paged decode case replays over decode batches, any other over any */
        bk[i] = create_for_graphs(t, name, gc->name, &cfgs[i], &lim,
                                  paged && !gc->mixed ? AK_GRAPH_DECODE_ONLY : AK_GRAPH_ALWAYS);
        if (!bk[i]) {
            ak_backend_destroy(bk[0]);
            return;
        }
        ref_cfg[i] = cfgs[i];
        ref_cfg[i].device.kind = AK_DEVICE_CPU;
        ref_cfg[i].o_dtype = AK_F32;
    }
    ak_backend *b = bk[0];
    ak_status st;

    ak_kv_cache *cache = NULL;
    const ak_dtype pool_dtype = cfg.kv_dtype;
    const size_t pool_bytes = paged ? (size_t)num_blocks * P * Hk * D * ak_dtype_size(pool_dtype) : 0;
    /* fp8: each layer's k_scale and v_scale, on the device (what the graph
     * reads) and on the host (what the reference reads) */
    float scales_h[LAYERS][2] = {{1.0f, 1.0f}};
    float *scales_d = NULL;
    if (gc->fp8) cudaMalloc((void **)&scales_d, sizeof(float) * 2 * LAYERS);
    const int64_t mark_words = paged ? ak_kv_marks_words(num_blocks, Hk, P) : 0;
    uint32_t *marks_d = NULL; /* [LAYERS][mark_words] */
    if (gc->marks) cudaMalloc((void **)&marks_d, sizeof(uint32_t) * (size_t)(mark_words * LAYERS));
    if (paged && scn_cache_create(&cfg, LAYERS, num_blocks, &cache)) {
        t_fail(t, name, gc->name, "cache: %s", ak_last_error());
        ak_backend_destroy(b);
        return;
    }

    /* fixed device buffers the graph reads and writes */
    graph_bufs g;
    graph_bufs_alloc(&g, layers, esz, T, Hq, KT, Hk, D);
    uint64_t rng = t->seed ^ scn_name_hash(gc->name);
    int32_t q_lens[64], kv_lens[64];
    scn_batch sb;
    memset(&sb, 0, sizeof sb);

    char *hk = malloc(pool_bytes + 1), *hv = malloc(pool_bytes + 1);
    char *before_k[LAYERS], *before_v[LAYERS]; /* each layer's pools as uploaded (paged) */
    for (int l = 0; l < LAYERS; l++) {
        before_k[l] = malloc(pool_bytes + 1);
        before_v[l] = malloc(pool_bytes + 1);
    }
    char *qh = malloc(esz * T * Hq * D), *kh = malloc(esz * KT * Hk * D), *vh = malloc(esz * KT * Hk * D);
    /* each layer's sink logits, on the device and on the host */
    float sinks_h[GRAPH_MAX_LAYERS][64];
    void *sinks_d[GRAPH_MAX_LAYERS] = {NULL};
    _Static_assert(sizeof sinks_h[0] / sizeof sinks_h[0][0] >= 64, "sinks for 64 query heads");
    for (int l = 0; l < layers && gc->sinks; l++) {
        for (int h = 0; h < Hq; h++) sinks_h[l][h] = 1.0f + 3.0f * scn_uniform(&rng);
        cudaMalloc(&sinks_d[l], sizeof(float) * Hq);
        cudaMemcpy(sinks_d[l], sinks_h[l], sizeof(float) * Hq, cudaMemcpyHostToDevice);
    }
    float *o_ref = malloc(sizeof(float) * T * Hq * D), *l_ref = malloc(sizeof(float) * T * Hq);
    /* device block tables, used by turns (gc->device_table) */
    int32_t *tables_d[2] = {NULL, NULL};
    const size_t table_bytes = sizeof(int32_t) * (size_t)R * (size_t)(max_blocks + 1);
    for (int i = 0; i < 2 && gc->device_table; i++) cudaMalloc((void **)&tables_d[i], table_bytes);
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    cudaGraphExec_t exec = NULL;
    double worst = 0, worst_lse = 0;
    int ok = 1;
    char why[256] = "";

    st = AK_OK;
    for (int s = 0; s < steps && ok; s++) {
        step_lengths(&rng, s, gc, q_lens, kv_lens);
        scn_batch_free(&sb);
        if (scn_batch_build(&sb, R, q_lens, kv_lens, P, max_blocks, num_blocks, &rng)) {
            snprintf(why, sizeof why, "step %d: cannot build the batch", s);
            ok = 0;
            break;
        }
        const int N = sb.num_tokens, KN = (int)sb.num_kv_tokens;
        /* scan cases after the capture: request s % R's key at its token
         * SCAN_BAD_TOKEN is -inf in KV head 0 (an unchecked run would drop
         * the key: finite rows where cpu_ref's are NaN) */
        const int bad_req = gc->scan && s > 0 ? s % R : -1;
        /* fresh q and K/V rows everywhere (rows past the step's too), fresh
         * context in the pools, o and lse poisoned */
        for (int l = 0; l < layers; l++) {
            if (paged) {
                ak_paged_kv view;
                ak_kv_cache_layer(cache, l, &view);
                const size_t pool_elems = pool_bytes / ak_dtype_size(pool_dtype);
                for (size_t i = 0; i < pool_elems; i++)
                    ak_store_from_f32(before_k[l], pool_dtype, (int64_t)i, scn_uniform(&rng));
                for (size_t i = 0; i < pool_elems; i++)
                    ak_store_from_f32(before_v[l], pool_dtype, (int64_t)i, scn_uniform(&rng));
                if (gc->fp8) { /* new scales: the rows below (|x| < 2) quantize to |x / scale| < 200 */
                    scales_h[l][0] = 0.01f + 0.03f * (1.0f + scn_uniform(&rng));
                    scales_h[l][1] = 0.005f + 0.02f * (1.0f + scn_uniform(&rng));
                    cudaMemcpy(scales_d + 2 * l, scales_h[l], sizeof(float) * 2, cudaMemcpyHostToDevice);
                }
                cudaMemcpy(view.k_data, before_k[l], pool_bytes, cudaMemcpyHostToDevice);
                if (marks_d) /* (the fresh pools are finite: their marks all clear) */
                    cudaMemset(marks_d + l * mark_words, 0, sizeof(uint32_t) * (size_t)mark_words);
                if (!gc->mla) cudaMemcpy(view.v_data, before_v[l], pool_bytes, cudaMemcpyHostToDevice);
            }
            for (int i = 0; i < T * Hq * D; i++) ak_store_from_f32(qh, gc->dtype, i, scn_uniform(&rng));
            for (int i = 0; i < KT * Hk * D; i++) ak_store_from_f32(kh, gc->dtype, i, 2.0f * scn_uniform(&rng));
            for (int i = 0; i < KT * Hk * D; i++) ak_store_from_f32(vh, gc->dtype, i, scn_uniform(&rng));
            if (bad_req >= 0) /* (kv_update writes it to the cache, where the scan pass and cpu_ref find it) */
                ak_store_from_f32(kh, gc->dtype, ((int64_t)(sb.qo_indptr[bad_req] + SCAN_BAD_TOKEN) * Hk) * D + 5,
                                  -INFINITY);
            cudaMemcpy(g.q[l], qh, esz * T * Hq * D, cudaMemcpyHostToDevice);
            cudaMemcpy(g.k[l], kh, esz * KT * Hk * D, cudaMemcpyHostToDevice);
            cudaMemcpy(g.v[l], vh, esz * KT * Hk * D, cudaMemcpyHostToDevice);
            cudaMemset(g.o[l], 0xff, esz * T * Hq * D);
            cudaMemset(g.lse[l], 0xff, 4 * (size_t)T * Hq);
        }
        ak_batch batch = sb.batch;
        if (gc->device_table) {
            int32_t *td = tables_d[s % 2];
            cudaMemcpy(td, sb.block_table, sizeof(int32_t) * (size_t)R * sb.bt_stride, cudaMemcpyHostToDevice);
            batch.device_block_table = td;
            batch.block_table = NULL;
        }
        for (int i = 0; i < nbk && st == AK_OK; i++) st = ak_backend_plan(bk[i], &batch, stream);
        if (st != AK_OK) {
            snprintf(why, sizeof why, "plan step %d: %s", s, ak_last_error());
            ok = 0;
            break;
        }
        if (s == 0) {
            /* capture once, after the first (largest) plan: the graph holds
             * no plan data, and the tensors it holds fit every later step */
            cudaGraph_t graph;
            if (!CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal))) {
                snprintf(why, sizeof why, "begin capture failed");
                ok = 0;
                break;
            }
            /* (a growing case captures its smallest step: views of its rows
             * of the same buffers, which hold every later step's) */
            /* (a scan case captures its short chunks the same way: q, o and
             * lse views of its rows; kv_update writes T rows, the padding's
             * slots -1) */
            const int cT = gc->grow || gc->scan ? N : T, cKT = gc->grow ? KN : KT;
            for (int l = 0; l < layers && st == AK_OK; l++) {
                ak_tensor qt = ak_tensor_3d(g.q[l], gc->dtype, cT, Hq, D), ot = ak_tensor_3d(g.o[l], gc->dtype, cT, Hq, Dv);
                ak_tensor kt = ak_tensor_3d(g.k[l], gc->dtype, cKT, Hk, D), vt = ak_tensor_3d(g.v[l], gc->dtype, cKT, Hk, D);
                ak_tensor lt = ak_tensor_2d(g.lse[l], AK_F32, cT, Hq);
                ak_tensor sk = ak_tensor_1d(sinks_d[l], AK_F32, Hq);
                ak_paged_kv view;
                ak_run_args a;
                ak_run_args_init(&a);
                a.q = &qt;
                a.o = &ot;
                a.lse = &lt;
                if (gc->sinks) a.sinks = &sk;
                if (paged) {
                    ak_kv_cache_layer(cache, l, &view);
                    if (gc->fp8) {
                        view.scale_kind = AK_KV_SCALE_PER_LAYER;
                        view.k_scale = scales_d + 2 * l;
                        view.v_scale = scales_d + 2 * l + 1;
                    }
                    if (marks_d) view.marks = marks_d + l * mark_words;
                    if (!ak_backend_forward_includes_kv_update(b))
                        st = ak_kv_update(&view, &kt, gc->mla ? NULL : &vt, ak_backend_slot_mapping(b), T, stream);
                    a.kv = &view;
                } else {
                    a.k = &kt;
                    a.v = &vt;
                }
                if (st == AK_OK) st = ak_backend_run(bk[l % nbk], &a, stream);
            }
            const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
            if (st != AK_OK || !CUDA_OK(ce) || !CUDA_OK(cudaGraphInstantiate(&exec, graph, 0))) {
                snprintf(why, sizeof why, "capture: %s / %s", st ? ak_last_error() : "", cudaGetErrorString(ce));
                ok = 0;
                break;
            }
            cudaGraphDestroy(graph);
        }
        if (!CUDA_OK(cudaGraphLaunch(exec, stream)) || !CUDA_OK(cudaStreamSynchronize(stream))) {
            snprintf(why, sizeof why, "replay step %d: %s", s, cudaGetErrorString(cudaGetLastError()));
            ok = 0;
            break;
        }
        /* every layer against cpu_ref: on what the graph left in the cache
         * (paged), or on the step's rows of q, K and V (ragged) */
        for (int l = 0; l < layers && ok; l++) {
            cudaMemcpy(qh, g.q[l], esz * T * Hq * D, cudaMemcpyDeviceToHost);
            cudaMemcpy(kh, g.k[l], esz * KT * Hk * D, cudaMemcpyDeviceToHost);
            cudaMemcpy(vh, g.v[l], esz * KT * Hk * D, cudaMemcpyDeviceToHost);
            ak_tensor qt = ak_tensor_3d(qh, gc->dtype, N, Hq, D);
            ak_tensor kt = ak_tensor_3d(kh, gc->dtype, KN, Hk, D), vt = ak_tensor_3d(vh, gc->dtype, KN, Hk, D);
            ak_tensor rt = ak_tensor_3d(o_ref, AK_F32, N, Hq, Dv), rl = ak_tensor_2d(l_ref, AK_F32, N, Hq);
            ak_tensor sk = ak_tensor_1d(sinks_h[l], AK_F32, Hq);
            ak_paged_kv hview;
            ak_run_args a;
            ak_run_args_init(&a);
            a.q = &qt;
            a.o = &rt;
            a.lse = &rl;
            if (gc->sinks) a.sinks = &sk;
            if (paged) {
                ak_kv_cache_layer(cache, l, &hview);
                cudaMemcpy(hk, hview.k_data, pool_bytes, cudaMemcpyDeviceToHost);
                if (!gc->mla) cudaMemcpy(hv, hview.v_data, pool_bytes, cudaMemcpyDeviceToHost);
                if (!check_cache_writes(gc, &sb, hk, hv, before_k[l], before_v[l], kh, vh, pool_bytes, s, l,
                                        scales_h[l], why, sizeof why)) {
                    ok = 0;
                    break;
                }
                /* the reference reads the cache with the new rows in place */
                hview.k_data = hk;
                hview.v_data = gc->mla ? NULL : hv;
                hview.device.kind = AK_DEVICE_CPU;
                if (gc->fp8) {
                    hview.scale_kind = AK_KV_SCALE_PER_LAYER;
                    hview.k_scale = &scales_h[l][0];
                    hview.v_scale = &scales_h[l][1];
                }
                a.kv = &hview;
            } else {
                a.k = &kt;
                a.v = &vt;
            }
            ak_backend *ref = NULL;
            if (ak_backend_create(&ref_cfg[l % nbk], &lim, "cpu_ref", &ref) != AK_OK ||
                ak_backend_plan(ref, &sb.batch, NULL) != AK_OK || ak_backend_run(ref, &a, NULL) != AK_OK) {
                snprintf(why, sizeof why, "cpu_ref: %s", ak_last_error());
                ak_backend_destroy(ref);
                ok = 0;
                break;
            }
            ak_backend_destroy(ref);
            int nan_rows = 0;
            if (!check_graph_output(gc->dtype, g.o[l], g.lse[l], N, T, Hq, Dv, o_ref, l_ref, &worst, &worst_lse,
                                    &nan_rows, s, l, why, sizeof why))
                ok = 0;
            else if ((nan_rows > 0) != (bad_req >= 0)) {
                snprintf(why, sizeof why, "step %d layer %d: cpu_ref has %d NaN rows (%s)", s, l, nan_rows,
                         bad_req >= 0 ? "the -inf key reached none" : "with finite inputs");
                ok = 0;
            }
        }
    }
    report_graph_case(t, name, gc->name, gc->dtype, ok, why, worst, worst_lse, steps, layers);

    if (exec) cudaGraphExecDestroy(exec);
    cudaStreamDestroy(stream);
    graph_bufs_free(&g);
    for (int l = 0; l < LAYERS; l++) {
        free(before_k[l]);
        free(before_v[l]);
    }
    scn_batch_free(&sb);
    free(hk);
    free(hv);
    free(qh);
    free(kh);
    free(vh);
    free(o_ref);
    free(l_ref);
    for (int l = 0; l < layers; l++) cudaFree(sinks_d[l]);
    cudaFree(scales_d);
    cudaFree(marks_d);
    cudaFree(tables_d[0]);
    cudaFree(tables_d[1]);
    for (int i = 0; i < nbk; i++) ak_backend_destroy(bk[i]);
    ak_kv_cache_destroy(cache);
}

typedef struct graph_run {
    test_ctx *t;
    const char *backend;
    const graph_case *gc;
} graph_run;

static void run_graph(void *arg)
{
    const graph_run *r = arg;
    run_graph_case(r->t, r->backend, r->gc);
}

void test_graphs(test_ctx *t)
{
    if (t->device.kind != AK_DEVICE_CUDA) return;
    const char *names[16];
    const int nb = t_backends(t, names, 16);
    for (int i = 0; i < nb; i++)
        for (size_t c = 0; c < sizeof graph_cases / sizeof *graph_cases; c++)
            if (t_selected(t, graph_cases[c].name) && t_storage_selected(t, graph_cases[c].storage)) {
                graph_run r = {t, names[i], &graph_cases[c]};
                if (graph_cases[c].scan_short == 2) t_with_env("AK_CUDA_SCAN_SHORT_ROWS", "1", run_graph, &r);
                else if (graph_cases[c].scan_short) t_with_env("AK_CUDA_SCAN_SHORT", "1", run_graph, &r);
                else run_graph(&r);
            }
}
#else
void test_graphs(test_ctx *t) { (void)t; }
#endif
