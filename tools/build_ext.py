#!/usr/bin/env python3
"""Build the optional compiled launch path (``attnrt/runtime/_launchc*.so``) in place.

``pip install .`` / ``pip install -e .`` build it through setup.py. This script is for a
checkout used straight from PYTHONPATH (tools/gpu_check.sh): it compiles the same extension
with setuptools' build_ext without reading pyproject.toml, so it also works with the older
setuptools that machines without network access may have. Exit 0 with a note when no C
compiler is available: attnrt then launches through ctypes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    try:
        from setuptools import Distribution, Extension
    except ImportError:
        print("build_ext: setuptools is missing; attnrt launches through ctypes")
        return 0
    ext = Extension("attnrt.runtime._launchc", ["attnrt/runtime/_launchc.c"],
                    define_macros=[("Py_LIMITED_API", "0x030A0000")], py_limited_api=True)
    os.chdir(ROOT)
    dist = Distribution({"name": "nxrt-launchc", "ext_modules": [ext]})
    cmd = dist.get_command_obj("build_ext")
    cmd.inplace = True
    try:
        cmd.ensure_finalized()
        cmd.run()
    except Exception as exc:  # no compiler, no headers: the ctypes path remains
        print(f"build_ext: compiled launch path not built ({type(exc).__name__}: {exc}); "
              "attnrt launches through ctypes")
        return 0
    built = ROOT.glob("attnrt/runtime/_launchc*.so")
    print("build_ext: built", ", ".join(str(p.relative_to(ROOT)) for p in built))
    return 0


if __name__ == "__main__":
    sys.exit(main())
