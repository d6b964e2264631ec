#!/usr/bin/env python3
"""prefill_clocks.py - where a wgmma prefill item's time goes, from the clock stamps of a diagnostic build.

A build configured with -DAK_PREFILL_CLOCKS=ON stores clock64() at fixed
points of each item of the wgmma prefill kernel (src/cuda/producer.cuh,
prefill_wgmma.cu), for the first thread of each warpgroup, and the engine
writes the last launch's stamps at destroy to the file AK_PREFILL_CLOCKS_OUT
names:

    AK_PREFILL_CLOCKS_OUT=clk.bin build-clk/attnkit-bench --device cuda --backend cuda_paged \\
        --dtype bf16 --workload prefill --page-size 128 --batch 16 --kv-len 1024 --layers 1 --iters 5
    python3 bench/prefill_clocks.py clk.bin [--ghz 1.98]

It prints, for each consumer warpgroup and the producer, the median and mean
of each phase over the items of two key tiles or more (the pipelined path,
head dims up to 128; at DP 256 the loop stamps are absent); then warpgroup
0's time an item by the item's key tiles (from its start to the next
item's), and the time the tensor pipe waits between two items (the last
warpgroup's last P V done to warpgroup 0's next S issued). Times are clock
cycles at --ghz (the SM clock the run held; nvidia-smi's clocks.max.sm when
not throttled). The file: long long [264 blocks][72 items][4 roles][12 or 14
stamps], roles 0.. the consumer warpgroups, then the producer.
"""

import argparse
import statistics
import struct
import sys

