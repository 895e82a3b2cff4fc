"""IndexShare's planner: the path, tiling, split-K, merge and scratch layout of one call.

:func:`make_plan` is pure: it depends only on the geometry, the tensors' alignment, the
device (:class:`DeviceLimits`) and the caller's :class:`IndexShareConfig`, the one way to
pin a path or a knob. ``workspace_requirement`` and ``execute`` both call it, so the scratch
reserved and the scratch used agree. Each rule is a function below; why each rule is what
it is, with the measurements behind it: docs/notes/index_share.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from attnrt.runtime.api import DataType
from attnrt.runtime.errors import KernelError

from .._common import Variant
from .builds import (
    _ALIGN,
    _WS_KT,
    WG_MIN_GROUP,
    WS_MAX_SPLITS,
    WS_MIN_GROUP,
    _round_up,
    _writes_partials,
)
from .schema import OP, Geometry
from .splitk import _build, _Call, _choose_merge, _choose_split
from .tiling import _mma_tiling, _or, _simt_tiling, _wg_tiling, _ws_tiling

__all__ = ["IndexShareConfig", "DeviceLimits", "Plan", "make_plan", "wgmma_available", "PATHS"]

#: The attention paths a config may pin: CUDA cores, mma.sync tensor cores, sm_90a wgmma.
PATHS = ("simt", "mma", "wg")
_WG_ONLY = ("wgs", "mrows", "overlap", "qreg", "minb", "stages")  # the barrier-coupled build
_WS_ONLY = ("ctas", "q2", "kt")  # the warp-specialised build


@dataclass(frozen=True)
class IndexShareConfig:
    """Pins parts of IndexShare's plan; every ``None`` leaves that choice to the planner.

    The defaults reproduce the planner's own choices (the plan it predicts fastest). Pass
    one to :class:`~attnrt.ops.index_share.IndexShareFactory` (or set ``kernel.config``);
    each plan carries the config it was made with. A knob the plan's build cannot take is a
    ``KernelError`` from the planner, never a quietly different plan.

    Attributes
    ----------
    path
        ``"simt"`` (CUDA cores), ``"mma"`` (mma.sync tensor cores) or ``"wg"`` (sm_90a
        wgmma); ``None``: the fastest that applies.
    wgmma
        ``False`` keeps the planner off the wgmma path on sm_90 devices too.
    splits
        Split-K count per (batch, query, head block) task (rounded to whole tiles).
    merge
        How splits merge: ``"last"`` (the task's last CTA), ``"kernel"`` (a separate
        ``is_combine`` launch) or ``"cluster"`` (warp-specialised two-, four- or eight-CTA
        clusters).
    ws
        1: the warp-specialised persistent build; 0: the barrier-coupled wgmma build.
    ctas
        Cap on the warp-specialised grid (default: one CTA per SM).
    q2
        Warp-specialised: two Q slots (one split, int32 indices only).
    kt
        Warp-specialised keys per tile, one of ``WS_KTS``.
    wgs, mrows
        Barrier-coupled wgmma layout (warpgroups, head rows per CTA), one of ``WG_LAYOUTS``.
    overlap, qreg, minb
        Barrier-coupled wgmma: the overlapped loop, Q in registers, the register cap
        (``WG_MINB``).
    stages
        Tensor-core ring depth (mma or barrier-coupled wgmma).
    wm, wn
        mma.sync warp layout (along heads x along keys), one of ``MMA_LAYOUTS``.
    pipe
        mma.sync per-tile pipeline, one of ``MMA_PIPES``.

    Raises
    ------
    ValueError
        ``path`` is not ``None`` or one of ``PATHS``.
    """

    path: str | None = None
    wgmma: bool = True
    splits: int | None = None
    merge: str | None = None
    ws: int | None = None
    ctas: int | None = None
    q2: int | None = None
    kt: int | None = None
    wgs: int | None = None
    mrows: int | None = None
    overlap: int | None = None
    qreg: int | None = None
    minb: int | None = None
    stages: int | None = None
    wm: int | None = None
    wn: int | None = None
    pipe: int | None = None

    def __post_init__(self) -> None:
        if self.path is not None and self.path not in PATHS:
            raise ValueError(f"IndexShareConfig.path must be None, 'simt', 'mma' or 'wg', got "
                             f"{self.path!r}")

    def __repr__(self) -> str:
        """Only what differs from the defaults (the planner's own choices)."""
        diff = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default]
        return f"IndexShareConfig({', '.join(diff)})"


