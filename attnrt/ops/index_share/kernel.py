"""``pkg.nxrt::IndexShare``: the factory and the kernel (validate, plan, launch).

Selected-token sparse attention (DeepSeek DSA / GLM IndexShare). Inputs (schema order):
query [B,N,Sq,H]; key, value [B,Nkv,Scur,H]; optional past_key, past_value
[B,Nkv,Spast,H]; selected_indices [B,1|N,Sq,K] int32/int64 (trailing -1 padding); optional
attention_bias broadcastable (right-aligned) to [B,N,Sq,cache]. Outputs: Y [B,N,Sq,H], and
optionally present_key/present_value, either growing ([B,Nkv,Spast+Scur,H] = past ⧺
current, bit for bit) or fixed-capacity ([B,Nkv,Spast,H], may alias past: the current
tokens land at ``valid_len[b] - Scur`` where ``valid_len`` is the bias's finite frontier,
see :func:`.indices.capacity_valid_lengths`).

Index rules (:mod:`.indices`, shared with the reference): eagerly, ``selected_indices`` is
copied to the host and checked before anything is written or launched (a refused call
changes nothing); a broken row is a :class:`SelectedIndicesError` naming [batch, head,
query, column] and the reason. In capacity mode the bound is the per-batch valid length:
eagerly the bias is read back and :func:`.indices.capacity_valid_lengths` computes it on
the host; the frontier kernel derives the same lengths on the device for the launches
(and alone while capturing). While the
stream is capturing, the attention kernel checks the same rules as it stages each split's
columns and sets latch bit 512 (``attnrt.runtime.latch.INDEX_SHARE_SELECTED_INDICES``);
``rt.latch.check()`` after a replay raises ``CaptureError`` naming it. Every gather index
is clamped, so a poisoned replay never reads out of bounds (its Y is garbage; the latch
says so).

Scratch (split-K partials and counters, the capacity valid lengths) comes from the
caller's workspace when given (``workspace_requirement`` covers every path and present
mode the inputs allow; planning and execution share :func:`.plan.make_plan`), else from
per-kernel pools with stable addresses that grow only in eager calls; needing to grow
while capturing is a ``CaptureError`` naming the missing warm-up. ``capture_support()`` is
"no" until one eager ``execute`` has compiled the kernels and sized the pools.

Every path is bitwise deterministic: fixed reduction orders, no floating-point atomics,
and the plan depends only on shapes, the device and the :class:`IndexShareConfig`. The
paths and their design: docs/notes/index_share.md#design.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnrt.runtime.api import (
    CaptureSupport,
    DataType,
    Node,
    TensorMetadata,
    TensorMut,
    TensorView,
    WorkspaceRequirement,
    WorkspaceView,
)
from attnrt.runtime.errors import CaptureError, KernelError

from .. import _common
from .. import _validate as _v
from .._common import ScratchPool, Variant
from .builds import _ALIGN, _aux_variant
from .indices import SelectedIndicesError, capacity_valid_lengths, check_selected_indices
from .plan import DeviceLimits, IndexShareConfig, Plan, _mma_ok, _wg_ok, make_plan, wgmma_available
from .schema import (
    INPUT_NAMES,
    OP,
    Attributes,
    Geometry,
    bias_strides,
    check_call,
    parse_attributes,
    resolve_geometry,
)
from .schema import unsupported_reason as _unsupported_reason

__all__ = ["IndexShareFactory", "IndexShareKernel", "SelectedIndicesError"]


class IndexShareFactory:
    """Claims ``pkg.nxrt::IndexShare`` and creates :class:`IndexShareKernel` s.

    Parameters
    ----------
    rt
        The runtime kernels are bound to (``None`` is enough for ``unsupported_reason``).
    config
        Pins parts of every created kernel's plan (default: the planner's own choices).
    """

    def __init__(self, rt: Any = None, config: IndexShareConfig | None = None) -> None:
        self.rt = rt
        self.config = config if config is not None else IndexShareConfig()

    def unsupported_reason(self, node: Node, shapes: Sequence[Sequence[int] | None],
                           dtypes: Sequence[DataType | None]) -> str | None:
        """Pure, no GPU: ``None`` when this kernel takes the node, else why not.

        See :func:`~attnrt.ops.index_share.schema.unsupported_reason`.
        """
        return _unsupported_reason(node, shapes, dtypes)

    def create(self, node: Node, input_shapes: Sequence[Sequence[int] | None] = ()) -> IndexShareKernel:
        """A kernel for ``node``.

        Raises
        ------
        KernelError
            The attributes are refused.
        ValueError
            The factory has no runtime.
        """
        if self.rt is None:
            raise ValueError("IndexShareFactory.create needs a runtime: IndexShareFactory(rt)")
        return IndexShareKernel(self.rt, node, parse_attributes(node), self.config)


def _gcd_width(*values: int) -> int:
    for w in (16, 8, 4, 2):
        if all(v % w == 0 for v in values):
            return w
    return 1


class IndexShareKernel:
    """One IndexShare node bound to a runtime (see the module docstring).

    Parameters
    ----------
    rt
        The runtime.
    node
        The node.
    attrs
        Its parsed attributes.
    config
        Pins parts of the plan (path, splits, merge, ...); the default picks the plan the
        planner predicts fastest. ``kernel.config`` may be replaced between calls. Pinning
        ``ws`` and ``splits`` also makes a row's bits independent of the batch size
        (README, Guarantees).

    Attributes
    ----------
    last_plan
        The plan of the latest ``execute`` (it carries its config).
    """

    def __init__(self, rt: Any, node: Node, attrs: Attributes,
                 config: IndexShareConfig | None = None) -> None:
        self.rt = rt
        self.node = node
        self.attrs = attrs
        self.config = config if config is not None else IndexShareConfig()
        self._pool = ScratchPool(rt, OP)
        self._counters = ScratchPool(rt, OP, zeroed=True)
        self._fns: dict[tuple, Any] = {}
        self._warm = False
        self.last_plan: Plan | None = None

    # -- protocol ----------------------------------------------------------------------
    def supports_strided_input(self, index: int) -> bool:
        """Every input must be contiguous."""
        return False

    def capture_support(self) -> CaptureSupport:
        """Supported once an eager ``execute`` has compiled the kernels and sized scratch."""
        if self._warm:
            return CaptureSupport.yes()
        return CaptureSupport.no(
            f"{OP}: not warmed up; run one eager execute with the capture's shapes first (it "
            "compiles the kernels and sizes the pooled scratch)")

    def workspace_requirement(self, inputs: Sequence[TensorMetadata]) -> WorkspaceRequirement:
        """Exact scratch bytes for these inputs (pure: allocates nothing).

        Raises
        ------
        TypeError
            ``inputs`` is not a list, or a slot holds something other than
            ``TensorMetadata``, a view or ``None`` (a raw shape tuple, say).
        KernelError
            The inputs are refused.
        """
        metas = _v.metas(inputs, len(INPUT_NAMES), OP)
        shapes = [None if m is None else m.shape for m in metas]
        dtypes = [None if m is None else m.dtype for m in metas]
        has_past = len(shapes) > 3 and shapes[3] is not None
        wants_present = sum(self.node.output_present(i) for i in range(len(self.node.outputs))) == 3
        cap = has_past and wants_present
        geoms, err = [], None
        for mode in ("none", "capacity") if cap else ("none",):
            try:  # the outputs (unknown here) pick the mode; plan for every one that fits
                geoms.append(resolve_geometry(self.attrs, shapes, dtypes, mode))
            except KernelError as exc:
                err = err or exc
        if not geoms:
            raise err  # type: ignore[misc]
        need, pin = 0, self.config.path
        wg_arch = wgmma_available(DeviceLimits.of(self.rt.capabilities), self.config)
        for g in geoms:
            # The scratch layout does not depend on the chunk width, and aligned tensors
            # admit the widest heads (unaligned ones that cannot run are refused by execute).
            need = max(need, self._make_plan(g, True, "simt", cap).nbytes)
            if pin != "simt" and _mma_ok(g):
                need = max(need, self._make_plan(g, True, "mma", cap).nbytes)
            if pin in (None, "wg") and _wg_ok(g) and wg_arch:
                need = max(need, self._make_plan(g, True, "wg", cap).nbytes)
        return WorkspaceRequirement(need, _ALIGN) if need else WorkspaceRequirement.NONE

    def close(self) -> None:
        """Free the pooled scratch (the kernel stays usable; the next eager call regrows it)."""
        self._pool.release()
        self._counters.release()
        self._warm = False

    def __del__(self) -> None:
        try:
            self._pool.release()
            self._counters.release()
        except Exception as exc:  # never raise from a finaliser
            warnings.warn(f"{OP}: scratch not freed: {exc}", ResourceWarning, stacklevel=1)

    # -- helpers -----------------------------------------------------------------------
    def _make_plan(self, g: Geometry, aligned16: bool, path: str | None, cap: bool) -> Plan:
        """The plan of this call under ``self.config``, its path replaced by ``path``."""
        cfg = self.config if path == self.config.path else dataclasses.replace(self.config,
                                                                              path=path)
        return make_plan(g, DeviceLimits.of(self.rt.capabilities), aligned16=aligned16,
                         capacity_scratch=cap, config=cfg)

    def _fn(self, variant: Variant, entry: str, capturing: bool) -> Any:
        key = (variant.file, variant.options, entry)
        fn = self._fns.get(key)
        if fn is None:
            if capturing:
                raise CaptureError(
                    f"{OP}: kernel {entry} ({variant.module} {dict(variant.defines)}) was not "
                    "loaded by a warm-up; run one eager execute with the capture's shapes, "
                    "dtypes and present mode before begin_capture()")
            fn = _common.get_function(self.rt, variant, entry)
            self._fns[key] = fn
        return fn

    # -- execute -----------------------------------------------------------------------
    def execute(self, inputs: Sequence[TensorView], outputs: Sequence[TensorMut],
                workspace: WorkspaceView | None = None) -> None:
        """Validate, then enqueue IndexShare on ``rt.stream``.

        Raises
        ------
        TypeError
            ``workspace`` is not a :class:`WorkspaceView` (or ``None``).
        KernelError
            A shape, dtype, stride, aliasing or attribute rule is broken, or (eagerly) a
            ``selected_indices`` row breaks the index rules (:class:`SelectedIndicesError`).
        CaptureError
            Capturing before a warm-up: a kernel was never loaded or the scratch pool would
            have to grow.
        WorkspaceError
            ``workspace`` is short or misaligned.
        """
        rt = self.rt
        # Every check first: a refused call reads at most its own inputs back and writes
        # or launches nothing.
        _v.check_workspace_view(workspace, OP)
        g, (q, k, v, pk, pv, idx, bias), (y, prk, prv) = check_call(self.attrs, inputs, outputs)
        ptrs = [t.ptr for t in (q, k, v, pk, pv, y) if t is not None]
        aligned16 = all(p % 16 == 0 for p in ptrs)
        plan = self._make_plan(g, aligned16, self.config.path, g.mode == "capacity")
        self.last_plan = plan
        capturing = rt.is_capturing()
        aux = _aux_variant(g.dtype)
        fn_attn = self._fn(plan.variant, plan.entry, capturing)
        fn_comb = self._fn(aux, "is_combine", capturing) if plan.merge == "kernel" else None
        if g.batch == 0:
            return
        if workspace is not None:
            _common.check_workspace(OP, WorkspaceRequirement(plan.nbytes, _ALIGN), workspace)
        else:
            base = self._pool.ensure(plan.nbytes, capturing)
            counters = 0
            if plan.merge == "last" and g.q_len:
                counters = self._counters.ensure(plan.tasks * 4, capturing)
        rows = g.batch * g.index_heads * g.q_len
        if not capturing and rows:
            # The index rules on the host. In capacity mode the bound is the bias's frontier,
            # derived here from the bias itself (the frontier kernel below derives the same
            # lengths on the device for the launches).
            bounds: Any = g.cache_len
            if g.mode == "capacity":
                host_bias = rt.dtoh(np.empty(bias.shape, dtype=g.dtype.numpy), bias.ptr)
                bounds = capacity_valid_lengths(host_bias, g.batch, g.cache_len)
            host = rt.dtoh(np.empty(idx.shape, dtype=g.index_dtype.numpy), idx.ptr)
            check_selected_indices(host, bounds)
        # Scratch: the caller's workspace, else the pools (stable addresses, grown eagerly).
        # Split counters must be zero before the launch: the pool's are (zeroed when
        # allocated, left at zero by every launch); a workspace's are cleared each call.
        if workspace is not None:
            base, counters = workspace.ptr, 0
            if plan.merge == "last" and g.q_len:
                counters = base + plan.cnt_off
                rt.memset(counters, 0, plan.tasks * 4)
        valid_ptr = base + plan.valid_off if g.mode == "capacity" else 0
        it = g.dtype.itemsize
        i32, i64 = np.int32, np.int64

        if g.mode == "capacity":
            self._frontier(g, bias, valid_ptr, capturing)
        # While capturing, the attention kernel checks the rows as it stages them (latch).
        latch = rt.capture_error_ptr() if capturing else 0

        # Present K/V.
        if g.mode == "concat":
            row = g.head_size * it
            for src_past, src_cur, dst in ((pk, k, prk), (pv, v, prv)):
                if g.past_len:
                    self._copy(g, dst.ptr, src_past.ptr, g.past_len * row, g.total_len * row,
                               capturing)
                self._copy(g, dst.ptr + g.past_len * row, src_cur.ptr, g.cur_len * row,
                           g.total_len * row, capturing)
        elif g.mode == "capacity":
            for src_past, src_cur, dst in ((pk, k, prk), (pv, v, prv)):
                if dst.ptr != src_past.ptr:
                    rt.dtod(dst.ptr, src_past.ptr, dst.nbytes)
                self._scatter(g, dst.ptr, src_cur.ptr, valid_ptr, capturing)

        if g.q_len == 0:
            self._warm = self._warm or not capturing
            return
        # Attention.
        if g.mode == "capacity":
            k0, v0, k1, v1, len0, len1 = prk.ptr, prv.ptr, prk.ptr, prv.ptr, g.cache_len, 0
        elif pk is not None:
            k0, v0, k1, v1, len0, len1 = pk.ptr, pv.ptr, k.ptr, v.ptr, g.past_len, g.cur_len
        else:
            k0, v0, k1, v1, len0, len1 = k.ptr, v.ptr, k.ptr, v.ptr, 0, g.cur_len
        bs = bias_strides(g.bias_shape) if bias is not None else (0, 0, 0, 0)
        part_o = base + plan.part_o_off if plan.partials else 0
        part_ml = base + plan.part_ml_off if plan.partials else 0
        rt.launch(fn_attn, plan.grid, plan.threads,
                  [q.ptr, k0, v0, k1, v1, idx.ptr, bias.ptr if bias is not None else 0, y.ptr,
                   part_o, part_ml, counters, latch, valid_ptr,
                   i64(bs[0]), i64(bs[1]), i64(bs[2]), i64(bs[3]),
                   i32(g.q_len), i32(g.heads), i32(g.group), i32(plan.units), i32(plan.hbk),
                   i32(g.index_heads == 1), i32(g.index_heads), i32(plan.splits), i32(g.width),
                   i32(plan.cps), i32(g.head_size), i32(len0), i32(len1), i32(g.cache_len),
                   i32(g.index_dtype == DataType.INT64), i32(bias is not None), i32(plan.lpk),
                   i32(plan.stages), np.float32(g.scale * math.log2(math.e)),
                   i32(plan.tasks * plan.splits)],
                  shared_mem=plan.smem, programmatic=plan.entry == "is_attn_ws")
        if plan.merge == "kernel":
            # After the warp-specialised kernel, programmatically where it leaves three
            # quarters of the SMs free: is_combine's blocks are resident before the partials
            # are done (and wait for them); with fewer SMs free they crowd onto those (see
            # docs/notes/index_share.md#combine-launch).
            n_rows = g.batch * g.q_len * g.heads
            rt.launch(fn_comb, self._blocks(n_rows * g.head_size), 256,
                      [part_o, part_ml, y.ptr, i64(n_rows), i32(plan.splits), i32(g.head_size),
                       i32(g.q_len), i32(g.heads)],
                      programmatic=plan.entry == "is_attn_ws" and
                      4 * plan.grid <= self.rt.capabilities.sm_count)
        if not capturing:
            self._warm = True

    # -- pieces ------------------------------------------------------------------------
    def _blocks(self, n: int) -> int:
        return max(1, min(-(-n // 256), self.rt.capabilities.sm_count * 16))

    def _copy(self, g: Geometry, dst: int, src: int, seg: int, dst_stride: int,
              capturing: bool) -> None:
        w = _gcd_width(dst, src, seg, dst_stride)
        fn = self._fn(_aux_variant(g.dtype), f"is_copy_w{w}", capturing)
        nseg = g.batch * g.kv_heads
        self.rt.launch(fn, self._blocks(nseg * seg // w), 256,
                       [dst, src, np.int64(nseg), np.int64(seg // w), np.int64(seg // w),
                        np.int64(dst_stride // w)])

    def _scatter(self, g: Geometry, dst: int, src: int, valid_ptr: int, capturing: bool) -> None:
        row = g.head_size * g.dtype.itemsize
        w = _gcd_width(dst, src, row)
        fn = self._fn(_aux_variant(g.dtype), f"is_scatter_w{w}", capturing)
        rows = g.batch * g.kv_heads * g.cur_len
        self.rt.launch(fn, self._blocks(rows * row // w), 256,
                       [dst, src, valid_ptr, np.int32(g.kv_heads), np.int32(g.cur_len),
                        np.int32(g.cache_len), np.int64(rows), np.int64(row // w)])

    def _frontier(self, g: Geometry, bias: TensorView, valid_ptr: int, capturing: bool) -> None:
        fn = self._fn(_aux_variant(g.dtype), "is_frontier", capturing)
        b4 = (1,) * (4 - len(g.bias_shape)) + tuple(g.bias_shape)
        per_batch = b4[1] * b4[2] * b4[3]
        chunk = 4096
        self.rt.memset(valid_ptr, 0, g.batch * 4)
        self.rt.launch(fn, (max(1, -(-per_batch // chunk)), g.batch, 1), 256,
                       [bias.ptr, valid_ptr, np.int32(b4[0]), np.int64(per_batch),
                        np.int32(b4[3]), np.int32(g.cache_len), np.int64(chunk)])
