/*
 * prefill.cu - paged prefill / extend / verify on tensor cores: any number of
 * query tokens per request against the request's paged K/V, causal masking
 * aligned to the end of the KV (a chunk of q_len tokens sees the prefix of
 * kv_len - q_len keys and itself).
 *
 * FlashAttention-2's scheme on mma.sync m16n8k16: a thread block owns a tile
 * of ROWS query rows, packed as (token, query head of the KV head's group) so
 * a GQA group shares every K/V load; its 4 warps each own 16 * MT rows and
 * stream over every key of the tile's range with their own online softmax in
 * registers (no cross-warp merge). Q sits in shared memory (ldmatrix per k
 * step); K/V tiles of TILE keys stream in through cp.async, STAGES deep, read
 * through the page table with load_kv_tile (attn.cuh). Scores never leave
 * registers: the S accumulator becomes the A operand of P.V directly.
 *
 * The grid is fixed when the backend is created (one wave of thread blocks,
 * 1-D) and each block loops over the plan's work items, each for one KV head
 * and row tile (prefill_item.row), so a captured graph replays after any
 * later plan. plan() orders the items
 * request by request, each request's heaviest first, deals them to the
 * blocks by their load so far, and splits the keys of items that would
 * dominate the wave (split-KV; partials merged by merge.cu).
 *
 * Head dims: one instance per pair (DQK, DVO) of AK_TC_HEAD_DIMS; shared
 * memory rows of DP (both rounded up to 64), products over the real dims
 * (QK over DQK, P.V over DVO).
 *
 * fp8 K/V (the pairs of AK_TC_FP8_HEAD_DIMS): the stages hold fp8 rows; once
 * a tile has landed, the block converts it into one 16-bit K/V tile
 * (convert_fp8_rows, which also runs the NaN rule's V scan of a mixed tile)
 * and the mma code reads that; a second barrier a tile. k_scale multiplies
 * the raw dots, v_scale the finished rows.
 */
#include "attn.cuh"

#include <limits.h>
#include <type_traits>

/* ---- tile traits ------------------------------------------------------------ */

template <int DQK, int DVO, bool FP8 = false> struct prefill_traits {
    static constexpr int DP = head_dims<DQK, DVO>::DP;
    static constexpr int WARPS = 4;
    static constexpr int THREADS = WARPS * 32;
    /* 16-row m tiles per warp: two let each K/V fragment feed two mma (half
     * the shared-memory reads per FLOP); at DVO = 256 the o accumulator of
     * two (256 floats a thread) would not fit in registers */
    static constexpr int MT = DVO <= 128 && DQK <= 128 ? 2 : 1;
    static constexpr int WARP_ROWS = 16 * MT;
    static constexpr int ROWS = WARPS * WARP_ROWS;
    static constexpr int TILE = DP <= 128 ? 64 : 32; /* keys per K/V stage */
    static constexpr int STAGES = DP <= 64 || FP8 ? 3 : 2;
    static constexpr int CHUNKS = DP / 8; /* 16-byte chunks per shared-memory row */
    static constexpr int Q_BYTES = ROWS * DP * 2;
    static constexpr int STAGE_BYTES = 2 * TILE * DP * (FP8 ? 1 : 2);
    static constexpr int CVT_BYTES = FP8 ? 2 * TILE * DP * 2 : 0; /* fp8: the converted K/V tile */
    static constexpr int SMEM_BYTES = Q_BYTES + STAGES * STAGE_BYTES + CVT_BYTES;
    /* two blocks per SM at D = 128 and 256 (96 KB of shared memory each, at
     * most 255 registers a thread: 2 x 128 x 256 fills the register file;
     * ptxas: D = 128 uses 255 with ~20 bytes spilled, D = 256 none), three
     * at D = 64 (64 KB each, 168 registers, ~24 bytes spilled) */
    static constexpr int MIN_CTAS = DP <= 64 ? 3 : 2;
    static_assert((ROWS * CHUNKS) % THREADS == 0, "q chunks divide among the threads");
};

/* ---- the kernel --------------------------------------------------------------- */

