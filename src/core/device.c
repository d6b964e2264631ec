/*
 * device.c - device discovery and memory, CPU side; CUDA calls go to
 * src/cuda/runtime.cu when the library is built with CUDA.
 */
#define _DEFAULT_SOURCE /* madvise and MADV_HUGEPAGE are outside strict C11 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#define HUGE_PAGE ((size_t)2 << 20)

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* What the CPU offers the cpu backend's kernels (the one place that asks):
 * AVX2 + FMA + F16C; AVX-512F; AVX512BW with AVX512_BF16 (CPUID leaf 7,
 * EBX bit 30; leaf 7.1, EAX bit 5); and with those AMX-TILE + AMX-BF16
 * (leaf 7, EDX bits 24 and 22), granted to this process by Linux, which
 * hands the AMX tile state out only on request (arch_prctl
 * ARCH_REQ_XCOMP_PERM). */
ak_cpu_features ak_cpu_features_get(void)
{
    ak_cpu_features f = {0, 0, 0, 0};
#if defined(__x86_64__) || defined(__i386__)
    /* F16C from CPUID (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports
     * does not know "f16c" */
    unsigned int a, b, c, d;
    const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    __builtin_cpu_init();
    f.avx2_fma_f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    f.avx512f = f.avx2_fma_f16c && __builtin_cpu_supports("avx512f");
    unsigned int d7 = 0;
    f.avx512_bf16 = f.avx512f && __get_cpuid_count(7, 0, &a, &b, &c, &d7) && (b & (1u << 30)) &&
                    __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
    if (f.avx512_bf16 && (d7 & (1u << 24)) && (d7 & (1u << 22))) {
#if defined(__linux__) && defined(SYS_arch_prctl)
        enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
        f.amx_bf16 = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
    }
#endif
    return f;
}

static void cpu_name(char *buf, size_t cap)
{
    snprintf(buf, cap, "cpu");
#if defined(__x86_64__) || defined(__i386__)
    unsigned int regs[12];
    unsigned int max_ext = __get_cpuid_max(0x80000000u, NULL);
    if (max_ext >= 0x80000004u) {
        for (unsigned int i = 0; i < 3; i++)
            __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2],
                        &regs[4 * i + 3]);
        char brand[49];
        memcpy(brand, regs, 48);
        brand[48] = '\0';
        const char *p = brand;
        while (*p == ' ') p++;
        snprintf(buf, cap, "%s", p);
    }
#endif
}

int ak_device_count(ak_device_kind kind)
{
    if (kind == AK_DEVICE_CPU) return 1;
#ifdef AK_HAVE_CUDA
    if (kind == AK_DEVICE_CUDA) return ak_cuda_device_count();
#endif
    return 0;
}

ak_status ak_device_get_info(ak_device dev, ak_device_info *info)
{
    if (!info) return ak_set_error(AK_ERR_INVALID_ARG, "info is NULL");
    memset(info, 0, sizeof *info);
    info->device = dev;
    if (dev.kind == AK_DEVICE_CPU) {
        if (dev.index != 0)
            return ak_set_error(AK_ERR_NO_DEVICE, "device.index = %d: there is one CPU device (0)",
                                dev.index);
        cpu_name(info->name, sizeof info->name);
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        info->num_sms = n > 0 ? (int)n : 1;
        info->cpu_has_avx2_fma_f16c = ak_cpu_features_get().avx2_fma_f16c;
        return AK_OK;
    }
    if (dev.kind == AK_DEVICE_CUDA) {
#ifdef AK_HAVE_CUDA
        return ak_cuda_get_info(dev.index, info);
#else
        return ak_set_error(AK_ERR_NO_DEVICE, "device.kind = cuda: attnkit was built without CUDA");
#endif
    }
    return ak_set_error(AK_ERR_INVALID_ARG, "device.kind = %d is not a device kind", dev.kind);
}

ak_status ak_dev_malloc(ak_device dev, size_t bytes, void **out)
{
    *out = NULL;
    if (dev.kind == AK_DEVICE_CPU) {
        /* 64-byte alignment: whole cache lines, and aligned SIMD rows. Large
         * buffers (KV pools) are 2 MiB aligned and asked to be backed by huge
         * pages: on a 2-core Sapphire Rapids VM a streaming read rose from ~25
         * to 33-37 GB/s and cpu decode by ~6% (fewer TLB misses). */
        const size_t align = bytes >= HUGE_PAGE ? HUGE_PAGE : 64;
        if (bytes > SIZE_MAX - align) /* (rounding up would wrap) */
            return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate %zu host bytes", bytes);
        const size_t rounded = (bytes + align - 1) / align * align;
        void *p = aligned_alloc(align, rounded ? rounded : align);
        if (!p) return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cannot allocate %zu host bytes", bytes);
#ifdef MADV_HUGEPAGE
        if (align == HUGE_PAGE) madvise(p, rounded, MADV_HUGEPAGE); /* advice only: failure is harmless */
#endif
        *out = p;
        return AK_OK;
    }
#ifdef AK_HAVE_CUDA
    if (dev.kind == AK_DEVICE_CUDA) return ak_cuda_malloc(dev.index, bytes, out);
#endif
    return ak_set_error(AK_ERR_NO_DEVICE, "device.kind = %d is not available in this build", dev.kind);
}

ak_status ak_dev_calloc(ak_device dev, size_t bytes, void **out)
{
    AK_TRY(ak_dev_malloc(dev, bytes, out));
    if (dev.kind == AK_DEVICE_CPU) {
        memset(*out, 0, bytes);
        return AK_OK;
    }
#ifdef AK_HAVE_CUDA
    const ak_status st = ak_cuda_zero(dev.index, *out, bytes);
    if (st != AK_OK) {
        ak_dev_free(dev, *out);
        *out = NULL;
    }
    return st;
#else
    return AK_OK; /* (unreachable: ak_dev_malloc refused the device) */
#endif
}

void ak_dev_free(ak_device dev, void *p)
{
    if (!p) return;
    if (dev.kind == AK_DEVICE_CPU) {
        free(p);
        return;
    }
#ifdef AK_HAVE_CUDA
    if (dev.kind == AK_DEVICE_CUDA) ak_cuda_free(dev.index, p);
#endif
}
