"""
attnkit - a thin Python binding of libattnkit.so (ctypes, standard library only).

    import attnkit
    cfg = attnkit.Config(num_qo_heads=32, num_kv_heads=8, head_dim=128, dtype="bf16",
                         device="cuda", page_size=16, workload="decode")
    b = attnkit.Backend(cfg, attnkit.Limits(max_reqs=64, num_cache_blocks=8192))
    b.plan(qo_indptr, kv_lens, block_table)        # host lists / CPU tensors
    b.kv_update(k_cache, v_cache, k_new, v_new)    # unless b.forward_includes_kv_update
    b.run(q, k_cache, v_cache, o, lse)             # torch tensors or attnkit.View

Tensors are PyTorch tensors (CPU or CUDA; torch is never imported by attnkit,
only recognised when the caller has imported it) or CPU buffers wrapped in
View(obj, shape, dtype). On CUDA the current torch stream is used unless
`stream=` names one (an int cudaStream_t or an object with .cuda_stream).
A paged cache is 4-D: [num_blocks, page_size, num_kv_heads, head_dim] (NHD)
or [num_blocks, num_kv_heads, page_size, head_dim] (HND); the block stride
may be anything (a slice of a combined K/V pool), the rest must be packed.

The library is found through ATTNKIT_LIB, else the copy installed inside
this package (pip install .), else, in a source checkout, build/libattnkit.so,
else the loader's search path; library_path says which. Every failure raises
attnkit.Error (or a subclass) carrying ak_last_error()'s message.
`python -m attnkit` prints what attnkit-info prints. With PyTorch,
attnkit.torch registers kv_update and run as torch.library custom ops.
"""
import ctypes
import itertools
import operator
import sys
import weakref

from . import _capi
from ._errors import BackendNotFound, Error, InvalidArgument, LimitExceeded, Unsupported
from ._errors import BY_STATUS as _BY_STATUS
from ._tensor import View, as_arg as _as_arg, host_int_array as _host_int_array
from ._tensor import is_torch_tensor as _is_torch_tensor, _torch
from ._tensor import DTYPES as _DTYPES, dtype_name as _dtype_name
from ._tensor import parse_device as _parse_device, device_str as _device_str

__all__ = ["Backend", "BackendNotFound", "Config", "Error", "InvalidArgument", "KVCache",
           "LimitExceeded", "Limits", "Unsupported", "View", "backends", "device_count", "explain",
           "kv_marks_words", "kv_update", "library_path", "mla_prefer_absorbed", "MLA_ABSORBED_MAX_Q_LEN", "version",
           "backend_from_handle"]

_lib, library_path = _capi.load()
_capi.declare(_lib)
_capi.check_struct_sizes(_lib)

__version__ = _lib.ak_version_string().decode()


def version():
    """The library's version as an int: major * 10000 + minor * 100 + patch."""
    return _lib.ak_version()


def _check(status):
    if status != _capi.AK_OK:
        msg = (_lib.ak_last_error() or b"").decode(errors="replace")
        text = (_lib.ak_status_str(status) or b"").decode()
        raise _BY_STATUS.get(status, Error)(msg, status, text)


from ._cache import KVCache  # noqa: E402  (the block allocator; uses _check)


# ---------------------------------------------------------------------------
# Enum names <-> values
# ---------------------------------------------------------------------------

_LAYOUTS = {"NHD": _capi.AK_LAYOUT_NHD, "HND": _capi.AK_LAYOUT_HND}
_STORAGES = {"paged": _capi.AK_KV_PAGED, "ragged": _capi.AK_KV_RAGGED}
_WORKLOADS = {"any": _capi.AK_WORKLOAD_ANY, "decode": _capi.AK_WORKLOAD_DECODE}


def _c_int(value, field):
    """value as a C int for field: an integer (or an integral float) in the
    int32 range, never wrapped by ctypes into another value."""
    try:
        n = operator.index(value)
    except TypeError:
        if not (isinstance(value, float) and value.is_integer()):
            raise InvalidArgument(f"{field} = {value!r} is not an integer") from None
        n = int(value)
    if not -2**31 <= n < 2**31:
        raise InvalidArgument(f"{field} = {n} is outside a C int's range")
    return n


def _enum_value(table, value, field):
    if isinstance(value, int) and not isinstance(value, bool):
        return _c_int(value, field)  # passed through: the C library names a bad value
    for k, v in table.items():
        if str(value).lower() == k.lower():
            return v
    raise InvalidArgument(f"{field} = {value!r} is not one of {', '.join(table)}")