template <int DQK, int DVO, typename T, bool FP8 = false>
__global__ void __launch_bounds__(prefill_traits<DQK, DVO, FP8>::THREADS, prefill_traits<DQK, DVO, FP8>::MIN_CTAS)
    prefill_kernel(const attn_params p)
{
    typedef prefill_traits<DQK, DVO, FP8> tr;
    typedef typename std::conditional<FP8, uint8_t, T>::type KV; /* a stage's element */
    constexpr int DP = tr::DP, OCHUNKS = DVO / 8;
    constexpr int MT = tr::MT, NT = tr::TILE / 8; /* n tiles (8 keys) of a K/V tile */
    extern __shared__ uint4 smem[];
    /* the NaN rule's marks of V's bad keys in a mixed tile (attn.cuh), three
     * sets used in turn by the block's tiles (of all its items, gt): a set
     * is read in its tile, cleared in the next, and written in the one after
     * (a block barrier between each) */
    __shared__ uint32_t bad_keys[3][tr::TILE / 32];
    if (threadIdx.x < 3 * (tr::TILE / 32)) bad_keys[threadIdx.x / (tr::TILE / 32)][threadIdx.x % (tr::TILE / 32)] = 0;
    T *qs = (T *)smem;
    KV *stages = (KV *)((char *)smem + tr::Q_BYTES);
    T *cvt_k = (T *)((char *)smem + tr::Q_BYTES + tr::STAGES * tr::STAGE_BYTES), *cvt_v = cvt_k + tr::TILE * DP;
#if __CUDA_ARCH__ >= 900
    if (p.wait_first) asm volatile("griddepcontrol.wait;" ::: "memory"); /* the scan pass's flags */
    asm volatile("griddepcontrol.launch_dependents;"); /* the merge may start launching */
#endif
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int mi = lane / 8, r8 = lane % 8; /* ldmatrix: matrix and row this lane addresses */
    const int hb = p.prow_heads;
    const int warp_row0 = warp * tr::WARP_ROWS;
    const int num_items = p.head->counts[COUNT_PREFILL];
    const int32_t *table = p.head->kv_table;
    int gt = 0; /* tiles of the earlier items */

    /* No return before the griddepcontrol.wait at the end: the merge after
     * this kernel sees decode's partials only because prefill cannot finish
     * before decode. */
    for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
        const prefill_item it = p.pitems[w];
        if (it.ntok == 0) continue; /* padding */
        const item_heads ih = heads_of(p, it);
        const int kv_head = ih.kv_head, head0 = ih.head0, heads = ih.heads;
        const kv_lane lane_off = FP8 ? kv_lane_fp8<DP>(p, kv_head) : kv_lane_of<DP>(p, kv_head);
        kv_scales sc8 = {1.0f, 1.0f};
        if (FP8) sc8 = kv_scales_of(p, kv_head);
        /* keys [t0, t0 + TILE) of the item into stage s */
        auto issue = [&](int s, int t0) {
            KV *ks = stages + s * 2 * tr::TILE * DP, *vs = ks + tr::TILE * DP;
            if constexpr (FP8)
                load_kv_tile_fp8<DQK, DVO, DP, tr::TILE, tr::THREADS>(p, table, it.page_base, lane_off, t0, it.kv_end,
                                                                       ks, vs);
            else
                load_kv_tile<DQK, DVO, DP, tr::TILE, tr::THREADS, T>(p, table, it.page_base, lane_off, t0, it.kv_end,
                                                                     ks, vs);
        };
        /* the item's path (the NaN rule, attn.cuh): checked, or not */
        auto item = [&](auto check) {
            constexpr bool CHECK = decltype(check)::value;
            const int n_tiles = (it.kv_end - it.kv_begin + tr::TILE - 1) / tr::TILE;
            __syncthreads(); /* every warp is done with the previous item's shared memory */

            /* q rows (zero past the tile's tokens and heads), in the first group */
            load_q_tile<tr::ROWS, tr::THREADS, DQK, DP>(p, it, head0, hb, heads, qs,
                                                        [](int row, int c) { return swz<DP>(row, c); });
#pragma unroll
            for (int s = 0; s < tr::STAGES - 1; s++) {
                if (s < n_tiles) issue(s, it.kv_begin + s * tr::TILE);
                cp_async_commit();
            }

            const int pos_last = it.pos0 + it.ntok - 1;

            float o[MT][DVO / 8][4];
            float m[MT][2], d[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
#pragma unroll
                for (int n = 0; n < DVO / 8; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
                m[mt][0] = m[mt][1] = -INFINITY;
                d[mt][0] = d[mt][1] = 0.0f;
            }

            for (int t = 0; t < n_tiles; t++) {
                cp_async_wait<tr::STAGES - 2>();
                const int t0 = it.kv_begin + t * tr::TILE;
                /* mixed: some key of the tile below kv_end is hidden from some row
                 * (the diagonal, a window's edge); the NaN rule's V scan runs
                 * there on this thread's landed copies, before the barrier */
                const bool mixed = (p.causal && t0 + tr::TILE - 1 > it.pos0) ||
                                   (p.window_left >= 0 && t0 < (int64_t)pos_last - p.window_left);
                uint32_t *bad = bad_keys[(gt + t) % 3];
                if constexpr (!FP8) /* fp8: in the conversion below */
                    if (CHECK && mixed)
                        scan_v_tile<DVO, DP, tr::TILE, tr::THREADS>(stages + (t % tr::STAGES) * 2 * tr::TILE * DP +
                                                                        tr::TILE * DP,
                                                                    [](int row, int c) { return swz<DP>(row, c); },
                                                                    bad, threadIdx.x);
                if (threadIdx.x < tr::TILE / 32) bad_keys[(gt + t + 1) % 3][threadIdx.x] = 0;
                __syncthreads(); /* tile t (and q) landed; every warp is done with tile t - 1 */
                if (t == 0) { /* the NaN rule's check of this warp's q rows */
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        const uint32_t qb = q_rows_bad<DQK, T>(
                            qs, [](int row, int c) { return swz<DP>(row, c); }, warp_row0 + mt * 16, lane);
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            if ((qb >> (2 * (lane / 4 + 8 * h))) & 1u) d[mt][h] = __int_as_float(0x7fc00000);
                    }
                }
                const int next = t + tr::STAGES - 1;
                if (next < n_tiles) issue(next % tr::STAGES, it.kv_begin + next * tr::TILE);
                cp_async_commit();
                const T *ks, *vs;
                if constexpr (FP8) {
                    /* the landed fp8 tile to the 16-bit one (every warp is done
                     * with the previous: the barrier above), then a barrier */
                    const uint8_t *k8 = stages + (t % tr::STAGES) * 2 * tr::TILE * DP, *v8 = k8 + tr::TILE * DP;
                    if (CHECK && mixed)
                        convert_fp8_rows<DQK, DVO, DP, tr::TILE, tr::THREADS, T, true>(k8, v8, cvt_k, cvt_v, 0,
                                                                                       threadIdx.x, bad);
                    else
                        convert_fp8_rows<DQK, DVO, DP, tr::TILE, tr::THREADS, T>(k8, v8, cvt_k, cvt_v, 0, threadIdx.x);
                    __syncthreads();
                    ks = cvt_k;
                    vs = cvt_v;
                } else {
                    ks = stages + (t % tr::STAGES) * 2 * tr::TILE * DP;
                    vs = ks + tr::TILE * DP;
                }

                /* s = q . k: this warp's rows x the tile's keys */
                float s[MT][NT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int n = 0; n < NT; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < DQK / 16; kk++) {
                    uint32_t a[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
                        ldmatrix_x4(a[mt], qs + swz<DP>(warp_row0 + mt * 16 + (mi % 2) * 8 + r8, 2 * kk + mi / 2));
#pragma unroll
                    for (int nb = 0; nb < NT / 2; nb++) {
                        uint32_t b[4];
                        ldmatrix_x4(b, ks + swz<DP>(nb * 16 + (mi / 2) * 8 + r8, 2 * kk + mi % 2));
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma_16816<T>(s[mt][2 * nb], a[mt], b);
                            mma_16816<T>(s[mt][2 * nb + 1], a[mt], b + 2);
                        }
                    }
                }

                if (FP8) /* k_scale on the raw dots, before the NaN rule sees them */
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int n = 0; n < NT; n++)
#pragma unroll
                            for (int e = 0; e < 4; e++) s[mt][n][e] *= sc8.k;

                /* masks only where some key of the tile is hidden from some row:
                 * the tile's end, the diagonal, the window */
                const bool masked = t0 + tr::TILE > it.kv_end || mixed;
                /* the NaN rule, checked path: every raw product a row sees (attn.cuh) */
#pragma unroll
                for (int mt = 0; mt < MT && CHECK; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        check_logits(p, s[mt], h, it.pos0 + (warp_row0 + mt * 16 + lane / 4 + h * 8) / hb, t0,
                                     it.kv_end, lane, masked, d[mt][h]);
                /* soft-cap before the masks: tanh(-inf) would unmask */
                if (p.soft_cap > 0.0f) {
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int n = 0; n < NT; n++)
#pragma unroll
                            for (int e = 0; e < 4; e++) s[mt][n][e] = p.cap_log2 * tanhf(s[mt][n][e] * p.cap_scale);
                }
                if (masked) {
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            mask_row(p, s[mt], h, it.pos0 + (warp_row0 + mt * 16 + lane / 4 + h * 8) / hb, t0,
                                     it.kv_end, lane);
                            if (CHECK && mixed) flag_bad_keys(s[mt], h, lane, bad, d[mt][h]);
                        }
                }
                /* s is now a logit in base 2 (soft-capped) or a raw dot product
                 * whose logit is s * scale: exp2 takes one FFMA either way */
                const float sc = p.soft_cap > 0.0f ? 1.0f : p.scale_log2;

                /* online softmax per row (rows lane/4 and lane/4 + 8 of each m tile).
                 * The reference m is raised only when a tile's max passes it by
                 * more than RESCALE_SLACK (base 2): p = exp2(logit - m) then stays
                 * below 2^RESCALE_SLACK, harmless in f32 sums and in the 16-bit P
                 * (relative precision), and the o rescale (D / 2 multiplies per
                 * row) runs on a few tiles instead of all: ncu showed it at 1 in
                 * 12 instructions of the loop (d128), as many as the mma at d256.
                 * The decision is warp-wide so the branch never diverges. A row
                 * with nothing visible yet keeps m = -inf and uses 0 as its
                 * reference, so exp2 sees -inf - 0 and never -inf - -inf. */
                uint32_t pa[MT][NT / 2][4];
                float tmax[MT][2];
                bool raise = false;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float x = -INFINITY;
#pragma unroll
                        for (int n = 0; n < NT; n++) x = fmaxf(x, fmaxf(s[mt][n][2 * h], s[mt][n][2 * h + 1]));
                        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
                        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
                        tmax[mt][h] = x * sc; /* in base-2 logits */
                        raise |= tmax[mt][h] > m[mt][h] + RESCALE_SLACK || (m[mt][h] == -INFINITY && x > -INFINITY);
                    }
                if (__any_sync(0xffffffffu, raise)) {
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const float m_new = fmaxf(m[mt][h], tmax[mt][h]);
                            const float f = m_new == -INFINITY ? 1.0f : exp2f(m[mt][h] - m_new);
                            m[mt][h] = m_new;
                            d[mt][h] *= f;
#pragma unroll
                            for (int n = 0; n < DVO / 8; n++) {
                                o[mt][n][2 * h] *= f;
                                o[mt][n][2 * h + 1] *= f;
                            }
                        }
                }
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const float ref[2] = {m[mt][0] == -INFINITY ? 0.0f : m[mt][0],
                                          m[mt][1] == -INFINITY ? 0.0f : m[mt][1]};
