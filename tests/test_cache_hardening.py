"""The compile cache against hostile directory content (no GPU): FIFOs, sockets, symlinks to
devices, directories and huge or lying files where entries should be are misses for readers
and reported items for listing/verify/clear, never a hang, an unbounded read or an
exception; entries are written so that other users can read them (respecting the umask).

A regression must fail, not hang CI: readers that could block run in a thread that the test
unblocks itself (by opening the FIFO's write end), and readers that could allocate without
bound run in a subprocess under an address-space limit and a timeout.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from attnrt.runtime import _cachefs
from attnrt.runtime import cache as cache_mod
from attnrt.runtime.cache import CompileCache
from attnrt.runtime.compiler import Compiled

ARCH = "sm_80"
TINY = 'extern "C" __global__ void k(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] = 3.0f; }\n'
REPO = Path(__file__).resolve().parents[1]
LIMIT_AS = 2 << 30  # a reader that allocates without bound fails fast under this


def _fake(seed: int = 0) -> Compiled:
    return Compiled(cubin=b"\x7fELF" + bytes([seed]) * 37, ptx=b"// ptx " + str(seed).encode(),
                    arch=ARCH, log="", seconds=0.25)


def _entry_path(c: CompileCache, seed: int = 0) -> tuple[str, Path]:
    key = f"{seed:02x}" + "ab" * 31
    return key, c.path_for(key)


def _finishes(fn, fifo: Path | None = None, timeout: float = 20.0):
    """``fn()``'s result, or a test failure if it blocks (a blocked FIFO reader is released
    by opening the write end, so that the thread ends either way)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # re-raised below, in the test's thread
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        if fifo is not None:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            t.join(timeout)
        pytest.fail(f"{fn} blocked for {timeout} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


# -- FIFOs, directories, sockets, symlinks where an entry should be ---------------------------------

def test_a_fifo_entry_is_a_miss_not_a_hang(tmp_path):
    c = CompileCache(tmp_path, disk=True)
    key = c.key(TINY, ARCH)
    fifo = c.path_for(key)
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    compiled = _finishes(lambda: c.get(TINY, "tiny.cu", ARCH), fifo)
    assert compiled.cubin.startswith(b"\x7fELF")
    assert (c.stats.bad_entries, c.stats.compiles) == (1, 1)
    assert c.stats.write_errors == 0 and stat.S_ISREG(os.lstat(fifo).st_mode)  # replaced by the entry


def test_listing_and_verify_survive_a_fifo(tmp_path):
    c = CompileCache(tmp_path, disk=True)
    _key, fifo = _entry_path(c)
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    assert _finishes(c.entries, fifo) == []
    assert _finishes(c.audit, fifo) == (0, [(fifo, "a FIFO")])
    assert _finishes(c.size_bytes, fifo) == 0
    assert _finishes(lambda: c.audit(remove=True), fifo) == (0, [(fifo, "a FIFO")])
    assert not os.path.lexists(fifo)


def _hostile(c: CompileCache) -> dict[str, Path]:
    """One of each kind of non-entry, at paths where entries would be."""
    paths = {}
    for i, name in enumerate(["directory", "fifo", "socket", "dev-zero-link", "dangling-link",
                              "valid-entry-link"]):
        paths[name] = _entry_path(c, i + 1)[1]
    target = c.directory / "elsewhere.nxc"
    paths["directory"].mkdir(parents=True)
    (paths["directory"] / "inner").write_bytes(b"x")
    for p in paths.values():
        p.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(paths["fifo"])
    cwd = os.getcwd()
    os.chdir(paths["socket"].parent)  # a relative name: AF_UNIX paths are short
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(paths["socket"].name)
    finally:
        os.chdir(cwd)
    paths["dev-zero-link"].symlink_to("/dev/zero")
    paths["dangling-link"].symlink_to(c.directory / "absent.nxc")
    key = paths["valid-entry-link"].name[:-4]
    c.directory.mkdir(parents=True, exist_ok=True)
    target.write_bytes(cache_mod._encode(key, _fake(), "x.cu"))
    paths["valid-entry-link"].symlink_to(target)
    return paths


def test_every_kind_of_non_entry_is_reported_and_removed(tmp_path):
    c = CompileCache(tmp_path, disk=True)
    good_key, good = _entry_path(c)
    c._store(good_key, _fake(), "good.cu", ["-DB=1", "-DA=2"])
    paths = _hostile(c)
    entries, problems = c.listing()
    assert [(e.key, e.name, e.options) for e in entries] == [(good_key, "good.cu", ("-DA=2", "-DB=1"))]
    why = {p: w for p, w in problems}
    assert set(why) == set(paths.values())
    assert why[paths["directory"]] == "a directory" and why[paths["fifo"]] == "a FIFO"
    assert why[paths["socket"]] == "a socket"
    assert {why[paths[k]] for k in ("dev-zero-link", "dangling-link", "valid-entry-link")} == {"a symlink"}
    assert c.size_bytes() == good.stat().st_size  # links are not followed, FIFOs not opened
    good_n, bad = c.audit(remove=True)
    assert good_n == 1 and {p for p, _w in bad} == set(paths.values())
    assert not any(os.path.lexists(p) for p in paths.values())
    assert os.path.exists("/dev/zero") and (c.directory / "elsewhere.nxc").is_file()  # targets kept
    assert c.audit() == (1, [])


def test_clear_removes_directories_and_links_not_their_targets(tmp_path):
    c = CompileCache(tmp_path / "c", disk=True)
    paths = _hostile(c)
    _key, old = _entry_path(c)
    old_dir = c.directory / "v1" / old.parent.name
    old_dir.mkdir(parents=True)
    (old_dir / old.name).mkdir()  # an older format's "entry" that is a directory
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "ab").mkdir()
    (outside / "ab" / old.name).write_bytes(b"not ours")
    (c.directory / "v0").symlink_to(outside)  # an older format's directory that is a link
    n, failed = c.purge()
    assert failed == [] and n == len(paths) + 1
    assert not any(os.path.lexists(p) for p in paths.values()) and not (old_dir / old.name).exists()
    assert (outside / "ab" / old.name).read_bytes() == b"not ours"
    assert c.clear() == 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_entry_is_a_miss_and_reported(tmp_path):
    c = CompileCache(tmp_path, disk=True)
    key, p = _entry_path(c)
    c._store(key, _fake(), "x.cu")
    p.chmod(0)
    assert c._load(key) is None and c.stats.bad_entries == 1
    _good, bad = c.audit()
    assert bad == [(p, bad[0][1])] and bad[0][1].startswith("unreadable")


