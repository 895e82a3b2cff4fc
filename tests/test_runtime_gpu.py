"""CudaRuntime on a real device: memory and the ledger, launches and argument checks,
dynamic shared memory, graph capture/replay/update, capture-illegal calls, the error latch,
several runtimes in one process, and the warm disk cache in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pytest

import attnrt
from attnrt.runtime import CaptureError, DataType, DeviceArray
from attnrt.runtime.cache import CompileCache
from attnrt.runtime.latch import INDEX_SHARE_SELECTED_INDICES, WELL_KNOWN_BITS
from tests._util import TOL, rel_fro

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[1]
MODULE = "nxrt_test_runtime"
SRC = r'''
extern "C" __global__ void saxpy(float* out, const float* x, const float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}

extern "C" __global__ void add_one(float* out, const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + 1.0f;
}

// One block: stage n floats in dynamic shared memory (n * 4 bytes), write them reversed.
extern "C" __global__ void reverse_smem(float* out, const float* in, int n) {
  extern __shared__ float s[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = in[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = s[n - 1 - i];
}

// Latch `bit` when any flag is non-zero (bad data seen where it cannot be reported).
extern "C" __global__ void latch_if(unsigned int* latch, const int* flags, int n, unsigned int bit) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && flags[i] != 0) atomicOr(latch, bit);
}

// Parameters only: launching it with garbage arguments cannot fault.
extern "C" __global__ void two_ints(int a, int b) {}
'''

BLOCK = 128


def _grid(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


def _fn(rt, entry: str, module: str = MODULE):
    return rt.nvrtc_function(module, SRC, entry)


def _saxpy(rt, out, x, y, a: float, n: int) -> None:
    rt.launch(_fn(rt, "saxpy"), _grid(n), BLOCK, [out.ptr, x.ptr, y.ptr, np.float32(a), np.int32(n)])


def _saxpy_ref(x, y, a: float) -> np.ndarray:
    return np.float32(a) * x.astype(np.float64) + y.astype(np.float64)


def _check_close(out: np.ndarray, ref: np.ndarray) -> None:
    assert np.all(np.isfinite(out)), "output still holds poison (NaN)"
    assert rel_fro(out, ref) <= TOL[DataType.FLOAT]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def _rand(rng, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32) + np.float32(0.25)


@pytest.fixture(scope="module", autouse=True)
def _loaded(rt):
    """Load every entry of SRC and run each once (n = 0) before any test captures, so that no
    module load or first-launch work of the driver happens inside a capture."""
    null = [0, 0, 0, np.float32(0), np.int32(0)]
    rt.launch(_fn(rt, "saxpy"), 1, BLOCK, null)
    rt.launch(_fn(rt, "add_one"), 1, BLOCK, [0, 0, np.int32(0)])
    rt.launch(_fn(rt, "reverse_smem"), 1, BLOCK, [0, 0, np.int32(0)])
    rt.launch(_fn(rt, "latch_if"), 1, BLOCK, [0, 0, np.int32(0), np.uint32(0)])
    rt.launch(_fn(rt, "two_ints"), 1, 1, [np.int32(0), np.int32(0)])
    rt.synchronize()
    rt.latch.read()  # start from a clear latch whatever ran before this module


@contextmanager
def _no_capture_left(rt):
    """Whatever a test does, leave the stream out of capture mode for the next test."""
    try:
        yield
    finally:
        if rt.is_capturing():
            rt.abort_capture()


# -- capabilities -------------------------------------------------------------------------------

def test_capabilities_are_sane(rt):
    c = rt.capabilities
    major, minor = c.compute_capability
    assert c.arch == f"sm_{major}{minor}" and (major, minor) >= (7, 0)
    assert c.ordinal == 0 and c.name
    assert c.sm_count > 0 and c.warp_size == 32 and c.max_threads_per_block == 1024
    assert c.max_shared_per_block == 48 * 1024
    assert c.max_shared_per_block <= c.max_shared_per_block_optin <= c.max_shared_per_sm
    assert c.l2_bytes > 0 and c.total_memory > 0 and c.max_registers_per_sm > 0
    assert c.as_dict()["arch"] == c.arch
    assert rt.arch.startswith("sm_") and attnrt.device_count() >= 1 and attnrt.gpu_missing_reason() is None
    assert "closed=False" in repr(rt)
    if "H200" in c.name:
        assert (major, minor) == (9, 0) and c.arch == "sm_90"
        assert (rt.arch, rt.arch_exact) == ("sm_90", True)
        assert c.sm_count == 132
        assert c.max_shared_per_block_optin == 227 * 1024
        assert c.l2_bytes >= 40 * 2**20
        assert c.total_memory >= 100 * 2**30


# -- memory and the ledger ------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 3, 4097, 1_000_003])
def test_alloc_copy_round_trips(ledger, rng, n):
    rt = ledger
    before = rt.memory_stats()
    host = rng.integers(0, 256, n, dtype=np.uint8)
    a, b = rt.alloc_raw(n), rt.alloc_raw(n)
    try:
        s = rt.memory_stats()
        assert s.live_bytes == before.live_bytes + 2 * n
        assert s.live_count == before.live_count + 2
        assert s.total_allocs == before.total_allocs + 2
        assert s.peak_bytes >= s.live_bytes
        rt.htod(a, host)
        back = rt.dtoh(np.full(n, 0xEE, np.uint8), a)
        np.testing.assert_array_equal(back, host)
        rt.memset(b, 0x5A, n)
        rt.dtod(b, a, n)
        np.testing.assert_array_equal(rt.dtoh(np.empty(n, np.uint8), b), host)
        if n >= 3:
            # memset and dtod inside the allocation, at odd offsets.
            rt.memset(b + 1, 0xAB, n - 2)
            want = host.copy()
            want[1:-1] = 0xAB
            np.testing.assert_array_equal(rt.dtoh(np.empty(n, np.uint8), b), want)
            rt.dtod(b + 1, a + 2, n - 2)
            want[1:-1] = host[2:]
            np.testing.assert_array_equal(rt.dtoh(np.empty(n, np.uint8), b), want)
            # A partial read at an offset.
            np.testing.assert_array_equal(rt.dtoh(np.empty(n - 1, np.uint8), a + 1), host[1:])
    finally:
        rt.free_raw(a)
        rt.free_raw(b)
    after = rt.memory_stats()
    assert after.live_bytes == before.live_bytes and after.live_count == before.live_count
    assert after.total_frees == before.total_frees + 2


def test_typed_round_trip_and_non_contiguous_source(ledger, rng):
    rt = ledger
    x = rng.standard_normal((37, 11)).astype(np.float32)
    with DeviceArray(rt, (11, 37), np.float32) as d:
        d.copy_from(x.T)  # a transposed (non-contiguous) view is copied in C order
        np.testing.assert_array_equal(d.numpy(), np.ascontiguousarray(x.T))
        d.fill_bytes(0xFF)
        assert np.all(np.isnan(d.numpy()))


def test_zero_byte_allocation(ledger):
    rt = ledger
    before = rt.memory_stats()
    p = rt.alloc_raw(0)
    assert p != 0
    assert rt.memory_stats().live_count == before.live_count + 1
    rt.htod(p, np.empty(0, np.uint8))
    rt.dtoh(np.empty(0, np.uint8), p)
    rt.free_raw(p)
    assert rt.memory_stats().live_bytes == before.live_bytes


def test_free_unknown_and_double_free(ledger):
    rt = ledger
    p = rt.alloc_raw(64)
    with pytest.raises(ValueError):
        rt.free_raw(p + 8)  # inside ours, but not an allocation start
    with pytest.raises(ValueError):
        rt.free_raw(0x1234)
    rt.free_raw(p)
    with pytest.raises(ValueError):
        rt.free_raw(p)  # double free: a ValueError, never a driver crash
    with pytest.raises(ValueError):
        rt.alloc_raw(-1)


def test_overrun_of_an_owned_allocation(ledger):
    rt = ledger
    n = 101
    p = rt.alloc_raw(n)
    try:
        with pytest.raises(ValueError):
            rt.htod(p, np.zeros(n + 1, np.uint8))
        with pytest.raises(ValueError):
            rt.htod(p + 50, np.zeros(n - 49, np.uint8))
        with pytest.raises(ValueError):
            rt.dtoh(np.empty(n + 1, np.uint8), p)
        with pytest.raises(ValueError):
            rt.dtoh(np.empty(2, np.uint8), p + n - 1)
        with pytest.raises(ValueError):
            rt.memset(p + 1, 0, n)
        with pytest.raises(ValueError):
            rt.dtod(p, p + 1, n)
        with pytest.raises(ValueError):
            rt.memset(p, 256, 1)
        # Exactly to the end is fine.
        rt.htod(p + 50, np.arange(n - 50, dtype=np.uint8))
        np.testing.assert_array_equal(rt.dtoh(np.empty(n - 50, np.uint8), p + 50),
                                      np.arange(n - 50, dtype=np.uint8))
    finally:
        rt.free_raw(p)


# -- launching --------------------------------------------------------------------------------

def test_saxpy_against_numpy(ledger, rng):
    rt = ledger
    n = 100_003
    x, y = _rand(rng, n), _rand(rng, n)
    a = 1.75
    with DeviceArray.from_numpy(rt, x) as dx, DeviceArray.from_numpy(rt, y) as dy, \
            DeviceArray(rt, (n,), np.float32) as out:
        out.fill_bytes(0xFF)
        count = rt.launch_count
        _saxpy(rt, out, dx, dy, a, n)
        assert rt.launch_count == count + 1
        _check_close(out.numpy(), _saxpy_ref(x, y, a))
        # Grid and block as tuples of any length.
        out.fill_bytes(0xFF)
        rt.launch(_fn(rt, "saxpy"), (_grid(n), 1, 1), (BLOCK,), [out.ptr, dx.ptr, dy.ptr, np.float32(a),
                                                                 np.int32(n)])
        _check_close(out.numpy(), _saxpy_ref(x, y, a))


def test_param_layout_is_read_from_the_cubin(rt):
    assert _fn(rt, "saxpy").params == ((0, 8), (8, 8), (16, 8), (24, 4), (28, 4))
    assert _fn(rt, "two_ints").params == ((0, 4), (4, 4))
    assert _fn(rt, "saxpy").num_regs > 0


def test_repeat_nvrtc_function_is_cached(rt):
    fn = _fn(rt, "saxpy")
    stats = dict(rt.cache.stats.as_dict())
    for _ in range(3):
        assert _fn(rt, "saxpy") is fn
    assert rt.cache.stats.as_dict() == stats  # no hashing, no disk, not even a memory hit
    assert repr(fn) == f"Function({MODULE}::saxpy)"


@pytest.mark.parametrize("case", ["too-few", "too-many", "plain-int-for-int32", "float-for-float32",
                                  "int32-for-pointer", "bool"])
def test_bad_arguments_are_type_errors_before_launch(ledger, case):
    rt = ledger
    with DeviceArray(rt, (8,), np.float32) as buf:
        p = buf.ptr
        saxpy, two = _fn(rt, "saxpy"), _fn(rt, "two_ints")
        fn, args = {
            "too-few": (saxpy, [p, p, p, np.float32(1)]),
            "too-many": (saxpy, [p, p, p, np.float32(1), np.int32(8), np.int32(0)]),
            "plain-int-for-int32": (saxpy, [p, p, p, np.float32(1), 8]),
            "float-for-float32": (saxpy, [p, p, p, 1.0, np.int32(8)]),
            "int32-for-pointer": (saxpy, [np.int32(0), p, p, np.float32(1), np.int32(8)]),
            "bool": (two, [True, np.int32(1)]),
        }[case]
        count = rt.launch_count
        with pytest.raises(TypeError):
            rt.launch(fn, 1, 32, args)
        assert rt.launch_count == count
        rt.synchronize()


@pytest.mark.parametrize("grid,block", [(0, 32), ((1, 0), 32), (1, (0, 1, 1)), ((0, 1, 1), 32),
                                        ((1, 1, 0), 32), ((-1, 1, 1), 32), ((1.0, 1, 1), 32)])
def test_bad_grid_or_block_is_a_value_error(ledger, grid, block):
    # launch() documents ValueError for a bad grid/block, whatever form it was given in.
    rt = ledger
    count = rt.launch_count
    with pytest.raises(ValueError):
        rt.launch(_fn(rt, "two_ints"), grid, block, [np.int32(1), np.int32(2)])
    assert rt.launch_count == count
    rt.synchronize()


def test_dynamic_shared_memory_above_48k(ledger, rng):
    rt = ledger
    n = 100 * 1024 // 4  # 100 KiB of floats staged in shared memory
    x = _rand(rng, n)
    fn = _fn(rt, "reverse_smem")
    with DeviceArray.from_numpy(rt, x) as dx, DeviceArray(rt, (n,), np.float32) as out:
        for _ in range(2):  # the second launch reuses the raised limit
            out.fill_bytes(0xFF)
            rt.launch(fn, 1, 256, [out.ptr, dx.ptr, np.int32(n)], shared_mem=n * 4)
            np.testing.assert_array_equal(out.numpy(), x[::-1])
        # Smaller again (below and above 48 KiB) still works.
        m = 20_000
        out.fill_bytes(0xFF)
        rt.launch(fn, 1, 256, [out.ptr, dx.ptr, np.int32(m)], shared_mem=m * 4)
        np.testing.assert_array_equal(out.numpy()[:m], x[:m][::-1])
        count = rt.launch_count
        too_much = rt.capabilities.max_shared_per_block_optin + 1
        with pytest.raises(ValueError):
            rt.launch(fn, 1, 256, [out.ptr, dx.ptr, np.int32(n)], shared_mem=too_much)
        assert rt.launch_count == count


def test_shared_memory_limit_with_two_handles_of_one_kernel(ledger, rng):
    # The same entry asked for with arch=None and with the device's arch explicitly is the
    # same module and the same CUfunction; raising the limit through one Function must not
    # leave the other believing a higher limit is still set.
    rt = ledger
    n = 100 * 1024 // 4
    x = _rand(rng, n)
    a = rt.nvrtc_function("nxrt_test_two_handles", SRC, "reverse_smem")
    b = rt.nvrtc_function("nxrt_test_two_handles", SRC, "reverse_smem", arch=rt.arch)
    with DeviceArray.from_numpy(rt, x) as dx, DeviceArray(rt, (n,), np.float32) as out:
        rt.launch(a, 1, 256, [out.ptr, dx.ptr, np.int32(n)], shared_mem=n * 4)
        m = 60 * 1024 // 4
        rt.launch(b, 1, 256, [out.ptr, dx.ptr, np.int32(m)], shared_mem=m * 4)
        out.fill_bytes(0xFF)
        rt.launch(a, 1, 256, [out.ptr, dx.ptr, np.int32(n)], shared_mem=n * 4)
        np.testing.assert_array_equal(out.numpy(), x[::-1])


def test_launch_from_a_thread_without_a_current_context(ledger, rng):
    # A fresh thread has no current context; the first launch of a fresh Function there
    # (parameter query, shared-memory attribute, launch) must still work.
    rt = ledger
    n = 64 * 1024 // 4
    x = _rand(rng, n)
    fn = rt.nvrtc_function("nxrt_test_thread", SRC, "reverse_smem")
    box: dict = {}
    with DeviceArray.from_numpy(rt, x) as dx, DeviceArray(rt, (n,), np.float32) as out:
        out.fill_bytes(0xFF)
        rt.synchronize()

        def worker():
            try:
                rt.launch(fn, 1, 256, [out.ptr, dx.ptr, np.int32(n)], shared_mem=n * 4)
                rt.synchronize()
            except BaseException as exc:  # reported in the main thread
                box["error"] = exc

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        if "error" in box:
            raise box["error"]
        np.testing.assert_array_equal(out.numpy(), x[::-1])


# -- graphs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["thread_local", "global", "relaxed"])
def test_capture_and_replay_with_changing_inputs(ledger, rng, mode):
    rt = ledger
    n, a = 54_321, -0.5
    with ExitStack() as st, _no_capture_left(rt):
        dx, dy, o1, o2 = (st.enter_context(DeviceArray(rt, (n,), np.float32)) for _ in range(4))
        dx.copy_from(_rand(rng, n))
        dy.copy_from(_rand(rng, n))
        count = rt.launch_count
        with rt.capture(mode) as g:
            assert rt.is_capturing()
            _saxpy(rt, o1, dx, dy, a, n)  # o1 = a*x + y
            rt.launch(_fn(rt, "add_one"), _grid(n), BLOCK, [o2.ptr, o1.ptr, np.int32(n)])  # o2 = o1 + 1
        assert not rt.is_capturing() and g.ready and g.num_nodes == 2
        assert rt.launch_count == count + 2  # captured, not executed
        st.callback(g.destroy)
        for _ in range(4):
            x, y = _rand(rng, n), _rand(rng, n)
            dx.copy_from(x)
            dy.copy_from(y)
            o1.fill_bytes(0xFF)
            o2.fill_bytes(0xFF)
            g.replay()
            ref = _saxpy_ref(x, y, a)
            _check_close(o1.numpy(), ref)
            _check_close(o2.numpy(), ref + 1.0)
        assert g.replays == 4



def _foreign_context(dev: int):
    """A new (non-primary) context, current on the calling thread (both binding signatures)."""
    from cuda.bindings import driver

    handle = driver.cuDeviceGet(dev)[1]
    try:
        err, ctx = driver.cuCtxCreate(None, 0, handle)
    except TypeError:  # bindings before 13: cuCtxCreate(flags, dev)
        err, ctx = driver.cuCtxCreate(0, handle)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return ctx


@pytest.mark.parametrize("current", ["none", "foreign"])
def test_replay_whatever_context_is_current(ledger, rng, current):
    # replay() makes no per-call context probe: the instance launches in its stream's
    # context from a thread with no current context, or with another context current, and
    # leaves the caller's current context as it was (no fallback to make_current).
    from cuda.bindings import driver

    rt = ledger
    n, a = 40_961, 2.5
    with ExitStack() as st, _no_capture_left(rt):
        dx, dy, out = (st.enter_context(DeviceArray(rt, (n,), np.float32)) for _ in range(3))
        with rt.capture() as g:
            _saxpy(rt, out, dx, dy, a, n)
        st.callback(g.destroy)
        x, y = _rand(rng, n), _rand(rng, n)
        dx.copy_from(x)
        dy.copy_from(y)
        out.fill_bytes(0xFF)
        rt.synchronize()
        box: dict = {}

        def worker():
            ctx = None
            try:
                if current == "foreign":
                    ctx = _foreign_context(rt.device.ordinal)
                before = driver.cuCtxGetCurrent()[1]
                g.replay()
                box["after"] = (int(before or 0), int(driver.cuCtxGetCurrent()[1] or 0))
            except BaseException as exc:  # reported in the main thread
                box["error"] = exc
            finally:
                if ctx is not None:
                    driver.cuCtxDestroy(ctx)

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        if "error" in box:
            raise box["error"]
        before, after = box["after"]
        assert after == before and (before == 0) == (current == "none")
        assert g.replays == 1
        _check_close(out.numpy(), _saxpy_ref(x, y, a))

def test_begin_end_capture(ledger, rng):
    rt = ledger
    n = 777
    with ExitStack() as st, _no_capture_left(rt):
        dx, dy, out = (st.enter_context(DeviceArray(rt, (n,), np.float32)) for _ in range(3))
        x, y = _rand(rng, n), _rand(rng, n)
        dx.copy_from(x)
        dy.copy_from(y)
        with pytest.raises(CaptureError):
            rt.end_capture()  # not capturing
        with pytest.raises(ValueError):
            rt.begin_capture("sideways")
        assert not rt.is_capturing()
        rt.begin_capture()
        with pytest.raises(CaptureError):
            rt.begin_capture()  # already capturing
        _saxpy(rt, out, dx, dy, 3.0, n)
        g = rt.end_capture()
        st.callback(g.destroy)
        assert not rt.is_capturing()
        out.fill_bytes(0xFF)
        g.replay()
        g.replay()
        _check_close(out.numpy(), _saxpy_ref(x, y, 3.0))
        g.destroy()
        g.destroy()  # idempotent
        assert not g.ready
        with pytest.raises(CaptureError):
            g.replay()


def _captured_saxpy(rt, out, x, y, a, n):
    with rt.capture() as g:
        _saxpy(rt, out, x, y, a, n)
    return g


def test_update_same_topology_follows_new_args(ledger, rng):
    rt = ledger
    n = 3001
    with ExitStack() as st, _no_capture_left(rt):
        bufs = [st.enter_context(DeviceArray(rt, (n,), np.float32)) for _ in range(6)]
        x1, y1, o1, x2, y2, o2 = bufs
        hx1, hy1, hx2, hy2 = (_rand(rng, n) for _ in range(4))
        for d, h in ((x1, hx1), (y1, hy1), (x2, hx2), (y2, hy2)):
            d.copy_from(h)
        g1 = _captured_saxpy(rt, o1, x1, y1, 2.0, n)
        g2 = _captured_saxpy(rt, o2, x2, y2, -3.0, n)
        st.callback(g1.destroy)
        st.callback(g2.destroy)
        assert g1.update(g2) is True
        assert g1.reinstantiations == 0
        o1.fill_bytes(0xFF)
        o2.fill_bytes(0xFF)
        g1.replay()
        _check_close(o2.numpy(), _saxpy_ref(hx2, hy2, -3.0))  # g1 now runs g2's arguments
        assert np.all(np.isnan(o1.numpy()))                   # and no longer its own
        # g2 keeps its own instance.
        o2.fill_bytes(0xFF)
        g2.replay()
        _check_close(o2.numpy(), _saxpy_ref(hx2, hy2, -3.0))


def test_update_different_topology_reinstantiates(ledger, rng):
    rt = ledger
    n = 2049
    with ExitStack() as st, _no_capture_left(rt):
        x, y, o1, o3, o4 = (st.enter_context(DeviceArray(rt, (n,), np.float32)) for _ in range(5))
        hx, hy = _rand(rng, n), _rand(rng, n)
        x.copy_from(hx)
        y.copy_from(hy)
        g1 = _captured_saxpy(rt, o1, x, y, 2.0, n)
        st.callback(g1.destroy)
        with rt.capture() as g3:
            rt.launch(_fn(rt, "add_one"), _grid(n), BLOCK, [o3.ptr, x.ptr, np.int32(n)])
            _saxpy(rt, o4, x, y, 0.5, n)
        st.callback(g3.destroy)
        assert g1.update(g3) is False
        assert g1.reinstantiations == 1 and g1.num_nodes == 2
        for d in (o1, o3, o4):
            d.fill_bytes(0xFF)
        g1.replay()
        _check_close(o3.numpy(), hx.astype(np.float64) + 1.0)
        _check_close(o4.numpy(), _saxpy_ref(hx, hy, 0.5))
        assert np.all(np.isnan(o1.numpy()))
        # A graph destroyed after the update does not break the updated one.
        g3.destroy()
        o3.fill_bytes(0xFF)
        g1.replay()
        _check_close(o3.numpy(), hx.astype(np.float64) + 1.0)


def test_update_from_a_graph_that_was_itself_updated(ledger, rng):
    # Graph.update documents that after g1.update(g2), g1 "holds a copy of g2's topology and
    # parameters either way"; so updating g3 from g1 must give g2's arguments, not the ones
    # g1 was first captured with.
    rt = ledger
    n = 999
    with ExitStack() as st, _no_capture_left(rt):
        x, y, o1, o2, o3 = (st.enter_context(DeviceArray(rt, (n,), np.float32)) for _ in range(5))
        hx, hy = _rand(rng, n), _rand(rng, n)
        x.copy_from(hx)
        y.copy_from(hy)
        g1 = _captured_saxpy(rt, o1, x, y, 1.0, n)
        g2 = _captured_saxpy(rt, o2, x, y, 2.0, n)
        g3 = _captured_saxpy(rt, o3, x, y, 3.0, n)
        for g in (g1, g2, g3):
            st.callback(g.destroy)
        assert g1.update(g2)
        g3.update(g1)
        for d in (o1, o2, o3):
            d.fill_bytes(0xFF)
        g3.replay()
        # With the bug, g3 runs g1's original arguments: o2 stays poisoned and o1 is written.
        _check_close(o2.numpy(), _saxpy_ref(hx, hy, 2.0))
        assert np.all(np.isnan(o1.numpy())) and np.all(np.isnan(o3.numpy()))


ILLEGAL = ["alloc_raw", "free_raw", "synchronize", "dtoh", "htod", "latch.read", "latch.check",
           "DeviceArray"]


@pytest.mark.parametrize("ending", ["end", "abort"])
@pytest.mark.parametrize("op", ILLEGAL)
def test_capture_illegal_calls_raise_and_capture_survives(ledger, rng, op, ending):
    rt = ledger
    n = 1000
    with ExitStack() as st, _no_capture_left(rt):
        dx, dy, out, spare = (st.enter_context(DeviceArray(rt, (n,), np.float32)) for _ in range(4))
        x, y = _rand(rng, n), _rand(rng, n)
        dx.copy_from(x)
        dy.copy_from(y)
        out.fill_bytes(0xFF)
        before = rt.memory_stats()
        call = {
            "alloc_raw": lambda: rt.alloc_raw(256),
            "free_raw": lambda: rt.free_raw(spare.ptr),
            "synchronize": rt.synchronize,
            "dtoh": lambda: rt.dtoh(np.empty(n, np.float32), dx.ptr),
            "htod": lambda: rt.htod(dx.ptr, x),
            "latch.read": rt.latch.read,
            "latch.check": rt.latch.check,
            "DeviceArray": lambda: DeviceArray(rt, (4,), np.float32),
        }[op]
        rt.begin_capture()
        _saxpy(rt, out, dx, dy, 2.0, n)
        with pytest.raises(CaptureError):
            call()
        assert rt.is_capturing()  # the refusal did not break the capture
        assert rt.memory_stats() == before  # nothing allocated or freed
        if ending == "end":
            rt.launch(_fn(rt, "add_one"), _grid(n), BLOCK, [spare.ptr, out.ptr, np.int32(n)])
            g = rt.end_capture()
            st.callback(g.destroy)
            assert g.num_nodes == 2
            spare.fill_bytes(0xFF)
            g.replay()
            _check_close(out.numpy(), _saxpy_ref(x, y, 2.0))
            _check_close(spare.numpy(), _saxpy_ref(x, y, 2.0) + 1.0)
        else:
            rt.abort_capture()
            assert not rt.is_capturing()
            assert np.all(np.isnan(out.numpy()))  # nothing of the aborted capture ran
        # The stream works eagerly afterwards.
        out.fill_bytes(0xFF)
        _saxpy(rt, out, dx, dy, -1.0, n)
        rt.synchronize()
        _check_close(out.numpy(), _saxpy_ref(x, y, -1.0))


def test_exception_inside_capture_aborts_cleanly(ledger, rng):
    rt = ledger
    n = 513
    with ExitStack() as st, _no_capture_left(rt):
        dx, dy, out = (st.enter_context(DeviceArray(rt, (n,), np.float32)) for _ in range(3))
        x, y = _rand(rng, n), _rand(rng, n)
        dx.copy_from(x)
        dy.copy_from(y)
        with pytest.raises(RuntimeError, match="boom"):
            with rt.capture() as g:
                _saxpy(rt, out, dx, dy, 2.0, n)
                raise RuntimeError("boom")
        assert not rt.is_capturing() and not g.ready
        with pytest.raises(CaptureError):
            g.replay()
        # An uncaught capture-illegal call inside the block aborts the same way.
        with pytest.raises(CaptureError):
            with rt.capture():
                _saxpy(rt, out, dx, dy, 2.0, n)
                rt.synchronize()
        assert not rt.is_capturing()
        out.fill_bytes(0xFF)
        _saxpy(rt, out, dx, dy, 4.0, n)
        _check_close(out.numpy(), _saxpy_ref(x, y, 4.0))
        # And a new capture works.
        with rt.capture() as g2:
            _saxpy(rt, out, dx, dy, 5.0, n)
        st.callback(g2.destroy)
        out.fill_bytes(0xFF)
        g2.replay()
        _check_close(out.numpy(), _saxpy_ref(x, y, 5.0))


# -- the latch --------------------------------------------------------------------------------

def test_latch_set_during_replay_is_read_decoded_and_cleared(ledger, rng):
    rt = ledger
    n = 37
    bit = INDEX_SHARE_SELECTED_INDICES
    assert bit == 512
    with ExitStack() as st, _no_capture_left(rt):
        flags = st.enter_context(DeviceArray(rt, (n,), np.int32))
        flags.copy_from(np.zeros(n, np.int32))
        rt.latch.read()  # start clean (clears whatever an earlier test left)
        with rt.capture() as g:
            rt.launch(_fn(rt, "latch_if"), 1, 64,
                      [rt.capture_error_ptr(), flags.ptr, np.int32(n), np.uint32(bit)])
        st.callback(g.destroy)
        g.replay()
        rt.latch.check()  # all flags clear: nothing latched
        bad = np.zeros(n, np.int32)
        bad[29] = 7
        flags.copy_from(bad)
        g.replay()
        g.replay()
        with pytest.raises(CaptureError) as info:
            rt.latch.check()
        err = info.value
        assert err.bits == 512
        assert WELL_KNOWN_BITS[512] in err.names and len(err.names) == 1
        assert "IndexShare" in str(err)
        rt.latch.check()  # cleared by the first check
        assert rt.latch.read() == 0
        # read(clear=False) leaves the word set.
        g.replay()
        assert rt.latch.read(clear=False) == 512
        assert rt.latch.read() == 512
        assert rt.latch.read() == 0


def test_latch_names_every_set_bit(ledger):
    rt = ledger
    mine = rt.latch.register(1 << 27, "attnrt test: runtime bit")
    assert mine == 1 << 27
    unregistered = 1 << 28
    word = 512 | mine | unregistered
    rt.latch.read()
    with ExitStack() as st:
        flags = st.enter_context(DeviceArray(rt, (1,), np.int32))
        flags.copy_from(np.ones(1, np.int32))
        rt.launch(_fn(rt, "latch_if"), 1, 32, [rt.capture_error_ptr(), flags.ptr, np.int32(1),
                                               np.uint32(word)])
        with pytest.raises(CaptureError) as info:
            rt.latch.check()
    assert info.value.bits == word
    assert info.value.names == (WELL_KNOWN_BITS[512], "attnrt test: runtime bit",
                                f"unregistered bit 0x{unregistered:x}")
    rt.latch.check()


def test_latch_register_validation(rt):
    latch = rt.latch
    assert latch.names[512] == WELL_KNOWN_BITS[512]
    assert latch.register(512, WELL_KNOWN_BITS[512]) == 512  # same name again: a no-op
    with pytest.raises(ValueError):
        latch.register(512, "someone else")
    for bad in (0, -4, 3, 6, 2**32, 2**40, 1.0, "512"):
        with pytest.raises(ValueError):
            latch.register(bad, "bad bit")  # type: ignore[arg-type]
    assert latch.register(1 << 26, "attnrt test: validation") == 1 << 26
    assert latch.register(1 << 26, "attnrt test: validation") == 1 << 26
    assert latch.decode((1 << 26) | (1 << 29)) == ["attnrt test: validation", "unregistered bit 0x20000000"]
    assert latch.decode(0) == []


# -- several runtimes, lifetime ---------------------------------------------------------------

def test_compiled_and_python_launch_paths_agree(ledger, rng):
    rt = ledger
    compiled = REPO.joinpath("attnrt").glob("_launchc*.so")
    if any(compiled) and os.environ.get("ATTNRT_COMPILED_LAUNCH", "1") != "0":
        assert rt.compiled_launch, "attnrt.runtime._launchc is built but CudaRuntime.launch does not use it"
    n = 3001
    x, y = _rand(rng, n), _rand(rng, n)
    f = _fn(rt, "saxpy")
    with DeviceArray.from_numpy(rt, x) as dx, DeviceArray.from_numpy(rt, y) as dy, \
            DeviceArray(rt, (n,), np.float32) as out:
        for k, launch in enumerate((rt.launch, rt._launch_py, rt.launch)):
            out.fill_bytes(0xFF)
            before = rt.launch_count
            # grid as an int, a tuple and a list: hot path, Python path, normalised key
            grid = (_grid(n), [_grid(n), 1, 1], (_grid(n), 1, 1))[k]
            launch(f, grid, BLOCK, [out.ptr, dx.ptr, dy.ptr, np.float32(k + 0.5), np.int32(n)])
            assert rt.launch_count == before + 1
            _check_close(out.numpy(), _saxpy_ref(x, y, k + 0.5))
        # Argument errors are the same TypeError on both paths, and nothing is launched.
        before = rt.launch_count
        for launch in (rt.launch, rt._launch_py):
            with pytest.raises(TypeError):
                launch(f, _grid(n), BLOCK, [out.ptr, dx.ptr, dy.ptr, 1.5, np.int32(n)])
            with pytest.raises(TypeError):
                launch(f, _grid(n), BLOCK, [])
        assert rt.launch_count == before


def test_two_runtimes_interleaved(ledger, rng):
    rt1 = ledger
    n = 10_007
    x1, y1, x2, y2 = (_rand(rng, n) for _ in range(4))
    rt2 = attnrt.CudaRuntime(0)
    try:
        assert rt2.stream.ptr != rt1.stream.ptr
        f1, f2 = _fn(rt1, "saxpy"), _fn(rt2, "saxpy")
        assert f1 is not f2
        a1 = [DeviceArray.from_numpy(rt1, v) for v in (x1, y1)] + [DeviceArray(rt1, (n,), np.float32)]
        a2 = [DeviceArray.from_numpy(rt2, v) for v in (x2, y2)] + [DeviceArray(rt2, (n,), np.float32)]
        assert rt2.memory_stats().live_count == 3
        for k in range(3):
            a1[2].fill_bytes(0xFF)
            a2[2].fill_bytes(0xFF)
            rt1.launch(f1, _grid(n), BLOCK, [a1[2].ptr, a1[0].ptr, a1[1].ptr, np.float32(k), np.int32(n)])
            rt2.launch(f2, _grid(n), BLOCK, [a2[2].ptr, a2[0].ptr, a2[1].ptr, np.float32(-k), np.int32(n)])
            r2 = a2[2].numpy()
            r1 = a1[2].numpy()
            _check_close(r1, _saxpy_ref(x1, y1, k))
            _check_close(r2, _saxpy_ref(x2, y2, -k))
        # Each ledger knows only its own pointers.
        with pytest.raises(ValueError):
            rt1.free_raw(a2[0].ptr)
        for d in a2:
            d.free()
        assert rt2.memory_stats().live_bytes == 0
        for d in a1:
            d.free()
    finally:
        rt2.close()
    rt2.close()  # idempotent
    assert "closed=True" in repr(rt2)
    with pytest.raises(ValueError, match="closed"):
        rt2.alloc_raw(8)
    # The first runtime is undisturbed by the second one's close.
    with DeviceArray.from_numpy(rt1, x1) as dx, DeviceArray.from_numpy(rt1, y1) as dy, \
            DeviceArray(rt1, (n,), np.float32) as out:
        _saxpy(rt1, out, dx, dy, 0.5, n)
        _check_close(out.numpy(), _saxpy_ref(x1, y1, 0.5))


def test_runtime_context_manager_frees_leaks_with_a_warning(rt):
    with pytest.warns(ResourceWarning, match="1 live allocation"):
        with attnrt.CudaRuntime(0) as r:
            r.alloc_raw(1000)
    assert "closed=True" in repr(r)


def _run_child(code: str, env_extra: dict, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=str(cwd), timeout=180)


_RISKY_CHILD = r"""
import sys
import numpy as np
import attnrt
src = open(SRC_PATH).read()
case = CASE
keep = attnrt.CudaRuntime(0)  # keeps the primary context alive
rt = attnrt.CudaRuntime(0)
fn = rt.nvrtc_function("nxrt_test_risky", src, "two_ints")
if case == "closed-runtime":
    rt.launch(fn, 1, 1, [np.int32(1), np.int32(2)])  # parameter layout known, packer cached
    rt.synchronize()
    rt.close()  # unloads the module, destroys the stream
    want = ValueError
    args = [np.int32(1), np.int32(2)]
