"""``pkg.nxrt::IndexShare``: selected-token sparse attention (DeepSeek DSA / GLM IndexShare).

Inputs (schema order): query [B,N,Sq,H]; key, value [B,Nkv,Scur,H]; optional past_key,
past_value [B,Nkv,Spast,H]; selected_indices [B,1|N,Sq,K] int32/int64 (trailing -1
padding); optional attention_bias broadcastable (right-aligned) to [B,N,Sq,cache].
Outputs: Y [B,N,Sq,H], and optionally present_key/present_value, either growing
([B,Nkv,Spast+Scur,H] = past ⧺ current, bit for bit) or fixed-capacity ([B,Nkv,Spast,H],
may alias past: the current tokens land at ``valid_len[b] - Scur`` where ``valid_len`` is
the bias's finite frontier, see :func:`._ref_index_share.capacity_valid_lengths`).

Index rules (:func:`._ref_index_share.find_index_violation`, shared with the reference):
eagerly, ``selected_indices`` is copied to the host and checked before anything that
changes an output is launched; a broken row is a :class:`SelectedIndicesError` (a
``KernelError``) naming [batch, head, query, column] and the reason. In capacity mode the
bound is the per-batch valid length: the frontier kernel derives it from the bias on the
device and only those B integers are read back (instead of the whole bias), so eager
capacity mode costs one small device round trip. While the stream is capturing, the
attention kernel itself checks the same rules as it stages each split's columns (every
rule is local to a column and its left neighbour) and sets latch bit 512
(``attnrt.runtime.latch.INDEX_SHARE_SELECTED_INDICES``); ``rt.latch.check()`` after a replay raises
``CaptureError`` naming it. Every gather index is clamped, so a poisoned replay never reads
out of bounds (its Y is garbage, by design: the latch says so).

Scratch (split-K partials and counters, the capacity valid lengths) comes from the
caller's workspace when given (``workspace_requirement`` covers every path and present
mode the inputs allow; planning and execution share ``_plan``), else from per-kernel pools
with stable addresses that grow only in eager calls; needing to grow while capturing is a
``CaptureError`` naming the missing warm-up. ``capture_support()`` is "no" until one eager
``execute`` has compiled the kernels and sized the pools. The planner (``_plan`` and its
rules) lives in ``_index_share_plan``, the builds and their tunables in
``_index_share_builds``; this module re-exports the public names.

Kernels (``cuda/index_share_*.cu``): a CUDA-core path for every dtype and head size
(warps split the selected keys, 16-byte coalesced row gathers, shuffle reductions in a
fixed order), and a tensor-core path for f16/bf16 with H in {64, 128} when >= 8 heads
share an index row and a kv head (the group's heads form the MMA M dimension, so each
gathered row is read once per CTA; a multi-stage cp.async ring keeps several tiles of rows
in flight). On sm_90 (Hopper) groups of >= ``WG_MIN_GROUP`` heads sharing an index row take
a wgmma path instead (``cuda/index_share_wg.cu``, sm_90a): 64 heads per warpgroup as the
wgmma M dimension, S = Q K^T and O += P V issued asynchronously straight from the swizzled
cp.async ring; layouts (warpgroups, head rows) in ``WG_LAYOUTS`` and the knobs ``wgs``,
``mrows``, ``overlap`` (FA3's intra-warpgroup pipelining), ``qreg`` (Q in registers) and
``minb`` (3: registers capped so three CTAs share an SM). Groups of ``WS_MIN_GROUP`` heads
or more take the warp-specialised persistent build
(``cuda/index_share_ws.cu``, knob ``ws``): one CTA per SM loops over (task, split) items
of up to 128 heads, a producer warpgroup stages and validates each item's index columns one
item ahead and gathers 128-key tiles into mbarrier rings, two consumer warpgroups share
every tile (knobs ``ctas``: cap the grid; ``q2``: two Q slots, one split and int32 indices
only). ``ATTNRT_INDEX_SHARE_WG=0`` turns the wgmma path off. Decode rows split the selected
keys over CTAs until they fill the GPU; the task's last CTA merges the split partials in
split order (knob ``merge``: "last", or "kernel" for a separate ``is_combine`` launch).
Past one CTA per split item the warp-specialised build splits only where that shortens its
busiest CTA (``_ws_persistent_splits``: a split item's partials cost about 8 tiles; NOTES,
IndexShare round 21). A
warp-specialised plan with two splits and one item per CTA (decode: B 64 on 132 SMs) runs
the two splits of a task as a two-CTA cluster instead (``merge="cluster"``, the default
there): each CTA sends its partner half of its unnormalised output through distributed
shared memory and finishes the other half, with the last-arrival merge's arithmetic (the
same bits), and no split partials or counters in global memory. Decode rows of up to half
the SMs take eight splits of two tiles per task instead (or four, at up to twice the rows),
as eight- (four-) CTA clusters. Eight: after a cluster barrier each CTA stores its
partials straight into the shared memory of the CTAs that finish them, and after a second
one finishes its share of the task's channels; four: each CTA writes its partials to L2,
and after one cluster barrier finishes its share from there (``merge="cluster"``
with ``splits`` 4 or 8; the planner's rule for decode is ``_ws_decode_split``, measured in
NOTES, IndexShare rounds 20-22).
Every path is bitwise deterministic: fixed reduction orders, no floating-point atomics,
and the plan depends only on shapes and the device.
"""

