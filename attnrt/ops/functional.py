"""One-call ops on the caller's tensors and stream: ``attention``, ``paged_attention``
(alias ``mla_decode``) and ``index_share``.

Inputs are torch tensors, CuPy arrays, JAX arrays or anything else with ``__dlpack__`` or
``__cuda_array_interface__`` (or our :class:`TensorView` s). Outputs are allocated like the
inputs: torch tensors for torch inputs (torch's caching allocator, same device), otherwise a
:class:`~attnrt.runtime.tensors.DeviceArray` (``__dlpack__`` and ``__cuda_array_interface__``,
freed when collected); pass ``out=`` to write into your own.

Streams: each call launches on the caller's *current* stream: torch's current stream for
torch tensors, CuPy's for CuPy arrays; JAX and other producers are ordered before the op
through DLPack's stream handshake and the op runs on the runtime's own stream. So a call
composes with the library's own kernels (stream order, no device-wide synchronization) and
is captured by ``torch.cuda.graph`` like any torch op. See ``docs/guide/streams.md``.

Caching: one runtime per device (:func:`default_runtime`), one kernel per op and attribute
set, one plan (validation result, output shape, workspace size) per input signature. A
repeat call re-validates on the host and launches; it creates no kernel and compiles
nothing. Workspaces come from torch's allocator for torch inputs (stream-ordered and
capture-aware), else from an arena cached with the plan. Errors are the kernel protocol's
(:class:`KernelError`, :class:`Unsupported`, :class:`CaptureError`, :class:`WorkspaceError`).
Kernels that latch device-side errors during a captured replay set bits in the runtime's
latch: call ``default_runtime().latch.check()`` after replays.
"""

from __future__ import annotations

from typing import Any

from attnrt.runtime.api import TensorView
from attnrt.runtime.errors import KernelError

from ._call import Call, clear_cache, default_runtime, signature
from .planned import Attention, IndexShare, OpPlan, PagedAttention

__all__ = ["attention", "paged_attention", "mla_decode", "index_share", "default_runtime",
           "clear_cache", "Attention", "PagedAttention", "IndexShare", "OpPlan"]

def _shape4(v: TensorView, op: str, name: str) -> tuple[int, ...]:
    if v.rank != 4:
        raise KernelError(f"{op}: input {name} has shape {list(v.shape)}; expected rank 4")
    return v.shape


def attention(q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None,
              softcap: float = 0.0, window: int = -1, mask: Any = None, out: Any = None,
              runtime: Any = None) -> Any:
    """Scaled-dot-product / grouped-query attention on the caller's stream.

    Parameters
    ----------
    q, k, v
        Q [B, H, Sq, D]; K and V [B, Hkv, Sk, D] with Hkv dividing H; float32, float16 or
        bfloat16 (all the same); any B/H/S strides with a unit D stride.
    causal
        Bottom-right aligned: query i sees keys j <= Sk - Sq + i.
    scale
        Softmax scale (``None``: 1/sqrt(D)).
    softcap
        ``softcap * tanh(s / softcap)`` on the scores (0: off).
    window
        Local window w >= 0: query at position p sees keys with p - j <= w (-1: off).
    mask
        Optional additive mask of Q's dtype, [Sq, Sk], [B, 1, Sq, Sk] or [B, H, Sq, Sk].
    out
        Optional output [B, H, Sq, D] of Q's dtype (written in place and returned).
    runtime
        Launch on this runtime's stream instead of the caller's current stream.

    Returns
    -------
    tensor
        ``out``, or a new output of the inputs' library.

    Raises
    ------
    KernelError
        A shape, dtype, stride or attribute does not fit (including ``out``).
    Unsupported
        A configuration the kernels decline.
    """
    with Call(q, runtime) as c:
        views = c.views([q, k, v, mask])
        H, Hkv = _shape4(views[0], "Attention", "Q (0)")[1], _shape4(views[1], "Attention", "K (1)")[1]
        if Hkv < 1 or H % Hkv:
            raise KernelError(f"Attention: input K (1) has {Hkv} heads; expected a divisor of Q's "
                              f"{H} heads")
        key = ("attention", H, Hkv, bool(causal), scale, float(softcap), int(window))
        op = c.state.op(key, lambda: Attention(c.rt, num_heads=H, kv_num_heads=Hkv, causal=causal,
                                               scale=scale, softcap=softcap, window=window))
        e = c.state.entry(op, key + signature(views), views)
        obj, mut = c.output(out, e.plan.outputs[0], "out")
        op.kernel.execute(views, [mut], c.workspace(e))
        c.finish([obj])
        return obj


