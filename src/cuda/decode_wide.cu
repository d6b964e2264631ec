/*
 * decode_wide.cu - decode over rows of 512 values and more, on tensor cores:
 * head dim 512 (DQK = DVO = 512, K and V pools), and multi-head latent
 * attention in its absorbed form (cuda_mla: DQK = 576 latent + rotary
 * values, DVO = 512, the value being the first 512 values of the same row,
 * so a tile is loaded once and serves q.k and p.v).
 *
 * The decode engine of decode.cu keeps a whole 16 x DVO accumulator per warp
 * (256 registers a thread at DVO = 512) and every warp computes over its own
 * keys. Here the W warps of a block (4 or 8, wide_shape below) share each
 * tile instead:
 *   q.k   the tile's scores S [ROWS x KEYS]: warp w computes one piece of
 *         16-32 rows x 16-32 keys over a slice of the head dim (KS slices
 *         when there are fewer pieces than warps), into shared memory;
 *   softmax  ROWS x KEYS over the block's threads (a row's threads are
 *         neighbouring lanes of one warp): the slices summed, the masks,
 *         the NaN rule, the online max and sum; P (16-bit) and each row's
 *         rescale factor into shared memory;
 *   p.v   warp w owns 512 / W of the output columns for every row, so no
 *         merge across warps is needed at the end.
 * ROWS = 16 x MT query heads a block: MT = 1, 2 or 4 (16, 32, 64 heads; MLA's
 * 128 heads are two row tiles of 64). With 64 rows a latent row loaded once
 * feeds 64 x 2 x (576 + 512) flops.
 *
 * fp8 e4m3 K/V: the stages hold the fp8 rows as they are; each tile is
 * converted once into a 16-bit tile (exact) that the products read; k_scale
 * multiplies the raw dots, v_scale (MLA: k_scale) the finished rows.
 *
 * Measured (BENCHMARKS.md): decode at 16 heads and d512 is bound by the
 * block's serial phases more than by bandwidth, and 128-head MLA by the
 * tensor pipe idling through them (one block of 8 warps an SM): a warpgroup
 * MMA kernel is the way past it.
 *
 * Items, outputs, split-KV partials, sinks, soft-cap and the NaN rule are
 * those of decode.cu (attn.cuh): an item is one query token's keys [kv_begin,
 * kv_end) (MLA's multi-token requests are one item per token, each with its
 * own causal end, planned by the engine).
 */
#include "attn.cuh"

#include <type_traits>

/* A block's shape: W warps, ROWS = 16 x MT query heads, KEYS keys a tile,
 * q.k pieces of PM 16-row tiles x PN 16-key groups (each piece's k steps
 * split into KS slices so that every warp has one), STAGES tiles of K/V in
 * shared memory. */
template <int DQK, int DVO, int MT, bool SHARED, int W, int KEYS_, int PM, int PN, int STAGES_, bool FP8>
struct wide_traits {
    static_assert(DVO == 512 && DQK >= DVO && DQK % 64 == 0, "wide decode: DVO 512, DQK a multiple of 64");
    static constexpr int WARPS = W, THREADS = WARPS * 32;
    static constexpr int ROWS = 16 * MT;
    static constexpr int KEYS = KEYS_;
    static_assert(MT % PM == 0 && (KEYS / 16) % PN == 0, "pieces tile the scores");
    static constexpr int PIECES = (MT / PM) * (KEYS / 16 / PN);
    static_assert(WARPS % PIECES == 0, "score pieces divide among the warps");
    static constexpr int KS = WARPS / PIECES;   /* head-dim slices of a piece */
    static_assert((DQK / 16) % KS == 0, "k steps divide among the slices");
    static constexpr int COLS = DVO / WARPS;    /* output columns a warp owns */
    static_assert(COLS % 16 == 0, "whole ldmatrix pairs of columns");
    static constexpr int TPR = THREADS / ROWS;  /* softmax threads a row */
    static constexpr int KPT = KEYS / TPR;      /* keys a softmax thread */
    static_assert(TPR <= 32 && KPT >= 2 && KPT % 2 == 0, "a row's softmax threads are one warp's, keys in pairs");
    static constexpr int PSTRIDE = KEYS + 8;    /* P row stride (elements): conflict-free ldmatrix */
    static constexpr int SSTRIDE = KEYS + 4;    /* S row stride (floats; float2 stores stay aligned) */
    static constexpr int PIECE_M = PM, PIECE_N = PN;
    /* a stage: K [KEYS][DQK], and V [KEYS][DVO] unless it is K's start;
     * fp8: the stages hold the fp8 rows (one byte an element, unswizzled),
     * converted tile by tile into one 16-bit tile the products read */
    static constexpr int STAGE_ELEMS = KEYS * DQK + (SHARED ? 0 : KEYS * DVO);
    static constexpr int STAGES = STAGES_;
    static constexpr int TILE16_BYTES = FP8 ? STAGE_ELEMS * 2 : 0;
    static constexpr int KV_BYTES = STAGES * STAGE_ELEMS * (FP8 ? 1 : 2) + TILE16_BYTES;
    static constexpr int Q_BYTES = ROWS * DQK * 2;
    static constexpr int S_BYTES = KS * ROWS * SSTRIDE * 4;
    static constexpr int P_BYTES = ROWS * PSTRIDE * 2;
    /* per-row factor, then the epilogue's 1/d, then each warp's NaN-rule sum */
    static constexpr int F_BYTES = (2 * ROWS + WARPS * ROWS) * 4;
    static constexpr int SMEM_BYTES = KV_BYTES + Q_BYTES + S_BYTES + P_BYTES + F_BYTES;
    static_assert(SMEM_BYTES <= 227 * 1024, "fits one block an SM");
};

