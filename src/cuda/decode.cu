/*
 * decode.cu - paged decode: one query token per request against its paged K/V.
 *
 * A thread block serves one KV head (grid.y) and loops over work items (a
 * request's keys [kv_begin, kv_end), planned on the host; the grid is one
 * wave fixed at create), serving every query head of that head's GQA group
 * from the same K/V loads. K/V tiles of 64 keys stream
 * through shared memory with cp.async (STAGES deep); each of the 4 warps owns
 * 16 keys of a tile and keeps its own online-softmax state {m, d, o}; the four
 * states merge at the end (softmax_state.h's algebra, in base 2).
 *
 * Two engines compute q.k and p.v, chosen at create() from the group size:
 *   tensor cores (group >= 2): the group's query heads are the 16 rows of an
 *     mma.sync m16n8k16 tile (padded), K and V fed by ldmatrix;
 *   CUDA cores (MHA, group 1): plain FMAs, q in shared memory as f32; the
 *     engine is written for any small group G, instantiated for G = 1.
 * Decode is memory-bound either way (~2 FLOP per byte of KV for small
 * groups); what matters is keeping enough bytes in flight.
 *
 * Head dims: the tensor-core engine serves every pair (DQK, DVO) of
 * AK_TC_HEAD_DIMS (attn.cuh), its shared-memory rows DP = the larger rounded
 * up to 64, its products over the real dims; the CUDA-core engine serves
 * equal dims of 64, 128 and 256.
 *
 * fp8 K/V (the pairs of AK_TC_FP8_HEAD_DIMS, tensor cores for any group):
 * the stages hold the fp8 rows (half the bytes: one stage more, and three
 * blocks an SM); the fp8 engine reads its mma operands straight from them
 * and converts them in registers, every product on f16 tensor cores
 * (mma_fp8_engine below); k_scale multiplies each raw dot, v_scale the
 * finished row.
 */
#include "attn.cuh"

#include <type_traits>

/* ---- tile traits ------------------------------------------------------------ */

template <int DQK, int DVO, bool FP8 = false> struct decode_traits {
    static constexpr int DP = head_dims<DQK, DVO>::DP;
    /* Shared memory per warp is 2 * KEYS_PER_WARP * DP * 2 bytes a stage, and
     * it sets how many warps an SM holds. 3 stages keep two tiles in flight
     * while one is computed. At DP = 256, 4 warps x 3 stages would be 192 KB
     * (one block per SM, 4 warps); 2 warps x 3 stages is 96 KB, two blocks
     * per SM with twice the bytes in flight. */
    static constexpr int WARPS = DP >= 256 ? 2 : 4;
    static constexpr int THREADS = WARPS * 32;
    static constexpr int KEYS_PER_WARP = 16; /* one k16 step of the p.v mma */
    static constexpr int TILE = WARPS * KEYS_PER_WARP;
    static constexpr int CHUNKS = DP / 8; /* 16-byte chunks per shared-memory row */
    static constexpr int STAGES = FP8 ? 4 : 3;
    static constexpr int ROWS = 16; /* query heads per tensor-core tile */
    static constexpr int KV_BYTES = STAGES * 2 * TILE * DP * (FP8 ? 1 : 2);
    /* q as the engine keeps it, then (fp8) a power-of-two factor a row */
    static constexpr int Q_BYTES = (ROWS * DP * 2 > AK_DECODE_CC_MAX_GROUP * DP * 4 ? ROWS * DP * 2
                                                                                    : AK_DECODE_CC_MAX_GROUP * DP * 4) +
                                   ROWS * 4;
    /* the epilogue reuses the K/V stages: per-warp o, m, d of every row */
    static constexpr int EPI_BYTES = WARPS * ROWS * (DVO + 2) * 4;
    static constexpr int SMEM_BYTES = KV_BYTES + Q_BYTES;
    static_assert(EPI_BYTES <= KV_BYTES, "epilogue scratch must fit in the K/V stages");
    static_assert((TILE * CHUNKS) % THREADS == 0, "tile chunks divide among the threads");
};

/* ---- device helpers --------------------------------------------------------- */

/* Online-softmax step for one row: folds a tile's max in, returns the factor
 * that rescales the old d and o (0 when the old max was -inf). */
__device__ __forceinline__ float fold_max(float &m, float tile_max)
{
    const float m_new = fmaxf(m, tile_max);
    const float f = m == -INFINITY ? 0.0f : exp2f(m - m_new);
    m = m_new;
    return f;
}

__device__ __forceinline__ float exp2_masked(float s, float m) { return s == -INFINITY ? 0.0f : exp2f(s - m); }

