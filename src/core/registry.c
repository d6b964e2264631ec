/*
 * registry.c - the backend table, the selector, and the public backend calls
 * (create / plan / run / destroy) that wrap every backend's vtable.
 *
 * Selection: an explicit name, else AK_BACKEND, else the first row of the
 * rule table that matches the config, whose backends are tried in order: the
 * first whose check() gives no reason wins. A named backend that is unknown
 * or cannot serve the config is an error listing every backend with its
 * reasons; it never falls back silently.
 */
#include "backend.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every backend compiled in, in the order attnkit-info lists them. */
static const ak_backend_vtbl *const registry[] = {
    &ak_backend_cpu,
    &ak_backend_cpu_ref,
#ifdef AK_HAVE_CUDA
    &ak_backend_cuda_paged,
    &ak_backend_cuda_varlen,
    &ak_backend_cuda_mla,
#endif
};
#define REGISTRY_SIZE ((int)(sizeof registry / sizeof registry[0]))

/* The project's backends this build leaves out: a name of one is told apart
 * from a typo, and a typo of one still finds it. */
static const char *const not_built[] = {
#ifndef AK_HAVE_CUDA
    "cuda_paged",
    "cuda_varlen",
    "cuda_mla",
#endif
    NULL,
};
#define NOT_BUILT_WHY "attnkit was built without CUDA"

/* ---- the selector's rules ------------------------------------------------ */

/* A rule row matches a config by device, K/V storage and workload (RULE_ANY = any
 * value); the first matching row gives the backends to try, best first.
 * Every choice between two backends that can both serve a config lives here,
 * with the measurement behind it. */
#define RULE_ANY (-1)
#define RULE_MAX_BACKENDS 4

typedef struct select_rule {
    const char *name;      /* printed by ak_explain / attnkit-info when it fires */
    ak_device_kind device;
    int kv_storage;        /* ak_kv_storage or RULE_ANY */
    int workload;          /* ak_workload or RULE_ANY */
    const char *backends[RULE_MAX_BACKENDS]; /* tried in order; NULL ends the list */
    const char *evidence;  /* why this order: the measurement, or what it rests on */
    int mla_only;          /* 1: matches cfg.mla configs only (0: any config) */
} select_rule;

static const select_rule rules[] = {
    /* Multi-head latent attention: its own backend on the GPU (absorbed form,
     * the latent row shared by every head); on the CPU the cpu row below */
    {"cuda mla", AK_DEVICE_CUDA, RULE_ANY, RULE_ANY, {"cuda_mla"},
     "cfg.mla: cuda_mla is the CUDA backend that reads a latent (K-only) cache; cuda_paged and cuda_varlen "
     "refuse MLA", 1},
    /* Ragged K/V (contiguous rows, no page table): prompt prefill without a
     * prefix, encoder self-attention, cross-attention. cuda_varlen runs every
     * request through the prefill kernel in one launch; cuda_paged's ragged
     * mode adds the decode kernel and split-KV with a merge pass. */
    {"cuda ragged decode", AK_DEVICE_CUDA, AK_KV_RAGGED, AK_WORKLOAD_DECODE, {"cuda_paged", "cuda_varlen"},
     "q_len 1 only: cuda_paged's decode kernel with split-KV fills the GPU on long keys, where cuda_varlen "
     "would run one token per prefill tile, unsplit (not yet measured: see docs/BACKENDS.md)", 0},
    {"cuda ragged", AK_DEVICE_CUDA, AK_KV_RAGGED, RULE_ANY, {"cuda_varlen", "cuda_paged"},
     "prefill with no prefix on contiguous K/V: cuda_varlen equals cuda_paged's ragged mode within 4% and "
     "plans one launch, no merge; both run attention 1.03-1.27x faster than on the paged cache, equal at "
     "llama3-8b 1x16384 (H200 llama3-8b bf16, 26 shapes; H100 qwen2.5/mistral/gemma2/llama3-70b-tp8, "
     "12 shapes: docs/BACKENDS.md, attnkit-bench --compare paged,ragged,varlen)", 0},
    {"cuda paged", AK_DEVICE_CUDA, AK_KV_PAGED, RULE_ANY, {"cuda_paged"},
     "the only CUDA backend that reads a paged cache", 0},
    /* cpu_ref is last on the CPU: always correct, never fast */
    {"cpu", AK_DEVICE_CPU, RULE_ANY, RULE_ANY, {"cpu", "cpu_ref"},
     "cpu: SIMD + OpenMP flash attention; cpu_ref: the fp64 oracle (BENCHMARKS.md)", 0},
};
#define NUM_RULES ((int)(sizeof rules / sizeof rules[0]))

