"""The functional API, stream binding and the torch custom ops on a GPU.

torch is optional: each test that needs it asks for the ``torch`` fixture (skipped without
torch or without CUDA in torch). Inputs are seeded, sizes odd; outputs are compared with the
float64 references of :mod:`attnrt.ops.reference`.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnrt
from attnrt.ops import functional as F
from attnrt.ops import reference
from attnrt.runtime.api import DataType
from attnrt.runtime.errors import CaptureError
from tests._attention_util import host_inputs, make_node
from tests._util import TOL, rel_fro
from tests.test_index_share_cpu import make_case as index_case
from tests.test_index_share_cpu import node as index_node
from tests.test_paged_cpu import make_case as paged_case

pytestmark = pytest.mark.gpu
F16, BF16 = DataType.FLOAT16, DataType.BFLOAT16


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    return torch


def dev(torch, a):
    """numpy (bf16 via float32, exactly) -> a CUDA tensor; None stays None."""
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    if a.dtype == BF16.numpy:
        return torch.from_numpy(a.astype(np.float32)).to("cuda", torch.bfloat16)
    return torch.from_numpy(a).cuda()


def host(t):
    return t.float().cpu().numpy()


# --------------------------------------------------------------------------- vs references
@pytest.mark.parametrize("dtype, attrs, planes", [
    (F16, {}, 0), (BF16, {"causal": 1}, 0), (F16, {"local_window_size": 9, "softcap": 20.0}, 2),
])
def test_attention_on_torch_tensors(torch, rng, dtype, attrs, planes):
    B, H, Hkv, Sq, Sk, D = 2, 6, 2, 37, 53, 64
    ins = host_inputs(rng, dtype, B, H, Hkv, Sq, Sk, D, planes=planes)
    t = [dev(torch, a) for a in ins]
    mask = None if t[3] is None else t[3].reshape(B, 1, Sq, Sk)
    got = F.attention(t[0], t[1], t[2], causal=bool(attrs.get("causal", 0)),
                      softcap=attrs.get("softcap", 0.0), window=attrs.get("local_window_size", -1),
                      mask=mask)
    assert isinstance(got, torch.Tensor) and got.dtype == t[0].dtype and got.shape == (B, H, Sq, D)
    node = make_node(H, Hkv, _mask=planes > 0, **attrs)
    want = reference.attention(node, [ins[0], ins[1], ins[2],
                                      None if ins[3] is None else ins[3].reshape(B, 1, Sq, Sk)],
                               out_dtype=np.float64)
    assert rel_fro(host(got), want) <= TOL[dtype]
    # A strided Q (a slice of a wider tensor) and out=: the same numbers, in place.
    wide = torch.cat([t[0], t[0]], dim=-1)[..., :D]
    out = torch.full_like(t[0], float("nan"))
    assert F.attention(wide, t[1], t[2], causal=bool(attrs.get("causal", 0)),
                       softcap=attrs.get("softcap", 0.0), window=attrs.get("local_window_size", -1),
                       mask=mask, out=out) is out
    assert rel_fro(host(out), want) <= TOL[dtype]


def test_mla_decode_on_torch_tensors(torch, rng):
    c = paged_case(rng, dtype=BF16, H=16, hs=576, vhs=512, bs=64, q_lens=(1, 1, 1),
                   past_lens=(70, 200, 129), rope="half", rd=64)
    want_out, want_cache = reference.paged_attention(c.node, c.inputs)
    t = [dev(torch, a) for a in c.inputs]
    out = F.mla_decode(t[0], t[1], t[3], t[5], t[6], t[7], t[10], cos=t[8], sin=t[9],
                       v_head_size=512, scale=c.node.attributes["scale"])
    assert out.shape == (3, 16 * 512) and out.dtype == torch.bfloat16
    assert rel_fro(host(out), want_out) < TOL[BF16]
    assert rel_fro(host(t[3]), want_cache) < TOL[BF16]  # the new rows were written in place


def test_index_share_on_torch_tensors(torch, rng):
    ins = index_case(rng, b=2, n=8, nkv=2, sq=3, cur=5, past=20, h=64, k=9, hi=1,
                     dtype=np.float16, idx_dtype=np.int32, bias_shape=(2, 1, 3, 25))
    want = reference.index_share(index_node(8, 2, outputs=3), ins, present="concat")
    t = [dev(torch, a) for a in ins]
    y, pk, pv = F.index_share(t[0], t[1], t[2], t[5], past_key=t[3], past_value=t[4],
                              attention_bias=t[6], present="concat")
    assert rel_fro(host(y), want[0]) < TOL[F16]
    assert np.array_equal(host(pk), want[1].astype(np.float32))
    assert np.array_equal(host(pv), want[2].astype(np.float32))
    assert F.default_runtime().latch.read() == 0


# --------------------------------------------------------------------------- streams
def test_runs_on_the_callers_stream_without_synchronizing(torch, rng):
    ins = host_inputs(rng, F16, 1, 8, 8, 129, 129, 64)
    q_src, k, v = (dev(torch, a) for a in ins[:3])
    q = torch.full_like(q_src, float("nan"))
    out = torch.full_like(q_src, float("nan"))
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # keeps s busy: ours must queue behind it
        q.copy_(q_src)  # a torch kernel before ours
        F.attention(q, k, v, out=out)
        after = out * 2  # a torch kernel after ours
    assert F.default_runtime().stream.ptr == s.cuda_stream
    s.synchronize()
    want = reference.attention(make_node(8, 8), ins[:3], out_dtype=np.float64)
    assert rel_fro(host(after) / 2, want) <= TOL[F16]


def test_torch_cuda_graph_of_torch_ops_and_two_of_ours(torch, rng):
    a_ins = host_inputs(rng, F16, 2, 8, 2, 3, 29, 64)
    i_ins = index_case(rng, b=2, n=8, nkv=2, sq=3, cur=41, past=0, h=64, k=11, hi=1,
                       dtype=np.float16, idx_dtype=np.int32)
    q_in, k, v = (dev(torch, a) for a in a_ins[:3])
    k2, v2, idx = dev(torch, i_ins[1]), dev(torch, i_ins[2]), dev(torch, i_ins[5])

    def step():
        h = q_in * 0.5 + 0.25
        a = F.attention(h, k, v, causal=True)
        y = F.index_share(a, k2, v2, idx)
        return y + a

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, as torch's docs do
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = step()
    for trial in range(2):
        new_q = torch.randn(q_in.shape, generator=torch.Generator().manual_seed(trial)).half()
        q_in.copy_(new_q.cuda())
        g.replay()
        torch.cuda.synchronize()
        F.default_runtime().latch.check()
        eager = step()
        torch.testing.assert_close(static_out, eager, rtol=2e-3, atol=2e-3)
        h = (new_q.float() * 0.5 + 0.25).half().numpy()
        a_ref = reference.attention(make_node(8, 2, causal=1), [h, *a_ins[1:3]], out_dtype=np.float64)
        y_ref = reference.index_share(index_node(8, 2), [a_ref.astype(np.float16), *i_ins[1:]])[0]
        assert rel_fro(host(static_out), y_ref + a_ref) <= 5e-3


def test_torch_compile_fullgraph_matches_eager(torch, rng):
    ops = pytest.importorskip("attnrt.ops.torch")
    a_ins = host_inputs(rng, BF16, 1, 4, 2, 17, 45, 64)
    i_ins = index_case(rng, b=1, n=4, nkv=2, sq=17, cur=33, past=0, h=64, k=7, hi=4,
                       dtype=np.float32, idx_dtype=np.int64)
    q, k, v = (dev(torch, a) for a in a_ins[:3])
    k2, v2, idx = (dev(torch, a).to(torch.bfloat16) if a.dtype != np.int64 else dev(torch, a)
                   for a in (i_ins[1], i_ins[2], i_ins[5]))

    def f(q, k, v, k2, v2, idx):
        a = torch.ops.attnrt.attention(q, k, v, None, True)
        y = ops.index_share(torch.tanh(a), k2, v2, idx)
        return a * 2 + y

    eager = f(q, k, v, k2, v2, idx)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, k2, v2, idx), eager, rtol=0, atol=0)
    torch.library.opcheck(ops.attention, (q, k, v), {"causal": True},
                          test_utils=("test_schema", "test_faketensor"))


def test_paged_custom_op_declares_its_cache_mutation(torch, rng):
    ops = pytest.importorskip("attnrt.ops.torch")
    c = paged_case(rng, dtype=F16, H=3, hs=80, vhs=64, bs=16, q_lens=(3, 1), past_lens=(5, 20))
    t = [dev(torch, a) for a in c.inputs]
    args = (t[0], t[1], t[3], t[5], t[6], t[7], t[10])
    kw = {"v_head_size": 64, "scale": c.node.attributes["scale"]}
    torch.library.opcheck(ops.paged_attention, args, kw, test_utils=("test_schema", "test_faketensor"))
    want_out, want_cache = reference.paged_attention(c.node, c.inputs)
    t = [dev(torch, a) for a in c.inputs]
    out = torch.ops.attnrt.paged_attention(t[0], t[1], t[3], t[5], t[6], t[7], t[10], **kw)
    assert rel_fro(host(out), want_out) < TOL[F16] and rel_fro(host(t[3]), want_cache) < TOL[F16]


def test_bound_runtime_sees_torch_capture_and_leaves_the_stream_alive(torch):
    s = torch.cuda.Stream()
    rt = attnrt.CudaRuntime(0, stream=s)
    assert rt.stream.ptr == s.cuda_stream and not rt.stream.owned
    x = torch.zeros(16, device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        assert rt.is_capturing()
        with pytest.raises(CaptureError):
            rt.alloc_raw(256)
        with pytest.raises(CaptureError):
            rt.synchronize()
        with pytest.raises(CaptureError):
            rt.close()  # torch's capture is not ours to abort
        x.add_(1)
    assert not rt.is_capturing()
    g.replay()
    torch.cuda.synchronize()
    assert float(x.sum()) == 16
    rt.close()  # must not destroy s
    with torch.cuda.stream(s):
        y = x + 1
    s.synchronize()
    assert float(y.sum()) == 32


def test_runtime_bound_to_a_raw_handle(rt):
    other = attnrt.CudaRuntime(0, stream=rt.stream.ptr)
    try:
        assert other.stream.ptr == rt.stream.ptr and not other.stream.owned
        p = other.alloc_raw(64)
        other.memset(p, 7, 64)  # enqueued on rt's stream
        host_buf = other.dtoh(np.empty(64, np.uint8), p)
        assert np.all(host_buf == 7)
        other.free_raw(p)
        prev = other.set_stream(None)
        assert prev.ptr == rt.stream.ptr and other.stream.ptr == rt.stream.ptr  # home is the bound one
    finally:
        other.close()
    rt.synchronize()  # still alive: other did not destroy it
