"""Plan/run objects: one op with fixed attributes on one runtime, for executors that capture.

::

    op = Attention(rt, num_heads=32, kv_num_heads=8, causal=True)
    p = op.plan(q, k, v)                 # host only: validation, output and workspace sizes
    ws = torch.empty(p.workspace_bytes, dtype=torch.uint8, device="cuda")
    op.run(q, k, v, out=o, workspace=ws)  # launches only: safe inside a CUDA graph capture

``plan`` takes tensors (any library), :class:`TensorView`/:class:`TensorMetadata`, or bare
shapes with ``dtype=``; it allocates nothing. ``run`` validates on the host again (no device
work besides the launches), never allocates, synchronizes or reads back while the stream is
capturing, and launches on ``rt.stream`` (bind the runtime to your stream with
``CudaRuntime(device, stream=...)``). PagedAttention and IndexShare must run once eagerly
with the captured shapes before a capture (it loads their kernels). The
:class:`~attnrt.runtime.api.Kernel` protocol is underneath: ``op.kernel`` is the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from attnrt.runtime.api import (
    DataType,
    Node,
    TensorMetadata,
    WorkspaceRequirement,
)
from attnrt.runtime.errors import Unsupported

from . import _dlpack
from .attention import AttentionConfig, AttentionFactory
from .index_share import IndexShareConfig, IndexShareFactory
from .paged_attention import PagedAttentionConfig, PagedAttentionFactory

__all__ = ["OpPlan", "Attention", "PagedAttention", "IndexShare"]

_Meta = TensorMetadata | None


@dataclass(frozen=True)
class OpPlan:
    """What :meth:`plan` found: the inputs' metadata, the outputs and the workspace.

    Attributes
    ----------
    inputs : tuple
        The inputs' :class:`TensorMetadata` in schema order (``None``: absent).
    outputs : tuple
        Each output's :class:`TensorMetadata` (dtype and C-contiguous shape).
    workspace : WorkspaceRequirement
        Exact bytes and alignment ``run`` needs (``nbytes == 0``: pass no workspace).
    """

    inputs: tuple[_Meta, ...]
    outputs: tuple[TensorMetadata, ...]
    workspace: WorkspaceRequirement

    @property
    def workspace_bytes(self) -> int:
        """``workspace.nbytes``: the exact size of the workspace to pass to ``run``."""
        return self.workspace.nbytes


class _PlannedOp:
    """The shared part: a node, its factory's kernel, plan and run over schema-ordered inputs."""

    def __init__(self, rt: Any, node: Node, factory: Any) -> None:
        self.rt = rt
        self.node = node
        self.factory = factory
        self.kernel = factory.create(node, [])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.node.attributes})"

    def _outputs(self, m: list[_Meta]) -> tuple[TensorMetadata, ...]:
        raise NotImplementedError

    def _plan(self, metas: Sequence[_Meta]) -> OpPlan:
        metas = list(metas)
        req = self.kernel.workspace_requirement(metas)  # KernelError names a bad input
        reason = self.factory.unsupported_reason(
            self.node, [None if m is None else m.shape for m in metas],
            [None if m is None else m.dtype for m in metas])
        if reason is not None:
            raise Unsupported(reason)
        return OpPlan(tuple(metas), self._outputs(metas), req)

    def _run(self, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any) -> None:
        stream = getattr(getattr(self.rt, "stream", None), "ptr", -1)
        ins = [_dlpack.as_view(x, stream_ptr=stream) for x in inputs]
        outs = [_dlpack.as_mut(x, stream_ptr=stream) for x in outputs]
        self.kernel.execute(ins, outs, _dlpack.workspace_of(workspace))

    def close(self) -> None:
        """Free memory the kernel keeps between calls (counter and scratch pools)."""
        close = getattr(self.kernel, "close", None)
        if callable(close):
            close()


def _metas(values: Sequence[Any], dtypes: Sequence[DataType | None]) -> list[_Meta]:
    return [_dlpack.as_meta(v, d) for v, d in zip(values, dtypes)]


