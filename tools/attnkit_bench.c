/*
 * attnkit-bench - times attnkit's backends on engine-shaped batches over a
 * paged KV cache, beside a bandwidth ceiling measured in the same run, and
 * checks them against cpu_ref on the same data.
 *
 * With no arguments (`make run`): a Llama-3-8B mixed step, 62 decodes on 2048
 * keys + 2 prefill chunks of 256 tokens on a 1792-token prefix, on the best
 * backend of this machine (the selector on the GPU if a CUDA backend accepts
 * the batch, else on the CPU), checked against cpu_ref.
 *
 * Method (docs in `--help`): random inputs, shuffled block ids; the KV cache
 * has enough layers that together they exceed 4x the L2 (GPU) / LLC (CPU),
 * and the timed calls cycle through them as a real step does; warm-up, then
 * repeated samples, median reported. GPU: CUDA events around a pass over all
 * layers (eager, or one CUDA-graph replay with --graph), divided by the layer
 * count. CPU: clock_gettime around each call.
 */
#include "attnkit.h"
#include "bench_device.h"
#include "bench_scene.h"
#include "cli_parse.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- constants -------------------------------------------------------------- */

/* Timed samples: at most DEFAULT_MAX_ITERS, at least MIN_ITERS, stopping once
 * SAMPLE_BUDGET_S seconds are spent (unless --iters fixes the count). */
#define DEFAULT_MAX_ITERS 20
#define MIN_ITERS 3
#define SAMPLE_BUDGET_S 2.0
/* Warm-up samples: the GPU's first passes pay for module loading and clocks
 * ramping up; on the CPU one call pages in the buffers and starts the threads. */
#define WARMUP_GPU 3
#define WARMUP_CPU 1
/* A timed sample longer than this gets a note saying how long the rest will
 * take (cpu_ref on a large shape: minutes, otherwise silent). */
#define SLOW_SAMPLE_S 2.0
/* plan() calls timed for the plan-time median. */
#define PLAN_REPS 21
/* Byte written over o before the checked run: all-ones is NaN in f32, f16 and
 * bf16, so an element the backend does not write fails the check. */
#define POISON_BYTE 0xFF
#define DEFAULT_SEED 20240601ull
#define DEFAULT_PAGE_SIZE 16
#define DEFAULT_MODEL "llama3-8b"
#define MAX_BACKENDS 32
#define REASON_LEN 512

/* The defaults of each workload (--batch / --q-len / --kv-len / --prefills
 * override): decode B=64 L=4096 is the reference decode figure of DESIGN.md;
 * prefill 2048 is what bench/cpu_sdpa.py compares; the mixed step is the
 * default job. */
static const bench_shape default_shapes[BW_COUNT] = {
    [BW_DECODE] = {BW_DECODE, 64, 1, 4096, 0, 0, 0},
    [BW_PREFILL] = {BW_PREFILL, 1, 2048, 2048, 0, 0, 0},
    [BW_EXTEND] = {BW_EXTEND, 4, 512, 4096, 0, 0, 0},
    [BW_MIXED] = {BW_MIXED, 64, 256, 2048, 2, 0, 0},
    [BW_VERIFY] = {BW_VERIFY, 32, 4, 4096, 0, 0, 0},
};

/* The defaults when cpu_ref is timed (--backend cpu_ref, AK_BACKEND=cpu_ref,
 * or --backend all on the CPU) and no shape option is given. cpu_ref, the
 * fp64 oracle, runs ~0.2-0.4 GFLOP/s (2-core VM: 0.4 on decode 8 x 1024,
 * 0.3 on these), so the mixed default's 18.2 GFLOP would take 1-1.5 min a
 * call and 5 min or more in all. These are ~0.3 GFLOP a call of llama3-8b
 * (16384 FLOP per query-key pair; the pairs of each below): about a second a
 * call, the whole run in seconds. */
static const bench_shape cpu_ref_shapes[BW_COUNT] = {
    [BW_DECODE] = {BW_DECODE, 16, 1, 1024, 0, 0, 0},    /* 16384 pairs */
    [BW_PREFILL] = {BW_PREFILL, 1, 192, 192, 0, 0, 0},  /* 18528 */
    [BW_EXTEND] = {BW_EXTEND, 1, 32, 512, 0, 0, 0},     /* 15888 */
    [BW_MIXED] = {BW_MIXED, 16, 16, 512, 2, 0, 0},      /* 14 x 512 + 2 x 8072 = 23312 */
    [BW_VERIFY] = {BW_VERIFY, 4, 4, 1024, 0, 0, 0},     /* 16360 */
};

/* --sweep on a GPU: decode across batch and context (B=1 L=4096 is the
 * latency figure to take with --graph; B=256 the plan-time figure), then the
 * other workloads. */
static const bench_shape sweep_gpu[] = {
    {BW_DECODE, 1, 1, 4096, 0, 0, 0},     {BW_DECODE, 1, 1, 32768, 0, 0, 0},    {BW_DECODE, 16, 1, 4096, 0, 0, 0},
    {BW_DECODE, 64, 1, 1024, 0, 0, 0},    {BW_DECODE, 64, 1, 4096, 0, 0, 0},    {BW_DECODE, 128, 1, 8192, 0, 0, 0},
    {BW_DECODE, 256, 1, 1024, 0, 0, 0},   {BW_DECODE, 256, 1, 4096, 0, 0, 0},   {BW_VERIFY, 32, 4, 4096, 0, 0, 0},
    {BW_VERIFY, 64, 8, 2048, 0, 0, 0},    {BW_EXTEND, 4, 512, 4096, 0, 0, 0},   {BW_EXTEND, 1, 2048, 16384, 0, 0, 0},
    {BW_PREFILL, 1, 2048, 2048, 0, 0, 0}, {BW_PREFILL, 1, 8192, 8192, 0, 0, 0}, {BW_PREFILL, 1, 16384, 16384, 0, 0, 0},
    {BW_PREFILL, 8, 1024, 1024, 0, 0, 0}, {BW_MIXED, 64, 256, 2048, 2, 0, 0},   {BW_MIXED, 128, 512, 4096, 2, 0, 0},
};
/* --sweep on the CPU: the same kinds, sized for seconds per row. */
static const bench_shape sweep_cpu[] = {
    {BW_DECODE, 1, 1, 4096, 0, 0, 0},    {BW_DECODE, 16, 1, 1024, 0, 0, 0},    {BW_DECODE, 64, 1, 1024, 0, 0, 0},
    {BW_DECODE, 256, 1, 256, 0, 0, 0},   {BW_VERIFY, 16, 4, 1024, 0, 0, 0},    {BW_EXTEND, 2, 128, 1024, 0, 0, 0},
    {BW_PREFILL, 1, 512, 512, 0, 0, 0},  {BW_PREFILL, 1, 2048, 2048, 0, 0, 0}, {BW_MIXED, 16, 128, 1024, 2, 0, 0},
};
#define COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* --compare: one prompt-prefill batch three ways. The scatter (ak_kv_update
 * of the step's K/V into the paged cache) is timed on its own: paged must run
 * it before its run(); ragged and varlen read the step's K/V directly and
 * need it only to keep the cache for later steps. */
typedef struct compare_variant {
    const char *name;      /* what --compare takes */
    const char *backend;   /* the backend timed */
    ak_kv_storage storage; /* where its run() reads K/V */
} compare_variant;
static const compare_variant compare_variants[] = {
    {"paged", "cuda_paged", AK_KV_PAGED},   /* the paged cache, after the scatter */
    {"ragged", "cuda_paged", AK_KV_RAGGED}, /* cuda_paged's ragged mode on the step's K/V */
    {"varlen", "cuda_varlen", AK_KV_RAGGED},
};
#define NUM_VARIANTS COUNT_OF(compare_variants)
/* --compare --sweep: prompt lengths x batch sizes, for each --model */
static const int compare_prompt_lens[] = {128, 256, 512, 1024, 2048, 4096, 8192, 16384};
static const int compare_batches[] = {1, 4, 16, 64};
/* Shapes above this many query tokens are left out of a compare sweep
 * (--max-tokens): 64 x 16384 tokens of llama3-8b would need ~2x8 GiB of q
 * and o per layer and ~3 s a call. */
#define COMPARE_MAX_TOKENS 262144
#define MAX_MODELS 16

/* ---- options ------------------------------------------------------------------- */

