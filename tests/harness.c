/*
 * harness.c - results, random inputs, guarded buffers on either device, the
 * test scene and the dense oracle. See harness.h.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "harness.h"

#include "dtype.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- results ----------------------------------------------------------- */

static void report(const char *tag, const char *backend, const char *name, const char *fmt, va_list ap)
{
    printf("%-4s %-12s %-44s ", tag, backend ? backend : "-", name);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
}

void t_pass(test_ctx *t, const char *backend, const char *name, const char *fmt, ...)
{
    t->passed++;
    if (!t->verbose) return;
    va_list ap;
    va_start(ap, fmt);
    report("PASS", backend, name, fmt, ap);
    va_end(ap);
}

void t_fail(test_ctx *t, const char *backend, const char *name, const char *fmt, ...)
{
    t->failed++;
    va_list ap;
    va_start(ap, fmt);
    report("FAIL", backend, name, fmt, ap);
    va_end(ap);
}

void t_skip(test_ctx *t, const char *backend, const char *name, const char *fmt, ...)
{
    t->skipped++;
    if (!t->verbose) return;
    va_list ap;
    va_start(ap, fmt);
    report("SKIP", backend, name, fmt, ap);
    va_end(ap);
}

int t_selected(const test_ctx *t, const char *name)
{
    if (t->shards > 1 && scn_name_hash(name) % (uint64_t)t->shards != (uint64_t)t->shard) return 0;
    for (int i = 0; i < t->num_skip; i++)
        if (strstr(name, t->skip[i])) return 0;
    return !t->filter || strstr(name, t->filter) != NULL;
}

int t_storage_selected(const test_ctx *t, ak_kv_storage s) { return t->storage < 0 || (int)s == t->storage; }

void t_with_env(const char *var, const char *value, void (*fn)(void *), void *arg)
{
    const char *old = getenv(var);
    char saved[64] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    if (value) setenv(var, value, 1);
    else unsetenv(var);
    fn(arg);
    if (old) setenv(var, saved, 1);
    else unsetenv(var);
}

int t_backends(const test_ctx *t, const char **names, int cap)
{
    int n = 0;
    for (int i = 0; i < ak_backend_count() && n < cap; i++) {
        const char *nm = ak_backend_name_at(i);
        const int is_cuda = strncmp(nm, "cuda", 4) == 0;
        if (is_cuda != (t->device.kind == AK_DEVICE_CUDA)) continue;
        if (t->backend && strcmp(t->backend, nm) != 0) continue;
        names[n++] = nm;
    }
    return n;
}

/* ---- device memory ----------------------------------------------------- */

/* A failed copy or sync means the device (or an earlier kernel) faulted:
 * nothing after it can be trusted, so the run stops here. */
void dev_copy_to(ak_device dev, void *dst, const void *src, size_t bytes)
{
    if (scn_upload(dev, NULL, dst, src, bytes)) {
        fprintf(stderr, "upload of %zu bytes failed: %s\n", bytes, scn_last_device_error());
        abort();
    }
}

void dev_copy_from(ak_device dev, void *dst, const void *src, size_t bytes)
{
    if (scn_download(dev, NULL, dst, src, bytes)) {
        fprintf(stderr, "download of %zu bytes failed: %s\n", bytes, scn_last_device_error());
        abort();
    }
}

void dev_sync(ak_device dev)
{
    if (scn_sync(dev)) {
        fprintf(stderr, "device error after sync: %s\n", scn_last_device_error());
        abort();
    }
}

int tbuf_alloc(tbuf *b, ak_device dev, size_t bytes)
{
    memset(b, 0, sizeof *b);
    b->dev = dev;
    b->bytes = bytes;
    b->host = malloc(bytes + 2 * GUARD_BYTES);
    b->raw = scn_alloc(dev, bytes + 2 * GUARD_BYTES);
    if (!b->host || !b->raw) {
        tbuf_free(b);
        return -1;
    }
    memset(b->host, GUARD_BYTE, bytes + 2 * GUARD_BYTES);
    return 0;
}

