"""``pkg.nxrt::IndexShare``: selected-token sparse attention (DeepSeek DSA / GLM IndexShare).

Inputs (schema order): query [B,N,Sq,H]; key, value [B,Nkv,Scur,H]; optional past_key,
past_value [B,Nkv,Spast,H]; selected_indices [B,1|N,Sq,K] int32/int64 (trailing -1
padding); optional attention_bias broadcastable (right-aligned) to [B,N,Sq,cache].
Outputs: Y [B,N,Sq,H], and optionally present_key/present_value, either growing
([B,Nkv,Spast+Scur,H] = past ⧺ current, bit for bit) or fixed-capacity ([B,Nkv,Spast,H],
may alias past: the current tokens land at ``valid_len[b] - Scur`` where ``valid_len`` is
the bias's finite frontier, see :func:`._ref_index_share.capacity_valid_lengths`).

Index rules (:func:`._ref_index_share.find_index_violation`, shared with the reference):
eagerly, ``selected_indices`` is copied to the host and checked before anything that
changes an output is launched; a broken row is a :class:`SelectedIndicesError` (a
``KernelError``) naming [batch, head, query, column] and the reason. In capacity mode the
bound is the per-batch valid length: the frontier kernel derives it from the bias on the
device and only those B integers are read back (instead of the whole bias), so eager
capacity mode costs one small device round trip. While the stream is capturing, the
attention kernel itself checks the same rules as it stages each split's columns (every
rule is local to a column and its left neighbour) and sets latch bit 512
(``nxrt.latch.INDEX_SHARE_SELECTED_INDICES``); ``rt.latch.check()`` after a replay raises
``CaptureError`` naming it. Every gather index is clamped, so a poisoned replay never reads
out of bounds (its Y is garbage, by design: the latch says so).

Scratch (split-K partials and counters, the capacity valid lengths) comes from the
caller's workspace when given (``workspace_requirement`` covers every path and present
mode the inputs allow; planning and execution share ``_plan``), else from per-kernel pools
with stable addresses that grow only in eager calls; needing to grow while capturing is a
``CaptureError`` naming the missing warm-up. ``capture_support()`` is "no" until one eager
``execute`` has compiled the kernels and sized the pools.

Kernels (``cuda/index_share_*.cu``): a CUDA-core path for every dtype and head size
(warps split the selected keys, 16-byte coalesced row gathers, shuffle reductions in a
fixed order), and a tensor-core path for f16/bf16 with H in {64, 128} when >= 8 heads
share an index row and a kv head (the group's heads form the MMA M dimension, so each
gathered row is read once per CTA; a multi-stage cp.async ring keeps several tiles of rows
in flight). On sm_90 (Hopper) groups of >= ``WG_MIN_GROUP`` heads sharing an index row take
a wgmma path instead (``cuda/index_share_wg.cu``, sm_90a): 64 heads per warpgroup as the
wgmma M dimension, S = Q K^T and O += P V issued asynchronously straight from the swizzled
cp.async ring; layouts (warpgroups, head rows) in ``WG_LAYOUTS`` and the knobs ``wgs``,
``mrows``, ``overlap`` (FA3's intra-warpgroup pipelining), ``qreg`` (Q in registers) and
``minb`` (3: registers capped so three CTAs share an SM). Groups of ``WS_MIN_GROUP`` heads
or more take the warp-specialised persistent build
(``cuda/index_share_ws.cu``, knob ``ws``): one CTA per SM loops over (task, split) items
of up to 128 heads, a producer warpgroup stages and validates each item's index columns one
item ahead and gathers 128-key tiles into mbarrier rings, two consumer warpgroups share
every tile (knobs ``ctas``: cap the grid; ``q2``: two Q slots, one split and int32 indices
only). ``NXRT_INDEX_SHARE_WG=0`` turns the wgmma path off. Decode rows split the selected
keys over CTAs until they fill the GPU; the task's last CTA merges the split partials in
split order (knob ``merge``: "last", or "kernel" for a separate ``is_combine`` launch).
Past one CTA per split item the warp-specialised build splits only where that shortens its
busiest CTA (``_ws_persistent_splits``: a split item's partials cost about 8 tiles; NOTES,
IndexShare round 21). A
warp-specialised plan with two splits and one item per CTA (decode: B 64 on 132 SMs) runs
the two splits of a task as a two-CTA cluster instead (``merge="cluster"``, the default
there): each CTA sends its partner half of its unnormalised output through distributed
shared memory and finishes the other half, with the last-arrival merge's arithmetic (the
same bits), and no split partials or counters in global memory. Decode rows of up to half
the SMs take eight splits of two tiles per task instead (or four, at up to twice the rows),
as eight- (four-) CTA clusters: after a cluster barrier each CTA stores its partials
straight into the shared memory of the CTAs that finish them (four: writes them to L2),
and after a second one finishes its share of the task's channels (``merge="cluster"``
with ``splits`` 4 or 8; the planner's rule for decode is ``_ws_decode_split``, measured in
NOTES, IndexShare rounds 20-22).
Every path is bitwise deterministic: fixed reduction orders, no floating-point atomics,
and the plan depends only on shapes and the device.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nxrt.api import (
    CaptureSupport,
    DataType,
    Node,
    TensorMetadata,
    TensorMut,
    TensorView,
    WorkspaceRequirement,
    WorkspaceView,
)
from nxrt.errors import CaptureError, KernelError

from . import _common
from ._common import ScratchPool, Variant
from ._ref_index_share import (
    FLOAT_TYPES,
    INDEX_TYPES,
    INPUT_NAMES,
    OP,
    Attributes,
    Geometry,
    IndexViolation,
    SelectedIndicesError,
    bias_strides,
    check_selected_indices,
    find_index_violation,
    parse_attributes,
    resolve_geometry,
)

__all__ = ["IndexShareFactory", "IndexShareKernel", "compile_variants", "find_index_violation",
           "check_selected_indices", "IndexViolation", "SelectedIndicesError", "MMA_LAYOUTS",
           "PLAN_KNOBS"]

_DTYPE_CODE = {DataType.FLOAT: 0, DataType.FLOAT16: 1, DataType.BFLOAT16: 2}
_KT = 64  # keys per tensor-core tile (IS_KT)
_SIMT_THREADS = 128
_ALIGN = 256
_MAX_STAGES = 5  # deepest tensor-core ring the planner picks (the kernel takes up to 8)
_AUX_ENTRIES = ("is_frontier", "is_copy_w16", "is_copy_w8", "is_copy_w4", "is_copy_w2",
                "is_scatter_w16", "is_scatter_w8", "is_scatter_w4", "is_scatter_w2",
                "is_combine")
#: Tensor-core warp layouts (WM warps along heads x WN along each tile's keys) with builds.
MMA_LAYOUTS = ((1, 4), (4, 1), (4, 2), (8, 1))
#: Plan knobs a caller may pin through ``IndexShareKernel.plan_override`` (sweeps, tests).
PLAN_KNOBS = ("splits", "wm", "wn", "stages", "merge", "pipe", "wgs", "mrows", "overlap",
              "qreg", "minb", "ws", "ctas", "q2", "kt")
#: Hopper (sm_90a) wgmma builds (cuda/index_share_wg.cu): (warpgroups, head rows per CTA).
#: (1, 64) and (2, 128) give each warpgroup 64 heads; (2, 64) splits each tile's keys
#: between the two warpgroups of one 64-head block.
WG_LAYOUTS = ((1, 64), (2, 64), (2, 128))
#: The layout with a register-resident Q build (knob ``qreg``): one warpgroup, whose CTAs
#: then fit two per SM with a 3-stage ring.
WG_QREG_LAYOUT = (1, 64)
#: Register caps of the wgmma builds (knob ``minb``, ``__launch_bounds__`` min blocks): 1 lets
#: ptxas take what it needs; 3 caps a register-resident-Q warpgroup at 168 registers, so
#: three CTAs with 2-stage rings share an SM (prefill N 64: 1.04 vs 1.27 ms, H200).
WG_MINB = (1, 3)
#: Groups of heads sharing an index row above this take the warp-specialised build (knob
#: ``ws``) by default, and groups of exactly this many with many rows (prefill) or with the
#: cluster split merge (decode): H200, N 128 prefill 1.05 vs 1.67 ms, decode 31 vs 49 us;
#: N 64 prefill (one consumer warpgroup idle) 0.79 vs 0.87 ms; N 64 decode 30 vs 34.5 us
#: with the cluster merge (35 vs 35 us without), NOTES.md.
WS_MIN_GROUP = 64
#: Smallest group of heads sharing an index row that takes the wgmma path (a 64-row wgmma
#: tile with fewer heads wastes the rest of M; the mma.sync path tiles M by 16).
WG_MIN_GROUP = 32
#: Tensor-core per-tile pipelines (IS_PIPE): 1 the first one, 2 the leaner issue/score path
#: (same bits; see cuda/index_share_mma.cu). ``_DEFAULT_PIPE`` is what the planner takes.
MMA_PIPES = (1, 2)
_DEFAULT_PIPE = 2
#: The warp-specialised persistent wgmma build (cuda/index_share_ws.cu, knob ``ws``): ring
#: slots per head size (what 227 KiB of shared memory holds with 2048-column splits), and
#: the most splits per task its merge weights hold.
WS_SLOTS = {64: 4, 128: 2}
WS_MAX_SPLITS = 8
_WS_KT = 128  # keys per tile (and the column alignment of its splits)
#: Keys per tile of the ws build (knob ``kt``): 128 (the default), or 64 (at head size 128
#: twice the ring slots in the same bytes; at 64 the slots stay at four, half the bytes).
#: 64 was the N128 decode default until the producer's copy got lean (predicated copies):
#: since then 128 is faster there too (H200: 25.5-26.0 vs 25.7-26.1 us with the earlier
#: copy at 64; 26.3-26.9 at 64 with the new one; NOTES round 10).
WS_KTS = (64, 128)


def _ws_nst(hd: int, kt: int) -> int:
    """Ring slots of the ws build: WS_SLOTS' bytes at 128-key tiles, capped at 4 slots."""
    return min(4, WS_SLOTS[hd] * _WS_KT // kt)


def _aux_variant(dt: DataType) -> Variant:
    return Variant("index_share_aux.cu", _AUX_ENTRIES, {"IS_DTYPE": _DTYPE_CODE[dt]})


def _simt_variant(dt: DataType, vec: int, cpl: int, rb: int) -> Variant:
    return Variant("index_share_attn.cu", ("is_attn_simt",),
                   {"IS_DTYPE": _DTYPE_CODE[dt], "IS_VEC": vec, "IS_CPL": cpl, "IS_RB": rb})


def _mma_variant(dt: DataType, hd: int, wm: int, wn: int, pipe: int = 1) -> Variant:
    defines = {"IS_DTYPE": _DTYPE_CODE[dt], "IS_HD": hd, "IS_WM": wm, "IS_WN": wn}
    if pipe != 1:  # pipe 1 keeps its original defines (and compile-cache keys)
        defines["IS_PIPE"] = pipe
    return Variant("index_share_mma.cu", ("is_attn_mma",), defines)


def _wg_variant(dt: DataType, hd: int, wgs: int, mrows: int, overlap: int = 0,
                qreg: int = 0, minb: int = 1) -> Variant:
    defines = {"IS_DTYPE": _DTYPE_CODE[dt], "IS_HD": hd, "IS_WGS": wgs, "IS_MROWS": mrows}
    if overlap:
        defines["IS_OVERLAP"] = 1
    if qreg:
        defines["IS_QREG"] = 1
    if minb != 1:
        defines["IS_MINB"] = minb
    return Variant("index_share_wg.cu", ("is_attn_wg",), defines, min_arch=90, arch_suffix="a")


def _ws_variant(dt: DataType, hd: int, q2: int = 0, cluster: int = 0, kt: int = _WS_KT) -> Variant:
    """The ws build; ``cluster`` 2 (or 1): the two-CTA cluster merge, 4 or 8: the four- or
    eight-CTA one (IS_CMERGE; eight hand the partials over through distributed shared
    memory, IS_CMDS, four through L2)."""
    defines = {"IS_DTYPE": _DTYPE_CODE[dt], "IS_HD": hd, "IS_NST": _ws_nst(hd, kt)}
    if kt != _WS_KT:
        defines["IS_KT"] = kt
    if q2:
        defines["IS_Q2"] = 1
    if cluster in (4, 8):
        defines["IS_CMERGE"] = cluster
        if cluster == 8:
            # 0.1-1.2 us faster per call than through L2 at B 1-8 (0.4-1.9 in one graph),
            # 0.3-1.7 us slower with four CTAs (H200, NOTES IndexShare rounds 21-22).
            defines["IS_CMDS"] = 1
    elif cluster:
        defines["IS_CLUSTER"] = 1
    return Variant("index_share_ws.cu", ("is_attn_ws",), defines, min_arch=90, arch_suffix="a")


def compile_variants() -> list[Variant]:
    """Every (file, defines, entries) this module may launch (for ``nxrt warm`` and tests)."""
    out: list[Variant] = []
    for dt in FLOAT_TYPES:
        out.append(_aux_variant(dt))
        wide = 16 // dt.itemsize
        for rb in (1, 4):
            out += [_simt_variant(dt, wide, 1, rb), _simt_variant(dt, wide, 2, rb),
                    _simt_variant(dt, 1, 4, rb)]
    for dt in (DataType.FLOAT16, DataType.BFLOAT16):
        out += [_mma_variant(dt, hd, wm, wn, pipe) for hd in (64, 128)
                for wm, wn in MMA_LAYOUTS for pipe in MMA_PIPES]
        out += [_wg_variant(dt, hd, wgs, mrows, ov) for hd in (64, 128)
                for wgs, mrows in WG_LAYOUTS for ov in (0, 1)]
        out += [_wg_variant(dt, hd, *WG_QREG_LAYOUT, ov, 1) for hd in (64, 128) for ov in (0, 1)]
        out += [_wg_variant(dt, hd, *WG_QREG_LAYOUT, 0, 1, 3) for hd in (64, 128)]
        out += [_ws_variant(dt, hd, q2, cl) for hd in (64, 128) for q2, cl in ((0, 0), (1, 0), (0, 1))]
        out.append(_ws_variant(dt, 128, 0, 1, 64))  # the cluster build at knob kt 64 (WS_KTS)
        out += [_ws_variant(dt, hd, 0, c) for hd in (64, 128) for c in (4, 8)]  # IS_CMERGE
    return out


def _max_head_size(dt: DataType, head: int) -> int:
    wide = 16 // dt.itemsize
    return 64 * wide if head % wide == 0 else 128


# ---------------------------------------------------------------------------------------
# planning: one helper for workspace_requirement and execute
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Plan:
    path: str  # "simt" | "mma" | "wg"
    variant: Variant
    entry: str
    threads: int
    heads_per_cta: int
    hbk: int  # head blocks per kv head (shared index rows)
    units: int
    tasks: int  # (batch, query, head block) tasks; each has `splits` CTAs
    splits: int
    cps: int  # columns per split
    lpk: int  # lanes per key (simt)
    stages: int  # tensor-core ring depth (0 for simt)
    per_sm: int  # CTAs per SM the plan was sized for
    merge: str  # "none" (one split) | "last" (the task's last CTA) | "kernel" (is_combine)
    #             | "cluster" (ws, one item per CTA: two-CTA clusters through distributed
    #               shared memory, four-CTA ones through the partials in L2, eight-CTA
    #               ones through distributed shared memory again)
    smem: int
    grid: int
    part_o_off: int
    part_ml_off: int
    valid_off: int
    cnt_off: int  # split counters (workspace path; the pool path keeps them apart)
    nbytes: int

    @property
    def partials(self) -> bool:
        """Whether the splits write partials to the scratch (every merge but the two- and
        eight-CTA clusters')."""
        return _writes_partials(self.merge, self.variant)

    @property
    def knobs(self) -> dict[str, Any]:
        """The knobs that pin this plan (see ``PLAN_KNOBS``)."""
        d = self.variant.defines
        return {"splits": self.splits, "wm": d.get("IS_WM"), "wn": d.get("IS_WN"),
                "stages": self.stages, "merge": self.merge,
                "pipe": d.get("IS_PIPE", 1) if self.path == "mma" else None,
                "wgs": d.get("IS_WGS"), "mrows": d.get("IS_MROWS"),
                "overlap": d.get("IS_OVERLAP", 0) if self.path == "wg" else None,
                "qreg": d.get("IS_QREG", 0) if self.path == "wg" else None,
                "minb": d.get("IS_MINB", 1) if self.path == "wg" else None,
                "ws": int(self.entry == "is_attn_ws") if self.path == "wg" else None,
                "ctas": self.grid if self.entry == "is_attn_ws" else None,
                "q2": d.get("IS_Q2", 0) if self.entry == "is_attn_ws" else None,
                "kt": d.get("IS_KT", _WS_KT) if self.entry == "is_attn_ws" else None}


def _writes_partials(merge: str, variant: Variant) -> bool:
    """Whether a plan's splits write partials to the scratch: every merge but the cluster
    builds that hand them over through distributed shared memory (the two-CTA one, and the
    four/eight-CTA one built with IS_CMDS; none with one split)."""
    d = variant.defines
    return merge in ("last", "kernel") or (
        merge == "cluster" and "IS_CMERGE" in d and not d.get("IS_CMDS", 0))


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _mma_ok(g: Geometry) -> bool:
    return (g.dtype in (DataType.FLOAT16, DataType.BFLOAT16) and g.head_size in (64, 128)
            and g.index_heads == 1 and g.group >= 8)


def _wg_ok(g: Geometry) -> bool:
    return _mma_ok(g) and g.group >= WG_MIN_GROUP


def _wg_smem(hd: int, wgs: int, mrows: int, stages: int, cps: int, qreg: int = 0) -> int:
    """Dynamic shared memory of is_attn_wg (mirrors the kernel's layout)."""
    kt = 64 * (wgs // (mrows // 64))  # keys per tile
    hb = hd // 64
    q = 0 if qreg else hb * mrows * 128
    return 1024 + q + stages * 2 * hb * kt * 128 + cps * 4


def _ws_smem(hd: int, cps: int, q2: int = 0, cluster: int = 0, kt: int = _WS_KT) -> int:
    """Dynamic shared memory of is_attn_ws (mirrors the kernel's layout).

    ``q2``: two Q slots, no split-merge weights, int32 index slots. ``cluster``: no
    split-merge weights; the cluster merge's inbox (the partner's half of O and its row
    statistics) after the index slots, 128-byte aligned.
    """
    hb = hd // 64
    q = (2 if q2 else 1) * hb * 128 * 128
    ring = 2 * _ws_nst(hd, kt) * hb * kt * 128
    weights = 0 if q2 or cluster else 128 * (WS_MAX_SPLITS + 1) * 4
    fixed = q + ring + 256 + weights + 2 * cps * 4 + 2 * (16 + (4 if q2 else 8) * cps)
    if cluster:
        fixed = _round_up(fixed, 128) + (4 * hb + 1) * 256 * 16
    return 1024 + fixed


def _mma_smem(wm: int, wn: int, stages: int, hd: int, cps: int) -> int:
    """Dynamic shared memory of is_attn_mma (mirrors the kernel's layout)."""
    lds = hd + 8
    q = 16 * wm * lds * 2
    ring = stages * 2 * _KT * lds * 2
    merge = wm * (wn - 1) * (hd // 2 + 4) * 32 * 4 if wn > 1 else 0
    return q + max(ring, merge) + cps * 4


def _default_layout(group: int) -> tuple[int, int]:
    """Warps along heads x along keys: enough 16-head MMA rows for the group, 8 warps."""
    if group <= 16:
        return 1, 4
    if group <= 64:
        return 4, 2
    return 8, 1


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
    """Columns per split of a ws plan asked for ``s`` splits (``_plan``'s rounding to whole
    128-key tiles, at most 2048), or 0 where that rounding gives another split count."""
    cps = min(_round_up(-(-width // s), _WS_KT), 2048)
    return cps if -(-width // cps) == s else 0


def _ws_decode_split(tasks: int, width: int, sm_count: int,
                     cap: int | None = None) -> tuple[int, str] | None:
    """(splits, merge) of a warp-specialised decode plan with one item per CTA, or None.

    Measured on the H200 (NOTES, IndexShare round 20; top-k 2048, 64 and 128 heads, B 1-64):
    a split's cost is its rows (a CTA gathers at a fixed rate whatever the load) plus its
    merge, and the last-arrival merge reads every partial on one SM (8 x 64 KB at 128
    heads: ~15 us). So, the first that applies: up to half the SMs busy, up to eight splits
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
#: partials and its share of the split merge (H200 fit, NOTES IndexShare round 21: at 128
#: heads on 33 CTAs, two split items of 8 tiles per CTA took 54.2 us where one item of 16
#: tiles took 37.6).
_WS_SPLIT_ITEM_TILES = 8


def _ws_persistent_splits(tasks: int, width: int, slots: int) -> int:
    """Split count of a warp-specialised decode plan with more items than one per CTA.

    The persistent grid of ``slots`` CTAs takes items c, c + slots, ... in turn, and a CTA
    gathers at a fixed rate whatever the load (NOTES, IndexShare rounds 13 and 20), so a
    launch lasts as long as its busiest CTA: ceil(tasks x s / slots) items of (tiles per
    split + ``_WS_SPLIT_ITEM_TILES`` if s > 1) tiles each. The least such cost over the
    split counts the 128-key column split gives exactly (from the fewest that fit in
    2048-column splits to ``WS_MAX_SPLITS``), fewer splits on a tie. Measured on the H200
    (round 21): one split at top-k 1024 and 2048 (B 67-264; two splits took 1.1-1.9x as
    long), three at top-k 4096 and B 67, two at B 96 and 160.
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


def _plan(g: Geometry, sm_count: int, aligned16: bool, path: str | None,
          capacity_scratch: bool, smem_max: int = 227 * 1024, smem_sm: int = 228 * 1024,
          knobs: dict[str, Any] | None = None, wg_arch: bool = False) -> _Plan:
    """Path, tiling, split-K and scratch layout.

    Raises
    ------
    KernelError
        H cannot be served, the tensor-core path was forced where it does not apply, or
        ``knobs`` ask for an impossible plan.
    """
    for name, value in (("num_heads", g.heads), ("S_q", g.q_len), ("S_cur", g.cur_len),
                        ("S_past", g.past_len), ("K", g.width), ("head size", g.head_size)):
        if value > 2**31 - 1:  # the kernels take these as 32-bit ints
            raise KernelError(f"{OP}: {name}={value} must be < 2**31")
    if g.mode == "capacity" and g.batch > 65535:  # the frontier kernel's grid.y
        raise KernelError(f"{OP}: fixed-capacity mode supports batch <= 65535, got {g.batch}")
    knobs = dict(knobs or {})
    bad = set(knobs) - set(PLAN_KNOBS)
    if bad:
        raise KernelError(f"{OP}: unknown plan knobs {sorted(bad)}; known: {PLAN_KNOBS}")
    h, dt = g.head_size, g.dtype
    use_wg = path == "wg" or (path is None and wg_arch and aligned16 and _wg_ok(g))
    if use_wg and not (wg_arch and aligned16 and _wg_ok(g)):
        raise KernelError(f"{OP}: the wgmma path needs an sm_90 device, f16/bf16, H in (64, 128), "
                          f"one shared index head, >= {WG_MIN_GROUP} heads per kv head and "
                          "16-byte aligned tensors")
    use_mma = not use_wg and (path == "mma" or (path is None and aligned16 and _mma_ok(g)))
    if use_mma and not (aligned16 and _mma_ok(g)):
        raise KernelError(f"{OP}: the tensor-core path needs f16/bf16, H in (64, 128), one "
                          "shared index head, >= 8 heads per kv head and 16-byte aligned tensors")
    if not use_wg and str(knobs.get("ws", 0)) not in ("0", "None"):
        # (A pinned ws build must not quietly become another plan, e.g. for outputs that
        # do not depend on the batch size: README, Guarantees.)
        raise KernelError(f"{OP}: ws={knobs['ws']} asks for the warp-specialised build, which "
                          "is on the wgmma path only (sm_90, f16/bf16, H in (64, 128), one "
                          f"shared index head, >= {WG_MIN_GROUP} heads per kv head, 16-byte "
                          f"aligned tensors); this call takes the "
                          f"{'tensor-core' if use_mma else 'CUDA-core'} path")
    shared = g.index_heads == 1
    stages, per_sm, ws = 0, 1, 0
    many = g.batch * g.q_len * g.kv_heads >= 4 * sm_count  # prefill-like: rows fill the GPU
    if use_wg:
        # Knobs of the barrier-coupled build pin it; its split merge holds 8 partials of
        # at most 2048 columns.
        other = sorted({"wgs", "mrows", "overlap", "qreg", "minb", "stages"} & set(knobs))
        fits = -(-g.width // 2048) <= WS_MAX_SPLITS
        # From 64 heads per index row, in every row count: at 64 heads in decode rows past
        # one wave of two-CTA clusters the ws build with one split took 0.70-0.91x the time
        # of the barrier-coupled key split (H200, B 67-264, NOTES IndexShare round 21).
        wide = g.group >= WS_MIN_GROUP
        ws = int(knobs.get("ws", 1 if wide and fits and not other else 0))
        if ws not in (0, 1):
            raise KernelError(f"{OP}: ws={ws} must be 0 or 1")
        if ws and other:
            raise KernelError(f"{OP}: ws=1 (the warp-specialised build) takes only the knobs "
                              f"splits, merge, ctas, q2 and kt; got {other}")
    for only_ws in ("ctas", "q2", "kt"):
        if only_ws in knobs and not ws:
            raise KernelError(f"{OP}: {only_ws} applies to the warp-specialised build (ws=1) only")
    if use_wg and ws:
        # Warp-specialised and persistent (cuda/index_share_ws.cu): 128 heads per item,
        # 128-key tiles (or 64, knob kt), one CTA per SM looping over the (task, split) items.
        col_align, max_cps = _WS_KT, 2048
        hpc, threads, lpk = 128, 384, 0
        kt = int(knobs.get("kt", _WS_KT))
        if kt not in WS_KTS:
            raise KernelError(f"{OP}: kt={kt} must be one of {WS_KTS}")
        variant, entry = _ws_variant(dt, h), "is_attn_ws"  # (q2 is chosen with the splits)
        stages = _ws_nst(h, kt)
    elif use_wg:
        # Layout and loop (H200 sweeps, benchmarks/NOTES.md). Decode (few rows): groups above
        # 64 heads take one 128-head CTA (two warpgroups), 64-head blocks two warpgroups
        # splitting each tile's keys (one CTA per SM with the deepest ring). Prefill (many
        # rows): one-warpgroup 64-head CTAs, three per SM (below), at every group size (N 128
        # as two head blocks per row: 1.97 vs 2.13 ms for one 128-head CTA).
        mrows = int(knobs.get("mrows", 128 if g.group > 64 and not many else 64))
        wgs = int(knobs.get("wgs", 1 if (many and mrows == 64) else 2))
        if (wgs, mrows) not in WG_LAYOUTS:
            raise KernelError(f"{OP}: wgmma layout (wgs={wgs}, mrows={mrows}) has no build; "
                              f"choose one of {WG_LAYOUTS}")
        col_align, max_cps = 64 * (wgs // (mrows // 64)), 2048
        cps_hi = min(max_cps, _round_up(g.width, col_align))
        # Many rows with one warpgroup: Q in registers, a 2-stage ring and registers capped at
        # 168, so three CTAs share an SM (each one's softmax and waits under the others'
        # wgmma): 1.04 ms at prefill N 64, against 1.27 for two CTAs with 3 stages and the
        # overlapped loop (H200, benchmarks/NOTES.md). Decode keeps the plain loop (Q in
        # registers and the overlapped loop were both slower there).
        one_wg_many = many and (wgs, mrows) == WG_QREG_LAYOUT
        qreg = int(knobs.get("qreg", 1 if one_wg_many else 0))
        if qreg not in (0, 1) or (qreg and (wgs, mrows) != WG_QREG_LAYOUT):
            raise KernelError(f"{OP}: qreg={qreg} must be 0, or 1 with the layout "
                              f"(wgs, mrows) = {WG_QREG_LAYOUT}")
        three = (one_wg_many and qreg == 1 and int(knobs.get("overlap", 0)) == 0
                 and int(knobs.get("stages", 2)) == 2)
        minb = int(knobs.get("minb", 3 if three else 1))
        if minb not in WG_MINB or (minb > 1 and (wgs, qreg) != (1, 1)):
            raise KernelError(f"{OP}: minb={minb} must be one of {WG_MINB} (3 only with one "
                              "warpgroup and qreg=1: two warpgroups cannot fit 168 registers)")
        overlap = int(knobs.get("overlap", 1 if (many and mrows == 128)
                                or (one_wg_many and minb == 1) else 0))
        if overlap not in (0, 1):
            raise KernelError(f"{OP}: overlap={overlap} must be 0 or 1")
        hpc, threads, lpk = mrows, 128 * wgs, 0
        variant, entry = _wg_variant(dt, h, wgs, mrows, overlap, qreg, minb), "is_attn_wg"
        min_st = 3 if overlap else 2  # the overlapped loop waits one tile further ahead
        # One warpgroup: two CTAs per SM where two fit (one's softmax overlaps the other's
        # wgmma), three with the 168-register build; two warpgroups: one CTA with the
        # deepest ring.
        per_sm = minb if minb > 1 else (2 if wgs == 1 else 1)
        while True:
            budget = min(smem_max, smem_sm // per_sm - 1024)
            if "stages" in knobs:
                stages = int(knobs["stages"])
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
    elif use_mma:
        col_align, max_cps = _KT, 2048
        cps_hi = min(max_cps, _round_up(g.width, col_align))
        if "wm" in knobs or "wn" in knobs:
            wm, wn = _default_layout(g.group)
            wm, wn = int(knobs.get("wm", wm)), int(knobs.get("wn", wn))
            if (wm, wn) not in MMA_LAYOUTS:
                raise KernelError(f"{OP}: tensor-core layout (wm={wm}, wn={wn}) has no build; "
                                  f"choose one of {MMA_LAYOUTS}")
        else:  # the group's layout, or a smaller one where shared memory is short
            first = _default_layout(g.group)
            if first == (4, 2) and g.batch * g.q_len >= 4 * sm_count:
                # Many independent rows (prefill): two 4-warp CTAs per SM with a 2-deep ring
                # beat one 8-warp CTA with a deep ring (H200 sweep, N64 prefill at 8k/64k:
                # 2.21 vs 2.65 ms, 2.11 vs 2.54 ms); decode keeps (4, 2) (0.049 vs 0.052 ms).
                first = (4, 1)
            order = [first, (4, 2), (4, 1), (1, 4)]
            wm, wn = next((c for c in order if _mma_smem(*c, 2, h, cps_hi) <= smem_max),
                          order[0])
        hpc, threads = 16 * wm, 32 * wm * wn
        pipe = int(knobs.get("pipe", _DEFAULT_PIPE))
        if pipe not in MMA_PIPES:
            raise KernelError(f"{OP}: pipe={pipe} must be one of {MMA_PIPES}")
        variant, entry, lpk = _mma_variant(dt, h, wm, wn, pipe), "is_attn_mma", 0
        # Eight warps per SM (the registers allow no more): one 8-warp CTA with the deepest
        # ring that fits, or two 4-warp CTAs sharing the SM's shared memory.
        per_sm = 2 if threads == 128 else 1
        while True:
            budget = min(smem_max, smem_sm // per_sm - 1024)
            if "stages" in knobs:
                stages = int(knobs["stages"])
                if not 2 <= stages <= 8:
                    raise KernelError(f"{OP}: stages={stages} must be in [2, 8]")
            else:
                stages = _MAX_STAGES
                while stages > 2 and _mma_smem(wm, wn, stages, h, cps_hi) > budget:
                    stages -= 1
            if per_sm == 1 or _mma_smem(wm, wn, stages, h, cps_hi) <= budget:
                break
            per_sm = 1
    else:
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
        hpc = 4 if (shared and g.group >= 2) else 1
        variant, entry, threads = _simt_variant(dt, vec, cpl, hpc), "is_attn_simt", _SIMT_THREADS
        col_align, max_cps, per_sm = 32, 4096, 4
    hbk = -(-g.group // hpc) if shared else 1
    units = g.kv_heads * hbk if shared else g.heads
    tasks = g.batch * g.q_len * units
    cap = int(knobs.get("ctas", sm_count)) if ws else sm_count
    if cap < 1:
        raise KernelError(f"{OP}: ctas={cap} must be >= 1")
    # A warp-specialised decode plan (measured rule; the ctas knob caps the CTAs it may use).
    dec = _ws_decode_split(tasks, g.width, sm_count, cap) if ws and not many else None
    if "splits" in knobs:
        # The tensor-core finish keeps nh x (splits + 1) weights in the ring: at most 32.
        splits = max(1, min(int(knobs["splits"]), -(-g.width // col_align),
                            WS_MAX_SPLITS if ws else 32 if (use_mma or use_wg) else 1 << 30))
    elif ws and not many and dec is not None:
        splits = dec[0]
    elif ws and not many:
        splits = _ws_persistent_splits(tasks, g.width, min(sm_count, cap))
    elif use_mma or use_wg:
        splits = _choose_splits(tasks, g.width, col_align, max_cps, max(1, sm_count * per_sm))
        if ws:
            splits = min(splits, WS_MAX_SPLITS)
    else:
        target = sm_count * per_sm
        want = 1 if tasks >= target else -(-target // max(tasks, 1))
        splits = max(min(want, -(-g.width // 256)), -(-g.width // max_cps), 1)
    cps = min(_round_up(-(-g.width // splits), col_align), max_cps)
    splits = -(-g.width // cps)
    if ws and splits > WS_MAX_SPLITS:
        raise KernelError(f"{OP}: ws=1 merges at most {WS_MAX_SPLITS} splits per row; "
                          f"K={g.width} needs {splits} (use ws=0)")
    if ws:
        # Two Q slots (the next item's Q streams in under this one's last tiles) where the
        # shared memory has room for them: one split (no merge weights) and int32 indices.
        q2_smem = _ws_smem(h, cps, 1, 0, kt)
        q2_ok = splits == 1 and g.index_dtype == DataType.INT32 and q2_smem <= smem_max
        q2 = int(knobs.get("q2", 1 if q2_ok else 0))
        if q2 not in (0, 1) or (q2 and not q2_ok):
            raise KernelError(f"{OP}: q2={q2} must be 0, or 1 with one split, int32 indices and "
                              f"{q2_smem} bytes of shared memory")
        variant = _ws_variant(dt, h, q2, 0, kt)
        smem = _ws_smem(h, cps, q2, 0, kt)
        if smem > smem_max:
            raise KernelError(f"{OP}: the warp-specialised plan needs {smem} bytes of shared "
                              f"memory ({cps} columns per split); the device allows {smem_max}")
    elif use_wg:
        smem = _wg_smem(h, wgs, mrows, stages, cps, qreg)
        if smem > smem_max:
            raise KernelError(f"{OP}: the wgmma plan needs {smem} bytes of shared memory "
                              f"(wgs={wgs}, mrows={mrows}, stages={stages}, {cps} columns per "
                              f"split); the device allows {smem_max}")
    elif use_mma:
        smem = _mma_smem(wm, wn, stages, h, cps)
        if smem > smem_max:
            raise KernelError(f"{OP}: the tensor-core plan needs {smem} bytes of shared memory "
                              f"(wm={wm}, wn={wn}, stages={stages}, {cps} columns per split); "
                              f"the device allows {smem_max}. Use fewer heads per kv head or "
                              "the CUDA-core path (path_override='simt')")
    else:
        smem = _round_up(cps, 4) * 4 + (4 * hpc * h + 8 * hpc) * 4
    merge = "none"
    if splits > 1:
        # ws with two splits and one item per CTA (decode): the two CTAs of a task form a
        # cluster and merge through distributed shared memory (no partials, no counter).
        # Hopper SMs come in pairs (TPCs), so up to sm_count CTAs of two-CTA clusters are
        # resident at once; a larger grid would still be correct, in more than one wave.
        # Four or eight splits of one item per CTA (decode at small batches, _ws_decode_split):
        # the task's CTAs form a cluster and merge their partials (IS_CMERGE; eight through
        # distributed shared memory, no partials in global memory; four through L2). Up
        # to half the SMs: GPCs hold whole clusters, and on the H200 sixteen clusters of
        # eight did not all fit at once (B 16: 33 us against 24 with is_combine, round 20).
        ckt = kt if ws else _WS_KT  # (only ws plans define kt; the message below names bytes)
        items = tasks * splits
        cluster_ok = bool(ws and items <= min(sm_count, cap) and (
            (splits == 2 and _ws_smem(h, cps, 0, 1, ckt) <= smem_max)
            or (splits in (4, 8) and items <= sm_count // 2 and ckt == _WS_KT)))
        # ws decode with more than two splits of at most half the SMs' tasks: is_combine
        # spreads the merge over the GPU, where each last-arrival merge reads every partial
        # of its task on one SM while most SMs idle (_ws_decode_split, round 20: 8 x 64 KB,
        # ~15 us). From more tasks on, the last-arrival merges spread over the grid and were
        # the faster (round 21: 0.90-0.97x at top-k 4096, B 67-160, three splits); prefill
        # rows, many and not measured that way, keep them too.
        merge = str(knobs.get("merge", "cluster" if cluster_ok else
                              "kernel" if ws and splits > 2 and not many
                              and tasks <= sm_count // 2 else "last"))
        if merge not in ("last", "kernel", "cluster"):
            raise KernelError(f"{OP}: merge={merge!r} must be 'last', 'kernel' or 'cluster'")
        if merge == "cluster" and not cluster_ok:
            raise KernelError(f"{OP}: merge='cluster' needs the warp-specialised build (ws=1), "
                              f"two splits (one work item per CTA, at most {min(sm_count, cap)}, "
                              f"and {_ws_smem(h, cps, 0, 1, ckt)} bytes of shared memory) or "
                              f"four or eight (128-key tiles, one work item per CTA, at most "
                              f"{min(sm_count // 2, cap)}); this plan has ws={ws}, {splits} "
                              f"splits, {items} items, a device limit of {smem_max}")
        if merge == "cluster" and splits in (4, 8):  # (the ws smem of its split plan, above)
            variant = _ws_variant(dt, h, 0, splits, kt)
        elif merge == "cluster":  # (ws: kt and its stages as chosen above)
            variant = _ws_variant(dt, h, 0, 1, kt)
            smem = _ws_smem(h, cps, 0, 1, kt)
    grid = tasks * splits
    if ws:  # persistent: at most one CTA per SM (or the ctas knob), each looping over items
        grid = max(1, min(grid, sm_count, cap))
    # (ws: the persistent kernel's item arithmetic adds up to a grid of SMs in int32.)
    if tasks * splits > 2**31 - 1 - (sm_count if ws else 0):
        raise KernelError(f"{OP}: {tasks * splits} work items exceed the grid limit; use fewer "
                          "(batch, query) rows per call")
    rows = g.batch * g.q_len * g.heads
    parts = _writes_partials(merge, variant)
    po = rows * splits * h * 4 if parts else 0
    pm = rows * splits * 2 * 4 if parts else 0
    vb = g.batch * 4 if capacity_scratch else 0
    cb = tasks * 4 if merge == "last" else 0
    part_ml_off = _round_up(po, _ALIGN)
    valid_off = _round_up(part_ml_off + pm, _ALIGN)
    cnt_off = _round_up(valid_off + vb, _ALIGN)
    nbytes = cnt_off + cb if (po or vb or cb) else 0
    return _Plan("wg" if use_wg else "mma" if use_mma else "simt", variant, entry, threads, hpc,
                 hbk, units, tasks, splits, cps, lpk, stages, per_sm, merge, smem, grid, 0,
                 part_ml_off, valid_off, cnt_off, nbytes)


# ---------------------------------------------------------------------------------------
# factory and kernel
# ---------------------------------------------------------------------------------------

def _is_present(t: Any) -> bool:
    return t is not None and not getattr(t, "absent", False)


class IndexShareFactory:
    """Claims ``pkg.nxrt::IndexShare`` and creates :class:`IndexShareKernel` s.

    Parameters
    ----------
    rt
        The runtime kernels are bound to (``None`` is enough for ``unsupported_reason``).
    """

    def __init__(self, rt: Any = None) -> None:
        self.rt = rt

    def unsupported_reason(self, node: Node, shapes: Sequence[Sequence[int] | None],
                           dtypes: Sequence[DataType | None]) -> str | None:
        """Pure, no GPU: ``None`` when this kernel takes the node, else why not."""
        if (node.domain, node.op_type) != ("pkg.nxrt", "IndexShare"):
            return f"{OP}: not this op ({node.domain}::{node.op_type})"
        try:
            attrs = parse_attributes(node)
        except KernelError as exc:
            return str(exc)
        n_in = len(node.inputs) if node.inputs else len(dtypes)
        if not 6 <= n_in <= 7:
            return f"{OP}: expects 6 or 7 inputs, the node has {n_in}"
        if node.inputs:
            for i in (0, 1, 2, 5):
                if not node.input_present(i):
                    return (f"{OP}: required input {i} ({INPUT_NAMES[i]}) is absent in the "
                            "node")
        n_out = sum(node.output_present(i) for i in range(len(node.outputs)))
        if node.outputs and not node.output_present(0):
            return f"{OP}: output 0 (Y) is required"
        if n_out not in (0, 1, 3):
            return f"{OP}: expects 1 output or 3 (Y, present_key, present_value), got {n_out}"
        dt = [None if i >= len(dtypes) or dtypes[i] is None else DataType(dtypes[i])
              for i in range(7)]
        if dt[0] not in FLOAT_TYPES:
            return f"{OP}: query dtype {getattr(dt[0], 'name', dt[0])} unsupported (FLOAT, FLOAT16, BFLOAT16)"
        if dt[5] is not None and dt[5] not in INDEX_TYPES:
            return f"{OP}: selected_indices dtype {dt[5].name} unsupported (INT32, INT64)"
        if shapes and all(shapes[i] is not None for i in (0, 1, 2, 5) if i < len(shapes)):
            errors = []
            modes = ["none"] + (["capacity"] if len(shapes) > 3 and shapes[3] is not None else [])
            for mode in modes:
                try:
                    g = resolve_geometry(attrs, list(shapes)[:7], dt[:len(shapes)], mode)
                except KernelError as exc:
                    errors.append(str(exc))
                    continue
                if g.head_size > _max_head_size(g.dtype, g.head_size):
                    return (f"{OP}: head size {g.head_size} unsupported for {g.dtype.name} "
                            f"(at most {_max_head_size(g.dtype, g.head_size)})")
                return None
            return errors[0]
        return None

    def create(self, node: Node, input_shapes: Sequence[Sequence[int] | None] = ()) -> IndexShareKernel:
        """A kernel for ``node``.

        Raises
        ------
        KernelError
            The attributes are refused.
        ValueError
            The factory has no runtime.
        """
        if self.rt is None:
            raise ValueError("IndexShareFactory.create needs a runtime: IndexShareFactory(rt)")
        return IndexShareKernel(self.rt, node, parse_attributes(node))


def _gcd_width(*values: int) -> int:
    for w in (16, 8, 4, 2):
        if all(v % w == 0 for v in values):
            return w
    return 1


class IndexShareKernel:
    """One IndexShare node bound to a runtime (see the module docstring).

    ``path_override`` (None, "simt", "mma" or "wg") pins the attention path, and
    ``plan_override`` (a dict of ``PLAN_KNOBS``: splits, wm, wn, stages, merge, pipe, wgs,
    mrows, overlap, qreg, minb) pins parts
    of the plan; tests, benchmarks and sweeps use them, the defaults pick the plan the
    planner predicts fastest. ``last_plan`` is the plan of the latest ``execute``.
    """

    def __init__(self, rt: Any, node: Node, attrs: Attributes) -> None:
        self.rt = rt
        self.node = node
        self.attrs = attrs
        self.path_override: str | None = None
        self.plan_override: dict[str, Any] | None = None
        self._pool = ScratchPool(rt, OP)
        self._counters = ScratchPool(rt, OP, zeroed=True)
        self._fns: dict[tuple, Any] = {}
        self._warm = False
        self.last_plan: _Plan | None = None

    # -- protocol ----------------------------------------------------------------------
    def supports_strided_input(self, index: int) -> bool:
        """Every input must be contiguous."""
        return False

    def capture_support(self) -> CaptureSupport:
        """Supported once an eager ``execute`` has compiled the kernels and sized scratch."""
        if self._warm:
            return CaptureSupport.yes()
        return CaptureSupport.no(
            f"{OP}: not warmed up; run one eager execute with the capture's shapes first (it "
            "compiles the kernels and sizes the pooled scratch)")

    def workspace_requirement(self, inputs: Sequence[TensorMetadata]) -> WorkspaceRequirement:
        """Exact scratch bytes for these inputs (pure: allocates nothing).

        Raises
        ------
        KernelError
            The inputs are refused.
        """
        shapes = [m.shape if _is_present(m) else None for m in inputs]
        dtypes = [m.dtype if _is_present(m) else None for m in inputs]
        has_past = len(shapes) > 3 and shapes[3] is not None
        wants_present = sum(self.node.output_present(i) for i in range(len(self.node.outputs))) == 3
        cap = has_past and wants_present
        geoms, err = [], None
        for mode in ("none", "capacity") if cap else ("none",):
            try:  # the outputs (unknown here) pick the mode; plan for every one that fits
                geoms.append(resolve_geometry(self.attrs, shapes, dtypes, mode))
            except KernelError as exc:
                err = err or exc
        if not geoms:
            raise err  # type: ignore[misc]
        need = 0
        for g in geoms:
            # The scratch layout does not depend on the chunk width, and aligned tensors
            # admit the widest heads (unaligned ones that cannot run are refused by execute).
            need = max(need, self._make_plan(g, True, "simt", cap).nbytes)
            if self.path_override != "simt" and _mma_ok(g):
                need = max(need, self._make_plan(g, True, "mma", cap).nbytes)
            if self.path_override in (None, "wg") and _wg_ok(g) and self._wg_arch():
                need = max(need, self._make_plan(g, True, "wg", cap).nbytes)
        return WorkspaceRequirement(need, _ALIGN) if need else WorkspaceRequirement.NONE

    def close(self) -> None:
        """Free the pooled scratch (the kernel stays usable; the next eager call regrows it)."""
        self._pool.release()
        self._counters.release()
        self._warm = False

    def __del__(self) -> None:
        try:
            self._pool.release()
            self._counters.release()
        except Exception as exc:  # never raise from a finaliser
            warnings.warn(f"{OP}: scratch not freed: {exc}", ResourceWarning, stacklevel=1)

    # -- helpers -----------------------------------------------------------------------
    def _make_plan(self, g: Geometry, aligned16: bool, path: str | None, cap: bool) -> _Plan:
        caps = self.rt.capabilities
        smem_max = int(getattr(caps, "max_shared_per_block_optin", 227 * 1024))
        smem_sm = int(getattr(caps, "max_shared_per_sm", 0) or smem_max + 1024)
        # The CUDA-core path reads only the splits and merge knobs.
        return _plan(g, caps.sm_count, aligned16, path, cap, smem_max, smem_sm,
                     self.plan_override, wg_arch=self._wg_arch())

    def _wg_arch(self) -> bool:
        """The device runs sm_90a code (wgmma) and NXRT_INDEX_SHARE_WG is not 0."""
        if os.environ.get("NXRT_INDEX_SHARE_WG", "1") == "0":
            return False
        return str(getattr(self.rt.capabilities, "arch", "")) == "sm_90"

    def _fn(self, variant: Variant, entry: str, capturing: bool) -> Any:
        key = (variant.file, variant.options, entry)
        fn = self._fns.get(key)
        if fn is None:
            if capturing:
                raise CaptureError(
                    f"{OP}: kernel {entry} ({variant.module} {dict(variant.defines)}) was not "
                    "loaded by a warm-up; run one eager execute with the capture's shapes, "
                    "dtypes and present mode before begin_capture()")
            fn = _common.get_function(self.rt, variant, entry)
            self._fns[key] = fn
        return fn

    def _mode(self, ins: list, outs: list) -> str:
        if len(outs) not in (1, 3) or not _is_present(outs[0]):
            raise KernelError(f"{OP}: expects outputs [Y] or [Y, present_key, present_value], "
                              f"got {len(outs)}")
        if len(outs) == 1 or (not _is_present(outs[1]) and not _is_present(outs[2])):
            return "none"
        if not (_is_present(outs[1]) and _is_present(outs[2])):
            raise KernelError(f"{OP}: present_key and present_value must be given together")
        if not _is_present(ins[1]) or len(ins[1].shape) != 4:
            return "none"  # resolve_geometry names the bad key
        k = ins[1].shape
        past = ins[3].shape[2] if _is_present(ins[3]) and len(ins[3].shape) == 4 else 0
        concat = (k[0], k[1], past + k[2], k[3])
        ps = tuple(outs[1].shape)
        if ps == concat and tuple(outs[2].shape) == concat:
            return "concat"
        if _is_present(ins[3]) and ps == tuple(ins[3].shape) and tuple(outs[2].shape) == ps:
            return "capacity"
        raise KernelError(f"{OP}: present_key {ps} / present_value {tuple(outs[2].shape)} must "
                          f"both be {list(concat)} (growing) or the past shape (fixed capacity)")

    # -- execute -----------------------------------------------------------------------
    def execute(self, inputs: Sequence[TensorView], outputs: Sequence[TensorMut],
                workspace: WorkspaceView | None = None) -> None:
        """Validate, then enqueue IndexShare on ``rt.stream``.

        Raises
        ------
        KernelError
            A shape, dtype, stride, aliasing or attribute rule is broken, or (eagerly) a
            ``selected_indices`` row breaks the index rules (:class:`SelectedIndicesError`).
        CaptureError
            Capturing before a warm-up: a kernel was never loaded or the scratch pool would
            have to grow.
        WorkspaceError
            ``workspace`` is short or misaligned.
        """
        rt = self.rt
        ins = list(inputs) + [None] * (7 - len(inputs))
        if len(inputs) > 7:
            raise KernelError(f"{OP}: expects at most 7 inputs, got {len(inputs)}")
        outs = list(outputs)
        mode = self._mode(ins, outs)
        present = [_is_present(t) for t in ins]
        g = resolve_geometry(self.attrs, [t.shape if p else None for t, p in zip(ins, present)],
                             [t.dtype if p else None for t, p in zip(ins, present)], mode)
        q, k, v, pk, pv, idx, bias = (t if p else None for t, p in zip(ins, present))
        y, prk, prv = (outs + [None, None])[:3] if mode != "none" else (outs[0], None, None)
        self._check_outputs(g, q, y, prk, prv)
        for i, t in enumerate((q, k, v, pk, pv, idx, bias)):
            if t is not None and not t.is_contiguous:
                raise KernelError(f"{OP}: input {i} must be contiguous (strides {t.strides} for "
                                  f"shape {t.shape}); supports_strided_input() is False")
        self._check_aliasing(g, [t for t in (q, k, v, pk, pv, idx, bias) if t is not None],
                             y, prk, prv, pk, pv)
        ptrs = [t.ptr for t in (q, k, v, pk, pv, y) if t is not None]
        aligned16 = all(p % 16 == 0 for p in ptrs)
        if self.path_override not in (None, "simt", "mma", "wg"):
            raise ValueError("path_override must be None, 'simt', 'mma' or 'wg', got "
                             f"{self.path_override!r}")
        plan = self._make_plan(g, aligned16, self.path_override, g.mode == "capacity")
        self.last_plan = plan
        capturing = rt.is_capturing()
        aux = _aux_variant(g.dtype)
        fn_attn = self._fn(plan.variant, plan.entry, capturing)
        fn_comb = self._fn(aux, "is_combine", capturing) if plan.merge == "kernel" else None
        if g.batch == 0:
            return
        # Scratch: the caller's workspace, else the pools (stable addresses, grown eagerly).
        # Split counters must be zero before the launch: the pool's are (zeroed when
        # allocated, left at zero by every launch); a workspace's are cleared each call.
        counters = 0
        if workspace is not None:
            _common.check_workspace(OP, WorkspaceRequirement(plan.nbytes, _ALIGN), workspace)
            base = workspace.ptr
            if plan.merge == "last" and g.q_len:
                counters = base + plan.cnt_off
                rt.memset(counters, 0, plan.tasks * 4)
        else:
            base = self._pool.ensure(plan.nbytes, capturing)
            if plan.merge == "last" and g.q_len:
                counters = self._counters.ensure(plan.tasks * 4, capturing)
        valid_ptr = base + plan.valid_off if g.mode == "capacity" else 0
        it = g.dtype.itemsize
        i32, i64 = np.int32, np.int64

        if g.mode == "capacity":
            self._frontier(g, bias, valid_ptr, capturing)
        rows = g.batch * g.index_heads * g.q_len
        if not capturing and rows:
            bounds: Any = g.cache_len
            if g.mode == "capacity":
                bounds = rt.dtoh(np.empty(g.batch, dtype=np.int32), valid_ptr)
            host = rt.dtoh(np.empty(idx.shape, dtype=g.index_dtype.numpy), idx.ptr)
            check_selected_indices(host, bounds)
        # While capturing, the attention kernel checks the rows as it stages them (latch).
        latch = rt.capture_error_ptr() if capturing else 0

        # Present K/V.
        if g.mode == "concat":
            row = g.head_size * it
            for src_past, src_cur, dst in ((pk, k, prk), (pv, v, prv)):
                if g.past_len:
                    self._copy(g, dst.ptr, src_past.ptr, g.past_len * row, g.total_len * row,
                               capturing)
                self._copy(g, dst.ptr + g.past_len * row, src_cur.ptr, g.cur_len * row,
                           g.total_len * row, capturing)
        elif g.mode == "capacity":
            for src_past, src_cur, dst in ((pk, k, prk), (pv, v, prv)):
                if dst.ptr != src_past.ptr:
                    rt.dtod(dst.ptr, src_past.ptr, dst.nbytes)
                self._scatter(g, dst.ptr, src_cur.ptr, valid_ptr, capturing)

        if g.q_len == 0:
            self._warm = self._warm or not capturing
            return
        # Attention.
        if g.mode == "capacity":
            k0, v0, k1, v1, len0, len1 = prk.ptr, prv.ptr, prk.ptr, prv.ptr, g.cache_len, 0
        elif pk is not None:
            k0, v0, k1, v1, len0, len1 = pk.ptr, pv.ptr, k.ptr, v.ptr, g.past_len, g.cur_len
        else:
            k0, v0, k1, v1, len0, len1 = k.ptr, v.ptr, k.ptr, v.ptr, 0, g.cur_len
        bs = bias_strides(g.bias_shape) if bias is not None else (0, 0, 0, 0)
        part_o = base + plan.part_o_off if plan.partials else 0
        part_ml = base + plan.part_ml_off if plan.partials else 0
        rt.launch(fn_attn, plan.grid, plan.threads,
                  [q.ptr, k0, v0, k1, v1, idx.ptr, bias.ptr if bias is not None else 0, y.ptr,
                   part_o, part_ml, counters, latch, valid_ptr,
                   i64(bs[0]), i64(bs[1]), i64(bs[2]), i64(bs[3]),
                   i32(g.q_len), i32(g.heads), i32(g.group), i32(plan.units), i32(plan.hbk),
                   i32(g.index_heads == 1), i32(g.index_heads), i32(plan.splits), i32(g.width),
                   i32(plan.cps), i32(g.head_size), i32(len0), i32(len1), i32(g.cache_len),
                   i32(g.index_dtype == DataType.INT64), i32(bias is not None), i32(plan.lpk),
                   i32(plan.stages), np.float32(g.scale * math.log2(math.e)),
                   i32(plan.tasks * plan.splits)],
                  shared_mem=plan.smem, programmatic=plan.entry == "is_attn_ws")
        if plan.merge == "kernel":
            # After the warp-specialised kernel (which lets its dependents launch at once),
            # programmatically where it leaves three quarters of the SMs free: is_combine's
            # blocks are resident before the partials are done (and wait for them), which
            # saves its launch (H200: 0.2-0.9 us at 2-32 CTAs); with fewer SMs free they
            # crowd onto those and the combine runs slower (+0.5-1.3 us at 64 CTAs).
            n_rows = g.batch * g.q_len * g.heads
            rt.launch(fn_comb, self._blocks(n_rows * g.head_size), 256,
                      [part_o, part_ml, y.ptr, i64(n_rows), i32(plan.splits), i32(g.head_size),
                       i32(g.q_len), i32(g.heads)],
                      programmatic=plan.entry == "is_attn_ws" and
                      4 * plan.grid <= self.rt.capabilities.sm_count)
        if not capturing:
            self._warm = True

    # -- pieces ------------------------------------------------------------------------
    def _blocks(self, n: int) -> int:
        return max(1, min(-(-n // 256), self.rt.capabilities.sm_count * 16))

    def _check_outputs(self, g: Geometry, q: TensorView, y: Any, prk: Any, prv: Any) -> None:
        if tuple(y.shape) != tuple(q.shape) or y.dtype != g.dtype:
            raise KernelError(f"{OP}: output Y must be {g.dtype.name} {list(q.shape)}, got "
                              f"{y.dtype.name} {list(y.shape)}")
        for name, t in (("Y", y), ("present_key", prk), ("present_value", prv)):
            if t is None:
                continue
            if t.dtype != g.dtype:
                raise KernelError(f"{OP}: output {name} dtype {t.dtype.name} must be {g.dtype.name}")
            if not t.is_contiguous:
                raise KernelError(f"{OP}: output {name} must be contiguous, got strides {t.strides}")

    @staticmethod
    def _check_aliasing(g: Geometry, inputs: list, y: Any, prk: Any, prv: Any, pk: Any,
                        pv: Any) -> None:
        def span(t: Any) -> tuple[int, int]:
            return t.ptr, t.ptr + t.nbytes

        def overlap(a: Any, b: Any) -> bool:
            (a0, a1), (b0, b1) = span(a), span(b)
            return a0 < b1 and b0 < a1 and a.nbytes and b.nbytes

        outs = [("Y", y, None), ("present_key", prk, pk), ("present_value", prv, pv)]
        for name, o, may_alias in outs:
            if o is None:
                continue
            for t in inputs:
                if not overlap(o, t):
                    continue
                if g.mode == "capacity" and t is may_alias and o.ptr == t.ptr:
                    continue  # the in-place fixed-capacity cache
                raise KernelError(f"{OP}: output {name} overlaps an input; only a fixed-capacity "
                                  "present may alias its past tensor exactly")
        if prk is not None and overlap(prk, prv):
            raise KernelError(f"{OP}: present_key and present_value overlap")
        for o in (prk, prv):
            if o is not None and overlap(o, y):
                raise KernelError(f"{OP}: Y overlaps a present output")

    def _copy(self, g: Geometry, dst: int, src: int, seg: int, dst_stride: int,
              capturing: bool) -> None:
        w = _gcd_width(dst, src, seg, dst_stride)
        fn = self._fn(_aux_variant(g.dtype), f"is_copy_w{w}", capturing)
        nseg = g.batch * g.kv_heads
        self.rt.launch(fn, self._blocks(nseg * seg // w), 256,
                       [dst, src, np.int64(nseg), np.int64(seg // w), np.int64(seg // w),
                        np.int64(dst_stride // w)])

    def _scatter(self, g: Geometry, dst: int, src: int, valid_ptr: int, capturing: bool) -> None:
        row = g.head_size * g.dtype.itemsize
        w = _gcd_width(dst, src, row)
        fn = self._fn(_aux_variant(g.dtype), f"is_scatter_w{w}", capturing)
        rows = g.batch * g.kv_heads * g.cur_len
        self.rt.launch(fn, self._blocks(rows * row // w), 256,
                       [dst, src, valid_ptr, np.int32(g.kv_heads), np.int32(g.cur_len),
                        np.int32(g.cache_len), np.int64(rows), np.int64(row // w)])

    def _frontier(self, g: Geometry, bias: TensorView, valid_ptr: int, capturing: bool) -> None:
        if g.batch > 65535:
            raise KernelError(f"{OP}: fixed-capacity mode supports batch <= 65535, got {g.batch}")
        fn = self._fn(_aux_variant(g.dtype), "is_frontier", capturing)
        b4 = (1,) * (4 - len(g.bias_shape)) + tuple(g.bias_shape)
        per_batch = b4[1] * b4[2] * b4[3]
        chunk = 4096
        self.rt.memset(valid_ptr, 0, g.batch * 4)
        self.rt.launch(fn, (max(1, -(-per_batch // chunk)), g.batch, 1), 256,
                       [bias.ptr, valid_ptr, np.int32(b4[0]), np.int64(per_batch),
                        np.int32(b4[3]), np.int32(g.cache_len), np.int64(chunk)])
