/*
 * test_graph.c - plan-then-replay under CUDA graphs. For each CUDA backend
 * that declares graph support: capture kv_update + run for every layer of a
 * step into one graph, then for ten steps whose lengths, block tables and
 * split counts all differ, plan() and replay the same graph; every step's
 * outputs are checked against cpu_ref on a copy of the cache the graph wrote,
 * and the new tokens' K/V must be at their slots (kv_update ran in the graph).
 */
#include "harness.h"

#include "dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef AK_HAVE_CUDA
#include <cuda_runtime_api.h>

enum { LAYERS = 3, STEPS = 10, MAX_KV = 3000 };

typedef struct graph_case {
    const char *name;
    int num_qo_heads, num_kv_heads, head_dim;
    ak_dtype dtype;
    int page_size;
    int num_reqs;
    int window_left;
    ak_kv_layout layout;
} graph_case;

static const graph_case graph_cases[] = {
    {"graph replay gqa4 bf16 d128 (tensor cores)", 16, 4, 128, AK_BF16, 16, 5, -1, AK_LAYOUT_NHD},
    {"graph replay mha f16 d64 hnd (CUDA cores)", 4, 4, 64, AK_F16, 16, 3, -1, AK_LAYOUT_HND},
    {"graph replay gqa8 bf16 d256 page 1 window", 16, 2, 256, AK_BF16, 1, 2, 700, AK_LAYOUT_NHD},
    {"graph replay batch 1 long context hnd", 32, 8, 128, AK_BF16, 16, 1, -1, AK_LAYOUT_HND},
};

#define CUDA_OK(x) ((x) == cudaSuccess)

/* Kv lengths of step s: the mix changes every step (all short, one long, ...). */
static void step_lengths(uint64_t *rng, int s, int n, int32_t *kv_lens)
{
    for (int r = 0; r < n; r++) {
        const int long_one = (s % 3 == 1 && r == s % n) || (s % 3 == 2);
        kv_lens[r] = long_one ? rng_int(rng, 1000, MAX_KV) : rng_int(rng, 1, s % 2 ? 64 : 300);
    }
}

