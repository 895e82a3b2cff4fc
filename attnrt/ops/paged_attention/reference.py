"""float64 numpy reference for ``com.microsoft::PagedAttention`` (LATENT): the test oracle.

Written from the op's equations (``docs/notes/paged_attention.md#semantics``), independently
of the kernels and their planner: the write phase scatters each new key row (partial RoPE at
its position, rounded to the cache dtype) into a copy of ``key_cache``; the read phase runs
causal attention of every (token, head) over the cached keys ``j <= p`` through
``block_table``, with V the leading ``v_head_size`` channels of the same rows. Inputs are
never modified.

A call is validated as the kernel validates it (:func:`.calls.check_host_call`: the same
rules on the arrays' shapes and dtypes, the same typed errors), and the attribute values
are the parsed ones (float attributes rounded to float32, as the kernels use them). Only
the math below is the reference's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attnrt.runtime.api import Node

from .calls import check_host_call

__all__ = ["paged_attention"]


def _rope(x: np.ndarray, pos: int, cos: np.ndarray, sin: np.ndarray, offset: int,
          interleaved: bool) -> np.ndarray:
    """Partial RoPE on the last axis of float64 ``x`` at position ``pos`` (a new array)."""
    half = cos.shape[1]
    c = cos[pos].astype(np.float64)
    s = sin[pos].astype(np.float64)
    y = np.array(x, dtype=np.float64, copy=True)
    if interleaved:
        i1 = offset + 2 * np.arange(half)
        i2 = i1 + 1
    else:
        i1 = offset + np.arange(half)
        i2 = i1 + half
    x1, x2 = y[..., i1].copy(), y[..., i2].copy()
    y[..., i1] = x1 * c - x2 * s
    y[..., i2] = x2 * c + x1 * s
    return y


def _locate(cu: np.ndarray, batch: int, t: int) -> int:
    """The sequence holding token ``t`` (largest b with cu[b] <= t, if t < cu[b+1]); -1 if none."""
    b = int(np.searchsorted(cu[:batch], t, side="right")) - 1
    if b < 0 or t >= cu[b + 1]:
        return -1
    return b


def paged_attention(node: Node, inputs: Sequence[np.ndarray | None], *,
                    strict: bool = True, out_dtype: Any = None) -> list[np.ndarray]:
    """``[output [T, H * v_head_size], updated key_cache]`` in the inputs' dtype (the output
    in ``out_dtype`` when given, e.g. ``np.float64`` for the result before rounding).

    Parameters
    ----------
    node
        The PagedAttention node (LATENT attributes).
    inputs
        Numpy arrays in schema order (query, key, value, key_cache, value_cache,
        cumulative_sequence_length, past_seqlens, block_table, cos_cache, sin_cache,
        slot_mapping, ...); ``None`` for absent slots.
    strict
        Raise on a slot, block id or RoPE position out of range. With ``False`` behave as
        the device does: the write or the key is skipped (a token without a valid position
        gets a zero output row).

    Raises
    ------
    TypeError
        The node is malformed, or an input is not a numpy array (or ``None``).
    Unsupported
        A mode the kernel declines (SEPARATE layout, ``kv_num_heads != 1``, ``value``...).
    KernelError
        What the kernel refuses: a shape, dtype or attribute that does not fit, fewer
        than the required inputs, unknown attributes, extra inputs.
    ValueError
        ``strict`` and an index input points outside the cache, table or cos/sin table.
    """
    a, g = check_host_call(node, inputs)
    q, key, kc = inputs[0], inputs[1], inputs[3]
    cu, past, bt, slots = (np.asarray(inputs[i]).astype(np.int64) for i in (5, 6, 7, 10))
    dtype = q.dtype
    H, vhs, scale = a.num_heads, g.v_head_size, g.scale
    nb, bs, _, hs = kc.shape
    softcap, window, rotary = a.softcap, a.window, a.do_rotary
    interleaved, offset = a.interleaved, a.rotary_offset
    cos = np.asarray(inputs[8]) if rotary else np.zeros((0, 1))
    sin = np.asarray(inputs[9]) if rotary else np.zeros((0, 1))
    T, B, max_blocks = q.shape[0], past.shape[0], bt.shape[1]

    def bad(msg: str) -> None:
        if strict:
            raise ValueError(f"PagedAttention reference: {msg}")

    def position(t: int) -> int:
        """Absolute position of token t, or -1 (no valid position)."""
        b = _locate(cu, B, t)
        if b < 0:
            return -1
        pos = int(past[b] + t - cu[b])
        if rotary and not 0 <= pos < cos.shape[0]:
            bad(f"token {t} position {pos} is outside cos_cache [0, {cos.shape[0]})")
            return -1
        return pos

    cache = np.array(kc, copy=True)
    flat = cache.reshape(nb * bs, hs)
    for t in range(T):
        slot = int(slots[t])
        if slot < 0:
            continue
        if slot >= nb * bs:
            bad(f"slot_mapping[{t}] = {slot} is outside the cache ({nb * bs} slots)")
            continue
        if rotary:
            pos = position(t)
            if pos < 0:
                if _locate(cu, B, t) < 0:
                    bad(f"token {t} is in no sequence of cumulative_sequence_length")
                continue
            flat[slot] = _rope(key[t].astype(np.float64), pos, cos, sin, offset,
                               interleaved).astype(dtype)
        else:
            flat[slot] = key[t]

    out = np.zeros((T, H, vhs), dtype=np.float64)
    for t in range(T):
        pos = position(t)
        if pos < 0:
            continue
        b = _locate(cu, B, t)
        lo = max(0, pos - window) if window >= 0 else 0
        rows = []
        for j in range(lo, pos + 1):
            blk = j // bs
            phys = int(bt[b, blk]) if blk < max_blocks else -1
            if not 0 <= phys < nb:
                bad(f"block_table[{b}, {blk}] = {phys} (key {j} of sequence {b}) is outside "
                    f"the cache ({nb} blocks) or the table ({max_blocks} columns)")
                continue
            rows.append(phys * bs + j % bs)
        if not rows:
            continue
        k = flat[np.asarray(rows)].astype(np.float64)           # [n, hs]
        qt = q[t].astype(np.float64).reshape(H, hs)
        if rotary:
            qt = _rope(qt, pos, cos, sin, offset, interleaved)
        s = (qt @ k.T) * scale                                   # [H, n]
        if softcap > 0:
            s = softcap * np.tanh(s / softcap)
        s -= s.max(axis=1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=1, keepdims=True)
        out[t] = p @ k[:, :vhs]
    return [out.reshape(T, H * vhs).astype(dtype if out_dtype is None else out_dtype), cache]
