"""Every kernel variant of every registered op compiles with NVRTC for sm_80 and sm_90 (no GPU
needed), lists entries that exist, and every ``.cu`` under ``attnrt.ops/cuda`` is covered.

Variants come from each op module's ``compile_variants()`` (the list ``attnrt warm`` walks).
A registered module that does not exist yet is skipped with its name; one that exists but
fails to import fails. All selected compiles start at once in a pool of worker processes
(NVRTC compiles do not run in parallel in threads), each writing into one session-scoped
cache directory; each test waits for its own compile and then reads it through the
session's CompileCache (a disk hit).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import traceback
from concurrent.futures import Future, ProcessPoolExecutor

import pytest

import attnrt.ops
from attnrt.ops import _common
from attnrt.runtime import compiler
from attnrt.runtime.cache import CompileCache
from attnrt.runtime.errors import CompileError

ARCHS = (80, 90)


def _load_modules() -> tuple[dict[str, object], dict[str, str], dict[str, str]]:
    """(loaded op modules, missing module -> skip reason, broken module -> error text)."""
    loaded, missing, broken = {}, {}, {}
    for domain, op in attnrt.ops.registered_ops():
        name = attnrt.ops.REGISTRY[(domain, op)].partition(":")[0]
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # the module itself is not written yet
                missing[name] = f"{name} ({domain}::{op}) does not exist yet"
                continue
            broken[name] = traceback.format_exc()
            continue
        except Exception:
            broken[name] = traceback.format_exc()
            continue
        if not callable(getattr(mod, "compile_variants", None)):
            broken[name] = f"{name} has no compile_variants()"
            continue
        loaded[name] = mod
    return loaded, missing, broken


LOADED, MISSING, BROKEN = _load_modules()


def _variants() -> tuple[dict[str, list], dict[str, str]]:
    out, errors = {}, {}
    for name, mod in LOADED.items():
        try:
            out[name] = list(mod.compile_variants())
        except Exception:
            errors[name] = traceback.format_exc()
    return out, errors


VARIANTS, VARIANT_ERRORS = _variants()


def _target(variant, num: int) -> str:
    # The "a" features (wgmma, setmaxnreg) exist on sm_90a only.
    return f"sm_{num}{variant.arch_suffix if num == 90 else ''}"


def _vid(variant) -> str:
    defs = ",".join(f"{k}={v}" for k, v in sorted(variant.defines.items()))
    return f"{variant.file}[{defs}]" if defs else variant.file


def _key(variant, target: str) -> tuple:
    return (variant.file, variant.options, target)


def _params() -> list:
    params = []
    for name, reason in sorted(MISSING.items()):
        params.append(pytest.param(name, None, None, id=f"{name}-missing",
                                   marks=pytest.mark.skip(reason=reason)))
    for name in sorted(BROKEN) + sorted(VARIANT_ERRORS):
        params.append(pytest.param(name, None, None, id=f"{name}-broken"))
    for name, variants in sorted(VARIANTS.items()):
        for v in variants:
            for num in ARCHS:
                target = _target(v, num)
                marks = ()
                if v.min_arch > num:
                    marks = pytest.mark.skip(reason=f"{_vid(v)} needs sm_{v.min_arch}")
                params.append(pytest.param(name, v, target, id=f"{_vid(v)}-{target}", marks=marks))
    return params


@pytest.fixture(scope="session")
def kernel_cache() -> CompileCache:
    # The session's cache directory (tests/conftest.py makes a private one), so that the
    # CLI warm and demo tests reuse these compiles instead of repeating them.
    return CompileCache(os.environ["ATTNRT_CACHE_DIR"], disk=True)


def _compile_into(directory: str, file: str, options: tuple, target: str) -> str:
    """Worker: compile one variant into the cache directory; returns NVRTC's log (kept in
    the entry, so a disk hit returns it too)."""
    cache = CompileCache(directory, disk=True)
    return cache.get(_common.source(file), file, target, options, _common.headers()).log


@pytest.fixture(scope="session")
def compiles(request, kernel_cache):
    """Start every selected compile at once; tests wait for their own future."""
    work = {}
    for item in request.session.items:
        cs = getattr(item, "callspec", None)
        if cs is None or cs.params.get("variant") is None or item.get_closest_marker("skip"):
            continue
        v, target = cs.params["variant"], cs.params["target"]
        work.setdefault(_key(v, target), (v, target))
    futures: dict[tuple, Future] = {}
    pool = None
    if len(work) > 1:
        try:
            pool = ProcessPoolExecutor(max_workers=min(8, os.cpu_count() or 1),
                                       mp_context=multiprocessing.get_context("spawn"))
            for key, (v, target) in work.items():
                futures[key] = pool.submit(_compile_into, str(kernel_cache.directory), v.file,
                                           v.options, target)
        except OSError:  # no worker processes here: every test compiles in-process
            futures = {}
    yield futures
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("module,variant,target", _params())
def test_variant_compiles(compiles, kernel_cache, module, variant, target):
    if module in BROKEN:
        pytest.fail(f"{module} exists but cannot be imported:\n{BROKEN[module]}")
    if module in VARIANT_ERRORS:
        pytest.fail(f"{module}.compile_variants() raised:\n{VARIANT_ERRORS[module]}")
    log = ""
    try:
        fut = compiles.get(_key(variant, target))
        if fut is not None:
            try:
                log = fut.result()  # compiled into the cache directory by a worker
            except CompileError:
                raise
            except Exception:  # worker trouble (not the source): compile in-process below
                pass
        compiled = kernel_cache.get(_common.source(variant.file), variant.file, target,
                                    variant.options, _common.headers())
    except CompileError as err:
        pytest.fail(f"{err}\n--- options ---\n{' '.join(err.options)}\n--- log ---\n{err.log}",
                    pytrace=False)
    assert compiled.cubin.startswith(b"\x7fELF")
    # ptxas's "Potential Performance Loss" advisories, e.g. C7511: too few registers to keep
    # wgmmas in flight, so every wgmma of the kernel is serialised (several us slower). (A
    # disk hit also raises attnrt.PerformanceWarning, an error under this suite's settings.)
    log = log or compiled.log
    assert not compiler.performance_loss(log), f"{_vid(variant)} {target}:\n{log}"
    assert f".target {target}".encode() in compiled.ptx
    # Every listed entry is an unmangled (extern "C") kernel of this translation unit.
    missing = [e for e in variant.entries if f".entry {e}(".encode() not in compiled.ptx]
    assert not missing, f"{_vid(variant)} lists entries that are not extern \"C\" kernels: {missing}"


@pytest.mark.parametrize("module", sorted(VARIANTS) or [pytest.param(None, marks=pytest.mark.skip(
    reason="no op module exists yet"))])
def test_variants_are_well_formed(module):
    variants = VARIANTS[module]
    assert variants, f"{module}.compile_variants() is empty"
    seen = set()
    for v in variants:
        assert isinstance(v, _common.Variant), f"{module}: {v!r} is not a Variant"
        assert (attnrt.ops.CUDA_DIR / v.file).is_file(), f"{module}: {v.file} is not in cuda/"
        assert v.file.endswith(".cu"), v.file
        assert v.entries and all(isinstance(e, str) and e for e in v.entries), _vid(v)
        assert v.min_arch >= 80, _vid(v)
        assert v.arch_suffix in ("", "a"), _vid(v)
        if v.arch_suffix:
            assert v.min_arch >= 90, f"{_vid(v)}: an sm_90a variant must have min_arch=90"
        key = (v.file, v.options, v.arch_suffix)
        assert key not in seen, f"{module}: duplicate variant {_vid(v)}"
        seen.add(key)


def test_every_cu_file_is_covered_by_a_variant():
    if MISSING:
        pytest.skip("coverage is checked once every op module exists; missing: "
                    + ", ".join(sorted(MISSING)))
    if BROKEN or VARIANT_ERRORS:
        pytest.fail(f"op modules that do not load: {sorted(BROKEN) + sorted(VARIANT_ERRORS)}")
    files = {p.name for p in attnrt.ops.CUDA_DIR.glob("*.cu")}
    covered = {v.file for vs in VARIANTS.values() for v in vs}
    uncovered = sorted(files - covered)
    assert not uncovered, f".cu files no compile_variants() lists (dead or untested code): {uncovered}"
