"""Balanced split-KV, host side: when it applies, its chunk cap and the pair kernel's persistent
grid (docs/notes/paged_attention.md#balanced-splits). The schedule itself is computed on the
device (``pa::balanced_plan`` in ``cuda/paged_common.cuh``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import PagedAttentionConfig, PagedPlan
    from .schema import PagedGeometry

__all__ = ["BALANCED_MAX_CHUNKS", "BALANCED_MAX_BATCH", "PAIR_UNITS", "balanced_chunks",
           "balanced_grid"]

#: Busy (row block, chunk) pairs one CTA of a balanced pair-kernel launch takes at most
#: (mirrors PAIR_UNITS in cuda/paged_mla_pair.cu): docs/notes/paged_attention.md#balanced-splits
PAIR_UNITS = 8
#: Balanced split-KV limits: the device model weighs at most this many chunk counts, and the
#: kernel's scratch (its key-tile stages, 144 KiB) holds 5 (B + 1) ints.
BALANCED_MAX_CHUNKS, BALANCED_MAX_BATCH = 64, 4096


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
    on = g.tokens > g.batch if config.balanced is None else config.balanced
    if (path != "wg" or not on or config.num_splits or splits <= 1
            or not 1 < g.batch <= BALANCED_MAX_BATCH):
        return 0
    return max(splits, min(2 * splits, config.max_splits, BALANCED_MAX_CHUNKS))


def balanced_grid(plan: PagedPlan, sms: int) -> int:
    """CTAs of a balanced pair-kernel launch: persistent, one per SM, each taking every
    ``grid``-th busy pair of the device schedule, and enough that none takes more than
    :data:`PAIR_UNITS` of the shapes' bound (``grid_x * max_chunks`` pairs).

    Parameters
    ----------
    plan
        A balanced ``wg`` plan.
    sms
        The device's multiprocessor count.

    Returns
    -------
    int
        The grid's size (its x dimension).
    """
    bound = plan.grid_x * plan.max_chunks
    return min(bound, max(sms, -(-bound // PAIR_UNITS)))