/* Per-warp state of one row, spilled for the epilogue. */
struct epi_smem {
    float *o; /* [WARPS][ROWS][DVO] */
    float *m; /* [WARPS][ROWS] */
    float *d; /* [WARPS][ROWS] */
};

template <int DQK, int DVO, bool FP8> __device__ __forceinline__ epi_smem epilogue_smem(void *base)
{
    typedef decode_traits<DQK, DVO, FP8> tr;
    epi_smem e;
    e.o = (float *)base;
    e.m = e.o + tr::WARPS * tr::ROWS * DVO;
    e.d = e.m + tr::WARPS * tr::ROWS;
    return e;
}

/* ---- the tensor-core engine: 16 query heads x 16 keys per warp -------------- */

template <int DQK, int DVO, typename T> struct mma_engine {
    typedef decode_traits<DQK, DVO> tr;
    static constexpr int DP = tr::DP;
    float o[DVO / 8][4]; /* 16 rows x DVO, C-fragment layout */
    float m[2], d[2];  /* rows lane/4 and lane/4 + 8 */

    __device__ __forceinline__ void init()
    {
#pragma unroll
        for (int n = 0; n < DVO / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        m[0] = m[1] = -INFINITY;
        d[0] = d[1] = 0.0f;
    }

    /* q tile [16][DQK] of T in rows of DP, swizzled; rows past the group are zero */
    static __device__ __forceinline__ void load_q(const attn_params &p, int tok, int head0, int rows, void *qs_raw)
    {
        T *qs = (T *)qs_raw;
        constexpr int QCHUNKS = DQK / 8;
        for (int i = threadIdx.x; i < tr::ROWS * QCHUNKS; i += tr::THREADS) {
            const int row = i / QCHUNKS, c = i % QCHUNKS;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (row < rows)
                v = *(const uint4 *)((const T *)p.q + tok * p.q_stride_tok + (head0 + row) * p.q_stride_head + c * 8);
            *(uint4 *)(qs + swz<DP>(row, c)) = v;
        }
    }

    /* kmul: what a raw dot is multiplied by (fp8: k_scale; else 1) */
    __device__ __forceinline__ void tile(const attn_params &p, const void *qs_raw, const T *ks, const T *vs,
                                         int t0, int lo, int kv_end, float kmul)
    {
        const T *qs = (const T *)qs_raw;
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int key0 = warp * tr::KEYS_PER_WARP;
        /* qk: s = q . k for 16 rows x this warp's 16 keys (2 n-tiles) */
        float s[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
        for (int kk = 0; kk < DQK / 16; kk++) {
            uint32_t a[4], b[4];
            const int mi = lane / 8, r = lane % 8;
            ldmatrix_x4(a, qs + swz<DP>((mi % 2) * 8 + r, 2 * kk + mi / 2));
            ldmatrix_x4(b, ks + swz<DP>(key0 + (mi / 2) * 8 + r, 2 * kk + mi % 2));
            mma_16816<T>(s[0], a, b);
            mma_16816<T>(s[1], a, b + 2);
        }
        /* logits, masks, online softmax for rows lane/4 (e < 2) and lane/4 + 8 */
        float tmax[2] = {-INFINITY, -INFINITY}, bad[2] = {0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = t0 + key0 + n * 8 + (lane % 4) * 2 + (e & 1);
                const bool seen = key < kv_end && key >= lo;
                s[n][e] *= kmul;
                if (seen) add_bad(bad[e / 2], s[n][e]); /* the NaN rule: the raw product (attn.cuh) */
                const float x = seen ? to_logit2(p, s[n][e]) : -INFINITY;
                s[n][e] = x;
                tmax[e / 2] = fmaxf(tmax[e / 2], x);
            }
        float f[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 1));
            tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 2));
            f[h] = fold_max(m[h], tmax[h]);
            d[h] = d[h] * f[h] + bad[h];
        }
        uint32_t pa[4];
#pragma unroll
        for (int n = 0; n < 2; n++) {
            const float p0 = exp2_masked(s[n][0], m[0]), p1 = exp2_masked(s[n][1], m[0]);
            const float p2 = exp2_masked(s[n][2], m[1]), p3 = exp2_masked(s[n][3], m[1]);
            d[0] += p0 + p1;
            d[1] += p2 + p3;
            pa[2 * n] = dtype_traits<T>::pack(p0, p1);
            pa[2 * n + 1] = dtype_traits<T>::pack(p2, p3);
        }
#pragma unroll
        for (int n = 0; n < DVO / 8; n++) {
            o[n][0] *= f[0];
            o[n][1] *= f[0];
            o[n][2] *= f[1];
            o[n][3] *= f[1];
        }
        /* pv: o += p . v over this warp's 16 keys, two n-tiles of dims per ldmatrix */
