/*
 * test_main.c - attnkit-test: runs every suite for one device.
 *   attnkit-test [--device cpu|cuda] [--backend NAME] [--filter TEXT] [--skip TEXT]...
 *                [--storage paged|ragged] [--shard I/N] [--seed N] [-v]
 * --filter runs only the cases whose name contains TEXT, --skip (up to 8)
 * leaves out those whose name contains any of its TEXTs.
 * --shard I/N runs the cases whose name hashes to I mod N: N processes with
 * I = 0 .. N-1 run every case between them, side by side (the few checks
 * outside the case tables run in each).
 * Exit 0 if nothing failed, 1 otherwise, 77 (skipped) for --device cuda
 * where no GPU is present.
 */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv)
{
    test_ctx t;
    memset(&t, 0, sizeof t);
    t.device.kind = AK_DEVICE_CPU;
    t.storage = -1;
    t.seed = (uint64_t)time(NULL);
    if (getenv("AK_TEST_SEED")) t.seed = strtoull(getenv("AK_TEST_SEED"), NULL, 10);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            const char *d = argv[++i];
            if (!strcmp(d, "cuda")) t.device.kind = AK_DEVICE_CUDA;
            else if (strcmp(d, "cpu")) { fprintf(stderr, "--device: cpu or cuda, not %s\n", d); return 2; }
        } else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            t.backend = argv[++i];
        } else if (!strcmp(argv[i], "--filter") && i + 1 < argc) {
            t.filter = argv[++i];
        } else if (!strcmp(argv[i], "--skip") && i + 1 < argc) {
            if (t.num_skip == (int)(sizeof t.skip / sizeof t.skip[0])) {
                fprintf(stderr, "--skip: at most %d\n", t.num_skip);
                return 2;
            }
            t.skip[t.num_skip++] = argv[++i];
        } else if (!strcmp(argv[i], "--storage") && i + 1 < argc) {
            const char *s = argv[++i];
            if (!strcmp(s, "paged")) t.storage = AK_KV_PAGED;
            else if (!strcmp(s, "ragged")) t.storage = AK_KV_RAGGED;
            else { fprintf(stderr, "--storage: paged or ragged, not %s\n", s); return 2; }
        } else if (!strcmp(argv[i], "--shard") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d/%d", &t.shard, &t.shards) != 2 || t.shards < 1 || t.shard < 0 ||
                t.shard >= t.shards) {
                fprintf(stderr, "--shard: I/N with 0 <= I < N, not %s\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            t.seed = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "-v")) {
            t.verbose = 1;
        } else {
            fprintf(stderr, "usage: %s [--device cpu|cuda] [--backend NAME] [--filter TEXT] [--skip TEXT]... "
                            "[--storage paged|ragged] [--shard I/N] [--seed N] [-v]\n", argv[0]);
            return 2;
        }
    }
    if (t.device.kind == AK_DEVICE_CUDA && ak_device_count(AK_DEVICE_CUDA) == 0) {
        printf("no CUDA device: GPU tests skipped\n");
        return 77;
    }
    printf("attnkit-test: device %s, seed %llu (AK_TEST_SEED=%llu reproduces)\n",
           t.device.kind == AK_DEVICE_CUDA ? "cuda" : "cpu", (unsigned long long)t.seed,
           (unsigned long long)t.seed);
    test_core(&t);
    test_attn_cases(&t);
    test_props(&t);
    test_bad_input(&t);
    test_graphs(&t);
    test_hostile(&t);
    test_nonfinite(&t);
    test_threads(&t);
    test_fp8(&t);
    test_mla(&t);
    printf("%d passed, %d failed (%d skipped as unsupported)\n", t.passed, t.failed, t.skipped);
    return t.failed ? 1 : 0;
}
