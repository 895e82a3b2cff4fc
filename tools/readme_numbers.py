#!/usr/bin/env python3
"""The README's headline table, generated from ``benchmarks/latest/*.json``.

``python tools/readme_numbers.py`` prints the table; ``--write`` puts it into README.md
between the lines ``<!-- numbers:begin -->`` and ``<!-- numbers:end -->``; ``--check``
exits 1 when README.md's block differs from what the latest results give (CI, or after
copying a new ``tools/gpu_check.sh`` run into ``benchmarks/latest/``). Each row is one
headline of one op (:data:`HEADLINES`): our number, its peers or floor, and the ratio.
No GPU needed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- numbers:begin -->"
END = "<!-- numbers:end -->"
COPY = "copy-bandwidth"

#: How a peer is named in the table.
PEER_LABELS = {
    "cuda.core launch": "cuda.core `launch`",
    "CuPy RawKernel": "CuPy `RawKernel`",
    "torch-sdpa-flash": "torch flash",
    "torch-sdpa-cudnn": "cuDNN",
    "torch-gather-bmm": "torch gather+bmm",
    "torch-index_select-sdpa": "torch `index_select` + SDPA",
    "torch-gather-sdpa": "torch advanced indexing + SDPA",
    "cold compile": "cold compile",
    "flashmla": "FlashMLA",
}


@dataclass(frozen=True)
class Headline:
    """One row: ``op`` names the file in ``benchmarks/latest/``; ``case`` a bench case (a
    trailing plan note in parentheses is ignored, so a new plan keeps its row); ``metric``
    the number shown as ours; ``peers`` the (metric, peer) rows whose peer value and ratio
    are shown, ``copy-bandwidth`` as a fraction of the copy ceiling."""

    op: str
    what: str
    case: str
    metric: str
    peers: tuple[tuple[str, str], ...]


HEADLINES = (
    Headline("runtime", "launches per ms of host time, empty kernel", "launch empty kernel (host)",
             "launches/ms", (("launches/ms", "cuda.core launch"), ("launches/ms", "CuPy RawKernel"))),
    Headline("runtime", "first launch from a warm disk cache vs a cold compile (fresh process)",
             "first launch: warm disk cache vs cold compile (fresh process)", "1/s",
             (("1/s", "cold compile"),)),
    Headline("attention", "Attention prefill bf16 D128 B1 H32 S8192, non-causal",
             "bf16 D128 B1 H32 S8192 causal=0", "TFLOP/s",
             (("TFLOP/s", "torch-sdpa-cudnn"), ("TFLOP/s", "torch-sdpa-flash"))),
    Headline("attention", "Attention decode bf16 D128 B8 H32/8 Sk 32k, one call per graph",
             "decode bf16 D128 B8 H32/8 Sk32768", "GB/s",
             (("GB/s", COPY), ("GB/s", "torch-sdpa-flash"))),
    Headline("paged_attention", "PagedAttention MLA decode bf16 B32 H16 L8k (TP8 shard), 576/512",
             "decode bf16 B32 H16 L8192 d576/512 bs64", "GB/s", (("GB/s", "flashmla"),)),
    Headline("paged_attention", "PagedAttention MLA decode bf16 B128 H128 L8k, 576/512",
             "decode bf16 B128 H128 L8192 d576/512 bs64", "TFLOP/s", (("TFLOP/s", "flashmla"),)),
    Headline("paged_attention", "PagedAttention MLA prefill bf16 B1 H128 q2048",
             "prefill bf16 B1 H128 q2048 past0 d576/512 bs64", "TFLOP/s", ()),
    Headline("index_share", "IndexShare decode bf16 B64 N64 top-2048, cache 8k, one call per graph",
             "bf16 decode B64 Sq1 N64 Nkv1 H128 cache8k top2048", "1/ms",
             (("GB/s", COPY), ("1/ms", "torch-index_select-sdpa"), ("1/ms", "torch-gather-sdpa"))),
    Headline("index_share", "IndexShare decode bf16 B64 N128 top-2048, cache 64k, one call per graph",
             "bf16 decode B64 Sq1 N128 Nkv1 H128 cache64k top2048", "1/ms",
             (("GB/s", COPY), ("1/ms", "torch-index_select-sdpa"), ("1/ms", "torch-gather-sdpa"))),
    Headline("index_share", "IndexShare prefill bf16 B1 Sq4096 N128 top-2048, cache 8k",
             "bf16 prefill B1 Sq4096 N128 Nkv1 H128 cache8k top2048", "1/ms",
             (("1/ms", "torch-index_select-sdpa"), ("1/ms", "torch-gather-sdpa"))),
)


def _case_key(case: str) -> str:
    return re.sub(r" \([^()]*\)(?=(,|$))", "", case)


def _find(rows: list[dict], op: str, case: str, metric: str, peer: str | None) -> dict:
    for r in rows:
        if (case in (r["case"], _case_key(r["case"])) and r["metric"] == metric
                and (peer is None or r["peer"] == peer)):
            return r
    raise LookupError(f"benchmarks/latest/{op}.json has no row {case!r} / {metric!r}"
                      + (f" / peer {peer!r}" if peer else ""))


def _time(per_unit: float, unit_s: float) -> str:
    """A rate (calls per ``unit_s`` seconds) as a time per call, in us, ms or s."""
    t = unit_s / per_unit
    for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if t >= scale or name == "us":
            v = t / scale
            return f"{v:.3g} {name}" if v < 100 else f"{v:.0f} {name}"
    raise AssertionError  # unreachable


def show(value: float, metric: str) -> str:
    """A number as the table shows it: rates per call as times, others with their unit."""
    if metric == "1/ms":
        return _time(value, 1e-3)
    if metric == "1/s":
        return _time(value, 1.0)
    return f"{value:.0f} {metric}" if value >= 100 else f"{value:.3g} {metric}"


def headline_row(h: Headline, rows: list[dict]) -> str:
    """One markdown table row for ``h`` from one result file's rows."""
    ours = _find(rows, h.op, h.case, h.metric, None)["ours"]
    peers, ratios, extra = [], [], []
    for metric, peer in h.peers:
        r = _find(rows, h.op, h.case, metric, peer)
        if peer == COPY:
            if metric != h.metric:
                extra.append(show(r["ours"], metric))
            ratios.append(f"{100 * r['ratio']:.0f} % of copy")
            peers.append(f"copy {show(r['peer_value'], metric)}")
        else:
            ratios.append(f"{r['ratio']:.0f}x" if r["ratio"] >= 100 else f"{r['ratio']:.2f}x")
            peers.append(f"{PEER_LABELS.get(peer, peer)} {show(r['peer_value'], metric)}")
    mine = show(ours, h.metric) + (f" ({', '.join(extra)})" if extra else "")
    return f"| {h.what} | {mine} | {'; '.join(peers) or '-'} | {'; '.join(ratios) or '-'} |"


