/*
 * kv_update.cu - the KV-cache write: scatters each new token's K and V rows
 * to slot_mapping[token] in the paged pools. Rows of the pool's dtype are a
 * pure byte copy (any 1-, 2- or 4-byte dtype), 16-byte accesses when rows
 * and strides allow, else 2-byte (1-byte for fp8). Rows of f32/f16/bf16 into
 * an fp8 pool are quantized element by element with the view's scales, by
 * the host's own rule (ak_e4m3_quantize, dtype.h), so both devices store the
 * same bits. One thread block per token; capturable (no sync, no
 * allocation; the scales are read on the device when the kernel runs).
 * A K-only view (v_pool NULL, multi-head latent attention) has K rows only.
 */
#include "../common.cuh"
#include "dtype.h"
#include "kv_addr.h"

/* Everything the kernels read, by value. Strides in elements. */
struct kv_update_params {
    const char *k_src, *v_src;     /* [num_tokens, num_kv_heads, head_dim] */
    int64_t k_tok_stride, k_head_stride, v_tok_stride, v_head_stride;
    char *k_pool, *v_pool;         /* v_pool NULL: a K-only view (no v_src) */
    ak_kv_strides k_addr, v_addr;  /* a row's place in the pools (kv_addr.h) */
    const int64_t *slot_mapping;   /* [num_tokens] */
    int64_t num_slots;             /* num_blocks * page_size */
    int page_size, num_kv_heads, head_dim_qk, head_dim_vo;
    int rows;                      /* rows of a token: num_kv_heads K rows, then as many V rows
                                      (none for a K-only view) */
    int elem_bytes;                /* of the pool's dtype */
    int src_bytes;                 /* of k and v's dtype (= elem_bytes unless quantizing) */
    int scale_kind;                /* fp8: ak_kv_scale_kind */
    const float *k_scale, *v_scale; /* fp8: [1] or [num_kv_heads], or NULL */
    uint32_t *marks;               /* the finiteness marks (attnkit.h, kv_addr.h), or NULL */
    int dtype;                     /* the pool's (ak_dtype): what a non-finite element is */
};

/* Whether 32 bits of a row of dtype dt hold a NaN or an infinity: two f16 or
 * bf16 elements, an f32, four fp8 bytes (the NaN byte, S.1111.111). */
__device__ __forceinline__ bool word_bad(uint32_t x, int dt)
{
    switch (dt) {
    case AK_F16: return (x & 0x7c00u) == 0x7c00u || (x & 0x7c000000u) == 0x7c000000u;
    case AK_BF16: return (x & 0x7f80u) == 0x7f80u || (x & 0x7f800000u) == 0x7f800000u;
    case AK_FP8_E4M3: return __vcmpeq4(x & 0x7f7f7f7fu, 0x7f7f7f7fu) != 0;
    default: return (x & 0x7f800000u) == 0x7f800000u;
    }
}

/* The same of piece i of a row copied in units of VEC (16, 2 or 1 bytes;
 * the high bytes of a smaller piece are 0, never bad). A 2-byte piece of an
 * f32 row: the odd ones hold the exponents (the upper half, a bf16's bits). */
template <typename VEC> __device__ __forceinline__ bool piece_bad(VEC x, int dt, int i);
template <> __device__ __forceinline__ bool piece_bad<uint4>(uint4 x, int dt, int)
{
    return word_bad(x.x, dt) || word_bad(x.y, dt) || word_bad(x.z, dt) || word_bad(x.w, dt);
}
template <> __device__ __forceinline__ bool piece_bad<uint16_t>(uint16_t x, int dt, int i)
{
    if (dt == AK_F32) return i % 2 && word_bad(x, AK_BF16);
    return word_bad(x, dt);
}
template <> __device__ __forceinline__ bool piece_bad<uint8_t>(uint8_t x, int dt, int) { return word_bad(x, dt); }

/* A token's rows, each by row_fn(row) (row: a K row, num_kv_heads + h: V's;
 * returns whether this lane copied a NaN or an infinity): a warp a row
 * without marks; with them a warp a head, its K and V rows in turn, so that
 * the warp alone knows the slot's mark and one lane sets or clears its bit
 * (measured, H200, 32/8 heads, 16 x 1024 tokens: the kernel 64 us without
 * marks; 72-74 us with a warp a row, the heads' findings meeting in shared
 * memory between two block barriers). */
