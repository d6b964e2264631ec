#define _POSIX_C_SOURCE 200809L
/*
 * test_core.c - the pieces under the backends: dtype conversion, the block
 * allocator, batch metadata, ak_kv_update, ak_merge_states, the selector.
 */
#include "harness.h"

#include "dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void core_dtypes(test_ctx *t)
{
    /* exact values */
    CHECK(t, "f16 1.0", ak_f32_to_f16(1.0f) == 0x3c00, "0x%04x", ak_f32_to_f16(1.0f));
    CHECK(t, "f16 -2.5", ak_f32_to_f16(-2.5f) == 0xc100, "0x%04x", ak_f32_to_f16(-2.5f));
    CHECK(t, "f16 max", ak_f32_to_f16(65504.0f) == 0x7bff, "0x%04x", ak_f32_to_f16(65504.0f));
    CHECK(t, "f16 overflow -> inf", ak_f32_to_f16(70000.0f) == 0x7c00, "0x%04x", ak_f32_to_f16(70000.0f));
    CHECK(t, "f16 smallest subnormal", ak_f32_to_f16(5.9604645e-8f) == 0x0001, "0x%04x",
          ak_f32_to_f16(5.9604645e-8f));
    CHECK(t, "f16 nan", isnan(ak_f16_to_f32(ak_f32_to_f16(NAN))), "not NaN");
    CHECK(t, "bf16 1.0", ak_f32_to_bf16(1.0f) == 0x3f80, "0x%04x", ak_f32_to_bf16(1.0f));
    CHECK(t, "bf16 round to even", ak_f32_to_bf16(ak_bits_f32(0x3f808000u)) == 0x3f80, "0x%04x",
          ak_f32_to_bf16(ak_bits_f32(0x3f808000u)));
    CHECK(t, "bf16 nan", isnan(ak_bf16_to_f32(ak_f32_to_bf16(NAN))), "not NaN");
    /* every f16 value round-trips through f32 */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        const uint16_t x = (uint16_t)h;
        if ((x & 0x7c00u) == 0x7c00u && (x & 0x3ffu)) continue; /* NaN payloads */
        if (ak_f32_to_f16(ak_f16_to_f32(x)) != x) bad++;
    }
    CHECK(t, "f16 round trip (65536 values)", bad == 0, "%d values differ", bad);
    /* random values: rounding error within half an ulp */
    uint64_t rng = t->seed;
    double worst16 = 0, worstbf = 0;
    for (int i = 0; i < 100000; i++) {
        const float x = scn_uniform(&rng) * 1000.0f;
        const double e16 = fabs(ak_f16_to_f32(ak_f32_to_f16(x)) - x) / fabs(x);
        const double ebf = fabs(ak_bf16_to_f32(ak_f32_to_bf16(x)) - x) / fabs(x);
        if (e16 > worst16) worst16 = e16;
        if (ebf > worstbf) worstbf = ebf;
    }
    CHECK(t, "f16 rounding <= half ulp", worst16 <= 0.5 / 1024 * 1.0001, "worst %.3e", worst16);
    CHECK(t, "bf16 rounding <= half ulp", worstbf <= 0.5 / 128 * 1.0001, "worst %.3e", worstbf);
    /* ak_convert in place (src == dst), to a wider, an equal and a narrower
     * dtype: every pair, against the same conversion between two buffers */
    const ak_dtype dts[] = {AK_F32, AK_F16, AK_BF16, AK_FP8_E4M3};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            enum { N = 37 };
            float vals[N];
            unsigned char src[4 * N], buf[4 * N], want[4 * N];
            for (int i = 0; i < N; i++) vals[i] = scn_uniform(&rng) * 100.0f;
            ak_convert(vals, AK_F32, src, dts[a], N);
            memcpy(buf, src, sizeof src);
            const ak_status s1 = ak_convert(src, dts[a], want, dts[b], N);
            const ak_status s2 = ak_convert(buf, dts[a], buf, dts[b], N);
            char name[64];
            snprintf(name, sizeof name, "ak_convert in place %s -> %s", ak_dtype_name(dts[a]), ak_dtype_name(dts[b]));
            CHECK(t, name, s1 == AK_OK && s2 == AK_OK && !memcmp(buf, want, N * ak_dtype_size(dts[b])),
                  "status %d/%d, or the bytes differ", (int)s1, (int)s2);
        }
}

