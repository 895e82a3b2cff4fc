"""Balanced split-KV, host side: when it applies and with what workspace. The serial wgmma
kernel's per-sequence chunk counts (docs/notes/paged_attention.md#balanced-splits) and the
pair kernel's contiguous partition (docs/notes/paged_attention.md#contiguous-partition) are
both computed on the device (``pa::balanced_plan``, ``pa::part_begin`` in
``cuda/paged_common.cuh``); this module only decides when and sizes the launch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import PagedAttentionConfig
    from .schema import PagedGeometry

__all__ = ["BALANCED_MAX_CHUNKS", "BALANCED_MAX_BATCH", "WS_ALIGN", "balanced_on",
           "balanced_chunks", "partition_applies", "partition_overhead", "partition_slots",
           "partition_layout"]

#: Balanced split-KV limits: the device model weighs at most this many chunk counts, and the
#: kernels' scratch (their key-tile stages, 144 KiB) holds 5 (B + 1) ints.
BALANCED_MAX_CHUNKS, BALANCED_MAX_BATCH = 64, 4096
#: Alignment of the workspace and of each of its arrays.
WS_ALIGN = 256
# The partition's positions are int32 on the device: the shapes' bound stays under this.
_PARTITION_SPAN = 1 << 30
_ROWS = 64  # (token, head) rows of a row block


def balanced_on(g: PagedGeometry, config: PagedAttentionConfig) -> bool:
    """Whether the config asks for balanced split-KV on this geometry (``None``: when the
    batch has more tokens than sequences)."""
    return g.tokens > g.batch if config.balanced is None else bool(config.balanced)


def balanced_chunks(g: PagedGeometry, path: str, splits: int,
                    config: PagedAttentionConfig) -> int:
    """The chunk cap of balanced split-KV for this plan, or 0 when it does not apply.

    With ``config.balanced`` (``None``: when the batch has more tokens than sequences),
    the wgmma kernel balances whenever the model splits
    (``splits > 1``), the count is not forced and there are two or more sequences: it may
    give a long sequence up to twice the model's count (what a batch of unequal lengths
    needs) and a short one fewer, choosing on the device from the real lengths:
    ``docs/notes/paged_attention.md#balanced-splits``.

    Parameters
    ----------
    g
        The geometry.
    path
        The read path of the plan.
    splits
        The model's count for the shapes.
    config
        The knobs (``balanced``, ``num_splits``, ``max_splits``).

    Returns
    -------
    int
        The cap (>= ``splits``), or 0.
    """
    if (path != "wg" or not balanced_on(g, config) or config.num_splits or splits <= 1
            or not 1 < g.batch <= BALANCED_MAX_BATCH):
        return 0
    return max(splits, min(2 * splits, config.max_splits, BALANCED_MAX_CHUNKS))


def partition_applies(g: PagedGeometry, path: str, config: PagedAttentionConfig,
                      grid_x: int) -> bool:
    """Whether a pair-kernel plan runs the contiguous partition: balancing asked for, the
    count not forced, two or more sequences, and the shapes' line of positions within int32.

    Parameters
    ----------
    g
        The geometry.
    path
        The read path of the plan (``"wg"`` with the pair kernel).
    config
        The knobs (``balanced``, ``num_splits``, ``max_splits``, ``wg_cost``).
    grid_x
        The plan's row blocks.
    """
    if path != "wg" or not balanced_on(g, config) or config.num_splits or config.max_splits < 2:
        return False
    if not 1 < g.batch <= BALANCED_MAX_BATCH:
        return False
    # int32 on the device: the line's positions, and the slot rows ((grid_x + parts) x lanes
    # x 64, parts x lanes <= CTAs <= 4096; partition_slots).
    tiles = -(-g.max_blocks * g.block_size // _ROWS) + 1
    lanes = -(-g.heads // _ROWS)
    return (grid_x * (tiles + 1 + partition_overhead(config)) < _PARTITION_SPAN
            and (grid_x * lanes + 4096) * _ROWS < _PARTITION_SPAN)


def partition_overhead(config: PagedAttentionConfig) -> int:
    """A row block's fixed cost on the partition's line, in key tiles: the wgmma cost model's
    CTA prologue over its tile, rounded up (2 with the defaults).

    Parameters
    ----------
    config
        The knobs (``wg_cost``).
    """
    c = config.wg_cost
    return max(0, math.ceil(c.prologue_us / c.tile_us - 1e-9))


def partition_slots(grid_x: int, ctas: int, lanes: int) -> int:
    """Row-block slots of the partition's workspace: ``(grid_x + parts) * lanes`` (see
    :func:`partition_layout`), ``parts = ctas / lanes``.

    Parameters
    ----------
    grid_x, ctas, lanes
        The plan's row blocks, the partition's CTAs and its lanes.
    """
    return (grid_x + ctas // lanes) * lanes


def partition_layout(rows: int, v_head_size: int, slots: int) -> tuple[int, int, int]:
    """The partition's workspace: f32 partials of ``slots`` row blocks (O [slots * 64,
    v_head_size], then the log-sum-exps [slots * 64]), then int32 [rows] chunk counts and
    int32 [rows] first slot rows. Row block ``x`` cut by part ``p`` of lane ``l`` writes slot
    ``(x + p) * lanes + l`` (unique: ``x`` and ``p`` both grow along a lane's line), so
    ``slots = (grid_x + parts) * lanes`` always suffices.

    Parameters
    ----------
    rows
        Tokens times heads.
    v_head_size
        Value width.
    slots
        Row-block slots.

    Returns
    -------
    tuple of int
        ``(lse_offset, counts_offset, total_bytes)``.
    """
    def up(n: int) -> int:
        return -(-n // WS_ALIGN) * WS_ALIGN

    lse_off = up(slots * _ROWS * v_head_size * 4)
    cnt_off = up(lse_off + slots * _ROWS * 4)
    return lse_off, cnt_off, cnt_off + 2 * rows * 4
