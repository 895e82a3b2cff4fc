"""The compiled launch path (``attnrt.runtime._launchc``) without a GPU: the driver entry point is a
ctypes callback that records what it receives, so every branch of the hot path and every
hand-off to the Python path is checked on the CPU.

CI sets ``ATTNRT_REQUIRE_LAUNCHC=1``: there a missing extension (the install step did not
build it) fails instead of skipping.
"""

from __future__ import annotations

import ctypes
import os
import threading

import pytest

try:
    from attnrt.runtime import _launchc
except ImportError as exc:  # not built (no C compiler at install time)
    if os.environ.get("ATTNRT_REQUIRE_LAUNCHC") == "1":
        raise
    pytest.skip(f"attnrt.runtime._launchc is not built: {exc}", allow_module_level=True)

PROTO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class FakeDriver:
    """cuLaunchKernelEx stand-in: records (config, kernel, params, extra); returns ``rc``."""

    def __init__(self, rc: int = 0) -> None:
        self.calls: list[tuple] = []
        self.rc = rc
        self.gil_released: list[bool] = []
        self.cb = PROTO(self._call)
        self.address = ctypes.cast(self.cb, ctypes.c_void_p).value

    def _call(self, cfg, fn, params, extra) -> int:
        self.calls.append((cfg, fn, params, extra))
        return self.rc


class FakeFunction:
    def __init__(self, handle: int = 0xABC000, params: tuple | None = ()) -> None:
        self.handle_int = handle
        self._params = params
        self.packed: list = []
        self.shared: list[int] = []
        self.buf = (ctypes.c_void_p * 2)()

    def pack_c(self, args):
        if any(isinstance(a, str) for a in args):
            raise TypeError("bad argument kind")
        self.packed.append(list(args))
        return ctypes.c_void_p(ctypes.addressof(self.buf))

    def ensure_shared(self, n: int) -> None:
        if n > 232448:
            raise ValueError("too much shared memory")
        self.shared.append(n)


@pytest.fixture
def setup():
    drv = FakeDriver()
    configs: dict = {}
    slow_calls: list = []
    errors: list = []

    def slow(*args, **kw):  # CudaRuntime._launch_py's stand-in: records exactly what it got
        slow_calls.append(args + tuple(kw.values()))
        return "slow"

    def on_error(err, fn, grid, block, shared_mem):
        errors.append((err, fn, grid, block, shared_mem))
        raise RuntimeError(f"launch failed: {err}")

    lau = _launchc.Launcher(drv.address, configs, slow, on_error)
    return lau, drv, configs, slow_calls, errors


def test_hot_path_without_arguments(setup):
    lau, drv, configs, slow_calls, _ = setup
    configs[(4, 128, 0)] = (0x1000, object())
    fn = FakeFunction()
    assert lau.launch(fn, 4, 128, ()) is None
    assert lau.launch(fn, 4, 128, [], 0) is None
    assert drv.calls == [(0x1000, 0xABC000, None, None)] * 2
    assert lau.count == 2 and not slow_calls and not fn.packed


def test_hot_path_packs_arguments(setup):
    lau, drv, configs, slow_calls, _ = setup
    configs[((2, 3, 1), (32, 4, 1), 1024)] = (0x2000, None)
    fn = FakeFunction(params=((0, 8),))
    lau.launch(fn, (2, 3, 1), (32, 4, 1), [7, 8], 1024)
    assert fn.packed == [[7, 8]]
    assert drv.calls == [(0x2000, 0xABC000, ctypes.addressof(fn.buf), None)]
    assert lau.count == 1 and not slow_calls and not fn.shared


