/*
 * producer.cuh - the pieces the warp-specialized kernels (prefill_wgmma.cu,
 * prefill_wide.cu, mla_wgmma.cu) share: the copies of a producer warpgroup
 * (a tile of K/V rows through the block table, or the ragged rows, into a
 * stage of wgmma.cuh's swizzled layout, with cp.async, from a warpgroup that
 * holds few registers; or a whole tile by TMA), the prefill producer over
 * the work items, its barriers, and the prefill softmax of a tile.
 */
#ifndef AK_CUDA_PRODUCER_CUH
#define AK_CUDA_PRODUCER_CUH

#include "attn.cuh"
#include "wgmma.cuh"

/* Phase clocks of the wgmma prefill (builds with -DAK_PREFILL_CLOCKS=ON
 * only; diagnostics): the first thread of each warpgroup stores clock64()
 * at fixed points of each of its block's first PF_CLK_ITEMS items,
 * prefill_clk[block][item][role][stamp] (role: consumer warpgroup, the
 * producer's after them); the engine writes the last launch's to the file
 * AK_PREFILL_CLOCKS_OUT names at destroy, and bench/prefill_clocks.py reads
 * it. The same SM's counter for every role of a block: differences within
 * a block are times. Elsewhere PF_CLK is nothing. */
#if defined(AK_PREFILL_CLOCKS)
#define PF_CLK_BLOCKS 264
#define PF_CLK_ITEMS 72
#define PF_CLK_ROLES 4
#define PF_CLK_STAMPS 14
static __device__ long long prefill_clk[PF_CLK_BLOCKS][PF_CLK_ITEMS][PF_CLK_ROLES][PF_CLK_STAMPS];
#define PF_CLK_SET(role, item, stamp, value)                                                                  \
    do {                                                                                                      \
        if (threadIdx.x % 128 == 0 && blockIdx.x < PF_CLK_BLOCKS && (item) < PF_CLK_ITEMS)                  \
            prefill_clk[blockIdx.x][item][role][stamp] = (value);                                            \
    } while (0)
#define PF_CLK(role, item, stamp) PF_CLK_SET(role, item, stamp, (long long)clock64())
#else
#define PF_CLK_SET(role, item, stamp, value) ((void)0)
#define PF_CLK(role, item, stamp) ((void)0)
#endif

/* The producer's copies of a tile: TPR threads a key row, each every TPR-th
 * 16-byte chunk of it, so a thread's copies of a row differ only by
 * immediate offsets (the swizzle of chunk TPR j + q is the thread's base XOR
 * a constant): a block lookup a row, one instruction a copy. load_kv_tile
 * (one chunk a thread, rows strided over the threads, a lookup per copy)
 * made a producer at its registers the kernel's bottleneck. */
template <int DP, int KEYS, int THREADS> struct producer_rows {
    /* measured (H100, 4 x 4096): 2 at DP 64 (32-byte runs of a row), 4
     * above (64 bytes); 8 (128 bytes, more rows a thread) was slower at
     * each, 2 at DP 128 and 256 by 10% and 25% */
    static constexpr int TPR = DP <= 64 ? 2 : 4;
    static constexpr int N = KEYS * TPR / THREADS; /* rows a thread copies */
    int32_t block[N];
};

template <int DP, int KEYS, int THREADS, int ADDR>
__device__ __forceinline__ void tile_blocks(const attn_params &p, const int32_t *table, int page_base, int t0,
                                            int kv_end, producer_rows<DP, KEYS, THREADS> &r)
{
    constexpr int TPR = producer_rows<DP, KEYS, THREADS>::TPR;
    const int tid = threadIdx.x % THREADS;
#pragma unroll
    for (int i = 0; i < r.N; i++) {
        int slot;
        r.block[i] = (int32_t)kv_block_of<ADDR>(p, table, page_base,
                                               min(t0 + tid / TPR + i * (THREADS / TPR), kv_end - 1), slot);
    }
}

