"""PagedAttention split planning without a GPU: the busy-row-block split rule against the
previous rule (an independent copy of its formula), the rows the gap study names, and a
model of how the latent kernels map a split to its keys (``paged_common.cuh``:
``mla_rows`` and ``split_tiles``) run over thousands of seeded shapes.

The rule: docs/notes/paged_attention.md#busy-row-blocks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnrt.ops.paged_attention import PagedAttentionConfig, PagedAttentionKernel
from attnrt.ops.paged_attention import plan as pp
from attnrt.ops.paged_attention.schema import PagedGeometry
from attnrt.runtime.api import DataType, TensorMetadata
from tests.test_paged_cpu import make_node

BF16, I32 = DataType.BFLOAT16, DataType.INT32
M = 64  # (token, head) rows of one CTA in both latent kernels
H200 = pp.DEFAULT_DEVICE


# ----------------------------------------------------------------------- the previous rule

def old_choose(row_blocks: int, tiles: int, sm: int, rows: int, vhs: int, cap: int,
               c: pp.SplitCost, cfg: PagedAttentionConfig, lo: int = 1) -> int:
    """The previous planner's cost model, copied: the first s >= lo of least modelled time."""
    best, best_cost = lo, math.inf
    for s in range(lo, max(1, min(cap, tiles)) + 1):
        waves = -(-row_blocks * s // max(1, sm))
        per_cta = -(-tiles // s) * c.tile_us + c.prologue_us + (c.partial_us if s > 1 else 0.0)
        cost = waves * per_cta + ((cfg.combine_launch_us + rows * s * vhs * 4
                                   / cfg.combine_bytes_per_us) if s > 1 else 0.0)
        if cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best


def old_auto(g: PagedGeometry, window: int, path: str, bn: int, meta: np.ndarray | None = None,
             busy: bool = False) -> int:
    """The previous ``_auto_splits`` (shapes, or shapes and host metadata), copied; with
    ``busy`` the rule's oracle: busy row blocks R = min(grid_x, B ceil(max_q H / 64),
    T ceil(H / 64)), the least cost over s >= the previous pick."""
    cfg = PagedAttentionConfig()
    max_q, max_kv = g.tokens, g.max_blocks * g.block_size
    if meta is not None:
        max_q, max_kv = min(max_q, int(meta[0])), min(max_kv, int(meta[1]))
    span = max_kv if window < 0 else min(max_kv, window + max_q)
    tiles = -(-max(span, 1) // bn) + (1 if window >= 0 else 0)
    grid_x = g.tokens * g.heads // M + (g.batch if g.heads % M else 0)
    row_blocks = min(grid_x, g.batch * -(-max(max_q, 1) * g.heads // M))
    rows = min(g.tokens, g.batch * max(max_q, 1)) * g.heads
    args = (tiles, H200.sm_count, rows, g.v_head_size, cfg.max_splits, cfg.split_cost(path), cfg)
    old = old_choose(row_blocks, *args)
    if not busy:
        return old
    return old_choose(min(row_blocks, g.tokens * -(-g.heads // M)), *args, lo=old)


# ----------------------------------------------------------------------- seeded shapes

def geometry(q: np.ndarray, lengths: np.ndarray, H: int, bs: int, spare_blocks: int = 0) -> PagedGeometry:
    mb = int(-(-int(lengths.max()) // bs)) + spare_blocks
    return PagedGeometry(BF16, int(q.sum()), H, 576, 512, len(q), len(q) * mb, bs, mb, 0, 0, 0.1)


def seeded_shapes(n: int, seed: int):
    """(q, lengths, H, block size, window) of ``n`` seeded calls: B 1-200, H 16-128, lengths
    of 1, 63-65, block boundaries, random, or ragged with one sequence 100x the others."""
    rng = np.random.default_rng(seed)
    edges = np.array([1, 2, 63, 64, 65, 127, 128, 129, 191, 192, 193, 1023, 1024, 1025, 4096, 4097])
    for _ in range(n):
        B = int(rng.choice([1, 2, 3, 7, 8, 31, 32, 33, 64, 128, 200])) if rng.random() < 0.5 \
            else int(rng.integers(1, 201))
        H = int(rng.choice([16, 32, 64, 128]))
        bs = int(rng.choice([16, 32, 64, 128]))
        kind = rng.integers(4)
        if kind == 0:
            lengths = rng.choice(edges, size=B)
        elif kind == 1:
            lengths = np.full(B, int(rng.choice(edges)))
        elif kind == 2:
            lengths = rng.integers(1, 9000, size=B)
        else:  # ragged: one sequence 100x longer than the rest
            base = int(rng.integers(1, 400))
            lengths = np.full(B, base)
            lengths[rng.integers(B)] = 100 * base
        lengths = lengths.astype(np.int64)
        if rng.random() < 0.7:
            q = np.ones(B, dtype=np.int64)  # decode
        else:  # several new tokens, some sequences none
            q = np.minimum(rng.integers(0, 6, size=B), lengths)
            q[rng.integers(B)] = min(int(lengths.max()), int(rng.integers(1, 9)))
            lengths = np.maximum(lengths, q)
        window = -1 if rng.random() < 0.8 else int(rng.choice([0, 1, 63, 64, 100, 1000]))
        yield q, lengths, H, bs, window


# ----------------------------------------------------------------------- the kernel's mapping

def kernel_model(q: np.ndarray, lengths: np.ndarray, H: int, window: int, g: PagedGeometry,
                 p: pp.PagedPlan) -> dict:
    """What every CTA (x, split) of the latent read kernel reads and writes, from
    ``mla_rows`` (row block -> sequence, rows, key range) and ``split_tiles``."""
    B, S, bn = len(q), p.splits, p.block_n
    cu = np.concatenate([[0], np.cumsum(q)])
    extra = 1 if H % M else 0
    G = cu * H // M + extra * np.arange(B + 1)  # G(b) = floor(cu[b] H / 64) + (H % 64 ? b : 0)
    assert G[-1] == p.grid_x
    x = np.arange(p.grid_x)
    b = np.searchsorted(G, x, side="right") - 1  # the one b with G(b) <= x < G(b+1)
    assert np.all((G[b] <= x) & (x < G[b + 1]))
    r = (x - G[b])[:, None] * M + np.arange(M)[None, :]  # the CTA's rows within its sequence
    valid = r < (q[b] * H)[:, None]
    pos = (lengths - q)[b][:, None] + r // H
    pcap = np.minimum(pos, g.max_blocks * g.block_size)
    lo = np.maximum(0, pcap - window) if window >= 0 else np.zeros_like(pcap)
    busy = valid.any(axis=1)
    klo = np.where(valid, lo, np.iinfo(np.int64).max).min(axis=1)
    khi = np.where(valid, pcap, -1).max(axis=1)
    t_lo, t_hi = klo // bn, khi // bn
    chunk = (t_hi - t_lo + 1 + S - 1) // S
    begin = t_lo[:, None] + np.arange(S)[None, :] * chunk[:, None]
    n = np.maximum(0, np.minimum(begin + chunk[:, None], t_hi[:, None] + 1) - begin)
    n[~busy] = 0
    orow = np.where(valid, cu[b][:, None] * H + r, -1)
    return dict(b=b, busy=busy, valid=valid, lo=lo, p=pcap, t_lo=t_lo, t_hi=t_hi, begin=begin,
                n=n, orow=orow)


def check_plan(q: np.ndarray, lengths: np.ndarray, H: int, window: int, g: PagedGeometry,
               p: pp.PagedPlan) -> None:
    k = kernel_model(q, lengths, H, window, g, p)
    busy, n, begin = k["busy"], k["n"], k["begin"]
    # The rule's premise: the non-empty row blocks are at most T ceil(H / 64) (and the grid).
    assert busy.sum() <= min(p.grid_x, g.tokens * -(-H // M))
    # Each (token, head) row is owned by exactly one CTA column: the combine merges them all.
    rows = k["orow"][k["valid"]]
    assert np.array_equal(np.sort(rows), np.arange(g.tokens * H))
    if p.balanced and p.part_ctas:  # the pair kernel's partition: test_paged_balanced_cpu.py
        lanes = p.part_lanes
        assert lanes == -(-H // M) and p.part_ctas == H200.sm_count // lanes * lanes
        lse_off, cnt_off, total = pp.partition_layout(
            g.tokens * H, g.v_head_size, (p.grid_x + p.part_ctas // lanes) * lanes)
        assert (p.ws_lse_offset, p.ws_cnt_offset, p.ws_bytes) == (lse_off, cnt_off, total)
        assert p.max_chunks == p.part_ctas
        return
    if p.balanced:  # chunks are chosen on the device: tests/test_paged_balanced_cpu.py
        assert p.max_chunks >= p.splits > 1
        lse_off, total = pp.workspace_layout(g.tokens * H, g.v_head_size, p.max_chunks, True)
        assert (p.ws_lse_offset, p.ws_bytes) == (lse_off, total)
        assert p.ws_cnt_offset == pp.counts_offset(g.tokens * H, g.v_head_size, p.max_chunks)
        return
    assert p.max_chunks == p.splits
    # Per row block: the splits' tile ranges are disjoint, in key order (split s owns tiles
    # t_lo + s chunk ...), inside [t_lo, t_hi] and cover it: every key tile exactly once.
    tb, th = k["t_lo"][busy], k["t_hi"][busy]
    assert np.array_equal(n[busy].sum(axis=1), th - tb + 1)
    nb, bb = n[busy], begin[busy]
    assert np.all((bb + nb)[:, :-1] <= bb[:, 1:])
    assert np.all((nb == 0) | ((bb >= tb[:, None]) & (bb + nb - 1 <= th[:, None])))
    # Every key a row needs lies in its row block's tiles; each sequence's last token reads
    # its last key, so all of a sequence's key tiles are read (without a window, from 0).
    need_lo = np.where(k["valid"], k["lo"] // p.block_n, np.iinfo(np.int64).max).min(axis=1)
    need_hi = np.where(k["valid"], k["p"] // p.block_n, -1).max(axis=1)
    assert np.all(need_lo[busy] >= tb) and np.all(need_hi[busy] <= th)
    for s in np.flatnonzero(q > 0)[:: max(1, len(q) // 16)]:
        mine = busy & (k["b"] == s)
        assert k["t_hi"][mine].max() == (lengths[s] - 1) // p.block_n
        assert window >= 0 or k["t_lo"][mine].min() == 0
    # Workspace: slot (row, split) for every row and split, within the shared layout.
    lse_off, total = pp.workspace_layout(g.tokens * H, g.v_head_size, p.splits)
    assert (p.ws_lse_offset, p.ws_bytes) == (lse_off, total)
    if p.splits > 1:
        assert lse_off >= g.tokens * H * p.splits * g.v_head_size * 4
        assert total == lse_off + g.tokens * H * p.splits * 4


# ----------------------------------------------------------------------- tests

@pytest.mark.parametrize("path", ["wg", "mla"])
def test_rule_never_picks_fewer_splits_than_the_previous_rule(path):
    cfg, changed = PagedAttentionConfig(path=path), 0
    for i, (q, lengths, H, bs, window) in enumerate(seeded_shapes(1500, seed=39 + (path == "mla"))):
        g = geometry(q, lengths, H, bs, spare_blocks=i % 3)
        metas = [None, np.array([int(q.max()), int(lengths.max())]),
                 np.array([int(q.max()), int(lengths.max()) // 2 + 1])]
        for meta in metas:
            p = pp.plan_launch(g, window, H200, cfg, meta)
            old = old_auto(g, window, path, p.block_n)
            if meta is not None:
                old = min(old, old_auto(g, window, path, p.block_n, meta))
            assert p.splits >= old, (q, lengths, H, window, meta)
            want = old_auto(g, window, path, p.block_n, busy=True)
            if meta is not None:
                want = min(want, old_auto(g, window, path, p.block_n, meta, busy=True))
            assert p.splits == want
            if H % M == 0:  # no spare row block: the plan is the previous one
                assert p.splits == old
            changed += p.splits != old
    assert changed > 50  # the grid reaches the rows the rule is for


# The rows of the gap study (tools/bench.py paged, no attention_metadata, H200, wgmma path):
# (B, H, key tiles of the longest sequence, previous splits, new splits).
STUDY_ROWS = [
    (8, 16, 64, 13, 16), (8, 32, 64, 11, 16), (32, 16, 64, 3, 4), (32, 32, 64, 5, 8),
    (8, 16, 128, 13, 16), (8, 32, 128, 11, 16), (32, 16, 128, 3, 4), (32, 32, 128, 8, 8),
    (8, 16, 512, 13, 16), (8, 32, 512, 11, 16), (32, 16, 512, 13, 16), (32, 32, 512, 11, 12),
    (128, 16, 64, 4, 4), (128, 32, 64, 2, 2), (128, 16, 512, 4, 4), (128, 32, 512, 2, 2),
    (8, 64, 128, 16, 16), (32, 64, 128, 4, 4), (8, 128, 512, 8, 8), (32, 128, 512, 2, 2),
    # ragged L 1024-16384 (longest sequence 227 / 253 / 255 tiles at B 8 / 32 / 128)
    (8, 16, 227, 13, 16), (8, 32, 227, 11, 16), (32, 16, 253, 3, 4), (32, 32, 253, 11, 12),
    (128, 16, 255, 4, 4), (128, 32, 255, 2, 2),
]


@pytest.mark.parametrize("B,H,tiles,before,after", STUDY_ROWS)
def test_study_rows_split_as_predicted(B, H, tiles, before, after):
    g = PagedGeometry(BF16, B, H, 576, 512, B, B * tiles, 64, tiles, 0, 0, 0.1)
    p = pp.plan_launch(g, -1, H200, PagedAttentionConfig())
    assert p.path == "wg"
    assert old_auto(g, -1, "wg", 64) == before
    assert p.splits == after
    assert p.ws_bytes == pp.workspace_layout(B * H, 512, after)[1]
    b = pp.plan_launch(g, -1, H200, PagedAttentionConfig(balanced=True, wg_schedule="serial"))
    assert b.balanced and b.splits == after and b.max_chunks == min(2 * after, 64)
    assert b.ws_bytes == pp.workspace_layout(B * H, 512, b.max_chunks, counts=True)[1]
    # The pair kernel's partition: one CTA per SM, slots for every row block and CTA.
    c = pp.plan_launch(g, -1, H200, PagedAttentionConfig(balanced=True))
    lanes = -(-H // M)
    assert c.balanced and c.part_ctas == c.max_chunks == 132 // lanes * lanes
    assert c.part_lanes == lanes
    assert c.ws_bytes == pp.partition_layout(B * H, 512, (c.grid_x + 132 // lanes) * lanes)[2]
    # One busy CTA per sequence and split: B8 fills 128 of 132 SMs, B32 H16 L4k one wave.
    if (B, after) in ((8, 16), (32, 4)):
        assert B * after == 128


def metas_for(q: np.ndarray, H: int, bs: int, mb: int) -> list:
    T, B = int(q.sum()), len(q)
    m: list = [None] * 17
    m[0] = TensorMetadata(BF16, (T, H * 576))
    m[1] = TensorMetadata(BF16, (T, 576))
    m[3] = TensorMetadata(BF16, (B * mb, bs, 1, 576))
    m[5] = TensorMetadata(I32, (B + 1,))
    m[6] = TensorMetadata(I32, (B,))
    m[7] = TensorMetadata(I32, (B, mb))
    m[10] = TensorMetadata(I32, (T,))
    return m


def test_workspace_follows_the_new_split_count():
    # B32 H16 L8k: 3 -> 4 splits, the requirement (shapes only) and the plan agree.
    k = PagedAttentionKernel(None, make_node(16, vhs=512, scale=0.07))
    m = metas_for(np.ones(32, dtype=np.int64), 16, 64, 128)
    p = k.plan(m)
    assert p.splits == 4 and k.workspace_requirement(m).nbytes == p.ws_bytes
    assert p.ws_bytes == pp.workspace_layout(32 * 16, 512, 4)[1] > pp.workspace_layout(32 * 16, 512, 3)[1]
    # Host metadata may only lower the count, so the shapes-only workspace still suffices.
    m[16] = np.array([1, 8192], dtype=np.int32)
    assert k.plan(m).splits == 4
    m[16] = np.array([1, 64], dtype=np.int32)  # one key tile: unsplit
    assert (k.plan(m).splits, k.plan(m).ws_bytes) == (1, 0)


@pytest.mark.parametrize("path", ["wg", "mla"])
def test_splits_cover_every_key_tile_once_over_seeded_shapes(path):
    cfg = PagedAttentionConfig(path=path)
    kernels: dict[tuple[int, int], PagedAttentionKernel] = {}
    for i, (q, lengths, H, bs, window) in enumerate(seeded_shapes(2000, seed=7 + (path == "mla"))):
        g = geometry(q, lengths, H, bs, spare_blocks=i % 2)
        p = pp.plan_launch(g, window, H200, cfg)
        # A pure function of shapes: the same plan again, from a fresh config too.
        assert p == pp.plan_launch(g, window, H200, PagedAttentionConfig(path=path))
        if g.tokens == 0:
            assert p.path == "none"
            continue
        check_plan(q, lengths, H, window, g, p)
        if i % 25 == 0:  # through the kernel: validation, plan and workspace from metadata
            key = (H, window)
            if key not in kernels:
                kernels[key] = PagedAttentionKernel(None, make_node(H, vhs=512, scale=0.07,
                                                                    window=window), config=cfg)
            m = metas_for(q, H, bs, g.max_blocks)
            assert kernels[key].plan(m) == p == kernels[key].plan(m)
            assert kernels[key].workspace_requirement(m).nbytes == p.ws_bytes


def _merge(q, lengths, H, window, g, p, rng):
    """Per-split partials from random scores, merged as ``paged_mla_combine`` does (splits
    0, 1, ... in order); returns (merged, direct softmax) per row, float64."""
    k = kernel_model(q, lengths, H, window, g, p)
    bn, out, want = p.block_n, {}, {}
    for x in np.flatnonzero(k["busy"]):
        for j in np.flatnonzero(k["valid"][x]):
            lo, hi, row = int(k["lo"][x, j]), int(k["p"][x, j]), int(k["orow"][x, j])
            s = rng.standard_normal(hi + 1) * 3
            v = rng.standard_normal((hi + 1, 3))
            lse, o = [], []
            for sp in range(p.splits):
                keys = np.arange(k["begin"][x, sp] * bn, (k["begin"][x, sp] + k["n"][x, sp]) * bn)
                keys = keys[(keys >= lo) & (keys <= hi)]
                if keys.size == 0:  # an empty split writes lse = -inf and zeros
                    lse.append(-np.inf)
                    o.append(np.zeros(3))
                    continue
                m = s[keys].max()
                e = np.exp2(s[keys] - m)
                lse.append(m + np.log2(e.sum()))
                o.append(e @ v[keys] / e.sum())
            mx = max(lse)
            w = np.exp2(np.array(lse) - mx)
            out[row] = sum(w[i] / w.sum() * o[i] for i in range(p.splits))
            e = np.exp2(s[lo:] - s[lo:].max())
            want[row] = e @ v[lo:] / e.sum()
    return out, want


def test_merging_the_splits_in_order_is_the_softmax_over_all_keys():
    rng = np.random.default_rng(1234)
    done = 0
    for q, lengths, H, bs, window in seeded_shapes(400, seed=99):
        if q.sum() * H > 256 or lengths.max() > 3000:
            continue
        g = geometry(q, lengths, H, bs)
        for splits in (None, 3):
            p = pp.plan_launch(g, window, H200, PagedAttentionConfig(path="wg", num_splits=splits))
            out, want = _merge(q, lengths, H, window, g, p, rng)
            assert sorted(out) == list(range(g.tokens * H))
            for row in out:
                np.testing.assert_allclose(out[row], want[row], rtol=1e-12, atol=1e-12)
        done += 1
    assert done >= 20


def test_lab_script_tables_the_bench_rows(capsys):
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sys.path[:0] = [str(root / "lab"), str(root / "tools")]
    try:
        import paged_split_rule
    finally:
        del sys.path[:2]
    assert paged_split_rule.main(["--path", "wg"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| decode")
            or r.startswith("| ragged") or r.startswith("| spec") or r.startswith("| prefill")]
    assert len(rows) == 78
    assert sum("**" in r for r in rows) == 15
    assert any(r.startswith("| decode bf16 B32 H32 L4096 ") and "**5 -> 8**" in r for r in rows)
