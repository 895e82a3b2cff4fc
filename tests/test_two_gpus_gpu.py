"""Two GPUs in one process: one CudaRuntime per device, both running every op at the same
time from two threads, results checked against the float64 references, one compile cache.

Needs a machine with at least two CUDA devices (the H200 x2 machine); elsewhere those tests skip
with the device count. The stream-bound path also runs on one GPU (two runtimes, two torch streams).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import attnrt
from attnrt.app import demo

pytestmark = pytest.mark.gpu

ROUNDS = 2


@pytest.fixture
def second_rt(rt):
    n = attnrt.device_count()
    if n < 2:
        pytest.skip(f"two-GPU test: this machine has {n} CUDA device(s)")
    other = attnrt.CudaRuntime(1)
    try:
        yield other
    finally:
        live = other.memory_stats().live_bytes
        other.close()
        assert live == 0, f"device 1 leaked {live} bytes"


def _cfg(seed: int) -> demo.DemoConfig:
    return demo.DemoConfig(layers=4, steps=6, seed=seed, prompts=(45, 29))


def test_one_runtime_per_gpu_running_all_ops_concurrently(ledger, second_rt):
    rt0, rt1 = ledger, second_rt
    assert (rt0.capabilities.ordinal, rt1.capabilities.ordinal) == (0, 1)
    assert rt0.cache is rt1.cache, "runtimes should share the process-wide compile cache"
    assert rt0.stream.ptr != rt1.stream.ptr

    # Warm-up on device 0 alone: every kernel the demo needs is compiled once here.
    warm = demo.run_demo(_cfg(seed=11), rt=rt0, say=lambda _s: None)
    assert warm["ok"], warm["failures"]
    compiles = rt0.cache.stats.compiles

    barrier = threading.Barrier(2)
    reports: dict[int, list[dict]] = {0: [], 1: []}
    spans: dict[int, tuple[float, float]] = {}
    errors: list[BaseException] = []

    def worker(idx: int, rt: attnrt.CudaRuntime) -> None:
        try:
            barrier.wait(timeout=60)
            t0 = time.perf_counter()
            for r in range(ROUNDS):
                # Different seeds per device and round: a result that crossed devices or
                # threads would not match its own reference.
                reports[idx].append(demo.run_demo(_cfg(seed=100 * idx + r), rt=rt, say=lambda _s: None))
            spans[idx] = (t0, time.perf_counter())
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i, r), name=f"gpu{i}")
               for i, r in enumerate((rt0, rt1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    if errors:
        raise errors[0]

    for idx in (0, 1):
        assert len(reports[idx]) == ROUNDS
        for rep in reports[idx]:
            assert rep["ok"], (idx, rep["failures"])
            for phase in ("prefill", "eager", "replay", "caches"):
                for op, err in rep["max_rel_err"][phase].items():
                    assert np.isfinite(err) and err <= demo.TOL, (idx, phase, op, err)
            assert rep["ledger"]["live_bytes"] == 0
            assert rep["decode"]["replays"] == 6
    # The two workers really overlapped in time.
    (a0, a1), (b0, b1) = spans[0], spans[1]
    assert min(a1, b1) > max(a0, b0), spans
    # Shared cache: device 1 loaded the modules device 0 compiled; nothing was recompiled.
    assert rt0.cache.stats.compiles == compiles
    assert rt1.launch_count > 0 and rt0.launch_count > 0
    rt0.latch.check()
    rt1.latch.check()


def test_closing_one_gpu_runtime_leaves_the_other_working(ledger, second_rt, rng):
    rt0, rt1 = ledger, second_rt
    src = r'''
extern "C" __global__ void scale_add(float* out, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + 1.0f;
}'''
    n = 4099
    x = rng.standard_normal(n).astype(np.float32)
    extra = attnrt.CudaRuntime(1)  # a second runtime on device 1, closed mid-way
    outs: list = []
    try:
        for r in (rt0, rt1, extra):
            fn = r.nvrtc_function("nxrt_test_two_gpus", src, "scale_add")
            dx = attnrt.DeviceArray.from_numpy(r, x)
            do = attnrt.DeviceArray(r, (n,), np.float32)
            outs.append((r, fn, dx, do))
            do.fill_bytes(0xFF)
            a = np.float32(r.capabilities.ordinal + 2)  # 2 on device 0, 3 on device 1
            r.launch(fn, (n + 127) // 128, 128, [do.ptr, dx.ptr, a, np.int32(n)])
        extra_out = outs[2][3].numpy()
        for d in outs.pop()[2:]:
            d.free()
        extra.close()
        # a*x + 1 may be one fused multiply-add on the device: compare at f32 rounding.
        np.testing.assert_allclose(extra_out, 3 * x + 1, rtol=1e-5, atol=1e-6)
        for r, fn, dx, do in outs:
            # Both remaining runtimes still launch after the third one closed.
            do.fill_bytes(0xFF)
            r.launch(fn, (n + 127) // 128, 128, [do.ptr, dx.ptr, np.float32(-1.5), np.int32(n)])
            np.testing.assert_allclose(do.numpy(), -1.5 * x + 1, rtol=1e-5, atol=1e-6)
    finally:
        for _r, _fn, dx, do in outs:
            dx.free()
            do.free()
        extra.close()


def _bound_worker(idx: int, rt: attnrt.CudaRuntime, seed: int, barrier: threading.Barrier,
                  reports: dict[int, dict], errors: list[BaseException]) -> None:
    try:
        barrier.wait(timeout=60)
        reports[idx] = demo.run_demo(_cfg(seed=seed), rt=rt, say=lambda _s: None)
    except BaseException as exc:  # reported by the main thread
        errors.append(exc)


def _run_bound_pair(rts: list[attnrt.CudaRuntime], seeds: tuple[int, int]) -> dict[int, dict]:
    barrier = threading.Barrier(2)
    reports: dict[int, dict] = {}
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_bound_worker, args=(i, r, seeds[i], barrier, reports, errors))
               for i, r in enumerate(rts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    if errors:
        raise errors[0]
    for idx, rep in reports.items():
        assert rep["ok"], (idx, rep["failures"])
        assert rep["ledger"]["live_bytes"] == 0
        for phase in ("prefill", "eager", "replay", "caches"):
            for op, err in rep["max_rel_err"][phase].items():
                assert np.isfinite(err) and err <= demo.TOL, (idx, phase, op, err)
    return reports


def _bound_runtime(torch, device: int):
    stream = torch.cuda.Stream(device=device)
    return stream, attnrt.CudaRuntime(device, stream=stream)


def test_runtimes_bound_to_torch_streams_on_two_gpus(rt):
    """The caller's-stream path on two devices: each runtime runs the whole demo (eager,
    capture, replay) on a torch stream it does not own, both at once."""
    torch = pytest.importorskip("torch")
    n = attnrt.device_count()
    if n < 2:
        pytest.skip(f"two-GPU test: this machine has {n} CUDA device(s)")
    pairs = [_bound_runtime(torch, d) for d in (0, 1)]
    try:
        for (stream, r), d in zip(pairs, (0, 1)):
            assert r.capabilities.ordinal == d and r.stream.ptr == stream.cuda_stream
        _run_bound_pair([r for _s, r in pairs], seeds=(7, 8))
    finally:
        for stream, r in pairs:
            r.close()
            stream.synchronize()  # still a valid torch stream after close(): not ours to destroy


def test_two_runtimes_bound_to_two_torch_streams_on_one_gpu(rt):
    """What one GPU allows of the stream-bound two-device test: two runtimes on device 0,
    each bound to its own torch stream, running the demo concurrently."""
    torch = pytest.importorskip("torch")
    pairs = [_bound_runtime(torch, 0) for _ in range(2)]
    try:
        assert pairs[0][1].stream.ptr != pairs[1][1].stream.ptr
        _run_bound_pair([r for _s, r in pairs], seeds=(21, 22))
    finally:
        for stream, r in pairs:
            r.close()
            stream.synchronize()