static void core_allocator(test_ctx *t)
{
    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.num_blocks = 10;
    kc.num_kv_heads = 1;
    kc.head_dim_qk = kc.head_dim_vo = 8;
    ak_kv_cache *c = NULL;
    ak_status st = ak_kv_cache_create(&kc, &c);
    CHECK(t, "cache create", st == AK_OK, "%s", ak_last_error());
    if (st != AK_OK) return;
    int32_t a[10], b[4];
    CHECK(t, "alloc 6", ak_kv_cache_alloc(c, 6, a) == AK_OK && ak_kv_cache_num_free(c) == 4, "free %d",
          ak_kv_cache_num_free(c));
    int distinct = 1;
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < i; j++) distinct &= a[i] != a[j];
    CHECK(t, "alloc gives distinct ids", distinct, "duplicate ids");
    st = ak_kv_cache_alloc(c, 5, b);
    CHECK(t, "out of blocks is all-or-nothing", st == AK_ERR_OUT_OF_BLOCKS && ak_kv_cache_num_free(c) == 4 &&
          strstr(ak_last_error(), "free") != NULL, "status %s free %d", ak_status_str(st), ak_kv_cache_num_free(c));
    CHECK(t, "share adds a reference", ak_kv_cache_share(c, 2, a) == AK_OK && ak_kv_cache_refcount(c, a[0]) == 2,
          "refcount %d", ak_kv_cache_refcount(c, a[0]));
    CHECK(t, "free a shared block keeps it", ak_kv_cache_free(c, 2, a) == AK_OK && ak_kv_cache_num_free(c) == 4 &&
          ak_kv_cache_refcount(c, a[0]) == 1, "free %d", ak_kv_cache_num_free(c));
    CHECK(t, "free returns blocks", ak_kv_cache_free(c, 6, a) == AK_OK && ak_kv_cache_num_free(c) == 10,
          "free %d", ak_kv_cache_num_free(c));
    st = ak_kv_cache_free(c, 1, a);
    CHECK(t, "double free is an error", st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "block_ids[0]"),
          "status %s", ak_status_str(st));
    ak_kv_cache_alloc(c, 1, b);
    const int32_t twice[2] = {b[0], b[0]};
    st = ak_kv_cache_free(c, 2, twice);
    CHECK(t, "freeing more refs than held changes nothing",
          st == AK_ERR_INVALID_ARG && ak_kv_cache_refcount(c, b[0]) == 1, "status %s", ak_status_str(st));
    const int32_t out_of_range = 10;
    st = ak_kv_cache_share(c, 1, &out_of_range);
    CHECK(t, "share out of range", st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "out of range"), "status %s",
          ak_status_str(st));
    ak_kv_cache_destroy(c);
    ak_kv_cache_destroy(NULL);

    /* num_layers 0: the allocator alone, no pools, no layer view */
    kc.num_layers = 0;
    st = ak_kv_cache_create(&kc, &c);
    CHECK(t, "allocator alone", st == AK_OK && ak_kv_cache_alloc(c, 3, a) == AK_OK && a[0] == 0 &&
          ak_kv_cache_num_free(c) == kc.num_blocks - 3, "status %s", ak_status_str(st));
    ak_paged_kv view;
    st = c ? ak_kv_cache_layer(c, 0, &view) : AK_OK;
    CHECK(t, "allocator alone has no layer", st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "num_layers = 0"),
          "status %s", ak_status_str(st));
    ak_kv_cache_destroy(c);
    kc.num_layers = -1;
    st = ak_kv_cache_create(&kc, &c);
    CHECK(t, "negative num_layers", st == AK_ERR_INVALID_ARG && !c && strstr(ak_last_error(), "cfg.num_layers"),
          "status %s", ak_status_str(st));
    /* pools past a size_t: an error, never a wrapped allocation */
    kc.num_layers = 4;
    kc.num_blocks = kc.page_size = kc.num_kv_heads = kc.head_dim_qk = kc.head_dim_vo = INT32_MAX;
    st = ak_kv_cache_create(&kc, &c);
    CHECK(t, "pools past size_t", st == AK_ERR_INVALID_ARG && !c && strstr(ak_last_error(), "overflow"),
          "status %s", ak_status_str(st));
}

static void core_meta(test_ctx *t)
{
    /* page 4: a decode on 6 keys, a chunk of 3 on 9 keys, a prefill of 4 */
    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.page_size = 4;
    const int32_t qo[4] = {0, 1, 4, 8}, kvl[3] = {6, 9, 4};
    const int32_t bt[3 * 3] = {7, 2, -1, 5, 0, 9, 3, -1, -1};
    ak_batch b;
    ak_batch_init(&b);
    b.num_reqs = 3;
    b.qo_indptr = qo;
    b.kv_lens = kvl;
    b.block_table = bt;
    b.block_table_stride = 3;
    int nt = 0, ni = 0;
    ak_status st = ak_batch_meta_sizes(&b, &cfg, NULL, &nt, &ni);
    CHECK(t, "meta sizes", st == AK_OK && nt == 8 && ni == 6, "tokens %d indices %d", nt, ni);
    int32_t qoi[4], kvi[4], idx[6], last[3], pos[8];
    int64_t slots[8];
    ak_batch_meta m = {qoi, kvi, idx, last, pos, slots, NULL};
    st = ak_batch_build_meta(&b, &cfg, NULL, &m);
    const int32_t want_kvi[4] = {0, 2, 5, 6}, want_idx[6] = {7, 2, 5, 0, 9, 3}, want_last[3] = {2, 1, 4};
    const int32_t want_pos[8] = {5, 6, 7, 8, 0, 1, 2, 3};
    const int64_t want_slots[8] = {2 * 4 + 1, 0 * 4 + 2, 0 * 4 + 3, 9 * 4 + 0, 3 * 4 + 0, 13, 14, 15};
    CHECK(t, "meta csr", st == AK_OK && !memcmp(kvi, want_kvi, sizeof kvi) && !memcmp(idx, want_idx, sizeof idx) &&
          !memcmp(last, want_last, sizeof last), "mismatch");
    CHECK(t, "meta positions and slots", !memcmp(pos, want_pos, sizeof pos) && !memcmp(slots, want_slots, sizeof slots),
          "mismatch");

    /* a window of 3 keys (window_left 2) with kv_first_block: the chunk's
     * queries (positions 6-8) see keys from 4 on, so its block 0 is left out,
     * unchecked: an id out of range there is no error; the same batch
     * without kv_first_block is refused */
    cfg.window_left = 2;
    const int32_t bt_w[3 * 3] = {7, 2, -1, -5, 0, 9, 3, -1, -1};
    b.block_table = bt_w;
    ak_limits lim;
    ak_limits_init(&lim);
    lim.num_cache_blocks = 10;
    int32_t first[3] = {-1, -1, -1};
    ak_batch_meta mw = {qoi, kvi, idx, last, pos, slots, first};
    st = ak_batch_build_meta(&b, &cfg, &lim, &mw);
    const int32_t want_wkvi[4] = {0, 2, 4, 5}, want_widx[5] = {7, 2, 0, 9, 3}, want_first[3] = {0, 1, 0};
    CHECK(t, "meta trimmed to the window", st == AK_OK && !memcmp(kvi, want_wkvi, sizeof kvi) &&
          !memcmp(idx, want_widx, sizeof want_widx) && !memcmp(first, want_first, sizeof first) &&
          !memcmp(slots, want_slots, sizeof slots), "status %s, kv_indptr %d %d %d %d, first %d %d %d",
          ak_status_str(st), kvi[0], kvi[1], kvi[2], kvi[3], first[0], first[1], first[2]);
    mw.kv_first_block = NULL;
    st = ak_batch_build_meta(&b, &cfg, &lim, &mw);
    CHECK(t, "meta untrimmed checks every block", st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "[1][0]"),
          "status %s: %s", ak_status_str(st), ak_last_error());
}

