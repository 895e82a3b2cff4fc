"""Node builders shared by the op tests: one place for each op's type, domain and slot names."""

from __future__ import annotations

from typing import Any

from attnrt.runtime.api import Node

INDEX_SHARE_INPUTS = ("q", "k", "v", "pk", "pv", "idx", "b")
INDEX_SHARE_OUTPUTS = ("y", "pk_out", "pv_out")


def attention_node(attrs: dict[str, Any], mask: bool = False) -> Node:
    """A ``pkg.nxrt::Attention`` node over q, k, v (and a mask) with output o."""
    return Node("Attention", "pkg.nxrt", attrs, ["q", "k", "v", "mask"] if mask else ["q", "k", "v"],
                ["o"])


def index_share_node(attrs: dict[str, Any], outputs: int = 1,
                     names: tuple[str, ...] = INDEX_SHARE_OUTPUTS) -> Node:
    """A ``pkg.nxrt::IndexShare`` node over all seven inputs with the first ``outputs`` outputs."""
    return Node("IndexShare", "pkg.nxrt", attrs, list(INDEX_SHARE_INPUTS), list(names[:outputs]))
