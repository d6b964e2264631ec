#!/usr/bin/env python3
"""
peers.py - attnkit's cuda_paged (and cuda_mla) beside its peers, on the same KV
contents and queries: FlashInfer's BatchDecode / BatchPrefill wrappers on the
paged cache and its ragged prefill wrapper on contiguous K/V (if importable),
PyTorch SDPA with the flash, cuDNN and memory-efficient backends on a dense
copy of the cache, FlexAttention (if present), torch's varlen_attn and
attnkit's own cuda_varlen on contiguous K/V; for MLA models, FlashInfer's
BatchMLAPagedAttentionWrapper (backends auto, fa2, fa3), FlashMLA (if
importable) and SDPA on the latent cache. attnkit_marks is cuda_paged as
an engine that writes its K/V through attnkit.kv_update runs it: with the
pools' finiteness marks, which the NaN rule's scan pass reads instead of
K/V (attnkit.h, ak_paged_kv.marks). Outputs are checked against
attnkit's; times are CUDA-event medians; decode and MLA are timed as
CUDA-graph replays where a side can be captured. Prints peer time / attnkit
time per shape (above 1: attnkit is faster) and writes every measurement to a
CSV.

    make build                                 # or: cmake --build build --target attnkit_shared
    python3 bench/peers.py                     # every default shape (see --help)
    python3 bench/peers.py --models llama3-8b --workloads decode --batches 1,64 --kv-lens 4096
    python3 bench/peers.py --workloads mixed --mixed-chunk 1024 --mixed-decodes 127
    python3 bench/peers.py --quick             # a few shapes of each kind
    python3 bench/peers.py --device cpu --quick   # plumbing check on a machine without a GPU
    python3 bench/peers.py --workloads mla --quick  # deepseek-v3 and deepseek-v3-tp8, MLA decode
    python3 bench/peers.py --models deepseek-v3 --mla-q-lens 1,2   # + 2 query tokens a request (MTP)

Workloads: decode (every request q_len 1 on the same kv_len, so the dense copy
for SDPA / Flex is an exact [batch, kv_heads, kv_len, head_dim] tensor),
prefill (causal, q_len = kv_len, no prefix) and mixed (one step of an engine
with chunked prefill: a prompt chunk on a cached prefix plus decodes, in one
paged cache and one call where a side can take the whole batch) run on the
GQA models; mla on the MLA models.

mla: DeepSeek-V3's attention in its absorbed form (docs/ARCHITECTURE.md,
"MLA"): one latent pool per layer [num_blocks, page_size, 576], each row 512
latent values + 64 rotary ones, whose first 512 are the value; q [tokens,
heads, 576], o [tokens, heads, 512]; sm_scale 1/sqrt(192) (bench/mla.py's).
Every request has --mla-q-lens query tokens (1: decode; more: multi-token
prediction, causal among them, aligned to the end of the KV as attnkit and
FlashInfer align it) on the same kv_len. Models: deepseek-v3 (128 heads),
deepseek-v3-tp8 (16), or mla-H (H heads). Which models run which workloads:
GQA models run decode, prefill and mixed, MLA models mla alone. Without
--workloads, each model runs all of its own (so --models deepseek-v3 runs
mla); the default --models has no MLA model, so a default run is GQA only.
--workloads mla with no MLA model in --models adds deepseek-v3 and
deepseek-v3-tp8; a GQA workload asked with MLA models alone is an error.

Method (the same for every side): inputs are random bf16 in [-1, 1); block
ids are shuffled; the dense and contiguous (ragged) copies hold the cache's
values. Each shape holds as many layers of K/V (and q, o) as make 4x the L2
(at most 32); one sample is a pass over all layers divided by the layer
count, so no side reads its K/V from L2 when a real step would not. Warm-up
passes, then --iters samples; the median is reported. MLA counts each latent
row once in the CSV's gbps (576 values a key, read by every head from one
load, plus q and o) and 2 x heads x (576 + 512) FLOPs a visible key; an MLA
output must also be within the tolerance in relative (Frobenius) error, the
test harness's own measure (|o| is ~1e-2 there, below what max-abs sees).
"""
import argparse
import csv
import inspect
import math
import os
import statistics
import sys
import time
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# num_qo_heads, num_kv_heads, head_dim (as attnkit-bench's --model)
MODELS = {
    "llama3-8b": (32, 8, 128),
    "qwen2.5-7b": (28, 4, 128),
    "llama3-70b-tp8": (8, 1, 128),
    "phi3-mini": (32, 32, 96),
    "gemma2-9b": (16, 8, 256),
}
# MLA models (DeepSeek-V3's absorbed form): num_qo_heads over one latent KV head
MLA_MODELS = {
    "deepseek-v3": 128,
    "deepseek-v3-tp8": 16,  # 128 heads over 8 GPUs
}
MLA_LAT, MLA_ROPE = 512, 64          # kv_lora_rank, qk_rope_head_dim
MLA_DQK = MLA_LAT + MLA_ROPE         # a latent row, and q's head dim in the absorbed form
MLA_SM_SCALE = 1.0 / math.sqrt(192)  # 1/sqrt(qk_nope_head_dim + qk_rope_head_dim = 128 + 64), before yarn
GQA_PEERS = ("attnkit", "attnkit_marks", "attnkit_varlen", "flashinfer", "flashinfer_tc", "flashinfer_ragged",
             "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex", "torch_varlen")
# the sides of the mla workload: attnkit is cuda_mla there
MLA_PEERS = ("attnkit", "flashinfer_mla", "flashinfer_mla_fa2", "flashinfer_mla_fa3", "flash_mla",
             "sdpa_flash", "sdpa_cudnn", "sdpa_efficient")
FLASHINFER_MLA_BACKENDS = {"flashinfer_mla": "auto", "flashinfer_mla_fa2": "fa2", "flashinfer_mla_fa3": "fa3"}
PEERS = GQA_PEERS + tuple(p for p in MLA_PEERS if p not in GQA_PEERS)
# the sides that read contiguous K/V [sum kv_len, kv_heads, head_dim] instead of the cache
RAGGED_PEERS = ("attnkit_varlen", "flashinfer_ragged", "torch_varlen")
GQA_WORKLOADS = ("decode", "prefill", "mixed")
WORKLOADS = GQA_WORKLOADS + ("mla",)
TOLERANCE = {"bf16": 2e-2, "f16": 4e-3}  # the test harness's, relative to max |o|
MAX_LAYERS = 32

