#!/usr/bin/env python3
"""bench/fp8.py - fp8 e4m3 K/V on the GPU, against bf16 and beside FlashInfer's fp8.

    python3 bench/fp8.py [--lib build/libattnkit.so] [--csv FILE] [--quick]

Speed: paged decode, llama3-8b attention (32/8 heads of 128, page 16), every
request on the same kv_len, the same data for every side: attnkit's
cuda_paged on the bf16 cache and on its fp8 copy, FlashInfer's decode
wrapper (tensor cores, and CUDA cores) on the same two caches. Times are CUDA
events around back-to-back calls (median of rounds); frac is the bytes a call
must move (K/V rows at their dtype, q and o) over the time, against a
device-to-device copy (bytes read + written) timed in the same run.

Accuracy: one request of 32 query heads on kv_len 4096, 32768 and 131072 keys
(K with a few large channels, as real keys have), o against attention in fp64
on the bf16 values: relative error (Frobenius) of attnkit bf16, attnkit fp8
and FlashInfer fp8 (tensor cores) on the same fp8 bytes and scales. Then the
needle: at kv_len 131072 one key per KV head aligned with a query head, its
logit 2 above the log-sum-exp of the rest, V marking it in the last dim: the
weight each side puts on it (o's last dim), fp8 against bf16.

Scales are per layer (one k_scale, one v_scale: amax / 448), the form both
libraries take; the fp8 cache is the bf16 one divided by its scale and
rounded by torch (round to nearest even, saturating), read by both sides.
FlashInfer is optional: without it (bench/README.md says how to carry it)
its columns are left out.
"""
import argparse
import csv
import math
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HQ, HK, D, PAGE = 32, 8, 128, 16


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", help="libattnkit.so (default: ATTNKIT_LIB, else the build folder's)")
    p.add_argument("--csv", help="write the rows here too")
    p.add_argument("--quick", action="store_true", help="fewer shapes (batch 16 and 64 on 8192 keys; 4k/32k accuracy)")
    p.add_argument("--rounds", type=int, default=7)
    return p.parse_args()


def import_libs(args):
    import torch
    if args.lib:
        os.environ["ATTNKIT_LIB"] = args.lib
    sys.path.insert(0, os.path.join(REPO, "python"))
    import attnkit
    try:
        import flashinfer
    except Exception as e:  # optional
        print(f"# flashinfer not importable ({type(e).__name__}: {e}): its columns are left out", file=sys.stderr)
        flashinfer = None
    return torch, attnkit, flashinfer


class Cache:
    """batch requests of kv_len keys each over one paged cache (bf16 and its
    fp8 copy), pages in order; q for one decode token each."""

    def __init__(self, torch, batch, kv_len, gen, outlier=True):
        self.batch, self.kv_len = batch, kv_len
        pages = (kv_len + PAGE - 1) // PAGE
        self.num_blocks = batch * pages
        dev = "cuda"
        shape = (self.num_blocks, PAGE, HK, D)
        self.k = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32)
        if outlier:  # a few large channels
            self.k[..., 3::16] *= 8.0
        self.k = self.k.to(torch.bfloat16)
        self.v = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).to(torch.bfloat16)
        self.q = torch.randn((batch, HQ, D), generator=gen, device=dev, dtype=torch.float32).to(torch.bfloat16)
        self.block_table = torch.arange(self.num_blocks, dtype=torch.int32).reshape(batch, pages)
        self.kv_lens = [kv_len] * batch
        self.qo_indptr = list(range(batch + 1))
        self.kv_indptr = torch.arange(0, self.num_blocks + 1, pages, dtype=torch.int32, device=dev)
        self.kv_indices = torch.arange(self.num_blocks, dtype=torch.int32, device=dev)
        last = kv_len - (pages - 1) * PAGE
        self.last_page_len = torch.full((batch,), last, dtype=torch.int32, device=dev)

    def quantize(self, torch):
        self.k_scale = (self.k.float().abs().max() / 448.0).reshape(1)
        self.v_scale = (self.v.float().abs().max() / 448.0).reshape(1)
        self.k8 = (self.k.float() / self.k_scale).to(torch.float8_e4m3fn)
        self.v8 = (self.v.float() / self.v_scale).to(torch.float8_e4m3fn)

    def bytes(self, kv_elem):
        """bytes one decode call must move: the visible K/V rows, q and o"""
        return self.batch * self.kv_len * HK * D * 2 * kv_elem + 2 * self.batch * HQ * D * 2


