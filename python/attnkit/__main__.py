"""
python -m attnkit - what attnkit-info prints, through the binding: the
devices found, and for one config the selector's rule that fired (with the
evidence it cites) and every backend with "chosen", "available" or its
reasons (ak_explain). The same options and output as tools/attnkit_info.c:

    python -m attnkit [--heads QO/KV] [--head-dim D | --head-dim QK/VO]
                      [--dtype f32|f16|bf16] [--device cpu|cuda] [--page-size N]
                      [--layout nhd|hnd] [--ragged] [--window N] [--soft-cap C]
                      [--non-causal] [--workload any|decode] [--sinks] [--invariant]
                      [--mla]
    python -m attnkit --matrix
    python -m attnkit --version
    python -m attnkit --help

Exits 1 when no backend can serve the config, 2 on bad usage (the usage on
stderr); --help prints it on stdout and exits 0.
"""
import ctypes
import math
import re
import sys

from . import _capi, _lib

EXPLAIN_CAP = 16384  # attnkit-info's buffers
MATRIX_CAP = 32768
USAGE = """usage: {0} [--heads QO/KV] [--head-dim D|QK/VO] [--dtype f32|f16|bf16] [--kv-dtype f32|f16|bf16|fp8_e4m3]
          [--device cpu|cuda] [--page-size N] [--layout nhd|hnd] [--ragged] [--window N] [--soft-cap C] [--non-causal]
          [--workload any|decode] [--sinks] [--invariant] [--mla]
       {0} --matrix
       {0} --version
       {0} --help
"""
DTYPES = {"f32": _capi.AK_F32, "f16": _capi.AK_F16, "bf16": _capi.AK_BF16}
KV_DTYPES = dict(DTYPES, fp8_e4m3=_capi.AK_FP8_E4M3)


class _Usage(Exception):
    pass


# attnkit-info's conversions (strtol, strtof: ASCII digits, leading blanks), so that the options read alike
_INT = re.compile(r"\s*[+-]?[0-9]+", re.ASCII)
_DEC = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
_HEX = re.compile(r"\s*[+-]?0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)([pP][+-]?[0-9]+)?", re.ASCII)


def _ints(opt, s, least, most):
    """attnkit-info's parse_ints: `least` to `most` integers separated by '/',
    each the whole of its text and within a C int; else a _Usage naming opt."""
    parts = s.split("/")
    if least <= len(parts) <= most and all(_INT.fullmatch(p) for p in parts):
        values = [int(p) for p in parts]
        if all(-2**31 <= x < 2**31 for x in values):
            return values
    raise _Usage(f"{opt} '{s}': expected " +
                 ("N/M (integers)" if least == 2 else "N or N/M (integers)" if most == 2 else "an integer"))


def _choice(opt, s, choices):
    if s not in choices:
        raise _Usage(f"{opt} '{s}': expected {' or '.join(choices)}")
    return s


def _float(opt, s):
    """A decimal or hexadecimal number, the whole text, finite once a float32
    (as attnkit-info's strtof and isfinite)"""
    x = float(s) if _DEC.fullmatch(s) else float.fromhex(s) if _HEX.fullmatch(s) else None
    if x is not None and math.isfinite(ctypes.c_float(x).value):
        return x
    raise _Usage(f"{opt} '{s}': expected a number")


def _parse(argv, cfg):
    """Fills cfg from the options; returns (device_given, what, kv): what is
    "help", "version", "matrix" or None; kv (dtype_given, kv_dtype) is --kv-dtype, for
    main to apply after the device's default dtype. --mla without --heads /
    --head-dim: 128/1 heads, 576/512 (DeepSeek-V3), as attnkit-info."""
    device_given = False
    heads_given = dims_given = False
    dtype_given, kv_dtype = False, None  # --kv-dtype, applied after --dtype
    i = 0
    while i < len(argv):
        a = argv[i]
        v = argv[i + 1] if i + 1 < len(argv) else None
        takes_value = True
        if a == "--heads" and v is not None:
            cfg.num_qo_heads, cfg.num_kv_heads = _ints(a, v, 2, 2)
            heads_given = True
        elif a == "--head-dim" and v is not None:
            dims = _ints(a, v, 1, 2)
            cfg.head_dim_qk = dims[0]
            cfg.head_dim_vo = dims[-1]
            dims_given = True
        elif a == "--dtype" and v is not None:
            if v not in DTYPES:
                raise _Usage()
            cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = DTYPES[v]
            dtype_given = True
        elif a == "--kv-dtype" and v is not None:
            if v not in KV_DTYPES:
                raise _Usage()
            kv_dtype = KV_DTYPES[v]
        elif a == "--device" and v is not None:
            cfg.device.kind = (_capi.AK_DEVICE_CUDA if _choice(a, v, ("cpu", "cuda")) == "cuda"
                               else _capi.AK_DEVICE_CPU)
            device_given = True
        elif a == "--page-size" and v is not None:
            cfg.page_size = _ints(a, v, 1, 1)[0]
        elif a == "--layout" and v is not None:
            cfg.kv_layout = (_capi.AK_LAYOUT_HND if _choice(a, v, ("nhd", "hnd")) == "hnd"
                             else _capi.AK_LAYOUT_NHD)
        elif a == "--window" and v is not None:
            cfg.window_left = _ints(a, v, 1, 1)[0]
        elif a == "--soft-cap" and v is not None:
            cfg.logits_soft_cap = _float(a, v)
        elif a == "--workload" and v is not None:
            if v not in ("any", "decode"):
                raise _Usage()
            cfg.workload = _capi.AK_WORKLOAD_DECODE if v == "decode" else _capi.AK_WORKLOAD_ANY
        else:
            takes_value = False
            if a == "--ragged":
                cfg.kv_storage = _capi.AK_KV_RAGGED
            elif a in ("--help", "-h"):
                return device_given, "help", None
            elif a == "--version":
                return device_given, "version", None
            elif a == "--matrix":
                return device_given, "matrix", None
            elif a == "--non-causal":
                cfg.causal = 0
            elif a == "--sinks":
                cfg.use_sinks = 1
            elif a == "--invariant":
                cfg.batch_invariant = 1
            elif a == "--mla":
                cfg.mla = 1
            else:
                raise _Usage()
        i += 2 if takes_value else 1
    if cfg.mla and not heads_given:
        cfg.num_qo_heads, cfg.num_kv_heads = 128, 1
    if cfg.mla and not dims_given:
        cfg.head_dim_qk, cfg.head_dim_vo = 576, 512
    return device_given, None, (dtype_given, kv_dtype)