#pragma unroll
        for (int np = 0; np < DVO / 16; np++) {
            uint32_t b[4];
            const int mi = lane / 8, r = lane % 8;
            ldmatrix_x4_trans(b, vs + swz<DP>(key0 + (mi % 2) * 8 + r, 2 * np + mi / 2));
            mma_16816<T>(o[2 * np], pa, b);
            mma_16816<T>(o[2 * np + 1], pa, b + 2);
        }
    }

    /* this warp's state of every row -> shared memory */
    __device__ __forceinline__ void spill(const epi_smem &e)
    {
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int r0 = lane / 4;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            /* the NaN rule: a non-finite o element makes its row NaN */
#pragma unroll
            for (int n = 0; n < DVO / 8; n++) {
                add_bad(d[h], o[n][2 * h]);
                add_bad(d[h], o[n][2 * h + 1]);
            }
            d[h] += __shfl_xor_sync(0xffffffffu, d[h], 1);
            d[h] += __shfl_xor_sync(0xffffffffu, d[h], 2);
        }
        float *ow = e.o + warp * tr::ROWS * DVO;
#pragma unroll
        for (int n = 0; n < DVO / 8; n++) {
            const int col = n * 8 + (lane % 4) * 2;
            *(float2 *)(ow + r0 * DVO + col) = make_float2(o[n][0], o[n][1]);
            *(float2 *)(ow + (r0 + 8) * DVO + col) = make_float2(o[n][2], o[n][3]);
        }
        if (lane % 4 == 0) {
            e.m[warp * tr::ROWS + r0] = m[0];
            e.m[warp * tr::ROWS + r0 + 8] = m[1];
            e.d[warp * tr::ROWS + r0] = d[0];
            e.d[warp * tr::ROWS + r0 + 8] = d[1];
        }
    }
};

/* ---- the fp8 engine: 16 query heads x 16 keys per warp, fp8 K/V ------------- */

/* The mma operands come from the fp8 stages through ldmatrix on pairs of
 * bytes, converted in registers (cvt e4m3x2 -> f16x2, exact, NaN kept), and
 * every product runs on f16 tensor cores:
 *   q.k  ldmatrix (not transposed) gives lane (g, t) = (lane / 4, lane % 4)
 *        bytes 4t..4t+3 of a 16-byte chunk of key g: the four K elements its
 *        B fragment holds for one k16 step, if the step's k order is
 *        permuted within each chunk (k 2t + i <- dim 4t + i, k 2t + 8 + i <-
 *        dim 4t + 2 + i); q is stored with the same permutation (load_q), so
 *        the dot products are those of the real dims;
 *   p.v  ldmatrix.trans gives lane (g, t) the byte pairs of dims 2g, 2g + 1
 *        of keys 2t and 2t + 1; one byte permute makes a key pair of dim 2g
 *        and one of dim 2g + 1: two n tiles, the even and the odd dims of a
 *        chunk; spill() puts the dims back in order.
 * q: f16 q is used as it is; bf16 q is scaled per row by a power of two
 * that puts its largest magnitude in [0.5, 1) (f16 has bf16's precision and
 * more, not its range), the factor applied back to the row's logits. An
 * element below 2^-24 of its row's largest is lost (its share of the dot is
 * below the bf16 rounding of the result). */
