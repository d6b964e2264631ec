/*
 * bench_device.c - the device layer of attnkit-bench: memory, copies, timing,
 * CUDA graphs and the bandwidth ceiling, for the CPU and (with AK_HAVE_CUDA)
 * a CUDA GPU. See bench_device.h.
 */
/* clock_gettime and CLOCK_MONOTONIC under -std=c11 */
#define _POSIX_C_SOURCE 200809L

#include "bench_device.h"

#include "scene_core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef AK_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define GIB ((size_t)1 << 30)
#define MIB ((size_t)1 << 20)

/* When /sys does not say how large the last-level cache is. */
#define DEFAULT_LLC_BYTES (32 * MIB)
/* Share of the memory the bench may take: the CPU machine is shared with
 * other jobs; on the GPU the CUDA context and the backends' static buffers
 * need some of what cudaMemGetInfo reports free. */
#define CPU_MEM_SHARE 0.6
#define GPU_MEM_SHARE 0.85
/* The ceiling's buffer: at least this much, and at least this many times the
 * cache, so no repetition can be served from the cache. */
#define CEILING_MIN_BYTES GIB
#define CEILING_CACHE_FACTOR 4
#define CEILING_WARMUP 1
#define CEILING_REPS 5

static inline int on_gpu(const bd_ctx *ctx) { return ctx->dev.kind == AK_DEVICE_CUDA; }

#ifdef AK_HAVE_CUDA
/* Every CUDA call goes through this: prints the call, where, and the error. */
#define BD_CUDA(expr)                                                                   \
    do {                                                                                \
        const cudaError_t bd_e_ = (expr);                                               \
        if (bd_e_ != cudaSuccess) {                                                     \
            fprintf(stderr, "attnkit-bench: %s failed at %s:%d: %s\n", #expr, __FILE__, \
                    __LINE__, cudaGetErrorString(bd_e_));                               \
            return -1;                                                                  \
        }                                                                               \
    } while (0)

/* For calls on a path that is already failing or tearing down: a failure is
 * reported and cleared, and the caller carries on releasing what it holds. */
static void bd_cuda_warn(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return;
    fprintf(stderr, "attnkit-bench: %s: %s\n", what, cudaGetErrorString(e));
    cudaGetLastError();
}
#endif

double bd_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


/* ---- cache and memory sizes ------------------------------------------------ */

/* Reads the first integer of a small text file; -1 if it cannot. "48K" and
 * "32M" (the /sys cache size format) are scaled. */
static long long read_sys_number(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long long v = -1;
    char unit = 0;
    const int n = fscanf(f, "%lld%c", &v, &unit);
    fclose(f);
    if (n < 1) return -1;
    if (n == 2 && (unit == 'K' || unit == 'k')) v *= 1024;
    if (n == 2 && (unit == 'M' || unit == 'm')) v *= 1024 * 1024;
    return v;
}

/* The largest cache of the highest level that /sys lists for CPU 0. */
static size_t cpu_llc_bytes(void)
{
    /* index0..indexN: L1d, L1i, L2, L3, ...; stop at the first missing one */
    enum { MAX_CACHE_INDEX = 16 };
    long long best_level = 0, best_size = 0;
    for (int i = 0; i < MAX_CACHE_INDEX; i++) {
        char path[128];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        const long long level = read_sys_number(path);
        if (level < 0) break;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        const long long size = read_sys_number(path);
        if (size > 0 && (level > best_level || (level == best_level && size > best_size))) {
            best_level = level;
            best_size = size;
        }
    }
    return best_size > 0 ? (size_t)best_size : DEFAULT_LLC_BYTES;
}

/* MemAvailable from /proc/meminfo (bytes); 0 if unknown. */
static size_t cpu_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t bytes = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kib;
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
            bytes = (size_t)kib * 1024;
            break;
        }
    }
    fclose(f);
    return bytes;
}

size_t bd_mem_budget(const bd_ctx *ctx)
{
#ifdef AK_HAVE_CUDA
    if (on_gpu(ctx)) {
        size_t free_b = 0, total_b = 0;
        const cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
        if (e != cudaSuccess) {
            bd_cuda_warn(e, "cudaMemGetInfo");
            return 0;
        }
        return (size_t)((double)free_b * GPU_MEM_SHARE);
    }
#endif
    (void)ctx;
    const size_t avail = cpu_mem_available();
    /* /proc unreadable: assume enough, allocations will say otherwise */
    return avail ? (size_t)((double)avail * CPU_MEM_SHARE) : (size_t)64 * GIB;
}