#pragma unroll
                    for (int n = 0; n < NT; n++) {
                        const float p0 = exp2f(fmaf(s[mt][n][0], sc, -ref[0]));
                        const float p1 = exp2f(fmaf(s[mt][n][1], sc, -ref[0]));
                        const float p2 = exp2f(fmaf(s[mt][n][2], sc, -ref[1]));
                        const float p3 = exp2f(fmaf(s[mt][n][3], sc, -ref[1]));
                        d[mt][0] += p0 + p1;
                        d[mt][1] += p2 + p3;
                        /* A fragment of P for k step n / 2: n even -> regs 0, 1; odd -> 2, 3 */
                        pa[mt][n / 2][(n % 2) * 2] = dtype_traits<T>::pack(p0, p1);
                        pa[mt][n / 2][(n % 2) * 2 + 1] = dtype_traits<T>::pack(p2, p3);
                    }
                }

                /* o += p . v */
#pragma unroll
                for (int kb = 0; kb < NT / 2; kb++)
#pragma unroll
                    for (int np = 0; np < DVO / 16; np++) {
                        uint32_t b[4];
                        ldmatrix_x4_trans(b, vs + swz<DP>(kb * 16 + (mi % 2) * 8 + r8, 2 * np + mi / 2));
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma_16816<T>(o[mt][2 * np], pa[mt][kb], b);
                            mma_16816<T>(o[mt][2 * np + 1], pa[mt][kb], b + 2);
                        }
                    }
            }
            gt += n_tiles;
            /* every copy into shared memory has landed (with no key tiles, q's
             * had not been waited for) and every warp is done with the tiles:
             * the epilogue may reuse q's rows */
            cp_async_wait<0>();
            __syncthreads();

            /* epilogue: row sums across the quad; each row's factor and LSE
             * (finish_row: the sink of its head, unless a split part) */
            float inv[MT][2], lse[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    /* the NaN rule: a non-finite o element makes its row NaN */
#pragma unroll
                    for (int n = 0; n < DVO / 8 && CHECK; n++) {
                        add_bad(d[mt][h], o[mt][n][2 * h]);
                        add_bad(d[mt][h], o[mt][n][2 * h + 1]);
                    }
                    d[mt][h] += __shfl_xor_sync(0xffffffffu, d[mt][h], 1);
                    d[mt][h] += __shfl_xor_sync(0xffffffffu, d[mt][h], 2);
                    const int row = warp_row0 + mt * 16 + lane / 4 + h * 8;
                    const int g = row - row / hb * hb;
                    if (FP8) v_scale_rule(sc8.v, d[mt][h]);
                    finish_row(p, head0 + min(g, heads - 1), it.out >= 0, m[mt][h], d[mt][h], inv[mt][h], lse[mt][h]);
                    if (FP8) inv[mt][h] *= sc8.v;
                }
            if (it.out < 0) {
                /* through this warp's own q rows in shared memory (no other warp
                 * reads them), then 16-byte stores of whole rows */
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const int row = warp_row0 + mt * 16 + lane / 4;
#pragma unroll
                    for (int n = 0; n < DVO / 8; n++) {
                        *(uint32_t *)(qs + swz<DP>(row, n) + (lane % 4) * 2) =
                            dtype_traits<T>::pack(o[mt][n][0] * inv[mt][0], o[mt][n][1] * inv[mt][0]);
                        *(uint32_t *)(qs + swz<DP>(row + 8, n) + (lane % 4) * 2) =
                            dtype_traits<T>::pack(o[mt][n][2] * inv[mt][1], o[mt][n][3] * inv[mt][1]);
                    }
                }
                __syncwarp();
                for (int idx = lane; idx < tr::WARP_ROWS * OCHUNKS; idx += 32) {
                    const int row = warp_row0 + idx / OCHUNKS, c = idx % OCHUNKS;
                    const int i = row / hb, g = row - i * hb;
                    if (i < it.ntok && g < heads)
                        *(uint4 *)((T *)p.o + (it.tok0 + i) * p.o_stride_tok + (head0 + g) * p.o_stride_head + c * 8) =
                            *(const uint4 *)(qs + swz<DP>(row, c));
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = warp_row0 + mt * 16 + lane / 4 + h * 8;
                    const int i = row / hb, g = row - i * hb;
                    if (i >= it.ntok || g >= heads) continue;
                    if (it.out < 0) {
                        if (p.lse && lane % 4 == 0) p.lse[(it.tok0 + i) * p.lse_stride_tok + head0 + g] = lse[mt][h];
                        continue;
                    }
                    /* a split part: f32 partial state of token i in slot out + i */
                    const int64_t slot = (int64_t)(it.out + i) * p.num_qo_heads + head0 + g;
                    float *dst = p.o_tmp + slot * DVO + (lane % 4) * 2;
#pragma unroll
                    for (int n = 0; n < DVO / 8; n++)
                        *(float2 *)(dst + n * 8) =
                            make_float2(o[mt][n][2 * h] * inv[mt][h], o[mt][n][2 * h + 1] * inv[mt][h]);
                    if (lane % 4 == 0) p.lse_tmp[slot] = lse[mt][h];
                }
        };
        /* fp8: a non-finite k_scale reaches every logit (the checked path) */
        if (item_checked(p, it, kv_head) || (FP8 && !isfinite(sc8.k))) item(bool_c<true>());
        else item(bool_c<false>());
    }