/* Keys [t0, t0 + KEYS) of K (V_: of V) into a stage, in wgmma.cuh's layout
 * (sw128<KEYS>: DP / 64 column blocks of KEYS rows), from the blocks of r;
 * keys from kv_end on are zero-filled (no read). Only the 16-byte chunks
 * [C0, C1) of each row (multiples of TPR): a caller that signals column
 * blocks one by one copies a block a call. ONCE: the rows are read by this
 * block alone (a decode), so they are copied with L2's evict-first policy
 * (common.cuh). */
template <int D, int DP, int KEYS, int THREADS, bool V_, typename T, int C0 = 0, int C1 = DP / 8, bool ONCE = false>
__device__ __forceinline__ void producer_copy(const attn_params &p, const producer_rows<DP, KEYS, THREADS> &r,
                                              int kv_head, int t0, int kv_end, T *dst)
{
    constexpr int CHUNKS = DP / 8, TPR = producer_rows<DP, KEYS, THREADS>::TPR;
    static_assert(r.N >= 1 && TPR <= 8 && CHUNKS % TPR == 0, "TPR threads a row");
    static_assert(C0 % TPR == 0 && C1 % TPR == 0 && 0 <= C0 && C0 < C1 && C1 <= CHUNKS, "whole chunks of TPR");
    const int tid = threadIdx.x % THREADS, q = tid % TPR;
#pragma unroll
    for (int i = 0; i < r.N; i++) {
        const int row = tid / TPR + i * (THREADS / TPR);
        int slot;
        kv_page_of(p, min(t0 + row, kv_end - 1), slot);
        const int64_t block = r.block[i];
        const T *src = V_ ? (const T *)p.v_pool + block * p.v_block_stride + (int64_t)slot * p.v_stride_slot +
                                (int64_t)kv_head * p.v_stride_head + q * 8
                          : (const T *)p.k_pool + block * p.k_block_stride + (int64_t)slot * p.k_stride_slot +
                                (int64_t)kv_head * p.k_stride_head + q * 8;
        const int bytes = t0 + row < kv_end ? 16 : 0;
        const int base = row * 64 + ((q ^ (row & 7)) << 3); /* chunk q's element offset */
#pragma unroll
        for (int j = C0 / TPR; j < C1 / TPR; j++) { /* chunk TPR j + q: column block of 8, slot (c % 8) ^ (row % 8) */
            T *to = dst + (TPR * j / 8) * (KEYS * 64) + (base ^ ((TPR * j % 8) << 3));
            if (!((D / 8) % TPR == 0 ? TPR * j < D / 8 : TPR * j + q < D / 8)) continue;
            if (ONCE) cp_async_16_pol(to, src + TPR * j * 8, bytes, l2_evict_first());
            else cp_async_16(to, src + TPR * j * 8, bytes);
        }
    }
}

/* Turns this warp's 16 rows of S (a tile of keys from t0) into P, in place
 * (f32), with prefill.cu's online softmax and lazy rescale: masks when
 * `masked`, raises m where a row's max passed it by RESCALE_SLACK (base 2)
 * and returns SOFTMAX_RAISED if any row of the warp did, with the factors
 * o must be scaled by in f (the caller scales o once its last P.V has
 * finished). AHEAD: by softmax_rows_ahead, which may return SOFTMAX_FAR
 * (attn.cuh: s is then spent, and the caller computes S again and takes
 * the usual path). */