# Shape options left unset take these, by device and --quick. On the CPU
# (attnkit's cpu backend against SDPA math) the shapes are small: that run
# checks the script's plumbing, it measures nothing.
SHAPE_DEFAULTS = {
    ("cuda", False): dict(batches="1,16,64,256", kv_lens="1024,2048,4096,8192,16384,32768",
                          prefill_lens="1024,2048,4096,8192,16384", ragged_prefill_lens="",
                          mixed_chunk=2048, mixed_prefix=4096, mixed_decodes=63, mixed_decode_kv=4096,
                          mla_batches="1,16,64,128", mla_kv_lens="1024,4096,8192,32768", mla_q_lens="1"),
    ("cuda", True): dict(batches="1,64", kv_lens="1024,8192,32768", prefill_lens="1024,4096",
                         ragged_prefill_lens="largest",
                         mixed_chunk=2048, mixed_prefix=4096, mixed_decodes=63, mixed_decode_kv=4096,
                         mla_batches="1,64", mla_kv_lens="8192", mla_q_lens="1"),
    ("cpu", False): dict(batches="1,4", kv_lens="256,1024", prefill_lens="128,512", ragged_prefill_lens="",
                         mixed_chunk=64, mixed_prefix=192, mixed_decodes=3, mixed_decode_kv=256,
                         mla_batches="1,4", mla_kv_lens="256,1024", mla_q_lens="1"),
    ("cpu", True): dict(batches="1,4", kv_lens="256", prefill_lens="128", ragged_prefill_lens="",
                        mixed_chunk=32, mixed_prefix=96, mixed_decodes=3, mixed_decode_kv=128,
                        mla_batches="1,4", mla_kv_lens="256", mla_q_lens="1"),
}


class Skip(Exception):
    """A side that cannot run a shape; the message says why."""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    gpu, quick, cpu = SHAPE_DEFAULTS[("cuda", False)], SHAPE_DEFAULTS[("cuda", True)], \
        SHAPE_DEFAULTS[("cpu", False)]
    p.add_argument("--models",
                   help=f"comma list of {', '.join(MODELS)} (GQA), or HQ/HK/D (heads and head dim, e.g. "
                   f"32/8/80); of {', '.join(MLA_MODELS)} (MLA), or mla-H (H heads) (default "
                   "llama3-8b,qwen2.5-7b; with --workloads mla alone, deepseek-v3,deepseek-v3-tp8)")
    p.add_argument("--workloads",
                   help="comma list of " + ", ".join(WORKLOADS) + " (default: each model's own: "
                   + ", ".join(GQA_WORKLOADS) + " for GQA models, mla for MLA models)")
    p.add_argument("--batches", help=f"decode batch sizes (default {gpu['batches']})")
    p.add_argument("--kv-lens", help=f"decode kv_len, every request the same (default {gpu['kv_lens']})")
    p.add_argument("--prefill-lens", help=f"prefill q_len = kv_len, causal (default {gpu['prefill_lens']})")
    p.add_argument("--prefill-batch", type=int, default=1)
    p.add_argument("--prefill-mix",
                   help="one more prefill shape: a batch of prompts of these lengths (comma list, causal, "
                   "q_len = kv_len each, e.g. 700,1300,2100), as an engine's step of new prompts has; the "
                   "contiguous-K/V sides run it too")
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
    p.add_argument("--mla-batches", help=f"mla batch sizes (default {gpu['mla_batches']}; --quick "
                   f"{quick['mla_batches']})")
    p.add_argument("--mla-kv-lens", help=f"mla kv_len, every request the same (default {gpu['mla_kv_lens']}; "
                   f"--quick {quick['mla_kv_lens']})")
    p.add_argument("--mla-q-lens",
                   help=f"mla query tokens a request, causal among them (default {gpu['mla_q_lens']}; "
                   "e.g. 1,2 adds multi-token prediction's 2)")
    p.add_argument("--mla-page-size", type=int, default=64,
                   help="mla: tokens a page of the latent cache (FlashMLA takes 64 only)")
    p.add_argument("--mla-fi-operands", default="view", choices=("view", "copy"),
                   help="mla: FlashInfer's ckv / kpe (and q_nope / q_pe) as views of the one latent pool "
                   "and q, row stride 576 (view, as engines pass them), or contiguous copies (copy, as "
                   "bench/mla.py does)")
    p.add_argument("--peers",
                   help="comma list of " + ", ".join(PEERS) + " (default all; each shape runs those of its kind: GQA "
                   + ", ".join(GQA_PEERS) + "; mla " + ", ".join(MLA_PEERS) + ")")
    p.add_argument("--page-size", type=int, default=16, help="GQA workloads' page size")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    p.add_argument("--graph", default="on", choices=("on", "off"),
                   help="time decode and mla as CUDA-graph replays where a side can be captured")
    p.add_argument("--iters", type=int, default=20, help="timed samples per side and shape")
    p.add_argument("--warmup", type=int, default=3, help="untimed passes first")
    p.add_argument("--mem-fraction", type=float, default=0.85,
                   help="use at most this fraction of the free GPU memory for a shape")
    p.add_argument("--csv", default="peers.csv", help="where every measurement goes")
    p.add_argument("--lib", default=None, help="libattnkit.so (default: ATTNKIT_LIB or build/)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: attnkit's cpu backend and SDPA math on small shapes (default "
                   f"batches {cpu['batches']}, kv_lens {cpu['kv_lens']}, prefill {cpu['prefill_lens']}; "
                   f"mla batches {cpu['mla_batches']}, kv_lens {cpu['mla_kv_lens']}), to check this script")
    p.add_argument("--quick", action="store_true",
                   help=f"batches {quick['batches']} x kv_len {quick['kv_lens']}; prefill "
                   f"{quick['prefill_lens']} (the contiguous-K/V sides at the largest); "
                   f"one mixed step; mla batches {quick['mla_batches']} x kv_len {quick['mla_kv_lens']}")
    p.add_argument("--rounds", type=int, default=1,
                   help="GPU: every side set up first, then its --iters samples taken in this many rounds, "
                   "the sides in turn each round (their order rotated), so that a drift during a shape "
                   "moves every side alike; every side's buffers are then held at once (default 1: each "
                   "side's samples back to back)")
    p.add_argument("--stream", default="default", choices=("default", "side"),
                   help="the stream every side runs on: torch's default stream (the legacy one), or a "
                   "stream of its own made current for the whole run")
    p.add_argument("--clock-probe", metavar="FILE",
                   help="GPU: before every timed sample, the SM clock (a spin of 400,000 clock cycles, "
                   "torch.cuda._sleep, timed by CUDA events); every sample with it in FILE (CSV), and a "
                   "side's median clock in the table's notes")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    for k, v in SHAPE_DEFAULTS[(a.device, a.quick)].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    a.models = [m for m in (a.models or "llama3-8b,qwen2.5-7b").split(",") if m]
    for m in a.models:
        if m in MODELS or m in MLA_MODELS:
            continue
        if m.startswith("mla-"):  # mla-H: an MLA model of H heads
            try:
                heads = int(m[4:])
                assert heads > 0
            except (ValueError, AssertionError):
                p.error(f"unknown model {m!r}; mla-H takes a head count, e.g. mla-64")
            MLA_MODELS[m] = heads
            continue
        try:  # or HQ/HK/D: any heads and head dim (e.g. 32/8/80)
            hq, hk, d = (int(x) for x in m.split("/"))
            assert hq > 0 and hk > 0 and hq % hk == 0 and d > 0
        except (ValueError, AssertionError):
            p.error(f"unknown model {m!r}; one of {', '.join(MODELS)}, {', '.join(MLA_MODELS)}, "
                    "HQ/HK/D (e.g. 32/8/80) or mla-H (e.g. mla-64)")
        MODELS[m] = (hq, hk, d)
    # which models run which workloads: GQA models decode / prefill / mixed, MLA models mla
    if a.workloads is None:
        a.workloads = list(WORKLOADS)
    else:
        a.workloads = [w for w in a.workloads.split(",") if w]
        for w in a.workloads:
            if w not in WORKLOADS:
                p.error(f"unknown workload {w!r}; one of {', '.join(WORKLOADS)}")
        if "mla" in a.workloads and not any(m in MLA_MODELS for m in a.models):
            # --workloads mla with no MLA model named: both DeepSeek-V3 shapes (a GQA model
            # named, or the default ones, still runs the GQA workloads asked, if any)
            a.models += ["deepseek-v3", "deepseek-v3-tp8"]
        gqa_asked = [w for w in a.workloads if w in GQA_WORKLOADS]
        if gqa_asked and not any(m in MODELS for m in a.models):
            p.error(f"--workloads {','.join(gqa_asked)} run on GQA models and --models names none "
                    "(MLA models run the mla workload alone)")
    a.batches, a.kv_lens, a.prefill_lens = ints(a.batches), ints(a.kv_lens), ints(a.prefill_lens)
    a.prefill_mix = ints(a.prefill_mix or "")
    if min(a.prefill_mix + [1]) < 1:
        p.error("--prefill-mix lengths must be >= 1")
    a.mla_batches, a.mla_kv_lens, a.mla_q_lens = ints(a.mla_batches), ints(a.mla_kv_lens), ints(a.mla_q_lens)
    if min(a.mla_batches + a.mla_kv_lens + a.mla_q_lens + [1]) < 1 or a.mla_page_size < 1:
        p.error("--mla-batches, --mla-kv-lens, --mla-q-lens and --mla-page-size must be >= 1")
    if any(q > kv for q in a.mla_q_lens for kv in a.mla_kv_lens):
        p.error("an mla request's query tokens are the last of its keys: --mla-q-lens <= --mla-kv-lens")
    if a.ragged_prefill_lens == "largest":
        a.ragged_prefill_lens = [max(a.prefill_lens)] if a.prefill_lens else []
    else:
        a.ragged_prefill_lens = ints(a.ragged_prefill_lens) or a.prefill_lens
    if min(a.mixed_chunk, a.mixed_decode_kv) < 1 or min(a.mixed_prefix, a.mixed_decodes) < 0:
        p.error("--mixed-chunk and --mixed-decode-kv must be >= 1, --mixed-prefix and "
                "--mixed-decodes >= 0")
    if a.clock_probe and a.device != "cuda":
        p.error("--clock-probe reads the GPU's clock: --device cuda")
    if a.rounds < 1 or a.rounds > a.iters:
        p.error("--rounds must be between 1 and --iters")
    a.peers_given = a.peers is not None
    a.peers = [x for x in (a.peers or ",".join(PEERS)).split(",") if x]
    for x in a.peers:
        if x not in PEERS:
            p.error(f"unknown peer {x!r}; one of {', '.join(PEERS)}")
    return a


