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

Whatever else a cache directory holds (directories, FIFOs, sockets, symlinks, unreadable or
huge files where entries should be) is a miss for readers and a reported item for
``attnrt cache ls|verify|clear``: only regular files are opened, never through a symlink,
and no more is read than an entry's header declares (see :mod:`._cachefs`).

Sharing a cache: entries are written 0644 and directories 0755, less the writer's umask,
so with the usual umask 022 a cache warmed by one user (``attnrt warm --arch sm_90``) is
read by every user who points ``ATTNRT_CACHE_DIR`` at it; a user who cannot write there
still gets hits and compiles misses in memory (with one warning). For a cache that a group
writes, make its top directory group-owned, setgid and group-writable (``chmod 2775``)
and give the writers umask 002: new subdirectories take the group-write bit of their
parent. With umask 077 nothing written is readable by others.

Environment: ``ATTNRT_CACHE_DIR`` (default: platformdirs' user cache dir for ``attnrt``),
``ATTNRT_CACHE=0`` disables the disk layer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from . import _cachefs, compiler
from .compiler import Compiled

__all__ = ["FORMAT_VERSION", "CacheStats", "CacheEntry", "CompileCache", "default_cache",
           "cache_key", "default_cache_dir"]

#: ``(path, why)``: an item of the cache directory that is not a valid entry.
Problem = tuple[Path, str]

FORMAT_VERSION = 2  # 2: the meta keeps NVRTC's log
MAGIC = b"NXRTCACHE\x01"
_SUFFIX = ".nxc"
_DIGEST = 32
_HEAD = len(MAGIC) + 4
_MAX_META = 16 << 20  # NVRTC logs are kilobytes
_ENTRY_NAME = re.compile(r"^([0-9a-f]{2})[0-9a-f]{62}" + re.escape(_SUFFIX) + "$")


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
    options: tuple[str, ...] | None = None  # None: written before entries recorded them


def _encode(key: str, compiled: Compiled, name: str, options: Sequence[str] = ()) -> bytes:
    meta = json.dumps({
        "format": FORMAT_VERSION, "key": key, "name": name, "arch": compiled.arch,
        "options": sorted(str(o) for o in options),
        "nvrtc": list(compiler.nvrtc_version()), "cubin_len": len(compiled.cubin),
        "ptx_len": len(compiled.ptx), "compile_seconds": compiled.seconds,
        "created": time.time(), "log": compiled.log,
    }, sort_keys=True).encode()
    body = MAGIC + struct.pack("<I", len(meta)) + meta + compiled.cubin + compiled.ptx
    return body + hashlib.sha256(body).digest()


def _entry_length(prefix: bytes) -> int | None:
    """The length the entry starting with ``prefix`` declares, as far as ``prefix`` tells
    (for :func:`._cachefs.read_regular`); ``None`` when it cannot be an entry."""
    if len(prefix) < _HEAD:
        return _HEAD
    if not prefix.startswith(MAGIC):
        return None
    (mlen,) = struct.unpack_from("<I", prefix, len(MAGIC))
    if mlen > _MAX_META:
        return None
    if len(prefix) < _HEAD + mlen:
        return _HEAD + mlen
    try:
        meta = json.loads(prefix[_HEAD:_HEAD + mlen])
        clen, plen = int(meta["cubin_len"]), int(meta["ptx_len"])
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
        return None
    if clen < 0 or plen < 0:
        return None
    return _HEAD + mlen + clen + plen + _DIGEST


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
    except (ValueError, KeyError, TypeError, OverflowError, AttributeError, RecursionError):
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
            self._store(key, compiled, name, options)
        compiler.warn_performance_loss(name, arch, compiled.log)  # stored first, as a disk hit
        return compiled

    # -- disk ---------------------------------------------------------------------------
    def _load(self, key: str) -> Compiled | None:
        data, why = _cachefs.read_regular(self.path_for(key), _entry_length)
        parsed = None if data is None else _decode(data, key)
        if parsed is None:
            if why != "missing":
                with self._lock:
                    self.stats.bad_entries += 1
            return None
        return parsed[1]

    def _store(self, key: str, compiled: Compiled, name: str, options: Sequence[str] = ()) -> None:
        path = self.path_for(key)
        try:
            _cachefs.write_atomic(path, _encode(key, compiled, name, options))
            with self._lock:
                self.stats.writes += 1
        except OSError as exc:
            with self._lock:
                self.stats.write_errors += 1
            warnings.warn(f"attnrt: could not write compile cache entry {path}: {exc}", stacklevel=3)

    def _scan(self) -> Iterator[tuple[Path, str, tuple[dict, Compiled] | None, int]]:
        """Every item of this format's directory: (path, why it is no valid entry or "",
        the decoded entry or None, its size in bytes)."""
        for p, why in _cachefs.walk(self.root):
            if why:
                yield p, why, None, 0
                continue
            m = _ENTRY_NAME.match(p.name)
            data, why = _cachefs.read_regular(p, _entry_length)
            if not why and (m is None or m.group(1) != p.parent.name):
                why = "not an entry name"
            parsed = _decode(data, p.name[: -len(_SUFFIX)]) if data is not None and not why else None
            if parsed is None and not why:
                why = "corrupt (checksum, format or key)"
            yield p, why, parsed, 0 if data is None else len(data)

    def entries(self) -> list[CacheEntry]:
        """Valid entries on disk (anything else is skipped; see :meth:`listing`)."""
        return self.listing()[0]

    def listing(self) -> tuple[list[CacheEntry], list[Problem]]:
        """Valid entries on disk, and every other item of the directory with why it is none
        (as :meth:`audit` reports them); reads each file once and never raises for what
        the directory holds."""
        out, problems = [], []
        for p, why, parsed, nbytes in self._scan():
            if parsed is None:
                problems.append((p, why))
                continue
            meta = parsed[0]
            opts = meta.get("options")
            out.append(CacheEntry(p, meta["key"], str(meta.get("name", "")), str(meta.get("arch", "")),
                                  ".".join(map(str, meta.get("nvrtc", []))), nbytes,
                                  float(meta.get("created", 0.0)),
                                  tuple(map(str, opts)) if isinstance(opts, list) else None))
        return out, problems

    def audit(self, remove: bool = False) -> tuple[int, list[Problem]]:
        """Check every item of the cache directory; returns (valid entries, problems).

        A problem is ``(path, why)``: a corrupt or foreign entry, or a directory, FIFO,
        socket, symlink or unreadable file where an entry should be. With ``remove`` each is
        deleted (a directory with its contents; a link, not its target); one that cannot be
        says so in its ``why``. Never raises for what the directory holds.
        """
        good, bad = 0, []
        for p, why, parsed, _n in self._scan():
            if parsed is not None:
                good += 1
                continue
            if remove:
                failed = _cachefs.remove(p)
                why = f"{why}; {failed}" if failed else why
            bad.append((p, why))
        return good, bad

    def verify(self, remove: bool = False) -> tuple[int, list[Path]]:
        """Check every entry's checksum and key; returns (valid count, bad paths).

        :meth:`audit` also says why each path is bad.
        """
        good, bad = self.audit(remove)
        return good, [p for p, _why in bad]

    def size_bytes(self) -> int:
        """Bytes in this format's regular files (links are not followed)."""
        total = 0
        for p, why in _cachefs.walk(self.root):
            try:
                st = os.lstat(p)
            except OSError:  # removed by another process meanwhile
                continue
            if not why and _cachefs.kind(st.st_mode) == "a regular file":
                total += st.st_size
        return total

    def purge(self) -> tuple[int, list[Problem]]:
        """Remove every item of the cache (disk and memory), entries of older cache formats
        (``v1/`` ...) too; returns (items removed, those that could not be)."""
        paths = [p for p, _why in _cachefs.walk(self.root)]
        for d in sorted(self.directory.glob("v[0-9]*")):
            if d != self.root and d.is_dir() and not d.is_symlink():
                paths += [p for p, why in _cachefs.walk(d) if not why and p.name.endswith(_SUFFIX)]
        n, failed = 0, []
        for p in paths:
            why = _cachefs.remove(p)
            if why:
                failed.append((p, why))
            else:
                n += 1
        with self._lock:
            self._memory.clear()
        return n, failed

    def clear(self) -> int:
        """Remove every entry (disk and memory), those of older cache formats (``v1/`` ...)
        too; returns the number of items removed (see :meth:`purge`)."""
        return self.purge()[0]


_default: CompileCache | None = None
_default_lock = threading.Lock()


def default_cache() -> CompileCache:
    """The process-wide cache, created from the environment at first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = CompileCache()
        return _default