def attnkit_side(torch, attnkit, c, fp8):
    cfg = attnkit.Config(num_qo_heads=HQ, num_kv_heads=HK, head_dim=D, dtype="bf16", device="cuda",
                         page_size=PAGE, workload="decode")
    if fp8:
        cfg.kv_dtype = "fp8_e4m3"
    lim = attnkit.Limits(max_reqs=c.batch, max_tokens=c.batch, max_blocks_per_req=c.block_table.shape[1],
                         num_cache_blocks=c.num_blocks)
    b = attnkit.Backend(cfg, lim, name="cuda_paged")
    b.plan(c.qo_indptr, c.kv_lens, c.block_table)
    o = torch.empty(c.batch, HQ, D, dtype=torch.bfloat16, device="cuda")
    if fp8:
        call = b.prepare_run(c.q, c.k8, c.v8, o, k_scale=c.k_scale, v_scale=c.v_scale)
    else:
        call = b.prepare_run(c.q, c.k, c.v, o)
    return (lambda: call()), o, b


def flashinfer_side(torch, fi, c, fp8, tensor_cores):
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)
    kvt = torch.float8_e4m3fn if fp8 else torch.bfloat16
    w.plan(c.kv_indptr, c.kv_indices, c.last_page_len, HQ, HK, D, PAGE, pos_encoding_mode="NONE",
           q_data_type=torch.bfloat16, kv_data_type=kvt)
    o = torch.empty(c.batch, HQ, D, dtype=torch.bfloat16, device="cuda")
    if fp8:
        ks, vs = float(c.k_scale.item()), float(c.v_scale.item())
        call = lambda: w.run(c.q, (c.k8, c.v8), out=o, k_scale=ks, v_scale=vs)
    else:
        call = lambda: w.run(c.q, (c.k, c.v), out=o)
    return call, o, (w, ws)


def time_call(torch, call, rounds, iters=10):
    call()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(rounds):
        a.record()
        for _ in range(iters):
            call()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b) / iters)
    return statistics.median(ms)


def copy_ceiling(torch, rounds):
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_call(torch, lambda: dst.copy_(src), rounds, iters=5)
    del src, dst
    return 2 * n / ms / 1e6  # GB/s


def speed(torch, attnkit, fi, args, rows):
    ceiling = copy_ceiling(torch, args.rounds)
    print(f"# device-to-device copy: {ceiling:.1f} GB/s (read + written)")
    shapes = [(16, 8192), (64, 8192)] if args.quick else [(16, 8192), (32, 8192), (64, 8192), (128, 8192),
                                                          (16, 32768), (64, 32768)]
    print(f"{'side':34s} {'batch':>5s} {'kv_len':>6s} {'ms':>8s} {'GB/s':>7s} {'frac':>5s} {'vs bf16':>7s}")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    for batch, kv_len in shapes:
        c = Cache(torch, batch, kv_len, gen)
        c.quantize(torch)
        sides = [("attnkit cuda_paged bf16", lambda: attnkit_side(torch, attnkit, c, False), 2),
                 ("attnkit cuda_paged fp8", lambda: attnkit_side(torch, attnkit, c, True), 1)]
        if fi:
            for tc in (True, False):
                eng = "tensor cores" if tc else "CUDA cores"
                sides += [(f"flashinfer {eng} bf16", lambda tc=tc: flashinfer_side(torch, fi, c, False, tc), 2),
                          (f"flashinfer {eng} fp8", lambda tc=tc: flashinfer_side(torch, fi, c, True, tc), 1)]
        base = {}
        for name, make, elem in sides:
            try:
                call, _, keep = make()
                ms = time_call(torch, call, args.rounds)
            except Exception as e:
                print(f"{name:34s} {batch:5d} {kv_len:6d} skipped: {type(e).__name__}: {str(e)[:120]}")
                continue
            gbs = c.bytes(elem) / ms / 1e6
            lib = name.rsplit(" ", 1)[0]
            if elem == 2:
                base[lib] = ms
            ratio = base[lib] / ms if elem == 1 and lib in base else 1.0
            print(f"{name:34s} {batch:5d} {kv_len:6d} {ms:8.4f} {gbs:7.1f} {gbs / ceiling:5.2f} {ratio:7.2f}")
            rows.append(dict(kind="speed", side=name, batch=batch, kv_len=kv_len, ms=f"{ms:.5f}",
                             gbs=f"{gbs:.1f}", frac=f"{gbs / ceiling:.3f}", vs_bf16=f"{ratio:.3f}",
                             ceiling_gbs=f"{ceiling:.1f}"))
            del keep
        del c
        torch.cuda.empty_cache()


