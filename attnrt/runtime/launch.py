"""Modules, functions, argument packing and launch configurations.

Kernel arguments: a Python ``int`` is a device pointer (8 bytes); scalars are numpy
scalars (``np.int32(n)``, ``np.float32(x)``, ...), whose dtype fixes their size. The
function's parameter layout is read from the CUBIN once (``cuKernelGetParamInfo``), so a
wrong argument count or size is a ``TypeError`` before anything is launched.
"""

from __future__ import annotations

import ctypes
import re
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._check import check, driver, failed_with, value_or_none

__all__ = ["Function", "LaunchConfig", "reduction_launch_config", "dim3",
           "i32", "u32", "i64", "u64", "f32", "f64"]

# Explicit scalar tags: aliases of the numpy scalar types they produce.
i32, u32, i64, u64, f32, f64 = np.int32, np.uint32, np.int64, np.uint64, np.float32, np.float64

_CODES: dict[type, str] = {
    np.int8: "b", np.uint8: "B", np.int16: "h", np.uint16: "H", np.int32: "i", np.uint32: "I",
    np.int64: "q", np.uint64: "Q", np.float32: "f", np.float64: "d", np.bool_: "?",
}
_MAX_DEFAULT_SHMEM = 48 * 1024
_SHMEM_ATTR = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


def dim3(v: int | Sequence[int], what: str) -> tuple[int, int, int]:
    """Normalise a grid/block spec to three positive ints within CUDA's limits.

    Raises
    ------
    ValueError
        Not 1-3 integers, a dimension below 1, or above the hardware limit.
    """
    t = (v,) if isinstance(v, (int, np.integer)) else tuple(v)
    if not 1 <= len(t) <= 3 or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                                       for x in t):
        raise ValueError(f"{what} must be an int or 1-3 ints, got {v!r}")
    t = tuple(int(x) for x in t) + (1,) * (3 - len(t))
    if any(x < 1 for x in t):
        raise ValueError(f"{what} dimensions must be >= 1, got {v!r}")
    limits = (2**31 - 1, 65535, 65535) if what == "grid" else (1024, 1024, 64)
    if any(x > lim for x, lim in zip(t, limits)) or (what == "block" and t[0] * t[1] * t[2] > 1024):
        rule = "x <= 2**31-1, y, z <= 65535" if what == "grid" else "x, y <= 1024, z <= 64, <= 1024 threads"
        raise ValueError(f"{what} {t} exceeds CUDA's limits ({rule})")
    return t  # type: ignore[return-value]


