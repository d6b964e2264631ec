/*
 * kernels_avx512.c - the cpu backend's kernel for AVX-512F (16 floats per
 * vector, 32 registers). Built with -mavx512f -mavx2 -mfma -mf16c
 * (CMakeLists.txt); called only after the CPU reported AVX-512F (attn_cpu.c).
 */
#define AK_CPU_ISA_AVX512 1
#include "simd.h"

#define AK_CPU_KERNELS_NAME ak_cpu_kernels_avx512
#define AK_CPU_ISA_NAME "avx512"
#include "attn_cpu_kernel.h"
