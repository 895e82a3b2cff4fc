#!/usr/bin/env python3
"""Run the PagedAttention wgmma child test (``tests/test_paged_gpu.py::_wg_child``) for one
schedule, in this process: the body compute-sanitizer wraps.

    compute-sanitizer --tool racecheck python lab/wg_child.py pair
    python lab/with_defines.py PA_PAIR_FULLSYNC=1 lab/wg_child.py pair

Exit status 0 when every case passes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("schedule", choices=("serial", "pair"))
    args = ap.parse_args(argv)
    from tests.test_paged_gpu import _wg_child

    _wg_child(args.schedule)  # raises on a failing case
    return 0


if __name__ == "__main__":
    sys.exit(main())
