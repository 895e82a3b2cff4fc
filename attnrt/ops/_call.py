"""The functional API's machinery: the per-device runtimes, the per-runtime cache of
kernels, plans and workspace arenas, and one call's library, runtime and stream."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from attnrt.runtime.api import DataType, TensorView, WorkspaceView
from attnrt.runtime.errors import KernelError
from attnrt.runtime.tensors import DeviceArray

from . import _dlpack
from .planned import OpPlan, _PlannedOp

__all__ = ["default_runtime", "clear_cache", "Call", "MAX_PLANS", "signature"]

MAX_PLANS = 512  # plans (and their arenas) kept per runtime; decode shapes change every step


class _Entry:
    __slots__ = ("plan", "arena", "pinned")

    def __init__(self, plan: OpPlan) -> None:
        self.plan = plan
        self.arena: DeviceArray | None = None
        self.pinned = False  # used while capturing: a graph may hold the arena's address


class _State:
    """The functional API's cache for one runtime."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.lock = threading.RLock()
        self.ops: dict[tuple, _PlannedOp] = {}
        self.plans: OrderedDict[tuple, _Entry] = OrderedDict()

    def op(self, key: tuple, make: Any) -> Any:
        op = self.ops.get(key)
        if op is None:
            op = self.ops[key] = make()
        return op

    def entry(self, op: _PlannedOp, key: tuple, views: list[Any]) -> _Entry:
        e = self.plans.get(key)
        if e is not None:
            self.plans.move_to_end(key)
            return e
        e = _Entry(op._plan([None if v is None or v.absent else v.meta for v in views]))
        if len(self.plans) >= MAX_PLANS and not self.rt.is_capturing():
            # Drop the least recently used quarter; pinned entries stay (a graph uses them).
            unpinned = [k for k, old in self.plans.items() if not old.pinned]
            for k in unpinned[: len(self.plans) - MAX_PLANS * 3 // 4]:
                old = self.plans.pop(k)
                if old.arena is not None:
                    old.arena.free()
        self.plans[key] = e
        return e

    def clear(self) -> None:
        for e in self.plans.values():
            if e.arena is not None:
                e.arena.free()
        for op in self.ops.values():
            op.close()
        self.plans.clear()
        self.ops.clear()


_RUNTIMES: dict[int, Any] = {}
_GLOBAL = threading.Lock()
_ATTR = "_attnrt_functional_state"  # the state lives on its runtime and dies with it


def default_runtime(device: int = 0) -> Any:
    """The runtime the functional API uses on ``device`` (created on first use).

    Its stream is switched to the caller's current stream on each call; its latch collects
    device-side errors of captured replays (``default_runtime().latch.check()``).
    """
    rt = _RUNTIMES.get(device)
    if rt is None:
        with _GLOBAL:
            rt = _RUNTIMES.get(device)
            if rt is None:
                from attnrt.runtime.runtime import CudaRuntime
                rt = _RUNTIMES[device] = CudaRuntime(device)
    return rt


def _state(rt: Any) -> _State:
    st = getattr(rt, _ATTR, None)
    if st is None:
        with _GLOBAL:
            st = getattr(rt, _ATTR, None)
            if st is None:
                st = _State(rt)
                setattr(rt, _ATTR, st)
    return st


def clear_cache(runtime: Any = None) -> None:
    """Free the cached kernels, plans and workspace arenas (of ``runtime``, default: all).

    Raises
    ------
    CaptureError
        A runtime's stream is capturing (nothing may be freed then).
    """
    for rt in [runtime] if runtime is not None else list(_RUNTIMES.values()):
        st = getattr(rt, _ATTR, None)
        if st is not None:
            with st.lock:
                st.clear()


class Call:
    """One functional call: library, runtime, stream and state, entered under the lock."""

    def __init__(self, first: Any, runtime: Any) -> None:
        self.lib = _dlpack.library_of(first)
        if runtime is None:
            dev = _dlpack.device_of(first)
            self.rt = default_runtime(0 if dev is None else dev)
            self.stream = _dlpack.current_stream(self.lib, 0 if dev is None else dev)
            self.switch = True
        else:
            self.rt, self.stream, self.switch = runtime, None, False
        self.state = _state(self.rt)
        self.first = first

    def __enter__(self) -> Call:
        self.state.lock.acquire()
        try:
            if self.switch:
                self.rt.set_stream(self.stream)
                if self.stream is not None and self.stream <= 2:
                    # Legacy/per-thread default streams run in the *current* context.
                    self.rt.device.make_current()
            own = self.lib not in (_dlpack.TORCH, _dlpack.CUPY)
            st = getattr(self.rt, "stream", None)
            self.dlpack_stream = st.ptr if own and st is not None else -1
        except BaseException:
            self.state.lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.state.lock.release()

    def views(self, objs: list[Any]) -> list[TensorView]:
        return [_dlpack.as_view(o, stream_ptr=self.dlpack_stream) for o in objs]

    def output(self, given: Any, meta: Any, what: str) -> tuple[Any, Any]:
        if given is None:
            obj = _dlpack.empty(self.lib, self.first, meta.shape, meta.dtype, self.rt)
        else:
            obj = given
        mut = _dlpack.as_mut(obj, stream_ptr=self.dlpack_stream)
        if given is not None and (mut.dtype != meta.dtype or mut.shape != meta.shape):
            raise KernelError(f"{what} is {mut.dtype.name} {list(mut.shape)}; expected "
                              f"{meta.dtype.name} {list(meta.shape)}")
        return obj, mut

    def workspace(self, e: _Entry) -> WorkspaceView | None:
        req = e.plan.workspace
        if not req.nbytes:
            return None
        if self.lib == _dlpack.TORCH:
            torch = __import__("torch")
            buf = torch.empty(req.nbytes + req.alignment, dtype=torch.uint8, device=self.first.device)
            ptr = -(-buf.data_ptr() // req.alignment) * req.alignment
            self._keep = buf  # alive until the launch is enqueued; torch orders its reuse
            return WorkspaceView(ptr, req.nbytes)
        if e.arena is None:
            e.arena = DeviceArray(self.rt, (req.nbytes + req.alignment,), DataType.UINT8)
        if not e.pinned and self.rt.is_capturing():
            e.pinned = True
        ptr = -(-e.arena.ptr // req.alignment) * req.alignment
        return WorkspaceView(ptr, req.nbytes)

    def finish(self, outs: list[Any]) -> None:
        ptr = getattr(getattr(self.rt, "stream", None), "ptr", None)
        for o in outs:
            if isinstance(o, DeviceArray):
                o.stream_ptr = ptr


def signature(views: list[TensorView]) -> tuple:
    """The cache key of a call's inputs: dtype, shape and strides of each (None: absent)."""
    return tuple(None if v is None or v.absent else (v.dtype, v.shape, v.strides) for v in views)
