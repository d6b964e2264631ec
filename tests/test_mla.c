/*
 * test_mla.c - multi-head latent attention means what DeepSeek-V2/V3 mean.
 * The case table (test_attn.c) checks every backend against cpu_ref on MLA
 * configs; this checks the definition itself: a model's attention in the
 * EXPANDED form, computed here in fp64 from its up-projections,
 *     k_h = [W_UK_h c ; k_pe]  (nope + rope dims)   v_h = W_UV_h^T c  (v dims)
 *     q_h = [q_nope_h ; q_pe_h]                     scale 1/sqrt(nope + rope)
 * against attnkit's ABSORBED form through the public API: q'_h = [W_UK_h^T
 * q_nope_h ; q_pe_h] over the latent rows [c ; k_pe] of an MLA cache written
 * by ak_kv_update, o'_h of latent width, then o_h = W_UV_h^T o'_h. Shapes:
 * W_UK [H][nope][latent], W_UV [H][latent][v], c [keys][latent], k_pe
 * [keys][rope], q_nope [tokens][H][nope], q_pe [tokens][H][rope].
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "harness.h"

#include "dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mla_case {
    const char *name;
    int heads, nope, latent, rope, vdim;
    ak_dtype dtype;  /* q and the cache (and o where o16) */
    int page_size;
    int num_reqs;
    req_spec reqs[4];
    int o16; /* o in dtype instead of f32 (the GPU kernel writes 16-bit o only) */
} mla_case;

static const mla_case mla_cases[] = {
    {"mla = expanded: small f32", 4, 16, 32, 8, 16, AK_F32, 16, 3, {{1, 40}, {4, 70}, {1, 1}}},
    {"mla = expanded: small bf16 page 1", 4, 16, 32, 8, 16, AK_BF16, 1, 2, {{3, 33}, {1, 90}}},
    {"mla = expanded: deepseek 16 heads f32", 16, 128, 512, 64, 128, AK_F32, 64, 2, {{1, 300}, {2, 129}}},
    {"mla = expanded: deepseek 16 heads bf16", 16, 128, 512, 64, 128, AK_BF16, 64, 2, {{1, 200}, {3, 65}}},
    {"mla = expanded: deepseek 16 heads bf16, bf16 o", 16, 128, 512, 64, 128, AK_BF16, 64, 3,
     {{1, 300}, {2, 129}, {1, 1}}, .o16 = 1},
    {"mla = expanded: deepseek 128 heads bf16, bf16 o", 128, 128, 512, 64, 128, AK_BF16, 64, 2,
     {{1, 130}, {2, 65}}, .o16 = 1},
};

/* The model's tensors, f32, already rounded to the dtype where attnkit reads them. */
typedef struct mla_model {
    float *w_uk;   /* [H][nope][latent] */
    float *w_uv;   /* [H][latent][v] */
    float *c;      /* [keys][latent] latent rows, every request's keys in turn */
    float *k_pe;   /* [keys][rope] */
    float *q_nope; /* [tokens][H][nope] */
    float *q_pe;   /* [tokens][H][rope] */
} mla_model;

/* x rounded to 16-bit dtype t (f32: x) */
static float round_dt(ak_dtype t, float x)
{
    if (t == AK_F32) return x;
    uint16_t h;
    ak_convert(&x, AK_F32, &h, t, 1);
    ak_convert(&h, t, &x, AK_F32, 1);
    return x;
}

static float *rand_floats(int64_t n, float amp, ak_dtype round, uint64_t *rng)
{
    float *p = malloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) p[i] = round_dt(round, amp * scn_uniform(rng));
    return p;
}

