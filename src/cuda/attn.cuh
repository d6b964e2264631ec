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
 * over the real dims only. Head dims 512 have kernels of their own
 * (decode_wide.cu; prefill_wide.cu on sm_90a); any other pair (up to 512)
 * runs on the portable kernel (portable.cu).
 *
 * Every kernel runs on a grid fixed when the backend is created and loops
 * over a work list that plan() fills; the list lengths are read from device
 * memory (attn_params.head). So no launch depends on the plan, and a graph
 * captured once replays after any later plan within the limits.
 */
#ifndef AK_CUDA_ATTN_CUH
#define AK_CUDA_ATTN_CUH

#include "common.cuh"
#include "kv_addr.h"
#include "visible.h"

#include <cuda.h> /* CUtensorMap */
#include <cuda_fp8.h>

#include <limits.h>

/* One unit of decode work: request `req`'s keys [kv_begin, kv_end) for one KV
 * head (grid.y). out >= 0: a partial state written to o_tmp/lse_tmp slot
 * `out` and merged later; out < 0: the whole request, written to o/lse
 * directly (req < 0 would be padding; plan() emits none). The item also carries what the kernel would
 * otherwise look up per request (token, page-list start, first visible key):
 * one 32-byte load instead of a chain of dependent ones at the start.
 *
 * ntok > 1 (mla_wgmma.cu alone, in MLA mode): consecutive query tokens tok,
 * tok + 1, ... of the request share the item, rows packed as (token, head of
 * the row tile); causal among them, token i sees the item's keys up to
 * kv_end - max(0, hid - i) (hid < ntok: the keys the first token does not
 * see), and its partial state goes to slot out + i. */
struct __align__(16) decode_item {
    int req, kv_begin, kv_end, out;
    int tok;       /* the request's (first) query token */
    int page_base; /* kv_indptr[req]: its first block id's index (paged) or first K/V row (ragged) */
    int lo;        /* first key inside the window */
    int16_t ntok, hid;
};

/* One unit of prefill work: query tokens [tok0, tok0 + ntok) of one request
 * (a tile of rows packed as (token, query head of the group)) against keys
 * [kv_begin, kv_end), for one KV head and row tile: row = kv_head x
 * prow_tiles + row tile (heads_of). The planner deals every row's items to
 * one grid of blocks (the grid is 1-D), so that the blocks fill the SMs
 * whatever the count of KV heads. pos0 is the
 * position of token tok0 in its request's KV (kv_len - q_len + its index):
 * token tok0 + i sees keys up to pos0 + i when causal. out >= 0: partial
 * states of token tok0 + i go to slot out + i. ntok == 0: padding. */
struct __align__(16) prefill_item {
    int tok0, ntok, pos0, page_base;
    int kv_begin, kv_end, out;
    /* the NaN rule (below): scan_n flags from scan_flags[scan] of the scan
     * pass cover every key of the request (any flag set: the checked path);
     * scan < 0, or a task this run does not scan (scanned_tasks): the
     * checked path */
    int scan, scan_n;
    int row; /* the KV head and row tile (above) */
    /* kv_len: the request's keys, every one written: an item's last key
     * tile may copy those past kv_end whole, the masks hiding them
     * (producer.cuh says when) */
    int kv_len;
    int unused;
};

/* One unit of the scan pass (scan.cu), for one KV head (grid.y): keys [k0,
 * k1) of a request whose K/V rows start at page_base (as in the items). The
 * pass writes scan_flags[task * num_kv_heads + head]: whether an element of
 * their K or V rows is NaN or infinite. */
struct __align__(16) scan_task {
    int page_base, k0, k1;
    int unused;
};

/* One merge: the partial states of token `tok` in slots first, first +
 * stride, ..., (n of them) combine into its output row. */
struct __align__(16) merge_task {
    int tok, first, n, stride;
};

/* A prefill item's heads: its KV head, and the query heads of its row tile
 * ([head0, head0 + heads), heads <= p.prow_heads; prefill_item.row). */
struct item_heads {
    int kv_head, head0, heads;
};

/* Lengths of the work lists of the current plan, on the device. */
enum { COUNT_DECODE = 0, COUNT_PREFILL = 1, COUNT_MERGE = 2, COUNT_SCAN = 3, NUM_COUNTS = 4 /* 16 bytes */ };

/* The head of a plan's device metadata, written by every plan (one copy with
 * the decode items): the work-list lengths, and where the block ids are.
 * The kernels read both at every launch, so a captured graph follows each
 * later plan, whichever table it names. */
struct __align__(16) plan_head {
    int32_t counts[NUM_COUNTS];
    /* paged: the block ids, request r's from its items' page_base on: the
     * plan's CSR list (a host block table, copied), or the caller's device
     * block table, read in place (page_base = r x its stride); ragged: NULL */
    const int32_t *kv_table;
    int32_t merge_narrow; /* 1: the merge runs in narrow slices (merge.cu) */
    /* 1: kv_table may be read before griddepcontrol.wait: it is the plan's
     * copy of a host block table, written before any kernel of the step (or
     * there is none: ragged). A caller's device table may be written by the
     * kernel just before, so it is read only after the wait. */
    int32_t table_early;
    /* 1: some decode item holds several tokens (decode_item.ntok > 1), which
     * mla_wgmma.cu serves on a path of its own (the others pay nothing) */
    int32_t mla_packed;
    /* The scan tasks (counts[COUNT_SCAN]) begin with scan_long of long
     * requests (engine.cu's SCAN_MIN_ROWS) and of shorter ones whose rows
     * are worth their keys' read (SCAN_ROWS_KEYS), which every run scans;
     * the rest, the other shorter requests', only a run with the pools'
     * finiteness marks does (scanned_tasks) */
    int32_t scan_long;
    int32_t unused[2];
};

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
    const plan_head *head;        /* work-list lengths and the block table */
    const decode_item *items;     /* decode work list */
    const prefill_item *pitems;   /* prefill work list */
    const merge_task *tasks;      /* merge work list */
    const scan_task *scans;       /* scan-pass work list */
    int32_t *scan_flags;          /* [scan tasks][num_kv_heads] the scan pass's findings */
    const uint32_t *kv_marks;     /* paged: the pools' finiteness marks (ak_paged_kv.marks, kv_addr.h),
                                     or NULL */
    int num_blocks;         /* paged: blocks of the pools; a block id outside [0, num_blocks) is
                               clamped into them (kv_block_clamped); ragged: INT_MAX */
    int num_qo_heads, num_kv_heads, group; /* group = num_qo_heads / num_kv_heads */
    int row_tiles;          /* decode: 16-head tiles per KV head (group > 16 only) */
    int prow_tiles;         /* prefill: row tiles per KV head (group > the tile's rows only) */
    int prow_heads;         /* prefill: query heads per row tile */
    int prow_seg_log2;      /* prefill: log2 of the rows of a segment of the row tile, each of whole
                               tokens (tile_token): 6, a consumer warpgroup's 64, or 8: the tile is
                               one (256 rows, more than any tile's) */
    int prow_heads_inv;     /* prefill: ceil(2^16 / prow_heads): r / prow_heads = r * it >> 16,
                               exact for r <= 256 (tile_token) */
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
    /* fp8 K/V (attnkit.h, ak_kv_scale_kind): the scales on the device, read
     * by the kernels at every launch (a captured graph replays with the
     * values they hold then); kind AK_KV_SCALE_NONE: 1 */
    int kv_scale_kind;
    const float *k_scale, *v_scale;
    /* 1: the kernel's second parameter holds a TMA map of the K pool
     * (kv_maps.k, attn_kernel.tma_map) to read whole tiles through (MLA) */
    int k_tma;
    /* prefill (prefill_wgmma.cu): the rows of a TMA box of K and V in the
     * second parameter's maps, a key tile (the kernel's KEYS), half of one,
     * or (paged, pages of 16n keys) 32 or 16: a page holds whole boxes; or
     * 0: every copy by cp.async */
    int kv_box;
    /* prefill (prefill_wgmma.cu): the tokens of a TMA box of q in the second
     * parameter's q map (prow_heads heads of each: the whole row tile, or
     * where its segments have rows no token fills, a segment: a box every
     * 2^prow_seg_log2 rows), or 0: q by cp.async */
    int q_box;
    /* prefill (prefill_wgmma.cu, two consumer warpgroups): the tokens of a
     * TMA box of o in the second parameter's o map (a warpgroup's 64 rows,
     * or those of its segment that tokens fill: prow_heads heads of each),
     * or 0: o from registers */
    int o_box;
    /* prefill: the kernel is the scan pass's programmatic dependent (no
     * decode between them, engine.cu's run): it waits for the pass before
     * its items read the flags */
    int wait_first;
    /* The scan pass beside the clean prefill pass (engine.cu's run, at DP
     * 256 without marks): the pass, on a few SMs, lets its dependents launch
     * at once; the clean pass takes every item of a scanned request,
     * unchecked, from item_queue (below); the checked pass waits for the
     * clean one to finish (wait_first), then takes the items the flags
     * mark, which it runs again checked, and the unscanned ones. */
    int scan_beside;
    /* [2] a queue of the clean pass's items: the next item past the first
     * wave's (a block's first item is blockIdx.x), and the blocks done
     * taking; the last of them sets both to 0 again (zero at creation) */
    int *item_queue;
};

