/*
 * backend_paged.cu - cuda_paged, the NVIDIA default: FlashInfer-style paged
 * attention with plan-then-replay. This part serves decode (q_len 1 per
 * request); prefill and extend are a later part, and check() says so.
 *
 * plan() (host only): validates the batch, splits each request's visible keys
 * into chunks so that small batches with long contexts still fill every SM,
 * and copies the metadata from pinned staging into static device buffers with
 * asynchronous copies. It never waits on the device, except to reuse a staging
 * buffer whose copy from two plans ago has not yet run (then it waits for that
 * copy only).
 * run() (device): decode over a grid fixed by the number of requests, then the
 * merge of split requests. No allocation, no sync: capturable, and a capture
 * replays after any later plan() with the same number of requests.
 */
#include "decode.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Default cap on chunks per request when limits.max_splits is 0, and the
 * hard cap (the merge keeps one weight per chunk in shared memory). */
#define DEFAULT_MAX_SPLITS 64
#define MAX_SPLITS_CAP 4096
/* Keys per chunk are a multiple of the kernel's tile (64 keys). */
#define CHUNK_QUANTUM 64
#define NUM_STAGING 2

/* Metadata of one plan, host or device: the fixed-size part is contiguous so
 * one copy moves it; kv_indices and slot_mapping are copied for their used
 * length only. */
struct paged_meta {
    int32_t *qo_indptr;    /* [max_reqs + 1] */
    int32_t *merge_indptr; /* [max_reqs + 1] */
    decode_item *items;    /* [max_items] */
    int32_t *kv_indices;   /* [max_reqs * max_blocks_per_req] */
    int64_t *slot_mapping; /* [max_tokens] */
    int32_t *kv_indptr;    /* [max_reqs + 1], host only: the items carry page_base */
};

struct staging {
    char *host; /* pinned */
    paged_meta m;
    cudaEvent_t copied; /* recorded after this buffer's copies were enqueued */
    int in_flight;
};

struct paged_state {
    ak_attn_config cfg;
    ak_limits lim;
    decode_engine engine;
    int pdl;          /* sm_90+: the merge is a programmatic dependent launch */
    int row_tiles;    /* 16-head tiles per KV head (tensor cores, group > 16) */
    int target_items; /* work items that fill one wave of the GPU */
    int max_splits;
    int max_items;
    size_t fixed_bytes; /* bytes of the contiguous fixed part */
    char *dev;          /* one device allocation: metadata, then partials */
    paged_meta d;
    float *o_tmp, *lse_tmp;
    staging stg[NUM_STAGING];
    int next_stg;
    /* the current plan */
    int num_reqs, num_items;
};

/* Lays out a metadata block (host or device) starting at base; returns its
 * total size. The fixed part comes first. */
static size_t layout_meta(const ak_limits *lim, int max_items, char *base, paged_meta *m, size_t *fixed)
{
    size_t off = 0;
#define AK_CARVE_(field, type, count)                                          \
    do {                                                                       \
        off = (off + 15) / 16 * 16;                                            \
        if (m) m->field = (type *)(base + off);                                \
        off += sizeof(type) * (size_t)(count);                                 \
    } while (0)
    AK_CARVE_(qo_indptr, int32_t, lim->max_reqs + 1);
    AK_CARVE_(merge_indptr, int32_t, lim->max_reqs + 1);
    AK_CARVE_(items, decode_item, max_items);
    *fixed = off;
    AK_CARVE_(kv_indices, int32_t, (int64_t)lim->max_reqs * lim->max_blocks_per_req);
    AK_CARVE_(slot_mapping, int64_t, lim->max_tokens);
    AK_CARVE_(kv_indptr, int32_t, lim->max_reqs + 1);
#undef AK_CARVE_
    return (off + 255) / 256 * 256;
}

/* ---- check and explain ------------------------------------------------------- */

static int is_supported_dim(int d) { return d == 64 || d == 128 || d == 256; }

