"""The ``attnrt`` command: ``doctor``, ``cache ls|stats|verify|clear``, ``warm``, ``demo``."""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
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
    info["cache"] = {"dir": str(cache.directory), "disk_enabled": cache.disk,
                     "entries": len(cache.entries()), "bytes": cache.size_bytes()}
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
           f"{c['entries']} entries, {c['bytes'] / 1e6:.1f} MB")
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


def cmd_cache(args: argparse.Namespace) -> int:
    cache = default_cache()
    if args.action == "ls":
        entries = cache.entries()
        for e in entries:
            _print(f"{e.key[:16]}  {e.arch:<8} nvrtc {e.nvrtc:<5} {e.nbytes / 1024:8.1f} KiB  {e.name}")
        _print(f"{len(entries)} entries in {cache.directory}")
    elif args.action == "stats":
        entries = cache.entries()
        by_arch: dict[str, int] = {}
        for e in entries:
            by_arch[e.arch] = by_arch.get(e.arch, 0) + 1
        _print(json.dumps({"dir": str(cache.directory), "disk_enabled": cache.disk,
                           "entries": len(entries), "bytes": cache.size_bytes(),
                           "by_arch": by_arch}, indent=1))
    elif args.action == "verify":
        good, bad = cache.verify(remove=args.remove)
        for p in bad:
            _print(f"bad entry{' (removed)' if args.remove else ''}: {p}")
        _print(f"{good} valid, {len(bad)} bad")
        return 1 if bad and not args.remove else 0
    elif args.action == "clear":
        n = cache.clear()
        _print(f"removed {n} entries from {cache.directory}")
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


def warm(archs: Sequence[str], jobs: int = 0,
         quiet: bool = False) -> tuple[int, int, list[str], dict[str, list[str]]]:
    """Compile every registered kernel variant for ``archs`` into the cache.

    Returns (compiled or found, skipped, error messages, ptxas performance advisories by
    variant: ``"file target options"`` -> the log's "Potential Performance Loss" lines).
    """
    work = []
    for arch in archs:
        num, _suffix = compiler.parse_arch(arch)
        for op, v in _variants():
            if num < v.min_arch:
                continue
            target = f"sm_{num}{v.arch_suffix}"
            work.append((op, v, target))
    done, errors, t0 = 0, [], time.perf_counter()
    advice: dict[str, list[str]] = {}
    total = len(work)
    compiled = hits = 0
    # NVRTC does not run in parallel inside one process: compile in worker processes that
    # share the disk cache (its writes are atomic), then count what each did.
    ctx = multiprocessing.get_context("spawn")
    workers = max(1, min(jobs or os.cpu_count() or 1, total or 1))
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(_warm_one, v.file, v.module, target, v.options): (op, v, target)
                   for op, v, target in work}
        for fut in as_completed(futures):
            op, v, target = futures[fut]
            done += 1
            try:
                secs, did_compile, lines = fut.result()
                compiled += did_compile
                hits += not did_compile
                vid = f"{v.file} {target} {' '.join(v.options)}"
                msg = f"{vid} ({secs:.1f} s)"
                if lines:
                    advice[vid] = lines
            except CompileError as exc:
                errors.append(exc.dump())
                msg = f"FAILED: {exc}"
            if not quiet:
                bar = "#" * int(30 * done / max(total, 1))
                print(f"\r[{bar:<30}] {done}/{total} {msg[:90]:<90}", end="", file=sys.stderr, flush=True)
    if not quiet:
        print(f"\nwarm: {total} variants for {', '.join(archs)} in {time.perf_counter() - t0:.1f} s; "
              f"{compiled} compiled, {hits} already cached, "
              f"{len(errors)} failed", file=sys.stderr)
    return done - len(errors), 0, errors, advice


def cmd_warm(args: argparse.Namespace) -> int:
    archs = args.arch
    if not archs:
        reason = gpu_missing_reason()
        if reason is not None:
            _print(f"warm: no GPU ({reason}); give targets with --arch, e.g. --arch sm_90")
            return 2
        from ..runtime.device import Device

        dev = Device(0)
        archs = [compiler.target_arch(dev.capabilities.arch)[0]]
        dev.release()
    for a in archs:
        compiler.parse_arch(a)
    _ok, _skip, errors, advice = warm(archs, args.jobs)
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
    p = argparse.ArgumentParser(prog="attnrt", description="driver-level CUDA runtime + attention kernels")
    p.add_argument("--version", action="version", version=f"attnrt {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("doctor", help="driver, NVRTC, headers, devices, cache")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_doctor)
    c = sub.add_parser("cache", help="inspect or clear the compile cache")
    c.add_argument("action", choices=["ls", "stats", "verify", "clear"])
    c.add_argument("--remove", action="store_true", help="verify: delete bad entries")
    c.set_defaults(func=cmd_cache)
    w = sub.add_parser("warm", help="compile every registered kernel into the cache (no GPU needed)")
    w.add_argument("--arch", action="append", default=[], help="target such as sm_90 (repeatable)")
    w.add_argument("--jobs", type=int, default=0, help="parallel compiles (default: CPU count)")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except AttnrtError as exc:
        print(f"attnrt {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
