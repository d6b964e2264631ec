#!/usr/bin/env python3
"""
peers.py - attnkit's cuda_paged beside its peers, on the same KV contents and
queries: FlashInfer's BatchDecode / BatchPrefill wrappers on the paged cache
and its ragged prefill wrapper on contiguous K/V (if importable), PyTorch SDPA
with the flash, cuDNN and memory-efficient backends on a dense copy of the
cache, FlexAttention (if present), torch's varlen_attn and attnkit's own
cuda_varlen on contiguous K/V. Outputs are checked against attnkit's; times
are CUDA-event medians; decode is timed as CUDA-graph replays where a side can
be captured. Prints peer time / attnkit (cuda_paged) time per shape (above 1:
attnkit is faster) and writes every measurement to a CSV.

    make build                                 # or: cmake --build build --target attnkit_shared
    python3 bench/peers.py                     # every default shape (see --help)
    python3 bench/peers.py --models llama3-8b --workloads decode --batches 1,64 --kv-lens 4096
    python3 bench/peers.py --workloads mixed --mixed-chunk 1024 --mixed-decodes 127
    python3 bench/peers.py --quick             # a few shapes of each kind
    python3 bench/peers.py --device cpu --quick   # plumbing check on a machine without a GPU

Workloads: decode (every request q_len 1 on the same kv_len, so the dense copy
for SDPA / Flex is an exact [batch, kv_heads, kv_len, head_dim] tensor),
prefill (causal, q_len = kv_len, no prefix) and mixed (one step of an engine
with chunked prefill: a prompt chunk on a cached prefix plus decodes, in one
paged cache and one call where a side can take the whole batch).

Method (the same for every side): inputs are random bf16 in [-1, 1); block
ids are shuffled; the dense and contiguous (ragged) copies hold the cache's
values. Each shape holds as many layers of K/V (and q, o) as make 4x the L2
(at most 32); one sample is a pass over all layers divided by the layer
count, so no side reads its K/V from L2 when a real step would not. Warm-up
passes, then --iters samples; the median is reported.
"""
import argparse
import csv
import inspect
import math
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# num_qo_heads, num_kv_heads, head_dim (as attnkit-bench's --model)
MODELS = {
    "llama3-8b": (32, 8, 128),
    "qwen2.5-7b": (28, 4, 128),
    "llama3-70b-tp8": (8, 1, 128),
    "phi3-mini": (32, 32, 96),
    "gemma2-9b": (16, 8, 256),
}
PEERS = ("attnkit", "attnkit_varlen", "flashinfer", "flashinfer_tc", "flashinfer_ragged",
         "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex", "torch_varlen")
# the sides that read contiguous K/V [sum kv_len, kv_heads, head_dim] instead of the cache
RAGGED_PEERS = ("attnkit_varlen", "flashinfer_ragged", "torch_varlen")
WORKLOADS = ("decode", "prefill", "mixed")
TOLERANCE = {"bf16": 2e-2, "f16": 4e-3}  # the test harness's, relative to max |o|
MAX_LAYERS = 32

# Shape options left unset take these, by device and --quick. On the CPU
# (attnkit's cpu backend against SDPA math) the shapes are small: that run
# checks the script's plumbing, it measures nothing.
SHAPE_DEFAULTS = {
    ("cuda", False): dict(batches="1,16,64,256", kv_lens="1024,2048,4096,8192,16384,32768",
                          prefill_lens="1024,2048,4096,8192,16384", ragged_prefill_lens="",
                          mixed_chunk=2048, mixed_prefix=4096, mixed_decodes=63, mixed_decode_kv=4096),
    ("cuda", True): dict(batches="1,64", kv_lens="1024,8192,32768", prefill_lens="1024,4096",
                         ragged_prefill_lens="largest",
                         mixed_chunk=2048, mixed_prefix=4096, mixed_decodes=63, mixed_decode_kv=4096),
    ("cpu", False): dict(batches="1,4", kv_lens="256,1024", prefill_lens="128,512", ragged_prefill_lens="",
                         mixed_chunk=64, mixed_prefix=192, mixed_decodes=3, mixed_decode_kv=256),
    ("cpu", True): dict(batches="1,4", kv_lens="256", prefill_lens="128", ragged_prefill_lens="",
                        mixed_chunk=32, mixed_prefix=96, mixed_decodes=3, mixed_decode_kv=128),
}


