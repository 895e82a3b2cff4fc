"""Numeric helpers for tests."""

from __future__ import annotations

import numpy as np

import attnrt


def rel_fro(out: np.ndarray, ref: np.ndarray) -> float:
    """‖out − ref‖_F / ‖ref‖_F in float64 (NaN anywhere gives inf)."""
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(o)):
        return float("inf")
    denom = np.linalg.norm(r)
    return float(np.linalg.norm(o - r) / (denom if denom > 0 else 1.0))


TOL = {attnrt.DataType.FLOAT: 1e-5, attnrt.DataType.FLOAT16: 2e-3, attnrt.DataType.BFLOAT16: 1e-2}
