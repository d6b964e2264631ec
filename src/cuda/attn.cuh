/*
 * attn.cuh - what the paged attention kernels (decode.cu, prefill.cu,
 * merge.cu) take, shared with the backend that plans them (backend_paged.cu).
 *
 * K/V are read from a paged cache through a block table, or from contiguous
 * (ragged) K/V rows; one loader (load_kv_tile) serves both.
 *
 * Every kernel runs on a grid fixed when the backend is created and loops
 * over a work list that plan() fills; the list lengths are read from device
 * memory (attn_params.counts). So no launch depends on the plan, and a graph
 * captured once replays after any later plan within the limits.
 */
#ifndef AK_CUDA_ATTN_CUH
#define AK_CUDA_ATTN_CUH

#include "common.cuh"
#include "visible.h"

/* One unit of decode work: request `req`'s keys [kv_begin, kv_end) for one KV
 * head (grid.y). out >= 0: a partial state written to o_tmp/lse_tmp slot
 * `out` and merged later; out < 0: the whole request, written to o/lse
 * directly (req < 0 would be padding; plan() emits none). The item also carries what the kernel would
 * otherwise look up per request (token, page-list start, first visible key):
 * one 32-byte load instead of a chain of dependent ones at the start. */
struct __align__(16) decode_item {
    int req, kv_begin, kv_end, out;
    int tok;       /* the request's query token: qo_indptr[req] */
    int page_base; /* kv_indptr[req]: its first block id's index (paged) or first K/V row (ragged) */
    int lo;        /* first key inside the window */
    int unused;
};

/* One unit of prefill work: query tokens [tok0, tok0 + ntok) of one request
 * (a tile of rows packed as (token, query head of the group)) against keys
 * [kv_begin, kv_end), for one KV head and row tile (grid.y). pos0 is the
 * position of token tok0 in its request's KV (kv_len - q_len + its index):
 * token tok0 + i sees keys up to pos0 + i when causal. out >= 0: partial
 * states of token tok0 + i go to slot out + i. ntok == 0: padding. */
struct __align__(16) prefill_item {
    int tok0, ntok, pos0, page_base;
    int kv_begin, kv_end, out;
    int unused;
};

/* One merge: the partial states of token `tok` in slots first, first +
 * stride, ..., (n of them) combine into its output row. */
struct __align__(16) merge_task {
    int tok, first, n, stride;
};

/* Lengths of the work lists of the current plan, on the device. */
enum { COUNT_DECODE = 0, COUNT_PREFILL = 1, COUNT_MERGE = 2, NUM_COUNTS = 4 /* 16 bytes */ };

/* Everything the kernels read, by value. Strides in elements. */
struct attn_params {
    const void *q;          /* [num_tokens, num_qo_heads, head_dim] */
    int64_t q_stride_tok, q_stride_head;
    const void *k_pool, *v_pool; /* paged: the layer's pools; ragged: K and V [sum kv_len, Hkv, D] */
    int64_t k_block_stride, v_block_stride; /* paged: between blocks; ragged: between tokens */
    int64_t kv_stride_slot, kv_stride_head; /* row of (slot, head) inside a block (ragged: slot 0) */
    void *o;                /* [num_tokens, num_qo_heads, head_dim] */
    int64_t o_stride_tok, o_stride_head;
    float *lse;             /* [num_tokens, num_qo_heads], may be NULL */
    int64_t lse_stride_tok;
    float *o_tmp;           /* [partial slots, num_qo_heads, head_dim] partial outputs */
    float *lse_tmp;         /* [partial slots, num_qo_heads] partial LSEs (natural log) */
    const int32_t *counts;        /* [NUM_COUNTS] work-list lengths */
    const decode_item *items;     /* decode work list */
    const prefill_item *pitems;   /* prefill work list */
    const merge_task *tasks;      /* merge work list */
    const int32_t *kv_indices;    /* paged: block ids, each request's from its item's page_base */
    int num_qo_heads, num_kv_heads, group; /* group = num_qo_heads / num_kv_heads */
    int row_tiles;          /* decode: 16-head tiles per KV head (group > 16 only) */
    int prow_tiles;         /* prefill: row tiles per KV head (group > the tile's rows only) */
    int prow_heads;         /* prefill: query heads per row tile */
    int page_size;
    int causal;
    int window_left;        /* -1: full */
    float scale_log2;       /* sm_scale * log2(e): logits live in base 2 */
    float soft_cap;         /* 0: off */
    float cap_scale;        /* sm_scale / soft_cap */
    float cap_log2;         /* soft_cap * log2(e) */
    int page_shift;         /* log2(page_size) when a power of two, else -1 */
    int ragged;             /* 1: contiguous K/V, page_base is the request's first row, page_shift 0
                               (load_kv_tile) */
    int max_splits;         /* most partial slots of one merge (merge scratch) */
};

