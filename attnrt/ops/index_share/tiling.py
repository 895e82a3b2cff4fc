"""IndexShare's tiling rules: per attention path, the CTA's shape, its ring and how many
CTAs share an SM, before the split-K count is chosen (:mod:`.plan` calls these).

Why each default is what it is: docs/notes/index_share.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnrt.runtime.errors import KernelError

from .._common import Variant
from .builds import (
    _DEFAULT_PIPE,
    _KT,
    _MAX_STAGES,
    _SIMT_THREADS,
    _WS_KT,
    MMA_LAYOUTS,
    MMA_PIPES,
    WG_LAYOUTS,
    WG_MINB,
    WG_QREG_LAYOUT,
    WS_KTS,
    _mma_smem,
    _mma_variant,
    _round_up,
    _simt_variant,
    _wg_smem,
    _wg_variant,
    _ws_nst,
)
from .schema import OP, Geometry, _max_head_size

if TYPE_CHECKING:
    from .plan import DeviceLimits, IndexShareConfig


def _or(value: Any, default: Any) -> Any:
    """A pinned knob, else the rule's default."""
    return default if value is None else value


@dataclass(frozen=True)
class _Tiling:
    """What a path's rule fixes before the splits are chosen."""

    variant: Variant | None  # (ws: chosen with the splits)
    entry: str
    threads: int
    hpc: int  # heads per CTA
    lpk: int  # lanes per key (CUDA cores)
    stages: int  # tensor-core ring depth (0 on CUDA cores)
    per_sm: int  # CTAs per SM the plan is sized for
    col_align: int  # split columns come in multiples of this
    max_cps: int  # most columns per split
    layout: tuple[int, ...] = ()  # ws: (kt,); wg: (wgs, mrows, qreg); mma: (wm, wn)


def _ws_tiling(g: Geometry, cfg: IndexShareConfig) -> _Tiling:
    """Warp-specialised persistent build: 128 heads per item, 128-key tiles (or 64, knob
    ``kt``), one CTA per SM looping over the (task, split) items."""
    kt = int(_or(cfg.kt, _WS_KT))
    if kt not in WS_KTS:
        raise KernelError(f"{OP}: kt={kt} must be one of {WS_KTS}")
    return _Tiling(None, "is_attn_ws", 384, 128, 0, _ws_nst(g.head_size, kt), 1, _WS_KT, 2048,
                   (kt,))