def peers_for(args, mla):
    """The --peers of one kind of shape: in --peers order where given, else
    in GQA_PEERS' / MLA_PEERS' order."""
    kind = MLA_PEERS if mla else GQA_PEERS
    if args.peers_given:
        return [p for p in args.peers if p in kind]
    return [p for p in kind if p in args.peers]


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


def import_flash_mla():
    try:
        import flash_mla
        return flash_mla, None
    except Exception as e:
        return None, f"flash_mla not importable: {type(e).__name__}: {e}"


# ---------------------------------------------------------------------------
# A shape's data: one paged cache per layer, shared by every side
# ---------------------------------------------------------------------------

class Scene:
    mix = False  # the --prefill-mix batch (main sets it)
    """The requests of one shape, reqs = [(q_len, kv_len)] in batch order, over
    one paged cache per layer; dense and contiguous copies made on demand."""

    mla = False
    kv_pools = 2  # K and V

    def __init__(self, torch, args, model, workload, reqs):
        self.Hq, self.Hk, self.D = MODELS[model]
        self.Dv = self.D  # o's head dim (and V's)
        self.P = args.page_size
        self.sm_scale = None  # the default, 1/sqrt(D), on every side
        self._setup(torch, args, model, workload, reqs)

    def _setup(self, torch, args, model, workload, reqs):
        self.torch, self.args = torch, args
        self.model, self.workload, self.reqs = model, workload, reqs
        self.batch = len(reqs)
        self.q_len, self.kv_len = reqs[0]  # the first request's, for the table (the chunk in mixed)
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
        self.kv_layer_bytes = self.kv_pools * self.num_blocks * self.P * self.Hk * self.D * self.esize
        self.dense_layer_bytes = self.kv_pools * self.kv_tokens * self.Hk * self.D * self.esize  # ragged alike
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
        need = self.layers * (self.kv_layer_bytes + self.tokens * self.Hq * (self.D + self.Dv) * self.esize)
        if need > self.free_bytes():
            raise Skip(f"the paged cache needs {need / 2**30:.1f} GiB, "
                       f"{self.free_bytes() / 2**30:.1f} GiB are free")
        self._build_tables()
        shape = (self.num_blocks, self.P, self.Hk, self.D)
        torch.manual_seed(self.args.seed)

        def rand(*s):
            return torch.empty(*s, dtype=self.dtype, device=self.dev).uniform_(-1, 1)

        self.k = [rand(*shape) for _ in range(self.layers)]
        self.v = [rand(*shape) for _ in range(self.layers)]
        self.q = [rand(self.tokens, self.Hq, self.D) for _ in range(self.layers)]

    def _build_tables(self):
        """The shuffled block ids, block table, indptrs and slots of the batch."""
        torch = self.torch
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
                k = kv(self.k[layer])
                # MLA: no V pool; the value is the first Dv values of each latent row (a view)
                runs.append((qd, k, kv(self.v[layer]) if self.v is not None else k[..., :self.Dv]))
            dense.append(runs)
        self.dense = dense
        return self.dense

    def bytes_per_call(self):
        return attn_bytes(self.reqs, self.Hq, self.Hk, self.D, self.Dv, self.kv_pools, self.esize)

    def flop_per_call(self):
        return attn_flop(self.reqs, self.Hq, self.D, self.Dv)


