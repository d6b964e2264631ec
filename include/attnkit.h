/*
 * attnkit.h - the whole public API of attnkit.
 *
 * One attention API over a paged KV cache, with pluggable backends (CPU and
 * CUDA) chosen by a selector. An engine's step looks like this:
 *
 *     ak_backend_plan(b, &batch, stream);           host only (waits only if the copy of
 *                                                  two plans ago has not yet run)
 *     for each layer:
 *         ak_kv_update(&kv, k, v, slot_mapping, n, stream);   (unless the backend
 *                                                  writes the KV itself)
 *         ak_backend_run(b, &args, stream);         device, CUDA-graph capturable
 *
 * Conventions
 *   - Every fallible call returns ak_status; on failure ak_last_error() holds a
 *     thread-local message naming the offending field ("batch.kv_lens[3] = ...").
 *   - Shapes are written in comments as [dim0, dim1, ...], row-major.
 *   - Strides are in elements, not bytes.
 *   - LSE (log-sum-exp of the scaled, soft-capped logits) is the natural log.
 *   - A query token at position p sees keys j with p - window_left <= j, and,
 *     when causal, j <= p. The q_len new tokens of a request sit at positions
 *     kv_len - q_len .. kv_len - 1: causal masks are aligned to the end of the KV.
 *   - A row that sees no key gives o = 0 and lse = -inf, whatever q holds; it
 *     is the only way a row gets lse = -inf (with sinks, lse = the sink below).
 *   - NaN and infinities are never hidden. If q, or the K or V row of a key a
 *     query row sees, holds a NaN or an infinity, that row's o (every element)
 *     and lse are NaN. A logit sm_scale * q.k that is not finite counts the
 *     same, checked before the soft-cap (which would map +-inf to +-cap): a
 *     +inf or -inf key gives a +-inf or NaN logit, and the row is NaN; it is
 *     never dropped like a masked key (-inf) nor made the row's only weight
 *     (+inf). A logit or sum of finite inputs that overflows f32 is outside
 *     the rule: cpu_ref computes in fp64, cpu treats it as not finite, and
 *     the CUDA backends do on some paths only (a prefill whose K and V are
 *     found finite by the scan pass runs without per-logit checks).
 *   - Keys a row does not see (causal mask, window, past kv_len, other
 *     requests, unused cache slots) never affect it, whatever they hold.
 *   - ak_merge_states: a NaN or +inf lse, or a NaN or infinity in the v of a
 *     state that is not empty, makes that row's o and lse NaN, in whichever
 *     state it is; a state with lse = -inf is empty and its v is never read.
 *   - Sinks (cfg.use_sinks): row r of query head h has lse = log(sum_j exp(s_j)
 *     + exp(sink_h)) and o = sum_j exp(s_j - lse) v_j: the sink is one more
 *     "key" with a zero value. The returned lse includes it, so {o, lse} stays
 *     an ordinary softmax state: ak_merge_states of states that each had the
 *     sink counts it once per state. When one request's keys are split over
 *     several calls (context parallelism), pass the sinks to exactly one.
 *     A row that sees no key gives o = 0 and lse = sink_h.
 *   - fp8 KV (AK_FP8_E4M3, the e4m3fn format: 1 sign bit, 4 exponent bits of
 *     bias 7, 3 mantissa bits; finite values up to +-448, subnormals down to
 *     2^-9, no infinities, S.1111.111 is NaN): an element's value is its fp8
 *     value times its scale (ak_kv_scale_kind), and every rule here, the NaN
 *     rule included, applies to those dequantized values.
 *   - Structs that may grow start with struct_size; fill them with the matching
 *     *_init() function, which sets struct_size and every default. ak_paged_kv
 *     has none: it is a plain view that engines also fill by hand, so it grows
 *     only at its end, and a new field's 0 keeps the meaning the view had
 *     before that field existed (start a view from {0} or ak_kv_cache_layer).
 *
 * Threads
 *   - ak_last_error(): thread-local; each thread sees its own last failure.
 *   - Pure functions (ak_status_str, ak_dtype_name / _size, ak_tensor_*d, the
 *     *_init functions, ak_graph_support_name, ak_mla_prefer_absorbed), ak_device_count /
 *     ak_device_get_info, ak_batch_meta_sizes / ak_batch_build_meta and
 *     ak_merge_states (on distinct outputs) may be called from any number of
 *     threads at once.
 *   - Registry and selector: ak_backend_count, ak_backend_name_at, ak_explain
 *     and ak_backend_create read constant tables and the environment
 *     (AK_BACKEND, AK_NUM_THREADS, AK_CPU_ISA, AK_CUDA_PREFILL): safe from any
 *     thread, as long as no thread changes the environment (setenv) meanwhile.
 *   - ak_backend: distinct backends are independent and may plan and run in
 *     different threads at once. One backend is used by one thread at a time:
 *     plan, run, slot_mapping, planned_tokens and destroy on the same backend
 *     must not overlap (the caller serialises them). ak_backend_name,
 *     _config, _graph_support and _forward_includes_kv_update are fixed at
 *     create and may be read from any thread until destroy. The cpu backend's
 *     run() opens its own OpenMP team of AK_NUM_THREADS threads per call.
 *   - ak_kv_cache: the allocator (alloc, share, free, num_free, refcount) is
 *     safe from several threads at once (one lock per cache, held only inside
 *     those calls), and so is ak_kv_cache_layer. destroy must not overlap any
 *     other call on that cache. The K/V pools are not locked: see
 *     ak_kv_update.
 *   - ak_kv_update: calls that write disjoint slots may run at once, on one
 *     pool or several. Two writes of one slot, or a write of a slot that a
 *     run() reads at the same time, is a data race the caller must order (on
 *     CUDA, the stream orders them); so is freeing a block whose slots a
 *     running run() still reads. With finiteness marks (ak_paged_kv.marks)
 *     two writes of one slot in one call are such a race too: the slot's
 *     bit may come from one row and its bytes from the other.
 */
#ifndef ATTNKIT_H
#define ATTNKIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AK_API_VERSION 1

