/*
 * test_props.c - properties every backend must keep, checked on the backend
 * itself: chunked prefill equals one-shot prefill; merging any split of the
 * KV equals the whole; page size and layout do not change results; with
 * cfg.batch_invariant, a request's output bits do not depend on its batch.
 */
#include "harness.h"

#include "dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Downloads a [n] buffer of dtype t on dev as f32. */
static void fetch_f32(ak_device dev, const void *src, ak_dtype t, int64_t n, float *out)
{
    const size_t esz = ak_dtype_size(t);
    void *h = malloc(esz * (size_t)(n + 1));
    dev_copy_from(dev, h, src, esz * (size_t)n);
    for (int64_t i = 0; i < n; i++) out[i] = ak_load_as_f32(h, t, i);
    free(h);
}

/* ---- chunked prefill == one-shot ---------------------------------------- */

/* Two prompts written chunk by chunk through ak_kv_update (at the backend's
 * planned slot mapping), attended chunk by chunk; then the whole prompts at
 * once over the same cache. Both use the backend under test. */
static void prop_chunked(test_ctx *t, const char *name, ak_dtype dt)
{
    char tname[96];
    snprintf(tname, sizeof tname, "chunked prefill == one-shot %s", ak_dtype_name(dt));
    if (!t_selected(t, tname) || !t_storage_selected(t, AK_KV_PAGED)) return;
    enum { R = 2, STEPS = 3 };
    static const int chunks[R][STEPS] = {{100, 117, 83}, {1, 149, 30}};
    const int L[R] = {300, 180};
    attn_case tc;
    memset(&tc, 0, sizeof tc);
    tc.name = tname;
    tc.num_qo_heads = 8;
    tc.num_kv_heads = 2;
    tc.head_dim_qk = tc.head_dim_vo = 128;
    tc.dtype = dt;
    tc.causal = 1;
    tc.window_left = -1;
    tc.page_size = 16;
    tc.layout = AK_LAYOUT_NHD;
    tc.storage = AK_KV_PAGED;
    tc.num_reqs = R;
    for (int r = 0; r < R; r++) tc.reqs[r] = (req_spec){L[r], L[r]};

    uint64_t rng = t->seed ^ scn_name_hash(tname);
    scene sc;
    if (scene_build(&sc, &tc, t->device, &rng)) {
        t_fail(t, name, tname, "cannot build the scene");
        return;
    }
    ak_backend *b = NULL;
    ak_status st = ak_backend_create(&sc.cfg, &sc.lim, name, &b);
    if (st == AK_ERR_UNSUPPORTED) {
        t_skip(t, name, tname, "unsupported");
        scene_free(&sc);
        return;
    }
    if (st != AK_OK) {
        t_fail(t, name, tname, "create: %s", ak_last_error());
        scene_free(&sc);
        return;
    }
    const int Hq = 8, Hk = 2, D = 128, T = L[0] + L[1];
    const size_t esz = ak_dtype_size(dt);
    /* the prompts' K/V rows in token order, on the device */
    tbuf kb, vb, ob;
    tbuf_alloc(&kb, t->device, esz * (size_t)T * Hk * D);
    tbuf_alloc(&vb, t->device, esz * (size_t)T * Hk * D);
    tbuf_alloc(&ob, t->device, esz * (size_t)T * Hq * D);
    /* step s holds, for each request, rows [done_r, done_r + chunk) */
    float *chunk_o = malloc(sizeof(float) * (size_t)T * Hq * D);
    float *whole_o = malloc(sizeof(float) * (size_t)T * Hq * D);
    int done[R] = {0, 0};
    int32_t qo[R + 1], kvl[R];
    ak_batch batch = sc.b.batch;
    batch.qo_indptr = qo;
    batch.kv_lens = kvl;
    for (int s = 0; s < STEPS && st == AK_OK; s++) {
        /* gather this step's new rows (request-major) */
        qo[0] = 0;
        for (int r = 0; r < R; r++) {
            qo[r + 1] = qo[r] + chunks[r][s];
            kvl[r] = done[r] + chunks[r][s];
        }
        const int n = qo[R];
        char *kh = tbuf_host(&kb), *vh = tbuf_host(&vb), *qh = malloc(esz * (size_t)n * Hq * D + 1);
        for (int r = 0; r < R; r++)
            for (int i = 0; i < chunks[r][s]; i++) {
                const int j = done[r] + i, row = qo[r] + i;
                for (int e = 0; e < Hk * D; e++) {
                    ak_store_from_f32(kh, dt, (int64_t)row * Hk * D + e, sc.k[r][(int64_t)j * Hk * D + e]);
                    ak_store_from_f32(vh, dt, (int64_t)row * Hk * D + e, sc.v[r][(int64_t)j * Hk * D + e]);
                }
                const int tok = sc.b.qo_indptr[r] + j;
                for (int e = 0; e < Hq * D; e++)
                    ak_store_from_f32(qh, dt, (int64_t)row * Hq * D + e, sc.q[(int64_t)tok * Hq * D + e]);
            }
        tbuf_upload(&kb);
        tbuf_upload(&vb);
        tbuf qb;
        tbuf_alloc(&qb, t->device, esz * (size_t)n * Hq * D + 1);
        memcpy(tbuf_host(&qb), qh, esz * (size_t)n * Hq * D);
        tbuf_upload(&qb);
        free(qh);

        st = ak_backend_plan(b, &batch, NULL);
        if (st != AK_OK) break;
        ak_tensor kt = ak_tensor_3d(tbuf_data(&kb), dt, n, Hk, D), vt = ak_tensor_3d(tbuf_data(&vb), dt, n, Hk, D);
        if (!ak_backend_forward_includes_kv_update(b))
            st = ak_kv_update(&sc.kv, &kt, &vt, ak_backend_slot_mapping(b), n, NULL);
        ak_tensor qt = ak_tensor_3d(tbuf_data(&qb), dt, n, Hq, D), ot = ak_tensor_3d(tbuf_data(&ob), dt, n, Hq, D);
        ak_run_args a;
        ak_run_args_init(&a);
        a.q = &qt;
        a.kv = &sc.kv;
        a.o = &ot;
        if (st == AK_OK) st = ak_backend_run(b, &a, NULL);
        dev_sync(t->device);
        float *step_o = malloc(sizeof(float) * (size_t)n * Hq * D);
        fetch_f32(t->device, tbuf_data(&ob), dt, (int64_t)n * Hq * D, step_o);
        for (int r = 0; r < R; r++)
            memcpy(chunk_o + (int64_t)(sc.b.qo_indptr[r] + done[r]) * Hq * D, step_o + (int64_t)qo[r] * Hq * D,
                   sizeof(float) * (size_t)chunks[r][s] * Hq * D);
        free(step_o);
        tbuf_free(&qb);
        for (int r = 0; r < R; r++) done[r] += chunks[r][s];
    }
    if (st == AK_OK) {
        /* one shot over the cache the chunks wrote */
        st = ak_backend_plan(b, &sc.b.batch, NULL);
        ak_tensor qt = ak_tensor_3d(tbuf_data(&sc.q_buf), dt, T, Hq, D), ot = ak_tensor_3d(tbuf_data(&ob), dt, T, Hq, D);
        qt.stride[1] = D + 8; /* the scene pads q rows */
        qt.stride[0] = (int64_t)Hq * (D + 8);
        ak_run_args a;
        ak_run_args_init(&a);
        a.q = &qt;
        a.kv = &sc.kv;
        a.o = &ot;
        if (st == AK_OK) st = ak_backend_run(b, &a, NULL);
        dev_sync(t->device);
        fetch_f32(t->device, tbuf_data(&ob), dt, (int64_t)T * Hq * D, whole_o);
    }
    if (st != AK_OK) {
        t_fail(t, name, tname, "status %s: %s", ak_status_str(st), ak_last_error());
    } else {
        double *wd = malloc(sizeof(double) * (size_t)T * Hq * D);
        int nan = 0;
        for (int64_t i = 0; i < (int64_t)T * Hq * D; i++) {
            wd[i] = whole_o[i];
            nan |= isnan(chunk_o[i]) || isnan(whole_o[i]);
        }
        const double e = rel_err_f(chunk_o, wd, (int64_t)T * Hq * D);
        if (!nan && e <= tolerance(dt))
            t_pass(t, name, tname, "rel err %.2e", e);
        else
            t_fail(t, name, tname, "rel err %.2e (tol %.0e)%s", e, tolerance(dt), nan ? ", NaN" : "");
        free(wd);
    }
    free(chunk_o);
    free(whole_o);
    tbuf_free(&kb);
    tbuf_free(&vb);
    tbuf_free(&ob);
    ak_backend_destroy(b);
    scene_free(&sc);
}

