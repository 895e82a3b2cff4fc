"""IndexShare benchmark: ``python tools/bench.py index_share``.

The issue's rows: top-k 2048 selected tokens, H 128, bf16, N in {64, 128} query heads
sharing one index row and one kv head (DeepSeek-DSA style MQA), decode (Sq 1, B 64) and
prefill (Sq 4096, B 1), caches of 8k and 64k tokens (8 rows; ``--quick``: the two N 64
cache-8k rows). Ours is timed as a captured graph replay of ``execute`` (the production
path: device-side index validation included, no host round trip). Two independent input
sets are replayed alternately, so a decode step never finds the previous step's rows in
L2. Effective GB/s counts the gathered K and V bytes once per (batch, query, kv head,
selected key) — the heads that share an index row share its rows — against the copy
ceiling measured in the same run. The peers are torch on the same inputs: a gather of the
selected K/V rows, then ``scaled_dot_product_attention`` (index tensors built outside the
timed region), with the gather written two ways (``PEERS``): ``index_select`` on the
flattened cache (as fast as any eager gather we measured: at the decode rows 15-20 % faster
than advanced indexing, at prefill 4-8 %; docs/notes/index_share-history.md, round 24), the speed row's first
peer, and advanced indexing (``kc[b_idx, idx]``, the only peer before commit ``b889e86``),
kept as a second row so that new runs still compare with the earlier ones. Both peers give
the same bits; each row records whether they did (``peers_bitwise_equal``). Decode rows are also timed as
``STEP_CALLS`` calls captured in one graph (ours in one attnrt graph, torch's in one torch CUDA
graph), as attention's decode rows are: a model's decode step is one graph of many nodes,
so a single call per graph mostly adds the graph's own launch.
"""

from __future__ import annotations

import math
from typing import Any

from bench import BenchContext, row

import attnrt
from attnrt.ops import index_share
from attnrt.runtime.api import Node, TensorView

TOPK, HEAD = 2048, 128


def cases(quick: bool) -> list[dict[str, Any]]:
    """The benchmark rows: (kind, B, Sq, N, Nkv, cache), every decode row first.

    Decode rows time microsecond calls from an idle device; right after a prefill row
    (whose torch peer runs ~0.3 s at full power) one decode row's single-call time read
    27.1 us against 24.8-25.7 us elsewhere in the same process (H200, docs/notes/index_share-history.md,
    round 10), so prefill rows go last.
    """
    ns = (64,) if quick else (64, 128)
    caches = (8192,) if quick else (8192, 65536)
    return ([dict(kind="decode", b=64, sq=1, n=n, nkv=1, cache=c) for n in ns for c in caches]
            + [dict(kind="prefill", b=1, sq=4096, n=n, nkv=1, cache=c) for n in ns for c in caches])


