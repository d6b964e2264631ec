"""
_tensor.py - Python objects seen as attnkit tensors: PyTorch tensors (CPU or
CUDA, read through data_ptr / dtype / shape / stride / device) and CPU buffers
(anything with the buffer protocol, given a shape and dtype through View).

The C library checks dtype, rank, shape and innermost stride against the
config and names the field; what it cannot see is checked here: which device
the memory is on, and whether a buffer is large enough for its shape and
strides.
"""
import array
import ctypes
import sys

from . import _capi
from ._errors import InvalidArgument

# ---------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------

# name -> (ak_dtype code or None for the integer types of metadata, bytes)
DTYPES = {
    "f32": (_capi.AK_F32, 4),
    "f16": (_capi.AK_F16, 2),
    "bf16": (_capi.AK_BF16, 2),
    "fp8_e4m3": (_capi.AK_FP8_E4M3, 1),
    "i32": (None, 4),
    "i64": (None, 8),
}
_ALIASES = {"float32": "f32", "float": "f32", "float16": "f16", "half": "f16",
            "bfloat16": "bf16", "float8_e4m3fn": "fp8_e4m3", "int32": "i32", "int64": "i64"}
CODE_TO_NAME = {code: name for name, (code, _) in DTYPES.items() if code is not None}

# struct-module formats a buffer may carry, by size
_FORMAT_DTYPES = {("f", 4): "f32", ("e", 2): "f16", ("i", 4): "i32", ("l", 4): "i32",
                  ("l", 8): "i64", ("q", 8): "i64"}
_BYTE_FORMATS = ("B", "b", "c")


