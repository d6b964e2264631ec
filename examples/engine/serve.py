"""
serve.py - attnkit's engine example: a transformers model served with
continuous batching, chunked prefill, prefix sharing and CUDA graphs, every
attention layer attnkit's (engine.py says how).

    python examples/engine/serve.py --device cpu             # the cpu backend, a small model
    python examples/engine/serve.py --device cpu --check     # every step's logits against transformers
    python examples/engine/serve.py --device cuda --model qwen2 --graphs decode
    python examples/engine/serve.py --device cuda --compare-graphs
    AK_BACKEND=cuda_paged python examples/engine/serve.py --device cuda

Weights are random (seeded): no checkpoint ships with a PyPI package that
runs offline. --size real keeps the architecture's published shapes (heads,
head dim, hidden and MLP sizes) with --layers layers and a 32000-token
vocabulary; --size small shrinks them for a CPU. gpt-oss keeps its sinks,
its alternating 128-token window and full layers, with 4 experts (2 active);
DeepSeek-V3 keeps its MLA attention (q/k 192, v 128 in the expanded form)
with 4 routed experts (2 active) after one dense layer.
"""
import argparse
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine as eng  # noqa: E402  (registers the "attnkit" attention)

SHAPES = {
    # architecture: (config class name, real shapes, small shapes)
    "llama": ("LlamaConfig",  # Llama-3-8B
              dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, rope_theta=500000.0),
              dict(hidden_size=256, intermediate_size=512, num_attention_heads=8,
                   num_key_value_heads=2, head_dim=32)),
    "qwen2": ("Qwen2Config",  # Qwen2-7B: q/k/v biases
              dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                   num_key_value_heads=4, rope_theta=1000000.0),
              dict(hidden_size=224, intermediate_size=448, num_attention_heads=7,
                   num_key_value_heads=1)),
    "deepseek-v3": ("DeepseekV3Config",  # MLA in transformers' expanded form: 128 heads, q/k 192, v 128
                    dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                         num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536,
                         kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                         n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                         first_k_dense_replace=1),
                    dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                         num_attention_heads=8, num_key_value_heads=8, q_lora_rank=None,
                         kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                         n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                         first_k_dense_replace=1)),
    "gpt-oss": ("GptOssConfig",  # gpt-oss-20b's attention: sinks, window 128 / full
                dict(hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
                     num_key_value_heads=8, head_dim=64, sliding_window=128,
                     num_local_experts=4, num_experts_per_tok=2),
                dict(hidden_size=256, intermediate_size=256, num_attention_heads=8,
                     num_key_value_heads=2, head_dim=32, sliding_window=16,
                     num_local_experts=4, num_experts_per_tok=2)),
}


def reference_attention(arch):
    """transformers' attention that --check compares with (gpt-oss's sinks have
    no sdpa path there)."""
    return "eager" if arch == "gpt-oss" else "sdpa"


def build_model(arch, size, layers, dtype, device, seed, experts=None):
    import transformers
    name, real, small = SHAPES[arch]
    kw = dict(real if size == "real" else small)
    kw.update(num_hidden_layers=layers, vocab_size=32000 if size == "real" else 2048,
              max_position_embeddings=8192)
    if arch == "gpt-oss" and experts:
        kw.update(num_local_experts=experts, num_experts_per_tok=min(2, experts))
    if arch == "deepseek-v3" and experts:
        kw.update(n_routed_experts=experts, num_experts_per_tok=min(2, experts))
    if arch == "gpt-oss":
        kw["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    cfg = getattr(transformers, name)(**kw)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype,
                                                          attn_implementation=reference_attention(arch))
    if arch == "gpt-oss":  # random sinks of the size trained ones have
        with torch.no_grad():
            for m in eng._attention_layers(model):
                m.sinks.normal_(0.0, 1.0)
    model = model.to(device).eval()
    model.set_attn_implementation("attnkit")
    return model


