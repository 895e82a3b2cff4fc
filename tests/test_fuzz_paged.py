"""Fuzzing ``com.microsoft::PagedAttention`` (LATENT): random valid and invalid calls (hypothesis).

CPU half (runs in CI, no GPU): the shared harness (:mod:`tests._fuzz`) runs the op against
:class:`tests._fakes.FakeRuntime`.

- Valid cases (MLA 576/512 and small head sizes, RoPE half/interleaved, softcap, windows,
  aliasing cache output, host/device ``attention_metadata``, forced paths and splits, with and
  without the workspace) are claimed and run with legal launches; nothing stays allocated.
- Invalid cases (one mutation each: declined modes and inputs, out-of-range attributes,
  wrong dtypes/ranks/dims, absent required inputs, non-contiguous tensors, a cache output
  that does not alias, bad metadata) raise ``KernelError``, ``Unsupported`` or ``ValueError``
  and launch nothing. Declined modes and dtypes are also declined at claim time.
- Oversized cases (one dim or attribute at or past 2**16 / 2**31 / 2**32, or a head size past
  shared memory) are refused before the first launch (by ``workspace_requirement`` when the
  inputs alone decide it) or run with legal launches; never an ``OverflowError``.
- Bad objects, one class of issue 37 each (numpy or non-integer dims, strides and byte
  ranges past the pointer width, overlapping outputs/workspace, wrong objects and absent
  slots, non-integer config knobs, extra slots and unknown or mistyped attributes,
  sub-float32 attribute values) over the whole path: a typed error (``KernelError``,
  ``Unsupported``, ``TypeError``, ``ValueError``, ``WorkspaceError``) that launched nothing
  and left every buffer's bytes alone, or a run. Numpy dims launch exactly what Python ints
  launch, and the reference refuses a mutated call with the kernel's error type.

GPU half (``TestDevice``, marked gpu): random valid cases on the device against
``attnrt.ops.reference`` (output and the updated cache).
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from attnrt.ops.paged_attention import PagedAttentionConfig, PagedAttentionFactory
from attnrt.ops.paged_attention import schema as pa
from attnrt.runtime.api import DataType, TensorMut, TensorView, WorkspaceView
from attnrt.runtime.errors import KernelError, Unsupported, WorkspaceError
from tests._fakes import CPU_SETTINGS, GPU_SETTINGS, FakeRuntime
from tests._fuzz import (
    BIG,
    DROP,
    OpFuzz,
    absent,
    attr_mutation,
    full_path,
    host_tests,
    remember,
    reshaped,
    retyped,
)
from tests.test_paged_cpu import make_case, make_node

BF16, F16, I32 = DataType.BFLOAT16, DataType.FLOAT16, DataType.INT32


# --------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class Spec:
    """One PagedAttention call described by sizes (the GPU half draws data from ``seed``)."""

    dtype: DataType
    H: int
    hs: int
    vhs: int
    bs: int
    q_lens: tuple[int, ...]
    past_lens: tuple[int, ...]
    rope: str | None
    rd: int
    offset: int
    softcap: float
    window: int
    explicit_scale: bool
    extra_cols: int  # block table columns beyond what the sequences need (make_case uses 1)
    cache_out: bool
    meta: str  # none | host | device
    path: str
    num_splits: int | None
    use_ws: bool
    n_inputs: int  # 11 or 17 names on the node
    seed: int = 0

    @property
    def T(self) -> int:
        return sum(self.q_lens)

    @property
    def B(self) -> int:
        return len(self.q_lens)

    def blocks(self) -> tuple[int, int]:
        """(num_blocks, max_blocks) as make_case lays them out."""
        nblk = [-(-(p + q) // self.bs) for p, q in zip(self.past_lens, self.q_lens)]
        return sum(nblk) + 2, max(nblk) + 1 + self.extra_cols

    def max_pos(self) -> int:
        return max(p + q for p, q in zip(self.past_lens, self.q_lens)) + 3

    def scale(self) -> float | None:
        if self.vhs != self.hs or self.explicit_scale:
            return 1.0 / math.sqrt(self.hs)
        return None

    def node(self):  # noqa: ANN201
        return make_node(self.H, vhs=self.vhs if self.vhs != self.hs else 0, scale=self.scale(),
                         rope=self.rope, offset=self.offset, softcap=self.softcap,
                         window=self.window, n_inputs=self.n_inputs)

    def shapes(self) -> list[tuple[int, ...] | None]:
        nb, mb = self.blocks()
        T, B, H, hs = self.T, self.B, self.H, self.hs
        s: list[tuple[int, ...] | None] = [None] * 16
        s[pa.IN_QUERY], s[pa.IN_KEY] = (T, H * hs), (T, hs)
        s[pa.IN_KEY_CACHE] = (nb, self.bs, 1, hs)
        s[pa.IN_CU_SEQLENS], s[pa.IN_PAST_SEQLENS] = (B + 1,), (B,)
        s[pa.IN_BLOCK_TABLE], s[pa.IN_SLOT_MAPPING] = (B, mb), (T,)
        if self.rope:
            s[pa.IN_COS] = s[pa.IN_SIN] = (self.max_pos(), self.rd // 2)
        return s


INDEX_INPUTS = (pa.IN_CU_SEQLENS, pa.IN_PAST_SEQLENS, pa.IN_BLOCK_TABLE, pa.IN_SLOT_MAPPING)


@st.composite
def specs(draw: Any, gpu: bool = False) -> Spec:
    dtype = draw(st.sampled_from([F16, BF16]))
    mla = draw(st.booleans())
    if mla:
        hs, vhs = 576, 512
        H = draw(st.sampled_from([1, 3, 16, 20] if gpu else [1, 5, 16, 63, 64, 65, 128]))
    else:
        hs = draw(st.sampled_from([16, 64, 80, 128, 7, 33]) if gpu
                  else st.sampled_from([1, 2, 7, 16, 33, 64, 80, 128, 192]) | st.integers(1, 640))
        vhs = draw(st.sampled_from([hs, max(1, hs // 2), 1]))
        H = draw(st.integers(1, 8 if gpu else 24))
    bs = draw(st.sampled_from([16, 32, 64] if gpu else [16, 32, 64, 128]))
    B = draw(st.integers(1, 3 if gpu else 4))
    qmax, pmax = (4, 150) if gpu else (6, 300)
    q_lens = tuple(draw(st.lists(st.integers(0, qmax), min_size=B, max_size=B)))
    if gpu and sum(q_lens) == 0:
        q_lens = (1,) + q_lens[1:]
    past_lens = tuple(draw(st.lists(st.integers(0, pmax), min_size=B, max_size=B)))
    rope = draw(st.sampled_from([None, "half", "interleaved"])) if hs >= 2 else None
    rd = offset = 0
    if rope:
        offset = draw(st.integers(0, hs - 2))
        rd = 2 * draw(st.integers(1, (hs - offset) // 2))
        if mla and draw(st.booleans()):
            rd, offset = 64, 512  # DeepSeek's rope slice
    softcap = draw(st.sampled_from([0.0, 0.0, 30.0]))
    window = draw(st.sampled_from([-1, -1, 0, 5, 100]))
    paths = ["auto", "auto", "simple"] + (["mla", "mla64", "mla32"] if mla and not gpu else [])
    return Spec(dtype, H, hs, vhs, bs, q_lens, past_lens, rope, rd, offset, softcap, window,
                draw(st.booleans()), draw(st.integers(0, 2)), draw(st.booleans()),
                draw(st.sampled_from(["none", "host", "device"])), draw(st.sampled_from(paths)),
                draw(st.sampled_from([None, None, 1, 2, 5])), draw(st.booleans()),
                draw(st.sampled_from([11, 17])), draw(st.integers(0, 2**32 - 1)))


# --------------------------------------------------------------------------- CPU cases
def _meta_values(s: Spec) -> np.ndarray:
    return np.array([max(s.q_lens), max(p + q for p, q in zip(s.past_lens, s.q_lens))], np.int32)


def build(rt: FakeRuntime, s: Spec) -> SimpleNamespace:
    shapes = s.shapes()
    ins: list[Any] = []
    for i, shp in enumerate(shapes):
        if shp is None:
            ins.append(TensorView.absent_slot())
        else:
            ins.append(rt.view(shp, I32 if i in INDEX_INPUTS else s.dtype))
    meta: Any = None
    if s.meta == "host":
        meta = _meta_values(s)
    elif s.meta == "device":
        meta = rt.view((2,), I32)
    ins.append(meta)
    out = rt.view((s.T, s.H * s.vhs), s.dtype, mut=True)
    outs: list[Any] = [out]
    kc = ins[pa.IN_KEY_CACHE]
    if s.cache_out:
        outs.append(TensorMut(kc.ptr, kc.dtype, kc.shape))
    kw: dict[str, Any] = {"path": s.path, "num_splits": s.num_splits}
    return SimpleNamespace(node=s.node(), inputs=ins, outputs=outs, kw=kw, use_ws=s.use_ws)


# --------------------------------------------------------------------------- mutations
# Each breaks one rule of a valid case and returns "claim" (the factory must decline it at
# claim time too) or "input" (the kernel refuses it).
def _m_v_head_size(case: SimpleNamespace, data: Any, s: Spec) -> str:
    case.node.attributes["v_head_size"] = s.hs + data.draw(st.integers(1, 64), label="extra")
    case.node.attributes["scale"] = 0.1
    return "input"


def _m_scale_missing(case: SimpleNamespace, data: Any, s: Spec) -> str:
    assume(s.vhs != s.hs)
    case.node.attributes.pop("scale", None)
    return "input"


def _m_rope_inputs_absent(case: SimpleNamespace, data: Any, s: Spec) -> str:
    assume(s.hs >= 2)
    case.node.attributes.update(do_rotary=1, rotary_offset=0)
    which = data.draw(st.sampled_from([(pa.IN_COS,), (pa.IN_SIN,), (pa.IN_COS, pa.IN_SIN)]),
                      label="absent")
    for i in (pa.IN_COS, pa.IN_SIN):
        case.inputs[i] = (TensorView.absent_slot() if i in which
                          else case.inputs[i] if not absent(case.inputs[i])
                          else TensorView(case.inputs[0].ptr, s.dtype, (8, 1)))
    return "input"


def _m_rope_too_wide(case: SimpleNamespace, data: Any, s: Spec) -> str:
    assume(s.rope is not None)
    case.node.attributes["rotary_offset"] = s.hs - s.rd + data.draw(st.integers(1, 8), label="+")
    return "input"


def _m_node_mode(case: SimpleNamespace, data: Any, s: Spec) -> str:
    which = data.draw(st.sampled_from(["layout", "no_layout", "kv_heads", "no_kv_heads", "quant"]),
                      label="mode")
    a = case.node.attributes
    if which == "layout":
        a["kv_cache_layout"] = data.draw(st.sampled_from(["SEPARATE", "latent", "BNSH"]), label="l")
    elif which == "no_layout":
        del a["kv_cache_layout"]
    elif which == "kv_heads":
        a["kv_num_heads"] = data.draw(st.sampled_from([0, 2, 128]), label="kvh")
    elif which == "no_kv_heads":
        del a["kv_num_heads"]
    else:
        name = data.draw(st.sampled_from(pa.QUANT_ATTRS), label="attr")
        a[name] = data.draw(st.sampled_from(["int8", "fp8_e4m3", 1]), label="quant")
    return "claim"


def _m_declined_input(case: SimpleNamespace, data: Any, s: Spec) -> str:
    i = data.draw(st.sampled_from(sorted(pa.DECLINED_INPUTS)), label="input")
    names = list(case.node.inputs) + [None] * (17 - len(case.node.inputs))
    names[i] = pa.INPUT_NAMES[i]
    case.node.inputs = names
    case.inputs[i] = TensorView(case.inputs[0].ptr, s.dtype, (max(s.T, 1), s.hs))
    return "claim"


def _m_packed_qkv(case: SimpleNamespace, data: Any, s: Spec) -> str:
    case.node.inputs[pa.IN_KEY] = None
    case.inputs[pa.IN_KEY] = TensorView.absent_slot()
    return "claim"


def _m_required_absent(case: SimpleNamespace, data: Any, s: Spec) -> str:
    i = data.draw(st.sampled_from([pa.IN_QUERY, pa.IN_KEY_CACHE, *INDEX_INPUTS]), label="input")
    case.inputs[i] = data.draw(st.sampled_from([TensorView.absent_slot(), None]), label="as")
    return "input"


def _m_required_absent_in_node(case: SimpleNamespace, data: Any, s: Spec) -> str:
    i = data.draw(st.sampled_from([pa.IN_QUERY, pa.IN_KEY_CACHE, *INDEX_INPUTS]), label="input")
    case.node.inputs[i] = data.draw(st.sampled_from([None, ""]), label="name")
    case.inputs[i] = TensorView.absent_slot()
    return "claim"


def _m_float_dtype(case: SimpleNamespace, data: Any, s: Spec) -> str:
    i = data.draw(st.sampled_from([pa.IN_QUERY, pa.IN_KEY, pa.IN_KEY_CACHE]), label="input")
    other = [d for d in (DataType.FLOAT, F16, BF16, DataType.INT32, DataType.UINT8) if d != s.dtype]
    case.inputs[i] = retyped(case.inputs[i], data.draw(st.sampled_from(other), label="dtype"))
    return "claim"


def _m_index_dtype(case: SimpleNamespace, data: Any, s: Spec) -> str:
    i = data.draw(st.sampled_from(INDEX_INPUTS), label="input")
    dt = data.draw(st.sampled_from([DataType.INT64, DataType.UINT32, DataType.FLOAT]), label="dt")
    case.inputs[i] = retyped(case.inputs[i], dt)
    return "claim"


def _m_rope_dtype(case: SimpleNamespace, data: Any, s: Spec) -> str:
    assume(s.rope is not None)
    i = data.draw(st.sampled_from([pa.IN_COS, pa.IN_SIN]), label="input")
    other = DataType.FLOAT if data.draw(st.booleans(), label="f32") else (
        BF16 if s.dtype == F16 else F16)
    case.inputs[i] = retyped(case.inputs[i], other)
    return "input"


def _m_shape(case: SimpleNamespace, data: Any, s: Spec) -> str:
    nb, mb = s.blocks()
    T, B, H, hs, bs = s.T, s.B, s.H, s.hs, s.bs
    options = {
        pa.IN_KEY_CACHE: [(nb, bs, hs), (nb, bs, 2, hs), (nb, bs, 1, hs, 1), (0, bs, 1, hs),
                          (nb, bs // 2 + 1, 1, hs), (nb, 8, 1, hs), (nb, 3 * bs // 2, 1, hs)],
        pa.IN_QUERY: [(T, H * hs + 1), (T, H, hs), (T + 1, H * hs)],
        pa.IN_KEY: [(T + 1, hs), (T, hs + 1), (T * hs,)],
        pa.IN_CU_SEQLENS: [(B,), (B + 2,), (B + 1, 1)],
        pa.IN_PAST_SEQLENS: [(0,), (B, 1), ()],
        pa.IN_BLOCK_TABLE: [(B + 1, mb), (B, 0), (B * mb,)],
        pa.IN_SLOT_MAPPING: [(T + 1,), (T, 1)],
    }
    if s.rope:
        half = s.rd // 2
        options[pa.IN_COS] = [(s.max_pos(),), (0, half), (s.max_pos(), half, 1)]
        options[pa.IN_SIN] = [(s.max_pos() + 1, half), (s.max_pos(), half + 1)]
    i = data.draw(st.sampled_from(sorted(options)), label="input")
    shape = data.draw(st.sampled_from(options[i]), label="shape")
    case.inputs[i] = reshaped(case.inputs[i], shape)
    return "input"


def _m_strided(case: SimpleNamespace, data: Any, s: Spec) -> str:
    cands = [i for i in (pa.IN_QUERY, pa.IN_KEY, pa.IN_KEY_CACHE, pa.IN_BLOCK_TABLE)
             if case.inputs[i].numel > 1 and case.inputs[i].shape[-1] > 1]
    assume(cands)
    i = data.draw(st.sampled_from(cands), label="input")
    t = case.inputs[i]
    strides = tuple(2 * x for x in t.element_strides)  # every other element
    case.inputs[i] = type(t)(t.ptr, t.dtype, t.shape, strides)
    return "input"


def _m_output(case: SimpleNamespace, data: Any, s: Spec) -> str:
    o = case.outputs[0]
    which = data.draw(st.sampled_from(["absent", "none", "empty", "shape", "dtype", "strided"]),
                      label="out")
    if which == "absent":
        case.outputs[0] = TensorMut.absent_slot(s.dtype)
    elif which == "none":
        case.outputs = []
    elif which == "empty":
        case.outputs[0] = None
    elif which == "shape":
        case.outputs[0] = reshaped(o, (s.T, s.H * s.vhs + 1))
    elif which == "dtype":
        case.outputs[0] = retyped(o, DataType.FLOAT)
    else:
        assume(s.T > 1 and s.H * s.vhs > 1)
        case.outputs[0] = TensorMut(o.ptr, o.dtype, o.shape, (1, s.T))
    return "input"


def _m_cache_out(case: SimpleNamespace, data: Any, s: Spec) -> str:
    kc = case.inputs[pa.IN_KEY_CACHE]
    which = data.draw(st.sampled_from(["elsewhere", "shape", "dtype"]), label="cache_out")
    if which == "elsewhere":
        other = TensorMut(kc.ptr + 256, kc.dtype, kc.shape)
    elif which == "shape":
        other = TensorMut(kc.ptr, kc.dtype, (kc.shape[0] + 1,) + kc.shape[1:])
    else:
        other = TensorMut(kc.ptr, DataType.FLOAT if kc.dtype != DataType.FLOAT else F16, kc.shape)
    case.outputs = case.outputs[:1] + [other]
    return "input"


def _m_metadata(case: SimpleNamespace, data: Any, s: Spec) -> str:
    bad = data.draw(st.sampled_from(["int64", "rank2", "len4", "negative", "float"]), label="meta")
    case.inputs[16] = {
        "int64": np.array([1, 2], np.int64), "rank2": np.zeros((1, 2), np.int32),
        "len4": np.zeros(4, np.int32), "negative": np.array([-1, 5], np.int32),
        "float": np.array([1.0, 2.0], np.float32)}[bad]
    return "input"


def _m_factory_args(case: SimpleNamespace, data: Any, s: Spec) -> str:
    which = data.draw(st.sampled_from(["path", "splits0", "splits_big", "mla_on_small"]), label="a")
    if which == "path":
        case.kw["path"] = "fastest"
    elif which == "splits0":
        case.kw["num_splits"] = 0
    elif which == "splits_big":
        case.kw["num_splits"] = 65536
    else:
        assume((s.hs, s.vhs) != (576, 512))
        case.kw["path"] = data.draw(st.sampled_from(["mla", "mla64", "mla32"]), label="p")
    return "input"


MUTATIONS = [
    attr_mutation("num_heads", [0, -3, DROP, 2.5, "8", True]),
    attr_mutation("softcap", [-1.0, math.nan, -math.inf, "x"]),
    attr_mutation("softcap", [math.inf], label="_infinite"),
    attr_mutation("softcap", [1e39, 1e300], label="_beyond_float32"),
    attr_mutation("scale", [-1.0, math.nan, math.inf, "x"]),
    attr_mutation("scale", [1e39, 1e300], label="_beyond_float32"),
    attr_mutation("local_window_size", [-2, -1000, 1.5]),
    attr_mutation("rotary_offset", [-1, -64]),
    attr_mutation("v_head_size", [-1, -512]),
    _m_v_head_size, _m_scale_missing, _m_rope_inputs_absent, _m_rope_too_wide, _m_node_mode,
    _m_declined_input, _m_packed_qkv, _m_required_absent, _m_required_absent_in_node,
    _m_float_dtype, _m_index_dtype,
    _m_rope_dtype, _m_shape, _m_strided, _m_output, _m_cache_out, _m_metadata, _m_factory_args,
]


BIG_FIELDS = ["T", "H", "hs", "nb", "bs", "mb", "B", "max_pos", "window", "rotary_offset"]


# --------------------------------------------------------------------------- issue 37 classes
# Bad objects over the whole path (tests._fuzz.full_path: claim, create, workspace, execute):
# each mutation returns {"ok"} (must run), {"refuse"} (must be refused) or an empty set (either);
# a refusal is one of TYPED_ALL, launches nothing and leaves every buffer's bytes as they were
# (the fake's hooks stamp the cache and the output when the kernels "run").
TYPED_ALL = (KernelError, Unsupported, TypeError, ValueError, WorkspaceError)
STAMP = np.full(8, 0x5A, np.uint8)
WORDS = [None, "absent", "meta", "shape", "array", 7, "x"]


def _hooks(rt: FakeRuntime) -> None:
    for e in ("paged_write_bf16", "paged_write_f16"):
        rt.on_launch[e] = lambda a: rt.write(int(a[6]), STAMP)
    for e in ("paged_simple_bf16", "paged_simple_f16", "paged_mla_fwd", "paged_mla_wg_fwd",
                 "paged_mla_pair_fwd"):
        rt.on_launch[e] = lambda a: rt.write(int(a[7]), STAMP)
    rt.on_launch["paged_mla_combine"] = lambda a: rt.write(int(a[2]), STAMP)


def _case37(rt: FakeRuntime, s: Spec) -> SimpleNamespace:
    _hooks(rt)
    case = build(rt, s)
    remember(PAGED, case, cap=4096)
    return case


def _check37(rt: FakeRuntime, case: SimpleNamespace, s: Spec, err: BaseException | None) -> None:
    name, v = getattr(case, "float_attr", (None, None))
    reads = [x for x in rt.launches if "simple" in x.name or "fwd" in x.name]
    if err is None and name and reads:  # the kernels get the attribute's float32 value
        at = (-2 if "simple" in reads[0].name else -3) - (name == "scale")
        # The device split model's arguments (and the pair kernel's tensor map).
        at -= {"wg": 7, "pair": 8}.get(reads[0].name.split("_")[2], 0)
        assert reads[0].args[at] == np.float32(v), (name, v, reads[0].args[at])


def run_full(rt: FakeRuntime, case: SimpleNamespace) -> BaseException | None:
    """The executor's sequence (tests._fuzz.full_path); a typed refusal is returned."""
    return full_path(PAGED, rt, case, typed=TYPED_ALL)[1]


