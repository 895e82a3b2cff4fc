"""The capture-misuse matrix: what is illegal while capturing gives a typed error, the capture
can be ended or aborted, and the runtime stays usable (the same op then runs correctly).

1. Runtime calls that are illegal while capturing (alloc_raw, free_raw, synchronize, htod,
   dtoh, latch.read, latch.check, and DeviceArray's allocating/copying helpers), each with a
   warmed op already captured, ended three ways: the ``with rt.capture()`` block aborts, a
   manual ``abort_capture()``, or ``end_capture()`` and a replay of what was captured.
2. Each op captured before its warm-up, on a fresh runtime that has never loaded its
   modules: IndexShare raises ``CaptureError`` (documented), PagedAttention ``KernelError``
   (documented: the exact signature must have run eagerly), Attention's unfused path without
   a workspace ``CaptureError``; Attention's fused path either refuses with a typed error or
   captures a graph whose replay is correct (never a raw ``CudaError``). Then warm-up
   variants: a paged signature that differs from the warmed one, an IndexShare scratch pool
   that would have to grow while capturing.

After every refusal: nothing is capturing, the allocation ledger is where it was, and an
eager run of the same kernel matches the float64 reference (and, after that warm-up, a
capture + replay does too).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import attnrt
from attnrt.ops import reference
from attnrt.ops.attention import AttentionConfig, AttentionFactory
from attnrt.ops.index_share import IndexShareFactory
from attnrt.ops.paged_attention import PagedAttentionFactory
from attnrt.runtime.api import DataType, Node, TensorView, WorkspaceView
from attnrt.runtime.errors import CaptureError, CudaError, KernelError
from attnrt.runtime.tensors import DeviceArray
from tests._util import TOL, rel_fro
from tests.test_paged_cpu import make_case

pytestmark = pytest.mark.gpu

BF16, F16 = DataType.BFLOAT16, DataType.FLOAT16


# --------------------------------------------------------------------------- one op, bound
class Op:
    """An op's kernel with device inputs, a poisoned output, ``run()`` and ``check()``."""

    def __init__(self, rt: Any, stack: ExitStack) -> None:
        self.rt, self.stack = rt, stack

    def upload(self, a: np.ndarray) -> DeviceArray:
        d = DeviceArray.from_numpy(self.rt, a)
        self.stack.callback(d.free)
        return d

    def empty(self, shape: tuple[int, ...], dtype: DataType) -> DeviceArray:
        d = DeviceArray(self.rt, shape, dtype)
        self.stack.callback(d.free)
        return d

    def raw(self, nbytes: int) -> int:
        p = self.rt.alloc_raw(nbytes)
        self.stack.callback(self.rt.free_raw, p)
        return p

    def run(self, **kw: Any) -> None:
        self.out.fill_bytes(0xFF)
        self._execute(**kw)

    def result(self) -> np.ndarray:
        return self.out.numpy()  # waits for the stream

    def check(self) -> None:
        err = rel_fro(self.result(), self.want)
        assert err < TOL[self.dtype], f"{type(self).__name__}: rel_fro {err:.2e}"


class AttentionOp(Op):
    def __init__(self, rt: Any, stack: ExitStack, rng: np.random.Generator, path: str = "auto",
                 workspace: bool = True) -> None:
        super().__init__(rt, stack)
        self.dtype = BF16
        B, H, Hkv, Sq, Sk, D = 1, 4, 2, 5, 77, 64
        self.node = Node("Attention", "pkg.nxrt", {"num_heads": H, "kv_num_heads": Hkv,
                                                    "causal": 1}, ["q", "k", "v"], ["o"])
        host = [rng.standard_normal(s, dtype=np.float32).astype(BF16.numpy)
                for s in ((B, H, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D))]
        self.views = [self.upload(h).view() for h in host]
        self.out = self.empty((B, H, Sq, D), BF16)
        self.kernel = AttentionFactory(rt, AttentionConfig(path=path)).create(
            self.node, [h.shape for h in host])
        req = self.kernel.workspace_requirement([v.meta for v in self.views])
        self.ws = (WorkspaceView(self.raw(req.nbytes), req.nbytes)
                   if workspace and req.nbytes else None)
        self.want = reference.attention(self.node, host, out_dtype=np.float64)

    def _execute(self) -> None:
        self.kernel.execute(self.views, [self.out.mut()], self.ws)


