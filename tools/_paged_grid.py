"""The rows of ``tools/bench.py paged`` without a device: shapes, FLOP and byte counts,
ragged lengths, block tables and slots, the agreement measure, targets and the table.

See ``tools/bench_paged.py`` for what is measured and docs/notes/paged_attention-bench.md
for the bounds and targets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from bench import row

HS, VHS, BS = 576, 512, 64
SCALE = 1.0 / 192 ** 0.5  # DeepSeek's softmax scale of the un-absorbed head dim
HEADS, BATCHES, LENGTHS = (16, 32, 64, 128), (1, 8, 32, 128), (4096, 8192, 32768)
STEP_CALLS = 8  # calls in one graph, as in a model's decode step
ROUNDS, REPLAYS, MEASURE_MS = 3, 20, 60.0  # per measurement: ~20 replays, at most ~60 ms
MAX_SETS, Q_BUDGET = 16, 1 << 30  # input sets against L2; bytes of queries over all sets
RIDGE = 790e12 / 4.0e12  # H200 FLOP per byte: dense bf16 GEMM / HBM copy
AGREE_TOL = 2e-2  # rel. Frobenius of two bf16 outputs with different summation orders
REF_PAIRS = 1 << 21  # rows up to this many (token, head, key) triples also meet the float64 ref
TIE = 0.03  # within 3 % of a target: a tie (run-to-run spread between boards)
TARGET_RATIO, TARGET_COPY, TARGET_TFLOPS = 1.0, 0.9, 560.0


@dataclass(frozen=True)
class Shape:
    """One row's problem: ``kind`` decode, ragged, spec or prefill; ``L`` keys per sequence
    (ragged: the nominal length the lengths are drawn around); ``q`` new tokens each."""

    kind: str
    H: int
    B: int
    L: int
    q: int = 1

    @property
    def case(self) -> str:
        """The row's name in the results (``bench.py``'s ``case``)."""
        tail = f"d{HS}/{VHS} bs{BS}"
        if self.kind == "ragged":
            return f"ragged bf16 B{self.B} H{self.H} L{self.L // 8}-{2 * self.L} {tail}"
        if self.kind == "spec":
            return f"spec q{self.q} bf16 B{self.B} H{self.H} L{self.L} {tail}"
        if self.kind == "prefill":
            return f"prefill bf16 B{self.B} H{self.H} q{self.q} past{self.L - self.q} {tail}"
        return f"decode bf16 B{self.B} H{self.H} L{self.L} {tail}"

    def lengths(self) -> np.ndarray:
        """Keys per sequence (past + new), int64 [B]."""
        if self.kind == "ragged":
            return ragged_lengths(self.B, self.L, seed=100003 * self.B + self.L)
        return np.full(self.B, self.L, dtype=np.int64)


def grid(quick: bool) -> list[Shape]:
    """The rows in run order (decode first, prefill last)."""
    if quick:
        return ([Shape("decode", h, b, 8192) for h in (16, 128) for b in (1, 32)]
                + [Shape("ragged", h, 32, 8192) for h in (16, 128)]
                + [Shape("spec", h, 32, 8192, 4) for h in (16, 128)]
                + [Shape("prefill", 128, 1, 512, 256)])
    return ([Shape("decode", h, b, n) for n in LENGTHS for b in BATCHES for h in HEADS]
            + [Shape("ragged", h, b, 8192) for b in (8, 32, 128) for h in HEADS]
            + [Shape("spec", h, b, 8192, q) for q in (2, 4) for b in (32, 128) for h in HEADS]
            + [Shape("prefill", 128, 2, 2048, 1024), Shape("prefill", 128, 1, 2048, 2048)])


def ragged_lengths(B: int, L: int, seed: int) -> np.ndarray:
    """Seeded per-sequence lengths, uniform in [L // 8, 2 * L] (int64 [B])."""
    return np.random.default_rng(seed).integers(L // 8, 2 * L, size=B, endpoint=True)


def visible_pairs(lengths: np.ndarray, q: int) -> int:
    """(query token, key) pairs per head under causality: token i of q sees L - q + i + 1 keys."""
    return int(np.sum(q * np.asarray(lengths, dtype=np.int64))) - len(lengths) * q * (q - 1) // 2


def kv_bytes(lengths: np.ndarray) -> int:
    """Latent cache bytes read once: every cached key row of every sequence."""
    return int(np.sum(lengths)) * HS * 2


def flops(H: int, lengths: np.ndarray, q: int) -> float:
    """2 * (576 + 512) FLOP per head and visible pair (S = Q K^T, then P V)."""
    return 2.0 * H * (HS + VHS) * visible_pairs(lengths, q)


def input_sets(kv: int, l2_bytes: int, q_bytes: int = 0) -> int:
    """Input sets replayed in turn: enough for the KV to exceed twice L2 (1 when it does)."""
    n = max(1, math.ceil(2 * l2_bytes / max(kv, 1)))
    return int(min(n, MAX_SETS, max(1, Q_BUDGET // max(q_bytes, 1))))


def block_tables(lengths: np.ndarray, n_sets: int, seed: int) -> tuple[list[np.ndarray], int]:
    """One int32 [B, max_blocks] table per set over disjoint, shuffled blocks; the blocks used.

    Entries past a sequence's last block are 0 (never read)."""
    mbs = -(-np.asarray(lengths, dtype=np.int64) // BS)
    total = n_sets * int(mbs.sum())
    perm = np.random.default_rng(seed).permutation(total).astype(np.int32)
    tables, k = [], 0
    for _ in range(n_sets):
        bt = np.zeros((len(mbs), int(mbs.max())), dtype=np.int32)
        for b, m in enumerate(mbs):
            bt[b, :m] = perm[k:k + m]
            k += int(m)
        tables.append(bt)
    return tables, total


def slot_mapping(bt: np.ndarray, lengths: np.ndarray, q: int) -> np.ndarray:
    """Slots of the ``q`` new tokens of each sequence (positions L - q .. L - 1), int32 [B * q]."""
    pos = np.asarray(lengths, dtype=np.int64)[:, None] - q + np.arange(q)[None, :]
    slot = np.take_along_axis(bt.astype(np.int64), pos // BS, axis=1) * BS + pos % BS
    return slot.reshape(-1).astype(np.int32)


def compact_table(bt: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pool block ids in use, the table renumbered onto them): a small cache for the reference."""
    mbs = -(-np.asarray(lengths, dtype=np.int64) // BS)
    ids = np.concatenate([bt[b, :m] for b, m in enumerate(mbs)]).astype(np.int64)
    new = np.zeros_like(bt)
    start = np.concatenate([[0], np.cumsum(mbs)[:-1]])
    for b, m in enumerate(mbs):
        new[b, :m] = np.arange(start[b], start[b] + m, dtype=np.int32)
    return ids, new


def rel_frobenius(got: Any, want: Any) -> float:
    """||got - want||_F / ||want||_F in float64 (inf where ``want`` is zero and ``got`` is not)."""
    g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if g.shape != w.shape:
        raise ValueError(f"shapes differ: {g.shape} vs {w.shape}")
    num, den = float(np.linalg.norm(g - w)), float(np.linalg.norm(w))
    return num / den if den else (0.0 if num == 0 else math.inf)


def targets(s: Shape) -> dict[str, float | None]:
    """The issue's targets that apply to a row (None: not this row's)."""
    one = s.kind in ("decode", "ragged")
    return {"vs_flashmla": None if s.kind == "prefill" else TARGET_RATIO,
            "vs_copy": TARGET_COPY if one and s.H <= 32 and s.B >= 32 else None,
            "vs_tflops": TARGET_TFLOPS if s.kind != "prefill" and s.H == 128 and s.B >= 32
            else None}


def verdict(value: float | None, target: float | None) -> str | None:
    """"pass", "tie" (within TIE below), "FAIL", or None without a value or target."""
    if value is None or target is None:
        return None
    return "pass" if value >= target else "tie" if value >= (1 - TIE) * target else "FAIL"


def make_row(s: Shape, calls: int, ms: dict[str, float | None], copy: float | None,
             gemm: float | None, **extra: Any) -> dict:
    """One result row from milliseconds per call (``ours_ro``, ``ours_w``, ``flashmla``).

    The metric is GB/s where the row is memory-bound (FLOP per KV byte below RIDGE), else
    TFLOP/s; both are recorded either way, for ours read-only, with the write and FlashMLA.
    """
    lengths = s.lengths()
    kv, fl = kv_bytes(lengths), flops(s.H, lengths, s.q)
    gb = {k: None if v is None else kv / v / 1e6 for k, v in ms.items()}
    tf = {k: None if v is None else fl / v / 1e9 for k, v in ms.items()}
    mem = fl / kv < RIDGE
    val = gb if mem else tf
    peer = ms.get("flashmla")
    ratio = None if peer is None else peer / ms["ours_ro"]
    if extra.get("agree") is False:  # a faster wrong answer is no win
        ratio = 0.0
    t = targets(s)
    of_copy = None if not copy or s.kind == "prefill" else gb["ours_ro"] / copy  # prefill: FLOPs bound
    r2 = lambda x: None if x is None else round(x, 3)  # noqa: E731
    return row("paged", s.case + ("" if calls == 1 else f" {calls}/graph"),
               "GB/s" if mem else "TFLOP/s", val["ours_ro"], "flashmla" if peer else "none",
               val.get("flashmla"), of_ceiling=r2(of_copy),
               of_gemm=r2(None if not gemm else tf["ours_ro"] / gemm),
               timing="1/replay" if calls == 1 else f"{calls}/graph", kind=s.kind, H=s.H, B=s.B,
               L=s.L, q=s.q, mean_L=round(float(np.mean(lengths)), 1), kv_bytes=kv, flops=fl,
               ms=round(ms["ours_ro"], 5),
               GBps=r2(gb["ours_ro"]), TFLOPs=r2(tf["ours_ro"]),
               write_ms=None if ms.get("ours_w") is None else round(ms["ours_w"], 5),
               write_GBps=r2(gb.get("ours_w")), write_TFLOPs=r2(tf.get("ours_w")),
               write_ratio=None if peer is None or not ms.get("ours_w") else r2(peer / ms["ours_w"]),
               flashmla_ms=None if peer is None else round(peer, 5),
               flashmla_GBps=r2(gb.get("flashmla")), flashmla_TFLOPs=r2(tf.get("flashmla")),
               vs_flashmla=verdict(ratio, t["vs_flashmla"]),
               vs_copy=verdict(of_copy, t["vs_copy"]),
               vs_tflops=verdict(tf["ours_ro"], t["vs_tflops"]), **extra)


def markdown_section(rows: list[dict], ceilings: dict[str, float]) -> str:
    """The paged rows as one table with the issue's pass/fail columns ("" where n/a)."""
    f = lambda v, d=0: "" if v is None else f"{v:.{d}f}"  # noqa: E731
    out = ["## paged: MLA decode vs FlashMLA", "",
           "Ours read-only (slot -1; the targets) and with the write phase; ratio = ours / "
           "FlashMLA; rel F = ||ours - FlashMLA|| / ||FlashMLA||. Ceilings: copy "
           f"{ceilings.get('paged_copy_GBps')} GB/s, GEMM {ceilings.get('paged_gemm_TFLOPs')} "
           "TFLOP/s.", "",
           "| case | GB/s | TFLOP/s | +write GB/s | FlashMLA GB/s | FlashMLA TFLOP/s | ratio | "
           "+write ratio | of copy | rel F | >=1.0x FlashMLA | >=90% copy | >=560 TF |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        if r.get("bench") != "paged" or "GBps" not in r:
            continue
        frac, rel = r.get("of_ceiling"), r.get("rel_fro")
        out.append(f"| {r['case']} | {f(r['GBps'])} | {f(r['TFLOPs'], 1)} | {f(r['write_GBps'])} | "
                   f"{f(r['flashmla_GBps'])} | {f(r['flashmla_TFLOPs'], 1)} | {f(r['ratio'], 3)} | "
                   f"{f(r['write_ratio'], 3)} | "
                   f"{'' if frac is None else f'{frac:.0%}'} | "
                   f"{'' if rel is None else f'{rel:.1e}'} | "
                   f"{r['vs_flashmla'] or ''} | {r['vs_copy'] or ''} | {r['vs_tflops'] or ''} |")
    return "\n".join(out) + "\n"


def sets_for(s: Shape, l2_bytes: int) -> int:
    """Input sets of a row (see :func:`input_sets`)."""
    return input_sets(kv_bytes(s.lengths()), l2_bytes, s.B * s.q * s.H * HS * 2)


def pool_blocks(shapes: list[Shape], l2_bytes: int) -> int:
    """Blocks of the one latent cache pool every row's input sets fit in."""
    return max(sets_for(s, l2_bytes) * int(np.sum(-(-s.lengths() // BS))) for s in shapes)
