/*
 * bench_device.h - what attnkit-bench needs from a device, the same calls for
 * the CPU and for a CUDA GPU: memory and copies, a stream, one timed sample
 * (clock_gettime on the CPU, CUDA events on the GPU), CUDA-graph capture and
 * replay, the cache size that decides the layer rotation, and the bandwidth
 * ceiling measured in the same run.
 *
 * Every function prints what went wrong on stderr ("attnkit-bench: ...") and
 * returns -1 (or NULL); the bench then skips the row or stops. The CUDA parts
 * compile only with AK_HAVE_CUDA; without it a CUDA device reports itself
 * absent.
 */
#ifndef AK_BENCH_DEVICE_H
#define AK_BENCH_DEVICE_H

#include "attnkit.h"

#include <stddef.h>
#include <stdint.h>

typedef struct bd_ctx {
    ak_device dev;
    ak_device_info info;
    void *stream;       /* cudaStream_t (non-blocking, so it can be captured); NULL on the CPU */
    void *ev_start;     /* cudaEvent_t */
    void *ev_stop;      /* cudaEvent_t */
    size_t cache_bytes; /* CPU: last-level cache; GPU: L2 */
} bd_ctx;

/* Opens dev (sets the CUDA device, creates the stream and the events).
 * Returns 0, or -1 after printing why (no such device, CUDA not built in). */
int bd_open(bd_ctx *ctx, ak_device dev);
void bd_close(bd_ctx *ctx);

/* ---- memory ------------------------------------------------------------- */
/* Copies and memsets are ordered on ctx->stream and complete on return. */

void *bd_malloc(const bd_ctx *ctx, size_t bytes);
void bd_free(const bd_ctx *ctx, void *p); /* accepts NULL */
int bd_upload(const bd_ctx *ctx, void *dst, const void *src, size_t bytes);   /* host -> dev */
int bd_download(const bd_ctx *ctx, void *dst, const void *src, size_t bytes); /* dev -> host */
int bd_memset(const bd_ctx *ctx, void *dst, int byte, size_t bytes);
/* Waits for everything on the device (GPU: cudaDeviceSynchronize, so work the
 * library put on other streams is done too); reports a fault. */
int bd_sync(const bd_ctx *ctx);

/* Bytes the bench may allocate on the device now: a share of the CPU's
 * MemAvailable, or of cudaMemGetInfo's free memory. */
size_t bd_mem_budget(const bd_ctx *ctx);

/* ---- timing -------------------------------------------------------------- */

/* One unit of timed work: enqueues (GPU) or runs (CPU) the calls of a sample.
 * Returns 0, or -1 after printing why. */
typedef int (*bd_work_fn)(void *arg);

/* Times one call of fn: host clock on the CPU; on the GPU, CUDA events
 * recorded on ctx->stream around it, then synchronised. */
int bd_time(const bd_ctx *ctx, bd_work_fn fn, void *arg, double *ms /* OUT */);

/* Host wall clock, seconds (monotonic). */
double bd_now(void);

/* ---- CUDA graphs --------------------------------------------------------- */

typedef struct bd_graph {
    void *graph; /* cudaGraph_t */
    void *exec;  /* cudaGraphExec_t */
} bd_graph;

/* Captures what fn enqueues on ctx->stream (global capture mode, so a call
 * that is illegal during capture fails here) and instantiates it. */
int bd_graph_capture(const bd_ctx *ctx, bd_work_fn fn, void *arg, bd_graph *g /* OUT */);
int bd_graph_launch(const bd_ctx *ctx, const bd_graph *g);
void bd_graph_destroy(bd_graph *g); /* accepts a zeroed graph */

/* A bd_work_fn that launches the graph passed as arg (a const bd_graph_launch_arg *). */
typedef struct bd_graph_launch_arg {
    const bd_ctx *ctx;
    const bd_graph *graph;
} bd_graph_launch_arg;
int bd_graph_launch_fn(void *arg);

/* ---- ceiling -------------------------------------------------------------- */

typedef struct bd_ceiling {
    const char *name; /* "stream_read" (CPU) or "d2d_copy" (GPU) */
    double gbps;      /* median over the repetitions */
    size_t bytes;     /* buffer size used */
    int threads;      /* CPU: OpenMP threads; GPU: 0 */
} bd_ceiling;

/* CPU: OpenMP threads (AK_NUM_THREADS, as the library uses) sum a buffer of
 * at least 1 GiB and 4x the last-level cache; bytes read / time.
 * GPU: cudaMemcpyAsync device-to-device of at least 1 GiB and 4x L2, timed
 * with events; bytes read + written / time. */
int bd_measure_ceiling(const bd_ctx *ctx, bd_ceiling *out /* OUT */);

/* ---- a shape's floor (GPU) ------------------------------------------------ */

/* Enqueues on ctx->stream a kernel that only reads a[0, a_bytes) and
 * b[0, b_bytes) (b may be NULL), 16 bytes at a time, and with tail a one-block
 * kernel that depends on it; both programmatic dependents of the kernel
 * before them on sm_90. sink: 8 bytes of device memory, written only in the
 * (practically never) case the data sums to a magic value. Returns 0, or -1
 * after printing why (also when CUDA is not built in). */
int bd_floor_enqueue(const bd_ctx *ctx, const void *a, size_t a_bytes, const void *b, size_t b_bytes, int tail,
                     void *sink);

#endif