def reference(torch, c, sm):
    """fp64 attention of the one request on the bf16 values: [HQ, D]"""
    n = c.kv_len
    k = c.k.reshape(-1, HK, D)[:n].double()
    v = c.v.reshape(-1, HK, D)[:n].double()
    q = c.q[0].double()
    g = HQ // HK
    out = torch.empty(HQ, D, dtype=torch.float64, device="cuda")
    for h in range(HQ):
        s = (k[:, h // g, :] @ q[h]) * sm
        p = torch.softmax(s, dim=0)
        out[h] = p @ v[:, h // g, :]
    return out


def rel_err(torch, o, ref):
    return (torch.linalg.norm(o.double().reshape(HQ, D) - ref) / torch.linalg.norm(ref)).item()


def accuracy(torch, attnkit, fi, args, rows):
    sm = 1.0 / math.sqrt(D)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    lens = [4096, 32768] if args.quick else [4096, 32768, 131072]
    print("\nrelative error of o against fp64 attention on the bf16 values (one request, 32/8 heads of 128)")
    print(f"{'kv_len':>7s} {'attnkit bf16':>13s} {'attnkit fp8':>12s} {'flashinfer fp8':>15s}")
    for n in lens:
        c = Cache(torch, 1, n, gen)
        c.quantize(torch)
        ref = reference(torch, c, sm)
        errs = []
        for make in (lambda: attnkit_side(torch, attnkit, c, False), lambda: attnkit_side(torch, attnkit, c, True),
                     (lambda: flashinfer_side(torch, fi, c, True, True)) if fi else None):
            if make is None:
                errs.append(float("nan"))
                continue
            call, o, keep = make()
            o.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            errs.append(rel_err(torch, o, ref))
            del keep
        print(f"{n:7d} {errs[0]:13.2e} {errs[1]:12.2e} {errs[2]:15.2e}")
        rows.append(dict(kind="accuracy", kv_len=n, attnkit_bf16=f"{errs[0]:.3e}", attnkit_fp8=f"{errs[1]:.3e}",
                         flashinfer_fp8=f"{errs[2]:.3e}"))
        del c
        torch.cuda.empty_cache()
    if args.quick:
        return
    # the needle
    n = 131072
    c = Cache(torch, 1, n, gen)
    k = c.k.reshape(-1, HK, D)
    v = c.v.reshape(-1, HK, D)
    needle = n // 3
    g = HQ // HK
    kf = k[:n].float()
    for kh in range(HK):
        qh = c.q[0, kh * g].float()
        s = (kf[:, kh, :] @ qh) * sm
        s[needle] = -float("inf")
        lse = torch.logsumexp(s, 0).item()
        alpha = (lse + 2.0) / (sm * (qh @ qh).item())
        k[needle, kh] = (alpha * qh).to(torch.bfloat16)
    v[:n, :, D - 1] = 0
    v[needle, :, D - 1] = 1
    c.quantize(torch)
    ref = reference(torch, c, sm)
    heads = [kh * g for kh in range(HK)]
    w = {"fp64": ref[heads, D - 1].mean().item()}
    for name, make in (("attnkit bf16", lambda: attnkit_side(torch, attnkit, c, False)),
                       ("attnkit fp8", lambda: attnkit_side(torch, attnkit, c, True)),
                       ("flashinfer fp8", (lambda: flashinfer_side(torch, fi, c, True, True)) if fi else None)):
        if make is None:
            continue
        call, o, keep = make()
        call()
        torch.cuda.synchronize()
        w[name] = o[0, heads, D - 1].float().mean().item()
        del keep
    print(f"\nneedle at kv_len {n}: weight on it (mean over the aligned heads)")
    for name, x in w.items():
        rel = f"  ({(x - w['attnkit bf16']) / w['attnkit bf16'] * 100:+.2f}% of bf16)" if name.endswith("fp8") else ""
        print(f"  {name:16s} {x:.4f}{rel}")
        rows.append(dict(kind="needle", side=name, kv_len=n, weight=f"{x:.5f}"))


def main():
    args = parse_args()
    torch, attnkit, fi = import_libs(args)
    if not torch.cuda.is_available():
        print("bench/fp8.py needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name()}, attnkit {attnkit.version()}"
          f"{', flashinfer ' + fi.__version__ if fi else ''}")
    rows = []
    speed(torch, attnkit, fi, args, rows)
    accuracy(torch, attnkit, fi, args, rows)
    if args.csv:
        keys = sorted({k for r in rows for k in r})
        with open(args.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=keys)
            wr.writeheader()
            wr.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