from __future__ import annotations

import math
import os
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

from . import _common
from ._common import ScratchPool, Variant
from ._index_share_builds import (
    _ALIGN,
    MMA_LAYOUTS,
    MMA_PIPES,
    PLAN_KNOBS,
    WG_LAYOUTS,
    WG_MIN_GROUP,
    WG_MINB,
    WG_QREG_LAYOUT,
    WS_KTS,
    WS_MAX_SPLITS,
    WS_MIN_GROUP,
    WS_SLOTS,
    _aux_variant,
    _max_head_size,
    compile_variants,
)
from ._index_share_plan import _mma_ok, _Plan, _plan, _wg_ok
from ._ref_index_share import (
    FLOAT_TYPES,
    INDEX_TYPES,
    INPUT_NAMES,
    OP,
    Attributes,
    Geometry,
    IndexViolation,
    SelectedIndicesError,
    bias_strides,
    check_selected_indices,
    find_index_violation,
    parse_attributes,
    resolve_geometry,
)

__all__ = ["IndexShareFactory", "IndexShareKernel", "compile_variants", "find_index_violation",
           "check_selected_indices", "IndexViolation", "SelectedIndicesError", "MMA_LAYOUTS",
           "MMA_PIPES", "PLAN_KNOBS", "WG_LAYOUTS", "WG_MIN_GROUP", "WG_MINB", "WG_QREG_LAYOUT",
           "WS_KTS", "WS_MAX_SPLITS", "WS_MIN_GROUP", "WS_SLOTS"]


# ---------------------------------------------------------------------------------------
# factory and kernel
# ---------------------------------------------------------------------------------------

def _is_present(t: Any) -> bool:
    return t is not None and not getattr(t, "absent", False)


