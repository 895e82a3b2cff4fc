"""IndexShare's split-K rules: how many splits a task's columns take, the build and
shared memory for them, and how the splits merge (:mod:`.plan` calls these).

Why each rule is what it is, with the measurements behind it: docs/notes/index_share.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnrt.runtime.api import DataType
from attnrt.runtime.errors import KernelError

from .._common import Variant
from .builds import (
    _WS_KT,
    WS_MAX_SPLITS,
    _mma_smem,
    _round_up,
    _wg_smem,
    _ws_smem,
    _ws_variant,
)
from .schema import OP, Geometry
from .tiling import _or, _Tiling

if TYPE_CHECKING:
    from .plan import DeviceLimits, IndexShareConfig


@dataclass(frozen=True)
class _Call:
    """One planning call's inputs, as the rules read them."""

    g: Geometry
    dev: DeviceLimits
    cfg: IndexShareConfig
    aligned16: bool
    many: bool  # prefill-like: the rows alone fill the GPU


def _choose_splits(tasks: int, width: int, col_align: int, max_cps: int, slots: int) -> int:
    """Split count minimising a wave model of the launch (a function of shapes and device).

    Cost, in units of one tile's gather: waves x (tiles per split + 3 tiles of fixed
    per-CTA latency: index staging, pipeline fill, epilogue) + 2 for the split merge.
    Decode rows (few tasks) split until the CTAs fill one wave; prefill rows do not split.
    """
    ntiles = -(-width // col_align)
    best, best_cost = 1, None
    for s in range(1, min(32, ntiles) + 1):
        cps = min(_round_up(-(-width // s), col_align), max_cps)
        real = -(-width // cps)
        if real != s:
            continue
        waves = -(-tasks * s // slots)
        cost = waves * (cps // col_align + 3) + (2 if s > 1 else 0)
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return best


def _ws_exact_cps(width: int, s: int) -> int:
    """Columns per split of a ws plan asked for ``s`` splits (the planner's rounding to
    whole 128-key tiles, at most 2048), or 0 where that rounding gives another count."""
    cps = min(_round_up(-(-width // s), _WS_KT), 2048)
    return cps if -(-width // cps) == s else 0


def _ws_decode_split(tasks: int, width: int, sm_count: int,
                     cap: int | None = None) -> tuple[int, str] | None:
    """(splits, merge) of a warp-specialised decode plan with one item per CTA, or None.

    A split's cost is its rows (a CTA gathers at a fixed rate whatever the load) plus its
    merge, and the last-arrival merge reads every partial on one SM (see
    docs/notes/index_share.md#ws-decode-split). So, the first that applies: up to half the
    SMs busy, up to eight splits
    of >= 2 tiles each, four or eight as four- or eight-CTA clusters that merge their
    partials inside the kernel (IS_CMERGE), five to seven by ``is_combine`` over the whole GPU; four
    splits as four-CTA clusters, up to half the SMs (B 9-16 at 2048 keys); two splits per
    task as two-CTA clusters while they fit in one wave (B <= 66 at one kv head); else None
    (``_ws_persistent_splits`` decides). A split count counts only where the plan's 128-key column split comes
    out at exactly that many; ``cap`` (the ctas knob) caps the CTAs as it caps the grid.
    """
    cap = sm_count if cap is None else cap
    ntiles = -(-width // _WS_KT)

    wide = min(WS_MAX_SPLITS, ntiles // 2)
    for s, bound in ((wide, sm_count // 2), (4, sm_count // 2), (2, sm_count)):
        if (s >= 4 or (s == 2 and ntiles >= 2)) and tasks * s <= min(bound, cap) and _ws_exact_cps(width, s):
            return s, "cluster" if s in (2, 4, 8) else "kernel"
    return None


#: What one split item of a persistent ws plan costs beyond its tiles, in tiles' time: its
#: partials and its share of the split merge (a fit, see
#: docs/notes/index_share.md#ws-split-item-cost).
_WS_SPLIT_ITEM_TILES = 8


def _ws_persistent_splits(tasks: int, width: int, slots: int) -> int:
    """Split count of a warp-specialised decode plan with more items than one per CTA.

    The persistent grid of ``slots`` CTAs takes items c, c + slots, ... in turn, and a CTA
    gathers at a fixed rate whatever the load, so a
    launch lasts as long as its busiest CTA: ceil(tasks x s / slots) items of (tiles per
    split + ``_WS_SPLIT_ITEM_TILES`` if s > 1) tiles each. The least such cost over the
    split counts the 128-key column split gives exactly (from the fewest that fit in
    2048-column splits to ``WS_MAX_SPLITS``), fewer splits on a tie (see
    docs/notes/index_share.md#ws-persistent-splits).
    """
    lo = -(-width // 2048)
    best, best_cost = lo, None
    for s in range(lo, max(lo, WS_MAX_SPLITS) + 1):
        cps = _ws_exact_cps(width, s)
        if not cps:
            continue
        cost = -(-tasks * s // max(1, slots)) * (cps // _WS_KT
                                                 + (_WS_SPLIT_ITEM_TILES if s > 1 else 0))
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return best


def _choose_split(c: _Call, t: _Tiling, path: str, ws: int, tasks: int,
                  cap: int) -> tuple[int, int]:
    """(splits, columns per split): pinned, else the rule of the plan's build."""
    g, sm = c.g, c.dev.sm_count
    tc = path in ("mma", "wg")
    if c.cfg.splits is not None:
        # The tensor-core finish keeps nh x (splits + 1) weights in the ring: at most 32.
        splits = max(1, min(int(c.cfg.splits), -(-g.width // t.col_align),
                            WS_MAX_SPLITS if ws else 32 if tc else 1 << 30))
    elif ws and not c.many:
        dec = _ws_decode_split(tasks, g.width, sm, cap)
        splits = dec[0] if dec is not None else _ws_persistent_splits(tasks, g.width, min(sm, cap))
    elif tc:
        splits = _choose_splits(tasks, g.width, t.col_align, t.max_cps, max(1, sm * t.per_sm))
        if ws:
            splits = min(splits, WS_MAX_SPLITS)
    else:  # CUDA cores: split decode rows until the CTAs fill the GPU, >= 256 columns each
        target = sm * t.per_sm
        want = 1 if tasks >= target else -(-target // max(tasks, 1))
        splits = max(min(want, -(-g.width // 256)), -(-g.width // t.max_cps), 1)
    cps = min(_round_up(-(-g.width // splits), t.col_align), t.max_cps)
    return -(-g.width // cps), cps


def _build(c: _Call, t: _Tiling, path: str, ws: int, splits: int, cps: int) -> tuple[Variant, int]:
    """The build for these splits and its dynamic shared memory (refused past the device's)."""
    g, smem_max, h = c.g, c.dev.smem_max, c.g.head_size
    if ws:
        # Two Q slots (the next item's Q streams in under this one's last tiles) where the
        # shared memory has room: one split (no merge weights) and int32 indices.
        kt = t.layout[0]
        q2_smem = _ws_smem(h, cps, 1, 0, kt)
        q2_ok = splits == 1 and g.index_dtype == DataType.INT32 and q2_smem <= smem_max
        q2 = int(_or(c.cfg.q2, 1 if q2_ok else 0))
        if q2 not in (0, 1) or (q2 and not q2_ok):
            raise KernelError(f"{OP}: q2={q2} must be 0, or 1 with one split, int32 indices and "
                              f"{q2_smem} bytes of shared memory")
        variant, smem = _ws_variant(g.dtype, h, q2, 0, kt), _ws_smem(h, cps, q2, 0, kt)
        if smem > smem_max:
            raise KernelError(f"{OP}: the warp-specialised plan needs {smem} bytes of shared "
                              f"memory ({cps} columns per split); the device allows {smem_max}")
    elif path == "wg":
        wgs, mrows, qreg = t.layout
        variant, smem = t.variant, _wg_smem(h, wgs, mrows, t.stages, cps, qreg)
        if smem > smem_max:
            raise KernelError(f"{OP}: the wgmma plan needs {smem} bytes of shared memory "
                              f"(wgs={wgs}, mrows={mrows}, stages={t.stages}, {cps} columns per "
                              f"split); the device allows {smem_max}")
    elif path == "mma":
        wm, wn = t.layout
        variant, smem = t.variant, _mma_smem(wm, wn, t.stages, h, cps)
        if smem > smem_max:
            raise KernelError(f"{OP}: the tensor-core plan needs {smem} bytes of shared memory "
                              f"(wm={wm}, wn={wn}, stages={t.stages}, {cps} columns per split); "
                              f"the device allows {smem_max}. Use fewer heads per kv head or "
                              "the CUDA-core path (IndexShareConfig(path='simt'))")
    else:
        variant, smem = t.variant, _round_up(cps, 4) * 4 + (4 * t.hpc * h + 8 * t.hpc) * 4
    return variant, smem


def _choose_merge(c: _Call, t: _Tiling, ws: int, splits: int, cps: int, tasks: int, cap: int,
                  variant: Variant, smem: int) -> tuple[str, Variant, int]:
    """How the splits merge, and the build and shared memory that merge needs.

    Warp-specialised decode with one item per CTA merges inside a cluster: two splits
    through distributed shared memory while the clusters fit on the SMs (Hopper SMs come
    in pairs), four or eight within half the SMs (GPCs hold whole clusters; see
    docs/notes/index_share.md#cluster-merge). More than two splits of few tasks otherwise
    merge in ``is_combine`` over the whole GPU, everything else in the task's last CTA
    (see docs/notes/index_share.md#split-merge).
    """
    if splits == 1:
        return "none", variant, smem
    g, sm, smem_max, h = c.g, c.dev.sm_count, c.dev.smem_max, c.g.head_size
    kt = t.layout[0] if ws else _WS_KT  # (only ws plans have a kt; the message names bytes)
    items = tasks * splits
    cluster_ok = bool(ws and items <= min(sm, cap) and (
        (splits == 2 and _ws_smem(h, cps, 0, 1, kt) <= smem_max)
        or (splits in (4, 8) and items <= sm // 2 and kt == _WS_KT)))
    merge = str(_or(c.cfg.merge, "cluster" if cluster_ok else
                    "kernel" if ws and splits > 2 and not c.many and tasks <= sm // 2 else "last"))
    if merge not in ("last", "kernel", "cluster"):
        raise KernelError(f"{OP}: merge={merge!r} must be 'last', 'kernel' or 'cluster'")
    if merge == "cluster" and not cluster_ok:
        raise KernelError(f"{OP}: merge='cluster' needs the warp-specialised build (ws=1), "
                          f"two splits (one work item per CTA, at most {min(sm, cap)}, "
                          f"and {_ws_smem(h, cps, 0, 1, kt)} bytes of shared memory) or "
                          f"four or eight (128-key tiles, one work item per CTA, at most "
                          f"{min(sm // 2, cap)}); this plan has ws={ws}, {splits} "
                          f"splits, {items} items, a device limit of {smem_max}")
    if merge == "cluster" and splits in (4, 8):
        variant = _ws_variant(g.dtype, h, 0, splits, kt)
    elif merge == "cluster":
        variant, smem = _ws_variant(g.dtype, h, 0, 1, kt), _ws_smem(h, cps, 0, 1, kt)
    return merge, variant, smem
