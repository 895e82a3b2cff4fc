"""Runtime benchmarks: host launch overhead, compile cache, eager vs graph replay.

Rows (all "higher is better"):
- launch overhead on an empty kernel (and on a 6-argument kernel): launches per ms of host
  time for ``rt.launch`` beside cuda.core's ``launch``, CuPy's ``RawKernel`` and a bare
  ``cuLaunchKernel`` call (the floor of any cuda.bindings launcher);
- compile: cold compile vs warm disk cache vs in-memory fetch, each measured as the time
  from ``nvrtc_function`` to the end of the first launch; cold and warm run in fresh
  processes with one cache directory (``1/seconds``);
- a 50-kernel chain: host time per step eager vs one graph replay.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench import BenchContext, row

from attnrt.runtime._check import check, driver

EMPTY_SRC = 'extern "C" __global__ void empty_kernel() {}\n'
ARGS_SRC = r'''
extern "C" __global__ void args_kernel(float* a, const float* b, const float* c, float* d,
                                       int n, float alpha) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && alpha == 12345.0f) d[i] = a[i] + b[i] * c[i];
}
'''
CHAIN_SRC = r'''
extern "C" __global__ void bump(float* x, int n, float v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 0.5f + v;
}
'''

# A realistic translation unit for the compile benchmark: templates, bf16, unrolled loops.
COMPILE_SRC = r'''
#include <cuda_bf16.h>
#include <cuda_fp16.h>
template <typename T, int D, int TILE>
__device__ void tile_dot(const T* __restrict__ q, const T* __restrict__ k, float* out, int n) {
  float acc[TILE];
#pragma unroll
  for (int t = 0; t < TILE; ++t) acc[t] = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
#pragma unroll
    for (int t = 0; t < TILE; ++t) {
      float s = 0.f;
#pragma unroll
      for (int d = 0; d < D; ++d) s += float(q[t * D + d]) * float(k[(size_t)j * D + d]);
      acc[t] = fmaxf(acc[t], s);
    }
  }
#pragma unroll
  for (int t = 0; t < TILE; ++t) out[t * blockDim.x + threadIdx.x] = acc[t];
}
#define INST(T, D, TILE, NAME) \
  extern "C" __global__ void NAME(const T* q, const T* k, float* out, int n) { \
    tile_dot<T, D, TILE>(q, k, out, n); }
INST(__nv_bfloat16, 64, 4, dot_bf16_64) INST(__nv_bfloat16, 128, 4, dot_bf16_128)
INST(__nv_bfloat16, 256, 2, dot_bf16_256) INST(__half, 64, 4, dot_f16_64)
INST(__half, 128, 4, dot_f16_128) INST(__half, 256, 2, dot_f16_256)
INST(float, 64, 4, dot_f32_64) INST(float, 128, 4, dot_f32_128)
'''

_CHILD = r'''
import json, sys, time
t_start = time.perf_counter()
import numpy as np
import attnrt
rt = attnrt.CudaRuntime(0)
t_rt = time.perf_counter()
src = open(sys.argv[1]).read()
fn = rt.nvrtc_function("bench_compile", src, "dot_bf16_128")
buf = rt.alloc_raw(1 << 20)
rt.launch(fn, 1, 32, [buf, buf, buf, np.int32(0)])
rt.synchronize()
t_end = time.perf_counter()
rt.free_raw(buf)
print(json.dumps({"first_launch_s": t_end - t_rt, "process_s": t_end - t_start,
                  "stats": rt.cache.stats.as_dict()}))
rt.close()
'''


def _host_rate(fn, n: int) -> float:
    """Launches per ms of host time over ``n`` calls."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return n / ((time.perf_counter() - t0) * 1e3)


def _interleaved_rates(ctx: BenchContext, fns: dict, n: int, rounds: int) -> dict[str, float]:
    """Median launches/ms per callable over ``rounds`` rounds, the order rotated each round,
    so that drift in the host's speed hits every launcher alike."""
    names = list(fns)
    for fn in fns.values():  # warm-up
        for _ in range(200):
            fn()
    ctx.rt.synchronize()
    samples: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(_host_rate(fns[name], n))
            ctx.rt.synchronize()
    return {k: statistics.median(v) for k, v in samples.items()}


def _launch_overhead(ctx: BenchContext) -> list[dict]:
    rt = ctx.rt
    n = 2000 if ctx.quick else 5000
    rounds = 3 if ctx.quick else 9
    empty = rt.nvrtc_function("bench_empty", EMPTY_SRC, "empty_kernel")
    argk = rt.nvrtc_function("bench_args", ARGS_SRC, "args_kernel")
    buf = rt.alloc_raw(4096)
    try:
        args = [buf, buf, buf, buf, np.int32(0), np.float32(1.0)]
        # The floor: a bare cuLaunchKernel through cuda.bindings with no arguments.
        h, s = empty.handle, rt.stream.handle
        fns = {
            "ours": lambda: rt.launch(empty, 1, 32, ()),
            "ours 6 args": lambda: rt.launch(argk, 1, 32, args),
            "ctypes path": lambda: rt._launch_py(empty, 1, 32, ()),
            "cuda.bindings cuLaunchKernel": lambda: driver.cuLaunchKernel(h, 1, 1, 1, 32, 1, 1, 0, s, 0, 0),
            **_peer_launchers(ctx),
        }
        rates = _interleaved_rates(ctx, fns, n, rounds)
        ctx.rt.device.make_current()
    finally:
        rt.free_raw(buf)
    path = "compiled path" if rt.compiled_launch else "ctypes path (attnrt.runtime._launchc not built)"
    ctx.log(f"rt.launch: {path}; medians of {rounds} interleaved rounds x {n} launches")
    ours = rates.pop("ours")
    rows = [row("runtime", "launch empty kernel (host)", "launches/ms", ours, name, rates[name])
            for name in ("cuda.bindings cuLaunchKernel", "cuda.core launch", "CuPy RawKernel")
            if name in rates]
    rows.append(row("runtime", "launch empty kernel (host), rt.launch's ctypes fallback", "launches/ms",
                    rates["ctypes path"], "cuda.core launch", rates.get("cuda.core launch", float("nan"))))
    rows.append(row("runtime", "launch 6-arg kernel (host)", "launches/ms", rates["ours 6 args"],
                    "rt.launch empty kernel", ours))
    for r in rows:
        r["launch_path"] = path
    return rows


