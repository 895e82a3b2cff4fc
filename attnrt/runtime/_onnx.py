"""Conversion between :class:`~attnrt.runtime.api.Node` and ONNX ``NodeProto`` (onnx is optional)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .api import Node

__all__ = ["node_from_onnx", "node_to_onnx"]


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("Node.from_onnx/to_onnx need the 'onnx' package: pip install onnx") from exc
    return onnx


def _attr_value(onnx: Any, a: Any) -> Any:
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, onnx.TensorProto):
        return onnx.numpy_helper.to_array(v)
    if isinstance(v, list):
        if v and isinstance(v[0], bytes):
            return [x.decode() for x in v]
        if v and isinstance(v[0], onnx.TensorProto):
            return [onnx.numpy_helper.to_array(x) for x in v]
        return list(v)
    return v


def node_from_onnx(cls: type[Node], proto: Any) -> Node:
    """Build a ``Node`` from a ``NodeProto`` (empty input/output names become ``None``)."""
    onnx = _onnx()
    if not isinstance(proto, onnx.NodeProto):
        raise TypeError(f"Node.from_onnx needs an onnx.NodeProto, got {type(proto).__name__}")
    attrs = {a.name: _attr_value(onnx, a) for a in proto.attribute}
    return cls(proto.op_type, proto.domain, attrs,
               [n or None for n in proto.input], [n or None for n in proto.output])


def _to_attr(onnx: Any, name: str, v: Any) -> Any:
    if isinstance(v, (bool, np.bool_)):
        v = int(v)
    elif isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, np.ndarray):
        return onnx.helper.make_attribute(name, onnx.numpy_helper.from_array(v, name))
    if isinstance(v, (list, tuple)):
        if not v:
            return onnx.helper.make_attribute(name, [], attr_type=onnx.AttributeProto.INTS)
        v = [int(x) if isinstance(x, (bool, np.bool_)) else (x.item() if isinstance(x, np.generic)
                                                              else x) for x in v]
    return onnx.helper.make_attribute(name, v)


def node_to_onnx(node: Node, name: str = "") -> Any:
    """The ``NodeProto`` of ``node`` (absent slots as empty names; attributes sorted by name)."""
    onnx = _onnx()
    proto = onnx.helper.make_node(node.op_type, [n or "" for n in node.inputs],
                                  [n or "" for n in node.outputs], name=name or None,
                                  domain=node.domain or None)
    proto.attribute.extend(_to_attr(onnx, k, node.attributes[k]) for k in sorted(node.attributes))
    return proto
