/*
 * kernels_avx512_bf16.c - the cpu backend's AVX-512 kernel with AVX512-BF16
 * dot products (VDPBF16PS) for MLA decode with bf16 q and K (mla_run_tiles in
 * attn_cpu_kernel.h): the same body as kernels_avx512.c otherwise. For CPUs
 * with AVX512-BF16 but no AMX (AMD Zen 4 and later, Intel Cooper Lake), where
 * MLA decode at 16 heads (~30 FLOP a byte) needs more than f32 FMAs give.
 * Built with -mavx512f -mavx512bw -mavx512bf16 (CMakeLists.txt); chosen only
 * for bf16 q and K/V on a CPU that reports AVX512BW and AVX512_BF16
 * (attn_cpu.c).
 */
#define AK_CPU_ISA_AVX512 1
#define AK_CPU_BF16 1
#include "simd.h"

#define AK_CPU_KERNELS_NAME ak_cpu_kernels_avx512_bf16
#define AK_CPU_ISA_NAME "avx512+bf16"
#include "attn_cpu_kernel.h"
