"""IndexShare's planner: the path, tiling, split-K, merge and scratch layout of one call
(``_plan``). ``workspace_requirement`` and ``execute`` share it, so the scratch reserved and
the scratch used agree; it depends only on shapes, dtypes, alignment, the device and the
caller's plan knobs. The rules and the H200 measurements behind them: benchmarks/NOTES.md,
IndexShare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnrt.runtime.api import DataType
from attnrt.runtime.errors import KernelError

from ._common import Variant
from ._index_share_builds import (
    _ALIGN,
    _DEFAULT_PIPE,
    _KT,
    _MAX_STAGES,
    _SIMT_THREADS,
    _WS_KT,
    MMA_LAYOUTS,
    MMA_PIPES,
    PLAN_KNOBS,
    WG_LAYOUTS,
    WG_MIN_GROUP,
    WG_MINB,
    WG_QREG_LAYOUT,
    WS_KTS,
    WS_MAX_SPLITS,
    WS_MIN_GROUP,
    _max_head_size,
    _mma_variant,
    _simt_variant,
    _wg_variant,
    _ws_nst,
    _ws_variant,
)
from ._ref_index_share import OP, Geometry


@dataclass(frozen=True)
class _Plan:
    path: str  # "simt" | "mma" | "wg"
    variant: Variant
    entry: str
    threads: int
    heads_per_cta: int
    hbk: int  # head blocks per kv head (shared index rows)
    units: int
    tasks: int  # (batch, query, head block) tasks; each has `splits` CTAs
    splits: int
    cps: int  # columns per split
    lpk: int  # lanes per key (simt)
    stages: int  # tensor-core ring depth (0 for simt)
    per_sm: int  # CTAs per SM the plan was sized for
    merge: str  # "none" (one split) | "last" (the task's last CTA) | "kernel" (is_combine)
    #             | "cluster" (ws, one item per CTA: two-CTA clusters through distributed
    #               shared memory, four-CTA ones through the partials in L2, eight-CTA
    #               ones through distributed shared memory again)
    smem: int
    grid: int
    part_o_off: int
    part_ml_off: int
    valid_off: int
    cnt_off: int  # split counters (workspace path; the pool path keeps them apart)
    nbytes: int

    @property
    def partials(self) -> bool:
        """Whether the splits write partials to the scratch (every merge but the two- and
        eight-CTA clusters')."""
        return _writes_partials(self.merge, self.variant)

    @property
    def knobs(self) -> dict[str, Any]:
        """The knobs that pin this plan (see ``PLAN_KNOBS``)."""
        d = self.variant.defines
        return {"splits": self.splits, "wm": d.get("IS_WM"), "wn": d.get("IS_WN"),
                "stages": self.stages, "merge": self.merge,
                "pipe": d.get("IS_PIPE", 1) if self.path == "mma" else None,
                "wgs": d.get("IS_WGS"), "mrows": d.get("IS_MROWS"),
                "overlap": d.get("IS_OVERLAP", 0) if self.path == "wg" else None,
                "qreg": d.get("IS_QREG", 0) if self.path == "wg" else None,
                "minb": d.get("IS_MINB", 1) if self.path == "wg" else None,
                "ws": int(self.entry == "is_attn_ws") if self.path == "wg" else None,
                "ctas": self.grid if self.entry == "is_attn_ws" else None,
                "q2": d.get("IS_Q2", 0) if self.entry == "is_attn_ws" else None,
                "kt": d.get("IS_KT", _WS_KT) if self.entry == "is_attn_ws" else None}


def _writes_partials(merge: str, variant: Variant) -> bool:
    """Whether a plan's splits write partials to the scratch: every merge but the cluster
    builds that hand them over through distributed shared memory (the two-CTA one, and the
    four/eight-CTA one built with IS_CMDS; none with one split)."""
    d = variant.defines
    return merge in ("last", "kernel") or (
        merge == "cluster" and "IS_CMERGE" in d and not d.get("IS_CMDS", 0))


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _mma_ok(g: Geometry) -> bool:
    return (g.dtype in (DataType.FLOAT16, DataType.BFLOAT16) and g.head_size in (64, 128)
            and g.index_heads == 1 and g.group >= 8)


def _wg_ok(g: Geometry) -> bool:
    return _mma_ok(g) and g.group >= WG_MIN_GROUP


def _wg_smem(hd: int, wgs: int, mrows: int, stages: int, cps: int, qreg: int = 0) -> int:
    """Dynamic shared memory of is_attn_wg (mirrors the kernel's layout)."""
    kt = 64 * (wgs // (mrows // 64))  # keys per tile
    hb = hd // 64
    q = 0 if qreg else hb * mrows * 128
    return 1024 + q + stages * 2 * hb * kt * 128 + cps * 4


def _ws_smem(hd: int, cps: int, q2: int = 0, cluster: int = 0, kt: int = _WS_KT) -> int:
    """Dynamic shared memory of is_attn_ws (mirrors the kernel's layout).

    ``q2``: two Q slots, no split-merge weights, int32 index slots. ``cluster``: no
    split-merge weights; the cluster merge's inbox (the partner's half of O and its row
    statistics) after the index slots, 128-byte aligned.
    """
    hb = hd // 64
    q = (2 if q2 else 1) * hb * 128 * 128
    ring = 2 * _ws_nst(hd, kt) * hb * kt * 128
    weights = 0 if q2 or cluster else 128 * (WS_MAX_SPLITS + 1) * 4
    fixed = q + ring + 256 + weights + 2 * cps * 4 + 2 * (16 + (4 if q2 else 8) * cps)
    if cluster:
        fixed = _round_up(fixed, 128) + (4 * hb + 1) * 256 * 16
    return 1024 + fixed


def _mma_smem(wm: int, wn: int, stages: int, hd: int, cps: int) -> int:
    """Dynamic shared memory of is_attn_mma (mirrors the kernel's layout)."""
    lds = hd + 8
    q = 16 * wm * lds * 2
    ring = stages * 2 * _KT * lds * 2
    merge = wm * (wn - 1) * (hd // 2 + 4) * 32 * 4 if wn > 1 else 0
    return q + max(ring, merge) + cps * 4


def _default_layout(group: int) -> tuple[int, int]:
    """Warps along heads x along keys: enough 16-head MMA rows for the group, 8 warps."""
    if group <= 16:
        return 1, 4
    if group <= 64:
        return 4, 2
    return 8, 1


def _choose_splits(tasks: int, width: int, col_align: int, max_cps: int, slots: int) -> int:
    """Split count minimising a wave model of the launch (a function of shapes and device).

    Cost, in units of one tile's gather: waves x (tiles per split + 3 tiles of fixed
    per-CTA latency: index staging, pipeline fill, epilogue) + 2 for the split merge.
    Decode rows (few tasks) split until the CTAs fill one wave; prefill rows do not split.
    """
    ntiles = -(-width // col_align)
    best, best_cost = 1, None
    for s in range(1, min(32, ntiles) + 1):
        cps = min(_round_up(-(-width // s), col_align), max_cps)
        real = -(-width // cps)
        if real != s:
            continue
        waves = -(-tasks * s // slots)
        cost = waves * (cps // col_align + 3) + (2 if s > 1 else 0)
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return best


def _ws_exact_cps(width: int, s: int) -> int:
    """Columns per split of a ws plan asked for ``s`` splits (``_plan``'s rounding to whole
    128-key tiles, at most 2048), or 0 where that rounding gives another split count."""
    cps = min(_round_up(-(-width // s), _WS_KT), 2048)
    return cps if -(-width // cps) == s else 0


def _ws_decode_split(tasks: int, width: int, sm_count: int,
                     cap: int | None = None) -> tuple[int, str] | None:
    """(splits, merge) of a warp-specialised decode plan with one item per CTA, or None.

    Measured on the H200 (NOTES, IndexShare round 20; top-k 2048, 64 and 128 heads, B 1-64):
    a split's cost is its rows (a CTA gathers at a fixed rate whatever the load) plus its
    merge, and the last-arrival merge reads every partial on one SM (8 x 64 KB at 128
    heads: ~15 us). So, the first that applies: up to half the SMs busy, up to eight splits
    of >= 2 tiles each, four or eight as four- or eight-CTA clusters that merge their
    partials inside the kernel (IS_CMERGE), five to seven by ``is_combine`` over the whole GPU; four
    splits as four-CTA clusters, up to half the SMs (B 9-16 at 2048 keys); two splits per
    task as two-CTA clusters while they fit in one wave (B <= 66 at one kv head); else None
    (``_ws_persistent_splits`` decides). A split count counts only where the plan's 128-key column split comes
    out at exactly that many; ``cap`` (the ctas knob) caps the CTAs as it caps the grid.
    """
    cap = sm_count if cap is None else cap
    ntiles = -(-width // _WS_KT)

    wide = min(WS_MAX_SPLITS, ntiles // 2)
    for s, bound in ((wide, sm_count // 2), (4, sm_count // 2), (2, sm_count)):
        if (s >= 4 or (s == 2 and ntiles >= 2)) and tasks * s <= min(bound, cap) and _ws_exact_cps(width, s):
            return s, "cluster" if s in (2, 4, 8) else "kernel"
    return None


#: What one split item of a persistent ws plan costs beyond its tiles, in tiles' time: its
#: partials and its share of the split merge (H200 fit, NOTES IndexShare round 21: at 128
#: heads on 33 CTAs, two split items of 8 tiles per CTA took 54.2 us where one item of 16
#: tiles took 37.6).
_WS_SPLIT_ITEM_TILES = 8


def _ws_persistent_splits(tasks: int, width: int, slots: int) -> int:
    """Split count of a warp-specialised decode plan with more items than one per CTA.

    The persistent grid of ``slots`` CTAs takes items c, c + slots, ... in turn, and a CTA
    gathers at a fixed rate whatever the load (NOTES, IndexShare rounds 13 and 20), so a
    launch lasts as long as its busiest CTA: ceil(tasks x s / slots) items of (tiles per
    split + ``_WS_SPLIT_ITEM_TILES`` if s > 1) tiles each. The least such cost over the
    split counts the 128-key column split gives exactly (from the fewest that fit in
    2048-column splits to ``WS_MAX_SPLITS``), fewer splits on a tie. Measured on the H200
    (round 21): one split at top-k 1024 and 2048 (B 67-264; two splits took 1.1-1.9x as
    long), three at top-k 4096 and B 67, two at B 96 and 160.
    """
    lo = -(-width // 2048)
    best, best_cost = lo, None
    for s in range(lo, max(lo, WS_MAX_SPLITS) + 1):
        cps = _ws_exact_cps(width, s)
        if not cps:
            continue
        cost = -(-tasks * s // max(1, slots)) * (cps // _WS_KT
                                                 + (_WS_SPLIT_ITEM_TILES if s > 1 else 0))
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return best


def _plan(g: Geometry, sm_count: int, aligned16: bool, path: str | None,
          capacity_scratch: bool, smem_max: int = 227 * 1024, smem_sm: int = 228 * 1024,
          knobs: dict[str, Any] | None = None, wg_arch: bool = False) -> _Plan:
    """Path, tiling, split-K and scratch layout.

    Raises
    ------
    KernelError
        H cannot be served, the tensor-core path was forced where it does not apply, or
        ``knobs`` ask for an impossible plan.
    """
    for name, value in (("num_heads", g.heads), ("S_q", g.q_len), ("S_cur", g.cur_len),
                        ("S_past", g.past_len), ("K", g.width), ("head size", g.head_size)):
        if value > 2**31 - 1:  # the kernels take these as 32-bit ints
            raise KernelError(f"{OP}: {name}={value} must be < 2**31")
    if g.mode == "capacity" and g.batch > 65535:  # the frontier kernel's grid.y
        raise KernelError(f"{OP}: fixed-capacity mode supports batch <= 65535, got {g.batch}")
    knobs = dict(knobs or {})
    bad = set(knobs) - set(PLAN_KNOBS)
    if bad:
        raise KernelError(f"{OP}: unknown plan knobs {sorted(bad)}; known: {PLAN_KNOBS}")
    h, dt = g.head_size, g.dtype
    use_wg = path == "wg" or (path is None and wg_arch and aligned16 and _wg_ok(g))
    if use_wg and not (wg_arch and aligned16 and _wg_ok(g)):
        raise KernelError(f"{OP}: the wgmma path needs an sm_90 device, f16/bf16, H in (64, 128), "
                          f"one shared index head, >= {WG_MIN_GROUP} heads per kv head and "
                          "16-byte aligned tensors")
    use_mma = not use_wg and (path == "mma" or (path is None and aligned16 and _mma_ok(g)))
    if use_mma and not (aligned16 and _mma_ok(g)):
        raise KernelError(f"{OP}: the tensor-core path needs f16/bf16, H in (64, 128), one "
                          "shared index head, >= 8 heads per kv head and 16-byte aligned tensors")
    if not use_wg and str(knobs.get("ws", 0)) not in ("0", "None"):
        # (A pinned ws build must not quietly become another plan, e.g. for outputs that
        # do not depend on the batch size: README, Guarantees.)
        raise KernelError(f"{OP}: ws={knobs['ws']} asks for the warp-specialised build, which "
                          "is on the wgmma path only (sm_90, f16/bf16, H in (64, 128), one "
                          f"shared index head, >= {WG_MIN_GROUP} heads per kv head, 16-byte "
                          f"aligned tensors); this call takes the "
                          f"{'tensor-core' if use_mma else 'CUDA-core'} path")
    shared = g.index_heads == 1
    stages, per_sm, ws = 0, 1, 0
    many = g.batch * g.q_len * g.kv_heads >= 4 * sm_count  # prefill-like: rows fill the GPU
    if use_wg:
        # Knobs of the barrier-coupled build pin it; its split merge holds 8 partials of
        # at most 2048 columns.
        other = sorted({"wgs", "mrows", "overlap", "qreg", "minb", "stages"} & set(knobs))
        fits = -(-g.width // 2048) <= WS_MAX_SPLITS
        # From 64 heads per index row, in every row count: at 64 heads in decode rows past
        # one wave of two-CTA clusters the ws build with one split took 0.70-0.91x the time
        # of the barrier-coupled key split (H200, B 67-264, NOTES IndexShare round 21).
        wide = g.group >= WS_MIN_GROUP
        ws = int(knobs.get("ws", 1 if wide and fits and not other else 0))
        if ws not in (0, 1):
            raise KernelError(f"{OP}: ws={ws} must be 0 or 1")
        if ws and other:
            raise KernelError(f"{OP}: ws=1 (the warp-specialised build) takes only the knobs "
                              f"splits, merge, ctas, q2 and kt; got {other}")
    for only_ws in ("ctas", "q2", "kt"):
        if only_ws in knobs and not ws:
            raise KernelError(f"{OP}: {only_ws} applies to the warp-specialised build (ws=1) only")
    if use_wg and ws:
        # Warp-specialised and persistent (cuda/index_share_ws.cu): 128 heads per item,
        # 128-key tiles (or 64, knob kt), one CTA per SM looping over the (task, split) items.
        col_align, max_cps = _WS_KT, 2048
        hpc, threads, lpk = 128, 384, 0
        kt = int(knobs.get("kt", _WS_KT))
        if kt not in WS_KTS:
            raise KernelError(f"{OP}: kt={kt} must be one of {WS_KTS}")
        variant, entry = _ws_variant(dt, h), "is_attn_ws"  # (q2 is chosen with the splits)
        stages = _ws_nst(h, kt)
    elif use_wg:
        # Layout and loop (H200 sweeps, benchmarks/NOTES.md). Decode (few rows): groups above
        # 64 heads take one 128-head CTA (two warpgroups), 64-head blocks two warpgroups
        # splitting each tile's keys (one CTA per SM with the deepest ring). Prefill (many
        # rows): one-warpgroup 64-head CTAs, three per SM (below), at every group size (N 128
        # as two head blocks per row: 1.97 vs 2.13 ms for one 128-head CTA).
        mrows = int(knobs.get("mrows", 128 if g.group > 64 and not many else 64))
        wgs = int(knobs.get("wgs", 1 if (many and mrows == 64) else 2))
        if (wgs, mrows) not in WG_LAYOUTS:
            raise KernelError(f"{OP}: wgmma layout (wgs={wgs}, mrows={mrows}) has no build; "
                              f"choose one of {WG_LAYOUTS}")
        col_align, max_cps = 64 * (wgs // (mrows // 64)), 2048
        cps_hi = min(max_cps, _round_up(g.width, col_align))
        # Many rows with one warpgroup: Q in registers, a 2-stage ring and registers capped at
        # 168, so three CTAs share an SM (each one's softmax and waits under the others'
        # wgmma): 1.04 ms at prefill N 64, against 1.27 for two CTAs with 3 stages and the
        # overlapped loop (H200, benchmarks/NOTES.md). Decode keeps the plain loop (Q in
        # registers and the overlapped loop were both slower there).
        one_wg_many = many and (wgs, mrows) == WG_QREG_LAYOUT
        qreg = int(knobs.get("qreg", 1 if one_wg_many else 0))
        if qreg not in (0, 1) or (qreg and (wgs, mrows) != WG_QREG_LAYOUT):
            raise KernelError(f"{OP}: qreg={qreg} must be 0, or 1 with the layout "
                              f"(wgs, mrows) = {WG_QREG_LAYOUT}")
        three = (one_wg_many and qreg == 1 and int(knobs.get("overlap", 0)) == 0
                 and int(knobs.get("stages", 2)) == 2)
        minb = int(knobs.get("minb", 3 if three else 1))
        if minb not in WG_MINB or (minb > 1 and (wgs, qreg) != (1, 1)):
            raise KernelError(f"{OP}: minb={minb} must be one of {WG_MINB} (3 only with one "
                              "warpgroup and qreg=1: two warpgroups cannot fit 168 registers)")
        overlap = int(knobs.get("overlap", 1 if (many and mrows == 128)
                                or (one_wg_many and minb == 1) else 0))
        if overlap not in (0, 1):
            raise KernelError(f"{OP}: overlap={overlap} must be 0 or 1")
        hpc, threads, lpk = mrows, 128 * wgs, 0
        variant, entry = _wg_variant(dt, h, wgs, mrows, overlap, qreg, minb), "is_attn_wg"
        min_st = 3 if overlap else 2  # the overlapped loop waits one tile further ahead
        # One warpgroup: two CTAs per SM where two fit (one's softmax overlaps the other's
        # wgmma), three with the 168-register build; two warpgroups: one CTA with the
        # deepest ring.
        per_sm = minb if minb > 1 else (2 if wgs == 1 else 1)
        while True:
            budget = min(smem_max, smem_sm // per_sm - 1024)
            if "stages" in knobs:
                stages = int(knobs["stages"])
                if not min_st <= stages <= 8:
                    raise KernelError(f"{OP}: stages={stages} must be in [{min_st}, 8]")
            else:
                stages = _MAX_STAGES
                while stages > min_st and _wg_smem(h, wgs, mrows, stages, cps_hi, qreg) > budget:
                    stages -= 1
            if per_sm == 1 or _wg_smem(h, wgs, mrows, stages, cps_hi, qreg) <= budget:
                break
            if minb > 1:
                raise KernelError(f"{OP}: minb={minb} needs {minb} CTAs per SM, but the plan's "
                                  f"{_wg_smem(h, wgs, mrows, stages, cps_hi, qreg)} bytes of "
                                  f"shared memory (stages={stages}) leave room for fewer")
            per_sm = 1
    elif use_mma:
        col_align, max_cps = _KT, 2048
        cps_hi = min(max_cps, _round_up(g.width, col_align))
        if "wm" in knobs or "wn" in knobs:
            wm, wn = _default_layout(g.group)
            wm, wn = int(knobs.get("wm", wm)), int(knobs.get("wn", wn))
            if (wm, wn) not in MMA_LAYOUTS:
                raise KernelError(f"{OP}: tensor-core layout (wm={wm}, wn={wn}) has no build; "
                                  f"choose one of {MMA_LAYOUTS}")
        else:  # the group's layout, or a smaller one where shared memory is short
            first = _default_layout(g.group)
            if first == (4, 2) and g.batch * g.q_len >= 4 * sm_count:
                # Many independent rows (prefill): two 4-warp CTAs per SM with a 2-deep ring
                # beat one 8-warp CTA with a deep ring (H200 sweep, N64 prefill at 8k/64k:
                # 2.21 vs 2.65 ms, 2.11 vs 2.54 ms); decode keeps (4, 2) (0.049 vs 0.052 ms).
                first = (4, 1)
            order = [first, (4, 2), (4, 1), (1, 4)]
            wm, wn = next((c for c in order if _mma_smem(*c, 2, h, cps_hi) <= smem_max),
                          order[0])
        hpc, threads = 16 * wm, 32 * wm * wn
        pipe = int(knobs.get("pipe", _DEFAULT_PIPE))
        if pipe not in MMA_PIPES:
            raise KernelError(f"{OP}: pipe={pipe} must be one of {MMA_PIPES}")
        variant, entry, lpk = _mma_variant(dt, h, wm, wn, pipe), "is_attn_mma", 0
        # Eight warps per SM (the registers allow no more): one 8-warp CTA with the deepest
        # ring that fits, or two 4-warp CTAs sharing the SM's shared memory.
        per_sm = 2 if threads == 128 else 1
        while True:
            budget = min(smem_max, smem_sm // per_sm - 1024)
            if "stages" in knobs:
                stages = int(knobs["stages"])
                if not 2 <= stages <= 8:
                    raise KernelError(f"{OP}: stages={stages} must be in [2, 8]")
            else:
                stages = _MAX_STAGES
                while stages > 2 and _mma_smem(wm, wn, stages, h, cps_hi) > budget:
                    stages -= 1
            if per_sm == 1 or _mma_smem(wm, wn, stages, h, cps_hi) <= budget:
                break
            per_sm = 1
    else:
        wide = 16 // dt.itemsize
        vec = wide if (h % wide == 0 and aligned16) else 1
        nchunks = h // vec
        if vec > 1 and nchunks <= 64:
            cpl = 1 if nchunks <= 32 else 2
        elif vec == 1 and nchunks <= 128:
            cpl = 4
        else:
            raise KernelError(f"{OP}: head size {h} ({dt.name}) needs 16-byte aligned query/"
                              f"key/value/past/output pointers (at most {_max_head_size(dt, h)})")
        lpk = min(32, _pow2_ceil(-(-nchunks // cpl)))
        hpc = 4 if (shared and g.group >= 2) else 1
        variant, entry, threads = _simt_variant(dt, vec, cpl, hpc), "is_attn_simt", _SIMT_THREADS
        col_align, max_cps, per_sm = 32, 4096, 4
    hbk = -(-g.group // hpc) if shared else 1
    units = g.kv_heads * hbk if shared else g.heads
    tasks = g.batch * g.q_len * units
    cap = int(knobs.get("ctas", sm_count)) if ws else sm_count
    if cap < 1:
        raise KernelError(f"{OP}: ctas={cap} must be >= 1")
    # A warp-specialised decode plan (measured rule; the ctas knob caps the CTAs it may use).
    dec = _ws_decode_split(tasks, g.width, sm_count, cap) if ws and not many else None
    if "splits" in knobs:
        # The tensor-core finish keeps nh x (splits + 1) weights in the ring: at most 32.
        splits = max(1, min(int(knobs["splits"]), -(-g.width // col_align),
                            WS_MAX_SPLITS if ws else 32 if (use_mma or use_wg) else 1 << 30))
    elif ws and not many and dec is not None:
        splits = dec[0]
    elif ws and not many:
        splits = _ws_persistent_splits(tasks, g.width, min(sm_count, cap))
    elif use_mma or use_wg:
        splits = _choose_splits(tasks, g.width, col_align, max_cps, max(1, sm_count * per_sm))
        if ws:
            splits = min(splits, WS_MAX_SPLITS)
    else:
        target = sm_count * per_sm
        want = 1 if tasks >= target else -(-target // max(tasks, 1))
        splits = max(min(want, -(-g.width // 256)), -(-g.width // max_cps), 1)
    cps = min(_round_up(-(-g.width // splits), col_align), max_cps)
    splits = -(-g.width // cps)
    if ws and splits > WS_MAX_SPLITS:
        raise KernelError(f"{OP}: ws=1 merges at most {WS_MAX_SPLITS} splits per row; "
                          f"K={g.width} needs {splits} (use ws=0)")
    if ws:
        # Two Q slots (the next item's Q streams in under this one's last tiles) where the
        # shared memory has room for them: one split (no merge weights) and int32 indices.
        q2_smem = _ws_smem(h, cps, 1, 0, kt)
        q2_ok = splits == 1 and g.index_dtype == DataType.INT32 and q2_smem <= smem_max
        q2 = int(knobs.get("q2", 1 if q2_ok else 0))
        if q2 not in (0, 1) or (q2 and not q2_ok):
            raise KernelError(f"{OP}: q2={q2} must be 0, or 1 with one split, int32 indices and "
                              f"{q2_smem} bytes of shared memory")
        variant = _ws_variant(dt, h, q2, 0, kt)
        smem = _ws_smem(h, cps, q2, 0, kt)
        if smem > smem_max:
            raise KernelError(f"{OP}: the warp-specialised plan needs {smem} bytes of shared "
                              f"memory ({cps} columns per split); the device allows {smem_max}")
    elif use_wg:
        smem = _wg_smem(h, wgs, mrows, stages, cps, qreg)
        if smem > smem_max:
            raise KernelError(f"{OP}: the wgmma plan needs {smem} bytes of shared memory "
                              f"(wgs={wgs}, mrows={mrows}, stages={stages}, {cps} columns per "
                              f"split); the device allows {smem_max}")
    elif use_mma:
        smem = _mma_smem(wm, wn, stages, h, cps)
        if smem > smem_max:
            raise KernelError(f"{OP}: the tensor-core plan needs {smem} bytes of shared memory "
                              f"(wm={wm}, wn={wn}, stages={stages}, {cps} columns per split); "
                              f"the device allows {smem_max}. Use fewer heads per kv head or "
                              "the CUDA-core path (path_override='simt')")
    else:
        smem = _round_up(cps, 4) * 4 + (4 * hpc * h + 8 * hpc) * 4
    merge = "none"
    if splits > 1:
        # ws with two splits and one item per CTA (decode): the two CTAs of a task form a
        # cluster and merge through distributed shared memory (no partials, no counter).
        # Hopper SMs come in pairs (TPCs), so up to sm_count CTAs of two-CTA clusters are
        # resident at once; a larger grid would still be correct, in more than one wave.
        # Four or eight splits of one item per CTA (decode at small batches, _ws_decode_split):
        # the task's CTAs form a cluster and merge their partials (IS_CMERGE; eight through
        # distributed shared memory, no partials in global memory; four through L2). Up
        # to half the SMs: GPCs hold whole clusters, and on the H200 sixteen clusters of
        # eight did not all fit at once (B 16: 33 us against 24 with is_combine, round 20).
        ckt = kt if ws else _WS_KT  # (only ws plans define kt; the message below names bytes)
        items = tasks * splits
        cluster_ok = bool(ws and items <= min(sm_count, cap) and (
            (splits == 2 and _ws_smem(h, cps, 0, 1, ckt) <= smem_max)
            or (splits in (4, 8) and items <= sm_count // 2 and ckt == _WS_KT)))
        # ws decode with more than two splits of at most half the SMs' tasks: is_combine
        # spreads the merge over the GPU, where each last-arrival merge reads every partial
        # of its task on one SM while most SMs idle (_ws_decode_split, round 20: 8 x 64 KB,
        # ~15 us). From more tasks on, the last-arrival merges spread over the grid and were
        # the faster (round 21: 0.90-0.97x at top-k 4096, B 67-160, three splits); prefill
        # rows, many and not measured that way, keep them too.
        merge = str(knobs.get("merge", "cluster" if cluster_ok else
                              "kernel" if ws and splits > 2 and not many
                              and tasks <= sm_count // 2 else "last"))
        if merge not in ("last", "kernel", "cluster"):
            raise KernelError(f"{OP}: merge={merge!r} must be 'last', 'kernel' or 'cluster'")
        if merge == "cluster" and not cluster_ok:
            raise KernelError(f"{OP}: merge='cluster' needs the warp-specialised build (ws=1), "
                              f"two splits (one work item per CTA, at most {min(sm_count, cap)}, "
                              f"and {_ws_smem(h, cps, 0, 1, ckt)} bytes of shared memory) or "
                              f"four or eight (128-key tiles, one work item per CTA, at most "
                              f"{min(sm_count // 2, cap)}); this plan has ws={ws}, {splits} "
                              f"splits, {items} items, a device limit of {smem_max}")
        if merge == "cluster" and splits in (4, 8):  # (the ws smem of its split plan, above)
            variant = _ws_variant(dt, h, 0, splits, kt)
        elif merge == "cluster":  # (ws: kt and its stages as chosen above)
            variant = _ws_variant(dt, h, 0, 1, kt)
            smem = _ws_smem(h, cps, 0, 1, kt)
    grid = tasks * splits
    if ws:  # persistent: at most one CTA per SM (or the ctas knob), each looping over items
        grid = max(1, min(grid, sm_count, cap))
    # (ws: the persistent kernel's item arithmetic adds up to a grid of SMs in int32.)
    if tasks * splits > 2**31 - 1 - (sm_count if ws else 0):
        raise KernelError(f"{OP}: {tasks * splits} work items exceed the grid limit; use fewer "
                          "(batch, query) rows per call")
    rows = g.batch * g.q_len * g.heads
    parts = _writes_partials(merge, variant)
    po = rows * splits * h * 4 if parts else 0
    pm = rows * splits * 2 * 4 if parts else 0
    vb = g.batch * 4 if capacity_scratch else 0
    cb = tasks * 4 if merge == "last" else 0
    part_ml_off = _round_up(po, _ALIGN)
    valid_off = _round_up(part_ml_off + pm, _ALIGN)
    cnt_off = _round_up(valid_off + vb, _ALIGN)
    nbytes = cnt_off + cb if (po or vb or cb) else 0
    return _Plan("wg" if use_wg else "mma" if use_mma else "simt", variant, entry, threads, hpc,
                 hbk, units, tasks, splits, cps, lpk, stages, per_sm, merge, smem, grid, 0,
                 part_ml_off, valid_off, cnt_off, nbytes)
