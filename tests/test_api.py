"""The kernel protocol types (attnrt.runtime.api): DataType, Node getters, tensor metadata and views,
workspaces, capture support, and the Kernel/KernelFactory protocols. No GPU needed."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from attnrt.runtime.api import (
    CaptureSupport,
    DataType,
    Kernel,
    KernelFactory,
    Node,
    TensorMetadata,
    TensorMut,
    TensorView,
    WorkspaceLifetime,
    WorkspaceRequirement,
    WorkspaceView,
)

# -- DataType ---------------------------------------------------------------------------------

# ONNX TensorProto.DataType codes, item sizes and numpy types.
ONNX = [
    ("FLOAT", 1, 4, np.float32),
    ("UINT8", 2, 1, np.uint8),
    ("INT8", 3, 1, np.int8),
    ("UINT16", 4, 2, np.uint16),
    ("INT16", 5, 2, np.int16),
    ("INT32", 6, 4, np.int32),
    ("INT64", 7, 8, np.int64),
    ("BOOL", 9, 1, np.bool_),
    ("FLOAT16", 10, 2, np.float16),
    ("DOUBLE", 11, 8, np.float64),
    ("UINT32", 12, 4, np.uint32),
    ("UINT64", 13, 8, np.uint64),
    ("BFLOAT16", 16, 2, ml_dtypes.bfloat16),
]


@pytest.mark.parametrize("name,code,itemsize,np_type", ONNX)
def test_datatype_codes_itemsize_numpy(name, code, itemsize, np_type):
    dt = DataType[name]
    assert int(dt) == code
    assert DataType(code) is dt
    assert dt.itemsize == itemsize
    assert dt.numpy == np.dtype(np_type)
    assert DataType.from_numpy(np_type) is dt
    assert DataType.from_numpy(np.dtype(np_type)) is dt
    assert DataType.from_numpy(np.zeros(2, dtype=np_type).dtype) is dt


def test_datatype_from_numpy_strings_and_refusals():
    assert DataType.from_numpy("float32") is DataType.FLOAT
    assert DataType.from_numpy("bfloat16") is DataType.BFLOAT16  # ml_dtypes registers the name
    for bad in (np.complex64, np.dtype("U3"), np.dtype(">f4"), object):
        with pytest.raises(TypeError):
            DataType.from_numpy(bad)


def test_bfloat16_round_trips_through_ml_dtypes():
    x = np.array([1.0, -2.5, 3.0e38, 1.0e-3], dtype=np.float32)
    b = x.astype(DataType.BFLOAT16.numpy)
    assert b.dtype == ml_dtypes.bfloat16 and b.itemsize == 2
    assert np.allclose(b.astype(np.float32), x, rtol=1e-2)


def test_datatype_unknown_code():
    with pytest.raises(ValueError):
        DataType(8)  # STRING is not a device type here


# -- Node ----------------------------------------------------------------------------------

def _node(**attrs) -> Node:
    return Node("Attention", "pkg.nxrt", attrs, ["q", "k", None, ""], ["y", None])


def test_node_defaults_and_presence():
    n = Node("X")
    assert n.domain == "" and n.attributes == {} and n.inputs == [] and n.outputs == []
    # Mutable defaults are not shared between nodes.
    n.attributes["a"] = 1
    assert Node("X").attributes == {}
    m = _node()
    assert [m.input_present(i) for i in range(5)] == [True, True, False, False, False]
    assert [m.output_present(i) for i in range(3)] == [True, False, False]
    assert not m.has("scale")


def test_node_attr_int():
    n = _node(num_heads=8, np_int=np.int64(3), flag=True, npflag=np.bool_(True), f=1.0, s="8")
    assert n.attr_int("num_heads") == 8
    v = n.attr_int("np_int")
    assert v == 3 and type(v) is int
    assert n.attr_int("missing", 5) == 5
    assert n.attr_int("missing", None) is None
    with pytest.raises(ValueError, match="missing"):
        n.attr_int("missing")
    for bad in ("flag", "npflag", "f", "s"):  # bools are not ints; floats/strings are refused
        with pytest.raises(TypeError, match=bad):
            n.attr_int(bad)
    # A wrong type is refused even when a default is given.
    with pytest.raises(TypeError):
        n.attr_int("flag", 0)


def test_node_attr_float():
    n = _node(scale=0.125, i=2, f32=np.float32(0.5), b=False, s="x")
    assert n.attr_float("scale") == 0.125
    v = n.attr_float("i")
    assert v == 2.0 and type(v) is float
    assert type(n.attr_float("f32")) is float
    assert n.attr_float("nope", 1.5) == 1.5
    with pytest.raises(ValueError):
        n.attr_float("nope")
    for bad in ("b", "s"):
        with pytest.raises(TypeError):
            n.attr_float(bad)


def test_node_attr_str():
    n = _node(layout="BSHD", raw=b"LATENT", num=3)
    assert n.attr_str("layout") == "BSHD"
    assert n.attr_str("raw") == "LATENT"
    assert n.attr_str("nope", "default") == "default"
    with pytest.raises(ValueError):
        n.attr_str("nope")
    with pytest.raises(TypeError):
        n.attr_str("num")


def test_node_attr_ints_and_floats():
    n = _node(axes=[0, np.int32(2)], t=(1, 2), mixed=[1, True], fl=[1.0, 2], empty=[], strs=["a"],
              scalar=3)
    axes = n.attr_ints("axes")
    assert axes == [0, 2] and all(type(a) is int for a in axes)
    assert n.attr_ints("t") == [1, 2]
    assert n.attr_ints("empty") == []
    assert n.attr_ints("nope", [7]) == [7]
    with pytest.raises(ValueError):
        n.attr_ints("nope")
    for bad in ("mixed", "fl", "strs", "scalar"):  # a bool inside a list is still refused
        with pytest.raises(TypeError):
            n.attr_ints(bad)
    fl = n.attr_floats("fl")
    assert fl == [1.0, 2.0] and all(type(x) is float for x in fl)
    assert n.attr_floats("empty") == []
    with pytest.raises(TypeError):
        n.attr_floats("mixed")
    with pytest.raises(TypeError):
        n.attr_floats("strs")
    with pytest.raises(ValueError):
        n.attr_floats("nope")


def test_node_error_names_the_op_and_attribute():
    n = _node(scale="big")
    with pytest.raises(TypeError) as info:
        n.attr_float("scale")
    assert "pkg.nxrt::Attention" in str(info.value) and "scale" in str(info.value)
    with pytest.raises(ValueError) as info:
        n.attr_int("num_heads")
    assert "pkg.nxrt::Attention" in str(info.value) and "num_heads" in str(info.value)


# -- TensorMetadata ----------------------------------------------------------------------------

def test_metadata_basics():
    m = TensorMetadata(DataType.FLOAT16, [2, 3, 5])
    assert m.shape == (2, 3, 5) and isinstance(m.shape, tuple)
    assert m.rank == 3 and m.numel == 30 and m.nbytes == 60
    assert m.strides is None and m.is_contiguous
    assert m.element_strides == (15, 5, 1)
    assert TensorMetadata(6, (4,)).dtype is DataType.INT32  # plain codes are accepted


def test_metadata_scalar_and_empty():
    s = TensorMetadata(DataType.FLOAT, ())
    assert s.numel == 1 and s.nbytes == 4 and s.rank == 0 and s.element_strides == ()
    e = TensorMetadata(DataType.BFLOAT16, (3, 0, 7))
    assert e.numel == 0 and e.nbytes == 0 and e.is_contiguous


def test_metadata_contiguous_strides_are_normalised():
    a = TensorMetadata(DataType.FLOAT, (2, 3, 4), (12, 4, 1))
    assert a.strides is None
    assert a == TensorMetadata(DataType.FLOAT, (2, 3, 4))


@pytest.mark.parametrize("shape,strides,contig", [
    ((2, 3, 4), (1, 2, 6), False),      # Fortran order
    ((2, 3, 4), (24, 4, 1), False),     # padded rows
    ((2, 3), (3, 2), False),
    ((2, 1, 4), (4, 99, 1), True),      # size-1 dims may carry any stride
    ((1, 5), (0, 1), True),
    ((1, 1), (7, 3), True),
    ((3, 1), (1, 1), True),
    ((4, 1, 1), (1, 1, 1), True),
    ((4, 2), (2, 0), False),            # broadcast (stride 0) is not contiguous
])
def test_metadata_contiguity(shape, strides, contig):
    m = TensorMetadata(DataType.FLOAT, shape, strides)
    assert m.is_contiguous is contig
    assert m.element_strides == (tuple(strides) if m.strides is not None
                                 else TensorMetadata(DataType.FLOAT, shape).element_strides)
    assert m.numel == int(np.prod(shape))


def test_metadata_validation():
    with pytest.raises(ValueError):
        TensorMetadata(DataType.FLOAT, (2, -1))
    with pytest.raises(ValueError):
        TensorMetadata(DataType.FLOAT, (2, 3), (1,))
    with pytest.raises(ValueError):
        TensorMetadata(99, (2,))  # not a DataType code


def test_metadata_is_frozen_and_hashable():
    m = TensorMetadata(DataType.FLOAT, (2, 3))
    with pytest.raises(AttributeError):
        m.shape = (3, 2)  # type: ignore[misc]
    assert hash(m) == hash(TensorMetadata(DataType.FLOAT, [2, 3]))


# -- TensorView / TensorMut ------------------------------------------------------------------

def test_view_basics():
    v = TensorView(0x1000, DataType.FLOAT, [2, 3])
    assert v.shape == (2, 3) and v.rank == 2 and v.numel == 6 and v.nbytes == 24
    assert not v.absent and v.is_contiguous and v.element_strides == (3, 1)
    assert v.meta == TensorMetadata(DataType.FLOAT, (2, 3))
    s = TensorView(0x1000, DataType.FLOAT16, (4, 3), (1, 4))
    assert s.strides == (1, 4) and not s.is_contiguous and s.element_strides == (1, 4)
    assert s.meta.strides == (1, 4)
    c = TensorView(0x1000, DataType.FLOAT16, (4, 3), (3, 1))
    assert c.is_contiguous and c.meta.strides is None


def test_view_absent_slot():
    a = TensorView.absent_slot()
    assert a.absent and a.ptr == 0 and a.shape == () and a.dtype is DataType.FLOAT
    b = TensorView.absent_slot(DataType.INT64)
    assert b.absent and b.dtype is DataType.INT64
    m = TensorMut.absent_slot(DataType.FLOAT16)
    assert isinstance(m, TensorMut) and m.absent


def test_view_validation():
    with pytest.raises(ValueError):
        TensorView(0, DataType.FLOAT, (2, 3))  # present, non-empty, null pointer
    empty = TensorView(0, DataType.FLOAT, (0, 3))  # an empty tensor may have a null pointer
    assert empty.numel == 0 and empty.nbytes == 0
    with pytest.raises(ValueError):
        TensorView(0x1000, DataType.FLOAT, (2, 3), (3,))
    with pytest.raises(ValueError):
        TensorView(0x1000, 1234, (2,))


def test_view_refuses_negative_dimensions():
    # TensorMetadata refuses negative dims; a view must not be a way around that
    # (kernels size their launches and bounds from view.shape / view.numel). Note that
    # (-2, -3) even has a plausible numel of 6.
    for shape in [(-2, 3), (-2, -3)]:
        with pytest.raises(ValueError):
            TensorView(0x1000, DataType.FLOAT, shape)


def test_view_owner_is_not_compared_and_mut_is_a_view():
    a = TensorView(0x1000, DataType.FLOAT, (2,), owner=object())
    b = TensorView(0x1000, DataType.FLOAT, (2,), owner=object())
    assert a == b
    m = TensorMut(0x1000, DataType.FLOAT, (2,))
    assert isinstance(m, TensorView)
    assert m.nbytes == 8


def test_view_from_host_array_is_refused():
    # cuda.core's StridedMemoryView works without a GPU; host memory is not a device view.
    with pytest.raises(ValueError, match="device-accessible"):
        TensorView.from_array(np.zeros((2, 3), dtype=np.float32))


# -- workspaces and capture support -----------------------------------------------------------

def test_workspace_requirement():
    r = WorkspaceRequirement(1000)
    assert r.nbytes == 1000 and r.alignment == 256 and r.lifetime is WorkspaceLifetime.TRANSIENT
    assert not r.is_none
    assert WorkspaceRequirement.NONE.is_none and WorkspaceRequirement.NONE.nbytes == 0
    p = WorkspaceRequirement(0, 1, WorkspaceLifetime.PERSISTENT)
    assert p.is_none and p.lifetime is WorkspaceLifetime.PERSISTENT
    for align in (1, 2, 128, 4096):
        assert WorkspaceRequirement(8, align).alignment == align


@pytest.mark.parametrize("nbytes,align", [(-1, 256), (8, 0), (8, 3), (8, 96), (8, -256)])
def test_workspace_requirement_validation(nbytes, align):
    with pytest.raises(ValueError):
        WorkspaceRequirement(nbytes, align)


def test_workspace_view_and_capture_support():
    w = WorkspaceView(0x2000, 512)
    assert (w.ptr, w.nbytes) == (0x2000, 512)
    yes = CaptureSupport.yes()
    assert yes and yes.supported and yes.reason == ""
    no = CaptureSupport.no("host-side scheduling reads the sequence lengths")
    assert not no and not no.supported and "sequence lengths" in no.reason


# -- protocols --------------------------------------------------------------------------------

class _GoodKernel:
    def workspace_requirement(self, inputs):
        return WorkspaceRequirement.NONE

    def execute(self, inputs, outputs, workspace=None):
        return None

    def capture_support(self):
        return CaptureSupport.yes()

    def supports_strided_input(self, index):
        return False


class _GoodFactory:
    def unsupported_reason(self, node, shapes, dtypes):
        return None

    def create(self, node, input_shapes):
        return _GoodKernel()


class _Incomplete:
    def execute(self, inputs, outputs, workspace=None):
        return None


def test_protocols_are_runtime_checkable():
    assert isinstance(_GoodKernel(), Kernel)
    assert isinstance(_GoodFactory(), KernelFactory)
    assert not isinstance(_Incomplete(), Kernel)
    assert not isinstance(_GoodKernel(), KernelFactory)