class IndexShareFactory:
    """Claims ``pkg.nxrt::IndexShare`` and creates :class:`IndexShareKernel` s.

    Parameters
    ----------
    rt
        The runtime kernels are bound to (``None`` is enough for ``unsupported_reason``).
    """

    def __init__(self, rt: Any = None) -> None:
        self.rt = rt

    def unsupported_reason(self, node: Node, shapes: Sequence[Sequence[int] | None],
                           dtypes: Sequence[DataType | None]) -> str | None:
        """Pure, no GPU: ``None`` when this kernel takes the node, else why not."""
        if (node.domain, node.op_type) != ("pkg.nxrt", "IndexShare"):
            return f"{OP}: not this op ({node.domain}::{node.op_type})"
        try:
            attrs = parse_attributes(node)
        except KernelError as exc:
            return str(exc)
        n_in = len(node.inputs) if node.inputs else len(dtypes)
        if not 6 <= n_in <= 7:
            return f"{OP}: expects 6 or 7 inputs, the node has {n_in}"
        if node.inputs:
            for i in (0, 1, 2, 5):
                if not node.input_present(i):
                    return (f"{OP}: required input {i} ({INPUT_NAMES[i]}) is absent in the "
                            "node")
        n_out = sum(node.output_present(i) for i in range(len(node.outputs)))
        if node.outputs and not node.output_present(0):
            return f"{OP}: output 0 (Y) is required"
        if n_out not in (0, 1, 3):
            return f"{OP}: expects 1 output or 3 (Y, present_key, present_value), got {n_out}"
        dt = [None if i >= len(dtypes) or dtypes[i] is None else DataType(dtypes[i])
              for i in range(7)]
        if dt[0] not in FLOAT_TYPES:
            return f"{OP}: query dtype {getattr(dt[0], 'name', dt[0])} unsupported (FLOAT, FLOAT16, BFLOAT16)"
        if dt[5] is not None and dt[5] not in INDEX_TYPES:
            return f"{OP}: selected_indices dtype {dt[5].name} unsupported (INT32, INT64)"
        if shapes and all(shapes[i] is not None for i in (0, 1, 2, 5) if i < len(shapes)):
            errors = []
            modes = ["none"] + (["capacity"] if len(shapes) > 3 and shapes[3] is not None else [])
            for mode in modes:
                try:
                    g = resolve_geometry(attrs, list(shapes)[:7], dt[:len(shapes)], mode)
                except KernelError as exc:
                    errors.append(str(exc))
                    continue
                if g.head_size > _max_head_size(g.dtype, g.head_size):
                    return (f"{OP}: head size {g.head_size} unsupported for {g.dtype.name} "
                            f"(at most {_max_head_size(g.dtype, g.head_size)})")
                return None
            return errors[0]
        return None

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
        return IndexShareKernel(self.rt, node, parse_attributes(node))


def _gcd_width(*values: int) -> int:
    for w in (16, 8, 4, 2):
        if all(v % w == 0 for v in values):
            return w
    return 1


