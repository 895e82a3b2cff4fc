"""The float64 numpy reference of ``pkg.nxrt::IndexShare``: the oracle in tests and a CPU
fallback. Its math is independent of the planner, the builds and the kernel; it shares
only the input rules (:mod:`.schema`, :mod:`.indices`) with them.

For each (b, head h, query i) with kv head ``h // (N / Nkv)`` and index row
``selected_indices[b, 0 or h, i]`` (its entries before the trailing -1 padding),
``s_j = scale * q·K[key_j] + bias[b, h, i, key_j]``, ``Y = softmax(s) · V[key_j]``;
a row whose scores are all ``-inf`` gives zeros. The cache is ``past ⧺ current``
(present "none"/"concat") or, in "capacity" mode, ``past`` with the current tokens
written at ``valid_len[b] - Scur`` where ``valid_len[b]`` is one past the last column
that holds a finite bias value for batch ``b`` (over every head and query).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnrt.runtime.api import DataType, Node
from attnrt.runtime.errors import KernelError

from .indices import capacity_valid_lengths, check_selected_indices
from .schema import INPUT_NAMES, OP, _bias4, parse_attributes, resolve_geometry

__all__ = ["index_share", "capacity_valid_lengths"]  # the latter re-exported from .indices


def index_share(node: Node, inputs: Sequence[np.ndarray | None], present: str = "none",
                out_dtype: object | None = None) -> list[np.ndarray]:
    """``pkg.nxrt::IndexShare`` in float64.

    Parameters
    ----------
    node
        The node (``num_heads``, ``kv_num_heads``, ``scale``), checked as the kernel
        checks it (:func:`.schema.parse_attributes`; ``scale`` rounded to float32).
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
    TypeError
        ``node`` is not a :class:`Node` (or its attributes not a dict), ``inputs`` is not a
        list, or an input is neither a numpy array nor ``None``.
    KernelError
        The node, shapes, dtypes or attributes are refused (the kernel's rules, same
        messages), or a ``selected_indices`` row breaks a rule (:class:`SelectedIndicesError`).
    """
    attrs = parse_attributes(node)
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(f"{OP}: inputs must be a list of numpy arrays, got {type(inputs).__name__}")
    if len(inputs) > len(INPUT_NAMES):
        raise KernelError(f"{OP}: {len(inputs)} inputs given; the op defines at most "
                          f"{len(INPUT_NAMES)}")
    for i, a in enumerate(inputs):
        if a is not None and not isinstance(a, np.ndarray):
            raise TypeError(f"{OP}: inputs[{i}] ({INPUT_NAMES[i]}) is a {type(a).__name__}; "
                            "expected a numpy array or None for an absent slot")
    arrs = list(inputs) + [None] * (7 - len(inputs))
    shapes = [None if a is None else np.shape(a) for a in arrs]
    dtypes = [None if a is None else DataType.from_numpy(np.asarray(a).dtype) for a in arrs]
    g = resolve_geometry(attrs, shapes, dtypes, present)
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
    out = y.astype(g.dtype.numpy if out_dtype is None else np.dtype(out_dtype))
    if g.mode == "none":
        return [out]
    return [out, np.ascontiguousarray(kc), np.ascontiguousarray(vc)]
