#!/usr/bin/env python3
"""cpu_scaling.py - attnkit's CPU backend and PyTorch's CPU SDPA over thread counts.

The llama3-8b prefill of cpu_sdpa.py (2048 tokens, causal, 32/8 heads, head_dim
128), one dtype, at each thread count: GFLOP/s of both sides, each side's
parallel efficiency (GFLOP/s / (threads x its own 1-thread GFLOP/s)) and the
ratio attnkit / torch, as one compact table:

    python3 bench/cpu_scaling.py                         # 1 2 4 8 ... nproc, bf16
    python3 bench/cpu_scaling.py --threads 1,2,4,8,16 --dtype f32
    python3 bench/cpu_scaling.py --isa avx512            # AK_CPU_ISA for attnkit (default: its choice)

With an attnkit-bench built with -DAK_CPU_PHASE_TIMES=ON (--bench PATH), each row
also gives the cpu backend's pack time and the share of threads x wall its
threads spent in work items (the rest is waiting: imbalance, barriers).

Needs torch (a CPU build is enough) and a built attnkit-bench. Pinning is the
caller's: OMP_PLACES / OMP_PROC_BIND in the environment reach both sides.
"""

import argparse
import os
import re
import sys

import cpu_sdpa


def phase_summary(row):
    """(pack ms, items busy %) from an AK_CPU_PHASE_TIMES bench's stderr, or None."""
    text = row.get("stderr", "") if row else ""
    busy = re.search(r"# items busy ([0-9.]+)%", text)
    if not busy:
        return None
    packs = [float(m.group(1)) for m in re.finditer(r"^#\s+\d+\s+[0-9.]+\s+([0-9.]+)", text, re.M)]
    return (max(packs) if packs else float("nan"), float(busy.group(1)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="", help="comma-separated thread counts (default 1, 2, 4, ... nproc)")
    ap.add_argument("--dtype", default="bf16", choices=("f32", "bf16", "f16"))
    ap.add_argument("--seq-len", type=int, default=cpu_sdpa.DEFAULT_SEQ_LEN)
    ap.add_argument("--iters", type=int, default=cpu_sdpa.DEFAULT_ITERS, help="timed calls per side and count")
    ap.add_argument("--bench", default=cpu_sdpa.DEFAULT_BENCH, help="path of attnkit-bench")
    ap.add_argument("--isa", default="", help="AK_CPU_ISA for attnkit (amx, avx512bf16, avx512, avx2, scalar)")
    ap.add_argument("--no-torch", action="store_true", help="attnkit only")
    args = ap.parse_args()

    nproc = len(cpu_sdpa.START_AFFINITY) if cpu_sdpa.START_AFFINITY else os.cpu_count()
    if args.threads:
        counts = [int(t) for t in args.threads.split(",") if t.strip()]
    else:
        counts, t = [], 1
        while t < nproc:
            counts.append(t)
            t *= 2
        counts.append(nproc)
    if not counts or min(counts) < 1:
        ap.error("--threads: positive counts")
    if args.isa:
        os.environ["AK_CPU_ISA"] = args.isa

    torch = None if args.no_torch else cpu_sdpa.import_torch()
    if torch is None and not args.no_torch:
        return 2
    flops = cpu_sdpa.causal_flops(args.seq_len)
    print(cpu_sdpa.host_line())
    print("# %s prefill %d causal %s, %d/%d heads, head_dim %d; medians of %d calls; %d CPUs; attnkit isa %s%s" % (
        cpu_sdpa.MODEL, args.seq_len, args.dtype, cpu_sdpa.NUM_QO_HEADS, cpu_sdpa.NUM_KV_HEADS,
        cpu_sdpa.HEAD_DIM, args.iters, nproc, args.isa or "auto",
        "; OMP_PROC_BIND=" + os.environ["OMP_PROC_BIND"] if os.environ.get("OMP_PROC_BIND") else ""))
    print("# eff: GFLOP/s per thread over the first row's, per side; pack_ms, busy%: AK_CPU_PHASE_TIMES builds")
    print("%7s %10s %6s %10s %6s %8s %9s %6s" % ("threads", "attnkit", "eff", "torch", "eff", "ak/torch",
                                                  "pack_ms", "busy%"))
    base_a = base_t = None
    status = 0
    for t in counts:
        row, msg = cpu_sdpa.attnkit_run(args.bench, "cpu", args.dtype, args.seq_len, t, args.iters, False)
        a = row.get("gflops") if row and not msg else None
        g = None
        if torch is not None:
            torch.set_num_threads(t)
            try:
                t_ms, _ = cpu_sdpa.torch_sdpa_ms(torch, args.dtype, args.seq_len, args.iters)
                g = flops / (t_ms * 1e-3) / 1e9
            except RuntimeError as e:
                msg = (msg + "; " if msg else "") + "torch: %s" % e
        if base_a is None and a:
            base_a = a / t
        if base_t is None and g:
            base_t = g / t
        ph = phase_summary(row)

        def fmt(x, spec):
            return spec % x if x is not None else "-"

        print("%7d %10s %6s %10s %6s %8s %9s %6s" % (
            t, fmt(a, "%.0f"), fmt(a / (t * base_a) if a and base_a else None, "%.2f"),
            fmt(g, "%.0f"), fmt(g / (t * base_t) if g and base_t else None, "%.2f"),
            fmt(a / g if a and g else None, "%.2fx"), fmt(ph[0] if ph else None, "%.3f"),
            fmt(ph[1] if ph else None, "%.1f")))
        sys.stdout.flush()
        if msg:
            print("#   %d threads: %s" % (t, msg))
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
