"""The README's quickstart, extracted and executed as written, checked against a float64
softmax attention computed here (no attnrt module involved in the reference)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

README = Path(__file__).resolve().parent.parent / "README.md"


def _quickstart() -> str:
    text = README.read_text()
    section = text[text.index("## Quickstart"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """[B, H, Sq, D] x [B, Hkv, Sk, D] grouped-query attention in float64, scale 1/sqrt(D)."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _f64(t) -> np.ndarray:
    return t.float().cpu().numpy().astype(np.float64)


def test_readme_quickstart_runs_and_matches_a_float64_reference(rt):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    torch.manual_seed(0)
    ns: dict = {}
    exec(compile(_quickstart(), "README.md#quickstart", "exec"), ns)  # noqa: S102 - our own README
    torch.cuda.synchronize()
    q, k, v, o, y = (_f64(ns[n]) for n in ("q", "k", "v", "o", "y"))
    ref = _sdpa(q, k, v)  # one query row at the end of the keys: causal sees every key
    assert np.linalg.norm(o - ref) / np.linalg.norm(ref) < 1e-2
    ref_y = _sdpa(_f64(ns["q"] * 0.5), k, v) + q
    assert np.linalg.norm(y - ref_y) / np.linalg.norm(ref_y) < 1e-2
