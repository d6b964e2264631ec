/*
 * fuzz_kv_update.c - ak_kv_update with fuzzed views (sizes, layout, dtype,
 * block strides: packed, padded, below a block, negative, huge), fuzzed new
 * rows (strides that overlap, skip, or break the rules) and fuzzed slots
 * (in range, -1, out of range). The target decides on its own whether the
 * call is valid: a valid call must succeed and leave the pools exactly as a
 * plain model of the scatter says; any other must fail and change nothing.
 * The pools are exactly as large as the view says (or a small stand-in when
 * the view is invalid) and sit between guard bytes; ASan watches the reads
 * of k, v and slot_mapping. Half the views carry finiteness marks (exactly
 * ak_kv_marks_words() words between guards, now and then misaligned: an
 * error), whose every bit must end as the model's: a written slot's from
 * the rows stored there, any other as it was.
 */
#include "fuzz_common.h"

enum { MAX_BLOCKS = 12, MAX_PAGE = 8, MAX_HEADS = 4, MAX_DIM = 40, MAX_TOKENS = 12 };

typedef struct rows {
    ak_tensor t;
    void *mem;
    int valid;
} rows;

/* New rows [tokens, heads, dim] with fuzzed strides, in a buffer that holds
 * exactly what the strides address. */
static rows fuzz_rows(fz *f, ak_dtype dt, int tokens, int heads, int dim, uint64_t *rng)
{
    rows r;
    int64_t s2 = 1, s1 = dim, s0 = (int64_t)heads * dim;
    switch (fz_int(f, 0, 7)) {
    case 0: s1 += fz_int(f, 1, 5), s0 = (int64_t)heads * s1 + fz_int(f, 0, 3); break; /* padded rows */
    case 1: s0 = 0; break;                                                           /* one token for all */
    case 2: s1 = 0; break;                                                           /* one head for all */
    case 3: s2 = fz_int(f, 0, 2); break;                                             /* inner stride not 1 */
    case 4: s0 = -s0; break;                                                         /* negative */
    default: break;
    }
    r.t = ak_tensor_3d(NULL, dt, tokens, heads, dim);
    r.t.stride[0] = s0, r.t.stride[1] = s1, r.t.stride[2] = s2;
    if (fz_rare(f, 16)) r.t.shape[fz_int(f, 0, 2)] += 1; /* the wrong shape */
    r.valid = s2 == 1 && s0 >= 0 && s1 >= 0 && r.t.shape[0] == tokens && r.t.shape[1] == heads &&
              r.t.shape[2] == dim;
    int64_t extent = 1;
    for (int i = 0; i < 3; i++)
        if (r.t.shape[i] > 0 && r.t.stride[i] > 0) extent += (r.t.shape[i] - 1) * r.t.stride[i];
    const size_t esz = ak_dtype_size(dt) ? ak_dtype_size(dt) : 4;
    r.mem = malloc(esz * (size_t)extent);
    for (size_t i = 0; i < esz * (size_t)extent; i++) ((unsigned char *)r.mem)[i] = (unsigned char)rnd_next(rng);
    r.t.data = r.mem;
    if (fz_rare(f, 32)) r.t.data = NULL, r.valid &= tokens == 0;
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    uint64_t rng = fz_u32(&f, 4);
    static const ak_dtype dtypes[] = {AK_F32, AK_F16, AK_BF16, AK_BF16, AK_FP8_E4M3, (ak_dtype)9};
    ak_paged_kv kv;
    memset(&kv, 0, sizeof kv);
    kv.dtype = fz_rare(&f, 8) ? FZ_PICK(&f, dtypes) : FZ_PICK(&f, dtypes) == AK_F32 ? AK_F32 : AK_BF16;
    kv.layout = fz_rare(&f, 32) ? (ak_kv_layout)2 : fz_rare(&f, 2) ? AK_LAYOUT_HND : AK_LAYOUT_NHD;
    kv.device.kind = AK_DEVICE_CPU;
    kv.num_blocks = (int)fz_int(&f, 1, MAX_BLOCKS);
    kv.page_size = (int)fz_int(&f, 1, MAX_PAGE);
    kv.num_kv_heads = (int)fz_int(&f, 1, MAX_HEADS);
    kv.head_dim_qk = (int)fz_int(&f, 1, MAX_DIM);
    kv.head_dim_vo = fz_rare(&f, 2) ? (int)fz_int(&f, 1, MAX_DIM) : kv.head_dim_qk;
    if (fz_rare(&f, 32)) kv.page_size = (int)fz_int(&f, -2, 0);
    if (fz_rare(&f, 32)) kv.num_kv_heads = (int)fz_int(&f, -2, 0);
    const int64_t kb = (int64_t)kv.page_size * kv.num_kv_heads * kv.head_dim_qk;
    const int64_t vb = (int64_t)kv.page_size * kv.num_kv_heads * kv.head_dim_vo;
    const size_t esz = ak_dtype_size(kv.dtype) ? ak_dtype_size(kv.dtype) : 4;
    int64_t *strides[2] = {&kv.k_block_stride, &kv.v_block_stride};
    const int64_t blocks[2] = {kb, vb};
    for (int i = 0; i < 2; i++) {
        switch (fz_int(&f, 0, 7)) {
        case 0: *strides[i] = blocks[i] + fz_int(&f, 1, 9); break; /* padded */
        case 1: *strides[i] = blocks[i] - fz_int(&f, 1, 3); break; /* below a block */
        case 2: *strides[i] = -blocks[i] * fz_int(&f, 1, 2); break;
        case 3: *strides[i] = fz_rare(&f, 2) ? INT64_MIN : INT64_MAX / 2; break; /* past int64 bytes */
        default: *strides[i] = fz_rare(&f, 2) ? blocks[i] : 0; break;
        }
    }
    const int sizes_ok = kv.page_size > 0 && kv.num_kv_heads > 0;
    const int dtype_ok = kv.dtype == AK_F32 || kv.dtype == AK_F16 || kv.dtype == AK_BF16 || kv.dtype == AK_FP8_E4M3;
    int view_ok = sizes_ok && dtype_ok && (kv.layout == AK_LAYOUT_NHD || kv.layout == AK_LAYOUT_HND);
    /* a K-only view (MLA's latent rows): no V pool, v_block_stride 0, the
     * value (the first head_dim_vo of each K row) no wider than K; the call
     * takes no v (now and then one anyway: an error) */
    const int k_only = fz_rare(&f, 6);
    const int give_v = !k_only || fz_rare(&f, 16);
    if (k_only) view_ok &= *strides[1] == 0 && kv.head_dim_vo <= kv.head_dim_qk && !give_v;
    for (int i = 0; i < 2 - k_only; i++) {
        /* the last block's end, in bytes, must be int64 */
        int64_t span, bytes;
        view_ok &= *strides[i] == 0 || *strides[i] >= blocks[i];
        view_ok &= !__builtin_mul_overflow((int64_t)(kv.num_blocks - 1), *strides[i] ? *strides[i] : blocks[i], &span) &&
                   !__builtin_add_overflow(span, blocks[i], &span) &&
                   !__builtin_mul_overflow(span, (int64_t)esz, &bytes);
    }

    /* A valid view may address more than this process can hold (a stride of
     * INT64_MAX / 2 over one-byte fp8 elements): it keeps its strides and is
     * cut to one block, so the call still validates them and every slot still
     * lands in memory the target owns. */
    if (view_ok) {
        const int64_t cap = (int64_t)1 << 24;
        for (int i = 0; i < 2; i++)
            if (*strides[i] && kv.num_blocks > 1 && *strides[i] > cap / (int64_t)esz / (kv.num_blocks - 1))
                kv.num_blocks = 1;
    }

    /* the pools: what the view addresses, or a stand-in for an invalid view */
    gbuf kp, vp;
    const int64_t k_elems = view_ok ? (kv.num_blocks - 1) * (kv.k_block_stride ? kv.k_block_stride : kb) + kb : 64;
    const int64_t v_elems = view_ok ? (kv.num_blocks - 1) * (kv.v_block_stride ? kv.v_block_stride : vb) + vb : 64;
    kv.k_data = gbuf_alloc(&kp, esz * (size_t)k_elems);
    kv.v_data = gbuf_alloc(&vp, esz * (size_t)v_elems);
    for (size_t i = 0; i < kp.bytes; i++) ((unsigned char *)kv.k_data)[i] = (unsigned char)rnd_next(&rng);
    for (size_t i = 0; i < vp.bytes; i++) ((unsigned char *)kv.v_data)[i] = (unsigned char)rnd_next(&rng);
    if (k_only) kv.v_data = NULL;
    else if (fz_rare(&f, 32)) kv.v_data = NULL, view_ok = 0;
    gbuf mp;
    memset(&mp, 0, sizeof mp);
    const int with_marks = fz_rare(&f, 2);
    const int64_t words = with_marks && view_ok ? ak_kv_marks_words(kv.num_blocks, kv.num_kv_heads, kv.page_size) : 4;
    const int64_t mark_w = view_ok ? (kv.page_size + 31) / 32 : 1; /* a (block, head)'s words */
    if (with_marks) {
        kv.marks = gbuf_alloc(&mp, sizeof(uint32_t) * (size_t)words);
        for (size_t i = 0; i < mp.bytes; i++) ((unsigned char *)kv.marks)[i] = (unsigned char)rnd_next(&rng);
        if (fz_rare(&f, 16)) kv.marks = (uint32_t *)((char *)kv.marks + 2), view_ok = 0; /* misaligned */
    }

    /* the new rows and their slots */
    const int tokens = (int)fz_int(&f, 0, MAX_TOKENS);
    const int heads = kv.num_kv_heads > 0 ? kv.num_kv_heads : 1;
    rows k = fuzz_rows(&f, kv.dtype, tokens, heads, kv.head_dim_qk, &rng);
    rows v = fuzz_rows(&f, kv.dtype, tokens, heads, kv.head_dim_vo, &rng);
    const int64_t num_slots = sizes_ok ? (int64_t)kv.num_blocks * kv.page_size : 1;
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)(tokens + 1));
    int slots_ok = 1;
    for (int i = 0; i < tokens; i++) {
        const int kind = (int)fz_int(&f, 0, 15);
        slots[i] = kind == 0 ? -1 : kind == 1 ? num_slots + fz_int(&f, 0, 3) : kind == 2 ? -2 - fz_int(&f, 0, 3)
                                                                                       : fz_int(&f, 0, num_slots - 1);
        slots_ok &= slots[i] >= -1 && slots[i] < num_slots;
    }
    const int valid = view_ok && k.valid && (v.valid || !give_v) && slots_ok;

    /* the model: the pools before, and after a valid call */
    const size_t k_all = kp.bytes + 2 * FZ_GUARD, v_all = vp.bytes + 2 * FZ_GUARD;
    unsigned char *k_before = malloc(k_all), *v_before = malloc(v_all), *k_want = malloc(k_all), *v_want = malloc(v_all);
    memcpy(k_before, kp.raw, k_all);
    memcpy(v_before, vp.raw, v_all);
    memcpy(k_want, kp.raw, k_all);
    memcpy(v_want, vp.raw, v_all);
    const size_t m_all = with_marks ? mp.bytes + 2 * FZ_GUARD : 1;
    unsigned char *m_before = malloc(m_all), *m_want = malloc(m_all);
    if (with_marks) memcpy(m_before, mp.raw, m_all), memcpy(m_want, mp.raw, m_all);
    for (int i = 0; valid && i < tokens; i++) {
        if (slots[i] < 0) continue;
        const int64_t block = slots[i] / kv.page_size, s = slots[i] % kv.page_size;
        for (int h = 0; h < heads; h++) {
            const int64_t row = kv.layout == AK_LAYOUT_NHD ? s * heads + h : (int64_t)h * kv.page_size + s;
            const int64_t kbase = block * (kv.k_block_stride ? kv.k_block_stride : kb) + row * kv.head_dim_qk;
            const int64_t vbase = block * (kv.v_block_stride ? kv.v_block_stride : vb) + row * kv.head_dim_vo;
            memcpy(k_want + FZ_GUARD + kbase * (int64_t)esz,
                   (char *)k.mem + (i * k.t.stride[0] + h * k.t.stride[1]) * (int64_t)esz, esz * (size_t)kv.head_dim_qk);
            if (!k_only)
                memcpy(v_want + FZ_GUARD + vbase * (int64_t)esz,
                       (char *)v.mem + (i * v.t.stride[0] + h * v.t.stride[1]) * (int64_t)esz, esz * (size_t)kv.head_dim_vo);
            if (!with_marks) continue;
            /* the slot's bit, from the rows now stored there (a later token
             * of the same slot overwrites both) */
            int bad = 0;
            for (int d = 0; d < kv.head_dim_qk; d++)
                bad |= !isfinite(ak_load_as_f32(k_want + FZ_GUARD + kbase * (int64_t)esz, kv.dtype, d));
            for (int d = 0; d < kv.head_dim_vo && !k_only; d++)
                bad |= !isfinite(ak_load_as_f32(v_want + FZ_GUARD + vbase * (int64_t)esz, kv.dtype, d));
            uint32_t *w = (uint32_t *)(m_want + FZ_GUARD) + (block * heads + h) * mark_w + s / 32;
            *w = bad ? *w | 1u << (s % 32) : *w & ~(1u << (s % 32));
        }
    }

    const int null_slots = fz_rare(&f, 64);
    const ak_status st = ak_kv_update(&kv, &k.t, give_v ? &v.t : NULL, null_slots ? NULL : slots, tokens, NULL);
    /* a NULL slot_mapping is an error only when there are tokens to place */
    const int want_ok = valid && !(null_slots && tokens > 0);
    FZ_CHECK((st == AK_OK) == want_ok, "status %s (%s), the model says %s (view %d, k %d, v %d, slots %d)",
             ak_status_str(st), st ? ak_last_error() : "", want_ok ? "ok" : "an error", view_ok, k.valid, v.valid,
             slots_ok);
    FZ_CHECK(!memcmp(kp.raw, st == AK_OK ? k_want : k_before, k_all) && gbuf_guards_ok(&kp),
             "the K pool or its guards differ from the model (status %s)", ak_status_str(st));
    FZ_CHECK(!memcmp(vp.raw, st == AK_OK ? v_want : v_before, v_all) && gbuf_guards_ok(&vp),
             "the V pool or its guards differ from the model (status %s)", ak_status_str(st));
    FZ_CHECK(!with_marks || (!memcmp(mp.raw, st == AK_OK ? m_want : m_before, m_all) && gbuf_guards_ok(&mp)),
             "the marks or their guards differ from the model (status %s)", ak_status_str(st));
    if (with_marks) gbuf_free(&mp);
    free(m_before);
    free(m_want);
    gbuf_free(&kp);
    gbuf_free(&vp);
    free(k_before);
    free(v_before);
    free(k_want);
    free(v_want);
    free(k.mem);
    free(v.mem);
    free(slots);
    return 0;
}
