"""The Attention planner: which path, build, split count and workspace one call gets.

:func:`plan` is pure: it reads its arguments only, and every knob lives in the frozen
:class:`AttentionConfig` it is given (the one way to pin a path, a split count or a build
table). The rules and their measurements: docs/notes/attention.md#path-choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from attnrt.runtime.api import DataType
from attnrt.runtime.errors import KernelError

from .builds import (
    DEC_CLUSTERS,
    DEC_MAX_ROWS,
    DEC_MAX_SPLITS,
    DEC_TILES,
    SIMT_DMAX,
    SIMT_KEYS,
    SIMT_ROWS,
    TC_TILES,
    WG_BUILD,
    WG_CAUSAL,
    WG_LONG,
    WG_ROWS,
    WS_ALIGN,
    dec_ring_bytes,
    decode_layout,
    split_layout,
    tc_head_dim,
    unfused_layout,
    wg_keys,
)
from .schema import I32, OP, Attrs, Dims

__all__ = ["AttentionConfig", "Plan", "plan", "PATHS", "DEC_MERGES", "DECODE_PATHS", "WS_ALIGN",
           "split_layout", "decode_layout", "unfused_layout", "choose_splits", "decode_splits",
           "dec_warp_ring", "wg_reason", "decode_reason", "dec_cluster_reason", "wg_grid"]

PATHS = ("auto", "fused", "simt", "unfused", "wg", "decode")
#: The decode path's split merge: ``auto`` (cluster where :func:`dec_cluster_reason` allows,
#: else the last-arriving CTA through memory), ``last`` (always memory), ``cluster`` (forced).
DEC_MERGES = ("auto", "last", "cluster")
#: ``auto`` for decode-sized calls: the one-launch decode kernel or mma.sync + combine.
DECODE_PATHS = ("single", "tc")
MAX_SPLITS = 64
CTAS_PER_SM = 2       # resident CTAs per SM of both fused kernels (registers and smem allow two)
DEC_CTAS_PER_SM = 2   # resident decode CTAs per SM (H100/H200 shared memory)
DEC_MIN_TILES = 2     # key tiles per split at least (a split costs a partial and a merge)
WG_MIN_ROWS = 128     # ``auto`` takes ``wg`` from this many packed query rows G·Sq (prefill)

_Table = tuple[tuple[int, tuple[int, ...]], ...]


def _table(t: Mapping[int, Any] | _Table) -> _Table:
    items = t.items() if isinstance(t, Mapping) else t
    return tuple(sorted((int(k), tuple(int(x) for x in v)) for k, v in items))


#: The wgmma schedules attention_wg.cu builds (the others: lab/attention_wg_schedules.md).
WG_SCHEDULES = (6, 7)


@dataclass(frozen=True)
class AttentionConfig:
    """Every knob of the Attention planner and kernel; the defaults are the shipped choice.

    Parameters
    ----------
    path
        ``"auto"`` (the heuristic), ``"fused"`` (``tc`` where possible, else ``simt``),
        ``"simt"``, ``"unfused"``, ``"wg"`` or ``"decode"``; a forced path that cannot run a
        call is a :class:`KernelError` at planning.
    num_splits
        Force the split-KV count (None: heuristic; ``decode`` clamps it to DEC_MAX_SPLITS).
    dec_merge
        The decode path's split merge, one of :data:`DEC_MERGES`.
    wg_default
        ``auto`` takes the wgmma kernel for prefill on compute capability 9.0
        (docs/notes/attention.md#wg-default).
    decode_path
        ``auto`` for decode-sized calls: ``"single"`` (the one-launch decode kernel) or
        ``"tc"`` (mma.sync + split-KV + combine) (docs/notes/attention.md#decode-path).
    wg_max_ctas
        Cap on the CTAs of a persistent wgmma launch (None: one per SM); tests set it low so
        that every CTA loops over many work items.
    wg_build, wg_causal, wg_long
        The wgmma build tables (see :mod:`~attnrt.ops.attention.builds`); a mapping or
        ``((key, value), ...)``, stored as a sorted tuple of items.
    dec_clusters
        Split counts whose decode merge may run in a thread-block cluster.
    counter_pool
        Keep the decode split counters in a zeroed pool owned by the kernel (False: in the
        workspace's tail, cleared with a memset per call).

    Raises
    ------
    ValueError
        A value is out of its range.
    """

    path: str = "auto"
    num_splits: int | None = None
    dec_merge: str = "auto"
    wg_default: bool = True
    decode_path: str = "single"
    wg_max_ctas: int | None = None
    wg_build: _Table = _table(WG_BUILD)
    wg_causal: _Table = _table(WG_CAUSAL)
    wg_long: _Table = _table(WG_LONG)
    dec_clusters: tuple[int, ...] = DEC_CLUSTERS
    counter_pool: bool = True

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {self.path!r}")
        if self.num_splits is not None and (isinstance(self.num_splits, bool)
                                            or not hasattr(self.num_splits, "__index__")):
            raise ValueError(f"num_splits must be an integer or None, got {self.num_splits!r}")
        if self.num_splits is not None and not 1 <= int(self.num_splits) <= 65535:
            raise ValueError(f"num_splits must be in [1, 65535], got {self.num_splits!r}")
        if self.dec_merge not in DEC_MERGES:
            raise ValueError(f"dec_merge must be one of {DEC_MERGES}, got {self.dec_merge!r}")
        if self.decode_path not in DECODE_PATHS:
            raise ValueError(f"decode_path must be one of {DECODE_PATHS}, "
                             f"got {self.decode_path!r}")
        if self.wg_max_ctas is not None and int(self.wg_max_ctas) < 1:
            raise ValueError(f"wg_max_ctas must be None or >= 1, got {self.wg_max_ctas!r}")
        for name in ("wg_build", "wg_causal", "wg_long"):
            object.__setattr__(self, name, _table(getattr(self, name)))
        for name in ("wg_build", "wg_causal"):
            for d, entry in getattr(self, name):
                if entry[0] not in WG_SCHEDULES:
                    raise ValueError(f"{name}[{d}] names wgmma schedule {entry[0]}; attention_wg.cu "
                                     f"builds schedules {WG_SCHEDULES} (lab/attention_wg_schedules.md)")
        object.__setattr__(self, "dec_clusters", tuple(int(c) for c in self.dec_clusters))


DEFAULT_CONFIG = AttentionConfig()


@dataclass(frozen=True)
class Plan:
    """What one call runs.

    Attributes
    ----------
    path
        ``"tc"``, ``"wg"``, ``"decode"``, ``"simt"`` or ``"unfused"``.
    dp
        Padded head dim of the ``tc`` / ``wg`` / ``decode`` build, else 0.
    splits
        Key splits per row tile.
    workspace
        Bytes of workspace the call uses.
    ws_ml, ws_cnt
        Offsets of the split (m, l) array and of the decode split counters in it.
    cluster
        ``decode``: CTAs per cluster of the cluster split merge (0: through memory).
    warp_ring
        ``decode``: the per-warp K/V ring (grids of at most one CTA per SM).
    config
        The configuration it was planned under (shown, not compared).
    """

    path: str
    dp: int
    splits: int
    workspace: int
    ws_ml: int = 0
    ws_cnt: int = 0
    cluster: int = 0
    warp_ring: bool = False
    config: AttentionConfig = field(default=DEFAULT_CONFIG, compare=False)


# --------------------------------------------------------------------------- splits and grids
def choose_splits(dims: Dims, rows_per_cta: int, keys_per_tile: int, sm_count: int,
                  ctas_per_sm: int = CTAS_PER_SM) -> int:
    """Key splits per row tile for a grid smaller than the GPU: as many as fit one full wave
    without starting a second, and at least two key tiles per split (a split also costs its
    partial write and the combine's read)."""
    row_tiles = -(-dims.group * dims.Sq // rows_per_cta)
    ctas = row_tiles * dims.B * dims.Hkv
    n_tiles = -(-dims.Sk // keys_per_tile)
    if ctas == 0 or ctas >= sm_count or n_tiles < 4:
        return 1
    return max(1, min(ctas_per_sm * sm_count // ctas, n_tiles // 2, MAX_SPLITS))


def decode_splits(dims: Dims, dp: int, sm_count: int, window: int = -1,
                  pairs: bool = False) -> int:
    """Key splits of the decode kernel: one wave of ``DEC_CTAS_PER_SM * sm_count`` CTAs over
    the B·Hkv row tiles, at least ``DEC_MIN_TILES`` key tiles per split (of the keys a local
    window of ``window`` >= 0 leaves visible), at most ``DEC_MAX_SPLITS``.

    ``pairs``: the call can merge two splits in a cluster. Then row tiles that fill between
    half and all of the SMs once over take two splits at one CTA per SM instead of four at
    two (docs/notes/attention.md#decode-pairs).
    """
    nwarps, _ = DEC_TILES[dp]
    tasks = dims.B * dims.Hkv
    keys = dims.Sk if window < 0 else min(dims.Sk, window + dims.Sq + 1)
    n_tiles = -(-keys // (16 * nwarps))
    if tasks == 0 or tasks >= sm_count or n_tiles < 2 * DEC_MIN_TILES:
        return 1
    if pairs and sm_count // tasks == 2:
        return 2
    return max(1, min(DEC_CTAS_PER_SM * sm_count // tasks, n_tiles // DEC_MIN_TILES,
                      DEC_MAX_SPLITS))


def dec_warp_ring(dims: Dims, splits: int, sm_count: int) -> bool:
    """The decode ring schedule (``Plan.warp_ring``): the per-warp ring for grids of at most
    one CTA per SM, the CTA ring for two (docs/notes/attention.md#decode-warp-ring)."""
    return dims.B * dims.Hkv * splits <= sm_count


def wg_grid(items: int, sm_count: int, max_ctas: int | None = None) -> int:
    """CTAs of a persistent wgmma launch over ``items`` work items: one per SM, at most
    ``max_ctas`` (:attr:`AttentionConfig.wg_max_ctas`) when given."""
    n = min(items, sm_count)
    if max_ctas is not None:
        n = min(n, max_ctas)
    return max(1, n)


def _check_fused_grid(dims: Dims) -> None:
    # Checked for the SIMT kernel's 32-row tiles (the larger grid), so that execute may
    # switch a tensor-core plan to it.
    row_tiles = -(-dims.group * dims.Sq // SIMT_ROWS)
    n_ctas = row_tiles * dims.B * dims.Hkv
    if n_ctas > I32 or -(-dims.B * dims.H * dims.Sq // 4) > I32:
        raise KernelError(f"{OP}: {n_ctas} row tiles (B={dims.B}, kv heads={dims.Hkv}, "
                          f"{dims.group} x Sq={dims.Sq} packed rows) exceed the fused grid "
                          "limit of 2**31-1 CTAs")


def _check_unfused_grid(dims: Dims) -> None:
    bh = dims.B * dims.H
    if bh > 65535 or -(-dims.Sq // 64) > 65535 or bh * dims.Sq > I32:
        raise KernelError(f"{OP}: B*num_heads = {bh}, Sq = {dims.Sq} exceed the unfused path's "
                          "grid limits (B*num_heads <= 65535, Sq <= 4194240, "
                          "B*num_heads*Sq <= 2**31-1)")


# --------------------------------------------------------------------------- reasons
def wg_reason(dims: Dims, dtype: DataType, tc_ok: bool, cc: tuple[int, int] | None,
              config: AttentionConfig = DEFAULT_CONFIG) -> str | None:
    """Why the wgmma kernel cannot run this call (None: it can)."""
    builds = dict(config.wg_build)
    if cc is not None and tuple(cc) != (9, 0):
        return f"compute capability {tuple(cc)} (wgmma/sm_90a needs exactly 9.0)"
    if dtype == DataType.FLOAT:
        return "dtype FLOAT (wgmma takes f16/bf16)"
    if dims.D not in builds:
        return f"head_dim D = {dims.D} (wgmma builds: {sorted(builds)})"
    if not tc_ok:
        return "Q/K/V strides that are not multiples of 8 elements (16-byte rows)"
    return None


def dec_cluster_reason(dims: Dims, dp: int, splits: int, cc: tuple[int, int] | None,
                       config: AttentionConfig = DEFAULT_CONFIG) -> str | None:
    """Why the decode split merge of this call cannot run in a thread-block cluster (None: it
    can). Rank 0 receives every split's partial (``O [splits][G·Sq][D]`` and (max, sum) in f32) in
    its idle K/V ring, after the warp-merge scratch (as the receive area in
    attention_fused_tc.cu)."""
    if cc is None or tuple(cc) < (9, 0):
        return f"compute capability {cc} (thread-block clusters need 9.0+)"
    if splits not in config.dec_clusters:
        return f"{splits} splits (cluster builds: {', '.join(map(str, config.dec_clusters))})"
    nwarps = DEC_TILES[dp][0]
    ring = dec_ring_bytes(dp)
    # DEC_MERGE_FLOATS: per-warp O rows, per-warp (max, sum), split weights
    scratch = nwarps * 16 * (dp + 8) + 2 * nwarps * 16 + 16 * (DEC_MAX_SPLITS + 1)
    rows = dims.group * dims.Sq
    need = (scratch + splits * rows * (dims.D + 2)) * 4
    if need > ring:
        return (f"{splits} partials of {rows} rows x D {dims.D} need {need} bytes of rank 0's "
                f"{ring}-byte ring")
    return None


def decode_reason(dims: Dims, dtype: DataType, tc_ok: bool) -> str | None:
    """Why the single-kernel decode cannot run this call (None: it can)."""
    if dtype == DataType.FLOAT:
        return "dtype FLOAT (the decode kernel takes f16/bf16)"
    if tc_head_dim(dims.D) is None:
        return f"head_dim D = {dims.D} (needs D % 8 == 0 and D <= 256)"
    if not tc_ok:
        return "Q/K/V strides that are not multiples of 8 elements (16-byte rows)"
    if dims.group * dims.Sq > DEC_MAX_ROWS:
        return (f"(num_heads/kv_num_heads) * Sq = {dims.group * dims.Sq} packed query rows "
                f"(at most {DEC_MAX_ROWS})")
    return None


# --------------------------------------------------------------------------- the planner
def plan(attrs: Attrs, dims: Dims, dtype: DataType, sm_count: int,
         config: AttentionConfig | None = None, *, tc_ok: bool = True,
         cc: tuple[int, int] | None = None) -> Plan:
    """Choose the path, splits and workspace for one call (pure).

    Parameters
    ----------
    attrs, dims, dtype
        The call (validated).
    sm_count
        The device's SMs.
    config
        The knobs (None: :class:`AttentionConfig`'s defaults).
    tc_ok
        The operands' strides suit the tensor-core kernels.
    cc
        The device's compute capability (None: unknown; ``auto`` then never takes ``wg``,
        and decode merges splits through memory).

    Returns
    -------
    Plan
        The path, build, splits and workspace, with ``config`` attached.

    Raises
    ------
    KernelError
        A fused path is forced on a head dim it cannot take (D > 256), ``path="wg"`` or
        ``path="decode"`` on a call that kernel cannot run (see :func:`wg_reason`,
        :func:`decode_reason`), or ``dec_merge="cluster"`` on a decode call whose merge
        cannot run in a cluster (see :func:`dec_cluster_reason`).
    """
    cfg = DEFAULT_CONFIG if config is None else config
    path, num_splits = cfg.path, cfg.num_splits
    D = dims.D
    if path == "unfused" or (path == "auto" and D > SIMT_DMAX):
        _check_unfused_grid(dims)
        return Plan("unfused", 0, 1, unfused_layout(dims.B, dims.H, dims.Sq, dims.Sk)[1],
                    config=cfg)
    if D > SIMT_DMAX:
        raise KernelError(f"{OP}: head_dim D = {D} with path={path!r}; the fused kernels take "
                          f"D <= {SIMT_DMAX} (use path='auto' or 'unfused')")
    _check_fused_grid(dims)
    use_wg = path == "wg"
    if use_wg:
        why = wg_reason(dims, dtype, tc_ok, cc, cfg)
        if why is not None:
            raise KernelError(f"{OP}: path='wg' cannot run this call: {why}; use path='auto'")
    elif path == "auto" and cfg.wg_default and cc is not None:
        use_wg = (wg_reason(dims, dtype, tc_ok, cc, cfg) is None
                  and dims.group * dims.Sq >= WG_MIN_ROWS)
    if use_wg:
        splits = (max(1, int(num_splits)) if num_splits is not None
                  else choose_splits(dims, WG_ROWS, wg_keys(D, bool(attrs.causal), dims.Sk, cfg),
                                     sm_count, dict(cfg.wg_build)[D][2]))
        _, ml, total = split_layout(dims.B * dims.H * dims.Sq, D, splits)
        return Plan("wg", D, splits, total, ml, config=cfg)
    use_dec = False
    if path == "decode":
        why = decode_reason(dims, dtype, tc_ok)
        if why is not None:
            raise KernelError(f"{OP}: path='decode' cannot run this call: {why}; use path='auto'")
        use_dec = True
    elif path == "auto" and cfg.decode_path == "single":
        use_dec = decode_reason(dims, dtype, tc_ok) is None
    if use_dec:
        return _plan_decode(attrs, dims, sm_count, cfg, cc)
    dp = tc_head_dim(D) if dtype != DataType.FLOAT and path != "simt" and tc_ok else None
    if dp is not None:
        nwarps, bn = TC_TILES[dp]
        kind, bm = "tc", 16 * nwarps
    else:
        kind, bm, bn, dp = "simt", SIMT_ROWS, SIMT_KEYS, 0
    if num_splits is not None:
        splits = max(1, int(num_splits))
    else:
        splits = choose_splits(dims, bm, bn, sm_count)
    _, ml, total = split_layout(dims.B * dims.H * dims.Sq, D, splits)
    return Plan(kind, dp, splits, total, ml, config=cfg)


def _plan_decode(attrs: Attrs, dims: Dims, sm_count: int, cfg: AttentionConfig,
                 cc: tuple[int, int] | None) -> Plan:
    dp = tc_head_dim(dims.D)
    assert dp is not None  # decode_reason checked it
    w, dec_merge = attrs.local_window_size, cfg.dec_merge
    pairs = dec_merge != "last" and dec_cluster_reason(dims, dp, 2, cc, cfg) is None
    splits = (min(max(1, int(cfg.num_splits)), DEC_MAX_SPLITS) if cfg.num_splits is not None
              else decode_splits(dims, dp, sm_count, -1 if w < 0 or w >= dims.Sk else w, pairs))
    wring = dec_warp_ring(dims, splits, sm_count)
    if dec_merge != "last" and splits > 1:
        why = dec_cluster_reason(dims, dp, splits, cc, cfg)
        if why is None:
            return Plan("decode", dp, splits, 0, cluster=splits, warp_ring=wring, config=cfg)
        if dec_merge == "cluster":
            raise KernelError(f"{OP}: dec_merge='cluster' cannot run this call: {why}")
    elif dec_merge == "cluster":
        raise KernelError(f"{OP}: dec_merge='cluster' cannot run this call: one split "
                          "(nothing to merge)")
    ml, cnt, total = decode_layout(dims.B * dims.H * dims.Sq, dims.D, splits, dims.B * dims.Hkv)
    return Plan("decode", dp, splits, total, ml, cnt, warp_ring=wring, config=cfg)