/* ---- merge of any split == the whole ------------------------------------- */

/* One decode query over kv_len keys, and the same query over `parts` page-
 * aligned slices of the same blocks (one request per slice, q read through a
 * token stride of 0); ak_merge_states of the slices must equal the whole. */
static void prop_merge(test_ctx *t, const char *name, int parts)
{
    char tname[96];
    snprintf(tname, sizeof tname, "merge of %d KV parts == whole", parts);
    if (!t_selected(t, tname) || !t_storage_selected(t, AK_KV_PAGED)) return;
    const int P = 16, L = 37 * P + 5, Hq = 8, Hk = 2, D = 64;
    attn_case tc;
    memset(&tc, 0, sizeof tc);
    tc.name = tname;
    tc.num_qo_heads = Hq;
    tc.num_kv_heads = Hk;
    tc.head_dim_qk = tc.head_dim_vo = D;
    tc.dtype = AK_F16;
    tc.causal = 1;
    tc.window_left = -1;
    tc.page_size = P;
    tc.layout = AK_LAYOUT_NHD;
    tc.storage = AK_KV_PAGED;
    tc.num_reqs = 1;
    tc.reqs[0] = (req_spec){1, L};
    uint64_t rng = t->seed ^ scn_name_hash(tname);
    scene sc;
    if (scene_build(&sc, &tc, t->device, &rng)) {
        t_fail(t, name, tname, "cannot build the scene");
        return;
    }
    /* random page-aligned cut points */
    int cuts[17];
    const int nblk = (L + P - 1) / P;
    cuts[0] = 0;
    for (int i = 1; i < parts; i++) cuts[i] = cuts[i - 1] + scn_rng_int(&rng, 1, (nblk - cuts[i - 1]) - (parts - i));
    cuts[parts] = nblk;
    int32_t qo[18], kvl[17], *bt = malloc(sizeof(int32_t) * (size_t)parts * nblk);
    for (int i = 0; i < parts; i++) {
        qo[i] = i;
        kvl[i] = (i == parts - 1 ? L : cuts[i + 1] * P) - cuts[i] * P;
        for (int j = 0; j < nblk; j++) bt[i * nblk + j] = j < cuts[i + 1] - cuts[i] ? sc.b.block_table[cuts[i] + j] : 0;
    }
    qo[parts] = parts;
    ak_batch pb = sc.b.batch;
    pb.num_reqs = parts;
    pb.qo_indptr = qo;
    pb.kv_lens = kvl;
    pb.block_table = bt;
    pb.block_table_stride = nblk;
    ak_limits lim = sc.lim;
    lim.max_reqs = lim.max_tokens = parts;

    ak_backend *b = NULL;
    ak_status st = ak_backend_create(&sc.cfg, &lim, name, &b);
    if (st == AK_ERR_UNSUPPORTED) {
        t_skip(t, name, tname, "unsupported");
        free(bt);
        scene_free(&sc);
        return;
    }
    tbuf ob, lb;
    tbuf_alloc(&ob, t->device, 2 * (size_t)parts * Hq * D);
    tbuf_alloc(&lb, t->device, 4 * (size_t)parts * Hq);
    tbuf_poison(&ob);
    tbuf_poison(&lb);
    ak_tensor qt = ak_tensor_3d(tbuf_data(&sc.q_buf), AK_F16, parts, Hq, D);
    qt.stride[0] = 0; /* every part asks the same query */
    qt.stride[1] = D + 8;
    ak_tensor ot = ak_tensor_3d(tbuf_data(&ob), AK_F16, parts, Hq, D), lt = ak_tensor_2d(tbuf_data(&lb), AK_F32, parts, Hq);
    ak_run_args a;
    ak_run_args_init(&a);
    a.q = &qt;
    a.kv = &sc.kv;
    a.o = &ot;
    a.lse = &lt;
    if (st == AK_OK) st = ak_backend_plan(b, &pb, NULL);
    if (st == AK_OK) st = ak_backend_run(b, &a, NULL);
    dev_sync(t->device);
    if (st != AK_OK) {
        t_fail(t, name, tname, "status %s: %s", ak_status_str(st), ak_last_error());
    } else {
        float *po = malloc(sizeof(float) * (size_t)parts * Hq * D), *pl = malloc(sizeof(float) * (size_t)parts * Hq);
        fetch_f32(t->device, tbuf_data(&ob), AK_F16, (int64_t)parts * Hq * D, po);
        fetch_f32(t->device, tbuf_data(&lb), AK_F32, (int64_t)parts * Hq, pl);
        /* merge on the host: v [1, parts, Hq, D], s [1, parts, Hq] */
        float mo[8 * 64], ml[8];
        ak_tensor v = ak_tensor_4d(po, AK_F32, 1, parts, Hq, D), s = ak_tensor_3d(pl, AK_F32, 1, parts, Hq);
        ak_tensor vo = ak_tensor_3d(mo, AK_F32, 1, Hq, D), so = ak_tensor_2d(ml, AK_F32, 1, Hq);
        const ak_device cpu = {AK_DEVICE_CPU, 0};
        st = ak_merge_states(&v, &s, &vo, &so, cpu, NULL);
        /* the whole, from the dense formula */
        double wo[8 * 64], wl[8];
        dense_attention(&sc, wo, wl);
        const double e = rel_err_f(mo, wo, Hq * D), le = max_lse_err(ml, wl, Hq);
        if (st == AK_OK && e <= tolerance(AK_F16) && le <= 2e-3)
            t_pass(t, name, tname, "rel err %.2e, lse err %.2e", e, le);
        else
            t_fail(t, name, tname, "merge status %s, rel err %.2e, lse err %.2e", ak_status_str(st), e, le);
        free(po);
        free(pl);
    }
    tbuf_free(&ob);
    tbuf_free(&lb);
    free(bt);
    ak_backend_destroy(b);
    scene_free(&sc);
}

