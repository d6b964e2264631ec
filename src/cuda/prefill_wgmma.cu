/*
 * prefill_wgmma.cu - the prefill kernel of prefill.cu for Hopper (sm_90a):
 * the same work items, masks, online softmax and outputs, with the two
 * matrix products on warpgroup MMA (wgmma.mma_async) instead of mma.sync.
 *
 * A thread block is warpgroups of 4 warps, specialized: consumers (two, or
 * three at head dims up to 64) and a producer. Consumer g owns query rows
 * [64 g, 64 g + 64) of the tile's 128 (192) (packed (token, query head) as
 * attn.cuh's tile_token: as in prefill.cu, or where a group does not
 * divide 64 rows, whole tokens in each warpgroup's), each warp 16 of them
 * with their softmax state in registers.
 * Per tile of KEYS keys, a warpgroup computes S = Q K^T with both operands
 * read by the tensor cores from shared memory (descriptors; no ldmatrix, no
 * register copies of K), turns S into P in registers, and accumulates
 * O += P V with P from registers and V from shared memory. mma.sync spends
 * about six warp instructions per MMA on operand movement (ncu on the sm_80
 * kernel: issue-bound); a wgmma of m64n128k16 is one instruction for 32 of
 * them.
 *
 * Q, K and V tiles share one layout (wgmma.cuh's sw128: 64-element column
 * blocks, 128-byte swizzle), STAGES deep. The producer warpgroup
 * (producer.cuh) fills them, running ahead of the consumers across items,
 * with its registers given to the consumers (setmaxnreg): a whole key tile
 * of ragged rows, or on pages of whole TMA boxes (a tile, or half of one,
 * a box a column block (and page) issued by one thread; or, on pages of
 * 16n keys, boxes of 32 or 16 rows spread over the producer's four
 * warps), by TMA (the pools' maps, built by run():
 * ak_cuda_prefill_tma_maps); any other tile with
 * cp.async through the page table, a block lookup a row; an item's q the
 * same way, by TMA when it fills the row tile (q's map). Stages pass between it and
 * the consumers through mbarriers, K and V apart (ws_barriers), so there is
 * no block barrier at all. Within a consumer, S of tile t is issued with
 * P.V of tile t - 1 (the softmax of t overlaps that P.V; at DP 256 the two
 * run in turn, one stage: see PIPE); between the two,
 * named barriers make them take turns (a ring) at issuing their MMAs.
 * (Each warpgroup on items of its own instead, as cuDNN's kernel at d128,
 * with S, softmax and P V in turn within a warpgroup: 1.5-2.3x the time;
 * BENCHMARKS.md, 2026-12-07.) An
 * item whose rows are all output rows writes o by TMA from shared memory
 * (the last key tile's K stage, or at DP 256 q's rows), one store a column
 * block, instead of 4-byte stores from registers (OSTORE). Below DP 256 a
 * second instance of each pair (PASS_DETECT, the engine's default where it
 * applies) needs no scan pass for the NaN rule: it runs every item
 * unchecked, finds the rule's cases from the last token's rows, and runs
 * those items again, checked (attn.cuh). Measured steps: BENCHMARKS.md.
 *
 * Head dims: one instance per pair (DQK, DVO) of AK_TC_HEAD_DIMS; tiles of
 * DP-element rows (both rounded up to 64), S over the real DQK (one k step
 * per 16), O += P V over DVO rounded up to 64 (wgmma's N for an MN-major
 * operand of 64-element swizzle atoms). The family's kernel for 512/512,
 * outside the table, is prefill_wide.cu's.
 *
 * Built only for sm_90a (CMake compiles this file for that target alone
 * when the build includes sm_90); elsewhere its kernels are empty and
 * ak_cuda_prefill_wgmma_kernel reports none.
 */
#include "attn.cuh"
#include "producer.cuh"
#include "wgmma.cuh"

#include <limits.h>

/* Keys per K/V tile, at every DP: the S accumulator is KEYS / 2 floats a
 * thread, o DVN / 2; at DP 256 both fit the consumers' 232 registers
 * (nvcc 13's ptxas spills 40 bytes in the clean pass, 96 in the checked
 * one), and Q and one stage fill the shared memory (below). The TMA boxes
 * (ak_cuda_prefill_tma_rows) follow it. 64 keys measured slower: at DP
 * 256 (PIPE's comment); on an H100 at d64 1.02-1.17x the time, at d128
 * 1.01-1.13x (indicative: that kernel's o, 128 rows, overran the 64-key K
 * tile OSTORE stages it in; BENCHMARKS.md, 2026-12-07). */
#define WG_KEYS 128

template <int DQK_, int DVO_> struct wg_traits {
    static constexpr int DQK = DQK_, DVO = DVO_;
    static constexpr int DP = head_dims<DQK, DVO>::DP; /* shared-memory rows */
    /* N of O += P V: DVO rounded up to whole 64-element column blocks (an
     * MN-major operand's swizzle atom); the columns past DVO are computed
     * from whatever the stage holds there and never stored */
    static constexpr int DVN = (DVO + 63) / 64 * 64;
    /* CWG consumer warpgroups (the MMAs and the softmax of 64 rows each)
     * and a producer warpgroup (the copies); registers move from the
     * producer to the consumers at the start (setmaxnreg): the consumers
     * get what the launch gives the block (LAUNCH_REGS a thread, 168 at 384
     * threads, 128 at 512) less the producer's. Measured (H100, d128 4 x
     * 4096): the producer spills at 24 (and stalled its copies: 22% slower
     * than 40); consumers at 224 spill more than at 232. (The producer at
     * 24 and the consumers at 240, FA3's split: the kernel spills 40
     * bytes at d128, 112 at d96; level at d128, 0.995-1.001 of the time,
     * phi3-mini 1.014; H200, BENCHMARKS.md.) At DP 64 a tile's MMAs take
     * half as long as at 128 but its softmax as long, so three consumers
     * (192 rows, 160 registers, the producer 32) take turns.
     * Measured (H100, 32/8 heads, d64, against two): 4 x 4096 1.22x faster
     * (0.680 against 0.831 ms), 16 x 1024 1.20x, 1 x 16384 1.23x, page 16
     * 1.19x, 32/32 heads 1.18x, though ptxas spills ~300 bytes at 160
     * registers */
    static constexpr int CWG = DP <= 64 ? 3 : 2;
    static constexpr int CONSUMERS = 128 * CWG, PRODUCERS = 128, THREADS = CONSUMERS + PRODUCERS;
    /* the launch's registers a thread, in units of 8; asking more than the
     * block holds would leave setmaxnreg.inc waiting forever */
    static constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
    static constexpr int PRODUCER_REGS = CWG == 2 ? 40 : 32;
    static constexpr int CONSUMER_REGS = (THREADS * LAUNCH_REGS - PRODUCERS * PRODUCER_REGS) / CONSUMERS / 8 * 8;
    static constexpr int ROWS = 64 * CWG;
    static constexpr int KEYS = WG_KEYS;
    /* PIPE: S of tile t is computed while P.V of tile t - 1 runs (both
     * asynchronous; the softmax of t then overlaps the P.V), which keeps
     * tiles t - 1 (its V), t and t + 1 (in flight) in shared memory: three
     * stages. At DP 256 (head dims 256, 192/192, 192/128) Q and one stage of
     * 128 keys fill the shared memory: without PIPE, K of a tile is freed
     * once its S is done, so the next tile's K loads under this tile's
     * softmax and P.V, and its V under the next S. Measured (H200, page 128,
     * against 64-key tiles in two stages, same run): 4 x 4096 d256 0.958 of
     * the time, 1 x 16384 0.925, gemma2-9b page 16 0.949, deepseek-v3-prefill
     * 4 x 4096 page 64 0.903, 192/192 0.907, d256 16 x 1024 1.010
     * (BENCHMARKS.md) */
    static constexpr bool PIPE = DP <= 128;
    /* (A second q buffer in place of a K stage, two K stages beside three
     * V, o then through the item's own q buffer: 1.018 of the time at d128
     * 16 x 1024, 1.037 at 64 x 512, q having landed in time already; at d64
     * alone, 0.98 there, but d128 1.011 / 1.031 and racecheck hazards;
     * H200, BENCHMARKS.md) */
    static constexpr int STAGES = PIPE ? 3 : 1;
    static constexpr int CHUNKS = DP / 8;
    static constexpr int Q_BYTES = ROWS * DP * 2;
    static constexpr int STAGE_BYTES = 2 * KEYS * DP * 2;
    /* + 1024: the tiles start on a 1024-byte boundary (the swizzle); then
     * the barriers (ws_barriers) */
    static constexpr int SMEM_BYTES = Q_BYTES + STAGES * STAGE_BYTES + 1024 + (4 * STAGES + 2) * 8;
    static_assert((ROWS * CHUNKS) % PRODUCERS == 0, "q chunks divide among the producers");
    static_assert(CONSUMER_REGS == (CWG == 2 ? 232 : 160), "the consumers' registers measured above");
    /* the most a block may use (DP 128: 230,512 bytes, and 48 static) */
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory per block on sm_90");
};

