#!/usr/bin/env python3
"""Attention paths on the GPU: ``python tools/sweep_attention.py [--reps N] [--quick]``.

Compares ``path="fused"`` (the mma.sync kernel ``tc``) with ``path="wg"`` (the sm_90a wgmma
kernel, compute capability 9.0 only) and, when torch is importable, torch SDPA's flash and
cuDNN backends, on bf16 D 64/128, (B, H, S) in {(8, 32, 1024), (2, 32, 4096), (1, 32, 8192)},
causal and not (TFLOP/s = 4·B·H·S²·D / time, halved for causal).

Each of our paths runs in its own worker process (the wgmma kernel has not been measured
before: a device fault must only cost its own cells). A worker first checks its path on
small odd shapes (f16 and bf16, MHA and GQA, causal and not, D 64/128, Sq < Sk) against the
float64 reference (relative Frobenius <= 1e-2 bf16, 2e-3 f16), then times every sweep case
as graph replays of ``execute`` (CUDA events, median of ``--reps`` >= 20) and spot-checks
a few output rows of each against float64. A worker that dies marks its current case FAILED
and a fresh worker continues with the next one. The table is printed last.
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
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
# One compile cache for every worker (and platformdirs may be missing there).
os.environ.setdefault("NXRT_CACHE_DIR", str(Path(tempfile.gettempdir()) / "nxrt-sweep-cache"))

SHAPES = [(8, 32, 1024), (2, 32, 4096), (1, 32, 8192)]
TOL = {"bf16": 1e-2, "f16": 2e-3}
# Small correctness cases: (dtype, B, H, Hkv, Sq, Sk, D, causal)
CHECKS = [("bf16", 1, 4, 4, 300, 300, 128, 1), ("bf16", 2, 8, 2, 130, 517, 64, 0),
          ("f16", 1, 4, 2, 257, 1000, 128, 0), ("f16", 1, 4, 4, 200, 200, 64, 1)]
IMPLS = ("fused", "wg")
PEERS = ("flash", "cudnn")


def cases(quick: bool) -> list[tuple[str, int, int, int, int, bool]]:
    """Sweep cases: (dtype, D, B, H, S, causal)."""
    shapes = SHAPES[:1] if quick else SHAPES
    return [("bf16", D, B, H, S, c) for D in (64, 128) for B, H, S in shapes for c in (False, True)]


def case_name(c: tuple) -> str:
    dt, D, B, H, S, causal = c
    return f"{dt} D{D} B{B} H{H} S{S} {'causal' if causal else 'full'}"


def flops(c: tuple) -> float:
    _, D, B, H, S, causal = c
    return 4.0 * B * H * S * S * D / (2 if causal else 1)


# --------------------------------------------------------------------------- worker side
def _np_dtype(dt: str) -> Any:
    import ml_dtypes

    return ml_dtypes.bfloat16 if dt == "bf16" else np.float16


def _node(H: int, Hkv: int, causal: bool) -> Any:
    from nxrt.api import Node

    return Node("Attention", "pkg.nxrt", {"num_heads": H, "kv_num_heads": Hkv,
                                          "causal": int(causal)}, ["q", "k", "v"], ["o"])


def _rand(rng: np.random.Generator, shape: tuple, dt: str) -> np.ndarray:
    # Tile a 1M-value random pool: the 8192-token tensors need no 100M-draw generation.
    pool = rng.standard_normal(1 << 20, dtype=np.float32).astype(_np_dtype(dt))
    return np.resize(pool, shape)


def _rows_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, idx: list[tuple[int, int, int]],
              causal: bool, G: int) -> np.ndarray:
    """float64 attention of selected (b, h, i) query rows (bottom-right causal alignment)."""
    Sq, Sk, D = q.shape[2], k.shape[2], q.shape[3]
    out = []
    for b, h, i in idx:
        qi = q[b, h, i].astype(np.float64)
        kk = k[b, h // G].astype(np.float64)
        vv = v[b, h // G].astype(np.float64)
        s = kk @ qi / math.sqrt(D)
        if causal:
            s[np.arange(Sk) > Sk - Sq + i] = -np.inf
        p = np.exp(s - s.max())
        out.append(p @ vv / p.sum())
    return np.stack(out)


def worker(impl: str, start: int, quick: bool, reps: int, checks: bool) -> None:
    """Print one JSON line per check / case: {"kind", "i", "ok", "tflops", "err", ...}.

    An exception is reported as a failed line and ends the worker with status 3 (its CUDA
    context may be unusable); the parent starts a fresh worker at the next case.
    """
    from bench import BenchContext

    import nxrt
    from nxrt.api import WorkspaceView
    from nxrt_kernels import reference
    from nxrt_kernels.attention import AttentionKernel
    from tests._util import rel_fro

    rt = nxrt.CudaRuntime(0)
    ctx = BenchContext(rt)

    def emit(**kw: Any) -> None:
        print("RESULT " + json.dumps(kw), flush=True)

    def setup(node: Any, host: list[np.ndarray]) -> tuple:
        arrs = [nxrt.DeviceArray.from_numpy(rt, h) for h in host]
        out = nxrt.DeviceArray(rt, host[0].shape, arrs[0].view().dtype)
        kern = AttentionKernel(rt, node, path=impl)
        views = [a.view() for a in arrs]
        req = kern.workspace_requirement([t.meta for t in views])
        ws_ptr = rt.alloc_raw(req.nbytes) if req.nbytes else 0
        ws = WorkspaceView(ws_ptr, req.nbytes) if req.nbytes else None

        def call() -> None:
            kern.execute(views, [out.mut()], ws)

        def free() -> None:
            for a in arrs + [out]:
                a.free()
            if ws_ptr:
                rt.free_raw(ws_ptr)
        return call, out, kern, free

    def failed(kind: str, n: int, exc: BaseException) -> None:
        emit(kind=kind, i=n, ok=False, err=float("nan"), path="-",
             why=f"{type(exc).__name__}: {exc}"[:300])
        sys.exit(3)

    for n, (dt, B, H, Hkv, Sq, Sk, D, causal) in enumerate(CHECKS if checks else []):
        try:
            rng = np.random.default_rng(n)
            node = _node(H, Hkv, bool(causal))
            host = [rng.standard_normal(s, dtype=np.float32).astype(_np_dtype(dt))
                    for s in ((B, H, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D))]
            call, out, kern, free = setup(node, host)
            try:
                out.fill_bytes(0xFF)
                call()
                rt.synchronize()
                want = reference.attention(node, host, out_dtype=np.float64)
                err = rel_fro(out.numpy(), want)
                emit(kind="check", i=n, ok=bool(err <= TOL[dt]), err=err,
                     path=kern.last_plan.path)
            finally:
                free()
        except Exception as exc:
            failed("check", n, exc)
    all_cases = cases(quick)
    for n in range(start, len(all_cases)):
        try:
            _time_case(n, all_cases[n], setup, emit, ctx, rt, reps, rel_fro)
        except Exception as exc:
            failed("case", n, exc)
    rt.synchronize()
    rt.close()


def _time_case(n: int, c: tuple, setup: Any, emit: Any, ctx: Any, rt: Any, reps: int,
               rel_fro: Any) -> None:
    """Check a few rows of one sweep case against float64, then time it (one RESULT line)."""
    dt, D, B, H, S, causal = c
    rng = np.random.default_rng(100 + n)
    host = [_rand(rng, (B, H, S, D), dt) for _ in range(3)]
    node = _node(H, H, causal)
    call, out, kern, free = setup(node, host)
    try:
        out.fill_bytes(0xFF)
        call()
        rt.synchronize()
        got = out.numpy()
        idx = [(B - 1, H - 1, S - 1), (0, 0, 0), (0, H // 2, S // 2), (B // 2, 1, 77)]
        want = _rows_ref(host[0], host[1], host[2], idx, causal, 1)
        err = rel_fro(np.stack([got[b, h, i] for b, h, i in idx]), want)
        call()  # warm, then one captured replay per timed repetition
        rt.synchronize()
        with rt.capture() as graph:
            call()
        try:
            ms = ctx.time_ours(graph.replay, reps=reps)
        finally:
            graph.destroy()
        emit(kind="case", i=n, ok=bool(err <= TOL[dt]), err=err, ms=ms,
             tflops=flops(c) / ms / 1e9, path=kern.last_plan.path)
    finally:
        free()


def torch_worker(quick: bool, reps: int) -> None:
    """Time torch SDPA flash / cuDNN on every case (one JSON line per case and backend)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    F = torch.nn.functional
    for n, c in enumerate(cases(quick)):
        dt, D, B, H, S, causal = c
        g = torch.Generator(device="cuda").manual_seed(n)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(3))
        for name, be in backends.items():
            try:
                def call(be: Any = be, q: Any = q, k: Any = k, v: Any = v,
                         causal: bool = causal) -> Any:
                    with sdpa_kernel(be):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                for _ in range(3):
                    call()
                torch.cuda.synchronize()
                times = []
                for _ in range(reps):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    call()
                    b.record()
                    b.synchronize()
                    times.append(a.elapsed_time(b))
                ms = float(np.median(times))
                print("RESULT " + json.dumps(dict(kind="case", i=n, impl=name, ok=True, ms=ms,
                                                  tflops=flops(c) / ms / 1e9)), flush=True)
            except Exception as exc:  # a backend that declines the case
                print("RESULT " + json.dumps(dict(kind="case", i=n, impl=name, ok=False,
                                                  why=str(exc)[:120])), flush=True)