/* ---- page size and layout do not change results --------------------------- */

static void prop_layout(test_ctx *t, const char *name, int decode_only)
{
    const char *tname = decode_only ? "page size and layout invariance (decode)" : "page size and layout invariance";
    if (!t_selected(t, tname) || !t_storage_selected(t, AK_KV_PAGED)) return;
    static const int pages[] = {1, 16, 64};
    attn_case tc;
    memset(&tc, 0, sizeof tc);
    tc.name = tname;
    tc.num_qo_heads = 8;
    tc.num_kv_heads = 2;
    tc.head_dim_qk = tc.head_dim_vo = 128;
    /* f32 where the backend has it (the CPU); bf16 on the GPU */
    const int cpu = t->device.kind == AK_DEVICE_CPU;
    tc.dtype = cpu ? AK_F32 : AK_BF16;
    const double tol = cpu ? 1e-5 : tolerance(AK_BF16) / 4;
    tc.causal = 1;
    tc.window_left = -1;
    tc.storage = AK_KV_PAGED;
    tc.num_reqs = 3;
    tc.reqs[0] = (req_spec){1, 200};
    tc.reqs[1] = decode_only ? (req_spec){1, 30} : (req_spec){30, 30};
    tc.reqs[2] = decode_only ? (req_spec){1, 1300} : (req_spec){7, 130};
    const int64_t n = (int64_t)(tc.reqs[0].q_len + tc.reqs[1].q_len + tc.reqs[2].q_len) * 8 * 128;
    float *first = malloc(sizeof(float) * (size_t)n), *o = malloc(sizeof(float) * (size_t)n);
    float l[38 * 8];
    double *fd = malloc(sizeof(double) * (size_t)n);
    char bad[256];
    int variants = 0;
    double worst = 0;
    for (int p = 0; p < 3; p++)
        for (int lay = 0; lay < 2; lay++) {
            tc.page_size = pages[p];
            tc.layout = lay ? AK_LAYOUT_HND : AK_LAYOUT_NHD;
            uint64_t rng = t->seed ^ scn_name_hash(tname); /* same logical data every time */
            scene sc;
            if (scene_build(&sc, &tc, t->device, &rng)) continue;
            const ak_status st = scene_run(&sc, name, variants ? o : first, l, bad, sizeof bad);
            scene_free(&sc);
            if (st == AK_ERR_UNSUPPORTED) continue;
            if (st != AK_OK || bad[0]) {
                t_fail(t, name, tname, "page %d %s: %s %s", pages[p], lay ? "HND" : "NHD",
                       ak_status_str(st), bad[0] ? bad : ak_last_error());
                goto out;
            }
            if (variants++ == 0) {
                for (int64_t i = 0; i < n; i++) fd[i] = first[i];
                continue;
            }
            const double e = rel_err_f(o, fd, n);
            if (e > worst) worst = e;
        }
    if (variants < 2)
        t_skip(t, name, tname, "fewer than two supported variants");
    else if (worst <= tol)
        t_pass(t, name, tname, "%d variants, worst rel diff %.2e", variants, worst);
    else
        t_fail(t, name, tname, "%d variants, worst rel diff %.2e", variants, worst);
out:
    free(first);
    free(o);
    free(fd);
}