static int rule_matches(const select_rule *r, const ak_attn_config *cfg)
{
    return r->device == cfg->device.kind && (!r->mla_only || cfg->mla) &&
           (r->kv_storage == RULE_ANY || r->kv_storage == (int)cfg->kv_storage) &&
           (r->workload == RULE_ANY || r->workload == (int)cfg->workload);
}

/* The first rule that matches cfg (NULL if none does). */
static const select_rule *match_rule(const ak_attn_config *cfg)
{
    for (int i = 0; i < NUM_RULES; i++)
        if (rule_matches(&rules[i], cfg)) return &rules[i];
    return NULL;
}

int ak_backend_count(void) { return REGISTRY_SIZE; }

const char *ak_backend_name_at(int i)
{
    return i >= 0 && i < REGISTRY_SIZE ? registry[i]->name : NULL;
}

static const ak_backend_vtbl *find(const char *name)
{
    for (int i = 0; i < REGISTRY_SIZE; i++)
        if (strcmp(registry[i]->name, name) == 0) return registry[i];
    return NULL;
}

/* ---- an unknown name: the closest known one ----------------------------------- */

/* A suggestion is at most this many edits (insert, delete, substitute) away,
 * and fewer than half the name's length: "cuda_page" finds cuda_paged, "CPU"
 * finds cpu, "nope" finds nothing. */
#define SUGGEST_MAX_EDITS 3
#define SUGGEST_MAX_LEN 64

/* Levenshtein distance between a and b, letters compared case-insensitively;
 * SUGGEST_MAX_EDITS + 1 for names longer than SUGGEST_MAX_LEN. */
static int edit_distance(const char *a, const char *b)
{
    const int na = (int)strlen(a), nb = (int)strlen(b);
    if (na > SUGGEST_MAX_LEN || nb > SUGGEST_MAX_LEN) return SUGGEST_MAX_EDITS + 1;
    int row[SUGGEST_MAX_LEN + 1]; /* row[j]: distance of a[0, i) to b[0, j) */
    for (int j = 0; j <= nb; j++) row[j] = j;
    for (int i = 1; i <= na; i++) {
        int diag = row[0]; /* distance of a[0, i-1) to b[0, j-1) */
        row[0] = i;
        for (int j = 1; j <= nb; j++) {
            const int same = tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 1]);
            const int best = diag + !same < row[j] + 1 ? diag + !same : row[j] + 1;
            diag = row[j];
            row[j] = best < row[j - 1] + 1 ? best : row[j - 1] + 1;
        }
    }
    return row[nb];
}

/* The known backend name closest to `name` (this build's first, then
 * not_built's), or NULL when none is close; *built says which list. */
static const char *closest_name(const char *name, int *built)
{
    const char *best = NULL;
    int best_d = SUGGEST_MAX_EDITS + 1;
    for (int i = 0; i < REGISTRY_SIZE + (int)(sizeof not_built / sizeof *not_built); i++) {
        const char *cand = i < REGISTRY_SIZE ? registry[i]->name : not_built[i - REGISTRY_SIZE];
        if (!cand) continue;
        const int d = edit_distance(name, cand);
        if (d < best_d && 2 * d < (int)strlen(name)) {
            best = cand;
            best_d = d;
            *built = i < REGISTRY_SIZE;
        }
    }
    return best;
}

/* What to say of an unknown name (after "NAME names no backend"): the
 * closest known one, or nothing. */
