"""The ``attnrt`` command: ``doctor``, ``cache ls|stats|verify|clear``, ``warm``, ``demo``."""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import shutil
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from .. import __version__
from ..runtime import compiler
from ..runtime.cache import default_cache
from ..runtime.device import gpu_missing_reason
from ..runtime.errors import AttnrtError, CompileError, PerformanceWarning


def _print(msg: str = "") -> None:
    print(msg, flush=True)


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"attnrt": __version__, "python": sys.version.split()[0]}
    for pkg in ("cuda-bindings", "cuda-core", "cuda-pathfinder", "numpy", "ml-dtypes", "platformdirs"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def cmd_doctor(args: argparse.Namespace) -> int:
    info: dict[str, Any] = {"versions": _versions()}
    try:
        info["nvrtc"] = ".".join(map(str, compiler.nvrtc_version()))
        info["nvrtc_archs"] = [f"sm_{a}" for a in compiler.supported_archs()]
    except Exception as exc:  # NVRTC missing is exactly what doctor must report
        info["nvrtc"] = f"unavailable: {exc}"
    info["include_dirs"] = list(compiler.include_dirs())
    cache = default_cache()
    good, problems = cache.audit()
    info["cache"] = {"dir": str(cache.directory), "disk_enabled": cache.disk,
                     "entries": good, "bytes": cache.size_bytes(), "problems": len(problems)}
    try:
        from ..runtime import _launchc  # noqa: F401

        info["launch_path"] = "compiled (attnrt.runtime._launchc)"
    except ImportError as exc:
        info["launch_path"] = f"ctypes (attnrt.runtime._launchc not built: {exc})"
    reason = gpu_missing_reason()
    info["gpu"] = reason or "available"
    devices = []
    if reason is None:
        from ..runtime._check import driver_version
        from ..runtime.device import Device, device_count

        info["driver"] = driver_version()
        for i in range(device_count()):
            dev = Device(i)
            devices.append(dev.capabilities.as_dict())
            dev.release()
    info["devices"] = devices
    if args.json:
        _print(json.dumps(info, indent=1))
        return 0
    v = info["versions"]
    _print(f"attnrt {v['attnrt']} (python {v['python']})")
    _print("packages: " + ", ".join(f"{k} {val}" for k, val in v.items() if k not in ("attnrt", "python")))
    _print(f"NVRTC: {info['nvrtc']}  targets: {' '.join(info.get('nvrtc_archs', []))}")
    hdr = info["include_dirs"]
    _print("CUDA headers: " + (", ".join(hdr) if hdr else
                              "NOT FOUND (pip install 'cuda-toolkit[nvrtc,cudart]')"))
    c = info["cache"]
    _print(f"compile cache: {c['dir']} ({'on' if c['disk_enabled'] else 'off: ATTNRT_CACHE=0'}), "
           f"{c['entries']} entries, {c['bytes'] / 1e6:.1f} MB"
           + (f", {c['problems']} unusable items (see `attnrt cache verify`)" if c["problems"] else ""))
    _print(f"launch path: {info['launch_path']}")
    if reason is not None:
        _print(f"GPU: none — {reason}. Compiling still works: `attnrt warm --arch sm_90`.")
        return 0
    drv = info["driver"]
    _print(f"driver: CUDA {drv // 1000}.{drv % 1000 // 10}")
    for d in devices:
        _print(f"device {d['ordinal']}: {d['name']} {d['arch']}, {d['sm_count']} SMs, "
               f"{d['total_memory'] / 2**30:.1f} GiB, L2 {d['l2_bytes'] / 2**20:.0f} MiB, "
               f"smem/block opt-in {d['max_shared_per_block_optin'] // 1024} KiB")
    return 0


def _problems_json(problems: list) -> list[dict[str, str]]:
    return [{"path": str(p), "why": why} for p, why in problems]


def cmd_cache(args: argparse.Namespace) -> int:
    cache = default_cache()
    if args.action in ("ls", "stats"):
        entries, problems = cache.listing()
        by_arch: dict[str, int] = {}
        for e in entries:
            by_arch[e.arch] = by_arch.get(e.arch, 0) + 1
        if args.action == "stats" or args.json:
            out: dict[str, Any] = {"dir": str(cache.directory), "disk_enabled": cache.disk,
                                   "entries": len(entries), "bytes": cache.size_bytes(),
                                   "by_arch": by_arch, "problems": _problems_json(problems)}
            if args.action == "ls":
                out["entries"] = [{"key": e.key, "name": e.name, "arch": e.arch, "nvrtc": e.nvrtc,
                                   "options": None if e.options is None else list(e.options),
                                   "bytes": e.nbytes, "created": e.created, "path": str(e.path)}
                                  for e in entries]
            if args.json:
                _print(json.dumps(out, indent=1))
                return 0
            _print(f"{len(entries)} entries, {out['bytes'] / 1e6:.1f} MB in {cache.directory} "
                   f"(disk layer {'on' if cache.disk else 'off: ATTNRT_CACHE=0'})")
            for arch, n in sorted(by_arch.items()):
                _print(f"  {arch:<8} {n}")
        else:
            for e in entries:
                opts = "(options not recorded)" if e.options is None else " ".join(e.options)
                _print(f"{e.key[:16]}  {e.arch:<8} nvrtc {e.nvrtc:<5} {e.nbytes / 1024:8.1f} KiB  "
                       f"{e.name}  {opts}")
            _print(f"{len(entries)} entries in {cache.directory}")
        for p, why in problems:
            _print(f"not an entry: {p}: {why}")
        if problems:
            _print(f"{len(problems)} items are not valid entries (`attnrt cache verify --remove` "
                   "deletes them)")
    elif args.action == "verify":
        good, bad = cache.audit(remove=args.remove)
        failed = [x for x in bad if "could not remove" in x[1]]
        if args.json:
            _print(json.dumps({"valid": good, "bad": _problems_json(bad), "removed": args.remove},
                              indent=1))
        else:
            for p, why in bad:
                _print(f"bad entry{' (removed)' if args.remove and (p, why) not in failed else ''}: "
                       f"{p}: {why}")
            _print(f"{good} valid, {len(bad)} bad")
        return 1 if (bad and not args.remove) or failed else 0
    elif args.action == "clear":
        n, failed = cache.purge()
        if args.json:
            _print(json.dumps({"removed": n, "failed": _problems_json(failed)}, indent=1))
        else:
            for p, why in failed:
                _print(f"not removed: {p}: {why}")
            _print(f"removed {n} entries from {cache.directory}")
        return 1 if failed else 0
    return 0


def _variants() -> list[tuple[str, Any]]:
    # The CLI is an application on top of both packages; the runtime layer itself never
    # imports attnrt.ops.
    kernels = importlib.import_module("attnrt.ops")
    out = []
    for domain, op in kernels.registered_ops():
        target = kernels.REGISTRY[(domain, op)]
        mod = importlib.import_module(target.partition(":")[0])
        out += [(f"{domain}::{op}", v) for v in mod.compile_variants()]
    return out


def select_ops(variants: list[tuple[str, Any]], ops: Sequence[str]) -> list[tuple[str, Any]]:
    """The variants of the named ops (``domain::OpType`` or ``OpType``, any case); all when
    ``ops`` is empty.

    Raises
    ------
    ValueError
        A name that matches no registered op (the message lists them).
    """
    if not ops:
        return variants
    names = sorted({op for op, _ in variants})

    def matches(name: str, op: str) -> bool:
        return name.lower() in (op.lower(), op.split("::")[-1].lower())

    unknown = [n for n in ops if not any(matches(n, op) for op in names)]
    if unknown:
        raise ValueError(f"unknown op {', '.join(map(repr, unknown))}; registered: "
                         f"{', '.join(names)}")
    return [(op, v) for op, v in variants if any(matches(n, op) for n in ops)]


def _warm_one(file: str, module: str, target: str,
              options: tuple[str, ...]) -> tuple[float, bool, list[str]]:
    """One variant into the disk cache (runs in a worker process): (seconds, compiled?,
    ptxas's performance advisories)."""
    from attnrt.ops import _common

    cache = default_cache()
    before = cache.stats.compiles  # a worker process handles many variants
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PerformanceWarning)  # warm() reports them
        got = cache.get(_common.source(file), module + ".cu", target, options, _common.headers())
    return time.perf_counter() - t, cache.stats.compiles > before, compiler.performance_loss(got.log)


