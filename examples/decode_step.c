/*
 * decode_step.c - the README's example, compiled and run by the test suite:
 * one decode step of a Llama-3-8B-shaped model (4 layers) on the device the
 * selector picks (the GPU where one is found), create -> plan -> kv_update ->
 * run, checked against cpu_ref on the last layer.
 */
#include "attnkit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef AK_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

enum { LAYERS = 4, REQS = 4, HQ = 32, HK = 8, D = 128, PAGE = 16, MAX_BLOCKS = 64, BLOCKS = REQS * MAX_BLOCKS };

#define TRY(x)                                                                 \
    do {                                                                       \
        ak_status s_ = (x);                                                    \
        if (s_ != AK_OK) {                                                     \
            fprintf(stderr, "%s: %s\n%s\n", #x, ak_status_str(s_), ak_last_error()); \
            return 1;                                                          \
        }                                                                      \
    } while (0)

static float frand(unsigned *s) { *s = *s * 1664525u + 1013904223u; return (float)(*s >> 8) / 8388608.0f - 1.0f; }

/* Device buffers through the CUDA runtime, host memory on the CPU. */
static void *dev_alloc(ak_device d, size_t n)
{
#ifdef AK_HAVE_CUDA
    if (d.kind == AK_DEVICE_CUDA) { void *p = NULL; return cudaMalloc(&p, n) == cudaSuccess ? p : NULL; }
#endif
    (void)d;
    return malloc(n);
}
static void dev_free(ak_device d, void *p)
{
#ifdef AK_HAVE_CUDA
    if (d.kind == AK_DEVICE_CUDA) { cudaFree(p); return; }
#endif
    (void)d;
    free(p);
}
static void copy(ak_device d, void *dst, const void *src, size_t n, int to_dev)
{
#ifdef AK_HAVE_CUDA
    if (d.kind == AK_DEVICE_CUDA) { cudaMemcpy(dst, src, n, to_dev ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost); return; }
#endif
    (void)d; (void)to_dev;
    memcpy(dst, src, n);
}

int main(void)
{
    const int gpu = ak_device_count(AK_DEVICE_CUDA) > 0;
    const ak_device dev = {gpu ? AK_DEVICE_CUDA : AK_DEVICE_CPU, 0};
    const ak_dtype dt = gpu ? AK_BF16 : AK_F32; /* the CPU also takes f32 */
    const size_t esz = ak_dtype_size(dt);

    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.num_qo_heads = HQ;
    cfg.num_kv_heads = HK;
    cfg.head_dim_qk = cfg.head_dim_vo = D;
    cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = dt;
    cfg.device = dev;
    cfg.page_size = PAGE;
    cfg.workload = AK_WORKLOAD_DECODE;

    ak_limits lim;
    ak_limits_init(&lim);
    lim.max_reqs = REQS;
    lim.max_tokens = REQS;
    lim.max_blocks_per_req = MAX_BLOCKS;
    lim.num_cache_blocks = BLOCKS;

    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.num_layers = LAYERS;
    kc.num_blocks = BLOCKS;
    kc.page_size = PAGE;
    kc.num_kv_heads = HK;
    kc.head_dim_qk = kc.head_dim_vo = D;
    kc.dtype = dt;
    kc.device = dev;
    ak_kv_cache *cache;
    TRY(ak_kv_cache_create(&kc, &cache));

    ak_backend *b;
    TRY(ak_backend_create(&cfg, &lim, NULL, &b));
    printf("backend %s on %s\n", ak_backend_name(b), gpu ? "cuda:0" : "cpu");

    /* a batch: request r holds kv_lens[r] tokens (the last one is this step's) */
    int32_t qo_indptr[REQS + 1] = {0, 1, 2, 3, 4}, kv_lens[REQS] = {1, 77, 300, 1000};
    int32_t block_table[REQS * MAX_BLOCKS];
    for (int r = 0; r < REQS; r++) {
        const int need = (kv_lens[r] + PAGE - 1) / PAGE;
        TRY(ak_kv_cache_alloc(cache, need, block_table + r * MAX_BLOCKS));
    }
    ak_batch batch;
    ak_batch_init(&batch);
    batch.num_reqs = REQS;
    batch.qo_indptr = qo_indptr;
    batch.kv_lens = kv_lens;
    batch.block_table = block_table;
    batch.block_table_stride = MAX_BLOCKS;
    TRY(ak_backend_plan(b, &batch, NULL));

    /* random context in every layer's pools, random q and new K/V */
    unsigned seed = 1234;
    const size_t pool = (size_t)BLOCKS * PAGE * HK * D, qn = (size_t)REQS * HQ * D, kn = (size_t)REQS * HK * D;
    void *host = malloc(pool * esz);
    void *q = dev_alloc(dev, qn * esz), *o = dev_alloc(dev, qn * esz), *k = dev_alloc(dev, kn * esz), *v = dev_alloc(dev, kn * esz);
    float *tmp = malloc(pool * sizeof(float));
    for (size_t i = 0; i < pool; i++) tmp[i] = frand(&seed);
    /* values stored as f32 on the CPU, bf16 (upper halves of f32) on the GPU */
    for (size_t i = 0; i < pool; i++) {
        if (dt == AK_F32) ((float *)host)[i] = tmp[i];
        else { uint32_t u; memcpy(&u, &tmp[i], 4); ((uint16_t *)host)[i] = (uint16_t)(u >> 16); }
    }
    for (int l = 0; l < LAYERS; l++) {
        ak_paged_kv kv;
        TRY(ak_kv_cache_layer(cache, l, &kv));
        copy(dev, kv.k_data, host, pool * esz, 1);
        copy(dev, kv.v_data, host, pool * esz, 1);
    }
    copy(dev, q, host, qn * esz, 1);
    copy(dev, k, (char *)host + qn * esz, kn * esz, 1);
    copy(dev, v, (char *)host + 2 * qn * esz, kn * esz, 1);

    /* the step: per layer, write the new K/V, then attend */
    ak_paged_kv kv;
    for (int layer = 0; layer < LAYERS; layer++) {
        TRY(ak_kv_cache_layer(cache, layer, &kv));
        ak_tensor kt = ak_tensor_3d(k, dt, REQS, HK, D), vt = ak_tensor_3d(v, dt, REQS, HK, D);
        if (!ak_backend_forward_includes_kv_update(b))
            TRY(ak_kv_update(&kv, &kt, &vt, ak_backend_slot_mapping(b), REQS, NULL));
        ak_tensor qt = ak_tensor_3d(q, dt, REQS, HQ, D), ot = ak_tensor_3d(o, dt, REQS, HQ, D);
        ak_run_args args;
        ak_run_args_init(&args);
        args.q = &qt;
        args.kv = &kv;
        args.o = &ot;
        TRY(ak_backend_run(b, &args, NULL));
    }

    /* check the last layer against cpu_ref on a host copy of its cache */
    void *hk = malloc(pool * esz), *hv = malloc(pool * esz), *hq = malloc(qn * esz), *ho = malloc(qn * esz);
    float *ref = malloc(qn * sizeof(float));
    copy(dev, hk, kv.k_data, pool * esz, 0);
    copy(dev, hv, kv.v_data, pool * esz, 0);
    copy(dev, hq, q, qn * esz, 0);
    copy(dev, ho, o, qn * esz, 0);
    ak_attn_config rc = cfg;
    rc.device = (ak_device){AK_DEVICE_CPU, 0};
    rc.o_dtype = AK_F32;
    ak_backend *rb;
    TRY(ak_backend_create(&rc, &lim, "cpu_ref", &rb));
    TRY(ak_backend_plan(rb, &batch, NULL));
    ak_paged_kv hkv = kv;
    hkv.k_data = hk;
    hkv.v_data = hv;
    hkv.device = rc.device;
    ak_tensor qt = ak_tensor_3d(hq, dt, REQS, HQ, D), rt = ak_tensor_3d(ref, AK_F32, REQS, HQ, D);
    ak_run_args args;
    ak_run_args_init(&args);
    args.q = &qt;
    args.kv = &hkv;
    args.o = &rt;
    TRY(ak_backend_run(rb, &args, NULL));
    double num = 0, den = 0;
    for (size_t i = 0; i < qn; i++) {
        float x;
        if (dt == AK_F32) x = ((float *)ho)[i];
        else { uint32_t u = (uint32_t)((uint16_t *)ho)[i] << 16; memcpy(&x, &u, 4); }
        num += (x - ref[i]) * (double)(x - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    const double err = sqrt(num / den);
    printf("relative error vs cpu_ref: %.2e\n", err);
    free(host);
    free(tmp);
    free(hk);
    free(hv);
    free(hq);
    free(ho);
    free(ref);
    dev_free(dev, q);
    dev_free(dev, o);
    dev_free(dev, k);
    dev_free(dev, v);
    ak_backend_destroy(rb);
    ak_backend_destroy(b);
    ak_kv_cache_destroy(cache);
    return err < (dt == AK_F32 ? 1e-4 : 2e-2) ? 0 : 1;
}
