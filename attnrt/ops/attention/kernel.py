"""The Attention factory and kernel: validate on the host, plan, launch on ``rt.stream``.

Paths, the split-KV workspace and the decode split counters are described in
docs/notes/attention.md#paths.
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
from attnrt.runtime.errors import CaptureError

from .._common import ScratchPool, Variant, check_workspace, get_function
from .._validate import check_workspace_view
from .builds import (
    DEC_MAX_SPLITS,
    DEC_TILES,
    SIMT_ROWS,
    SIMT_THREADS,
    TC_TILES,
    WG_ROWS,
    WS_ALIGN,
    build_persistent,
    build_smem_bytes,
    build_threads,
    dec_smem_bytes,
    dec_variant,
    gemm_variant,
    rows_variant,
    simt_smem_bytes,
    simt_variant,
    tc_smem_bytes,
    tc_variant,
    unfused_layout,
    wg_build,
    wg_build_variant,
)
from .calls import call_metas, check_call, check_workspace_alias
from .plan import AttentionConfig, Plan, dec_warp_ring, plan, wg_grid
from .schema import OP, Dims, parse_attributes, tc_layout_ok, unsupported_reason

__all__ = ["AttentionFactory", "AttentionKernel"]


class AttentionFactory:
    """Claims ``pkg.nxrt::Attention`` nodes and creates :class:`AttentionKernel`.

    Parameters
    ----------
    rt
        The :class:`~attnrt.CudaRuntime` its kernels launch on.
    config
        Passed to every kernel it creates (None: the defaults, which choose by heuristic).
    """

    def __init__(self, rt: Any, config: AttentionConfig | None = None) -> None:
        self.rt = rt
        self.config = AttentionConfig() if config is None else config

    def unsupported_reason(self, node: Node, shapes: Sequence[Sequence[int] | None],
                           dtypes: Sequence[DataType | None]) -> str | None:
        """Pure, no GPU: None when this factory takes the node, else why not."""
        return unsupported_reason(node, shapes, dtypes)

    def create(self, node: Node, input_shapes: Sequence[Sequence[int] | None] = ()) -> AttentionKernel:
        """Create the kernel (the node and its attributes are validated here).

        Raises
        ------
        TypeError
            ``node`` is not a Node, or its attributes are not a dict.
        KernelError
            Another op, an unknown or invalid attribute, or extra inputs/outputs.
        """
        return AttentionKernel(self.rt, node, self.config)


class AttentionKernel:
    """One Attention node on one runtime.

    Parameters
    ----------
    rt
        The :class:`~attnrt.CudaRuntime`.
    node
        The ``pkg.nxrt::Attention`` node (attributes are validated here).
    config
        The knobs: path, split count, decode merge, build tables (None: the defaults).

    Raises
    ------
    KernelError
        An attribute is invalid.

    Notes
    -----
    The ``decode`` path's memory merge keeps its split counters in a small zeroed pool
    (docs/notes/attention.md#decode-counters); :meth:`close` frees it. ``last_plan`` is the
    plan of the latest :meth:`execute`.
    """

    def __init__(self, rt: Any, node: Node, config: AttentionConfig | None = None) -> None:
        self.rt = rt
        self.node = node
        self.config = AttentionConfig() if config is None else config
        self.attrs = parse_attributes(node)
        self.last_plan: Plan | None = None
        self._fns: dict[tuple, Any] = {}
        self._cnt_pool = ScratchPool(rt, OP, zeroed=True)

    def close(self) -> None:
        """Free the decode split-counter pool (the kernel stays usable; the next eager split
        decode call allocates it again)."""
        pool = getattr(self, "_cnt_pool", None)  # __init__ may have raised before setting it
        if pool is not None:
            pool.release()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception as exc:  # never raise from a finaliser
            warnings.warn(f"{OP}: decode counters not freed: {exc}", ResourceWarning, stacklevel=1)

    @classmethod
    def fused(cls, rt: Any, node: Node, config: AttentionConfig | None = None) -> AttentionKernel:
        """A kernel that always runs a fused path (tensor cores where possible); ``config``'s
        other knobs apply."""
        return cls(rt, node, dataclasses.replace(config or AttentionConfig(), path="fused"))

    @classmethod
    def unfused(cls, rt: Any, node: Node) -> AttentionKernel:
        """A kernel that always runs the three-kernel (scores in the workspace) path."""
        return cls(rt, node, AttentionConfig(path="unfused"))

    # -- protocol ------------------------------------------------------------------------
    def capture_support(self) -> CaptureSupport:
        """Every path only launches while capturing (the unfused path then needs the
        executor's workspace: :meth:`execute` refuses to allocate one)."""
        return CaptureSupport.yes()

    def supports_strided_input(self, index: int) -> bool:
        """Q, K, V: any B/H/S strides with a unit D stride. The mask must be contiguous."""
        return index in (0, 1, 2)

    def workspace_requirement(self, inputs: Sequence[TensorMetadata | None]) -> WorkspaceRequirement:
        """Exact bytes for these inputs (pure: no allocation, no state change; None: absent).

        Raises
        ------
        TypeError
            ``inputs`` is not a list, or a slot is not TensorMetadata, a view or None.
        KernelError
            The inputs do not fit the node.
        """
        dims, dtype, metas = call_metas(self.node, self.attrs, inputs)
        p = self._plan(dims, dtype, all(tc_layout_ok(m) for m in metas[:3]))
        return WorkspaceRequirement(p.workspace, WS_ALIGN) if p.workspace else WorkspaceRequirement.NONE

    def execute(self, inputs: Sequence[TensorView], outputs: Sequence[TensorMut],
                workspace: WorkspaceView | None = None) -> None:
        """Validate on the host, then launch on ``rt.stream``.

        Raises
        ------
        TypeError
            ``inputs``/``outputs`` are not lists of views (``None`` for an absent slot), or
            ``workspace`` is not a :class:`WorkspaceView` (or ``None``).
        KernelError
            A shape, dtype, stride, pointer range or overlap rule does not fit; nothing was
            launched and nothing written.
        WorkspaceError
            ``workspace`` is shorter than :meth:`workspace_requirement` (or misaligned).
        CaptureError
            The unfused path is called without a workspace while the stream is capturing.
        """
        check_workspace_view(workspace, OP)
        dims, dtype, (q, k, v), mask, out = check_call(self.node, self.attrs, inputs, outputs)
        # Plan from metadata exactly as workspace_requirement does (same splits and bytes);
        # pointers or an output layout the tensor-core kernel cannot take switch the kernel
        # to the SIMT one, which shares the split layout.
        p = self._plan(dims, dtype, all(tc_layout_ok(t) for t in (q, k, v)))
        if p.path in ("tc", "wg", "decode") and not all(tc_layout_ok(t) and t.ptr % 16 == 0
                                                        for t in (q, k, v, out)):
            # (A cluster-merge decode plan has no partials buffer: simt runs it unsplit.)
            p = Plan("simt", 0, p.splits if p.workspace else 1, p.workspace, p.ws_ml,
                     config=p.config)
        if dims.empty:
            self.last_plan = p
            return
        if p.workspace and workspace is None and p.path != "unfused":
            # Without the executor's partials buffer, run the fused path unsplit.
            p = Plan(p.path, p.dp, 1, 0, 0, warp_ring=p.path == "decode" and dec_warp_ring(
                dims, 1, int(self.rt.capabilities.sm_count)), config=p.config)
        if p.workspace:
            if workspace is None:
                if self.rt.is_capturing():
                    raise CaptureError(f"{OP}: the unfused path needs a workspace of {p.workspace} "
                                       "bytes while capturing; pass the executor's workspace "
                                       "(workspace_requirement) instead of None")
                self._run_owned(p, dims, dtype, q, k, v, mask, out)
                self.last_plan = p
                return
            check_workspace(OP, WorkspaceRequirement(p.workspace, WS_ALIGN), workspace)
            check_workspace_alias([q, k, v], mask, out, workspace.ptr, p.workspace)
        self.last_plan = p
        self._launch(p, dims, dtype, q, k, v, mask, out, workspace.ptr if workspace else 0)

    def _plan(self, dims: Dims, dtype: DataType, tc_ok: bool) -> Plan:
        sm = int(self.rt.capabilities.sm_count)
        # Every compute capability 9.0 part (H100/H200) has 227 KiB of opt-in shared memory,
        # far above what the wgmma build uses (wg_smem_bytes).
        cc = getattr(self.rt.capabilities, "compute_capability", None)
        cc = tuple(cc) if cc is not None else None
        return plan(self.attrs, dims, dtype, sm, self.config, tc_ok=tc_ok, cc=cc)

    # -- launching -----------------------------------------------------------------------
    def _fn(self, variant: Variant, entry: str) -> Any:
        key = (variant.file, tuple(sorted(variant.defines.items())), entry)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = get_function(self.rt, variant, entry)
        return fn

    def _scale(self, dims: Dims) -> float:
        return self.attrs.scale if self.attrs.scale is not None else 1.0 / math.sqrt(dims.D)

    def _window(self, dims: Dims) -> int:
        # w >= Sk - 1 lets every query see every earlier key: the same as no window, and it
        # keeps the int32 kernel arithmetic far from overflow.
        w = self.attrs.local_window_size
        return -1 if w < 0 or w >= dims.Sk else w

    def _run_owned(self, p: Plan, dims: Dims, dtype: DataType, q: TensorView, k: TensorView,
                   v: TensorView, mask: TensorView | None, out: TensorView) -> None:
        ptr = self.rt.alloc_raw(p.workspace)
        try:
            self._launch(p, dims, dtype, q, k, v, mask, out, ptr)
            self.rt.synchronize()
        finally:
            self.rt.free_raw(ptr)

    def _launch(self, p: Plan, dims: Dims, dtype: DataType, q: TensorView, k: TensorView,
                v: TensorView, mask: TensorView | None, out: TensorView, ws: int) -> None:
        if p.path == "unfused":
            self._launch_unfused(dims, dtype, q, k, v, mask, out, ws)
        elif p.path == "decode":
            self._launch_decode(p, dims, dtype, q, k, v, mask, out, ws)
        else:
            self._launch_fused(p, dims, dtype, q, k, v, mask, out, ws)

    def _common_args(self, dims: Dims, q: TensorView, k: TensorView, v: TensorView,
                     mask: TensorView | None, out: TensorView, split_o: int,
                     split_ml: int) -> list:
        i32, i64, f32 = np.int32, np.int64, np.float32
        strides = [i64(s) for t in (q, k, v, out) for s in t.element_strides[:3]]
        return [q.ptr, k.ptr, v.ptr, mask.ptr if mask is not None else 0, out.ptr, split_o,
                split_ml, i32(dims.B), i32(dims.H), i32(dims.Hkv), i32(dims.Sq), i32(dims.Sk),
                i32(dims.D), *strides, i32(dims.mask_planes), i32(int(self.attrs.causal)),
                i32(self._window(dims)), f32(self._scale(dims)), f32(self.attrs.softcap)]

    def _launch_fused(self, p: Plan, dims: Dims, dtype: DataType, q: TensorView, k: TensorView,
                      v: TensorView, mask: TensorView | None, out: TensorView, ws: int) -> None:
        i32, i64 = np.int32, np.int64
        cfg = p.config
        if p.path == "wg":
            build = wg_build(p.dp, bool(self.attrs.causal), dims.Sk, cfg)  # (schedule, keys, _)
            variant, entry = wg_build_variant(dtype, p.dp, build), "attn_fused_wg"
            bm, threads, smem = WG_ROWS, build_threads(build[0]), build_smem_bytes(p.dp, build)
        elif p.path == "tc":
            nwarps, _ = TC_TILES[p.dp]
            variant, entry = tc_variant(dtype, p.dp), "attn_fused_tc"
            bm, threads, smem = 16 * nwarps, 32 * nwarps, tc_smem_bytes(p.dp)
        else:
            variant, entry = simt_variant(dtype), "attn_fused_simt"
            bm, threads, smem = SIMT_ROWS, SIMT_THREADS, simt_smem_bytes(dims.D)
        row_tiles = -(-dims.group * dims.Sq // bm)
        n_ctas = row_tiles * dims.B * dims.Hkv  # within limits: plan() checked
        grid = (n_ctas, p.splits, 1)
        if p.path == "wg" and build_persistent(build[0]):
            grid = (wg_grid(n_ctas * p.splits, int(self.rt.capabilities.sm_count),
                            cfg.wg_max_ctas), 1, 1)
        split_o, split_ml = (ws, ws + p.ws_ml) if p.splits > 1 else (0, 0)
        args = self._common_args(dims, q, k, v, mask, out, split_o, split_ml)
        args += [i32(row_tiles), i32(p.splits)]
        self.rt.launch(self._fn(variant, entry), grid, (threads, 1, 1), args, shared_mem=smem)
        if p.splits > 1:
            rows = dims.B * dims.H * dims.Sq
            ost = [i64(s) for s in out.element_strides[:3]]
            self.rt.launch(self._fn(rows_variant(dtype), "attn_combine"), (-(-rows // 4), 1, 1),
                           (128, 1, 1), [split_o, split_ml, out.ptr, i32(dims.B), i32(dims.H),
                                         i32(dims.Sq), i32(dims.D), i32(p.splits), *ost])

    def _counters(self, p: Plan, tasks: int, ws: int) -> int:
        """Zeroed split counters for one decode launch: the pool (allocated and zeroed by the
        first eager call), else the workspace's tail, cleared on the stream."""
        need = 4 * tasks
        pool = self._cnt_pool
        if p.config.counter_pool and (pool.nbytes >= need or not self.rt.is_capturing()):
            return pool.ensure(max(need, 4096), capturing=False)
        cnt = ws + p.ws_cnt
        self.rt.memset(cnt, 0, need)
        return cnt

    def _launch_decode(self, p: Plan, dims: Dims, dtype: DataType, q: TensorView, k: TensorView,
                       v: TensorView, mask: TensorView | None, out: TensorView, ws: int) -> None:
        i32 = np.int32
        nwarps, _ = DEC_TILES[p.dp]
        tasks = dims.B * dims.Hkv  # one row tile each (G·Sq <= DEC_MAX_ROWS)
        splits = min(p.splits, DEC_MAX_SPLITS)
        split_o, split_ml, cnt = 0, 0, 0
        if splits > 1 and not p.cluster:
            split_o, split_ml = ws, ws + p.ws_ml
            cnt = self._counters(p, tasks, ws)
        args = self._common_args(dims, q, k, v, mask, out, split_o, split_ml)
        args += [i32(1), i32(splits), cnt, i32(int(p.warp_ring))]
        self.rt.launch(self._fn(dec_variant(dtype, p.dp, p.cluster), "attn_decode"),
                       (tasks, splits, 1),
                       (32 * nwarps, 1, 1), args, shared_mem=dec_smem_bytes(p.dp))

    def _launch_unfused(self, dims: Dims, dtype: DataType, q: TensorView, k: TensorView,
                        v: TensorView, mask: TensorView | None, out: TensorView, ws: int) -> None:
        i32, i64, f32 = np.int32, np.int64, np.float32
        bh = dims.B * dims.H
        m_tiles = -(-dims.Sq // 64)  # grid limits: plan() checked
        gemm = gemm_variant(dtype)
        threads = 256 if dtype == DataType.FLOAT else 128
        s_ptr = ws + unfused_layout(dims.B, dims.H, dims.Sq, dims.Sk)[0]
        qs, ks, vs, os_ = ([i64(s) for s in t.element_strides[:3]] for t in (q, k, v, out))
        if dims.Sk > 0:
            self.rt.launch(self._fn(gemm, "attn_qk"), (-(-dims.Sk // 64), m_tiles, bh),
                           (threads, 1, 1),
                           [q.ptr, k.ptr, s_ptr, i32(dims.H), i32(dims.Hkv), i32(dims.Sq),
                            i32(dims.Sk), i32(dims.D), *qs, *ks, f32(self._scale(dims))])
            self.rt.launch(self._fn(rows_variant(dtype), "attn_softmax"), (bh * dims.Sq, 1, 1),
                           (256, 1, 1),
                           [s_ptr, mask.ptr if mask is not None else 0, i32(dims.B), i32(dims.H),
                            i32(dims.Sq), i32(dims.Sk), i32(dims.mask_planes),
                            i32(int(self.attrs.causal)), i32(self._window(dims)),
                            f32(self.attrs.softcap)])
        self.rt.launch(self._fn(gemm, "attn_pv"), (-(-dims.D // 64), m_tiles, bh), (threads, 1, 1),
                       [s_ptr, v.ptr, out.ptr, i32(dims.H), i32(dims.Hkv), i32(dims.Sq),
                        i32(dims.Sk), i32(dims.D), *vs, *os_])
