"""attnrt.ops: the attention ops, by (domain, op_type).

The registry maps each (domain, op_type) to its factory class; modules are imported on
first lookup so that ``import attnrt.ops`` stays cheap.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

__all__ = ["REGISTRY", "factory_class", "registered_ops", "cuda_sources", "CUDA_DIR"]

CUDA_DIR = Path(__file__).parent / "cuda"

#: (domain, op_type) -> "module:FactoryClass"
REGISTRY: dict[tuple[str, str], str] = {
    ("pkg.nxrt", "Attention"): "attnrt.ops.attention:AttentionFactory",
    ("com.microsoft", "PagedAttention"): "attnrt.ops.paged_attention:PagedAttentionFactory",
    ("pkg.nxrt", "IndexShare"): "attnrt.ops.index_share:IndexShareFactory",
}


def registered_ops() -> list[tuple[str, str]]:
    return sorted(REGISTRY)


def factory_class(domain: str, op_type: str) -> Any:
    """The factory class registered for (domain, op_type); ``KeyError`` if none."""
    target = REGISTRY[(domain, op_type)]
    mod, _, cls = target.partition(":")
    return getattr(importlib.import_module(mod), cls)


def cuda_sources() -> dict[str, str]:
    """Every kernel source and header shipped with the package: file name -> text."""
    return {p.name: p.read_text() for p in sorted(CUDA_DIR.glob("*.cu*"))}