def _enum_name(table, value):
    for k, v in table.items():
        if v == value:
            return k
    return value


def _dtype_code(value, field):
    if isinstance(value, int) and not isinstance(value, bool):
        return _c_int(value, field)
    code = _DTYPES[_dtype_name(value, field)][0]
    if code is None:
        raise InvalidArgument(f"{field} = {value!r} is not a floating-point dtype")
    return code


# ---------------------------------------------------------------------------
# Config and Limits
# ---------------------------------------------------------------------------

class Config:
    """ak_attn_config. Defaults are the C library's (ak_attn_config_init): MHA
    1/1 heads, head dim 128, f32 on the CPU, causal, full window, no soft-cap,
    paged NHD cache with page size 16, any workload.

    Fields (the C names): num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo,
    sm_scale (0: 1/sqrt(head_dim_qk)), causal, window_left (-1: full),
    logits_soft_cap (0: off), q_dtype, kv_dtype, o_dtype ('f32', 'f16', 'bf16',
    'fp8_e4m3' or a torch dtype), device ('cpu', 'cuda', 'cuda:N'), kv_storage
    ('paged', 'ragged'), kv_layout ('NHD', 'HND'), page_size, workload ('any',
    'decode'), use_sinks (run() then takes sinks=), batch_invariant, mla
    (multi-head latent attention: one KV head, the value is the first
    head_dim_vo of each K row; run() and kv_update() then take v_cache None
    and a K-only cache, KVCache(..., mla=True)).
    Shorthands: head_dim= sets both head dims, dtype= all three dtypes.
    """

    FIELDS = ("num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "sm_scale", "causal",
              "window_left", "logits_soft_cap", "q_dtype", "kv_dtype", "o_dtype", "device",
              "kv_storage", "kv_layout", "page_size", "workload", "use_sinks", "batch_invariant", "mla")

    def __init__(self, head_dim=None, dtype=None, **fields):
        c = _capi.ak_attn_config()
        _lib.ak_attn_config_init(ctypes.byref(c))
        self._set_from_c(c)
        if head_dim is not None:
            self.head_dim_qk = self.head_dim_vo = head_dim
        if dtype is not None:
            self.q_dtype = self.kv_dtype = self.o_dtype = dtype
        for k, v in fields.items():
            if k not in self.FIELDS:
                raise TypeError(f"Config has no field {k!r} (fields: {', '.join(self.FIELDS)})")
            setattr(self, k, v)

    def _set_from_c(self, c):
        for f in ("num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "sm_scale",
                  "causal", "window_left", "logits_soft_cap", "page_size"):
            setattr(self, f, getattr(c, f))
        self.causal = bool(c.causal)
        self.use_sinks = bool(c.use_sinks)
        self.batch_invariant = bool(c.batch_invariant)
        self.mla = bool(c.mla)
        for f in ("q_dtype", "kv_dtype", "o_dtype"):
            setattr(self, f, _capi_dtype_name(getattr(c, f)))
        self.device = _device_str((c.device.kind, c.device.index))
        self.kv_storage = _enum_name(_STORAGES, c.kv_storage)
        self.kv_layout = _enum_name(_LAYOUTS, c.kv_layout)
        self.workload = _enum_name(_WORKLOADS, c.workload)

    @classmethod
    def from_c(cls, c):
        self = cls.__new__(cls)
        self._set_from_c(c)
        return self

    def to_c(self):
        c = _capi.ak_attn_config()
        _lib.ak_attn_config_init(ctypes.byref(c))
        for f in ("num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "window_left",
                  "page_size", "causal", "use_sinks", "batch_invariant", "mla"):
            setattr(c, f, _c_int(getattr(self, f), "config." + f))
        c.sm_scale = float(self.sm_scale)
        c.logits_soft_cap = float(self.logits_soft_cap)
        for f in ("q_dtype", "kv_dtype", "o_dtype"):
            setattr(c, f, _dtype_code(getattr(self, f), "config." + f))
        c.device.kind, c.device.index = _parse_device(self.device, "config.device")
        c.kv_storage = _enum_value(_STORAGES, self.kv_storage, "config.kv_storage")
        c.kv_layout = _enum_value(_LAYOUTS, self.kv_layout, "config.kv_layout")
        c.workload = _enum_value(_WORKLOADS, self.workload, "config.workload")
        return c

    @property
    def device_tuple(self):
        return _parse_device(self.device, "config.device")

    def __repr__(self):
        return "Config(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS) + ")"


