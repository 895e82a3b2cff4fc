"""Attention builds: tile tables, shared-memory sizes, workspace layouts, compile variants.

Each path's kernel is compiled per element type and tile shape; the tables here name the
shipped builds and :func:`compile_variants` lists every compile ``attnrt warm`` and the CPU
compile tests walk. Functions that pick a wgmma build take an optional
:class:`~attnrt.ops.attention.AttentionConfig` (None: the shipped tables).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from attnrt.runtime.api import DataType

from .._common import CTYPE, Variant
from .schema import SUPPORTED

if TYPE_CHECKING:
    from .plan import AttentionConfig

__all__ = ["TC_TILES", "SIMT_DMAX", "SIMT_ROWS", "SIMT_KEYS", "SIMT_THREADS", "WG_ROWS",
           "WG_BUILD", "WG_CAUSAL", "WG_LONG", "DEC_TILES", "DEC_MAX_ROWS", "DEC_MAX_SPLITS",
           "DEC_CLUSTERS", "WS_ALIGN", "split_layout", "decode_layout", "unfused_layout",
           "tc_head_dim", "tc_smem_bytes", "simt_smem_bytes", "wg_build",
           "wg_builds", "wg_keys", "wg_sched", "wg_threads", "wg_persistent", "wg_smem_bytes",
           "build_threads", "build_persistent", "build_smem_bytes", "dec_ring_bytes",
           "dec_smem_bytes", "tc_variant", "wg_variant", "wg_build_variant", "dec_variant",
           "simt_variant", "rows_variant", "gemm_variant", "compile_variants"]

#: Tensor-core builds: padded head dim -> (warps per CTA, keys per tile). 16 rows per warp.
TC_TILES: dict[int, tuple[int, int]] = {64: (4, 64), 80: (4, 64), 128: (4, 64), 256: (4, 32)}
SIMT_DMAX = 256
SIMT_ROWS, SIMT_KEYS, SIMT_THREADS = 32, 32, 256

#: wgmma build per head dim: (schedule NXRT_WG_SCHED, keys per tile, min resident CTAs per SM).
#: Persistent warp-specialized schedule 6 everywhere; 176-key tiles pay off at D64 only
#: (see docs/notes/attention.md#wg-schedules, docs/notes/attention.md#wg-keys).
WG_BUILD: dict[int, tuple[int, int, int]] = {64: (6, 176, 1), 128: (6, 128, 1)}
#: Causal calls: (schedule, keys per tile); schedule 7 deals the work items longest first
#: (see docs/notes/attention.md#wg-schedules).
WG_CAUSAL: dict[int, tuple[int, int]] = {64: (7, 128), 128: (7, 128)}
#: Non-causal calls with at least ``min_sk`` keys: head dim -> (min_sk, keys per tile); long
#: rows amortise 176-key tiles at D128 (see docs/notes/attention.md#wg-keys).
WG_LONG: dict[int, tuple[int, int]] = {128: (8192, 176)}
WG_ROWS = 128  # packed query rows per wgmma work item (two consumer warpgroups of 64)

#: Decode builds: padded head dim -> (warps per CTA, cp.async ring stages). 16 keys per warp
#: and tile; shared memory stays under 110 KiB so that two CTAs fit an H100/H200 SM
#: (see docs/notes/attention.md#decode-tiles).
DEC_TILES: dict[int, tuple[int, int]] = {64: (4, 4), 80: (4, 4), 128: (4, 3), 256: (2, 3)}
DEC_MAX_ROWS = 16         # packed query rows G·Sq of one CTA (one mma row block)
DEC_MAX_SPLITS = 64       # as DEC_MAX_SPLITS in attention_fused_tc.cu (weights in shared memory)
#: Cluster sizes of the shipped decode builds whose split CTAs merge through distributed
#: shared memory: only pairs stay in one wave (see docs/notes/attention.md#decode-clusters).
DEC_CLUSTERS: tuple[int, ...] = (2,)
WS_ALIGN = 256  # workspace alignment (bytes) of every layout below


# --------------------------------------------------------------------------- geometry
def tc_head_dim(D: int) -> int | None:
    """The tensor-core build for head dim D (the smallest padded dim >= D), or None."""
    if D <= 0 or D % 8:
        return None
    return next((dp for dp in sorted(TC_TILES) if dp >= D), None)


def tc_smem_bytes(dp: int) -> int:
    """Dynamic shared memory of the tensor-core build ``dp`` (as in attention_fused_tc.cu)."""
    nwarps, bn = TC_TILES[dp]
    bm = 16 * nwarps
    return (bm + 4 * bn) * (dp + 8) * 2 + bm * ((bn + 4) * 4 + 8)


def simt_smem_bytes(D: int) -> int:
    """Dynamic shared memory of the SIMT kernel at head dim D (as in attention_fused_simt.cu)."""
    kp = D | 1
    return 4 * (SIMT_ROWS * D + SIMT_KEYS * kp + SIMT_KEYS * D + 8 * 4 * SIMT_KEYS)


def _wg_tables(config: AttentionConfig | None) -> tuple[Mapping, Mapping, Mapping]:
    if config is None:
        return WG_BUILD, WG_CAUSAL, WG_LONG
    return dict(config.wg_build), dict(config.wg_causal), dict(config.wg_long)


def wg_build(D: int, causal: bool = False, Sk: int = 0,
             config: AttentionConfig | None = None) -> tuple[int, int, int]:
    """The wgmma build for a call at head dim D with Sk keys.

    Parameters
    ----------
    D
        Head dim (a key of the build table).
    causal
        Causal masking: the causal table's schedule and keys where it names D.
    Sk
        Keys; without causal masking the long-row table's keys from its ``min_sk`` on.
    config
        Its ``wg_build`` / ``wg_causal`` / ``wg_long`` tables (None: the shipped ones).

    Returns
    -------
    tuple[int, int, int]
        (schedule, keys per tile, min blocks per SM).

    Raises
    ------
    KeyError
        No build for head dim D.
    """
    build, causal_t, long_t = _wg_tables(config)
    sched, keys, min_blocks = build[D]
    if causal:
        if D in causal_t:
            sched, keys = causal_t[D]
    elif D in long_t and Sk >= long_t[D][0]:
        keys = long_t[D][1]
    return sched, keys, min_blocks


def wg_builds(D: int, config: AttentionConfig | None = None) -> list[tuple[int, int, int]]:
    """Every distinct build :func:`wg_build` may return at head dim D."""
    out: list[tuple[int, int, int]] = []
    for b in (wg_build(D, config=config), wg_build(D, True, config=config),
              wg_build(D, False, 1 << 62, config)):
        if b not in out:
            out.append(b)
    return out


def wg_keys(D: int, causal: bool = False, Sk: int = 0,
            config: AttentionConfig | None = None) -> int:
    """Keys per tile of the wgmma build for a call at head dim D."""
    return wg_build(D, causal, Sk, config)[1]


def wg_sched(D: int, causal: bool = False, config: AttentionConfig | None = None) -> int:
    """attention_wg.cu schedule of the wgmma build at head dim D (for a causal call when
    ``causal``)."""
    return wg_build(D, causal, config=config)[0]


def build_threads(sched: int) -> int:
    """Threads per CTA of wgmma schedule ``sched``: 384 (a producer and two consumer
    warpgroups) for both schedules attention_wg.cu builds (6 and 7)."""
    return 384


def build_persistent(sched: int) -> bool:
    """Whether wgmma schedule ``sched`` is persistent: both built schedules (6 and 7) are, at
    most one CTA per SM, each looping over work items."""
    return True


def wg_threads(D: int, causal: bool = False, config: AttentionConfig | None = None) -> int:
    """Threads per CTA of the wgmma build at head dim D (keys per tile never change it)."""
    return build_threads(wg_sched(D, causal, config))


def wg_persistent(D: int, causal: bool = False, config: AttentionConfig | None = None) -> bool:
    """Whether the wgmma build at head dim D is persistent."""
    return build_persistent(wg_sched(D, causal, config))


def build_smem_bytes(D: int, build: tuple[int, int, int]) -> int:
    """Dynamic shared memory of wgmma ``build`` (schedule, keys, min blocks) at head dim D,
    as SMEM_BYTES in attention_wg.cu: Q [128 x D], two stages of K and V [keys x D], the
    producer/consumer mbarriers (256 bytes) and 1024 bytes to align the swizzle atoms."""
    _sched, keys, _ = build
    return (D // 64) * (WG_ROWS * 128 + 2 * 2 * keys * 128) + 256 + 1024


def wg_smem_bytes(D: int, causal: bool = False, Sk: int = 0,
                  config: AttentionConfig | None = None) -> int:
    """Dynamic shared memory of the wgmma kernel for a call at head dim D with Sk keys."""
    return build_smem_bytes(D, wg_build(D, causal, Sk, config))


def dec_ring_bytes(dp: int) -> int:
    """The decode build's K/V ring (DEC_RING_BYTES): ``stages`` tiles of K and V."""
    nwarps, stages = DEC_TILES[dp]
    return stages * 2 * 16 * nwarps * (dp + 8) * 2


