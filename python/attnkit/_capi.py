"""
_capi.py - the C library through ctypes: loading libattnkit.so, the structs of
include/attnkit.h field for field, and the prototypes of the functions used.

Nothing here is public; attnkit/__init__.py wraps it. The structs that carry a
struct_size are checked against the C library's own sizeof at load time (the
*_init functions write it), so a header change that is not mirrored here fails
on import instead of corrupting memory.
"""
import ctypes
import os
import pathlib

# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------

LIB_NAME = "libattnkit.so"


def _candidates():
    """Where libattnkit.so is looked for, in order: ATTNKIT_LIB (alone when
    set); the copy installed in this package (pip install .); in a source
    checkout (PYTHONPATH=python), the build folder of `make build`; the
    loader's search path."""
    env = os.environ.get("ATTNKIT_LIB")
    if env:
        return [env]  # an explicit path is never silently replaced
    here = pathlib.Path(__file__).resolve().parent
    found = [str(here / LIB_NAME)]
    repo = here.parent.parent  # python/attnkit -> the repository, in a checkout
    if (repo / "include" / "attnkit.h").is_file():
        found.append(str(repo / "build" / LIB_NAME))
    return found + [LIB_NAME]


def load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} (no such file)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError("attnkit: cannot load " + LIB_NAME + "; tried " + "; ".join(tried) +
                      ". Install the package (pip install . in the repository), build the "
                      "library (make build) or set ATTNKIT_LIB to its path.")


# ---------------------------------------------------------------------------
# Enums (values as in attnkit.h)
# ---------------------------------------------------------------------------

AK_OK = 0
AK_ERR_INVALID_ARG = 1
AK_ERR_UNSUPPORTED = 2
AK_ERR_BACKEND_NOT_FOUND = 6

AK_F32, AK_F16, AK_BF16, AK_FP8_E4M3 = 0, 1, 2, 3
AK_DEVICE_CPU, AK_DEVICE_CUDA = 0, 1
AK_LAYOUT_NHD, AK_LAYOUT_HND = 0, 1
AK_KV_PAGED, AK_KV_RAGGED = 0, 1
AK_WORKLOAD_ANY, AK_WORKLOAD_DECODE = 0, 1
AK_KV_SCALE_NONE, AK_KV_SCALE_PER_LAYER, AK_KV_SCALE_PER_HEAD = 0, 1, 2

AK_MAX_DIMS = 4

# ---------------------------------------------------------------------------
# Structs
# ---------------------------------------------------------------------------

c_int, c_float, c_int64, c_uint32, c_void_p = (ctypes.c_int, ctypes.c_float, ctypes.c_int64,
                                             ctypes.c_uint32, ctypes.c_void_p)


class ak_device(ctypes.Structure):
    _fields_ = [("kind", c_int), ("index", c_int)]


class ak_device_info(ctypes.Structure):
    _fields_ = [
        ("device", ak_device),
        ("name", ctypes.c_char * 128),
        ("num_sms", c_int),
        ("cc_major", c_int),
        ("cc_minor", c_int),
        ("memory_bytes", ctypes.c_size_t),
        ("l2_bytes", ctypes.c_size_t),
        ("max_smem_per_block", c_int),
        ("cpu_has_avx2_fma_f16c", c_int),
    ]


class ak_tensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("dtype", c_int),
        ("ndim", c_int),
        ("shape", c_int64 * AK_MAX_DIMS),
        ("stride", c_int64 * AK_MAX_DIMS),  # in elements
    ]


class ak_attn_config(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_qo_heads", c_int),
        ("num_kv_heads", c_int),
        ("head_dim_qk", c_int),
        ("head_dim_vo", c_int),
        ("sm_scale", c_float),
        ("causal", c_int),
        ("window_left", c_int),
        ("logits_soft_cap", c_float),
        ("q_dtype", c_int),
        ("kv_dtype", c_int),
        ("o_dtype", c_int),
        ("device", ak_device),
        ("kv_storage", c_int),
        ("kv_layout", c_int),
        ("page_size", c_int),
        ("workload", c_int),
        ("use_sinks", c_int),
        ("batch_invariant", c_int),
        ("mla", c_int),
    ]


class ak_limits(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_reqs", c_int),
        ("max_tokens", c_int),
        ("max_blocks_per_req", c_int),
        ("num_cache_blocks", c_int),
        ("max_splits", c_int),
    ]


class ak_paged_kv(ctypes.Structure):
    _fields_ = [
        ("k_data", c_void_p),
        ("v_data", c_void_p),
        ("dtype", c_int),
        ("layout", c_int),
        ("device", ak_device),
        ("num_blocks", c_int),
        ("page_size", c_int),
        ("num_kv_heads", c_int),
        ("head_dim_qk", c_int),
        ("head_dim_vo", c_int),
        ("k_block_stride", c_int64),  # elements; 0 = packed
        ("v_block_stride", c_int64),
        ("scale_kind", c_int),          # fp8: AK_KV_SCALE_*
        ("k_scale", c_void_p),  # float [1] or [num_kv_heads] on the device, or NULL
        ("v_scale", c_void_p),
        ("marks", c_void_p),    # uint32 finiteness marks (ak_kv_marks_words), or NULL
    ]


class ak_kv_cache_config(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_layers", c_int),
        ("num_blocks", c_int),
        ("page_size", c_int),
        ("num_kv_heads", c_int),
        ("head_dim_qk", c_int),
        ("head_dim_vo", c_int),
        ("dtype", c_int),
        ("layout", c_int),
        ("device", ak_device),
        ("mla", c_int),
        ("marks", c_int),
    ]