/* The expanded form in fp64: out [tokens][H][v], lse [tokens][H]. */
static void expanded(const mla_case *mc, const mla_model *m, const scn_batch *b, double *out, double *lse)
{
    const int H = mc->heads, N = mc->nope, L = mc->latent, R = mc->rope, V = mc->vdim;
    const double scale = 1.0 / sqrt((double)(N + R));
    const int64_t keys = b->num_kv_tokens;
    double *k = malloc(sizeof(double) * (size_t)(keys * N + 1)); /* one head's k_nope */
    double *v = malloc(sizeof(double) * (size_t)(keys * V + 1)); /* one head's v */
    double *s = malloc(sizeof(double) * (size_t)(keys + 1));
    for (int h = 0; h < H; h++) {
        for (int64_t j = 0; j < keys; j++) {
            for (int i = 0; i < N; i++) {
                double acc = 0;
                for (int l = 0; l < L; l++) acc += (double)m->w_uk[((int64_t)h * N + i) * L + l] * m->c[j * L + l];
                k[j * N + i] = acc;
            }
            for (int i = 0; i < V; i++) {
                double acc = 0;
                for (int l = 0; l < L; l++) acc += (double)m->w_uv[((int64_t)h * L + l) * V + i] * m->c[j * L + l];
                v[j * V + i] = acc;
            }
        }
        int64_t key0 = 0;
        for (int r = 0; r < b->num_reqs; key0 += b->kv_lens[r], r++) {
            const int kv_len = b->kv_lens[r], q_len = b->qo_indptr[r + 1] - b->qo_indptr[r];
            for (int qi = 0; qi < q_len; qi++) {
                const int64_t t = b->qo_indptr[r] + qi;
                const int pos = kv_len - q_len + qi; /* causal: keys 0 .. pos */
                const float *qn = m->q_nope + (t * H + h) * N, *qp = m->q_pe + (t * H + h) * R;
                double mx = -INFINITY;
                for (int j = 0; j <= pos; j++) {
                    double dot = 0;
                    for (int i = 0; i < N; i++) dot += qn[i] * k[(key0 + j) * N + i];
                    for (int i = 0; i < R; i++) dot += (double)qp[i] * m->k_pe[(key0 + j) * R + i];
                    s[j] = dot * scale;
                    if (s[j] > mx) mx = s[j];
                }
                double sum = 0;
                for (int j = 0; j <= pos; j++) sum += exp(s[j] - mx);
                double *o = out + (t * H + h) * V;
                for (int i = 0; i < V; i++) o[i] = 0;
                for (int j = 0; j <= pos; j++)
                    for (int i = 0; i < V; i++) o[i] += exp(s[j] - mx) / sum * v[(key0 + j) * V + i];
                lse[t * H + h] = mx + log(sum);
            }
        }
    }
    free(k);
    free(v);
    free(s);
}

/* The absorbed form on backend `name`: the latent rows written into an MLA
 * cache by ak_kv_update, q' built from q_nope through W_UK, run(), then
 * W_UV applied to o'. Returns AK_ERR_UNSUPPORTED when the backend refuses. */
