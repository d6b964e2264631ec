"""
engine.py - a small LLM serving engine whose every attention layer is attnkit.

The model is a transformers model, used as it is: its projections, rotary
embedding, norms and MLPs run as transformers wrote them; only the attention
function is attnkit's (registered with transformers' AttentionInterface as
"attnkit", the hook vLLM's transformers backend uses too). Each step the
engine flattens the scheduled tokens of every request into one sequence
([1, num_tokens], positions given), plans attnkit once, and runs the model;
each layer's attention writes its new K/V into the paged cache
(Backend.kv_update) and attends over it (Backend.run).

    engine = Engine(model, device="cuda", num_blocks=4096, graphs="decode")
    engine.add(Request(rid=0, prompt=[...], max_new=64))
    while engine.step():
        pass

What an engine does, in small:
  - a paged KV cache: per layer one K and one V tensor [num_blocks,
    page_size, num_kv_heads, head_dim] owned here, their block ids from
    attnkit.KVCache(num_layers=0) (the C allocator alone, refcounted);
  - prefix sharing: a full block is registered under the tokens it ends once
    its K/V are written; a request admitted later whose tokens start the
    same takes those blocks (one more reference each) and skips their
    compute. Blocks are shared among live requests only: a block is freed,
    and forgotten, when its last reference goes;
  - continuous batching: each step decodes every running request, gives the
    rest of the token budget to prompt chunks (chunked prefill: a long
    prompt spans several steps, mixed with decodes), and admits waiting
    requests while blocks last; a request that cannot get a block evicts the
    youngest running request (its blocks freed; it is recomputed later);
  - CUDA graphs: "decode" captures a graph per decode batch-size bucket and
    replays it after each plan (mixed steps run eagerly); "all" captures one
    graph of max_tokens tokens and replays it for every step, as attnkit's
    graph support ALWAYS allows; "off" runs every step eagerly;
  - prompt-only steps (no request has K/V in the cache yet) may attend with
    a ragged backend (cuda_varlen) over the step's own K/V, while the paged
    backend's kv_update still fills the cache.
"""
import contextlib
import math
import sys
import time
import types
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface

import attnkit

# ---------------------------------------------------------------------------
# The attention hook
# ---------------------------------------------------------------------------

_active = []  # the engine whose model is running (a stack: one at a time)


def attnkit_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      sliding_window=None, s_aux=None, **kwargs):
    """transformers' attention interface: query [1, H, T, D], key / value
    [1, KVH, T, D] of the step's flattened tokens; returns ([1, T, H, Dv], None).
    The mask is not used: attnkit's plan says which keys each token sees."""
    if not _active:
        raise RuntimeError("attnkit attention called outside Engine.step (use the engine to run "
                           "the model, or set another attn_implementation)")
    return _active[-1].attention(module, query, key, value, scaling, sliding_window), None


AttentionInterface.register("attnkit", attnkit_attention)


# ---------------------------------------------------------------------------
# Requests and the prefix cache
# ---------------------------------------------------------------------------

@dataclass(eq=False)  # identity: two requests are never equal
class Request:
    rid: int
    prompt: list
    max_new: int
    arrival: int = 0                             # the first step at which it may be admitted
    out: list = field(default_factory=list)      # generated tokens
    logits: list = field(default_factory=list)   # f32 [vocab] of each generated token (keep_logits)
    blocks: list = field(default_factory=list)   # its block table
    computed: int = 0                            # tokens whose K/V are in the cache
    shared_tokens: int = 0                       # taken from the prefix cache at its last admission
    preemptions: int = 0

    @property
    def tokens(self):
        return self.prompt + self.out

    @property
    def finished(self):
        return len(self.out) >= self.max_new


