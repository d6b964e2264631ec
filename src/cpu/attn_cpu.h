/*
 * attn_cpu.h - what the cpu backend's driver (attn_cpu.c: plan, threads,
 * merge) and its per-ISA kernels (kernels_*.c, one body in
 * attn_cpu_kernel.h) share: one work item, the run context, the per-thread
 * scratch, and the kernel table.
 *
 * A work item is one tile of query tokens of one request, with all the query
 * heads of one KV head (a GQA group) -- or, for decode-sized requests, of all
 * KV heads -- against one chunk of that request's keys. Every K/V row of the
 * chunk is read once for the whole group. With MLA (one latent KV head) a
 * request of few tokens is one MLA item: all its tokens x all heads, each
 * latent row read once for all of them as K and V.
 */
#ifndef AK_ATTN_CPU_H
#define AK_ATTN_CPU_H

#include "internal.h"
#include "kv_addr.h"
#include "visible.h"

#include <stdint.h>

/* Keys per KV tile of a single-head item: the scores of a tile are a
 * [rows, AK_CPU_TILE_KEYS] block, and one converted K/V tile serves all the
 * item's rows. Prefill 2048 tokens, 128 rows, one thread, GFLOP/s f32 / bf16:
 * 32 keys 128/143, 64 keys 138/144, 128 keys 113/125. */
#define AK_CPU_TILE_KEYS 64
/* Keys per KV tile of the AMX path (bf16 prefill): the tile products are
 * fast enough that per-tile work (loading and storing O, row reductions)
 * weighs; llama3-8b prefill 2048 bf16, one thread: 64 keys 403-416 GFLOP/s,
 * 128 keys 418-438. */
#define AK_CPU_TILE_KEYS_AMX 128
/* The AMX softmax keeps each row's denominator as this many partial sums
 * (one AVX-512 vector), added up once per item instead of once per tile. */
#define AK_CPU_AMX_SUM_LANES 16
/* The largest of the tile sizes: scratch is sized for it. */
#define AK_CPU_TILE_KEYS_MAX 128
/* Keys per KV tile of an all-heads (decode) item: one page of 16 is 32 KB of
 * K and 32 KB of V for llama3-8b f16. Measured on the decode case (llama3-8b,
 * batch 8, 4096 keys, f16, 2 threads, 4 layers of cache with blocks in order,
 * fraction of a streaming read): tiles of 8 keys 0.49, 16 keys 0.72-0.76,
 * 24 keys 0.63, 32 keys 0.68, 64 keys 0.61. */
#define AK_CPU_TILE_KEYS_ALL_HEADS 16
/* MLA decode (cfg.mla: one latent row of 576 values a key, every query
 * head reading it): latent rows per tile of an MLA item (mla_run_tiles), a
 * multiple of 4 (QK blocks) and of 2 (bf16 key pairs). A tile of bf16 rows
 * is 18 KB at 16 keys, 36 KB at 32 (an L1 of 48 KB). Decode bf16 on the
 * development machine (AMD EPYC Zen 5, VDPBF16PS, 2 threads), ms, three
 * runs each: deepseek-v3-tp8 8 x 4096: 16 keys 2.11-2.13, 32 keys
 * 1.97-2.09; deepseek-v3 8 x 4096: 12.7-13.5 and 12.5-13.2. */
#define AK_CPU_MLA_TILE_KEYS 32
/* (the scratch's score rows, K pointers and prefetch lines are sized for
 * AK_CPU_TILE_KEYS keys a tile: alloc_scratch) */
_Static_assert(AK_CPU_MLA_TILE_KEYS <= AK_CPU_TILE_KEYS && AK_CPU_MLA_TILE_KEYS % 4 == 0,
               "an MLA tile fits the scratch and is whole QK blocks and bf16 key pairs");
/* Query rows (tokens x heads) of an MLA item at most: a request of up to
 * 128 / heads query tokens (decode, MTP, short verify; at least 1) is one
 * item over all its tokens, so each latent row is read once for all of
 * them; 128 rows keep O (256 KB f32) and Q in a core's L2. */
#define AK_CPU_MLA_ROWS 128
/* MLA items of at least this many rows run on the AMX tiles where the
 * kernel has them (bf16; amx_run_tiles, K/V tiles converted per item): the
 * 16-head decode items there streamed the latent rows at ~0.77 of the
 * streaming read (BENCHMARKS.md, 2026-11-26), while VDPBF16PS at 16 heads
 * was not timed on that CPU yet (AK_CPU_ISA=avx512bf16 forces it). */
#define AK_CPU_MLA_AMX_ROWS 16
/* Room after a tile's keys: QK blocks are AK_QK_NR (4) keys wide and vector
 * loops round up to 16 floats, so S rows and row-pointer lists get 16 more. */