static ak_status absorbed(const test_ctx *t, const char *name, const mla_case *mc, const mla_model *m,
                          const scn_batch *b, double *out, float *lse)
{
    const int H = mc->heads, N = mc->nope, L = mc->latent, R = mc->rope, V = mc->vdim, D = L + R;
    const int T = b->num_tokens;
    const int64_t keys = b->num_kv_tokens;
    const size_t esz = ak_dtype_size(mc->dtype);

    ak_attn_config cfg;
    ak_mla_config_init(&cfg, H, L, R, (float)(1.0 / sqrt((double)(N + R))));
    const ak_dtype od = mc->o16 ? mc->dtype : AK_F32;
    cfg.q_dtype = cfg.kv_dtype = mc->dtype;
    cfg.o_dtype = od;
    cfg.page_size = mc->page_size;
    cfg.device = t->device;
    ak_backend *be = NULL;
    ak_status st = ak_backend_create(&cfg, &b->lim, name, &be);
    if (st != AK_OK) return st;

    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.num_blocks = b->num_blocks;
    kc.page_size = mc->page_size;
    kc.num_kv_heads = 1;
    kc.head_dim_qk = D;
    kc.head_dim_vo = L;
    kc.dtype = mc->dtype;
    kc.device = t->device;
    kc.mla = 1;
    ak_kv_cache *cache = NULL;
    ak_paged_kv kv;
    tbuf rows, slots, qb, ob, lb;
    memset(&rows, 0, sizeof rows);
    memset(&slots, 0, sizeof slots);
    memset(&qb, 0, sizeof qb);
    memset(&ob, 0, sizeof ob);
    memset(&lb, 0, sizeof lb);
    st = ak_kv_cache_create(&kc, &cache);
    if (st == AK_OK) st = ak_kv_cache_layer(cache, 0, &kv);
    if (st != AK_OK) goto done;

    /* every key's latent row [c ; k_pe] at its slot, through the block table */
    if (tbuf_alloc(&rows, t->device, esz * (size_t)(keys * D + 1)) ||
        tbuf_alloc(&slots, t->device, sizeof(int64_t) * (size_t)(keys + 1)) ||
        tbuf_alloc(&qb, t->device, esz * (size_t)T * H * D + 1) ||
        tbuf_alloc(&ob, t->device, sizeof(float) * (size_t)T * H * L + 1) ||
        tbuf_alloc(&lb, t->device, sizeof(float) * (size_t)T * H + 1)) {
        st = AK_ERR_OUT_OF_MEMORY;
        goto done;
    }
    int64_t *slot = tbuf_host(&slots);
    for (int64_t j = 0, r = 0, key0 = 0; j < keys; j++) {
        while (j - key0 >= b->kv_lens[r]) key0 += b->kv_lens[r++];
        const int64_t jj = j - key0;
        slot[j] = (int64_t)b->block_table[r * b->bt_stride + jj / mc->page_size] * mc->page_size + jj % mc->page_size;
        for (int l = 0; l < L; l++) ak_store_from_f32(tbuf_host(&rows), mc->dtype, j * D + l, m->c[j * L + l]);
        for (int i = 0; i < R; i++) ak_store_from_f32(tbuf_host(&rows), mc->dtype, j * D + L + i, m->k_pe[j * R + i]);
    }
    tbuf_upload(&rows);
    tbuf_upload(&slots);
    const ak_tensor k = ak_tensor_3d(tbuf_data(&rows), mc->dtype, keys, 1, D);
    st = ak_kv_update(&kv, &k, NULL, tbuf_data(&slots), (int)keys, NULL);
    if (st != AK_OK) goto done;

    /* q'_h = [q_nope_h W_UK_h (latent) ; q_pe_h (rope)] */
    for (int64_t tk = 0; tk < T; tk++)
        for (int h = 0; h < H; h++) {
            const int64_t row = (tk * H + h) * D;
            for (int l = 0; l < L; l++) {
                double acc = 0;
                for (int i = 0; i < N; i++)
                    acc += (double)m->q_nope[(tk * H + h) * N + i] * m->w_uk[((int64_t)h * N + i) * L + l];
                ak_store_from_f32(tbuf_host(&qb), mc->dtype, row + l, (float)acc);
            }
            for (int i = 0; i < R; i++)
                ak_store_from_f32(tbuf_host(&qb), mc->dtype, row + L + i, m->q_pe[(tk * H + h) * R + i]);
        }
    tbuf_upload(&qb);
    tbuf_poison(&ob);
    tbuf_poison(&lb);
    const ak_tensor q = ak_tensor_3d(tbuf_data(&qb), mc->dtype, T, H, D);
    ak_tensor o = ak_tensor_3d(tbuf_data(&ob), od, T, H, L);
    ak_tensor l = ak_tensor_2d(tbuf_data(&lb), AK_F32, T, H);
    ak_run_args args;
    ak_run_args_init(&args);
    args.q = &q;
    args.kv = &kv;
    args.o = &o;
    args.lse = &l;
    st = ak_backend_plan(be, &b->batch, NULL);
    if (st == AK_OK) st = ak_backend_run(be, &args, NULL);
    dev_sync(t->device);
    if (st != AK_OK) goto done;
    tbuf_download(&ob);
    tbuf_download(&lb);

    /* o_h = W_UV_h^T o'_h */
    const void *op = tbuf_host(&ob);
    for (int64_t tk = 0; tk < T; tk++)
        for (int h = 0; h < H; h++) {
            for (int i = 0; i < V; i++) {
                double acc = 0;
                for (int l2 = 0; l2 < L; l2++)
                    acc += (double)m->w_uv[((int64_t)h * L + l2) * V + i] *
                           ak_load_as_f32(op, od, (tk * H + h) * L + l2);
                out[(tk * H + h) * V + i] = acc;
            }
            lse[tk * H + h] = ((const float *)tbuf_host(&lb))[tk * H + h];
        }
done:
    tbuf_free(&rows);
    tbuf_free(&slots);
    tbuf_free(&qb);
    tbuf_free(&ob);
    tbuf_free(&lb);
    ak_kv_cache_destroy(cache);
    ak_backend_destroy(be);
    return st;
}