template <int NT, typename T, bool CHECK, bool AHEAD = false>
__device__ __forceinline__ int tile_softmax(const attn_params &p, float (&s)[NT][4], bool masked, int t0,
                                             int row_pos0, int row_pos1, int kv_end, const uint32_t *bad,
                                             float (&m)[2], float (&d)[2], float (&f)[2])
{
    if (AK_PREFILL_ABLATE == 1) { /* (a diagnostics build: attn.cuh) */
        f[0] = f[1] = 1.0f;
        return 0;
    }
    const int lane = threadIdx.x % 32;
    /* the NaN rule, checked path: every raw product a row sees (attn.cuh) */
#pragma unroll
    for (int h = 0; h < 2 && CHECK; h++) check_logits(p, s, h, h ? row_pos1 : row_pos0, t0, kv_end, lane, masked, d[h]);
    if (p.soft_cap > 0.0f) { /* before the masks: tanh(-inf) would unmask */
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = p.cap_log2 * tanhf(s[n][e] * p.cap_scale);
    }
    if (masked) {
#pragma unroll
        for (int h = 0; h < 2; h++) mask_row(p, s, h, h ? row_pos1 : row_pos0, t0, kv_end, lane);
    }
    if (CHECK && bad) { /* a mixed tile whose V had bad keys: the rows that see one (a block-wide mark) */
#pragma unroll
        for (int h = 0; h < 2; h++) flag_bad_keys(s, h, lane, bad, d[h]);
    }
    const float sc = p.soft_cap > 0.0f ? 1.0f : p.scale_log2;
    if (AHEAD && (AK_PREFILL_ABLATE == 0 || AK_PREFILL_ABLATE == 4)) return softmax_rows_ahead(s, sc, m, d, f);
    return softmax_rows(s, sc, m, d, f) ? SOFTMAX_RAISED : 0;
}

/* The block's shared-memory barriers. Tile number g of the block (over all
 * its items) uses stage g % STAGES, for the (g / STAGES)-th time; its K and
 * its V are filled and freed apart (K is done with once S is, V only after
 * P.V, a tile later in prefill_wgmma.cu where the two overlap; there the
 * K of a tile with its exponentials ahead once its softmax is, which may
 * compute S again, and an item's last K once its o, staged in it, is
 * stored), so the producer runs up to STAGES
 * tiles ahead of S. *_full: the producers' copies landed; *_empty: every
 * consumer that reads it is done. q_full and q_empty: the same for q, once
 * an item, an item without key tiles too (it has no q to load, but the
 * consumers count items by q_full, and prefill_wgmma.cu at d 256 stages its
 * epilogue's rows in qs). */
template <int STAGES> struct ws_barriers {
    uint64_t k_full[STAGES], k_empty[STAGES], v_full[STAGES], v_empty[STAGES], q_full, q_empty;
};

/* p.kv_box is a power of two (ak_cuda_prefill_tma_rows: 128, 64, 32 or
 * 16 rows): the boxes in n keys, and whether key t starts one, by a shift
 * and a mask. A division and a remainder by it took the producer 40-odd
 * of the page-box path's 183 instructions a tile and warp, besides each
 * warp's byte count worked out for K and for V (tma_page_copy), and the
 * producer's instructions take issue slots from the consumers on the
 * same schedulers: without them (H100, page 16 against the kernel before,
 * same run) llama3-8b and qwen2.5-7b 1 x 4096 0.955 and 0.961 of the
 * time, phi3-mini 4 x 4096 0.946, 16 x 1024 0.968, page 32 0.960, page 128
 * 16 x 1024 0.985 (Nsight Compute and A/B: BENCHMARKS.md). */
__device__ __forceinline__ int kv_boxes(const attn_params &p, int n) { return n >> (__ffs(p.kv_box) - 1); }
__device__ __forceinline__ bool kv_box_start(const attn_params &p, int t) { return (t & (p.kv_box - 1)) == 0; }

/* A whole tile of K or V (map; D of its columns real, in D / 64 rounded up
 * column blocks, the columns past D zero-filled by the map's bounds) by
 * TMA into dst, completing on full, in boxes of a tile or half of one
 * (p.kv_box 128 or 64): thread 0 of the PRODUCERS issues a box a column
 * block and a part of the tile (`boxes` parts, 1 or 2, of KEYS / boxes
 * rows: paged, each on one page) and arrives with their bytes, the others
 * arrive, so that the barrier's count is the same as for cp.async. at[j]:
 * paged, part j's first slot in block block[j]; ragged, its first row. */
