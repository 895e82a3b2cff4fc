"""IndexShare decode at batches other than 64: ``python tools/bench.py index_share_batch``.

The issue's decode rows are B 64 (``bench_index_share``). A model served at batch 1-32 runs
the same call with fewer rows, where the cost is no longer the gathered bytes (1 MB per row
at top-k 2048) but how many SMs share a row's keys and how their partials are merged
(docs/notes/index_share-history.md, round 20); past 66 rows (one wave of two-CTA clusters on 132 SMs) the
persistent build takes several items per CTA, where a split item's partials cost about as
much as its gathers (round 21). Rows: decode, top-k 2048, H 128, bf16, one kv head, cache
8k, N in {64, 128}, B in {1, 2, 4, 8, 16, 32, 96, 160, 264} (``--quick``: N 64, B 1 and 8).
Per row, timed as ``bench_index_share`` times its decode rows (graph replays alternating two
input sets):

- ours, the planner's default, one call per graph, against the torch gather + SDPA peer
  (``index_select``, ``bench_index_share.PEERS``; before commit ``b889e86`` advanced indexing);
- the same call against pinned plans in the same process: the two-CTA cluster split of the
  B 64 rows (``splits=2, merge="cluster"``; where its clusters fit in one wave) and the plan
  the planner took before round 20 (:func:`previous_plan`, which past 66 rows is also the
  plan before round 21): the ratio is the pinned plan's time over the default's;
- ours, 8 calls in one graph, against the peer's 8 calls in one torch graph.

No sustained-state sampling here: these are latency rows, far from the board's power cap.
"""

from __future__ import annotations

from typing import Any

import bench_index_share as bis
from bench import BenchContext, row

from attnrt.ops import index_share
from attnrt.ops.index_share import splitk

BATCHES = (1, 2, 4, 8, 16, 32, 96, 160, 264)

#: The two-CTA cluster split (the B 64 decode plan), pinned.
CLUSTER = {"path": "wg", "ws": 1, "splits": 2, "merge": "cluster"}


def previous_plan(n: int, b: int, sm_count: int) -> dict[str, Any]:
    """The plan the planner chose for these rows before round 20 (commit 06b8f04): 64 heads,
    the barrier-coupled wgmma build (its wave-model splits, the last-arrival merge); 128
    heads, the warp-specialised build with the wave model's splits (at most 8) and the
    last-arrival merge. (B 64 took the two-CTA cluster then as now.) Past 66 rows round 20
    changed nothing: this is also the plan of ``bed7756``, before round 21."""
    if n == 64:
        return {"path": "wg", "ws": 0}
    splits = min(splitk._choose_splits(b, bis.TOPK, 128, 2048, sm_count),
                 index_share.WS_MAX_SPLITS)
    return {"path": "wg", "ws": 1, "splits": splits, "merge": "last"}


def cases(quick: bool) -> list[dict[str, Any]]:
    ns, bs = ((64,), (1, 8)) if quick else ((64, 128), BATCHES)
    return [dict(kind="decode", b=b, sq=1, n=n, nkv=1, cache=8192) for n in ns for b in bs]


def _kernel(rt: Any, c: dict[str, Any], knobs: dict[str, Any] | None) -> Any:
    cfg = index_share.IndexShareConfig(**(knobs or {}))  # (a knob set's "path" is a field)
    return index_share.IndexShareFactory(rt, cfg).create(bis.node_for(c))


def _plan_words(kern: Any) -> str:
    p = kern.last_plan
    kind = ("ws" if p.knobs.get("ws") else "wg") if p.path == "wg" else p.path
    return f"{kind} S{p.splits} {p.merge} {p.grid}CTAs"


def _time(ctx: BenchContext, c: dict[str, Any], sets: list[dict],
          knobs: dict[str, Any] | None) -> tuple[float, str, Any]:
    """(ms per call, one call per graph; plan words; y of set 0) of one plan."""
    rt = ctx.rt
    kern = _kernel(rt, c, knobs)
    graphs = [bis.capture(rt, kern, s) for s in sets]
    try:
        ms = ctx.time_ours(lambda: [g.replay() for g in graphs]) / len(graphs)
        rt.latch.check()
        rt.synchronize()
        return ms, _plan_words(kern), sets[0]["y"].clone()
    finally:
        graphs.clear()
        kern.close()


def _one(ctx: BenchContext, c: dict[str, Any]) -> list[dict]:
    torch, rt = ctx.torch, ctx.rt
    sm = rt.capabilities.sm_count
    sets = [bis.make_inputs(torch, c, 1234 + i) for i in range(2)]
    torch.cuda.synchronize()
    gather, peer_label = bis.PEERS[0]  # the faster torch gather
    peers = [bis.torch_peer(torch, c, s, gather=gather) for s in sets]
    tms = ctx.time_torch(lambda: [p() for p in peers], warmup=2, reps=10) / len(peers)
    ref = peers[0]().float()

    ms, words, y = _time(ctx, c, sets, None)
    rel = float(torch.linalg.vector_norm(ref - y.float()) / torch.linalg.vector_norm(ref))
    name = (f"bf16 decode B{c['b']} Sq1 N{c['n']} Nkv1 H{bis.HEAD} cache{c['cache'] // 1024}k "
            f"top{bis.TOPK} ({words})")
    rows = [row("index_share_batch", name, "1/ms", 1.0 / ms, peer_label, 1.0 / tms,
                ms=round(ms, 4), peer_ms=round(tms, 4), rel_fro_vs_torch=round(rel, 5))]
    pinned = [("pinned previous plan", previous_plan(c["n"], c["b"], sm))]
    if 2 * c["b"] <= sm:  # (the two-CTA clusters in one wave: one item per CTA)
        pinned.insert(0, ("pinned two-CTA cluster", CLUSTER))
    for label, knobs in pinned:
        pms, pwords, _ = _time(ctx, c, sets, knobs)
        rows.append(row("index_share_batch", name, "1/ms", 1.0 / ms, f"{label} ({pwords})",
                        1.0 / pms, ms=round(ms, 4), peer_ms=round(pms, 4)))
    kern = _kernel(rt, c, None)
    try:
        g = bis.in_one_graph(ctx, kern, sets, {gather: peers})
    finally:
        kern.close()
    rows.append(row("index_share_batch", f"{name}, {g['calls']} calls in one graph", "1/ms",
                    1.0 / g["ms"], f"{peer_label}, same graph", 1.0 / g["peer_ms"][gather],
                    ms=round(g["ms"], 4), peer_ms=round(g["peer_ms"][gather], 4)))
    return rows


def run(ctx: BenchContext) -> list[dict]:
    """Three or four rows per case (see the module docstring)."""
    if ctx.torch is None:
        ctx.log("index_share_batch: torch with CUDA is needed for the inputs and the peer; "
                "skipped")
        return []
    rows: list[dict] = []
    state_ms, ctx.state_ms = ctx.state_ms, 0.0  # latency rows: no sustained-state sampling
    try:
        for c in cases(ctx.quick):
            try:
                got = _one(ctx, c)
            except Exception as exc:  # one case must not hide the others
                ctx.log(f"index_share_batch {c}: FAILED {type(exc).__name__}: {exc}")
                got = [row("index_share_batch", str(c), "error", 0, type(exc).__name__, None,
                           error=str(exc))]
            rows += got
            for r in got:
                ctx.log(f"{r['case']}: vs {r['peer']}: ours {r.get('ms')} ms, peer "
                        f"{r.get('peer_ms')} ms, ratio {r['ratio']}")
            ctx.torch.cuda.empty_cache()
    finally:
        ctx.state_ms = state_ms
    return rows