static void run_mla_case(test_ctx *t, const mla_case *mc)
{
    if (!t_selected(t, mc->name) || !t_storage_selected(t, AK_KV_PAGED)) return;
    uint64_t rng = t->seed ^ scn_name_hash(mc->name);
    int32_t q_lens[4], kv_lens[4];
    for (int r = 0; r < mc->num_reqs; r++) {
        q_lens[r] = mc->reqs[r].q_len;
        kv_lens[r] = mc->reqs[r].kv_len;
    }
    scn_batch b;
    if (scn_batch_build(&b, mc->num_reqs, q_lens, kv_lens, mc->page_size, 0, 0, &rng)) {
        t_fail(t, NULL, mc->name, "cannot build the batch");
        return;
    }
    const int H = mc->heads, N = mc->nope, L = mc->latent, R = mc->rope, V = mc->vdim, T = b.num_tokens;
    /* W scaled so that k_nope and v stay O(1); q large enough for a peaked softmax */
    mla_model m;
    m.w_uk = rand_floats((int64_t)H * N * L, 2.0f / sqrtf((float)L), AK_F32, &rng);
    m.w_uv = rand_floats((int64_t)H * L * V, 2.0f / sqrtf((float)L), AK_F32, &rng);
    m.c = rand_floats(b.num_kv_tokens * L, 1.0f, mc->dtype, &rng);
    m.k_pe = rand_floats(b.num_kv_tokens * R, 1.0f, mc->dtype, &rng);
    m.q_nope = rand_floats((int64_t)T * H * N, 4.0f, AK_F32, &rng);
    m.q_pe = rand_floats((int64_t)T * H * R, 4.0f, mc->dtype, &rng);
    const int64_t n_o = (int64_t)T * H * V, n_l = (int64_t)T * H;
    double *ref_o = malloc(sizeof(double) * (size_t)(n_o + 1)), *ref_l = malloc(sizeof(double) * (size_t)(n_l + 1));
    double *o = malloc(sizeof(double) * (size_t)(n_o + 1));
    float *of = malloc(sizeof(float) * (size_t)(n_o + 1)), *l = malloc(sizeof(float) * (size_t)(n_l + 1));
    expanded(mc, &m, &b, ref_o, ref_l);

    /* f32: the absorbed form reassociates sums only; bf16: q' and the rows
     * are rounded to 8 mantissa bits */
    const double tol = mc->dtype == AK_F32 ? 2e-5 : 1e-2, lse_tol = mc->dtype == AK_F32 ? 1e-4 : 2e-2;
    const char *names[16];
    const int nb = t_backends(t, names, 16);
    for (int i = 0; i < nb; i++) {
        const ak_status st = absorbed(t, names[i], mc, &m, &b, o, l);
        if (st == AK_ERR_UNSUPPORTED) {
            t_skip(t, names[i], mc->name, "unsupported");
            continue;
        }
        if (st != AK_OK) {
            t_fail(t, names[i], mc->name, "status %s: %s", ak_status_str(st), ak_last_error());
            continue;
        }
        for (int64_t j = 0; j < n_o; j++) of[j] = (float)o[j];
        const double e = rel_err_f(of, ref_o, n_o), le = max_lse_err(l, ref_l, n_l);
        if (e <= tol && le <= lse_tol)
            t_pass(t, names[i], mc->name, "vs expanded fp64: rel err %.2e (tol %.0e), lse err %.2e", e, tol, le);
        else
            t_fail(t, names[i], mc->name, "vs expanded fp64: rel err %.2e (tol %.0e), lse err %.2e (tol %.0e)", e,
                   tol, le, lse_tol);
    }
    free(ref_o);
    free(ref_l);
    free(o);
    free(of);
    free(l);
    free(m.w_uk);
    free(m.w_uv);
    free(m.c);
    free(m.k_pe);
    free(m.q_nope);
    free(m.q_pe);
    scn_batch_free(&b);
}