class Attention(_PlannedOp):
    """``pkg.nxrt::Attention`` (SDPA/GQA): Q [B, H, Sq, D], K and V [B, Hkv, Sk, D].

    Parameters
    ----------
    rt
        The runtime (its stream is where ``run`` launches).
    num_heads, kv_num_heads
        H and Hkv (``kv_num_heads`` defaults to ``num_heads``; it must divide it).
    causal, scale, softcap, window
        Bottom-right causal masking; the softmax scale (``None``: 1/sqrt(D)); tanh
        soft-capping of the scores (0: off); the local window (-1: off).
    config
        The planner's knobs (:class:`~attnrt.ops.attention.AttentionConfig`: path, splits,
        merge; the default picks them from the shapes).

    Raises
    ------
    KernelError
        An attribute is out of range.
    """

    def __init__(self, rt: Any, *, num_heads: int, kv_num_heads: int | None = None,
                 causal: bool = False, scale: float | None = None, softcap: float = 0.0,
                 window: int = -1, config: AttentionConfig | None = None) -> None:
        attrs: dict[str, Any] = {"num_heads": num_heads, "kv_num_heads": kv_num_heads or num_heads,
                                 "causal": int(bool(causal)), "softcap": float(softcap),
                                 "local_window_size": window}
        if scale is not None:
            attrs["scale"] = float(scale)
        node = Node("Attention", "pkg.nxrt", attrs, ["Q", "K", "V", "mask"], ["O"])
        super().__init__(rt, node, AttentionFactory(rt, config))

    def _outputs(self, m: list[_Meta]) -> tuple[TensorMetadata, ...]:
        return (TensorMetadata(m[0].dtype, m[0].shape),)  # type: ignore[union-attr]

    def plan(self, q: Any, k: Any, v: Any, mask: Any = None, *,
             dtype: DataType | None = None) -> OpPlan:
        """Validate and size one call (host only; shapes need ``dtype``).

        Raises
        ------
        KernelError
            A shape or dtype does not fit; the message names the input.
        """
        return self._plan(_metas([q, k, v, mask], [dtype] * 4))

    def run(self, q: Any, k: Any, v: Any, mask: Any = None, *, out: Any,
            workspace: Any = None) -> None:
        """Launch on ``rt.stream``; ``out`` is [B, H, Sq, D] of Q's dtype.

        Raises
        ------
        KernelError
            A shape, dtype or stride does not fit; nothing was launched.
        WorkspaceError
            ``workspace`` is shorter than ``plan(...).workspace_bytes`` or misaligned.
        """
        self._run([q, k, v, mask], [out], workspace)


# Schema slots of com.microsoft::PagedAttention that this surface fills.
_PA_SLOTS = {"query": 0, "key": 1, "key_cache": 3, "cu_seqlens": 5, "past_lens": 6,
             "block_table": 7, "cos": 8, "sin": 9, "slot_mapping": 10, "attention_metadata": 16}
_PA_INDEX = ("cu_seqlens", "past_lens", "block_table", "slot_mapping")