BLOCKS, ITEMS, ROLES = 264, 72, 4
STAMPS = (12, 14)  # a file of either (14: the epilogue's K-stage path split further)
CONSUMER = [
    ("item loaded, path chosen", 0, 1),
    ("wait for q", 1, 2),
    ("wait for tile 0's K", 2, 3),
    ("q's NaN check", 3, 4),
    ("wait for the turn", 4, 5),
    ("tile 0: S, softmax", 5, 6),
    ("later tiles", 6, 7),
    ("the last P V", 7, 8),
    ("epilogue", 8, 9),
]
# the epilogue's parts: stamp 10, its rows' scales and LSEs done, before the
# stores; where o goes through the last K stage, 12: the other warpgroup's
# last S done with it, 13: the rows staged (before the TMA store and the
# wait for its read)
EPILOGUE = [("  its scales and LSEs", 8, 10), ("  its stores", 10, 9)]
EPILOGUE_K = [("    wait for the other's last S", 10, 12), ("    o staged", 12, 13), ("    TMA store, its read", 13, 9)]
PRODUCER = [("tile 0 issued", 0, 1), ("wait for q's buffer", 1, 2), ("q issued", 2, 3), ("later tiles issued", 3, 4)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--ghz", type=float, default=1.98)
    a = ap.parse_args()
    raw = open(a.file, "rb").read()
    sizes = [8 * BLOCKS * ITEMS * ROLES * x for x in STAMPS]
    if len(raw) not in sizes:
        print("prefill_clocks: %s holds %d bytes, not %s" % (a.file, len(raw), " or ".join(map(str, sizes))),
              file=sys.stderr)
        return 2
    stamps = STAMPS[sizes.index(len(raw))]
    v = struct.unpack("<%dq" % (len(raw) // 8), raw)

    def at(b, i, r, s):
        return v[((b * ITEMS + i) * ROLES + r) * stamps + s] if s < stamps else 0

    us = lambda cycles: cycles / a.ghz / 1000.0
    consumers = [r for r in range(ROLES) if any(at(b, 0, r, 11) for b in range(BLOCKS))]
    producer = max(consumers) + 1 if consumers else None
    for r in consumers:
        phases = {name: [] for name, _, _ in CONSUMER + EPILOGUE + EPILOGUE_K}
        phases["to the next item"] = []
        tile = []
        for b in range(BLOCKS):
            for i in range(ITEMS):
                t = [at(b, i, r, s) for s in range(10)]
                tiles = at(b, i, r, 11)
                if tiles < 2 or 0 in t or any(t[s + 1] < t[s] for s in range(9)):
                    continue
                for name, s0, s1 in CONSUMER:
                    phases[name].append(us(t[s1] - t[s0]))
                t10 = at(b, i, r, 10)
                if t[8] <= t10 <= t[9]:
                    for name, s0, s1 in EPILOGUE:
                        phases[name].append(us((t10 if s1 == 10 else t[s1]) - (t10 if s0 == 10 else t[s0])))
                    e = {8: t[8], 9: t[9], 10: t10, 12: at(b, i, r, 12), 13: at(b, i, r, 13)}
                    if t10 <= e[12] <= e[13] <= t[9]:
                        for name, s0, s1 in EPILOGUE_K:
                            phases[name].append(us(e[s1] - e[s0]))
                if i + 1 < ITEMS and at(b, i + 1, r, 0) > t[9]:
                    phases["to the next item"].append(us(at(b, i + 1, r, 0) - t[9]))
                tile.append(us(t[7] - t[6]) / (tiles - 1))
        print("consumer warpgroup %d: %d items; a later tile %.2f us (median)" %
              (r, len(tile), statistics.median(tile) if tile else 0.0))
        for name, xs in phases.items():
            if xs:
                print("  %-32s median %6.2f us  mean %6.2f" % (name, statistics.median(xs), statistics.mean(xs)))
    if producer is not None and producer < ROLES:
        print("producer:")
        for name, s0, s1 in PRODUCER:
            xs = [us(at(b, i, producer, s1) - at(b, i, producer, s0)) for b in range(BLOCKS) for i in range(ITEMS)
                  if at(b, i, producer, s0) and at(b, i, producer, s1) >= at(b, i, producer, s0)]
            if xs:
                print("  %-32s median %6.2f us  mean %6.2f" % (name, statistics.median(xs), statistics.mean(xs)))
        lat = [us(at(b, i, 0, 2) - at(b, i, producer, 3)) for b in range(BLOCKS) for i in range(ITEMS)
               if at(b, i, producer, 3) and at(b, i, 0, 2) > at(b, i, producer, 3)]
        if lat:
            print("  q issued -> consumer 0 past its wait: median %.2f us" % statistics.median(lat))
    # warpgroup 0's item, start to the next item's start, by its key tiles
    # (a line fit of these: the cost of a tile, and of an item beside it)
    if consumers:
        by = {}
        for b in range(BLOCKS):
            for i in range(ITEMS - 1):
                # (stamps in order within one launch: a kernel of two passes
                # stamps 0 for the other pass's items too)
                t0, t1, t9, tn = at(b, i, 0, 0), at(b, i, 0, 1), at(b, i, 0, 9), at(b, i + 1, 0, 0)
                if t0 and t0 <= t1 <= t9 <= tn and at(b, i, 0, 11):
                    by.setdefault(at(b, i, 0, 11), []).append(us(tn - t0))
        if by:
            print("warpgroup 0's item by its key tiles (median us, items): " +
                  "  ".join("%d: %.2f (%d)" % (n, statistics.median(xs), len(xs)) for n, xs in sorted(by.items())))
    # the tensor pipe between items: the last consumer warpgroup's last P V
    # done (stamp 8) to warpgroup 0's next item's first S issued (stamp 5)
    if len(consumers) > 1:
        last = max(consumers)
        gap = [us(at(b, i + 1, 0, 5) - at(b, i, last, 8)) for b in range(BLOCKS) for i in range(ITEMS - 1)
               if at(b, i, last, 8) and at(b, i + 1, 0, 5) > at(b, i, last, 8)]
        if gap:
            print("between items: warpgroup %d's last P V done -> warpgroup 0's next S issued: median %.2f us, "
                  "mean %.2f (%d items)" % (last, statistics.median(gap), statistics.mean(gap), len(gap)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
