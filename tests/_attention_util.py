"""Shared helpers of the Attention GPU tests: nodes, seeded host inputs, device buffers
freed on exit, and the check against the float64 reference."""

from __future__ import annotations

import contextlib

import numpy as np

import attnrt
from attnrt.ops import reference
from attnrt.ops.attention import AttentionConfig, AttentionKernel
from attnrt.runtime.api import Node
from tests._nodes import attention_node
from tests._util import TOL, rel_fro


def make_node(H, Hkv, _mask=False, **attrs) -> Node:
    return attention_node({"num_heads": H, "kv_num_heads": Hkv, **attrs}, _mask)


def dec(**kw) -> AttentionConfig:
    """A config that forces the single-kernel decode path."""
    return AttentionConfig(path="decode", **kw)


def host_inputs(rng, dtype, B, H, Hkv, Sq, Sk, D, planes=0, masked_row=False, masked_at="middle"):
    """Q, K, V (and a mask of ``planes`` planes with ~20 % of keys at -inf) as numpy arrays.
    ``masked_row``: one query row sees nothing (``masked_at`` "middle": row Sq // 2 when
    Sq > 1; "last": row Sq - 1, also for Sq == 1)."""
    npdt = dtype.numpy
    q = rng.standard_normal((B, H, Sq, D), dtype=np.float32).astype(npdt)
    k = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32).astype(npdt)
    v = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32).astype(npdt)
    mask = None
    if planes:
        m = rng.standard_normal((planes, Sq, Sk), dtype=np.float32)
        m[rng.random((planes, Sq, Sk)) < 0.2] = -np.inf  # some keys masked outright
        if masked_row and masked_at == "last":
            m[:, Sq - 1, :] = -np.inf
        elif masked_row and Sq > 1:
            m[:, Sq // 2, :] = -np.inf
        mask = m.astype(npdt)
    return [q, k, v, mask]


class Buffers(contextlib.ExitStack):
    """Device buffers and kernels (decode kernels own a counter pool) released on exit: the
    ledger must return to zero."""

    def __init__(self, rt):
        super().__init__()
        self.rt = rt

    def array(self, host=None, shape=None, dtype=None) -> attnrt.DeviceArray:
        a = (attnrt.DeviceArray.from_numpy(self.rt, host) if host is not None
             else attnrt.DeviceArray(self.rt, shape, dtype))
        self.callback(a.free)
        return a

    def raw(self, nbytes: int) -> int:
        p = self.rt.alloc_raw(nbytes)
        self.callback(self.rt.free_raw, p)
        return p

    def kernel(self, node, config: AttentionConfig | None = None) -> AttentionKernel:
        k = AttentionKernel(self.rt, node, config)
        self.callback(k.close)
        return k


def check(node, host, got, dtype):
    """Assert ``got`` is within the dtype's tolerance of the float64 reference; return it."""
    want = reference.attention(node, host, out_dtype=np.float64)
    err = rel_fro(got, want)
    assert err <= TOL[dtype], f"relative Frobenius error {err:.3g} > {TOL[dtype]}"
    return want