@dataclass(frozen=True)
class LaunchConfig:
    """Grid, block and dynamic shared memory of one launch."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int = 0


def reduction_launch_config(n_rows: int, row_len: int, *, max_block: int = 1024,
                            shared_bytes_per_thread: int = 4, warp: int = 32) -> LaunchConfig:
    """One block per row, ``block`` threads (a warp multiple up to ``max_block``) per row.

    The block is the smallest warp multiple covering the row, capped at ``max_block``;
    each thread gets ``shared_bytes_per_thread`` of dynamic shared memory for the
    cross-warp reduction.
    """
    if n_rows < 1 or row_len < 1:
        raise ValueError(f"reduction needs n_rows >= 1 and row_len >= 1, got {n_rows}, {row_len}")
    if n_rows > 2**31 - 1:
        raise ValueError(f"n_rows {n_rows} exceeds the grid limit 2**31-1")
    block = min(max_block, max(warp, -(-row_len // warp) * warp))
    return LaunchConfig((int(n_rows), 1, 1), (block, 1, 1), block * shared_bytes_per_thread)


def _param_count(handle: Any) -> int | None:
    """``cuKernelGetParamCount`` where driver and bindings have it (no error-probing needed:
    compute-sanitizer reports every failing API call), else ``None``."""
    fn = getattr(driver, "cuKernelGetParamCount", None)
    if fn is None:
        return None
    try:
        res = fn(handle)
    except Exception:  # the binding exists but the driver lacks the symbol
        return None
    count = value_or_none(res)
    return None if count is None else int(count)


def ptx_param_count(ptx: bytes | str, entry: str) -> int | None:
    """Number of parameters of ``.entry <entry>(...)`` in PTX text, or ``None`` if not found."""
    text = ptx.decode(errors="replace") if isinstance(ptx, bytes) else ptx
    m = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\(([^)]*)\)", text)
    return None if m is None else m.group(1).count(".param")


class _Packer:
    """Packs one argument signature into a reusable buffer + pointer array (per thread)."""

    __slots__ = ("struct", "buf", "ptrs", "addr", "sized")

    def __init__(self, fmt: str, offsets: Sequence[int], size: int,
                 sized: Sequence[tuple[int, int]] = ()) -> None:
        self.struct = struct.Struct(fmt)
        # (index, bytes) of the by-value struct arguments: struct's "Ns" would pad or cut.
        self.sized = tuple(sized)
        self.buf = ctypes.create_string_buffer(max(size, 1))
        base = ctypes.addressof(self.buf)
        self.ptrs = (ctypes.c_void_p * max(len(offsets), 1))(*[base + o for o in offsets])
        self.addr = ctypes.c_void_p(ctypes.addressof(self.ptrs)) if offsets else None


class Function:
    """A kernel entry point: a context-independent ``CUkernel`` from a loaded library.

    Launches run in the context of the runtime's stream (the driver takes it from the
    stream for a ``CUkernel``), so no context switch is needed on the hot path.
    """

    def __init__(self, handle: Any, name: str, module_name: str, max_optin_shared: int,
                 device: Any = None, make_current: Any = None, param_count: int | None = None) -> None:
        self.handle = handle
        self.handle_int = int(handle)
        self.handle_c = ctypes.c_void_p(self.handle_int)
        self.name = name
        self.module_name = module_name
        self.device = device
        self._make_current = make_current  # queries below need the device's context current
        self._param_count = param_count  # from the PTX signature, when known
        self._max_optin = max_optin_shared
        self._shmem_limit = _MAX_DEFAULT_SHMEM
        self._params: tuple[tuple[int, int], ...] | None = None
        self._tls = threading.local()

    def __repr__(self) -> str:
        return f"Function({self.module_name}::{self.name})"

    @property
    def params(self) -> tuple[tuple[int, int], ...]:
        """(offset, size) of every kernel parameter, from the CUBIN."""
        if self._params is None:
            if self._make_current is not None:
                self._make_current()
            count = _param_count(self.handle)
            if count is None:
                count = self._param_count
            out = []
            while count is None or len(out) < count:
                res = driver.cuKernelGetParamInfo(self.handle, len(out))
                if count is None and failed_with(res, "CUDA_ERROR_INVALID_VALUE"):
                    break  # older drivers: probed one past the last parameter
                out.append(check(res, f"cuKernelGetParamInfo({self.name}, {len(out)})"))
            self._params = tuple((int(o), int(s)) for o, s in out)
        return self._params

    def attribute(self, attr: Any) -> int:
        return check(driver.cuKernelGetAttribute(attr, self.handle, self.device),
                     f"cuKernelGetAttribute({attr.name})")

    @property
    def num_regs(self) -> int:
        return self.attribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS)

    def ensure_shared(self, nbytes: int) -> None:
        """Raise the kernel's dynamic shared memory limit (once per new high-water mark)."""
        if nbytes <= self._shmem_limit:
            return
        if nbytes > self._max_optin:
            raise ValueError(
                f"{self}: {nbytes} bytes of dynamic shared memory requested; the device allows "
                f"at most {self._max_optin} per block. Use smaller tiles or fewer stages.")
        if self._make_current is not None:
            self._make_current()
        check(driver.cuKernelSetAttribute(_SHMEM_ATTR, nbytes, self.handle, self.device),
              f"cuKernelSetAttribute({self.name}, MAX_DYNAMIC_SHARED_SIZE_BYTES, {nbytes})")
        self._shmem_limit = nbytes

    def no_args(self) -> None:
        """The launch parameters for an empty argument list (checked once against the kernel)."""
        if self._params is None or self._params:
            if self.params:
                raise TypeError(f"{self} takes {len(self.params)} arguments, got 0")
        return None

    def pack(self, args: Sequence[Any]) -> int:
        """Pack ``args``; returns the address of the ``void*[]`` that cuLaunchKernel reads (0: none)."""
        ptr = self.pack_c(args)
        return ptr.value if ptr is not None else 0

    def pack_c(self, args: Sequence[Any]) -> Any:
        """:meth:`pack` for the launch path: the address as ``c_void_p`` (``None`` for no params).

        The buffer is reused per thread and signature; the driver copies the parameters
        during the launch call, so reuse on the next launch is safe.
        """
        key = tuple(map(type, args)) if args else ()
        cache = getattr(self._tls, "packers", None)
        if cache is None:
            cache = self._tls.packers = {}
        packer = cache.get(key)
        if packer is None:
            packer = cache[key] = self._make_packer(args)
        for i, n in packer.sized:
            if len(args[i]) != n:
                raise TypeError(f"{self} argument {i}: parameter is {n} bytes, got a "
                                f"{len(args[i])}-byte bytes")
        if args:
            packer.struct.pack_into(packer.buf, 0, *args)
        return packer.addr

    def _make_packer(self, args: Sequence[Any]) -> _Packer:
        params = self.params
        if len(args) != len(params):
            raise TypeError(f"{self} takes {len(params)} arguments, got {len(args)}")
        fmt, pos = "<", 0
        offsets, sized = [], []
        for i, (arg, (off, size)) in enumerate(zip(args, params)):
            if isinstance(arg, bool):
                raise TypeError(f"{self} argument {i}: pass np.bool_ or an int scalar, not bool")
            if isinstance(arg, (int, np.integer)) and not isinstance(arg, np.generic):
                code = "Q"  # plain int: a device pointer
            elif isinstance(arg, np.generic) and type(arg) in _CODES:
                code = _CODES[type(arg)]
            elif isinstance(arg, bytes):
                code = f"{len(arg)}s"  # an opaque by-value struct (a CUtensorMap), same size
                sized.append((i, size))
            else:
                raise TypeError(f"{self} argument {i}: {type(arg).__name__} is not a kernel "
                                "argument; pass device pointers as int and scalars as numpy "
                                "scalars (np.int32, np.float32, ...)")
            asize = struct.calcsize("<" + code)
            if asize != size:
                hint = " (a plain int is an 8-byte pointer; wrap scalars, e.g. np.int32(n))" \
                    if code == "Q" else ""
                raise TypeError(f"{self} argument {i}: parameter is {size} bytes, got a "
                                f"{asize}-byte {type(arg).__name__}{hint}")
            if off > pos:
                fmt += f"{off - pos}x"
            fmt += code
            pos = off + size
            offsets.append(off)
        return _Packer(fmt, offsets, pos, sized)
