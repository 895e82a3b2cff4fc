#!/usr/bin/env python3
"""Attention decode routes on the GPU: ``python lab/sweep_attention_decode.py [--out FILE]``.

Compares the decode routes on bf16, D 128, H 32 / Hkv 8, Sq 1 (the bench rows are B 8 at Sk
1k / 8k / 32k; with the memory merge B 8, B 4 and B 16 give the decode kernel 4, 8 and 2
splits):

* ``tc``: the mma.sync kernel ``tc`` + split-KV + the ``attn_combine`` launch
  (``path="fused"``);
* ``last``: the single-kernel decode, splits merged by the last-arriving CTA through memory
  (``dec_merge="last"``; counters from the kernel's pool);
* ``last-ws``: the same with the counters in the workspace (a memset per call);
* ``cluster``: the single-kernel decode with the split CTAs of a row tile in one thread-block
  cluster merging through distributed shared memory (``dec_merge="auto"``: on compute
  capability 9.0 with 2 splits, the B 16 rows, and the B 8 rows, which ``decode_splits``
  runs as pairs at one CTA per SM; otherwise, B 4, the same plan as ``last``).

First correctness: small odd cases of the decode kernel vs float64 (f16/bf16, GQA/MHA,
forced splits), and a few rows of every timed case vs float64 for every route; ``cluster``
must equal ``last`` bitwise. Then each route is timed as CUDA-graph replays of ``execute``
(one replay between two events, median, as tools/bench_attention.py's single-call rows do),
and as one graph of 8 calls over input sets rotated so that their K/V exceed L2 (per call,
as the bench's "in one graph" rows), in GB/s of Q + K + V + O bytes, beside the measured
copy ceiling (device-to-device copy of a 2 GiB buffer, read + write bytes) and the launch
floor (a graph of one empty kernel). Prints a table, writes JSON to ``--out``. About 1-2
minutes on an H200.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

H, HKV, D = 32, 8, 128
SHAPES = ((8, 1024), (8, 8192), (8, 32768), (4, 1024), (4, 8192), (16, 1024), (16, 8192))
STEP_CALLS = 8  # calls per graph in the rotated-inputs timing
# (dtype, B, H, Hkv, Sq, Sk, D, splits, attrs)
CHECKS = [("bf16", 2, 32, 8, 1, 1000, 128, None, {}), ("f16", 1, 8, 8, 1, 4097, 64, 3, {}),
          ("bf16", 3, 8, 2, 1, 7, 128, None, {}), ("f16", 2, 16, 4, 2, 1001, 64, 2, {"causal": 1}),
          ("bf16", 1, 32, 8, 1, 4097, 128, 7, {"softcap": 5.0})]
TOL = {"bf16": 1e-2, "f16": 2e-3}
# (name, path, counters from the pool, dec_merge)
ROUTES = (("tc", "fused", True, "auto"), ("last", "decode", True, "last"),
          ("last-ws", "decode", False, "last"), ("cluster", "decode", True, "auto"))
EMPTY_SRC = 'extern "C" __global__ void sweep_empty() {}\n'


def _np_dtype(dt: str) -> Any:
    import ml_dtypes

    return ml_dtypes.bfloat16 if dt == "bf16" else np.float16


def _node(Hq: int, Hkv: int, **attrs: Any) -> Any:
    from attnrt.runtime.api import Node

    return Node("Attention", "pkg.nxrt", {"num_heads": Hq, "kv_num_heads": Hkv, **attrs},
                ["q", "k", "v"], ["o"])


def _rand(rng: np.random.Generator, shape: tuple, dt: str) -> np.ndarray:
    # Tile a 1M-value random pool: the 32k-key tensors need no 270M-draw generation.
    pool = rng.standard_normal(1 << 20, dtype=np.float32).astype(_np_dtype(dt))
    return np.resize(pool, shape)


def _rows_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, idx: list[tuple[int, int]],
              G: int) -> np.ndarray:
    """float64 decode attention (Sq = 1, no mask) of selected (b, h) rows."""
    out = []
    for b, h in idx:
        qi = q[b, h, 0].astype(np.float64)
        kk = k[b, h // G].astype(np.float64)
        vv = v[b, h // G].astype(np.float64)
        s = kk @ qi / math.sqrt(q.shape[3])
        p = np.exp(s - s.max())
        out.append(p @ vv / p.sum())
    return np.stack(out)


class Case:
    """Device inputs, output and workspace for one kernel."""

    def __init__(self, rt: Any, kernel: Any, arrs: list, out: Any) -> None:
        from attnrt.runtime.api import WorkspaceView

        self.rt, self.kernel, self.out = rt, kernel, out
        self.views = [a.view() for a in arrs]
        req = kernel.workspace_requirement([t.meta for t in self.views])
        self.ws_ptr = rt.alloc_raw(req.nbytes) if req.nbytes else 0
        self.ws = WorkspaceView(self.ws_ptr, req.nbytes) if req.nbytes else None

    def __call__(self) -> None:
        self.kernel.execute(self.views, [self.out.mut()], self.ws)

    def free(self) -> None:
        self.kernel.close()
        if self.ws_ptr:
            self.rt.free_raw(self.ws_ptr)


def _time_graph(ctx: Any, rt: Any, fn: Any, reps: int) -> tuple[float, float]:
    """(median ms of one replay, ms per call of 20 back-to-back replays) of fn captured."""
    fn()
    rt.synchronize()
    with rt.capture() as graph:
        fn()
    try:
        one = ctx.time_ours(graph.replay, warmup=5, reps=reps)

        def twenty() -> None:
            for _ in range(20):
                graph.replay()
        many = ctx.time_ours(twenty, warmup=1, reps=max(5, reps // 10)) / 20
    finally:
        graph.destroy()
    return one, many


def _time_rotated(ctx: Any, rt: Any, calls: list) -> float:
    """ms per call of one graph holding STEP_CALLS calls that cycle through ``calls``."""
    for c in calls:
        c()
    rt.synchronize()
    with rt.capture() as graph:
        for i in range(STEP_CALLS):
            calls[i % len(calls)]()
    try:
        return ctx.time_ours(graph.replay, warmup=3, reps=20) / STEP_CALLS
    finally:
        graph.destroy()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="sweep_attention_decode.json", help="JSON result file")
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args(argv)
    t0 = time.time()

    from bench import BenchContext

    import attnrt
    from attnrt.ops import reference
    from attnrt.ops.attention import AttentionConfig, AttentionKernel
    from tests._util import rel_fro

    rt = attnrt.CudaRuntime(0)
    ctx = BenchContext(rt)
    result: dict[str, Any] = {"shape": {"H": H, "Hkv": HKV, "D": D, "dtype": "bf16"},
                              "checks": [], "rows": [], "ceilings": {}}

    def save() -> None:
        Path(a.out).write_text(json.dumps(result, indent=1))

    def log(msg: str) -> None:
        print(f"[sweep-decode {time.time() - t0:5.1f}s] {msg}", flush=True)

    # -- correctness: small odd cases of the decode kernel vs float64
    ok_all = True
    for n, (dt, b, hq, hkv, sq, sk, d, splits, attrs) in enumerate(CHECKS):
        rng = np.random.default_rng(n)
        node = _node(hq, hkv, **attrs)
        host = [rng.standard_normal(s, dtype=np.float32).astype(_np_dtype(dt))
                for s in ((b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, d))]
        arrs = [attnrt.DeviceArray.from_numpy(rt, x) for x in host]
        out = attnrt.DeviceArray(rt, host[0].shape, arrs[0].view().dtype)
        cfg = AttentionConfig(path="decode", num_splits=splits)
        case = Case(rt, AttentionKernel(rt, node, cfg), arrs, out)
        try:
            out.fill_bytes(0xFF)
            case()
            rt.synchronize()
            err = rel_fro(out.numpy(), reference.attention(node, host, out_dtype=np.float64))
            ok = bool(err <= TOL[dt])
            ok_all &= ok
            p = case.kernel.last_plan
            result["checks"].append({"case": [dt, b, hq, hkv, sq, sk, d, splits, attrs],
                                     "err": err, "ok": ok, "path": p.path, "splits": p.splits})
            log(f"check {n}: {dt} B{b} H{hq}/{hkv} Sq{sq} Sk{sk} D{d} splits {p.splits}: "
                f"err {err:.2e} {'ok' if ok else 'FAILED'}")
        finally:
            case.free()
            for x in arrs + [out]:
                x.free()
    save()

    # -- ceilings: copy bandwidth (2 GiB device-to-device) and the launch floor
    nbytes = 2 << 30
    src, dst = rt.alloc_raw(nbytes), rt.alloc_raw(nbytes)
    try:
        rt.memset(src, 0x3C, nbytes)
        ms = ctx.time_ours(lambda: rt.dtod(dst, src, nbytes), warmup=2, reps=10)
        copy = 2 * nbytes / ms / 1e6
    finally:
        rt.free_raw(src)
        rt.free_raw(dst)
    empty = rt.nvrtc_function("sweep_empty", EMPTY_SRC, "sweep_empty")
    floor, floor_many = _time_graph(ctx, rt, lambda: rt.launch(empty, (1, 1, 1), (32, 1, 1), []),
                                    a.reps)
    result["ceilings"] = {"copy_GBps": round(copy, 1), "launch_floor_us": round(1e3 * floor, 2),
                          "launch_floor_b2b_us": round(1e3 * floor_many, 2)}
    log(f"copy {copy:.0f} GB/s; empty-kernel graph replay {1e3 * floor:.2f} us "
        f"({1e3 * floor_many:.2f} us back-to-back)")
    save()

    # -- the decode rows: spot-check, then time each route
    G = H // HKV
    l2 = int(getattr(rt.capabilities, "l2_bytes", 0) or 50 << 20)
    for B, sk in SHAPES:
        rng = np.random.default_rng(sk + B)
        moved = 2 * (2 * B * H * D + 2 * B * HKV * sk * D)  # Q + O + K + V bytes
        nsets = max(2, min(4, -(-3 * l2 // moved)))
        sets = []
        for _ in range(nsets):
            host = [_rand(rng, (B, H, 1, D), "bf16"), _rand(rng, (B, HKV, sk, D), "bf16"),
                    _rand(rng, (B, HKV, sk, D), "bf16")]
            sets.append((host, [attnrt.DeviceArray.from_numpy(rt, x) for x in host]))
        host, arrs = sets[0]
        idx = [(0, 0), (B - 1, H - 1), (B // 2, 17), (1, 6)]
        want = _rows_ref(host[0], host[1], host[2], idx, G)
        node = _node(H, HKV)
        row: dict[str, Any] = {"B": B, "Sk": sk, "MB": round(moved / 1e6, 2),
                               "ideal_us": round(moved / copy / 1e3, 2)}
        first = None
        for name, path, pool, merge in ROUTES:
            cases = []
            try:
                for _, ar in sets:
                    out = attnrt.DeviceArray(rt, host[0].shape, ar[0].view().dtype)
                    cfg = AttentionConfig(path=path, dec_merge=merge, counter_pool=pool)
                    c = Case(rt, AttentionKernel(rt, node, cfg), ar, out)
                    cases.append(c)
                case = cases[0]
                case.out.fill_bytes(0xFF)
                case()
                rt.synchronize()
                got = case.out.numpy()
                err = rel_fro(np.stack([got[b, h, 0] for b, h in idx]), want)
                ok = bool(err <= TOL["bf16"])
                if name == "last":
                    first = got
                elif name == "cluster" and first is not None:
                    ok = ok and bool(np.array_equal(got.view(np.uint16), first.view(np.uint16)))
                ok_all &= ok
                one, _ = _time_graph(ctx, rt, case, a.reps)
                rot = _time_rotated(ctx, rt, cases)
                p = case.kernel.last_plan
                gbps, gbps_rot = moved / one / 1e6, moved / rot / 1e6
                row[name] = {"path": p.path, "splits": p.splits, "cluster": p.cluster,
                             "us": round(1e3 * one, 2), "GBps": round(gbps, 1),
                             "of_copy": round(gbps / copy, 4), "us_graph8": round(1e3 * rot, 2),
                             "of_copy_graph8": round(gbps_rot / copy, 4), "err": err, "ok": ok}
                log(f"B{B} Sk {sk} {name:7s} ({p.path}, {p.splits} splits, cluster "
                    f"{p.cluster}): {1e3 * one:8.2f} us ({gbps / copy:.0%} of copy); "
                    f"{STEP_CALLS} calls in a graph {1e3 * rot:.2f} us/call "
                    f"({gbps_rot / copy:.0%}); err {err:.1e}{'' if ok else ' FAILED'}")
            except Exception as exc:  # report and go on (a device fault ends the run anyway)
                row[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                ok_all = False
                log(f"B{B} Sk {sk} {name}: {row[name]['error']}")
            finally:
                for c in cases:
                    c.free()
                    c.out.free()
        for _, ar in sets:
            for x in ar:
                x.free()
        result["rows"].append(row)
        save()

    # -- table
    print()
    print(f"bf16 D{D} H{H}/{HKV} decode; copy {copy:.0f} GB/s; launch floor "
          f"{1e3 * floor:.2f} us (graph of one empty kernel)")
    head = f"{'B':>3} {'Sk':>6} {'MB':>7} {'ideal':>6}"
    for name, _, _, _ in ROUTES:
        head += f" | {name + ' us':>10} {'%copy':>5} {'in-graph':>8} {'%copy':>5}"
    print(head)
    for r in result["rows"]:
        line = f"{r['B']:>3} {r['Sk']:>6} {r['MB']:>7.1f} {r['ideal_us']:>6.2f}"
        for name, _, _, _ in ROUTES:
            c = r.get(name, {})
            if "us" in c:
                line += (f" | {c['us']:>10.2f} {100 * c['of_copy']:>4.0f}% "
                         f"{c['us_graph8']:>8.2f} {100 * c['of_copy_graph8']:>4.0f}%")
            else:
                line += f" | {'FAILED':>10} {'':>5} {'':>8} {'':>5}"
        print(line)
    result["all_ok"] = ok_all
    result["seconds"] = round(time.time() - t0, 1)
    save()
    print(f"\ncorrectness: {'all ok' if ok_all else 'FAILURES (see above)'}; "
          f"{result['seconds']} s; JSON: {a.out}")
    rt.synchronize()
    rt.close()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