static void suggest(char *buf, size_t cap, const char *name)
{
    int built = 0;
    const char *near = closest_name(name, &built);
    if (!near) buf[0] = '\0';
    else if (!strcmp(near, name)) snprintf(buf, cap, " in this build (%s)", NOT_BUILT_WHY);
    else if (built) snprintf(buf, cap, " (did you mean %s?)", near);
    else snprintf(buf, cap, " (did you mean %s? %s)", near, NOT_BUILT_WHY);
}

static const char *device_kind_name(ak_device_kind k)
{
    return k == AK_DEVICE_CUDA ? "cuda" : k == AK_DEVICE_CPU ? "cpu" : "not a device kind";
}

/* Why vt cannot serve cfg on the device described by dev (NULL if that device
 * is absent): the device class first, then the backend's own check(). */
static int reasons_for(const ak_backend_vtbl *vt, const ak_attn_config *cfg,
                       const ak_device_info *dev, ak_reasons *why)
{
    memset(why, 0, sizeof *why);
    if (vt->device != cfg->device.kind) {
        ak_reason_add(why, "runs on %s, cfg.device is %s", device_kind_name(vt->device),
                      device_kind_name(cfg->device.kind));
        return why->count;
    }
    if (!dev) {
        ak_reason_add(why, "no %s device %d is present", device_kind_name(cfg->device.kind),
                      cfg->device.index);
        return why->count;
    }
    return vt->check(cfg, dev, why);
}

static ak_device_info matrix_device(ak_device_kind kind);

/* A growing text buffer that never overflows. */
typedef struct textbuf {
    char *buf;
    size_t cap, len;
} textbuf;