class PagedAttention(_PlannedOp):
    """``com.microsoft::PagedAttention``, LATENT layout (MLA): write then paged read.

    Parameters
    ----------
    rt
        The runtime.
    num_heads
        Query heads per token (the query is [tokens, num_heads * head_size]).
    v_head_size
        Leading channels of a cached key used as its value (0: head_size; MLA: 512).
    scale, softcap, window
        As :class:`Attention` (``scale`` is required when ``v_head_size != head_size``).
    rotary, rotary_interleaved, rotary_offset
        Partial RoPE from ``cos``/``sin`` tables on channels ``[offset, offset + rotary_dim)``.
    config
        The planner's knobs (:class:`~attnrt.ops.paged_attention.PagedAttentionConfig`; the
        default picks the path and split count from the shapes).

    Raises
    ------
    KernelError
        An attribute is out of range.
    """

    def __init__(self, rt: Any, *, num_heads: int, v_head_size: int = 0, scale: float | None = None,
                 softcap: float = 0.0, window: int = -1, rotary: bool = False,
                 rotary_interleaved: bool = False, rotary_offset: int = 0,
                 config: PagedAttentionConfig | None = None) -> None:
        attrs: dict[str, Any] = {
            "num_heads": num_heads, "kv_num_heads": 1, "kv_cache_layout": "LATENT",
            "v_head_size": v_head_size, "softcap": float(softcap), "local_window_size": window,
            "do_rotary": int(bool(rotary)), "rotary_interleaved": int(bool(rotary_interleaved)),
            "rotary_offset": rotary_offset}
        if scale is not None:
            attrs["scale"] = float(scale)
        inputs: list[str | None] = [None] * 17
        for name, i in _PA_SLOTS.items():
            if rotary or name not in ("cos", "sin"):
                inputs[i] = name
        node = Node("PagedAttention", "com.microsoft", attrs, inputs, ["output"])
        super().__init__(rt, node, PagedAttentionFactory(rt, config=config))

    @staticmethod
    def _slots(values: dict[str, Any]) -> list[Any]:
        ins: list[Any] = [None] * 17
        for name, v in values.items():
            ins[_PA_SLOTS[name]] = v
        return ins

    def _outputs(self, m: list[_Meta]) -> tuple[TensorMetadata, ...]:
        q, kc = m[0], m[3]
        vhs = self.kernel.attrs.v_head_size or kc.shape[3]  # type: ignore[union-attr]
        return (TensorMetadata(q.dtype, (q.shape[0], self.kernel.attrs.num_heads * vhs)),)  # type: ignore[union-attr]

    def plan(self, query: Any, key: Any, key_cache: Any, cu_seqlens: Any, past_lens: Any,
             block_table: Any, slot_mapping: Any, *, cos: Any = None, sin: Any = None,
             dtype: DataType | None = None) -> OpPlan:
        """Validate and size one call (host only). Shapes take ``dtype`` for the float
        inputs and INT32 for the index inputs.

        Raises
        ------
        KernelError
            A shape or dtype does not fit; the message names the input.
        """
        named = dict(query=query, key=key, key_cache=key_cache, cu_seqlens=cu_seqlens,
                     past_lens=past_lens, block_table=block_table, slot_mapping=slot_mapping,
                     cos=cos, sin=sin)
        metas = {n: _dlpack.as_meta(v, DataType.INT32 if n in _PA_INDEX else dtype)
                 for n, v in named.items()}
        return self._plan(self._slots(metas))

    def run(self, query: Any, key: Any, key_cache: Any, cu_seqlens: Any, past_lens: Any,
            block_table: Any, slot_mapping: Any, *, cos: Any = None, sin: Any = None,
            attention_metadata: Any = None, out: Any, workspace: Any = None) -> None:
        """Write ``key`` into ``key_cache`` (in place) and attend; ``out`` is
        [tokens, num_heads * v_head_size]. ``attention_metadata``: optional host int32
        ``[max_query_len, max_kv_len]`` (lowers the split count; never read from the device).

        Raises
        ------
        KernelError
            A shape, dtype or attribute does not fit, or a capture of a signature that has
            not run eagerly; nothing was launched.
        WorkspaceError
            ``workspace`` is too short or misaligned.
        """
        stream = getattr(getattr(self.rt, "stream", None), "ptr", -1)
        ins = self._slots(dict(query=query, key=key, key_cache=key_cache, cu_seqlens=cu_seqlens,
                               past_lens=past_lens, block_table=block_table,
                               slot_mapping=slot_mapping, cos=cos, sin=sin))
        views: list[Any] = [None if x is None else _dlpack.as_view(x, stream_ptr=stream) for x in ins]
        views[16] = attention_metadata  # host values, or None
        self.kernel.execute(views, [_dlpack.as_mut(out, stream_ptr=stream)],
                            _dlpack.workspace_of(workspace))