class Skip(Exception):
    """A side that cannot run a shape; the message says why."""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    gpu, quick, cpu = SHAPE_DEFAULTS[("cuda", False)], SHAPE_DEFAULTS[("cuda", True)], \
        SHAPE_DEFAULTS[("cpu", False)]
    p.add_argument("--models", default="llama3-8b,qwen2.5-7b",
                   help=f"comma list of {', '.join(MODELS)}, or HQ/HK/D (heads and head dim, e.g. 32/8/80)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list of " + ", ".join(WORKLOADS))
    p.add_argument("--batches", help=f"decode batch sizes (default {gpu['batches']})")
    p.add_argument("--kv-lens", help=f"decode kv_len, every request the same (default {gpu['kv_lens']})")
    p.add_argument("--prefill-lens", help=f"prefill q_len = kv_len, causal (default {gpu['prefill_lens']})")
    p.add_argument("--prefill-batch", type=int, default=1)
    p.add_argument("--ragged-prefill-lens",
                   help="prefill lengths at which the contiguous-K/V sides (" + ", ".join(RAGGED_PEERS)
                   + ") run (default: every --prefill-lens; --quick: the largest)")
    p.add_argument("--mixed-chunk", type=int,
                   help=f"mixed: query tokens of the prompt chunk (default {gpu['mixed_chunk']})")
    p.add_argument("--mixed-prefix", type=int,
                   help=f"mixed: cached prefix under the chunk; its kv_len is prefix + chunk "
                   f"(default {gpu['mixed_prefix']})")
    p.add_argument("--mixed-decodes", type=int,
                   help=f"mixed: decode requests beside the chunk (default {gpu['mixed_decodes']})")
    p.add_argument("--mixed-decode-kv", type=int,
                   help=f"mixed: kv_len of each decode (default {gpu['mixed_decode_kv']})")
    p.add_argument("--peers", default=",".join(PEERS), help="comma list of " + ", ".join(PEERS))
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    p.add_argument("--graph", default="on", choices=("on", "off"),
                   help="time decode as CUDA-graph replays where a side can be captured")
    p.add_argument("--iters", type=int, default=20, help="timed samples per side and shape")
    p.add_argument("--warmup", type=int, default=3, help="untimed passes first")
    p.add_argument("--mem-fraction", type=float, default=0.85,
                   help="use at most this fraction of the free GPU memory for a shape")
    p.add_argument("--csv", default="peers.csv", help="where every measurement goes")
    p.add_argument("--lib", default=None, help="libattnkit.so (default: ATTNKIT_LIB or build/)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: attnkit's cpu backend and SDPA math on small shapes (default "
                   f"batches {cpu['batches']}, kv_lens {cpu['kv_lens']}, prefill {cpu['prefill_lens']}), "
                   "to check this script")
    p.add_argument("--quick", action="store_true",
                   help=f"batches {quick['batches']} x kv_len {quick['kv_lens']}; prefill "
                   f"{quick['prefill_lens']} (the contiguous-K/V sides at the largest); "
                   "one mixed step")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    for k, v in SHAPE_DEFAULTS[(a.device, a.quick)].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    a.models = [m for m in a.models.split(",") if m]
    for m in a.models:
        if m not in MODELS:  # or HQ/HK/D: any heads and head dim (e.g. 32/8/80)
            try:
                hq, hk, d = (int(x) for x in m.split("/"))
                assert hq > 0 and hk > 0 and hq % hk == 0 and d > 0
            except (ValueError, AssertionError):
                p.error(f"unknown model {m!r}; one of {', '.join(MODELS)}, or HQ/HK/D (e.g. 32/8/80)")
            MODELS[m] = (hq, hk, d)
    a.workloads = [w for w in a.workloads.split(",") if w]
    for w in a.workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}; one of {', '.join(WORKLOADS)}")
    a.batches, a.kv_lens, a.prefill_lens = ints(a.batches), ints(a.kv_lens), ints(a.prefill_lens)
    if a.ragged_prefill_lens == "largest":
        a.ragged_prefill_lens = [max(a.prefill_lens)] if a.prefill_lens else []
    else:
        a.ragged_prefill_lens = ints(a.ragged_prefill_lens) or a.prefill_lens
    if min(a.mixed_chunk, a.mixed_decode_kv) < 1 or min(a.mixed_prefix, a.mixed_decodes) < 0:
        p.error("--mixed-chunk and --mixed-decode-kv must be >= 1, --mixed-prefix and "
                "--mixed-decodes >= 0")
    a.peers = [x for x in a.peers.split(",") if x]
    for x in a.peers:
        if x not in PEERS:
            p.error(f"unknown peer {x!r}; one of {', '.join(PEERS)}")
    return a


# ---------------------------------------------------------------------------
# Imports that may be missing
# ---------------------------------------------------------------------------

def import_torch():
    try:
        import torch
        return torch
    except Exception as e:
        print(f"peers.py needs torch: {e}", file=sys.stderr)
        sys.exit(2)


def import_attnkit(lib):
    if lib:
        os.environ["ATTNKIT_LIB"] = lib
    sys.path.insert(0, os.path.join(REPO, "python"))
    try:
        import attnkit
        return attnkit, None
    except ImportError as e:
        return None, str(e)


def import_flashinfer():
    try:
        import flashinfer
        return flashinfer, None
    except Exception as e:
        return None, f"flashinfer not importable: {type(e).__name__}: {e}"


# ---------------------------------------------------------------------------
# A shape's data: one paged cache per layer, shared by every side
# ---------------------------------------------------------------------------

