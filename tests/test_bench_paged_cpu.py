"""The MLA decode benchmark's host-side logic (``tools/_paged_grid.py``, the FlashMLA peer's
wrapper and loader), without a GPU: rows, FLOP and byte counts, ragged lengths, block tables
and slots, the agreement measure, targets and the table."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import _flashmla_peer as fp  # noqa: E402
import _paged_grid as pg  # noqa: E402

L2 = 50 << 20  # an H100/H200-sized L2


def test_grid_covers_the_issue_rows() -> None:
    full = pg.grid(False)
    dec = {(s.H, s.B, s.L) for s in full if s.kind == "decode"}
    assert dec == {(h, b, n) for h in (16, 32, 64, 128) for b in (1, 8, 32, 128)
                   for n in (4096, 8192, 32768)}
    assert {s.q for s in full if s.kind == "spec"} == {2, 4}
    assert {s.H for s in full if s.kind == "ragged"} == {16, 32, 64, 128}
    assert full[-1].kind == "prefill" and full[0].kind == "decode"
    assert len({s.case for s in full}) == len(full)  # case names are unique
    quick = pg.grid(True)
    qd = {(s.H, s.B, s.L) for s in quick if s.kind == "decode"}
    assert qd == {(16, 1, 8192), (16, 32, 8192), (128, 1, 8192), (128, 32, 8192)}
    assert len(quick) < len(full) / 5


def test_case_names() -> None:
    assert pg.Shape("decode", 16, 32, 8192).case == "decode bf16 B32 H16 L8192 d576/512 bs64"
    assert pg.Shape("ragged", 64, 8, 8192).case == "ragged bf16 B8 H64 L1024-16384 d576/512 bs64"
    assert pg.Shape("spec", 128, 32, 8192, 4).case.startswith("spec q4 bf16 B32 H128 L8192")
    assert pg.Shape("prefill", 128, 2, 2048, 1024).case.startswith("prefill bf16 B2 H128 q1024 past1024")


@pytest.mark.parametrize("B, L", [(1, 4096), (17, 8192), (128, 32768)])
def test_ragged_lengths_are_seeded_and_in_range(B: int, L: int) -> None:
    a = pg.ragged_lengths(B, L, seed=3)
    assert a.shape == (B,) and a.min() >= L // 8 and a.max() <= 2 * L
    assert np.array_equal(a, pg.ragged_lengths(B, L, seed=3))
    if B > 1:
        assert not np.array_equal(a, pg.ragged_lengths(B, L, seed=4))
        assert len(set(a.tolist())) > 1
    s = pg.Shape("ragged", 16, B, L)
    assert np.array_equal(s.lengths(), pg.Shape("ragged", 128, B, L).lengths())  # same for every H


def test_wide_ragged_draw_spans_the_range() -> None:
    a = pg.ragged_lengths(4000, 8192, seed=0)
    assert a.min() < 1024 + 200 and a.max() > 16384 - 200


@pytest.mark.parametrize("q", [1, 2, 4, 7])
def test_visible_pairs_match_a_brute_force_count(q: int) -> None:
    lengths = np.random.default_rng(q).integers(q, 300, size=5)
    want = sum(past + i + 1 for n in lengths for past in [n - q] for i in range(q))
    assert pg.visible_pairs(lengths, q) == want


def test_flop_and_byte_counts() -> None:
    s = pg.Shape("decode", 16, 32, 8192)
    n = s.lengths()
    assert pg.kv_bytes(n) == 32 * 8192 * 576 * 2
    assert pg.flops(16, n, 1) == 2 * 32 * 16 * 8192 * (576 + 512)
    # Speculative decode: the brief's 2*B*H*L*(576+512)*q less the causal triangle.
    n4 = pg.Shape("spec", 128, 32, 8192, 4).lengths()
    assert pg.flops(128, n4, 4) == 2 * 128 * (576 + 512) * 32 * (4 * 8192 - 6)
    # Arithmetic intensity ~1.89 H FLOP per KV byte: H <= 64 below the ridge, H 128 above.
    for h, above in ((16, False), (32, False), (64, False), (128, True)):
        assert (pg.flops(h, n, 1) / pg.kv_bytes(n) > pg.RIDGE) == above
    assert pg.flops(64, n, 2) / pg.kv_bytes(n) > pg.RIDGE  # two tokens double it


def test_input_sets() -> None:
    assert pg.input_sets(5 << 30, L2) == 1
    assert pg.input_sets(int(4.7e6), L2) == pg.MAX_SETS
    assert pg.input_sets(40 << 20, L2) == 3  # 3 x 40 MiB > 2 x L2
    assert pg.input_sets(1 << 20, L2, q_bytes=300 << 20) == 3  # the query budget caps it


@pytest.mark.parametrize("n_sets", [1, 3])
def test_block_tables_are_disjoint_and_cover_each_sequence(n_sets: int) -> None:
    lengths = np.array([1, 64, 65, 1000, 129])
    tables, used = pg.block_tables(lengths, n_sets, seed=5)
    mbs = [1, 1, 2, 16, 3]
    assert used == n_sets * sum(mbs) and len(tables) == n_sets
    seen: list[int] = []
    for bt in tables:
        assert bt.dtype == np.int32 and bt.shape == (5, 16)
        for b, m in enumerate(mbs):
            seen += bt[b, :m].tolist()
            assert not bt[b, m:].any()  # past the sequence: block 0, never read
    assert sorted(seen) == list(range(used))  # every block once, across sets and sequences
    assert not np.array_equal(tables[0], pg.block_tables(lengths, n_sets, seed=6)[0][0])


@pytest.mark.parametrize("q", [1, 3])
def test_slot_mapping_points_at_the_new_tokens(q: int) -> None:
    lengths = np.array([70, 3, 200])
    (bt,), _ = pg.block_tables(lengths, 1, seed=1)
    slots = pg.slot_mapping(bt, lengths, q)
    assert slots.dtype == np.int32 and slots.shape == (3 * q,)
    for b, n in enumerate(lengths):
        for i in range(q):
            pos = n - q + i
            assert slots[b * q + i] == bt[b, pos // 64] * 64 + pos % 64
    assert len(set(slots.tolist())) == 3 * q


def test_compact_table_reads_the_same_rows() -> None:
    rng = np.random.default_rng(0)
    lengths = np.array([130, 5, 64])
    tables, used = pg.block_tables(lengths, 2, seed=2)
    pool = rng.standard_normal((used + 3, 64, 1, 8))
    bt = tables[1]
    ids, small = pg.compact_table(bt, lengths)
    cache = pool[ids]
    for b, n in enumerate(lengths):
        for j in range(n):
            assert np.array_equal(cache[small[b, j // 64], j % 64], pool[bt[b, j // 64], j % 64])
    assert small.dtype == bt.dtype and small.max() == len(ids) - 1


def test_rel_frobenius() -> None:
    ml = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(1)
    want = rng.standard_normal((17, 512)).astype(np.float32)
    assert pg.rel_frobenius(want, want) == 0.0
    assert pg.rel_frobenius(2 * want, want) == pytest.approx(1.0)
    rounded = want.astype(ml.bfloat16).astype(np.float32)  # one bf16 rounding: agrees
    assert 0 < pg.rel_frobenius(rounded, want) < pg.AGREE_TOL
    noisy = want + 0.05 * rng.standard_normal(want.shape).astype(np.float32)
    assert pg.rel_frobenius(noisy, want) > pg.AGREE_TOL
    assert pg.rel_frobenius(np.zeros(3), np.zeros(3)) == 0.0
    assert pg.rel_frobenius(np.ones(3), np.zeros(3)) == float("inf")
    with pytest.raises(ValueError, match="shapes differ"):
        pg.rel_frobenius(np.zeros((2, 3)), np.zeros((3, 2)))


def test_verdict_and_targets() -> None:
    assert pg.verdict(1.0, 1.0) == "pass"
    assert pg.verdict(0.98, 1.0) == "tie"
    assert pg.verdict(0.96, 1.0) == "FAIL"
    assert pg.verdict(None, 1.0) is None and pg.verdict(2.0, None) is None
    t = pg.targets(pg.Shape("decode", 32, 32, 8192))
    assert t == {"vs_flashmla": 1.0, "vs_copy": 0.9, "vs_tflops": None}
    assert pg.targets(pg.Shape("decode", 32, 8, 8192))["vs_copy"] is None  # B < 32
    assert pg.targets(pg.Shape("decode", 64, 128, 8192))["vs_copy"] is None  # H > 32
    assert pg.targets(pg.Shape("spec", 16, 32, 8192, 2))["vs_copy"] is None  # two tokens
    assert pg.targets(pg.Shape("ragged", 16, 128, 8192))["vs_copy"] == 0.9
    assert pg.targets(pg.Shape("spec", 128, 32, 8192, 4))["vs_tflops"] == 560.0
    assert pg.targets(pg.Shape("decode", 128, 8, 8192))["vs_tflops"] is None
    assert pg.targets(pg.Shape("prefill", 128, 2, 2048, 1024)) == \
        {"vs_flashmla": None, "vs_copy": None, "vs_tflops": None}


def test_make_row_memory_bound() -> None:
    s = pg.Shape("decode", 16, 32, 8192)
    kv = pg.kv_bytes(s.lengths())
    ms = {"ours_ro": kv / 3.9e9, "ours_w": kv / 3.8e9, "flashmla": kv / 3.7e9}  # 3900 GB/s ...
    r = pg.make_row(s, 1, ms, 4200.0, 790.0, agree=True, rel_fro=2e-3)
    assert r["case"] == s.case and r["metric"] == "GB/s" and r["peer"] == "flashmla"
    assert r["ours"] == pytest.approx(3900, rel=1e-6) and r["peer_value"] == pytest.approx(3700, rel=1e-6)
    assert r["ratio"] == pytest.approx(3900 / 3700, abs=1e-3)
    assert r["write_ratio"] == pytest.approx(3800 / 3700, abs=1e-3)
    assert r["of_ceiling"] == pytest.approx(3900 / 4200, abs=1e-3)
    assert r["vs_flashmla"] == "pass" and r["vs_copy"] == "pass" and r["vs_tflops"] is None
    assert r["timing"] == "1/replay" and r["rel_fro"] == 2e-3
    r8 = pg.make_row(s, 8, {**ms, "ours_ro": kv / 3.0e9}, 4200.0, 790.0)
    assert r8["case"].endswith(" 8/graph") and r8["timing"] == "8/graph"
    assert r8["vs_flashmla"] == "FAIL" and r8["vs_copy"] == "FAIL"


def test_make_row_compute_bound_and_without_peer() -> None:
    s = pg.Shape("decode", 128, 128, 32768)
    fl = pg.flops(128, s.lengths(), 1)
    r = pg.make_row(s, 1, {"ours_ro": fl / 570e9, "ours_w": fl / 565e9, "flashmla": None},
                    4200.0, 790.0)
    assert r["metric"] == "TFLOP/s" and r["ours"] == pytest.approx(570, rel=1e-6)
    assert r["peer"] == "none" and r["ratio"] is None and r["vs_flashmla"] is None
    assert r["vs_tflops"] == "pass" and r["of_gemm"] == pytest.approx(570 / 790, abs=1e-3)
    slow = pg.make_row(s, 1, {"ours_ro": fl / 500e9, "ours_w": fl / 490e9, "flashmla": fl / 560e9},
                       None, None)
    assert slow["vs_tflops"] == "FAIL" and slow["of_ceiling"] is None and slow["vs_flashmla"] == "FAIL"


def test_a_disagreeing_row_fails_against_flashmla() -> None:
    s = pg.Shape("decode", 16, 32, 8192)
    r = pg.make_row(s, 1, {"ours_ro": 1e-3, "ours_w": 1e-3, "flashmla": 2e-3}, None, None,
                    agree=False, rel_fro=0.5)
    assert r["ratio"] == 2.0 and r["vs_flashmla"] == "FAIL"


def test_markdown_section() -> None:
    s = pg.Shape("decode", 16, 32, 8192)
    rows = [pg.make_row(s, k, {"ours_ro": 1e-1, "ours_w": 1.1e-1, "flashmla": 0.9e-1}, 4000.0,
                        700.0, rel_fro=1e-3) for k in (1, 8)]
    rows.append({"bench": "paged", "case": "x", "metric": "error", "ours": 0, "peer": "E",
                 "peer_value": None, "ratio": None})
    rows.append(pg.make_row(pg.Shape("prefill", 128, 1, 512, 256), 1,
                            {"ours_ro": 1e-3, "ours_w": 1e-3, "flashmla": None}, 4000.0, 700.0))
    md = pg.markdown_section(rows, {"paged_copy_GBps": 4000.0, "paged_gemm_TFLOPs": 700.0})
    lines = md.strip().splitlines()
    table = [ln for ln in lines if ln.startswith("| ")]
    assert len(table) == 1 + 3  # header + two timings + prefill; the error row is left out
    assert all(ln.count("|") == table[0].count("|") for ln in table)
    assert "copy 4000.0 GB/s" in md and "FAIL" in md and " 8/graph" in md and "1.0e-03" in md


def test_pool_fits_every_row() -> None:
    shapes = pg.grid(False)
    nb = pg.pool_blocks(shapes, L2)
    for s in shapes:
        _, used = pg.block_tables(s.lengths(), pg.sets_for(s, L2), seed=0)
        assert used <= nb
    assert nb * 64 * 576 * 2 < 6e9  # the largest row's cache, ~4.8 GB
    assert pg.sets_for(pg.Shape("decode", 16, 1, 4096), L2) == pg.MAX_SETS


def test_flashmla_peer_absent_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNRT_FLASHMLA_DIR", str(tmp_path / "nowhere"))
    lines: list[str] = []
    assert fp.load(lines.append, (9, 0)) is None
    assert len(lines) == 1 and "not found" in lines[0] and "nowhere" in lines[0]
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "build_flashmla.py").write_text("raise SystemExit('must not be imported')\n")
    monkeypatch.setenv("ATTNRT_FLASHMLA_DIR", str(kit))
    lines.clear()
    assert fp.load(lines.append, (8, 0)) is None
    assert len(lines) == 1 and "sm_90a" in lines[0]


class _T:
    """A numpy-backed stand-in for the torch tensors the wrapper views and reshapes."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def view(self, *shape: int) -> _T:
        return _T(self.a.reshape(shape))

    reshape = view