def check_archs(archs: Sequence[str], variants: Sequence[tuple[str, Any]]) -> list[str]:
    """``archs`` without repeats, each checked against NVRTC's targets and the variants.

    Raises
    ------
    ValueError
        An arch that is not of the form ``sm_90``/``sm_90a``, that this NVRTC cannot
        compile for, or that no registered kernel supports (warming it would do nothing).
    """
    supported = compiler.supported_archs()
    names = " ".join(f"sm_{a}" for a in supported)
    oldest = min((v.min_arch for _op, v in variants), default=None)
    out = []
    for arch in archs:
        num, suffix = compiler.parse_arch(arch)
        if num not in supported:
            nv = ".".join(map(str, compiler.nvrtc_version()))
            raise ValueError(f"{arch} is not a target of NVRTC {nv} (it compiles for: {names})")
        if oldest is not None and num < oldest:
            raise ValueError(f"no registered kernel runs on {arch} (the oldest target is sm_{oldest})")
        name = f"sm_{num}{suffix}"
        if name not in out:
            out.append(name)
    return out


class _Progress:
    """One status line on a terminal (redrawn with ``\r``, at most 79 columns); otherwise
    (a log, a pipe) a plain line at every tenth of the work and for each failure."""

    def __init__(self, total: int, stream: Any = None) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.width = min(80, shutil.get_terminal_size((80, 24)).columns) - 1
        self._next = 1  # the next tenth of the work to report (not on a terminal)

    def step(self, msg: str, ok: bool) -> None:
        self.done += 1
        self.failed += not ok
        count = f"{self.done}/{self.total}"
        if self.tty:
            bar = "#" * int(20 * self.done / max(self.total, 1))
            line = f"[{bar:<20}] {count} {msg}"[: self.width]
            print(f"\r{line:<{self.width}}", end="", file=self.stream, flush=True)
            return
        if not ok:
            print(f"warm: {count} {msg}"[: self.width], file=self.stream, flush=True)
        if self.done * 10 >= self._next * self.total or self.done == self.total:
            print(f"warm: {count} done, {self.failed} failed", file=self.stream, flush=True)
            while self._next * self.total <= self.done * 10:
                self._next += 1

    def end(self) -> None:
        if self.tty and self.done:
            print(file=self.stream, flush=True)


