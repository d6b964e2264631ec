/*
 * fuzz_common.h - what the libFuzzer targets (tests/fuzz/fuzz_*.c) share: a
 * reader that turns the input bytes into bounded choices, a PRNG for bulk
 * data, and guarded host buffers.
 *
 * Every choice reads a few bytes of the input (zeros once it runs out), so a
 * short input is a valid, small case and the fuzzer's mutations move one
 * choice at a time. Sizes are capped inside each target so that one
 * execution stays in the milliseconds.
 */
#ifndef AK_FUZZ_COMMON_H
#define AK_FUZZ_COMMON_H

#define _POSIX_C_SOURCE 200809L /* setenv */
#include "attnkit.h"
#include "dtype.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fails the execution: libFuzzer reports the abort with the input. */
#define FZ_CHECK(cond, ...)                                                    \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "fuzz check failed: %s: ", #cond);                 \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
            abort();                                                           \
        }                                                                      \
    } while (0)

/* ---- the input ---------------------------------------------------------------- */

typedef struct fz {
    const uint8_t *p;
    size_t n;
} fz;

static inline uint32_t fz_u32(fz *f, int bytes)
{
    uint32_t v = 0;
    for (int i = 0; i < bytes; i++) {
        v = v << 8 | (f->n ? *f->p : 0);
        if (f->n) f->p++, f->n--;
    }
    return v;
}

/* An int in [lo, hi] (hi - lo < 2^32). */
static inline int64_t fz_int(fz *f, int64_t lo, int64_t hi)
{
    const uint64_t span = (uint64_t)(hi - lo) + 1;
    const int bytes = span <= 0x100 ? 1 : span <= 0x10000 ? 2 : 4;
    return lo + (int64_t)(fz_u32(f, bytes) % span);
}

/* 1 with probability about 1 / n. */
static inline int fz_rare(fz *f, int n) { return fz_int(f, 0, n - 1) == 0; }

/* One of the n values. */
#define FZ_PICK(f, arr) (arr)[fz_int((f), 0, (int64_t)(sizeof(arr) / sizeof((arr)[0])) - 1)]

/* ---- bulk data ---------------------------------------------------------------- */

static inline uint64_t rnd_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* [-1, 1) */
static inline float rnd_unit(uint64_t *s) { return (float)((rnd_next(s) >> 40) * (2.0 / 16777216.0) - 1.0); }

/* n elements of dtype t, uniform in [-scale, scale). */
static inline void rnd_fill(void *p, ak_dtype t, int64_t n, float scale, uint64_t *s)
{
    for (int64_t i = 0; i < n; i++) ak_store_from_f32(p, t, i, scale * rnd_unit(s));
}

/* ---- guarded host buffers ---------------------------------------------------- */

#define FZ_GUARD 64
#define FZ_GUARD_BYTE 0x5A

typedef struct gbuf {
    unsigned char *raw; /* [FZ_GUARD | bytes | FZ_GUARD] */
    size_t bytes;
} gbuf;

static inline void *gbuf_alloc(gbuf *b, size_t bytes)
{
    b->bytes = bytes;
    b->raw = malloc(bytes + 2 * FZ_GUARD);
    FZ_CHECK(b->raw != NULL, "cannot allocate %zu bytes", bytes);
    memset(b->raw, FZ_GUARD_BYTE, bytes + 2 * FZ_GUARD);
    return b->raw + FZ_GUARD;
}

static inline void *gbuf_data(const gbuf *b) { return b->raw + FZ_GUARD; }

static inline int gbuf_guards_ok(const gbuf *b)
{
    for (size_t i = 0; i < FZ_GUARD; i++)
        if (b->raw[i] != FZ_GUARD_BYTE || b->raw[FZ_GUARD + b->bytes + i] != FZ_GUARD_BYTE) return 0;
    return 1;
}

static inline void gbuf_free(gbuf *b)
{
    free(b->raw);
    b->raw = NULL;
}

#endif
