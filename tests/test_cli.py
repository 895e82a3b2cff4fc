"""The ``attnrt`` command without a GPU: doctor exits 0, warm compiles into the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from attnrt.app import cli
from attnrt.app.cli import main
from attnrt.runtime import compiler
from attnrt.runtime.cache import FORMAT_VERSION, CompileCache
from attnrt.runtime.errors import PerformanceWarning


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnrt.app.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


def test_doctor_runs_and_reports(tmp_path):
    res = run_cli("doctor", "--json", env={"ATTNRT_CACHE_DIR": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["nvrtc"][0].isdigit()
    assert "sm_90" in info["nvrtc_archs"]
    assert info["include_dirs"], "the CUDA headers must be found through cuda.pathfinder"
    assert info["cache"]["dir"] == str(tmp_path)


def test_doctor_human_output():
    res = run_cli("doctor")
    assert res.returncode == 0, res.stderr
    assert "NVRTC:" in res.stdout and "compile cache:" in res.stdout


def test_cache_commands_on_empty_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("attnrt.runtime.cache._default", None)
    assert main(["cache", "ls"]) == 0
    assert main(["cache", "verify"]) == 0
    assert main(["cache", "clear"]) == 0
    assert main(["cache", "stats"]) == 0
    out = capsys.readouterr().out
    assert "0 entries" in out and "0 valid, 0 bad" in out


def test_cache_verify_flags_a_corrupt_entry(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("attnrt.runtime.cache._default", None)
    bad = tmp_path / f"v{FORMAT_VERSION}" / "ab" / ("ab" + "0" * 62 + ".nxc")
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"NXRTCACHE\x01 truncated")
    assert main(["cache", "verify"]) == 1
    assert main(["cache", "verify", "--remove"]) == 0
    assert not bad.exists()


@pytest.mark.slow
def test_warm_fills_the_cache_without_a_gpu():
    # The session cache (shared with the kernel-source tests, so compiles are not repeated).
    env = {"ATTNRT_CACHE_DIR": os.environ["ATTNRT_CACHE_DIR"]}
    res = run_cli("warm", "--arch", "sm_90", env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "failed" in res.stderr and " 0 failed" in res.stderr
    # No shipped variant draws a ptxas performance advisory (e.g. serialised wgmmas) here.
    assert "performance loss" not in res.stderr, res.stderr[-4000:]
    ls = run_cli("cache", "ls", env=env)
    n = int(ls.stdout.strip().splitlines()[-1].split()[0])
    assert n >= 1
    # A second warm compiles nothing: everything comes from the disk cache.
    again = run_cli("warm", "--arch", "sm_90", env=env)
    assert again.returncode == 0 and " 0 compiled" in again.stderr, again.stderr[-2000:]


def test_warm_reports_ptxas_performance_advisories(tmp_path, monkeypatch, capsys):
    """An entry whose compile drew ptxas's "Potential Performance Loss" is named by warm (from
    its worker's disk hit) and listed by ``attnrt warm``, which still exits 0."""
    from attnrt.ops import _common, index_share

    v = next(x for x in index_share.compile_variants() if x.min_arch <= 80)
    monkeypatch.setenv("ATTNRT_CACHE_DIR", str(tmp_path))  # the spawned workers' cache too
    monkeypatch.setattr(cli, "_variants", lambda: [("pkg.nxrt::IndexShare", v)])
    line = "ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized"
    real = compiler._program_log
    with monkeypatch.context() as m:
        m.setattr(compiler, "_program_log", lambda prog: real(prog) + "\n" + line + "\n")
        with pytest.warns(PerformanceWarning):
            CompileCache(tmp_path, disk=True).get(_common.source(v.file), v.module + ".cu", "sm_80",
                                                  v.options, _common.headers())
    vid = f"{v.file} sm_80 {' '.join(v.options)}"
    ok, _skip, errors, advice = cli.warm(["sm_80"], jobs=1, quiet=True)
    assert (ok, errors, advice) == (1, [], {vid: [line]})
    assert main(["warm", "--arch", "sm_80", "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    assert "performance loss in 1 variant(s)" in err and vid in err and line in err
    assert main(["warm", "--arch", "sm_80", "--jobs", "1", "--strict"]) == 1
    monkeypatch.setattr(cli, "_variants", lambda: [])
    assert main(["warm", "--arch", "sm_80", "--strict"]) == 0


def test_warm_rejects_a_bad_arch():
    with pytest.raises(ValueError, match="arch must look like"):
        main(["warm", "--arch", "ampere"])
