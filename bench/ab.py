#!/usr/bin/env python3
"""ab.py - two builds of attnkit-bench (or more) timed side by side, shape by shape, in one run.

A kernel change is judged against the committed kernel on the same machine,
in the same run, rounds interleaved (base, new, base, new, ...), so that a
clock or a neighbour that drifts during the run moves both sides alike. For
each shape (a list of attnkit-bench options) it runs

    BASE --device D --json SHAPE     and     NEW --device D --json SHAPE

ROUNDS times each, and prints each side's medians (attnkit-bench's median of
its own samples, one a round), and new / base: the median of the new rounds
over the median of the base rounds (below 1: the new build is faster).
Several NEW builds are timed in the same rounds (base, new 1, new 2, ...,
then base, new 2, ..., new 1: their order rotated each round), each
against the base.

Shapes: --shape "OPTIONS" (repeatable), or --shapes FILE (one a line, #
comments), or the default set: bf16 prefill on cuda_paged at page 128 (d128
16 x 1024, 4 x 4096, 1 x 16384, 64 x 512, non-causal 4 x 4096; d64 and
d256 16 x 1024 and 4 x 4096), phi3-mini (d96) at page 16, and the mixed
step under graphs.

Usage: python3 bench/ab.py BASE NEW [NEW ...] [--rounds 2] [--device cuda] [--shape "..."]... [--shapes FILE]
Exit status: 0 when every run gave a time, 1 otherwise, 2 on bad arguments.
"""

import argparse
import shlex
import statistics
import sys

from bench_json import bench_median_ms

PREFILL = "--backend cuda_paged --dtype bf16 --workload prefill --page-size 128"
DEFAULT_SHAPES = [
    f"{PREFILL} --batch 16 --kv-len 1024",
    f"{PREFILL} --batch 4 --kv-len 4096",
    f"{PREFILL} --batch 1 --kv-len 16384",
    f"{PREFILL} --batch 64 --kv-len 512",
    f"{PREFILL} --batch 4 --kv-len 4096 --non-causal",
    f"{PREFILL} --batch 16 --kv-len 1024 --head-dim 64",
    f"{PREFILL} --batch 4 --kv-len 4096 --head-dim 64",
    f"{PREFILL} --batch 16 --kv-len 1024 --head-dim 256",
    f"{PREFILL} --batch 4 --kv-len 4096 --head-dim 256",
    "--backend cuda_paged --dtype bf16 --workload prefill --page-size 16 --batch 4 --kv-len 4096 --model phi3-mini",
    "--backend cuda_paged --dtype bf16 --workload mixed --graph --page-size 16",
]


def median_ms(bench, device, shape, timeout):
    """attnkit-bench's median time (ms) of the shape, or None (why on stderr)."""
    ms, why = bench_median_ms([bench, "--device", device, "--json"] + shlex.split(shape), timeout)
    if ms is None:
        print(f"# {bench} {shape}: no time ({why})", file=sys.stderr)
    return ms


def times(ms):
    return " ".join("%.4f" % x for x in ms) or "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="the committed build's attnkit-bench")
    ap.add_argument("new", nargs="+", help="the changed build's attnkit-bench (or several)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", action="append", default=[], help="attnkit-bench options of one shape (repeatable)")
    ap.add_argument("--shapes", help="a file of shapes, one a line")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    shapes = list(a.shape)
    if a.shapes:
        with open(a.shapes) as f:
            shapes += [s.strip() for s in f if s.strip() and not s.lstrip().startswith("#")]
    if not shapes:
        shapes = DEFAULT_SHAPES
    ok = True
    n = len(a.new)
    news = [""] if n == 1 else [" %d" % (i + 1) for i in range(n)]
    print("# shape | base ms (rounds) | " + " | ".join("new%s ms (rounds) | new%s / base" % (x, x) for x in news))
    for shape in shapes:
        runs = [[] for _ in range(n + 1)]  # base, then each new build
        for r in range(a.rounds):
            # the base first, then the new builds in an order rotated each
            # round, so that drift within a round favours none of them
            order = [0] + [1 + (i + r) % n for i in range(n)]
            for side, out in ((([a.base] + a.new)[j], runs[j]) for j in order):
                t = median_ms(side, a.device, shape, a.timeout)
                if t is None:
                    ok = False
                else:
                    out.append(t)
        base = runs[0]
        cols = [times(base)]
        for new in runs[1:]:
            ratio = "%.3f" % (statistics.median(new) / statistics.median(base)) if base and new else "-"
            cols += [times(new), ratio]
        print(f"{shape} | " + " | ".join(cols), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
