"""IndexShare benchmark: ``python tools/bench.py index_share``.

Top-k 2048 selected tokens, H 128, bf16, N in {64, 128} query heads sharing one index row
and one kv head (DeepSeek-DSA style MQA), decode (Sq 1, B 64) and prefill (Sq 4096, B 1)
at caches of 8k and 64k, plus a decode row with one kv head per query head (MHA, the
CUDA-core path). Ours is timed as a captured graph replay of ``execute`` (the production
path: device-side index validation included, no host round trip). Effective GB/s counts
the gathered K and V bytes (distinct (batch, kv head, query, selected key) rows × H × 2 ×
2 bytes) against the copy ceiling measured in the same run. The peer is torch: advanced-
indexing gather of the selected K/V rows, then ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import math
from typing import Any

from bench import BenchContext, row

import nxrt
from nxrt.api import Node, TensorView
from nxrt_kernels import index_share


def _cases(quick: bool) -> list[dict[str, Any]]:
    heads = (64,) if quick else (64, 128)
    caches = (8192,) if quick else (8192, 65536)
    out = []
    for n in heads:
        for cache in caches:
            out.append(dict(kind="decode", b=8 if quick else 64, sq=1, n=n, nkv=1, cache=cache))
            out.append(dict(kind="prefill", b=1, sq=256 if quick else 4096, n=n, nkv=1, cache=cache))
    out.append(dict(kind="decode", b=8 if quick else 64, sq=1, n=64, nkv=64, cache=8192))
    return out


def _one(ctx: BenchContext, c: dict[str, Any], k: int = 2048, h: int = 128) -> list[dict]:
    torch, rt = ctx.torch, ctx.rt
    b, sq, n, nkv, cache = c["b"], c["sq"], c["n"], c["nkv"], c["cache"]
    cur = sq
    g = torch.Generator(device="cuda").manual_seed(1234)
    dt = torch.bfloat16
    q = torch.randn(b, n, sq, h, device="cuda", dtype=dt, generator=g)
    kc = torch.randn(b, nkv, cache, h, device="cuda", dtype=dt, generator=g)
    vc = torch.randn(b, nkv, cache, h, device="cuda", dtype=dt, generator=g)
    pk, pv = kc[:, :, : cache - cur].contiguous(), vc[:, :, : cache - cur].contiguous()
    kk, vv = kc[:, :, cache - cur:].contiguous(), vc[:, :, cache - cur:].contiguous()
    # Sorted distinct top-k rows (no padding), chunked to bound the temporary.
    idx = torch.empty(b * sq, k, device="cuda", dtype=torch.int32)
    step = max(1, (1 << 28) // cache)
    for s in range(0, b * sq, step):
        e = min(b * sq, s + step)
        r = torch.rand(e - s, cache, device="cuda", generator=g)
        idx[s:e] = r.topk(k, dim=1).indices.sort(dim=1).values.to(torch.int32)
        del r
    idx = idx.view(b, 1, sq, k)
    y = torch.empty_like(q)
    torch.cuda.synchronize()

    node = Node("IndexShare", "pkg.nxrt", {"num_heads": n, "kv_num_heads": nkv},
                ["q", "k", "v", "pk", "pv", "idx"], ["y"])
    kern = index_share.IndexShareFactory(rt).create(node)
    views = [TensorView.from_array(t) for t in (q, kk, vv, pk, pv, idx)]
    outs = [nxrt.TensorMut.from_array(y)]
    kern.execute(views, outs)  # warm-up: compiles, validates on the host, sizes scratch
    rt.synchronize()
    with rt.capture() as graph:
        kern.execute(views, outs)
    ms = ctx.time_ours(graph.replay)
    rt.latch.check()
    rt.synchronize()
    first = y.clone()
    graph.replay()
    rt.synchronize()
    deterministic = bool(torch.equal(first, y))

    scale = 1.0 / math.sqrt(h)
    ig = idx[:, 0].long()  # [B, Sq, K]

    def torch_ref() -> Any:
        if nkv == 1:
            bi = torch.arange(b, device="cuda")[:, None, None]
            kg, vg = kc[:, 0][bi, ig], vc[:, 0][bi, ig]  # [B, Sq, K, H]
            o = torch.nn.functional.scaled_dot_product_attention(
                q.permute(0, 2, 1, 3), kg, vg, scale=scale)  # heads act as the query axis
            return o.permute(0, 2, 1, 3)
        bi = torch.arange(b, device="cuda")[:, None, None, None]
        hi = torch.arange(nkv, device="cuda")[None, :, None, None]
        kg, vg = kc[bi, hi, ig[:, None]], vc[bi, hi, ig[:, None]]  # [B, N, Sq, K, H]
        o = torch.nn.functional.scaled_dot_product_attention(
            q.reshape(b * n, sq, 1, h), kg.reshape(b * n, sq, k, h), vg.reshape(b * n, sq, k, h),
            scale=scale)
        return o.reshape(b, n, sq, h)

    tms = ctx.time_torch(torch_ref, warmup=2, reps=10)
    diff = float((torch_ref().float() - y.float()).abs().max())
    gathered = b * sq * nkv * k * h * 2 * 2
    gbps = gathered / ms / 1e6
    ceiling = ctx.ceilings.get("copy_GBps")
    name = (f"bf16 {c['kind']} B{b} Sq{sq} N{n} Nkv{nkv} H{h} cache{cache // 1024}k top{k} "
            f"({kern.last_plan.path}, splits {kern.last_plan.splits})")
    extra = dict(ms=round(ms, 4), peer_ms=round(tms, 4), deterministic=deterministic,
                 max_abs_diff_vs_torch=round(diff, 5))
    rows = [row("index_share", name, "GB/s", gbps, "copy-bandwidth", ceiling,
                of_ceiling=None if not ceiling else gbps / ceiling, **extra),
            row("index_share", name, "1/ms", 1.0 / ms, "torch-gather-sdpa", 1.0 / tms, **extra)]
    kern.close()
    del graph
    return rows


def run(ctx: BenchContext) -> list[dict]:
    """One GB/s row (vs the copy ceiling) and one speed row (vs torch) per case."""
    if ctx.torch is None:
        ctx.log("index_share: torch with CUDA is needed for the inputs and the peer; skipped")
        return []
    rows: list[dict] = []
    for c in _cases(ctx.quick):
        try:
            got = _one(ctx, c)
        except Exception as exc:  # one case must not hide the others
            ctx.log(f"index_share {c}: FAILED {type(exc).__name__}: {exc}")
            got = [row("index_share", str(c), "error", 0, type(exc).__name__, None, error=str(exc))]
        rows += got
        for r in got:
            ctx.log(f"{r['case']}: {r['metric']} ours {r['ours']} peer {r['peer_value']} "
                    f"ratio {r['ratio']}")
        ctx.torch.cuda.empty_cache()
    return rows