def workload(args, vocab):
    """Requests: lengths uniform in --prompt-len, every other one starting with
    the same --shared-prefix tokens; four arrive every --arrive-every steps."""
    rng = random.Random(args.seed)
    prefix = [rng.randrange(vocab) for _ in range(args.shared_prefix)]
    lo, hi = args.prompt_len
    reqs = []
    for i in range(args.requests):
        n = rng.randint(max(lo, args.shared_prefix + 1) if i % 2 == 0 else lo, max(hi, lo))
        head = prefix if i % 2 == 0 else []
        prompt = head + [rng.randrange(vocab) for _ in range(n - len(head))]
        reqs.append(eng.Request(rid=i, prompt=prompt, max_new=args.max_new, arrival=(i // 4) * args.arrive_every))
    return reqs


def make_engine(args, model, graphs):
    return eng.Engine(model, device=args.device, num_blocks=args.num_blocks, page_size=args.page,
                      max_reqs=args.max_reqs, max_tokens=args.max_tokens, chunk=args.chunk,
                      max_model_len=args.max_model_len, graphs=graphs,
                      prompt_backend=None if args.prompt_backend == "off" else args.prompt_backend,
                      keep_logits=args.check, mla=args.mla)


def sync(args):
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def serve(args, model, graphs, time_attention=False, quiet=False):
    """Runs the workload once (after a short warm-up on the same engine);
    returns (engine, wall seconds)."""
    e = make_engine(args, model, graphs)
    vocab = model.config.vocab_size
    for r in (eng.Request(rid=-1, prompt=[1] * 20, max_new=3), eng.Request(rid=-2, prompt=[2] * 9, max_new=3)):
        e.add(r)
    while e.step():
        pass
    e.finished.clear()
    e.stats = {k: 0 if isinstance(v, int) else 0.0 for k, v in e.stats.items()}
    e.step_no = 0
    e.time_attention = time_attention
    reqs = workload(args, vocab)
    for r in reqs:
        e.add(r)
    bar = None
    if not quiet and sys.stderr.isatty():
        try:
            from tqdm import tqdm
            bar = tqdm(total=sum(r.max_new for r in reqs), unit="tok", desc=f"graphs {graphs}", leave=False)
        except ImportError:
            pass
    sync(args)
    t0 = time.perf_counter()
    done = 0
    while e.step():
        if bar is not None:
            n = e.stats["generated"]
            bar.update(n - done)
            done = n
    sync(args)
    wall = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    return e, wall


def table(rows, title):
    w = max(len(k) for k, _ in rows)
    print(f"\n{title}")
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="llama", choices=sorted(SHAPES))
    p.add_argument("--size", choices=("real", "small"), help="default: real on cuda, small on cpu")
    p.add_argument("--layers", type=int, help="default: 4 (real), 2 (small)")
    p.add_argument("--dtype", choices=("bf16", "f32"), help="default: bf16 on cuda, f32 on cpu")
    p.add_argument("--experts", type=int, help="gpt-oss, deepseek-v3: routed experts per layer (default 4, 2 "
                   "active); 1 (gpt-oss) or 2 (deepseek-v3, whose expert groups need 2) makes every expert "
                   "active, so bf16 rounding cannot flip a router's choice under --check")
    p.add_argument("--mla", choices=("expanded", "absorbed"), default="expanded",
                   help="deepseek-v3: attend over per-head K/V transformers expands (q/k 192, v 128), or "
                   "over the latent cache itself (attnkit's cfg.mla: 576-wide rows, V their first 512)")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt-len", type=lambda s: tuple(int(x) for x in s.split(",")), default=None,
                   help="min,max prompt tokens (default: 64,512 real, 12,48 small)")
    p.add_argument("--shared-prefix", type=int, default=None, help="tokens every other request starts with")
    p.add_argument("--max-new", type=int, default=None, help="tokens generated per request")
    p.add_argument("--arrive-every", type=int, default=3, help="steps between arrivals of 4 requests")
    p.add_argument("--max-reqs", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=None, help="token budget of a step")
    p.add_argument("--chunk", type=int, default=None, help="largest prompt chunk of a step")
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--graphs", choices=("off", "decode", "all"), default=None,
                   help="default: decode on cuda, off on cpu")
    p.add_argument("--compare-graphs", action="store_true", help="the workload under off, decode and all")
    p.add_argument("--prompt-backend", default="auto",
                   help="ragged backend for prompt-only steps: auto (cuda_varlen on cuda), off, or a name")
    p.add_argument("--check", action="store_true",
                   help="every step's logits and greedy tokens against transformers' own attention")
    p.add_argument("--tol", type=float, default=None, help="--check's relative tolerance")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no GPU (use --device cpu)")
    args.size = args.size or ("real" if cuda else "small")
    args.layers = args.layers or (4 if args.size == "real" else 2)
    args.dtype = args.dtype or ("bf16" if cuda else "f32")
    args.prompt_len = args.prompt_len or ((64, 512) if args.size == "real" else (12, 48))
    args.shared_prefix = args.shared_prefix if args.shared_prefix is not None else (
        80 if args.size == "real" else 20)
    args.max_new = args.max_new or (32 if args.size == "real" else 8)
    args.max_tokens = args.max_tokens or (1024 if args.size == "real" else 64)
    args.chunk = args.chunk or args.max_tokens // 2
    args.num_blocks = args.num_blocks or 4096
    args.graphs = args.graphs or ("decode" if cuda else "off")
    if not cuda and (args.graphs != "off" or args.compare_graphs):
        p.error("CUDA graphs need --device cuda")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    args.tol = args.tol or (3e-2 if args.dtype == "bf16" else 1e-3)

    torch.set_grad_enabled(False)
    model = build_model(args.model, args.size, args.layers, dtype, args.device, args.seed, args.experts)
    cfg = model.config
    print(f"{args.model} ({args.size} shapes, random weights): {args.layers} layers, "
          f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads of "
          f"{'/'.join(map(str, sorted(set(eng.head_dims(eng._attention_layers(model)[0])), reverse=True)))}, "
          f"{args.dtype} on {args.device}")
    results = dict(args={k: v for k, v in vars(args).items()}, runs=[])
    status = 0
    modes = ("off", "decode", "all") if args.compare_graphs else (args.graphs,)
    first = None
    for mode in modes:
        e, wall = serve(args, model, mode)
        if first is None:
            print(e.describe())
        rows = eng.summary_rows(e, wall)
        run = dict(graphs=mode, backend=e.backend_name, wall_s=wall, **e.stats,
                   tokens_per_s=e.stats["generated"] / wall)
        if first is None:
            first = {r.rid: r.out for r in e.finished}
        else:
            same = sum(first[r.rid] == r.out for r in e.finished)
            rows.append(("requests with the same tokens as graphs " + modes[0], f"{same}/{len(e.finished)}"))
        if mode == "off":  # attention's share, timed with events in an eager run
            e2, wall2 = serve(args, model, "off", time_attention=True, quiet=True)
            share = eng.attention_share(e2, wall2)
            rows.append(("share of step time in attention", f"{100 * share:.1f}%"))
            run["attention_share"] = share
            e2.close()
        table(rows, f"graphs {mode}: {e.describe()}")
        if args.check:
            ref = reference_attention(args.model)
            c = eng.compare(model, e.finished, args.tol, ref)
            print(f"  check against transformers ({ref}), tol {args.tol:g}: {c['steps']} steps, "
                  f"{c['equal_tokens']} tokens equal, {c['near_ties']} near-ties, "
                  f"worst relative logit error {c['worst_rel_err']:.2e}")
            for f in c["failures"][:10]:
                print("  FAIL", f)
            run["check"] = {k: v for k, v in c.items() if k != "failures"}
            run["check"]["failures"] = len(c["failures"])
            status |= bool(c["failures"])
        results["runs"].append(run)
        e.close()
    if args.compare_graphs:
        print("\ngraphs  tokens/s  ms/step")
        for r in results["runs"]:
            print(f"{r['graphs']:<7} {r['tokens_per_s']:9.1f} {1e3 * r['step_s'] / max(r['steps'], 1):8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return status


if __name__ == "__main__":
    sys.exit(main())
