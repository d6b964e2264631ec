/*
 * mla_wgmma.cu - absorbed multi-head latent attention decode (cuda_mla: q
 * rows of 576 = a 512-value latent and a 64-value rotary part, the value
 * the first 512 values of the same latent row) on Hopper warpgroup MMA
 * (sm_90a). The items, outputs, split-KV partials, sinks, soft-cap and the
 * NaN rule are decode_wide.cu's (one query token's keys [kv_begin, kv_end)
 * an item); only the block differs, and that at 32 heads or fewer an item
 * may hold up to 64 / heads consecutive tokens of a request
 * (decode_item.ntok, the plan's mla_pack), which then read each latent row
 * once.
 *
 * A block serves 64 rows (a row tile of query heads: MLA's 128 heads are
 * two, the grid's y; or a packed item's tokens x heads) of one item at a
 * time, over 64-key tiles of latent rows. Three warpgroups, specialized:
 *   producer (2)  copies q (64 x 576) and the key tiles (64 x 576, 72 KB)
 *                 into two stages, running ahead across items, its
 *                 registers given to the others (setmaxnreg). A whole tile
 *                 on one page is nine TMA boxes of 64 x 64 issued by one
 *                 thread (the pool's map, ak_cuda_mla_tma_map, when its
 *                 pages hold whole 64-key tiles); the others, and tail
 *                 tiles (keys past kv_end must be zero rows), go by
 *                 cp.async (producer.cuh), 4,608 copies a tile;
 *   scores (0)    S = q K^T (64 x 64 over 576, both operands read by the
 *                 tensor cores from shared memory), the online softmax, P
 *                 in registers and in shared memory for warpgroup 1, and
 *                 o[:, 0:256] += P V;
 *   values (1)    o[:, 256:512] += P V, P read from shared memory.
 * The o accumulator of 64 x 512 floats would be 256 registers a thread in
 * one warpgroup; split over two it is 128.
 *
 * The copies set the pace, so a stage is freed as early as it can be: warp-
 * group 0 issues its P V of tile t - 1 with S of tile t and frees the stage
 * once that product is done (it finds out after S's last wait for tile t's
 * copies); warpgroup 1 waits for its P V at once. The producer then fills
 * one stage while S waits on the other, and S starts on each 64-column
 * block of a tile as soon as that block lands (a barrier a block). In a
 * plan without packed items, a stage is freed in three parts, each once its
 * last reader is done: V's first half (blocks 0-3, warpgroup 0's P V), the
 * rotary block 8 (S alone) and V's second half (blocks 4-7, warpgroup 1's
 * P V); the producer copies them, and S reads them, in that order (packed
 * items too). In full row tiles of 64 heads (MLA's 64 and 128 heads,
 * compute-bound) warpgroup 1 issues its P V of tile t - 1 only once S of
 * tile t is done, so it runs under warpgroup 0's softmax of tile t rather
 * than beside the S that softmax waits for (BENCHMARKS.md).
 *
 * A stage holds a tile's rows once: S reads all 576 columns K-major, P V
 * the first 512 MN-major (wgmma.cuh's one layout serves both). Keys past
 * kv_end are zero-filled by the producer, so no row sees them as 0 x NaN.
 * One token's item is seen whole by all its rows; a packed item's earlier
 * tokens miss its last hid keys (fewer than ntok, in its last tile or two),
 * whose V elements warpgroup 0 scrubs of NaN and infinity once S has read
 * them. The plan starts every item at or after its window's first key
 * (it.lo), so no other key of a tile is hidden; decode_wide.cu, which masks
 * keys before it.lo as well, would serve a plan that did not.
 *
 * Built only for sm_90a, with prefill_wgmma.cu; elsewhere the kernel is
 * empty and ak_cuda_mla_wgmma_kernel reports none.
 */
#include "attn.cuh"
#include "producer.cuh"
#include "wgmma.cuh"


