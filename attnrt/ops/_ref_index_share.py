"""numpy reference of ``pkg.nxrt::IndexShare`` plus the pieces the kernel shares with it.

Shared with :mod:`attnrt.ops.index_share` (so the two refuse exactly the same inputs):

- :func:`parse_attributes` and :func:`resolve_geometry`: attribute and shape rules.
- :func:`find_index_violation` / :func:`check_selected_indices`: the ``selected_indices``
  row rules, pure numpy, first violation in (batch, head, query, column) order.
- :func:`capacity_valid_lengths`: the fixed-capacity valid length from the bias frontier.

Math (float64): for each (b, head h, query i) with kv head ``h // (N / Nkv)`` and index
row ``selected_indices[b, 0 or h, i]`` (its entries before the trailing -1 padding),
``s_j = scale * q·K[key_j] + bias[b, h, i, key_j]``, ``Y = softmax(s) · V[key_j]``;
a row whose scores are all ``-inf`` gives zeros. The cache is ``past ⧺ current``
(present "none"/"concat") or, in "capacity" mode, ``past`` with the current tokens
written at ``valid_len[b] - Scur`` where ``valid_len[b]`` is one past the last column
that holds a finite bias value for batch ``b`` (over every head and query).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnrt.runtime.api import DataType, Node
from attnrt.runtime.errors import KernelError

__all__ = [
    "Attributes", "Geometry", "IndexViolation", "SelectedIndicesError", "parse_attributes",
    "resolve_geometry", "find_index_violation", "check_selected_indices",
    "capacity_valid_lengths", "bias_strides", "index_share", "INPUT_NAMES", "OP",
]

OP = "pkg.nxrt::IndexShare"
INPUT_NAMES = ("query", "key", "value", "past_key", "past_value", "selected_indices",
               "attention_bias")
FLOAT_TYPES = (DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16)
INDEX_TYPES = (DataType.INT32, DataType.INT64)
MODES = ("none", "concat", "capacity")
_I31 = 2**31 - 1


@dataclass(frozen=True)
class Attributes:
    """The node's attributes, validated."""

    num_heads: int
    kv_num_heads: int
    scale: float | None  # None: 1/sqrt(head_size)


def parse_attributes(node: Node) -> Attributes:
    """Read and check ``num_heads``, ``kv_num_heads`` and ``scale``.

    Raises
    ------
    KernelError
        A missing or mistyped attribute, a non-positive head count, ``kv_num_heads``
        not dividing ``num_heads``, or a ``scale`` that is not finite and > 0.
    """
    try:
        n = node.attr_int("num_heads")
        nkv = node.attr_int("kv_num_heads", n)
        scale = node.attr_float("scale", None)
    except (TypeError, ValueError) as exc:
        raise KernelError(f"{OP}: {exc}") from None
    if n <= 0:
        raise KernelError(f"{OP}: attribute num_heads must be > 0, got {n}")
    if nkv <= 0 or n % nkv:
        raise KernelError(f"{OP}: attribute kv_num_heads={nkv} must be > 0 and divide "
                          f"num_heads={n}")
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise KernelError(f"{OP}: attribute scale must be finite and > 0, got {scale}")
    # The kernels take scale * log2(e) as a float32: it must stay finite and nonzero there.
    if scale is not None and not 1e-30 <= scale * math.log2(math.e) <= 1e38:
        raise KernelError(f"{OP}: attribute scale={scale} is outside the float32 range the "
                          "kernels compute in; use a scale in [1e-30, 6.9e37]")
    return Attributes(n, nkv, scale)


@dataclass(frozen=True)
class Geometry:
    """Every size the op needs, resolved from the input (and output) shapes."""

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    cur_len: int
    past_len: int
    head_size: int
    index_heads: int
    width: int  # K, columns of selected_indices
    mode: str  # none | concat | capacity
    dtype: DataType
    index_dtype: DataType
    bias_shape: tuple[int, ...] | None
    scale: float

    @property
    def total_len(self) -> int:
        return self.past_len + self.cur_len

    @property
    def cache_len(self) -> int:
        """Rows of the cache that indices address (the bias's last axis)."""
        return self.past_len if self.mode == "capacity" else self.total_len

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def has_past(self) -> bool:
        return self.past_len > 0 or self.mode == "capacity"

    @property
    def present_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.kv_heads, self.cache_len, self.head_size)


def _shape(shapes: Sequence, i: int) -> tuple[int, ...] | None:
    if i >= len(shapes) or shapes[i] is None:
        return None
    return tuple(int(d) for d in shapes[i])