@dataclass(frozen=True)
class DeviceLimits:
    """The device facts the planner reads.

    Attributes
    ----------
    sm_count
        Streaming multiprocessors.
    smem_max
        Opt-in dynamic shared memory per block, bytes.
    smem_sm
        Shared memory per SM, bytes.
    sm90a
        The device runs sm_90a code (wgmma, clusters).
    """

    sm_count: int
    smem_max: int = 227 * 1024
    smem_sm: int = 228 * 1024
    sm90a: bool = False

    @classmethod
    def of(cls, caps: Any) -> DeviceLimits:
        """From a runtime's ``capabilities``."""
        smem_max = int(getattr(caps, "max_shared_per_block_optin", 227 * 1024))
        smem_sm = int(getattr(caps, "max_shared_per_sm", 0) or smem_max + 1024)
        return cls(caps.sm_count, smem_max, smem_sm, str(getattr(caps, "arch", "")) == "sm_90")


@dataclass(frozen=True)
class Plan:
    """One call's plan: what ``execute`` launches and the scratch layout it uses.

    ``merge``: "none" (one split), "last" (the task's last CTA), "kernel" (``is_combine``)
    or "cluster" (warp-specialised, one item per CTA: two-CTA clusters through distributed
    shared memory, four-CTA ones through the partials in L2, eight-CTA ones through
    distributed shared memory again). ``tasks`` counts (batch, query, head block) tasks;
    each has ``splits`` work items of ``cps`` columns. ``cnt_off`` locates the split counters
    in a caller's workspace (the pooled path keeps them apart).
    """

    path: str
    variant: Variant
    entry: str
    threads: int
    heads_per_cta: int
    hbk: int
    units: int
    tasks: int
    splits: int
    cps: int
    lpk: int
    stages: int
    per_sm: int
    merge: str
    smem: int
    grid: int
    part_o_off: int
    part_ml_off: int
    valid_off: int
    cnt_off: int
    nbytes: int
    config: IndexShareConfig = IndexShareConfig()

    @property
    def partials(self) -> bool:
        """Whether the splits write partials to the scratch."""
        return _writes_partials(self.merge, self.variant)

    @property
    def knobs(self) -> dict[str, Any]:
        """The knob values this plan resolved to (``None``: not one of its build's knobs)."""
        d = self.variant.defines
        ws = self.entry == "is_attn_ws"
        wg = self.path == "wg"
        return {"splits": self.splits, "wm": d.get("IS_WM"), "wn": d.get("IS_WN"),
                "stages": self.stages, "merge": self.merge,
                "pipe": d.get("IS_PIPE", 1) if self.path == "mma" else None,
                "wgs": d.get("IS_WGS"), "mrows": d.get("IS_MROWS"),
                "overlap": d.get("IS_OVERLAP", 0) if wg else None,
                "qreg": d.get("IS_QREG", 0) if wg else None,
                "minb": d.get("IS_MINB", 1) if wg else None,
                "ws": int(ws) if wg else None, "ctas": self.grid if ws else None,
                "q2": d.get("IS_Q2", 0) if ws else None,
                "kt": d.get("IS_KT", _WS_KT) if ws else None}