#ifdef __CUDACC__
__device__ __forceinline__ item_heads heads_of(const attn_params &p, const prefill_item &it)
{
    const int kv_head = it.row / p.prow_tiles, row_tile = it.row - kv_head * p.prow_tiles;
    const int head0 = kv_head * p.group + row_tile * p.prow_heads;
    const item_heads h = {kv_head, head0, min(p.prow_heads, p.group - row_tile * p.prow_heads)};
    return h;
}

/* A row tile's packing of (token, head) pairs of hb heads: segments of
 * seg = 2^p.prow_seg_log2 rows, each holding seg / hb whole tokens, row
 * s * seg + i * hb + g being token s * (seg / hb) + i, head g. With one
 * segment (seg 256) that is row / hb, g = row % hb, as where the heads
 * divide seg; a segment's last seg % hb rows are no token's (NO_TOKEN, past
 * any item's tokens, as are the rows of a tile past its tokens). Returns
 * the token; g its head. No division: by p.prow_heads_inv, which is exact
 * up to 256. */
#define NO_TOKEN (1 << 24)
__device__ __forceinline__ int tile_token(const attn_params &p, int row, int &g)
{
    const int hb = p.prow_heads, inv = p.prow_heads_inv, lg = p.prow_seg_log2;
    const int s = row >> lg, r = row - (s << lg), i = r * inv >> 16, per = (1 << lg) * inv >> 16;
    g = r - i * hb;
    return i < per ? s * per + i : NO_TOKEN;
}
#endif

/* The second parameter of the kernels that read K/V by TMA
 * (attn_kernel.tma_map): the maps of K and of V (MLA: K alone), built by
 * run() for the layer's pools, and the prefill's maps of q and o, built
 * for the step's tensors; copied at the launch. */
struct kv_maps {
    CUtensorMap k, v, q, o;
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

/* ---- fp8 e4m3 K/V ----
 * The kernels that serve fp8 pools copy the fp8 rows into shared memory as
 * they are (half the bytes of a 16-bit row: 16 elements a 16-byte chunk),
 * then convert each tile once to the query's 16-bit type, exactly (every
 * e4m3 value, NaN included, is an f16 and a bf16), into the swizzled layout
 * the 16-bit kernels read; their tensor-core code then runs unchanged. The
 * scales stay out of the products: k_scale multiplies the raw dot q.x of a
 * key (before the NaN rule sees it), v_scale the finished o row. */

/* The start of a decode kernel, the first of a step (sm_90): launched as
 * the programmatic dependent of the kernel before it (engine.cu's run()),
 * it waits for that kernel before reading anything but the plan, and only
 * then lets its own dependents (prefill, the merge) launch, so none of them
 * starts reading before the kernels before the step are done. */
__device__ __forceinline__ void decode_grid_start()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/* The scales of KV head h (1 without scales). */
struct kv_scales {
    float k, v;
};
__device__ __forceinline__ kv_scales kv_scales_of(const attn_params &p, int kv_head)
{
    kv_scales s;
    s.k = p.k_scale ? ak_kv_scale_at(p.kv_scale_kind, p.k_scale, kv_head) : 1.0f;
    s.v = p.v_scale ? ak_kv_scale_at(p.kv_scale_kind, p.v_scale, kv_head) : s.k;
    if (p.kv_scale_kind == AK_KV_SCALE_NONE) s.k = s.v = 1.0f;
    return s;
}

/* Two e4m3 values (low byte first) as a pair of T, exactly. */
template <typename T> __device__ __forceinline__ uint32_t fp8x2_to(uint16_t x);
template <> __device__ __forceinline__ uint32_t fp8x2_to<__half>(uint16_t x)
{
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)x, __NV_E4M3);
    return (uint32_t)h.x | (uint32_t)h.y << 16;
}
template <> __device__ __forceinline__ uint32_t fp8x2_to<__nv_bfloat16>(uint16_t x)
{
    const uint32_t h = fp8x2_to<__half>(x);
    return dtype_traits<__nv_bfloat16>::pack(__half2float(__ushort_as_half((unsigned short)(h & 0xffff))),
                                             __half2float(__ushort_as_half((unsigned short)(h >> 16))));
}

/* Two e4m3 values (low byte first) as floats; one as a float. */
__device__ __forceinline__ float2 fp8x2_to_float2(uint16_t x)
{
    const uint32_t h = fp8x2_to<__half>(x);
    return make_float2(__half2float(__ushort_as_half((unsigned short)(h & 0xffff))),
                       __half2float(__ushort_as_half((unsigned short)(h >> 16))));
}
__device__ __forceinline__ float fp8_to_float(uint8_t x) { return fp8x2_to_float2(x).x; }

/* 16 e4m3 values -> 16 T (two 16-byte chunks). */
template <typename T> __device__ __forceinline__ void fp8x16_to(const uint4 x, uint4 &lo, uint4 &hi)
{
    lo = make_uint4(fp8x2_to<T>(x.x & 0xffff), fp8x2_to<T>(x.x >> 16), fp8x2_to<T>(x.y & 0xffff),
                    fp8x2_to<T>(x.y >> 16));
    hi = make_uint4(fp8x2_to<T>(x.z & 0xffff), fp8x2_to<T>(x.z >> 16), fp8x2_to<T>(x.w & 0xffff),
                    fp8x2_to<T>(x.w >> 16));
}

/* Non-zero when a byte of w is an e4m3 NaN (S.1111.111; e4m3fn has no
 * infinity): its low seven bits plus one carry into the byte's top bit only
 * when they are all ones. */