def dtype_name(dtype, field="dtype"):
    """'f32', 'f16', 'bf16', 'fp8_e4m3', 'i32' or 'i64' for a name, an ak_dtype code
    or a torch dtype."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype in CODE_TO_NAME:
            return CODE_TO_NAME[dtype]
        raise InvalidArgument(f"{field} = {dtype} is not an ak_dtype")
    s = str(dtype)
    if s.startswith("torch."):
        s = s[len("torch."):]
    s = _ALIASES.get(s, s)
    if s not in DTYPES:
        raise InvalidArgument(f"{field} = {dtype!r} is not a dtype "
                              f"(one of {', '.join(n for n in DTYPES if DTYPES[n][0] is not None)})")
    return s


def parse_device(device, field="device"):
    """(kind, index) for 'cpu', 'cuda', 'cuda:1', a torch.device or a (kind, index) pair."""
    if isinstance(device, tuple) and len(device) == 2:
        return int(device[0]), int(device[1])
    s = str(device)
    if s == "cpu":
        return _capi.AK_DEVICE_CPU, 0
    if s == "cuda":
        return _capi.AK_DEVICE_CUDA, 0
    if s.startswith("cuda:") and s[5:].isdigit():
        return _capi.AK_DEVICE_CUDA, int(s[5:])
    raise InvalidArgument(f"{field} = {device!r} is not a device ('cpu', 'cuda' or 'cuda:N')")


def device_str(dev):
    kind, index = dev
    return "cpu" if kind == _capi.AK_DEVICE_CPU else f"cuda:{index}"


# ---------------------------------------------------------------------------
# The common form: one Python object ready for a C call
# ---------------------------------------------------------------------------

class Arg:
    """Address, dtype name, shape, strides (elements) and device of one argument;
    `keep` holds whatever keeps the memory alive and exported."""
    __slots__ = ("name", "ptr", "dtype", "shape", "stride", "device", "keep")

    def __init__(self, name, ptr, dtype, shape, stride, device, keep):
        self.name, self.ptr, self.dtype = name, ptr, dtype
        self.shape, self.stride, self.device, self.keep = tuple(shape), tuple(stride), device, keep

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def to_ak_tensor(self):
        code = DTYPES[self.dtype][0]
        if code is None:
            raise InvalidArgument(f"{self.name} has dtype {self.dtype}; attention tensors are "
                                  "f32, f16, bf16 or fp8_e4m3")
        if not 1 <= len(self.shape) <= _capi.AK_MAX_DIMS:
            raise InvalidArgument(f"{self.name} has {len(self.shape)} dimensions, "
                                  f"at most {_capi.AK_MAX_DIMS} are supported")
        t = _capi.ak_tensor()
        t.data = self.ptr or None
        t.dtype = code
        t.ndim = len(self.shape)
        for i, (s, st) in enumerate(zip(self.shape, self.stride)):
            t.shape[i], t.stride[i] = s, st
        return t


def contiguous_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


class View:
    """A CPU buffer seen as a strided tensor.

    obj: anything with the writable buffer protocol (array.array, bytearray,
    memoryview, a NumPy array). dtype: 'f32', 'f16', 'bf16', 'fp8_e4m3', 'i32',
    'i64' (default: from the buffer's format, 'f' -> f32, 'e' -> f16). shape:
    default the buffer's own (a memoryview's shape) when its format matches the
    dtype, else one dimension. stride: in elements, default row-major. offset:
    the first element, in elements. The buffer's element size must equal the
    dtype's, or the buffer must be raw bytes ('B'); bf16 is usually an
    array.array('H') of the upper halves of f32 values.
    """

    def __init__(self, obj, shape=None, dtype=None, stride=None, offset=0):
        mv = obj if isinstance(obj, memoryview) else memoryview(obj)
        if mv.readonly:
            raise InvalidArgument("View: the buffer is read-only (attnkit needs a writable "
                                  "buffer: array.array, bytearray, ...)")
        if not mv.c_contiguous:
            raise InvalidArgument("View: the buffer is not C-contiguous; pass the whole "
                                  "buffer and describe the slice with shape/stride/offset")
        fmt = mv.format.lstrip("@=<>!")
        fmt_dtype = _FORMAT_DTYPES.get((fmt, mv.itemsize))
        if dtype is None:
            if fmt_dtype is None:
                raise InvalidArgument(f"View: the buffer's format {mv.format!r} names no "
                                      "attnkit dtype; give dtype=")
            dtype = fmt_dtype
        dtype = dtype_name(dtype, "View dtype")
        size = DTYPES[dtype][1]
        if mv.itemsize != size and fmt not in _BYTE_FORMATS:
            raise InvalidArgument(f"View: the buffer holds {mv.itemsize}-byte items "
                                  f"(format {mv.format!r}), dtype {dtype} is {size} bytes")
        if mv.nbytes % size:
            raise InvalidArgument(f"View: the buffer's {mv.nbytes} bytes are not a whole "
                                  f"number of {dtype} elements")
        nelems = mv.nbytes // size
        if shape is None:
            shape = mv.shape if fmt_dtype == dtype else (nelems,)
        shape = tuple(int(s) for s in shape)
        stride = contiguous_strides(shape) if stride is None else tuple(int(s) for s in stride)
        if len(stride) != len(shape):
            raise InvalidArgument(f"View: shape {shape} and stride {stride} differ in length")
        if any(s < 0 for s in shape) or any(s < 0 for s in stride) or offset < 0:
            raise InvalidArgument(f"View: negative shape, stride or offset "
                                  f"(shape {shape}, stride {stride}, offset {offset})")
        if all(s > 0 for s in shape):
            last = offset + sum((s - 1) * st for s, st in zip(shape, stride))
            if last >= nelems:
                raise InvalidArgument(f"View: shape {shape} with stride {stride} and offset "
                                      f"{offset} reaches element {last}, the buffer holds {nelems}")
        self.obj, self.dtype, self.shape, self.stride, self.offset = obj, dtype, shape, stride, offset
        if mv.nbytes:
            self._cbuf = (ctypes.c_char * mv.nbytes).from_buffer(mv)
            self.ptr = ctypes.addressof(self._cbuf) + offset * size
        else:
            self._cbuf, self.ptr = None, 0

    def __repr__(self):
        return f"View(shape={self.shape}, dtype={self.dtype!r}, stride={self.stride})"


# ---------------------------------------------------------------------------
# Adapters
# ---------------------------------------------------------------------------

def _torch():
    return sys.modules.get("torch")


def is_torch_tensor(obj):
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch_arg(t, name):
    torch = _torch()
    if t.layout != torch.strided:
        raise InvalidArgument(f"{name} is a {t.layout} tensor; attnkit reads strided tensors")
    dtype = str(t.dtype)[len("torch."):]
    dtype = _ALIASES.get(dtype, dtype)
    if dtype not in DTYPES:
        raise InvalidArgument(f"{name} has torch dtype {t.dtype}, which attnkit has no name for")
    if t.device.type == "cpu":
        dev = (_capi.AK_DEVICE_CPU, 0)
    elif t.device.type == "cuda":
        dev = (_capi.AK_DEVICE_CUDA, t.device.index if t.device.index is not None else 0)
    else:
        raise InvalidArgument(f"{name} is on {t.device}; attnkit takes cpu and cuda tensors")
    return Arg(name, t.data_ptr(), dtype, t.shape, t.stride(), dev, t)


def as_arg(obj, name):
    """A torch tensor, a View, or a buffer whose memoryview carries shape and format."""
    if isinstance(obj, Arg):
        return obj
    if is_torch_tensor(obj):
        return _torch_arg(obj, name)
    if not isinstance(obj, View):
        try:
            obj = View(obj)
        except TypeError:
            raise InvalidArgument(f"{name}: expected a torch tensor, an attnkit.View or a "
                                  f"buffer, got {type(obj).__name__}") from None
        except InvalidArgument as e:
            raise InvalidArgument(f"{name}: {e.message}") from None
    return Arg(name, obj.ptr, obj.dtype, obj.shape, obj.stride, (_capi.AK_DEVICE_CPU, 0), obj)


def host_int_array(obj, name, typecode="i"):
    """A host array of int32 ('i') or int64 ('q') for metadata: (Arg, flat length).
    Takes lists (nested lists are rows, padded with -1 to the longest), tuples,
    array.array, memoryviews of integers, Views of i32/i64 and CPU torch tensors
    (converted)."""
    want = "i32" if typecode == "i" else "i64"
    if is_torch_tensor(obj):
        torch = _torch()
        if obj.device.type != "cpu":
            raise InvalidArgument(f"{name} is on {obj.device}; it must be a host array here")
        t = obj.detach().to(torch.int32 if typecode == "i" else torch.int64).contiguous()
        return Arg(name, t.data_ptr(), want, t.shape, contiguous_strides(tuple(t.shape)),
                   (_capi.AK_DEVICE_CPU, 0), t)
    if isinstance(obj, View):
        if obj.dtype != want or obj.stride != contiguous_strides(obj.shape):
            raise InvalidArgument(f"{name}: a View passed here must be a contiguous {want} array")
        return Arg(name, obj.ptr, want, obj.shape, obj.stride, (_capi.AK_DEVICE_CPU, 0), obj)
    # (shapes from what the buffer or the iteration holds, never from __len__,
    # which a subclass may make say anything)
    if isinstance(obj, array.array) and obj.typecode == typecode:
        address, count = obj.buffer_info()
        return Arg(name, address, want, (count,), (1,), (_capi.AK_DEVICE_CPU, 0), obj)
    if isinstance(obj, (list, tuple)):
        items = list(iter(obj))
        if items and all(isinstance(r, (list, tuple)) for r in items):
            rows = [list(iter(r)) for r in items]
            width = max(len(r) for r in rows)
            shape = (len(rows), width)
            values = [v for r in rows for v in r + [-1] * (width - len(r))]
        else:
            shape, values = (len(items),), items
    else:
        try:
            mv = memoryview(obj)
        except TypeError:
            raise InvalidArgument(f"{name}: expected a list, an integer buffer or a CPU tensor, "
                                  f"got {type(obj).__name__}") from None
        if mv.format.lstrip("@=<>!") not in "bBhHiIlLqQnN" or mv.format.lstrip("@=<>!") == "":
            raise InvalidArgument(f"{name}: buffer format {mv.format!r} is not an integer format")
        shape, values = mv.shape, mv.cast("B").cast(mv.format.lstrip("@=<>!")).tolist()
    try:
        arr = array.array(typecode, [int(v) for v in values])
    except OverflowError:
        raise InvalidArgument(f"{name}: a value does not fit in {want}") from None
    return Arg(name, arr.buffer_info()[0] if len(arr) else 0, want, shape,
               contiguous_strides(shape), (_capi.AK_DEVICE_CPU, 0), arr)
