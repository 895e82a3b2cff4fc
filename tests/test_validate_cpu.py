"""The shared overlap rule (attnrt.ops._validate): exact for views of one layout, checked
against a brute-force enumeration of element addresses."""

from __future__ import annotations

import itertools
import random

import pytest

from attnrt.ops._validate import _elements_meet, check_disjoint
from attnrt.runtime.api import DataType, TensorMut, TensorView
from attnrt.runtime.errors import KernelError

BF16 = DataType.BFLOAT16


def _addresses(v: TensorView) -> set[int]:
    item = v.dtype.itemsize
    return {v.ptr + item * sum(i * s for i, s in zip(idx, v.element_strides))
            for idx in itertools.product(*[range(n) for n in v.shape])}


@pytest.mark.parametrize("seed", range(4))
def test_same_layout_overlap_is_exact(seed):
    rng = random.Random(seed)
    for _ in range(600):
        rank = rng.randint(1, 3)
        strides = [rng.randint(1, 20) for _ in range(rank)]
        a = TensorView(4096, BF16, [rng.randint(1, 4) for _ in range(rank)], strides)
        b = TensorView(4096 + 2 * rng.randint(-80, 80), BF16, [rng.randint(1, 4) for _ in range(rank)],
                       strides)
        # Never a missed overlap, and no false alarm either: the digit search is exact.
        assert _elements_meet(a, b) == bool(_addresses(a) & _addresses(b)), (a, b)


def test_interleaved_batches_are_not_an_overlap_but_a_shared_element_is():
    # Q and O share one buffer with a batch stride of 2**32 elements: O sits between Q's
    # batches (the 64-bit offsets GPU test). Disjoint element sets, intersecting byte ranges.
    sb, shape = 2**32, (2, 4, 70, 128)
    strides = (sb, 70 * 128, 128, 1)
    q = TensorView(1 << 40, BF16, shape, strides)
    o = TensorMut((1 << 40) + 3 * 2**18 * 2, BF16, shape, strides)
    check_disjoint({"O": o}, {"Q": q}, "op")
    o2 = TensorMut((1 << 40) + 2 * 128, BF16, shape, strides)  # starts on Q's second row
    with pytest.raises(KernelError, match="overlaps input Q"):
        check_disjoint({"O": o2}, {"Q": q}, "op")


@pytest.mark.parametrize("op", ["attention", "index_share"])
@pytest.mark.parametrize("bad", [123, object(), "array"], ids=["raw-pointer", "object", "array"])
def test_workspace_that_is_not_a_view_is_a_type_error(op, bad):
    """``check_workspace_view`` in execute, before anything else: nothing launched or written
    (PagedAttention's own rig: tests/test_paged_validation_cpu.py)."""
    import importlib

    import numpy as np

    rig = importlib.import_module(f"tests.test_{op}_validation_cpu")
    c = rig.make_case()
    bad = np.zeros(4, np.uint8) if bad == "array" else bad
    rig.assert_refused(c, lambda: c.kern.execute(c.ins, c.outs, bad), TypeError,
                       "workspace must be a WorkspaceView or None")
