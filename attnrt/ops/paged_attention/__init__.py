"""``com.microsoft::PagedAttention`` with ``kv_cache_layout="LATENT"`` (multi-head latent attention).

One latent cache ``key_cache`` [num_blocks, block_size, 1, head_size] (``kv_num_heads == 1``)
whose leading ``v_head_size`` channels are the values. Each call writes the new key rows
(with partial RoPE) into the cache, then runs causal paged attention of the new tokens over
it. The modules, one concern each:

* :mod:`.schema`: inputs, attributes, claim-time gate, shape/dtype validation;
* :mod:`.calls`: a call's objects in the shared form (views, metadata, host arrays), aliases;
* :mod:`.plan`: the pure planner and :class:`PagedAttentionConfig`, its only knobs;
* :mod:`.builds`: compile variants and the kernels' launch facts;
* :mod:`.kernel`: the factory and the kernel (validate, plan, write phase, read launch);
* :mod:`.reference`: the float64 numpy oracle.

Semantics, paths and tuning history: ``docs/notes/paged_attention.md``.
"""

from __future__ import annotations

from .builds import compile_variants, mla_smem_bytes, mla_wg_smem_bytes, simple_smem_bytes
from .kernel import PagedAttentionFactory, PagedAttentionKernel
from .plan import (
    PagedAttentionConfig,
    PagedPlan,
    SplitCost,
    choose_splits,
    counts_offset,
    partition_layout,
    workspace_layout,
)
from .schema import PAGED_POSITION_OUT_OF_RANGE, PagedGeometry, unsupported_reason

__all__ = ["PagedAttentionFactory", "PagedAttentionKernel", "PagedAttentionConfig", "PagedPlan",
           "PagedGeometry", "SplitCost", "unsupported_reason", "compile_variants",
           "workspace_layout", "counts_offset", "partition_layout", "choose_splits",
           "mla_smem_bytes", "mla_wg_smem_bytes", "simple_smem_bytes", "PAGED_POSITION_OUT_OF_RANGE"]