class IndexShare(_PlannedOp):
    """``pkg.nxrt::IndexShare``: attention over the selected keys of each query row.

    Parameters
    ----------
    rt
        The runtime.
    num_heads, kv_num_heads
        N and Nkv of query [B, N, Sq, H] and key/value [B, Nkv, S, H].
    scale
        Softmax scale (``None``: 1/sqrt(H)).
    present
        ``"none"`` (output Y only), ``"concat"`` (also present K/V = past ⧺ current) or
        ``"capacity"`` (present K/V of the past's shape, may alias it: current tokens are
        written at the bias's valid frontier).
    config
        The planner's knobs (:class:`~attnrt.ops.index_share.IndexShareConfig`; the default
        lets the planner choose; pin ``ws``/``splits`` for batch-invariant outputs).

    Raises
    ------
    KernelError
        An attribute is out of range.
    ValueError
        An unknown ``present`` mode.
    """

    def __init__(self, rt: Any, *, num_heads: int, kv_num_heads: int | None = None,
                 scale: float | None = None, present: str = "none",
                 config: IndexShareConfig | None = None) -> None:
        if present not in ("none", "concat", "capacity"):
            raise ValueError(f"present must be 'none', 'concat' or 'capacity', got {present!r}")
        self.present = present
        attrs: dict[str, Any] = {"num_heads": num_heads, "kv_num_heads": kv_num_heads or num_heads}
        if scale is not None:
            attrs["scale"] = float(scale)
        outs: list[str | None] = ["Y"] + (["present_key", "present_value"] if present != "none" else [])
        node = Node("IndexShare", "pkg.nxrt", attrs, ["query", "key", "value", "past_key",
                                                      "past_value", "selected_indices",
                                                      "attention_bias"], outs)
        super().__init__(rt, node, IndexShareFactory(rt, config))

    def _outputs(self, m: list[_Meta]) -> tuple[TensorMetadata, ...]:
        q, k, pk = m[0], m[1], m[3]
        y = TensorMetadata(q.dtype, q.shape)  # type: ignore[union-attr]
        if self.present == "none":
            return (y,)
        if self.present == "capacity":
            if pk is None:
                raise Unsupported("IndexShare present='capacity' needs past_key/past_value")
            shape = pk.shape
        else:
            past = pk.shape[2] if pk is not None else 0
            shape = (k.shape[0], k.shape[1], past + k.shape[2], k.shape[3])  # type: ignore[union-attr]
        return (y, TensorMetadata(k.dtype, shape), TensorMetadata(k.dtype, shape))  # type: ignore[union-attr]

    def plan(self, query: Any, key: Any, value: Any, selected_indices: Any, *, past_key: Any = None,
             past_value: Any = None, attention_bias: Any = None, dtype: DataType | None = None,
             index_dtype: DataType = DataType.INT32) -> OpPlan:
        """Validate and size one call (host only; shapes take ``dtype``/``index_dtype``).

        Raises
        ------
        KernelError
            A shape or dtype does not fit; the message names the input.
        """
        return self._plan(_metas([query, key, value, past_key, past_value, selected_indices,
                                  attention_bias], [dtype] * 5 + [index_dtype, dtype]))

    def run(self, query: Any, key: Any, value: Any, selected_indices: Any, *, past_key: Any = None,
            past_value: Any = None, attention_bias: Any = None, out: Any, present_key: Any = None,
            present_value: Any = None, workspace: Any = None) -> None:
        """Launch on ``rt.stream``; ``out`` is Y [B, N, Sq, H]; with ``present`` set, also
        ``present_key``/``present_value``.

        Raises
        ------
        KernelError
            A shape, dtype, alias or (eagerly) an index row is refused; nothing that changes
            an output was launched.
        CaptureError
            Capturing before an eager warm-up of these shapes.
        WorkspaceError
            ``workspace`` is too short or misaligned.
        """
        outs = [out] + ([present_key, present_value] if self.present != "none" else [])
        self._run([query, key, value, past_key, past_value, selected_indices, attention_bias],
                  outs, workspace)