/* This warp's 16 rows of o (from warp_row0; o scaled by inv, in 16 bits)
 * into buf, in the tile layout of R rows a column block. */
template <int R, int OCHUNKS, int DN, typename T>
__device__ __forceinline__ void stage_o(T *buf, const float (&o)[DN][4], const float (&inv)[2], int warp_row0, int lane)
{
    const int row = warp_row0 + lane / 4;
#pragma unroll
    for (int n = 0; n < OCHUNKS; n++) {
        *(uint32_t *)(buf + sw128<R>(row, n) + (lane % 4) * 2) = dtype_traits<T>::pack(o[n][0] * inv[0], o[n][1] * inv[0]);
        *(uint32_t *)(buf + sw128<R>(row + 8, n) + (lane % 4) * 2) =
            dtype_traits<T>::pack(o[n][2] * inv[1], o[n][3] * inv[1]);
    }
}

/* Warpgroup wg's 64 staged rows of buf (R rows a column block, NCB blocks)
 * out by TMA (the o map, its box at head0 and token tok), once all its warps
 * staged theirs (named barrier `rows`); then `release` gets the
 * warpgroup's 128 arrivals, once the store has read them. (Released after
 * the next item's first S is issued instead, its other warps then not
 * waiting at that turn for this thread's warp: about level on the H200
 * and the H100. Staged there too, o held in registers until then, built
 * and not run: ptxas waits for that S before reading o, or spills o
 * packed. BENCHMARKS.md, 2026-12-04 and 2026-12-07.) */
template <int R, int NCB, typename T>
__device__ __forceinline__ void store_o_tma(const kv_maps *maps, const T *buf, int wg, int head0, int tok, int rows,
                                            uint64_t *release)
{
    fence_proxy_async(); /* the rows, visible to the store */
    bar_sync(rows, 128);
    if (threadIdx.x % 128 == 0) {
#pragma unroll
        for (int c = 0; c < NCB; c++) tma_store_3d(&maps->o, c * 64, head0, tok, buf + c * (R * 64) + wg * 64 * 64);
        bulk_commit();
        bulk_wait_read();
        mbar_arrive_n(release, 128);
    }
}

/* S of a key tile for a warp's 16 rows (its q rows from row0 in qs, sw128
 * rows of ROWS; the tile's K in ks, of KEYS) by mma.sync, whose m16n8
 * accumulators are the warp's part of the warpgroup MMA's: for the rare
 * tile whose exponentials ahead went out of range (softmax_rows_ahead),
 * which a warp redoes alone. */
template <int DQK, int ROWS, int KEYS, int NT, typename T>
__device__ __forceinline__ void s_by_mma(const T *qs, const T *ks, int row0, int lane, float (&s)[NT][4])
{
    const int mi = lane / 8, r8 = lane % 8;
#pragma unroll
    for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 1
    for (int kk = 0; kk < DQK / 16; kk++) {
        uint32_t a[4];
        ldmatrix_x4(a, qs + sw128<ROWS>(row0 + (mi % 2) * 8 + r8, 2 * kk + mi / 2));
#pragma unroll
        for (int nb = 0; nb < NT / 2; nb++) {
            uint32_t b[4];
            ldmatrix_x4(b, ks + sw128<KEYS>(nb * 16 + (mi / 2) * 8 + r8, 2 * kk + mi % 2));
            mma_16816<T>(s[2 * nb], a, b);
            mma_16816<T>(s[2 * nb + 1], a, b + 2);
        }
    }
}

/* The consumer warpgroups (threads 0 to CONSUMERS - 1): for each item, S = q K^T and
 * O += P V on the tensor cores with the online softmax between, then the
 * epilogue. */
