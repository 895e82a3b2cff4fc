"""pkg.nxrt::Attention on the GPU: every path vs the float64 reference, capture, workspaces."""

from __future__ import annotations

import numpy as np
import pytest

import attnrt
from attnrt.ops.attention import AttentionConfig, AttentionFactory, AttentionKernel, wg_persistent
from attnrt.runtime.api import DataType, TensorMut, TensorView, WorkspaceView
from attnrt.runtime.errors import CaptureError, KernelError, WorkspaceError
from attnrt.runtime.executor import Executor
from tests._attention_util import Buffers, check, host_inputs, make_node

pytestmark = pytest.mark.gpu

F32, F16, BF16 = DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16


def run(rt, kernel, host, bufs: Buffers, workspace=True):
    """Upload, poison the output, execute (with the exact workspace), return the output."""
    ins = [bufs.array(h) for h in host if h is not None]
    views = [a.view() for a in ins]
    q = host[0]
    out = bufs.array(shape=q.shape, dtype=DataType.from_numpy(q.dtype))
    out.fill_bytes(0xFF)  # NaN everywhere: every element must be written
    req = kernel.workspace_requirement([t.meta for t in views])
    ws = None
    if workspace and req.nbytes:
        ws = WorkspaceView(bufs.raw(req.nbytes), req.nbytes)
    kernel.execute(views, [out.mut()], ws)
    rt.synchronize()
    return out.numpy()


# (dtype, B, H, Hkv, Sq, Sk, D, attrs, mask planes)
CASES = [
    # sizes: Sq, Sk in {1, 17, 128, 1000}, D in {64, 80, 128, 256}
    (F16, 2, 4, 4, 17, 128, 64, {}, 0),
    (BF16, 1, 4, 4, 128, 1000, 64, {}, 0),
    (F16, 1, 8, 2, 1000, 1000, 80, {}, 0),
    (BF16, 2, 2, 2, 1, 17, 80, {}, 0),
    (F16, 1, 4, 4, 128, 128, 128, {}, 0),
    (BF16, 1, 8, 1, 1, 1000, 128, {}, 0),
    (F16, 2, 2, 1, 17, 1, 256, {}, 0),
    (BF16, 1, 2, 2, 1000, 128, 256, {}, 0),
    (F32, 1, 4, 4, 128, 1000, 64, {}, 0),
    (F32, 2, 8, 2, 17, 17, 80, {}, 0),
    (F32, 1, 2, 2, 1, 128, 256, {}, 0),
    (F32, 1, 2, 1, 1000, 17, 128, {}, 0),
    # GQA 8/2, MQA 8/1, causal with Sq < Sk (and Sq > Sk: leading rows see nothing)
    (F16, 2, 8, 2, 17, 1000, 128, {"causal": 1}, 0),
    (BF16, 1, 8, 1, 128, 1000, 64, {"causal": 1}, 0),
    (F16, 1, 8, 8, 1000, 1000, 64, {"causal": 1}, 0),
    (F16, 1, 4, 2, 128, 17, 64, {"causal": 1}, 0),
    (F32, 1, 8, 2, 17, 128, 64, {"causal": 1}, 0),
    # masks of each plane count (1, B, B*H), one fully masked row
    (F16, 2, 4, 2, 17, 128, 64, {}, 1),
    (BF16, 2, 4, 2, 128, 17, 128, {}, 2),
    (F16, 2, 4, 1, 17, 1000, 80, {"causal": 1}, 8),
    (F32, 2, 4, 2, 17, 128, 64, {}, 8),
    # softcap, windows
    (F16, 1, 8, 2, 128, 1000, 128, {"softcap": 5.0}, 0),
    (BF16, 1, 4, 4, 1000, 1000, 64, {"causal": 1, "local_window_size": 100}, 0),
    (F16, 1, 4, 2, 17, 1000, 64, {"local_window_size": 0}, 0),
    (F32, 1, 4, 2, 128, 1000, 80, {"causal": 1, "local_window_size": 37, "softcap": 2.0}, 0),
    (F16, 1, 4, 2, 128, 1000, 128, {"scale": 0.05, "softcap": 3.0, "causal": 1}, 1),
]


def _ids(c):
    dt, B, H, Hkv, Sq, Sk, D, attrs, planes = c
    extra = ",".join(f"{k[:6]}={v}" for k, v in attrs.items())
    return f"{dt.name}-B{B}H{H}/{Hkv}-q{Sq}k{Sk}D{D}-m{planes}-{extra}"


