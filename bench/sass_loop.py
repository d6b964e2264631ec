#!/usr/bin/env python3
"""sass_loop.py - the key-tile loop of the Hopper prefill kernels, read from their SASS.

No GPU is needed: the SASS comes from `cuobjdump -sass` on any build that
holds the kernels (build/libattnkit.so, attnkit-bench, or the object of
src/cuda/prefill_wgmma.cu alone), or FILE is a listing it wrote (`cuobjdump
-sass [-fun NAME] FILE > listing.txt`, on the GPU machine say). cuobjdump
ships with the CUDA toolkit;
where a toolkit lacks it, PyPI's nvidia-cuda-cuobjdump wheel carries it
(its nvidia/cu13/bin on PATH).

For each instance of prefill_wgmma_kernel (every head-dim pair, f16 and
bf16, each pass) it finds the key-tile loops: the loops (a backward branch
and its target) that hold a tile's warpgroup MMAs and its 64 exponentials
a thread, one for each path of the NaN rule (attn.cuh: checked, and
clean, the one with two softmaxes, 128 exponentials, where its tiles go
ahead of the maxima, else the smaller) and each addressing (paged,
ragged). Of each it prints:

  - its length in instructions and its warpgroup MMAs (HGMMA);
  - the order of its waits for warpgroup MMAs (WARPGROUP.DEPBAR), its row
    maxima's shuffles (SHFL), its exponentials (MUFU.EX2) and its packing
    of P (F2FP): position, count, e.g. `173:DEPBAR 642:SHFLx4 703:EX2x2
    711:DEPBAR 751:EX2x64 977:F2FPx32`;
  - where the wait for the last P V (the loop's last `WARPGROUP.DEPBAR.LE
    gsb0, 0x0`) falls: after how many of the loop's exponentials, and
    whether after the row maxima (the loop's last SHFL.BFLY).

ptxas, not the source, decides that placement (a value given a register
the unfinished P V still reads makes it wait there). Measured (H200,
BENCHMARKS.md, 2026-12-04): the committed kernel waits after the maxima
and before the tile's exponentials; a build that waited after every
exponential was 1-2% slower at most shapes, and one whose wait ptxas
moved above the maxima 1-2% slower at the long shapes. --check guards the
maxima: exit status 1 when a loop waits for the last P V before its last
shuffle.

Usage: python3 bench/sass_loop.py FILE [--kernel REGEX] [--mix] [--check]
  --kernel  a regular expression over the mangled names (default: the
            pipelined instances, prefill_wgmma_kernel at DP <= 128); kernels
            without such a loop are left out
  --mix     the loop's instruction mix too (opcodes, modifiers dropped)
Exit status: 0; 1 when --check finds a wait before the maxima are done; 2
when cuobjdump fails or no kernel or loop matches.
"""

import argparse
import re
import subprocess
import sys
from collections import Counter

# the pipelined instances (prefill_wgmma.cu's PIPE: DP <= 128), any dtype and pass
DEFAULT = r"prefill_wgmma_kernelILi(64|80|96|112|128)ELi(64|80|96|112|128)E"
MARKS = {"WARPGROUP.DEPBAR": "DEPBAR", "SHFL": "SHFL", "MUFU.EX2": "EX2", "F2FP": "F2FP", "STL": "STL", "LDL": "LDL"}


def disassemble(path):
    """{mangled kernel name: [(address, instruction)]}"""
    try:
        with open(path, "rb") as f:
            elf = f.read(4) == b"\x7fELF"
        if elf:
            out = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
        else:  # a listing cuobjdump wrote
            with open(path, errors="replace") as f:
                out = f.read()
    except (OSError, subprocess.CalledProcessError) as e:
        fail(f"cuobjdump -sass {path}: {e}")
    kernels, cur = {}, None
    for line in out.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            while name in kernels:  # (the same kernel in another cubin of the file)
                name += "'"
            cur = kernels[name] = []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2)))
    return kernels


def fail(msg):
    print(f"sass_loop: {msg}", file=sys.stderr)
    sys.exit(2)


def opcode(ins):
    """the opcode with its modifiers, predicate dropped"""
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]


