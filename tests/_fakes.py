"""A fake CudaRuntime for CPU fuzzing: it hands out fake pointers and never runs a kernel.

The op modules use the runtime only through a few calls (``capabilities``, ``nvrtc_function``,
``launch``, ``alloc_raw``/``free_raw``, ``htod``/``dtoh``/``dtod``/``memset``,
``synchronize``, ``is_capturing``, ``capture_error_ptr``, ``latch``). This fake implements
them with the real runtime's refusals, so that every host-side path of an op can run
without a GPU:

- ``launch`` counts (``launch_count``, ``launches``) and refuses what the driver or the real
  runtime would refuse: a grid or block out of range, more dynamic shared memory than the
  device's opt-in limit (``ValueError``, as ``Function.ensure_shared``), an argument that is
  neither a pointer ``int`` nor a numpy scalar, and a pointer that lies outside every tensor
  and allocation the fake knows (:class:`FakeLaunchError`). Nothing is executed, except the
  hooks a test installs in ``on_launch`` (entry name -> callable(args)).
- Memory is address ranges. Small ranges are backed by host bytes, so that ``dtoh`` of data
  a test registered with :meth:`FakeRuntime.put` returns it (IndexShare reads its
  ``selected_indices`` back eagerly); large ones are address space only.
- ``alloc_raw`` beyond ``memory_bytes`` raises the real runtime's ``CudaError``
  (``CUDA_ERROR_OUT_OF_MEMORY``); while capturing, alloc/free/synchronize/htod/dtoh and
  latch reads raise ``CaptureError``.
"""

from __future__ import annotations

import bisect
import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings

from attnrt.runtime.api import DataType, TensorMut, TensorView
from attnrt.runtime.errors import CaptureError, CudaError
from attnrt.runtime.latch import Latch

__all__ = ["FakeRuntime", "FakeFunction", "FakeLaunchError", "Launch"]

_BACKED_MAX = 64 << 20  # ranges up to this size get host bytes
_GUARD = 1 << 16  # gap between ranges, so an overrun lands in no range
_SCALARS = (np.int32, np.int64, np.uint32, np.uint64, np.float32, np.int16, np.uint16, np.int8,
            np.uint8, np.float64)


class FakeLaunchError(AssertionError):
    """A launch that the driver or the real runtime would refuse (a bug in the op's host code)."""


@dataclass(frozen=True)
class FakeFunction:
    """What ``nvrtc_function`` returns: the entry and the compile it came from."""

    name: str
    module: str
    options: tuple[str, ...]
    arch: str | None


