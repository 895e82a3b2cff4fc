"""Fuzzing ``pkg.nxrt::Attention``: random valid and invalid nodes and inputs (hypothesis).

CPU half (runs in CI, no GPU): the op runs against :class:`tests._fakes.FakeRuntime`, which
hands out fake pointers and records launches without running them. The properties are the
shared harness's (:mod:`tests._fuzz`); this module holds Attention's strategies and mutations.

- Valid cases are claimed (``unsupported_reason`` is None), plan and execute, and every
  launch is one the driver would take (grid, block, shared memory, argument kinds, pointers
  inside known tensors); nothing stays allocated.
- Invalid cases (one mutation of a valid case: a wrong rank or dim, a mismatched dtype, an
  absent required input, an out-of-range attribute, a non-unit head_dim stride, ...) raise
  ``KernelError``, ``Unsupported`` or ``ValueError`` and launch nothing.
- Oversized cases (one dim at or past 2**16 / 2**31 / 2**32) are refused by planning
  (``workspace_requirement`` or earlier) or run with legal launches; never an
  ``OverflowError`` or a refusal that only ``execute`` notices.
- Issue 37's classes (``ISSUE37``: numpy/float dims, strides past the pointer range, output
  overlap, absent slots and wrong objects, extra slots/attributes and a wrong op, float32
  attributes) over the full path: a typed error or success as the class predicts, and the
  reference refuses a bad node with the kernel's error.

GPU half (``TestDevice``, marked gpu): random valid cases on the device against
``attnrt.ops.reference`` (bounded: head dims 24/64, small shapes).
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from attnrt.ops.attention import AttentionConfig, AttentionFactory, parse_attributes, reference
from attnrt.runtime.api import DataType, Node, TensorMut, TensorView, WorkspaceView
from attnrt.runtime.errors import KernelError
from tests._fakes import GPU_SETTINGS, FakeRuntime
from tests._fuzz import BIG, DROP, OpFuzz, attempt, attr_mutation, host_tests, remember, reshaped, retyped
from tests._nodes import attention_node

F32, F16, BF16 = DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16


# --------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class Spec:
    """One Attention call, described without memory: sizes, attributes, layouts, path."""

    dtype: DataType
    B: int
    H: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    attrs: tuple  # sorted (name, value) pairs
    planes: int  # mask planes: 0 (no mask), 1, B or B*H
    mask_style: str  # "3d" [planes, Sq, Sk] | "4d" [b, h, Sq, Sk]
    layouts: tuple[str, str, str, str]  # Q, K, V, O: contig | bshd | pad8 | pad3
    path: str
    num_splits: int | None
    use_ws: bool
    seed: int = 0

    @property
    def node(self) -> Node:
        return attention_node(dict(self.attrs), bool(self.planes))

    def shape(self, i: int) -> tuple[int, ...]:
        if i in (0, 3):
            return (self.B, self.H, self.Sq, self.D)
        return (self.B, self.Hkv, self.Sk, self.D)

    def mask_shape(self) -> tuple[int, ...]:
        p = self.planes
        if self.mask_style == "3d":
            return (p, self.Sq, self.Sk)
        if p == self.B * self.H:
            lead = (self.B, self.H)
        elif p == self.B:
            lead = (self.B, 1)
        else:
            lead = (1, 1)
        return (*lead, self.Sq, self.Sk)


def layout_strides(shape: tuple[int, ...], layout: str) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """(storage shape, strides of the logical [B, X, S, D] view; None when contiguous)."""
    B, X, S, D = shape
    if layout == "bshd":  # memory [B, S, X, D]
        return (B, S, X, D), (S * X * D, D, X * D, 1)
    if layout.startswith("pad"):
        P = D + int(layout[3:])
        return (B, X, S, P), (X * S * P, S * P, P, 1)
    return shape, None


def to_storage(a: np.ndarray, layout: str) -> np.ndarray:
    if layout == "bshd":
        return np.ascontiguousarray(a.transpose(0, 2, 1, 3))
    if layout.startswith("pad"):
        pad = int(layout[3:])
        filler = np.full(a.shape[:3] + (pad,), 7, dtype=a.dtype)  # never read
        return np.ascontiguousarray(np.concatenate([a, filler], axis=-1))
    return np.ascontiguousarray(a)


def from_storage(s: np.ndarray, layout: str, D: int) -> np.ndarray:
    if layout == "bshd":
        return s.transpose(0, 2, 1, 3)
    if layout.startswith("pad"):
        return s[..., :D]
    return s


@st.composite
def specs(draw: Any, gpu: bool = False) -> Spec:
    dtype = draw(st.sampled_from([F32, F16, BF16]))
    Hkv = draw(st.integers(1, 3))
    G = draw(st.sampled_from([1, 2, 3, 4, 8]))
    B = draw(st.integers(1, 3 if gpu else 4))
    if gpu:
        Sq, Sk = draw(st.integers(1, 40)), draw(st.integers(0, 150))
        D = draw(st.sampled_from([24, 64]))
    else:
        Sq, Sk = draw(st.integers(0, 300)), draw(st.integers(0, 3000))
        D = draw(st.sampled_from([1, 8, 20, 40, 64, 72, 80, 96, 128, 136, 256, 257, 300])
                 | st.integers(1, 400))
    H = Hkv * G
    attrs: dict[str, Any] = {"num_heads": H}
    if G > 1 or draw(st.booleans()):
        attrs["kv_num_heads"] = Hkv
    if draw(st.booleans()):
        attrs["causal"] = draw(st.integers(0, 1))
    if draw(st.booleans()):
        attrs["scale"] = draw(st.floats(0.01, 4.0))
    softcap = draw(st.sampled_from([None, 0.0, "on"]))
    if softcap is not None:
        attrs["softcap"] = draw(st.floats(1.0, 50.0)) if softcap == "on" else 0.0
    window = draw(st.sampled_from([None, -1, "on"]))
    if window is not None:
        attrs["local_window_size"] = draw(st.integers(0, Sk + 4)) if window == "on" else -1
    planes = draw(st.sampled_from(sorted({0, 1, B, B * H})))
    style = draw(st.sampled_from(["3d", "4d"]))
    lay = st.sampled_from(["contig", "contig", "bshd", "pad8", "pad3"])
    layouts = (draw(lay), draw(lay), draw(lay), draw(lay))
    path = draw(st.sampled_from(["auto", "auto", "fused", "simt", "unfused"]))
    if D > 256 and path in ("fused", "simt"):
        path = "auto"
    splits = draw(st.sampled_from([None, None, 1, 2, 3, 5]))
    return Spec(dtype, B, H, Hkv, Sq, Sk, D, tuple(sorted(attrs.items())), planes, style,
                layouts, path, splits, draw(st.booleans()), draw(st.integers(0, 2**32 - 1)))


# --------------------------------------------------------------------------- CPU cases
def build(rt: FakeRuntime, s: Spec) -> SimpleNamespace:
    """Fake views for a spec: node, inputs, outputs, factory kwargs."""
    ins = []
    for i in range(3):
        _, strides = layout_strides(s.shape(i), s.layouts[i])
        ins.append(rt.view(s.shape(i), s.dtype, strides))
    if s.planes:
        ins.append(rt.view(s.mask_shape(), s.dtype))
    _, ost = layout_strides(s.shape(3), s.layouts[3])
    out = rt.view(s.shape(3), s.dtype, ost, mut=True)
    kw: dict[str, Any] = {"path": s.path}
    if s.num_splits is not None:
        kw["num_splits"] = s.num_splits
    return SimpleNamespace(node=s.node, inputs=ins, outputs=[out], kw=kw, use_ws=s.use_ws,
                           empty=s.B * s.H * s.Sq * s.D == 0)


# Each mutation breaks exactly one rule of a valid case; it returns its kind:
# "claim" (refused at claim time too) or "input" (refused by the kernel).
def _m_kv_not_divisor(case: SimpleNamespace, data: Any, s: Spec) -> str:
    case.node.attributes["kv_num_heads"] = s.H + 1
    return "claim"


def _m_rank(case: SimpleNamespace, data: Any, s: Spec) -> str:
    i = data.draw(st.integers(0, 2), label="input")
    t = case.inputs[i]
    shape = data.draw(st.sampled_from([t.shape[:3], t.shape + (1,), t.shape[1:]]), label="shape")
    case.inputs[i] = reshaped(t, shape)
    return "input"


def _m_dim(case: SimpleNamespace, data: Any, s: Spec) -> str:
    which = data.draw(st.sampled_from(["q_heads", "k_batch", "k_heads", "k_dim", "v_len", "v_dim",
                                       "out_shape"]), label="dim")
    q, k, v = case.inputs[:3]
    if which == "q_heads":
        case.inputs[0] = reshaped(q, (s.B, s.H + 1, s.Sq, s.D))
    elif which == "k_batch":
        case.inputs[1] = reshaped(k, (s.B + 1, s.Hkv, s.Sk, s.D))
        case.inputs[2] = reshaped(v, (s.B + 1, s.Hkv, s.Sk, s.D))
    elif which == "k_heads":
        case.inputs[1] = reshaped(k, (s.B, s.Hkv + 1, s.Sk, s.D))
        case.inputs[2] = reshaped(v, (s.B, s.Hkv + 1, s.Sk, s.D))
    elif which == "k_dim":
        case.inputs[1] = reshaped(k, (s.B, s.Hkv, s.Sk, s.D + 1))
    elif which == "v_len":
        case.inputs[2] = reshaped(v, (s.B, s.Hkv, s.Sk + 1, s.D))
    elif which == "v_dim":
        case.inputs[2] = reshaped(v, (s.B, s.Hkv, s.Sk, s.D + 8))
    else:
        o = case.outputs[0]
        bad = data.draw(st.sampled_from([(s.B, s.H, s.Sq + 1, s.D), (s.B, s.H, s.Sq, s.D + 1),
                                         (s.B, s.H * s.Sq * s.D)]), label="out")
        case.outputs[0] = reshaped(o, bad)
    return "input"


def _m_mask_size(case: SimpleNamespace, data: Any, s: Spec) -> str:
    n = s.Sq * s.Sk
    bad = [(2 * s.B * s.H + 1, s.Sq, s.Sk)] if n else [(1, 1, 1)]
    if n and s.B > 2:
        bad.append((s.B - 1, s.Sq, s.Sk))
    if n > 1:
        bad.append((1, n - 1))
    shape = data.draw(st.sampled_from(bad), label="mask")
    case.node.inputs = ["q", "k", "v", "mask"]
    mask = case.inputs[3] if len(case.inputs) > 3 else None
    if mask is None:
        case.inputs.append(TensorView(case.inputs[0].ptr, s.dtype, shape))
    else:
        case.inputs[3] = reshaped(mask, shape)
    return "input"


def _m_q_dtype(case: SimpleNamespace, data: Any, s: Spec) -> str:
    dt = data.draw(st.sampled_from([DataType.INT32, DataType.DOUBLE, DataType.INT64, DataType.UINT8,
                                    DataType.BOOL]), label="dtype")
    case.inputs[0] = retyped(case.inputs[0], dt)
    return "input"


def _m_other_dtype(case: SimpleNamespace, data: Any, s: Spec) -> str:
    slots = ["k", "v", "out"] + (["mask"] if s.planes else [])
    which = data.draw(st.sampled_from(slots), label="slot")
    other = data.draw(st.sampled_from([d for d in (F32, F16, BF16, DataType.INT32) if d != s.dtype]),
                      label="dtype")
    if which == "out":
        case.outputs[0] = retyped(case.outputs[0], other)
    else:
        i = {"k": 1, "v": 2, "mask": 3}[which]
        case.inputs[i] = retyped(case.inputs[i], other)
    return "input"


def _m_absent(case: SimpleNamespace, data: Any, s: Spec) -> str:
    i = data.draw(st.integers(0, 2), label="input")
    how = data.draw(st.sampled_from(["slot", "none", "node"]), label="how")
    case.inputs[i] = None if how == "none" else TensorView.absent_slot(s.dtype)
    if how == "node":
        case.node.inputs[i] = None
    return "input"


def _m_arity(case: SimpleNamespace, data: Any, s: Spec) -> str:
    which = data.draw(st.sampled_from(["two_inputs", "five_inputs", "no_output", "two_outputs",
                                       "absent_output"]), label="arity")
    if which == "two_inputs":
        case.inputs = case.inputs[:2]
    elif which == "five_inputs":
        case.inputs = case.inputs[:3] + [case.inputs[0]] * 2
    elif which == "no_output":
        case.outputs = []
    elif which == "two_outputs":
        case.outputs = case.outputs * 2
    else:
        case.outputs = [TensorMut.absent_slot(s.dtype)]
    return "input"


def _m_head_dim_stride(case: SimpleNamespace, data: Any, s: Spec) -> str:
    assume(s.D > 1)
    which = data.draw(st.integers(0, 3), label="tensor")
    t = case.inputs[which] if which < 3 else case.outputs[0]
    B, X, S, D = t.shape
    st_ = data.draw(st.sampled_from([(X * S * D * 2, S * D * 2, D * 2, 2),  # every other element
                                     (1, B, B * X, B * X * S)]), label="strides")  # reversed
    assume(st_[3] != 1)
    nt = type(t)(t.ptr, t.dtype, t.shape, st_)
    if which < 3:
        case.inputs[which] = nt
    else:
        case.outputs[0] = nt
    return "input"


def _m_mask_strided(case: SimpleNamespace, data: Any, s: Spec) -> str:
    assume(s.planes and s.Sq > 1 and s.Sk > 1)
    m = case.inputs[3]
    shape = (s.planes, s.Sq, s.Sk)
    case.inputs[3] = TensorView(m.ptr, m.dtype, shape, (s.Sq * s.Sk, 1, s.Sq))  # transposed
    return "input"


def _m_forced_fused_big_d(case: SimpleNamespace, data: Any, s: Spec) -> str:
    D = data.draw(st.integers(257, 600), label="D")
    for i in range(3):
        t = case.inputs[i]
        case.inputs[i] = reshaped(t, t.shape[:3] + (D,))
    case.outputs[0] = TensorMut(case.outputs[0].ptr, s.dtype, (s.B, s.H, s.Sq, D))
    case.kw["path"] = data.draw(st.sampled_from(["fused", "simt"]), label="path")
    return "input"


def _m_bad_factory_args(case: SimpleNamespace, data: Any, s: Spec) -> str:
    which = data.draw(st.sampled_from(["path", "splits0", "splits_big"]), label="arg")
    if which == "path":
        case.kw["path"] = "fastest"
    else:
        case.kw["num_splits"] = 0 if which == "splits0" else 70000
    return "input"


def _m_positions(case: SimpleNamespace, data: Any, s: Spec) -> str:
    # Sq + Sk >= 2**31 positions (the int32 position arithmetic of the kernels).
    Sk = 2**31 - s.Sq + data.draw(st.integers(0, 5), label="extra")
    for i in (1, 2):
        t = case.inputs[i]
        case.inputs[i] = TensorView(t.ptr, t.dtype, (s.B, s.Hkv, Sk, s.D))
    return "input"


MUTATIONS = [
    attr_mutation("num_heads", [0, -1, DROP, 2.5, "4", True]),
    _m_kv_not_divisor,
    attr_mutation("kv_num_heads", [0, -2]),
    attr_mutation("causal", [2, -1, 1.0]),
    attr_mutation("scale", [0.0, -1.0, math.nan, math.inf, -math.inf, "x"]),
    attr_mutation("scale", [1e39, 1e300], label="_beyond_float32"),
    attr_mutation("softcap", [-1.0, math.nan, math.inf]),
    attr_mutation("softcap", [1e39, 1e300], label="_beyond_float32"),
    attr_mutation("local_window_size", [-2, -100, 1.5]),
    _m_rank, _m_dim, _m_mask_size, _m_q_dtype, _m_other_dtype, _m_absent, _m_arity,
    _m_head_dim_stride, _m_mask_strided, _m_forced_fused_big_d, _m_bad_factory_args,
    _m_positions,
]


BIG_FIELDS = ["B", "H", "Hkv", "Sq", "Sk", "D"]


# --------------------------------------------------------------------------- issue 37
# Each class turns a valid case into one of the bad-input classes and returns what must
# happen (a set, see tests._fuzz.OpFuzz): "ok" (runs), "refuse" (KernelError/Unsupported/
# ValueError/TypeError), "type" (TypeError), "claim" (unsupported_reason declines too).
_NP_INTS = (np.int16, np.int32, np.int64, np.uint32)


def _c_dims(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    shapes = [t.shape for t in case.inputs]
    if data.draw(st.booleans(), label="numpy"):  # same verdict as Python ints: claimed, runs
        top = max(max(x, default=0) for x in shapes)
        cast = data.draw(st.sampled_from([c for c in _NP_INTS + (np.int8,) if top <= np.iinfo(c).max]))
        case.shapes = [tuple(cast(d) for d in x) for x in shapes]
        return {"ok"}
    i = data.draw(st.integers(0, len(shapes) - 1), label="input")
    a = data.draw(st.integers(0, len(shapes[i]) - 1), label="axis")
    bad = data.draw(st.sampled_from([float(shapes[i][a]), shapes[i][a] + 0.5, True]), label="bad")
    case.shapes = list(shapes)
    case.shapes[i] = shapes[i][:a] + (bad,) + shapes[i][a + 1:]
    return {"ok", "claim"}  # the claim declines; the (integer) views still run


def _c_strides(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    group = data.draw(st.sampled_from(["inputs", "outputs"]), label="group")
    views = getattr(case, group)
    i = data.draw(st.integers(0, len(views) - 1), label="slot")
    t = views[i]
    axes = [a for a, d in enumerate(t.shape) if d > 1]
    assume(axes)
    st_ = list(t.element_strides)
    # every value is at least 2**63 bytes for a 2-byte element: past the pointer range
    st_[data.draw(st.sampled_from(axes), label="axis")] = data.draw(
        st.sampled_from([2**62, 2**63 - 1, 2**63, 2**64, -(2**62)]), label="stride")
    views[i] = type(t)(t.ptr, t.dtype, t.shape, tuple(st_))
    return {"refuse"}


def _c_overlap(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    o = case.outputs[0]
    assume(o.numel > 0)
    kind = data.draw(st.sampled_from(["zero_stride", "s_below_d", "input"]), label="kind")
    st_ = list(o.element_strides)
    if kind == "input":  # Attention defines no alias
        cands = [t for t in case.inputs if t.numel > 0]
        assume(cands)
        t = data.draw(st.sampled_from(cands), label="target")
        off = data.draw(st.sampled_from([0, t.dtype.itemsize, t.nbytes // 2]), label="offset")
        assume(off < t.nbytes)
        case.outputs[0] = TensorMut(t.ptr + off, o.dtype, o.shape)
        return {"refuse"}
    if kind == "s_below_d":
        assume(s.Sq > 1 and s.D > 1)
        st_[2] = data.draw(st.integers(1, s.D - 1), label="s_stride")
    else:
        axes = [a for a, d in enumerate(o.shape) if d > 1]
        assume(axes)
        st_[data.draw(st.sampled_from(axes), label="axis")] = 0
    case.outputs[0] = TensorMut(o.ptr, o.dtype, o.shape, tuple(st_))
    return {"refuse"}


def _c_objects(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    kind = data.draw(st.sampled_from(["absent", "outputs", "meta", "junk", "raw_shapes"]), label="kind")
    if kind == "absent":  # None and absent_slot() are one representation
        assume(not s.planes)
        case.inputs = case.inputs + [data.draw(st.sampled_from([None, TensorView.absent_slot()]))]
        return {"ok"}
    if kind == "outputs":
        case.outputs = data.draw(st.sampled_from([[None], [], [TensorView.absent_slot()]]), label="o")
        return {"refuse"}
    if kind == "raw_shapes":
        case.metas = [t.shape for t in case.inputs]
        return {"refuse", "type"}
    group = data.draw(st.sampled_from(["inputs", "outputs"]), label="group")
    views = getattr(case, group)
    i = data.draw(st.integers(0, len(views) - 1), label="slot")
    t = views[i]
    views[i] = t.meta if kind == "meta" else data.draw(
        st.sampled_from(["q", 12345, tuple(t.shape), np.zeros(3)]), label="junk")
    return {"refuse", "type"}


def _c_node(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    kind = data.draw(st.sampled_from(["unknown_attr", "int_attr", "domain", "op_type", "extra_input",
                                      "extra_output", "extra_view"]), label="kind")
    n = case.node
    if kind == "unknown_attr":
        n.attributes[data.draw(st.sampled_from(["do_rotary", "scal", "softcap_", "num_splits"]))] = 1
    elif kind == "int_attr":
        name = data.draw(st.sampled_from(["num_heads", "kv_num_heads"]), label="name")
        v = n.attributes.get(name, s.H)
        n.attributes[name] = data.draw(st.sampled_from([float(v), True, np.float32(v), str(v)]))
    elif kind == "domain":
        n.domain = data.draw(st.sampled_from(["", "com.microsoft", "pkg.attnrt"]))
    elif kind == "op_type":
        n.op_type = data.draw(st.sampled_from(["attention", "IndexShare", "PagedAttention"]))
    elif kind == "extra_input":
        n.inputs = ["q", "k", "v", "mask"] + ["extra"] * data.draw(st.integers(1, 2))
    elif kind == "extra_output":
        n.outputs = ["o"] + ["extra"] * data.draw(st.integers(1, 2))
    else:  # more views at execute than the op defines
        if data.draw(st.booleans(), label="side"):
            case.inputs = (case.inputs + [case.inputs[0]] * 2)[:5]
        else:
            case.outputs = case.outputs * 2
        return {"refuse"}
    case.reference_too = True
    return {"refuse", "claim"}


def _c_float32(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    name = data.draw(st.sampled_from(["scale", "softcap"]), label="name")
    v = data.draw(st.one_of(
        st.sampled_from([1e-46, 1e-45, 1e-40, 0.1, 1.0 / 3, 3.4e38, 3.5e38, 1e39, -1e-46, -0.5]),
        st.floats(allow_nan=True, allow_infinity=True)), label="value")
    case.node.attributes[name] = v
    case.reference_too = True
    with np.errstate(over="ignore"):
        f32 = float(np.float32(v))
    ok = math.isfinite(f32) and (f32 > 0 if name == "scale" else f32 >= 0)
    case.float32 = (name, f32) if ok else None
    return {"ok"} if ok else {"refuse", "claim"}


ISSUE37 = [_c_dims, _c_strides, _c_overlap, _c_objects, _c_node, _c_float32]


def _case37(rt: FakeRuntime, s: Spec) -> SimpleNamespace:
    case = build(rt, s)
    for o in case.outputs:  # distinct bytes, so that a write into an output shows
        if rt.read(o.ptr, o.nbytes) is not None:
            rt.write(o.ptr, np.full(o.nbytes, 0xCD, np.uint8))
    remember(ATTENTION, case)  # the node's shapes, before execute's objects
    case.reference_too, case.float32 = False, None
    return case


def _check37(rt: FakeRuntime, case: SimpleNamespace, s: Spec, err: BaseException | None) -> None:
    if case.float32 is not None:  # one float32 value for the kernel and the reference
        name, f32 = case.float32
        assert getattr(parse_attributes(case.node), name) == f32
        if not case.empty:
            args = [a for x in rt.launches for a in x.args if isinstance(a, np.float32)]
            assert np.float32(f32) in args, (name, f32, args)
    if case.reference_too and err is not None:  # the reference refuses as the kernel does
        host = [np.empty(t.shape, s.dtype.numpy) for t in case.inputs]
        with pytest.raises(type(err)) as got:
            reference.attention(case.node, host)
        assert str(got.value) == str(err)


# --------------------------------------------------------------------------- oversized cases
@st.composite
def big_specs(draw: Any, field: str) -> Spec:
    v = draw(st.sampled_from(BIG))
    d = dict(B=1, H=1, Hkv=1, Sq=draw(st.integers(1, 3)), Sk=draw(st.integers(1, 70)),
             D=draw(st.sampled_from([8, 64, 300])))
    if field == "H":
        d["H"] = v
    elif field == "Hkv":
        d["H"] = d["Hkv"] = v
    else:
        d[field] = v
    dtype = draw(st.sampled_from([BF16, F32]))
    it = dtype.itemsize
    # Physically possible tensors only: each below 128 GiB.
    assume(d["B"] * d["H"] * d["Sq"] * d["D"] * it <= 2**37)
    assume(d["B"] * d["Hkv"] * d["Sk"] * d["D"] * it <= 2**37)
    attrs: dict[str, Any] = {"num_heads": d["H"], "kv_num_heads": d["Hkv"]}
    if draw(st.booleans()):
        attrs["causal"] = 1
    if draw(st.booleans()):
        attrs["local_window_size"] = draw(st.sampled_from([0, 5, 2**31 - 1]))
    path = draw(st.sampled_from(["auto", "unfused"] + (["fused"] if d["D"] <= 256 else [])))
    return Spec(dtype, d["B"], d["H"], d["Hkv"], d["Sq"], d["Sk"], d["D"],
                tuple(sorted(attrs.items())), 0, "3d", ("contig",) * 4, path, None, True)


# --------------------------------------------------------------------------- CPU properties
def _check_valid(rt: FakeRuntime, case: SimpleNamespace, s: Spec) -> None:
    assert (rt.launch_count > 0) == (not case.empty), rt.names()
    if not case.empty:
        assert any(case.outputs[0].ptr in x.args for x in rt.launches), "no launch was given the output"


ATTENTION = OpFuzz(
    factory=AttentionFactory, config=AttentionConfig, specs=specs, build=build,
    check_valid=_check_valid, mutations=MUTATIONS, big_fields=BIG_FIELDS, big_specs=big_specs,
    closes=True, classes=ISSUE37, case37=_case37, check37=_check37, create_with_shapes=False,
    claim_verdicts=True, exact_type_errors=True)


class TestHost(host_tests(ATTENTION)):
    """No GPU: the shared properties and the issue-37 classes (tests._fuzz), then Attention's own."""

    def test_eager_unfused_refuses_grid_limits_before_allocating(self) -> None:
        # B*H = 65536 rows of heads exceed the unfused grid: KernelError, and nothing may be
        # allocated first (at real sizes the scores buffer alone can be out of memory).
        rt = FakeRuntime(memory_bytes=1 << 30)
        s = Spec(BF16, 1, 65536, 65536, 64, 4096, 320, (("num_heads", 65536),), 0, "3d",
                 ("contig",) * 4, "auto", None, False)
        case = build(rt, s)
        stage, err = attempt(ATTENTION, rt, case)
        assert isinstance(err, KernelError), f"{stage}: {type(err).__name__}: {err}"
        assert rt.launch_count == 0


