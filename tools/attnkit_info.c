/*
 * attnkit-info - the devices found, and for one config the selector's rule
 * that fired (with the evidence it cites) and every backend with "chosen",
 * "available" or its reasons.
 *   attnkit-info [--heads QO/KV] [--head-dim D | --head-dim QK/VO] [--dtype f32|f16|bf16]
 *                [--kv-dtype f32|f16|bf16|fp8_e4m3] [--device cpu|cuda] [--page-size N] [--layout nhd|hnd] [--ragged]
 *                [--window N] [--soft-cap C] [--non-causal] [--workload any|decode]
 *                [--sinks] [--invariant] [--mla]
 *   attnkit-info --matrix       the support matrix (every backend's check(), Markdown)
 *   attnkit-info --version      the library's version
 *   attnkit-info --help, -h     this usage (on stdout; exit 0)
 * --dtype sets q, K/V and o; --kv-dtype then sets K/V alone (fp8_e4m3: q and
 * o stay as --dtype says, bf16 if it says nothing). --mla: multi-head latent
 * attention, with 128/1 heads and head dims 576/512 (DeepSeek-V3) unless
 * --heads / --head-dim say otherwise.
 * Exits 1 when no backend can serve the config (or AK_BACKEND names a
 * backend that cannot), 2 on bad usage (the usage on stderr).
 */
#include "attnkit.h"
#include "cli_parse.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cli_ints within int, or -1 after a message naming opt */
static int parse_ints(const char *opt, const char *s, int min, int n, int *out)
{
    const int k = cli_ints(s, min, n, INT_MIN, INT_MAX, out);
    if (k < 0)
        fprintf(stderr, "%s '%s': expected %s\n", opt, s,
                min == 2 ? "N/M (integers)" : n == 2 ? "N or N/M (integers)" : "an integer");
    return k;
}

static int parse_dtype(const char *s, ak_dtype *t)
{
    if (!strcmp(s, "f32")) *t = AK_F32;
    else if (!strcmp(s, "f16")) *t = AK_F16;
    else if (!strcmp(s, "bf16")) *t = AK_BF16;
    else if (!strcmp(s, "fp8_e4m3")) *t = AK_FP8_E4M3;
    else return -1;
    return 0;
}

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--heads QO/KV] [--head-dim D|QK/VO] [--dtype f32|f16|bf16] [--kv-dtype f32|f16|bf16|fp8_e4m3]\n"
            "          [--device cpu|cuda] [--page-size N] [--layout nhd|hnd] [--ragged] [--window N] [--soft-cap C] [--non-causal]\n"
            "          [--workload any|decode] [--sinks] [--invariant] [--mla]\n"
            "       %s --matrix\n"
            "       %s --version\n"
            "       %s --help\n",
            argv0, argv0, argv0, argv0);
}