void tbuf_free(tbuf *b)
{
    free(b->host);
    scn_free(b->dev, b->raw);
    memset(b, 0, sizeof *b);
}

void *tbuf_data(const tbuf *b) { return b->raw + GUARD_BYTES; }
void *tbuf_host(const tbuf *b) { return b->host + GUARD_BYTES; }
void tbuf_upload(tbuf *b) { dev_copy_to(b->dev, b->raw, b->host, b->bytes + 2 * GUARD_BYTES); }
void tbuf_download(tbuf *b) { dev_copy_from(b->dev, b->host, b->raw, b->bytes + 2 * GUARD_BYTES); }

void tbuf_poison(tbuf *b)
{
    memset(b->host, GUARD_BYTE, GUARD_BYTES);
    memset(b->host + GUARD_BYTES, POISON_BYTE, b->bytes);
    memset(b->host + GUARD_BYTES + b->bytes, GUARD_BYTE, GUARD_BYTES);
    tbuf_upload(b);
}

int tbuf_guards_ok(const tbuf *b)
{
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (b->host[i] != GUARD_BYTE || b->host[GUARD_BYTES + b->bytes + i] != GUARD_BYTE) return 0;
    return 1;
}

/* ---- the scene --------------------------------------------------------- */

ak_attn_config case_config(const attn_case *tc, ak_device dev)
{
    ak_attn_config c;
    ak_attn_config_init(&c);
    c.num_qo_heads = tc->num_qo_heads;
    c.num_kv_heads = tc->num_kv_heads;
    c.head_dim_qk = tc->head_dim_qk;
    c.head_dim_vo = tc->head_dim_vo;
    c.causal = tc->causal;
    c.window_left = tc->window_left;
    c.logits_soft_cap = tc->soft_cap;
    c.q_dtype = c.kv_dtype = tc->dtype;
    if (tc->kv_fp8) c.kv_dtype = AK_FP8_E4M3;
    c.o_dtype = tc->o_f32 ? AK_F32 : tc->dtype;
    c.use_sinks = tc->sinks;
    c.device = dev;
    c.kv_storage = tc->storage;
    c.kv_layout = tc->layout;
    c.page_size = tc->page_size;
    c.mla = tc->mla;
    if (tc->logit_scale > 0.0f) c.sm_scale = tc->logit_scale / sqrtf((float)tc->head_dim_qk);
    /* an all-decode batch is planned on a decode instance, as an engine would */
    int decode = tc->num_reqs > 0;
    for (int r = 0; r < tc->num_reqs; r++) decode &= tc->reqs[r].q_len <= 1;
    c.workload = decode ? AK_WORKLOAD_DECODE : AK_WORKLOAD_ANY;
    return c;
}

/* Padding (elements) added to each head row of q and o, so that strides are
 * exercised and a write past a row lands in checked poison. */
#define ROW_PAD 8
#define LSE_PAD 3

static float round_to(ak_dtype t, float x)
{
    if (t == AK_F16) return ak_f16_to_f32(ak_f32_to_f16(x));
    if (t == AK_BF16) return ak_bf16_to_f32(ak_f32_to_bf16(x));
    return x;
}

/* Fills n elements of dtype t at dst from f32 src (or random if src NULL). */
static void store_row(void *dst, ak_dtype t, const float *src, int n, uint64_t *rng)
{
    for (int i = 0; i < n; i++) ak_store_from_f32(dst, t, i, src ? src[i] : scn_uniform(rng));
}

/* A K (is_v 0) or V row of KV head h into a pool or ragged buffer: fp8
 * codes under the head's scale (exact for the logical values, which are
 * dequantized codes), else the dtype. */
static void store_kv_row(const scene *sc, void *dst, int is_v, int h, const float *src, int n, uint64_t *rng)
{
    if (sc->cfg.kv_dtype != AK_FP8_E4M3) {
        store_row(dst, sc->cfg.kv_dtype, src, n, rng);
        return;
    }
    const float scale = is_v ? sc->v_scale[h] : sc->k_scale[h];
    for (int i = 0; i < n; i++) ((uint8_t *)dst)[i] = ak_e4m3_quantize(src ? src[i] : scn_uniform(rng), scale);
}