/* AK_API marks every public function. The shared library is compiled with
 * hidden visibility by default, so it exports these and nothing else. */
#if defined(__GNUC__) || defined(__clang__)
#define AK_API __attribute__((visibility("default")))
#else
#define AK_API
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

/* The version of the library linked or loaded, at run time: major * 10000 +
 * minor * 100 + patch (0.5.0 -> 500). The build-time version is the one
 * find_package(attnkit) or pkg-config --modversion reports. */
AK_API int ak_version(void);
/* The same as text: "0.5.0". */
AK_API const char *ak_version_string(void);

/* ------------------------------------------------------------------------ */
/* Status                                                                   */
/* ------------------------------------------------------------------------ */

/* X-macro: one table generates the enum and ak_status_str(). */
#define AK_STATUS_LIST(X)                                                      \
    X(AK_OK, 0, "ok")                                                          \
    X(AK_ERR_INVALID_ARG, 1, "invalid argument")                               \
    X(AK_ERR_UNSUPPORTED, 2, "unsupported by this backend")                    \
    X(AK_ERR_OUT_OF_MEMORY, 3, "out of memory")                                \
    X(AK_ERR_OUT_OF_BLOCKS, 4, "KV cache has no free blocks left")             \
    X(AK_ERR_LIMIT_EXCEEDED, 5, "batch exceeds the backend's limits")          \
    X(AK_ERR_BACKEND_NOT_FOUND, 6, "no such backend")                          \
    X(AK_ERR_NO_DEVICE, 7, "no such device")                                   \
    X(AK_ERR_CUDA, 8, "CUDA runtime error")                                    \
    X(AK_ERR_NOT_PLANNED, 9, "run() called before a successful plan()")        \
    X(AK_ERR_INTERNAL, 10, "internal error")

typedef enum ak_status {
#define AK_STATUS_ENUM_(name, value, text) name = value,
    AK_STATUS_LIST(AK_STATUS_ENUM_)
#undef AK_STATUS_ENUM_
} ak_status;

/* A short, static description of a status code. */
AK_API const char *ak_status_str(ak_status s);

/* The detailed message of the last failed call on this thread ("" if none).
 * The pointer stays valid until the next attnkit call on this thread. */
AK_API const char *ak_last_error(void);

/* ------------------------------------------------------------------------ */
/* Devices, dtypes, tensors                                                 */
/* ------------------------------------------------------------------------ */

typedef enum ak_dtype {
    AK_F32 = 0,
    AK_F16 = 1,
    AK_BF16 = 2,
    AK_FP8_E4M3 = 3, /* KV only (K/V pools, ragged K/V), with scales: see ak_kv_scale_kind */
} ak_dtype;

AK_API const char *ak_dtype_name(ak_dtype t); /* "f32", "f16", "bf16", "fp8_e4m3" */
AK_API size_t ak_dtype_size(ak_dtype t);      /* bytes per element, 0 if unknown */

/* Converts n elements between dtypes in host memory (f32, f16, bf16,
 * fp8_e4m3), rounding to nearest even; src and dst may not overlap unless
 * equal. To fp8_e4m3 it is ak_kv_update's quantization with a scale of 1
 * (finite values beyond +-448 saturate, NaN and +-inf become NaN). */
AK_API ak_status ak_convert(const void *src, ak_dtype src_dtype, void *dst /* OUT */, ak_dtype dst_dtype, size_t n);

typedef enum ak_device_kind {
    AK_DEVICE_CPU = 0,
    AK_DEVICE_CUDA = 1,
} ak_device_kind;

typedef struct ak_device {
    ak_device_kind kind;
    int index; /* CUDA device ordinal; 0 for the CPU */
} ak_device;

typedef struct ak_device_info {
    ak_device device;
    char name[128];
    int num_sms;             /* CUDA: multiprocessors; CPU: logical cores */
    int cc_major, cc_minor;  /* CUDA compute capability; 0 for the CPU */
    size_t memory_bytes;     /* CUDA: global memory; CPU: 0 (not queried) */
    size_t l2_bytes;         /* CUDA: L2 size; CPU: 0 */
    int max_smem_per_block;  /* CUDA: opt-in shared memory per block, bytes */
    int cpu_has_avx2_fma_f16c; /* CPU: 1 if AVX2 + FMA + F16C are usable (the kernel the cpu
                                  backend runs: ak_cpu_kernel_describe) */
} ak_device_info;

/* Number of devices of a kind (the CPU counts as 1; CUDA is 0 when the library
 * was built without CUDA or no GPU/driver is present). Never fails. */
AK_API int ak_device_count(ak_device_kind kind);
AK_API ak_status ak_device_get_info(ak_device dev, ak_device_info *info /* OUT */);

/* Threads the CPU backends run on: AK_NUM_THREADS if it is a whole number
 * > 0 (at most AK_MAX_CPU_THREADS: larger values are taken as that: the
 * backend's per-thread work lists and partial pools are sized by it, and
 * it is far above a host's cores), else OpenMP's default (1 in a build
 * without OpenMP). Read at each backend's create(). */
#define AK_MAX_CPU_THREADS 4096
AK_API int ak_cpu_num_threads(void);

/* Opaque stream handle: a cudaStream_t for CUDA backends (NULL = legacy default
 * stream), ignored on the CPU. */
typedef void *ak_stream;

#define AK_MAX_DIMS 4

/* A strided view of memory owned by the caller. The innermost dimension must
 * have stride 1 wherever attnkit reads or writes vectors. */
typedef struct ak_tensor {
    void *data;
    ak_dtype dtype;
    int ndim;
    int64_t shape[AK_MAX_DIMS];
    int64_t stride[AK_MAX_DIMS]; /* in elements */
} ak_tensor;

