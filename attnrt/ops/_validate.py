"""Validation rules shared by every op: one rule per concept, applied identically by
``unsupported_reason``, ``create``, ``workspace_requirement``, ``execute`` and the reference.

- Shapes are Python ints (:func:`dims`): numpy integers are converted, anything else (a
  float, a bool) is refused, so a ``np.int32`` dimension can neither overflow nor truncate.
- Every view's byte span must fit the 64-bit pointer range (:func:`byte_span`).
- An output may not overlap itself (:func:`check_no_self_overlap`) nor any input
  (:func:`check_disjoint`) except where the op defines an alias.
- Absent optional slots are ``None`` or ``TensorView.absent_slot()``; both mean the same
  (:func:`views`); anything that is not a view is a ``TypeError`` naming the slot.
- The workspace of ``execute`` is a :class:`WorkspaceView` or ``None``
  (:func:`check_workspace_view`); anything else is a ``TypeError`` before any other check.
- Unknown attributes, and more inputs or outputs than the op defines, are refused
  (:func:`check_node`); integer attributes must be integers (:func:`int_attr`); float
  attributes are rounded to float32 once (:func:`float32_attr`), since that is the value the
  kernels compute with, and the reference uses the same rounded value.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from attnrt.runtime.api import Node, TensorMetadata, TensorView, WorkspaceView
from attnrt.runtime.errors import KernelError

__all__ = ["PTR_LIMIT", "dims", "byte_span", "check_view", "check_no_self_overlap", "check_disjoint",
           "views", "metas", "check_node", "int_attr", "float32_attr", "check_workspace_view"]

#: Byte offsets and addresses must stay below this (signed 64-bit pointer arithmetic).
PTR_LIMIT = 2**63


def check_workspace_view(workspace: Any, op: str) -> None:
    """Refuse a workspace that is neither a :class:`WorkspaceView` nor ``None``.

    Raises
    ------
    TypeError
        ``workspace`` is something else (a raw pointer, an array, ...).
    """
    if workspace is not None and not isinstance(workspace, WorkspaceView):
        raise TypeError(f"{op}: workspace must be a WorkspaceView or None, got "
                        f"{type(workspace).__name__}")


def dims(shape: Any, what: str, op: str) -> tuple[int, ...]:
    """``shape`` as a tuple of Python ints.

    Raises
    ------
    KernelError
        ``shape`` is not a sequence, a dimension is not an integer (a float, a bool, None),
        or a dimension is negative.
    """
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
        raise KernelError(f"{op}: {what} shape {shape!r} is not a sequence of integers")
    out = []
    for d in shape:
        if isinstance(d, (bool, np.bool_)):
            raise KernelError(f"{op}: {what} shape {list(shape)} has a bool dimension; expected integers")
        try:
            v = operator.index(d)
        except TypeError:
            raise KernelError(f"{op}: {what} shape {list(shape)} has a non-integer dimension {d!r}; "
                              "expected integers") from None
        if v < 0:
            raise KernelError(f"{op}: {what} shape {list(shape)} has a negative dimension")
        out.append(int(v))
    return tuple(out)


def byte_span(v: TensorView | TensorMetadata) -> tuple[int, int]:
    """The lowest and one-past-highest byte offsets ``v`` addresses, relative to its pointer
    (``(0, 0)`` for an empty tensor)."""
    if v.numel == 0:
        return 0, 0
    item = v.dtype.itemsize
    lo = sum((d - 1) * s for d, s in zip(v.shape, v.element_strides) if s < 0) * item
    hi = sum((d - 1) * s for d, s in zip(v.shape, v.element_strides) if s > 0) * item + item
    return lo, hi


def check_view(v: TensorView | TensorMetadata, name: str, op: str) -> None:
    """Refuse a view whose strides or byte span leave the 64-bit pointer range.

    Raises
    ------
    KernelError
        A stride's byte size, the span, or pointer + span is at least 2**63.
    """
    item = v.dtype.itemsize
    for d, s in zip(v.shape, v.element_strides):
        if abs(s) * item >= PTR_LIMIT:
            raise KernelError(f"{op}: input {name} has stride {s} (elements) on an axis of size {d}; "
                              "its byte offset does not fit a 64-bit pointer")
    lo, hi = byte_span(v)
    base = getattr(v, "ptr", 0)
    if hi - lo >= PTR_LIMIT or base + hi > 2**64 or base + lo < 0:
        raise KernelError(f"{op}: input {name} (shape {list(v.shape)}, strides {list(v.element_strides)}) "
                          "addresses bytes outside the 64-bit pointer range")


def check_no_self_overlap(v: TensorView, name: str, op: str) -> None:
    """Refuse an output whose elements share memory (a zero stride on a dimension > 1, or a
    stride smaller than the span of the faster-moving dimensions).

    Raises
    ------
    KernelError
        Two index tuples of ``v`` address the same element.
    """
    if v.numel == 0:  # no elements, nothing to overlap (whatever its strides)
        return None
    span = 1
    for d, s in sorted(((d, abs(s)) for d, s in zip(v.shape, v.element_strides) if d > 1),
                       key=lambda t: t[1]):
        if s < span:
            raise KernelError(f"{op}: output {name} (shape {list(v.shape)}, strides "
                              f"{list(v.element_strides)}) overlaps itself; expected distinct "
                              "elements (a non-zero stride at least the span of faster axes)")
        span = s * (d - 1) + span
    return None


def check_disjoint(outputs: Mapping[str, TensorView], inputs: Mapping[str, TensorView], op: str,
                   allowed: Iterable[tuple[str, str]] = ()) -> None:
    """Refuse an output whose bytes overlap an input's or another output's, except the
    (output, input) pairs in ``allowed`` (aliases the op defines, e.g. an in-place cache).

    Raises
    ------
    KernelError
        The two names and their byte ranges.
    """
    ok = {frozenset(p) for p in allowed}
    views_by_name = {**inputs, **outputs}
    ranges = {}
    for kind, group in (("output", outputs), ("input", inputs)):
        for n, v in group.items():
            if v is None or v.absent or v.numel == 0:
                continue
            lo, hi = byte_span(v)
            ranges[n] = (kind, v.ptr + lo, v.ptr + hi)
    names = list(ranges)
    for i, a in enumerate(names):
        if ranges[a][0] != "output":
            continue
        for b in names:
            if b == a or (ranges[b][0] == "output" and names.index(b) < i):
                continue
            if frozenset((a, b)) in ok:
                continue
            _, a0, a1 = ranges[a]
            kind, b0, b1 = ranges[b]
            if a0 < b1 and b0 < a1 and _elements_meet(views_by_name[a], views_by_name[b]):
                raise KernelError(f"{op}: output {a} [{a0:#x}, {a1:#x}) overlaps {kind} {b} "
                                  f"[{b0:#x}, {b1:#x}); outputs must not alias inputs or each other")


def views(items: Any, count: int, what: str, op: str, *, required: Sequence[int] = (),
          mutable: bool = False) -> list[TensorView]:
    """Normalise ``execute``'s inputs (or outputs) to ``count`` views, absent slots as
    ``TensorView.absent_slot()``; check each present view's pointer range.

    Raises
    ------
    TypeError
        ``items`` is not a list/tuple, or a slot holds something other than a view or ``None``.
    KernelError
        More than ``count`` slots, or a slot in ``required`` is absent.
    """
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{op}: {what} must be a list of TensorView, got {type(items).__name__}")
    if len(items) > count:
        raise KernelError(f"{op}: {len(items)} {what} given; the op defines at most {count}")
    out: list[TensorView] = []
    for i in range(count):
        v = items[i] if i < len(items) else None
        if v is None:
            v = TensorView.absent_slot()
        elif not isinstance(v, TensorView):
            raise TypeError(f"{op}: {what}[{i}] is a {type(v).__name__}; expected a TensorView "
                            f"{'(TensorMut) ' if mutable else ''}or None for an absent slot")
        if i in required and v.absent:
            raise KernelError(f"{op}: {what}[{i}] is required but absent")
        if not v.absent:
            check_view(v, f"{what}[{i}]", op)
        out.append(v)
    return out


def metas(items: Any, count: int, op: str) -> list[TensorMetadata | None]:
    """Normalise ``workspace_requirement``'s inputs: ``TensorMetadata``, a view (its
    ``.meta``) or ``None`` for an absent slot.

    Raises
    ------
    TypeError
        A slot holds a raw shape or any other object.
    KernelError
        More than ``count`` slots.
    """
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{op}: inputs must be a list of TensorMetadata, got {type(items).__name__}")
    if len(items) > count:
        raise KernelError(f"{op}: {len(items)} inputs given; the op defines at most {count}")
    out: list[TensorMetadata | None] = []
    for i in range(count):
        m = items[i] if i < len(items) else None
        if isinstance(m, TensorView):
            m = None if m.absent else m.meta
        elif m is not None and not isinstance(m, TensorMetadata):
            raise TypeError(f"{op}: inputs[{i}] is a {type(m).__name__}; expected TensorMetadata, "
                            "a TensorView or None (build one with TensorMetadata(dtype, shape))")
        if m is not None:
            check_view(m, f"inputs[{i}]", op)
        out.append(m)
    return out


def check_node(node: Any, op: str, domain: str, op_type: str, known: Iterable[str],
               max_inputs: int, max_outputs: int) -> None:
    """Refuse a node of another op, unknown attributes, or extra inputs/outputs.

    Raises
    ------
    TypeError
        ``node`` is not a :class:`Node` or its attributes are not a mapping.
    KernelError
        Wrong domain/op_type, an attribute the op does not define, or too many slots.
    """
    if not isinstance(node, Node):
        raise TypeError(f"{op}: expected a Node, got {type(node).__name__}")
    if not isinstance(node.attributes, Mapping):
        raise TypeError(f"{op}: node.attributes must be a dict, got {type(node.attributes).__name__}")
    if (node.domain, node.op_type) != (domain, op_type):
        raise KernelError(f"{op}: node is {node.domain}::{node.op_type}; expected {domain}::{op_type}")
    unknown = sorted(set(node.attributes) - set(known))
    if unknown:
        raise KernelError(f"{op}: unknown attribute(s) {unknown}; the op defines {sorted(known)}")
    if len(node.inputs) > max_inputs:
        raise KernelError(f"{op}: node has {len(node.inputs)} inputs; the op defines at most {max_inputs}")
    if len(node.outputs) > max_outputs:
        raise KernelError(f"{op}: node has {len(node.outputs)} outputs; the op defines at most "
                          f"{max_outputs}")


def int_attr(attrs: Mapping[str, Any], name: str, default: int, op: str) -> int:
    """An integer attribute: ints and numpy integers; a float (even ``1.0``) or a bool is refused.

    Raises
    ------
    KernelError
        The value is not an integer.
    """
    v = attrs.get(name, default)
    if isinstance(v, (bool, np.bool_)):
        raise KernelError(f"{op}: attribute {name}={v!r} is a bool; expected an integer")
    try:
        return int(operator.index(v))
    except TypeError:
        raise KernelError(f"{op}: attribute {name}={v!r} is not an integer") from None


def float32_attr(attrs: Mapping[str, Any], name: str, default: float, op: str) -> float:
    """A float attribute as the float32 value the kernels use (so ``1e-46`` is 0 for kernel
    and reference alike); NaN and infinities are refused.

    Raises
    ------
    KernelError
        The value is not a real number, or not finite in float32.
    """
    v = attrs.get(name, default)
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise KernelError(f"{op}: attribute {name}={v!r} is not a number")
    with np.errstate(over="ignore"):
        f = float(np.float32(v)) if math.isfinite(float(v)) else float(v)
    if not math.isfinite(f):
        raise KernelError(f"{op}: attribute {name}={v!r} is not finite in float32")
    return f


def _elements_meet(a: TensorView, b: TensorView) -> bool:
    """Whether two views whose byte ranges intersect share an element. Exact when both have
    the same itemsize and element strides (interleaved layouts, e.g. a batch stride that
    places another tensor between batches); otherwise True (the byte ranges decide)."""
    item = a.dtype.itemsize
    if (b.dtype.itemsize != item or a.rank != b.rank or a.element_strides != b.element_strides
            or (b.ptr - a.ptr) % item):
        return True
    dims = sorted(((abs(s), na, nb) for s, na, nb in zip(a.element_strides, a.shape, b.shape)
                   if max(na, nb) > 1), reverse=True)
    if any(s == 0 for s, _, _ in dims):
        return True
    # b.ptr - a.ptr == sum_k (i_k - j_k) * s_k for some index tuples i of a and j of b?
    # Digits d_k lie in [-(nb_k - 1), na_k - 1]; search them from the largest stride down,
    # keeping only digits whose remainder the smaller strides can still reach.
    reach = [(0, 0)] * (len(dims) + 1)
    for k in range(len(dims) - 1, -1, -1):
        s, na, nb = dims[k]
        lo, hi = reach[k + 1]
        reach[k] = (lo - (nb - 1) * s, hi + (na - 1) * s)
    budget = [4096]

    def search(k: int, rem: int) -> bool:
        if k == len(dims):
            return rem == 0
        budget[0] -= 1
        if budget[0] < 0:
            return True  # too many candidates to settle: keep the conservative answer
        s, na, nb = dims[k]
        lo, hi = reach[k + 1]
        first = max(-(nb - 1), -((hi - rem) // s))
        last = min(na - 1, (rem - lo) // s)
        return any(search(k + 1, rem - d * s) for d in range(first, last + 1))

    return search(0, (b.ptr - a.ptr) // item)