class Scene:
    """The requests of one shape, reqs = [(q_len, kv_len)] in batch order, over
    one paged cache per layer; dense and contiguous copies made on demand."""

    def __init__(self, torch, args, model, workload, reqs):
        self.torch, self.args = torch, args
        self.model, self.workload, self.reqs = model, workload, reqs
        self.batch = len(reqs)
        self.q_len, self.kv_len = reqs[0]  # the first request's, for the table (the chunk in mixed)
        self.Hq, self.Hk, self.D = MODELS[model]
        self.P = args.page_size
        self.dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
        self.dev = torch.device(args.device)
        self.tokens = sum(q for q, _ in reqs)
        self.kv_tokens = sum(kv for _, kv in reqs)
        self.pages_per_req = [-(-kv // self.P) for _, kv in reqs]
        self.pages = max(self.pages_per_req)
        self.num_blocks = sum(self.pages_per_req)
        # runs of requests of one (q_len, kv_len): (first request, count, q_len, kv_len); a dense
        # copy is one [count, heads, len, head_dim] tensor per run (one SDPA / Flex call each)
        self.groups = []
        for r, (q, kv) in enumerate(reqs):
            if self.groups and self.groups[-1][2:] == (q, kv):
                first, count = self.groups[-1][:2]
                self.groups[-1] = (first, count + 1, q, kv)
            else:
                self.groups.append((r, 1, q, kv))
        self.esize = 2
        self.kv_layer_bytes = 2 * self.num_blocks * self.P * self.Hk * self.D * self.esize
        self.dense_layer_bytes = 2 * self.kv_tokens * self.Hk * self.D * self.esize  # ragged alike
        if self.dev.type == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(self.dev), "L2_cache_size", 50 << 20)
            self.layers = max(1, min(MAX_LAYERS, math.ceil(4 * l2 / self.kv_layer_bytes)))
        else:
            self.layers = 1
        self.dense = None
        self.ragged = None

    def label(self):
        return f"{self.model} {self.workload} batch {self.batch} q_len {self.q_len} kv_len {self.kv_len}"

    def requests(self):
        """The batch as q_len/kv_len x count runs, for the CSV: '2048/6144x1+1/4096x63'."""
        return "+".join(f"{q}/{kv}x{count}" for _, count, q, kv in self.groups)

    def free_bytes(self):
        if self.dev.type != "cuda":
            return 1 << 62
        free, _ = self.torch.cuda.mem_get_info(self.dev)
        return int(free * self.args.mem_fraction)

    def build(self):
        torch = self.torch
        need = self.layers * (self.kv_layer_bytes + 2 * self.tokens * self.Hq * self.D * self.esize)
        if need > self.free_bytes():
            raise Skip(f"the paged cache needs {need / 2**30:.1f} GiB, "
                       f"{self.free_bytes() / 2**30:.1f} GiB are free")
        g = torch.Generator().manual_seed(self.args.seed)
        perm = torch.randperm(self.num_blocks, generator=g).to(torch.int32)
        # request r owns blocks perm[kv_indptr[r] .. kv_indptr[r + 1] - 1], in order
        page_indptr = [0]
        for n in self.pages_per_req:
            page_indptr.append(page_indptr[-1] + n)
        self.block_table = torch.zeros(self.batch, self.pages, dtype=torch.int32)  # [batch, pages], host
        slots = []  # cache row (block * P + offset) of every key, request by request
        in_page = torch.arange(self.P, dtype=torch.int64)
        for r, (_, kv) in enumerate(self.reqs):
            row = perm[page_indptr[r]:page_indptr[r + 1]]
            self.block_table[r, :row.numel()] = row
            slots.append((row.long()[:, None] * self.P + in_page).reshape(-1)[:kv])
        q_acc, kv_acc = [0], [0]
        for q, kv in self.reqs:
            q_acc.append(q_acc[-1] + q)
            kv_acc.append(kv_acc[-1] + kv)
        self.qo_indptr = torch.tensor(q_acc, dtype=torch.int32)                 # [batch + 1], host
        self.kv_lens = torch.tensor([kv for _, kv in self.reqs], dtype=torch.int32)  # [batch], host
        self.kv_token_indptr = torch.tensor(kv_acc, dtype=torch.int32)          # [batch + 1], host
        self.kv_slots = torch.cat(slots).to(self.dev)                           # [sum kv_len]
        # the CSR form FlashInfer takes, on the device
        self.kv_indptr = torch.tensor(page_indptr, dtype=torch.int32).to(self.dev)
        self.kv_indices = perm.to(self.dev)
        self.last_page_len = torch.tensor([kv - (n - 1) * self.P for (_, kv), n in
                                           zip(self.reqs, self.pages_per_req)],
                                          dtype=torch.int32, device=self.dev)
        self.qo_indptr_dev = self.qo_indptr.to(self.dev)
        self.kv_token_indptr_dev = self.kv_token_indptr.to(self.dev)
        shape = (self.num_blocks, self.P, self.Hk, self.D)
        torch.manual_seed(self.args.seed)

        def rand(*s):
            return torch.empty(*s, dtype=self.dtype, device=self.dev).uniform_(-1, 1)

        self.k = [rand(*shape) for _ in range(self.layers)]
        self.v = [rand(*shape) for _ in range(self.layers)]
        self.q = [rand(self.tokens, self.Hq, self.D) for _ in range(self.layers)]

    def _room_for_copies(self, what):
        if self.layers * self.dense_layer_bytes > self.free_bytes():
            raise Skip(f"{what} needs {self.layers * self.dense_layer_bytes / 2**30:.1f} GiB, "
                       f"{self.free_bytes() / 2**30:.1f} GiB are free")

    def ragged_copy(self):
        """K and V [sum kv_len, Hk, D] per layer, request r's keys at rows
        kv_token_indptr[r] ..: the cache's values, contiguous (built once)."""
        if self.ragged is None:
            self._room_for_copies("a contiguous K/V copy")
            rows = lambda cache: cache.view(-1, self.Hk, self.D).index_select(0, self.kv_slots)  # noqa: E731
            self.ragged = ([rows(k) for k in self.k], [rows(v) for v in self.v])
        return self.ragged

    def dense_copy(self):
        """Per layer, per run of equal requests (self.groups): q [count, Hq,
        q_len, D] and K/V [count, Hk, kv_len, D], the same values as the paged
        cache (built once, for SDPA and Flex)."""
        if self.dense is not None:
            return self.dense
        self._room_for_copies("a dense copy")
        kv_ptr, q_ptr = self.kv_token_indptr.tolist(), self.qo_indptr.tolist()
        dense = []
        for layer in range(self.layers):
            runs = []
            for first, count, q_len, kv_len in self.groups:
                slots = self.kv_slots[kv_ptr[first]:kv_ptr[first + count]]

                def kv(cache):  # [num_blocks, P, Hk, D] -> [count, Hk, kv_len, D]
                    rows = cache.view(-1, self.Hk, self.D).index_select(0, slots)
                    return rows.view(count, kv_len, self.Hk, self.D).permute(0, 2, 1, 3).contiguous()

                q = self.q[layer][q_ptr[first]:q_ptr[first + count]]
                qd = q.view(count, q_len, self.Hq, self.D).transpose(1, 2).contiguous()
                runs.append((qd, kv(self.k[layer]), kv(self.v[layer])))
            dense.append(runs)
        self.dense = dense
        return self.dense

    def bytes_per_call(self):
        kv = 2 * self.kv_tokens * self.Hk * self.D * self.esize
        return kv + 2 * self.tokens * self.Hq * self.D * self.esize

    def flop_per_call(self):
        # causal, aligned to the end of the KV: token i of q_len sees kv_len - q_len + i + 1 keys
        keys = sum(q * kv - q * (q - 1) // 2 for q, kv in self.reqs)
        return 4 * self.Hq * self.D * keys


# ---------------------------------------------------------------------------
# The sides. Each returns (steps, output): steps[l]() runs layer l; output()
# is layer 0's result as [tokens, Hq, D] after an eager call.
# ---------------------------------------------------------------------------

class StepList(list):
    """steps, plus whatever must outlive them (a backend, a wrapper), and an
    optional note for the report."""

    def __init__(self, steps, keep, note=None):
        super().__init__(steps)
        self.keep = keep
        self.note = note


def attnkit_device(sc):
    return "cpu" if sc.dev.type == "cpu" else f"cuda:{sc.dev.index or 0}"


def setup_attnkit(sc, attnkit):
    if attnkit is None:
        raise Skip("attnkit not importable")
    torch = sc.torch
    name = "cuda_paged" if sc.dev.type == "cuda" else "cpu"
    cfg = attnkit.Config(num_qo_heads=sc.Hq, num_kv_heads=sc.Hk, head_dim=sc.D,
                         dtype=sc.args.dtype, device=attnkit_device(sc), page_size=sc.P, causal=True,
                         workload="decode" if sc.workload == "decode" else "any")
    lim = attnkit.Limits(max_reqs=sc.batch, max_tokens=sc.tokens, max_blocks_per_req=sc.pages,
                         num_cache_blocks=sc.num_blocks)
    try:
        b = attnkit.Backend(cfg, lim, name=name)
        b.plan(sc.qo_indptr, sc.kv_lens, sc.block_table)
    except attnkit.Error as e:
        raise Skip(f"{name}: {e}") from None
    o = [torch.empty(sc.tokens, sc.Hq, sc.D, dtype=sc.dtype, device=sc.dev) for _ in range(sc.layers)]
    calls = [b.prepare_run(sc.q[l], sc.k[l], sc.v[l], o[l]) for l in range(sc.layers)]
    steps = StepList([(lambda c=c: c()) for c in calls], b)  # b lives as long as its steps
    return steps, lambda: (steps[0](), o[0])[1]


def setup_attnkit_varlen(sc, attnkit):
    """attnkit's cuda_varlen (the cpu backend on --device cpu) on the
    contiguous K/V: kv_storage ragged, no block table."""
    if attnkit is None:
        raise Skip("attnkit not importable")
    torch = sc.torch
    name = "cuda_varlen" if sc.dev.type == "cuda" else "cpu"
    if name not in attnkit.backends():
        raise Skip(f"the library has no {name} backend (built without CUDA?)")
    cfg = attnkit.Config(num_qo_heads=sc.Hq, num_kv_heads=sc.Hk, head_dim=sc.D, dtype=sc.args.dtype,
                         device=attnkit_device(sc), causal=True, kv_storage="ragged", workload="any")
    lim = attnkit.Limits(max_reqs=sc.batch, max_tokens=sc.tokens)
    try:
        b = attnkit.Backend(cfg, lim, name=name)
        b.plan(sc.qo_indptr, sc.kv_lens)
    except attnkit.Error as e:
        raise Skip(f"{name}: {e}") from None
    kr, vr = sc.ragged_copy()
    o = [torch.empty(sc.tokens, sc.Hq, sc.D, dtype=sc.dtype, device=sc.dev) for _ in range(sc.layers)]
    calls = [b.prepare_run(sc.q[l], kr[l], vr[l], o[l]) for l in range(sc.layers)]
    steps = StepList([(lambda c=c: c()) for c in calls], b)
    return steps, lambda: (steps[0](), o[0])[1]


def setup_flashinfer(sc, fi, tensor_cores, graph):
    if sc.dev.type != "cuda":
        raise Skip("CUDA only")
    torch = sc.torch
    if sc.workload != "decode" and tensor_cores:
        raise Skip("decode only (the prefill wrapper is the flashinfer column)")
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device=sc.dev)
    o = [torch.empty(sc.tokens, sc.Hq, sc.D, dtype=sc.dtype, device=sc.dev) for _ in range(sc.layers)]
    if sc.workload == "decode":
        if graph:
            w = fi.BatchDecodeWithPagedKVCacheWrapper(
                ws, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
                paged_kv_indptr_buffer=sc.kv_indptr.clone(),
                paged_kv_indices_buffer=sc.kv_indices.clone(),
                paged_kv_last_page_len_buffer=sc.last_page_len.clone())
        else:
            w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)
        w.plan(sc.kv_indptr, sc.kv_indices, sc.last_page_len, sc.Hq, sc.Hk, sc.D, sc.P,
               pos_encoding_mode="NONE", q_data_type=sc.dtype, kv_data_type=sc.dtype)
    else:
        # prefill, and the whole mixed batch: its q_len 1 requests are tiles of one row;
        # FlashInfer aligns the causal mask to the end of the KV, as attnkit does
        w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(sc.qo_indptr_dev, sc.kv_indptr, sc.kv_indices, sc.last_page_len, sc.Hq, sc.Hk,
               sc.D, sc.P, causal=True, q_data_type=sc.dtype, kv_data_type=sc.dtype)
    steps = [(lambda l=l: w.run(sc.q[l], (sc.k[l], sc.v[l]), out=o[l])) for l in range(sc.layers)]
    return StepList(steps, (w, ws)), lambda: (steps[0](), o[0])[1]


