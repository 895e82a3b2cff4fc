"""The compile cache: an in-process dict in front of a disk directory.

Cache key (sha256 over labelled, length-prefixed fields, so no two field lists collide):

1. ``format``  — :data:`FORMAT_VERSION` of the entry layout;
2. ``nvrtc``   — NVRTC's (major, minor);
3. ``arch``    — the exact target (``sm_90``, ``sm_90a``);
4. ``options`` — the caller's options, sorted (order does not change the key, and the
   compile uses the sorted order too, so the key describes the artifact);
5. ``source``  — the translation unit's text;
6. ``header``  — for every header the source may include (in-memory ``.cuh`` files and the
   CUDA headers found on disk), its name and content.

An entry file is ``MAGIC | u32 meta length | meta JSON | CUBIN | PTX | sha256(all before)``;
the meta keeps NVRTC's log (format 2), so that a later process loading the entry still
warns (:class:`~attnrt.runtime.errors.PerformanceWarning`) when ptxas reported a performance loss.
Writes go to a temp file in the same directory and are published with ``os.replace``
(atomic on POSIX), so readers see a whole entry or none, with any number of writers.
An entry that is truncated, corrupt, of another format or for another key is a miss:
it is recompiled and rewritten, never an exception. Disk errors (read-only directory,
full disk) degrade to compiling without the disk layer.

Environment: ``ATTNRT_CACHE_DIR`` (default: platformdirs' user cache dir for ``attnrt``),
``ATTNRT_CACHE=0`` disables the disk layer.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from . import compiler
from .compiler import Compiled

__all__ = ["FORMAT_VERSION", "CacheStats", "CacheEntry", "CompileCache", "default_cache",
           "cache_key", "default_cache_dir"]

FORMAT_VERSION = 2  # 2: the meta keeps NVRTC's log
MAGIC = b"NXRTCACHE\x01"
_SUFFIX = ".nxc"
_DIGEST = 32


def default_cache_dir() -> Path:
    """``ATTNRT_CACHE_DIR`` or platformdirs' user cache directory for ``attnrt``."""
    env = os.environ.get("ATTNRT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("attnrt", appauthor=False))


def _disk_enabled_by_env() -> bool:
    return os.environ.get("ATTNRT_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_key(source: str, arch: str, options: Sequence[str],
              headers: Sequence[tuple[str, bytes]], nvrtc_version: tuple[int, int]) -> str:
    """The hex key of one compile (see the module docstring for the fields)."""
    h = hashlib.sha256()

    def field(label: str, value: bytes) -> None:
        h.update(label.encode() + b"\0" + struct.pack("<Q", len(value)) + value)

    field("format", str(FORMAT_VERSION).encode())
    field("nvrtc", f"{nvrtc_version[0]}.{nvrtc_version[1]}".encode())
    field("arch", arch.encode())
    for opt in sorted(str(o) for o in options):
        field("option", opt.encode())
    field("source", source.encode())
    for name, content in headers:
        field("header", name.encode() + b"\0" + content)
    return h.hexdigest()


@dataclass
class CacheStats:
    """Counters of one cache object (this process)."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    compiles: int = 0
    compile_seconds: float = 0.0
    bad_entries: int = 0
    writes: int = 0
    write_errors: int = 0

    @property
    def hits(self) -> int:
        return self.memory_hits + self.disk_hits

    def as_dict(self) -> dict:
        d = asdict(self)
        d["hits"] = self.hits
        return d


@dataclass(frozen=True)
class CacheEntry:
    """One entry on disk, as ``attnrt cache ls`` shows it."""

    path: Path
    key: str
    name: str
    arch: str
    nvrtc: str
    nbytes: int
    created: float


def _encode(key: str, compiled: Compiled, name: str) -> bytes:
    meta = json.dumps({
        "format": FORMAT_VERSION, "key": key, "name": name, "arch": compiled.arch,
        "nvrtc": list(compiler.nvrtc_version()), "cubin_len": len(compiled.cubin),
        "ptx_len": len(compiled.ptx), "compile_seconds": compiled.seconds,
        "created": time.time(), "log": compiled.log,
    }, sort_keys=True).encode()
    body = MAGIC + struct.pack("<I", len(meta)) + meta + compiled.cubin + compiled.ptx
    return body + hashlib.sha256(body).digest()


def _decode(data: bytes, key: str | None) -> tuple[dict, Compiled] | None:
    """Parse an entry; ``None`` for anything but a whole, valid entry (for ``key``)."""
    head = len(MAGIC) + 4
    if len(data) < head + _DIGEST or not data.startswith(MAGIC):
        return None
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        return None
    (mlen,) = struct.unpack_from("<I", body, len(MAGIC))
    try:
        meta = json.loads(body[head:head + mlen])
        clen, plen = int(meta["cubin_len"]), int(meta["ptx_len"])
        if meta.get("format") != FORMAT_VERSION or (key is not None and meta.get("key") != key):
            return None
        if clen < 0 or plen < 0 or head + mlen + clen + plen != len(body):
            return None
        start = head + mlen
        compiled = Compiled(cubin=body[start:start + clen], ptx=body[start + clen:start + clen + plen],
                            arch=str(meta.get("arch", "")), log=str(meta.get("log", "")),
                            seconds=float(meta.get("compile_seconds", 0.0)))
    except (ValueError, KeyError, TypeError, OverflowError, AttributeError):
        return None
    return meta, compiled


class CompileCache:
    """NVRTC results by key: in-process dict, then disk, then compile.

    Parameters
    ----------
    directory
        Where entries live (default :func:`default_cache_dir`).
    disk
        Use the disk layer (default: unless ``ATTNRT_CACHE=0``).
    """

    def __init__(self, directory: str | os.PathLike | None = None, disk: bool | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.disk = _disk_enabled_by_env() if disk is None else bool(disk)
        self.stats = CacheStats()
        self._memory: dict[str, Compiled] = {}
        self._lock = threading.Lock()

    # -- keys and paths ---------------------------------------------------------------
    @property
    def root(self) -> Path:
        return self.directory / f"v{FORMAT_VERSION}"

    def path_for(self, key: str) -> Path:
        return self.root / key[:2] / (key + _SUFFIX)

    def key(self, source: str, arch: str, options: Sequence[str] = (),
            headers: Mapping[str, str] | None = None) -> str:
        resolved = compiler.resolve_includes(source, headers or {})
        return cache_key(source, arch, options, resolved, compiler.nvrtc_version())

    # -- the one entry point ------------------------------------------------------------
    def get(self, source: str, name: str, arch: str, options: Sequence[str] = (),
            headers: Mapping[str, str] | None = None) -> Compiled:
        """The compiled module for these inputs, from memory, disk, or NVRTC."""
        key = self.key(source, arch, options, headers)
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None:
                self.stats.memory_hits += 1
                return hit
        if self.disk:
            loaded = self._load(key)
            if loaded is not None:
                with self._lock:
                    self.stats.disk_hits += 1
                    self._memory[key] = loaded
                # An entry compiled by another process: its ptxas advisories still apply.
                # (Once per entry and process, as for a compile: memory hits stay quiet.)
                compiler.warn_performance_loss(name, arch, loaded.log)
                return loaded
        with self._lock:
            self.stats.misses += 1
        compiled = compiler.compile_source(source, name, arch, options, headers, warn=False)
        with self._lock:
            self.stats.compiles += 1
            self.stats.compile_seconds += compiled.seconds
            self._memory[key] = compiled
        if self.disk:
            self._store(key, compiled, name)
        compiler.warn_performance_loss(name, arch, compiled.log)  # stored first, as a disk hit
        return compiled

    # -- disk ---------------------------------------------------------------------------
    def _load(self, key: str) -> Compiled | None:
        path = self.path_for(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            return None
        parsed = _decode(data, key)
        if parsed is None:
            with self._lock:
                self.stats.bad_entries += 1
            return None
        return parsed[1]

    def _store(self, key: str, compiled: Compiled, name: str) -> None:
        path = self.path_for(key)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=_SUFFIX)
            with os.fdopen(fd, "wb") as f:
                f.write(_encode(key, compiled, name))
            os.replace(tmp, path)
            tmp = None
            with self._lock:
                self.stats.writes += 1
        except OSError as exc:
            with self._lock:
                self.stats.write_errors += 1
            warnings.warn(f"attnrt: could not write compile cache entry {path}: {exc}", stacklevel=3)
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def _files(self) -> Iterator[Path]:
        """Published entries (in-flight ``.tmp-`` files of concurrent writers are not entries)."""
        if self.root.is_dir():
            yield from sorted(p for p in self.root.glob(f"*/*{_SUFFIX}") if not p.name.startswith(".tmp-"))

    def entries(self) -> list[CacheEntry]:
        """Valid entries on disk (invalid ones are skipped; see :meth:`verify`)."""
        out = []
        for p in self._files():
            try:
                data = p.read_bytes()
            except OSError:
                continue
            parsed = _decode(data, p.name[: -len(_SUFFIX)])
            if parsed is None:
                continue
            meta = parsed[0]
            out.append(CacheEntry(p, meta["key"], meta.get("name", ""), meta.get("arch", ""),
                                  ".".join(map(str, meta.get("nvrtc", []))), len(data),
                                  float(meta.get("created", 0.0))))
        return out

    def verify(self, remove: bool = False) -> tuple[int, list[Path]]:
        """Check every entry's checksum and key; returns (valid count, bad paths)."""
        good, bad = 0, []
        for p in self._files():
            try:
                ok = _decode(p.read_bytes(), p.name[: -len(_SUFFIX)]) is not None
            except OSError:
                ok = False
            if ok:
                good += 1
                continue
            bad.append(p)
            if remove:
                p.unlink(missing_ok=True)
        return good, bad

    def size_bytes(self) -> int:
        total = 0
        for p in self._files():
            try:
                total += p.stat().st_size
            except OSError:  # removed by another process meanwhile
                pass
        return total

    def clear(self) -> int:
        """Remove every entry (disk and memory), those of older cache formats (``v1/`` ...)
        too; returns the number of files removed."""
        n = 0
        old = (p for d in sorted(self.directory.glob("v[0-9]*")) if d != self.root and d.is_dir()
               for p in d.glob(f"*/*{_SUFFIX}"))
        for p in [*self._files(), *old]:
            p.unlink(missing_ok=True)
            n += 1
        with self._lock:
            self._memory.clear()
        return n


_default: CompileCache | None = None
_default_lock = threading.Lock()


def default_cache() -> CompileCache:
    """The process-wide cache, created from the environment at first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = CompileCache()
        return _default