/* ---- open / close ---------------------------------------------------------- */

#ifdef AK_HAVE_CUDA
static int open_gpu(bd_ctx *ctx)
{
    BD_CUDA(cudaSetDevice(ctx->dev.index));
    cudaStream_t s = NULL;
    cudaEvent_t a = NULL, b = NULL;
    /* non-blocking: no implicit sync with the legacy stream, and capturable */
    BD_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ctx->stream = s;
    BD_CUDA(cudaEventCreate(&a));
    ctx->ev_start = a;
    BD_CUDA(cudaEventCreate(&b));
    ctx->ev_stop = b;
    ctx->cache_bytes = ctx->info.l2_bytes;
    return 0;
}
#endif

int bd_open(bd_ctx *ctx, ak_device dev)
{
    memset(ctx, 0, sizeof *ctx);
    ctx->dev = dev;
    if (ak_device_get_info(dev, &ctx->info) != AK_OK) {
        fprintf(stderr, "attnkit-bench: %s\n", ak_last_error());
        return -1;
    }
    if (dev.kind == AK_DEVICE_CPU) {
        ctx->cache_bytes = cpu_llc_bytes();
        return 0;
    }
#ifdef AK_HAVE_CUDA
    if (open_gpu(ctx) != 0) {
        bd_close(ctx); /* what was created before the failure */
        return -1;
    }
    return 0;
#else
    fprintf(stderr, "attnkit-bench: this build has no CUDA\n");
    return -1;
#endif
}

void bd_close(bd_ctx *ctx)
{
#ifdef AK_HAVE_CUDA
    if (on_gpu(ctx)) {
        /* teardown: report failures, but release everything regardless */
        if (ctx->ev_start) bd_cuda_warn(cudaEventDestroy((cudaEvent_t)ctx->ev_start), "cudaEventDestroy");
        if (ctx->ev_stop) bd_cuda_warn(cudaEventDestroy((cudaEvent_t)ctx->ev_stop), "cudaEventDestroy");
        if (ctx->stream) bd_cuda_warn(cudaStreamDestroy((cudaStream_t)ctx->stream), "cudaStreamDestroy");
    }
#endif
    memset(ctx, 0, sizeof *ctx);
}

/* ---- memory ------------------------------------------------------------------ */

/* The memory of scene_core.h on the bench's device and stream, with the
 * bench's messages. */
void *bd_malloc(const bd_ctx *ctx, size_t bytes)
{
    void *p = scn_alloc(ctx->dev, bytes);
    if (!p) fprintf(stderr, "attnkit-bench: cannot allocate %zu bytes: %s\n", bytes, scn_last_device_error());
    return p;
}

void bd_free(const bd_ctx *ctx, void *p) { scn_free(ctx->dev, p); }

int bd_upload(const bd_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    if (!scn_upload(ctx->dev, ctx->stream, dst, src, bytes)) return 0;
    fprintf(stderr, "attnkit-bench: upload of %zu bytes: %s\n", bytes, scn_last_device_error());
    return -1;
}

int bd_download(const bd_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    if (!scn_download(ctx->dev, ctx->stream, dst, src, bytes)) return 0;
    fprintf(stderr, "attnkit-bench: download of %zu bytes: %s\n", bytes, scn_last_device_error());
    return -1;
}

int bd_memset(const bd_ctx *ctx, void *dst, int byte, size_t bytes)
{
    if (!scn_memset(ctx->dev, ctx->stream, dst, byte, bytes)) return 0;
    fprintf(stderr, "attnkit-bench: memset of %zu bytes: %s\n", bytes, scn_last_device_error());
    return -1;
}

int bd_sync(const bd_ctx *ctx)
{
    if (!scn_sync(ctx->dev)) return 0;
    fprintf(stderr, "attnkit-bench: device error: %s\n", scn_last_device_error());
    return -1;
}

/* ---- timing ------------------------------------------------------------------- */

int bd_time(const bd_ctx *ctx, bd_work_fn fn, void *arg, double *ms)
{
    *ms = 0;
#ifdef AK_HAVE_CUDA
    if (on_gpu(ctx)) {
        cudaStream_t s = (cudaStream_t)ctx->stream;
        BD_CUDA(cudaEventRecord((cudaEvent_t)ctx->ev_start, s));
        if (fn(arg) != 0) {
            /* drain what was enqueued; the failure itself is already reported */
            bd_cuda_warn(cudaStreamSynchronize(s), "cudaStreamSynchronize after a failed sample");
            return -1;
        }
        BD_CUDA(cudaEventRecord((cudaEvent_t)ctx->ev_stop, s));
        /* a fault of the timed kernels surfaces here */
        BD_CUDA(cudaEventSynchronize((cudaEvent_t)ctx->ev_stop));
        float elapsed = 0;
        BD_CUDA(cudaEventElapsedTime(&elapsed, (cudaEvent_t)ctx->ev_start, (cudaEvent_t)ctx->ev_stop));
        *ms = elapsed;
        return 0;
    }
#endif
    (void)ctx;
    const double t0 = bd_now();
    if (fn(arg) != 0) return -1;
    *ms = 1e3 * (bd_now() - t0);
    return 0;
}