def _print_devices(cfg):
    print("devices:")
    for kind, label in ((_capi.AK_DEVICE_CPU, "cpu"), (_capi.AK_DEVICE_CUDA, "cuda")):
        n = _lib.ak_device_count(kind)
        if n == 0:
            print(f"  {label}: none")
        for i in range(n):
            info = _capi.ak_device_info()
            dev = _capi.ak_device(kind, i)
            if _lib.ak_device_get_info(dev, ctypes.byref(info)) != _capi.AK_OK:
                continue
            name = info.name.decode(errors="replace")
            if kind == _capi.AK_DEVICE_CPU:
                # the kernel the cpu backend would run for this config's dtypes
                kernel = ctypes.create_string_buffer(256)
                _lib.ak_cpu_kernel_describe(ctypes.byref(cfg), kernel, len(kernel))
                print(f"  cpu:0  {name}, {info.num_sms} logical cores, "
                      f"cpu kernel: {kernel.value.decode(errors='replace')}")
            else:
                print(f"  cuda:{i} {name}, sm_{info.cc_major}{info.cc_minor}, {info.num_sms} SMs, "
                      f"{info.memory_bytes / 1073741824.0:.1f} GiB, "
                      f"L2 {info.l2_bytes / 1048576.0:.0f} MiB")


def main(argv=None, prog="python -m attnkit"):
    argv = sys.argv[1:] if argv is None else argv
    cfg = _capi.ak_attn_config()
    _lib.ak_attn_config_init(ctypes.byref(cfg))
    cfg.num_qo_heads, cfg.num_kv_heads = 32, 8
    try:
        device_given, what, kv = _parse(argv, cfg)
    except _Usage as e:
        sys.stderr.write((f"{e}\n" if str(e) else "") + USAGE.format(prog))
        return 2
    if what == "help":
        sys.stdout.write(USAGE.format(prog))
        return 0
    if what == "version":
        print("attnkit " + _lib.ak_version_string().decode())
        return 0
    if what == "matrix":
        buf = ctypes.create_string_buffer(MATRIX_CAP)
        status = _lib.ak_support_matrix(buf, MATRIX_CAP)
        sys.stdout.write(buf.value.decode(errors="replace"))
        return 0 if status == _capi.AK_OK else 1

    # default device: the GPU where one is found
    if not device_given and _lib.ak_device_count(_capi.AK_DEVICE_CUDA) > 0:
        cfg.device.kind = _capi.AK_DEVICE_CUDA
        if cfg.q_dtype == _capi.AK_F32:
            cfg.q_dtype = cfg.kv_dtype = cfg.o_dtype = _capi.AK_BF16
    # --kv-dtype after --dtype, as attnkit-info: fp8 K/V keep q and o bf16 unless --dtype said
    dtype_given, kv_dtype = kv
    if kv_dtype is not None:
        if kv_dtype == _capi.AK_FP8_E4M3 and not dtype_given:
            cfg.q_dtype = cfg.o_dtype = _capi.AK_BF16
        cfg.kv_dtype = kv_dtype
    _print_devices(cfg)
    buf = ctypes.create_string_buffer(EXPLAIN_CAP)
    status = _lib.ak_explain(ctypes.byref(cfg), buf, EXPLAIN_CAP)
    sys.stdout.write("\n" + buf.value.decode(errors="replace"))
    sys.stdout.flush()
    if status != _capi.AK_OK:
        sys.stderr.write(f"\n{prog}: {_lib.ak_status_str(status).decode()}: "
                         f"{(_lib.ak_last_error() or b'').decode(errors='replace')}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
