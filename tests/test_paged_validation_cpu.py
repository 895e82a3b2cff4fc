"""PagedAttention bad-input regressions (issue 37), one test per class, without a GPU.

Every call runs the executor's path (claim, create, ``workspace_requirement``, ``execute``)
against :class:`tests._fakes.FakeRuntime`, on buffers that hold real bytes (``put``). The
fake's launch hooks play the kernels' writes (the write phase stamps the cache, the read
phase the output), so "a refused call changes nothing" is checked twice after every
refusal: the launch log is empty and every buffer holds its bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from attnrt.ops import reference
from attnrt.ops.paged_attention import PagedAttentionConfig, PagedAttentionFactory
from attnrt.ops.paged_attention import schema as ps
from attnrt.runtime.api import DataType, Node, TensorMetadata, TensorMut, TensorView, WorkspaceView
from attnrt.runtime.errors import CompileError, KernelError, Unsupported, WorkspaceError
from tests._fakes import FakeRuntime
from tests.test_paged_cpu import make_case, make_node

TYPED = (KernelError, Unsupported, TypeError, ValueError, WorkspaceError)
STAMP = np.full(16, 0xA5, np.uint8)


class Rig:
    """One case's arrays on a fake runtime, with kernels that stamp what they write."""

    def __init__(self, rng: np.random.Generator, **case: Any) -> None:
        self.c = c = make_case(rng, **case)
        self.rt = rt = FakeRuntime()
        self.ins: list[Any] = [TensorView.absent_slot() if x is None else self.put(x)
                               for x in c.inputs[:16]]
        dt = c.inputs[0].dtype
        self.out = self.put(np.full((c.T, c.H * c.vhs), 3, dt), mut=True)
        for name in ("paged_write_bf16", "paged_write_f16"):
            rt.on_launch[name] = lambda args: rt.write(int(args[6]), STAMP)  # key_cache
        for name in ("paged_simple_bf16", "paged_simple_f16", "paged_mla_fwd", "paged_mla_wg_fwd",
                 "paged_mla_pair_fwd"):
            rt.on_launch[name] = lambda args: rt.write(int(args[7]), STAMP)  # output

    def put(self, a: np.ndarray, *, mut: bool = False) -> TensorView:
        self._bufs = getattr(self, "_bufs", []) + [(self.rt.put(a), a.nbytes)]
        cls = TensorMut if mut else TensorView
        return cls(self._bufs[-1][0], DataType.from_numpy(a.dtype), a.shape)

    def snapshot(self) -> list[bytes]:
        return [bytes(self.rt.read(p, n)) for p, n in self._bufs]  # type: ignore[arg-type]

    def shapes(self, ins: list[Any] | None = None) -> list[Any]:
        return [None if t is None or t.absent else t.shape for t in (ins or self.ins)[:16]]

    def run(self, *, node: Node | None = None, inputs: Any = None, outputs: Any = None,
            config: PagedAttentionConfig | None = None, workspace: Any = "auto") -> None:
        """create, workspace_requirement and execute, as the executor calls them."""
        node = self.c.node if node is None else node
        ins = self.ins if inputs is None else inputs
        kern = PagedAttentionFactory(self.rt, config=config).create(node, self.shapes(ins))
        req = kern.workspace_requirement([None if t is None or t.absent else t.meta for t in ins[:16]])
        if workspace == "auto":
            workspace = WorkspaceView(self.rt.address(req.nbytes), req.nbytes) if req.nbytes else None
        kern.execute(ins, [self.out] if outputs is None else outputs, workspace)

    def refuses(self, call: Callable[[], Any], exc: Any = TYPED, match: str | None = None) -> BaseException:
        """``call`` raises ``exc`` and leaves no launch and every buffer as it was."""
        before = self.snapshot()
        with pytest.raises(exc, match=match) as ei:
            call()
        assert self.rt.names() == [], f"launched {self.rt.names()} before refusing: {ei.value}"
        assert self.snapshot() == before, f"a buffer changed although {ei.value}"
        return ei.value


def view_like(t: TensorView, *, ptr: int | None = None, shape: Any = None, strides: Any = None,
              dtype: DataType | None = None, cls: type | None = None) -> TensorView:
    return (cls or type(t))(t.ptr if ptr is None else ptr, dtype or t.dtype,
                            t.shape if shape is None else shape, strides)