def paged_attention(query: Any, key: Any, key_cache: Any, cu_seqlens: Any, past_lens: Any,
                    block_table: Any, slot_mapping: Any, *, cos: Any = None, sin: Any = None,
                    num_heads: int | None = None, v_head_size: int = 0, scale: float | None = None,
                    softcap: float = 0.0, window: int = -1, rotary_interleaved: bool = False,
                    rotary_offset: int = 0, attention_metadata: Any = None, out: Any = None,
                    runtime: Any = None) -> Any:
    """Paged MLA attention (``com.microsoft::PagedAttention``, LATENT) on the caller's stream.

    Writes each new token's ``key`` (RoPE'd when ``cos``/``sin`` are given) into
    ``key_cache`` at ``slot_mapping`` (in place), then attends causally over the cached
    keys of its sequence through ``block_table``.

    Parameters
    ----------
    query
        [tokens, num_heads * head_size], float16 or bfloat16.
    key
        [tokens, head_size], the new latent rows.
    key_cache
        [num_blocks, block_size, 1, head_size]; updated in place.
    cu_seqlens, past_lens, block_table, slot_mapping
        int32: [batch + 1] token offsets, [batch] cached lengths, [batch, max_blocks], [tokens].
    cos, sin
        Optional [max_position, rotary_dim / 2] RoPE tables (query's dtype).
    num_heads
        Query heads (default: query.shape[1] // head_size).
    v_head_size
        Leading channels used as the value (0: head_size); ``scale`` is then required.
    scale, softcap, window, rotary_interleaved, rotary_offset
        As the node attributes (see :class:`~attnrt.ops.planned.PagedAttention`).
    attention_metadata
        Optional host int32 [max_query_len, max_kv_len] (may lower the split count).
    out
        Optional output [tokens, num_heads * v_head_size].
    runtime
        Launch on this runtime's stream instead of the caller's current stream.

    Returns
    -------
    tensor
        ``out``, or a new output of the inputs' library.

    Raises
    ------
    KernelError
        A shape, dtype or attribute does not fit, or a capture of a signature that has not
        run eagerly.
    Unsupported
        A mode the LATENT kernel declines.
    """
    with Call(query, runtime) as c:
        ins = [query, key, key_cache, cu_seqlens, past_lens, block_table, slot_mapping, cos, sin]
        views = c.views(ins)
        if num_heads is None:
            hs = views[2].shape[-1] if views[2].rank else 1
            num_heads = max(1, views[0].shape[-1] // max(hs, 1)) if views[0].rank == 2 else 1
        rotary = not views[7].absent
        k = ("paged", int(num_heads), int(v_head_size), scale, float(softcap), int(window), rotary,
             bool(rotary_interleaved), int(rotary_offset))
        op = c.state.op(k, lambda: PagedAttention(
            c.rt, num_heads=int(num_heads), v_head_size=v_head_size, scale=scale, softcap=softcap,
            window=window, rotary=rotary, rotary_interleaved=rotary_interleaved,
            rotary_offset=rotary_offset))
        slots = op._slots(dict(zip(("query", "key", "key_cache", "cu_seqlens", "past_lens",
                                    "block_table", "slot_mapping", "cos", "sin"), views)))
        slots = [None if s is None or s.absent else s for s in slots]
        e = c.state.entry(op, k + signature(views), slots)
        obj, mut = c.output(out, e.plan.outputs[0], "out")
        slots[16] = attention_metadata
        op.kernel.execute(slots, [mut], c.workspace(e))
        c.finish([obj])
        return obj


mla_decode = paged_attention


def index_share(query: Any, key: Any, value: Any, selected_indices: Any, *, past_key: Any = None,
                past_value: Any = None, attention_bias: Any = None, scale: float | None = None,
                present: str = "none", out: Any = None, present_key: Any = None,
                present_value: Any = None, runtime: Any = None) -> Any:
    """Selected-token sparse attention (``pkg.nxrt::IndexShare``) on the caller's stream.

    Parameters
    ----------
    query
        [B, N, Sq, H]; float32, float16 or bfloat16.
    key, value
        Current tokens [B, Nkv, Scur, H].
    selected_indices
        [B, 1 | N, Sq, K] int32/int64 key positions, -1 padded at the end of a row. Checked
        on the host in eager calls (one small read-back); during a capture the kernel checks
        and latches instead.
    past_key, past_value
        Optional cache [B, Nkv, Spast, H].
    attention_bias
        Optional additive bias broadcastable to [B, N, Sq, cache length].
    scale
        Softmax scale (``None``: 1/sqrt(H)).
    present
        ``"none"``: return Y. ``"concat"``: also present K/V = past ⧺ current (new tensors
        unless given). ``"capacity"``: present K/V have the past's shape; by default they
        are ``past_key``/``past_value`` themselves, updated in place.
    out, present_key, present_value
        Optional outputs.
    runtime
        Launch on this runtime's stream instead of the caller's current stream.

    Returns
    -------
    tensor or tuple
        Y, or ``(Y, present_key, present_value)`` when ``present`` is not ``"none"``.

    Raises
    ------
    KernelError
        A shape, dtype, alias or attribute does not fit; eagerly, a broken index row
        (:class:`~attnrt.ops.index_share.SelectedIndicesError`).
    CaptureError
        Captured before an eager warm-up of these shapes.
    ValueError
        An unknown ``present`` mode.
    """
    if present not in ("none", "concat", "capacity"):
        raise ValueError(f"present must be 'none', 'concat' or 'capacity', got {present!r}")
    with Call(query, runtime) as c:
        views = c.views([query, key, value, past_key, past_value, selected_indices, attention_bias])
        N, Nkv = _shape4(views[0], "IndexShare", "query (0)")[1], _shape4(views[1], "IndexShare",
                                                                           "key (1)")[1]
        if Nkv < 1 or N % Nkv:
            raise KernelError(f"IndexShare: input key (1) has {Nkv} heads; expected a divisor of "
                              f"the query's {N} heads")
        k = ("index_share", N, Nkv, scale, present)
        op = c.state.op(k, lambda: IndexShare(c.rt, num_heads=N, kv_num_heads=Nkv, scale=scale,
                                              present=present))
        e = c.state.entry(op, k + signature(views), views)
        if present == "capacity":
            present_key = past_key if present_key is None else present_key
            present_value = past_value if present_value is None else present_value
        outs = [out] + ([present_key, present_value] if present != "none" else [])
        names = ("out", "present_key", "present_value")
        pairs = [c.output(o, m, n) for o, m, n in zip(outs, e.plan.outputs, names)]
        op.kernel.execute(views, [p[1] for p in pairs], c.workspace(e))
        objs = [p[0] for p in pairs]
        c.finish(objs)
        return objs[0] if present == "none" else tuple(objs)