namespace {

struct mla_wg {
    static constexpr int DQK = 576, DVO = 512, HALF = DVO / 2;
    static constexpr int ROWS = 64, KEYS = 64, STAGES = 2;
    static constexpr int BLOCKS = DQK / 64; /* a stage's column blocks, each signalled on its own */
    /* the parts of a stage freed apart in a plan without packed items
     * (mla_barriers): blocks 0-3 (the first half of V), block 8 (the
     * rotary part, read by S alone) and blocks 4-7, copied in that order */
    static constexpr int PARTS = 3;
    static constexpr int PRODUCERS = 128, THREADS = 384;
    /* as prefill_wgmma.cu's split: within the 168 a thread of 384 */
    static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
    static constexpr int TILE = ROWS * DQK; /* q and a stage: elements */
    static constexpr int PSTRIDE = KEYS + 8; /* P's row (elements): conflict-free stores and ldmatrix */
    /* + 1024: the tiles start on a 1024-byte boundary (the swizzle); then
     * P, three rows of floats (the tile's rescale factors, the NaN rule's
     * sums of warpgroup 1, 1/d) and the barriers (mla_barriers) */
    static constexpr int SMEM_BYTES =
        1024 + (1 + STAGES) * TILE * 2 + ROWS * PSTRIDE * 2 + 3 * ROWS * 4 + (STAGES * (BLOCKS + PARTS) + 3) * 8;
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory per block on sm_90");
    static_assert(PRODUCERS * PRODUCER_REGS + 256 * CONSUMER_REGS <= THREADS * (65536 / THREADS / 8 * 8),
                  "the register file");
};

/* The stages pass between the producer and the consumers through these:
 * tile number g of the block (over its items) is in stage g % STAGES;
 * k_full[s][b]: column block b of the stage's tile landed, with those
 * copied before it (a thread's cp.async complete in order; the copy order
 * is 0-3, 8, 4-7), so S starts on the first 64 columns while the rest are
 * in flight; q_full: q landed; k_empty[s][part]: both consumers are done
 * with that part of the tile (a plan with packed items: [s][0], the whole
 * tile); q_empty: warpgroup 0 with q. */
struct mla_barriers {
    uint64_t k_full[mla_wg::STAGES][mla_wg::BLOCKS], k_empty[mla_wg::STAGES][mla_wg::PARTS], q_full, q_empty;
    uint64_t s_done; /* warpgroup 0's S of a tile after an item's first is done (`delay`: mla_values) */
};
enum { PART_LO = 0, PART_ROPE = 1, PART_HI = 2 };

/* Named barriers between the two consumer warpgroups (synced by both, 256
 * threads, from different code: bar_sync_any): P of a tile is in shared
 * memory; warpgroup 1 has read the last one (it syncs before it waits for
 * the next P, so warpgroup 0's wait there costs it nothing); warpgroup 1's
 * NaN-rule sums are written; 1/d is. */
enum { BAR_P_READY = 1, BAR_P_FREE = 2, BAR_BAD_READY = 3, BAR_INV_READY = 4 };

/* A tile's column blocks [B, E) into a stage, each block's barrier
 * signalled once its copies (and every earlier one of this thread) land. */
template <typename T, int B = 0, int E = mla_wg::BLOCKS>
__device__ __forceinline__ void mla_copy_blocks(const attn_params &p,
                                                const producer_rows<mla_wg::DQK, mla_wg::KEYS, mla_wg::PRODUCERS> &ids,
                                                int kv_head, int t0, int kv_end, T *dst,
                                                uint64_t (&full)[mla_wg::BLOCKS])
{
    typedef mla_wg W;
    producer_copy<W::DQK, W::DQK, W::KEYS, W::PRODUCERS, false, T, 8 * B, 8 * B + 8, true>(p, ids, kv_head, t0, kv_end,
                                                                                     dst);
    mbar_arrive_cp_async(&full[B]);
    if constexpr (B + 1 < E) mla_copy_blocks<T, B + 1, E>(p, ids, kv_head, t0, kv_end, dst, full);
}

/* A whole key tile that starts a 64-key part of its page by TMA (map):
 * one thread copies column blocks [B, E), a box each, completing on each
 * block's barrier, and the others arrive so that the barrier's count is the
 * same as for cp.async. block: the page's id (clamped), slot0 the tile's
 * first slot in it. */
template <typename T, int B = 0, int E = mla_wg::BLOCKS>
__device__ __forceinline__ void mla_tma_blocks(const CUtensorMap *map, int block, int slot0, T *dst,
                                               uint64_t (&full)[mla_wg::BLOCKS])
{
    typedef mla_wg W;
    if (threadIdx.x % W::PRODUCERS == 0) {
        /* L2 evicts these lines first: each row is read by this item's row
         * tiles alone, at about the same time (common.cuh's measurements) */
        const uint64_t pol = l2_evict_first();
#pragma unroll
        for (int b = B; b < E; b++) {
            mbar_arrive_expect_tx(&full[b], W::KEYS * 64 * sizeof(T));
            tma_load_3d_pol(dst + b * W::KEYS * 64, map, b * 64, slot0, block, &full[b], pol);
        }
    } else {
#pragma unroll
        for (int b = B; b < E; b++) mbar_arrive(&full[b]);
    }
}

/* Column blocks [B, E) of a key tile into a stage: by TMA where tma (the
 * tile starts a 64-key part of page `block`, at slot0), else by cp.async. */
template <typename T, int B, int E>
__device__ __forceinline__ void mla_fill_blocks(const attn_params &p, const CUtensorMap *map,
                                                const producer_rows<mla_wg::DQK, mla_wg::KEYS, mla_wg::PRODUCERS> &ids,
                                                bool tma, int slot0, int kv_head, int t0, int kv_end, T *dst,
                                                uint64_t (&full)[mla_wg::BLOCKS])
{
    if (tma) mla_tma_blocks<T, B, E>(map, ids.block[0], slot0, dst, full);
    else mla_copy_blocks<T, B, E>(p, ids, kv_head, t0, kv_end, dst, full);
}

/* The producer warpgroup: each item's key tiles into the stages and its q
 * rows into qs. A tile's block ids are looked up as soon as the tile before
 * is issued, so their loads run while it waits for a free stage (measured
 * against a lookup just before the copies, H100, 128 heads 64 x 8192: the
 * same within noise, 0.628 / 0.619 ms). A plan without packed items
 * (!PACK): the consumers free a stage in parts (mla_barriers), and the
 * producer waits for each in turn and copies it (so a part freed early
 * still waits behind the parts before it). */
template <typename T, int ADDR, bool PACK>
__device__ __forceinline__ void mla_producer(const attn_params &p, const CUtensorMap *map, T *qs, T *stages,
                                             mla_barriers &bar, int kv_head, int head0, int rows)
{
    typedef mla_wg W;
    const int num_items = p.head->counts[COUNT_DECODE];
    const int32_t *table = p.head->kv_table;
    const int tid = threadIdx.x % W::PRODUCERS;
    int g = 0, n = 0; /* tiles and items so far */
    for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
        const decode_item it = p.items[w];
        if (it.req < 0) continue;
        const int n_tiles = (it.kv_end - it.kv_begin + W::KEYS - 1) / W::KEYS;
        producer_rows<W::DQK, W::KEYS, W::PRODUCERS> ids; /* the next tile's */
        auto lookup = [&](int t) {
            tile_blocks<W::DQK, W::KEYS, W::PRODUCERS, ADDR>(p, table, it.page_base, it.kv_begin + t * W::KEYS,
                                                              it.kv_end, ids);
        };
        auto fill = [&](int t) {
            const int st = g % W::STAGES, t0 = it.kv_begin + t * W::KEYS, parity = (g / W::STAGES - 1) & 1;
            T *dst = stages + st * W::TILE;
            /* TMA for a whole tile on one page (the map's pages hold whole
             * 64-key parts); cp.async for the rest, whose keys past kv_end
             * must be zero rows */
            const bool tma = ADDR == 0 && p.k_tma && (t0 & (W::KEYS - 1)) == 0 && t0 + W::KEYS <= it.kv_end;
            int slot0 = 0;
            if (tma) kv_page_of(p, t0, slot0);
            if (!PACK) {
                if (g >= W::STAGES) mbar_wait(&bar.k_empty[st][PART_LO], parity);
                mla_fill_blocks<T, 0, 4>(p, map, ids, tma, slot0, kv_head, t0, it.kv_end, dst, bar.k_full[st]);
                if (g >= W::STAGES) mbar_wait(&bar.k_empty[st][PART_ROPE], parity);
                mla_fill_blocks<T, 8, 9>(p, map, ids, tma, slot0, kv_head, t0, it.kv_end, dst, bar.k_full[st]);
                if (g >= W::STAGES) mbar_wait(&bar.k_empty[st][PART_HI], parity);
                mla_fill_blocks<T, 4, 8>(p, map, ids, tma, slot0, kv_head, t0, it.kv_end, dst, bar.k_full[st]);
            } else { /* the stage at once, in S's order too */
                if (g >= W::STAGES) mbar_wait(&bar.k_empty[st][0], parity);
                mla_fill_blocks<T, 0, 4>(p, map, ids, tma, slot0, kv_head, t0, it.kv_end, dst, bar.k_full[st]);
                mla_fill_blocks<T, 8, 9>(p, map, ids, tma, slot0, kv_head, t0, it.kv_end, dst, bar.k_full[st]);
                mla_fill_blocks<T, 4, 8>(p, map, ids, tma, slot0, kv_head, t0, it.kv_end, dst, bar.k_full[st]);
            }
            g++;
            if (t + 1 < n_tiles) lookup(t + 1);
        };
        if (n_tiles > 0) lookup(0);
        /* the first tile before q: it may copy under the previous item's end */
        if (n_tiles > 0) fill(0);
        if (n > 0) mbar_wait(&bar.q_empty, (n - 1) & 1);
        /* row = (token j of the item, head of the tile): rows apart */
        for (int i = tid; i < W::ROWS * (W::DQK / 8); i += W::PRODUCERS) {
            const int row = i / (W::DQK / 8), c = i - row * (W::DQK / 8);
            const int j = PACK ? row / rows : 0;
            const bool valid = PACK ? j < it.ntok : row < rows;
            const T *src = (const T *)p.q + (valid ? (int64_t)(it.tok + j) * p.q_stride_tok +
                                                         (int64_t)(head0 + row - j * rows) * p.q_stride_head + c * 8
                                                   : 0);
            cp_async_16(qs + sw128<W::ROWS>(row, c), src, valid ? 16 : 0);
        }
        mbar_arrive_cp_async(&bar.q_full);
        n++;
        for (int t = 1; t < n_tiles; t++) fill(t);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

/* This thread's columns of o (half h) for its rows r and r + 8, scaled by
 * inv: the output rows, or the item's partial slots (a slot a token). */
template <typename T, bool PACK>
__device__ __forceinline__ void mla_store(const attn_params &p, const decode_item &it, const float (&o)[mla_wg::HALF / 8][4],
                                          int h, int head0, int rows, int r, const float (&inv)[2])
{
    store_o_half<mla_wg::HALF, mla_wg::DVO, T>(p, o, h, r, inv, it.out >= 0,
                                               [&](int row, int64_t &tok, int &head, int64_t &slot) {
                                                   const int j = PACK ? row / rows : 0;
                                                   tok = it.tok + j;
                                                   head = head0 + row - j * rows;
                                                   slot = it.out + j;
                                                   return PACK ? j < it.ntok : row < rows;
                                               });
}

/* Warpgroup 0: the scores, the softmax and the first half of o. PACK: the
 * plan has items of several tokens (their path costs the others nothing). */
template <typename T, bool PACK>
__device__ __forceinline__ void mla_scores(const attn_params &p, const T *qs, T *stages, T *ps, float *fs,
                                           const float *bad_s, float *inv_s, mla_barriers &bar, int head0, int rows,
                                           bool delay)
{
    typedef mla_wg W;
    constexpr int NT = W::KEYS / 8;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int r = warp * 16 + lane / 4; /* this thread's rows: r and r + 8 */
    const int num_items = p.head->counts[COUNT_DECODE];
    /* the logits' scale in registers (base 2; with a soft-cap tanh's output is) */
    const bool capped = p.soft_cap > 0.0f;
    const float sc = capped ? 1.0f : p.scale_log2, cap_log2 = p.cap_log2, cap_scale = p.cap_scale;
    int g = 0, nq = 0; /* tiles and items so far */
    for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
        const decode_item it = p.items[w];
        if (it.req < 0) continue;
        const int n_tiles = (it.kv_end - it.kv_begin + W::KEYS - 1) / W::KEYS;
        mbar_wait(&bar.q_full, nq & 1);
        nq++;
        /* a packed item (ntok tokens): the keys at the item's end that this
         * thread's two rows do not see (their token j sees up to kv_end -
         * max(0, hid - j)); the first token's keys end at kv_end - hid */
        const int hid = PACK ? it.hid : 0, first_end = it.kv_end - hid;
        int unseen[2];
#pragma unroll
        for (int h = 0; h < 2; h++) unseen[h] = PACK ? max(0, hid - (r + 8 * h) / rows) : 0;
        float o[W::HALF / 8][4];
        zero(o);
        float m[2] = {-INFINITY, -INFINITY}, d[2] = {0.0f, 0.0f};
        auto stage = [&](int t) { return stages + ((g + t) % W::STAGES) * W::TILE; };
        /* s = q k^T of tile t: K-major operands, 16 of the 576 a step, each
         * column block as soon as it lands. The descriptors are offsets
         * from two bases, q's made opaque at each tile: the compiler would
         * otherwise hoist q's 36 descriptors out of the tile loop, 72
         * registers that spilled o. */
        auto issue_s = [&](int t, float (&s)[NT][4]) {
            const int st = (g + t) % W::STAGES, parity = ((g + t) / W::STAGES) & 1;
            const uint64_t a0 = wgmma_opaque(wgmma_desc(qs, 16, 1024));
            const uint64_t b0 = wgmma_desc(stage(t), 16, 1024);
#pragma unroll
            for (int kk = 0; kk < W::DQK / 16; kk++) {
                /* blocks 0-3, 8, 4-7: the order the producer copies them
                 * (items of one token free them in that order), the same
                 * for every item, so a row's logits do not depend on which
                 * items the plan made (batch invariance) */
                const int blk = kk < 16 ? kk / 4 : kk < 20 ? 8 : kk / 4 - 1;
                if (kk % 4 == 0) { /* a new column block: wait for it */
                    mbar_wait(&bar.k_full[st][blk], parity);
                    fence_proxy_async(); /* the producer's copies, visible to wgmma */
                    wgmma_fence();       /* s in flight across the wait (else ptxas serializes) */
                }
                const uint64_t a = wgmma_desc_add(a0, (blk * W::ROWS * 64 + (kk % 4) * 16) * 2);
                const uint64_t b = wgmma_desc_add(b0, (blk * W::KEYS * 64 + (kk % 4) * 16) * 2);
                wgmma_ss<W::KEYS, T>(reinterpret_cast<float(&)[W::KEYS / 2]>(s), a, b, kk > 0);
            }
            wgmma_commit();
        };
        /* s (landed) -> P (f32, in place), the online softmax with the lazy
         * rescale; f: the factors o is to be scaled by (1 unless raised).
         * No branch a score (soft-cap and tail are one test a tile each):
         * with a branch, two constant loads and a reconvergence a score,
         * warpgroup 0's instructions set the kernel's pace (BENCHMARKS.md). */
        auto softmax = [&](int t, float (&s)[NT][4], float (&f)[2]) {
            const int t0 = it.kv_begin + t * W::KEYS;
            /* the tail: keys past kv_end (zero rows), or, in a packed item,
             * keys some rows do not see */
            const bool tail = t0 + W::KEYS > first_end;
            int seen[2]; /* keys of this thread's columns each row sees */
#pragma unroll
            for (int h = 0; h < 2; h++) seen[h] = it.kv_end - unseen[h] - t0 - (lane % 4) * 2;
            /* the NaN rule on the raw product of every key a row sees (zero
             * rows past kv_end would add 0 unless q is not finite, and then
             * a seen key's product is not either) */
            if (!PACK || !tail) {
                add_bad_o(s, d);
            } else {
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (n * 8 + (e & 1) < seen[e / 2]) add_bad(d[e / 2], s[n][e]);
            }
            if (capped) { /* before the mask: tanh(-inf) would unmask */
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[n][e] = cap_log2 * tanhf(s[n][e] * cap_scale);
            }
            if (tail) {
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (n * 8 + (e & 1) >= seen[e / 2]) s[n][e] = -INFINITY;
            }
            return softmax_rows(s, sc, m, d, f);
        };
        /* The NaN rule's third part in a packed item: keys hidden from some
         * rows reach them as 0 x V through P V, so a non-finite element of
         * their V rows is zeroed once S of the tile is done (every row that
         * sees the key is NaN already: V is part of the row S read, and any
         * non-finite element makes q.k non-finite). Called from share(),
         * after the P_FREE barrier: every warp of this warpgroup has waited
         * for its part of S (each reads all the tile's keys, so one warp's
         * wait is not enough), and warpgroup 1 is done with the last tile's
         * P V; before either warpgroup's P V of this tile (warpgroup 1's
         * follows P_READY, this one's is issued after share()). */
        auto scrub = [&](int t) {
            if constexpr (PACK) {
                const int t0 = it.kv_begin + t * W::KEYS;
                const int k0 = max(t0, first_end), k1 = min(t0 + W::KEYS, it.kv_end);
                if (k0 >= k1) return; /* the block agrees */
                T *st = stages + ((g + t) % W::STAGES) * W::TILE;
                for (int i = threadIdx.x; i < (k1 - k0) * (W::DVO / 8); i += 128) {
                    const int row = k0 - t0 + i / (W::DVO / 8), c = i % (W::DVO / 8);
                    uint4 *chunk = (uint4 *)(st + sw128<W::KEYS>(row, c));
                    uint4 v = *chunk;
                    if (scrub_nonfinite<T>(v)) *chunk = v;
                }
                /* visible to wgmma: warpgroup 1's after the P barrier of
                 * share(t), this warpgroup's (P V of tile t is issued after
                 * it too) */
                fence_proxy_async();
            }
        };
        /* P and the factors of tile t to warpgroup 1, once it has read the
         * last tile's */
        auto share = [&](int t, const uint32_t (&pa)[W::KEYS / 16][4], const float (&f)[2]) {
            /* warpgroup 1 has read the last P (packed: at the first tile
             * too, both sides, for scrub's sake) */
            if (PACK || g + t > 0) bar_sync_any(BAR_P_FREE, 256);
            scrub(t);
#pragma unroll
            for (int k = 0; k < W::KEYS / 16; k++) {
                T *row0 = ps + r * W::PSTRIDE + k * 16 + (lane % 4) * 2, *row1 = row0 + 8 * W::PSTRIDE;
                *(uint32_t *)row0 = pa[k][0];
                *(uint32_t *)row1 = pa[k][1];
                *(uint32_t *)(row0 + 8) = pa[k][2];
                *(uint32_t *)(row1 + 8) = pa[k][3];
            }
            if (lane % 4 == 0) {
                fs[r] = f[0];
                fs[r + 8] = f[1];
            }
            bar_sync_any(BAR_P_READY, 256);
        };

        /* S of tile t is done: items of one token free the parts of its
         * stage that this warpgroup's P V does not read, and where
         * warpgroup 1 waits for it (`delay`), let it issue its P V of
         * tile t - 1 */
        auto s_done = [&](int t) {
            if constexpr (!PACK) {
                mbar_arrive(&bar.k_empty[(g + t) % W::STAGES][PART_ROPE]);
                mbar_arrive(&bar.k_empty[(g + t) % W::STAGES][PART_HI]);
                if (delay && t > 0) mbar_arrive(&bar.s_done);
            }
        };
        if (n_tiles > 0) {
            uint32_t pa[W::KEYS / 16][4]; /* P of the tile whose P V is next */
            {
                float s[NT][4], f[2];
                issue_s(0, s);
                wgmma_wait<0>();
                wgmma_hold(reinterpret_cast<float(&)[W::KEYS / 2]>(s));
                s_done(0);
                if (n_tiles == 1) mbar_arrive(&bar.q_empty);
                softmax(0, s, f); /* o is still 0: no rescale */
                pack_p<NT, T>(s, pa);
                share(0, pa, f);
            }
            /* P V of the last tile issued with this tile's S, so the
             * product runs while S waits for the copies (its stage is
             * freed once S has waited for all of them) */
            for (int t = 1; t < n_tiles; t++) {
                float s[NT][4], f[2];
                issue_pv<W::HALF, W::KEYS, T>(o, pa, stage(t - 1)); /* o[:, 0:256] */
                issue_s(t, s);
                wgmma_wait<1>();
                wgmma_hold(reinterpret_cast<float(&)[W::HALF / 2]>(o));
                mbar_arrive(&bar.k_empty[(g + t - 1) % W::STAGES][PACK ? 0 : PART_LO]);
                wgmma_wait<0>();
                wgmma_hold(reinterpret_cast<float(&)[W::KEYS / 2]>(s));
                s_done(t);
                if (t == n_tiles - 1) mbar_arrive(&bar.q_empty); /* q is read no more */
                const bool raise = softmax(t, s, f);
                if (raise) scale_rows(o, f);
                pack_p<NT, T>(s, pa);
                share(t, pa, f);
            }
            issue_pv<W::HALF, W::KEYS, T>(o, pa, stage(n_tiles - 1));
            wgmma_wait<0>();
            wgmma_hold(reinterpret_cast<float(&)[W::HALF / 2]>(o));
            mbar_arrive(&bar.k_empty[(g + n_tiles - 1) % W::STAGES][PACK ? 0 : PART_LO]);
        } else {
            mbar_arrive(&bar.q_empty);
        }
        g += n_tiles;

        /* the rows' final state: this half's NaN-rule sums, then the other's */
        add_bad_o(o, d);
        float inv[2], lse[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            d[h] += __shfl_xor_sync(0xffffffffu, d[h], 1);
            d[h] += __shfl_xor_sync(0xffffffffu, d[h], 2);
        }
        bar_sync_any(BAR_BAD_READY, 256);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            /* a padding row's head is clamped (it reads its sink) */
            const int row = r + 8 * h, j = PACK ? row / rows : 0;
            const int head = head0 + (PACK ? row - j * rows : min(row, rows - 1));
            d[h] += bad_s[row];
            finish_row(p, head, it.out >= 0, m[h], d[h], inv[h], lse[h]);
            if (lane % 4 == 0) {
                inv_s[row] = inv[h];
                if (PACK ? j < it.ntok : row < rows) {
                    if (it.out < 0) {
                        if (p.lse) p.lse[(int64_t)(it.tok + j) * p.lse_stride_tok + head] = lse[h];
                    } else {
                        p.lse_tmp[(int64_t)(it.out + j) * p.num_qo_heads + head] = lse[h];
                    }
                }
            }
        }
        bar_sync_any(BAR_INV_READY, 256);
        mla_store<T, PACK>(p, it, o, 0, head0, rows, r, inv);
    }
    if (g > 0) bar_sync_any(BAR_P_FREE, 256); /* pairs with warpgroup 1's last */
}

