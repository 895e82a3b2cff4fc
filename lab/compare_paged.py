#!/usr/bin/env python3
"""Compare ``tools/bench.py paged`` result files row by row (ours read-only / FlashMLA).

    python lab/compare_paged.py A.json B.json [...]   # one column per file, 1/replay rows

Each column is ours/FlashMLA of that run (FlashMLA timed in the same run); the last column
is the time ratio of the last file to the first (> 1: the last is faster).
"""

from __future__ import annotations

import json
import sys


def main(paths: list[str]) -> None:
    runs = [{r["case"]: r for r in json.load(open(p))["rows"] if r["timing"] == "1/replay"}
            for p in paths]
    print("| case | " + " | ".join(p.rsplit("/", 1)[-1] for p in paths) + " | t first/last |")
    print("|---" * (len(paths) + 2) + "|")
    for case, r0 in runs[0].items():
        cols, last = [], None
        for run in runs:
            r = run.get(case)
            cols.append("-" if r is None or r.get("ratio") is None else f"{r['ratio']:.2f}")
            last = r if r is not None else last
        speed = r0["ms"] / last["ms"] if last else float("nan")
        print(f"| {case} | " + " | ".join(cols) + f" | {speed:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
