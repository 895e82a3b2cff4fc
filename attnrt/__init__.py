"""attnrt: a driver-level CUDA runtime for Python, with fast attention kernels on top.

The runtime's public names (:class:`CudaRuntime`, the protocol types, the errors) are
re-exported here; the runtime itself is :mod:`attnrt.runtime`, the kernels are
:mod:`attnrt.ops`, and the command line is :mod:`attnrt.app`. The functional ops
(``attnrt.attention``, ``attnrt.paged_attention``/``attnrt.mla_decode``,
``attnrt.index_share``) and the plan/run classes (``attnrt.Attention``, ...) come from
:mod:`attnrt.ops.functional` on first access, so ``import attnrt`` does not import the ops.
"""

from typing import Any

from .runtime import *  # noqa: F403
from .runtime import __all__ as _runtime_all

#: Names served lazily from attnrt.ops.functional (PEP 562).
_FUNCTIONAL = ("attention", "paged_attention", "mla_decode", "index_share", "Attention",
               "PagedAttention", "IndexShare", "OpPlan")

__all__ = [*_runtime_all, *_FUNCTIONAL]


def __getattr__(name: str) -> Any:
    if name in _FUNCTIONAL:
        from .ops import functional

        return getattr(functional, name)
    raise AttributeError(f"module 'attnrt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FUNCTIONAL))
