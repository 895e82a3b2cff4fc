"""torch integration: the ops as ``torch.library`` custom ops with fake implementations.

Importing this module (it needs torch) registers ``torch.ops.attnrt.attention``,
``paged_attention``, ``index_share``, ``index_share_concat`` and ``index_share_capacity``.
Each runs :mod:`attnrt.ops.functional` on torch's current stream; each has a fake (meta)
implementation, so ``torch.compile(fullgraph=True)`` keeps the calls in its graph, and
they are captured by ``torch.cuda.graph`` like torch's own ops (warm the shapes eagerly
first, as for any capture). ``paged_attention`` mutates ``key_cache`` and
``index_share_capacity`` ``past_key``/``past_value`` (declared to torch).

Annotations stay real objects here (no ``from __future__ import annotations``): torch reads
them to infer each op's schema.
"""

from typing import Optional, Tuple  # noqa: UP035

import torch

from . import functional as F

__all__ = ["attention", "paged_attention", "index_share", "index_share_concat",
           "index_share_capacity"]

Tensor = torch.Tensor
# torch's schema inference reads typing.Optional/Tuple (ruff's UP rules prefer the new spellings).
OptTensor = Optional[torch.Tensor]  # noqa: UP045
OptFloat = Optional[float]  # noqa: UP045
Triple = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # noqa: UP006


@torch.library.custom_op("attnrt::attention", mutates_args=(), device_types="cuda")
def attention(q: Tensor, k: Tensor, v: Tensor, mask: OptTensor = None, causal: bool = False,
              scale: OptFloat = None, softcap: float = 0.0, window: int = -1) -> Tensor:
    """:func:`attnrt.ops.functional.attention` as a torch op (returns a new tensor)."""
    return F.attention(q, k, v, mask=mask, causal=causal, scale=scale, softcap=softcap,
                       window=window)


@attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, mask: OptTensor = None, causal: bool = False,
      scale: OptFloat = None, softcap: float = 0.0, window: int = -1) -> Tensor:
    return q.new_empty(q.shape)


@torch.library.custom_op("attnrt::paged_attention", mutates_args=("key_cache",), device_types="cuda")
def paged_attention(query: Tensor, key: Tensor, key_cache: Tensor, cu_seqlens: Tensor,
                    past_lens: Tensor, block_table: Tensor, slot_mapping: Tensor,
                    cos: OptTensor = None, sin: OptTensor = None, num_heads: int = 0,
                    v_head_size: int = 0, scale: OptFloat = None, softcap: float = 0.0,
                    window: int = -1, rotary_interleaved: bool = False,
                    rotary_offset: int = 0) -> Tensor:
    """:func:`attnrt.ops.functional.paged_attention` as a torch op (``num_heads=0``: inferred)."""
    return F.paged_attention(query, key, key_cache, cu_seqlens, past_lens, block_table,
                             slot_mapping, cos=cos, sin=sin, num_heads=num_heads or None,
                             v_head_size=v_head_size, scale=scale, softcap=softcap, window=window,
                             rotary_interleaved=rotary_interleaved, rotary_offset=rotary_offset)


@paged_attention.register_fake
def _(query: Tensor, key: Tensor, key_cache: Tensor, cu_seqlens: Tensor, past_lens: Tensor,
      block_table: Tensor, slot_mapping: Tensor, cos: OptTensor = None, sin: OptTensor = None,
      num_heads: int = 0, v_head_size: int = 0, scale: OptFloat = None, softcap: float = 0.0,
      window: int = -1, rotary_interleaved: bool = False, rotary_offset: int = 0) -> Tensor:
    hs = key_cache.shape[3]
    heads = num_heads or query.shape[1] // hs
    return query.new_empty((query.shape[0], heads * (v_head_size or hs)))


@torch.library.custom_op("attnrt::index_share", mutates_args=(), device_types="cuda")
def index_share(query: Tensor, key: Tensor, value: Tensor, selected_indices: Tensor,
                past_key: OptTensor = None, past_value: OptTensor = None,
                attention_bias: OptTensor = None, scale: OptFloat = None) -> Tensor:
    """:func:`attnrt.ops.functional.index_share` (``present="none"``) as a torch op."""
    return F.index_share(query, key, value, selected_indices, past_key=past_key,
                         past_value=past_value, attention_bias=attention_bias, scale=scale)


@index_share.register_fake
def _(query: Tensor, key: Tensor, value: Tensor, selected_indices: Tensor,
      past_key: OptTensor = None, past_value: OptTensor = None, attention_bias: OptTensor = None,
      scale: OptFloat = None) -> Tensor:
    return query.new_empty(query.shape)


@torch.library.custom_op("attnrt::index_share_concat", mutates_args=(), device_types="cuda")
def index_share_concat(query: Tensor, key: Tensor, value: Tensor, selected_indices: Tensor,
                       past_key: OptTensor = None, past_value: OptTensor = None,
                       attention_bias: OptTensor = None,
                       scale: OptFloat = None) -> Triple:
    """``present="concat"``: returns (Y, present_key, present_value), present = past ⧺ current."""
    y, pk, pv = F.index_share(query, key, value, selected_indices, past_key=past_key,
                              past_value=past_value, attention_bias=attention_bias, scale=scale,
                              present="concat")
    return y, pk, pv


@index_share_concat.register_fake
def _(query: Tensor, key: Tensor, value: Tensor, selected_indices: Tensor,
      past_key: OptTensor = None, past_value: OptTensor = None, attention_bias: OptTensor = None,
      scale: OptFloat = None) -> Triple:
    past = past_key.shape[2] if past_key is not None else 0
    shape = (key.shape[0], key.shape[1], past + key.shape[2], key.shape[3])
    return query.new_empty(query.shape), key.new_empty(shape), key.new_empty(shape)


@torch.library.custom_op("attnrt::index_share_capacity", mutates_args=("past_key", "past_value"),
                         device_types="cuda")
def index_share_capacity(query: Tensor, key: Tensor, value: Tensor, selected_indices: Tensor,
                         past_key: Tensor, past_value: Tensor, attention_bias: Tensor,
                         scale: OptFloat = None) -> Tensor:
    """``present="capacity"``: the current tokens are written into ``past_key``/``past_value``
    in place (at the bias's valid frontier); returns Y."""
    return F.index_share(query, key, value, selected_indices, past_key=past_key,
                         past_value=past_value, attention_bias=attention_bias, scale=scale,
                         present="capacity")[0]


@index_share_capacity.register_fake
def _(query: Tensor, key: Tensor, value: Tensor, selected_indices: Tensor, past_key: Tensor,
      past_value: Tensor, attention_bias: Tensor, scale: OptFloat = None) -> Tensor:
    return query.new_empty(query.shape)
