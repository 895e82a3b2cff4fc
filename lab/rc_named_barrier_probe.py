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
- ``4`` the pair kernel's skeleton: six rounds of its four hand-offs (row max and rescale
  written by one lane per quad, ``bar.arrive``/``bar.sync`` on barriers 1-4 in the kernel's
  order), then its epilogue (each warpgroup writes its row sums, ``__syncthreads``, every
  thread reads both). Ordered throughout.

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
  if (mode == 4) {
    __shared__ float sMax[64], sSc0[64], sSc1[64], sL[128];
    const int lane = t & 31, r0 = 16 * ((t & 127) >> 5) + (lane >> 2), tq = lane & 3;
    if (t < 64) sMax[t] = 0.0f;
    __syncthreads();
    float acc = 0.0f;
    for (int i = 0; i < 6; ++i) {
      if (wg0) {
        for (int hf = 0; hf < 2; ++hf) {
          const float old = sMax[r0 + 8 * hf];
          __syncwarp();
          if (tq == 0) { sMax[r0 + 8 * hf] = old + 1.0f; sSc0[r0 + 8 * hf] = (float)i; }
        }
        asm volatile("bar.arrive 1, 256;" ::: "memory");
        asm volatile("bar.sync 2, 256;" ::: "memory");
        acc += sSc1[r0] + sSc1[r0 + 8];
        asm volatile("bar.arrive 3, 256;" ::: "memory");
        asm volatile("bar.sync 4, 256;" ::: "memory");
      } else {
        asm volatile("bar.sync 1, 256;" ::: "memory");
        for (int hf = 0; hf < 2; ++hf) {
          const float old = sMax[r0 + 8 * hf], c = sSc0[r0 + 8 * hf];
          __syncwarp();
          if (tq == 0) { sMax[r0 + 8 * hf] = old + 1.0f; sSc1[r0 + 8 * hf] = c; }
        }
        asm volatile("bar.arrive 2, 256;" ::: "memory");
        asm volatile("bar.sync 3, 256;" ::: "memory");
        asm volatile("bar.arrive 4, 256;" ::: "memory");
      }
    }
    __syncthreads();
    if (tq == 0) { sL[(wg0 ? 0 : 64) + r0] = acc; sL[(wg0 ? 0 : 64) + r0 + 8] = acc; }
    __syncthreads();
    if (wg0) out[r] = sL[r0] + sL[64 + r0] + sMax[r0];
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
    ap.add_argument("modes", nargs="+", type=int, choices=(0, 1, 2, 3, 4), metavar="MODE")
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
            if mode == 4:  # WG0's sum of 2 * round over six rounds, + 12 raises of sMax
                want = np.full(128, 2.0 * 15 + 12, np.float32)
            else:
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