static int paged_check(const ak_attn_config *cfg, const ak_device_info *dev, ak_reasons *why)
{
    if (dev->cc_major < 8)
        ak_reason_add(why, "needs sm_80 or newer (cp.async, bf16 mma); device is sm_%d%d", dev->cc_major,
                      dev->cc_minor);
    if (cfg->q_dtype != cfg->kv_dtype || cfg->o_dtype != cfg->kv_dtype ||
        (cfg->kv_dtype != AK_F16 && cfg->kv_dtype != AK_BF16))
        ak_reason_add(why, "q, kv and o must share one dtype, f16 or bf16 (got %s/%s/%s)", ak_dtype_name(cfg->q_dtype),
                      ak_dtype_name(cfg->kv_dtype), ak_dtype_name(cfg->o_dtype));
    if (cfg->head_dim_qk != cfg->head_dim_vo || !is_supported_dim(cfg->head_dim_qk))
        ak_reason_add(why, "head dims %d/%d: needs head_dim_qk == head_dim_vo in {64, 128, 256}", cfg->head_dim_qk,
                      cfg->head_dim_vo);
    if (cfg->kv_storage != AK_KV_PAGED) ak_reason_add(why, "reads a paged cache only (kv_storage is ragged)");
    if (cfg->workload != AK_WORKLOAD_DECODE)
        ak_reason_add(why, "prefill/extend is not supported yet: only decode instances "
                           "(cfg.workload = AK_WORKLOAD_DECODE)");
    return why->count;
}

/* Tensor cores from a GQA group of 2 up, CUDA cores for MHA. Measured on an
 * H200, bf16, batch 64 x kv_len 4096, fraction of copy bandwidth (CUDA cores
 * / tensor cores): group 1 d64 0.95 / 0.94, d128 1.02 / 0.99, d256 0.83 /
 * 0.80; group 2 d128 0.96 / 0.98, d256 0.61 / 0.80; group 3 d128 0.79 / 0.96.
 * The FMA path pays per query head; the mma tile costs the same for 1 or 16. */
static decode_engine choose_engine(const ak_attn_config *cfg)
{
    return cfg->num_qo_heads / cfg->num_kv_heads > AK_DECODE_CC_MAX_GROUP ? DECODE_TENSOR_CORES : DECODE_CUDA_CORES;
}

static void paged_explain(const ak_attn_config *cfg, const ak_device_info *dev, char *buf, size_t cap)
{
    (void)dev;
    const int group = cfg->num_qo_heads / cfg->num_kv_heads;
    snprintf(buf, cap, "decode on %s (GQA group %d %s %d)",
             choose_engine(cfg) == DECODE_TENSOR_CORES ? "tensor cores" : "CUDA cores", group,
             group > AK_DECODE_CC_MAX_GROUP ? ">" : "<=", AK_DECODE_CC_MAX_GROUP);
}

/* ---- create / destroy ---------------------------------------------------------- */

static void paged_destroy(void *state)
{
    paged_state *s = (paged_state *)state;
    if (!s) return;
    for (int i = 0; i < NUM_STAGING; i++) {
        if (s->stg[i].copied) {
            cudaEventSynchronize(s->stg[i].copied);
            cudaEventDestroy(s->stg[i].copied);
        }
        if (s->stg[i].host) cudaFreeHost(s->stg[i].host);
    }
    if (s->dev) cudaFree(s->dev);
    free(s);
}

