#!/usr/bin/env python3
"""How fast can this GPU gather IndexShare's selected rows? ``python lab/gather_ceiling.py``

The IndexShare decode target is a fraction of the copy bandwidth, but the kernel reads
2048 scattered 256-byte K rows and V rows per batch, not one sequential stream. This tool
measures the ceiling for exactly those reads: a kernel with no math that loads every
selected K and V row of the benchmark's decode inputs (tools/bench_index_share.py, same
seeds, B 64, top-k 2048, H 128, bf16) with 16-byte non-coherent loads, UNROLL rows per
thread in flight, folds them into one word per thread (so nothing is dead code) and writes
that. Timed like the sweep: graph replays alternating two input sets, CUDA events, median.
Prints GB/s (gathered bytes / time, the benchmark's definition) per configuration beside
the copy bandwidth (rt.dtod of 2 GiB) and a sequential read of the same byte count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import bench_index_share as bis  # noqa: E402
from bench import BenchContext  # noqa: E402

import attnrt  # noqa: E402

SRC = r"""
extern "C" __global__ void __launch_bounds__(256) gather_rows(
    const uint4* __restrict__ k, const uint4* __restrict__ v, const int* __restrict__ idx,
    unsigned* __restrict__ out, int K, int cache, int S, int cps) {
  const int b = blockIdx.x / S, s = blockIdx.x % S;
  const int c0 = s * cps;
  const int n = min(cps, K - c0);
  const int* ir = idx + (long long)b * K + c0;
  const int ch = threadIdx.x & 15, r0 = threadIdx.x >> 4;  // 16 chunks of 16 B per row
  unsigned acc = 0;
  for (int base = 0; base < n; base += 16 * UNROLL) {
    int key[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int r = base + r0 + 16 * u;
      key[u] = r < n ? ir[r] : -1;
    }
    uint4 a[UNROLL], c[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long off = ((long long)b * cache + (key[u] < 0 ? 0 : key[u])) * 16 + ch;
      a[u] = key[u] >= 0 ? __ldg(k + off) : make_uint4(0, 0, 0, 0);
      c[u] = key[u] >= 0 ? __ldg(v + off) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      acc ^= a[u].x ^ a[u].y ^ a[u].z ^ a[u].w ^ c[u].x ^ c[u].y ^ c[u].z ^ c[u].w;
  }
  out[(long long)blockIdx.x * 256 + threadIdx.x] = acc;
}

extern "C" __global__ void __launch_bounds__(256) read_seq(const uint4* __restrict__ p,
                                                           unsigned* __restrict__ out, long long n) {
  unsigned acc = 0;
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += (long long)gridDim.x * 256) {
    const uint4 x = __ldg(p + i);
    acc ^= x.x ^ x.y ^ x.z ^ x.w;
  }
  out[(long long)blockIdx.x * 256 + threadIdx.x] = acc;
}
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=int, default=8192)
    args = ap.parse_args(argv)
    rt = attnrt.CudaRuntime(0)
    ctx = BenchContext(rt)
    torch = ctx.torch
    if torch is None:
        print("gather_ceiling: needs torch with CUDA (for the benchmark's inputs)")
        return 1
    ctx.measure_ceilings()
    c = dict(kind="decode", b=64, sq=1, n=64, nkv=1, cache=args.cache)
    sets = [bis.make_inputs(torch, c, 1234 + i) for i in range(2)]
    nbytes = bis.gathered_bytes(c)
    b, k = c["b"], bis.TOPK
    out = torch.empty(b * 64 * 256, dtype=torch.int32, device="cuda")
    rows = []
    for unroll in (4, 8):
        fn = rt.nvrtc_function("gather_ceiling", SRC, "gather_rows", (f"-DUNROLL={unroll}",))
        for splits in (1, 2, 4, 8, 16, 32):
            cps = -(-k // splits)

            def launch(s: dict, splits: int = splits, cps: int = cps, fn=fn) -> None:
                rt.launch(fn, b * splits, 256,
                          [s["kc"].data_ptr(), s["vc"].data_ptr(), s["idx"].data_ptr(),
                           out.data_ptr(), np.int32(k), np.int32(args.cache), np.int32(splits),
                           np.int32(cps)])

            for s in sets:
                launch(s)
            rt.synchronize()
            with rt.capture() as g:
                for s in sets:
                    launch(s)
            ms = ctx.time_ours(g.replay, warmup=3, reps=30) / len(sets)
            g.destroy()
            rows.append((f"gather unroll {unroll} splits {splits} ({b * splits} CTAs)", ms))
    fn = rt.nvrtc_function("gather_ceiling", SRC, "read_seq", ("-DUNROLL=4",))
    n16 = nbytes // 16
    for s in sets:  # the first nbytes of the K cache (bf16 elements: nbytes / 2 of them)
        s["flat"] = s["kc"].view(-1)[: nbytes // 2]
    grid = rt.capabilities.sm_count * 8
    with rt.capture() as g:
        for s in sets:
            rt.launch(fn, grid, 256, [s["flat"].data_ptr(), out.data_ptr(), np.int64(n16)])
    ms = ctx.time_ours(g.replay, warmup=3, reps=30) / len(sets)
    g.destroy()
    rows.append(("sequential read of the same byte count", ms))
    copy = ctx.ceilings["copy_GBps"]
    print(f"gathered bytes {nbytes / 1e6:.1f} MB per call; copy {copy:.0f} GB/s")
    for name, ms in rows:
        gbps = nbytes / ms / 1e6
        print(f"{name:55s} {ms * 1e3:8.2f} us {gbps:8.0f} GB/s {100 * gbps / copy:5.1f}% copy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
