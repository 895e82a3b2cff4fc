"""64-bit index math: every op at sizes where element offsets pass 2**31 (and 2**32).

The big tensors are filled with a finite constant (a memset) and only the slices an op
touches get seeded random data, so a wrapped 32-bit offset reads or writes the wrong place
and shows up as a wrong result; the reference is computed on the touched slice alone.

- Attention: (a) Q, K, V and O as [2, H, S, D] views whose batch stride is 2**32 elements
  (batch 1 lives past 2**32 in one 8.6 GB buffer), tensor-core, SIMT and unfused paths;
  (b) K and V interleaved in the same buffer with Sk = 16.8M keys (key rows past 2**32
  elements), causal + local window so only the tail is visible, tensor-core (auto and
  forced split-KV) and SIMT paths.
- PagedAttention (MLA 576/512): a key cache of 116,600 blocks of 64 (4.3e9 elements, 8.6 GB)
  whose used blocks sit at the far end through the block table; the tensor-core path
  (auto and forced split-KV) and the simple path; output, the written cache rows, and the
  rows a 32-bit wrap would have hit.
- IndexShare: past K/V of [2, 1, 17.3M, 128] f16 (4.4e9 elements each) with selected
  indices near the start and the end of both batches and the current tokens; tensor-core
  and SIMT paths.

Memory peaks at about 18 GB (IndexShare); everything is freed (the ledger returns to zero).
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack
from typing import Any

import numpy as np
import pytest

from attnrt.ops import reference
from attnrt.ops.attention import AttentionConfig, AttentionFactory
from attnrt.ops.index_share import IndexShareFactory
from attnrt.ops.paged_attention import PagedAttentionConfig, PagedAttentionFactory
from attnrt.runtime.api import DataType, Node, TensorMut, TensorView, WorkspaceView
from attnrt.runtime.tensors import DeviceArray
from tests._util import TOL, rel_fro
from tests.test_paged_cpu import make_case
from tests.test_paged_gpu import check as check_paged

pytestmark = pytest.mark.gpu

BF16, F16 = DataType.BFLOAT16, DataType.FLOAT16
FILL = 0x3C  # bf16 0x3C3C ~ 0.0115, f16 0x3C3C ~ 1.06: finite, and unlike the seeded data


class Mem(ExitStack):
    """Allocations freed on exit."""

    def __init__(self, rt: Any) -> None:
        super().__init__()
        self.rt = rt

    def raw(self, nbytes: int) -> int:
        p = self.rt.alloc_raw(nbytes)
        self.callback(self.rt.free_raw, p)
        return p

    def array(self, host: np.ndarray) -> DeviceArray:
        d = DeviceArray.from_numpy(self.rt, host)
        self.callback(d.free)
        return d

    def workspace(self, kernel: Any, metas: list) -> WorkspaceView | None:
        req = kernel.workspace_requirement(metas)
        return WorkspaceView(self.raw(req.nbytes), req.nbytes) if req.nbytes else None


def _read(rt: Any, ptr: int, shape: tuple[int, ...], dtype: DataType) -> np.ndarray:
    return rt.dtoh(np.empty(shape, dtype=dtype.numpy), ptr)


def _is_filler(a: np.ndarray) -> bool:
    return bool(np.all(np.ascontiguousarray(a).view(np.uint8) == FILL))


# --------------------------------------------------------------------------- Attention
def test_attention_offsets_past_2_32(rt, ledger, rng):
    D, it = 128, 2
    n = 2**32 + 2**22  # elements of the shared buffer
    with Mem(rt) as mem:
        big = mem.raw(n * it)
        rt.memset(big, FILL, n * it)

        # (a) batch stride 2**32: batch 1 of every tensor sits past 2**32 elements.
        B, H, Hkv, S = 2, 4, 2, 70
        sb = 2**32
        base = {"q": 0, "k": 2**18, "v": 2**19, "o": 3 * 2**18}
        node = Node("Attention", "pkg.nxrt", {"num_heads": H, "kv_num_heads": Hkv, "causal": 1},
                    ["q", "k", "v"], ["o"])
        host = {name: rng.standard_normal((B, h, S, D), dtype=np.float32).astype(BF16.numpy)
                for name, h in (("q", H), ("k", Hkv), ("v", Hkv))}
        for name, a in host.items():
            for b in range(B):
                rt.htod(big + (base[name] + b * sb) * it, a[b])

        def view(name: str, heads: int, cls: type = TensorView) -> TensorView:
            return cls(big + base[name] * it, BF16, (B, heads, S, D), (sb, S * D, D, 1))

        q, k, v, o = view("q", H), view("k", Hkv), view("v", Hkv), view("o", H, TensorMut)
        want = reference.attention(node, [host["q"], host["k"], host["v"]], out_dtype=np.float64)
        for path in ("auto", "simt", "unfused"):
            kern = AttentionFactory(rt, AttentionConfig(path=path)).create(node, [q.shape, k.shape, v.shape])
            ws = mem.workspace(kern, [q.meta, k.meta, v.meta])
            for b in range(B):
                rt.memset(o.ptr + b * sb * it, 0xFF, H * S * D * it)
            kern.execute([q, k, v], [o], ws)
            got = np.stack([_read(rt, o.ptr + b * sb * it, (H, S, D), BF16) for b in range(B)])
            err = rel_fro(got, want)
            assert err < TOL[BF16], f"batch-stride case, path {path} ({kern.last_plan}): {err:.2e}"
            if path == "auto":  # the wgmma kernel on compute capability 9.0
                assert kern.last_plan.path in ("tc", "wg")

        # (b) K/V rows interleaved: key j at element 2*j*D, value j at (2*j+1)*D, so the
        # last keys sit past 2**32 elements; only a window at the end is visible.
        Sk = (n - D) // (2 * D)
        assert 2 * (Sk - 1) * D > 2**32
        H, Hkv, Sq, window, tail = 4, 1, 33, 100, 200
        node = Node("Attention", "pkg.nxrt", {"num_heads": H, "kv_num_heads": Hkv, "causal": 1,
                                              "local_window_size": window}, ["q", "k", "v"], ["o"])
        kv_tail = rng.standard_normal((tail, 2, D), dtype=np.float32).astype(BF16.numpy)
        rt.htod(big + 2 * (Sk - tail) * D * it, kv_tail)
        kst = (2 * Sk * D, 2 * Sk * D, 2 * D, 1)
        k = TensorView(big, BF16, (1, Hkv, Sk, D), kst)
        v = TensorView(big + D * it, BF16, (1, Hkv, Sk, D), kst)
        qh = rng.standard_normal((1, H, Sq, D), dtype=np.float32).astype(BF16.numpy)
        qd = mem.array(qh)
        od = mem.array(np.zeros((1, H, Sq, D), BF16.numpy))
        want = reference.attention(node, [qh, kv_tail[None, None, :, 0], kv_tail[None, None, :, 1]],
                                   out_dtype=np.float64)
        for path, splits in (("auto", None), ("fused", 3), ("simt", None)):
            kern = AttentionFactory(rt, AttentionConfig(path=path, num_splits=splits)).create(node)
            ws = mem.workspace(kern, [qd.view().meta, k.meta, v.meta])
            od.fill_bytes(0xFF)
            kern.execute([qd.view(), k, v], [od.mut()], ws)
            err = rel_fro(od.numpy(), want)
            assert err < TOL[BF16], f"long-sequence case, path {path} ({kern.last_plan}): {err:.2e}"
        rt.synchronize()
        rt.latch.check()


# --------------------------------------------------------------------------- PagedAttention
def test_paged_cache_past_2_32_elements(rt, ledger, rng):
    hs, bs, it = 576, 64, 2
    nb = 116_600
    assert nb * bs * hs > 2**32
    c = make_case(rng, dtype=BF16, H=16, hs=hs, vhs=512, bs=bs, rd=64, offset=512, rope="half",
                  q_lens=(1, 3), past_lens=(100, 200), extra_blocks=1)
    nb_small = c.inputs[3].shape[0]
    shift = nb - nb_small  # the case's blocks become the last blocks of the big cache
    ins = list(c.inputs)
    bt = c.inputs[7].copy()
    bt[bt >= 0] += shift
    slot = c.inputs[10].astype(np.int64)
    slot[slot >= 0] += shift * bs
    assert slot.max() * hs > 2**32
    ins[7], ins[10] = bt, slot.astype(np.int32)
    row_bytes = hs * it
    with Mem(rt) as mem:
        cache_bytes = nb * bs * row_bytes
        kc = mem.raw(cache_bytes)
        rt.memset(kc, FILL, cache_bytes)
        tail_ptr = kc + shift * bs * row_bytes
        rt.htod(tail_ptr, c.inputs[3])
        bufs = {i: mem.array(x) for i, x in enumerate(ins[:16]) if x is not None and i != 3}
        kcv = TensorMut(kc, BF16, (nb, bs, 1, hs))
        views = [kcv if i == 3 else bufs[i].view() if i in bufs else TensorView.absent_slot()
                 for i in range(16)]
        out = mem.array(np.zeros((c.T, c.H * c.vhs), BF16.numpy))
        for path, splits in (("auto", None), ("mla", 3), ("simple", None)):
            cfg = PagedAttentionConfig(path=path, num_splits=splits)
            kern = PagedAttentionFactory(rt, config=cfg).create(
                c.node, [v.shape if not v.absent else None for v in views])
            ws = mem.workspace(kern, views)
            out.fill_bytes(0xFF)
            kern.execute(views, [out.mut(), kcv], ws)
            tail = _read(rt, tail_ptr, c.inputs[3].shape, BF16)
            check_paged(c, out.numpy(), tail)  # output, written rows (RoPE), untouched rows
            want = {"simple": "simple", "mla": "mla"}.get(
                path, "wg" if tuple(rt.capabilities.compute_capability) == (9, 0) else "mla")
            assert kern.last_plan.path == want
            if splits:
                assert kern.last_plan.splits == splits
            rt.latch.check()  # no block or slot was seen out of range
        # Nothing landed where a 32-bit element offset would have wrapped to, nor at the start.
        for s in np.unique(slot[slot >= 0]):
            wrapped = (int(s) * hs) % 2**32 // hs
            assert _is_filler(_read(rt, kc + wrapped * row_bytes, (hs,), BF16)), f"slot {s}"
        assert _is_filler(_read(rt, kc, (2 * bs, hs), BF16))
        assert _is_filler(_read(rt, tail_ptr - bs * row_bytes, (bs, hs), BF16))


# --------------------------------------------------------------------------- IndexShare
def test_index_share_past_cache_past_2_32_elements(rt, ledger, rng):
    B, N, Nkv, Sq, cur, H, K, it = 2, 8, 1, 2, 3, 128, 64, 2
    S = 2**24 + 2**19
    head, tail = 64, 256
    assert B * Nkv * S * H > 2**32 and (S - tail) * H > 2**31
    node = Node("IndexShare", "pkg.nxrt", {"num_heads": N, "kv_num_heads": Nkv},
                ["q", "k", "v", "pk", "pv", "idx"], ["y"])
    f16 = np.float16
    q = rng.standard_normal((B, N, Sq, H), dtype=np.float32).astype(f16)
    k = rng.standard_normal((B, Nkv, cur, H), dtype=np.float32).astype(f16)
    v = rng.standard_normal((B, Nkv, cur, H), dtype=np.float32).astype(f16)
    # The touched past rows: [0, head) and [S - tail, S) of every (batch, kv head).
    pk_small = rng.standard_normal((B, Nkv, head + tail, H), dtype=np.float32).astype(f16)
    pv_small = rng.standard_normal((B, Nkv, head + tail, H), dtype=np.float32).astype(f16)
    # Indices drawn from the touched rows and the current tokens, in the big numbering.
    pool = np.concatenate([np.arange(head), np.arange(S - tail, S), np.arange(S, S + cur)])
    idx = np.full((B, 1, Sq, K), -1, dtype=np.int64)
    for pos in np.ndindex(B, 1, Sq):
        n = int(rng.integers(K // 2, K + 1))
        idx[pos][:n] = np.sort(rng.choice(pool, size=n, replace=False))
    small = np.where(idx < 0, -1, np.where(idx < head, idx, np.where(
        idx < S, idx - (S - tail) + head, idx - S + head + tail)))
    want = reference.index_share(node, [q, k, v, pk_small, pv_small, small.astype(np.int32)])[0]
    nbytes = B * Nkv * S * H * it
    with Mem(rt) as mem:
        pk, pv = mem.raw(nbytes), mem.raw(nbytes)
        for ptr, host in ((pk, pk_small), (pv, pv_small)):
            rt.memset(ptr, FILL, nbytes)
            for b in range(B):
                for h in range(Nkv):
                    row0 = (b * Nkv + h) * S
                    rt.htod(ptr + row0 * H * it, host[b, h, :head])
                    rt.htod(ptr + (row0 + S - tail) * H * it, host[b, h, head:])
        views = [mem.array(q).view(), mem.array(k).view(), mem.array(v).view(),
                 TensorView(pk, F16, (B, Nkv, S, H)), TensorView(pv, F16, (B, Nkv, S, H)),
                 mem.array(idx.astype(np.int32)).view()]
        y = mem.array(np.zeros(q.shape, f16))
        kern = IndexShareFactory(rt).create(node)
        mem.callback(kern.close)
        for path in (None, "simt"):
            kern.config = dataclasses.replace(kern.config, path=path)
            ws = mem.workspace(kern, [t.meta for t in views])
            y.fill_bytes(0xFF)
            kern.execute(views, [y.mut()], ws)
            err = rel_fro(y.numpy(), want)
            assert err < TOL[F16], f"path {path} ({kern.last_plan.path}): rel_fro {err:.2e}"
            if path is None:
                assert kern.last_plan.path == "mma"
        rt.latch.check()