static void run_graph_case(test_ctx *t, const char *name, const graph_case *gc)
{
    const int R = gc->num_reqs, Hq = gc->num_qo_heads, Hk = gc->num_kv_heads, D = gc->head_dim, P = gc->page_size;
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
    cfg.workload = AK_WORKLOAD_DECODE;
    ak_limits lim;
    ak_limits_init(&lim);
    lim.max_reqs = R;
    lim.max_tokens = R;
    lim.max_blocks_per_req = max_blocks;
    lim.num_cache_blocks = num_blocks;

    ak_backend *b = NULL;
    ak_status st = ak_backend_create(&cfg, &lim, name, &b);
    if (st == AK_ERR_UNSUPPORTED) {
        t_skip(t, name, gc->name, "unsupported");
        return;
    }
    if (st != AK_OK) {
        t_fail(t, name, gc->name, "create: %s", ak_last_error());
        return;
    }
    if (ak_backend_graph_support(b) == AK_GRAPH_NEVER) {
        t_skip(t, name, gc->name, "backend declares no graph support");
        ak_backend_destroy(b);
        return;
    }

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
    void *q_dev[LAYERS], *o_dev[LAYERS], *lse_dev[LAYERS], *k_dev[LAYERS], *v_dev[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        cudaMalloc(&q_dev[l], esz * R * Hq * D);
        cudaMalloc(&o_dev[l], esz * R * Hq * D);
        cudaMalloc(&lse_dev[l], 4 * (size_t)R * Hq);
        cudaMalloc(&k_dev[l], esz * R * Hk * D);
        cudaMalloc(&v_dev[l], esz * R * Hk * D);
    }
    uint64_t rng = t->seed ^ name_hash(gc->name);
    int32_t qo[64], kvl[64], *bt = malloc(sizeof(int32_t) * (size_t)R * max_blocks);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)num_blocks);
    for (int i = 0; i < num_blocks; i++) ids[i] = i;
    for (int r = 0; r <= R; r++) qo[r] = r;
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

    char *host = malloc(pool_bytes), *hk = malloc(pool_bytes), *hv = malloc(pool_bytes);
    char *qh = malloc(esz * R * Hq * D), *kh = malloc(esz * R * Hk * D), *vh = malloc(esz * R * Hk * D);
    char *oh = malloc(esz * R * Hq * D);
    float *o_ref = malloc(sizeof(float) * R * Hq * D), *l_ref = malloc(sizeof(float) * R * Hq);
    float *lh = malloc(sizeof(float) * R * Hq);
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    cudaGraphExec_t exec = NULL;
    double worst = 0, worst_lse = 0;
    int ok = 1;
    char why[256] = "";

    for (int s = 0; s < STEPS && ok; s++) {
        step_lengths(&rng, s, R, kvl);
        rng_shuffle_i32(&rng, ids, num_blocks);
        for (int r = 0; r < R; r++)
            for (int j = 0; j < max_blocks; j++) bt[r * max_blocks + j] = ids[r * max_blocks + j];
        /* fresh context everywhere (random pools), fresh q and new K/V rows */
        for (int l = 0; l < LAYERS; l++) {
            ak_paged_kv view;
            ak_kv_cache_layer(cache, l, &view);
            for (size_t i = 0; i < pool_bytes / esz; i++) ak_store_from_f32(host, gc->dtype, (int64_t)i, rng_uniform(&rng));
            cudaMemcpy(view.k_data, host, pool_bytes, cudaMemcpyHostToDevice);
            for (size_t i = 0; i < pool_bytes / esz; i++) ak_store_from_f32(host, gc->dtype, (int64_t)i, rng_uniform(&rng));
            cudaMemcpy(view.v_data, host, pool_bytes, cudaMemcpyHostToDevice);
            for (int i = 0; i < R * Hq * D; i++) ak_store_from_f32(qh, gc->dtype, i, rng_uniform(&rng));
            cudaMemcpy(q_dev[l], qh, esz * R * Hq * D, cudaMemcpyHostToDevice);
            for (int i = 0; i < R * Hk * D; i++) ak_store_from_f32(kh, gc->dtype, i, 2.0f * rng_uniform(&rng));
            for (int i = 0; i < R * Hk * D; i++) ak_store_from_f32(vh, gc->dtype, i, rng_uniform(&rng));
            cudaMemcpy(k_dev[l], kh, esz * R * Hk * D, cudaMemcpyHostToDevice);
            cudaMemcpy(v_dev[l], vh, esz * R * Hk * D, cudaMemcpyHostToDevice);
            cudaMemset(o_dev[l], 0xff, esz * R * Hq * D); /* poison */
            cudaMemset(lse_dev[l], 0xff, 4 * (size_t)R * Hq);
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
                ak_tensor kt = ak_tensor_3d(k_dev[l], gc->dtype, R, Hk, D), vt = ak_tensor_3d(v_dev[l], gc->dtype, R, Hk, D);
                ak_tensor qt = ak_tensor_3d(q_dev[l], gc->dtype, R, Hq, D), ot = ak_tensor_3d(o_dev[l], gc->dtype, R, Hq, D);
                ak_tensor lt = ak_tensor_2d(lse_dev[l], AK_F32, R, Hq);
                if (!ak_backend_forward_includes_kv_update(b))
                    st = ak_kv_update(&view, &kt, &vt, ak_backend_slot_mapping(b), R, stream);
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
            cudaMemcpy(kh, k_dev[l], esz * R * Hk * D, cudaMemcpyDeviceToHost);
            cudaMemcpy(vh, v_dev[l], esz * R * Hk * D, cudaMemcpyDeviceToHost);
            for (int r = 0; r < R; r++) {
                const int pos = kvl[r] - 1;
                const int64_t block = bt[r * max_blocks + pos / P];
                for (int h = 0; h < Hk; h++) {
                    /* the test's own address of (block, slot, head), by layout */
                    const int64_t row = gc->layout == AK_LAYOUT_NHD ? (block * P + pos % P) * Hk + h
                                                                    : (block * Hk + h) * P + pos % P;
                    const size_t src = ((size_t)r * Hk + h) * D * esz;
                    if (memcmp(hk + row * D * esz, kh + src, D * esz) || memcmp(hv + row * D * esz, vh + src, D * esz)) {
                        snprintf(why, sizeof why, "step %d layer %d: request %d's new K/V is not at its slot", s, l, r);
                        ok = 0;
                    }
                }
            }
            hview = view;
            hview.k_data = hk;
            hview.v_data = hv;
            hview.device.kind = AK_DEVICE_CPU;
            cudaMemcpy(qh, q_dev[l], esz * R * Hq * D, cudaMemcpyDeviceToHost);
            ak_tensor qt = ak_tensor_3d(qh, gc->dtype, R, Hq, D);
            ak_tensor rt = ak_tensor_3d(o_ref, AK_F32, R, Hq, D), rl = ak_tensor_2d(l_ref, AK_F32, R, Hq);
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
            cudaMemcpy(oh, o_dev[l], esz * R * Hq * D, cudaMemcpyDeviceToHost);
            cudaMemcpy(lh, lse_dev[l], 4 * (size_t)R * Hq, cudaMemcpyDeviceToHost);
            float *of = malloc(sizeof(float) * R * Hq * D);
            double *rd = malloc(sizeof(double) * R * Hq * D), ld[256];
            for (int i = 0; i < R * Hq * D; i++) {
                of[i] = ak_load_as_f32(oh, gc->dtype, i);
                rd[i] = o_ref[i];
                if (isnan(of[i])) ok = 0;
            }
            for (int i = 0; i < R * Hq; i++) ld[i] = l_ref[i];
            const double e = rel_err_f(of, rd, (int64_t)R * Hq * D), le = max_lse_err(lh, ld, (int64_t)R * Hq);
            if (e > worst) worst = e;
            if (le > worst_lse) worst_lse = le;
            if (!ok) snprintf(why, sizeof why, "step %d layer %d: NaN in o", s, l);
            free(of);
            free(rd);
        }
    }
    const double tol = tolerance(gc->dtype);
    if (ok && worst <= tol && worst_lse <= 2e-3)
        t_pass(t, name, gc->name, "%d steps x %d layers, worst rel err %.2e, lse err %.2e", STEPS, LAYERS, worst,
               worst_lse);
    else
        t_fail(t, name, gc->name, "%s worst rel err %.2e (tol %.0e), lse err %.2e", why, worst, tol, worst_lse);

    if (exec) cudaGraphExecDestroy(exec);
    cudaStreamDestroy(stream);
    for (int l = 0; l < LAYERS; l++) {
        cudaFree(q_dev[l]);
        cudaFree(o_dev[l]);
        cudaFree(lse_dev[l]);
        cudaFree(k_dev[l]);
        cudaFree(v_dev[l]);
    }
    free(host);
    free(hk);
    free(hv);
    free(qh);
    free(kh);
    free(vh);
    free(oh);
    free(o_ref);
    free(l_ref);
    free(lh);
    free(bt);
    free(ids);
    ak_backend_destroy(ref);
    ak_backend_destroy(b);
    ak_kv_cache_destroy(cache);
}

void test_graphs(test_ctx *t)
{
    if (t->device.kind != AK_DEVICE_CUDA) return;
    const char *names[16];
    const int nb = t_backends(t, names, 16);
    for (int i = 0; i < nb; i++)
        for (size_t c = 0; c < sizeof graph_cases / sizeof *graph_cases; c++)
            if (t_selected(t, graph_cases[c].name)) run_graph_case(t, names[i], &graph_cases[c]);
}
#else
void test_graphs(test_ctx *t) { (void)t; }
#endif
