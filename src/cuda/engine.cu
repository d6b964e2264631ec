/*
 * engine.cu - the planner and launcher of the CUDA attention kernels, which
 * cuda_paged (backend_paged.cu) and cuda_varlen (backend_varlen.cu) are in
 * two modes (engine.cuh). K/V come from a paged cache (block table) or from
 * contiguous rows [sum kv_len, num_kv_heads, head_dim] (kv_indptr in
 * tokens): the same plan, the same kernels, only the loader's addressing
 * differs (attn.cuh).
 *
 * plan() (host only, on a batch the core validated and turned into metadata
 * in this engine's pinned staging) builds three work lists:
 *   decode items for the requests with one query token (decode.cu): each
 *     request's visible keys split into chunks so that small batches with
 *     long contexts still fill every SM;
 *   prefill items for the others (prefill.cu, prefill_wgmma.cu): tiles of
 *     query rows, request by request, each request's heaviest first, dealt
 *     to the blocks by their load so far, and split along the keys where
 *     one tile would dominate the wave;
 *   merge tasks for every query token whose keys were split (merge.cu);
 *   scan tasks for the long prefill requests (scan.cu: the NaN rule's pass
 *     over their K/V, which lets the prefill kernel skip its checks
 *     for a request whose inputs are all finite).
 * In varlen mode every request is prefill items and nothing is split.
 * It copies them from pinned staging into static device buffers with
 * asynchronous copies, and never waits on the device, except to reuse a
 * staging buffer whose copy from two plans ago has not yet run.
 * run() (device): the scan pass, decode, prefill (overlapping decode's tail as its
 * programmatic dependent on sm_90), merge. Every grid is fixed at create()
 * and every kernel reads its list's length from device memory, so run() is
 * capturable and a capture replays after any later plan() within the limits:
 * graph support ALWAYS.
 */
#include "engine.cuh"

#include "kv_addr.h"
#include "visible.h"

#include <algorithm>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Default cap on chunks per split when limits.max_splits is 0, and the hard
 * cap (the merge keeps one weight per chunk in shared memory). */
#define DEFAULT_MAX_SPLITS 64
#define MAX_SPLITS_CAP 4096
/* Keys per chunk are a multiple of the kernels' tiles (64 keys). */
#define CHUNK_QUANTUM 64
/* A prefill item is split only into chunks of at least this many keys: below
 * it the merge costs more than the parallelism gains. */
#define MIN_PREFILL_CHUNK 512
/* Prefill chunks are multiples of the wgmma prefill's largest key tile, so a
 * chunk's tiles start on TMA box boundaries (prefill_wgmma.cu). */
#define PREFILL_CHUNK_ALIGN 128
#define NUM_STAGING 2
/* plan() cuts the tiles of a prefill list's last round over their keys
 * when the round holds at most 1 / TAIL_SPLIT_FRACTION of the blocks */
#define TAIL_SPLIT_FRACTION 8
/* plan() orders a round of prefill items, and the blocks, by counting when
 * their costs (loads) lie within this many times the grid of each other */
#define PF_COUNT_SPREAD 4
/* Extra rounds of decode items balance_chunk weighs for a batch larger than
 * the wave. */
#define BALANCE_ROUNDS 4
/* Merge thread blocks per SM (one per query head and task). */
#define MERGE_CTAS_PER_SM 8
/* The scan pass over K/V rows (scan.cu) serves prefill requests of at least SCAN_MIN_ROWS
 * query rows (q_len x group): the checks it saves cost about 9% of a
 * compute-bound prefill and more of a short one (the V scan of every
 * item's diagonal tile), its reads about 240 / rows of a causal one at full
 * speed (an H100: K/V bytes at copy speed against the FLOPs of the rows).
 * Measured (H200, bf16, 2048 against 4096, same run): 64 x 512 d128 (page
 * 128) 0.863 of the time, 32 x 512 d64 (page 128) 0.833, 4 chunks of 512
 * tokens on 4096 keys (page 64) 0.927 (BENCHMARKS.md). A request's keys
 * go in at most SCAN_TASKS_PER_REQ tasks, each of at least the keys a scan
 * block reads at once (ak_cuda_scan_task_keys: 64 at head dims 80-128 in
 * 16 bits, 128 at 64): a few long requests fill more of the GPU. Measured
 * (H200, bf16, page 128, the step against the scan kernel before
 * (scan.cu) in tasks of 256 keys or more): qwen2.5-7b 1 x 4096 0.990 of the
 * time, 32/8 heads d64 32 x 512 0.974, fp8 K/V 16 x 1024 0.989, 16 x 1024
 * 1.002, d256 4 x 4096 1.005; the pass itself is slower at 16 x 1024 and
 * 64 x 512, where its reads bind it (BENCHMARKS.md). */
#define SCAN_MIN_ROWS 2048
#define SCAN_TASKS_PER_REQ 64
static_assert(SCAN_TASKS_PER_REQ <= 8 * PASS_MASK_GROUPS, "attn.cuh's pass_mask tests a request's flags in PASS_MASK_GROUPS groups of 8");
/* With the pools' finiteness marks (ak_paged_kv.marks) the pass reads a bit
 * a key, about 5 us whatever the keys (H200, BENCHMARKS.md), so the shorter
 * requests are worth it too: each plan gives them tasks of their own, after
 * the long requests' (plan_head.scan_long); a run with marks scans them,
 * one without scans only those whose rows are worth a read of their K/V
 * rows (SCAN_ROWS_KEYS, below) and runs the others' items checked. In a step with
 * decodes, whose kernel the pass goes before, only when the shorter
 * requests' work (2 x (head_dim_qk + head_dim_vo) FLOP a query row and key
 * it sees, summed) reaches SCAN_SHORT_MIN_FLOP. AK_CUDA_SCAN_SHORT=1 gives
 * them tasks in every plan, 0 in none (to compare, or to test the path on
 * small batches). Measured (H200, bf16, 32/8 heads d128 unless named, with
 * marks, their tasks against none): 1 x 32 0.784 of the time, 1 x 128
 * 0.889, 4 x 256 0.813, 64 x 256 0.747, 128 x 128 0.719, phi3-mini (32/32
 * heads, d96) 16 x 1024 0.820, 4 chunks of 256 on 4096 keys 0.855, 32 x 4
 * verified tokens on 4096 keys 0.902; beside 62 decodes, 2 chunks of 16 on
 * 2048 keys (1.1 GFLOP) 1.008, of 64 (4.3 GFLOP) 1.000, of 256 0.991-0.995;
 * gpt-oss-20b (window 128) 8 x 256 1.002-1.011 (BENCHMARKS.md). */
#define SCAN_SHORT_MIN_FLOP 2e9
/* A run without marks scans a shorter request's K/V rows too where its rows
 * times SCAN_ROWS_KEYS reach the keys its tokens see (a prompt, or a chunk
 * of 1,024 rows on 4,096 keys; not a few verified tokens on a long
 * context, whose keys the pass would read for little work), in a plan where
 * such requests' work reaches SCAN_ROWS_MIN_FLOP (with decodes,
 * SCAN_SHORT_MIN_FLOP) and the kernel runs the clean items itself (not at
 * DP 256, whose clean items take a second kernel: gemma2-9b 16 x 256 1.034
 * of the time). A short item's checks cost more than the pass's read of its
 * keys: the V scan and the consumers' barrier at its diagonal tile, which
 * most of its tiles are. Measured (H200, bf16, every shorter request's
 * rows scanned against none, two rounds): 16 x 256 0.797 of the time, 64 x
 * 256 0.789, 128 x 128 0.788, 32 x 384 (page 16) 0.829, 4 x 256 0.973,
 * qwen2.5-7b 16 x 256 0.779, d64 32 x 256 0.778, phi3-mini (32/32 heads,
 * d96, page 16) 16 x 1024 0.946 and 4 x 1024 0.971, extend (chunks of 256
 * on 4096 keys) 0.978, 16 prompts of 45-700 tokens 0.824; below the work
 * floor, 1 x 128 1.061 and 16 x 64 1.081; verify (4 tokens on 4096 keys)
 * 1.791 (BENCHMARKS.md). AK_CUDA_SCAN_SHORT_ROWS=1 scans every shorter
 * request's rows in every plan, 0 none. */
#define SCAN_ROWS_KEYS 4
#define SCAN_ROWS_MIN_FLOP 1e9
/* The requests a plan can give scan tasks (then SCAN_TASKS_PER_REQ each at most) */
#define MAX_SCAN_REQS 65536

/* Metadata of one plan, host or device. The device part is what the kernels
 * read; the head, the request arrays and the decode items are contiguous so
 * one copy moves them. */
struct plan_meta {
    plan_head *head;       /* work-list lengths, the block table */
    int32_t *req_qo;       /* [max_reqs + 1] qo_indptr, and */
    int32_t *req_kv;       /* [max_reqs] kv_lens: a device table's slot mapping reads them (table.cu) */
    decode_item *items;    /* [max_items] */
    merge_task *tasks;     /* [max_tasks] */
    prefill_item *pitems;  /* [max_pitems] */
    scan_task *scans;      /* [max_scans] */
    int32_t *kv_indices;   /* [max_reqs * max_blocks_per_req] */
    int64_t *slot_mapping; /* [max_tokens] */
    int32_t *qo_indptr;    /* [max_reqs + 1], host only */
    int32_t *kv_indptr;    /* [max_reqs + 1], host only: the items carry page_base */
};

struct staging {
    char *host; /* pinned */
    plan_meta m;
    cudaEvent_t copied; /* recorded after this buffer's copies were enqueued */
    int in_flight;
};

/* A query token the decode kernel serves, and its visible keys [lo, end). */
struct decode_unit {
    int req, tok, lo, end;
    int ntok; /* query tokens tok, tok + 1, ... (mla_pack) */
    int end0; /* the end of the first one's keys (end: the last one's) */
};

/* A prefill tile before ordering: its item, its cost in key tiles, and its
 * request's (plan_prefill deals the tiles request by request). */
struct pf_tile {
    prefill_item it;
    int cost;
    int req;      /* its request */
    int req_max;  /* the cost of its request's heaviest tile (before splits) */
};

struct engine_state {
    ak_attn_config cfg;
    ak_limits lim;
    engine_mode mode;
    int ragged;       /* K/V are contiguous rows: no block ids, no slot mapping */
    int split;        /* decode kernel for q_len 1, split-KV and merges (cuda_paged, cuda_mla) */
    int all_decode;   /* every query token is a decode unit (cuda_mla), not only q_len 1 requests */
    int max_units;    /* decode units a plan may hold */
    int64_t max_indices; /* block ids a plan may hold (0 when ragged) */
    int max_slots;    /* slot-mapping entries (0 when ragged) */
    decode_engine engine;
    attn_kernel dec_k, pre_k, merge_k; /* the kernels run() launches (fn NULL: none) */
    attn_kernel pre_clean_k;           /* wgmma at DP 256: the clean items' pass, launched before pre_k
                                          (its checked pass), where the scan pass runs; else fn NULL */
    int mla_pack;     /* MLA on mla_wgmma.cu with no window: up to this many query tokens of a request
                         share an item (rows = tokens x heads <= the kernel's 64), so the latent rows
                         are read once for them all; 1 elsewhere, or under AK_CUDA_MLA_PACK=0 */
    int plan_packed;  /* the last plan_decode made an item of several tokens */
    int plan_tokens;  /* its tokens an MLA item (plan_pack) */
    int mla_tma;      /* run() encodes the K pool's TMA map for dec_k (mla_wgmma.cu's takes one),
                         unless AK_CUDA_MLA_TMA=0 (it then copies with cp.async alone) */
    int pre_tma;      /* run() encodes the K and V pools' TMA maps and q's for pre_k (prefill_wgmma.cu's
                         takes them), unless AK_CUDA_PREFILL_TMA=0 (cp.async alone) */
    int pre_page_boxes; /* pages of 16n keys by TMA too (boxes of 32 or 16 rows), unless
                         AK_CUDA_PREFILL_TMA_SMALL=0 */
    int vec;          /* the kernels read 16-byte chunks: q, o and K/V rows must be 16-byte aligned */
    int fp8;          /* K/V in fp8 e4m3 (q and o 16-bit) */
    int kv_vec, kv_epc; /* K/V rows of whole 16-byte chunks (kv_epc elements each) */
    int pdl;          /* sm_90+: programmatic dependent launches */
    int row_tiles;    /* decode: row tiles per KV head (tensor cores: 16 heads a tile, group > 16) */
    int invariant_chunk; /* batch-invariant: keys of every decode split (0: splits follow the batch) */
    int decode_ctas;  /* decode grid.x: one wave of the GPU (0: no decode kernel) */
    int max_splits;   /* chunks of a prefill row, and of a decode unit in batch-invariant mode */
    int dec_splits;   /* chunks of a decode unit: limits.max_splits, or by default DEFAULT_MAX_SPLITS,
                         or the wave where the merge has narrow slices (a unit or two alone) */
    int max_items;    /* decode items */
    int max_partials; /* partial-state slots of decode splits (the f32 rows the merge reads) */
    /* prefill (workload ANY, or every request in varlen mode) */
    int prefill;      /* this instance launches the prefill kernel */
    int min_prefill_q; /* requests with at least this many query tokens go to prefill */
    int prefill_ctas; /* prefill grid (1-D): one wave */
    prefill_family pfam; /* which prefill kernel */
    int prow_tiles, prow_heads, ptok; /* row tiles per KV head, heads per tile, tokens per tile */
    int prow_seg;                     /* rows of a segment of whole tokens (prefill_rows) */
    int max_ptiles;   /* tiles of a plan (before they are dealt a row each) */
    int max_pitems;   /* items: every tile once a row, and the last round's padding */
    attn_kernel scan_k;  /* the NaN rule's scan pass (fn NULL: every prefill item runs checked) */
    int max_scans, scan_ctas, scan_keys; /* (scan_keys: a task's fewest keys) */
    int scan_short; /* the shorter requests' tasks: -1 by their work (SCAN_SHORT_MIN_FLOP), 0 never, 1 always
                       (AK_CUDA_SCAN_SHORT) */
    int scan_rows;  /* 1: a run without marks can have scan work (long requests, or the shorter ones' rows) */
    int scan_short_rows; /* the shorter requests' tasks scanned from K/V rows without marks: -1 by the rule
                            (rows_worth_rows, SCAN_ROWS_MIN_FLOP), 0 never, 1 always (AK_CUDA_SCAN_SHORT_ROWS) */
    int32_t *scan_flags; /* device [max_scans][num_kv_heads] */
    /* The scan pass beside the clean prefill pass (attn_params.scan_beside)
     * on this many SMs, or 0: before it (AK_CUDA_SCAN_BESIDE); fewer than
     * the KV heads: before it too (a block a head at least) */
    int scan_beside;
    attn_kernel scan_beside_k, pre_queue_k; /* (the scan pass and the clean pass, beside) */
    int *item_queue; /* device [2]: the clean pass's queue (attn_params.item_queue) */
    int pf_slots;     /* partial slots reserved for prefill splits */
    int max_tasks;
    int merge_ctas;
    int merge_splits; /* the most partials of a merge task (its weights in shared memory) */
    int narrow_tasks; /* plans with fewer merge tasks merge in narrow slices (plan_head.merge_narrow) */
    size_t fixed_bytes; /* bytes from the head to the end of the decode items */
    char *dev;          /* one device allocation: metadata, then partials */
    plan_meta d;
    float *o_tmp, *lse_tmp;
    staging stg[NUM_STAGING];
    int next_stg;
    pf_tile *tiles;   /* [max_ptiles] host scratch of plan() */
    int64_t *pf_load; /* [prefill_ctas] host scratch of plan(): each block's cost so far */
    uint64_t *pf_keys; /* [4 x prefill_ctas] host scratch of plan(): a round's keys, the blocks', the round's tiles, a copy */
    int *pf_count;     /* [PF_COUNT_SPREAD x prefill_ctas + 2] host scratch of plan(): order_keys's counts */
    int32_t *first_block; /* [max_reqs] host scratch: each request's first visible block */
    decode_unit *units;   /* [max_units] host scratch of plan() */
    /* the current plan */
    int num_items, num_pitems, num_tasks, num_scans;
    int num_long_scans; /* the first num_scans a run without marks scans (plan_head.scan_long) */
    int slot_hw; /* device slot_mapping entries past it are -1 */
    const int32_t *plan_table;    /* the device block table of the plan being made (NULL: none) */
    const int32_t *checked_table; /* the last device block table whose memory plan() checked */
};