class IndexShareKernel:
    """One IndexShare node bound to a runtime (see the module docstring).

    ``path_override`` (None, "simt", "mma" or "wg") pins the attention path, and
    ``plan_override`` (a dict of ``PLAN_KNOBS``: splits, wm, wn, stages, merge, pipe, wgs,
    mrows, overlap, qreg, minb, ws, ctas, q2, kt) pins parts of the plan; tests, benchmarks
    and sweeps use them, the defaults pick the plan the planner predicts fastest (pinning
    ``ws`` and ``splits`` also makes a row's bits independent of the batch size: README,
    Guarantees). ``last_plan`` is the plan of the latest ``execute``.
    """

    def __init__(self, rt: Any, node: Node, attrs: Attributes) -> None:
        self.rt = rt
        self.node = node
        self.attrs = attrs
        self.path_override: str | None = None
        self.plan_override: dict[str, Any] | None = None
        self._pool = ScratchPool(rt, OP)
        self._counters = ScratchPool(rt, OP, zeroed=True)
        self._fns: dict[tuple, Any] = {}
        self._warm = False
        self.last_plan: _Plan | None = None

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
        KernelError
            The inputs are refused.
        """
        shapes = [m.shape if _is_present(m) else None for m in inputs]
        dtypes = [m.dtype if _is_present(m) else None for m in inputs]
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
        need = 0
        for g in geoms:
            # The scratch layout does not depend on the chunk width, and aligned tensors
            # admit the widest heads (unaligned ones that cannot run are refused by execute).
            need = max(need, self._make_plan(g, True, "simt", cap).nbytes)
            if self.path_override != "simt" and _mma_ok(g):
                need = max(need, self._make_plan(g, True, "mma", cap).nbytes)
            if self.path_override in (None, "wg") and _wg_ok(g) and self._wg_arch():
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
    def _make_plan(self, g: Geometry, aligned16: bool, path: str | None, cap: bool) -> _Plan:
        caps = self.rt.capabilities
        smem_max = int(getattr(caps, "max_shared_per_block_optin", 227 * 1024))
        smem_sm = int(getattr(caps, "max_shared_per_sm", 0) or smem_max + 1024)
        # The CUDA-core path reads only the splits and merge knobs.
        return _plan(g, caps.sm_count, aligned16, path, cap, smem_max, smem_sm,
                     self.plan_override, wg_arch=self._wg_arch())

    def _wg_arch(self) -> bool:
        """The device runs sm_90a code (wgmma) and ATTNRT_INDEX_SHARE_WG is not 0."""
        if os.environ.get("ATTNRT_INDEX_SHARE_WG", "1") == "0":
            return False
        return str(getattr(self.rt.capabilities, "arch", "")) == "sm_90"

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

    def _mode(self, ins: list, outs: list) -> str:
        if len(outs) not in (1, 3) or not _is_present(outs[0]):
            raise KernelError(f"{OP}: expects outputs [Y] or [Y, present_key, present_value], "
                              f"got {len(outs)}")
        if len(outs) == 1 or (not _is_present(outs[1]) and not _is_present(outs[2])):
            return "none"
        if not (_is_present(outs[1]) and _is_present(outs[2])):
            raise KernelError(f"{OP}: present_key and present_value must be given together")
        if not _is_present(ins[1]) or len(ins[1].shape) != 4:
            return "none"  # resolve_geometry names the bad key
        k = ins[1].shape
        past = ins[3].shape[2] if _is_present(ins[3]) and len(ins[3].shape) == 4 else 0
        concat = (k[0], k[1], past + k[2], k[3])
        ps = tuple(outs[1].shape)
        if ps == concat and tuple(outs[2].shape) == concat:
            return "concat"
        if _is_present(ins[3]) and ps == tuple(ins[3].shape) and tuple(outs[2].shape) == ps:
            return "capacity"
        raise KernelError(f"{OP}: present_key {ps} / present_value {tuple(outs[2].shape)} must "
                          f"both be {list(concat)} (growing) or the past shape (fixed capacity)")

    # -- execute -----------------------------------------------------------------------
    def execute(self, inputs: Sequence[TensorView], outputs: Sequence[TensorMut],
                workspace: WorkspaceView | None = None) -> None:
        """Validate, then enqueue IndexShare on ``rt.stream``.

        Raises
        ------
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
        ins = list(inputs) + [None] * (7 - len(inputs))
        if len(inputs) > 7:
            raise KernelError(f"{OP}: expects at most 7 inputs, got {len(inputs)}")
        outs = list(outputs)
        mode = self._mode(ins, outs)
        present = [_is_present(t) for t in ins]
        g = resolve_geometry(self.attrs, [t.shape if p else None for t, p in zip(ins, present)],
                             [t.dtype if p else None for t, p in zip(ins, present)], mode)
        q, k, v, pk, pv, idx, bias = (t if p else None for t, p in zip(ins, present))
        y, prk, prv = (outs + [None, None])[:3] if mode != "none" else (outs[0], None, None)
        self._check_outputs(g, q, y, prk, prv)
        for i, t in enumerate((q, k, v, pk, pv, idx, bias)):
            if t is not None and not t.is_contiguous:
                raise KernelError(f"{OP}: input {i} must be contiguous (strides {t.strides} for "
                                  f"shape {t.shape}); supports_strided_input() is False")
        self._check_aliasing(g, [t for t in (q, k, v, pk, pv, idx, bias) if t is not None],
                             y, prk, prv, pk, pv)
        ptrs = [t.ptr for t in (q, k, v, pk, pv, y) if t is not None]
        aligned16 = all(p % 16 == 0 for p in ptrs)
        if self.path_override not in (None, "simt", "mma", "wg"):
            raise ValueError("path_override must be None, 'simt', 'mma' or 'wg', got "
                             f"{self.path_override!r}")
        plan = self._make_plan(g, aligned16, self.path_override, g.mode == "capacity")
        self.last_plan = plan
        capturing = rt.is_capturing()
        aux = _aux_variant(g.dtype)
        fn_attn = self._fn(plan.variant, plan.entry, capturing)
        fn_comb = self._fn(aux, "is_combine", capturing) if plan.merge == "kernel" else None
        if g.batch == 0:
            return
        # Scratch: the caller's workspace, else the pools (stable addresses, grown eagerly).
        # Split counters must be zero before the launch: the pool's are (zeroed when
        # allocated, left at zero by every launch); a workspace's are cleared each call.
        counters = 0
        if workspace is not None:
            _common.check_workspace(OP, WorkspaceRequirement(plan.nbytes, _ALIGN), workspace)
            base = workspace.ptr
            if plan.merge == "last" and g.q_len:
                counters = base + plan.cnt_off
                rt.memset(counters, 0, plan.tasks * 4)
        else:
            base = self._pool.ensure(plan.nbytes, capturing)
            if plan.merge == "last" and g.q_len:
                counters = self._counters.ensure(plan.tasks * 4, capturing)
        valid_ptr = base + plan.valid_off if g.mode == "capacity" else 0
        it = g.dtype.itemsize
        i32, i64 = np.int32, np.int64

        if g.mode == "capacity":
            self._frontier(g, bias, valid_ptr, capturing)
        rows = g.batch * g.index_heads * g.q_len
        if not capturing and rows:
            bounds: Any = g.cache_len
            if g.mode == "capacity":
                bounds = rt.dtoh(np.empty(g.batch, dtype=np.int32), valid_ptr)
            host = rt.dtoh(np.empty(idx.shape, dtype=g.index_dtype.numpy), idx.ptr)
            check_selected_indices(host, bounds)
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
            # After the warp-specialised kernel (which lets its dependents launch at once),
            # programmatically where it leaves three quarters of the SMs free: is_combine's
            # blocks are resident before the partials are done (and wait for them), which
            # saves its launch (H200: 0.2-0.9 us at 2-32 CTAs); with fewer SMs free they
            # crowd onto those and the combine runs slower (+0.5-1.3 us at 64 CTAs).
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

    def _check_outputs(self, g: Geometry, q: TensorView, y: Any, prk: Any, prv: Any) -> None:
        if tuple(y.shape) != tuple(q.shape) or y.dtype != g.dtype:
            raise KernelError(f"{OP}: output Y must be {g.dtype.name} {list(q.shape)}, got "
                              f"{y.dtype.name} {list(y.shape)}")
        for name, t in (("Y", y), ("present_key", prk), ("present_value", prv)):
            if t is None:
                continue
            if t.dtype != g.dtype:
                raise KernelError(f"{OP}: output {name} dtype {t.dtype.name} must be {g.dtype.name}")
            if not t.is_contiguous:
                raise KernelError(f"{OP}: output {name} must be contiguous, got strides {t.strides}")

    @staticmethod
    def _check_aliasing(g: Geometry, inputs: list, y: Any, prk: Any, prv: Any, pk: Any,
                        pv: Any) -> None:
        def span(t: Any) -> tuple[int, int]:
            return t.ptr, t.ptr + t.nbytes

        def overlap(a: Any, b: Any) -> bool:
            (a0, a1), (b0, b1) = span(a), span(b)
            return a0 < b1 and b0 < a1 and a.nbytes and b.nbytes

        outs = [("Y", y, None), ("present_key", prk, pk), ("present_value", prv, pv)]
        for name, o, may_alias in outs:
            if o is None:
                continue
            for t in inputs:
                if not overlap(o, t):
                    continue
                if g.mode == "capacity" and t is may_alias and o.ptr == t.ptr:
                    continue  # the in-place fixed-capacity cache
                raise KernelError(f"{OP}: output {name} overlaps an input; only a fixed-capacity "
                                  "present may alias its past tensor exactly")
        if prk is not None and overlap(prk, prv):
            raise KernelError(f"{OP}: present_key and present_value overlap")
        for o in (prk, prv):
            if o is not None and overlap(o, y):
                raise KernelError(f"{OP}: Y overlaps a present output")

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
        if g.batch > 65535:
            raise KernelError(f"{OP}: fixed-capacity mode supports batch <= 65535, got {g.batch}")
        fn = self._fn(_aux_variant(g.dtype), "is_frontier", capturing)
        b4 = (1,) * (4 - len(g.bias_shape)) + tuple(g.bias_shape)
        per_batch = b4[1] * b4[2] * b4[3]
        chunk = 4096
        self.rt.memset(valid_ptr, 0, g.batch * 4)
        self.rt.launch(fn, (max(1, -(-per_batch // chunk)), g.batch, 1), 256,
                       [bias.ptr, valid_ptr, np.int32(b4[0]), np.int64(per_batch),
                        np.int32(b4[3]), np.int32(g.cache_len), np.int64(chunk)])