class MLAScene(Scene):
    """The requests of an mla shape over one latent pool per layer,
    [num_blocks, P, 576] (self.latent; self.k is the same memory as a K-only
    cache [num_blocks, P, 1, 576]), q [tokens, heads, 576], o [tokens, heads,
    512]; sm_scale 1/sqrt(192)."""
    mla = True
    kv_pools = 1  # the latent rows alone: the value is their first 512 values

    def __init__(self, torch, args, model, workload, reqs):
        self.Hq, self.Hk, self.D, self.Dv = MLA_MODELS[model], 1, MLA_DQK, MLA_LAT
        self.P = args.mla_page_size
        self.sm_scale = MLA_SM_SCALE
        self._setup(torch, args, model, workload, reqs)

    def build(self):
        torch = self.torch
        need = self.layers * (self.kv_layer_bytes + self.tokens * self.Hq * (self.D + self.Dv) * self.esize)
        if need > self.free_bytes():
            raise Skip(f"the latent cache needs {need / 2**30:.1f} GiB, "
                       f"{self.free_bytes() / 2**30:.1f} GiB are free")
        self._build_tables()
        torch.manual_seed(self.args.seed)

        def rand(*s):
            return torch.empty(*s, dtype=self.dtype, device=self.dev).uniform_(-1, 1)

        self.latent = [rand(self.num_blocks, self.P, MLA_DQK) for _ in range(self.layers)]
        self.k = [lat.unsqueeze(2) for lat in self.latent]
        self.v = None
        self.q = [rand(self.tokens, self.Hq, MLA_DQK) for _ in range(self.layers)]


def attn_bytes(reqs, hq, hk, d, dv, kv_pools=2, esize=2):
    """Bytes a call moves at least: each request's K/V rows read once
    (kv_pools 2: K and V; 1: MLA's latent rows, which hold the value too),
    q read and o written."""
    tokens = sum(q for q, _ in reqs)
    kv_tokens = sum(kv for _, kv in reqs)
    return (kv_pools * kv_tokens * hk * d + tokens * hq * (d + dv)) * esize


def attn_flop(reqs, hq, d, dv):
    """2 x (d + dv) FLOPs a head and visible key (q.k and p.v). Causal, aligned
    to the end of the KV: token i of q_len sees kv_len - q_len + i + 1 keys,
    the keys computed (a decode's one token sees all; MLA's several tokens a
    request, multi-token prediction, count the ones each sees)."""
    keys = sum(q * kv - q * (q - 1) // 2 for q, kv in reqs)
    return 2 * hq * (d + dv) * keys


def mla_bytes(reqs, heads, esize=2):
    return attn_bytes(reqs, heads, 1, MLA_DQK, MLA_LAT, 1, esize)


def mla_flop(reqs, heads):
    return attn_flop(reqs, heads, MLA_DQK, MLA_LAT)


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


def setup_attnkit(sc, attnkit, marks=False):
    """attnkit's cuda_paged (cpu on --device cpu) on the paged cache. marks:
    as an engine that writes its K/V through attnkit.kv_update runs it, the
    pools' finiteness marks (attnkit.h, ak_paged_kv.marks) kept by
    kv_update (here every key's rows written once more, the values they
    hold), which the NaN rule's scan pass reads instead of the K/V rows."""
    if attnkit is None:
        raise Skip("attnkit not importable")
    torch = sc.torch
    name = "cuda_paged" if sc.dev.type == "cuda" else "cpu"
    if marks and sc.dev.type != "cuda":
        raise Skip("CUDA only (the marks serve the CUDA scan pass)")
    if marks and sc.workload == "decode":
        raise Skip("no scan pass in decode (the marks serve the prefill's)")
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
    m = [None] * sc.layers
    if marks:
        words = attnkit.kv_marks_words(sc.num_blocks, sc.Hk, sc.P)
        for l in range(sc.layers):
            m[l] = torch.zeros(words, dtype=torch.int32, device=sc.dev)
            rows = lambda cache: cache.view(-1, sc.Hk, sc.D).index_select(0, sc.kv_slots)  # noqa: E731
            attnkit.kv_update(sc.k[l], sc.v[l], rows(sc.k[l]), rows(sc.v[l]), sc.kv_slots, marks=m[l])
        torch.cuda.synchronize(sc.dev)
    o = [torch.empty(sc.tokens, sc.Hq, sc.D, dtype=sc.dtype, device=sc.dev) for _ in range(sc.layers)]
    calls = [b.prepare_run(sc.q[l], sc.k[l], sc.v[l], o[l], marks=m[l]) for l in range(sc.layers)]
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


# ---------------------------------------------------------------------------
# MLA: the pieces bench/mla.py shares (attnkit's cuda_mla and FlashInfer's
# BatchMLAPagedAttentionWrapper over one latent cache), then the mla sides
# ---------------------------------------------------------------------------

def attnkit_mla_backend(attnkit, heads, qo_indptr, kv_lens, block_table, num_blocks, page_size,
                        sm_scale=MLA_SM_SCALE, dtype="bf16", device="cuda", name="cuda_mla"):
    """A planned attnkit backend (cuda_mla; cpu on the CPU) in MLA mode:
    one latent KV head of rows of 576, the value their first 512, causal
    (several query tokens a request see the keys up to their own position,
    aligned to the end of the KV). qo_indptr / kv_lens: lists or host
    tensors; block_table [batch, pages] int32 on the host."""
    cfg = attnkit.Config(num_qo_heads=heads, num_kv_heads=1, head_dim_qk=MLA_DQK, head_dim_vo=MLA_LAT,
                         mla=True, sm_scale=sm_scale, causal=True, dtype=dtype, device=device,
                         page_size=page_size)
    lim = attnkit.Limits(max_reqs=len(kv_lens), max_tokens=int(qo_indptr[-1]),
                         max_blocks_per_req=block_table.shape[1], num_cache_blocks=num_blocks)
    b = attnkit.Backend(cfg, lim, name=name)
    b.plan(qo_indptr, kv_lens, block_table)
    return b


def attnkit_mla_call(backend, q, latent, o):
    """backend's prepared run() on one layer: q [tokens, heads, 576], latent
    [num_blocks, page, 576] (a K-only NHD cache of one head; no V), o
    [tokens, heads, 512]."""
    return backend.prepare_run(q, latent.unsqueeze(2), None, o)


def flashinfer_mla_wrapper(torch, fi, backend, qo_indptr, kv_indptr, kv_indices, kv_lens, heads, page_size,
                           sm_scale=MLA_SM_SCALE, dtype=None, causal=True):
    """(wrapper, workspace): a planned flashinfer.mla.BatchMLAPagedAttentionWrapper
    (backend 'auto', 'fa2' or 'fa3'). qo_indptr [batch + 1], kv_indptr [batch
    + 1] (in pages), kv_indices (page ids), kv_lens [batch] (tokens): int32
    on the device. causal: FlashInfer's MLA mask is aligned to the end of the
    KV (a key is masked when kv_idx + q_len > kv_len + q_idx), as attnkit's."""
    dtype = dtype or torch.bfloat16
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device=kv_indptr.device)
    w = fi.mla.BatchMLAPagedAttentionWrapper(ws, backend=backend)
    w.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, heads, MLA_LAT, MLA_ROPE, page_size, causal,
           sm_scale, dtype, dtype)
    return w, ws