def test_flashmla_wrapper_passes_metadata_back() -> None:
    calls: list[tuple] = []

    class Mod:
        def dense_decode_fwd(self, q, kc, dv, seqlens, bt, scale, causal, md, ns):
            calls.append((q.a.shape, dv, scale, causal, md, ns))
            B, s_q, H, _ = q.a.shape
            out = _T(np.arange(B * s_q * H * dv, dtype=np.float32).reshape(B, s_q, H, dv))
            return out, None, md or "MD", ns or "NS"

    f = fp.FlashMLA(Mod(), "seqlens", B=3, s_q=2, H=16, scale=0.5)
    q = _T(np.zeros((3 * 2, 16 * 576)))
    out = f(q, "kc", "bt")
    assert out.a.shape == (6, 16 * 512)
    f(q, "kc", "bt")
    assert calls[0] == ((3, 2, 16, 576), 512, 0.5, True, None, None)
    assert calls[1][4:] == ("MD", "NS")  # the scheduling metadata is passed back
    one = fp.FlashMLA(Mod(), "seqlens", B=1, s_q=1, H=16, scale=0.5)
    one(_T(np.zeros((1, 16 * 576))), "kc", "bt")
    assert calls[-1][3] is False  # one token: not causal


def test_bench_paged_imports_without_a_gpu() -> None:
    import bench_paged

    assert callable(bench_paged.run) and bench_paged.markdown_section is pg.markdown_section
