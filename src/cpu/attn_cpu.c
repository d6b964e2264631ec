/*
 * attn_cpu.c - `cpu`, the fast CPU backend and the embedded default: paged
 * flash attention with online softmax over tiles of keys, GQA groups that read
 * each K/V row once, split-KV when a batch has too few items for the threads,
 * and kernels chosen at create: AVX-512 (with AMX tiles for bf16 prefill where
 * the CPU has them), AVX2 + FMA + F16C, or portable C. It computes exactly
 * what cpu_ref computes (see ref.c for the semantics).
 *
 * plan()  validates through ak_batch_build_meta, then cuts the batch into work
 *         items (attn_cpu.h): a request of few query tokens (decode, short
 *         verify) is one item over all KV heads; longer ones are tiles of
 *         query tokens x one KV head; with MLA (one latent KV head) a request
 *         of up to AK_CPU_MLA_ROWS rows is one item whose latent rows serve
 *         every head (mla_run_tiles); each against a chunk of its keys. It
 *         splits the largest items' keys into chunks when the threads would
 *         otherwise idle, and orders the list largest first.
 * run()   one OpenMP parallel region: with the AMX kernel, first the K/V
 *         tiles of prefill requests packed once into the tile unit's layout
 *         (plan_pack), then the work list with dynamic scheduling, then the
 *         merge of split items through the shared softmax state, in tasks
 *         of a few rows each (plan_merge_tasks).
 * Every buffer is allocated at create() from ak_limits; run() allocates nothing.
 */
#include "attn_cpu.h"

#include "backend.h"
#include "dtype.h"
#include "softmax_state.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- tuning ------------------------------------------------------------------ */

/* Query rows (tokens x GQA group) per prefill work item: each converted K/V
 * tile serves this many rows, and Q, O and the scores of a tile (336 KB at
 * head dim 128) stay in L2. Llama3-8b prefill of 2048 tokens, one thread,
 * GFLOP/s f32 / bf16, AVX-512: 64 rows 117-121/129-138, 128 rows
 * 138-139/146-154, 256 rows 151-153/160-162; AVX2: 81-83/88, 90-91/94,
 * 93/97. */
#define AK_CPU_TILE_ROWS 256
/* When splitting, aim at this many chunks per thread, so that dynamic
 * scheduling can even out items of unequal cost. Decode llama3-8b f16, 2
 * threads, fraction of a streaming read for 1, 2, 4, 8: batch 3 x 4096 keys
 * 0.56 (3 items, no split), 0.75, 0.67, 0.73; batch 1 x 32768 0.65, 0.70,
 * 0.67, 0.67; batch 2 x 8192 0.70-0.73 for all. 2 threads cannot tell 2 from
 * 8; 4 leaves dynamic scheduling room on more threads. */
#define AK_CPU_OVERSUB 4
/* No chunk gets fewer keys than this: below it the per-chunk setup and the
 * merge outweigh the parallelism. Batch 3 x 1024 keys on 2 threads: 64 keys
 * 0.67, 256 keys 0.64, 1024 keys (no split) 0.57; 1 x 4096 and 1 x 32768
 * within noise of each other. */
#define AK_CPU_MIN_SPLIT_KEYS 256
/* limits.max_splits = 0 means this many chunks per item at most: 64 threads
 * can still share one long request. */
#define AK_CPU_DEFAULT_MAX_SPLITS 64
/* Rows of the partial pool per split chunk it is sized for (at least the
 * rows of a decode item); see plan_split. */
#define AK_CPU_SPLIT_ROWS 64
/* The merge of split items runs as tasks of whole rows, about this many
 * per thread (more rows a task when there are more): on 16 threads one
 * request of 16 heads split 64 ways is 16 tasks of one row instead of one
 * task of 16 rows while 15 threads wait, 8 x 128 heads 64 tasks of 16 rows.
 * (The merge was 17% of the 128-head run with one scalar task per split
 * item, BENCHMARKS.md 2026-11-26; this split is not timed on its own yet.) */
#define AK_CPU_MERGE_TASKS_PER_THREAD 4
/* Fixed cost of a work item, in row x key units (setup, Q load, store). */
#define AK_CPU_ITEM_OVERHEAD 256
/* The AMX kernel's packed K/V pool holds, per KV head, the key tiles of
 * limits.max_tokens keys plus this many: a batch of fresh prompts (kv_len =
 * q_len) always fits, with room for the partial last tile of 16 of them.
 * Requests that do not fit (long cached prefixes) convert their tiles per
 * item instead. */
#define AK_CPU_PACK_EXTRA_TILES 16

/* ---- state --------------------------------------------------------------------- */

typedef struct cpu_state {
    ak_attn_config cfg;
    ak_limits lim;
    const ak_cpu_kernels *kern;
    int threads;       /* fixed at create: plan's split rule and run() agree */
    int group;
    int tile_tokens;   /* query tokens per single-head work item at most */
    int max_tokens_all_heads; /* a request with at most this many query tokens is one
                                 item over all KV heads (the kernel's in-place rows) */
    int mla_tokens;    /* cfg.mla: a request with at most this many query tokens is one
                          MLA item (AK_CPU_MLA_ROWS rows at most); else 0 */
    int max_rows;      /* rows of the largest item */
    int max_splits;
    int dqk_pad, dvo_pad;

    /* the plan, host memory sized at create (meta: the core's arrays) */
    ak_batch_meta meta;
    int32_t *kv_lens;      /* [max_reqs] */
    int num_reqs, num_tokens;
    ak_cpu_work *natural;  /* [natural_cap] tiles x KV heads before splitting */
    int natural_cap;
    ak_cpu_work *work;     /* [work_cap] the list run() executes, largest first */
    int work_cap, num_work;
    ak_cpu_merge *splits;  /* [part_cap] the split items, all rows each */
    int num_splits;
    ak_cpu_merge *merges;  /* [merge_cap] the merge tasks run() executes: rows of the splits */
    int num_merges, merge_cap;
    int part_cap;          /* split chunks per plan at most */
    int part_rows;         /* rows of the partial pool */
    float *part_o;         /* [part_rows, dvo_pad] normalised partial outputs */
    float *part_lse;       /* [part_rows] */

    /* AMX kernel: K/V tiles packed once per run for every item of a request
     * (plan_pack), instead of converted by each item that reads them */
    ak_cpu_pack *pack;          /* [max_reqs] */
    uint16_t *kv_pack;          /* [pack_cap, pack_tile_elems] */
    int64_t pack_cap;           /* tiles */
    int64_t pack_tile_elems;
    int num_packed;             /* requests packed by the current plan */

#if defined(AK_CPU_PHASE_TIMES)
    struct cpu_phase_times *times; /* [threads + 1] (debug builds only, see cpu_run) */
#endif
    ak_cpu_scratch *scratch;    /* [threads] */
    float *scratch_mem;         /* the floats of every thread's scratch */
    const void **scratch_ptrs;  /* [threads, 2 * (TILE_KEYS + TILE_PAD) + dqk_pad] row pointers */
} cpu_state;

