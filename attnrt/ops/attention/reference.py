"""numpy reference of ``pkg.nxrt::Attention`` (float64 inside, Q's dtype out).

The oracle of the tests and a CPU fallback. Its math is independent of the kernel's planner
and builds; it shares only the validation (:func:`.calls.check_host_call`), so it refuses
what the kernel refuses with the same typed errors, and it uses the attributes' float32
values (``scale``, ``softcap``) as the kernels do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnrt.runtime.api import Node

from .calls import check_host_call

__all__ = ["attention"]


def attention(node: Node, inputs: Sequence[np.ndarray | None], out_dtype: Any = None) -> np.ndarray:
    """``softmax(softcap(scale·Q Kᵀ) + mask) V`` with GQA, causal and local-window masking.

    Parameters
    ----------
    node
        The Attention node (its attributes are validated as the kernel does).
    inputs
        ``[Q, K, V]`` or ``[Q, K, V, mask]`` (``None`` for an absent mask), numpy arrays of
        one dtype (float32, float16 or bfloat16), the mask included.
    out_dtype
        Result dtype (default: Q's dtype).

    Returns
    -------
    numpy.ndarray
        The output [B, H, Sq, D]; rows that see no key are zeros.

    Raises
    ------
    TypeError
        ``node`` is not a Node (or its attributes not a dict), or ``inputs`` not a list.
    KernelError
        Invalid node, attributes, shapes or dtypes (the same checks as the kernel).
    """
    attrs, dims, (q, k, v, mask) = check_host_call(node, inputs)
    B, H, Sq, D, Sk, G = dims.B, dims.H, dims.Sq, dims.D, dims.Sk, dims.group
    scale = attrs.scale if attrs.scale is not None else 1.0 / math.sqrt(D) if D else 1.0

    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    # GQA: head h reads kv head h // G.
    kh = np.repeat(k64, G, axis=1)
    vh = np.repeat(v64, G, axis=1)
    s = np.matmul(q64, kh.transpose(0, 1, 3, 2)) * scale
    if attrs.softcap > 0:
        s = attrs.softcap * np.tanh(s / attrs.softcap)
    if mask is not None and Sq * Sk:
        planes = mask.size // (Sq * Sk)
        m = mask.astype(np.float64).reshape(planes, Sq, Sk)
        if planes == B * H:
            m = m.reshape(B, H, Sq, Sk)
        elif planes == B:
            m = m.reshape(B, 1, Sq, Sk)
        else:
            m = m.reshape(1, 1, Sq, Sk)
        s = s + m
    # Positions: query i sits at Sk - Sq + i (bottom-right alignment).
    pos = (Sk - Sq + np.arange(Sq))[:, None]
    j = np.arange(Sk)[None, :]
    visible = np.ones((Sq, Sk), dtype=bool)
    if attrs.causal:
        visible &= j <= pos
    if attrs.local_window_size >= 0:
        visible &= (pos - j) <= attrs.local_window_size
    s = np.where(visible, s, -np.inf)
    with np.errstate(invalid="ignore"):
        mx = s.max(axis=-1, keepdims=True) if Sk else np.full(s.shape[:-1] + (1,), -np.inf)
        mx = np.where(np.isfinite(mx), mx, 0.0)
        e = np.exp(s - mx)
        den = e.sum(axis=-1, keepdims=True)
        p = np.where(den > 0, e / np.where(den > 0, den, 1.0), 0.0)
    o = np.matmul(p, vh)
    return o.astype(out_dtype if out_dtype is not None else q.dtype)
