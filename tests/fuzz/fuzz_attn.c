/*
 * fuzz_attn.c - a fuzzed config, limits, batch and run arguments through
 * create, plan and run on cpu and cpu_ref. The two must agree: the same
 * status at every step (validation is shared, so a bad input fails the same
 * way in both), and when run succeeds the same o and lse within a tolerance,
 * NaN exactly where the other has NaN (the rule of attnkit.h; a NaN or an
 * infinity is written into q, K or V now and then). o and lse sit between
 * guard bytes and are poisoned (NaN) before the run; q, K and V are sized
 * exactly, so ASan sees any read past them. The cpu backend runs on 1 to 4
 * threads' worth of split chunks (AK_NUM_THREADS; this build has no OpenMP,
 * so they run in turn) and on each ISA the CPU has (AK_CPU_ISA).
 */
#include "fuzz_common.h"

enum {
    MAX_REQS = 6,
    MAX_Q = 48,         /* query tokens of a request, mostly far fewer */
    MAX_KV = 300,       /* keys of a request, mostly */
    MAX_CACHE_BLOCKS = 24,
    MAX_PAGE = 16,
    RUN_BUDGET = 600000 /* q x k products of cpu_ref above which run() is skipped */
};

typedef struct side {
    ak_backend *b;
    gbuf o, lse;
} side;

/* The ISAs this CPU runs, as AK_CPU_ISA takes them ("" = automatic). */
static const char *pick_isa(fz *f)
{
    const char *isas[4] = {"", "scalar", NULL, NULL};
    int n = 2;
    ak_device_info info;
    ak_device_get_info((ak_device){AK_DEVICE_CPU, 0}, &info);
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (info.cpu_has_avx2_fma_f16c) isas[n++] = "avx2";
    if (info.cpu_has_avx2_fma_f16c && __builtin_cpu_supports("avx512f")) isas[n++] = "avx512";
#endif
    return isas[fz_int(f, 0, n - 1)];
}

static ak_attn_config fuzz_config(fz *f)
{
    ak_attn_config c;
    ak_attn_config_init(&c);
    c.num_kv_heads = (int)fz_int(f, 1, 3);
    c.num_qo_heads = c.num_kv_heads * (int)fz_int(f, 1, 4);
    if (fz_rare(f, 32)) c.num_qo_heads = (int)fz_int(f, -1, 7); /* may not divide */
    static const int dims[] = {1, 7, 16, 33, 64, 72, 96, 128, 160};
    c.head_dim_qk = FZ_PICK(f, dims);
    c.head_dim_vo = fz_rare(f, 3) ? FZ_PICK(f, dims) : c.head_dim_qk;
    if (fz_rare(f, 64)) c.head_dim_vo = fz_rare(f, 2) ? 0 : 1025;
    /* scales that keep logits small enough for f32 and fp64 to agree */
    static const float scales[] = {0.0f, 0.0f, 0.05f, 0.3f};
    c.sm_scale = FZ_PICK(f, scales);
    if (fz_rare(f, 64)) c.sm_scale = fz_rare(f, 2) ? NAN : -1.0f;
    c.causal = (int)fz_int(f, 0, 1);
    if (fz_rare(f, 64)) c.causal = 2;
    const int w = (int)fz_int(f, 0, 7);
    c.window_left = w < 4 ? -1 : w == 4 ? 0 : w == 5 ? (int)fz_int(f, 1, 40) : w == 6 ? INT32_MAX : -2;
    static const float caps[] = {0.0f, 0.0f, 0.0f, 1e-3f, 1.0f, 30.0f, 1e8f, -1.0f, NAN};
    c.logits_soft_cap = FZ_PICK(f, caps);
    static const ak_dtype dtypes[] = {AK_F32, AK_F16, AK_BF16};
    c.q_dtype = FZ_PICK(f, dtypes);
    c.kv_dtype = fz_rare(f, 4) ? FZ_PICK(f, dtypes) : c.q_dtype;
    c.o_dtype = fz_rare(f, 3) ? FZ_PICK(f, dtypes) : c.q_dtype;
    if (fz_rare(f, 64)) c.kv_dtype = fz_rare(f, 2) ? AK_FP8_E4M3 : (ak_dtype)7;
    c.kv_storage = fz_rare(f, 4) ? AK_KV_RAGGED : AK_KV_PAGED;
    c.kv_layout = fz_rare(f, 2) ? AK_LAYOUT_HND : AK_LAYOUT_NHD;
    c.page_size = (int)fz_int(f, 1, MAX_PAGE);
    if (fz_rare(f, 64)) c.page_size = (int)fz_int(f, -2, 0);
    c.workload = fz_rare(f, 4) ? AK_WORKLOAD_DECODE : AK_WORKLOAD_ANY;
    /* MLA: one latent KV head, V the first head_dim_vo of each K row (now
     * and then two KV heads, a wider V, or a flag that is not 0 or 1) */
    if (fz_rare(f, 6)) {
        c.mla = fz_rare(f, 64) ? 2 : 1;
        if (!fz_rare(f, 32)) c.num_kv_heads = 1; /* every query head on the one latent head */
        if (c.head_dim_vo > c.head_dim_qk && !fz_rare(f, 32)) c.head_dim_vo = c.head_dim_qk;
    }
    return c;
}