template <int DQK, int DVO, typename T, int PASS>
__device__ __forceinline__ void prefill_wgmma_consumers(const attn_params &p, T *qs, T *stages,
                                                        ws_barriers<wg_traits<DQK, DVO>::STAGES> &bar,
                                                        uint32_t (*bad_keys)[wg_traits<DQK, DVO>::KEYS / 32],
                                                        const uint32_t *skip, const kv_maps *maps, item_ring *ring,
                                                        uint32_t *redo)
{
    typedef wg_traits<DQK, DVO> tr;
    constexpr int ROWS = tr::ROWS, KEYS = tr::KEYS, STAGES = tr::STAGES, DP = tr::DP, DVN = tr::DVN;
    constexpr int CONSUMERS = tr::CONSUMERS, CWG = tr::CWG;
    constexpr int NT = KEYS / 8;     /* n tiles (8 keys) of S */
    constexpr int DN = DVN / 8;      /* n tiles of o */
    constexpr int OCHUNKS = DVO / 8; /* 16-byte chunks of an output row */
    /* The epilogue stages o in qs (STAGED: q's buffer is free only after it)
     * or not, q's buffer then freed as soon as the last S is done (its
     * softmax, where that tile went ahead: see below). Measured (H100,
     * against staged, when q was freed after the last P V and o went out as
     * 16-byte rows from qs): 3-4% faster at d128 16 x 1024, 2.5% at 4 x
     * 4096, the same at d64, 2.5% slower at d256. */
    constexpr bool STAGED = !tr::PIPE;
    /* OSTORE: an item whose rows are all real output rows (p.o_box) writes
     * o by TMA from the shared memory of its last key tile's K (whose
     * release waits for that), so that no warp queues 4-byte stores behind
     * which its next loads and barriers wait. Two consumer warpgroups only
     * (a K tile of 128 keys holds their 128 rows of o at DP 128; at DP 64
     * three warpgroups' 192 rows do not fit a tile's 128 key rows). Named
     * barriers OS_LAST + 2 (os_n % 2) + w: the other warpgroup is done with
     * the last K tile of the os_n-th such item (its last S, or softmax
     * where that tile went ahead: its arrival, w's wait). Two sets in
     * turn: warpgroup 0 may reach the next such item's last S (a one-tile
     * item) before warpgroup 1 waits for this one's, and a named barrier
     * counts arrivals, not whose they are; it cannot get two items ahead,
     * its epilogue waits for warpgroup 1's arrival. OS_ROWS + w: warpgroup
     * w's rows are in shared memory.
     * Measured (H200, against 4-byte stores from registers, same run): 16 x
     * 1024 0.93 of the time, 64 x 512 0.90, 4 x 4096 0.98, non-causal 4 x
     * 4096 0.98, phi3-mini (d96, page 16) 0.97; staged at d256 (its copy of
     * 16-byte rows out of qs replaced by the same store) 16 x 1024 0.96, 4 x
     * 4096 0.98 (BENCHMARKS.md). Earlier (H100), the same staging with
     * 16-byte rows stored by the warps was 2% slower at 16 x 1024 */
    constexpr bool OSTORE = tr::PIPE && CWG == 2;
    static_assert(!OSTORE || ROWS * DVN <= KEYS * DP, "o (ROWS rows a column block) fits the last tile's K");
    constexpr int OS_LAST = 2 + CWG, OS_ROWS = 6 + CWG;
    static_assert(OS_ROWS + CWG <= REDO_BAR, "the named barriers");
    /* the NaN rule found in the kernel (attn.cuh): phase 1 runs the items
     * phase 0 flagged in redo again, checked, after every other */
    constexpr bool REDO = PASS == PASS_DETECT;
    static_assert(!REDO || tr::PIPE, "PASS_DETECT's checks are in PIPE's loop");
    int os_n = 0; /* items whose o went by TMA from a K stage */
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wg = warp / 4;
    /* The warpgroups take turns to issue their MMAs (named barrier 1 + w:
     * warpgroup w's turn, passed on by w - 1 in a ring), so one's softmax
     * runs while another's MMAs do rather than all contending at once;
     * warpgroup 0 goes first. Barrier 1 + CWG: the consumers' own. */
    constexpr int TURN = 256; /* (the warpgroup whose turn it is, and the one passing it) */
    if (wg == CWG - 1) bar_arrive(1, TURN);
    int g0 = 0; /* tiles of the earlier items */
    int nq = 0; /* items so far */
    int mk = 0; /* mixed tiles */
    const int warp_row0 = warp * 16;
    const int num_items = p.head->counts[COUNT_PREFILL];

    /* (The next item, and its scan flags, read during this item's
     * epilogue instead: no faster, H200, BENCHMARKS.md) */
    constexpr bool queue = PASS == PASS_QUEUE; /* (the producer's queue: producer.cuh) */
    for (int phase = 0; phase < 1 + REDO; phase++) {
        if (phase == 1) {
            /* phase 0's o stores written (not just read) before any is again;
             * its flags final, for the producer too */
            if (threadIdx.x % 128 == 0) bulk_wait();
            bar_sync_any(REDO_BAR, tr::THREADS); /* (the producer's is another instruction) */
        }
        for (int w = blockIdx.x, k = 0;; w += gridDim.x, k++) {
            if (queue) w = queue_take(*ring, k);
            if (w >= num_items || (phase == 1 && k >= REDO_ITEMS)) break;
            if (phase == 1 && !redo_flagged(redo, k)) continue;
            PF_CLK(wg, k, 0); /* (stamps: bench/prefill_clocks.py) */
            const prefill_item it = p.pitems[w];
            /* padding, the other pass's (the producer's mask) */
            if (!queue && (it.ntok == 0 || !mask_in_pass<PASS>(p, skip, k))) continue;
            const item_heads ih = heads_of(p, it);
            const int head0 = ih.head0, heads = ih.heads, hb = p.prow_heads;
            /* the item's path (the NaN rule, attn.cuh): checked, or not */
            auto item = [&](auto check) {
                constexpr bool CHECK = decltype(check)::value;
                const int n_tiles = (it.kv_end - it.kv_begin + KEYS - 1) / KEYS;
                /* every row of the tile a real output row: o by TMA (OSTORE,
                 * or STAGED: from the rows staged in qs; not in the checked
                 * pass, where ptxas then spills 272 bytes instead of 96) */
                const bool o_tma = (!STAGED || PASS != PASS_CHECKED) && p.o_box > 0 && it.out < 0 && heads == hb &&
                                   it.ntok >= CWG * p.o_box;
                const bool ostore = OSTORE && n_tiles > 0 && o_tma;
                PF_CLK(wg, k, 1);
                PF_CLK_SET(wg, k, 11, n_tiles);
                /* q, and the previous epilogue's turn at qs is over. (Tested
                 * together with the first tile's K, as a step's two waits
                 * below: level, 0.995-1.007 of the time, H200, BENCHMARKS.md) */
                mbar_wait(&bar.q_full, nq & 1);
                PF_CLK(wg, k, 2);
                nq++;

                const int pos_last = it.pos0 + it.ntok - 1;
                /* the positions of this thread's two rows, and of the warp's first
                 * and last: which tiles need masks */
                int g_;
                const int row_pos0 = it.pos0 + min(tile_token(p, warp_row0 + lane / 4, g_), it.ntok);
                const int row_pos1 = it.pos0 + min(tile_token(p, warp_row0 + lane / 4 + 8, g_), it.ntok);
                const int warp_pos0 = it.pos0 + min(tile_token(p, warp_row0, g_), it.ntok);
                const int warp_pos1 = min(it.pos0 + min(tile_token(p, warp_row0 + 15, g_), it.ntok), pos_last);
                /* The NaN rule found in the kernel (attn.cuh): the warp that
                 * holds rows of the item's last token checks one of its row
                 * halves (1 + h: the warp's rows lane / 4 + 8 h), at every
                 * key tile and in o at the end; `found` once it sees a case */
                const int last_h = !CHECK && REDO ? (__any_sync(0xffffffffu, row_pos0 == pos_last) ? 1
                                                       : __any_sync(0xffffffffu, row_pos1 == pos_last) ? 2
                                                                                                      : 0)
                                                    : 0;
                bool found = false;
                auto find_in_s = [&](const float(&s)[NT][4]) {
                    if (last_h == 1) found |= has_neg_inf<NT, 0>(s);
                    else if (last_h == 2) found |= has_neg_inf<NT, 1>(s);
                };

                float o[DN][4];
                float m[2] = {-INFINITY, -INFINITY}, d[2] = {0.0f, 0.0f};
#pragma unroll
                for (int n = 0; n < DN; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

                auto k_of = [&](int t) { return stages + ((g0 + t) % STAGES) * 2 * KEYS * DP; };
                auto v_of = [&](int t) { return k_of(t) + KEYS * DP; };
                /* V of tile t landed, and is visible to wgmma (the producer's
                 * cp.async writes are generic-proxy writes; each wait is
                 * followed by the fence before an MMA may read them. Leaving it
                 * out after the tiles copied by TMA, which need none, measured
                 * level: BENCHMARKS.md) */
                auto wait_v = [&](int t) {
                    const int g = g0 + t;
                    mbar_wait(&bar.v_full[g % STAGES], (g / STAGES) & 1);
                    fence_proxy_async();
                };
                /* Step t: wait for tile t (k_landed: the caller has waited for
                 * its K), and take this warpgroup's turn at the tensor cores
                 * (the caller issues, then passes the turn). A mixed
                 * tile (some key below kv_end hidden from some row of the block:
                 * the diagonal, a window's edge) first has its V scanned by the
                 * NaN rule, with a consumer barrier (the one per tile, only
                 * there); returns the set of its bad-key marks, or -1 */
                auto begin_tile = [&](int t, bool k_landed = false) {
                    const int g = g0 + t;
                    if (!k_landed) mbar_wait(&bar.k_full[g % STAGES], (g / STAGES) & 1);
                    if (t == 0) PF_CLK(wg, k, 3);
                    if (t == 0) { /* q landed: the NaN rule's check of this warp's q rows */
                        const uint32_t qb = q_rows_bad<DQK, T>(
                            qs, [](int row, int c) { return sw128<ROWS>(row, c); }, warp_row0, lane);
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            if ((qb >> (2 * (lane / 4 + 8 * h))) & 1u) d[h] = __int_as_float(0x7fc00000);
                    }
                    const int t0 = it.kv_begin + t * KEYS;
                    int set = -1;
                    const bool mixed =
                        (p.causal && t0 + KEYS - 1 > it.pos0) ||
                        (p.window_left >= 0 && t0 < (int64_t)pos_last - p.window_left);
                    if (CHECK && mixed) {
                        wait_v(t);
                        set = mk % 3;
                        /* (the producer's copies, which wait_v waited for) */
                        scan_v_tile<DVO, DP, KEYS, CONSUMERS>(
                            v_of(t), [](int row, int c) { return sw128<KEYS>(row, c); }, bad_keys[set], threadIdx.x);
                        fence_proxy_async(); /* its zeros, visible to wgmma */
                        bar_sync(1 + CWG, CONSUMERS);
                        if (threadIdx.x < KEYS / 32) bad_keys[(mk + 2) % 3][threadIdx.x] = 0;
                        mk++;
                    }
                    fence_proxy_async(); /* the copies, visible to wgmma */
                    if (t == 0) PF_CLK(wg, k, 4);
                    bar_sync(1 + wg, TURN);
                    if (t == 0) PF_CLK(wg, k, 5);
                    return set;
                };
                auto pass_turn = [&]() { bar_arrive(1 + (wg + 1) % CWG, TURN); };
                /* K of tile t is read no more by this warpgroup; an OSTORE
                 * item's last K stays for its o (the epilogue releases it) */
                auto release_k = [&](int t) {
                    if (!(ostore && t == n_tiles - 1)) mbar_arrive(&bar.k_empty[(g0 + t) % STAGES]);
                    else bar_arrive(OS_LAST + 2 * (os_n % 2) + (wg + 1) % CWG, CONSUMERS);
                };
                auto release_v = [&](int t) { mbar_arrive(&bar.v_empty[(g0 + t) % STAGES]); };
                /* s = q . k of tile t for this warpgroup's 64 rows: K-major
                 * operands, 16 elements (32 bytes) of the head dim a step */
                auto issue_s = [&](int t, float (&s)[NT][4]) {
                    const T *ks = k_of(t);
                    wgmma_fence();
#pragma unroll
                    for (int kk = 0; kk < DQK / 16; kk++) {
                        const uint64_t a =
                            wgmma_desc(qs + (kk / 4) * ROWS * 64 + wg * 64 * 64 + (kk % 4) * 16, 16, 1024);
                        const uint64_t b = wgmma_desc(ks + (kk / 4) * KEYS * 64 + (kk % 4) * 16, 16, 1024);
                        wgmma_ss<KEYS, T>(reinterpret_cast<float(&)[KEYS / 2]>(s), a, b, kk > 0);
                    }
                    wgmma_commit();
                };
                /* s (landed) -> P, with the masks this warp's rows need at tile t
                 * and the bad-key marks of set (-1: none) */
                auto softmax = [&](int t, int set, float (&s)[NT][4], float (&f)[2], bool ahead) {
                    const int t0 = it.kv_begin + t * KEYS;
                    const bool masked = t0 + KEYS > it.kv_end || (p.causal && t0 + KEYS - 1 > warp_pos0) ||
                                        (p.window_left >= 0 && t0 < (int64_t)warp_pos1 - p.window_left);
                    const uint32_t *bad = set >= 0 ? bad_keys[set] : NULL;
                    return ahead ? tile_softmax<NT, T, CHECK, true>(p, s, masked, t0, row_pos0, row_pos1, it.kv_end,
                                                                    bad, m, d, f)
                                 : tile_softmax<NT, T, CHECK>(p, s, masked, t0, row_pos0, row_pos1, it.kv_end, bad, m,
                                                              d, f);
                };

                if (tr::PIPE && n_tiles > 0) {
                    /* step t issues S of tile t and P.V of tile t - 1 together; the
                     * softmax of t runs while P.V does, then o is rescaled. The
                     * item's last P.V runs alone: issuing it with the next
                     * item's first S instead (one q buffer or two) measured
                     * slower: 10-17% at 16 x 1024, up to 21% at 64 x 512
                     * (BENCHMARKS.md) */
                    uint32_t pa[NT / 2][4]; /* P of the tile whose P.V is next */
                    {
                        float s[NT][4], f[2];
                        const int set = begin_tile(0);
                        issue_s(0, s);
                        pass_turn();
                        wgmma_wait<0>();
                        wgmma_hold(reinterpret_cast<float(&)[KEYS / 2]>(s));
                        find_in_s(s);
                        release_k(0);
                        if (n_tiles == 1) mbar_arrive(&bar.q_empty); /* (below) */
                        softmax(0, set, s, f, false); /* o is still 0: no rescale */
                        pack_p<NT, T>(s, pa);
                        PF_CLK(wg, k, 6);
                    }
                    for (int t = 1; t < n_tiles; t++) {
                        float s[NT][4], f[2];
                        /* V of t - 1 and K of t landed (copied in that order),
                         * their barriers tested together: one round trip where
                         * both have (begin_tile's fence then covers both).
                         * Measured (H200, against the two waits in turn): 16 x
                         * 1024 0.979 of the time, qwen2.5-7b 1 x 4096 0.985,
                         * phi3-mini 4 x 4096 page 16 0.980, 4 x 4096 0.993,
                         * the rest 0.994-0.998 (BENCHMARKS.md) */
                        {
                            const int gv = g0 + t - 1, gk = g0 + t;
                            mbar_wait2(&bar.v_full[gv % STAGES], (gv / STAGES) & 1, &bar.k_full[gk % STAGES],
                                       (gk / STAGES) & 1);
                        }
                        const int set = begin_tile(t, true);
                        issue_s(t, s);
                        issue_pv<DVN, KEYS, T>(o, pa, v_of(t - 1));
                        pass_turn();
                        wgmma_wait<1>();
                        wgmma_hold(reinterpret_cast<float(&)[KEYS / 2]>(s));
                        find_in_s(s);
                        /* The exponentials ahead of the maxima (attn.cuh) where
                         * the warp's rows all have a reference max, on the clean
                         * path (the NaN rule's checks take the usual one: with
                         * both in the checked loop ptxas reloaded 9 spilled
                         * values a tile at d128); where they went past
                         * AHEAD_RANGE, S again by this warp alone (so K and, on
                         * an item's last tile, q are kept until then), and the
                         * usual path. After the item's last S (its softmax,
                         * where that tile went ahead), q is read no more: the
                         * producer copies the next item's q under the rest of
                         * this item. Measured (H100, llama3-8b, page 128, q
                         * freed after the last S against after the last P.V):
                         * 16 x 1024 1.08x faster, d64 4 x 4096 1.02x, d128 4 x
                         * 4096 and 1 x 16384 the same */
                        const bool last = t == n_tiles - 1;
                        const bool ahead = !CHECK && (AK_PREFILL_ABLATE == 4 || /* (a diagnostics build: attn.cuh) */
                                                       __all_sync(0xffffffffu, m[0] != -INFINITY && m[1] != -INFINITY));
                        if (!ahead) {
                            release_k(t);
                            if (last) mbar_arrive(&bar.q_empty);
                        }
                        int got = ahead ? softmax(t, set, s, f, true) : SOFTMAX_FAR;
                        if ((got & SOFTMAX_FAR) && (AK_PREFILL_ABLATE != 4 || !ahead)) {
                            if (ahead) s_by_mma<DQK, ROWS, KEYS>(qs, k_of(t), warp_row0, lane, s);
                            got = softmax(t, set, s, f, false);
                        }
                        if (ahead) {
                            release_k(t);
                            if (last) mbar_arrive(&bar.q_empty);
                        }
                        wgmma_wait<0>();
                        wgmma_hold(reinterpret_cast<float(&)[DVN / 2]>(o));
                        release_v(t - 1);
                        if (got & SOFTMAX_RAISED) scale_rows<DN>(o, f);
                        pack_p<NT, T>(s, pa);
                    }
                    PF_CLK(wg, k, 7);
                    wait_v(n_tiles - 1);
                    issue_pv<DVN, KEYS, T>(o, pa, v_of(n_tiles - 1));
                    wgmma_wait<0>();
                    wgmma_hold(reinterpret_cast<float(&)[DVN / 2]>(o));
                    release_v(n_tiles - 1);
                    PF_CLK(wg, k, 8);
                } else {
                    for (int t = 0; t < n_tiles; t++) {
                        float s[NT][4], f[2];
                        uint32_t pn[NT / 2][4];
                        const int set = begin_tile(t);
                        issue_s(t, s);
                        pass_turn();
                        wgmma_wait<0>();
                        wgmma_hold(reinterpret_cast<float(&)[KEYS / 2]>(s));
                        release_k(t); /* (the next K loads under this softmax and P.V) */
                        if (softmax(t, set, s, f, false)) scale_rows<DN>(o, f);
                        pack_p<NT, T>(s, pn);
                        wait_v(t);
                        issue_pv<DVN, KEYS, T>(o, pn, v_of(t));
                        wgmma_wait<0>();
                        wgmma_hold(reinterpret_cast<float(&)[DVN / 2]>(o));
                        release_v(t);
                    }
                }
                g0 += n_tiles;
                if (!STAGED && n_tiles == 0) mbar_arrive(&bar.q_empty); /* (else after the last S) */
                if (last_h) {
                    found |= last_h == 1 ? o_nonfinite<OCHUNKS, 0>(o) : o_nonfinite<OCHUNKS, 1>(o);
                    if (__any_sync(0xffffffffu, found) && lane == 0) redo_flag(redo, k);
                }
                /* epilogue (prefill.cu's, one m tile a warp) */
                float inv[2], lse[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    /* the NaN rule: a non-finite o element (of the real dims) makes its row NaN */
#pragma unroll
                    for (int n = 0; n < OCHUNKS && CHECK; n++) {
                        add_bad(d[h], o[n][2 * h]);
                        add_bad(d[h], o[n][2 * h + 1]);
                    }
                    d[h] += __shfl_xor_sync(0xffffffffu, d[h], 1);
                    d[h] += __shfl_xor_sync(0xffffffffu, d[h], 2);
                    int g;
                    tile_token(p, warp_row0 + lane / 4 + 8 * h, g);
                    finish_row(p, head0 + min(g, heads - 1), it.out >= 0, m[h], d[h], inv[h], lse[h]);
                }
                PF_CLK(wg, k, 10);
                if (ostore) {
                    const int st = (g0 - 1) % STAGES; /* the last tile's */
                    T *os = stages + st * 2 * KEYS * DP;
                    bar_sync(OS_LAST + 2 * (os_n % 2) + wg, CONSUMERS); /* the other warpgroup is done with it */
                    PF_CLK(wg, k, 12);
                    os_n++;
                    stage_o<ROWS, OCHUNKS>(os, o, inv, warp_row0, lane);
                    PF_CLK(wg, k, 13);
                    store_o_tma<ROWS, DVN / 64>(maps, os, wg, head0, it.tok0 + wg * p.o_box, OS_ROWS + wg,
                                                &bar.k_empty[st]);
                    if (p.lse && lane % 4 == 0) {
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            int g;
                            const int i = tile_token(p, warp_row0 + lane / 4 + 8 * h, g);
                            if (i < it.ntok) p.lse[(it.tok0 + i) * p.lse_stride_tok + head0 + g] = lse[h];
                        }
                    }
                    PF_CLK(wg, k, 9);
                    return;
                }
                if (STAGED && it.out < 0) { /* (this warp's q rows: only its warpgroup read them, and it is done) */
                    stage_o<ROWS, OCHUNKS>(qs, o, inv, warp_row0, lane);
                    if (o_tma) /* the warpgroup's rows by TMA, then q's buffer is free */
                        store_o_tma<ROWS, DVN / 64>(maps, qs, wg, head0, it.tok0 + wg * p.o_box, OS_ROWS + wg,
                                                    &bar.q_empty);
                    __syncwarp();
                    for (int idx = lane; idx < 16 * OCHUNKS && !o_tma; idx += 32) {
                        const int row = warp_row0 + idx / OCHUNKS, c = idx % OCHUNKS;
                        int g;
                        const int i = tile_token(p, row, g);
                        if (i < it.ntok && g < heads)
                            *(uint4 *)((T *)p.o + (it.tok0 + i) * p.o_stride_tok + (head0 + g) * p.o_stride_head +
                                       c * 8) =
                                *(const uint4 *)(qs + sw128<ROWS>(row, c));
                    }
                }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int g;
                    const int i = tile_token(p, warp_row0 + lane / 4 + 8 * h, g);
                    if (i >= it.ntok || g >= heads) continue;
                    if (it.out < 0) {
                        if (!STAGED) {
                            T *dst = (T *)p.o + (it.tok0 + i) * p.o_stride_tok + (head0 + g) * p.o_stride_head +
                                     (lane % 4) * 2;
#pragma unroll
                            for (int n = 0; n < OCHUNKS; n++)
                                *(uint32_t *)(dst + n * 8) =
                                    dtype_traits<T>::pack(o[n][2 * h] * inv[h], o[n][2 * h + 1] * inv[h]);
                        }
                        if (p.lse && lane % 4 == 0) p.lse[(it.tok0 + i) * p.lse_stride_tok + head0 + g] = lse[h];
                        continue;
                    }
                    const int64_t slot = (int64_t)(it.out + i) * p.num_qo_heads + head0 + g;
                    float *dst = p.o_tmp + slot * DVO + (lane % 4) * 2;
#pragma unroll
                    for (int n = 0; n < OCHUNKS; n++)
                        *(float2 *)(dst + n * 8) = make_float2(o[n][2 * h] * inv[h], o[n][2 * h + 1] * inv[h]);
                    if (lane % 4 == 0) p.lse_tmp[slot] = lse[h];
                }
                if (STAGED && !o_tma) {
                    /* the staging reads of qs are done; their writes ordered
                     * before the next q's TMA writes (the async proxy) */
                    fence_proxy_async();
                    mbar_arrive(&bar.q_empty);
                }
                PF_CLK(wg, k, 9);
            };
            /* At DP 256 a kernel with both paths spills (BENCHMARKS.md): there
             * the items of each path are a kernel's pass of their own */
            if constexpr (PASS == PASS_CLEAN || PASS == PASS_QUEUE) {
                item(bool_c<false>());
            } else if constexpr (PASS == PASS_CHECKED) {
                item(bool_c<true>());
            } else if constexpr (PASS == PASS_DETECT) {
                if (phase == 1 || k >= REDO_ITEMS) item(bool_c<true>());
                else item(bool_c<false>());
            } else {
                if (item_checked(p, it, ih.kv_head)) item(bool_c<true>());
                else item(bool_c<false>());
            }
        }
    }
    if (threadIdx.x % 128 == 0) bulk_wait(); /* (o's stores done before the kernel is) */
    if (wg == 0) bar_sync(1, TURN); /* the last warpgroup's last pass of the turn */
}