def setup_flashinfer_ragged(sc, fi):
    """BatchPrefillWithRaggedKVCacheWrapper on the contiguous K/V."""
    if sc.dev.type != "cuda":
        raise Skip("CUDA only")
    torch = sc.torch
    kr, vr = sc.ragged_copy()
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device=sc.dev)
    o = [torch.empty(sc.tokens, sc.Hq, sc.D, dtype=sc.dtype, device=sc.dev) for _ in range(sc.layers)]
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    w.plan(sc.qo_indptr_dev, sc.kv_token_indptr_dev, sc.Hq, sc.Hk, sc.D, causal=True,
           q_data_type=sc.dtype, kv_data_type=sc.dtype)
    steps = [(lambda l=l: w.run(sc.q[l], kr[l], vr[l], out=o[l])) for l in range(sc.layers)]
    return StepList(steps, (w, ws)), lambda: (steps[0](), o[0])[1]


def run_masks(sc, backend_name):
    """Per run of equal requests, SDPA's (is_causal, attn_mask). torch's
    is_causal is aligned to the top left when q_len < kv_len; a chunk on a
    prefix needs the bottom-right alignment (attnkit's, FlashInfer's):
    CausalBias lower-right for flash (it calls the flash kernel, whose causal
    is bottom-right), an explicit boolean mask, built once, for the others."""
    torch = sc.torch
    masks = []
    for _, _, q_len, kv_len in sc.groups:
        if q_len == 1:  # a decode's one query sees every key
            masks.append((False, None))
        elif q_len == kv_len:
            masks.append((True, None))
        elif backend_name == "flash":
            from torch.nn.attention.bias import causal_lower_right
            masks.append((False, causal_lower_right(q_len, kv_len)))
        else:
            keep = torch.ones(q_len, kv_len, dtype=torch.bool, device=sc.dev).tril(kv_len - q_len)
            masks.append((False, keep))
    return masks


