"""
test_fp8.py - fp8 e4m3 K/V through the binding: caches of raw bytes (standard
library) and torch.float8_e4m3fn caches (when torch imports), scales given as
f32 buffers or tensors, kv_update quantizing f32 / bf16 rows, run() on the
cpu and cpu_ref backends against attention written here on the dequantized
values, and the scale arguments' errors.
"""
import array
import math
import random
import unittest

import attnkit
from attnkit import _capi

try:
    import torch
except Exception:  # absent, or present but broken: the torch tests skip
    torch = None

HQ, HK, D, PAGE, BLOCKS = 4, 2, 8, 4, 6


def e4m3_value(code):
    """The value of an e4m3fn byte, written out here."""
    mag = code & 0x7F
    if mag == 0x7F:
        return math.nan
    e, m = mag >> 3, mag & 7
    v = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if code & 0x80 else v


def attention(q, k, v, sm_scale):
    """One causal request, every key visible to its one query (decode): q [HQ][D],
    k / v [L][HK][D] as floats -> o [HQ][D]."""
    o = []
    for h in range(HQ):
        g = h // (HQ // HK)
        s = [sm_scale * sum(q[h][d] * k[j][g][d] for d in range(D)) for j in range(len(k))]
        m = max(s)
        w = [math.exp(x - m) for x in s]
        z = sum(w)
        o.append([sum(w[j] * v[j][g][d] for j in range(len(k))) / z for d in range(D)])
    return o