def flashinfer_mla_operands(latent, q, copy=False):
    """(ckv, kpe, q_nope, q_pe) as FlashInfer's MLA run() takes them: the
    latent part [num_blocks, page, 512] and the rotary part [num_blocks,
    page, 64] of the cache, q's parts [tokens, heads, 512] and [.., 64].
    copy=False: views of latent and q (row strides 576, which run() takes:
    it passes the page / row / head strides to its kernels), so FlashInfer
    reads the memory attnkit reads; copy=True: contiguous copies."""
    parts = (latent[..., :MLA_LAT], latent[..., MLA_LAT:], q[..., :MLA_LAT], q[..., MLA_LAT:])
    return tuple(t.contiguous() for t in parts) if copy else parts


def setup_attnkit_mla(sc, attnkit):
    if attnkit is None:
        raise Skip("attnkit not importable")
    torch = sc.torch
    name = "cuda_mla" if sc.dev.type == "cuda" else "cpu"
    try:
        b = attnkit_mla_backend(attnkit, sc.Hq, sc.qo_indptr, sc.kv_lens, sc.block_table, sc.num_blocks,
                                sc.P, sc.sm_scale, sc.args.dtype, attnkit_device(sc), name)
    except attnkit.Error as e:
        raise Skip(f"{name}: {e}") from None
    o = [torch.empty(sc.tokens, sc.Hq, sc.Dv, dtype=sc.dtype, device=sc.dev) for _ in range(sc.layers)]
    calls = [attnkit_mla_call(b, sc.q[l], sc.latent[l], o[l]) for l in range(sc.layers)]
    steps = StepList([(lambda c=c: c()) for c in calls], b)
    return steps, lambda: (steps[0](), o[0])[1]


def setup_flashinfer_mla(sc, fi, backend):
    torch = sc.torch
    copy = sc.args.mla_fi_operands == "copy"
    if copy and sc.layers * sc.kv_layer_bytes > sc.free_bytes():
        raise Skip(f"copies of the latent cache need {sc.layers * sc.kv_layer_bytes / 2**30:.1f} GiB, "
                   f"{sc.free_bytes() / 2**30:.1f} GiB are free")
    try:
        w, ws = flashinfer_mla_wrapper(torch, fi, backend, sc.qo_indptr_dev, sc.kv_indptr, sc.kv_indices,
                                       sc.kv_lens.to(sc.dev), sc.Hq, sc.P, sc.sm_scale, sc.dtype)
    except (RuntimeError, ValueError, TypeError) as e:
        raise Skip(f"flashinfer mla {backend}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") \
            from None
    ops = [flashinfer_mla_operands(sc.latent[l], sc.q[l], copy) for l in range(sc.layers)]
    o = [torch.empty(sc.tokens, sc.Hq, sc.Dv, dtype=sc.dtype, device=sc.dev) for _ in range(sc.layers)]

    def step(l):
        ckv, kpe, q_nope, q_pe = ops[l]
        return w.run(q_nope, q_pe, ckv, kpe, out=o[l])
    steps = [(lambda l=l: step(l)) for l in range(sc.layers)]
    # which kernel 'auto' chose (the wrapper's own attribute: fa3 on sm90a, else fa2)
    chose = getattr(w, "_backend", None)
    notes = [f"auto ran {chose}" if backend == "auto" and chose else None,
             "ckv / kpe, q_nope / q_pe: contiguous copies" if copy else None]
    return StepList(steps, (w, ws, ops), "; ".join(n for n in notes if n) or None), \
        lambda: (steps[0](), o[0])[1]


