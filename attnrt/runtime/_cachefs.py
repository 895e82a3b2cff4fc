"""File-system primitives of the compile cache, safe against whatever a cache directory holds.

A cache directory can be shared, copied, or hand-edited, so a path where an entry should be
may be a directory, a FIFO, a socket, a device, a symlink (to ``/dev/zero``, say) or an
unreadable file. Readers here open regular files only (``lstat`` first, then ``O_NOFOLLOW |
O_NONBLOCK`` and ``fstat`` of the descriptor), read a bounded number of bytes, and answer
anything else with a reason instead of an exception or a hang. Writers create files and
directories with modes that respect the umask and let other users read (0644 / 0755 before
the umask), so a cache warmed by one user serves others.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["MAX_ENTRY_BYTES", "read_regular", "write_atomic", "make_dirs", "remove", "walk", "kind"]

#: Larger files are not entries (a CUBIN plus its PTX is a few MB); nothing past it is read.
MAX_ENTRY_BYTES = 256 << 20

_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
_FILE_MODE = 0o644  # the kernel applies the umask to both modes
_DIR_MODE = 0o755
TMP_PREFIX = ".tmp-"


def kind(mode: int) -> str:
    """What a non-regular ``st_mode`` is, in words (for reports)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _why(exc: OSError) -> str:
    return f"unreadable ({exc.strerror or exc})"


def read_regular(path: Path, need: Callable[[bytes], int | None]) -> tuple[bytes | None, str]:
    """The bytes of the regular file ``path``, or ``(None, why)``.

    ``need(prefix)`` says how long the whole file must be, judging by the bytes read so far
    (a header declaring lengths: called again once those bytes are in, until it answers
    the length already read), or ``None`` when the prefix is not a valid start. Reading
    stops at that length, and a byte beyond it makes the file invalid. Never more than
    :data:`MAX_ENTRY_BYTES` + 1 bytes are read, whatever the file is.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, _why(exc)
    if not stat.S_ISREG(st.st_mode):
        return None, kind(st.st_mode)
    try:
        fd = os.open(path, _OPEN_FLAGS)  # replaced by a symlink meanwhile: ELOOP
    except OSError as exc:
        return None, _why(exc)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, kind(st.st_mode)
        if st.st_size > MAX_ENTRY_BYTES:
            return None, f"too large ({st.st_size} bytes)"
        buf = b""
        while (want := need(buf)) != len(buf):
            if want is None or want < len(buf):
                return None, "corrupt (header)"
            if want > min(st.st_size, MAX_ENTRY_BYTES):
                return None, "corrupt (the header declares more than the file holds)"
            buf += _read_upto(fd, want - len(buf))
            if len(buf) != want:
                return None, "corrupt (truncated)"
        if _read_upto(fd, 1):
            return None, "corrupt (bytes after the declared end)"
        return buf, ""
    except OSError as exc:
        return None, _why(exc)
    finally:
        os.close(fd)


def _read_upto(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def make_dirs(path: Path) -> None:
    """``mkdir -p`` with 0755 before the umask; a new directory also takes the group-write
    bit of its parent, so that a group cache (``chmod 2775`` on its top, umask 002) stays
    writable by the group below the top too."""
    if path.is_dir():
        return
    if path.parent != path:
        make_dirs(path.parent)
    mode = _DIR_MODE | (os.stat(path.parent).st_mode & stat.S_IWGRP)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not path.is_dir():
            raise


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file beside ``path`` (0644 before the umask), then rename it
    over ``path`` (atomic on POSIX: readers see the old file or the new one).

    Raises
    ------
    OSError
        The directory cannot be created or written, or ``path`` is a directory.
    """
    make_dirs(path.parent)
    tmp = path.parent / f"{TMP_PREFIX}{secrets.token_hex(8)}{path.suffix}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
                 | getattr(os, "O_NOFOLLOW", 0), _FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remove(path: Path) -> str:
    """Remove a file, symlink, FIFO, socket or whole directory tree (never following a link);
    ``""`` on success, else why not."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"could not remove ({exc.strerror or exc})"
    return ""


def walk(root: Path) -> Iterator[tuple[Path, str]]:
    """Every item two levels below ``root`` (``root/xx/item``), as ``(path, "")``, and every
    problem on the way as ``(path, why)``: a non-directory or unreadable directory at the
    first level. In-flight temporary files of writers are skipped. Nothing is followed."""
    try:
        top = sorted(os.scandir(root), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        try:
            mode = os.stat(root).st_mode
        except OSError:  # absent, or below a non-directory: no cache yet
            return
        yield root, kind(mode)
        return
    except OSError as exc:
        yield root, _why(exc)
        return
    for d in top:
        if not d.is_dir(follow_symlinks=False):
            if not d.name.startswith(TMP_PREFIX):
                try:
                    yield Path(d.path), kind(d.stat(follow_symlinks=False).st_mode)
                except FileNotFoundError:  # removed by another process meanwhile
                    pass
            continue
        try:
            items = sorted(os.scandir(d.path), key=lambda e: e.name)
        except OSError as exc:
            yield Path(d.path), _why(exc)
            continue
        for e in items:
            if not e.name.startswith(TMP_PREFIX):
                yield Path(e.path), ""