/* The value x of KV head h becomes in the cache: rounded to the dtype, or
 * quantized to fp8 under the head's scale and dequantized. */
static float kv_value(const scene *sc, int is_v, int h, float x)
{
    if (sc->cfg.kv_dtype != AK_FP8_E4M3) return round_to(sc->cfg.kv_dtype, x);
    const float scale = is_v ? sc->v_scale[h] : sc->k_scale[h];
    return ak_e4m3_to_f32(ak_e4m3_quantize(x, scale)) * scale;
}

/* fp8: each KV head's scales (1 without scales; per layer one for every
 * head), chosen so that K (|x| < 2) and V (|x| < 1) land below 200, spread
 * over the normal range, and their copies on the device. */
static int scene_scales(scene *sc, ak_device dev, uint64_t *rng)
{
    const attn_case *tc = &sc->tc;
    const int Hk = tc->num_kv_heads;
    for (int h = 0; h < Hk; h++) sc->k_scale[h] = sc->v_scale[h] = 1.0f;
    if (!tc->kv_fp8 || tc->kv_scale == AK_KV_SCALE_NONE) return 0;
    const int n = tc->kv_scale == AK_KV_SCALE_PER_HEAD ? Hk : 1;
    for (int h = 0; h < n; h++) {
        sc->k_scale[h] = 0.02f + 0.01f * scn_uniform(rng);
        sc->v_scale[h] = 0.01f + 0.005f * scn_uniform(rng);
    }
    for (int h = n; h < Hk; h++) {
        sc->k_scale[h] = sc->k_scale[0];
        sc->v_scale[h] = sc->v_scale[0];
    }
    if (tbuf_alloc(&sc->k_scale_buf, dev, sizeof(float) * (size_t)n) ||
        tbuf_alloc(&sc->v_scale_buf, dev, sizeof(float) * (size_t)n))
        return -1;
    memcpy(tbuf_host(&sc->k_scale_buf), sc->k_scale, sizeof(float) * (size_t)n);
    memcpy(tbuf_host(&sc->v_scale_buf), sc->v_scale, sizeof(float) * (size_t)n);
    tbuf_upload(&sc->k_scale_buf);
    tbuf_upload(&sc->v_scale_buf);
    return 0;
}

