/*
 * kv_cache.c - the paged KV cache: per-layer K and V pools and one block
 * allocator (free stack + reference counts) shared by all layers. An MLA
 * cache (cfg.mla) has K pools only: the value is part of each K row.
 *
 * The allocator may be called from several threads at once (an engine's
 * scheduler and its workers): one mutex guards the free stack and the counts.
 * It is held for the length of one call, never across the kernel path (run()
 * reads block ids from the plan, not from the cache).
 */
#define _POSIX_C_SOURCE 200809L /* pthread mutexes under -std=c11 */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct ak_kv_cache {
    ak_kv_cache_config cfg;
    void **k_pools;     /* [num_layers] each [num_blocks, block elements] */
    void **v_pools;     /* [num_layers]; NULLs for an MLA cache */
    uint32_t **marks;   /* [num_layers] finiteness marks (cfg.marks), or NULLs */
    int32_t *refcount;  /* [num_blocks]; 0 = free */
    int32_t *free_ids;  /* [num_blocks] stack of free block ids */
    int num_free;
    pthread_mutex_t lock; /* guards refcount, free_ids and num_free */
    int lock_made;
};

void ak_kv_cache_config_init(ak_kv_cache_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
    cfg->num_layers = 1;
    cfg->num_blocks = 1024;
    cfg->page_size = 16;
    cfg->num_kv_heads = 8;
    cfg->head_dim_qk = 128;
    cfg->head_dim_vo = 128;
    cfg->dtype = AK_F16;
    cfg->layout = AK_LAYOUT_NHD;
    cfg->device.kind = AK_DEVICE_CPU;
}

static ak_status validate_cfg(const ak_kv_cache_config *c)
{
    if (!c) return ak_set_error(AK_ERR_INVALID_ARG, "kv cache cfg is NULL");
    if (c->struct_size != sizeof *c)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "cfg.struct_size = %u, expected %zu (call ak_kv_cache_config_init)",
                            c->struct_size, sizeof *c);
#define AK_POSITIVE_(field)                                                    \
    if (c->field <= 0)                                                         \
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg." #field " = %d must be positive", c->field);
    if (c->num_layers < 0)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "cfg.num_layers = %d must be 0 (the block allocator alone) or more",
                            c->num_layers);
    AK_POSITIVE_(num_blocks)
    AK_POSITIVE_(page_size)
    AK_POSITIVE_(num_kv_heads)
    AK_POSITIVE_(head_dim_qk)
    AK_POSITIVE_(head_dim_vo)
#undef AK_POSITIVE_
    if (ak_dtype_size(c->dtype) == 0)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.dtype = %d is not a dtype", (int)c->dtype);
    if (c->layout != AK_LAYOUT_NHD && c->layout != AK_LAYOUT_HND)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.layout = %d is not a layout", c->layout);
    if (c->mla != 0 && c->mla != 1) return ak_set_error(AK_ERR_INVALID_ARG, "cfg.mla = %d must be 0 or 1", c->mla);
    if (c->marks != 0 && c->marks != 1)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.marks = %d must be 0 or 1", c->marks);
    if (c->mla && c->head_dim_vo > c->head_dim_qk)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "cfg.head_dim_vo = %d is above cfg.head_dim_qk = %d: with cfg.mla = 1 the value is the "
                            "first head_dim_vo values of each K row",
                            c->head_dim_vo, c->head_dim_qk);
    if (c->device.kind != AK_DEVICE_CPU && c->device.kind != AK_DEVICE_CUDA)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.device.kind = %d is not a device kind", (int)c->device.kind);
    if (c->device.index < 0)
        return ak_set_error(AK_ERR_INVALID_ARG, "cfg.device.index = %d is negative", c->device.index);
    /* one pool's bytes, and all layers' K and V pools together, must be a
     * size_t and an int64 (the views address a pool in int64 bytes) */
    size_t bytes = ak_dtype_size(c->dtype), all;
    const int dim = c->head_dim_qk > c->head_dim_vo ? c->head_dim_qk : c->head_dim_vo;
    const int dims[] = {c->num_blocks, c->page_size, c->num_kv_heads, dim};
    int over = 0;
    for (int i = 0; i < 4; i++) over |= __builtin_mul_overflow(bytes, (size_t)dims[i], &bytes);
    const int pools = c->mla ? 1 : 2;
    over |= bytes > (size_t)INT64_MAX || __builtin_mul_overflow(bytes, (size_t)c->num_layers * pools, &all) ||
            all > (size_t)INT64_MAX;
    size_t mark_bytes; /* (cfg.marks: each layer's words) */
    const int64_t words = ak_kv_marks_words(c->num_blocks, c->num_kv_heads, c->page_size);
    over |= words < 0 || __builtin_mul_overflow((size_t)words, sizeof(uint32_t) * (size_t)c->num_layers, &mark_bytes);
    if (over)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "cfg: num_layers %d x %d pools of num_blocks %d x page_size %d x num_kv_heads %d x "
                            "head dim %d elements overflow INT64_MAX bytes",
                            c->num_layers, pools, c->num_blocks, c->page_size, c->num_kv_heads, dim);
    return AK_OK;
}

