"""Bad input to ``pkg.nxrt::IndexShare`` (issue 37): one regression test per class, on the
fake runtime (no GPU).

Every refusal is checked to change nothing: the fake's launch log stays empty and every
backed buffer (inputs, outputs, the workspace) holds its bytes. The classes: numpy/float
dims (1), strides and the pointer range (2), output overlap (3), absent slots and wrong
objects (4), refusal before any write or launch (5), extra slots, unknown attributes and a
wrong op (6), the reference's validation (7), float32 attributes (8).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from attnrt.ops.index_share import (
    IndexShareConfig,
    IndexShareFactory,
    SelectedIndicesError,
    parse_attributes,
    reference,
)
from attnrt.runtime.api import DataType, Node, TensorMetadata, TensorMut, TensorView, WorkspaceView
from attnrt.runtime.errors import KernelError, WorkspaceError
from tests._fakes import FakeRuntime
from tests._nodes import INDEX_SHARE_INPUTS, index_share_node

F32, I32 = DataType.FLOAT, DataType.INT32
NAMES = list(INDEX_SHARE_INPUTS)


def make_node(mode: str = "none", **attrs: Any) -> Node:
    a = {"num_heads": 4, "kv_num_heads": 2, **attrs}
    return index_share_node(a, 1 if mode == "none" else 3)


def make_case(mode: str = "none", *, cur: int = 1, past: int = 5, K: int = 3, seed: int = 37,
              config: IndexShareConfig | None = None, workspace: bool = True) -> SimpleNamespace:
    """A valid call with every buffer backed (B=2, N=4, Nkv=2, Sq=2, H=8, K=3); in capacity
    mode the bias carries valid lengths [4, 5] and a hook plays the frontier kernel."""
    rng = np.random.default_rng(seed)
    rt = FakeRuntime()
    B, N, Nkv, Sq, H = 2, 4, 2, 2, 8
    cache = past if mode == "capacity" else past + cur
    lens = np.array([cache - 1, cache] if mode == "capacity" else [cache, cache], np.int32)
    bias = np.zeros((B, 1, 1, cache), np.float32)
    for b, n in enumerate(lens):
        bias[b, ..., n:] = -np.inf
    idx = np.full((B, 1, Sq, K), -1, np.int32)
    idx[..., :2] = [0, 2]
    host: list[Any] = [rng.standard_normal(s).astype(np.float32) for s in
                       [(B, N, Sq, H), (B, Nkv, cur, H), (B, Nkv, cur, H), (B, Nkv, past, H),
                        (B, Nkv, past, H)]]
    host += [idx, bias]
    if not past:
        host[3] = host[4] = None
    ins = [TensorView.absent_slot() if a is None else
           TensorView(rt.put(a), I32 if i == 5 else F32, a.shape) for i, a in enumerate(host)]
    out_shapes = [(B, N, Sq, H)] + ([] if mode == "none" else [(B, Nkv, cache, H)] * 2)
    outs = [TensorMut(rt.put(rng.standard_normal(s).astype(np.float32)), F32, s) for s in out_shapes]
    rt.on_launch["is_frontier"] = lambda args: rt.write(args[1], lens)
    node = make_node(mode)
    kern = IndexShareFactory(rt, config).create(node)
    ws = None
    req = kern.workspace_requirement([None if t.absent else t.meta for t in ins])
    if workspace and req.nbytes:
        ws = WorkspaceView(rt.put(np.full(req.nbytes, 0xAB, np.uint8)), req.nbytes)
    return SimpleNamespace(rt=rt, node=node, kern=kern, ins=ins, outs=outs, ws=ws, host=host,
                           lens=lens, mode=mode)


def backed(c: SimpleNamespace) -> list[tuple[int, bytes]]:
    """The bytes of every buffer of the call (inputs, outputs, workspace)."""
    views = [t for t in c.ins + c.outs if t is not None and not t.absent and t.ptr]
    spans = [(t.ptr, t.nbytes) for t in views] + ([(c.ws.ptr, c.ws.nbytes)] if c.ws else [])
    out = []
    for ptr, n in spans:
        data = c.rt.read(ptr, n)
        if data is not None:
            out.append((ptr, data.tobytes()))
    return out


def assert_refused(c: SimpleNamespace, call: Any, exc: type[BaseException], match: str) -> None:
    """``call()`` raises ``exc`` and changes nothing: no launch, every buffer as before."""
    before = backed(c)
    assert before, "the case has backed buffers"
    with pytest.raises(exc, match=match):
        call()
    assert c.rt.launches == [], [x.name for x in c.rt.launches]
    assert backed(c) == before


def execute(c: SimpleNamespace, ins: Any = None, outs: Any = None) -> Any:
    return lambda: c.kern.execute(c.ins if ins is None else ins, c.outs if outs is None else outs,
                                  c.ws)


def claim(node: Node, shapes: list, dtypes: list | None = None) -> str | None:
    dts = dtypes or [F32] * 5 + [I32, F32]
    return IndexShareFactory().unsupported_reason(node, shapes, dts[:len(shapes)])


SHAPES = [(2, 4, 2, 8), (2, 2, 1, 8), (2, 2, 1, 8), (2, 2, 5, 8), (2, 2, 5, 8), (2, 1, 2, 3),
          (2, 1, 1, 6)]


def test_valid_cases_run():
    for mode in ("none", "concat", "capacity"):
        c = make_case(mode)
        c.kern.execute(c.ins, c.outs, c.ws)
        assert any(x.name.startswith("is_attn_") for x in c.rt.launches)
    c = make_case("capacity")  # the in-place cache: present K/V alias past K/V exactly
    c.outs[1:] = [TensorMut(t.ptr, t.dtype, t.shape) for t in c.ins[3:5]]
    c.kern.execute(c.ins, c.outs, c.ws)
    assert any(x.name == "is_scatter_w16" or x.name.startswith("is_scatter") for x in c.rt.launches)


# -- 1: numpy integer and non-integer dims ---------------------------------------------------
def test_class1_numpy_dims_keep_the_verdict_and_non_integers_are_refused():
    node = make_node()
    for cast in (np.int32, np.int8, np.int64, np.uint16):
        assert claim(node, [tuple(cast(d) for d in s) for s in SHAPES]) is None
    # A numpy-int view behaves as a Python-int one.
    c = make_case()
    c.ins[0] = TensorView(c.ins[0].ptr, F32, tuple(np.int32(d) for d in c.ins[0].shape))
    c.kern.execute(c.ins, c.outs, c.ws)
    # A dim of 2.0, 2.5, True or np.float64 is not truncated to an integer.
    for bad in (2.0, 2.5, True, np.float64(2)):
        shapes = [(bad,) + SHAPES[0][1:]] + SHAPES[1:]
        reason = claim(node, shapes)
        assert reason is not None and "shape" in reason, (bad, reason)


# -- 2: strides and the pointer range ----------------------------------------------------------
def test_class2_strides_and_byte_range_are_checked_before_launch():
    c = make_case("concat")
    metas = [t.meta for t in c.ins]
    metas[0] = TensorMetadata(F32, (2, 4, 2, 8), (2**62, 16, 8, 1))
    with pytest.raises(KernelError, match="64-bit pointer"):
        c.kern.workspace_requirement(metas)
    metas[0] = TensorMetadata(F32, (2, 4, 2, 8), (2**63, 16, 8, 1))
    with pytest.raises(KernelError, match="64-bit pointer"):
        c.kern.workspace_requirement(metas)
    for strides in ((2**62, 16, 8, 1), (2**63, 16, 8, 1)):
        ins = list(c.ins)
        ins[0] = TensorView(c.ins[0].ptr, F32, c.ins[0].shape, strides)
        assert_refused(c, execute(c, ins), KernelError, "64-bit pointer")
    # A contiguous tensor whose bytes run past the top of the address space.
    ins = list(c.ins)
    ins[0] = TensorView(2**64 - 256, F32, c.ins[0].shape)
    assert_refused(c, execute(c, ins), KernelError, "64-bit pointer range")
    outs = list(c.outs)
    outs[1] = TensorMut(2**64 - 256, F32, c.outs[1].shape)
    assert_refused(c, execute(c, outs=outs), KernelError, "64-bit pointer range")


# -- 3: outputs overlapping themselves, each other or inputs ----------------------------------
def test_class3_output_overlap_is_refused_except_the_capacity_alias():
    # The capacity cache may alias its past exactly, but not when the current key is that
    # same buffer (cur == past): the scatter would read what it writes.
    c = make_case("capacity", cur=5, past=5)
    ins = list(c.ins)
    ins[1], ins[2] = c.ins[3], c.ins[4]  # key is past_key, value is past_value
    outs = [c.outs[0]] + [TensorMut(t.ptr, t.dtype, t.shape) for t in c.ins[3:5]]
    assert_refused(c, execute(c, ins, outs), KernelError, "present_key .* overlaps input key")
    # The same alias with distinct current tokens is the in-place cache: accepted.
    c2 = make_case("capacity", cur=5, past=5)
    outs2 = [c2.outs[0]] + [TensorMut(t.ptr, t.dtype, t.shape) for t in c2.ins[3:5]]
    c2.kern.execute(c2.ins, outs2, c2.ws)
    assert c2.rt.launches
    # A partial alias, Y over an input, presents over each other, a zero stride.
    c = make_case("capacity")
    pk = c.ins[3]
    for outs, match in (
            ([c.outs[0], TensorMut(pk.ptr + 32, F32, pk.shape), c.outs[2]], "overlaps"),
            ([TensorMut(c.ins[0].ptr, F32, c.outs[0].shape)] + c.outs[1:], "output Y .* overlaps"),
            ([c.outs[0], c.outs[1], TensorMut(c.outs[1].ptr, F32, c.outs[1].shape)], "overlaps"),
            ([TensorMut(c.outs[0].ptr, F32, c.outs[0].shape, (0, 16, 8, 1))] + c.outs[1:],
             "overlaps itself")):
        assert_refused(c, execute(c, outs=outs), KernelError, match)


# -- 4: absent slots and wrong objects --------------------------------------------------------
def test_class4_absent_slots_and_wrong_objects_are_typed_errors():
    # None and absent_slot() mean the same, in workspace_requirement and execute.
    runs = []
    for absent in (None, TensorView.absent_slot()):
        d = make_case(past=0, cur=3)
        ins = d.ins[:3] + [absent, absent] + d.ins[5:6] + [absent]
        metas = [None if t is None or t.absent else t.meta for t in ins[:3]] + [absent, absent]
        req = d.kern.workspace_requirement(metas + [ins[5].meta, absent])
        d.kern.execute(ins, d.outs + [absent, absent], d.ws)
        runs.append((req, [(x.name, x.grid) for x in d.rt.launches]))
    assert runs[0] == runs[1] and runs[0][1]
    c = make_case()
    assert_refused(c, execute(c, [t.meta for t in c.ins]), TypeError, r"inputs\[0\] is a TensorMetadata")
    assert_refused(c, execute(c, c.ins[:2] + ["v"] + c.ins[3:]), TypeError, r"inputs\[2\] is a str")
    assert_refused(c, execute(c, outs=[c.outs[0].meta]), TypeError, r"outputs\[0\] is a TensorMetadata")
    assert_refused(c, execute(c, ins=tuple(c.ins[:6]) + (c.ins[6].meta,)), TypeError, "inputs")
    with pytest.raises(TypeError, match="TensorMetadata"):
        c.kern.workspace_requirement([t.shape for t in c.ins])
    with pytest.raises(TypeError, match="list"):
        c.kern.workspace_requirement(None)
    assert_refused(c, execute(c, outs=[None]), KernelError, r"outputs\[0\] is required")
    assert_refused(c, execute(c, outs=[]), KernelError, r"outputs\[0\] is required")
    bad = Node("IndexShare", "pkg.nxrt", [("num_heads", 4)], list(NAMES), ["y"])
    with pytest.raises(TypeError, match="attributes must be a dict"):
        IndexShareFactory(c.rt).create(bad)
    assert "attributes must be a dict" in claim(bad, SHAPES)
    assert c.rt.launches == []


# -- 5: a refused call writes and launches nothing ---------------------------------------------
@pytest.mark.parametrize("mode", ["none", "concat", "capacity"])
def test_class5_index_refusal_changes_nothing(mode):
    # splits/merge pinned so the workspace carries split counters the call would clear.
    c = make_case(mode, K=64, config=IndexShareConfig(path="simt", splits=2, merge="last"))
    assert c.ws is not None
    bad = c.host[5].copy()
    # Capacity: batch 0's valid length is 4 < capacity 5, so index 4 is refused there
    # (only the bias says so); otherwise an index past the cache.
    bad[0, 0, 1, 2] = int(c.lens[0])
    c.rt.write(c.ins[5].ptr, bad)
    assert_refused(c, execute(c), SelectedIndicesError, "batch=0, head=0, query=1, column=2")
    # The same call with good indices runs (and clears the counters it needs).
    c.rt.write(c.ins[5].ptr, c.host[5])
    c.kern.execute(c.ins, c.outs, c.ws)
    assert c.rt.launches


def test_class5_every_host_refusal_precedes_the_first_write():
    c = make_case("capacity", K=64, config=IndexShareConfig(path="simt", splits=2, merge="last"))
    short = WorkspaceView(c.ws.ptr, c.ws.nbytes - 4)
    before = backed(c)
    with pytest.raises(WorkspaceError, match="short"):
        c.kern.execute(c.ins, c.outs, short)
    assert c.rt.launches == [] and backed(c) == before


# -- 6: extra slots, unknown attributes, wrong op, non-integer attributes --------------------
def test_class6_silently_ignored_input_is_refused():
    rt = FakeRuntime()
    f = IndexShareFactory(rt)
    cases = [
        (make_node(softcap=30.0), "unknown attribute"),
        (make_node(kv_num_heads=1.0), "kv_num_heads=1.0 is not an integer"),
        (make_node(kv_num_heads=True), "kv_num_heads=True is a bool"),
        (make_node(num_heads=np.float32(4)), "num_heads"),
        (Node("IndexShare", "com.microsoft", {"num_heads": 4}, list(NAMES), ["y"]), "com.microsoft"),
        (Node("Attention", "pkg.nxrt", {"num_heads": 4}, list(NAMES), ["y"]), "Attention"),
        (Node("IndexShare", "pkg.nxrt", {"num_heads": 4}, NAMES + ["extra"], ["y"]), "8 inputs"),
        (Node("IndexShare", "pkg.nxrt", {"num_heads": 4}, list(NAMES), ["y", "a", "b", "c"]),
         "4 outputs"),
    ]
    for node, match in cases:
        with pytest.raises(KernelError, match=match):
            f.create(node)
        assert claim(node, SHAPES) is not None, node
    c = make_case()
    assert_refused(c, execute(c, c.ins + [c.ins[0]]), KernelError, "at most 7")
    assert_refused(c, execute(c, outs=c.outs + c.outs * 3), KernelError, "at most 3")
    assert claim(make_node(), SHAPES + [SHAPES[0]]) is not None
    assert rt.launches == []


# -- 7: the reference validates as the kernel does --------------------------------------------
def test_class7_reference_refuses_what_the_kernel_refuses():
    c = make_case()
    host = c.host
    bad_nodes = [make_node(softcap=1.0), make_node(kv_num_heads=True),
                 Node("IndexShare", "com.microsoft", {"num_heads": 4}, list(NAMES), ["y"]),
                 Node("IndexShare", "pkg.nxrt", {"num_heads": 4}, NAMES + ["x"], ["y"]),
                 make_node(scale=1e-46), make_node(scale=1e39)]
    for node in bad_nodes:
        with pytest.raises(KernelError) as want:
            IndexShareFactory(c.rt).create(node)
        with pytest.raises(KernelError) as got:
            reference.index_share(node, host)
        assert str(got.value) == str(want.value)
    with pytest.raises(TypeError, match="attributes must be a dict"):
        reference.index_share(Node("IndexShare", "pkg.nxrt", None, list(NAMES), ["y"]), host)
    with pytest.raises(TypeError, match=r"inputs\[0\] \(query\) is a list"):
        reference.index_share(make_node(), [host[0].tolist()] + host[1:])
    with pytest.raises(KernelError, match="at most 7"):
        reference.index_share(make_node(), host + [host[0]])
    with pytest.raises(KernelError, match="INT32 or INT64"):
        reference.index_share(make_node(), host[:5] + [host[5].astype(np.float32), host[6]])
    # Index rules: the same first violation as the kernel's.
    bad = host[5].copy()
    bad[1, 0, 0, 1] = 0
    with pytest.raises(SelectedIndicesError) as got:
        reference.index_share(make_node(), host[:5] + [bad, host[6]])
    c.rt.write(c.ins[5].ptr, bad)
    assert_refused(c, execute(c), SelectedIndicesError, str(got.value).replace("[", r"\["))


# -- 8: float attributes are float32 values, one rule ------------------------------------------
def test_class8_scale_is_rounded_to_float32_for_kernel_and_reference():
    scale = 0.1  # not a float32 value
    s32 = float(np.float32(scale))
    assert s32 != scale and parse_attributes(make_node(scale=scale)).scale == s32
    host = make_case().host
    a = reference.index_share(make_node(scale=scale), host)[0]
    b = reference.index_share(make_node(scale=s32), host)[0]
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    # The kernel's multiplier comes from the same float32 value.
    args = []
    for s in (scale, s32):
        c = make_case()
        c.kern = IndexShareFactory(c.rt).create(make_node(scale=s))
        c.kern.execute(c.ins, c.outs, None)
        args.append([x for x in c.rt.launches[-1].args if isinstance(x, np.float32)])
    assert args[0] == args[1] == [np.float32(s32 * math.log2(math.e))]
    # A scale that float32 flushes to zero (or overflows) is refused by both.
    for bad in (1e-46, 1e39):
        with pytest.raises(KernelError, match="scale"):
            parse_attributes(make_node(scale=bad))
        with pytest.raises(KernelError, match="scale"):
            reference.index_share(make_node(scale=bad), host)