/* ---- kernels ----------------------------------------------------------------------- */

/* The best kernel this CPU runs for cfg into *out; 0 on success. The AMX
 * kernel serves configs whose q and K/V are both bf16, and so does the
 * avx512+bf16 one (AVX512-BF16 without AMX: its dot products serve MLA).
 * AK_CPU_ISA asks for one kernel (for tests and comparisons): scalar, avx2,
 * avx512 (AVX-512 without AMX or AVX512-BF16), avx512bf16 or amx. A kernel
 * this CPU, build or config cannot run, or an unknown name, is an error (-1,
 * the reason in why) rather than quietly the automatic choice. create(),
 * explain() and ak_cpu_kernel_describe (the tools' device line) all ask
 * here, so they name the same kernel. */
static int pick_kernels(const ak_attn_config *cfg, const ak_cpu_kernels **out, char *why, size_t cap)
{
    int avx2 = 0, avx512 = 0, avx512_bf16 = 0, amx = 0;
    const int bf16 = cfg->q_dtype == AK_BF16 && cfg->kv_dtype == AK_BF16;
    const ak_cpu_kernels *avx2_k = NULL, *avx512_k = NULL, *avx512_bf16_k = NULL, *amx_k = NULL;
#if defined(__x86_64__) || defined(__i386__)
    const ak_cpu_features f = ak_cpu_features_get();
    avx2 = f.avx2_fma_f16c;
    avx512 = f.avx512f;
    avx2_k = &ak_cpu_kernels_avx2;
    avx512_k = &ak_cpu_kernels_avx512;
#if defined(AK_CPU_HAVE_AVX512_BF16)
    avx512_bf16 = f.avx512_bf16; /* the kernel is built only where the compiler knows AVX512-BF16 */
    avx512_bf16_k = &ak_cpu_kernels_avx512_bf16;
#endif
#if defined(AK_CPU_HAVE_AMX)
    amx = f.amx_bf16; /* the kernel is built only where the compiler knows AMX */
    amx_k = &ak_cpu_kernels_avx512_amx;
#endif
#endif
    /* avx512+bf16 by itself only for MLA, the one path whose dot products
     * it changes (its GQA paths are avx512's, built with AVX512BW) */
    *out = amx && bf16                       ? amx_k
           : avx512_bf16 && bf16 && cfg->mla ? avx512_bf16_k
           : avx512                          ? avx512_k
           : avx2                            ? avx2_k
                                             : &ak_cpu_kernels_scalar;
    const char *want = getenv("AK_CPU_ISA");
    if (!want || !*want) return 0;
    if (!strcmp(want, "scalar")) {
        *out = &ak_cpu_kernels_scalar;
    } else if (!strcmp(want, "avx2") && avx2) {
        *out = avx2_k;
    } else if (!strcmp(want, "avx512") && avx512) {
        *out = avx512_k;
    } else if (!strcmp(want, "avx512bf16") && avx512_bf16 && bf16) {
        *out = avx512_bf16_k;
    } else if (!strcmp(want, "amx") && amx && bf16) {
        *out = amx_k;
    } else if (!strcmp(want, "avx2") || !strcmp(want, "avx512") || !strcmp(want, "avx512bf16") ||
               !strcmp(want, "amx")) {
        snprintf(why, cap, "AK_CPU_ISA=%s: %s", want,
                 !strcmp(want, "avx2")     ? "this CPU (or build) has no AVX2+FMA+F16C"
                 : !strcmp(want, "avx512") ? "this CPU (or build) has no AVX-512F"
                 : !bf16                   ? "the AVX512-BF16 and AMX kernels serve bf16 q and K/V only"
                 : !strcmp(want, "amx")    ? "this CPU (or build) has no AMX-BF16"
                                           : "this CPU (or build) has no AVX512-BF16");
        return -1;
    } else {
        snprintf(why, cap, "AK_CPU_ISA=%s: expected scalar, avx2, avx512, avx512bf16 or amx", want);
        return -1;
    }
    return 0;
}

ak_status ak_cpu_kernel_describe(const ak_attn_config *cfg, char *buf, size_t cap)
{
    if (buf && cap) buf[0] = '\0';
    ak_attn_config f32;
    if (!cfg) {
        ak_attn_config_init(&f32);
        cfg = &f32;
    }
    char why[AK_REASON_LEN] = "";
    const ak_cpu_kernels *k;
    if (pick_kernels(cfg, &k, why, sizeof why)) {
        if (buf && cap) snprintf(buf, cap, "%s", why);
        return ak_set_error(AK_ERR_INVALID_ARG, "%s", why);
    }
    if (!buf || !cap) return AK_OK;
#if defined(__x86_64__) || defined(__i386__)
    const ak_cpu_features f = ak_cpu_features_get();
    int amx_built = 0, bf16_built = 0;
#if defined(AK_CPU_HAVE_AMX)
    amx_built = 1;
#endif
#if defined(AK_CPU_HAVE_AVX512_BF16)
    bf16_built = 1;
#endif
    snprintf(buf, cap, "%s (AVX2+FMA+F16C %s, AVX-512F %s, AVX512-BF16 %s%s, AMX-BF16 %s%s)", k->isa,
             f.avx2_fma_f16c ? "yes" : "no", f.avx512f ? "yes" : "no", f.avx512_bf16 ? "yes" : "no",
             f.avx512_bf16 && !bf16_built ? ", its kernel not in this build" : "", f.amx_bf16 ? "yes" : "no",
             f.amx_bf16 && !amx_built ? ", its kernel not in this build" : "");
#else
    snprintf(buf, cap, "%s", k->isa);
#endif
    return AK_OK;
}

