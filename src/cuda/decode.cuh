/*
 * decode.cuh - what the paged decode and merge kernels take, shared with the
 * backend that plans them (backend_paged.cu).
 */
#ifndef AK_CUDA_DECODE_CUH
#define AK_CUDA_DECODE_CUH

#include "common.cuh"

/* One unit of decode work: request `req`'s keys [kv_begin, kv_end) for one KV
 * head (grid.y). out >= 0: a partial state written to o_tmp/lse_tmp row `out`
 * and merged later; out < 0: the whole request, written to o/lse directly.
 * req < 0: padding (the grid is fixed by the number of requests). The item
 * also carries what the kernel would otherwise look up per request (token,
 * page-list start, first visible key): one 32-byte load instead of a chain of
 * dependent ones at the start of every thread block. */
struct __align__(16) decode_item {
    int req, kv_begin, kv_end, out;
    int tok;       /* the request's query token: qo_indptr[req] */
    int page_base; /* kv_indptr[req] */
    int lo;        /* first key inside the window */
    int unused;
};

/* Everything the decode and merge kernels read, by value. Strides in elements. */
struct decode_params {
    const void *q;          /* [num_tokens, num_qo_heads, head_dim] */
    int64_t q_stride_tok, q_stride_head;
    const void *k_pool, *v_pool;
    int64_t k_block_stride, v_block_stride;
    int64_t kv_stride_slot, kv_stride_head; /* row of (slot, head) inside a block */
    void *o;                /* [num_tokens, num_qo_heads, head_dim] */
    int64_t o_stride_tok, o_stride_head;
    float *lse;             /* [num_tokens, num_qo_heads], may be NULL */
    int64_t lse_stride_tok;
    float *o_tmp;           /* [max_items, num_qo_heads, head_dim] partial outputs */
    float *lse_tmp;         /* [max_items, num_qo_heads] partial LSEs (natural log) */
    const decode_item *items;     /* [num_items] */
    const int32_t *qo_indptr;     /* [num_reqs + 1] */
    const int32_t *kv_indices;    /* block ids, each request's from its item's page_base */
    const int32_t *merge_indptr;  /* [num_reqs + 1] partial rows of each request */
    int num_reqs;
    int num_qo_heads, num_kv_heads, group; /* group = num_qo_heads / num_kv_heads */
    int row_tiles;          /* query-head tiles per KV head (group > 16 only) */
    int page_size;
    int window_left;        /* -1: full */
    float scale_log2;       /* sm_scale * log2(e): logits live in base 2 */
    float soft_cap;         /* 0: off */
    float cap_scale;        /* sm_scale / soft_cap */
    float cap_log2;         /* soft_cap * log2(e) */
    int page_shift;         /* log2(page_size) when a power of two, else -1 */
    int max_splits;         /* most partial rows of one request (merge scratch) */
};

/* Which kernel serves a config: tensor cores (mma) or CUDA cores. */
typedef enum decode_engine { DECODE_CUDA_CORES = 0, DECODE_TENSOR_CORES = 1 } decode_engine;

/* The largest GQA group the CUDA-core engine serves (MHA); bigger groups use
 * tensor cores, one 16-row tile per 16 query heads (backend_paged.cu has the
 * measurements behind the threshold). */
#define AK_DECODE_CC_MAX_GROUP 1

/* Launches decode over grid (num_items, num_kv_heads * row_tiles). */
ak_status ak_cuda_decode_launch(const decode_params *p, int head_dim, ak_dtype dtype, decode_engine engine,
                                int num_items, cudaStream_t stream);
/* CTAs per SM the decode kernel reaches (for the split planner). */
ak_status ak_cuda_decode_occupancy(int head_dim, ak_dtype dtype, decode_engine engine, int *ctas_per_sm);
/* Merges the partial rows of every split request into o / lse: grid
 * (num_reqs, num_qo_heads). pdl: launch as a programmatic dependent of the
 * decode kernel before it on the stream (sm_90+), so its launch overlaps the
 * decode's tail. */
ak_status ak_cuda_merge_launch(const decode_params *p, int head_dim, ak_dtype dtype, int pdl, cudaStream_t stream);

#endif /* AK_CUDA_DECODE_CUH */