/* Whether any of the block's items is its pass's by the mask (pass_mask,
 * written), a thread a word of it; past the mask's PASS_MASK_ITEMS every
 * item is the checked pass's. */
template <int PASS, int THREADS>
__device__ __forceinline__ bool block_has_own_items(const attn_params &p, const uint32_t *skip)
{
    const int num_items = p.head->counts[COUNT_PREFILL];
    const int n = num_items > (int)blockIdx.x ? (num_items - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x : 0;
    if (PASS == PASS_CHECKED && n > PASS_MASK_ITEMS) return true;
    const int m = n < PASS_MASK_ITEMS ? n : PASS_MASK_ITEMS;
    bool own = false;
    for (int i = threadIdx.x % THREADS; i * 32 < m; i += THREADS) {
        const uint32_t valid = m - i * 32 >= 32 ? ~0u : (1u << (m - i * 32)) - 1;
        own |= (~skip[i] & valid) != 0;
    }
    return own;
}

/* The kernel's body for one K/V addressing (ADDR: 0 paged, 1 ragged). */
template <int DQK, int DVO, typename T, int ADDR, int PASS>
__device__ __forceinline__ void prefill_wgmma_body(const attn_params &p, const kv_maps *maps)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef wg_traits<DQK, DVO> tr;
    constexpr int ROWS = tr::ROWS, KEYS = tr::KEYS, STAGES = tr::STAGES, DP = tr::DP;
    constexpr int CONSUMERS = tr::CONSUMERS;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    T *qs = (T *)(smem_raw + ((1024 - (raw & 1023)) & 1023));
    T *stages = qs + ROWS * DP;
    ws_barriers<STAGES> &bar = *(ws_barriers<STAGES> *)(stages + STAGES * 2 * KEYS * DP);
    /* the NaN rule's marks of V's bad keys in a mixed tile (attn.cuh), three
     * sets used in turn by the block's mixed tiles (mk counts them): a set is
     * written before a mixed tile's consumer barrier, read after it, and
     * cleared after the next one's, for the one after that */
    __shared__ uint32_t bad_keys[3][KEYS / 32];
    /* a one-pass kernel's mask of the other pass's items (attn.cuh's
     * mask_in_pass) */
    __shared__ uint32_t pass_skip[PASS == PASS_CHECKED || PASS == PASS_CLEAN ? PASS_MASK_ITEMS / 32 : 1];
    if (PASS == PASS_CHECKED || PASS == PASS_CLEAN)
        for (int i = threadIdx.x; i < PASS_MASK_ITEMS / 32; i += blockDim.x) pass_skip[i] = 0;
    if (threadIdx.x < 3 * (KEYS / 32)) bad_keys[threadIdx.x / (KEYS / 32)][threadIdx.x % (KEYS / 32)] = 0;
    /* the NaN rule found in the kernel: the items of the block to run again,
     * checked (attn.cuh; prefill_wgmma_consumers' phases) */
    constexpr int REDO_WORDS = PASS == PASS_DETECT ? REDO_ITEMS / 32 : 1;
    __shared__ uint32_t redo[REDO_WORDS];
    for (int i = threadIdx.x; i < REDO_WORDS; i += blockDim.x) redo[i] = 0;
    /* PASS_QUEUE: the items from the queue (producer.cuh's item_ring) */
    __shared__ item_ring ring[1];
    if (threadIdx.x == 0) {
        for (int i = 0; i < ITEM_RING && PASS == PASS_QUEUE; i++) mbar_init(&ring->full[i], 1);
        for (int i = 0; i < STAGES; i++) {
            mbar_init(&bar.k_full[i], tr::PRODUCERS);
            mbar_init(&bar.k_empty[i], CONSUMERS);
            mbar_init(&bar.v_full[i], tr::PRODUCERS);
            mbar_init(&bar.v_empty[i], CONSUMERS);
        }
        mbar_init(&bar.q_full, tr::PRODUCERS);
        mbar_init(&bar.q_empty, CONSUMERS);
    }
    if (p.q_box > 0 && (1 << p.prow_seg_log2) < ROWS) zero_q_pads<ROWS, DP, tr::THREADS>(qs); /* (for q's boxes by segment) */
    __syncthreads();
    if (p.wait_first) asm volatile("griddepcontrol.wait;" ::: "memory"); /* the scan pass's flags */
    asm volatile("griddepcontrol.launch_dependents;"); /* the merge may start launching */
    /* the clean pass of a plan with no scan tasks has nothing to do: its
     * blocks need not load the items they would skip (measured: 14 us at
     * deepseek-v3-prefill 16 x 1024, BENCHMARKS.md) */
    if ((PASS == PASS_CLEAN || PASS == PASS_QUEUE) && scanned_tasks(p) == 0) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        return;
    }
    if ((PASS == PASS_CHECKED || PASS == PASS_CLEAN) && scanned_tasks(p) > 0) {
        pass_mask<PASS, tr::THREADS>(p, pass_skip);
        /* a block with no item of its pass (the checked pass's blocks, most
         * often) goes straight to the end instead of walking the items it
         * would skip: it then costs the step only its start, in the tail of
         * the pass before it (engine.cu launches the clean pass first) */
        if (!__syncthreads_or(block_has_own_items<PASS, tr::THREADS>(p, pass_skip))) {
            asm volatile("griddepcontrol.wait;" ::: "memory");
            return;
        }
    }
    const int wg = threadIdx.x / 128;

    /* No return before the griddepcontrol.wait at the end (see prefill.cu). */
    if (wg == tr::CWG) {
        setmaxnreg_dec<tr::PRODUCER_REGS>();
        prefill_producer<tr, T, ADDR, true, PASS>(p, qs, stages, bar, maps, pass_skip, ring, redo);
    } else {
        setmaxnreg_inc<tr::CONSUMER_REGS>();
        prefill_wgmma_consumers<DQK, DVO, T, PASS>(p, qs, stages, bar, bad_keys, pass_skip, maps, ring, redo);
    }
    /* finish only after decode (see prefill.cu) */
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* maps (ak_cuda_prefill_tma_maps) are read by TMA where the launch put
 * them: a __grid_constant__ */
