"""DLPack export: a ``dltensor`` capsule over a device pointer (DLPack 0.8 ABI, ctypes only).

The capsule's ``DLManagedTensor`` keeps the exporting object alive until the consumer calls
its deleter (or, if no consumer took it, until the capsule itself is collected).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from .api import DataType

__all__ = ["to_capsule", "KDL_CUDA"]

KDL_CUDA = 2  # DLDeviceType kDLCUDA

# DLDataTypeCode: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6.
_CODES: dict[DataType, int] = {
    DataType.FLOAT: 2, DataType.FLOAT16: 2, DataType.DOUBLE: 2, DataType.BFLOAT16: 4,
    DataType.INT8: 0, DataType.INT16: 0, DataType.INT32: 0, DataType.INT64: 0,
    DataType.UINT8: 1, DataType.UINT16: 1, DataType.UINT32: 1, DataType.UINT64: 1,
    DataType.BOOL: 6,
}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]

# address of a live DLManagedTensor -> (struct, shape array, owner): what keeps them alive
_LIVE: dict[int, tuple[Any, Any, Any]] = {}


@_DELETER
def _delete(managed: Any) -> None:
    _LIVE.pop(ctypes.addressof(managed.contents), None)


_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# A private handle on the C API: prototypes set on the shared ctypes.pythonapi by other code
# must not change how these are called.
_api = ctypes.PyDLL("python api", handle=ctypes.pythonapi._handle)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_NAME = b"dltensor"


@_CAPSULE_DESTRUCTOR
def _capsule_gone(capsule: int) -> None:
    # A consumer renames the capsule to "used_dltensor" and owns the deleter; an unconsumed
    # one still holds our reference.
    if _api.PyCapsule_IsValid(capsule, _NAME):
        _LIVE.pop(_api.PyCapsule_GetPointer(capsule, _NAME), None)


def to_capsule(ptr: int, shape: Sequence[int], dtype: DataType, device_id: int, owner: Any) -> Any:
    """A ``dltensor`` capsule for a C-contiguous CUDA tensor at ``ptr``.

    Raises
    ------
    BufferError
        ``dtype`` has no DLPack type code.
    """
    dtype = DataType(dtype)
    if dtype not in _CODES:
        raise BufferError(f"no DLPack type for {dtype.name}")
    nd = len(shape)
    shape_arr = (ctypes.c_int64 * max(nd, 1))(*shape)
    m = _DLManagedTensor()
    m.dl_tensor.data = ptr or None
    m.dl_tensor.device = _DLDevice(KDL_CUDA, int(device_id))
    m.dl_tensor.ndim = nd
    m.dl_tensor.dtype = _DLDataType(_CODES[dtype], dtype.itemsize * 8, 1)
    m.dl_tensor.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    m.dl_tensor.strides = None  # NULL: compact row-major
    m.dl_tensor.byte_offset = 0
    m.manager_ctx = None
    m.deleter = _delete
    addr = ctypes.addressof(m)
    _LIVE[addr] = (m, shape_arr, owner)
    return _api.PyCapsule_New(addr, _NAME, _capsule_gone)
