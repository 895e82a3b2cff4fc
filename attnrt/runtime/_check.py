"""The single place that unwraps ``(err, *values)`` tuples returned by cuda.bindings.

Everything above this module sees plain values or :class:`~attnrt.runtime.errors.CudaError`.
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver, nvrtc

from .errors import CudaError

__all__ = ["check", "check_nvrtc", "succeeded", "value_or_none", "failed_with", "driver", "nvrtc",
           "load_driver", "driver_missing_reason", "driver_version", "fast_driver", "FastDriver",
           "tensor_map_2d"]

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_NVRTC_SUCCESS = nvrtc.nvrtcResult.NVRTC_SUCCESS


def _unwrap(values: tuple) -> Any:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return values


def check(result: tuple, call: str) -> Any:
    """Unwrap a driver result tuple; raise :class:`CudaError` on failure.

    Returns ``None`` for calls with no outputs, the value for one output, else a tuple.
    """
    err = result[0]
    if err != _SUCCESS:
        raise _driver_error(err, call)
    return _unwrap(result[1:])


def succeeded(result: tuple) -> bool:
    """Whether a driver result tuple reports ``CUDA_SUCCESS`` (its values left alone)."""
    return result[0] == _SUCCESS


def value_or_none(result: tuple) -> Any:
    """Unwrap a driver result tuple like :func:`check`, but ``None`` instead of raising.

    For calls whose failure is an answer rather than an error (an optional query, a cleanup
    that may find nothing to clean up).
    """
    return _unwrap(result[1:]) if succeeded(result) else None


def failed_with(result: tuple, name: str) -> bool:
    """Whether a driver result tuple failed with the ``CUresult`` called ``name``.

    Raises
    ------
    AttributeError
        ``name`` is not a ``CUresult`` member (a typo, not a driver answer).
    """
    return result[0] == getattr(driver.CUresult, name)


def _driver_error(err: Any, call: str) -> CudaError:
    code = int(err)
    name = getattr(err, "name", f"CUresult {code}")
    detail = ""
    try:
        e2, text = driver.cuGetErrorString(err)
        if e2 == _SUCCESS and text:
            detail = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # pragma: no cover - the error string is a nicety
        pass
    return CudaError(code, name, call, detail)


def check_nvrtc(result: tuple, call: str) -> Any:
    """Unwrap an NVRTC result tuple; raise :class:`CudaError` on failure."""
    err = result[0]
    if err != _NVRTC_SUCCESS:
        raise CudaError(int(err), getattr(err, "name", str(err)), call)
    return _unwrap(result[1:])


_driver_state: dict[str, Any] = {}


def load_driver() -> None:
    """``cuInit(0)`` once per process.

    Raises
    ------
    CudaError
        ``CUDA_ERROR_NO_DEVICE`` when there is no driver library or no device.
    """
    if _driver_state.get("ok"):
        return
    if "error" in _driver_state:
        raise _driver_state["error"]
    try:
        result = driver.cuInit(0)
    except Exception as exc:  # the driver library itself is absent (no GPU machine)
        err = CudaError(int(driver.CUresult.CUDA_ERROR_NO_DEVICE), "CUDA_ERROR_NO_DEVICE",
                        "cuInit(0)", f"no NVIDIA driver library could be loaded ({exc})")
        _driver_state["error"] = err
        raise err from None
    try:
        check(result, "cuInit(0)")
    except CudaError as err:
        _driver_state["error"] = err
        raise
    _driver_state["ok"] = True


def driver_missing_reason() -> str | None:
    """``None`` when a CUDA device is usable, else one sentence saying why not."""
    try:
        load_driver()
        count = check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
    except CudaError as err:
        return f"no usable CUDA device: {err}"
    if count == 0:
        return "no usable CUDA device: the driver reports 0 devices"
    return None


def driver_version() -> int:
    """The driver's CUDA version as ``1000 * major + 10 * minor`` (``cuDriverGetVersion``).

    Raises
    ------
    CudaError
        The call fails (e.g. no driver library).
    """
    load_driver()
    return int(check(driver.cuDriverGetVersion(), "cuDriverGetVersion"))


class FastDriver:
    """ctypes entry point of libcuda's ``cuLaunchKernelEx`` for the launch hot path.

    ``cuda.bindings.driver.cuLaunchKernel`` converts eleven Python arguments per call; here a
    launch is four pre-built ctypes objects (a cached ``CUlaunchConfig``, the kernel handle,
    the parameter array, NULL), so the foreign call costs a fraction of a microsecond. The
    GIL is released during the call (``hold_gil=True`` keeps it: slightly cheaper, but a
    launch that blocks on a full queue would stall other Python threads). This class is the
    only other place a ``CUresult`` is compared; it raises :class:`CudaError` like :func:`check`.
    """

    def __init__(self, hold_gil: bool = False) -> None:
        import ctypes

        class LaunchConfig(ctypes.Structure):
            _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                        ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                        ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]

        class LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: id, pad, 64-byte value
            # (the value union is 8-byte aligned; its first int is the flag set here)
            _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_uint), ("value", ctypes.c_uint64),
                        ("rest", ctypes.c_char * 56)]

        lib = (ctypes.PyDLL if hold_gil else ctypes.CDLL)("libcuda.so.1")
        self._launch = lib.cuLaunchKernelEx
        self._launch.restype = ctypes.c_int  # arguments arrive pre-wrapped: no argtypes
        self._graph_launch = lib.cuGraphLaunch
        self._graph_launch.restype = ctypes.c_int
        self._struct = LaunchConfig
        self._attr = LaunchAttribute
        self._byref = ctypes.byref

    def config(self, grid: tuple, block: tuple, shared: int, stream: int,
               programmatic: bool = False) -> Any:
        """A reusable ``CUlaunchConfig``: (struct, reference to pass to :attr:`launch_fn`).

        ``programmatic``: with the launch attribute ``PROGRAMMATIC_STREAM_SERIALIZATION``
        (programmatic dependent launch, cc >= 9.0), see :meth:`CudaRuntime.launch`.
        """
        import ctypes

        attrs, n = None, 0
        if programmatic:
            attr = self._attr(int(driver.CUlaunchAttributeID
                                  .CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION), 0, 1)
            attrs, n = ctypes.addressof(attr), 1
        cfg = self._struct((grid[0], grid[1], grid[2]), (block[0], block[1], block[2]),
                           shared, stream, attrs, n)
        if programmatic:
            cfg.keep_alive = attr  # the struct points into it
        return cfg, self._byref(cfg)  # a byref object holds on to its struct

    @property
    def launch_address(self) -> int:
        """The address of libcuda's ``cuLaunchKernelEx`` (for the compiled launch path)."""
        import ctypes

        return ctypes.cast(self._launch, ctypes.c_void_p).value or 0

    @property
    def launch_fn(self) -> Any:
        """The raw foreign function ``(config_ref, kernel, params, None) -> CUresult int``."""
        return self._launch

    @property
    def graph_launch_fn(self) -> Any:
        """The raw foreign ``cuGraphLaunch`` ``(exec c_void_p, stream c_void_p) -> CUresult int``."""
        return self._graph_launch

    def raise_for(self, err: int, call: str) -> None:
        """Raise the :class:`CudaError` for a nonzero result of :attr:`launch_fn`."""
        raise _driver_error(driver.CUresult(err), call)

    def launch(self, cfg_ref: Any, fn: Any, params: Any, what: Any) -> None:
        """Launch ``fn`` (``c_void_p``) with ``params`` (``c_void_p`` or None)."""
        err = self._launch(cfg_ref, fn, params, None)
        if err:
            raise _driver_error(driver.CUresult(err), what() if callable(what) else str(what))