int scene_build(scene *sc, const attn_case *tc, ak_device dev, uint64_t *rng)
{
    memset(sc, 0, sizeof *sc);
    sc->tc = *tc;
    sc->cfg = case_config(tc, dev);
    const int Hq = tc->num_qo_heads, Hk = tc->num_kv_heads, Dqk = tc->head_dim_qk, Dvo = tc->head_dim_vo;
    const int R = tc->num_reqs;
    const ak_dtype dt = tc->dtype;
    const size_t esz = ak_dtype_size(dt), kesz = ak_dtype_size(sc->cfg.kv_dtype);
    if (Hk > AK_TEST_MAX_KV_HEADS || scene_scales(sc, dev, rng)) return -1;

    int32_t q_lens[MAX_REQS + 1], kv_lens[MAX_REQS + 1];
    for (int r = 0; r < R; r++) {
        q_lens[r] = tc->reqs[r].q_len;
        kv_lens[r] = tc->reqs[r].kv_len;
    }
    int T = 0;
    for (int r = 0; r < R; r++) T += q_lens[r];

    /* logical inputs first, rounded to the dtype so every consumer sees the
     * same values: a seed gives the same inputs whatever the page size */
    sc->q = malloc(sizeof(float) * ((size_t)T * Hq * Dqk + 1));
    for (int64_t i = 0; i < (int64_t)T * Hq * Dqk; i++) sc->q[i] = round_to(dt, scn_uniform(rng));
    sc->k = calloc((size_t)R + 1, sizeof(float *));
    sc->v = calloc((size_t)R + 1, sizeof(float *));
    /* K is scaled up so the softmax is peaked enough to notice a wrong key */
    for (int r = 0; r < R; r++) {
        const int L = tc->reqs[r].kv_len;
        sc->k[r] = malloc(sizeof(float) * ((size_t)L * Hk * Dqk + 1));
        sc->v[r] = malloc(sizeof(float) * ((size_t)L * Hk * Dvo + 1));
        for (int64_t i = 0; i < (int64_t)L * Hk * Dqk; i++) {
            const int64_t j = i / ((int64_t)Hk * Dqk); /* the key */
            const float drift = tc->drift_step ? (j >= L / 2 ? tc->key_drift : 0.0f) : tc->key_drift * (float)j / (float)L;
            sc->k[r][i] = kv_value(sc, 0, (int)(i / Dqk % Hk), 2.0f * scn_uniform(rng) + (i % 2 ? drift : -drift));
        }
        for (int64_t i = 0; i < (int64_t)L * Hk * Dvo; i++)
            sc->v[r][i] = tc->mla ? sc->k[r][i / Dvo * Dqk + i % Dvo] /* MLA: the start of the K row */
                                  : kv_value(sc, 1, (int)(i / Dvo % Hk), scn_uniform(rng));
    }

    const int paged = tc->storage == AK_KV_PAGED;
    if (scn_batch_build(&sc->b, R, q_lens, kv_lens, paged ? tc->page_size : 0, 0, 0, rng)) return -1;
    sc->lim = sc->b.lim;

    /* sink logits in [-2, 4): from a sink that barely counts to one that
     * outweighs most keys */
    if (tc->sinks) {
        sc->sinks = malloc(sizeof(float) * (size_t)Hq);
        if (!sc->sinks || tbuf_alloc(&sc->sinks_buf, dev, sizeof(float) * (size_t)Hq)) return -1;
        for (int h = 0; h < Hq; h++) sc->sinks[h] = 1.0f + 3.0f * scn_uniform(rng);
        memcpy(tbuf_host(&sc->sinks_buf), sc->sinks, sizeof(float) * (size_t)Hq);
        tbuf_upload(&sc->sinks_buf);
    }

    /* q on the device, rows padded */
    if (tbuf_alloc(&sc->q_buf, dev, esz * ((size_t)T * Hq * (Dqk + ROW_PAD) + 1))) return -1;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hq; h++) {
            char *row = (char *)tbuf_host(&sc->q_buf) + esz * ((size_t)t * Hq + h) * (Dqk + ROW_PAD);
            store_row(row, dt, sc->q + ((int64_t)t * Hq + h) * Dqk, Dqk, rng);
            store_row(row + esz * Dqk, dt, NULL, ROW_PAD, rng);
        }
    tbuf_upload(&sc->q_buf);

    if (!paged) {
        const int64_t N = sc->b.num_kv_tokens;
        /* MLA: no V tensor (a one-element buffer the run never sees) */
        if (tbuf_alloc(&sc->k_rag, dev, kesz * ((size_t)N * Hk * Dqk + 1)) ||
            tbuf_alloc(&sc->v_rag, dev, kesz * (tc->mla ? 1 : (size_t)N * Hk * Dvo + 1)))
            return -1;
        int64_t row = 0;
        for (int r = 0; r < R; r++)
            for (int j = 0; j < tc->reqs[r].kv_len; j++, row++)
                for (int h = 0; h < Hk; h++) {
                    const int64_t kr = (row * Hk + h) * Dqk, vr = (row * Hk + h) * Dvo;
                    store_kv_row(sc, (char *)tbuf_host(&sc->k_rag) + kesz * kr, 0, h,
                                 sc->k[r] + ((int64_t)j * Hk + h) * Dqk, Dqk, rng);
                    if (!tc->mla)
                        store_kv_row(sc, (char *)tbuf_host(&sc->v_rag) + kesz * vr, 1, h,
                                     sc->v[r] + ((int64_t)j * Hk + h) * Dvo, Dvo, rng);
                }
        tbuf_upload(&sc->k_rag);
        tbuf_upload(&sc->v_rag);
        return 0;
    }

    /* paged: the batch's shuffled blocks, and its spare blocks that stay random */
    const int P = tc->page_size, num_blocks = sc->b.num_blocks;
    if (scn_cache_create(&sc->cfg, 1, num_blocks, &sc->cache)) return -1;
    ak_kv_cache_layer(sc->cache, 0, &sc->kv);
    if (tc->kv_fp8 && tc->kv_scale != AK_KV_SCALE_NONE) {
        sc->kv.scale_kind = tc->kv_scale;
        sc->kv.k_scale = tbuf_data(&sc->k_scale_buf);
        sc->kv.v_scale = tc->mla ? NULL : tbuf_data(&sc->v_scale_buf); /* MLA: k_scale scales V too */
    }

    /* pool images: random everywhere, then the logical rows at their slots,
     * written by the test's own scatter (not ak_kv_update) */
    const size_t kpool = (size_t)num_blocks * P * Hk * Dqk, vpool = tc->mla ? 0 : (size_t)num_blocks * P * Hk * Dvo;
    char *kimg = malloc(kpool * kesz), *vimg = malloc(vpool * kesz + 1);
    store_row(kimg, sc->cfg.kv_dtype, NULL, (int)kpool, rng);
    store_row(vimg, sc->cfg.kv_dtype, NULL, (int)vpool, rng);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < tc->reqs[r].kv_len; j++) {
            const int64_t blk = sc->b.block_table[r * sc->b.bt_stride + j / P];
            const int s = j % P;
            for (int h = 0; h < Hk; h++) {
                const int64_t row = tc->layout == AK_LAYOUT_NHD ? (blk * P + s) * Hk + h : (blk * Hk + h) * P + s;
                store_kv_row(sc, kimg + kesz * row * Dqk, 0, h, sc->k[r] + ((int64_t)j * Hk + h) * Dqk, Dqk, rng);
                if (!tc->mla)
                    store_kv_row(sc, vimg + kesz * row * Dvo, 1, h, sc->v[r] + ((int64_t)j * Hk + h) * Dvo, Dvo,
                                 rng);
            }
        }
    dev_copy_to(dev, sc->kv.k_data, kimg, kpool * kesz);
    if (!tc->mla) dev_copy_to(dev, sc->kv.v_data, vimg, vpool * kesz);
    free(kimg);
    free(vimg);
    return 0;
}