static void core_kv_update(test_ctx *t)
{
    /* HND, page 4, 2 heads of 8: write 3 tokens, one padded (-1) */
    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.num_blocks = 4;
    kc.page_size = 4;
    kc.num_kv_heads = 2;
    kc.head_dim_qk = 8;
    kc.head_dim_vo = 4;
    kc.dtype = AK_BF16;
    kc.layout = AK_LAYOUT_HND;
    ak_kv_cache *c = NULL;
    ak_kv_cache_create(&kc, &c);
    ak_paged_kv kv;
    ak_kv_cache_layer(c, 0, &kv);
    memset(kv.k_data, 0x11, 4 * 4 * 2 * 8 * 2);
    memset(kv.v_data, 0x22, 4 * 4 * 2 * 4 * 2);
    uint16_t k[3][2][8], v[3][2][4];
    uint64_t rng = t->seed;
    for (int i = 0; i < 3 * 2 * 8; i++) ((uint16_t *)k)[i] = ak_f32_to_bf16(scn_uniform(&rng));
    for (int i = 0; i < 3 * 2 * 4; i++) ((uint16_t *)v)[i] = ak_f32_to_bf16(scn_uniform(&rng));
    const int64_t slots[3] = {13, -1, 2};
    ak_tensor kt = ak_tensor_3d(k, AK_BF16, 3, 2, 8), vt = ak_tensor_3d(v, AK_BF16, 3, 2, 4);
    ak_status st = ak_kv_update(&kv, &kt, &vt, slots, 3, NULL);
    const uint16_t *kp = kv.k_data, *vp = kv.v_data;
    int ok = st == AK_OK;
    /* token 0 -> block 3 slot 1; token 2 -> block 0 slot 2 */
    for (int h = 0; h < 2; h++) {
        ok &= !memcmp(kp + ((3 * 2 + h) * 4 + 1) * 8, k[0][h], 16);
        ok &= !memcmp(vp + ((3 * 2 + h) * 4 + 1) * 4, v[0][h], 8);
        ok &= !memcmp(kp + ((0 * 2 + h) * 4 + 2) * 8, k[2][h], 16);
    }
    int untouched = 0;
    for (int i = 0; i < 4 * 4 * 2 * 8; i++) untouched += kp[i] == 0x1111;
    CHECK(t, "kv_update writes the slots, skips -1", ok && untouched == 4 * 4 * 2 * 8 - 4 * 8, "status %s, %d untouched",
          ak_status_str(st), untouched);
    ak_kv_cache_destroy(c);
}

/* cfg.marks: each layer's view carries its own zeroed marks, which
 * ak_kv_update keeps; no marks without it; a value past 0 or 1 refused. */
