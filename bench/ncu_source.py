#!/usr/bin/env python3
"""ncu_source.py - where a kernel's instructions and stall samples go, per SASS instruction, from Nsight Compute.

Reads the source page of an Nsight Compute report as CSV (one kernel a
file), written on the GPU machine by

    ncu --clock-control none --kernel-name regex:prefill --launch-skip 2 --launch-count 1 \\
        --section SourceCounters --section WarpStateStats --import-source no -f -o rep \\
        build/attnkit-bench --device cuda --backend cuda_paged --dtype bf16 --workload prefill \\
        --page-size 128 --batch 4 --kv-len 4096 --iters 3
    ncu -i rep.ncu-rep --page source --csv --print-source sass > rep.csv

and prints, for each file given (two side by side: attnkit's kernel and a
peer's):

  - instructions executed, stall samples and their reasons (shares of the
    samples; a sample is a warp's state at an instant, so the shares are
    of warp time, every resident warp counted: idle producer warps too);
  - instructions and samples by opcode (the first word of the SASS, its
    modifiers dropped);
  - the code by how often it runs: instructions executed about N times
    each (within 2%) grouped, largest first. In a persistent kernel each
    group is a level of the loop nest: the key-tile loop (tiles x warps),
    the per-item code (items x warps), the producer's per-tile code.

--role START:END:NAME (offsets from the kernel's first instruction, hex,
repeatable; the same ranges for every file given) adds a line a role: the
instructions, samples and stall reasons of that address range (a
warp-specialized kernel's consumer and producer code; their ranges come
from the disassembly or from the groups above).

Usage: python3 bench/ncu_source.py REP.csv [PEER.csv] [--role 0:4e000:consumer]... [--top 20]
Exit status: 0, or 2 when a file holds no source page.
"""

import argparse
import csv
import sys
from collections import Counter, defaultdict

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path):
    """(kernel name, rows of (offset, sass, executed, samples, {reason: samples}))"""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    name = ""
    for i, r in enumerate(rows):
        if r and r[0] == "Kernel Name":
            name = r[1] if len(r) > 1 else ""
        if r and r[0] == "Address":
            header = r
            body = rows[i + 1:]
            break
    else:
        return name, []
    col = {h: j for j, h in enumerate(header)}
    if "Source" not in col or EXECUTED not in col or SAMPLES not in col:
        return name, []
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in body:
        if len(r) < len(header):
            continue
        try:
            addr = int(r[col["Address"]], 16)
        except ValueError:
            continue

        def num(key):
            try:
                return float(r[col[key]] or 0)
            except ValueError:
                return 0.0

        out.append((addr, r[col["Source"]].strip(), num(EXECUTED), num(SAMPLES), {k[6:]: num(k) for k in reasons}))
    if not out:
        return name, []
    base = min(a for a, *_ in out)
    return name, [(a - base, *rest) for a, *rest in out]


def opcode(sass):
    words = sass.split()
    if not words:
        return "?"
    w = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return w.split(".")[0]


def summary(rows):
    ins = sum(r[2] for r in rows)
    smp = sum(r[3] for r in rows)
    why = Counter()
    for r in rows:
        why.update(r[4])
    return ins, smp, why


def reasons_line(why, smp, n=8):
    return ", ".join(f"{k} {v / smp:.2f}" for k, v in why.most_common(n) if v > 0) if smp else "-"


def groups(rows):
    """instructions executed about equally often (within 2%), largest total first"""
    counts = sorted({r[2] for r in rows if r[2] > 0})
    level = {}
    lead = None
    for c in counts:
        if lead is None or c > lead * 1.02:
            lead = c
        level[c] = lead
    g = defaultdict(lambda: [0, 0.0, 0.0])
    for r in rows:
        if r[2] > 0:
            e = g[level[r[2]]]
            e[0] += 1
            e[1] += r[2]
            e[2] += r[3]
    return sorted(g.items(), key=lambda kv: -kv[1][1])


def report(path, name, rows, roles, top):
    ins, smp, why = summary(rows)
    print(f"== {path}")
    print(f"kernel: {name[:160]}")
    print(f"instructions executed {ins / 1e6:.2f} M, stall samples {smp:.0f}")
    print(f"stall reasons (share of samples): {reasons_line(why, smp, 12)}")
    for lo, hi, role in roles:
        sel = [r for r in rows if lo <= r[0] < hi]
        ri, rs, rw = summary(sel)
        print(f"  {role} [{lo:x}, {hi:x}): {ri / 1e6:.2f} M instructions ({100 * ri / max(ins, 1):.1f}%), "
              f"{100 * rs / max(smp, 1):.1f}% of samples: {reasons_line(rw, rs)}")
    by_ins, by_smp = Counter(), Counter()
    for r in rows:
        by_ins[opcode(r[1])] += r[2]
        by_smp[opcode(r[1])] += r[3]
    print(f"by opcode (top {top}): M instructions, % of samples")
    for op, v in by_ins.most_common(top):
        print(f"  {op:12s} {v / 1e6:8.2f}  {100 * by_smp[op] / max(smp, 1):5.1f}%")
    print("by how often the code runs: times each, static instructions, M instructions, % of samples")
    for times, (n, v, s) in groups(rows)[:top]:
        print(f"  {times / 1e3:9.1f} K  {n:6d}  {v / 1e6:8.2f}  {100 * s / max(smp, 1):5.1f}%")
    print()


def parse_role(text):
    try:
        lo, hi, name = text.split(":", 2)
        return int(lo, 16), int(hi, 16), name
    except ValueError:
        raise argparse.ArgumentTypeError(f"--role wants START:END:NAME (hex offsets), not {text!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="CSV of ncu's source page (one kernel), one or two")
    ap.add_argument("--role", type=parse_role, action="append", default=[],
                    help="START:END:NAME, offsets in hex from the kernel's first instruction (repeatable)")
    ap.add_argument("--top", type=int, default=20, help="rows of the opcode and how-often tables (20)")
    a = ap.parse_args()
    status = 0
    for path in a.files:
        name, rows = load(path)
        if not rows:
            print(f"{path}: no source page (ncu -i REP --page source --csv --print-source sass)", file=sys.stderr)
            status = 2
            continue
        report(path, name, rows, a.role, a.top)
    return status


if __name__ == "__main__":
    sys.exit(main())