template <int DQK, int DVO, typename T> struct mma_fp8_engine {
    typedef decode_traits<DQK, DVO, true> tr;
    static constexpr int DP = tr::DP;
    static_assert(DQK % 64 == 0 && DVO % 32 == 0, "fp8 decode: k steps four chunks at a time");
    float o[DVO / 8][4]; /* n tile 2c: the even dims of chunk c, 2c + 1 the odd ones */
    float m[2], d[2];

    __device__ __forceinline__ void init()
    {
#pragma unroll
        for (int n = 0; n < DVO / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        m[0] = m[1] = -INFINITY;
        d[0] = d[1] = 0.0f;
    }

    static __device__ __forceinline__ uint32_t cvt(uint32_t x) { return fp8x2_to<__half>((uint16_t)x); }

    /* q tile [16][DQK] as f16, each chunk's dims permuted (above), rows of DP,
     * swizzled; after it, the rows' factors (the power of two bf16 rows were
     * scaled by, else 1) */
    static __device__ __forceinline__ void load_q(const attn_params &p, int tok, int head0, int rows, void *qs_raw)
    {
        __half *qs = (__half *)qs_raw;
        float *qm = (float *)(qs + tr::ROWS * DP);
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        for (int row = warp; row < tr::ROWS; row += tr::WARPS) {
            float x[DQK / 32];
            float mx = 0.0f;
#pragma unroll
            for (int j = 0; j < DQK / 32; j++) {
                const int k = lane + 32 * j, l = k % 16; /* k: the mma's order */
                const int dim = k - l + 4 * ((l % 8) / 2) + 2 * (l / 8) + l % 2;
                x[j] = row < rows ? dtype_traits<T>::to_float(
                                        ((const T *)p.q)[tok * p.q_stride_tok + (head0 + row) * p.q_stride_head + dim])
                                  : 0.0f;
                mx = fmaxf(mx, fabsf(x[j]));
            }
#pragma unroll
            for (int s = 1; s < 32; s *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, s));
            /* 2^(126 - e) for a largest magnitude of biased exponent e (normal,
             * below 2^125: beyond, the row is left as it is) */
            const int e = (__float_as_int(mx) >> 23) & 0xff;
            const bool scale = !std::is_same<T, __half>::value && e >= 1 && e <= 252;
            const float sc = scale ? __int_as_float((253 - e) << 23) : 1.0f;
#pragma unroll
            for (int j = 0; j < DQK / 32; j++) {
                const int k = lane + 32 * j;
                qs[swz<DP>(row, k / 8) + k % 8] = __float2half_rn(x[j] * sc);
            }
            if (lane == 0) qm[row] = scale ? __int_as_float((e + 1) << 23) : 1.0f;
        }
    }

    __device__ __forceinline__ void tile(const attn_params &p, const void *qs_raw, const uint8_t *ks,
                                         const uint8_t *vs, int t0, int lo, int kv_end, float kmul)
    {
        const __half *qs = (const __half *)qs_raw;
        const float *qm = (const float *)(qs + tr::ROWS * DP);
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int key0 = warp * tr::KEYS_PER_WARP;
        const int mi = lane / 8, r = lane % 8;
        /* qk: s = q . k for 16 rows x this warp's 16 keys (2 n-tiles), four
         * k steps (chunks) per ldmatrix of K */
        float s[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
        for (int cg = 0; cg < DQK / 64; cg++) {
            uint32_t kb[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) ldmatrix_x4(kb[nt], ks + fp8_at<DP>(key0 + nt * 8 + r, 4 * cg + mi));
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int kk = 4 * cg + j;
                uint32_t a[4];
                ldmatrix_x4(a, qs + swz<DP>((mi % 2) * 8 + r, 2 * kk + mi / 2));
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const uint32_t b[2] = {cvt(kb[nt][j] & 0xffffu), cvt(kb[nt][j] >> 16)};
                    mma_16816<__half>(s[nt], a, b);
                }
            }
        }
        /* the raw dot of the real values: q's row factor times k_scale */
        const float rm[2] = {qm[lane / 4] * kmul, qm[lane / 4 + 8] * kmul};
        float tmax[2] = {-INFINITY, -INFINITY}, bad[2] = {0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = t0 + key0 + n * 8 + (lane % 4) * 2 + (e & 1);
                const bool seen = key < kv_end && key >= lo;
                s[n][e] *= rm[e / 2];
                if (seen) add_bad(bad[e / 2], s[n][e]); /* the NaN rule: the raw product (attn.cuh) */
                const float x = seen ? to_logit2(p, s[n][e]) : -INFINITY;
                s[n][e] = x;
                tmax[e / 2] = fmaxf(tmax[e / 2], x);
            }
        float f[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 1));
            tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 2));
            f[h] = fold_max(m[h], tmax[h]);
            d[h] = d[h] * f[h] + bad[h];
        }
        uint32_t pa[4];
#pragma unroll
        for (int n = 0; n < 2; n++) {
            const float p0 = exp2_masked(s[n][0], m[0]), p1 = exp2_masked(s[n][1], m[0]);
            const float p2 = exp2_masked(s[n][2], m[1]), p3 = exp2_masked(s[n][3], m[1]);
            d[0] += p0 + p1;
            d[1] += p2 + p3;
            pa[2 * n] = dtype_traits<__half>::pack(p0, p1);
            pa[2 * n + 1] = dtype_traits<__half>::pack(p2, p3);
        }
#pragma unroll
        for (int n = 0; n < DVO / 8; n++) {
            o[n][0] *= f[0];
            o[n][1] *= f[0];
            o[n][2] *= f[1];
            o[n][3] *= f[1];
        }
        /* pv: two chunks (four n tiles) of V per ldmatrix */
