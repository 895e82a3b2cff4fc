"""NVRTC: header discovery, options, CUBIN and PTX.

Compiling needs no GPU. Headers come from three places, in this order: the in-memory
headers the caller passes (our ``.cuh`` files), then the CUDA include directories that
``cuda.pathfinder`` finds (``cudart`` for ``cuda_fp16.h``/``cuda_bf16.h``, ``cccl`` when
installed), then NVRTC's built-ins.
"""

from __future__ import annotations

import functools
import os
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ._check import check_nvrtc, nvrtc
from .errors import CompileError, PerformanceWarning

__all__ = [
    "Compiled",
    "nvrtc_version",
    "supported_archs",
    "target_arch",
    "include_dirs",
    "resolve_includes",
    "compile_source",
    "performance_loss",
    "warn_performance_loss",
    "HEADER_PACKAGES",
]

#: Which wheel provides a header NVRTC could not find (matched by prefix).
HEADER_PACKAGES: dict[str, str] = {
    "cuda_fp16": "nvidia-cuda-runtime (pip install 'cuda-toolkit[cudart]')",
    "cuda_bf16": "nvidia-cuda-runtime (pip install 'cuda-toolkit[cudart]')",
    "cuda_fp8": "nvidia-cuda-runtime (pip install 'cuda-toolkit[cudart]')",
    "cuda_runtime": "nvidia-cuda-runtime (pip install 'cuda-toolkit[cudart]')",
    "vector_": "nvidia-cuda-runtime (pip install 'cuda-toolkit[cudart]')",
    "cuda_pipeline": "nvidia-cuda-runtime (pip install 'cuda-toolkit[cudart]')",
    "cooperative_groups": "nvidia-cuda-runtime (pip install 'cuda-toolkit[cudart]')",
    "nv/": "nvidia-cuda-cccl (pip install 'cuda-toolkit[cccl]')",
    "cuda/": "nvidia-cuda-cccl (pip install 'cuda-toolkit[cccl]')",
    "cub/": "nvidia-cuda-cccl (pip install 'cuda-toolkit[cccl]')",
    "thrust/": "nvidia-cuda-cccl (pip install 'cuda-toolkit[cccl]')",
}

_INCLUDE_RE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.MULTILINE)
_MISSING_RE = re.compile(r'(?:cannot|could not) open source file "([^"]+)"')


@dataclass(frozen=True)
class Compiled:
    """One NVRTC result: CUBIN for ``arch`` (empty when only PTX was asked for) and PTX."""

    cubin: bytes
    ptx: bytes
    arch: str
    log: str
    seconds: float


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor)."""
    major, minor = check_nvrtc(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """The ``sm_XY`` numbers this NVRTC can emit CUBIN for, ascending."""
    archs = check_nvrtc(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
    return tuple(sorted(int(a) for a in archs))


_ARCH_RE = re.compile(r"^(?:sm_|compute_)?(\d+)([af]?)$")


def parse_arch(arch: str) -> tuple[int, str]:
    """``"sm_90a"`` → ``(90, "a")``; raises ``ValueError`` on anything else."""
    m = _ARCH_RE.match(str(arch).strip())
    if not m:
        raise ValueError(f"arch must look like 'sm_90' or 'sm_90a', got {arch!r}")
    return int(m.group(1)), m.group(2)


def target_arch(arch: str) -> tuple[str, bool]:
    """The arch to compile for and whether it is exact.

    A device newer than NVRTC's newest target is capped to that target; the result is then
    not exact and the caller must load PTX (driver JIT) instead of the CUBIN.
    """
    num, suffix = parse_arch(arch)
    archs = supported_archs()
    if num in archs:
        return f"sm_{num}{suffix}", True
    older = [a for a in archs if a <= num]
    if not older:
        raise ValueError(f"{arch} is older than every arch this NVRTC supports ({archs})")
    return f"sm_{older[-1]}", False


@functools.cache
def include_dirs() -> tuple[str, ...]:
    """CUDA include directories found by ``cuda.pathfinder`` (``cudart``, then ``cccl``)."""
    from cuda import pathfinder

    dirs = []
    for lib in ("cudart", "cccl"):
        try:
            d = pathfinder.find_nvidia_header_directory(lib)
        except Exception:  # pathfinder raises on unknown/missing libs; absence is fine
            d = None
        if d and os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return tuple(dirs)


@functools.lru_cache(maxsize=4096)
def _read_file(path: str, mtime_ns: int, size: int) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _find_in_dirs(name: str, base: str | None, dirs: Sequence[str]) -> str | None:
    for d in ([base] if base else []) + list(dirs):
        p = os.path.join(d, name)
        if os.path.isfile(p):
            return p
    return None


def resolve_includes(source: str, headers: Mapping[str, str],
                     dirs: Sequence[str] | None = None) -> list[tuple[str, bytes]]:
    """Every header the source may include, with its content, in a stable order.

    The scan follows ``#include`` lines recursively and ignores preprocessor conditions,
    so it can list more files than one compile reads, never fewer. NVRTC built-ins
    (``<cstdint>`` and the like) are not files and are skipped.
    """
    dirs = include_dirs() if dirs is None else tuple(dirs)
    mem = {k: v.encode() if isinstance(v, str) else v for k, v in headers.items()}
    seen: dict[tuple[str, bytes], bytes] = {}
    done: set[str] = set()
    stack: list[tuple[bytes, str | None]] = [(source.encode(), None)]
    while stack:
        text, base = stack.pop()
        for m in _INCLUDE_RE.finditer(text):
            name = m.group(1).decode()
            if name in mem:
                key, content, nbase = "mem:" + name, mem[name], None
            else:
                path = _find_in_dirs(name, base, dirs)
                if path is None:
                    continue
                real = os.path.realpath(path)
                if real in done:
                    continue
                done.add(real)
                st = os.stat(path)
                # Keyed by the include name, not the absolute path, so that a cache warmed on
                # a builder with the same header contents at another path still hits.
                key, nbase = "file:" + name, os.path.dirname(path)
                content = _read_file(path, st.st_mtime_ns, st.st_size)
            if (key, content) in seen:
                continue
            seen[(key, content)] = content
            stack.append((content, nbase))
    return sorted((k, c) for (k, _), c in seen.items())


def _program_log(prog) -> str:
    size = check_nvrtc(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    buf = b" " * size
    check_nvrtc(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    return buf.rstrip(b"\0").decode(errors="replace")


def check_options(options: Sequence[str]) -> tuple[str, ...]:
    """Options must be single tokens (``-DNAME=1``, not ``-D``, ``NAME=1``): they are sorted."""
    out = tuple(str(o) for o in options)
    for o in out:
        if o in ("-D", "-U", "-I", "-include", "--define-macro", "--include-path") or not o.startswith("-"):
            raise ValueError(f"NVRTC option {o!r} must be one token with its value, e.g. '-DNAME=1': "
                             "options are sorted for the cache key, so split options would come apart")
    return out


def full_options(options: Sequence[str], arch: str) -> list[str]:
    """The options NVRTC actually gets: C++17, the target, the user's (sorted), includes."""
    opts = ["-std=c++17", f"-arch={arch}"]
    opts += sorted(check_options(options))
    opts += [f"-I{d}" for d in include_dirs()]
    return opts