def setup_flash_mla(sc, fm):
    """FlashMLA's flash_mla_with_kvcache on the latent cache as it is ([num_blocks,
    64, 1, 576]), q [batch, q_len, heads, 576]. Its interface has two
    generations: get_mla_metadata(cache_seqlens, q_len * heads // kv_heads,
    kv_heads) -> (tile_scheduler_metadata, num_splits) tensors, and, since
    its sparse-attention rewrite, get_mla_metadata(*args) -> (FlashMLASchedMeta,
    None), filled in by the first call; the old arguments serve both, as does
    passing both results on. Its causal is aligned to the end of the KV (its
    multi-token-prediction use)."""
    if sc.P != 64:
        raise Skip(f"FlashMLA takes pages of 64 tokens (--mla-page-size {sc.P})")
    if len(sc.groups) != 1:
        raise Skip("FlashMLA takes q [batch, q_len, heads, 576]: every request the same q_len")
    block_table = sc.block_table.to(sc.dev)
    seqlens = sc.kv_lens.to(sc.dev)
    refused = (RuntimeError, ValueError, TypeError, AssertionError)
    try:
        meta, splits = fm.get_mla_metadata(seqlens, sc.q_len * sc.Hq, 1)
    except refused as e:
        raise Skip(f"flash_mla get_mla_metadata: {type(e).__name__}: {e}") from None
    qs = [q.view(sc.batch, sc.q_len, sc.Hq, MLA_DQK) for q in sc.q]

    def step(l):
        out, _ = fm.flash_mla_with_kvcache(qs[l], sc.k[l], block_table, seqlens, MLA_LAT, meta, splits,
                                           softmax_scale=sc.sm_scale, causal=True)
        return out
    try:
        step(0)  # the new interface plans on its first call: outside any capture
    except refused as e:
        raise Skip(f"flash_mla: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    steps = [(lambda l=l: step(l)) for l in range(sc.layers)]
    return StepList(steps, (block_table, seqlens, meta, splits, qs)), \
        lambda: step(0).reshape(sc.tokens, sc.Hq, sc.Dv)


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
        elif backend_name == "flash" and not sc.mla:
            # (not for MLA: where flash refuses the head dims, CausalBias falls back to the
            # efficient kernel inside sdpa_kernel(FLASH_ATTENTION) and would time that)
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
    """MLA: the absorbed form on the dense copy, q [batch, heads, q_len, 576],
    K the latent rows [batch, 1, kv_len, 576] shared by the heads
    (enable_gqa, or expanded), V their first 512 values (a view), scale
    1/sqrt(192); a backend that refuses head dim 576, or V's 512 beside
    K's 576, is skipped with its reason."""
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
        if expand and sc.mla:  # one latent head for all: a stride-0 view, no copy
            kvs = [[(k.expand(-1, sc.Hq, -1, -1), v.expand(-1, sc.Hq, -1, -1))
                    for _, k, v in runs] for runs in dense]
        elif expand:
            kvs = [[(k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1))
                    for _, k, v in runs] for runs in dense]
        else:
            kvs = [[(k, v) for _, k, v in runs] for runs in dense]

        # enable_gqa only where it is wanted: a release whose CausalBias does not
        # take it still runs the repeated-heads fallback
        kw = {"enable_gqa": True} if gqa and not expand else {}
        if sc.sm_scale is not None:  # MLA's 1/sqrt(192), not 1/sqrt(576)
            kw["scale"] = sc.sm_scale

        def step(l):
            with sdpa_kernel(backend):
                return [F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, **kw)
                        for (q, _, _), (k, v), (causal, mask) in zip(dense[l], kvs[l], masks)]
        with warnings.catch_warnings(record=True) as caught:  # torch says why a kernel refused
            warnings.simplefilter("always")
            try:
                step(0)  # raises when the backend refuses
            except refused as e:
                e.why = refusal(e, caught)  # with torch's reasons
                raise
        return step, (kvs, masks)

    refused = (RuntimeError, TypeError, ValueError)
    try:
        step, keep = make(False)
        how = None
    except refused as e:
        if not gqa:
            raise Skip(f"sdpa {backend_name}: {refusal(e)}") from None
        if not sc.mla and group * sc.layers * sc.dense_layer_bytes > sc.free_bytes():
            raise Skip(f"sdpa {backend_name} refused enable_gqa ({refusal(e)}); "
                       "repeated K/V would not fit") from None
        try:
            step, keep = make(True)
        except refused as e2:
            raise Skip(f"sdpa {backend_name}: {refusal(e2)}") from None
        how = (f"the latent head expanded over the heads (a stride-0 view; enable_gqa refused: {refusal(e)})"
               if sc.mla else "K/V heads repeated (enable_gqa refused)")
    steps = [(lambda l=l: step(l)) for l in range(sc.layers)]

    def output():
        return torch.cat([o.transpose(1, 2).reshape(-1, sc.Hq, sc.Dv) for o in step(0)])
    note = "; ".join(x for x in (two_calls_note(sc), how) if x) or None
    return StepList(steps, keep, note), output


def refusal(e, caught=()):
    """An SDPA refusal's first line, with the reasons torch gave as warnings
    ("Flash attention requires ..."); without caught, the one make() kept."""
    if not caught and getattr(e, "why", None):
        return e.why
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    why = []
    for w in caught:
        t = " ".join(str(w.message).split("(Triggered internally")[0].split())
        if t and not t.endswith("because:") and t not in why:
            why.append(t)
    return msg + (" (" + " | ".join(why[:3]) + ")" if why else "")


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

def time_steps(torch, steps, use_graph, args, dev, sc=None, peer=None):
    """(median_us, min_us, samples, graph_used, note, clock) per layer call
    (clock: clock_text, or None)."""
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
        return statistics.median(ts), min(ts), len(ts), False, note, None

    run_pass, graph_used, note = pass_of(torch, steps, use_graph, dev)
    for _ in range(args.warmup):
        run_pass()
    clocks = [] if args.clock_probe else None
    ts = samples_of(torch, run_pass, args.iters, len(steps), clocks)
    log_samples(args, sc, peer, [0] * len(ts), ts, clocks)
    return statistics.median(ts), min(ts), len(ts), graph_used, note, clock_text(ts, clocks)


def log_samples(args, sc, peer, rounds, ts, clocks):
    """--clock-probe: a side's samples, each with its round and clock, into
    that CSV (its header written with the first row)."""
    if not clocks or sc is None:
        return
    new = not getattr(args, "_probe_started", False)
    args._probe_started = True
    with open(args.clock_probe, "w" if new else "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["model", "workload", "requests", "peer", "round", "us", "mhz"])
        for r, t, c in zip(rounds, ts, clocks):
            w.writerow([sc.model, sc.workload, sc.requests(), peer, r, f"{t:.2f}", f"{c:.1f}"])


def clock_text(ts, clocks):
    """A side's samples' clocks (--clock-probe), or None: the median, and the
    median time of the samples at or above that clock against those below
    it (a side's two speed levels, where the clock makes them)."""
    if not clocks:
        return None
    mid = statistics.median(clocks)
    hi = [t for t, c in zip(ts, clocks) if c >= mid]
    lo = [t for t, c in zip(ts, clocks) if c < mid]
    text = f"clock {mid:.0f} MHz ({min(clocks):.0f}-{max(clocks):.0f})"
    if hi and lo:
        text += f", us at/above it {statistics.median(hi):.1f}, below {statistics.median(lo):.1f}"
    return text


def pass_of(torch, steps, use_graph, dev):
    """(run_pass, graph_used, note): one pass over a side's steps on the
    GPU, as one CUDA-graph replay where asked and the capture works."""
    note = None
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
    return run_pass, graph_used, note


PROBE_CYCLES = 400_000


def probe_mhz(torch):
    """The SM clock now, in MHz: PROBE_CYCLES clock cycles spun by one
    thread (torch.cuda._sleep), timed by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(PROBE_CYCLES // 20)  # (busy before start: no launch delay inside the timing)
    start.record()
    torch.cuda._sleep(PROBE_CYCLES)
    end.record()
    end.synchronize()
    return PROBE_CYCLES / (start.elapsed_time(end) * 1e3)


def samples_of(torch, run_pass, n, calls, clocks=None):
    """n timed passes (CUDA events), each as us a call (a pass makes calls);
    with a list clocks, the SM clock before each (probe_mhz) appended to it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        if clocks is not None:
            clocks.append(probe_mhz(torch))
        start.record()
        run_pass()
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end) * 1e3 / calls)
    return ts


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def shapes(args):
    """(model, workload, reqs, mix) per shape; reqs = [(q_len, kv_len)] per request;
    mix: the --prefill-mix batch.
    MLA models run the mla workload alone, GQA models never do."""
    for model in args.models:
        if model in MLA_MODELS:
            if "mla" in args.workloads:
                for q_len in args.mla_q_lens:
                    for b in args.mla_batches:
                        for kv in args.mla_kv_lens:
                            yield model, "mla", [(q_len, kv)] * b, False
            continue
        if "decode" in args.workloads:
            for b in args.batches:
                for kv in args.kv_lens:
                    yield model, "decode", [(1, kv)] * b, False
        if "prefill" in args.workloads:
            for n in args.prefill_lens:
                yield model, "prefill", [(n, n)] * args.prefill_batch, False
            if args.prefill_mix:
                yield model, "prefill", [(n, n) for n in args.prefill_mix], True
        if "mixed" in args.workloads:
            chunk = (args.mixed_chunk, args.mixed_prefix + args.mixed_chunk)
            yield model, "mixed", [chunk] + [(1, args.mixed_decode_kv)] * args.mixed_decodes, False