/* The shapes measured best (BENCHMARKS.md): 16 heads on 4 warps, two blocks
 * an SM; 32 and 64 heads on 8 warps with pieces of 32 x 16 or 32 x 32 (q and
 * K fragments each serve two mma); 512-wide V rows in tiles of 16 keys where
 * 32 would leave one block an SM or not fit. */
template <int DQK, int MT, bool SHARED, bool FP8> struct wide_shape;
template <int DQK, bool F> struct wide_shape<DQK, 1, true, F> {
    typedef wide_traits<DQK, 512, 1, true, 4, 32, 1, 1, 2, F> tr;
};
template <int DQK, bool F> struct wide_shape<DQK, 2, true, F> {
    typedef wide_traits<DQK, 512, 2, true, 8, 32, 2, 1, 2, F> tr;
};
template <int DQK, bool F> struct wide_shape<DQK, 4, true, F> {
    typedef wide_traits<DQK, 512, 4, true, 8, 32, 2, 2, 2, F> tr;
};
template <int DQK, bool F> struct wide_shape<DQK, 1, false, F> {
    typedef wide_traits<DQK, 512, 1, false, 4, 16, 1, 1, 2, F> tr;
};
template <int DQK, bool F> struct wide_shape<DQK, 2, false, F> {
    typedef wide_traits<DQK, 512, 2, false, 8, 32, 2, 1, 2, F> tr;
};
template <int DQK, bool F> struct wide_shape<DQK, 4, false, F> {
    typedef wide_traits<DQK, 512, 4, false, 8, 16, 2, 1, 2, F> tr;
};