__device__ __forceinline__ uint32_t nonfinite_fp8x4(uint32_t w) { return ((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u; }

/* The shared-memory offset (bytes) of fp8 chunk c (16 elements) of key row
 * `row` in a [TILE][DP] stage. */
template <int DP> __device__ __forceinline__ int fp8_at(int row, int c)
{
    /* swizzled like swz: the 8 rows an ldmatrix reads at one chunk hit 8
     * different 16-byte bank groups (rows of 64 bytes: two to a 128-byte
     * line, so the row pair's index is the key) */
    if (DP == 64) return row * 64 + ((c ^ ((row >> 1) & 3)) << 4);
    return row * DP + ((c ^ (row & 7)) << 4);
}

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

/* The same for fp8 rows (load_kv_tile_fp8: chunk = threadIdx.x % (DP / 16),
 * 16 elements a chunk). */
template <int DP>
__device__ __forceinline__ kv_lane kv_lane_fp8(const attn_params &p, int kv_head)
{
    const int64_t c = (threadIdx.x % (DP / 16)) * 16;
    kv_lane l;
    l.k = kv_head * p.k_stride_head + c;
    l.v = kv_head * p.v_stride_head + c;
    return l;
}

/* The page of key `key` (a block's worth of keys) and its slot in the block. */
__device__ __forceinline__ int kv_page_of(const attn_params &p, int key, int &slot)
{
    int page;
    if (p.page_shift >= 0) {
        page = key >> p.page_shift;
        slot = key & ((1 << p.page_shift) - 1);
    } else {
        page = key / p.page_size;
        slot = key - page * p.page_size;
    }
    return page; /* ragged runs with page_shift 0: page = key, slot 0 */
}

/* The block id of page `page` of a request whose block ids (or rows) start
 * at page_base in `table` (plan_head.kv_table); ragged: the row itself.
 * ADDR 0 / 1: paged / ragged fixed at compile time (the wgmma kernel, at
 * 236 registers, spilled with the select); -1: p.ragged. */
template <int ADDR = -1>
__device__ __forceinline__ int32_t kv_id_of(const attn_params &p, const int32_t *table, int page_base, int page)
{
    const int idx = page_base + page;
    const bool ragged = ADDR < 0 ? p.ragged != 0 : ADDR == 1;
    return ragged ? idx : __ldg(table + idx);
}

/* A block id the kernels may follow: a device block table is read as the
 * caller wrote it (plan() cannot check it on the host), so an id outside
 * [0, num_blocks) (a negative one too, as unsigned) is clamped to the last
 * block of the pools: no read leaves them, and the request's output is as
 * meaningless as its table. One unsigned min: a zero fill instead (a
 * compare and a byte count per row) cost the wgmma prefill 3% of its time. */
__device__ __forceinline__ int64_t kv_block_clamped(const attn_params &p, int32_t id)
{
    return (int64_t)min((uint32_t)id, (uint32_t)p.num_blocks - 1u);
}

/* The block (paged: its id, clamped; ragged: the row) and slot of key `key`
 * of a request whose block ids (or rows) start at page_base; see
 * load_kv_tile. */
template <int ADDR = -1>
__device__ __forceinline__ int64_t kv_block_of(const attn_params &p, const int32_t *table, int page_base, int key,
                                               int &slot)
{
    const int page = kv_page_of(p, key, slot);
    return kv_block_clamped(p, kv_id_of<ADDR>(p, table, page_base, page));
}

/* The block ids of the key rows one thread of load_kv_tile copies (CHUNKS
 * chunks a row, THREADS threads, a tile of TILE keys): looked up for a tile
 * ahead of its copy, the loads' latency is hidden behind the tile before
 * (fetch_tile_ids). At pages of one key every row has its own id, and a
 * decode that waited for them at each copy spent half its cycles on that
 * dependency. */
template <int CHUNKS, int TILE, int THREADS> struct tile_ids {
    static constexpr int N = TILE * CHUNKS / THREADS;
    int32_t id[N];
};

template <int CHUNKS, int TILE, int THREADS, int ADDR = -1>
__device__ __forceinline__ void fetch_tile_ids(const attn_params &p, const int32_t *table, int page_base, int t0,
                                               int kv_end, tile_ids<CHUNKS, TILE, THREADS> &ids)
{
    const int row0 = threadIdx.x / CHUNKS;
#pragma unroll
    for (int i = 0; i < ids.N; i++) {
        const int key = min(t0 + row0 + i * (THREADS / CHUNKS), kv_end - 1);
        int slot;
        ids.id[i] = kv_id_of<ADDR>(p, table, page_base, kv_page_of(p, key, slot));
    }
}

/* Cooperative cp.async of keys [t0, t0 + TILE) of K and V (THREADS threads)
 * into one stage of two swizzled [TILE][DP] tiles (swz); K rows are DQK elements, V rows DVO, the rest of
 * a DP row is left as it is (no kernel reads it). Keys at or past kv_end are
 * zero-filled (and masked by the caller), and so are keys before kv_lo (a
 * decode's window: no row of the tile sees them, and a NaN there must not
 * reach o as 0 * NaN). Two addressing schemes, one loader:
 *   paged  (p.ragged == 0): key j of the request is slot j % page_size of
 *          block table[page_base + j / page_size] (an id out of range:
 *          clamped, see kv_block_clamped);
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
 * offset (their strides are equal).
 * load_kv_tile_ids copies with the ids fetch_tile_ids looked up (a tile
 * ahead: the decode kernel); load_kv_tile looks each up as it copies (one
 * loop: the prefill kernels, at 255 registers, lost 2% to the two loops). */
template <int DQK, int DVO, int DP, int TILE, int THREADS, typename T>
__device__ __forceinline__ void load_kv_tile_ids(const attn_params &p, const tile_ids<DP / 8, TILE, THREADS> &ids,
                                                 kv_lane lane, int t0, int kv_end, T *ks, T *vs, int kv_lo = INT_MIN)
{
    constexpr int CHUNKS = DP / 8;
    static_assert(THREADS % CHUNKS == 0 && (TILE * CHUNKS) % THREADS == 0, "tile chunks divide among the threads");
    const int chunk = threadIdx.x % CHUNKS;
    const int row0 = threadIdx.x / CHUNKS;
#pragma unroll
    for (int i = 0; i < TILE * CHUNKS / THREADS; i++) {
        const int row = row0 + i * (THREADS / CHUNKS);
        const int key = min(t0 + row, kv_end - 1);
        int slot;
        kv_page_of(p, key, slot);
        const int64_t block = kv_block_clamped(p, ids.id[i]);
        const int64_t k_off = lane.k + (int64_t)slot * p.k_stride_slot;
        const int64_t v_off = DQK == DVO ? k_off - lane.k + lane.v : lane.v + (int64_t)slot * p.v_stride_slot;
        const int bytes = t0 + row < kv_end && t0 + row >= kv_lo ? 16 : 0;
        const int at = swz<DP>(row, chunk);
        const uint64_t pol = l2_evict_first(); /* read once in the step */
        if (chunk < DQK / 8)
            cp_async_16_pol(ks + at, (const T *)p.k_pool + block * p.k_block_stride + k_off, bytes, pol);
        if (chunk < DVO / 8)
            cp_async_16_pol(vs + at, (const T *)p.v_pool + block * p.v_block_stride + v_off, bytes, pol);
    }
}

template <int DQK, int DVO, int DP, int TILE, int THREADS, typename T>
__device__ __forceinline__ void load_kv_tile(const attn_params &p, const int32_t *table, int page_base, kv_lane lane,
                                             int t0, int kv_end, T *ks, T *vs, int kv_lo = INT_MIN)
{
    constexpr int CHUNKS = DP / 8;
    static_assert(THREADS % CHUNKS == 0 && (TILE * CHUNKS) % THREADS == 0, "tile chunks divide among the threads");
    const int chunk = threadIdx.x % CHUNKS;
    const int row0 = threadIdx.x / CHUNKS;
#pragma unroll
    for (int i = 0; i < TILE * CHUNKS / THREADS; i++) {
        const int row = row0 + i * (THREADS / CHUNKS);
        const int key = min(t0 + row, kv_end - 1);
        int slot;
        const int64_t block = kv_block_of(p, table, page_base, key, slot);
        const int64_t k_off = lane.k + (int64_t)slot * p.k_stride_slot;
        const int64_t v_off = DQK == DVO ? k_off - lane.k + lane.v : lane.v + (int64_t)slot * p.v_stride_slot;
        const int bytes = t0 + row < kv_end && t0 + row >= kv_lo ? 16 : 0;
        const int at = swz<DP>(row, chunk);
        if (chunk < DQK / 8) cp_async_16(ks + at, (const T *)p.k_pool + block * p.k_block_stride + k_off, bytes);
        if (chunk < DVO / 8) cp_async_16(vs + at, (const T *)p.v_pool + block * p.v_block_stride + v_off, bytes);
    }
}

/* load_kv_tile for fp8 pools: keys [t0, t0 + TILE) of K and V, 16 elements
 * a cp.async, into [TILE][DP]-byte stages at fp8_at (rows of DQK and DVO
 * bytes, the rest left as it is); the same addressing, the same zero fill
 * past kv_end and before kv_lo. lane: kv_lane_fp8. */
template <int DQK, int DVO, int DP, int TILE, int THREADS>
__device__ __forceinline__ void load_kv_tile_fp8_ids(const attn_params &p, const tile_ids<DP / 16, TILE, THREADS> &ids,
                                                     kv_lane lane, int t0, int kv_end, uint8_t *ks, uint8_t *vs,
                                                     int kv_lo = INT_MIN)
{
    constexpr int CHUNKS = DP / 16;
    static_assert(DQK % 16 == 0 && DVO % 16 == 0, "fp8 rows are whole 16-byte chunks");
    static_assert(THREADS % CHUNKS == 0 && (TILE * CHUNKS) % THREADS == 0, "tile chunks divide among the threads");
    const int chunk = threadIdx.x % CHUNKS;
    const int row0 = threadIdx.x / CHUNKS;
#pragma unroll
    for (int i = 0; i < TILE * CHUNKS / THREADS; i++) {
        const int row = row0 + i * (THREADS / CHUNKS);
        const int key = min(t0 + row, kv_end - 1);
        int slot;
        kv_page_of(p, key, slot);
        const int64_t block = kv_block_clamped(p, ids.id[i]);
        const int64_t k_off = lane.k + (int64_t)slot * p.k_stride_slot;
        const int64_t v_off = DQK == DVO ? k_off - lane.k + lane.v : lane.v + (int64_t)slot * p.v_stride_slot;
        const int bytes = t0 + row < kv_end && t0 + row >= kv_lo ? 16 : 0;
        const int at = fp8_at<DP>(row, chunk);
        /* (no L2 policy here: with l2_evict_first's, the fp8 kernels stopped
         * on an illegal instruction at this copy on the H100, nvcc 13) */
        if (chunk < DQK / 16)
            cp_async_16(ks + at, (const uint8_t *)p.k_pool + block * p.k_block_stride + k_off, bytes);
        if (chunk < DVO / 16)
            cp_async_16(vs + at, (const uint8_t *)p.v_pool + block * p.v_block_stride + v_off, bytes);
    }
}

template <int DQK, int DVO, int DP, int TILE, int THREADS, int ADDR = -1>
__device__ __forceinline__ void load_kv_tile_fp8(const attn_params &p, const int32_t *table, int page_base,
                                                 kv_lane lane, int t0, int kv_end, uint8_t *ks, uint8_t *vs,
                                                 int kv_lo = INT_MIN)
{
    constexpr int CHUNKS = DP / 16;
    static_assert(THREADS % CHUNKS == 0 && (TILE * CHUNKS) % THREADS == 0, "tile chunks divide among the threads");
    const int chunk = threadIdx.x % CHUNKS;
    const int row0 = threadIdx.x / CHUNKS;
#pragma unroll
    for (int i = 0; i < TILE * CHUNKS / THREADS; i++) {
        const int row = row0 + i * (THREADS / CHUNKS);
        const int key = min(t0 + row, kv_end - 1);
        int slot;
        const int64_t block = kv_block_of<ADDR>(p, table, page_base, key, slot);
        const int64_t k_off = lane.k + (int64_t)slot * p.k_stride_slot;
        const int64_t v_off = DQK == DVO ? k_off - lane.k + lane.v : lane.v + (int64_t)slot * p.v_stride_slot;
        const int bytes = t0 + row < kv_end && t0 + row >= kv_lo ? 16 : 0;
        const int at = fp8_at<DP>(row, chunk);
        if (chunk < DQK / 16)
            cp_async_16(ks + at, (const uint8_t *)p.k_pool + block * p.k_block_stride + k_off, bytes);
        if (chunk < DVO / 16)
            cp_async_16(vs + at, (const uint8_t *)p.v_pool + block * p.v_block_stride + v_off, bytes);
    }
}

/* Zeroes the NaN and infinite elements of a 16-byte chunk of 16-bit T;
 * returns whether there was one (the NaN rule's V scan, attn.cuh below). */
template <typename T> __device__ __forceinline__ bool scrub_nonfinite(uint4 &v);

/* Converts rows [row0, row0 + ROWS) of an fp8 K/V stage (fp8_at) into
 * 16-bit T tiles in the swizzled layout (swz<DP>) the tensor-core code
 * reads, NT threads (ids tid) side by side, 16 elements at a time. With
 * SCAN (the NaN rule's rule 3, a mixed tile of a checked item), non-finite V
 * elements are zeroed and their keys marked in bits (one bit per row of the
 * tile), as scan_v_tile does. */
template <int DQK, int DVO, int DP, int ROWS, int NT, typename T, bool SCAN = false>
__device__ __forceinline__ void convert_fp8_rows(const uint8_t *ks8, const uint8_t *vs8, T *ks, T *vs, int row0,
                                                 int tid, uint32_t *bits = nullptr)
{
    constexpr int KC = DQK / 16, VC = DVO / 16;
#pragma unroll 4
    for (int u = tid; u < ROWS * (KC + VC); u += NT) {
        const bool is_v = u >= ROWS * KC;
        const int w = is_v ? u - ROWS * KC : u;
        const int per = is_v ? VC : KC;
        const int row = row0 + w / per, c = w % per;
        const uint4 x = *(const uint4 *)((is_v ? vs8 : ks8) + fp8_at<DP>(row, c));
        uint4 lo, hi;
        fp8x16_to<T>(x, lo, hi);
        if (SCAN && is_v) {
            const bool bad_lo = scrub_nonfinite<T>(lo), bad_hi = scrub_nonfinite<T>(hi);
            if (bad_lo || bad_hi) atomicOr(bits + row / 32, 1u << (row % 32));
        }
        T *dst = is_v ? vs : ks;
        *(uint4 *)(dst + swz<DP>(row, 2 * c)) = lo;
        *(uint4 *)(dst + swz<DP>(row, 2 * c + 1)) = hi;
    }
}

/* The logit of a key in base 2, soft-capped when asked. */
__device__ __forceinline__ float to_logit2(const attn_params &p, float dot)
{
    if (p.soft_cap > 0.0f) return p.cap_log2 * tanhf(dot * p.cap_scale);
    return dot * p.scale_log2;
}

/* Issues the cp.async copies of an item's query tile into shared memory: ROWS
 * rows (token i, head g of the tile's hb heads: tile_token) of DQK
 * elements in a layout of DP-element rows, the block's THREADS threads
 * striding over the DP / 8 chunks of each row (chunks past DQK are left
 * alone); rows past the item's tokens or heads are zero-filled. at(row,
 * chunk) is the element offset of a chunk in the kernel's layout. THREADS
 * may be a warpgroup of a larger block (threads from a multiple of THREADS). */
template <int ROWS, int THREADS, int DQK, int DP, typename T, typename At>
__device__ __forceinline__ void load_q_tile(const attn_params &p, const prefill_item &it, int head0, int hb, int heads,
                                            T *qs, At at)
{
    constexpr int CHUNKS = DP / 8;
    static_assert(THREADS % CHUNKS == 0, "q chunks divide among the threads");
    const int c = threadIdx.x % CHUNKS;
    if (c >= DQK / 8) return;
#pragma unroll 4
    for (int row = threadIdx.x % THREADS / CHUNKS; row < ROWS; row += THREADS / CHUNKS) {
        int g;
        const int i = tile_token(p, row, g);
        const bool valid = i < it.ntok && g < heads;
        const T *src =
            (const T *)p.q + (valid ? (it.tok0 + i) * p.q_stride_tok + (head0 + g) * p.q_stride_head + c * 8 : 0);
        cp_async_16(qs + at(row, c), src, valid ? 16 : 0);
    }
}

/* The online softmax's lazy rescale (the prefill kernels, mla_wgmma.cu): a
 * row's reference max m is raised only when a tile's max passes it by more
 * than RESCALE_SLACK (base 2), so p = exp2(logit - m) stays below 2^8
 * (harmless in f32 sums and in a 16-bit P) and o is rescaled on a few
 * tiles instead of all. The decision is warp-wide, so the branch never
 * diverges. A row with nothing visible yet keeps m = -inf (the caller uses
 * 0 as its reference then, so exp2 never sees -inf - -inf). */
#define RESCALE_SLACK 8.0f

/* Diagnostics builds only (CMake AK_PREFILL_ABLATE; bench/README.md): part
 * of a key tile's softmax in the warpgroup-MMA kernels left out, their
 * outputs wrong, so that the time of such a build beside the full one says
 * what that part costs where the tensor cores wait for it. 1: all of it (P
 * is the raw products, o never rescaled: the pipeline's own ceiling); 2:
 * the row maxima (no max, no shuffle, no raise: the reference stays 0); 3:
 * the exponentials (P = logit - m); 4: the clean loop's rare branches
 * (prefill_wgmma.cu: every tile after an item's first goes ahead, and one
 * past AHEAD_RANGE is not computed again, so a row with no key in its
 * first tile, or logits that far apart, come out wrong). 0, every other
 * build: none. */
#ifndef AK_PREFILL_ABLATE
#define AK_PREFILL_ABLATE 0
#endif

/* For a warp's two rows a thread (mma / wgmma fragments), once some lane
 * asked (raise_lane): m takes the tile's max tmax, d is scaled, and f gets
 * the factors o must be scaled by; else f is 1. Returns whether m moved. */
__device__ __forceinline__ bool raise_rows(bool raise_lane, const float (&tmax)[2], float (&m)[2], float (&d)[2],
                                           float (&f)[2])
{
    const bool raise = __any_sync(0xffffffffu, raise_lane);
    f[0] = f[1] = 1.0f;
    if (raise) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float m_new = fmaxf(m[h], tmax[h]);
            f[h] = m_new == -INFINITY ? 1.0f : exp2f(m[h] - m_new);
            m[h] = m_new;
            d[h] *= f[h];
        }
    }
    return raise;
}

