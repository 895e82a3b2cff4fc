"""Launch helpers without a GPU: dim3, reduction_launch_config, argument packing and the
dynamic shared memory limit.

Packing reads the parameter layout from the CUBIN (``cuFuncGetParamInfo``, which needs a
GPU); here a Function gets a fake (integer) handle and a preset layout (``_params``) so
that no driver call is made. The same checks against a real CUBIN layout run in
tests/test_runtime_gpu.py.
"""

from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np
import pytest

from attnrt.runtime.api import DataType
from attnrt.runtime.launch import (
    Function,
    LaunchConfig,
    dim3,
    f32,
    f64,
    i32,
    i64,
    reduction_launch_config,
    u32,
    u64,
)


def _fn(params, max_optin=227 * 1024) -> Function:
    fn = Function(handle=0xF00D, name="k", module_name="m", max_optin_shared=max_optin)
    fn._params = tuple(params)  # the layout cuFuncGetParamInfo would report
    return fn


def _packed(fn: Function, args) -> tuple[bytes, list[int]]:
    """(parameter bytes, offset of each void* relative to the buffer) after packing."""
    addr = fn.pack(args)
    packer = fn._tls.packers[tuple(map(type, args))]
    assert addr == packer.addr.value
    base = ctypes.addressof(packer.buf)
    n = len(fn.params)
    ptrs = [ctypes.cast(addr, ctypes.POINTER(ctypes.c_void_p))[i] - base for i in range(n)]
    return ctypes.string_at(base, len(packer.buf)), ptrs


# -- dim3 ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,want", [
    (5, (5, 1, 1)), (np.int64(7), (7, 1, 1)), ((3,), (3, 1, 1)), ((3, 4), (3, 4, 1)),
    ([2, 3, 4], (2, 3, 4)), ((np.int32(2), 5), (2, 5, 1)),
])
def test_dim3(spec, want):
    got = dim3(spec, "grid")
    assert got == want and all(type(x) is int for x in got)


@pytest.mark.parametrize("spec", [0, -1, (), (1, 2, 3, 4), (4, 0), (1, -2, 1)])
def test_dim3_refuses(spec):
    with pytest.raises(ValueError, match="block"):
        dim3(spec, "block")


# -- reduction_launch_config --------------------------------------------------------------------

@pytest.mark.parametrize("rows,row_len,block", [
    (1, 1, 32), (7, 31, 32), (7, 32, 32), (7, 33, 64), (3, 1000, 1024), (3, 1025, 1024),
    (100000, 4097, 1024),
])
def test_reduction_launch_config(rows, row_len, block):
    cfg = reduction_launch_config(rows, row_len)
    assert isinstance(cfg, LaunchConfig)
    assert cfg.grid == (rows, 1, 1) and cfg.block == (block, 1, 1)
    assert cfg.shared_mem == block * 4
    assert block % 32 == 0 and block <= 1024


def test_reduction_launch_config_options():
    cfg = reduction_launch_config(5, 300, max_block=128, shared_bytes_per_thread=8)
    assert cfg.block == (128, 1, 1) and cfg.shared_mem == 1024
    for bad in [(0, 5), (5, 0), (-1, 5), (2**31, 5)]:
        with pytest.raises(ValueError):
            reduction_launch_config(*bad)


def test_scalar_tags_are_numpy_types():
    assert (i32, u32, i64, u64, f32, f64) == (np.int32, np.uint32, np.int64, np.uint64, np.float32,
                                              np.float64)


# -- packing ------------------------------------------------------------------------------------

def test_pack_pointer_and_scalars():
    # saxpy(float* y, const float* x, float a, int n): offsets 0, 8, 16, 20.
    fn = _fn([(0, 8), (8, 8), (16, 4), (20, 4)])
    data, ptrs = _packed(fn, [0x7F0000001000, 0x7F0000002000, np.float32(2.5), np.int32(-7)])
    assert ptrs == [0, 8, 16, 20]
    assert data == struct.pack("<QQfi", 0x7F0000001000, 0x7F0000002000, 2.5, -7)


def test_pack_honours_padding_offsets():
    # (int n, double* p, char c, double d): the driver aligns p and d to 8.
    fn = _fn([(0, 4), (8, 8), (16, 1), (24, 8)])
    data, ptrs = _packed(fn, [np.int32(3), 0xABC0, np.int8(-1), np.float64(0.5)])
    assert ptrs == [0, 8, 16, 24]
    assert len(data) == 32
    assert struct.unpack_from("<i", data, 0)[0] == 3
    assert struct.unpack_from("<Q", data, 8)[0] == 0xABC0
    assert struct.unpack_from("<b", data, 16)[0] == -1
    assert struct.unpack_from("<d", data, 24)[0] == 0.5


