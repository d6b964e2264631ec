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
 * gives one to requests of SCAN_MIN_ROWS query rows or more, and to shorter
 * ones whose rows are worth their keys' read, engine.cu's SCAN_ROWS_KEYS;
 * where the pools carry finiteness marks, a bit a key, to the other shorter
 * ones too: SCAN_SHORT_MIN_FLOP). The
 * wgmma prefill's producer warpgroup scanning each tile it copied, in
 * shared memory, instead (no pass, no checked path) was 1.4-2.0x slower:
 * its reads at the producer's 40 registers, beside the tensor cores' reads
 * of the same memory (H200, BENCHMARKS.md). So was its reading this pass's
 * units from global memory between its tile copies, the items unchecked
 * first and the bad ones again at the kernel's end: 1.05-1.65x the time,
 * with ptxas spilling (980 bytes of loads a thread at d128, none before),
 * likely for the producer's 40 registers (H100, BENCHMARKS.md).
 *
 * A task is the K and V rows of keys [k0, k1) of one KV head; a warp reads
 * SCAN_UNROLL rows of lanes at a time, its lanes over the keys' 16-byte
 * chunks.
 */
#include "attn.cuh"

#define SCAN_THREADS 256
/* Blocks of the pass an SM holds (the launch bound caps the registers at
 * 64 a thread for it; the engine sizes the grid by the kernel's occupancy) */
#define SCAN_BLOCKS_PER_SM 4

/* Rows a lane reads at once: U loads in flight per lane, each of a 16-byte
 * chunk of a K or a V row (a loop of one key a warp at a time was bound by
 * latency, ~4 KB per microsecond per block, far below copy speed). */
#define SCAN_UNROLL 8

/* Beside the prefill (attn_params.scan_beside): blocks of this many groups
 * of SCAN_THREADS, one block an SM, so that the pass holds few SMs whole
 * (an SM read fastest with 1024 threads, 8 loads of 16 bytes in flight
 * each: bench/sm_read_rate.cu, BENCHMARKS.md) */
#define SCAN_BESIDE_GROUPS 4

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

/* Keys a row of a warp's 32 lanes covers, a key's K and V being per
 * 16-byte chunks: 32 / per where per is at most 32, else one (in passes). */
__host__ __device__ __forceinline__ int scan_row_keys(int per) { return per <= 32 ? 32 / per : 1; }

/* A block's warps a task at a time (up to the ring's four tasks apart, its
 * flag by their votes). A key's K and V
 * chunks (per of them) lie side by side across a warp's lanes: 32 / per
 * keys a row of lanes where per is at most 32 (two at head dim 64), else
 * passes of 32 chunks; a warp reads U such rows at once, a lane holding one
 * pointer a row (56 registers, of the 64 the launch bound allows for
 * SCAN_BLOCKS_PER_SM blocks an SM). A task of ak_cuda_scan_task_keys keys,
 * the fewest the engine makes, is read by a block at once (64 keys at head
 * dims 80-128 in 16 bits). Measured (H200, bf16, page 128, against the
 * kernel before it: a K and a V pointer a key in each lane, 81 registers, 2
 * blocks an SM, tasks of 256 keys or more): the pass 8.1-9.0 us against
 * 11.4-12.4 at qwen2.5-7b 1 x 4096 (a few tasks), slower where its reads
 * bind it (32/8 heads 16 x 1024 28.1-29.7 us against 25.3-27.1); the step
 * in engine.cu's note on SCAN_TASKS_PER_REQ (BENCHMARKS.md). Where its
 * reads bind it the pass reads K and V at 2.3-2.8 TB/s (32/8 heads 16 x
 * 1024, 64 x 512, 1 x 16384; the HND layout as fast as NHD at 16 x 1024),
 * 54-68% of the H200's copy speed. Prefetching each warp's next rows into
 * L2 while its loads are in flight (a prefetch a lane, or a bulk prefetch
 * a row) is slower: 37-40 us against 29-30 at 16 x 1024, 70-76 against
 * 47-48 at 64 x 512 (H200, BENCHMARKS.md) */