def dec_smem_bytes(dp: int) -> int:
    """Dynamic shared memory of the decode build ``dp`` (as DEC_SMEM_BYTES in
    attention_fused_tc.cu): the 16-row Q tile plus ``stages`` tiles of K and V."""
    return 16 * (dp + 8) * 2 + dec_ring_bytes(dp)


# --------------------------------------------------------------------------- workspace layouts
def _align(n: int, a: int = WS_ALIGN) -> int:
    return -(-n // a) * a


def split_layout(rows: int, D: int, splits: int) -> tuple[int, int, int]:
    """Split-KV partials: (offset of f32 O [splits, rows, D], offset of f32 (m, l)
    [splits, rows, 2], total bytes). ``rows`` = B·H·Sq. No bytes when splits == 1."""
    if splits <= 1:
        return 0, 0, 0
    ml = _align(splits * rows * D * 4)
    return 0, ml, ml + splits * rows * 2 * 4


def decode_layout(rows: int, D: int, splits: int, tasks: int) -> tuple[int, int, int]:
    """Decode workspace: (offset of f32 (m, l), offset of the u32 split counters [tasks],
    total bytes). The partials are :func:`split_layout`'s (so a ``simt`` fallback can use
    the same workspace); the counters follow. No bytes when splits == 1."""
    if splits <= 1:
        return 0, 0, 0
    _, ml, total = split_layout(rows, D, splits)
    cnt = _align(total)
    return ml, cnt, cnt + _align(4 * tasks)


def unfused_layout(B: int, H: int, Sq: int, Sk: int) -> tuple[int, int]:
    """Unfused scores: (offset, total bytes) of f32 S/P [B·H, Sq, Sk] (row pitch Sk)."""
    return 0, _align(B * H * Sq * Sk * 4)


# --------------------------------------------------------------------------- variants
def tc_variant(dtype: DataType, dp: int) -> Variant:
    """The tensor-core fused kernel for ``dtype`` at padded head dim ``dp``."""
    nwarps, bn = TC_TILES[dp]
    return Variant("attention_fused_tc.cu", ("attn_fused_tc",),
                   {"NXRT_T": CTYPE[dtype], "HEAD_DIM": dp, "BLOCK_N": bn, "NWARPS": nwarps})


def wg_variant(dtype: DataType, D: int, causal: bool = False, Sk: int = 0,
               config: AttentionConfig | None = None) -> Variant:
    """The wgmma kernel a call at head dim D with Sk keys runs."""
    return wg_build_variant(dtype, D, wg_build(D, causal, Sk, config))


def wg_build_variant(dtype: DataType, D: int, build: tuple[int, int, int]) -> Variant:
    """The wgmma kernel of ``build`` (schedule, keys, min blocks) at head dim D; defines
    that equal the source's defaults are left out, so the shipped compiles keep their keys."""
    sched, keys, min_blocks = build
    defines = {"NXRT_BF16": int(dtype == DataType.BFLOAT16), "HEAD_DIM": D, "MIN_BLOCKS": min_blocks}
    defines["NXRT_WG_SCHED"] = sched
    if keys != 128:  # the source's default tile
        defines["NXRT_WG_BN"] = keys
    return Variant("attention_wg.cu", ("attn_fused_wg",), defines, min_arch=90, arch_suffix="a")


def dec_variant(dtype: DataType, dp: int, cluster: int = 0) -> Variant:
    """The decode kernel at padded head dim ``dp`` (``cluster``: CTAs per cluster of the
    distributed-shared-memory split merge, 0 for the memory merge)."""
    nwarps, stages = DEC_TILES[dp]
    defines: dict[str, object] = {"NXRT_T": CTYPE[dtype], "HEAD_DIM": dp, "BLOCK_N": 16 * nwarps,
                                  "NWARPS": nwarps, "DEC_STAGES": stages}
    if cluster:
        defines["DEC_CLUSTER"] = cluster  # thread-block clusters: sm_90+
    return Variant("attention_fused_tc.cu", ("attn_decode",), defines,
                   min_arch=90 if cluster else 80)


def simt_variant(dtype: DataType) -> Variant:
    """The CUDA-core fused kernel."""
    return Variant("attention_fused_simt.cu", ("attn_fused_simt",),
                   {"NXRT_T": CTYPE[dtype], "DMAX": SIMT_DMAX})


def rows_variant(dtype: DataType) -> Variant:
    """The row kernels: the unfused path's softmax and the split-KV combine."""
    return Variant("attention_rows.cu", ("attn_softmax", "attn_combine"), {"NXRT_T": CTYPE[dtype]})


def gemm_variant(dtype: DataType) -> Variant:
    """The unfused path's two GEMMs (S = Q Kᵀ, O = P V)."""
    defines: dict[str, object] = {"NXRT_T": CTYPE[dtype]}
    if dtype == DataType.FLOAT:
        defines["NXRT_F32"] = 1
    return Variant("attention_gemm.cu", ("attn_qk", "attn_pv"), defines)


def compile_variants(config: AttentionConfig | None = None) -> list[Variant]:
    """Every compile this op may launch.

    Parameters
    ----------
    config
        Its wgmma tables and decode cluster sizes (None: the shipped builds).

    Returns
    -------
    list[Variant]
        One entry per (file, defines).
    """
    halves = (DataType.FLOAT16, DataType.BFLOAT16)
    wg = WG_BUILD if config is None else dict(config.wg_build)
    clusters = DEC_CLUSTERS if config is None else config.dec_clusters
    out = [tc_variant(dt, dp) for dt in halves for dp in TC_TILES]
    for dt in SUPPORTED:
        out += [simt_variant(dt), rows_variant(dt), gemm_variant(dt)]
    out += [wg_build_variant(dt, D, b) for dt in halves for D in wg for b in wg_builds(D, config)]
    out += [dec_variant(dt, dp, c) for dt in halves for dp in DEC_TILES for c in (0, *clusters)]
    return out
