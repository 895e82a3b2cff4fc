"""The ``com.microsoft::PagedAttention`` (LATENT) schema: inputs, attributes, validation.

Everything here is pure host code on metadata: the claim-time gate
(:func:`unsupported_reason`), attribute parsing (:func:`parse_attrs`) and the shape/dtype
checks that turn a call's inputs into a :class:`PagedGeometry` (:func:`validate`). The
declined modes and the int32 limits are described in
``docs/notes/paged_attention.md#schema``.

The rules are the shared ones of :mod:`attnrt.ops._validate`, applied identically by the
claim, ``create``, ``workspace_requirement``, ``execute`` and the reference (the call-time
forms are in :mod:`.calls`): the node may carry only the attributes in :data:`KNOWN_ATTRS`, at
most 17 inputs and 2 outputs; integer attributes must be integers (``do_rotary`` and
``rotary_interleaved`` 0 or 1); shapes are Python ints.

Float attributes (``scale``, ``softcap``) are rounded to float32 once, when parsed
(:func:`attnrt.ops._validate.float32_attr`): that is the value the kernels compute with,
and the reference uses the same parsed value. So ``softcap=1e-46`` is 0 (disabled) for
both; a non-zero ``scale`` that rounds to 0 is refused, since 0 means "not given". The
default scale ``1/sqrt(head_size)`` is rounded the same way.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnrt.runtime.api import DataType, Node, TensorMetadata, TensorView
from attnrt.runtime.errors import KernelError

from .. import _validate as V
from .._common import expect

__all__ = ["OP", "DOMAIN", "OP_TYPE", "INPUT_NAMES", "REQUIRED", "DECLINED_INPUTS", "QUANT_ATTRS",
           "KNOWN_ATTRS", "MAX_INPUTS", "MAX_OUTPUTS", "SUPPORTED", "PAGED_POSITION_OUT_OF_RANGE",
           "PagedAttrs", "PagedGeometry", "check_node", "parse_attrs", "unsupported_reason",
           "validate", "host_metadata", "is_absent", "as_metadata", "IN_QUERY", "IN_KEY", "IN_VALUE",
           "IN_KEY_CACHE", "IN_VALUE_CACHE", "IN_CU_SEQLENS", "IN_PAST_SEQLENS", "IN_BLOCK_TABLE",
           "IN_COS", "IN_SIN", "IN_SLOT_MAPPING", "IN_HEAD_SINK", "IN_Q_NORM", "IN_K_NORM",
           "IN_K_SCALE", "IN_V_SCALE", "IN_ATTENTION_METADATA"]

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
#: Every attribute the schema defines (declined ones included: they are named in the reason).
KNOWN_ATTRS = frozenset(("num_heads", "kv_num_heads", "kv_cache_layout", "scale", "softcap",
                         "local_window_size", "do_rotary", "rotary_interleaved", "rotary_offset",
                         "v_head_size", *QUANT_ATTRS))
MAX_INPUTS, MAX_OUTPUTS = 17, 2  # output 1: key_cache_out, the in-place cache
SUPPORTED = (DataType.FLOAT16, DataType.BFLOAT16)

#: Latch bit for a RoPE position outside cos_cache (registered by name on the runtime).
PAGED_POSITION_OUT_OF_RANGE = 4096
POSITION_BIT_NAME = "PagedAttention position outside cos/sin cache"

I32_MAX = 2**31 - 1


# --------------------------------------------------------------------------- attributes
@dataclass(frozen=True)
class PagedAttrs:
    """The node's attributes, parsed and checked (:func:`parse_attrs`)."""

    num_heads: int
    v_head_size: int  # 0: head_size
    scale: float | None
    softcap: float
    window: int
    do_rotary: bool
    interleaved: bool
    rotary_offset: int


def check_node(node: Any) -> None:
    """The shared node rules: a :class:`Node` of this op with a dict of known attributes and
    at most :data:`MAX_INPUTS` inputs and :data:`MAX_OUTPUTS` outputs.

    Raises
    ------
    TypeError
        ``node`` is not a Node or its attributes are not a dict.
    KernelError
        Another op, an unknown attribute, or too many inputs/outputs (the message names them).
    """
    V.check_node(node, OP, DOMAIN, OP_TYPE, KNOWN_ATTRS, MAX_INPUTS, MAX_OUTPUTS)


def _flag(attrs: Any, name: str) -> bool:
    v = V.int_attr(attrs, name, 0, OP)
    expect(v in (0, 1), f"{OP}: attribute {name} must be 0 or 1, got {v}")
    return v == 1