typedef struct options {
    bench_workload workload;
    int workload_set;
    const bench_model *model;
    const char *backend; /* NULL: the selector; "all": every backend of the device */
    ak_device_kind device;
    int device_set;
    int batch, q_len, kv_len, num_prefills; /* 0 / -1: the workload's default */
    int decode_kv_len;                      /* mixed: keys of the decodes (0: kv_len) */
    int lead_kv_len;                        /* the first request's keys (0: kv_len) */
    int page_size, page_size_set; /* MLA presets: 64 unless --page-size says */
    ak_kv_layout layout;
    bench_model custom; /* the preset with --heads / --head-dim applied */
    int window, window_set; /* --window */
    ak_dtype dtype;
    int dtype_set;
    ak_dtype kv_dtype;  /* --kv-dtype */
    int kv_dtype_set;
    int check, json, graph, sweep, kv_update;
    int invariant;      /* --invariant: cfg.batch_invariant */
    int kv_marks;       /* --kv-marks: views with finiteness marks (ak_paged_kv.marks) */
    int non_causal;     /* --non-causal: every query sees every key (an encoder) */
    int device_table;   /* --device-table: plan with the block table in device memory */
    int floor;          /* --floor: CUDA, a note per row with the shape's floor (bench_floor.cu) */
    int iters;  /* 0: budgeted, DEFAULT_MAX_ITERS at most */
    int layers; /* 0: automatic */
    uint64_t seed;
    /* --compare */
    unsigned compare;     /* a bit per compare_variants entry; 0: not comparing */
    const char *csv_path; /* --csv */
    int max_tokens;       /* --max-tokens */
    int num_models;       /* --model a,b,... (compare) */
    bench_model models[MAX_MODELS]; /* the presets with --heads / --head-dim applied */
} options;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: attnkit-bench [options]\n"
        "  --workload W     decode | prefill | extend | mixed | verify (default mixed)\n"
        "                   decode:  B requests, 1 new token on kv_len keys      (64 x 1 on 4096)\n"
        "                   prefill: B prompts, q_len = kv_len                   (1 x 2048)\n"
        "                   extend:  B chunks of q_len tokens on a cached prefix (4 x 512 on 4096)\n"
        "                   verify:  B x q_len speculative tokens on kv_len keys (32 x 4 on 4096)\n"
        "                   mixed:   --prefills chunks of q_len on a prefix + decodes, kv_len each\n"
        "                            (64 requests: 62 decodes + 2 chunks of 256, kv_len 2048)\n"
        "  --decode-kv-len N  mixed: the decodes' keys (default: --kv-len, the chunks' keys)\n"
        "  --lead-kv-len N  the first request's keys instead of --kv-len (prefill: a prompt of N\n"
        "                   tokens; mixed: the first decode, or the first chunk when all are\n"
        "                   chunks): one long request beside short ones (not with --sweep/--compare)\n"
        "  --model M        llama3-8b (default) | llama3-70b-tp8 | qwen2.5-7b | mistral-7b | gemma2-9b\n"
        "                   | phi3-mini (head dim 96) | gpt-oss-20b (64/8, head dim 64, sinks, window 128)\n"
        "                   | deepseek-v3-prefill (16/16 a GPU of 8, head dims 192/128)\n"
        "                   | deepseek-v3, deepseek-v3-tp8 (MLA: 128/1 or 16/1 heads, 576/512, page 64)\n"
        "  --backend NAME   a backend name, or all (every backend of the device; the ones that\n"
        "                   cannot serve the config are listed as skipped); default: AK_BACKEND, else\n"
        "                   the selector. Timing cpu_ref (the slow fp64 reference) with no shape option\n"
        "                   cuts the workload's default to ~0.3 GFLOP a call (the output says so)\n"
        "  --device D       cpu | cuda (default: the named backend's; else cuda when a GPU is found,\n"
        "                   else cpu; the default job moves to the CPU when no CUDA backend accepts\n"
        "                   its batch)\n"
        "  --batch N --q-len N --kv-len N --prefills N (mixed) --page-size N (16)\n"
        "  --heads QO/KV --head-dim D|QK/VO   override the preset's heads / head dims\n"
        "  --window W       override the preset's window_left (-1: full context)\n"
        "  --invariant      cfg.batch_invariant (fixed KV splits: its cost against the default)\n"
        "  --kv-marks       paged views with finiteness marks (ak_paged_kv.marks): the NaN rule's\n"
        "                   scan pass reads a bit a key instead of its K/V rows\n"
        "  --non-causal     cfg.causal = 0: every query token sees every key (an encoder)\n"
        "  --device-table   CUDA, paged: plan with the block table in device memory\n"
        "                   (batch.device_block_table, read in place; plan_us without the O(blocks) copy)\n"
        "  --layout L       nhd (default) | hnd: the paged cache layout\n"
        "  --dtype T        f32 | f16 | bf16 for q, KV and o (default: bf16 on a GPU, f32 on the CPU)\n"
        "  --kv-dtype T     f32 | f16 | bf16 | fp8_e4m3 for KV alone (fp8: q and o bf16 unless --dtype;\n"
        "                   per-head scales; ak_kv_update quantizes the step's rows)\n"
        "  --check          compare with cpu_ref on the same data (a sample of the batch when the\n"
        "                   whole would take long; the output says so). Implied with no arguments.\n"
        "  --json           one JSON object per line on stdout (notes go to stderr)\n"
        "  --iters N        timed samples (default: up to %d within %.0f s, at least %d)\n"
        "  --graph          CUDA only: capture run() for every rotated layer into one CUDA graph\n"
        "                   and time its replays\n"
        "  --kv-update      time ak_kv_update (with the backend's slot mapping) + run() per layer\n"
        "  --floor          CUDA: after each row, a note with the shape's floor, timed as the row is\n"
        "                   (eager or --graph, the same layers): a kernel that only reads the K/V bytes\n"
        "                   the row counts, alone and with a one-block kernel depending on it (what a\n"
        "                   split and its merge cannot avoid), and the row's time over each (with\n"
        "                   --kv-update the row also writes the step's rows, which the floor does not)\n"
        "  --sweep          a built-in list of shapes (restricted to --workload if given)\n"
        "  --compare LIST   CUDA: a prompt-prefill batch (no prefix) run by each of LIST, a comma list of\n"
        "                   paged (cuda_paged on the paged cache), ragged (cuda_paged's ragged mode on the\n"
        "                   step's contiguous K/V), varlen (cuda_varlen on them); prints per shape the\n"
        "                   attention time, the scatter time (ak_kv_update of the step's K/V into the paged\n"
        "                   cache, timed once: paged needs it before run(), ragged and varlen to keep the\n"
        "                   cache), their sum and the winner (least sum). Shape: --batch, --q-len (1 x 2048);\n"
        "                   with --sweep: prompt lengths 128..16384 x batch 1, 4, 16, 64 for each --model\n"
        "                   (a comma list, or all), up to --max-tokens query tokens (%d)\n"
        "  --csv FILE       --compare: also write one CSV row per shape and variant (bench/plot_compare.py\n"
        "                   draws it as an SVG)\n"
        "  --layers N       layers of the cache to rotate through (default: enough to exceed 4x\n"
        "                   the L2 / LLC, as far as memory allows; up to 4096)\n"
        "  --seed N\n"
        "  --version        print the library's version and exit\n"
        "  --help, -h       this text\n"
        "Columns: median time of one layer call; GB/s = (KV rows read once + q + o) / time;\n"
        "GFLOP/s = 2 (dqk + dvo) Hq (sum over query tokens of the keys visible after masking) / time;\n"
        "ceiling = bandwidth measured in this run (CPU: OpenMP streaming read of >= 1 GiB; GPU:\n"
        "device-to-device copy of >= 1 GiB, bytes read + written); frac = GB/s / ceiling (a row\n"
        "above 1 gets a warning line: the ceiling run was slow, or the K/V came from cache);\n"
        "plan_us = median host time of plan().\n"
        "Exit status: 0, 1 when a check fails or a run errs (or --compare finds no GPU), 2 on bad usage\n"
        "(one line on stderr names the argument).\n",
        DEFAULT_MAX_ITERS, SAMPLE_BUDGET_S, MIN_ITERS, COMPARE_MAX_TOKENS);
}

/* A usage error: one line on stderr naming the bad argument, and where the
 * options are listed. Returns -1. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("attnkit-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (attnkit-bench --help lists the options)\n", stderr);
    return -1;
}

/* The most an integer option takes (sizes and counts far inside int) */
#define OPT_MAX 1000000000L

static int parse_int(const char *opt, const char *s, int lo, int *out)
{
    if (!s) return usage_error("%s needs an integer >= %d", opt, lo);
    if (cli_ints(s, 1, 1, lo, OPT_MAX, out) < 0) return usage_error("%s needs an integer >= %d, not '%s'", opt, lo, s);
    return 0;
}

/* "A/B", or where least is 1 also "A" (B = A): each in [1, OPT_MAX]. 0, or -1. */
static int parse_pair(const char *s, int least, int *a, int *b)
{
    int v[2];
    const int n = s ? cli_ints(s, least, 2, 1, OPT_MAX, v) : -1;
    if (n < 0) return -1;
    *a = v[0];
    *b = v[n - 1];
    return 0;
}

static int parse_dtype(const char *s, ak_dtype *t)
{
    if (s && !strcmp(s, "f32")) *t = AK_F32;
    else if (s && !strcmp(s, "f16")) *t = AK_F16;
    else if (s && !strcmp(s, "bf16")) *t = AK_BF16;
    else if (s && !strcmp(s, "fp8_e4m3")) *t = AK_FP8_E4M3;
    else return -1;
    return 0;
}

/* --model: one preset, or (for --compare) a comma list of them or "all".
 * Returns 0 or -1. */
static int parse_models(const char *s, options *o)
{
    if (!s || !*s) return -1;
    o->num_models = 0;
    if (!strcmp(s, "all")) {
        for (int m = 0; m < bench_num_models && m < MAX_MODELS; m++) o->models[o->num_models++] = bench_models[m];
        return 0;
    }
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        const bench_model *m = bench_model_find(tok);
        if (!m || o->num_models >= MAX_MODELS) return -1;
        o->models[o->num_models++] = *m;
    }
    return o->num_models > 0 ? 0 : -1;
}

/* --compare: a comma list of variant names into a bit set. Returns 0 or -1. */
static int parse_variants(const char *s, unsigned *set)
{
    if (!s || !*s) return -1;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    *set = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int found = 0;
        for (int i = 0; i < NUM_VARIANTS; i++)
            if (!strcmp(tok, compare_variants[i].name)) {
                *set |= 1u << i;
                found = 1;
            }
        if (!found) return -1;
    }
    return *set ? 0 : -1;
}