/* ---- CUDA graphs ------------------------------------------------------------------ */

int bd_graph_capture(const bd_ctx *ctx, bd_work_fn fn, void *arg, bd_graph *g)
{
    memset(g, 0, sizeof *g);
#ifdef AK_HAVE_CUDA
    if (on_gpu(ctx)) {
        cudaStream_t s = (cudaStream_t)ctx->stream;
        BD_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        const int rc = fn(arg);
        cudaGraph_t graph = NULL;
        /* end the capture whatever happened, or the stream stays in capture mode */
        const cudaError_t end = cudaStreamEndCapture(s, &graph);
        if (rc != 0 || end != cudaSuccess) {
            if (end != cudaSuccess)
                fprintf(stderr, "attnkit-bench: cudaStreamEndCapture: %s (a call during capture was "
                                "not capturable)\n", cudaGetErrorString(end));
            if (graph) bd_cuda_warn(cudaGraphDestroy(graph), "cudaGraphDestroy");
            cudaGetLastError(); /* the failed capture's error is reported; clear it */
            return -1;
        }
        g->graph = graph;
        cudaGraphExec_t exec = NULL;
        const cudaError_t inst = cudaGraphInstantiateWithFlags(&exec, graph, 0);
        if (inst != cudaSuccess) {
            fprintf(stderr, "attnkit-bench: cudaGraphInstantiateWithFlags: %s\n", cudaGetErrorString(inst));
            cudaGetLastError();
            bd_graph_destroy(g);
            return -1;
        }
        g->exec = exec;
        return 0;
    }
#endif
    (void)ctx;
    (void)fn;
    (void)arg;
    fprintf(stderr, "attnkit-bench: CUDA graphs need a CUDA device\n");
    return -1;
}

int bd_graph_launch(const bd_ctx *ctx, const bd_graph *g)
{
#ifdef AK_HAVE_CUDA
    if (on_gpu(ctx) && g->exec) {
        BD_CUDA(cudaGraphLaunch((cudaGraphExec_t)g->exec, (cudaStream_t)ctx->stream));
        return 0;
    }
#endif
    (void)ctx;
    (void)g;
    fprintf(stderr, "attnkit-bench: no instantiated CUDA graph to launch\n");
    return -1;
}

int bd_graph_launch_fn(void *arg)
{
    const bd_graph_launch_arg *a = arg;
    return bd_graph_launch(a->ctx, a->graph);
}

void bd_graph_destroy(bd_graph *g)
{
#ifdef AK_HAVE_CUDA
    if (g->exec) bd_cuda_warn(cudaGraphExecDestroy((cudaGraphExec_t)g->exec), "cudaGraphExecDestroy");
    if (g->graph) bd_cuda_warn(cudaGraphDestroy((cudaGraph_t)g->graph), "cudaGraphDestroy");
#endif
    memset(g, 0, sizeof *g);
}

/* ---- ceiling ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static size_t ceiling_bytes(const bd_ctx *ctx)
{
    const size_t by_cache = CEILING_CACHE_FACTOR * ctx->cache_bytes;
    return by_cache > CEILING_MIN_BYTES ? by_cache : CEILING_MIN_BYTES;
}

/* Keeps the sums alive so the compiler cannot drop the reads. */
static volatile uint64_t ceiling_sink;

