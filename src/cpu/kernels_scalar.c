/*
 * kernels_scalar.c - the cpu backend's kernel in portable C (one float per
 * "vector"): the fallback where AVX2 + FMA + F16C are missing, and the
 * baseline that AK_CPU_ISA=scalar forces for testing.
 */
#include "simd.h"

#define AK_CPU_KERNELS_NAME ak_cpu_kernels_scalar
#define AK_CPU_ISA_NAME "scalar"
#include "attn_cpu_kernel.h"