class PrefixCache:
    """Full blocks by the tokens they end (the whole prefix is the key, so two
    blocks match only when everything before them matches too)."""

    def __init__(self, page_size):
        self.page, self.block_of, self.key_of = page_size, {}, {}

    def lookup(self, tokens, limit):
        """Block ids of the longest registered prefix of tokens[:limit]."""
        ids = []
        while (len(ids) + 1) * self.page <= limit:
            b = self.block_of.get(tuple(tokens[:(len(ids) + 1) * self.page]))
            if b is None:
                break
            ids.append(b)
        return ids

    def register(self, req):
        for i in range(req.computed // self.page):
            b = req.blocks[i]
            if b not in self.key_of:
                key = tuple(req.tokens[:(i + 1) * self.page])
                if key not in self.block_of:
                    self.block_of[key], self.key_of[b] = b, key

    def forget(self, block):
        key = self.key_of.pop(block, None)
        if key is not None:
            del self.block_of[key]


# ---------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------

def _attention_layers(model):
    return [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "q_proj")]


def head_dims(m):
    """(q/k, v) head dims of an attention module (DeepSeek's MLA, expanded: 192, 128)."""
    qk = getattr(m, "qk_head_dim", None) or m.head_dim
    return qk, getattr(m, "v_head_dim", None) or qk


