"""Streams: the runtime's :class:`Stream` and how foreign stream objects are recognised.

A runtime either creates its own non-blocking stream or is bound to an existing one
(``CudaRuntime(device, stream=obj)``). :func:`stream_handle` turns whatever the caller has
into the raw ``CUstream`` handle:

- an object with ``__cuda_stream__`` (the CUDA stream protocol of cuda.core: a method
  returning ``(version, handle)``),
- a torch ``torch.cuda.Stream`` (``.cuda_stream``), a CuPy stream (``.ptr``), our own
  :class:`Stream`,
- a ``cuda.bindings`` ``CUstream``, or a raw handle as a non-negative ``int`` (``0`` is the
  legacy default stream, ``1`` ``CU_STREAM_LEGACY``, ``2`` ``CU_STREAM_PER_THREAD``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._check import check, driver

__all__ = ["Stream", "StreamSwitch", "foreign_stream", "stream_handle", "wait_stream"]


class Stream:
    """A ``CUstream``: ``handle`` is the ``cuda.bindings`` object, ``ptr`` its int.

    ``owned`` says whether the runtime created it (and destroys it in ``close()``).
    """

    def __init__(self, handle: Any, owned: bool = True) -> None:
        self.handle = handle
        self.ptr = int(handle)
        self.owned = owned

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol: ``(version 0, handle)``."""
        return (0, self.ptr)

    def __repr__(self) -> str:
        return f"Stream(0x{self.ptr:x}{'' if self.owned else ', bound'})"


def _as_int(value: Any, what: str, obj: Any) -> int:
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        if int(value) < 0:
            raise ValueError(f"stream handle must be >= 0, got {int(value)} from {what} of {obj!r}")
        return int(value)
    if isinstance(value, driver.CUstream):
        return int(value)
    raise TypeError(f"{what} of {type(obj).__name__} gave {value!r}; expected an int stream handle")


def stream_handle(obj: Any) -> int:
    """The raw ``CUstream`` handle of ``obj`` as an int.

    Parameters
    ----------
    obj
        An object with ``__cuda_stream__`` (method or ``(version, handle)`` attribute), a
        ``.cuda_stream`` (torch) or ``.ptr`` (CuPy, :class:`Stream`) int, a ``CUstream``, or a
        non-negative int.

    Returns
    -------
    int
        The handle (``0``/``1``/``2`` are the legacy, legacy and per-thread default streams).

    Raises
    ------
    TypeError
        ``obj`` is none of the above (e.g. ``None``, a bool, a float).
    ValueError
        A negative handle.
    """
    proto = getattr(obj, "__cuda_stream__", None)
    if proto is not None:
        info = proto() if callable(proto) else proto
        if not (isinstance(info, tuple) and len(info) == 2):
            raise TypeError(f"{type(obj).__name__}.__cuda_stream__ gave {info!r}; expected "
                            "(version, handle)")
        return _as_int(info[1], "__cuda_stream__", obj)
    for attr in ("cuda_stream", "ptr"):
        if hasattr(obj, attr) and not isinstance(obj, (int, np.integer)):
            return _as_int(getattr(obj, attr), f".{attr}", obj)
    if obj is None or isinstance(obj, (bool, np.bool_)):
        raise TypeError(f"expected a stream (an object with __cuda_stream__, .cuda_stream or "
                        f".ptr, a CUstream, or an int handle), got {obj!r}")
    return _as_int(obj, "the value", obj)


def foreign_stream(handle: int, context: Any) -> Stream:
    """A not-owned :class:`Stream` for ``handle``, checked to belong to ``context``.

    Raises
    ------
    ValueError
        The stream belongs to another context (another device, or a non-primary context).
    """
    st = Stream(driver.CUstream(handle), owned=False)
    # The legacy/per-thread handles resolve to the current context (the caller made it ours).
    ctx = check(driver.cuStreamGetCtx(st.handle), "cuStreamGetCtx")
    if int(ctx) != int(context):
        raise ValueError(f"stream 0x{handle:x} belongs to another context than this runtime's "
                         "device (its primary context)")
    return st


class StreamSwitch:
    """The launch configurations of each stream a runtime has left, by stream pointer.

    A ``CUlaunchConfig`` names its stream, so the runtime's config cache is per stream; it
    is also shared with the compiled launcher, so :meth:`switch` swaps its contents in place.
    """

    MAX_STREAMS = 64  # bounded: a caller cycling through many streams does not grow it

    def __init__(self, home: Stream, context: Any) -> None:
        self._home = home
        self._context = context
        self._saved: dict[int, tuple[Stream, dict]] = {}

    def switch(self, handle: int, prev: Stream, configs: dict) -> Stream:
        """Save ``configs`` under ``prev``, load ``handle``'s; return its :class:`Stream`."""
        saved = self._saved.pop(handle, None)
        if handle == self._home.ptr:
            nxt = self._home
        else:
            nxt = saved[0] if saved is not None else foreign_stream(handle, self._context)
        if len(self._saved) >= self.MAX_STREAMS:
            self._saved.pop(next(iter(self._saved)))
        self._saved[prev.ptr] = (prev, dict(configs))
        configs.clear()
        if saved is not None:
            configs.update(saved[1])
        return nxt

    def clear(self) -> None:
        self._saved.clear()


def wait_stream(consumer: int, producer: int) -> None:
    """Make stream ``consumer`` wait for the work enqueued so far on ``producer``.

    An event is recorded on ``producer`` and waited on by ``consumer``; nothing blocks the
    host. A no-op when both are the same stream.
    """
    if consumer == producer:
        return
    flags = driver.CUevent_flags.CU_EVENT_DISABLE_TIMING
    ev = check(driver.cuEventCreate(flags), "cuEventCreate")
    try:
        check(driver.cuEventRecord(ev, driver.CUstream(producer)), "cuEventRecord")
        check(driver.cuStreamWaitEvent(driver.CUstream(consumer), ev, 0), "cuStreamWaitEvent")
    finally:
        # Destroying a recorded event is legal: the wait keeps its own reference.
        check(driver.cuEventDestroy(ev), "cuEventDestroy")
