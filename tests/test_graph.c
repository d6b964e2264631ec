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
 * Ragged cases (contiguous K/V: cuda_varlen, cuda_paged's ragged mode)
 * capture run() alone, with q/o sized for the largest step and K/V buffers
 * that hold its sum of kv_len, and replay it after plans of prompt prefills
 * (or cross-attention) of other lengths.
 */
#include "harness.h"

#include "dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef AK_HAVE_CUDA
#include <cuda_runtime_api.h>

/* MAX_CHUNK keeps the reference cheap: cpu_ref (one thread, f64) over 3
 * layers x 10 steps of chunks of 300 on contexts of 3000 took minutes. */
enum { LAYERS = 3, STEPS = 10, MAX_KV = 3000, MAX_CHUNK = 64 };

typedef struct graph_case {
    const char *name;
    int num_qo_heads, num_kv_heads, head_dim;
    ak_dtype dtype;
    int page_size;
    int num_reqs;
    int window_left;
    ak_kv_layout layout;
    int mixed; /* steps mix decodes, verifications and chunks (needs ALWAYS) */
} graph_case;

static const graph_case graph_cases[] = {
    {"graph replay gqa4 bf16 d128 (tensor cores)", 16, 4, 128, AK_BF16, 16, 5, -1, AK_LAYOUT_NHD, 0},
    {"graph replay mha f16 d64 hnd (CUDA cores)", 4, 4, 64, AK_F16, 16, 3, -1, AK_LAYOUT_HND, 0},
    {"graph replay gqa8 bf16 d256 page 1 window", 16, 2, 256, AK_BF16, 1, 2, 700, AK_LAYOUT_NHD, 0},
    {"graph replay batch 1 long context hnd", 32, 8, 128, AK_BF16, 16, 1, -1, AK_LAYOUT_HND, 0},
    {"graph replay mixed gqa4 bf16 d128", 16, 4, 128, AK_BF16, 16, 6, -1, AK_LAYOUT_NHD, 1},
    {"graph replay mixed mha f16 d64 hnd page 1 window", 4, 4, 64, AK_F16, 1, 4, 500, AK_LAYOUT_HND, 1},
    {"graph replay mixed gqa8 bf16 d256 page 64", 16, 2, 256, AK_BF16, 64, 3, -1, AK_LAYOUT_NHD, 1},
};

#define CUDA_OK(x) ((x) == cudaSuccess)

/* Kv lengths of step s: the mix changes every step (all short, one long, ...).
 * Query lengths: 1 for decode cases; for mixed ones a chunk of MAX_CHUNK for
 * every request at step 0 (the capture, the largest step), then a mix of
 * decodes, verifications (2-8) and chunks. Returns the step's query tokens. */
static int step_lengths(uint64_t *rng, int s, int n, int mixed, int32_t *qo, int32_t *kv_lens)
{
    qo[0] = 0;
    for (int r = 0; r < n; r++) {
        const int long_one = (s % 3 == 1 && r == s % n) || (s % 3 == 2);
        int q = 1;
        if (mixed) {
            const int kind = s == 0 ? 2 : rng_int(rng, 0, 2);
            q = kind == 0 ? 1 : kind == 1 ? rng_int(rng, 2, 8) : s == 0 ? MAX_CHUNK : rng_int(rng, 9, MAX_CHUNK);
        }
        kv_lens[r] = long_one ? rng_int(rng, 1000, MAX_KV) : rng_int(rng, 1, s % 2 ? 64 : 300);
        if (kv_lens[r] < q) kv_lens[r] = q + rng_int(rng, 0, 40);
        qo[r + 1] = qo[r] + q;
    }
    return qo[n];
}

/* Layer l's o and lse as a replay left them (on the device: T rows captured,
 * the step's first N) against cpu_ref's o_ref / l_ref: no NaN in the step's
 * rows, and rows past them keep their 0xff poison. Raises *worst and
 * *worst_lse; returns 0, with why filled, when a row is wrong. */
static int check_graph_output(ak_dtype dtype, const void *o_dev, const void *lse_dev, int N, int T, int Hq, int D,
                              const float *o_ref, const float *l_ref, double *worst, double *worst_lse, int s, int l,
                              char *why, size_t why_cap)
{
    const size_t esz = ak_dtype_size(dtype);
    char *oh = malloc(esz * T * Hq * D);
    float *lh = malloc(sizeof(float) * T * Hq), *of = malloc(sizeof(float) * T * Hq * D);
    double *rd = malloc(sizeof(double) * T * Hq * D), *ld = malloc(sizeof(double) * T * Hq);
    cudaMemcpy(oh, o_dev, esz * T * Hq * D, cudaMemcpyDeviceToHost);
    cudaMemcpy(lh, lse_dev, 4 * (size_t)T * Hq, cudaMemcpyDeviceToHost);
    int ok = 1;
    for (int i = 0; i < N * Hq * D; i++) {
        of[i] = ak_load_as_f32(oh, dtype, i);
        rd[i] = o_ref[i];
        if (isnan(of[i])) ok = 0;
    }
    for (int i = 0; i < N * Hq; i++) ld[i] = l_ref[i];
    /* rows past the step's tokens (a capture of more) keep their poison */
    for (size_t i = esz * N * Hq * D; i < esz * T * Hq * D; i++)
        if ((unsigned char)oh[i] != 0xff) ok = 0;
    for (int i = N * Hq; i < T * Hq; i++)
        if (!isnan(lh[i])) ok = 0;
    const double e = rel_err_f(of, rd, (int64_t)N * Hq * D), le = max_lse_err(lh, ld, (int64_t)N * Hq);
    if (e > *worst) *worst = e;
    if (le > *worst_lse) *worst_lse = le;
    if (!ok) snprintf(why, why_cap, "step %d layer %d: NaN in o, or rows past the step's tokens written", s, l);
    free(oh);
    free(lh);
    free(of);
    free(rd);
    free(ld);
    return ok;
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
_Static_assert(LAYERS <= GRAPH_MAX_LAYERS, "graph_bufs holds every layer of a paged case");

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

static void run_graph_case(test_ctx *t, const char *name, const graph_case *gc)
{
    const int R = gc->num_reqs, Hq = gc->num_qo_heads, Hk = gc->num_kv_heads, D = gc->head_dim, P = gc->page_size;
    const int T = gc->mixed ? R * MAX_CHUNK : R; /* query tokens of the capture, the most of any step */
    const size_t esz = ak_dtype_size(gc->dtype);
    const int max_blocks = (MAX_KV + P - 1) / P;
    const int num_blocks = R * max_blocks + 3;
    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.num_qo_heads = Hq;
    cfg.num_kv_heads = Hk;
    cfg.head_dim_qk = cfg.head_dim_vo = D;
    cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = gc->dtype;
    cfg.device = t->device;
    cfg.page_size = P;
    cfg.kv_layout = gc->layout;
    cfg.window_left = gc->window_left;
    cfg.workload = gc->mixed ? AK_WORKLOAD_ANY : AK_WORKLOAD_DECODE;
    ak_limits lim;
    ak_limits_init(&lim);
    lim.max_reqs = R;
    lim.max_tokens = T;
    lim.max_blocks_per_req = max_blocks;
    lim.num_cache_blocks = num_blocks;

    /* a decode case replays over decode batches, a mixed one over any */
    ak_backend *b = create_for_graphs(t, name, gc->name, &cfg, &lim, gc->mixed ? AK_GRAPH_ALWAYS : AK_GRAPH_DECODE_ONLY);
    if (!b) return;
    ak_status st;

    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.num_layers = LAYERS;
    kc.num_blocks = num_blocks;
    kc.page_size = P;
    kc.num_kv_heads = Hk;
    kc.head_dim_qk = kc.head_dim_vo = D;
    kc.dtype = gc->dtype;
    kc.layout = gc->layout;
    kc.device = t->device;
    ak_kv_cache *cache = NULL;
    ak_kv_cache_create(&kc, &cache);
    const size_t pool_bytes = (size_t)num_blocks * P * Hk * D * esz;

    /* fixed device buffers the graph reads and writes */
    graph_bufs g;
    graph_bufs_alloc(&g, LAYERS, esz, T, Hq, T, Hk, D);
    uint64_t rng = t->seed ^ name_hash(gc->name);
    int32_t qo[64], kvl[64], *bt = malloc(sizeof(int32_t) * (size_t)R * max_blocks);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)num_blocks);
    for (int i = 0; i < num_blocks; i++) ids[i] = i;
    ak_batch batch;
    ak_batch_init(&batch);
    batch.num_reqs = R;
    batch.qo_indptr = qo;
    batch.kv_lens = kvl;
    batch.block_table = bt;
    batch.block_table_stride = max_blocks;

    /* the reference: cpu_ref over a host copy of each layer's pools */
    ak_attn_config ref_cfg = cfg;
    ref_cfg.device.kind = AK_DEVICE_CPU;
    ak_backend *ref = NULL;
    ak_backend_create(&ref_cfg, &lim, "cpu_ref", &ref);

    char *hk = malloc(pool_bytes), *hv = malloc(pool_bytes);
    char *before_k[LAYERS], *before_v[LAYERS]; /* each layer's pools as uploaded */
    for (int l = 0; l < LAYERS; l++) {
        before_k[l] = malloc(pool_bytes);
        before_v[l] = malloc(pool_bytes);
    }
    char *qh = malloc(esz * T * Hq * D), *kh = malloc(esz * T * Hk * D), *vh = malloc(esz * T * Hk * D);
    float *o_ref = malloc(sizeof(float) * T * Hq * D), *l_ref = malloc(sizeof(float) * T * Hq);
    int32_t *tok_req = malloc(sizeof(int32_t) * T); /* request of each query token */
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    cudaGraphExec_t exec = NULL;
    double worst = 0, worst_lse = 0;
    int ok = 1;
    char why[256] = "";

    for (int s = 0; s < STEPS && ok; s++) {
        const int N = step_lengths(&rng, s, R, gc->mixed, qo, kvl);
        for (int r = 0; r < R; r++)
            for (int i = qo[r]; i < qo[r + 1]; i++) tok_req[i] = r;
        rng_shuffle_i32(&rng, ids, num_blocks);
        for (int r = 0; r < R; r++)
            for (int j = 0; j < max_blocks; j++) bt[r * max_blocks + j] = ids[r * max_blocks + j];
        /* fresh context everywhere (random pools), fresh q and new K/V rows */
        for (int l = 0; l < LAYERS; l++) {
            ak_paged_kv view;
            ak_kv_cache_layer(cache, l, &view);
            for (size_t i = 0; i < pool_bytes / esz; i++)
                ak_store_from_f32(before_k[l], gc->dtype, (int64_t)i, rng_uniform(&rng));
            cudaMemcpy(view.k_data, before_k[l], pool_bytes, cudaMemcpyHostToDevice);
            for (size_t i = 0; i < pool_bytes / esz; i++)
                ak_store_from_f32(before_v[l], gc->dtype, (int64_t)i, rng_uniform(&rng));
            cudaMemcpy(view.v_data, before_v[l], pool_bytes, cudaMemcpyHostToDevice);
            for (int i = 0; i < T * Hq * D; i++) ak_store_from_f32(qh, gc->dtype, i, rng_uniform(&rng));
            cudaMemcpy(g.q[l], qh, esz * T * Hq * D, cudaMemcpyHostToDevice);
            for (int i = 0; i < T * Hk * D; i++) ak_store_from_f32(kh, gc->dtype, i, 2.0f * rng_uniform(&rng));
            for (int i = 0; i < T * Hk * D; i++) ak_store_from_f32(vh, gc->dtype, i, rng_uniform(&rng));
            cudaMemcpy(g.k[l], kh, esz * T * Hk * D, cudaMemcpyHostToDevice);
            cudaMemcpy(g.v[l], vh, esz * T * Hk * D, cudaMemcpyHostToDevice);
            cudaMemset(g.o[l], 0xff, esz * T * Hq * D); /* poison */
            cudaMemset(g.lse[l], 0xff, 4 * (size_t)T * Hq);
        }
        st = ak_backend_plan(b, &batch, stream);
        if (st != AK_OK) {
            snprintf(why, sizeof why, "plan step %d: %s", s, ak_last_error());
            ok = 0;
            break;
        }
        if (s == 0) {
            /* capture once, after the first plan: the graph holds no plan data */
            cudaGraph_t graph;
            if (!CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal))) {
                snprintf(why, sizeof why, "begin capture failed");
                ok = 0;
                break;
            }
            for (int l = 0; l < LAYERS && st == AK_OK; l++) {
                ak_paged_kv view;
                ak_kv_cache_layer(cache, l, &view);
                ak_tensor kt = ak_tensor_3d(g.k[l], gc->dtype, T, Hk, D), vt = ak_tensor_3d(g.v[l], gc->dtype, T, Hk, D);
                ak_tensor qt = ak_tensor_3d(g.q[l], gc->dtype, T, Hq, D), ot = ak_tensor_3d(g.o[l], gc->dtype, T, Hq, D);
                ak_tensor lt = ak_tensor_2d(g.lse[l], AK_F32, T, Hq);
                if (!ak_backend_forward_includes_kv_update(b))
                    st = ak_kv_update(&view, &kt, &vt, ak_backend_slot_mapping(b), T, stream);
                ak_run_args a;
                ak_run_args_init(&a);
                a.q = &qt;
                a.kv = &view;
                a.o = &ot;
                a.lse = &lt;
                if (st == AK_OK) st = ak_backend_run(b, &a, stream);
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
        /* check every layer against cpu_ref on what the graph left in the cache */
        for (int l = 0; l < LAYERS && ok; l++) {
            ak_paged_kv view, hview;
            ak_kv_cache_layer(cache, l, &view);
            cudaMemcpy(hk, view.k_data, pool_bytes, cudaMemcpyDeviceToHost);
            cudaMemcpy(hv, view.v_data, pool_bytes, cudaMemcpyDeviceToHost);
            cudaMemcpy(kh, g.k[l], esz * T * Hk * D, cudaMemcpyDeviceToHost);
            cudaMemcpy(vh, g.v[l], esz * T * Hk * D, cudaMemcpyDeviceToHost);
            /* every new token's K/V at its slot; put the old row back in the
             * copy of the pools, which must then equal the pools as uploaded */
            for (int i = 0; i < N && ok; i++) {
                const int r = tok_req[i];
                const int pos = kvl[r] - (qo[r + 1] - qo[r]) + (i - qo[r]);
                const int64_t block = bt[r * max_blocks + pos / P];
                for (int h = 0; h < Hk; h++) {
                    /* the test's own address of (block, slot, head), by layout */
                    const int64_t row = gc->layout == AK_LAYOUT_NHD ? (block * P + pos % P) * Hk + h
                                                                    : (block * Hk + h) * P + pos % P;
                    const size_t src = ((size_t)i * Hk + h) * D * esz, at = (size_t)row * D * esz;
                    if (memcmp(hk + at, kh + src, D * esz) || memcmp(hv + at, vh + src, D * esz)) {
                        snprintf(why, sizeof why, "step %d layer %d: token %d's new K/V is not at its slot", s, l, i);
                        ok = 0;
                    }
                    memcpy(hk + at, before_k[l] + at, D * esz);
                    memcpy(hv + at, before_v[l] + at, D * esz);
                }
            }
            if (ok && (memcmp(hk, before_k[l], pool_bytes) || memcmp(hv, before_v[l], pool_bytes))) {
                snprintf(why, sizeof why, "step %d layer %d: the cache changed outside the step's slots", s, l);
                ok = 0;
            }
            /* the reference reads the cache with the new rows in place */
            cudaMemcpy(hk, view.k_data, pool_bytes, cudaMemcpyDeviceToHost);
            cudaMemcpy(hv, view.v_data, pool_bytes, cudaMemcpyDeviceToHost);
            hview = view;
            hview.k_data = hk;
            hview.v_data = hv;
            hview.device.kind = AK_DEVICE_CPU;
            cudaMemcpy(qh, g.q[l], esz * T * Hq * D, cudaMemcpyDeviceToHost);
            ak_tensor qt = ak_tensor_3d(qh, gc->dtype, N, Hq, D);
            ak_tensor rt = ak_tensor_3d(o_ref, AK_F32, N, Hq, D), rl = ak_tensor_2d(l_ref, AK_F32, N, Hq);
            ak_attn_config *rc = &ref_cfg;
            rc->o_dtype = AK_F32;
            ak_backend_destroy(ref);
            ak_backend_create(rc, &lim, "cpu_ref", &ref);
            ak_run_args a;
            ak_run_args_init(&a);
            a.q = &qt;
            a.kv = &hview;
            a.o = &rt;
            a.lse = &rl;
            if (ak_backend_plan(ref, &batch, NULL) != AK_OK || ak_backend_run(ref, &a, NULL) != AK_OK) {
                snprintf(why, sizeof why, "cpu_ref: %s", ak_last_error());
                ok = 0;
                break;
            }
            if (!check_graph_output(gc->dtype, g.o[l], g.lse[l], N, T, Hq, D, o_ref, l_ref, &worst, &worst_lse, s,
                                    l, why, sizeof why))
                ok = 0;
        }
    }
    report_graph_case(t, name, gc->name, gc->dtype, ok, why, worst, worst_lse, STEPS, LAYERS);

    if (exec) cudaGraphExecDestroy(exec);
    cudaStreamDestroy(stream);
    graph_bufs_free(&g);
    for (int l = 0; l < LAYERS; l++) {
        free(before_k[l]);
        free(before_v[l]);
    }
    free(tok_req);
    free(hk);
    free(hv);
    free(qh);
    free(kh);
    free(vh);
    free(o_ref);
    free(l_ref);
    free(bt);
    free(ids);
    ak_backend_destroy(ref);
    ak_backend_destroy(b);
    ak_kv_cache_destroy(cache);
}