#define AK_CPU_TILE_PAD 16

typedef struct ak_cpu_work {
    int32_t req;      /* request */
    int32_t kv_head;  /* first KV head g; query heads g * group .. (g + kv_heads) * group - 1 */
    int32_t kv_heads; /* KV heads of the item: 1, or all of them for decode-like tiles */
    int32_t q_begin;  /* first query token of the tile, counted within the request */
    int32_t q_count;  /* query tokens in the tile (rows = q_count * group * kv_heads) */
    int32_t kv_begin; /* keys [kv_begin, kv_end) of this chunk (each row sees its visible part) */
    int32_t kv_end;
    int32_t part;     /* -1: writes o and lse; >= 0: writes its partial state at pool rows part + m */
    int32_t mla;      /* 1: an MLA decode item (all its tokens x heads, mla_run_tiles) */
    int64_t cost;     /* plan's estimate in row x key units, orders the list */
} ak_cpu_work;

/* Part of the merge of a split item: rows [row_begin, row_end) of the
 * item's rows (m as in the kernel: (i * q_count + t) * group + h) from the
 * partial states of its num_parts chunks, at pool rows first_row + p * rows
 * + m (p = 0 .. num_parts - 1), into o and lse. A wide item (128 heads x 512
 * values a row) is several tasks, so that its merge spreads over the
 * threads. */
typedef struct ak_cpu_merge {
    int32_t req, kv_head, kv_heads, q_begin, q_count;
    int32_t first_row, num_parts, rows;
    int32_t row_begin, row_end;
} ak_cpu_merge;

/* Where plan() put request r's K/V in the packed pool of the AMX kernel:
 * key tiles [t0, t0 + tiles) of TILE_KEYS_AMX keys (tile t: keys from
 * t * TILE_KEYS_AMX) of each KV head g are pool tiles first + g * tiles +
 * (t - t0), each K then V in the B layouts of the tile unit. */
typedef struct ak_cpu_pack {
    int32_t first; /* -1: not packed, the items convert their tiles themselves */
    int32_t t0;
    int32_t tiles;
} ak_cpu_pack;

/* Everything one run() reads, flattened: config, plan, tensors, storage. */
typedef struct ak_cpu_ctx {
    int group;                    /* num_qo_heads / num_kv_heads */
    int head_dim_qk, head_dim_vo;
    int dqk_pad, dvo_pad;         /* head dims rounded up to the vector width */
    float sm_scale;
    float soft_cap;               /* 0: off */
    int causal, window_left;
    ak_dtype q_dtype, kv_dtype, o_dtype;
    int whole_k, whole_v;         /* head dim is whole vectors: rows readable in place */

    const int32_t *qo_indptr;     /* [num_reqs + 1] */
    const int32_t *kv_lens;       /* [num_reqs] */
    const int32_t *kv_indptr;     /* [num_reqs + 1]: paged in blocks, ragged in rows */
    const int32_t *kv_indices;    /* paged: block ids, request r's from its block kv_first_block[r] */
    const int32_t *kv_first_block; /* paged: [num_reqs] (NULL: 0), batch.c */

    /* K/V row (request r, key j, KV head g), kv_addr.h: paged, block b =
     * kv_indices[kv_indptr[r] + j / page_size - kv_first_block[r]], slot j %
     * page_size; ragged
     * (page_size = 0), block kv_indptr[r] + j, slot 0. */
    int page_size;
    const char *k_base, *v_base;
    ak_kv_strides k_addr, v_addr;
    int v_in_k;                   /* MLA: v_base, v_addr are K's (a value is the start of its K row) */
    /* fp8 K/V: the kernels read the unscaled values and fold the scales in
     * (KV head g's k scale into its q rows, its v scale into its o rows) */
    ak_kv_scale_kind kv_scale_kind;
    const float *k_scale, *v_scale; /* [1] or [num_kv_heads], or NULL */

    const char *q;                /* [num_tokens, num_qo_heads, head_dim_qk] */
    int64_t q_stride0, q_stride1;
    char *o;                      /* [num_tokens, num_qo_heads, head_dim_vo] */
    int64_t o_stride0, o_stride1;
    float *lse;                   /* [num_tokens, num_qo_heads] or NULL */
    int64_t lse_stride0, lse_stride1;

    const float *sinks;           /* [num_qo_heads] sink logits (cfg.use_sinks), or NULL */

    float *part_o;                /* [pool rows, dvo_pad] normalised partial outputs */
    float *part_lse;              /* [pool rows] */

    /* AMX kernel only (NULL otherwise) */
    const ak_cpu_pack *pack;      /* [num_reqs] */
    uint16_t *kv_pack;            /* [pool tiles, pack_tile_elems] packed K/V tiles */
    int64_t pack_tile_elems;      /* bf16 of a tile: dq32 * TILE_KEYS_AMX (K) + TILE_KEYS_AMX * dvo_pad (V) */
} ak_cpu_ctx;