/* Warpgroup 1: the second half of o, with P and the factors warpgroup 0
 * shares. */
template <typename T, bool PACK>
__device__ __forceinline__ void mla_values(const attn_params &p, const T *stages, const T *ps, const float *fs,
                                           float *bad_s, const float *inv_s, mla_barriers &bar, int head0, int rows,
                                           bool delay)
{
    typedef mla_wg W;
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    const int r = warp * 16 + lane / 4;
    const int num_items = p.head->counts[COUNT_DECODE];
    int g = 0, ns = 0; /* tiles so far; s_done's phases waited for */
    for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
        const decode_item it = p.items[w];
        if (it.req < 0) continue;
        const int n_tiles = (it.kv_end - it.kv_begin + W::KEYS - 1) / W::KEYS;
        float o[W::HALF / 8][4];
        zero(o);
        for (int t = 0; t < n_tiles; t++) {
            const int gt = g + t;
            /* P of the tile before is read (packed: at the first tile too,
             * as warpgroup 0's share() does) */
            if (PACK || gt > 0) bar_sync_any(BAR_P_FREE, 256);
            bar_sync_any(BAR_P_READY, 256);
            uint32_t pa[W::KEYS / 16][4];
            const int mi = lane / 8;
#pragma unroll
            for (int k = 0; k < W::KEYS / 16; k++)
                ldmatrix_x4(pa[k], ps + (warp * 16 + (mi % 2) * 8 + lane % 8) * W::PSTRIDE + (2 * k + mi / 2) * 8);
            const float f[2] = {fs[r], fs[r + 8]};
            if (!PACK) {
                /* the parts of the stage this warpgroup does not read */
                mbar_arrive(&bar.k_empty[gt % W::STAGES][PART_LO]);
                mbar_arrive(&bar.k_empty[gt % W::STAGES][PART_ROPE]);
            }
            if (__any_sync(0xffffffffu, f[0] != 1.0f || f[1] != 1.0f)) scale_rows(o, f);
            /* blocks 4 to 7 (each on its own barrier: TMA's land in any
             * order; their first tests issued together measured level,
             * 0.989-1.000 of the time, H200, BENCHMARKS.md) */
#pragma unroll
            for (int b = 4; b < W::DVO / 64; b++) mbar_wait(&bar.k_full[gt % W::STAGES][b], (gt / W::STAGES) & 1);
            fence_proxy_async();
            /* full row tiles (`delay`): this P V runs under warpgroup 0's
             * softmax of the next tile, not beside its S (S is what the
             * softmax waits for) */
            if (!PACK && delay && t + 1 < n_tiles) mbar_wait(&bar.s_done, ns++ & 1);
            /* o[:, 256:512]: the stage's column blocks 4 to 7; waited for at
             * once, so the stage is free as soon as it can be (this
             * warpgroup has nothing else to do until the next P) */
            issue_pv<W::HALF, W::KEYS, T>(o, pa, stages + (gt % W::STAGES) * W::TILE + 4 * W::KEYS * 64);
            wgmma_wait<0>();
            wgmma_hold(reinterpret_cast<float(&)[W::HALF / 2]>(o));
            mbar_arrive(&bar.k_empty[gt % W::STAGES][PACK ? 0 : PART_HI]);
        }
        g += n_tiles;
        share_bad_o(o, bad_s, r);
        bar_sync_any(BAR_BAD_READY, 256);
        bar_sync_any(BAR_INV_READY, 256);
        const float inv[2] = {inv_s[r], inv_s[r + 8]};
        mla_store<T, PACK>(p, it, o, 1, head0, rows, r, inv);
    }
    if (g > 0) bar_sync_any(BAR_P_FREE, 256); /* pairs with warpgroup 0's last */
}