/* ---- batch invariance -------------------------------------------------------- */

/* Runs requests sel[0, n) of the scene as one batch on b (same cache, their
 * block-table rows, their q rows); o_bytes gets each query row's raw output
 * (token-major, in the order of sel). */
static ak_status run_subset(ak_backend *b, const scene *sc, const int *sel, int n, unsigned char *o_bytes)
{
    const ak_attn_config *c = &sc->cfg;
    const int Hq = c->num_qo_heads, D = c->head_dim_qk, Dv = c->head_dim_vo, stride = sc->b.bt_stride;
    const size_t esz = ak_dtype_size(c->q_dtype), oesz = ak_dtype_size(c->o_dtype);
    int32_t qo[MAX_REQS + 1], kvl[MAX_REQS];
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)n * stride + 4);
    qo[0] = 0;
    for (int i = 0; i < n; i++) {
        const int r = sel[i];
        qo[i + 1] = qo[i] + sc->tc.reqs[r].q_len;
        kvl[i] = sc->tc.reqs[r].kv_len;
        memcpy(bt + (size_t)i * stride, sc->b.block_table + (size_t)r * stride, sizeof(int32_t) * stride);
    }
    const int T = qo[n];
    tbuf qb, ob;
    tbuf_alloc(&qb, c->device, esz * (size_t)T * Hq * D + 1);
    tbuf_alloc(&ob, c->device, oesz * (size_t)T * Hq * Dv + 1);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < sc->tc.reqs[sel[i]].q_len; j++) {
            const int64_t src = (int64_t)(sc->b.qo_indptr[sel[i]] + j) * Hq * D, dst = (int64_t)(qo[i] + j) * Hq * D;
            for (int e = 0; e < Hq * D; e++) ak_store_from_f32(tbuf_host(&qb), c->q_dtype, dst + e, sc->q[src + e]);
        }
    tbuf_upload(&qb);
    tbuf_poison(&ob);
    ak_batch batch = sc->b.batch;
    batch.num_reqs = n;
    batch.qo_indptr = qo;
    batch.kv_lens = kvl;
    batch.block_table = bt;
    ak_tensor qt = ak_tensor_3d(tbuf_data(&qb), c->q_dtype, T, Hq, D);
    ak_tensor ot = ak_tensor_3d(tbuf_data(&ob), c->o_dtype, T, Hq, Dv);
    ak_tensor sk = ak_tensor_1d(sc->sinks ? tbuf_data(&sc->sinks_buf) : NULL, AK_F32, Hq);
    ak_run_args a;
    ak_run_args_init(&a);
    a.q = &qt;
    a.kv = &sc->kv;
    a.o = &ot;
    if (sc->sinks) a.sinks = &sk;
    ak_status st = ak_backend_plan(b, &batch, NULL);
    if (st == AK_OK) st = ak_backend_run(b, &a, NULL);
    dev_sync(c->device);
    tbuf_download(&ob);
    memcpy(o_bytes, tbuf_host(&ob), oesz * (size_t)T * Hq * Dv);
    tbuf_free(&qb);
    tbuf_free(&ob);
    free(bt);
    return st;
}

