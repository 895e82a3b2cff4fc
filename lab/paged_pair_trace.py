#!/usr/bin/env python3
"""SM-clock trace of one steady-state pair of the wgmma pair kernel (``PA_PAIR_TRACE=1``).

    PYTHONPATH=.:tools python lab/with_defines.py PA_PAIR_TRACE=1 lab/paged_pair_trace.py [H ...]

Decode, one sequence per SM (B 132, L 2048, block 64, one split), so every SM streams as in
the big-batch bench rows. CTA (0, 0) records the SM clock at each step of its fourth- and
third-last pairs (kernel marks 0-11; see PAIR_MARK in cuda/paged_mla_pair.cu) over the first
bytes of the output; printed as cycles since warpgroup 0's mark 0 of the first, both
warpgroups, marks 0-11, for three launches.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import attnrt  # noqa: E402
from tests.test_paged_cpu import BF16, make_case  # noqa: E402
from tests.test_paged_gpu import Bound  # noqa: E402

WG0 = "1:max-out 2:PV0L-done 3:K0-issued 4:scale1-in 5:P0-out 6:PV0-in 7:S0A-issued " \
      "8:PV1L-done 9:K1-issued 10:S0B-issued 11:S0-done"
WG1 = "1:scale0-in 2:scale1-out 3:PV1R-issued 4:P0-in 5:PV0R-issued 6:PV1R-done " \
      "7:K1-issued 8:PV0R-done 9:K0-issued 10:S1-issued 11:S1-done"


def main(heads: list[int], B: int = 132, L: int = 2048, splits: int = 1) -> None:
    rng = np.random.default_rng(0)
    with attnrt.CudaRuntime(0) as rt:
        for H in heads:
            c = make_case(rng, H=H, hs=576, vhs=512, bs=64, dtype=BF16, q_lens=(1,) * B,
                          past_lens=(L - 1,) * B, extra_blocks=0)
            bound = Bound(rt, c, path="wg", num_splits=splits or None, wg_schedule="pair")
            try:
                print(f"H{H}: marks  WG0 {WG0}\n        WG1 {WG1}")
                for _ in range(3):
                    bound.execute()
                    rt.synchronize()
                    raw = bound.out.numpy().view(np.uint32).reshape(-1)[:64].astype(np.int64)
                    t0 = raw[0]  # WG0's mark 0 of the first traced pair: both warpgroups from it
                    for pair in (0, 1):
                        for wg in (0, 1):
                            m = raw[32 * wg + 12 * pair: 32 * wg + 12 * pair + 12]
                            print(f"  pair{pair} wg{wg}: "
                                  + " ".join(f"{(v - t0) % 2**32:6d}" for v in m))
            finally:
                bound.free()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("heads", nargs="*", type=int, default=[16, 128], help="head counts")
    ap.add_argument("--batch", type=int, default=132, help="sequences")
    ap.add_argument("--length", type=int, default=2048, help="keys per sequence")
    ap.add_argument("--splits", type=int, default=1, help="split-KV count (0: the planner's)")
    a = ap.parse_args()
    main(a.heads, a.batch, a.length, a.splits)