def two_calls_note(sc):
    if len(sc.groups) < 2:
        return None
    return (f"{len(sc.groups)} calls, timed together: the chunk (causal, bottom-right) and the "
            "decodes (batched), on dense copies")


def setup_sdpa(sc, backend_name):
    torch = sc.torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend_name]
    dense = sc.dense_copy()
    masks = run_masks(sc, backend_name)
    gqa = sc.Hq != sc.Hk
    group = sc.Hq // sc.Hk

    def make(expand):
        if expand:
            kvs = [[(k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1))
                    for _, k, v in runs] for runs in dense]
        else:
            kvs = [[(k, v) for _, k, v in runs] for runs in dense]

        # enable_gqa only where it is wanted: a release whose CausalBias does not
        # take it still runs the repeated-heads fallback
        kw = {"enable_gqa": True} if gqa and not expand else {}

        def step(l):
            with sdpa_kernel(backend):
                return [F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, **kw)
                        for (q, _, _), (k, v), (causal, mask) in zip(dense[l], kvs[l], masks)]
        step(0)  # raises when the backend refuses
        return step, (kvs, masks)

    refused = (RuntimeError, TypeError, ValueError)
    try:
        step, keep = make(False)
        how = None
    except refused as e:
        if not gqa:
            raise Skip(f"sdpa {backend_name}: {str(e).splitlines()[0]}") from None
        if group * sc.layers * sc.dense_layer_bytes > sc.free_bytes():
            raise Skip(f"sdpa {backend_name} refused enable_gqa ({str(e).splitlines()[0]}); "
                       "repeated K/V would not fit") from None
        try:
            step, keep = make(True)
        except refused as e2:
            raise Skip(f"sdpa {backend_name}: {str(e2).splitlines()[0]}") from None
        how = "K/V heads repeated (enable_gqa refused)"
    steps = [(lambda l=l: step(l)) for l in range(sc.layers)]

    def output():
        return torch.cat([o.transpose(1, 2).reshape(-1, sc.Hq, sc.D) for o in step(0)])
    note = "; ".join(x for x in (two_calls_note(sc), how) if x) or None
    return StepList(steps, keep, note), output


