#!/usr/bin/env python3
"""Where the host time of one ``rt.launch`` goes: each foreign-call route timed (GPU needed).

Run: ``python lab/profile_launch.py [--rounds R] [--n N] [--json PATH]``. Every variant
launches the same empty kernel on a non-blocking stream; variants are timed in interleaved
rounds (R rounds x N calls each, the order rotated per round) and the median per-call time
of each is printed, so drift of the host's clock or load hits all variants alike.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import attnrt  # noqa: E402
from attnrt.runtime._check import FastDriver, driver  # noqa: E402

SRC = r'''
extern "C" __global__ void empty_kernel() {}
extern "C" __global__ void write_kernel(int* out, int v) { *out = v; }
extern "C" __global__ void args_kernel(float* a, const float* b, const float* c, float* d,
                                       int n, float alpha) {}
'''


def per_call_us(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def variants(rt: attnrt.CudaRuntime) -> dict:
    e = rt.nvrtc_function("prof", SRC, "empty_kernel")
    a = rt.nvrtc_function("prof", SRC, "args_kernel")
    args = [1, 2, 3, 4, np.int32(5), np.float32(1.0)]
    fast = rt._fast
    held = FastDriver(hold_gil=True)
    g, b = (1, 1, 1), (32, 1, 1)
    _cfg, ref = fast.config(g, b, 0, rt.stream.ptr)
    libc = ctypes.CDLL(None)
    labs = libc.labs
    labs.restype = ctypes.c_long
    one = ctypes.c_long(1)
    rows = {
        "python lambda (no call)": lambda: None,
        "ctypes libc labs (pure FFI cost)": lambda: labs(one),
        "pack 6 args": lambda: a.pack_c(args),
        "raw ctypes cuLaunchKernelEx, GIL released": lambda: fast.launch_fn(ref, e.handle_c, None, None),
        "raw ctypes cuLaunchKernelEx, GIL held": lambda: held.launch_fn(ref, e.handle_c, None, None),
        "rt.launch empty": lambda: rt.launch(e, g, b, ()),
        "rt._launch_py empty (ctypes path)": lambda: rt._launch_py(e, g, b, ()),
        "rt.launch 6 args": lambda: rt.launch(a, g, b, args),
    }
    h, s = e.handle, rt.stream.handle
    rt.device.make_current()
    cufn = ctypes.c_void_p(int(driver.cuKernelGetFunction(h)[1]))
    rows["raw ctypes cuLaunchKernelEx, CUfunction"] = lambda: fast.launch_fn(ref, cufn, None, None)
    rows["raw ctypes cuLaunchKernelEx, CUfunction, GIL held"] = lambda: held.launch_fn(ref, cufn, None, None)
    rows["cuda.bindings cuLaunchKernel"] = lambda: driver.cuLaunchKernel(h, 1, 1, 1, 32, 1, 1, 0, s, 0, 0)
    try:
        cfg = driver.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = 1, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 32, 1, 1
        cfg.sharedMemBytes = 0
        cfg.hStream = s
        cfg.numAttrs = 0
        rows["cuda.bindings cuLaunchKernelEx, cached config"] = lambda: driver.cuLaunchKernelEx(cfg, h, 0, 0)
    except Exception as exc:
        print("bindings cuLaunchKernelEx unavailable:", exc)
    try:
        err, pfn, _st = driver.cuGetProcAddress(b"cuLaunchKernelEx", 12000,
                                                driver.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT)
        proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_void_p)
        via_proc = proto(int(pfn))
        cfg_addr = ctypes.addressof(_cfg)
        hk = e.handle_c.value
        rows["ctypes via cuGetProcAddress, int args"] = lambda: via_proc(cfg_addr, hk, None, None)
    except Exception as exc:
        print("cuGetProcAddress route unavailable:", exc)
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        lk = lib.cuLaunchKernel
        lk.restype = ctypes.c_int
        u1, u32, z = ctypes.c_uint(1), ctypes.c_uint(32), ctypes.c_uint(0)
        sp = ctypes.c_void_p(rt.stream.ptr)
        rows["raw ctypes cuLaunchKernel (11 pre-built)"] = lambda: lk(e.handle_c, u1, u1, u1, u32, u1, u1,
                                                                     z, sp, None, None)
    except Exception as exc:
        print("ctypes cuLaunchKernel unavailable:", exc)
    try:
        from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

        dev = Device(rt.capabilities.ordinal)
        dev.set_current()
        ker = Program(SRC, code_type="c++", options=ProgramOptions(arch=rt.arch)).compile(
            "cubin").get_kernel("empty_kernel")
        st = dev.create_stream()
        lc = LaunchConfig(grid=1, block=32)
        rows["cuda.core launch"] = lambda: launch(st, lc, ker)
        rt.device.make_current()
    except Exception as exc:
        print("cuda.core unavailable:", exc)
    return rows


def probe_cufunction(rt: attnrt.CudaRuntime) -> dict:
    """Does a CUfunction launch on the runtime's stream work whatever context is current?"""
    import threading

    w = rt.nvrtc_function("prof", SRC, "write_kernel")
    rt.device.make_current()
    cufn = ctypes.c_void_p(int(driver.cuKernelGetFunction(w.handle)[1]))
    fast = rt._fast
    _cfg, ref = fast.config((1, 1, 1), (1, 1, 1), 0, rt.stream.ptr)
    out = rt.alloc_raw(4)
    res: dict = {}

    def attempt(tag: str, v: int) -> None:
        p = w.pack_c([out, np.int32(v)])
        err = fast.launch_fn(ref, cufn, p, None)
        rt.synchronize()
        host = np.zeros(1, np.int32)
        rt.dtoh(host, out)
        got = int(host[0])
        res[tag] = {"rc": int(err), "ran": got == v}

    attempt("current = runtime context", 11)
    th = threading.Thread(target=lambda: attempt("no current context (fresh thread)", 22))
    th.start()
    th.join()
    err, other = driver.cuCtxCreate(None, 0, rt.device.handle) if hasattr(rt.device, "handle") else (1, None)
    if int(err) == 0:
        attempt("another context current", 33)
        driver.cuCtxDestroy(other)
    else:
        res["another context current"] = f"cuCtxCreate failed: {err}"
    rt.device.make_current()
    rt.free_raw(out)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--json", default="")
    opts = ap.parse_args()
    with attnrt.CudaRuntime(0) as rt:
        print("compiled launch path:", rt.compiled_launch)
        try:
            print("CUfunction probe:", json.dumps(probe_cufunction(rt)))
        except Exception as exc:
            print("CUfunction probe failed:", type(exc).__name__, exc)
        rows = variants(rt)
        names = list(rows)
        for fn in rows.values():  # warm-up
            for _ in range(300):
                fn()
        rt.synchronize()
        samples: dict[str, list[float]] = {k: [] for k in names}
        for r in range(opts.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                samples[name].append(per_call_us(rows[name], opts.n))
                rt.synchronize()
        res = {k: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
               for k, v in samples.items()}
        for k, v in res.items():
            print(f"{k:>46}: {v['median_us']:7.3f} us  (min {v['min_us']:.3f}, max {v['max_us']:.3f})")
        if opts.json:
            Path(opts.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