ak_status ak_kv_cache_create(const ak_kv_cache_config *cfg, ak_kv_cache **out)
{
    if (!out) return ak_set_error(AK_ERR_INVALID_ARG, "out is NULL");
    *out = NULL;
    AK_TRY(validate_cfg(cfg));
    if (ak_device_count(cfg->device.kind) <= cfg->device.index)
        return ak_set_error(AK_ERR_NO_DEVICE, "cfg.device: no %s device %d (cfg.device.index)",
                            cfg->device.kind == AK_DEVICE_CUDA ? "CUDA" : "CPU", cfg->device.index);

    ak_kv_cache *c = calloc(1, sizeof *c);
    if (!c) return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate the cache object");
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot make the allocator's mutex");
    }
    c->lock_made = 1;
    c->cfg = *cfg;
    /* num_layers 0: the allocator alone (the engine owns its pools) */
    c->k_pools = calloc((size_t)cfg->num_layers + 1, sizeof(void *));
    c->v_pools = calloc((size_t)cfg->num_layers + 1, sizeof(void *));
    c->marks = calloc((size_t)cfg->num_layers + 1, sizeof(uint32_t *));
    c->refcount = calloc((size_t)cfg->num_blocks, sizeof(int32_t));
    c->free_ids = malloc(sizeof(int32_t) * (size_t)cfg->num_blocks);
    if (!c->k_pools || !c->v_pools || !c->marks || !c->refcount || !c->free_ids) {
        ak_kv_cache_destroy(c);
        return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate %d blocks of bookkeeping",
                            cfg->num_blocks);
    }
    const size_t esz = ak_dtype_size(cfg->dtype);
    const size_t rows = (size_t)cfg->num_blocks * cfg->page_size * cfg->num_kv_heads;
    /* (validate_cfg: the words' bytes are a size_t) */
    const size_t words = (size_t)ak_kv_marks_words(cfg->num_blocks, cfg->num_kv_heads, cfg->page_size);
    for (int l = 0; l < cfg->num_layers; l++) {
        ak_status s = ak_dev_malloc(cfg->device, rows * cfg->head_dim_qk * esz, &c->k_pools[l]);
        if (s == AK_OK && !cfg->mla) s = ak_dev_malloc(cfg->device, rows * cfg->head_dim_vo * esz, &c->v_pools[l]);
        if (s == AK_OK && cfg->marks) s = ak_dev_calloc(cfg->device, words * sizeof(uint32_t), (void **)&c->marks[l]);
        if (s != AK_OK) {
            ak_kv_cache_destroy(c);
            return s;
        }
    }
    /* the stack pops low ids first, so a fresh cache hands out 0, 1, 2, ... */
    for (int i = 0; i < cfg->num_blocks; i++) c->free_ids[i] = cfg->num_blocks - 1 - i;
    c->num_free = cfg->num_blocks;
    *out = c;
    return AK_OK;
}