/* Returns 0, 1 for --help, 2 for --version, -1 on a bad option. */
static int parse_options(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->workload = BW_MIXED;
    o->num_models = 1;
    o->models[0] = *bench_model_find(DEFAULT_MODEL);
    o->model = &o->models[0];
    o->max_tokens = COMPARE_MAX_TOKENS;
    o->page_size = DEFAULT_PAGE_SIZE;
    o->num_prefills = -1;
    o->seed = DEFAULT_SEED;
    /* the default job (no arguments, `make run`) is checked against cpu_ref */
    o->check = argc == 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes_value = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (!strcmp(a, "--version")) return 2;
        /* "--workload 'x'", or "--workload" alone when the value is missing */
        char given[96];
        if (v) snprintf(given, sizeof given, "%.30s '%.60s'", a, v);
        else snprintf(given, sizeof given, "%.30s", a);
        if (!strcmp(a, "--workload")) {
            if (!v || bench_workload_parse(v, &o->workload))
                return usage_error("%s: expected decode, prefill, extend, mixed or verify", given);
            o->workload_set = 1;
        } else if (!strcmp(a, "--model")) {
            if (parse_models(v, o)) {
                char names[512] = "";
                for (int m = 0; m < bench_num_models; m++)
                    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", m ? ", " : "",
                             bench_models[m].name);
                return usage_error("%s: expected one of %s (with --compare: a comma list of them, or all)", given,
                                   names);
            }
            o->model = &o->models[0];
        } else if (!strcmp(a, "--compare")) {
            if (parse_variants(v, &o->compare))
                return usage_error("%s: expected a comma list of paged, ragged, varlen", given);
        } else if (!strcmp(a, "--csv")) {
            if (!v) return usage_error("--csv needs a file name");
            o->csv_path = v;
        } else if (!strcmp(a, "--max-tokens")) {
            if (parse_int(a, v, 1, &o->max_tokens)) return -1;
        } else if (!strcmp(a, "--backend")) {
            if (!v) return usage_error("--backend needs a backend name, or all");
            o->backend = v;
        } else if (!strcmp(a, "--device")) {
            if (v && !strcmp(v, "cpu")) o->device = AK_DEVICE_CPU;
            else if (v && !strcmp(v, "cuda")) o->device = AK_DEVICE_CUDA;
            else return usage_error("%s: expected cpu or cuda", given);
            o->device_set = 1;
        } else if (!strcmp(a, "--batch")) {
            if (parse_int(a, v, 1, &o->batch)) return -1;
        } else if (!strcmp(a, "--q-len")) {
            if (parse_int(a, v, 1, &o->q_len)) return -1;
        } else if (!strcmp(a, "--kv-len")) {
            if (parse_int(a, v, 1, &o->kv_len)) return -1;
        } else if (!strcmp(a, "--decode-kv-len")) {
            if (parse_int(a, v, 1, &o->decode_kv_len)) return -1;
        } else if (!strcmp(a, "--lead-kv-len")) {
            if (parse_int(a, v, 1, &o->lead_kv_len)) return -1;
        } else if (!strcmp(a, "--prefills")) {
            if (parse_int(a, v, 0, &o->num_prefills)) return -1;
        } else if (!strcmp(a, "--heads")) {
            if (parse_pair(v, 2, &o->custom.num_qo_heads, &o->custom.num_kv_heads))
                return usage_error("%s: expected QO/KV, e.g. 32/8", given);
        } else if (!strcmp(a, "--head-dim")) {
            if (parse_pair(v, 1, &o->custom.head_dim_qk, &o->custom.head_dim_vo))
                return usage_error("%s: expected D or QK/VO, e.g. 128 or 192/128", given);
        } else if (!strcmp(a, "--window")) {
            if (parse_int(a, v, -1, &o->window)) return -1;
            o->window_set = 1;
        } else if (!strcmp(a, "--layout")) {
            if (!v || (strcmp(v, "nhd") && strcmp(v, "hnd"))) return usage_error("%s: expected nhd or hnd", given);
            o->layout = strcmp(v, "hnd") ? AK_LAYOUT_NHD : AK_LAYOUT_HND;
        } else if (!strcmp(a, "--page-size")) {
            if (parse_int(a, v, 1, &o->page_size)) return -1;
            o->page_size_set = 1;
        } else if (!strcmp(a, "--dtype")) {
            if (parse_dtype(v, &o->dtype) || o->dtype == AK_FP8_E4M3)
                return usage_error("%s: expected f32, f16 or bf16 (fp8_e4m3: --kv-dtype)", given);
            o->dtype_set = 1;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (parse_dtype(v, &o->kv_dtype)) return usage_error("%s: expected f32, f16, bf16 or fp8_e4m3", given);
            o->kv_dtype_set = 1;
        } else if (!strcmp(a, "--iters")) {
            if (parse_int(a, v, 1, &o->iters)) return -1;
        } else if (!strcmp(a, "--layers")) {
            if (parse_int(a, v, 1, &o->layers)) return -1;
        } else if (!strcmp(a, "--seed")) {
            char *end = NULL;
            errno = 0;
            if (v) o->seed = strtoull(v, &end, 10);
            if (!v || !isdigit((unsigned char)*v) || *end || errno == ERANGE)
                return usage_error("%s: expected an integer in [0, 2^64)", given);
        } else {
            takes_value = 0;
            if (!strcmp(a, "--check")) o->check = 1;
            else if (!strcmp(a, "--json")) o->json = 1;
            else if (!strcmp(a, "--graph")) o->graph = 1;
            else if (!strcmp(a, "--sweep")) o->sweep = 1;
            else if (!strcmp(a, "--kv-update")) o->kv_update = 1;
            else if (!strcmp(a, "--invariant")) o->invariant = 1;
            else if (!strcmp(a, "--kv-marks")) o->kv_marks = 1;
            else if (!strcmp(a, "--device-table")) o->device_table = 1;
            else if (!strcmp(a, "--floor")) o->floor = 1;
            else if (!strcmp(a, "--non-causal")) o->non_causal = 1;
            else return usage_error("unknown option '%s'", a);
        }
        i += takes_value;
    }
    /* --heads / --head-dim: applied to the copies of the presets */
    if (o->custom.num_qo_heads && o->custom.num_qo_heads % o->custom.num_kv_heads)
        return usage_error("--heads %d/%d: QO must be a multiple of KV", o->custom.num_qo_heads,
                           o->custom.num_kv_heads);
    for (int i = 0; i < o->num_models; i++) {
        bench_model *m = &o->models[i];
        if (o->custom.num_qo_heads) {
            m->num_qo_heads = o->custom.num_qo_heads;
            m->num_kv_heads = o->custom.num_kv_heads;
        }
        if (o->custom.head_dim_qk) {
            m->head_dim_qk = o->custom.head_dim_qk;
            m->head_dim_vo = o->custom.head_dim_vo;
        }
        if (o->window_set) m->window_left = o->window;
        if (o->non_causal) m->non_causal = 1;
    }
    o->model = &o->models[0];
    /* MLA engines page the latent cache by 64 tokens (FlashMLA's block size) */
    if (o->model->mla && !o->page_size_set) o->page_size = 64;
    if (o->num_models > 1 && !o->compare)
        return usage_error("--model takes one preset (a list only with --compare)");
    if (o->csv_path && !o->compare) return usage_error("--csv goes with --compare (--json for the other modes)");
    if (o->lead_kv_len && (o->compare || o->sweep))
        return usage_error("--lead-kv-len shapes a single run (not --%s)", o->compare ? "compare" : "sweep");
    if (o->compare) {
        const char *clash = o->json ? "--json (use --csv)" : o->backend ? "--backend" : o->kv_update ? "--kv-update"
                          : o->workload_set && o->workload != BW_PREFILL ? "--workload other than prefill"
                          : o->device_set && o->device != AK_DEVICE_CUDA ? "--device cpu" : NULL;
        if (clash)
            return usage_error("--compare times its own CUDA backends on prompt prefills; %s does not apply", clash);
        o->workload = BW_PREFILL;
    }
    return 0;
}

/* The backend asked for by name: --backend, else AK_BACKEND (which
 * ak_backend_create obeys when given no name); NULL: the selector's choice. */
static const char *asked_backend(const options *o)
{
    const char *env = getenv("AK_BACKEND");
    return o->backend ? o->backend : env && *env ? env : NULL;
}

/* Whether a shape option was given (else the workload's default shape). */
static int shape_given(const options *o)
{
    return o->batch || o->q_len || o->kv_len || o->num_prefills >= 0 || o->decode_kv_len || o->lead_kv_len;
}

/* The shape of a single (non-sweep) run: the workload's defaults with the
 * options' overrides. Returns 0 or -1. */
static int single_shape(const options *o, bench_shape *s)
{
    *s = default_shapes[o->workload];
    if (o->batch) s->batch = o->batch;
    if (o->kv_len) s->kv_len = o->kv_len;
    switch (o->workload) {
    case BW_DECODE:
        if (o->q_len > 1)
            return usage_error("--q-len %d: decode has q_len 1 (--workload verify or extend for more)", o->q_len);
        break;
    case BW_PREFILL:
        /* a prefill sees its whole prompt: one length sets both */
        if (o->q_len && o->kv_len && o->q_len != o->kv_len)
            return usage_error("--q-len %d --kv-len %d: prefill has q_len = kv_len (--workload extend for a chunk "
                               "on a prefix)", o->q_len, o->kv_len);
        if (o->q_len) s->q_len = s->kv_len = o->q_len;
        if (o->kv_len) s->q_len = s->kv_len = o->kv_len;
        break;
    default:
        if (o->q_len) s->q_len = o->q_len;
        if (s->q_len > s->kv_len) {
            if (o->kv_len && o->q_len) return usage_error("--q-len %d > --kv-len %d", s->q_len, s->kv_len);
            if (o->kv_len)
                return usage_error("--kv-len %d is below the workload's q_len %d (--q-len sets it)", s->kv_len,
                                   s->q_len);
            s->kv_len = s->q_len; /* only --q-len was given: a chunk with no prefix */
        }
        break;
    }
    if (o->workload == BW_MIXED) {
        if (o->num_prefills >= 0) s->num_prefills = o->num_prefills;
        s->decode_kv_len = o->decode_kv_len;
        if (s->num_prefills > s->batch) {
            if (o->num_prefills >= 0) return usage_error("--prefills %d > batch %d", s->num_prefills, s->batch);
            s->num_prefills = s->batch;
        }
    }
    /* the first request: a decode in a mixed batch with decodes (they come
     * first), else one of q_len tokens (prefill: a prompt of lead_kv_len) */
    s->lead_kv_len = o->lead_kv_len;
    const int lead_q = o->workload == BW_DECODE || (o->workload == BW_MIXED && s->num_prefills < s->batch) ? 1
                       : o->workload == BW_PREFILL                                                    ? 0
                                                                                                      : s->q_len;
    if (s->lead_kv_len && s->lead_kv_len < lead_q)
        return usage_error("--lead-kv-len %d is below the first request's q_len %d", s->lead_kv_len, lead_q);
    return 0;
}

/* ---- output ------------------------------------------------------------------------ */

typedef struct row {
    const char *backend;
    const char *status; /* "ok", "fail" (check), "skipped", "error" */
    char reason[REASON_LEN];
    int graph;
    int samples;
    double median_ms, min_ms, plan_us, gbps, gflops, frac;
    int checked, check_ok;
    double max_rel_err;
    double floor_ms, floor_tail_ms; /* --floor: 0 when not measured */
} row;

