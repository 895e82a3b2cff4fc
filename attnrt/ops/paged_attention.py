"""``com.microsoft::PagedAttention`` with ``kv_cache_layout="LATENT"`` (multi-head latent attention).

One latent cache ``key_cache`` [num_blocks, block_size, 1, head_size] (``kv_num_heads == 1``);
the value of a key is its leading ``v_head_size`` channels. Two phases, both on ``rt.stream``:

* **write** (``cuda/paged_small.cu:paged_write_*``): each new token's ``key`` row gets partial
  RoPE on channels ``[rotary_offset, rotary_offset + rotary_dim)`` (``rotary_dim =
  2 * cos_cache.shape[1]``; half-split or interleaved pairs) at its absolute position, then is
  stored at ``key_cache[slot_mapping[t]]`` in place. Slot ``-1`` skips the write.
* **read**: the query row gets the same RoPE; token ``t`` of sequence ``b`` sits at position
  ``p = past_seqlens[b] + t - cumulative_sequence_length[b]`` and attends causally to cached keys
  ``j <= p`` (with ``local_window_size = w >= 0`` only ``p - j <= w``) addressed through
  ``block_table``; ``softmax(softcap(scale * q.k))`` weights the leading ``v_head_size`` channels.
  ``scale`` defaults to ``1/sqrt(head_size)`` and is required when ``v_head_size != head_size``.

Read paths (the rule, in order)
-------------------------------
1. ``(head_size, v_head_size) == (576, 512)`` (the MLA latent), the query, cache and output
   pointers 16-byte aligned, and the tile fits the device's opt-in shared memory → ``mla``
   (``cuda/paged_mla.cu``): 64 (token, head) rows of one sequence per CTA against 64-key
   latent tiles loaded once into shared memory, mma.sync tensor cores, split-KV with a
   log-sum-exp combine. Tiles of 64 keys need 226 KiB (sm_90); where that does not fit, 32.
2. otherwise → ``simple`` (``cuda/paged_small.cu:paged_simple_*``): one CTA per (token, head),
   CUDA cores, any head size; also the fallback. ``path=`` on the factory forces either.

On compute capability 9.0 rule 1 takes the Hopper variant ``wg`` (``cuda/paged_mla_wg.cu``,
sm_90a): the same grid, rows, tiles and workspace, with warpgroup MMA (wgmma) reading Q and
the latent tile straight from swizzled shared memory. Measured on the H200 (``tools/sweep_paged.py``,
bf16, 128 heads, L 8k): 1325 vs 926 GB/s at B=32 and 1461 vs 979 GB/s at B=128 against
the mma.sync kernel, so it is the default there; ``path="mla"`` forces the mma.sync kernel.

Split-KV: the number of splits is fixed on the host from shapes (tokens x heads, the block
table's width, or ``attention_metadata``) and the SM count; each CTA splits its own key
range on the device, so the op never reads device data back and is capturable. Splits > 1
need the workspace (``workspace_requirement``; one layout helper, :func:`workspace_layout`,
serves planning and execution); called without one the op runs unsplit.

Device-side checks: a slot past the cache latches ``PAGED_SLOT_OUT_OF_RANGE`` (1024), a block
id outside the table or the cache ``PAGED_BLOCK_OUT_OF_RANGE`` (2048) — the key is skipped —
and with RoPE a position outside ``cos_cache`` latches :data:`PAGED_POSITION_OUT_OF_RANGE`
(4096; the token is neither written nor attended, its output row is zero). Nothing is read
or written out of bounds, whatever the index inputs hold.

Capture gating (as in the reference design): ``execute`` while the stream is capturing is
allowed only for a signature (dtype, shapes, plan) that already ran eagerly on this kernel,
because the first run compiles and loads the modules and raises the shared-memory limit,
which must not happen inside a capture.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
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
from attnrt.runtime.errors import KernelError, Unsupported

from ._common import Variant, check_workspace, expect, get_function

__all__ = ["PagedAttentionFactory", "PagedAttentionKernel", "PagedPlan", "PagedGeometry",
           "unsupported_reason", "compile_variants", "workspace_layout", "choose_splits",
           "mla_smem_bytes", "mla_wg_smem_bytes", "PAGED_POSITION_OUT_OF_RANGE"]

OP = "com.microsoft::PagedAttention"
DOMAIN, OP_TYPE = "com.microsoft", "PagedAttention"
(IN_QUERY, IN_KEY, IN_VALUE, IN_KEY_CACHE, IN_VALUE_CACHE, IN_CU_SEQLENS, IN_PAST_SEQLENS,
 IN_BLOCK_TABLE, IN_COS, IN_SIN, IN_SLOT_MAPPING, IN_HEAD_SINK, IN_Q_NORM, IN_K_NORM,
 IN_K_SCALE, IN_V_SCALE, IN_ATTENTION_METADATA) = range(17)
INPUT_NAMES = ("query", "key", "value", "key_cache", "value_cache", "cumulative_sequence_length",
               "past_seqlens", "block_table", "cos_cache", "sin_cache", "slot_mapping",
               "head_sink", "q_norm_weight", "k_norm_weight", "k_scale", "v_scale",
               "attention_metadata")
REQUIRED = (IN_QUERY, IN_KEY, IN_KEY_CACHE, IN_CU_SEQLENS, IN_PAST_SEQLENS, IN_BLOCK_TABLE,
            IN_SLOT_MAPPING)
#: Optional inputs of the schema this slice declines, and the mode each one means.
DECLINED_INPUTS = {
    IN_VALUE: "input 'value' (SEPARATE K/V; LATENT has a single cache)",
    IN_VALUE_CACHE: "input 'value_cache' (SEPARATE K/V; LATENT has a single cache)",
    IN_HEAD_SINK: "head_sink",
    IN_Q_NORM: "q_norm_weight (q/k norm)",
    IN_K_NORM: "k_norm_weight (q/k norm)",
    IN_K_SCALE: "k_scale (quantized cache)",
    IN_V_SCALE: "v_scale (quantized cache)",
}
QUANT_ATTRS = ("k_quant_type", "v_quant_type", "k_cache_dtype", "v_cache_dtype")
SUPPORTED = (DataType.FLOAT16, DataType.BFLOAT16)

#: Latch bit for a RoPE position outside cos_cache (registered by name on the runtime).
PAGED_POSITION_OUT_OF_RANGE = 4096
_POSITION_BIT_NAME = "PagedAttention position outside cos/sin cache"

MLA_SHAPES = ((576, 512),)  # (head_size, v_head_size) built for the tensor-core path
MLA_ROWS, MLA_THREADS = 64, 256
MLA_TILES = (64, 32)  # keys per tile, largest first
MAX_SPLITS = 64
SIMPLE_THREADS = WRITE_THREADS = COMBINE_THREADS = 128
WS_ALIGN = 256
PATHS = ("auto", "mla", "mla64", "mla32", "wg", "simple")
_I32 = 2**31 - 1
#: Planning defaults when a kernel has no runtime (CPU planning, tests): an H200.
_DEFAULT_CAPS = SimpleNamespace(sm_count=132, max_shared_per_block_optin=232448,
                                compute_capability=(9, 0))
#: Cost model of choose_splits, per path, in microseconds (H200): one 64-key tile of one CTA
#: (mma: measured 5.3 us at B=32; wg: predicted), the CTA prologue (setup, Q and first tile
#: in flight), writing one CTA's f32 partials; the combine launch and its partial-read rate
#: (bytes per microsecond, the partials mostly sit in L2).
SPLIT_COST = {"mla": dict(tile=5.3, prologue=3.0, partial=1.0),
              "wg": dict(tile=2.0, prologue=3.0, partial=1.0)}
COMBINE_LAUNCH_US, COMBINE_BYTES_PER_US = 2.0, 3.0e6


# --------------------------------------------------------------------------- claim time
@dataclass(frozen=True)
class _Attrs:
    num_heads: int
    v_head_size: int  # 0: head_size
    scale: float | None
    softcap: float
    window: int
    do_rotary: bool
    interleaved: bool
    rotary_offset: int


def _attrs(node: Node) -> _Attrs:
    try:
        a = _Attrs(node.attr_int("num_heads", 0), node.attr_int("v_head_size", 0),
                   # scale = 0 (the ONNX default) means "not given", as in onnxruntime.
                   (node.attr_float("scale") or None) if node.has("scale") else None,
                   node.attr_float("softcap", 0.0), node.attr_int("local_window_size", -1),
                   node.attr_int("do_rotary", 0) != 0, node.attr_int("rotary_interleaved", 0) != 0,
                   node.attr_int("rotary_offset", 0))
    except (TypeError, ValueError) as exc:
        raise KernelError(f"{OP}: {exc}") from None
    expect(a.num_heads >= 1, f"{OP}: attribute num_heads must be >= 1, got {a.num_heads}")
    expect(a.v_head_size >= 0, f"{OP}: attribute v_head_size must be >= 0, got {a.v_head_size}")
    expect(a.softcap >= 0.0, f"{OP}: attribute softcap must be >= 0 (0 disables), got {a.softcap}")
    expect(a.window >= -1, f"{OP}: attribute local_window_size must be >= -1, got {a.window}")
    expect(a.rotary_offset >= 0, f"{OP}: attribute rotary_offset must be >= 0, got {a.rotary_offset}")
    expect(a.scale is None or (_f32_finite(a.scale) and a.scale > 0),
           f"{OP}: attribute scale must be a positive float32-finite float, got {a.scale}")
    expect(_f32_finite(a.softcap), f"{OP}: attribute softcap must be float32-finite, got {a.softcap}")
    # Kernels take these as int32 arguments.
    for name, v in (("num_heads", a.num_heads), ("v_head_size", a.v_head_size),
                    ("local_window_size", a.window), ("rotary_offset", a.rotary_offset)):
        expect(v <= _I32, f"{OP}: attribute {name} {v} must fit in int32")
    return a


def _f32_finite(x: float) -> bool:
    with np.errstate(over="ignore"):
        return bool(math.isfinite(x) and np.isfinite(np.float32(x)))


def _quantized(node: Node, name: str) -> bool:
    if not node.has(name):
        return False
    v = node.attributes[name]
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    return str(v).strip().lower() not in ("", "0", "none")


def unsupported_reason(node: Node, shapes: Sequence[Sequence[int] | None] = (),
                       dtypes: Sequence[DataType | None] = (), *, attributes: bool = True) -> str | None:
    """Why the LATENT kernel declines ``node`` (``None``: it takes it). Pure, no GPU.

    Every declined mode is named in the reason: ``kv_cache_layout="SEPARATE"``,
    ``kv_num_heads != 1``, a quantized cache (``k_quant_type`` ...), ``head_sink``, q/k norm,
    ``k_scale``/``v_scale``, ``value``/``value_cache`` inputs, packed QKV, and dtypes other
    than float16/bfloat16 (or non-int32 index inputs). With ``attributes`` an invalid
    attribute value is a reason too.
    """
    if (node.domain, node.op_type) != (DOMAIN, OP_TYPE):
        return f"not {OP} (got {node.domain}::{node.op_type})"
    layout = node.attributes.get("kv_cache_layout", "SEPARATE")
    layout = layout.decode(errors="replace") if isinstance(layout, bytes) else str(layout)
    if layout != "LATENT":
        return (f'{OP}: kv_cache_layout="{layout}" is not implemented; only "LATENT" (MLA) is '
                "(SEPARATE K/V caches are routed elsewhere)")
    kvh = node.attributes.get("kv_num_heads", 0)
    if kvh != 1:
        return f"{OP} (LATENT): kv_num_heads must be 1 (one latent cache head), got {kvh!r}"
    for name in QUANT_ATTRS:
        if _quantized(node, name):
            return (f"{OP} (LATENT): quantized KV cache ({name}={node.attributes[name]!r}) is "
                    "not implemented")

    def present(i: int) -> bool:
        if node.inputs:
            return node.input_present(i)
        return i < len(shapes) and shapes[i] is not None

    for i, what in DECLINED_INPUTS.items():
        if present(i):
            return f"{OP} (LATENT): {what} is not implemented (input {i} must be absent)"
    if not present(IN_KEY):
        return f"{OP} (LATENT): packed QKV (input 'key' absent) is not implemented"
    if node.inputs:
        for i in REQUIRED:
            if not node.input_present(i):
                return f"{OP}: required input '{INPUT_NAMES[i]}' ({i}) is absent"
    if attributes:
        try:
            _attrs(node)
        except KernelError as exc:
            return str(exc)
    dts = list(dtypes) + [None] * (17 - len(dtypes))
    q = dts[IN_QUERY]
    if q is not None and DataType(q) not in SUPPORTED:
        return (f"{OP} (LATENT): query dtype {DataType(q).name} is not implemented "
                "(float16/bfloat16 only)")
    for i in (IN_KEY, IN_KEY_CACHE):
        d = dts[i]
        if d is not None and q is not None and DataType(d) != DataType(q):
            kind = " (quantized cache)" if i == IN_KEY_CACHE else ""
            return (f"{OP} (LATENT): input '{INPUT_NAMES[i]}' dtype {DataType(d).name} differs from "
                    f"the query's {DataType(q).name}{kind}; not implemented")
    for i in (IN_CU_SEQLENS, IN_PAST_SEQLENS, IN_BLOCK_TABLE, IN_SLOT_MAPPING):
        d = dts[i]
        if d is not None and DataType(d) != DataType.INT32:
            return (f"{OP} (LATENT): index input '{INPUT_NAMES[i]}' dtype {DataType(d).name} is "
                    "not implemented (int32 only)")
    return None


class PagedAttentionFactory:
    """Claims LATENT ``com.microsoft::PagedAttention`` nodes and creates their kernels.

    Parameters
    ----------
    rt
        The :class:`~attnrt.CudaRuntime` the kernels launch on (``None``: plan-only kernels).
    path
        ``"auto"`` (the rule in the module docstring), ``"mla"``, ``"mla64"``/``"mla32"``
        (force the tile), or ``"simple"``.
    num_splits
        Force the split-KV count of the ``mla`` path (tests of the combine step).
    """

    def __init__(self, rt: Any = None, *, path: str = "auto", num_splits: int | None = None) -> None:
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        if num_splits is not None and not 1 <= int(num_splits) <= 65535:
            raise ValueError(f"num_splits must be in [1, 65535], got {num_splits!r}")
        self.rt = rt
        self.path = path
        self.num_splits = num_splits

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
        return PagedAttentionKernel(self.rt, node, path=self.path, num_splits=self.num_splits)


# --------------------------------------------------------------------------- planning
@dataclass(frozen=True)
class PagedGeometry:
    """Everything launch planning needs, validated from metadata."""

    dtype: DataType
    tokens: int
    heads: int
    head_size: int
    v_head_size: int
    batch: int
    num_blocks: int
    block_size: int
    max_blocks: int
    rotary_dim: int  # 0: no RoPE
    max_pos: int
    scale: float


@dataclass(frozen=True)
class PagedPlan:
    """The launch plan: path, tile, grid and splits, and the workspace layout."""

    path: str  # "mla", "wg", "simple" or "none" (no tokens)
    block_n: int
    grid_x: int
    splits: int
    ws_lse_offset: int
    ws_bytes: int


def mla_smem_bytes(block_n: int, head_size: int = 576) -> int:
    """Dynamic shared memory of ``paged_mla_fwd`` (mirrors the layout in paged_mla.cu)."""
    q = MLA_ROWS * head_size * 2
    kv = 2 * block_n * head_size * 2
    p = MLA_ROWS * block_n * 2
    red, rows = 4 * MLA_ROWS * 4, 3 * MLA_ROWS * 4
    valid = -(-2 * block_n // 16) * 16
    return q + kv + p + red + rows + valid + 32


def simple_smem_bytes(head_size: int, v_head_size: int) -> int:
    """Dynamic shared memory of ``paged_simple_*``: the f32 query row, 4 warps' f32 outputs."""
    return (head_size + 4 * v_head_size + 8) * 4


