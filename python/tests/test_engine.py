"""
test_engine.py - examples/engine on attnkit: a transformers model served with
continuous batching, chunked prefill, prefix sharing and eviction, every
step's logits and greedy tokens checked against transformers' own attention
over the whole sequence (serve.py --check). Skipped without torch and
transformers.

- CPU (the cpu backend): Llama in f32 with too few blocks (eviction and
  recompute), Qwen2 (q/k/v biases) in bf16, gpt-oss (sinks, window 16 and
  full layers alternating) in f32 over prompts longer than the window,
  DeepSeek-V3 in f32, its MLA both in transformers' expanded form (q/k and
  v head dims differ) and absorbed over a latent cache (cfg.mla), and the
  absorbed form in bf16.
- CUDA (a GPU and a library with cuda_paged): Llama's real shapes in bf16
  under every graph mode (off, decode buckets, one graph for every step),
  and gpt-oss's real attention shapes (one expert, so that bf16 rounding
  cannot flip a router's choice), DeepSeek-V3's real attention shapes
  (128 heads, q/k 192, v 128) in bf16.
"""
import json
import os
import sys
import tempfile
import unittest

import attnkit

try:
    import torch
    import transformers  # noqa: F401
except Exception:  # absent, or present but broken: every case skips
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(HERE, "..", "..", "examples", "engine")


def serve(*argv):
    """serve.py's main with --check; (status, results)."""
    if ENGINE not in sys.path:
        sys.path.insert(0, ENGINE)
    import serve as serve_mod
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "out.json")
        status = serve_mod.main(list(argv) + ["--check", "--json", path])
        with open(path) as f:
            return status, json.load(f)


@unittest.skipIf(torch is None, "torch and transformers not installed")
class TestEngineCpu(unittest.TestCase):
    def check(self, results, requests=16):
        for run in results["runs"]:
            c = run["check"]
            self.assertEqual(c["failures"], 0, run)
            self.assertEqual(c["steps"], run["generated"])
            self.assertGreaterEqual(c["steps"], requests)
            self.assertGreater(run["shared_tokens"], 0, "no prompt shared a block")

    def test_llama_f32_eviction(self):
        status, res = serve("--device", "cpu", "--model", "llama", "--dtype", "f32", "--num-blocks", "14",
                            "--max-new", "12", "--requests", "16")
        self.assertEqual(status, 0)
        self.check(res)
        self.assertGreater(res["runs"][0]["preemptions"], 0, "14 blocks should force evictions")
        self.assertLess(res["runs"][0]["check"]["worst_rel_err"], 1e-4)
        # every request at once, prompt chunks of 8: the chunks fill the cache
        # with no decode left to evict for; the engine must evict a prefill
        status, res = serve("--device", "cpu", "--model", "llama", "--dtype", "f32", "--num-blocks", "8",
                            "--prompt-len", "40,60", "--chunk", "8", "--max-tokens", "64", "--arrive-every", "0",
                            "--shared-prefix", "0", "--max-new", "4", "--requests", "16")
        self.assertEqual(status, 0)
        self.assertGreater(res["runs"][0]["preemptions"], 0)
        self.assertEqual(res["runs"][0]["check"]["failures"], 0)

    def test_qwen2_bf16(self):
        status, res = serve("--device", "cpu", "--model", "qwen2", "--dtype", "bf16", "--requests", "16")
        self.assertEqual(status, 0)
        self.check(res)

    def test_deepseek_v3_expanded_mla(self):
        status, res = serve("--device", "cpu", "--model", "deepseek-v3", "--dtype", "f32", "--max-new", "8",
                            "--requests", "16")
        self.assertEqual(status, 0)
        self.check(res)
        self.assertLess(res["runs"][0]["check"]["worst_rel_err"], 1e-4)

    def test_deepseek_v3_absorbed_mla(self):
        # the latent cache itself (cfg.mla: K-only 80-wide rows, V their first 64),
        # W_UK folded into q and W_UV into o, with evictions; then bf16 with
        # every routed expert active (no router choice for rounding to flip)
        status, res = serve("--device", "cpu", "--model", "deepseek-v3", "--mla", "absorbed", "--dtype", "f32",
                            "--num-blocks", "14", "--max-new", "8", "--requests", "16")
        self.assertEqual(status, 0)
        self.check(res)
        self.assertGreater(res["runs"][0]["preemptions"], 0)
        self.assertLess(res["runs"][0]["check"]["worst_rel_err"], 1e-4)
        status, res = serve("--device", "cpu", "--model", "deepseek-v3", "--mla", "absorbed", "--dtype", "bf16",
                            "--experts", "2", "--max-new", "8", "--requests", "16")
        self.assertEqual(status, 0)
        self.check(res)

    def test_gpt_oss_sinks_window(self):
        status, res = serve("--device", "cpu", "--model", "gpt-oss", "--dtype", "f32", "--prompt-len", "20,60",
                            "--max-new", "10", "--requests", "16")
        self.assertEqual(status, 0)
        self.check(res)
        self.assertLess(res["runs"][0]["check"]["worst_rel_err"], 1e-4)


def _cuda():
    return torch is not None and torch.cuda.is_available() and "cuda_paged" in attnkit.backends()


@unittest.skipUnless(_cuda(), "no GPU, or a library without cuda_paged")
class TestEngineCuda(unittest.TestCase):
    def test_llama_every_graph_mode(self):
        status, res = serve("--device", "cuda", "--model", "llama", "--compare-graphs", "--requests", "16",
                            "--max-new", "16", "--layers", "2")
        self.assertEqual(status, 0)
        modes = [r["graphs"] for r in res["runs"]]
        self.assertEqual(modes, ["off", "decode", "all"])
        for r in res["runs"]:
            self.assertEqual(r["check"]["failures"], 0, r)
            self.assertGreater(r["shared_tokens"], 0)
        self.assertGreater(res["runs"][1]["graph_steps"], 0)
        self.assertEqual(res["runs"][2]["graph_steps"], res["runs"][2]["steps"])

    def test_gpt_oss_bf16(self):
        status, res = serve("--device", "cuda", "--model", "gpt-oss", "--graphs", "off", "--experts", "1",
                            "--layers", "2", "--prompt-len", "100,400", "--max-new", "16")
        self.assertEqual(status, 0)

    def test_deepseek_v3_bf16(self):
        # MoE layers make host decisions: no graphs; every expert active (--experts 2)
        status, res = serve("--device", "cuda", "--model", "deepseek-v3", "--graphs", "off", "--layers", "2",
                            "--experts", "2", "--prompt-len", "100,400", "--max-new", "16")
        self.assertEqual(status, 0)


if __name__ == "__main__":
    unittest.main()
