"""IndexShare's kernel builds: the tunables of its CUDA variants, the variant builders,
their shared-memory layouts and ``compile_variants`` (what ``attnrt warm`` compiles).
:mod:`.plan` chooses among the builds; why each default is what it is:
docs/notes/index_share.md.
"""

from __future__ import annotations

from attnrt.runtime.api import DataType

from .._common import Variant
from .schema import FLOAT_TYPES

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
#: Hopper (sm_90a) wgmma builds (cuda/index_share_wg.cu): (warpgroups, head rows per CTA).
#: (1, 64) and (2, 128) give each warpgroup 64 heads; (2, 64) splits each tile's keys
#: between the two warpgroups of one 64-head block.
WG_LAYOUTS = ((1, 64), (2, 64), (2, 128))
#: The layout with a register-resident Q build (knob ``qreg``): one warpgroup, whose CTAs
#: then fit two per SM with a 3-stage ring.
WG_QREG_LAYOUT = (1, 64)
#: Register caps of the wgmma builds (knob ``minb``, ``__launch_bounds__`` min blocks): 1 lets
#: ptxas take what it needs; 3 caps a register-resident-Q warpgroup at 168 registers, so
#: three CTAs with 2-stage rings share an SM (see docs/notes/index_share.md#three-ctas-per-sm).
WG_MINB = (1, 3)
#: Groups of at least this many heads sharing an index row take the warp-specialised build
#: (knob ``ws``) by default: it was the faster from 64 heads in every row count measured
#: (see docs/notes/index_share.md#ws-from-64-heads).
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
#: 128 is the faster since the producer's copies are predicated
#: (see docs/notes/index_share.md#ws-key-tile).
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
            # Through distributed shared memory at eight CTAs, through L2 at four: each the
            # faster (see docs/notes/index_share.md#cluster-merge-handover).
            defines["IS_CMDS"] = 1
    elif cluster:
        defines["IS_CLUSTER"] = 1
    return Variant("index_share_ws.cu", ("is_attn_ws",), defines, min_arch=90, arch_suffix="a")


def compile_variants() -> list[Variant]:
    """Every (file, defines, entries) IndexShare may launch (for ``attnrt warm`` and tests)."""
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


# ---------------------------------------------------------------------------------------
# shared memory of each build (mirrors the kernels' layouts)
# ---------------------------------------------------------------------------------------

def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


def _wg_smem(hd: int, wgs: int, mrows: int, stages: int, cps: int, qreg: int = 0) -> int:
    """Dynamic shared memory of is_attn_wg."""
    kt = 64 * (wgs // (mrows // 64))  # keys per tile
    hb = hd // 64
    q = 0 if qreg else hb * mrows * 128
    return 1024 + q + stages * 2 * hb * kt * 128 + cps * 4


def _ws_smem(hd: int, cps: int, q2: int = 0, cluster: int = 0, kt: int = _WS_KT) -> int:
    """Dynamic shared memory of is_attn_ws.

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
    """Dynamic shared memory of is_attn_mma."""
    lds = hd + 8
    q = 16 * wm * lds * 2
    ring = stages * 2 * _KT * lds * 2
    merge = wm * (wn - 1) * (hd // 2 + 4) * 32 * 4 if wn > 1 else 0
    return q + max(ring, merge) + cps * 4


def _writes_partials(merge: str, variant: Variant) -> bool:
    """Whether a plan's splits write partials to the scratch: every merge but the cluster
    builds that hand them over through distributed shared memory (the two-CTA one, and the
    four/eight-CTA one built with IS_CMDS; none with one split)."""
    d = variant.defines
    return merge in ("last", "kernel") or (
        merge == "cluster" and "IS_CMERGE" in d and not d.get("IS_CMDS", 0))