_compiled_flex = []


def setup_flex(sc):
    torch = sc.torch
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception as e:
        raise Skip(f"no FlexAttention: {e}") from None
    if sc.dev.type != "cuda":
        raise Skip("CUDA only")
    dense = sc.dense_copy()
    if not _compiled_flex:  # one compiled function, recompiled per shape
        # dynamo gives up after 8 recompiles of a function (recompile_limit;
        # cache_size_limit before torch 2.6) and then runs flex_attention
        # unfused, materializing the scores: a full run has more shapes
        cfg = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), 1024))
        _compiled_flex.append(torch.compile(flex_attention))
    flex = _compiled_flex[0]

    def causal_from(offset):  # query i sits at position offset + i (the end of the KV)
        def causal(b, h, q_idx, kv_idx):
            return q_idx + offset >= kv_idx
        return causal
    masks = [None if q_len == 1 else
             create_block_mask(causal_from(kv_len - q_len), None, None, q_len, kv_len, device=sc.dev)
             for _, _, q_len, kv_len in sc.groups]

    def step(l):
        return [flex(q, k, v, block_mask=mask, enable_gqa=sc.Hq != sc.Hk)
                for (q, k, v), mask in zip(dense[l], masks)]
    try:
        step(0)
    except Exception as e:
        raise Skip(f"flex: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    steps = [(lambda l=l: step(l)) for l in range(sc.layers)]

    def output():
        return torch.cat([o.transpose(1, 2).reshape(-1, sc.Hq, sc.D) for o in step(0)])
    return StepList(steps, masks, two_calls_note(sc)), output


def setup_torch_varlen(sc):
    """torch.nn.attention.varlen.varlen_attn (torch 2.10+) on the contiguous
    K/V. Its signature changed between releases: causal is is_causal=True or
    window_size=(-1, 0); GQA is enable_gqa=True where it exists, else the K/V
    heads are repeated (outside the timed calls, and the note says so)."""
    torch = sc.torch
    if sc.dev.type != "cuda":
        raise Skip("CUDA only")
    try:
        from torch.nn.attention import varlen as tv
    except Exception as e:
        raise Skip(f"torch {torch.__version__} has no torch.nn.attention.varlen (2.10+): "
                   f"{type(e).__name__}") from None
    fn = getattr(tv, "varlen_attn", None)
    if fn is None:
        raise Skip(f"torch {torch.__version__}: torch.nn.attention.varlen has no varlen_attn")
    params = inspect.signature(fn).parameters
    if "is_causal" in params:
        causal = {"is_causal": True}
    elif "window_size" in params:
        causal = {"window_size": (-1, 0)}
    else:
        raise Skip("varlen_attn takes neither is_causal nor window_size")
    kr, vr = sc.ragged_copy()
    # one tensor for both when the lengths agree (prefill): torch's cuDNN path
    # takes a causal packed batch only then
    same = torch.equal(sc.qo_indptr, sc.kv_token_indptr)
    cu_q = sc.qo_indptr_dev
    cu_k = cu_q if same else sc.kv_token_indptr_dev
    max_q, max_k = max(q for q, _ in sc.reqs), max(kv for _, kv in sc.reqs)
    gqa, group = sc.Hq != sc.Hk, sc.Hq // sc.Hk

    def make(mode):  # mode: None (MHA), "native" (enable_gqa) or "repeat"
        if mode == "repeat":
            ks = [k.repeat_interleave(group, dim=1) for k in kr]
            vs = [v.repeat_interleave(group, dim=1) for v in vr]
        else:
            ks, vs = kr, vr
        kw = dict(causal, **({"enable_gqa": True} if mode == "native" else {}))

        def step(l):
            return fn(sc.q[l], ks[l], vs[l], cu_q, cu_k, max_q, max_k, **kw)
        step(0)
        return step, (ks, vs)

    refused = (RuntimeError, TypeError, ValueError)
    how = None
    try:
        if not gqa:
            step, keep = make(None)
        elif "enable_gqa" in params:
            try:
                step, keep = make("native")
            except refused as e:
                how = f"K/V heads repeated (enable_gqa refused: {str(e).splitlines()[0]})"
        else:
            how = "K/V heads repeated (this torch's varlen_attn has no enable_gqa)"
        if how:
            if group * sc.layers * sc.dense_layer_bytes > sc.free_bytes():
                raise Skip(f"torch_varlen: {how}; repeated K/V would not fit")
            step, keep = make("repeat")
    except refused as e:
        raise Skip(f"torch_varlen: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    steps = [(lambda l=l: step(l)) for l in range(sc.layers)]
    note = "; ".join(x for x in (varlen_backend(tv, sc, kr, vr, cu_q, cu_k, max_q, causal), how) if x)
    return StepList(steps, keep, note or None), lambda: step(0)


def varlen_backend(tv, sc, k, v, cu_q, cu_k, max_q, causal):
    """Which kernel torch's varlen_attn picks (cuDNN or flash), where the
    release has the private selector this was written against; else None."""
    select = getattr(tv, "_select_backend", None)
    if select is None or "window_size" not in causal:
        return None
    try:
        from torch.nn.attention import SDPBackend
        code = select(sc.q[0], k[0], v[0], cu_q, cu_k, max_q, list(causal["window_size"]))
        name = {SDPBackend.FLASH_ATTENTION.value: "flash",
                SDPBackend.CUDNN_ATTENTION.value: "cuDNN"}.get(code, str(code))
    except Exception:
        return None
    return f"varlen_attn runs {name} here"


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------

def time_steps(torch, steps, use_graph, args, dev):
    """(median_us, min_us, samples, graph_used, note) per layer call."""
    note = None
    if dev.type != "cuda":
        def one_pass():
            for s in steps:
                s()
        for _ in range(args.warmup):
            one_pass()
        ts = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            one_pass()
            ts.append((time.perf_counter() - t0) * 1e6 / len(steps))
        return statistics.median(ts), min(ts), len(ts), False, note

    run_pass = None
    if use_graph:
        try:
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):  # torch's rule: warm up on a side stream first
                for s in steps:
                    s()
            torch.cuda.current_stream(dev).wait_stream(side)
            torch.cuda.synchronize(dev)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for s in steps:
                    s()
            run_pass = graph.replay
        except Exception as e:
            torch.cuda.synchronize(dev)
            note = f"graph capture failed, eager: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            run_pass = None
    graph_used = run_pass is not None
    if run_pass is None:
        def run_pass():
            for s in steps:
                s()
    for _ in range(args.warmup):
        run_pass()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(args.iters):
        start.record()
        run_pass()
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end) * 1e3 / len(steps))
    return statistics.median(ts), min(ts), len(ts), graph_used, note


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def shapes(args):
    """(model, workload, reqs) per shape; reqs = [(q_len, kv_len)] per request."""
    for model in args.models:
        if "decode" in args.workloads:
            for b in args.batches:
                for kv in args.kv_lens:
                    yield model, "decode", [(1, kv)] * b
        if "prefill" in args.workloads:
            for n in args.prefill_lens:
                yield model, "prefill", [(n, n)] * args.prefill_batch
        if "mixed" in args.workloads:
            chunk = (args.mixed_chunk, args.mixed_prefix + args.mixed_chunk)
            yield model, "mixed", [chunk] + [(1, args.mixed_decode_kv)] * args.mixed_decodes