template <typename T, int ADDR>
__device__ __forceinline__ void mla_wgmma_body(const attn_params &p, const CUtensorMap *map)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef mla_wg W;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    T *qs = (T *)(smem_raw + ((1024 - (raw & 1023)) & 1023));
    T *stages = qs + W::TILE;
    T *ps = stages + W::STAGES * W::TILE;
    float *fs = (float *)(ps + W::ROWS * W::PSTRIDE), *bad_s = fs + W::ROWS, *inv_s = bad_s + W::ROWS;
    mla_barriers &bar = *(mla_barriers *)(inv_s + W::ROWS);
    if (threadIdx.x == 0) {
        for (int i = 0; i < W::STAGES; i++) {
            for (int b = 0; b < W::BLOCKS; b++) mbar_init(&bar.k_full[i][b], W::PRODUCERS);
            for (int part = 0; part < W::PARTS; part++) mbar_init(&bar.k_empty[i][part], 256);
        }
        mbar_init(&bar.q_full, W::PRODUCERS);
        mbar_init(&bar.q_empty, 128);
        mbar_init(&bar.s_done, 128);
    }
    __syncthreads();
    decode_grid_start();
    const int wg = threadIdx.x / 128;
    const int kv_head = blockIdx.y / p.row_tiles, row_tile = blockIdx.y % p.row_tiles;
    const int head0 = kv_head * p.group + row_tile * W::ROWS;
    const int rows = min(W::ROWS, p.group - row_tile * W::ROWS);
    /* items of several tokens in this plan: their path (the plan's head is
     * read at every launch, so a captured graph follows) */
    const bool packed = p.head->mla_packed != 0;
    /* warpgroup 1's P V waits for the next S (mla_values) in full row tiles */
    const bool delay = rows == W::ROWS;
    if (wg == 2) {
        setmaxnreg_dec<W::PRODUCER_REGS>();
        if (packed) mla_producer<T, ADDR, true>(p, map, qs, stages, bar, kv_head, head0, rows);
        else mla_producer<T, ADDR, false>(p, map, qs, stages, bar, kv_head, head0, rows);
    } else {
        setmaxnreg_inc<W::CONSUMER_REGS>();
        if (wg == 0) {
            if (packed) mla_scores<T, true>(p, qs, stages, ps, fs, bad_s, inv_s, bar, head0, rows, delay);
            else mla_scores<T, false>(p, qs, stages, ps, fs, bad_s, inv_s, bar, head0, rows, delay);
        } else {
            if (packed) mla_values<T, true>(p, stages, ps, fs, bad_s, inv_s, bar, head0, rows, delay);
            else mla_values<T, false>(p, stages, ps, fs, bad_s, inv_s, bar, head0, rows, delay);
        }
    }
