"""``pkg.nxrt::Attention``: scaled-dot-product / grouped-query attention.

``O = softmax(softcap(scale · Q Kᵀ) + mask, keys) · V`` with Q [B, H, Sq, D], K and V
[B, Hkv, Sk, D], an optional additive mask of Q's dtype holding 1, B or B·H [Sq, Sk] planes,
and the output [B, H, Sq, D]; f32, f16, bf16. Query i sits at position ``p = Sk - Sq + i``
(bottom-right alignment); with ``causal`` it sees keys ``j <= p``, with
``local_window_size = w >= 0`` keys with ``p - j <= w``. A row that sees no key gives zeros.
Head ``h`` reads KV head ``h // (H / Hkv)``; K and V are never expanded.

Kernels: ``tc`` (mma.sync, f16/bf16), ``simt`` (CUDA cores, any dtype), ``wg`` (Hopper
wgmma, D 64/128), ``decode`` (one launch for G·Sq <= 16 packed rows) and ``unfused`` (three
kernels, any D). :func:`~attnrt.ops.attention.plan.plan` picks one per call under an
:class:`AttentionConfig`; the design and its measurements are in docs/notes/attention.md.

Modules: :mod:`.schema` (attributes, shapes, the claim gate), :mod:`.plan` (the pure planner
and its config), :mod:`.builds` (tiles and compile variants), :mod:`.kernel` (factory and
kernel), :mod:`.reference` (the float64 numpy oracle).
"""

from __future__ import annotations

from .builds import (
    DEC_CLUSTERS,
    DEC_MAX_ROWS,
    DEC_MAX_SPLITS,
    DEC_TILES,
    TC_TILES,
    WG_BUILD,
    WG_CAUSAL,
    WG_LONG,
    compile_variants,
    dec_smem_bytes,
    simt_smem_bytes,
    tc_head_dim,
    tc_smem_bytes,
    wg_build,
    wg_builds,
    wg_keys,
    wg_persistent,
    wg_sched,
    wg_smem_bytes,
    wg_threads,
)
from .kernel import AttentionFactory, AttentionKernel
from .plan import (
    DEC_CTAS_PER_SM,
    DEC_MERGES,
    PATHS,
    AttentionConfig,
    Plan,
    choose_splits,
    dec_cluster_reason,
    decode_layout,
    decode_reason,
    decode_splits,
    plan,
    split_layout,
    unfused_layout,
    wg_grid,
    wg_reason,
)
from .schema import Attrs, Dims, check_dims, parse_attributes, unsupported_reason

__all__ = ["AttentionFactory", "AttentionKernel", "AttentionConfig", "Plan", "Attrs", "Dims",
           "compile_variants", "parse_attributes", "check_dims", "unsupported_reason", "plan",
           "split_layout", "unfused_layout", "decode_layout", "choose_splits", "decode_splits",
           "tc_head_dim", "tc_smem_bytes", "simt_smem_bytes", "wg_smem_bytes", "dec_smem_bytes",
           "wg_reason", "decode_reason", "dec_cluster_reason", "wg_build", "wg_builds",
           "wg_keys", "wg_sched", "wg_threads", "wg_persistent", "wg_grid", "PATHS",
           "DEC_MERGES", "DEC_CLUSTERS", "DEC_CTAS_PER_SM", "DEC_MAX_ROWS", "DEC_MAX_SPLITS",
           "DEC_TILES", "TC_TILES", "WG_BUILD", "WG_CAUSAL", "WG_LONG"]