template <typename F>
__device__ __forceinline__ void for_rows(const kv_update_params &p, int64_t block, int off, F row_fn)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    if (!p.marks) {
        for (int row = warp; row < p.rows; row += warps) row_fn(row);
        return;
    }
    for (int h = warp; h < p.num_kv_heads; h += warps) {
        bool b = row_fn(h);
        if (p.rows > p.num_kv_heads) b |= row_fn(p.num_kv_heads + h);
        b = __any_sync(0xffffffffu, b);
        if (lane == 0) {
            uint32_t *w = p.marks + ak_kv_mark_word(block, p.num_kv_heads, h, p.page_size, off);
            const uint32_t bit = 1u << (off % 32);
            if (b) atomicOr(w, bit);
            else atomicAnd(w, ~bit);
        }
    }
}

/* Row `row` of a token's 2 * num_kv_heads rows (K rows, then V rows): where
 * it comes from and goes to, in elements of its own buffer. */
struct kv_row {
    int is_v, head, dim;
    int64_t src_el, dst_el;
};

__device__ __forceinline__ kv_row row_at(const kv_update_params &p, int token, int64_t block, int off, int row)
{
    kv_row r;
    r.is_v = row >= p.num_kv_heads;
    r.head = r.is_v ? row - p.num_kv_heads : row;
    r.dim = r.is_v ? p.head_dim_vo : p.head_dim_qk;
    const ak_kv_strides a = r.is_v ? p.v_addr : p.k_addr;
    r.dst_el = block * a.block + off * a.slot + r.head * a.head;
    r.src_el = r.is_v ? token * p.v_tok_stride + r.head * p.v_head_stride
                      : token * p.k_tok_stride + r.head * p.k_head_stride;
    return r;
}

/* Copies one row of `row_bytes` in units of VEC; returns whether this
 * lane's pieces hold a NaN or an infinity of dtype dt (-1: not asked). */
template <typename VEC>
__device__ __forceinline__ bool copy_row(char *dst, const char *src, int row_bytes, int lane, int lanes, int dt)
{
    const int n = row_bytes / (int)sizeof(VEC);
    bool bad = false;
    for (int i = lane; i < n; i += lanes) {
        const VEC x = reinterpret_cast<const VEC *>(src)[i];
        reinterpret_cast<VEC *>(dst)[i] = x;
        if (dt >= 0) bad |= piece_bad<VEC>(x, dt, i);
    }
    return bad;
}

template <typename VEC>
__global__ void kv_update_kernel(kv_update_params p)
{
    const int token = blockIdx.x;
    const int64_t slot = p.slot_mapping[token];
    if (slot < 0 || slot >= p.num_slots) return; /* padding, or a bad slot: never write */
    const int64_t block = slot / p.page_size;
    const int off = (int)(slot % p.page_size);
    const int lane = threadIdx.x % 32;
    for_rows(p, block, off, [&](int row) {
        const kv_row r = row_at(p, token, block, off, row);
        char *dst = (r.is_v ? p.v_pool : p.k_pool) + r.dst_el * p.elem_bytes;
        const char *src = (r.is_v ? p.v_src : p.k_src) + r.src_el * p.elem_bytes;
        return copy_row<VEC>(dst, src, r.dim * p.elem_bytes, lane, 32, p.marks ? p.dtype : -1);
    });
}

/* Element d of a source row of dtype SRC (AK_F32, AK_F16 or AK_BF16) as f32. */
template <int SRC>
__device__ __forceinline__ float src_at(const char *row, int d)
{
    if (SRC == AK_F16) return ak_f16_to_f32(reinterpret_cast<const uint16_t *>(row)[d]);
    if (SRC == AK_BF16) return ak_bf16_to_f32(reinterpret_cast<const uint16_t *>(row)[d]);
    return reinterpret_cast<const float *>(row)[d];
}

/* fp8 pools: each element of a row quantized with its head's scale. */
template <int SRC>
__global__ void kv_quantize_kernel(kv_update_params p)
{
    const int token = blockIdx.x;
    const int64_t slot = p.slot_mapping[token];
    if (slot < 0 || slot >= p.num_slots) return; /* padding, or a bad slot: never write */
    const int64_t block = slot / p.page_size;
    const int off = (int)(slot % p.page_size);
    const int lane = threadIdx.x % 32;
    for_rows(p, block, off, [&](int row) {
        const kv_row r = row_at(p, token, block, off, row);
        const float scale = ak_kv_scale_at(p.scale_kind, r.is_v ? p.v_scale : p.k_scale, r.head);
        uint8_t *dst = reinterpret_cast<uint8_t *>(r.is_v ? p.v_pool : p.k_pool) + r.dst_el;
        const char *src = (r.is_v ? p.v_src : p.k_src) + r.src_el * p.src_bytes;
        bool b = false;
        for (int d = lane; d < r.dim; d += 32) {
            const uint8_t x = ak_e4m3_quantize(src_at<SRC>(src, d), scale);
            dst[d] = x;
            b |= (x & 0x7f) == 0x7f; /* (the NaN byte) */
        }
        return b;
    });
}