def resolve_geometry(attrs: Attributes, shapes: Sequence, dtypes: Sequence, mode: str,
                     *, past_given: bool | None = None) -> Geometry:
    """Check input shapes/dtypes (schema order, ``None`` for absent) for ``mode``.

    Raises
    ------
    KernelError
        Any rank, dimension, dtype or presence rule is broken; the message names the input.
    """
    if mode not in MODES:
        raise ValueError(f"present must be one of {MODES}, got {mode!r}")
    if not 6 <= len(shapes) <= 7:
        raise KernelError(f"{OP}: expects 6 or 7 inputs (query, key, value, past_key, "
                          f"past_value, selected_indices[, attention_bias]), got {len(shapes)}")
    for i in (0, 1, 2, 5):
        if _shape(shapes, i) is None:
            raise KernelError(f"{OP}: required input {i} ({INPUT_NAMES[i]}) is absent")
    pk, pv = _shape(shapes, 3), _shape(shapes, 4)
    if (pk is None) != (pv is None):
        raise KernelError(f"{OP}: past_key and past_value must be given together "
                          f"(got past_key {'present' if pk else 'absent'}, past_value "
                          f"{'present' if pv else 'absent'})")
    dt = [None if i >= len(dtypes) or dtypes[i] is None else DataType(dtypes[i])
          for i in range(len(shapes))]
    fdt = dt[0]
    if fdt not in FLOAT_TYPES:
        raise KernelError(f"{OP}: query dtype {getattr(fdt, 'name', fdt)} unsupported; "
                          "expected FLOAT, FLOAT16 or BFLOAT16")
    for i in (1, 2, 3, 4, 6):
        if _shape(shapes, i) is not None and dt[i] != fdt:
            raise KernelError(f"{OP}: input {i} ({INPUT_NAMES[i]}) dtype "
                              f"{getattr(dt[i], 'name', dt[i])} must match query dtype {fdt.name}")
    if dt[5] not in INDEX_TYPES:
        raise KernelError(f"{OP}: selected_indices dtype {getattr(dt[5], 'name', dt[5])} "
                          "unsupported; expected INT32 or INT64")
    q, k, v, idx = (_shape(shapes, i) for i in (0, 1, 2, 5))
    for i, s in ((0, q), (1, k), (2, v), (3, pk), (4, pv), (5, idx)):
        if s is not None and len(s) != 4:
            raise KernelError(f"{OP}: input {i} ({INPUT_NAMES[i]}) must have rank 4, got shape {s}")
    b, n, sq, h = q
    if n != attrs.num_heads:
        raise KernelError(f"{OP}: query heads {n} (shape {q}) must equal num_heads={attrs.num_heads}")
    if h < 1:
        raise KernelError(f"{OP}: head size must be >= 1, got query shape {q}")
    nkv = attrs.kv_num_heads
    if k != v or k[0] != b or k[1] != nkv or k[3] != h:
        raise KernelError(f"{OP}: key {k} and value {v} must both be [B={b}, kv_num_heads={nkv}, "
                          f"S_cur, H={h}]")
    if k[2] < 1:
        raise KernelError(f"{OP}: key/value need at least one current token, got shape {k}")
    past = 0
    if pk is not None:
        if pk != pv or pk[0] != b or pk[1] != nkv or pk[3] != h:
            raise KernelError(f"{OP}: past_key {pk} and past_value {pv} must both be "
                              f"[B={b}, kv_num_heads={nkv}, S_past, H={h}]")
        past = pk[2]
    if mode == "capacity" and (pk is None or past < 1):
        raise KernelError(f"{OP}: fixed-capacity present needs past_key/past_value with a "
                          "nonzero capacity")
    if idx[0] != b or idx[1] not in (1, n) or idx[2] != sq:
        raise KernelError(f"{OP}: selected_indices shape {idx} must be [B={b}, 1 or {n}, "
                          f"S_q={sq}, K]")
    if idx[3] < 1:
        raise KernelError(f"{OP}: selected_indices needs K >= 1 columns, got shape {idx}")
    cache = past if mode == "capacity" else past + k[2]
    if cache > _I31 or idx[3] > _I31:
        raise KernelError(f"{OP}: cache length {cache} and K={idx[3]} must be < 2**31")
    bshape = _shape(shapes, 6) if len(shapes) > 6 else None
    if mode == "capacity" and bshape is None:
        raise KernelError(f"{OP}: fixed-capacity present needs attention_bias: its finite "
                          "frontier carries the valid length")
    if bshape is not None:
        target = (b, n, sq, cache)
        if len(bshape) > 4 or any(d not in (1, target[4 - len(bshape) + a])
                                  for a, d in enumerate(bshape)):
            raise KernelError(f"{OP}: attention_bias shape {bshape} is not broadcastable "
                              f"(right-aligned) to [B, N, S_q, cache] = {list(target)}")
    scale = attrs.scale if attrs.scale is not None else 1.0 / math.sqrt(h)
    return Geometry(b, n, nkv, sq, k[2], past, h, idx[1], idx[3], mode, fdt, dt[5],
                    bshape, float(scale))