/* Lays out a metadata block (host or device) starting at base; returns its
 * total size. */
static size_t layout_meta(const engine_state *s, char *base, plan_meta *m, size_t *fixed)
{
    const ak_limits *lim = &s->lim;
    size_t off = 0;
#define AK_CARVE_(field, type, count)                                          \
    do {                                                                       \
        off = (off + 15) / 16 * 16;                                            \
        if (m) m->field = (type *)(base + off);                                \
        off += sizeof(type) * (size_t)(count);                                 \
    } while (0)
    AK_CARVE_(head, plan_head, 1);
    AK_CARVE_(req_qo, int32_t, (size_t)lim->max_reqs + 1);
    AK_CARVE_(req_kv, int32_t, lim->max_reqs);
    AK_CARVE_(items, decode_item, s->max_items);
    *fixed = off;
    AK_CARVE_(tasks, merge_task, s->max_tasks);
    AK_CARVE_(pitems, prefill_item, s->max_pitems);
    AK_CARVE_(scans, scan_task, s->max_scans);
    AK_CARVE_(kv_indices, int32_t, s->max_indices);
    AK_CARVE_(slot_mapping, int64_t, s->max_slots);
    AK_CARVE_(qo_indptr, int32_t, (size_t)lim->max_reqs + 1);
    AK_CARVE_(kv_indptr, int32_t, (size_t)lim->max_reqs + 1);
#undef AK_CARVE_
    return (off + 255) / 256 * 256;
}

/* ---- check and explain ------------------------------------------------------- */

/* 1 if the tensor-core kernels are compiled for the pair (AK_TC_HEAD_DIMS;
 * with fp8 K/V, AK_TC_FP8_HEAD_DIMS). */
static int tc_pair(const ak_attn_config *cfg)
{
    const int dqk = cfg->head_dim_qk, dvo = cfg->head_dim_vo;
#define AK_PAIR_IS_(QK, VO) if (dqk == QK && dvo == VO) return 1;
    if (cfg->kv_dtype == AK_FP8_E4M3) {
        AK_TC_FP8_HEAD_DIMS(AK_PAIR_IS_)
        return 0;
    }
    AK_TC_HEAD_DIMS(AK_PAIR_IS_)
#undef AK_PAIR_IS_
    return 0;
}

static int is_fp8(const ak_attn_config *cfg) { return cfg->kv_dtype == AK_FP8_E4M3; }

/* cuTensorMapEncodeTiled, from the driver at first use */
encode_tiled_fn ak_cuda_encode_tiled(void)
{
    static const encode_tiled_fn fn = [] {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            f = NULL;
        return (encode_tiled_fn)f;
    }();
    return fn;
}

/* An override from the environment with two values: *choice -1 when var is
 * unset or empty, 0 for a, 1 for b; anything else is an error naming var. */
static ak_status env_choice(const char *var, const char *a, const char *b, int *choice)
{
    const char *env = getenv(var);
    *choice = -1;
    if (!env || !*env) return AK_OK;
    if (!strcmp(env, a)) *choice = 0;
    else if (!strcmp(env, b)) *choice = 1;
    else return ak_set_error(AK_ERR_INVALID_ARG, "%s=%s: expected %s or %s", var, env, a, b);
    return AK_OK;
}

/* The prefill kernel of family f that finds the NaN rule's cases itself
 * (attn.cuh: PASS_DETECT), where there is one and the switch
 * AK_CUDA_NAN_DETECT (env: env_choice's, -1 unset) is not 0: the wgmma
 * family below DP 256 with 16-bit K/V, with no window (the last token's
 * rows then see every key of an item) and no soft-cap (which maps an
 * infinite product to a finite one); else fn NULL. Every item, long or
 * short, then runs unchecked first, and no scan pass reads K/V or the
 * pools' marks. */
static attn_kernel detect_kernel_of(const ak_attn_config *cfg, prefill_family f, int fp8, int env)
{
    const attn_kernel none = {NULL, 0, 0, 0};
    if (f != PREFILL_WGMMA || fp8 || env == 0 || cfg->window_left >= 0 || cfg->logits_soft_cap != 0.0f) return none;
    return ak_cuda_prefill_wgmma_detect_kernel(cfg->head_dim_qk, cfg->head_dim_vo, cfg->o_dtype);
}

/* AK_CUDA_SCAN_BESIDE: the SMs the scan pass holds beside the clean
 * prefill pass (engine_state.scan_beside), 0 to run it before the prefill
 * instead; unset, SCAN_BESIDE_SMS (16: at d256 0.976-0.995 of the time
 * of the pass before on an H100, 0.985-1.004 on an H200, the whole GPU
 * suite passing with it: BENCHMARKS.md). Anything but a whole number from
 * 0 to the SMs is an error naming the variable. */
#define SCAN_BESIDE_SMS 16
static ak_status scan_beside_sms(int num_sms, int *sms)
{
    const char *env = getenv("AK_CUDA_SCAN_BESIDE");
    *sms = SCAN_BESIDE_SMS < num_sms ? SCAN_BESIDE_SMS : num_sms;
    if (!env || !*env) return AK_OK;
    char *end = NULL;
    errno = 0;
    const long v = strtol(env, &end, 10);
    if (errno || end == env || *end || v < 0 || v > num_sms)
        return ak_set_error(AK_ERR_INVALID_ARG, "AK_CUDA_SCAN_BESIDE=%s: expected the SMs, 0 to %d", env, num_sms);
    *sms = (int)v;
    return AK_OK;
}

/* AK_CUDA_PORTABLE=1 runs every config on the portable kernel (to test it on
 * the whole case table, or to compare it); anything else but 0 is an error. */
static ak_status portable_forced(int *forced)
{
    int c;
    AK_TRY(env_choice("AK_CUDA_PORTABLE", "0", "1", &c));
    *forced = c == 1;
    return AK_OK;
}

/* The reasons every mode of the engine shares: the device (cp.async and
 * bf16 mma), and the dtypes (q, K/V and o of one 16-bit dtype, or K/V in
 * fp8 e4m3 with q and o of one); `kv` names the K/V rows in the messages. */
static void device_dtype_reasons(const ak_attn_config *cfg, const ak_device_info *dev, const char *kv,
                                 ak_reasons *why)
{
    if (dev->cc_major < 8)
        ak_reason_add(why, "needs sm_80 or newer (cp.async, bf16 mma); device is sm_%d%d", dev->cc_major,
                      dev->cc_minor);
    if (cfg->kv_dtype == AK_FP8_E4M3 && (cfg->q_dtype != cfg->o_dtype ||
                                         (cfg->q_dtype != AK_F16 && cfg->q_dtype != AK_BF16)))
        ak_reason_add(why, "fp8 %s need q and o of one dtype, f16 or bf16 (got %s/%s)", kv,
                      ak_dtype_name(cfg->q_dtype), ak_dtype_name(cfg->o_dtype));
    else if (cfg->kv_dtype != AK_FP8_E4M3 &&
             (cfg->q_dtype != cfg->kv_dtype || cfg->o_dtype != cfg->kv_dtype ||
              (cfg->kv_dtype != AK_F16 && cfg->kv_dtype != AK_BF16)))
        ak_reason_add(why, "q, kv and o must share one dtype, f16 or bf16, or kv fp8_e4m3 (got %s/%s/%s)",
                      ak_dtype_name(cfg->q_dtype), ak_dtype_name(cfg->kv_dtype), ak_dtype_name(cfg->o_dtype));
}

int ak_cuda_engine_check(const ak_attn_config *cfg, const ak_device_info *dev, ak_reasons *why)
{
    device_dtype_reasons(cfg, dev, "K/V rows", why);
    if (cfg->head_dim_qk > AK_PORTABLE_MAX_DIM || cfg->head_dim_vo > AK_PORTABLE_MAX_DIM)
        ak_reason_add(why, "head dims %d/%d: the CUDA kernels serve head dims up to %d", cfg->head_dim_qk,
                      cfg->head_dim_vo, AK_PORTABLE_MAX_DIM);
    if (cfg->mla)
        ak_reason_add(why, "cfg.mla = 1: multi-head latent attention is served by cuda_mla");
    return why->count;
}

int ak_cuda_mla_check(const ak_attn_config *cfg, const ak_device_info *dev, ak_reasons *why)
{
    device_dtype_reasons(cfg, dev, "latent rows", why);
    if (!cfg->mla) {
        ak_reason_add(why, "cfg.mla = 0: cuda_mla serves multi-head latent attention only");
        return why->count;
    }
    if (cfg->head_dim_qk != 576 || cfg->head_dim_vo != 512)
        ak_reason_add(why, "head dims %d/%d: cuda_mla serves a latent of 512 and a rotary part of 64 (576/512)",
                      cfg->head_dim_qk, cfg->head_dim_vo);
    return why->count;
}

/* Decode on tensor cores from a GQA group of 2 up, CUDA cores for MHA.
 * Measured on an H200, bf16, batch 64 x kv_len 4096, fraction of copy
 * bandwidth (CUDA cores / tensor cores): group 1 d64 0.95 / 0.94, d128 1.02 /
 * 0.99, d256 0.83 / 0.80; group 2 d128 0.96 / 0.98, d256 0.61 / 0.80; group 3
 * d128 0.79 / 0.96. The FMA path pays per query head; the mma tile costs the
 * same for 1 or 16. The CUDA-core engine is compiled for equal head dims of
 * 64, 128 and 256; other pairs of the table take tensor cores for MHA too,
 * and a pair outside it the portable kernel. */
static decode_engine choose_engine(const ak_attn_config *cfg, int portable)
{
    /* rows of 512 (and MLA's 576/512): the wide engine (decode_wide.cu) */
    if (cfg->mla) return DECODE_WIDE;
    if (!portable && cfg->head_dim_qk == 512 && cfg->head_dim_vo == 512) return DECODE_WIDE;
    if (portable || !tc_pair(cfg)) return DECODE_PORTABLE;
    const int group = cfg->num_qo_heads / cfg->num_kv_heads;
    if (group <= AK_DECODE_CC_MAX_GROUP && ak_cuda_decode_kernel(DECODE_CUDA_CORES, cfg->head_dim_qk,
                                                                  cfg->head_dim_vo, cfg->o_dtype, is_fp8(cfg)).fn)
        return DECODE_CUDA_CORES;
    return DECODE_TENSOR_CORES;
}

/* The absorbed MLA decode kernel: warpgroup MMA (mla_wgmma.cu, 64 heads a
 * block) on an sm_90 GPU with 16-bit latent rows and at least
 * MLA_WGMMA_MIN_HEADS query heads when the build has it, else the wide-row
 * kernel (decode_wide.cu: mma.sync, 16 to 64 heads a block, fp8 rows too).
 * AK_CUDA_MLA=wide|wgmma forces one; a forced kernel that cannot run here
 * is an error. */
#define MLA_WGMMA_MIN_HEADS 16 /* the fewest measured (1.09-1.22x the wide kernel): BENCHMARKS.md */
static ak_status choose_mla_kernel(const ak_attn_config *cfg, const ak_device_info *dev, attn_kernel *k /* OUT */,
                                   int *wgmma /* OUT, may be NULL */)
{
    const attn_kernel wg = ak_cuda_mla_wgmma_kernel(cfg->o_dtype);
    const int wg_ok = dev->cc_major == 9 && dev->cc_minor == 0 && !is_fp8(cfg) && wg.fn != NULL;
    int forced;
    AK_TRY(env_choice("AK_CUDA_MLA", "wide", "wgmma", &forced));
    if (forced == 1 && !wg_ok)
        return ak_set_error(AK_ERR_UNSUPPORTED,
                            "AK_CUDA_MLA=wgmma: the wgmma MLA kernel needs compute capability 9.0, a build for sm_90 "
                            "and 16-bit latent rows (this GPU is %d.%d%s%s)",
                            dev->cc_major, dev->cc_minor, wg.fn ? "" : ", not built",
                            is_fp8(cfg) ? ", latent rows fp8_e4m3" : "");
    /* forced: below MLA_WGMMA_MIN_HEADS too */
    const int use = forced >= 0 ? forced : wg_ok && cfg->num_qo_heads >= MLA_WGMMA_MIN_HEADS;
    if (wgmma) *wgmma = use;
    *k = use ? wg
             : ak_cuda_decode_wide_kernel(cfg->head_dim_qk, cfg->head_dim_vo, cfg->o_dtype, cfg->num_qo_heads, 1,
                                          is_fp8(cfg));
    return AK_OK;
}