@dataclass
class Launch:
    """One recorded launch."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: list[Any]
    shared_mem: int
    captured: bool
    programmatic: bool = False


@dataclass
class _Range:
    start: int
    nbytes: int
    owned: bool  # from alloc_raw (counted in the ledger)
    data: np.ndarray | None = field(default=None, repr=False)  # uint8 backing, or None

    @property
    def end(self) -> int:
        return self.start + self.nbytes


def _dim3(v: Any, what: str) -> tuple[int, int, int]:
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        t = (int(v), 1, 1)
    elif isinstance(v, (tuple, list)) and 1 <= len(v) <= 3 and all(
            isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v):
        t = tuple(int(x) for x in v) + (1,) * (3 - len(v))
    else:
        raise ValueError(f"launch: {what} must be an int or 1-3 ints, got {v!r}")
    if min(t) < 1:
        raise ValueError(f"launch: {what} {t} has a dimension < 1")
    return t  # type: ignore[return-value]


class FakeRuntime:
    """The parts of :class:`attnrt.CudaRuntime` the op modules use, without a GPU.

    Parameters
    ----------
    sm_count, max_shared
        Device facts (an H200 by default).
    memory_bytes
        Device memory: ``alloc_raw`` beyond what is free is ``CUDA_ERROR_OUT_OF_MEMORY``.
    """

    def __init__(self, *, sm_count: int = 132, max_shared: int = 232448,
                 memory_bytes: int = 141 << 30) -> None:
        self.capabilities = SimpleNamespace(
            name="fake H200", ordinal=0, arch="sm_90", compute_capability=(9, 0),
            sm_count=sm_count, max_shared_per_block=49152, max_shared_per_block_optin=max_shared,
            l2_bytes=60 << 20, max_threads_per_block=1024, warp_size=32)
        self.arch, self.arch_exact = "sm_90", True
        self.memory_bytes = memory_bytes
        self.launch_count = 0
        self.launches: list[Launch] = []
        self.compiles: list[FakeFunction] = []
        self.copies = 0
        self.on_launch: dict[str, Callable[[list[Any]], None]] = {}
        self._starts: list[int] = []
        self._ranges: dict[int, _Range] = {}
        self._next = 0x7F00_0000_0000
        self._live = 0
        self._capturing = False
        self._captured: list[Launch] = []
        latch_ptr = self._reserve(4, owned=False, backed=True)
        self.latch = Latch(self, latch_ptr)

    def tensor_map_2d(self, address: int, dtype: DataType, shape: tuple[int, int],
                      row_bytes: int, box: tuple[int, int], l2_promotion: int = 256) -> bytes:
        """A stand-in TMA descriptor (128 bytes naming its arguments; nothing reads it)."""
        if dtype not in (DataType.BFLOAT16, DataType.FLOAT16):
            raise ValueError(f"tensor_map_2d: a 16-bit float dtype, got {dtype!r}")
        fields = (address, int(dtype), *shape, row_bytes, *box, l2_promotion)
        return np.asarray(fields, dtype=np.int64).tobytes().ljust(128, b"\0")

    # -- address space ---------------------------------------------------------------------
    def _reserve(self, nbytes: int, *, owned: bool, backed: bool | None = None,
                 align: int = 256) -> int:
        start = -(-self._next // align) * align
        self._next = start + max(int(nbytes), 1) + _GUARD
        if backed is None:
            backed = nbytes <= _BACKED_MAX
        data = np.zeros(int(nbytes), dtype=np.uint8) if backed else None
        self._ranges[start] = _Range(start, int(nbytes), owned, data)
        bisect.insort(self._starts, start)
        return start

    def _find(self, ptr: int) -> _Range | None:
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i < 0:
            return None
        r = self._ranges[self._starts[i]]
        return r if r.start <= ptr <= r.end else None

    def owns(self, ptr: int) -> bool:
        """Whether ``ptr`` lies in (or one past the end of) a range the fake handed out."""
        return self._find(int(ptr)) is not None

    def put(self, host: np.ndarray, *, align: int = 256, offset: int = 0) -> int:
        """Register a tensor's bytes at a fresh address (``offset`` bytes past an aligned one)."""
        a = np.ascontiguousarray(host)
        start = self._reserve(a.nbytes + offset, owned=False, backed=True, align=align)
        r = self._ranges[start]
        r.data[offset:offset + a.nbytes] = a.reshape(-1).view(np.uint8)  # type: ignore[index]
        return start + offset

    def address(self, nbytes: int, *, offset: int = 0) -> int:
        """A fresh range of ``nbytes`` (address space only when large; never counted)."""
        return self._reserve(nbytes + offset, owned=False) + offset

    def view(self, shape: Sequence[int], dtype: DataType, strides: Sequence[int] | None = None,
             *, data: np.ndarray | None = None, mut: bool = False, offset: int = 0) -> TensorView:
        """A TensorView (or TensorMut) over a fresh range that covers ``shape``/``strides``."""
        dtype = DataType(dtype)
        shape = tuple(int(d) for d in shape)
        if strides is None:
            span = math.prod(shape)
        else:
            span = 1 + sum((d - 1) * abs(int(s)) for d, s in zip(shape, strides)) if all(shape) else 0
        nbytes = span * dtype.itemsize
        ptr = self.put(data, offset=offset) if data is not None else self.address(nbytes, offset=offset)
        cls = TensorMut if mut else TensorView
        return cls(ptr, dtype, shape, None if strides is None else tuple(int(s) for s in strides))

    def read(self, ptr: int, nbytes: int) -> np.ndarray | None:
        """The backing bytes at ``ptr`` (None where unbacked)."""
        r = self._find(ptr)
        if r is None or r.data is None or ptr + nbytes > r.end:
            return None
        return r.data[ptr - r.start:ptr - r.start + nbytes]

    def write(self, ptr: int, host: np.ndarray) -> None:
        """Store ``host``'s bytes at ``ptr`` if that range is backed (hooks emulate kernels)."""
        a = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        dst = self.read(ptr, a.nbytes)
        if dst is not None:
            dst[:] = a

    # -- the runtime surface ---------------------------------------------------------------
    def is_capturing(self) -> bool:
        return self._capturing

    def _refuse_while_capturing(self, what: str) -> None:
        if self._capturing:
            raise CaptureError(f"{what} is not allowed while the stream is capturing")

    def alloc_raw(self, nbytes: int) -> int:
        if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ValueError(f"alloc_raw needs a non-negative int byte count, got {nbytes!r}")
        self._refuse_while_capturing(f"alloc_raw({nbytes})")
        if self._live + int(nbytes) > self.memory_bytes:
            raise CudaError(2, "CUDA_ERROR_OUT_OF_MEMORY", f"cuMemAlloc({int(nbytes)})")
        ptr = self._reserve(int(nbytes), owned=True)
        self._live += int(nbytes)
        return ptr

    def free_raw(self, ptr: int) -> None:
        self._refuse_while_capturing(f"free_raw(0x{int(ptr):x})")
        r = self._ranges.get(int(ptr))
        if r is None or not r.owned:
            raise ValueError(f"free_raw: 0x{int(ptr):x} is not a live allocation")
        del self._ranges[r.start]
        self._starts.remove(r.start)
        self._live -= r.nbytes

    def memory_stats(self) -> SimpleNamespace:
        live = [r for r in self._ranges.values() if r.owned]
        return SimpleNamespace(live_bytes=self._live, live_count=len(live))

    def htod(self, ptr: int, host: Any) -> None:
        self._refuse_while_capturing("htod")
        self.write(int(ptr), np.asarray(host))

    def dtoh(self, host: np.ndarray, ptr: int) -> np.ndarray:
        self._refuse_while_capturing("dtoh")
        src = self.read(int(ptr), host.nbytes)
        flat = host.reshape(-1).view(np.uint8)
        if src is not None:
            flat[:] = src
        else:
            flat[:] = 0
        return host

    def dtod(self, dst: int, src: int, nbytes: int) -> None:
        self.copies += 1
        if not self._capturing:
            s = self.read(int(src), int(nbytes))
            if s is not None:
                self.write(int(dst), s.copy())

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        self.copies += 1
        if not self._capturing:
            d = self.read(int(ptr), int(nbytes))
            if d is not None:
                d[:] = value

    def synchronize(self) -> None:
        self._refuse_while_capturing("synchronize")

    def capture_error_ptr(self) -> int:
        return self.latch.ptr

    def begin_capture(self, mode: str = "thread_local") -> None:
        if self._capturing:
            raise CaptureError("begin_capture: the stream is already capturing")
        self._capturing, self._captured = True, []

    def end_capture(self) -> list[Launch]:
        if not self._capturing:
            raise CaptureError("end_capture: the stream is not capturing")
        self._capturing = False
        return self._captured

    def abort_capture(self) -> None:
        self._capturing = False

    @contextlib.contextmanager
    def capture(self, mode: str = "thread_local") -> Iterator[list[Launch]]:
        self.begin_capture(mode)
        try:
            yield self._captured
        except BaseException:
            self.abort_capture()
            raise
        self.end_capture()

    def nvrtc_function(self, module: str, source: str, entry: str, options: Sequence[str] = (),
                       *, headers: dict[str, str] | None = None, arch: str | None = None) -> FakeFunction:
        # The entry must exist in the sources handed over (as a name, possibly in a macro).
        text = source + "".join((headers or {}).values())
        if entry not in text:
            raise FakeLaunchError(f"nvrtc_function: entry {entry!r} is not in module {module!r}")
        fn = FakeFunction(entry, module, tuple(options), arch)
        self.compiles.append(fn)
        return fn

    def launch(self, fn: FakeFunction, grid: Any, block: Any, args: Sequence[Any],
               shared_mem: int = 0, *, programmatic: bool = False) -> None:
        g, b = _dim3(grid, "grid"), _dim3(block, "block")
        if g[0] > 2**31 - 1 or g[1] > 65535 or g[2] > 65535:
            raise FakeLaunchError(f"{fn.name}: grid {g} exceeds (2**31-1, 65535, 65535)")
        if b[0] > 1024 or b[1] > 1024 or b[2] > 64 or b[0] * b[1] * b[2] > 1024:
            raise FakeLaunchError(f"{fn.name}: block {b} exceeds 1024 threads")
        if shared_mem < 0:
            raise FakeLaunchError(f"{fn.name}: negative shared memory {shared_mem}")
        if shared_mem > self.capabilities.max_shared_per_block_optin:
            # What the real runtime raises (Function.ensure_shared), before launching.
            raise ValueError(f"{fn.name}: {shared_mem} bytes of dynamic shared memory exceed the "
                             f"device limit {self.capabilities.max_shared_per_block_optin}")
        for i, a in enumerate(args):
            if type(a) is int:
                if a != 0 and not (0 < a < 2**64 and self.owns(a)):
                    raise FakeLaunchError(f"{fn.name}: argument {i} = 0x{a:x} is a pointer into no "
                                          "tensor, workspace or allocation")
            elif isinstance(a, bytes):  # a by-value struct (a TMA descriptor: 128 bytes)
                if len(a) != 128:
                    raise FakeLaunchError(f"{fn.name}: argument {i} is {len(a)} bytes; the only "
                                          "by-value struct the kernels take is 128")
            elif not isinstance(a, _SCALARS):
                raise FakeLaunchError(f"{fn.name}: argument {i} is a {type(a).__name__}; expected a "
                                      "pointer int, a numpy scalar or a descriptor's bytes")
        if programmatic and self.capabilities.compute_capability < (9, 0):
            raise FakeLaunchError(f"{fn.name}: programmatic dependent launch needs cc >= 9.0")
        rec = Launch(fn.name, g, b, list(args), int(shared_mem), self._capturing,
                     bool(programmatic))
        self.launch_count += 1
        self.launches.append(rec)
        if self._capturing:
            self._captured.append(rec)
            return
        hook = self.on_launch.get(fn.name)
        if hook is not None:
            hook(list(args))

    # -- helpers for tests -----------------------------------------------------------------
    def names(self) -> list[str]:
        """Entries launched so far, in order."""
        return [x.name for x in self.launches]


# Hypothesis settings shared by the fuzz suites: derandomized (CI runs are repeatable), no
# example database, no deadline (first calls compile or plan).
CPU_SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PER_MUTATION = settings(CPU_SETTINGS, max_examples=30)
GPU_SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                        suppress_health_check=list(HealthCheck))