template <typename T, int GROUPS>
__global__ void __launch_bounds__(SCAN_THREADS *GROUPS, GROUPS == 1 ? SCAN_BLOCKS_PER_SM : 1) scan_kernel(const attn_params p)
{
    /* GROUPS > 1 (p.scan_beside): a block fills an SM, its GROUPS groups of
     * SCAN_THREADS each a block of the loop below (vb of vgrid) */
    const int kv_head = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x % SCAN_THREADS / 32;
    const int group = threadIdx.x / SCAN_THREADS, vb = blockIdx.x * GROUPS + group, vgrid = gridDim.x * GROUPS;
    constexpr int WARPS = SCAN_THREADS / 32, U = SCAN_UNROLL;
    const int n = scanned_tasks(p);
    const int32_t *table = p.head->kv_table;
    constexpr int EPC = 16 / sizeof(T); /* elements a 16-byte chunk */
    const int ck = p.head_dim_qk / EPC, cv = p.head_dim_vo / EPC; /* 16-byte chunks of a K and a V row */
    const int per = ck + cv, kl = scan_row_keys(per);
    const int rows = kl * U * WARPS;                        /* keys a block reads at once */
    /* A task's flag without a block barrier (a warp waited there for the
     * block's slowest): the warps' votes meet in one of RING slots (task k
     * of the block in slot k % RING: an OR, a count of the warps done and
     * the generation of its tasks); the last warp of a task writes its flag
     * and frees the slot, a warp up to RING tasks ahead of it waits for that.
     * Measured (H200, the step with the pass and prefill launched as
     * programmatic dependents, against both before; in brackets the launches
     * alone, another run): 16 x 1024 0.977 (0.993), 64 x 512 0.992 (0.994),
     * qwen2.5-7b 1 x 4096 0.971 (0.983), llama3-8b 0.974 (0.992),
     * BENCHMARKS.md */
    constexpr int RING = 4;
    __shared__ uint32_t s_ring[GROUPS][3][RING];
    uint32_t *s_bad = s_ring[group][0], *s_cnt = s_ring[group][1], *s_gen = s_ring[group][2];
    if (threadIdx.x < GROUPS * 3 * RING) (&s_ring[0][0][0])[threadIdx.x] = 0;
    __syncthreads();
#if __CUDA_ARCH__ >= 900
    /* a programmatic dependent of the kernel before it (engine.cu): K/V
     * (that kernel may write them) and the flags (it may read them) only
     * once it is done */
    asm volatile("griddepcontrol.wait;" ::: "memory");
    /* beside the clean prefill pass, which reads no flag: it starts now */
    if (p.scan_beside) asm volatile("griddepcontrol.launch_dependents;");
#endif
    for (int w = vb; w < n; w += vgrid) {
        const scan_task t = p.scans[w];
        uint32_t bad = 0;
        for (int key0 = t.k0 + warp * kl * U; key0 < t.k1; key0 += rows) {
            for (int c0 = 0; c0 < per; c0 += 32) {
                /* this lane's chunk c of key key0 + u kl + lane / per (per <= 32), or of key0 + u */
                const int c = per <= 32 ? lane % per : c0 + lane, sub = per <= 32 ? lane / per : 0;
                const bool on = per <= 32 ? lane < kl * per : c < per;
                const uint4 *src[U];
#pragma unroll
                for (int u = 0; u < U; u++) {
                    int slot;
                    const int key = min(key0 + u * kl + sub, t.k1 - 1); /* rows past the end: the last one again */
                    const int64_t block = kv_block_of(p, table, t.page_base, key, slot);
                    src[u] = c < ck ? (const uint4 *)((const T *)p.k_pool + block * p.k_block_stride +
                                                      slot * p.k_stride_slot + kv_head * p.k_stride_head) + c
                                    : (const uint4 *)((const T *)p.v_pool + block * p.v_block_stride +
                                                      slot * p.v_stride_slot + kv_head * p.v_stride_head) + (c - ck);
                }
                uint4 x[U];
#pragma unroll
                for (int u = 0; u < U; u++) x[u] = on ? __ldg(src[u]) : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int u = 0; u < U; u++) bad |= nonfinite_chunk<T>(x[u]);
            }
        }
        const int k = (w - vb) / vgrid, slot = k % RING;
        const bool wbad = __any_sync(0xffffffffu, bad != 0);
        if (lane == 0) {
            while (atomicAdd(&s_gen[slot], 0) != k / RING) { /* the slot's task RING before, done */
            }
            /* (each fence orders the atomics before it, as seen by the
             * other warps, before those after it: the slot's reset before
             * this warp's vote, a vote before its count, the other warps'
             * votes before the last one's read of them, the reset before the
             * next generation) */
            __threadfence_block();
            if (wbad) atomicOr(&s_bad[slot], 1u);
            __threadfence_block();
            if (atomicAdd(&s_cnt[slot], 1) == WARPS - 1) {
                __threadfence_block();
                p.scan_flags[(int64_t)w * p.num_kv_heads + kv_head] = (int32_t)atomicExch(&s_bad[slot], 0u);
                s_cnt[slot] = 0;
                __threadfence_block();
                atomicAdd(&s_gen[slot], 1);
            }
        }
        __syncwarp();
    }
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/* The pass where the pools carry finiteness marks (attnkit.h's
 * ak_paged_kv.marks, kept by ak_kv_update): the same tasks and flags, from
 * a bit a key instead of its K and V rows (1 bit against 512 bytes at d128
 * in 16 bits). A warp a task, its lanes a key each at a time (a block a
 * task, four tasks in turn, took 7.8 us at 32/8 heads 16 x 1024: the block
 * id and mark loads of each task waited in series). */
