#!/usr/bin/env python3
"""Is MLA decode at 16 heads bound by the cache reads once the heads are the wgmma N
dimension? Runs ``lab/heads_n_probe.cu`` (S^T = K Q^T, O^T = V^T P^T; one warpgroup, two
TMA tile stages) against a float32 torch reference and FlashMLA on the same tensors, and
times both, interleaved (median of 5 replays of a CUDA graph of 20 calls each).

    PYTHONPATH=.:tools python lab/heads_n_probe.py 128:4096 32:8192 8:8192 32:8187

Each row is B:L (L keys per sequence, any L >= 1; the last tile is masked). Prints, per row,
the relative Frobenius error against the reference (ours and FlashMLA's), both times, GB/s
of the latent cache read once, and ours / FlashMLA. Needs torch and an sm_90a GPU; FlashMLA
from ``.peers/flashmla`` as ``tools/bench.py paged`` builds it (skipped when absent).
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import _flashmla_peer  # noqa: E402
from _paged_grid import rel_frobenius  # noqa: E402

import attnrt  # noqa: E402
from attnrt.ops import _common  # noqa: E402
from attnrt.runtime.api import DataType  # noqa: E402

H, HS, VHS, BN = 16, 576, 512, 64
SMEM = 18432 + 2 * 73728 + 2048 + 512 + 256 + 16 + 1024  # heads_n_probe.cu's layout + alignment
SCALE = 192 ** -0.5


def reference(torch, q, kcache, bt, lens):
    """float32 [B, H, 512] on the GPU, per sequence."""
    out = torch.empty(q.shape[0], H, VHS, device=q.device, dtype=torch.float32)
    flat = kcache.view(-1, HS)
    for b, n in enumerate(lens):
        pages = bt[b, : (n + BN - 1) // BN].long()
        rows = (pages[:, None] * BN + torch.arange(BN, device=q.device)[None, :]).reshape(-1)[:n]
        k = flat[rows].float()
        s = (q[b].float() @ k.T) * SCALE
        out[b] = torch.softmax(s, dim=-1) @ k[:, :VHS]
    return out


def graph(torch, stream, fn, n=20):
    """A CUDA graph of ``n`` calls of ``fn`` on ``stream``."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(n):
            fn()
    return g


def timed(torch, stream, g, n=20):
    """Microseconds per call of one replay of ``g`` (``n`` calls)."""
    a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(stream)
    g.replay()
    z.record(stream)
    z.synchronize()
    return a.elapsed_time(z) * 1e3 / n


def run_row(torch, rt, kernels, peer_mod, stream, B: int, L: int) -> bool:
    """Check and time one row; prints one line, returns whether ours agreed."""
    fwd, comb = kernels
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(B * 100003 + L)
    tiles = (L + BN - 1) // BN
    nblk = B * tiles + 7
    q = torch.randn(B, H, HS, device="cuda", dtype=torch.bfloat16, generator=gen)
    kc = torch.randn(nblk, BN, 1, HS, device="cuda", dtype=torch.bfloat16, generator=gen)
    perm = torch.randperm(nblk, device="cuda", generator=gen)[: B * tiles]
    bt = perm.view(B, tiles).to(torch.int32).contiguous()
    lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
    tps = -(-tiles // max(1, min(tiles, sms // B)))
    splits = -(-tiles // tps)
    out = torch.full((B, H, VHS), float("nan"), device="cuda", dtype=torch.bfloat16)
    ws_o = torch.empty(B * splits * H * VHS, device="cuda", dtype=torch.float32)
    ws_ml = torch.empty(B * splits * H * 2, device="cuda", dtype=torch.float32)
    tmap = rt.tensor_map_2d(kc.data_ptr(), DataType.BFLOAT16, (nblk * BN, HS), HS * 2, (64, BN))
    args = [q.data_ptr(), lens.data_ptr(), bt.data_ptr(), np.int32(tiles), np.int32(tps),
            np.float32(SCALE * math.log2(math.e)), out.data_ptr(), ws_o.data_ptr(),
            ws_ml.data_ptr(), tmap]
    comb_args = [ws_o.data_ptr(), ws_ml.data_ptr(), np.int32(splits), out.data_ptr()]

    def ours():
        rt.launch(fwd, (splits, B, 1), 128, args, shared_mem=SMEM)
        if splits > 1:
            rt.launch(comb, B, VHS, comb_args)

    peer = _flashmla_peer.FlashMLA(peer_mod, lens, B, 1, H, SCALE) if peer_mod else None
    ours()
    torch.cuda.synchronize()
    want = reference(torch, q, kc, bt, [L] * B)
    e_ours = rel_frobenius(out.float().cpu().numpy(), want.cpu().numpy())
    e_peer = float("nan")
    if peer is not None:
        got = peer(q.view(B, H * HS), kc, bt).view(B, H, VHS)
        e_peer = rel_frobenius(got.float().cpu().numpy(), want.cpu().numpy())
    good = math.isfinite(e_ours) and e_ours < 4 * max(e_peer if math.isfinite(e_peer) else 0, 2e-3)
    g_ours = graph(torch, stream, ours)
    g_peer = (graph(torch, stream, lambda: peer(q.view(B, H * HS), kc, bt))
              if peer is not None else None)
    t_ours, t_peer = [], []
    for _ in range(5):
        t_ours.append(timed(torch, stream, g_ours))
        if g_peer is not None:
            t_peer.append(timed(torch, stream, g_peer))
    mo = statistics.median(t_ours)
    mp = statistics.median(t_peer) if t_peer else float("nan")
    gbs = B * L * HS * 2 / (mo * 1e-6) / 1e9
    print(f"B{B} H16 L{L} splits {splits}x{tps}: rel F ours {e_ours:.2e} FlashMLA "
          f"{e_peer:.2e} ({'ok' if good else 'WRONG'}); ours {mo:.1f} us ({gbs:.0f} GB/s), "
          f"FlashMLA {mp:.1f} us, ours/FlashMLA speed {mp / mo:.3f}", flush=True)
    return good


def main(specs: list[str]) -> int:
    if specs[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    rows = []
    for spec in specs:
        try:
            B, L = (int(v) for v in spec.split(":"))
        except ValueError:
            print(f"heads_n_probe: a row is B:L, got {spec!r}", file=sys.stderr)
            return 2
        if B < 1 or L < 1:
            print(f"heads_n_probe: B and L must be >= 1, got {spec!r}", file=sys.stderr)
            return 2
        rows.append((B, L))
    import torch

    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    rt = attnrt.CudaRuntime(0, stream=stream)
    src = (ROOT / "lab" / "heads_n_probe.cu").read_text()
    kernels = tuple(rt.nvrtc_function("heads_n_probe", src, e, headers=_common.headers(),
                                      arch="sm_90a") for e in ("heads_n_fwd", "heads_n_combine"))
    peer_mod = _flashmla_peer.load(print, torch.cuda.get_device_capability())
    ok = True
    try:
        for B, L in rows:
            ok &= run_row(torch, rt, kernels, peer_mod, stream, B, L)
    finally:
        rt.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["128:4096", "32:8192", "8:8192", "32:8187"]))
