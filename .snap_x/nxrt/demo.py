"""``nxrt demo``: a thin door to the decode demo in :mod:`nxrt_kernels.demo`.

The demo is application code on top of the kernels, so it lives in ``nxrt_kernels``; the
runtime layer never imports ``nxrt_kernels`` at module import time, only here, when the
command runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main"]


def main(args: argparse.Namespace) -> int:
    """Run ``nxrt_kernels.demo.main(args)``; its exit status (2 when it cannot be imported)."""
    try:
        demo = importlib.import_module("nxrt_kernels.demo")
    except ImportError as exc:
        print(f"nxrt demo: the kernels package is not importable ({exc}); install nxrt with its "
              "nxrt_kernels package (pip install -e .)", file=sys.stderr)
        return 2
    return int(demo.main(args))