def test_rig_sees_the_kernels_writes(rng):
    """The checks below can fail: a valid call stamps the cache and the output."""
    r = Rig(rng)
    kc, out = r.ins[ps.IN_KEY_CACHE], r.out
    before = [bytes(r.rt.read(t.ptr, 16)) for t in (kc, out)]  # type: ignore[arg-type]
    r.run()
    assert r.rt.names() == ["paged_write_bf16", "paged_simple_bf16"]
    assert [bytes(r.rt.read(t.ptr, 16)) for t in (kc, out)] == [STAMP.tobytes()] * 2 != before  # type: ignore[arg-type]


# --------------------------------------------------------------------------- 1. numpy ints
def test_1_numpy_integer_shapes_and_attributes_give_python_int_verdicts(rng):
    r = Rig(rng)
    fac = PagedAttentionFactory(r.rt)
    dts = [None if t.absent else t.dtype for t in r.ins]
    for np_int in (np.int16, np.int32, np.uint64):
        shapes = [None if s is None else tuple(np_int(d) for d in s) for s in r.shapes()]
        assert fac.unsupported_reason(r.c.node, shapes, dts) is None
    # Views and attributes given as numpy integers launch exactly what Python ints launch.
    r.run()
    want = [(x.name, x.grid, [repr(a) for a in x.args]) for x in r.rt.launches]
    r.rt.launches.clear()
    node = make_node(np.int32(r.c.H), vhs=np.int16(r.c.vhs), scale=r.c.node.attributes["scale"],
                     window=np.int64(-1), kv_num_heads=np.uint8(1))
    ins = [t if t.absent else type(t)(t.ptr, t.dtype, tuple(np.int32(d) for d in t.shape))
           for t in r.ins]
    r.run(node=node, inputs=ins)
    assert [(x.name, x.grid, [repr(a) for a in x.args]) for x in r.rt.launches] == want
    # A dimension that is not an integer is refused at claim time, never truncated.
    for bad in (2.5, 3.0, True, None):
        shapes = r.shapes()
        shapes[ps.IN_QUERY] = (bad, shapes[ps.IN_QUERY][1])
        reason = fac.unsupported_reason(r.c.node, shapes, dts)
        assert reason is not None and "'query'" in reason, (bad, reason)
        with pytest.raises(Unsupported, match="query"):
            fac.create(r.c.node, shapes)


# --------------------------------------------------------------------------- 2. strides
def test_2_strides_and_byte_ranges_must_fit_a_64_bit_pointer(rng):
    r = Rig(rng, q_lens=(1,), past_lens=(9,))
    q, key, bt = r.ins[ps.IN_QUERY], r.ins[ps.IN_KEY], r.ins[ps.IN_BLOCK_TABLE]
    cases = {
        # size-1 axes may carry any stride for contiguity, but not one past the pointer width
        ps.IN_QUERY: view_like(q, strides=(2**63, 1)),
        ps.IN_KEY: view_like(key, strides=(2**62, 1)),  # 2**62 bf16 elements = 2**63 bytes
        # a table whose bytes run past the end of the address space
        ps.IN_BLOCK_TABLE: view_like(bt, ptr=2**64 - 4),
    }
    for i, bad in cases.items():
        ins = list(r.ins)
        ins[i] = bad
        r.refuses(lambda ins=ins: r.run(inputs=ins), KernelError, "64-bit pointer")
        kern = PagedAttentionFactory(r.rt).create(r.c.node, r.shapes())
        if i != ps.IN_BLOCK_TABLE:  # metadata has no pointer; its strides are checked alike
            meta = [None if t.absent else t.meta for t in ins]
            r.refuses(lambda k=kern, m=meta: k.workspace_requirement(m), KernelError, "64-bit pointer")


