"""pkg.nxrt::Attention single-kernel decode (path="decode") on the GPU: vs the float64
reference, forced splits, masks/softcap/window, determinism, capture and replay."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attnrt.ops.attention import AttentionConfig, AttentionKernel, builds
from attnrt.runtime.api import DataType, TensorMut, TensorView, WorkspaceView
from tests._attention_util import Buffers, check, dec, host_inputs, make_node

pytestmark = pytest.mark.gpu

F16, BF16 = DataType.FLOAT16, DataType.BFLOAT16


class Call:
    """Inputs uploaded once, the output poisoned before every run, the exact workspace."""

    def __init__(self, rt, bufs: Buffers, kernel: AttentionKernel, host, workspace=True):
        self.rt, self.kernel = rt, kernel
        self.devs = [bufs.array(h) for h in host if h is not None]
        self.views = [a.view() for a in self.devs]
        q = host[0]
        self.out = bufs.array(shape=q.shape, dtype=DataType.from_numpy(q.dtype))
        req = kernel.workspace_requirement([t.meta for t in self.views])
        self.req = req
        self.ws = (WorkspaceView(bufs.raw(req.nbytes), req.nbytes)
                   if workspace and req.nbytes else None)

    def __call__(self) -> None:
        self.kernel.execute(self.views, [self.out.mut()], self.ws)

    def run(self) -> np.ndarray:
        self.out.fill_bytes(0xFF)  # NaN everywhere: every element must be written
        self()
        self.rt.synchronize()
        return self.out.numpy()

    def upload(self, host) -> None:
        for a, h in zip(self.devs, [h for h in host if h is not None]):
            a.copy_from(h)


# (dtype, B, H, Hkv, Sq, Sk, D, forced splits, attrs, mask planes)
CASES = [
    # odd Sk: 1, 7, 1000, 4097; GQA and MHA; f16 and bf16; D 64 and 128; heuristic splits
    (BF16, 2, 8, 2, 1, 1, 128, None, {}, 0),
    (F16, 1, 4, 1, 1, 7, 64, None, {}, 0),
    (BF16, 3, 32, 8, 1, 1000, 128, None, {}, 0),
    (F16, 2, 8, 8, 1, 4097, 128, None, {}, 0),
    (BF16, 1, 16, 16, 1, 1000, 64, None, {}, 0),
    (F16, 1, 32, 8, 1, 4097, 64, None, {}, 0),
    # forced splits: 1, 2, odd (3, 7), more splits than key tiles (empty splits)
    (BF16, 1, 8, 2, 1, 4097, 128, 1, {}, 0),
    (F16, 1, 16, 16, 1, 4097, 64, 2, {}, 0),
    (BF16, 2, 12, 4, 1, 1000, 64, 3, {}, 0),
    (F16, 1, 8, 2, 1, 4097, 128, 7, {}, 0),
    (BF16, 1, 8, 2, 1, 100, 128, 5, {}, 0),
    # several query rows per CTA (G*Sq = 16 and 3), causal (bottom-right), D 72 (build 80), 256
    (BF16, 1, 4, 1, 4, 1000, 128, None, {"causal": 1}, 0),
    (F16, 1, 2, 2, 3, 300, 72, 2, {"causal": 1}, 0),
    (BF16, 1, 4, 2, 1, 2000, 256, None, {}, 0),
    (F16, 1, 2, 1, 1, 333, 256, 3, {}, 0),
    # softcap, windows, scale, masks of 1 / B / B*H planes
    (F16, 1, 8, 2, 1, 1000, 128, None, {"softcap": 5.0}, 0),
    (BF16, 2, 8, 2, 1, 4097, 128, None, {"local_window_size": 300}, 0),
    (F16, 1, 4, 2, 2, 1000, 64, 4, {"causal": 1, "local_window_size": 0}, 0),
    (F16, 2, 8, 2, 1, 1000, 128, None, {}, 1),
    (BF16, 2, 4, 1, 1, 1000, 128, 3, {"softcap": 3.0, "scale": 0.05}, 2),
    (F16, 2, 4, 2, 2, 517, 64, None, {"causal": 1}, 8),
]


def _ids(c):
    dt, B, H, Hkv, Sq, Sk, D, splits, attrs, planes = c
    extra = ",".join(f"{k[:6]}={v}" for k, v in attrs.items())
    return f"{dt.name}-B{B}H{H}/{Hkv}-q{Sq}k{Sk}D{D}-s{splits}-m{planes}-{extra}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_vs_reference(rt, ledger, rng, case):
    dtype, B, H, Hkv, Sq, Sk, D, splits, attrs, planes = case
    node = make_node(H, Hkv, _mask=bool(planes), **attrs)
    host = host_inputs(rng, dtype, B, H, Hkv, Sq, Sk, D, planes)
    with Buffers(rt) as bufs:
        kernel = bufs.kernel(node, dec(num_splits=splits))
        call = Call(rt, bufs, kernel, host)
        got = call.run()
        p = kernel.last_plan
        assert p.path == "decode"
        if splits is not None:
            assert p.splits == splits
        check(node, host, got, dtype)
        if p.splits > 1:  # the same call without a workspace: the memory merge runs unsplit,
            call.ws = None  # the cluster merge (no workspace) as before
            check(node, host, call.run(), dtype)
            assert kernel.last_plan.splits == (p.splits if p.cluster else 1)


# Cluster split merge (compute capability 9.0+, pairs): empty splits (more splits than key
# tiles), 16 packed rows, causal, windows, softcap, masks, D 64 / 72 / 128 / 256, the bench's
# B 16 shape.
CLUSTER_CASES = [
    (BF16, 16, 32, 8, 1, 1000, 128, 2, {}, 0),
    (F16, 3, 8, 2, 1, 4097, 64, 2, {}, 0),
    (BF16, 1, 8, 2, 1, 4097, 128, 2, {"softcap": 5.0}, 0),
    (F16, 1, 8, 2, 1, 60, 128, 2, {}, 0),
    (BF16, 1, 4, 1, 4, 1000, 128, 2, {"causal": 1}, 0),
    (F16, 1, 2, 2, 3, 300, 72, 2, {"causal": 1}, 0),
    (BF16, 1, 4, 2, 1, 2000, 256, 2, {}, 0),
    (F16, 2, 8, 2, 1, 1000, 128, 2, {}, 1),
    (BF16, 2, 4, 1, 1, 1000, 128, 2, {"local_window_size": 30}, 2),
    (F16, 2, 4, 2, 2, 517, 64, 2, {"causal": 1}, 8),
]


def _need_clusters(rt) -> None:
    if tuple(rt.capabilities.compute_capability) < (9, 0):
        pytest.skip("thread-block clusters need compute capability 9.0")


@pytest.mark.parametrize("case", CLUSTER_CASES, ids=_ids)
def test_cluster_merge_equals_memory_merge(rt, ledger, rng, case):
    """The cluster merge (the default here) gives the memory merge's bits, needs no
    workspace, and is deterministic run to run."""
    _need_clusters(rt)
    dtype, B, H, Hkv, Sq, Sk, D, splits, attrs, planes = case
    node = make_node(H, Hkv, _mask=bool(planes), **attrs)
    host = host_inputs(rng, dtype, B, H, Hkv, Sq, Sk, D, planes)
    with Buffers(rt) as bufs:
        cl = Call(rt, bufs, bufs.kernel(node, dec(num_splits=splits)), host)
        mem = Call(rt, bufs, bufs.kernel(node, dec(num_splits=splits, dec_merge="last")), host)
        assert cl.req.nbytes == 0 and mem.req.nbytes > 0
        got = cl.run()
        assert cl.kernel.last_plan.cluster == splits == cl.kernel.last_plan.splits
        check(node, host, got, dtype)
        want = mem.run()
        assert mem.kernel.last_plan.cluster == 0
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
        for _ in range(2):
            assert np.array_equal(got.view(np.uint16), cl.run().view(np.uint16))


# Ring schedules: fewer tiles than ring stages, empty splits, one split, causal rows, windows,
# softcap, masks, D 64 / 72 / 128 / 256, the memory and the cluster merge.
RING_CASES = [
    (BF16, 8, 32, 8, 1, 1024, 128, None, {}, 0),
    (F16, 1, 8, 2, 1, 100, 128, 5, {}, 0),
    (BF16, 2, 8, 2, 1, 70, 64, 1, {}, 0),
    (F16, 1, 4, 1, 4, 1000, 128, 3, {"causal": 1, "softcap": 5.0}, 0),
    (BF16, 1, 2, 2, 3, 300, 72, 2, {"causal": 1, "local_window_size": 40}, 0),
    (F16, 1, 4, 2, 1, 2000, 256, 7, {}, 0),
    (BF16, 2, 4, 1, 1, 1000, 128, 3, {"scale": 0.05}, 2),
]


@pytest.mark.parametrize("case", RING_CASES, ids=_ids)
def test_warp_ring_equals_cta_ring(rt, ledger, rng, case, monkeypatch):
    """The two K/V ring schedules (per warp, chosen for at most one CTA per SM; per CTA) read
    the same keys into the same mma order: the same bits, either way round."""
    dtype, B, H, Hkv, Sq, Sk, D, splits, attrs, planes = case
    node = make_node(H, Hkv, _mask=bool(planes), **attrs)
    host = host_inputs(rng, dtype, B, H, Hkv, Sq, Sk, D, planes)
    with Buffers(rt) as bufs:
        base = Call(rt, bufs, bufs.kernel(node, dec(num_splits=splits)), host)
        flip = Call(rt, bufs, bufs.kernel(node, dec(num_splits=splits)), host)
        orig = flip.kernel._plan
        monkeypatch.setattr(flip.kernel, "_plan", lambda *a: dataclasses.replace(
            orig(*a), warp_ring=not orig(*a).warp_ring))
        want = base.run()
        check(node, host, want, dtype)
        got = flip.run()
        assert flip.kernel.last_plan.warp_ring != base.kernel.last_plan.warp_ring
        assert flip.kernel.last_plan.splits == base.kernel.last_plan.splits
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_fully_masked_row_and_no_keys(rt, ledger, rng):
    with Buffers(rt) as bufs:
        node = make_node(4, 2, _mask=True)
        host = host_inputs(rng, BF16, 1, 4, 2, 2, 700, 128, planes=4, masked_row=True, masked_at="last")
        kernel = bufs.kernel(node, dec(num_splits=3))
        got = Call(rt, bufs, kernel, host).run()
        check(node, host, got, BF16)
        assert np.all(got[:, :, 1].astype(np.float32) == 0)
        node = make_node(4, 2)
        q = bufs.array(rng.standard_normal((1, 4, 1, 64), dtype=np.float32).astype(np.float16))
        kv = TensorView(q.ptr, F16, (1, 2, 0, 64))  # Sk = 0: nothing is read
        out = bufs.array(shape=(1, 4, 1, 64), dtype=F16)
        out.fill_bytes(0xFF)
        kernel = bufs.kernel(node, dec())
        kernel.execute([q.view(), kv, kv], [out.mut()])
        assert kernel.last_plan.path == "decode"
        assert np.all(out.numpy().astype(np.float32) == 0)


def test_matches_tc_route(rt, ledger, rng):
    """The bench decode shape (small B): the new and the old route agree with float64."""
    node = make_node(32, 8)
    host = host_inputs(rng, BF16, 2, 32, 8, 1, 8192, 128)
    with Buffers(rt) as bufs:
        new = Call(rt, bufs, bufs.kernel(node, dec()), host)
        old = Call(rt, bufs, bufs.kernel(node, AttentionConfig(path="fused")), host)
        a, b = new.run(), old.run()
        assert new.kernel.last_plan.path == "decode" and new.kernel.last_plan.splits > 1
        assert old.kernel.last_plan.path == "tc"
        check(node, host, a, BF16)
        check(node, host, b, BF16)


@pytest.mark.parametrize("splits", [None, 5, 4])
def test_deterministic(rt, ledger, rng, splits):
    """The memory merge (counters from the pool, then from the workspace) run to run."""
    node = make_node(32, 8)
    host = host_inputs(rng, BF16, 2, 32, 8, 1, 4097, 128)
    with Buffers(rt) as bufs:
        call = Call(rt, bufs, bufs.kernel(node, dec(num_splits=splits, dec_merge="last")), host)
        first = call.run()
        assert call.kernel.last_plan.splits > 1
        for _ in range(3):
            again = call.run()
            assert np.array_equal(first.view(np.uint16), again.view(np.uint16))
        # the workspace counters (memset per call) give the same bits as the pool
        cfg = dataclasses.replace(call.kernel.config, counter_pool=False)
        ws_call = Call(rt, bufs, bufs.kernel(node, cfg), host)
        assert np.array_equal(first.view(np.uint16), ws_call.run().view(np.uint16))
        assert not ws_call.kernel._cnt_pool.ptr


def test_strided_views(rt, ledger, rng):
    """Q and the output as [B, S, H, D] memory seen as [B, H, S, D]; K/V slices of a KV pair."""
    B, H, Hkv, Sq, Sk, D = 2, 8, 2, 2, 1030, 64
    node = make_node(H, Hkv, causal=1)
    host = host_inputs(rng, F16, B, H, Hkv, Sq, Sk, D)
    with Buffers(rt) as bufs:
        kernel = bufs.kernel(node, dec())
        qb = bufs.array(np.ascontiguousarray(host[0].transpose(0, 2, 1, 3)))
        q = TensorView(qb.ptr, F16, (B, H, Sq, D), (Sq * H * D, D, H * D, 1))
        kv = bufs.array(np.stack([host[1], host[2]], axis=2))  # [B, Hkv, 2, Sk, D]
        kst = (Hkv * 2 * Sk * D, 2 * Sk * D, D, 1)
        k = TensorView(kv.ptr, F16, (B, Hkv, Sk, D), kst)
        v = TensorView(kv.ptr + Sk * D * 2, F16, (B, Hkv, Sk, D), kst)
        ob = bufs.array(shape=(B, Sq, H, D), dtype=F16)
        ob.fill_bytes(0xFF)
        out = TensorMut(ob.ptr, F16, (B, H, Sq, D), (Sq * H * D, D, H * D, 1))
        req = kernel.workspace_requirement([q.meta, k.meta, v.meta])
        ws = WorkspaceView(bufs.raw(req.nbytes), req.nbytes) if req.nbytes else None
        kernel.execute([q, k, v], [out], ws)
        rt.synchronize()
        assert kernel.last_plan.path == "decode" and kernel.last_plan.splits > 1
        got = ob.numpy().transpose(0, 2, 1, 3)
    check(node, host, got, F16)


@pytest.mark.parametrize("mode", ["pool", "workspace-counters", "cluster"])
def test_capture_replay_with_new_inputs(rt, ledger, rng, mode):
    """Graph replays with new input contents. pool: the counter pool exists before the
    capture (no memset in the graph); workspace-counters: the workspace counters are cleared
    in the graph; cluster: the cluster merge (pairs), no counters, no workspace."""
    B, H, Hkv, Sk, D = 4, 32, 8, 3001, 128
    node = make_node(H, Hkv, softcap=4.0)
    host = host_inputs(rng, BF16, B, H, Hkv, 1, Sk, D)
    if mode == "cluster":
        _need_clusters(rt)
    with Buffers(rt) as bufs:
        cfg = (dec(num_splits=2, dec_merge="cluster") if mode == "cluster"
               else dec(dec_merge="last"))
        kernel = bufs.kernel(node, cfg)
        call = Call(rt, bufs, kernel, host)
        if mode == "workspace-counters":
            kernel._fn(builds.dec_variant(BF16, 128), "attn_decode")  # load, no launch
        else:
            check(node, host, call.run(), BF16)
        before = rt.memory_stats().live_bytes
        with rt.capture() as graph:
            call()
        try:
            assert rt.memory_stats().live_bytes == before  # nothing allocated while capturing
            assert kernel.last_plan.splits > 1
            assert bool(kernel._cnt_pool.ptr) == (mode == "pool")
            assert kernel.last_plan.cluster == (2 if mode == "cluster" else 0)
            assert (call.ws is None) == (mode == "cluster")
            for _ in range(3):
                host = host_inputs(rng, BF16, B, H, Hkv, 1, Sk, D)
                call.upload(host)
                call.out.fill_bytes(0xFF)
                graph.replay()
                rt.synchronize()
                check(node, host, call.out.numpy(), BF16)
        finally:
            graph.destroy()


def test_auto_uses_decode_with_flag(rt, ledger, rng):
    node = make_node(32, 8)
    host = host_inputs(rng, F16, 8, 32, 8, 1, 1024, 128)
    with Buffers(rt) as bufs:
        kernel = bufs.kernel(node, AttentionConfig(decode_path="single"))
        got = Call(rt, bufs, kernel, host).run()
        p = kernel.last_plan
        assert p.path == "decode"
        # B 8 x Hkv 8 on 132 SMs: cluster pairs on compute capability 9.0, else 4 splits
        caps = rt.capabilities
        pairs = tuple(caps.compute_capability) >= (9, 0) and caps.sm_count // 64 == 2
        assert (p.splits, p.cluster) == ((2, 2) if pairs else (p.splits, 0))
        check(node, host, got, F16)