/* Each request run alone, then inside random batches of the others (random
 * order and size): with cfg.batch_invariant its rows must be bitwise equal.
 * The requests span what changes a plan: a long decode (split), short
 * decodes, a chunk on a long prefix, a verification, a prompt. mla: the
 * same over an MLA cache (16 heads, 576/512), where a request's tokens may
 * share an item (up to 4 on cuda_mla's wgmma kernel); not on cpu_ref, which
 * splits nothing and would take minutes under the sanitizers. */
static void prop_batch_invariant(test_ctx *t, const char *name, int mla)
{
    const char *tname = mla ? "batch invariance (bitwise), mla 576/512 h16" : "batch invariance (bitwise)";
    if (!t_selected(t, tname) || !t_storage_selected(t, AK_KV_PAGED)) return;
    if (mla && !strcmp(name, "cpu_ref")) return;
    enum { R = 7, BATCHES = 6 };
    static const req_spec gqa_reqs[R] = {{1, 5000}, {1, 50}, {40, 1500}, {4, 2100}, {17, 17}, {1, 700}, {1, 3}};
    static const req_spec mla_reqs[R] = {{1, 5000}, {1, 50}, {4, 1500}, {3, 2100}, {8, 300}, {1, 700}, {2, 3}};
    const req_spec *reqs = mla ? mla_reqs : gqa_reqs;
    attn_case tc;
    memset(&tc, 0, sizeof tc);
    tc.name = tname;
    tc.num_qo_heads = 16;
    tc.num_kv_heads = mla ? 1 : 4;
    tc.head_dim_qk = mla ? 576 : 128;
    tc.head_dim_vo = mla ? 512 : 128;
    tc.mla = mla;
    tc.dtype = AK_BF16;
    tc.sinks = 1;
    tc.causal = 1;
    tc.window_left = -1;
    tc.page_size = mla ? 64 : 16;
    tc.layout = AK_LAYOUT_NHD;
    tc.storage = AK_KV_PAGED;
    tc.num_reqs = R;
    memcpy(tc.reqs, reqs, sizeof(req_spec) * R);
    uint64_t rng = t->seed ^ scn_name_hash(tname);
    scene sc;
    if (scene_build(&sc, &tc, t->device, &rng)) {
        t_fail(t, name, tname, "cannot build the scene");
        return;
    }
    sc.cfg.batch_invariant = 1;
    sc.cfg.workload = AK_WORKLOAD_ANY;
    ak_backend *b = NULL;
    ak_status st = ak_backend_create(&sc.cfg, &sc.lim, name, &b);
    if (st != AK_OK) {
        if (st == AK_ERR_UNSUPPORTED) t_skip(t, name, tname, "unsupported");
        else t_fail(t, name, tname, "create: %s", ak_last_error());
        scene_free(&sc);
        return;
    }
    const size_t row = ak_dtype_size(sc.cfg.o_dtype) * (size_t)tc.num_qo_heads * tc.head_dim_vo;
    unsigned char *alone[R], *got = malloc(row * (size_t)sc.b.num_tokens + 1);
    int ok = 1, compared = 0;
    char why[160] = "";
    for (int r = 0; r < R; r++) {
        alone[r] = malloc(row * (size_t)reqs[r].q_len + 1);
        if (st == AK_OK) st = run_subset(b, &sc, &r, 1, alone[r]);
    }
    for (int k = 0; k < BATCHES && st == AK_OK && ok; k++) {
        int sel[R];
        for (int r = 0; r < R; r++) sel[r] = r;
        scn_shuffle_i32(&rng, sel, R);
        const int n = scn_rng_int(&rng, 2, R);
        st = run_subset(b, &sc, sel, n, got);
        size_t at = 0;
        for (int i = 0; i < n && st == AK_OK && ok; i++) {
            const size_t bytes = row * (size_t)reqs[sel[i]].q_len;
            if (memcmp(got + at, alone[sel[i]], bytes)) {
                snprintf(why, sizeof why, "batch %d: request %d (q_len %d, kv_len %d) differs from its run alone", k,
                         sel[i], reqs[sel[i]].q_len, reqs[sel[i]].kv_len);
                ok = 0;
            }
            at += bytes;
            compared++;
        }
    }
    if (st != AK_OK)
        t_fail(t, name, tname, "status %s: %s", ak_status_str(st), ak_last_error());
    else if (!ok)
        t_fail(t, name, tname, "%s", why);
    else
        t_pass(t, name, tname, "%d requests in %d random batches, bitwise equal to each alone", compared, BATCHES);
    for (int r = 0; r < R; r++) free(alone[r]);
    free(got);
    ak_backend_destroy(b);
    scene_free(&sc);
}

void test_props(test_ctx *t)
{
    const char *names[16];
    const int nb = t_backends(t, names, 16);
    for (int i = 0; i < nb; i++) {
        prop_chunked(t, names[i], AK_F16);
        prop_chunked(t, names[i], AK_BF16);
        for (int parts = 1; parts <= 5; parts++) prop_merge(t, names[i], parts);
        prop_merge(t, names[i], 12);
        prop_layout(t, names[i], 0);
        prop_layout(t, names[i], 1);
        prop_batch_invariant(t, names[i], 0);
        prop_batch_invariant(t, names[i], 1);
    }
}