/* A contiguous row-major view with ndim = 1, 2, 3 or 4 dimensions. These
 * return no status: a negative dim, or dims whose bytes (elements x dtype
 * size, or a stride) pass INT64_MAX, give an invalid tensor instead: data
 * NULL, ndim 0, shape as given, stride[d] = -1 at the dim d that failed and
 * every other stride 0. Every call given it fails with AK_ERR_INVALID_ARG and
 * a message naming that dim ("args.q is invalid: ak_tensor_*d was given
 * shape[1] = ..."). Calls likewise reject any tensor with a negative shape or
 * stride, or whose last element lies more than INT64_MAX bytes from data. */
AK_API ak_tensor ak_tensor_1d(void *data, ak_dtype dtype, int64_t d0);
AK_API ak_tensor ak_tensor_2d(void *data, ak_dtype dtype, int64_t d0, int64_t d1);
AK_API ak_tensor ak_tensor_3d(void *data, ak_dtype dtype, int64_t d0, int64_t d1, int64_t d2);
AK_API ak_tensor ak_tensor_4d(void *data, ak_dtype dtype, int64_t d0, int64_t d1, int64_t d2,
                              int64_t d3);

/* ------------------------------------------------------------------------ */
/* Attention configuration                                                  */
/* ------------------------------------------------------------------------ */

typedef enum ak_kv_layout {
    AK_LAYOUT_NHD = 0, /* a block is [page_size, num_kv_heads, head_dim] */
    AK_LAYOUT_HND = 1, /* a block is [num_kv_heads, page_size, head_dim] */
} ak_kv_layout;

typedef enum ak_kv_storage {
    AK_KV_PAGED = 0,  /* K/V read from a paged cache through the block table */
    AK_KV_RAGGED = 1, /* K/V contiguous per request: [sum kv_len, num_kv_heads, head_dim] */
} ak_kv_storage;

/* Which batches a backend instance will be planned with. Engines often keep
 * one instance for decode steps and one for the rest (as FlashInfer's decode
 * and prefill wrappers); a decode-only instance may pick a faster kernel. */
typedef enum ak_workload {
    AK_WORKLOAD_ANY = 0,    /* prefill, chunks on a prefix, decode, mixed, verify */
    AK_WORKLOAD_DECODE = 1, /* every request has q_len 1 (or 0, padding) */
} ak_workload;

/* What one backend instance computes. Everything here is fixed at create(). */
typedef struct ak_attn_config {
    uint32_t struct_size;
    int num_qo_heads;
    int num_kv_heads;     /* divides num_qo_heads (MHA, GQA, MQA) */
    int head_dim_qk;
    int head_dim_vo;      /* may differ from head_dim_qk */
    float sm_scale;       /* 0 -> 1 / sqrt(head_dim_qk) */
    int causal;           /* 1: token at position p sees keys <= p */
    int window_left;      /* -1: full context; w >= 0: keys >= p - w (a window of w + 1 keys:
                             transformers' sliding_window W is window_left W - 1) */
    float logits_soft_cap;/* 0: off; c > 0: logits = c * tanh(logits / c) */
    ak_dtype q_dtype;     /* f32, f16 or bf16 */
    ak_dtype kv_dtype;    /* the same, or fp8_e4m3 (scales in the view, see ak_kv_scale_kind) */
    ak_dtype o_dtype;     /* f32, f16 or bf16 */
    ak_device device;     /* where q, K/V, o and lse live */
    ak_kv_storage kv_storage;
    ak_kv_layout kv_layout; /* paged only */
    int page_size;          /* paged only: tokens per block */
    ak_workload workload;   /* plan() rejects a batch outside it */
    int use_sinks;          /* 1: attention sinks (gpt-oss): every row's softmax denominator
                               also holds exp(sink) of its query head, a learned logit that
                               contributes no value; run() takes them in args.sinks */
    int batch_invariant;    /* 1: a request's output bits do not depend on which other
                               requests share its batch or how many there are (KV splits of
                               a fixed size, a fixed reduction order); may cost speed */
    int mla;                /* 1: multi-head latent attention (DeepSeek-V2/V3), in its absorbed
                               form: num_kv_heads = 1; head_dim_qk = latent + rotary width
                               (512 + 64 = 576), head_dim_vo = latent width (512, <=
                               head_dim_qk). Each key is one row of head_dim_qk values and
                               its value is the first head_dim_vo of them: paged storage
                               reads a K-only view (ak_paged_kv.v_data NULL), ragged storage
                               args.k alone (args.v NULL). See "Multi-head latent attention"
                               below. */
} ak_attn_config;

/* Defaults: MHA 1/1 heads, head dim 128, f32 on the CPU, causal, full window,
 * no soft-cap, paged NHD cache with page size 16, any workload, no sinks, not
 * batch-invariant, not MLA. */
AK_API void ak_attn_config_init(ak_attn_config *cfg /* OUT */);

/* Multi-head latent attention (cfg.mla = 1), as DeepSeek-V2/V3 decode it.
 * The cache keeps, per token, one latent row c (kv_lora_rank = 512 values,
 * normed) and the rotary key k_pe (rope_dim = 64 values, after RoPE), shared
 * by every query head: the K pool's row is [c ; k_pe] (576 values). With the
 * model's up-projections W_UK [H][128][512] and W_UV [H][512][128], head h
 * would attend with (sums over l < 512)
 *     k_h = [ sum_l W_UK[h][i][l] c[l] (i < 128) ; k_pe ]        192 values
 *     v_h =   sum_l W_UV[h][l][i] c[l] (i < 128)                  128 values
 *     q_h = [ q_nope_h ; q_pe_h ]                                 192 values
 * and since q_nope_h . k_h's first 128 = q'_h . c with q'_h[l] = sum_i
 * q_nope_h[i] W_UK[h][i][l] (W_UK absorbed into q), the same attention runs
 * over the latent rows, and W_UV is applied to o afterwards:
 *
 *     for each new token t:                         // the cache write
 *         kv_row[t][0] = [c_t ; k_pe_t]             // k: [tokens, 1, 576]
 *     ak_kv_update(&kv, &k, NULL, slots, n, s);     // K-only view: no v
 *     for each new token t, head h:                 // q: [tokens, H, 576]
 *         q[t][h][l]       = sum_i q_nope[t][h][i] W_UK[h][i][l]   (l < 512)
 *         q[t][h][512 + r] = q_pe[t][h][r]                         (r < 64)
 *     ak_backend_run(b, &args, s);                  // o: [tokens, H, 512]
 *     for each new token t, head h:                 // the heads' outputs
 *         out[t][h][i] = sum_l W_UV[h][l][i] o[t][h][l]            (i < 128)
 *
 * sm_scale is the model's, not 1/sqrt(576): DeepSeek scales by 1/sqrt(192),
 * the expanded head dim (times its yarn factor's mscale squared where the
 * context is extended); pass it explicitly. ak_mla_config_init is
 * ak_attn_config_init, then num_qo_heads = num_heads, num_kv_heads = 1,
 * head_dim_qk = kv_lora_rank + rope_dim, head_dim_vo = kv_lora_rank,
 * sm_scale and mla = 1 (page size, dtypes and device stay to be set).
 * On NVIDIA GPUs the selector picks cuda_mla (576/512, q/kv/o bf16 or f16);
 * on the CPU, the cpu backend. */
