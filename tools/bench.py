#!/usr/bin/env python3
"""attnrt benchmarks: ``python tools/bench.py [runtime|attention|paged|index_share|all] [--out DIR]``.

Every run measures its own ceilings (device-to-device copy bandwidth; a bf16 GEMM through
torch when importable) and its peers in the same process, then writes one result per
benchmark, ``<out>/<op>.json`` (``runtime``, ``attention``, ``paged_attention``,
``index_share``, ``index_share_batch``; by default into ``benchmarks/latest/``, the files
the README's numbers are generated from by ``tools/readme_numbers.py``), a markdown table
beside each, and PNG plots when matplotlib is importable. ``--name NAME`` writes the whole
run as ``<out>/NAME.json`` instead (and the per-op files only where ``--latest`` says).
Each ``tools/bench_<name>.py`` module has ``run(ctx) -> list[dict]``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import attnrt  # noqa: E402
from attnrt.runtime._check import check, driver  # noqa: E402

BENCHES = ("runtime", "attention", "paged", "index_share", "index_share_batch")

#: Where new results go by default: one file set per benchmark, named by :func:`op_file`.
LATEST = ROOT / "benchmarks" / "latest"

#: A benchmark's file name in ``benchmarks/latest/`` where it differs from the op's name.
_OP_FILES = {"paged": "paged_attention"}


def op_file(bench: str) -> str:
    """The base name of a benchmark's result files in ``benchmarks/latest/``."""
    return _OP_FILES.get(bench, bench)


def split_by_bench(result: dict) -> dict[str, dict]:
    """One result per benchmark: the run's fields with only that benchmark's rows, keyed by
    :func:`op_file` of its name, in the order the rows came."""
    out: dict[str, dict] = {}
    for r in result["rows"]:
        out.setdefault(op_file(r["bench"]), {**result, "rows": []})["rows"].append(r)
    return out


