#!/usr/bin/env python3
"""Run a lab script with the PagedAttention pair kernel's TMA tensor map encoded with another
L2 promotion (bytes an L2 miss fetches: 0, 64, 128 or 256; the package uses 256):

    PYTHONPATH=.:tools python lab/with_l2_promotion.py 128 lab/paged_rows.py --wg pair decode:16:32:8192
"""

from __future__ import annotations

import functools
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

from attnrt.ops.paged_attention import kernel  # noqa: E402


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if argv[:1] in (["-h"], ["--help"]) else 2)
    kernel.tensor_map_2d = functools.partial(kernel.tensor_map_2d, l2_promotion=int(argv[0]))
    sys.argv = argv[1:]
    runpy.run_path(argv[1], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