def run_side(peer, sc, attnkit, fi, fi_reason, args):
    use_graph = args.graph == "on" and sc.workload == "decode"
    if peer in RAGGED_PEERS:
        if sc.workload != "prefill":
            raise Skip("prefill only (contiguous K/V of the step's own tokens, no cached prefix)")
        if sc.q_len not in args.ragged_prefill_lens:
            raise Skip("prefill length not in --ragged-prefill-lens")
    if peer == "attnkit":
        steps, out = setup_attnkit(sc, attnkit)
    elif peer == "attnkit_varlen":
        steps, out = setup_attnkit_varlen(sc, attnkit)
    elif peer.startswith("flashinfer"):
        if fi is None:
            raise Skip(fi_reason)
        if peer == "flashinfer_ragged":
            steps, out = setup_flashinfer_ragged(sc, fi)
        else:
            steps, out = setup_flashinfer(sc, fi, peer == "flashinfer_tc", use_graph)
    elif peer in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"):
        backend = peer.split("_")[1]
        if sc.dev.type != "cuda":
            backend = "math"
        steps, out = setup_sdpa(sc, backend)
    elif peer == "torch_varlen":
        steps, out = setup_torch_varlen(sc)
    else:
        steps, out = setup_flex(sc)
    o = out()
    med, mn, n, graph_used, note = time_steps(sc.torch, steps, use_graph, args, sc.dev)
    note = "; ".join(x for x in (getattr(steps, "note", None), note) if x) or None
    return o, med, mn, n, graph_used, note