AK_API void ak_mla_config_init(ak_attn_config *cfg /* OUT */, int num_heads, int kv_lora_rank, int rope_dim,
                               float sm_scale);

/* A chunk of an MLA model's prompt on its cached prefix runs in one of two
 * forms: absorbed, as the MLA config (q of 576 a head over the latent rows:
 * 2 x (576 + 512) FLOP a key a head), or expanded (head dims 192/128, as many
 * KV heads as query heads, K/V up-projected from the latent rows by the
 * engine: 2 x (192 + 128) FLOP). Measured on an H100 and an H200 at 16 and
 * 128 heads, 4k to 64k keys (docs/BACKENDS.md): absorbed is faster up to 32
 * new tokens a request; at 64 the two are level on the H100 and expanded is
 * 1.5x faster on the H200; from 512 to 8192 expanded is 1.7-3.2x faster
 * (H100). Returns 1 where a request of q_len new tokens
 * should run absorbed (cfg is an MLA config and 1 <= q_len <=
 * AK_MLA_ABSORBED_MAX_Q_LEN), 0 where it should run expanded (or cfg is not
 * MLA): an engine splits each step by it, decodes and short verifies
 * absorbed on this config, longer chunks on its expanded config. */
#define AK_MLA_ABSORBED_MAX_Q_LEN 32
AK_API int ak_mla_prefer_absorbed(const ak_attn_config *cfg, int q_len);

/* Sizes fixed at create(): every static buffer of a backend is allocated from
 * these, and plan() rejects a batch above them (AK_ERR_LIMIT_EXCEEDED). */
typedef struct ak_limits {
    uint32_t struct_size;
    int max_reqs;           /* requests per plan */
    int max_tokens;         /* query tokens per plan (sum of q_len), <= AK_MAX_LEN */
    int max_blocks_per_req; /* block-table row length (paged) */
    int num_cache_blocks;   /* paged: block ids must be < this; run() rejects a
                               cache view with fewer blocks */
    int max_splits;         /* KV chunks per request for split-KV; 0 = backend's choice */
} ak_limits;

/* Defaults: 256 requests, 16384 tokens, 2048 blocks per request,
 * 65536 cache blocks, max_splits 0. */
AK_API void ak_limits_init(ak_limits *lim /* OUT */);

/* ------------------------------------------------------------------------ */
/* Paged KV cache                                                           */
/* ------------------------------------------------------------------------ */

/* How the scales of fp8 K/V are given (ak_paged_kv, or ak_run_args for ragged
 * K/V). Element x of KV head h stands for
 *     K = x * k_scale[h],  V = x * v_scale[h]     (AK_KV_SCALE_PER_HEAD)
 *     K = x * k_scale[0],  V = x * v_scale[0]     (AK_KV_SCALE_PER_LAYER)
 *     K = x,               V = x                  (AK_KV_SCALE_NONE)
 * The scales are f32 in the memory of the K/V's device (host memory for the
 * CPU, device memory for CUDA), owned by the engine: each layer's view points
 * at that layer's own. attnkit reads them where it reads K/V, when run() and
 * ak_kv_update execute, never on the host and never at plan time: a CUDA
 * graph captures the pointers, not the values, so a replay uses what each
 * layer's scales hold then (an engine may recalibrate them in place).
 * A scale should be finite and > 0. attnkit does not check the values (on a
 * GPU it never reads device memory back); others give what the formulas
 * give: a NaN or infinite scale makes the elements it scales NaN or
 * infinite, so by the NaN rule every row that sees a key of that head is
 * NaN; a scale of 0 makes them 0. Scales belong to fp8 alone: with any other
 * dtype the kind must be AK_KV_SCALE_NONE. */
typedef enum ak_kv_scale_kind {
    AK_KV_SCALE_NONE = 0,      /* no scales (1): k_scale and v_scale are NULL */
    AK_KV_SCALE_PER_LAYER = 1, /* k_scale, v_scale: [1] each */
    AK_KV_SCALE_PER_HEAD = 2,  /* k_scale, v_scale: [num_kv_heads] each */
} ak_kv_scale_kind;

/* One layer's paged K and V, in memory owned by anyone (an ak_kv_cache, or the
 * engine's own pools). Element (block b, slot s, head h, dim d) of K is at
 *   NHD: k_data + b * k_block_stride + (s * num_kv_heads + h) * head_dim_qk + d
 *   HND: k_data + b * k_block_stride + (h * page_size + s) * head_dim_qk + d
 * and likewise for V with head_dim_vo. A block stride of 0 means packed
 * (page_size * num_kv_heads * head_dim). An fp8 view (dtype AK_FP8_E4M3)
 * carries its layer's scales (ak_kv_scale_kind); a view from
 * ak_kv_cache_layer has none (AK_KV_SCALE_NONE), and an engine with scales
 * sets the three fields.
 * A K-only view (v_data NULL, v_block_stride 0) has no V pool: the value of
 * a key is the first head_dim_vo (<= head_dim_qk) values of its K row. It
 * serves multi-head latent attention (cfg.mla); run() with cfg.mla also
 * takes v_data == k_data as K-only (v_block_stride ignored), and refuses any
 * other V pool. fp8 K-only views scale K, and so V, by k_scale alone
 * (v_scale NULL). */