/* Query tokens of a request an MLA item may hold (decode_item.ntok): the
 * wgmma kernel's 64 rows take 64 / heads of them where that is 2 or more
 * (16 heads: 4, so a request of 2 to 4 tokens reads its latent rows once,
 * not once a token), unless a window (each token's own first key) or
 * AK_CUDA_MLA_PACK=0; the wide-row kernel takes one. */
static ak_status mla_pack_of(const ak_attn_config *cfg, int wgmma, const attn_kernel *k, int *pack /* OUT */)
{
    int on;
    AK_TRY(env_choice("AK_CUDA_MLA_PACK", "0", "1", &on));
    const int group = cfg->num_qo_heads;
    *pack = wgmma && on != 0 && cfg->window_left < 0 && group <= k->rows / 2 ? k->rows / group : 1;
    return AK_OK;
}

/* Prefill rows of a KV head's group: row tiles of at most the kernel k's
 * rows, equal in size, and whole tokens per tile when a group fits in one.
 * seg: the rows of a segment of whole tokens (attn.cuh's tile_token). A
 * kernel that takes tiles in its warpgroups' segments (k->seg) gets them
 * where the heads do not divide a segment and the tile holds as many tokens
 * so (28/4 heads: 9 tokens x 7 heads a warpgroup, 18 a tile either way; 3
 * heads, 21 + 21): each warpgroup's rows then start at a token, so that q
 * and o go by TMA boxes of whole tokens (prefill_wgmma.cu). A tile of two
 * warpgroups whose q and o go by TMA (tma: run() builds the kernel's maps)
 * takes them at a token lost in 20 too (40/8: 12 + 12 tokens against 25,
 * 12/2: 10 + 10 against 21; not 11 heads, 10 against 11): TMA's q and o
 * outweigh the lost token there (H200, BENCHMARKS.md: 40/8 16 x 1024 0.94
 * of the time, 4 x 4096 1.00); the d64 kernel's three warpgroups store o
 * from registers, and keep a tile's tokens. Else the tile is one segment. */
static void prefill_rows(const ak_attn_config *cfg, const attn_kernel *k, int tma, int *row_tiles, int *heads,
                         int *tokens, int *seg)
{
    const int group = cfg->num_qo_heads / cfg->num_kv_heads, rows = k->rows;
    *row_tiles = (group + rows - 1) / rows;
    *heads = (group + *row_tiles - 1) / *row_tiles;
    *tokens = rows / *heads;
    const int s = k->seg, hb = *heads;
    const int packed = s > 0 && hb <= s ? rows / s * (s / hb) : 0; /* tokens a tile packed by segment */
    const int lost = *tokens - packed, two = tma && rows == 2 * s;
    *seg = s > 0 && hb <= s && s % hb != 0 && (lost == 0 || (two && lost * 20 <= *tokens)) ? s : rows;
    if (*seg < rows) *tokens = packed;
}

/* The prefill kernel: warpgroup MMA on an sm_90 GPU when the build has it
 * (sm_90a code runs on compute capability 9.0 alone), else mma.sync; the
 * portable kernel for a pair the tensor-core kernels are not compiled for,
 * and for head dims 512 (16-bit K/V) where wgmma does not run.
 * AK_CUDA_PREFILL=mma|wgmma forces one (to compare them, or to test both on
 * one GPU); forcing wgmma where it cannot run is an error, not ignored. At
 * head dims 512, which have no mma.sync kernel, mma means "not wgmma": the
 * portable kernel (so that a GPU suite run under mma tests it). */
static ak_status choose_prefill(const ak_attn_config *cfg, const ak_device_info *dev, int portable, prefill_family *f)
{
    const int dqk = cfg->head_dim_qk, dvo = cfg->head_dim_vo;
    /* head dims 512 with 16-bit K/V: wgmma alone (prefill_wide.cu) */
    const int wide = dqk == 512 && dvo == 512 && !is_fp8(cfg);
    if (portable || (!tc_pair(cfg) && !wide)) {
        *f = PREFILL_PORTABLE;
        return AK_OK;
    }
    /* fp8 K/V: mma.sync (the wgmma kernel has no fp8 instances) */
    const int wg_ok = dev->cc_major == 9 && dev->cc_minor == 0 && !is_fp8(cfg) &&
                      ak_cuda_prefill_wgmma_kernel(dqk, dvo, cfg->o_dtype).fn != NULL;
    int forced;
    AK_TRY(env_choice("AK_CUDA_PREFILL", "mma", "wgmma", &forced));
    /* head dims 512 without wgmma (forced off, or not runnable here and not
     * forced on): the portable kernel */
    if (wide && (forced == 0 || (forced < 0 && !wg_ok))) {
        *f = PREFILL_PORTABLE;
        return AK_OK;
    }
    if (forced == 1 && !wg_ok)
        return ak_set_error(AK_ERR_UNSUPPORTED,
                            "AK_CUDA_PREFILL=wgmma: the wgmma prefill kernel needs compute capability 9.0, "
                            "a build for sm_90 and 16-bit K/V (this GPU is %d.%d%s%s)",
                            dev->cc_major, dev->cc_minor,
                            ak_cuda_prefill_wgmma_kernel(dqk, dvo, cfg->o_dtype).fn ? "" : ", not built",
                            is_fp8(cfg) ? ", K/V fp8_e4m3" : "");
    *f = (forced >= 0 ? forced : wg_ok) ? PREFILL_WGMMA : PREFILL_MMA;
    return AK_OK;
}

static const char *family_name(prefill_family f)
{
    return f == PREFILL_WGMMA ? "tensor cores, wgmma, sm_90a" : f == PREFILL_MMA ? "tensor cores, mma.sync"
                                                                                 : "CUDA cores, portable kernel";
}

void ak_cuda_engine_explain(const ak_attn_config *cfg, const ak_device_info *dev, engine_mode mode, char *buf,
                            size_t cap)
{
    if (mode == ENGINE_MODE_MLA) {
        const int group = cfg->num_qo_heads;
        attn_kernel k;
        int wgmma, pack;
        if (choose_mla_kernel(cfg, dev, &k, &wgmma) != AK_OK || mla_pack_of(cfg, wgmma, &k, &pack) != AK_OK) {
            snprintf(buf, cap, "%s", ak_last_error());
            return;
        }
        const int wrows = k.rows > 0 ? k.rows : 16;
        char items[96];
        if (pack > 1)
            snprintf(items, sizeof items, "up to %d query tokens of a request one item", pack);
        else
            snprintf(items, sizeof items, "every query token one item");
        snprintf(buf, cap,
                 "%s%sabsorbed MLA on tensor cores (%s): %s "
                 "(multi-token requests causal among their tokens), %d heads a block sharing each latent row "
                 "load (%d row tile%s), split-KV with a merge%s",
                 cfg->kv_storage == AK_KV_RAGGED ? "ragged K/V; " : "",
                 is_fp8(cfg) ? "fp8 latent rows converted to 16 bits in shared memory, tile by tile; " : "",
                 wgmma ? "wgmma, sm_90a, a producer warpgroup and two consumers" : "the wide-row decode kernel", items,
                 wrows, (group + wrows - 1) / wrows, (group + wrows - 1) / wrows == 1 ? "" : "s",
                 cfg->batch_invariant ? "; batch-invariant (fixed splits)" : "");
        return;
    }
    int portable = 0;
    prefill_family f;
    if (portable_forced(&portable) != AK_OK || choose_prefill(cfg, dev, portable, &f) != AK_OK) {
        snprintf(buf, cap, "%s", ak_last_error());
        return;
    }
    const char *dims = f == PREFILL_PORTABLE && !portable
                           ? (is_fp8(cfg) ? " (head dims outside the fp8 tensor-core table)"
                              : cfg->head_dim_qk == 512 && cfg->head_dim_vo == 512
                                  ? " (head dims 512: tensor cores need compute capability 9.0, a build for sm_90 "
                                    "and no AK_CUDA_PREFILL=mma)"
                                  : " (head dims outside the tensor-core table)")
                           : "";
    const attn_kernel pk = ak_cuda_prefill_kernel(f, cfg->head_dim_qk, cfg->head_dim_vo, cfg->o_dtype, is_fp8(cfg));
    const int rows = pk.rows;
    int row_tiles, heads, tokens, seg;
    /* the K/V copies of a kernel that takes TMA maps (prefill_wgmma.cu's),
     * by create's rule */
    int tma, page_boxes, detect;
    if (env_choice("AK_CUDA_PREFILL_TMA", "0", "1", &tma) != AK_OK ||
        env_choice("AK_CUDA_PREFILL_TMA_SMALL", "0", "1", &page_boxes) != AK_OK ||
        env_choice("AK_CUDA_NAN_DETECT", "0", "1", &detect) != AK_OK) {
        snprintf(buf, cap, "%s", ak_last_error());
        return;
    }
    prefill_rows(cfg, &pk, pk.tma_map && tma != 0, &row_tiles, &heads, &tokens, &seg);
    const char *inv = cfg->batch_invariant ? "; batch-invariant (fixed splits)" : "";
    const char *fp8 = !is_fp8(cfg) ? ""
                      : f == PREFILL_PORTABLE || portable
                          ? "fp8 K/V converted as read; "
                          : "fp8 K/V converted to 16 bits in shared memory, tile by tile; ";
    const int q_tma = ak_cuda_prefill_tma_q_tokens(heads, rows, seg) > 0;
    const int ragged = cfg->kv_storage == AK_KV_RAGGED;
    const int box = ak_cuda_prefill_tma_rows(cfg->head_dim_qk, cfg->head_dim_vo, ragged, cfg->page_size,
                                             page_boxes != 0);
    const int box_any = ak_cuda_prefill_tma_rows(cfg->head_dim_qk, cfg->head_dim_vo, ragged, cfg->page_size, 1);
    const char *q_by = q_tma ? ", q by TMA" : "";
    char copies[128] = ""; /* (none: a kernel without maps) */
    if (pk.tma_map) {
        if (tma == 0) snprintf(copies, sizeof copies, ", K/V by cp.async (AK_CUDA_PREFILL_TMA=0)");
        else if (box >= 64) snprintf(copies, sizeof copies, ", K/V tiles%s by TMA", q_tma ? " and q" : "");
        else if (box > 0)
            snprintf(copies, sizeof copies, ", K/V tiles by TMA in boxes of %d keys, each on its page%s", box, q_by);
        else if (box_any > 0)
            snprintf(copies, sizeof copies, ", K/V by cp.async (AK_CUDA_PREFILL_TMA_SMALL=0)%s", q_by);
        else snprintf(copies, sizeof copies, ", K/V by cp.async (TMA takes pages of 16n keys)%s", q_by);
    }
    /* the NaN rule (attn.cuh): found by the kernel, or by a scan pass over
     * the long requests' K/V (kernels with an unchecked path) */
    const char *nan = detect_kernel_of(cfg, f, is_fp8(cfg), detect).fn
                          ? ", non-finite inputs found by the kernel itself, an item run again checked where "
                            "there is one (AK_CUDA_NAN_DETECT=0: a scan pass first)"
                      : pk.unchecked ? ", a scan pass first for non-finite K/V (the long requests')"
                                     : "";
    char segs[64] = "";
    if (seg < rows)
        snprintf(segs, sizeof segs, ", %d tokens in each warpgroup's %d rows", seg / heads, seg);
    if (mode == ENGINE_MODE_VARLEN) {
        snprintf(buf, cap,
                 "%severy request on the prefill kernel (%s%s%s, %d query rows a tile: %d tokens x %d heads%s%s), no "
                 "split-KV, one launch per run%s",
                 fp8, family_name(f), dims, copies, rows, tokens, heads, segs, nan, inv);
        return;
    }
    const int group = cfg->num_qo_heads / cfg->num_kv_heads;
    const decode_engine e = choose_engine(cfg, portable);
    int n = snprintf(buf, cap, "%s%sdecode on %s%s", cfg->kv_storage == AK_KV_RAGGED ? "ragged K/V; " : "", fp8,
                     e == DECODE_TENSOR_CORES ? "tensor cores"
                     : e == DECODE_WIDE      ? "tensor cores, rows of 512 (wide-row engine)"
                     : e == DECODE_CUDA_CORES ? "CUDA cores"
                                              : "the portable kernel",
                     e == DECODE_PORTABLE ? dims : "");
    if (e != DECODE_PORTABLE && n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - n, " (GQA group %d %s %d)", group, group > AK_DECODE_CC_MAX_GROUP ? ">" : "<=",
                      AK_DECODE_CC_MAX_GROUP);
    if (cfg->workload == AK_WORKLOAD_DECODE || n < 0 || (size_t)n >= cap) {
        if (n >= 0 && (size_t)n < cap) snprintf(buf + n, cap - n, "%s", inv);
        return;
    }
    snprintf(buf + n, cap - n, "; prefill on %s%s, %d query rows a tile (%d tokens x %d heads%s)%s%s", family_name(f),
             copies, rows, tokens, heads, segs, nan, inv);
}

/* ---- create / destroy ---------------------------------------------------------- */

#if defined(AK_PREFILL_CLOCKS)
void ak_cuda_prefill_clocks_dump(void); /* (prefill_wgmma.cu) */
#endif

void ak_cuda_engine_destroy(void *state)
{
    engine_state *s = (engine_state *)state;
    if (!s) return;
#if defined(AK_PREFILL_CLOCKS)
    if (s->prefill) ak_cuda_prefill_clocks_dump();
#endif
    for (int i = 0; i < NUM_STAGING; i++) {
        if (s->stg[i].copied) {
            cudaEventSynchronize(s->stg[i].copied);
            cudaEventDestroy(s->stg[i].copied);
        }
        if (s->stg[i].host) cudaFreeHost(s->stg[i].host);
    }
    if (s->dev) cudaFree(s->dev);
    free(s->tiles);
    free(s->pf_load);
    free(s->pf_keys);
    free(s->pf_count);
    free(s->first_block);
    free(s->units);
    free(s);
}

/* Batch-invariant decode splits: every request's visible keys cut into
 * chunks of this many keys, or more when max_splits chunks would not cover
 * the longest context the limits allow, whatever else the batch holds. */
#define INVARIANT_CHUNK 2048

