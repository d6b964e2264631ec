/*
 * fuzz_merge.c - ak_merge_states with fuzzed states: sizes (empty ones too),
 * the state axis anywhere in memory (fuzzed strides), dtypes, lse values from
 * -inf / NaN / +inf / finite, and v holding a NaN or an infinity now and
 * then. The result must follow the formula (computed here in fp64) and the
 * rule of attnkit.h: a NaN or +inf lse, or a non-finite element in the v of
 * a non-empty state, makes the row NaN; empty states (lse -inf) are never
 * read; every state empty gives o = 0, lse = -inf. Outputs sit between
 * guard bytes.
 */
#include "fuzz_common.h"

enum { MAX_T = 3, MAX_S = 6, MAX_H = 3, MAX_D = 20 };

/* A strided 4-D or 3-D layout of `shape` in some order of its dims, with
 * optional padding; returns the elements the buffer needs. */
static int64_t fuzz_layout(fz *f, int ndim, const int64_t *shape, int64_t *stride)
{
    int order[4] = {0, 1, 2, 3};
    for (int i = ndim - 1; i > 0; i--) { /* a fuzzed permutation, innermost last */
        const int j = (int)fz_int(f, 0, i);
        const int x = order[i];
        order[i] = order[j];
        order[j] = x;
    }
    int64_t acc = 1;
    for (int k = ndim - 1; k >= 0; k--) {
        const int d = order[k];
        stride[d] = acc;
        acc *= (shape[d] > 0 ? shape[d] : 1) + (fz_rare(f, 4) ? fz_int(f, 1, 3) : 0);
    }
    return acc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    uint64_t rng = fz_u32(&f, 4);
    const int64_t T = fz_int(&f, 0, MAX_T), S = fz_int(&f, 0, MAX_S), H = fz_int(&f, 0, MAX_H), D = fz_int(&f, 0, MAX_D);
    static const ak_dtype dtypes[] = {AK_F32, AK_F16, AK_BF16};
    const ak_dtype vdt = FZ_PICK(&f, dtypes), odt = FZ_PICK(&f, dtypes);

    const int64_t v_shape[4] = {T, S, H, D}, s_shape[3] = {T, S, H}, vo_shape[3] = {T, H, D}, so_shape[2] = {T, H};
    ak_tensor v = ak_tensor_4d(NULL, vdt, T, S, H, D), s = ak_tensor_3d(NULL, AK_F32, T, S, H);
    ak_tensor vo = ak_tensor_3d(NULL, odt, T, H, D), so = ak_tensor_2d(NULL, AK_F32, T, H);
    const int64_t v_n = fuzz_layout(&f, 4, v_shape, v.stride), s_n = fuzz_layout(&f, 3, s_shape, s.stride);
    const int64_t vo_n = fuzz_layout(&f, 3, vo_shape, vo.stride), so_n = fuzz_layout(&f, 2, so_shape, so.stride);
    const size_t ves = ak_dtype_size(vdt), oes = ak_dtype_size(odt);
    v.data = malloc(ves * (size_t)v_n);
    s.data = malloc(sizeof(float) * (size_t)s_n);
    gbuf vob, sob;
    vo.data = gbuf_alloc(&vob, oes * (size_t)vo_n);
    so.data = gbuf_alloc(&sob, sizeof(float) * (size_t)so_n);
    memset(vo.data, 0xff, vob.bytes);
    memset(so.data, 0xff, sob.bytes);
    rnd_fill(v.data, vdt, v_n, 1.0f, &rng);
    float *sp = s.data;
    for (int64_t i = 0; i < s_n; i++) {
        const int kind = (int)fz_int(&f, 0, 31);
        sp[i] = kind == 0 ? -INFINITY : kind == 1 ? NAN : kind == 2 ? INFINITY : 20.0f * rnd_unit(&rng);
        if (kind == 3) sp[i] = -INFINITY; /* empty states are common */
    }
    for (int k = fz_rare(&f, 3) ? (int)fz_int(&f, 1, 3) : 0; k > 0 && v_n > 0; k--) {
        static const float bad[] = {NAN, INFINITY, -INFINITY};
        ak_store_from_f32(v.data, vdt, (int64_t)(rnd_next(&rng) % (uint64_t)v_n), FZ_PICK(&f, bad));
    }
    const int with_s_out = !fz_rare(&f, 4);
    const ak_device cpu = {AK_DEVICE_CPU, 0};
    const ak_status st = ak_merge_states(&v, &s, &vo, with_s_out ? &so : NULL, cpu, NULL);
    FZ_CHECK(st == AK_OK,
             "merge of T %lld S %lld H %lld D %lld: %s (%s)", (long long)T, (long long)S, (long long)H, (long long)D,
             ak_status_str(st), ak_last_error());
    FZ_CHECK(gbuf_guards_ok(&vob) && gbuf_guards_ok(&sob), "a write outside the outputs");

    const double tol = odt == AK_F32 ? 3e-5 : odt == AK_F16 ? 2e-3 : 1.6e-2;
    for (int64_t t = 0; st == AK_OK && t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            /* the formula in fp64, and the rule */
            double mx = -INFINITY;
            int bad = 0;
            for (int64_t i = 0; i < S; i++) {
                const float l = sp[t * s.stride[0] + i * s.stride[1] + h * s.stride[2]];
                bad |= isnan(l) || l == INFINITY;
                if (l > mx) mx = l;
                for (int64_t d = 0; d < D && l != -INFINITY; d++)
                    bad |= !isfinite(ak_load_as_f32(v.data, vdt, t * v.stride[0] + i * v.stride[1] + h * v.stride[2] +
                                                                     d * v.stride[3]));
            }
            double sum = 0;
            for (int64_t i = 0; i < S && !bad; i++) {
                const float l = sp[t * s.stride[0] + i * s.stride[1] + h * s.stride[2]];
                if (l != -INFINITY) sum += exp(l - mx);
            }
            const double lse = bad ? NAN : sum > 0 ? mx + log(sum) : -INFINITY;
            if (with_s_out) {
                const float got = ((float *)so.data)[t * so.stride[0] + h * so.stride[1]];
                FZ_CHECK(bad ? isnan(got) : lse == -INFINITY ? got == -INFINITY : fabs(got - lse) <= 1e-5 * (1 + fabs(lse)),
                         "lse[%lld][%lld] = %g, want %g", (long long)t, (long long)h, got, lse);
            }
            for (int64_t d = 0; d < D; d++) {
                double want = 0;
                for (int64_t i = 0; i < S && !bad && sum > 0; i++) {
                    const float l = sp[t * s.stride[0] + i * s.stride[1] + h * s.stride[2]];
                    if (l != -INFINITY)
                        want += exp(l - lse) * ak_load_as_f32(v.data, vdt, t * v.stride[0] + i * v.stride[1] +
                                                                               h * v.stride[2] + d * v.stride[3]);
                }
                const float got = ak_load_as_f32(vo.data, odt, t * vo.stride[0] + h * vo.stride[1] + d * vo.stride[2]);
                FZ_CHECK(bad ? isnan(got) : fabs(got - want) <= tol, "o[%lld][%lld][%lld] = %g, want %g", (long long)t,
                         (long long)h, (long long)d, got, bad ? NAN : want);
            }
        }
    free(v.data);
    free(s.data);
    gbuf_free(&vob);
    gbuf_free(&sob);
    return 0;
}
