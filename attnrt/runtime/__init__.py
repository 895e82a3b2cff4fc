"""attnrt.runtime: the driver-level CUDA runtime (the only code that calls cuda.bindings)."""

from .api import (
    CaptureSupport,
    DataType,
    Kernel,
    KernelFactory,
    Node,
    TensorMetadata,
    TensorMut,
    TensorView,
    WorkspaceLifetime,
    WorkspaceRequirement,
    WorkspaceView,
)
from .cache import CompileCache, default_cache
from .device import Capabilities, device_count, gpu_missing_reason
from .errors import (
    AttnrtError,
    CaptureError,
    CompileError,
    CudaError,
    KernelError,
    PerformanceWarning,
    Unsupported,
    WorkspaceError,
)
from .graph import Graph
from .launch import Function, LaunchConfig, reduction_launch_config
from .memory import MemoryStats
from .runtime import CudaRuntime
from .tensors import DeviceArray

__version__ = "0.1.0"

__all__ = [
    "CaptureError", "CaptureSupport", "Capabilities", "CompileCache", "CompileError",
    "CudaError", "CudaRuntime", "DataType", "DeviceArray", "Function", "Graph", "Kernel", "KernelError",
    "KernelFactory", "LaunchConfig", "MemoryStats", "Node", "AttnrtError", "PerformanceWarning",
    "TensorMetadata", "TensorMut", "TensorView", "Unsupported", "WorkspaceError", "WorkspaceLifetime",
    "WorkspaceRequirement", "WorkspaceView", "default_cache", "device_count",
    "gpu_missing_reason", "reduction_launch_config", "__version__",
]