static ak_status engine_create_inner(engine_state *s)
{
    const ak_attn_config *cfg = &s->cfg;
    const ak_limits *lim = &s->lim;
    AK_CUDA_TRY(cudaSetDevice(cfg->device.index));
    ak_device_info info;
    AK_TRY(ak_cuda_get_info(cfg->device.index, &info));
    int portable = 0;
    AK_TRY(portable_forced(&portable));
    const int group = cfg->num_qo_heads / cfg->num_kv_heads;
    s->ragged = cfg->kv_storage == AK_KV_RAGGED;
    s->split = s->mode == ENGINE_MODE_PAGED || s->mode == ENGINE_MODE_MLA;
    s->all_decode = s->mode == ENGINE_MODE_MLA;
    s->max_units = s->all_decode ? lim->max_tokens : lim->max_reqs;
    s->max_indices = s->ragged ? 0 : (int64_t)lim->max_reqs * lim->max_blocks_per_req;
    s->max_slots = s->ragged ? 0 : lim->max_tokens;
    s->max_splits = lim->max_splits > 0 ? lim->max_splits : DEFAULT_MAX_SPLITS;
    if (s->max_splits > MAX_SPLITS_CAP) s->max_splits = MAX_SPLITS_CAP;
    /* the portable kernel copies element by element unless both dims are
     * whole 16-byte chunks (of the K/V dtype: 16 fp8 elements) */
    s->fp8 = is_fp8(cfg);
    s->vec = cfg->head_dim_qk % 8 == 0 && cfg->head_dim_vo % 8 == 0;
    s->kv_epc = s->fp8 ? 16 : 8;
    s->kv_vec = cfg->head_dim_qk % s->kv_epc == 0 && cfg->head_dim_vo % s->kv_epc == 0;
    int ctas_per_sm = 0;
    if (s->split) {
        s->engine = choose_engine(cfg, portable);
        s->mla_pack = 1;
        if (cfg->mla) {
            int wgmma, tma;
            AK_TRY(choose_mla_kernel(cfg, &info, &s->dec_k, &wgmma));
            AK_TRY(env_choice("AK_CUDA_MLA_TMA", "0", "1", &tma));
            s->mla_tma = s->dec_k.tma_map && tma != 0;
            AK_TRY(mla_pack_of(cfg, wgmma, &s->dec_k, &s->mla_pack));
        } else {
            s->dec_k = s->engine == DECODE_WIDE
                           ? ak_cuda_decode_wide_kernel(cfg->head_dim_qk, cfg->head_dim_vo, cfg->o_dtype, group, 0,
                                                        s->fp8)
                           : ak_cuda_decode_kernel(s->engine, cfg->head_dim_qk, cfg->head_dim_vo, cfg->o_dtype,
                                                   s->fp8);
        }
        if (!s->dec_k.fn) return ak_set_error(AK_ERR_INTERNAL, "no decode kernel for head dims %d/%d",
                                              cfg->head_dim_qk, cfg->head_dim_vo);
        /* programmatic dependent launches need the kernels' griddepcontrol,
         * compiled only for sm_90+: a build for sm_80 run on an H100 has none,
         * and a dependent launched early would then not wait */
        int ptx = 0;
        AK_TRY(ak_cuda_kernel_ptx_version(&s->dec_k, &ptx));
        s->pdl = info.cc_major >= 9 && ptx >= 90;
        s->row_tiles = (group + s->dec_k.rows - 1) / s->dec_k.rows;
        AK_TRY(ak_cuda_kernel_occupancy(&s->dec_k, &ctas_per_sm));
        if (ctas_per_sm < 1) return ak_set_error(AK_ERR_INTERNAL, "decode kernel cannot be resident on this GPU");
        /* one wave: every thread block resident at once (rounding up would leave
         * a few blocks, each with several items, for a second wave: measured 0.62
         * instead of 1.0 of copy for 32/32 heads) */
        const int ctas_per_item = cfg->num_kv_heads * s->row_tiles;
        s->decode_ctas = info.num_sms * ctas_per_sm / ctas_per_item;
        if (s->decode_ctas < 1) s->decode_ctas = 1;
        s->max_items = s->max_units > s->decode_ctas ? s->max_units : s->decode_ctas;
        /* room for balance_chunk's rounds, for batches it can matter to (a
         * quarter of the wave or more: smaller ones split evenly anyway) */
        if (s->max_units >= s->decode_ctas / 4) {
            const int64_t more = (int64_t)s->max_items + (int64_t)(BALANCE_ROUNDS + 1) * s->decode_ctas;
            s->max_items = more > INT32_MAX / 2 ? INT32_MAX / 2 : (int)more;
        }
        if (cfg->batch_invariant) {
            const int64_t max_kv = (int64_t)lim->max_blocks_per_req * (s->ragged ? 1 : cfg->page_size);
            int64_t chunk = (max_kv + s->max_splits - 1) / s->max_splits;
            chunk = (chunk + CHUNK_QUANTUM - 1) / CHUNK_QUANTUM * CHUNK_QUANTUM;
            s->invariant_chunk = chunk > INVARIANT_CHUNK ? (int)chunk : INVARIANT_CHUNK;
            /* every decode request in ceil(kv_len / chunk) items */
            const int64_t per_req = (max_kv + s->invariant_chunk - 1) / s->invariant_chunk;
            const int64_t items = (int64_t)s->max_units * (per_req > 1 ? per_req : 1);
            if (items > INT32_MAX / 2)
                return ak_set_error(AK_ERR_LIMIT_EXCEEDED, "batch-invariant decode: limits allow %lld split items",
                                    (long long)items);
            if (items > s->max_items) s->max_items = (int)items;
        }
        /* Split items need partial slots (num_qo_heads x head_dim_vo f32 each:
         * 256 KB a slot for MLA's 128 heads), but only splits that fill the
         * wave or balance its rounds make them: at most BALANCE_ROUNDS + 2
         * waves' worth. Sizing them by max_items instead would grow with
         * limits.max_tokens in MLA mode (every token a unit): 8192 tokens
         * would hold 2 GB. Batch-invariant splits are not bounded so. */
        s->max_partials = s->max_items;
        const int64_t wave_cap = (int64_t)(BALANCE_ROUNDS + 2) * s->decode_ctas;
        if (!cfg->batch_invariant && wave_cap < s->max_partials) s->max_partials = (int)wave_cap;
        /* a packed item's tokens take a slot each (as many bytes as an
         * unpacked item of the kernel's 64 rows: MLA's 128 heads take more);
         * batch-invariant slots are counted by tokens already (max_units x
         * chunks a token, and a packed unit has no more chunks than its
         * last token) */
        if (!cfg->batch_invariant) {
            if ((int64_t)s->max_partials * s->mla_pack > INT32_MAX / 2)
                return ak_set_error(AK_ERR_LIMIT_EXCEEDED, "MLA decode: limits allow %lld partial slots",
                                    (long long)s->max_partials * s->mla_pack);
            s->max_partials *= s->mla_pack;
        }
        s->max_tasks = s->max_units;
        s->units = (decode_unit *)malloc(sizeof(decode_unit) * ((size_t)s->max_units + 1));
        if (!s->units) return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate the plan's decode scratch");
        s->merge_k = ak_cuda_merge_kernel(cfg->head_dim_vo, s->vec, cfg->o_dtype);
        /* one unit (a request at batch 1 with one KV head, as in 8/1 groups)
         * may split across the whole wave where the merge has narrow slices
         * to sum that many partials (70b-tp8 1 x 32768: 20.2 -> 15.7 us);
         * without them (rows over 128 dims) a wave of splits was slower
         * (MLA 16 heads 1 x 32768: 37.0 -> 39.8 us, 132 splits against 64) */
        s->dec_splits = lim->max_splits > 0 ? s->max_splits : DEFAULT_MAX_SPLITS;
        if (lim->max_splits == 0 && s->merge_k.merge_sub > 1 && s->decode_ctas > s->dec_splits)
            s->dec_splits = s->decode_ctas;
        if (s->dec_splits > MAX_SPLITS_CAP) s->dec_splits = MAX_SPLITS_CAP;
    }

    /* varlen: every request with a query token is a prefill; paged: those
     * with two or more (decode takes the rest) */
    s->prefill = !s->split || (cfg->workload != AK_WORKLOAD_DECODE && !s->all_decode);
    s->min_prefill_q = s->split ? 2 : 1;
    if (s->prefill) {
        AK_TRY(choose_prefill(cfg, &info, portable, &s->pfam));
        s->pre_k = ak_cuda_prefill_kernel(s->pfam, cfg->head_dim_qk, cfg->head_dim_vo, cfg->o_dtype, s->fp8);
        if (!s->pre_k.fn) return ak_set_error(AK_ERR_INTERNAL, "no prefill kernel for head dims %d/%d",
                                              cfg->head_dim_qk, cfg->head_dim_vo);
        /* the same kernel finding the NaN rule's cases itself where it can
         * (the same launch shape); AK_CUDA_NAN_DETECT=0 keeps the scan pass */
        int detect_env;
        AK_TRY(env_choice("AK_CUDA_NAN_DETECT", "0", "1", &detect_env));
        const attn_kernel dk = detect_kernel_of(cfg, s->pfam, s->fp8, detect_env);
        const bool detect = dk.fn != NULL;
        if (detect) s->pre_k = dk;
        int tma;
        AK_TRY(env_choice("AK_CUDA_PREFILL_TMA", "0", "1", &tma));
        s->pre_tma = s->pre_k.tma_map && tma != 0;
        int page_boxes;
        AK_TRY(env_choice("AK_CUDA_PREFILL_TMA_SMALL", "0", "1", &page_boxes));
        s->pre_page_boxes = page_boxes != 0;
        prefill_rows(cfg, &s->pre_k, s->pre_tma, &s->prow_tiles, &s->prow_heads, &s->ptok, &s->prow_seg);
        AK_TRY(ak_cuda_kernel_occupancy(&s->pre_k, &ctas_per_sm));
        if (ctas_per_sm < 1) return ak_set_error(AK_ERR_INTERNAL, "prefill kernel cannot be resident on this GPU");
        /* One grid of blocks for every row (KV head x row tile): the items
         * carry theirs (prefill_item.row), so the grid fills every SM
         * whatever the rows; a grid of rows x blocks a row left 132 - 128
         * SMs idle at 8 KV heads (BENCHMARKS.md). */
        const int rows = cfg->num_kv_heads * s->prow_tiles;
        s->prefill_ctas = info.num_sms * ctas_per_sm;
        /* blocks a row on average, rounded up: the bounds of splits (a split
         * tile costs more than a block's share, total x rows / prefill_ctas
         * >= total / P) */
        const int P = (s->prefill_ctas + rows - 1) / rows;
        /* wgmma at DP 256: the NaN rule's two paths do not fit one kernel
         * (it spills), so the items the scan pass finds clean run unchecked
         * in a kernel of their own, launched before pre_k (run()), which
         * takes the rest. Not with fewer than two blocks a row: that kernel
         * is bound by DRAM, and the unchecked path saves less than the
         * scan's extra read of K/V costs (deepseek-v3-prefill 128/128 heads
         * 2 x 4096: 170 against 303 us, BENCHMARKS.md) */
        if (s->pfam == PREFILL_WGMMA && !s->fp8 && s->prefill_ctas >= 2 * rows) {
            s->pre_clean_k = ak_cuda_prefill_wgmma_clean_kernel(cfg->head_dim_qk, cfg->head_dim_vo, cfg->o_dtype);
            int clean_ctas = 0;
            if (s->pre_clean_k.fn) AK_TRY(ak_cuda_kernel_occupancy(&s->pre_clean_k, &clean_ctas));
            if (clean_ctas != ctas_per_sm) s->pre_clean_k.fn = NULL; /* (the same shape: never) */
        }
        /* tiles: at most floor(max_tokens / ptok) + one per request of
         * min_prefill_q or more tokens; splitting adds fewer than P tiles
         * (a tile of cost c cut into chunks of `share` key tiles, share =
         * ceil(total x rows / prefill_ctas) >= total / P, adds fewer than
         * c / share, and the costs sum to total); the last round's cut
         * fewer than P more (below); P + 1 more (a margin). Items: every
         * tile once a row, and the dealing pads the last round with fewer
         * than prefill_ctas */
        const int multi = lim->max_reqs < lim->max_tokens / s->min_prefill_q ? lim->max_reqs
                                                                             : lim->max_tokens / s->min_prefill_q;
        /* the last round's cut (plan_prefill) makes at most prefill_ctas /
         * rows = P chunks (its tiles' rows times their chunks fill at most
         * the grid), so it adds fewer than P tiles, of tail_tiles cut */
        const int tail_tiles = (s->prefill_ctas / TAIL_SPLIT_FRACTION + rows - 1) / rows;
        s->max_ptiles = lim->max_tokens / s->ptok + multi + (s->split ? 3 : 1) * P + 1;
        if ((int64_t)s->max_ptiles * rows + s->prefill_ctas > INT_MAX / 2)
            return ak_set_error(AK_ERR_LIMIT_EXCEEDED, "prefill: limits.max_tokens = %d gives %lld work items, too many",
                                lim->max_tokens, (long long)s->max_ptiles * rows);
        s->max_pitems = s->max_ptiles * rows + s->prefill_ctas;
        if (s->split) {
            /* split tiles hold at most ptok tokens each, in fewer than P + P
             * chunks (the added ones, plus one per split tile: each costs more
             * than share, so there are fewer than P), and the last round's
             * cut in at most P */
            s->pf_slots = 3 * P * s->ptok;
            /* and no token is in more than max_splits chunks */
            if ((int64_t)s->pf_slots > (int64_t)lim->max_tokens * s->max_splits)
                s->pf_slots = lim->max_tokens * s->max_splits;
            s->max_tasks += (P + tail_tiles) * s->ptok;
        }
        /* the NaN rule's scan pass, for kernels with an unchecked path (or
         * pass: wgmma at DP 256; the portable and d512 ones always check):
         * tasks for every request (plan_prefill: a run without marks scans
         * those of SCAN_MIN_ROWS rows or more, and the shorter ones whose
         * rows are worth it, SCAN_ROWS_KEYS) */
        if ((s->pre_k.unchecked || s->pre_clean_k.fn) && s->kv_vec && !detect) {
            s->scan_k = ak_cuda_scan_kernel(cfg->kv_dtype);
            s->scan_keys = ak_cuda_scan_task_keys(cfg->head_dim_qk, cfg->head_dim_vo, cfg->kv_dtype);
            AK_TRY(env_choice("AK_CUDA_SCAN_SHORT", "0", "1", &s->scan_short));
            AK_TRY(env_choice("AK_CUDA_SCAN_SHORT_ROWS", "0", "1", &s->scan_short_rows));
            /* a run without marks has work for the pass where a request
             * can have SCAN_MIN_ROWS rows, or where the shorter ones' rows
             * can be scanned (rows_worth_rows) */
            s->scan_rows = (int64_t)lim->max_tokens * group >= SCAN_MIN_ROWS || s->scan_short_rows == 1 ||
                           (s->scan_short_rows < 0 && s->pre_k.unchecked);
            /* (requests past that capacity, which no engine reaches, run checked) */
            s->max_scans = (multi < MAX_SCAN_REQS ? multi : MAX_SCAN_REQS) * SCAN_TASKS_PER_REQ;
            int scan_per_sm = 0;
            AK_TRY(ak_cuda_kernel_occupancy(&s->scan_k, &scan_per_sm));
            s->scan_ctas = info.num_sms * scan_per_sm / cfg->num_kv_heads;
            if (s->scan_ctas < 1) s->scan_ctas = 1;
            if (s->pre_clean_k.fn && s->pdl) AK_TRY(scan_beside_sms(info.num_sms, &s->scan_beside));
            if (s->scan_beside) {
                s->scan_beside_k = ak_cuda_scan_beside_kernel(cfg->kv_dtype);
                s->pre_queue_k = ak_cuda_prefill_wgmma_queue_kernel(cfg->head_dim_qk, cfg->head_dim_vo, cfg->o_dtype);
                int queue_ctas = 0;
                if (s->pre_queue_k.fn) AK_TRY(ak_cuda_kernel_occupancy(&s->pre_queue_k, &queue_ctas));
                if (!s->pre_queue_k.fn || queue_ctas != ctas_per_sm) s->scan_beside = 0; /* (never) */
            }
        }
        if (!s->scan_k.fn) s->pre_clean_k.fn = NULL; /* no item is found clean: pre_k takes them all */
        s->tiles = (pf_tile *)malloc(sizeof(pf_tile) * (size_t)s->max_ptiles);
        s->pf_load = (int64_t *)malloc(sizeof(int64_t) * (size_t)s->prefill_ctas);
        s->pf_keys = (uint64_t *)malloc(sizeof(uint64_t) * 4 * (size_t)s->prefill_ctas);
        s->pf_count = (int *)malloc(sizeof(int) * ((size_t)PF_COUNT_SPREAD * s->prefill_ctas + 2));
        if (!s->tiles || !s->pf_load || !s->pf_keys || !s->pf_count)
            return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate the prefill plan scratch");
    }
    s->first_block = (int32_t *)malloc(sizeof(int32_t) * ((size_t)lim->max_reqs + 1));
    if (!s->first_block) return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate the plan's block scratch");
    const int max_tasks_ctas = s->max_tasks > 0 ? s->max_tasks : 1;
    /* by heads: a head's dim slices (grid.y) add blocks, not tasks a block */
    const int merge_rows = s->split ? cfg->num_qo_heads * s->merge_k.rows : 1; /* grid.y */
    /* MERGE_CTAS_PER_SM blocks an SM in the wide shape: a wide slice's
     * merge_sub blocks of grid.y take every merge_sub-th task */
    const int sub = s->merge_k.merge_sub > 1 ? s->merge_k.merge_sub : 1;
    s->merge_ctas = (info.num_sms * MERGE_CTAS_PER_SM + cfg->num_qo_heads * sub - 1) / (cfg->num_qo_heads * sub);
    if (s->merge_ctas > max_tasks_ctas) s->merge_ctas = max_tasks_ctas;
    s->merge_splits = s->max_splits > s->dec_splits ? s->max_splits : s->dec_splits;
    /* narrow slices for fewer tasks than would give each SM a block in the
     * wide shape; never for batch-invariant instances, as the two shapes add
     * a row's partials in different orders */
    if (sub > 1 && !cfg->batch_invariant) {
        const int wide_blocks = cfg->num_qo_heads * (s->merge_k.rows / sub); /* a task's */
        s->narrow_tasks = (info.num_sms + wide_blocks - 1) / wide_blocks;
    }
    /* grid.y counts heads (times their row tiles or dim slices; the scan
     * pass's, KV heads); CUDA allows 65535 */
    int64_t grid_y = merge_rows;
    if (s->scan_k.fn && cfg->num_kv_heads > grid_y) grid_y = cfg->num_kv_heads;
    if (s->split && (int64_t)cfg->num_kv_heads * s->row_tiles > grid_y) grid_y = (int64_t)cfg->num_kv_heads * s->row_tiles;
    if (grid_y > 65535)
        return ak_set_error(AK_ERR_UNSUPPORTED,
                            "cfg.num_qo_heads = %d (num_kv_heads %d): the kernels would need %lld blocks in a grid's y "
                            "dimension, CUDA allows 65535",
                            cfg->num_qo_heads, cfg->num_kv_heads, (long long)grid_y);

    size_t fixed = 0;
    const size_t meta_bytes = layout_meta(s, NULL, NULL, &fixed);
    s->fixed_bytes = fixed;
    const size_t partial = ((size_t)s->max_partials + s->pf_slots) * cfg->num_qo_heads;
    const size_t flags = (size_t)s->max_scans * cfg->num_kv_heads;
    const size_t dev_bytes = meta_bytes + partial * cfg->head_dim_vo * sizeof(float) + partial * sizeof(float) +
                             flags * sizeof(int32_t) + 2 * sizeof(int);
    AK_CUDA_TRY(cudaMalloc((void **)&s->dev, dev_bytes));
    /* zeroed once: no kernel can ever read garbage metadata */
    AK_CUDA_TRY(cudaMemset(s->dev, 0, dev_bytes));
    layout_meta(s, s->dev, &s->d, &fixed);
    if (s->max_slots > 0) /* all -1 */
        AK_CUDA_TRY(cudaMemset(s->d.slot_mapping, 0xff, sizeof(int64_t) * (size_t)s->max_slots));
    s->o_tmp = (float *)(s->dev + meta_bytes);
    s->lse_tmp = s->o_tmp + partial * cfg->head_dim_vo;
    s->scan_flags = (int32_t *)(s->lse_tmp + partial);
    s->item_queue = (int *)(s->scan_flags + flags);
    for (int i = 0; i < NUM_STAGING; i++) {
        AK_CUDA_TRY(cudaMallocHost((void **)&s->stg[i].host, meta_bytes));
        memset(s->stg[i].host, 0, meta_bytes);
        layout_meta(s, s->stg[i].host, &s->stg[i].m, &fixed);
        AK_CUDA_TRY(cudaEventCreateWithFlags(&s->stg[i].copied, cudaEventDisableTiming));
    }
    return AK_OK;
}