def write_result(result: dict, out: Path, base: str, extra: str = "") -> str:
    """Write ``base.json``, ``base.md`` (the table, then ``extra``) and (with matplotlib)
    ``base.png`` into ``out``; return the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{base}.json").write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(result) + extra
    (out / f"{base}.md").write_text(md)
    plot(result, out / f"{base}.png")
    return md

#: Milliseconds of back-to-back calls before each timed series (``--warm-ms``), as
#: ``triton.testing.do_bench``'s default warm-up (25 ms).
WARM_MS = 25.0

#: Milliseconds of back-to-back calls behind a row's sustained state (``--state-ms``):
#: nvidia-smi refreshes its readings about every 100 ms, so a second gives ~8 of them.
STATE_MS = 1000.0

#: nvidia-smi's ``clocks_throttle_reasons.active`` bits (NVML's clock event reasons).
THROTTLE_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
                 0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
                 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
                 0x100: "display_clock_setting"}


def throttle_names(mask: int) -> list[str]:
    """The reasons set in a throttle bit mask (unknown bits as hex)."""
    names = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_BITS)
    return names + ([hex(rest)] if rest else [])


SMI_TIME = "%Y/%m/%d %H:%M:%S.%f"  # nvidia-smi's ``timestamp`` field


def parse_smi_samples(text: str, since: _dt.datetime | None = None) -> dict[str, Any] | None:
    """Summarise nvidia-smi lines ``timestamp, clocks.sm, <power field>,
    clocks_throttle_reasons.active`` (``--format=csv,noheader,nounits``): SM clock min /
    median (MHz), power median / max (W) and every throttle reason seen, over the samples
    stamped at or after ``since`` (nvidia-smi's local time). nvidia-smi refreshes its
    readings about every 100 ms, so a faster poll repeats them: a reading equal to the one
    before it counts once. None without a parsable sample."""
    clk, pw, mask, last = [], [], 0, None
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            t = _dt.datetime.strptime(parts[0], SMI_TIME)
            c, w, m = float(parts[1]), float(parts[2]), int(parts[3], 16)
        except ValueError:  # "[N/A]", an error message
            continue
        if (since is not None and t < since) or (c, w, m) == last:
            continue
        last = (c, w, m)
        clk.append(c)
        pw.append(w)
        mask |= m
    if not clk:
        return None
    return {"samples": len(clk), "sm_clock_mhz_min": min(clk),
            "sm_clock_mhz_median": float(np.median(clk)),
            "power_w_median": round(float(np.median(pw)), 1), "power_w_max": round(max(pw), 1),
            "throttle": throttle_names(mask)}


class DeviceSampler:
    """nvidia-smi sampling the SM clock, power draw and throttle reasons of one GPU
    (``gpu_id``, as ``--id`` takes it; None: every GPU) every ``period_ms`` while the
    ``with`` block runs, into a temporary file; ``summary`` afterwards
    (:func:`parse_smi_samples` over the samples after :meth:`mark`, or all of them; None
    when nvidia-smi is missing or printed nothing parsable). The block starts after the
    first sample, or after ``first_s`` seconds without one (then nothing is sampled).

    Power is ``power.draw.instant`` where the driver has it: on Ampere and newer,
    ``power.draw`` is an average over the last second, longer than most sampled runs. The
    summary's ``power_field`` says which one was read."""

    POWER_FIELDS = ("power.draw.instant", "power.draw")
    _fields: dict[tuple[str, ...], str] = {}  # the power field per nvidia-smi and --id

    def __init__(self, gpu_id: str | None, period_ms: int = 100, first_s: float = 10.0) -> None:
        self.first_s = first_s
        self.cmd = None
        self.power_field: str | None = None
        exe = shutil.which("nvidia-smi")
        ids = [f"--id={gpu_id}"] if gpu_id else []
        if exe:
            self.power_field = self._power_field(exe, ids)
            query = f"timestamp,clocks.sm,{self.power_field},clocks_throttle_reasons.active"
            self.cmd = [exe, f"--query-gpu={query}", "--format=csv,noheader,nounits",
                        f"-lms={int(period_ms)}", *ids]
        self._proc: subprocess.Popen | None = None
        self._file: Any = None
        self._since: _dt.datetime | None = None
        self.summary: dict[str, Any] | None = None

    @classmethod
    def _power_field(cls, exe: str, ids: list[str]) -> str:
        """The first of POWER_FIELDS this nvidia-smi reads as a number (asked once)."""
        key = (exe, *ids)
        if key not in cls._fields:
            cls._fields[key] = cls.POWER_FIELDS[-1]
            for f in cls.POWER_FIELDS[:-1]:
                try:
                    r = subprocess.run([exe, f"--query-gpu={f}", "--format=csv,noheader,nounits",
                                        *ids], capture_output=True, text=True, timeout=10)
                    float(r.stdout.splitlines()[0])
                    cls._fields[key] = f
                    break
                except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                    continue
        return cls._fields[key]

    def mark(self) -> None:
        """From now on: samples stamped earlier are left out of the summary."""
        self._since = _dt.datetime.now()

    def __enter__(self) -> DeviceSampler:
        if not self.cmd:
            return self
        self._file = tempfile.TemporaryFile(mode="w+")
        try:
            self._proc = subprocess.Popen(self.cmd, stdout=self._file,
                                          stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self._proc = None
            return self
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < self.first_s:  # the first complete line
            self._file.seek(0)
            if "\n" in self._file.read():
                return self
            if self._proc.poll() is not None:
                break
            time.sleep(0.005)
        self._stop()  # silent or gone: sample nothing
        self._proc = None
        return self

    def _stop(self) -> str:
        assert self._proc is not None and self._file is not None
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._file.seek(0)
        text = self._file.read()
        self._file.close()
        return text

    def __exit__(self, *exc: Any) -> None:
        if self._proc is None:
            return
        self.summary = parse_smi_samples(self._stop(), self._since)
        if self.summary is not None:
            self.summary["power_field"] = self.power_field


class BenchContext:
    """What a benchmark module gets: the runtime, torch (or None), ceilings and timers."""

    def __init__(self, rt: attnrt.CudaRuntime, quick: bool = False, warm_ms: float = WARM_MS,
                 state_ms: float = STATE_MS) -> None:
        self.rt = rt
        self.quick = quick
        self.warm_ms = _nonneg_ms(warm_ms)
        self.state_ms = _nonneg_ms(state_ms)
        try:
            import torch

            self.torch = torch if torch.cuda.is_available() else None
        except Exception:
            self.torch = None
        self.ceilings: dict[str, float] = {}
        self._start = check(driver.cuEventCreate(0), "cuEventCreate")
        self._stop = check(driver.cuEventCreate(0), "cuEventCreate")

    def log(self, msg: str) -> None:
        print(f"[bench] {msg}", flush=True)

    def keep_busy(self, fn: Callable[[], Any], sync: Callable[[], None],
                   ms: float | None = None) -> None:
        """Run ``fn`` back to back for ``ms`` (default ``warm_ms``) of wall time, then ``sync``.

        A case's set-up (inputs, compiling, capturing) leaves the device idle, and after only
        a few warm-up calls the first timed samples of a call of some microseconds read up to
        ~2 us slow (H200, IndexShare decode; nvidia-smi's 50 ms samples show the SM clock at
        its maximum throughout, so whatever state it is lies below that resolution:
        docs/notes/index_share-history.md, round 12). Calls go in chunks (1, 2, 4, ... 256
        calls, a sync after each) until ``ms`` has passed.
        """
        ms = self.warm_ms if ms is None else ms
        t0 = time.perf_counter()
        chunk = 1
        while (time.perf_counter() - t0) * 1e3 < ms:
            for _ in range(chunk):
                fn()
            sync()
            chunk = min(2 * chunk, 256)

    def gpu_uuid(self) -> str | None:
        """This device's UUID as nvidia-smi names it (GPU-xxxxxxxx-...), None if unknown."""
        try:
            u = check(driver.cuDeviceGetUuid(self.rt.device.handle), "cuDeviceGetUuid").bytes
        except Exception:
            return None
        h = bytes(u).hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    def sustained_state(self, fn: Callable[[], Any], sync: Callable[[], None] | None = None
                        ) -> dict[str, Any] | None:
        """The device state ``fn`` settles in when run back to back for ``state_ms``
        (chunks as the warm-up, ``sync`` after each; default: this runtime's): nvidia-smi's
        SM clock, power and throttle reasons (:func:`parse_smi_samples`) over the run after
        its first 20 % (the clocks settle; the sampler starts before the run, so no idle gap
        is sampled). None when ``state_ms`` is 0, nvidia-smi is missing or this device's
        UUID is unknown. Run it after a row's timed series: the sampler does not run beside
        the timing."""
        gpu = self.gpu_uuid()
        if self.state_ms <= 0 or gpu is None:
            return None
        sync = sync or self.rt.synchronize
        with DeviceSampler(gpu) as smp:
            self.keep_busy(fn, sync, 0.2 * self.state_ms)
            smp.mark()
            self.keep_busy(fn, sync, 0.8 * self.state_ms)
        return smp.summary

    def time_ours(self, fn: Callable[[], None], warmup: int = 3, reps: int = 20) -> float:
        """Median milliseconds of ``fn`` (which enqueues work on ``rt.stream``), by device events,
        after ``warmup`` calls and ``warm_ms`` of back-to-back calls."""
        s = self.rt.stream.handle
        for _ in range(warmup):
            fn()
        self.rt.synchronize()
        self.keep_busy(fn, self.rt.synchronize)
        times = []
        for _ in range(reps):
            check(driver.cuEventRecord(self._start, s), "cuEventRecord")
            fn()
            check(driver.cuEventRecord(self._stop, s), "cuEventRecord")
            check(driver.cuEventSynchronize(self._stop), "cuEventSynchronize")
            times.append(check(driver.cuEventElapsedTime(self._start, self._stop), "cuEventElapsedTime"))
        return float(np.median(times))

    def time_torch(self, fn: Callable[[], Any], warmup: int = 3, reps: int = 20) -> float:
        """Median milliseconds of a torch callable on torch's current stream (warmed as
        :meth:`time_ours`)."""
        torch = self.torch
        assert torch is not None
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        self.keep_busy(fn, torch.cuda.synchronize)
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return float(np.median(times))

    def time_torch_graph(self, fns: list[Callable[[], Any]], repeat: int, warmup: int = 3,
                         reps: int = 20, states: list | None = None) -> float:
        """Median milliseconds per call of ``fns`` run ``repeat`` times over, all captured in
        one torch CUDA graph (each fn is run once eagerly first: allocations, autotuning).
        ``states``: the graph's :meth:`sustained_state` is appended to it."""
        torch = self.torch
        assert torch is not None
        for fn in fns:
            fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(repeat):
                for fn in fns:
                    fn()
        ms = self.time_torch(graph.replay, warmup=warmup, reps=reps) / (repeat * len(fns))
        if states is not None:
            states.append(self.sustained_state(graph.replay, torch.cuda.synchronize))
        return ms

    def measure_ceilings(self) -> dict[str, float]:
        nbytes = (256 << 20) if self.quick else (2 << 30)
        src, dst = self.rt.alloc_raw(nbytes), self.rt.alloc_raw(nbytes)
        try:
            self.rt.memset(src, 0x3C, nbytes)
            ms = self.time_ours(lambda: self.rt.dtod(dst, src, nbytes), warmup=2, reps=10)
            self.ceilings["copy_GBps"] = round(2 * nbytes / ms / 1e6, 1)
        finally:
            self.rt.free_raw(src)
            self.rt.free_raw(dst)
        if self.torch is not None:
            torch = self.torch
            n = 4096 if self.quick else 8192
            g = torch.Generator(device="cuda").manual_seed(0)
            a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
            b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
            ms = self.time_torch(lambda: a @ b, warmup=3, reps=10)
            self.ceilings["gemm_bf16_TFLOPs"] = round(2 * n**3 / ms / 1e9, 1)
            del a, b
        self.log(f"ceilings: {self.ceilings}")
        return self.ceilings


def row(bench: str, case: str, metric: str, ours: float, peer: str, peer_value: float | None,
        **extra: Any) -> dict:
    """One result row; ``ratio`` = ours / peer for higher-is-better metrics."""
    r = {"bench": bench, "case": case, "metric": metric, "ours": round(float(ours), 3),
         "peer": peer, "peer_value": None if peer_value is None else round(float(peer_value), 3),
         "ratio": None if not peer_value else round(float(ours) / float(peer_value), 3)}
    r.update(extra)
    return r


def _git_commit() -> str:
    # ATTNRT_COMMIT wins: a copy of the tree (the GPU machine's) may sit inside an unrelated
    # or stale git checkout.
    if os.environ.get("ATTNRT_COMMIT"):
        return os.environ["ATTNRT_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "unknown"


def markdown(result: dict) -> str:
    lines = [f"# attnrt benchmarks — {result['gpu']} — {result['date']}", "",
             f"commit `{result['commit']}`; "
             + (f"board `{result['gpu_uuid']}`; " if result.get("gpu_uuid") else "")
             + "ceilings: " +
             ", ".join(f"{k} = {v}" for k, v in result["ceilings"].items()), "",
             "| bench | case | metric | ours | peer | peer value | ratio | of ceiling |",
             "|---|---|---|---:|---|---:|---:|---:|"]
    for r in result["rows"]:
        frac = r.get("of_ceiling")
        lines.append(f"| {r['bench']} | {r['case']} | {r['metric']} | {r['ours']} | {r['peer']} | "
                     f"{'' if r['peer_value'] is None else r['peer_value']} | "
                     f"{'' if r['ratio'] is None else r['ratio']} | "
                     f"{'' if frac is None else f'{frac:.0%}'} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> bool:
    """Two panels per benchmark: ours vs each peer (ratio), and achieved vs ceiling."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    rows = [r for r in result["rows"] if r.get("ratio") is not None]
    if not rows:
        return False
    benches = sorted({r["bench"] for r in rows})
    counts = [max(4, sum(r["bench"] == b for r in rows)) for b in benches]
    fig, axes = plt.subplots(len(benches), 2, figsize=(18, 0.22 * sum(counts) + 1.5 * len(benches)),
                             squeeze=False, gridspec_kw={"height_ratios": counts})
    for (ax, ax_c), b in zip(axes, benches):
        rs = [r for r in rows if r["bench"] == b and r["peer"] != "copy-bandwidth"]
        ax.barh(range(len(rs)), [r["ratio"] for r in rs], color="tab:blue")
        ax.set_xscale("log")  # ratios span 0.5x to 10^4x (cache hits)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_yticks(range(len(rs)), [f"{r['case']}\nvs {r['peer']}" for r in rs], fontsize=6)
        ax.set_title(f"{b}: ours / peer (higher is better)")
        cs = [r for r in rows if r["bench"] == b and r.get("of_ceiling") is not None]
        if cs:
            ax_c.barh(range(len(cs)), [100 * r["of_ceiling"] for r in cs], color="tab:green")
            ax_c.set_xlim(0, 100)
            ax_c.set_yticks(range(len(cs)), [r["case"] for r in cs], fontsize=6)
            ax_c.set_title(f"{b}: % of the measured copy bandwidth")
        else:
            ax_c.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def replot(json_path: Path) -> Path:
    """Redraw the PNG of a committed result file (no GPU needed)."""
    result = json.loads(Path(json_path).read_text())
    out = Path(json_path).with_suffix(".png")
    if not plot(result, out):
        raise SystemExit("replot needs matplotlib (pip install 'attnrt[bench]')")
    return out


class _BadMs(argparse.ArgumentTypeError, ValueError):
    """A bad millisecond count: argparse prints its message, Python callers get a ValueError."""


def _nonneg_ms(value: str | float) -> float:
    """A finite number of milliseconds >= 0 (``--warm-ms``, ``--state-ms`` and
    ``BenchContext``'s)."""
    v = float(value)
    if not 0 <= v < math.inf:
        raise _BadMs(f"must be a finite number >= 0, got {value!r}")
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", nargs="*", default=["all"], help=f"{', '.join(BENCHES)} or all")
    ap.add_argument("--out", default=str(LATEST),
                    help="output directory (default benchmarks/latest): one <op>.json/.md/.png "
                         "per benchmark, or the whole run as NAME.* with --name")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    ap.add_argument("--name", default=None,
                    help="write the whole run as NAME.json/.md/.png in --out (and the per-op "
                         "files only into --latest)")
    ap.add_argument("--latest", metavar="DIR", default=None,
                    help="directory for the per-op files (default: --out without --name, "
                         "none with it)")
    ap.add_argument("--warm-ms", type=_nonneg_ms, default=WARM_MS,
                    help="milliseconds of back-to-back calls before each timed series "
                         f"(default {WARM_MS:g}; 0: only the few warm-up calls)")
    ap.add_argument("--state-ms", type=_nonneg_ms, default=STATE_MS,
                    help="milliseconds of back-to-back calls after a row's timing, sampled by "
                         "nvidia-smi for the clock, power and throttle reasons that the call "
                         f"sustains (default {STATE_MS:g}; 0: none; index_share rows)")
    ap.add_argument("--replot", metavar="JSON", help="redraw the PNG of a result file and exit")
    args = ap.parse_args(argv)
    if args.replot:
        print(replot(Path(args.replot)))
        return 0
    which = list(BENCHES) if "all" in args.which else args.which
    for w in which:
        if w not in BENCHES:
            ap.error(f"unknown benchmark {w!r}; choose from {BENCHES} or all")
    reason = attnrt.gpu_missing_reason()
    if reason:
        print(f"bench: {reason}; nothing to measure", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    latest = Path(args.latest) if args.latest else (None if args.name else out)
    with attnrt.CudaRuntime(0) as rt:
        ctx = BenchContext(rt, quick=args.quick, warm_ms=args.warm_ms, state_ms=args.state_ms)
        ctx.measure_ceilings()
        rows: list[dict] = []
        sections: dict[str, str] = {}  # a module's own table (markdown_section), by op file
        for w in which:
            t0 = time.perf_counter()
            mod = importlib.import_module(f"bench_{w}")
            try:
                got = mod.run(ctx)
            except Exception as exc:  # one broken benchmark must not hide the others
                ctx.log(f"{w}: FAILED: {type(exc).__name__}: {exc}")
                got = [row(w, "error", "error", 0, type(exc).__name__, None, error=str(exc))]
            rows += got
            if hasattr(mod, "markdown_section"):
                sections[op_file(w)] = mod.markdown_section(got, ctx.ceilings)
            ctx.log(f"{w}: {len(got)} rows in {time.perf_counter() - t0:.1f} s")
        gpu = rt.capabilities.name
        # Which board: the same kernel's ratios move 1-4 % between H200s (docs/notes/index_share-history.md,
        # rounds 16-18); tools/bench_spread.py --by-gpu groups runs by this.
        board = ctx.gpu_uuid()
    date = _dt.date.today().isoformat()
    result = {"commit": _git_commit(), "gpu": gpu, "gpu_uuid": board, "date": date,
              "ceilings": ctx.ceilings, "rows": rows}
    if args.name:
        print(write_result(result, out, args.name, "".join("\n" + x for x in sections.values())))
    if latest is not None:
        for base, part in split_by_bench(result).items():
            md = write_result(part, latest, base, "\n" + sections[base] if base in sections else "")
            if not args.name:
                print(md)
    failed = failed_rows(rows)
    for r in failed:  # the files keep them too; the exit status tells gpu_check.sh
        print(f"bench: {r['bench']} {r['case']}: {r['peer']}: {r.get('error', '')[:300]}",
              file=sys.stderr)
    return 1 if failed else 0


def failed_rows(rows: list[dict]) -> list[dict]:
    """The rows that record a failure (metric "error") rather than a measurement."""
    return [r for r in rows if r.get("metric") == "error"]


if __name__ == "__main__":
    sys.exit(main())