def make_inputs(torch: Any, c: dict[str, Any], seed: int, k: int = TOPK, h: int = HEAD) -> dict:
    """One input set: q, the full cache (for the peer), past/current (for ours), indices."""
    b, sq, n, nkv, cache = c["b"], c["sq"], c["n"], c["nkv"], c["cache"]
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch.bfloat16
    q = torch.randn(b, n, sq, h, device="cuda", dtype=dt, generator=g)
    kc = torch.randn(b, nkv, cache, h, device="cuda", dtype=dt, generator=g)
    vc = torch.randn(b, nkv, cache, h, device="cuda", dtype=dt, generator=g)
    cur = sq
    pk, pv = kc[:, :, : cache - cur].contiguous(), vc[:, :, : cache - cur].contiguous()
    kk, vv = kc[:, :, cache - cur:].contiguous(), vc[:, :, cache - cur:].contiguous()
    # Sorted distinct top-k rows of random scores (no padding), chunked to bound the temporary.
    idx = torch.empty(b * sq, k, device="cuda", dtype=torch.int32)
    step = max(1, (1 << 28) // cache)
    for s in range(0, b * sq, step):
        e = min(b * sq, s + step)
        r = torch.rand(e - s, cache, device="cuda", generator=g)
        idx[s:e] = r.topk(k, dim=1).indices.sort(dim=1).values.to(torch.int32)
        del r
    return dict(q=q, kc=kc, vc=vc, pk=pk, pv=pv, kk=kk, vv=vv, idx=idx.view(b, 1, sq, k),
                y=torch.empty_like(q))


#: The torch peers (gather, speed-row label): index_select on the flattened cache first (the
#: faster; the issue's target is judged against it), advanced indexing second (the label every
#: result before commit b889e86 carries for it).
PEERS = (("index_select", "torch-index_select-sdpa"), ("advanced", "torch-gather-sdpa"))


def torch_peer(torch: Any, c: dict[str, Any], s: dict, k: int = TOPK, h: int = HEAD,
               gather: str = "index_select"):
    """A fair torch implementation: gather the selected rows, then SDPA.

    ``gather``: ``"index_select"`` (the cache flattened to rows, one ``index_select`` each for
    K and V with flat row numbers) or ``"advanced"`` (advanced indexing ``kc[b_idx, idx]``).
    The index tensors (int64, and the flat row numbers) are built here, outside the timed
    callable. Both give the same bits."""
    if gather not in ("index_select", "advanced"):
        raise ValueError(f"gather {gather!r}: 'index_select' or 'advanced'")
    b, sq, n, nkv = c["b"], c["sq"], c["n"], c["nkv"]
    cache = s["kc"].shape[2]
    scale = 1.0 / math.sqrt(h)
    ig = s["idx"][:, 0].long()  # [B, Sq, K]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    bi = torch.arange(b, device="cuda")[:, None, None, None]
    hi = torch.arange(nkv, device="cuda")[None, :, None, None]
    ig4 = ig[:, None]
    if gather == "index_select":
        # Row numbers of the cache flattened to [B * Nkv * cache, H], in [B, Nkv, Sq, K] order.
        kf, vf = s["kc"].reshape(-1, h), s["vc"].reshape(-1, h)
        flat = ((bi * nkv + hi) * cache + ig4).reshape(-1)

        def selected() -> tuple[Any, Any]:
            return kf.index_select(0, flat), vf.index_select(0, flat)
    if nkv == 1:
        k2, v2, qt = s["kc"][:, 0], s["vc"][:, 0], s["q"].permute(0, 2, 1, 3)
        b3 = bi[..., 0]

        def run() -> Any:
            if gather == "advanced":
                kg, vg = k2[b3, ig], v2[b3, ig]  # [B, Sq, K, H]
            else:
                kg, vg = (x.view(b, sq, k, h) for x in selected())
            # The heads sharing the row act as the query axis of one attention per (b, q).
            return sdpa(qt, kg, vg, scale=scale).permute(0, 2, 1, 3)
        return run

    def run_mha() -> Any:
        if gather == "advanced":
            kg, vg = s["kc"][bi, hi, ig4], s["vc"][bi, hi, ig4]  # [B, N, Sq, K, H]
        else:
            kg, vg = selected()
        o = sdpa(s["q"].reshape(b * n, sq, 1, h), kg.reshape(b * n, sq, k, h),
                 vg.reshape(b * n, sq, k, h), scale=scale)
        return o.reshape(b, n, sq, h)
    return run_mha


def capture(rt: Any, kern: Any, s: dict) -> Any:
    """Warm up eagerly on set ``s`` (compile, host validation, scratch) and capture a replay."""
    views, outs = views_of(s)
    kern.execute(views, outs)
    rt.synchronize()
    with rt.capture() as graph:
        kern.execute(views, outs)
    return graph


#: Decode rows also run as they do inside a model's captured decode step: this many calls in
#: one graph (alternating the two input sets), so the graph's launch is spread over them.
STEP_CALLS = 8


def views_of(s: dict) -> tuple[list, list]:
    """``execute``'s input views and output for one input set."""
    return ([TensorView.from_array(s[x]) for x in ("q", "kk", "vv", "pk", "pv", "idx")],
            [attnrt.TensorMut.from_array(s["y"])])


def in_one_graph(ctx: BenchContext, kern: Any, sets: list[dict],
                 peers: dict[str, list] | None) -> dict[str, Any]:
    """Milliseconds per call of STEP_CALLS calls captured in one graph (sets alternating),
    for ours and for each torch peer (name -> its callables, one per set: a torch CUDA graph
    of the same calls each; ``peers`` None: ours only). Returns ``ms``, ``calls``, ``state``
    and per peer name ``peer_ms`` and ``peer_state`` (dicts)."""
    rt = ctx.rt
    reps = max(1, STEP_CALLS // len(sets))
    calls = reps * len(sets)
    io = [views_of(s) for s in sets]
    for ins, outs in io:  # warm: host validation, scratch
        kern.execute(ins, outs)
    rt.synchronize()
    with rt.capture() as graph:
        for _ in range(reps):
            for ins, outs in io:
                kern.execute(ins, outs)
    try:
        ms = ctx.time_ours(graph.replay) / calls
        state = ctx.sustained_state(graph.replay)
        rt.latch.check()  # every replay, timed or sustained
    finally:
        graph.destroy()
    peer_ms: dict[str, float] = {}
    peer_state: dict[str, Any] = {}
    for name, fns in (peers or {}).items():
        pstates: list = []
        peer_ms[name] = ctx.time_torch_graph(fns, reps, warmup=2, reps=10, states=pstates)
        peer_state[name] = pstates[0] if pstates else None
    return dict(ms=ms, calls=calls, state=state, peer_ms=peer_ms, peer_state=peer_state)


def gathered_bytes(c: dict[str, Any], k: int = TOPK, h: int = HEAD) -> int:
    """K and V bytes read once per (batch, query, kv head, selected key)."""
    return c["b"] * c["sq"] * c["nkv"] * k * h * 2 * 2


def node_for(c: dict[str, Any]) -> Node:
    return Node("IndexShare", "pkg.nxrt", {"num_heads": c["n"], "kv_num_heads": c["nkv"]},
                ["q", "k", "v", "pk", "pv", "idx"], ["y"])


def _one(ctx: BenchContext, c: dict[str, Any]) -> list[dict]:
    torch, rt = ctx.torch, ctx.rt
    sets = [make_inputs(torch, c, 1234 + i) for i in range(2)]
    torch.cuda.synchronize()
    kern = index_share.IndexShareFactory(rt).create(node_for(c))
    graphs = [capture(rt, kern, s) for s in sets]

    def ours() -> None:
        for gr in graphs:
            gr.replay()

    ms = ctx.time_ours(ours) / len(graphs)
    state = ctx.sustained_state(ours)
    rt.latch.check()  # every replay, timed or sustained
    rt.synchronize()
    first = sets[0]["y"].clone()
    graphs[0].replay()
    rt.synchronize()
    deterministic = bool(torch.equal(first, sets[0]["y"]))

    peer_sets = {g: [torch_peer(torch, c, s, gather=g) for s in sets] for g, _ in PEERS}
    tms: dict[str, float] = {}
    peer_state: dict[str, Any] = {}
    for g, _ in PEERS:
        peers = peer_sets[g]

        def peer_calls(peers: list = peers) -> None:
            for p in peers:
                p()

        tms[g] = ctx.time_torch(peer_calls, warmup=2, reps=10) / len(peers)
        peer_state[g] = ctx.sustained_state(peer_calls, torch.cuda.synchronize)
    ref = peer_sets[PEERS[0][0]][0]().float()
    peers_equal = bool(torch.equal(ref, peer_sets[PEERS[1][0]][0]().float()))
    if not peers_equal:
        ctx.log(f"index_share {c}: the torch peers disagree (they gather the same rows)")
    rel = float(torch.linalg.vector_norm(ref - first.float()) / torch.linalg.vector_norm(ref))
    gbps = gathered_bytes(c) / ms / 1e6
    ceiling = ctx.ceilings.get("copy_GBps")
    kn = kern.last_plan.knobs
    path = kern.last_plan.path
    # Words joined explicitly: on some device instances spaces vanished from the f-string
    # labels ("H128cache8k", "S2last"); plain " ".join has no f-string spacing to lose.
    if path == "mma":
        words = [f"mma{kn['wm']}x{kn['wn']}", f"st{kn['stages']}", f"S{kn['splits']}{kn['merge']}"]
    elif path == "wg" and kn.get("ws"):
        words = ["ws128", *([f"kt{kn['kt']}"] if kn.get("kt", 128) != 128 else []),
                 *(["q2"] if kn["q2"] else []), f"{kn['ctas']}CTAs",
                 f"S{kn['splits']}{kn['merge']}"]
    elif path == "wg":
        words = [f"wg{kn['wgs']}x{kn['mrows']}", *(["qreg"] if kn["qreg"] else []),
                 *(["overlap"] if kn["overlap"] else []),
                 *([f"{kn['minb']}/SM"] if kn.get("minb", 1) > 1 else []), f"st{kn['stages']}",
                 f"S{kn['splits']}{kn['merge']}"]
    else:
        words = [path, f"S{kn['splits']}", kn["merge"]]
    name = " ".join([f"bf16 {c['kind']} B{c['b']} Sq{c['sq']} N{c['n']} Nkv{c['nkv']} H{HEAD}",
                     f"cache{c['cache'] // 1024}k top{TOPK}", "(" + " ".join(words) + ")"])

    def extra(g: str, **kw: Any) -> dict[str, Any]:
        return dict(ms=round(ms, 4), peer_ms=round(tms[g], 4), deterministic=deterministic,
                    rel_fro_vs_torch=round(rel, 5), peers_bitwise_equal=peers_equal,
                    state=state, peer_state=peer_state[g], **kw)

    first_peer = PEERS[0][0]
    rows = [row("index_share", name, "GB/s", gbps, "copy-bandwidth", ceiling,
                **extra(first_peer, of_ceiling=None if not ceiling else gbps / ceiling))]
    rows += [row("index_share", name, "1/ms", 1.0 / ms, label, 1.0 / tms[g], **extra(g))
             for g, label in PEERS]
    if c["kind"] == "decode":
        one = in_one_graph(ctx, kern, sets, peer_sets)
        gname = f"{name}, {one['calls']} calls in one graph"
        ggbps = gathered_bytes(c) / one["ms"] / 1e6

        def gextra(g: str, **kw: Any) -> dict[str, Any]:
            return dict(ms=round(one["ms"], 4), peer_ms=round(one["peer_ms"][g], 4),
                        peers_bitwise_equal=peers_equal, state=one["state"],
                        peer_state=one["peer_state"][g], **kw)

        rows += [row("index_share", gname, "GB/s", ggbps, "copy-bandwidth", ceiling,
                     **gextra(first_peer, of_ceiling=None if not ceiling else ggbps / ceiling))]
        rows += [row("index_share", gname, "1/ms", 1.0 / one["ms"], f"{label}, same graph",
                     1.0 / one["peer_ms"][g], **gextra(g)) for g, label in PEERS]
    graphs.clear()  # destroys the graphs before the kernel frees its scratch
    kern.close()
    return rows


def describe_state(st: dict | None) -> str:
    """One line of a :meth:`BenchContext.sustained_state` summary."""
    if not st:
        return "not sampled"
    thr = st["throttle"]
    return (f"SM {st['sm_clock_mhz_median']:.0f} MHz (min {st['sm_clock_mhz_min']:.0f}), "
            f"{st['power_w_median']:.0f} W (max {st['power_w_max']:.0f}), "
            f"{st['samples']} readings" + (f", throttled: {' '.join(thr)}" if thr else ""))


def run(ctx: BenchContext) -> list[dict]:
    """Per case (and for decode, again for 8 calls in one graph): one GB/s row (vs the copy
    ceiling) and one speed row per torch peer (``PEERS``)."""
    if ctx.torch is None:
        ctx.log("index_share: torch with CUDA is needed for the inputs and the peer; skipped")
        return []
    rows: list[dict] = []
    for c in cases(ctx.quick):
        try:
            got = _one(ctx, c)
        except Exception as exc:  # one case must not hide the others
            ctx.log(f"index_share {c}: FAILED {type(exc).__name__}: {exc}")
            got = [row("index_share", str(c), "error", 0, type(exc).__name__, None, error=str(exc))]
        rows += got
        for r in got:
            ctx.log(f"{r['case']}: {r['metric']} ours {r['ours']} peer {r['peer_value']} "
                    f"ratio {r['ratio']}")
        for r in got:
            if r["metric"] == "1/ms" and (r.get("state") or r.get("peer_state")):
                ctx.log(f"{r['case']}: sustained ours {describe_state(r.get('state'))}; "
                        f"{r['peer']} {describe_state(r.get('peer_state'))}")
        ctx.torch.cuda.empty_cache()
    return rows