static void core_cache_marks(test_ctx *t)
{
    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.num_layers = 2;
    kc.num_blocks = 3;
    kc.page_size = 40; /* two words a (block, head) */
    kc.num_kv_heads = 2;
    kc.head_dim_qk = kc.head_dim_vo = 8;
    kc.dtype = AK_F32;
    ak_kv_cache *c = NULL;
    ak_paged_kv kv[2];
    kc.marks = 2;
    ak_status st = ak_kv_cache_create(&kc, &c);
    CHECK(t, "cache marks 2 refused", st == AK_ERR_INVALID_ARG && !c && strstr(ak_last_error(), "cfg.marks"),
          "status %s: %s", ak_status_str(st), ak_last_error());
    kc.marks = 0;
    st = ak_kv_cache_create(&kc, &c);
    if (st == AK_OK) st = ak_kv_cache_layer(c, 1, &kv[0]);
    CHECK(t, "cache without marks: views without", st == AK_OK && kv[0].marks == NULL, "status %s",
          ak_status_str(st));
    ak_kv_cache_destroy(c);
    c = NULL;
    kc.marks = 1;
    st = ak_kv_cache_create(&kc, &c);
    for (int l = 0; l < 2 && st == AK_OK; l++) st = ak_kv_cache_layer(c, l, &kv[l]);
    const int64_t words = ak_kv_marks_words(3, 2, 40);
    int zero = st == AK_OK && kv[0].marks && kv[1].marks && kv[0].marks != kv[1].marks && words == 12;
    for (int l = 0; l < 2 && zero; l++)
        for (int64_t i = 0; i < words; i++) zero &= kv[l].marks[i] == 0;
    CHECK(t, "cache marks: each layer's own, zeroed", zero, "status %s, words %lld", ak_status_str(st),
          (long long)words);
    if (!zero) {
        ak_kv_cache_destroy(c);
        return;
    }
    /* a NaN in head 1's V at block 2 slot 37 (word 2 x 2 x 2 + 1 x 2 + 1 = 11,
     * bit 5), in layer 1 only; then a finite rewrite clears it */
    float k[2][8], v[2][8];
    for (int i = 0; i < 16; i++) ((float *)k)[i] = ((float *)v)[i] = 0.25f * (float)i;
    v[1][3] = NAN;
    const int64_t slot = 2 * 40 + 37;
    ak_tensor kt = ak_tensor_3d(k, AK_F32, 1, 2, 8), vt = ak_tensor_3d(v, AK_F32, 1, 2, 8);
    st = ak_kv_update(&kv[1], &kt, &vt, &slot, 1, NULL);
    int set = st == AK_OK && kv[1].marks[11] == 1u << 5 && kv[0].marks[11] == 0;
    for (int64_t i = 0; i < 11; i++) set &= kv[1].marks[i] == 0;
    v[1][3] = 1.0f;
    if (set) st = ak_kv_update(&kv[1], &kt, &vt, &slot, 1, NULL);
    CHECK(t, "cache marks kept by kv_update", set && st == AK_OK && kv[1].marks[11] == 0, "status %s, word 11 %#x",
          ak_status_str(st), kv[1].marks[11]);
    ak_kv_cache_destroy(c);
}

static void core_merge(test_ctx *t)
{
    /* 3 states over 2 tokens x 2 heads x 5 dims; one state empty (-inf) for
     * token 1, every state empty for token 0 head 1 */
    enum { T = 2, S = 3, H = 2, D = 5 };
    float v[T][S][H][D], s[T][S][H], vo[T][H][D], so[T][H];
    uint64_t rng = t->seed;
    for (int i = 0; i < T * S * H * D; i++) ((float *)v)[i] = scn_uniform(&rng);
    for (int i = 0; i < T * S * H; i++) ((float *)s)[i] = 3.0f * scn_uniform(&rng);
    for (int i = 0; i < S; i++) s[0][i][1] = -INFINITY;
    s[1][2][0] = -INFINITY;
    v[1][2][0][0] = NAN; /* an empty part's output is never read */
    ak_tensor vt = ak_tensor_4d(v, AK_F32, T, S, H, D), st_ = ak_tensor_3d(s, AK_F32, T, S, H);
    ak_tensor vot = ak_tensor_3d(vo, AK_F32, T, H, D), sot = ak_tensor_2d(so, AK_F32, T, H);
    const ak_device cpu = {AK_DEVICE_CPU, 0};
    ak_status st = ak_merge_states(&vt, &st_, &vot, &sot, cpu, NULL);
    double worst = 0;
    int ok = st == AK_OK;
    for (int tt = 0; tt < T; tt++)
        for (int h = 0; h < H; h++) {
            double mx = -INFINITY, sum = 0;
            for (int i = 0; i < S; i++) mx = s[tt][i][h] > mx ? s[tt][i][h] : mx;
            for (int i = 0; i < S; i++)
                if (s[tt][i][h] != -INFINITY) sum += exp(s[tt][i][h] - mx);
            const double lse = sum > 0 ? mx + log(sum) : -INFINITY;
            if (sum == 0) {
                ok &= so[tt][h] == -INFINITY;
                for (int d = 0; d < D; d++) ok &= vo[tt][h][d] == 0.0f;
                continue;
            }
            worst = fmax(worst, fabs(so[tt][h] - lse));
            for (int d = 0; d < D; d++) {
                double acc = 0;
                for (int i = 0; i < S; i++)
                    if (s[tt][i][h] != -INFINITY) acc += exp(s[tt][i][h] - lse) * v[tt][i][h][d];
                worst = fmax(worst, fabs(vo[tt][h][d] - acc));
            }
        }
    CHECK(t, "merge_states matches the formula, empty -> 0/-inf", ok && worst < 1e-5, "status %s worst %.2e",
          ak_status_str(st), worst);
    /* a step with no tokens: empty tensors without data, as run() takes them */
    vt = ak_tensor_4d(NULL, AK_F32, 0, S, H, D);
    st_ = ak_tensor_3d(NULL, AK_F32, 0, S, H);
    vot = ak_tensor_3d(NULL, AK_F32, 0, H, D);
    sot = ak_tensor_2d(NULL, AK_F32, 0, H);
    st = ak_merge_states(&vt, &st_, &vot, &sot, cpu, NULL);
    CHECK(t, "merge_states of no tokens, no data", st == AK_OK, "status %s: %s", ak_status_str(st), ak_last_error());
    vt = ak_tensor_4d(v, AK_F32, T, S, H, D);
    st_ = ak_tensor_3d(s, AK_F32, T, S, H);
    vot = ak_tensor_3d(NULL, AK_F32, T, H, D);
    sot = ak_tensor_2d(so, AK_F32, T, H);
    st = ak_merge_states(&vt, &st_, &vot, &sot, cpu, NULL);
    CHECK(t, "merge_states: a non-empty output without data",
          st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "v_out->data is NULL"), "status %s: %s",
          ak_status_str(st), ak_last_error());
}

