#!/usr/bin/env python3
"""Run a lab script with the PagedAttention pair kernel's TMA tensor map encoded with another
L2 promotion (bytes an L2 miss fetches: 0, 64, 128 or 256; the package uses 256):

    PYTHONPATH=.:tools python lab/with_l2_promotion.py 128 lab/paged_rows.py --wg pair decode:16:32:8192
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools"), str(ROOT / "lab")]

from with_defines import run_patched  # noqa: E402

from attnrt.runtime import tma  # noqa: E402


def _patch(setting: str) -> None:
    tma.tensor_map_2d = functools.partial(tma.tensor_map_2d, l2_promotion=int(setting))


if __name__ == "__main__":
    run_patched(sys.argv[1:], __doc__, _patch)