/* Notes: stdout for the table, stderr when stdout carries JSON. */
static FILE *note_stream(const options *o) { return o->json ? stderr : stdout; }

static void note(const options *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const options *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(note_stream(o), fmt, ap);
    va_end(ap);
    fflush(note_stream(o));
}

static void json_string(const char *s)
{
    putchar('"');
    for (; s && *s; s++) {
        const unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch == '\n') printf("\\n");
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

/* A number, or null when it is not finite (JSON has no inf / NaN). */
static void json_number(const char *key, double v, const char *fmt)
{
    printf(",\"%s\":", key);
    if (isfinite(v)) printf(fmt, v);
    else printf("null");
}

static void print_json(const options *o, const bench_scene *sc, const bd_ceiling *ceil_, const row *r)
{
    const ak_attn_config *c = &sc->cfg;
    printf("{\"backend\":");
    json_string(r->backend);
    printf(",\"status\":\"%s\"", r->status);
    if (r->reason[0]) {
        printf(",\"reason\":");
        json_string(r->reason);
    }
    printf(",\"device\":\"%s\",\"workload\":\"%s\",\"model\":\"%s\",\"dtype\":\"%s\"",
           c->device.kind == AK_DEVICE_CUDA ? "cuda" : "cpu", bench_workload_name(sc->shape.workload),
           sc->model->name, ak_dtype_name(c->kv_dtype));
    if (sc->shape.workload == BW_MIXED && sc->shape.decode_kv_len)
        printf(",\"decode_kv_len\":%d", sc->shape.decode_kv_len);
    if (sc->shape.lead_kv_len) printf(",\"lead_kv_len\":%d", sc->shape.lead_kv_len);
    printf(",\"batch\":%d,\"q_len\":%d,\"kv_len\":%d,\"num_prefills\":%d,\"page_size\":%d", sc->shape.batch,
           sc->shape.workload == BW_DECODE ? 1 : sc->shape.q_len, sc->shape.kv_len,
           sc->shape.workload == BW_MIXED ? sc->shape.num_prefills : 0, c->page_size);
    printf(",\"layout\":\"%s\",\"kv_marks\":%s", c->kv_layout == AK_LAYOUT_HND ? "hnd" : "nhd",
           sc->kv_marks ? "true" : "false");
    printf(",\"num_qo_heads\":%d,\"num_kv_heads\":%d,\"head_dim\":%d,\"head_dim_vo\":%d", c->num_qo_heads,
           c->num_kv_heads, c->head_dim_qk, c->head_dim_vo);
    printf(",\"causal\":%s,\"window_left\":%d,\"sinks\":%s,\"batch_invariant\":%s", c->causal ? "true" : "false", c->window_left,
           c->use_sinks ? "true" : "false", c->batch_invariant ? "true" : "false");
    printf(",\"num_tokens\":%d,\"num_kv_tokens\":%lld,\"layers\":%d,\"graph\":%s,\"kv_update\":%s",
           sc->b.num_tokens, (long long)sc->b.num_kv_tokens, sc->num_layers, r->graph ? "true" : "false",
           o->kv_update ? "true" : "false");
    printf(",\"flop_per_call\":%.6g,\"bytes_per_call\":%.6g", sc->flops, sc->bytes);
    const int ran = !strcmp(r->status, "ok") || !strcmp(r->status, "fail");
    if (ran) {
        printf(",\"samples\":%d", r->samples);
        json_number("median_ms", r->median_ms, "%.6g");
        json_number("min_ms", r->min_ms, "%.6g");
        json_number("plan_us", r->plan_us, "%.4g");
        json_number("gbps", r->gbps, "%.6g");
        json_number("gflops", r->gflops, "%.6g");
        json_number("tflops", r->gflops / 1e3, "%.6g");
        printf(",\"ceiling_name\":\"%s\"", ceil_->name);
        json_number("ceiling_gbps", ceil_->gbps, "%.6g");
        json_number("ceiling_fraction", r->frac, "%.4g");
        if (r->floor_ms > 0) {
            json_number("floor_read_ms", r->floor_ms, "%.6g");
            json_number("floor_read_tail_ms", r->floor_tail_ms, "%.6g");
        }
    }
    if (r->checked) json_number("max_rel_err", r->max_rel_err, "%.3g");
    else printf(",\"max_rel_err\":null");
    printf(",\"check\":\"%s\"}\n", !r->checked ? "off" : r->check_ok ? "pass" : "fail");
    fflush(stdout);
}

static void print_table_header(void)
{
    printf("%-20s %-8s %-15s %5s %6s %6s %5s %6s %8s %10s %9s %9s %12s %5s  %s\n", "backend", "workload",
           "model", "batch", "q_len", "kv_len", "dtype", "layers", "plan_us", "median_ms", "GB/s", "GFLOP/s",
           "ceiling_GB/s", "frac", "check (max rel err)");
}

static void print_row(const bench_scene *sc, const bd_ceiling *ceil_, const row *r)
{
    char name[64];
    snprintf(name, sizeof name, "%s%s", r->backend, r->graph ? "+graph" : "");
    char layers[16] = "-"; /* none allocated when the row never ran */
    if (sc->num_layers > 0) snprintf(layers, sizeof layers, "%d", sc->num_layers);
    printf("%-20s %-8s %-15s %5d %6d %6d %5s %6s", name, bench_workload_name(sc->shape.workload),
           sc->model->name, sc->shape.batch, sc->shape.workload == BW_DECODE ? 1 : sc->shape.q_len,
           sc->shape.kv_len, ak_dtype_name(sc->cfg.kv_dtype), layers);
    if (!strcmp(r->status, "skipped") || !strcmp(r->status, "error")) {
        printf("  %s: %s\n", r->status, r->reason);
        fflush(stdout);
        return;
    }
    printf(" %8.1f %10.4f %9.1f %9.1f %12.1f %5.2f  ", r->plan_us, r->median_ms, r->gbps, r->gflops, ceil_->gbps,
           r->frac);
    if (!r->checked) printf("-");
    else printf("%s %.2e", r->check_ok ? "ok" : "FAIL", r->max_rel_err);
    if (r->reason[0]) printf("  (%s)", r->reason);
    printf("\n");
    fflush(stdout);
}

/* ---- timing one backend --------------------------------------------------------------- */

/* The work of one sample: per_sample layer calls, cycling through the layers. */
typedef struct layer_runner {
    const bench_scene *sc;
    ak_backend *b;
    ak_stream stream;
    int kv_update;        /* call ak_kv_update before each run() */
    int ragged;           /* the backend reads the layer's ragged K/V, not its cache */
    const int64_t *slots; /* the backend's slot mapping, on its device */
    int next_layer;
    int per_sample;
    char err[REASON_LEN];
} layer_runner;

static int run_layers(void *arg)
{
    layer_runner *lr = arg;
    const bench_scene *sc = lr->sc;
    for (int i = 0; i < lr->per_sample; i++) {
        const int l = lr->next_layer;
        lr->next_layer = (lr->next_layer + 1) % sc->num_layers;
        if (lr->kv_update) {
            const ak_tensor k = scene_k_new(sc), v = scene_v_new(sc);
            const ak_status st =
                ak_kv_update(&sc->kv[l], &k, sc->cfg.mla ? NULL : &v, lr->slots, sc->b.num_tokens, lr->stream);
            if (st != AK_OK) {
                snprintf(lr->err, sizeof lr->err, "ak_kv_update(layer %d): %s: %s", l, ak_status_str(st),
                         ak_last_error());
                return -1;
            }
        }
        ak_tensor q = scene_q(sc, l), o = scene_o(sc, l);
        ak_tensor k, v; /* ragged K/V */
        ak_run_args args;
        ak_run_args_init(&args);
        args.q = &q;
        if (lr->ragged) {
            k = scene_k_rag(sc, l);
            v = scene_v_rag(sc, l);
            args.k = &k;
            args.v = sc->cfg.mla ? NULL : &v; /* MLA: the value is read from the K rows */
            scene_ragged_scales(sc, &args);
        } else {
            args.kv = &sc->kv[l];
        }
        args.o = &o;
        const ak_tensor sinks = scene_sinks(sc);
        if (sc->cfg.use_sinks) args.sinks = &sinks;
        const ak_status st = ak_backend_run(lr->b, &args, lr->stream);
        if (st != AK_OK) {
            snprintf(lr->err, sizeof lr->err, "run(layer %d): %s: %s", l, ak_status_str(st), ak_last_error());
            return -1;
        }
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Whether every request of the batch has the same q_len (what a graph of
 * "uniform batch" support replays). */
static int batch_is_uniform(const bench_scene *sc)
{
    for (int r = 1; r < sc->b.num_reqs; r++)
        if (sc->b.qo_indptr[r + 1] - sc->b.qo_indptr[r] != sc->b.qo_indptr[1] - sc->b.qo_indptr[0]) return 0;
    return 1;
}

/* Why a CUDA graph of this backend cannot replay this batch (NULL if it can). */
static const char *graph_obstacle(const bench_scene *sc, ak_backend *b)
{
    if (sc->cfg.device.kind != AK_DEVICE_CUDA) return "CUDA graphs need --device cuda";
    switch (ak_backend_graph_support(b)) {
    case AK_GRAPH_NEVER: return "the backend's run() is not capturable (graph support: never)";
    case AK_GRAPH_DECODE_ONLY:
        return sc->b.num_tokens == sc->b.num_reqs && batch_is_uniform(sc)
                   ? NULL
                   : "the backend's graphs replay decode batches only (graph support: decode_only)";
    case AK_GRAPH_UNIFORM_BATCH:
        return batch_is_uniform(sc) ? NULL
                                    : "the backend's graphs need one q_len for all requests (graph support: "
                                      "uniform_batch)";
    case AK_GRAPH_ALWAYS: return NULL;
    }
    return "unknown graph support";
}

/* Warm-up, then timed samples of `work` (each one `calls` layer calls) until
 * --iters of them, or MIN_ITERS once SAMPLE_BUDGET_S has passed; the median
 * and least time per call. Returns the number of samples, or -1 when the work
 * (or the device) fails. */
static int sample_work(const options *o, const bd_ctx *ctx, const char *what, bd_work_fn work, void *arg,
                       double calls, double *median_ms, double *min_ms)
{
    const int max_samples = o->iters ? o->iters : DEFAULT_MAX_ITERS;
    double *samples = malloc(sizeof(double) * (size_t)max_samples);
    if (!samples) {
        fprintf(stderr, "attnkit-bench: out of host memory\n");
        return -1;
    }
    const int warmup = ctx->dev.kind == AK_DEVICE_CUDA ? WARMUP_GPU : WARMUP_CPU;
    double ms = 0;
    int n = 0;
    for (int i = 0; i < warmup; i++)
        if (bd_time(ctx, work, arg, &ms)) goto failed;
    if (ms > SLOW_SAMPLE_S * 1e3) {
        /* past the budget after the first sample: MIN_ITERS of them, or --iters */
        const int left = o->iters ? o->iters : MIN_ITERS;
        note(o, "# %s: %.1f s a sample (the warm-up's); %d to time, ~%.0f s\n", what, ms * 1e-3, left,
             left * ms * 1e-3);
    }
    const double t_start = bd_now();
    while (n < max_samples) {
        if (bd_time(ctx, work, arg, &ms)) goto failed;
        samples[n++] = ms / calls;
        if (!o->iters && n >= MIN_ITERS && bd_now() - t_start > SAMPLE_BUDGET_S) break;
    }
    *min_ms = samples[0];
    for (int i = 1; i < n; i++)
        if (samples[i] < *min_ms) *min_ms = samples[i];
    *median_ms = median_of(samples, n);
    free(samples);
    return n;
failed:
    free(samples);
    return -1;
}

/* --floor's work: per layer, the read of that layer's K/V bytes (and a
 * dependent one-block kernel when tail is set). */
typedef struct floor_runner {
    const bd_ctx *ctx;
    const bench_scene *sc;
    int tail;
    void *sink;
} floor_runner;

static int run_floor(void *arg)
{
    const floor_runner *fr = arg;
    const bench_scene *sc = fr->sc;
    for (int l = 0; l < sc->num_layers; l++)
        if (bd_floor_enqueue(fr->ctx, sc->kv[l].k_data, sc->k_read_bytes, sc->kv[l].v_data, sc->v_read_bytes,
                             fr->tail, fr->sink))
            return -1;
    return 0;
}

/* Times run_floor as the row was timed (eager, or one graph of every
 * layer), alone and with its tail; r->floor_ms stays 0 if it fails. */
static void measure_floor(const options *o, const bd_ctx *ctx, const bench_scene *sc, row *r)
{
    floor_runner fr = {ctx, sc, 0, bd_malloc(ctx, 64)};
    if (!fr.sink || bd_memset(ctx, fr.sink, 0, 64)) goto done;
    /* one eager pass first: the kernels' module loads, and bench_floor.cu
     * asks how they were compiled, outside any capture */
    if (run_floor(&fr) || bd_sync(ctx)) goto done;
    for (int tail = 0; tail < 2; tail++) {
        fr.tail = tail;
        bd_graph graph;
        memset(&graph, 0, sizeof graph);
        bd_graph_launch_arg launch = {ctx, &graph};
        bd_work_fn work = run_floor;
        void *arg = &fr;
        if (o->graph) {
            if (bd_graph_capture(ctx, run_floor, &fr, &graph)) goto done;
            work = bd_graph_launch_fn;
            arg = &launch;
        }
        double median = 0, least = 0;
        const int n = sample_work(o, ctx, "floor", work, arg, (double)sc->num_layers, &median, &least);
        bd_graph_destroy(&graph);
        if (n < 0) goto done;
        *(tail ? &r->floor_tail_ms : &r->floor_ms) = median;
    }
done:
    if (r->floor_tail_ms <= 0) r->floor_ms = 0;
    bd_sync(ctx);
    bd_free(ctx, fr.sink);
}

/* Plans, times, checks one backend on the scene; fills r. Returns 0, or -1
 * when the row is an error (r says why). */
static int bench_batch(const options *o, const bd_ctx *ctx, const bench_scene *sc, const bench_ref *ref,
                         const bd_ceiling *ceil_, ak_backend *b, const ak_batch *batch, row *r)
{
    memset(r, 0, sizeof *r);
    r->backend = ak_backend_name(b);
    r->status = "error";
    r->graph = o->graph;
    const int on_gpu = ctx->dev.kind == AK_DEVICE_CUDA;

    /* plan: host time of each call; the sync after it keeps a plan's
     * asynchronous copies from overlapping the next one's staging */
    double plan_us[PLAN_REPS];
    for (int i = 0; i < PLAN_REPS; i++) {
        const double t0 = bd_now();
        const ak_status st = ak_backend_plan(b, batch, ctx->stream);
        plan_us[i] = 1e6 * (bd_now() - t0);
        if (st != AK_OK) {
            snprintf(r->reason, sizeof r->reason, "plan: %s: %s", ak_status_str(st), ak_last_error());
            return -1;
        }
        if (bd_sync(ctx)) {
            snprintf(r->reason, sizeof r->reason, "device error after plan (see stderr)");
            return -1;
        }
    }
    r->plan_us = median_of(plan_us, PLAN_REPS);

    layer_runner lr;
    memset(&lr, 0, sizeof lr);
    lr.sc = sc;
    lr.b = b;
    lr.stream = ctx->stream;
    lr.ragged = ak_backend_config(b)->kv_storage == AK_KV_RAGGED;
    /* GPU: a sample is a pass over every layer, so short calls are timed back
     * to back as in a step; CPU: one call per sample, the next layer each time */
    lr.per_sample = on_gpu ? sc->num_layers : 1;
    if (o->kv_update) {
        if (ak_backend_forward_includes_kv_update(b)) {
            snprintf(r->reason, sizeof r->reason, "run() writes the KV itself: ak_kv_update not called");
        } else {
            lr.kv_update = 1;
            lr.slots = ak_backend_slot_mapping(b);
            if (!lr.slots) {
                snprintf(r->reason, sizeof r->reason, "--kv-update: the backend gives no slot mapping");
                return -1;
            }
        }
    }

    bd_graph graph;
    memset(&graph, 0, sizeof graph);
    bd_graph_launch_arg launch = {ctx, &graph};
    bd_work_fn work = run_layers;
    void *work_arg = &lr;
    if (o->graph) {
        const char *why = graph_obstacle(sc, b);
        if (why) {
            r->status = "skipped";
            snprintf(r->reason, sizeof r->reason, "%s", why);
            return 0;
        }
        /* one eager pass first, as engines warm up before capturing: a
         * backend's first run may set itself up in ways a capture forbids */
        lr.next_layer = 0;
        if (run_layers(&lr) || bd_sync(ctx)) {
            snprintf(r->reason, sizeof r->reason, "eager run before capture: %.400s",
                     lr.err[0] ? lr.err : "device error (see stderr)");
            return -1;
        }
        lr.next_layer = 0;
        if (bd_graph_capture(ctx, run_layers, &lr, &graph)) {
            snprintf(r->reason, sizeof r->reason, "graph capture failed%s%.400s", lr.err[0] ? ": " : " (see stderr)",
                     lr.err);
            return -1;
        }
        work = bd_graph_launch_fn;
        work_arg = &launch;
    }

    int rc = -1;
    const int n = sample_work(o, ctx, r->backend, work, work_arg, (double)lr.per_sample, &r->median_ms, &r->min_ms);
    if (n < 0) goto run_failed;
    r->samples = n;
    r->gbps = sc->bytes / (r->median_ms * 1e-3) / 1e9;
    r->gflops = sc->flops / (r->median_ms * 1e-3) / 1e9;
    r->frac = ceil_->gbps > 0 ? r->gbps / ceil_->gbps : NAN;
    r->status = "ok";
    if (o->floor && on_gpu) measure_floor(o, ctx, sc, r);

    if (ref) {
        /* the checked run: o poisoned, then layer 0 computed once more (by a
         * graph replay in graph mode, which writes every layer's o) */
        const size_t ob = sc->o_layer_bytes;
        void *o_host = malloc(ob + 1);
        if (!o_host) {
            snprintf(r->reason, sizeof r->reason, "check: out of host memory");
            r->status = "error";
            goto done;
        }
        lr.next_layer = 0;
        lr.per_sample = 1;
        int fail = bd_memset(ctx, sc->o, POISON_BYTE, ob);
        if (!fail) fail = o->graph ? bd_graph_launch(ctx, &graph) : run_layers(&lr);
        if (!fail) fail = bd_sync(ctx);
        if (!fail) fail = bd_download(ctx, o_host, sc->o, ob);
        if (fail) {
            free(o_host);
            goto run_failed;
        }
        char bad[256];
        r->checked = 1;
        r->max_rel_err = ref_compare(ref, sc, o_host, bad, sizeof bad);
        r->check_ok = !bad[0] && r->max_rel_err <= ref_tolerance(sc->cfg.o_dtype);
        if (bad[0]) snprintf(r->reason, sizeof r->reason, "%s", bad);
        else if (!r->check_ok)
            snprintf(r->reason, sizeof r->reason, "error above the %s tolerance %.0e",
                     ak_dtype_name(sc->cfg.o_dtype), ref_tolerance(sc->cfg.o_dtype));
        if (!r->check_ok) r->status = "fail";
        free(o_host);
    }
    rc = 0;
    goto done;
run_failed:
    r->status = "error";
    snprintf(r->reason, sizeof r->reason, "%s", lr.err[0] ? lr.err : "device error (see stderr)");
done:
    bd_graph_destroy(&graph);
    return rc;
}

/* bench_batch on the scene's batch; with --device-table (CUDA, paged) its
 * block table goes to device memory first, as an engine keeps it, and every
 * plan reads it in place. */
static int bench_backend(const options *o, const bd_ctx *ctx, const bench_scene *sc, const bench_ref *ref,
                         const bd_ceiling *ceil_, ak_backend *b, row *r)
{
    ak_batch batch = sc->b.batch;
    void *table_d = NULL;
    if (o->device_table && ctx->dev.kind == AK_DEVICE_CUDA && batch.block_table) {
        const size_t bytes = sizeof(int32_t) * (size_t)batch.num_reqs * (size_t)batch.block_table_stride;
        table_d = bd_malloc(ctx, bytes);
        if (!table_d || bd_upload(ctx, table_d, batch.block_table, bytes)) {
            bd_free(ctx, table_d);
            memset(r, 0, sizeof *r);
            r->backend = ak_backend_name(b);
            r->status = "error";
            snprintf(r->reason, sizeof r->reason, "--device-table: cannot place the block table on the device");
            return -1;
        }
        batch.device_block_table = table_d;
        batch.block_table = NULL;
    }
    const int rc = bench_batch(o, ctx, sc, ref, ceil_, b, &batch, r);
    bd_free(ctx, table_d);
    return rc;
}

/* ---- devices, ceilings ------------------------------------------------------------------- */

typedef struct bench_state {
    options opt;
    bd_ctx ctx[2];      /* [ak_device_kind] */
    int opened[2];      /* 1 open, -1 failed */
    bd_ceiling ceil_[2];
    int have_ceiling[2];
    int failures;       /* rows that failed a check or erred */
    int ran;            /* rows that ran */
    int ran_on[2];      /* rows that ran, per device kind */
    int header_printed;
} bench_state;

/* q's and o's dtype, and K/V's (kv_dtype_for) */
static ak_dtype dtype_for(const options *o, ak_device_kind kind)
{
    if (o->dtype_set) return o->dtype;
    if (o->kv_dtype_set && o->kv_dtype == AK_FP8_E4M3) return AK_BF16;
    return kind == AK_DEVICE_CUDA ? AK_BF16 : AK_F32;
}

static ak_dtype kv_dtype_for(const options *o, ak_device_kind kind)
{
    return o->kv_dtype_set ? o->kv_dtype : dtype_for(o, kind);
}

static const bd_ctx *get_ctx(bench_state *st, ak_device_kind kind)
{
    if (st->opened[kind] == 0) {
        const ak_device dev = {kind, 0};
        st->opened[kind] = bd_open(&st->ctx[kind], dev) == 0 ? 1 : -1;
        if (st->opened[kind] == 1) {
            const bd_ctx *c = &st->ctx[kind];
            if (kind == AK_DEVICE_CPU) {
                /* the kernel the cpu backend runs for the run's dtypes */
                ak_attn_config cfg;
                ak_attn_config_init(&cfg);
                cfg.q_dtype = cfg.o_dtype = dtype_for(&st->opt, AK_DEVICE_CPU);
                cfg.kv_dtype = kv_dtype_for(&st->opt, AK_DEVICE_CPU);
                char kernel[256];
                ak_cpu_kernel_describe(&cfg, kernel, sizeof kernel);
                note(&st->opt, "# device cpu:0 %s, %d threads, LLC %.0f MiB, cpu kernel: %s\n", c->info.name,
                     ak_cpu_num_threads(), (double)c->cache_bytes / (1 << 20), kernel);
            } else
                note(&st->opt, "# device cuda:0 %s, sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB\n", c->info.name,
                     c->info.cc_major, c->info.cc_minor, c->info.num_sms, (double)c->info.memory_bytes / (1 << 30),
                     (double)c->cache_bytes / (1 << 20));
        }
    }
    return st->opened[kind] == 1 ? &st->ctx[kind] : NULL;
}

static const bd_ceiling *get_ceiling(bench_state *st, const bd_ctx *ctx)
{
    const ak_device_kind k = ctx->dev.kind;
    if (!st->have_ceiling[k]) {
        if (bd_measure_ceiling(ctx, &st->ceil_[k]) != 0) {
            st->ceil_[k].name = k == AK_DEVICE_CUDA ? "d2d_copy" : "stream_read";
            st->ceil_[k].gbps = NAN;
        } else if (k == AK_DEVICE_CPU) {
            note(&st->opt, "# ceiling stream_read: %.1f GB/s (%d OpenMP threads summing %.2f GiB, median of reps)\n",
                 st->ceil_[k].gbps, st->ceil_[k].threads, (double)st->ceil_[k].bytes / (1 << 30));
        } else {
            note(&st->opt, "# ceiling d2d_copy: %.1f GB/s (cudaMemcpyAsync of %.2f GiB, read + write, CUDA events, "
                           "median of reps)\n",
                 st->ceil_[k].gbps, (double)st->ceil_[k].bytes / (1 << 30));
        }
        st->have_ceiling[k] = 1;
    }
    return &st->ceil_[k];
}

/* The reason a backend gives in the selector's listing ("  name  - why; why"),
 * or the whole message when the listing does not name it. */
static void backend_reason(const char *msg, const char *name, char *out, size_t cap)
{
    const size_t nl = strlen(name);
    for (const char *line = msg; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *p = line;
        while (*p == ' ') p++;
        if (!strncmp(p, name, nl) && p[nl] == ' ') {
            p += nl;
            while (*p == ' ') p++;
            if (!strncmp(p, "- ", 2)) p += 2;
            const char *end = strchr(p, '\n');
            const int len = end ? (int)(end - p) : (int)strlen(p);
            snprintf(out, cap, "%.*s", len, p);
            return;
        }
    }
    snprintf(out, cap, "%s", msg);
    for (char *q = out; *q; q++)
        if (*q == '\n') *q = ' ';
}

/* ---- one shape ------------------------------------------------------------------------------- */

/* Result of trying a shape on a device. */
enum { SHAPE_DONE = 0, SHAPE_NO_BACKEND = 1 };

static void emit(bench_state *st, const bench_scene *sc, const bd_ceiling *ceil_, const row *r)
{
    if (st->opt.json) {
        print_json(&st->opt, sc, ceil_, r);
    } else {
        if (!st->header_printed) {
            print_table_header();
            st->header_printed = 1;
        }
        print_row(sc, ceil_, r);
    }
    /* a row above its ceiling: the ceiling is no bound, so frac means little */
    const int ran = !strcmp(r->status, "ok") || !strcmp(r->status, "fail");
    if (ran && r->floor_ms > 0)
        note(&st->opt, "# %s floor: %.3g MB of K/V read by a kernel alone %.4f ms (row / floor %.2f); with a "
                       "dependent one-block kernel %.4f ms (row / floor %.2f)\n",
             r->backend, (double)(sc->k_read_bytes + sc->v_read_bytes) / 1e6, r->floor_ms,
             r->median_ms / r->floor_ms, r->floor_tail_ms, r->median_ms / r->floor_tail_ms);
    if (ran && isfinite(r->frac) && r->frac > 1)
        note(&st->opt, "# %s: frac %.2f > 1, faster than the %s ceiling of %.1f GB/s: the ceiling run was slow (a "
                       "noisy machine?) or this shape's K/V came from cache\n",
             r->backend, r->frac, ceil_->name, ceil_->gbps);
}

/* Runs one shape on one device. With allow_fallback (the default run on a
 * GPU) a selector that finds no CUDA backend returns SHAPE_NO_BACKEND
 * without printing a row, so the caller can go to the CPU. */
static int run_shape(bench_state *st, const bench_shape *shape, ak_device_kind kind, int allow_fallback)
{
    const options *o = &st->opt;
    const bd_ctx *ctx = get_ctx(st, kind);
    if (!ctx) {
        if (allow_fallback) return SHAPE_NO_BACKEND;
        st->failures++;
        return SHAPE_DONE;
    }
    bench_scene sc;
    if (scene_init(&sc, ctx, o->model, shape, dtype_for(o, kind), kv_dtype_for(o, kind), o->page_size, o->layout,
                   o->invariant, o->seed)) {
        scene_free(&sc);
        st->failures++;
        return SHAPE_DONE;
    }
    sc.kv_marks = o->kv_marks;

    /* the backends to time */
    const char *names[MAX_BACKENDS];
    int nnames = 0;
    if (!o->backend) {
        names[nnames++] = NULL;
    } else if (!strcmp(o->backend, "all")) {
        for (int i = 0; i < ak_backend_count() && nnames < MAX_BACKENDS; i++) {
            const char *nm = ak_backend_name_at(i);
            /* CUDA backends are named cuda_*, as the test harness assumes */
            if ((strncmp(nm, "cuda", 4) == 0) == (kind == AK_DEVICE_CUDA)) names[nnames++] = nm;
        }
    } else {
        names[nnames++] = o->backend;
    }

    ak_backend *backends[MAX_BACKENDS];
    int nb = 0;
    bd_ceiling no_ceiling = {kind == AK_DEVICE_CUDA ? "d2d_copy" : "stream_read", NAN, 0, 0};
    for (int i = 0; i < nnames; i++) {
        ak_backend *b = NULL;
        const ak_status s = ak_backend_create(&sc.cfg, &sc.lim, names[i], &b);
        if (s == AK_OK) {
            backends[nb++] = b;
            continue;
        }
        if (!names[i] && allow_fallback) {
            char why[REASON_LEN];
            snprintf(why, sizeof why, "%s", ak_last_error());
            note(o, "# no CUDA backend accepts this batch; running it on the CPU. The selector said:\n");
            for (char *line = strtok(why, "\n"); line; line = strtok(NULL, "\n")) note(o, "#   %s\n", line);
            scene_free(&sc);
            return SHAPE_NO_BACKEND;
        }
        row r;
        memset(&r, 0, sizeof r);
        r.backend = names[i] ? names[i] : "(selector)";
        r.status = "skipped";
        if (s == AK_ERR_BACKEND_NOT_FOUND) {
            /* "no backend is named X (did you mean Y?)", then this build's */
            char said[REASON_LEN];
            ak_backend_describe(names[i] ? names[i] : asked_backend(o), &sc.cfg, &ctx->info, said, sizeof said);
            int len = snprintf(r.reason, sizeof r.reason, "%s; the backends are", said);
            for (int k = 0; k < ak_backend_count() && len > 0 && (size_t)len < sizeof r.reason; k++)
                len += snprintf(r.reason + len, sizeof r.reason - (size_t)len, "%s %s", k ? "," : "",
                                ak_backend_name_at(k));
        } else if (names[i])
            backend_reason(ak_last_error(), names[i], r.reason, sizeof r.reason);
        else snprintf(r.reason, sizeof r.reason, "%s: %s", ak_status_str(s), ak_last_error());
        /* a single named (or selected) backend that cannot run is a failure of
         * the run; in `all` and in sweeps, unsupported is a skip */
        if (!o->sweep && !(o->backend && !strcmp(o->backend, "all"))) st->failures++;
        emit(st, &sc, &no_ceiling, &r);
    }
    if (nb == 0) {
        scene_free(&sc);
        return SHAPE_DONE;
    }
    /* whatever create() left in flight is done before the scene is filled */
    if (bd_sync(ctx)) {
        st->failures++;
        for (int i = 0; i < nb; i++) ak_backend_destroy(backends[i]);
        scene_free(&sc);
        return SHAPE_DONE;
    }

    const bd_ceiling *ceil_ = get_ceiling(st, ctx);
    char desc[512];
    scene_describe(&sc, desc, sizeof desc);
    note(o, "# %s\n", desc);
    bench_ref ref;
    memset(&ref, 0, sizeof ref);
    int have_ref = 0;
    if (scene_alloc(&sc, o->layers, o->seed) == 0) {
        note(o, "# %d layer%s rotated (%s); per call %.3g GFLOP, %.3g MB\n", sc.num_layers,
             sc.num_layers == 1 ? "" : "s", sc.layers_why, sc.flops / 1e9, sc.bytes / 1e6);
        /* MLA sits near an H100's balance point (~240 FLOP a byte of bf16
         * tensor-core work against its bandwidth): say which bound applies */
        if (sc.cfg.mla)
            note(o, "# MLA: %.0f FLOP a byte moved: %s-bound on an H100 (balance ~240 FLOP a byte); read "
                    "frac against copy bandwidth and GFLOP/s against the tensor cores' peak\n",
                 sc.flops / sc.bytes, sc.flops / sc.bytes > 240 ? "compute" : "memory");
        if (o->check) {
            have_ref = ref_build(&ref, &sc) == 0;
            if (have_ref) {
                ref_describe(&ref, &sc, desc, sizeof desc);
                note(o, "# %s\n", desc);
            }
        }
        for (int i = 0; i < nb; i++) {
            row r;
            if (o->check && !have_ref) {
                memset(&r, 0, sizeof r);
                r.backend = ak_backend_name(backends[i]);
                r.status = "error";
                snprintf(r.reason, sizeof r.reason, "the cpu_ref check could not be built (see stderr)");
            } else {
                bench_backend(o, ctx, &sc, have_ref ? &ref : NULL, ceil_, backends[i], &r);
            }
            if (!strcmp(r.status, "ok") || !strcmp(r.status, "fail")) {
                st->ran++;
                st->ran_on[kind]++;
            }
            if (!strcmp(r.status, "fail") || !strcmp(r.status, "error")) st->failures++;
            emit(st, &sc, ceil_, &r);
        }
    } else {
        for (int i = 0; i < nb; i++) {
            row r;
            memset(&r, 0, sizeof r);
            r.backend = ak_backend_name(backends[i]);
            r.status = "error";
            snprintf(r.reason, sizeof r.reason, "could not allocate or fill the scene (see stderr)");
            st->failures++;
            emit(st, &sc, ceil_, &r);
        }
    }
    ref_free(&ref);
    for (int i = 0; i < nb; i++) ak_backend_destroy(backends[i]);
    scene_free(&sc);
    return SHAPE_DONE;
}

/* ---- --compare: paged vs ragged vs varlen on prompt prefills ------------------------------------ */

/* ak_kv_update of the step's K/V into every layer's cache (the scatter). */
typedef struct scatter_runner {
    const bench_scene *sc;
    ak_stream stream;
} scatter_runner;

static int run_scatter(void *arg)
{
    const scatter_runner *sr = arg;
    const bench_scene *sc = sr->sc;
    const ak_tensor k = scene_k_new(sc), v = scene_v_new(sc);
    for (int l = 0; l < sc->num_layers; l++) {
        const ak_status st = ak_kv_update(&sc->kv[l], &k, sc->cfg.mla ? NULL : &v, sc->slots, sc->b.num_tokens,
                                          sr->stream);
        if (st != AK_OK) {
            fprintf(stderr, "attnkit-bench: ak_kv_update(layer %d): %s: %s\n", l, ak_status_str(st), ak_last_error());
            return -1;
        }
    }
    return 0;
}

/* A CSV field: quoted when it holds a comma, a quote or a newline. */
static void csv_field(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s == '\n' ? ' ' : *s, f);
    }
    fputc('"', f);
}

static void csv_header(FILE *f)
{
    fprintf(f, "device,model,num_qo_heads,num_kv_heads,head_dim,dtype,page_size,batch,prompt_len,num_tokens,layers,"
               "variant,backend,status,attn_ms,scatter_ms,sum_ms,attn_tflops,winner,check,max_rel_err,reason\n");
}

static void csv_row(FILE *f, const bd_ctx *ctx, const bench_scene *sc, const compare_variant *v, const row *r,
                    double scatter_ms, int winner)
{
    const ak_attn_config *c = &sc->cfg;
    const int ran = !strcmp(r->status, "ok") || !strcmp(r->status, "fail");
    csv_field(f, ctx->info.name);
    fputc(',', f);
    csv_field(f, sc->model->name);
    fprintf(f, ",%d,%d,%d,%s,%d,%d,%d,%d,%d,%s,%s,%s,", c->num_qo_heads, c->num_kv_heads, c->head_dim_qk,
            ak_dtype_name(c->kv_dtype), c->page_size, sc->shape.batch, sc->shape.q_len, sc->b.num_tokens,
            sc->num_layers, v->name, v->backend, r->status);
    if (ran) fprintf(f, "%.6g,%.6g,%.6g,%.6g,", r->median_ms, scatter_ms, r->median_ms + scatter_ms, r->gflops / 1e3);
    else fprintf(f, ",%.6g,,,", scatter_ms);
    fprintf(f, "%d,%s,", winner, !r->checked ? "off" : r->check_ok ? "pass" : "fail");
    if (r->checked) fprintf(f, "%.3g", r->max_rel_err);
    fputc(',', f);
    csv_field(f, r->reason);
    fputc('\n', f);
    fflush(f);
}

static void print_compare_header(void)
{
    printf("%-15s %-5s %5s %6s %-7s %-12s %6s %10s %10s %10s %8s %7s  %s\n", "model", "dtype", "batch", "prompt",
           "variant", "backend", "layers", "attn_ms", "scatter_ms", "sum_ms", "TFLOP/s", "vs_best",
           "check (max rel err)");
}

/* One prompt-prefill shape, each variant of --compare. */
static void compare_shape(bench_state *st, const bd_ctx *ctx, const bench_model *m, int batch, int prompt, FILE *csv)
{
    const options *o = &st->opt;
    const bench_shape shape = {BW_PREFILL, batch, prompt, prompt, 0, 0, 0};
    bench_scene sc;
    if (scene_init(&sc, ctx, m, &shape, dtype_for(o, AK_DEVICE_CUDA), kv_dtype_for(o, AK_DEVICE_CUDA), o->page_size,
                   o->layout, o->invariant, o->seed)) {
        scene_free(&sc);
        st->failures++;
        return;
    }
    sc.ragged_kv = 1;
    sc.kv_marks = o->kv_marks;

    /* the backends first: their static buffers are allocated before the scene takes what memory is left */
    ak_backend *b[NUM_VARIANTS];
    row rows[NUM_VARIANTS];
    for (int i = 0; i < NUM_VARIANTS; i++) {
        b[i] = NULL;
        memset(&rows[i], 0, sizeof rows[i]);
        rows[i].backend = compare_variants[i].backend;
        rows[i].status = "skipped";
        if (!(o->compare & (1u << i))) continue;
        ak_attn_config cfg = sc.cfg;
        cfg.kv_storage = compare_variants[i].storage;
        const ak_status s = ak_backend_create(&cfg, &sc.lim, compare_variants[i].backend, &b[i]);
        if (s != AK_OK) {
            if (s == AK_ERR_UNSUPPORTED) backend_reason(ak_last_error(), compare_variants[i].backend, rows[i].reason,
                                                        sizeof rows[i].reason);
            else snprintf(rows[i].reason, sizeof rows[i].reason, "%s: %s", ak_status_str(s), ak_last_error());
            if (s != AK_ERR_UNSUPPORTED && s != AK_ERR_BACKEND_NOT_FOUND) {
                rows[i].status = "error";
                st->failures++;
            }
        }
    }
    double scatter_ms = NAN, scatter_min = NAN;
    bench_ref ref;
    memset(&ref, 0, sizeof ref);
    int have_ref = 0;
    /* the ceiling before the scene, which takes what memory the budget allows (as run_shape) */
    const bd_ceiling *ceil_ = bd_sync(ctx) ? NULL : get_ceiling(st, ctx);
    if (!ceil_ || scene_alloc(&sc, o->layers, o->seed)) {
        for (int i = 0; i < NUM_VARIANTS; i++)
            if (b[i]) {
                rows[i].status = "error";
                snprintf(rows[i].reason, sizeof rows[i].reason, "could not allocate or fill the scene (see stderr)");
                st->failures++;
            }
    } else {
        char desc[512];
        scene_describe(&sc, desc, sizeof desc);
        note(o, "# %s\n# %d layer%s rotated (%s)\n", desc, sc.num_layers, sc.num_layers == 1 ? "" : "s",
             sc.layers_why);
        if (o->check) {
            have_ref = ref_build(&ref, &sc) == 0;
            if (!have_ref) st->failures++;
        }
        scatter_runner sr = {&sc, ctx->stream};
        if (sample_work(o, ctx, "scatter", run_scatter, &sr, (double)sc.num_layers, &scatter_ms, &scatter_min) < 0) {
            scatter_ms = NAN;
            st->failures++;
        }
        /* attention alone: run() per layer, no kv_update in the timed pass */
        options attn_only = *o;
        attn_only.kv_update = 0;
        for (int i = 0; i < NUM_VARIANTS; i++) {
            if (!b[i]) continue;
            if (o->check && !have_ref) {
                rows[i].status = "error";
                snprintf(rows[i].reason, sizeof rows[i].reason, "the cpu_ref check could not be built (see stderr)");
                continue;
            }
            bench_backend(&attn_only, ctx, &sc, have_ref ? &ref : NULL, ceil_, b[i], &rows[i]);
            if (!strcmp(rows[i].status, "ok") || !strcmp(rows[i].status, "fail")) st->ran++;
            if (!strcmp(rows[i].status, "fail") || !strcmp(rows[i].status, "error")) st->failures++;
        }
    }

    /* the winner: least attention + scatter among the rows that ran and passed */
    int best = -1;
    for (int i = 0; i < NUM_VARIANTS; i++)
        if ((o->compare & (1u << i)) && !strcmp(rows[i].status, "ok") &&
            (best < 0 || rows[i].median_ms < rows[best].median_ms))
            best = i;
    const double best_sum = best >= 0 ? rows[best].median_ms + scatter_ms : NAN;
    if (!st->header_printed) {
        print_compare_header();
        st->header_printed = 1;
    }
    for (int i = 0; i < NUM_VARIANTS; i++) {
        if (!(o->compare & (1u << i))) continue;
        const row *r = &rows[i];
        printf("%-15s %-5s %5d %6d %-7s %-12s %6d", m->name, ak_dtype_name(sc.cfg.kv_dtype), batch, prompt,
               compare_variants[i].name, r->backend, sc.num_layers);
        if (strcmp(r->status, "ok") && strcmp(r->status, "fail")) {
            printf("  %s: %s\n", r->status, r->reason);
        } else {
            const double sum = r->median_ms + scatter_ms;
            printf(" %10.4f %10.4f %10.4f %8.1f %6.2fx  ", r->median_ms, scatter_ms, sum, r->gflops / 1e3,
                   sum / best_sum);
            if (!r->checked) printf("-");
            else printf("%s %.2e", r->check_ok ? "ok" : "FAIL", r->max_rel_err);
            if (r->reason[0]) printf("  (%s)", r->reason);
            printf("\n");
        }
        if (csv) csv_row(csv, ctx, &sc, &compare_variants[i], r, scatter_ms, i == best);
    }
    if (best >= 0)
        printf("# winner %s batch %d prompt %d: %s (%s), attention %.4f + scatter %.4f = %.4f ms\n", m->name, batch,
               prompt, compare_variants[best].name, compare_variants[best].backend, rows[best].median_ms, scatter_ms,
               best_sum);
    else
        printf("# winner %s batch %d prompt %d: none (no variant ran and passed)\n", m->name, batch, prompt);
    fflush(stdout);
    ref_free(&ref);
    for (int i = 0; i < NUM_VARIANTS; i++) ak_backend_destroy(b[i]);
    scene_free(&sc);
}

/* --compare: the shapes (one, or the sweep), each variant, the table and the CSV. */
static int run_compare(bench_state *st)
{
    const options *o = &st->opt;
    if (ak_device_count(AK_DEVICE_CUDA) == 0) {
        fprintf(stderr, "attnkit-bench: --compare times CUDA backends (cuda_paged, cuda_varlen) and needs a GPU; "
                        "none was found (or this build has no CUDA)\n");
        return 1;
    }
    bench_shape one;
    if (!o->sweep && single_shape(o, &one)) return 2;
    const bd_ctx *ctx = get_ctx(st, AK_DEVICE_CUDA);
    if (!ctx) return 1;
    FILE *csv = NULL;
    if (o->csv_path) {
        csv = fopen(o->csv_path, "w");
        if (!csv) {
            fprintf(stderr, "attnkit-bench: --csv %s: cannot open for writing\n", o->csv_path);
            return 1;
        }
        csv_header(csv);
    }
    char list[64] = "";
    for (int i = 0; i < NUM_VARIANTS; i++)
        if (o->compare & (1u << i))
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? "," : "",
                     compare_variants[i].name);
    note(o, "# compare %s: a prompt-prefill batch (no prefix); attention = run() alone per layer; scatter = "
            "ak_kv_update of the step's K/V into the paged cache (the same op for every variant: paged needs it "
            "before run(), ragged and varlen only to keep the cache); winner = least attention + scatter\n",
         list);

    const int nlens = o->sweep ? COUNT_OF(compare_prompt_lens) : 1;
    const int nbatch = o->sweep ? COUNT_OF(compare_batches) : 1;
    const int total = o->num_models * nbatch * nlens;
    int done = 0, left_out = 0;
    for (int mi = 0; mi < o->num_models; mi++)
        for (int bi = 0; bi < nbatch; bi++)
            for (int li = 0; li < nlens; li++) {
                const int batch = o->sweep ? compare_batches[bi] : one.batch;
                const int prompt = o->sweep ? compare_prompt_lens[li] : one.q_len;
                done++;
                if (o->sweep && (int64_t)batch * prompt > o->max_tokens) {
                    left_out++;
                    continue;
                }
                fprintf(stderr, "[%d/%d] %s batch %d prompt %d\n", done, total, o->models[mi].name, batch, prompt);
                compare_shape(st, ctx, &o->models[mi], batch, prompt, csv);
            }
    if (left_out)
        fprintf(stderr, "attnkit-bench: %d shape%s above --max-tokens %d query tokens left out\n", left_out,
                left_out == 1 ? "" : "s", o->max_tokens);
    if (csv) {
        fclose(csv);
        note(o, "# CSV: %s (python3 bench/plot_compare.py %s -o compare.svg)\n", o->csv_path, o->csv_path);
    }
    printf("# median of per-layer times (CUDA events around a pass over the rotated layers, / layers); vs_best = "
           "sum / the shape's least sum\n");
    bd_close(&st->ctx[AK_DEVICE_CUDA]);
    st->opened[AK_DEVICE_CUDA] = 0;
    return st->failures ? 1 : 0;
}

