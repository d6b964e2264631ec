/*
 * fuzz_alloc.c - sequences of ak_kv_cache_alloc / share / free (and the count
 * readers) checked against a model: a reference count per block. Every call
 * must succeed exactly when the model says it may, alloc must hand out only
 * blocks the model has free (distinct), and after every call, failed ones
 * included (which change nothing), the cache's counts and free total must
 * equal the model's. Lists name blocks out of range, twice, not allocated;
 * counts are pushed to INT32_MAX through ak_kv_cache_debug_set_refcount so
 * the overflow edge of share is reached.
 */
#include "fuzz_common.h"
#include "internal.h" /* ak_kv_cache_debug_set_refcount */

enum { MAX_BLOCKS = 40, MAX_LIST = 12, MAX_OPS = 64 };

typedef struct model {
    int num_blocks;
    int64_t refs[MAX_BLOCKS];
} model;

static int model_free(const model *m)
{
    int n = 0;
    for (int b = 0; b < m->num_blocks; b++) n += m->refs[b] == 0;
    return n;
}

static void check_same(const ak_kv_cache *c, const model *m, const char *after)
{
    FZ_CHECK(ak_kv_cache_num_free(c) == model_free(m), "after %s: %d free, the model %d", after,
             ak_kv_cache_num_free(c), model_free(m));
    for (int b = 0; b < m->num_blocks; b++)
        FZ_CHECK(ak_kv_cache_refcount(c, b) == m->refs[b], "after %s: block %d has %d references, the model %lld",
                 after, b, ak_kv_cache_refcount(c, b), (long long)m->refs[b]);
    FZ_CHECK(ak_kv_cache_refcount(c, -1) == -1 && ak_kv_cache_refcount(c, m->num_blocks) == -1,
             "refcount of an id out of range");
}

/* A list of ids: mostly blocks in use, some free, some out of range. */
static int fuzz_list(fz *f, const model *m, int32_t *ids)
{
    const int n = (int)fz_int(f, 0, MAX_LIST);
    for (int i = 0; i < n; i++) {
        const int kind = (int)fz_int(f, 0, 15);
        if (kind == 0) ids[i] = fz_rare(f, 2) ? -1 - (int32_t)fz_int(f, 0, 3) : m->num_blocks + (int32_t)fz_int(f, 0, 3);
        else if (kind == 1 && i > 0) ids[i] = ids[fz_int(f, 0, i - 1)]; /* named twice */
        else ids[i] = (int32_t)fz_int(f, 0, m->num_blocks - 1);
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.num_blocks = (int)fz_int(&f, 1, MAX_BLOCKS);
    kc.page_size = 1;
    kc.num_kv_heads = 1;
    kc.head_dim_qk = kc.head_dim_vo = 1;
    ak_kv_cache *c = NULL;
    FZ_CHECK(ak_kv_cache_create(&kc, &c) == AK_OK, "create: %s", ak_last_error());
    model m;
    memset(&m, 0, sizeof m);
    m.num_blocks = kc.num_blocks;
    int32_t ids[MAX_BLOCKS + MAX_LIST];
    const int ops = (int)fz_int(&f, 1, MAX_OPS);
    for (int op = 0; op < ops; op++) {
        switch (fz_int(&f, 0, 4)) {
        case 0: { /* alloc */
            const int n = (int)fz_int(&f, -1, m.num_blocks + 1);
            const ak_status st = ak_kv_cache_alloc(c, n, ids);
            const ak_status want = n < 0 ? AK_ERR_INVALID_ARG : n > model_free(&m) ? AK_ERR_OUT_OF_BLOCKS : AK_OK;
            FZ_CHECK(st == want, "alloc %d with %d free: %s, want %s", n, model_free(&m), ak_status_str(st),
                     ak_status_str(want));
            for (int i = 0; st == AK_OK && i < n; i++) {
                FZ_CHECK(ids[i] >= 0 && ids[i] < m.num_blocks && m.refs[ids[i]] == 0,
                         "alloc handed out block %d, which is not free", ids[i]);
                m.refs[ids[i]] = 1; /* a second copy in this list fails the check above */
            }
            check_same(c, &m, "alloc");
            break;
        }
        case 1: { /* share */
            const int n = fuzz_list(&f, &m, ids);
            int ok = 1;
            int64_t add[MAX_BLOCKS] = {0};
            for (int i = 0; i < n; i++) {
                if (ids[i] < 0 || ids[i] >= m.num_blocks || m.refs[ids[i]] == 0) {
                    ok = 0;
                    continue;
                }
                ok &= m.refs[ids[i]] + ++add[ids[i]] <= INT32_MAX;
            }
            const ak_status st = ak_kv_cache_share(c, n, ids);
            FZ_CHECK((st == AK_OK) == ok, "share of %d ids: %s (%s), the model says %s", n, ak_status_str(st),
                     ak_last_error(), ok ? "ok" : "an error");
            for (int b = 0; ok && b < m.num_blocks; b++) m.refs[b] += add[b];
            check_same(c, &m, "share");
            break;
        }
        case 2: { /* free */
            const int n = fuzz_list(&f, &m, ids);
            int ok = 1;
            int64_t sub[MAX_BLOCKS] = {0};
            for (int i = 0; i < n; i++) {
                if (ids[i] < 0 || ids[i] >= m.num_blocks) {
                    ok = 0;
                    continue;
                }
                ok &= ++sub[ids[i]] <= m.refs[ids[i]];
            }
            const ak_status st = ak_kv_cache_free(c, n, ids);
            FZ_CHECK((st == AK_OK) == ok, "free of %d ids: %s (%s), the model says %s", n, ak_status_str(st),
                     ak_last_error(), ok ? "ok" : "an error");
            for (int b = 0; ok && b < m.num_blocks; b++) m.refs[b] -= sub[b];
            check_same(c, &m, "free");
            break;
        }
        case 3: { /* a count near the top, to reach share's overflow check */
            const int32_t b = (int32_t)fz_int(&f, 0, m.num_blocks - 1);
            const int32_t refs = INT32_MAX - (int32_t)fz_int(&f, 0, 3);
            const ak_status st = ak_kv_cache_debug_set_refcount(c, b, refs);
            FZ_CHECK((st == AK_OK) == (m.refs[b] != 0), "set_refcount of block %d: %s", b, ak_status_str(st));
            if (st == AK_OK) m.refs[b] = refs;
            check_same(c, &m, "set_refcount");
            break;
        }
        default: { /* bad arguments: NULL lists, negative counts */
            const int n = (int)fz_int(&f, -2, 2);
            FZ_CHECK(ak_kv_cache_share(c, n, n > 0 ? NULL : ids) != AK_OK || n == 0, "share of NULL or n < 0");
            FZ_CHECK(ak_kv_cache_free(c, n, n > 0 ? NULL : ids) != AK_OK || n == 0, "free of NULL or n < 0");
            FZ_CHECK(ak_kv_cache_alloc(NULL, 1, ids) == AK_ERR_INVALID_ARG, "alloc on a NULL cache");
            check_same(c, &m, "bad arguments");
            break;
        }
        }
    }
    ak_kv_cache_destroy(c);
    return 0;
}
