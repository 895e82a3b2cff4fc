#!/usr/bin/env python3
"""Attention paths on the GPU: ``python lab/sweep_attention.py [--out DIR] [--impls ...]``.

Compares ``path="fused"`` (the mma.sync kernel ``tc``), ``path="wg"`` (the sm_90a wgmma
kernel, compute capability 9.0 only) in each main-loop schedule of attention_wg.cu
(``NXRT_WG_SCHED``: impl ``wg`` = the shipped builds, ``wg-s6``, ``wg-s7`` = one
schedule for every call, see :data:`WG_SCHEDULES`; schedules 0-5 were removed, see
``lab/attention_wg_schedules.md``) and, when torch is
importable, torch SDPA's flash and cuDNN backends, on D 64/128, (B, H, S) in
{(8, 32, 1024), (2, 32, 4096), (1, 32, 8192)}, causal and not (TFLOP/s = 4·B·H·S²·D / time,
halved for causal), bf16 (``--dtypes bf16,f16`` adds the f16 rows).

Each of our impls runs in its own worker process (a schedule that faults or hangs costs only
its own cells; a hang ends that impl's column). A ``wg-sN`` worker runs its kernels under an
``AttentionConfig`` whose ``wg_build`` (from which the variant, threads and shared memory
follow) names schedule N for every head dim (what adopting it as the shipped build would
do). A worker first checks its path on small odd shapes (:data:`CHECKS`: f16 and bf16,
MHA/GQA/MQA, causal with Sq < Sk and Sq > Sk, windows, softcap, masks, forced splits, D 64/128)
against the float64 reference (relative Frobenius <= 1e-2 bf16, 2e-3 f16), then times every
sweep case as graph replays of ``execute`` (CUDA events, median of ``--reps``) and
spot-checks a few output rows of each against float64. Every variant is compiled up front in
parallel into the shared compile cache.
The table is printed last; ``--out DIR`` also writes ``DIR/sweep_attention.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
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
os.environ.setdefault("ATTNRT_CACHE_DIR", str(Path(tempfile.gettempdir()) / "nxrt-sweep-cache"))

SHAPES = [(8, 32, 1024), (2, 32, 4096), (1, 32, 8192)]
TOL = {"bf16": 1e-2, "f16": 2e-3}
# Small correctness cases: (dtype, B, H, Hkv, Sq, Sk, D, attrs, mask planes, forced splits)
CHECKS: list[tuple[str, int, int, int, int, int, int, dict, int, int | None]] = [
    ("bf16", 1, 4, 4, 300, 300, 128, {"causal": 1}, 0, None),
    ("bf16", 2, 8, 2, 130, 517, 64, {}, 0, None),
    ("f16", 1, 4, 2, 257, 1000, 128, {}, 0, None),
    ("f16", 1, 4, 4, 200, 200, 64, {"causal": 1}, 0, None),
    ("bf16", 2, 8, 1, 17, 300, 64, {"causal": 1}, 0, None),         # MQA, Sq < Sk
    ("f16", 1, 4, 2, 200, 17, 64, {"causal": 1}, 0, None),          # Sq > Sk: rows see nothing
    ("bf16", 1, 8, 2, 128, 1000, 128, {"softcap": 5.0}, 0, None),
    ("f16", 1, 4, 4, 1000, 1000, 64, {"causal": 1, "local_window_size": 100}, 0, None),
    ("bf16", 1, 4, 2, 17, 1000, 128, {"local_window_size": 0}, 0, None),
    ("f16", 2, 4, 2, 128, 1000, 128, {"scale": 0.05, "softcap": 3.0, "causal": 1}, 8, None),
    ("bf16", 2, 4, 2, 17, 300, 64, {}, 2, None),                    # mask planes = B
    ("f16", 1, 8, 2, 1000, 500, 64, {}, 0, 3),                      # forced splits
    ("bf16", 1, 8, 2, 700, 1000, 128, {"causal": 1}, 0, 5),         # causal + splits
]

#: attention_wg.cu schedules (``NXRT_WG_SCHED``): keys per tile and, per head dim,
#: ``MIN_BLOCKS``. 6: FA3 warp specialisation as a persistent kernel (384 threads: a cp.async
#: producer warpgroup feeding mbarrier rings, two consumer warpgroups ping-ponging their
#: GEMMs; one CTA per SM looping over the work items); 7: 6 with the items dealt longest
#: first in snake order (causal balance). Threads, stages and shared memory follow from the
#: schedule number in attention/builds.py (``wg_threads``, ``wg_smem_bytes``). A ``wg-sN``
#: impl runs schedule N for every call (``WG_CAUSAL`` and ``WG_LONG`` emptied; ``wg-sNkK``:
#: with K keys per tile); impl ``wg`` runs the shipped choice (``WG_BUILD``, ``WG_CAUSAL``,
#: ``WG_LONG``).
WG_SCHEDULES: dict[int, dict[str, Any]] = {
    6: {"keys": 128, "min_blocks": {64: 1, 128: 1}},
    7: {"keys": 128, "min_blocks": {64: 1, 128: 1}},
}
#: Schedules removed from attention_wg.cu (git keeps them; see the note).
REMOVED_SCHEDULES = range(6)
REMOVED_NOTE = "lab/attention_wg_schedules.md"
PEERS = ("flash", "cudnn")


def sched_build(sched: int, keys: int | None = None) -> dict[int, tuple[int, int, int]]:
    """the shipped ``WG_BUILD`` with every head dim at schedule ``sched`` (``keys`` per
    tile: the schedule's own when None).

    Raises
    ------
    KeyError
        ``sched`` is not in :data:`WG_SCHEDULES`.
    """
    cfg = WG_SCHEDULES[sched]
    return {D: (sched, keys or cfg["keys"], mb) for D, mb in cfg["min_blocks"].items()}


def sched_config(sched: int | None, keys: int | None = None) -> Any:
    """The ``AttentionConfig`` that runs every wgmma call at schedule ``sched`` (None: the
    shipped builds)."""
    from attnrt.ops.attention import AttentionConfig

    if sched is None:
        return AttentionConfig()
    return AttentionConfig(wg_build=sched_build(sched, keys), wg_causal={}, wg_long={})


def _sched_smem(sched: int) -> dict[int, int]:
    from attnrt.ops.attention import wg_smem_bytes

    cfg = sched_config(sched)
    return {D: wg_smem_bytes(D, config=cfg) for D in (64, 128)}


def _impl_match(impl: str) -> re.Match[str] | None:
    m = re.fullmatch(r"wg-s(\d+)(?:k(\d+))?", impl)
    return m if m and int(m.group(1)) in WG_SCHEDULES else None


def removed_impls(names: list[str]) -> list[str]:
    """The ``wg-sN`` / ``wg-sNkK`` names among ``names`` whose schedule N was removed from
    attention_wg.cu (see :data:`REMOVED_SCHEDULES`)."""
    out = []
    for name in names:
        m = re.fullmatch(r"wg-s(\d+)(?:k\d+)?", name)
        if m and int(m.group(1)) in REMOVED_SCHEDULES:
            out.append(name)
    return out


def impl_sched(impl: str) -> int | None:
    """The attention_wg.cu schedule an impl name forces (``wg-sN`` or ``wg-sNkK``: N;
    ``wg`` runs the shipped ``WG_BUILD`` / ``WG_CAUSAL`` as shipped; else None)."""
    m = _impl_match(impl)
    return int(m.group(1)) if m else None


def impl_keys(impl: str) -> int | None:
    """Keys per tile an impl name forces (``wg-sNkK``: K, e.g. ``wg-s6k176``; else None)."""
    m = _impl_match(impl)
    return int(m.group(2)) if m and m.group(2) else None


IMPLS = ("fused", "wg") + tuple(f"wg-s{s}" for s in sorted(WG_SCHEDULES)) + ("wg-s6k176",)


def cases(quick: bool, dtypes: tuple[str, ...] = ("bf16",)) -> list[tuple]:
    """Sweep cases: (dtype, D, B, H, S, causal)."""
    shapes = SHAPES[:1] if quick else SHAPES
    return [(dt, D, B, H, S, c) for dt in dtypes for D in (64, 128) for B, H, S in shapes
            for c in (False, True)]


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


def _node(H: int, Hkv: int, attrs: dict, with_mask: bool = False) -> Any:
    from attnrt.runtime.api import Node

    return Node("Attention", "pkg.nxrt", {"num_heads": H, "kv_num_heads": Hkv, **attrs},
                ["q", "k", "v", "mask"] if with_mask else ["q", "k", "v"], ["o"])


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


def worker(impl: str, start: int, quick: bool, reps: int, checks: bool,
           dtypes: tuple[str, ...]) -> None:
    """Print one JSON line per check / case: {"kind", "i", "ok", "tflops", "err", ...}.

    An exception is reported as a failed line and ends the worker with status 3 (its CUDA
    context may be unusable); the parent starts a fresh worker at the next case.
    """
    from bench import BenchContext

    import attnrt
    from attnrt.ops import reference
    from attnrt.ops.attention import AttentionKernel
    from attnrt.runtime.api import WorkspaceView
    from tests._util import rel_fro

    sched = impl_sched(impl)
    base = sched_config(sched, impl_keys(impl) if sched is not None else None)
    path = "fused" if impl == "fused" else "wg"
    rt = attnrt.CudaRuntime(0)
    # This worker never uses torch: blocking its import saves the 2-4 s BenchContext spends
    # importing it (the sweep runs six workers within its time budget).
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    ctx = BenchContext(rt)

    def emit(**kw: Any) -> None:
        print("RESULT " + json.dumps(kw), flush=True)

    def setup(node: Any, host: list[np.ndarray], num_splits: int | None = None) -> tuple:
        arrs = [attnrt.DeviceArray.from_numpy(rt, h) for h in host]
        out = attnrt.DeviceArray(rt, host[0].shape, arrs[0].view().dtype)
        kern = AttentionKernel(rt, node, dataclasses.replace(base, path=path, num_splits=num_splits))
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

    for n, (dt, B, H, Hkv, Sq, Sk, D, attrs, planes, splits) in enumerate(CHECKS if checks
                                                                           else []):
        try:
            rng = np.random.default_rng(n)
            node = _node(H, Hkv, attrs, bool(planes))
            npdt = _np_dtype(dt)
            host = [rng.standard_normal(s, dtype=np.float32).astype(npdt)
                    for s in ((B, H, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D))]
            if planes:
                m = rng.standard_normal((planes, Sq, Sk), dtype=np.float32)
                m[rng.random((planes, Sq, Sk)) < 0.2] = -np.inf  # some keys masked outright
                m[:, Sq // 2, :] = -np.inf  # one row sees nothing: zeros
                host.append(m.astype(npdt))
            call, out, kern, free = setup(node, host, splits)
            try:
                out.fill_bytes(0xFF)
                call()
                rt.synchronize()
                want = reference.attention(node, host, out_dtype=np.float64)
                err = rel_fro(out.numpy(), want)
                p = kern.last_plan
                emit(kind="check", i=n, ok=bool(err <= TOL[dt]), err=err,
                     path=f"{p.path} x{p.splits}")
            finally:
                free()
        except Exception as exc:
            failed("check", n, exc)
    all_cases = cases(quick, dtypes)
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
    node = _node(H, H, {"causal": int(causal)})
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


def torch_worker(quick: bool, reps: int, dtypes: tuple[str, ...]) -> None:
    """Time torch SDPA flash / cuDNN on every case (one JSON line per case and backend)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    F = torch.nn.functional
    for n, c in enumerate(cases(quick, dtypes)):
        dt, D, B, H, S, causal = c
        tdt = torch.bfloat16 if dt == "bf16" else torch.float16
        g = torch.Generator(device="cuda").manual_seed(n)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=tdt, generator=g)
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
        del q, k, v


