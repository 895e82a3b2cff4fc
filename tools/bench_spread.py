#!/usr/bin/env python3
"""The spread of repeated benchmark runs: ``python tools/bench_spread.py RUN.json ... [--md OUT]``.

A row's ratio to its peer moves between runs of ``tools/bench.py`` on one machine (H200,
IndexShare decode: 1-8 % between two runs 20 minutes apart, NOTES round 14), so a target
near a row's ratio is judged on several runs. This reads result files of ``bench.py`` and,
per (bench, case, metric) present in every file, prints the median, min and max of ours,
of the peer's value and of the ratio, and how many runs met ``--target`` (a ratio), if
given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def spread(results: list[dict[str, Any]], target: float | None = None) -> list[dict[str, Any]]:
    """Rows of ``bench.py`` result dicts grouped by (bench, case, metric), in the first
    result's order; only keys every result has. Each: median / min / max of ``ours``,
    ``peer_value`` and ``ratio`` (None where a run has none), runs, and runs at or above
    ``target``."""
    if not results:
        raise ValueError("no results")
    keyed = []
    for i, res in enumerate(results):
        k: dict[tuple, dict] = {}
        for r in res["rows"]:
            key = (r["bench"], r["case"], r["metric"])
            if key in k:
                raise ValueError(f"run {i}: row {key} twice")
            k[key] = r
        keyed.append(k)
    out = []
    for key in keyed[0]:
        if not all(key in k for k in keyed):
            continue
        rows = [k[key] for k in keyed]
        entry: dict[str, Any] = dict(bench=key[0], case=key[1], metric=key[2], runs=len(rows))
        for f in ("ours", "peer_value", "ratio"):
            vals = [r[f] for r in rows if r.get(f) is not None]
            entry[f] = (None if len(vals) < len(rows) else
                        dict(median=statistics.median(vals), min=min(vals), max=max(vals)))
        if target is not None and entry["ratio"] is not None:
            entry["met"] = sum(r["ratio"] >= target for r in rows)
        out.append(entry)
    return out


def markdown(entries: list[dict[str, Any]], commits: list[str], target: float | None) -> str:
    def fmt(d: dict | None) -> str:
        return "" if d is None else f"{d['median']:.4g} ({d['min']:.4g}-{d['max']:.4g})"

    has_t = target is not None
    head = "| bench | case | metric | ours | peer | ratio |" + (" runs >= target |" if has_t else "")
    lines = [f"Runs: {len(commits)} ({', '.join(commits)}); median (min-max)"
             + (f"; target ratio {target:g}" if has_t else ""), "", head,
             "|---|---|---|---:|---:|---:|" + ("---:|" if has_t else "")]
    for e in entries:
        met = f" {e['met']}/{e['runs']} |" if "met" in e else (" |" if has_t else "")
        lines.append(f"| {e['bench']} | {e['case']} | {e['metric']} | {fmt(e['ours'])} | "
                     f"{fmt(e['peer_value'])} | {fmt(e['ratio'])} |{met}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="spread of repeated bench.py runs (median, min, max "
                                             "per row)")
    ap.add_argument("runs", nargs="+", type=Path, help="bench.py result JSON files")
    ap.add_argument("--bench", help="only rows of this benchmark (e.g. index_share)")
    ap.add_argument("--metric", help="only rows of this metric (e.g. 1/ms)")
    ap.add_argument("--target", type=float, help="count the runs whose ratio is at least this")
    ap.add_argument("--md", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    results = []
    for p in args.runs:
        try:
            res = json.loads(p.read_text())
            rows = [r for r in res["rows"] if args.bench in (None, r["bench"])
                    and args.metric in (None, r["metric"]) and r["case"] is not None]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ap.error(f"{p}: not a bench.py result ({type(exc).__name__}: {exc})")
        results.append(dict(res, rows=rows))
    try:
        entries = spread(results, args.target)
    except ValueError as exc:
        ap.error(str(exc))
    every = {(e["bench"], e["case"], e["metric"]) for e in entries}
    partial = {(r["bench"], r["case"], r["metric"]) for res in results for r in res["rows"]} - every
    if partial:
        print(f"bench_spread: {len(partial)} row(s) not in every run, left out: "
              + "; ".join(" / ".join(k) for k in sorted(partial)), file=sys.stderr)
    md = markdown(entries, [str(r.get("commit", "?"))[:12] for r in results], args.target)
    print(md)
    if args.md:
        args.md.write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
