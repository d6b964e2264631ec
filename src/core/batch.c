/*
 * batch.c - ak_batch -> kernel metadata (CSR page lists, positions, slot
 * mapping), with validation that names the offending field.
 *
 * Validation runs to completion before anything is written, so a rejected
 * batch leaves the caller's arrays (and a backend's static buffers) untouched.
 */
#include "internal.h"
#include "visible.h"

#include <string.h>

/* 1 if every id of row[0, n) is in [0, num_blocks). One unsigned compare per
 * id, OR-reduced without an early exit so the compiler vectorizes it: plan()
 * checks every block id of the batch (65536 of them at batch 256 x 4096 keys)
 * and its host time is budgeted in tens of microseconds. */
static int row_in_range(const int32_t *row, int n, int32_t num_blocks)
{
    uint32_t bad = 0;
    for (int i = 0; i < n; i++) bad |= (uint32_t)row[i] >= (uint32_t)num_blocks;
    return bad == 0;
}

/* The first block of a request any of its queries sees: the block of the
 * first query's window start (the queries' windows slide right), 0 without a
 * window or when trimming is off. */
static int first_block(const ak_attn_config *cfg, int trim, int q_len, int kv_len)
{
    if (!trim || cfg->window_left < 0 || q_len <= 0 || kv_len <= 0) return 0;
    return ak_visible_lo(kv_len - q_len, cfg->window_left) / cfg->page_size;
}

/* The block table the host reads: block_table, or a device_block_table of
 * a CPU config (host memory); NULL for a device table on a GPU. */
static const int32_t *host_table(const ak_batch *b, const ak_attn_config *cfg)
{
    if (b->block_table) return b->block_table;
    return cfg->device.kind == AK_DEVICE_CPU ? b->device_block_table : NULL;
}

int ak_batch_table_on_device(const ak_batch *b, const ak_attn_config *cfg)
{
    return b && b->struct_size == sizeof *b && cfg->kv_storage == AK_KV_PAGED && !b->block_table &&
           b->device_block_table && cfg->device.kind != AK_DEVICE_CPU;
}

/* 1 if some request of b has keys (b->kv_lens must be non-NULL: validate checks it first) */
static int any_keys(const ak_batch *b)
{
    for (int r = 0; r < b->num_reqs; r++)
        if (b->kv_lens[r] > 0) return 1;
    return 0;
}

/* Everything the metadata needs, checked (trim: only the blocks some query
 * sees). Returns the totals. */