# --------------------------------------------------------------------------- 3. overlap
def test_3_outputs_may_not_overlap_themselves_or_inputs_except_the_cache_alias(rng):
    r = Rig(rng)
    q, kc, out = r.ins[ps.IN_QUERY], r.ins[ps.IN_KEY_CACHE], r.out
    # The one alias the op defines: key_cache_out is key_cache.
    r.run(outputs=[out, view_like(kc, cls=TensorMut)])
    assert r.rt.names() == ["paged_write_bf16", "paged_simple_bf16"]
    r.rt.launches.clear()
    bad_outputs = {
        "output on query": [view_like(out, ptr=q.ptr)],
        "output on key_cache": [view_like(out, ptr=kc.ptr + 64)],
        "key_cache_out with zero strides": [out, view_like(kc, strides=(0, 0, 0, 0), cls=TensorMut)],
        "key_cache_out elsewhere": [out, view_like(kc, ptr=out.ptr, cls=TensorMut)],
    }
    for what, outs in bad_outputs.items():
        err = r.refuses(lambda outs=outs: r.run(outputs=outs), KernelError)
        assert "overlap" in str(err) or "alias" in str(err), (what, err)
    # key_cache is written in place: an input that overlaps it is refused too.
    ins = list(r.ins)
    ins[ps.IN_KEY] = view_like(r.ins[ps.IN_KEY], ptr=kc.ptr)
    r.refuses(lambda: r.run(inputs=ins), KernelError, "overlaps input key")


