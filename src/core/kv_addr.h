/*
 * kv_addr.h - how a K or V row is addressed (and an fp8 row scaled), the one definition for
 * ak_kv_update, the cpu backend and the CUDA engine (which hands the strides
 * to its kernels; cpu_ref keeps its own on purpose: it is the oracle).
 *
 * A row (block, slot, head) of head_dim elements starts at element
 *     block * strides.block + slot * strides.slot + head * strides.head
 * of its pool. Paged pools (ak_paged_kv): NHD blocks are [page_size,
 * num_kv_heads, head_dim], HND blocks [num_kv_heads, page_size, head_dim],
 * a block stride of 0 means packed. Ragged K/V [rows, num_kv_heads,
 * head_dim] are pages of one token: block = row, slot 0.
 */
#ifndef AK_KV_ADDR_H
#define AK_KV_ADDR_H

#include "attnkit.h"
#include "hostdev.h"

typedef struct ak_kv_strides {
    int64_t block, slot, head; /* elements */
} ak_kv_strides;

static inline ak_kv_strides ak_paged_strides(ak_kv_layout layout, int page_size, int num_kv_heads, int head_dim,
                                             int64_t block_stride)
{
    ak_kv_strides s;
    s.block = block_stride ? block_stride : (int64_t)page_size * num_kv_heads * head_dim;
    s.slot = layout == AK_LAYOUT_NHD ? (int64_t)num_kv_heads * head_dim : head_dim;
    s.head = layout == AK_LAYOUT_NHD ? head_dim : (int64_t)page_size * head_dim;
    return s;
}

/* The K and V pools of a paged view. */
static inline ak_kv_strides ak_paged_k_strides(const ak_paged_kv *kv)
{
    return ak_paged_strides(kv->layout, kv->page_size, kv->num_kv_heads, kv->head_dim_qk, kv->k_block_stride);
}
static inline ak_kv_strides ak_paged_v_strides(const ak_paged_kv *kv)
{
    return ak_paged_strides(kv->layout, kv->page_size, kv->num_kv_heads, kv->head_dim_vo, kv->v_block_stride);
}

/* Ragged K or V, [rows, num_kv_heads, head_dim] with any strides. */
static inline ak_kv_strides ak_ragged_strides(const ak_tensor *t)
{
    ak_kv_strides s;
    s.block = t->stride[0];
    s.slot = 0;
    s.head = t->stride[1];
    return s;
}

static inline int64_t ak_kv_offset(ak_kv_strides s, int64_t block, int slot, int head)
{
    return block * s.block + slot * s.slot + head * s.head;
}

/* The scale of KV head h's fp8 K or V (attnkit.h, ak_kv_scale_kind): 1
 * without scales. */
AK_HD float ak_kv_scale_at(int kind, const float *scale, int h)
{
    return kind == AK_KV_SCALE_PER_HEAD ? scale[h] : kind == AK_KV_SCALE_PER_LAYER ? scale[0] : 1.0f;
}

/* Finiteness marks (attnkit.h, ak_paged_kv.marks): a bit a slot, the
 * words of each (block, KV head) together, a block's heads in turn. The
 * words of one (block, head), and the word holding slot's bit (bit
 * slot % 32 of it). */
AK_HD int64_t ak_kv_mark_words_per_head(int page_size) { return page_size / 32 + (page_size % 32 != 0); }
AK_HD int64_t ak_kv_mark_word(int64_t block, int num_kv_heads, int head, int page_size, int slot)
{
    return (block * num_kv_heads + head) * ak_kv_mark_words_per_head(page_size) + slot / 32;
}

#endif /* AK_KV_ADDR_H */