void scene_free(scene *sc)
{
    for (int r = 0; r < sc->tc.num_reqs; r++) {
        if (sc->k) free(sc->k[r]);
        if (sc->v) free(sc->v[r]);
    }
    free(sc->k);
    free(sc->v);
    free(sc->q);
    scn_batch_free(&sc->b);
    ak_kv_cache_destroy(sc->cache);
    tbuf_free(&sc->q_buf);
    tbuf_free(&sc->k_rag);
    tbuf_free(&sc->v_rag);
    tbuf_free(&sc->sinks_buf);
    tbuf_free(&sc->k_scale_buf);
    tbuf_free(&sc->v_scale_buf);
    free(sc->sinks);
    memset(sc, 0, sizeof *sc);
}

void dense_attention(const scene *sc, double *o, double *lse)
{
    const attn_case *tc = &sc->tc;
    const int Hq = tc->num_qo_heads, Hk = tc->num_kv_heads, Dqk = tc->head_dim_qk, Dvo = tc->head_dim_vo;
    const double scale = sc->cfg.sm_scale > 0.0f ? (double)sc->cfg.sm_scale : 1.0 / sqrt((double)Dqk);
    int max_l = 1;
    for (int r = 0; r < tc->num_reqs; r++)
        if (tc->reqs[r].kv_len > max_l) max_l = tc->reqs[r].kv_len;
    double *w = malloc(sizeof(double) * (size_t)max_l);
    for (int r = 0; r < tc->num_reqs; r++) {
        const int L = tc->reqs[r].kv_len, Q = tc->reqs[r].q_len;
        for (int i = 0; i < Q; i++) {
            const int t = sc->b.qo_indptr[r] + i, pos = L - Q + i;
            for (int h = 0; h < Hq; h++) {
                const int g = h / (Hq / Hk);
                double mx = -INFINITY;
                for (int j = 0; j < L; j++) {
                    const int visible = (!tc->causal || j <= pos) &&
                                        (tc->window_left < 0 || j >= (int64_t)pos - tc->window_left);
                    if (!visible) {
                        w[j] = -INFINITY;
                        continue;
                    }
                    double s = 0;
                    for (int d = 0; d < Dqk; d++)
                        s += (double)sc->q[((int64_t)t * Hq + h) * Dqk + d] * sc->k[r][((int64_t)j * Hk + g) * Dqk + d];
                    s *= scale;
                    if (tc->soft_cap > 0) s = tc->soft_cap * tanh(s / tc->soft_cap);
                    w[j] = s;
                    if (s > mx) mx = s;
                }
                /* a sink: one more logit in the denominator, with no value */
                const double sink = sc->sinks ? sc->sinks[h] : -INFINITY;
                if (sink > mx) mx = sink;
                double sum = sc->sinks ? exp(sink - mx) : 0.0;
                for (int j = 0; j < L; j++) sum += w[j] == -INFINITY ? 0.0 : exp(w[j] - mx);
                double *orow = o + ((int64_t)t * Hq + h) * Dvo;
                for (int d = 0; d < Dvo; d++) orow[d] = 0;
                for (int j = 0; j < L && sum > 0; j++) {
                    if (w[j] == -INFINITY) continue;
                    const double p = exp(w[j] - mx) / sum;
                    for (int d = 0; d < Dvo; d++) orow[d] += p * sc->v[r][((int64_t)j * Hk + g) * Dvo + d];
                }
                lse[(int64_t)t * Hq + h] = sum > 0 ? mx + log(sum) : -INFINITY;
            }
        }
    }
    free(w);
}

