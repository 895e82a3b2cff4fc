"""The attnrt exception hierarchy.

Every error attnrt raises on purpose derives from :class:`AttnrtError`. Plain misuse of
Python arguments (a negative size, a wrong type) raises ``TypeError``/``ValueError``
instead. All errors keep their fields and survive ``pickle`` (pytest-xdist, process pools).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AttnrtError",
    "CudaError",
    "CompileError",
    "KernelError",
    "Unsupported",
    "CaptureError",
    "WorkspaceError",
    "PerformanceWarning",
]


class AttnrtError(Exception):
    """Base class of every attnrt error."""

    def __reduce__(self):  # keep subclass fields across pickle
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls, args, state):
    obj = cls.__new__(cls)
    Exception.__init__(obj, *args)
    obj.__dict__.update(state)
    return obj


class CudaError(AttnrtError):
    """A CUDA driver (or NVRTC) call failed.

    Attributes
    ----------
    code : int
        The numeric ``CUresult`` (or ``nvrtcResult``).
    name : str
        Its symbolic name, e.g. ``CUDA_ERROR_OUT_OF_MEMORY``.
    call : str
        The call that failed, e.g. ``cuMemAlloc(1073741824)``.
    """

    def __init__(self, code: int, name: str, call: str, detail: str = "") -> None:
        self.code = int(code)
        self.name = name
        self.call = call
        self.detail = detail
        msg = f"{call} failed: {name} ({self.code})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class CompileError(AttnrtError):
    """NVRTC refused a kernel source.

    Attributes
    ----------
    name : str
        The source's file name as given to NVRTC.
    log : str
        NVRTC's log.
    source : str
        The source text.
    options : tuple[str, ...]
        The exact options NVRTC was given.
    """

    def __init__(self, message: str, *, name: str = "", log: str = "", source: str = "",
                 options: Sequence[str] = ()) -> None:
        self.name = name
        self.log = log
        self.source = source
        self.options = tuple(options)
        super().__init__(message)

    def numbered_source(self) -> str:
        """The source with 1-based line numbers, as NVRTC's log refers to them."""
        lines = self.source.splitlines()
        width = len(str(len(lines))) if lines else 1
        return "\n".join(f"{i:>{width}} | {line}" for i, line in enumerate(lines, 1))

    def dump(self) -> str:
        """Everything needed to reproduce the failure: options, log, numbered source."""
        return (f"{self}\n--- options ---\n{' '.join(self.options)}\n"
                f"--- log ---\n{self.log.rstrip()}\n--- source: {self.name} ---\n"
                f"{self.numbered_source()}\n")


class KernelError(AttnrtError):
    """A kernel refused its inputs (shape, dtype, attribute or stride it cannot take).

    The message names the input, the value received and what was expected.
    """


class Unsupported(AttnrtError):
    """A node or configuration that this kernel declines (claim time) or does not implement."""


class CaptureError(AttnrtError):
    """An operation that is illegal while capturing, or latched error bits after a replay.

    Attributes
    ----------
    bits : int
        The latch word that was read (0 when the error is not about the latch).
    names : tuple[str, ...]
        The registered names of every set bit.
    """

    def __init__(self, message: str, *, bits: int = 0, names: Sequence[str] = ()) -> None:
        self.bits = int(bits)
        self.names = tuple(names)
        super().__init__(message)


class WorkspaceError(AttnrtError):
    """A workspace is smaller than (or misaligned for) what the kernel asked for.

    Attributes
    ----------
    required : int
        Bytes the kernel's ``workspace_requirement`` asked for.
    provided : int
        Bytes that were passed.
    """

    def __init__(self, message: str, *, required: int = 0, provided: int = 0) -> None:
        self.required = int(required)
        self.provided = int(provided)
        super().__init__(message)


class PerformanceWarning(UserWarning):
    """A kernel compiled, but ptxas reported that it gave up performance to do so.

    Raised as a warning (``warnings.warn``) by :func:`attnrt.runtime.compiler.compile_source` when the
    log holds a "Potential Performance Loss" advisory, e.g. C7511: too few registers to keep
    wgmma instructions in flight, so every wgmma of the kernel is serialised (several times
    slower on Hopper). Such advisories depend on the ptxas version inside NVRTC, so a kernel
    clean on one toolkit can draw one on another. It is raised once per kernel and process
    (at the compile or at the first disk-cache load). ``warnings.simplefilter("error",
    attnrt.PerformanceWarning)``, or pytest's ``-W error::attnrt.runtime.errors.PerformanceWarning``,
    turns it into a failure (attnrt's own tests do, through ``pyproject.toml``).

    Attributes
    ----------
    name : str
        The source's file name as given to NVRTC.
    arch : str
        The compile target, e.g. ``sm_90a``.
    lines : tuple of str
        ptxas's advisory lines.
    """

    def __init__(self, name: str, arch: str, lines: Sequence[str]) -> None:
        self.name, self.arch, self.lines = name, arch, tuple(lines)
        super().__init__(f"{name} ({arch}): ptxas reports a performance loss: " + "; ".join(self.lines))

    def __reduce__(self):  # keep the fields across pickle
        return (type(self), (self.name, self.arch, self.lines))
