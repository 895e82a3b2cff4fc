"""Interop without a GPU: stream arguments, the per-stream launch configs, DeviceArray's DLPack
and CUDA-array-interface exports, ONNX nodes, and the lazy ``attnrt`` exports (layering)."""

from __future__ import annotations

import ast
import ctypes
import gc
import pathlib
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from cuda.bindings import driver

import attnrt
from attnrt.runtime import _dlpack, streams
from attnrt.runtime.api import DataType, Node
from attnrt.runtime.streams import Stream, StreamSwitch, stream_handle
from attnrt.runtime.tensors import DeviceArray
from tests._fakes import FakeRuntime

ROOT = pathlib.Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- stream arguments
class CudaStreamProtocol:
    def __init__(self, h):
        self.h = h

    def __cuda_stream__(self):
        return (0, self.h)


@pytest.mark.parametrize("obj, want", [
    (0, 0), (2, 2), (0x7F00_1234_5678, 0x7F00_1234_5678), (np.int64(77), 77),
    (CudaStreamProtocol(0xABC0), 0xABC0),
    (SimpleNamespace(__cuda_stream__=(0, 0x1230)), 0x1230),  # the attribute form
    (SimpleNamespace(cuda_stream=0xBEEF0), 0xBEEF0),  # torch.cuda.Stream
    (SimpleNamespace(ptr=0xCAFE0), 0xCAFE0),  # cupy.cuda.Stream
    (Stream(driver.CUstream(0x5150), owned=False), 0x5150),
    (driver.CUstream(0x4440), 0x4440),
])
def test_stream_handle_accepts(obj, want):
    assert stream_handle(obj) == want


@pytest.mark.parametrize("obj, exc", [
    (None, TypeError), (True, TypeError), (1.5, TypeError), ("0x10", TypeError), (-1, ValueError),
    (SimpleNamespace(cuda_stream=-5), ValueError), (SimpleNamespace(ptr="x"), TypeError),
    (SimpleNamespace(__cuda_stream__=lambda: 7), TypeError),
    (CudaStreamProtocol(None), TypeError), (object(), TypeError),
])
def test_stream_handle_refuses(obj, exc):
    with pytest.raises(exc):
        stream_handle(obj)


def test_stream_switch_swaps_launch_configs_in_place(monkeypatch):
    made = []
    monkeypatch.setattr(streams, "foreign_stream",
                        lambda h, ctx: made.append(h) or Stream(driver.CUstream(h), owned=False))
    home = Stream(driver.CUstream(0x1000))
    sw = StreamSwitch(home, context=None)
    configs = {"grid-a": "cfg on home"}
    shared = configs  # the compiled launcher holds this very dict
    s1 = sw.switch(0x2000, home, configs)
    assert s1.ptr == 0x2000 and not s1.owned and made == [0x2000]
    assert configs is shared and configs == {}
    configs["grid-a"] = "cfg on 0x2000"
    assert sw.switch(0x1000, s1, configs) is home and configs == {"grid-a": "cfg on home"}
    s1b = sw.switch(0x2000, home, configs)
    assert s1b is s1 and made == [0x2000]  # remembered: no second context check
    assert configs == {"grid-a": "cfg on 0x2000"}


def test_stream_switch_is_bounded(monkeypatch):
    monkeypatch.setattr(streams, "foreign_stream",
                        lambda h, ctx: Stream(driver.CUstream(h), owned=False))
    home = Stream(driver.CUstream(0x10))
    sw, cur, cfg = StreamSwitch(home, None), home, {}
    for h in range(0x100, 0x100 + 3 * StreamSwitch.MAX_STREAMS):
        cur = sw.switch(h, cur, cfg)
    assert len(sw._saved) <= StreamSwitch.MAX_STREAMS


# --------------------------------------------------------------------------- DeviceArray exports
class _DLTensorView(ctypes.Structure):  # the leading fields of DLManagedTensor
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8),
                ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.CFUNCTYPE(None, ctypes.c_void_p))]


_API = ctypes.PyDLL("python api", handle=ctypes.pythonapi._handle)
_API.PyCapsule_GetPointer.restype = ctypes.c_void_p
_API.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_API.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _capsule_pointer(cap, name=b"dltensor"):
    return _API.PyCapsule_GetPointer(cap, name)


@pytest.mark.parametrize("dtype, code, bits", [(DataType.FLOAT16, 2, 16), (DataType.BFLOAT16, 4, 16),
                                               (DataType.INT32, 0, 32), (DataType.UINT8, 1, 8)])
def test_dlpack_capsule_describes_the_array(dtype, code, bits):
    rt = FakeRuntime()
    a = DeviceArray(rt, (3, 5, 7), dtype)
    assert a.__dlpack_device__() == (2, 0)
    cap = a.__dlpack__(stream=None, max_version=(1, 0))
    t = _DLTensorView.from_address(_capsule_pointer(cap))
    assert (t.data, t.device_type, t.ndim, t.code, t.bits, t.lanes) == (a.ptr, 2, 3, code, bits, 1)
    assert [t.shape[i] for i in range(3)] == [3, 5, 7] and not t.strides
    # An unconsumed capsule releases its reference when collected.
    n = len(_dlpack._LIVE)
    del cap, t
    gc.collect()
    assert len(_dlpack._LIVE) == n - 1
    a.free()


