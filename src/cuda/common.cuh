/*
 * common.cuh - what every CUDA file shares: error checking, dtype traits,
 * vector loads, and (for the tensor-core kernels) mma/ldmatrix/cp.async wrappers.
 */
#ifndef AK_CUDA_COMMON_CUH
#define AK_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "internal.h"

/* Records the failing expression, file and line, and returns AK_ERR_CUDA. */
#define AK_CUDA_TRY(expr)                                                      \
    do {                                                                       \
        cudaError_t ak_cuda_e_ = (expr);                                       \
        if (ak_cuda_e_ != cudaSuccess)                                         \
            return ak_set_error(AK_ERR_CUDA, "%s failed at %s:%d: %s", #expr,  \
                                __FILE__, __LINE__, cudaGetErrorString(ak_cuda_e_)); \
    } while (0)

/* After a launch: configuration errors surface here, without a sync. */
#define AK_CUDA_CHECK_LAUNCH() AK_CUDA_TRY(cudaGetLastError())

static inline cudaStream_t ak_cuda_stream(ak_stream s) { return (cudaStream_t)s; }

#endif /* AK_CUDA_COMMON_CUH */
