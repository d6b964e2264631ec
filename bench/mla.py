#!/usr/bin/env python3
"""bench/mla.py - MLA decode (DeepSeek-V3's absorbed form) on the GPU: attnkit's cuda_mla beside FlashInfer's MLA.

    python3 bench/mla.py [--lib build/libattnkit.so] [--csv FILE] [--quick]

Every side reads the same latent cache: one row of 576 values a token (512
latent + 64 rotary), pages of 64 tokens, bf16; q [tokens, heads, 576], o
[tokens, heads, 512]; every request on the same kv_len; sm_scale 1/sqrt(192)
as DeepSeek-V3. attnkit reads the rows as they are (a K-only paged cache);
FlashInfer's BatchMLAPagedAttentionWrapper takes the latent and rotary parts
as two caches (copies of the same values) and q as q_nope / q_pe, with each
of its backends that builds here ('fa2', the portable one, and 'fa3', its
Hopper default behind 'auto').

Each side's call is captured 10 times into one CUDA graph and the graph is
replayed (median of rounds), so no Python cost is timed. Printed per shape:
microseconds a call (one side per --kernels entry for attnkit), TFLOP/s (2 x heads x (576 + 512) a visible key), the
fraction of a device-to-device copy's bandwidth (measured in the same run)
that reading each latent row once (plus q and o) would take, and which bound
applies: an H100 does about 240 FLOP per latent byte at its balance point,
so 128 heads (272 FLOP a byte at q_len 1) are compute-bound, 16 heads (34)
memory-bound. "attnkit x": the side's time over attnkit's (above 1: attnkit
is faster). Outputs are compared with attnkit's (max abs difference).

The MLA constants, attnkit's MLA backend and call, FlashInfer's wrapper
and operands, and the byte and FLOP counts come from bench/peers.py, whose
mla workload (python3 bench/peers.py --workloads mla) runs the same sides
beside SDPA and FlashMLA with peers.py's method (layers over 4x the L2,
CSV). The FLOP count is causal: with q_len > 1, token i of q_len sees
kv_len - q_len + i + 1 keys.
"""
import argparse
import csv
import os
import statistics
import sys

from fp8 import copy_ceiling, import_libs  # bench/fp8.py: the same libraries, the same eager copy ceiling
# bench/peers.py's MLA pieces (its mla workload runs the same sides beside SDPA and FlashMLA)
from peers import (MLA_DQK as DQK, MLA_LAT as LAT, MLA_SM_SCALE, attnkit_mla_backend, attnkit_mla_call,
                   flashinfer_mla_operands, flashinfer_mla_wrapper, mla_bytes, mla_flop)

PAGE = 64


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", help="libattnkit.so (default: ATTNKIT_LIB, else the build folder's)")
    p.add_argument("--csv", help="write the rows here too")
    p.add_argument("--quick", action="store_true", help="fewer shapes")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--backends", default="fa2,fa3", help="FlashInfer MLA backends to try")
    p.add_argument("--kernels", default="",
                   help="attnkit's MLA kernels to time, each a side (AK_CUDA_MLA: wgmma, wide); default: the one "
                        "cuda_mla picks")
    p.add_argument("--shapes", default="",
                   help="HEADSxBATCHxKV_LENxQ_LEN,... instead of the default list (e.g. 128x64x8192x1)")
    return p.parse_args()


class Scene:
    """batch requests of kv_len keys and q_len query tokens each, over one
    paged latent cache (pages in a shuffled order)."""

    def __init__(self, torch, heads, batch, kv_len, q_len, gen):
        self.heads, self.batch, self.kv_len, self.q_len = heads, batch, kv_len, q_len
        pages = (kv_len + PAGE - 1) // PAGE
        self.num_blocks = batch * pages
        dev = "cuda"
        self.latent = (torch.randn((self.num_blocks, PAGE, DQK), generator=gen, device=dev) * 0.5).to(torch.bfloat16)
        self.tokens = batch * q_len
        self.q = (torch.randn((self.tokens, heads, DQK), generator=gen, device=dev) * 0.5).to(torch.bfloat16)
        perm = torch.randperm(self.num_blocks, generator=torch.Generator().manual_seed(7)).to(torch.int32)
        self.block_table = perm.reshape(batch, pages)
        self.kv_lens = [kv_len] * batch
        self.qo_indptr = [i * q_len for i in range(batch + 1)]
        self.sm_scale = MLA_SM_SCALE

    def flops(self):
        """2 x heads x (576 + 512) a visible key (q_len > 1: causal, token i
        of q_len sees kv_len - q_len + i + 1 keys)"""
        return float(mla_flop([(self.q_len, self.kv_len)] * self.batch, self.heads))

    def bytes(self):
        """each latent row read once, q read and o written"""
        return mla_bytes([(self.q_len, self.kv_len)] * self.batch, self.heads)


def attnkit_side(torch, attnkit, sc, kernel=""):
    """kernel: AK_CUDA_MLA for this backend (read when it is created), or
    "" for cuda_mla's own choice"""
    if kernel:
        os.environ["AK_CUDA_MLA"] = kernel
    else:
        os.environ.pop("AK_CUDA_MLA", None)
    b = attnkit_mla_backend(attnkit, sc.heads, sc.qo_indptr, sc.kv_lens, sc.block_table, sc.num_blocks, PAGE,
                            sc.sm_scale)
    o = torch.empty(sc.tokens, sc.heads, LAT, dtype=torch.bfloat16, device="cuda")
    call = attnkit_mla_call(b, sc.q, sc.latent, o)
    return (lambda: call()), o, b


def flashinfer_side(torch, fi, sc, backend):
    """FlashInfer's MLA wrapper on contiguous copies of the latent and rotary
    parts (bench/peers.py's mla workload passes views of the one cache)"""
    dev = "cuda"
    qo_indptr = torch.tensor(sc.qo_indptr, dtype=torch.int32, device=dev)
    pages = sc.block_table.shape[1]
    kv_indptr = torch.arange(0, sc.num_blocks + 1, pages, dtype=torch.int32, device=dev)
    kv_indices = sc.block_table.reshape(-1).to(dev)
    kv_len_arr = torch.tensor(sc.kv_lens, dtype=torch.int32, device=dev)
    w, ws = flashinfer_mla_wrapper(torch, fi, backend, qo_indptr, kv_indptr, kv_indices, kv_len_arr, sc.heads,
                                   PAGE, sc.sm_scale, torch.bfloat16, causal=True)
    ckv, kpe, q_nope, q_pe = flashinfer_mla_operands(sc.latent, sc.q, copy=True)
    o = torch.empty(sc.tokens, sc.heads, LAT, dtype=torch.bfloat16, device="cuda")
    call = lambda: w.run(q_nope, q_pe, ckv, kpe, out=o)
    return call, o, (w, ws, ckv, kpe, q_nope, q_pe)


def time_graph(torch, call, rounds, iters=10):
    """median ms a call: `iters` calls captured into one graph, replayed
    `rounds` times (eager when the capture fails)"""
    call()
    torch.cuda.synchronize()
    run = None
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            call()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                call()
        run, how = g.replay, "graph"
    except Exception as e:
        print(f"#   capture failed ({type(e).__name__}: {str(e)[:100]}): timed eagerly", file=sys.stderr)
        torch.cuda.synchronize()

        def run():
            for _ in range(iters):
                call()
        how = "eager"
    run()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(rounds):
        a.record()
        run()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b) / iters)
    return statistics.median(ms), how