/* ---- phase times (builds with -DAK_CPU_PHASE_TIMES only) ------------------------------- */

#if defined(AK_CPU_PHASE_TIMES)
/* Where each thread's time in run() goes, summed over runs and printed to
 * stderr by destroy(): fork (region entry after run() began), pack, wait for
 * the last packer, items, wait for the last item, merge. Not in normal
 * builds: it takes a clock reading per phase and thread. */
enum { AK_PHASE_ENTER, AK_PHASE_PACKED, AK_PHASE_PACK_WAITED, AK_PHASE_ITEMS, AK_PHASE_ITEMS_WAITED,
       AK_PHASE_MERGED, AK_PHASE_COUNT };
typedef struct cpu_phase_times {
    double sum[AK_PHASE_COUNT]; /* [AK_PHASE_ENTER]: entry - start of run(), then each phase's length */
    double last;                /* the clock at this thread's previous mark */
    int64_t runs, items;
    char pad[64];               /* threads' slots on separate cache lines */
} cpu_phase_times;

static double phase_clock(void) { return omp_get_wtime(); }

static void phase_mark(cpu_phase_times *t, int phase, double run_start)
{
    const double now = phase_clock();
    t->sum[phase] += now - (phase == AK_PHASE_ENTER ? run_start : t->last);
    t->last = now;
}

static void phase_times_report(const cpu_state *s);
#define AK_PHASE(p) phase_mark(&s->times[tid], (p), run_start)
#else
#define AK_PHASE(p) ((void)0)
#endif

/* ---- check / explain / create / destroy ---------------------------------------------- */

static int cpu_check(const ak_attn_config *cfg, const ak_device_info *dev, ak_reasons *why)
{
    (void)cfg;
    (void)dev;
    return why->count;
}

/* Query tokens per work item: one for a decode instance, else enough for
 * AK_CPU_TILE_ROWS rows with the GQA group. */
static int tile_tokens_for(const ak_attn_config *cfg)
{
    const int group = cfg->num_qo_heads / cfg->num_kv_heads;
    const int tt = cfg->workload == AK_WORKLOAD_DECODE ? 1 : AK_CPU_TILE_ROWS / group;
    return tt > 1 ? tt : 1;
}

/* MLA: query tokens of the largest request served as one MLA item (all its
 * tokens x heads, AK_CPU_MLA_ROWS rows at most, at least one token); 0
 * without MLA. */
static int mla_tokens_for(const ak_attn_config *cfg)
{
    if (!cfg->mla) return 0;
    const int tokens = AK_CPU_MLA_ROWS / cfg->num_qo_heads;
    return tokens > 1 ? tokens : 1;
}

static void cpu_explain(const ak_attn_config *cfg, const ak_device_info *dev, char *buf, size_t cap)
{
    (void)dev;
    const ak_cpu_kernels *k;
    if (pick_kernels(cfg, &k, buf, cap)) return; /* the reason create() will fail with */
    const int group = cfg->num_qo_heads / cfg->num_kv_heads;
    const int all_heads_tokens = k->in_place_rows / group;
    if (cfg->mla) {
        const int bf16 = cfg->q_dtype == AK_BF16 && cfg->kv_dtype == AK_BF16;
        const int mla_amx = k->amx && bf16 && mla_tokens_for(cfg) * group >= AK_CPU_MLA_AMX_ROWS;
        snprintf(buf, cap,
                 "%s kernels, %d threads; MLA: requests of <= %d tokens: all %d heads x %d latent rows per "
                 "tile, each row read once (%s); longer: %d query tokens x %d heads x %d keys per tile; split-KV",
                 k->isa, ak_cpu_num_threads(), mla_tokens_for(cfg), group,
                 mla_amx ? AK_CPU_TILE_KEYS_AMX : AK_CPU_MLA_TILE_KEYS,
                 mla_amx                  ? "AMX tiles"
                 : k->bf16_dot && bf16    ? "VDPBF16PS"
                                          : "f32 FMA",
                 tile_tokens_for(cfg), group, k->amx ? AK_CPU_TILE_KEYS_AMX : AK_CPU_TILE_KEYS);
        return;
    }
    snprintf(buf, cap,
             "%s kernels, %d threads; %d query tokens x %d heads x %d keys per tile%s; requests of <= %d "
             "tokens: all %d KV heads x %d keys; split-KV",
             k->isa, ak_cpu_num_threads(), tile_tokens_for(cfg), group, k->amx ? AK_CPU_TILE_KEYS_AMX : AK_CPU_TILE_KEYS,
             k->amx ? ", K/V packed" : "", all_heads_tokens, cfg->num_kv_heads,
             AK_CPU_TILE_KEYS_ALL_HEADS);
}

static void cpu_destroy(void *state)
{
    cpu_state *s = state;
    if (!s) return;
    free(s->kv_lens);
    free(s->natural);
    free(s->work);
    free(s->splits);
    free(s->merges);
    free(s->part_o);
    free(s->part_lse);
    free(s->pack);
    free(s->kv_pack);
#if defined(AK_CPU_PHASE_TIMES)
    phase_times_report(s);
    free(s->times);
#endif
    free(s->scratch);
    free(s->scratch_mem);
    free(s->scratch_ptrs);
    free(s);
}

static int round_up(int x, int m) { return (x + m - 1) / m * m; }