static ak_status validate(const ak_batch *b, const ak_attn_config *cfg, const ak_limits *lim, int trim,
                          int *num_tokens, int64_t *num_kv_indices)
{
    if (!b) return ak_set_error(AK_ERR_INVALID_ARG, "batch is NULL");
    if (b->struct_size != sizeof *b)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "batch.struct_size = %u, expected %zu (call ak_batch_init)",
                            b->struct_size, sizeof *b);
    if (b->num_reqs < 0)
        return ak_set_error(AK_ERR_INVALID_ARG, "batch.num_reqs = %d is negative", b->num_reqs);
    if (lim && b->num_reqs > lim->max_reqs)
        return ak_set_error(AK_ERR_LIMIT_EXCEEDED, "batch.num_reqs = %d exceeds limits.max_reqs = %d",
                            b->num_reqs, lim->max_reqs);
    if (!b->qo_indptr) return ak_set_error(AK_ERR_INVALID_ARG, "batch.qo_indptr is NULL");
    if (b->num_reqs > 0 && !b->kv_lens)
        return ak_set_error(AK_ERR_INVALID_ARG, "batch.kv_lens is NULL");
    if (b->qo_indptr[0] != 0)
        return ak_set_error(AK_ERR_INVALID_ARG, "batch.qo_indptr[0] = %d, must be 0",
                            b->qo_indptr[0]);

    const int paged = cfg->kv_storage == AK_KV_PAGED;
    /* a batch whose requests have no keys reads no table entry: it may give none */
    if (paged && b->num_reqs > 0 && (b->block_table || b->device_block_table || any_keys(b))) {
        if (!b->block_table && !b->device_block_table)
            return ak_set_error(AK_ERR_INVALID_ARG, "batch.block_table is NULL (and so is batch.device_block_table)");
        if (b->block_table && b->device_block_table)
            return ak_set_error(AK_ERR_INVALID_ARG,
                                "batch.block_table and batch.device_block_table are both set: give one of them");
        if (b->block_table_stride <= 0)
            return ak_set_error(AK_ERR_INVALID_ARG, "batch.block_table_stride = %d must be positive",
                                b->block_table_stride);
        /* a device table's rows are found by r x stride in int32 (the kernels' page_base) */
        if (!b->block_table && (int64_t)b->num_reqs * b->block_table_stride > INT32_MAX)
            return ak_set_error(AK_ERR_LIMIT_EXCEEDED,
                                "batch.device_block_table of batch.num_reqs = %d rows of batch.block_table_stride = "
                                "%d entries is above INT32_MAX entries",
                                b->num_reqs, b->block_table_stride);
    }
    const int32_t *table = paged ? host_table(b, cfg) : NULL;

    const int32_t num_blocks = lim ? lim->num_cache_blocks : INT32_MAX;
    int64_t tokens = 0, indices = 0, kv_rows = 0;
    for (int r = 0; r < b->num_reqs; r++) {
        const int32_t lo = b->qo_indptr[r], hi = b->qo_indptr[r + 1];
        if (hi < lo)
            return ak_set_error(AK_ERR_INVALID_ARG,
                                "batch.qo_indptr is not monotone: qo_indptr[%d] = %d < "
                                "qo_indptr[%d] = %d",
                                r + 1, hi, r, lo);
        const int q_len = hi - lo;
        const int kv_len = b->kv_lens[r];
        if (kv_len < 0)
            return ak_set_error(AK_ERR_INVALID_ARG, "batch.kv_lens[%d] = %d is negative", r, kv_len);
        if (kv_len > AK_MAX_LEN)
            return ak_set_error(AK_ERR_LIMIT_EXCEEDED, "batch.kv_lens[%d] = %d is above AK_MAX_LEN = %d", r,
                                kv_len, AK_MAX_LEN);
        if (cfg->workload == AK_WORKLOAD_DECODE && q_len > 1)
            return ak_set_error(AK_ERR_INVALID_ARG,
                                "batch q_len of request %d (qo_indptr[%d] - qo_indptr[%d] = %d) "
                                "is not 1, but cfg.workload is decode",
                                r, r + 1, r, q_len);
        if (cfg->causal && q_len > kv_len)
            return ak_set_error(AK_ERR_INVALID_ARG,
                                "batch q_len of request %d (qo_indptr[%d] - qo_indptr[%d] = %d) "
                                "exceeds batch.kv_lens[%d] = %d",
                                r, r + 1, r, q_len, r, kv_len);
        tokens += q_len;
        if (lim && tokens > lim->max_tokens)
            return ak_set_error(AK_ERR_LIMIT_EXCEEDED,
                                "batch query tokens (qo_indptr[%d] = %d) exceed limits.max_tokens = %d",
                                r + 1, hi, lim->max_tokens);
        if (tokens > AK_MAX_LEN)
            return ak_set_error(AK_ERR_LIMIT_EXCEEDED,
                                "batch query tokens (qo_indptr[%d] = %d) are above AK_MAX_LEN = %d", r + 1, hi,
                                AK_MAX_LEN);
        if (!paged) {
            /* ragged: kv_indptr, in rows, is int32 and kernels add a tile to it */
            kv_rows += kv_len;
            if (kv_rows > AK_MAX_LEN)
                return ak_set_error(AK_ERR_LIMIT_EXCEEDED,
                                    "batch.kv_lens[%d] = %d brings the sum of kv_lens (the ragged K/V rows) to "
                                    "%lld, above AK_MAX_LEN = %d",
                                    r, kv_len, (long long)kv_rows, AK_MAX_LEN);
            continue;
        }
        const int need = ak_ceil_div(kv_len, cfg->page_size);
        if (need > 0 && need > b->block_table_stride)
            return ak_set_error(AK_ERR_INVALID_ARG,
                                "batch.kv_lens[%d] = %d needs %d blocks of %d but "
                                "batch.block_table_stride = %d",
                                r, kv_len, need, cfg->page_size, b->block_table_stride);
        if (lim && need > lim->max_blocks_per_req)
            return ak_set_error(AK_ERR_LIMIT_EXCEEDED,
                                "batch.kv_lens[%d] = %d needs %d blocks, above "
                                "limits.max_blocks_per_req = %d",
                                r, kv_len, need, lim->max_blocks_per_req);
        const int first = first_block(cfg, trim && table, q_len, kv_len);
        const int32_t *row = table ? table + (int64_t)r * b->block_table_stride : NULL;
        if (row && !row_in_range(row + first, need - first, num_blocks)) {
            /* the slow path, only to name the first bad entry */
            for (int i = first; i < need; i++)
                if (row[i] < 0 || row[i] >= num_blocks)
                    return ak_set_error(AK_ERR_INVALID_ARG,
                                        "batch.%s[%d][%d] = %d is out of range [0, %d) "
                                        "(limits.num_cache_blocks)",
                                        b->block_table ? "block_table" : "device_block_table", r, i, row[i],
                                        num_blocks);
        }
        indices += need - first;
        /* kv_indptr, in blocks, is int32 */
        if (indices > INT32_MAX)
            return ak_set_error(AK_ERR_LIMIT_EXCEEDED,
                                "batch.kv_lens[%d] = %d brings the blocks of the batch to %lld, above INT32_MAX",
                                r, kv_len, (long long)indices);
    }
    *num_tokens = (int)tokens;
    *num_kv_indices = indices;
    return AK_OK;
}

