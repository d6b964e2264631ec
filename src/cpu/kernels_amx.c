/*
 * kernels_amx.c - the cpu backend's AVX-512 kernel with its bf16 prefill on
 * the AMX tile unit (Sapphire Rapids and later): the same body as
 * kernels_avx512.c plus the AMX section of attn_cpu_kernel.h (and the
 * AVX512-BF16 section of attn_cpu_kernel.h, as kernels_avx512_bf16.c). Built with
 * -mavx512f -mavx512bw -mavx512bf16 -mamx-tile -mamx-bf16 (CMakeLists.txt);
 * chosen only when the CPU has AMX-BF16 and AVX512_BF16 and the kernel
 * granted this process the tile state (attn_cpu.c).
 */
#define AK_CPU_ISA_AVX512 1
#define AK_CPU_BF16 1
#define AK_CPU_AMX 1
#include "simd.h"

#define AK_CPU_KERNELS_NAME ak_cpu_kernels_avx512_amx
#define AK_CPU_ISA_NAME "avx512+amx"
#include "attn_cpu_kernel.h"
