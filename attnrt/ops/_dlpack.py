"""Tensor interchange for the functional API: which library a tensor comes from, its device
and current stream, kernel-facing views of it, and outputs allocated like it.

torch tensors take a fast path (pointer, shape and strides read directly); CuPy arrays are
read through ``__cuda_array_interface__``; anything else (JAX, numba, ...) goes through
:meth:`TensorView.from_array` (DLPack or the CUDA array interface), told which stream the
op will run on so that the producer can order itself before it. Nothing here imports
torch or CuPy unless the caller's tensors already come from them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnrt.runtime.api import DataType, TensorMetadata, TensorMut, TensorView, WorkspaceView
from attnrt.runtime.errors import KernelError
from attnrt.runtime.tensors import DeviceArray

__all__ = ["library_of", "device_of", "current_stream", "as_view", "as_mut", "as_meta",
           "empty", "workspace_of", "torch_dtype"]

TORCH, CUPY, OURS, OTHER = "torch", "cupy", "attnrt", "other"
_TORCH_TYPES: dict[Any, DataType] = {}


def library_of(obj: Any) -> str:
    """``"torch"``, ``"cupy"``, ``"attnrt"`` (our views and arrays) or ``"other"``."""
    if isinstance(obj, (TensorView, DeviceArray)):
        return OURS
    root = type(obj).__module__.partition(".")[0]
    return root if root in (TORCH, CUPY) else OTHER


def _torch_types() -> dict[Any, DataType]:
    if not _TORCH_TYPES:
        torch = sys.modules["torch"]
        _TORCH_TYPES.update({
            torch.float32: DataType.FLOAT, torch.float16: DataType.FLOAT16,
            torch.bfloat16: DataType.BFLOAT16, torch.float64: DataType.DOUBLE,
            torch.int32: DataType.INT32, torch.int64: DataType.INT64, torch.int16: DataType.INT16,
            torch.int8: DataType.INT8, torch.uint8: DataType.UINT8, torch.bool: DataType.BOOL})
    return _TORCH_TYPES


def torch_dtype(dtype: DataType) -> Any:
    """The torch dtype of a :class:`DataType` (torch must be imported)."""
    for k, v in _torch_types().items():
        if v == dtype:
            return k
    raise TypeError(f"torch has no dtype for {DataType(dtype).name}")


def device_of(obj: Any) -> int | None:
    """The CUDA device ordinal of a tensor (``None`` for our views: the runtime decides).

    Raises
    ------
    KernelError
        ``obj`` is not a tensor (no ``__dlpack__`` / ``__cuda_array_interface__``), or it
        lives in host memory (a numpy array, a CPU torch tensor).
    """
    lib = library_of(obj)
    if lib == OURS:
        return None
    if lib == TORCH:
        if obj.device.type != "cuda":
            raise KernelError(f"the tensor arguments must be CUDA tensors; got a torch tensor on "
                              f"{obj.device} (move it with .cuda())")
        return int(obj.device.index or 0)
    if lib == CUPY:
        return int(obj.device.id)
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is not None:
        kind, ordinal = dev()
        if int(kind) not in (2, 3, 13):  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
            where = ("host memory (e.g. a numpy array)" if int(kind) == 1
                     else f"DLPack device type {int(kind)}")
            raise KernelError(f"the tensor arguments must be in CUDA device memory; got a "
                              f"{type(obj).__name__} in {where}; pass a torch/CuPy/JAX CUDA array")
        return int(ordinal)
    if not hasattr(obj, "__cuda_array_interface__"):
        raise KernelError(f"the tensor arguments must be CUDA tensors (torch, CuPy, JAX, or any "
                          f"object with __dlpack__ or __cuda_array_interface__); got a "
                          f"{type(obj).__name__}")
    return 0


def current_stream(lib: str, device: int) -> int | None:
    """The library's current stream on ``device`` (``None``: it has none, use the runtime's)."""
    if lib == TORCH:
        torch = sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return int(raw(device)) if raw is not None else int(torch.cuda.current_stream(device).cuda_stream)
    if lib == CUPY:
        return int(sys.modules["cupy"].cuda.get_current_stream().ptr)
    return None


def _from_cai(obj: Any, cls: type[TensorView]) -> TensorView:
    ci = obj.__cuda_array_interface__
    if ci.get("mask") is not None:
        raise ValueError("masked CUDA arrays are not supported")
    dtype = DataType.from_numpy(np.dtype(ci["typestr"]))
    strides = ci.get("strides")
    if strides is not None:
        if any(s % dtype.itemsize for s in strides):
            raise ValueError(f"byte strides {strides} are not multiples of the item size")
        strides = tuple(s // dtype.itemsize for s in strides)
    return cls(int(ci["data"][0]), dtype, tuple(ci["shape"]), strides, owner=obj)


def _view(obj: Any, lib: str, stream_ptr: int, cls: type[TensorView]) -> TensorView:
    if isinstance(obj, TensorView):
        return obj if isinstance(obj, cls) else cls(obj.ptr, obj.dtype, obj.shape, obj.strides,
                                                    owner=obj.owner)
    if isinstance(obj, DeviceArray):
        return obj.mut() if cls is TensorMut else obj.view()
    if lib == TORCH:
        try:
            dtype = _torch_types()[obj.dtype]
        except KeyError:
            raise TypeError(f"unsupported torch dtype {obj.dtype}") from None
        if not obj.is_cuda:
            raise ValueError(f"expected a CUDA tensor, got one on {obj.device}")
        return cls(obj.data_ptr(), dtype, tuple(obj.shape), tuple(obj.stride()), owner=obj)
    if lib == CUPY:
        return _from_cai(obj, cls)
    try:
        v = TensorView.from_array(obj, stream_ptr=stream_ptr)
    except BufferError as exc:
        raise TypeError(f"{type(obj).__name__} is not a device tensor (no __dlpack__ or "
                        f"__cuda_array_interface__): {exc}") from None
    return v if cls is TensorView else cls(v.ptr, v.dtype, v.shape, v.strides, owner=v.owner)


def as_view(obj: Any, lib: str = "", stream_ptr: int = -1) -> TensorView:
    """A read-only view of ``obj`` (``None``: an absent slot).

    ``stream_ptr`` is the stream the op will run on, for producers that order themselves
    through DLPack (``-1``: the tensor is ready on that stream already).

    Raises
    ------
    TypeError
        An unsupported dtype or object.
    ValueError
        Host memory.
    """
    if obj is None:
        return TensorView.absent_slot()
    return _view(obj, lib or library_of(obj), stream_ptr, TensorView)


def as_mut(obj: Any, lib: str = "", stream_ptr: int = -1) -> TensorMut:
    """A writable view of ``obj`` (``None``: an absent slot); see :func:`as_view`."""
    if obj is None:
        return TensorMut.absent_slot()
    return _view(obj, lib or library_of(obj), stream_ptr, TensorMut)  # type: ignore[return-value]


def as_meta(obj: Any, dtype: DataType | None = None) -> TensorMetadata | None:
    """Planning metadata of a tensor, view, metadata, or a shape (with ``dtype``).

    Raises
    ------
    TypeError
        A bare shape without a dtype, or an object that is none of these.
    """
    if obj is None:
        return None
    if isinstance(obj, TensorMetadata):
        return obj
    if isinstance(obj, TensorView):
        return None if obj.absent else obj.meta
    if isinstance(obj, (tuple, list)) and all(isinstance(d, (int, np.integer)) for d in obj):
        if dtype is None:
            raise TypeError(f"shape {tuple(obj)} needs a dtype (pass dtype=...)")
        return TensorMetadata(DataType(dtype), tuple(obj))
    return as_view(obj).meta


def empty(lib: str, like: Any, shape: Sequence[int], dtype: DataType, rt: Any) -> Any:
    """An uninitialised output of the inputs' library: a torch tensor for torch inputs (on
    the same device, from torch's caching allocator), else a :class:`DeviceArray` that is
    freed when collected."""
    if lib == TORCH:
        torch = sys.modules["torch"]
        return torch.empty(tuple(shape), dtype=torch_dtype(dtype), device=like.device)
    return DeviceArray(rt, shape, dtype, free_on_del=True)


def workspace_of(obj: Any) -> WorkspaceView | None:
    """A :class:`WorkspaceView` of a workspace argument: ``None``, a view, or a tensor.

    Raises
    ------
    TypeError
        Anything else.
    """
    if obj is None or isinstance(obj, WorkspaceView):
        return obj
    if isinstance(obj, DeviceArray):
        return WorkspaceView(obj.ptr, obj.nbytes)
    try:
        v = as_view(obj)
    except (TypeError, ValueError, AttributeError) as exc:
        raise TypeError(f"workspace must be a WorkspaceView or a device tensor, got "
                        f"{type(obj).__name__}") from exc
    return WorkspaceView(v.ptr, v.nbytes)