/* What the header promises of calls around the backends: the last failed
 * call's message outlives successful calls; a device of another kind is not
 * described as cfg's; a step whose requests have no keys needs no table. */
static void core_contracts(test_ctx *t)
{
    char buf[8192];
    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.num_qo_heads = 4;
    cfg.num_kv_heads = 2;
    ak_limits lim;
    ak_limits_init(&lim);
    float x = 1.0f;
    ak_status st = ak_convert(NULL, AK_F32, &x, AK_F32, 1);
    char said[256];
    snprintf(said, sizeof said, "%s", ak_last_error());
    ak_backend *b = NULL;
    const ak_status s1 = ak_backend_create(&cfg, &lim, "cpu_ref", &b);
    const ak_status s2 = ak_explain(&cfg, buf, sizeof buf);
    const ak_status s3 = ak_support_matrix(buf, sizeof buf);
    CHECK(t, "the last failed call's message outlives successful calls",
          st == AK_ERR_INVALID_ARG && s1 == AK_OK && s2 == AK_OK && s3 == AK_OK && said[0] &&
              !strcmp(ak_last_error(), said),
          "statuses %s %s %s %s; message \"%s\" then \"%s\"", ak_status_str(st), ak_status_str(s1),
          ak_status_str(s2), ak_status_str(s3), said, ak_last_error());

    ak_device_info dev;
    memset(&dev, 0, sizeof dev);
    dev.device.kind = AK_DEVICE_CUDA;
    dev.cc_major = 9;
    dev.num_sms = 132;
    st = ak_backend_describe("cpu", &cfg, &dev, buf, sizeof buf);
    CHECK(t, "describe: a GPU's info for a CPU config is refused",
          st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "dev->device.kind"), "status %s: %s",
          ak_status_str(st), ak_last_error());

    /* two requests without keys (padding), no block table; then one with keys */
    const int32_t qo[3] = {0, 0, 0};
    int32_t kv_lens[2] = {0, 0};
    ak_batch batch;
    ak_batch_init(&batch);
    batch.num_reqs = 2;
    batch.qo_indptr = qo;
    batch.kv_lens = kv_lens;
    st = b ? ak_backend_plan(b, &batch, NULL) : AK_ERR_INVALID_ARG;
    CHECK(t, "plan: requests without keys need no block table", st == AK_OK, "status %s: %s", ak_status_str(st),
          ak_last_error());
    kv_lens[1] = 5;
    st = b ? ak_backend_plan(b, &batch, NULL) : AK_OK;
    CHECK(t, "plan: a request with keys needs the table",
          st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "batch.block_table"), "status %s: %s",
          ak_status_str(st), ak_last_error());
    ak_backend_destroy(b);

    /* limits the metadata calls are given are checked as create() checks them:
     * a negative num_cache_blocks would let a negative block id through */
    const int32_t one_qo[2] = {0, 1}, one_kv[1] = {3}, bad_row[1] = {-7};
    batch.num_reqs = 1;
    batch.qo_indptr = one_qo;
    batch.kv_lens = one_kv;
    batch.block_table = bad_row;
    batch.block_table_stride = 1;
    cfg.page_size = 4;
    lim.num_cache_blocks = -1;
    int nt = 0, ni = 0;
    st = ak_batch_meta_sizes(&batch, &cfg, &lim, &nt, &ni);
    CHECK(t, "meta sizes check their limits", st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "limits.num_cache_blocks"),
          "status %s: %s", ak_status_str(st), ak_last_error());

    /* a cache whose pools pass INT64_MAX bytes (2^64 - 1 here, a size_t) or
     * a device that is none: refused, naming the field */
    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.mla = 1;
    kc.num_layers = 1;
    kc.dtype = AK_FP8_E4M3;
    kc.num_blocks = 6700417;
    kc.page_size = 42009217;
    kc.num_kv_heads = 255;
    kc.head_dim_qk = kc.head_dim_vo = 257;
    ak_kv_cache *cache = NULL;
    st = ak_kv_cache_create(&kc, &cache);
    CHECK(t, "kv cache of 2^64 - 1 bytes refused", st == AK_ERR_INVALID_ARG && !cache && strstr(ak_last_error(), "INT64_MAX"),
          "status %s: %s", ak_status_str(st), ak_last_error());
    ak_kv_cache_destroy(cache);
    ak_kv_cache_config_init(&kc);
    kc.device.kind = (ak_device_kind)7;
    st = ak_kv_cache_create(&kc, &cache);
    CHECK(t, "kv cache on no device kind", st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "cfg.device.kind = 7"),
          "status %s: %s", ak_status_str(st), ak_last_error());
    kc.device.kind = AK_DEVICE_CPU;
    kc.device.index = -3;
    st = ak_kv_cache_create(&kc, &cache);
    CHECK(t, "kv cache on device index -3", st == AK_ERR_INVALID_ARG && strstr(ak_last_error(), "cfg.device.index = -3"),
          "status %s: %s", ak_status_str(st), ak_last_error());

    /* AK_NUM_THREADS: a whole number, at most AK_MAX_CPU_THREADS */
    const char *was = getenv("AK_NUM_THREADS");
    char saved[64];
    snprintf(saved, sizeof saved, "%s", was ? was : "");
    setenv("AK_NUM_THREADS", "2000000000", 1);
    const int many = ak_cpu_num_threads();
    setenv("AK_NUM_THREADS", "5000x", 1); /* (atoi's 5000 is no default) */
    const int junk = ak_cpu_num_threads();
    unsetenv("AK_NUM_THREADS");
    const int dflt = ak_cpu_num_threads();
    if (was) setenv("AK_NUM_THREADS", saved, 1);
    CHECK(t, "AK_NUM_THREADS read whole and bounded", many == AK_MAX_CPU_THREADS && junk == dflt,
          "2000000000 -> %d, 5000x -> %d (default %d)", many, junk, dflt);
}

