/*
 * kv_update.cu - the KV-cache write: scatters each new token's K and V rows
 * to slot_mapping[token] in the paged pools. A pure byte copy (any 2- or
 * 4-byte dtype), 16-byte accesses when rows and strides allow, else 2-byte.
 * One thread block per token; capturable (no sync, no allocation).
 */
#include "../common.cuh"
#include "kv_addr.h"

/* Everything the kernel reads, by value. Strides in elements. */
struct kv_update_params {
    const char *k_src, *v_src;     /* [num_tokens, num_kv_heads, head_dim] */
    int64_t k_tok_stride, k_head_stride, v_tok_stride, v_head_stride;
    char *k_pool, *v_pool;
    ak_kv_strides k_addr, v_addr;  /* a row's place in the pools (kv_addr.h) */
    const int64_t *slot_mapping;   /* [num_tokens] */
    int64_t num_slots;             /* num_blocks * page_size */
    int page_size, num_kv_heads, head_dim_qk, head_dim_vo;
    int elem_bytes;
};

/* Copies one row of `row_bytes` in units of VEC. */
template <typename VEC>
__device__ __forceinline__ void copy_row(char *dst, const char *src, int row_bytes, int lane, int lanes)
{
    const int n = row_bytes / (int)sizeof(VEC);
    for (int i = lane; i < n; i += lanes)
        reinterpret_cast<VEC *>(dst)[i] = reinterpret_cast<const VEC *>(src)[i];
}

template <typename VEC>
__global__ void kv_update_kernel(kv_update_params p)
{
    const int token = blockIdx.x;
    const int64_t slot = p.slot_mapping[token];
    if (slot < 0 || slot >= p.num_slots) return; /* padding, or a bad slot: never write */
    const int64_t block = slot / p.page_size;
    const int off = (int)(slot % p.page_size);
    /* one warp per (head, K or V) row */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int row = warp; row < 2 * p.num_kv_heads; row += warps) {
        const int is_v = row >= p.num_kv_heads;
        const int h = is_v ? row - p.num_kv_heads : row;
        const int dim = is_v ? p.head_dim_vo : p.head_dim_qk;
        const ak_kv_strides a = is_v ? p.v_addr : p.k_addr;
        const int64_t dst_el = block * a.block + off * a.slot + h * a.head;
        const int64_t src_el = is_v ? token * p.v_tok_stride + h * p.v_head_stride
                                    : token * p.k_tok_stride + h * p.k_head_stride;
        char *dst = (is_v ? p.v_pool : p.k_pool) + dst_el * p.elem_bytes;
        const char *src = (is_v ? p.v_src : p.k_src) + src_el * p.elem_bytes;
        copy_row<VEC>(dst, src, dim * p.elem_bytes, lane, 32);
    }
}

static int aligned16(int64_t elems, int elem_bytes) { return (elems * elem_bytes) % 16 == 0; }

extern "C" ak_status ak_cuda_kv_update(const ak_paged_kv *kv, const ak_tensor *k, const ak_tensor *v,
                                       const int64_t *slot_mapping, int num_tokens, ak_stream stream)
{
    kv_update_params p;
    p.k_src = (const char *)k->data;
    p.v_src = (const char *)v->data;
    p.k_tok_stride = k->stride[0];
    p.k_head_stride = k->stride[1];
    p.v_tok_stride = v->stride[0];
    p.v_head_stride = v->stride[1];
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
    p.elem_bytes = (int)ak_dtype_size(kv->dtype);

    /* 16-byte path when every row start is 16-byte aligned */
    const int eb = p.elem_bytes;
    const int vec16 = ((uintptr_t)p.k_src % 16 == 0) && ((uintptr_t)p.v_src % 16 == 0) &&
                      ((uintptr_t)p.k_pool % 16 == 0) && ((uintptr_t)p.v_pool % 16 == 0) &&
                      aligned16(p.head_dim_qk, eb) && aligned16(p.head_dim_vo, eb) &&
                      aligned16(p.k_tok_stride, eb) && aligned16(p.k_head_stride, eb) &&
                      aligned16(p.v_tok_stride, eb) && aligned16(p.v_head_stride, eb) &&
                      aligned16(p.k_addr.block, eb) && aligned16(p.v_addr.block, eb);
    /* enough warps to cover the rows of a token, at most 8 */
    const int warps = 2 * kv->num_kv_heads < 8 ? 2 * kv->num_kv_heads : 8;
    cudaStream_t s = ak_cuda_stream(stream);
    if (vec16)
        kv_update_kernel<uint4><<<num_tokens, warps * 32, 0, s>>>(p);
    else
        kv_update_kernel<uint16_t><<<num_tokens, warps * 32, 0, s>>>(p);
    AK_CUDA_CHECK_LAUNCH();
    return AK_OK;
}