/* ak_kv_update into a K-only (MLA) view on t->device, against the same
 * update of a CPU cache: the latent rows written at their slots (some -1,
 * skipped), quantized when the pool is fp8 (scale per layer or per head: one
 * KV head), the rest of the pool untouched; the two must be equal byte for
 * byte. On CUDA it runs the kernel's K-only path, which attention does not
 * reach while the CUDA backends refuse cfg.mla. */
static void kv_update_k_only(test_ctx *t, ak_dtype pool, ak_dtype rows_dtype, ak_kv_scale_kind kind)
{
    char name[160];
    snprintf(name, sizeof name, "mla kv_update K-only view, %s rows into a %s pool%s", ak_dtype_name(rows_dtype),
             ak_dtype_name(pool), kind == AK_KV_SCALE_PER_LAYER ? ", scale per layer"
                                  : kind == AK_KV_SCALE_PER_HEAD ? ", scale per head" : "");
    if (!t_selected(t, name)) return;
    const int P = 16, nb = 9, D = 576, L = 512, n = 37;
    uint64_t rng = t->seed ^ scn_name_hash(name);
    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.num_blocks = nb;
    kc.page_size = P;
    kc.num_kv_heads = 1;
    kc.head_dim_qk = D;
    kc.head_dim_vo = L;
    kc.dtype = pool;
    kc.mla = 1;
    ak_kv_cache *cache[2] = {NULL, NULL}; /* [0] on t->device, [1] on the CPU */
    ak_paged_kv kv[2];
    tbuf rows, slots, scale;
    memset(&rows, 0, sizeof rows);
    memset(&slots, 0, sizeof slots);
    memset(&scale, 0, sizeof scale);
    const size_t pool_bytes = (size_t)nb * P * D * ak_dtype_size(pool), resz = ak_dtype_size(rows_dtype);
    char *img = malloc(pool_bytes), *got = malloc(pool_bytes);
    float sc = 0.05f + 0.05f * (1.0f + scn_uniform(&rng));
    int ok = img && got;
    for (int i = 0; i < 2 && ok; i++) {
        kc.device = i == 0 ? t->device : (ak_device){AK_DEVICE_CPU, 0};
        ok = ak_kv_cache_create(&kc, &cache[i]) == AK_OK && ak_kv_cache_layer(cache[i], 0, &kv[i]) == AK_OK;
    }
    if (!ok) {
        t_fail(t, NULL, name, "setup: %s", ak_last_error());
        goto done;
    }
    /* the same random pool image in both */
    for (size_t i = 0; i < pool_bytes / ak_dtype_size(pool); i++)
        ak_store_from_f32(img, pool, (int64_t)i, scn_uniform(&rng));
    dev_copy_to(t->device, kv[0].k_data, img, pool_bytes);
    memcpy(kv[1].k_data, img, pool_bytes);
    if (kv[0].v_data || kv[1].v_data) {
        t_fail(t, NULL, name, "an MLA cache's view has a V pool");
        goto done;
    }
    if (tbuf_alloc(&rows, t->device, resz * (size_t)n * D) || tbuf_alloc(&slots, t->device, sizeof(int64_t) * n) ||
        tbuf_alloc(&scale, t->device, sizeof(float))) {
        t_fail(t, NULL, name, "out of memory");
        goto done;
    }
    for (int i = 0; i < n * D; i++) ak_store_from_f32(tbuf_host(&rows), rows_dtype, i, 4.0f * scn_uniform(&rng));
    /* distinct slots in random blocks, every fifth token skipped */
    int64_t *slot = tbuf_host(&slots);
    for (int i = 0; i < n; i++) slot[i] = i % 5 == 4 ? -1 : (int64_t)((i * 7) % (nb * P));
    *(float *)tbuf_host(&scale) = sc;
    tbuf_upload(&rows);
    tbuf_upload(&slots);
    tbuf_upload(&scale);
    ak_status st = AK_OK;
    for (int i = 0; i < 2 && st == AK_OK; i++) {
        if (kind != AK_KV_SCALE_NONE) {
            kv[i].scale_kind = kind;
            kv[i].k_scale = i == 0 ? tbuf_data(&scale) : &sc;
        }
        const ak_tensor k = ak_tensor_3d(i == 0 ? tbuf_data(&rows) : tbuf_host(&rows), rows_dtype, n, 1, D);
        st = ak_kv_update(&kv[i], &k, NULL, i == 0 ? tbuf_data(&slots) : tbuf_host(&slots), n, NULL);
    }
    dev_sync(t->device);
    if (st != AK_OK) {
        t_fail(t, NULL, name, "kv_update: %s", ak_last_error());
        goto done;
    }
    dev_copy_from(t->device, got, kv[0].k_data, pool_bytes);
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < pool_bytes; i++)
        if (got[i] != ((const char *)kv[1].k_data)[i] && !diff++) first = i;
    /* and the CPU's own result: the rows at their slots, the rest as it was */
    size_t moved = 0;
    for (size_t i = 0; i < pool_bytes; i++) moved += img[i] != ((const char *)kv[1].k_data)[i];
    CHECK(t, name, diff == 0 && moved > 0, "%zu bytes differ from the CPU's (first at %zu); %zu bytes written", diff,
          first, moved);
