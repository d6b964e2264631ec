/*
 * scene_core.h - what attnkit-test (tests/harness.c) and attnkit-bench
 * (tools/bench_scene.c) both need to make a batch real on a device: random
 * values, device memory on the CPU or a CUDA GPU, a batch with its block
 * table of shuffled block ids, the paged cache behind it, and the keys each
 * query sees (for the bench's accounting). Built on the public API only.
 *
 * Every function that can fail prints nothing and returns -1 (or NULL); the
 * caller says what it was doing.
 */
#ifndef AK_SCENE_CORE_H
#define AK_SCENE_CORE_H

#include "attnkit.h"

#include <stddef.h>
#include <stdint.h>

/* ---- random: splitmix64 ---------------------------------------------------- */

uint64_t scn_rng_next(uint64_t *s);
float scn_uniform(uint64_t *s);            /* [-1, 1) from the top 24 bits: exact in f32 */
int scn_rng_int(uint64_t *s, int lo, int hi); /* [lo, hi] */
void scn_shuffle_i32(uint64_t *s, int32_t *a, int n);
uint64_t scn_name_hash(const char *s);     /* FNV-1a: a seed per name that survives ASLR */

/* ---- device memory --------------------------------------------------------- */
/* Host memory (64-byte aligned) for the CPU, device memory for CUDA. Copies
 * and memsets go on `stream` (a cudaStream_t, NULL = the legacy stream) and
 * have completed when they return. */

void *scn_alloc(ak_device dev, size_t bytes);
void scn_free(ak_device dev, void *p); /* accepts NULL */
int scn_upload(ak_device dev, void *stream, void *dst, const void *src, size_t bytes);   /* host -> dev */
int scn_download(ak_device dev, void *stream, void *dst, const void *src, size_t bytes); /* dev -> host */
int scn_memset(ak_device dev, void *stream, void *dst, int byte, size_t bytes);
/* Waits for all work on the device (a fault of an earlier kernel surfaces here). */
int scn_sync(ak_device dev);
/* The last CUDA error's text, for a caller's message ("" on the CPU). */
const char *scn_last_device_error(void);

/* ---- the batch ------------------------------------------------------------- */

/* Request r has q_lens[r] new tokens among kv_lens[r] keys. Block ids are
 * 0 .. num_blocks - 1 in shuffled order, each request taking the next
 * ceil(kv_len / page_size) of them; the rest of its block-table row holds
 * an id no cache has (never read), and the ids past every request's are
 * spare blocks a wrong id would read. */
typedef struct scn_batch {
    int num_reqs, num_tokens;
    int64_t num_kv_tokens;
    int32_t *qo_indptr;   /* [num_reqs + 1] */
    int32_t *kv_lens;     /* [num_reqs] */
    int32_t *block_table; /* [num_reqs, bt_stride]; NULL for ragged K/V (page_size 0) */
    int bt_stride;
    int num_blocks;       /* blocks of a pool that holds the batch */
    ak_batch batch;       /* pointing at the arrays above */
    ak_limits lim;        /* exactly this batch: requests, tokens, blocks per row, blocks */
} scn_batch;

/* The garbage id in the unused entries of block-table rows. */
#define SCN_UNUSED_BLOCK (-7)
/* Blocks past every request's when num_blocks is left to the batch. */
#define SCN_SPARE_BLOCKS 5

/* Builds b from the lengths. page_size 0: ragged K/V, no block table.
 * bt_stride / num_blocks 0: what the batch needs (one unused column, and
 * SCN_SPARE_BLOCKS spare blocks); a caller that keeps one cache and one set
 * of limits over several batches passes its own. Returns 0 or -1 (out of
 * memory, or a stride / block count too small for the batch). */
int scn_batch_build(scn_batch *b, int num_reqs, const int32_t *q_lens, const int32_t *kv_lens, int page_size,
                    int bt_stride, int num_blocks, uint64_t *rng);
void scn_batch_free(scn_batch *b);

/* ---- the cache ------------------------------------------------------------- */

/* num_layers pools of num_blocks blocks shaped for cfg (its heads, head dims,
 * kv dtype, layout, page size, device; K pools alone for cfg.mla), every block allocated, as an
 * engine's running requests hold them. Returns 0, or -1 with ak_last_error. */
int scn_cache_create(const ak_attn_config *cfg, int num_layers, int num_blocks, ak_kv_cache **out);

/* ---- accounting ------------------------------------------------------------ */

/* The keys [*lo, *hi] the query at position pos of a request of kv_len keys
 * sees (empty when *hi < *lo), as attnkit.h states the rule. */
void scn_visible(const ak_attn_config *c, int kv_len, int pos, int *lo, int *hi);

#endif /* AK_SCENE_CORE_H */