typedef struct ak_paged_kv {
    void *k_data;
    void *v_data;           /* NULL: a K-only view (MLA) */
    ak_dtype dtype;
    ak_kv_layout layout;
    ak_device device;
    int num_blocks;
    int page_size;
    int num_kv_heads;
    int head_dim_qk;
    int head_dim_vo;
    int64_t k_block_stride; /* elements; 0 = packed */
    int64_t v_block_stride; /* elements; 0 = packed */
    ak_kv_scale_kind scale_kind; /* fp8 only; AK_KV_SCALE_NONE otherwise */
    const float *k_scale;   /* [1] or [num_kv_heads] f32 on device, per scale_kind; NULL if none */
    const float *v_scale;   /* likewise */
    /* The pools' finiteness marks (NULL: none), kept by ak_kv_update and read
     * by run(), in the pools' memory: ak_kv_marks_words() uint32 words, word
     * (b * num_kv_heads + h) * ((page_size + 31) / 32) + s / 32 holding bit
     * s % 32 for slot s of block b and KV head h (a block's words are the
     * num_kv_heads * ((page_size + 31) / 32) from word b times that, to copy
     * with the block). ak_kv_update sets a slot's
     * bit when the K or V row it stores there holds a NaN or an infinity
     * (fp8: the NaN byte), and clears it otherwise. With marks, the CUDA
     * backends learn which keys a prefill request sees are finite from
     * their bits instead of reading every K/V row (the NaN rule's scan pass:
     * a 16 x 1024 prefill step took 0.95 of its time, 64 x 512 0.93, on an
     * H200), and so scan shorter requests too, which are not worth a pass
     * over their rows (64 x 256 took 0.75 of its time, 4 x 256 0.81;
     * BENCHMARKS.md). The engine
     * allocates them with its pools, zeroed (a slot never written is
     * finite), and promises that every write of a row into these pools goes
     * through ak_kv_update with this view's marks, and that whoever copies
     * a block (a swap, a prefix copy) copies its words too; a row written
     * any other way leaves its bit stale, and then the NaN rule may not hold
     * for the rows that see it (nothing is read or written out of bounds).
     * A set bit of a finite row only costs speed. The CPU backends do not
     * read them (they check as they go), but ak_kv_update keeps them on
     * either device. */
    uint32_t *marks;
} ak_paged_kv;

/* The uint32 words of the finiteness marks (ak_paged_kv.marks) of a view's
 * pools: num_blocks * num_kv_heads * ((page_size + 31) / 32); -1 when a size
 * is not positive or the count overflows int64. */
AK_API int64_t ak_kv_marks_words(int num_blocks, int num_kv_heads, int page_size);

typedef struct ak_kv_cache_config {
    uint32_t struct_size;
    int num_layers;   /* 0: the block allocator alone, for an engine that owns its pools */
    int num_blocks;   /* blocks per layer pool */
    int page_size;
    int num_kv_heads;
    int head_dim_qk;
    int head_dim_vo;
    ak_dtype dtype;
    ak_kv_layout layout;
    ak_device device; /* host memory or CUDA memory */
    int mla;          /* 1: K pools only, rows of head_dim_qk (multi-head latent attention:
                         the value is the first head_dim_vo of each row, head_dim_vo <=
                         head_dim_qk); ak_kv_cache_layer gives K-only views (v_data NULL) */
    int marks;        /* 1: each layer also gets finiteness marks (ak_paged_kv.marks, zeroed
                         at create), which ak_kv_cache_layer's views carry: the engine then
                         writes the pools only through ak_kv_update with those views */
} ak_kv_cache_config;

/* Defaults: 1 layer, 1024 blocks of 16 tokens, 8 heads of 128, f16, NHD, CPU, not MLA, no marks.
 * dtype AK_FP8_E4M3 makes fp8 pools (1 byte an element); the cache holds no
 * scales (see ak_paged_kv). */
AK_API void ak_kv_cache_config_init(ak_kv_cache_config *cfg /* OUT */);

typedef struct ak_kv_cache ak_kv_cache;

/* Allocates num_layers K and V pools of num_blocks blocks each. The memory is
 * not initialised; with cfg.marks each layer's finiteness marks are, zeroed
 * (on CUDA, done before it returns). With num_layers 0 it allocates no pools: the block
 * allocator alone, whose ids index pools the engine made itself (say, torch
 * tensors [num_blocks, page_size, num_kv_heads, head_dim]). A config whose
 * pools would not fit a size_t is an error. */
AK_API ak_status ak_kv_cache_create(const ak_kv_cache_config *cfg, ak_kv_cache **out /* OUT */);
AK_API void ak_kv_cache_destroy(ak_kv_cache *cache); /* accepts NULL */

/* The view of one layer's pools, for ak_kv_update and ak_backend_run. */
AK_API ak_status ak_kv_cache_layer(const ak_kv_cache *cache, int layer,
                                   ak_paged_kv *view /* OUT */);

/* Block allocator, shared by all layers (a block id names the same block in
 * every layer's pool). Allocation is all-or-nothing: when fewer than n blocks
 * are free it returns AK_ERR_OUT_OF_BLOCKS and allocates none. New blocks have a
 * reference count of 1; ak_kv_cache_share adds one reference to each (a prefix
 * shared by several requests; at most INT32_MAX references a block);
 * ak_kv_cache_free drops one and returns the block to the pool at zero. A list
 * that names a block out of range, not allocated, freed more often than it
 * has references or shared past INT32_MAX is an error naming the entry, and
 * changes nothing. Safe to call from several threads (see Threads above). */
