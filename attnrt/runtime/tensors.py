"""DeviceArray: a small owned device buffer with a shape and dtype (tests, demos, executors).

It exports ``__cuda_array_interface__`` (v3) and ``__dlpack__``, so torch, CuPy and JAX can
view it without a copy (``torch.from_dlpack(arr)``, ``cupy.asarray(arr)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _dlpack
from .api import DataType, TensorMut, TensorView

if TYPE_CHECKING:
    from .runtime import CudaRuntime

__all__ = ["DeviceArray"]


class DeviceArray:
    """Device memory from ``rt.alloc_raw`` with a shape and a dtype.

    ``view()``/``mut()`` give the kernel-facing :class:`TensorView`/:class:`TensorMut`;
    ``numpy()`` copies back; ``free()`` (or ``with``) returns the memory to the ledger.

    Parameters
    ----------
    rt
        The runtime that allocates (and frees) the memory.
    shape, dtype
        C-contiguous shape; a :class:`DataType` or anything ``np.dtype`` takes.
    free_on_del
        Free the memory when the array is garbage-collected (the functional API's outputs);
        by default only :meth:`free` does, so the ledger shows a forgotten array.

    Attributes
    ----------
    stream_ptr : int or None
        The stream whose work last wrote the array (``None``: ready as soon as allocated).
        ``__dlpack__(stream=s)`` and the interface's ``stream`` order consumers after it.
    """

    def __init__(self, rt: CudaRuntime, shape: Sequence[int], dtype: DataType | Any, *,
                 free_on_del: bool = False) -> None:
        self.rt = rt
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype if isinstance(dtype, DataType) else DataType.from_numpy(dtype)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self.ptr = 0
        self.stream_ptr: int | None = None
        self.free_on_del = free_on_del
        self.ptr = rt.alloc_raw(self.nbytes)

    @classmethod
    def from_numpy(cls, rt: CudaRuntime, arr: np.ndarray) -> DeviceArray:
        a = np.ascontiguousarray(arr)
        out = cls(rt, a.shape, a.dtype)
        out.copy_from(a)
        return out

    def copy_from(self, arr: np.ndarray) -> None:
        a = np.ascontiguousarray(arr, dtype=self.dtype.numpy)
        if a.shape != self.shape:
            raise ValueError(f"copy_from: shape {a.shape} != {self.shape}")
        self.rt.htod(self.ptr, a)

    def fill_bytes(self, value: int) -> None:
        """Set every byte to ``value`` (0xFF poisons floats as NaN)."""
        self.rt.memset(self.ptr, value, self.nbytes)

    def numpy(self) -> np.ndarray:
        host = np.empty(self.shape, dtype=self.dtype.numpy)
        return self.rt.dtoh(host, self.ptr)

    def view(self) -> TensorView:
        return TensorView(self.ptr, self.dtype, self.shape)

    def mut(self) -> TensorMut:
        return TensorMut(self.ptr, self.dtype, self.shape)

    def free(self) -> None:
        if self.ptr:
            self.rt.free_raw(self.ptr)
            self.ptr = 0

    def __del__(self) -> None:
        if getattr(self, "free_on_del", False) and self.ptr:
            try:
                self.free()
            except Exception:  # closed runtime or capturing: close() reclaims it, with a warning
                pass

    # -- interchange ----------------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA array interface v3 (``AttributeError`` for bfloat16, which it cannot name)."""
        if self.dtype == DataType.BFLOAT16:
            raise AttributeError("__cuda_array_interface__ has no bfloat16 type; use __dlpack__")
        # The consumer synchronizes on "stream"; 0 is not allowed there (1 is the legacy stream).
        stream = None if self.stream_ptr is None else (self.stream_ptr or 1)
        return {"shape": self.shape, "typestr": self.dtype.numpy.str, "strides": None,
                "data": (self.ptr, False), "version": 3, "stream": stream}

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(kDLCUDA, device ordinal)``."""
        return (_dlpack.KDL_CUDA, int(self.rt.capabilities.ordinal))

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        """A ``dltensor`` capsule; ``stream`` (a consumer stream handle) is made to wait for
        :attr:`stream_ptr` without blocking the host.

        Raises
        ------
        BufferError
            ``copy=True`` or another ``dl_device`` was requested (neither is supported).
        """
        if copy or (dl_device is not None and tuple(dl_device) != self.__dlpack_device__()):
            raise BufferError("DeviceArray exports its own device memory only (no copies)")
        if stream is not None and stream != -1 and self.stream_ptr is not None:
            from .streams import wait_stream
            self.rt._live()  # the event belongs to the current context: make it ours
            wait_stream(int(stream), self.stream_ptr)
        return _dlpack.to_capsule(self.ptr, self.shape, self.dtype,
                                  int(self.rt.capabilities.ordinal), self)

    def __enter__(self) -> DeviceArray:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        return f"DeviceArray({self.shape}, {self.dtype.name}, ptr=0x{self.ptr:x})"
