"""What ``pkg.nxrt::IndexShare`` accepts: attributes, shapes, the index rules, the claim.

Shared by the kernel and the reference (:mod:`.reference`), so the two refuse exactly the
same inputs:

- :func:`parse_attributes` and :func:`resolve_geometry`: attribute and shape rules.
- :func:`bias_strides`: how a broadcast ``attention_bias`` is addressed.
- :func:`unsupported_reason`: the factory's claim-time gate (pure, no GPU).
- :func:`check_call`: ``execute``'s host-side checks of the views (before anything runs).

The shared rules of :mod:`attnrt.ops._validate` apply throughout: shapes are Python ints
(numpy integers converted, floats and bools refused); unknown attributes, a wrong
domain/op_type and more than 7 inputs or 3 outputs are refused; ``num_heads`` and
``kv_num_heads`` must be integers (``1.0`` and ``True`` are refused). ``scale`` is a
float32 attribute: it is rounded to float32 once, when parsed, and that value is what both
use. The kernel multiplies scores by ``float32(scale * log2(e))`` (base-2 softmax); the
reference computes with ``scale`` in float64. A scale that is zero, subnormal-small or
infinite in float32 is refused. The default ``1/sqrt(H)`` is not an attribute and is not
rounded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from attnrt.runtime.api import DataType, Node
from attnrt.runtime.errors import KernelError

from .. import _validate as _v

__all__ = [
    "Attributes", "Geometry", "parse_attributes", "resolve_geometry", "bias_strides",
    "unsupported_reason", "check_call", "INPUT_NAMES", "OUTPUT_NAMES", "ATTRIBUTES", "OP",
    "FLOAT_TYPES", "INDEX_TYPES", "MODES",
]

OP = "pkg.nxrt::IndexShare"
INPUT_NAMES = ("query", "key", "value", "past_key", "past_value", "selected_indices",
               "attention_bias")
OUTPUT_NAMES = ("Y", "present_key", "present_value")
#: The attributes the op defines; any other is refused.
ATTRIBUTES = ("num_heads", "kv_num_heads", "scale")
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
    """Check the node (domain, op_type, attributes, slot counts) and read ``num_heads``,
    ``kv_num_heads`` and ``scale`` (rounded to float32).

    Raises
    ------
    TypeError
        ``node`` is not a :class:`Node` or its attributes are not a dict.
    KernelError
        Another op, an unknown or missing attribute, a non-integer head count, more than
        7 inputs or 3 outputs, a non-positive head count, ``kv_num_heads`` not dividing
        ``num_heads``, or a ``scale`` that is not finite and > 0 in float32.
    """
    _v.check_node(node, OP, "pkg.nxrt", "IndexShare", ATTRIBUTES, len(INPUT_NAMES),
                  len(OUTPUT_NAMES))
    attrs = node.attributes
    if "num_heads" not in attrs:
        raise KernelError(f"{OP}: required attribute 'num_heads' (an int) is missing")
    n = _v.int_attr(attrs, "num_heads", 0, OP)
    nkv = _v.int_attr(attrs, "kv_num_heads", n, OP)
    scale = _v.float32_attr(attrs, "scale", 1.0, OP) if "scale" in attrs else None
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
        """Past plus current tokens (the growing present's length)."""
        return self.past_len + self.cur_len

    @property
    def cache_len(self) -> int:
        """Rows of the cache that indices address (the bias's last axis)."""
        return self.past_len if self.mode == "capacity" else self.total_len

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.heads // self.kv_heads

    @property
    def has_past(self) -> bool:
        """Whether a past cache takes part (always in fixed-capacity mode)."""
        return self.past_len > 0 or self.mode == "capacity"

    @property
    def present_shape(self) -> tuple[int, int, int, int]:
        """[B, Nkv, cache, H]: the present outputs' shape in this mode."""
        return (self.batch, self.kv_heads, self.cache_len, self.head_size)


def _shape(shapes: Sequence, i: int) -> tuple[int, ...] | None:
    if i >= len(shapes) or shapes[i] is None:
        return None
    return _v.dims(shapes[i], INPUT_NAMES[i] if i < len(INPUT_NAMES) else f"input {i}", OP)


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


# ---------------------------------------------------------------------------------------
# the outputs (host-side checks of the kernel's tensors, from metadata alone)
# ---------------------------------------------------------------------------------------

def _is_present(t: Any) -> bool:
    return t is not None and not getattr(t, "absent", False)


def _present_mode(ins: list, outs: list) -> str:
    """The present mode the outputs ask for: "none", "concat" or "capacity"."""
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


def _check_outputs(g: Geometry, q: Any, y: Any, prk: Any, prv: Any) -> None:
    """Y matches the query; every output has the dtype, no self-overlap, and is contiguous."""
    if tuple(y.shape) != tuple(q.shape) or y.dtype != g.dtype:
        raise KernelError(f"{OP}: output Y must be {g.dtype.name} {list(q.shape)}, got "
                          f"{y.dtype.name} {list(y.shape)}")
    for name, t in (("Y", y), ("present_key", prk), ("present_value", prv)):
        if t is None:
            continue
        if t.dtype != g.dtype:
            raise KernelError(f"{OP}: output {name} dtype {t.dtype.name} must be {g.dtype.name}")
        _v.check_no_self_overlap(t, name, OP)
        if not t.is_contiguous:
            raise KernelError(f"{OP}: output {name} must be contiguous, got strides {t.strides}")


def _check_aliasing(g: Geometry, ins: list, y: Any, prk: Any, prv: Any) -> None:
    """No output overlaps an input or another output, but a fixed-capacity present may
    alias its past tensor exactly (the in-place cache; shape, dtype and contiguity already
    match, so the same pointer means the same bytes)."""
    allowed = []
    if g.mode == "capacity":
        for out, past, name in ((prk, ins[3], "key"), (prv, ins[4], "value")):
            if out.ptr == past.ptr:
                allowed.append((f"present_{name}", f"past_{name}"))
    outs = {n: t for n, t in zip(OUTPUT_NAMES, (y, prk, prv)) if t is not None}
    _v.check_disjoint(outs, {n: t for n, t in zip(INPUT_NAMES, ins) if _is_present(t)}, OP,
                      allowed)


def check_call(attrs: Attributes, inputs: Any, outputs: Any) -> tuple[Geometry, list, list]:
    """``execute``'s host-side checks, from the views alone (nothing is read or launched).

    Returns
    -------
    tuple
        The geometry, the 7 inputs (``None`` where absent) and the outputs ``[Y, present_key,
        present_value]`` (``None`` where not written).

    Raises
    ------
    TypeError
        ``inputs``/``outputs`` are not lists, or a slot holds something other than a view
        or ``None``.
    KernelError
        Too many slots, a required one absent, or a shape, dtype, stride, pointer-range or
        aliasing rule broken.
    """
    ins = _v.views(inputs, len(INPUT_NAMES), "inputs", OP)
    outs = _v.views(outputs, len(OUTPUT_NAMES), "outputs", OP, required=(0,), mutable=True)
    mode = _present_mode(ins, list(outputs))
    present = [_is_present(t) for t in ins]
    g = resolve_geometry(attrs, [t.shape if p else None for t, p in zip(ins, present)],
                         [t.dtype if p else None for t, p in zip(ins, present)], mode)
    views = [t if p else None for t, p in zip(ins, present)]
    y, prk, prv = outs if mode != "none" else (outs[0], None, None)
    _check_outputs(g, views[0], y, prk, prv)
    for i, t in enumerate(views):
        if t is not None and not t.is_contiguous:
            raise KernelError(f"{OP}: input {i} must be contiguous (strides {t.strides} for "
                              f"shape {t.shape}); supports_strided_input() is False")
    _check_aliasing(g, views, y, prk, prv)
    if g.mode == "capacity" and g.batch > 65535:
        raise KernelError(f"{OP}: fixed-capacity mode supports batch <= 65535, got {g.batch}")
    return g, views, [y, prk, prv]


# ---------------------------------------------------------------------------------------
# the claim
# ---------------------------------------------------------------------------------------

def _max_head_size(dt: DataType, head: int) -> int:
    """The widest head the CUDA-core path serves (16-byte chunks when H allows, else 4-byte)."""
    wide = 16 // dt.itemsize
    return 64 * wide if head % wide == 0 else 128


def unsupported_reason(node: Node, shapes: Sequence[Sequence[int] | None],
                       dtypes: Sequence[DataType | None]) -> str | None:
    """Whether the kernel takes ``node`` (pure, no GPU).

    Parameters
    ----------
    node
        The node to claim.
    shapes, dtypes
        Input shapes and dtypes in schema order (``None`` for absent or unknown); with
        every required shape known, the geometry is checked too.

    Returns
    -------
    str or None
        ``None`` when the kernel takes the node, else why not.
    """
    if not isinstance(node, Node):
        return f"{OP}: expected a Node, got {type(node).__name__}"
    if (node.domain, node.op_type) != ("pkg.nxrt", "IndexShare"):
        return f"{OP}: not this op ({node.domain}::{node.op_type})"
    try:
        attrs = parse_attributes(node)
    except (KernelError, TypeError) as exc:
        return str(exc)
    if len(shapes) > len(INPUT_NAMES) or len(dtypes) > len(INPUT_NAMES):
        return f"{OP}: {max(len(shapes), len(dtypes))} input shapes/dtypes given; the op defines 7"
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