# --------------------------------------------------------------------------- parent side
def _compile_one(file: str, options: tuple[str, ...], target: str) -> tuple[str, float, str]:
    """Pool job: compile one variant into the shared disk cache (what the workers load)."""
    from attnrt.ops import _common
    from attnrt.runtime.cache import CompileCache

    t0 = time.time()
    try:
        CompileCache(os.environ["ATTNRT_CACHE_DIR"], disk=True).get(
            _common.source(file), file, target, options, _common.headers())
        why = ""
    except Exception as exc:  # the worker will meet (and report) the same error
        why = f"{type(exc).__name__}: {exc}"[:200]
    return f"{file}{list(options)}@{target}", time.time() - t0, why


def precompile(impls: list[str], arch: str = "sm_90") -> None:
    """Compile every variant the selected impls may load, in parallel, before any worker
    starts (NVRTC takes 2-15 s per wgmma variant; serially in the workers that would eat
    most of the time budget). Best effort: a worker compiles whatever is missing."""
    from attnrt.ops import attention as A
    from attnrt.runtime.api import DataType

    jobs: set[tuple[str, tuple[str, ...], str]] = set()
    for impl in impls:
        sched = impl_sched(impl)
        if sched is not None:
            cfg = sched_config(sched, impl_keys(impl))
            for dt in (DataType.FLOAT16, DataType.BFLOAT16):
                for D in (64, 128):
                    v = A.builds.wg_variant(dt, D, config=cfg)
                    jobs.add((v.file, v.options, arch + "a"))
        if impl == "wg":  # as shipped: the causal build too
            for v in A.compile_variants():
                if v.file == "attention_wg.cu":
                    jobs.add((v.file, v.options, arch + "a"))
        if impl == "fused":
            for v in A.compile_variants():
                if v.file == "attention_fused_tc.cu" and v.defines.get("HEAD_DIM") in (64, 128):
                    jobs.add((v.file, v.options, arch))
    for dt in (DataType.FLOAT16, DataType.BFLOAT16):  # split combine (the checks force splits)
        v = A.builds.rows_variant(dt)
        jobs.add((v.file, v.options, arch))
    if not jobs:
        return
    t0 = time.time()
    try:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=max(1, min(len(jobs), (os.cpu_count() or 2) - 1)),
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            futs = [pool.submit(_compile_one, *j) for j in sorted(jobs)]
            slow = []
            for f in futs:
                name, dt, why = f.result()
                if why:
                    print(f"[sweep] precompile {name}: {why}", flush=True)
                slow.append((dt, name))
    except Exception as exc:  # no process pool here: the workers compile on demand
        print(f"[sweep] precompile skipped: {type(exc).__name__}: {exc}", flush=True)
        return
    worst = max(slow)
    print(f"[sweep] precompiled {len(jobs)} variants in {time.time() - t0:.0f} s "
          f"(slowest {worst[0]:.1f} s: {worst[1]})", flush=True)