static ak_status paged_create_inner(paged_state *s)
{
    const ak_attn_config *cfg = &s->cfg;
    AK_CUDA_TRY(cudaSetDevice(cfg->device.index));
    ak_device_info info;
    AK_TRY(ak_cuda_get_info(cfg->device.index, &info));
    const int group = cfg->num_qo_heads / cfg->num_kv_heads;
    s->engine = choose_engine(cfg);
    s->pdl = info.cc_major >= 9;
    s->row_tiles = s->engine == DECODE_TENSOR_CORES ? (group + 15) / 16 : 1;
    int ctas_per_sm = 0;
    AK_TRY(ak_cuda_decode_occupancy(cfg->head_dim_qk, cfg->kv_dtype, s->engine, &ctas_per_sm));
    if (ctas_per_sm < 1) return ak_set_error(AK_ERR_INTERNAL, "decode kernel cannot be resident on this GPU");
    const int ctas_per_item = cfg->num_kv_heads * s->row_tiles;
    s->target_items = (info.num_sms * ctas_per_sm + ctas_per_item - 1) / ctas_per_item;
    s->max_splits = s->lim.max_splits > 0 ? s->lim.max_splits : DEFAULT_MAX_SPLITS;
    if (s->max_splits > MAX_SPLITS_CAP) s->max_splits = MAX_SPLITS_CAP;
    s->max_items = s->lim.max_reqs > s->target_items ? s->lim.max_reqs : s->target_items;

    size_t fixed = 0;
    const size_t meta_bytes = layout_meta(&s->lim, s->max_items, NULL, NULL, &fixed);
    s->fixed_bytes = fixed;
    const size_t partial = (size_t)s->max_items * cfg->num_qo_heads;
    const size_t dev_bytes = meta_bytes + partial * cfg->head_dim_vo * sizeof(float) + partial * sizeof(float);
    AK_CUDA_TRY(cudaMalloc((void **)&s->dev, dev_bytes));
    /* zeroed once: no kernel can ever read garbage metadata */
    AK_CUDA_TRY(cudaMemset(s->dev, 0, dev_bytes));
    layout_meta(&s->lim, s->max_items, s->dev, &s->d, &fixed);
    s->o_tmp = (float *)(s->dev + meta_bytes);
    s->lse_tmp = s->o_tmp + partial * cfg->head_dim_vo;
    for (int i = 0; i < NUM_STAGING; i++) {
        AK_CUDA_TRY(cudaMallocHost((void **)&s->stg[i].host, meta_bytes));
        memset(s->stg[i].host, 0, meta_bytes);
        layout_meta(&s->lim, s->max_items, s->stg[i].host, &s->stg[i].m, &fixed);
        AK_CUDA_TRY(cudaEventCreateWithFlags(&s->stg[i].copied, cudaEventDisableTiming));
    }
    return AK_OK;
}

static ak_status paged_create(const ak_attn_config *cfg, const ak_limits *lim, void **out)
{
    paged_state *s = (paged_state *)calloc(1, sizeof *s);
    if (!s) return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate cuda_paged state");
    s->cfg = *cfg;
    s->lim = *lim;
    const ak_status st = paged_create_inner(s);
    if (st != AK_OK) {
        paged_destroy(s);
        return st;
    }
    *out = s;
    return AK_OK;
}

/* ---- plan: split-KV on the host ------------------------------------------------- */

/* Work items for a batch of num_reqs requests: enough to fill one wave, at
 * least one per request, at most max_splits per request. A function of
 * num_reqs alone, so the decode grid of a captured graph stays valid. */
static int items_for(const paged_state *s, int num_reqs)
{
    const int64_t cap = (int64_t)num_reqs * s->max_splits;
    const int64_t want = s->target_items < cap ? s->target_items : cap;
    return num_reqs > want ? num_reqs : (int)want;
}

/* Visible keys of a decode request: [lo, kv_len). */
static int visible_lo(const ak_attn_config *cfg, int kv_len)
{
    return cfg->window_left >= 0 && kv_len - 1 - cfg->window_left > 0 ? kv_len - 1 - cfg->window_left : 0;
}

static int chunks_of(int len, int chunk) { return len <= chunk ? 1 : (len + chunk - 1) / chunk; }

/* The smallest chunk (a multiple of CHUNK_QUANTUM) whose chunk count over
 * every decode request fits the item budget. */
static int pick_chunk(const paged_state *s, const ak_batch *b, int budget, int max_len)
{
    int lo = CHUNK_QUANTUM, hi = (max_len + CHUNK_QUANTUM - 1) / CHUNK_QUANTUM * CHUNK_QUANTUM;
    const int floor_split = (max_len + s->max_splits - 1) / s->max_splits;
    if (floor_split > lo) lo = (floor_split + CHUNK_QUANTUM - 1) / CHUNK_QUANTUM * CHUNK_QUANTUM;
    if (hi < lo) hi = lo;
    while (lo < hi) {
        const int mid = (lo + hi) / 2 / CHUNK_QUANTUM * CHUNK_QUANTUM;
        int64_t n = 0;
        for (int r = 0; r < b->num_reqs; r++)
            if (b->qo_indptr[r + 1] > b->qo_indptr[r]) n += chunks_of(b->kv_lens[r] - visible_lo(&s->cfg, b->kv_lens[r]), mid);
        if (n <= budget)
            hi = mid;
        else
            lo = mid + CHUNK_QUANTUM;
    }
    return lo;
}

