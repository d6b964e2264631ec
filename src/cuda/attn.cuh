/*
 * attn.cuh - what the attention kernels (decode.cu, prefill.cu,
 * prefill_wgmma.cu, merge.cu, portable.cu) take, shared with the engine that
 * plans and launches them (engine.cu).
 *
 * K/V are read from a paged cache through a block table, or from contiguous
 * (ragged) K/V rows; one loader (load_kv_tile) serves both.
 *
 * Head dims: the tensor-core kernels are instantiated per pair (DQK, DVO) of
 * the table below, each a multiple of 16; their shared-memory rows are DP =
 * DQK and DVO rounded up to 64 (the swizzle's 8 chunks), and they compute
 * over the real dims only. Any other pair (up to 512) runs on the portable
 * kernel (portable.cu).
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
    const void *q;          /* [num_tokens, num_qo_heads, head_dim_qk] */
    int64_t q_stride_tok, q_stride_head;
    const void *k_pool, *v_pool; /* paged: the layer's pools; ragged: K and V [sum kv_len, Hkv, D] */
    int64_t k_block_stride, v_block_stride; /* paged: between blocks; ragged: between tokens */
    int64_t k_stride_slot, k_stride_head;   /* row of (slot, head) inside a block (ragged: slot 0), K */
    int64_t v_stride_slot, v_stride_head;   /* the same for V (equal to K's when the head dims are) */
    void *o;                /* [num_tokens, num_qo_heads, head_dim_vo] */
    int64_t o_stride_tok, o_stride_head;
    float *lse;             /* [num_tokens, num_qo_heads], may be NULL */
    int64_t lse_stride_tok;
    float *o_tmp;           /* [partial slots, num_qo_heads, head_dim_vo] partial outputs */
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
    const float *sinks;     /* [num_qo_heads] sink logits (natural log), or NULL: each joins its
                               head's softmax denominator once, with no value (finish_row) */
    int head_dim_qk, head_dim_vo; /* the portable kernel's dims (the others have them compiled in) */
};

/* Logits live in base 2 in the kernels (exp2 is one instruction): scaled by
 * LOG2E on the way in, the LSE converted back with LN2 on the way out. */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* The shared-memory row of a kernel for head dims (DQK, DVO): the larger
 * rounded up to 64, 128 or 256 elements (whole swizzle groups of 8 chunks,
 * and a chunk count that divides the loaders' thread counts). */
template <int DQK, int DVO> struct head_dims {
    static constexpr int D = DQK > DVO ? DQK : DVO;
    static constexpr int DP = D <= 64 ? 64 : D <= 128 ? 128 : 256;
    static_assert(DQK % 16 == 0 && DVO % 16 == 0, "tensor-core head dims are multiples of 16 (one k step)");
};

/* Where a thread's 16-byte chunk sits in a K and a V row of its KV head:
 * the per-CTA part of every K/V address, hoisted out of the tile loop. */
struct kv_lane {
    int64_t k, v;
};

/* The lane offsets of KV head kv_head for a thread of the loader below
 * (chunk = threadIdx.x % (DP / 8)). */
template <int DP>
__device__ __forceinline__ kv_lane kv_lane_of(const attn_params &p, int kv_head)
{
    const int64_t c = (threadIdx.x % (DP / 8)) * 8;
    kv_lane l;
    l.k = kv_head * p.k_stride_head + c;
    l.v = kv_head * p.v_stride_head + c;
    return l;
}

/* Cooperative cp.async of keys [t0, t0 + TILE) of K and V (THREADS threads)
 * into one stage of two swizzled [TILE][DP] tiles (SW128: wgmma's layout of
 * 64-element column blocks); K rows are DQK elements, V rows DVO, the rest of
 * a DP row is left as it is (no kernel reads it). Keys at or past kv_end are
 * zero-filled (and masked by the caller). Two addressing schemes, one loader:
 *   paged  (p.ragged == 0): key j of the request is slot j % page_size of
 *          block kv_indices[page_base + j / page_size];
 *   ragged (p.ragged == 1): key j is row page_base + j of contiguous K/V
 *          (page_base = the request's first row: kv_indptr in tokens). The
 *          engine runs it as pages of one token (page_shift 0, so page = j
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
 * offset (head, chunk) is hoisted by the caller into kv_lane, rows past the
 * end are clamped, not branched, and with equal head dims K and V share one
 * offset (their strides are equal). */
template <int DQK, int DVO, int DP, int TILE, int THREADS, typename T, bool SW128 = false, int ADDR = -1>
__device__ __forceinline__ void load_kv_tile(const attn_params &p, int page_base, kv_lane lane, int t0, int kv_end,
                                             T *ks, T *vs)
{
    constexpr int CHUNKS = DP / 8;
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
        const int64_t k_off = lane.k + (int64_t)slot * p.k_stride_slot;
        const int64_t v_off = DQK == DVO ? k_off - lane.k + lane.v : lane.v + (int64_t)slot * p.v_stride_slot;
        const int bytes = t0 + row < kv_end ? 16 : 0;
        /* the tile's layout: rows of DP elements (swz), or the wgmma layout of
         * 64-element column blocks (sw128 in wgmma.cuh, written out here) */
        const int at = SW128 ? (chunk >> 3) * (TILE * 64) + row * 64 + (((chunk & 7) ^ (row & 7)) << 3)
                             : swz<DP>(row, chunk);
        if (chunk < DQK / 8) cp_async_16(ks + at, (const T *)p.k_pool + block * p.k_block_stride + k_off, bytes);
        if (chunk < DVO / 8) cp_async_16(vs + at, (const T *)p.v_pool + block * p.v_block_stride + v_off, bytes);
    }
}