/* AK_CPU_ISA asks the cpu backend for one kernel: obeyed where it can run, an
 * error naming the variable where it cannot (never quietly the automatic one).
 * The caller's value is set again at the end: the per-kernel ctest entries
 * (CMakeLists.txt) run the later tests under it. */
static void core_cpu_isa_cases(test_ctx *t, const ak_attn_config *base, const ak_limits *lim);
static void core_cpu_isa(test_ctx *t, const ak_attn_config *base, const ak_limits *lim)
{
    char saved[32] = "";
    const char *env = getenv("AK_CPU_ISA");
    if (env) snprintf(saved, sizeof saved, "%s", env);
    core_cpu_isa_cases(t, base, lim);
    if (env) setenv("AK_CPU_ISA", saved, 1);
    else unsetenv("AK_CPU_ISA");
}

static void core_cpu_isa_cases(test_ctx *t, const ak_attn_config *base, const ak_limits *lim)
{
    ak_attn_config cfg = *base;
    cfg.device.kind = AK_DEVICE_CPU;
    cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = AK_F32;
    char buf[4096];
    ak_backend *b = NULL;
    setenv("AK_CPU_ISA", "scalar", 1);
    ak_status st = ak_backend_create(&cfg, lim, "cpu", &b);
    ak_status ex = ak_explain(&cfg, buf, sizeof buf);
    CHECK(t, "AK_CPU_ISA=scalar is obeyed", st == AK_OK && ex == AK_OK && strstr(buf, "scalar kernels"),
          "status %s / %s: %s", ak_status_str(st), ak_status_str(ex), st == AK_OK ? buf : ak_last_error());
    ak_backend_destroy(b);
    const char *bad[][2] = {{"sse9", "expected scalar, avx2, avx512, avx512bf16 or amx"},
                            {"amx", "bf16 q and K/V only"}}; /* f32 config: never the AMX kernel */
    for (int i = 0; i < 2; i++) {
        b = NULL;
        setenv("AK_CPU_ISA", bad[i][0], 1);
        st = ak_backend_create(&cfg, lim, "cpu", &b);
        char name[64];
        snprintf(name, sizeof name, "AK_CPU_ISA=%s is an error naming it", bad[i][0]);
        CHECK(t, name,
              st == AK_ERR_INVALID_ARG && b == NULL && strstr(ak_last_error(), "AK_CPU_ISA=") &&
                  strstr(ak_last_error(), bad[i][1]),
              "status %s: %s", ak_status_str(st), ak_last_error());
        ak_backend_destroy(b);
    }
    unsetenv("AK_CPU_ISA");
    /* the kernel ak_cpu_kernel_describe names (the tools' device line) is
     * the one the backend says it runs, for each dtype and AK_CPU_ISA */
    const char *isas[] = {NULL, "scalar", "avx2"};
    const ak_dtype dtypes[] = {AK_F32, AK_BF16};
    const ak_device cpu = {AK_DEVICE_CPU, 0};
    ak_device_info info;
    ak_device_get_info(cpu, &info);
    for (int i = 0; i < 3; i++)
        for (int d = 0; d < 2; d++) {
            if (isas[i]) setenv("AK_CPU_ISA", isas[i], 1);
            cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = dtypes[d];
            char kernel[256], note[512];
            const ak_status ks = ak_cpu_kernel_describe(&cfg, kernel, sizeof kernel);
            const ak_status ns = ak_backend_describe("cpu", &cfg, &info, note, sizeof note);
            const size_t isa_len = strcspn(kernel, " ");
            char name[96];
            snprintf(name, sizeof name, "cpu kernel named alike (%s, AK_CPU_ISA=%s)", ak_dtype_name(dtypes[d]),
                     isas[i] ? isas[i] : "");
            /* a CPU without AVX2 refuses AK_CPU_ISA=avx2 in both, for the same reason */
            CHECK(t, name,
                  ks == AK_OK ? ns == AK_OK && !strncmp(kernel, note, isa_len) && !strncmp(note + isa_len, " kernels", 8)
                              : !strcmp(kernel, note),
                  "ak_cpu_kernel_describe: %s \"%s\"; cpu's note: %s \"%s\"", ak_status_str(ks), kernel,
                  ak_status_str(ns), note);
            unsetenv("AK_CPU_ISA");
        }
}

