"""The ``selected_indices`` row rules of ``pkg.nxrt::IndexShare``, pure numpy, and the
fixed-capacity bound they use (:func:`capacity_valid_lengths`).

The kernel checks eagerly with these (and, while capturing, the same rules on the device
with a latch bit); the reference checks with them too, so both name the same first
violation in (batch, head, query, column) order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnrt.runtime.errors import KernelError

from .schema import OP, _bias4

__all__ = ["IndexViolation", "SelectedIndicesError", "find_index_violation",
           "check_selected_indices", "capacity_valid_lengths"]

@dataclass(frozen=True)
class IndexViolation:
    """The first broken ``selected_indices`` rule: where, which rule, and why."""

    batch: int
    head: int
    query: int
    column: int
    kind: str  # sentinel | after_padding | out_of_range | duplicate | not_increasing | all_padding
    reason: str

    @property
    def coordinates(self) -> tuple[int, int, int, int]:
        """(batch, head, query, column) of the broken entry."""
        return (self.batch, self.head, self.query, self.column)

    def message(self) -> str:
        """The error text: coordinates and reason."""
        return (f"{OP}: selected_indices [batch={self.batch}, head={self.head}, "
                f"query={self.query}, column={self.column}]: {self.reason}")


class SelectedIndicesError(KernelError):
    """A ``selected_indices`` row broke a rule; ``.violation`` says where and which."""

    def __init__(self, violation: IndexViolation) -> None:
        self.violation = violation
        super().__init__(violation.message())


def _row_violations(rows: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column: which rule (0 none, 1..5) fires first; per row: all padding."""
    pad = rows == -1
    pad_before = np.zeros_like(pad)
    pad_before[:, 1:] = np.logical_or.accumulate(pad, axis=1)[:, :-1]
    prev = np.empty_like(rows)
    prev[:, 0] = -1
    prev[:, 1:] = rows[:, :-1]
    live = ~pad
    code = np.zeros(rows.shape, dtype=np.int8)
    # Checked in the seed's order; the first matching rule names the column.
    rules = (
        rows < -1,                                          # 1 sentinel
        pad_before,                                         # 2 after padding
        rows >= bounds[:, None],                            # 3 out of range
        (prev != -1) & (rows == prev),                      # 4 duplicate
        (prev != -1) & (rows < prev),                       # 5 not increasing
    )
    for num in range(len(rules), 0, -1):
        code = np.where(live & rules[num - 1], np.int8(num), code)
    return code, pad.all(axis=1)


_KINDS = {1: "sentinel", 2: "after_padding", 3: "out_of_range", 4: "duplicate",
          5: "not_increasing"}


def find_index_violation(indices: np.ndarray, bounds: Sequence[int] | np.ndarray | int,
                         chunk_elems: int = 1 << 22) -> IndexViolation | None:
    """The first rule broken by ``indices`` [B, HI, Sq, K], or ``None``.

    Rules per row, column by column (the reference design's order): an entry below -1
    (``sentinel``); a non-(-1) entry after a -1 (``after_padding``); an entry
    ``>= bounds[b]`` (``out_of_range``); an entry equal to (``duplicate``) or below
    (``not_increasing``) the previous one; then a row of only -1 (``all_padding``,
    reported at column 0). Rows are scanned in (batch, head, query) order.

    Parameters
    ----------
    indices
        int32 or int64 array of shape [B, HI, Sq, K].
    bounds
        The exclusive upper bound per batch (or one int for all).
    chunk_elems
        Rows are checked in chunks of about this many entries (bounded memory).

    Returns
    -------
    IndexViolation or None
        The first broken rule in (batch, head, query, column) order.

    Raises
    ------
    ValueError
        ``indices`` is not rank 4.
    """
    idx = np.asarray(indices)
    if idx.ndim != 4:
        raise ValueError(f"selected_indices must be rank 4, got shape {idx.shape}")
    nb, nh, nq, width = idx.shape
    bnd = np.broadcast_to(np.asarray(bounds, dtype=np.int64), (nb,))
    flat = idx.reshape(-1, width)
    rows_total = flat.shape[0]
    if rows_total == 0 or width == 0:
        return None
    per_batch = nh * nq
    step = max(1, chunk_elems // max(width, 1))
    for start in range(0, rows_total, step):
        rows = flat[start:start + step].astype(np.int64, copy=False)
        rb = bnd[(np.arange(start, start + rows.shape[0]) // per_batch)]
        code, allpad = _row_violations(rows, rb)
        bad_row = (code != 0).any(axis=1) | allpad
        if not bad_row.any():
            continue
        r = int(np.argmax(bad_row))
        g = start + r
        b, rem = divmod(g, per_batch)
        h, q = divmod(rem, nq)
        if allpad[r]:
            return IndexViolation(b, h, q, 0, "all_padding",
                                  "row is all -1 (no key selected)")
        c = int(np.argmax(code[r] != 0))
        kind = _KINDS[int(code[r, c])]
        val = int(rows[r, c])
        prev = int(rows[r, c - 1]) if c else None
        reason = {
            "sentinel": f"invalid sentinel {val} (only -1 may pad a row)",
            "after_padding": f"index {val} follows trailing -1 padding",
            "out_of_range": f"index {val} is out of range [0, {int(rb[r])})",
            "duplicate": f"duplicate index {val}",
            "not_increasing": f"indices are not strictly increasing: {prev} then {val}",
        }[kind]
        return IndexViolation(b, h, q, c, kind, reason)
    return None


def check_selected_indices(indices: np.ndarray, bounds: Sequence[int] | np.ndarray | int) -> None:
    """Raise :class:`SelectedIndicesError` (a ``KernelError``) at the first broken rule.

    Raises
    ------
    SelectedIndicesError
        The message names [batch, head, query, column] and the reason.
    """
    v = find_index_violation(indices, bounds)
    if v is not None:
        raise SelectedIndicesError(v)


def capacity_valid_lengths(bias: np.ndarray, batch: int, cache: int) -> np.ndarray:
    """Per batch: 1 + the last cache column with a finite bias (any head, query); 0 if none.

    A bias whose last axis broadcasts (size 1) covers every column, so a finite value
    there means the whole capacity is valid.

    Parameters
    ----------
    bias
        ``attention_bias``, broadcastable (right-aligned) to [B, N, S_q, cache].
    batch
        B.
    cache
        The capacity (the bias's last logical axis).

    Returns
    -------
    numpy.ndarray
        int64 [B]: each batch's valid length.
    """
    b4 = np.asarray(bias).reshape(_bias4(np.shape(bias)))
    fin = np.isfinite(b4.astype(np.float32)).any(axis=(1, 2))  # [b', k']
    if fin.shape[1] == 1:
        last = np.where(fin[:, 0], cache, 0)
    else:
        cols = np.arange(1, fin.shape[1] + 1)
        last = np.where(fin, cols[None, :], 0).max(axis=1) if fin.shape[1] else np.zeros(
            fin.shape[0], dtype=np.int64)
    return np.broadcast_to(np.asarray(last, dtype=np.int64), (batch,)).copy()
