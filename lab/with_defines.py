#!/usr/bin/env python3
"""Run a lab script with extra -D defines on the wgmma kernels (pair and serial; a lab switch
such as PA_PAIR_TRACE=1 or PA_PAIR_ORDER=0), without touching the package:

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


def run_patched(argv: list[str], doc: str, patch) -> None:
    """``argv`` = [SETTING, SCRIPT, ARGS...]: ``patch(SETTING)``, then SCRIPT as __main__
    with ARGS (``doc`` printed for -h/--help or a short command line)."""
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print(doc)
        sys.exit(0 if argv[:1] in (["-h"], ["--help"]) else 2)
    patch(argv[0])
    sys.argv = argv[1:]
    runpy.run_path(argv[1], run_name="__main__")


def _patch_defines(setting: str) -> None:
    extra = dict(kv.split("=", 1) for kv in setting.split(",") if kv)
    orig = builds.wg_variant

    def patched(dtype, shape=builds.MLA_SHAPES[0], schedule="serial", softcap=False):
        v = orig(dtype, shape, schedule, softcap)
        return dataclasses.replace(v, defines={**v.defines, **extra})

    builds.wg_variant = patched


if __name__ == "__main__":
    run_patched(sys.argv[1:], __doc__, _patch_defines)