def main():
    args = parse_args()
    torch = import_torch()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to torch; use --device cpu to check the script", file=sys.stderr)
        return 2
    attnkit, ak_reason = import_attnkit(args.lib)
    fi, fi_reason = (None, "not asked for") if not any(p.startswith("flashinfer") for p in args.peers) \
        else import_flashinfer()
    dev = torch.device(args.device)
    devname = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"# device {devname}; torch {torch.__version__}; "
          f"flashinfer {fi.__version__ if fi else '- (' + str(fi_reason) + ')'}; "
          f"attnkit {attnkit.library_path if attnkit else '- (' + str(ak_reason) + ')'}")
    print(f"# dtype {args.dtype}, page {args.page_size}, graph {args.graph} (decode), "
          f"{args.iters} samples after {args.warmup} warm-up passes, median per layer call")
    if "mixed" in args.workloads:
        print(f"# mixed: one step of {args.mixed_decodes + 1} requests in one paged cache, a prompt chunk "
              f"of {args.mixed_chunk} tokens on a {args.mixed_prefix}-token prefix (kv_len "
              f"{args.mixed_prefix + args.mixed_chunk}, the row's q_len / kv_len) + {args.mixed_decodes} "
              f"decodes on {args.mixed_decode_kv} keys")
    if any(p in RAGGED_PEERS for p in args.peers):
        print("# " + ", ".join(p for p in RAGGED_PEERS if p in args.peers) + ": contiguous K/V "
              "[sum kv_len, kv_heads, head_dim] (the cache's values), prefill at "
              + ",".join(str(n) for n in args.ragged_prefill_lens if n in args.prefill_lens))
    if fi is not None:
        print("# FlashInfer compiles its kernels on first use (minutes; cached under "
              f"{os.environ.get('FLASHINFER_WORKSPACE_BASE', '~')}/.cache/flashinfer)")
    sys.stdout.flush()

    fields = ["model", "workload", "batch", "q_len", "kv_len", "dtype", "page_size", "layers", "peer",
              "status", "median_us", "min_us", "samples", "graph", "ratio_vs_attnkit", "gbps", "tflops",
              "check_ref", "max_abs_diff", "check", "note", "requests"]
    rows = []
    csv_file = open(args.csv, "w", newline="")
    writer = csv.DictWriter(csv_file, fieldnames=fields)
    writer.writeheader()
    failed = False
    for model, workload, reqs in shapes(args):
        sc = Scene(torch, args, model, workload, reqs)
        batch, q_len, kv_len = sc.batch, sc.q_len, sc.kv_len
        results = {}
        try:
            sc.build()
        except Skip as e:
            for peer in args.peers:
                results[peer] = dict(status="skipped", note=str(e))
        else:
            for peer in args.peers:
                try:
                    o, med, mn, n, graph_used, note = run_side(peer, sc, attnkit, fi, fi_reason, args)
                    results[peer] = dict(status="ok", out=o, median_us=med, min_us=mn, samples=n,
                                         graph=graph_used, note=note)
                except Skip as e:
                    results[peer] = dict(status="skipped", note=str(e))
                except Exception as e:  # a peer's failure is reported, the run goes on
                    msg = str(e).splitlines()[0] if str(e) else ""
                    results[peer] = dict(status="error", note=f"{type(e).__name__}: {msg}")
                    failed = True
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
        # check every output against the first side that ran (attnkit when it did)
        ref_peer = next((p for p in args.peers if results[p]["status"] == "ok"), None)
        ref = results[ref_peer]["out"].float() if ref_peer else None
        base = results.get("attnkit", {}).get("median_us")
        for peer in args.peers:
            r = results[peer]
            row = dict(model=model, workload=workload, batch=batch, q_len=q_len, kv_len=kv_len,
                       dtype=args.dtype, page_size=args.page_size, layers=sc.layers, peer=peer,
                       status=r["status"], note=r.get("note") or "", requests=sc.requests())
            if r["status"] == "ok":
                diff = (r["out"].float() - ref).abs().max().item()
                tol = TOLERANCE[args.dtype] * max(1.0, ref.abs().max().item())
                ok = diff <= tol
                failed |= not ok
                row.update(median_us=f"{r['median_us']:.2f}", min_us=f"{r['min_us']:.2f}",
                           samples=r["samples"], graph=int(r["graph"]),
                           ratio_vs_attnkit=f"{r['median_us'] / base:.3f}" if base else "",
                           gbps=f"{sc.bytes_per_call() / r['median_us'] / 1e3:.1f}",
                           tflops=f"{sc.flop_per_call() / r['median_us'] / 1e6:.2f}",
                           check_ref=ref_peer, max_abs_diff=f"{diff:.3g}",
                           check="ok" if ok else "MISMATCH")
                r["check"] = row["check"]
            writer.writerow(row)
            rows.append(row)
        csv_file.flush()
        print_row(sc, results, args.peers)
        for peer in args.peers:
            results[peer].pop("out", None)
        del sc, results, ref
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    csv_file.close()

    notes = {}
    for row in rows:
        if row["note"]:
            notes.setdefault(row["note"], []).append(f"{row['peer']} ({row['model']} {row['workload']} "
                                                     f"{row['batch']}x{row['kv_len']})")
    if notes:
        print("# notes")
        for note, where in notes.items():
            more = f" and {len(where) - 3} more" if len(where) > 3 else ""
            print(f"#   {note}: {', '.join(where[:3])}{more}")
    print(f"# wrote {len(rows)} rows to {args.csv}")
    return 1 if failed else 0


_header_printed = []


def print_row(sc, results, peers):
    """One line per shape: attnkit's time, then each peer's time / attnkit's
    (with 'g' for a graph replay); without attnkit the peers' own times."""
    others = [p for p in peers if p != "attnkit"]
    col = lambda p: max(len(p) + 2, 10)  # noqa: E731  (a column's width)
    if not _header_printed:
        print(f"{'model':<15}{'workload':<9}{'batch':>6}{'q_len':>7}{'kv_len':>7}{'layers':>7}"
              f"{'attnkit_us':>12}  " + "".join(f"{p:>{col(p)}}" for p in others)
              + "   (peer time / attnkit time; us where attnkit did not run)")
        _header_printed.append(1)
    a = results.get("attnkit", {})
    base = a.get("median_us") if a.get("status") == "ok" else None

    def cell(r, absolute):
        if r["status"] != "ok":
            return r["status"]
        mark = "g" if r.get("graph") else ""
        bad = "!" if r.get("check") == "MISMATCH" else ""
        v = f"{r['median_us']:.1f}" if absolute else f"{r['median_us'] / base:.2f}"
        return f"{v}{mark}{bad}"

    ak = cell(a, True) if a else "-"
    print(f"{sc.model:<15}{sc.workload:<9}{sc.batch:>6}{sc.q_len:>7}{sc.kv_len:>7}{sc.layers:>7}"
          f"{ak:>12}  " + "".join(f"{cell(results[p], base is None):>{col(p)}}" for p in others))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