def _capi_dtype_name(code):
    try:
        return _dtype_name(code)
    except InvalidArgument:
        return code


class Limits:
    """ak_limits: max_reqs, max_tokens, max_blocks_per_req, num_cache_blocks,
    max_splits (0: the backend's choice). Defaults are ak_limits_init's."""

    FIELDS = ("max_reqs", "max_tokens", "max_blocks_per_req", "num_cache_blocks", "max_splits")

    def __init__(self, **fields):
        c = _capi.ak_limits()
        _lib.ak_limits_init(ctypes.byref(c))
        for f in self.FIELDS:
            setattr(self, f, getattr(c, f))
        for k, v in fields.items():
            if k not in self.FIELDS:
                raise TypeError(f"Limits has no field {k!r} (fields: {', '.join(self.FIELDS)})")
            setattr(self, k, v)

    def to_c(self):
        c = _capi.ak_limits()
        _lib.ak_limits_init(ctypes.byref(c))
        for f in self.FIELDS:
            setattr(c, f, _c_int(getattr(self, f), "limits." + f))
        return c

    def __repr__(self):
        return "Limits(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS) + ")"


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

def backends():
    """Names of every backend compiled into the library."""
    return [_lib.ak_backend_name_at(i).decode() for i in range(_lib.ak_backend_count())]


def device_count(kind="cuda"):
    """Devices of a kind ('cpu' counts 1; 'cuda' is 0 without CUDA or a GPU)."""
    return _lib.ak_device_count(_parse_device(kind, "kind")[0])


def explain(config, cap=16384):
    """The selector's account of config: every backend with 'chosen',
    'available' or its reasons, and the rule that chose."""
    c = config.to_c()
    buf = ctypes.create_string_buffer(cap)
    _lib.ak_explain(ctypes.byref(c), buf, cap)
    return buf.value.decode(errors="replace")


MLA_ABSORBED_MAX_Q_LEN = 32  # attnkit.h's AK_MLA_ABSORBED_MAX_Q_LEN


def mla_prefer_absorbed(config, q_len):
    """True where a request of q_len new tokens of an MLA model runs faster
    absorbed (config, an MLA config) than expanded (head dims 192/128):
    1 <= q_len <= MLA_ABSORBED_MAX_Q_LEN, as measured (ak_mla_prefer_absorbed)."""
    q_len = int(q_len)
    if not 1 <= q_len <= 2**31 - 1:  # (a C int: larger values would wrap)
        return False
    c = config.to_c()
    return bool(_lib.ak_mla_prefer_absorbed(ctypes.byref(c), q_len))


# ---------------------------------------------------------------------------
# Streams, devices and the paged cache
# ---------------------------------------------------------------------------

def _stream_handle(stream, device):
    """The cudaStream_t for a call on `device`: `stream` as given (None, an int,
    or an object with .cuda_stream), else torch's current stream when torch is
    loaded, else NULL (the legacy default stream). Ignored on the CPU."""
    kind, index = device
    if kind != _capi.AK_DEVICE_CUDA:
        return None
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        try:  # no is_available() here: this runs inside graph captures too
            return torch.cuda.current_stream(index).cuda_stream or None
        except (RuntimeError, AssertionError, AttributeError):  # torch without CUDA
            return None
    if hasattr(stream, "cuda_stream"):
        return stream.cuda_stream or None
    return int(stream) or None


def _check_device(args, device):
    for a in args:
        if a is not None and a.device != device:
            raise InvalidArgument(f"{a.name} is on {_device_str(a.device)}, the call runs on "
                                  f"{_device_str(device)}")


