#!/usr/bin/env python3
"""Sweep IndexShare plans on the GPU: ``python lab/sweep_index_share.py [--quick] [--out DIR]``.

For every benchmark shape of ``tools/bench_index_share.py`` (the issue's rows: top-k 2048,
H 128, bf16, N 64/128, decode B 64 / prefill Sq 4096, caches 8k/64k) and every plan
variant listed in ``VARIANTS`` (tensor-core warp layout, ring depth, splits, split merge):

1. check: the variant's knobs on one small shape of the same kind (odd sizes, a padded
   row) against the float64 reference (rel. Frobenius <= 1e-2), two eager runs bitwise
   equal, and a captured replay (device-side validation) equal to eager with a clean latch;
2. time: graph replays of ``execute`` on two input sets in turn (so L2 never holds the
   previous step's rows), CUDA events, median of ``--reps`` (>= 20) pairs; GB/s counts the
   gathered K/V bytes once per (batch, query, selected key) as the benchmark does;
3. the copy ceiling (``rt.dtod`` of 2 GiB, read + write bytes), the replay time of a graph
   holding one empty kernel (the launch floor), and the torch gather + SDPA peer per shape
   (advanced indexing, the bench's peer before ``b889e86``: the sweep keeps it, so its
   tables compare with the earlier ones).

Each phase runs in a worker process, so a variant that faults the context is reported
FAILED and the sweep goes on with the next one. The table is printed last; ``--out DIR``
also writes ``sweep_index_share.json`` (every number, plans included).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
# The compile cache must be shared by the workers (and platformdirs may be missing).
os.environ.setdefault("ATTNRT_CACHE_DIR", str(Path(tempfile.gettempdir()) / "nxrt-sweep-cache"))

COPY_BYTES = 2 << 30
TOL_BF16 = 1e-2

# Plan variants: name -> knobs (None = the planner's default). "old" approximates the
# previous kernel's plan (4 warps, double buffer, splits from the old rule, is_combine).
# "p1"/"p2" pin the tensor-core per-tile pipeline (IS_PIPE): p1 the first one, p2 the lean
# issue/score path (bitwise the same results); decode rows first, they are the target.
# Entries without "pipe" take the planner's default pipeline (_DEFAULT_PIPE). "ws" entries
# are the warp-specialised persistent build (cuda/index_share_ws.cu); its two-split decode
# plans merge in two-CTA clusters by default ("-last": the last-arrival merge instead).
VARIANTS: dict[tuple[str, int], list[tuple[str, dict | None]]] = {
    ("decode", 64): [
        ("default", None),
        ("ws-S2", {"path": "wg", "ws": 1, "splits": 2}),
        ("ws-S2-last", {"path": "wg", "ws": 1, "splits": 2, "merge": "last"}),
        ("ws-S3", {"path": "wg", "ws": 1, "splits": 3}),
        ("ws-S4", {"path": "wg", "ws": 1, "splits": 4}),
        ("wg:2x64-S2", {"path": "wg", "wgs": 2, "mrows": 64, "splits": 2}),
        ("wg:2x64-S4", {"path": "wg", "wgs": 2, "mrows": 64, "splits": 4}),
        ("wg:2x64-st2-S4", {"path": "wg", "wgs": 2, "mrows": 64, "stages": 2, "splits": 4}),
        ("wg:2x64-S8", {"path": "wg", "wgs": 2, "mrows": 64, "splits": 8}),
        ("wg:1x64-S2", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 2}),
        ("wg:1x64-S4", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 4}),
        ("wg:1x64-S8", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 8}),
        ("wg:1x64-st5-S4", {"path": "wg", "wgs": 1, "mrows": 64, "stages": 5, "splits": 4}),
        ("wg:1x64-st5-S2", {"path": "wg", "wgs": 1, "mrows": 64, "stages": 5, "splits": 2}),
        ("wg:1x64-st6-S2", {"path": "wg", "wgs": 1, "mrows": 64, "stages": 6, "splits": 2}),
        ("wg:1x64-st4-S2", {"path": "wg", "wgs": 1, "mrows": 64, "stages": 4, "splits": 2}),
        ("wg:2x64-st2-S2", {"path": "wg", "wgs": 2, "mrows": 64, "stages": 2, "splits": 2}),
        ("wgo:2x64-S2", {"path": "wg", "wgs": 2, "mrows": 64, "splits": 2, "overlap": 1}),
        ("wgq:1x64-S4", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 4, "qreg": 1}),
        ("wgq:1x64-S2", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 2, "qreg": 1}),
        ("wgqo:1x64-S4", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 4, "qreg": 1,
                          "overlap": 1}),
        ("wgo:1x64-st5-S2", {"path": "wg", "wgs": 1, "mrows": 64, "stages": 5, "splits": 2,
                             "overlap": 1}),
        ("wgo:1x64-st3-S4", {"path": "wg", "wgs": 1, "mrows": 64, "stages": 3, "splits": 4,
                             "overlap": 1}),
        ("p1:4x2-st5-S2", {"wm": 4, "wn": 2, "stages": 5, "splits": 2, "pipe": 1}),
        ("p2:4x2-st5-S2", {"wm": 4, "wn": 2, "stages": 5, "splits": 2, "pipe": 2}),
        ("p2:4x2-st3-S2", {"wm": 4, "wn": 2, "stages": 3, "splits": 2, "pipe": 2}),
        ("p2:4x2-st5-S1", {"wm": 4, "wn": 2, "stages": 5, "splits": 1, "pipe": 2}),
        ("p2:4x2-st5-S3", {"wm": 4, "wn": 2, "stages": 5, "splits": 3, "pipe": 2}),
        ("p2:4x1-st2-S4", {"wm": 4, "wn": 1, "stages": 2, "splits": 4, "pipe": 2}),
        ("p1:4x1-st2-S4", {"wm": 4, "wn": 1, "stages": 2, "splits": 4, "pipe": 1}),
        ("old:4x1-st2-S5-kernel", {"wm": 4, "wn": 1, "stages": 2, "splits": 5, "merge": "kernel",
                                   "pipe": 1}),
        ("4x2-st4-S2", {"wm": 4, "wn": 2, "stages": 4, "splits": 2}),
        ("4x2-st5-S2-kernel", {"wm": 4, "wn": 2, "stages": 5, "splits": 2, "merge": "kernel"}),
        ("4x2-st5-S4", {"wm": 4, "wn": 2, "stages": 5, "splits": 4}),
    ],
    ("decode", 128): [
        ("default", None),
        ("ws-S2", {"path": "wg", "ws": 1, "splits": 2}),
        ("ws-S2-last", {"path": "wg", "ws": 1, "splits": 2, "merge": "last"}),
        ("ws-S3", {"path": "wg", "ws": 1, "splits": 3}),
        ("ws-S4", {"path": "wg", "ws": 1, "splits": 4}),
        ("wg:2x128-S2", {"path": "wg", "wgs": 2, "mrows": 128, "splits": 2}),
        ("wg:2x128-S4", {"path": "wg", "wgs": 2, "mrows": 128, "splits": 4}),
        ("wg:2x128-st3-S4", {"path": "wg", "wgs": 2, "mrows": 128, "stages": 3, "splits": 4}),
        ("wg:2x128-S8", {"path": "wg", "wgs": 2, "mrows": 128, "splits": 8}),
        ("wg:1x64-S4", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 4}),
        ("wg:2x64-S4", {"path": "wg", "wgs": 2, "mrows": 64, "splits": 4}),
        ("wgo:2x128-S2", {"path": "wg", "wgs": 2, "mrows": 128, "splits": 2, "overlap": 1}),
        ("wgo:2x128-S3", {"path": "wg", "wgs": 2, "mrows": 128, "splits": 3, "overlap": 1}),
        ("wgq:1x64-S4", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 4, "qreg": 1}),
        ("p1:8x1-st5-S2", {"wm": 8, "wn": 1, "stages": 5, "splits": 2, "pipe": 1}),
        ("p2:8x1-st5-S2", {"wm": 8, "wn": 1, "stages": 5, "splits": 2, "pipe": 2}),
        ("p2:8x1-st3-S2", {"wm": 8, "wn": 1, "stages": 3, "splits": 2, "pipe": 2}),
        ("p2:8x1-st5-S1", {"wm": 8, "wn": 1, "stages": 5, "splits": 1, "pipe": 2}),
        ("p2:4x2-st5-S1", {"wm": 4, "wn": 2, "stages": 5, "splits": 1, "pipe": 2}),
        ("p2:4x1-st2-S2", {"wm": 4, "wn": 1, "stages": 2, "splits": 2, "pipe": 2}),
        ("old:4x1-st2-S3-kernel", {"wm": 4, "wn": 1, "stages": 2, "splits": 3, "merge": "kernel",
                                   "pipe": 1}),
        ("8x1-st4-S2", {"wm": 8, "wn": 1, "stages": 4, "splits": 2}),
        ("8x1-st5-S3", {"wm": 8, "wn": 1, "stages": 5, "splits": 3}),
    ],
    ("prefill", 64): [
        ("default", None),
        ("ws", {"path": "wg", "ws": 1, "splits": 1}),
        ("ws-q1", {"path": "wg", "ws": 1, "splits": 1, "q2": 0}),
        ("wgqo:1x64-2/SM", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 1, "qreg": 1,
                            "overlap": 1, "minb": 1}),
        ("wgq:1x64-st2-3/SM", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 1, "qreg": 1,
                               "stages": 2, "minb": 3}),
        ("wg:2x64", {"path": "wg", "wgs": 2, "mrows": 64, "splits": 1}),
        ("wg:2x64-st2", {"path": "wg", "wgs": 2, "mrows": 64, "stages": 2, "splits": 1}),
        ("wg:1x64", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 1}),
        ("wg:1x64-st4-1cta", {"path": "wg", "wgs": 1, "mrows": 64, "stages": 4, "splits": 1}),
        ("wgo:1x64-st3", {"path": "wg", "wgs": 1, "mrows": 64, "stages": 3, "splits": 1,
                          "overlap": 1}),
        ("wgo:2x64", {"path": "wg", "wgs": 2, "mrows": 64, "splits": 1, "overlap": 1}),
        ("wgq:1x64", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 1, "qreg": 1}),
        ("wgq:1x64-st2", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 1, "qreg": 1,
                          "stages": 2}),
        ("wgqo:1x64", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 1, "qreg": 1,
                       "overlap": 1}),
        ("p2:4x1-st2", {"wm": 4, "wn": 1, "stages": 2, "splits": 1, "pipe": 2}),
        ("p2:4x2-st3", {"wm": 4, "wn": 2, "stages": 3, "splits": 1, "pipe": 2}),
        ("old:4x1-st2", {"wm": 4, "wn": 1, "stages": 2, "splits": 1, "pipe": 1}),
        ("4x1-st3", {"wm": 4, "wn": 1, "stages": 3, "splits": 1}),
        ("4x2-st3", {"wm": 4, "wn": 2, "stages": 3, "splits": 1}),
        ("4x2-st4", {"wm": 4, "wn": 2, "stages": 4, "splits": 1}),
        ("4x2-st5", {"wm": 4, "wn": 2, "stages": 5, "splits": 1}),
    ],
    ("prefill", 128): [
        ("default", None),
        ("ws", {"path": "wg", "ws": 1, "splits": 1}),
        ("ws-q1", {"path": "wg", "ws": 1, "splits": 1, "q2": 0}),
        ("wgq:1x64-st2-3/SM", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 1, "qreg": 1,
                               "stages": 2, "minb": 3}),
        ("wg:2x128", {"path": "wg", "wgs": 2, "mrows": 128, "splits": 1}),
        ("wg:2x128-st3", {"path": "wg", "wgs": 2, "mrows": 128, "stages": 3, "splits": 1}),
        ("wg:1x64", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 1}),
        ("wg:2x64", {"path": "wg", "wgs": 2, "mrows": 64, "splits": 1}),
        ("wgo:2x128", {"path": "wg", "wgs": 2, "mrows": 128, "splits": 1, "overlap": 1}),
        ("wgo:1x64-st3", {"path": "wg", "wgs": 1, "mrows": 64, "stages": 3, "splits": 1,
                          "overlap": 1}),
        ("wgq:1x64", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 1, "qreg": 1}),
        ("wgqo:1x64", {"path": "wg", "wgs": 1, "mrows": 64, "splits": 1, "qreg": 1,
                       "overlap": 1}),
        ("p1:8x1-st5", {"wm": 8, "wn": 1, "stages": 5, "splits": 1, "pipe": 1}),
        ("p2:8x1-st5", {"wm": 8, "wn": 1, "stages": 5, "splits": 1, "pipe": 2}),
        ("old:4x1-st2", {"wm": 4, "wn": 1, "stages": 2, "splits": 1, "pipe": 1}),
        ("8x1-st3", {"wm": 8, "wn": 1, "stages": 3, "splits": 1}),
        ("8x1-st5", {"wm": 8, "wn": 1, "stages": 5, "splits": 1}),
        ("4x2-st5", {"wm": 4, "wn": 2, "stages": 5, "splits": 1}),
    ],
}


def shape_name(c: dict[str, Any]) -> str:
    return f"{c['kind']}-N{c['n']}-{c['cache'] // 1024}k"


def plan_text(p: dict[str, Any]) -> str:
    if p.get("path") == "wg" and p.get("ws"):
        return (f"ws128{' q2' if p.get('q2') else ''} S{p['splits']} {p['merge']} "
                f"g{p['grid']} {p['smem'] // 1024}K")
    if p.get("path") == "wg":
        per_sm = f" {p['minb']}/SM" if (p.get("minb") or 1) > 1 else ""
        return (f"wg{'q' if p.get('qreg') else ''}{'o' if p.get('overlap') else ''} "
                f"{p['wgs']}x{p['mrows']}{per_sm} st{p['stages']} "
                f"S{p['splits']} {p['merge']} "
                f"g{p['grid']} {p['smem'] // 1024}K")
    if p.get("path") != "mma":
        return f"{p.get('path')} S{p.get('splits')} {p.get('merge')}"
    return (f"p{p.get('pipe', 1)} {p['wm']}x{p['wn']} st{p['stages']} S{p['splits']} "
            f"{p['merge']} g{p['grid']} {p['smem'] // 1024}K")


def config_for(knobs: dict | None) -> Any:
    """A variant's ``IndexShareConfig`` (its knobs, "path" included, are the config's fields)."""
    from attnrt.ops.index_share import IndexShareConfig

    rest = dict(knobs or {})
    if rest.get("path") is None and any(k in rest for k in ("wm", "wn", "pipe")):
        rest["path"] = "mma"  # mma.sync layout knobs: the wgmma default would ignore them
    return IndexShareConfig(**rest)


# ---------------------------------------------------------------------------------------
# worker side (imports the GPU stack)
# ---------------------------------------------------------------------------------------

class Worker:
    def __init__(self, reps: int) -> None:
        from bench import BenchContext

        import attnrt

        self.nxrt = attnrt
        self.rt = attnrt.CudaRuntime(0)
        self.ctx = BenchContext(self.rt)
        self.torch = self.ctx.torch
        self.reps = reps
        self.inputs: dict[str, Any] = {}
        self.peer_out: dict[str, Any] = {}
        self.refs: dict[tuple, Any] = {}

    def plan_dict(self, kern: Any) -> dict[str, Any]:
        p = kern.last_plan
        return dict(p.knobs, path=p.path, grid=p.grid, smem=p.smem, threads=p.threads,
                    cps=p.cps)

    # -- tasks ----------------------------------------------------------------------------
    def ceiling(self) -> dict[str, Any]:
        import numpy as np

        from attnrt.ops import _common
        from attnrt.ops.index_share import builds
        from attnrt.runtime.api import DataType

        rt = self.rt
        src, dst = rt.alloc_raw(COPY_BYTES), rt.alloc_raw(COPY_BYTES)
        try:
            rt.memset(src, 0x3C, COPY_BYTES)
            ms = self.ctx.time_ours(lambda: rt.dtod(dst, src, COPY_BYTES), warmup=2, reps=10)
        finally:
            rt.free_raw(src)
            rt.free_raw(dst)
        fn = _common.get_function(rt, builds._aux_variant(DataType.BFLOAT16), "is_combine")
        args = [0, 0, 0, np.int64(0), np.int32(1), np.int32(128), np.int32(1), np.int32(1)]
        rt.launch(fn, 1, 256, args)
        rt.synchronize()
        with rt.capture() as graph:
            rt.launch(fn, 1, 256, args)
        floor = self.ctx.time_ours(graph.replay, warmup=5, reps=50)
        del graph
        return dict(copy_GBps=2 * COPY_BYTES / ms / 1e6, graph_floor_us=floor * 1e3,
                    gpu=rt.capabilities.name, sm_count=rt.capabilities.sm_count)

    def check(self, kind: str, n: int, knobs: dict | None) -> dict[str, Any]:
        import numpy as np

        from attnrt.ops import index_share, reference
        from attnrt.runtime import DeviceArray
        from attnrt.runtime.api import DataType, Node

        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - the GPU machine has it
            return dict(ok=False, error="ml_dtypes missing")
        rng = np.random.default_rng(7)
        bf16 = ml_dtypes.bfloat16
        if kind == "decode":
            b, sq, past, k = 2, 1, 2999, 2048
        else:
            b, sq, past, k = 1, 5, 1500, 700
        cur = sq
        cache = past + cur
        q = rng.standard_normal((b, n, sq, 128)).astype(bf16)
        kk, vv = (rng.standard_normal((b, 1, cur, 128)).astype(bf16) for _ in range(2))
        pk, pv = (rng.standard_normal((b, 1, past, 128)).astype(bf16) for _ in range(2))
        idx = np.stack([np.sort(rng.choice(cache, size=k, replace=False)) for _ in range(b * sq)])
        idx = idx.reshape(b, 1, sq, k).astype(np.int32)
        idx[0, 0, sq - 1, k - 77:] = -1  # one padded row: a partial last tile
        ins = [q, kk, vv, pk, pv, idx]
        node = Node("IndexShare", "pkg.nxrt", {"num_heads": n, "kv_num_heads": 1},
                    ["q", "k", "v", "pk", "pv", "idx"], ["y"])
        if (kind, n) not in self.refs:  # the same seeded inputs for every variant
            self.refs[(kind, n)] = reference.index_share(node, ins)[0].astype(np.float64)
        want = self.refs[(kind, n)]
        arrs = [DeviceArray.from_numpy(self.rt, a) for a in ins]
        views = [a.view() for a in arrs]
        y = DeviceArray(self.rt, q.shape, DataType.BFLOAT16)
        kern = index_share.IndexShareFactory(self.rt).create(node)
        kern.config = config_for(knobs)
        graph = None
        try:
            outs = []
            for _ in range(2):
                y.fill_bytes(0xFF)
                kern.execute(views, [y.mut()])
                outs.append(y.numpy())
            plan = self.plan_dict(kern)
            got = outs[0].astype(np.float64)
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            same = bool(np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16)))
            self.rt.synchronize()
            with self.rt.capture() as graph:
                kern.execute(views, [y.mut()])
            y.fill_bytes(0xFF)
            graph.replay()
            self.rt.synchronize()
            latch = self.rt.latch.read(clear=True)
            replay_same = bool(np.array_equal(y.numpy().view(np.uint16), outs[0].view(np.uint16)))
            ok = bool(err <= TOL_BF16 and same and replay_same and not latch)
            return dict(ok=ok, rel_fro=err, deterministic=same, replay_equals_eager=replay_same,
                        latch=latch, plan=plan)
        finally:
            del graph
            kern.close()
            for a in arrs + [y]:
                a.free()

    def _inputs(self, c: dict[str, Any]) -> list[dict]:
        import bench_index_share as bis

        key = shape_name(c)
        if key not in self.inputs:
            self.inputs.clear()
            self.peer_out.clear()
            self.torch.cuda.empty_cache()
            self.inputs[key] = [bis.make_inputs(self.torch, c, 1234 + i) for i in range(2)]
            self.torch.cuda.synchronize()
        return self.inputs[key]

    def _peer_out(self, c: dict[str, Any]) -> Any:
        import bench_index_share as bis

        key = shape_name(c)
        if key not in self.peer_out:
            sets = self._inputs(c)
            self.peer_out[key] = bis.torch_peer(self.torch, c, sets[0], gather="advanced")().float()
        return self.peer_out[key]

    def time(self, c: dict[str, Any], knobs: dict | None) -> dict[str, Any]:
        import bench_index_share as bis

        from attnrt.ops import index_share

        torch = self.torch
        sets = self._inputs(c)
        kern = index_share.IndexShareFactory(self.rt).create(bis.node_for(c))
        kern.config = config_for(knobs)
        graphs: list = []
        try:
            graphs.extend(bis.capture(self.rt, kern, s) for s in sets)

            def step() -> None:
                for gr in graphs:
                    gr.replay()

            ms = self.ctx.time_ours(step, warmup=3, reps=self.reps) / len(graphs)
            # A second timing of the same thing: differences below this spread are noise.
            ms_again = self.ctx.time_ours(step, warmup=0, reps=self.reps) / len(graphs)
            self.rt.latch.check()
            graphs[0].replay()
            self.rt.synchronize()
            ref = self._peer_out(c)
            y = sets[0]["y"].float()
            rel = float(torch.linalg.vector_norm(ref - y) / torch.linalg.vector_norm(ref))
            gbps = bis.gathered_bytes(c) / ms / 1e6
            return dict(ms=ms, ms_again=ms_again, GBps=gbps, rel_vs_torch=rel,
                        plan=self.plan_dict(kern))
        finally:
            graphs.clear()  # destroys the graphs before the kernel frees its scratch
            kern.close()

    def torch_peer(self, c: dict[str, Any]) -> dict[str, Any]:
        import bench_index_share as bis

        sets = self._inputs(c)
        peers = [bis.torch_peer(self.torch, c, s, gather="advanced") for s in sets]
        ms = self.ctx.time_torch(lambda: [p() for p in peers], warmup=2, reps=10) / len(peers)
        return dict(ms=ms, GBps=bis.gathered_bytes(c) / ms / 1e6)

    def run(self, task: dict[str, Any]) -> dict[str, Any]:
        if task["op"] == "ceiling":
            return self.ceiling()
        if task["op"] == "check":
            return self.check(task["kind"], task["n"], task["knobs"])
        if task["op"] == "time":
            return self.time(task["shape"], task["knobs"])
        if task["op"] == "torch":
            return self.torch_peer(task["shape"])
        raise ValueError(f"unknown task {task['op']}")


def worker_main(task_file: str, reps: int) -> int:
    tasks = json.loads(Path(task_file).read_text())
    w = Worker(reps)
    for t in tasks:
        print(f"@@START {t['id']}", flush=True)
        t0 = time.perf_counter()
        try:
            res = w.run(t)
        except Exception as exc:  # a refused plan or a failed check: report and go on
            res = dict(ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
        res["seconds"] = round(time.perf_counter() - t0, 2)
        print("@@RESULT " + json.dumps({"id": t["id"], "result": res}), flush=True)
        if not res.get("ok", True):
            try:  # a fault leaves the context unusable: let the parent start a fresh worker
                w.rt.synchronize()
                w.rt.latch.read(clear=True)
            except Exception:
                sys.stdout.flush()
                os._exit(3)
    return 0


# ---------------------------------------------------------------------------------------
# parent side: no GPU imports, so a worker's crash never takes the sweep down
# ---------------------------------------------------------------------------------------

def _compile_one(args: tuple) -> str:
    file, options, target = args
    from attnrt.ops import _common
    from attnrt.runtime.cache import CompileCache

    CompileCache(os.environ["ATTNRT_CACHE_DIR"], disk=True).get(
        _common.source(file), file, target, options, _common.headers())
    return file


def precompile(target: str) -> float:
    """Fill the disk cache with every build the sweep can use, in parallel processes."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from attnrt.ops import index_share
    from attnrt.ops.index_share import builds
    from attnrt.runtime.api import DataType

    t0 = time.perf_counter()
    jobs = [(builds._aux_variant(DataType.BFLOAT16).file,
             builds._aux_variant(DataType.BFLOAT16).options, target)]
    for wm, wn in index_share.MMA_LAYOUTS:
        for pipe in index_share.MMA_PIPES:
            v = builds._mma_variant(DataType.BFLOAT16, 128, wm, wn, pipe)
            jobs.append((v.file, v.options, target))
    if target.startswith("sm_90"):
        for wgs, mrows in index_share.WG_LAYOUTS:
            for ov in (0, 1):
                for qr in (0, 1) if (wgs, mrows) == index_share.WG_QREG_LAYOUT else (0,):
                    v = builds._wg_variant(DataType.BFLOAT16, 128, wgs, mrows, ov, qr)
                    jobs.append((v.file, v.options, "sm_90a"))
    try:
        with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1),
                                 mp_context=multiprocessing.get_context("spawn")) as ex:
            list(ex.map(_compile_one, jobs))
    except Exception as exc:  # the workers compile on demand instead
        print(f"[sweep] precompile skipped: {type(exc).__name__}: {exc}", flush=True)
    return time.perf_counter() - t0


