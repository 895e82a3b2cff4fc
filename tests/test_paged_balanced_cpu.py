"""Balanced split-KV of the wgmma MLA kernels without a GPU (docs/notes/paged_attention.md#balanced-splits,
#contiguous-partition).

``balanced`` below transcribes ``pa::balanced_sched`` (``cuda/paged_common.cuh``, the serial
kernel): from the lengths the kernel reads on the device, one chunk length for the launch,
each sequence's chunk count, and the (row block, chunk) each CTA of the grid takes.
``partition`` transcribes ``pa::part_begin`` / ``pa::part_next`` (the pair kernel): the
contiguous ranges of the (row block, tile) line, one per CTA, and the row blocks each walks.
Over thousands of seeded batches (the planner's own plans): every key tile of every busy row
block is read by exactly one CTA, chunk counts stay within the plan's ``max_chunks`` (the
workspace stride), a row's chunks are its workspace slots 0 .. k - 1 in key order (the
combine's fixed merge order), and the schedule is a pure function of (lengths, shapes). For
equal lengths the serial kernel's device model picks what the host's cost model picks for
the same row blocks.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnrt.ops.paged_attention import PagedAttentionConfig
from attnrt.ops.paged_attention import plan as pp
from tests.test_paged_plan_cpu import H200, M, geometry, kernel_model, seeded_shapes


def balanced(q: np.ndarray, lengths: np.ndarray, H: int, window: int, key_cap: int, bn: int,
             max_chunks: int, grid_x: int, cfg: PagedAttentionConfig,
             sms: int = H200.sm_count, vhs: int = 512) -> dict:
    """The device schedule: chunk length, per-sequence counts, and per CTA (x, j, tiles)."""
    q = np.asarray(q, dtype=np.int64)
    past = np.asarray(lengths, dtype=np.int64) - q
    B = len(q)
    cu = np.concatenate([[0], np.cumsum(q)])
    n, rb, t0 = np.zeros(B, np.int64), np.zeros(B, np.int64), np.zeros(B, np.int64)
    for b in range(B):
        if q[b] == 0:
            continue
        rb[b] = -(-q[b] * H // M)
        hi = min(past[b] + q[b] - 1, key_cap)
        lo = max(0, min(past[b], key_cap) - window) if window >= 0 else 0
        if hi >= 0 and hi >= lo:
            t0[b] = lo // bn
            n[b] = hi // bn - t0[b] + 1
    n_max = int(n.max(initial=0))

    def counts(C: int) -> np.ndarray:
        return np.where(n > 0, -(-n // max(C, 1)), np.where(rb > 0, 1, 0))

    c = cfg.wg_cost
    best, best_cost = 1, None
    for s in range(1, max(1, min(max_chunks, n_max)) + 1):
        C = -(-n_max // s)
        k = counts(C)
        busy, prow = int(np.sum(rb * k)), int(np.sum(np.where(k > 1, q * H * k, 0)))
        cost = -(-busy // sms) * (C * c.tile_us + c.prologue_us + (c.partial_us if s > 1 else 0))
        if s > 1:
            cost += cfg.combine_launch_us + prow * vhs * 4 / cfg.combine_bytes_per_us
        if best_cost is None or cost < best_cost - 1e-3:  # as the device: smallest of ties
            best, best_cost = s, cost
    C = -(-n_max // best) if n_max > 0 else 1
    k = counts(C)
    pre = np.concatenate([[0], np.cumsum(rb * k)])
    extra = 1 if H % M else 0
    ctas = []
    for i in range(grid_x * max_chunks):
        if i >= pre[-1]:
            break  # the rest exit at once
        b = int(np.searchsorted(pre, i, side="right") - 1)
        local = i - int(pre[b])
        x = int(cu[b] * H // M + extra * b) + local // int(k[b])
        j = local % int(k[b])
        ctas.append((x, j, int(k[b]), int(t0[b] + j * C), int(t0[b] + (j + 1) * C)))
    return dict(pick=best, C=C, k=k, rb=rb, ctas=ctas)


def check(q, lengths, H, window, g, p, cfg) -> dict:
    assert p.balanced and p.max_chunks >= p.splits > 1
    s = balanced(q, lengths, H, window, g.max_blocks * g.block_size, p.block_n, p.max_chunks,
                 p.grid_x, cfg)
    km = kernel_model(q, lengths, H, window, g, p)  # mla_rows: each row block's exact tiles
    assert len(s["ctas"]) <= p.grid_x * p.max_chunks
    assert int(s["k"].max(initial=1)) <= p.max_chunks
    seen: dict[int, list] = {}
    for x, j, k, a, e in s["ctas"]:
        seen.setdefault(x, []).append((j, k, a, e))
    for x in range(p.grid_x):
        got = sorted(seen.get(x, []))
        if not km["busy"][x]:
            continue  # the spare row block of H % 64 != 0 gets no CTA (nor needs one)
        ks = {k for _, k, _, _ in got}
        assert len(ks) == 1 and [j for j, _, _, _ in got] == list(range(ks.pop()))
        tiles = []
        for _, _, a, e in got:  # chunk j of x in key order: the kernel's tile range
            lo, hi = max(a, km["t_lo"][x]), min(e, km["t_hi"][x] + 1)
            tiles += list(range(lo, max(lo, hi)))
        assert tiles == list(range(km["t_lo"][x], km["t_hi"][x] + 1)), (x, got)
    # Only busy row blocks get CTAs.
    assert all(km["busy"][x] for x in seen)
    return s


def shape_of(q, lengths, H, window, key_cap, bn):
    """``SeqArgs::shape`` of every sequence: (row blocks, tiles n, first tile t0, first x)."""
    q = np.asarray(q, dtype=np.int64)
    past = np.asarray(lengths, dtype=np.int64) - q
    B = len(q)
    cu = np.concatenate([[0], np.cumsum(q)])
    extra = 1 if H % M else 0
    out = []
    for b in range(B):
        rb = n = t0 = 0
        if q[b] > 0:
            rb = -(-int(q[b]) * H // M)
            hi = min(int(past[b] + q[b] - 1), key_cap)
            lo = max(0, min(int(past[b]), key_cap) - window) if window >= 0 else 0
            if hi >= 0 and hi >= lo:
                t0 = lo // bn
                n = hi // bn - t0 + 1
        out.append((rb, n, t0, int(cu[b] * H // M + extra * b)))
    return out


def partition(q, lengths, H, window, key_cap, bn, G, ovh, lanes=1) -> dict:
    """The pair kernel's device schedule: per CTA its lane, part and walked
    (x, j, k, t_lo, t_end)."""
    shapes = shape_of(q, lengths, H, window, key_cap, bn)
    B, P = len(shapes), G // lanes
    ctas, parts = [], []
    for c in range(G):
        lane, pt = c % lanes, c // lanes
        widths = [(-(-(rb - lane) // lanes) if rb > lane else 0) * (ovh + max(n, 1))
                  for rb, n, _, _ in shapes]
        pre = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
        W = int(pre[-1])
        C = max(-(-W // P), 1)
        parts.append((lane, pt))
        a = min(pt * C, W)
        e = min(a + C, W)
        units = []
        if a < W:
            b = int(np.searchsorted(pre[:B], a, side="right") - 1)
            rb, n, t0, x0 = shapes[b]
            w = ovh + max(n, 1)
            k = (a - int(pre[b])) // w
            j, start = lane + k * lanes, int(pre[b]) + k * w
            while b < B and start < e:
                if j >= rb:
                    b, j = b + 1, lane
                    if b < B:
                        rb, n, t0, x0 = shapes[b]
                    continue
                m = max(n, 1)
                T = start + ovh
                if T >= e:
                    break
                lo, hi, first = max(a, T), min(e, T + m), T // C
                units.append((x0 + j, pt - first, (T + m - 1) // C - first + 1,
                              t0 + lo - T, t0 + hi - T))
                start += ovh + m
                j += lanes
        ctas.append(units)
    return dict(ctas=ctas, parts=parts)


def check_partition(q, lengths, H, window, g, p, cfg) -> dict:
    G, lanes = p.part_ctas, p.part_lanes
    assert p.balanced and G > 0 and p.max_chunks == G and G % lanes == 0
    slots = (p.grid_x + G // lanes) * lanes
    lse_off, cnt_off, total = pp.partition_layout(g.tokens * H, g.v_head_size, slots)
    assert (p.ws_lse_offset, p.ws_cnt_offset, p.ws_bytes) == (lse_off, cnt_off, total)
    s = partition(q, lengths, H, window, g.max_blocks * g.block_size, p.block_n, G,
                  pp.partition_overhead(cfg), lanes)
    km = kernel_model(q, lengths, H, window, g, p)
    seen: dict[int, list] = {}
    taken = set()
    for (lane, pt), units in zip(s["parts"], s["ctas"]):
        xs = [u[0] for u in units]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)  # a CTA walks row blocks in order
        for x, j, k, a, e in units:
            assert 0 <= j < k <= G and a < e
            seen.setdefault(x, []).append((j, k, a, e))
            # The partials' slot (x + part) * lanes + lane: unique and within the workspace;
            # chunk j of a row block at its first slot + j * lanes (the combine's stride).
            slot = (x + pt) * lanes + lane
            assert slot not in taken and 0 <= slot < slots
            taken.add(slot)
            seen[x][-1] += (slot - j * lanes,)
    for x in range(p.grid_x):
        got = seen.get(x, [])
        if not km["busy"][x]:
            assert not got
            continue
        # The chunks 0 .. k - 1 (the combine's slots) in key order, from consecutive CTAs.
        ks = {u[1] for u in got}
        assert len(ks) == 1 and [u[0] for u in got] == list(range(ks.pop())), (x, got)
        assert len({u[4] for u in got}) == 1  # one first slot for every chunk
        tiles = []
        for _, _, a, e, _ in got:
            lo, hi = max(a, km["t_lo"][x]), min(e, km["t_hi"][x] + 1)  # pa::pair_tiles
            tiles += list(range(lo, max(lo, hi)))
        assert tiles == list(range(km["t_lo"][x], km["t_hi"][x] + 1)), (x, got)
    return s


def test_every_tile_once_over_seeded_shapes():
    cfg, n_bal, n_split = PagedAttentionConfig(path="wg", balanced=True), 0, 0
    serial = PagedAttentionConfig(path="wg", balanced=True, wg_schedule="serial")
    n_part = n_multi = n_cut = 0
    for i, (q, lengths, H, bs, window) in enumerate(seeded_shapes(1500, seed=11)):
        g = geometry(q, lengths, H, bs, spare_blocks=i % 2)
        for c in (cfg, serial):
            p = pp.plan_launch(g, window, H200, c)
            if not p.balanced:
                continue
            if pp.wg_schedule(g, c) == "pair":
                s = check_partition(q, lengths, H, window, g, p, c)
                n_part += 1
                n_multi += max(len(u) for u in s["ctas"]) > 1
                n_cut += any(u[2] > 1 for units in s["ctas"] for u in units)
                continue
            s = check(q, lengths, H, window, g, p, c)
            # A pure function of the lengths and shapes.
            again = balanced(q, lengths, H, window, g.max_blocks * g.block_size, p.block_n,
                             p.max_chunks, p.grid_x, c)
            assert (s["ctas"], s["C"]) == (again["ctas"], again["C"])
            n_bal += 1
            n_split += int(s["k"].max()) > 1
    assert n_bal > 300 and n_split > 100  # the grid reaches balanced, split launches
    # ... and partitions where CTAs walk several row blocks and row blocks are cut.
    assert n_part > 300 and n_multi > 100 and n_cut > 100, (n_part, n_multi, n_cut)


def test_partition_on_few_sms_and_without_overhead():
    # Tiny grids (CTAs walk many row blocks) and ovh 0 (ranges that hold only tiles).
    rng = np.random.default_rng(5)
    for sms, prologue in ((1, 3.0), (4, 3.0), (7, 0.0), (132, 10.0)):
        cfg = PagedAttentionConfig(balanced=True,
                                   wg_cost=pp.SplitCost(2.0, prologue, 1.0))
        dev = replace(H200, sm_count=sms)
        for _ in range(40):
            B = int(rng.integers(2, 70))
            lengths = rng.integers(1, 5000, size=B).astype(np.int64)
            q = np.ones(B, dtype=np.int64)
            H = int(rng.choice([16, 64, 128]))
            g = geometry(q, lengths, H, 64)
            p = pp.plan_launch(g, -1, dev, cfg)
            lanes = -(-H // M) if sms >= -(-H // M) else 1
            assert (p.part_ctas, p.part_lanes) == (sms // lanes * lanes, lanes)
            check_partition(q, lengths, H, -1, g, p, cfg)


def test_partition_evens_out_a_ragged_batch():
    # B32 H16, lengths 1k-16k (the bench's ragged row): every CTA's range is C positions
    # of the line, so the busiest CTA reads about W / G tiles, not the longest sequence's split.
    rng = np.random.default_rng(3)
    lengths = rng.integers(1024, 16385, size=32)
    q = np.ones(32, dtype=np.int64)
    cfg = PagedAttentionConfig(balanced=True)
    g = geometry(q, lengths, 16, 64)
    p = pp.plan_launch(g, -1, H200, cfg)
    s = check_partition(q, lengths, 16, -1, g, p, cfg)
    per_cta = [sum(e - a for _, _, _, a, e in units) for units in s["ctas"]]
    tiles = -(-lengths // 64)
    assert max(per_cta) <= -(-int(tiles.sum() + 32 * pp.partition_overhead(cfg)) // 132)
    assert max(per_cta) < -(-int(tiles.max()) // p.splits)
    assert sum(per_cta) == int(tiles.sum())


def test_ragged_lengths_get_chunks_in_proportion():
    # B32 H16, lengths 1k-16k (the bench's ragged row): long sequences get more chunks.
    rng = np.random.default_rng(3)
    lengths = rng.integers(1024, 16385, size=32)
    q = np.ones(32, dtype=np.int64)
    cfg = PagedAttentionConfig(balanced=True, wg_schedule="serial")
    g = geometry(q, lengths, 16, 64)
    p = pp.plan_launch(g, -1, H200, cfg)
    s = check(q, lengths, 16, -1, g, p, cfg)
    tiles = -(-lengths // 64)
    assert s["k"][np.argmax(tiles)] > s["k"][np.argmin(tiles)]
    # The slowest CTA reads fewer tiles than with one count for every sequence.
    assert s["C"] < -(-int(tiles.max()) // p.splits)
    assert len(s["ctas"]) <= 132


def test_equal_lengths_pick_the_host_models_count():
    cfg = PagedAttentionConfig(balanced=True, wg_schedule="serial")
    for B, H, L in ((8, 16, 8192), (32, 16, 8192), (32, 64, 4096), (8, 128, 32768),
                    (32, 32, 4096), (2, 64, 32768)):
        q, lengths = np.ones(B, dtype=np.int64), np.full(B, L)
        g = geometry(q, lengths, H, 64)
        p = pp.plan_launch(g, -1, H200, cfg)
        s = check(q, lengths, H, -1, g, p, cfg)
        tiles, rbs = -(-L // 64), B * -(-H // M)
        host = pp.choose_splits(rbs, tiles, H200.sm_count, B * H, 512, cap=p.max_chunks,
                                path="wg", config=cfg)
        assert s["pick"] == host and set(s["k"].tolist()) == {host}, (B, H, L)