def _scales(k_scale, v_scale, num_kv_heads, device, has_v=True):
    """(ak_kv_scale_kind, k_scale address, v_scale address, keep) for fp8 K/V:
    both None (no scales), or f32 tensors of 1 element (per layer) or
    num_kv_heads (per head) on the K/V's device. The C library reads them when
    run() or kv_update executes, so their values may change between calls (and
    a captured CUDA graph reads them at each replay). has_v False (MLA: the
    value is part of the K row): k_scale alone, which scales both."""
    if k_scale is None and v_scale is None:
        return _capi.AK_KV_SCALE_NONE, None, None, ()
    if not has_v:
        if v_scale is not None:
            raise InvalidArgument("v_scale is given, but the value is read from the K rows (MLA): "
                                  "k_scale scales both")
        ka = _as_arg(k_scale, "k_scale")
        _check_device((ka,), device)
        if ka.dtype != "f32" or ka.numel() not in (1, num_kv_heads):
            raise InvalidArgument(f"k_scale has dtype {ka.dtype} and {ka.numel()} elements: f32, 1 (per "
                                  f"layer) or num_kv_heads = {num_kv_heads} (per head)")
        kind = _capi.AK_KV_SCALE_PER_LAYER if ka.numel() == 1 else _capi.AK_KV_SCALE_PER_HEAD
        return kind, ka.ptr or None, None, (ka,)
    if k_scale is None or v_scale is None:
        raise InvalidArgument(f"{'k_scale' if k_scale is None else 'v_scale'} is None but "
                              f"{'v_scale' if k_scale is None else 'k_scale'} is given: fp8 K/V take both")
    ka, va = _as_arg(k_scale, "k_scale"), _as_arg(v_scale, "v_scale")
    _check_device((ka, va), device)
    for a in (ka, va):
        if a.dtype != "f32":
            raise InvalidArgument(f"{a.name} has dtype {a.dtype}; scales are f32")
        if a.numel() not in (1, num_kv_heads):
            raise InvalidArgument(f"{a.name} has {a.numel()} elements: 1 (per layer) or "
                                  f"num_kv_heads = {num_kv_heads} (per head)")
        if a.numel() > 1 and a.stride[-1] != 1:
            raise InvalidArgument(f"{a.name} must be contiguous")
    if ka.numel() != va.numel():
        raise InvalidArgument(f"k_scale has {ka.numel()} elements, v_scale {va.numel()}: one kind for both")
    # with one KV head, per layer and per head are the same thing
    kind = _capi.AK_KV_SCALE_PER_LAYER if ka.numel() == 1 else _capi.AK_KV_SCALE_PER_HEAD
    return kind, ka.ptr or None, va.ptr or None, (ka, va)


def _paged_kv(k_cache, v_cache, layout, k_scale=None, v_scale=None, head_dim_vo=None, marks=None):
    """ak_paged_kv from two 4-D cache tensors; the layout says which of dims 1
    and 2 is the page. fp8 caches (torch.float8_e4m3fn) take their layer's
    scales (see _scales); the view's `keep` attribute holds them. v_cache
    None: a K-only view (MLA), whose values are the first head_dim_vo (None:
    all) of each K row. marks: the pools' finiteness marks (attnkit.h,
    ak_paged_kv.marks), a contiguous int32 tensor of kv_marks_words()
    elements on the cache's device, or None."""
    caches = (k_cache,) if v_cache is None else (k_cache, v_cache)
    for a in caches:
        if len(a.shape) != 4:
            raise InvalidArgument(
                f"{a.name} has shape {list(a.shape)}; a paged cache is 4-D, "
                "[num_blocks, page_size, num_kv_heads, head_dim] (NHD) or "
                "[num_blocks, num_kv_heads, page_size, head_dim] (HND)")
        # a block must be packed; strides of size-1 dims do not matter
        inner = (a.shape[2] * a.shape[3], a.shape[3], 1)
        for d in (1, 2, 3):
            if a.shape[d] > 1 and a.stride[d] != inner[d - 1]:
                raise InvalidArgument(f"{a.name}.stride[{d}] = {a.stride[d]}, expected "
                                      f"{inner[d - 1]}: a block must be packed (only the "
                                      "block stride may differ)")
    if v_cache is not None:
        if k_cache.dtype != v_cache.dtype:
            raise InvalidArgument(f"v_cache has dtype {v_cache.dtype}, k_cache {k_cache.dtype}")
        if k_cache.device != v_cache.device:
            raise InvalidArgument(f"v_cache is on {_device_str(v_cache.device)}, k_cache on "
                                  f"{_device_str(k_cache.device)}")
        if k_cache.shape[:3] != v_cache.shape[:3]:
            raise InvalidArgument(f"v_cache shape {list(v_cache.shape)} and k_cache shape "
                                  f"{list(k_cache.shape)} differ before the head dim")
    code = _DTYPES[k_cache.dtype][0]
    if code is None:
        raise InvalidArgument(f"k_cache has dtype {k_cache.dtype}; a KV cache is f32, f16, bf16 or fp8_e4m3")
    kv = _capi.ak_paged_kv()
    kv.k_data = k_cache.ptr or None
    kv.dtype = code
    kv.layout = layout
    kv.device.kind, kv.device.index = k_cache.device
    kv.num_blocks = _c_int(k_cache.shape[0], "k_cache.shape[0] (blocks)")
    heads_at, page_at = (1, 2) if layout == _capi.AK_LAYOUT_HND else (2, 1)
    kv.num_kv_heads = _c_int(k_cache.shape[heads_at], f"k_cache.shape[{heads_at}] (KV heads)")
    kv.page_size = _c_int(k_cache.shape[page_at], f"k_cache.shape[{page_at}] (page size)")
    kv.head_dim_qk = _c_int(k_cache.shape[3], "k_cache.shape[3] (head dim)")
    kv.k_block_stride = k_cache.stride[0] if k_cache.shape[0] > 1 else 0
    if v_cache is None:  # K-only: v_data NULL, no V stride
        kv.v_data = None
        kv.head_dim_vo = _c_int(k_cache.shape[3] if head_dim_vo is None else head_dim_vo, "head_dim_vo")
    else:
        kv.v_data = v_cache.ptr or None
        kv.head_dim_vo = _c_int(v_cache.shape[3], "v_cache.shape[3] (head dim)")
        kv.v_block_stride = v_cache.stride[0] if v_cache.shape[0] > 1 else 0
    kv.scale_kind, kv.k_scale, kv.v_scale, keep = _scales(k_scale, v_scale, kv.num_kv_heads, k_cache.device,
                                                          has_v=v_cache is not None)
    ma = None
    if marks is not None:
        ma = _as_arg(marks, "marks")
        words = kv_marks_words(kv.num_blocks, kv.num_kv_heads, kv.page_size)
        if ma.dtype != "i32" or len(ma.shape) != 1 or ma.numel() != words or (words > 1 and ma.stride[0] != 1):
            raise InvalidArgument(f"marks must be a contiguous 1-D int32 tensor of {words} elements "
                                  f"(kv_marks_words), got {ma.dtype} shape {list(ma.shape)}")
        _check_device((ma,), k_cache.device)
        kv.marks = ma.ptr or None
    kv.keep = (keep, ma)
    return kv