/* 64-byte aligned floats: whole cache lines, aligned vector rows. */
static float *alloc_floats(int64_t n)
{
    const size_t bytes = ((size_t)(n > 0 ? n : 1) * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

/* Carves each thread's scratch (attn_cpu.h) out of one float block and one
 * pointer block; every float piece starts on a cache line. */
static ak_status alloc_scratch(cpu_state *s)
{
    /* AMX computes whole pairs of 16-row blocks: rows rounded up to 32 */
    const int rows = s->kern->amx ? round_up(s->max_rows, 32) : s->max_rows;
    const int keys = AK_CPU_TILE_KEYS_MAX + AK_CPU_TILE_PAD;
    const int dmax = s->dqk_pad > s->dvo_pad ? s->dqk_pad : s->dvo_pad;
    int max_tok = s->tile_tokens > s->max_tokens_all_heads ? s->tile_tokens : s->max_tokens_all_heads;
    if (s->mla_tokens > max_tok) max_tok = s->mla_tokens;
    const int dq32 = round_up(s->cfg.head_dim_qk, 32);
#define AK_LINE(n) (((int64_t)(n) + 15) / 16 * 16)
    /* AMX buffers, in floats: bf16 q rows, key pairs, value pairs, the
     * denominators' lanes, bf16 P (and its remainder) */
    const int64_t amx = s->kern->amx ? AK_LINE((int64_t)rows * dq32 / 2) + AK_LINE((int64_t)dq32 / 2 * AK_CPU_TILE_KEYS_AMX) +
                                           AK_LINE((int64_t)AK_CPU_TILE_KEYS_AMX * s->dvo_pad) +
                                           AK_LINE((int64_t)rows * AK_CPU_AMX_SUM_LANES) +
                                           AK_LINE((int64_t)rows * AK_CPU_TILE_KEYS_AMX)
                                     : 0;
    /* MLA on VDPBF16PS: probability pairs and a value tile of key pairs, in floats */
    const int mla_bf16 = s->mla_tokens > 0 && s->kern->bf16_dot;
    const int64_t mla = mla_bf16 ? AK_LINE((int64_t)rows * AK_CPU_MLA_TILE_KEYS / 2) +
                                       AK_LINE((int64_t)AK_CPU_MLA_TILE_KEYS / 2 * 2 * s->dvo_pad / 2)
                                 : 0;
    const int64_t per_thread = AK_LINE((int64_t)rows * s->dqk_pad) + AK_LINE((int64_t)rows * keys) +
                               AK_LINE((int64_t)rows * s->dvo_pad) + 2 * AK_LINE(rows) +
                               AK_LINE((int64_t)keys * s->dqk_pad) + AK_LINE((int64_t)keys * s->dvo_pad) +
                               AK_LINE(dmax) + 2 * AK_LINE(max_tok) + 8 * AK_LINE(keys) + amx + mla;
    s->scratch_mem = alloc_floats(per_thread * s->threads);
    /* prefetch lines of one in-place tile: all heads x 16 keys, or 64 keys of
     * one head, x the lines of a K and a V row */
    const int64_t kv_esz = (int64_t)ak_dtype_size(s->cfg.kv_dtype);
    const int64_t row_lines = (s->cfg.head_dim_qk * kv_esz + 63) / 64 + (s->cfg.head_dim_vo * kv_esz + 63) / 64;
    int64_t tile_rows = (int64_t)AK_CPU_TILE_KEYS_ALL_HEADS * s->cfg.num_kv_heads;
    if (tile_rows < AK_CPU_TILE_KEYS) tile_rows = AK_CPU_TILE_KEYS;
    const size_t pf_lines = (size_t)(tile_rows * row_lines);
    const size_t ptrs_per_thread = 2 * (size_t)keys + (size_t)s->dqk_pad + pf_lines;
    s->scratch_ptrs = calloc((size_t)s->threads * ptrs_per_thread, sizeof(const void *));
    s->scratch = calloc((size_t)s->threads, sizeof *s->scratch);
    if (!s->scratch_mem || !s->scratch_ptrs || !s->scratch)
        return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate the cpu scratch of %d threads", s->threads);
    for (int t = 0; t < s->threads; t++) {
        ak_cpu_scratch *sc = &s->scratch[t];
        float *p = s->scratch_mem + per_thread * t;
        sc->q = p, p += AK_LINE((int64_t)rows * s->dqk_pad);
        sc->s = p, p += AK_LINE((int64_t)rows * keys);
        sc->s_stride = keys;
        sc->o = p, p += AK_LINE((int64_t)rows * s->dvo_pad);
        sc->row_max = p, p += AK_LINE(rows);
        sc->row_sum = p, p += AK_LINE(rows);
        sc->k = p, p += AK_LINE((int64_t)keys * s->dqk_pad);
        sc->v = p, p += AK_LINE((int64_t)keys * s->dvo_pad);
        sc->zero_row = p, p += AK_LINE(dmax);
        sc->lo = (int32_t *)p, p += AK_LINE(max_tok);
        sc->hi = (int32_t *)p, p += AK_LINE(max_tok);
        /* int64 offsets: two floats each */
        for (int b = 0; b < 2; b++) {
            sc->koff[b] = (int64_t *)p, p += 2 * AK_LINE(keys);
            sc->voff[b] = (int64_t *)p, p += 2 * AK_LINE(keys);
        }
        if (mla_bf16) {
            sc->mla_p = (uint32_t *)p, p += AK_LINE((int64_t)rows * AK_CPU_MLA_TILE_KEYS / 2);
            sc->mla_v = (uint16_t *)p, p += AK_LINE((int64_t)AK_CPU_MLA_TILE_KEYS / 2 * 2 * s->dvo_pad / 2);
        }
        if (s->kern->amx) {
            sc->amx_q = (uint16_t *)p, p += AK_LINE((int64_t)rows * dq32 / 2);
            sc->amx_kt = (uint32_t *)p, p += AK_LINE((int64_t)dq32 / 2 * AK_CPU_TILE_KEYS_AMX);
            sc->amx_v = (uint16_t *)p, p += AK_LINE((int64_t)AK_CPU_TILE_KEYS_AMX * s->dvo_pad);
            sc->amx_d = p, p += AK_LINE((int64_t)rows * AK_CPU_AMX_SUM_LANES);
            sc->amx_p = (uint16_t *)p;
        }
        sc->kp = s->scratch_ptrs + (size_t)t * ptrs_per_thread;
        sc->vp = sc->kp + keys;
        sc->ktp = sc->vp + keys;
        sc->pf_lines = (const char **)(sc->ktp + s->dqk_pad);
        for (int d = 0; d < s->dqk_pad; d++) sc->ktp[d] = sc->k + (int64_t)d * AK_CPU_TILE_KEYS;
    }
#undef AK_LINE
    return AK_OK;
}

/* The packed K/V pool of the AMX kernel (see AK_CPU_PACK_EXTRA_TILES). Not
 * zeroed: packing writes every byte an item reads, and untouched pages cost
 * no memory. */
static ak_status alloc_pack(cpu_state *s)
{
    const int tile = AK_CPU_TILE_KEYS_AMX;
    s->pack_tile_elems = (int64_t)round_up(s->cfg.head_dim_qk, 32) * tile + (int64_t)tile * s->dvo_pad;
    s->pack_cap = ((int64_t)ak_ceil_div(s->lim.max_tokens, tile) + AK_CPU_PACK_EXTRA_TILES) * s->cfg.num_kv_heads;
    const size_t bytes = (size_t)(s->pack_cap * s->pack_tile_elems) * sizeof(uint16_t);
    s->pack = malloc(sizeof(ak_cpu_pack) * (size_t)s->lim.max_reqs);
    s->kv_pack = aligned_alloc(64, bytes);
    if (!s->pack || !s->kv_pack)
        return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate the cpu K/V pack of %lld tiles (%zu bytes)",
                            (long long)s->pack_cap, bytes);
    return AK_OK;
}

static ak_status cpu_create(const ak_attn_config *cfg, const ak_limits *lim, void **out)
{
    cpu_state *s = calloc(1, sizeof *s);
    if (!s) return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate cpu state");
    s->cfg = *cfg;
    s->lim = *lim;
    char why[160];
    if (pick_kernels(cfg, &s->kern, why, sizeof why)) {
        free(s);
        return ak_set_error(AK_ERR_INVALID_ARG, "%s", why);
    }
    s->threads = ak_cpu_num_threads();
    if (s->threads < 1) s->threads = 1;
    s->group = cfg->num_qo_heads / cfg->num_kv_heads;
    s->tile_tokens = tile_tokens_for(cfg);
    if (s->tile_tokens > lim->max_tokens) s->tile_tokens = lim->max_tokens;
    s->max_tokens_all_heads = s->kern->in_place_rows / s->group;
    if (s->max_tokens_all_heads > lim->max_tokens) s->max_tokens_all_heads = lim->max_tokens;
    s->mla_tokens = mla_tokens_for(cfg);
    if (s->mla_tokens > lim->max_tokens) s->mla_tokens = lim->max_tokens;
    s->max_rows = s->tile_tokens * s->group;
    if (s->max_tokens_all_heads * cfg->num_qo_heads > s->max_rows)
        s->max_rows = s->max_tokens_all_heads * cfg->num_qo_heads;
    if (s->mla_tokens * cfg->num_qo_heads > s->max_rows) s->max_rows = s->mla_tokens * cfg->num_qo_heads;
    s->max_splits = lim->max_splits > 0 ? lim->max_splits : AK_CPU_DEFAULT_MAX_SPLITS;
    s->dqk_pad = round_up(cfg->head_dim_qk, s->kern->vec_width);
    s->dvo_pad = round_up(cfg->head_dim_vo, s->kern->vec_width);

    /* tiles of a batch: each request's q_len rounded up to whole tiles */
    const int64_t tiles = (int64_t)lim->max_reqs + lim->max_tokens / s->tile_tokens;
    const int64_t natural = tiles * cfg->num_kv_heads;
    /* splitting stops at 2 * OVERSUB chunks per thread (the split rule never
     * wants more: see plan_split), and never happens on one thread */
    int64_t parts = s->threads > 1 && s->max_splits > 1 ? 2 * AK_CPU_OVERSUB * (int64_t)s->threads : 0;
    if (parts > natural * s->max_splits) parts = natural * s->max_splits;
    if (natural + parts > INT32_MAX / 2) {
        cpu_destroy(s);
        return ak_set_error(AK_ERR_LIMIT_EXCEEDED,
                            "limits.max_reqs = %d and limits.max_tokens = %d make %lld work items, too many",
                            lim->max_reqs, lim->max_tokens, (long long)natural);
    }
    s->natural_cap = (int)natural;
    s->part_cap = (int)parts;
    s->work_cap = (int)(natural + parts);
    /* the pool holds every chunk of decode-sized items (all heads of one
     * token: num_qo_heads rows); larger items (MLA's of several tokens)
     * split while rows remain: sizing it for MLA's 128 rows an item would
     * reserve 2 MiB of partials a thread at 16 heads, zeroed at create */
    int split_rows = s->max_tokens_all_heads * cfg->num_qo_heads;
    if (split_rows < AK_CPU_SPLIT_ROWS) split_rows = s->max_rows < AK_CPU_SPLIT_ROWS ? s->max_rows : AK_CPU_SPLIT_ROWS;
    if ((int64_t)s->part_cap * split_rows > INT32_MAX / 2) {
        cpu_destroy(s);
        return ak_set_error(AK_ERR_LIMIT_EXCEEDED,
                            "%d threads (AK_NUM_THREADS) with rows of %d make a partial pool of %lld rows, too many",
                            s->threads, split_rows, (long long)s->part_cap * split_rows);
    }
    s->part_rows = s->part_cap * split_rows;
    /* merge tasks: the split items (at most part_cap / 2) each cut into
     * tasks of at least total rows / (threads x TASKS_PER_THREAD) rows, so
     * at most one more than that share each */
    s->merge_cap = s->part_cap + AK_CPU_MERGE_TASKS_PER_THREAD * s->threads + 1;

    ak_status st = AK_OK;
    s->kv_lens = malloc(sizeof(int32_t) * (size_t)lim->max_reqs);
    s->natural = malloc(sizeof(ak_cpu_work) * (size_t)s->natural_cap);
    s->work = malloc(sizeof(ak_cpu_work) * (size_t)s->work_cap);
    s->splits = malloc(sizeof(ak_cpu_merge) * (size_t)(s->part_cap + 1));
    s->merges = malloc(sizeof(ak_cpu_merge) * (size_t)s->merge_cap);
    s->part_o = alloc_floats((int64_t)s->part_rows * s->dvo_pad);
    s->part_lse = alloc_floats((int64_t)s->part_rows);
    if (!s->kv_lens || !s->natural || !s->work || !s->splits || !s->merges || !s->part_o || !s->part_lse)
        st = ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate the cpu plan buffers (%d work items)", s->work_cap);
    if (st == AK_OK) st = alloc_scratch(s);
#if defined(AK_CPU_PHASE_TIMES)
    if (st == AK_OK && !(s->times = calloc((size_t)s->threads + 1, sizeof *s->times)))
        st = ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate the cpu phase times");
#endif
    if (st == AK_OK && s->kern->pack_tile) st = alloc_pack(s);
    if (st != AK_OK) {
        cpu_destroy(s);
        return st;
    }
    *out = s;
    return AK_OK;
}

/* ---- plan ------------------------------------------------------------------------ */

/* Cost of query tokens [qb, qb + cnt) of a request, per query head: the keys
 * they see. */
static int64_t keys_seen(const ak_attn_config *c, int p0, int cnt, int kv_len)
{
    int64_t seen = 0;
    for (int t = 0; t < cnt; t++) {
        const int lo = ak_visible_lo(p0 + t, c->window_left);
        const int hi = ak_visible_hi(p0 + t, kv_len, c->causal);
        if (hi >= lo) seen += hi - lo + 1;
    }
    return seen;
}

/* The batch as work items before splitting; returns how many, and the sum of
 * their costs in *total. A request of few query tokens (decode, short
 * verify) is one item over all KV heads, whose tiles read whole pages in
 * address order; longer ones are tiles of query tokens x one KV head. With
 * MLA a request of up to mla_tokens query tokens is one MLA item: all its
 * tokens x heads against each latent row. */
static int plan_natural(cpu_state *s, int64_t *total)
{
    const ak_attn_config *c = &s->cfg;
    int n = 0;
    *total = 0;
    for (int r = 0; r < s->num_reqs; r++) {
        const int q_len = s->meta.qo_indptr[r + 1] - s->meta.qo_indptr[r];
        const int kv_len = s->kv_lens[r];
        const int mla = q_len <= s->mla_tokens; /* mla_tokens is 0 without MLA */
        const int all_heads = mla || q_len <= s->max_tokens_all_heads;
        const int tt = all_heads ? q_len : s->tile_tokens;
        for (int qb = 0; qb < q_len; qb += tt) {
            const int cnt = q_len - qb < tt ? q_len - qb : tt;
            const int p0 = kv_len - q_len + qb;
            const int k_lo = ak_visible_lo(p0, c->window_left);
            const int k_hi = ak_visible_hi(p0 + cnt - 1, kv_len, c->causal);
            ak_cpu_work w;
            w.req = r;
            w.kv_heads = all_heads ? c->num_kv_heads : 1;
            w.q_begin = qb;
            w.q_count = cnt;
            w.kv_begin = k_hi >= k_lo ? k_lo : 0; /* an empty range still writes o = 0 */
            w.kv_end = k_hi >= k_lo ? k_hi + 1 : 0;
            w.part = -1;
            w.mla = mla;
            w.cost = keys_seen(c, p0, cnt, kv_len) * s->group * w.kv_heads + AK_CPU_ITEM_OVERHEAD;
            for (int g = 0; g < c->num_kv_heads; g += w.kv_heads) {
                w.kv_head = g;
                s->natural[n++] = w;
                *total += w.cost;
            }
        }
    }
    return n;
}

/* Split-KV: an item costing more than total / (threads x OVERSUB) is cut into
 * that many chunks of whole key tiles (at most max_splits, at least
 * AK_CPU_MIN_SPLIT_KEYS keys each), each writing its partial state to rows of
 * the pool. Only items above the average chunk cost split, so there are fewer
 * than threads x OVERSUB of them and their chunks number under twice that
 * (part_cap); an item whose rows no longer fit the pool stays whole. */
static void plan_split(cpu_state *s, int num_natural, int64_t total)
{
    /* batch-invariant: no item is split (where to cut would depend on the
     * rest of the batch), so each row's reduction order is its own */
    const int64_t chunk_cost = total / ((int64_t)s->threads * AK_CPU_OVERSUB) + 1;
    int nw = 0, chunks = 0, rows_used = 0;
    s->num_splits = 0;
    for (int i = 0; i < num_natural; i++) {
        const ak_cpu_work *it = &s->natural[i];
        const int keys = it->kv_end - it->kv_begin;
        int64_t want = s->cfg.batch_invariant ? 1 : (it->cost + chunk_cost - 1) / chunk_cost;
        if (want > s->max_splits) want = s->max_splits;
        if (want > keys / AK_CPU_MIN_SPLIT_KEYS) want = keys / AK_CPU_MIN_SPLIT_KEYS;
        const int rows = it->q_count * s->group * it->kv_heads;
        if (want >= 2 && chunks + want <= s->part_cap && rows_used + want * rows <= s->part_rows) {
            const int span = round_up(ak_ceil_div(keys, (int)want), AK_CPU_TILE_KEYS);
            const int parts = ak_ceil_div(keys, span);
            if (parts >= 2) {
                ak_cpu_merge *mg = &s->splits[s->num_splits++];
                mg->req = it->req;
                mg->kv_head = it->kv_head;
                mg->kv_heads = it->kv_heads;
                mg->q_begin = it->q_begin;
                mg->q_count = it->q_count;
                mg->first_row = rows_used;
                mg->num_parts = parts;
                mg->rows = rows;
                mg->row_begin = 0;
                mg->row_end = rows;
                for (int p = 0; p < parts; p++) {
                    ak_cpu_work w = *it;
                    w.kv_begin = it->kv_begin + p * span;
                    /* not kv_begin + span < kv_end: the last chunk's sum can pass INT32_MAX */
                    w.kv_end = it->kv_end - w.kv_begin > span ? w.kv_begin + span : it->kv_end;
                    w.part = rows_used + p * rows;
                    w.cost = it->cost / parts;
                    s->work[nw++] = w;
                }
                chunks += parts;
                rows_used += parts * rows;
                continue;
            }
        }
        s->work[nw++] = *it;
    }
    s->num_work = nw;
}

/* The merge of the split items as tasks of whole rows: about
 * AK_CPU_MERGE_TASKS_PER_THREAD per thread in all, each within one split
 * item, so that a few wide items (or one long request) merge on every
 * thread. */
static void plan_merge_tasks(cpu_state *s)
{
    int64_t total_rows = 0;
    for (int i = 0; i < s->num_splits; i++) total_rows += s->splits[i].rows;
    const int64_t want = (int64_t)s->threads * AK_CPU_MERGE_TASKS_PER_THREAD;
    const int task_rows = (int)((total_rows + want - 1) / want);
    s->num_merges = 0;
    for (int i = 0; i < s->num_splits; i++)
        for (int m = 0; m < s->splits[i].rows; m += task_rows) {
            ak_cpu_merge *mg = &s->merges[s->num_merges++];
            *mg = s->splits[i];
            mg->row_begin = m;
            mg->row_end = s->splits[i].rows - m < task_rows ? s->splits[i].rows : m + task_rows;
        }
}

/* AMX kernel: which requests get their K/V packed by run() before the items
 * start. A request of more query tokens than an all-heads item (so that its
 * items run on AMX) has its key tiles from the first one its first query
 * sees to kv_len packed for every KV head, if the pool has room left; every
 * query tile of the request then reads them instead of converting its own
 * copy (llama3-8b prefill 2048: 32 query tiles per KV head, each of which
 * converted on average half of the keys). */
static void plan_pack(cpu_state *s)
{
    const int tile = AK_CPU_TILE_KEYS_AMX, heads = s->cfg.num_kv_heads;
    int64_t used = 0;
    s->num_packed = 0;
    /* batch-invariant: no packing either (whether a request fits the pool
     * depends on the others) */
    for (int r = 0; r < s->num_reqs && s->kv_pack && !s->cfg.batch_invariant; r++) {
        const int q_len = s->meta.qo_indptr[r + 1] - s->meta.qo_indptr[r], kv_len = s->kv_lens[r];
        ak_cpu_pack *pk = &s->pack[r];
        pk->first = -1;
        /* decode-sized and MLA items read their rows once anyway */
        if (q_len <= s->max_tokens_all_heads || q_len <= s->mla_tokens || kv_len == 0) continue;
        pk->t0 = ak_visible_lo(kv_len - q_len, s->cfg.window_left) / tile;
        pk->tiles = ak_ceil_div(kv_len, tile) - pk->t0;
        if (used + (int64_t)pk->tiles * heads > s->pack_cap) continue;
        pk->first = (int32_t)used;
        used += (int64_t)pk->tiles * heads;
        s->num_packed++;
    }
}

/* Largest cost first (heap sort: in place, no allocation), so that dynamic
 * scheduling ends with the small items and the threads finish together. */
static void sift_down(ak_cpu_work *a, int i, int n)
{
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && a[c + 1].cost < a[c].cost) c++;
        if (a[i].cost <= a[c].cost) return;
        const ak_cpu_work tmp = a[i];
        a[i] = a[c];
        a[c] = tmp;
        i = c;
    }
}

