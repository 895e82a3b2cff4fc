"""The ``pkg.nxrt::Attention`` schema: attributes, shapes, dtypes and the claim-time gate.

Everything here is pure host code on metadata; the kernel and the numpy reference share it,
so both refuse the same inputs with the same messages. The rules are the shared ones of
:mod:`attnrt.ops._validate`:

- shapes are normalised to Python ints first (a ``np.int32`` dim cannot overflow a size
  check; a float or bool dim is refused);
- the node may carry only the attributes in :data:`ATTRIBUTES`, at most 4 inputs and 1
  output, and must be ``pkg.nxrt::Attention``; integer attributes must be integers;
- ``scale`` and ``softcap`` are rounded to float32 once, here: that is the value the kernels
  compute with, and the reference uses the same value (``softcap=1e-46`` is 0 in float32, so
  it disables the cap in both);
- :func:`check_call` (``execute``) refuses views outside the 64-bit pointer range, an
  output that overlaps itself, and an output that overlaps an input (Attention defines no
  alias); ``None`` and ``TensorView.absent_slot()`` are one absent slot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnrt.runtime.api import DataType, Node, TensorMetadata, TensorView
from attnrt.runtime.errors import KernelError

from .. import _validate as V

__all__ = ["OP", "DOMAIN", "OP_TYPE", "SUPPORTED", "INPUT_NAMES", "ATTRIBUTES", "Attrs", "Dims",
           "parse_attributes", "check_node", "check_dims", "check_io",
           "unsupported_reason", "tc_layout_ok"]

OP = "pkg.nxrt::Attention"
DOMAIN, OP_TYPE = "pkg.nxrt", "Attention"
SUPPORTED = (DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16)
INPUT_NAMES = ("Q", "K", "V", "mask")
ATTRIBUTES = ("num_heads", "kv_num_heads", "causal", "scale", "softcap", "local_window_size")
I32 = 2**31 - 1
POS_MAX = 2**31 - 256  # int32 positions and row indices, with room for one tile past the end


def _f32_finite(x: float) -> bool:
    # The kernels take float32 scalars: 1e39 is finite in Python and inf on the device.
    with np.errstate(over="ignore"):
        return math.isfinite(x) and bool(np.isfinite(np.float32(x)))


def fmt(shape: Sequence[int]) -> str:
    """``[a, b, c]``: a shape or stride list as the error messages print it."""
    return "[" + ", ".join(map(str, shape)) + "]"


@dataclass(frozen=True)
class Attrs:
    """The node's attributes, validated.

    Attributes
    ----------
    num_heads, kv_num_heads
        Query heads H and KV heads Hkv (a divisor of H).
    causal
        Bottom-right aligned causal masking.
    scale
        Score scale; None means ``1/sqrt(D)``.
    softcap
        ``softcap * tanh(s / softcap)`` on the scores; 0 disables it.
    local_window_size
        Keys with ``p - j <= w`` are visible; -1 disables the window.
    """

    num_heads: int
    kv_num_heads: int
    causal: bool
    scale: float | None
    softcap: float
    local_window_size: int


def _f32_attr(attrs: Any, name: str) -> float:
    # The shared rounding rule; a value that is not finite in float32 is returned as inf so
    # that the op's own range message (below) names it.
    v = attrs[name]
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)):
        try:
            if not _f32_finite(float(v)):
                return math.inf if float(v) == float(v) else math.nan
        except OverflowError:
            return math.inf
    return _named(V.float32_attr, attrs, name, 0.0)


def _named(rule: Any, attrs: Any, name: str, default: Any) -> Any:
    # The shared rule, with the message naming the attribute as this op's messages do.
    try:
        return rule(attrs, name, default, OP)
    except KernelError as exc:
        raise KernelError(f"{OP}: attribute {name!r}: {str(exc).removeprefix(OP + ': ')}") from None


def check_node(node: Any) -> None:
    """The node rules: ``pkg.nxrt::Attention``, known attributes only, at most 4 inputs
    (Q, K, V, mask) and 1 output.

    Raises
    ------
    TypeError
        ``node`` is not a :class:`Node`, or its attributes are not a dict.
    KernelError
        The message names what is wrong.
    """
    V.check_node(node, OP, DOMAIN, OP_TYPE, ATTRIBUTES, 4, 1)


def parse_attributes(node: Node) -> Attrs:
    """Read and validate the attributes of an Attention node.

    Parameters
    ----------
    node
        The ``pkg.nxrt::Attention`` node.

    Returns
    -------
    Attrs
        The validated attributes.

    Raises
    ------
    TypeError
        ``node`` is not a :class:`Node`, or its attributes are not a dict.
    KernelError
        Another op, an unknown attribute, too many inputs/outputs, or an attribute missing,
        mistyped or out of range; the message names it.
    """
    check_node(node)
    a = node.attributes
    if "num_heads" not in a:
        raise KernelError(f"{OP}: attribute 'num_heads' is required")
    num_heads = _named(V.int_attr, a, "num_heads", 0)
    if num_heads <= 0:
        raise KernelError(f"{OP}: attribute 'num_heads' = {num_heads}; expected a positive int")
    kv = _named(V.int_attr, a, "kv_num_heads", num_heads)
    if kv <= 0 or num_heads % kv:
        raise KernelError(f"{OP}: attribute 'kv_num_heads' = {kv}; expected a positive divisor "
                          f"of num_heads = {num_heads}")
    causal = _named(V.int_attr, a, "causal", 0)
    if causal not in (0, 1):
        raise KernelError(f"{OP}: attribute 'causal' = {causal}; expected 0 or 1")
    scale = _f32_attr(a, "scale") if "scale" in a else None
    if scale is not None and not (_f32_finite(scale) and scale > 0):
        raise KernelError(f"{OP}: attribute 'scale' = {a['scale']}; expected a value > 0 that is finite "
                          "in float32 (omit it for 1/sqrt(head_dim))")
    softcap = _f32_attr(a, "softcap") if "softcap" in a else 0.0
    if not (_f32_finite(softcap) and softcap >= 0):
        raise KernelError(f"{OP}: attribute 'softcap' = {a.get('softcap', 0.0)}; expected a value "
                          ">= 0 that is finite in float32 (0 disables it)")
    window = _named(V.int_attr, a, "local_window_size", -1)
    if window < -1:
        raise KernelError(f"{OP}: attribute 'local_window_size' = {window}; expected -1 "
                          "(disabled) or a window >= 0")
    return Attrs(num_heads, kv, bool(causal), scale, softcap, window)


@dataclass(frozen=True)
class Dims:
    """Problem sizes: batch, heads, kv heads, query/key lengths, head dim, mask planes.

    ``mask_planes`` is 0 without a mask, else 1, B or B·H.
    """

    B: int
    H: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    mask_planes: int

    @property
    def group(self) -> int:
        """G = H / Hkv: the query heads that share one KV head."""
        return self.H // self.Hkv

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        """The output's shape [B, H, Sq, D]."""
        return (self.B, self.H, self.Sq, self.D)

    @property
    def empty(self) -> bool:
        """Whether the output has no elements (nothing to launch)."""
        return self.B * self.H * self.Sq * self.D == 0