/* The logit of a key in base 2, soft-capped when asked. */
__device__ __forceinline__ float to_logit2(const attn_params &p, float dot)
{
    if (p.soft_cap > 0.0f) return p.cap_log2 * tanhf(dot * p.cap_scale);
    return dot * p.scale_log2;
}

/* Issues the cp.async copies of an item's query tile into shared memory: ROWS
 * rows (token i, head g of the tile's hb heads: row i * hb + g) of DQK
 * elements in a layout of DP-element rows, the block's THREADS threads
 * striding over the DP / 8 chunks of each row (chunks past DQK are left
 * alone); rows past the item's tokens or heads are zero-filled. at(row,
 * chunk) is the element offset of a chunk in the kernel's layout. */
template <int ROWS, int THREADS, int DQK, int DP, typename T, typename At>
__device__ __forceinline__ void load_q_tile(const attn_params &p, const prefill_item &it, int head0, int hb, int heads,
                                            T *qs, At at)
{
    constexpr int CHUNKS = DP / 8;
    static_assert(THREADS % CHUNKS == 0, "q chunks divide among the threads");
    const int c = threadIdx.x % CHUNKS;
    if (c >= DQK / 8) return;
#pragma unroll 4
    for (int row = threadIdx.x / CHUNKS; row < ROWS; row += THREADS / CHUNKS) {
        const int i = row / hb, g = row - i * hb;
        const bool valid = i < it.ntok && g < heads;
        const T *src =
            (const T *)p.q + (valid ? (it.tok0 + i) * p.q_stride_tok + (head0 + g) * p.q_stride_head + c * 8 : 0);
        cp_async_16(qs + at(row, c), src, valid ? 16 : 0);
    }
}

/* The final state of a row whose online softmax ended with max m (base 2,
 * -inf when no key was seen) and sum d = sum exp2(logit - m): the factor its
 * o accumulator is multiplied by, and its LSE (natural log). With a sink
 * (p.sinks: a logit z of its head that joins the denominator once, with no
 * value), d + exp2(z log2 e - m) is the denominator, computed against the
 * larger of the two maxima so that neither overflows; a row that saw no key
 * then has o = 0 and lse = z. Split-KV partials are finished without it (the
 * merge adds it once). */