static void sort_largest_first(ak_cpu_work *a, int n)
{
    /* a min-heap whose root is swapped to the end leaves the array descending */
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(a, i, n);
    for (int end = n - 1; end > 0; end--) {
        const ak_cpu_work tmp = a[0];
        a[0] = a[end];
        a[end] = tmp;
        sift_down(a, 0, end);
    }
}

static ak_status cpu_plan(void *state, const ak_batch *batch, const ak_batch_meta *meta, ak_stream stream)
{
    (void)stream;
    cpu_state *s = state;
    s->meta = *meta;
    for (int r = 0; r < batch->num_reqs; r++) s->kv_lens[r] = batch->kv_lens[r];
    s->num_reqs = batch->num_reqs;
    s->num_tokens = s->meta.qo_indptr[batch->num_reqs];

    int64_t total = 0;
    const int num_natural = plan_natural(s, &total);
    plan_split(s, num_natural, total);
    plan_merge_tasks(s);
    sort_largest_first(s->work, s->num_work);
    plan_pack(s);
    return AK_OK;
}

/* ---- run --------------------------------------------------------------------------- */

static void fill_ctx(const cpu_state *s, const ak_run_args *a, ak_cpu_ctx *c)
{
    const ak_attn_config *cfg = &s->cfg;
    memset(c, 0, sizeof *c);
    c->group = s->group;
    c->head_dim_qk = cfg->head_dim_qk;
    c->head_dim_vo = cfg->head_dim_vo;
    c->dqk_pad = s->dqk_pad;
    c->dvo_pad = s->dvo_pad;
    c->sm_scale = cfg->sm_scale;
    c->soft_cap = cfg->logits_soft_cap;
    c->causal = cfg->causal;
    c->window_left = cfg->window_left;
    c->q_dtype = cfg->q_dtype;
    c->kv_dtype = cfg->kv_dtype;
    c->o_dtype = cfg->o_dtype;
    /* a row of whole vectors can be read in place; any other is converted
     * (and zero-padded) into scratch, since a vector load would run past it */
    c->whole_k = cfg->head_dim_qk == s->dqk_pad;
    c->whole_v = cfg->head_dim_vo == s->dvo_pad;

    c->qo_indptr = s->meta.qo_indptr;
    c->kv_lens = s->kv_lens;
    c->kv_indptr = s->meta.kv_indptr;
    c->kv_indices = s->meta.kv_indices;
    c->kv_first_block = s->meta.kv_first_block;

    if (cfg->kv_storage == AK_KV_PAGED) {
        c->page_size = a->kv->page_size;
        c->k_base = a->kv->k_data;
        c->v_base = a->kv->v_data;
        c->k_addr = ak_paged_k_strides(a->kv);
        c->v_addr = ak_paged_v_strides(a->kv);
        c->kv_scale_kind = a->kv->scale_kind;
        c->k_scale = a->kv->k_scale;
        c->v_scale = a->kv->v_scale;
    } else {
        c->page_size = 0;
        c->k_base = a->k->data;
        c->v_base = cfg->mla ? NULL : a->v->data;
        c->k_addr = ak_ragged_strides(a->k);
        c->v_addr = cfg->mla ? c->k_addr : ak_ragged_strides(a->v);
        c->kv_scale_kind = a->kv_scale_kind;
        c->k_scale = a->k_scale;
        c->v_scale = a->v_scale;
    }
    /* MLA: a key's value is the first head_dim_vo values of its K row, so V
     * is addressed as K (same base, same strides, same scale) and every
     * kernel path reads it unchanged */
    c->v_in_k = cfg->mla;
    if (cfg->mla) {
        c->v_base = c->k_base;
        c->v_addr = c->k_addr;
        c->v_scale = c->k_scale;
    }

    c->q = a->q->data;
    c->q_stride0 = a->q->stride[0];
    c->q_stride1 = a->q->stride[1];
    c->o = a->o->data;
    c->o_stride0 = a->o->stride[0];
    c->o_stride1 = a->o->stride[1];
    if (a->lse) {
        c->lse = a->lse->data;
        c->lse_stride0 = a->lse->stride[0];
        c->lse_stride1 = a->lse->stride[1];
    }
    c->sinks = cfg->use_sinks ? (const float *)a->sinks->data : NULL;
    c->part_o = s->part_o;
    c->part_lse = s->part_lse;
    if (s->num_packed > 0) {
        c->pack = s->pack;
        c->kv_pack = s->kv_pack;
        c->pack_tile_elems = s->pack_tile_elems;
    }
}

