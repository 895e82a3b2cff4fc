"""Stream capture and executable graphs."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from ._check import check, driver, succeeded
from .errors import CaptureError, CudaError

if TYPE_CHECKING:
    from .runtime import CudaRuntime

__all__ = ["Graph", "CAPTURE_MODES"]

CAPTURE_MODES = {
    "global": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
    "thread_local": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    "relaxed": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
}


def _instantiate(graph: Any) -> Any:
    return check(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")


class Graph:
    """A captured graph and its executable instance, bound to one runtime's stream.

    ``replay()`` launches it on the runtime's stream; ``update(other)`` takes the node
    parameters of a topologically identical graph (cuGraphExecUpdate), re-instantiating
    when the driver refuses the update.
    """

    def __init__(self, runtime: CudaRuntime) -> None:
        self._rt = runtime
        self._graph: Any = None
        self._exec: Any = None
        self._exec_c: Any = None  # the instance as a ctypes handle (replay's hot path)
        self._stream_c = ctypes.c_void_p(int(runtime.stream.handle))
        self._launch_c = runtime._fast.graph_launch_fn
        self.replays = 0
        self.reinstantiations = 0

    def _set_exec(self, exec_: Any) -> None:
        self._exec = exec_
        self._exec_c = None if exec_ is None else ctypes.c_void_p(int(exec_))

    def _adopt(self, graph: Any) -> None:
        self._graph = graph
        try:
            self._set_exec(_instantiate(graph))
        except CudaError:
            check(driver.cuGraphDestroy(graph), "cuGraphDestroy")
            self._graph = None
            raise

    @property
    def ready(self) -> bool:
        return self._exec is not None

    @property
    def num_nodes(self) -> int:
        if self._graph is None:
            return 0
        _nodes, n = check(driver.cuGraphGetNodes(self._graph, 0), "cuGraphGetNodes")
        return int(n)

    def _require(self) -> None:
        if self._exec is None:
            raise CaptureError("this graph has no executable instance yet: replay it after the "
                               "capture block has ended (or it was destroyed)")

    def replay(self) -> None:
        """Launch the graph on the runtime's stream (asynchronous).

        The hot path is one foreign call: the instance launches in its stream's context,
        whatever context the calling thread has current (no per-replay context probe:
        ~0.5 us of host time, and as much device time when the device was idle, H200). Any
        driver error retries once with the runtime's context made current, through the
        checked binding, which raises the :class:`CudaError`.
        """
        exec_c = self._exec_c
        if exec_c is None:
            self._require()
        if self._rt._closed:
            raise ValueError("replay(): the graph's CudaRuntime is closed")
        if self._launch_c(exec_c, self._stream_c):
            self._rt.device.make_current()
            check(driver.cuGraphLaunch(self._exec, self._rt.stream.handle), "cuGraphLaunch")
        self.replays += 1

    def update(self, other: Graph) -> bool:
        """Take ``other``'s node parameters; returns ``False`` when it had to re-instantiate.

        ``other`` keeps its own instance; this graph now holds a copy of ``other``'s
        topology and parameters either way.
        """
        self._require()
        other._require()
        self._rt.device.make_current()
        clone = check(driver.cuGraphClone(other._graph), "cuGraphClone")
        res = driver.cuGraphExecUpdate(self._exec, clone)
        if succeeded(res):
            # Keep the graph the instance now matches, so a later update *from* this graph
            # hands on the new parameters.
            check(driver.cuGraphDestroy(self._graph), "cuGraphDestroy")
            self._graph = clone
            return True
        # Topology or node kinds differ: instantiate the clone instead.
        try:
            new_exec = _instantiate(clone)
        except CudaError:
            check(driver.cuGraphDestroy(clone), "cuGraphDestroy")
            raise
        check(driver.cuGraphExecDestroy(self._exec), "cuGraphExecDestroy")
        check(driver.cuGraphDestroy(self._graph), "cuGraphDestroy")
        self._graph = clone
        self._set_exec(new_exec)
        self.reinstantiations += 1
        return False

    def destroy(self) -> None:
        """Free the graph and its instance (idempotent)."""
        if self._exec is not None:
            check(driver.cuGraphExecDestroy(self._exec), "cuGraphExecDestroy")
            self._set_exec(None)
        if self._graph is not None:
            check(driver.cuGraphDestroy(self._graph), "cuGraphDestroy")
            self._graph = None

    def __del__(self) -> None:
        try:
            self.destroy()
        except Exception:  # destructors never raise
            pass
