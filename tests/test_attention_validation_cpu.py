"""Bad input to ``pkg.nxrt::Attention`` (issue 37): one regression test per class, on the
fake runtime (no GPU).

Every refusal is checked to change nothing: the fake's launch log stays empty and every
backed buffer (inputs, output, workspace) holds its bytes. The classes: numpy/float dims (1),
strides and the pointer range (2), output overlap (3), absent slots and wrong objects (4),
refusal before any launch or allocation (5), extra slots, unknown attributes and a wrong op
(6), the reference's validation (7), float32 attributes (8).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from attnrt.ops.attention import AttentionConfig, AttentionFactory, parse_attributes, reference
from attnrt.runtime.api import DataType, Node, TensorMetadata, TensorMut, TensorView, WorkspaceView
from attnrt.runtime.errors import KernelError
from tests._fakes import FakeRuntime
from tests._nodes import attention_node

F32 = DataType.FLOAT
B, H, HKV, SQ, SK, D = 2, 4, 2, 3, 5, 8
Q_SHAPE, KV_SHAPE = (B, H, SQ, D), (B, HKV, SK, D)


def make_node(mask: bool = True, **attrs: Any) -> Node:
    return attention_node({"num_heads": H, "kv_num_heads": HKV, **attrs}, mask)


def make_case(*, mask: bool = True, seed: int = 37, config: AttentionConfig | None = None,
              workspace: bool = True, **attrs: Any) -> SimpleNamespace:
    """A valid call with every buffer backed (B=2, H=4, Hkv=2, Sq=3, Sk=5, D=8, f32; a
    B*H-plane mask); ``num_splits=2`` by default, so that it uses a workspace."""
    rng = np.random.default_rng(seed)
    rt = FakeRuntime()
    host = [rng.standard_normal(s).astype(np.float32) for s in (Q_SHAPE, KV_SHAPE, KV_SHAPE)]
    if mask:
        host.append(rng.standard_normal((B, H, SQ, SK)).astype(np.float32))
    ins = [TensorView(rt.put(a), F32, a.shape) for a in host]
    out = TensorMut(rt.put(rng.standard_normal(Q_SHAPE).astype(np.float32)), F32, Q_SHAPE)
    node = make_node(mask, **attrs)
    kern = AttentionFactory(rt, config or AttentionConfig(num_splits=2)).create(node)
    req = kern.workspace_requirement([t.meta for t in ins])
    ws = None
    if workspace and req.nbytes:
        ws = WorkspaceView(rt.put(np.full(req.nbytes, 0xAB, np.uint8)), req.nbytes)
    return SimpleNamespace(rt=rt, node=node, kern=kern, ins=ins, out=out, outs=[out], ws=ws,
                           host=host, req=req)


def backed(c: SimpleNamespace) -> list[tuple[int, bytes]]:
    """The bytes of every buffer of the call (inputs, output, workspace)."""
    spans = [(t.ptr, t.nbytes) for t in c.ins + [c.out]] + ([(c.ws.ptr, c.ws.nbytes)] if c.ws else [])
    return [(p, c.rt.read(p, n).tobytes()) for p, n in spans]


def assert_refused(c: SimpleNamespace, call: Any, exc: type[BaseException], match: str) -> BaseException:
    """``call()`` raises ``exc`` and changes nothing: no launch, no allocation, every buffer
    as before."""
    before, live = backed(c), c.rt.memory_stats().live_bytes
    with pytest.raises(exc, match=match) as got:
        call()
    assert c.rt.launches == [], c.rt.names()
    assert backed(c) == before
    assert c.rt.memory_stats().live_bytes == live
    return got.value


def execute(c: SimpleNamespace, ins: Any = None, outs: Any = None, ws: Any = "case") -> Any:
    return lambda: c.kern.execute(c.ins if ins is None else ins, c.outs if outs is None else outs,
                                  c.ws if ws == "case" else ws)


def launches(rt: FakeRuntime) -> list[tuple[str, list[str]]]:
    return [(x.name, [repr(a) for a in x.args]) for x in rt.launches]


def test_valid_case_runs_split():
    c = make_case()
    assert c.req.nbytes > 0
    c.kern.execute(c.ins, c.outs, c.ws)
    assert c.rt.names() == ["attn_fused_simt", "attn_combine"]


# -- 1: numpy integer and non-integer dims ---------------------------------------------------
def test_class1_numpy_int_dims_keep_the_python_verdict():
    f = AttentionFactory(FakeRuntime())
    big = Node("Attention", "pkg.nxrt", {"num_heads": 65536}, ["q", "k", "v", "m"], ["o"])
    cases = [  # (node, shapes): B*H = 2**32 (refused), a valid B*H-plane mask, a valid case
        (big, [(65536, 65536, 1, 8), (65536, 65536, 1, 8), (65536, 65536, 1, 8)]),
        (make_node(), [(2, 4, 16, 8), (2, 2, 16, 8), (2, 2, 16, 8), (2, 4, 16, 16)]),
        (make_node(), [Q_SHAPE, KV_SHAPE, KV_SHAPE, (8, SQ, SK)]),
    ]
    for node, shapes in cases:
        want = f.unsupported_reason(node, shapes, [F32] * len(shapes))
        for cast in (np.int32, np.int8, np.int16, np.int64):
            if max(map(max, shapes)) > np.iinfo(cast).max:
                continue
            got = f.unsupported_reason(node, [tuple(cast(d) for d in s) for s in shapes],
                                       [F32] * len(shapes))
            assert got == want, (cast, shapes, got, want)
    assert f.unsupported_reason(*cases[0], [F32] * 3) is not None
    assert f.unsupported_reason(*cases[1], [F32] * 4) is None
    # A dim of 2.5, 2.0, True or np.float64 is refused, never truncated.
    for bad in (2.5, 2.0, True, np.float64(2)):
        reason = f.unsupported_reason(make_node(False), [(bad, H, SQ, D), KV_SHAPE, KV_SHAPE], [F32] * 3)
        assert reason is not None and "dimension" in reason, (bad, reason)


# -- 2: strides and the pointer range ----------------------------------------------------------
def test_class2_strides_and_byte_range_are_checked_before_launch():
    c = make_case()
    metas = [t.meta for t in c.ins]
    for stride in (2**61, 2**62, 2**63):  # B has 2 elements: the byte offset leaves 2**63
        metas[0] = TensorMetadata(F32, Q_SHAPE, (stride, SQ * D, D, 1))
        with pytest.raises(KernelError, match="64-bit pointer"):
            c.kern.workspace_requirement(metas)
        ins = [TensorView(c.ins[0].ptr, F32, Q_SHAPE, (stride, SQ * D, D, 1))] + c.ins[1:]
        assert_refused(c, execute(c, ins=ins), KernelError, "64-bit pointer")
        out = TensorMut(c.out.ptr, F32, Q_SHAPE, (stride, SQ * D, D, 1))
        assert_refused(c, execute(c, outs=[out]), KernelError, "64-bit pointer")


# -- 3: output overlap -------------------------------------------------------------------------
def test_class3_overlapping_outputs_are_refused():
    c = make_case()
    p = c.out.ptr
    for strides in ((0, SQ * D, D, 1), (H * SQ * D, 0, D, 1), (H * SQ * D, SQ * D, D // 2, 1),
                    (H * SQ * D, SQ * D, 0, 1)):
        assert_refused(c, execute(c, outs=[TensorMut(p, F32, Q_SHAPE, strides)]), KernelError,
                       "overlaps itself")
    for i, t in enumerate(c.ins):  # Attention defines no alias: every input is refused
        for off in (0, 4, t.nbytes - 4):
            err = assert_refused(c, execute(c, outs=[TensorMut(t.ptr + off, F32, Q_SHAPE)]),
                                 KernelError, "overlaps input")
            assert ("Q", "K", "V", "mask")[i] in str(err)
    # The workspace is written too: it may overlap neither the output nor an input.
    for at in (c.out.ptr // 256 * 256, c.ins[1].ptr // 256 * 256):
        assert_refused(c, execute(c, ws=WorkspaceView(at, c.req.nbytes)), KernelError,
                       "workspace .* overlaps")


# -- 4: absent slots and wrong objects -------------------------------------------------------
def test_class4_absent_slots_have_one_form_and_wrong_objects_are_type_errors():
    c = make_case(mask=False)
    runs = []
    for ins in (c.ins, c.ins + [None], c.ins + [TensorView.absent_slot()], tuple(c.ins)):
        c.rt.launches.clear()
        c.kern.execute(ins, c.outs, c.ws)
        runs.append(launches(c.rt))
    assert runs[0] and all(r == runs[0] for r in runs)
    assert c.kern.workspace_requirement([t.meta for t in c.ins] + [None]) == c.req
    c.rt.launches.clear()
    assert_refused(c, execute(c, outs=[None]), KernelError, "outputs.0. is required")
    assert_refused(c, execute(c, outs=[]), KernelError, "outputs.0. is required")
    assert_refused(c, execute(c, outs=[TensorView.absent_slot()]), KernelError, "required")
    assert_refused(c, execute(c, ins=[t.meta for t in c.ins]), TypeError, "expected a TensorView")
    assert_refused(c, execute(c, outs=[c.out.meta]), TypeError, "expected a TensorView")
    assert_refused(c, execute(c, ins=[c.ins[0], "k", c.ins[2]]), TypeError, "inputs.1. is a str")
    assert_refused(c, execute(c, ins=dict(enumerate(c.ins))), TypeError, "list")
    with pytest.raises(TypeError, match="TensorMetadata"):
        c.kern.workspace_requirement([t.shape for t in c.ins])
    with pytest.raises(TypeError, match="TensorMetadata"):
        c.kern.workspace_requirement([c.ins[0].meta, KV_SHAPE, KV_SHAPE])


# -- 5: a refusal changes nothing ----------------------------------------------------------------
def test_class5_refusals_come_before_any_allocation_or_launch():
    # The eager unfused path allocates its own workspace when given none: a stride the
    # kernel arguments cannot hold is refused before that allocation, as a KernelError.
    c = make_case(config=AttentionConfig(path="unfused"), workspace=False)
    assert c.req.nbytes > 0 and c.ws is None
    bad = TensorView(c.ins[1].ptr, F32, KV_SHAPE, (2**63, SK * D, D, 1))
    assert_refused(c, execute(c, ins=[c.ins[0], bad, *c.ins[2:]]), KernelError, "64-bit pointer")
    # A split run writes partials into the workspace before the combine: a workspace on the
    # output is refused before the first launch.
    c = make_case()
    assert_refused(c, execute(c, ws=WorkspaceView(c.out.ptr // 256 * 256, c.req.nbytes)),
                   KernelError, "overlaps")


# -- 6: the node: extra slots, unknown attributes, another op ------------------------------------
def test_class6_unknown_attributes_wrong_op_and_extra_slots_are_refused():
    rt = FakeRuntime()
    f = AttentionFactory(rt)
    shapes, dts = [Q_SHAPE, KV_SHAPE, KV_SHAPE], [F32] * 3
    bad_nodes = {
        "unknown attribute": make_node(False, do_rotary=1),
        "typo": make_node(False, scal=0.5),
        "float kv_num_heads": make_node(False, kv_num_heads=2.0),
        "bool kv_num_heads": Node("Attention", "pkg.nxrt", {"num_heads": 1, "kv_num_heads": True},
                                  ["q", "k", "v"], ["o"]),
        "float num_heads": make_node(False, num_heads=4.0),
        "wrong domain": Node("Attention", "com.microsoft", {"num_heads": H}, ["q", "k", "v"], ["o"]),
        "wrong op_type": Node("IndexShare", "pkg.nxrt", {"num_heads": H}, ["q", "k", "v"], ["o"]),
        "five inputs": Node("Attention", "pkg.nxrt", {"num_heads": H, "kv_num_heads": HKV},
                            ["q", "k", "v", "m", "x"], ["o"]),
        "two outputs": Node("Attention", "pkg.nxrt", {"num_heads": H, "kv_num_heads": HKV},
                            ["q", "k", "v"], ["o", "p"]),
    }
    for what, node in bad_nodes.items():
        assert f.unsupported_reason(node, shapes, dts) is not None, what
        with pytest.raises(KernelError):
            f.create(node)
        with pytest.raises(KernelError):
            reference.attention(node, [np.zeros(s, np.float32) for s in shapes])
    with pytest.raises(KernelError, match=r"unknown attribute\(s\) \['do_rotary'\]"):
        f.create(bad_nodes["unknown attribute"])
    assert rt.launches == []
    c = make_case()
    assert_refused(c, execute(c, ins=c.ins + [c.ins[3]]), KernelError, "expected 3 inputs")
    assert_refused(c, execute(c, outs=[c.out, c.out]), KernelError, "at most 1")
    with pytest.raises(KernelError, match="at most 4"):
        c.kern.workspace_requirement([t.meta for t in c.ins] * 2)


# -- 7: the reference validates as the kernel does -----------------------------------------------
@pytest.mark.parametrize("dtypes", [("int8",) * 3, ("bool",) * 3, ("float32", "float16", "float32"),
                                    ("float32", "float32", "float32", "float16"), ("complex64",) * 3])
def test_class7_reference_refuses_what_the_kernel_refuses(dtypes):
    rng = np.random.default_rng(7)
    shapes = [Q_SHAPE, KV_SHAPE, KV_SHAPE, (B, H, SQ, SK)][:len(dtypes)]
    host = [(rng.standard_normal(s) * 3).astype(dt) for s, dt in zip(shapes, dtypes)]
    node = make_node(len(dtypes) == 4)
    with pytest.raises(KernelError) as ref_err:
        reference.attention(node, host)
    if "complex64" in dtypes:  # no DataType: the reference names the numpy dtype
        assert "complex64" in str(ref_err.value)
        return
    c = make_case(mask=len(dtypes) == 4)
    ins = [TensorView(t.ptr, DataType.from_numpy(a.dtype), a.shape) for t, a in zip(c.ins, host)]
    err = assert_refused(c, execute(c, ins=ins, outs=[c.out]), KernelError, "dtype")
    assert str(ref_err.value) == str(err)
    assert "expected" in str(err)


# -- 8: float attributes are float32 values for kernel and reference -----------------------------
def test_class8_softcap_and_scale_are_rounded_to_float32_once():
    rng = np.random.default_rng(8)
    host = [rng.standard_normal(s).astype(np.float32) for s in (Q_SHAPE, KV_SHAPE, KV_SHAPE)]
    assert parse_attributes(make_node(False, softcap=1e-46)).softcap == 0.0
    assert parse_attributes(make_node(False, scale=0.1)).scale == float(np.float32(0.1))
    want = reference.attention(make_node(False), host, out_dtype=np.float64)
    got = reference.attention(make_node(False, softcap=1e-46), host, out_dtype=np.float64)
    np.testing.assert_array_equal(got, want)  # 1e-46 is 0 in float32: no cap, in both
    runs = []
    for attrs in ({}, {"softcap": 1e-46}):
        c = make_case(mask=False, **attrs)
        c.kern.execute(c.ins, c.outs, c.ws)
        runs.append([a for x in c.rt.launches for a in x.args if isinstance(a, np.float32)])
    assert runs[0] == runs[1]
    # scale=1e-46 is 0 in float32: refused (a scale must be > 0), by claim and reference alike.
    node = make_node(False, scale=1e-46)
    assert AttentionFactory(FakeRuntime()).unsupported_reason(node, [Q_SHAPE, KV_SHAPE, KV_SHAPE], [F32] * 3)
    with pytest.raises(KernelError, match="'scale'"):
        reference.attention(node, host)