#endif
}

/* maps.k (ak_cuda_mla_tma_map) is read by TMA where the launch put it: a
 * __grid_constant__ */
template <typename T>
__global__ void __launch_bounds__(384, 1) mla_wgmma_kernel(const attn_params p, const __grid_constant__ kv_maps maps)
{
    if (p.ragged) mla_wgmma_body<T, 1>(p, &maps.k);
    else mla_wgmma_body<T, 0>(p, &maps.k);
}

template <typename T> attn_kernel mla_kernel_of()
{
    /* the second parameter on the launch path (launch_kernel) */
    const attn_kernel k = {(void (*)(const attn_params))mla_wgmma_kernel<T>, mla_wg::THREADS, mla_wg::SMEM_BYTES,
                           mla_wg::ROWS, 0, 1};
    return k;
}

} // namespace

attn_kernel ak_cuda_mla_wgmma_kernel(ak_dtype dtype)
{
#if defined(AK_WGMMA)
    if (dtype == AK_BF16) return mla_kernel_of<__nv_bfloat16>();
    if (dtype == AK_F16) return mla_kernel_of<__half>();
#else
    (void)dtype;
#endif
    const attn_kernel none = {NULL, 0, 0, 0, 0};
    return none;
}

int ak_cuda_mla_tma_map(const attn_params *p, CUtensorMap *map)
{
    typedef mla_wg W;
    const int64_t esz = 2; /* 16-bit rows */
    const int64_t slot = p->k_stride_slot * esz, block = p->k_block_stride * esz;
    if (p->ragged || p->page_size % W::KEYS != 0 || p->num_blocks <= 0 || p->num_kv_heads != 1) return 0;
    if ((uintptr_t)p->k_pool % 16 || slot <= 0 || block <= 0 || slot % 16 || block % 16) return 0;
    if (slot >= ((int64_t)1 << 40) || block >= ((int64_t)1 << 40)) return 0; /* TMA's stride limit */
    const encode_tiled_fn encode = ak_cuda_encode_tiled();
    if (!encode) return 0;
    const cuuint64_t dims[3] = {(cuuint64_t)W::DQK, (cuuint64_t)p->page_size, (cuuint64_t)p->num_blocks};
    const cuuint64_t strides[2] = {(cuuint64_t)slot, (cuuint64_t)block};
    const cuuint32_t box[3] = {64, W::KEYS, 1}, step[3] = {1, 1, 1};
    const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, (void *)p->k_pool, dims, strides, box, step,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}