#if __CUDA_ARCH__ >= 900
    /* launched as a programmatic dependent of decode: finish only after it,
     * so the merge (which waits for this grid) sees decode's partials too */
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* ---- the kernel table ---------------------------------------------------------- */

template <int DQK, int DVO, typename T> struct mma_prefill_info {
    static attn_kernel get()
    {
        typedef prefill_traits<DQK, DVO> tr;
        const attn_kernel k = {prefill_kernel<DQK, DVO, T>, tr::THREADS, tr::SMEM_BYTES, tr::ROWS, 1};
        return k;
    }
};

template <int DQK, int DVO, typename T> struct mma_prefill_fp8_info {
    static attn_kernel get()
    {
        typedef prefill_traits<DQK, DVO, true> tr;
        const attn_kernel k = {prefill_kernel<DQK, DVO, T, true>, tr::THREADS, tr::SMEM_BYTES, tr::ROWS, 1};
        return k;
    }
};

attn_kernel ak_cuda_prefill_kernel(prefill_family f, int dqk, int dvo, ak_dtype dtype, int fp8)
{
    const attn_kernel none = {NULL, 0, 0, 0};
    if (f == PREFILL_PORTABLE) return ak_cuda_portable_kernel(0, dqk, dvo, dtype, fp8);
    if (f == PREFILL_WGMMA) return fp8 ? none : ak_cuda_prefill_wgmma_kernel(dqk, dvo, dtype);
    return fp8 ? kernel_table_fp8<mma_prefill_fp8_info>(dqk, dvo, dtype) : kernel_table<mma_prefill_info>(dqk, dvo, dtype);
}
