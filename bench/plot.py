#!/usr/bin/env python3
"""Draws what people would rather look at than read:

- from a `bench/peers.py --csv` file: decode bandwidth (GB/s) against kv_len,
  one panel per model and batch, one line per peer; and prefill / mixed
  TFLOP/s per shape, one bar per peer;
- from `examples/engine/serve.py --json` files: the engine's generated
  tokens/s per CUDA-graph mode (and the share of step time in attention).

    python3 bench/plot.py --peers peers.csv --engine engine.json -o docs/
    python3 bench/plot.py --self-test

Every figure is drawn from the numbers of one run, named in its title with
the device and date given by --label. matplotlib is an optional dependency
(pip install matplotlib); without it the script says so and exits 2.
"""
import argparse
import csv
import json
import math
import os
import sys
import tempfile

PEER_ORDER = ("attnkit", "flashinfer", "flashinfer_tc", "flashinfer_ragged", "sdpa_flash", "sdpa_cudnn",
              "sdpa_efficient", "flex", "flash_attn")


def read_peers(path):
    """Rows of peers.csv that ran, with numbers as floats."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("status") != "ok":
                continue
            try:
                for k in ("batch", "q_len", "kv_len"):
                    r[k] = int(r[k])
                for k in ("median_us", "gbps", "tflops"):
                    r[k] = float(r[k]) if r.get(k) else math.nan
            except (KeyError, ValueError):
                continue
            rows.append(r)
    return rows


def peer_key(p):
    return (PEER_ORDER.index(p) if p in PEER_ORDER else len(PEER_ORDER), p)


def plot_decode(plt, rows, label):
    dec = [r for r in rows if r["workload"] == "decode" and not math.isnan(r["gbps"])]
    if not dec:
        return None
    panels = sorted({(r["model"], r["batch"]) for r in dec})
    cols = min(4, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.3 * nrows), squeeze=False)
    for ax, (model, batch) in zip(axes.flat, panels):
        sub = [r for r in dec if r["model"] == model and r["batch"] == batch]
        for peer in sorted({r["peer"] for r in sub}, key=peer_key):
            pts = sorted((r["kv_len"], r["gbps"]) for r in sub if r["peer"] == peer)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                    lw=2.2 if peer == "attnkit" else 1.2, label=peer)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{model}, batch {batch}", fontsize=9)
        ax.set_xlabel("kv_len", fontsize=8)
        ax.set_ylabel("GB/s (K/V read)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"Decode bandwidth, paged KV cache ({label})", fontsize=10)
    return fig


def plot_prefill(plt, rows, label):
    pre = [r for r in rows if r["workload"] in ("prefill", "mixed") and not math.isnan(r["tflops"])]
    if not pre:
        return None
    shapes = sorted({(r["model"], r["workload"], r["batch"], r["q_len"], r["kv_len"]) for r in pre})
    peers = sorted({r["peer"] for r in pre}, key=peer_key)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(shapes) + 2), 3.8))
    width = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        ys = []
        for s in shapes:
            hit = [r["tflops"] for r in pre if (r["model"], r["workload"], r["batch"], r["q_len"], r["kv_len"]) == s
                   and r["peer"] == peer]
            ys.append(hit[0] if hit else 0.0)
        ax.bar([k + (i - (len(peers) - 1) / 2) * width for k in range(len(shapes))], ys, width, label=peer)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"{m}\n{w} {b}x{q}/{kv}" for m, w, b, q, kv in shapes], fontsize=7)
    ax.set_ylabel("TFLOP/s", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"Prefill and mixed steps, TFLOP/s on the real head dims ({label})", fontsize=10)
    return fig


def plot_engine(plt, files, label):
    runs = []
    for path in files:
        with open(path) as f:
            res = json.load(f)
        a = res["args"]
        for r in res["runs"]:
            runs.append((f"{a['model']} {a['layers']}L, {a['requests']} req\ngraphs {r['graphs']}",
                         r["tokens_per_s"], r.get("attention_share")))
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(runs) + 1.5), 3.6))
    bars = ax.bar(range(len(runs)), [r[1] for r in runs], color="#1f77b4")
    for b, r in zip(bars, runs):
        text = f"{r[1]:.0f}" + (f"\nattn {100 * r[2]:.0f}%" if r[2] is not None else "")
        ax.annotate(text, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels([r[0] for r in runs], fontsize=7)
    ax.set_ylabel("generated tokens/s", fontsize=8)
    ax.set_ylim(0, 1.25 * max(r[1] for r in runs))
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"examples/engine: tokens/s per CUDA-graph mode ({label})", fontsize=10)
    return fig


def self_test(plt):
    """Draws made-up rows of both formats and checks the files appear."""
    with tempfile.TemporaryDirectory() as d:
        peers = os.path.join(d, "peers.csv")
        fields = ["model", "workload", "batch", "q_len", "kv_len", "peer", "status", "median_us", "gbps", "tflops"]
        with open(peers, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            for peer in ("attnkit", "sdpa_flash"):
                for b in (1, 16):
                    for kv in (1024, 4096):
                        w.writerow(dict(model="m", workload="decode", batch=b, q_len=1, kv_len=kv, peer=peer,
                                        status="ok", median_us=10, gbps=1000 + kv / 10, tflops=1))
                w.writerow(dict(model="m", workload="prefill", batch=1, q_len=4096, kv_len=4096, peer=peer,
                                status="ok", median_us=100, gbps="", tflops=400))
        eng = os.path.join(d, "engine.json")
        with open(eng, "w") as f:
            json.dump(dict(args=dict(model="llama", layers=2, requests=8),
                           runs=[dict(graphs="off", tokens_per_s=100.0, attention_share=0.2),
                                 dict(graphs="decode", tokens_per_s=150.0)]), f)
        made = draw(plt, peers, [eng], d, "self-test")
        assert len(made) == 3 and all(os.path.getsize(p) > 1000 for p in made), made
    print("plot.py self-test: ok")


def draw(plt, peers, engine_files, out, label, fmt="svg"):
    """Draws what the inputs hold into out/; returns the paths written."""
    figs = []
    if peers:
        rows = read_peers(peers)
        figs += [("peers-decode", plot_decode(plt, rows, label)), ("peers-prefill", plot_prefill(plt, rows, label))]
    if engine_files:
        figs.append(("engine-tokens", plot_engine(plt, engine_files, label)))
    made = []
    for name, fig in figs:
        if fig is None:
            continue
        fig.tight_layout()
        path = os.path.join(out, f"{name}.{fmt}")
        # no date in an SVG: the same data draws the same file
        fig.savefig(path, metadata={"Date": None} if fmt == "svg" else None)
        plt.close(fig)
        made.append(path)
    return made


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peers", help="a bench/peers.py CSV")
    p.add_argument("--engine", action="append", default=[], help="an examples/engine/serve.py JSON (repeatable)")
    p.add_argument("-o", "--out", default=".", help="folder for the SVG files")
    p.add_argument("--label", default="", help="device and date, for the titles")
    p.add_argument("--format", choices=("svg", "png"), default="svg")
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    matplotlib.rcParams["svg.hashsalt"] = "attnkit"  # the same data draws the same file
    if a.self_test:
        self_test(plt)
        return 0
    if not a.peers and not a.engine:
        p.error("give --peers and/or --engine (or --self-test)")
    os.makedirs(a.out, exist_ok=True)
    for path in draw(plt, a.peers, a.engine, a.out, a.label, a.format):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
