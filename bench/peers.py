#!/usr/bin/env python3
"""
peers.py - attnkit's cuda_paged beside its peers, on the same paged KV contents
and queries: FlashInfer's BatchDecode / BatchPrefill wrappers (if importable),
PyTorch SDPA with the flash and cuDNN backends on a dense copy of the cache,
and FlexAttention (if present). Outputs are checked against each other;
times are CUDA-event medians; decode is timed as CUDA-graph replays where a
side can be captured. Prints peer time / attnkit time per shape (above 1:
attnkit is faster) and writes every measurement to a CSV.

    make build                                 # or: cmake --build build --target attnkit_shared
    python3 bench/peers.py                     # every default shape (see --help)
    python3 bench/peers.py --models llama3-8b --workloads decode --batches 1,64 --kv-lens 4096
    python3 bench/peers.py --quick             # a few shapes of each kind
    python3 bench/peers.py --device cpu --quick   # plumbing check on a machine without a GPU

Method (the same for every side): inputs are random bf16 in [-1, 1); block
ids are shuffled; every request of a decode shape has the same kv_len, so the
dense copy for SDPA / Flex is an exact [batch, kv_heads, kv_len, head_dim]
tensor. Each shape holds as many layers of K/V (and q, o) as make 4x the L2
(at most 32); one sample is a pass over all layers divided by the layer
count, so no side reads its K/V from L2 when a real step would not. Warm-up
passes, then --iters samples; the median is reported.
"""
import argparse
import csv
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
}
PEERS = ("attnkit", "flashinfer", "flashinfer_tc", "sdpa_flash", "sdpa_cudnn", "flex")
TOLERANCE = {"bf16": 2e-2, "f16": 4e-3}  # the test harness's, relative to max |o|
MAX_LAYERS = 32


class Skip(Exception):
    """A side that cannot run a shape; the message says why."""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="llama3-8b,qwen2.5-7b",
                   help=f"comma list of {', '.join(MODELS)}")
    p.add_argument("--workloads", default="decode,prefill")
    p.add_argument("--batches", default="1,16,64,256", help="decode batch sizes")
    p.add_argument("--kv-lens", default="1024,2048,4096,8192,16384,32768",
                   help="decode kv_len (every request the same)")
    p.add_argument("--prefill-lens", default="1024,2048,4096,8192,16384",
                   help="prefill q_len = kv_len, causal")
    p.add_argument("--prefill-batch", type=int, default=1)
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
                   help="cpu: attnkit's cpu backend and SDPA math, to check this script")
    p.add_argument("--quick", action="store_true",
                   help="batches 1,64 x kv_len 1024,8192,32768; prefill 1024,4096")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.quick:
        a.batches, a.kv_lens, a.prefill_lens = "1,64", "1024,8192,32768", "1024,4096"
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    a.models = [m for m in a.models.split(",") if m]
    for m in a.models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}; one of {', '.join(MODELS)}")
    a.workloads = [w for w in a.workloads.split(",") if w]
    a.batches, a.kv_lens, a.prefill_lens = ints(a.batches), ints(a.kv_lens), ints(a.prefill_lens)
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
    def __init__(self, torch, args, model, workload, batch, q_len, kv_len):
        self.torch, self.args = torch, args
        self.model, self.workload = model, workload
        self.batch, self.q_len, self.kv_len = batch, q_len, kv_len
        self.Hq, self.Hk, self.D = MODELS[model]
        self.P = args.page_size
        self.dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
        self.dev = torch.device(args.device)
        self.tokens = batch * q_len
        self.pages = -(-kv_len // self.P)
        self.num_blocks = batch * self.pages
        self.esize = 2
        self.kv_layer_bytes = 2 * self.num_blocks * self.P * self.Hk * self.D * self.esize
        self.dense_layer_bytes = 2 * batch * kv_len * self.Hk * self.D * self.esize
        if self.dev.type == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(self.dev), "L2_cache_size", 50 << 20)
            self.layers = max(1, min(MAX_LAYERS, math.ceil(4 * l2 / self.kv_layer_bytes)))
        else:
            self.layers = 1
        self.dense = None

    def label(self):
        return f"{self.model} {self.workload} batch {self.batch} q_len {self.q_len} kv_len {self.kv_len}"

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
        self.block_table = perm.view(self.batch, self.pages).contiguous()       # [batch, pages], host
        self.qo_indptr = torch.arange(0, self.tokens + 1, self.q_len, dtype=torch.int32)
        self.kv_lens = torch.full((self.batch,), self.kv_len, dtype=torch.int32)
        last = self.kv_len - (self.pages - 1) * self.P
        # the CSR form FlashInfer takes, on the device
        self.kv_indptr = torch.arange(0, self.num_blocks + 1, self.pages, dtype=torch.int32).to(self.dev)
        self.kv_indices = self.block_table.reshape(-1).to(self.dev)
        self.last_page_len = torch.full((self.batch,), last, dtype=torch.int32, device=self.dev)
        self.qo_indptr_dev = self.qo_indptr.to(self.dev)
        shape = (self.num_blocks, self.P, self.Hk, self.D)
        torch.manual_seed(self.args.seed)

        def rand(*s):
            return torch.empty(*s, dtype=self.dtype, device=self.dev).uniform_(-1, 1)

        self.k = [rand(*shape) for _ in range(self.layers)]
        self.v = [rand(*shape) for _ in range(self.layers)]
        self.q = [rand(self.tokens, self.Hq, self.D) for _ in range(self.layers)]

    def dense_copy(self):
        """q [batch, Hq, q_len, D] and K/V [batch, Hk, kv_len, D] per layer, the
        same values as the paged cache (built once, for SDPA and Flex)."""
        if self.dense is not None:
            return self.dense
        if self.layers * self.dense_layer_bytes > self.free_bytes():
            raise Skip(f"a dense copy needs {self.layers * self.dense_layer_bytes / 2**30:.1f} GiB, "
                       f"{self.free_bytes() / 2**30:.1f} GiB are free")
        bt = self.block_table.to(self.dev).long()

        def dense(cache):  # [num_blocks, P, Hk, D] -> [batch, Hk, kv_len, D]
            rows = cache[bt].reshape(self.batch, self.pages * self.P, self.Hk, self.D)
            return rows[:, :self.kv_len].permute(0, 2, 1, 3).contiguous()

        qd = [q.view(self.batch, self.q_len, self.Hq, self.D).transpose(1, 2).contiguous()
              for q in self.q]
        self.dense = (qd, [dense(k) for k in self.k], [dense(v) for v in self.v])
        return self.dense

    def bytes_per_call(self):
        kv = 2 * self.batch * self.kv_len * self.Hk * self.D * self.esize
        return kv + 2 * self.tokens * self.Hq * self.D * self.esize

    def flop_per_call(self):
        if self.workload == "decode":
            keys = self.batch * self.kv_len
        else:  # causal, q_len == kv_len
            keys = self.batch * self.q_len * (self.q_len + 1) // 2
        return 4 * self.Hq * self.D * keys