__device__ __forceinline__ void finish_row(const attn_params &p, int head, bool partial, float m, float d, float &inv,
                                           float &lse)
{
    if (p.sinks && !partial) {
        const float z = p.sinks[head] * LOG2E;
        const float top = fmaxf(m, z);
        const float w = d > 0.0f ? exp2f(m - top) : 0.0f; /* the keys' share, in the frame of top */
        const float den = d * w + exp2f(z - top);
        inv = w / den;
        lse = (top + log2f(den)) * LN2;
        return;
    }
    inv = d > 0.0f ? 1.0f / d : 0.0f;
    lse = d > 0.0f ? (m + log2f(d)) * LN2 : -INFINITY;
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

/* ---- the kernels and how the engine picks them ---- */

/* The (head_dim_qk, head_dim_vo) pairs the tensor-core kernels are compiled
 * for: every head dim of the models engines serve (Phi-3's 96, 80 and 112,
 * DeepSeek's expanded MLA prefill 192/128, Gemma's 256) and a smaller V
 * dim. Any other pair up to AK_PORTABLE_MAX_DIM runs on the portable kernel. */
#define AK_TC_HEAD_DIMS(X)                                                                                        \
    X(64, 64) X(80, 80) X(96, 96) X(112, 112) X(128, 128) X(192, 192) X(256, 256) X(192, 128) X(128, 64)
#define AK_PORTABLE_MAX_DIM 512

/* A kernel instance and its launch shape. */
struct attn_kernel {
    void (*fn)(const attn_params);
    int threads, smem; /* block size, dynamic shared memory (bytes) */
    int rows;          /* prefill: query rows a tile (tokens x heads packed); decode: query heads a tile */
};

/* A kernel table: Info<DQK, DVO, T>::get() for the pairs of AK_TC_HEAD_DIMS
 * in f16 or bf16; fn NULL for any other pair. */
template <template <int, int, typename> class Info, typename T>
inline attn_kernel kernel_table_of(int dqk, int dvo)
{
#define AK_PAIR_CASE_(QK, VO)                                                                                     \
    if (dqk == QK && dvo == VO) return Info<QK, VO, T>::get();
    AK_TC_HEAD_DIMS(AK_PAIR_CASE_)
#undef AK_PAIR_CASE_
    const attn_kernel none = {NULL, 0, 0, 0};
    return none;
}
template <template <int, int, typename> class Info>
inline attn_kernel kernel_table(int dqk, int dvo, ak_dtype dtype)
{
    return dtype == AK_BF16 ? kernel_table_of<Info, __nv_bfloat16>(dqk, dvo) : kernel_table_of<Info, __half>(dqk, dvo);
}

/* Which kernel serves decode items: tensor cores (mma), CUDA cores (MHA at
 * equal head dims of 64, 128 or 256), or the portable kernel. */
typedef enum decode_engine { DECODE_CUDA_CORES = 0, DECODE_TENSOR_CORES = 1, DECODE_PORTABLE = 2 } decode_engine;

/* The largest GQA group the CUDA-core engine serves (MHA); bigger groups use
 * tensor cores, one 16-row tile per 16 query heads (engine.cu has the
 * measurements behind the threshold). */
#define AK_DECODE_CC_MAX_GROUP 1

/* The decode kernel of an engine for a pair and dtype (fn NULL if none):
 * grid (ctas, num_kv_heads * row_tiles), each block looping over decode
 * items blockIdx.x, + ctas, ... */
attn_kernel ak_cuda_decode_kernel(decode_engine engine, int dqk, int dvo, ak_dtype dtype);

/* The prefill kernels: mma.sync (prefill.cu, sm_80+), warpgroup MMA
 * (prefill_wgmma.cu, sm_90a) and the portable one. The engine picks one at
 * create. Grid (ctas, num_kv_heads * prow_tiles). */
typedef enum prefill_family { PREFILL_MMA = 0, PREFILL_WGMMA = 1, PREFILL_PORTABLE = 2 } prefill_family;

/* The kernel of a family for a pair and dtype; fn NULL if there is none
 * (the wgmma ones exist only in a build that targets sm_90). */
attn_kernel ak_cuda_prefill_kernel(prefill_family f, int dqk, int dvo, ak_dtype dtype);
attn_kernel ak_cuda_prefill_wgmma_kernel(int dqk, int dvo, ak_dtype dtype);

/* The portable kernel (portable.cu): any head dims up to AK_PORTABLE_MAX_DIM
 * (multiples of 8 load 16 bytes a copy, others 2), any group, over the
 * decode items (decode = 1) or the prefill items, with the same outputs,
 * partial states and sinks as the others. */
attn_kernel ak_cuda_portable_kernel(int decode, int dqk, int dvo, ak_dtype dtype);

/* The merge of split-KV partial states into o / lse for head_dim_vo dvo
 * (any): grid (ctas, num_qo_heads), max_splits floats of shared memory.
 * vec: o rows are 16-byte aligned (else element stores). */
attn_kernel ak_cuda_merge_kernel(int dvo, int vec, ak_dtype dtype);

/* CTAs per SM a kernel reaches (raising its dynamic shared-memory limit
 * first, once), and the PTX version it was compiled for (below 90 it carries
 * no griddepcontrol and must not be launched as a programmatic dependent). */
ak_status ak_cuda_kernel_occupancy(const attn_kernel *k, int *ctas_per_sm);
ak_status ak_cuda_kernel_ptx_version(const attn_kernel *k, int *ptx);

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
