#!/usr/bin/env python3
"""The spread of repeated benchmark runs: ``python tools/bench_spread.py RUN.json ... [--md OUT]``.

A row's ratio to its peer moves between runs of ``tools/bench.py`` on one machine (H200,
IndexShare decode: 1-8 % between two runs 20 minutes apart,
docs/notes/index_share-history.md, round 14), so a target near a row's ratio is judged on
several runs. This reads result files of ``bench.py`` and, per (bench, case, metric)
present in every file, prints the median, min and max of ours,
of the peer's value and of the ratio, and how many runs met ``--target`` (a ratio), if
given.

The same kernel's ratios also move with the board (IndexShare decode: up to ~4 % between
H200s, docs/notes/index_share-history.md, rounds 16-18). ``--group NAME FILE...``
(repeatable) or ``--by-gpu`` (the ``gpu_uuid`` that ``bench.py`` records) print one
column per group instead: each row's median ratio per group (and how many of its runs met
the target), then over every run.
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
                raise ValueError(f"run {i}: row {key} twice (rows against two peers? pick one "
                                 "with --peer)")
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


def by_group(groups: dict[str, list[dict[str, Any]]], target: float | None = None
             ) -> tuple[list[str], list[dict[str, Any]]]:
    """Per (bench, case, metric) present in every run of every group: the spread of each
    group (``spread``) and of all runs together (key ``"all"``). Returns (group names in
    order, rows with ``by`` {name: spread entry} and ``all``)."""
    if not groups or any(not runs for runs in groups.values()):
        raise ValueError("every group needs at least one run")
    names = list(groups)
    per = {n: {(e["bench"], e["case"], e["metric"]): e for e in spread(runs, target)}
           for n, runs in groups.items()}
    rows = []
    for e in spread([r for runs in groups.values() for r in runs], target):
        key = (e["bench"], e["case"], e["metric"])
        rows.append(dict(bench=key[0], case=key[1], metric=key[2], all=e,
                         by={n: per[n][key] for n in names}))
    return names, rows


def markdown_groups(names: list[str], rows: list[dict[str, Any]], target: float | None) -> str:
    """One column per group and one over every run: the median ratio (min-max over that
    group's runs), with runs at or above ``target`` out of its runs."""
    def cell(e: dict[str, Any]) -> str:
        r = e["ratio"]
        if r is None:
            return ""
        met = f", {e['met']}/{e['runs']}" if "met" in e else ""
        return f"{r['median']:.4g} ({r['min']:.4g}-{r['max']:.4g}{met})"

    runs = {n: rows[0]["by"][n]["runs"] for n in names} if rows else {}
    head = ("Median ratio (min-max" + (f", runs >= {target:g}" if target is not None else "")
            + ") per group; runs: " + ", ".join(f"{n} {runs.get(n, 0)}" for n in names))
    lines = [head, "", "| bench | case | metric | " + " | ".join(names) + " | all |",
             "|---|---|---|" + "---:|" * (len(names) + 1)]
    for r in rows:
        lines.append(f"| {r['bench']} | {r['case']} | {r['metric']} | "
                     + " | ".join(cell(r["by"][n]) for n in names) + f" | {cell(r['all'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="spread of repeated bench.py runs (median, min, max "
                                             "per row)")
    ap.add_argument("runs", nargs="*", type=Path, help="bench.py result JSON files")
    ap.add_argument("--group", nargs="+", action="append", metavar=("NAME", "FILE"),
                    help="a named group of result files (repeatable): one column per group")
    ap.add_argument("--by-gpu", action="store_true",
                    help="one column per board (the results' gpu_uuid)")
    ap.add_argument("--bench", help="only rows of this benchmark (e.g. index_share)")
    ap.add_argument("--metric", help="only rows of this metric (e.g. 1/ms)")
    ap.add_argument("--peer", help="only rows whose peer starts with this (e.g. "
                                   "torch-index_select-sdpa: a row per peer per case)")
    ap.add_argument("--target", type=float, help="count the runs whose ratio is at least this")
    ap.add_argument("--md", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    if args.group and (args.runs or args.by_gpu):
        ap.error("--group takes its files itself: no other files and no --by-gpu with it")
    if args.group and any(len(g) < 2 for g in args.group):
        ap.error("--group NAME FILE [FILE ...]: a name and at least one file")
    if not args.group and not args.runs:
        ap.error("no result files")

    def load(p: Path) -> dict[str, Any]:
        try:
            res = json.loads(p.read_text())
            rows = [r for r in res["rows"] if args.bench in (None, r["bench"])
                    and args.metric in (None, r["metric"]) and r["case"] is not None
                    and (args.peer is None or str(r.get("peer", "")).startswith(args.peer))]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ap.error(f"{p}: not a bench.py result ({type(exc).__name__}: {exc})")
        return dict(res, rows=rows)

    groups: dict[str, list[dict[str, Any]]] = {}
    if args.group:
        for name, *files in args.group:
            if name in groups:
                ap.error(f"--group {name}: named twice")
            groups[name] = [load(Path(f)) for f in files]
        results = [r for runs in groups.values() for r in runs]
    else:
        results = [load(p) for p in args.runs]
        if args.by_gpu:
            for p, r in zip(args.runs, results):
                if not r.get("gpu_uuid"):
                    ap.error(f"{p}: no gpu_uuid (written by bench.py since 2026-12-01); "
                             "name the groups with --group")
                groups.setdefault(r["gpu_uuid"], []).append(r)
    try:
        entries = spread(results, args.target)
        grouped = by_group(groups, args.target) if groups else None
    except ValueError as exc:
        ap.error(str(exc))
    every = {(e["bench"], e["case"], e["metric"]) for e in entries}
    partial = {(r["bench"], r["case"], r["metric"]) for res in results for r in res["rows"]} - every
    if partial:
        print(f"bench_spread: {len(partial)} row(s) not in every run, left out: "
              + "; ".join(" / ".join(k) for k in sorted(partial)), file=sys.stderr)
    md = (markdown_groups(*grouped, args.target) if grouped is not None else
          markdown(entries, [str(r.get("commit", "?"))[:12] for r in results], args.target))
    print(md)
    if args.md:
        args.md.write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
