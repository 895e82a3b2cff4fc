#!/usr/bin/env python3
"""Hash the CUBIN of every shipped kernel variant: ``python tools/cubin_hashes.py OUT.txt``.

For checking a change that should not change any compiled kernel (a rename, a moved
helper): run it before and after, then ``cmp`` the two files. The work list is what
``nxrt warm --arch sm_80 --arch sm_90`` compiles (``nxrt.cli.warm``): every op module's
``compile_variants()``, each for every requested arch it supports (``min_arch``), the
target being ``sm_<num><arch_suffix>`` (so on Hopper the wgmma/setmaxnreg variants build
for ``sm_90a``, the others for ``sm_90``). The compiles go through
``CompileCache.get`` as in ``warm``, but with the disk layer off (``disk=False``, and
``ATTNRT_CACHE=0`` / ``ATTNRT_CACHE_DIR`` pointed at a fresh temporary directory for anything
that looks at the environment), so every CUBIN is compiled by NVRTC now.

Each output line: ``variant-id target sha256(cubin)``, sorted; the variant id is
``<file>|<-D options joined by ','>`` (``-`` for none). ``--budget`` seconds (default 900)
caps the run: what was not compiled by then is listed on stderr and in
``OUT.skipped`` (and the exit status is 3).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _imports() -> SimpleNamespace:
    """Every project name this tool uses (the only place to edit after a rename)."""
    import attnrt.ops as nxrt_kernels
    from attnrt.app.cli import _variants  # what `attnrt warm` walks: [(op, Variant)]
    from attnrt.ops import _common
    from attnrt.runtime import compiler
    from attnrt.runtime.cache import CompileCache

    return SimpleNamespace(
        variants=_variants,              # () -> [(op name, Variant)]
        parse_arch=compiler.parse_arch,  # "sm_90" -> (90, "")
        CompileCache=CompileCache,       # CompileCache(directory, disk=False).get(...)
        source=_common.source,           # file name -> kernel source text
        headers=_common.headers,         # () -> {include name: text}
        kernels_file=nxrt_kernels.__file__,
    )


def work_list(archs: list[str]) -> list[tuple[str, str, str, tuple[str, ...], str]]:
    """(variant id, file, module, options, target) as ``nxrt.cli.warm`` builds its work."""
    ns = _imports()
    out = []
    for arch in archs:
        num, _suffix = ns.parse_arch(arch)
        for _op, v in ns.variants():
            if num < v.min_arch:
                continue
            target = f"sm_{num}{v.arch_suffix}"
            vid = f"{v.file}|{','.join(v.options) or '-'}"
            out.append((vid, v.file, v.module, tuple(v.options), target))
    # the same (variant, target) can come from two requested archs only if they share a
    # number; keep the first
    seen, uniq = set(), []
    for w in out:
        if (w[0], w[4]) not in seen:
            seen.add((w[0], w[4]))
            uniq.append(w)
    return uniq


def _compile_one(file: str, module: str, target: str, options: tuple[str, ...],
                 cache_dir: str) -> tuple[str, float, int]:
    """Compile one variant in a worker process (no disk cache): (sha256 of the CUBIN,
    seconds, CUBIN bytes)."""
    ns = _imports()
    cache = ns.CompileCache(cache_dir, disk=False)
    t = time.perf_counter()
    got = cache.get(ns.source(file), module + ".cu", target, options, ns.headers())
    if not got.cubin:
        raise RuntimeError(f"{file} {target}: empty CUBIN")
    return hashlib.sha256(bytes(got.cubin)).hexdigest(), time.perf_counter() - t, len(got.cubin)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="write the sorted hash lines here")
    ap.add_argument("--arch", action="append", default=[],
                    help="as `nxrt warm --arch` (repeatable; default sm_80 and sm_90)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--budget", type=float, default=900.0,
                    help="stop submitting after this many seconds (default 900)")
    ap.add_argument("--match", default="", help="only variant ids containing this (testing)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N of the work (testing)")
    args = ap.parse_args(argv)
    archs = args.arch or ["sm_80", "sm_90"]

    tmp = tempfile.mkdtemp(prefix="nxrt-cubin-hashes-")
    # Workers are spawned: they inherit this environment (a fresh, unused cache directory).
    os.environ["ATTNRT_CACHE"] = "0"
    os.environ["ATTNRT_CACHE_DIR"] = tmp
    ns = _imports()
    print(f"cubin_hashes: kernels from {Path(ns.kernels_file).parent}", file=sys.stderr)
    work = [w for w in work_list(archs) if args.match in w[0]]
    if args.limit:
        work = work[:args.limit]
    total = len(work)
    t0 = time.perf_counter()
    lines: list[str] = []
    failed: list[str] = []
    secs: dict[str, float] = {}
    ctx = multiprocessing.get_context("spawn")
    pending = list(work)
    running: dict = {}
    with ProcessPoolExecutor(max_workers=max(1, min(args.jobs, 2, total or 1)),
                             mp_context=ctx) as pool:
        # Feed the pool one job per free worker, so that a budget stop leaves nothing queued.
        while pending or running:
            while pending and len(running) < args.jobs and time.perf_counter() - t0 < args.budget:
                w = pending.pop(0)
                running[pool.submit(_compile_one, w[1], w[2], w[4], w[3], tmp)] = w
            if not running:
                break
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                w = running.pop(fut)
                key = f"{w[0]} {w[4]}"
                try:
                    digest, s, _n = fut.result()
                    lines.append(f"{key} {digest}")
                    secs[key] = s
                except Exception as exc:  # a failed compile is part of the record
                    failed.append(f"{key}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                    lines.append(f"{key} FAILED")
                n = len(lines)
                print(f"\r{n}/{total} {time.perf_counter() - t0:6.0f} s {key[:80]:<80}",
                      end="", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t0
    print(file=sys.stderr)
    lines.sort()
    args.out.write_text("\n".join(lines) + ("\n" if lines else ""))
    skipped = sorted(f"{w[0]} {w[4]}" for w in pending)
    skip_path = args.out.with_name(args.out.name + ".skipped")
    if skipped:
        skip_path.write_text("\n".join(skipped) + "\n")
    elif skip_path.exists():
        skip_path.unlink()
    compile_s = sum(secs.values())
    print(f"cubin_hashes: {len(lines)}/{total} variants hashed in {elapsed:.0f} s wall "
          f"({compile_s:.0f} s of compiles, {args.jobs} workers, archs {' '.join(archs)}); "
          f"{len(failed)} failed, {len(skipped)} skipped -> {args.out}", file=sys.stderr)
    for f in failed:
        print(f"  FAILED {f}", file=sys.stderr)
    if secs:
        slow = sorted(secs.items(), key=lambda kv: -kv[1])[:5]
        print("  slowest: " + "; ".join(f"{k} {v:.0f} s" for k, v in slow), file=sys.stderr)
    if skipped:
        print(f"  skipped (budget {args.budget:.0f} s): {len(skipped)} listed in {skip_path}",
              file=sys.stderr)
    try:
        os.rmdir(tmp)  # nothing is written there (disk layer off)
    except OSError:
        pass
    return 1 if failed else 3 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