def load_latest(latest: Path, ops: list[str]) -> dict[str, dict]:
    """The result of each op in ``latest`` (``<op>.json``), as bench.py wrote it."""
    out = {}
    for op in ops:
        path = latest / f"{op}.json"
        if not path.is_file():
            raise LookupError(f"{path} is missing (tools/bench.py {op} writes it)")
        out[op] = json.loads(path.read_text())
    return out


def block(latest: Path, headlines: tuple[Headline, ...] = HEADLINES) -> str:
    """The generated lines between the markers (markers excluded), ending in a newline."""
    ops = list(dict.fromkeys(h.op for h in headlines))
    results = load_latest(latest, ops)
    lines = ["<!-- generated by tools/readme_numbers.py from benchmarks/latest/: edit that, "
             "not this -->",
             "| what | attnrt | peer or floor | ratio |", "|---|---:|---|---:|"]
    lines += [headline_row(h, results[h.op]["rows"]) for h in headlines]
    runs: dict[str, list[str]] = {}
    for op in ops:
        runs.setdefault(str(results[op].get("commit", "?"))[:7], []).append(f"`{op}`")
    where = "; ".join(f"{', '.join(names)} at `{commit}`" for commit, names in runs.items())
    gpus = ", ".join(dict.fromkeys(str(results[op].get("gpu", "?")) for op in ops))
    lines += ["", f"One run per file in [benchmarks/latest/](benchmarks/latest/) ({gpus}): {where}."]
    return "\n".join(lines) + "\n"


def replace_block(text: str, new: str) -> str:
    """``text`` with the lines between the markers replaced by ``new``.

    Raises
    ------
    ValueError
        When the markers are missing, repeated or out of order.
    """
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"README needs one {BEGIN} line and one {END} line after it")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{new}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Print, write or check the README's headline table; returns the exit status."""
    ap = argparse.ArgumentParser(description="The README's headline table, generated from "
                                             "benchmarks/latest/*.json.")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    ap.add_argument("--latest", type=Path, default=ROOT / "benchmarks" / "latest")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the README's block")
    mode.add_argument("--check", action="store_true", help="exit 1 if the README's block differs")
    args = ap.parse_args(argv)
    try:
        new = block(args.latest)
        if not (args.write or args.check):
            print(new, end="")
            return 0
        text = args.readme.read_text()
        updated = replace_block(text, new)
    except (LookupError, ValueError, OSError) as exc:
        print(f"readme_numbers: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if updated != text:
            print(f"readme_numbers: {args.readme} is out of date; run "
                  "python tools/readme_numbers.py --write", file=sys.stderr)
            return 1
        return 0
    if updated != text:
        args.readme.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
