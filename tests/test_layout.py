"""The package layout rules of docs/DESIGN (checked on the source text, no GPU):

- only ``attnrt/runtime/_check.py`` compares a ``CUresult``, and only ``attnrt/runtime/``
  imports ``cuda.bindings``;
- the runtime never imports the ops (arrows point down only);
- modules stay under the hard cap of 450 lines;
- package code carries no work-log references (review rounds, commit hashes).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "attnrt"
RUNTIME = PKG / "runtime"
MAX_LINES = 450


def _sources(root: Path = PKG) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(p: Path) -> str:
    return p.relative_to(REPO).as_posix()


def test_the_sources_are_found():
    names = {_rel(p) for p in _sources()}
    assert "attnrt/runtime/_check.py" in names and "attnrt/app/cli.py" in names
    assert len(names) > 20


_CURESULT = re.compile(r"\bCUresult\.")
_BINDINGS_IMPORT = re.compile(r"^\s*(?:from\s+cuda\.bindings\b|from\s+cuda\s+import\s+[^#\n]*\bbindings\b"
                              r"|import\s+cuda\.bindings\b)", re.M)


def test_only_the_check_module_compares_a_curesult():
    offenders = []
    for p in _sources():
        if p == RUNTIME / "_check.py":
            continue
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if _CURESULT.search(line):
                offenders.append(f"{_rel(p)}:{n}: {line.strip()}")
    assert not offenders, "compare driver results through attnrt.runtime._check:\n" + "\n".join(offenders)


def test_cuda_bindings_are_imported_only_by_the_runtime():
    offenders = [f"{_rel(p)}: {m.group(0).strip()}" for p in _sources()
                 if RUNTIME not in p.parents for m in _BINDINGS_IMPORT.finditer(p.read_text())]
    assert not offenders, "only attnrt/runtime/ may import cuda.bindings:\n" + "\n".join(offenders)


def test_the_layout_patterns_catch_what_they_must():
    # The checks above are only as good as their patterns.
    assert _CURESULT.search("if res[0] == driver.CUresult.CUDA_SUCCESS:")
    assert not _CURESULT.search("a nonzero ``CUresult`` raises")
    for line in ("from cuda.bindings import driver", "import cuda.bindings.driver as d",
                 "    from cuda import bindings", "from cuda.bindings.nvrtc import x"):
        assert _BINDINGS_IMPORT.search(line), line
    assert not _BINDINGS_IMPORT.search("from cuda import pathfinder")


_WALK = r"""
import importlib, json, pkgutil, sys
import attnrt.runtime as rt
names = [m.name for m in pkgutil.walk_packages(rt.__path__, "attnrt.runtime.")]
for name in names:
    try:
        importlib.import_module(name)
    except ImportError as exc:  # an optional extension (the compiled launch path) not built
        if "_launchc" not in name:
            raise
print(json.dumps({"walked": names, "modules": sorted(sys.modules)}))
"""


def test_importing_the_runtime_imports_no_op():
    res = subprocess.run([sys.executable, "-c", _WALK], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert "attnrt.runtime.cache" in out["walked"] and "attnrt.runtime._check" in out["walked"]
    leaked = [m for m in out["modules"] if m == "attnrt.ops" or m.startswith("attnrt.ops.")]
    assert not leaked, f"importing attnrt.runtime pulled in {leaked}"


_OPS_MENTION = re.compile(r"attnrt\.ops\b|from\s+\.\.ops\b|from\s+\.\.\s+import\s+ops\b")


def test_no_runtime_file_mentions_the_ops():
    offenders = [f"{_rel(p)}:{n}: {line.strip()}" for p in sorted(RUNTIME.rglob("*"))
                 if p.is_file() and p.suffix in (".py", ".c", ".pyi")
                 for n, line in enumerate(p.read_text().splitlines(), 1) if _OPS_MENTION.search(line)]
    assert not offenders, "attnrt.runtime must not know attnrt.ops:\n" + "\n".join(offenders)


def test_modules_stay_under_the_line_cap():
    long = {_rel(p): n for p in _sources() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


_WORKLOG = [
    ("review round", re.compile(r"\bround \d+", re.I)),
    ("NOTES round", re.compile(r"NOTES rounds?\b")),
    ("commit hash in backticks", re.compile(r"`[0-9a-f]{7,40}`")),
    ("commit hash", re.compile(r"\bcommit\s+[0-9a-f]{7,40}\b", re.I)),
]


def _worklog_hits(text: str) -> list[str]:
    return [what for what, rx in _WORKLOG if rx.search(text)]


def test_the_worklog_patterns_catch_what_they_must():
    assert _worklog_hits("(NOTES round 10)") == ["review round", "NOTES round"]
    assert _worklog_hits("as measured at `f8c7f18`") == ["commit hash in backticks"]
    assert _worklog_hits("since commit 9ba802f the split is") == ["commit hash"]
    assert _worklog_hits("round up to 16; around 128 rows; see docs/notes/attention.md") == []
    assert _worklog_hits("magic 0x7fELF and `sm_90a`") == []


def test_no_worklog_references_in_package_code():
    offenders = [f"{_rel(p)}:{n}: {what}: {line.strip()}" for p in _sources()
                 for n, line in enumerate(p.read_text().splitlines(), 1) for what in _worklog_hits(line)]
    assert not offenders, "package code says why, not when:\n" + "\n".join(offenders)