def parse_attrs(node: Node) -> PagedAttrs:
    """Check ``node`` (:func:`check_node`) and read its attributes.

    Raises
    ------
    TypeError
        As :func:`check_node`.
    KernelError
        An attribute has the wrong type or an invalid value (the message names it).
    """
    check_node(node)
    at = node.attributes
    scale = None
    if "scale" in at:
        # scale = 0 (the ONNX default) means "not given", as in onnxruntime.
        scale = V.float32_attr(at, "scale", 0.0, OP)
        expect(scale != 0.0 or at["scale"] == 0, f"{OP}: attribute scale={at['scale']!r} is 0 in "
               "float32 (0 means 'not given'); pass a float32-representable scale")
        scale = scale or None
    a = PagedAttrs(V.int_attr(at, "num_heads", 0, OP), V.int_attr(at, "v_head_size", 0, OP), scale,
                   V.float32_attr(at, "softcap", 0.0, OP), V.int_attr(at, "local_window_size", -1, OP),
                   _flag(at, "do_rotary"), _flag(at, "rotary_interleaved"),
                   V.int_attr(at, "rotary_offset", 0, OP))
    V.int_attr(at, "kv_num_heads", 0, OP)  # its value is a mode: unsupported_reason
    expect(a.num_heads >= 1, f"{OP}: attribute num_heads must be >= 1, got {a.num_heads}")
    expect(a.v_head_size >= 0, f"{OP}: attribute v_head_size must be >= 0, got {a.v_head_size}")
    expect(a.softcap >= 0.0, f"{OP}: attribute softcap must be >= 0 (0 disables), got {a.softcap}")
    expect(a.window >= -1, f"{OP}: attribute local_window_size must be >= -1, got {a.window}")
    expect(a.rotary_offset >= 0, f"{OP}: attribute rotary_offset must be >= 0, got {a.rotary_offset}")
    expect(a.scale is None or a.scale > 0, f"{OP}: attribute scale must be > 0 (0: not given), "
           f"got {a.scale}")
    # Kernels take these as int32 arguments.
    for name, v in (("num_heads", a.num_heads), ("v_head_size", a.v_head_size),
                    ("local_window_size", a.window), ("rotary_offset", a.rotary_offset)):
        expect(v <= I32_MAX, f"{OP}: attribute {name} {v} must fit in int32")
    return a


def _quantized(node: Node, name: str) -> bool:
    if not node.has(name):
        return False
    v = node.attributes[name]
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    return str(v).strip().lower() not in ("", "0", "none")


# --------------------------------------------------------------------------- claim time
def unsupported_reason(node: Node, shapes: Sequence[Sequence[int] | None] = (),
                       dtypes: Sequence[DataType | None] = (), *, attributes: bool = True) -> str | None:
    """Why the LATENT kernel declines ``node`` (``None``: it takes it). Pure, no GPU.

    Parameters
    ----------
    node
        The node to claim.
    shapes, dtypes
        Per input slot, ``None`` where unknown or absent (used when ``node.inputs`` is empty).
    attributes
        Also report an invalid attribute value as a reason.

    Returns
    -------
    str or None
        The reason, naming the declined mode: ``kv_cache_layout="SEPARATE"``,
        ``kv_num_heads != 1``, a quantized cache (``k_quant_type`` ...), ``head_sink``, q/k
        norm, ``k_scale``/``v_scale``, ``value``/``value_cache`` inputs, packed QKV, dtypes
        other than float16/bfloat16, or non-int32 index inputs; or what breaks a shared
        rule: another op, an unknown attribute, too many inputs/outputs/shapes, a shape
        that is not a sequence of non-negative integers.

    Raises
    ------
    TypeError
        ``node`` is not a Node or its attributes are not a dict.
    """
    try:
        check_node(node)
        expect(len(shapes) <= MAX_INPUTS and len(dtypes) <= MAX_INPUTS,
               f"{OP}: {len(shapes)} shapes / {len(dtypes)} dtypes given; the op defines "
               f"{MAX_INPUTS} inputs")
        for i, shp in enumerate(shapes):
            if shp is not None:
                V.dims(shp, f"input '{INPUT_NAMES[i]}' ({i})", OP)
    except KernelError as exc:
        return str(exc)
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
            parse_attrs(node)
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


# --------------------------------------------------------------------------- call time
@dataclass(frozen=True)
class PagedGeometry:
    """Everything launch planning needs, validated from metadata (:func:`validate`)."""

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


