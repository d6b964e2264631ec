/*
 * runtime.cu - the CUDA side of device discovery and memory.
 */
#include "../common.cuh"

#include <stdio.h>
#include <string.h>

extern "C" int ak_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no GPU: clear the sticky error */
        return 0;
    }
    return n;
}

extern "C" ak_status ak_cuda_get_info(int index, ak_device_info *info)
{
    const int n = ak_cuda_device_count();
    if (index < 0 || index >= n)
        return ak_set_error(AK_ERR_NO_DEVICE, "device.index = %d: %d CUDA device(s) found", index, n);
    cudaDeviceProp p;
    AK_CUDA_TRY(cudaGetDeviceProperties(&p, index));
    snprintf(info->name, sizeof info->name, "%.127s", p.name);
    info->num_sms = p.multiProcessorCount;
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->memory_bytes = p.totalGlobalMem;
    info->l2_bytes = (size_t)p.l2CacheSize;
    info->max_smem_per_block = (int)p.sharedMemPerBlockOptin;
    return AK_OK;
}

extern "C" ak_status ak_cuda_malloc(int index, size_t bytes, void **out)
{
    int prev = 0;
    AK_CUDA_TRY(cudaGetDevice(&prev));
    AK_CUDA_TRY(cudaSetDevice(index));
    const cudaError_t e = cudaMalloc(out, bytes ? bytes : 16);
    cudaSetDevice(prev);
    if (e != cudaSuccess) {
        *out = NULL;
        cudaGetLastError();
        return ak_set_error(AK_ERR_OUT_OF_MEMORY, "cudaMalloc(%zu) on device %d: %s", bytes, index,
                            cudaGetErrorString(e));
    }
    return AK_OK;
}

extern "C" ak_status ak_cuda_zero(int index, void *p, size_t bytes)
{
    int prev = 0;
    AK_CUDA_TRY(cudaGetDevice(&prev));
    AK_CUDA_TRY(cudaSetDevice(index));
    /* (on this thread's own stream, waited for: no wait on the device's
     * other streams, which may be capturing) */
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, cudaStreamPerThread);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamPerThread);
    cudaSetDevice(prev);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ak_set_error(AK_ERR_CUDA, "cudaMemset(%zu bytes) on device %d: %s", bytes, index, cudaGetErrorString(e));
    }
    return AK_OK;
}

extern "C" void ak_cuda_free(int index, void *p)
{
    (void)index;
    cudaFree(p);
}