class Engine:
    def __init__(self, model, device="cuda", num_blocks=2048, page_size=16, max_reqs=64,
                 max_tokens=512, chunk=None, max_model_len=4096, graphs="off",
                 prompt_backend="auto", backend=None, keep_logits=False, mla="expanded"):
        self.model, self.device = model, torch.device(device)
        self.dtype = next(model.parameters()).dtype
        self.page, self.max_reqs, self.max_tokens = page_size, max_reqs, max_tokens
        self.num_blocks = num_blocks
        self.chunk = chunk or max_tokens
        self.keep_logits = keep_logits
        cfg = model.config
        self.layers = _attention_layers(model)
        first = self.layers[0]
        self.num_qo_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim, self.head_dim_vo = head_dims(first)
        # DeepSeek's MLA: "expanded" lets transformers expand the latent into
        # per-head K/V (q/k 192, v 128) and attends over those; "absorbed"
        # caches the latent rows themselves (cfg.mla: one 576-wide row a token,
        # V its first 512 values) and folds W_UK into q and W_UV into o
        self.mla = mla if hasattr(first, "kv_b_proj") else None
        if self.mla == "absorbed":
            self.num_kv_heads = 1
            self.head_dim, self.head_dim_vo = first.kv_lora_rank + first.qk_rope_head_dim, first.kv_lora_rank
            for m in self.layers:
                m.forward = types.MethodType(_absorbed_mla_forward, m)
                m._attnkit_engine = self
        elif mla not in ("expanded", "absorbed"):
            raise ValueError(f"mla = {mla!r}: expanded or absorbed")
        self.num_layers = len(self.layers)
        self.max_blocks_per_req = -(-max_model_len // page_size)
        # attnkit backends: one per distinct (window, scale) of the layers
        limits = attnkit.Limits(max_reqs=max_reqs, max_tokens=max_tokens,
                                max_blocks_per_req=self.max_blocks_per_req,
                                num_cache_blocks=num_blocks)
        self.paged, self.ragged, self.sinks = {}, {}, {}
        for m in self.layers:
            key = self._key(m)
            if key not in self.paged:
                self.paged[key] = attnkit.Backend(self._config(m, "paged"), limits, name=backend)
            if hasattr(m, "sinks"):
                self.sinks[m.layer_idx] = m.sinks.detach().float().contiguous()
        self.backend_name = next(iter(self.paged.values())).name
        if prompt_backend == "auto":
            prompt_backend = "cuda_varlen" if self.device.type == "cuda" else None
        if prompt_backend and graphs != "all":
            for key, b in self.paged.items():
                m = next(m for m in self.layers if self._key(m) == key)
                self.ragged[key] = attnkit.Backend(self._config(m, "ragged"), limits, name=prompt_backend)
        # the paged cache: the engine's tensors, attnkit's block allocator
        shape = (num_blocks, page_size, self.num_kv_heads)
        self.k_cache = [torch.zeros(shape + (self.head_dim,), dtype=self.dtype, device=self.device)
                        for _ in range(self.num_layers)]
        self.v_cache = [None if self.mla == "absorbed" else
                        torch.zeros(shape + (self.head_dim_vo,), dtype=self.dtype, device=self.device)
                        for _ in range(self.num_layers)]
        # finiteness marks: every write of the cache is kv_update's (prefixes
        # are shared, never copied), so long prefills read a bit a key for the
        # NaN rule's check instead of the K/V rows (attnkit.kv_marks_words)
        words = attnkit.kv_marks_words(num_blocks, self.num_kv_heads, page_size)
        self.marks = [torch.zeros(words, dtype=torch.int32, device=self.device) for _ in range(self.num_layers)]
        self.alloc = attnkit.KVCache(num_blocks, page_size, self.num_kv_heads, self.head_dim,
                                     num_layers=0, dtype=self.dtype, device=str(self.device))
        self.prefix = PrefixCache(page_size)
        self.waiting, self.running, self.finished = [], [], []
        self.step_no, self.use_ragged = 0, False
        self.stats = dict(steps=0, tokens=0, generated=0, shared_tokens=0,
                          preemptions=0, attn_s=0.0, step_s=0.0, graph_steps=0)
        self.time_attention = False
        self._events = []
        self.graphs = Graphs(self, graphs) if graphs != "off" else None

    # -- configuration -------------------------------------------------------

    @staticmethod
    def _key(m):
        return (getattr(m, "sliding_window", None), float(m.scaling))

    def _config(self, m, storage):
        window = getattr(m, "sliding_window", None)
        return attnkit.Config(num_qo_heads=self.num_qo_heads, num_kv_heads=self.num_kv_heads,
                              head_dim_qk=self.head_dim, head_dim_vo=self.head_dim_vo, dtype=self.dtype, device=str(self.device),
                              page_size=self.page, sm_scale=float(m.scaling),
                              # transformers' window of W tokens holds the token itself
                              window_left=window - 1 if window else -1,
                              use_sinks=hasattr(m, "sinks"), kv_storage=storage,
                              mla=self.mla == "absorbed")

    def describe(self):
        names = sorted({b.name for b in self.paged.values()})
        text = f"paged backend {', '.join(names)} ({len(self.paged)} configs)"
        if self.mla:
            text += f"; MLA {self.mla} ({self.head_dim}/{self.head_dim_vo})"
        if self.ragged:
            text += f"; prompt-only steps: {next(iter(self.ragged.values())).name}"
        return text

    # -- requests --------------------------------------------------------------

    def add(self, req):
        total = len(req.prompt) + req.max_new
        if len(req.prompt) < 1 or total > self.max_blocks_per_req * self.page:
            raise ValueError(f"request {req.rid}: prompt {len(req.prompt)} + max_new {req.max_new} "
                             f"must be in [1, max_model_len {self.max_blocks_per_req * self.page}]")
        usable = self.num_blocks - (len(self.graphs.scratch) if self.graphs else 0)
        if -(-total // self.page) > usable:
            raise ValueError(f"request {req.rid}: {total} tokens need {-(-total // self.page)} blocks, "
                             f"the cache has {usable}")
        self.waiting.append(req)

    def _free(self, req):
        if req.blocks:
            self.alloc.free(req.blocks)
            for b in req.blocks:
                if self.alloc.refcount(b) == 0:
                    self.prefix.forget(b)
        req.blocks, req.computed = [], 0

    def _preempt(self, req):
        self._free(req)
        self.running.remove(req)
        self.waiting.insert(0, req)
        req.preemptions += 1
        self.stats["preemptions"] += 1

    def _reserve(self, req, n):
        """Blocks for req's next n tokens; False when too few are free."""
        need = -(-(req.computed + n) // self.page) - len(req.blocks)
        if need <= 0:
            return True
        if self.alloc.num_free < need:
            return False
        req.blocks += self.alloc.alloc(need)
        return True

    # -- scheduling ------------------------------------------------------------

    def schedule(self):
        """[(request, n_tokens)]: decodes first, then prompt chunks, then
        admissions, within max_tokens tokens and max_reqs requests."""
        batch, budget = [], self.max_tokens
        for req in list(self.running):  # decodes, oldest first
            if req not in self.running or len(req.tokens) - req.computed != 1:
                continue
            while not self._reserve(req, 1):
                victims = [r for r in reversed(self.running)
                           if r is not req and all(r is not b for b, _ in batch)]
                if not victims:
                    self._preempt(req)
                    break
                self._preempt(victims[0])
            if req in self.running and budget > 0:
                batch.append((req, 1))
                budget -= 1
        for req in self.running:  # prompt chunks of admitted requests
            left = len(req.tokens) - req.computed
            if left <= 1 or budget == 0:  # one left: a decode, scheduled above
                continue
            n = min(left, budget, self.chunk)
            while n > 0 and not self._reserve(req, n):
                n = (len(req.blocks) + self.alloc.num_free) * self.page - req.computed
            if n > 0:
                batch.append((req, n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_reqs:
            req = self.waiting[0]
            if req.arrival > self.step_no:
                break
            toks = req.tokens
            shared = self.prefix.lookup(toks, len(toks) - 1)  # the last token is computed here
            n = min(len(toks) - len(shared) * self.page, budget, self.chunk)
            need = -(-(len(shared) * self.page + n) // self.page) - len(shared)
            if self.alloc.num_free < need:
                break  # admission control: it waits for blocks
            self.waiting.pop(0)
            if shared:
                self.alloc.share(shared)
            req.blocks = shared + self.alloc.alloc(need)
            req.computed = req.shared_tokens = len(shared) * self.page
            self.stats["shared_tokens"] += req.shared_tokens
            self.running.append(req)
            batch.append((req, n))
            budget -= n
        return batch

    # -- one step ----------------------------------------------------------------

    def step(self):
        """Schedules and runs one step; False when no request is left."""
        if not (self.waiting or self.running):
            return False
        t0 = time.perf_counter()
        batch = self.schedule()
        while not batch and self.running:
            # every running request waits for blocks that only an eviction
            # frees (prompt chunks of many requests filled the cache)
            self._preempt(self.running[-1])
            batch = self.schedule()
        self.step_no += 1
        if not batch:
            return True  # waiting for arrivals
        ids, pos, qo, kv_lens, table, rows = [], [], [0], [], [], []
        for req, n in batch:
            toks = req.tokens
            ids += toks[req.computed:req.computed + n]
            pos += range(req.computed, req.computed + n)
            qo.append(qo[-1] + n)
            kv_lens.append(req.computed + n)
            table.append(req.blocks)
            if req.computed + n == len(toks):
                rows.append(qo[-1] - 1)
        decode_only = all(n == 1 for _, n in batch)
        self.use_ragged = bool(self.ragged) and all(req.computed == 0 for req, _ in batch)
        graph = self.graphs.pick(len(ids), decode_only) if self.graphs else None
        if graph is None:
            self._plan(qo, kv_lens, table)
            logits = self.forward(torch.tensor(ids, device=self.device), torch.tensor(pos, device=self.device),
                                  torch.tensor(rows, device=self.device, dtype=torch.long))
        else:
            logits = self.graphs.replay(graph, ids, pos, rows, (qo, kv_lens, table))
            self.stats["graph_steps"] += 1
        logits = logits.float()
        next_tokens = logits.argmax(-1).tolist()  # greedy (synchronizes)
        k = 0
        for req, n in batch:
            req.computed += n
            if req.computed == len(req.tokens):
                req.out.append(next_tokens[k])
                if self.keep_logits:
                    req.logits.append(logits[k].cpu())
                k += 1
        for req, n in batch:
            self.prefix.register(req)
            if req.finished:
                self._free(req)
                self.running.remove(req)
                self.finished.append(req)
        s = self.stats
        s["steps"] += 1
        s["tokens"] += len(ids)
        s["generated"] += len(rows)
        s["step_s"] += time.perf_counter() - t0
        if self._events:
            s["attn_s"] += sum(a.elapsed_time(b) for a, b in self._events) / 1e3
            self._events = []
        return True

    def _plan(self, qo, kv_lens, table):
        for b in self.paged.values():
            b.plan(qo, kv_lens, table)
        if self.use_ragged:
            for b in self.ragged.values():
                b.plan(qo, kv_lens)

    def forward(self, ids, pos, rows):
        """Logits [len(rows), vocab] of the model over the planned step."""
        _active.append(self)
        try:
            hidden = self.model.model(input_ids=ids[None], position_ids=pos[None],
                                      use_cache=False).last_hidden_state[0]
        finally:
            _active.pop()
        return self.model.lm_head(hidden.index_select(0, rows))

    def attention(self, module, query, key, value, scaling, sliding_window):
        layer = module.layer_idx
        k_key = (sliding_window, float(scaling))
        b = self.paged[k_key]
        q = query[0].transpose(0, 1)  # [T, H, D], strided views: attnkit reads them as they are
        k = key[0].transpose(0, 1)
        v = value[0].transpose(0, 1)
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        timing = self.time_attention
        if timing:
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            else:
                t0 = time.perf_counter()
        # (a backend whose run writes the cache itself would not keep the marks)
        marks = None if b.forward_includes_kv_update else self.marks[layer]
        if not b.forward_includes_kv_update:
            b.kv_update(kc, vc, k, v, marks=marks)
        o = q.new_empty((q.shape[0], q.shape[1], v.shape[-1]))
        sinks = self.sinks.get(layer)
        if self.use_ragged:
            self.ragged[k_key].run(q, k.contiguous(), v.contiguous(), o, sinks=sinks)
        else:
            b.run(q, kc, vc, o, sinks=sinks, marks=marks)
        if timing:
            if self.device.type == "cuda":
                end.record()
                self._events.append((start, end))
            else:
                self.stats["attn_s"] += time.perf_counter() - t0
        return o[None]

    def latent_attention(self, module, q, rows):
        """Absorbed MLA: q [T, H, R + rope], this step's latent rows [T, 1, R +
        rope] -> o [T, H, R], over the layer's latent cache (K only)."""
        layer = module.layer_idx
        k_key = (None, float(module.scaling))
        b = self.paged[k_key]
        kc = self.k_cache[layer]
        b.kv_update(kc, None, rows, None, marks=self.marks[layer])
        o = q.new_empty((q.shape[0], q.shape[1], self.head_dim_vo))
        if self.use_ragged:
            self.ragged[k_key].run(q, rows.contiguous(), None, o)
        else:
            b.run(q, kc, None, o, marks=self.marks[layer])
        return o

    def close(self):
        for m in self.layers:  # transformers' own forward again
            if "forward" in vars(m):
                del m.forward
        for b in list(self.paged.values()) + list(self.ragged.values()):
            b.close()
        self.alloc.close()


def _absorbed_mla_forward(self, hidden_states, position_embeddings, attention_mask=None, past_key_values=None,
                          **kwargs):
    """DeepseekV3Attention.forward in the absorbed form: the same weights and
    rotary embedding as transformers' expanded form, with q_nope taken through
    W_UK (so q meets the latent rows) and the latent output through W_UV."""
    e = self._attnkit_engine
    hf = sys.modules[type(self).__module__]
    T = hidden_states.shape[1]
    if self.q_lora_rank is None:
        q = self.q_proj(hidden_states)
    else:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
    q = q.view(1, T, -1, self.qk_head_dim).transpose(1, 2)  # [1, H, T, 192]
    q_nope, q_rot = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
    latent, k_rot = torch.split(self.kv_a_proj_with_mqa(hidden_states), [self.kv_lora_rank, self.qk_rope_head_dim],
                                dim=-1)
    latent = self.kv_a_layernorm(latent).view(1, 1, T, self.kv_lora_rank)
    k_rot = k_rot.view(1, 1, T, self.qk_rope_head_dim)
    cos, sin = position_embeddings
    rope = hf.apply_rotary_pos_emb_interleave if self.config.rope_interleave else hf.apply_rotary_pos_emb
    q_rot, k_rot = rope(q_rot, k_rot, cos, sin)
    w = self.kv_b_proj.weight.view(-1, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
    w_uk, w_uv = w[:, :self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]  # [H, 128, 512], [H, 128, 512]
    q_lat = torch.einsum("hnr,htn->thr", w_uk, q_nope[0])                   # [T, H, 512]
    q_full = torch.cat((q_lat, q_rot[0].transpose(0, 1)), dim=-1)            # [T, H, 576]
    rows = torch.cat((latent, k_rot), dim=-1)[0].transpose(0, 1)            # [T, 1, 576]
    o_lat = e.latent_attention(self, q_full, rows)                          # [T, H, 512]
    o = torch.einsum("thr,hvr->thv", o_lat, w_uv).reshape(1, T, -1)         # [1, T, H * 128]
    return self.o_proj(o), None


@contextlib.contextmanager
def _transformers_attention(model):
    """transformers' own attention forward for the duration (the absorbed MLA
    forward is an instance attribute the engine sets)."""
    saved = [(m, vars(m).pop("forward")) for m in _attention_layers(model) if "forward" in vars(m)]
    try:
        yield
    finally:
        for m, f in saved:
            m.forward = f


# ---------------------------------------------------------------------------
# CUDA graphs
# ---------------------------------------------------------------------------

class Graphs:
    """Captured steps. mode "decode": a graph per bucket of decode batch sizes
    (1, 2, 4, ... max_reqs), used for decode-only steps; mode "all": one graph
    of max_tokens tokens (and max_reqs logits rows) for every step. Each is
    captured once, after planning a stand-in batch of its size over scratch
    blocks (run() checks its tensors against the plan in force), and replayed
    after the real step's plan: attnkit's kernels read the plan from device
    buffers, rows past the planned tokens are left alone and their slots are
    -1, so kv_update writes nothing for them."""

    def __init__(self, engine, mode):
        if engine.device.type != "cuda":
            raise ValueError("CUDA graphs need device cuda")
        if mode not in ("decode", "all"):
            raise ValueError(f"graphs = {mode!r}: off, decode or all")
        e = self.e = engine
        self.mode = mode
        if mode == "decode":
            sizes, s = [], 1
            while s < e.max_reqs:
                sizes.append(s)
                s *= 2
            self.sizes = sizes + [e.max_reqs]
        else:
            self.sizes = [e.max_tokens]
        top = max(self.sizes)
        self.scratch = e.alloc.alloc(-(-top // e.page))
        dev = e.device
        self.ids = torch.zeros(top, dtype=torch.long, device=dev)
        self.pos = torch.zeros(top, dtype=torch.long, device=dev)
        self.rows = torch.zeros(min(top, e.max_reqs), dtype=torch.long, device=dev)
        self.graphs, self.out = {}, {}
        self.pool = torch.cuda.graph_pool_handle()
        for t in sorted(self.sizes, reverse=True):
            self._capture(t)

    def _capture(self, t):
        e, n_rows = self.e, min(t, self.e.max_reqs)
        e.use_ragged = False
        e._plan([0, t], [t], [self.scratch[:-(-t // e.page)]])
        ids, pos, rows = self.ids[:t], self.pos[:t], self.rows[:n_rows]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                e.forward(ids, pos, rows)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.out[t] = e.forward(ids, pos, rows)
        torch.cuda.synchronize()
        self.graphs[t] = g

    def pick(self, num_tokens, decode_only):
        if self.mode == "decode" and not decode_only:
            return None
        for t in sorted(self.sizes):
            if t >= num_tokens:
                return t
        return None

    def replay(self, t, ids, pos, rows, plan):
        e = self.e
        n = len(ids)
        # the real step's inputs into the captured buffers (padding rows: token 0, position 0)
        host = torch.zeros((3, t), dtype=torch.long)
        host[0, :n] = torch.tensor(ids)
        host[1, :n] = torch.tensor(pos)
        host[2, :len(rows)] = torch.tensor(rows, dtype=torch.long)
        host = host.pin_memory()
        self.ids[:t].copy_(host[0], non_blocking=True)
        self.pos[:t].copy_(host[1], non_blocking=True)
        n_rows = self.rows[:min(t, e.max_reqs)].numel()
        self.rows[:n_rows].copy_(host[2, :n_rows], non_blocking=True)
        e._plan(*plan)
        self.graphs[t].replay()
        return self.out[t][:len(rows)]


# ---------------------------------------------------------------------------
# The reference: transformers' own attention over each whole sequence
# ---------------------------------------------------------------------------

def reference_logits(model, req, attn_implementation="sdpa"):
    """Logits [len(out), vocab] (f32, CPU) of transformers' forward over the
    request's prompt and generated tokens (teacher forcing: position i's
    logits predict token i + 1), with its own attention and no cache."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(attn_implementation)
    try:
        with _transformers_attention(model):
            toks = torch.tensor([req.tokens[:-1]], device=next(model.parameters()).device)
            logits = model(input_ids=toks, use_cache=False).logits[0]
    finally:
        model.set_attn_implementation(previous)
    return logits[len(req.prompt) - 1:].float().cpu()


def compare(model, requests, tol, attn_implementation="sdpa"):
    """Checks every request's logits and greedy tokens against the reference.
    Logits: max |engine - reference| <= tol * max |reference| per step. Tokens:
    the engine's greedy token is the reference's argmax, or within 2 * tol *
    max |reference| of it (a near-tie that rounding may break either way).
    Returns a dict of counts and the worst relative error."""
    worst, steps, equal, ties, bad = 0.0, 0, 0, 0, []
    for req in requests:
        ref = reference_logits(model, req, attn_implementation)
        for j, got in enumerate(req.logits):
            want = ref[j]
            scale = want.abs().max().item()
            err = (got - want).abs().max().item() / scale
            worst = max(worst, err)
            steps += 1
            t_ref, t_got = int(want.argmax()), req.out[j]
            if t_ref == t_got:
                equal += 1
            elif (want[t_ref] - want[t_got]).item() <= 2 * tol * scale:
                ties += 1
            else:
                bad.append((req.rid, j, "token", t_got, t_ref))
            if err > tol:
                bad.append((req.rid, j, "logits", err))
    return dict(steps=steps, equal_tokens=equal, near_ties=ties, worst_rel_err=worst, failures=bad)


def summary_rows(engine, wall_s):
    s = engine.stats
    return [("requests", len(engine.finished)),
            ("steps", s["steps"]),
            ("steps replayed from a CUDA graph", s["graph_steps"]),
            ("tokens computed (prompt + decode)", s["tokens"]),
            ("prompt tokens taken from shared blocks", s["shared_tokens"]),
            ("preemptions", s["preemptions"]),
            ("generated tokens", s["generated"]),
            ("wall time, s", f"{wall_s:.3f}"),
            ("generated tokens/s", f"{s['generated'] / wall_s:.1f}"),
            ("all tokens/s", f"{s['tokens'] / wall_s:.1f}"),
            ("time per step, ms", f"{1e3 * s['step_s'] / max(s['steps'], 1):.2f}")]


def attention_share(engine, wall_s):
    s = engine.stats
    return s["attn_s"] / s["step_s"] if s["step_s"] else math.nan