def _present(case: SimpleNamespace, data: Any, outputs: bool = False) -> int:
    idx = [i for i, t in enumerate(case.inputs[:16]) if not absent(t)]
    return data.draw(st.sampled_from(idx + ([-1] if outputs else [])), label="slot")


def _c1_numpy_dims(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    ints = data.draw(st.sampled_from([np.int32, np.int64, np.uint32, np.uint64, np.intp]), label="np")
    case.inputs = [t if absent(t) or not isinstance(t, TensorView)
                   else type(t)(t.ptr, t.dtype, tuple(ints(d) for d in t.shape)) for t in case.inputs]
    case.shapes = [None if x is None else tuple(ints(d) for d in x) for x in case.shapes]
    return {"ok"}


def _c1_float_claim_dim(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    i = _present(case, data)
    bad = data.draw(st.sampled_from([2.5, 1.0, True, None, "3", -1]), label="dim")
    shp = list(case.shapes[i])
    assume(shp)
    shp[data.draw(st.integers(0, len(shp) - 1), label="axis")] = bad
    case.shapes[i] = tuple(shp)
    return {"refuse"}


def _c2_strides(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    i = _present(case, data, outputs=True)
    t = case.outputs[0] if i < 0 else case.inputs[i]
    assume(t.rank >= 1 and t.numel > 0)
    kind = data.draw(st.sampled_from(["stride", "top", "size1"]), label="kind")
    if kind == "top":
        gap = data.draw(st.integers(1, 8), label="gap")
        assume(t.nbytes > gap)  # bytes past 2**64 (a fitting pointer would be foreign to the fake)
        bad, verdict = type(t)(2**64 - gap, t.dtype, t.shape), {"refuse"}
    else:
        axis = data.draw(st.integers(0, t.rank - 1), label="axis")
        big = data.draw(st.sampled_from([2**61, 2**62, 2**63, 2**64, -(2**63)] if kind == "stride"
                                        else [2**20, 2**40]), label="stride")
        strides = list(t.element_strides)
        strides[axis] = big
        bad = type(t)(t.ptr, t.dtype, t.shape, tuple(strides))
        # Past the pointer width, or non-contiguous; a size-1 axis may carry a large stride.
        past = abs(big) * t.dtype.itemsize >= 2**63 or t.shape[axis] > 1
        verdict = {"refuse"} if kind == "stride" and past else set()
    if i < 0:
        case.outputs[0] = bad
    else:
        case.inputs[i] = bad
    return verdict


def _c3_overlap(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    kc, out = case.inputs[pa.IN_KEY_CACHE], case.outputs[0]
    kind = data.draw(st.sampled_from(["out_on_input", "input_on_cache", "cache_out", "ws_on_out"]),
                     label="kind")
    if kind == "out_on_input":
        t = case.inputs[_present(case, data)]
        assume(t.nbytes > 2 and out.numel > 0)
        off = 2 * data.draw(st.integers(0, t.nbytes // 2 - 1), label="off")
        case.outputs[0] = TensorMut(t.ptr + off, out.dtype, out.shape)
        return {"refuse"}
    if kind == "input_on_cache":
        i = data.draw(st.sampled_from([j for j, t in enumerate(case.inputs[:16])
                                       if not absent(t) and j != pa.IN_KEY_CACHE]), label="in")
        t = case.inputs[i]
        assume(t.numel > 0)
        case.inputs[i] = type(t)(kc.ptr, t.dtype, t.shape)
        return {"refuse"}
    if kind == "cache_out":
        how = data.draw(st.sampled_from(["same", "zero", "offset", "transposed"]), label="how")
        strides = {"zero": (0, 0, 0, 0), "transposed": kc.element_strides[::-1]}.get(how)
        ptr = kc.ptr + (kc.dtype.itemsize if how == "offset" else 0)
        case.outputs = [out, TensorMut(ptr, kc.dtype, kc.shape, strides)]
        return {"ok"} if how == "same" else {"refuse"}
    case.ws = lambda req: WorkspaceView(out.ptr // 256 * 256, req.nbytes)
    return set()


def _c4_objects(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    where = data.draw(st.sampled_from(["input", "container", "output", "workspace"]), label="where")
    t0 = case.inputs[pa.IN_QUERY]
    if where == "container":
        how = data.draw(st.sampled_from(["tuple", "dict", "iter"]), label="how")
        case.inputs = {"tuple": tuple, "dict": lambda x: dict(enumerate(x)), "iter": iter}[how](case.inputs)
        return {"ok"} if how == "tuple" else {"refuse"}
    if where == "workspace":
        bad = data.draw(st.sampled_from([4096, "ws", -1, 0]), label="ws")
        case.ws = (lambda req: WorkspaceView(bad, req.nbytes)) if bad == 0 else (lambda req: bad)
        return set() if bad == 0 else {"refuse"}
    if where == "output":
        out = case.outputs[0]
        bad = data.draw(st.sampled_from(["none", "empty", "meta", "extra", "tuple"]), label="out")
        case.outputs = {"none": [None], "empty": [], "meta": [out.meta], "extra": [out, "x"],
                        "tuple": (out,)}[bad]
        return {"ok"} if bad == "tuple" else {"refuse"}
    i = data.draw(st.integers(0, 16), label="slot")
    word = data.draw(st.sampled_from(WORDS), label="word")
    old = case.inputs[i]
    new = {None: None, "absent": TensorView.absent_slot(), "shape": (3, 4), 7: 7, "x": "x",
           "array": np.zeros(3, np.int32),
           "meta": old.meta if isinstance(old, TensorView) and not old.absent else t0.meta}[word]
    case.inputs[i] = new
    if word in (None, "absent"):
        return set()
    return set() if i == pa.IN_ATTENTION_METADATA and word == "array" else {"refuse"}


def _c5_config(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    name = data.draw(st.sampled_from(["num_splits", "max_splits", "mla_tiles"]), label="knob")
    good = {"num_splits": [np.int64(2), np.int32(5), None], "max_splits": [np.int16(4)],
            "mla_tiles": [[32], (np.int64(64), 32)]}[name]
    bad = {"num_splits": [2.5, 2.0, True, "2", -1, 0, 65536], "max_splits": [2.5, 0, True],
           "mla_tiles": [(64.0,), (64, 48), ()]}[name]
    v = data.draw(st.sampled_from(good + bad), label="value")
    case.kw[name] = v
    return {"refuse"} if any(v is b for b in bad) else set()


def _c6_node(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    n, a = case.node, case.node.attributes
    kind = data.draw(st.sampled_from(["inputs", "outputs", "unknown", "int_attr", "flag", "op",
                                      "exec_inputs", "exec_outputs"]), label="kind")
    if kind == "inputs":
        n.inputs = list(n.inputs) + [None] * (17 - len(n.inputs)) + \
            ["x"] * data.draw(st.integers(1, 8), label="extra")
    elif kind == "outputs":
        n.outputs = list(n.outputs) + ["o2"] * data.draw(st.integers(1, 2), label="extra")
    elif kind == "unknown":
        a[data.draw(st.sampled_from(["mask_type", "causal", "smooth_softmax", "num_head"]), label="a")] = 1
    elif kind == "int_attr":
        name = data.draw(st.sampled_from(["num_heads", "kv_num_heads", "local_window_size",
                                          "v_head_size", "rotary_offset"]), label="attr")
        v = a.get(name, 0)
        new = data.draw(st.sampled_from([float(v), bool(v), np.int64(v), np.float32(v)]), label="v")
        a[name] = new
        return set() if isinstance(new, np.integer) else {"refuse"}
    elif kind == "flag":
        a[data.draw(st.sampled_from(["do_rotary", "rotary_interleaved"]), label="f")] = \
            data.draw(st.sampled_from([2, -1, 1.0]), label="v")
    elif kind == "op":
        if data.draw(st.booleans(), label="domain"):
            n.domain = data.draw(st.sampled_from(["", "pkg.nxrt", "com.microsoft.x"]), label="d")
        else:
            n.op_type = data.draw(st.sampled_from(["Attention", "pagedattention"]), label="t")
    elif kind == "exec_inputs":
        case.inputs = list(case.inputs) + [None] * data.draw(st.integers(1, 8), label="extra")
    else:
        case.outputs = list(case.outputs) + [None] * (2 - len(case.outputs)) + [case.outputs[0]]
    return {"refuse"}


def _c8_floats(case: SimpleNamespace, data: Any, s: Spec) -> set[str]:
    name = data.draw(st.sampled_from(["softcap", "scale"]), label="attr")
    v = data.draw(st.sampled_from([1e-46, -1e-46, 1e-40, 1e-39, 3.4e38, 3.5e38, np.float16(0.5),
                                   np.float64(2.0)]), label="v")
    case.node.attributes[name] = v
    case.float_attr = (name, v)
    return set()


CLASSES = [_c1_numpy_dims, _c1_float_claim_dim, _c2_strides, _c3_overlap, _c4_objects, _c5_config,
           _c6_node, _c8_floats]


@st.composite
def host_cases(draw: Any) -> SimpleNamespace:
    """A small valid case as numpy arrays (for the reference and the kernel alike)."""
    hs = draw(st.sampled_from([16, 32, 80]))
    B = draw(st.integers(1, 2))
    return make_case(np.random.default_rng(draw(st.integers(0, 2**16))),
                     dtype=draw(st.sampled_from([BF16, F16])), H=draw(st.integers(1, 3)), hs=hs,
                     vhs=draw(st.sampled_from([hs, hs // 2])), bs=16,
                     q_lens=tuple(draw(st.lists(st.integers(0, 3), min_size=B, max_size=B))),
                     past_lens=tuple(draw(st.lists(st.integers(0, 20), min_size=B, max_size=B))),
                     rope=draw(st.sampled_from([None, "half", "interleaved"])), rd=8,
                     offset=draw(st.integers(0, hs - 8)))


HOST_ATTRS = [("local_window_size", -5), ("local_window_size", 2), ("scale", math.nan),
              ("scale", 1e-46), ("scale", -1.0), ("scale", 0.0), ("softcap", 1e-46),
              ("softcap", -1.0), ("softcap", 5.0), ("do_rotary", 2), ("do_rotary", 1),
              ("do_rotary", 0), ("rotary_offset", 1000), ("kv_num_heads", 4),
              ("kv_num_heads", 1.0), ("kv_num_heads", True), ("kv_cache_layout", "SEPARATE"),
              ("num_heads", 2.5), ("num_heads", 0), ("num_heads", 4), ("qk_output", 1),
              ("v_head_size", 10**6)]
HOST_ARRAYS = ["trim", "flat", "axis", "float32", "float64", "int64", "int16", "bool", "drop"]


def _host_mutation(c: SimpleNamespace, data: Any) -> None:
    kind = data.draw(st.sampled_from(["attr", "array", "count", "value"]), label="kind")
    if kind == "attr":
        name, v = data.draw(st.sampled_from(HOST_ATTRS), label="attr")
        c.node.attributes[name] = v
    elif kind == "array":
        i = data.draw(st.sampled_from([i for i, x in enumerate(c.inputs[:16]) if x is not None]), label="i")
        x, how = c.inputs[i], data.draw(st.sampled_from(HOST_ARRAYS), label="how")
        c.inputs[i] = {"trim": lambda: x[:-1], "flat": lambda: x.reshape(-1), "axis": lambda: x[..., None],
                       "drop": lambda: None}.get(how, lambda: x.astype(how))()
    elif kind == "count":
        n = data.draw(st.sampled_from([0, 3, 7, 10, 18, 20]), label="n")
        c.inputs = c.inputs[:n] if n < 17 else c.inputs + [None] * (n - 17)
    else:
        c.node.inputs = list(c.node.inputs) + [None] * (17 - len(c.node.inputs))
        c.node.inputs[pa.IN_VALUE] = "value"
        c.inputs[pa.IN_VALUE] = c.inputs[pa.IN_KEY].copy()


def _kernel_verdict(c: SimpleNamespace) -> BaseException | None:
    """The kernel's whole path on the fake, on the same arrays."""
    rt = FakeRuntime()
    views = [None if x is None else TensorView(rt.put(x), DataType.from_numpy(x.dtype), x.shape)
             for x in c.inputs]
    out = TensorMut(rt.put(np.zeros((c.T, c.H * c.vhs), c.inputs[0].dtype if c.inputs else np.float16)),
                    c.dtype, (c.T, c.H * c.vhs))
    case = SimpleNamespace(node=c.node, kw={}, inputs=views, outputs=[out], use_ws=True)
    remember(PAGED, case, cap=4096)
    return run_full(rt, case)  # a refusal launched nothing


def _reference_verdict(c: SimpleNamespace) -> BaseException | None:
    from attnrt.ops import reference

    try:
        reference.paged_attention(c.node, c.inputs, strict=False)
    except TYPED_ALL as exc:
        return exc
    return None


# --------------------------------------------------------------------------- oversized cases
BIG_POW2 = [2**16, 2**30, 2**31, 2**32]


@st.composite
def big_cases(draw: Any, field: str) -> SimpleNamespace:
    """Minimal shapes with one dim (or attribute) oversized (the inputs alone decide a refusal)."""
    d = dict(T=1, H=1, hs=draw(st.sampled_from([8, 576])), nb=1, bs=16, mb=1, B=1, max_pos=4)
    attrs: dict[str, Any] = {}
    if field in ("window", "rotary_offset"):
        attrs[{"window": "local_window_size", "rotary_offset": "rotary_offset"}[field]] = \
            draw(st.sampled_from(BIG))
    elif field == "bs":
        d["bs"] = draw(st.sampled_from(BIG_POW2))
    elif field == "hs":
        d["hs"] = draw(st.sampled_from([4096, 16384, 65536, 2**31]))
    else:
        d[field] = draw(st.sampled_from(BIG))
    rope = field == "max_pos" or (field != "rotary_offset" and draw(st.booleans()))
    dtype = draw(st.sampled_from([BF16, F16]))
    T, H, hs, nb, bs, mb, B = (d[k] for k in ("T", "H", "hs", "nb", "bs", "mb", "B"))
    shapes: list[tuple[int, ...] | None] = [None] * 16
    shapes[pa.IN_QUERY], shapes[pa.IN_KEY] = (T, H * hs), (T, hs)
    shapes[pa.IN_KEY_CACHE] = (nb, bs, 1, hs)
    shapes[pa.IN_CU_SEQLENS], shapes[pa.IN_PAST_SEQLENS] = (B + 1,), (B,)
    shapes[pa.IN_BLOCK_TABLE], shapes[pa.IN_SLOT_MAPPING] = (B, mb), (T,)
    if rope:
        shapes[pa.IN_COS] = shapes[pa.IN_SIN] = (d["max_pos"], 4)
    for shp in shapes:
        if shp is not None:
            assume(math.prod(shp) * 2 <= 2**37)  # physically possible tensors only
    vhs = 512 if hs == 576 else hs
    node = make_node(H, vhs=vhs if vhs != hs else 0, scale=0.05, rope="half" if rope else None,
                     **{k: v for k, v in attrs.items() if k != "local_window_size"},
                     window=attrs.get("local_window_size", -1))
    path = draw(st.sampled_from(["auto", "simple"]))
    return SimpleNamespace(node=node, shapes=shapes, dtype=dtype, out_shape=(T, H * vhs),
                           path=path)


def _build_big(rt: FakeRuntime, big: SimpleNamespace) -> SimpleNamespace:
    ins = [TensorView.absent_slot() if shp is None else
           rt.view(shp, I32 if i in INDEX_INPUTS else big.dtype)
           for i, shp in enumerate(big.shapes)] + [None]
    out = rt.view(big.out_shape, big.dtype, mut=True)
    return SimpleNamespace(node=big.node, inputs=ins, outputs=[out], kw={"path": big.path},
                           use_ws=True)


def _check_valid(rt: FakeRuntime, case: SimpleNamespace, s: Spec) -> None:
    names = rt.names()
    if s.T == 0:
        assert names == []
    else:
        assert names[0].startswith("paged_write_"), names
        assert any(case.outputs[0].ptr in x.args for x in rt.launches[1:])


PAGED = OpFuzz(
    factory=PagedAttentionFactory, config=PagedAttentionConfig, specs=specs, build=build,
    check_valid=_check_valid, mutations=MUTATIONS, big_fields=BIG_FIELDS, big_specs=big_cases,
    build_big=_build_big, claim_slots=16, workspace_from_metas=False,
    classes=CLASSES, case37=_case37, check37=_check37, typed37=TYPED_ALL)


# --------------------------------------------------------------------------- CPU properties
class TestHost(host_tests(PAGED)):
    """No GPU: the shared properties and the issue-37 classes (tests._fuzz), then numpy dims and
    the reference's refusals."""

    @settings(CPU_SETTINGS, max_examples=30)
    @given(s=specs(), data=st.data())
    def test_numpy_integer_dims_launch_what_python_ints_launch(self, s: Spec, data: Any) -> None:
        records = []
        for numpy_dims in (False, True):
            rt = FakeRuntime()  # fresh: the same addresses in the same order
            case = _case37(rt, s)
            if numpy_dims:
                _c1_numpy_dims(case, data, s)
            assert run_full(rt, case) is None
            records.append([(x.name, x.grid, x.block, x.shared_mem, [repr(a) for a in x.args])
                            for x in rt.launches])
        assert records[0] == records[1]

    @settings(CPU_SETTINGS, max_examples=60)
    @given(c=host_cases(), data=st.data())
    def test_reference_refuses_exactly_what_the_kernel_refuses(self, c: SimpleNamespace,
                                                               data: Any) -> None:
        _host_mutation(c, data)
        kern, ref = _kernel_verdict(c), _reference_verdict(c)
        assert type(kern) is type(ref), f"kernel {kern!r} but reference {ref!r}"


# --------------------------------------------------------------------------- GPU half


@pytest.mark.gpu
class TestDevice:
    """Random valid cases on the GPU against the float64 reference (output and cache)."""

    @GPU_SETTINGS
    @given(s=specs(gpu=True))
    def test_random_valid_cases_match_reference(self, rt: Any, s: Spec) -> None:
        from attnrt.ops import reference
        from attnrt.runtime.tensors import DeviceArray
        from tests._util import TOL, rel_fro

        rng = np.random.default_rng(s.seed)
        c = make_case(rng, dtype=s.dtype, H=s.H, hs=s.hs, vhs=s.vhs, bs=s.bs, q_lens=s.q_lens,
                      past_lens=s.past_lens, rope=s.rope, rd=s.rd or 16, offset=s.offset,
                      softcap=s.softcap, window=s.window, extra_blocks=2)
        node = s.node()
        before = rt.memory_stats().live_bytes
        launches = rt.launch_count
        with ExitStack() as stack:
            def upload(a: np.ndarray) -> DeviceArray:
                d = DeviceArray.from_numpy(rt, a)
                stack.callback(d.free)
                return d

            bufs = {i: upload(x) for i, x in enumerate(c.inputs[:16]) if x is not None}
            views: list[Any] = [bufs[i].view() if i in bufs else TensorView.absent_slot()
                                for i in range(16)]
            views.append(_meta_values(s) if s.meta == "host" else None)
            out = DeviceArray(rt, (c.T, s.H * s.vhs), s.dtype)
            stack.callback(out.free)
            out.fill_bytes(0xFF)
            outs = [out.mut()] + ([bufs[pa.IN_KEY_CACHE].mut()] if s.cache_out else [])
            cfg = PagedAttentionConfig(path=s.path, num_splits=s.num_splits)
            kern = PagedAttentionFactory(rt, config=cfg).create(
                node, [v.shape if not absent(v) else None for v in views[:16]])
            req = kern.workspace_requirement(views)
            ws = None
            if req.nbytes and s.use_ws:
                p = rt.alloc_raw(req.nbytes)
                stack.callback(rt.free_raw, p)
                ws = WorkspaceView(p, req.nbytes)
            kern.execute(views, outs, ws)
            rt.synchronize()
            got, cache = out.numpy(), bufs[pa.IN_KEY_CACHE].numpy()
        assert rt.launch_count > launches
        assert rt.memory_stats().live_bytes == before
        ref_out, ref_cache = reference.paged_attention(node, c.inputs, strict=True)
        err = rel_fro(got, ref_out)
        assert err < TOL[s.dtype], f"output rel_fro {err:.2e} (plan {kern.last_plan}) for {s}"
        flat, rflat = cache.reshape(-1, s.hs), ref_cache.reshape(-1, s.hs)
        e = rel_fro(flat, rflat)
        assert e < TOL[s.dtype], f"cache rel_fro {e:.2e} for {s}"
        if not s.rope:  # without RoPE the write is a copy: bitwise
            np.testing.assert_array_equal(flat.view(np.uint16), rflat.view(np.uint16))
        rt.latch.check()