void ak_kv_cache_destroy(ak_kv_cache *c)
{
    if (!c) return;
    for (int l = 0; c->k_pools && l < c->cfg.num_layers; l++) ak_dev_free(c->cfg.device, c->k_pools[l]);
    for (int l = 0; c->v_pools && l < c->cfg.num_layers; l++) ak_dev_free(c->cfg.device, c->v_pools[l]);
    for (int l = 0; c->marks && l < c->cfg.num_layers; l++) ak_dev_free(c->cfg.device, c->marks[l]);
    free(c->k_pools);
    free(c->v_pools);
    free(c->marks);
    free(c->refcount);
    free(c->free_ids);
    if (c->lock_made) pthread_mutex_destroy(&c->lock);
    free(c);
}

ak_status ak_kv_cache_layer(const ak_kv_cache *c, int layer, ak_paged_kv *view)
{
    if (!c || !view) return ak_set_error(AK_ERR_INVALID_ARG, "%s is NULL", c ? "view" : "cache");
    if (c->cfg.num_layers == 0)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "layer = %d: the cache was made with num_layers = 0 (the block "
                            "allocator alone) and holds no pools",
                            layer);
    if (layer < 0 || layer >= c->cfg.num_layers)
        return ak_set_error(AK_ERR_INVALID_ARG, "layer = %d is out of range [0, %d)", layer,
                            c->cfg.num_layers);
    memset(view, 0, sizeof *view);
    view->k_data = c->k_pools[layer];
    view->v_data = c->v_pools[layer]; /* NULL for MLA: a K-only view */
    view->dtype = c->cfg.dtype;
    view->layout = c->cfg.layout;
    view->device = c->cfg.device;
    view->num_blocks = c->cfg.num_blocks;
    view->page_size = c->cfg.page_size;
    view->num_kv_heads = c->cfg.num_kv_heads;
    view->head_dim_qk = c->cfg.head_dim_qk;
    view->head_dim_vo = c->cfg.head_dim_vo;
    view->marks = c->marks[layer]; /* NULL without cfg.marks */
    return AK_OK;
}

/* ---- block allocator ----------------------------------------------------- */

/* The mutex lives in the object, which is never const underneath: readers
 * that take a const cache lock it too. */
static void lock(const ak_kv_cache *c) { pthread_mutex_lock((pthread_mutex_t *)&c->lock); }
static void unlock(const ak_kv_cache *c) { pthread_mutex_unlock((pthread_mutex_t *)&c->lock); }

/* Every id of ids[0, n) names a block of the cache. */
static ak_status check_ids(const ak_kv_cache *c, int n, const int32_t *ids)
{
    if (!c) return ak_set_error(AK_ERR_INVALID_ARG, "cache is NULL");
    if (n < 0) return ak_set_error(AK_ERR_INVALID_ARG, "n = %d is negative", n);
    if (n > 0 && !ids) return ak_set_error(AK_ERR_INVALID_ARG, "block_ids is NULL");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->cfg.num_blocks)
            return ak_set_error(AK_ERR_INVALID_ARG, "block_ids[%d] = %d is out of range [0, %d)", i,
                                ids[i], c->cfg.num_blocks);
    return AK_OK;
}

/* How often ids[0, i] name ids[i]. */
static int times_named(const int32_t *ids, int i)
{
    int times = 0;
    for (int j = 0; j <= i; j++) times += ids[j] == ids[i];
    return times;
}