/* ---- main ---------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    bench_state st;
    memset(&st, 0, sizeof st);
    const int p = parse_options(argc, argv, &st.opt);
    if (p == 2) {
        printf("attnkit %s\n", ak_version_string());
        return 0;
    }
    if (p > 0) {
        usage(stdout);
        return 0;
    }
    if (p < 0) return 2;
    const options *o = &st.opt;
    if (o->compare) return run_compare(&st);

    /* the device: as asked; else the one a named backend runs on (CUDA
     * backends are named cuda_*, as the test harness assumes); else the GPU
     * if present, and a CUDA build that finds none says it runs on the CPU */
    const char *asked = asked_backend(o);
    ak_device_kind kind = AK_DEVICE_CPU;
    int allow_fallback = 0, say_no_gpu = 0;
    if (o->device_set) kind = o->device;
    else if (asked && strcmp(asked, "all") != 0) kind = strncmp(asked, "cuda", 4) == 0 ? AK_DEVICE_CUDA : AK_DEVICE_CPU;
    else if (ak_device_count(AK_DEVICE_CUDA) > 0) {
        kind = AK_DEVICE_CUDA;
        /* the selector's single run may move to the CPU; a sweep skips instead */
        allow_fallback = !asked && !o->sweep;
    } else {
        for (int i = 0; i < ak_backend_count(); i++) say_no_gpu |= strncmp(ak_backend_name_at(i), "cuda", 4) == 0;
    }
    if (kind == AK_DEVICE_CUDA && ak_device_count(AK_DEVICE_CUDA) == 0) {
        fprintf(stderr, "attnkit-bench: no CUDA device found (or this build has no CUDA)\n");
        return 1;
    }
    if (o->graph && kind != AK_DEVICE_CUDA) {
        usage_error("--graph needs a CUDA device");
        return 2;
    }
    if (o->floor && kind != AK_DEVICE_CUDA) {
        usage_error("--floor needs a CUDA device");
        return 2;
    }

    bench_shape shapes[64];
    int nshapes = 0;
    if (o->sweep) {
        const bench_shape *list = kind == AK_DEVICE_CUDA ? sweep_gpu : sweep_cpu;
        const int n = kind == AK_DEVICE_CUDA ? COUNT_OF(sweep_gpu) : COUNT_OF(sweep_cpu);
        for (int i = 0; i < n && nshapes < COUNT_OF(shapes); i++)
            if (!o->workload_set || list[i].workload == o->workload) shapes[nshapes++] = list[i];
    } else {
        if (single_shape(o, &shapes[0])) return 2;
        nshapes = 1;
        /* cpu_ref among the backends timed and no shape asked for: the
         * workload's default would take minutes a call */
        const int times_cpu_ref = asked && (!strcmp(asked, "cpu_ref") || (!strcmp(asked, "all") && kind == AK_DEVICE_CPU));
        if (times_cpu_ref && !shape_given(o)) {
            const bench_shape *c = &cpu_ref_shapes[o->workload];
            shapes[0] = *c;
            note(o, "# cpu_ref, the fp64 reference, runs ~0.3 GFLOP/s: the %s default is cut to batch %d, q_len %d, "
                    "kv_len %d, to take seconds (--batch, --q-len, --kv-len set a shape)\n",
                 bench_workload_name(o->workload), c->batch, c->workload == BW_DECODE ? 1 : c->q_len, c->kv_len);
        }
    }

    /* said once the options are known to be good */
    if (say_no_gpu) fprintf(stderr, "attnkit-bench: no CUDA device; running on the CPU\n");
    for (int i = 0; i < nshapes; i++) {
        const bench_shape *s = &shapes[i];
        if (o->sweep)
            fprintf(stderr, "[%d/%d] %s batch %d q_len %d kv_len %d\n", i + 1, nshapes,
                    bench_workload_name(s->workload), s->batch, s->q_len, s->kv_len);
        if (run_shape(&st, s, kind, allow_fallback) == SHAPE_NO_BACKEND) run_shape(&st, s, AK_DEVICE_CPU, 0);
    }

    if (!o->json && st.ran > 0) {
        printf("# median of per-call times; GB/s counts each KV row once + q + o; frac = GB/s / ceiling\n");
        if (st.ran_on[AK_DEVICE_CUDA])
            printf("# GPU: CUDA events around a pass over the rotated layers (eager, or one graph replay), / layers\n");
        if (st.ran_on[AK_DEVICE_CPU]) printf("# CPU: clock_gettime around each call, the layers in turn\n");
    }
    for (int k = 0; k < 2; k++)
        if (st.opened[k] == 1) bd_close(&st.ctx[k]);
    return st.failures ? 1 : 0;
}
