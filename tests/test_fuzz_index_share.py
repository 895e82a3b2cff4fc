"""Fuzzing ``pkg.nxrt::IndexShare``: random valid and invalid calls (hypothesis).

CPU half (runs in CI, no GPU): the shared harness (:mod:`tests._fuzz`) runs the op against
:class:`tests._fakes.FakeRuntime`; the ``selected_indices`` the op reads back are real
(registered with the fake), and in fixed-capacity mode a hook plays the frontier kernel
(it writes the valid lengths the bias carries, as ``capacity_valid_lengths`` computes them).

- Valid cases (every present mode, GQA/MHA index heads, bias ranks 1-4, int32/int64
  indices, the in-place capacity cache, forced paths, with and without a workspace) are
  claimed and run with legal launches; the scratch pool is freed by ``close()``.
- Invalid cases (one mutation each) raise ``KernelError``/``Unsupported``/``ValueError``
  and launch nothing; rows that break the index rules raise ``SelectedIndicesError``
  and launch nothing either (capacity mode derives the bound from the bias on the host).
- Issue 37's classes (``CLASSES``: numpy/float dims, strides and the pointer range, output
  overlap, absent slots and wrong objects, extra slots/attributes and a wrong op, the
  reference's validation, float32 scales) over the full path (claim, create, workspace,
  execute): a typed error or success as the class predicts, never another exception, and
  a refusal launches nothing and leaves every backed buffer's bytes as they were.
- Oversized cases (one dim at or past 2**16 / 2**31 / 2**32) are refused before the first
  launch (by ``workspace_requirement`` when the inputs alone decide it) or run with legal
  launches; never an ``OverflowError``.

GPU half (``TestDevice``, marked gpu): random valid cases on the device against
``attnrt.ops.reference`` (Y and the present outputs).
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

from attnrt.ops.index_share import (
    IndexShareConfig,
    IndexShareFactory,
    SelectedIndicesError,
    capacity_valid_lengths,
    parse_attributes,
    reference,
)
from attnrt.ops.index_share.schema import _max_head_size
from attnrt.runtime.api import DataType, Node, TensorMetadata, TensorMut, TensorView, WorkspaceView
from tests._fakes import GPU_SETTINGS, FakeRuntime
from tests._fuzz import (
    BIG,
    DROP,
    OpFuzz,
    absent,
    attr_mutation,
    host_tests,
    remember,
    reshaped,
    retyped,
)
from tests._nodes import index_share_node

F32, F16, BF16 = DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16
I32, I64 = DataType.INT32, DataType.INT64


# --------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class Spec:
    """One IndexShare call: sizes, mode and layout choices; data comes from ``seed``."""

    dtype: DataType
    idt: DataType
    B: int
    N: int
    Nkv: int
    Sq: int
    cur: int
    past: int
    H: int
    K: int
    hi: int
    bias: tuple | None  # shape with "C" for the cache axis
    mode: str  # none | concat | capacity
    alias: bool  # capacity: present aliases past
    path: str | None
    use_ws: bool
    scale: float | None
    seed: int = 0

    @property
    def cache(self) -> int:
        return self.past if self.mode == "capacity" else self.past + self.cur

    def bias_shape(self) -> tuple[int, ...] | None:
        if self.bias is None:
            return None
        return tuple(self.cache if d == "C" else d for d in self.bias)

    def node(self) -> Node:
        attrs: dict[str, Any] = {"num_heads": self.N, "kv_num_heads": self.Nkv}
        if self.scale is not None:
            attrs["scale"] = self.scale
        return index_share_node(attrs, 1 if self.mode == "none" else 3)

    def shapes(self) -> list[tuple[int, ...] | None]:
        q = (self.B, self.N, self.Sq, self.H)
        kv = (self.B, self.Nkv, self.cur, self.H)
        p = (self.B, self.Nkv, self.past, self.H) if self.past else None
        return [q, kv, kv, p, p, (self.B, self.hi, self.Sq, self.K), self.bias_shape()]

    def out_shapes(self) -> list[tuple[int, ...]]:
        q = (self.B, self.N, self.Sq, self.H)
        if self.mode == "none":
            return [q]
        pres = (self.B, self.Nkv, self.cache, self.H)
        return [q, pres, pres]


def _mma_eligible(dtype: DataType, H: int, hi: int, G: int) -> bool:
    return dtype in (F16, BF16) and H in (64, 128) and hi == 1 and G >= 8


@st.composite
def specs(draw: Any, gpu: bool = False) -> Spec:
    dtype = draw(st.sampled_from([F32, F16, BF16]))
    idt = draw(st.sampled_from([I32, I64]))
    Nkv = draw(st.integers(1, 2 if gpu else 3))
    G = draw(st.sampled_from([1, 2, 8] if gpu else [1, 2, 3, 4, 8, 16]))
    N = Nkv * G
    B = draw(st.integers(1, 3))
    Sq = draw(st.integers(1 if gpu else 0, 3))
    cur = draw(st.integers(1, 4))
    mode = draw(st.sampled_from(["none", "concat", "capacity"]))
    past = draw(st.integers(1 if mode == "capacity" else 0, 40 if gpu else 60))
    if gpu:
        H = 64  # bounded compile set: SIMT (vec 4/8, 1 or 4 heads per CTA) and MMA builds
    else:
        H = draw(st.sampled_from([1, 4, 7, 8, 16, 20, 32, 64, 72, 100, 128, 256, 512]))
        assume(H <= _max_head_size(dtype, H))
    hi = draw(st.sampled_from([1, N]))
    cache = past if mode == "capacity" else past + cur
    K = draw(st.integers(1, min(64, cache + 3)))
    bias = None
    if mode == "capacity" or draw(st.booleans()):
        rank = draw(st.integers(1, 4))
        full = (B, N, Sq, "C")
        dims = [draw(st.sampled_from([full[a], 1])) for a in range(4 - rank, 4)]
        bias = tuple(dims)
    alias = mode == "capacity" and draw(st.booleans())
    paths: list[str | None] = [None, None, "simt"]
    if _mma_eligible(dtype, H, hi, G):
        paths.append("mma")
    scale = draw(st.sampled_from([None, None, 0.3]))
    return Spec(dtype, idt, B, N, Nkv, Sq, cur, past, H, K, hi, bias, mode, alias,
                draw(st.sampled_from(paths)), draw(st.booleans()), scale,
                draw(st.integers(0, 2**32 - 1)))


# --------------------------------------------------------------------------- data
def make_data(s: Spec, rng: np.random.Generator, full: bool) -> tuple[list, np.ndarray | int]:
    """Inputs in schema order (float data only when ``full``) and the index bound per batch."""
    npdt = s.dtype.numpy
    shapes = s.shapes()

    def floats(shape: tuple[int, ...] | None) -> np.ndarray | None:
        if shape is None or not full:  # the CPU half needs no float data
            return None
        return rng.standard_normal(shape, dtype=np.float32).astype(npdt)

    q, k, v, pk, pv = (floats(shapes[i]) for i in range(5))
    cache = s.cache
    bounds: np.ndarray | int = cache
    bias = None
    bshape = s.bias_shape()
    if bshape is not None:
        b = (0.5 * rng.standard_normal(bshape)).astype(np.float32)
        if s.mode == "capacity":
            b4 = b.reshape((1,) * (4 - b.ndim) + b.shape)
            if b4.shape[3] > 1:
                lo = max(1, min(s.cur, cache))
                nb = b4.shape[0]
                lens = rng.integers(lo, cache + 1, size=nb)
                for i, ln in enumerate(lens):
                    b4[i, ..., ln:] = -np.inf
            b = b4.reshape(bshape)
            bounds = capacity_valid_lengths(b, s.B, cache)
        elif b.size > 3:
            b.reshape(-1)[1::5] = -np.inf
        bias = b.astype(npdt)
    idx = np.full((s.B, s.hi, s.Sq, s.K), -1, dtype=np.int64)
    if s.B * s.hi * s.Sq > 4096:  # many rows (oversized cases): the first keys of each row
        n = min(s.K, int(np.min(bounds)))
        idx[..., :n] = np.arange(n)
        return [q, k, v, pk, pv, idx.astype(s.idt.numpy), bias], bounds
    for pos in np.ndindex(s.B, s.hi, s.Sq):
        bnd = int(bounds[pos[0]]) if np.ndim(bounds) else int(bounds)
        n = int(rng.integers(1, min(s.K, bnd) + 1))
        idx[pos][:n] = np.sort(rng.choice(bnd, size=n, replace=False))
    return [q, k, v, pk, pv, idx.astype(s.idt.numpy), bias], bounds


# --------------------------------------------------------------------------- CPU cases
def build(rt: FakeRuntime, s: Spec) -> SimpleNamespace:
    rng = np.random.default_rng(s.seed)
    host, bounds = make_data(s, rng, full=False)
    shapes = s.shapes()
    ins: list[Any] = []
    for i, shp in enumerate(shapes):
        if shp is None:
            ins.append(TensorView.absent_slot())
        elif i in (5, 6):  # read back by execute: indices, and the bias in capacity mode
            ins.append(rt.view(shp, s.idt if i == 5 else s.dtype, data=host[i]))
        else:
            ins.append(rt.view(shp, s.dtype))
    outs = [rt.view(shp, s.dtype, mut=True) for shp in s.out_shapes()]
    if s.alias:
        outs[1] = TensorMut(ins[3].ptr, s.dtype, ins[3].shape)
        outs[2] = TensorMut(ins[4].ptr, s.dtype, ins[4].shape)
    if s.mode == "capacity":
        lens = np.broadcast_to(np.asarray(bounds, dtype=np.int32), (s.B,)).copy()
        rt.on_launch["is_frontier"] = lambda args: rt.write(args[1], lens)
    return SimpleNamespace(node=s.node(), inputs=ins, outputs=outs, kw={"path": s.path},
                           use_ws=s.use_ws, host=host, bounds=bounds)


# --------------------------------------------------------------------------- mutations
# Each breaks one rule and returns "claim" (declined at claim time too), "input" (refused
# by the kernel) or "indices" (a selected_indices value rule: SelectedIndicesError).
def _m_kv_not_divisor(case: SimpleNamespace, data: Any, s: Spec) -> str:
    case.node.attributes["kv_num_heads"] = s.N + 1
    return "claim"


def _m_arity(case: SimpleNamespace, data: Any, s: Spec) -> str:
    which = data.draw(st.sampled_from(["five", "eight"]), label="arity")
    if which == "five":
        case.inputs = case.inputs[:5]
        case.node.inputs = case.node.inputs[:5]
    else:
        case.inputs = case.inputs + [case.inputs[0]]
        case.node.inputs = case.node.inputs + ["extra"]
    return "claim"


def _m_required_absent(case: SimpleNamespace, data: Any, s: Spec) -> str:
    i = data.draw(st.sampled_from([0, 1, 2, 5]), label="input")
    case.inputs[i] = data.draw(st.sampled_from([TensorView.absent_slot(), None]), label="as")
    return "input"


def _m_required_absent_in_node(case: SimpleNamespace, data: Any, s: Spec) -> str:
    i = data.draw(st.sampled_from([0, 1, 2, 5]), label="input")
    case.node.inputs[i] = data.draw(st.sampled_from([None, ""]), label="name")
    case.inputs[i] = TensorView.absent_slot()
    return "claim"


def _m_half_past(case: SimpleNamespace, data: Any, s: Spec) -> str:
    assume(s.past > 0)
    i = data.draw(st.sampled_from([3, 4]), label="input")
    case.inputs[i] = TensorView.absent_slot()
    return "claim"


def _m_dtype(case: SimpleNamespace, data: Any, s: Spec) -> str:
    cands = [i for i in (0, 1, 2, 3, 4, 6) if not absent(case.inputs[i])]
    i = data.draw(st.sampled_from(cands), label="input")
    bad = [d for d in (F32, F16, BF16, DataType.INT32, DataType.DOUBLE) if d != s.dtype]
    case.inputs[i] = retyped(case.inputs[i], data.draw(st.sampled_from(bad), label="dtype"))
    return "claim"


def _m_index_dtype(case: SimpleNamespace, data: Any, s: Spec) -> str:
    dt = data.draw(st.sampled_from([DataType.INT16, DataType.UINT32, DataType.FLOAT,
                                    DataType.UINT64]), label="dtype")
    case.inputs[5] = retyped(case.inputs[5], dt)
    return "claim"


def _m_shape(case: SimpleNamespace, data: Any, s: Spec) -> str:
    B, N, Sq, H, Nkv, cur, K = s.B, s.N, s.Sq, s.H, s.Nkv, s.cur, s.K
    opts: dict[int, list[tuple[int, ...]]] = {
        0: [(B, N, Sq), (B, N + 1, Sq, H), (B, N, Sq, H, 1)],
        1: [(B + 1, Nkv, cur, H), (B, Nkv + 1, cur, H), (B, Nkv, cur, H + 1), (B, Nkv, 0, H),
            (B, Nkv, cur)],
        2: [(B, Nkv, cur + 1, H), (B, Nkv, cur, H + 1)],
        5: [(B + 1, s.hi, Sq, K), (B, N + 1, Sq, K), (B, s.hi, Sq + 1, K), (B, s.hi, Sq, 0),
            (B, s.hi, Sq * K)],
    }
    if s.past:
        opts[3] = [(B, Nkv, s.past, H + 1), (B + 1, Nkv, s.past, H), (B, Nkv, s.past)]
        opts[4] = [(B, Nkv, s.past + 1, H)]
    if s.bias is not None:
        opts[6] = [(B, N, Sq, s.cache + 1, 1), (2 * B + 1, 1, 1, 1), (s.cache + 2,)]
    i = data.draw(st.sampled_from(sorted(opts)), label="input")
    shape = data.draw(st.sampled_from(opts[i]), label="shape")
    if i == 5 and shape == (B, N + 1, Sq, K):
        assume(N + 1 != 1)
    if i == 6 and shape == (s.cache + 2,):
        assume(s.cache + 2 != 1)
    if i == 1 and shape[2] != cur:  # key and value keep agreeing on the lengths: only K wrong
        case.inputs[2] = reshaped(case.inputs[2], shape)
    case.inputs[i] = reshaped(case.inputs[i], shape)
    return "claim"


def _m_capacity_without_bias(case: SimpleNamespace, data: Any, s: Spec) -> str:
    assume(s.mode == "capacity")
    case.inputs[6] = TensorView.absent_slot()
    return "input"


def _m_strided(case: SimpleNamespace, data: Any, s: Spec) -> str:
    cands = [i for i, t in enumerate(case.inputs) if not absent(t) and t.numel > 1
             and t.shape[-1] > 1]
    assume(cands)
    i = data.draw(st.sampled_from(cands), label="input")
    t = case.inputs[i]
    case.inputs[i] = type(t)(t.ptr, t.dtype, t.shape, tuple(2 * x for x in t.element_strides))
    return "input"


def _m_output(case: SimpleNamespace, data: Any, s: Spec) -> str:
    y = case.outputs[0]
    kinds = ["y_shape", "y_dtype", "y_absent", "two", "zero", "y_strided", "y_overlaps_q"]
    if s.mode != "none":
        kinds += ["present_half", "present_shape", "present_dtype", "present_overlap",
                  "present_strided"]
    if s.mode == "capacity":
        kinds.append("alias_offset")
    which = data.draw(st.sampled_from(kinds), label="out")
    q = case.inputs[0]
    if which == "y_shape":
        case.outputs[0] = reshaped(y, (s.B, s.N, s.Sq, s.H + 1))
    elif which == "y_dtype":
        case.outputs[0] = retyped(y, F32 if s.dtype != F32 else F16)
    elif which == "y_absent":
        case.outputs[0] = TensorMut.absent_slot(s.dtype)
    elif which == "two":
        case.outputs = case.outputs[:1] * 2
    elif which == "zero":
        case.outputs = []
    elif which == "y_strided":
        assume(y.numel > 1 and s.H > 1)
        case.outputs[0] = TensorMut(y.ptr, y.dtype, y.shape, tuple(2 * x for x in y.element_strides))
    elif which == "y_overlaps_q":
        assume(q.numel > 0)
        case.outputs[0] = TensorMut(q.ptr, y.dtype, y.shape)
    elif which == "present_half":
        case.outputs[2] = TensorMut.absent_slot(s.dtype)
    elif which == "present_shape":
        pk = case.outputs[1]
        bad = (s.B, s.Nkv, s.cache + 1 if s.mode == "concat" else s.cache + s.cur + 1, s.H)
        case.outputs[1] = reshaped(pk, bad)
        case.outputs[2] = reshaped(case.outputs[2], bad)
    elif which == "present_dtype":
        case.outputs[1] = retyped(case.outputs[1], F32 if s.dtype != F32 else BF16)
    elif which == "present_overlap":
        case.outputs[2] = TensorMut(case.outputs[1].ptr, s.dtype, case.outputs[2].shape)
    elif which == "present_strided":
        p = case.outputs[1]
        assume(p.numel > 1 and s.H > 1)
        case.outputs[1] = TensorMut(p.ptr, p.dtype, p.shape, tuple(2 * x for x in p.element_strides))
    else:  # the capacity cache aliasing its past at an offset: a partial overlap
        pk = case.inputs[3]
        case.outputs[1] = TensorMut(pk.ptr + s.H * s.dtype.itemsize, s.dtype, pk.shape)
    return "input"


def _m_indices(case: SimpleNamespace, data: Any, s: Spec) -> str:
    assume(s.Sq > 0)
    idx = case.host[5].astype(np.int64)
    b = data.draw(st.integers(0, s.B - 1), label="b")
    h = data.draw(st.integers(0, s.hi - 1), label="h")
    i = data.draw(st.integers(0, s.Sq - 1), label="q")
    row = idx[b, h, i]
    n = int(np.sum(row >= 0))
    bound = int(case.bounds[b]) if np.ndim(case.bounds) else int(case.bounds)
    kinds = ["sentinel", "out_of_range", "all_padding"]
    if n >= 2:
        kinds += ["duplicate", "not_increasing"]
    if n < s.K:
        kinds.append("after_padding")
    kind = data.draw(st.sampled_from(kinds), label="kind")
    if kind == "sentinel":
        row[data.draw(st.integers(0, s.K - 1), label="col")] = data.draw(
            st.sampled_from([-2, -7, -(2**31)]), label="v")
    elif kind == "out_of_range":
        row[n - 1] = bound + data.draw(st.sampled_from([0, 1, 2**31 - 2 - bound]), label="over")
    elif kind == "all_padding":
        row[:] = -1
    elif kind == "duplicate":
        row[1] = row[0]
    elif kind == "not_increasing":
        row[0], row[1] = row[1], row[0]
    else:
        row[s.K - 1] = 0 if n < s.K - 1 else row[n - 1]  # a value after the -1 padding
    idx[b, h, i] = row
    t = case.inputs[5]
    rt = case.rt
    case.inputs[5] = TensorView(rt.put(idx.astype(s.idt.numpy)), t.dtype, t.shape)
    return "indices"


def _m_path(case: SimpleNamespace, data: Any, s: Spec) -> str:
    which = data.draw(st.sampled_from(["bogus", "mma"]), label="path")
    if which == "mma":
        assume(not _mma_eligible(s.dtype, s.H, s.hi, s.N // s.Nkv))
    case.kw["path"] = {"bogus": "fastest", "mma": "mma"}[which]
    return "input"


def _m_head_size(case: SimpleNamespace, data: Any, s: Spec) -> str:
    H = _max_head_size(s.dtype, 512) + data.draw(st.sampled_from([16, 64]), label="extra")
    for i in (0, 1, 2, 3, 4):
        t = case.inputs[i]
        if not absent(t):
            case.inputs[i] = reshaped(t, t.shape[:3] + (H,))
    case.outputs = [reshaped(o, o.shape[:3] + (H,)) if not absent(o) else o for o in case.outputs]
    return "claim"


MUTATIONS = [
    attr_mutation("num_heads", [0, -1, DROP, 2.0, "4", True]),
    attr_mutation("kv_num_heads", [0, -2, 1.5]),
    _m_kv_not_divisor,
    attr_mutation("scale", [0.0, -1.0, math.nan, math.inf, "x"]),
    attr_mutation("scale", [1e39, 1e300], label="_beyond_float32"),
    _m_arity, _m_required_absent, _m_required_absent_in_node, _m_half_past, _m_dtype,
    _m_index_dtype, _m_shape,
    _m_capacity_without_bias, _m_strided, _m_output, _m_indices, _m_path, _m_head_size,
]


BIG_FIELDS = ["B", "N", "Nkv", "Sq", "cur", "past", "H"]


# --------------------------------------------------------------------------- CPU properties
@st.composite
def big_specs(draw: Any, field: str) -> Spec:
    d = dict(B=1, N=1, Nkv=1, Sq=1, cur=1, past=draw(st.sampled_from([0, 3])), H=8)
    v = draw(st.sampled_from(BIG if field != "H" else [1024, 4096, 65536, 2**31]))
    if field == "N":
        d["N"] = v
    elif field == "Nkv":
        d["N"] = d["Nkv"] = v
    else:
        d[field] = v
    # Capacity mode carries a bias over the whole cache: only with a small one.
    modes = ["none", "concat"] + (["capacity"] if field != "past" else [])
    mode = draw(st.sampled_from(modes))
    if mode == "capacity" and d["past"] == 0:
        d["past"] = 3
    dtype = draw(st.sampled_from([BF16, F32]))
    it = dtype.itemsize
    for n in (d["B"] * d["N"] * d["Sq"] * d["H"], d["B"] * d["Nkv"] * d["cur"] * d["H"],
              d["B"] * d["Nkv"] * (d["past"] + d["cur"]) * d["H"]):
        assume(n * it <= 2**37)  # physically possible tensors only
    assume(d["B"] * d["Sq"] <= 2**20)  # selected_indices is read back to the host eagerly
    cache = d["past"] if mode == "capacity" else d["past"] + d["cur"]
    K = min(4, cache)
    bias = ("C",) if mode == "capacity" else None
    return Spec(dtype, I32, d["B"], d["N"], d["Nkv"], d["Sq"], d["cur"], d["past"], d["H"], K, 1,
                bias, mode, False, None, True, None, draw(st.integers(0, 2**32 - 1)))


def _check_valid(rt: FakeRuntime, case: SimpleNamespace, s: Spec) -> None:
    if s.Sq:
        assert any(n.startswith("is_attn_") for n in rt.names()), rt.names()
        assert any(case.outputs[0].ptr in x.args for x in rt.launches)
    # (live bytes back to zero: close() returned the pool)


# --------------------------------------------------------------------------- issue 37 classes
# Each class mutation edits a valid case and returns what the full path must do (a set, see
# tests._fuzz.OpFuzz): "ok" (run), "refuse" (a KernelError/Unsupported/ValueError/TypeError),
# "type" (a TypeError), and whether the claim must decline ("claim").
_NP_INTS = (np.int64, np.int32, np.uint32, np.int16)


def _c_dims(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    which = data.draw(st.sampled_from(["numpy", "float", "bool"]), label="dims")
    shapes = [None if absent(t) else t.shape for t in case.inputs]
    if which == "numpy":  # same verdict as Python ints: claimed, runs
        cast = data.draw(st.sampled_from(_NP_INTS + (np.int8,) if max(
            max(x) for x in shapes if x) < 128 else _NP_INTS), label="cast")
        case.shapes = [None if x is None else tuple(cast(d) for d in x) for x in shapes]
        case.inputs = [t if absent(t) else type(t)(t.ptr, t.dtype, tuple(cast(d) for d in t.shape))
                       for t in case.inputs]
        return {"ok"}
    i = data.draw(st.sampled_from([i for i, x in enumerate(shapes) if x]), label="input")
    a = data.draw(st.integers(0, len(shapes[i]) - 1), label="axis")
    d = shapes[i][a]
    bad = float(d) + data.draw(st.sampled_from([0.0, 0.5]), label="frac") if which == "float" else True
    case.shapes = list(shapes)
    case.shapes[i] = shapes[i][:a] + (bad,) + shapes[i][a + 1:]
    return {"ok", "claim"}  # the claim declines; the (integer) views still run


def _c_strides(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    slots = [("in", i) for i, t in enumerate(case.inputs) if not absent(t) and t.numel > 1]
    slots += [("out", i) for i, t in enumerate(case.outputs) if t.numel > 1]
    assume(slots)
    side, i = data.draw(st.sampled_from(slots), label="slot")
    group = case.inputs if side == "in" else case.outputs
    t = group[i]
    if data.draw(st.booleans(), label="top"):  # bytes running past the top of the address space
        short = data.draw(st.sampled_from([1, t.nbytes // 2, t.nbytes - 1]), label="short")
        group[i] = type(t)(2**64 - short, t.dtype, t.shape)  # needs t.nbytes bytes
        return {"refuse"}
    axes = [a for a, d in enumerate(t.shape) if d > 1]
    a = data.draw(st.sampled_from(axes), label="axis")
    st_ = list(t.element_strides)
    st_[a] = data.draw(st.sampled_from([2**61, 2**62, 2**63 - 1, 2**63, 2**64, -(2**62)]), label="stride")
    group[i] = type(t)(t.ptr, t.dtype, t.shape, tuple(st_))
    return {"refuse"}


def _c_overlap(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    j = data.draw(st.integers(0, len(case.outputs) - 1), label="out")
    o = case.outputs[j]
    assume(o.numel > 0)
    kind = data.draw(st.sampled_from(["input", "output", "zero_stride"]), label="kind")
    if kind == "zero_stride":
        axes = [a for a, d in enumerate(o.shape) if d > 1]
        assume(axes)
        st_ = list(o.element_strides)
        st_[data.draw(st.sampled_from(axes), label="axis")] = 0
        case.outputs[j] = TensorMut(o.ptr, o.dtype, o.shape, tuple(st_))
        return {"refuse"}
    group = case.inputs if kind == "input" else [t for n, t in enumerate(case.outputs) if n != j]
    cands = [t for t in group if not absent(t) and t.numel > 0]
    assume(cands)
    t = data.draw(st.sampled_from(cands), label="target")
    off = data.draw(st.sampled_from([0, 0, 1, t.nbytes // 2]), label="offset")
    assume(off < t.nbytes)
    case.outputs[j] = TensorMut(t.ptr + off, o.dtype, o.shape)
    exact_alias = (s.mode == "capacity" and j in (1, 2) and off == 0 and kind == "input"
                   and t is case.inputs[j + 2])
    return {"ok"} if exact_alias else {"refuse"}


def _c_objects(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    kind = data.draw(st.sampled_from(["absent", "input", "output", "raw_meta", "no_y", "attrs"]),
                     label="kind")
    if kind == "absent":  # None and absent_slot() are one representation
        opt = [i for i in (3, 4, 6) if absent(case.inputs[i])]
        assume(opt)
        for i in opt:
            case.inputs[i] = data.draw(st.sampled_from([None, TensorView.absent_slot()]), label="as")
        return {"ok"}
    junk = data.draw(st.sampled_from(["meta", "str", "tuple", "int", "ndarray"]), label="junk")
    if kind == "attrs":
        case.node.attributes = data.draw(st.sampled_from([None, [("num_heads", s.N)], (1, 2)]))
        return {"refuse", "type", "claim"}
    if kind == "raw_meta":
        case.metas = [None if absent(t) else t.shape for t in case.inputs]
        return {"refuse", "type"}
    if kind == "no_y":
        case.outputs = data.draw(st.sampled_from([[None], [], [None, None, None]]), label="outs")
        return {"refuse"}
    group = case.inputs if kind == "input" else case.outputs
    i = data.draw(st.integers(0, len(group) - 1), label="slot")
    t = group[i]
    meta = t.meta if not absent(t) else TensorMetadata(s.dtype, (1,))
    group[i] = {"meta": meta, "str": "q", "tuple": tuple(meta.shape), "int": 12345,
                "ndarray": np.zeros(3)}[junk]
    return {"refuse", "type"}


def _c_node(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    kind = data.draw(st.sampled_from(["unknown_attr", "int_attr", "domain", "op_type",
                                      "extra_input", "extra_output", "extra_slot"]), label="kind")
    n = case.node
    if kind == "unknown_attr":
        n.attributes[data.draw(st.sampled_from(["softcap", "causal", "scal", "do_rotary"]))] = 1
    elif kind == "int_attr":
        name = data.draw(st.sampled_from(["num_heads", "kv_num_heads"]), label="name")
        n.attributes[name] = data.draw(st.sampled_from(
            [float(n.attributes[name]), True, np.float32(n.attributes[name]), str(n.attributes[name])]))
    elif kind == "domain":
        n.domain = data.draw(st.sampled_from(["", "com.microsoft", "pkg.attnrt"]))
    elif kind == "op_type":
        n.op_type = data.draw(st.sampled_from(["Attention", "indexshare", "PagedAttention"]))
    elif kind == "extra_input":
        n.inputs = n.inputs + ["extra"] * data.draw(st.integers(1, 3))
    elif kind == "extra_output":
        n.outputs = ["y", "pk_out", "pv_out"] + ["extra"] * data.draw(st.integers(1, 2))
    else:  # more views at execute than the op defines
        if data.draw(st.booleans(), label="side"):
            case.inputs = case.inputs + [case.inputs[0]] * data.draw(st.integers(1, 2))
        else:
            case.outputs = (case.outputs + [case.outputs[0]] * 3)[:4 + data.draw(st.integers(0, 1))]
        return {"refuse"}
    case.reference_too = True
    return {"refuse", "claim"}


def _c_scale(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    v = data.draw(st.one_of(
        st.sampled_from([1e-46, 1e-40, 1e-31, 1e-30, 3e-30, 0.1, 0.3, 1.0 / 3, 6.9e37, 3.4e38, 1e39]),
        st.floats(1e-45, 1e40), st.floats(allow_nan=True, allow_infinity=True)), label="scale")
    case.node.attributes["scale"] = v
    case.reference_too = True
    f32 = float(np.float32(v)) if math.isfinite(v) and abs(v) < 3.5e38 else math.inf
    ok = math.isfinite(f32) and f32 > 0 and 1e-30 <= f32 * math.log2(math.e) <= 1e38
    case.scale32 = f32 if ok else None
    return {"ok"} if ok else {"refuse", "claim"}


CLASSES = [_c_dims, _c_strides, _c_overlap, _c_objects, _c_node, _c_scale]


def _case37(rt: FakeRuntime, s: Spec) -> SimpleNamespace:
    case = build(rt, s)
    for o in case.outputs:  # distinct bytes, so that a copy into an output shows
        if not (s.alias and o.ptr in (case.inputs[3].ptr, case.inputs[4].ptr)):
            rt.write(o.ptr, np.full(o.nbytes, 0xCD, np.uint8))
    remember(INDEX_SHARE, case)
    case.reference_too, case.scale32 = False, None
    return case


def _check37(rt: FakeRuntime, case: SimpleNamespace, s: Spec, err: BaseException | None) -> None:
    if case.scale32 is not None:  # one float32 value for the kernel and the reference
        assert parse_attributes(case.node).scale == case.scale32
        f = [a for x in rt.launches if x.name.startswith("is_attn_") for a in x.args
             if isinstance(a, np.float32)]
        assert set(f) <= {np.float32(case.scale32 * math.log2(math.e))}, f
    if case.reference_too and err is not None:  # the reference refuses as the kernel does
        host, _ = make_data(s, np.random.default_rng(s.seed), full=True)
        with pytest.raises(type(err)) as got:
            reference.index_share(case.node, host, present=s.mode)
        assert str(got.value) == str(err)


INDEX_SHARE = OpFuzz(
    factory=IndexShareFactory, config=IndexShareConfig, specs=specs, build=build,
    check_valid=_check_valid, mutations=MUTATIONS, big_fields=BIG_FIELDS, big_specs=big_specs,
    closes=True, kind_errors={"indices": SelectedIndicesError},
    classes=CLASSES, case37=_case37, check37=_check37, create_with_shapes=False,
    claim_verdicts=True, exact_type_errors=True)


class TestHost(host_tests(INDEX_SHARE)):
    """No GPU: the shared properties and the issue-37 classes (tests._fuzz) for IndexShare."""


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
        host, _ = make_data(s, rng, full=True)
        node = s.node()
        want = reference.index_share(node, host, present=s.mode)
        before = rt.memory_stats().live_bytes
        launches = rt.launch_count
        kern = IndexShareFactory(rt, IndexShareConfig(path=s.path)).create(node)
        with ExitStack() as stack:
            stack.callback(kern.close)

            def upload(a: np.ndarray) -> DeviceArray:
                d = DeviceArray.from_numpy(rt, a)
                stack.callback(d.free)
                return d

            bufs = [None if a is None else upload(a) for a in host]
            views = [b.view() if b is not None else TensorView.absent_slot() for b in bufs]
            outs = []
            for j, shp in enumerate(s.out_shapes()):
                if j and s.alias:
                    outs.append(bufs[2 + j])  # the in-place capacity cache
                    continue
                o = DeviceArray(rt, shp, s.dtype)
                stack.callback(o.free)
                o.fill_bytes(0xFF)
                outs.append(o)
            req = kern.workspace_requirement([None if b is None else v.meta
                                              for b, v in zip(bufs, views)])
            ws = None
            if req.nbytes and s.use_ws:
                p = rt.alloc_raw(req.nbytes)
                stack.callback(rt.free_raw, p)
                ws = WorkspaceView(p, req.nbytes)
            kern.execute(views, [o.mut() for o in outs], ws)
            rt.synchronize()
            got = [o.numpy() for o in outs]
        assert rt.launch_count > launches
        assert rt.memory_stats().live_bytes == before
        err = rel_fro(got[0], want[0])
        assert err < TOL[s.dtype], f"Y rel_fro {err:.2e} (plan {kern.last_plan}) for {s}"
        for g, w in zip(got[1:], want[1:]):  # present K/V are copies: bitwise
            np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))
        rt.latch.check()