/* The online softmax of a tile after its masks, for a warp's two rows a
 * thread (the wgmma kernels' S fragments, NT n tiles of 8 keys): s holds
 * logits before their scale sc (base 2), -inf where hidden. Raises m by
 * the lazy rule (raise_rows, its factors in f), turns s into P =
 * exp2(s sc - m), adds P to the rows' sums d and returns whether m moved.
 * (Its exponentials, on the multi-function unit, bound the softmax. Some of
 * them by a cubic on the FMA pipe made ptxas serialize the prefill's
 * warpgroup MMAs at head dims 64-128, for want of registers; two at a time
 * in f16 was 2-19% slower. Computing the maxima as eight interleaved
 * chains, and the raise by selects instead of this branch, measured level,
 * 0.99-1.02 of the time. Each row raised on its own, without the warp's
 * vote deciding it, its exponentials right after its own max in the
 * source (the order of FlashInfer's FA3 loop): ptxas still computed both
 * maxima first, waited for the last P V before them, not after them, and
 * the long shapes took 1.012-1.019 of the time: BENCHMARKS.md.) */
template <int NT>
__device__ __forceinline__ bool softmax_rows(float (&s)[NT][4], float sc, float (&m)[2], float (&d)[2], float (&f)[2])
{
    float tmax[2];
    bool raise = false;
#pragma unroll
    for (int h = 0; h < 2 && AK_PREFILL_ABLATE != 2; h++) {
        float x = -INFINITY;
#pragma unroll
        for (int n = 0; n < NT; n++) x = fmaxf(x, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
        tmax[h] = x * sc;
        raise |= tmax[h] > m[h] + RESCALE_SLACK || (m[h] == -INFINITY && x > -INFINITY);
    }
    if (AK_PREFILL_ABLATE == 2) f[0] = f[1] = 1.0f;
    else raise = raise_rows(raise, tmax, m, d, f);
    const float ref0 = m[0] == -INFINITY ? 0.0f : m[0], ref1 = m[1] == -INFINITY ? 0.0f : m[1];
    auto ex2 = [](float x) { return AK_PREFILL_ABLATE == 3 ? x : exp2f(x); };
#pragma unroll
    for (int n = 0; n < NT; n++) {
        s[n][0] = ex2(fmaf(s[n][0], sc, -ref0));
        s[n][1] = ex2(fmaf(s[n][1], sc, -ref0));
        s[n][2] = ex2(fmaf(s[n][2], sc, -ref1));
        s[n][3] = ex2(fmaf(s[n][3], sc, -ref1));
        d[0] += s[n][0] + s[n][1];
        d[1] += s[n][2] + s[n][3];
    }
    return raise;
}

/* softmax_rows with the exponentials ahead of the maxima, for a warp whose
 * rows all have a reference m already (the caller's vote): P = exp2(s sc -
 * m) at once, and on most tiles no maxima at all. P >= 0, so a lane's sum
 * of its P of a row (which d needs anyway) bounds each of them: where no
 * lane's sum passed 2^RESCALE_SLACK, no P did, and m stays, as the lazy
 * rescale would keep it. Only where some lane's sum passed (a P past 8 at
 * least, as 2 NT of them at most 1 sum to 32) does the warp take the
 * tile's maxima from P (monotonic in s) and raise every row whose max
 * passed 1 to it: P, its sum and o are then scaled by the factor that
 * moves m (so the row's P are at most 1 again, and a later tile's sum
 * passes only where its logits passed m by 3 or more). A row whose P passed
 * 2^AHEAD_RANGE may have overflowed (exp2 does past 2^128; the margin keeps
 * the sums finite): the warp leaves m and d as they were and returns
 * SOFTMAX_FAR, s spent (the caller computes S again and takes
 * softmax_rows). Else returns SOFTMAX_RAISED if m moved, with f as
 * softmax_rows. */
#define AHEAD_RANGE 120 /* (2^120: a thread's sum of 2 NT such stays finite in f32) */
enum { SOFTMAX_RAISED = 1, SOFTMAX_FAR = 2 };
template <int NT>
__device__ __forceinline__ int softmax_rows_ahead(float (&s)[NT][4], float sc, float (&m)[2], float (&d)[2],
                                                  float (&f)[2])
{
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NT; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) s[n][e] = exp2f(fmaf(s[n][e], sc, -m[e / 2]));
        sum[0] += s[n][0] + s[n][1];
        sum[1] += s[n][2] + s[n][3];
    }
    f[0] = f[1] = 1.0f;
    if (!__any_sync(0xffffffffu, fmaxf(sum[0], sum[1]) > exp2f(RESCALE_SLACK))) {
        d[0] += sum[0];
        d[1] += sum[1];
        return 0;
    }
    float x[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NT; n++) {
        x[0] = fmaxf(x[0], fmaxf(s[n][0], s[n][1]));
        x[1] = fmaxf(x[1], fmaxf(s[n][2], s[n][3]));
    }
    bool far = false;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        x[h] = fmaxf(x[h], __shfl_xor_sync(0xffffffffu, x[h], 1));
        x[h] = fmaxf(x[h], __shfl_xor_sync(0xffffffffu, x[h], 2));
        far |= x[h] > exp2f(AHEAD_RANGE); /* (an overflow's +inf too) */
    }
    if (__any_sync(0xffffffffu, far)) return SOFTMAX_FAR;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float m_new = m[h] + (x[h] > 1.0f ? __log2f(x[h]) : 0.0f);
        f[h] = exp2f(m[h] - m_new); /* (m_new as stored: later tiles' frame) */
        m[h] = m_new;
        d[h] = (d[h] + sum[h]) * f[h];
    }
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[n][e] *= f[e / 2];
    return SOFTMAX_RAISED;
}

