"""The benchmark tools (tools/) and the lab scripts (lab/) import and parse their arguments on a
machine without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("tool, words", [
    pytest.param("lab/read_floor.py", "read floor of attention decode", marks=pytest.mark.slow),
    ("tools/bench_spread.py", "spread of repeated bench.py runs"),
    pytest.param("lab/gather_ceiling.py", "gather IndexShare", marks=pytest.mark.slow),
    pytest.param("lab/trace_index_share.py", "decode cluster kernel", marks=pytest.mark.slow),
    pytest.param("lab/graph_gap.py", "one-kernel graph, by kernel shape", marks=pytest.mark.slow),
    pytest.param("lab/rc_cluster_probe.py", "follow cp.async copies", marks=pytest.mark.slow),
    pytest.param("lab/rc_named_barrier_probe.py", "named barrier split into",
                 marks=pytest.mark.slow),
    pytest.param("lab/paged_pair_trace.py", "one steady-state pair", marks=pytest.mark.slow),
    ("lab/with_defines.py", "extra -D defines on the wgmma kernels"),
    ("lab/sass_census.py", "Count the SASS of a kernel by opcode and by loop"),
    pytest.param("lab/wg_child.py", "wgmma child test", marks=pytest.mark.slow),
    ("lab/with_l2_promotion.py", "another L2 promotion"),
    ("lab/with_part_overhead.py", "fixed cost as another number of key tiles"),
    ("lab/heads_n_probe.py", "heads are the wgmma N"),
    ("tools/plan_snapshot.py", "IndexShare's plan for a grid"),
    ("lab/sweep_attention.py", "Attention paths on the GPU"),
    ("tools/bench.py", "back-to-back calls before each timed"),
    ("tools/readme_numbers.py", "headline table")])
def test_tool_help(tool: str, words: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / tool), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert words in " ".join(r.stdout.split()), r.stdout


def test_with_part_overhead_reaches_the_launch_and_the_guard(tmp_path: Path) -> None:
    """lab/with_part_overhead.py N: the name the launch uses and the int32 guard's both
    return N, the host's split model is untouched."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from attnrt.ops.paged_attention import balanced, kernel, plan\n"
        "c = plan.PagedAttentionConfig()\n"
        "print(kernel.partition_overhead(c), balanced.partition_overhead(c), c.wg_cost)\n")
    r = subprocess.run([sys.executable, str(ROOT / "lab" / "with_part_overhead.py"), "5",
                        str(probe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("5 5 SplitCost(tile_us=2.0, prologue_us=3.0"), r.stdout


def test_sass_census_finds_loops_not_slow_paths(capsys) -> None:
    """lab/sass_census.py on a made-up listing: the loop around the HGMMA is one, the
    mbarrier retry placed after the body (a short block branching back) is not."""
    sys.path.insert(0, str(ROOT / "lab"))
    import sass_census

    text = """.L_x_1:
        /*0000*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0010*/                   IADD3 R1, R1, 0x1, RZ ;
        /*0020*/              @P0 BRA `(.L_x_1) ;
        /*0030*/                   EXIT ;
.L_x_2:
        /*0040*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R0], R3 ;
        /*0050*/                   BRA `(.L_x_1) ;
"""
    assert sass_census.census(text.splitlines()) == [(0, 2, 1)]
    out = capsys.readouterr().out
    assert "instructions: 6" in out and "innermost loop with HGMMA: [0..2] 3 insns" in out
    assert sass_census.op_class("UTMALDG.2D") == "tma/mbar"


@pytest.mark.parametrize("value", ["-1", "inf", "nan"])
def test_bench_refuses_bad_warm_up(value: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench.py"), "index_share",
                        "--warm-ms", value], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--warm-ms: must be a finite number >= 0" in r.stderr, r.stderr


def test_plan_snapshot_quick(tmp_path: Path) -> None:
    """The planner snapshot (for refactors that must not change a plan) is deterministic,
    holds plans and refusals, and a changed planner shows in it."""
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "plan_snapshot.py"), "--quick",
                        str(tmp_path / "a.txt")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "38976 calls" in r.stdout, (r.stdout, r.stderr)
    a = (tmp_path / "a.txt").read_text().splitlines()
    assert len(a) == 38976
    assert any("-> _Plan(path='wg'" in s and "index_share_ws.cu" in s for s in a)
    assert any("-> KernelError:" in s for s in a)
    sys.path.insert(0, str(ROOT / "tools"))
    import plan_snapshot

    from attnrt.ops.index_share import splitk

    saved = splitk._WS_SPLIT_ITEM_TILES
    try:
        splitk._WS_SPLIT_ITEM_TILES = 0  # a rule change: some plans move
        b = plan_snapshot.snapshot(quick=True)
    finally:
        splitk._WS_SPLIT_ITEM_TILES = saved
    assert plan_snapshot.snapshot(quick=True) == a
    assert len(b) == len(a) and b != a


@pytest.mark.parametrize("args", [["--impls", "wg,wg-s3"], ["--impls", "wg-s0k64,fused"],
                                  ["--worker", "wg-s5"]])
def test_sweep_attention_refuses_removed_schedules(args: list[str]) -> None:
    """Schedules 0-5 left attention_wg.cu: the sweep names them and the note that has them."""
    r = subprocess.run([sys.executable, str(ROOT / "lab" / "sweep_attention.py"), *args],
                       capture_output=True, text=True, timeout=120)
    bad = [a for a in args[1].split(",") if a.startswith("wg-s")]
    assert r.returncode == 2, r.stderr
    assert f"{bad[0]}: schedules 0-5" in r.stderr and "lab/attention_wg_schedules.md" in r.stderr
    assert (ROOT / "lab" / "attention_wg_schedules.md").is_file()


def test_sweep_attention_schedules_compile_in_source() -> None:
    """Every schedule the sweep can force is one attention_wg.cu accepts, and none it refuses
    is (the source's #error names the same note)."""
    import re
    from unittest import mock

    sys.path.insert(0, str(ROOT / "lab"))
    try:
        with mock.patch.dict(os.environ):  # it points ATTNRT_CACHE_DIR at its own cache
            import sweep_attention
    finally:
        sys.path.remove(str(ROOT / "lab"))
    src = (ROOT / "attnrt" / "ops" / "cuda" / "attention_wg.cu").read_text()
    m = re.search(r"NXRT_WG_SCHED != (\d+) && NXRT_WG_SCHED != (\d+)", src)
    assert m and {int(m.group(1)), int(m.group(2))} == set(sweep_attention.WG_SCHEDULES)
    assert not set(sweep_attention.REMOVED_SCHEDULES) & set(sweep_attention.WG_SCHEDULES)
    assert sweep_attention.REMOVED_NOTE in src
    assert sweep_attention.removed_impls(["wg", "wg-s6", "wg-s7k176", "wg-s4", "wg-s1k64"]) == [
        "wg-s4", "wg-s1k64"]


@pytest.mark.slow
def test_graph_gap_refuses_bad_spin() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "lab" / "graph_gap.py"), "--spin-us", "5",
                        "inf"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "numbers in [0, 100000]" in r.stderr, r.stderr


def test_graph_gap_kernel_compiles() -> None:
    """Every shape graph_gap.py launches compiles for sm_90 (clusters, griddepcontrol)."""
    sys.path.insert(0, str(ROOT / "lab"))
    from graph_gap import SRC

    from attnrt.runtime.compiler import compile_source

    for cl in (0, 1):
        for pdl in (0, 1):
            c = compile_source(SRC, "graph_gap.cu", "sm_90", [f"-DGG_CLUSTER={cl}",
                                                               f"-DGG_PDL={pdl}"], {})
            ptx = c.ptx if isinstance(c.ptx, str) else c.ptx.decode()
            assert "spin_kernel" in ptx and ("griddepcontrol.wait" in ptx) == bool(pdl)
            assert (".reqnctapercluster" in ptx) == bool(cl)


@pytest.mark.slow
def test_rc_cluster_probe_compiles() -> None:
    """The racecheck probe's two-CTA kernel compiles for sm_90 with a cluster shape, every
    mode's instructions present; a mode outside 0-4 is refused before any device work."""
    sys.path.insert(0, str(ROOT / "lab"))
    from rc_cluster_probe import SRC

    from attnrt.runtime.compiler import compile_source

    c = compile_source(SRC, "rc_cluster_probe.cu", "sm_90", [], {})
    ptx = c.ptx if isinstance(c.ptx, str) else c.ptx.decode()
    assert ".reqnctapercluster" in ptx
    for op in ("cp.async.wait_group", "cp.async.mbarrier.arrive.noinc", "st.shared::cluster",
               "barrier.cluster.arrive.release", "bar.sync"):
        assert op in ptx, op
    r = subprocess.run([sys.executable, str(ROOT / "lab" / "rc_cluster_probe.py"), "5"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "invalid choice" in r.stderr, r.stderr


def test_heads_n_probe_compiles() -> None:
    """The heads-as-N probe builds for sm_90a with no ptxas advisory (a serialized wgmma
    would void its timing): 36 m64n16k16 wgmmas for S^T and 32 transposed-A ones for O^T."""
    import warnings

    from attnrt.ops import _common
    from attnrt.runtime.compiler import compile_source

    src = (ROOT / "lab" / "heads_n_probe.cu").read_text()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = compile_source(src, "heads_n_probe.cu", "sm_90a", [], _common.headers())
    ptx = c.ptx if isinstance(c.ptx, str) else c.ptx.decode()
    mma = [ln for ln in ptx.splitlines() if "wgmma.mma_async" in ln]
    assert len(mma) == 68 and all("m64n16k16" in ln for ln in mma)
    assert sum(ln.rstrip().endswith("1, 0;") for ln in mma) == 32  # imm-trans-a on O^T's
    assert c.cubin.startswith(b"\x7fELF")


def test_read_floor_kernel_compiles() -> None:
    """The kernel read_floor.py launches (gather_ceiling's read_seq) compiles for sm_80/90."""
    sys.path.insert(0, str(ROOT / "lab"))
    from gather_ceiling import SRC

    from attnrt.runtime.compiler import compile_source

    for arch in ("sm_80", "sm_90"):
        c = compile_source(SRC, "gather_ceiling.cu", arch, ["-DUNROLL=4"], {})
        assert b"read_seq" in (c.ptx if isinstance(c.ptx, bytes) else c.ptx.encode())


def test_trace_index_share_specs(tmp_path: Path) -> None:
    """Cases and variant specs parse as documented; a bad one is refused with its reason."""
    sys.path.insert(0, str(ROOT / "lab"))
    from trace_index_share import parse_case, parse_variant

    assert parse_case("n128c8k") == dict(kind="decode", b=64, sq=1, n=128, nkv=1, cache=8192)
    assert parse_case("n64c64k")["cache"] == 65536
    with pytest.raises(ValueError, match="n<heads>c<cache"):
        parse_case("128x8k")
    v = parse_variant("a:kt=64,trace=1,pdl=0,DIS_PREG=64")
    assert (v.name, v.knobs, v.trace, v.pdl) == ("a", {"kt": 64}, True, False)
    assert v.defines == {"IS_PREG": "64", "IS_TRACE": "1"}
    assert parse_variant("shipped").defines == {}
    for bad, why in (("a:kt", "KEY=VALUE"), ("a:trace=2", "0 or 1"), ("a:zz=1", "unknown key"),
                     ("a:cps=0", "cps must be >= 1"), ("a:cps=x", "invalid literal"),
                     ("a:src=/no/such/file.cu", "no file"), (":kt=64", "empty name")):
        with pytest.raises(ValueError, match=why):
            parse_variant(bad)
    assert parse_variant("u:cps=1152").cps == 1152
    assert parse_variant("shipped").cps is None
    # Switches taken out of the kernel are refused with the note that says where they are,
    # unless the variant builds an edited source (the old kernel from that note).
    for removed in ("DIS_DIAG=1", "DIS_XSPLIT=0"):
        with pytest.raises(ValueError, match="index_share_ws_switches.md"):
            parse_variant(f"x:{removed}")
    (tmp_path / "old.cu").write_text("// the kernel at the note's commit\n")
    old = parse_variant(f"x:src={tmp_path / 'old.cu'},DIS_DIAG=2")
    assert old.defines == {"IS_DIAG": "2"}
    with pytest.raises(ValueError, match="trace=1"):
        parse_variant("x:DIS_TRACE=1")


@pytest.mark.slow
def test_trace_index_share_cps_hook() -> None:
    """``cps=`` re-splits the decode cluster plan (split 0 takes cps keys, shared memory
    re-sized for them) and refuses a split that is not whole tiles, is below half of top-k
    (the kernel would drop keys) or not below it, needs more shared memory than the device
    has, or a plan without the cluster merge."""
    import importlib
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT / "lab"))
    sys.path.insert(0, str(ROOT / "tests"))
    from test_index_share_cpu import _geom

    from attnrt.ops import _common
    from attnrt.ops.index_share import DeviceLimits, IndexShareConfig, builds, kernel, splitk

    def plan(g):  # as the kernel plans (through the module attribute the tool replaces)
        return kernel.make_plan(g, DeviceLimits(132, sm90a=True), aligned16=True,
                                capacity_scratch=False, config=IndexShareConfig(path="wg"))

    saved = (kernel.make_plan, splitk._ws_variant, _common.get_function)
    try:
        trace = importlib.import_module("trace_index_share")
        hooks = trace._Hooks(SimpleNamespace(launch=lambda *a, **k: None))
        g = _geom(128)  # B 64, N 128, top-k 2048: the cluster plan
        base = plan(g)
        assert base.merge == "cluster" and base.cps == 1024
        hooks.cps = 1152
        p = plan(g)
        assert (p.cps, p.splits, p.merge) == (1152, 2, "cluster")
        assert p.smem == builds._ws_smem(128, 1152, 0, 1, 128) > base.smem
        # Not whole tiles; all of top-k; below half (split 1 would lose keys).
        for bad in (1000, 2048, 512):
            hooks.cps = bad
            with pytest.raises(ValueError, match="multiple of the 128-key tile"):
                plan(g)
        hooks.cps = 1280  # 232832 bytes of shared memory at head size 128: over 227 KiB
        with pytest.raises(ValueError, match="232832 bytes"):
            plan(g)
        hooks.cps = 1152  # a plan without the two-CTA merge: refused, not silently ignored
        for b in (1, 100):  # eight-CTA clusters; one split
            with pytest.raises(ValueError, match="two-CTA decode cluster plan"):
                plan(_geom(128, b=b))
    finally:
        kernel.make_plan, splitk._ws_variant, _common.get_function = saved


def _ws_bf16_hd128_builds() -> tuple[list, object, object]:
    """The bf16 head-size-128 ws variants the trace tool builds from: the cluster builds
    (128- and 64-key tiles), the 128-key one, and the plain (non-cluster, non-Q2) build."""
    from attnrt.ops import index_share

    ws = [v for v in index_share.compile_variants() if v.file == "index_share_ws.cu"
          and v.defines["IS_DTYPE"] == 2 and v.defines["IS_HD"] == 128]
    clusters = [v for v in ws if v.defines.get("IS_CLUSTER")]
    cluster = next(v for v in clusters if "IS_KT" not in v.defines)
    plain = next(v for v in ws if not v.defines.get("IS_CLUSTER") and not v.defines.get("IS_Q2"))
    return clusters, cluster, plain


@pytest.mark.slow
def test_trace_build_compiles() -> None:
    """The traced builds the tool asks for (the kernel with lab/index_share_trace.cuh in place
    of the package's no-op hooks) compile (cluster builds, sm_90a) with their wgmmas kept
    asynchronous and stamp %globaltimer and %clock64 (and %smid once); the shipped build has
    none of them; the non-cluster build refuses the trace (its part_o holds the split partials)."""
    sys.path.insert(0, str(ROOT / "lab"))
    from trace_index_share import trace_headers

    from attnrt.ops import _common
    from attnrt.runtime import compiler
    from attnrt.runtime.compiler import CompileError, compile_source

    clusters, cluster, plain = _ws_bf16_hd128_builds()  # clusters: 128- and 64-key tiles
    src = _common.source("index_share_ws.cu")
    assert len(clusters) == 2
    for v in clusters:  # (the 128-key one with the split last P V, IS_XSPLIT)
        c = compile_source(src, "index_share_ws.cu", "sm_90a", [*v.options, "-DIS_TRACE=1"],
                           trace_headers(True))
        ptx = c.ptx.decode() if isinstance(c.ptx, bytes) else c.ptx
        assert ptx.count("%globaltimer") >= 8
        assert ptx.count("%clock64") == ptx.count("%globaltimer")  # a cycle count per stamp
        assert ptx.count("%smid") == 1  # the CTA's SM, in one stamp's cycle word
        # A trace of a build whose wgmmas ptxas serialised (C7511) would time another kernel.
        assert not compiler.performance_loss(c.log), c.log
    assert trace_headers(False) == _common.headers()
    for opts in (list(cluster.options), [*cluster.options, "-DIS_TRACE=1"]):
        # no stamps from the package's header, whatever the defines
        shipped = compile_source(src, "index_share_ws.cu", "sm_90a", opts, _common.headers(),
                                 cubin=False)
        sp = shipped.ptx.decode() if isinstance(shipped.ptx, bytes) else shipped.ptx
        assert "%globaltimer" not in sp and "%clock64" not in sp
    with pytest.raises(CompileError, match="IS_TRACE"):
        compile_source(src, "index_share_ws.cu", "sm_90a", [*plain.options, "-DIS_TRACE=1"],
                       trace_headers(True), cubin=False)


@pytest.mark.slow
def test_pair_trace_build_compiles() -> None:
    """The pair kernel's lab trace build (PA_PAIR_TRACE=1, lab/paged_pair_trace.py) compiles
    for sm_90a with its wgmmas kept asynchronous and reads the SM clock; the shipped build
    does not."""
    from attnrt.ops import _common
    from attnrt.ops.paged_attention import builds
    from attnrt.runtime import compiler
    from attnrt.runtime.api import DataType
    from attnrt.runtime.compiler import compile_source

    v = builds.wg_variant(DataType.BFLOAT16, schedule="pair")
    src = _common.source(v.file)
    traced = compile_source(src, v.file, "sm_90a", [*v.options, "-DPA_PAIR_TRACE=1"],
                            _common.headers())
    ptx = traced.ptx.decode() if isinstance(traced.ptx, bytes) else traced.ptx
    assert "%clock" in ptx
    assert not compiler.performance_loss(traced.log), traced.log
    shipped = compile_source(src, v.file, "sm_90a", list(v.options), _common.headers(),
                             cubin=False)
    sp = shipped.ptx.decode() if isinstance(shipped.ptx, bytes) else shipped.ptx
    assert "%clock" not in sp


def test_cluster_merge_partials_path() -> None:
    """The four-CTA cluster merge (IS_CMERGE 4) reads its partials from L2 (no
    distributed-shared-memory stores); the eight-CTA one, as shipped (IS_CMDS), hands them
    over through distributed shared memory (stores into the partners' rings, no global
    partial loads, two cluster barriers more: NOTES, IndexShare rounds 21-22). Either form
    builds for either size (for A/Bs); IS_CMDS without IS_CMERGE is refused."""
    from attnrt.ops import _common
    from attnrt.ops.index_share import builds
    from attnrt.runtime.api import DataType
    from attnrt.runtime.compiler import CompileError, compile_source

    src = _common.source("index_share_ws.cu")

    def counts(c: int, cmds: int) -> tuple[int, int, int]:
        v = builds._ws_variant(DataType.BFLOAT16, 128, 0, c)
        assert v.defines.get("IS_CMDS", 0) == (c == 8), v.defines
        defines = {**v.defines, "IS_CMDS": cmds}
        r = compile_source(src, v.file, "sm_90a", list(_common.defines_to_options(defines)),
                           _common.headers(), cubin=False)
        p = r.ptx.decode() if isinstance(r.ptx, bytes) else r.ptx
        return (p.count("st.shared::cluster"), p.count("ld.global.cg"),
                p.count("barrier.cluster.arrive"))

    for c in (8, 4):
        ds, l2, bars = counts(c, 0)
        assert ds == 0 and l2 > 0, (c, ds, l2)
        ds_on, l2_on, bars_on = counts(c, 1)
        # (the first of the two extra cluster barriers with the producer too, for racecheck)
        assert ds_on > 0 and l2_on == 0 and bars_on == bars + 2, (c, ds_on, l2_on, bars_on, bars)
    plain = builds._ws_variant(DataType.BFLOAT16, 128)
    with pytest.raises(CompileError, match="IS_CMDS"):
        compile_source(src, plain.file, "sm_90a", [*plain.options, "-DIS_CMDS=1"],
                       _common.headers(), cubin=False)


def _bench_module():
    sys.path.insert(0, str(ROOT / "tools"))
    import bench

    return bench


def test_bench_failed_rows() -> None:
    """A benchmark or case that raised leaves an "error" row, which makes bench.py exit 1
    (gpu_check.sh reports it); a skipped peer ("none") and measured rows do not."""
    bench = _bench_module()
    rows = [bench.row("index_share", "decode", "1/ms", 40.0, "torch", 4.0),
            bench.row("attention", "skipped", "none", 0, "torch", None, error="torch unavailable"),
            bench.row("index_share", "{'kind': 'prefill'}", "error", 0, "CompileError", None,
                      error="index_share_ws.cu(528): error: identifier \"cl_rank\" is undefined")]
    assert bench.failed_rows(rows) == [rows[2]]
    assert bench.failed_rows(rows[:2]) == []


def test_smi_samples_summary() -> None:
    """nvidia-smi's csv lines become the sustained-state summary: junk lines are skipped, a
    reading equal to the one before it counts once, samples before ``since`` are left out."""
    import datetime as dt

    bench = _bench_module()
    text = ("2026/12/01 10:00:00.000, 1980, 300.0, 0x0000000000000001\n"  # before `since`
            "2026/12/01 10:00:00.100, 1785, 632.10, 0x0000000000000004\n"
            "2026/12/01 10:00:00.110, 1785, 632.10, 0x0000000000000004\n"  # a repeat
            "2026/12/01 10:00:00.200, 1980, 415.2, 0x0000000000000000\n"
            "2026/12/01 10:00:00.250, [N/A], [N/A], [N/A]\nFailed to initialize NVML\n"
            "1395, 709.0, 0x4\n"  # no timestamp
            "2026/12/01 10:00:00.300, 1395, 709.0, 0x0000000000000004\n")
    since = dt.datetime(2026, 12, 1, 10, 0, 0, 50_000)
    got = bench.parse_smi_samples(text, since)
    assert got == {"samples": 3, "sm_clock_mhz_min": 1395.0, "sm_clock_mhz_median": 1785.0,
                   "power_w_median": 632.1, "power_w_max": 709.0, "throttle": ["sw_power_cap"]}
    assert bench.parse_smi_samples(text)["throttle"] == ["gpu_idle", "sw_power_cap"]
    assert bench.parse_smi_samples(text)["samples"] == 4
    assert bench.parse_smi_samples("") is None
    assert bench.parse_smi_samples("No devices were found\n") is None
    assert bench.throttle_names(0) == []
    assert bench.throttle_names(0x4 | 0x40 | 0x1000) == ["sw_power_cap", "hw_thermal_slowdown",
                                                         "0x1000"]


def _fake_smi(tmp_path: Path, loop_body: str, instant: bool = True) -> Path:
    """A stand-in nvidia-smi: answers the one-shot power-field query (or refuses
    power.draw.instant), logs the sampling call's arguments, then runs ``loop_body``."""
    fake = tmp_path / "nvidia-smi"
    refuse = ("*power.draw.instant*) echo 'Field \"power.draw.instant\" is not a valid field "
              "to query.'; exit 2;; " if not instant else "")
    fake.write_text("#!/usr/bin/env bash\n"
                    f"case \"$*\" in *-lms*) ;; {refuse}*) echo '123.4'; exit 0;; esac\n"
                    f"echo \"$@\" > {tmp_path / 'args'}\n"
                    "now() { date +'%Y/%m/%d %H:%M:%S.%3N'; }\n" + loop_body)
    fake.chmod(0o755)
    return fake


def test_device_sampler_reads_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler starts nvidia-smi with the query, waits for its first sample, and
    summarises every line it printed after mark(), however it wrote them (three lines in one
    write here); a driver without power.draw.instant is read through power.draw."""
    bench = _bench_module()
    bench.DeviceSampler._fields.clear()
    _fake_smi(tmp_path, "echo \"$(now), 1980, 100.0, 0x1\"\nsleep 0.3\n"
              "printf '%s\\n' \"$(now), 1700, 699.5, 0x4\" \"$(now), 1710, 650.0, 0x4\" "
              "\"$(now), 1720, 600.0, 0x0\"\nexec sleep 60\n", instant=False)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with bench.DeviceSampler("GPU-0123", period_ms=10) as smp:
        time.sleep(0.1)
        smp.mark()
        time.sleep(0.5)
    assert smp.summary == {"samples": 3, "sm_clock_mhz_min": 1700.0,
                           "sm_clock_mhz_median": 1710.0, "power_w_median": 650.0,
                           "power_w_max": 699.5, "throttle": ["sw_power_cap"],
                           "power_field": "power.draw"}
    args = (tmp_path / "args").read_text().split()
    assert "--query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active" in args
    assert "--id=GPU-0123" in args and "-lms=10" in args


def test_device_sampler_prefers_instant_power(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where nvidia-smi has power.draw.instant (not a one-second average), that is read."""
    bench = _bench_module()
    bench.DeviceSampler._fields.clear()
    _fake_smi(tmp_path, "while true; do echo \"$(now), 1830, 688.0, 0x4\"; sleep 0.01; done\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with bench.DeviceSampler(None) as smp:
        time.sleep(0.1)
    assert smp.summary is not None and smp.summary["power_field"] == "power.draw.instant"
    assert smp.summary["samples"] == 1  # one reading, repeated
    assert "--query-gpu=timestamp,clocks.sm,power.draw.instant,clocks_throttle_reasons.active" \
        in (tmp_path / "args").read_text().split()


def test_device_sampler_without_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench_module()
    monkeypatch.setenv("PATH", str(tmp_path))
    with bench.DeviceSampler(None) as smp:
        pass
    assert smp.cmd is None and smp.summary is None


def test_device_sampler_gives_up_on_a_silent_nvidia_smi(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An nvidia-smi that prints nothing does not hang the bench: no sample, no summary."""
    bench = _bench_module()
    _fake_smi(tmp_path, "exec sleep 60\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    t0 = time.perf_counter()
    with bench.DeviceSampler(None, first_s=0.3) as smp:
        pass
    assert smp.summary is None and time.perf_counter() - t0 < 10


def test_sustained_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sustained_state runs the call back to back for state_ms with nvidia-smi sampling from
    before the run (no idle gap) and summarises what came after the first 20 %; None when
    state_ms is 0 or the device's UUID is unknown."""
    bench = _bench_module()
    bench.DeviceSampler._fields.clear()
    _fake_smi(tmp_path, "while true; do echo \"$(now), 1800, $RANDOM, 0x4\"; sleep 0.02; done\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    ctx = bench.BenchContext.__new__(bench.BenchContext)  # no device: the parts it uses
    calls = []
    ctx.warm_ms, ctx.state_ms = 25.0, 300.0
    ctx.gpu_uuid = lambda: "GPU-x"
    t0 = time.perf_counter()
    st = ctx.sustained_state(lambda: calls.append(1), lambda: None)
    took = time.perf_counter() - t0
    assert st is not None and st["sm_clock_mhz_median"] == 1800.0 and len(calls) > 10
    # ~240 ms of 20 ms samples after the mark: fewer on a slow machine, and more only as far
    # as a loaded machine stretched the run (the fake prints at most one line per 20 ms).
    assert 3 <= st["samples"] <= max(13, took / 0.02 + 2), (st["samples"], took)
    assert "--id=GPU-x" in (tmp_path / "args").read_text().split()
    ctx.gpu_uuid = lambda: None
    assert ctx.sustained_state(lambda: None, lambda: None) is None
    ctx.gpu_uuid, ctx.state_ms = (lambda: "GPU-x"), 0.0
    assert ctx.sustained_state(lambda: None, lambda: None) is None


@pytest.mark.parametrize("value", ["-5", "inf"])
def test_bench_refuses_bad_state_ms(value: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench.py"), "index_share",
                        "--state-ms", value], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--state-ms: must be a finite number >= 0" in r.stderr, r.stderr


def test_trace_stats_medians_and_timer_step() -> None:
    """_stats on synthetic stamps: phases relative to the first CTA's start, the latest CTA,
    the partners' loop-end skew and the timer's step (stamps on a 256 ns grid)."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "lab"))
    from trace_index_share import PHASES, _stats

    reps = []
    for r in range(3):
        a = np.zeros((4, len(PHASES)), dtype=np.int64)
        base = 10_000_000 * (r + 1) + 256 * np.array([0, 0, 1, 1])  # two clusters
        for k in range(len(PHASES)):
            a[:, k] = base + 256 * (4 * k)
        a[1, 7] += 512  # CTA 1's loop end two steps after its partner's (CTA 0)
        a[:, 15] = 0  # a phase no CTA stamps
        reps.append(a)
    st = _stats(reps, np)
    assert st["timer_step_ns"] == 256
    assert "staged_w2" not in st["median"] and "staged_w1" in st["median"]
    assert st["median"]["start"] == 0.128 and st["last"]["start"] == 0.256
    assert st["median"]["loop_w2"] == 7.424  # 7.168 + the CTAs' offsets 0, 0.512, 0.256, 0.256
    assert st["partner_skew_max"] == 0.512


def test_trace_sm_clock() -> None:
    """_sm_clock: cycles over ns between each CTA's first and last stamp, in MHz; CTAs with
    one stamp or less than 5 us between their stamps are left out."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "lab"))
    from trace_index_share import PHASES, _sm_clock

    n = len(PHASES)
    t = np.zeros((4, n), dtype=np.int64)
    c = np.zeros((4, n), dtype=np.int64)
    t[0, [0, 3, 10]] = [1_000_000, 1_010_000, 1_020_000]  # 20 us at 1980 MHz
    c[0, [0, 3, 10]] = [5_000, 5_000 + 19_800, 5_000 + 39_600]
    t[1, [0, 11]] = [1_000_256, 1_020_256]  # 20 us at 1700 MHz
    c[1, [0, 11]] = [7, 7 + 34_000]
    t[2, 0], c[2, 0] = 1_000_000, 1  # one stamp
    t[3, [0, 1]] = [1_000_000, 1_004_096]  # 4.1 us: too short for the timer's step
    c[3, [0, 1]] = [0, 9_999]
    got = _sm_clock([t], [c], np)
    assert got == {"sm_clock_mhz_median": 1840, "sm_clock_mhz_min": 1700, "sm_clock_mhz_max": 1980}
    assert _sm_clock([t[2:]], [c[2:]], np)["sm_clock_mhz_median"] is None


def test_trace_smid_and_latest_sms() -> None:
    """_split_smid takes the SM id out of stamp SMID_STAMP's cycle word (its top 8 bits) and
    leaves the cycle count; _late_sms counts the SMs of each replay's latest CTAs and lists the SMs no
    CTA ran on."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "lab"))
    from trace_index_share import PHASES, SMID_SHIFT, SMID_STAMP, _late_sms, _sm_clock, _split_smid

    n = len(PHASES)
    words = np.zeros((3, n), dtype=np.int64)
    for cta, (sm, cyc) in enumerate([(0, 123), (131, 5 << 40), (7, 1)]):
        words[cta, SMID_STAMP] = np.uint64((sm << SMID_SHIFT) | cyc).astype(np.int64)
        words[cta, 3] = cyc + 1000
    cyc, sm = _split_smid(words)
    assert sm.tolist() == [0, 131, 7]
    assert cyc[:, SMID_STAMP].tolist() == [123, 5 << 40, 1]
    assert cyc[:, 3].tolist() == words[:, 3].tolist()
    assert words[1, SMID_STAMP] < 0  # the input keeps its packed word (a copy was split)
    none = np.zeros((1, n), dtype=np.int64)
    assert _split_smid(none)[1].tolist() == [-1]  # a CTA that never stamped
    # The cycle counts stay usable by _sm_clock once split.
    t = np.zeros((1, n), dtype=np.int64)
    t[0, [SMID_STAMP, 3]] = [1_000_000, 1_020_000]
    c = np.zeros((1, n), dtype=np.int64)
    c[0, SMID_STAMP] = np.uint64((9 << SMID_SHIFT) | 500).astype(np.int64)
    c[0, 3] = 500 + 36_000
    assert _sm_clock([t], [_split_smid(c)[0]], np)["sm_clock_mhz_median"] == 1800

    stamps, smids = [], []
    for r in range(3):
        a = np.zeros((5, n), dtype=np.int64)
        a[:, 0] = 1_000
        a[:, 11] = [5_000, 9_000 + r, 6_000, 8_000, 7_000]  # CTA 1 last, then 3, then 4
        stamps.append(a)
        smids.append(np.array([0, 2, 3, 5 if r < 2 else 6, 1]))
    got = _late_sms(stamps, smids, np, 8, n=2)
    assert got["latest_sms"] == [[2, 3], [5, 2], [6, 1]]
    assert got["idle_sms"] == [4, 7]  # 7: above every SM a CTA ran on


def test_bench_spread(tmp_path: Path) -> None:
    """bench_spread: per (bench, case, metric) in every run, median / min / max and the runs
    that met the target; rows missing from a run are left out; a bad file is refused."""
    sys.path.insert(0, str(ROOT / "tools"))
    from bench_spread import spread

    def run(commit: str, ratios: list[float], extra: bool = False) -> dict:
        rows = [{"bench": "b", "case": f"c{i}", "metric": "1/ms", "ours": 10 * r,
                 "peer_value": 10.0, "ratio": r} for i, r in enumerate(ratios)]
        if extra:
            rows.append({"bench": "b", "case": "only-here", "metric": "1/ms", "ours": 1.0,
                         "peer_value": None, "ratio": None})
        return {"commit": commit, "rows": rows}

    runs = [run("a", [9.9, 10.5]), run("b", [10.1, 10.4], extra=True), run("c", [9.8, 10.6])]
    got = spread(runs, target=10.0)
    assert [e["case"] for e in got] == ["c0", "c1"]
    assert got[0]["ratio"] == {"median": 9.9, "min": 9.8, "max": 10.1} and got[0]["met"] == 1
    assert got[1]["ours"]["median"] == 105.0 and got[1]["met"] == 3
    with pytest.raises(ValueError):
        spread([])
    files = []
    for i, r in enumerate(runs):
        f = tmp_path / f"r{i}.json"
        f.write_text(json.dumps(r))
        files.append(str(f))
    md = tmp_path / "s.md"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_spread.py"), *files,
                        "--target", "10", "--metric", "1/ms", "--md", str(md)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| b | c0 | 1/ms | 99 (98-101) | 10 (10-10) | 9.9 (9.8-10.1) | 1/3 |" in md.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_spread.py"), str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not a bench.py result" in r.stderr


def test_bench_spread_groups(tmp_path: Path) -> None:
    """--group / --by-gpu: one column per group (median ratio, min-max, runs at the target)
    and one over every run; rows missing from any run of any group are left out; files
    without gpu_uuid are refused by --by-gpu; --group refuses a second name or loose files."""
    sys.path.insert(0, str(ROOT / "tools"))
    from bench_spread import by_group, markdown_groups

    def run(uuid: str | None, ratios: list[float], extra: bool = False) -> dict:
        rows = [{"bench": "b", "case": f"c{i}", "metric": "1/ms", "ours": 10 * r,
                 "peer_value": 10.0, "ratio": r} for i, r in enumerate(ratios)]
        if extra:
            rows.append(dict(rows[0], case="only-here"))
        return {"commit": "x", "gpu_uuid": uuid, "rows": rows}

    g = {"A": [run("GPU-a", [10.2, 9.0]), run("GPU-a", [10.4, 9.2], extra=True)],
         "B": [run("GPU-b", [9.7, 9.4]), run("GPU-b", [9.9, 9.6]), run("GPU-b", [10.1, 9.8])]}
    names, rows = by_group(g, target=10.0)
    assert names == ["A", "B"] and [r["case"] for r in rows] == ["c0", "c1"]
    c0 = rows[0]
    assert c0["by"]["A"]["ratio"]["median"] == pytest.approx(10.3) and c0["by"]["A"]["met"] == 2
    assert c0["by"]["B"]["ratio"] == {"median": 9.9, "min": 9.7, "max": 10.1}
    assert c0["by"]["B"]["met"] == 1 and c0["all"]["met"] == 3 and c0["all"]["runs"] == 5
    assert c0["all"]["ratio"]["median"] == 10.1
    md = markdown_groups(names, rows, 10.0)
    assert "runs: A 2, B 3" in md
    assert "| b | c0 | 1/ms | 10.3 (10.2-10.4, 2/2) | 9.9 (9.7-10.1, 1/3) | 10.1 (9.7-10.4, 3/5) |" in md
    with pytest.raises(ValueError, match="at least one run"):
        by_group({"A": []})

    files = {}
    for name, runs in g.items():
        for i, r in enumerate(runs):
            f = tmp_path / f"{name}{i}.json"
            f.write_text(json.dumps(r))
            files.setdefault(name, []).append(str(f))
    tool = [sys.executable, str(ROOT / "tools" / "bench_spread.py")]
    r = subprocess.run([*tool, "--target", "10", "--group", "A", *files["A"], "--group", "B",
                        *files["B"]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| 10.3 (10.2-10.4, 2/2) | 9.9 (9.7-10.1, 1/3) |" in r.stdout
    r = subprocess.run([*tool, "--by-gpu", *files["A"], *files["B"]],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| b | c1 | 1/ms | 9.1 (9-9.2) | 9.6 (9.4-9.8) | 9.4 (9-9.8) |" in r.stdout
    assert "| GPU-a | GPU-b | all |" in r.stdout
    old = tmp_path / "old.json"
    old.write_text(json.dumps(run(None, [10.0, 10.0])))
    bad_calls = [(["--by-gpu", *files["A"], str(old)], "no gpu_uuid"),
                 (["--group", "A", *files["A"], "--group", "A", *files["B"]], "named twice"),
                 ([files["B"][0], "--group", "A", *files["A"]], "--group takes its files"),
                 (["--group", "A"], "a name and at least one file"),
                 ([], "no result files")]
    for args, msg in bad_calls:
        r = subprocess.run([*tool, *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)


def test_trace_dump_npz_and_json(tmp_path: Path) -> None:
    """--dump writes the same integer arrays as .npz or, for a .json name, as nested lists."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "lab"))
    from trace_index_share import write_dump

    rng = np.random.default_rng(7)
    arrays = {"n128c8k_a__stamps": rng.integers(0, 2**62, size=(3, 5, 16), dtype=np.int64),
              "n128c8k_a__smid": rng.integers(0, 132, size=(3, 5), dtype=np.int64)}
    write_dump(tmp_path / "t.npz", arrays)
    with np.load(tmp_path / "t.npz") as z:
        assert sorted(z.files) == sorted(arrays)
        assert all(np.array_equal(z[k], v) for k, v in arrays.items())
    write_dump(tmp_path / "t.JSON", arrays)
    got = json.loads((tmp_path / "t.JSON").read_text())
    assert sorted(got) == sorted(arrays)
    assert all(np.array_equal(np.array(got[k], dtype=np.int64), v) for k, v in arrays.items())


def test_bench_markdown_names_the_board() -> None:
    """bench.py's table names the board when the result has its UUID (older results do not)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import bench

    res = {"gpu": "G", "date": "d", "commit": "c", "ceilings": {"copy_GBps": 1.0}, "rows": []}
    assert "board" not in bench.markdown(res)
    assert "commit `c`; board `GPU-1`; ceilings: copy_GBps = 1.0" in bench.markdown(
        dict(res, gpu_uuid="GPU-1"))


@pytest.mark.slow
@pytest.mark.parametrize("opt, value", [("--trace-warm-ms", "-1"), ("--state-ms", "inf")])
def test_trace_refuses_bad_ms(opt: str, value: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "lab" / "trace_index_share.py"), opt, value],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"{opt}: must be a finite number >= 0" in r.stderr, r.stderr


def test_bench_spread_refuses_a_row_twice() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    from bench_spread import markdown, spread

    row = {"bench": "b", "case": "c", "metric": "1/ms", "ours": 1.0, "peer_value": 1.0,
           "ratio": 1.0}
    with pytest.raises(ValueError, match="twice"):
        spread([{"rows": [row, dict(row)]}])
    got = spread([{"rows": [row]}], target=0.0)  # a target of 0 still counts
    assert got[0]["met"] == 1 and "1/1" in markdown(got, ["x"], 0.0)


def test_bench_spread_peer_filter(tmp_path: Path) -> None:
    """--peer keeps the rows whose peer starts with it: a result with a row per peer per case
    (IndexShare since commit b889e86) is refused without it and summarised per peer with it."""
    def run(fast: float, slow: float) -> dict:
        rows = []
        for case in ("c", "c, 8 calls in one graph"):
            graph = ", same graph" if "graph" in case else ""
            rows += [{"bench": "b", "case": case, "metric": "GB/s", "ours": 3.0,
                      "peer": "copy-bandwidth", "peer_value": 4.0, "ratio": 0.75},
                     {"bench": "b", "case": case, "metric": "1/ms", "ours": 40.0,
                      "peer": "torch-index_select-sdpa" + graph, "peer_value": 40.0 / fast,
                      "ratio": fast},
                     {"bench": "b", "case": case, "metric": "1/ms", "ours": 40.0,
                      "peer": "torch-gather-sdpa" + graph, "peer_value": 40.0 / slow,
                      "ratio": slow}]
        return {"commit": "x", "rows": rows}

    files = []
    for i, (fast, slow) in enumerate([(8.5, 10.1), (8.7, 9.9), (8.6, 10.3)]):
        f = tmp_path / f"r{i}.json"
        f.write_text(json.dumps(run(fast, slow)))
        files.append(str(f))
    tool = [sys.executable, str(ROOT / "tools" / "bench_spread.py"), *files, "--metric", "1/ms",
            "--target", "10"]
    r = subprocess.run(tool, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "twice" in r.stderr and "--peer" in r.stderr, r.stderr
    r = subprocess.run([*tool, "--peer", "torch-index_select-sdpa"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| b | c | 1/ms | 40 (40-40) | 4.651 (4.598-4.706) | 8.6 (8.5-8.7) | 0/3 |" in r.stdout
    assert "| b | c, 8 calls in one graph | 1/ms |" in r.stdout
    r = subprocess.run([*tool, "--peer", "torch-gather-sdpa"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| 10.1 (9.9-10.3) | 2/3 |" in r.stdout and "8.6" not in r.stdout


def test_bench_index_share_batch_plans() -> None:
    """The small-batch bench's rows and pinned plans (pure: no GPU): the previous planner's
    choices it compares against, and that today's planner picks otherwise for them."""
    sys.path.insert(0, str(ROOT / "tools"))
    sys.path.insert(0, str(ROOT / "tests"))
    import bench
    import bench_index_share_batch as bb
    from test_index_share_cpu import _geom, _plan

    assert "index_share_batch" in bench.BENCHES
    assert [(c["n"], c["b"]) for c in bb.cases(True)] == [(64, 1), (64, 8)]
    full = bb.cases(False)
    assert len(full) == 18 and {c["b"] for c in full} == set(bb.BATCHES)
    assert all((c["kind"], c["sq"], c["nkv"], c["cache"]) == ("decode", 1, 1, 8192) for c in full)
    assert bb.previous_plan(64, 8, 132) == {"path": "wg", "ws": 0}
    assert bb.previous_plan(128, 1, 132) == {"path": "wg", "ws": 1, "splits": 8, "merge": "last"}
    assert bb.previous_plan(128, 32, 132)["splits"] == 4
    for c in full:
        new = _plan(_geom(c["n"], b=c["b"]), 132, True, None, False, wg_arch=True)
        knobs = dict(bb.previous_plan(c["n"], c["b"], 132))
        path = knobs.pop("path")
        old = _plan(_geom(c["n"], b=c["b"]), 132, True, path, False, knobs=knobs, wg_arch=True)
        if c["b"] <= 32:  # round 20: the cluster plans
            assert (new.splits, new.merge) != (old.splits, old.merge), c
            assert new.merge == "cluster" and old.merge == "last", (new, old)
            continue
        # Past one wave (round 21): the persistent ws build with one split; before, 64 heads
        # took the barrier-coupled build and 128 heads at B 160 two splits; 128 heads at B 96
        # and 264 had that plan already (the bench's same-process control).
        assert (new.knobs["ws"], new.splits, new.merge) == (1, 1, "none"), c
        assert (old.knobs["ws"], old.splits) == ((1, 1) if c["n"] == 128 and c["b"] != 160
                                                 else (1, 2) if c["n"] == 128 else (0, old.splits))
        assert (new.variant == old.variant) == (c["n"] == 128 and c["b"] != 160), c


def _readme_numbers():
    sys.path.insert(0, str(ROOT / "tools"))
    import readme_numbers

    return readme_numbers


def test_readme_numbers_check_and_write(tmp_path: Path) -> None:
    """--check passes on the committed README and fails on a stale copy (one changed digit
    in the block, or a result that moved); --write fixes the copy and leaves the text outside
    the markers alone; a README without markers or a missing result file is refused."""
    rn = _readme_numbers()
    tool = [sys.executable, str(ROOT / "tools" / "readme_numbers.py")]
    r = subprocess.run([*tool, "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = (ROOT / "README.md").read_text()
    head, rest = text.split(rn.BEGIN)
    block, tail = rest.split(rn.END)
    assert "| 24.5 us (2743 GB/s) |" in block  # IndexShare N64 cache 8k at 6b274ec

    readme = tmp_path / "README.md"
    readme.write_text(head + rn.BEGIN + block.replace("24.5 us", "24.6 us") + rn.END + tail)
    r = subprocess.run([*tool, "--check", "--readme", str(readme)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "out of date" in r.stderr, r.stderr
    r = subprocess.run([*tool, "--write", "--readme", str(readme)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and readme.read_text() == text, r.stderr

    # A new run in latest/ changes the block: ours 10 % faster on one IndexShare row.
    latest = tmp_path / "latest"
    latest.mkdir()
    for f in (ROOT / "benchmarks" / "latest").glob("*.json"):
        (latest / f.name).write_text(f.read_text())
    res = json.loads((latest / "index_share.json").read_text())
    for row in res["rows"]:
        if row["case"].startswith("bf16 decode B64 Sq1 N64 Nkv1 H128 cache8k top2048 (") \
                and row["metric"] == "1/ms":
            row["ours"] = 44.0
    (latest / "index_share.json").write_text(json.dumps(res))
    args = ["--readme", str(readme), "--latest", str(latest)]
    r = subprocess.run([*tool, "--check", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert subprocess.run([*tool, "--write", *args], timeout=120).returncode == 0
    new = readme.read_text()
    assert new.split(rn.BEGIN)[0] == head and new.split(rn.END)[1] == tail
    assert "| 22.7 us (2743 GB/s) |" in new and "24.5 us" not in new.split(rn.END)[0]

    (latest / "runtime.json").unlink()
    r = subprocess.run([*tool, "--check", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "runtime.json is missing" in r.stderr, r.stderr
    with pytest.raises(ValueError, match="numbers:begin"):
        rn.replace_block("no markers here\n", "x\n")
    with pytest.raises(ValueError, match="numbers:begin"):
        rn.replace_block(f"{rn.END}\n{rn.BEGIN}\n", "x\n")


def test_readme_numbers_formats() -> None:
    """Rates per call show as times in their unit; a headline whose row is gone is named."""
    rn = _readme_numbers()
    assert rn.show(40.876, "1/ms") == "24.5 us"
    assert rn.show(0.92, "1/ms") == "1.09 ms"
    assert rn.show(0.097, "1/s") == "10.3 s"
    assert rn.show(57.148, "1/s") == "17.5 ms"
    assert rn.show(1470.631, "GB/s") == "1471 GB/s" and rn.show(61.669, "TFLOP/s") == "61.7 TFLOP/s"
    h = rn.Headline("attention", "x", "bf16 D7 B1 H1 S3 causal=0", "TFLOP/s", ())
    with pytest.raises(LookupError, match="attention.json has no row 'bf16 D7"):
        rn.headline_row(h, [])


def test_bench_writes_one_result_per_op(tmp_path: Path) -> None:
    """bench.py's per-op files: rows grouped by benchmark under their op's file name (paged
    -> paged_attention), each with the run's commit, board and ceilings, in row order."""
    bench = _bench_module()
    rows = [bench.row(b, f"c{i}", "GB/s", 1.0 + i, "p", 2.0)
            for i, b in enumerate(["runtime", "paged", "index_share", "paged"])]
    run = {"commit": "c", "gpu": "G", "gpu_uuid": "GPU-1", "date": "d",
           "ceilings": {"copy_GBps": 3.0}, "rows": rows}
    parts = bench.split_by_bench(run)
    assert list(parts) == ["runtime", "paged_attention", "index_share"]
    assert [r["case"] for r in parts["paged_attention"]["rows"]] == ["c1", "c3"]
    assert all(p["commit"] == "c" and p["ceilings"] == {"copy_GBps": 3.0} for p in parts.values())
    md = bench.write_result(parts["index_share"], tmp_path / "latest", "index_share")
    assert json.loads((tmp_path / "latest" / "index_share.json").read_text()) == parts["index_share"]
    assert (tmp_path / "latest" / "index_share.md").read_text() == md and "| index_share | c2 |" in md
    assert bench.LATEST == ROOT / "benchmarks" / "latest"
