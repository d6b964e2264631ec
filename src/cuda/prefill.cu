/*
 * prefill.cu - paged prefill / extend on tensor cores (in progress).
 */
#include "decode.cuh"