class PagedOp(Op):
    def __init__(self, rt: Any, stack: ExitStack, rng: np.random.Generator) -> None:
        super().__init__(rt, stack)
        self.dtype = BF16
        c = make_case(rng, dtype=BF16, H=16, hs=576, vhs=512, bs=64, rd=64, offset=512,
                      rope="half", q_lens=(1, 2), past_lens=(30, 70))
        self.c = c
        self.bufs = {i: self.upload(x) for i, x in enumerate(c.inputs[:16]) if x is not None}
        self.out = self.empty((c.T, c.H * c.vhs), BF16)
        self.kernel = PagedAttentionFactory(rt).create(
            c.node, [None if x is None else x.shape for x in c.inputs[:16]])
        self.want = reference.paged_attention(c.node, c.inputs)[0]

    def views(self) -> list:
        return [self.bufs[i].view() if i in self.bufs else TensorView.absent_slot()
                for i in range(16)]

    def _execute(self, cache_out: bool = False) -> None:
        outs = [self.out.mut()] + ([self.bufs[3].mut()] if cache_out else [])
        self.kernel.execute(self.views(), outs)  # decode of 3 tokens: no split, no workspace


class IndexShareOp(Op):
    def __init__(self, rt: Any, stack: ExitStack, rng: np.random.Generator, K: int = 40,
                 past: int = 300) -> None:
        super().__init__(rt, stack)
        self.dtype = F16
        B, N, Nkv, Sq, cur, H = 1, 8, 1, 1, 2, 64
        self.node = Node("IndexShare", "pkg.nxrt", {"num_heads": N, "kv_num_heads": Nkv},
                         ["q", "k", "v", "pk", "pv", "idx"], ["y"])
        f = [rng.standard_normal(s, dtype=np.float32).astype(np.float16) for s in
             ((B, N, Sq, H), (B, Nkv, cur, H), (B, Nkv, cur, H), (B, Nkv, past, H),
              (B, Nkv, past, H))]
        idx = np.sort(rng.choice(past + cur, size=(B, 1, Sq, K), replace=False), axis=-1)
        host = f + [idx.astype(np.int32)]
        self.views = [self.upload(h).view() for h in host]
        self.out = self.empty((B, N, Sq, H), F16)
        self.kernel = IndexShareFactory(rt).create(self.node)
        stack.callback(self.kernel.close)
        req = self.kernel.workspace_requirement([v.meta for v in self.views])
        self.ws_bytes = req.nbytes
        self.ws_view = WorkspaceView(self.raw(req.nbytes), req.nbytes) if req.nbytes else None
        self.want = reference.index_share(self.node, host)[0]

    def _execute(self, workspace: bool = False) -> None:
        self.kernel.execute(self.views, [self.out.mut()], self.ws_view if workspace else None)


# --------------------------------------------------------------------------- 1. runtime calls
ILLEGAL: dict[str, Callable[[Any, SimpleNamespace], Any]] = {
    "alloc_raw": lambda rt, x: rt.alloc_raw(256),
    "free_raw": lambda rt, x: rt.free_raw(x.spare),
    "synchronize": lambda rt, x: rt.synchronize(),
    "htod": lambda rt, x: rt.htod(x.buf.ptr, np.ones(64, np.float32)),
    "dtoh": lambda rt, x: rt.dtoh(np.empty(64, np.float32), x.buf.ptr),
    "latch.read": lambda rt, x: rt.latch.read(),
    "latch.check": lambda rt, x: rt.latch.check(),
    "DeviceArray": lambda rt, x: DeviceArray(rt, (4,), np.float32),
    "DeviceArray.numpy": lambda rt, x: x.buf.numpy(),
    "DeviceArray.copy_from": lambda rt, x: x.buf.copy_from(np.zeros(64, np.float32)),
}


@pytest.mark.parametrize("ending", ["with-block", "abort", "end-and-replay"])
@pytest.mark.parametrize("call", sorted(ILLEGAL))
def test_illegal_runtime_call_while_capturing(rt, ledger, rng, call, ending):
    with ExitStack() as stack:
        op = AttentionOp(rt, stack, rng)
        op.run()  # warm-up: modules loaded, shared memory limit raised
        op.check()
        x = SimpleNamespace(buf=op.empty((64,), DataType.FLOAT), spare=rt.alloc_raw(512))
        x.buf.copy_from(np.arange(64, dtype=np.float32))
        before = rt.memory_stats()
        launches = rt.launch_count
        op.out.fill_bytes(0xFF)
        if ending == "with-block":
            with pytest.raises(CaptureError):
                with rt.capture():
                    op._execute()
                    ILLEGAL[call](rt, x)
        else:
            rt.begin_capture()
            try:
                op._execute()
                with pytest.raises(CaptureError):
                    ILLEGAL[call](rt, x)
                assert rt.is_capturing(), "the refusal broke the capture"
            except BaseException:
                rt.abort_capture()
                raise
            if ending == "abort":
                rt.abort_capture()
            else:
                g = rt.end_capture()
                stack.callback(g.destroy)
                g.replay()
                op.check()  # what was captured before the refusal replays correctly
        assert not rt.is_capturing()
        assert rt.launch_count > launches
        after = rt.memory_stats()
        assert (after.live_bytes, after.live_count) == (before.live_bytes, before.live_count)
        if ending != "end-and-replay":
            assert np.all(np.isnan(op.result().astype(np.float32))), "an aborted capture ran"
        rt.free_raw(x.spare)
        np.testing.assert_array_equal(x.buf.numpy(), np.arange(64, dtype=np.float32))
        # The runtime is usable: the same op runs eagerly, correctly, and captures again.
        op.run()
        op.check()
        with rt.capture() as g2:
            op._execute()
        stack.callback(g2.destroy)
        op.out.fill_bytes(0xFF)
        g2.replay()
        op.check()
        rt.latch.check()