_fast: list[FastDriver] = []


def fast_driver() -> FastDriver:
    """The process's :class:`FastDriver` (after :func:`load_driver`)."""
    if not _fast:
        load_driver()
        _fast.append(FastDriver())
    return _fast[0]


def tensor_map_2d(address: int, bf16: bool, inner: int, rows: int, row_bytes: int,
                  box: tuple[int, int], l2_promotion: int = 256) -> bytes:
    """The 128-byte ``CUtensorMap`` of a row-major ``[rows, inner]`` 16-bit tensor for TMA
    loads of ``box = (inner elements, rows)`` boxes in the 128-byte swizzle; elements outside
    the tensor read as zero; L2 fills promoted to ``l2_promotion`` bytes (0, 64, 128, 256).
    For a kernel's ``__grid_constant__`` parameter (pass the bytes)."""
    import ctypes

    t, u32, u64 = driver.CUtensorMapDataType, driver.cuuint32_t, driver.cuuint64_t
    promo = driver.CUtensorMapL2promotion
    promotion = {0: promo.CU_TENSOR_MAP_L2_PROMOTION_NONE,
                 64: promo.CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
                 128: promo.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                 256: promo.CU_TENSOR_MAP_L2_PROMOTION_L2_256B}[l2_promotion]
    tmap = check(driver.cuTensorMapEncodeTiled(
        t.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 if bf16 else t.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
        address, [u64(inner), u64(rows)], [u64(row_bytes)], [u32(b) for b in box],
        [u32(1), u32(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        promotion,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    return ctypes.string_at(tmap.getPtr(), 128)