template <int DQK, int DVO, typename T, int PASS>
__global__ void __launch_bounds__(wg_traits<DQK, DVO>::THREADS, 1) prefill_wgmma_kernel(const attn_params p, const __grid_constant__ kv_maps maps)
{
    /* the addressing as a template argument: a runtime select costs this
     * kernel registers it does not have */
    if (p.ragged) prefill_wgmma_body<DQK, DVO, T, 1, PASS>(p, &maps);
    else prefill_wgmma_body<DQK, DVO, T, 0, PASS>(p, &maps);
}

/* The kernel of a pair: both paths of the NaN rule where they fit (PIPE,
 * DP <= 128); at DP 256 the checked pass, beside which
 * wgmma_prefill_clean_info's kernel runs the clean items
 * (ak_cuda_prefill_wgmma_clean_kernel). */
template <int DQK, int DVO, typename T> struct wgmma_prefill_info {
    static attn_kernel get()
    {
        typedef wg_traits<DQK, DVO> tr;
        constexpr int PASS = tr::PIPE ? PASS_ALL : PASS_CHECKED;
        /* the second parameter on the launch path (launch_kernel); tiles
         * packed by the warpgroups' 64 rows (engine.cu's prefill_rows), not
         * at DP 256, where o staged in q's rows would leave values in the
         * rows no token fills */
        const attn_kernel k = {(void (*)(const attn_params))prefill_wgmma_kernel<DQK, DVO, T, PASS>,
                               tr::THREADS, tr::SMEM_BYTES, tr::ROWS, tr::PIPE, 1, 0, tr::PIPE ? 64 : 0};
        return k;
    }
};
template <int DQK, int DVO, typename T, int PASS> struct wgmma_prefill_pass_info {
    static attn_kernel get()
    {
        typedef wg_traits<DQK, DVO> tr;
        if constexpr (tr::PIPE) {
            const attn_kernel none = {NULL, 0, 0, 0};
            return none;
        } else {
            const attn_kernel k = {(void (*)(const attn_params))prefill_wgmma_kernel<DQK, DVO, T, PASS>,
                                   tr::THREADS, tr::SMEM_BYTES, tr::ROWS, 0, 1};
            return k;
        }
    }
};
template <int DQK, int DVO, typename T> struct wgmma_prefill_clean_info : wgmma_prefill_pass_info<DQK, DVO, T, PASS_CLEAN> {
};
/* below DP 256: the kernel of wgmma_prefill_info finding the NaN rule's
 * cases itself (PASS_DETECT), the same launch shape */