/* ---- ragged K/V -------------------------------------------------------------- */

/* Longest prompt (causal cases) or query (cross) and longest cross K/V; the
 * reference is cpu_ref, f64 on one thread, so steps stay small. */
enum { RG_LAYERS = 2, RG_STEPS = 8, RG_MAX_Q = 96, RG_MAX_KV = 200 };
_Static_assert(RG_LAYERS <= GRAPH_MAX_LAYERS, "graph_bufs holds every layer of a ragged case");

typedef struct ragged_graph_case {
    const char *name;
    int num_qo_heads, num_kv_heads, head_dim;
    ak_dtype dtype;
    int num_reqs;
    int causal; /* 1: prompt prefills, kv_len = q_len; 0: cross-attention, kv_len unrelated (may be 0) */
    int window_left;
} ragged_graph_case;

static const ragged_graph_case ragged_graph_cases[] = {
    {"graph replay ragged prefill gqa4 bf16 d128", 16, 4, 128, AK_BF16, 4, 1, -1},
    {"graph replay ragged cross mqa f16 d64 window", 8, 1, 64, AK_F16, 3, 0, 50},
    {"graph replay ragged prefill gqa2 bf16 d256", 8, 4, 256, AK_BF16, 2, 1, -1},
};

/* Lengths of step s: the capture (s = 0) has every request at its longest;
 * later steps are random, some requests empty. Returns the query tokens and
 * sets *kv_total. */