#pragma unroll
        for (int c = 0; c < DVO / 16; c += 2) {
            uint32_t vb[4];
            ldmatrix_x4_trans(vb, vs + fp8_at<DP>(key0 + (mi % 2) * 8 + r, c + mi / 2));
#pragma unroll
            for (int h = 0; h < 2; h++) {
                /* bytes (key 2t dim 2g, key 2t dim 2g+1, key 2t+1 dim 2g, key
                 * 2t+1 dim 2g+1) -> (dim 2g: keys 2t, 2t+1; dim 2g+1: the same) */
                const uint32_t x0 = __byte_perm(vb[2 * h], 0, 0x3120), x1 = __byte_perm(vb[2 * h + 1], 0, 0x3120);
                const uint32_t be[2] = {cvt(x0 & 0xffffu), cvt(x1 & 0xffffu)};
                const uint32_t bo[2] = {cvt(x0 >> 16), cvt(x1 >> 16)};
                mma_16816<__half>(o[2 * (c + h)], pa, be);
                mma_16816<__half>(o[2 * (c + h) + 1], pa, bo);
            }
        }
    }

    /* this warp's state of every row -> shared memory, dims in order */
    __device__ __forceinline__ void spill(const epi_smem &e)
    {
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int r0 = lane / 4;
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int n = 0; n < DVO / 8; n++) {
                add_bad(d[h], o[n][2 * h]);
                add_bad(d[h], o[n][2 * h + 1]);
            }
            d[h] += __shfl_xor_sync(0xffffffffu, d[h], 1);
            d[h] += __shfl_xor_sync(0xffffffffu, d[h], 2);
        }
        float *ow = e.o + warp * tr::ROWS * DVO;
#pragma unroll
        for (int c = 0; c < DVO / 16; c++) {
            const int col = 16 * c + 4 * (lane % 4);
            *(float4 *)(ow + r0 * DVO + col) = make_float4(o[2 * c][0], o[2 * c + 1][0], o[2 * c][1], o[2 * c + 1][1]);
            *(float4 *)(ow + (r0 + 8) * DVO + col) =
                make_float4(o[2 * c][2], o[2 * c + 1][2], o[2 * c][3], o[2 * c + 1][3]);
        }
        if (lane % 4 == 0) {
            e.m[warp * tr::ROWS + r0] = m[0];
            e.m[warp * tr::ROWS + r0 + 8] = m[1];
            e.d[warp * tr::ROWS + r0] = d[0];
            e.d[warp * tr::ROWS + r0 + 8] = d[1];
        }
    }
};

/* ---- the CUDA-core engine: G query heads, 16 keys per warp ------------------ */

template <int D, typename T, int G> struct cc_engine {
    typedef decode_traits<D, D> tr;
    static constexpr int DIMS_PER_LANE = D / 32; /* p.v: lane owns these output dims */
    float o[G][DIMS_PER_LANE];
    float m[G], d[G];

    __device__ __forceinline__ void init()
    {
#pragma unroll
        for (int g = 0; g < G; g++) {
            m[g] = -INFINITY;
            d[g] = 0.0f;
#pragma unroll
            for (int i = 0; i < DIMS_PER_LANE; i++) o[g][i] = 0.0f;
        }
    }

    /* q rows as f32 [G][D] */
    static __device__ __forceinline__ void load_q(const attn_params &p, int tok, int head0, int rows, void *qs_raw)
    {
        float *qs = (float *)qs_raw;
        for (int i = threadIdx.x; i < G * D; i += tr::THREADS) {
            const int row = i / D, c = i % D;
            qs[i] = row < rows ? dtype_traits<T>::to_float(
                                     ((const T *)p.q)[tok * p.q_stride_tok + (head0 + row) * p.q_stride_head + c])
                               : 0.0f;
        }
    }

    __device__ __forceinline__ void tile(const attn_params &p, const void *qs_raw, const T *ks, const T *vs,
                                         int t0, int lo, int kv_end, float /* kmul: 1, no fp8 here */)
    {
        const float *qs = (const float *)qs_raw;
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int key_local = lane % 16, half = lane / 16;
        const int row = warp * tr::KEYS_PER_WARP + key_local;
        /* qk: lane (key, half) takes half of the dims of one key, for every head */
        float acc[G];
#pragma unroll
        for (int g = 0; g < G; g++) acc[g] = 0.0f;
#pragma unroll
        for (int c = half * tr::CHUNKS / 2; c < (half + 1) * tr::CHUNKS / 2; c++) {
            const uint4 raw = *(const uint4 *)(ks + swz<D>(row, c)); /* DP = D */
            const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 k2 = dtype_traits<T>::unpack(w[j]);
#pragma unroll
                for (int g = 0; g < G; g++) {
                    const float2 q2 = *(const float2 *)(qs + g * D + c * 8 + 2 * j);
                    acc[g] = fmaf(q2.x, k2.x, fmaf(q2.y, k2.y, acc[g]));
                }
            }
        }
        const int key = t0 + row;
        const bool visible = key < kv_end && key >= lo;
        float pk[G], f[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            acc[g] += __shfl_xor_sync(0xffffffffu, acc[g], 16);
            const float s = visible ? to_logit2(p, acc[g]) : -INFINITY;
            const float bad = visible ? acc[g] * 0.0f : 0.0f; /* the NaN rule: the raw product */
            float tmax = s;
#pragma unroll
            for (int x = 1; x < 16; x *= 2) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, x));
            f[g] = fold_max(m[g], tmax);
            pk[g] = exp2_masked(s, m[g]);
            float psum = pk[g] + bad;
