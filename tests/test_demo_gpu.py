"""``attnrt demo`` on the GPU (in process and through the CLI) and
``examples/torch_capture_replay.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnrt.app import demo

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    # The session's cache directory (tests/conftest.py), so compiles are shared with the
    # other GPU tests; the repository on the path, as tools/gpu_check.sh sets it.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)


def test_demo_decode_loop(ledger):
    lines: list[str] = []
    report = demo.run_demo(demo.DemoConfig(steps=6), rt=ledger, say=lines.append)
    text = demo.format_report(report)
    print(text)
    assert report["ok"], report["failures"]
    for phase in ("prefill", "eager", "replay", "caches"):
        for op, err in report["max_rel_err"][phase].items():
            assert err <= demo.TOL, (phase, op, err)
    assert set(report["max_rel_err"]["replay"]) == {"PagedAttention", "IndexShare"}
    dec = report["decode"]
    assert dec["replays"] == 6 and dec["eager_steps"] == 6
    assert dec["replay_ms_per_step"] < dec["eager_ms_per_step"], text
    assert dec["kernels_per_step"] >= 4 and dec["graph_nodes"] >= dec["kernels_per_step"]
    assert report["ledger"]["live_bytes"] == 0
    assert {"Attention", "PagedAttention", "IndexShare"} <= set(report["paths"])
    assert "result     OK" in text


def test_cli_demo_reports_ok():
    res = _run(["-m", "attnrt.app.cli", "demo", "--steps", "4", "--layers", "2"])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "result     OK" in res.stdout and "0 live bytes" in res.stdout, res.stdout


def test_capture_replay_script():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    res = _run([str(ROOT / "examples" / "torch_capture_replay.py"), "--steps", "5"])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "capture_replay: OK" in res.stdout and "replay 5" in res.stdout