def warm(archs: Sequence[str], jobs: int = 0, quiet: bool = False,
         ops: Sequence[str] = ()) -> tuple[int, int, list[str], dict[str, list[str]]]:
    """Compile every registered kernel variant (of ``ops``: :func:`select_ops`) for ``archs``
    into the cache.

    Returns (compiled or found, skipped, error messages, ptxas performance advisories by
    variant: ``"file target options"`` -> the log's "Potential Performance Loss" lines).

    Raises
    ------
    ValueError
        An arch that NVRTC or no kernel supports (see :func:`check_archs`), or an unknown op.
    """
    variants = select_ops(_variants(), ops)
    archs = check_archs(archs, variants)
    work = []
    for arch in archs:
        num, _suffix = compiler.parse_arch(arch)
        for op, v in variants:
            if num < v.min_arch:
                continue
            target = f"sm_{num}{v.arch_suffix}"
            work.append((op, v, target))
    errors, t0 = [], time.perf_counter()
    advice: dict[str, list[str]] = {}
    total = len(work)
    compiled = hits = 0
    progress = None if quiet else _Progress(total)
    # NVRTC does not run in parallel inside one process: compile in worker processes that
    # share the disk cache (its writes are atomic), then count what each did.
    ctx = multiprocessing.get_context("spawn")
    workers = max(1, min(jobs or os.cpu_count() or 1, total or 1))
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(_warm_one, v.file, v.module, target, v.options): (op, v, target)
                   for op, v, target in work}
        for fut in as_completed(futures):
            op, v, target = futures[fut]
            vid = f"{v.file} {target} {' '.join(v.options)}"
            try:
                secs, did_compile, lines = fut.result()
                compiled += did_compile
                hits += not did_compile
                msg, ok = f"{vid} ({secs:.1f} s)", True
                if lines:
                    advice[vid] = lines
            except CompileError as exc:
                errors.append(exc.dump())
                msg, ok = f"FAILED: {vid}", False
            if progress is not None:
                progress.step(msg, ok)
    if progress is not None:
        progress.end()
        print(f"warm: {total} variants ({', '.join(archs)}) in {time.perf_counter() - t0:.0f} s: "
              f"{compiled} compiled, {hits} cached, {len(errors)} failed", file=sys.stderr)
    return total - len(errors), 0, errors, advice