#pragma unroll
            for (int x = 1; x < 16; x *= 2) psum += __shfl_xor_sync(0xffffffffu, psum, x);
            d[g] = d[g] * f[g] + psum;
#pragma unroll
            for (int i = 0; i < DIMS_PER_LANE; i++) o[g][i] *= f[g];
        }
        /* pv: lane owns DIMS_PER_LANE output dims; p of key j comes from lane j */
        const int dim0 = lane * DIMS_PER_LANE;
#pragma unroll
        for (int j = 0; j < tr::KEYS_PER_WARP; j++) {
            const T *vrow = vs + swz<D>(warp * tr::KEYS_PER_WARP + j, dim0 / 8) + dim0 % 8;
            float v[DIMS_PER_LANE];
#pragma unroll
            for (int i = 0; i < DIMS_PER_LANE; i += 2) {
                const float2 v2 = dtype_traits<T>::unpack(*(const uint32_t *)(vrow + i));
                v[i] = v2.x;
                v[i + 1] = v2.y;
            }
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float pj = __shfl_sync(0xffffffffu, pk[g], j);
#pragma unroll
                for (int i = 0; i < DIMS_PER_LANE; i++) o[g][i] = fmaf(pj, v[i], o[g][i]);
            }
        }
    }

    __device__ __forceinline__ void spill(const epi_smem &e)
    {
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
        for (int g = 0; g < G; g++) {
            float *orow = e.o + (warp * tr::ROWS + g) * D + lane * DIMS_PER_LANE;
            float bad = 0.0f; /* the NaN rule: a non-finite o element makes its row NaN */
#pragma unroll
            for (int i = 0; i < DIMS_PER_LANE; i++) {
                orow[i] = o[g][i];
                add_bad(bad, o[g][i]);
            }
#pragma unroll
            for (int x = 1; x < 32; x *= 2) bad += __shfl_xor_sync(0xffffffffu, bad, x);
            if (lane == 0) {
                e.m[warp * tr::ROWS + g] = m[g];
                e.d[warp * tr::ROWS + g] = d[g] + bad;
            }
        }
    }
};

/* ---- the kernel --------------------------------------------------------------- */

