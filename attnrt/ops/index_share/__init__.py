"""``pkg.nxrt::IndexShare``: selected-token sparse attention (DeepSeek DSA / GLM IndexShare).

One room per concern:

- :mod:`.schema`: attribute parsing, geometry, output checks, ``unsupported_reason``.
- :mod:`.indices`: the ``selected_indices`` row rules.
- :mod:`.plan`: the pure planner and :class:`IndexShareConfig`, the one way to pin a plan
  (its rules in :mod:`.tiling` and :mod:`.splitk`).
- :mod:`.builds`: the CUDA variants, their tunables and shared-memory layouts.
- :mod:`.kernel`: :class:`IndexShareFactory` and :class:`IndexShareKernel`.
- :mod:`.reference`: the float64 numpy oracle.

Design notes and the measurements behind the planner's rules: docs/notes/index_share.md.
"""

from __future__ import annotations

from .builds import (
    MMA_LAYOUTS,
    MMA_PIPES,
    WG_LAYOUTS,
    WG_MIN_GROUP,
    WG_MINB,
    WG_QREG_LAYOUT,
    WS_KTS,
    WS_MAX_SPLITS,
    WS_MIN_GROUP,
    WS_SLOTS,
    compile_variants,
)
from .indices import (
    IndexViolation,
    SelectedIndicesError,
    capacity_valid_lengths,
    check_selected_indices,
    find_index_violation,
)
from .kernel import IndexShareFactory, IndexShareKernel
from .plan import PATHS, DeviceLimits, IndexShareConfig, Plan, make_plan
from .schema import parse_attributes, resolve_geometry, unsupported_reason

__all__ = [
    "IndexShareFactory", "IndexShareKernel", "IndexShareConfig", "DeviceLimits", "Plan",
    "make_plan", "PATHS", "compile_variants", "unsupported_reason", "parse_attributes",
    "resolve_geometry", "find_index_violation", "check_selected_indices", "IndexViolation",
    "SelectedIndicesError", "capacity_valid_lengths", "MMA_LAYOUTS", "MMA_PIPES", "WG_LAYOUTS",
    "WG_MIN_GROUP", "WG_MINB", "WG_QREG_LAYOUT", "WS_KTS", "WS_MAX_SPLITS", "WS_MIN_GROUP",
    "WS_SLOTS",
]
