"""The measurement tools import and parse their arguments on a machine without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("tool, words", [("read_floor.py", "read floor of attention decode"),
                                         ("gather_ceiling.py", "gather IndexShare")])
def test_tool_help(tool: str, words: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "tools" / tool), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert words in " ".join(r.stdout.split()), r.stdout


def test_read_floor_kernel_compiles() -> None:
    """The kernel read_floor.py launches (gather_ceiling's read_seq) compiles for sm_80/90."""
    sys.path.insert(0, str(ROOT / "tools"))
    from gather_ceiling import SRC

    from nxrt.compiler import compile_source

    for arch in ("sm_80", "sm_90"):
        c = compile_source(SRC, "gather_ceiling.cu", arch, ["-DUNROLL=4"], {})
        assert b"read_seq" in (c.ptx if isinstance(c.ptx, bytes) else c.ptx.encode())