# -- unbounded reads ----------------------------------------------------------------------------

_GUARDED = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
from attnrt.runtime.cache import CompileCache
src = 'extern "C" __global__ void k(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] = 3.0f; }\n'
c = CompileCache(sys.argv[1], disk=True)
c.get(src, "tiny.cu", "sm_80")
print(json.dumps({"stats": c.stats.as_dict(), "entries": len(c.entries()),
                  "problems": [w for _p, w in c.audit()[1]]}))
"""


def _run_guarded(directory: Path) -> dict:
    res = subprocess.run([sys.executable, "-c", _GUARDED, str(directory), str(LIMIT_AS)],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_symlink_to_dev_zero_is_a_miss_not_an_unbounded_read(tmp_path):
    c = CompileCache(tmp_path, disk=True)
    p = c.path_for(c.key(TINY, ARCH))
    p.parent.mkdir(parents=True)
    p.symlink_to("/dev/zero")
    out = _run_guarded(tmp_path)
    assert out["stats"]["compiles"] == 1 and out["stats"]["bad_entries"] == 1
    assert out["entries"] == 1 and out["problems"] == []  # the link was replaced by the entry


def test_a_huge_sparse_entry_is_not_read(tmp_path):
    c = CompileCache(tmp_path, disk=True)
    p = c.path_for(c.key(TINY, ARCH))
    p.parent.mkdir(parents=True)
    with open(p, "wb") as f:
        f.write(cache_mod.MAGIC + (2**32 - 1).to_bytes(4, "little"))
        f.truncate(4 << 30)  # sparse: 4 GiB that cost no disk
    out = _run_guarded(tmp_path)
    assert out["stats"]["compiles"] == 1 and out["stats"]["bad_entries"] == 1


def _count_reads(monkeypatch) -> list[int]:
    got: list[int] = []
    real = os.read

    def counting(fd, n):
        data = real(fd, n)
        got.append(len(data))
        return data

    monkeypatch.setattr(_cachefs.os, "read", counting)
    return got


@pytest.mark.parametrize("case", ["meta-length-huge", "meta-length-past-end", "blob-lengths-huge",
                                  "blob-lengths-negative", "trailing-megabytes", "truncated-header",
                                  "header-only"])
def test_lying_or_truncated_headers_are_misses_read_within_bounds(tmp_path, monkeypatch, case):
    c = CompileCache(tmp_path, disk=True)
    key, p = _entry_path(c)
    valid = cache_mod._encode(key, _fake(), "x.cu")
    mlen = int.from_bytes(valid[len(cache_mod.MAGIC):len(cache_mod.MAGIC) + 4], "little")
    meta = json.loads(valid[len(cache_mod.MAGIC) + 4:len(cache_mod.MAGIC) + 4 + mlen])

    def with_meta(**over) -> bytes:
        m = json.dumps({**meta, **over}).encode()
        return cache_mod.MAGIC + len(m).to_bytes(4, "little") + m + b"\0" * 64

    data = {
        "meta-length-huge": cache_mod.MAGIC + (2**32 - 1).to_bytes(4, "little") + b"{}" * 1000,
        "meta-length-past-end": valid[:len(cache_mod.MAGIC)] + (mlen + 10).to_bytes(4, "little")
        + valid[len(cache_mod.MAGIC) + 4:],
        "blob-lengths-huge": with_meta(cubin_len=2**40, ptx_len=2**40),
        "blob-lengths-negative": with_meta(cubin_len=-100),
        "trailing-megabytes": valid + b"\0" * (8 << 20),
        "truncated-header": valid[:len(cache_mod.MAGIC) + 2],
        "header-only": valid[:len(cache_mod.MAGIC) + 4],
    }[case]
    p.parent.mkdir(parents=True)
    p.write_bytes(data)
    reads = _count_reads(monkeypatch)
    assert c._load(key) is None and c.stats.bad_entries == 1
    assert sum(reads) <= len(valid) + 1, "read more than a valid entry's length (+1 byte)"
    assert c.entries() == [] and [q for q, _w in c.audit()[1]] == [p]


def test_a_valid_entry_is_read_exactly(tmp_path, monkeypatch):
    c = CompileCache(tmp_path, disk=True)
    key, p = _entry_path(c)
    c._store(key, _fake(3), "x.cu")
    reads = _count_reads(monkeypatch)
    got = c._load(key)
    assert got is not None and got.cubin == _fake(3).cubin and got.ptx == _fake(3).ptx
    assert sum(reads) == p.stat().st_size


# -- permissions: a cache warmed by one user serves the others -------------------------------------

def _modes(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            q = Path(dirpath, name)
            out[str(q.relative_to(root))] = stat.S_IMODE(os.lstat(q).st_mode)
    return out


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_entries_and_directories_respect_the_umask_and_are_readable(tmp_path, umask):
    c = CompileCache(tmp_path / "top" / "cache", disk=True)
    key, p = _entry_path(c)
    old = os.umask(umask)
    try:
        c._store(key, _fake(), "x.cu")
    finally:
        os.umask(old)
    modes = _modes(tmp_path)
    entry = str(p.relative_to(tmp_path))
    assert modes.pop(entry) == 0o644 & ~umask, oct(modes.get(entry, 0))
    assert set(modes.values()) == {0o755 & ~umask}, {k: oct(v) for k, v in modes.items()}
    assert c._load(key) is not None


def test_a_group_cache_stays_group_writable(tmp_path):
    top = tmp_path / "shared"
    top.mkdir()
    top.chmod(0o2775)
    c = CompileCache(top, disk=True)
    key, p = _entry_path(c)
    old = os.umask(0o002)
    try:
        c._store(key, _fake(), "x.cu")
    finally:
        os.umask(old)
    for d in (c.root, p.parent):
        assert stat.S_IMODE(d.stat().st_mode) & 0o2070 == 0o2070, oct(d.stat().st_mode)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
