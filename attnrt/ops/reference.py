"""numpy references for the three ops (CPU only): the oracle in tests and a CPU fallback.

Each takes the op's inputs as numpy arrays in schema order (``None`` for an absent slot)
and the same :class:`~attnrt.runtime.api.Node` the kernel gets. Computation is float64 internally;
results come back in the inputs' dtype unless ``out_dtype`` says otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attnrt.runtime.api import Node

__all__ = ["attention", "paged_attention", "index_share"]


def attention(node: Node, inputs: Sequence[np.ndarray | None], **kw: Any) -> np.ndarray:
    """``pkg.nxrt::Attention``: returns the output [B, H, Sq, D]."""
    from .attention.reference import attention as impl

    return impl(node, inputs, **kw)


def paged_attention(node: Node, inputs: Sequence[np.ndarray | None], **kw: Any) -> list[np.ndarray]:
    """``com.microsoft::PagedAttention`` (LATENT): returns ``[output, key_cache]``."""
    from .paged_attention.reference import paged_attention as impl

    return impl(node, inputs, **kw)


def index_share(node: Node, inputs: Sequence[np.ndarray | None], present: str = "none",
                **kw: Any) -> list[np.ndarray]:
    """``pkg.nxrt::IndexShare``: returns ``[Y]`` or ``[Y, present_key, present_value]``."""
    from .index_share.reference import index_share as impl

    return impl(node, inputs, present=present, **kw)