AK_API ak_status ak_kv_cache_alloc(ak_kv_cache *cache, int n, int32_t *block_ids /* OUT [n] */);
AK_API ak_status ak_kv_cache_share(ak_kv_cache *cache, int n, const int32_t *block_ids /* [n] */);
AK_API ak_status ak_kv_cache_free(ak_kv_cache *cache, int n, const int32_t *block_ids /* [n] */);
AK_API int ak_kv_cache_num_free(const ak_kv_cache *cache);
/* -1 if block_id is out of range */
AK_API int ak_kv_cache_refcount(const ak_kv_cache *cache, int32_t block_id);

/* ------------------------------------------------------------------------ */
/* Batch metadata                                                           */
/* ------------------------------------------------------------------------ */

/* The most keys of one request (kv_len), rows of ragged K/V (the sum of
 * kv_len) and query tokens of one plan: 2^31 - 2^16, so that every kernel may
 * step a full tile (at most 2^16 keys) past a count in int32 arithmetic.
 * plan() rejects more (AK_ERR_LIMIT_EXCEEDED). */
#define AK_MAX_LEN (INT32_MAX - 65535)

/* One step's requests, as host arrays. Request r has q_len = qo_indptr[r+1] -
 * qo_indptr[r] new query tokens and kv_len = kv_lens[r] keys in total (its
 * cached context plus the new tokens). A decode has q_len 1, a prefill
 * q_len == kv_len, a chunk of a prompt on a cached prefix q_len < kv_len, a
 * multi-token verification a few tokens. q_len may be 0 (a request that only
 * pads a batch). Causal configs require q_len <= kv_len. */
typedef struct ak_batch {
    uint32_t struct_size;
    int num_reqs;
    const int32_t *qo_indptr;   /* [num_reqs + 1], qo_indptr[0] = 0, non-decreasing */
    const int32_t *kv_lens;     /* [num_reqs], each <= AK_MAX_LEN (ragged: their sum too) */
    const int32_t *block_table; /* paged: [num_reqs, block_table_stride]; row r's
                                   first ceil(kv_len / page_size) entries are read
                                   (no table, NULL here and below, where every
                                   kv_len is 0) */
    int block_table_stride;     /* paged: entries per block-table row */
    /* paged, in place of block_table (give one of the two): the same table
     * in the memory of cfg.device, as engines keep it (vLLM's block_table
     * tensor, SGLang's req_to_token). On a GPU, plan() then copies O(requests)
     * of metadata instead of O(blocks): the kernels read the table in place
     * when they run (a captured graph reads it as it is at each replay, at
     * the address the latest plan named), and the backend's slot mapping is
     * computed from it on the device, in stream order after plan()'s
     * copies. The host cannot check its ids: an id outside [0,
     * args.kv->num_blocks) is clamped into the pools (no read leaves them;
     * that request's output means nothing), and a new token whose block is
     * outside [0, limits.num_cache_blocks) gets slot -1 (ak_kv_update skips
     * it, so no other request's rows are overwritten). Rows
     * hold num_reqs x block_table_stride entries, at most INT32_MAX. On a
     * CPU config the table is host memory, read and checked as block_table.
     * ak_batch_build_meta fills kv_indices and slot_mapping only from a
     * table the host can read (pass them NULL for a device table). The
     * slot mapping is the table's at plan() time: rows of the step's new
     * tokens that change after it need a new plan before kv_update. */
    const int32_t *device_block_table;
} ak_batch;

AK_API void ak_batch_init(ak_batch *batch /* OUT */);

/* Metadata derived from a batch, in the CSR form kernels use. Caller-owned
 * arrays sized by ak_batch_meta_sizes. */
typedef struct ak_batch_meta {
    int32_t *qo_indptr;        /* [num_reqs + 1] */
    int32_t *kv_indptr;        /* [num_reqs + 1]: paged, in blocks; ragged, in tokens */
    int32_t *kv_indices;       /* paged: [kv_indptr[num_reqs]] block ids; may be NULL if ragged */
    int32_t *kv_last_page_len; /* paged: [num_reqs] tokens in each request's last block
                                  (0 when kv_len is 0); may be NULL if ragged */
    int32_t *positions;        /* [num_tokens] position of each query token; may be NULL */
    int64_t *slot_mapping;     /* paged: [num_tokens] block * page_size + offset where
                                  each new token's K/V goes; may be NULL */
    int32_t *kv_first_block;   /* paged, may be NULL: [num_reqs] windowed configs leave out
                                  the blocks before the first key any query of the request
                                  sees; kv_indices of request r then start at its block
                                  kv_first_block[r] (0 without a window) */
} ak_batch_meta;

/* How large the metadata arrays of a batch are. Validates the batch like
 * ak_batch_build_meta. */
AK_API ak_status ak_batch_meta_sizes(const ak_batch *batch, const ak_attn_config *cfg,
                                     const ak_limits *lim, int *num_tokens /* OUT */,
                                     int *num_kv_indices /* OUT */);

/* Validates the batch against cfg and lim (a NULL lim skips the limit checks)
 * and fills meta. On failure nothing is written and the message names the
 * field: a block id out of range, kv_len beyond the blocks given, q_len >
 * kv_len, a non-monotone qo_indptr, a batch above the limits. With
 * meta->kv_first_block set and a sliding window, the blocks no query sees
 * are neither checked nor copied (a windowed layer's plan does not pay for
 * the context the window hides). */
AK_API ak_status ak_batch_build_meta(const ak_batch *batch, const ak_attn_config *cfg,
                                     const ak_limits *lim, ak_batch_meta *meta /* OUT */);

/* ------------------------------------------------------------------------ */
/* KV-cache write                                                           */
/* ------------------------------------------------------------------------ */