# --------------------------------------------------------------------------- GPU half


@pytest.mark.gpu
class TestDevice:
    """Random valid cases on the GPU against the float64 reference."""

    @GPU_SETTINGS
    @given(s=specs(gpu=True))
    def test_random_valid_cases_match_reference(self, rt: Any, s: Spec) -> None:
        from attnrt.ops import reference
        from attnrt.runtime.tensors import DeviceArray
        from tests._util import TOL, rel_fro

        rng = np.random.default_rng(s.seed)
        npdt = s.dtype.numpy
        host = [rng.standard_normal(s.shape(i), dtype=np.float32).astype(npdt) for i in range(3)]
        mask = None
        if s.planes:
            m = rng.standard_normal(s.mask_shape(), dtype=np.float32)
            m[rng.random(m.shape) < 0.2] = -np.inf
            mask = m.astype(npdt)
        node = s.node
        before = rt.memory_stats().live_bytes
        launches = rt.launch_count
        with ExitStack() as stack:
            def upload(a: np.ndarray) -> DeviceArray:
                d = DeviceArray.from_numpy(rt, a)
                stack.callback(d.free)
                return d

            views = []
            for i in range(3):
                _, strides = layout_strides(s.shape(i), s.layouts[i])
                d = upload(to_storage(host[i], s.layouts[i]))
                views.append(TensorView(d.ptr, s.dtype, s.shape(i), strides))
            if mask is not None:
                views.append(upload(mask).view())
            oshape, ost = layout_strides(s.shape(3), s.layouts[3])
            ob = DeviceArray(rt, oshape, s.dtype)
            stack.callback(ob.free)
            ob.fill_bytes(0xFF)
            out = TensorMut(ob.ptr, s.dtype, s.shape(3), ost)
            kw: dict[str, Any] = {"path": s.path}
            if s.num_splits is not None:
                kw["num_splits"] = s.num_splits
            kern = AttentionFactory(rt, AttentionConfig(**kw)).create(node, [v.shape for v in views])
            req = kern.workspace_requirement([v.meta for v in views])
            ws = None
            if req.nbytes and s.use_ws:
                p = rt.alloc_raw(req.nbytes)
                stack.callback(rt.free_raw, p)
                ws = WorkspaceView(p, req.nbytes)
            kern.execute(views, [out], ws)
            rt.synchronize()
            got = from_storage(ob.numpy(), s.layouts[3], s.D)
        assert rt.launch_count > launches
        assert rt.memory_stats().live_bytes == before
        want = reference.attention(node, host + ([mask] if mask is not None else []),
                                   out_dtype=np.float64)
        err = rel_fro(got, want)
        assert err < TOL[s.dtype], f"rel_fro {err:.2e} (plan {kern.last_plan}) for {s}"
        rt.latch.check()