ak_status ak_cuda_engine_create(const ak_attn_config *cfg, const ak_limits *lim, engine_mode mode, void **out)
{
    engine_state *s = (engine_state *)calloc(1, sizeof *s);
    if (!s) return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate the CUDA backend state");
    s->cfg = *cfg;
    s->lim = *lim;
    s->mode = mode;
    const ak_status st = engine_create_inner(s);
    if (st != AK_OK) {
        ak_cuda_engine_destroy(s);
        return st;
    }
    *out = s;
    return AK_OK;
}

/* ---- plan: decode items, split-KV on the host ---------------------------------- */

/* Where the kernels find request r's blocks: key j's block id is
 * table[page_base + j / page_size] (plan_head.kv_table). In the plan's own
 * list a windowed request's blocks start at its first visible block
 * (kv_first_block, batch.c), so its page_base is moved back by as many
 * blocks; ragged: the first row. A device block table is read in place:
 * row r starts at r x its stride (batch.c keeps that within int32). */
static int page_base_of(const engine_state *s, const ak_batch *b, const ak_batch_meta *bm, int r)
{
    if (s->plan_table) return r * b->block_table_stride;
    return bm->kv_indptr[r] - (bm->kv_first_block ? bm->kv_first_block[r] : 0);
}

static int chunks_of(int len, int chunk) { return len <= chunk ? 1 : (len + chunk - 1) / chunk; }

/* The tokens an MLA item holds in this plan: mla_pack, or fewer where the
 * items could then not fill half the wave even split dec_splits ways (a
 * unit's splits are capped for the merge's sake). Measured on the H100
 * (16 heads, 1 x 32768, 2 tokens): both tokens in 64 items of 512 keys,
 * 38.1-38.4 us; a token each in 128 items, 36.2-36.3. Batch-invariant
 * instances always pack (a request's items must not depend on the batch). */
static int plan_pack(const engine_state *s, const ak_batch *b, const ak_batch_meta *bm)
{
    int pack = s->mla_pack;
    while (pack > 1 && !s->invariant_chunk) {
        int64_t items = 0; /* the most the units could split into */
        for (int r = 0; r < b->num_reqs && 2 * items < s->decode_ctas; r++) {
            const int q_len = bm->qo_indptr[r + 1] - bm->qo_indptr[r];
            const int splits = chunks_of(b->kv_lens[r] > 0 ? b->kv_lens[r] : 1, CHUNK_QUANTUM);
            items += (int64_t)(q_len + pack - 1) / pack * (splits < s->dec_splits ? splits : s->dec_splits);
        }
        if (2 * items >= s->decode_ctas) break;
        pack /= 2;
    }
    return pack;
}

/* The query tokens the decode kernel serves, each with its visible keys
 * [lo, end): every request of one query token (paged mode), or every query
 * token of every request (MLA mode: multi-token prediction and chunks, each
 * token with its own causal end; up to mla_pack consecutive tokens of a
 * request a unit, with the last one's keys). Written into s->units; returns
 * their count. */
static int decode_units(engine_state *s, const ak_batch *b, const ak_batch_meta *bm)
{
    const ak_attn_config *c = &s->cfg;
    const int pack = plan_pack(s, b, bm);
    s->plan_tokens = pack;
    int n = 0;
    for (int r = 0; r < b->num_reqs; r++) {
        const int q0 = bm->qo_indptr[r], q_len = bm->qo_indptr[r + 1] - q0, kv_len = b->kv_lens[r];
        if (q_len < 1 || (!s->all_decode && q_len != 1)) continue;
        for (int i = 0; i < q_len; i += pack) {
            const int pos = kv_len - q_len + i;
            decode_unit *u = &s->units[n++];
            u->req = r;
            u->tok = q0 + i;
            u->ntok = q_len - i < pack ? q_len - i : pack;
            /* (packed tokens have no window: lo is the first one's and theirs) */
            u->lo = ak_visible_lo(pos, c->window_left);
            u->end0 = ak_visible_hi(pos, kv_len, c->causal) + 1;
            u->end = ak_visible_hi(pos + u->ntok - 1, kv_len, c->causal) + 1;
            if (u->end0 < u->lo) u->end0 = u->lo;
            if (u->end < u->lo) u->end = u->lo;
        }
    }
    return n;
}

/* Work items for num_dec decode units: enough to fill one wave, at least
 * one per unit, at most dec_splits per unit. */
static int items_for(const engine_state *s, int num_dec)
{
    const int64_t cap = (int64_t)num_dec * s->dec_splits;
    const int64_t want = s->decode_ctas < cap ? s->decode_ctas : cap;
    return num_dec > want ? num_dec : (int)want;
}


static int round_up(int x, int q) { return (x + q - 1) / q * q; }

/* Items the units take in chunks of `chunk` keys; the count stops once it
 * passes `cap` (a bisection only asks whether it fits a budget, and plan()'s
 * host time is budgeted in microseconds). */
static int64_t items_at(const engine_state *s, int num_dec, int chunk, int64_t cap = INT64_MAX)
{
    int64_t n = 0;
    for (int i = 0; i < num_dec && n <= cap; i++) n += chunks_of(s->units[i].end - s->units[i].lo, chunk);
    return n;
}

/* The smallest chunk (a multiple of CHUNK_QUANTUM) whose chunk count over
 * every decode unit fits the item budget. */
static int pick_chunk(const engine_state *s, int num_dec, int budget, int max_len)
{
    int lo = CHUNK_QUANTUM, hi = round_up(max_len, CHUNK_QUANTUM);
    const int floor_split = (max_len + s->dec_splits - 1) / s->dec_splits;
    if (floor_split > lo) lo = round_up(floor_split, CHUNK_QUANTUM);
    if (hi < lo) hi = lo;
    while (lo < hi) {
        const int mid = (lo + hi) / 2 / CHUNK_QUANTUM * CHUNK_QUANTUM;
        if (items_at(s, num_dec, mid, budget) <= budget)
            hi = mid;
        else
            lo = mid + CHUNK_QUANTUM;
    }
    return lo;
}

/* The blocks of the wave take the decode items round by round, so the
 * number of items matters, not only their size: 64 requests of equal length
 * on 49 blocks (an fp8 decode, three blocks an SM) take two rounds of whole
 * requests, 0.65 of the wave busy, where each split in three takes four
 * rounds of a third (0.98); 32 requests on 49 blocks, one round of whole
 * requests (0.65), where thirds take two rounds (0.98). Given the chunk
 * picked for the first budget (first: INT32_MAX for no split), weighs the
 * chunks that fill 1 to BALANCE_ROUNDS more rounds and keeps the one of
 * least rounds x chunk (the longest item of a round) if it saves at least a
 * tenth (the merge and the partial states cost something).
 *
 * In MLA mode a split item's partial state is large beside its keys (a
 * block's 64 rows x 512 f32, written and read back by the merge: as many
 * bytes as 227 latent rows), so there an item that splits costs its chunk
 * plus that many keys. Without it, a chunk of 64 tokens on a 4096-token
 * prefix at 16 heads (16 items of 4 tokens) took four rounds of 128-key
 * items, 528 partials, 0.100 ms (H100), against 0.063 for a chunk of 128. */
static int split_keys(const engine_state *s)
{
    if (!s->all_decode) return 0;
    const ak_attn_config *c = &s->cfg;
    const int group = c->num_qo_heads / c->num_kv_heads;
    int rows = group * s->plan_tokens;
    if (rows > s->dec_k.rows && s->dec_k.rows > 0) rows = s->dec_k.rows;
    const int64_t key_bytes = (int64_t)c->head_dim_qk * (int64_t)ak_dtype_size(c->kv_dtype);
    return (int)((int64_t)rows * c->head_dim_vo * (int64_t)(2 * sizeof(float)) / key_bytes);
}

static int balance_chunk(const engine_state *s, int num_dec, int max_len, int first)
{
    const int C = s->decode_ctas, sk = split_keys(s);
    /* a round's cost: its longest item, and the partial state where split */
    auto item_cost = [&](int chunk) { return (int64_t)(chunk < max_len ? chunk + sk : max_len); };
    const int64_t rounds0 = (num_dec + C - 1) / C;
    const int64_t n0 = items_at(s, num_dec, first);
    int64_t best_cost = (n0 + C - 1) / C * item_cost(first) * 9 / 10;
    int best = first;
    for (int extra = 1; extra <= BALANCE_ROUNDS; extra++) {
        const int64_t budget = (rounds0 + extra) * C;
        /* every item of a budget may be a split one: it must fit the slots */
        if (budget > s->max_items || budget * s->mla_pack > s->max_partials) break;
        const int chunk = pick_chunk(s, num_dec, (int)budget, max_len);
        const int64_t n = items_at(s, num_dec, chunk);
        const int64_t cost = (n + C - 1) / C * item_cost(chunk);
        if (cost < best_cost) {
            best_cost = cost;
            best = chunk;
        }
    }
    return best;
}