/* The final state of a row whose online softmax ended with max m (base 2,
 * -inf when no key was seen) and sum d = sum exp2(logit - m): the factor its
 * o accumulator is multiplied by, and its LSE (natural log). With a sink
 * (p.sinks: a logit z of its head that joins the denominator once, with no
 * value), d + exp2(z log2 e - m) is the denominator, computed against the
 * larger of the two maxima so that neither overflows; a row that saw no key
 * then has o = 0 and lse = z. Split-KV partials are finished without it (the
 * merge adds it once). d is NaN for a row the NaN rule (attnkit.h) reached
 * (the kernels add bad_of() of what they check to it): inv and lse are NaN
 * then, and only d == 0 means "no key". */
__device__ __forceinline__ void finish_row(const attn_params &p, int head, bool partial, float m, float d, float &inv,
                                           float &lse)
{
    if (p.sinks && !partial) {
        const float z = p.sinks[head] * LOG2E;
        const float top = fmaxf(m, z);
        const float w = d == 0.0f ? 0.0f : exp2f(m - top); /* the keys' share, in the frame of top */
        const float den = d * w + exp2f(z - top);
        inv = w / den;
        lse = (top + log2f(den)) * LN2;
        return;
    }
    inv = d == 0.0f ? 0.0f : 1.0f / d;
    lse = d == 0.0f ? -INFINITY : (m + log2f(d)) * LN2;
}

/* ---- the NaN rule (attnkit.h): what the kernels check ----
 * Two paths. A prefill item whose request the scan pass (scan.cu) found
 * clean (K and V all finite: its flags, item_checked), or any prefill item
 * of a kernel that finds the rule's cases itself (PASS_DETECT, below: it
 * runs the items it finds again, checked), runs unchecked, but
 * for its q rows (q_rows_bad, once an item): with finite inputs only an f32
 * overflow can make a value non-finite, and the rule leaves that open. Every other item (a request the pass found a NaN or
 * infinity in, or one too short to be worth a pass: prefill_item.scan < 0,
 * or whose tasks this run does not scan: scanned_tasks),
 * and every decode item, runs checked. A row is made NaN by adding a NaN to
 * its softmax sum d (finish_row then gives NaN o and lse, and a split part's
 * NaN lse makes the merge NaN):
 *   1. the raw product q.k of every key the row sees, before the soft-cap
 *      (which maps +-inf to +-cap) and the masks: add_bad(d, s) adds s * 0,
 *      0 when s is finite, NaN when not (one FFMA a logit);
 *   2. its o accumulator at the end (a NaN or infinity in a V row it sees
 *      reaches o and nothing else): the same over the row's o elements;
 *   3. keys a row does not see must not reach o as 0 * NaN through P.V: keys
 *      past kv_end are zero-filled by the loaders (the Hopper prefill's TMA
 *      copies the request's own keys past kv_end into a causal item's last
 *      tile, a mixed one below; keys past the request's are zero-filled
 *      always); in a tile where some keys
 *      are hidden from some rows (the causal diagonal, a window's edge), the
 *      kernels scan V for non-finite elements (scan_v_tile) and, where there
 *      are some (the block agrees), zero them and mark their keys, and each
 *      row that sees a marked key is made NaN (flag_bad_keys). */
__device__ __forceinline__ void add_bad(float &d, float x) { d = fmaf(x, 0.0f, d); }

/* The NaN rule found in the kernel (PASS_DETECT below; prefill_wgmma.cu
 * below DP 256): every item runs unchecked, and the block runs again,
 * checked, each item where that path may have broken the rule. With q's
 * rows checked (q_rows_bad), no window and no soft-cap, it breaks it in
 * two cases only, both seen in the rows of the item's last token, which see
 * every key of its tiles below kv_end:
 *   - a V element of a key the item's tiles hold is NaN or infinite: P.V
 *     then makes that column of every row's o non-finite (P x inf is inf,
 *     or NaN at P = 0; a NaN stays one through the rescales), and
 *     o_nonfinite finds it in any row;
 *   - a K row holds an infinity, and a row that sees its key gets -inf for
 *     the raw product: P is 0 and nothing else shows it. A non-finite K
 *     element makes the raw product non-finite for every finite q row (inf
 *     x q is +-inf, NaN at q = 0), so the last token's rows have one there
 *     too: -inf is their minimum's (has_neg_inf), and NaN or +inf reaches
 *     their o (P NaN) and so o_nonfinite.
 * Either may flag an item whose rows were right (a bad key hidden from
 * every row, a row's own bad q); the checked run is right for every row.
 * A block keeps the flags of its first REDO_ITEMS items (a bit each), and
 * runs any later item checked at once. */