def test_large_shared_memory_raises_the_limit_first(setup):
    lau, drv, configs, _, _ = setup
    configs[(1, 256, 100_000)] = (0x3000, None)
    fn = FakeFunction()
    lau.launch(fn, 1, 256, (), 100_000)
    assert fn.shared == [100_000] and len(drv.calls) == 1
    configs[(1, 256, 300_000)] = (0x3000, None)
    with pytest.raises(ValueError, match="too much shared memory"):
        lau.launch(fn, 1, 256, (), 300_000)
    assert len(drv.calls) == 1 and lau.count == 1  # nothing launched


@pytest.mark.parametrize("call", [
    "new_config", "keyword", "unhashable_grid", "unchecked_params", "params_needed", "numpy_shm",
    "too_few", "too_many",
])
def test_everything_else_goes_to_the_python_path(setup, call):
    import numpy as np

    lau, drv, configs, slow_calls, _ = setup
    configs[(1, 32, 0)] = (0x1000, None)
    configs[(1, 32, np.int64(5))] = (0x1000, None)
    fn = FakeFunction()
    args: tuple
    kw: dict = {}
    if call == "new_config":
        args = (fn, 2, 32, ())
    elif call == "keyword":
        args, kw = (fn, 1, 32, ()), {"shared_mem": 0}
    elif call == "unhashable_grid":
        args = (fn, [1, 1, 1], 32, ())
    elif call == "unchecked_params":  # empty args, but the kernel's layout is not known yet
        fn._params = None
        args = (fn, 1, 32, ())
    elif call == "params_needed":
        fn._params = ((0, 8),)
        args = (fn, 1, 32, ())
    elif call == "numpy_shm":
        args = (fn, 1, 32, (), np.int64(5))
    elif call == "too_few":
        args = (fn, 1, 32)
    else:
        args = (fn, 1, 32, (), 0, "extra")
    assert lau.launch(*args, **kw) == "slow"
    assert slow_calls == [args + tuple(kw.values())]
    assert not drv.calls and lau.count == 0


def test_driver_error_goes_to_on_error_and_is_not_counted(setup):
    lau, drv, configs, _, errors = setup
    drv.rc = 700
    configs[(1, 32, 0)] = (0x1000, None)
    fn = FakeFunction()
    with pytest.raises(RuntimeError, match="launch failed: 700"):
        lau.launch(fn, 1, 32, ())
    assert errors == [(700, fn, 1, 32, 0)] and lau.count == 0


def test_packing_errors_propagate_before_any_launch(setup):
    lau, drv, configs, slow_calls, _ = setup
    configs[(1, 32, 0)] = (0x1000, None)
    fn = FakeFunction(params=((0, 8),))
    with pytest.raises(TypeError, match="bad argument kind"):
        lau.launch(fn, 1, 32, ["x"])
    assert not drv.calls and not slow_calls and lau.count == 0


def test_closed_runtime_cleared_configs_go_to_the_python_path(setup):
    lau, drv, configs, slow_calls, _ = setup
    configs[(1, 32, 0)] = (0x1000, None)
    fn = FakeFunction()
    lau.launch(fn, 1, 32, ())
    configs.clear()  # CudaRuntime.close() empties the dict the launcher holds
    assert lau.launch(fn, 1, 32, ()) == "slow"
    assert len(drv.calls) == 1 and len(slow_calls) == 1


def test_the_driver_call_runs_without_the_gil(setup):
    lau, drv, configs, _, _ = setup
    configs[(1, 32, 0)] = (0x1000, None)
    fn = FakeFunction()
    # The callback re-acquires the GIL itself; from several threads at once every launch lands.
    threads = [threading.Thread(target=lambda: [lau.launch(fn, 1, 32, ()) for _ in range(200)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(drv.calls) == 800 and lau.count == 800


def test_constructor_validation():
    drv = FakeDriver()
    with pytest.raises(TypeError, match="dict"):
        _launchc.Launcher(drv.address, [], print, print)
    with pytest.raises(TypeError, match="callable"):
        _launchc.Launcher(drv.address, {}, None, print)
    with pytest.raises(ValueError, match="address"):
        _launchc.Launcher(0, {}, print, print)