# --------------------------------------------------------------------------- 2. before warm-up
@pytest.fixture(scope="module")
def fresh():
    """A second runtime that has loaded nothing: every op on it is before its warm-up."""
    r = attnrt.CudaRuntime(0)
    yield r
    r.close()


def _refused_capture(rt: Any, fn: Callable[[], None], errors: tuple) -> BaseException:
    before = rt.memory_stats()
    launches = rt.launch_count
    with pytest.raises(errors) as ei:
        with rt.capture():
            fn()
    assert not rt.is_capturing()
    after = rt.memory_stats()
    assert (after.live_bytes, after.live_count) == (before.live_bytes, before.live_count)
    assert rt.launch_count == launches, "launched into a capture it then refused"
    return ei.value


def _eager_then_capture_ok(rt: Any, op: Op, stack: ExitStack, **kw: Any) -> None:
    op.run(**kw)
    op.check()
    with rt.capture() as g:
        op._execute(**kw)
    stack.callback(g.destroy)
    op.out.fill_bytes(0xFF)
    g.replay()
    op.check()
    rt.latch.check()


def test_index_share_before_warmup(fresh, rng):
    with ExitStack() as stack:
        op = IndexShareOp(fresh, stack, rng)
        assert not op.kernel.capture_support()
        err = _refused_capture(fresh, op._execute, (CaptureError,))
        assert "warm" in str(err)
        _eager_then_capture_ok(fresh, op, stack)
        assert op.kernel.capture_support()


def test_index_share_pool_cannot_grow_while_capturing(fresh, rng):
    with ExitStack() as stack:
        op = IndexShareOp(fresh, stack, rng, K=600, past=3000)  # split-K: needs scratch
        assert op.ws_bytes > 0
        op.run(workspace=True)  # warmed with the executor's workspace: the pool is empty
        op.check()
        err = _refused_capture(fresh, lambda: op._execute(workspace=False), (CaptureError,))
        assert "warm" in str(err)
        _eager_then_capture_ok(fresh, op, stack, workspace=False)


def test_paged_before_warmup(fresh, rng):
    with ExitStack() as stack:
        op = PagedOp(fresh, stack, rng)
        assert not op.kernel.capture_support()
        _refused_capture(fresh, op._execute, (KernelError,))
        _eager_then_capture_ok(fresh, op, stack)


def test_paged_signature_differs_from_the_warmed_one(fresh, rng):
    with ExitStack() as stack:
        op = PagedOp(fresh, stack, rng)
        op.run(cache_out=False)
        op.check()
        _refused_capture(fresh, lambda: op._execute(cache_out=True), (KernelError,))
        _eager_then_capture_ok(fresh, op, stack, cache_out=True)


def test_attention_unfused_without_workspace_while_capturing(fresh, rng):
    with ExitStack() as stack:
        op = AttentionOp(fresh, stack, rng, path="unfused", workspace=False)
        err = _refused_capture(fresh, op._execute, (CaptureError,))
        assert "workspace" in str(err)
        op.run()  # eagerly it owns a temporary buffer
        op.check()


def test_attention_fused_before_warmup(rng):
    """A runtime that never loaded the kernel: a typed refusal, or a capture that replays right."""
    r = attnrt.CudaRuntime(0)
    try:
        with ExitStack() as stack:
            op = AttentionOp(r, stack, rng, path="fused")
            before = r.memory_stats()
            op.out.fill_bytes(0xFF)
            try:
                with r.capture() as g:
                    op._execute()
            except (CaptureError, KernelError) as exc:  # a typed refusal
                outcome = f"refused: {type(exc).__name__}: {exc}"
            except CudaError as exc:
                pytest.fail(f"capturing an un-warmed Attention gave a raw driver error ({exc}); "
                            "expected a typed refusal or a working capture")
            else:
                stack.callback(g.destroy)
                g.replay()
                op.check()
                outcome = "captured and replayed correctly"
            print(f"Attention before warm-up: {outcome}")
            assert not r.is_capturing()
            assert r.memory_stats().live_bytes == before.live_bytes
            _eager_then_capture_ok(r, op, stack)
    finally:
        r.close()
