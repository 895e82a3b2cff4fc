#!/usr/bin/env python3
"""Where the host time of one ``rt.launch`` goes: each piece timed alone (GPU needed).

Run: ``python tools/profile_launch.py``. Prints microseconds per call for the context
probe, argument packing, the raw ctypes launch, ``rt.launch``, and the cuda.bindings call.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nxrt  # noqa: E402
from nxrt._check import driver  # noqa: E402

SRC = r'''
extern "C" __global__ void empty_kernel() {}
extern "C" __global__ void args_kernel(float* a, const float* b, const float* c, float* d,
                                       int n, float alpha) {}
'''


def per_call_us(fn, n: int = 20000) -> float:
    for _ in range(500):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    with nxrt.CudaRuntime(0) as rt:
        e = rt.nvrtc_function("prof", SRC, "empty_kernel")
        a = rt.nvrtc_function("prof", SRC, "args_kernel")
        args = [1, 2, 3, 4, np.int32(5), np.float32(1.0)]
        from nxrt._check import FastDriver

        fast = rt._fast
        held = FastDriver(hold_gil=True)
        g, b = (1, 1, 1), (32, 1, 1)
        _cfg, ref = fast.config(g, b, 0, rt.stream.ptr)
        rows = {
            "ctx probe (cuda.bindings)": lambda: driver.cuCtxGetCurrent(),
            "pack 6 args": lambda: a.pack_c(args),
            "ctypes cuLaunchKernelEx, GIL released": lambda: fast.launch(ref, e.handle_c, None, "x"),
            "ctypes cuLaunchKernelEx, GIL held": lambda: held.launch(ref, e.handle_c, None, "x"),
            "raw foreign call (launch_fn)": lambda: fast.launch_fn(ref, e.handle_c, None, None),
            "rt.launch empty": lambda: rt.launch(e, g, b, ()),
            "rt.launch 6 args": lambda: rt.launch(a, g, b, args),
            "cuda.bindings cuLaunchKernel": lambda: driver.cuLaunchKernel(e.handle, 1, 1, 1, 32, 1, 1, 0,
                                                                         rt.stream.handle, 0, 0),
        }
        try:
            from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

            dev = Device(0)
            dev.set_current()
            ker = Program(SRC, code_type="c++", options=ProgramOptions(arch=rt.arch)).compile(
                "cubin").get_kernel("empty_kernel")
            st = dev.create_stream()
            lc = LaunchConfig(grid=1, block=32)
            rows["cuda.core launch"] = lambda: launch(st, lc, ker)
        except Exception as exc:
            print("cuda.core unavailable:", exc)
        for name, fn in rows.items():
            us = per_call_us(fn)
            rt.synchronize()
            print(f"{name:>32}: {us:7.2f} us", flush=True)


if __name__ == "__main__":
    main()
