#!/usr/bin/env python3
"""Does compute-sanitizer's racecheck follow a named barrier split into ``bar.arrive`` (one
warpgroup) and ``bar.sync`` (the other)? (How the wgmma pair kernel hands P and the row max
between its warpgroups.) One CTA of 256 threads, any GPU.

Run: ``compute-sanitizer --tool racecheck --racecheck-report all python
lab/rc_named_barrier_probe.py MODE``, one mode per run. Thread t < 128 (warpgroup 0) writes
row t of a shared buffer, thread t + 128 (warpgroup 1) reads it and writes it to global
memory, which the probe checks. Modes:

- ``0`` WG0 writes, ``bar.arrive 1, 256``; WG1 ``bar.sync 1, 256``, reads (ordered: the
  pair kernel's read-after-write hand-off).
- ``1`` WG1 reads a row, ``bar.arrive 2, 256``; WG0 ``bar.sync 2, 256``, then overwrites it
  (ordered: the pair kernel's write-after-read reuse). WG0 first wrote the row before a
  ``__syncthreads``.
- ``2`` no barrier between the write and the read (a real race: the control).
- ``3`` ``__syncthreads`` between them (the control that must be clean).

Exit status: 0 when every output checks (mode 2 may not), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attnrt  # noqa: E402

SRC = r'''
extern "C" __global__ void rc_bar_probe(float* out, int mode) {
  __shared__ float buf[128];
  const int t = threadIdx.x, r = t & 127;
  const bool wg0 = t < 128;
  if (mode == 1) {
    if (wg0) buf[r] = 1.0f;
    __syncthreads();
    if (!wg0) {
      out[r] = buf[r];
      asm volatile("bar.arrive 2, 256;" ::: "memory");
    } else {
      asm volatile("bar.sync 2, 256;" ::: "memory");
      buf[r] = 2.0f;
    }
    return;
  }
  if (wg0) buf[r] = (float)r;
  if (mode == 0) {
    if (wg0) asm volatile("bar.arrive 1, 256;" ::: "memory");
    else asm volatile("bar.sync 1, 256;" ::: "memory");
  } else if (mode == 3) {
    __syncthreads();
  }
  if (!wg0) out[r] = buf[r];
}
'''


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modes", nargs="+", type=int, choices=(0, 1, 2, 3), metavar="MODE")
    args = ap.parse_args(argv)
    rt = attnrt.CudaRuntime()
    out = rt.alloc_raw(128 * 4)
    ok_all = True
    try:
        fn = rt.nvrtc_function("rc_bar_probe", SRC, "rc_bar_probe", arch=rt.arch)
        for mode in args.modes:
            rt.memset(out, 0xFF, 128 * 4)
            rt.launch(fn, 1, 256, [out, np.int32(mode)])
            rt.synchronize()
            got = rt.dtoh(np.empty(128, np.float32), out)
            want = np.ones(128, np.float32) if mode == 1 else np.arange(128, dtype=np.float32)
            ok = bool(np.array_equal(got, want))
            ok_all &= ok or mode == 2
            print(f"mode {mode}: output {'as ordered' if ok else 'WRONG'}", flush=True)
    finally:
        rt.free_raw(out)
        rt.close()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