# ---------------------------------------------------------------------------
# The sides. Each returns (steps, output): steps[l]() runs layer l; output()
# is layer 0's result as [tokens, Hq, D] after an eager call.
# ---------------------------------------------------------------------------

def setup_attnkit(sc, attnkit):
    if attnkit is None:
        raise Skip("attnkit not importable")
    torch = sc.torch
    name = "cuda_paged" if sc.dev.type == "cuda" else "cpu"
    cfg = attnkit.Config(num_qo_heads=sc.Hq, num_kv_heads=sc.Hk, head_dim=sc.D,
                         dtype=sc.args.dtype, device=str(sc.dev) if sc.dev.type == "cpu" else
                         f"cuda:{sc.dev.index or 0}", page_size=sc.P, causal=True,
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


class StepList(list):
    """steps, plus whatever must outlive them (a backend, a wrapper)."""

    def __init__(self, steps, keep):
        super().__init__(steps)
        self.keep = keep


def setup_flashinfer(sc, fi, tensor_cores, graph):
    if sc.dev.type != "cuda":
        raise Skip("CUDA only")
    torch = sc.torch
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
        if tensor_cores:
            raise Skip("decode only (the prefill wrapper is the flashinfer column)")
        w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(sc.qo_indptr_dev, sc.kv_indptr, sc.kv_indices, sc.last_page_len, sc.Hq, sc.Hk,
               sc.D, sc.P, causal=True, q_data_type=sc.dtype, kv_data_type=sc.dtype)
    steps = [(lambda l=l: w.run(sc.q[l], (sc.k[l], sc.v[l]), out=o[l])) for l in range(sc.layers)]
    return StepList(steps, (w, ws)), lambda: (steps[0](), o[0])[1]


def setup_sdpa(sc, backend_name):
    torch = sc.torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "math": SDPBackend.MATH}[backend_name]
    qd, kd, vd = sc.dense_copy()
    causal = sc.workload != "decode"  # a decode's one query sees every key
    gqa = sc.Hq != sc.Hk

    def make(expand):
        group = sc.Hq // sc.Hk
        ks = [k.repeat_interleave(group, dim=1) for k in kd] if expand else kd
        vs = [v.repeat_interleave(group, dim=1) for v in vd] if expand else vd

        def step(l):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qd[l], ks[l], vs[l], is_causal=causal,
                                                      enable_gqa=gqa and not expand)
        step(0)  # raises when the backend refuses
        return step, (ks, vs)

    try:
        step, keep = make(False)
        how = None
    except RuntimeError as e:
        if not gqa:
            raise Skip(f"sdpa {backend_name}: {str(e).splitlines()[0]}") from None
        if (sc.Hq // sc.Hk) * sc.layers * sc.dense_layer_bytes > sc.free_bytes():
            raise Skip(f"sdpa {backend_name} refused enable_gqa ({str(e).splitlines()[0]}); "
                       "repeated K/V would not fit") from None
        try:
            step, keep = make(True)
        except RuntimeError as e2:
            raise Skip(f"sdpa {backend_name}: {str(e2).splitlines()[0]}") from None
        how = "K/V heads repeated (enable_gqa refused)"
    steps = [(lambda l=l: step(l)) for l in range(sc.layers)]

    def output():
        return step(0).transpose(1, 2).reshape(sc.tokens, sc.Hq, sc.D)
    sl = StepList(steps, keep)
    sl.note = how
    return sl, output


_compiled_flex = []


def setup_flex(sc):
    torch = sc.torch
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception as e:
        raise Skip(f"no FlexAttention: {e}") from None
    if sc.dev.type != "cuda":
        raise Skip("CUDA only")
    qd, kd, vd = sc.dense_copy()
    if not _compiled_flex:  # one compiled function: torch recompiles per shape, then goes dynamic
        _compiled_flex.append(torch.compile(flex_attention))
    flex = _compiled_flex[0]
    mask = None
    if sc.workload != "decode":
        def causal(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx
        mask = create_block_mask(causal, None, None, sc.q_len, sc.kv_len, device=sc.dev)

    def step(l):
        return flex(qd[l], kd[l], vd[l], block_mask=mask, enable_gqa=sc.Hq != sc.Hk)
    try:
        step(0)
    except Exception as e:
        raise Skip(f"flex: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    steps = [(lambda l=l: step(l)) for l in range(sc.layers)]
    return StepList(steps, mask), lambda: step(0).transpose(1, 2).reshape(sc.tokens, sc.Hq, sc.D)


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
    for model in args.models:
        if "decode" in args.workloads:
            for b in args.batches:
                for kv in args.kv_lens:
                    yield model, "decode", b, 1, kv
        if "prefill" in args.workloads:
            for n in args.prefill_lens:
                yield model, "prefill", args.prefill_batch, n, n


def run_side(peer, sc, attnkit, fi, fi_reason, args):
    use_graph = args.graph == "on" and sc.workload == "decode"
    if peer == "attnkit":
        steps, out = setup_attnkit(sc, attnkit)
    elif peer in ("flashinfer", "flashinfer_tc"):
        if fi is None:
            raise Skip(fi_reason)
        steps, out = setup_flashinfer(sc, fi, peer == "flashinfer_tc", use_graph)
    elif peer in ("sdpa_flash", "sdpa_cudnn"):
        backend = peer.split("_")[1]
        if sc.dev.type != "cuda":
            backend = "math"
        steps, out = setup_sdpa(sc, backend)
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
    if fi is not None:
        print("# FlashInfer compiles its kernels on first use (minutes; cached under "
              f"{os.environ.get('FLASHINFER_WORKSPACE_BASE', '~')}/.cache/flashinfer)")
    sys.stdout.flush()

    fields = ["model", "workload", "batch", "q_len", "kv_len", "dtype", "page_size", "layers", "peer",
              "status", "median_us", "min_us", "samples", "graph", "ratio_vs_attnkit", "gbps", "tflops",
              "check_ref", "max_abs_diff", "check", "note"]
    rows = []
    csv_file = open(args.csv, "w", newline="")
    writer = csv.DictWriter(csv_file, fieldnames=fields)
    writer.writeheader()
    failed = False
    for model, workload, batch, q_len, kv_len in shapes(args):
        sc = Scene(torch, args, model, workload, batch, q_len, kv_len)
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
                       status=r["status"], note=r.get("note") or "")
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
    if not _header_printed:
        print(f"{'model':<15}{'workload':<9}{'batch':>6}{'q_len':>7}{'kv_len':>7}{'layers':>7}"
              f"{'attnkit_us':>12}  " + "".join(f"{p:>15}" for p in others)
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
          f"{ak:>12}  " + "".join(f"{cell(results[p], base is None):>15}" for p in others))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