static int aligned16(int64_t elems, int elem_bytes) { return (elems * elem_bytes) % 16 == 0; }

extern "C" ak_status ak_cuda_kv_update(const ak_paged_kv *kv, const ak_tensor *k, const ak_tensor *v,
                                       const int64_t *slot_mapping, int num_tokens, ak_stream stream)
{
    kv_update_params p;
    /* a K-only view (the core checked that v is NULL then): V's fields stay 0 */
    const int has_v = kv->v_data != NULL;
    p.k_src = (const char *)k->data;
    p.v_src = has_v ? (const char *)v->data : NULL;
    p.k_tok_stride = k->stride[0];
    p.k_head_stride = k->stride[1];
    p.v_tok_stride = has_v ? v->stride[0] : 0;
    p.v_head_stride = has_v ? v->stride[1] : 0;
    p.k_pool = (char *)kv->k_data;
    p.v_pool = (char *)kv->v_data;
    p.k_addr = ak_paged_k_strides(kv);
    p.v_addr = ak_paged_v_strides(kv);
    p.slot_mapping = slot_mapping;
    p.num_slots = (int64_t)kv->num_blocks * kv->page_size;
    p.page_size = kv->page_size;
    p.num_kv_heads = kv->num_kv_heads;
    p.head_dim_qk = kv->head_dim_qk;
    p.head_dim_vo = kv->head_dim_vo;
    p.rows = (1 + has_v) * kv->num_kv_heads;
    p.elem_bytes = (int)ak_dtype_size(kv->dtype);
    p.src_bytes = (int)ak_dtype_size(k->dtype);
    p.scale_kind = (int)kv->scale_kind;
    p.k_scale = kv->k_scale;
    p.v_scale = kv->v_scale;
    p.marks = kv->marks;
    p.dtype = (int)kv->dtype;
    /* enough warps to cover the rows of a token (with marks, its heads), at most 8 */
    const int units = kv->marks ? p.num_kv_heads : p.rows;
    const int warps = units < 8 ? units : 8;
    cudaStream_t s = ak_cuda_stream(stream);
    if (k->dtype != kv->dtype) {
        /* the core allows f32 / f16 / bf16 rows into fp8 pools only */
        switch (k->dtype) {
        case AK_F16: kv_quantize_kernel<AK_F16><<<num_tokens, warps * 32, 0, s>>>(p); break;
        case AK_BF16: kv_quantize_kernel<AK_BF16><<<num_tokens, warps * 32, 0, s>>>(p); break;
        default: kv_quantize_kernel<AK_F32><<<num_tokens, warps * 32, 0, s>>>(p); break;
        }
        AK_CUDA_CHECK_LAUNCH();
        return AK_OK;
    }

    /* 16-byte path when every row start is 16-byte aligned */
    const int eb = p.elem_bytes;
    const int vec16 = ((uintptr_t)p.k_src % 16 == 0) && ((uintptr_t)p.v_src % 16 == 0) &&
                      ((uintptr_t)p.k_pool % 16 == 0) && ((uintptr_t)p.v_pool % 16 == 0) &&
                      aligned16(p.head_dim_qk, eb) && aligned16(p.head_dim_vo, eb) &&
                      aligned16(p.k_tok_stride, eb) && aligned16(p.k_head_stride, eb) &&
                      aligned16(p.v_tok_stride, eb) && aligned16(p.v_head_stride, eb) &&
                      aligned16(p.k_addr.block, eb) && aligned16(p.v_addr.block, eb);
    if (vec16)
        kv_update_kernel<uint4><<<num_tokens, warps * 32, 0, s>>>(p);
    else if (eb >= 2)
        kv_update_kernel<uint16_t><<<num_tokens, warps * 32, 0, s>>>(p);
    else
        kv_update_kernel<uint8_t><<<num_tokens, warps * 32, 0, s>>>(p);
    AK_CUDA_CHECK_LAUNCH();
    return AK_OK;
}
