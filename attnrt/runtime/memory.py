"""Raw device memory: allocation with a ledger, copies and memset on the runtime's stream."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._check import check, driver

__all__ = ["Ledger", "MemoryStats", "alloc", "free", "htod", "dtoh", "dtod", "memset"]


@dataclass(frozen=True)
class MemoryStats:
    """A snapshot of the allocation ledger."""

    live_bytes: int
    peak_bytes: int
    live_count: int
    total_allocs: int
    total_frees: int


class Ledger:
    """Every raw allocation made through a runtime: pointer → bytes.

    Thread-safe. It also answers "does [ptr, ptr+n) lie inside one of our allocations?",
    which lets copies refuse an overrun on memory we own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}
        self._starts: list[int] = []
        self._live = 0
        self._peak = 0
        self._allocs = 0
        self._frees = 0

    def add(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            self._sizes[ptr] = nbytes
            bisect.insort(self._starts, ptr)
            self._live += nbytes
            self._peak = max(self._peak, self._live)
            self._allocs += 1

    def remove(self, ptr: int) -> int:
        with self._lock:
            nbytes = self._sizes.pop(ptr, None)
            if nbytes is None:
                raise ValueError(
                    f"free_raw(0x{ptr:x}): not a live allocation of this runtime "
                    "(unknown pointer, or already freed)")
            del self._starts[bisect.bisect_left(self._starts, ptr)]
            self._live -= nbytes
            self._frees += 1
            return nbytes

    def owner(self, ptr: int) -> tuple[int, int] | None:
        """The (start, nbytes) of our allocation containing ``ptr``, or ``None``."""
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            if i < 0:
                return None
            start = self._starts[i]
            size = self._sizes[start]
            return (start, size) if ptr < start + max(size, 1) else None

    def check_range(self, ptr: int, nbytes: int, what: str) -> None:
        """Refuse a range that starts inside one of our allocations and runs past its end."""
        own = self.owner(ptr)
        if own is not None and ptr + nbytes > own[0] + own[1]:
            raise ValueError(
                f"{what}: {nbytes} bytes at 0x{ptr:x} overrun the allocation 0x{own[0]:x} "
                f"of {own[1]} bytes by {ptr + nbytes - own[0] - own[1]} bytes")

    def pointers(self) -> list[int]:
        with self._lock:
            return list(self._starts)

    def stats(self) -> MemoryStats:
        with self._lock:
            return MemoryStats(self._live, self._peak, len(self._sizes), self._allocs, self._frees)


def alloc(nbytes: int) -> int:
    """``cuMemAlloc`` in the current context; 0 bytes gives a 1-byte allocation."""
    return int(check(driver.cuMemAlloc(max(int(nbytes), 1)), f"cuMemAlloc({nbytes})"))


def free(ptr: int) -> None:
    check(driver.cuMemFree(ptr), f"cuMemFree(0x{ptr:x})")


def _host_array(host: Any, writable: bool) -> np.ndarray:
    if not isinstance(host, np.ndarray):
        if writable:
            raise TypeError(f"dtoh needs a writable numpy array, got {type(host).__name__}")
        host = np.ascontiguousarray(host)
    if not host.flags.c_contiguous:
        raise ValueError("host array must be C-contiguous (use np.ascontiguousarray)")
    if writable and not host.flags.writeable:
        raise ValueError("dtoh target array is read-only")
    return host


def htod(ptr: int, host: Any, stream: Any) -> None:
    """Copy a host array into device memory; returns once the host buffer may be reused."""
    arr = _host_array(host, writable=False)
    if arr.nbytes:
        check(driver.cuMemcpyHtoDAsync(ptr, arr.ctypes.data, arr.nbytes, stream),
              f"cuMemcpyHtoDAsync(0x{ptr:x}, {arr.nbytes})")
        # A pageable source is staged before return, but the caller may hand us a
        # temporary: keep it alive until the copy has been consumed.
        check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")


def dtoh(host: np.ndarray, ptr: int, stream: Any) -> np.ndarray:
    """Copy device memory into a host array (``host.nbytes`` bytes) and wait for it."""
    arr = _host_array(host, writable=True)
    if arr.nbytes:
        check(driver.cuMemcpyDtoHAsync(arr.ctypes.data, ptr, arr.nbytes, stream),
              f"cuMemcpyDtoHAsync(0x{ptr:x}, {arr.nbytes})")
        check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")
    return arr


def dtod(dst: int, src: int, nbytes: int, stream: Any) -> None:
    if nbytes:
        check(driver.cuMemcpyDtoDAsync(dst, src, nbytes, stream),
              f"cuMemcpyDtoDAsync(0x{dst:x}, 0x{src:x}, {nbytes})")


def memset(ptr: int, value: int, nbytes: int, stream: Any) -> None:
    if not 0 <= value <= 255:
        raise ValueError(f"memset value is one byte (0..255), got {value}")
    if nbytes:
        check(driver.cuMemsetD8Async(ptr, value, nbytes, stream),
              f"cuMemsetD8Async(0x{ptr:x}, {value}, {nbytes})")