def compile_source(source: str, name: str, arch: str, options: Sequence[str] = (),
                   headers: Mapping[str, str] | None = None, *, cubin: bool = True,
                   warn: bool = True) -> Compiled:
    """Compile one translation unit with NVRTC.

    Parameters
    ----------
    source, name
        The CUDA C++ text and the file name errors refer to.
    arch
        A target such as ``"sm_90"`` (or ``"sm_90a"`` for wgmma/setmaxnreg); must be one
        that :func:`target_arch` returned.
    options
        Extra NVRTC options (``-D...``, ``--use_fast_math``); order does not matter.
    headers
        In-memory headers, include name → text.
    cubin
        Also produce CUBIN (the default); PTX is always produced.
    warn
        Warn about ptxas's performance advisories (the default); the cache passes False
        and warns itself once the entry is stored.

    Raises
    ------
    CompileError
        NVRTC refused the source; the message names a missing header's package.

    Warns
    -----
    PerformanceWarning
        The log holds ptxas's "Potential Performance Loss" advisories (see
        :func:`performance_loss`), e.g. C7511: wgmma instructions serialised.
    """
    headers = dict(headers or {})
    hnames = [k.encode() for k in headers]
    hsrcs = [v.encode() if isinstance(v, str) else v for v in headers.values()]
    opts = full_options(options, arch)
    t0 = time.perf_counter()
    prog = check_nvrtc(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), len(hnames),
                                                hsrcs, hnames), "nvrtcCreateProgram")
    try:
        bopts = [o.encode() for o in opts]
        result = nvrtc.nvrtcCompileProgram(prog, len(bopts), bopts)
        log = _program_log(prog)
        if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise _compile_error(name, log, source, opts)
        ptx_size = check_nvrtc(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        ptx = b" " * ptx_size
        check_nvrtc(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        cub = b""
        if cubin:
            size = check_nvrtc(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            cub = b" " * size
            check_nvrtc(nvrtc.nvrtcGetCUBIN(prog, cub), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    if warn:
        warn_performance_loss(name, arch, log)
    return Compiled(cubin=cub, ptx=ptx, arch=arch, log=log, seconds=time.perf_counter() - t0)


def performance_loss(log: str) -> list[str]:
    """ptxas's "Potential Performance Loss" advisories in an NVRTC log (e.g. C7511: wgmma
    instructions serialised for want of registers)."""
    return [ln.strip() for ln in log.splitlines() if "Potential Performance Loss" in ln]


def warn_performance_loss(name: str, arch: str, log: str) -> None:
    """Warn (:class:`~attnrt.runtime.errors.PerformanceWarning`) if ``log`` holds such advisories."""
    lines = performance_loss(log)
    if lines:
        warnings.warn(PerformanceWarning(name, arch, lines), stacklevel=3)


def _compile_error(name: str, log: str, source: str, opts: Sequence[str]) -> CompileError:
    missing = _MISSING_RE.search(log)
    if missing:
        header = missing.group(1)
        pkg = next((p for prefix, p in HEADER_PACKAGES.items() if header.startswith(prefix)), None)
        where = f"it is provided by {pkg}" if pkg else "no known package provides it"
        searched = ", ".join(include_dirs()) or "no CUDA include directory was found"
        msg = (f"NVRTC could not find header {header!r} while compiling {name}: {where}. "
               f"Searched: {searched}.")
    else:
        first = next((ln for ln in log.splitlines() if "error" in ln), log.strip()[:200])
        msg = f"NVRTC failed to compile {name}: {first}"
    return CompileError(msg, name=name, log=log, source=source, options=opts)
