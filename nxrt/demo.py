"""``nxrt demo``: the runtime showcase (vector add, then a captured 50-kernel step replayed).

The op-level decode loop replaces this once the attention ops are registered.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from .device import gpu_missing_reason

VADD = r'''
extern "C" __global__ void vadd(const float* a, const float* b, float* c, long long n, float s) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + s * b[i];
}
'''


def main(args: argparse.Namespace) -> int:
    reason = gpu_missing_reason()
    if reason is not None:
        from .cli import warm

        print(f"demo: no GPU ({reason}).", flush=True)
        print("demo: compiling every kernel for sm_90 instead (what `nxrt warm --arch sm_90` does):",
              flush=True)
        _ok, _skip, errors = warm(["sm_90"])
        print("demo: with a GPU this would also run a vector add and replay a captured step.")
        return 1 if errors else 0
    from .runtime import CudaRuntime

    report: dict = {}
    with CudaRuntime(0) as rt:
        rng = np.random.default_rng(0)
        n = 1_000_003
        a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
        pa, pb, pc = (rt.alloc_raw(n * 4) for _ in range(3))
        rt.htod(pa, a)
        rt.htod(pb, b)
        t0 = time.perf_counter()
        fn = rt.nvrtc_function("demo_vadd", VADD, "vadd")
        report["compile_or_cache_s"] = round(time.perf_counter() - t0, 4)
        args_ = [pa, pb, pc, np.int64(n), np.float32(0.5)]
        grid = (n + 255) // 256

        def step() -> None:
            for _ in range(args.steps if args.steps > 0 else 16):
                rt.launch(fn, grid, 256, args_)

        step()
        out = rt.dtoh(np.empty(n, np.float32), pc)
        err = float(np.max(np.abs(out - (a + 0.5 * b))))
        report["vadd_max_abs_err"] = err
        with rt.capture() as g:
            step()
        reps = 50
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        rt.synchronize()
        eager = (time.perf_counter() - t0) / reps
        t0 = time.perf_counter()
        for _ in range(reps):
            g.replay()
        rt.synchronize()
        replay = (time.perf_counter() - t0) / reps
        rt.latch.check()
        g.destroy()
        for p in (pa, pb, pc):
            rt.free_raw(p)
        report.update(device=rt.capabilities.name, kernels_per_step=args.steps,
                      eager_ms_per_step=round(eager * 1e3, 4), replay_ms_per_step=round(replay * 1e3, 4),
                      cache=rt.cache.stats.as_dict(), ledger=rt.memory_stats().__dict__)
    ok = err < 1e-5 and report["ledger"]["live_bytes"] == 0
    report["ok"] = ok
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for k, v in report.items():
            print(f"{k:>20}: {v}")
    return 0 if ok else 1