def _peer_launchers(ctx: BenchContext) -> dict:
    out: dict = {}
    try:
        from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

        dev = Device(ctx.rt.capabilities.ordinal)
        dev.set_current()
        prog = Program(EMPTY_SRC, code_type="c++", options=ProgramOptions(arch=ctx.rt.arch))
        ker = prog.compile("cubin").get_kernel("empty_kernel")
        stream = dev.create_stream()
        cfg = LaunchConfig(grid=1, block=32)
        out["cuda.core launch"] = lambda: launch(stream, cfg, ker)
    except Exception as exc:
        ctx.log(f"cuda.core launch peer unavailable: {type(exc).__name__}: {exc}")
    try:
        import cupy

        k = cupy.RawKernel(EMPTY_SRC, "empty_kernel")
        out["CuPy RawKernel"] = lambda: k((1,), (32,), ())
    except Exception as exc:
        ctx.log(f"CuPy peer unavailable: {type(exc).__name__}: {exc}")
    ctx.rt.device.make_current()
    return out


def _compile_cache(ctx: BenchContext) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="nxrt-bench-cache-") as d:
        src_path = Path(d) / "src.cu"
        src_path.write_text(COMPILE_SRC)
        child = Path(d) / "child.py"
        child.write_text(_CHILD)
        env = dict(os.environ, ATTNRT_CACHE_DIR=str(Path(d) / "cache"), ATTNRT_CACHE="1")
        root = Path(__file__).resolve().parent.parent
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])

        def run_child() -> dict:
            out = subprocess.run([sys.executable, str(child), str(src_path)], env=env,
                                 capture_output=True, text=True, check=True)
            return json.loads(out.stdout.strip().splitlines()[-1])

        cold = run_child()
        warm = run_child()
    ctx.log(f"compile: cold {cold}, warm {warm}")
    if warm["stats"]["compiles"] != 0:
        raise RuntimeError(f"warm-cache process compiled {warm['stats']['compiles']} times")
    rt = ctx.rt
    fn = rt.nvrtc_function("bench_compile_mem", COMPILE_SRC, "dot_bf16_128")
    t0 = time.perf_counter()
    reps = 1000
    for _ in range(reps):
        rt.nvrtc_function("bench_compile_mem", COMPILE_SRC, "dot_bf16_128")
    mem_s = (time.perf_counter() - t0) / reps
    assert fn is rt.nvrtc_function("bench_compile_mem", COMPILE_SRC, "dot_bf16_128")
    return [
        row("runtime", "first launch: warm disk cache vs cold compile (fresh process)", "1/s",
            1 / warm["first_launch_s"], "cold compile", 1 / cold["first_launch_s"],
            ours_seconds=warm["first_launch_s"], peer_seconds=cold["first_launch_s"],
            process_seconds_warm=warm["process_s"], process_seconds_cold=cold["process_s"]),
        row("runtime", "nvrtc_function: in-memory fetch vs warm disk cache", "1/s", 1 / mem_s,
            "warm disk cache", 1 / warm["first_launch_s"], ours_seconds=mem_s),
    ]


def _graph_chain(ctx: BenchContext) -> list[dict]:
    rt = ctx.rt
    fn = rt.nvrtc_function("bench_chain", CHAIN_SRC, "bump")
    n = 4096
    x = rt.alloc_raw(n * 4)
    try:
        rt.htod(x, np.random.default_rng(0).standard_normal(n).astype(np.float32))
        args = [x, np.int32(n), np.float32(1.0)]

        def eager() -> None:
            for _ in range(50):
                rt.launch(fn, (n + 255) // 256, 256, args)

        with rt.capture() as g:
            eager()
        steps = 50 if ctx.quick else 300
        eager_rate = _host_rate(eager, steps)
        rt.synchronize()
        replay_rate = _host_rate(g.replay, steps)
        rt.synchronize()
        dev_eager = ctx.time_ours(eager, reps=20)
        dev_graph = ctx.time_ours(g.replay, reps=20)
        g.destroy()
    finally:
        rt.free_raw(x)
    return [
        row("runtime", "50-kernel chain, host time per step", "steps/ms", replay_rate,
            "eager rt.launch x50", eager_rate),
        row("runtime", "50-kernel chain, device time per step", "steps/ms", 1 / dev_graph,
            "eager rt.launch x50", 1 / dev_eager),
    ]


def run(ctx: BenchContext) -> list[dict]:
    rows = []
    for part in (_launch_overhead, _compile_cache, _graph_chain):
        ctx.log(f"runtime: {part.__name__.strip('_')}")
        rows += part(ctx)
    ctx.rt.device.make_current()
    check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
    return rows
