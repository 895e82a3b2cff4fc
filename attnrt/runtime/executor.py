"""A small reference executor: plan workspaces → run → warm up → capture → replay.

Users with their own executors can read this as the intended use of the kernel protocol::

    ex = Executor(rt)
    ex.add(node, AttentionFactory(rt))       # claims the node (unsupported_reason) and creates it
    ex.bind("q", q_view); ex.bind("out", out_mut)
    ex.plan()                                 # one aligned workspace arena per step
    ex.run()                                  # eager
    ex.capture()                              # warm-up run, then the whole step as one graph
    ex.replay()                               # replays, then checks the latch
    ex.close()                                # frees the arenas; the ledger is back where it was
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .api import CaptureSupport, Kernel, KernelFactory, Node, TensorMut, TensorView, WorkspaceView
from .errors import CaptureError, Unsupported

if TYPE_CHECKING:
    from .graph import Graph
    from .runtime import CudaRuntime

__all__ = ["Executor", "Step"]


@dataclass
class Step:
    """One node, its created kernel, and its workspace arena (after :meth:`Executor.plan`)."""

    node: Node
    kernel: Kernel
    workspace_ptr: int = 0
    workspace_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Executor:
    """Runs a fixed list of nodes over named, bound device tensors on one runtime."""

    def __init__(self, rt: CudaRuntime) -> None:
        self.rt = rt
        self.steps: list[Step] = []
        self.tensors: dict[str, TensorView] = {}
        self.graph: Graph | None = None
        self._planned = False

    # -- building -----------------------------------------------------------------------
    def bind(self, name: str, tensor: TensorView) -> None:
        """Bind a tensor to a name used by the nodes' inputs/outputs.

        After :meth:`capture`, rebinding a name to another pointer would leave the graph
        reading the old one, so it is refused; update contents in place instead.
        """
        old = self.tensors.get(name)
        if self.graph is not None and old is not None and old.ptr != tensor.ptr:
            raise CaptureError(f"bind({name!r}): the step is captured with 0x{old.ptr:x}; copy the "
                               "new contents into that buffer instead of rebinding")
        self.tensors[name] = tensor

    def add(self, node: Node, factory: KernelFactory, input_shapes: Sequence[Any] | None = None) -> Step:
        """Claim ``node`` with ``factory`` (its ``unsupported_reason``) and create its kernel.

        ``input_shapes`` default to the shapes of the tensors bound to the node's inputs.
        """
        ins = [self.tensors.get(n) if n else None for n in node.inputs]
        shapes = list(input_shapes) if input_shapes is not None else [t.shape if t else None for t in ins]
        dtypes = [t.dtype if t else None for t in ins]
        reason = factory.unsupported_reason(node, shapes, dtypes)
        if reason is not None:
            raise Unsupported(f"{node.domain}::{node.op_type}: {reason}")
        step = Step(node, factory.create(node, shapes))
        self.steps.append(step)
        self._planned = False
        return step

    def _views(self, step: Step) -> tuple[list[TensorView], list[TensorMut]]:
        def get(name: str | None, out: bool) -> TensorView:
            if not name:
                return TensorMut.absent_slot() if out else TensorView.absent_slot()
            try:
                t = self.tensors[name]
            except KeyError:
                raise ValueError(f"{step.node.op_type}: tensor {name!r} is not bound") from None
            if out and not isinstance(t, TensorMut):
                t = TensorMut(t.ptr, t.dtype, t.shape, t.strides, owner=t.owner)
            return t

        return ([get(n, False) for n in step.node.inputs],
                [get(n, True) for n in step.node.outputs])  # type: ignore[misc]

    # -- planning and running ---------------------------------------------------------------
    def plan(self) -> None:
        """Ask each kernel for its workspace and allocate one aligned arena per step."""
        self._free_arenas()
        for step in self.steps:
            ins, _ = self._views(step)
            req = step.kernel.workspace_requirement([None if t.absent else t.meta for t in ins])
            if req.nbytes:
                # Over-allocate by the alignment so the arena can be aligned inside it.
                raw = self.rt.alloc_raw(req.nbytes + req.alignment)
                step.extra["raw"] = raw
                step.workspace_ptr = (raw + req.alignment - 1) // req.alignment * req.alignment
                step.workspace_bytes = req.nbytes
        self._planned = True

    def run(self) -> None:
        """Execute every step once on the runtime's stream (eager, or inside a capture)."""
        if not self._planned:
            self.plan()
        for step in self.steps:
            ins, outs = self._views(step)
            ws = WorkspaceView(step.workspace_ptr, step.workspace_bytes) if step.workspace_bytes else None
            step.kernel.execute(ins, outs, ws)

    def capture_support(self) -> CaptureSupport:
        for step in self.steps:
            cs = step.kernel.capture_support()
            if not cs.supported:
                return CaptureSupport.no(f"{step.node.domain}::{step.node.op_type}: {cs.reason}")
        return CaptureSupport.yes()

    def capture(self, warmup: int = 1) -> Graph:
        """Warm up ``warmup`` eager runs, then capture the whole step as one graph.

        Raises
        ------
        CaptureError
            A kernel reports that it cannot be captured (its reason is quoted).
        """
        for _ in range(warmup):
            self.run()
        self.rt.synchronize()
        self.rt.latch.check()
        cs = self.capture_support()
        if not cs.supported:
            raise CaptureError(f"cannot capture this step: {cs.reason}")
        if self.graph is not None:
            self.graph.destroy()
        with self.rt.capture() as g:
            self.run()
        self.graph = g
        return g

    def replay(self, check_latch: bool = True) -> None:
        """Replay the captured step; with ``check_latch``, wait and raise on latched errors."""
        if self.graph is None:
            raise CaptureError("replay() before capture()")
        self.graph.replay()
        if check_latch:
            self.rt.latch.check()

    def _free_arenas(self) -> None:
        for step in self.steps:
            raw = step.extra.pop("raw", None)
            if raw:
                self.rt.free_raw(raw)
            step.workspace_ptr = step.workspace_bytes = 0

    def close(self) -> None:
        """Destroy the graph, free every arena, and close kernels that own memory (``close()``)."""
        if self.graph is not None:
            self.graph.destroy()
            self.graph = None
        self._free_arenas()
        for step in self.steps:
            close = getattr(step.kernel, "close", None)
            if callable(close):
                close()
        self._planned = False

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
