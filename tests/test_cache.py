"""The compile cache, for real on disk (NVRTC needs no GPU): hits, bad entries, the
environment switches, degraded disks, listing/verify/clear, and 8 racing processes."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from attnrt.runtime import cache as cache_mod
from attnrt.runtime import compiler
from attnrt.runtime.cache import CompileCache
from attnrt.runtime.errors import PerformanceWarning

ARCH = "sm_80"
TINY = 'extern "C" __global__ void k(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] = 1.0f; }\n'
TINY2 = 'extern "C" __global__ void k(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] = 2.0f; }\n'
REPO = Path(__file__).resolve().parents[1]


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in Path(directory).rglob("*") if p.is_file())


def _valid(cache: CompileCache, key: str) -> bool:
    return cache_mod._decode(cache.path_for(key).read_bytes(), key) is not None


@pytest.fixture(scope="module")
def entries_bytes(tmp_path_factory):
    """Valid entry files for TINY and TINY2 (compiled once per module): {source: (key, bytes)}."""
    d = tmp_path_factory.mktemp("template-cache")
    c = CompileCache(d, disk=True)
    out = {}
    for src in (TINY, TINY2):
        c.get(src, "tiny.cu", ARCH)
        key = c.key(src, ARCH)
        out[src] = (key, c.path_for(key).read_bytes())
    return out


def _seeded(tmp_path: Path, entries_bytes, src: str = TINY) -> tuple[CompileCache, str, Path]:
    """A fresh cache directory holding a valid entry for ``src``."""
    key, data = entries_bytes[src]
    c = CompileCache(tmp_path / "cache", disk=True)
    p = c.path_for(key)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return c, key, p


def _craft(meta: dict, cubin: bytes = b"\x7fELFcubin", ptx: bytes = b"// ptx") -> bytes:
    """An entry with a *valid* checksum and the given meta (the layout of the module docstring)."""
    m = json.dumps(meta).encode()
    body = cache_mod.MAGIC + struct.pack("<I", len(m)) + m + cubin + ptx
    return body + hashlib.sha256(body).digest()


def _meta(key: str, **over) -> dict:
    meta = {"format": cache_mod.FORMAT_VERSION, "key": key, "name": "x.cu", "arch": ARCH,
            "nvrtc": list(compiler.nvrtc_version()), "cubin_len": 9, "ptx_len": 6,
            "compile_seconds": 0.1, "created": 0.0}
    meta.update(over)
    return meta


# -- hits -------------------------------------------------------------------------------------

def test_compile_then_disk_hit_in_fresh_object(tmp_path):
    c1 = CompileCache(tmp_path, disk=True)
    a = c1.get(TINY, "tiny.cu", ARCH)
    s = c1.stats
    assert (s.misses, s.compiles, s.disk_hits, s.memory_hits, s.writes) == (1, 1, 0, 0, 1)
    assert s.compile_seconds > 0 and s.bad_entries == 0 and s.write_errors == 0
    key = c1.key(TINY, ARCH)
    assert _files(tmp_path) == [c1.path_for(key)]
    assert c1.path_for(key).parent.name == key[:2]

    c2 = CompileCache(tmp_path, disk=True)
    b = c2.get(TINY, "tiny.cu", ARCH)
    s2 = c2.stats
    assert (s2.compiles, s2.misses, s2.disk_hits, s2.memory_hits) == (0, 0, 1, 0)
    assert b.cubin == a.cubin and b.ptx == a.ptx and b.arch == ARCH
    assert b.cubin.startswith(b"\x7fELF")
    c2.get(TINY, "tiny.cu", ARCH)
    assert (c2.stats.memory_hits, c2.stats.disk_hits, c2.stats.compiles) == (1, 1, 0)
    d = c2.stats.as_dict()
    assert d["hits"] == 2 == c2.stats.hits


ADVISORY = ("ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are "
            "serialized due to insufficient register resources for the wgmma pipeline in the "
            "function 'k' in line 12")


def test_ptxas_performance_advisory_warns_at_compile_and_on_disk_hits(tmp_path, monkeypatch):
    """A log with ptxas's "Potential Performance Loss" (C7511: serialised wgmmas) warns when
    compiled and again when another cache object (another process) loads the entry; a
    memory hit and a clean log say nothing."""
    real = compiler._program_log
    monkeypatch.setattr(compiler, "_program_log", lambda prog: real(prog) + "\n" + ADVISORY + "\n")
    c1 = CompileCache(tmp_path, disk=True)
    with pytest.warns(PerformanceWarning, match="C7511") as rec:
        a = c1.get(TINY, "tiny.cu", ARCH)
    assert len(rec) == 1
    w = rec[0].message
    assert (w.name, w.arch, w.lines) == ("tiny.cu", ARCH, (ADVISORY,))
    assert ADVISORY in a.log
    # Under an error filter the compile raises, but only after storing the entry: like a disk
    # hit, it warns once per process, and later hits are quiet.
    c0 = CompileCache(tmp_path / "strict", disk=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        with pytest.raises(PerformanceWarning):
            c0.get(TINY, "tiny.cu", ARCH)
        assert (c0.stats.compiles, c0.stats.writes) == (1, 1)
        assert ADVISORY in c0.get(TINY, "tiny.cu", ARCH).log
        assert c0.stats.memory_hits == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c1.get(TINY, "tiny.cu", ARCH)  # memory hit
    monkeypatch.undo()
    c2 = CompileCache(tmp_path, disk=True)
    with pytest.warns(PerformanceWarning, match="C7511"):
        b = c2.get(TINY, "tiny.cu", ARCH)
    assert c2.stats.disk_hits == 1 and ADVISORY in b.log and b.cubin == a.cubin
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for c in (CompileCache(tmp_path / "clean", disk=True), CompileCache(tmp_path / "clean", disk=True)):
            assert compiler.performance_loss(c.get(TINY2, "tiny.cu", ARCH).log) == []


def test_entries_of_format_1_are_misses(tmp_path, entries_bytes):
    """Format 1 kept no NVRTC log, so its entries could not warn: they are recompiled."""
    key, _data = entries_bytes[TINY]
    c = CompileCache(tmp_path / "cache", disk=True)
    p = c.path_for(key)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(_craft(_meta(key, format=1)))
    assert cache_mod.FORMAT_VERSION == 2 and f"v{cache_mod.FORMAT_VERSION}" in str(p)
    assert c.get(TINY, "tiny.cu", ARCH).cubin.startswith(b"\x7fELF")
    assert (c.stats.compiles, c.stats.disk_hits) == (1, 0)


def test_memory_hit_does_no_disk_io(tmp_path):
    c = CompileCache(tmp_path, disk=True)
    a = c.get(TINY, "tiny.cu", ARCH)
    path = c.path_for(c.key(TINY, ARCH))
    path.unlink()
    b = c.get(TINY, "tiny.cu", ARCH)
    assert b is a
    assert (c.stats.memory_hits, c.stats.compiles, c.stats.disk_hits) == (1, 1, 0)
    assert not path.exists()  # nothing was read or rewritten


def test_option_order_shares_one_entry(tmp_path):
    c = CompileCache(tmp_path, disk=True)
    c.get(TINY, "tiny.cu", ARCH, ["-DA=1", "-DB=2"])
    c.get(TINY, "tiny.cu", ARCH, ["-DB=2", "-DA=1"])
    assert c.stats.compiles == 1 and c.stats.memory_hits == 1
    assert len(_files(tmp_path)) == 1


def test_distinct_inputs_get_distinct_entries(tmp_path):
    c = CompileCache(tmp_path, disk=True)
    c.get(TINY, "tiny.cu", "sm_80")
    c.get(TINY, "tiny.cu", "sm_90")
    c.get(TINY, "tiny.cu", "sm_90", ["-DX=1"])
    c.get('#include "h.cuh"\n' + TINY, "tiny.cu", "sm_90", (), {"h.cuh": "#define A 1\n"})
    c.get('#include "h.cuh"\n' + TINY, "tiny.cu", "sm_90", (), {"h.cuh": "#define A 2\n"})
    assert c.stats.compiles == 5
    assert len(_files(tmp_path)) == 5


# -- bad entries are misses ---------------------------------------------------------------------

def _flip_middle(d: bytes) -> bytes:
    i = len(d) // 2
    return d[:i] + bytes([d[i] ^ 0x5A]) + d[i + 1:]


BAD = {
    "flipped-byte": _flip_middle,
    "flipped-last-byte": lambda d: d[:-1] + bytes([d[-1] ^ 1]),
    "truncated-half": lambda d: d[: len(d) // 2],
    "truncated-one-byte": lambda d: d[:-1],
    "truncated-to-magic": lambda d: d[: len(cache_mod.MAGIC) + 2],
    "empty": lambda d: b"",
    "garbage": lambda d: os.urandom(len(d)),
    "extra-trailing-bytes": lambda d: d + b"\0\0\0",
    "wrong-magic": lambda d: b"XXRTCACHE\x01" + d[len(cache_mod.MAGIC):],
}


@pytest.mark.parametrize("how", sorted(BAD))
def test_bad_entry_is_recompiled_and_rewritten(tmp_path, entries_bytes, how):
    c, key, path = _seeded(tmp_path, entries_bytes)
    path.write_bytes(BAD[how](path.read_bytes()))
    compiled = c.get(TINY, "tiny.cu", ARCH)  # never an exception
    assert compiled.cubin.startswith(b"\x7fELF")
    s = c.stats
    assert (s.bad_entries, s.misses, s.compiles, s.writes, s.disk_hits) == (1, 1, 1, 1, 0)
    assert _valid(c, key)
    fresh = CompileCache(c.directory, disk=True)
    fresh.get(TINY, "tiny.cu", ARCH)
    assert (fresh.stats.disk_hits, fresh.stats.compiles) == (1, 0)


def _foreign_cases(entries_bytes) -> dict[str, bytes]:
    key, _ = entries_bytes[TINY]
    _other_key, other = entries_bytes[TINY2]
    return {
        # A whole, valid entry, but for another key (e.g. a renamed/copied file).
        "other-key": other,
        # Another cache format with a valid checksum.
        "other-format": _craft(_meta(key, format=cache_mod.FORMAT_VERSION + 1)),
        # Right magic and checksum, meta is not JSON.
        "meta-not-json": (lambda b: b + hashlib.sha256(b).digest())(
            cache_mod.MAGIC + struct.pack("<I", 5) + b"{nope" + b"cubin"),
        # Meta JSON that is not an object.
        "meta-is-a-list": (lambda b: b + hashlib.sha256(b).digest())(
            cache_mod.MAGIC + struct.pack("<I", 6) + b"[1, 2]"),
        # Lengths that do not add up to the body.
        "lengths-off-by-one": _craft(_meta(key, cubin_len=10)),
        "meta-length-too-long": (lambda b: b + hashlib.sha256(b).digest())(
            cache_mod.MAGIC + struct.pack("<I", 10**6) + b'{"a": 1}'),
        "missing-lengths": _craft({"format": cache_mod.FORMAT_VERSION, "key": key}),
        "null-lengths": _craft(_meta(key, cubin_len=None)),
    }


@pytest.mark.parametrize("case", ["other-key", "other-format", "meta-not-json", "meta-is-a-list",
                                  "lengths-off-by-one", "meta-length-too-long", "missing-lengths",
                                  "null-lengths"])
def test_foreign_entry_is_recompiled_and_rewritten(tmp_path, entries_bytes, case):
    c, key, path = _seeded(tmp_path, entries_bytes)
    path.write_bytes(_foreign_cases(entries_bytes)[case])
    c.get(TINY, "tiny.cu", ARCH)
    assert (c.stats.bad_entries, c.stats.compiles, c.stats.disk_hits) == (1, 1, 0)
    assert _valid(c, key)


@pytest.mark.parametrize("over", [
    {"compile_seconds": "fast"},          # float("fast") -> ValueError outside the try
    {"cubin_len": float("inf")},          # json writes Infinity; int(inf) -> OverflowError
    {"compile_seconds": [1]},             # float([1]) -> TypeError outside the try
], ids=["seconds-str", "cubin-len-inf", "seconds-list"])
def test_entry_with_malformed_meta_fields_is_a_miss(tmp_path, entries_bytes, over):
    # A well-formed file (right magic, right checksum, right key and format) whose meta
    # fields have the wrong types, e.g. written by a buggy or foreign writer. The contract
    # says a foreign entry is a miss, never an exception.
    c, key, path = _seeded(tmp_path, entries_bytes)
    path.write_bytes(_craft(_meta(key, **over)))
    c.get(TINY, "tiny.cu", ARCH)
    assert c.stats.bad_entries == 1 and c.stats.compiles == 1
    assert _valid(c, key)


def test_entry_path_is_a_directory(tmp_path, entries_bytes):
    c, key, path = _seeded(tmp_path, entries_bytes)
    path.unlink()
    (path / "junk").mkdir(parents=True)
    with pytest.warns(UserWarning, match="could not write"):
        compiled = c.get(TINY, "tiny.cu", ARCH)
    assert compiled.cubin.startswith(b"\x7fELF")
    assert c.stats.write_errors == 1
    assert not [p for p in _files(c.directory) if p.name.startswith(".tmp-")]


# -- the environment and degraded disks ---------------------------------------------------------

@pytest.mark.parametrize("value", ["0", "false", "off", "no", "OFF", " 0 "])
def test_nxrt_cache_0_disables_disk(tmp_path, monkeypatch, value):
    monkeypatch.setenv("ATTNRT_CACHE", value)
    c = CompileCache(tmp_path / "cache")
    assert c.disk is False
    c.get(TINY, "tiny.cu", ARCH)
    c.get(TINY, "tiny.cu", ARCH)
    assert (c.stats.compiles, c.stats.memory_hits, c.stats.writes) == (1, 1, 0)
    assert not (tmp_path / "cache").exists()
    # A second object in the same process compiles again: nothing went to disk.
    c2 = CompileCache(tmp_path / "cache")
    c2.get(TINY, "tiny.cu", ARCH)
    assert c2.stats.compiles == 1 and not _files(tmp_path)


@pytest.mark.parametrize("value", [None, "1", "yes", "on"])
def test_disk_enabled_by_default(monkeypatch, tmp_path, value):
    if value is None:
        monkeypatch.delenv("ATTNRT_CACHE", raising=False)
    else:
        monkeypatch.setenv("ATTNRT_CACHE", value)
    assert CompileCache(tmp_path).disk is True
    assert CompileCache(tmp_path, disk=False).disk is False


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNRT_CACHE_DIR", str(tmp_path / "here"))
    assert cache_mod.default_cache_dir() == tmp_path / "here"
    assert CompileCache().directory == tmp_path / "here"
    monkeypatch.setenv("ATTNRT_CACHE_DIR", "~/nxrt-cache-test")
    assert cache_mod.default_cache_dir() == Path("~/nxrt-cache-test").expanduser()
    monkeypatch.delenv("ATTNRT_CACHE_DIR")
    platformdirs = pytest.importorskip("platformdirs")
    d = cache_mod.default_cache_dir()
    assert d == Path(platformdirs.user_cache_dir("attnrt", appauthor=False))
    assert "attnrt" in d.parts


def test_unwritable_dir_degrades_with_a_warning(tmp_path):
    # A cache directory below a regular file can be neither created nor read, even as root.
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    c = CompileCache(blocker / "cache", disk=True)
    with pytest.warns(UserWarning, match="could not write compile cache entry"):
        compiled = c.get(TINY, "tiny.cu", ARCH)
    assert compiled.cubin.startswith(b"\x7fELF")
    assert (c.stats.compiles, c.stats.write_errors, c.stats.writes) == (1, 1, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert c.get(TINY, "tiny.cu", ARCH) is compiled  # memory hit, no second warning
    assert c.entries() == [] and c.verify() == (0, []) and c.size_bytes() == 0 and c.clear() == 0


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root ignores directory permissions")
def test_read_only_dir_degrades_with_a_warning(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        c = CompileCache(ro, disk=True)
        with pytest.warns(UserWarning, match="could not write"):
            c.get(TINY, "tiny.cu", ARCH)
        assert c.stats.write_errors == 1
    finally:
        ro.chmod(0o700)


# -- listing, verify, clear ---------------------------------------------------------------------

def test_entries_verify_clear(tmp_path):
    c = CompileCache(tmp_path, disk=True)
    t0 = time.time()
    c.get(TINY, "tiny.cu", ARCH)
    c.get(TINY2, "tiny2.cu", "sm_90")
    k1, k2 = c.key(TINY, ARCH), c.key(TINY2, "sm_90")
    ents = {e.key: e for e in c.entries()}
    assert set(ents) == {k1, k2}
    e1 = ents[k1]
    assert (e1.name, e1.arch, e1.path) == ("tiny.cu", ARCH, c.path_for(k1))
    assert e1.nvrtc == ".".join(map(str, compiler.nvrtc_version()))
    assert e1.nbytes == c.path_for(k1).stat().st_size
    assert t0 - 5 <= e1.created <= time.time() + 5
    assert ents[k2].name == "tiny2.cu" and ents[k2].arch == "sm_90"
    assert c.size_bytes() == sum(p.stat().st_size for p in _files(tmp_path))
    assert c.verify() == (2, [])

    bad = c.path_for(k2)
    bad.write_bytes(_flip_middle(bad.read_bytes()))
    assert [e.key for e in c.entries()] == [k1]  # invalid entries are not listed
    assert c.verify() == (1, [bad])
    assert bad.exists()  # verify() alone removes nothing
    assert c.verify(remove=True) == (1, [bad])
    assert not bad.exists()
    assert c.verify() == (1, [])

    old = tmp_path / "v1" / "ab" / ("ab" + "0" * 62 + ".nxc")  # an older format's entry
    old.parent.mkdir(parents=True)
    old.write_bytes(b"NXRTCACHE\x01 format 1")
    keep = tmp_path / "notes" / "x.nxc"  # not the cache's: left alone
    keep.parent.mkdir()
    keep.write_bytes(b"")
    assert c.entries() == c.entries()[:1] and len(c.entries()) == 1  # other formats unlisted
    assert c.clear() == 2
    assert _files(tmp_path) == [keep] and c.entries() == []
    keep.unlink()
    before = c.stats.compiles
    c.get(TINY, "tiny.cu", ARCH)  # memory was cleared too
    assert c.stats.compiles == before + 1


def test_listing_an_absent_directory(tmp_path):
    c = CompileCache(tmp_path / "never-created", disk=True)
    assert c.entries() == [] and c.verify() == (0, []) and c.size_bytes() == 0 and c.clear() == 0


# -- many processes, one key --------------------------------------------------------------------

_RACER = r"""
import hashlib, json, os, sys, time
from pathlib import Path
from attnrt.runtime.cache import CompileCache
directory, src_path, ready_dir, go_file, idx = sys.argv[1:6]
src = Path(src_path).read_text()
c = CompileCache(directory, disk=True)
key = c.key(src, "sm_80")  # warm imports, NVRTC and the header scan before the start line
Path(ready_dir, idx).touch()
deadline = time.monotonic() + 120
while not os.path.exists(go_file):
    if time.monotonic() > deadline:
        sys.exit("no start signal")
    time.sleep(0.001)