def _wg_tiling(g: Geometry, dev: DeviceLimits, cfg: IndexShareConfig, many: bool) -> _Tiling:
    """Barrier-coupled wgmma build (see docs/notes/index_share.md#wg-layouts).

    Decode: groups above 64 heads take one 128-head CTA of two warpgroups, 64-head blocks
    two warpgroups splitting each tile's keys, one CTA per SM with the deepest ring. Many
    rows: one-warpgroup 64-head CTAs with Q in registers, a 2-stage ring and registers
    capped so that three share an SM (see docs/notes/index_share.md#three-ctas-per-sm).
    """
    h = g.head_size
    mrows = int(_or(cfg.mrows, 128 if g.group > 64 and not many else 64))
    wgs = int(_or(cfg.wgs, 1 if (many and mrows == 64) else 2))
    if (wgs, mrows) not in WG_LAYOUTS:
        raise KernelError(f"{OP}: wgmma layout (wgs={wgs}, mrows={mrows}) has no build; "
                          f"choose one of {WG_LAYOUTS}")
    col_align, max_cps = 64 * (wgs // (mrows // 64)), 2048
    cps_hi = min(max_cps, _round_up(g.width, col_align))
    one_wg_many = many and (wgs, mrows) == WG_QREG_LAYOUT
    qreg = int(_or(cfg.qreg, 1 if one_wg_many else 0))
    if qreg not in (0, 1) or (qreg and (wgs, mrows) != WG_QREG_LAYOUT):
        raise KernelError(f"{OP}: qreg={qreg} must be 0, or 1 with the layout "
                          f"(wgs, mrows) = {WG_QREG_LAYOUT}")
    three = (one_wg_many and qreg == 1 and int(_or(cfg.overlap, 0)) == 0
             and int(_or(cfg.stages, 2)) == 2)
    minb = int(_or(cfg.minb, 3 if three else 1))
    if minb not in WG_MINB or (minb > 1 and (wgs, qreg) != (1, 1)):
        raise KernelError(f"{OP}: minb={minb} must be one of {WG_MINB} (3 only with one "
                          "warpgroup and qreg=1: two warpgroups cannot fit 168 registers)")
    overlap = int(_or(cfg.overlap, 1 if (many and mrows == 128)
                      or (one_wg_many and minb == 1) else 0))
    if overlap not in (0, 1):
        raise KernelError(f"{OP}: overlap={overlap} must be 0 or 1")
    variant = _wg_variant(g.dtype, h, wgs, mrows, overlap, qreg, minb)
    min_st = 3 if overlap else 2  # the overlapped loop waits one tile further ahead
    # One warpgroup: two CTAs per SM where two fit (one's softmax overlaps the other's
    # wgmma), three with the 168-register build; two warpgroups: one CTA, deepest ring.
    per_sm = minb if minb > 1 else (2 if wgs == 1 else 1)
    while True:
        budget = min(dev.smem_max, dev.smem_sm // per_sm - 1024)
        if cfg.stages is not None:
            stages = int(cfg.stages)
            if not min_st <= stages <= 8:
                raise KernelError(f"{OP}: stages={stages} must be in [{min_st}, 8]")
        else:
            stages = _MAX_STAGES
            while stages > min_st and _wg_smem(h, wgs, mrows, stages, cps_hi, qreg) > budget:
                stages -= 1
        if per_sm == 1 or _wg_smem(h, wgs, mrows, stages, cps_hi, qreg) <= budget:
            break
        if minb > 1:
            raise KernelError(f"{OP}: minb={minb} needs {minb} CTAs per SM, but the plan's "
                              f"{_wg_smem(h, wgs, mrows, stages, cps_hi, qreg)} bytes of "
                              f"shared memory (stages={stages}) leave room for fewer")
        per_sm = 1
    return _Tiling(variant, "is_attn_wg", 128 * wgs, mrows, 0, stages, per_sm, col_align,
                   max_cps, (wgs, mrows, qreg))


def _default_layout(group: int) -> tuple[int, int]:
    """Warps along heads x along keys: enough 16-head MMA rows for the group, 8 warps."""
    if group <= 16:
        return 1, 4
    if group <= 64:
        return 4, 2
    return 8, 1


def _mma_tiling(g: Geometry, dev: DeviceLimits, cfg: IndexShareConfig) -> _Tiling:
    """mma.sync build: the group's warp layout (or a smaller one where shared memory is
    short), eight warps per SM (the registers allow no more) as one CTA with the deepest
    ring that fits or two 4-warp CTAs sharing the SM."""
    h = g.head_size
    col_align, max_cps = _KT, 2048
    cps_hi = min(max_cps, _round_up(g.width, col_align))
    if cfg.wm is not None or cfg.wn is not None:
        wm, wn = _default_layout(g.group)
        wm, wn = int(_or(cfg.wm, wm)), int(_or(cfg.wn, wn))
        if (wm, wn) not in MMA_LAYOUTS:
            raise KernelError(f"{OP}: tensor-core layout (wm={wm}, wn={wn}) has no build; "
                              f"choose one of {MMA_LAYOUTS}")
    else:
        first = _default_layout(g.group)
        if first == (4, 2) and g.batch * g.q_len >= 4 * dev.sm_count:
            # Many independent rows: two 4-warp CTAs per SM with a 2-deep ring beat one
            # 8-warp CTA (see docs/notes/index_share.md#mma-prefill-layout).
            first = (4, 1)
        order = [first, (4, 2), (4, 1), (1, 4)]
        wm, wn = next((c for c in order if _mma_smem(*c, 2, h, cps_hi) <= dev.smem_max),
                      order[0])
    threads = 32 * wm * wn
    pipe = int(_or(cfg.pipe, _DEFAULT_PIPE))
    if pipe not in MMA_PIPES:
        raise KernelError(f"{OP}: pipe={pipe} must be one of {MMA_PIPES}")
    variant = _mma_variant(g.dtype, h, wm, wn, pipe)
    per_sm = 2 if threads == 128 else 1
    while True:
        budget = min(dev.smem_max, dev.smem_sm // per_sm - 1024)
        if cfg.stages is not None:
            stages = int(cfg.stages)
            if not 2 <= stages <= 8:
                raise KernelError(f"{OP}: stages={stages} must be in [2, 8]")
        else:
            stages = _MAX_STAGES
            while stages > 2 and _mma_smem(wm, wn, stages, h, cps_hi) > budget:
                stages -= 1
        if per_sm == 1 or _mma_smem(wm, wn, stages, h, cps_hi) <= budget:
            break
        per_sm = 1
    return _Tiling(variant, "is_attn_mma", threads, 16 * wm, 0, stages, per_sm, col_align,
                   max_cps, (wm, wn))


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _simt_tiling(g: Geometry, aligned16: bool) -> _Tiling:
    """CUDA-core build: 16-byte chunks of the head where aligned, a power-of-two of lanes
    per key, four heads per CTA where they share an index row."""
    h, dt = g.head_size, g.dtype
    wide = 16 // dt.itemsize
    vec = wide if (h % wide == 0 and aligned16) else 1
    nchunks = h // vec
    if vec > 1 and nchunks <= 64:
        cpl = 1 if nchunks <= 32 else 2
    elif vec == 1 and nchunks <= 128:
        cpl = 4
    else:
        raise KernelError(f"{OP}: head size {h} ({dt.name}) needs 16-byte aligned query/"
                          f"key/value/past/output pointers (at most {_max_head_size(dt, h)})")
    lpk = min(32, _pow2_ceil(-(-nchunks // cpl)))
    hpc = 4 if (g.index_heads == 1 and g.group >= 2) else 1
    return _Tiling(_simt_variant(dt, vec, cpl, hpc), "is_attn_simt", _SIMT_THREADS, hpc, lpk,
                   0, 4, 32, 4096)