template <int DQK, int DVO, typename T> struct wgmma_prefill_detect_info {
    static attn_kernel get()
    {
        typedef wg_traits<DQK, DVO> tr;
        if constexpr (!tr::PIPE) {
            const attn_kernel none = {NULL, 0, 0, 0};
            return none;
        } else {
            attn_kernel k = wgmma_prefill_info<DQK, DVO, T>::get();
            k.fn = (void (*)(const attn_params))prefill_wgmma_kernel<DQK, DVO, T, PASS_DETECT>;
            return k;
        }
    }
};
template <int DQK, int DVO, typename T> struct wgmma_prefill_queue_info : wgmma_prefill_pass_info<DQK, DVO, T, PASS_QUEUE> {
};

/* A pair's kernel of the first pass (the wide one at 512/512, outside the
 * table), or with clean that of the clean pass (2: from the queue; none but
 * at DP 256), or (3) the one finding the NaN rule's cases itself (none at
 * DP 256); none in a build without sm_90a. */
static attn_kernel wgmma_prefill_kernel_of(int dqk, int dvo, ak_dtype dtype, int clean)
{
#if defined(AK_WGMMA)
    if (clean == 3) return kernel_table<wgmma_prefill_detect_info>(dqk, dvo, dtype);
    if (clean == 2) return kernel_table<wgmma_prefill_queue_info>(dqk, dvo, dtype);
    if (clean) return kernel_table<wgmma_prefill_clean_info>(dqk, dvo, dtype);
    if (dqk == 512 && dvo == 512) return ak_cuda_prefill_wide_kernel(dtype);
    return kernel_table<wgmma_prefill_info>(dqk, dvo, dtype);
#else
    (void)dqk;
    (void)dvo;
    (void)dtype;
    (void)clean;
    const attn_kernel none = {NULL, 0, 0, 0};
    return none;
#endif
}

