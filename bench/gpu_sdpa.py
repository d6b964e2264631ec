#!/usr/bin/env python3
"""gpu_sdpa.py - attnkit's cuda_paged prefill beside PyTorch's SDPA flash and cuDNN backends.

For each shape (batch x prompt tokens, heads, head_dim, causal or not (--non-causal), bf16) it times
torch.nn.functional.scaled_dot_product_attention on the GPU with the
FLASH_ATTENTION and the CUDNN_ATTENTION backends (dense [batch, heads, tokens,
head_dim] tensors, GQA through enable_gqa), then runs

    build-gpu/attnkit-bench --device cuda --backend cuda_paged --workload prefill
        --heads H/KV --head-dim D --batch B --q-len N --dtype bf16 --page-size P --json

in the same script run, and prints TFLOP/s of each and attnkit's ratio to each.
attnkit reads K/V through its paged cache (page size P, 16 unless
--page-size says, blocks shuffled); the peers read contiguous tensors. Pages
of a multiple of 16 keys let the prefill copy key tiles by TMA (pages of 64n
keys in boxes of a tile or half of one, others a box of 32 or 16 rows at a
time); other sizes copy with cp.async. FLOPs are counted alike on both sides:
4 * head_dim * num_qo_heads * (keys each query token sees), summed.
With --kv-marks attnkit's views carry finiteness marks (an engine that
writes its cache through ak_kv_update has them), so the NaN rule's scan
pass reads a bit a key rather than the K/V rows.

Needs torch with CUDA; nothing else.
Usage: python3 bench/gpu_sdpa.py [--shapes 16x1024,4x4096,1x16384] [--head-dims 128]
                                 [--heads 32/8] [--iters 20] [--bench PATH] [--non-causal]
                                 [--page-size 16] [--kv-marks]
Exit status: 0 when every side ran, 1 otherwise, 2 without torch or a GPU.
"""

import argparse
import os
import statistics
import sys

from bench_json import bench_median_ms

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BENCH = os.path.join(REPO_ROOT, "build-gpu", "attnkit-bench")
WARMUP = 3


def attention_flops(batch, seq, heads, dim, causal=True):
    return 4.0 * dim * heads * batch * seq * ((seq + 1) / 2 if causal else seq)


def sdpa_ms(torch, backend, batch, seq, hq, hk, dim, iters, causal=True):
    """Median ms of one SDPA call with the given backend, or (None, why)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(h):
        return (torch.rand(batch, h, seq, dim, generator=gen, device="cuda") * 2 - 1).to(torch.bfloat16)

    q, k, v = rnd(hq), rnd(hk), rnd(hk)
    try:
        with sdpa_kernel([which]):
            def call():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hk)
            call()
            torch.cuda.synchronize()
            times = []
            for i in range(WARMUP + iters):
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                call()
                b.record()
                b.synchronize()
                if i >= WARMUP:
                    times.append(a.elapsed_time(b))
    except RuntimeError as e:
        return None, str(e).splitlines()[0][:160]
    return statistics.median(times), ""


def attnkit_ms(bench, batch, seq, hq, hk, dim, iters, causal=True, page=16, marks=False):
    cmd = [bench, "--device", "cuda", "--backend", "cuda_paged", "--workload", "prefill", "--heads",
           "%d/%d" % (hq, hk), "--head-dim", str(dim), "--batch", str(batch), "--q-len", str(seq), "--dtype",
           "bf16", "--page-size", str(page), "--iters", str(iters), "--json"]
    cmd += ([] if causal else ["--non-causal"]) + (["--kv-marks"] if marks else [])
    return bench_median_ms(cmd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="16x1024,4x4096,1x16384", help="batch x tokens, comma-separated")
    ap.add_argument("--head-dims", default="128", help="comma-separated, of 64, 128, 256")
    ap.add_argument("--heads", default="32/8", help="query/KV heads")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--bench", default=DEFAULT_BENCH)
    ap.add_argument("--non-causal", action="store_true", help="every token sees every key (an encoder)")
    ap.add_argument("--page-size", type=int, default=16, help="attnkit's page size (tokens)")
    ap.add_argument("--kv-marks", action="store_true",
                    help="attnkit's paged views with finiteness marks (as ak_kv_update keeps them): the NaN "
                         "rule's scan reads a bit a key instead of the K/V rows")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        sys.stderr.write("gpu_sdpa.py: needs PyTorch (%s)\n" % e)
        return 2
    if not torch.cuda.is_available():
        sys.stderr.write("gpu_sdpa.py: no CUDA device\n")
        return 2
    hq, hk = (int(x) for x in args.heads.split("/"))
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s]
    dims = [int(d) for d in args.head_dims.split(",") if d]
    causal = not args.non_causal
    print("# %s, torch %s, bf16, %s, %d/%d heads, attnkit page size %d%s; medians of %d calls" % (
        torch.cuda.get_device_name(), torch.__version__, "causal" if causal else "non-causal", hq, hk,
        args.page_size, ", finiteness marks" if args.kv_marks else "", args.iters))
    hdr = ("D", "batch", "tokens", "flash_ms", "flash_TF", "cudnn_ms", "cudnn_TF", "attnkit_ms", "attnkit_TF",
           "vs_flash", "vs_cudnn")
    print("%4s %6s %7s %9s %8s %9s %8s %10s %10s %8s %8s" % hdr)
    status, notes = 0, []
    for dim in dims:
        for batch, seq in shapes:
            fl = attention_flops(batch, seq, hq, dim, causal)
            res = {}
            for name in ("flash", "cudnn"):
                ms, why = sdpa_ms(torch, name, batch, seq, hq, hk, dim, args.iters, causal)
                res[name] = ms
                if why:
                    notes.append("D%d %dx%d %s: %s" % (dim, batch, seq, name, why))
            ms, why = attnkit_ms(args.bench, batch, seq, hq, hk, dim, args.iters, causal, args.page_size,
                                 args.kv_marks)
            res["attnkit"] = ms
            if why:
                notes.append("D%d %dx%d attnkit: %s" % (dim, batch, seq, why))
                status = 1

            def tf(x):
                return "%8.1f" % (fl / x / 1e9) if x else "%8s" % "-"

            def ms_(x):
                return "%9.3f" % x if x else "%9s" % "-"

            def ratio(peer):
                return "%7.2fx" % (res[peer] / res["attnkit"]) if res[peer] and res["attnkit"] else "%8s" % "-"

            print("%4d %6d %7d %s %s %s %s %10s %10s %s %s" % (
                dim, batch, seq, ms_(res["flash"]), tf(res["flash"]), ms_(res["cudnn"]), tf(res["cudnn"]),
                ms_(res["attnkit"]).strip(), tf(res["attnkit"]).strip(), ratio("flash"), ratio("cudnn")))
    print("# vs_X = X's time / attnkit's time (above 1: attnkit is faster)")
    for n in notes:
        print("# note: " + n)
    return status


if __name__ == "__main__":
    sys.exit(main())
