/*
 * scan.cu - the scan pass of the NaN rule (attnkit.h, attn.cuh): before the
 * prefill kernel, one pass over the K/V rows of every key a long prefill
 * request may see finds whether any element is NaN or infinite, one flag per
 * scan task and KV head. The prefill kernel runs the items of a clean request
 * unchecked (no per-logit check, no V scan in masked tiles; q it checks
 * itself, once per item) and the others checked.
 *
 * Why a pass: the per-logit check costs one FFMA a logit, measured at about
 * 9% of the wgmma prefill at d128, and every row tile of a request would
 * repeat a scan of the same K/V; the pass reads each input once, a few
 * percent of the reads of a prefill long enough to be given one (the engine
 * gives one only to requests of SCAN_MIN_ROWS query rows or more).
 *
 * A task is the K and V rows of keys [k0, k1) of one KV head; a warp reads
 * SCAN_UNROLL keys at a time, its lanes over their 16-byte chunks.
 */
#include "attn.cuh"

#define SCAN_THREADS 256

/* Keys a warp reads at once, and 16-byte chunks a lane reads of each: U
 * loads in flight per lane (a loop of one key a warp at a time was bound by
 * latency, ~4 KB per microsecond per block, far below copy speed). */
#define SCAN_UNROLL 8
#define SCAN_LANE_CHUNKS 1

/* Whether an element of a 16-byte chunk of T is NaN or infinite (fp8
 * e4m3, uint8_t: NaN; it has no infinity). */
template <typename T> __device__ __forceinline__ uint32_t nonfinite_chunk(const uint4 x)
{
    return nonfinite_pair<T>(x.x) | nonfinite_pair<T>(x.y) | nonfinite_pair<T>(x.z) | nonfinite_pair<T>(x.w);
}
template <> __device__ __forceinline__ uint32_t nonfinite_chunk<uint8_t>(const uint4 x)
{
    return nonfinite_fp8x4(x.x) | nonfinite_fp8x4(x.y) | nonfinite_fp8x4(x.z) | nonfinite_fp8x4(x.w);
}

template <typename T> __global__ void __launch_bounds__(SCAN_THREADS, 2) scan_kernel(const attn_params p)
{
    const int kv_head = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    constexpr int WARPS = SCAN_THREADS / 32, U = SCAN_UNROLL, C = SCAN_LANE_CHUNKS;
    const int n = p.head->counts[COUNT_SCAN];
    const int32_t *table = p.head->kv_table;
    constexpr int EPC = 16 / sizeof(T); /* elements a 16-byte chunk */
    const int ck = p.head_dim_qk / EPC, cv = p.head_dim_vo / EPC; /* 16-byte chunks of a K and a V row */
    for (int w = blockIdx.x; w < n; w += gridDim.x) {
        const scan_task t = p.scans[w];
        uint32_t bad = 0;
        for (int key0 = t.k0 + warp * U; key0 < t.k1; key0 += WARPS * U) {
            const uint4 *k[U], *v[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int slot;
                const int key = min(key0 + u, t.k1 - 1); /* rows past the end: the last one again */
                const int64_t block = kv_block_of(p, table, t.page_base, key, slot);
                k[u] = (const uint4 *)((const T *)p.k_pool + block * p.k_block_stride + slot * p.k_stride_slot +
                                       kv_head * p.k_stride_head);
                v[u] = (const uint4 *)((const T *)p.v_pool + block * p.v_block_stride + slot * p.v_stride_slot +
                                       kv_head * p.v_stride_head);
            }
            for (int c0 = 0; c0 < ck + cv; c0 += 32 * C) {
                uint4 x[U][C];
#pragma unroll
                for (int u = 0; u < U; u++)
#pragma unroll
                    for (int j = 0; j < C; j++) {
                        const int c = c0 + j * 32 + lane;
                        x[u][j] = c < ck        ? __ldg(k[u] + c)
                                  : c < ck + cv ? __ldg(v[u] + (c - ck))
                                                : make_uint4(0, 0, 0, 0);
                    }
#pragma unroll
                for (int u = 0; u < U; u++)
#pragma unroll
                    for (int j = 0; j < C; j++)
                        bad |= nonfinite_chunk<T>(x[u][j]);
            }
        }
        bad = __syncthreads_or(bad != 0);
        if (threadIdx.x == 0) p.scan_flags[(int64_t)w * p.num_kv_heads + kv_head] = bad;
    }
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

attn_kernel ak_cuda_scan_kernel(ak_dtype kv_dtype)
{
    const attn_kernel k = {kv_dtype == AK_FP8_E4M3 ? scan_kernel<uint8_t>
                           : kv_dtype == AK_F16    ? scan_kernel<__half>
                                                   : scan_kernel<__nv_bfloat16>,
                           SCAN_THREADS, 0, 0};
    return k;
}