@pytest.mark.parametrize("value,fmt", [
    (np.int8(-3), "b"), (np.uint8(250), "B"), (np.int16(-300), "h"), (np.uint16(60000), "H"),
    (np.int32(-2**31), "i"), (np.uint32(2**32 - 1), "I"), (np.int64(-2**63), "q"),
    (np.uint64(2**64 - 1), "Q"), (np.float32(1.5), "f"), (np.float64(-2.25), "d"),
    (np.bool_(True), "?"),
])
def test_pack_every_scalar_type(value, fmt):
    size = struct.calcsize(fmt)
    fn = _fn([(0, size)])
    data, _ = _packed(fn, [value])
    assert data[:size] == struct.pack("<" + fmt, value)


def test_pack_reuses_buffer_and_updates_values():
    fn = _fn([(0, 8), (8, 4)])
    a1 = fn.pack([0x1000, np.int32(1)])
    a2 = fn.pack([0x2000, np.int32(2)])
    assert a1 == a2  # one buffer per signature and thread
    data, _ = _packed(fn, [0x3000, np.int32(3)])
    assert data[:12] == struct.pack("<Qi", 0x3000, 3)


def test_pack_buffers_are_per_thread():
    fn = _fn([(0, 8), (8, 4)])
    main = fn.pack([0x1000, np.int32(1)])
    other = {}

    def worker():
        other["addr"] = fn.pack([0x2000, np.int32(2)])
        other["bytes"] = ctypes.string_at(ctypes.cast(other["addr"], ctypes.POINTER(ctypes.c_void_p))[0],
                                          12)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert other["addr"] != main
    assert other["bytes"] == struct.pack("<Qi", 0x2000, 2)
    # The main thread's buffer was not touched by the other thread.
    assert ctypes.string_at(ctypes.cast(main, ctypes.POINTER(ctypes.c_void_p))[0], 12) == \
        struct.pack("<Qi", 0x1000, 1)


def test_pack_no_params():
    fn = _fn([])
    assert isinstance(fn.pack([]), int)
    with pytest.raises(TypeError, match="takes 0 arguments, got 1"):
        fn.pack([0x1000])


def test_pack_wrong_count():
    fn = _fn([(0, 8), (8, 4)])
    with pytest.raises(TypeError, match="takes 2 arguments, got 1"):
        fn.pack([0x1000])
    with pytest.raises(TypeError, match="takes 2 arguments, got 3"):
        fn.pack([0x1000, np.int32(1), np.int32(2)])


def test_pack_plain_int_where_int32_expected():
    fn = _fn([(0, 8), (8, 4)])
    with pytest.raises(TypeError) as info:
        fn.pack([0x1000, 5])
    msg = str(info.value)
    assert "argument 1" in msg and "4 bytes" in msg and "np.int32" in msg


def test_pack_int32_where_pointer_expected():
    fn = _fn([(0, 8)])
    with pytest.raises(TypeError, match="parameter is 8 bytes, got a 4-byte int32"):
        fn.pack([np.int32(5)])


@pytest.mark.parametrize("bad", [True, 1.5, "0x10", None, np.float16(1), [1], np.array([1], np.int32)])
def test_pack_refuses_non_kernel_arguments(bad):
    fn = _fn([(0, 8)])
    with pytest.raises(TypeError, match="argument 0"):
        fn.pack([bad])


def test_a_refused_signature_does_not_poison_the_good_one():
    fn = _fn([(0, 8), (8, 4)])
    with pytest.raises(TypeError):
        fn.pack([0x1000, 5])
    fn.pack([0x1000, np.int32(5)])
    with pytest.raises(TypeError):  # still refused the second time (no cached bad packer)
        fn.pack([0x1000, 5])


def test_function_repr():
    assert repr(_fn([])) == "Function(m::k)"


# -- dynamic shared memory limit (no driver call at or below 48 KiB, none when refused) ----------

def test_ensure_shared_refuses_above_optin_without_driver_call():
    fn = _fn([], max_optin=100 * 1024)
    fn.ensure_shared(0)
    fn.ensure_shared(48 * 1024)  # default limit: nothing to raise
    with pytest.raises(ValueError) as info:
        fn.ensure_shared(100 * 1024 + 1)
    assert str(100 * 1024) in str(info.value) and str(100 * 1024 + 1) in str(info.value)
    assert fn._shmem_limit == 48 * 1024


# -- the ctypes fast path: the current context is a per-thread answer --------------------------

class _FakeFn:
    """Stands in for a ctypes function of libcuda (accepts argtypes/restype)."""

    def __init__(self, impl):
        self.impl = impl

    def __call__(self, *args):
        return self.impl(*args)