def side_note(steps, note):
    """A side's notes: its setup's (steps.note) and its timing's, or None."""
    return "; ".join(x for x in (getattr(steps, "note", None), note) if x) or None


def failure(e):
    """A side's exception as its note: the type and the first line."""
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {msg}"


def run_side(peer, sc, attnkit, fi, fi_reason, fm, fm_reason, args):
    steps, out, use_graph = side_steps(peer, sc, attnkit, fi, fi_reason, fm, fm_reason, args)
    o = out()
    med, mn, n, graph_used, note, clock = time_steps(sc.torch, steps, use_graph, args, sc.dev, sc, peer)
    return o, med, mn, n, graph_used, side_note(steps, note), clock


def run_sides_interleaved(peers, sc, attnkit, fi, fi_reason, fm, fm_reason, args, results):
    """--rounds R > 1 (GPU): every side set up and warmed up first, then R
    rounds, each taking iters / R samples of every side in turn (the order
    rotated each round), so that a clock or a neighbour that drifts during
    the shape moves every side alike; the median and least over a side's
    samples. Fills results as run_side's caller does; returns whether a
    side failed."""
    torch, failed, live = sc.torch, False, {}
    for peer in peers:
        try:
            steps, out, use_graph = side_steps(peer, sc, attnkit, fi, fi_reason, fm, fm_reason, args)
            o = out()
            run_pass, graph_used, note = pass_of(torch, steps, use_graph, sc.dev)
            for _ in range(args.warmup):
                run_pass()
            live[peer] = dict(steps=steps, run_pass=run_pass, out=o, graph=graph_used, note=side_note(steps, note),
                              ts=[], clocks=[] if args.clock_probe else None, rounds=[])
        except Skip as e:
            results[peer] = dict(status="skipped", note=str(e))
        except Exception as e:  # a peer's failure is reported, the run goes on
            results[peer] = dict(status="error", note=failure(e))
            failed = True
        torch.cuda.synchronize(sc.dev)
    order = list(live)
    # setting the later sides up (FlashInfer's compiles, cuDNN's dense copies) leaves the GPU idle and its
    # clock down: one more untimed pass of every side first, so that the first round starts at speed
    for peer in order:
        try:
            live[peer]["run_pass"]()
            torch.cuda.synchronize(sc.dev)
        except Exception as e:
            live[peer]["error"] = failure(e)
    for r in range(args.rounds):
        n = args.iters // args.rounds + (r < args.iters % args.rounds)  # --iters in all
        for peer in order[r % len(order):] + order[:r % len(order)] if order else []:
            side = live[peer]
            if "error" in side:
                continue
            try:
                side["ts"] += samples_of(torch, side["run_pass"], n, len(side["steps"]), side["clocks"])
                side["rounds"] += [r] * n
            except Exception as e:
                side["error"] = failure(e)
                torch.cuda.synchronize(sc.dev)
    for peer, side in live.items():
        if "error" in side:
            results[peer] = dict(status="error", note=side["error"])
            failed = True
            continue
        ts = side["ts"]
        log_samples(args, sc, peer, side["rounds"], ts, side["clocks"])
        results[peer] = dict(status="ok", out=side["out"], median_us=statistics.median(ts), min_us=min(ts),
                             samples=len(ts), graph=side["graph"], note=side["note"],
                             clock=clock_text(ts, side["clocks"]))
    return failed


def side_steps(peer, sc, attnkit, fi, fi_reason, fm, fm_reason, args):
    """(steps, out, use_graph): one side set up for the shape, untimed;
    out() runs it once and returns its output."""
    use_graph = args.graph == "on" and sc.workload in ("decode", "mla")
    if sc.mla:
        if peer == "attnkit":
            steps, out = setup_attnkit_mla(sc, attnkit)
        elif peer in FLASHINFER_MLA_BACKENDS:
            if sc.dev.type != "cuda":
                raise Skip("CUDA only")
            if fi is None:
                raise Skip(fi_reason)
            steps, out = setup_flashinfer_mla(sc, fi, FLASHINFER_MLA_BACKENDS[peer])
        elif peer == "flash_mla":
            if sc.dev.type != "cuda":
                raise Skip("CUDA only")
            if fm is None:
                raise Skip(fm_reason)
            steps, out = setup_flash_mla(sc, fm)
        elif peer in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"):
            steps, out = setup_sdpa(sc, peer.split("_")[1] if sc.dev.type == "cuda" else "math")
        else:
            raise Skip("not an mla side")
        return steps, out, use_graph
    if peer in RAGGED_PEERS:
        if sc.workload != "prefill":
            raise Skip("prefill only (contiguous K/V of the step's own tokens, no cached prefix)")
        if sc.q_len not in args.ragged_prefill_lens and not sc.mix:  # (--prefill-mix: always)
            raise Skip("prefill length not in --ragged-prefill-lens")
    if peer in ("attnkit", "attnkit_marks"):
        steps, out = setup_attnkit(sc, attnkit, marks=peer == "attnkit_marks")
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
    return steps, out, use_graph