/* Logits live in base 2 in the kernels (exp2 is one instruction): scaled by
 * LOG2E on the way in, the LSE converted back with LN2 on the way out. */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* Cooperative cp.async of keys [t0, t0 + TILE) of K and V (THREADS threads)
 * into one stage of two swizzled [TILE][D] tiles (SW128: wgmma's layout); keys at or past kv_end are
 * zero-filled (and masked by the caller). Two addressing schemes, one loader:
 *   paged  (p.ragged == 0): key j of the request is slot j % page_size of
 *          block kv_indices[page_base + j / page_size];
 *   ragged (p.ragged == 1): key j is row page_base + j of contiguous K/V
 *          (page_base = the request's first row: kv_indptr in tokens). The
 *          backend runs it as pages of one token (page_shift 0, so page = j
 *          and slot 0) whose "block" is the row itself, with the token
 *          strides as block strides: no block-table read.
 * p.ragged is a kernel argument, so the select is uniform (the same for
 * every thread of the grid); a template flag would double every kernel's
 * instances (and the CI compile time) to save one select a row. ptxas
 * (sm_90): prefill's registers and spills are the same with it as without,
 * decode spills nothing either way.
 * This is the hot integer path: a profile of the first decode kernel showed
 * ~1000 instructions per tile, mostly an emulated division per row (key /
 * page_size) and 64-bit offsets, leaving the SM issue-bound at 62% of DRAM
 * bandwidth. Power-of-two pages use shift and mask, the per-CTA part of the
 * offset (head, chunk) is hoisted by the caller into lane_off, and rows past
 * the end are clamped, not branched. */
template <int D, int TILE, int THREADS, typename T, bool SW128 = false, int ADDR = -1>
__device__ __forceinline__ void load_kv_tile(const attn_params &p, int page_base, int64_t lane_off, int t0,
                                             int kv_end, T *ks, T *vs)
{
    constexpr int CHUNKS = D / 8;
    static_assert(THREADS % CHUNKS == 0 && (TILE * CHUNKS) % THREADS == 0, "tile chunks divide among the threads");
    const int chunk = threadIdx.x % CHUNKS;
    const int row0 = threadIdx.x / CHUNKS;
#pragma unroll
    for (int i = 0; i < TILE * CHUNKS / THREADS; i++) {
        const int row = row0 + i * (THREADS / CHUNKS);
        const int key = min(t0 + row, kv_end - 1);
        int page, slot;
        if (p.page_shift >= 0) {
            page = key >> p.page_shift;
            slot = key & ((1 << p.page_shift) - 1);
        } else {
            page = key / p.page_size;
            slot = key - page * p.page_size;
        }
        /* ragged runs with page_shift 0: page = key, slot 0 */
        const int idx = page_base + page;
        /* ADDR 0 / 1: paged / ragged fixed at compile time (the wgmma kernel,
         * at 236 registers, spilled with the select); -1: p.ragged */
        const bool ragged = ADDR < 0 ? p.ragged != 0 : ADDR == 1;
        const int64_t block = ragged ? idx : __ldg(p.kv_indices + idx);
        const int64_t off = lane_off + (int64_t)slot * p.kv_stride_slot;
        const int bytes = t0 + row < kv_end ? 16 : 0;
        /* the tile's layout: rows of D elements (swz), or the wgmma layout of
         * 64-element column blocks (sw128 in wgmma.cuh, written out here) */
        const int at = SW128 ? (chunk >> 3) * (TILE * 64) + row * 64 + (((chunk & 7) ^ (row & 7)) << 3)
                             : swz<D>(row, chunk);
        cp_async_16(ks + at, (const T *)p.k_pool + block * p.k_block_stride + off, bytes);
        cp_async_16(vs + at, (const T *)p.v_pool + block * p.v_block_stride + off, bytes);
    }
}

/* The logit of a key in base 2, soft-capped when asked. */
__device__ __forceinline__ float to_logit2(const attn_params &p, float dot)
{
    if (p.soft_cap > 0.0f) return p.cap_log2 * tanhf(dot * p.cap_scale);
    return dot * p.scale_log2;
}

/* Issues the cp.async copies of an item's query tile into shared memory: ROWS
 * rows (token i, head g of the tile's hb heads: row i * hb + g) of CHUNKS
 * 16-byte chunks, the block's THREADS threads striding over them; rows past
 * the item's tokens or heads are zero-filled. at(row, chunk) is the element
 * offset of a chunk in the kernel's shared-memory layout. */
template <int ROWS, int THREADS, int CHUNKS, typename T, typename At>
__device__ __forceinline__ void load_q_tile(const attn_params &p, const prefill_item &it, int head0, int hb, int heads,
                                            T *qs, At at)
{
    const int c = threadIdx.x % CHUNKS;
#pragma unroll 4
    for (int row = threadIdx.x / CHUNKS; row < ROWS; row += THREADS / CHUNKS) {
        const int i = row / hb, g = row - i * hb;
        const bool valid = i < it.ntok && g < heads;
        const T *src =
            (const T *)p.q + (valid ? (it.tok0 + i) * p.q_stride_tok + (head0 + g) * p.q_stride_head + c * 8 : 0);
        cp_async_16(qs + at(row, c), src, valid ? 16 : 0);
    }
}

/* The causal / end / window mask of one row of an m16n8 accumulator tile of
 * S (NT n-tiles of 8 keys from t0, in either prefill kernel): h = 0 is the
 * row of elements 0-1, h = 1 that of elements 2-3; the row's query sits at
 * position pos and sees keys [pos - window_left, min(pos, kv_end - 1)]. */
template <int NT>
__device__ __forceinline__ void mask_row(const attn_params &p, float (&s)[NT][4], int h, int pos, int t0, int kv_end,
                                         int lane)
{
    const int hi = ak_visible_hi(pos, kv_end, p.causal);
    const int lo = ak_visible_lo(pos, p.window_left);
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; e++) {
            const int key = t0 + n * 8 + (lane % 4) * 2 + (e & 1);
            if (key > hi || key < lo) s[n][e] = -INFINITY;
        }
}

/* Which kernel serves decode: tensor cores (mma) or CUDA cores. */
typedef enum decode_engine { DECODE_CUDA_CORES = 0, DECODE_TENSOR_CORES = 1 } decode_engine;

/* The largest GQA group the CUDA-core engine serves (MHA); bigger groups use
 * tensor cores, one 16-row tile per 16 query heads (backend_paged.cu has the
 * measurements behind the threshold). */
#define AK_DECODE_CC_MAX_GROUP 1

/* Launches decode over grid (ctas, num_kv_heads * row_tiles); each thread
 * block loops over decode items blockIdx.x, + ctas, ... */
ak_status ak_cuda_decode_launch(const attn_params *p, int head_dim, ak_dtype dtype, decode_engine engine, int ctas,
                                cudaStream_t stream);
/* The PTX version (e.g. 90) the kernels were compiled for: below 90 they
 * carry no griddepcontrol, and must not be launched as programmatic
 * dependents. */
ak_status ak_cuda_kernels_ptx_version(int head_dim, ak_dtype dtype, int *ptx);
/* CTAs per SM the decode kernel reaches. */
ak_status ak_cuda_decode_occupancy(int head_dim, ak_dtype dtype, decode_engine engine, int *ctas_per_sm);

/* The two prefill kernels: mma.sync (prefill.cu, sm_80+) and warpgroup MMA
 * (prefill_wgmma.cu, sm_90a). The backend picks one at create. */
typedef enum prefill_family { PREFILL_MMA = 0, PREFILL_WGMMA = 1 } prefill_family;

struct prefill_kernel_info {
    void (*fn)(const attn_params);
    int threads, smem, rows; /* rows: query rows a tile (tokens x heads packed) */
};

/* A family's kernel table: Info<D, T>::get() for head dims 64, 128 and 256
 * in f16 or bf16; fn NULL for any other head dim. */
template <template <int, typename> class Info, typename T> inline prefill_kernel_info prefill_table_of(int head_dim)
{
    switch (head_dim) {
    case 64: return Info<64, T>::get();
    case 128: return Info<128, T>::get();
    case 256: return Info<256, T>::get();
    }
    const prefill_kernel_info none = {NULL, 0, 0, 0};
    return none;
}
template <template <int, typename> class Info> inline prefill_kernel_info prefill_table(int head_dim, ak_dtype dtype)
{
    return dtype == AK_BF16 ? prefill_table_of<Info, __nv_bfloat16>(head_dim) : prefill_table_of<Info, __half>(head_dim);
}

/* The kernel of a family for a head dim and dtype; fn NULL if there is none
 * (the wgmma ones exist only in a build that targets sm_90). */
prefill_kernel_info ak_cuda_prefill_kernel(prefill_family f, int head_dim, ak_dtype dtype);
prefill_kernel_info ak_cuda_prefill_wgmma_kernel(int head_dim, ak_dtype dtype);
/* CTAs per SM the prefill kernel reaches. */
ak_status ak_cuda_prefill_occupancy(prefill_family f, int head_dim, ak_dtype dtype, int *ctas_per_sm);
/* Launches prefill over grid (ctas, num_kv_heads * prow_tiles). after_decode:
 * the decode kernel was launched just before on the stream; then prefill is
 * its programmatic dependent (sm_90+) and the two overlap (they touch
 * disjoint outputs; prefill waits for decode only before it exits, so the
 * merge after it sees both). */
ak_status ak_cuda_prefill_launch(const attn_params *p, prefill_family f, int head_dim, ak_dtype dtype, int ctas,
                                 int after_decode, cudaStream_t stream);

/* Merges the partial slots of every merge task into o / lse: grid (ctas,
 * num_qo_heads). pdl: launch as a programmatic dependent of the kernel before
 * it on the stream (sm_90+), so its launch overlaps that kernel's tail. */
ak_status ak_cuda_merge_launch(const attn_params *p, int head_dim, ak_dtype dtype, int ctas, int pdl,
                               cudaStream_t stream);

/* Launches k on `stream`, as a programmatic dependent of the kernel before it
 * when pdl is set (sm_90+). The one launch path of every attention kernel. */
static inline ak_status launch_kernel(void (*k)(const attn_params), dim3 grid, int threads, int smem, int pdl,
                                      cudaStream_t stream, const attn_params &p)
{
    cudaLaunchConfig_t lc = {};
    lc.gridDim = grid;
    lc.blockDim = dim3(threads);
    lc.dynamicSmemBytes = smem;
    lc.stream = stream;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    lc.attrs = &attr;
    lc.numAttrs = pdl ? 1 : 0;
    AK_CUDA_TRY(cudaLaunchKernelEx(&lc, k, p));
    return AK_OK;
}

#endif /* AK_CUDA_ATTN_CUH */
