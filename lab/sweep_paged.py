#!/usr/bin/env python3
"""Sweep PagedAttention (LATENT / MLA) decode variants on one GPU; prints one table last.

    PYTHONPATH=. python lab/sweep_paged.py [--quick] [--reps 25] [--out DIR]

The mma.sync variants and the wgmma (sm_90a) variants run in two child processes, one after
the other, so that a device fault in one family cannot poison the other's CUDA context; the
parent prints the combined table.

Every variant (read path x forced split count) is first checked against the float64
reference on small shapes (bf16 rel Frobenius <= 1e-2, f16 <= 2e-3; poisoned outputs, the
latch must stay clear); a variant that fails prints FAILED and is not timed, and the sweep
goes on. Then each decode shape (bf16, 128 heads, latent 576 / value 512, block_size 64,
shuffled block tables, one new token per sequence) is timed as CUDA-graph replays of the
whole op (write + read + combine) with CUDA events, median of ``--reps`` regions. Where the
latent cache of one shape fits in L2, several copies rotate so that each replay reads cold
HBM, as a decode step of a real model does. For B=1 the phases are also timed alone.

Columns: ms per op, effective GB/s (latent bytes B * L * 576 * 2 read once / time),
TFLOP/s (2 * B * 128 * L * (576 + 512)), % of the copy bandwidth measured in this run
(rt.dtod of 2 GiB, read + write bytes / time). Full rows also go to DIR/sweep_paged.json
(DIR: --out, else $OUT, else nothing written).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attnrt  # noqa: E402
from attnrt.ops import reference  # noqa: E402
from attnrt.ops.paged_attention import PagedAttentionConfig, PagedAttentionFactory  # noqa: E402
from attnrt.runtime._check import check, driver  # noqa: E402
from attnrt.runtime.api import Node, TensorView, WorkspaceView  # noqa: E402
from attnrt.runtime.tensors import DeviceArray  # noqa: E402
from tests._util import TOL, rel_fro  # noqa: E402
from tests.test_paged_cpu import BF16, F16, make_case  # noqa: E402

HS, VHS, H, BS = 576, 512, 128, 64
SCALE = 1.0 / (192 ** 0.5)
MLA = dict(H=H, hs=HS, vhs=VHS, bs=BS, rd=64, offset=512)

#: Small correctness cases every variant must pass before it is timed.
CHECKS = {
    "decode-bf16-rope": dict(dtype=BF16, rope="half", q_lens=(1, 1, 1), past_lens=(100, 777, 1500)),
    "prefill-f16-window-softcap": dict(dtype=F16, rope="interleaved", offset=500, softcap=30.0,
                                       bs=32, window=40, q_lens=(9, 3), past_lens=(60, 0)),
    "prefill-bf16-h16": dict(H=16, dtype=BF16, rope="half", bs=16, q_lens=(37, 5, 1),
                             past_lens=(0, 70, 129)),
}


_REFS: dict[str, np.ndarray] = {}


class Timer:
    """Median milliseconds of work enqueued on rt.stream, by CUDA events."""

    def __init__(self, rt: attnrt.CudaRuntime) -> None:
        self.rt = rt
        self.start = check(driver.cuEventCreate(0), "cuEventCreate")
        self.stop = check(driver.cuEventCreate(0), "cuEventCreate")

    def median_ms(self, fn: Any, reps: int, inner: int = 1, warmup: int = 3) -> tuple[float, float]:
        s = self.rt.stream.handle
        for _ in range(warmup):
            fn()
        self.rt.synchronize()
        times = []
        for _ in range(reps):
            check(driver.cuEventRecord(self.start, s), "cuEventRecord")
            for _ in range(inner):
                fn()
            check(driver.cuEventRecord(self.stop, s), "cuEventRecord")
            check(driver.cuEventSynchronize(self.stop), "cuEventSynchronize")
            times.append(check(driver.cuEventElapsedTime(self.start, self.stop),
                               "cuEventElapsedTime") / inner)
        t = np.asarray(times)
        return float(np.median(t)), float(np.percentile(t, 90) - np.percentile(t, 10))


def copy_bandwidth(rt: attnrt.CudaRuntime, timer: Timer, nbytes: int = 2 << 30) -> float:
    src, dst = rt.alloc_raw(nbytes), rt.alloc_raw(nbytes)
    try:
        rt.memset(src, 0x3C, nbytes)
        ms, _ = timer.median_ms(lambda: rt.dtod(dst, src, nbytes), reps=10)
        return 2 * nbytes / ms / 1e6
    finally:
        rt.free_raw(src)
        rt.free_raw(dst)


def fill_random(rt: attnrt.CudaRuntime, arr: DeviceArray, scratch: DeviceArray) -> None:
    """Fill ``arr`` with copies of a random bf16 block (values do not affect timing; no zeros)."""
    done, n = 0, arr.nbytes
    while done < n:
        k = min(scratch.nbytes, n - done)
        rt.dtod(arr.ptr + done, scratch.ptr, k)
        done += k


class DecodeSet:
    """Device inputs of one decode problem: B sequences with L cached keys (the last new)."""

    def __init__(self, rt: attnrt.CudaRuntime, B: int, L: int, scratch: DeviceArray, seed: int) -> None:
        rng = np.random.default_rng(seed)
        mb = -(-L // BS)
        nb = B * mb
        bt = rng.permutation(nb).astype(np.int32).reshape(B, mb)
        pos = np.full(B, L - 1)
        slot = (bt[np.arange(B), pos // BS] * BS + pos % BS).astype(np.int32)
        self.arrays = {
            0: DeviceArray(rt, (B, H * HS), BF16), 1: DeviceArray(rt, (B, HS), BF16),
            3: DeviceArray(rt, (nb, BS, 1, HS), BF16),
            5: DeviceArray.from_numpy(rt, np.arange(B + 1, dtype=np.int32)),
            6: DeviceArray.from_numpy(rt, np.full(B, L - 1, dtype=np.int32)),
            7: DeviceArray.from_numpy(rt, bt), 10: DeviceArray.from_numpy(rt, slot)}
        for i in (0, 1, 3):
            fill_random(rt, self.arrays[i], scratch)
        self.out = DeviceArray(rt, (B, H * VHS), BF16)

    def views(self) -> list:
        return [self.arrays[i].view() if i in self.arrays else TensorView.absent_slot()
                for i in range(16)]

    def free(self) -> None:
        for a in [*self.arrays.values(), self.out]:
            a.free()


def decode_node() -> Node:
    return Node("PagedAttention", "com.microsoft",
                {"kv_cache_layout": "LATENT", "num_heads": H, "kv_num_heads": 1,
                 "v_head_size": VHS, "scale": SCALE},
                ["q", "k", None, "kc", None, "cu", "past", "bt", None, None, "slot"], ["out"])


def check_variant(rt: attnrt.CudaRuntime, kw: dict) -> tuple[bool, str]:
    """Run every CHECKS case with factory kwargs ``kw``; (all passed, worst error summary)."""
    worst, notes = 0.0, []
    for name, case_kw in CHECKS.items():
        c = make_case(np.random.default_rng(11), **{**MLA, **case_kw})
        kernel = PagedAttentionFactory(rt, config=PagedAttentionConfig(**kw)).create(c.node, [])
        bufs = {i: DeviceArray.from_numpy(rt, x) for i, x in enumerate(c.inputs[:16])
                if x is not None}
        out = DeviceArray(rt, (c.T, c.H * c.vhs), c.dtype)
        views = [bufs[i].view() if i in bufs else TensorView.absent_slot() for i in range(16)]
        req = kernel.workspace_requirement(views)
        ws = DeviceArray(rt, (req.nbytes,), np.uint8) if req.nbytes else None
        try:
            out.fill_bytes(0xFF)
            kernel.execute(views, [out.mut()],
                           WorkspaceView(ws.ptr, ws.nbytes) if ws is not None else None)
            rt.synchronize()
            got = out.numpy().copy()
            latched = rt.latch.read(clear=True)
        finally:
            for a in [*bufs.values(), out] + ([ws] if ws is not None else []):
                a.free()
        if name not in _REFS:  # the same seeded inputs for every variant
            _REFS[name] = reference.paged_attention(c.node, c.inputs)[0]
        ref = _REFS[name]
        err = rel_fro(got, ref)
        worst = max(worst, err / TOL[c.dtype])
        if err > TOL[c.dtype] or latched:
            notes.append(f"{name}: rel_fro {err:.2e} latch {latched:#x}")
    return not notes, "; ".join(notes) if notes else f"worst {worst:.2f} of tol"


def time_variant(rt: attnrt.CudaRuntime, timer: Timer, sets: list[DecodeSet], kw: dict,
                 reps: int, phases: tuple[str, ...] = ()) -> list[dict]:
    """Graph-replay time of the whole op (and of single phases) rotating over ``sets``."""
    kernel = PagedAttentionFactory(rt, config=PagedAttentionConfig(**kw)).create(decode_node(), [])
    req = kernel.workspace_requirement(sets[0].views())
    ws = DeviceArray(rt, (req.nbytes,), np.uint8) if req.nbytes else None
    wsv = WorkspaceView(ws.ptr, ws.nbytes) if ws is not None else None
    graphs: list[Any] = []
    results = []
    try:
        for s in sets:  # warm every signature (same shapes: one compile) and fill the workspace
            kernel.execute(s.views(), [s.out.mut()], wsv)
        rt.synchronize()
        rt.latch.check()
        plan = kernel.last_plan
        for label in ("op",) + phases:
            kernel._phases = frozenset(("write", "read", "combine") if label == "op" else (label,))
            graphs = []
            for s in sets:
                with rt.capture() as g:
                    kernel.execute(s.views(), [s.out.mut()], wsv)
                graphs.append(g)
            def replay(gs: list = graphs, idx: list = [0]) -> None:  # noqa: B006 (a counter)
                gs[idx[0] % len(gs)].replay()
                idx[0] += 1

            est, _ = timer.median_ms(replay, reps=3, inner=len(graphs), warmup=len(graphs))
            inner = max(len(graphs), math.ceil(0.3 / max(est, 1e-3) / len(graphs)) * len(graphs))
            ms, spread = timer.median_ms(replay, reps=reps, inner=inner, warmup=len(graphs))
            rt.latch.check()
            results.append({"phase": label, "ms": ms, "spread_ms": spread, "splits": plan.splits,
                            "path": plan.path, "block_n": plan.block_n, "inner": inner})
            for g in graphs:
                g.destroy()
            graphs = []
    finally:
        for g in graphs:
            g.destroy()
        kernel._phases = frozenset(("write", "read", "combine"))
        if ws is not None:
            ws.free()
    return results


FAMILIES = {"mma": "mla", "wg": "wg"}  # variant family -> factory path


def variants(quick: bool, family: str) -> list[tuple[str, dict, Any]]:
    """(name, factory kwargs, predicate on (B, L) saying where to time it) of one family."""
    path = FAMILIES[family]
    out: list[tuple[str, dict, Any]] = [(family, dict(path=path), lambda B, L: True)]
    if family == "mma" and not quick:
        out.append(("mma-bn32", dict(path="mla32"), lambda B, L: B == 1))
    split_sets = {1: (16, 32, 64), 32: (1, 4), 128: (2,)}
    for B, ss in split_sets.items():
        for s in ss if not quick else ss[:1]:
            out.append((f"{family}-s{s}", dict(path=path, num_splits=s),
                        lambda B_, L, B=B: B_ == B))
    return out


def run_family(family: str, quick: bool, reps: int) -> dict:
    """Check and time one family of variants in this process; returns the JSON-able result."""
    shapes = [(1, 4096), (1, 8192), (32, 8192), (128, 8192)]
    if quick:
        shapes = [(1, 8192), (32, 8192)]
    rows: list[dict] = []
    with attnrt.CudaRuntime(0) as rt:
        caps = rt.capabilities
        timer = Timer(rt)
        copy = copy_bandwidth(rt, timer)
        print(f"[sweep:{family}] {caps.name} sm_count {caps.sm_count} L2 {caps.l2_bytes >> 20} "
              f"MiB; copy {copy:.0f} GB/s", flush=True)
        if family == "wg" and tuple(caps.compute_capability) != (9, 0):
            return {"gpu": caps.name, "copy_GBps": copy, "rows": [], "status": {
                "wg": [False, f"needs compute capability 9.0, got {caps.compute_capability}"]}}
        vlist = variants(quick, family)
        status: dict[str, tuple[bool, str]] = {}
        for name, kw, _ in vlist:
            t0 = time.perf_counter()
            try:
                status[name] = check_variant(rt, kw)
            except Exception as exc:  # a broken variant must not stop the sweep
                status[name] = (False, f"{type(exc).__name__}: {exc}"[:300])
                traceback.print_exc()
            print(f"[sweep:{family}] check {name}: {'ok' if status[name][0] else 'FAILED'} "
                  f"({status[name][1]}) {time.perf_counter() - t0:.1f}s", flush=True)
        rng = np.random.default_rng(0)
        scratch = DeviceArray.from_numpy(
            rt, rng.standard_normal(8 << 20).astype(np.float32).astype(BF16.numpy))
        try:
            for B, L in shapes:
                kv = B * L * HS * 2
                n_sets = int(min(16, max(1, math.ceil(3 * caps.l2_bytes / kv))))
                sets = [DecodeSet(rt, B, L, scratch, seed=i) for i in range(n_sets)]
                flops = 2.0 * B * H * L * (HS + VHS)
                try:
                    for name, kw, where in vlist:
                        if not where(B, L):
                            continue
                        shape = f"B{B} L{L}"
                        if not status[name][0]:
                            rows.append({"variant": name, "shape": shape, "phase": "op",
                                         "error": "FAILED check: " + status[name][1]})
                            continue
                        phases = ("write", "read", "combine") if B == 1 else ()
                        try:
                            res = time_variant(rt, timer, sets, kw, reps, phases)
                        except Exception as exc:
                            traceback.print_exc()
                            rows.append({"variant": name, "shape": shape, "phase": "op",
                                         "error": f"FAILED: {type(exc).__name__}: {exc}"[:300]})
                            continue
                        for r in res:
                            r.update(variant=name, shape=shape, sets=n_sets,
                                     GBps=kv / r["ms"] / 1e6, TFLOPs=flops / r["ms"] / 1e9)
                            r["pct_copy"] = 100.0 * r["GBps"] / copy
                            rows.append(r)
                            print(f"[sweep:{family}] {name:10s} {shape:12s} {r['phase']:8s} "
                                  f"{r['ms']:.4f} ms splits {r['splits']}", flush=True)
                finally:
                    for s in sets:
                        s.free()
        finally:
            scratch.free()
    return {"gpu": caps.name, "copy_GBps": copy, "rows": rows,
            "status": {k: list(v) for k, v in status.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes and variants")
    ap.add_argument("--reps", type=int, default=25, help="timed regions per row (median)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="directory for the JSON rows")
    ap.add_argument("--family", choices=sorted(FAMILIES), help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--result", help=argparse.SUPPRESS)  # child mode: where to write JSON
    args = ap.parse_args(argv)
    reason = attnrt.gpu_missing_reason()
    if reason:
        print(f"sweep_paged: {reason}; nothing to measure", file=sys.stderr)
        return 2
    if args.family:  # child: one family, result as JSON
        res = run_family(args.family, args.quick, args.reps)
        Path(args.result).write_text(json.dumps(res))
        return 0
    t_start = time.perf_counter()
    gpu, copy, rows, status = "?", float("nan"), [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
            out = Path(tmp) / f"{family}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--family", family,
                   "--result", str(out), "--reps", str(args.reps)] + (["--quick"] if args.quick else [])
            rc = subprocess.call(cmd, cwd=str(ROOT))
            if rc != 0 or not out.exists():
                status[family] = [False, f"child process exited with {rc} (device fault?)"]
                rows.append({"variant": family, "shape": "all", "phase": "op",
                             "error": f"FAILED: child exited with {rc}; see its output above"})
                continue
            res = json.loads(out.read_text())
            gpu = res["gpu"]
            copy = res["copy_GBps"] if copy != copy else copy  # the first family's measurement
            rows += res["rows"]
            status.update(res["status"])
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "sweep_paged.json").write_text(json.dumps(
            {"gpu": gpu, "copy_GBps": copy, "rows": rows, "status": status}, indent=1))
    print(f"\nPagedAttention MLA decode sweep — {gpu}, copy {copy:.0f} GB/s, "
          f"{time.perf_counter() - t_start:.0f} s; bf16 H128 d576/512 bs64; "
          "GB/s = latent bytes read once / time; +- = p90 - p10 of the regions")
    print(f"{'variant':10s} {'shape':11s} {'split':>5s} {'ms':>8s} {'+-':>6s} {'GB/s':>7s} "
          f"{'TFLOP/s':>7s} {'%copy':>6s}  phases alone: write / read / combine ms")
    ops = [r for r in rows if r["phase"] == "op"]
    for r in ops:
        if "error" in r:
            print(f"{r['variant']:10s} {r['shape']:11s} {r['error'][:100]}")
            continue
        alone = {x["phase"]: x["ms"] for x in rows if x["variant"] == r["variant"]
                 and x["shape"] == r["shape"] and x["phase"] != "op" and "error" not in x}
        extra = " / ".join(f"{alone[k]:.4f}" if k in alone else "-"
                           for k in ("write", "read", "combine")) if alone else ""
        print(f"{r['variant']:10s} {r['shape']:11s} {r['splits']:5d} {r['ms']:8.4f} "
              f"{r['spread_ms']:6.4f} {r['GBps']:7.0f} {r['TFLOPs']:7.1f} {r['pct_copy']:5.1f}%  "
              f"{extra}")
    for name, (ok, note) in status.items():
        if not ok:
            print(f"FAILED check {name}: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