def main():
    args = parse_args()
    torch = import_torch()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to torch; use --device cpu to check the script", file=sys.stderr)
        return 2
    attnkit, ak_reason = import_attnkit(args.lib)
    fi, fi_reason = (None, "not asked for") if not any(p.startswith("flashinfer") for p in args.peers) \
        else import_flashinfer()
    mla_run = "mla" in args.workloads and any(m in MLA_MODELS for m in args.models)
    gqa_run = any(w in GQA_WORKLOADS for w in args.workloads) and any(m in MODELS for m in args.models)
    fm, fm_reason = import_flash_mla() if mla_run and "flash_mla" in args.peers else (None, "not asked for")
    dev = torch.device(args.device)
    devname = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    if args.stream == "side" and dev.type == "cuda":
        torch.cuda.set_stream(torch.cuda.Stream(dev))
    if args.clock_probe:
        probe_mhz(torch)  # (its first call loads the spin kernel: not a clock)
    print(f"# device {devname}; torch {torch.__version__}; "
          f"flashinfer {fi.__version__ if fi else '- (' + str(fi_reason) + ')'}; "
          f"attnkit {attnkit.library_path if attnkit else '- (' + str(ak_reason) + ')'}")
    print(f"# dtype {args.dtype}, page {args.page_size}{' (GQA)' if mla_run else ''}, graph {args.graph} (decode{', mla' if mla_run else ''}), "
          f"stream {args.stream}, {args.rounds} round(s), "
          f"{args.iters} samples after {args.warmup} warm-up passes, median per layer call")
    if mla_run:
        print(f"# mla: DeepSeek-V3 absorbed, latent rows of {MLA_LAT} + {MLA_ROPE} in pages of "
              f"{args.mla_page_size}, q 576 / o 512 a head, sm_scale 1/sqrt(192), causal among a "
              f"request's --mla-q-lens tokens; FlashInfer's operands: {args.mla_fi_operands}; "
              f"flash_mla {getattr(fm, '__version__', '') if fm else '- (' + str(fm_reason) + ')'}")
    if gqa_run and "mixed" in args.workloads:
        print(f"# mixed: one step of {args.mixed_decodes + 1} requests in one paged cache, a prompt chunk "
              f"of {args.mixed_chunk} tokens on a {args.mixed_prefix}-token prefix (kv_len "
              f"{args.mixed_prefix + args.mixed_chunk}, the row's q_len / kv_len) + {args.mixed_decodes} "
              f"decodes on {args.mixed_decode_kv} keys")
    if gqa_run and "prefill" in args.workloads and any(p in RAGGED_PEERS for p in args.peers):
        print("# " + ", ".join(p for p in RAGGED_PEERS if p in args.peers) + ": contiguous K/V "
              "[sum kv_len, kv_heads, head_dim] (the cache's values), prefill at "
              + ",".join(str(n) for n in args.ragged_prefill_lens if n in args.prefill_lens)
              + (" and the --prefill-mix batch" if args.prefill_mix else ""))
    if fi is not None:
        print("# FlashInfer compiles its kernels on first use (minutes; cached under "
              f"{os.environ.get('FLASHINFER_WORKSPACE_BASE', '~')}/.cache/flashinfer)")
    sys.stdout.flush()

    fields = ["model", "workload", "batch", "q_len", "kv_len", "dtype", "page_size", "layers", "peer",
              "status", "median_us", "min_us", "samples", "graph", "ratio_vs_attnkit", "gbps", "tflops",
              "check_ref", "max_abs_diff", "check", "note", "requests", "clock"]
    rows = []
    csv_file = open(args.csv, "w", newline="")
    writer = csv.DictWriter(csv_file, fieldnames=fields)
    writer.writeheader()
    failed = False
    for model, workload, reqs, mix in shapes(args):
        sc = (MLAScene if workload == "mla" else Scene)(torch, args, model, workload, reqs)
        sc.mix = mix
        batch, q_len, kv_len = sc.batch, sc.q_len, sc.kv_len
        peers = peers_for(args, sc.mla)
        results = {}
        try:
            sc.build()
        except Skip as e:
            for peer in peers:
                results[peer] = dict(status="skipped", note=str(e))
        else:
            if args.rounds > 1 and dev.type == "cuda":
                failed |= run_sides_interleaved(peers, sc, attnkit, fi, fi_reason, fm, fm_reason, args, results)
            else:
                for peer in peers:
                    try:
                        o, med, mn, n, graph_used, note, clock = run_side(peer, sc, attnkit, fi, fi_reason, fm,
                                                                          fm_reason, args)
                        results[peer] = dict(status="ok", out=o, median_us=med, min_us=mn, samples=n,
                                             graph=graph_used, note=note, clock=clock)
                    except Skip as e:
                        results[peer] = dict(status="skipped", note=str(e))
                    except Exception as e:  # a peer's failure is reported, the run goes on
                        results[peer] = dict(status="error", note=failure(e))
                        failed = True
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
        # check every output against the first side that ran (attnkit when it did)
        ref_peer = next((p for p in peers if results[p]["status"] == "ok"), None)
        ref = results[ref_peer]["out"].float() if ref_peer else None
        base = results.get("attnkit", {}).get("median_us")
        for peer in peers:
            r = results[peer]
            row = dict(model=model, workload=workload, batch=batch, q_len="mix" if sc.mix else q_len,
                       kv_len="mix" if sc.mix else kv_len,
                       dtype=args.dtype, page_size=sc.P, layers=sc.layers, peer=peer,
                       status=r["status"], note=r.get("note") or "", requests=sc.requests(),
                       clock=r.get("clock") or "")
            if r["status"] == "ok":
                err = r["out"].float() - ref
                diff = err.abs().max().item()
                tol = TOLERANCE[args.dtype] * max(1.0, ref.abs().max().item())
                ok = diff <= tol
                if sc.mla:
                    # random latent rows give a flat softmax and |o| ~ 1e-2, which the test above
                    # passes whatever o holds (zeros too): also the harness's own test, the
                    # relative (Frobenius) error within the same tolerance
                    rel = (err.norm() / ref.norm().clamp_min(1e-30)).item()
                    if rel > TOLERANCE[args.dtype]:
                        ok = False
                        row["note"] = "; ".join(x for x in (row["note"], f"relative error {rel:.3g} > "
                                                            f"{TOLERANCE[args.dtype]:g}") if x)
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
        print_row(sc, results, peers)
        for peer in peers:  # (--clock-probe)
            if results[peer].get("clock"):
                print(f"#   clock of {peer}: {results[peer]['clock']}")
        for peer in peers:
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
    (with 'g' for a graph replay); without attnkit the peers' own times. A
    header whenever the columns change (the mla shapes have their own)."""
    others = [p for p in peers if p != "attnkit"]
    col = lambda p: max(len(p) + 2, 10)  # noqa: E731  (a column's width)
    if _header_printed[-1:] != [others]:
        print(f"{'model':<16}{'workload':<9}{'batch':>6}{'q_len':>7}{'kv_len':>7}{'layers':>7}"
              f"{'attnkit_us':>12}  " + "".join(f"{p:>{col(p)}}" for p in others)
              + "   (peer time / attnkit time; us where attnkit did not run)")
        _header_printed.append(others)
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
    q_len, kv_len = ("mix", "mix") if sc.mix else (sc.q_len, sc.kv_len)  # (the CSV's requests say which)
    print(f"{sc.model:<16}{sc.workload:<9}{sc.batch:>6}{q_len:>7}{kv_len:>7}{sc.layers:>7}"
          f"{ak:>12}  " + "".join(f"{cell(results[p], base is None):>{col(p)}}" for p in others))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
