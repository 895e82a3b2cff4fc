#!/usr/bin/env python3
"""Device time per replay of a one-kernel graph, by kernel shape (GPU needed).

Run: ``python lab/graph_gap.py [--spin-us US ...] [--json PATH]``. One kernel that spins
for a set time (``clock64``) is captured alone in a graph, in each of the shapes the
IndexShare decode kernel has or lacks: 128 CTAs of 384 threads, with or without 226 KB of
dynamic shared memory, two-CTA clusters and programmatic dependent launch, plus a 1-CTA
control. Each graph is timed by the bench's own timer (``BenchContext.time_ours``: its
warm-up, then the median of 20 event pairs), with 2 replays per pair as ``tools/bench.py``
times one call per graph, and with 20 per pair (the device kept busy): the 20-per-pair
time minus the spin is what one graph launch adds on the device, the 2-per-pair time adds
half of the first replay's host latency on top.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench import BenchContext  # noqa: E402

import attnrt  # noqa: E402
from attnrt.runtime._check import check, driver  # noqa: E402

SRC = r'''
extern "C" __global__ void __launch_bounds__(384, 1)
#if GG_CLUSTER
__cluster_dims__(2, 1, 1)
#endif
spin_kernel(int* out, long long spin) {
#if GG_PDL
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  if (threadIdx.x == 0) out[blockIdx.x] = 1;
}
'''

#: (cluster, programmatic, dynamic shared bytes, CTAs): the decode kernel's shape is
#: (1, 1, 226688, 128).
SHAPES = ((0, 0, 0, 128), (0, 0, 226688, 128), (1, 0, 0, 128), (1, 0, 226688, 128),
          (1, 1, 226688, 128), (0, 1, 226688, 128), (0, 0, 0, 1))


def per_replay_us(ctx: BenchContext, graph: attnrt.Graph, per_pair: int) -> float:
    """Median device microseconds per replay, ``per_pair`` replays between two events (the
    bench's timer and warm-up)."""
    def replays() -> None:
        for _ in range(per_pair):
            graph.replay()
    return ctx.time_ours(replays) / per_pair * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spin-us", type=float, nargs="+", default=[0.0, 20.0],
                    help="kernel spin times in microseconds (default 0 20)")
    ap.add_argument("--json", help="write every number here")
    args = ap.parse_args(argv)
    if any(not 0 <= s <= 100_000 for s in args.spin_us):
        ap.error("--spin-us values must be numbers in [0, 100000]")
    reason = attnrt.gpu_missing_reason()
    if reason:
        print(f"graph_gap: {reason}; nothing to measure", file=sys.stderr)
        return 2
    rows = []
    with attnrt.CudaRuntime(0) as rt:
        if rt.capabilities.compute_capability[0] < 9:
            print("graph_gap: clusters and programmatic launch need compute capability 9.0",
                  file=sys.stderr)
            return 2
        clock_khz = check(driver.cuDeviceGetAttribute(
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, rt.device.handle),
            "cuDeviceGetAttribute")
        out = rt.alloc_raw(4 * 1024)
        ctx = BenchContext(rt)
        try:
            for spin_us in args.spin_us:
                cycles = np.int64(round(spin_us * clock_khz / 1e3))
                for cl, pdl, smem, ctas in SHAPES:
                    fn = rt.nvrtc_function(f"graph_gap_c{cl}p{pdl}", SRC, "spin_kernel",
                                           [f"-DGG_CLUSTER={cl}", f"-DGG_PDL={pdl}"])
                    with rt.capture() as graph:
                        rt.launch(fn, ctas, 384, [out, cycles], shared_mem=smem,
                                  programmatic=bool(pdl))
                    try:
                        two = per_replay_us(ctx, graph, 2)
                        busy = per_replay_us(ctx, graph, 20)
                    finally:
                        graph.destroy()
                    r = dict(spin_us=spin_us, cluster=cl, programmatic=pdl, smem=smem, ctas=ctas,
                             us_2_per_pair=round(two, 3), us_back_to_back=round(busy, 3))
                    rows.append(r)
                    print(f"spin {spin_us:5.1f} us  cluster {cl}  pdl {pdl}  smem {smem:6d}  "
                          f"ctas {ctas:3d}:  2 per pair {two:6.2f} us   back to back "
                          f"{busy:6.2f} us", flush=True)
        finally:
            rt.free_raw(out)
        gpu = rt.capabilities.name
    if args.json:
        Path(args.json).write_text(json.dumps(dict(gpu=gpu, clock_khz=clock_khz, rows=rows),
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