template <int DQK, int DVO, typename T, typename ENGINE, bool FP8 = false>
__global__ void __launch_bounds__(decode_traits<DQK, DVO, FP8>::THREADS) decode_kernel(const attn_params p)
{
    typedef decode_traits<DQK, DVO, FP8> tr;
    typedef typename std::conditional<FP8, uint8_t, T>::type KV; /* a stage's element */
    constexpr int DP = tr::DP, OCHUNKS = DVO / 8;
    /* (no static __shared__ in this kernel: it would go before the stages
     * and move them off the 128-byte alignment their swizzle needs; 16
     * bytes of it cost up to 8%, BENCHMARKS.md) */
    extern __shared__ uint4 smem[];
    /* The plan's metadata first: plan() copied it before any kernel of the
     * step, and the grid never has more blocks than the plan has room for
     * items; q, K/V and the block table only after decode_grid_start (the
     * merge waits for this grid's completion before reading anything). */
    const int num_items = p.head->counts[COUNT_DECODE];
    const int32_t *table = p.head->kv_table;
    const decode_item first = p.items[blockIdx.x];
    /* the first tile's block ids too, where the table is the plan's copy:
     * their latency then overlaps the kernel before instead of preceding
     * the first K/V copy */
    const bool early =
        p.head->table_early && (int)blockIdx.x < num_items && first.req >= 0 && first.kv_end > first.kv_begin;
    const int kv_head = blockIdx.y / p.row_tiles, row_tile = blockIdx.y % p.row_tiles;
    const int head0 = kv_head * p.group + row_tile * tr::ROWS;
    const int rows = min(tr::ROWS, p.group - row_tile * tr::ROWS);
    /* this thread's fixed part of every K/V address: its head and chunk */
    const kv_lane lane_off = FP8 ? kv_lane_fp8<DP>(p, kv_head) : kv_lane_of<DP>(p, kv_head);
    KV *kv_stages = (KV *)smem;
    void *qs = (char *)smem + tr::KV_BYTES;
    kv_scales sc = {1.0f, 1.0f};
    if (FP8) sc = kv_scales_of(p, kv_head);
    /* the block ids of the next tile to copy, looked up one tile ahead */
    constexpr int CHUNKS = FP8 ? DP / 16 : DP / 8;
    tile_ids<CHUNKS, tr::TILE, tr::THREADS> ids;
    auto fetch = [&](int t0, const decode_item &it) {
        fetch_tile_ids<CHUNKS, tr::TILE, tr::THREADS>(p, table, it.page_base, t0, it.kv_end, ids);
    };
    if (early) fetch(first.kv_begin, first);
    decode_grid_start();
    /* keys [t0, t0 + TILE) into stage s, at the ids fetched for them */
    auto issue = [&](int s, int t0, const decode_item &it) {
        KV *ks = kv_stages + (2 * s) * tr::TILE * DP, *vs = kv_stages + (2 * s + 1) * tr::TILE * DP;
        if constexpr (FP8)
            load_kv_tile_fp8_ids<DQK, DVO, DP, tr::TILE, tr::THREADS>(p, ids, lane_off, t0, it.kv_end, ks, vs, it.lo);
        else
            load_kv_tile_ids<DQK, DVO, DP, tr::TILE, tr::THREADS, T>(p, ids, lane_off, t0, it.kv_end, ks, vs, it.lo);
    };
    for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
        const decode_item it = w == (int)blockIdx.x ? first : p.items[w];
        if (it.req < 0) continue; /* padding (defensive: plan() emits none) */
        const int tok = it.tok, lo = it.lo;
        __syncthreads(); /* the previous item's epilogue is done with shared memory */

        /* pipeline: STAGES - 1 tiles in flight ahead of the one computed; the
         * first tiles are issued before q is read, so the two latencies overlap */
        const int n_tiles = (it.kv_end - it.kv_begin + tr::TILE - 1) / tr::TILE;
#pragma unroll
        for (int s = 0; s < tr::STAGES - 1; s++) {
            if (s < n_tiles) {
                if (s > 0 || !early || w != (int)blockIdx.x) fetch(it.kv_begin + s * tr::TILE, it);
                issue(s, it.kv_begin + s * tr::TILE, it);
            }
            cp_async_commit();
        }
        if (tr::STAGES - 1 < n_tiles) fetch(it.kv_begin + (tr::STAGES - 1) * tr::TILE, it);
        ENGINE::load_q(p, tok, head0, rows, qs);
        ENGINE eng;
        eng.init();
        for (int t = 0; t < n_tiles; t++) {
            cp_async_wait<tr::STAGES - 2>();
            __syncthreads(); /* tile t landed; every warp is done with tile t - 1 */
            const int next = t + tr::STAGES - 1;
            if (next < n_tiles) {
                issue(next % tr::STAGES, it.kv_begin + next * tr::TILE, it);
                /* the ids' loads fly while this tile is computed */
                if (next + 1 < n_tiles) fetch(it.kv_begin + (next + 1) * tr::TILE, it);
            }
            cp_async_commit();
            const int s = t % tr::STAGES;
            eng.tile(p, qs, kv_stages + (2 * s) * tr::TILE * DP, kv_stages + (2 * s + 1) * tr::TILE * DP,
                     it.kv_begin + t * tr::TILE, lo, it.kv_end, sc.k);
        }
        cp_async_wait<0>();
        __syncthreads(); /* the stages become epilogue scratch */

        /* merge the warps' states row by row; write o and lse (or the partial) */
        const epi_smem e = epilogue_smem<DQK, DVO, FP8>(smem);
        eng.spill(e);
        __syncthreads();
        for (int i = threadIdx.x; i < rows * OCHUNKS; i += tr::THREADS) {
            const int row = i / OCHUNKS, c = i % OCHUNKS;
            float mx = -INFINITY;
#pragma unroll
            for (int w2 = 0; w2 < tr::WARPS; w2++) mx = fmaxf(mx, e.m[w2 * tr::ROWS + row]);
            float wsum = 0.0f, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
            for (int w2 = 0; w2 < tr::WARPS; w2++) {
                const float mw = e.m[w2 * tr::ROWS + row];
                const float f = mw == -INFINITY ? 0.0f : exp2f(mw - mx);
                wsum += f * e.d[w2 * tr::ROWS + row];
                const float *ow = e.o + (w2 * tr::ROWS + row) * DVO + c * 8;
#pragma unroll
                for (int j = 0; j < 8; j++) acc[j] += f * ow[j];
            }
            const int head = head0 + row;
            float inv, lse;
            if (FP8) v_scale_rule(sc.v, wsum);
            finish_row(p, head, it.out >= 0, mx, wsum, inv, lse);
            if (FP8) inv *= sc.v;
            if (it.out < 0) {
                uint32_t packed[4];
#pragma unroll
                for (int j = 0; j < 4; j++) packed[j] = dtype_traits<T>::pack(acc[2 * j] * inv, acc[2 * j + 1] * inv);
                *(uint4 *)((T *)p.o + tok * p.o_stride_tok + head * p.o_stride_head + c * 8) =
                    make_uint4(packed[0], packed[1], packed[2], packed[3]);
                if (p.lse && c == 0) p.lse[tok * p.lse_stride_tok + head] = lse;
            } else {
                float *dst = p.o_tmp + ((int64_t)it.out * p.num_qo_heads + head) * DVO + c * 8;
                *(float4 *)dst = make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
                *(float4 *)(dst + 4) = make_float4(acc[4] * inv, acc[5] * inv, acc[6] * inv, acc[7] * inv);
                if (c == 0) p.lse_tmp[(int64_t)it.out * p.num_qo_heads + head] = lse;
            }
        }
    }
}