/* One thread's working memory, carved at create() from one allocation. */
typedef struct ak_cpu_scratch {
    float *q;          /* [max_rows, dqk_pad] query rows, f32, pre-scaled by sm_scale */
    float *s;          /* [max_rows, s_stride] scores of a tile, then probabilities */
    int s_stride;      /* AK_CPU_TILE_KEYS_MAX + AK_CPU_TILE_PAD */
    float *o;          /* [max_rows, dvo_pad] unnormalised output accumulators */
    float *row_max;    /* [max_rows] running max m */
    float *row_sum;    /* [max_rows] running denominator d */
    float *k;          /* [dqk_pad, TILE_KEYS] keys of a tile as f32, transposed (when converted) */
    float *v;          /* [TILE_KEYS, dvo_pad] values of a tile as f32 (when converted) */
    const void **kp;   /* [TILE_KEYS + TILE_PAD] row pointers into k or the cache */
    const void **vp;   /* [TILE_KEYS + TILE_PAD] */
    const void **ktp;  /* [dqk_pad] rows of the transposed key tile: k + d * TILE_KEYS */
    const char **pf_lines; /* cache lines of the next tile to prefetch (in-place items) */
    float *zero_row;   /* [max(dqk_pad, dvo_pad)] zero bytes: the padding key in any dtype */
    int32_t *lo, *hi;  /* [max tile tokens] visible keys [lo, hi] of each token */
    int64_t *koff[2];  /* [TILE_KEYS + TILE_PAD] pool offsets of this tile's and the next */
    int64_t *voff[2];  /*   tile's keys (K, V), head 0 */
    /* MLA with bf16 q and K (kernels with AVX512-BF16 only, else NULL) */
    uint32_t *mla_p;   /* [max_rows, MLA_TILE_KEYS / 2] probabilities as pairs of bf16 (keys 2p, 2p + 1) */
    uint16_t *mla_v;   /* [MLA_TILE_KEYS / 2, 2 * dvo_pad] value tile, key pairs interleaved */
    /* AMX kernel only (NULL otherwise); rows rounded up to 32 in q, s, o too */
    uint16_t *amx_q;   /* [rows, dq32] raw bf16 query rows */
    uint32_t *amx_kt;  /* [dq32 / 2, TILE_KEYS_AMX] key tile, dim pairs transposed */
    uint16_t *amx_v;   /* [TILE_KEYS_AMX / 2, 2 * dvo_pad] value tile, key pairs interleaved */
    float *amx_d;      /* [rows, AMX_SUM_LANES] the running denominators d, lane by lane */
    uint16_t *amx_p;   /* [2, rows, TILE_KEYS_AMX] probabilities as bf16, then the remainder */
} ak_cpu_scratch;

typedef struct ak_cpu_kernels {
    const char *isa;   /* "avx512+amx", "avx512+bf16", "avx512", "avx2", "scalar" */
    int vec_width;     /* floats per vector: head dims are padded to a multiple */
    int in_place_rows; /* rows per KV head up to which K/V are read from the cache as is */
    int amx;           /* uses AMX tiles for bf16 prefill: needs the scratch's amx_* buffers */
    int bf16_dot;      /* AVX512-BF16 dot products for MLA with bf16 q and K: needs mla_p, mla_v */
    /* Computes one work item; writes o/lse or its partial slot. */
    void (*run_item)(const ak_cpu_ctx *ctx, const ak_cpu_work *w, const ak_cpu_scratch *scr);
    /* Merges one task of a split item's partial states into o and lse
     * (the thread's scr->o as the accumulator). */
    void (*merge)(const ak_cpu_ctx *ctx, const ak_cpu_merge *mg, const ak_cpu_scratch *scr);
    /* (AMX kernel only, else NULL) Packs key tile t of KV head g of request r
     * into ctx->kv_pack where ctx->pack[r] says. */
    void (*pack_tile)(const ak_cpu_ctx *ctx, int r, int g, int t, const ak_cpu_scratch *scr);
} ak_cpu_kernels;

extern const ak_cpu_kernels ak_cpu_kernels_scalar;
#if defined(__x86_64__) || defined(__i386__)
extern const ak_cpu_kernels ak_cpu_kernels_avx2;
extern const ak_cpu_kernels ak_cpu_kernels_avx512;
#if defined(AK_CPU_HAVE_AVX512_BF16)
extern const ak_cpu_kernels ak_cpu_kernels_avx512_bf16;
#endif
#if defined(AK_CPU_HAVE_AMX)
extern const ak_cpu_kernels ak_cpu_kernels_avx512_amx;
#endif
#endif

#endif /* AK_ATTN_CPU_H */