#define REDO_ITEMS 2048
/* the named barrier at which a block's consumers and producer start the
 * second phase (every flag written) */
#define REDO_BAR 15
/* Whether the block's item k is to run again (redo: the block's flags, a
 * bit an item); set by redo_flag. */
__device__ __forceinline__ bool redo_flagged(const uint32_t *redo, int k) { return (redo[k / 32] >> (k % 32)) & 1u; }
__device__ __forceinline__ void redo_flag(uint32_t *redo, int k) { atomicOr(redo + k / 32, 1u << (k % 32)); }
/* Whether the minimum of the raw products of this thread's row h (an m64
 * accumulator's NT n tiles) is -inf; a NaN is passed over. */
template <int NT, int H> __device__ __forceinline__ bool has_neg_inf(const float (&s)[NT][4])
{
    float mn = fminf(s[0][2 * H], s[0][2 * H + 1]);
#pragma unroll
    for (int n = 1; n < NT; n++) mn = fminf(mn, fminf(s[n][2 * H], s[n][2 * H + 1]));
    return mn == -INFINITY;
}
/* Whether any of this thread's first N n tiles of o in row h is NaN or
 * infinite. */
template <int N, int H, int DN> __device__ __forceinline__ bool o_nonfinite(const float (&o)[DN][4])
{
    float z = 0.0f;
#pragma unroll
    for (int n = 0; n < N; n++) {
        add_bad(z, o[n][2 * H]);
        add_bad(z, o[n][2 * H + 1]);
    }
    return z != z;
}

/* The passes of a prefill kernel over the plan's items (the NaN rule's two
 * paths where one kernel cannot hold both: prefill_wgmma.cu at DP 256):
 * PASS_ALL takes every item, PASS_CHECKED the items that run checked, and
 * PASS_CLEAN those the scan pass found clean, run unchecked by a kernel of
 * their own (engine.cu launches it first, the checked one after it). An
 * item is in exactly one of the two; without a scan pass every item runs
 * checked. PASS_QUEUE is the clean pass where the scan pass runs beside
 * it (attn_params.scan_beside): every item of a scanned request, from a
 * queue, unchecked; the checked pass then runs those the flags mark
 * again. PASS_DETECT takes every item with no scan pass at all: unchecked
 * first, finding the rule's cases itself, then again, checked, the ones it
 * found (the NaN rule found in the kernel, below). */
enum { PASS_ALL = 0, PASS_CHECKED = 1, PASS_CLEAN = 2, PASS_QUEUE = 3, PASS_DETECT = 4 };

/* A compile-time bool as a value: one generic lambda, two paths. */
template <bool B> struct bool_c {
    static constexpr bool value = B;
};

/* The scan tasks this run's pass scans: every one with the pools' marks,
 * else the first plan_head.scan_long (the long requests', and the shorter
 * ones' whose rows are worth it); the items of the others run checked. */
__device__ __forceinline__ int scanned_tasks(const attn_params &p)
{
    return p.kv_marks ? p.head->counts[COUNT_SCAN] : p.head->scan_long;
}

/* Whether a prefill item runs checked: no task of its request scanned, or
 * any flag of them set (every warp reads them, lane i flags i, i + 32, ...:
 * the block agrees). */
__device__ __forceinline__ bool item_checked(const attn_params &p, const prefill_item &it, int kv_head)
{
    if (it.scan < 0 || it.scan >= scanned_tasks(p)) return true;
    bool bad = false;
    for (int i = threadIdx.x % 32; i < it.scan_n; i += 32)
        bad |= __ldg(p.scan_flags + (int64_t)(it.scan + i) * p.num_kv_heads + kv_head) != 0;
    return __any_sync(0xffffffffu, bad);
}

/* A one-pass kernel's view of the block's items (item blockIdx.x + k
 * gridDim.x is item k of the block): skip holds a bit for each of the first
 * PASS_MASK_ITEMS, set where the item is the other pass's, written once by
 * the whole block (pass_mask) before either side takes an item, so that the
 * consumers never read the scan's flags themselves (at DP 256 that check
 * alone made the checked kernel spill). Without scan tasks in the plan, and
 * from item PASS_MASK_ITEMS on, the checked pass takes every item. */
#define PASS_MASK_ITEMS 4096
/* the groups of 8 that hold a request's scan flags (engine.cu's
 * SCAN_TASKS_PER_REQ at most), a thread a group */
#define PASS_MASK_GROUPS 8
template <int PASS>
__device__ __forceinline__ bool mask_in_pass(const attn_params &p, const uint32_t *skip, int k)
{
    if (PASS == PASS_ALL || PASS == PASS_DETECT) return true;
    if (scanned_tasks(p) == 0 || k >= PASS_MASK_ITEMS) return PASS == PASS_CHECKED;
    return !((skip[k / 32] >> (k % 32)) & 1u);
}

/* skip's bits (zero before) by the block's THREADS threads, each an item's
 * group of 8 scan flags (PASS_MASK_GROUPS threads an item: one round of
 * loads, the item's then its flags', covers THREADS / PASS_MASK_GROUPS
 * items, 48 at DP 256, whose blocks hold about 31 at 4 x 4096; a thread an
 * item took up to eight), then a block barrier: item_checked's test. */
template <int PASS, int THREADS>
__device__ __forceinline__ void pass_mask(const attn_params &p, uint32_t *skip)
{
    const int num_items = p.head->counts[COUNT_PREFILL], scanned = scanned_tasks(p);
    for (int q = threadIdx.x % THREADS; q < PASS_MASK_ITEMS * PASS_MASK_GROUPS; q += THREADS) {
        const int k = q / PASS_MASK_GROUPS, i0 = q % PASS_MASK_GROUPS * 8;
        const int64_t w = blockIdx.x + (int64_t)k * gridDim.x;
        if (w >= num_items) break;
        const prefill_item it = p.pitems[w];
        bool checked;
        if (it.scan < 0 || it.scan >= scanned) {
            checked = i0 == 0; /* (one thread marks it) */
        } else {
            const int kv_head = heads_of(p, it).kv_head;
            int32_t any = 0;
#pragma unroll
            for (int i = i0; i < i0 + 8; i++)
                if (i < it.scan_n) any |= __ldg(p.scan_flags + (int64_t)(it.scan + i) * p.num_kv_heads + kv_head);
            checked = any != 0;
        }
        if (checked) atomicOr(skip + k / 32, 1u << (k % 32)); /* (the checked items' bits first) */
    }
    __syncthreads();
    if (PASS == PASS_CHECKED) { /* (the clean items' bits instead) */
        for (int i = threadIdx.x % THREADS; i < PASS_MASK_ITEMS / 32; i += THREADS) skip[i] = ~skip[i];
        __syncthreads();
    }
}

/* Rule 1 over the rows h of an m16n8 accumulator tile of raw products (NT n
 * tiles of 8 keys from t0): every key when no key of the tile is hidden from
 * the row's warp (!masked), else only the keys [lo, hi] the row sees. */
template <int NT>
__device__ __forceinline__ void check_logits(const attn_params &p, const float (&s)[NT][4], int h, int pos, int t0,
                                             int kv_end, int lane, bool masked, float &d)
{
    if (!masked) {
#pragma unroll
        for (int n = 0; n < NT; n++) {
            add_bad(d, s[n][2 * h]);
            add_bad(d, s[n][2 * h + 1]);
        }
        return;
    }
    const int hi = ak_visible_hi(pos, kv_end, p.causal);
    const int lo = ak_visible_lo(pos, p.window_left);
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; e++) {
            const int key = t0 + n * 8 + (lane % 4) * 2 + (e & 1);
            if (key <= hi && key >= lo) add_bad(d, s[n][e]);
        }
}

/* The exponent bits of both halves of a pair of 16-bit elements: all set in
 * a half means NaN or an infinity. */
template <typename T> struct nonfinite_bits;
template <> struct nonfinite_bits<__half> {
    static constexpr uint32_t value = 0x7c007c00u;
};
template <> struct nonfinite_bits<__nv_bfloat16> {
    static constexpr uint32_t value = 0x7f807f80u;
};

/* Non-zero when a half of w (a pair of 16-bit elements) is NaN or infinite:
 * its exponent field plus one exponent unit carries into the half's top bit
 * only when the field is all ones (the low half's carry stops there). */
template <typename T> __device__ __forceinline__ uint32_t nonfinite_pair(uint32_t w)
{
    constexpr uint32_t E = nonfinite_bits<T>::value;
    constexpr uint32_t ONE = E & ~(E << 1); /* the lowest exponent bit of each half */
    return ((w & E) + ONE) & 0x80008000u;
}

