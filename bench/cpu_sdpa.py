#!/usr/bin/env python3
"""cpu_sdpa.py - attnkit's CPU backend beside PyTorch's CPU SDPA, same shape, same threads.

Times torch.nn.functional.scaled_dot_product_attention on the CPU for a
Llama-3-8B prefill (32 query heads, 8 KV heads, head_dim 128, causal, 2048
tokens by default) in f32 and bf16, runs

    build/attnkit-bench --backend cpu --workload prefill --model llama3-8b
                        --batch 1 --q-len N --kv-len N --dtype f32|bf16 --json

in the same script run with the same thread count, and prints GFLOP/s of both
and the ratio attnkit / torch. Both sides count FLOPs the same way:
4 * head_dim * num_qo_heads * (sum over query tokens of the keys each sees),
i.e. N (N + 1) / 2 keys per head for a causal prefill.

Needs Python 3.8+ and torch (CPU build is enough); nothing else.
Usage: python3 bench/cpu_sdpa.py [--threads T] [--seq-len N] [--dtypes f32,bf16]
                                 [--iters K] [--bench PATH] [--backend cpu] [--check]
Exit status: 0 when both sides ran for every dtype, 1 otherwise, 2 without torch.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# The model shape the comparison is about (bench/README.md): Llama-3-8B.
MODEL = "llama3-8b"
NUM_QO_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
DEFAULT_SEQ_LEN = 2048
# torch timing: warm-up calls (thread pool start, first-touch of buffers), then
# timed calls, median reported.
WARMUP = 2
DEFAULT_ITERS = 10
# The CPUs this process may run on, read before torch starts its threads: with
# OMP_PROC_BIND set, torch's OpenMP binds this (its master) thread to one CPU,
# and attnkit-bench, started from it, would inherit that one CPU for all its
# threads (16 threads on one CPU read as 0.12x torch on the GPU machine's host).
START_AFFINITY = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BENCH = os.path.join(REPO_ROOT, "build", "attnkit-bench")


def host_line():
    """One line on the CPU these figures come from: model, CPUs, cores and
    threads per core (/proc/cpuinfo; torch's threads scale with the physical
    cores, so two hosts of the same model can still differ)."""
    model, cpus, cores = "unknown CPU", 0, set()
    phys = core = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key, val = key.strip(), val.strip()
                if key == "processor":
                    cpus += 1
                elif key == "model name":
                    model = val
                elif key == "physical id":
                    phys = val
                elif key == "core id":
                    core = val
                elif not key and phys is not None and core is not None:  # end of one CPU's block
                    cores.add((phys, core))
                    phys = core = None
    except OSError:
        pass
    if phys is not None and core is not None:
        cores.add((phys, core))
    usable = len(START_AFFINITY) if START_AFFINITY else os.cpu_count()
    text = "# host: %s; %d CPUs online, %d usable here" % (model, cpus or os.cpu_count(), usable)
    if cores:
        text += "; %d cores x %g threads per core" % (len(cores), (cpus or len(cores)) / len(cores))
    return text


def causal_flops(seq_len):
    """FLOPs of one causal prefill: QK^T and PV, 2 FLOPs per multiply-add each."""
    visible_keys = seq_len * (seq_len + 1) // 2
    return 2.0 * (HEAD_DIM + HEAD_DIM) * NUM_QO_HEADS * visible_keys


def import_torch():
    try:
        import torch  # noqa: F401  (imported here so a missing torch is a message, not a traceback)
        import torch.nn.functional  # noqa: F401
    except ImportError as e:
        sys.stderr.write(
            "cpu_sdpa.py: PyTorch is not installed (%s).\n"
            "  This comparison needs torch (a CPU build is enough): pip install torch\n"
            "  attnkit's side alone: build/attnkit-bench --backend cpu --workload prefill "
            "--model llama3-8b --batch 1 --q-len 2048 --kv-len 2048 --dtype f32 --json\n" % e)
        return None
    return torch


def torch_sdpa_ms(torch, dtype_name, seq_len, iters):
    """Median milliseconds of one causal GQA SDPA call on the CPU, and how GQA was done."""
    F = torch.nn.functional
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype_name]
    gen = torch.Generator().manual_seed(0)
    # [batch, heads, tokens, head_dim], random in [-1, 1) as attnkit-bench's inputs
    q = (torch.rand(1, NUM_QO_HEADS, seq_len, HEAD_DIM, generator=gen) * 2 - 1).to(dtype)
    k = (torch.rand(1, NUM_KV_HEADS, seq_len, HEAD_DIM, generator=gen) * 2 - 1).to(dtype)
    v = (torch.rand(1, NUM_KV_HEADS, seq_len, HEAD_DIM, generator=gen) * 2 - 1).to(dtype)

    group = NUM_QO_HEADS // NUM_KV_HEADS
    with torch.inference_mode():
        try:
            F.scaled_dot_product_attention(q[:, :, :1], k[:, :, :1], v[:, :, :1], is_causal=True,
                                           enable_gqa=True)

            def call():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

            gqa = "enable_gqa=True"
        except TypeError:
            # torch < 2.5 has no enable_gqa: K/V heads repeated once, outside the timed calls
            # (this favours torch slightly: the copy is not counted)
            k_rep = k.repeat_interleave(group, dim=1)
            v_rep = v.repeat_interleave(group, dim=1)

            def call():
                return F.scaled_dot_product_attention(q, k_rep, v_rep, is_causal=True)

            gqa = "repeat_interleave (untimed)"

        for _ in range(WARMUP):
            call()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            out = call()
            times.append((time.perf_counter() - t0) * 1e3)
            del out
    return statistics.median(times), gqa


def attnkit_run(bench, backend, dtype_name, seq_len, threads, iters, check):
    """Runs attnkit-bench once; returns (its JSON row or None, a message)."""
    cmd = [bench, "--backend", backend, "--device", "cpu", "--workload", "prefill", "--model", MODEL,
           "--batch", "1", "--q-len", str(seq_len), "--kv-len", str(seq_len), "--dtype", dtype_name,
           "--json", "--iters", str(iters)]
    if check:
        cmd.append("--check")
    env = dict(os.environ)
    # the same threads as torch: attnkit's CPU backend reads AK_NUM_THREADS, OpenMP the other
    env["AK_NUM_THREADS"] = str(threads)
    env["OMP_NUM_THREADS"] = str(threads)
    # the child inherits this thread's CPUs: those of the start, for the spawn only
    bound = os.sched_getaffinity(0) if START_AFFINITY else None
    try:
        if bound is not None and bound != START_AFFINITY:
            os.sched_setaffinity(0, START_AFFINITY)
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True)
    except OSError as e:
        return None, "cannot run %s: %s" % (bench, e)
    finally:
        if bound is not None and bound != START_AFFINITY:
            os.sched_setaffinity(0, bound)
    rows = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            return None, "attnkit-bench printed a line that is not JSON: %s" % line
    ok = [r for r in rows if r.get("status") in ("ok", "fail") and r.get("median_ms") is not None]
    if not ok:
        why = "; ".join("%s: %s" % (r.get("backend"), r.get("reason", r.get("status"))) for r in rows)
        tail = proc.stderr.strip().splitlines()[-3:]
        return None, "attnkit-bench (exit %d) gave no timing: %s %s" % (
            proc.returncode, why or "no rows", " | ".join(tail))
    row = ok[0]
    row["stderr"] = proc.stderr  # diagnostics (cpu_scaling.py reads the phase times there)
    if row.get("status") == "fail":
        return row, "CHECK FAILED (max_rel_err %s): %s" % (row.get("max_rel_err"), row.get("reason", ""))
    return row, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for both sides (default: torch's default, the physical cores)")
    ap.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help="prompt tokens (default 2048)")
    ap.add_argument("--dtypes", default="f32,bf16", help="comma-separated, of f32, bf16, f16")
    ap.add_argument("--iters", type=int, default=DEFAULT_ITERS, help="timed calls per side")
    ap.add_argument("--bench", default=DEFAULT_BENCH, help="path of attnkit-bench")
    ap.add_argument("--backend", default="cpu", help="attnkit backend (default cpu)")
    ap.add_argument("--check", action="store_true", help="let attnkit-bench check against cpu_ref")
    args = ap.parse_args()

    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in ("f32", "bf16", "f16")]
    if bad or not dtypes or args.seq_len < 1 or args.iters < 1:
        ap.error("dtypes are f32, bf16, f16; --seq-len and --iters are positive")

    torch = import_torch()
    if torch is None:
        return 2
    if not os.path.isfile(args.bench) or not os.access(args.bench, os.X_OK):
        sys.stderr.write("cpu_sdpa.py: %s is missing or not executable; build it first (make build)\n"
                         % args.bench)
        return 1

    threads = args.threads if args.threads > 0 else torch.get_num_threads()
    torch.set_num_threads(threads)
    flops = causal_flops(args.seq_len)
    print(host_line())
    print("# %s prefill, %d tokens, causal, %d/%d heads, head_dim %d: %.3g GFLOP per call" % (
        MODEL, args.seq_len, NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, flops / 1e9))
    print("# %d threads on both sides; torch %s; attnkit backend %s; medians of %d calls" % (
        threads, torch.__version__, args.backend, args.iters))
    print("%-5s %12s %14s %12s %16s %14s" % ("dtype", "torch_ms", "torch_GFLOP/s", "attnkit_ms",
                                             "attnkit_GFLOP/s", "attnkit/torch"))
    status = 0
    notes = []
    for d in dtypes:
        try:
            t_ms, gqa = torch_sdpa_ms(torch, d, args.seq_len, args.iters)
        except RuntimeError as e:  # a dtype this torch build has no CPU kernel for
            t_ms, gqa = None, None
            notes.append("%s: torch SDPA failed: %s" % (d, e))
        row, msg = attnkit_run(args.bench, args.backend, d, args.seq_len, threads, args.iters, args.check)
        if msg:
            notes.append("%s: %s" % (d, msg))
        t_gflops = flops / (t_ms * 1e-3) / 1e9 if t_ms else None
        a_ms = row.get("median_ms") if row else None
        a_gflops = row.get("gflops") if row else None
        if a_gflops is not None and row.get("flop_per_call") and abs(row["flop_per_call"] - flops) > 1e-6 * flops:
            notes.append("%s: attnkit-bench counted %.6g FLOP, this script %.6g" % (d, row["flop_per_call"], flops))
        ratio = a_gflops / t_gflops if (a_gflops and t_gflops) else None

        def fmt(x, spec):
            return spec % x if x is not None else "-"

        print("%-5s %12s %14s %12s %16s %14s" % (d, fmt(t_ms, "%.3f"), fmt(t_gflops, "%.1f"), fmt(a_ms, "%.3f"),
                                                 fmt(a_gflops, "%.1f"), fmt(ratio, "%.2fx")))
        if gqa:
            notes.append("%s: torch GQA via %s" % (d, gqa))
        if t_ms is None or row is None or (row and row.get("status") == "fail"):
            status = 1
    for n in notes:
        print("# " + n)
    return status


if __name__ == "__main__":
    sys.exit(main())
