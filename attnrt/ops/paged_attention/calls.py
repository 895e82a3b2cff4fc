"""A PagedAttention call's objects in the shared form (:mod:`attnrt.ops._validate`).

``workspace_requirement`` and ``plan`` take :func:`call_metas`, ``execute`` takes
:func:`call_views` and :func:`check_aliases`, the reference takes :func:`check_host_call`;
each then applies :func:`.schema.validate`, so a call is judged by one set of rules
whichever entry point it comes through.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnrt.runtime.api import DataType, Node, TensorMetadata, TensorView
from attnrt.runtime.errors import KernelError, Unsupported

from .. import _validate as V
from .._common import expect
from .schema import (
    IN_ATTENTION_METADATA,
    IN_KEY_CACHE,
    INPUT_NAMES,
    MAX_INPUTS,
    MAX_OUTPUTS,
    OP,
    PagedAttrs,
    PagedGeometry,
    as_metadata,
    check_node,
    host_metadata,
    parse_attrs,
    unsupported_reason,
    validate,
)

__all__ = ["call_metas", "call_views", "check_aliases", "check_host_call"]


def _slots(inputs: Any, what: str) -> list[Any]:
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(f"{OP}: inputs must be a list of {what}, got {type(inputs).__name__}")
    expect(len(inputs) <= MAX_INPUTS, f"{OP}: {len(inputs)} inputs given; the op defines at most "
           f"{MAX_INPUTS}")
    return list(inputs) + [None] * (MAX_INPUTS - len(inputs))


def call_metas(inputs: Any) -> list[Any]:
    """``workspace_requirement``'s (and ``plan``'s) inputs: metadata or ``None`` for slots
    0-15 (a view becomes its metadata), slot 16 (``attention_metadata``: host values or a
    device tensor) as given.

    Raises
    ------
    TypeError
        ``inputs`` is not a list, or a slot holds a raw shape or another object.
    KernelError
        More than 17 slots, or a stride or span leaves the 64-bit pointer range.
    """
    ins = _slots(inputs, "TensorMetadata")
    return V.metas(ins[:16], 16, OP) + [ins[IN_ATTENTION_METADATA]]


def call_views(inputs: Any, outputs: Any) -> tuple[list[Any], list[TensorView]]:
    """``execute``'s inputs (16 views, absent slots as absent views, then slot 16) and its
    two outputs (an absent ``key_cache_out`` as an absent view).

    Raises
    ------
    TypeError
        ``inputs``/``outputs`` are not lists, a slot holds something other than a view or
        ``None`` (``attention_metadata``: also host values), e.g. ``TensorMetadata``.
    KernelError
        More inputs or outputs than the op defines, or a view leaves the pointer range.
    """
    ins = _slots(inputs, "TensorView")
    views: list[Any] = V.views(ins[:16], 16, "inputs", OP)
    meta = ins[IN_ATTENTION_METADATA]
    if isinstance(meta, TensorMetadata):
        raise TypeError(f"{OP}: inputs[16] ('attention_metadata') is a TensorMetadata; expected "
                        "host int32 values, a device TensorView or None")
    if isinstance(meta, TensorView) and not meta.absent:
        V.check_view(meta, "inputs[16]", OP)
    return views + [meta], V.views(outputs, MAX_OUTPUTS, "outputs", OP, mutable=True)


def check_aliases(inputs: list[Any], outputs: list[TensorView], ws_ptr: int, ws_bytes: int) -> None:
    """Refuse memory the call writes overlapping memory it reads or writes elsewhere.

    Written: ``output``, ``key_cache`` (updated in place; ``key_cache_out``, when given,
    must be that same tensor: the one alias the op defines) and the workspace bytes the
    plan uses. Read: every other input, a device ``attention_metadata`` included.

    Raises
    ------
    KernelError
        ``key_cache_out`` is not ``key_cache``, the output overlaps itself, or two ranges
        overlap (the message names both).
    """
    kc, out, cache_out = inputs[IN_KEY_CACHE], outputs[0], outputs[1]
    V.check_no_self_overlap(out, "output", OP)
    written = {"output": out, "key_cache": kc}
    if not cache_out.absent:
        expect(cache_out.ptr == kc.ptr, f"{OP}: output 1 ('key_cache_out') at 0x{cache_out.ptr:x} "
               f"must alias key_cache at 0x{kc.ptr:x} (the cache is updated in place)")
        written["key_cache_out"] = cache_out
    if ws_bytes:
        written["workspace"] = TensorView(ws_ptr, DataType.UINT8, (ws_bytes,))
    read = {INPUT_NAMES[i]: v for i, v in enumerate(inputs[:16]) if i != IN_KEY_CACHE and not v.absent}
    meta = inputs[IN_ATTENTION_METADATA]
    if isinstance(meta, TensorView) and not meta.absent:
        read["attention_metadata"] = meta
    V.check_disjoint(written, read, OP, allowed=[("key_cache_out", "key_cache")])


def check_host_call(node: Node, inputs: Any) -> tuple[PagedAttrs, PagedGeometry]:
    """The kernel's validation of a call on host arrays (the reference's): the node rules,
    the declined modes, the attributes, then :func:`.schema.validate` on the arrays'
    shapes and dtypes.

    Raises
    ------
    TypeError
        The node is malformed, ``inputs`` is not a list, or a slot is not a numpy array.
    Unsupported
        A mode the kernel declines (SEPARATE layout, ``kv_num_heads != 1``, ``value``...).
    KernelError
        What ``create``, ``workspace_requirement`` or ``execute`` would refuse.
    """
    check_node(node)
    ins = _slots(inputs, "numpy arrays")
    for i, x in enumerate(ins[:16]):
        if x is not None and not isinstance(x, np.ndarray):
            raise TypeError(f"{OP}: inputs[{i}] ('{INPUT_NAMES[i]}') is a {type(x).__name__}; "
                            "expected a numpy array or None")
    reason = unsupported_reason(node, [None if x is None else x.shape for x in ins[:16]], (),
                                attributes=False)
    if reason is not None:
        raise Unsupported(reason)
    a = parse_attrs(node)
    host_metadata(ins[IN_ATTENTION_METADATA])
    try:
        metas = [None if x is None else as_metadata(x) for x in ins[:16]]
    except TypeError as exc:  # a dtype no DataType names (object, complex, ...)
        raise KernelError(f"{OP}: {exc}") from None
    return a, validate(a, metas)