static void core_selector(test_ctx *t)
{
    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.num_qo_heads = 32;
    cfg.num_kv_heads = 8;
    char buf[4096];
    unsetenv("AK_BACKEND");
    ak_status st = ak_explain(&cfg, buf, sizeof buf);
    CHECK(t, "explain names a chosen backend", st == AK_OK && strstr(buf, "chosen") && strstr(buf, "rule:"),
          "status %s: %s", ak_status_str(st), buf);
    setenv("AK_BACKEND", "cpu_ref", 1);
    ak_limits lim;
    ak_limits_init(&lim);
    ak_backend *b = NULL;
    st = ak_backend_create(&cfg, &lim, NULL, &b);
    CHECK(t, "AK_BACKEND=cpu_ref is obeyed", st == AK_OK && !strcmp(ak_backend_name(b), "cpu_ref"), "got %s",
          b ? ak_backend_name(b) : ak_last_error());
    /* run() before any plan(): the message says which case, not the status text again */
    ak_run_args no_args;
    ak_run_args_init(&no_args);
    st = b ? ak_backend_run(b, &no_args, NULL) : AK_OK;
    CHECK(t, "run() with no plan says plan() was not called",
          st == AK_ERR_NOT_PLANNED && strstr(ak_last_error(), "plan() has not been called") &&
              !strstr(ak_last_error(), ak_status_str(AK_ERR_NOT_PLANNED)),
          "status %s: %s", ak_status_str(st), ak_last_error());
    ak_backend_destroy(b);
    b = NULL;
    setenv("AK_BACKEND", "nope", 1);
    st = ak_backend_create(&cfg, &lim, NULL, &b);
    int lists = st == AK_ERR_BACKEND_NOT_FOUND && b == NULL && strstr(ak_last_error(), "AK_BACKEND=nope");
    for (int i = 0; i < ak_backend_count(); i++) lists = lists && strstr(ak_last_error(), ak_backend_name_at(i));
    CHECK(t, "AK_BACKEND=nope fails and lists every backend", lists, "status %s: %s", ak_status_str(st), ak_last_error());
    /* a name a few edits from a backend's: the message suggests it; one far
     * from every name suggests nothing */
    CHECK(t, "AK_BACKEND=nope suggests nothing", !strstr(ak_last_error(), "did you mean"), "%s", ak_last_error());
    static const struct { const char *typed, *meant; } typos[] = {
        {"cpu_rf", "cpu_ref"}, {"CPU", "cpu"}, {"cpuref", "cpu_ref"}, {"cuda_page", "cuda_paged"}};
    for (size_t i = 0; i < sizeof typos / sizeof *typos; i++) {
        char want[64];
        snprintf(want, sizeof want, "did you mean %s?", typos[i].meant);
        setenv("AK_BACKEND", typos[i].typed, 1);
        st = ak_backend_create(&cfg, &lim, NULL, &b);
        CHECK(t, "a misspelt AK_BACKEND suggests the closest name",
              st == AK_ERR_BACKEND_NOT_FOUND && strstr(ak_last_error(), want), "AK_BACKEND=%s: status %s: %s",
              typos[i].typed, ak_status_str(st), ak_last_error());
    }
    /* ak_explain prints the backends in its text: its message does not repeat them */
    setenv("AK_BACKEND", "nope", 1);
    st = ak_explain(&cfg, buf, sizeof buf);
    CHECK(t, "a failed ak_explain's message is one line",
          st == AK_ERR_BACKEND_NOT_FOUND && !strchr(ak_last_error(), '\n') && strstr(buf, "cpu_ref"),
          "status %s: %s", ak_status_str(st), ak_last_error());
    unsetenv("AK_BACKEND");
    core_cpu_isa(t, &cfg, &lim);
    /* an MLA config (DeepSeek's 576/512 absorbed rows): the cpu backend on
     * the CPU, cuda_mla where a GPU is; AK_BACKEND is obeyed for it as for
     * any other, and a backend that cannot serve it is refused by name */
    {
        ak_attn_config mc;
        ak_mla_config_init(&mc, 16, 512, 64, 0.1f);
        mc.q_dtype = mc.kv_dtype = mc.o_dtype = AK_BF16;
        mc.page_size = 64;
        ak_backend *mb = NULL;
        st = ak_backend_create(&mc, &lim, NULL, &mb);
        CHECK(t, "an MLA config on the CPU chooses cpu", st == AK_OK && !strcmp(ak_backend_name(mb), "cpu"),
              "status %s: %s", ak_status_str(st), mb ? ak_backend_name(mb) : ak_last_error());
        ak_backend_destroy(mb);
        mb = NULL;
        setenv("AK_BACKEND", "cpu_ref", 1);
        st = ak_backend_create(&mc, &lim, NULL, &mb);
        CHECK(t, "AK_BACKEND=cpu_ref is obeyed for an MLA config",
              st == AK_OK && !strcmp(ak_backend_name(mb), "cpu_ref"), "status %s: %s", ak_status_str(st),
              mb ? ak_backend_name(mb) : ak_last_error());
        ak_backend_destroy(mb);
        mb = NULL;
        unsetenv("AK_BACKEND");
        st = ak_explain(&mc, buf, sizeof buf);
        char chosen_line[64];
        snprintf(chosen_line, sizeof chosen_line, "  %-14s chosen", "cpu");
        CHECK(t, "explain of an MLA config says MLA, chooses cpu and states the chunk rule",
              st == AK_OK && strstr(buf, "MLA (V = ") && strstr(buf, chosen_line) &&
                  strstr(buf, "ak_mla_prefer_absorbed"),
              "status %s: %s", ak_status_str(st), buf);
        /* the measured line between the absorbed and the expanded form */
        CHECK(t, "ak_mla_prefer_absorbed: absorbed up to 32 new tokens, expanded beyond",
              ak_mla_prefer_absorbed(&mc, 1) == 1 && ak_mla_prefer_absorbed(&mc, AK_MLA_ABSORBED_MAX_Q_LEN) == 1 &&
                  ak_mla_prefer_absorbed(&mc, AK_MLA_ABSORBED_MAX_Q_LEN + 1) == 0 &&
                  ak_mla_prefer_absorbed(&mc, 8192) == 0 && ak_mla_prefer_absorbed(&mc, 0) == 0 &&
                  ak_mla_prefer_absorbed(&mc, -5) == 0 && ak_mla_prefer_absorbed(&cfg, 1) == 0 &&
                  ak_mla_prefer_absorbed(NULL, 1) == 0,
              "1: %d, 32: %d, 33: %d, GQA: %d", ak_mla_prefer_absorbed(&mc, 1), ak_mla_prefer_absorbed(&mc, 32),
              ak_mla_prefer_absorbed(&mc, 33), ak_mla_prefer_absorbed(&cfg, 1));
        /* on a GPU of compute capability 8.0 or later: cuda_mla; cuda_paged,
         * which serves GQA only, forced on it is refused for that reason */
        ak_device_info gi;
        mc.device.kind = AK_DEVICE_CUDA;
        if (ak_device_count(AK_DEVICE_CUDA) > 0 && ak_device_get_info(mc.device, &gi) == AK_OK && gi.cc_major >= 8) {
            st = ak_backend_create(&mc, &lim, NULL, &mb);
            CHECK(t, "an MLA config on a GPU chooses cuda_mla",
                  st == AK_OK && !strcmp(ak_backend_name(mb), "cuda_mla"), "status %s: %s", ak_status_str(st),
                  mb ? ak_backend_name(mb) : ak_last_error());
            ak_backend_destroy(mb);
            mb = NULL;
            setenv("AK_BACKEND", "cuda_paged", 1);
            st = ak_backend_create(&mc, &lim, NULL, &mb);
            CHECK(t, "AK_BACKEND=cuda_paged on an MLA config is refused, naming cuda_mla",
                  st == AK_ERR_UNSUPPORTED && mb == NULL && strstr(ak_last_error(), "served by cuda_mla"),
                  "status %s: %s", ak_status_str(st), ak_last_error());
            ak_backend_destroy(mb);
            mb = NULL;
            unsetenv("AK_BACKEND");
        }
    }
    /* a CUDA config on a machine without CUDA is an error with reasons */
    cfg.device.kind = AK_DEVICE_CUDA;
    st = ak_backend_create(&cfg, &lim, NULL, &b);
    if (ak_device_count(AK_DEVICE_CUDA) == 0)
        CHECK(t, "no CUDA device: create fails with reasons", st != AK_OK && strstr(ak_last_error(), "cpu_ref"),
              "status %s", ak_status_str(st));
    ak_backend_destroy(b);
    /* an empty plan: every request pads (q_len 0); run takes views of no memory */
    {
        ak_attn_config ec;
        ak_attn_config_init(&ec);
        ak_backend *eb = NULL;
        const int32_t qo[3] = {0, 0, 0}, kvl[2] = {5, 0}, bt[2] = {0, 0};
        ak_batch batch;
        ak_batch_init(&batch);
        batch.num_reqs = 2;
        batch.qo_indptr = qo;
        batch.kv_lens = kvl;
        batch.block_table = bt;
        batch.block_table_stride = 1;
        ak_paged_kv kv;
        memset(&kv, 0, sizeof kv);
        float pool[16 * 128];
        kv.k_data = kv.v_data = pool;
        kv.dtype = AK_F32;
        kv.num_blocks = lim.num_cache_blocks;
        kv.page_size = 16;
        kv.num_kv_heads = 1;
        kv.head_dim_qk = kv.head_dim_vo = 128;
        ak_tensor q = ak_tensor_3d(NULL, AK_F32, 0, 1, 128), o = ak_tensor_3d(NULL, AK_F32, 0, 1, 128);
        ak_run_args a;
        ak_run_args_init(&a);
        a.q = &q;
        a.kv = &kv;
        a.o = &o;
        ak_status es = ak_backend_create(&ec, &lim, NULL, &eb);
        if (es == AK_OK) es = ak_backend_plan(eb, &batch, NULL);
        if (es == AK_OK) es = ak_backend_run(eb, &a, NULL);
        CHECK(t, "empty plan runs with NULL views", es == AK_OK && ak_backend_planned_tokens(eb) == 0,
              "status %s: %s", ak_status_str(es), ak_last_error());
        ak_backend_destroy(eb);
    }
    CHECK(t, "status strings", !strcmp(ak_status_str(AK_OK), "ok") && strlen(ak_status_str(AK_ERR_CUDA)) > 0,
          "bad strings");
}

void test_core(test_ctx *t)
{
    if (t->device.kind != AK_DEVICE_CPU) return; /* device-independent: once, in the CPU run */
    core_dtypes(t);
    core_allocator(t);
    core_meta(t);
    core_kv_update(t);
    core_cache_marks(t);
    core_merge(t);
    core_selector(t);
    core_contracts(t);
}
