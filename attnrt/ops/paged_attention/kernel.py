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
    WorkspaceRequirement,
    WorkspaceView,
)
from attnrt.runtime.errors import Unsupported, WorkspaceError

from .._common import Variant, check_workspace, expect, get_function
from .._validate import check_workspace_view
from . import builds
from .calls import call_metas, call_views, check_aliases
from .plan import (
    DEFAULT_DEVICE,
    WS_ALIGN,
    PagedAttentionConfig,
    PagedPlan,
    partition_overhead,
    partition_slots,
    plan_launch,
    unsplit,
    wg_schedule,
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
    OP,
    PAGED_POSITION_OUT_OF_RANGE,
    POSITION_BIT_NAME,
    PagedGeometry,
    check_node,
    host_metadata,
    parse_attrs,
    unsupported_reason,
    validate,
)

__all__ = ["PagedAttentionFactory", "PagedAttentionKernel"]

_ALL_PHASES = frozenset(("write", "read", "combine"))
_GRID_MAX = (2**31 - 1, 65535, 65535)


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
        """Pure, no GPU: ``None`` when this factory takes the node, else why not.

        Raises
        ------
        TypeError
            ``node`` is not a Node or its attributes are not a dict.
        """
        return unsupported_reason(node, shapes, dtypes)

    def create(self, node: Node, input_shapes: Sequence[Sequence[int] | None] = ()) -> PagedAttentionKernel:
        """Create the kernel for ``node``.

        Raises
        ------
        TypeError
            ``node`` is not a Node or its attributes are not a dict.
        KernelError
            Another op, an unknown or invalid attribute, or more inputs/outputs than the op
            defines.
        Unsupported
            The node is a mode this kernel declines, or a shape is not a sequence of
            non-negative integers (the reason names it).
        """
        check_node(node)
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
    TypeError
        ``node`` is not a Node or its attributes are not a dict.
    KernelError
        An attribute is invalid or unknown, or the node has too many inputs/outputs.
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
        self._maps: dict[tuple, bytes] = {}
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
        TypeError
            ``inputs`` is not a list, or a slot is not metadata, a view or ``None``.
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
        TypeError
            As :meth:`validate`.
        KernelError
            A shape, dtype or attribute does not fit; the message names it.
        """
        ins = call_metas(inputs)
        return self._plan(validate(self.attrs, ins, outputs), host_metadata(ins[IN_ATTENTION_METADATA]),
                          aligned)

    def validate(self, inputs: Sequence[Any], outputs: Sequence[Any] | None = None) -> PagedGeometry:
        """Check every shape, dtype and attribute from metadata alone.

        Raises
        ------
        TypeError
            ``inputs`` is not a list, or a slot (or output) is not metadata, a view or ``None``.
        KernelError
            The first problem found, naming the input, the value and what was expected.
        """
        return validate(self.attrs, call_metas(inputs), outputs)

    def _caps(self) -> Any:
        return self.rt.capabilities if self.rt is not None else DEFAULT_DEVICE

    def _plan(self, g: PagedGeometry, meta: np.ndarray | None, aligned: bool) -> PagedPlan:
        return plan_launch(g, self.attrs.window, self._caps(), self.config, meta, aligned)

    # -- execution -----------------------------------------------------------------------
    def execute(self, inputs: Sequence[Any], outputs: Sequence[TensorMut],
                workspace: WorkspaceView | None = None) -> None:
        """Validate on the host, then launch the write and read phases on ``rt.stream``.

        Every check (and every compile) happens before the first launch, so a refused call
        changes nothing on the device.

        Raises
        ------
        TypeError
            ``inputs``/``outputs`` are not lists of views (``None`` for an absent slot), or
            ``workspace`` is not a :class:`WorkspaceView`.
        KernelError
            A shape, dtype, attribute or alias does not fit, an output overlaps an input,
            more inputs/outputs than the op defines, or the stream is capturing a signature
            that has not run eagerly; nothing was launched.
        WorkspaceError
            ``workspace`` is shorter than :meth:`workspace_requirement` (or misaligned).
        """
        self._last_ok = False
        expect(self.rt is not None, f"{OP}: this kernel was created without a runtime (plan-only)")
        ins, outs = call_views(inputs, outputs)
        check_workspace_view(workspace, OP)
        geo = validate(self.attrs, ins, outs)
        views: list[Any] = [None if v.absent else v for v in ins[:16]]
        q, kc, out = views[IN_QUERY], views[IN_KEY_CACHE], outs[0]
        meta = host_metadata(ins[IN_ATTENTION_METADATA])
        aligned = all(t.ptr % 16 == 0 for t in (q, kc, out))
        plan = self._plan(geo, meta, aligned)
        if workspace is None and plan.ws_bytes:
            plan = unsplit(plan)
        check_workspace(OP, WorkspaceRequirement(plan.ws_bytes, WS_ALIGN) if plan.ws_bytes
                        else WorkspaceRequirement.NONE, workspace)
        ws_bytes = plan.ws_bytes if workspace is not None else 0
        if ws_bytes and workspace.ptr == 0:  # type: ignore[union-attr]
            raise WorkspaceError(f"{OP}: the workspace pointer is null", required=ws_bytes,
                                 provided=workspace.nbytes)  # type: ignore[union-attr]
        check_aliases(ins, outs, workspace.ptr if ws_bytes else 0, ws_bytes)  # type: ignore[union-attr]
        signature = (geo, plan, tuple(None if v is None else v.shape for v in views),
                     not outs[1].absent)
        capturing = self.rt.is_capturing()
        # Only warmed signatures may be captured: docs/notes/paged_attention.md#capture-gating
        expect(not capturing or signature in self._warmed,
               f"{OP}: this shape/dtype/plan has not run eagerly on this kernel; warm the exact "
               "signature before capturing")
        launches = self._launches(geo, plan, views, out, workspace) if plan.path != "none" else []
        self.last_plan = plan
        for fn, grid, block, args, smem, prog in launches:
            self.rt.launch(fn, grid, block, args, shared_mem=smem, programmatic=prog)
        if not capturing:
            self._warmed.add(signature)
        self._last_ok = True

    def _fn(self, variant: Variant, entry: str) -> Any:
        key = (variant.file, variant.options, entry)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = get_function(self.rt, variant, entry)
        return fn

    def _launches(self, g: PagedGeometry, p: PagedPlan, v: list, out: TensorMut,
                  ws: WorkspaceView | None) -> list[tuple]:
        """Every launch of the call as ``(fn, grid, block, args, shared_mem, programmatic)``,
        compiled and checked against the launch limits, so that nothing can fail between two
        launches. Programmatic dependent launch (docs/notes/paged_attention.md#pdl): the wgmma
        read after this call's write kernel, and the combine after the read kernel."""
        a = self.attrs
        i32, f32 = np.int32, np.float32
        sfx = "bf16" if g.dtype == DataType.BFLOAT16 else "f16"
        q, key, kc = v[IN_QUERY], v[IN_KEY], v[IN_KEY_CACHE]
        cu, past, bt, slot = v[IN_CU_SEQLENS], v[IN_PAST_SEQLENS], v[IN_BLOCK_TABLE], v[IN_SLOT_MAPPING]
        rot = int(g.rotary_dim > 0)
        # Without RoPE the cos/sin pointers are never read; pass a valid one anyway.
        cos_p, sin_p = (v[IN_COS].ptr, v[IN_SIN].ptr) if rot else (q.ptr, q.ptr)
        latch = self.rt.capture_error_ptr()
        rope = [i32(g.rotary_dim), i32(a.rotary_offset), i32(g.max_pos), i32(int(a.interleaved)),
                i32(rot)]
        small = builds.small_variant()
        todo: list[tuple] = []
        if "write" in self._phases:
            todo.append((self._fn(small, f"paged_write_{sfx}"), (g.tokens, 1, 1),
                         (builds.WRITE_THREADS, 1, 1),
                         [key.ptr, cos_p, sin_p, slot.ptr, cu.ptr, past.ptr, kc.ptr, latch,
                          i32(g.tokens), i32(g.batch), i32(g.head_size),
                          i32(g.num_blocks * g.block_size), *rope], 0, False))
        common = [i32(g.num_blocks), i32(g.block_size), i32(g.max_blocks), *rope, f32(g.scale),
                  f32(a.softcap), i32(a.window)]
        if p.path == "simple":
            smem = builds.simple_smem_bytes(g.head_size, g.v_head_size)
            todo.append((self._fn(small, f"paged_simple_{sfx}"), (g.tokens * g.heads, 1, 1),
                         (builds.SIMPLE_THREADS, 1, 1),
                         [q.ptr, kc.ptr, cos_p, sin_p, cu.ptr, past.ptr, bt.ptr, out.ptr, latch,
                          i32(g.tokens), i32(g.heads), i32(g.batch), i32(g.head_size),
                          i32(g.v_head_size), *common], smem, False))
            return self._checked(todo)
        # The wgmma kernel uses the mma.sync variant's combine (same partials layout).
        mla = builds.mla_variant(g.dtype, p.block_n if p.path == "mla" else builds.WG_BLOCK_N)
        # Whatever needs the workspace gets it (a partition of one part cuts no row block, yet
        # its CTA needs the counts to walk them all).
        split = ws is not None and p.ws_bytes > 0
        ws_o, ws_lse = (ws.ptr, ws.ptr + p.ws_lse_offset) if split else (0, 0)
        ws_cnt = ws.ptr + p.ws_cnt_offset if split and p.balanced else 0  # type: ignore[union-attr]
        cc = tuple(getattr(self._caps(), "compute_capability", (0, 0)))
        pdl = self.config.programmatic and cc >= (9, 0)
        if "read" in self._phases:
            args = [q.ptr, kc.ptr, cos_p, sin_p, cu.ptr, past.ptr, bt.ptr, out.ptr, ws_o, ws_lse,
                    latch, i32(g.tokens), i32(g.heads), i32(g.batch), *common, i32(p.max_chunks)]
            if p.path == "wg":
                sched = wg_schedule(g, self.config)
                variant = builds.wg_variant(g.dtype, schedule=sched, softcap=a.softcap > 0)
                fn = self._fn(variant, variant.entries[0])
                smem = (builds.mla_pair_smem_bytes(g.head_size) if sched == "pair"
                        else builds.mla_wg_smem_bytes(g.head_size))
                if sched == "pair":
                    # The contiguous partition weighs a row block's fixed cost in tiles.
                    args += [ws_cnt, i32(partition_overhead(self.config)), i32(p.part_lanes),
                             self._kv_map(kc.ptr, g)]
                else:
                    # The device-side split model: the planner's, with the real lengths.
                    c, cfg = self.config.wg_cost, self.config
                    args += [ws_cnt, i32(self._caps().sm_count), f32(c.tile_us),
                             f32(c.prologue_us), f32(c.partial_us), f32(cfg.combine_launch_us),
                             f32(cfg.combine_bytes_per_us)]
            else:
                fn, smem = self._fn(mla, "paged_mla_fwd"), builds.mla_smem_bytes(p.block_n, g.head_size)
            grid = (p.grid_x, p.max_chunks, 1)
            if p.part_ctas:
                grid = (p.part_ctas, 1, 1)
            todo.append((fn, grid, (builds.MLA_THREADS, 1, 1), args, smem,
                         pdl and p.path == "wg" and "write" in self._phases))
        if p.max_chunks > 1 and "combine" in self._phases:
            rows = g.tokens * g.heads
            todo.append((self._fn(mla, "paged_mla_combine"), (rows, 1, 1),
                         (builds.COMBINE_THREADS, 1, 1),
                         [ws_o, ws_lse, out.ptr, i32(rows), i32(p.max_chunks), ws_cnt,
                          i32(self._slot_rows(p)), i32(p.part_lanes * builds.MLA_ROWS)],
                         0, pdl))
        return self._checked(todo)

    @staticmethod
    def _slot_rows(p: PagedPlan) -> int:
        """Slot rows of the partition's workspace (0: the per-row split layout)."""
        if not p.part_ctas:
            return 0
        return partition_slots(p.grid_x, p.part_ctas, p.part_lanes) * builds.MLA_ROWS

    def _kv_map(self, ptr: int, g: PagedGeometry) -> bytes:
        """The latent cache as a TMA tensor map ([blocks * block_size, head_size], 64 x 64
        boxes), encoded once per cache pointer and shape."""
        key = (ptr, g.num_blocks, g.block_size, g.head_size, g.dtype)
        m = self._maps.get(key)
        if m is None:
            if len(self._maps) > 16:
                self._maps.clear()
            m = self._maps[key] = self.rt.tensor_map_2d(
                ptr, g.dtype, (g.num_blocks * g.block_size, g.head_size), g.head_size * 2,
                (64, builds.WG_BLOCK_N))
        return m

    def _checked(self, todo: list[tuple]) -> list[tuple]:
        optin = self._caps().max_shared_per_block_optin
        for fn, grid, _, _, smem, _ in todo:
            expect(all(0 < n <= m for n, m in zip(grid, _GRID_MAX)) and smem <= optin,
                   f"{OP}: launch of {getattr(fn, 'name', fn)} with grid {grid} and {smem} bytes "
                   f"of shared memory exceeds the device's limits {_GRID_MAX} / {optin} bytes")
        return todo
