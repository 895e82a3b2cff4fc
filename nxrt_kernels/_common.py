"""Helpers shared by the op modules: sources, headers, compile variants, validation."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nxrt.api import DataType, WorkspaceRequirement, WorkspaceView
from nxrt.errors import KernelError, WorkspaceError

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
    """The text of ``nxrt_kernels/cuda/<name>``."""
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

    ``nxrt warm`` and the CPU compile tests walk every op module's ``compile_variants()``.
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