ak_status ak_batch_meta_sizes(const ak_batch *batch, const ak_attn_config *cfg,
                              const ak_limits *lim, int *num_tokens, int *num_kv_indices)
{
    AK_TRY(ak_config_validate(cfg));
    if (lim) AK_TRY(ak_limits_validate(lim));
    int tokens = 0;
    int64_t indices = 0;
    AK_TRY(validate(batch, cfg, lim, 0, &tokens, &indices));
    if (num_tokens) *num_tokens = tokens;
    if (num_kv_indices) *num_kv_indices = (int)indices;
    return AK_OK;
}

ak_status ak_batch_build_meta(const ak_batch *b, const ak_attn_config *cfg, const ak_limits *lim,
                              ak_batch_meta *meta)
{
    AK_TRY(ak_config_validate(cfg));
    if (lim) AK_TRY(ak_limits_validate(lim));
    int tokens = 0;
    int64_t indices = 0;
    if (!meta) return ak_set_error(AK_ERR_INVALID_ARG, "meta is NULL");
    const int trim = meta->kv_first_block != NULL;
    AK_TRY(validate(b, cfg, lim, trim, &tokens, &indices));
    if (!meta->qo_indptr || !meta->kv_indptr)
        return ak_set_error(AK_ERR_INVALID_ARG, "meta.%s is NULL",
                            meta->qo_indptr ? "kv_indptr" : "qo_indptr");

    const int paged = cfg->kv_storage == AK_KV_PAGED;
    const int page = cfg->page_size;
    const int32_t *table = paged ? host_table(b, cfg) : NULL;
    if (paged && !table && any_keys(b) && (meta->kv_indices || meta->slot_mapping))
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "meta.%s is set, but batch.device_block_table is device memory, which the host does "
                            "not read: pass NULL (a backend reads the table in place)",
                            meta->kv_indices ? "kv_indices" : "slot_mapping");
    meta->qo_indptr[0] = 0;
    meta->kv_indptr[0] = 0;
    int32_t kv_acc = 0;
    for (int r = 0; r < b->num_reqs; r++) {
        const int q_lo = b->qo_indptr[r], q_len = b->qo_indptr[r + 1] - q_lo;
        const int kv_len = b->kv_lens[r];
        meta->qo_indptr[r + 1] = b->qo_indptr[r + 1];
        if (!paged) {
            kv_acc += kv_len;
            meta->kv_indptr[r + 1] = kv_acc;
            if (trim) meta->kv_first_block[r] = 0;
        } else {
            const int need = ak_ceil_div(kv_len, page);
            const int first = first_block(cfg, trim && table, q_len, kv_len);
            const int32_t *row = table ? table + (int64_t)r * b->block_table_stride : NULL;
            if (meta->kv_indices && need > first)
                memcpy(meta->kv_indices + kv_acc, row + first, sizeof(int32_t) * (need - first));
            if (trim) meta->kv_first_block[r] = first;
            kv_acc += need - first;
            meta->kv_indptr[r + 1] = kv_acc;
            if (meta->kv_last_page_len)
                meta->kv_last_page_len[r] = kv_len == 0 ? 0 : kv_len - (need - 1) * page;
        }
        for (int i = 0; i < q_len; i++) {
            /* the new tokens are the last q_len of the kv_len keys */
            const int pos = kv_len - q_len + i;
            if (meta->positions) meta->positions[q_lo + i] = pos;
            if (meta->slot_mapping) {
                int64_t slot = -1; /* a non-causal query beyond its keys has no slot */
                if (paged && pos >= 0) {
                    const int32_t *row = table + (int64_t)r * b->block_table_stride;
                    slot = (int64_t)row[pos / page] * page + pos % page;
                }
                meta->slot_mapping[q_lo + i] = slot;
            }
        }
    }
    return AK_OK;
}