static int cpu_ceiling(const bd_ctx *ctx, bd_ceiling *out)
{
    size_t bytes = ceiling_bytes(ctx);
    const size_t budget = bd_mem_budget(ctx);
    if (bytes > budget / 2) {
        fprintf(stderr, "attnkit-bench: ceiling buffer cut from %.2f to %.2f GiB (memory available); "
                        "it may not exceed the cache by much\n",
                (double)bytes / GIB, (double)(budget / 2) / GIB);
        bytes = budget / 2;
    }
    const size_t n = bytes / sizeof(uint64_t);
    uint64_t *buf = bd_malloc(ctx, n * sizeof(uint64_t));
    if (!buf) return -1;
    const int threads = ak_cpu_num_threads();
    /* first touch by the same threads, same schedule: pages land where they are read,
     * and untouched pages would all map the one zero page and never reach DRAM */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (size_t i = 0; i < n; i++) buf[i] = i * 0x9e3779b97f4a7c15ull;

    double gbps[CEILING_REPS];
    for (int rep = 0; rep < CEILING_WARMUP + CEILING_REPS; rep++) {
        uint64_t sum = 0;
        const double t0 = bd_now();
        /* integer sum: the compiler vectorises it without -ffast-math, so the
         * loop is bound by memory, not by the latency of a float add */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) reduction(+ : sum) num_threads(threads)
#endif
        for (size_t i = 0; i < n; i++) sum += buf[i];
        const double dt = bd_now() - t0;
        ceiling_sink += sum;
        if (rep >= CEILING_WARMUP) gbps[rep - CEILING_WARMUP] = (double)(n * sizeof(uint64_t)) / dt / 1e9;
    }
    bd_free(ctx, buf);
    qsort(gbps, CEILING_REPS, sizeof gbps[0], cmp_double);
    out->name = "stream_read";
    out->gbps = gbps[CEILING_REPS / 2];
    out->bytes = n * sizeof(uint64_t);
    out->threads = threads;
    return 0;
}

#ifdef AK_HAVE_CUDA
/* Times CEILING_REPS copies of src to dst (after a warm-up) with events. */
static int gpu_copy_reps(const bd_ctx *ctx, void *dst, void *src, size_t bytes, double *gbps)
{
    cudaStream_t s = (cudaStream_t)ctx->stream;
    BD_CUDA(cudaMemsetAsync(src, 1, bytes, s));
    for (int rep = 0; rep < CEILING_WARMUP + CEILING_REPS; rep++) {
        float ms = 0;
        BD_CUDA(cudaEventRecord((cudaEvent_t)ctx->ev_start, s));
        BD_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
        BD_CUDA(cudaEventRecord((cudaEvent_t)ctx->ev_stop, s));
        BD_CUDA(cudaEventSynchronize((cudaEvent_t)ctx->ev_stop));
        BD_CUDA(cudaEventElapsedTime(&ms, (cudaEvent_t)ctx->ev_start, (cudaEvent_t)ctx->ev_stop));
        /* a copy reads and writes every byte */
        if (rep >= CEILING_WARMUP) gbps[rep - CEILING_WARMUP] = 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
    }
    return 0;
}

static int gpu_ceiling(const bd_ctx *ctx, bd_ceiling *out)
{
    size_t bytes = ceiling_bytes(ctx);
    const size_t budget = bd_mem_budget(ctx);
    if (2 * bytes > budget) {
        fprintf(stderr, "attnkit-bench: copy ceiling buffers cut from %.2f to %.2f GiB (free memory)\n",
                (double)bytes / GIB, (double)(budget / 2) / GIB);
        bytes = budget / 2;
    }
    void *src = bd_malloc(ctx, bytes), *dst = src ? bd_malloc(ctx, bytes) : NULL;
    double gbps[CEILING_REPS];
    const int rc = src && dst ? gpu_copy_reps(ctx, dst, src, bytes, gbps) : -1;
    if (rc != 0) /* nothing in flight before the frees */
        bd_cuda_warn(cudaStreamSynchronize((cudaStream_t)ctx->stream), "cudaStreamSynchronize (copy ceiling)");
    bd_free(ctx, src);
    bd_free(ctx, dst);
    if (rc != 0) return -1;
    qsort(gbps, CEILING_REPS, sizeof gbps[0], cmp_double);
    out->name = "d2d_copy";
    out->gbps = gbps[CEILING_REPS / 2];
    out->bytes = bytes;
    out->threads = 0;
    return 0;
}
#endif

int bd_measure_ceiling(const bd_ctx *ctx, bd_ceiling *out)
{
    memset(out, 0, sizeof *out);
#ifdef AK_HAVE_CUDA
    if (on_gpu(ctx)) return gpu_ceiling(ctx, out);
#endif
    return cpu_ceiling(ctx, out);
}

#ifndef AK_HAVE_CUDA
int bd_floor_enqueue(const bd_ctx *ctx, const void *a, size_t a_bytes, const void *b, size_t b_bytes, int tail,
                     void *sink)
{
    (void)ctx, (void)a, (void)a_bytes, (void)b, (void)b_bytes, (void)tail, (void)sink;
    fprintf(stderr, "attnkit-bench: the floor needs a CUDA build\n");
    return -1;
}
#endif
