#!/usr/bin/env python3
"""Run a lab script with the pair kernel's contiguous partition weighing a row block's fixed
cost as another number of key tiles (the package derives 2 from the wgmma cost model:
``balanced.partition_overhead``); the host's split model is left as it is:

    PYTHONPATH=.:tools ATTNRT_BENCH_PAGED_BALANCED=1 python lab/with_part_overhead.py 5 \\
        lab/paged_rows.py decode:16:8:8192 ragged:16:32:8192
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools"), str(ROOT / "lab")]

from with_defines import run_patched  # noqa: E402

from attnrt.ops.paged_attention import balanced, kernel  # noqa: E402


def _patch(setting: str) -> None:
    tiles = int(setting)
    if tiles < 0:
        raise SystemExit(f"overhead must be >= 0 tiles, got {tiles}")
    # Both the launch argument and the host's int32 guard see the same value.
    kernel.partition_overhead = balanced.partition_overhead = lambda config: tiles


if __name__ == "__main__":
    run_patched(sys.argv[1:], __doc__, _patch)
