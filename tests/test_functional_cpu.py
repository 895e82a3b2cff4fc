"""The functional API and the plan/run objects without a GPU (FakeRuntime, TensorView inputs):
signature caching, typed errors, ``out=`` checks, exact workspaces, capture behaviour."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from attnrt.ops import functional as F
from attnrt.ops._call import _state
from attnrt.runtime.api import DataType, TensorMetadata, WorkspaceView
from attnrt.runtime.errors import CaptureError, KernelError, WorkspaceError
from attnrt.runtime.tensors import DeviceArray
from tests._fakes import FakeRuntime

F32, F16, BF16, I32 = DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16, DataType.INT32


@pytest.fixture
def fake():
    rt = FakeRuntime()
    yield rt
    F.clear_cache(rt)


def attn_inputs(rt, B=2, H=6, Hkv=2, Sq=5, Sk=37, D=64, dtype=F16):
    return [rt.view((B, H, Sq, D), dtype), rt.view((B, Hkv, Sk, D), dtype),
            rt.view((B, Hkv, Sk, D), dtype)]


def paged_inputs(rt, B=1, H=128, L=8191, bs=64, dtype=BF16):
    """An MLA decode step (576/512 latent): B sequences of L cached keys, one new token each."""
    nblk = -(-(L + 1) // bs)
    bt = np.arange(B * nblk, dtype=np.int32).reshape(B, nblk)
    past = np.full(B, L, dtype=np.int32)
    cu = np.arange(B + 1, dtype=np.int32)
    slot = (bt[:, L // bs] * bs + L % bs).astype(np.int32)
    return [rt.view((B, H * 576), dtype), rt.view((B, 576), dtype),
            rt.view((B * nblk, bs, 1, 576), dtype), rt.view(cu.shape, I32, data=cu),
            rt.view(past.shape, I32, data=past), rt.view(bt.shape, I32, data=bt),
            rt.view(slot.shape, I32, data=slot)]


def index_inputs(rt, rng, B=3, N=8, Nkv=2, Sq=1, S=41, Hd=64, K=13, dtype=F16):
    idx = np.sort(np.stack([rng.choice(S, K, replace=False) for _ in range(B * Sq)]), -1)
    idx = idx.reshape(B, 1, Sq, K).astype(np.int32)
    return [rt.view((B, N, Sq, Hd), dtype), rt.view((B, Nkv, S, Hd), dtype),
            rt.view((B, Nkv, S, Hd), dtype), rt.view(idx.shape, I32, data=idx)]


# --------------------------------------------------------------------------- caching
def test_second_call_creates_no_kernel_and_compiles_nothing(fake, monkeypatch):
    created = []
    from attnrt.ops import attention as attention_mod
    real = attention_mod.AttentionFactory.create
    monkeypatch.setattr(attention_mod.AttentionFactory, "create",
                        lambda self, *a: created.append(1) or real(self, *a))
    q, k, v = attn_inputs(fake)
    F.attention(q, k, v, causal=True, runtime=fake)
    compiles, launches = len(fake.compiles), fake.launch_count
    assert len(created) == 1 and compiles >= 1 and launches >= 1
    for _ in range(3):
        F.attention(q, k, v, causal=True, runtime=fake)
    assert len(created) == 1 and len(fake.compiles) == compiles
    assert fake.launch_count == launches * 4
    # Another signature (Sk) of the same attributes: a new plan, the same kernel.
    q2, k2, v2 = attn_inputs(fake, Sk=38)
    F.attention(q2, k2, v2, causal=True, runtime=fake)
    assert len(created) == 1 and len(_state(fake).plans) == 2
    # Other attributes: a second kernel.
    F.attention(q, k, v, causal=False, runtime=fake)
    assert len(created) == 2 and len(_state(fake).ops) == 2


def test_repeat_calls_of_every_op_compile_nothing(fake, rng):
    calls = [lambda: F.attention(*attn_inputs(fake), runtime=fake),
             lambda: F.paged_attention(*paged_inputs(fake), v_head_size=512, scale=0.07,
                                       runtime=fake),
             lambda: F.index_share(*index_inputs(fake, rng), runtime=fake)]
    for call in calls:
        call()
        n, ops = len(fake.compiles), len(_state(fake).ops)
        call()
        assert len(fake.compiles) == n and len(_state(fake).ops) == ops


def test_outputs_are_fresh_device_arrays_freed_when_collected(fake):
    before = fake.memory_stats().live_bytes
    o = F.attention(*attn_inputs(fake, H=4, Hkv=4, Sq=3, D=32, dtype=F32), runtime=fake)
    assert isinstance(o, DeviceArray) and o.shape == (2, 4, 3, 32) and o.dtype == F32
    o2 = F.attention(*attn_inputs(fake, H=4, Hkv=4, Sq=3, D=32, dtype=F32), runtime=fake)
    assert o2.ptr != o.ptr
    del o, o2
    gc.collect()
    cached = sum(e.arena.nbytes for e in _state(fake).plans.values() if e.arena is not None)
    assert fake.memory_stats().live_bytes == before + cached
    F.clear_cache(fake)
    assert fake.memory_stats().live_bytes == before


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("mutate, needle", [
    (lambda rt, t: [t[0], rt.view((2, 2, 37, 64), F32), t[2]], "dtype FLOAT"),
    (lambda rt, t: [rt.view((6, 5, 64), F16), t[1], t[2]], "rank 4"),
    (lambda rt, t: [t[0], rt.view((2, 4, 37, 64), F16), rt.view((2, 4, 37, 64), F16)], "divisor"),
    (lambda rt, t: [t[0], t[1], rt.view((2, 2, 36, 64), F16)], "input V"),
    (lambda rt, t: [rt.view((2, 6, 5, 64), DataType.DOUBLE), t[1], t[2]], "DOUBLE"),
])
def test_validation_errors_are_typed_and_launch_nothing(fake, mutate, needle):
    ins = mutate(fake, attn_inputs(fake))
    with pytest.raises(KernelError, match=needle):
        F.attention(*ins, runtime=fake)
    assert fake.launch_count == 0


def test_attribute_and_argument_errors(fake, rng):
    with pytest.raises(KernelError, match="scale"):
        F.attention(*attn_inputs(fake), scale=-1.0, runtime=fake)
    with pytest.raises(KernelError, match="local_window_size"):
        F.attention(*attn_inputs(fake), window=-3, runtime=fake)
    with pytest.raises(ValueError, match="present"):
        F.index_share(*index_inputs(fake, rng), present="grow", runtime=fake)
    ins = paged_inputs(fake)
    with pytest.raises(KernelError, match="scale"):  # v_head_size != head_size needs a scale
        F.paged_attention(*ins, v_head_size=512, runtime=fake)
    with pytest.raises(KernelError, match="FLOAT16 or BFLOAT16"):
        F.paged_attention(fake.view((1, 128 * 576), F32), *ins[1:], runtime=fake)
    assert fake.launch_count == 0


def test_out_is_checked_written_and_returned(fake):
    q, k, v = attn_inputs(fake)
    with pytest.raises(KernelError, match=r"out is FLOAT16 \[2, 6, 5, 32\]"):
        F.attention(q, k, v, out=fake.view((2, 6, 5, 32), F16, mut=True), runtime=fake)
    with pytest.raises(KernelError, match="out is BFLOAT16"):
        F.attention(q, k, v, out=fake.view((2, 6, 5, 64), BF16, mut=True), runtime=fake)
    assert fake.launch_count == 0
    out = fake.view((2, 6, 5, 64), F16, mut=True)
    assert F.attention(q, k, v, out=out, runtime=fake) is out
    assert out.ptr in fake.launches[-1].args


def test_index_share_present_modes(fake, rng):
    ins = index_inputs(fake, rng, S=9, K=5)
    pk, pv = fake.view((3, 2, 20, 64), F16), fake.view((3, 2, 20, 64), F16)
    y, k2, v2 = F.index_share(*ins, past_key=pk, past_value=pv, present="concat", runtime=fake)
    assert y.shape == (3, 8, 1, 64) and k2.shape == v2.shape == (3, 2, 29, 64)
    bias = np.zeros((3, 1, 1, 20), np.float16)
    bias[..., 15:] = -np.inf
    b = fake.view(bias.shape, F16, data=bias)
    # The fake runs no kernel: emulate the frontier kernel (valid length 15 per batch).
    fake.on_launch["is_frontier"] = lambda args: fake.write(args[1], np.full(3, 15, np.int32))
    idx = fake.view((3, 1, 1, 2), I32, data=np.tile(np.int32([3, 14]), (3, 1, 1, 1)))
    y, k3, v3 = F.index_share(*ins[:3], idx, past_key=pk, past_value=pv, attention_bias=b,
                              present="capacity", runtime=fake)
    assert k3 is pk and v3 is pv  # fixed capacity: the cache is updated in place by default


# --------------------------------------------------------------------------- plan / run
def _exact_workspace(rt, plan, short: int = 0) -> WorkspaceView:
    ptr = rt.alloc_raw(plan.workspace_bytes + 256)
    return WorkspaceView(-(-ptr // 256) * 256, plan.workspace_bytes - short)


@pytest.mark.parametrize("case", ["attention", "paged", "index_share"])
def test_plan_run_workspace_is_exact(fake, rng, case):
    if case == "attention":
        op = F.Attention(fake, num_heads=16, kv_num_heads=2)
        ins = [fake.view((1, 16, 1, 128), BF16), fake.view((1, 2, 4099, 128), BF16),
               fake.view((1, 2, 4099, 128), BF16)]
        shapes = dict(q=(1, 16, 1, 128), k=(1, 2, 4099, 128), v=(1, 2, 4099, 128))
        plan = op.plan(*ins)
        assert op.plan(*shapes.values(), dtype=BF16) == plan
        out = fake.view((1, 16, 1, 128), BF16, mut=True)
        run = lambda ws: op.run(*ins, out=out, workspace=ws)  # noqa: E731
    elif case == "paged":
        op = F.PagedAttention(fake, num_heads=128, v_head_size=512, scale=0.07)
        ins = paged_inputs(fake)
        plan = op.plan(*ins)
        assert op.plan(*[i.shape for i in ins], dtype=BF16) == plan
        out = fake.view((1, 128 * 512), BF16, mut=True)
        run = lambda ws: op.run(*ins, out=out, workspace=ws)  # noqa: E731
    else:
        op = F.IndexShare(fake, num_heads=8, kv_num_heads=2)
        ins = index_inputs(fake, rng, B=2, S=3001, K=2048)
        plan = op.plan(*ins)
        assert op.plan(*[i.shape for i in ins], dtype=F16) == plan
        out = fake.view((2, 8, 1, 64), F16, mut=True)
        run = lambda ws: op.run(*ins, out=out, workspace=ws)  # noqa: E731
    assert plan.workspace_bytes > 0 and plan.outputs[0].shape == out.shape
    with pytest.raises(WorkspaceError) as err:
        run(_exact_workspace(fake, plan, short=1))
    assert err.value.required == plan.workspace_bytes
    n = fake.launch_count
    run(_exact_workspace(fake, plan))
    assert fake.launch_count > n
    # Once warmed, run is capture-safe: launches only, nothing allocated.
    ws = _exact_workspace(fake, plan)
    live = fake.memory_stats().live_bytes
    with fake.capture() as graph:
        run(ws)
    assert graph and all(launch.captured for launch in graph)
    assert fake.memory_stats().live_bytes == live


def test_plan_needs_a_dtype_for_bare_shapes(fake):
    op = F.Attention(fake, num_heads=4)
    with pytest.raises(TypeError, match="dtype"):
        op.plan((1, 4, 3, 64), (1, 4, 3, 64), (1, 4, 3, 64))
    m = TensorMetadata(F32, (1, 4, 3, 64))
    assert op.plan(m, m, m).workspace.nbytes == 0


def test_plan_run_accepts_tensor_workspaces(fake):
    op = F.Attention(fake, num_heads=16, kv_num_heads=2)
    ins = [fake.view((1, 16, 1, 128), BF16), fake.view((1, 2, 4099, 128), BF16),
           fake.view((1, 2, 4099, 128), BF16)]
    plan = op.plan(*ins)
    arr = DeviceArray(fake, (plan.workspace_bytes,), DataType.UINT8)
    op.run(*ins, out=fake.view((1, 16, 1, 128), BF16, mut=True), workspace=arr)
    with pytest.raises(TypeError, match="workspace"):
        op.run(*ins, out=fake.view((1, 16, 1, 128), BF16, mut=True), workspace=1234)
    arr.free()


# --------------------------------------------------------------------------- capture
def test_functional_capture_after_warmup_allocates_nothing(fake):
    ins = [fake.view((1, 16, 1, 128), BF16), fake.view((1, 2, 4099, 128), BF16),
           fake.view((1, 2, 4099, 128), BF16)]
    out = fake.view((1, 16, 1, 128), BF16, mut=True)
    F.attention(*ins, out=out, runtime=fake)  # warm-up: plan, arena, counters
    e = next(iter(_state(fake).plans.values()))
    assert e.arena is not None and not e.pinned
    live = fake.memory_stats().live_bytes
    with fake.capture() as graph:
        F.attention(*ins, out=out, runtime=fake)
    assert graph and fake.memory_stats().live_bytes == live
    assert e.pinned  # a graph holds the arena's address: never evicted
    # A new signature while capturing needs a new arena: refused, not corrupted.
    ins2 = [fake.view((1, 16, 1, 128), BF16), fake.view((1, 2, 5000, 128), BF16),
            fake.view((1, 2, 5000, 128), BF16)]
    with pytest.raises(CaptureError), fake.capture():
        F.attention(*ins2, out=out, runtime=fake)


def test_plan_cache_is_bounded_and_keeps_pinned_arenas(fake, monkeypatch):
    from attnrt.ops import _call
    monkeypatch.setattr(_call, "MAX_PLANS", 4)
    q = fake.view((1, 16, 1, 128), BF16)
    out = fake.view((1, 16, 1, 128), BF16, mut=True)
    kv = fake.view((1, 2, 4000, 128), BF16)
    F.attention(q, kv, kv, out=out, runtime=fake)
    with fake.capture():
        F.attention(q, kv, kv, out=out, runtime=fake)
    pinned = next(iter(_state(fake).plans.values()))

    def arenas() -> int:
        return sum(e.arena.nbytes for e in _state(fake).plans.values() if e.arena is not None)

    kernel_owned = fake.memory_stats().live_bytes - arenas()  # the decode counter pool
    for sk in range(4001, 4012):
        kv = fake.view((1, 2, sk, 128), BF16)
        F.attention(q, kv, kv, out=out, runtime=fake)
    plans = _state(fake).plans
    assert len(plans) <= 4 + 1 and pinned in plans.values()
    assert fake.memory_stats().live_bytes == arenas() + kernel_owned  # evicted arenas were freed
    F.clear_cache(fake)
    assert fake.memory_stats().live_bytes == 0


@pytest.mark.parametrize("arg", [np.ones((1, 1, 1, 8), np.float32), [1.0], "q"],
                         ids=["numpy", "list", "str"])
def test_host_or_non_tensor_inputs_are_a_kernel_error_before_any_runtime(arg):
    # A user's first mistake: host arrays. A typed error that says what to pass, raised
    # before a runtime (or a GPU) is needed.
    import attnrt
    from attnrt.runtime.errors import KernelError

    with pytest.raises(KernelError, match="CUDA"):
        attnrt.attention(arg, arg, arg)