/* Writes the step's new K/V rows at their slots: token i's rows go to block
 * slot_mapping[i] / page_size, offset slot_mapping[i] % page_size. A slot of -1
 * skips the token (padding). k: [num_tokens, num_kv_heads, head_dim_qk],
 * v: [num_tokens, num_kv_heads, head_dim_vo], both in kv->dtype on kv->device
 * (fp8 pools: see below). slot_mapping: [num_tokens] int64 on kv->device. The
 * view is checked as run() checks it (positive sizes, block strides 0 or at
 * least a block, a pool int64 can address, scales as ak_kv_scale_kind says),
 * on every device, before anything is written.
 * fp8 pools (kv->dtype AK_FP8_E4M3) quantize: k and v are f32, f16 or bf16
 * (k and v the same), and element x of KV head h is stored as e4m3(y), y =
 * x / scale in f32 (IEEE division), scale = kv->k_scale[h] (v_scale for v;
 * [0] per layer; 1 without scales), where e4m3(y) is
 *   - y rounded to the nearest e4m3 value, ties to the even mantissa
 *     (subnormals included: multiples of 2^-9 below 2^-6);
 *   - +-448 when y is beyond +-448, a finite overflow of f32 (+-inf) too;
 *   - NaN when y is NaN, and when x itself is +-inf: an infinity is never
 *     hidden as 448, so the rows that see it are NaN, as with a bf16 cache.
 * This is torch's x.to(torch.float8_e4m3fn) except that torch makes every
 * |y| >= 480 NaN where attnkit saturates finite values (as CUDA's
 * __NV_SATFINITE conversion does). k and v already in fp8 are copied as
 * they are (quantized by the caller with the view's scales).
 * A K-only view (kv->v_data NULL, multi-head latent attention) takes v =
 * NULL and writes K alone; a view with a V pool requires v.
 * A view with finiteness marks (ak_paged_kv.marks) has each written slot's
 * bit set or cleared by the rows stored there; the bits of other slots
 * (slot -1 included) stay as they were.
 * CPU: validates every slot first; on error nothing is written.
 * CUDA: asynchronous on `stream`, CUDA-graph capturable; slots outside the
 * cache are skipped by the kernel (device memory is never read back). */
AK_API ak_status ak_kv_update(const ak_paged_kv *kv, const ak_tensor *k, const ak_tensor *v,
                              const int64_t *slot_mapping, int num_tokens, ak_stream stream);

/* ------------------------------------------------------------------------ */
/* Merging partial attention states                                         */
/* ------------------------------------------------------------------------ */

/* Merges attention computed over disjoint parts of the KV. v: [num_tokens,
 * num_states, num_heads, head_dim] partial outputs (normalised within their
 * part), s: [num_tokens, num_states, num_heads] their LSEs (f32, natural log;
 * -inf for an empty part). v_out: [num_tokens, num_heads, head_dim], s_out:
 * [num_tokens, num_heads] (f32, may be NULL). Any strides, so the state axis
 * may be outermost; a tensor with no elements may have no data. CPU
 * tensors only for now (dev = CPU). NaN and infinities
 * follow the Conventions above: a NaN or +inf lse, or a NaN or infinity in
 * the v of a non-empty state, makes that row NaN; an empty state's v is never
 * read. */
AK_API ak_status ak_merge_states(const ak_tensor *v, const ak_tensor *s, ak_tensor *v_out,
                                 ak_tensor *s_out, ak_device dev, ak_stream stream);

/* ------------------------------------------------------------------------ */
/* Backends                                                                 */
/* ------------------------------------------------------------------------ */

typedef enum ak_graph_support {
    AK_GRAPH_NEVER = 0,         /* run() is not capturable (CPU backends) */
    AK_GRAPH_DECODE_ONLY = 1,   /* a capture replays after any plan() of the same
                                   number of requests, all with q_len = 1 */
    AK_GRAPH_UNIFORM_BATCH = 2, /* ... of the same number of requests, all with the
                                   same q_len as at capture */
    AK_GRAPH_ALWAYS = 3,        /* ... of any batch within the limits */
} ak_graph_support;

AK_API const char *ak_graph_support_name(ak_graph_support g);

typedef struct ak_backend ak_backend;

/* Arguments of one attention call (one layer). */
typedef struct ak_run_args {
    uint32_t struct_size;
    const ak_tensor *q;      /* [num_tokens, num_qo_heads, head_dim_qk], cfg.q_dtype */
    const ak_paged_kv *kv;   /* paged storage: this layer's cache */
    const ak_tensor *k;      /* ragged storage: [sum kv_len, num_kv_heads, head_dim_qk]; request
                                r's keys are rows sum(kv_lens[0..r)) .. + kv_lens[r] - 1
                                (kv_indptr of ak_batch_meta) */
    const ak_tensor *v;      /* ragged storage: [sum kv_len, num_kv_heads, head_dim_vo]; NULL with
                                cfg.mla (the value is the first head_dim_vo of each K row) */
    ak_tensor *o;            /* [num_tokens, num_qo_heads, head_dim_vo], cfg.o_dtype, OUT */
    ak_tensor *lse;          /* [num_tokens, num_qo_heads] f32, OUT; NULL if not wanted */
    const ak_tensor *sinks;  /* cfg.use_sinks: [num_qo_heads] f32 on cfg.device, each query head's
                                sink logit (natural log, on the scale of the scaled, soft-capped
                                logits); NULL otherwise. Read by run(), so each layer passes its
                                own (a captured run reads the tensor given at capture). */
    ak_kv_scale_kind kv_scale_kind; /* ragged storage with fp8 k and v: their scales, as
                                       ak_paged_kv's (paged storage: the view holds them) */
    const float *k_scale;    /* ragged fp8: [1] or [num_kv_heads] f32 on cfg.device; NULL if none */
    const float *v_scale;    /* likewise; NULL with cfg.mla (k_scale scales the value too) */
} ak_run_args;

AK_API void ak_run_args_init(ak_run_args *args /* OUT */);

/* Creates a backend for cfg with static buffers sized by lim.
 * name: a backend name ("cpu", "cpu_ref", "cuda_paged", "cuda_varlen", ...) or
 * NULL. With NULL, the environment variable AK_BACKEND names the backend if
 * set, otherwise the selector takes the first row of its rule table that
 * matches cfg (device, kv_storage, workload) and picks the first backend of
 * that row whose check() accepts cfg. An unknown name (AK_ERR_BACKEND_NOT_FOUND) or a
 * backend that cannot serve cfg (AK_ERR_UNSUPPORTED) is an error whose message
 * lists every backend with its reasons; a bad override is never ignored. The
 * message of an unknown name suggests the closest known one ("did you mean
 * cuda_paged?"), also where that one is left out of this build. */
