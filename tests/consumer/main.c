/*
 * main.c - a program that uses attnkit as an installed library would: only
 * attnkit.h and the library, built outside attnkit's own build (run.sh). One
 * decode step on the CPU: the same batch through the cpu backend and through
 * cpu_ref (create -> plan -> kv_update -> run), the outputs compared. It also
 * checks that the library it runs with has the version it was built for
 * (AK_EXPECTED_VERSION, from the build that made the library).
 */
#include "attnkit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef AK_EXPECTED_VERSION
#error "AK_EXPECTED_VERSION (\"major.minor.patch\") is defined by the consumer's build"
#endif

enum {
    NUM_REQS = 3,
    NUM_QO_HEADS = 8,
    NUM_KV_HEADS = 2,
    HEAD_DIM = 64,
    PAGE_SIZE = 16,
    MAX_BLOCKS_PER_REQ = 4,
    NUM_BLOCKS = NUM_REQS * MAX_BLOCKS_PER_REQ,
};
/* cpu against cpu_ref in f32: the test harness's f32 tolerance */
#define MAX_ABS_DIFF 1e-4

#define TRY(x)                                                                          \
    do {                                                                                \
        const ak_status s_ = (x);                                                       \
        if (s_ != AK_OK) {                                                              \
            fprintf(stderr, "%s: %s: %s\n", #x, ak_status_str(s_), ak_last_error());   \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

static float frand(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 8388608.0f - 1.0f;
}

static int check_version(void)
{
    int major, minor, patch;
    const char *s = ak_version_string();
    if (sscanf(s, "%d.%d.%d", &major, &minor, &patch) != 3 ||
        ak_version() != major * 10000 + minor * 100 + patch) {
        fprintf(stderr, "ak_version() = %d does not match ak_version_string() = \"%s\"\n",
                ak_version(), s);
        return 1;
    }
    if (strcmp(s, AK_EXPECTED_VERSION) != 0) {
        fprintf(stderr, "the library is version %s, the build expected %s\n", s,
                AK_EXPECTED_VERSION);
        return 1;
    }
    return 0;
}

/* One decode step of the batch through backend `name`: o [NUM_REQS,
 * NUM_QO_HEADS, HEAD_DIM] and lse [NUM_REQS, NUM_QO_HEADS] are written. */
static int decode_step(const char *name, const ak_attn_config *cfg, const ak_limits *lim,
                       const ak_batch *batch, const ak_paged_kv *kv, float *q, float *k_new,
                       float *v_new, float *o, float *lse)
{
    ak_backend *b;
    TRY(ak_backend_create(cfg, lim, name, &b));
    TRY(ak_backend_plan(b, batch, NULL));
    ak_tensor k = ak_tensor_3d(k_new, AK_F32, NUM_REQS, NUM_KV_HEADS, HEAD_DIM);
    ak_tensor v = ak_tensor_3d(v_new, AK_F32, NUM_REQS, NUM_KV_HEADS, HEAD_DIM);
    if (!ak_backend_forward_includes_kv_update(b))
        TRY(ak_kv_update(kv, &k, &v, ak_backend_slot_mapping(b), NUM_REQS, NULL));
    ak_tensor qt = ak_tensor_3d(q, AK_F32, NUM_REQS, NUM_QO_HEADS, HEAD_DIM);
    ak_tensor ot = ak_tensor_3d(o, AK_F32, NUM_REQS, NUM_QO_HEADS, HEAD_DIM);
    ak_tensor lt = ak_tensor_2d(lse, AK_F32, NUM_REQS, NUM_QO_HEADS);
    ak_run_args args;
    ak_run_args_init(&args);
    args.q = &qt;
    args.kv = kv;
    args.o = &ot;
    args.lse = &lt;
    const ak_status st = ak_backend_run(b, &args, NULL);
    if (st != AK_OK)
        fprintf(stderr, "%s: ak_backend_run: %s: %s\n", name, ak_status_str(st), ak_last_error());
    ak_backend_destroy(b);
    return st == AK_OK ? 0 : 1;
}

int main(void)
{
    if (check_version()) return 1;
    printf("attnkit %s\n", ak_version_string());

    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.num_qo_heads = NUM_QO_HEADS;
    cfg.num_kv_heads = NUM_KV_HEADS;
    cfg.head_dim_qk = cfg.head_dim_vo = HEAD_DIM;
    cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = AK_F32;
    cfg.device = (ak_device){AK_DEVICE_CPU, 0};
    cfg.page_size = PAGE_SIZE;
    cfg.workload = AK_WORKLOAD_DECODE;

    ak_limits lim;
    ak_limits_init(&lim);
    lim.max_reqs = NUM_REQS;
    lim.max_tokens = NUM_REQS;
    lim.max_blocks_per_req = MAX_BLOCKS_PER_REQ;
    lim.num_cache_blocks = NUM_BLOCKS;

    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.num_blocks = NUM_BLOCKS;
    kc.page_size = PAGE_SIZE;
    kc.num_kv_heads = NUM_KV_HEADS;
    kc.head_dim_qk = kc.head_dim_vo = HEAD_DIM;
    kc.dtype = AK_F32;
    ak_kv_cache *cache;
    TRY(ak_kv_cache_create(&kc, &cache));
    ak_paged_kv kv;
    TRY(ak_kv_cache_layer(cache, 0, &kv));

    /* request r has kv_lens[r] keys, the last one this step's token */
    int32_t qo_indptr[NUM_REQS + 1] = {0, 1, 2, 3};
    int32_t kv_lens[NUM_REQS] = {1, 17, 60};
    int32_t block_table[NUM_REQS * MAX_BLOCKS_PER_REQ];
    for (int r = 0; r < NUM_REQS; r++) {
        const int need = (kv_lens[r] + PAGE_SIZE - 1) / PAGE_SIZE;
        TRY(ak_kv_cache_alloc(cache, need, block_table + r * MAX_BLOCKS_PER_REQ));
    }
    ak_batch batch;
    ak_batch_init(&batch);
    batch.num_reqs = NUM_REQS;
    batch.qo_indptr = qo_indptr;
    batch.kv_lens = kv_lens;
    batch.block_table = block_table;
    batch.block_table_stride = MAX_BLOCKS_PER_REQ;

    /* random context in the pools, random q and new K/V */
    enum {
        POOL = NUM_BLOCKS * PAGE_SIZE * NUM_KV_HEADS * HEAD_DIM,
        Q_ELEMS = NUM_REQS * NUM_QO_HEADS * HEAD_DIM,
        KV_ELEMS = NUM_REQS * NUM_KV_HEADS * HEAD_DIM,
        LSE_ELEMS = NUM_REQS * NUM_QO_HEADS,
    };
    unsigned seed = 2024;
    float *pool_k = kv.k_data, *pool_v = kv.v_data;
    for (int i = 0; i < POOL; i++) pool_k[i] = frand(&seed), pool_v[i] = frand(&seed);
    static float q[Q_ELEMS], k_new[KV_ELEMS], v_new[KV_ELEMS];
    for (int i = 0; i < Q_ELEMS; i++) q[i] = frand(&seed);
    for (int i = 0; i < KV_ELEMS; i++) k_new[i] = frand(&seed), v_new[i] = frand(&seed);

    static float o_cpu[Q_ELEMS], o_ref[Q_ELEMS], lse_cpu[LSE_ELEMS], lse_ref[LSE_ELEMS];
    if (decode_step("cpu", &cfg, &lim, &batch, &kv, q, k_new, v_new, o_cpu, lse_cpu) ||
        decode_step("cpu_ref", &cfg, &lim, &batch, &kv, q, k_new, v_new, o_ref, lse_ref)) {
        ak_kv_cache_destroy(cache);
        return 1;
    }
    ak_kv_cache_destroy(cache);

    double max_diff = 0;
    for (int i = 0; i < Q_ELEMS; i++) {
        const double d = fabs((double)o_cpu[i] - o_ref[i]);
        max_diff = d > max_diff || isnan(d) ? d : max_diff;
    }
    for (int i = 0; i < LSE_ELEMS; i++) {
        const double d = fabs((double)lse_cpu[i] - lse_ref[i]);
        max_diff = d > max_diff || isnan(d) ? d : max_diff;
    }
    printf("decode step of %d requests: cpu vs cpu_ref max abs diff %.2e (limit %.0e)\n", NUM_REQS,
           max_diff, MAX_ABS_DIFF);
    return max_diff <= MAX_ABS_DIFF ? 0 : 1;
}
