"""The kernel protocol: data types, nodes, tensor views, workspaces, capture support.

Kernels see only these types; executors build them. Nothing here touches the device.
"""

from __future__ import annotations

import enum
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import ml_dtypes
import numpy as np

__all__ = [
    "DataType", "Node", "TensorMetadata", "TensorView", "TensorMut", "WorkspaceLifetime",
    "WorkspaceRequirement", "WorkspaceView", "CaptureSupport", "Kernel", "KernelFactory",
]


class DataType(enum.IntEnum):
    """ONNX ``TensorProto.DataType`` codes."""

    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    BFLOAT16 = 16

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype (``ml_dtypes.bfloat16`` for BFLOAT16)."""
        return np.dtype(_TO_NUMPY[self])

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @classmethod
    def from_numpy(cls, dtype: Any) -> DataType:
        """The DataType of a numpy dtype (or anything ``np.dtype`` accepts)."""
        dt = np.dtype(dtype)
        for k, v in _TO_NUMPY.items():
            if np.dtype(v) == dt:
                return k
        raise TypeError(f"no ONNX data type for numpy dtype {dt}")


_TO_NUMPY: dict[DataType, Any] = {
    DataType.FLOAT: np.float32, DataType.UINT8: np.uint8, DataType.INT8: np.int8,
    DataType.UINT16: np.uint16, DataType.INT16: np.int16, DataType.INT32: np.int32,
    DataType.INT64: np.int64, DataType.BOOL: np.bool_, DataType.FLOAT16: np.float16,
    DataType.DOUBLE: np.float64, DataType.UINT32: np.uint32, DataType.UINT64: np.uint64,
    DataType.BFLOAT16: ml_dtypes.bfloat16,
}

_MISSING = object()


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_float(v: Any) -> bool:
    return _is_int(v) or isinstance(v, (float, np.floating))


@dataclass
class Node:
    """One graph node: ``op_type`` in ``domain`` with plain-Python ``attributes``.

    ``inputs``/``outputs`` are names; ``None`` marks an absent optional slot.
    """

    op_type: str
    domain: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    inputs: list[str | None] = field(default_factory=list)
    outputs: list[str | None] = field(default_factory=list)

    def has(self, name: str) -> bool:
        return name in self.attributes

    @classmethod
    def from_onnx(cls, proto: Any) -> Node:
        """The node of an ONNX ``NodeProto`` (needs the optional ``onnx`` package).

        Attribute values become plain Python (str, int, float, lists; tensors as numpy
        arrays); empty input/output names become ``None`` (absent optional slots).

        Raises
        ------
        ImportError
            ``onnx`` is not installed.
        TypeError
            ``proto`` is not a ``NodeProto``.
        """
        from ._onnx import node_from_onnx
        return node_from_onnx(cls, proto)

    def to_onnx(self, name: str = "") -> Any:
        """This node as an ONNX ``NodeProto`` (``None`` slots as empty names).

        Raises
        ------
        ImportError
            ``onnx`` is not installed.
        """
        from ._onnx import node_to_onnx
        return node_to_onnx(self, name)

    def _typed(self, name: str, default: Any, kind: str, ok: Any) -> Any:
        if name not in self.attributes:
            if default is _MISSING:
                raise ValueError(f"{self.domain}::{self.op_type}: required attribute {name!r} "
                                 f"({kind}) is missing")
            return default
        v = self.attributes[name]
        if not ok(v):
            raise TypeError(f"{self.domain}::{self.op_type}: attribute {name!r} must be {kind}, got {v!r}")
        return v

    def attr_int(self, name: str, default: Any = _MISSING) -> int:
        """An integer attribute (bools and floats are refused)."""
        v = self._typed(name, default, "an int", _is_int)
        return v if v is default else int(v)

    def attr_float(self, name: str, default: Any = _MISSING) -> float:
        """A float attribute (ints are accepted and converted)."""
        v = self._typed(name, default, "a float", _is_float)
        return v if v is default else float(v)

    def attr_str(self, name: str, default: Any = _MISSING) -> str:
        v = self._typed(name, default, "a str", lambda x: isinstance(x, (str, bytes)))
        return v.decode() if isinstance(v, bytes) else v

    def attr_ints(self, name: str, default: Any = _MISSING) -> list[int]:
        v = self._typed(name, default, "a list of ints",
                        lambda x: isinstance(x, (list, tuple)) and all(map(_is_int, x)))
        return v if v is default else [int(x) for x in v]

    def attr_floats(self, name: str, default: Any = _MISSING) -> list[float]:
        v = self._typed(name, default, "a list of floats",
                        lambda x: isinstance(x, (list, tuple)) and all(map(_is_float, x)))
        return v if v is default else [float(x) for x in v]

    def input_present(self, index: int) -> bool:
        return index < len(self.inputs) and self.inputs[index] not in (None, "")

    def output_present(self, index: int) -> bool:
        return index < len(self.outputs) and self.outputs[index] not in (None, "")


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


class _Shaped:
    """Rank, element count, bytes and strides of anything with ``shape``, ``strides``, ``dtype``."""

    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    dtype: DataType

    def _normalize(self) -> None:
        """Coerce dtype, shape and strides (frozen dataclasses: set through object) and check
        that no dimension is negative and strides match the rank."""
        object.__setattr__(self, "dtype", DataType(self.dtype))
        # operator.index: numpy integers become Python ints (no int32 overflow later); a float
        # or bool dimension is a TypeError instead of being truncated.
        object.__setattr__(self, "shape", _ints(self.shape, "shape"))
        if any(d < 0 for d in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")
        if self.strides is not None:
            object.__setattr__(self, "strides", _ints(self.strides, "strides"))
            if len(self.strides) != len(self.shape):
                raise ValueError(f"strides {self.strides} do not match shape {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def element_strides(self) -> tuple[int, ...]:
        return self.strides if self.strides is not None else _contiguous_strides(self.shape)

    @property
    def is_contiguous(self) -> bool:
        if self.strides is None:
            return True
        # Size-1 dims may carry any stride.
        want = _contiguous_strides(self.shape)
        return all(d == 1 or s == w for d, s, w in zip(self.shape, self.strides, want))


def _ints(values: Any, what: str) -> tuple[int, ...]:
    out = []
    for v in values:
        if isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{what} {tuple(values)!r}: a bool is not a dimension")
        try:
            out.append(operator.index(v))
        except TypeError:
            raise TypeError(f"{what} {tuple(values)!r}: {v!r} is not an integer") from None
    return tuple(out)


@dataclass(frozen=True)
class TensorMetadata(_Shaped):
    """What workspace planning sees: dtype, shape, strides (elements)."""

    dtype: DataType
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None  # None: C-contiguous

    def __post_init__(self) -> None:
        self._normalize()
        if self.strides == _contiguous_strides(self.shape):
            object.__setattr__(self, "strides", None)  # planning sees one form of contiguous



@dataclass(frozen=True)
class TensorView(_Shaped):
    """A read-only device tensor: pointer, dtype, shape, strides (elements).

    An absent optional input is ``TensorView.absent_slot()`` (``absent`` is True, ptr 0).
    """

    ptr: int
    dtype: DataType
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None
    absent: bool = False
    owner: Any = field(default=None, repr=False, compare=False)  # keeps a wrapped object alive

    def __post_init__(self) -> None:
        self._normalize()
        if not self.absent and self.ptr == 0 and self.numel:
            raise ValueError("a present tensor needs a non-null pointer")

    @classmethod
    def absent_slot(cls, dtype: DataType = DataType.FLOAT) -> TensorView:
        return cls(0, dtype, (), None, absent=True)

    @classmethod
    def from_array(cls, obj: Any, stream_ptr: int | None = -1) -> TensorView:
        """Wrap any object with ``__dlpack__`` or ``__cuda_array_interface__`` (torch, CuPy, JAX).

        ``stream_ptr``: the consumer stream to order against the producer (``-1``: none).
        """
        from cuda.core.utils import StridedMemoryView

        v = StridedMemoryView.from_any_interface(obj, stream_ptr=stream_ptr)
        if not v.is_device_accessible:
            raise ValueError(f"{type(obj).__name__} is not device-accessible memory")
        strides = tuple(v.strides) if v.strides is not None else None
        return cls(int(v.ptr), _dtype_of_view(v), tuple(v.shape), strides, owner=(v, obj))

    @property
    def meta(self) -> TensorMetadata:
        return TensorMetadata(self.dtype, self.shape, self.strides)

class TensorMut(TensorView):
    """A writable device tensor (outputs)."""


def _dtype_of_view(v: Any) -> DataType:
    dt = v.dtype
    try:
        return DataType.from_numpy(dt)
    except TypeError:
        pass
    name = str(dt).lower()
    if "bfloat16" in name:
        return DataType.BFLOAT16
    raise TypeError(f"unsupported tensor dtype {dt}")


class WorkspaceLifetime(enum.Enum):
    """How long the workspace contents must live: one execute call, or across calls."""

    TRANSIENT = "transient"
    PERSISTENT = "persistent"


@dataclass(frozen=True)
class WorkspaceRequirement:
    """Bytes (and alignment) a kernel needs for one execute call."""

    nbytes: int
    alignment: int = 256
    lifetime: WorkspaceLifetime = WorkspaceLifetime.TRANSIENT

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            raise ValueError(f"workspace bytes must be >= 0, got {self.nbytes}")
        if self.alignment < 1 or self.alignment & (self.alignment - 1):
            raise ValueError(f"workspace alignment must be a power of two, got {self.alignment}")

    @property
    def is_none(self) -> bool:
        return self.nbytes == 0


WorkspaceRequirement.NONE = WorkspaceRequirement(0)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class WorkspaceView:
    """A slice of device memory a kernel may use as scratch."""

    ptr: int
    nbytes: int


@dataclass(frozen=True)
class CaptureSupport:
    """Whether a kernel may be captured now; ``reason`` says why not."""

    supported: bool
    reason: str = ""

    @classmethod
    def yes(cls) -> CaptureSupport:
        return cls(True)

    @classmethod
    def no(cls, reason: str) -> CaptureSupport:
        return cls(False, reason)

    def __bool__(self) -> bool:
        return self.supported


@runtime_checkable
class Kernel(Protocol):
    """One created kernel (bound to a runtime and a node)."""

    def workspace_requirement(self, inputs: Sequence[TensorMetadata | None]) -> WorkspaceRequirement:
        """Pure: allocates nothing and changes no state. ``None`` marks an absent input."""
        ...

    def execute(self, inputs: Sequence[TensorView], outputs: Sequence[TensorMut],
                workspace: WorkspaceView | None = None) -> None: ...

    def capture_support(self) -> CaptureSupport: ...

    def supports_strided_input(self, index: int) -> bool: ...


@runtime_checkable
class KernelFactory(Protocol):
    """Claims nodes and creates kernels."""

    def unsupported_reason(self, node: Node, shapes: Sequence[Sequence[int] | None],
                           dtypes: Sequence[DataType | None]) -> str | None:
        """Pure, no GPU: ``None`` when this factory takes the node, else why not."""
        ...

    def create(self, node: Node, input_shapes: Sequence[Sequence[int] | None]) -> Kernel: ...

