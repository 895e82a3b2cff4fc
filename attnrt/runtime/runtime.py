"""CudaRuntime: one device, its primary context, one stream, the cache, the ledger, the latch."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from . import compiler, memory, tma
from ._check import check, driver, fast_driver, value_or_none
from .cache import CompileCache, default_cache
from .device import Capabilities, Device
from .errors import CaptureError
from .graph import CAPTURE_MODES, Graph
from .latch import Latch
from .launch import Function, dim3, ptx_param_count
from .memory import Ledger, MemoryStats
from .streams import Stream, StreamSwitch, foreign_stream, stream_handle

try:  # the optional compiled launch path (setup.py builds it where a C compiler exists)
    from . import _launchc
except ImportError:
    _launchc = None

__all__ = ["CudaRuntime", "Stream"]

_CAPTURE_NONE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


class CudaRuntime:
    """Everything attnrt does on one device.

    Parameters
    ----------
    device
        Device ordinal.
    cache
        The compile cache (default: the process-wide one, shared by all runtimes).
    stream
        Bind to an existing stream of this device instead of creating one: anything
        :func:`~attnrt.runtime.streams.stream_handle` takes (``__cuda_stream__``, a torch or
        CuPy stream, a ``CUstream``, a raw handle). Not owned: :meth:`close` never destroys it.

    Raises
    ------
    ValueError
        ``stream`` belongs to another device's context.

    Notes
    -----
    Every call that touches the device first makes this runtime's context current, so
    several runtimes (same or different devices) coexist in one process and one thread.
    While the stream is capturing (by us, or by torch on a bound stream), :meth:`alloc_raw`,
    :meth:`free_raw`, :meth:`synchronize`, :meth:`htod`, :meth:`dtoh` and latch reads raise
    :class:`CaptureError`. Ordering across streams: ``docs/guide/streams.md``.
    """

    def __init__(self, device: int = 0, *, cache: CompileCache | None = None,
                 stream: Any = None) -> None:
        handle = None if stream is None else stream_handle(stream)
        self.device = Device(device)
        self.capabilities: Capabilities = self.device.capabilities
        self.cache = cache if cache is not None else default_cache()
        self._fast = fast_driver()
        self.arch, self.arch_exact = compiler.target_arch(self.capabilities.arch)
        if handle is None:
            flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING
            self.stream = Stream(check(driver.cuStreamCreate(flags), "cuStreamCreate"))
        else:
            self.stream = foreign_stream(handle, self.device.context)
        self._home = self.stream
        self._streams = StreamSwitch(self._home, self.device.context)
        self._began_capture = False
        # (grid, block, shared_mem) -> (CUlaunchConfig address, its ctypes reference)
        self._configs: dict[tuple, tuple[int, Any]] = {}
        self._cu_launch = self._fast.launch_fn
        self._ledger = Ledger()
        self._modules: dict[tuple, Any] = {}
        self._functions: dict[tuple, Function] = {}
        self._by_module: dict[tuple, Function] = {}
        self._ptx: dict[tuple, bytes] = {}
        self._fn_lock = threading.Lock()
        self._capture_graph: Graph | None = None
        self._py_launches = 0
        self._launcher = None
        if _launchc is not None and os.environ.get("ATTNRT_COMPILED_LAUNCH", "1") != "0":
            # The compiled hot path shadows the method below for this instance; it calls
            # _launch_py for everything off the hot path (same checks, same errors).
            self._launcher = _launchc.Launcher(self._fast.launch_address, self._configs,
                                               self._launch_py, self._launch_failed)
            self.launch = self._launcher.launch
        self._closed = False
        latch_ptr = memory.alloc(4)
        memory.memset(latch_ptr, 0, 4, self.stream.handle)
        self.latch = Latch(self, latch_ptr)

    # -- lifetime ---------------------------------------------------------------------
    def close(self) -> None:
        """Synchronize, unload modules, free the latch and the stream (idempotent).

        Live allocations are reported with a ``ResourceWarning`` and freed.
        """
        if self._closed:
            return
        self.device.make_current()
        if self.is_capturing():
            if not self._began_capture:
                raise CaptureError("close(): the stream is being captured by its owner (not by "
                                   "this runtime); end that capture first")
            self.abort_capture()
        for s in {self.stream.ptr: self.stream, self._home.ptr: self._home}.values():
            check(driver.cuStreamSynchronize(s.handle), "cuStreamSynchronize")
        leaked = self._ledger.pointers()
        if leaked:
            warnings.warn(f"CudaRuntime.close(): freeing {len(leaked)} live allocation(s) "
                          f"({self._ledger.stats().live_bytes} bytes)", ResourceWarning, stacklevel=2)
            for p in leaked:
                self.free_raw(p)
        memory.free(self.latch.ptr)
        for mod in self._modules.values():
            check(driver.cuLibraryUnload(mod), "cuLibraryUnload")
        self._modules.clear()
        self._ptx.clear()
        self._configs.clear()
        self._functions.clear()
        self._by_module.clear()
        self._streams.clear()
        if self._home.owned:
            check(driver.cuStreamDestroy(self._home.handle), "cuStreamDestroy")
        self._closed = True
        self.device.release()

    def __enter__(self) -> CudaRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self.capabilities
        return f"CudaRuntime(device={c.ordinal}, {c.name!r}, {c.arch}, closed={self._closed})"

    def _live(self) -> None:
        if self._closed:
            raise ValueError("this CudaRuntime is closed")
        self.device.make_current()

    # -- streams ------------------------------------------------------------------------
    def set_stream(self, stream: Any = None) -> Stream:
        """Enqueue every later launch, copy and capture of this runtime on ``stream``.

        ``None`` goes back to the runtime's own (or constructor-bound) stream; a stream set
        here is not owned. Launch configurations are kept per stream, so switching costs a
        dictionary swap. The functional API calls this with the caller's current stream.

        Returns
        -------
        Stream
            The stream that was current before the call.

        Raises
        ------
        ValueError
            ``stream`` belongs to another device's context, or the runtime is closed.
        """
        handle = self._home.ptr if stream is None else stream_handle(stream)
        prev = self.stream
        if handle != prev.ptr:
            self._live()
            self.stream = self._streams.switch(handle, prev, self._configs)
        return prev

    # -- capture rules -----------------------------------------------------------------
    def is_capturing(self) -> bool:
        """Whether the runtime's stream is being captured."""
        status = check(driver.cuStreamIsCapturing(self.stream.handle), "cuStreamIsCapturing")
        return status != _CAPTURE_NONE

    def _refuse_while_capturing(self, what: str) -> None:
        if self.is_capturing():
            raise CaptureError(f"{what} is not allowed while the stream is capturing: do it "
                               "before begin_capture() (warm-up) or after end_capture()")

    # -- memory -------------------------------------------------------------------------
    def alloc_raw(self, nbytes: int) -> int:
        """Allocate ``nbytes`` of device memory (recorded in the ledger); returns the pointer."""
        if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ValueError(f"alloc_raw needs a non-negative int byte count, got {nbytes!r}")
        self._live()
        self._refuse_while_capturing(f"alloc_raw({nbytes})")
        ptr = memory.alloc(int(nbytes))
        self._ledger.add(ptr, int(nbytes))
        return ptr

    def free_raw(self, ptr: int) -> None:
        """Free a pointer from :meth:`alloc_raw`; unknown or double frees are ``ValueError``."""
        self._live()
        self._refuse_while_capturing(f"free_raw(0x{int(ptr):x})")
        self._ledger.remove(int(ptr))
        memory.free(int(ptr))

    def memory_stats(self) -> MemoryStats:
        """Live bytes, peak, live count and totals of this runtime's allocations."""
        return self._ledger.stats()

    def htod(self, ptr: int, host: Any) -> None:
        """Copy a host array to ``ptr`` (returns when the host buffer may be reused)."""
        self._live()
        self._refuse_while_capturing("htod")
        arr = np.ascontiguousarray(host)
        self._ledger.check_range(int(ptr), arr.nbytes, "htod")
        memory.htod(int(ptr), arr, self.stream.handle)

    def dtoh(self, host: np.ndarray, ptr: int) -> np.ndarray:
        """Fill ``host`` (a writable C-contiguous array) from ``ptr``; waits for the stream."""
        self._live()
        self._refuse_while_capturing("dtoh")
        self._ledger.check_range(int(ptr), getattr(host, "nbytes", 0), "dtoh")
        return memory.dtoh(host, int(ptr), self.stream.handle)

    def dtod(self, dst: int, src: int, nbytes: int) -> None:
        """Device-to-device copy on the stream (capturable)."""
        self._live()
        self._ledger.check_range(int(dst), int(nbytes), "dtod destination")
        self._ledger.check_range(int(src), int(nbytes), "dtod source")
        memory.dtod(int(dst), int(src), int(nbytes), self.stream.handle)

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        """Set ``nbytes`` bytes to ``value`` on the stream (capturable)."""
        self._live()
        self._ledger.check_range(int(ptr), int(nbytes), "memset")
        memory.memset(int(ptr), int(value), int(nbytes), self.stream.handle)

    def synchronize(self) -> None:
        """Wait for the stream."""
        self._live()
        self._refuse_while_capturing("synchronize")
        check(driver.cuStreamSynchronize(self.stream.handle), "cuStreamSynchronize")

    # -- compile and launch -------------------------------------------------------------
    def nvrtc_function(self, module: str, source: str, entry: str, options: Sequence[str] = (),
                       *, headers: Mapping[str, str] | None = None,
                       arch: str | None = None) -> Function:
        """Compile (through the cache) and load ``entry`` from ``source``.

        A repeat call with the same arguments returns the same :class:`Function` without
        hashing, disk I/O or driver calls.

        Parameters
        ----------
        module
            A name for the translation unit (used in errors and the cache listing).
        source
            CUDA C++ text; entries should be ``extern "C"``.
        entry
            The kernel's name.
        options
            Extra NVRTC options; order does not matter.
        headers
            In-memory headers (include name → text), e.g. our ``.cuh`` files.
        arch
            Override the target (e.g. ``"sm_90a"`` for wgmma); default: the device's.
        """
        opts = tuple(options)
        hkey = tuple(sorted(headers.items())) if headers else ()
        key = (module, entry, opts, arch, source, hkey)
        fn = self._functions.get(key)
        if fn is not None:
            return fn
        with self._fn_lock:
            fn = self._functions.get(key)
            if fn is not None:
                return fn
            self._live()
            target, exact = (self.arch, self.arch_exact) if arch is None else compiler.target_arch(arch)
            mkey = (module, opts, target, source, hkey)
            mod = self._modules.get(mkey)
            if mod is None:
                compiled = self.cache.get(source, module + ".cu", target, opts, headers)
                self._ptx[mkey] = compiled.ptx
                image = compiled.cubin if exact and compiled.cubin else compiled.ptx
                mod = check(driver.cuLibraryLoadData(image, None, None, 0, None, None, 0),
                            f"cuLibraryLoadData({module})")
                self._modules[mkey] = mod
            # One Function per loaded entry, however it was asked for, so per-function state
            # (the opted-in shared memory limit, the parameter layout) is never split.
            fn = self._by_module.get((mkey, entry))
            if fn is None:
                handle = check(driver.cuLibraryGetKernel(mod, entry.encode()),
                               f"cuLibraryGetKernel({module}, {entry})")
                fn = Function(handle, entry, module, self.capabilities.max_shared_per_block_optin,
                              self.device.handle, self.device.make_current,
                              ptx_param_count(self._ptx.get(mkey, b""), entry))
                self._by_module[(mkey, entry)] = fn
            self._functions[key] = fn
            return fn

    def tensor_map_2d(self, address: int, dtype: Any, shape: tuple[int, int], row_bytes: int,
                      box: tuple[int, int], l2_promotion: int = 256) -> bytes:
        """:func:`attnrt.runtime.tma.tensor_map_2d` (same parameters, returns and raises),
        asked of the runtime so that one without a driver (a test double) can stand in."""
        return tma.tensor_map_2d(address, dtype, shape, row_bytes, box, l2_promotion)

    @property
    def launch_count(self) -> int:
        """Launches made through :meth:`launch` (both paths) since this runtime was created."""
        return self._py_launches + (self._launcher.count if self._launcher is not None else 0)

    @property
    def compiled_launch(self) -> bool:
        """True when :meth:`launch` runs the compiled hot path (``attnrt.runtime._launchc``)."""
        return self._launcher is not None

    def launch(self, fn: Function, grid: int | Sequence[int], block: int | Sequence[int],
               args: Sequence[Any], shared_mem: int = 0, *, programmatic: bool = False) -> None:
        """Launch ``fn`` on the runtime's stream.

        ``args``: device pointers as ``int``, scalars as numpy scalars. Dynamic shared memory
        above 48 KiB raises the function's limit once.

        ``programmatic=True`` launches with programmatic dependent launch (cc >= 9.0; also
        inside a capture, as a programmatic edge of the graph): ``fn`` may start while the
        stream's previous kernel is still finishing, so ``fn`` must execute
        ``griddepcontrol.wait`` before it touches any memory that kernel reads or writes
        (the wait returns once that kernel has completed and its writes are visible). Only
        kernels written that way may take it; it goes by the pure-Python path. When the
        optional extension
        ``attnrt.runtime._launchc`` is built (``pip install`` does it where a C compiler exists), the
        instance's ``launch`` is its compiled hot path, which defers to this method for
        anything unusual; ``ATTNRT_COMPILED_LAUNCH=0`` keeps this pure-Python path.

        Raises
        ------
        TypeError
            An argument's kind or size does not match the kernel's parameter (nothing launched).
        ValueError
            A bad grid/block, or more shared memory than the device allows.
        CudaError
            The driver refused the launch.
        """
        return self._launch_py(fn, grid, block, args, shared_mem, programmatic=programmatic)

    def _launch_py(self, fn: Function, grid: Any, block: Any, args: Sequence[Any],
                   shared_mem: int = 0, *, programmatic: bool = False) -> None:
        # Hot path: one dict lookup for the cached CUlaunchConfig, argument packing, and one
        # foreign call. A CUkernel launched on a non-null stream runs in the stream's
        # context, so no context switch is needed whichever context is current here.
        # (Programmatic configs have a 4-tuple key, which the compiled path never looks up.)
        key = (grid, block, shared_mem, True) if programmatic else (grid, block, shared_mem)
        try:
            cfg = self._configs.get(key)
        except TypeError:  # lists are unhashable: normalise
            cfg = None
        if cfg is None:
            norm = (_hashable(grid), _hashable(block), shared_mem)
            cfg = self._launch_config(norm + (True,) if programmatic else norm)
        if shared_mem > 49152:
            fn.ensure_shared(shared_mem)
        if args:
            params = fn.pack_c(args)
        elif fn._params == ():  # checked: the kernel takes no arguments
            params = None
        else:
            params = fn.no_args()
        err = self._cu_launch(cfg[1], fn.handle_c, params, None)
        if err:
            self._launch_failed(err, fn, grid, block, shared_mem)
        self._py_launches += 1

    def _launch_failed(self, err: int, fn: Function, grid: Any, block: Any, shared_mem: Any) -> None:
        self._fast.raise_for(err, f"cuLaunchKernelEx({fn.name}, grid={grid}, block={block}, "
                                  f"shared_mem={shared_mem})")

    def _launch_config(self, key: tuple) -> Any:
        if self._closed:  # close() empties the config cache, so a closed runtime lands here
            raise ValueError("launch(): this CudaRuntime is closed")
        grid, block, shared_mem = key[:3]
        g, b = dim3(grid, "grid"), dim3(block, "block")
        if not isinstance(shared_mem, (int, np.integer)) or shared_mem < 0:
            raise ValueError(f"shared_mem must be a non-negative int, got {shared_mem!r}")
        struct, ref = self._fast.config(g, b, int(shared_mem), self.stream.ptr,
                                        programmatic=len(key) == 4)
        cfg = (ctypes.addressof(struct), ref)  # the reference keeps the struct alive
        if len(self._configs) > 4096:  # bounded: shapes that change every call don't grow it
            self._configs.clear()
        self._configs[key] = cfg
        return cfg

    # -- graphs -------------------------------------------------------------------------
    def begin_capture(self, mode: str = "thread_local") -> None:
        """Start capturing the runtime's stream (``mode``: thread_local, global, relaxed)."""
        if mode not in CAPTURE_MODES:
            raise ValueError(f"capture mode must be one of {sorted(CAPTURE_MODES)}, got {mode!r}")
        self._live()
        if self.is_capturing():
            raise CaptureError("begin_capture: the stream is already capturing")
        check(driver.cuStreamBeginCapture(self.stream.handle, CAPTURE_MODES[mode]),
              "cuStreamBeginCapture")
        self._began_capture = True

    def end_capture(self) -> Graph:
        """Stop capturing and instantiate the captured work as a :class:`Graph`."""
        self._live()
        if not self.is_capturing():
            raise CaptureError("end_capture: the stream is not capturing")
        self._began_capture = False
        raw = check(driver.cuStreamEndCapture(self.stream.handle), "cuStreamEndCapture")
        g = Graph(self)
        g._adopt(raw)
        return g

    def abort_capture(self) -> None:
        """End a capture and discard what it recorded; the stream is usable afterwards."""
        self.device.make_current()
        res = driver.cuStreamEndCapture(self.stream.handle)
        # An invalidated capture ends with an error but still leaves capture mode.
        if value_or_none(res) is not None:
            driver.cuGraphDestroy(res[1])

    @contextlib.contextmanager
    def capture(self, mode: str = "thread_local") -> Iterator[Graph]:
        """``with rt.capture() as g: ...`` then ``g.replay()``.

        If the block raises, the capture is aborted and the error propagates.
        """
        self.begin_capture(mode)
        g = Graph(self)
        try:
            yield g
        except BaseException:
            self.abort_capture()
            raise
        self._began_capture = False
        raw = check(driver.cuStreamEndCapture(self.stream.handle), "cuStreamEndCapture")
        g._adopt(raw)

    # -- latch --------------------------------------------------------------------------
    def capture_error_ptr(self) -> int:
        """Device address of the 4-byte latch word (pass it to kernels as a pointer)."""
        return self.latch.ptr