template <int D, int KEYS, int PRODUCERS, int ADDR, typename T>
__device__ __forceinline__ void tma_tile_copy(const CUtensorMap *map, const int32_t (&block)[2], const int (&at)[2],
                                              int boxes, int kv_head, T *dst, uint64_t *full)
{
    constexpr int NCB = (D + 63) / 64;
    if (threadIdx.x % PRODUCERS == 0) {
        mbar_arrive_expect_tx(full, (uint32_t)(KEYS * NCB * 128));
#pragma unroll
        for (int j = 0; j < 2; j++) /* (unrolled: block and at stay in registers) */
#pragma unroll
            for (int c = 0; c < NCB; c++) {
                if (j >= boxes) break;
                T *to = dst + c * (KEYS * 64) + j * (KEYS / 2) * 64;
                if (ADDR == 1) tma_load_3d(to, map, c * 64, at[j], kv_head, full);
                else tma_load_4d(to, map, c * 64, at[j], kv_head, block[j], full);
            }
    } else {
        mbar_arrive(full);
    }
}

/* Pages of 16n keys that hold no half tile (p.kv_box 32 or 16, paged): a
 * tile is 4 or 8 boxes a column block, each within a page. The box of a key tile [t0, t0 + KEYS)
 * that this producer thread issues, if any: box j by lane j / 4 of
 * producer warp j % 4, its block looked up before the stage's wait (the
 * load under it); K's and V's copies share it. Measured (H200, page 16,
 * d128, against cp.async): one thread issuing every box, a lookup before
 * each, 1.31-1.51x the time; lane 0 of each of four warps, 0.60-0.72x of
 * that; the lanes of one warp, 1.06-1.21x four warps' (BENCHMARKS.md).
 * Against these four warps (H100, llama3-8b 1 x 4096, page 16): the block
 * ids looked up a tile ahead, 1.02x the time; every box by one thread, its
 * block ids read at once, 2.27x; the maps prefetched into the TMA unit,
 * level (BENCHMARKS.md). Pages of 16 keys take 1.025-1.030x the ragged
 * mode's time at 1 x 4096 (H100; 1.054-1.058x before the tile tests by
 * masks, kv_boxes, in the same run), 64 keys and more 1.00-1.03x. */
#define PAGE_BOX_WARPS 4
struct page_box {
    bool mine;     /* this thread issues box j */
    int j, slot;   /* the box (0 .. KEYS / p.kv_box - 1) and its first slot */
    int32_t block; /* and its block */
};

template <int PRODUCERS, int KEYS>
__device__ __forceinline__ page_box page_box_of(const attn_params &p, const int32_t *table, int page_base, int t0)
{
    const int warp = threadIdx.x % PRODUCERS / 32;
    page_box b;
    b.j = warp + PAGE_BOX_WARPS * (threadIdx.x % 32);
    b.mine = warp < PAGE_BOX_WARPS && b.j < kv_boxes(p, KEYS);
    b.slot = 0;
    b.block = b.mine ? (int32_t)kv_block_of<0>(p, table, page_base, t0 + b.j * p.kv_box, b.slot) : 0;
    return b;
}

/* The tile by its page boxes (page_box_of): lane 0 of each issuing warp
 * arrives with its warp's bytes before any lane of the warp issues; every
 * other thread arrives (the barrier's count as for cp.async); each thread
 * with a box issues it, a column block at a time. A tile is 4 or 8 boxes
 * (p.kv_box 32 or 16), so each warp's are KEYS / PAGE_BOX_WARPS rows. */
template <int D, int KEYS, int PRODUCERS, typename T>
__device__ __forceinline__ void tma_page_copy(const attn_params &p, const CUtensorMap *map, const page_box &b,
                                              int kv_head, T *dst, uint64_t *full)
{
    static_assert(PRODUCERS >= 32 * PAGE_BOX_WARPS, "a warp a box");
    constexpr int NCB = (D + 63) / 64;
    const int warp = threadIdx.x % PRODUCERS / 32;
    /* (a tile of fewer keys, where boxes of 32 rows leave a warp none:
     * counted; no kernel takes this path with one) */
    const int n = KEYS % (32 * PAGE_BOX_WARPS) == 0 ? (warp < PAGE_BOX_WARPS ? KEYS / PAGE_BOX_WARPS : 0)
                  : warp < kv_boxes(p, KEYS) ? p.kv_box : 0;
    if (threadIdx.x % 32 == 0 && n > 0) mbar_arrive_expect_tx(full, (uint32_t)(n * NCB * 128));
    else mbar_arrive(full);
    __syncwarp();
    if (!b.mine) return;
#pragma unroll
    for (int c = 0; c < NCB; c++)
        tma_load_4d(dst + c * (KEYS * 64) + b.j * p.kv_box * 64, map, c * 64, b.slot, kv_head, b.block, full);
}