def _spawn(args: list[str], timeout: float, idle: float = 45.0,
           first: float = 75.0) -> tuple[list[dict], int, str]:
    """Run one worker; its RESULT lines, exit status (124: killed) and stderr tail.

    Killed after ``timeout`` seconds in all, or when no RESULT line came for ``idle`` seconds
    (``first`` for the first line, which may wait for compiles): a hung kernel costs ~idle
    seconds of the budget, not the whole of it.
    """
    import queue
    import threading

    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: queue.Queue = queue.Queue()
    err_chunks: list[str] = []

    def pump_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def pump_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err_chunks.append(line)
            del err_chunks[:-50]

    threads = [threading.Thread(target=f, daemon=True) for f in (pump_out, pump_err)]
    for t in threads:
        t.start()
    res: list[dict] = []
    end = time.time() + timeout
    killed = False
    while True:
        wait = min(end - time.time(), idle if res else first)
        try:
            line = lines.get(timeout=max(0.1, wait))
        except queue.Empty:
            proc.kill()
            killed = True
            break
        if line is None:
            break
        if line.startswith("RESULT "):
            try:
                res.append(json.loads(line[7:]))
            except ValueError:  # a line cut short by a dying worker
                pass
        if time.time() > end:
            proc.kill()
            killed = True
            break
    rc = proc.wait()
    for t in threads:
        t.join(timeout=2)
    err = "".join(err_chunks)
    return res, (124 if killed else rc), (err + ("\ntimeout" if killed else ""))[-600:]


