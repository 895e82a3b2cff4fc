"""The PagedAttention factory and kernel: claim, validate, plan, then launch write and read.

Both phases run on ``rt.stream``: the write phase (``paged_write_*``) stores each new key
row, with partial RoPE, at its slot of the latent cache; the read phase runs the planned
latent kernel (``simple``, ``mla`` or ``wg``) and, when split, the combine. The semantics,
the device-side checks and the capture gating are described in
``docs/notes/paged_attention.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attnrt.runtime.api import (
    CaptureSupport,
    DataType,
    Node,
    TensorMut,
    TensorView,
    WorkspaceRequirement,
    WorkspaceView,
)
from attnrt.runtime.errors import Unsupported

from .._common import Variant, check_workspace, expect, get_function
from . import builds
from .plan import (
    DEFAULT_DEVICE,
    WS_ALIGN,
    PagedAttentionConfig,
    PagedPlan,
    plan_launch,
    unsplit,
)
from .schema import (
    IN_ATTENTION_METADATA,
    IN_BLOCK_TABLE,
    IN_COS,
    IN_CU_SEQLENS,
    IN_KEY,
    IN_KEY_CACHE,
    IN_PAST_SEQLENS,
    IN_QUERY,
    IN_SIN,
    IN_SLOT_MAPPING,
    INPUT_NAMES,
    OP,
    PAGED_POSITION_OUT_OF_RANGE,
    POSITION_BIT_NAME,
    PagedGeometry,
    host_metadata,
    is_absent,
    parse_attrs,
    unsupported_reason,
    validate,
)

__all__ = ["PagedAttentionFactory", "PagedAttentionKernel"]

_ALL_PHASES = frozenset(("write", "read", "combine"))


class PagedAttentionFactory:
    """Claims LATENT ``com.microsoft::PagedAttention`` nodes and creates their kernels.

    Parameters
    ----------
    rt
        The :class:`~attnrt.CudaRuntime` the kernels launch on (``None``: plan-only kernels).
    config
        The planner's knobs (path, tile, split count, cost model); ``None``: the defaults.
    """

    def __init__(self, rt: Any = None, *, config: PagedAttentionConfig | None = None) -> None:
        self.rt = rt
        self.config = config or PagedAttentionConfig()

    def unsupported_reason(self, node: Node, shapes: Sequence[Sequence[int] | None],
                           dtypes: Sequence[DataType | None]) -> str | None:
        """Pure, no GPU: ``None`` when this factory takes the node, else why not."""
        return unsupported_reason(node, shapes, dtypes)

    def create(self, node: Node, input_shapes: Sequence[Sequence[int] | None] = ()) -> PagedAttentionKernel:
        """Create the kernel for ``node``.

        Raises
        ------
        Unsupported
            The node is a mode this kernel declines (the reason names it).
        KernelError
            An attribute is invalid.
        """
        reason = unsupported_reason(node, input_shapes, (), attributes=False)
        if reason is not None:
            raise Unsupported(reason)
        return PagedAttentionKernel(self.rt, node, config=self.config)


class PagedAttentionKernel:
    """One LATENT PagedAttention node on one runtime.

    Parameters
    ----------
    rt
        The :class:`~attnrt.CudaRuntime` (``None``: plan and validate only).
    node
        The node; its attributes are validated here.
    config
        As for :class:`PagedAttentionFactory`.

    Raises
    ------
    KernelError
        An attribute is invalid.
    """

    def __init__(self, rt: Any, node: Node, *, config: PagedAttentionConfig | None = None) -> None:
        self.rt = rt
        self.node = node
        self.attrs = parse_attrs(node)
        self.config = config or PagedAttentionConfig()
        self.last_plan: PagedPlan | None = None
        self._warmed: set[tuple] = set()
        self._last_ok = False
        self._fns: dict[tuple, Any] = {}
        # Phases _launch runs; tools/sweep_paged.py times them one at a time (never in the op).
        self._phases: frozenset[str] = _ALL_PHASES
        if rt is not None:
            try:
                rt.latch.register(PAGED_POSITION_OUT_OF_RANGE, POSITION_BIT_NAME)
            except ValueError:  # another op took the bit; it still latches, under that name
                pass

    # -- protocol ------------------------------------------------------------------------
    def capture_support(self) -> CaptureSupport:
        """Yes once the last ``execute`` succeeded (its signature is warm), else why not."""
        if self._last_ok:
            return CaptureSupport.yes()
        return CaptureSupport.no(f"{OP} requires a warmed exact signature: run it eagerly once "
                                 "with the shapes it will be captured with")

    def supports_strided_input(self, index: int) -> bool:
        """No: every tensor must be contiguous."""
        return False

    def workspace_requirement(self, inputs: Sequence[Any]) -> WorkspaceRequirement:
        """Bytes of split-KV partials for these inputs (pure: allocates nothing).

        Covers every execution with these shapes: ``attention_metadata`` values and
        unaligned pointers may only lower the split count, so they are not looked at.

        Raises
        ------
        KernelError
            The inputs do not fit the node.
        """
        p = self._plan(self.validate(inputs), None, True)  # shapes only: the largest split count
        return WorkspaceRequirement(p.ws_bytes, WS_ALIGN) if p.ws_bytes else WorkspaceRequirement.NONE

    def plan(self, inputs: Sequence[Any], outputs: Sequence[Any] | None = None, *,
             aligned: bool = True) -> PagedPlan:
        """Validate ``inputs`` (views, metadata, or ``None`` for absent) and plan the launch.

        Raises
        ------
        KernelError
            A shape, dtype or attribute does not fit; the message names it.
        """
        geo = self.validate(inputs, outputs)
        meta = host_metadata(inputs[IN_ATTENTION_METADATA]) if len(inputs) > IN_ATTENTION_METADATA \
            else None
        return self._plan(geo, meta, aligned)

    def validate(self, inputs: Sequence[Any], outputs: Sequence[Any] | None = None) -> PagedGeometry:
        """Check every shape, dtype and attribute from metadata alone.

        Raises
        ------
        KernelError
            The first problem found, naming the input, the value and what was expected.
        """
        return validate(self.attrs, inputs, outputs)

    def _caps(self) -> Any:
        return self.rt.capabilities if self.rt is not None else DEFAULT_DEVICE

    def _plan(self, g: PagedGeometry, meta: np.ndarray | None, aligned: bool) -> PagedPlan:
        return plan_launch(g, self.attrs.window, self._caps(), self.config, meta, aligned)

    # -- execution -----------------------------------------------------------------------
    def execute(self, inputs: Sequence[Any], outputs: Sequence[TensorMut],
                workspace: WorkspaceView | None = None) -> None:
        """Validate on the host, then launch the write and read phases on ``rt.stream``.

        Raises
        ------
        KernelError
            A shape, dtype, attribute or alias does not fit, or the stream is capturing a
            signature that has not run eagerly; nothing was launched.
        WorkspaceError
            ``workspace`` is shorter than :meth:`workspace_requirement` (or misaligned).
        """
        self._last_ok = False
        expect(self.rt is not None, f"{OP}: this kernel was created without a runtime (plan-only)")
        ins = list(inputs) + [None] * (17 - len(inputs))
        outs = list(outputs)
        geo = self.validate(ins, outs)
        views = [None if is_absent(x) else x for x in ins[:16]]
        for i, v in enumerate(views):
            expect(v is None or isinstance(v, TensorView),
                   f"{OP}: input '{INPUT_NAMES[i]}' ({i}) must be a device TensorView")
        q, kc = views[IN_QUERY], views[IN_KEY_CACHE]
        out = outs[0]
        if len(outs) > 1 and not is_absent(outs[1]):
            expect(outs[1].ptr == kc.ptr, f"{OP}: output 1 ('key_cache_out') at 0x{outs[1].ptr:x} "
                   f"must alias key_cache at 0x{kc.ptr:x} (the cache is updated in place)")
        meta = host_metadata(ins[IN_ATTENTION_METADATA])
        aligned = all(t.ptr % 16 == 0 for t in (q, kc, out))
        plan = self._plan(geo, meta, aligned)
        if plan.splits > 1 and workspace is None:
            plan = unsplit(plan)
        check_workspace(OP, WorkspaceRequirement(plan.ws_bytes, WS_ALIGN) if plan.ws_bytes
                        else WorkspaceRequirement.NONE, workspace)
        signature = (geo, plan, tuple(None if v is None else v.shape for v in views),
                     len(outs) > 1 and not is_absent(outs[1]))
        capturing = self.rt.is_capturing()
        # Only warmed signatures may be captured: docs/notes/paged_attention.md#capture-gating
        expect(not capturing or signature in self._warmed,
               f"{OP}: this shape/dtype/plan has not run eagerly on this kernel; warm the exact "
               "signature before capturing")
        self.last_plan = plan
        if plan.path != "none":
            self._launch(geo, plan, views, out, workspace)
        if not capturing:
            self._warmed.add(signature)
        self._last_ok = True

    def _fn(self, variant: Variant, entry: str) -> Any:
        key = (variant.file, variant.options, entry)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = get_function(self.rt, variant, entry)
        return fn

    def _launch(self, g: PagedGeometry, p: PagedPlan, v: list, out: TensorMut,
                ws: WorkspaceView | None) -> None:
        a, rt = self.attrs, self.rt
        i32, f32 = np.int32, np.float32
        sfx = "bf16" if g.dtype == DataType.BFLOAT16 else "f16"
        q, key, kc = v[IN_QUERY], v[IN_KEY], v[IN_KEY_CACHE]
        cu, past, bt, slot = v[IN_CU_SEQLENS], v[IN_PAST_SEQLENS], v[IN_BLOCK_TABLE], v[IN_SLOT_MAPPING]
        rot = int(g.rotary_dim > 0)
        # Without RoPE the cos/sin pointers are never read; pass a valid one anyway.
        cos_p, sin_p = (v[IN_COS].ptr, v[IN_SIN].ptr) if rot else (q.ptr, q.ptr)
        latch = rt.capture_error_ptr()
        rope = [i32(g.rotary_dim), i32(a.rotary_offset), i32(g.max_pos), i32(int(a.interleaved)),
                i32(rot)]
        small = builds.small_variant()
        if "write" in self._phases:
            rt.launch(self._fn(small, f"paged_write_{sfx}"), (g.tokens, 1, 1),
                      (builds.WRITE_THREADS, 1, 1),
                      [key.ptr, cos_p, sin_p, slot.ptr, cu.ptr, past.ptr, kc.ptr, latch,
                       i32(g.tokens), i32(g.batch), i32(g.head_size),
                       i32(g.num_blocks * g.block_size), *rope])
        common = [i32(g.num_blocks), i32(g.block_size), i32(g.max_blocks), *rope, f32(g.scale),
                  f32(a.softcap), i32(a.window)]
        if p.path == "simple":
            smem = builds.simple_smem_bytes(g.head_size, g.v_head_size)
            rt.launch(self._fn(small, f"paged_simple_{sfx}"), (g.tokens * g.heads, 1, 1),
                      (builds.SIMPLE_THREADS, 1, 1),
                      [q.ptr, kc.ptr, cos_p, sin_p, cu.ptr, past.ptr, bt.ptr, out.ptr, latch,
                       i32(g.tokens), i32(g.heads), i32(g.batch), i32(g.head_size),
                       i32(g.v_head_size), *common], shared_mem=smem)
            return
        # The wgmma kernel uses the mma.sync variant's combine (same partials layout).
        mla = builds.mla_variant(g.dtype, p.block_n if p.path == "mla" else builds.WG_BLOCK_N)
        ws_o, ws_lse = (ws.ptr, ws.ptr + p.ws_lse_offset) if ws is not None and p.splits > 1 \
            else (0, 0)
        if "read" in self._phases:
            if p.path == "wg":
                fn = self._fn(builds.wg_variant(g.dtype), "paged_mla_wg_fwd")
                smem = builds.mla_wg_smem_bytes(g.head_size)
            else:
                fn, smem = self._fn(mla, "paged_mla_fwd"), builds.mla_smem_bytes(p.block_n, g.head_size)
            rt.launch(fn, (p.grid_x, p.splits, 1), (builds.MLA_THREADS, 1, 1),
                      [q.ptr, kc.ptr, cos_p, sin_p, cu.ptr, past.ptr, bt.ptr, out.ptr, ws_o, ws_lse,
                       latch, i32(g.tokens), i32(g.heads), i32(g.batch), *common, i32(p.splits)],
                      shared_mem=smem)
        if p.splits > 1 and "combine" in self._phases:
            rows = g.tokens * g.heads
            rt.launch(self._fn(mla, "paged_mla_combine"), (rows, 1, 1), (builds.COMBINE_THREADS, 1, 1),
                      [ws_o, ws_lse, out.ptr, i32(rows), i32(p.splits)])