template <typename T> __device__ __forceinline__ bool scrub_nonfinite(uint4 &v)
{
    constexpr uint32_t E = nonfinite_bits<T>::value;
    const uint32_t bx = __vcmpeq2(v.x & E, E), by = __vcmpeq2(v.y & E, E);
    const uint32_t bz = __vcmpeq2(v.z & E, E), bw = __vcmpeq2(v.w & E, E);
    if (!(bx | by | bz | bw)) return false;
    v.x &= ~bx;
    v.y &= ~by;
    v.z &= ~bz;
    v.w &= ~bw;
    return true;
}

/* The rows of a warp's 16 q rows (from row0, in shared memory at at(row,
 * chunk)) that hold a NaN or an infinity: bit 2 i for row row0 + i, in every
 * lane. Two lanes a row. */
template <int DQK, typename T, typename At>
__device__ __forceinline__ uint32_t q_rows_bad(const T *qs, At at, int row0, int lane)
{
    const int row = row0 + lane / 2;
    uint32_t bad = 0;
#pragma unroll
    for (int c = lane % 2; c < DQK / 8; c += 2) {
        const uint4 v = *(const uint4 *)(qs + at(row, c));
        bad |= nonfinite_pair<T>(v.x) | nonfinite_pair<T>(v.y) | nonfinite_pair<T>(v.z) | nonfinite_pair<T>(v.w);
    }
    const uint32_t b = __ballot_sync(0xffffffffu, bad != 0);
    return (b | b >> 1) & 0x55555555u;
}

/* Rule 3: this thread's chunks of a V tile in shared memory (keys [0,
 * TILE), DP-element rows, chunk c of key row at element at(row, c); only
 * c < DVO / 8 hold V), THREADS threads side by side (this one tid). Zeroes
 * each non-finite element and sets the bit of its key in bits (TILE / 32
 * words, cleared beforehand); returns whether there was one. The chunks
 * must have landed for this thread: in prefill.cu they are its own copies
 * (cp.async.wait_group; it may run before the block's barrier), in the
 * wgmma kernels the producer's, waited for on the stage's V barrier. */
template <int DVO, int DP, int TILE, int THREADS, typename T, typename At>
__device__ __forceinline__ bool scan_v_tile(T *vs, At at, uint32_t *bits, int tid)
{
    constexpr int CHUNKS = DP / 8;
    static_assert(THREADS % CHUNKS == 0, "whole rows a pass");
    const int chunk = tid % CHUNKS, row0 = tid / CHUNKS;
    if (chunk >= DVO / 8) return false;
    bool found = false;
    /* passes of THREADS / CHUNKS rows; the last one partial where they do
     * not divide the tile (384 threads at DP 64: 48 rows a pass) */
#pragma unroll
    for (int i = 0; i < (TILE * CHUNKS + THREADS - 1) / THREADS; i++) {
        const int row = row0 + i * (THREADS / CHUNKS);
        if ((TILE * CHUNKS) % THREADS != 0 && row >= TILE) break;
        uint4 *c = (uint4 *)(vs + at(row, chunk));
        uint4 v = *c;
        if (scrub_nonfinite<T>(v)) {
            found = true;
            *c = v;
            atomicOr(bits + row / 32, 1u << (row % 32));
        }
    }
    return found;
}

/* Rule 3, the rows: in a tile whose V bad keys were marked in bits (TILE /
 * 32 words, TILE = 8 NT), a row h that sees one (its masked logit is not
 * -inf; a visible key whose logit is -inf made the row NaN already) is made
 * NaN. */