# --------------------------------------------------------------------------- parent side
def _spawn(args: list[str], timeout: float) -> tuple[list[dict], int, str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, rc, err = r.stdout, r.returncode, r.stderr
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc, err = 124, "timeout"
    res = []
    for line in out.splitlines():
        if line.startswith("RESULT "):
            try:
                res.append(json.loads(line[7:]))
            except ValueError:  # a line cut short by a dying worker
                pass
    return res, rc, err[-600:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", choices=IMPLS + ("torch",))
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--checks", action="store_true")
    a = ap.parse_args(argv)
    reps = max(20, a.reps)
    if a.worker == "torch":
        torch_worker(a.quick, reps)
        return 0
    if a.worker:
        worker(a.worker, a.start, a.quick, reps, a.checks)
        return 0

    t0 = time.time()
    all_cases = cases(a.quick)
    table: dict[tuple[int, str], str] = {}
    checks: dict[str, list[str]] = {}
    for impl in IMPLS:
        start, checks[impl], with_checks = 0, [], True
        while start < len(all_cases):
            res, rc, err = _spawn(["--worker", impl, "--start", str(start), "--reps", str(reps)]
                                  + (["--quick"] if a.quick else [])
                                  + (["--checks"] if with_checks else []), 240)
            for r in res:
                if r["kind"] == "check":
                    checks[impl].append(
                        f"{CHECKS[r['i']][0]}#{r['i']} " + (f"err {r['err']:.2e}" if r["ok"] else
                        f"FAILED err {r['err']:.2e} {r.get('why', '')}") + f" ({r['path']})")
                elif r["ok"]:
                    cell = f"{r['tflops']:.0f}"
                    if r["path"] != ("tc" if impl == "fused" else impl):
                        cell += f"[{r['path']}]"
                    table[(r["i"], impl)] = cell
                else:
                    table[(r["i"], impl)] = "FAILED"
                    print(f"[sweep] {impl} {case_name(all_cases[r['i']])}: FAILED err "
                          f"{r['err']:.2e} {r.get('why', '')}", flush=True)
            done = [r["i"] for r in res if r["kind"] == "case"]
            died_in_checks = with_checks and not done and rc != 0
            with_checks = False
            if died_in_checks:
                if not res or res[-1]["ok"]:
                    checks[impl].append(f"worker died during the checks (rc {rc}): "
                                        + (err.strip().splitlines() or [""])[-1][:200])
                continue  # once more from the same case, without the checks
            nxt = max(done) + 1 if done else start
            if rc not in (0, 3) and nxt < len(all_cases):
                table[(nxt, impl)] = "FAILED"
                print(f"[sweep] {impl} worker died at case {nxt} ({case_name(all_cases[nxt])}): "
                      f"rc {rc} {(err.strip().splitlines() or [''])[-1][:200]}", flush=True)
                nxt += 1
            elif nxt == start:  # no progress and no case to blame: stop this column
                break
            start = nxt
    try:
        import torch

        have_torch = torch.cuda.is_available()
    except Exception:
        have_torch = False
    if have_torch:
        res, rc, err = _spawn(["--worker", "torch", "--reps", str(reps)]
                              + (["--quick"] if a.quick else []), 240)
        for r in res:
            table[(r["i"], r["impl"])] = f"{r['tflops']:.0f}" if r["ok"] else "n/a"
        if rc != 0:
            print(f"[sweep] torch worker exited {rc}: {err.strip()[-200:]}", flush=True)

    for impl in IMPLS:
        print(f"check {impl}: " + ("; ".join(checks[impl]) or "none"))
    cols = list(IMPLS) + (list(PEERS) if have_torch else [])
    head = f"{'case (TFLOP/s)':<30}" + "".join(f"{c:>14}" for c in cols) + f"{'wg/fused':>10}"
    print(head)
    print("-" * len(head))
    for n, c in enumerate(all_cases):
        cells = [table.get((n, col), "-") for col in cols]
        try:
            ratio = f"{float(table[(n, 'wg')]) / float(table[(n, 'fused')]):.2f}"
        except (KeyError, ValueError, ZeroDivisionError):
            ratio = "-"
        print(f"{case_name(c):<30}" + "".join(f"{x:>14}" for x in cells) + f"{ratio:>10}")
    print(f"[sweep] {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
