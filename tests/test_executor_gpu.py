"""The reference executor with a small two-launch kernel that uses a workspace."""

from __future__ import annotations

import numpy as np
import pytest

import attnrt
from attnrt.runtime.api import CaptureSupport, DataType, Node, WorkspaceRequirement
from attnrt.runtime.executor import Executor

pytestmark = pytest.mark.gpu

SRC = r'''
extern "C" __global__ void scale(const float* x, float* tmp, float a, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) tmp[i] = a * x[i];
}
extern "C" __global__ void add(const float* tmp, const float* b, float* y, long long n,
                               unsigned int* latch) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) {
    float v = tmp[i] + b[i];
    if (isnan(v)) atomicOr(latch, 1u << 20);  // bad data seen inside a graph: latch it
    y[i] = v;
  }
}
'''


class AxpbKernel:
    def __init__(self, rt, a: float, capturable: bool = True) -> None:
        self.rt, self.a, self.capturable = rt, a, capturable
        self.scale = rt.nvrtc_function("test_axpb", SRC, "scale")
        self.add = rt.nvrtc_function("test_axpb", SRC, "add")

    def workspace_requirement(self, inputs):
        return WorkspaceRequirement(inputs[0].nbytes, alignment=256)

    def execute(self, inputs, outputs, workspace=None):
        x, b = inputs
        (y,) = outputs
        if workspace is None or workspace.nbytes < x.nbytes:
            raise attnrt.WorkspaceError("short", required=x.nbytes, provided=0)
        n = np.int64(x.numel)
        grid = (x.numel + 255) // 256
        self.rt.launch(self.scale, grid, 256, [x.ptr, workspace.ptr, np.float32(self.a), n])
        self.rt.launch(self.add, grid, 256, [workspace.ptr, b.ptr, y.ptr, n, self.rt.capture_error_ptr()])

    def capture_support(self):
        return CaptureSupport.yes() if self.capturable else CaptureSupport.no("not warmed for this shape")

    def supports_strided_input(self, index):
        return False


class AxpbFactory:
    def __init__(self, rt, capturable: bool = True) -> None:
        self.rt, self.capturable = rt, capturable

    def unsupported_reason(self, node, shapes, dtypes):
        if any(d != DataType.FLOAT for d in dtypes):
            return "only float32"
        return None

    def create(self, node, input_shapes):
        return AxpbKernel(self.rt, node.attr_float("a"), self.capturable)


@pytest.fixture
def setup(ledger, rng):
    rt = ledger
    rt.latch.register(1 << 20, "test: NaN seen by add")
    n = 10_007
    arrays = {k: attnrt.DeviceArray(rt, (n,), np.float32) for k in ("x", "b", "y")}
    ex = Executor(rt)
    for k, arr in arrays.items():
        ex.bind(k, arr.mut() if k == "y" else arr.view())
    yield rt, ex, arrays, n
    ex.close()
    for arr in arrays.values():
        arr.free()


def test_plan_run_capture_replay(setup, rng):
    rt, ex, arrs, n = setup
    ex.add(Node("Axpb", "test", {"a": 1.5}, ["x", "b"], ["y"]), AxpbFactory(rt))
    x, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    arrs["x"].copy_from(x)
    arrs["b"].copy_from(b)
    arrs["y"].fill_bytes(0xFF)
    ex.run()
    np.testing.assert_allclose(arrs["y"].numpy(), 1.5 * x + b, rtol=1e-6)
    assert ex.steps[0].workspace_ptr % 256 == 0
    ex.capture()
    for _ in range(3):  # new contents in place, then replay
        x = rng.standard_normal(n).astype(np.float32)
        arrs["x"].copy_from(x)
        arrs["y"].fill_bytes(0xFF)
        ex.replay()
        np.testing.assert_allclose(arrs["y"].numpy(), 1.5 * x + b, rtol=1e-6)


def test_replay_latches_bad_data(setup, rng):
    rt, ex, arrs, n = setup
    ex.add(Node("Axpb", "test", {"a": 2.0}, ["x", "b"], ["y"]), AxpbFactory(rt))
    arrs["x"].copy_from(rng.standard_normal(n).astype(np.float32))
    arrs["b"].copy_from(rng.standard_normal(n).astype(np.float32))
    ex.capture()
    bad = rng.standard_normal(n).astype(np.float32)
    bad[17] = np.nan
    arrs["x"].copy_from(bad)
    with pytest.raises(attnrt.CaptureError) as info:
        ex.replay()
    assert info.value.bits == 1 << 20 and "test: NaN seen by add" in info.value.names
    rt.latch.check()  # cleared by the failing check


def test_capture_refused_with_the_kernels_reason(setup):
    rt, ex, arrs, n = setup
    arrs["x"].fill_bytes(0x3C)
    arrs["b"].fill_bytes(0x3C)
    ex.add(Node("Axpb", "test", {"a": 2.0}, ["x", "b"], ["y"]), AxpbFactory(rt, capturable=False))
    with pytest.raises(attnrt.CaptureError, match="not warmed for this shape"):
        ex.capture()
    assert not rt.is_capturing()


def test_unsupported_node_is_refused(setup):
    rt, ex, arrs, n = setup
    ex.bind("i", attnrt.TensorView(arrs["x"].ptr, DataType.INT32, (n,)))
    with pytest.raises(attnrt.Unsupported, match="only float32"):
        ex.add(Node("Axpb", "test", {"a": 1.0}, ["i", "b"], ["y"]), AxpbFactory(rt))


def test_rebinding_after_capture_is_refused(setup):
    rt, ex, arrs, n = setup
    arrs["x"].fill_bytes(0x3C)
    arrs["b"].fill_bytes(0x3C)
    ex.add(Node("Axpb", "test", {"a": 1.0}, ["x", "b"], ["y"]), AxpbFactory(rt))
    ex.capture()
    with pytest.raises(attnrt.CaptureError, match="copy the new contents"):
        ex.bind("x", arrs["b"].view())