def mla_wg_smem_bytes(head_size: int = 576) -> int:
    """Dynamic shared memory of ``paged_mla_wg_fwd`` (mirrors SMEM_BYTES in paged_mla_wg.cu).

    Q and two stages of 64 keys in 1024-byte-aligned swizzle atoms, P, row data, plus 1 KiB
    of slack to align the base.
    """
    q = MLA_ROWS * head_size * 2
    kv = 2 * 64 * head_size * 2
    p = MLA_ROWS * 64 * 2
    rows = 2 * MLA_ROWS * 4 + 3 * MLA_ROWS * 4 + 2 * 64 + 32
    return q + kv + p + rows + 1024


def workspace_layout(rows: int, v_head_size: int, splits: int) -> tuple[int, int]:
    """(offset of the log-sum-exp array, total bytes) of the split-KV partials.

    Partial O is f32 [rows, splits, v_head_size] at offset 0, then f32 [rows, splits]; no
    workspace when ``splits == 1``.
    """
    if splits <= 1:
        return 0, 0
    o_bytes = rows * splits * v_head_size * 4
    lse_off = -(-o_bytes // WS_ALIGN) * WS_ALIGN
    return lse_off, lse_off + rows * splits * 4


def choose_splits(row_blocks: int, tiles: int, sm_count: int, rows: int = 0,
                  v_head_size: int = 512, cap: int = MAX_SPLITS, path: str = "mla") -> int:
    """Splits per row block minimising a modelled time (microseconds, ``SPLIT_COST[path]``).

    One CTA per SM (the tile takes most of shared memory): time = waves x (tiles per split x
    tile + prologue + partial write when split), plus, when split, the combine launch and its
    read of ``rows x splits`` f32 partial rows.
    """
    c = SPLIT_COST[path]
    best, best_cost = 1, math.inf
    for s in range(1, max(1, min(cap, tiles)) + 1):
        waves = -(-row_blocks * s // max(1, sm_count))
        per_cta = -(-tiles // s) * c["tile"] + c["prologue"] + (c["partial"] if s > 1 else 0.0)
        combine = (COMBINE_LAUNCH_US + rows * s * v_head_size * 4 / COMBINE_BYTES_PER_US) \
            if s > 1 else 0.0
        cost = waves * per_cta + combine
        if cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best


def _absent(x: Any) -> bool:
    # The executor hands absent slots to workspace_requirement as rank-0 FLOAT metadata.
    if x is None:
        return True
    if isinstance(x, TensorView):
        return x.absent
    if isinstance(x, TensorMetadata):
        return x.shape == ()
    return False


def _host_metadata(x: Any) -> np.ndarray | None:
    """Values of a host ``attention_metadata`` (numpy array or sequence); None otherwise."""
    if x is None or isinstance(x, (TensorView, TensorMetadata)):
        return None  # a device tensor is accepted but never read (that would be a readback)
    arr = np.asarray(x)
    expect(arr.dtype == np.int32 and arr.ndim == 1 and arr.shape[0] in (2, 3),
           f"{OP}: input 'attention_metadata' (16) must be host int32 [max_query_len, "
           f"max_kv_len(, min)], got {arr.dtype} {arr.shape}")
    expect(bool(np.all(arr[:2] >= 0)), f"{OP}: attention_metadata {arr.tolist()} has a negative "
           "length")
    return arr


def _meta(x: Any) -> TensorMetadata:
    if isinstance(x, TensorView):
        return x.meta
    if isinstance(x, TensorMetadata):
        return x
    arr = np.asarray(x)
    return TensorMetadata(DataType.from_numpy(arr.dtype), arr.shape)


# --------------------------------------------------------------------------- the kernel
class PagedAttentionKernel:
    """One LATENT PagedAttention node on one runtime.

    Parameters
    ----------
    rt
        The :class:`~attnrt.CudaRuntime` (``None``: plan and validate only).
    node
        The node; its attributes are validated here.
    path, num_splits
        As for :class:`PagedAttentionFactory`.

    Raises
    ------
    KernelError
        An attribute is invalid.
    """

    def __init__(self, rt: Any, node: Node, *, path: str = "auto",
                 num_splits: int | None = None) -> None:
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        self.rt = rt
        self.node = node
        self.attrs = _attrs(node)
        self.path = path
        self.num_splits = num_splits
        self.last_plan: PagedPlan | None = None
        self._warmed: set[tuple] = set()
        self._last_ok = False
        self._fns: dict[tuple, Any] = {}
        # Phases _launch runs; tools/sweep_paged.py times them one at a time (never in the op).
        self._phases: frozenset[str] = frozenset(("write", "read", "combine"))
        if rt is not None:
            try:
                rt.latch.register(PAGED_POSITION_OUT_OF_RANGE, _POSITION_BIT_NAME)
            except ValueError:  # another op took the bit; it still latches, under that name
                pass

    # -- protocol ------------------------------------------------------------------------
    def capture_support(self) -> CaptureSupport:
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
        meta = _host_metadata(inputs[IN_ATTENTION_METADATA]) if len(inputs) > IN_ATTENTION_METADATA \
            else None
        return self._plan(geo, meta, aligned)

    def validate(self, inputs: Sequence[Any], outputs: Sequence[Any] | None = None) -> PagedGeometry:
        """Check every shape, dtype and attribute from metadata alone.

        Raises
        ------
        KernelError
            The first problem found, naming the input, the value and what was expected.
        """
        a = self.attrs
        ins = list(inputs) + [None] * (17 - len(inputs))
        m: list[TensorMetadata | None] = [None if _absent(x) else _meta(x) for x in ins[:16]]
        for i in REQUIRED:
            expect(m[i] is not None, f"{OP}: required input '{INPUT_NAMES[i]}' ({i}) is absent")
        for i, what in DECLINED_INPUTS.items():
            expect(m[i] is None, f"{OP} (LATENT): {what} is not implemented; input {i} must be absent")

        def need(i: int, ok: bool, got: str, want: str) -> None:
            expect(ok, f"{OP}: input '{INPUT_NAMES[i]}' ({i}) {got}; expected {want}")

        q, key, kc, cu, past, bt, slot = (typing.cast(TensorMetadata, m[i]) for i in (
            IN_QUERY, IN_KEY, IN_KEY_CACHE, IN_CU_SEQLENS, IN_PAST_SEQLENS, IN_BLOCK_TABLE,
            IN_SLOT_MAPPING))
        dtype = q.dtype
        need(IN_QUERY, dtype in SUPPORTED, f"has dtype {dtype.name}", "FLOAT16 or BFLOAT16")
        for i, t in ((IN_KEY, key), (IN_KEY_CACHE, kc)):
            need(i, t.dtype == dtype, f"has dtype {t.dtype.name}", f"the query's {dtype.name}")
        need(IN_KEY_CACHE, kc.rank == 4 and kc.shape[2] == 1, f"has shape {list(kc.shape)}",
             "[num_blocks, block_size, 1, head_size] (one latent head)")
        nb, bs, _, hs = kc.shape
        need(IN_KEY_CACHE, bs >= 16 and bs & (bs - 1) == 0, f"has block_size {bs}",
             "a power of two >= 16")
        need(IN_KEY_CACHE, nb >= 1 and hs >= 1, f"has shape {list(kc.shape)}", "a non-empty cache")
        H = a.num_heads
        need(IN_QUERY, q.rank == 2 and q.shape[1] == H * hs, f"has shape {list(q.shape)}",
             f"[tokens, num_heads * head_size] = [tokens, {H} * {hs}]")
        T = q.shape[0]
        need(IN_KEY, key.shape == (T, hs), f"has shape {list(key.shape)}",
             f"[tokens, head_size] = [{T}, {hs}]")
        for i, t in ((IN_CU_SEQLENS, cu), (IN_PAST_SEQLENS, past), (IN_BLOCK_TABLE, bt),
                     (IN_SLOT_MAPPING, slot)):
            need(i, t.dtype == DataType.INT32, f"has dtype {t.dtype.name}", "INT32")
        need(IN_PAST_SEQLENS, past.rank == 1 and past.shape[0] >= 1, f"has shape {list(past.shape)}",
             "[batch] with batch >= 1")
        B = past.shape[0]
        need(IN_CU_SEQLENS, cu.shape == (B + 1,), f"has shape {list(cu.shape)}",
             f"[batch + 1] = [{B + 1}]")
        need(IN_BLOCK_TABLE, bt.rank == 2 and bt.shape[0] == B and bt.shape[1] >= 1,
             f"has shape {list(bt.shape)}", f"[batch, max_blocks] = [{B}, >= 1]")
        need(IN_SLOT_MAPPING, slot.shape == (T,), f"has shape {list(slot.shape)}", f"[tokens] = [{T}]")
        vhs = a.v_head_size or hs
        expect(vhs <= hs, f"{OP}: attribute v_head_size {vhs} must be <= head_size {hs}")
        scale = a.scale
        if scale is None:
            expect(vhs == hs, f"{OP}: attribute 'scale' is required when v_head_size ({vhs}) != "
                   f"head_size ({hs}); pass the model's softmax scale")
            scale = 1.0 / math.sqrt(hs)
        rd, max_pos = 0, 0
        if a.do_rotary:
            for i in (IN_COS, IN_SIN):
                need(i, m[i] is not None, "is absent", "a [max_position, rotary_dim / 2] table "
                     "when do_rotary=1")
            cos, sin = typing.cast(TensorMetadata, m[IN_COS]), typing.cast(TensorMetadata, m[IN_SIN])
            for i, t in ((IN_COS, cos), (IN_SIN, sin)):
                need(i, t.dtype == dtype, f"has dtype {t.dtype.name}", f"the query's {dtype.name}")
                need(i, t.rank == 2 and min(t.shape) >= 1, f"has shape {list(t.shape)}",
                     "[max_position, rotary_dim / 2], non-empty")
            need(IN_SIN, sin.shape == cos.shape, f"has shape {list(sin.shape)}",
                 f"cos_cache's {list(cos.shape)}")
            max_pos, rd = cos.shape[0], 2 * cos.shape[1]
            expect(a.rotary_offset + rd <= hs, f"{OP}: rotary_offset {a.rotary_offset} + rotary_dim "
                   f"{rd} (2 * cos_cache.shape[1]) exceeds head_size {hs}")
        for i, t in enumerate(m):
            need(i, t is None or t.is_contiguous, f"has strides "
                 f"{None if t is None else list(t.element_strides)}", "a contiguous tensor "
                 "(supports_strided_input is False)")
        expect(max(T * H, nb * bs, B * bt.shape[1], max_pos * rd, hs) <= _I32,
               f"{OP}: tokens*heads ({T * H}), cache slots ({nb * bs}), block table entries "
               f"({B * bt.shape[1]}), cos_cache entries and head_size ({hs}) must each fit in "
               "int32")
        need(IN_BLOCK_TABLE, bt.shape[1] * bs <= 2**30, f"covers {bt.shape[1] * bs} keys",
             "at most 2**30 keys per sequence (max_blocks * block_size)")
        if outputs is not None:
            outs = list(outputs) + [None] * (2 - len(outputs))
            expect(not _absent(outs[0]), f"{OP}: output 0 ('output') is required")
            o = _meta(outs[0])
            expect(o.dtype == dtype and o.shape == (T, H * vhs) and o.is_contiguous,
                   f"{OP}: output 0 is {o.dtype.name} {list(o.shape)}; expected contiguous "
                   f"{dtype.name} [tokens, num_heads * v_head_size] = [{T}, {H * vhs}]")
            if not _absent(outs[1]):
                c = _meta(outs[1])
                expect(c.dtype == dtype and c.shape == kc.shape, f"{OP}: output 1 "
                       f"('key_cache_out') is {c.dtype.name} {list(c.shape)}; it must alias "
                       f"key_cache ({dtype.name} {list(kc.shape)})")
        return PagedGeometry(dtype, T, H, hs, vhs, B, nb, bs, bt.shape[1], rd, max_pos, float(scale))

    def _caps(self) -> Any:
        return self.rt.capabilities if self.rt is not None else _DEFAULT_CAPS

    def _plan(self, g: PagedGeometry, meta: np.ndarray | None, aligned: bool) -> PagedPlan:
        rows = g.tokens * g.heads
        if rows == 0:
            return PagedPlan("none", 0, 0, 1, 0, 0)
        caps = self._caps()
        block_n, path = 0, "mla"
        mla_ok = (g.head_size, g.v_head_size) in MLA_SHAPES and aligned
        cc = tuple(getattr(caps, "compute_capability", (0, 0)))
        wg_ok = mla_ok and cc == (9, 0) and mla_wg_smem_bytes(g.head_size) <= caps.max_shared_per_block_optin
        if self.path == "wg" or (self.path == "auto" and wg_ok):
            smem = mla_wg_smem_bytes(g.head_size)
            if not wg_ok:
                raise KernelError(f"{OP}: path='wg' needs head_size/v_head_size in {MLA_SHAPES}, "
                                  f"16-byte aligned pointers, compute capability 9.0 (sm_90a "
                                  f"wgmma) and {smem} bytes of shared memory; got "
                                  f"{g.head_size}/{g.v_head_size}, aligned={aligned}, "
                                  f"cc={cc}, {caps.max_shared_per_block_optin} bytes")
            block_n, path = 64, "wg"
        elif self.path != "simple" and mla_ok:
            tiles = {"mla64": (64,), "mla32": (32,)}.get(self.path, MLA_TILES)
            fits = [bn for bn in tiles
                    if mla_smem_bytes(bn, g.head_size) <= caps.max_shared_per_block_optin]
            block_n = fits[0] if fits else 0
        if block_n == 0:
            if self.path in ("mla", "mla64", "mla32"):
                raise KernelError(f"{OP}: path={self.path!r} needs head_size/v_head_size in "
                                  f"{MLA_SHAPES}, 16-byte aligned pointers and "
                                  f"{mla_smem_bytes(MLA_TILES[-1], g.head_size)} bytes of shared "
                                  f"memory; got {g.head_size}/{g.v_head_size}, aligned={aligned}, "
                                  f"{caps.max_shared_per_block_optin} bytes")
            smem = simple_smem_bytes(g.head_size, g.v_head_size)
            expect(smem <= caps.max_shared_per_block_optin,
                   f"{OP}: head_size {g.head_size} / v_head_size {g.v_head_size} need {smem} bytes "
                   f"of shared memory on the simple path; the device allows "
                   f"{caps.max_shared_per_block_optin}")
            return PagedPlan("simple", 0, rows, 1, 0, 0)
        # Row blocks: sequence b owns [G(b), G(b+1)), G(b) = floor(cu[b]*H/64) + (H%64 ? b : 0).
        extra = g.batch if g.heads % MLA_ROWS else 0
        grid_x = rows // MLA_ROWS + extra
        splits = self.num_splits or self._auto_splits(g, grid_x, block_n, None, caps, path)
        if meta is not None and not self.num_splits:
            # Metadata may only lower the count, so the shapes-only workspace always suffices.
            splits = min(splits, self._auto_splits(g, grid_x, block_n, meta, caps, path))
        lse_off, ws = workspace_layout(rows, g.v_head_size, splits)
        return PagedPlan(path, block_n, grid_x, splits, lse_off, ws)

    def _auto_splits(self, g: PagedGeometry, grid_x: int, block_n: int, meta: np.ndarray | None,
                     caps: Any, path: str = "mla") -> int:
        max_q, max_kv = g.tokens, g.max_blocks * g.block_size
        if meta is not None:
            max_q, max_kv = min(max_q, int(meta[0])), min(max_kv, int(meta[1]))
        span = max_kv if self.attrs.window < 0 else min(max_kv, self.attrs.window + max_q)
        tiles = -(-max(span, 1) // block_n) + (1 if self.attrs.window >= 0 else 0)
        row_blocks = min(grid_x, g.batch * -(-max(max_q, 1) * g.heads // MLA_ROWS))
        rows = min(g.tokens, g.batch * max(max_q, 1)) * g.heads
        return choose_splits(row_blocks, tiles, int(caps.sm_count), rows, g.v_head_size, path=path)

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
        if self.rt is None:
            raise KernelError(f"{OP}: this kernel was created without a runtime (plan-only)")
        ins = list(inputs) + [None] * (17 - len(inputs))
        outs = list(outputs)
        geo = self.validate(ins, outs)
        views = [None if _absent(x) else x for x in ins[:16]]
        for i, v in enumerate(views):
            expect(v is None or isinstance(v, TensorView),
                   f"{OP}: input '{INPUT_NAMES[i]}' ({i}) must be a device TensorView")
        q, kc = views[IN_QUERY], views[IN_KEY_CACHE]
        out = outs[0]
        if len(outs) > 1 and not _absent(outs[1]):
            expect(outs[1].ptr == kc.ptr, f"{OP}: output 1 ('key_cache_out') at 0x{outs[1].ptr:x} "
                   f"must alias key_cache at 0x{kc.ptr:x} (the cache is updated in place)")
        meta = _host_metadata(ins[IN_ATTENTION_METADATA])
        aligned = all(t.ptr % 16 == 0 for t in (q, kc, out))
        plan = self._plan(geo, meta, aligned)
        if plan.splits > 1 and workspace is None:
            plan = PagedPlan(plan.path, plan.block_n, plan.grid_x, 1, 0, 0)  # unsplit, no workspace
        check_workspace(OP, WorkspaceRequirement(plan.ws_bytes, WS_ALIGN) if plan.ws_bytes
                        else WorkspaceRequirement.NONE, workspace)
        signature = (geo, plan, tuple(None if v is None else v.shape for v in views),
                     len(outs) > 1 and not _absent(outs[1]))
        capturing = self.rt.is_capturing()
        if capturing and signature not in self._warmed:
            raise KernelError(f"{OP}: this shape/dtype/plan has not run eagerly on this kernel; "
                              "warm the exact signature before capturing")
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
        small = _small_variant()
        if "write" in self._phases:
            rt.launch(self._fn(small, f"paged_write_{sfx}"), (g.tokens, 1, 1),
                      (WRITE_THREADS, 1, 1),
                      [key.ptr, cos_p, sin_p, slot.ptr, cu.ptr, past.ptr, kc.ptr, latch,
                       i32(g.tokens), i32(g.batch), i32(g.head_size),
                       i32(g.num_blocks * g.block_size), *rope])
        common = [i32(g.num_blocks), i32(g.block_size), i32(g.max_blocks), *rope, f32(g.scale),
                  f32(a.softcap), i32(a.window)]
        if p.path == "simple":
            smem = simple_smem_bytes(g.head_size, g.v_head_size)
            rt.launch(self._fn(small, f"paged_simple_{sfx}"), (g.tokens * g.heads, 1, 1),
                      (SIMPLE_THREADS, 1, 1),
                      [q.ptr, kc.ptr, cos_p, sin_p, cu.ptr, past.ptr, bt.ptr, out.ptr, latch,
                       i32(g.tokens), i32(g.heads), i32(g.batch), i32(g.head_size),
                       i32(g.v_head_size), *common], shared_mem=smem)
            return
        mla = _mla_variant(g.dtype, p.block_n if p.path == "mla" else 64)
        ws_o, ws_lse = (ws.ptr, ws.ptr + p.ws_lse_offset) if ws is not None and p.splits > 1 \
            else (0, 0)
        if "read" in self._phases:
            if p.path == "wg":
                fn, smem = self._fn(_wg_variant(g.dtype), "paged_mla_wg_fwd"), \
                    mla_wg_smem_bytes(g.head_size)
            else:
                fn, smem = self._fn(mla, "paged_mla_fwd"), mla_smem_bytes(p.block_n, g.head_size)
            rt.launch(fn, (p.grid_x, p.splits, 1), (MLA_THREADS, 1, 1),
                      [q.ptr, kc.ptr, cos_p, sin_p, cu.ptr, past.ptr, bt.ptr, out.ptr, ws_o, ws_lse,
                       latch, i32(g.tokens), i32(g.heads), i32(g.batch), *common, i32(p.splits)],
                      shared_mem=smem)
        if p.splits > 1 and "combine" in self._phases:
            rows = g.tokens * g.heads
            rt.launch(self._fn(mla, "paged_mla_combine"), (rows, 1, 1), (COMBINE_THREADS, 1, 1),
                      [ws_o, ws_lse, out.ptr, i32(rows), i32(p.splits)])


# --------------------------------------------------------------------------- variants
def _small_variant() -> Variant:
    return Variant("paged_small.cu", ("paged_write_f16", "paged_write_bf16", "paged_simple_f16",
                                      "paged_simple_bf16"))


def _mla_variant(dtype: DataType, block_n: int, shape: tuple[int, int] = MLA_SHAPES[0]) -> Variant:
    return Variant("paged_mla.cu", ("paged_mla_fwd", "paged_mla_combine"),
                   {"PA_BF16": int(dtype == DataType.BFLOAT16), "PA_BN": block_n,
                    "PA_HS": shape[0], "PA_VHS": shape[1]})


def _wg_variant(dtype: DataType, shape: tuple[int, int] = MLA_SHAPES[0]) -> Variant:
    return Variant("paged_mla_wg.cu", ("paged_mla_wg_fwd",),
                   {"PA_BF16": int(dtype == DataType.BFLOAT16), "PA_HS": shape[0],
                    "PA_VHS": shape[1]}, min_arch=90, arch_suffix="a")


def compile_variants() -> list[Variant]:
    """Every (file, defines, entries) this op may launch."""
    return [_small_variant()] + [_mla_variant(dt, bn, sh) for sh in MLA_SHAPES
                                 for dt in SUPPORTED for bn in MLA_TILES] + \
        [_wg_variant(dt, sh) for sh in MLA_SHAPES for dt in SUPPORTED]
