#!/usr/bin/env python3
"""Which PagedAttention split counts does the busy-row-block rule change? (no GPU)

Run: ``python lab/paged_split_rule.py [--wide] [--path wg|mla]``. For every row of
``tools/bench.py paged`` (``tools/_paged_grid.py``, no ``attention_metadata``, as the bench
runs it) it prints the split count of the previous rule (``choose_splits`` over all of the
grid's row blocks, ``min(grid_x, B * ceil(max_q * H / 64))``) and of the shipped planner
(``plan.plan_launch``), the CTAs that have rows under each, and the workspace. ``--wide``
adds a summary over a wider grid of shapes (B, H, tokens per sequence, lengths). The rule
and its predicted effect: docs/notes/paged_attention.md#busy-row-blocks.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from _paged_grid import BS, HS, VHS, grid  # noqa: E402

from attnrt.ops.paged_attention import plan as pp  # noqa: E402
from attnrt.ops.paged_attention.schema import PagedGeometry  # noqa: E402
from attnrt.runtime.api import DataType  # noqa: E402

CFG = pp.PagedAttentionConfig()


def geometry(B: int, H: int, q: int, max_len: int, bs: int = BS) -> PagedGeometry:
    """The validated geometry of ``B`` sequences of ``q`` new tokens, the longest ``max_len``."""
    mb = -(-max_len // bs)
    return PagedGeometry(DataType.BFLOAT16, B * q, H, HS, VHS, B, B * mb, bs, mb, 0, 0, 0.1)


def previous(g: PagedGeometry, path: str) -> int:
    """The split count of the previous rule (shapes only, no window)."""
    grid_x = g.tokens * g.heads // 64 + (g.batch if g.heads % 64 else 0)
    tiles = -(-max(g.max_blocks * g.block_size, 1) // 64)
    row_blocks = min(grid_x, g.batch * -(-g.tokens * g.heads // 64))
    return pp.choose_splits(row_blocks, tiles, pp.DEFAULT_DEVICE.sm_count, g.tokens * g.heads,
                            g.v_head_size, path=path, config=CFG)


def busy_blocks(B: int, H: int, q: int) -> int:
    """Row blocks that hold rows when every sequence has ``q`` new tokens."""
    return B * -(-q * H // 64)


def compare(g: PagedGeometry, path: str) -> tuple[int, int, pp.PagedPlan]:
    """(previous split count, new split count, new plan)."""
    cfg = pp.PagedAttentionConfig(path=path)
    p = pp.plan_launch(g, -1, pp.DEFAULT_DEVICE, cfg)
    return previous(g, path), p.splits, p


def bench_table(path: str) -> list[str]:
    """The bench rows as markdown: previous vs new split count, busy CTAs and workspace."""
    out = ["| case | grid_x | busy blocks | splits before -> after | busy CTAs before -> after "
           "| workspace MB before -> after |", "|---|---:|---:|---|---|---|"]
    for s in grid(quick=False):
        g = geometry(s.B, s.H, s.q, int(s.lengths().max()))
        old, new, p = compare(g, path)
        busy = busy_blocks(s.B, s.H, s.q)
        ws_old = pp.workspace_layout(g.tokens * g.heads, VHS, old)[1] / 2**20
        mark = "**" if new != old else ""
        out.append(f"| {s.case} | {p.grid_x} | {busy} | {mark}{old} -> {new}{mark} | "
                   f"{busy * old} -> {busy * new} | {ws_old:.1f} -> {p.ws_bytes / 2**20:.1f} |")
    return out


def wide_summary(path: str) -> list[str]:
    """How many shapes of a wider grid change, by heads, and the largest rises."""
    seen, changed, rises = Counter(), Counter(), Counter()
    worst: list[tuple[int, str]] = []
    for B, H, q, L in itertools.product((1, 2, 3, 5, 8, 13, 16, 24, 32, 48, 64, 96, 128, 200, 256),
                                        (8, 16, 32, 48, 64, 96, 128), (1, 2, 4, 8),
                                        (64, 1000, 4096, 8192, 16384, 32768, 131072)):
        g = geometry(B, H, q, max(L, q))
        old, new, _ = compare(g, path)
        assert new >= old, (B, H, q, L, old, new)
        seen[H] += 1
        if new != old:
            changed[H] += 1
            rises[new - old] += 1
            worst.append((new - old, f"B{B} H{H} q{q} L{L}: {old} -> {new}"))
    out = [f"{path}: shapes changed by heads (of each H's {seen[16]}): "
           + ", ".join(f"H{h} {changed[h]}" for h in sorted(seen)),
           f"{path}: rise in splits -> shapes: " + ", ".join(f"+{k}: {v}" for k, v in sorted(rises.items())),
           f"{path}: largest rises: " + "; ".join(w for _, w in sorted(worst, reverse=True)[:6])]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", choices=("wg", "mla"), default="wg",
                    help="which latent kernel's cost model (wg: the sm_90 default)")
    ap.add_argument("--wide", action="store_true", help="also summarise a wider grid of shapes")
    a = ap.parse_args(argv)
    print("\n".join(bench_table(a.path)))
    if a.wide:
        print()
        print("\n".join(wide_summary(a.path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
