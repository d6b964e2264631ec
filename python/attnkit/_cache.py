"""
_cache.py - ak_kv_cache's block allocator: block ids shared by every layer's
pools, with reference counts (alloc, share, free). Safe to call from several
threads at once (the C allocator locks). The pools' memory stays inside the
C object here; kv_update and Backend.run take the caller's K/V tensors.
"""
import ctypes

from . import _capi


def _declare(lib):
    I32P = ctypes.POINTER(ctypes.c_int32)
    for name, restype, args in (
            ("ak_kv_cache_alloc", ctypes.c_int, (ctypes.c_void_p, ctypes.c_int, I32P)),
            ("ak_kv_cache_share", ctypes.c_int, (ctypes.c_void_p, ctypes.c_int, I32P)),
            ("ak_kv_cache_free", ctypes.c_int, (ctypes.c_void_p, ctypes.c_int, I32P)),
            ("ak_kv_cache_num_free", ctypes.c_int, (ctypes.c_void_p,)),
            ("ak_kv_cache_refcount", ctypes.c_int, (ctypes.c_void_p, ctypes.c_int32))):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, list(args)


class KVCache:
    """ak_kv_cache: num_layers K/V pools of num_blocks blocks and their block
    allocator. num_layers=0 makes the allocator alone, for an engine whose
    pools are its own tensors (block ids index their first dimension).
    head_dim_vo: the value's head dim (None: head_dim). mla=True: K pools only
    (multi-head latent attention: head_dim = latent + rotary width, head_dim_vo
    = latent width, the value is the first head_dim_vo of each K row).
    close() (or the end of a with-block, or garbage collection) destroys it. Failures raise attnkit.Error subclasses with the C message."""

    def __init__(self, num_blocks, page_size=16, num_kv_heads=8, head_dim=128, num_layers=1,
                 dtype="f16", layout="NHD", device="cpu", head_dim_vo=None, mla=False):
        from . import _c_int, _check, _dtype_code, _enum_value, _LAYOUTS, _lib, _parse_device
        _declare(_lib)
        self._lib, self._check, self._h = _lib, _check, None
        c = _capi.ak_kv_cache_config()
        _lib.ak_kv_cache_config_init(ctypes.byref(c))
        c.num_layers, c.num_blocks = _c_int(num_layers, "num_layers"), _c_int(num_blocks, "num_blocks")
        c.page_size, c.num_kv_heads = _c_int(page_size, "page_size"), _c_int(num_kv_heads, "num_kv_heads")
        c.head_dim_qk = _c_int(head_dim, "head_dim")
        c.head_dim_vo = _c_int(head_dim if head_dim_vo is None else head_dim_vo, "head_dim_vo")
        c.mla = int(bool(mla))
        c.dtype = _dtype_code(dtype, "dtype")
        c.layout = _enum_value(_LAYOUTS, layout, "layout")
        c.device.kind, c.device.index = _parse_device(device, "device")
        h = ctypes.c_void_p()
        _check(_lib.ak_kv_cache_create(ctypes.byref(c), ctypes.byref(h)))
        self._h = h

    def _ids(self, ids):
        from . import _c_int
        ids = [_c_int(i, "ids") for i in ids]
        return len(ids), (ctypes.c_int32 * max(len(ids), 1))(*ids)

    def alloc(self, n):
        """n fresh blocks (reference count 1), all or none."""
        from . import _c_int
        n = _c_int(n, "n")
        out = (ctypes.c_int32 * max(n, 1))()
        self._check(self._lib.ak_kv_cache_alloc(self._h, n, out))
        return list(out[:n])

    def share(self, ids):
        """Adds one reference to each block named (a name twice adds two)."""
        n, arr = self._ids(ids)
        self._check(self._lib.ak_kv_cache_share(self._h, n, arr))

    def free(self, ids):
        """Drops one reference per name; a block returns to the pool at zero."""
        n, arr = self._ids(ids)
        self._check(self._lib.ak_kv_cache_free(self._h, n, arr))

    @property
    def num_free(self):
        return self._lib.ak_kv_cache_num_free(self._h)

    def refcount(self, block):
        """References of a block (-1 for an id out of range)."""
        return self._lib.ak_kv_cache_refcount(self._h, int(block))

    def close(self):
        if self._h:
            self._lib.ak_kv_cache_destroy(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()
