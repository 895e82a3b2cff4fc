#!/usr/bin/env python3
"""A few rows of ``tools/bench.py paged`` (ours read-only vs FlashMLA, the bench's own rig).

    PYTHONPATH=.:tools python lab/paged_rows.py decode:16:8:8192 ragged:16:32:8192 spec:16:32:8192:4

Each row is kind:H:B:L[:q]; our config comes from the bench's environment variables
(``ATTNRT_BENCH_PAGED_BALANCED``, ``..._PDL``, ``..._MAX_SPLITS``, ``..._WG``). Prints one
line per row (one call per graph replay, median of the bench's interleaved rounds); writes
nothing. ``--wg serial,pair`` runs every row once per wgmma schedule, in that order, in one
process (each against FlashMLA again).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import bench_paged  # noqa: E402
from _paged_grid import Shape  # noqa: E402
from bench import BenchContext  # noqa: E402

import attnrt  # noqa: E402


def main(specs: list[str]) -> None:
    schedules = [None]
    if specs[:1] == ["--wg"]:
        schedules, specs = specs[1].split(","), specs[2:]
    rows = []
    for spec in specs:
        kind, *nums = spec.split(":")
        rows.append(Shape(kind, *(int(v) for v in nums)))
    with attnrt.CudaRuntime(0) as rt:
        for row in rows:
            for sched in schedules:
                if sched is not None:
                    os.environ["ATTNRT_BENCH_PAGED_WG"] = sched
                bench_paged.grid = lambda quick, row=row: [row]
                for r in bench_paged.run(BenchContext(rt)):
                    if r["timing"] == "1/replay":
                        print(f"{r['case']} [{sched or 'env'}]: ours {r['ms'] * 1e3:.1f} us, FlashMLA "
                              f"{(r.get('flashmla_ms') or 0) * 1e3:.1f} us, ratio {r['ratio']}, "
                              f"agree {r.get('agree')}, ref rel F {r.get('ref_rel_fro')}",
                              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