static int ragged_step_lengths(uint64_t *rng, int s, const ragged_graph_case *gc, int32_t *qo, int32_t *kv_lens,
                               int *kv_total)
{
    qo[0] = 0;
    *kv_total = 0;
    for (int r = 0; r < gc->num_reqs; r++) {
        const int q = s == 0 ? RG_MAX_Q : rng_int(rng, 0, 7) == 0 ? 0 : rng_int(rng, 1, RG_MAX_Q);
        const int kv = gc->causal ? q : s == 0 ? RG_MAX_KV : rng_int(rng, 0, 4) == 0 ? 0 : rng_int(rng, 1, RG_MAX_KV);
        qo[r + 1] = qo[r] + q;
        kv_lens[r] = kv;
        *kv_total += kv;
    }
    return qo[gc->num_reqs];
}

static void run_ragged_graph_case(test_ctx *t, const char *name, const ragged_graph_case *gc)
{
    const int R = gc->num_reqs, Hq = gc->num_qo_heads, Hk = gc->num_kv_heads, D = gc->head_dim;
    const int T = R * RG_MAX_Q, KT = R * (gc->causal ? RG_MAX_Q : RG_MAX_KV); /* the capture's tokens, keys */
    const size_t esz = ak_dtype_size(gc->dtype);
    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.num_qo_heads = Hq;
    cfg.num_kv_heads = Hk;
    cfg.head_dim_qk = cfg.head_dim_vo = D;
    cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = gc->dtype;
    cfg.device = t->device;
    cfg.causal = gc->causal;
    cfg.window_left = gc->window_left;
    cfg.kv_storage = AK_KV_RAGGED;
    ak_limits lim;
    ak_limits_init(&lim);
    lim.max_reqs = R;
    lim.max_tokens = T;

    ak_backend *b = create_for_graphs(t, name, gc->name, &cfg, &lim, AK_GRAPH_ALWAYS);
    if (!b) return;
    ak_status st;
    ak_attn_config ref_cfg = cfg;
    ref_cfg.device.kind = AK_DEVICE_CPU;
    ref_cfg.o_dtype = AK_F32;

    /* fixed device buffers the graph reads and writes */
    graph_bufs g;
    graph_bufs_alloc(&g, RG_LAYERS, esz, T, Hq, KT, Hk, D);
    char *qh = malloc(esz * T * Hq * D), *kh = malloc(esz * KT * Hk * D), *vh = malloc(esz * KT * Hk * D);
    float *o_ref = malloc(sizeof(float) * T * Hq * D), *l_ref = malloc(sizeof(float) * T * Hq);
    int32_t qo[16], kvl[16];
    ak_batch batch;
    ak_batch_init(&batch);
    batch.num_reqs = R;
    batch.qo_indptr = qo;
    batch.kv_lens = kvl;
    uint64_t rng = t->seed ^ name_hash(gc->name);
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    cudaGraphExec_t exec = NULL;
    double worst = 0, worst_lse = 0;
    int ok = 1;
    char why[256] = "";

    for (int s = 0; s < RG_STEPS && ok; s++) {
        int KN = 0;
        const int N = ragged_step_lengths(&rng, s, gc, qo, kvl, &KN);
        /* fresh q, K and V everywhere (rows past the step's too), o poisoned */
        for (int l = 0; l < RG_LAYERS; l++) {
            for (int i = 0; i < T * Hq * D; i++) ak_store_from_f32(qh, gc->dtype, i, rng_uniform(&rng));
            for (int i = 0; i < KT * Hk * D; i++) ak_store_from_f32(kh, gc->dtype, i, 2.0f * rng_uniform(&rng));
            for (int i = 0; i < KT * Hk * D; i++) ak_store_from_f32(vh, gc->dtype, i, rng_uniform(&rng));
            cudaMemcpy(g.q[l], qh, esz * T * Hq * D, cudaMemcpyHostToDevice);
            cudaMemcpy(g.k[l], kh, esz * KT * Hk * D, cudaMemcpyHostToDevice);
            cudaMemcpy(g.v[l], vh, esz * KT * Hk * D, cudaMemcpyHostToDevice);
            cudaMemset(g.o[l], 0xff, esz * T * Hq * D);
            cudaMemset(g.lse[l], 0xff, 4 * (size_t)T * Hq);
        }
        st = ak_backend_plan(b, &batch, stream);
        if (st != AK_OK) {
            snprintf(why, sizeof why, "plan step %d: %s", s, ak_last_error());
            ok = 0;
            break;
        }
        if (s == 0) {
            /* the capture: the largest step, so the tensors it holds fit every later one */
            cudaGraph_t graph;
            if (!CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal))) {
                snprintf(why, sizeof why, "begin capture failed");
                ok = 0;
                break;
            }
            for (int l = 0; l < RG_LAYERS && st == AK_OK; l++) {
                ak_tensor qt = ak_tensor_3d(g.q[l], gc->dtype, T, Hq, D);
                ak_tensor ot = ak_tensor_3d(g.o[l], gc->dtype, T, Hq, D);
                ak_tensor kt = ak_tensor_3d(g.k[l], gc->dtype, KT, Hk, D);
                ak_tensor vt = ak_tensor_3d(g.v[l], gc->dtype, KT, Hk, D);
                ak_tensor lt = ak_tensor_2d(g.lse[l], AK_F32, T, Hq);
                ak_run_args a;
                ak_run_args_init(&a);
                a.q = &qt;
                a.k = &kt;
                a.v = &vt;
                a.o = &ot;
                a.lse = &lt;
                st = ak_backend_run(b, &a, stream);
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
        /* every layer against cpu_ref on the step's rows of q, K and V */
        for (int l = 0; l < RG_LAYERS && ok; l++) {
            cudaMemcpy(qh, g.q[l], esz * T * Hq * D, cudaMemcpyDeviceToHost);
            cudaMemcpy(kh, g.k[l], esz * KT * Hk * D, cudaMemcpyDeviceToHost);
            cudaMemcpy(vh, g.v[l], esz * KT * Hk * D, cudaMemcpyDeviceToHost);
            ak_backend *ref = NULL;
            ak_tensor qt = ak_tensor_3d(qh, gc->dtype, N, Hq, D);
            ak_tensor kt = ak_tensor_3d(kh, gc->dtype, KN, Hk, D), vt = ak_tensor_3d(vh, gc->dtype, KN, Hk, D);
            ak_tensor rt = ak_tensor_3d(o_ref, AK_F32, N, Hq, D), rl = ak_tensor_2d(l_ref, AK_F32, N, Hq);
            ak_run_args a;
            ak_run_args_init(&a);
            a.q = &qt;
            a.k = &kt;
            a.v = &vt;
            a.o = &rt;
            a.lse = &rl;
            if (ak_backend_create(&ref_cfg, &lim, "cpu_ref", &ref) != AK_OK ||
                ak_backend_plan(ref, &batch, NULL) != AK_OK || ak_backend_run(ref, &a, NULL) != AK_OK) {
                snprintf(why, sizeof why, "cpu_ref: %s", ak_last_error());
                ak_backend_destroy(ref);
                ok = 0;
                break;
            }
            ak_backend_destroy(ref);
            if (!check_graph_output(gc->dtype, g.o[l], g.lse[l], N, T, Hq, D, o_ref, l_ref, &worst, &worst_lse, s,
                                    l, why, sizeof why))
                ok = 0;
        }
    }
    report_graph_case(t, name, gc->name, gc->dtype, ok, why, worst, worst_lse, RG_STEPS, RG_LAYERS);

    if (exec) cudaGraphExecDestroy(exec);
    cudaStreamDestroy(stream);
    graph_bufs_free(&g);
    free(qh);
    free(kh);
    free(vh);
    free(o_ref);
    free(l_ref);
    ak_backend_destroy(b);
}

void test_graphs(test_ctx *t)
{
    if (t->device.kind != AK_DEVICE_CUDA) return;
    const char *names[16];
    const int nb = t_backends(t, names, 16);
    for (int i = 0; i < nb; i++)
        for (size_t c = 0; c < sizeof graph_cases / sizeof *graph_cases; c++)
            if (t_selected(t, graph_cases[c].name) && t_storage_selected(t, AK_KV_PAGED))
                run_graph_case(t, names[i], &graph_cases[c]);
    for (int i = 0; i < nb; i++)
        for (size_t c = 0; c < sizeof ragged_graph_cases / sizeof *ragged_graph_cases; c++)
            if (t_selected(t, ragged_graph_cases[c].name) && t_storage_selected(t, AK_KV_RAGGED))
                run_ragged_graph_case(t, names[i], &ragged_graph_cases[c]);
}
#else
void test_graphs(test_ctx *t) { (void)t; }
#endif
