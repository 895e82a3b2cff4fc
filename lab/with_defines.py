#!/usr/bin/env python3
"""Run a lab script with extra -D defines on the wgmma kernels (pair and serial; a lab switch
such as PA_PAIR_TRACE=1 or PA_WG_EVICT=1), without touching the package:

    PYTHONPATH=.:tools python lab/with_defines.py PA_PAIR_TRACE=1 lab/paged_pair_trace.py 16

Patches ``builds.wg_variant`` for the ``pair`` schedule, then runs the script as __main__.
"""

from __future__ import annotations

import dataclasses
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

from attnrt.ops.paged_attention import builds  # noqa: E402


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if argv[:1] in (["-h"], ["--help"]) else 2)
    extra = dict(kv.split("=", 1) for kv in argv[0].split(",") if kv)
    orig = builds.wg_variant

    def patched(dtype, shape=builds.MLA_SHAPES[0], schedule="serial"):
        v = orig(dtype, shape, schedule)
        return dataclasses.replace(v, defines={**v.defines, **extra})

    builds.wg_variant = patched
    sys.argv = argv[1:]
    runpy.run_path(argv[1], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