def _fmt_check(c: tuple) -> str:
    dt, B, H, Hkv, Sq, Sk, D, attrs, planes, splits = c
    extra = ",".join(f"{k[:6]}={v}" for k, v in attrs.items())
    return (f"{dt} B{B} H{H}/{Hkv} q{Sq} k{Sk} D{D}" + (f" {extra}" if extra else "")
            + (f" mask{planes}" if planes else "") + (f" splits{splits}" if splits else ""))


def run_impl(impl: str, all_cases: list[tuple], common: list[str], deadline: float,
             table: dict, results: dict, checks: dict) -> None:
    """Run one impl's column: checks, then every case, in as many workers as it takes."""
    start, with_checks, spawns = 0, True, 0
    checks[impl] = []
    want_path = "tc" if impl == "fused" else "wg"
    while start < len(all_cases):
        left = deadline - time.time()
        why = ("out of time budget" if left < 5 else
               "5 workers died: column stopped" if spawns >= 5 else "")
        if why:  # a column whose workers keep dying must not eat the others' budget
            checks[impl].append(f"{why} at case {start}")
            for n in range(start, len(all_cases)):
                table.setdefault((n, impl), "skip")
            return
        spawns += 1
        res, rc, err = _spawn(["--worker", impl, "--start", str(start), *common]
                              + (["--checks"] if with_checks else []), min(150.0, left))
        for r in res:
            if r["kind"] == "check":
                ok = r["ok"]
                checks[impl].append(
                    f"#{r['i']} {_fmt_check(CHECKS[r['i']])}: "
                    + (f"err {r['err']:.2e}" if ok else
                       f"FAILED err {r['err']:.2e} {r.get('why', '')}") + f" ({r['path']})")
                results.setdefault("checks", {}).setdefault(impl, []).append(
                    dict(r, case=_fmt_check(CHECKS[r["i"]])))
            elif r["ok"]:
                cell = f"{r['tflops']:.0f}"
                if r["path"] != want_path:
                    cell += f"[{r['path']}]"
                table[(r["i"], impl)] = cell
                results["cases"][r["i"]]["impls"][impl] = r
            else:
                table[(r["i"], impl)] = "FAILED"
                results["cases"][r["i"]]["impls"][impl] = r
                print(f"[sweep] {impl} {case_name(all_cases[r['i']])}: FAILED err "
                      f"{r['err']:.2e} {r.get('why', '')}", flush=True)
        done = [r["i"] for r in res if r["kind"] == "case"]
        last = (err.strip().splitlines() or [""])[-1][:200]
        if rc == 124:  # a hang (or the budget): do not start it again
            nxt = max(done) + 1 if done else start
            where = case_name(all_cases[nxt]) if nxt < len(all_cases) else "the end"
            print(f"[sweep] {impl} worker timed out at {where}; its column stops", flush=True)
            checks[impl].append(f"worker timed out at {where}"
                                + (" (during the checks)" if with_checks and not done else ""))
            for n in range(nxt, len(all_cases)):
                table[(n, impl)] = "HANG" if n == nxt else "skip"
            return
        died_in_checks = with_checks and not done and rc != 0
        with_checks = False
        if died_in_checks:
            if not res or res[-1]["ok"]:
                checks[impl].append(f"worker died during the checks (rc {rc}): {last}")
            continue  # once more from the same case, without the checks
        nxt = max(done) + 1 if done else start
        if rc not in (0, 3) and nxt < len(all_cases):
            table[(nxt, impl)] = "FAILED"
            print(f"[sweep] {impl} worker died at case {nxt} ({case_name(all_cases[nxt])}): "
                  f"rc {rc} {last}", flush=True)
            nxt += 1
        elif nxt == start:  # no progress and no case to blame: stop this column
            if rc != 0:
                checks[impl].append(f"worker exited {rc}: {last}")
            break
        start = nxt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20, help="timed repetitions per case (>= 5)")
    ap.add_argument("--quick", action="store_true", help="only the (8, 32, 1024) shape")
    ap.add_argument("--impls", default=",".join(IMPLS + PEERS),
                    help=f"comma list of {', '.join(IMPLS + PEERS)} (default: all)")
    ap.add_argument("--dtypes", default="bf16", help="comma list of bf16, f16 (default bf16)")
    ap.add_argument("--out", default=None, help="directory for sweep_attention.json")
    ap.add_argument("--budget", type=float, default=175.0,
                    help="seconds for the whole run; impls not reached are skipped")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--checks", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    reps = max(5, a.reps)
    dtypes = tuple(d.strip() for d in a.dtypes.split(",") if d.strip())
    bad = [d for d in dtypes if d not in TOL]
    if bad or not dtypes:
        ap.error(f"--dtypes: unknown {bad}; choose from {sorted(TOL)}")
    if a.worker == "torch":
        torch_worker(a.quick, reps, dtypes)
        return 0
    removed = removed_impls([a.worker] if a.worker else [s.strip() for s in a.impls.split(",")])
    if removed:
        ap.error(f"{', '.join(removed)}: schedules 0-5 are no longer in attention_wg.cu; "
                 f"{REMOVED_NOTE} says how to get them back")
    if a.worker:
        if a.worker not in IMPLS:
            ap.error(f"--worker {a.worker!r}: not one of {IMPLS}")
        worker(a.worker, a.start, a.quick, reps, a.checks, dtypes)
        return 0

    t0 = time.time()
    deadline = t0 + a.budget
    selected = [s.strip() for s in a.impls.split(",") if s.strip()]
    unknown = [s for s in selected if s not in IMPLS + PEERS]
    if unknown:
        ap.error(f"--impls: unknown {unknown}; choose from {', '.join(IMPLS + PEERS)}")
    ours = [i for i in IMPLS if i in selected]
    peers = [p for p in PEERS if p in selected]
    all_cases = cases(a.quick, dtypes)
    common = ["--reps", str(reps), "--dtypes", ",".join(dtypes)] + (["--quick"] if a.quick else [])
    results: dict[str, Any] = {
        "cases": [dict(name=case_name(c), dtype=c[0], D=c[1], B=c[2], H=c[3], S=c[4],
                       causal=c[5], flop=flops(c), impls={}) for c in all_cases],
        "schedules": {str(s): dict(cfg, smem=_sched_smem(s)) for s, cfg in WG_SCHEDULES.items()},
        "reps": reps,
    }
    table: dict[tuple[int, str], str] = {}
    checks: dict[str, list[str]] = {}
    precompile(ours)

    have_torch = False
    if peers:
        try:
            import torch

            have_torch = torch.cuda.is_available()
        except Exception:
            have_torch = False
    if have_torch:
        # Peers first: they need no compiles and bound the time the rest may take.
        res, rc, err = _spawn(["--worker", "torch", *common], min(120.0, deadline - time.time()))
        for r in res:
            if r["impl"] in peers:
                table[(r["i"], r["impl"])] = f"{r['tflops']:.0f}" if r["ok"] else "n/a"
                results["cases"][r["i"]]["impls"][r["impl"]] = r
        if rc != 0:
            print(f"[sweep] torch worker exited {rc}: {err.strip()[-200:]}", flush=True)
    # The forced schedules first (the budget skips whatever is left at the end), then today's
    # wg and the mma.sync kernel.
    order = sorted(ours, key=lambda i: (impl_sched(i) is None, i == "fused"))
    for impl in order:
        run_impl(impl, all_cases, common, deadline, table, results, checks)

    for impl in ours:
        print(f"check {impl}:")
        for line in checks[impl] or ["none"]:
            print(f"    {line}")
    cols = ours + (peers if have_torch else [])
    wgs = [i for i in ours if impl_sched(i) is not None]
    head = (f"{'case (TFLOP/s)':<30}" + "".join(f"{c:>9}" for c in cols)
            + (f"{'best wg':>9}{'/flash':>8}" if wgs else ""))
    print(head)
    print("-" * len(head))
    for n, c in enumerate(all_cases):
        cells = [table.get((n, col), "-") for col in cols]
        tail = ""
        if wgs:
            vals = []
            for i in wgs:
                try:
                    vals.append((float(table[(n, i)]), i))
                except (KeyError, ValueError):
                    pass
            best = max(vals) if vals else None
            try:
                ratio = f"{best[0] / float(table[(n, 'flash')]):.2f}" if best else "-"
            except (KeyError, ValueError, ZeroDivisionError):
                ratio = "-"
            tail = f"{best[1] if best else '-':>9}{ratio:>8}"
            results["cases"][n]["best_wg"] = best[1] if best else None
        print(f"{case_name(c):<30}" + "".join(f"{x:>9}" for x in cells) + tail)
    elapsed = time.time() - t0
    print(f"[sweep] {elapsed:.0f} s")
    results["elapsed_s"] = elapsed
    results["table"] = {f"{case_name(all_cases[n])}|{col}": v for (n, col), v in table.items()}
    results["check_lines"] = checks
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep_attention.json").write_text(json.dumps(results, indent=1, default=str))
        print(f"[sweep] wrote {out / 'sweep_attention.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