/* ---- the kernel table ---------------------------------------------------------- */

template <int DQK, int DVO, typename T> struct tc_decode_info {
    static attn_kernel get()
    {
        const attn_kernel k = {decode_kernel<DQK, DVO, T, mma_engine<DQK, DVO, T> >, decode_traits<DQK, DVO>::THREADS,
                               decode_traits<DQK, DVO>::SMEM_BYTES, decode_traits<DQK, DVO>::ROWS};
        return k;
    }
};

template <int DQK, int DVO, typename T> struct tc_decode_fp8_info {
    static attn_kernel get()
    {
        typedef decode_traits<DQK, DVO, true> tr;
        const attn_kernel k = {decode_kernel<DQK, DVO, T, mma_fp8_engine<DQK, DVO, T>, true>, tr::THREADS,
                               tr::SMEM_BYTES, tr::ROWS};
        return k;
    }
};

template <int D, typename T> static attn_kernel cc_decode(void)
{
    const attn_kernel k = {decode_kernel<D, D, T, cc_engine<D, T, AK_DECODE_CC_MAX_GROUP> >,
                           decode_traits<D, D>::THREADS, decode_traits<D, D>::SMEM_BYTES, AK_DECODE_CC_MAX_GROUP};
    return k;
}

template <typename T> static attn_kernel cc_decode_of(int dqk, int dvo)
{
    const attn_kernel none = {NULL, 0, 0, 0};
    if (dqk != dvo) return none;
    switch (dqk) {
    case 64: return cc_decode<64, T>();
    case 128: return cc_decode<128, T>();
    case 256: return cc_decode<256, T>();
    }
    return none;
}

attn_kernel ak_cuda_decode_kernel(decode_engine engine, int dqk, int dvo, ak_dtype dtype, int fp8)
{
    const attn_kernel none = {NULL, 0, 0, 0};
    if (engine == DECODE_PORTABLE) return ak_cuda_portable_kernel(1, dqk, dvo, dtype, fp8);
    if (engine == DECODE_CUDA_CORES) {
        if (fp8) return none;
        return dtype == AK_BF16 ? cc_decode_of<__nv_bfloat16>(dqk, dvo) : cc_decode_of<__half>(dqk, dvo);
    }
    return fp8 ? kernel_table_fp8<tc_decode_fp8_info>(dqk, dvo, dtype) : kernel_table<tc_decode_info>(dqk, dvo, dtype);
}

ak_status ak_cuda_kernel_ptx_version(const attn_kernel *k, int *ptx)
{
    cudaFuncAttributes fa;
    AK_CUDA_TRY(cudaFuncGetAttributes(&fa, (const void *)k->fn));
    *ptx = fa.ptxVersion;
    return AK_OK;
}

ak_status ak_cuda_kernel_occupancy(const attn_kernel *k, int *ctas_per_sm)
{
    /* above 48 KB of dynamic shared memory a kernel must opt in, once */
    AK_CUDA_TRY(cudaFuncSetAttribute((const void *)k->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k->smem));
    AK_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, (const void *)k->fn, k->threads, k->smem));
    return AK_OK;
}
