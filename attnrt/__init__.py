"""attnrt: a driver-level CUDA runtime for Python, with fast attention kernels on top.

The runtime's public names (:class:`CudaRuntime`, the protocol types, the errors) are
re-exported here; the runtime itself is :mod:`attnrt.runtime`, the kernels are
:mod:`attnrt.ops`, and the command line is :mod:`attnrt.app`.
"""

from .runtime import *  # noqa: F403
from .runtime import __all__ as _runtime_all

__all__ = [*_runtime_all]
