"""Shared fixtures: GPU gating (one skip reason), a runtime, the ledger check, a private cache."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

import attnrt

try:  # torch (optional, GPU tests only) is imported before any test module runs
    import torch  # noqa: F401
except Exception:  # absent or broken: the tests that need it skip themselves
    pass

GPU_REASON = attnrt.gpu_missing_reason()


def pytest_configure(config):
    # Tests never touch the user's cache unless ATTNRT_CACHE_DIR is set explicitly.
    if "ATTNRT_CACHE_DIR" not in os.environ:
        os.environ["ATTNRT_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnrt-test-cache-")


def pytest_collection_modifyitems(config, items):
    if GPU_REASON is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {GPU_REASON}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def rt():
    """One CudaRuntime for the whole session (device 0)."""
    if GPU_REASON is not None:
        pytest.skip(f"gpu test: {GPU_REASON}")
    runtime = attnrt.CudaRuntime(0)
    yield runtime
    runtime.close()


@pytest.fixture
def ledger(rt):
    """Asserts that the test returns the runtime's live allocations to where they started."""
    before = rt.memory_stats()
    yield rt
    rt.synchronize()
    after = rt.memory_stats()
    assert after.live_bytes == before.live_bytes, (
        f"leaked {after.live_bytes - before.live_bytes} bytes "
        f"({after.live_count - before.live_count} allocations)")


@pytest.fixture
def rng(request):
    """A numpy Generator seeded from the test's name (stable across runs, distinct per test)."""
    seed = _stable_seed(request.node.nodeid)
    return np.random.default_rng(seed)


def _stable_seed(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode())
