"""DeviceArray: a small owned device buffer with a shape and dtype (tests, demos, executors)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .api import DataType, TensorMut, TensorView

if TYPE_CHECKING:
    from .runtime import CudaRuntime

__all__ = ["DeviceArray"]


class DeviceArray:
    """Device memory from ``rt.alloc_raw`` with a shape and a dtype.

    ``view()``/``mut()`` give the kernel-facing :class:`TensorView`/:class:`TensorMut`;
    ``numpy()`` copies back; ``free()`` (or ``with``) returns the memory to the ledger.
    """

    def __init__(self, rt: CudaRuntime, shape: Sequence[int], dtype: DataType | Any) -> None:
        self.rt = rt
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype if isinstance(dtype, DataType) else DataType.from_numpy(dtype)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
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

    def __enter__(self) -> DeviceArray:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        return f"DeviceArray({self.shape}, {self.dtype.name}, ptr=0x{self.ptr:x})"
