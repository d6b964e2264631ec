"""
test_torch_ops.py - attnkit.torch: kv_update and run as torch.library custom
operators, in a tiny attention layer (projections, kv_update, run, output
projection) compiled with torch.compile(fullgraph=True), which fails on any
graph break.

    python -m pytest python/tests/test_torch_ops.py

- CPU (torch installed): torch.library.opcheck of the operators; the compiled
  layer equals the eager one over two steps with different plans (outputs and
  the cache it wrote); an MLA backend's K-only form (no V cache, no v).
- CUDA (torch with a GPU and a library with cuda_paged; skipped otherwise):
  the compiled step captured in a CUDA graph; after a new plan (other
  requests, other context lengths, the same number of tokens), a replay
  equals the eager layer; again with the block table in a persistent int32
  tensor on the GPU, read in place (plan(..., device_table)).
Every case compares with the eager layer, itself checked against cpu_ref by
test_binding.py.
"""
import unittest

import attnkit

try:
    import torch
    import attnkit.torch as akt
except Exception:  # absent, or present but broken: every case skips
    torch = None

HIDDEN = 64
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 32
PAGE_SIZE = 16
MAX_BLOCKS_PER_REQ = 8
NUM_BLOCKS = 64


class Step:
    """One step's batch: requests (q_len, kv_len) with their blocks taken in
    turn from a shuffled list of block ids."""

    def __init__(self, reqs, seed):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randperm(NUM_BLOCKS, generator=g).tolist()
        self.qo_indptr, self.kv_lens, self.block_table = [0], [], []
        for q_len, kv_len in reqs:
            need = -(-kv_len // PAGE_SIZE)
            self.block_table.append(ids[:need] + [-1] * (MAX_BLOCKS_PER_REQ - need))
            ids = ids[need:]
            self.qo_indptr.append(self.qo_indptr[-1] + q_len)
            self.kv_lens.append(kv_len)
        self.num_tokens = self.qo_indptr[-1]

    def plan(self, backend, device_table=None):
        """With device_table (an engine's persistent int32 table on the GPU):
        this step's rows are copied into it, and the plan reads it in place."""
        if device_table is None:
            backend.plan(self.qo_indptr, self.kv_lens, self.block_table)
            return
        device_table.fill_(-1)
        rows = torch.tensor(self.block_table, dtype=torch.int32)
        device_table[:rows.shape[0]].copy_(rows)
        backend.plan(self.qo_indptr, self.kv_lens, device_table)


if torch is not None:
    class TinyAttention(torch.nn.Module):
        """x [num_tokens, HIDDEN] -> q, k, v -> kv_update -> run -> output
        projection; the layer's paged K/V cache is a buffer."""

        def __init__(self, backend, dtype, device, seed=0):
            super().__init__()
            torch.manual_seed(seed)
            self.backend = backend
            self.qkv = torch.nn.Linear(HIDDEN, (NUM_QO_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM,
                                       bias=False, dtype=dtype, device=device)
            self.out = torch.nn.Linear(NUM_QO_HEADS * HEAD_DIM, HIDDEN, bias=False, dtype=dtype,
                                       device=device)
            shape = (NUM_BLOCKS, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM)
            self.register_buffer("k_cache", torch.randn(shape, dtype=dtype, device=device))
            self.register_buffer("v_cache", torch.randn(shape, dtype=dtype, device=device))

        def forward(self, x):
            n = x.shape[0]
            q, k, v = self.qkv(x).split([NUM_QO_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM,
                                         NUM_KV_HEADS * HEAD_DIM], dim=-1)
            q = q.reshape(n, NUM_QO_HEADS, HEAD_DIM)
            k = k.reshape(n, NUM_KV_HEADS, HEAD_DIM).contiguous()
            v = v.reshape(n, NUM_KV_HEADS, HEAD_DIM).contiguous()
            akt.kv_update(self.backend, self.k_cache, self.v_cache, k, v)
            o = akt.run(self.backend, q, self.k_cache, self.v_cache)
            return self.out(o.reshape(n, NUM_QO_HEADS * HEAD_DIM))


def _backend(device, dtype, name):
    cfg = attnkit.Config(num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM,
                         dtype=dtype, device=device, page_size=PAGE_SIZE)
    lim = attnkit.Limits(max_reqs=8, max_tokens=64, max_blocks_per_req=MAX_BLOCKS_PER_REQ,
                         num_cache_blocks=NUM_BLOCKS)
    return attnkit.Backend(cfg, lim, name=name)


@unittest.skipIf(torch is None, "torch is not importable")
class TestCpu(unittest.TestCase):
    def setUp(self):
        torch._dynamo.reset()
        self.backend = _backend("cpu", "f32", "cpu")

    def tearDown(self):
        self.backend.close()

    def test_opcheck(self):
        step = Step([(1, 20), (3, 40)], seed=1)
        step.plan(self.backend)
        g = torch.Generator().manual_seed(2)
        n = step.num_tokens
        q = torch.randn(n, NUM_QO_HEADS, HEAD_DIM, generator=g)
        k = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=g)
        v = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=g)
        shape = (NUM_BLOCKS, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM)
        kc, vc = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
        h = self.backend.handle
        torch.library.opcheck(torch.ops.attnkit.kv_update.default, (h, kc, vc, k, v))
        torch.library.opcheck(torch.ops.attnkit.run.default, (h, q, kc, vc, torch.float32))
        torch.library.opcheck(torch.ops.attnkit.run_lse.default, (h, q, kc, vc, torch.float32))
        o, lse = akt.run(self.backend, q, kc, vc, return_lse=True)
        self.assertEqual((o.shape, o.dtype, lse.shape), ((n, NUM_QO_HEADS, HEAD_DIM), torch.float32,
                                                         (n, NUM_QO_HEADS)))
        self.assertTrue(torch.equal(o, akt.run(self.backend, q, kc, vc)))

    def test_mla_k_only(self):
        # an MLA backend: one latent K cache, V its first head_dim_vo values
        cfg = attnkit.Config(num_qo_heads=4, num_kv_heads=1, head_dim_qk=24, head_dim_vo=16, mla=True,
                             page_size=PAGE_SIZE)
        lim = attnkit.Limits(max_reqs=8, max_tokens=64, max_blocks_per_req=MAX_BLOCKS_PER_REQ,
                             num_cache_blocks=NUM_BLOCKS)
        with attnkit.Backend(cfg, lim, name="cpu") as b:
            step = Step([(1, 20), (3, 40)], seed=5)
            step.plan(b)
            g = torch.Generator().manual_seed(6)
            n = step.num_tokens
            q, k = torch.randn(n, 4, 24, generator=g), torch.randn(n, 1, 24, generator=g)
            kc = torch.randn((NUM_BLOCKS, PAGE_SIZE, 1, 24), generator=g)
            h = b.handle
            torch.library.opcheck(torch.ops.attnkit.kv_update.default, (h, kc, None, k, None))
            torch.library.opcheck(torch.ops.attnkit.run.default, (h, q, kc, None, torch.float32))
            torch.library.opcheck(torch.ops.attnkit.run_lse.default, (h, q, kc, None, torch.float32))

            def layer(q, k, kc):
                akt.kv_update(b, kc, None, k, None)
                return akt.run(b, q, kc, None)

            k0 = kc.clone()
            eager = layer(q, k, kc)
            k_eager = kc.clone()
            kc.copy_(k0)
            compiled = torch.compile(layer, fullgraph=True)(q, k, kc)
            want = torch.empty(n, 4, 16)
            kc2 = k0.clone()
            b.kv_update(kc2, None, k, None)
            b.run(q, kc2, None, want)
            self.assertEqual(eager.shape, (n, 4, 16))
            self.assertFalse(torch.equal(k_eager, k0))
            torch.testing.assert_close(eager, want, atol=0, rtol=0)
            torch.testing.assert_close(compiled, want, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(kc, k_eager, atol=0, rtol=0)

    def test_compiled_equals_eager(self):
        model = TinyAttention(self.backend, torch.float32, "cpu")
        compiled = torch.compile(model, fullgraph=True)
        k0, v0 = model.k_cache.clone(), model.v_cache.clone()
        # a mixed step (decodes, a chunk on a prefix), then a step of other requests
        steps = [Step([(1, 17), (5, 40), (1, 1), (2, 33)], seed=3),
                 Step([(1, 64), (1, 5), (7, 7)], seed=4)]
        with torch.no_grad():
            for i, step in enumerate(steps):
                step.plan(self.backend)
                x = torch.randn(step.num_tokens, HIDDEN, generator=torch.Generator().manual_seed(i))
                model.k_cache.copy_(k0), model.v_cache.copy_(v0)
                eager = model(x)
                k_eager, v_eager = model.k_cache.clone(), model.v_cache.clone()
                model.k_cache.copy_(k0), model.v_cache.copy_(v0)
                out = compiled(x)
                with self.subTest(step=i):
                    self.assertFalse(torch.isnan(out).any())
                    torch.testing.assert_close(out, eager, atol=1e-4, rtol=1e-4)
                    self.assertFalse(torch.equal(model.k_cache, k0))  # the step's K/V written
                    torch.testing.assert_close(model.k_cache, k_eager, atol=1e-5, rtol=1e-5)
                    torch.testing.assert_close(model.v_cache, v_eager, atol=1e-5, rtol=1e-5)


def _cuda_ready():
    return (torch is not None and torch.cuda.is_available() and "cuda_paged" in attnkit.backends()
            and attnkit.device_count("cuda") > 0)


@unittest.skipUnless(_cuda_ready(), "needs torch with CUDA, a GPU and a library with cuda_paged")
class TestCudaGraph(unittest.TestCase):
    def setUp(self):
        torch._dynamo.reset()
        self.backend = _backend("cuda", "bf16", "cuda_paged")

    def tearDown(self):
        self.backend.close()

    def test_compiled_step_in_cuda_graph(self):
        self._graph_step(tables=(None, None))

    def test_device_block_table_in_cuda_graph(self):
        # the engine's block table stays on the GPU, read in place; the second
        # plan names another tensor, which the captured replay must follow
        self._graph_step(tables=[torch.full((8, MAX_BLOCKS_PER_REQ), -1, dtype=torch.int32, device="cuda")
                                 for _ in range(2)])

    def _graph_step(self, tables):
        model = TinyAttention(self.backend, torch.bfloat16, "cuda")
        compiled = torch.compile(model, fullgraph=True)
        # the same number of tokens (6) in both steps: the graph's x and output
        first = Step([(1, 17), (3, 40), (1, 1), (1, 90)], seed=5)
        second = Step([(2, 70), (1, 3), (3, 3)], seed=6)
        gen = torch.Generator(device="cuda").manual_seed(7)
        x1 = torch.randn(6, HIDDEN, dtype=torch.bfloat16, device="cuda", generator=gen)
        x2 = torch.randn(6, HIDDEN, dtype=torch.bfloat16, device="cuda", generator=gen)
        with torch.no_grad():
            first.plan(self.backend, tables[0])
            eager1 = model(x1)
            # kv_update writes the same rows to the same slots again: the
            # compiled step and the capture leave the cache as eager left it
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # compile, and warm up outside the capture
                    warm = compiled(x1)
            torch.cuda.current_stream().wait_stream(side)
            torch.testing.assert_close(warm, eager1, atol=2e-2, rtol=2e-2)
            static_x = x1.clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = compiled(static_x)

            second.plan(self.backend, tables[1])  # a new plan, then a replay of the capture
            static_x.copy_(x2)
            graph.replay()
            replayed = static_out.clone()
            k_after, v_after = model.k_cache.clone(), model.v_cache.clone()
            second.plan(self.backend)  # the eager reference plans with the host table
            eager2 = model(x2)
            torch.cuda.synchronize()
        self.assertFalse(torch.isnan(replayed).any())
        torch.testing.assert_close(replayed, eager2, atol=2e-2, rtol=2e-2)
        # the replay wrote the second step's K/V where eager writes them
        torch.testing.assert_close(model.k_cache, k_after, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(model.v_cache, v_after, atol=2e-2, rtol=2e-2)


if __name__ == "__main__":
    unittest.main()
