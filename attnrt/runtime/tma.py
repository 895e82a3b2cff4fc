"""TMA descriptors (``CUtensorMap``) for kernels that copy tiles with the Tensor Memory
Accelerator (compute capability 9.0+)."""

from __future__ import annotations

from typing import Any

from . import _check
from .api import DataType

__all__ = ["tensor_map_2d"]


def tensor_map_2d(address: int, dtype: Any, shape: tuple[int, int], row_bytes: int,
                  box: tuple[int, int], l2_promotion: int = 256) -> bytes:
    """A TMA descriptor for a kernel's ``__grid_constant__`` parameter.

    Describes the row-major 16-bit tensor ``shape = (rows, inner)`` at device ``address``
    (16-byte aligned; rows ``row_bytes`` apart, a multiple of 16), copied in boxes of
    ``box = (inner elements, rows)`` with the 128-byte swizzle; elements outside the tensor
    read as zero. Pass the returned bytes as the launch argument (``CudaRuntime.launch``
    takes ``bytes`` of the parameter's size); encoding needs the driver, not a context.

    Parameters
    ----------
    address
        Device pointer of element (0, 0).
    dtype
        ``DataType.BFLOAT16`` or ``DataType.FLOAT16``.
    shape
        ``(rows, inner)``.
    row_bytes
        Bytes from one row to the next.
    box
        ``(inner elements, rows)`` of one copy.
    l2_promotion
        Bytes an L2 miss of a copy fetches (0: no promotion, 64, 128 or 256).

    Returns
    -------
    bytes
        The 128-byte descriptor.

    Raises
    ------
    ValueError
        ``dtype`` is not a 16-bit float type, or ``l2_promotion`` is not 0, 64, 128 or 256.
    CudaError
        The driver refused the description (alignment, sizes, compute capability < 9.0).
    """
    if dtype not in (DataType.BFLOAT16, DataType.FLOAT16):
        raise ValueError(f"tensor_map_2d: a 16-bit float dtype, got {dtype!r}")
    if l2_promotion not in (0, 64, 128, 256):
        raise ValueError(f"tensor_map_2d: l2_promotion must be 0, 64, 128 or 256, "
                         f"got {l2_promotion!r}")
    return _check.tensor_map_2d(address, dtype == DataType.BFLOAT16, shape[1], shape[0],
                                row_bytes, box, l2_promotion)