else:  # "no-args": an empty list for a kernel that takes two ints is the wrong count
    want = TypeError
    args = []
count = rt.launch_count
try:
    rt.launch(fn, 1, 1, args)
    if case != "closed-runtime":
        rt.synchronize()
    print("RESULT launched", rt.launch_count - count)
except want as exc:
    print("RESULT", want.__name__, rt.launch_count - count, exc)
except Exception as exc:
    print("RESULT", type(exc).__name__, rt.launch_count - count, exc)
rt.close()
keep.synchronize()
keep.close()
"""


@pytest.mark.parametrize("case,want", [("no-args", "TypeError"), ("closed-runtime", "ValueError")])
def test_refused_launches_in_a_child(rt, tmp_path, case, want):
    # These launches reach the driver with no parameters (a kernel that takes two) or with a
    # destroyed stream when attnrt does not refuse them first; a child process keeps a crash
    # from taking the test session down.
    src = tmp_path / "k.cu"
    src.write_text(SRC)
    code = _RISKY_CHILD.replace("SRC_PATH", repr(str(src))).replace("CASE", repr(case))
    res = _run_child(code, {}, tmp_path)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT")]
    assert lines, f"child died before reporting (rc {res.returncode}): {res.stderr[-3000:]}"
    assert lines[-1].startswith(f"RESULT {want} 0"), (lines[-1], res.stderr[-2000:])
    assert res.returncode == 0, res.stderr[-3000:]


_WARM_CHILD = r"""
import json, sys
import numpy as np
import attnrt
src = open(SRC_PATH).read()
rt = attnrt.CudaRuntime(0)
fn = rt.nvrtc_function("nxrt_test_warm", src, "saxpy")
n = 1001
x = np.arange(n, dtype=np.float32)
y = np.ones(n, dtype=np.float32)
px, py, po = (rt.alloc_raw(n * 4) for _ in range(3))
rt.htod(px, x); rt.htod(py, y); rt.memset(po, 0xFF, n * 4)
rt.launch(fn, (n + 127) // 128, 128, [po, px, py, np.float32(2.0), np.int32(n)])
out = rt.dtoh(np.empty(n, np.float32), po)
for p in (px, py, po):
    rt.free_raw(p)
ok = bool(np.allclose(out, 2.0 * x + 1.0))
print(json.dumps({"stats": rt.cache.stats.as_dict(), "ok": ok, "dir": str(rt.cache.directory),
                  "disk": rt.cache.disk}))
rt.close()
"""


def test_warm_disk_cache_means_zero_compiles_in_a_fresh_process(rt, tmp_path):
    cache_dir = tmp_path / "cache"
    src = tmp_path / "warm.cu"
    src.write_text(SRC)
    warm = CompileCache(cache_dir, disk=True)
    warm.get(SRC, "nxrt_test_warm.cu", rt.arch)  # what an earlier process (or `attnrt warm`) left
    assert warm.stats.compiles == 1 and warm.stats.writes == 1
    code = _WARM_CHILD.replace("SRC_PATH", repr(str(src)))
    res = _run_child(code, {"ATTNRT_CACHE_DIR": str(cache_dir), "ATTNRT_CACHE": "1"}, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["dir"] == str(cache_dir) and report["disk"] is True
    assert report["ok"], "the kernel loaded from the disk cache computed a wrong result"
    stats = report["stats"]
    assert stats["compiles"] == 0 and stats["misses"] == 0, stats
    assert stats["disk_hits"] == 1 and stats["bad_entries"] == 0, stats


PDL_SRC = r'''
// A producer that lets its dependents launch before it writes (griddepcontrol), and a
// consumer that may only read after griddepcontrol.wait: without the wait, or with a
// launch path that dropped the programmatic attribute's ordering, it reads poison.
extern "C" __global__ void pdl_producer(float* out, const float* in, int n, long long spin) {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  long long t0 = clock64();
  while (clock64() - t0 < spin) {}
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * in[i];
}
extern "C" __global__ void pdl_consumer(float* out, const float* in, int n) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + 1.0f;
}
'''


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "graph"])
def test_programmatic_dependent_launch(ledger, rng, captured):
    """``launch(..., programmatic=True)``: the consumer starts under the producer (which
    triggers its dependents before writing) and still reads the producer's output, eagerly
    and as a programmatic edge of a captured graph; the launch takes the Python path."""
    rt = ledger
    if rt.capabilities.compute_capability < (9, 0):
        pytest.skip("programmatic dependent launch needs cc >= 9.0")
    prod = rt.nvrtc_function("nxrt_test_pdl", PDL_SRC, "pdl_producer")
    cons = rt.nvrtc_function("nxrt_test_pdl", PDL_SRC, "pdl_consumer")
    n = 70_001
    x = _rand(rng, n)
    with ExitStack() as st, _no_capture_left(rt):
        dx, mid, out = (st.enter_context(DeviceArray(rt, (n,), np.float32)) for _ in range(3))
        dx.copy_from(x)

        def step():
            rt.launch(prod, _grid(n), BLOCK, [mid.ptr, dx.ptr, np.int32(n), np.int64(200_000)])
            rt.launch(cons, _grid(n), BLOCK, [out.ptr, mid.ptr, np.int32(n)], programmatic=True)

        graph = None
        if captured:
            with rt.capture() as graph:
                step()
            st.callback(graph.destroy)
        for _ in range(3):
            mid.fill_bytes(0xFF)
            out.fill_bytes(0xFF)
            graph.replay() if graph is not None else step()
            assert np.array_equal(out.numpy(), 2.0 * x + 1.0)
