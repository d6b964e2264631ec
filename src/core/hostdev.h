/*
 * hostdev.h - AK_HD marks a small function that the C host code and the CUDA
 * kernels share: static inline in C, __host__ __device__ under nvcc.
 */
#ifndef AK_HOSTDEV_H
#define AK_HOSTDEV_H

#if defined(__CUDACC__)
#define AK_HD __host__ __device__ __forceinline__
#else
#define AK_HD static inline
#endif

#endif /* AK_HOSTDEV_H */
