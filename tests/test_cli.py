"""The ``attnrt`` command without a GPU: doctor exits 0, warm compiles into the cache."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import re
import subprocess
import sys

import pytest

from attnrt.app import cli
from attnrt.app.cli import main
from attnrt.runtime import compiler
from attnrt.runtime.cache import FORMAT_VERSION, CompileCache
from attnrt.runtime.errors import PerformanceWarning


def _limit_memory() -> None:  # a reader that allocates without bound fails fast, not the machine
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def run_cli(*args: str, env: dict | None = None, timeout: float = 600,
            limit_memory: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnrt.app.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout,
                          preexec_fn=_limit_memory if limit_memory else None)


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


def _bad_archs() -> dict[str, tuple[str, str]]:
    supported = compiler.supported_archs()
    out = {"not-an-arch": ("ampere", "arch must look like"),
           "newer-than-nvrtc": (f"sm_{supported[-1] + 100}", "is not a target of NVRTC"),
           "older-than-nvrtc": ("sm_20", "is not a target of NVRTC"),
           "no-kernel": ("sm_90", "no registered kernel runs on sm_90")}  # min_arch 100 below
    return out


@pytest.mark.parametrize("case", ["not-an-arch", "newer-than-nvrtc", "older-than-nvrtc", "no-kernel"])
def test_warm_rejects_a_bad_arch_with_one_error(tmp_path, monkeypatch, capsys, case):
    arch, message = _bad_archs()[case]
    monkeypatch.setenv("ATTNRT_CACHE_DIR", str(tmp_path))
    if case == "no-kernel":  # an arch NVRTC has, below every variant's minimum
        from attnrt.ops import index_share

        v = next(x for x in index_share.compile_variants() if x.min_arch <= 80)
        late = dataclasses.replace(v, min_arch=100)
        monkeypatch.setattr(cli, "_variants", lambda: [("pkg.nxrt::IndexShare", late)])

    def no_pool(*a, **k):
        raise AssertionError("warm started compiling")

    monkeypatch.setattr(cli, "ProcessPoolExecutor", no_pool)
    good = [] if case == "no-kernel" else ["--arch", "sm_80"]  # a good arch does not hide a bad one
    assert main(["warm", *good, "--arch", arch]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("attnrt warm: error: ")
    assert message in err and arch in err
    with pytest.raises(ValueError, match=message):
        cli.warm([arch], quiet=True)
    assert not any(tmp_path.iterdir())


def test_check_archs_dedupes_and_keeps_the_suffix():
    from attnrt.ops import index_share

    variants = [("x", v) for v in index_share.compile_variants()]
    assert cli.check_archs(["sm_90", "90", "sm_80", "sm_90a", "sm_90"], variants) == ["sm_90", "sm_80",
                                                                                      "sm_90a"]
    assert cli.check_archs([], variants) == []


# -- the progress line ---------------------------------------------------------------------------

class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "terminal"])
def test_progress_fits_80_columns_and_uses_cr_only_on_a_terminal(tty, monkeypatch):
    wide = os.terminal_size((200, 50))
    monkeypatch.setattr(cli.shutil, "get_terminal_size", lambda fallback=(80, 24): wide)
    stream = _Stream(tty)
    p = cli._Progress(23, stream)
    long = "attention_fwd.cu sm_90a " + " ".join(f"-DOPTION_{i}=12345" for i in range(12)) + " (3.2 s)"
    for i in range(23):
        p.step(long if i % 5 else "FAILED: " + long, ok=bool(i % 5))
    p.end()
    text = stream.getvalue()
    assert ("\r" in text) is tty
    lines = [seg for line in text.split("\n") for seg in line.split("\r")]
    assert lines and max(map(len, lines)) <= 80, max(lines, key=len)
    if not tty:  # one line per tenth of the work, plus one per failure
        assert text.count("done,") == 10 and text.count("FAILED") == 5
        assert text.rstrip("\n").splitlines()[-1] == "warm: 23/23 done, 5 failed"


def test_warm_writes_no_carriage_return_to_a_pipe(monkeypatch, capsys):
    from attnrt.ops import index_share

    v = next(x for x in index_share.compile_variants() if x.min_arch <= 80)
    monkeypatch.setattr(cli, "_variants", lambda: [("pkg.nxrt::IndexShare", v)])
    assert main(["warm", "--arch", "sm_80", "--jobs", "1"]) == 0  # the session cache
    err = capsys.readouterr().err
    assert "\r" not in err and "warm: 1/1 done, 0 failed" in err
    assert re.search(r"^warm: 1 variants \(sm_80\) in \d+ s: (1 compiled, 0|0 compiled, 1) cached, 0 failed$",
                     err, re.M), err
    assert max(map(len, err.splitlines())) <= 80


# -- help, --json, options, broken pipes ----------------------------------------------------------

def test_every_subcommand_and_option_has_help():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    assert set(helps) == set(sub.choices) == {"doctor", "cache", "warm", "demo"}
    assert all(helps.values()), helps
    for name, sp in sub.choices.items():
        missing = [a.dest for a in sp._actions if not isinstance(a, argparse._HelpAction) and not a.help]
        assert not missing, f"{name}: options without help: {missing}"
        assert "usage:" in sp.format_help()


def test_cache_ls_shows_options_and_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("attnrt.runtime.cache._default", None)
    src = 'extern "C" __global__ void k(int* x) { x[0] = VALUE; }\n'
    CompileCache(tmp_path, disk=True).get(src, "opts.cu", "sm_80", ["-DVALUE=7", "-DALPHA=1"])
    assert main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    assert "opts.cu" in out and "-DALPHA=1 -DVALUE=7" in out and "1 entries" in out
    assert main(["cache", "ls", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    [e] = info["entries"]
    assert (e["name"], e["arch"], e["options"]) == ("opts.cu", "sm_80", ["-DALPHA=1", "-DVALUE=7"])
    assert info["problems"] == []
    assert main(["cache", "stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["entries"], stats["by_arch"], stats["dir"]) == (1, {"sm_80": 1}, str(tmp_path))
    assert main(["cache", "stats"]) == 0
    human = capsys.readouterr().out
    assert "1 entries" in human and "sm_80" in human and not human.lstrip().startswith("{")


@pytest.mark.parametrize("args", [("doctor",), ("cache", "ls"), ("doctor", "--json")])
def test_a_closed_pipe_exits_quietly(args, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "attnrt.app.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "ATTNRT_CACHE_DIR": str(tmp_path)})
    proc.stdout.close()  # the reader is gone before the first line (`| head -0`)
    _out, err = proc.communicate(timeout=300)
    assert err.decode() == "" and proc.returncode == 141


# -- a cache directory with anything in it -------------------------------------------------------

def test_cli_survives_any_directory_content(tmp_path):
    from tests.test_cache_hardening import _hostile

    env = {"ATTNRT_CACHE_DIR": str(tmp_path / "c")}
    c = CompileCache(tmp_path / "c", disk=True)
    src = 'extern "C" __global__ void k(int* x) { x[0] = A; }\n'
    c.get(src, "good.cu", "sm_80", ["-DA=1"])
    key = c.key(src, "sm_80", ["-DA=1"])
    kinds = _hostile(c)
    for args in (["cache", "ls"], ["cache", "stats"]):
        res = run_cli(*args, env=env, timeout=120, limit_memory=True)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "1 entries" in res.stdout and f"{len(kinds)} items are not valid" in res.stdout
        assert "a FIFO" in res.stdout and "a directory" in res.stdout and "a socket" in res.stdout
    info = json.loads(run_cli("cache", "ls", "--json", env=env, timeout=120, limit_memory=True).stdout)
    assert len(info["entries"]) == 1 and len(info["problems"]) == len(kinds)
    doc = run_cli("doctor", "--json", env={**env, "ATTNRT_CACHE": "0"}, timeout=120, limit_memory=True)
    assert doc.returncode == 0, doc.stderr[-3000:]
    assert json.loads(doc.stdout)["cache"] | {} == {"dir": env["ATTNRT_CACHE_DIR"], "disk_enabled": False,
                                                    "entries": 1, "bytes": c.path_for(key).stat().st_size,
                                                    "problems": len(kinds)}
    res = run_cli("cache", "verify", env=env, timeout=120, limit_memory=True)
    assert res.returncode == 1 and "1 valid, 6 bad" in res.stdout, res.stderr[-3000:]
    assert all(str(p) in res.stdout for p in kinds.values())
    res = run_cli("cache", "clear", env=env, timeout=120, limit_memory=True)
    assert res.returncode == 0 and "removed 7 entries" in res.stdout, res.stderr[-3000:]
    assert not any(os.path.lexists(p) for p in kinds.values())


def test_verify_remove_deletes_directory_entries(tmp_path):
    from tests.test_cache_hardening import _hostile

    env = {"ATTNRT_CACHE_DIR": str(tmp_path / "c")}
    kinds = _hostile(CompileCache(tmp_path / "c", disk=True))
    res = run_cli("cache", "verify", "--remove", env=env, timeout=120, limit_memory=True)
    assert res.returncode == 0 and "0 valid, 6 bad" in res.stdout, res.stderr[-3000:]
    assert "(removed)" in res.stdout and "a directory" in res.stdout
    assert not any(os.path.lexists(p) for p in kinds.values())
    res = run_cli("cache", "verify", env=env, timeout=120, limit_memory=True)
    assert res.stdout.strip() == "0 valid, 0 bad"


def test_warm_op_filter_selects_one_ops_variants(monkeypatch):
    seen: dict = {}
    variants = cli._variants()
    paged = cli.select_ops(variants, ["PagedAttention"])
    assert paged and {op for op, _ in paged} == {"com.microsoft::PagedAttention"}
    # The full name, any case, and several ops at once.
    assert cli.select_ops(variants, ["com.microsoft::pagedattention"]) == paged
    both = cli.select_ops(variants, ["PagedAttention", "Attention"])
    assert {op for op, _ in both} == {"com.microsoft::PagedAttention", "pkg.nxrt::Attention"}
    assert cli.select_ops(variants, []) == variants
    with pytest.raises(ValueError, match="unknown op 'Nope'; registered: .*PagedAttention"):
        cli.select_ops(variants, ["Nope"])
    # warm() compiles exactly the selected variants (the pool is replaced by a recorder).
    monkeypatch.setattr(cli, "ProcessPoolExecutor", _RecordingPool(seen))
    ok, _skip, errors, _advice = cli.warm(["sm_90"], jobs=1, quiet=True, ops=["PagedAttention"])
    assert errors == [] and ok == len(paged) == len(seen["work"])
    assert {w[0] for w in seen["work"]} == {v.file for _, v in paged}


def test_warm_unknown_op_is_one_error_and_compiles_nothing(monkeypatch, capsys):
    monkeypatch.setattr(cli, "ProcessPoolExecutor", _RecordingPool({}))
    assert main(["warm", "--arch", "sm_90", "--op", "Nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown op 'Nope'" in err and err.count("\n") == 1


class _RecordingPool:
    """Stands in for ProcessPoolExecutor: runs nothing, records what warm submits, and hands
    back finished futures as if every variant came from the cache."""

    def __init__(self, seen: dict) -> None:
        self.seen = seen

    def __call__(self, *a, **k):
        return self

    def __enter__(self):
        self.seen["work"] = []
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, file, module, target, options):
        from concurrent.futures import Future

        self.seen["work"].append((file, target, options))
        f: Future = Future()
        f.set_result((0.0, False, []))
        return f