static ak_limits fuzz_limits(fz *f)
{
    ak_limits l;
    ak_limits_init(&l);
    l.max_reqs = (int)fz_int(f, 1, MAX_REQS);
    l.max_tokens = (int)fz_int(f, 1, 128);
    l.max_blocks_per_req = (int)fz_int(f, 1, 40);
    l.num_cache_blocks = (int)fz_int(f, 1, MAX_CACHE_BLOCKS);
    l.max_splits = (int)fz_int(f, 0, 8);
    if (fz_rare(f, 64)) l.max_tokens = fz_rare(f, 2) ? 0 : AK_MAX_LEN + 1;
    if (fz_rare(f, 64)) l.max_splits = -1;
    return l;
}

/* A kv_len now and then at the edges of int32. Not AK_MAX_LEN itself on
 * ragged K/V, where plan() accepts it: cpu_ref's plan would allocate its
 * score row of 2^31 doubles (it may grow that row: attnkit.h), which the
 * fuzzer's malloc limit reports; paged plans reject it for want of blocks. */
static int32_t fuzz_kv_len(fz *f, int q_len, int paged)
{
    if (fz_rare(f, 48)) {
        static const int32_t edge[] = {-1, INT32_MAX, AK_MAX_LEN, AK_MAX_LEN + 1, INT32_MAX - 14};
        const int32_t x = FZ_PICK(f, edge);
        return x == AK_MAX_LEN && !paged ? AK_MAX_LEN + 1 : x;
    }
    switch (fz_int(f, 0, 2)) {
    case 0: return q_len;                                   /* prefill */
    case 1: return q_len + (int32_t)fz_int(f, 0, MAX_KV);   /* on a prefix */
    default: return (int32_t)fz_int(f, 0, MAX_KV);          /* anything */
    }
}