/* Decode items and their merge tasks into m; returns the item count. */
static int plan_decode(engine_state *s, const ak_batch *b, const ak_batch_meta *bm, plan_meta *m, int *num_tasks)
{
    s->plan_packed = 0;
    const int num_dec = decode_units(s, b, bm);
    if (num_dec == 0) return 0;
    int max_len = 1;
    for (int i = 0; i < num_dec; i++)
        if (s->units[i].end - s->units[i].lo > max_len) max_len = s->units[i].end - s->units[i].lo;
    /* batch-invariant: one fixed chunk; else the smallest that fills the
     * wave (with no spare items nothing is split, so no merge is needed) */
    const int budget = items_for(s, num_dec);
    const int chunk = s->invariant_chunk ? s->invariant_chunk
                      : balance_chunk(s, num_dec, max_len,
                                      budget > num_dec ? pick_chunk(s, num_dec, budget, max_len) : INT32_MAX);
    int n = 0, partials = 0;
    for (int x = 0; x < num_dec; x++) {
        const decode_unit *u = &s->units[x];
        const int nt = u->ntok;
        if (nt > 1) s->plan_packed = 1;
        int k = chunks_of(u->end - u->lo, chunk);
        if (k > 1 && partials + k * nt > s->max_partials) k = 1; /* never reached: the budgets fit the slots */
        for (int i = 0; i < k; i++) {
            decode_item it;
            it.req = u->req;
            it.tok = u->tok;
            it.page_base = page_base_of(s, b, bm, u->req);
            it.lo = u->lo;
            it.kv_begin = u->lo + i * (k > 1 ? chunk : 0);
            it.kv_end = k > 1 && i < k - 1 ? it.kv_begin + chunk : u->end;
            it.out = k > 1 ? partials + i * nt : -1;
            /* token j sees keys up to end0 + j (causal): the first one misses
             * the item's last kv_end - end0 (fewer than nt: end = end0 + nt - 1) */
            it.ntok = (int16_t)nt;
            it.hid = (int16_t)(it.kv_end > u->end0 ? it.kv_end - u->end0 : 0);
            m->items[n++] = it;
        }
        if (k > 1) {
            for (int j = 0; j < nt; j++) {
                merge_task t = {u->tok + j, partials + j, k, nt};
                m->tasks[(*num_tasks)++] = t;
            }
            partials += k * nt;
        }
    }
    return n;
}

/* ---- plan: prefill items ------------------------------------------------------- */

/* The cost of a prefill item: its key tiles, plus one for the q load and the
 * epilogue. */
static int item_cost(const prefill_item *it) { return (it->kv_end - it->kv_begin + CHUNK_QUANTUM - 1) / CHUNK_QUANTUM + 1; }

static int by_cost_desc(const void *a, const void *b)
{
    const int ca = ((const pf_tile *)a)->cost, cb = ((const pf_tile *)b)->cost;
    return ca > cb ? -1 : ca < cb;
}

/* Requests by their heaviest tile, each request's tiles heaviest first;
 * ties by position (tokens, then keys: every tile differs in one), so that
 * the order, and so which tiles the last round's cut takes, is the plan's
 * alone */
static int by_request_desc(const void *a, const void *b)
{
    const pf_tile *x = (const pf_tile *)a, *y = (const pf_tile *)b;
    if (x->req_max != y->req_max) return x->req_max > y->req_max ? -1 : 1;
    if (x->req != y->req) return x->req < y->req ? -1 : 1;
    const int c = by_cost_desc(a, b);
    if (c) return c;
    if (x->it.tok0 != y->it.tok0) return x->it.tok0 < y->it.tok0 ? -1 : 1;
    return x->it.kv_begin < y->it.kv_begin ? -1 : x->it.kv_begin > y->it.kv_begin;
}

/* Prefill items of every request with min_prefill_q or more query tokens
 * (two, or one in varlen mode), in the order the fixed grid takes them, and
 * (when splitting) the merge tasks of split tiles; returns the item count
 * (padding included). Partial slots of prefill splits start after the decode
 * ones (max_partials). */
/* The scan tasks of a request's keys [lo, kv_len) (those some query token
 * sees), in steps of *step keys: how many. */
static int scan_tasks_of(const engine_state *s, int lo, int kv_len, int *step)
{
    if (kv_len <= lo) return 0;
    const int64_t keys = (int64_t)kv_len - lo; /* (int64: up to AK_MAX_LEN plus a step) */
    const int k = (int)((keys + SCAN_TASKS_PER_REQ - 1) / SCAN_TASKS_PER_REQ);
    *step = k < s->scan_keys ? s->scan_keys : k;
    return (int)((keys + *step - 1) / *step);
}

/* The scan tasks of a request whose K/V rows start at page_base and whose
 * keys [lo, kv_len) some token sees, at m->scans[*at] on when they fit
 * below s->max_scans (*at moves past them); returns the first task's index
 * and their count in *count, or -1 (then its items run checked). */
static int plan_scan(const engine_state *s, plan_meta *m, int page_base, int lo, int kv_len, int *at, int *count)
{
    int step = 0;
    const int n = scan_tasks_of(s, lo, kv_len, &step);
    *count = 0;
    if (n == 0 || *at + n > s->max_scans) return -1;
    const int first = *at;
    for (int x = 0; x < n; x++) { /* (by count: lo + n x step may pass INT_MAX) */
        const int k = lo + x * step;
        const scan_task t = {page_base, k, kv_len - k < step ? kv_len : k + step, 0};
        m->scans[(*at)++] = t;
    }
    *count = n;
    return first;
}

/* Whether a request of q_len query tokens is long enough for a pass over
 * its K/V rows (SCAN_MIN_ROWS) */
static bool rows_worth_scan(const engine_state *s, int q_len)
{
    return (int64_t)q_len * (s->cfg.num_qo_heads / s->cfg.num_kv_heads) >= SCAN_MIN_ROWS;
}

/* Whether a shorter request's K/V rows are worth the pass's read without
 * marks (SCAN_ROWS_KEYS: its rows against the keys its tokens see), in a
 * plan whose kernel runs the clean items itself (not DP 256's two passes);
 * AK_CUDA_SCAN_SHORT_ROWS=1: every shorter request's. */
static bool rows_worth_rows(const engine_state *s, int q_len, int keys)
{
    if (s->scan_short_rows == 1) return true;
    return s->pre_k.unchecked && (int64_t)q_len * (s->cfg.num_qo_heads / s->cfg.num_kv_heads) * SCAN_ROWS_KEYS >= keys;
}

/* Sorts key[0, n) ascending where the keys compare by their bits from
 * `shift` up alone, keeping the order of equal ones (the callers' low bits
 * are their positions, ascending): by counting (count: [max_spread + 2])
 * when those values lie within max_spread of each other, else by
 * std::sort (the same order: the low bits break the ties as the positions
 * did). tmp: [n]. */
static void order_keys(uint64_t *key, uint64_t *tmp, int n, int shift, int *count, int max_spread)
{
    if (n < 2) return;
    uint64_t lo = key[0] >> shift, hi = lo;
    for (int i = 1; i < n; i++) {
        const uint64_t h = key[i] >> shift;
        lo = h < lo ? h : lo;
        hi = h > hi ? h : hi;
    }
    if (hi == lo) return;
    if (hi - lo > (uint64_t)max_spread) {
        std::sort(key, key + n);
        return;
    }
    const int span = (int)(hi - lo) + 1;
    for (int i = 0; i <= span; i++) count[i] = 0;
    for (int i = 0; i < n; i++) count[(key[i] >> shift) - lo + 1]++;
    for (int i = 1; i <= span; i++) count[i] += count[i - 1];
    for (int i = 0; i < n; i++) tmp[count[(key[i] >> shift) - lo]++] = key[i];
    memcpy(key, tmp, sizeof(uint64_t) * (size_t)n);
}

/* Cuts prefill tile i's keys into chunks of `chunk` keys (the last one
 * shorter; a multiple of PREFILL_CHUNK_ALIGN, so that fewer chunks stay
 * within the bounds create() sized by), the first in place and the others
 * appended at *n, with partial slots from *slots on and a merge task for
 * each of its tokens. Leaves it whole where that scratch would not hold
 * them (never, within the bounds, for the splits of heavy tiles). */
static void split_tile(engine_state *s, plan_meta *m, int i, int chunk, int *n, int *slots, int *num_tasks)
{
    const prefill_item it = s->tiles[i].it;
    const int len = it.kv_end - it.kv_begin;
    const int k = chunks_of(len, chunk);
    if (k < 2 || *slots + k * it.ntok > s->pf_slots || *n + k - 1 > s->max_ptiles ||
        *num_tasks + it.ntok > s->max_tasks)
        return;
    const int base = s->max_partials + *slots;
    for (int x = 0; x < k; x++) {
        prefill_item part = it;
        part.kv_begin = it.kv_begin + x * chunk;
        part.kv_end = x < k - 1 ? part.kv_begin + chunk : it.kv_end;
        part.out = base + x * it.ntok;
        pf_tile *dst = x == 0 ? &s->tiles[i] : &s->tiles[(*n)++];
        dst->it = part;
        dst->cost = item_cost(&part);
        dst->req = s->tiles[i].req;
        dst->req_max = s->tiles[i].req_max;
    }
    for (int t = 0; t < it.ntok; t++) {
        merge_task task = {it.tok0 + t, base + t, k, it.ntok};
        m->tasks[(*num_tasks)++] = task;
    }
    *slots += k * it.ntok;
}