compiled = c.get(src, "race.cu", "sm_80")
print(json.dumps({"key": key, "stats": c.stats.as_dict(),
                  "cubin": hashlib.sha256(compiled.cubin).hexdigest()}))
"""


def test_eight_processes_compile_one_key(tmp_path):
    n = 8
    cache_dir, ready = tmp_path / "cache", tmp_path / "ready"
    ready.mkdir()
    src_path = tmp_path / "race.cu"
    src_path.write_text(TINY)
    go = tmp_path / "go"
    env = dict(os.environ, ATTNRT_CACHE="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, str(cache_dir), str(src_path), str(ready),
                               str(go), str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=str(tmp_path)) for i in range(n)]
    try:
        deadline = time.monotonic() + 120
        while len(list(ready.iterdir())) < n:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
        go.touch()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = []
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "Traceback" not in err and "could not write" not in err, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    keys = {r["key"] for r in results}
    assert len(keys) == 1
    key = keys.pop()
    for r in results:
        s = r["stats"]
        assert s["compiles"] + s["disk_hits"] == 1
        assert s["bad_entries"] == 0 and s["write_errors"] == 0
    c = CompileCache(cache_dir, disk=True)
    files = _files(cache_dir)
    assert files == [c.path_for(key)], files  # exactly one entry, no temp files left
    assert c.verify() == (1, [])
    entry = cache_mod._decode(files[0].read_bytes(), key)
    assert entry is not None
    assert hashlib.sha256(entry[1].cubin).hexdigest() in {r["cubin"] for r in results}
    c.get(TINY, "race.cu", "sm_80")
    assert (c.stats.disk_hits, c.stats.compiles) == (1, 0)