def run_tasks(tasks: list[dict], reps: int, timeout: float) -> dict[str, dict]:
    """Run tasks in worker processes; a crash or a task over ``timeout`` seconds marks the
    running task FAILED and the rest continue in a fresh worker."""
    results: dict[str, dict] = {}
    pending = list(tasks)
    while pending:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(pending, f)
            task_file = f.name
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", task_file,
               "--reps", str(reps)]
        started: str | None = None
        path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, PYTHONPATH=path))
        # A task that hangs (or a worker that never starts) is killed, not waited on.
        watchdog = threading.Timer(timeout + 60, proc.kill)
        watchdog.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("@@START "):
                watchdog.cancel()
                watchdog = threading.Timer(timeout, proc.kill)
                watchdog.start()
                started = line.split()[1]
                print(f"[sweep] {started}", flush=True)
            elif line.startswith("@@RESULT "):
                msg = json.loads(line[len("@@RESULT "):])
                results[msg["id"]] = msg["result"]
                if not msg["result"].get("ok", True):
                    print(f"[sweep]   FAILED: {msg['result'].get('error', msg['result'])}",
                          flush=True)
                started = None
        proc.wait()
        watchdog.cancel()
        err = proc.stderr.read() if proc.stderr else ""
        os.unlink(task_file)
        done = {t["id"] for t in pending if t["id"] in results}
        tail = " | ".join(err.strip().splitlines()[-3:])[-400:]
        if started is not None and started not in results:  # it died inside this task
            results[started] = dict(ok=False, error=f"worker died (rc {proc.returncode}): {tail}")
            print(f"[sweep]   FAILED: {results[started]['error']}", flush=True)
            done.add(started)
        if not done:  # it died before its first task (import or context error): give up
            for t in pending:
                results.setdefault(t["id"], dict(ok=False, error=f"worker failed: {tail}"))
            print(f"[sweep] worker failed before its first task: {tail}", flush=True)
            break
        pending = [t for t in pending if t["id"] not in done]  # the rest: a fresh worker
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the quick benchmark rows")
    ap.add_argument("--shapes", default="", help="comma list of shape names to keep")
    ap.add_argument("--variants", default="", help="comma list of variant names to keep")
    ap.add_argument("--reps", type=int, default=20, help="timed replay pairs (>= 20)")
    ap.add_argument("--out", default=os.environ.get("OUT", ""), help="directory for the JSON")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per task")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.reps)
    reps = max(20, args.reps)
    t_start = time.perf_counter()

    import bench_index_share as bis

    shapes = bis.cases(args.quick)
    if args.shapes:
        keep = set(args.shapes.split(","))
        shapes = [c for c in shapes if shape_name(c) in keep]
    vkeep = set(args.variants.split(",")) if args.variants else None

    def variants(c: dict[str, Any]) -> list[tuple[str, dict | None]]:
        vs = VARIANTS[(c["kind"], c["n"])]
        return [v for v in vs if vkeep is None or v[0] in vkeep]

    target = os.environ.get("ATTNRT_SWEEP_ARCH", "sm_90")
    pre = precompile(target)
    print(f"[sweep] precompile {pre:.1f} s", flush=True)

    # Phase 1: checks, one per distinct (kind, n, knobs).
    checks, check_of = [], {}
    for c in shapes:
        for name, knobs in variants(c):
            key = f"check:{c['kind']}:{c['n']}:{name}"
            check_of[(shape_name(c), name)] = key
            if all(t["id"] != key for t in checks):
                checks.append(dict(id=key, op="check", kind=c["kind"], n=c["n"], knobs=knobs))
    res = run_tasks(checks, reps, args.timeout)

    # Phase 2: ceilings, then per shape the torch peer and every variant whose check passed.
    timing = [dict(id="ceiling", op="ceiling")]
    for c in shapes:
        timing.append(dict(id=f"torch:{shape_name(c)}", op="torch", shape=c))
        for name, knobs in variants(c):
            if res.get(check_of[(shape_name(c), name)], {}).get("ok"):
                timing.append(dict(id=f"time:{shape_name(c)}:{name}", op="time", shape=c,
                                   knobs=knobs))
    res.update(run_tasks(timing, reps, args.timeout))

    ceil = res.get("ceiling", {})
    copy = ceil.get("copy_GBps")

    def num(x: Any, spec: str) -> str:
        return "" if x is None else format(x, spec)

    floor = ceil.get("graph_floor_us")
    lines = [f"IndexShare sweep: {ceil.get('gpu', '?')}, copy {num(copy, '.0f')} GB/s (dtod "
             f"2 GiB), graph floor {num(floor, '.1f')} us (one empty kernel), {reps} reps, "
             f"{time.perf_counter() - t_start:.0f} s total"
             + ("" if ceil.get("copy_GBps") else f" | ceiling FAILED {ceil.get('error', '')[:80]}"),
             f"{'shape':<16} {'variant':<24} {'plan':<34} {'ms':>8} {'again':>8} {'GB/s':>7} "
             f"{'%copy':>6} {'xtorch':>7} check"]
    rows = []
    for c in shapes:
        sn = shape_name(c)
        tr = res.get(f"torch:{sn}", {})
        tms, tg = tr.get("ms"), tr.get("GBps")
        pct = num(100 * tg / copy, "5.0f") + "%" if (tg and copy) else ""
        lines.append(f"{sn:<16} {'torch adv-index+sdpa':<24} {'':<34} {num(tms, '8.4f'):>8} "
                     f"{'':>8} {num(tg, '7.0f'):>7} {pct:>6} {'':>7} "
                     f"{'' if tms else 'FAILED ' + str(tr.get('error', ''))[:70]}")
        for name, _ in variants(c):
            ck = res.get(check_of[(sn, name)], {})
            tm = res.get(f"time:{sn}:{name}", {})
            if ck.get("ok"):
                status = f"ok {ck.get('rel_fro', 0):.1e}"
            else:
                detail = ck.get("error") or {k: ck.get(k) for k in (
                    "rel_fro", "deterministic", "replay_equals_eager", "latch")}
                status = "FAILED " + str(detail)[:70]
            if "ms" in tm:
                pct = num(100 * tm["GBps"] / copy, "5.0f") + "%" if copy else ""
                ratio = num(tms / tm["ms"], "6.2f") + "x" if tms else ""
                lines.append(f"{sn:<16} {name:<24} {plan_text(tm['plan']):<34} "
                             f"{tm['ms']:8.4f} {tm['ms_again']:8.4f} {tm['GBps']:7.0f} "
                             f"{pct:>6} {ratio:>7} {status}")
            else:
                why = str(tm.get("error", ""))[:60] if tm else ""
                lines.append(f"{sn:<16} {name:<24} {'':<34} {'':>8} {'':>8} {'':>7} {'':>6} "
                             f"{'':>7} {status}{' | time FAILED ' + why if why else ''}")
            rows.append(dict(shape=sn, variant=name, check=ck, time=tm))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep_index_share.json").write_text(json.dumps(
            dict(ceiling=ceil, torch={shape_name(c): res.get(f"torch:{shape_name(c)}")
                                      for c in shapes}, rows=rows), indent=1) + "\n")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