/* A whole row tile of q by TMA into qs, completing on full: `boxes` of
 * the map's boxes (`tokens` tokens, each its hb heads from head0), one for
 * the tile or one a segment of seg rows (attn.cuh's tile_token: the rows no
 * token fills at a segment's end stay as zero_q_pads left them), each a
 * column block at a time (DQK of its columns real, in DQK / 64 rounded up
 * column blocks of ROWS rows); one thread issues them, the others arrive,
 * as tma_tile_copy. Measured (H200, page 128, per-phase clocks): at d128,
 * issuing a tile's 2,048 cp.async copies (load_q_tile) took the producer
 * 3.3 us an item, its next key tiles behind them; against that, 0.96-0.99
 * of the time at head dims 64 and 128, 0.86 (16 x 1024) and 0.95 (4 x
 * 4096) at 256, 0.98-1.00 on pages of 16 keys (BENCHMARKS.md). */
template <int DQK, int ROWS, int PRODUCERS, typename T>
__device__ __forceinline__ void tma_q_copy(const CUtensorMap *map, int boxes, int tokens, int hb, int seg, int head0,
                                           int tok0, T *qs, uint64_t *full)
{
    constexpr int NCB = (DQK + 63) / 64;
    if (threadIdx.x % PRODUCERS == 0) {
        mbar_arrive_expect_tx(full, (uint32_t)(boxes * tokens * hb * NCB * 128));
        for (int j = 0; j < boxes; j++)
#pragma unroll
            for (int c = 0; c < NCB; c++)
                tma_load_3d(qs + c * (ROWS * 64) + j * seg * 64, map, c * 64, head0, tok0 + j * tokens, full);
    } else {
        mbar_arrive(full);
    }
}

/* Zeroes qs (ROWS rows of DP columns) by the block's THREADS threads, for
 * the rows no token fills, which q's boxes by segment (tma_q_copy)
 * never write; the caller's block barrier then orders it before any copy
 * into qs (the async proxy's, after the fence, and the other threads'
 * cp.async). */
template <int ROWS, int DP, int THREADS, typename T> __device__ __forceinline__ void zero_q_pads(T *qs)
{
    for (int i = threadIdx.x; i < ROWS * DP / 8; i += THREADS) *(uint4 *)(qs + 8 * i) = make_uint4(0, 0, 0, 0);
    fence_proxy_async();
}

/* The clean pass's items from a queue (attn_params.scan_beside and
 * item_queue): the block's k-th item in slot k % ITEM_RING, posted by the
 * producer's thread 0 (its index, or num_items at the end) with an
 * arrival on the slot's barrier, read by the producers and the consumers
 * alike. A slot is written again four items on: by then every reader has
 * read it (the producer posts item k only after its consumers freed q of
 * item k - 2, whose tiles every producer thread had copied). A block's
 * first item is blockIdx.x, as without the queue; past it, the next of
 * the queue's, so that a block that starts late (on an SM the scan pass
 * held) takes fewer. */
#define ITEM_RING 4
struct item_ring {
    uint64_t full[ITEM_RING];
    int w[ITEM_RING];
};

/* The clean pass's own items from the queue: every item of a scanned
 * request (the checked pass runs those the flags mark again, after it) */
__device__ __forceinline__ bool queue_own(const attn_params &p, const prefill_item &it)
{
    return it.ntok > 0 && it.scan >= 0 && it.scan < scanned_tasks(p);
}