static void compare(const ak_attn_config *c, const side *cpu, const side *ref, int T, int with_lse)
{
    const int Hq = c->num_qo_heads, D = c->head_dim_vo;
    FZ_CHECK(gbuf_guards_ok(&cpu->o) && gbuf_guards_ok(&ref->o), "a write outside o");
    FZ_CHECK(!with_lse || (gbuf_guards_ok(&cpu->lse) && gbuf_guards_ok(&ref->lse)), "a write outside lse");
    const double tol = c->o_dtype == AK_F32 ? 5e-4 : c->o_dtype == AK_F16 ? 2e-3 : 1.6e-2;
    for (int64_t i = 0; i < (int64_t)T * Hq * D; i++) {
        const float a = ak_load_as_f32(gbuf_data(&cpu->o), c->o_dtype, i);
        const float b = ak_load_as_f32(gbuf_data(&ref->o), c->o_dtype, i);
        FZ_CHECK(isnan(a) == isnan(b), "o[%lld]: cpu %g, cpu_ref %g", (long long)i, a, b);
        FZ_CHECK(isnan(a) || fabs((double)a - b) <= tol, "o[%lld]: cpu %g, cpu_ref %g", (long long)i, a, b);
    }
    for (int64_t i = 0; with_lse && i < (int64_t)T * Hq; i++) {
        const float a = ((const float *)gbuf_data(&cpu->lse))[i], b = ((const float *)gbuf_data(&ref->lse))[i];
        FZ_CHECK(isnan(a) == isnan(b) && (a == -INFINITY) == (b == -INFINITY), "lse[%lld]: cpu %g, cpu_ref %g",
                 (long long)i, a, b);
        FZ_CHECK(isnan(a) || a == -INFINITY || fabs((double)a - b) <= 1e-3 + 1e-5 * fabs(b),
                 "lse[%lld]: cpu %g, cpu_ref %g", (long long)i, a, b);
    }
}

/* Runs both backends on the planned batch (skipped when cpu_ref would take
 * long): q, K and V from the input's seed, sometimes one argument made wrong
 * (both must reject it alike), then compare. */