static void tb_printf(textbuf *tb, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void tb_printf(textbuf *tb, const char *fmt, ...)
{
    if (!tb->buf || tb->cap == 0 || tb->len + 1 >= tb->cap) return;
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(tb->buf + tb->len, tb->cap - tb->len, fmt, ap);
    va_end(ap);
    if (n > 0) tb->len = tb->len + (size_t)n < tb->cap ? tb->len + (size_t)n : tb->cap - 1;
}

static void describe_config(textbuf *tb, const ak_attn_config *c)
{
    tb_printf(tb, "config: heads %d/%d, head_dim %d/%d, q/kv/o %s/%s/%s, %s, window %d, soft-cap %g, ",
              c->num_qo_heads, c->num_kv_heads, c->head_dim_qk, c->head_dim_vo,
              ak_dtype_name(c->q_dtype), ak_dtype_name(c->kv_dtype), ak_dtype_name(c->o_dtype),
              c->causal ? "causal" : "non-causal", c->window_left, c->logits_soft_cap);
    if (c->kv_storage == AK_KV_PAGED)
        tb_printf(tb, "paged %s page %d, ", c->kv_layout == AK_LAYOUT_NHD ? "NHD" : "HND", c->page_size);
    else
        tb_printf(tb, "ragged K/V, ");
    tb_printf(tb, "workload %s, ", c->workload == AK_WORKLOAD_DECODE ? "decode" : "any");
    if (c->mla) tb_printf(tb, "MLA (V = the first %d values of each K row), ", c->head_dim_vo);
    tb_printf(tb, "device %s:%d\n", device_kind_name(c->device.kind), c->device.index);
    if (c->mla)
        tb_printf(tb, "MLA chunks: up to %d new tokens a request run faster absorbed (this config), longer ones "
                      "expanded (head dims 192/128): ak_mla_prefer_absorbed, docs/BACKENDS.md\n",
                  AK_MLA_ABSORBED_MAX_Q_LEN);
}

/* The one selection routine behind ak_backend_create and ak_explain. Writes
 * the explanation into tb (which may have a NULL buffer) and the winner into
 * *chosen (NULL on failure). The returned status carries a message listing
 * every backend with its reasons when no backend can be used. */
static ak_status select_backend(const ak_attn_config *cfg, const char *name,
                                const ak_backend_vtbl **chosen, textbuf *tb)
{
    *chosen = NULL;
    AK_TRY(ak_config_validate(cfg));
    ak_device_info info;
    ak_error_kept kept; /* (no device is an answer here, not this call's error) */
    ak_error_keep(&kept);
    const int have_dev = ak_device_get_info(cfg->device, &info) == AK_OK;
    ak_error_restore(&kept);

    const char *rule_src = "name";
    if (!name || !*name) {
        const char *env = getenv("AK_BACKEND");
        name = env && *env ? env : NULL;
        rule_src = "AK_BACKEND";
    }

    describe_config(tb, cfg);
    const ak_backend_vtbl *pick = NULL;
    ak_status st = AK_OK;
    if (name) {
        tb_printf(tb, "rule: %s=%s (override)\n", rule_src, name);
        pick = find(name);
        if (!pick) {
            st = AK_ERR_BACKEND_NOT_FOUND;
        } else {
            ak_reasons why;
            if (reasons_for(pick, cfg, have_dev ? &info : NULL, &why) > 0) {
                st = AK_ERR_UNSUPPORTED;
                pick = NULL;
            }
        }
    } else {
        const select_rule *rule = match_rule(cfg);
        if (rule) {
            tb_printf(tb, "rule: \"%s\" ->", rule->name);
            for (int i = 0; i < RULE_MAX_BACKENDS && rule->backends[i]; i++)
                tb_printf(tb, "%s %s", i ? "," : "", rule->backends[i]);
            tb_printf(tb, " (first with no reasons)\n  why: %s\n", rule->evidence);
        } else {
            tb_printf(tb, "rule: none matches this config\n");
        }
        for (int i = 0; rule && i < RULE_MAX_BACKENDS && rule->backends[i] && !pick; i++) {
            const ak_backend_vtbl *vt = find(rule->backends[i]);
            ak_reasons why;
            if (vt && reasons_for(vt, cfg, have_dev ? &info : NULL, &why) == 0) pick = vt;
        }
        if (!pick) st = have_dev ? AK_ERR_UNSUPPORTED : AK_ERR_NO_DEVICE;
    }

    /* the table: every backend, chosen / available / reasons */
    char list[4096];
    textbuf lt = {list, sizeof list, 0};
    list[0] = '\0';
    for (int i = 0; i < REGISTRY_SIZE; i++) {
        ak_reasons why;
        const int n = reasons_for(registry[i], cfg, have_dev ? &info : NULL, &why);
        tb_printf(&lt, "  %-14s ", registry[i]->name);
        if (registry[i] == pick) {
            tb_printf(&lt, "chosen");
            if (pick->explain && have_dev) {
                char note[AK_REASON_LEN * 2]; /* (as ak_backend_describe's) */
                pick->explain(cfg, &info, note, sizeof note);
                tb_printf(&lt, " - %s", note);
            }
        }
        else if (n == 0)
            tb_printf(&lt, "available");
        for (int r = 0; r < n && r < AK_MAX_REASONS; r++)
            tb_printf(&lt, "%s%s", r ? "; " : "- ", why.text[r]);
        /* a backend of another device class, or whose device is absent: what
         * it would say of this config on a device of its class (the matrix's) */
        if (n > 0 && (registry[i]->device != cfg->device.kind || !have_dev)) {
            ak_attn_config there = *cfg;
            there.device.kind = registry[i]->device;
            const ak_device_info dev = matrix_device(registry[i]->device);
            ak_reasons would;
            memset(&would, 0, sizeof would);
            const int m = registry[i]->check(&there, &dev, &would);
            tb_printf(&lt, " (on %s: ", dev.device.kind == AK_DEVICE_CPU ? "this CPU" : dev.name);
            if (m == 0) tb_printf(&lt, "would serve it");
            for (int r = 0; r < m && r < AK_MAX_REASONS; r++) tb_printf(&lt, "%s%s", r ? "; " : "", would.text[r]);
            tb_printf(&lt, ")");
        }
        tb_printf(&lt, "\n");
    }
    tb_printf(tb, "%s", list);

    /* The message lists the backends unless the explanation in tb holds
     * them already (ak_explain: its caller prints both). */
    const char *list_intro = tb->buf ? "" : "; the backends are:\n";
    if (tb->buf) list[0] = '\0';
    if (st == AK_ERR_BACKEND_NOT_FOUND) {
        char hint[128];
        suggest(hint, sizeof hint, name);
        return ak_set_error(st, "%s=%s names no backend%s%s%s", rule_src, name, hint, list_intro, list);
    }
    if (st != AK_OK && name)
        return ak_set_error(st, "%s=%s cannot serve this config%s%s", rule_src, name, list_intro, list);
    if (st != AK_OK)
        return ak_set_error(st, "no backend can serve this config on %s:%d%s%s", device_kind_name(cfg->device.kind),
                            cfg->device.index, list_intro, list);
    *chosen = pick;
    return AK_OK;
}

ak_status ak_explain(const ak_attn_config *cfg, char *buf, size_t cap)
{
    if (buf && cap) buf[0] = '\0';
    textbuf tb = {buf, cap, 0};
    const ak_backend_vtbl *vt;
    const ak_status st = select_backend(cfg, NULL, &vt, &tb);
    if (st != AK_OK && tb.len == 0) tb_printf(&tb, "%s\n", ak_last_error());
    return st;
}

/* ---- the backend object -------------------------------------------------- */

ak_status ak_backend_create(const ak_attn_config *cfg, const ak_limits *lim, const char *name,
                            ak_backend **out)
{
    if (!out) return ak_set_error(AK_ERR_INVALID_ARG, "out is NULL");
    *out = NULL;
    AK_TRY(ak_limits_validate(lim));
    textbuf none = {NULL, 0, 0};
    const ak_backend_vtbl *vt;
    AK_TRY(select_backend(cfg, name, &vt, &none));

    ak_backend *b = calloc(1, sizeof *b);
    if (!b) return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate the backend object");
    b->vt = vt;
    b->cfg = ak_config_normalized(cfg);
    b->lim = *lim;
    ak_status st = AK_OK;
    if (!vt->meta_buffers) {
        const ak_meta_capacity cap = ak_meta_capacity_of(lim);
        st = ak_meta_alloc_host(&cap, &b->meta);
    }
    if (st == AK_OK) st = vt->create(&b->cfg, &b->lim, &b->state);
    if (st != AK_OK) {
        ak_meta_free_host(&b->meta);
        free(b);
        return st;
    }
    *out = b;
    return AK_OK;
}

void ak_backend_destroy(ak_backend *b)
{
    if (!b) return;
    b->vt->destroy(b->state);
    ak_meta_free_host(&b->meta);
    free(b);
}

/* Validation and metadata happen here, once, for every backend: a backend's
 * plan() sees only batches that passed ak_batch_build_meta (backend.h). */
static ak_status plan_batch(ak_backend *b, const ak_batch *batch, ak_stream stream)
{
    ak_batch_meta meta = b->meta;
    if (b->vt->meta_buffers) AK_TRY(b->vt->meta_buffers(b->state, &meta));
    if (ak_batch_table_on_device(batch, &b->cfg)) {
        /* the backend reads the table in place, and finds each request's
         * row at r x stride: no list is built, none is trimmed */
        meta.kv_indices = NULL;
        meta.slot_mapping = NULL;
        meta.kv_first_block = NULL;
    }
    AK_TRY(ak_batch_build_meta(batch, &b->cfg, &b->lim, &meta));
    AK_TRY(b->vt->plan(b->state, batch, &meta, stream));
    int64_t kv_total = 0;
    for (int r = 0; r < batch->num_reqs; r++) kv_total += batch->kv_lens[r];
    b->num_tokens = meta.qo_indptr[batch->num_reqs];
    b->num_kv_tokens = kv_total;
    return AK_OK;
}

ak_status ak_backend_plan(ak_backend *b, const ak_batch *batch, ak_stream stream)
{
    if (!b) return ak_set_error(AK_ERR_INVALID_ARG, "backend is NULL");
    b->planned = 0; /* a failed plan leaves no plan: run() then says so */
    const ak_status st = plan_batch(b, batch, stream);
    b->planned = st == AK_OK;
    b->failed_plan = st;
    return st;
}

ak_status ak_backend_run(ak_backend *b, const ak_run_args *args, ak_stream stream)
{
    if (!b) return ak_set_error(AK_ERR_INVALID_ARG, "backend is NULL");
    /* the status text says "run() called before a successful plan()": the
     * message says which case this is */
    if (!b->planned && b->failed_plan != AK_OK)
        return ak_set_error(AK_ERR_NOT_PLANNED, "backend %s: its last plan() failed (%s)", b->vt->name,
                            ak_status_str(b->failed_plan));
    if (!b->planned) return ak_set_error(AK_ERR_NOT_PLANNED, "backend %s: plan() has not been called", b->vt->name);
    AK_TRY(ak_run_args_validate(&b->cfg, &b->lim, b->num_tokens, b->num_kv_tokens, args));
    return b->vt->run(b->state, args, stream);
}

const char *ak_backend_name(const ak_backend *b) { return b ? b->vt->name : NULL; }
const ak_attn_config *ak_backend_config(const ak_backend *b) { return b ? &b->cfg : NULL; }
int ak_backend_forward_includes_kv_update(const ak_backend *b)
{
    return b ? b->vt->forward_includes_kv_update : 0;
}
ak_graph_support ak_backend_graph_support(const ak_backend *b)
{
    return b ? b->vt->graph_support : AK_GRAPH_NEVER;
}
const int64_t *ak_backend_slot_mapping(const ak_backend *b)
{
    /* ragged K/V have no cache slots: NULL, as the header says, whatever a
     * backend keeps in its buffer */
    if (!b || !b->planned || !b->vt->slot_mapping || b->cfg.kv_storage == AK_KV_RAGGED) return NULL;
    return b->vt->slot_mapping(b->state);
}
int ak_backend_planned_tokens(const ak_backend *b) { return b && b->planned ? b->num_tokens : 0; }

/* ---- describing a backend, and the support matrix ------------------------ */

ak_status ak_backend_describe(const char *name, const ak_attn_config *cfg, const ak_device_info *dev, char *buf,
                              size_t cap)
{
    textbuf tb = {buf, cap, 0};
    if (buf && cap) buf[0] = '\0';
    if (!name) return ak_set_error(AK_ERR_INVALID_ARG, "name is NULL");
    if (!dev) return ak_set_error(AK_ERR_INVALID_ARG, "dev is NULL");
    AK_TRY(ak_config_validate(cfg));
    const ak_backend_vtbl *vt = find(name);
    if (!vt) {
        char hint[128];
        suggest(hint, sizeof hint, name);
        tb_printf(&tb, "no backend is named %s%s", name, hint);
        return ak_set_error(AK_ERR_BACKEND_NOT_FOUND, "no backend is named %s%s", name, hint);
    }
    if (dev->device.kind != cfg->device.kind)
        return ak_set_error(AK_ERR_INVALID_ARG, "dev->device.kind is %s, but cfg.device.kind is %s: describe a device "
                            "of cfg's kind", device_kind_name(dev->device.kind), device_kind_name(cfg->device.kind));
    const ak_attn_config c = ak_config_normalized(cfg);
    ak_device_info d = *dev;
    d.device.index = cfg->device.index; /* (a GPU described by hand is cfg's) */
    ak_reasons why;
    const int n = reasons_for(vt, &c, &d, &why);
    if (n > 0) {
        for (int r = 0; r < n && r < AK_MAX_REASONS; r++) tb_printf(&tb, "%s%s", r ? "; " : "", why.text[r]);
        return ak_set_error(AK_ERR_UNSUPPORTED, "%s cannot serve this config: %s", name, why.text[0]);
    }
    if (vt->explain) {
        char note[AK_REASON_LEN * 2];
        vt->explain(&c, &d, note, sizeof note);
        tb_printf(&tb, "%s", note);
    } else {
        tb_printf(&tb, "serves this config");
    }
    return AK_OK;
}

ak_graph_support ak_backend_graph_support_of(const char *name)
{
    const ak_backend_vtbl *vt = name ? find(name) : NULL;
    return vt ? vt->graph_support : AK_GRAPH_NEVER;
}

/* One row of the support matrix: a change to the base config. */
typedef struct matrix_row {
    const char *feature;
    int head_dim_qk, head_dim_vo; /* 0: the base's (128) */
    int dtype;                    /* -1: the device's (CPU f32, CUDA bf16) */
    int sinks, window, soft_cap, non_causal, ragged, decode, invariant;
    int mla;                      /* cfg.mla, with one KV head */
} matrix_row;

static const matrix_row matrix_rows[] = {
    {"head dim 64", 64, 64, -1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"head dim 80", 80, 80, -1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"head dim 96", 96, 96, -1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"head dim 112", 112, 112, -1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"head dim 128", 128, 128, -1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"head dim 192", 192, 192, -1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"head dim 256", 256, 256, -1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"head dim 512", 512, 512, -1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"head dims 192/128", 192, 128, -1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"head dims 128/64", 128, 64, -1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"head dims 72/40 (any other up to 512)", 72, 40, -1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"head dims 576/512", 576, 512, -1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"f32", 0, 0, AK_F32, 0, 0, 0, 0, 0, 0, 0, 0},
    {"f16", 0, 0, AK_F16, 0, 0, 0, 0, 0, 0, 0, 0},
    {"bf16", 0, 0, AK_BF16, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fp8_e4m3 KV (q, o bf16; scales per layer or head)", 0, 0, AK_FP8_E4M3, 0, 0, 0, 0, 0, 0, 0, 0},
    {"attention sinks", 0, 0, -1, 1, 0, 0, 0, 0, 0, 0, 0},
    {"sliding window", 0, 0, -1, 0, 1, 0, 0, 0, 0, 0, 0},
    {"soft-cap", 0, 0, -1, 0, 0, 1, 0, 0, 0, 0, 0},
    {"non-causal", 0, 0, -1, 0, 0, 0, 1, 0, 0, 0, 0},
    {"ragged (contiguous) K/V", 0, 0, -1, 0, 0, 0, 0, 1, 0, 0, 0},
    {"decode-only instance", 0, 0, -1, 0, 0, 0, 0, 0, 1, 0, 0},
    {"batch invariance", 0, 0, -1, 0, 0, 0, 0, 0, 0, 1, 0},
    {"MLA (latent K = V rows)", 576, 512, -1, 0, 0, 0, 0, 0, 0, 0, 1},
};

/* The device a matrix cell asks about: this CPU, or a CUDA device of compute
 * capability 9.0 (whether or not one is present: check() reads only this). */
static ak_device_info matrix_device(ak_device_kind kind)
{
    ak_device_info d;
    memset(&d, 0, sizeof d);
    d.device.kind = kind;
    if (kind == AK_DEVICE_CPU) {
        const ak_device cpu = {AK_DEVICE_CPU, 0};
        if (ak_device_get_info(cpu, &d) != AK_OK) d.num_sms = 1;
    } else {
        snprintf(d.name, sizeof d.name, "a CUDA device of compute capability 9.0");
        d.cc_major = 9;
        d.num_sms = 132;
        d.max_smem_per_block = 227 * 1024;
    }
    return d;
}

ak_status ak_support_matrix(char *buf, size_t cap)
{
    ak_error_kept kept; /* (its cells' refusals are answers, not this call's errors) */
    ak_error_keep(&kept);
    textbuf tb = {buf, cap, 0};
    if (buf && cap) buf[0] = '\0';
    tb_printf(&tb, "| feature |");
    for (int b = 0; b < REGISTRY_SIZE; b++) tb_printf(&tb, " %s |", registry[b]->name);
    tb_printf(&tb, "\n|---|");
    for (int b = 0; b < REGISTRY_SIZE; b++) tb_printf(&tb, "---|");
    tb_printf(&tb, "\n");
    /* the base config of a backend: 32/8 heads, head dim 128, a paged cache,
     * or ragged K/V for a backend that reads no cache, or MLA (32 heads over
     * one latent KV head, 576/512) for a backend that serves MLA only */
    int ragged_base[REGISTRY_SIZE > 0 ? REGISTRY_SIZE : 1], mla_base[REGISTRY_SIZE > 0 ? REGISTRY_SIZE : 1];
    for (int b = 0; b < REGISTRY_SIZE; b++) {
        ak_attn_config c;
        ak_attn_config_init(&c);
        c.num_qo_heads = 32;
        c.num_kv_heads = 8;
        c.device.kind = registry[b]->device;
        if (c.device.kind == AK_DEVICE_CUDA) c.q_dtype = c.kv_dtype = c.o_dtype = AK_BF16;
        const ak_device_info dev = matrix_device(registry[b]->device);
        char note[512];
        const int plain = ak_backend_describe(registry[b]->name, &c, &dev, note, sizeof note) == AK_OK;
        c.kv_storage = AK_KV_RAGGED;
        ragged_base[b] = !plain && ak_backend_describe(registry[b]->name, &c, &dev, note, sizeof note) == AK_OK;
        c.kv_storage = AK_KV_PAGED;
        c.mla = 1;
        c.num_kv_heads = 1;
        c.head_dim_qk = 576;
        c.head_dim_vo = 512;
        mla_base[b] = !plain && !ragged_base[b] &&
                      ak_backend_describe(registry[b]->name, &c, &dev, note, sizeof note) == AK_OK;
    }
    for (size_t r = 0; r < sizeof matrix_rows / sizeof *matrix_rows; r++) {
        const matrix_row *row = &matrix_rows[r];
        tb_printf(&tb, "| %s |", row->feature);
        for (int b = 0; b < REGISTRY_SIZE; b++) {
            const ak_backend_vtbl *vt = registry[b];
            ak_attn_config c;
            ak_attn_config_init(&c);
            c.num_qo_heads = 32;
            c.num_kv_heads = 8;
            c.device.kind = vt->device;
            if (ragged_base[b]) c.kv_storage = AK_KV_RAGGED;
            if (mla_base[b]) {
                c.mla = 1;
                c.num_kv_heads = 1;
                c.head_dim_qk = 576;
                c.head_dim_vo = 512;
            }
            const ak_dtype dt = row->dtype >= 0 ? (ak_dtype)row->dtype : vt->device == AK_DEVICE_CUDA ? AK_BF16
                                                                                                      : AK_F32;
            c.q_dtype = c.kv_dtype = c.o_dtype = dt;
            if (dt == AK_FP8_E4M3) c.q_dtype = c.o_dtype = AK_BF16; /* fp8 is a KV dtype only */
            if (row->head_dim_qk) {
                c.head_dim_qk = row->head_dim_qk;
                c.head_dim_vo = row->head_dim_vo;
            }
            c.use_sinks = row->sinks;
            if (row->window) c.window_left = 127;
            if (row->soft_cap) c.logits_soft_cap = 30.0f;
            c.causal = !row->non_causal;
            if (row->ragged) c.kv_storage = AK_KV_RAGGED;
            if (row->decode) c.workload = AK_WORKLOAD_DECODE;
            c.batch_invariant = row->invariant;
            if (row->mla) {
                c.mla = 1;
                c.num_kv_heads = 1;
            }
            const ak_device_info dev = matrix_device(vt->device);
            char note[512];
            const ak_status st = ak_backend_describe(vt->name, &c, &dev, note, sizeof note);
            /* which kernel, where the backend has more than one */
            const char *how = st != AK_OK                       ? "no"
                              : strstr(note, "portable kernel") && strstr(note, "rows of 512")
                                  ? "yes (decode tensor cores, prefill portable)"
                              : strstr(note, "portable kernel") ? "yes (portable)"
                              : vt->device == AK_DEVICE_CUDA && row->head_dim_qk ? "yes (tensor cores)"
                                                                                 : "yes";
            tb_printf(&tb, " %s |", how);
        }
        tb_printf(&tb, "\n");
    }
    tb_printf(&tb, "| CUDA graphs |");
    for (int b = 0; b < REGISTRY_SIZE; b++)
        tb_printf(&tb, " %s |", ak_graph_support_name(registry[b]->graph_support));
    tb_printf(&tb, "\n");
    ak_error_restore(&kept);
    return tb.len + 1 < cap ? AK_OK : ak_set_error(AK_ERR_INVALID_ARG, "cap = %zu is too small for the matrix", cap);
}