static ak_status paged_plan(void *state, const ak_batch *b, ak_stream stream, ak_plan_info *info)
{
    paged_state *s = (paged_state *)state;
    staging *st = &s->stg[s->next_stg];
    if (st->in_flight) {
        /* the copy from NUM_STAGING plans ago must have left this buffer */
        AK_CUDA_TRY(cudaEventSynchronize(st->copied));
        st->in_flight = 0;
    }
    ak_batch_meta bm;
    memset(&bm, 0, sizeof bm);
    bm.qo_indptr = st->m.qo_indptr;
    bm.kv_indptr = st->m.kv_indptr;
    bm.kv_indices = st->m.kv_indices;
    bm.slot_mapping = st->m.slot_mapping;
    AK_TRY(ak_batch_build_meta(b, &s->cfg, &s->lim, &bm));

    const int R = b->num_reqs;
    int max_len = 1;
    int64_t kv_total = 0;
    for (int r = 0; r < R; r++) {
        kv_total += b->kv_lens[r];
        const int len = b->kv_lens[r] - visible_lo(&s->cfg, b->kv_lens[r]);
        if (len > max_len) max_len = len;
    }
    const int budget = items_for(s, R);
    /* with no spare items nothing is split, so no merge is needed */
    const int chunk = budget > R ? pick_chunk(s, b, budget, max_len) : INT32_MAX;
    int n = 0, partials = 0;
    st->m.merge_indptr[0] = 0;
    for (int r = 0; r < R; r++) {
        if (b->qo_indptr[r + 1] > b->qo_indptr[r]) {
            const int lo = visible_lo(&s->cfg, b->kv_lens[r]), len = b->kv_lens[r] - lo;
            const int k = chunks_of(len, chunk);
            for (int i = 0; i < k; i++) {
                decode_item it;
                it.req = r;
                it.tok = bm.qo_indptr[r];
                it.page_base = bm.kv_indptr[r];
                it.lo = lo;
                it.unused = 0;
                it.kv_begin = lo + i * (k > 1 ? chunk : 0);
                it.kv_end = k > 1 && i < k - 1 ? it.kv_begin + chunk : b->kv_lens[r];
                it.out = k > 1 ? partials + i : -1;
                st->m.items[n++] = it;
            }
            if (k > 1) partials += k;
        }
        st->m.merge_indptr[r + 1] = partials;
    }
    for (int i = n; i < budget; i++) st->m.items[i].req = -1; /* padding items exit at once */

    /* three async copies into the fixed device buffers */
    cudaStream_t cs = ak_cuda_stream(stream);
    const int num_tokens = bm.qo_indptr[R];
    const int num_indices = bm.kv_indptr[R];
    AK_CUDA_TRY(cudaMemcpyAsync(s->d.qo_indptr, st->m.qo_indptr, s->fixed_bytes, cudaMemcpyHostToDevice, cs));
    if (num_indices > 0)
        AK_CUDA_TRY(cudaMemcpyAsync(s->d.kv_indices, st->m.kv_indices, sizeof(int32_t) * num_indices,
                                    cudaMemcpyHostToDevice, cs));
    if (num_tokens > 0)
        AK_CUDA_TRY(cudaMemcpyAsync(s->d.slot_mapping, st->m.slot_mapping, sizeof(int64_t) * num_tokens,
                                    cudaMemcpyHostToDevice, cs));
    AK_CUDA_TRY(cudaEventRecord(st->copied, cs));
    st->in_flight = 1;
    s->next_stg = (s->next_stg + 1) % NUM_STAGING;

    s->num_reqs = R;
    s->num_items = budget;
    info->num_reqs = R;
    info->num_tokens = num_tokens;
    info->num_kv_tokens = kv_total;
    return AK_OK;
}

/* ---- run ------------------------------------------------------------------------- */

/* 16-byte vector access needs aligned rows: base and row strides. */
static ak_status check_aligned(const char *name, const void *data, int64_t s0, int64_t s1)
{
    if ((uintptr_t)data % 16 != 0 || s0 % 8 != 0 || s1 % 8 != 0)
        return ak_set_error(AK_ERR_INVALID_ARG,
                            "%s: cuda_paged needs 16-byte aligned data and row strides that are multiples of "
                            "8 elements (stride %lld, %lld)",
                            name, (long long)s0, (long long)s1);
    return AK_OK;
}