template <int NT>
__device__ __forceinline__ void flag_bad_keys(const float (&s)[NT][4], int h, int lane, const uint32_t *bits, float &d)
{
    uint32_t w[NT / 4];
    uint32_t any = 0;
#pragma unroll
    for (int i = 0; i < NT / 4; i++) any |= w[i] = bits[i];
    if (!any) return;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; e++) {
            const int key = n * 8 + (lane % 4) * 2 + (e & 1);
            if (s[n][e] != -INFINITY && (w[key / 32] >> (key % 32)) & 1u) d = __int_as_float(0x7fc00000);
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
    /* (Tried without a window: one compare of a constant a key against the
     * row's last visible key and a select, about 96 instructions fewer a
     * warp a masked tile at d128; level on the H100, not kept:
     * BENCHMARKS.md, 2026-12-07) */
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
 * dim. Head dims 512 have kernels of their own (decode_wide.cu,
 * prefill_wide.cu); any other pair up to AK_PORTABLE_MAX_DIM runs on the
 * portable kernel. */
#define AK_TC_HEAD_DIMS(X)                                                                                        \
    X(64, 64) X(80, 80) X(96, 96) X(112, 112) X(128, 128) X(192, 192) X(256, 256) X(192, 128) X(128, 64)
#define AK_PORTABLE_MAX_DIM 512

/* The pairs the tensor-core kernels are also compiled for with fp8 K/V (the
 * head dims of most models; any other pair with fp8 K/V runs on the portable
 * kernel, and every fp8 instance is one more of each kernel to compile). */
#define AK_TC_FP8_HEAD_DIMS(X) X(64, 64) X(128, 128) X(256, 256)

/* A kernel instance and its launch shape. */
struct attn_kernel {
    void (*fn)(const attn_params);
    int threads, smem; /* block size, dynamic shared memory (bytes) */
    int rows;          /* prefill: query rows a tile (tokens x heads packed); decode: query heads a tile;
                          merge: blocks a head (slices of its dims) */
    int unchecked;     /* prefill: runs the items the scan pass found clean unchecked (the NaN rule) */
    int tma_map;       /* fn takes a second parameter, a __grid_constant__ kv_maps (launch_kernel) */
    int merge_sub;     /* merge: blocks of a head's wide slice in the grid's y (merge.cu; 0 or 1: one) */
    int seg;           /* prefill: 64 where the kernel takes row tiles packed by its warpgroups' 64 rows
                          (attn_params.prow_seg_log2 6), else 0 */
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
/* The same over AK_TC_FP8_HEAD_DIMS (Info: the fp8 instances; T, the q and o
 * dtype, is the type K/V are converted to). */
template <template <int, int, typename> class Info, typename T>
inline attn_kernel kernel_table_fp8_of(int dqk, int dvo)
{
#define AK_PAIR_CASE_(QK, VO)                                                                                     \
    if (dqk == QK && dvo == VO) return Info<QK, VO, T>::get();
    AK_TC_FP8_HEAD_DIMS(AK_PAIR_CASE_)
#undef AK_PAIR_CASE_
    const attn_kernel none = {NULL, 0, 0, 0};
    return none;
}
template <template <int, int, typename> class Info>
inline attn_kernel kernel_table_fp8(int dqk, int dvo, ak_dtype dtype)
{
    return dtype == AK_BF16 ? kernel_table_fp8_of<Info, __nv_bfloat16>(dqk, dvo)
                            : kernel_table_fp8_of<Info, __half>(dqk, dvo);
}

/* fp8: a row's final state with v_scale (the finished o is times it): a
 * non-finite v_scale makes a row that saw a key NaN (the NaN rule: every
 * element it scales is), through d as the rule does. */
__device__ __forceinline__ void v_scale_rule(float v_scale, float &d)
{
    if (d != 0.0f) add_bad(d, v_scale);
}

/* Which kernel serves decode items: tensor cores (mma), CUDA cores (MHA at
 * equal head dims of 64, 128 or 256), the portable kernel, or the wide-row
 * engine (decode_wide.cu: head dim 512, and MLA's 576/512). */
typedef enum decode_engine {
    DECODE_CUDA_CORES = 0,
    DECODE_TENSOR_CORES = 1,
    DECODE_PORTABLE = 2,
    DECODE_WIDE = 3
} decode_engine;

/* The largest GQA group the CUDA-core engine serves (MHA); bigger groups use
 * tensor cores, one 16-row tile per 16 query heads (engine.cu has the
 * measurements behind the threshold). */
#define AK_DECODE_CC_MAX_GROUP 1

/* The decode kernel of an engine for a pair and dtype (fn NULL if none):
 * grid (ctas, num_kv_heads * row_tiles), each block looping over decode
 * items blockIdx.x, + ctas, ... dtype: q and o (and K/V unless fp8: K/V
 * in fp8 e4m3, the fp8 instances, tensor cores or portable). */
attn_kernel ak_cuda_decode_kernel(decode_engine engine, int dqk, int dvo, ak_dtype dtype, int fp8);

/* The wide-row decode kernel (decode_wide.cu) for 16-bit q and o (dtype)
 * over K/V of dtype or, fp8 1, fp8 e4m3: head dims 512/512 (mla 0) or
 * 576/512 with the value read from the K rows (mla 1); its rows (query
 * heads a block: 16, 32 or 64) chosen for the group. */
attn_kernel ak_cuda_decode_wide_kernel(int dqk, int dvo, ak_dtype dtype, int group, int mla, int fp8);

/* Absorbed MLA decode (576/512, the value read from the K rows) on Hopper
 * warpgroup MMA (mla_wgmma.cu, sm_90a): 64 query heads a block, 16-bit q, o
 * and latent rows of dtype; the same items and outputs as the wide-row
 * kernel. fn NULL in a build without sm_90. */
attn_kernel ak_cuda_mla_wgmma_kernel(ak_dtype dtype);

/* Encodes *map, that kernel's second parameter, from p's paged pool
 * (k_pool, strides, num_blocks, page_size): the latent pool as a tensor
 * [blocks][page_size][576] read in boxes of 64 x 64 (a column block of a key
 * tile). 1 when the pool allows it (pages of whole 64-key tiles, 16-byte
 * aligned rows and pages) and the driver encoded it, else 0 (the kernel then
 * copies with cp.async). Host only, no GPU work: run() calls it, and a
 * captured graph keeps the map it was captured with. */
int ak_cuda_mla_tma_map(const attn_params *p, CUtensorMap *map);
/* The maps of the wgmma prefill kernel (kv_maps, TMA boxes of 64 columns of
 * 16-bit rows, 128-byte swizzle): K's and V's, boxes of a key tile, half
 * of one or (page_boxes: pages of 16n keys too) 32 or 16 rows, their rows
 * in p->kv_box, or 0 where the pools do not allow TMA (alignment, strides,
 * pages not made of whole boxes) or the driver has no encoder; q's, a row
 * tile of the kernel's `rows` (p->prow_heads heads of rows /
 * p->prow_heads tokens) or, where the tile's segments (2^p->prow_seg_log2
 * rows) end in rows no token fills, a segment's whole tokens, the tokens in
 * p->q_box; or 0 where q's base or strides do not allow it or the heads do
 * not divide the rows of a tile of one segment (then the cp.async copies
 * zero the rows no token fills, so that a tile's bits never depend on an
 * earlier item's; the kernel zeroes them once for its boxes); o's, a
 * warpgroup's 64 of those rows (a kernel of 128: two warpgroups) where they
 * hold whole tokens, the tokens in p->o_box, or 0 (then o is written by the
 * warps). The maps depend on the pools (or ragged
 * tensors' base and strides) and on q's and o's, never on the plan: ragged
 * rows and q's and o's tokens are bounded by the kernel's items alone, as
 * its cp.async copies are. Host only, as ak_cuda_mla_tma_map. */
void ak_cuda_prefill_tma_maps(attn_params *p, int dqk, int dvo, int rows, int page_boxes, kv_maps *maps);
/* The rows of those maps' boxes for head dims (dqk, dvo), ragged K/V or
 * pages of page_size keys (page_boxes: pages of 16n keys that hold no
 * half tile too, in boxes of 32 rows, or 16 where 32 does not divide the
 * page), or 0: no TMA (the rule the maps and the backend's explanation
 * share). */
int ak_cuda_prefill_tma_rows(int dqk, int dvo, int ragged, int page_size, int page_boxes);
/* The tokens of the q map's box for a row tile of `rows` rows of `heads`
 * heads each in segments of `seg` rows (2^p->prow_seg_log2), or 0: no q map (a
 * tile of one segment whose rows the heads do not divide; the rule the map
 * and the backend's explanation share). */
int ak_cuda_prefill_tma_q_tokens(int heads, int rows, int seg);
/* cuTensorMapEncodeTiled from the driver (the library links the runtime
 * only), or NULL */
typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
encode_tiled_fn ak_cuda_encode_tiled(void);

/* The prefill kernels: mma.sync (prefill.cu, sm_80+), warpgroup MMA
 * (prefill_wgmma.cu, sm_90a) and the portable one. The engine picks one at
 * create. Grid (ctas): the items carry their KV head and row tile
 * (prefill_item.row). */
typedef enum prefill_family { PREFILL_MMA = 0, PREFILL_WGMMA = 1, PREFILL_PORTABLE = 2 } prefill_family;

/* The kernel of a family for a pair and dtype; fn NULL if there is none
 * (the wgmma ones exist only in a build that targets sm_90). */
attn_kernel ak_cuda_prefill_kernel(prefill_family f, int dqk, int dvo, ak_dtype dtype, int fp8);
attn_kernel ak_cuda_prefill_wgmma_kernel(int dqk, int dvo, ak_dtype dtype);
/* At DP 256 (where ak_cuda_prefill_wgmma_kernel's kernel takes the items
 * that run checked, PASS_CHECKED): the kernel of the items the scan pass
 * found clean, unchecked, launched before it in the same step; fn NULL for
 * any other pair. */
attn_kernel ak_cuda_prefill_wgmma_clean_kernel(int dqk, int dvo, ak_dtype dtype);
/* The same pass from a queue beside the scan pass (PASS_QUEUE). */
attn_kernel ak_cuda_prefill_wgmma_queue_kernel(int dqk, int dvo, ak_dtype dtype);
/* Below DP 256: ak_cuda_prefill_wgmma_kernel's kernel finding the NaN rule's
 * cases itself, with no scan pass (PASS_DETECT); the same launch shape; fn
 * NULL for any other pair. */
attn_kernel ak_cuda_prefill_wgmma_detect_kernel(int dqk, int dvo, ak_dtype dtype);
/* head dims 512 (prefill_wide.cu, sm_90a, 16-bit K/V); the wgmma family's
 * kernel for that pair */
attn_kernel ak_cuda_prefill_wide_kernel(ak_dtype dtype);

/* The portable kernel (portable.cu): any head dims up to AK_PORTABLE_MAX_DIM
 * (multiples of 8 load 16 bytes a copy, others 2), any group, over the
 * decode items (decode = 1) or the prefill items, with the same outputs,
 * partial states and sinks as the others. */
attn_kernel ak_cuda_portable_kernel(int decode, int dqk, int dvo, ak_dtype dtype, int fp8);

/* The merge of split-KV partial states into o / lse for head_dim_vo dvo
 * (any): grid (ctas, num_qo_heads x rows), max_splits floats of shared memory.
 * vec: o rows are 16-byte aligned (else element stores). */
attn_kernel ak_cuda_merge_kernel(int dvo, int vec, ak_dtype dtype);

/* The scan pass of the NaN rule (scan.cu): grid (ctas, num_kv_heads), over
 * the scan tasks; K/V and q rows of whole 16-byte chunks (head dims multiples
 * of 8). */
attn_kernel ak_cuda_scan_kernel(ak_dtype kv_dtype);
/* The same pass beside the prefill (attn_params.scan_beside): blocks that
 * each fill an SM, launched alike. */
attn_kernel ak_cuda_scan_beside_kernel(ak_dtype kv_dtype);
/* The same tasks and flags from the pools' finiteness marks
 * (attn_params.kv_marks), launched alike in place of it. */
attn_kernel ak_cuda_scan_marks_kernel(void);
/* The keys its block reads at once (every row of lanes of every warp): the
 * engine's smallest scan task. */
int ak_cuda_scan_task_keys(int dqk, int dvo, ak_dtype kv_dtype);

/* The slot mapping of a plan over a device block table (table.cu): slots[t]
 * for the plan's num_tokens tokens from the table (rows of `stride`) and the
 * plan's qo_indptr [num_reqs + 1] and kv_lens [num_reqs] on the device; -1
 * for tokens [num_tokens, total) and for a block outside [0, num_blocks).
 * Asynchronous on stream. */
ak_status ak_cuda_table_slots(const int32_t *table, int stride, int page_size, int num_blocks,
                              const int32_t *qo_indptr, const int32_t *kv_lens, int num_reqs, int num_tokens,
                              int total, int64_t *slots, cudaStream_t stream);

/* CTAs per SM a kernel reaches (raising its dynamic shared-memory limit
 * first, once), and the PTX version it was compiled for (below 90 it carries
 * no griddepcontrol and must not be launched as a programmatic dependent). */
ak_status ak_cuda_kernel_occupancy(const attn_kernel *k, int *ctas_per_sm);
ak_status ak_cuda_kernel_ptx_version(const attn_kernel *k, int *ptx);

/* Launches k on `stream`, as a programmatic dependent of the kernel before it
 * when pdl is set (sm_90+), with map as its second parameter when it takes
 * one (attn_kernel.tma_map: the maps are a __grid_constant__ there; they are
 * not in attn_params because a kernel whose attn_params is a
 * __grid_constant__ reads every field through a pointer, measured slower).
 * The one launch path of every attention kernel. */
static inline ak_status launch_kernel(void (*k)(const attn_params), dim3 grid, int threads, int smem, int pdl,
                                      cudaStream_t stream, const attn_params &p, const kv_maps *map = NULL)
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
    if (map) {
        void *args[2] = {(void *)&p, (void *)map};
        AK_CUDA_TRY(cudaLaunchKernelExC(&lc, (const void *)k, args));
    } else {
        AK_CUDA_TRY(cudaLaunchKernelEx(&lc, k, p));
    }
    return AK_OK;
}

#endif /* AK_CUDA_ATTN_CUH */