def kv_marks_words(num_blocks, num_kv_heads, page_size):
    """The 32-bit words of a cache's finiteness marks (attnkit.h,
    ak_paged_kv.marks): num_blocks * num_kv_heads * ceil(page_size / 32).
    Allocate them zeroed with the pools (torch.zeros(n, dtype=torch.int32)),
    pass them to every kv_update and run of that cache, and write the cache
    through kv_update alone: long prefills then skip reading K/V for the NaN
    rule's check."""
    n = _lib.ak_kv_marks_words(_c_int(num_blocks, "num_blocks"), _c_int(num_kv_heads, "num_kv_heads"),
                               _c_int(page_size, "page_size"))
    if n < 0:
        raise InvalidArgument(f"kv_marks_words({num_blocks}, {num_kv_heads}, {page_size}): sizes must be "
                              "positive and the count an int64")
    return n


def _kv_update(kv, k, v, slot_ptr, num_tokens, device, stream):
    tk = k.to_ak_tensor()
    tv = v.to_ak_tensor() if v is not None else None
    _check(_lib.ak_kv_update(ctypes.byref(kv), ctypes.byref(tk), ctypes.byref(tv) if tv is not None else None,
                             slot_ptr, num_tokens, _stream_handle(stream, device)))


def kv_update(k_cache, v_cache, k, v, slot_mapping, layout="NHD", stream=None, k_scale=None, v_scale=None,
              marks=None):
    """Writes new K/V rows into a paged cache: token i's rows go to slot
    slot_mapping[i] (block * page_size + offset; -1 skips it).
    k: [num_tokens, num_kv_heads, head_dim_qk], v likewise, in the cache's dtype
    and on its device; an fp8 cache (torch.float8_e4m3fn) also takes f32, f16
    or bf16 rows and quantizes them with k_scale / v_scale (f32 tensors of 1 or
    num_kv_heads elements on the cache's device; None: scale 1).
    slot_mapping: int64, a list or host array for a CPU cache, a torch tensor on
    the cache's device. A K-only cache (MLA: the value is part of the K row)
    takes v_cache None and v None. marks: the cache's finiteness marks
    (kv_marks_words), kept up to date for the slots written."""
    kc = _as_arg(k_cache, "k_cache")
    vc = _as_arg(v_cache, "v_cache") if v_cache is not None else None
    ka = _as_arg(k, "k")
    va = _as_arg(v, "v") if v is not None else None
    kv = _paged_kv(kc, vc, _enum_value(_LAYOUTS, layout, "layout"), k_scale, v_scale, marks=marks)
    _check_device((ka, va), kc.device)
    num_tokens = ka.shape[0] if ka.shape else 0
    sm = _slot_mapping_arg(slot_mapping, kc.device)
    if sm.numel() < num_tokens:
        raise InvalidArgument(f"slot_mapping has {sm.numel()} entries, k has {num_tokens} tokens")
    _kv_update(kv, ka, va, sm.ptr or None, num_tokens, kc.device, stream)