class ak_batch(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_reqs", c_int),
        ("qo_indptr", ctypes.POINTER(ctypes.c_int32)),    # [num_reqs + 1]
        ("kv_lens", ctypes.POINTER(ctypes.c_int32)),      # [num_reqs]
        ("block_table", ctypes.POINTER(ctypes.c_int32)),  # [num_reqs, block_table_stride]
        ("block_table_stride", c_int),
        ("device_block_table", ctypes.POINTER(ctypes.c_int32)),  # the same on cfg.device
    ]


class ak_run_args(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("q", ctypes.POINTER(ak_tensor)),
        ("kv", ctypes.POINTER(ak_paged_kv)),
        ("k", ctypes.POINTER(ak_tensor)),
        ("v", ctypes.POINTER(ak_tensor)),
        ("o", ctypes.POINTER(ak_tensor)),
        ("lse", ctypes.POINTER(ak_tensor)),
        ("sinks", ctypes.POINTER(ak_tensor)),
        ("kv_scale_kind", c_int),       # ragged fp8 K/V: AK_KV_SCALE_*
        ("k_scale", c_void_p),
        ("v_scale", c_void_p),
    ]


# ---------------------------------------------------------------------------
# Prototypes
# ---------------------------------------------------------------------------

def _proto(lib, name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


def declare(lib):
    P = ctypes.POINTER
    status = c_int
    if not hasattr(lib, "ak_version_string"):
        raise ImportError("attnkit: the library has no ak_version_string(): it is older than "
                          "this binding (0.2.0); rebuild it or point ATTNKIT_LIB at a newer one")
    _proto(lib, "ak_version", c_int)
    _proto(lib, "ak_version_string", ctypes.c_char_p)
    _proto(lib, "ak_status_str", ctypes.c_char_p, status)
    _proto(lib, "ak_last_error", ctypes.c_char_p)
    _proto(lib, "ak_dtype_name", ctypes.c_char_p, c_int)
    _proto(lib, "ak_dtype_size", ctypes.c_size_t, c_int)
    _proto(lib, "ak_device_count", c_int, c_int)
    _proto(lib, "ak_device_get_info", status, ak_device, P(ak_device_info))
    _proto(lib, "ak_cpu_kernel_describe", status, P(ak_attn_config), ctypes.c_char_p, ctypes.c_size_t)
    _proto(lib, "ak_tensor_4d", ak_tensor, c_void_p, c_int, c_int64, c_int64, c_int64, c_int64)
    _proto(lib, "ak_attn_config_init", None, P(ak_attn_config))
    _proto(lib, "ak_limits_init", None, P(ak_limits))
    _proto(lib, "ak_kv_cache_config_init", None, P(ak_kv_cache_config))
    _proto(lib, "ak_kv_cache_create", status, P(ak_kv_cache_config), P(c_void_p))
    _proto(lib, "ak_kv_cache_destroy", None, c_void_p)
    _proto(lib, "ak_kv_cache_layer", status, c_void_p, c_int, P(ak_paged_kv))
    _proto(lib, "ak_batch_init", None, P(ak_batch))
    _proto(lib, "ak_run_args_init", None, P(ak_run_args))
    _proto(lib, "ak_kv_update", status, P(ak_paged_kv), P(ak_tensor), P(ak_tensor), c_void_p,
           c_int, c_void_p)
    _proto(lib, "ak_kv_marks_words", c_int64, c_int, c_int, c_int)
    _proto(lib, "ak_graph_support_name", ctypes.c_char_p, c_int)
    _proto(lib, "ak_backend_create", status, P(ak_attn_config), P(ak_limits), ctypes.c_char_p,
           P(c_void_p))
    _proto(lib, "ak_backend_destroy", None, c_void_p)
    _proto(lib, "ak_backend_plan", status, c_void_p, P(ak_batch), c_void_p)
    _proto(lib, "ak_backend_run", status, c_void_p, P(ak_run_args), c_void_p)
    _proto(lib, "ak_backend_name", ctypes.c_char_p, c_void_p)
    _proto(lib, "ak_backend_config", P(ak_attn_config), c_void_p)
    _proto(lib, "ak_backend_forward_includes_kv_update", c_int, c_void_p)
    _proto(lib, "ak_backend_graph_support", c_int, c_void_p)
    _proto(lib, "ak_backend_slot_mapping", c_void_p, c_void_p)
    _proto(lib, "ak_backend_planned_tokens", c_int, c_void_p)
    _proto(lib, "ak_backend_count", c_int)
    _proto(lib, "ak_backend_name_at", ctypes.c_char_p, c_int)
    _proto(lib, "ak_explain", status, P(ak_attn_config), ctypes.c_char_p, ctypes.c_size_t)
    _proto(lib, "ak_mla_prefer_absorbed", ctypes.c_int, P(ak_attn_config), ctypes.c_int)
    _proto(lib, "ak_support_matrix", status, ctypes.c_char_p, ctypes.c_size_t)


def check_struct_sizes(lib):
    """The C library's sizeof of every struct with a struct_size, against ours."""
    for struct, init in ((ak_attn_config, lib.ak_attn_config_init),
                         (ak_limits, lib.ak_limits_init),
                         (ak_kv_cache_config, lib.ak_kv_cache_config_init),
                         (ak_batch, lib.ak_batch_init),
                         (ak_run_args, lib.ak_run_args_init)):
        s = struct()
        init(ctypes.byref(s))
        if s.struct_size != ctypes.sizeof(struct):
            raise ImportError(f"attnkit: {struct.__name__} is {s.struct_size} bytes in the C "
                              f"library, {ctypes.sizeof(struct)} in python/attnkit/_capi.py: "
                              "the binding does not match include/attnkit.h")
