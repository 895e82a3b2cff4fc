"""Device selection, the retained primary context, and the device's facts.

Device facts are read once, here, and handed to everything else through
:class:`Capabilities`; kernels ask the runtime, never the driver.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

from ._check import check, driver, driver_missing_reason, load_driver

__all__ = ["Capabilities", "Device", "device_count", "gpu_missing_reason"]

_A = driver.CUdevice_attribute


@dataclass(frozen=True)
class Capabilities:
    """What kernels may assume about one device.

    ``max_shared_per_block_optin`` is the dynamic shared memory a block may use after
    raising the function's limit; ``max_shared_per_block`` is the default (48 KiB).
    """

    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    max_shared_per_block: int
    max_shared_per_block_optin: int
    max_shared_per_sm: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_registers_per_sm: int
    warp_size: int
    l2_bytes: int
    total_memory: int

    @property
    def arch(self) -> str:
        """The device's exact target, e.g. ``"sm_90"``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["arch"] = self.arch
        return d


def gpu_missing_reason() -> str | None:
    """``None`` when a CUDA device is usable, else one sentence saying why not."""
    return driver_missing_reason()


def device_count() -> int:
    """Number of CUDA devices (0 when there is no driver)."""
    if driver_missing_reason() is not None:
        return 0
    return check(driver.cuDeviceGetCount(), "cuDeviceGetCount")


def _attr(dev: Any, attr: Any) -> int:
    return check(driver.cuDeviceGetAttribute(attr, dev), f"cuDeviceGetAttribute({attr.name})")


def _read_capabilities(ordinal: int, dev: Any) -> Capabilities:
    raw = check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
    name = raw.split(b"\0", 1)[0].decode(errors="replace")
    return Capabilities(
        ordinal=ordinal,
        name=name,
        compute_capability=(_attr(dev, _A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                            _attr(dev, _A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
        sm_count=_attr(dev, _A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        max_shared_per_block=_attr(dev, _A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
        max_shared_per_block_optin=_attr(dev, _A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        max_shared_per_sm=_attr(dev, _A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        max_threads_per_block=_attr(dev, _A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
        max_threads_per_sm=_attr(dev, _A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR),
        max_registers_per_sm=_attr(dev, _A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR),
        warp_size=_attr(dev, _A.CU_DEVICE_ATTRIBUTE_WARP_SIZE),
        l2_bytes=_attr(dev, _A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
        total_memory=int(check(driver.cuDeviceTotalMem(dev), "cuDeviceTotalMem")),
    )


class Device:
    """One CUDA device and its retained primary context.

    The primary context is shared with every other library in the process that uses the
    runtime API (torch, CuPy), so pointers pass freely between them.
    """

    def __init__(self, ordinal: int = 0) -> None:
        if not isinstance(ordinal, int) or ordinal < 0:
            raise ValueError(f"device ordinal must be a non-negative int, got {ordinal!r}")
        load_driver()
        count = check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
        if ordinal >= count:
            raise ValueError(f"device {ordinal} does not exist: the driver reports {count} device(s)")
        self.ordinal = ordinal
        self.handle = check(driver.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
        self.context = check(driver.cuDevicePrimaryCtxRetain(self.handle),
                             f"cuDevicePrimaryCtxRetain({ordinal})")
        self._ctx_int = int(self.context)
        self._lock = threading.Lock()
        self._released = False
        self.make_current()
        self.capabilities = _read_capabilities(ordinal, self.handle)

    def make_current(self) -> None:
        """Make this device's primary context current on the calling thread (cheap when it is)."""
        cur = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if cur is None or int(cur) != self._ctx_int:
            check(driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def release(self) -> None:
        """Release the retained primary context (idempotent)."""
        with self._lock:
            if self._released:
                return
            self._released = True
        check(driver.cuDevicePrimaryCtxRelease(self.handle), "cuDevicePrimaryCtxRelease")
