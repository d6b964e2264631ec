/*
 * kernels_avx2.c - the cpu backend's kernel for AVX2 + FMA + F16C (8 floats
 * per vector). Built with -mavx2 -mfma -mf16c (CMakeLists.txt); called only
 * after ak_cpu_features_get() said AVX2 + FMA + F16C.
 */
#define AK_CPU_ISA_AVX2 1
#include "simd.h"

#define AK_CPU_KERNELS_NAME ak_cpu_kernels_avx2
#define AK_CPU_ISA_NAME "avx2"
#include "attn_cpu_kernel.h"