static void run_both(fz *f, const ak_attn_config *cfg, const ak_limits *lim, side *cpu, side *ref, const int32_t *qo,
                     const int32_t *kvl, int n)
{
    const int paged = cfg->kv_storage == AK_KV_PAGED;
    int64_t work = 0, kv_rows = 0;
    for (int r = 0; r < n; r++) {
        work += (int64_t)(qo[r + 1] - qo[r]) * kvl[r] * cfg->num_qo_heads * (cfg->head_dim_qk + cfg->head_dim_vo);
        kv_rows += kvl[r];
    }
    if (work > RUN_BUDGET) return;
    const int T = qo[n];
    const int Hq = cfg->num_qo_heads, Hk = cfg->num_kv_heads, Dqk = cfg->head_dim_qk, Dvo = cfg->head_dim_vo;
    uint64_t rng = fz_u32(f, 4);
    const float scale = 1.0f + 2.0f * (float)fz_int(f, 0, 1); /* K magnitude: flat or peaked softmax */
    const size_t qes = ak_dtype_size(cfg->q_dtype), kes = ak_dtype_size(cfg->kv_dtype), oes = ak_dtype_size(cfg->o_dtype);

    /* q [T, Hq, Dqk]; K/V: a paged pool of num_cache_blocks (+ 0..2) blocks at
     * a block stride of 0 (packed) or a block plus padding, or ragged rows */
    const int64_t q_n = (int64_t)T * Hq * Dqk;
    void *q = malloc(qes * (size_t)(q_n + 1));
    rnd_fill(q, cfg->q_dtype, q_n, 1.0f, &rng);
    ak_paged_kv kv;
    memset(&kv, 0, sizeof kv);
    int64_t k_n, v_n;
    if (paged) {
        kv.num_blocks = lim->num_cache_blocks + (int)fz_int(f, 0, 2);
        kv.page_size = cfg->page_size;
        kv.num_kv_heads = Hk;
        kv.head_dim_qk = Dqk;
        kv.head_dim_vo = Dvo;
        kv.dtype = cfg->kv_dtype;
        kv.layout = cfg->kv_layout;
        kv.device = cfg->device;
        const int64_t kb = (int64_t)cfg->page_size * Hk * Dqk, vb = (int64_t)cfg->page_size * Hk * Dvo;
        kv.k_block_stride = fz_rare(f, 3) ? kb + fz_int(f, 0, 40) : 0;
        kv.v_block_stride = fz_rare(f, 3) ? vb + fz_int(f, 0, 40) : 0;
        k_n = (int64_t)kv.num_blocks * (kv.k_block_stride ? kv.k_block_stride : kb);
        v_n = (int64_t)kv.num_blocks * (kv.v_block_stride ? kv.v_block_stride : vb);
    } else {
        k_n = kv_rows * Hk * Dqk;
        v_n = kv_rows * Hk * Dvo;
    }
    void *kd = malloc(kes * (size_t)(k_n + 1)), *vd = malloc(kes * (size_t)(v_n + 1));
    rnd_fill(kd, cfg->kv_dtype, k_n, scale, &rng);
    rnd_fill(vd, cfg->kv_dtype, v_n, 1.0f, &rng);
    kv.k_data = kd;
    kv.v_data = vd;
    /* MLA reads V from the K rows: a K-only view, now and then a V pool anyway */
    const int k_only = cfg->mla && !fz_rare(f, 16);
    if (k_only) kv.v_data = NULL, kv.v_block_stride = fz_rare(f, 16) ? kv.v_block_stride : 0;
    /* now and then a NaN or an infinity somewhere in q, K or V */
    if (fz_rare(f, 4)) {
        static const float bad[] = {NAN, INFINITY, -INFINITY};
        const float x = FZ_PICK(f, bad);
        const int which = (int)fz_int(f, 0, 2);
        const int64_t len = which == 0 ? q_n : which == 1 ? k_n : v_n;
        if (len > 0)
            ak_store_from_f32(which == 0 ? q : which == 1 ? kd : vd, which == 0 ? cfg->q_dtype : cfg->kv_dtype,
                              (int64_t)(rnd_next(&rng) % (uint64_t)len), x);
    }

    ak_tensor qt = ak_tensor_3d(q, cfg->q_dtype, T, Hq, Dqk);
    ak_tensor kt = ak_tensor_3d(kd, cfg->kv_dtype, kv_rows, Hk, Dqk), vt = ak_tensor_3d(vd, cfg->kv_dtype, kv_rows, Hk, Dvo);
    const int with_lse = !fz_rare(f, 4);
    const int broken = (int)fz_int(f, 0, 40); /* < 4: one argument made wrong */
    side *sides[2] = {cpu, ref};
    ak_status r_st[2];
    for (int s = 0; s < 2; s++) {
        side *sd = sides[s];
        void *o = gbuf_alloc(&sd->o, oes * (size_t)T * Hq * Dvo);
        void *l = gbuf_alloc(&sd->lse, sizeof(float) * (size_t)T * Hq);
        memset(o, 0xff, sd->o.bytes);
        memset(l, 0xff, sd->lse.bytes);
        ak_tensor ot = ak_tensor_3d(o, cfg->o_dtype, T, Hq, Dvo), lt = ak_tensor_2d(l, AK_F32, T, Hq);
        ak_paged_kv kvs = kv;
        ak_tensor qs = qt;
        if (broken == 0) qs.shape[1] += 1;
        if (broken == 1) ot.stride[2] = 2;
        if (broken == 2) kvs.v_block_stride = -kvs.v_block_stride - 1;
        if (broken == 3) lt.dtype = AK_F16;
        ak_run_args a;
        ak_run_args_init(&a);
        a.q = &qs;
        a.o = &ot;
        a.lse = with_lse ? &lt : NULL;
        if (paged) a.kv = &kvs;
        else a.k = &kt, a.v = k_only ? NULL : &vt;
        r_st[s] = ak_backend_run(sd->b, &a, NULL);
    }
    FZ_CHECK(r_st[0] == r_st[1], "run: cpu %s, cpu_ref %s (%s)", ak_status_str(r_st[0]), ak_status_str(r_st[1]),
             ak_last_error());
    if (r_st[0] == AK_OK) compare(cfg, cpu, ref, T, with_lse);
    for (int sd = 0; sd < 2; sd++) {
        gbuf_free(&sides[sd]->o);
        gbuf_free(&sides[sd]->lse);
    }
    free(q);
    free(kd);
    free(vd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    const ak_attn_config cfg = fuzz_config(&f);
    const ak_limits lim = fuzz_limits(&f);
    char threads[4];
    snprintf(threads, sizeof threads, "%d", (int)fz_int(&f, 1, 4));
    setenv("AK_NUM_THREADS", threads, 1);
    setenv("AK_CPU_ISA", pick_isa(&f), 1);

    side cpu = {0}, ref = {0};
    const ak_status c_cpu = ak_backend_create(&cfg, &lim, "cpu", &cpu.b);
    const ak_status c_ref = ak_backend_create(&cfg, &lim, "cpu_ref", &ref.b);
    FZ_CHECK(c_cpu == c_ref, "create: cpu %s, cpu_ref %s (%s)", ak_status_str(c_cpu), ak_status_str(c_ref),
             ak_last_error());
    if (c_cpu != AK_OK) return 0;

    /* the batch */
    const int paged = cfg.kv_storage == AK_KV_PAGED;
    const int n = (int)fz_int(&f, 0, MAX_REQS);
    int32_t qo[MAX_REQS + 1], kvl[MAX_REQS], bt[MAX_REQS * 44];
    qo[0] = 0;
    int max_need = 1;
    for (int r = 0; r < n; r++) {
        const int q = fz_int(&f, 0, 3) ? (int)fz_int(&f, 0, 2) : (int)fz_int(&f, 0, MAX_Q);
        qo[r + 1] = qo[r] + q;
        kvl[r] = fuzz_kv_len(&f, q, paged);
        const int need = kvl[r] > 0 && paged ? (int)((kvl[r] - 1) / cfg.page_size + 1) : 0;
        if (need > max_need) max_need = need;
    }
    if (n > 0 && fz_rare(&f, 32)) qo[fz_int(&f, 0, n)] += (int32_t)fz_int(&f, -3, 3); /* qo[0] != 0, or not monotone */
    int stride = max_need < 40 ? max_need + (int)fz_int(&f, 0, 2) : 42;
    if (fz_rare(&f, 32)) stride = (int)fz_int(&f, 0, 2);
    for (int i = 0; i < n * stride && i < MAX_REQS * 44; i++) {
        bt[i] = (int32_t)fz_int(&f, 0, lim.num_cache_blocks - 1);
        if (fz_rare(&f, 256)) bt[i] = fz_rare(&f, 2) ? -1 : lim.num_cache_blocks;
    }
    ak_batch batch;
    ak_batch_init(&batch);
    batch.num_reqs = n;
    batch.qo_indptr = qo;
    batch.kv_lens = kvl;
    batch.block_table = paged ? bt : NULL;
    batch.block_table_stride = paged ? stride : 0;
    const ak_status p_cpu = ak_backend_plan(cpu.b, &batch, NULL);
    const ak_status p_ref = ak_backend_plan(ref.b, &batch, NULL);
    FZ_CHECK(p_cpu == p_ref, "plan: cpu %s, cpu_ref %s (%s)", ak_status_str(p_cpu), ak_status_str(p_ref),
             ak_last_error());

    if (p_cpu == AK_OK) run_both(&f, &cfg, &lim, &cpu, &ref, qo, kvl, n);
    else {
        /* a failed plan leaves no plan: run refuses before its arguments */
        ak_run_args a;
        ak_run_args_init(&a);
        FZ_CHECK(ak_backend_run(cpu.b, &a, NULL) == AK_ERR_NOT_PLANNED &&
                     ak_backend_run(ref.b, &a, NULL) == AK_ERR_NOT_PLANNED,
                 "run after a failed plan");
    }
    ak_backend_destroy(cpu.b);
    ak_backend_destroy(ref.b);
    return 0;
}