static ak_status paged_run(void *state, const ak_run_args *a, ak_stream stream)
{
    paged_state *s = (paged_state *)state;
    const ak_attn_config *c = &s->cfg;
    const ak_paged_kv *kv = a->kv;
    AK_TRY(check_aligned("args.q", a->q->data, a->q->stride[0], a->q->stride[1]));
    AK_TRY(check_aligned("args.o", a->o->data, a->o->stride[0], a->o->stride[1]));
    const int64_t kbs = ak_kv_k_block_stride(kv), vbs = ak_kv_v_block_stride(kv);
    AK_TRY(check_aligned("args.kv->k_data", kv->k_data, kbs, 0));
    AK_TRY(check_aligned("args.kv->v_data", kv->v_data, vbs, 0));

    decode_params p;
    memset(&p, 0, sizeof p);
    p.q = a->q->data;
    p.q_stride_tok = a->q->stride[0];
    p.q_stride_head = a->q->stride[1];
    p.k_pool = kv->k_data;
    p.v_pool = kv->v_data;
    p.k_block_stride = kbs;
    p.v_block_stride = vbs;
    p.kv_stride_slot = kv->layout == AK_LAYOUT_NHD ? (int64_t)kv->num_kv_heads * c->head_dim_qk : c->head_dim_qk;
    p.kv_stride_head = kv->layout == AK_LAYOUT_NHD ? c->head_dim_qk : (int64_t)kv->page_size * c->head_dim_qk;
    p.o = a->o->data;
    p.o_stride_tok = a->o->stride[0];
    p.o_stride_head = a->o->stride[1];
    p.lse = a->lse ? (float *)a->lse->data : NULL;
    p.lse_stride_tok = a->lse ? a->lse->stride[0] : 0;
    if (a->lse && a->lse->stride[1] != 1)
        return ak_set_error(AK_ERR_INVALID_ARG, "args.lse->stride[1] = %lld, cuda_paged needs 1",
                            (long long)a->lse->stride[1]);
    p.o_tmp = s->o_tmp;
    p.lse_tmp = s->lse_tmp;
    p.items = s->d.items;
    p.qo_indptr = s->d.qo_indptr;
    p.kv_indices = s->d.kv_indices;
    p.merge_indptr = s->d.merge_indptr;
    p.num_reqs = s->num_reqs;
    p.num_qo_heads = c->num_qo_heads;
    p.num_kv_heads = c->num_kv_heads;
    p.group = c->num_qo_heads / c->num_kv_heads;
    p.row_tiles = s->row_tiles;
    p.page_size = c->page_size;
    p.window_left = c->window_left;
    const float log2e = 1.4426950408889634f;
    p.scale_log2 = c->sm_scale * log2e;
    p.soft_cap = c->logits_soft_cap;
    p.cap_scale = c->logits_soft_cap > 0.0f ? c->sm_scale / c->logits_soft_cap : 0.0f;
    p.cap_log2 = c->logits_soft_cap * log2e;
    p.max_splits = s->max_splits;
    p.page_shift = (c->page_size & (c->page_size - 1)) == 0 ? __builtin_ctz(c->page_size) : -1;

    cudaStream_t cs = ak_cuda_stream(stream);
    AK_TRY(ak_cuda_decode_launch(&p, c->head_dim_qk, c->kv_dtype, s->engine, s->num_items, cs));
    if (s->num_items > s->num_reqs) AK_TRY(ak_cuda_merge_launch(&p, c->head_dim_vo, c->kv_dtype, s->pdl, cs));
    return AK_OK;
}

static const int64_t *paged_slot_mapping(void *state) { return ((paged_state *)state)->d.slot_mapping; }

extern "C" const ak_backend_vtbl ak_backend_cuda_paged = {
    /* .api_version = */ AK_API_VERSION,
    /* .name = */ "cuda_paged",
    /* .device = */ AK_DEVICE_CUDA,
    /* .forward_includes_kv_update = */ 0,
    /* .graph_support = */ AK_GRAPH_DECODE_ONLY,
    /* .check = */ paged_check,
    /* .create = */ paged_create,
    /* .plan = */ paged_plan,
    /* .run = */ paged_run,
    /* .destroy = */ paged_destroy,
    /* .slot_mapping = */ paged_slot_mapping,
    /* .explain = */ paged_explain,
};