def check_dims(attrs: Attrs, q: Sequence[int], k: Sequence[int], v: Sequence[int],
               mask: Sequence[int] | None = None, out: Sequence[int] | None = None) -> Dims:
    """Validate the shapes of Q, K, V (and the mask and output when given).

    Parameters
    ----------
    attrs
        The node's attributes (head counts).
    q, k, v
        Shapes of Q [B, H, Sq, D], K and V [B, Hkv, Sk, D].
    mask
        The mask's shape (1, B or B·H planes of [Sq, Sk] elements), or None.
    out
        The output's shape, or None.

    Returns
    -------
    Dims
        The problem sizes.

    Raises
    ------
    KernelError
        A shape does not fit, or a dimension is not an integer (numpy integers are taken as
        Python ints); the message names the input, its shape and the expectation.
    """
    q, k, v = (V.dims(x, n, OP) for x, n in ((q, "input Q (0)"), (k, "input K (1)"), (v, "input V (2)")))
    mask = None if mask is None else V.dims(mask, "input mask (3)", OP)
    out = None if out is None else V.dims(out, "output 0", OP)
    for name, idx, s in (("Q", 0, q), ("K", 1, k), ("V", 2, v)):
        if len(s) != 4:
            raise KernelError(f"{OP}: input {name} ({idx}) has shape {fmt(s)} (rank {len(s)}); "
                              "expected rank 4 [batch, heads, seq, head_dim]")
    B, H, Sq, D = q
    if H != attrs.num_heads:
        raise KernelError(f"{OP}: input Q (0) has {H} heads (shape {fmt(q)}); expected "
                          f"num_heads = {attrs.num_heads}")
    want_k = (B, attrs.kv_num_heads, k[2], D)
    if k != want_k:
        raise KernelError(f"{OP}: input K (1) has shape {fmt(k)}; expected [B={B}, "
                          f"kv_num_heads={attrs.kv_num_heads}, Sk, D={D}]")
    Sk = k[2]
    if v != k:
        raise KernelError(f"{OP}: input V (2) has shape {fmt(v)}; expected K's shape {fmt(k)}")
    # The kernels index rows, positions and heads in int32 (offsets are 64-bit).
    for what, val in (("B", B), ("num_heads", H), ("Sq", Sq), ("Sk", Sk), ("head_dim D", D),
                      ("B*num_heads", B * H)):
        if val > I32:
            raise KernelError(f"{OP}: {what} = {val}; expected at most 2**31-1")
    if Sq + Sk > POS_MAX:
        raise KernelError(f"{OP}: Sq + Sk = {Sq + Sk} positions; expected at most {POS_MAX}")
    if H // attrs.kv_num_heads * Sq > POS_MAX:
        raise KernelError(f"{OP}: (num_heads/kv_num_heads) * Sq = "
                          f"{H // attrs.kv_num_heads * Sq} packed query rows; expected at most "
                          f"{POS_MAX}")
    planes = 0
    if mask is not None:
        n = math.prod(mask)
        plane = Sq * Sk
        ok = (n == 0) if plane == 0 else (n % plane == 0 and n // plane in (1, B, B * H))
        if not ok:
            raise KernelError(
                f"{OP}: input mask (3) has shape {fmt(mask)} ({n} elements); expected 1, B={B} "
                f"or B*H={B * H} planes of [Sq={Sq}, Sk={Sk}] = {plane} elements each")
        planes = n // plane if plane else 1
    dims = Dims(B, H, attrs.kv_num_heads, Sq, Sk, D, planes)
    if out is not None and out != dims.out_shape:
        raise KernelError(f"{OP}: output 0 has shape {fmt(out)}; expected {fmt(dims.out_shape)}")
    return dims


def check_io(node: Node, attrs: Attrs, inputs: list, out: TensorView | None, *, host: bool = False
             ) -> tuple[Dims, DataType]:
    """Validate the kernel's inputs (and output) from metadata: count, dtypes, shapes, strides.

    Parameters
    ----------
    node
        The node (says whether its mask slot is present when ``inputs[3]`` is metadata).
    attrs
        Its attributes.
    inputs
        ``[Q, K, V]`` or ``[Q, K, V, mask]`` as :class:`TensorView` or :class:`TensorMetadata`
        (None for an absent mask).
    out
        The output, or None while planning.
    host
        The reference's call: a mask given as metadata is present whatever the node says.

    Returns
    -------
    tuple[Dims, DataType]
        The problem sizes and the element type.

    Raises
    ------
    KernelError
        An input is missing, or a dtype, shape or stride does not fit.
    """
    if not 3 <= len(inputs) <= 4:
        raise KernelError(f"{OP}: expected 3 inputs (Q, K, V) or 4 (Q, K, V, mask), "
                          f"got {len(inputs)}")
    for i in range(3):
        if inputs[i] is None or getattr(inputs[i], "absent", False):
            raise KernelError(f"{OP}: input {INPUT_NAMES[i]} ({i}) is required but absent")
    mask = None
    if len(inputs) == 4 and inputs[3] is not None:
        m = inputs[3]
        # Planning gets None (or, from older executors, the absent slot's metadata).
        present = (not m.absent) if isinstance(m, TensorView) else host or node.input_present(3)
        mask = m if present else None
    dtype = inputs[0].dtype
    if dtype not in SUPPORTED:
        raise KernelError(f"{OP}: input Q (0) has dtype {dtype.name}; expected one of "
                          f"{', '.join(d.name for d in SUPPORTED)}")
    named = [(f"input {INPUT_NAMES[i]} ({i})", inputs[i]) for i in (1, 2)]
    if mask is not None:
        named.append(("input mask (3)", mask))
    if out is not None:
        named.append(("output 0", out))
    for label, t in named:
        if t.dtype != dtype:
            raise KernelError(f"{OP}: {label} has dtype {t.dtype.name}; expected Q's "
                              f"{dtype.name}")
    dims = check_dims(attrs, inputs[0].shape, inputs[1].shape, inputs[2].shape,
                      None if mask is None else mask.shape,
                      None if out is None else out.shape)
    strided = [("input Q (0)", inputs[0]), ("input K (1)", inputs[1]),
               ("input V (2)", inputs[2])] + ([("output 0", out)] if out is not None else [])
    for label, t in strided:
        st = t.element_strides
        if t.shape[3] > 1 and st[3] != 1:
            raise KernelError(f"{OP}: {label} has strides {fmt(st)} (elements); expected a "
                              "unit stride on the last (head_dim) axis — make it contiguous")
    if mask is not None and not mask.is_contiguous:
        raise KernelError(f"{OP}: input mask (3) has strides {fmt(mask.element_strides)}; "
                          "expected a contiguous mask (supports_strided_input(3) is False)")
    return dims, dtype


def tc_layout_ok(meta: TensorMetadata | TensorView) -> bool:
    """Whether the tensor-core kernels can read this layout: a unit D stride and B/H/S
    strides that are multiples of 8 elements (16-byte rows)."""
    st = meta.element_strides
    return st[3] == 1 and all(s % 8 == 0 or d == 1 for s, d in zip(st[:3], meta.shape[:3]))


def unsupported_reason(node: Node, shapes: Sequence[Sequence[int] | None],
                       dtypes: Sequence[DataType | None]) -> str | None:
    """Why this op declines ``node`` with these input shapes/dtypes (pure, no GPU).

    Parameters
    ----------
    node
        The node to claim.
    shapes, dtypes
        Per input slot, its shape and dtype (None where unknown or absent).

    Returns
    -------
    str or None
        None when the op takes the node, else the reason.
    """
    if not isinstance(node, Node):
        return f"{OP}: expected a Node, got {type(node).__name__}"
    if (node.domain, node.op_type) != (DOMAIN, OP_TYPE):
        return f"not {OP} (got {node.domain}::{node.op_type})"
    n_in = len(node.inputs) if node.inputs else len(shapes)
    if n_in not in (3, 4):
        return f"{OP} takes 3 inputs (Q, K, V) or 4 (Q, K, V, mask); the node has {n_in}"
    if len(node.outputs) > 1:
        return f"{OP} has one output; the node has {len(node.outputs)}"
    try:
        attrs = parse_attributes(node)
    except (KernelError, TypeError) as exc:
        return str(exc)
    if len(shapes) > len(INPUT_NAMES) or len(dtypes) > len(INPUT_NAMES):
        return (f"{OP}: {max(len(shapes), len(dtypes))} input shapes/dtypes given; the op defines "
                f"at most {len(INPUT_NAMES)}")
    for i in range(3):
        if node.inputs and not node.input_present(i):
            return f"input {INPUT_NAMES[i]} ({i}) is required but absent"
    dts = list(dtypes) + [None] * (4 - len(dtypes))
    if dts[0] is not None and DataType(dts[0]) not in SUPPORTED:
        return (f"Q dtype {DataType(dts[0]).name} is not supported (supported: "
                f"{', '.join(d.name for d in SUPPORTED)})")
    mask_present = len(shapes) > 3 and shapes[3] is not None and (
        not node.inputs or node.input_present(3))
    for i in (1, 2, 3):
        if i == 3 and not mask_present:
            continue
        if dts[0] is not None and dts[i] is not None and dts[i] != dts[0]:
            return (f"input {INPUT_NAMES[i]} ({i}) dtype {DataType(dts[i]).name} differs from "
                    f"Q's {DataType(dts[0]).name}")
    if len(shapes) >= 3 and all(s is not None for s in shapes[:3]):
        try:
            check_dims(attrs, shapes[0], shapes[1], shapes[2],  # type: ignore[arg-type]
                       shapes[3] if mask_present else None)
        except KernelError as exc:
            return str(exc)
    return None