done:
    tbuf_free(&rows);
    tbuf_free(&slots);
    tbuf_free(&scale);
    free(img);
    free(got);
    for (int i = 0; i < 2; i++) ak_kv_cache_destroy(cache[i]);
}

/* ---- the cpu backend's MLA paths, kernel by kernel --------------------------- */

/* MLA batches against cpu_ref on the cpu backend, once for each kernel this
 * CPU runs (AK_CPU_ISA, set around each case: test_core clears the variable,
 * so a value given to the whole run does not reach these): its MLA items (a
 * request of up to 128 / heads tokens: all of them x all heads against each
 * latent row) on f32 FMAs, VDPBF16PS (bf16 q and K; bf16 P too where o is
 * bf16) and AMX tiles, and their edges: 16 to 128 heads, 1 to 8 tokens a
 * request, contexts of 0 to 3 keys, pages of 1, 16, 64 and 128 keys with
 * split-KV chunks (multiples of 64 keys) ending inside a page, every
 * dtype, sinks, soft-cap, window, fp8 rows, head dims that are not whole
 * vectors. */
#define NHD AK_LAYOUT_NHD
#define PAGED AK_KV_PAGED
#define RAGGED AK_KV_RAGGED
static const attn_case cpu_mla_cases[] = {
    {"h16 bf16 page16 tiny + verify + split", 16, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 8,
     {{1, 1}, {1, 2}, {1, 3}, {2, 2}, {3, 3}, {0, 0}, {8, 300}, {1, 1500}}, .mla = 1},
    {"h16 bf16 page128 f32 out split mid-page", 16, 1, 576, 512, AK_BF16, 0, 1, 1, -1, 0, 128, NHD, PAGED, 3,
     {{1, 1300}, {5, 40}, {1, 17}}, .mla = 1},
    {"h16 bf16 page64 sinks soft-cap", 16, 1, 576, 512, AK_BF16, 1, 0, 1, -1, 20.0f, 64, NHD, PAGED, 3,
     {{1, 1100}, {8, 8}, {1, 1}}, .mla = 1},
    {"h16 bf16 page16 window 50", 16, 1, 576, 512, AK_BF16, 0, 0, 1, 50, 0, 16, NHD, PAGED, 3,
     {{4, 300}, {1, 200}, {1, 3}}, .mla = 1},
    {"h32 f16 page1", 32, 1, 576, 512, AK_F16, 0, 0, 1, -1, 0, 1, NHD, PAGED, 4, {{1, 700}, {4, 37}, {1, 1}, {2, 2}},
     .mla = 1},
    {"h64 f32 page128", 64, 1, 576, 512, AK_F32, 0, 0, 1, -1, 0, 128, NHD, PAGED, 3, {{1, 900}, {2, 130}, {1, 3}},
     .mla = 1},
    {"h128 bf16 page64 f32 out", 128, 1, 576, 512, AK_BF16, 0, 1, 1, -1, 0, 64, NHD, PAGED, 3,
     {{1, 1100}, {1, 2}, {0, 0}}, .mla = 1},
    {"h128 bf16 page128 split", 128, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0, 128, NHD, PAGED, 2, {{1, 1400}, {1, 3}},
     .mla = 1},
    {"h16 fp8 bf16 page16 per-layer", 16, 1, 576, 512, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{1, 500}, {3, 40}, {1, 1}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_LAYER, .mla = 1},
    {"h16 72/40 bf16 ragged", 16, 1, 72, 40, AK_BF16, 0, 0, 1, -1, 0, 0, NHD, RAGGED, 3,
     {{1, 400}, {7, 30}, {1, 1}}, .mla = 1},
    {"h16 bf16 sinks empty last chunk", 16, 1, 576, 512, AK_BF16, 1, 0, 1, -1, 0, 16, NHD, PAGED, 2,
     {{8, 1285}, {1, 1}}, .mla = 1},
    {"h16 f32 sinks window 600 page1", 16, 1, 576, 512, AK_F32, 1, 0, 1, 600, 0, 1, NHD, PAGED, 3,
     {{8, 1285}, {3, 5}, {0, 0}}, .mla = 1},
    {"h16 bf16 sinks window 600 page1 softcap", 16, 1, 576, 512, AK_BF16, 1, 0, 1, 600, 30.0f, 1, NHD, PAGED, 3,
     {{8, 1285}, {3, 5}, {0, 0}}, .mla = 1},
    {"h8 bf16 16 tokens", 8, 1, 576, 512, AK_BF16, 1, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{16, 1285}, {16, 16}, {9, 700}}, .mla = 1},
    {"h2 bf16 72/40 64 tokens", 2, 1, 72, 40, AK_BF16, 1, 0, 1, -1, 0, 16, NHD, PAGED, 3,
     {{64, 1300}, {64, 64}, {33, 40}}, .mla = 1},
    {"h3 f16 72/40 42 tokens", 3, 1, 72, 40, AK_F16, 1, 0, 1, 100, 0, 16, NHD, PAGED, 3,
     {{42, 1300}, {42, 42}, {33, 40}}, .mla = 1},
    {"h256 bf16", 256, 1, 576, 512, AK_BF16, 1, 0, 1, -1, 0, 64, NHD, PAGED, 2, {{1, 1300}, {1, 1}}, .mla = 1},
    {"h24 bf16 f32out", 24, 1, 576, 512, AK_BF16, 0, 1, 1, -1, 0, 64, NHD, PAGED, 3, {{5, 1300}, {5, 5}, {2,3}}, .mla = 1},
    {"h20 bf16 ragged 100/36", 20, 1, 100, 36, AK_BF16, 1, 0, 1, -1, 0, 0, NHD, RAGGED, 3, {{6, 1300}, {5, 5}, {2,3}}, .mla = 1},
    {"h16 bf16 fp8 per-head", 16, 1, 576, 512, AK_BF16, 1, 0, 1, -1, 0, 16, NHD, PAGED, 2,
     {{8, 1285}, {1, 1}}, .kv_fp8 = 1, .kv_scale = AK_KV_SCALE_PER_HEAD, .mla = 1},
    {"h4 72/64 bf16 page16", 4, 1, 72, 64, AK_BF16, 0, 0, 1, -1, 0, 16, NHD, PAGED, 3, {{1, 900}, {30, 30}, {2, 2}},
     .mla = 1},
};