static ak_status cpu_run(void *state, const ak_run_args *a, ak_stream stream)
{
    (void)stream;
    cpu_state *s = state;
    ak_cpu_ctx c;
    fill_ctx(s, a, &c);
    const ak_cpu_kernels *kern = s->kern;
#if defined(AK_CPU_PHASE_TIMES)
    const double run_start = phase_clock();
#endif
#pragma omp parallel num_threads(s->threads) if (s->num_work > 1)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        const ak_cpu_scratch *sc = &s->scratch[tid];
        AK_PHASE(AK_PHASE_ENTER);
        /* the packed requests' K/V tiles, every thread a share of each */
        for (int r = 0; r < s->num_reqs && s->num_packed > 0; r++) {
            const ak_cpu_pack *pk = &s->pack[r];
            if (pk->first < 0) continue;
#pragma omp for schedule(static) nowait
            for (int i = 0; i < pk->tiles * s->cfg.num_kv_heads; i++)
                kern->pack_tile(&c, r, i / pk->tiles, pk->t0 + i % pk->tiles, sc);
        }
        AK_PHASE(AK_PHASE_PACKED);
        if (s->num_packed > 0) {
#pragma omp barrier
        }
        AK_PHASE(AK_PHASE_PACK_WAITED);
#pragma omp for schedule(dynamic, 1) nowait
        for (int i = 0; i < s->num_work; i++) {
            kern->run_item(&c, &s->work[i], sc);
#if defined(AK_CPU_PHASE_TIMES)
            s->times[tid].items++;
#endif
        }
        AK_PHASE(AK_PHASE_ITEMS);
        /* every partial state is written before a merge */
#pragma omp barrier
        AK_PHASE(AK_PHASE_ITEMS_WAITED);
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < s->num_merges; i++) kern->merge(&c, &s->merges[i], sc);
        AK_PHASE(AK_PHASE_MERGED);
