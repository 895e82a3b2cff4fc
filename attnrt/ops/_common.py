"""Helpers shared by the op modules: sources, headers, compile variants, validation."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from attnrt.runtime.api import DataType, WorkspaceRequirement, WorkspaceView
from attnrt.runtime.errors import CaptureError, KernelError, WorkspaceError

from . import CUDA_DIR

__all__ = ["source", "headers", "CTYPE", "Variant", "defines_to_options", "get_function",
           "expect", "check_workspace"]

#: The C type our kernels use for each supported element type.
CTYPE: dict[DataType, str] = {
    DataType.FLOAT: "float",
    DataType.FLOAT16: "__half",
    DataType.BFLOAT16: "__nv_bfloat16",
}


@functools.cache
def source(name: str) -> str:
    """The text of ``attnrt.ops/cuda/<name>``."""
    return (CUDA_DIR / name).read_text()


@functools.cache
def _headers() -> tuple[tuple[str, str], ...]:
    return tuple((p.name, p.read_text()) for p in sorted(CUDA_DIR.glob("*.cuh")))


def headers() -> dict[str, str]:
    """Every ``.cuh`` shipped in ``cuda/``, include name -> text (passed to NVRTC in memory)."""
    return dict(_headers())


def defines_to_options(defines: Mapping[str, object]) -> tuple[str, ...]:
    return tuple(f"-D{k}={v}" for k, v in sorted(defines.items()))


@dataclass(frozen=True)
class Variant:
    """One compile of one ``.cu`` file: its ``-D`` defines, entries, and minimum arch.

    ``attnrt warm`` and the CPU compile tests walk every op module's ``compile_variants()``.
    """

    file: str
    entries: tuple[str, ...]
    defines: Mapping[str, object] = field(default_factory=dict)
    min_arch: int = 80  # e.g. 90 for a variant that needs sm_90 / sm_90a
    arch_suffix: str = ""  # "a" for wgmma/setmaxnreg variants

    @property
    def options(self) -> tuple[str, ...]:
        return defines_to_options(self.defines)

    @property
    def module(self) -> str:
        return self.file.rsplit(".", 1)[0]


def get_function(rt, variant: Variant, entry: str):
    """Compile (cached) and load ``entry`` of ``variant`` on runtime ``rt``."""
    arch = None
    if variant.arch_suffix:
        arch = f"{rt.arch}{variant.arch_suffix}"
    return rt.nvrtc_function(variant.module, source(variant.file), entry, variant.options,
                             headers=headers(), arch=arch)


def expect(cond: bool, message: str) -> None:
    """Raise :class:`KernelError` with ``message`` unless ``cond``."""
    if not cond:
        raise KernelError(message)


def check_workspace(op: str, req: WorkspaceRequirement, ws: WorkspaceView | None) -> None:
    """Refuse a missing, short or misaligned workspace for a non-empty requirement."""
    if req.nbytes == 0:
        return
    if ws is None:
        raise WorkspaceError(f"{op}: needs a workspace of {req.nbytes} bytes, none was given",
                             required=req.nbytes, provided=0)
    if ws.nbytes < req.nbytes:
        raise WorkspaceError(f"{op}: workspace of {ws.nbytes} bytes is short; {req.nbytes} required",
                             required=req.nbytes, provided=ws.nbytes)
    if ws.ptr % req.alignment:
        raise WorkspaceError(f"{op}: workspace pointer 0x{ws.ptr:x} is not {req.alignment}-byte aligned",
                             required=req.nbytes, provided=ws.nbytes)


def seq(values: Sequence[object]) -> str:
    return "[" + ", ".join(map(str, values)) + "]"


class ScratchPool:
    """One device buffer with a stable address, grown only outside capture (an op's scratch
    when the caller passes no workspace).

    With ``zeroed`` a new buffer is cleared when allocated (split counters: kernels leave
    them at zero, so they stay zero between launches and a replay needs no memset).
    """

    def __init__(self, rt: Any, op: str, zeroed: bool = False) -> None:
        self.rt = rt
        self.op = op
        self.zeroed = zeroed
        self.ptr = 0
        self.nbytes = 0

    def ensure(self, nbytes: int, capturing: bool) -> int:
        """The buffer's address, grown to ``nbytes`` first if needed (0 for 0 bytes).

        Raises
        ------
        CaptureError
            It must grow while the stream is capturing (no allocation inside a capture).
        """
        if nbytes <= self.nbytes and self.ptr:
            return self.ptr
        if nbytes == 0:
            return 0
        if capturing:
            raise CaptureError(
                f"{self.op}: needs {nbytes} bytes of pooled scratch but the pool holds "
                f"{self.nbytes}; the missing warm-up: run one eager execute with the capture's "
                "shapes before begin_capture() (or pass a workspace of "
                "workspace_requirement() bytes)")
        new = self.rt.alloc_raw(nbytes)
        if self.zeroed:
            self.rt.memset(new, 0, nbytes)
        if self.ptr:
            self.rt.synchronize()  # earlier launches may still read the old buffer
            self.rt.free_raw(self.ptr)
        self.ptr, self.nbytes = new, nbytes
        return new

    def release(self) -> None:
        """Free the buffer (the next ``ensure`` allocates again)."""
        if self.ptr:
            self.rt.free_raw(self.ptr)
            self.ptr, self.nbytes = 0, 0