def test_3_workspace_may_not_overlap_the_output(rng):
    r = Rig(rng, H=16, hs=576, vhs=512, bs=64, q_lens=(1,), past_lens=(700,))
    cfg = PagedAttentionConfig(path="mla", num_splits=3)
    kern = PagedAttentionFactory(r.rt, config=cfg).create(r.c.node, r.shapes())
    need = kern.workspace_requirement(r.ins).nbytes
    assert need > 0
    on_out = WorkspaceView(r.out.ptr // 256 * 256, need)  # aligned, starts at or before out
    r.refuses(lambda: r.run(config=cfg, workspace=on_out), KernelError, "overlaps output workspace")


# --------------------------------------------------------------------------- 4. objects
def test_4_absent_slots_have_one_form_and_wrong_objects_are_type_errors(rng):
    r = Rig(rng)
    # None and TensorView.absent_slot() mean the same, and trailing slots may be left out.
    r.run(inputs=[None if t.absent else t for t in r.ins])
    first = [(x.name, x.args) for x in r.rt.launches]
    r.rt.launches.clear()
    r.run(inputs=r.ins[:11])
    assert [(x.name, x.args) for x in r.rt.launches] == first
    r.rt.launches.clear()
    kern = PagedAttentionFactory(r.rt).create(r.c.node, r.shapes())
    metas = [None if t.absent else t.meta for t in r.ins]
    r.refuses(lambda: kern.execute(r.ins, [None]), KernelError, "output 0")
    r.refuses(lambda: kern.execute(r.ins, []), KernelError, "output 0")
    as_meta = [t.meta if not t.absent else None for t in r.ins]
    r.refuses(lambda: kern.execute(as_meta, [r.out]), TypeError, "expected a TensorView")
    r.refuses(lambda: kern.execute(r.ins, [r.out.meta]), TypeError, "expected a TensorView")
    r.refuses(lambda: kern.execute(dict(enumerate(r.ins)), [r.out]), TypeError, "list")
    r.refuses(lambda: kern.execute(r.ins, [r.out], 4096), TypeError, "WorkspaceView")
    shapes = [None if m is None else m.shape for m in metas]
    r.refuses(lambda: kern.workspace_requirement(shapes), TypeError, "TensorMetadata")
    node = make_node(r.c.H, vhs=r.c.vhs, scale=0.1)
    node.attributes = list(node.attributes.items())  # type: ignore[assignment]
    r.refuses(lambda: PagedAttentionFactory(r.rt).unsupported_reason(node, shapes, []), TypeError,
              "dict")
    r.refuses(lambda: PagedAttentionFactory(r.rt).create(node, shapes), TypeError, "dict")


# --------------------------------------------------------------------------- 5. order
def test_5_every_refusal_comes_before_the_first_launch(rng):
    for bad in (2.5, 2.0, True, "3"):
        with pytest.raises(ValueError, match="num_splits"):
            PagedAttentionConfig(num_splits=bad)
    with pytest.raises(ValueError, match="max_splits"):
        PagedAttentionConfig(max_splits=2.5)
    with pytest.raises(ValueError, match="mla_tiles"):
        PagedAttentionConfig(mla_tiles=(64.0,))
    assert PagedAttentionConfig(num_splits=np.int64(3)) == PagedAttentionConfig(num_splits=3)
    # A read kernel that fails to compile: the write phase must not have run.
    r = Rig(rng, H=16, hs=576, vhs=512, bs=64, q_lens=(2, 1), past_lens=(300, 40))
    compile_fn = r.rt.nvrtc_function

    def failing(module: str, source: str, entry: str, *a: Any, **kw: Any) -> Any:
        if not entry.startswith("paged_write"):
            raise CompileError(f"{entry}: injected failure", name=entry)
        return compile_fn(module, source, entry, *a, **kw)

    r.rt.nvrtc_function = failing  # type: ignore[method-assign]
    for cfg in (None, PagedAttentionConfig(path="mla", num_splits=2),
                PagedAttentionConfig(path="simple")):
        r.refuses(lambda cfg=cfg: r.run(config=cfg), CompileError, "injected")


# --------------------------------------------------------------------------- 6. ignored input
def test_6_extra_slots_unknown_attributes_and_non_integer_attributes_are_refused(rng):
    r = Rig(rng)
    fac = PagedAttentionFactory(r.rt)
    dts = [None if t.absent else t.dtype for t in r.ins]

    def node_with(**kw: Any) -> Node:
        n = make_node(r.c.H, vhs=r.c.vhs, scale=0.1)
        for k, v in kw.items():
            if k in ("inputs", "outputs", "domain", "op_type"):
                setattr(n, k, v)
            else:
                n.attributes[k] = v
        return n

    bad_nodes = {
        "18 inputs": (node_with(inputs=list(r.c.node.inputs) + [None] * 6 + ["extra"]), "18 inputs"),
        "3 outputs": (node_with(outputs=["output", None, "value_cache_out"]), "3 outputs"),
        "unknown attribute": (node_with(mask_type="causal"), "mask_type"),
        "kv_num_heads=1.0": (node_with(kv_num_heads=1.0), "kv_num_heads"),
        "kv_num_heads=True": (node_with(kv_num_heads=True), "kv_num_heads"),
        "do_rotary=2": (node_with(do_rotary=2), "do_rotary"),
        "rotary_interleaved=-1": (node_with(rotary_interleaved=-1), "rotary_interleaved"),
        "wrong domain": (node_with(domain="pkg.nxrt"), "pkg.nxrt"),
        "wrong op_type": (node_with(op_type="GroupQueryAttention"), "GroupQueryAttention"),
    }
    for what, (node, needle) in bad_nodes.items():
        reason = fac.unsupported_reason(node, r.shapes(), dts)
        assert reason is not None and needle in reason, (what, reason)
        r.refuses(lambda node=node: fac.create(node, r.shapes()), KernelError, needle)
    # The kernel refuses extra inputs and outputs at execute too (never ignores them).
    extra = r.ins + [None, r.ins[ps.IN_QUERY]]
    r.refuses(lambda: r.run(inputs=extra), KernelError, "18 inputs")
    third = view_like(r.out, ptr=r.out.ptr)
    r.refuses(lambda: r.run(outputs=[r.out, None, third]), KernelError, "3 outputs")


# --------------------------------------------------------------------------- 7. reference
def _rope_case(rng: np.random.Generator) -> Any:
    return make_case(rng, rope="half", rd=16, offset=8)


def _mut(**kw: Any) -> Callable[[Any], None]:
    def f(c: Any) -> None:
        for k, v in kw.items():
            c.node.attributes[k] = v
    return f


def _slot(i: int, value: Callable[[Any], Any]) -> Callable[[Any], None]:
    def f(c: Any) -> None:
        c.inputs[i] = value(c)
    return f


def _name(i: int) -> Callable[[Any], None]:
    def f(c: Any) -> None:
        c.node.inputs = list(c.node.inputs) + [None] * (i + 1 - len(c.node.inputs))
        c.node.inputs[i] = ps.INPUT_NAMES[i]
        c.inputs[i] = c.inputs[1].copy()
    return f


REFERENCE_CASES = {
    "short slot_mapping": (False, _slot(10, lambda c: c.inputs[10][:-1]), KernelError),
    "do_rotary without cos": (True, _slot(8, lambda c: None), KernelError),
    "do_rotary without sin": (True, _slot(9, lambda c: None), KernelError),
    "rotary past head_size": (True, _mut(rotary_offset=70), KernelError),
    "short cu_seqlens": (False, _slot(5, lambda c: c.inputs[5][:-1]), KernelError),
    "1-D block table": (False, _slot(7, lambda c: c.inputs[7].reshape(-1)), KernelError),
    "float cu_seqlens": (False, _slot(5, lambda c: c.inputs[5].astype(np.float32)), KernelError),
    "int64 slot_mapping": (False, _slot(10, lambda c: c.inputs[10].astype(np.int64)), KernelError),
    "SEPARATE layout": (False, _mut(kv_cache_layout="SEPARATE"), Unsupported),
    "kv_num_heads=4": (False, _mut(kv_num_heads=4), Unsupported),
    "value input": (False, _name(ps.IN_VALUE), Unsupported),
    "window=-5": (False, _mut(local_window_size=-5), KernelError),
    "NaN scale": (False, _mut(scale=math.nan), KernelError),
    "unknown attribute": (False, _mut(qk_output=1), KernelError),
    "float32 query": (False, _slot(0, lambda c: c.inputs[0].astype(np.float32)), KernelError),
}


@pytest.mark.parametrize("rope,mutate,exc", REFERENCE_CASES.values(), ids=REFERENCE_CASES.keys())
def test_7_reference_refuses_what_the_kernel_refuses_with_the_same_error(rng, rope, mutate, exc):
    c = _rope_case(rng) if rope else make_case(rng)
    reference.paged_attention(c.node, c.inputs)  # the unmutated case runs
    mutate(c)
    with pytest.raises(exc) as ref_err:
        reference.paged_attention(c.node, c.inputs)
    # The kernel's full path on the same arrays.
    r = Rig(rng)
    ins = [TensorView.absent_slot() if x is None else r.put(x) for x in c.inputs[:16]]
    out = r.put(np.zeros((c.T, c.H * c.vhs), c.inputs[3].dtype), mut=True)
    r.refuses(lambda: r.run(node=c.node, inputs=ins, outputs=[out]), exc)
    assert type(ref_err.value) is exc


def test_7_reference_refuses_fewer_than_the_required_inputs(rng):
    c = make_case(rng)
    for n in (0, 4, 10):
        with pytest.raises(KernelError, match="required input"):
            reference.paged_attention(c.node, c.inputs[:n])
    with pytest.raises(TypeError, match="numpy array"):
        reference.paged_attention(c.node, [TensorMetadata(DataType.BFLOAT16, (4, 240))] + c.inputs[1:])


# --------------------------------------------------------------------------- 8. float32
def test_8_float_attributes_are_float32_for_kernel_and_reference(rng):
    c = make_case(rng, softcap=1e-46)
    zero = Node(c.node.op_type, c.node.domain, {**c.node.attributes, "softcap": 0.0}, c.node.inputs,
                c.node.outputs)
    # 1e-46 is 0 in float32: the kernels disable softcap, and so does the reference.
    np.testing.assert_array_equal(reference.paged_attention(c.node, c.inputs)[0],
                                  reference.paged_attention(zero, c.inputs)[0])
    c.node.attributes["scale"] = 0.1
    want = reference.paged_attention(c.node, c.inputs)[0]
    c.node.attributes["scale"] = float(np.float32(0.1))
    np.testing.assert_array_equal(reference.paged_attention(c.node, c.inputs)[0], want)
    # The kernel launches with the same float32 values.
    r = Rig(rng)
    r.c.node.attributes.update(softcap=1e-46, scale=0.1)
    r.run()
    args = r.rt.launches[-1].args
    assert args[-3:-1] == [np.float32(0.1), np.float32(0.0)]
    # A non-zero scale that is 0 in float32 is refused by both (0 would mean "not given").
    c.node.attributes["scale"] = 1e-46
    with pytest.raises(KernelError, match="scale"):
        reference.paged_attention(c.node, c.inputs)
    r.rt.launches.clear()
    r.c.node.attributes["scale"] = 1e-46
    r.refuses(lambda: r.run(), KernelError, "scale")


# --------------------------------------------------------------- programmatic dependent launch

@pytest.mark.parametrize("cc, programmatic, want", [
    ((9, 0), True, [False, True, True]),    # read after write, combine after read
    ((9, 0), False, [False, False, False]),
    ((8, 0), True, [False, False, False]),  # no griddepcontrol before sm_90
])
def test_pdl_flags_of_the_wgmma_path(cc, programmatic, want):
    rig = Rig(np.random.default_rng(5), H=16, hs=576, vhs=512, bs=64, rd=64, offset=512,
              rope="half", q_lens=(1, 1), past_lens=(300, 70))
    rig.rt.capabilities.compute_capability = cc
    path = "wg" if cc >= (9, 0) else "mla"
    rig.run(config=PagedAttentionConfig(path=path, num_splits=3, programmatic=programmatic))
    read = "paged_mla_pair_fwd" if path == "wg" else "paged_mla_fwd"  # pages of 64 keys
    assert [ln.name for ln in rig.rt.launches] == ["paged_write_bf16", read, "paged_mla_combine"]
    assert [ln.programmatic for ln in rig.rt.launches] == want


def test_pdl_read_is_plain_without_the_write_phase():
    """The read kernel reads inputs before its griddepcontrol.wait, so it is programmatic only
    right after this call's own write kernel."""
    rig = Rig(np.random.default_rng(6), H=16, hs=576, vhs=512, bs=64, rd=64, offset=512,
              q_lens=(1,), past_lens=(500,))
    cfg = PagedAttentionConfig(path="wg", num_splits=2)
    kern = PagedAttentionFactory(rig.rt, config=cfg).create(rig.c.node, rig.shapes())
    kern._phases = frozenset(("read", "combine"))
    req = kern.workspace_requirement([None if t is None or t.absent else t.meta
                                      for t in rig.ins[:16]])
    kern.execute(rig.ins, [rig.out], WorkspaceView(rig.rt.address(req.nbytes), req.nbytes))
    assert [(ln.name, ln.programmatic) for ln in rig.rt.launches] == [
        ("paged_mla_pair_fwd", False), ("paged_mla_combine", True)]


@pytest.mark.parametrize("bad", [123, object(), np.zeros(4, np.uint8)],
                         ids=["raw-pointer", "object", "array"])
def test_workspace_that_is_not_a_view_is_a_type_error(bad):
    rig = Rig(np.random.default_rng(8), H=16, hs=576, vhs=512, bs=64, rd=64, offset=512,
              q_lens=(1, 1), past_lens=(300, 70))
    kern = PagedAttentionFactory(rig.rt, config=PagedAttentionConfig(num_splits=2)).create(
        rig.c.node, rig.shapes())
    rig.refuses(lambda: kern.execute(rig.ins, [rig.out], bad), TypeError,
                "workspace must be a WorkspaceView or None")


# ----------------------------------------------------------------- the contiguous partition
_MLA = dict(hs=576, vhs=512, bs=64, rd=64, offset=512)
_WS_CNT = 26  # the pair kernel's ws_cnt argument: non-null runs the partition


def test_partition_planned_for_one_sm_still_launches_the_partition():
    """On one SM the partition has one part, so no row block is cut and no combine runs; the
    pair kernel still needs the counts pointer that makes its one CTA walk every row block
    (without it the CTA computes row block 0 only)."""
    rig = Rig(np.random.default_rng(9), H=32, rope="half", q_lens=(1, 1, 2, 1),
              past_lens=(3000, 5, 64, 700), **_MLA)
    rig.rt.capabilities.sm_count = 1
    cfg = PagedAttentionConfig(path="wg", balanced=True)
    rig.run(config=cfg)
    assert [ln.name for ln in rig.rt.launches] == ["paged_write_bf16", "paged_mla_pair_fwd"]
    read = rig.rt.launches[1]
    assert read.grid == (1, 1, 1)
    assert int(read.args[_WS_CNT]) != 0


def test_partition_plan_without_a_workspace_runs_unsplit():
    """A partition plan whose model count is 1 (more tokens than sequences, sequences of one
    tile) needs a workspace; given none it runs unsplit, as a split plan does, not refuse."""
    rig = Rig(np.random.default_rng(10), H=16, q_lens=(2, 2), past_lens=(5, 20), **_MLA)
    kern = PagedAttentionFactory(rig.rt, config=PagedAttentionConfig(path="wg")).create(
        rig.c.node, rig.shapes())
    req = kern.workspace_requirement([None if t is None or t.absent else t.meta
                                      for t in rig.ins[:16]])
    assert req.nbytes > 0  # the partition's slots
    kern.execute(rig.ins, [rig.out], None)
    assert kern.last_plan.splits == 1 and kern.last_plan.part_ctas == 0
    assert [ln.name for ln in rig.rt.launches] == ["paged_write_bf16", "paged_mla_pair_fwd"]
    read = rig.rt.launches[1]
    assert read.grid == (kern.last_plan.grid_x, 1, 1) and int(read.args[_WS_CNT]) == 0