static ak_status plan_prefill(engine_state *s, const ak_batch *b, const ak_batch_meta *bm, plan_meta *m,
                              int *num_tasks, int *num_pitems, int *num_scans, int *num_long_scans)
{
    const ak_attn_config *c = &s->cfg;
    const int P = s->prefill_ctas, nt = s->ptok, rows = c->num_kv_heads * s->prow_tiles;
    int n = 0;
    int64_t total = 0;
    /* The scan tasks: the long requests' first; then, where a run without
     * marks scans them too (short_rows), the shorter requests' whose rows
     * are worth it (rows_worth_rows); then the other shorter ones' where
     * their work is worth it to a run with marks (SCAN_SHORT_MIN_FLOP) */
    int long_at = 0, rows_at = 0, short_at = 0;
    bool scan_short = false, short_rows = false;
    *num_long_scans = 0;
    if (s->scan_k.fn) {
        int long_total = 0, rows_total = 0, decodes = 0;
        double work = 0.0, work_rows = 0.0;
        const double row_flop = 2.0 * (c->head_dim_qk + c->head_dim_vo) * c->num_qo_heads;
        for (int pass = 0; pass < 2; pass++) /* (the rows' tasks go after every long request's) */
            for (int r = 0; r < b->num_reqs; r++) {
                const int q_len = bm->qo_indptr[r + 1] - bm->qo_indptr[r];
                decodes += pass == 0 && q_len > 0 && q_len < s->min_prefill_q;
                if (q_len < s->min_prefill_q) continue;
                const int kv_len = b->kv_lens[r], prefix = kv_len - q_len, lo = ak_visible_lo(prefix, c->window_left);
                int step = 0;
                const int k = scan_tasks_of(s, lo, kv_len, &step);
                if (rows_worth_scan(s, q_len)) {
                    if (pass == 0) long_total += long_total + k <= s->max_scans ? k : 0; /* (as plan_scan) */
                    continue;
                }
                if (pass == 1) {
                    if (rows_worth_rows(s, q_len, kv_len - lo))
                        rows_total += long_total + rows_total + k <= s->max_scans ? k : 0;
                    continue;
                }
                /* the keys its tokens see: the prefix's, and causal the half of its own */
                const double w =
                    row_flop * q_len * (c->causal ? (prefix - lo) + 0.5 * (q_len + 1) : (double)(kv_len - lo));
                work += w;
                if (rows_worth_rows(s, q_len, kv_len - lo)) work_rows += w;
            }
        /* (ragged K/V have no marks) */
        const double min_work = decodes > 0 ? SCAN_SHORT_MIN_FLOP : 0.0;
        scan_short = !s->ragged && (s->scan_short >= 0 ? s->scan_short == 1 : work > 0.0 && work >= min_work);
        const double rows_min = min_work > SCAN_ROWS_MIN_FLOP ? min_work : SCAN_ROWS_MIN_FLOP;
        short_rows = rows_total > 0 && (s->scan_short_rows == 1 || (s->scan_short_rows < 0 && work_rows >= rows_min));
        rows_at = *num_long_scans = long_total;
        if (short_rows) *num_long_scans += rows_total;
        short_at = *num_long_scans;
    }
    for (int r = 0; r < b->num_reqs; r++) {
        const int q0 = bm->qo_indptr[r], q_len = bm->qo_indptr[r + 1] - q0;
        if (q_len < s->min_prefill_q) continue;
        const int kv_len = b->kv_lens[r], prefix = kv_len - q_len;
        int scan_n = 0, scan = -1;
        const int lo_seen = ak_visible_lo(prefix, c->window_left);
        if (s->scan_k.fn && rows_worth_scan(s, q_len))
            scan = plan_scan(s, m, page_base_of(s, b, bm, r), lo_seen, kv_len, &long_at, &scan_n);
        else if (short_rows && rows_worth_rows(s, q_len, kv_len - lo_seen))
            scan = plan_scan(s, m, page_base_of(s, b, bm, r), lo_seen, kv_len, &rows_at, &scan_n);
        else if (scan_short)
            scan = plan_scan(s, m, page_base_of(s, b, bm, r), lo_seen, kv_len, &short_at, &scan_n);
        const int first = n;
        int req_max = 0;
        for (int j = 0; j < q_len; j += nt) {
            prefill_item it;
            it.tok0 = q0 + j;
            it.ntok = q_len - j < nt ? q_len - j : nt;
            it.pos0 = prefix + j;
            it.page_base = page_base_of(s, b, bm, r);
            const int pos_last = it.pos0 + it.ntok - 1;
            const int lo = ak_visible_lo(it.pos0, c->window_left);
            const int hi = ak_visible_hi(pos_last, kv_len, c->causal);
            it.kv_begin = lo;
            it.kv_end = hi + 1 > lo ? hi + 1 : lo;
            it.out = -1;
            it.scan = scan;
            it.scan_n = scan_n;
            it.row = 0; /* (the dealing sets each item's row) */
            it.kv_len = kv_len;
            it.unused = 0;
            if (n >= s->max_ptiles) return ak_set_error(AK_ERR_INTERNAL, "prefill items exceed their capacity");
            s->tiles[n].it = it;
            s->tiles[n].cost = item_cost(&it);
            s->tiles[n].req = r;
            total += s->tiles[n].cost;
            if (s->tiles[n].cost > req_max) req_max = s->tiles[n].cost;
            n++;
        }
        for (int i = first; i < n; i++) s->tiles[i].req_max = req_max;
    }
    *num_scans = scan_short ? short_at : *num_long_scans;
    if (n == 0) {
        *num_pitems = 0;
        return AK_OK;
    }
    /* split-KV: a tile costing more than a fair share of the wave (every
     * row's total over the blocks, total x rows / P) would finish last alone;
     * cut its keys into chunks of that share (which keeps the bounds
     * create() sized the buffers by: prefill_ctas / rows blocks a row, rounded up). Not in varlen
     * mode: its runs are one launch, with no merge after it; not when batch
     * invariant: the share depends on the rest of the batch. */
    const int64_t share = (total * rows + P - 1) / P;
    const int min_chunk = MIN_PREFILL_CHUNK;
    int slots = 0;
    const int n_tiles = n;
    for (int i = 0; s->split && !s->invariant_chunk && i < n_tiles; i++) {
        const int len = s->tiles[i].it.kv_end - s->tiles[i].it.kv_begin;
        if (s->tiles[i].cost <= share || len < 2 * min_chunk) continue;
        int chunk = (int)share * CHUNK_QUANTUM; /* share < cost <= len / 64 + 2: no overflow */
        if (chunk < min_chunk) chunk = min_chunk;
        if (len > (int64_t)chunk * s->max_splits) chunk = round_up((len + s->max_splits - 1) / s->max_splits,
                                                                   CHUNK_QUANTUM);
        split_tile(s, m, i, round_up(chunk, PREFILL_CHUNK_ALIGN), &n, &slots, num_tasks);
    }
    /* The requests by their heaviest tile (the one that sees the most keys),
     * each request's tiles heaviest first, dealt round by round (P items,
     * the round's heaviest to the block with the least cost so far; a tile
     * once for each row), so each block's total stays close to total x
     * rows / P. The blocks then work on a few
     * requests at a time, whose K/V stay in L2. Ordered by the tiles' cost
     * alone, a batch of equal prompts had every block on another request (16
     * x 1024 at 32/8 heads: 128 requests x KV heads, 64 MB of K/V at once);
     * dealt in a snake order (the order by cost's way to even the blocks),
     * the rounds of a request-grouped list no longer pair heavy and light
     * tiles. Measured (H100): BENCHMARKS.md, "prefill items grouped by
     * request". Holes in the last round are padding. */
    qsort(s->tiles, n, sizeof *s->tiles, by_request_desc);
    /* A sparse last round: when the items leave the last round a few of
     * the P (at most P / TAIL_SPLIT_FRACTION), those few blocks run one
     * item more than the rest, a whole round's time (3% of a uniform
     * non-causal batch of 31 rounds). The list's last tiles, whose rows
     * fill that round, are then cut over their keys into as many chunks
     * as spread them over the wave (at most len / MIN_PREFILL_CHUNK of
     * them, rounded up to PREFILL_CHUNK_ALIGN keys, the last one shorter):
     * the lightest of the list, dealt last, a chunk to each block the whole
     * tiles left lightest. A causal list ends in its lightest
     * tiles, too short to cut. Measured (H200): BENCHMARKS.md. */
    const int tail = (int)((int64_t)n * rows % P);
    if (s->split && !s->invariant_chunk && tail > 0 && tail <= P / TAIL_SPLIT_FRACTION) {
        const int m_tail = (tail + rows - 1) / rows, n_whole = n;
        const int fill = P / (m_tail * rows); /* chunks a tile that spread its rows over P blocks */
        for (int i = n_whole - m_tail; i < n_whole; i++) {
            if (s->tiles[i].it.out >= 0) continue; /* (a chunk already) */
            const int len = s->tiles[i].it.kv_end - s->tiles[i].it.kv_begin;
            int k = len / min_chunk < fill ? len / min_chunk : fill;
            k = k < s->max_splits ? k : s->max_splits;
            if (k >= 2) split_tile(s, m, i, round_up((len + k - 1) / k, PREFILL_CHUNK_ALIGN), &n, &slots, num_tasks);
        }
    }
    /* Every tile once a row: item v of the list is tile v / rows at row v %
     * rows (a round holds a few tiles' rows side by side, of one cost). A
     * round and the blocks are ordered by 64-bit keys rather than by moving
     * the tiles, and by counting where the keys' spread allows (order_keys):
     * the round by cost, falling, then position (a run of costs a request
     * it holds); the blocks by load, then index. Measured (the H200's host,
     * 16 x 1024 at 32/8 heads, 4,096 items on 132 blocks): plan() in half
     * the time of sorting expanded copies of the tiles (BENCHMARKS.md) */
    const int64_t items = (int64_t)n * rows;
    const int rounds = (int)((items + P - 1) / P);
    if ((int64_t)rounds * P > s->max_pitems) return ak_set_error(AK_ERR_INTERNAL, "prefill items exceed their capacity");
    int64_t *load = s->pf_load;
    uint64_t *rk = s->pf_keys, *bk = rk + P, *at = bk + P, *tmp = at + P;
    /* the blocks' keys: load << bshift | block. They fit: an item costs
     * below 2^26 (keys / 64 + 2), a block takes at most rounds < 2^30 / P
     * items (max_pitems < 2^30) and P >= 2^(bshift - 1), so its load is
     * below 2^(57 - bshift) */
    int bshift = 0;
    while ((1 << bshift) < P) bshift++;
    const uint64_t bmask = ((uint64_t)1 << bshift) - 1;
    for (int x = 0; x < P; x++) load[x] = 0;
    int tile = 0, row = 0; /* item v's */
    for (int j = 0; j < rounds; j++) {
        const int64_t v0 = (int64_t)j * P;
        const int in_round = items - v0 < P ? (int)(items - v0) : P;
        for (int k = 0; k < in_round; k++) {
            rk[k] = (uint64_t)(uint32_t)(INT_MAX - s->tiles[tile].cost) << 32 | (uint32_t)k;
            at[k] = (uint64_t)tile << 32 | (uint32_t)row;
            if (++row == rows) row = 0, tile++;
        }
        order_keys(rk, tmp, in_round, 32, s->pf_count, PF_COUNT_SPREAD * P);
        for (int x = 0; x < P; x++) bk[x] = (uint64_t)load[x] << bshift | (uint64_t)x;
        order_keys(bk, tmp, P, bshift, s->pf_count, PF_COUNT_SPREAD * P);
        prefill_item *round = &m->pitems[v0];
        if (in_round < P) memset(round, 0, sizeof(prefill_item) * (size_t)P); /* (holes: padding) */
        for (int k = 0; k < in_round; k++) {
            const int x = (int)(bk[k] & bmask);
            const uint64_t tr = at[rk[k] & 0xffffffffu];
            const pf_tile *t = &s->tiles[tr >> 32];
            round[x] = t->it;
            round[x].row = (int)(uint32_t)tr;
            load[x] += t->cost;
        }
    }
    *num_pitems = rounds * P;
    return AK_OK;
}

/* The staging buffer this plan writes: the core builds the batch metadata
 * straight into it (ragged: kv_indptr in tokens, no block ids, no cache
 * slots), so plan() copies nothing twice. */
ak_status ak_cuda_engine_meta_buffers(void *state, ak_batch_meta *meta)
{
    engine_state *s = (engine_state *)state;
    staging *st = &s->stg[s->next_stg];
    if (st->in_flight) {
        /* the copy from NUM_STAGING plans ago must have left this buffer */
        AK_CUDA_TRY(cudaEventSynchronize(st->copied));
        st->in_flight = 0;
    }
    memset(meta, 0, sizeof *meta);
    meta->qo_indptr = st->m.qo_indptr;
    meta->kv_indptr = st->m.kv_indptr;
    meta->kv_indices = s->ragged ? NULL : st->m.kv_indices;
    meta->slot_mapping = s->ragged ? NULL : st->m.slot_mapping;
    meta->kv_first_block = s->ragged ? NULL : s->first_block; /* a host scratch: the items carry it */
    return AK_OK;
}

/* A device block table must be memory the kernels of cfg's device read:
 * device or managed memory of that device (pageable host memory would fault
 * in the kernels). Asked once per table address. */
static ak_status check_table_memory(engine_state *s, const int32_t *table)
{
    if ((uintptr_t)table % sizeof(int32_t))
        return ak_set_error(AK_ERR_INVALID_ARG, "batch.device_block_table (%p) is not 4-byte aligned",
                            (const void *)table);
    if (table == s->checked_table) return AK_OK;
    cudaPointerAttributes at;
    const cudaError_t e = cudaPointerGetAttributes(&at, table);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ak_set_error(AK_ERR_INVALID_ARG, "batch.device_block_table (%p): %s", (const void *)table,
                            cudaGetErrorString(e));
    }
    if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "batch.device_block_table (%p) is host memory, not memory of cuda:%d (cfg.device); a "
                            "host table goes in batch.block_table",
                            (const void *)table, s->cfg.device.index);
    if (at.type == cudaMemoryTypeDevice && at.device != s->cfg.device.index)
        return ak_set_error(AK_ERR_INVALID_ARG, "batch.device_block_table (%p) is memory of cuda:%d, cfg.device is cuda:%d",
                            (const void *)table, at.device, s->cfg.device.index);
    s->checked_table = table;
    return AK_OK;
}

/* plan()'s host-to-device copies, joined: an array's copy extends the one
 * pending when the bytes between them (the unused end of the arrays before,
 * never read: every kernel stops at the plan's counts) are at most
 * COPY_JOIN_GAP. Measured on an H100's host (BENCHMARKS.md): a call costs
 * 2-3 us, and a small copy's bytes cost host time too (a mixed step's 17.9 KB
 * joined across gaps of up to 16 KB planned slower than in three calls);
 * gaps of 4 KB leave the mixed step as it was and join the rest. */
#define COPY_JOIN_GAP 4096
typedef struct {
    char *dev;          /* the device metadata's base */
    const char *host;   /* the staging buffer's: the same layout */
    size_t begin, end;  /* the pending copy's offsets; empty when equal */
} copy_spans;

static ak_status copy_flush(copy_spans *c, cudaStream_t cs)
{
    if (c->end > c->begin)
        AK_CUDA_TRY(cudaMemcpyAsync(c->dev + c->begin, c->host + c->begin, c->end - c->begin, cudaMemcpyHostToDevice,
                                    cs));
    c->begin = c->end = 0;
    return AK_OK;
}

/* Bytes [dst, dst + bytes) of the device metadata, from the staging
 * buffer's same offsets; arrays come in layout order. */
static ak_status copy_span(copy_spans *c, void *dst, size_t bytes, cudaStream_t cs)
{
    if (bytes == 0) return AK_OK;
    const size_t off = (size_t)((char *)dst - c->dev);
    if (c->end > c->begin && off >= c->end && off - c->end <= COPY_JOIN_GAP) {
        c->end = off + bytes;
        return AK_OK;
    }
    AK_TRY(copy_flush(c, cs));
    c->begin = off;
    c->end = off + bytes;
    return AK_OK;
}

ak_status ak_cuda_engine_plan(void *state, const ak_batch *b, const ak_batch_meta *bm, ak_stream stream)
{
    engine_state *s = (engine_state *)state;
    staging *st = &s->stg[s->next_stg]; /* bm's arrays: ak_cuda_engine_meta_buffers */
    const int R = b->num_reqs;
    int num_tasks = 0, num_pitems = 0, num_scans = 0, num_long_scans = 0;
    /* a device block table: read in place, no block list (the core built none) */
    s->plan_table = !s->ragged && !bm->kv_indices && R > 0 ? b->device_block_table : NULL;
    if (s->plan_table) AK_TRY(check_table_memory(s, s->plan_table));
    const int num_items = s->split ? plan_decode(s, b, bm, &st->m, &num_tasks) : 0;
    /* a decode instance of cuda_paged never gets here with q_len > 1
     * (ak_batch_build_meta refuses such a batch) */
    if (s->prefill) AK_TRY(plan_prefill(s, b, bm, &st->m, &num_tasks, &num_pitems, &num_scans, &num_long_scans));
    plan_head *h = st->m.head;
    h->counts[COUNT_DECODE] = num_items;
    h->counts[COUNT_PREFILL] = num_pitems;
    h->counts[COUNT_MERGE] = num_tasks;
    h->counts[COUNT_SCAN] = num_scans;
    h->scan_long = num_long_scans;
    h->kv_table = s->ragged ? NULL : s->plan_table ? s->plan_table : s->d.kv_indices;
    h->merge_narrow = num_tasks < s->narrow_tasks;
    h->table_early = !s->plan_table;
    h->mla_packed = s->split && s->plan_packed;
    h->unused[0] = h->unused[1] = 0;
    if (s->plan_table) {
        memcpy(st->m.req_qo, bm->qo_indptr, sizeof(int32_t) * ((size_t)R + 1));
        memcpy(st->m.req_kv, b->kv_lens, sizeof(int32_t) * (size_t)R);
    }

    /* asynchronous copies into the fixed device buffers, used lengths only
     * (the head, the request arrays and the decode items are one array),
     * joined by copy_span */
    cudaStream_t cs = ak_cuda_stream(stream);
    const int num_tokens = bm->qo_indptr[R];
    const int num_indices = s->ragged || s->plan_table ? 0 : bm->kv_indptr[R];
    const size_t head_bytes = (size_t)((char *)st->m.items - (char *)st->m.head) + sizeof(decode_item) * num_items;
    copy_spans cp = {s->dev, st->host, 0, 0};
    AK_TRY(copy_span(&cp, s->d.head, head_bytes, cs));
    AK_TRY(copy_span(&cp, s->d.tasks, sizeof(merge_task) * num_tasks, cs));
    AK_TRY(copy_span(&cp, s->d.pitems, sizeof(prefill_item) * num_pitems, cs));
    AK_TRY(copy_span(&cp, s->d.scans, sizeof(scan_task) * num_scans, cs));
    AK_TRY(copy_span(&cp, s->d.kv_indices, sizeof(int32_t) * num_indices, cs));
    /* Slots past this plan's tokens become -1 on the device (only those a
     * larger earlier plan left behind need writing): a kv_update captured
     * with more tokens than this plan has then skips the extra rows. The
     * slot mapping is the last array copied: the device's slots past the
     * copied ones must stay -1, so no copy runs across them. */
    if (!s->ragged) {
        const int slots = num_tokens > s->slot_hw ? num_tokens : s->slot_hw;
        if (s->plan_table) {
            AK_TRY(copy_flush(&cp, cs));
            /* from the table itself, after the request arrays land */
            AK_TRY(ak_cuda_table_slots(s->plan_table, b->block_table_stride, s->cfg.page_size,
                                       s->lim.num_cache_blocks, s->d.req_qo, s->d.req_kv, R, num_tokens, slots,
                                       s->d.slot_mapping, cs));
        } else {
            for (int i = num_tokens; i < slots; i++) st->m.slot_mapping[i] = -1;
            AK_TRY(copy_span(&cp, s->d.slot_mapping, sizeof(int64_t) * slots, cs));
        }
        s->slot_hw = num_tokens;
    }
    AK_TRY(copy_flush(&cp, cs));
    AK_CUDA_TRY(cudaEventRecord(st->copied, cs));
    st->in_flight = 1;
    s->next_stg = (s->next_stg + 1) % NUM_STAGING;

    s->num_items = num_items;
    s->num_pitems = num_pitems;
    s->num_tasks = num_tasks;
    s->num_scans = num_scans;
    s->num_long_scans = num_long_scans;
    return AK_OK;
}