def main():
    args = parse_args()
    torch, attnkit, fi = import_libs(args)
    ceiling = copy_ceiling(torch, args.rounds)
    print(f"# {torch.cuda.get_device_name()}; device-to-device copy: {ceiling:.1f} GB/s (read + written)")
    shapes = [(128, 64, 8192, 1), (16, 64, 8192, 1), (128, 1, 32768, 1), (128, 128, 4096, 2)]
    if args.shapes:
        shapes = [tuple(int(x) for x in sh.split("x")) for sh in args.shapes.split(",")]
    elif not args.quick:
        shapes = [(128, 64, 8192, 1), (128, 128, 4096, 1), (128, 1, 32768, 1), (128, 128, 4096, 2),
                  (16, 64, 8192, 1), (16, 128, 4096, 1), (16, 1, 32768, 1), (64, 64, 8192, 1), (32, 64, 8192, 1)]
    rows = []
    print(f"{'side':24s} {'heads':>5s} {'batch':>5s} {'kv_len':>6s} {'q':>2s} {'us':>9s} {'TFLOP/s':>8s} "
          f"{'frac':>5s} {'bound':>7s} {'attnkit x':>9s} {'max|diff|':>9s}")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    for heads, batch, kv_len, q_len in shapes:
        sc = Scene(torch, heads, batch, kv_len, q_len, gen)
        bound = "compute" if sc.flops() / (sc.batch * sc.kv_len * DQK * 2) > 240 else "memory"
        kernels = [k for k in args.kernels.split(",") if k] or [""]
        sides = [(f"attnkit cuda_mla{' ' + k if k else ''}", lambda k=k: attnkit_side(torch, attnkit, sc, k))
                 for k in kernels]
        if fi:
            for be in [x for x in args.backends.split(",") if x]:
                sides.append((f"flashinfer mla {be}", lambda be=be: flashinfer_side(torch, fi, sc, be)))
        ref, base = None, None
        for name, make in sides:
            try:
                call, o, keep = make()
                ms, how = time_graph(torch, call, args.rounds)
            except Exception as e:
                print(f"{name:24s} {heads:5d} {batch:5d} {kv_len:6d} {q_len:2d} skipped: {type(e).__name__}: "
                      f"{str(e)[:150]}")
                continue
            call()
            torch.cuda.synchronize()
            if ref is None:
                ref, base = o.float().clone(), ms
                diff = 0.0
            else:
                diff = (o.float() - ref).abs().max().item()
            tf = sc.flops() / ms / 1e9
            gbs = sc.bytes() / ms / 1e6
            print(f"{name:24s} {heads:5d} {batch:5d} {kv_len:6d} {q_len:2d} {ms * 1e3:9.1f} {tf:8.1f} "
                  f"{gbs / ceiling:5.2f} {bound:>7s} {ms / base:9.2f} {diff:9.2e}")
            rows.append(dict(side=name, heads=heads, batch=batch, kv_len=kv_len, q_len=q_len, us=f"{ms * 1e3:.2f}",
                             tflops=f"{tf:.1f}", frac=f"{gbs / ceiling:.3f}", bound=bound,
                             attnkit_over_side=f"{ms / base:.3f}", max_abs_diff=f"{diff:.3g}", timed=how,
                             ceiling_gbs=f"{ceiling:.1f}"))
            del keep
        sc = None  # its tensors go before the next shape's
        torch.cuda.empty_cache()
    if args.csv and rows:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
