"""
test_binding.py - the Python binding (python/attnkit) on the CPU, standard
library only: the cpu and cpu_ref backends against a plain attention formula
written here, the binding's struct layouts, kv_update, and bad input (the C
message naming the field, the output left untouched). Torch tests run only
when torch imports; CUDA tests only when torch sees a GPU and the library has
cuda_paged.

It tests the attnkit that `import attnkit` finds: the installed package
(pip install .), or the source tree's, from the repository root after `make
build`:
    PYTHONPATH=python python3 -m unittest discover -v -s python/tests
    python3 -m pytest python/tests    (conftest.py falls back to python/)
ctest runs every module here as python_binding.
"""
import array
import ctypes
import math
import random
import unittest

import attnkit
from attnkit import _capi

try:
    import torch
except Exception:  # absent, or present but broken: the torch tests skip
    torch = None

NAN = float("nan")
CPU_BACKENDS = ("cpu", "cpu_ref")
TOL = 1e-4  # f32 outputs against the fp64 formula (the C harness's f32 tolerance)


# ---------------------------------------------------------------------------
# A scene: a paged cache of random f32 values, a batch, q; and the formula
# ---------------------------------------------------------------------------

class Scene:
    """Requests (q_len, kv_len) over a paged cache with shuffled block ids."""

    def __init__(self, cfg, reqs, seed=1, spare_blocks=3):
        rng = random.Random(seed)
        self.cfg, self.reqs = cfg, reqs
        self.P, self.Hq, self.Hk = cfg.page_size, cfg.num_qo_heads, cfg.num_kv_heads
        self.Dqk, self.Dvo = cfg.head_dim_qk, cfg.head_dim_vo
        need = [-(-kv // self.P) for _, kv in reqs]
        self.num_blocks = sum(need) + spare_blocks
        ids = list(range(self.num_blocks))
        rng.shuffle(ids)
        self.stride = max(max(need), 1)
        self.block_table, k = [], 0
        for n in need:
            self.block_table.append(ids[k:k + n])
            k += n
        self.qo_indptr = [0]
        for q_len, _ in reqs:
            self.qo_indptr.append(self.qo_indptr[-1] + q_len)
        self.kv_lens = [kv for _, kv in reqs]
        self.num_tokens = self.qo_indptr[-1]
        block_k = self.P * self.Hk * self.Dqk
        block_v = self.P * self.Hk * self.Dvo
        self.k_cache = array.array("f", (rng.uniform(-1, 1) for _ in range(self.num_blocks * block_k)))
        self.v_cache = array.array("f", (rng.uniform(-1, 1) for _ in range(self.num_blocks * block_v)))
        self.q = array.array("f", (rng.uniform(-1, 1)
                                   for _ in range(self.num_tokens * self.Hq * self.Dqk)))
        self.sinks = array.array("f", (rng.uniform(-2, 2) for _ in range(self.Hq)))
        self.o = array.array("f", [NAN] * (self.num_tokens * self.Hq * self.Dvo))
        self.lse = array.array("f", [NAN] * (self.num_tokens * self.Hq))

    def cache_shape(self, d):
        if self.cfg.kv_layout == "HND":
            return (self.num_blocks, self.Hk, self.P, d)
        return (self.num_blocks, self.P, self.Hk, d)

    def views(self):
        sinks = attnkit.View(self.sinks, (self.Hq,)) if self.cfg.use_sinks else None
        return dict(sinks=sinks, q=attnkit.View(self.q, (self.num_tokens, self.Hq, self.Dqk)),
                    k_cache=attnkit.View(self.k_cache, self.cache_shape(self.Dqk)),
                    # MLA: a K-only cache, the value read from the K rows
                    v_cache=None if self.cfg.mla else attnkit.View(self.v_cache, self.cache_shape(self.Dvo)),
                    o=attnkit.View(self.o, (self.num_tokens, self.Hq, self.Dvo)),
                    lse=attnkit.View(self.lse, (self.num_tokens, self.Hq)))

    def limits(self):
        return attnkit.Limits(max_reqs=max(len(self.reqs), 1), max_tokens=max(self.num_tokens, 1),
                              max_blocks_per_req=self.stride, num_cache_blocks=self.num_blocks)

    def poison(self):
        for buf in (self.o, self.lse):
            for i in range(len(buf)):
                buf[i] = NAN

    def slot(self, r, j):
        """Offset (in rows of head_dim) of key j of request r, head 0."""
        block, off = self.block_table[r][j // self.P], j % self.P
        if self.cfg.kv_layout == "HND":
            return (block * self.Hk) * self.P + off, self.P
        return (block * self.P + off) * self.Hk, 1

    def kv_row(self, cache, d, r, j, g):
        base, head_step = self.slot(r, j)
        start = (base + g * head_step) * d
        return cache[start:start + d]

    def reference(self):
        """o [num_tokens, Hq, Dvo] and lse [num_tokens, Hq] in float, the formula
        of attnkit.h: positions kv_len - q_len .., window and causal masks, the
        soft-cap on scaled logits, o = 0 and lse = -inf for a row with no key;
        with sinks, exp(sink_h) joins every row's denominator (a row with no
        key: o = 0, lse = sink_h). MLA: the value of a key is the first Dvo
        values of its K row."""
        cfg = self.cfg
        scale = cfg.sm_scale or 1.0 / math.sqrt(self.Dqk)
        cap, w = cfg.logits_soft_cap, cfg.window_left
        group = self.Hq // self.Hk
        o, lse = [], []
        for r, (q_len, kv_len) in enumerate(self.reqs):
            for i in range(q_len):
                t, p = self.qo_indptr[r] + i, kv_len - q_len + i
                for h in range(self.Hq):
                    g = h // group
                    qv = self.q[(t * self.Hq + h) * self.Dqk:(t * self.Hq + h + 1) * self.Dqk]
                    logits, rows = [], []
                    for j in range(kv_len):
                        if (w >= 0 and j < p - w) or (cfg.causal and j > p):
                            continue
                        s = scale * sum(a * b for a, b in
                                        zip(qv, self.kv_row(self.k_cache, self.Dqk, r, j, g)))
                        if cap > 0:
                            s = cap * math.tanh(s / cap)
                        logits.append(s)
                        rows.append(self.kv_row(self.k_cache, self.Dqk, r, j, g)[:self.Dvo] if cfg.mla
                                    else self.kv_row(self.v_cache, self.Dvo, r, j, g))
                    sink = self.sinks[h] if cfg.use_sinks else None
                    if not logits:
                        o.extend([0.0] * self.Dvo)
                        lse.append(-math.inf if sink is None else sink)
                        continue
                    m = max(logits + ([sink] if sink is not None else []))
                    e = [math.exp(s - m) for s in logits]
                    d = sum(e) + (math.exp(sink - m) if sink is not None else 0.0)
                    o.extend(sum(e[k] * rows[k][c] for k in range(len(e))) / d
                             for c in range(self.Dvo))
                    lse.append(m + math.log(d))
        return o, lse


def max_abs_diff(got, want):
    worst = 0.0
    for a, b in zip(got, want):
        if math.isinf(b) and a == b:
            continue
        if math.isnan(a):
            return math.inf
        worst = max(worst, abs(a - b))
    return worst


# Small cases covering masks, layouts, GQA, head dims that differ, empty rows.
CASES = {
    "nhd_causal_gqa": (dict(num_qo_heads=4, num_kv_heads=2, head_dim=8, page_size=4),
                       [(1, 5), (3, 7), (0, 2), (2, 2)]),
    "hnd_window_softcap": (dict(num_qo_heads=6, num_kv_heads=3, head_dim_qk=8, head_dim_vo=4,
                                page_size=3, kv_layout="HND", window_left=2,
                                logits_soft_cap=3.0, sm_scale=0.5),
                           [(2, 9), (1, 4), (4, 4)]),
    "mha_not_causal": (dict(num_qo_heads=2, num_kv_heads=2, head_dim=16, page_size=2,
                            causal=False),
                       [(3, 2), (1, 5)]),
    "sinks_window": (dict(num_qo_heads=4, num_kv_heads=1, head_dim=8, page_size=4,
                          window_left=3, use_sinks=True),
                     [(1, 9), (5, 5), (2, 11)]),
    "mla_latent": (dict(num_qo_heads=4, num_kv_heads=1, head_dim_qk=12, head_dim_vo=8, page_size=4,
                        sm_scale=0.3, mla=True),
                   [(1, 9), (3, 7), (0, 2), (2, 2)]),
}


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

class TestLibrary(unittest.TestCase):
    def test_backends_and_explain(self):
        names = attnkit.backends()
        for n in CPU_BACKENDS:
            self.assertIn(n, names)
        text = attnkit.explain(attnkit.Config(num_qo_heads=32, num_kv_heads=8))
        self.assertIn("chosen", text)
        self.assertIn("cpu_ref", text)
        self.assertEqual(attnkit.device_count("cpu"), 1)

    def test_mla_prefer_absorbed(self):
        mla = attnkit.Config(num_qo_heads=16, num_kv_heads=1, head_dim_qk=576, head_dim_vo=512, mla=True)
        m = attnkit.MLA_ABSORBED_MAX_Q_LEN
        self.assertEqual([attnkit.mla_prefer_absorbed(mla, n) for n in (0, 1, m, m + 1, 8192, 2**32 + 1)],
                         [False, True, True, False, False, False])
        self.assertFalse(attnkit.mla_prefer_absorbed(attnkit.Config(num_qo_heads=32, num_kv_heads=8), 1))
        self.assertIn("MLA chunks", attnkit.explain(mla))

    def test_struct_layouts(self):
        # ak_tensor returned by value, ak_paged_kv filled by the library: every
        # field read back where the C library put it
        t = attnkit._lib.ak_tensor_4d(ctypes.c_void_p(0x1000), _capi.AK_BF16, 2, 3, 5, 7)
        self.assertEqual((t.data, t.dtype, t.ndim), (0x1000, _capi.AK_BF16, 4))
        self.assertEqual(list(t.shape), [2, 3, 5, 7])
        self.assertEqual(list(t.stride), [105, 35, 7, 1])
        kc = _capi.ak_kv_cache_config()
        attnkit._lib.ak_kv_cache_config_init(ctypes.byref(kc))
        kc.num_layers, kc.num_blocks, kc.page_size, kc.num_kv_heads = 2, 5, 3, 2
        kc.head_dim_qk, kc.head_dim_vo, kc.dtype, kc.layout = 8, 4, _capi.AK_F16, _capi.AK_LAYOUT_HND
        cache = ctypes.c_void_p()
        self.assertEqual(attnkit._lib.ak_kv_cache_create(ctypes.byref(kc), ctypes.byref(cache)), 0)
        try:
            view = _capi.ak_paged_kv()
            self.assertEqual(attnkit._lib.ak_kv_cache_layer(cache, 1, ctypes.byref(view)), 0)
            self.assertEqual((view.dtype, view.layout, view.device.kind, view.device.index),
                             (_capi.AK_F16, _capi.AK_LAYOUT_HND, _capi.AK_DEVICE_CPU, 0))
            self.assertEqual((view.num_blocks, view.page_size, view.num_kv_heads, view.head_dim_qk,
                              view.head_dim_vo), (5, 3, 2, 8, 4))
            self.assertIn(view.k_block_stride, (0, 3 * 2 * 8))
            self.assertIn(view.v_block_stride, (0, 3 * 2 * 4))
            self.assertTrue(view.k_data and view.v_data)
        finally:
            attnkit._lib.ak_kv_cache_destroy(cache)
        # MLA: K pools only, a K-only view
        kc.mla, kc.head_dim_qk, kc.head_dim_vo = 1, 12, 8
        self.assertEqual(attnkit._lib.ak_kv_cache_create(ctypes.byref(kc), ctypes.byref(cache)), 0)
        try:
            view = _capi.ak_paged_kv()
            self.assertEqual(attnkit._lib.ak_kv_cache_layer(cache, 0, ctypes.byref(view)), 0)
            self.assertTrue(view.k_data)
            self.assertIsNone(view.v_data)
            self.assertEqual((view.head_dim_qk, view.head_dim_vo, view.v_block_stride), (12, 8, 0))
        finally:
            attnkit._lib.ak_kv_cache_destroy(cache)

    def test_allocator_alone(self):
        with attnkit.KVCache(8, page_size=4, num_kv_heads=1, head_dim=8, num_layers=0) as c:
            ids = c.alloc(3)
            self.assertEqual(c.num_free, 5)
            c.share(ids[:1])
            c.free(ids)
            self.assertEqual((c.num_free, c.refcount(ids[0])), (7, 1))
        with self.assertRaises(attnkit.InvalidArgument) as cm:
            attnkit.KVCache(8, num_layers=-1)
        self.assertIn("num_layers", str(cm.exception))
        with attnkit.KVCache(8, num_kv_heads=1, head_dim=576, head_dim_vo=512, mla=True) as c:
            self.assertEqual(len(c.alloc(8)), 8)
        with self.assertRaises(attnkit.InvalidArgument) as cm:
            attnkit.KVCache(8, num_kv_heads=1, head_dim=64, head_dim_vo=128, mla=True)
        self.assertIn("head_dim_vo", str(cm.exception))

    def test_config_defaults_and_fields(self):
        c = attnkit.Config()
        self.assertEqual((c.num_qo_heads, c.head_dim_qk, c.q_dtype, c.device, c.page_size,
                          c.kv_layout, c.workload, c.window_left), (1, 128, "f32", "cpu", 16,
                                                                    "NHD", "any", -1))
        with self.assertRaises(TypeError):
            attnkit.Config(num_heads=3)
        self.assertEqual(attnkit.Limits(max_reqs=3).max_reqs, 3)


class TestForward(unittest.TestCase):
    def run_case(self, backend, cfg_kw, reqs, seed):
        cfg = attnkit.Config(**cfg_kw)
        sc = Scene(cfg, reqs, seed=seed)
        with attnkit.Backend(cfg, sc.limits(), name=backend) as b:
            self.assertEqual(b.name, backend)
            self.assertEqual(b.graph_support, "never")
            self.assertFalse(b.forward_includes_kv_update)
            b.plan(sc.qo_indptr, sc.kv_lens, sc.block_table)
            self.assertEqual(b.planned_tokens, sc.num_tokens)
            want_o, want_lse = sc.reference()
            for step in range(2):  # a plan serves any number of runs
                sc.poison()
                b.run(**sc.views())
                self.assertLess(max_abs_diff(sc.o, want_o), TOL, f"o, run {step}")
                self.assertLess(max_abs_diff(sc.lse, want_lse), TOL, f"lse, run {step}")

    def test_cases(self):
        for backend in CPU_BACKENDS:
            for i, (name, (kw, reqs)) in enumerate(CASES.items()):
                with self.subTest(backend=backend, case=name):
                    self.run_case(backend, kw, reqs, seed=10 + i)

    def test_decode_workload(self):
        kw = dict(num_qo_heads=8, num_kv_heads=2, head_dim=8, page_size=4, workload="decode")
        for backend in CPU_BACKENDS:
            with self.subTest(backend=backend):
                self.run_case(backend, kw, [(1, 13), (1, 1), (1, 6)], seed=3)

    def test_selector_and_flat_block_table(self):
        kw, reqs = CASES["nhd_causal_gqa"]
        cfg = attnkit.Config(**kw)
        sc = Scene(cfg, reqs, seed=4)
        flat = [b for row in sc.block_table for b in row + [0] * (sc.stride - len(row))]
        with attnkit.Backend(cfg, sc.limits()) as b:  # the selector's choice
            self.assertIn(b.name, CPU_BACKENDS)
            b.plan(array.array("i", sc.qo_indptr), array.array("i", sc.kv_lens),
                   array.array("i", flat), block_table_stride=sc.stride)
            sc.poison()
            b.run(**sc.views())
            self.assertLess(max_abs_diff(sc.o, sc.reference()[0]), TOL)

    def test_ragged(self):
        cfg = attnkit.Config(num_qo_heads=4, num_kv_heads=2, head_dim=8, kv_storage="ragged")
        reqs = [(2, 5), (1, 3)]
        kv_total = sum(kv for _, kv in reqs)
        # the same K/V as a paged scene with page size 1 and blocks in order
        sc = Scene(attnkit.Config(num_qo_heads=4, num_kv_heads=2, head_dim=8, page_size=1),
                   reqs, seed=6, spare_blocks=0)
        sc.block_table = [list(range(0, 5)), list(range(5, 8))]
        lim = attnkit.Limits(max_reqs=2, max_tokens=3, num_cache_blocks=8)
        for backend in CPU_BACKENDS:
            with self.subTest(backend=backend):
                try:
                    b = attnkit.Backend(cfg, lim, name=backend)
                except attnkit.Unsupported:
                    continue  # says why in its message; cpu_ref serves everything
                with b:
                    b.plan(sc.qo_indptr, sc.kv_lens)
                    sc.poison()
                    v = sc.views()
                    b.run(v["q"], attnkit.View(sc.k_cache, (kv_total, 2, 8)),
                          attnkit.View(sc.v_cache, (kv_total, 2, 8)), v["o"], v["lse"])
                    self.assertLess(max_abs_diff(sc.o, sc.reference()[0]), TOL)

    def test_ragged_prepared_memoryview(self):
        # what bench/peers.py's attnkit_varlen column does, on the CPU: ragged
        # storage, no block table, K/V [sum kv_len, kv_heads, head_dim] in
        # memoryview buffers, one prepared run called twice; a prompt prefill,
        # a chunk on a prefix and a decode in one batch
        kw = dict(num_qo_heads=6, num_kv_heads=2, head_dim=8)
        reqs = [(4, 4), (3, 7), (1, 5)]
        kv_total = sum(kv for _, kv in reqs)
        # the formula reads a paged scene with page size 1 and blocks in order,
        # whose cache is then the contiguous K/V
        sc = Scene(attnkit.Config(page_size=1, **kw), reqs, seed=12, spare_blocks=0)
        sc.block_table, first = [], 0
        for _, kv in reqs:
            sc.block_table.append(list(range(first, first + kv)))
            first += kv
        want_o, want_lse = sc.reference()
        cfg = attnkit.Config(kv_storage="ragged", **kw)
        lim = attnkit.Limits(max_reqs=len(reqs), max_tokens=sc.num_tokens)
        for backend in CPU_BACKENDS:
            with self.subTest(backend=backend), attnkit.Backend(cfg, lim, name=backend) as b:
                self.assertEqual(b.config.kv_storage, "ragged")
                b.plan(array.array("i", sc.qo_indptr), array.array("i", sc.kv_lens))
                self.assertIsNone(b.slot_mapping)
                # the library itself says NULL for ragged storage (attnkit.h)
                self.assertFalse(attnkit._lib.ak_backend_slot_mapping(b._handle()))
                k = attnkit.View(memoryview(sc.k_cache), (kv_total, 2, 8))
                v = attnkit.View(memoryview(sc.v_cache), (kv_total, 2, 8))
                call = b.prepare_run(attnkit.View(memoryview(sc.q), (sc.num_tokens, 6, 8)), k, v,
                                     attnkit.View(memoryview(sc.o), (sc.num_tokens, 6, 8)),
                                     attnkit.View(memoryview(sc.lse), (sc.num_tokens, 6)))
                for step in range(2):
                    sc.poison()
                    call()
                    self.assertLess(max_abs_diff(sc.o, want_o), TOL, f"o, run {step}")
                    self.assertLess(max_abs_diff(sc.lse, want_lse), TOL, f"lse, run {step}")
                # fewer K/V rows than the plan's sum of kv_len: refused, o untouched
                sc.poison()
                short = attnkit.View(memoryview(sc.k_cache), (kv_total - 1, 2, 8))
                with self.assertRaises(attnkit.InvalidArgument):
                    b.run(attnkit.View(sc.q, (sc.num_tokens, 6, 8)), short, short,
                          attnkit.View(sc.o, (sc.num_tokens, 6, 8)))
                self.assertTrue(all(math.isnan(x) for x in sc.o), "a refused run wrote o")
                # ragged K/V have no cache slots: kv_update is refused, and says why
                pool = attnkit.View(array.array("f", [0.0] * (4 * 2 * 2 * 8)), (4, 2, 2, 8))
                new = attnkit.View(array.array("f", [0.0] * (sc.num_tokens * 2 * 8)), (sc.num_tokens, 2, 8))
                with self.assertRaises(attnkit.InvalidArgument) as cm:
                    b.kv_update(pool, pool, new, new)
                self.assertIn("ragged", str(cm.exception))


class TestKvUpdate(unittest.TestCase):
    def test_backend_slot_mapping(self):
        cfg = attnkit.Config(num_qo_heads=4, num_kv_heads=2, head_dim=8, page_size=4)
        sc = Scene(cfg, [(1, 6), (3, 3)], seed=7)
        n = sc.num_tokens
        with attnkit.Backend(cfg, sc.limits(), name="cpu") as b:
            b.plan(sc.qo_indptr, sc.kv_lens, sc.block_table)
            slots = ctypes.cast(b.slot_mapping, ctypes.POINTER(ctypes.c_int64))[:n]
            k_new = array.array("f", (1000.0 + i for i in range(n * 2 * 8)))
            v_new = array.array("f", (-1000.0 - i for i in range(n * 2 * 8)))
            v = sc.views()
            b.kv_update(v["k_cache"], v["v_cache"], attnkit.View(k_new, (n, 2, 8)),
                        attnkit.View(v_new, (n, 2, 8)))
        t = 0
        for r, (q_len, kv_len) in enumerate(sc.reqs):
            for i in range(q_len):
                p = kv_len - q_len + i
                self.assertEqual(slots[t], sc.block_table[r][p // 4] * 4 + p % 4)
                for g in range(2):
                    self.assertEqual(list(sc.kv_row(sc.k_cache, 8, r, p, g)),
                                     list(k_new[(t * 2 + g) * 8:(t * 2 + g + 1) * 8]))
                    self.assertEqual(list(sc.kv_row(sc.v_cache, 8, r, p, g)),
                                     list(v_new[(t * 2 + g) * 8:(t * 2 + g + 1) * 8]))
                t += 1

    def test_mla_k_only(self):
        """MLA: kv_update writes the K rows alone (v None), run() reads the value
        from them (v_cache None); a V pool or a v is refused, naming it."""
        cfg = attnkit.Config(num_qo_heads=4, num_kv_heads=1, head_dim_qk=12, head_dim_vo=8, page_size=4,
                             mla=True)
        sc = Scene(cfg, [(1, 6), (3, 3)], seed=9)
        n = sc.num_tokens
        k_new = array.array("f", (0.01 * i for i in range(n * 12)))
        for backend in CPU_BACKENDS:
            with self.subTest(backend=backend), attnkit.Backend(cfg, sc.limits(), name=backend) as b:
                b.plan(sc.qo_indptr, sc.kv_lens, sc.block_table)
                v = sc.views()
                self.assertIsNone(v["v_cache"])
                b.kv_update(v["k_cache"], None, attnkit.View(k_new, (n, 1, 12)), None)
                sc.poison()
                b.run(**v)
                self.assertLess(max_abs_diff(sc.o, sc.reference()[0]), TOL)
                with self.assertRaises(attnkit.InvalidArgument) as cm:
                    b.kv_update(v["k_cache"], None, attnkit.View(k_new, (n, 1, 12)),
                                attnkit.View(k_new, (n, 1, 12)))
                self.assertIn("v is given", str(cm.exception))
                pool = attnkit.View(sc.v_cache, sc.cache_shape(8))
                with self.assertRaises(attnkit.InvalidArgument) as cm:
                    b.run(**dict(v, v_cache=pool))
                self.assertIn("v_data", str(cm.exception))
        t = 0
        for r, (q_len, kv_len) in enumerate(sc.reqs):
            for i in range(q_len):
                p = kv_len - q_len + i
                self.assertEqual(list(sc.kv_row(sc.k_cache, 12, r, p, 0)), list(k_new[t * 12:(t + 1) * 12]))
                t += 1

    def test_explicit_slots_and_padding(self):
        k_cache = array.array("f", [0.0] * (3 * 2 * 1 * 4))  # 3 blocks, page 2, 1 head, dim 4
        v_cache = array.array("f", [0.0] * (3 * 2 * 1 * 4))
        k = array.array("f", [1, 1, 1, 1, 2, 2, 2, 2])
        attnkit.kv_update(attnkit.View(k_cache, (3, 2, 1, 4)), attnkit.View(v_cache, (3, 2, 1, 4)),
                          attnkit.View(k, (2, 1, 4)), attnkit.View(k, (2, 1, 4)), [5, -1])
        self.assertEqual(list(k_cache[20:24]), [1.0] * 4)  # slot 5: block 2, offset 1
        self.assertEqual(sum(k_cache) + sum(v_cache), 8.0)  # token 1 skipped


class TestBadInput(unittest.TestCase):
    """The C library's message names the field; a refused run writes nothing."""

    def setUp(self):
        kw, reqs = CASES["nhd_causal_gqa"]
        self.cfg = attnkit.Config(**kw)
        self.sc = Scene(self.cfg, reqs, seed=8)
        self.b = attnkit.Backend(self.cfg, self.sc.limits(), name="cpu")
        self.b.plan(self.sc.qo_indptr, self.sc.kv_lens, self.sc.block_table)
        self.sc.poison()

    def tearDown(self):
        self.b.close()

    def assertRefused(self, cls, fragment, **override):
        args = self.sc.views()
        args.update(override)
        with self.assertRaises(cls) as cm:
            self.b.run(**args)
        self.assertIn(fragment, str(cm.exception))
        self.assertTrue(all(math.isnan(x) for x in self.sc.o), "a refused run wrote o")
        return cm.exception

    def test_dtype(self):
        n, sc = self.sc.num_tokens, self.sc
        q16 = array.array("H", [0] * (n * sc.Hq * sc.Dqk))
        e = self.assertRefused(attnkit.InvalidArgument, "args.q->dtype = f16, expected f32",
                               q=attnkit.View(q16, (n, sc.Hq, sc.Dqk), "f16"))
        self.assertIsInstance(e, ValueError)
        self.assertEqual(e.status, 1)
        lse16 = array.array("H", [0] * (n * sc.Hq))
        self.assertRefused(attnkit.InvalidArgument, "args.lse->dtype",
                           lse=attnkit.View(lse16, (n, sc.Hq), "bf16"))

    def test_shape_and_stride(self):
        n, sc = self.sc.num_tokens, self.sc
        self.assertRefused(attnkit.InvalidArgument, "args.q->shape[1] = 2, expected 4",
                           q=attnkit.View(sc.q, (n, 2, sc.Dqk)))
        self.assertRefused(attnkit.InvalidArgument, "args.o->ndim = 2, expected 3",
                           o=attnkit.View(sc.o, (n, sc.Hq * sc.Dvo)))
        wide = array.array("f", [0.0] * (2 * n * sc.Hq * sc.Dqk))
        self.assertRefused(attnkit.InvalidArgument, "args.q->stride[2] = 2",
                           q=attnkit.View(wide, (n, sc.Hq, sc.Dqk),
                                          stride=(2 * sc.Hq * sc.Dqk, 2 * sc.Dqk, 2)))
        # a cache of another page size: the C check on the paged view
        nb = sc.num_blocks
        self.assertRefused(attnkit.InvalidArgument, "args.kv->page_size = 2, expected cfg.page_size = 4",
                           k_cache=attnkit.View(sc.k_cache, (2 * nb, 2, sc.Hk, sc.Dqk)),
                           v_cache=attnkit.View(sc.v_cache, (2 * nb, 2, sc.Hk, sc.Dvo)))
        # a cache that is not 4-D: refused by the binding
        self.assertRefused(attnkit.InvalidArgument, "k_cache has shape",
                           k_cache=attnkit.View(sc.k_cache, (nb * 4, sc.Hk, sc.Dqk)))

    def test_buffer_bounds(self):
        with self.assertRaises(attnkit.InvalidArgument) as cm:
            attnkit.View(array.array("f", [0.0] * 10), (3, 4))
        self.assertIn("the buffer holds 10", str(cm.exception))
        with self.assertRaises(attnkit.InvalidArgument):
            attnkit.View(b"readonly", (8,), "fp8_e4m3")

    def test_plan(self):
        sc = self.sc
        bt = [list(r) for r in sc.block_table]
        bt[1][1] = sc.num_blocks + 7
        with self.assertRaises(attnkit.InvalidArgument) as cm:
            self.b.plan(sc.qo_indptr, sc.kv_lens, bt)
        self.assertIn(f"batch.block_table[1][1] = {sc.num_blocks + 7} is out of range",
                      str(cm.exception))
        with self.assertRaises(attnkit.Error) as cm:  # a failed plan leaves none in force
            self.b.run(**sc.views())
        self.assertIn("plan", str(cm.exception))
        with self.assertRaises(attnkit.InvalidArgument) as cm:
            self.b.plan(sc.qo_indptr[:-1], sc.kv_lens, sc.block_table)
        self.assertIn("qo_indptr has", str(cm.exception))
        with self.assertRaises(attnkit.LimitExceeded) as cm:
            self.b.plan([0, 40], [40], [list(range(10))])
        self.assertIn("limits.max_tokens", str(cm.exception))
        # steps whose requests have no keys: an empty table is none, which they need not give
        self.b.plan([0], [], [])
        self.b.plan([0, 0, 0], [0, 0], [[], []])
        self.b.plan([0, 0], [0], None)
        with self.assertRaises(attnkit.InvalidArgument) as cm:
            self.b.plan([0, 0, 0], [0, 3], [])
        self.assertIn("batch.block_table", str(cm.exception))

    def test_config_and_names(self):
        with self.assertRaises(attnkit.InvalidArgument) as cm:
            attnkit.Backend(attnkit.Config(num_qo_heads=3, num_kv_heads=2), name="cpu")
        self.assertIn("cfg.num_kv_heads", str(cm.exception))
        with self.assertRaises(attnkit.BackendNotFound) as cm:
            attnkit.Backend(attnkit.Config(), name="nope")
        self.assertIn("cpu_ref", str(cm.exception))  # the message lists every backend
        with self.assertRaises(attnkit.InvalidArgument):
            attnkit.Config(q_dtype="f64").to_c()
        with self.assertRaises(attnkit.InvalidArgument) as cm:
            attnkit.Backend(attnkit.Config(q_dtype=7), name="cpu")
        self.assertIn("cfg.q_dtype = 7", str(cm.exception))


@unittest.skipIf(torch is None, "torch is not importable")
class TestTorchCpu(unittest.TestCase):
    def scene_tensors(self, sc, dtype=None):
        dtype = dtype or torch.float32
        q = torch.tensor(sc.q.tolist()).view(sc.num_tokens, sc.Hq, sc.Dqk).to(dtype)
        kc = torch.tensor(sc.k_cache.tolist()).view(sc.cache_shape(sc.Dqk)).to(dtype)
        vc = None if sc.cfg.mla else torch.tensor(sc.v_cache.tolist()).view(sc.cache_shape(sc.Dvo)).to(dtype)
        o = torch.full((sc.num_tokens, sc.Hq, sc.Dvo), NAN, dtype=dtype)
        lse = torch.full((sc.num_tokens, sc.Hq), NAN)
        return q, kc, vc, o, lse

    def test_matches_formula(self):
        for backend in CPU_BACKENDS:
            for name, (kw, reqs) in CASES.items():
                with self.subTest(backend=backend, case=name):
                    cfg = attnkit.Config(**kw)
                    sc = Scene(cfg, reqs, seed=20)
                    q, kc, vc, o, lse = self.scene_tensors(sc)
                    with attnkit.Backend(cfg, sc.limits(), name=backend) as b:
                        b.plan(torch.tensor(sc.qo_indptr), torch.tensor(sc.kv_lens),
                               sc.block_table)
                        sinks = torch.tensor(sc.sinks.tolist()) if cfg.use_sinks else None
                        b.run(q, kc, vc, o, lse, sinks=sinks)
                    want_o, want_lse = sc.reference()
                    self.assertLess(max_abs_diff(o.flatten().tolist(), want_o), TOL)
                    self.assertLess(max_abs_diff(lse.flatten().tolist(), want_lse), TOL)

    def test_bf16_strided_q_and_combined_pool(self):
        kw, reqs = CASES["nhd_causal_gqa"]
        cfg = attnkit.Config(dtype="bf16", **kw)
        sc = Scene(cfg, reqs, seed=21)
        q, kc, vc, o, lse = self.scene_tensors(sc, torch.bfloat16)
        # q as a slice of a wider tensor; K and V as halves of one pool
        wide = torch.zeros(sc.num_tokens, sc.Hq + 3, sc.Dqk, dtype=torch.bfloat16)
        wide[:, :sc.Hq] = q
        pool = torch.stack([kc, vc], dim=1)  # [num_blocks, 2, page, heads, dim]
        with attnkit.Backend(cfg, sc.limits(), name="cpu") as b:
            b.plan(sc.qo_indptr, sc.kv_lens, sc.block_table)
            b.run(wide[:, :sc.Hq], pool[:, 0], pool[:, 1], o, lse)
        # the formula on the bf16-rounded inputs
        sc.q = array.array("f", q.float().flatten().tolist())
        sc.k_cache = array.array("f", kc.float().flatten().tolist())
        sc.v_cache = array.array("f", vc.float().flatten().tolist())
        want_o, _ = sc.reference()
        self.assertLess(max_abs_diff(o.float().flatten().tolist(), want_o), 2e-2)

    def test_bad_torch_inputs(self):
        kw, reqs = CASES["nhd_causal_gqa"]
        cfg = attnkit.Config(**kw)
        sc = Scene(cfg, reqs, seed=22)
        q, kc, vc, o, lse = self.scene_tensors(sc)
        with attnkit.Backend(cfg, sc.limits(), name="cpu") as b:
            b.plan(sc.qo_indptr, sc.kv_lens, sc.block_table)
            with self.assertRaises(attnkit.InvalidArgument) as cm:
                b.run(q.half(), kc, vc, o, lse)
            self.assertIn("args.q->dtype = f16", str(cm.exception))
            with self.assertRaises(attnkit.InvalidArgument) as cm:
                b.run(q, kc, vc, o.transpose(0, 1), lse)
            self.assertIn("args.o->shape[0]", str(cm.exception))
            with self.assertRaises(attnkit.InvalidArgument) as cm:
                b.run(q, kc.transpose(1, 2), vc, o, lse)
            self.assertIn("k_cache.stride", str(cm.exception))
            with self.assertRaises(attnkit.InvalidArgument) as cm:
                b.run(q.double(), kc, vc, o, lse)
            self.assertIn("q has torch dtype torch.float64", str(cm.exception))
            self.assertTrue(torch.isnan(o).all())


def _cuda_ready():
    return (torch is not None and torch.cuda.is_available() and "cuda_paged" in attnkit.backends()
            and attnkit.device_count("cuda") > 0)


@unittest.skipUnless(_cuda_ready(), "needs torch with CUDA and a library with cuda_paged")
class TestTorchCuda(unittest.TestCase):
    def test_decode_matches_cpu_ref(self):
        kw = dict(num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=16, dtype="bf16",
                  workload="decode")
        reqs = [(1, 37), (1, 300), (1, 1), (1, 129)]
        sc = Scene(attnkit.Config(**kw), reqs, seed=30)
        dev = torch.device("cuda")
        gen = torch.Generator().manual_seed(31)

        def rand(*shape):
            return (torch.rand(*shape, generator=gen) * 2 - 1).to(torch.bfloat16)

        q = rand(sc.num_tokens, 8, 128)
        kc, vc = rand(*sc.cache_shape(128)), rand(*sc.cache_shape(128))
        outs = {}
        for name, device in (("cpu_ref", "cpu"), ("cuda_paged", "cuda")):
            cfg = attnkit.Config(device=device, **kw)
            o = torch.full((sc.num_tokens, 8, 128), NAN, dtype=torch.bfloat16, device=device)
            lse = torch.full((sc.num_tokens, 8), NAN, device=device)
            with attnkit.Backend(cfg, sc.limits(), name=name) as b:
                self.assertEqual(b.name, name)
                b.plan(sc.qo_indptr, sc.kv_lens, sc.block_table)
                b.run(q.to(device), kc.to(device), vc.to(device), o, lse)
                if device == "cuda":
                    self.assertNotEqual(b.graph_support, "never")
                    torch.cuda.synchronize()
                    with self.assertRaises(attnkit.InvalidArgument) as cm:
                        b.run(q, kc.to(dev), vc.to(dev), o, lse)  # q left on the CPU
                    self.assertIn("q is on cpu", str(cm.exception))
            outs[name] = (o.float().cpu(), lse.cpu())
        self.assertFalse(torch.isnan(outs["cuda_paged"][0]).any())
        self.assertLess((outs["cuda_paged"][0] - outs["cpu_ref"][0]).abs().max().item(), 2e-2)
        self.assertLess((outs["cuda_paged"][1] - outs["cpu_ref"][1]).abs().max().item(), 1e-2)


if __name__ == "__main__":
    unittest.main()