template <int DQK, int DVO, int MT, bool SHARED, typename T, bool FP8>
__global__ void __launch_bounds__(wide_shape<DQK, MT, SHARED, FP8>::tr::THREADS) decode_wide_kernel(const attn_params p)
{
    typedef typename wide_shape<DQK, MT, SHARED, FP8>::tr tr;
    typedef typename std::conditional<FP8, uint8_t, T>::type KV; /* a stage's element */
    constexpr int ROWS = tr::ROWS, KEYS = tr::KEYS, KCH = DQK / 8, VCH = DVO / 8;
    extern __shared__ uint4 smem[];
    decode_grid_start();
    KV *stages = (KV *)smem;
    T *tile16 = (T *)((char *)smem + (tr::KV_BYTES - tr::TILE16_BYTES)); /* fp8: the converted tile */
    T *qs = (T *)((char *)smem + tr::KV_BYTES);
    float *S = (float *)((char *)qs + tr::Q_BYTES);
    T *P = (T *)((char *)S + tr::S_BYTES);
    float *F = (float *)((char *)P + tr::P_BYTES);
    float *INV = F + ROWS;
    float *BADW = INV + ROWS;

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int kv_head = blockIdx.y / p.row_tiles, row_tile = blockIdx.y % p.row_tiles;
    const int head0 = kv_head * p.group + row_tile * ROWS;
    const int rows = min(ROWS, p.group - row_tile * ROWS);
    const int64_t k_head = kv_head * p.k_stride_head, v_head = kv_head * p.v_stride_head;
    const int32_t *table = p.head->kv_table;
    kv_scales sc = {1.0f, 1.0f};
    if (FP8) sc = kv_scales_of(p, kv_head);

    /* keys [t0, t0 + KEYS) into stage s: K rows of DQK, V rows of DVO
     * (SHARED: none, V is the start of the K row), zero past kv_end and
     * before lo (no row sees them, and a NaN there must not reach o) */
    auto issue = [&](int s, int t0, const decode_item &it) {
        KV *ks = stages + s * tr::STAGE_ELEMS;
        KV *vs = ks + KEYS * DQK;
        /* fp8: 16 elements a chunk, rows as they are */
        constexpr int KC = FP8 ? DQK / 16 : KCH, VC = FP8 ? DVO / 16 : VCH, EPC = FP8 ? 16 : 8;
        constexpr int PER_ROW = SHARED ? KC : KC + VC;
        const uint64_t pol = l2_evict_first(); /* read once in the step (common.cuh) */
        for (int i = threadIdx.x; i < KEYS * PER_ROW; i += tr::THREADS) {
            const int row = i / PER_ROW, c = i - row * PER_ROW;
            const int key = min(t0 + row, it.kv_end - 1);
            int slot;
            const int64_t block = kv_block_of(p, table, it.page_base, key, slot);
            const int bytes = t0 + row < it.kv_end && t0 + row >= it.lo ? 16 : 0;
            if constexpr (FP8) {
                const bool is_k = c < KC;
                const int cc = is_k ? c : c - KC;
                const uint8_t *src = is_k ? (const uint8_t *)p.k_pool + block * p.k_block_stride +
                                                slot * p.k_stride_slot + k_head + cc * EPC
                                          : (const uint8_t *)p.v_pool + block * p.v_block_stride +
                                                slot * p.v_stride_slot + v_head + cc * EPC;
                /* (no L2 policy: see load_kv_tile_fp8_ids) */
                cp_async_16((is_k ? ks + row * DQK : vs + row * DVO) + cc * EPC, src, bytes);
            } else if (c < KCH) {
                cp_async_16_pol(ks + swz<DQK>(row, c),
                                (const T *)p.k_pool + block * p.k_block_stride + slot * p.k_stride_slot + k_head +
                                    c * 8,
                                bytes, pol);
            } else {
                cp_async_16_pol(vs + swz<DVO>(row, c - KCH),
                                (const T *)p.v_pool + block * p.v_block_stride + slot * p.v_stride_slot + v_head +
                                    (c - KCH) * 8,
                                bytes, pol);
            }
        }
    };

    /* this warp's score piece: PM row tiles from 16 PM m_piece, PN key groups
     * from 16 PN n_piece, the k steps of slice ks_piece */
    constexpr int PIECES = tr::PIECES, KSTEPS = DQK / 16 / tr::KS, PM = tr::PIECE_M, PN = tr::PIECE_N;
    const int piece = warp % PIECES, ks_piece = warp / PIECES;
    const int m_piece = piece / (KEYS / 16 / PN), n_piece = piece % (KEYS / 16 / PN);
    /* the softmax's view: row sr, keys [sk, sk + KPT) */
    const int sr = threadIdx.x / tr::TPR, sk = (threadIdx.x % tr::TPR) * tr::KPT;
    const int num_items = p.head->counts[COUNT_DECODE];

    for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
        const decode_item it = p.items[w];
        if (it.req < 0) continue;
        __syncthreads(); /* the previous item is done with shared memory */
        const int n_tiles = (it.kv_end - it.kv_begin + KEYS - 1) / KEYS;
#pragma unroll
        for (int s = 0; s < tr::STAGES - 1; s++) {
            if (s < n_tiles) issue(s, it.kv_begin + s * KEYS, it);
            cp_async_commit();
        }
        /* q: the block's rows, zero past the group */
        for (int i = threadIdx.x; i < ROWS * KCH; i += tr::THREADS) {
            const int row = i / KCH, c = i - row * KCH;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (row < rows)
                v = *(const uint4 *)((const T *)p.q + it.tok * p.q_stride_tok + (head0 + row) * p.q_stride_head +
                                     c * 8);
            *(uint4 *)(qs + swz<DQK>(row, c)) = v;
        }
        float acc[MT][tr::COLS / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < tr::COLS / 8; n++) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.0f;
        float m_run = -INFINITY, d_run = 0.0f; /* row sr's state (every thread of the row holds m) */

        for (int t = 0; t < n_tiles; t++) {
            cp_async_wait<tr::STAGES - 2>();
            __syncthreads(); /* tile t landed; everyone is done with tile t - 1, P and F */
            const int next = t + tr::STAGES - 1;
            if (next < n_tiles) issue(next % tr::STAGES, it.kv_begin + next * KEYS, it);
            cp_async_commit();
            const KV *ks_stage = stages + (t % tr::STAGES) * tr::STAGE_ELEMS;
            if constexpr (FP8) {
                /* the fp8 tile into the 16-bit one (every e4m3 value, NaN
                 * included, is an f16 and a bf16), in the layout below */
                constexpr int KC = DQK / 16, VC = SHARED ? 0 : DVO / 16;
                for (int u = threadIdx.x; u < KEYS * (KC + VC); u += tr::THREADS) {
                    const int row = u / (KC + VC), c = u - row * (KC + VC);
                    const bool is_k = c < KC;
                    const int cc = is_k ? c : c - KC;
                    const uint4 x = *(const uint4 *)(is_k ? ks_stage + row * DQK + cc * 16
                                                          : ks_stage + KEYS * DQK + row * DVO + cc * 16);
                    uint4 lo, hi;
                    fp8x16_to<T>(x, lo, hi);
                    T *dst = is_k ? tile16 + swz<DQK>(row, 2 * cc) : tile16 + KEYS * DQK + swz<DVO>(row, 2 * cc);
                    T *dst2 = is_k ? tile16 + swz<DQK>(row, 2 * cc + 1)
                                   : tile16 + KEYS * DQK + swz<DVO>(row, 2 * cc + 1);
                    *(uint4 *)dst = lo;
                    *(uint4 *)dst2 = hi;
                }
                __syncthreads();
            }
            const T *ks = FP8 ? tile16 : (const T *)ks_stage;
            const T *vs = SHARED ? ks : ks + KEYS * DQK;
            constexpr int VROW = SHARED ? DQK : DVO; /* V's shared-memory row */
            const int t0 = it.kv_begin + t * KEYS;

            /* q.k: one piece of PM x 16 rows by PN x 16 keys over KSTEPS k
             * steps, in NA sets of accumulators taking the k steps in turn
             * (eight independent mma chains a warp, whatever the piece: one
             * chain of KSTEPS dependent mma left the tensor pipe waiting on
             * each result, Nsight Compute's fixed-latency stall), summed at
             * the end */
            {
                constexpr int NA = PM * PN >= 4 ? 1 : 4 / (PM * PN);
                float s[NA][PM][2 * PN][4];
#pragma unroll
                for (int x = 0; x < NA; x++)
#pragma unroll
                    for (int i = 0; i < PM; i++)
#pragma unroll
                        for (int n = 0; n < 2 * PN; n++)
                            s[x][i][n][0] = s[x][i][n][1] = s[x][i][n][2] = s[x][i][n][3] = 0.0f;
                const int mi = lane / 8, r = lane % 8;
#pragma unroll
                for (int j = 0; j < KSTEPS; j++) {
                    const int kk = ks_piece * KSTEPS + j, x = j % NA;
                    uint32_t a[PM][4], b[PN][4];
#pragma unroll
                    for (int i = 0; i < PM; i++)
                        ldmatrix_x4(a[i], qs + swz<DQK>((m_piece * PM + i) * 16 + (mi % 2) * 8 + r, 2 * kk + mi / 2));
#pragma unroll
                    for (int n = 0; n < PN; n++)
                        ldmatrix_x4(b[n], ks + swz<DQK>((n_piece * PN + n) * 16 + (mi / 2) * 8 + r, 2 * kk + mi % 2));
#pragma unroll
                    for (int i = 0; i < PM; i++)
#pragma unroll
                        for (int n = 0; n < PN; n++) {
                            mma_16816<T>(s[x][i][2 * n], a[i], b[n]);
                            mma_16816<T>(s[x][i][2 * n + 1], a[i], b[n] + 2);
                        }
                }
                float *Sw = S + ks_piece * ROWS * tr::SSTRIDE;
#pragma unroll
                for (int i = 0; i < PM; i++) {
                    const int r0 = (m_piece * PM + i) * 16 + lane / 4;
#pragma unroll
                    for (int n = 0; n < 2 * PN; n++) {
#pragma unroll
                        for (int x = 1; x < NA; x++)
#pragma unroll
                            for (int e = 0; e < 4; e++) s[0][i][n][e] += s[x][i][n][e];
                        const int col = n_piece * PN * 16 + n * 8 + (lane % 4) * 2;
                        *(float2 *)(Sw + r0 * tr::SSTRIDE + col) = make_float2(s[0][i][n][0], s[0][i][n][1]);
                        *(float2 *)(Sw + (r0 + 8) * tr::SSTRIDE + col) = make_float2(s[0][i][n][2], s[0][i][n][3]);
                    }
                }
            }
            __syncthreads();

            /* softmax: row sr, keys sk.. */
            {
                float x[tr::KPT];
                float tmax = -INFINITY, bad = 0.0f;
#pragma unroll
                for (int j = 0; j < tr::KPT; j++) {
                    float dot = 0.0f;
#pragma unroll
                    for (int q = 0; q < tr::KS; q++) dot += S[(q * ROWS + sr) * tr::SSTRIDE + sk + j];
                    if (FP8) dot *= sc.k; /* the raw dot of the real values (k_scale) */
                    const int key = t0 + sk + j;
                    const bool seen = key < it.kv_end && key >= it.lo;
                    if (seen) add_bad(bad, dot); /* the NaN rule: the raw product */
                    x[j] = seen ? to_logit2(p, dot) : -INFINITY;
                    tmax = fmaxf(tmax, x[j]);
                }
#pragma unroll
                for (int o = 1; o < tr::TPR; o *= 2) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
                const float m_new = fmaxf(m_run, tmax);
                const float f = m_run == -INFINITY ? 0.0f : exp2f(m_run - m_new);
                m_run = m_new;
                d_run = d_run * f + bad;
#pragma unroll
                for (int j = 0; j < tr::KPT; j += 2) {
                    const float p0 = x[j] == -INFINITY ? 0.0f : exp2f(x[j] - m_new);
                    const float p1 = x[j + 1] == -INFINITY ? 0.0f : exp2f(x[j + 1] - m_new);
                    d_run += p0 + p1;
                    *(uint32_t *)(P + sr * tr::PSTRIDE + sk + j) = dtype_traits<T>::pack(p0, p1);
                }
                if (threadIdx.x % tr::TPR == 0) F[sr] = f;
            }
            __syncthreads();

            /* p.v: every row x this warp's COLS columns */
            {
                const int mi = lane / 8, r = lane % 8;
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const float f0 = F[mt * 16 + lane / 4], f1 = F[mt * 16 + lane / 4 + 8];
#pragma unroll
                    for (int n = 0; n < tr::COLS / 8; n++) {
                        acc[mt][n][0] *= f0;
                        acc[mt][n][1] *= f0;
                        acc[mt][n][2] *= f1;
                        acc[mt][n][3] *= f1;
                    }
                }
#pragma unroll
                for (int kk = 0; kk < KEYS / 16; kk++) {
                    uint32_t a[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
                        ldmatrix_x4(a[mt], P + (mt * 16 + (mi % 2) * 8 + r) * tr::PSTRIDE + (2 * kk + mi / 2) * 8);
#pragma unroll
                    for (int np = 0; np < tr::COLS / 16; np++) {
                        uint32_t b[4];
                        ldmatrix_x4_trans(b, vs + swz<VROW>(kk * 16 + (mi % 2) * 8 + r,
                                                            warp * (tr::COLS / 8) + 2 * np + mi / 2));
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma_16816<T>(acc[mt][2 * np], a[mt], b);
                            mma_16816<T>(acc[mt][2 * np + 1], a[mt], b + 2);
                        }
                    }
                }
            }
        }
        cp_async_wait<0>();

        /* the NaN rule on o: each warp's sum over its columns, per row */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float bad = 0.0f;