def _slot_mapping_arg(obj, device):
    from ._tensor import is_torch_tensor
    if is_torch_tensor(obj) and obj.device.type != "cpu":
        a = _as_arg(obj, "slot_mapping")
        if a.dtype != "i64" or (a.numel() > 1 and a.stride[-1] != 1) or len(a.shape) != 1:
            raise InvalidArgument(f"slot_mapping must be a 1-D contiguous int64 tensor, got "
                                  f"{a.dtype} shape {list(a.shape)}")
    else:
        a = _host_int_array(obj, "slot_mapping", "q")
    _check_device((a,), device)
    return a


# ---------------------------------------------------------------------------
# Backend
# ---------------------------------------------------------------------------

# Every live Backend by its handle: what attnkit.torch's custom ops, which take
# only tensors and scalars, are given instead of the object.
_handles = itertools.count(1)
_live_backends = weakref.WeakValueDictionary()


def backend_from_handle(handle):
    """The live Backend whose .handle is `handle`."""
    b = _live_backends.get(handle)
    if b is None:
        raise Error(f"no live attnkit.Backend has handle {handle}")
    return b


class Backend:
    """One ak_backend: create from a Config and Limits (name: a backend, or
    None for AK_BACKEND / the selector), then plan() per step and run() per
    layer. close() (or the end of a with-block, or garbage collection) destroys
    it. .handle is an integer that names it (backend_from_handle) while it
    lives."""

    def __init__(self, config, limits=None, name=None):
        self._h = None
        self._device_table = None
        self.handle = next(_handles)
        limits = limits if limits is not None else Limits()
        c, lc = config.to_c(), limits.to_c()
        h = ctypes.c_void_p()
        _check(_lib.ak_backend_create(ctypes.byref(c), ctypes.byref(lc),
                                      name.encode() if name else None, ctypes.byref(h)))
        self._h = h
        self.config = Config.from_c(_lib.ak_backend_config(h).contents)
        self.limits = limits
        self._device = (c.device.kind, c.device.index)
        self._layout = c.kv_layout
        self._paged = c.kv_storage == _capi.AK_KV_PAGED
        _live_backends[self.handle] = self

    # -- properties -------------------------------------------------------

    def _handle(self):
        if not self._h:
            raise Error("the backend is closed")
        return self._h

    @property
    def name(self):
        return _lib.ak_backend_name(self._handle()).decode()

    @property
    def graph_support(self):
        """'never', 'decode_only', 'uniform_batch' or 'always'."""
        g = _lib.ak_backend_graph_support(self._handle())
        return _lib.ak_graph_support_name(g).decode()

    @property
    def forward_includes_kv_update(self):
        return bool(_lib.ak_backend_forward_includes_kv_update(self._handle()))

    @property
    def planned_tokens(self):
        return _lib.ak_backend_planned_tokens(self._handle())

    @property
    def slot_mapping(self):
        """Address of the current plan's slot mapping ([planned_tokens] int64 on
        config.device), or None before the first plan and for ragged storage
        (contiguous K/V have no cache slots)."""
        if not self._paged:
            return None
        return _lib.ak_backend_slot_mapping(self._handle())

    # -- plan / run ---------------------------------------------------------

    def plan(self, qo_indptr, kv_lens, block_table=None, block_table_stride=None, stream=None):
        """qo_indptr [num_reqs + 1], kv_lens [num_reqs], block_table [num_reqs,
        stride] (paged; nested lists are padded with -1, a flat array needs
        block_table_stride unless its length divides by num_reqs). Lists,
        integer buffers or CPU tensors; or an int32 torch tensor on the
        config's GPU with rows of stride 1 apart elements (an engine's
        persistent block table): that one is read in place
        (batch.device_block_table), plan() copies O(requests) and the
        kernels read the table as it is when they run, so keep it alive
        and at the same address while the plan is in force."""
        qo = _host_int_array(qo_indptr, "qo_indptr")
        kl = _host_int_array(kv_lens, "kv_lens")
        num_reqs = kl.numel()
        if qo.numel() != num_reqs + 1:
            raise InvalidArgument(f"qo_indptr has {qo.numel()} entries, expected num_reqs + 1 = "
                                  f"{num_reqs + 1} (num_reqs = len(kv_lens))")
        batch = _capi.ak_batch()
        _lib.ak_batch_init(ctypes.byref(batch))
        batch.num_reqs = num_reqs
        I32P = ctypes.POINTER(ctypes.c_int32)
        batch.qo_indptr = ctypes.cast(qo.ptr, I32P)
        batch.kv_lens = ctypes.cast(kl.ptr, I32P)
        bt = None
        device_table = None
        if block_table is not None and _is_torch_tensor(block_table) and block_table.device.type != "cpu":
            torch = _torch()
            t = block_table
            if self._device[0] != _capi.AK_DEVICE_CUDA:
                raise InvalidArgument(f"block_table is on {t.device}, but config.device is the CPU: give a "
                                      "host table")
            if t.dtype != torch.int32 or t.dim() != 2 or t.stride(1) != 1:
                raise InvalidArgument(f"block_table on {t.device} is read in place: it must be a 2-D int32 "
                                      f"tensor with contiguous rows (got {t.dtype}, shape {tuple(t.shape)}, "
                                      f"strides {t.stride()})")
            if t.shape[0] < num_reqs:
                raise InvalidArgument(f"block_table has {t.shape[0]} rows for {num_reqs} requests")
            if block_table_stride is not None and int(block_table_stride) != t.stride(0):
                raise InvalidArgument(f"block_table_stride = {block_table_stride}, but the tensor's rows are "
                                      f"{t.stride(0)} entries apart (it is read in place)")
            # the kernels read the row entries a request's keys need: they must be in the tensor
            page, lens = self.config.page_size, ctypes.cast(kl.ptr, I32P)
            for r in range(num_reqs):
                need = -(-lens[r] // page) if page > 0 else 0
                if need > t.shape[1]:
                    raise InvalidArgument(f"kv_lens[{r}] = {lens[r]} needs {need} blocks of {page}, but "
                                          f"block_table has {t.shape[1]} columns")
            batch.device_block_table = ctypes.cast(t.data_ptr(), I32P)
            batch.block_table_stride = int(t.stride(0))
            device_table = t
        elif block_table is not None:
            bt = _host_int_array(block_table, "block_table")
        if block_table is not None and device_table is None and bt.numel() > 0:
            # (an empty table is none: only a step whose requests have no keys
            # may give none, which the library checks)
            if block_table_stride is None:
                if len(bt.shape) == 2:
                    block_table_stride = bt.shape[1]
                elif num_reqs and bt.numel() % num_reqs == 0:
                    block_table_stride = bt.numel() // num_reqs
                else:
                    raise InvalidArgument(f"block_table has {bt.numel()} entries for {num_reqs} "
                                          "requests; give block_table_stride")
            if bt.numel() < num_reqs * block_table_stride:
                raise InvalidArgument(f"block_table has {bt.numel()} entries, expected "
                                      f"num_reqs x block_table_stride = "
                                      f"{num_reqs} x {block_table_stride}")
            batch.block_table = ctypes.cast(bt.ptr, I32P)
            batch.block_table_stride = int(block_table_stride)
        _check(_lib.ak_backend_plan(self._handle(), ctypes.byref(batch),
                                    _stream_handle(stream, self._device)))
        # the kernels read a device table while the plan is in force (and a
        # captured graph reads the last successful plan's): held from here
        self._device_table = device_table

    def run(self, q, k_cache, v_cache, o, lse=None, stream=None, k_scale=None, v_scale=None, sinks=None,
            marks=None):
        """o (and lse, f32 [num_tokens, num_qo_heads]) = attention of q over the
        planned batch. Paged storage: k_cache / v_cache are the layer's 4-D
        pools; ragged: [sum kv_len, num_kv_heads, head_dim] tensors. fp8 K/V
        (torch.float8_e4m3fn): k_scale / v_scale are the layer's scales, f32
        tensors of 1 (per layer) or num_kv_heads (per head) elements on the
        config's device (None: scale 1). sinks: with config.use_sinks, the
        layer's sink logits, f32 [num_qo_heads] on the config's device (each
        layer passes its own; None otherwise). config.mla: v_cache is None
        (the value is the first head_dim_vo of each K row; fp8: k_scale alone).
        marks: the paged cache's finiteness marks (kv_marks_words), or None."""
        self.prepare_run(q, k_cache, v_cache, o, lse, k_scale, v_scale, sinks, marks)(stream)

    def prepare_run(self, q, k_cache, v_cache, o, lse=None, k_scale=None, v_scale=None, sinks=None, marks=None):
        """run()'s argument conversion done once: returns call(stream=None),
        which only calls ak_backend_run (a few microseconds of Python, for
        timing loops and engines that reuse their buffers). The tensors must
        stay where they are; the stream is resolved at each call."""
        qa, oa = _as_arg(q, "q"), _as_arg(o, "o")
        la = _as_arg(lse, "lse") if lse is not None else None
        sa = _as_arg(sinks, "sinks") if sinks is not None else None
        kc = _as_arg(k_cache, "k_cache")
        vc = _as_arg(v_cache, "v_cache") if v_cache is not None else None
        _check_device((qa, oa, la, sa, kc, vc), self._device)
        tq, to = qa.to_ak_tensor(), oa.to_ak_tensor()
        args = _capi.ak_run_args()
        _lib.ak_run_args_init(ctypes.byref(args))
        args.q, args.o = ctypes.pointer(tq), ctypes.pointer(to)
        if la is not None:
            tl = la.to_ak_tensor()
            args.lse = ctypes.pointer(tl)
        if sa is not None:  # the C library checks dtype, shape and cfg.use_sinks
            ts = sa.to_ak_tensor()
            args.sinks = ctypes.pointer(ts)
        if self._paged:
            kv = _paged_kv(kc, vc, self._layout, k_scale, v_scale, self.config.head_dim_vo, marks)
            args.kv = ctypes.pointer(kv)
            scales = kv.keep
        else:
            tk = kc.to_ak_tensor()
            args.k = ctypes.pointer(tk)
            if vc is not None:
                tv = vc.to_ak_tensor()
                args.v = ctypes.pointer(tv)
            heads = kc.shape[1] if len(kc.shape) == 3 else 0
            args.kv_scale_kind, args.k_scale, args.v_scale, scales = _scales(k_scale, v_scale, heads, self._device,
                                                                             has_v=vc is not None)
        args_ref, run, device = ctypes.byref(args), _lib.ak_backend_run, self._device

        def call(stream=None):
            _check(run(self._handle(), args_ref, _stream_handle(stream, device)))
        call.keep = (qa, oa, la, sa, kc, vc, args, scales)  # the memory and the structs that point at it
        return call

    def kv_update(self, k_cache, v_cache, k, v, stream=None, k_scale=None, v_scale=None, marks=None):
        """ak_kv_update with this backend's planned slot mapping (capturable in
        the same CUDA graph as run()); k has the planned number of tokens.
        Paged storage only: a ragged backend's K/V are the caller's tensors.
        An fp8 cache quantizes k and v with k_scale / v_scale (see run). A
        K-only cache (config.mla) takes v_cache None and v None. marks: the
        cache's finiteness marks (see run)."""
        if not self._paged:
            raise InvalidArgument("kv_update: config.kv_storage is 'ragged', whose K/V have no cache "
                                  "slots; write a paged cache with attnkit.kv_update(..., slot_mapping)")
        kc = _as_arg(k_cache, "k_cache")
        vc = _as_arg(v_cache, "v_cache") if v_cache is not None else None
        ka = _as_arg(k, "k")
        va = _as_arg(v, "v") if v is not None else None
        _check_device((kc, vc, ka, va), self._device)
        kv = _paged_kv(kc, vc, self._layout, k_scale, v_scale, self.config.head_dim_vo, marks)
        n = ka.shape[0] if ka.shape else 0
        if n != self.planned_tokens:
            raise InvalidArgument(f"k.shape[0] = {n}, expected the planned tokens "
                                  f"{self.planned_tokens}")
        _kv_update(kv, ka, va, self.slot_mapping, n, self._device, stream)

    # -- lifetime -----------------------------------------------------------

    def close(self):
        if self._h:
            _live_backends.pop(self.handle, None)
            _lib.ak_backend_destroy(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None) and _lib is not None:
            self.close()

    def __repr__(self):
        return f"Backend({self.name!r}, {self.config!r})" if self._h else "Backend(closed)"