def _out_target(ref):
    # The implementation passes byref(x) or pointer(x); write through either.
    if hasattr(ref, "_obj"):
        return ref._obj
    if hasattr(ref, "contents"):
        return ref.contents
    return ref




def test_ptx_param_count_reads_the_entry_signature():
    from attnrt.runtime import compiler
    from attnrt.runtime.launch import ptx_param_count

    src = ('extern "C" __global__ void none() {}\n'
           'extern "C" __global__ void six(float* a, const float* b, int n, float s, double d, '
           'long long m) { if (n < 0) a[0] = b[0] + s + d + m; }\n')
    ptx = compiler.compile_source(src, "count.cu", "sm_80", cubin=False).ptx
    assert ptx_param_count(ptx, "none") == 0
    assert ptx_param_count(ptx, "six") == 6
    assert ptx_param_count(ptx, "absent") is None


class _ProbeDriver:
    """The two calls ``Function.params`` makes, answered from a fixed layout (no GPU)."""

    def __init__(self, layout, with_count: bool):
        from attnrt.runtime import _check

        self.layout, self.calls = list(layout), []
        self._ok = _check.driver.CUresult.CUDA_SUCCESS
        self._bad = _check.driver.CUresult.CUDA_ERROR_INVALID_VALUE
        if with_count:
            self.cuKernelGetParamCount = lambda handle: (self._ok, len(self.layout))

    def cuKernelGetParamInfo(self, handle, i):
        self.calls.append(i)
        return (self._ok, *self.layout[i]) if i < len(self.layout) else (self._bad, 0, 0)


@pytest.mark.parametrize("with_count", [True, False], ids=["count", "probe"])
def test_params_from_the_driver_with_and_without_a_count(monkeypatch, with_count):
    from attnrt.runtime import launch

    layout = [(0, 8), (8, 4), (16, 8)]
    fake = _ProbeDriver(layout, with_count)
    monkeypatch.setattr(launch, "driver", fake)
    fn = Function(handle=0xF00D, name="k", module_name="m", max_optin_shared=1 << 16)
    assert fn.params == tuple(layout)
    # Without cuKernelGetParamCount the probe stops at the first CUDA_ERROR_INVALID_VALUE.
    assert fake.calls == ([0, 1, 2] if with_count else [0, 1, 2, 3])


def test_params_probe_raises_on_other_errors(monkeypatch):
    from attnrt.runtime import _check, launch
    from attnrt.runtime.errors import CudaError

    fake = _ProbeDriver([(0, 8)], with_count=False)
    oom = _check.driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    fake.cuKernelGetParamInfo = lambda handle, i: (oom, 0, 0)
    monkeypatch.setattr(launch, "driver", fake)
    fn = Function(handle=0xF00D, name="k", module_name="m", max_optin_shared=1 << 16)
    with pytest.raises(CudaError, match="CUDA_ERROR_OUT_OF_MEMORY"):
        _ = fn.params


def test_pack_bytes_for_a_by_value_struct():
    # A 128-byte, 64-byte-aligned parameter (a CUtensorMap) after a pointer: bytes of its size.
    fn = _fn([(0, 8), (64, 128)])
    blob = bytes(range(128))
    ptrs = ctypes.cast(fn.pack([0x1000, blob]), ctypes.POINTER(ctypes.c_void_p))
    assert ctypes.string_at(ptrs[1], 128) == blob
    assert ptrs[1] - ptrs[0] == 64
    with pytest.raises(TypeError, match="parameter is 128 bytes, got a 127-byte bytes"):
        fn.pack([0x1000, blob[:127]])
    with pytest.raises(TypeError, match="argument 1"):
        fn.pack([0x1000, bytearray(blob)])


@pytest.mark.parametrize("dtype", [DataType.FLOAT, DataType.INT32])
def test_tensor_map_refuses_a_dtype_it_cannot_describe(dtype):
    # Refused before the driver is asked (the pair kernel's map is bf16/f16 only).
    from attnrt.runtime.tma import tensor_map_2d

    with pytest.raises(ValueError, match="16-bit float"):
        tensor_map_2d(0x1000, dtype, (64, 576), 1152, (64, 64))


@pytest.mark.parametrize("promotion", [32, 512, -1])
def test_tensor_map_refuses_an_l2_promotion_it_cannot_describe(promotion):
    from attnrt.runtime.tma import tensor_map_2d

    with pytest.raises(ValueError, match="l2_promotion"):
        tensor_map_2d(0x1000, DataType.BFLOAT16, (64, 576), 1152, (64, 64),
                      l2_promotion=promotion)