static void cpu_mla_kernels(test_ctx *t)
{
    if (t->device.kind != AK_DEVICE_CPU || (t->backend && strcmp(t->backend, "cpu") != 0)) return;
    static const char *const isas[] = {"", "scalar", "avx2", "avx512", "avx512bf16", "amx"};
    char saved[32] = "";
    if (getenv("AK_CPU_ISA")) snprintf(saved, sizeof saved, "%s", getenv("AK_CPU_ISA"));
    for (size_t i = 0; i < sizeof isas / sizeof *isas; i++)
        for (size_t k = 0; k < sizeof cpu_mla_cases / sizeof *cpu_mla_cases; k++) {
            attn_case tc = cpu_mla_cases[k];
            /* 64 and 128 heads on the automatic kernel only: cpu_ref's cost
             * (under the sanitizers most of all), and the other kernels run
             * the same code at 16 and 32 heads with fewer row blocks */
            if (isas[i][0] && tc.num_qo_heads > 32) continue;
            char name[160];
            snprintf(name, sizeof name, "mla cpu %s: %s", isas[i][0] ? isas[i] : "auto", tc.name);
            tc.name = name;
            if (!t_selected(t, name)) continue;
            if (isas[i][0]) setenv("AK_CPU_ISA", isas[i], 1);
            else unsetenv("AK_CPU_ISA");
            /* a kernel this CPU (or build, or dtype) lacks: skipped, not failed */
            const ak_attn_config cfg = case_config(&tc, t->device);
            char kernel[256];
            if (ak_cpu_kernel_describe(&cfg, kernel, sizeof kernel) != AK_OK)
                t_skip(t, "cpu", name, "%s", kernel);
            else
                run_case(t, &tc);
        }
    if (saved[0]) setenv("AK_CPU_ISA", saved, 1);
    else unsetenv("AK_CPU_ISA");
}

void test_mla(test_ctx *t)
{
    cpu_mla_kernels(t);
    for (size_t i = 0; i < sizeof mla_cases / sizeof *mla_cases; i++) run_mla_case(t, &mla_cases[i]);
    kv_update_k_only(t, AK_BF16, AK_BF16, AK_KV_SCALE_NONE);
    kv_update_k_only(t, AK_F16, AK_F16, AK_KV_SCALE_NONE);
    kv_update_k_only(t, AK_FP8_E4M3, AK_BF16, AK_KV_SCALE_PER_LAYER);
    kv_update_k_only(t, AK_FP8_E4M3, AK_F32, AK_KV_SCALE_PER_HEAD);
    kv_update_k_only(t, AK_FP8_E4M3, AK_F16, AK_KV_SCALE_NONE);
}
