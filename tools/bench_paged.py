"""PagedAttention (LATENT / MLA) decode against FlashMLA: ``tools/bench.py paged``.

Rows (bf16, block 64, latent 576 / value 512, scale 1/sqrt(192)): decode with one new token
per sequence over H {16, 32, 64, 128} x B {1, 8, 32, 128} x L {4k, 8k, 32k} cached keys
(L counts the new token); ragged batches (per-sequence lengths drawn from [L/8, 2L], seeded);
speculative decode (2 and 4 new tokens per sequence, causal among them); two prefill rows
(ours only). ``--quick``: H {16, 128} x B {1, 32} x L 8k and a few ragged / speculative rows.

FlashMLA (``tools/_flashmla_peer.py``) runs in the same process on the same tensors: the
same latent cache (one pool, allocated once for the largest row and reused), block tables
and query. Ours is timed twice: with the write phase (real slots) and read-only (slot -1);
the targets are judged on read-only. Every row is timed as one call per graph replay and as
8 calls in one graph, each the median of 3 interleaved measurements (ours write, ours
read-only, FlashMLA, in turn) of ~20 replays. Where one call's KV would stay in L2, up to
16 input sets (block tables into disjoint pages of the pool) are replayed in turn.

GB/s = KV bytes read once (sum of lengths * 576 * 2) / time; TFLOP/s = 2 * H * (576 + 512)
* visible (query, key) pairs / time (decode: B * L pairs per head). Ceilings measured in the
same run: a torch device-to-device copy (read + write bytes / time) and a bf16 8192^3 torch
GEMM. Targets (docs/notes/paged_attention-bench.md): >= 1.0x FlashMLA on every decode row;
>= 90 % of the copy at H <= 32, B >= 32, one token; >= 560 TFLOP/s at H 128, B >= 32.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
from _flashmla_peer import FlashMLA
from _flashmla_peer import load as load_peer
from _paged_grid import (
    AGREE_TOL,
    BS,
    HS,
    MEASURE_MS,
    REF_PAIRS,
    REPLAYS,
    ROUNDS,
    SCALE,
    STEP_CALLS,
    VHS,
    Shape,
    block_tables,
    compact_table,
    grid,
    make_row,
    markdown_section,
    pool_blocks,
    rel_frobenius,
    sets_for,
    slot_mapping,
)
from bench import BenchContext, row

from attnrt.ops import reference
from attnrt.ops.paged_attention import PagedAttentionConfig, PagedAttentionFactory
from attnrt.runtime.api import Node, TensorMut, TensorView, WorkspaceView

__all__ = ["run", "markdown_section"]


def _op_path() -> str:
    """Our op's read path (the factory's ``path``): ``$ATTNRT_BENCH_PAGED_PATH``, default auto."""
    return os.environ.get("ATTNRT_BENCH_PAGED_PATH", "auto")


def _op_config() -> PagedAttentionConfig:
    """Our op's config: :func:`_op_path`; ``$ATTNRT_BENCH_PAGED_PDL=0`` turns programmatic
    dependent launch off, ``$ATTNRT_BENCH_PAGED_BALANCED=1`` / ``0`` turns balanced split-KV
    on / off (unset: the op's default),
    ``$ATTNRT_BENCH_PAGED_MAX_SPLITS`` sets ``max_splits``, ``$ATTNRT_BENCH_PAGED_WG`` the
    wgmma schedule (``serial`` or ``pair``)."""
    env = os.environ.get
    return PagedAttentionConfig(
        path=_op_path(), programmatic=env("ATTNRT_BENCH_PAGED_PDL", "1") != "0",
        balanced={"1": True, "0": False}.get(env("ATTNRT_BENCH_PAGED_BALANCED", "")),
        max_splits=int(env("ATTNRT_BENCH_PAGED_MAX_SPLITS", "64")),
        wg_schedule=env("ATTNRT_BENCH_PAGED_WG", PagedAttentionConfig.wg_schedule))


def _ceilings(ctx: BenchContext) -> tuple[float, float]:
    """Copy (read + write bytes / time, 1 GiB buffers) and bf16 8192^3 GEMM, through torch."""
    torch, n, m = ctx.torch, 1 << 30, 8192
    src = torch.full((n,), 0x3C, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = round(2 * n / ctx.time_torch(lambda: dst.copy_(src), warmup=2, reps=10) / 1e6, 1)
    g = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(m, m, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    c = torch.empty_like(a)
    gemm = round(2 * m**3 / ctx.time_torch(lambda: torch.matmul(a, b, out=c), warmup=3, reps=10)
                 / 1e9, 1)
    ctx.ceilings.update(paged_copy_GBps=copy, paged_gemm_TFLOPs=gemm)
    ctx.log(f"paged ceilings: copy {copy} GB/s, GEMM {gemm} TFLOP/s")
    return copy, gemm


class _Timed:
    """Graphs replayed in turn on one stream: ``calls`` op calls per pass over them."""

    def __init__(self, graphs: list, per_graph: int, stream: Any) -> None:
        self.graphs, self.calls, self.stream = graphs, per_graph * len(graphs), stream

    def run(self) -> None:
        for g in self.graphs:
            g.replay()


def _measure(torch: Any, t: _Timed, passes: int) -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(t.stream)
    for _ in range(passes):
        t.run()
    b.record(t.stream)
    b.synchronize()
    return a.elapsed_time(b) / (passes * t.calls)


def _time_all(ctx: BenchContext, timed: dict[Any, _Timed]) -> dict[Any, float]:
    """Milliseconds per call: median of ROUNDS measurements, the implementations interleaved."""
    torch = ctx.torch
    for t in timed.values():  # the first replay uploads the graph
        t.run()
    torch.cuda.synchronize()
    pass_ms = {k: _measure(torch, t, 1) * t.calls for k, t in timed.items()}
    ctx.keep_busy(lambda: [t.run() for t in timed.values()], torch.cuda.synchronize)
    passes = {k: max(1, min(math.ceil(REPLAYS / len(t.graphs)), int(MEASURE_MS / max(pass_ms[k], 1e-6))))
              for k, t in timed.items()}
    samples: dict[Any, list[float]] = {k: [] for k in timed}
    for _ in range(ROUNDS):
        for k, t in timed.items():
            samples[k].append(_measure(torch, t, passes[k]))
    return {k: float(np.median(v)) for k, v in samples.items()}


def _np(torch: Any, t: Any, bf16: bool = False) -> np.ndarray:
    if not bf16:
        return t.float().cpu().numpy()
    import ml_dtypes

    return t.contiguous().view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)


class _Rig:
    """One row's inputs on the device (input sets over the shared pool), our kernel, the peer."""

    def __init__(self, ctx: BenchContext, s: Shape, pool: Any, peer_mod: Any) -> None:
        torch, rt = ctx.torch, ctx.rt
        self.ctx, self.s, self.pool, self.graphs = ctx, s, pool, []
        self.lengths = lengths = s.lengths()
        T = s.B * s.q
        self.n = sets_for(s, rt.capabilities.l2_bytes)
        self.tables, used = block_tables(lengths, self.n, seed=7919 * s.B + s.L + s.q)
        if used > pool.shape[0]:
            raise RuntimeError(f"{s.case}: needs {used} cache blocks, the pool has {pool.shape[0]}")
        g = torch.Generator(device="cuda").manual_seed(31 * s.H + 7 * s.B + s.L + s.q)
        bf = torch.bfloat16

        def dev(a: np.ndarray) -> Any:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to("cuda")

        self.key = torch.randn(T, HS, generator=g, device="cuda", dtype=bf)
        self.cu, self.past = np.arange(s.B + 1) * s.q, lengths - s.q
        self.seqlens = dev(lengths)
        ro = dev(np.full(T, -1))
        self.sets = [dict(q=torch.randn(T, s.H * HS, generator=g, device="cuda", dtype=bf),
                          bt=dev(bt), slot=dev(slot_mapping(bt, lengths, s.q)),
                          out=torch.empty(T, s.H * VHS, device="cuda", dtype=bf)) for bt in self.tables]
        self.node = Node("PagedAttention", "com.microsoft",
                         {"kv_cache_layout": "LATENT", "num_heads": s.H, "kv_num_heads": 1,
                          "v_head_size": VHS, "scale": SCALE},
                         ["q", "k", None, "kc", None, "cu", "past", "bt", None, None, "slot"], ["out"])
        config = _op_config()
        self.kernel = PagedAttentionFactory(rt, config=config).create(self.node, [])
        fixed = {1: TensorView.from_array(self.key), 3: TensorView.from_array(pool),
                 5: TensorView.from_array(dev(self.cu)), 6: TensorView.from_array(dev(self.past))}

        def io(st: dict, slot: Any) -> tuple[list, list]:
            v = {**fixed, 0: TensorView.from_array(st["q"]), 7: TensorView.from_array(st["bt"]),
                 10: TensorView.from_array(slot)}
            return ([v.get(i, TensorView.absent_slot()) for i in range(16)],
                    [TensorMut.from_array(st["out"])])

        self.io = {"ours_w": [io(st, st["slot"]) for st in self.sets],
                   "ours_ro": [io(st, ro) for st in self.sets]}
        req = self.kernel.workspace_requirement(self.io["ours_ro"][0][0])
        self._ws = torch.empty(max(req.nbytes, 1), dtype=torch.uint8, device="cuda")
        self.ws = WorkspaceView(self._ws.data_ptr(), req.nbytes) if req.nbytes else None
        self.peer = None if peer_mod is None or s.kind == "prefill" else \
            FlashMLA(peer_mod, self.seqlens, s.B, s.q, s.H, SCALE)
        torch.cuda.synchronize()  # everything above ran on torch's stream; ours runs on rt's

    def ours(self, which: str, i: int = 0) -> None:
        self.kernel.execute(*self.io[which][i], self.ws)

    def ours_graphs(self, which: str, k: int) -> list:
        """ceil(sets / k) graphs of k calls each, the sets in turn."""
        out = []
        for j in range(-(-self.n // k)):
            with self.ctx.rt.capture() as g:
                self.graphs.append(g)
                for i in range(k):
                    self.ours(which, (j * k + i) % self.n)
            out.append(g)
        return out

    def peer_graphs(self, k: int) -> list:
        sets = self.sets
        return [self.peer.capture(self.ctx.torch, [(sets[(j * k + i) % self.n]["q"], self.pool,
                                                    sets[(j * k + i) % self.n]["bt"]) for i in range(k)])
                for j in range(-(-self.n // k))]

    def check(self) -> dict[str, Any]:
        """Set 0, eagerly: ours with the write vs read-only (bitwise), ours vs FlashMLA (rel F),
        and both vs the float64 reference where that is cheap."""
        torch, rt, s = self.ctx.torch, self.ctx.rt, self.s
        rt.synchronize()
        torch.cuda.synchronize()
        self.ours("ours_w")
        rt.synchronize()
        w = self.sets[0]["out"].clone()
        torch.cuda.synchronize()
        self.ours("ours_ro")
        rt.synchronize()
        ours = _np(torch, self.sets[0]["out"])
        res: dict[str, Any] = {"write_equals_read": bool(np.array_equal(_np(torch, w), ours))}
        flash = None
        if self.peer is not None:
            flash = _np(torch, self.peer(self.sets[0]["q"], self.pool, self.sets[0]["bt"]))
            res["rel_fro"] = rel = float(f"{rel_frobenius(ours, flash):.3g}")
            res["agree"] = rel <= AGREE_TOL
        if s.B * s.q * s.H * int(self.lengths.max()) <= REF_PAIRS:
            ids, small = compact_table(self.tables[0], self.lengths)
            ins: list[Any] = [None] * 16
            ins[0], ins[1] = _np(torch, self.sets[0]["q"], True), _np(torch, self.key, True)
            ins[3] = _np(torch, self.pool[torch.from_numpy(ids).to("cuda")], True)
            ins[5], ins[6], ins[7] = self.cu.astype(np.int32), self.past.astype(np.int32), small
            ins[10] = np.full(s.B * s.q, -1, dtype=np.int32)
            want = reference.paged_attention(self.node, ins)[0].astype(np.float32)
            res["ref_rel_fro"] = float(f"{rel_frobenius(ours, want):.3g}")
            if flash is not None:
                res["peer_ref_rel_fro"] = float(f"{rel_frobenius(flash, want):.3g}")
        return res

    def free(self) -> None:
        for g in self.graphs:
            g.destroy()
        self.graphs.clear()


def _bench_shape(ctx: BenchContext, s: Shape, pool: Any, peer_mod: Any, stream: Any,
                 copy: float | None, gemm: float | None) -> list[dict]:
    torch, rt = ctx.torch, ctx.rt
    rig = _Rig(ctx, s, pool, peer_mod)
    try:
        for which in ("ours_w", "ours_ro"):  # warm the signature (the first row compiles)
            rig.ours(which)
        rt.synchronize()
        peer_error = None
        if rig.peer is not None:
            try:
                rig.peer(rig.sets[0]["q"], pool, rig.sets[0]["bt"])
                torch.cuda.synchronize()
            except Exception as exc:  # a shape FlashMLA does not take: ours still measured
                peer_error = f"{type(exc).__name__}: {exc}"[:300]
                ctx.log(f"{s.case}: FlashMLA refused it: {peer_error}")
                rig.peer = None
        steps = (1,) if s.kind == "prefill" else (1, STEP_CALLS)
        timed: dict[Any, _Timed] = {}
        for k in steps:
            for which in ("ours_w", "ours_ro"):
                timed[which, k] = _Timed(rig.ours_graphs(which, k), k, stream)
            if rig.peer is not None:
                timed["flashmla", k] = _Timed(rig.peer_graphs(k), k, torch.cuda.current_stream())
        ms = _time_all(ctx, timed)
        rt.latch.check()  # every replay of ours, timed or not
        chk = rig.check()
        plan = rig.kernel.last_plan
        rows = [make_row(s, k, {w: ms.get((w, k)) for w in ("ours_ro", "ours_w", "flashmla")},
                         copy, gemm, input_sets=rig.n, splits=plan.splits, path=plan.path,
                         peer_error=peer_error, **chk) for k in steps]
        for r in rows:
            ctx.log(f"{r['case']}: {r['GBps']:.0f} GB/s {r['TFLOPs']:.1f} TFLOP/s (+write "
                    f"{r['write_GBps']:.0f}), FlashMLA {r['flashmla_GBps']}, ratio {r['ratio']}, "
                    f"rel F {chk.get('rel_fro')}, {r['vs_flashmla']}/{r['vs_copy']}/{r['vs_tflops']}")
        if chk.get("agree") is False:
            ctx.log(f"{s.case}: ours and FlashMLA DISAGREE: rel F {chk['rel_fro']} > {AGREE_TOL}")
        return rows
    finally:
        rig.free()


def run(ctx: BenchContext) -> list[dict]:
    """The rows of :func:`grid` (``ctx.quick``: the subset), ours and FlashMLA interleaved."""
    torch = ctx.torch
    if torch is None:
        ctx.log("paged: torch with CUDA is needed for the inputs and the peer; skipped")
        return []
    shapes = grid(ctx.quick)
    copy, gemm = _ceilings(ctx)
    peer = load_peer(ctx.log, tuple(ctx.rt.capabilities.compute_capability))
    nb = pool_blocks(shapes, ctx.rt.capabilities.l2_bytes)
    g = torch.Generator(device="cuda").manual_seed(0)
    pool = torch.empty(nb, BS, 1, HS, device="cuda", dtype=torch.bfloat16).normal_(generator=g)
    ctx.log(f"paged: latent cache pool {nb} blocks ({nb * BS * HS * 2 / 1e9:.2f} GB), "
            f"{len(shapes)} shapes, {_op_config()}")
    stream = torch.cuda.ExternalStream(ctx.rt.stream.ptr)  # ours runs there; events too
    rows: list[dict] = []
    for s in shapes:
        try:
            rows += _bench_shape(ctx, s, pool, peer, stream, copy, gemm)
        except Exception as exc:  # one row's failure must not hide the others
            ctx.log(f"{s.case}: FAILED: {type(exc).__name__}: {exc}")
            rows.append(row("paged", s.case, "error", 0, type(exc).__name__, None,
                            error=str(exc)[:300]))
        finally:
            torch.cuda.empty_cache()
    del pool
    torch.cuda.empty_cache()
    return rows
