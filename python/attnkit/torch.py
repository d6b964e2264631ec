"""
attnkit.torch - attnkit's kv_update and run as PyTorch custom operators
(torch.library.custom_op), so that a model compiled with
torch.compile(fullgraph=True) calls attnkit without a graph break, and its
compiled step can be captured in a CUDA graph.

    import attnkit, attnkit.torch
    b = attnkit.Backend(cfg, limits)                    # as without torch
    # in the model's forward, per layer (compiled or not):
    attnkit.torch.kv_update(b, k_cache, v_cache, k, v)  # unless b.forward_includes_kv_update
    o = attnkit.torch.run(b, q, k_cache, v_cache)       # a new tensor [num_tokens, num_qo_heads,
                                                        #   head_dim_vo] in config.o_dtype
    o, lse = attnkit.torch.run(b, q, k_cache, v_cache, return_lse=True)
    # each step, outside the compiled model and outside any graph capture:
    b.plan(qo_indptr, kv_lens, block_table)

The operators are torch.ops.attnkit.kv_update, .run and .run_lse. They take
tensors and scalars only: a backend is its integer handle (Backend.handle,
looked up with attnkit.backend_from_handle while the backend lives), and the
output dtype is an argument, so the fake implementations that torch.compile
traces with need nothing but the arguments. kv_update writes k_cache and
v_cache in place (declared as mutated) at the slots of the plan in force;
run reads them. plan() stays a plain Python call: it changes the backend's
static device buffers, which a captured run() and kv_update read at every
replay (graph support ALWAYS for the CUDA backends), so a graph captured once
replays after any later plan within the limits, as in C. For inference:
the operators have no autograd formula (run them under torch.no_grad() or
torch.inference_mode()).

Importing this module imports torch and registers the operators, once.
"""
from typing import Optional

import torch

import attnkit

__all__ = ["kv_update", "run"]

_TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def _innermost_contiguous(t):
    # the binding wants stride 1 in the innermost dimension; a compiled graph
    # may hand over another layout
    return t if t.dim() == 0 or t.stride(-1) == 1 else t.contiguous()


def _head_dim_vo(handle, v_cache):
    # an MLA (K-only) cache has no V tensor: the config says how wide o is
    return v_cache.shape[-1] if v_cache is not None else attnkit.backend_from_handle(handle).config.head_dim_vo


def _run_into(handle, q, k_cache, v_cache, o_dtype, lse, k_scale=None, v_scale=None, sinks=None):
    b = attnkit.backend_from_handle(handle)
    q = _innermost_contiguous(q)
    o = q.new_empty((q.shape[0], q.shape[1], _head_dim_vo(handle, v_cache)), dtype=o_dtype)
    b.run(q, k_cache, v_cache, o, lse, k_scale=k_scale, v_scale=v_scale, sinks=sinks)
    return o


# ---------------------------------------------------------------------------
# The operators
# ---------------------------------------------------------------------------

@torch.library.custom_op("attnkit::kv_update", mutates_args=("k_cache", "v_cache"))
def _kv_update_op(handle: int, k_cache: torch.Tensor, v_cache: Optional[torch.Tensor], k: torch.Tensor,
                  v: Optional[torch.Tensor], k_scale: Optional[torch.Tensor] = None,
                  v_scale: Optional[torch.Tensor] = None) -> None:
    attnkit.backend_from_handle(handle).kv_update(k_cache, v_cache, _innermost_contiguous(k),
                                                  None if v is None else _innermost_contiguous(v),
                                                  k_scale=k_scale, v_scale=v_scale)


@_kv_update_op.register_fake
def _(handle, k_cache, v_cache, k, v, k_scale=None, v_scale=None):
    return None


@torch.library.custom_op("attnkit::run", mutates_args=())
def _run_op(handle: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: Optional[torch.Tensor],
            o_dtype: torch.dtype, k_scale: Optional[torch.Tensor] = None,
            v_scale: Optional[torch.Tensor] = None, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    return _run_into(handle, q, k_cache, v_cache, o_dtype, None, k_scale, v_scale, sinks)


@_run_op.register_fake
def _(handle, q, k_cache, v_cache, o_dtype, k_scale=None, v_scale=None, sinks=None):
    return q.new_empty((q.shape[0], q.shape[1], _head_dim_vo(handle, v_cache)), dtype=o_dtype)


@torch.library.custom_op("attnkit::run_lse", mutates_args=())
def _run_lse_op(handle: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: Optional[torch.Tensor],
                o_dtype: torch.dtype, k_scale: Optional[torch.Tensor] = None,
                v_scale: Optional[torch.Tensor] = None,
                sinks: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)
    return _run_into(handle, q, k_cache, v_cache, o_dtype, lse, k_scale, v_scale, sinks), lse


@_run_lse_op.register_fake
def _(handle, q, k_cache, v_cache, o_dtype, k_scale=None, v_scale=None, sinks=None):
    return (q.new_empty((q.shape[0], q.shape[1], _head_dim_vo(handle, v_cache)), dtype=o_dtype),
            q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32))


# ---------------------------------------------------------------------------
# What a model calls
# ---------------------------------------------------------------------------

def kv_update(backend, k_cache, v_cache, k, v, k_scale=None, v_scale=None):
    """Writes this step's k, v ([planned tokens, num_kv_heads, head_dim]) into
    the paged cache at the slots of backend's plan (Backend.kv_update as an
    operator). An MLA cache is K only: v_cache and v are None. A torch.float8_e4m3fn cache quantizes them with k_scale /
    v_scale (f32, 1 or num_kv_heads elements, on the cache's device)."""
    torch.ops.attnkit.kv_update(backend.handle, k_cache, v_cache, k, v, k_scale, v_scale)


def run(backend, q, k_cache, v_cache, return_lse=False, k_scale=None, v_scale=None, sinks=None):
    """Attention of q over the planned batch (Backend.run as an operator): o,
    a new [num_tokens, num_qo_heads, head_dim_vo] tensor in the config's
    o_dtype on q's device; with return_lse, (o, lse) with lse f32
    [num_tokens, num_qo_heads]. fp8 caches: the layer's k_scale / v_scale.
    config.use_sinks: the layer's sinks, f32 [num_qo_heads]. config.mla: the
    latent cache is k_cache alone (v_cache None), o is head_dim_vo wide."""
    o_dtype = _TORCH_DTYPES[backend.config.o_dtype]
    if return_lse:
        return torch.ops.attnkit.run_lse(backend.handle, q, k_cache, v_cache, o_dtype, k_scale, v_scale, sinks)
    return torch.ops.attnkit.run(backend.handle, q, k_cache, v_cache, o_dtype, k_scale, v_scale, sinks)