AK_API ak_status ak_backend_create(const ak_attn_config *cfg, const ak_limits *lim,
                                   const char *name, ak_backend **out /* OUT */);
AK_API void ak_backend_destroy(ak_backend *b); /* accepts NULL */

/* Host side: validates the batch and fills the backend's static buffers
 * (CUDA: asynchronous copies on `stream` from pinned staging). Never reads
 * device memory. The host arrays of `batch` may be reused as soon as it
 * returns. A plan stays in force for any number of run() calls (all layers of
 * a step). A failed plan() leaves no plan in force (run() then returns
 * AK_ERR_NOT_PLANNED).
 * CUDA: the copies are ordered on `stream`; run() must be on the same stream
 * or ordered after it, and successive plan() calls must be ordered on the
 * device too (one stream): each plan's copies overwrite the previous plan's.
 * plan() keeps two staging buffers and waits on the device only when the
 * copy of the plan before the previous one has not yet run. */
AK_API ak_status ak_backend_plan(ak_backend *b, const ak_batch *batch, ak_stream stream);

/* Device side: attention for one layer over the planned batch. Allocates
 * nothing and never synchronises; on CUDA it is capturable into a CUDA graph
 * (see ak_backend_graph_support). Checks tensors against cfg and the plan.
 * CUDA on sm_90: its first kernel is a programmatic dependent of the kernel
 * before it on `stream` (it waits for that kernel before reading anything
 * but the plan), and its last lets the next kernel launch early: a kernel
 * the caller launches after run() with programmatic stream serialization
 * must wait (griddepcontrol.wait) before reading run()'s outputs, as CUDA
 * requires of any such kernel. */
AK_API ak_status ak_backend_run(ak_backend *b, const ak_run_args *args, ak_stream stream);

AK_API const char *ak_backend_name(const ak_backend *b);
AK_API const ak_attn_config *ak_backend_config(const ak_backend *b);
/* 1 if run() writes the step's K/V into the cache itself (then the engine must
 * not call ak_kv_update), 0 if the engine calls ak_kv_update first. */
AK_API int ak_backend_forward_includes_kv_update(const ak_backend *b);
AK_API ak_graph_support ak_backend_graph_support(const ak_backend *b);

/* The slot mapping of the current plan in the backend's static buffer, on
 * cfg.device: [num_tokens] int64 (paged storage only: NULL for ragged K/V,
 * which have no cache slots, and while no plan is in force: before the first
 * plan or after a failed one). Its address never
 * changes, so an ak_kv_update that reads it can be captured in the same
 * graph as run(). */
AK_API const int64_t *ak_backend_slot_mapping(const ak_backend *b);
/* Query tokens of the current plan (0 while no plan is in force). */
AK_API int ak_backend_planned_tokens(const ak_backend *b);

/* ------------------------------------------------------------------------ */
/* Registry and selector                                                    */
/* ------------------------------------------------------------------------ */

AK_API int ak_backend_count(void);
AK_API const char *ak_backend_name_at(int i); /* NULL if i is out of range */

/* Writes, for cfg, every backend with "chosen", "available" or its reasons, and
 * which rule chose (the AK_BACKEND override, or the selector's rule-table row
 * with the evidence it cites). Returns the status of the selection that
 * ak_backend_create(cfg, lim, NULL, ...) makes (failures inside the chosen
 * backend's create() itself, e.g. out of memory, are not included).
 * buf is always NUL-terminated (truncated if cap is too small). On failure
 * ak_last_error() says why in one line; the backends and their reasons are in
 * buf alone, so a program prints each once. */
AK_API ak_status ak_explain(const ak_attn_config *cfg, char *buf /* OUT */, size_t cap);

/* Whether backend `name` serves cfg on a device described by dev: a real one
 * (ak_device_get_info) or one filled in by hand, to ask about another GPU
 * (its kind, cc_major / cc_minor and num_sms are read; its kind must be
 * cfg.device's, else AK_ERR_INVALID_ARG). AK_OK with one line on how (its
 * kernels) in buf; AK_ERR_UNSUPPORTED with its reasons in buf;
 * AK_ERR_BACKEND_NOT_FOUND for an unknown name. buf is always
 * NUL-terminated. */
AK_API ak_status ak_backend_describe(const char *name, const ak_attn_config *cfg, const ak_device_info *dev,
                                     char *buf /* OUT */, size_t cap);

/* The kernel the cpu backend runs for cfg on this CPU, as its create() picks
 * it (AK_CPU_ISA included; only the dtypes of cfg matter, NULL: f32): its
 * instruction set, "avx512+amx" (bf16 q and K/V on a CPU with AMX),
 * "avx512", "avx2" or "scalar", then what the CPU offers, e.g. "avx512
 * (AVX2+FMA+F16C yes, AVX-512F yes, AMX-BF16 no)". AK_ERR_INVALID_ARG, the
 * reason in buf, when AK_CPU_ISA asks for a kernel that cannot run. buf is
 * always NUL-terminated. */
AK_API ak_status ak_cpu_kernel_describe(const ak_attn_config *cfg, char *buf /* OUT */, size_t cap);

/* The graph support a backend declares (AK_GRAPH_NEVER for an unknown name). */
AK_API ak_graph_support ak_backend_graph_support_of(const char *name);

/* The support matrix: a Markdown table of every feature (head dims, dtypes,
 * sinks, window, soft-cap, non-causal, ragged K/V, decode-only instances,
 * batch invariance, MLA, graph support) against every backend compiled in, each
 * cell the backend's own check() (and, for the CUDA backends, which kernel
 * serves it) on this CPU or on a CUDA device of compute capability 9.0.
 * attnkit-info --matrix prints it; the docs hold a copy a test compares. */
AK_API ak_status ak_support_matrix(char *buf /* OUT */, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* ATTNKIT_H */