class TestFp8Bytes(unittest.TestCase):
    """fp8 caches as bytearrays, scales as array('f'): no torch needed."""

    def setUp(self):
        rng = random.Random(5)
        self.L = 11
        self.k_scale = array.array("f", [0.02, 0.05])
        self.v_scale = array.array("f", [0.01, 0.004])
        self.k_new = array.array("f", (rng.uniform(-2, 2) for _ in range(self.L * HK * D)))
        self.v_new = array.array("f", (rng.uniform(-1, 1) for _ in range(self.L * HK * D)))
        self.q = array.array("f", (rng.uniform(-1, 1) for _ in range(HQ * D)))
        self.k_cache = bytearray(BLOCKS * PAGE * HK * D)
        self.v_cache = bytearray(BLOCKS * PAGE * HK * D)
        self.blocks = [4, 1, 3]  # the request's blocks, out of order
        self.slots = [self.blocks[j // PAGE] * PAGE + j % PAGE for j in range(self.L)]

    def views(self):
        shape = (BLOCKS, PAGE, HK, D)
        return (attnkit.View(self.k_cache, shape, "fp8_e4m3"), attnkit.View(self.v_cache, shape, "fp8_e4m3"),
                attnkit.View(self.k_scale, (HK,)), attnkit.View(self.v_scale, (HK,)))

    def test_kv_update_quantizes_and_run_reads_the_scales(self):
        kc, vc, ks, vs = self.views()
        attnkit.kv_update(kc, vc, attnkit.View(self.k_new, (self.L, HK, D)), attnkit.View(self.v_new, (self.L, HK, D)),
                          self.slots, k_scale=ks, v_scale=vs)
        # every stored code is the nearest to x / scale (dequantized within half a step)
        k = [[[0.0] * D for _ in range(HK)] for _ in range(self.L)]
        v = [[[0.0] * D for _ in range(HK)] for _ in range(self.L)]
        for j, slot in enumerate(self.slots):
            for g in range(HK):
                for d in range(D):
                    at = (slot * HK + g) * D + d
                    src = (j * HK + g) * D + d
                    kx, vx = e4m3_value(self.k_cache[at]), e4m3_value(self.v_cache[at])
                    self.assertLessEqual(abs(kx - self.k_new[src] / self.k_scale[g]), abs(kx) / 16 + 2 ** -10)
                    self.assertLessEqual(abs(vx - self.v_new[src] / self.v_scale[g]), abs(vx) / 16 + 2 ** -10)
                    k[j][g][d] = kx * self.k_scale[g]
                    v[j][g][d] = vx * self.v_scale[g]
        want = attention([self.q[h * D:(h + 1) * D] for h in range(HQ)], k, v, 1 / math.sqrt(D))
        cfg = attnkit.Config(num_qo_heads=HQ, num_kv_heads=HK, head_dim=D, page_size=PAGE, q_dtype="f32",
                             kv_dtype="fp8_e4m3", o_dtype="f32", workload="decode")
        lim = attnkit.Limits(max_reqs=1, max_tokens=1, max_blocks_per_req=3, num_cache_blocks=BLOCKS)
        for name in ("cpu", "cpu_ref"):
            with self.subTest(backend=name), attnkit.Backend(cfg, lim, name=name) as b:
                o = array.array("f", [math.nan] * (HQ * D))
                b.plan([0, 1], [self.L], [self.blocks])
                b.run(attnkit.View(self.q, (1, HQ, D)), kc, vc, attnkit.View(o, (1, HQ, D)), k_scale=ks, v_scale=vs)
                worst = max(abs(o[h * D + d] - want[h][d]) for h in range(HQ) for d in range(D))
                self.assertLess(worst, 1e-5)

    def test_scale_errors(self):
        kc, vc, ks, vs = self.views()
        rows = attnkit.View(self.k_new, (self.L, HK, D))
        with self.assertRaises(attnkit.InvalidArgument) as cm:
            attnkit.kv_update(kc, vc, rows, rows, self.slots, k_scale=ks)
        self.assertIn("v_scale", str(cm.exception))
        with self.assertRaises(attnkit.InvalidArgument) as cm:
            three = attnkit.View(array.array("f", [1.0, 1.0, 1.0]), (3,))
            attnkit.kv_update(kc, vc, rows, rows, self.slots, k_scale=three, v_scale=three)
        self.assertIn("num_kv_heads", str(cm.exception))
        # scales on a cache that is not fp8: the C library names the field
        f32_cache = attnkit.View(array.array("f", [0.0] * (BLOCKS * PAGE * HK * D)), (BLOCKS, PAGE, HK, D))
        with self.assertRaises(attnkit.InvalidArgument) as cm:
            attnkit.kv_update(f32_cache, f32_cache, rows, rows, self.slots, k_scale=ks, v_scale=vs)
        self.assertIn("scale_kind", str(cm.exception))
        self.assertEqual(bytes(self.k_cache), bytes(len(self.k_cache)), "a refused kv_update wrote the cache")


@unittest.skipIf(torch is None or not hasattr(torch, "float8_e4m3fn"), "torch with float8_e4m3fn is not available")
class TestFp8Torch(unittest.TestCase):
    """torch.float8_e4m3fn caches and f32 scale tensors, on the CPU (and on a GPU
    where the library has CUDA: kv_update only, run() is refused there)."""

    def test_cpu_cache_against_torch(self):
        g = torch.Generator().manual_seed(3)
        L = 37
        k_new = (torch.rand(L, HK, D, generator=g) * 4 - 2).to(torch.bfloat16)
        v_new = (torch.rand(L, HK, D, generator=g) * 2 - 1).to(torch.bfloat16)
        k_scale = k_new.float().abs().amax(dim=(0, 2)) / 448  # per head, as engines calibrate
        v_scale = v_new.float().abs().amax(dim=(0, 2)) / 448
        k_cache = torch.zeros(BLOCKS * 2, PAGE, HK, D, dtype=torch.float8_e4m3fn)
        v_cache = torch.zeros_like(k_cache)
        slots = torch.arange(L, dtype=torch.int64)
        attnkit.kv_update(k_cache, v_cache, k_new, v_new, slots, k_scale=k_scale, v_scale=v_scale)
        # within +-448 attnkit's rounding is torch's
        want_k = (k_new.float() / k_scale[None, :, None]).to(torch.float8_e4m3fn)
        got_k = k_cache.view(-1, HK, D)[:L]
        self.assertTrue(torch.equal(got_k.view(torch.uint8), want_k.view(torch.uint8)))
        # run() against attention in float64 on the dequantized cache
        q = torch.rand(1, HQ, D, generator=g).to(torch.bfloat16)
        cfg = attnkit.Config(num_qo_heads=HQ, num_kv_heads=HK, head_dim=D, page_size=PAGE, q_dtype="bf16",
                             kv_dtype=torch.float8_e4m3fn, o_dtype="f32", workload="decode")
        blocks = list(range(-(-L // PAGE)))
        lim = attnkit.Limits(max_reqs=1, max_tokens=1, max_blocks_per_req=len(blocks), num_cache_blocks=BLOCKS * 2)
        k = got_k.double() * k_scale.double()[None, :, None]
        v = v_cache.view(-1, HK, D)[:L].double() * v_scale.double()[None, :, None]
        qd = q[0].double()
        want = torch.empty(HQ, D, dtype=torch.float64)
        for h in range(HQ):
            s = (k[:, h // (HQ // HK)] @ qd[h]) / math.sqrt(D)
            want[h] = torch.softmax(s, 0) @ v[:, h // (HQ // HK)]
        for name in ("cpu", "cpu_ref"):
            with self.subTest(backend=name), attnkit.Backend(cfg, lim, name=name) as b:
                o = torch.full((1, HQ, D), math.nan)
                b.plan([0, 1], [L], [blocks])
                b.run(q, k_cache, v_cache, o, k_scale=k_scale, v_scale=v_scale)
                self.assertLess((o[0].double() - want).abs().max().item(), 1e-5)

    @unittest.skipIf(torch is None or not torch.cuda.is_available(), "no CUDA device")
    def test_gpu_kv_update_matches_cpu(self):
        if "cuda_paged" not in attnkit.backends():
            self.skipTest("the library has no CUDA backends")
        g = torch.Generator().manual_seed(4)
        L = 29
        k_new = (torch.rand(L, HK, D, generator=g) * 4 - 2).to(torch.float16)
        scale = torch.tensor([0.013, 0.2])
        caches = {}
        for dev in ("cpu", "cuda"):
            kc = torch.zeros(BLOCKS * 2, PAGE, HK, D, dtype=torch.float8_e4m3fn, device=dev)
            vc = torch.zeros_like(kc)
            attnkit.kv_update(kc, vc, k_new.to(dev), k_new.to(dev), torch.arange(L, device=dev),
                              k_scale=scale.to(dev), v_scale=scale.to(dev))
            if dev == "cuda":
                torch.cuda.synchronize()
            caches[dev] = kc.cpu().view(torch.uint8)
        self.assertTrue(torch.equal(caches["cpu"], caches["cuda"]))


if __name__ == "__main__":
    unittest.main()