def test_dlpack_consumer_deleter_releases_the_owner():
    rt = FakeRuntime()
    a = DeviceArray(rt, (4,), DataType.FLOAT, free_on_del=True)
    cap = a.__dlpack__()
    addr = _capsule_pointer(cap)
    # A consumer renames the capsule and calls the deleter when its tensor dies.
    assert _API.PyCapsule_SetName(cap, b"used_dltensor") == 0
    del a
    gc.collect()
    assert rt.memory_stats().live_count == 1  # the capsule keeps the array alive
    del cap
    gc.collect()
    assert rt.memory_stats().live_count == 1  # ... and so does the consumer, until it deletes
    _DLTensorView.from_address(addr).deleter(addr)
    gc.collect()
    assert rt.memory_stats().live_count == 0


def test_dlpack_refuses_copies_and_other_devices():
    rt = FakeRuntime()
    with DeviceArray(rt, (2,), DataType.FLOAT) as a:
        with pytest.raises(BufferError):
            a.__dlpack__(copy=True)
        with pytest.raises(BufferError):
            a.__dlpack__(dl_device=(1, 0))


def test_cuda_array_interface():
    rt = FakeRuntime()
    with DeviceArray(rt, (2, 3), np.float16) as a:
        ci = a.__cuda_array_interface__
        assert ci == {"shape": (2, 3), "typestr": "<f2", "strides": None,
                      "data": (a.ptr, False), "version": 3, "stream": None}
        a.stream_ptr = 0  # written on the legacy stream: consumers sync on handle 1
        assert a.__cuda_array_interface__["stream"] == 1
        a.stream_ptr = 0x7F0000
        assert a.__cuda_array_interface__["stream"] == 0x7F0000
    with DeviceArray(rt, (2,), DataType.BFLOAT16) as b:
        assert not hasattr(b, "__cuda_array_interface__")  # consumers fall back to DLPack


def test_free_on_del():
    rt = FakeRuntime()
    keep = DeviceArray(rt, (8,), np.float32)
    DeviceArray(rt, (8,), np.float32, free_on_del=True)
    gc.collect()
    assert rt.memory_stats().live_count == 1
    keep.free()


# --------------------------------------------------------------------------- ONNX nodes
def test_onnx_round_trip():
    onnx = pytest.importorskip("onnx")
    node = Node("PagedAttention", "com.microsoft",
                {"num_heads": 128, "scale": 0.0625, "kv_cache_layout": "LATENT", "do_rotary": True,
                 "ints": [1, 2, 3], "floats": [0.5, 2.0], "names": ["a", "b"],
                 "table": np.arange(6, dtype=np.int32).reshape(2, 3)},
                ["q", "k", None, "kc"], ["out", None])
    proto = node.to_onnx("pa0")
    assert isinstance(proto, onnx.NodeProto) and proto.name == "pa0"
    assert list(proto.input) == ["q", "k", "", "kc"] and list(proto.output) == ["out", ""]
    back = Node.from_onnx(proto)
    assert (back.op_type, back.domain, back.inputs, back.outputs) == (
        node.op_type, node.domain, node.inputs, node.outputs)
    a = back.attributes
    assert a["num_heads"] == 128 and a["scale"] == 0.0625 and a["kv_cache_layout"] == "LATENT"
    assert a["do_rotary"] == 1 and a["ints"] == [1, 2, 3] and a["floats"] == [0.5, 2.0]
    assert a["names"] == ["a", "b"] and np.array_equal(a["table"], node.attributes["table"])
    assert back.attr_str("kv_cache_layout") == "LATENT" and back.attr_int("num_heads") == 128


def test_onnx_node_from_helper_and_bad_input():
    onnx = pytest.importorskip("onnx")
    proto = onnx.helper.make_node("Attention", ["q", "k", "v"], ["o"], domain="pkg.nxrt",
                                  num_heads=8, kv_num_heads=2, causal=1)
    node = Node.from_onnx(proto)
    assert node.attributes == {"num_heads": 8, "kv_num_heads": 2, "causal": 1}
    from attnrt.ops.attention import AttentionFactory
    assert AttentionFactory(None).unsupported_reason(
        node, [(1, 8, 3, 64), (1, 2, 5, 64), (1, 2, 5, 64)], [DataType.FLOAT16] * 3) is None
    with pytest.raises(TypeError, match="NodeProto"):
        Node.from_onnx({"op_type": "Attention"})


def test_onnx_example_runs():
    pytest.importorskip("onnx")
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "onnx_single_node.py")],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "claimed by AttentionFactory" in res.stdout


# --------------------------------------------------------------------------- layering
def test_import_attnrt_does_not_import_ops():
    code = ("import sys, attnrt, attnrt.runtime, attnrt.runtime.executor; "
            "bad = [m for m in sys.modules if m.startswith('attnrt.ops')]; "
            "assert not bad, bad; f = attnrt.attention; "
            "assert 'attnrt.ops.functional' in sys.modules; assert 'torch' not in sys.modules or "
            "'attnrt.ops.torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_runtime_never_imports_ops():
    for path in sorted((ROOT / "attnrt" / "runtime").glob("*.py")):
        for n in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else (
                [n.module or ""] if isinstance(n, ast.ImportFrom) else [])
            assert not any(m.startswith(("attnrt.ops", "attnrt.app")) for m in names), path


def test_lazy_exports():
    from attnrt.ops import functional
    for name in ("attention", "paged_attention", "mla_decode", "index_share", "Attention",
                 "PagedAttention", "IndexShare", "OpPlan"):
        assert getattr(attnrt, name) is getattr(functional, name) and name in dir(attnrt)
    assert attnrt.mla_decode is attnrt.paged_attention
    with pytest.raises(AttributeError):
        attnrt.no_such_name  # noqa: B018