static int is_nan_bits(const unsigned char *p, ak_dtype t)
{
    return isnan(ak_load_as_f32(p, t, 0));
}

ak_status scene_run(const scene *sc, const char *name, float *o, float *lse, char *bad, size_t cap)
{
    bad[0] = '\0';
    ak_backend *b = NULL;
    ak_status st = ak_backend_create(&sc->cfg, &sc->lim, name, &b);
    if (st != AK_OK) return st;
    const ak_attn_config *c = &sc->cfg;
    const int T = sc->b.num_tokens, Hq = c->num_qo_heads, Dqk = c->head_dim_qk, Dvo = c->head_dim_vo;
    const size_t oes = ak_dtype_size(c->o_dtype);
    tbuf ob, lb;
    tbuf_alloc(&ob, c->device, oes * ((size_t)T * Hq * (Dvo + ROW_PAD) + 1));
    tbuf_alloc(&lb, c->device, sizeof(float) * ((size_t)T * (Hq + LSE_PAD) + 1));
    tbuf_poison(&ob);
    tbuf_poison(&lb);

    ak_tensor q = ak_tensor_3d(tbuf_data(&sc->q_buf), c->q_dtype, T, Hq, Dqk);
    q.stride[1] = Dqk + ROW_PAD;
    q.stride[0] = (int64_t)Hq * (Dqk + ROW_PAD);
    ak_tensor ot = ak_tensor_3d(tbuf_data(&ob), c->o_dtype, T, Hq, Dvo);
    ot.stride[1] = Dvo + ROW_PAD;
    ot.stride[0] = (int64_t)Hq * (Dvo + ROW_PAD);
    ak_tensor lt = ak_tensor_2d(tbuf_data(&lb), AK_F32, T, Hq);
    lt.stride[0] = Hq + LSE_PAD;
    ak_tensor kt = ak_tensor_3d(tbuf_data(&sc->k_rag), c->kv_dtype, sc->b.num_kv_tokens, c->num_kv_heads, Dqk);
    ak_tensor vt = ak_tensor_3d(tbuf_data(&sc->v_rag), c->kv_dtype, sc->b.num_kv_tokens, c->num_kv_heads, Dvo);

    ak_tensor sk = ak_tensor_1d(sc->sinks ? tbuf_data(&sc->sinks_buf) : NULL, AK_F32, Hq);
    ak_run_args a;
    ak_run_args_init(&a);
    a.q = &q;
    a.o = &ot;
    a.lse = &lt;
    if (sc->sinks) a.sinks = &sk;
    if (c->kv_storage == AK_KV_PAGED) {
        a.kv = &sc->kv;
    } else {
        a.k = &kt;
        a.v = c->mla ? NULL : &vt; /* MLA: the value is read from the K rows */
        if (sc->tc.kv_fp8 && sc->tc.kv_scale != AK_KV_SCALE_NONE) {
            a.kv_scale_kind = sc->tc.kv_scale;
            a.k_scale = tbuf_data(&sc->k_scale_buf);
            a.v_scale = c->mla ? NULL : tbuf_data(&sc->v_scale_buf);
        }
    }
    ak_batch batch = sc->b.batch;
    tbuf table;
    memset(&table, 0, sizeof table);
    if (sc->device_table && c->kv_storage == AK_KV_PAGED) {
        const size_t n = (size_t)batch.num_reqs * (size_t)batch.block_table_stride;
        tbuf_alloc(&table, c->device, sizeof(int32_t) * (n + 1));
        memcpy(tbuf_host(&table), batch.block_table, sizeof(int32_t) * n);
        tbuf_upload(&table);
        batch.device_block_table = tbuf_data(&table);
        batch.block_table = NULL;
    }
    st = ak_backend_plan(b, &batch, NULL);
    if (st == AK_OK) st = ak_backend_run(b, &a, NULL);
    dev_sync(c->device);
    tbuf_download(&ob);
    tbuf_download(&lb);

    if (st == AK_OK) {
        if (!tbuf_guards_ok(&ob)) snprintf(bad, cap, "write outside o (guard bytes changed)");
        if (!tbuf_guards_ok(&lb)) snprintf(bad, cap, "write outside lse (guard bytes changed)");
        const unsigned char *oh = tbuf_host(&ob);
        for (int t = 0; t < T && !bad[0]; t++)
            for (int h = 0; h < Hq && !bad[0]; h++) {
                const unsigned char *row = oh + oes * ((size_t)t * Hq + h) * (Dvo + ROW_PAD);
                for (int d = 0; d < Dvo; d++) {
                    if (is_nan_bits(row + oes * d, c->o_dtype)) {
                        snprintf(bad, cap, "o[%d][%d][%d] is NaN (unwritten or computed)", t, h, d);
                        break;
                    }
                    o[((int64_t)t * Hq + h) * Dvo + d] = ak_load_as_f32(row, c->o_dtype, d);
                }
                for (size_t p = oes * Dvo; p < oes * (Dvo + ROW_PAD) && !bad[0]; p++)
                    if (row[p] != POISON_BYTE) snprintf(bad, cap, "o row padding of [%d][%d] was written", t, h);
                const float *lrow = (const float *)tbuf_host(&lb) + (size_t)t * (Hq + LSE_PAD);
                if (isnan(lrow[h])) snprintf(bad, cap, "lse[%d][%d] is NaN", t, h);
                lse[(int64_t)t * Hq + h] = lrow[h];
            }
    }
    tbuf_free(&ob);
    tbuf_free(&lb);
    if (table.raw) tbuf_free(&table);
    ak_backend_destroy(b);
    return st;
}

/* ---- error measures ----------------------------------------------------- */

double rel_err_f(const float *x, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)x[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double max_lse_err(const float *x, const double *ref, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(ref[i]) || isinf(x[i])) {
            if (!(isinf(ref[i]) && isinf(x[i]) && (ref[i] < 0) == (x[i] < 0))) return INFINITY;
            continue;
        }
        const double d = fabs((double)x[i] - ref[i]) / fmax(1.0, fabs(ref[i]) / 64.0);
        if (!(d <= m)) m = d;
    }
    return m;
}

double tolerance(ak_dtype t)
{
    /* relative (Frobenius) error of o. f32: accumulation order and fast exp;
     * f16/bf16: output rounding plus probabilities rounded for the P.V product
     * on tensor cores (bf16 has 8 mantissa bits: ~4e-3 per element). */
    switch (t) {
    case AK_F16: return 4e-3;
    case AK_BF16: return 2e-2;
    default: return 1e-4;
    }
}
