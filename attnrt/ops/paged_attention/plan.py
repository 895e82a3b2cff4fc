"""The PagedAttention launch planner: a pure function of shapes, device facts and a config.

:func:`plan_launch` picks the read path, the key tile, the grid and the split-KV count;
:func:`workspace_layout` is the one layout helper that planning and execution share. Every
knob that steers a choice lives in the frozen :class:`PagedAttentionConfig`; the defaults
are the rules in ``docs/notes/paged_attention.md#read-paths``.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from attnrt.runtime.errors import KernelError

from .._common import expect
from .balanced import (
    BALANCED_MAX_BATCH,
    BALANCED_MAX_CHUNKS,
    WS_ALIGN,
    balanced_chunks,
    partition_applies,
    partition_layout,
    partition_overhead,
    partition_slots,
)
from .builds import (
    MLA_ROWS,
    MLA_SHAPES,
    MLA_TILES,
    WG_BLOCK_N,
    mla_smem_bytes,
    mla_wg_smem_bytes,
    simple_smem_bytes,
)
from .schema import OP, PagedGeometry

__all__ = ["PATHS", "WS_ALIGN", "SplitCost", "PagedAttentionConfig", "PagedPlan", "DeviceFacts",
           "DEFAULT_DEVICE", "plan_launch", "unsplit", "choose_splits", "workspace_layout",
           "counts_offset", "balanced_chunks", "BALANCED_MAX_CHUNKS", "BALANCED_MAX_BATCH",
           "WG_SCHEDULES", "wg_schedule", "partition_layout", "partition_overhead",
           "partition_slots"]

#: ``auto`` applies the rule; the others force a path (``mla64``/``mla32`` also the tile).
PATHS = ("auto", "mla", "mla64", "mla32", "wg", "simple")
#: wgmma kernels: ``auto`` (:func:`wg_schedule`), ``serial`` (``cuda/paged_mla_wg.cu``) or
#: ``pair`` (the warpgroups alternate tiles, ``cuda/paged_mla_pair.cu``).
WG_SCHEDULES = ("auto", "serial", "pair")


@dataclass(frozen=True)
class SplitCost:
    """Modelled microseconds of one CTA of a latent kernel (see :func:`choose_splits`).

    Attributes
    ----------
    tile_us
        One tile of keys.
    prologue_us
        CTA setup with Q and the first tile in flight.
    partial_us
        Writing one CTA's f32 partials when split.
    """

    tile_us: float
    prologue_us: float
    partial_us: float


def _integer(v: Any, name: str) -> int:
    """``v`` as a Python int; a float (even ``2.0``), a bool or anything else is refused."""
    if isinstance(v, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    try:
        return int(operator.index(v))
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {v!r}") from None


@dataclass(frozen=True)
class PagedAttentionConfig:
    """Every knob of the PagedAttention planner; the defaults are the shipped behaviour.

    Pass one to :class:`~attnrt.ops.paged_attention.PagedAttentionFactory` (or the kernel)
    to pin a path, a tile or a split count; nothing else steers the planner.

    Attributes
    ----------
    path
        One of :data:`PATHS`: ``"auto"`` (the rule in
        ``docs/notes/paged_attention.md#read-paths``), ``"mla"`` (the mma.sync kernel),
        ``"mla64"``/``"mla32"`` (it, with that tile), ``"wg"`` (the sm_90a wgmma kernel) or
        ``"simple"`` (the CUDA-core kernel).
    num_splits
        Force the split-KV count of the latent paths (``None``: the cost model decides).
    max_splits
        Largest split count the cost model considers.
    mla_tiles
        Key tiles the mma.sync kernel may use, largest first; the first that fits the
        device's shared memory wins. Each must be a built tile (``builds.MLA_TILES``).
    mla_cost, wg_cost
        Cost model of the mma.sync and wgmma kernels (H200; mma.sync tile measured, wgmma
        predicted): see ``docs/notes/paged_attention.md#split-cost-model``.
    combine_launch_us, combine_bytes_per_us
        The combine launch and its read rate of the partials (they mostly sit in L2).
    programmatic
        Launch the wgmma read kernel and the combine with programmatic dependent launch
        where the device has it (compute capability 9.0+): each may start while the kernel
        before it finishes (``docs/notes/paged_attention.md#pdl``). ``False``: plain stream
        order.
    balanced
        Balanced split-KV on the wgmma path: the work is cut on the device from the real
        lengths. The pair kernel cuts the (row block, tile) line into equal contiguous parts,
        one CTA per SM (``docs/notes/paged_attention.md#contiguous-partition``); the serial
        kernel picks a chunk count per sequence (``#balanced-splits``). ``True``: on (for
        decode batches of unequal lengths; on equal ones its prologue costs a few
        microseconds); ``False``: the model's count for every sequence; ``None`` (the
        default): on for batches where a sequence brings several new tokens (speculative
        decode, chunked prefill: the host cannot see how they are spread), else off.
    wg_schedule
        One of :data:`WG_SCHEDULES`: which kernel runs the wgmma path
        (``docs/notes/paged_attention.md#pair-kernel``): ``auto`` (the default) takes the
        pair kernel wherever it applies, ``serial`` and ``pair`` force one. ``pair`` applies
        to block sizes that are a multiple of 64 (it loads whole pages by TMA); other block
        sizes run ``serial``. Both take the same splits and workspace.

    Raises
    ------
    ValueError
        An unknown path or wgmma schedule, a split count outside [1, 65535], an unbuilt tile, or an integer
        knob (``num_splits``, ``max_splits``, ``mla_tiles``) that is not an integer.
    """

    path: str = "auto"
    num_splits: int | None = None
    max_splits: int = 64
    mla_tiles: tuple[int, ...] = MLA_TILES
    mla_cost: SplitCost = field(default=SplitCost(5.3, 3.0, 1.0))
    wg_cost: SplitCost = field(default=SplitCost(2.0, 3.0, 1.0))
    combine_launch_us: float = 2.0
    combine_bytes_per_us: float = 3.0e6
    programmatic: bool = True
    balanced: bool | None = None
    wg_schedule: str = "auto"

    def __post_init__(self) -> None:
        # Integer knobs are checked (and numpy integers converted) here, so that a bad value
        # is refused when the config is built, never half-way through a call's launches.
        if self.path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {self.path!r}")
        if self.balanced not in (True, False, None):
            raise ValueError(f"balanced must be True, False or None, got {self.balanced!r}")
        if self.wg_schedule not in WG_SCHEDULES:
            raise ValueError(f"wg_schedule must be one of {WG_SCHEDULES}, "
                             f"got {self.wg_schedule!r}")
        if self.num_splits is not None:
            n = _integer(self.num_splits, "num_splits")
            if not 1 <= n <= 65535:
                raise ValueError(f"num_splits must be in [1, 65535], got {self.num_splits!r}")
            object.__setattr__(self, "num_splits", n)
        m = _integer(self.max_splits, "max_splits")
        if m < 1:
            raise ValueError(f"max_splits must be >= 1, got {self.max_splits!r}")
        object.__setattr__(self, "max_splits", m)
        tiles = self.mla_tiles
        if (not isinstance(tiles, (tuple, list)) or not tiles
                or any(_integer(t, "mla_tiles") not in MLA_TILES for t in tiles)):
            raise ValueError(f"mla_tiles must be a non-empty subset of the built tiles "
                             f"{MLA_TILES}, got {self.mla_tiles!r}")
        object.__setattr__(self, "mla_tiles", tuple(int(t) for t in tiles))

    def split_cost(self, path: str) -> SplitCost:
        """The cost model of latent path ``path`` (``"mla"`` or ``"wg"``)."""
        return self.wg_cost if path == "wg" else self.mla_cost


@dataclass(frozen=True)
class PagedPlan:
    """The launch plan: path, tile, grid and splits, and the workspace layout."""

    path: str  # "mla", "wg", "simple" or "none" (no tokens)
    block_n: int
    grid_x: int
    splits: int  # the cost model's count for the shapes (the rule)
    ws_lse_offset: int
    ws_bytes: int
    #: Balanced split-KV: chunks chosen on the device from the real lengths; else ``splits``
    #: each. The serial kernel picks each sequence's chunk count, at most ``max_chunks``
    #: (docs/notes/paged_attention.md#balanced-splits); the pair kernel runs the contiguous
    #: partition over ``part_ctas`` CTAs (docs/notes/paged_attention.md#contiguous-partition).
    balanced: bool = False
    #: The grid's second dimension and the workspace's split stride; with the partition, the
    #: most chunks a row block can have (``part_ctas``).
    max_chunks: int = 1
    ws_cnt_offset: int = 0
    #: The contiguous partition's CTAs (about one per SM), 0 without it, in ``part_lanes``
    #: lanes (``ceil(H / 64)``: a token's row blocks side by side); its workspace is
    #: :func:`partition_layout` of ``(grid_x + part_ctas / part_lanes) * part_lanes``
    #: row-block slots.
    part_ctas: int = 0
    part_lanes: int = 1


@dataclass(frozen=True)
class DeviceFacts:
    """The device facts planning reads (a runtime's ``capabilities`` has the same names)."""

    sm_count: int
    max_shared_per_block_optin: int
    compute_capability: tuple[int, int]


#: Planning defaults when a kernel has no runtime (CPU planning, tests): an H200.
DEFAULT_DEVICE = DeviceFacts(132, 232448, (9, 0))


def workspace_layout(rows: int, v_head_size: int, splits: int,
                     counts: bool = False) -> tuple[int, int]:
    """(offset of the log-sum-exp array, total bytes) of the split-KV partials.

    Partial O is f32 [rows, splits, v_head_size] at offset 0, then f32 [rows, splits]; with
    ``counts`` (balanced split-KV) then int32 [rows] chunk counts at :func:`counts_offset`;
    no workspace when ``splits == 1``.

    Parameters
    ----------
    rows
        Tokens times heads.
    v_head_size
        Value width.
    splits
        Split-KV count (the stride of the partials).
    counts
        Append the per-row chunk counts of balanced split-KV.

    Returns
    -------
    tuple of int
        ``(lse_offset, total_bytes)``; ``(0, 0)`` when unsplit.
    """
    if splits <= 1:
        return 0, 0
    o_bytes = rows * splits * v_head_size * 4
    lse_off = -(-o_bytes // WS_ALIGN) * WS_ALIGN
    total = lse_off + rows * splits * 4
    if counts:
        total = counts_offset(rows, v_head_size, splits) + rows * 4
    return lse_off, total


def counts_offset(rows: int, v_head_size: int, splits: int) -> int:
    """Offset of the int32 [rows] chunk counts in :func:`workspace_layout` with ``counts``."""
    lse_off = workspace_layout(rows, v_head_size, splits)[0]
    return -(-(lse_off + rows * splits * 4) // WS_ALIGN) * WS_ALIGN


def choose_splits(row_blocks: int, tiles: int, sm_count: int, rows: int = 0,
                  v_head_size: int = 512, cap: int | None = None, path: str = "mla",
                  config: PagedAttentionConfig | None = None, lo: int = 1) -> int:
    """Splits per row block minimising a modelled time (microseconds).

    One CTA per SM (the tile takes most of shared memory): time = waves x (tiles per split x
    tile + prologue + partial write when split), plus, when split, the combine launch and its
    read of ``rows x splits`` f32 partial rows. Why this model:
    ``docs/notes/paged_attention.md#split-cost-model``.

    Parameters
    ----------
    row_blocks
        CTAs of one split (row blocks that have work).
    tiles
        Key tiles of the longest row block.
    sm_count
        SMs of the device.
    rows
        (token, head) rows, for the combine's read.
    v_head_size
        Value width.
    cap
        Largest count considered (``None``: ``config.max_splits``).
    path
        ``"mla"`` or ``"wg"``: whose cost model.
    config
        The knobs (``None``: the defaults).
    lo
        Smallest count considered (clamped to ``[1, min(cap, tiles)]``).

    Returns
    -------
    int
        The split count, in ``[lo, min(cap, tiles)]`` (the smallest of equal costs).
    """
    cfg = config or PagedAttentionConfig()
    c = cfg.split_cost(path)
    cap = cfg.max_splits if cap is None else cap
    hi = max(1, min(cap, tiles))
    best, best_cost = 1, math.inf
    for s in range(min(max(1, lo), hi), hi + 1):
        waves = -(-row_blocks * s // max(1, sm_count))
        per_cta = -(-tiles // s) * c.tile_us + c.prologue_us + (c.partial_us if s > 1 else 0.0)
        combine = (cfg.combine_launch_us + rows * s * v_head_size * 4 / cfg.combine_bytes_per_us) \
            if s > 1 else 0.0
        cost = waves * per_cta + combine
        if cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best


def unsplit(plan: PagedPlan) -> PagedPlan:
    """``plan`` without split-KV (run when no workspace was given)."""
    return replace(plan, splits=1, ws_lse_offset=0, ws_bytes=0, balanced=False, max_chunks=1,
                   ws_cnt_offset=0, part_ctas=0, part_lanes=1)


def plan_launch(g: PagedGeometry, window: int, caps: Any, config: PagedAttentionConfig,
                meta: np.ndarray | None = None, aligned: bool = True) -> PagedPlan:
    """The launch plan of one call.

    Parameters
    ----------
    g
        The validated geometry.
    window
        ``local_window_size`` (``-1``: none).
    caps
        Device facts: ``sm_count``, ``max_shared_per_block_optin`` and optionally
        ``compute_capability`` (:class:`DeviceFacts` or a runtime's ``capabilities``).
    config
        The knobs.
    meta
        Host ``attention_metadata`` values; they may only lower the split count, so the
        shapes-only workspace always suffices.
    aligned
        The query, cache and output pointers are 16-byte aligned.

    Raises
    ------
    KernelError
        A forced path cannot run these shapes on this device, or no path fits its shared
        memory.
    """
    rows = g.tokens * g.heads
    if rows == 0:
        return PagedPlan("none", 0, 0, 1, 0, 0)  # max_chunks 1
    path_opt = config.path
    block_n, path = 0, "mla"
    mla_ok = (g.head_size, g.v_head_size) in MLA_SHAPES and aligned
    cc = tuple(getattr(caps, "compute_capability", (0, 0)))
    # The wgmma kernel is the default where it runs: docs/notes/paged_attention.md#wgmma-default
    wg_ok = mla_ok and cc == (9, 0) and mla_wg_smem_bytes(g.head_size) <= caps.max_shared_per_block_optin
    if path_opt == "wg" or (path_opt == "auto" and wg_ok):
        smem = mla_wg_smem_bytes(g.head_size)
        if not wg_ok:
            raise KernelError(f"{OP}: path='wg' needs head_size/v_head_size in {MLA_SHAPES}, "
                              f"16-byte aligned pointers, compute capability 9.0 (sm_90a "
                              f"wgmma) and {smem} bytes of shared memory; got "
                              f"{g.head_size}/{g.v_head_size}, aligned={aligned}, "
                              f"cc={cc}, {caps.max_shared_per_block_optin} bytes")
        block_n, path = WG_BLOCK_N, "wg"
    elif path_opt != "simple" and mla_ok:
        tiles = {"mla64": (64,), "mla32": (32,)}.get(path_opt, config.mla_tiles)
        fits = [bn for bn in tiles
                if mla_smem_bytes(bn, g.head_size) <= caps.max_shared_per_block_optin]
        block_n = fits[0] if fits else 0
    if block_n == 0:
        if path_opt in ("mla", "mla64", "mla32"):
            raise KernelError(f"{OP}: path={path_opt!r} needs head_size/v_head_size in "
                              f"{MLA_SHAPES}, 16-byte aligned pointers and "
                              f"{mla_smem_bytes(config.mla_tiles[-1], g.head_size)} bytes of "
                              f"shared memory; got {g.head_size}/{g.v_head_size}, "
                              f"aligned={aligned}, {caps.max_shared_per_block_optin} bytes")
        smem = simple_smem_bytes(g.head_size, g.v_head_size)
        expect(smem <= caps.max_shared_per_block_optin,
               f"{OP}: head_size {g.head_size} / v_head_size {g.v_head_size} need {smem} bytes "
               f"of shared memory on the simple path; the device allows "
               f"{caps.max_shared_per_block_optin}")
        return PagedPlan("simple", 0, rows, 1, 0, 0)
    # Row blocks: sequence b owns [G(b), G(b+1)), G(b) = floor(cu[b]*H/64) + (H%64 ? b : 0).
    extra = g.batch if g.heads % MLA_ROWS else 0
    grid_x = rows // MLA_ROWS + extra
    splits = config.num_splits or _auto_splits(g, window, grid_x, block_n, None, caps, path, config)
    if meta is not None and not config.num_splits:
        # Metadata may only lower the count, so the shapes-only workspace always suffices.
        splits = min(splits, _auto_splits(g, window, grid_x, block_n, meta, caps, path, config))
    if path == "wg" and wg_schedule(g, config) == "pair" and partition_applies(
            g, path, config, grid_x):
        sms = max(1, int(caps.sm_count))
        lanes = -(-g.heads // MLA_ROWS) if sms >= -(-g.heads // MLA_ROWS) else 1
        ctas = lanes * (sms // lanes)
        lse_off, cnt_off, ws = partition_layout(rows, g.v_head_size,
                                                partition_slots(grid_x, ctas, lanes))
        return PagedPlan(path, block_n, grid_x, splits, lse_off, ws, True, ctas, cnt_off, ctas,
                         lanes)
    chunks = balanced_chunks(g, path, splits, config)
    if chunks:
        lse_off, ws = workspace_layout(rows, g.v_head_size, chunks, counts=True)
        return PagedPlan(path, block_n, grid_x, splits, lse_off, ws, True, chunks,
                         counts_offset(rows, g.v_head_size, chunks))
    lse_off, ws = workspace_layout(rows, g.v_head_size, splits)
    return PagedPlan(path, block_n, grid_x, splits, lse_off, ws, max_chunks=splits)


def _auto_splits(g: PagedGeometry, window: int, grid_x: int, block_n: int, meta: np.ndarray | None,
                 caps: Any, path: str, config: PagedAttentionConfig) -> int:
    # Splits are fixed on the host from shapes: docs/notes/paged_attention.md#split-kv
    max_q, max_kv = g.tokens, g.max_blocks * g.block_size
    if meta is not None:
        max_q, max_kv = min(max_q, int(meta[0])), min(max_kv, int(meta[1]))
    span = max_kv if window < 0 else min(max_kv, window + max_q)
    tiles = -(-max(span, 1) // block_n) + (1 if window >= 0 else 0)
    row_blocks = min(grid_x, g.batch * -(-max(max_q, 1) * g.heads // MLA_ROWS))
    rows = min(g.tokens, g.batch * max(max_q, 1)) * g.heads
    args = (tiles, int(caps.sm_count), rows, g.v_head_size)
    grid_pick = choose_splits(row_blocks, *args, path=path, config=config)
    # Cost the row blocks that can hold rows, never fewer splits than the grid-wide count:
    # docs/notes/paged_attention.md#busy-row-blocks
    busy = min(row_blocks, g.tokens * -(-g.heads // MLA_ROWS))
    return choose_splits(busy, *args, path=path, config=config, lo=grid_pick)


def wg_schedule(g: PagedGeometry, config: PagedAttentionConfig) -> str:
    """The kernel of a ``wg`` plan, ``"pair"`` or ``"serial"``: ``pair`` needs block sizes
    that are a multiple of 64 (whole 64-key pages by TMA); ``auto`` takes it wherever it
    applies (faster than the serial kernel on every measured row, down to one tile per
    split: docs/notes/paged_attention.md#pair-kernel).

    Parameters
    ----------
    g, config
        The geometry and the knobs (``wg_schedule``).
    """
    if g.block_size % 64 or config.wg_schedule == "serial":
        return "serial"
    return "pair"