def is_absent(x: Any) -> bool:
    """Whether an input slot is absent (``None``, an absent view, or rank-0 metadata)."""
    # The executor hands absent slots to workspace_requirement as rank-0 FLOAT metadata.
    if x is None:
        return True
    if isinstance(x, TensorView):
        return x.absent
    if isinstance(x, TensorMetadata):
        return x.shape == ()
    return False


def as_metadata(x: Any) -> TensorMetadata:
    """The :class:`TensorMetadata` of a view, metadata, or host array."""
    if isinstance(x, TensorView):
        return x.meta
    if isinstance(x, TensorMetadata):
        return x
    arr = np.asarray(x)
    return TensorMetadata(DataType.from_numpy(arr.dtype), arr.shape)


def host_metadata(x: Any) -> np.ndarray | None:
    """Values of a host ``attention_metadata`` (numpy array or sequence); ``None`` otherwise.

    Raises
    ------
    KernelError
        A host value that is not int32 ``[max_query_len, max_kv_len(, min)]`` or is negative.
    """
    if x is None or isinstance(x, (TensorView, TensorMetadata)):
        return None  # a device tensor is accepted but never read (that would be a readback)
    arr = np.asarray(x)
    expect(arr.dtype == np.int32 and arr.ndim == 1 and arr.shape[0] in (2, 3),
           f"{OP}: input 'attention_metadata' (16) must be host int32 [max_query_len, "
           f"max_kv_len(, min)], got {arr.dtype} {arr.shape}")
    expect(bool(np.all(arr[:2] >= 0)), f"{OP}: attention_metadata {arr.tolist()} has a negative "
           "length")
    return arr


def validate(a: PagedAttrs, inputs: Sequence[Any],
             outputs: Sequence[Any] | None = None) -> PagedGeometry:
    """Check every shape, dtype and attribute of a call from metadata alone.

    Parameters
    ----------
    a
        The node's parsed attributes.
    inputs
        Views, metadata or host arrays in schema order (``None`` for absent).
    outputs
        Output views or metadata; ``None`` skips the output checks.

    Raises
    ------
    KernelError
        The first problem found, naming the input, the value and what was expected.
    TypeError
        An output is neither a view, metadata nor ``None``.
    """
    ins = list(inputs) + [None] * (17 - len(inputs))
    m: list[TensorMetadata | None] = [None if is_absent(x) else as_metadata(x) for x in ins[:16]]
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
        scale = float(np.float32(1.0 / math.sqrt(hs)))  # the float32 rule, as for attributes
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
    expect(max(T * H, nb * bs, B * bt.shape[1], max_pos * rd, hs) <= I32_MAX,
           f"{OP}: tokens*heads ({T * H}), cache slots ({nb * bs}), block table entries "
           f"({B * bt.shape[1]}), cos_cache entries and head_size ({hs}) must each fit in "
           "int32")
    need(IN_BLOCK_TABLE, bt.shape[1] * bs <= 2**30, f"covers {bt.shape[1] * bs} keys",
         "at most 2**30 keys per sequence (max_blocks * block_size)")
    if outputs is not None:
        expect(len(outputs) <= MAX_OUTPUTS, f"{OP}: {len(outputs)} outputs given; the op defines "
               f"at most {MAX_OUTPUTS}")
        outs = list(outputs) + [None] * (2 - len(outputs))
        for i, x in enumerate(outs):
            if not (x is None or isinstance(x, (TensorView, TensorMetadata))):
                raise TypeError(f"{OP}: outputs[{i}] is a {type(x).__name__}; expected a "
                                "TensorMut (or metadata when validating) or None")
        expect(not is_absent(outs[0]), f"{OP}: output 0 ('output') is required")
        o = as_metadata(outs[0])
        expect(o.dtype == dtype and o.shape == (T, H * vhs) and o.is_contiguous,
               f"{OP}: output 0 is {o.dtype.name} {list(o.shape)}; expected contiguous "
               f"{dtype.name} [tokens, num_heads * v_head_size] = [{T}, {H * vhs}]")
        if not is_absent(outs[1]):
            c = as_metadata(outs[1])
            expect(c.dtype == dtype and c.shape == kc.shape and c.is_contiguous, f"{OP}: output 1 "
                   f"('key_cache_out') is {c.dtype.name} {list(c.shape)} strides "
                   f"{list(c.element_strides)}; it must alias key_cache ({dtype.name} "
                   f"{list(kc.shape)}, contiguous)")
    return PagedGeometry(dtype, T, H, hs, vhs, B, nb, bs, bt.shape[1], rd, max_pos, float(scale))