def make_plan(g: Geometry, device: DeviceLimits, *, aligned16: bool, capacity_scratch: bool,
              config: IndexShareConfig = IndexShareConfig()) -> Plan:
    """Path, tiling, split-K, merge and scratch layout of one call.

    Parameters
    ----------
    g
        The call's geometry (:func:`~attnrt.ops.index_share.schema.resolve_geometry`).
    device
        The device's limits.
    aligned16
        Every query/key/value/past/output pointer is 16-byte aligned.
    capacity_scratch
        Reserve the per-batch valid lengths of fixed-capacity mode.
    config
        The caller's pinned choices.

    Returns
    -------
    Plan

    Raises
    ------
    KernelError
        A size overflows the kernels' 32-bit arguments, H cannot be served, a pinned path
        does not apply, or ``config`` asks for an impossible plan.
    """
    _check_int_limits(g)
    c = _Call(g, device, config, aligned16, g.batch * g.q_len * g.kv_heads >= 4 * device.sm_count)
    path = _choose_path(c)
    ws = _choose_ws(c, path)
    if ws:
        t = _ws_tiling(g, config)
    elif path == "wg":
        t = _wg_tiling(g, device, config, c.many)
    elif path == "mma":
        t = _mma_tiling(g, device, config)
    else:
        t = _simt_tiling(g, aligned16)
    shared = g.index_heads == 1
    hbk = -(-g.group // t.hpc) if shared else 1
    units = g.kv_heads * hbk if shared else g.heads
    tasks = g.batch * g.q_len * units
    cap = int(_or(config.ctas, device.sm_count)) if ws else device.sm_count
    if cap < 1:
        raise KernelError(f"{OP}: ctas={cap} must be >= 1")
    splits, cps = _choose_split(c, t, path, ws, tasks, cap)
    if ws and splits > WS_MAX_SPLITS:
        raise KernelError(f"{OP}: ws=1 merges at most {WS_MAX_SPLITS} splits per row; "
                          f"K={g.width} needs {splits} (use ws=0)")
    variant, smem = _build(c, t, path, ws, splits, cps)
    merge, variant, smem = _choose_merge(c, t, ws, splits, cps, tasks, cap, variant, smem)
    grid = tasks * splits
    if ws:  # persistent: at most one CTA per SM (or the ctas knob), each looping over items
        grid = max(1, min(grid, device.sm_count, cap))
    # (ws: the persistent kernel's item arithmetic adds up to a grid of SMs in int32.)
    if tasks * splits > 2**31 - 1 - (device.sm_count if ws else 0):
        raise KernelError(f"{OP}: {tasks * splits} work items exceed the grid limit; use fewer "
                          "(batch, query) rows per call")
    offs = _scratch_layout(g, splits, tasks, merge, variant, capacity_scratch)
    return Plan(path, variant, t.entry, t.threads, t.hpc, hbk, units, tasks, splits, cps, t.lpk,
                t.stages, t.per_sm, merge, smem, grid, *offs, config)


def _check_int_limits(g: Geometry) -> None:
    """The kernels take sizes as 32-bit ints; the frontier kernel's grid.y is the batch."""
    for name, value in (("num_heads", g.heads), ("S_q", g.q_len), ("S_cur", g.cur_len),
                        ("S_past", g.past_len), ("K", g.width), ("head size", g.head_size)):
        if value > 2**31 - 1:
            raise KernelError(f"{OP}: {name}={value} must be < 2**31")
    if g.mode == "capacity" and g.batch > 65535:
        raise KernelError(f"{OP}: fixed-capacity mode supports batch <= 65535, got {g.batch}")


def _mma_ok(g: Geometry) -> bool:
    """The tensor-core paths apply: f16/bf16, H 64 or 128, >= 8 heads on one index row."""
    return (g.dtype in (DataType.FLOAT16, DataType.BFLOAT16) and g.head_size in (64, 128)
            and g.index_heads == 1 and g.group >= 8)


def _wg_ok(g: Geometry) -> bool:
    """The wgmma path applies (a 64-row wgmma tile needs enough heads to fill it)."""
    return _mma_ok(g) and g.group >= WG_MIN_GROUP


def wgmma_available(device: DeviceLimits, config: IndexShareConfig) -> bool:
    """The device runs sm_90a code and the config allows the wgmma path."""
    return device.sm90a and config.wgmma


def _choose_path(c: _Call) -> str:
    """The pinned path (refused where it cannot run), else wgmma > mma.sync > CUDA cores."""
    wg_arch, pin, g = wgmma_available(c.dev, c.cfg), c.cfg.path, c.g
    use_wg = pin == "wg" or (pin is None and wg_arch and c.aligned16 and _wg_ok(g))
    if use_wg and not (wg_arch and c.aligned16 and _wg_ok(g)):
        raise KernelError(f"{OP}: the wgmma path needs an sm_90 device, f16/bf16, H in (64, 128), "
                          f"one shared index head, >= {WG_MIN_GROUP} heads per kv head and "
                          "16-byte aligned tensors")
    if use_wg:
        return "wg"
    use_mma = pin == "mma" or (pin is None and c.aligned16 and _mma_ok(g))
    if use_mma and not (c.aligned16 and _mma_ok(g)):
        raise KernelError(f"{OP}: the tensor-core path needs f16/bf16, H in (64, 128), one "
                          "shared index head, >= 8 heads per kv head and 16-byte aligned tensors")
    return "mma" if use_mma else "simt"


def _choose_ws(c: _Call, path: str) -> int:
    """1 for the warp-specialised build: on the wgmma path from ``WS_MIN_GROUP`` heads per
    index row while its split merge holds the splits and no barrier-coupled knob is pinned
    (see docs/notes/index_share.md#ws-from-64-heads)."""
    cfg = c.cfg
    if path != "wg":
        if cfg.ws not in (None, 0):
            # A pinned ws build must not quietly become another plan (README, Guarantees).
            raise KernelError(f"{OP}: ws={cfg.ws} asks for the warp-specialised build, which "
                              "is on the wgmma path only (sm_90, f16/bf16, H in (64, 128), one "
                              f"shared index head, >= {WG_MIN_GROUP} heads per kv head, 16-byte "
                              f"aligned tensors); this call takes the "
                              f"{'tensor-core' if path == 'mma' else 'CUDA-core'} path")
        ws = 0
    else:
        other = sorted(k for k in _WG_ONLY if getattr(cfg, k) is not None)
        fits = -(-c.g.width // 2048) <= WS_MAX_SPLITS  # its merge holds 8 partials of <= 2048
        ws = int(_or(cfg.ws, 1 if c.g.group >= WS_MIN_GROUP and fits and not other else 0))
        if ws not in (0, 1):
            raise KernelError(f"{OP}: ws={ws} must be 0 or 1")
        if ws and other:
            raise KernelError(f"{OP}: ws=1 (the warp-specialised build) takes only the knobs "
                              f"splits, merge, ctas, q2 and kt; got {other}")
    for name in _WS_ONLY:
        if getattr(cfg, name) is not None and not ws:
            raise KernelError(f"{OP}: {name} applies to the warp-specialised build (ws=1) only")
    return ws


def _scratch_layout(g: Geometry, splits: int, tasks: int, merge: str, variant: Variant,
                    capacity_scratch: bool) -> tuple[int, int, int, int, int]:
    """Offsets of the split partials (O, then m/l), the valid lengths and the split
    counters in one buffer, and its bytes (0 when nothing is needed)."""
    parts = _writes_partials(merge, variant)
    rows = g.batch * g.q_len * g.heads
    po = rows * splits * g.head_size * 4 if parts else 0
    pm = rows * splits * 2 * 4 if parts else 0
    vb = g.batch * 4 if capacity_scratch else 0
    cb = tasks * 4 if merge == "last" else 0
    part_ml_off = _round_up(po, _ALIGN)
    valid_off = _round_up(part_ml_off + pm, _ALIGN)
    cnt_off = _round_up(valid_off + vb, _ALIGN)
    return 0, part_ml_off, valid_off, cnt_off, cnt_off + cb if (po or vb or cb) else 0