#if defined(AK_CPU_PHASE_TIMES)
        s->times[tid].runs++;
#endif
    }
#if defined(AK_CPU_PHASE_TIMES)
    s->times[s->threads].sum[0] += phase_clock() - run_start;
    s->times[s->threads].runs++;
#endif
    return AK_OK;
}

#if defined(AK_CPU_PHASE_TIMES)
static void phase_times_report(const cpu_state *s)
{
    const cpu_phase_times *all = &s->times[s->threads];
    if (all->runs == 0) return;
    const double ms = 1e3 / (double)all->runs;
    fprintf(stderr, "# cpu phase times, ms per run (%lld runs, %d threads, %d items, %s): wall %.3f\n",
            (long long)all->runs, s->threads, s->num_work, s->kern->isa, all->sum[0] * ms);
    fprintf(stderr, "# thread    fork    pack  p_wait   items  i_wait   merge  items/run\n");
    double busy = 0;
    for (int t = 0; t < s->threads; t++) {
        const cpu_phase_times *x = &s->times[t];
        fprintf(stderr, "# %6d %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %10.1f\n", t, x->sum[0] * ms, x->sum[1] * ms,
                x->sum[2] * ms, x->sum[3] * ms, x->sum[4] * ms, x->sum[5] * ms, (double)x->items / (double)all->runs);
        busy += x->sum[AK_PHASE_ITEMS];
    }
    fprintf(stderr, "# items busy %.1f%% of threads x wall\n", 100.0 * busy / (all->sum[0] * s->threads));
}
#endif

static const int64_t *cpu_slot_mapping(void *state) { return ((cpu_state *)state)->meta.slot_mapping; }

const ak_backend_vtbl ak_backend_cpu = {
    /* .api_version = */ AK_API_VERSION,
    /* .name = */ "cpu",
    /* .device = */ AK_DEVICE_CPU,
    /* .forward_includes_kv_update = */ 0,
    /* .graph_support = */ AK_GRAPH_NEVER,
    /* .check = */ cpu_check,
    /* .create = */ cpu_create,
    /* .plan = */ cpu_plan,
    /* .run = */ cpu_run,
    /* .destroy = */ cpu_destroy,
    /* .slot_mapping = */ cpu_slot_mapping,
    /* .explain = */ cpu_explain,
    /* .meta_buffers = */ NULL, /* (optional) the core's host arrays */
};