#pragma unroll
                for (int n = 0; n < tr::COLS / 8; n++) {
                    add_bad(bad, acc[mt][n][2 * h]);
                    add_bad(bad, acc[mt][n][2 * h + 1]);
                }
                bad += __shfl_xor_sync(0xffffffffu, bad, 1);
                bad += __shfl_xor_sync(0xffffffffu, bad, 2);
                if (lane % 4 == 0) BADW[warp * ROWS + mt * 16 + h * 8 + lane / 4] = bad;
            }
        __syncthreads();
        /* each row's final state: 1/d and the LSE */
        {
            float d = d_run;
#pragma unroll
            for (int o = 1; o < tr::TPR; o *= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
            if (threadIdx.x % tr::TPR == 0) {
#pragma unroll
                for (int w2 = 0; w2 < tr::WARPS; w2++) d += BADW[w2 * ROWS + sr];
                float inv = 0.0f, lse = -INFINITY;
                if (sr < rows) {
                    const int head = head0 + sr;
                    if (FP8) v_scale_rule(sc.v, d);
                    finish_row(p, head, it.out >= 0, m_run, d, inv, lse);
                    if (FP8) inv *= sc.v;
                    if (it.out < 0) {
                        if (p.lse) p.lse[it.tok * p.lse_stride_tok + head] = lse;
                    } else {
                        p.lse_tmp[(int64_t)it.out * p.num_qo_heads + head] = lse;
                    }
                }
                INV[sr] = inv;
            }
        }
        __syncthreads();
        /* o: this warp's columns of every row */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = mt * 16 + h * 8 + lane / 4;
                if (row >= rows) continue;
                const float inv = INV[row];
                const int head = head0 + row;
#pragma unroll
                for (int n = 0; n < tr::COLS / 8; n++) {
                    const int col = warp * tr::COLS + n * 8 + (lane % 4) * 2;
                    const float o0 = acc[mt][n][2 * h] * inv, o1 = acc[mt][n][2 * h + 1] * inv;
                    if (it.out < 0) {
                        *(uint32_t *)((T *)p.o + it.tok * p.o_stride_tok + head * p.o_stride_head + col) =
                            dtype_traits<T>::pack(o0, o1);
                    } else {
                        *(float2 *)(p.o_tmp + ((int64_t)it.out * p.num_qo_heads + head) * DVO + col) =
                            make_float2(o0, o1);
                    }
                }
            }
    }
}