/* By the producer's thread 0: the block's k-th item into the ring. The
 * last block done taking sets the queue back to 0 for the next launch (no
 * block takes from it after that). */
__device__ __forceinline__ void queue_post(const attn_params &p, item_ring &r, int k, int num_items)
{
    int w = k == 0 ? (int)blockIdx.x : (int)gridDim.x + atomicAdd(p.item_queue, 1);
    while (w < num_items && !queue_own(p, p.pitems[w])) w = (int)gridDim.x + atomicAdd(p.item_queue, 1);
    if (w >= num_items) {
        w = num_items;
        __threadfence(); /* (this block's last take before its count) */
        if (atomicAdd(p.item_queue + 1, 1) == (int)gridDim.x - 1) {
            __threadfence(); /* (every block's takes before the resets) */
            p.item_queue[0] = 0;
            p.item_queue[1] = 0;
        }
    }
    r.w[k % ITEM_RING] = w;
    mbar_arrive(&r.full[k % ITEM_RING]);
}

__device__ __forceinline__ int queue_take(item_ring &r, int k)
{
    mbar_wait(&r.full[k % ITEM_RING], (k / ITEM_RING) & 1);
    return ((volatile int *)r.w)[k % ITEM_RING];
}

/* The producer warpgroup of the warp-specialized prefill kernels (tr: their
 * traits: DQK, DVO, DP, ROWS, KEYS, STAGES, PRODUCERS): for each of the
 * block's items (in the consumers' order), its K/V tiles into the stages and
 * its q rows into qs, for the item's KV head and query heads (heads_of). The first
 * tile of an item is issued before the item's q, whose buffer the
 * consumers free only when the previous item is done with it (after its
 * last S, or its last softmax where that tile went ahead; after its
 * epilogue where that stages o there): the copy of that tile runs under
 * the end of the previous item. TMA: the kernel takes the
 * pools' maps (kv_maps), whose boxes are a tile, half of one, or 32 or
 * 16 rows on pages of 16n keys (p.kv_box); a tile they can copy (whole,
 * below kv_end or, causal, below the request's kv_len, paged on pages of
 * whole boxes) goes by TMA, any other by cp.async.
 * A kernel of one pass (PASS: attn.cuh's mask_in_pass) takes its own
 * items alone, by the block's skip mask (pass_mask). */