ak_status ak_kv_cache_alloc(ak_kv_cache *c, int n, int32_t *ids)
{
    if (!c) return ak_set_error(AK_ERR_INVALID_ARG, "cache is NULL");
    if (n < 0) return ak_set_error(AK_ERR_INVALID_ARG, "n = %d is negative", n);
    if (n > 0 && !ids) return ak_set_error(AK_ERR_INVALID_ARG, "block_ids is NULL");
    lock(c);
    if (n > c->num_free) {
        const int num_free = c->num_free;
        unlock(c);
        return ak_set_error(AK_ERR_OUT_OF_BLOCKS, "asked for %d blocks, only %d of %d are free", n, num_free,
                            c->cfg.num_blocks);
    }
    for (int i = 0; i < n; i++) {
        const int32_t id = c->free_ids[--c->num_free];
        c->refcount[id] = 1;
        ids[i] = id;
    }
    unlock(c);
    return AK_OK;
}

/* share and free change the counts as they go and undo this call's changes
 * when an id fails, so a rejected list changes nothing: one pass, whatever
 * the length of the list. */

static ak_status share_locked(ak_kv_cache *c, int n, const int32_t *ids)
{
    for (int i = 0; i < n; i++) {
        const int32_t id = ids[i];
        if (c->refcount[id] == 0 || c->refcount[id] == INT32_MAX) {
            const int32_t held = c->refcount[id];
            for (int j = 0; j < i; j++) c->refcount[ids[j]]--;
            if (held == 0)
                return ak_set_error(AK_ERR_INVALID_ARG, "block_ids[%d] = %d is not allocated", i, id);
            return ak_set_error(AK_ERR_INVALID_ARG,
                                "block_ids[%d] = %d would have more than INT32_MAX = %d references (%d before "
                                "this call)",
                                i, id, INT32_MAX, INT32_MAX - (times_named(ids, i) - 1));
        }
        c->refcount[id]++;
    }
    return AK_OK;
}

static ak_status free_locked(ak_kv_cache *c, int n, const int32_t *ids)
{
    const int free_before = c->num_free;
    for (int i = 0; i < n; i++) {
        const int32_t id = ids[i];
        if (c->refcount[id] == 0) {
            /* not allocated, or named more often than it has references */
            const int times = times_named(ids, i);
            c->num_free = free_before;
            for (int j = 0; j < i; j++) c->refcount[ids[j]]++;
            if (times == 1) return ak_set_error(AK_ERR_INVALID_ARG, "block_ids[%d] = %d is not allocated", i, id);
            return ak_set_error(AK_ERR_INVALID_ARG, "block_ids[%d] = %d is freed %d times but has %d references", i,
                                id, times, times - 1);
        }
        /* a block goes back to the pool once, when its count reaches 0 */
        if (--c->refcount[id] == 0) c->free_ids[c->num_free++] = id;
    }
    return AK_OK;
}

ak_status ak_kv_cache_share(ak_kv_cache *c, int n, const int32_t *ids)
{
    AK_TRY(check_ids(c, n, ids));
    lock(c);
    const ak_status st = share_locked(c, n, ids);
    unlock(c);
    return st;
}

ak_status ak_kv_cache_free(ak_kv_cache *c, int n, const int32_t *ids)
{
    AK_TRY(check_ids(c, n, ids));
    lock(c);
    const ak_status st = free_locked(c, n, ids);
    unlock(c);
    return st;
}

int ak_kv_cache_num_free(const ak_kv_cache *c)
{
    if (!c) return 0;
    lock(c);
    const int n = c->num_free;
    unlock(c);
    return n;
}

int ak_kv_cache_refcount(const ak_kv_cache *c, int32_t id)
{
    if (!c || id < 0 || id >= c->cfg.num_blocks) return -1;
    lock(c);
    const int refs = c->refcount[id];
    unlock(c);
    return refs;
}

ak_status ak_kv_cache_debug_set_refcount(ak_kv_cache *c, int32_t id, int32_t refs)
{
    AK_TRY(check_ids(c, 1, &id));
    lock(c);
    const int32_t held = c->refcount[id];
    if (held != 0 && refs >= 1) c->refcount[id] = refs;
    unlock(c);
    if (held == 0 || refs < 1)
        return ak_set_error(AK_ERR_INVALID_ARG, "block %d has %d references, refs = %d: only an allocated block's "
                            "count may be set, to 1 or more", id, held, refs);
    return AK_OK;
}