template <int DQK, int MT, bool SHARED, typename T, bool FP8> static attn_kernel wide_kernel()
{
    typedef typename wide_shape<DQK, MT, SHARED, FP8>::tr tr;
    const attn_kernel k = {decode_wide_kernel<DQK, 512, MT, SHARED, T, FP8>, tr::THREADS, tr::SMEM_BYTES, tr::ROWS,
                           0};
    return k;
}

template <int DQK, bool SHARED, typename T, bool FP8> static attn_kernel wide_kernel_for(int group)
{
    if (group <= 16) return wide_kernel<DQK, 1, SHARED, T, FP8>();
    if (group <= 32) return wide_kernel<DQK, 2, SHARED, T, FP8>();
    return wide_kernel<DQK, 4, SHARED, T, FP8>();
}

template <int DQK, bool SHARED, typename T> static attn_kernel wide_kernel_of(int group, int fp8)
{
    return fp8 ? wide_kernel_for<DQK, SHARED, T, true>(group) : wide_kernel_for<DQK, SHARED, T, false>(group);
}

attn_kernel ak_cuda_decode_wide_kernel(int dqk, int dvo, ak_dtype dtype, int group, int mla, int fp8)
{
    const attn_kernel none = {NULL, 0, 0, 0, 0};
    if (dvo != 512 || (dtype != AK_BF16 && dtype != AK_F16)) return none;
    const bool bf = dtype == AK_BF16;
    if (mla && dqk == 576)
        return bf ? wide_kernel_of<576, true, __nv_bfloat16>(group, fp8) : wide_kernel_of<576, true, __half>(group, fp8);
    if (!mla && dqk == 512)
        return bf ? wide_kernel_of<512, false, __nv_bfloat16>(group, fp8)
                  : wide_kernel_of<512, false, __half>(group, fp8);
    return none;
}
