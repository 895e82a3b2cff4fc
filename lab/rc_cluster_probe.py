#!/usr/bin/env python3
"""Does compute-sanitizer's racecheck follow cp.async copies ordered before another CTA's
distributed-shared-memory stores? A two-CTA probe (GPU with clusters, sm_90, needed).

Run: ``compute-sanitizer --tool racecheck --racecheck-report all python
lab/rc_cluster_probe.py MODE``, one mode per run (several modes in one process pool their
hazards into one report; without the sanitizer it only checks the outputs). In every mode
each thread t of both CTAs first writes 16 bytes of its CTA's shared buffer (row t); then
each thread t of rank 1 stores row t of rank 0's buffer through distributed shared memory
(``st.shared::cluster``), and rank 0 writes what it then holds to global memory, which the
probe checks. Modes:

- ``0`` cp.async, ``cp.async.wait_group 0``, a release/acquire cluster barrier, the
  partner's store: ordered by the PTX memory model (the eight-CTA IndexShare merge,
  ``IS_CMDS``, hands its partials over this way).
- ``1`` a plain ``st.shared`` instead of the cp.async, the same barrier (control).
- ``2`` cp.async and its wait but no barrier before the partner's store: a real race (and
  the partner may store before rank 0 has started, which the CUDA programming guide leaves
  undefined: this mode may fault).
- ``3`` mode 0 with a ``__syncthreads`` between the wait and the cluster barrier.
- ``4`` half the threads copy, completing on an mbarrier (``cp.async.mbarrier.arrive.noinc``)
  that the other half waits on; then the cluster barrier (the ring's own protocol).

On the H200 (racecheck 2025.3.1, docs/notes/index_share-history.md, round 22) every cp.async mode, 0, 3 and 4
as much as the racy 2, reported write-after-write hazards "invalid memcpy_async
synchronization", and mode 1 none: the tool does not carry a cp.async's completion across
a cluster barrier, so its report on ``IS_CMDS`` says nothing about that kernel's order.
Exit status: 0 when every output checks, 1 otherwise, 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attnrt  # noqa: E402

MODES = (0, 1, 2, 3, 4)
ROWS = 256  # threads per CTA, one 16-byte row each

SRC = r'''
extern "C" __global__ void __cluster_dims__(2, 1, 1)
rc_probe(const float4* src, float* out, int mode) {
  __shared__ __align__(16) float4 buf[256];
  __shared__ __align__(8) unsigned long long bar;
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const int t = threadIdx.x;
  const unsigned dst = (unsigned)__cvta_generic_to_shared(&buf[t]);
  const unsigned b = (unsigned)__cvta_generic_to_shared(&bar);
  if (t == 0) asm volatile("mbarrier.init.shared.b64 [%0], %1;" :: "r"(b), "r"(128));
  __syncthreads();
  if (mode == 1) {
    buf[t] = src[t];
  } else if (mode == 4) {
    if (t < 128) {  // rows t and t + 128, completing on the mbarrier
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src + t));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                   :: "r"(dst + 128 * 16), "l"(src + t + 128));
      asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" :: "r"(b));
    } else {
      asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared.b64 p, [%0], 0;\n"
                   "@!p bra W;\n}" :: "r"(b) : "memory");
    }
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src + t));
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
  }
  if (mode == 3) __syncthreads();
  if (mode != 2) {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
  }
  if (rank == 1) {
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(dst), "r"(0u));
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "r"(r), "f"(1.f), "f"(2.f), "f"(3.f), "f"((float)t) : "memory");
  }
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (rank == 0) out[t] = buf[t].w;
}
'''


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modes", nargs="+", type=int, choices=MODES, metavar="MODE",
                    help="0-4, see above")
    args = ap.parse_args(argv)
    rt = attnrt.CudaRuntime()
    arch = str(rt.capabilities.arch)
    if int("".join(ch for ch in arch.split("_")[-1] if ch.isdigit()) or 0) < 90:
        print(f"rc_cluster_probe: clusters need sm_90 or later, this device is {arch}",
              file=sys.stderr)
        rt.close()
        return 1
    ok_all = True
    src = out = 0
    try:
        src = rt.alloc_raw(ROWS * 16)
        out = rt.alloc_raw(ROWS * 4)
        fn = rt.nvrtc_function("rc_cluster_probe", SRC, "rc_probe", arch=rt.arch)
        rt.htod(src, np.random.default_rng(0).standard_normal(ROWS * 4).astype(np.float32))
        want = np.arange(ROWS, dtype=np.float32)  # the partner's stores, last
        for mode in args.modes:
            rt.memset(out, 0xFF, ROWS * 4)
            rt.launch(fn, 2, ROWS, [src, out, np.int32(mode)])
            rt.synchronize()
            ok = bool(np.array_equal(rt.dtoh(np.empty(ROWS, np.float32), out), want))
            ok_all &= ok
            print(f"mode {mode}: output {'as ordered' if ok else 'WRONG'}", flush=True)
    finally:
        for ptr in (src, out):
            if ptr:
                rt.free_raw(ptr)
        rt.close()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