template <typename tr, typename T, int ADDR, bool TMA = false, int PASS = PASS_ALL>
__device__ __forceinline__ void prefill_producer(const attn_params &p, T *qs, T *stages, ws_barriers<tr::STAGES> &bar,
                                                 const kv_maps *maps = NULL, const uint32_t *skip = NULL,
                                                 item_ring *ring = NULL, const uint32_t *redo = NULL)
{
    constexpr int DQK = tr::DQK, DVO = tr::DVO;
    constexpr int ROWS = tr::ROWS, KEYS = tr::KEYS, STAGES = tr::STAGES, DP = tr::DP;
    const int num_items = p.head->counts[COUNT_PREFILL];
    const int32_t *table = p.head->kv_table;
    int g = 0, n = 0; /* tiles and items so far */
    constexpr bool queue = PASS == PASS_QUEUE; /* (items from the queue: queue_post) */
    /* phase 1 (PASS_DETECT: the NaN rule found in the kernel, attn.cuh):
     * the items the consumers flagged in redo, again, once they have run
     * every other */
    constexpr bool REDO = PASS == PASS_DETECT;
    for (int phase = 0; phase < 1 + REDO; phase++) {
        if (phase == 1) bar_sync_any(REDO_BAR, tr::CONSUMERS + tr::PRODUCERS);
        for (int w = blockIdx.x, k = 0;; w += gridDim.x, k++) {
            if (queue) {
                if (threadIdx.x % tr::PRODUCERS == 0) queue_post(p, *ring, k, num_items);
                w = queue_take(*ring, k);
            }
            if (w >= num_items || (phase == 1 && k >= REDO_ITEMS)) break;
            if (phase == 1 && !redo_flagged(redo, k)) continue;
            /* (the producer's stamps: 0 item, 1 its first tile issued, 2 q's
             * buffer free, 3 q issued, 4 every tile issued) */
            PF_CLK(tr::CONSUMERS / 128, k, 0);
            const prefill_item it = p.pitems[w];
            if (!queue && (it.ntok == 0 || !mask_in_pass<PASS>(p, skip, k))) continue; /* padding, the other pass's */
            const item_heads ih = heads_of(p, it);
            const int kv_head = ih.kv_head, head0 = ih.head0, heads = ih.heads, hb = p.prow_heads;
            const int n_tiles = (it.kv_end - it.kv_begin + KEYS - 1) / KEYS;
            /* The keys a TMA tile may copy: up to kv_end, or, causal, up to
             * the request's last (it.kv_len), so that an item's last tile (the
             * diagonal) goes by TMA whole where the request's later keys fill
             * it, instead of by cp.async with its rows past kv_end zero-filled.
             * The masks hide those keys, and a non-finite V of theirs stays out
             * of o (0 x NaN through P.V): on a clean item (the NaN rule: its
             * request's K/V all finite) nothing is needed (an unchecked one
             * whose kernel finds the rule's cases, attn.cuh, runs again
             * checked when such a V reaches its o), and on a checked one
             * the tile is a mixed one (its last row sees key kv_end - 1, below
             * the tile's end), whose V the consumers scan and zero (attn.cuh).
             * Without causal masks no tile runs past kv_end below kv_len: an
             * item's keys then end at kv_len, or at a split chunk's end, a
             * multiple of the tile (engine.cu's PREFILL_CHUNK_ALIGN) */
            int tma_end = it.kv_end;
            const int t_last = it.kv_begin + (n_tiles - 1) * KEYS;
            if (TMA && p.causal && n_tiles > 0 && t_last + KEYS > it.kv_end && t_last + KEYS <= it.kv_len)
                tma_end = t_last + KEYS;
            /* tile t into stage g % STAGES, once every consumer finished reading
             * what it held (tile g - STAGES) */
            producer_rows<DP, KEYS, tr::PRODUCERS> cur;
            auto fill = [&](int t) {
                const int st = g % STAGES, t0 = it.kv_begin + t * KEYS;
                T *ks = stages + st * 2 * KEYS * DP;
                /* TMA: a whole tile below tma_end, in boxes of p.kv_box rows (a
                 * tile, or half of one), paged each on one page (a page holds
                 * whole boxes: ak_cuda_prefill_tma_maps); then in page boxes
                 * (32 or 16 rows, pages of 16n keys). (Thread 0 arriving for
                 * the warpgroup on these tiles, warps 1-3 waiting asleep
                 * instead of polling: 1-11% slower, BENCHMARKS.md) */
                if (TMA && p.kv_box >= 64 && (ADDR == 1 || kv_box_start(p, t0)) && t0 + KEYS <= tma_end) {
                    const int boxes = kv_boxes(p, KEYS);
                    int32_t block[2] = {0, 0};
                    int at[2] = {it.page_base + t0, it.page_base + t0 + p.kv_box}; /* (ragged; paged: below) */
                    if (ADDR == 0 && threadIdx.x % tr::PRODUCERS == 0) {
                        block[0] = (int32_t)kv_block_of<ADDR>(p, table, it.page_base, t0, at[0]);
                        if (boxes > 1)
                            block[1] = (int32_t)kv_block_of<ADDR>(p, table, it.page_base, t0 + p.kv_box, at[1]);
                    }
                    if (g >= STAGES) mbar_wait(&bar.k_empty[st], (g / STAGES - 1) & 1);
                    tma_tile_copy<DQK, KEYS, tr::PRODUCERS, ADDR, T>(&maps->k, block, at, boxes, kv_head, ks,
                                                                     &bar.k_full[st]);
                    if (g >= STAGES) mbar_wait(&bar.v_empty[st], (g / STAGES - 1) & 1);
                    tma_tile_copy<DVO, KEYS, tr::PRODUCERS, ADDR, T>(&maps->v, block, at, boxes, kv_head,
                                                                     ks + KEYS * DP, &bar.v_full[st]);
                    g++;
                    return;
                }
                if (ADDR == 0 && TMA && p.kv_box > 0 && p.kv_box < 64 && kv_box_start(p, t0) && t0 + KEYS <= tma_end) {
                    const page_box b = page_box_of<tr::PRODUCERS, KEYS>(p, table, it.page_base, t0);
                    if (g >= STAGES) mbar_wait(&bar.k_empty[st], (g / STAGES - 1) & 1);
                    tma_page_copy<DQK, KEYS, tr::PRODUCERS, T>(p, &maps->k, b, kv_head, ks, &bar.k_full[st]);
                    if (g >= STAGES) mbar_wait(&bar.v_empty[st], (g / STAGES - 1) & 1);
                    tma_page_copy<DVO, KEYS, tr::PRODUCERS, T>(p, &maps->v, b, kv_head, ks + KEYS * DP,
                                                               &bar.v_full[st]);
                    g++;
                    return;
                }
                tile_blocks<DP, KEYS, tr::PRODUCERS, ADDR>(p, table, it.page_base, t0, it.kv_end, cur);
                if (g >= STAGES) mbar_wait(&bar.k_empty[st], (g / STAGES - 1) & 1);
                producer_copy<DQK, DP, KEYS, tr::PRODUCERS, false, T>(p, cur, kv_head, t0, it.kv_end, ks);
                mbar_arrive_cp_async(&bar.k_full[st]);
                if (g >= STAGES) mbar_wait(&bar.v_empty[st], (g / STAGES - 1) & 1);
                producer_copy<DVO, DP, KEYS, tr::PRODUCERS, true, T>(p, cur, kv_head, t0, it.kv_end, ks + KEYS * DP);
                mbar_arrive_cp_async(&bar.v_full[st]);
                g++;
            };
            /* (Items and their scan flags read here and passed to the consumers
             * through shared memory, or the flags prefetched into L1 for them:
             * both measured no faster, H200, BENCHMARKS.md) */
            if (n_tiles > 0) fill(0);
            PF_CLK(tr::CONSUMERS / 128, k, 1);
            if (n > 0) mbar_wait(&bar.q_empty, (n - 1) & 1);
            PF_CLK(tr::CONSUMERS / 128, k, 2);
            n++;
            /* q's rows, unless no key tile follows (then nothing reads them);
             * q_full completes once an item either way, so that the consumers
             * never run a phase of q_empty ahead of this wait. (A barrier pair
             * and a box a consumer warpgroup, each warpgroup's rows copied once
             * that warpgroup is done with the last item's: 2-18% slower, ptxas
             * spilling in both roles; BENCHMARKS.md, 2026-12-07) */
            /* (a box a segment, or the tile) */
            const int seg = 1 << p.prow_seg_log2, boxes = seg < ROWS ? ROWS / seg : 1;
            if (n_tiles > 0 && TMA && p.q_box > 0 && heads == hb && it.ntok == boxes * p.q_box) {
                tma_q_copy<DQK, ROWS, tr::PRODUCERS>(&maps->q, boxes, p.q_box, hb, seg, head0, it.tok0, qs,
                                                     &bar.q_full);
            } else if (n_tiles > 0) {
                load_q_tile<ROWS, tr::PRODUCERS, DQK, DP>(p, it, head0, hb, heads, qs,
                                                         [](int row, int c) { return sw128<ROWS>(row, c); });
                mbar_arrive_cp_async(&bar.q_full);
            } else {
                mbar_arrive(&bar.q_full);
            }
            PF_CLK(tr::CONSUMERS / 128, k, 3);
            for (int t = 1; t < n_tiles; t++) fill(t);
            PF_CLK(tr::CONSUMERS / 128, k, 4);
        }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory"); /* (no copy of this thread lands after it exits) */
}

#endif /* AK_CUDA_PRODUCER_CUH */
