"""An Attention call's objects in the shared form (:mod:`attnrt.ops._validate`).

``workspace_requirement`` takes :func:`call_metas`, ``execute`` takes :func:`check_call`
(and :func:`check_workspace_alias` once the plan knows its workspace bytes), the reference
takes :func:`check_host_call`; each then applies :func:`.schema.check_io`, so a call is
judged by one set of rules whichever entry point it comes through.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnrt.runtime.api import DataType, Node, TensorMetadata, TensorView
from attnrt.runtime.errors import KernelError

from .. import _validate as V
from .schema import INPUT_NAMES, OP, Attrs, Dims, check_io, parse_attributes

__all__ = ["call_metas", "check_call", "check_workspace_alias", "check_host_call"]


def call_metas(node: Node, attrs: Attrs, inputs: Any
               ) -> tuple[Dims, DataType, list[TensorMetadata | None]]:
    """``workspace_requirement``'s inputs: metadata, a view (its metadata) or ``None`` per
    slot, checked as ``execute`` checks them.

    Returns
    -------
    tuple
        The problem sizes, the element type and the 4 slots (``None`` where absent).

    Raises
    ------
    TypeError
        ``inputs`` is not a list, or a slot holds a raw shape or another object.
    KernelError
        More than 4 slots, a stride or span outside the 64-bit pointer range, or what
        :func:`.schema.check_io` refuses.
    """
    metas = V.metas(inputs, len(INPUT_NAMES), OP)
    dims, dtype = check_io(node, attrs, metas, None)
    return dims, dtype, metas


def check_call(node: Node, attrs: Attrs, inputs: Any, outputs: Any
               ) -> tuple[Dims, DataType, list[TensorView], TensorView | None, TensorView]:
    """``execute``'s host-side checks, from the views alone (nothing is read or launched).

    Returns
    -------
    tuple
        The problem sizes, the element type, ``[Q, K, V]``, the mask (``None`` when absent)
        and the output.

    Raises
    ------
    TypeError
        ``inputs``/``outputs`` are not lists, or a slot holds something other than a view
        or ``None`` (e.g. ``TensorMetadata``).
    KernelError
        More than 4 inputs or 1 output, the output absent, a view outside the 64-bit
        pointer range, what :func:`.schema.check_io` refuses, an output that overlaps
        itself or any input (Attention defines no alias).
    """
    if isinstance(inputs, (list, tuple)) and not 3 <= len(inputs) <= len(INPUT_NAMES):
        raise KernelError(f"{OP}: expected 3 inputs (Q, K, V) or 4 (Q, K, V, mask), got {len(inputs)}")
    ins = V.views(inputs, len(INPUT_NAMES), "inputs", OP)
    (out,) = V.views(outputs, 1, "outputs", OP, required=(0,), mutable=True)
    dims, dtype = check_io(node, attrs, ins, out)
    V.check_no_self_overlap(out, "0", OP)
    V.check_disjoint({"0": out},
                     {f"{n} ({i})": t for i, (n, t) in enumerate(zip(INPUT_NAMES, ins)) if not t.absent},
                     OP)
    mask = None if ins[3].absent else ins[3]
    return dims, dtype, ins[:3], mask, out


def check_workspace_alias(ins: list[TensorView], mask: TensorView | None, out: TensorView,
                          ws_ptr: int, ws_bytes: int) -> None:
    """Refuse a workspace whose used bytes overlap an input or the output (the kernels
    write it).

    Raises
    ------
    KernelError
        The two names and their byte ranges.
    """
    if not ws_bytes:
        return
    read = {f"{n} ({i})": t for i, (n, t) in enumerate(zip(INPUT_NAMES, [*ins, mask])) if t is not None}
    V.check_disjoint({"workspace": TensorView(ws_ptr, DataType.UINT8, (ws_bytes,)), "0": out},
                     read, OP)


def check_host_call(node: Node, inputs: Any) -> tuple[Attrs, Dims, list[np.ndarray | None]]:
    """The kernel's validation of a call on host arrays (the reference's): the node rules
    and attributes, then :func:`.schema.check_io` on the arrays' shapes and dtypes.

    Returns
    -------
    tuple
        The attributes, the problem sizes and ``[Q, K, V, mask]`` as numpy arrays
        (``None`` for an absent mask).

    Raises
    ------
    TypeError
        The node is malformed, or ``inputs`` is not a list.
    KernelError
        What ``create``, ``workspace_requirement`` or ``execute`` would refuse: e.g. an
        int8 or bool Q, or a K, V or mask whose dtype differs from Q's.
    """
    attrs = parse_attributes(node)
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(f"{OP}: inputs must be a list of numpy arrays, got {type(inputs).__name__}")
    if len(inputs) > len(INPUT_NAMES):
        raise KernelError(f"{OP}: {len(inputs)} inputs given; the op defines at most {len(INPUT_NAMES)}")
    arrays = [None if x is None else np.asarray(x) for x in inputs] + [None] * (4 - len(inputs))
    metas: list[TensorMetadata | None] = []
    for i, x in enumerate(arrays):
        try:
            metas.append(None if x is None else TensorMetadata(DataType.from_numpy(x.dtype), x.shape))
        except TypeError:  # a dtype no DataType names (object, complex, ...)
            raise KernelError(f"{OP}: input {INPUT_NAMES[i]} ({i}) has numpy dtype {x.dtype}; "
                              "expected one of FLOAT, FLOAT16, BFLOAT16") from None
    dims, _ = check_io(node, attrs, metas, None, host=True)
    return attrs, dims, arrays