def key_tile_loops(code):
    """the key-tile loops (holding 8+ HGMMA and 64+ exponentials), smallest first, as (first, last) indices"""
    index = {a: i for i, (a, _) in enumerate(code)}
    loops = []
    for i, (a, ins) in enumerate(code):
        m = re.search(r"\bBRA(?:\.\w+)*\s+(?:!?U?P\w+,\s*)?0x([0-9a-f]+)", ins)
        if not m or int(m.group(1), 16) >= a or int(m.group(1), 16) not in index:
            continue
        first = index[int(m.group(1), 16)]
        ops = [opcode(x) for _, x in code[first : i + 1]]
        mma = sum(o.startswith("HGMMA") for o in ops)
        if mma >= 8 and sum(o == "MUFU.EX2" for o in ops) >= 64:
            loops.append((mma, first, i))
    # a tile's MMAs: the fewest of any such loop (an item's loop holds its first S and last P V too,
    # and its key-tile loop may lie outside it in the code)
    fewest = min((l[0] for l in loops), default=0)
    return sorted({(f, i) for m, f, i in loops if m == fewest}, key=lambda l: l[1] - l[0])


def describe(code, first, last):
    """(the order string, exponentials before the last wait for every MMA, total exponentials,
    whether that wait follows the last shuffle, HGMMA, the opcodes)"""
    ops = [opcode(x) for _, x in code[first : last + 1]]
    order = []  # runs of [position, count, mark]
    for k, o in enumerate(ops):
        mark = next((v for p, v in MARKS.items() if o.startswith(p)), None)
        if mark is None:
            continue
        if order and order[-1][2] == mark:
            order[-1][1] += 1
        else:
            order.append([k, 1, mark])
    text = " ".join(f"{k}:{m}" + (f"x{n}" if n > 1 else "") for k, n, m in order)
    # the wait for every MMA in flight (DEPBAR.LE gsb0, 0x0): the last P V's
    waits = [k for k, (_, x) in enumerate(code[first : last + 1]) if re.search(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0\b", x)]
    exps = [k for k, o in enumerate(ops) if o == "MUFU.EX2"]
    before = sum(k < waits[-1] for k in exps) if waits else 0
    shuffles = [k for k, o in enumerate(ops) if o.startswith("SHFL")]
    after_max = bool(waits) and bool(shuffles) and waits[-1] > shuffles[-1]
    return text, before, len(exps), after_max, sum(o.startswith("HGMMA") for o in ops), ops


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--kernel", default=DEFAULT)
    ap.add_argument("--mix", action="store_true")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    kernels = {n: c for n, c in disassemble(a.file).items() if re.search(a.kernel, n)}
    if not kernels:
        fail(f"no kernel of {a.file} matches {a.kernel}")
    failed, found = 0, 0
    for name in sorted(kernels):
        code = kernels[name]
        loops = key_tile_loops(code)
        if not loops:
            continue
        print(f"{name}: {len(code)} instructions, {len(loops)} key-tile loop(s)")
        two_paths = any(describe(code, f, l)[2] >= 128 for f, l in loops)
        for first, last in loops:
            found += 1
            text, before, n_exp, after_max, n_mma, ops = describe(code, first, last)
            # (two of each: the kernel's two addressings, paged and ragged). The clean loop holds two
            # softmaxes where its tiles go ahead (attn.cuh's softmax_rows_ahead beside softmax_rows:
            # 128 exponentials and more); else it is the shorter
            if two_paths:
                path = "clean" if n_exp >= 128 else "checked"
            else:
                path = "clean" if last - first < 1.5 * (loops[0][1] - loops[0][0]) else "checked"
            print(f"  {path}: {last - first + 1} instructions, {n_mma} HGMMA; {text}")
            print(f"    the last P V's wait: {'after' if after_max else 'BEFORE'} the row maxima, "
                  f"after {before} of {n_exp} exponentials")
            if a.mix:
                mix = Counter(o.split(".")[0] for o in ops)
                print("    " + " ".join(f"{o} {n}" for o, n in mix.most_common()))
            failed += a.check and not after_max
    if not found:
        fail("no key-tile loop found")
    if failed:
        print(f"sass_loop: {failed} loop(s) wait for the last P V before their row maxima are done")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