@pytest.mark.parametrize("path", ["auto", "unfused"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_vs_reference(rt, ledger, rng, case, path):
    dtype, B, H, Hkv, Sq, Sk, D, attrs, planes = case
    node = make_node(H, Hkv, _mask=bool(planes), **attrs)
    host = host_inputs(rng, dtype, B, H, Hkv, Sq, Sk, D, planes, masked_row=True)
    kernel = AttentionKernel(rt, node, AttentionConfig(path=path))
    try:
        with Buffers(rt) as bufs:
            got = run(rt, kernel, host, bufs)
        plan = kernel.last_plan
    finally:
        kernel.close()  # the decode kernel's split counters
    want = check(node, host, got, dtype)
    if path == "auto":  # prefill on cc 9.0 takes the wgmma kernel, G·Sq <= 16 the decode kernel
        assert plan.path in (("simt",) if dtype == F32 else ("tc", "wg", "decode"))
        if dtype != F32 and Sq * (H // Hkv) <= 16 and D % 8 == 0 and D <= 256:
            assert plan.path == "decode", plan
    # Rows that see no key are exactly zero.
    dead = ~np.any(want != 0, axis=-1)
    assert np.all(got.astype(np.float32)[dead] == 0)


@pytest.mark.parametrize("dtype,path,splits,Sq,D", [
    (BF16, "fused", 3, 1, 128),
    (F16, "fused", 5, 17, 80),
    (F32, "fused", 4, 1, 64),
    (F16, "simt", 3, 2, 64),
    (BF16, "auto", None, 1, 256),  # decode: the heuristic splits by itself
])
def test_split_kv(rt, ledger, rng, dtype, path, splits, Sq, D):
    H, Hkv, Sk = 8, 2, 1000
    node = make_node(H, Hkv, causal=1)
    host = host_inputs(rng, dtype, 1, H, Hkv, Sq, Sk, D)
    with Buffers(rt) as bufs:
        # closed (counter pool) on exit
        kernel = bufs.kernel(node, AttentionConfig(path=path, num_splits=splits))
        got = run(rt, kernel, host, bufs)
        assert kernel.last_plan.splits > 1
        check(node, host, got, dtype)
        # Without a workspace the fused path runs unsplit, and equally right.
        got2 = run(rt, kernel, host, bufs, workspace=False)
        assert kernel.last_plan.splits == 1
        check(node, host, got2, dtype)


def test_simt_fallback_for_odd_layouts(rt, ledger, rng):
    """D % 8 != 0 and a misaligned pointer both take the CUDA-core fused kernel."""
    node = make_node(4, 2, causal=1)
    host = host_inputs(rng, F16, 1, 4, 2, 33, 100, 20)
    kernel = AttentionKernel(rt, node)
    with Buffers(rt) as bufs:
        got = run(rt, kernel, host, bufs)
        assert kernel.last_plan.path == "simt"
        check(node, host, got, F16)
        # Q one element past a 16-byte boundary: tensor cores can't cp.async it.
        host = host_inputs(rng, BF16, 1, 4, 2, 33, 100, 64)
        qbuf = bufs.array(shape=(host[0].size + 1,), dtype=BF16)
        qbuf.copy_from(np.concatenate([np.zeros(1, host[0].dtype), host[0].ravel()]))
        q = TensorView(qbuf.ptr + 2, BF16, host[0].shape)
        k, v = (bufs.array(h).view() for h in host[1:3])
        out = bufs.array(shape=host[0].shape, dtype=BF16)
        out.fill_bytes(0xFF)
        kernel.execute([q, k, v], [out.mut()])
        assert kernel.last_plan.path == "simt"
        check(node, host, out.numpy(), BF16)


@pytest.mark.parametrize("path", ["auto", "unfused"])
def test_strided_views(rt, ledger, rng, path):
    """Q and the output as [B, S, H, D] memory seen as [B, H, S, D]; K/V as slices of a KV pair."""
    B, H, Hkv, Sq, Sk, D = 2, 4, 2, 17, 130, 64
    node = make_node(H, Hkv, causal=1)
    host = host_inputs(rng, BF16, B, H, Hkv, Sq, Sk, D)
    with Buffers(rt) as bufs:
        kernel = bufs.kernel(node, AttentionConfig(path=path))
        qb = bufs.array(np.ascontiguousarray(host[0].transpose(0, 2, 1, 3)))  # [B, Sq, H, D]
        q = TensorView(qb.ptr, BF16, (B, H, Sq, D), (Sq * H * D, D, H * D, 1))
        kv = bufs.array(np.stack([host[1], host[2]], axis=2))  # [B, Hkv, 2, Sk, D]
        kst = (Hkv * 2 * Sk * D, 2 * Sk * D, D, 1)
        k = TensorView(kv.ptr, BF16, (B, Hkv, Sk, D), kst)
        v = TensorView(kv.ptr + Sk * D * 2, BF16, (B, Hkv, Sk, D), kst)
        ob = bufs.array(shape=(B, Sq, H, D), dtype=BF16)
        ob.fill_bytes(0xFF)
        out = TensorMut(ob.ptr, BF16, (B, H, Sq, D), (Sq * H * D, D, H * D, 1))
        req = kernel.workspace_requirement([q.meta, k.meta, v.meta])
        ws = WorkspaceView(bufs.raw(req.nbytes), req.nbytes) if req.nbytes else None
        kernel.execute([q, k, v], [out], ws)
        got = ob.numpy().transpose(0, 2, 1, 3)
    if path == "auto":
        assert kernel.last_plan.path == "tc"
    check(node, host, got, BF16)


def test_large_head_dim_takes_unfused(rt, ledger, rng):
    node = make_node(2, 1)
    host = host_inputs(rng, F16, 1, 2, 1, 17, 33, 320)
    kernel = AttentionKernel(rt, node)
    with Buffers(rt) as bufs:
        got = run(rt, kernel, host, bufs)
    assert kernel.last_plan.path == "unfused"
    check(node, host, got, F16)
    with pytest.raises(KernelError, match="D = 320"):
        AttentionKernel.fused(rt, node).workspace_requirement(
            [attnrt.TensorMetadata(F16, h.shape) for h in host[:3]])


def test_empty_keys_give_zeros(rt, ledger, rng):
    node = make_node(2, 2)
    host = host_inputs(rng, F16, 1, 2, 2, 5, 0, 64)
    for path in ("auto", "unfused"):
        with Buffers(rt) as bufs:
            q = bufs.array(host[0])
            kv = TensorView(q.ptr, F16, (1, 2, 0, 64))  # Sk = 0: nothing is read
            out = bufs.array(shape=host[0].shape, dtype=F16)
            out.fill_bytes(0xFF)
            AttentionKernel(rt, node, AttentionConfig(path=path)).execute([q.view(), kv, kv], [out.mut()])
            assert np.all(out.numpy() == 0)


def test_short_workspace_is_refused(rt, ledger, rng):
    node = make_node(4, 2)
    host = host_inputs(rng, F16, 1, 4, 2, 64, 64, 64)
    for kernel in (AttentionKernel.unfused(rt, node),
                   AttentionKernel.fused(rt, node, AttentionConfig(num_splits=2))):
        with Buffers(rt) as bufs:
            views = [bufs.array(h).view() for h in host[:3]]
            out = bufs.array(shape=host[0].shape, dtype=F16)
            req = kernel.workspace_requirement([t.meta for t in views])
            assert req.nbytes > 0
            p = bufs.raw(req.nbytes)
            before = rt.launch_count
            with pytest.raises(WorkspaceError) as ei:
                kernel.execute(views, [out.mut()], WorkspaceView(p, req.nbytes - 1))
            assert ei.value.required == req.nbytes and ei.value.provided == req.nbytes - 1
            assert rt.launch_count == before  # refused before any launch
            kernel.execute(views, [out.mut()], WorkspaceView(p, req.nbytes))  # exact is fine
            rt.synchronize()


def test_unfused_without_workspace(rt, ledger, rng):
    """Eager: it owns a temporary buffer. Capturing: refused, nothing allocated."""
    node = make_node(4, 4, causal=1)
    host = host_inputs(rng, BF16, 1, 4, 4, 40, 70, 64)
    kernel = AttentionKernel.unfused(rt, node)
    with Buffers(rt) as bufs:
        got = run(rt, kernel, host, bufs, workspace=False)
        check(node, host, got, BF16)
        views = [bufs.array(h).view() for h in host[:3]]
        out = bufs.array(shape=host[0].shape, dtype=BF16)
        with pytest.raises(CaptureError, match="workspace"):
            with rt.capture():
                kernel.execute(views, [out.mut()])


@pytest.mark.parametrize("path,Sq,planes", [("auto", 1, 0), ("auto", 100, 1), ("unfused", 3, 8)])
def test_capture_replay_with_changed_contents(rt, ledger, rng, path, Sq, planes):
    B, H, Hkv, Sk, D = 2, 4, 2, 1000, 128
    node = make_node(H, Hkv, _mask=bool(planes), causal=1, softcap=4.0)
    host = host_inputs(rng, BF16, B, H, Hkv, Sq, Sk, D, planes)
    with Buffers(rt) as bufs, Executor(rt) as ex:
        devs = [bufs.array(h) for h in host if h is not None]
        out = bufs.array(shape=host[0].shape, dtype=BF16)
        for name, a in zip(["q", "k", "v", "mask"], devs):
            ex.bind(name, a.view())
        ex.bind("o", out.mut())
        ex.add(node, AttentionFactory(rt, AttentionConfig(path=path)))
        ex.plan()
        out.fill_bytes(0xFF)
        ex.run()
        eager = out.numpy()
        check(node, host, eager, BF16)
        ex.capture()
        for _ in range(2):
            host = host_inputs(rng, BF16, B, H, Hkv, Sq, Sk, D, planes)
            for a, h in zip(devs, [h for h in host if h is not None]):
                a.copy_from(h)
            out.fill_bytes(0xFF)
            ex.replay()
            replayed = out.numpy()
            check(node, host, replayed, BF16)
            out.fill_bytes(0xFF)
            ex.run()
            np.testing.assert_array_equal(out.numpy().view(np.uint16), replayed.view(np.uint16))


# --------------------------------------------------------------------------- wgmma (path="wg")
# The sm_90a wgmma kernel runs in a child process with its own CUDA context (as in
# tests/test_paged_gpu.py): until it has been measured on the H200, a device fault there must
# not poison the session's runtime and with it every GPU test after this one.
# (dtype, B, H, Hkv, Sq, Sk, D, attrs, mask planes, splits)
WG_CASES = [
    (BF16, 1, 4, 4, 128, 128, 128, {}, 0, None),
    (F16, 2, 4, 4, 17, 1000, 64, {}, 0, None),
    (BF16, 1, 4, 4, 1000, 1000, 64, {"causal": 1}, 0, None),
    (F16, 1, 8, 2, 1000, 1000, 128, {"causal": 1}, 0, None),
    (BF16, 2, 8, 2, 128, 17, 128, {}, 0, None),
    (F16, 1, 8, 2, 1, 1000, 128, {"causal": 1}, 0, None),   # decode: heuristic splits
    (BF16, 2, 8, 1, 17, 128, 64, {"causal": 1}, 0, None),   # MQA, Sq < Sk
    (F16, 1, 4, 2, 128, 17, 64, {"causal": 1}, 0, None),    # Sq > Sk: leading rows see nothing
    (BF16, 1, 2, 2, 17, 1, 128, {}, 0, None),
    (F16, 1, 8, 2, 1000, 128, 64, {}, 0, 3),                # forced splits
    (BF16, 1, 8, 2, 128, 1000, 128, {"softcap": 5.0}, 0, None),
    (F16, 1, 4, 4, 1000, 1000, 64, {"causal": 1, "local_window_size": 100}, 0, None),
    (BF16, 1, 4, 2, 17, 1000, 128, {"local_window_size": 0}, 0, None),
    (F16, 2, 4, 2, 128, 1000, 128, {"scale": 0.05, "softcap": 3.0, "causal": 1}, 8, None),
    (BF16, 2, 4, 2, 17, 128, 64, {}, 2, None),
    # D128 from WG_LONG's min Sk on: 176-key tiles, the last one partial (8300 = 47 x 176 + 28)
    (BF16, 1, 4, 2, 200, 8300, 128, {}, 0, None),
    (F16, 1, 4, 2, 130, 8200, 128, {"softcap": 5.0}, 1, None),
]


def _wg_child() -> None:
    """Child-process body of test_wg_path_in_child_process: every case on a fresh runtime."""
    import zlib

    rt = attnrt.CudaRuntime(0)
    before = rt.memory_stats().live_bytes
    failures = []
    for c in WG_CASES:
        name = _ids(c[:9]) + f"-s{c[9]}"
        try:
            dtype, B, H, Hkv, Sq, Sk, D, attrs, planes, splits = c
            rng = np.random.default_rng(zlib.crc32(name.encode()))
            node = make_node(H, Hkv, _mask=bool(planes), **attrs)
            host = host_inputs(rng, dtype, B, H, Hkv, Sq, Sk, D, planes, masked_row=True)
            kernel = AttentionKernel(rt, node, AttentionConfig(path="wg", num_splits=splits))
            with Buffers(rt) as bufs:
                got = run(rt, kernel, host, bufs)
            assert kernel.last_plan.path == "wg", kernel.last_plan
            if splits:
                assert kernel.last_plan.splits == splits
            want = check(node, host, got, dtype)
            dead = ~np.any(want != 0, axis=-1)
            assert np.all(got.astype(np.float32)[dead] == 0), "a row that sees no key is not 0"
            print(f"wg {name}: ok (splits {kernel.last_plan.splits})", flush=True)
        except Exception as exc:  # keep going: report every failing case
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            print(f"wg {name}: FAILED {exc}", flush=True)
    rt.synchronize()
    leaked = rt.memory_stats().live_bytes - before
    rt.close()
    assert not failures and leaked == 0, f"{failures}; leaked {leaked} bytes"


def test_wg_path_in_child_process(rt):
    if tuple(rt.capabilities.compute_capability) != (9, 0):
        pytest.skip("path='wg' (sm_90a wgmma) needs compute capability 9.0")
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c",
                        "from tests.test_attention_gpu import _wg_child; _wg_child()"],
                       cwd=root, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"child exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


# Persistent schedules (6, 7) with the grid capped at a few CTAs against schedule 6 uncapped
# (one CTA per SM, at most a few items each): same arithmetic per item, so the outputs must
# agree bitwise. The capped grids make every CTA loop over many items: causal items of 1..8
# tiles, split items, items with no tile at all (Sq > Sk causal; more splits than tiles), a
# mask, softcap and a window.
# (dtype, B, H, Hkv, Sq, Sk, D, attrs, mask planes, splits)
PERSIST_CASES = [
    (BF16, 2, 8, 2, 1000, 1000, 128, {"causal": 1}, 0, None),
    (F16, 1, 8, 2, 700, 1000, 64, {}, 0, 3),
    (BF16, 1, 4, 4, 1000, 1000, 64, {"causal": 1, "local_window_size": 100}, 0, None),
    (F16, 2, 4, 2, 128, 1000, 128, {"scale": 0.05, "softcap": 3.0, "causal": 1}, 8, None),
    (BF16, 1, 4, 2, 300, 17, 128, {"causal": 1}, 0, 3),
]


@pytest.mark.parametrize("case", PERSIST_CASES, ids=lambda c: _ids(c[:9]) + f"-s{c[9]}")
def test_wg_persistent_capped_grid_matches(rt, ledger, rng, case):
    if tuple(rt.capabilities.compute_capability) != (9, 0):
        pytest.skip("path='wg' (sm_90a wgmma) needs compute capability 9.0")
    dtype, B, H, Hkv, Sq, Sk, D, attrs, planes, splits = case
    node = make_node(H, Hkv, _mask=bool(planes), **attrs)
    host = host_inputs(rng, dtype, B, H, Hkv, Sq, Sk, D, planes, masked_row=True)
    outs = {}
    for sched, cap in ((6, None), (6, 3), (7, 5)):
        cfg = AttentionConfig(path="wg", num_splits=splits, wg_max_ctas=cap,
                              wg_build={64: (sched, 128, 1), 128: (sched, 128, 1)},
                              wg_causal={}, wg_long={})
        kernel = AttentionKernel(rt, node, cfg)
        with Buffers(rt) as bufs:
            got = run(rt, kernel, host, bufs)
        assert kernel.last_plan.path == "wg" and wg_persistent(D, True, cfg)
        if splits:
            assert kernel.last_plan.splits == splits
        check(node, host, got, dtype)
        outs[sched, cap] = got.view(np.uint16)
    np.testing.assert_array_equal(outs[6, 3], outs[6, None])
    np.testing.assert_array_equal(outs[7, 5], outs[6, None])


def test_wg_refused_where_it_cannot_run(rt, ledger):
    """Forcing path='wg' on what the kernel does not take is a KernelError before any launch."""
    node = make_node(4, 2)
    for dtype, D in ((F32, 64), (F16, 80), (BF16, 256)):
        metas = [attnrt.TensorMetadata(dtype, (1, 4, 17, D)), attnrt.TensorMetadata(dtype, (1, 2, 33, D)),
                 attnrt.TensorMetadata(dtype, (1, 2, 33, D))]
        with pytest.raises(KernelError, match="path='wg'"):
            AttentionKernel(rt, node, AttentionConfig(path="wg")).workspace_requirement(metas)