/* ---- run ------------------------------------------------------------------------- */

static const char *mode_name(const engine_state *s)
{
    return s->mode == ENGINE_MODE_VARLEN ? "cuda_varlen" : s->mode == ENGINE_MODE_MLA ? "cuda_mla" : "cuda_paged";
}

/* 16-byte vector access needs aligned rows: base and row strides, multiples
 * of epc elements (16 bytes: 8 16-bit elements, 16 fp8 ones); vec 0 (the
 * portable kernel's element copies, for dims that are not whole chunks)
 * needs nothing. */
static ak_status check_aligned_as(const engine_state *s, int vec, int epc, const char *name, const void *data,
                                  int64_t s0, int64_t s1)
{
    if (!vec) return AK_OK;
    if ((uintptr_t)data % 16 != 0 || s0 % epc != 0 || s1 % epc != 0)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "%s: %s needs 16-byte aligned data and row strides that are multiples of "
                            "%d elements (stride %lld, %lld)",
                            name, mode_name(s), epc, (long long)s0, (long long)s1);
    return AK_OK;
}
static ak_status check_aligned(const engine_state *s, const char *name, const void *data, int64_t s0, int64_t s1)
{
    return check_aligned_as(s, s->vec, 8, name, data, s0, s1);
}
static ak_status check_aligned_kv(const engine_state *s, const char *name, const void *data, int64_t s0, int64_t s1)
{
    return check_aligned_as(s, s->kv_vec, s->kv_epc, name, data, s0, s1);
}

/* The kernels' K/V addressing (kv_addr.h). */
static void set_kv_strides(attn_params *p, const void *k, const void *v, ak_kv_strides ka, ak_kv_strides va)
{
    p->k_pool = k;
    p->v_pool = v;
    p->k_block_stride = ka.block;
    p->v_block_stride = va.block;
    p->k_stride_slot = ka.slot;
    p->k_stride_head = ka.head;
    p->v_stride_slot = va.slot;
    p->v_stride_head = va.head;
}

/* Where the loader finds K/V: the paged cache's pools, or the ragged tensors
 * as pages of one token (load_kv_tile in attn.cuh). */
static ak_status set_kv_addressing(const engine_state *s, const ak_run_args *a, attn_params *p)
{
    if (s->ragged) {
        /* MLA: no V tensor, the value is the start of each K row */
        const ak_tensor *k = a->k, *v = s->cfg.mla ? a->k : a->v;
        AK_TRY(check_aligned_kv(s, "args.k", k->data, k->stride[0], k->stride[1]));
        AK_TRY(check_aligned_kv(s, "args.v", v->data, v->stride[0], v->stride[1]));
        /* with equal head dims the loader keeps one offset for K and V */
        if (s->cfg.head_dim_qk == s->cfg.head_dim_vo && k->stride[1] != v->stride[1])
            return ak_set_error(AK_ERR_INVALID_ARG,
                                "args.v->stride[1] = %lld differs from args.k->stride[1] = %lld: %s reads K and V "
                                "with one head stride",
                                (long long)v->stride[1], (long long)k->stride[1], mode_name(s));
        set_kv_strides(p, k->data, v->data, ak_ragged_strides(k), ak_ragged_strides(v));
        p->kv_scale_kind = a->kv_scale_kind;
        p->k_scale = a->k_scale;
        p->v_scale = a->v_scale;
        p->num_blocks = INT_MAX;
        p->page_size = 1;
        p->page_shift = 0;
        p->ragged = 1;
        return AK_OK;
    }
    const ak_paged_kv *kv = a->kv;
    const ak_kv_strides ka = ak_paged_k_strides(kv), va = ak_paged_v_strides(kv);
    AK_TRY(check_aligned_kv(s, "args.kv->k_data", kv->k_data, ka.block, 0));
    AK_TRY(check_aligned_kv(s, "args.kv->v_data", kv->v_data, va.block, 0));
    set_kv_strides(p, kv->k_data, kv->v_data, ka, va);
    p->kv_scale_kind = kv->scale_kind;
    p->k_scale = kv->k_scale;
    p->v_scale = kv->v_scale;
    p->kv_marks = kv->marks;
    p->num_blocks = kv->num_blocks;
    p->page_size = s->cfg.page_size;
    p->page_shift = (s->cfg.page_size & (s->cfg.page_size - 1)) == 0 ? __builtin_ctz(s->cfg.page_size) : -1;
    p->ragged = 0;
    return AK_OK;
}

ak_status ak_cuda_engine_run(void *state, const ak_run_args *a, ak_stream stream)
{
    engine_state *s = (engine_state *)state;
    const ak_attn_config *c = &s->cfg;
    AK_TRY(check_aligned(s, "args.q", a->q->data, a->q->stride[0], a->q->stride[1]));
    AK_TRY(check_aligned(s, "args.o", a->o->data, a->o->stride[0], a->o->stride[1]));
    if (a->lse && a->lse->stride[1] != 1)
        return ak_set_error(AK_ERR_INVALID_ARG, "args.lse->stride[1] = %lld, %s needs 1",
                            (long long)a->lse->stride[1], mode_name(s));

    attn_params p;
    memset(&p, 0, sizeof p);
    AK_TRY(set_kv_addressing(s, a, &p));
    p.q = a->q->data;
    p.q_stride_tok = a->q->stride[0];
    p.q_stride_head = a->q->stride[1];
    p.o = a->o->data;
    p.o_stride_tok = a->o->stride[0];
    p.o_stride_head = a->o->stride[1];
    p.lse = a->lse ? (float *)a->lse->data : NULL;
    p.lse_stride_tok = a->lse ? a->lse->stride[0] : 0;
    p.o_tmp = s->o_tmp;
    p.lse_tmp = s->lse_tmp;
    p.head = s->d.head;
    p.items = s->d.items;
    p.pitems = s->d.pitems;
    p.tasks = s->d.tasks;
    p.scans = s->d.scans;
    p.scan_flags = s->scan_flags;
    p.item_queue = s->item_queue;
    p.num_qo_heads = c->num_qo_heads;
    p.num_kv_heads = c->num_kv_heads;
    p.group = c->num_qo_heads / c->num_kv_heads;
    kv_maps k_map, kv_map; /* the MLA and prefill kernels' second parameters (copied at the launch) */
    memset(&k_map, 0, sizeof k_map);
    memset(&kv_map, 0, sizeof kv_map);
    p.k_tma = s->mla_tma && !s->ragged ? ak_cuda_mla_tma_map(&p, &k_map.k) : 0;
    p.row_tiles = s->row_tiles;
    p.prow_tiles = s->prow_tiles;
    p.prow_heads = s->prow_heads;
    p.prow_seg_log2 = s->prow_seg < s->pre_k.rows ? __builtin_ctz((unsigned)s->prow_seg) : 8; /* (seg: 64) */
    p.prow_heads_inv = s->prow_heads > 0 ? (65536 + s->prow_heads - 1) / s->prow_heads : 0;
    p.causal = c->causal;
    p.window_left = c->window_left;
    p.scale_log2 = c->sm_scale * LOG2E;
    p.soft_cap = c->logits_soft_cap;
    p.cap_scale = c->logits_soft_cap > 0.0f ? c->sm_scale / c->logits_soft_cap : 0.0f;
    p.cap_log2 = c->logits_soft_cap * LOG2E;
    p.max_splits = s->merge_splits;
    p.sinks = c->use_sinks ? (const float *)a->sinks->data : NULL;
    p.head_dim_qk = c->head_dim_qk;
    p.head_dim_vo = c->head_dim_vo;

    /* Outside a capture, kernels with nothing to do are not launched. Under
     * capture every kernel of the mode is, since the graph must serve any
     * later plan (varlen: the prefill kernel only). */
    cudaStream_t cs = ak_cuda_stream(stream);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    AK_CUDA_TRY(cudaStreamIsCapturing(cs, &capture));
    const int all = capture != cudaStreamCaptureStatusNone;
    const int decode = s->split && (all || s->num_items > 0);
    const int prefill = s->prefill && (all || s->num_pitems > 0);
    const int merge = s->split && (all || s->num_tasks > 0);
    /* (a run without marks scans the long requests' tasks and the shorter
     * ones' whose rows are worth it: plan_prefill; where there can be
     * none, a captured one launches no pass either) */
    const int scans = p.kv_marks ? s->num_scans : s->num_long_scans;
    const int scan = s->scan_k.fn && (p.kv_marks || s->scan_rows) && (all || scans > 0);
    /* (a few microseconds of host time: only where the prefill kernel runs;
     * the maps depend on the pools and on q's address and strides, never on
     * the plan, so a captured graph serves any later plan) */
    if (prefill && s->pre_tma)
        ak_cuda_prefill_tma_maps(&p, c->head_dim_qk, c->head_dim_vo, s->pre_k.rows, s->pre_page_boxes, &kv_map);
    /* The scan pass first. Where dependent launches are on (s->pdl: the
     * paged engine on sm_90) it and decode are programmatic dependents of
     * whatever kernel is before them (the layer before's merge or prefill,
     * which let them launch at once; the scan): their blocks read the plan's
     * metadata while that kernel finishes, and wait for it before reading
     * anything else. Prefill is decode's dependent; without decode, the
     * scan's, waiting for it before its items read the flags (wait_first;
     * never under capture, where decode is always launched); else an
     * ordinary launch. (Without marks the scan reads every K/V row,
     * costing the step about what a copy of them would. The prefill
     * launched right after the scan's wait, not waiting for it at all, or
     * beside a scan on a part of the SMs: 1.02-1.45x the time at d128 16 x
     * 1024, 0.995-1.12x at d256 4 x 4096 (H100, BENCHMARKS.md); likely
     * because the prefill's blocks took their items at a fixed stride, so
     * a block that started late ended late. Beside, below, the clean pass
     * takes them from a queue.) */
    /* Two passes (DP 256, with a scan): the clean one first, so that the
     * checked one, mostly without items, runs its blocks in the clean
     * pass's tail as its blocks finish (with the empty blocks' early end,
     * prefill_wgmma.cu: 0.97-0.99 of the step's time where the scan finds
     * clean items, BENCHMARKS.md). Each waits for the kernel before it at
     * its end, so the merge after the second follows both; the second
     * launches only once the first's blocks have waited for the scan
     * (wait_first) or decode has, so it too reads finished flags. */
    const int two = prefill && s->pre_clean_k.fn && scan;
    /* Beside (s->scan_beside SMs, from rows, with no decode between): the
     * scan pass holds a few SMs and lets the clean pass start at once on
     * the others; that pass takes every scanned request's items unchecked
     * from a queue (a block that starts late, once the scan is done, takes
     * fewer), and the checked pass waits for it to finish, then runs the
     * items the flags mark again, checked (attn_params.scan_beside). */
    p.scan_beside = two && !decode && !p.kv_marks && s->scan_beside >= c->num_kv_heads;
    if (scan) { /* (from the pools' marks where the view has them: a bit a key instead of its rows) */
        const attn_kernel k = p.kv_marks ? ak_cuda_scan_marks_kernel() : p.scan_beside ? s->scan_beside_k : s->scan_k;
        const int ctas = p.scan_beside ? (s->scan_beside + c->num_kv_heads - 1) / c->num_kv_heads : s->scan_ctas;
        AK_TRY(launch_kernel(k.fn, dim3(ctas, c->num_kv_heads), k.threads, 0, s->pdl, cs, p));
    }
    if (decode)
        AK_TRY(launch_kernel(s->dec_k.fn, dim3(s->decode_ctas, c->num_kv_heads * s->row_tiles), s->dec_k.threads,
                             s->dec_k.smem, s->pdl, cs, p, s->dec_k.tma_map ? &k_map : NULL));
    if (prefill) {
        const attn_kernel &k1 = p.scan_beside ? s->pre_queue_k : two ? s->pre_clean_k : s->pre_k;
        p.wait_first = s->pdl && scan && !decode && !p.scan_beside;
        AK_TRY(launch_kernel(k1.fn, dim3(s->prefill_ctas), k1.threads, k1.smem, s->pdl && (decode || scan), cs, p,
                             k1.tma_map ? &kv_map : NULL));
        /* (the second pass waits at its end, as the kernels after; beside,
         * at its start too: for the flags, and for the clean pass's writes
         * of the items it runs again) */
        p.wait_first = p.scan_beside;
    }
    if (two)
        AK_TRY(launch_kernel(s->pre_k.fn, dim3(s->prefill_ctas), s->pre_k.threads, s->pre_k.smem, s->pdl, cs, p,
                             s->pre_k.tma_map ? &kv_map : NULL));
    if (merge)
        AK_TRY(launch_kernel(s->merge_k.fn, dim3(s->merge_ctas, c->num_qo_heads * s->merge_k.rows), s->merge_k.threads,
                             (int)(sizeof(float) * (size_t)s->merge_splits), s->pdl && (decode || prefill), cs, p));
    return AK_OK;
}

/* (ak_backend_slot_mapping answers NULL for ragged K/V, which have no slots) */
const int64_t *ak_cuda_engine_slot_mapping(void *state) { return ((const engine_state *)state)->d.slot_mapping; }