#if defined(AK_PREFILL_CLOCKS)
#include <stdio.h>
#include <stdlib.h>

void ak_cuda_prefill_clocks_dump(void)
{
    const char *path = getenv("AK_PREFILL_CLOCKS_OUT");
    if (!path) return;
    const size_t bytes = sizeof(long long) * PF_CLK_BLOCKS * PF_CLK_ITEMS * PF_CLK_ROLES * PF_CLK_STAMPS;
    long long *h = (long long *)malloc(bytes);
    FILE *f = h && cudaMemcpyFromSymbol(h, prefill_clk, bytes) == cudaSuccess ? fopen(path, "wb") : NULL;
    if (f) {
        fwrite(h, bytes, 1, f);
        fclose(f);
    }
    free(h);
}
#endif

attn_kernel ak_cuda_prefill_wgmma_kernel(int dqk, int dvo, ak_dtype dtype)
{
    return wgmma_prefill_kernel_of(dqk, dvo, dtype, 0);
}

attn_kernel ak_cuda_prefill_wgmma_clean_kernel(int dqk, int dvo, ak_dtype dtype)
{
    return wgmma_prefill_kernel_of(dqk, dvo, dtype, 1);
}

attn_kernel ak_cuda_prefill_wgmma_queue_kernel(int dqk, int dvo, ak_dtype dtype)
{
    return wgmma_prefill_kernel_of(dqk, dvo, dtype, 2);
}