__global__ void __launch_bounds__(SCAN_THREADS) scan_marks_kernel(const attn_params p)
{
    const int kv_head = blockIdx.y, lane = threadIdx.x % 32;
    constexpr int WARPS = SCAN_THREADS / 32;
    const int n = scanned_tasks(p);
    const int32_t *table = p.head->kv_table;
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory"); /* (as scan_kernel: the marks may be the kernel before's) */
#endif
    for (int w = blockIdx.x * WARPS + (int)threadIdx.x / 32; w < n; w += gridDim.x * WARPS) {
        const scan_task t = p.scans[w];
        uint32_t bad = 0;
        for (int key = t.k0 + lane; key < t.k1; key += 32) {
            int slot;
            const int64_t block = kv_block_of(p, table, t.page_base, key, slot);
            bad |= p.kv_marks[ak_kv_mark_word(block, p.num_kv_heads, kv_head, p.page_size, slot)] >> (slot % 32);
        }
        bad = __any_sync(0xffffffffu, bad & 1u);
        if (lane == 0) p.scan_flags[(int64_t)w * p.num_kv_heads + kv_head] = bad != 0;
    }
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

attn_kernel ak_cuda_scan_marks_kernel(void)
{
    const attn_kernel k = {scan_marks_kernel, SCAN_THREADS, 0, 0};
    return k;
}

int ak_cuda_scan_task_keys(int dqk, int dvo, ak_dtype kv_dtype)
{
    const int epc = kv_dtype == AK_FP8_E4M3 ? 16 : 8; /* (elements a 16-byte chunk) */
    const int per = dqk / epc + dvo / epc;
    return (SCAN_THREADS / 32) * SCAN_UNROLL * scan_row_keys(per);
}

attn_kernel ak_cuda_scan_kernel(ak_dtype kv_dtype)
{
    const attn_kernel k = {kv_dtype == AK_FP8_E4M3 ? scan_kernel<uint8_t, 1>
                           : kv_dtype == AK_F16    ? scan_kernel<__half, 1>
                                                   : scan_kernel<__nv_bfloat16, 1>,
                           SCAN_THREADS, 0, 0};
    return k;
}

attn_kernel ak_cuda_scan_beside_kernel(ak_dtype kv_dtype)
{
    constexpr int G = SCAN_BESIDE_GROUPS;
    const attn_kernel k = {kv_dtype == AK_FP8_E4M3 ? scan_kernel<uint8_t, G>
                           : kv_dtype == AK_F16    ? scan_kernel<__half, G>
                                                   : scan_kernel<__nv_bfloat16, G>,
                           SCAN_THREADS * G, 0, 0};
    return k;
}