def cmd_warm(args: argparse.Namespace) -> int:
    archs = args.arch
    if not archs:
        reason = gpu_missing_reason()
        if reason is not None:
            print(f"attnrt warm: no GPU ({reason}); give targets with --arch, e.g. --arch sm_90",
                  file=sys.stderr)
            return 2
        from ..runtime.device import Device

        dev = Device(0)
        archs = [compiler.target_arch(dev.capabilities.arch)[0]]
        dev.release()
    try:
        check_archs(archs, select_ops(_variants(), args.op))
    except ValueError as exc:
        print(f"attnrt warm: error: {exc}", file=sys.stderr)
        return 2
    _ok, _skip, errors, advice = warm(archs, args.jobs, ops=args.op)
    for e in errors:
        print(e, file=sys.stderr)
    if advice:  # compiled, but slowed down (e.g. C7511: serialised wgmmas); per NVRTC version
        print(f"warm: ptxas reports a performance loss in {len(advice)} variant(s):",
              file=sys.stderr)
        for vid, lines in sorted(advice.items()):
            print(f"  {vid}:", *lines, sep="\n    ", file=sys.stderr)
    return 1 if errors or (advice and args.strict) else 0


def cmd_demo(args: argparse.Namespace) -> int:
    # The demo imports the kernels; load it only when the command runs (keeps `attnrt doctor` light).
    from .demo import main as demo_main

    return demo_main(args)


def build_parser() -> argparse.ArgumentParser:
    """The ``attnrt`` argument parser (every subcommand and option with its help)."""
    p = argparse.ArgumentParser(prog="attnrt", description="driver-level CUDA runtime + attention kernels")
    p.add_argument("--version", action="version", version=f"attnrt {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    d = sub.add_parser("doctor", help="driver, NVRTC, headers, devices, cache",
                       description="Report what attnrt finds: packages, NVRTC and its targets, CUDA "
                                   "headers, the compile cache, the launch path, the GPUs.")
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    d.set_defaults(func=cmd_doctor)
    c = sub.add_parser("cache", help="inspect, check or clear the compile cache",
                       description="ls: the entries (key, target, NVRTC, size, file, options); "
                                   "stats: totals by target; verify: check every entry (exit 1 "
                                   "on a bad one); clear: remove them all. Items that are not "
                                   "valid entries (directories, FIFOs, links...) are reported.")
    c.add_argument("action", choices=["ls", "stats", "verify", "clear"], help="what to do")
    c.add_argument("--remove", action="store_true", help="verify: delete bad entries")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    c.set_defaults(func=cmd_cache)
    w = sub.add_parser("warm", help="compile every registered kernel into the cache (no GPU needed)",
                       description="Compile every kernel variant for the given targets into the "
                                   "compile cache, in parallel worker processes.")
    w.add_argument("--arch", action="append", default=[],
                   help="target such as sm_90, one NVRTC supports (repeatable; default: GPU 0's)")
    w.add_argument("--jobs", type=int, default=0, help="parallel compiles (default: CPU count)")
    w.add_argument("--op", action="append", default=[],
                   help="only this op's kernels, e.g. PagedAttention (repeatable; default: all)")
    w.add_argument("--strict", action="store_true",
                   help="exit 1 when ptxas reports a performance loss in any variant (GPU CI)")
    w.set_defaults(func=cmd_warm)
    m = sub.add_parser("demo", help="a decode loop through the executor: eager, capture, replay "
                                     "(without a GPU: compile every kernel, run the CPU references)")
    m.add_argument("--steps", type=int, default=16, help="graph replays (without a GPU: decode steps)")
    m.add_argument("--layers", type=int, default=4, help="layers, alternating dense (PagedAttention) "
                                                         "and sparse (IndexShare)")
    m.add_argument("--seed", type=int, default=0, help="seed of the random weights, caches and inputs")
    m.add_argument("--json", action="store_true", help="print the report as JSON (progress on stderr)")
    m.set_defaults(func=cmd_demo)
    return p


def _quiet_broken_pipe() -> int:
    # The reader went away (``attnrt doctor | head -3``): no traceback, and no second error
    # when the interpreter flushes stdout at exit; the exit status of a SIGPIPE death.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    return 128 + 13


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``attnrt`` command; returns its exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except AttnrtError as exc:
        print(f"attnrt {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
