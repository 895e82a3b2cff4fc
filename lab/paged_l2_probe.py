#!/usr/bin/env python3
"""Is the wgmma MLA read kernel bound by HBM or by its own per-tile chain?

    PYTHONPATH=.:tools python lab/paged_l2_probe.py

A few decode rows of ``tools/bench.py paged``, each timed twice with the bench's own rig
(ours read-only and FlashMLA, graph replays, interleaved): ``hbm`` = the bench's block
tables (disjoint pages, input sets beyond L2); ``l2`` = every sequence's table over the same
``PAGES`` pages (~9.4 MB of latent cache, resident in the 60 MB L2), one input set. Same
FLOPs and the same kernel work per tile; only where the bytes come from changes. If our
time barely moves when the bytes come from L2, HBM is not what limits a tile.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import bench_paged  # noqa: E402
from _paged_grid import BS, Shape  # noqa: E402
from bench import BenchContext  # noqa: E402

import attnrt  # noqa: E402

PAGES = 128  # 128 x 64 keys x 1152 bytes = 9.4 MB
ROWS = [Shape("decode", h, b, 8192) for h, b in ((16, 32), (64, 32), (128, 32), (16, 128))]


def l2_tables(lengths: np.ndarray, n_sets: int, seed: int) -> tuple[list[np.ndarray], int]:
    mbs = -(-np.asarray(lengths, dtype=np.int64) // BS)
    perm = np.random.default_rng(seed).permutation(PAGES).astype(np.int32)
    bt = np.zeros((len(mbs), int(mbs.max())), dtype=np.int32)
    for b, m in enumerate(mbs):
        bt[b, :m] = perm[np.arange(m) % PAGES]
    return [bt], PAGES


def main() -> None:
    out = {}
    with attnrt.CudaRuntime(0) as rt:
        ctx = BenchContext(rt)
        bench_paged.grid = lambda quick: ROWS
        for mode in ("hbm", "l2"):
            if mode == "l2":
                bench_paged.block_tables = l2_tables
                bench_paged.sets_for = lambda s, l2: 1
            for r in bench_paged.run(ctx):
                if r["timing"] == "1/replay":
                    out[r["case"], mode] = (r["ms"] * 1e3, (r.get("flashmla_ms") or 0) * 1e3)
    print("| row | ours hbm us | ours L2 us | FlashMLA hbm us | FlashMLA L2 us |")
    print("|---|---:|---:|---:|---:|")
    for s in ROWS:
        (oh, fh), (ol, fl) = out[s.case, "hbm"], out[s.case, "l2"]
        print(f"| {s.case} | {oh:.1f} | {ol:.1f} | {fh:.1f} | {fl:.1f} |")


if __name__ == "__main__":
    main()