attn_kernel ak_cuda_prefill_wgmma_detect_kernel(int dqk, int dvo, ak_dtype dtype)
{
    return wgmma_prefill_kernel_of(dqk, dvo, dtype, 3);
}

/* The K and V maps of the wgmma prefill (kv_maps): 16-bit rows as boxes of
 * 64 columns (128-byte swizzle: wgmma.cuh's layout) and of rows a whole key
 * tile, half of one (64) where pages hold 64 keys but not a whole tile of
 * 128, or (page_boxes) the larger of 32 and 16 that divides the page: a
 * tile is then 4 or 8 boxes a column block, each within a page. Paged: {D,
 * page_size, kv heads, blocks} by the pools' strides; ragged: {D, rows, kv
 * heads}, whole tiles, the rows unbounded (the items bound them). Measured
 * (H100, llama3-8b 4 x 4096, page 128, an earlier producer, one thread
 * issuing every box): boxes of 16 rows took 1.52 ms, 32 rows 1.28, 64 rows
 * 1.18, 128 rows 1.13: a TMA copy costs by the box. */
int ak_cuda_prefill_tma_rows(int dqk, int dvo, int ragged, int page_size, int page_boxes)
{
    if (dqk == 512 && dvo == 512) return 0; /* (prefill_wide.cu) */
    if (ragged || page_size % WG_KEYS == 0) return WG_KEYS;
    if (page_size % 64 == 0) return 64;
    return !page_boxes ? 0 : page_size % 32 == 0 ? 32 : page_size % 16 == 0 ? 16 : 0;
}

int ak_cuda_prefill_tma_q_tokens(int heads, int rows, int seg)
{
    /* a box a segment where segments end in rows no token fills (the
     * kernel zeroes those once), else the tile's */
    const int tokens = heads < 1 || seg < 1 ? 0 : seg % heads ? (seg < rows ? seg / heads : 0) : rows / heads;
    return heads <= 256 && tokens <= 256 ? tokens : 0; /* (TMA's box extents) */
}

void ak_cuda_prefill_tma_maps(attn_params *p, int dqk, int dvo, int rows, int page_boxes, kv_maps *maps)
{
    p->kv_box = p->q_box = p->o_box = 0;
    const int rows_box = ak_cuda_prefill_tma_rows(dqk, dvo, p->ragged, p->page_size, page_boxes);
    const encode_tiled_fn encode = ak_cuda_encode_tiled();
    if (!encode || (dqk == 512 && dvo == 512)) return; /* (prefill_wide.cu: no maps) */
    const int64_t esz = 2; /* 16-bit rows */
    /* a map of 16-bit rows of d columns: dims[0] = d, then rank - 1 more
     * dimensions of the given extents and strides (elements); boxes of 64
     * columns and box[1..] */
    auto make = [&](CUtensorMap *map, const void *base, int d, int rank, const cuuint64_t *ext, const int64_t *st,
                    const cuuint32_t *box_rest) {
        if ((uintptr_t)base % 16) return false;
        cuuint64_t dims[4] = {(cuuint64_t)d}, strides[3];
        cuuint32_t box[4] = {64}, step[4] = {1, 1, 1, 1};
        for (int i = 0; i < rank - 1; i++) { /* TMA's strides: 16-byte multiples below 2^40 bytes */
            if (st[i] * esz <= 0 || st[i] * esz % 16 || st[i] * esz >= ((int64_t)1 << 40)) return false;
            dims[i + 1] = ext[i], strides[i] = (cuuint64_t)(st[i] * esz), box[i + 1] = box_rest[i];
        }
        return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, (cuuint32_t)rank, (void *)base, dims, strides, box, step,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
    };
    /* q and o: {d, heads, tokens} by the tensor's strides (elements), a box
     * `tokens` tokens of the row tile's heads (rows token-major, as
     * attn.cuh's tile_token packs a tile or a segment), or none (0 tokens: no box fits); the tokens
     * unbounded, as ragged rows below. With one head any valid stride will
     * do (the coordinate is 0). Returns the box's tokens, or 0: no map. */
    const int hb = p->prow_heads;
    auto make_rows = [&](CUtensorMap *map, const void *base, int d, int64_t stride_head, int64_t stride_tok,
                         int tokens) {
        const cuuint64_t ext[2] = {(cuuint64_t)p->num_qo_heads, (cuuint64_t)INT32_MAX};
        const int64_t st[2] = {p->num_qo_heads == 1 ? 8 : stride_head, stride_tok};
        const cuuint32_t box[2] = {(cuuint32_t)hb, (cuuint32_t)tokens};
        return tokens > 0 && make(map, base, d, 3, ext, st, box) ? tokens : 0;
    };
    /* q's box: every row of the tile, or of a segment; o's: a warpgroup's
     * 64 rows where they hold whole tokens, for a tile of two warpgroups
     * (prefill_wgmma_consumers' OSTORE) */
    const int seg = p->prow_seg_log2 < 8 ? 1 << p->prow_seg_log2 : rows; /* (8: the tile is one) */
    p->q_box = make_rows(&maps->q, p->q, dqk, p->q_stride_head, p->q_stride_tok,
                         ak_cuda_prefill_tma_q_tokens(hb, rows, seg));
    p->o_box = make_rows(&maps->o, p->o, dvo, p->o_stride_head, p->o_stride_tok,
                         rows == 128 && hb <= 64 && (seg == 64 || 64 % hb == 0) ? 64 / hb : 0);
    if (rows_box == 0 || (!p->ragged && p->num_blocks <= 0)) return;
    auto make_kv = [&](CUtensorMap *map, const void *base, int d, int64_t block, int64_t slot, int64_t head) {
        if (p->num_kv_heads == 1) head = 8; /* (any valid stride: the coordinate is 0) */
        const cuuint32_t box[3] = {(cuuint32_t)rows_box, 1, 1};
        if (p->ragged) {
            /* rows: no bound of the plan's (a captured graph replays later
             * plans over more rows); the kernel copies boxes below its items'
             * kv_end alone, rows run() checked the tensors hold */
            const cuuint64_t ext[2] = {(cuuint64_t)INT32_MAX, (cuuint64_t)p->num_kv_heads};
            const int64_t st[2] = {block, head};
            return make(map, base, d, 3, ext, st, box);
        }
        const cuuint64_t ext[3] = {(cuuint64_t)p->page_size, (cuuint64_t)p->num_kv_heads, (cuuint64_t)p->num_blocks};
        const int64_t st[3] = {slot, head, block};
        return make(map, base, d, 4, ext, st, box);
    };
    if (make_kv(&maps->k, p->k_pool, dqk, p->k_block_stride, p->k_stride_slot, p->k_stride_head) &&
        make_kv(&maps->v, p->v_pool, dvo, p->v_block_stride, p->v_stride_slot, p->v_stride_head))
        p->kv_box = rows_box;
}
