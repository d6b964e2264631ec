#!/usr/bin/env python3
"""ncu_source.py - where a kernel's instructions and stall samples go, per SASS instruction, from Nsight Compute.

Reads the source page of an Nsight Compute report as CSV (one kernel a
file), written on the GPU machine by

    ncu --clock-control none --kernel-name regex:prefill --launch-skip 2 --launch-count 1 \\
        --section SourceCounters --section WarpStateStats --import-source no -f -o rep \\
        build/attnkit-bench --device cuda --backend cuda_paged --dtype bf16 --workload prefill \\
        --page-size 128 --batch 4 --kv-len 4096 --iters 3
    ncu -i rep.ncu-rep --page source --csv --print-source sass > rep.csv

and prints, for each file given (one after the other: attnkit's kernel,
then a peer's profiled the same way):

  - instructions executed, stall samples and their reasons (shares of the
    samples; a sample is a warp's state at an instant, so the shares are
    of warp time, every resident warp counted: idle producer warps too);
  - instructions and samples by opcode (the first word of the SASS, its
    modifiers dropped);
  - the code by how often it runs: instructions executed about equally
    often (each count within 2% of the group's lowest, printed) grouped,
    largest total first. In a persistent kernel the largest groups are
    mostly the levels of its loop nest: the key-tile loop (tiles x warps),
    the code once an item (items x warps), the producer's code a tile; a
    group can also hold unrelated code of the same count (a polling loop).

--role START:END:NAME (offsets from the kernel's first instruction, hex,
repeatable) adds a line for each role, for the first file: the
instructions, samples and stall reasons of that address range (a
warp-specialized kernel's consumer and producer code; their ranges come
from the disassembly or from the groups above); --peer-role the same for
the second file.

Usage: python3 bench/ncu_source.py REP.csv [PEER.csv] [--role 0:4e000:consumers]... [--peer-role ...]... [--top 20]
Exit status: 0; 1 when a file cannot be read; 2 on bad arguments, or when a
file holds no source page with the instruction and sample columns, or
more than one kernel.
"""

import argparse
import csv
import sys
from collections import Counter, defaultdict

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


class NoSourcePage(Exception):
    pass


def load(path):
    """(kernel name, rows of (offset, sass, executed, samples, {reason: samples}));
    raises NoSourcePage saying what is missing"""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    kernels = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"]
    if len(kernels) > 1:
        raise NoSourcePage(f"{len(kernels)} kernels (profile one launch: --launch-count 1)")
    name = rows[kernels[0]][1] if kernels and len(rows[kernels[0]]) > 1 else ""
    at = [i for i, r in enumerate(rows) if r and r[0] == "Address"]
    if not at:
        raise NoSourcePage("no source page (ncu -i REP --page source --csv --print-source sass)")
    header, body = rows[at[0]], rows[at[0] + 1:]
    col = {h: j for j, h in enumerate(header)}
    missing = [k for k in ("Source", EXECUTED, SAMPLES) if k not in col]
    if missing:
        raise NoSourcePage(f"no column {', '.join(repr(k) for k in missing)} (profile with --section "
                           "SourceCounters --section WarpStateStats)")
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    bad = Counter()
    out = []
    for r in body:
        if len(r) < len(header):
            continue
        try:
            addr = int(r[col["Address"]], 16)
        except ValueError:
            continue

        def num(key):
            cell = r[col[key]].replace(",", "").strip()  # (ncu may print 1,234)
            if cell in ("", "-", "N/A", "n/a"):
                return 0.0
            try:
                return float(cell)
            except ValueError:
                bad[key] += 1
                return 0.0

        out.append((addr, r[col["Source"]].strip(), num(EXECUTED), num(SAMPLES), {k[6:]: num(k) for k in reasons}))
    for key, n in bad.items():
        print(f"{path}: {n} cells of {key!r} not a number, counted as 0", file=sys.stderr)
    if not out:
        raise NoSourcePage("a source page with no instruction rows")
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
    print("by how often the code runs: times each (the group's lowest), static instructions, M instructions, "
          "% of samples")
    for times, (n, v, s) in groups(rows)[:top]:
        print(f"  {times / 1e3:9.1f} K  {n:6d}  {v / 1e6:8.2f}  {100 * s / max(smp, 1):5.1f}%")
    print()


def parse_role(text):
    try:
        lo, hi, name = text.split(":", 2)
        lo, hi = int(lo, 16), int(hi, 16)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants START:END:NAME (hex offsets), not {text!r}")
    if not 0 <= lo < hi:
        raise argparse.ArgumentTypeError(f"wants 0 <= START < END, not {text!r}")
    return lo, hi, name


def positive(text):
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"wants a count of 1 or more, not {text!r}")
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="CSV of ncu's source page (one kernel), one or two")
    ap.add_argument("--role", type=parse_role, action="append", default=[],
                    help="START:END:NAME of the first file, offsets in hex from the kernel's first instruction "
                         "(repeatable)")
    ap.add_argument("--peer-role", type=parse_role, action="append", default=[],
                    help="the same for the second file")
    ap.add_argument("--top", type=positive, default=20, help="rows of the opcode and how-often tables (20)")
    a = ap.parse_args()
    if len(a.files) > 2:
        ap.error("one or two files")
    status = 0
    for path, roles in zip(a.files, (a.role, a.peer_role)):
        try:
            name, rows = load(path)
        except OSError as e:
            print(f"{path}: {e.strerror}", file=sys.stderr)
            return 1
        except NoSourcePage as e:
            print(f"{path}: {e}", file=sys.stderr)
            status = 2
            continue
        report(path, name, rows, roles, a.top)
    return status


if __name__ == "__main__":
    sys.exit(main())
