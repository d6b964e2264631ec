/*
 * scene_core.c - random values, device memory, batches and caches for the
 * test harness and the bench. See scene_core.h.
 */
#include "scene_core.h"

#include <stdlib.h>
#include <string.h>

#ifdef AK_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- random ------------------------------------------------------------------- */

uint64_t scn_rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float scn_uniform(uint64_t *s) { return (float)((double)(scn_rng_next(s) >> 40) * (2.0 / 16777216.0) - 1.0); }

int scn_rng_int(uint64_t *s, int lo, int hi) { return lo + (int)(scn_rng_next(s) % (uint64_t)(hi - lo + 1)); }

void scn_shuffle_i32(uint64_t *s, int32_t *a, int n)
{
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)(scn_rng_next(s) % (uint64_t)(i + 1));
        const int32_t x = a[i];
        a[i] = a[j];
        a[j] = x;
    }
}

uint64_t scn_name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* ---- device memory ---------------------------------------------------------------- */

/* Host allocations are whole cache lines (and aligned AVX-512 rows). */
#define HOST_ALIGN 64

#ifdef AK_HAVE_CUDA
static int on_gpu(ak_device dev) { return dev.kind == AK_DEVICE_CUDA; }
#endif

void *scn_alloc(ak_device dev, size_t bytes)
{
    const size_t n = bytes ? bytes : 1;
#ifdef AK_HAVE_CUDA
    if (on_gpu(dev)) {
        void *p = NULL;
        return cudaMalloc(&p, n) == cudaSuccess ? p : NULL;
    }
#endif
    (void)dev;
    return aligned_alloc(HOST_ALIGN, (n + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN);
}

void scn_free(ak_device dev, void *p)
{
    if (!p) return;
#ifdef AK_HAVE_CUDA
    if (on_gpu(dev)) {
        cudaFree(p);
        return;
    }
#endif
    (void)dev;
    free(p);
}

/* On the GPU every copy goes on the caller's stream and is waited for: a
 * non-blocking stream is not ordered with a legacy-stream cudaMemcpy (and a
 * pageable H2D cudaMemcpy may return before its DMA is done). */
#ifdef AK_HAVE_CUDA
static int gpu_copy(void *stream, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    cudaStream_t s = (cudaStream_t)stream;
    return cudaMemcpyAsync(dst, src, bytes, kind, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess
               ? 0
               : -1;
}
#endif

int scn_upload(ak_device dev, void *stream, void *dst, const void *src, size_t bytes)
{
#ifdef AK_HAVE_CUDA
    if (on_gpu(dev)) return gpu_copy(stream, dst, src, bytes, cudaMemcpyHostToDevice);
#endif
    (void)dev;
    (void)stream;
    memcpy(dst, src, bytes);
    return 0;
}

int scn_download(ak_device dev, void *stream, void *dst, const void *src, size_t bytes)
{
#ifdef AK_HAVE_CUDA
    if (on_gpu(dev)) return gpu_copy(stream, dst, src, bytes, cudaMemcpyDeviceToHost);
#endif
    (void)dev;
    (void)stream;
    memcpy(dst, src, bytes);
    return 0;
}

int scn_memset(ak_device dev, void *stream, void *dst, int byte, size_t bytes)
{
#ifdef AK_HAVE_CUDA
    if (on_gpu(dev)) {
        cudaStream_t s = (cudaStream_t)stream;
        return cudaMemsetAsync(dst, byte, bytes, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess ? 0
                                                                                                             : -1;
    }
#endif
    (void)dev;
    (void)stream;
    memset(dst, byte, bytes);
    return 0;
}

int scn_sync(ak_device dev)
{
#ifdef AK_HAVE_CUDA
    /* the whole device: the library may also have used another stream */
    if (on_gpu(dev)) return cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
#endif
    (void)dev;
    return 0;
}

const char *scn_last_device_error(void)
{
#ifdef AK_HAVE_CUDA
    return cudaGetErrorString(cudaGetLastError());
#else
    return "";
#endif
}

/* ---- the batch ---------------------------------------------------------------------- */

static int blocks_for(int kv_len, int page_size) { return (kv_len + page_size - 1) / page_size; }

int scn_batch_build(scn_batch *b, int num_reqs, const int32_t *q_lens, const int32_t *kv_lens, int page_size,
                    int bt_stride, int num_blocks, uint64_t *rng)
{
    memset(b, 0, sizeof *b);
    const int R = num_reqs;
    b->num_reqs = R;
    b->qo_indptr = calloc((size_t)R + 1, sizeof(int32_t));
    b->kv_lens = calloc((size_t)R + 1, sizeof(int32_t));
    if (!b->qo_indptr || !b->kv_lens) goto fail;
    int64_t tokens = 0, needed = 0;
    int widest = 1;
    for (int r = 0; r < R; r++) {
        tokens += q_lens[r];
        if (tokens > INT32_MAX) goto fail;
        b->qo_indptr[r + 1] = (int32_t)tokens;
        b->kv_lens[r] = kv_lens[r];
        b->num_kv_tokens += kv_lens[r];
        if (page_size > 0) {
            const int need = blocks_for(kv_lens[r], page_size);
            needed += need;
            if (need > widest) widest = need;
        }
    }
    b->num_tokens = (int)tokens;

    ak_batch_init(&b->batch);
    b->batch.num_reqs = R;
    b->batch.qo_indptr = b->qo_indptr;
    b->batch.kv_lens = b->kv_lens;
    ak_limits_init(&b->lim);
    b->lim.max_reqs = R > 0 ? R : 1;
    b->lim.max_tokens = b->num_tokens > 0 ? b->num_tokens : 1;
    if (page_size <= 0) {
        b->lim.num_cache_blocks = 1;
        return 0;
    }

    b->bt_stride = bt_stride > 0 ? bt_stride : widest + 1;
    b->num_blocks = num_blocks > 0 ? num_blocks : (int)(needed + SCN_SPARE_BLOCKS);
    if (b->bt_stride < widest || b->num_blocks < needed || needed + SCN_SPARE_BLOCKS > INT32_MAX) goto fail;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)b->num_blocks);
    b->block_table = malloc(sizeof(int32_t) * ((size_t)R * b->bt_stride + 1));
    if (!ids || !b->block_table) {
        free(ids);
        goto fail;
    }
    for (int i = 0; i < b->num_blocks; i++) ids[i] = i;
    scn_shuffle_i32(rng, ids, b->num_blocks);
    int next = 0;
    for (int r = 0; r < R; r++) {
        const int need = blocks_for(kv_lens[r], page_size);
        for (int i = 0; i < b->bt_stride; i++)
            b->block_table[(int64_t)r * b->bt_stride + i] = i < need ? ids[next++] : SCN_UNUSED_BLOCK;
    }
    free(ids);
    b->batch.block_table = b->block_table;
    b->batch.block_table_stride = b->bt_stride;
    b->lim.max_blocks_per_req = widest;
    b->lim.num_cache_blocks = b->num_blocks;
    return 0;
fail:
    scn_batch_free(b);
    return -1;
}

void scn_batch_free(scn_batch *b)
{
    free(b->qo_indptr);
    free(b->kv_lens);
    free(b->block_table);
    memset(b, 0, sizeof *b);
}

/* ---- the cache ------------------------------------------------------------------------ */

int scn_cache_create(const ak_attn_config *cfg, int num_layers, int num_blocks, ak_kv_cache **out)
{
    *out = NULL;
    ak_kv_cache_config kc;
    ak_kv_cache_config_init(&kc);
    kc.num_layers = num_layers;
    kc.num_blocks = num_blocks;
    kc.page_size = cfg->page_size;
    kc.num_kv_heads = cfg->num_kv_heads;
    kc.head_dim_qk = cfg->head_dim_qk;
    kc.head_dim_vo = cfg->head_dim_vo;
    kc.dtype = cfg->kv_dtype;
    kc.layout = cfg->kv_layout;
    kc.device = cfg->device;
    kc.mla = cfg->mla;
    if (ak_kv_cache_create(&kc, out) != AK_OK) return -1;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)num_blocks);
    const int ok = ids && ak_kv_cache_alloc(*out, num_blocks, ids) == AK_OK;
    free(ids);
    if (!ok) {
        ak_kv_cache_destroy(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

/* ---- accounting ------------------------------------------------------------------------ */

void scn_visible(const ak_attn_config *c, int kv_len, int pos, int *lo, int *hi)
{
    *hi = c->causal && pos < kv_len - 1 ? pos : kv_len - 1;
    *lo = c->window_left >= 0 && pos - c->window_left > 0 ? pos - c->window_left : 0;
}