# ---------------------------------------------------------------------------------------
# selected_indices rules
# ---------------------------------------------------------------------------------------

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
        return (self.batch, self.head, self.query, self.column)

    def message(self) -> str:
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


# ---------------------------------------------------------------------------------------
# bias helpers
# ---------------------------------------------------------------------------------------

def _bias4(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    return (1,) * (4 - len(shape)) + tuple(shape)  # type: ignore[return-value]


def bias_strides(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Element strides of a contiguous bias over logical [B, N, Sq, cache]; 0 broadcasts."""
    p = _bias4(shape)
    st, acc = [0, 0, 0, 0], 1
    for a in range(3, -1, -1):
        st[a] = acc if p[a] > 1 else 0
        acc *= p[a]
    return tuple(st)  # type: ignore[return-value]


def capacity_valid_lengths(bias: np.ndarray, batch: int, cache: int) -> np.ndarray:
    """Per batch: 1 + the last cache column with a finite bias (any head, query); 0 if none.

    A bias whose last axis broadcasts (size 1) covers every column, so a finite value
    there means the whole capacity is valid.
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


# ---------------------------------------------------------------------------------------
# the reference
# ---------------------------------------------------------------------------------------

def _np_dtype(dt: DataType) -> np.dtype:
    return dt.numpy


def index_share(node: Node, inputs: Sequence[np.ndarray | None], present: str = "none",
                out_dtype: object | None = None) -> list[np.ndarray]:
    """``pkg.nxrt::IndexShare`` in float64.

    Parameters
    ----------
    node
        The node (``num_heads``, ``kv_num_heads``, ``scale``).
    inputs
        query, key, value, past_key, past_value, selected_indices[, attention_bias] as
        numpy arrays (``None`` for absent).
    present
        ``"none"`` → ``[Y]``; ``"concat"`` → ``[Y, past ⧺ key, past ⧺ value]``;
        ``"capacity"`` → ``[Y, present_key, present_value]`` of the past's shape.
    out_dtype
        dtype of Y (default: the query's).

    Raises
    ------
    KernelError
        Shapes, dtypes or attributes are refused, or a ``selected_indices`` row breaks a
        rule (:class:`SelectedIndicesError`, same message as the kernel's).
    """
    arrs = list(inputs) + [None] * (7 - len(inputs))
    shapes = [None if a is None else np.shape(a) for a in arrs]
    dtypes = [None if a is None else DataType.from_numpy(np.asarray(a).dtype) for a in arrs]
    g = resolve_geometry(parse_attributes(node), shapes, dtypes, present)
    q, k, v, pk, pv, idx, bias = arrs
    cache = g.cache_len
    if g.mode == "capacity":
        valid = capacity_valid_lengths(bias, g.batch, cache)
        kc, vc = np.array(pk, copy=True), np.array(pv, copy=True)
        wpos = np.maximum(valid - g.cur_len, 0)
        for b in range(g.batch):
            for c in range(g.cur_len):
                t = int(wpos[b]) + c
                if t < cache:
                    kc[b, :, t] = k[b, :, c]
                    vc[b, :, t] = v[b, :, c]
        bounds: np.ndarray | int = valid
    else:
        kc = k if pk is None else np.concatenate([pk, k], axis=2)
        vc = v if pv is None else np.concatenate([pv, v], axis=2)
        bounds = cache
    check_selected_indices(idx, bounds)
    qf = np.asarray(q, dtype=np.float64)
    kf = np.asarray(kc, dtype=np.float64)
    vf = np.asarray(vc, dtype=np.float64)
    if bias is not None:
        bf = np.broadcast_to(np.asarray(bias, dtype=np.float64).reshape(_bias4(np.shape(bias))),
                             (g.batch, g.heads, g.q_len, cache))
    y = np.zeros(qf.shape, dtype=np.float64)
    grp = g.group
    for b in range(g.batch):
        for ih in range(g.index_heads):
            heads = range(g.heads) if g.index_heads == 1 else (ih,)
            for i in range(g.q_len):
                row = np.asarray(idx[b, ih, i], dtype=np.int64)
                sel = row[: int(np.argmax(row == -1)) if (row == -1).any() else row.size]
                for h in heads:
                    kv = h // grp
                    s = kf[b, kv, sel] @ qf[b, h, i] * g.scale
                    if bias is not None:
                        s = s + bf[b, h, i, sel]
                    m = s.max()
                    if not np.isfinite(m) and m < 0:
                        continue  # every score is -inf: the output row is 0
                    p = np.exp(s - m)
                    y[b, h, i] = (p / p.sum()) @ vf[b, kv, sel]
    out = y.astype(_np_dtype(g.dtype) if out_dtype is None else np.dtype(out_dtype))
    if g.mode == "none":
        return [out]
    return [out, np.ascontiguousarray(kc), np.ascontiguousarray(vc)]