int main(int argc, char **argv)
{
    ak_attn_config cfg;
    ak_attn_config_init(&cfg);
    cfg.num_qo_heads = 32;
    cfg.num_kv_heads = 8;
    int device_given = 0, dtype_given = 0, heads_given = 0, dims_given = 0;
    ak_dtype kv_dtype = (ak_dtype)-1; /* --kv-dtype, applied after --dtype */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--heads") && v) {
            int h[2];
            if (parse_ints(a, v, 2, 2, h) < 0) { usage(stderr, argv[0]); return 2; }
            cfg.num_qo_heads = h[0];
            cfg.num_kv_heads = h[1];
            heads_given = 1;
            i++;
        } else if (!strcmp(a, "--head-dim") && v) {
            int d[2];
            const int n = parse_ints(a, v, 1, 2, d);
            if (n < 0) { usage(stderr, argv[0]); return 2; }
            cfg.head_dim_qk = d[0];
            cfg.head_dim_vo = d[n - 1];
            dims_given = 1;
            i++;
        } else if (!strcmp(a, "--dtype") && v) {
            if (parse_dtype(v, &cfg.q_dtype) || cfg.q_dtype == AK_FP8_E4M3) { usage(stderr, argv[0]); return 2; }
            cfg.kv_dtype = cfg.o_dtype = cfg.q_dtype;
            dtype_given = 1;
            i++;
        } else if (!strcmp(a, "--kv-dtype") && v) {
            if (parse_dtype(v, &kv_dtype)) { usage(stderr, argv[0]); return 2; }
            i++;
        } else if (!strcmp(a, "--device") && v) {
            if (strcmp(v, "cuda") && strcmp(v, "cpu")) {
                fprintf(stderr, "--device '%s': expected cpu or cuda\n", v);
                usage(stderr, argv[0]);
                return 2;
            }
            cfg.device.kind = !strcmp(v, "cuda") ? AK_DEVICE_CUDA : AK_DEVICE_CPU;
            device_given = 1;
            i++;
        } else if (!strcmp(a, "--page-size") && v) {
            if (parse_ints(a, v, 1, 1, &cfg.page_size) < 0) { usage(stderr, argv[0]); return 2; }
            i++;
        } else if (!strcmp(a, "--layout") && v) {
            if (strcmp(v, "hnd") && strcmp(v, "nhd")) {
                fprintf(stderr, "--layout '%s': expected nhd or hnd\n", v);
                usage(stderr, argv[0]);
                return 2;
            }
            cfg.kv_layout = !strcmp(v, "hnd") ? AK_LAYOUT_HND : AK_LAYOUT_NHD;
            i++;
        } else if (!strcmp(a, "--window") && v) {
            if (parse_ints(a, v, 1, 1, &cfg.window_left) < 0) { usage(stderr, argv[0]); return 2; }
            i++;
        } else if (!strcmp(a, "--soft-cap") && v) {
            char *end = NULL;
            cfg.logits_soft_cap = strtof(v, &end);
            if (end == v || *end || !isfinite(cfg.logits_soft_cap)) {
                fprintf(stderr, "--soft-cap '%s': expected a number\n", v);
                usage(stderr, argv[0]);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--ragged")) {
            cfg.kv_storage = AK_KV_RAGGED;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout, argv[0]);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("attnkit %s\n", ak_version_string());
            return 0;
        } else if (!strcmp(a, "--non-causal")) {
            cfg.causal = 0;
        } else if (!strcmp(a, "--sinks")) {
            cfg.use_sinks = 1;
        } else if (!strcmp(a, "--invariant")) {
            cfg.batch_invariant = 1;
        } else if (!strcmp(a, "--mla")) {
            cfg.mla = 1;
        } else if (!strcmp(a, "--matrix")) {
            static char m[32768];
            const ak_status st = ak_support_matrix(m, sizeof m);
            fputs(m, stdout);
            return st == AK_OK ? 0 : 1;
        } else if (!strcmp(a, "--workload") && v) {
            if (!strcmp(v, "decode")) cfg.workload = AK_WORKLOAD_DECODE;
            else if (!strcmp(v, "any")) cfg.workload = AK_WORKLOAD_ANY;
            else { usage(stderr, argv[0]); return 2; }
            i++;
        } else {
            usage(stderr, argv[0]);
            return 2;
        }
    }

    if (cfg.mla && !heads_given) {
        cfg.num_qo_heads = 128;
        cfg.num_kv_heads = 1;
    }
    if (cfg.mla && !dims_given) {
        cfg.head_dim_qk = 576;
        cfg.head_dim_vo = 512;
    }
    /* default device: the GPU where one is found */
    if (!device_given && ak_device_count(AK_DEVICE_CUDA) > 0) {
        cfg.device.kind = AK_DEVICE_CUDA;
        if (cfg.q_dtype == AK_F32) cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = AK_BF16;
    }
    if ((int)kv_dtype >= 0) {
        if (kv_dtype == AK_FP8_E4M3 && !dtype_given) cfg.q_dtype = cfg.o_dtype = AK_BF16;
        cfg.kv_dtype = kv_dtype;
    }

    printf("devices:\n");
    for (int k = 0; k < 2; k++) {
        const ak_device_kind kind = k ? AK_DEVICE_CUDA : AK_DEVICE_CPU;
        const int n = ak_device_count(kind);
        if (n == 0) printf("  %s: none\n", k ? "cuda" : "cpu");
        for (int i = 0; i < n; i++) {
            ak_device_info info;
            const ak_device d = {kind, i};
            if (ak_device_get_info(d, &info) != AK_OK) continue;
            if (kind == AK_DEVICE_CPU) {
                /* the kernel the cpu backend would run for this config's dtypes */
                char kernel[256];
                ak_cpu_kernel_describe(&cfg, kernel, sizeof kernel);
                printf("  cpu:0  %s, %d logical cores, cpu kernel: %s\n", info.name, info.num_sms, kernel);
            } else
                printf("  cuda:%d %s, sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB\n", i, info.name, info.cc_major,
                       info.cc_minor, info.num_sms, info.memory_bytes / 1073741824.0, info.l2_bytes / 1048576.0);
        }
    }
    static char buf[16384];
    const ak_status st = ak_explain(&cfg, buf, sizeof buf);
    printf("\n%s", buf);
    if (st != AK_OK) {
        fprintf(stderr, "\nattnkit-info: %s: %s\n", ak_status_str(st), ak_last_error());
        return 1;
    }
    return 0;
}
