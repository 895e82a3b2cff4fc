#!/usr/bin/env python3
"""Trace and A/B the IndexShare decode kernel on the GPU: ``python lab/trace_index_share.py``.

For the benchmark's decode rows (``tools/bench_index_share.py``: B 64, Sq 1, one kv head,
H 128, top-k 2048, bf16; a case is written ``n<heads>c<cache in k>``, e.g. ``n128c8k``) and
each variant of the warp-specialised cluster build (``cuda/index_share_ws.cu``):

- a timed variant runs the bench's method (two input sets, one call per graph replayed in
  turn, and ``STEP_CALLS`` calls in one graph; median of 20 CUDA-event samples) and prints
  microseconds per call, the error against the torch peer, and whether the output is
  bitwise equal to the case's first variant;
- a traced variant (``trace=1``) compiles the kernel with ``lab/index_share_trace.cuh`` in
  place of the package's ``index_share_trace.cuh`` (whose hooks are no-ops): every CTA stamps
  ``%globaltimer`` at its phase boundaries (index landed, keys staged, K(0) landed, loop
  done, partner's half landed, combined, stored; see the kernel's header) into a buffer
  passed as ``part_o``. Printed: the median over CTAs and the latest CTA of each phase, in
  microseconds from the first CTA's start (median of 10 replays), the skew between the
  two CTAs of a cluster, the medians of each cluster rank (split) apart, and, from two
  graphs replayed back to back, the gap between the first kernel's last stamp and the
  second kernel's first. ``%globaltimer`` has a coarse step (256 ns on the H200, printed as
  ``timer step``): a phase boundary is known to a step in one CTA, so differences of a
  fraction of a step show only in the medians over many CTAs and replays, and a single
  median moves in steps. Each stamp also reads ``%clock64``, so a trace prints the SM clock
  every CTA ran at (cycles over ns between its first and last stamp), and one stamp
  carries the CTA's SM (``%smid``), so a trace prints which SMs held the latest CTAs (and
  how often over the replays) and which SMs ran none; ``--dump FILE`` writes every CTA's
  raw stamps for a closer look (``.npz``, or JSON for a ``.json`` name);
  ``--trace-warm-ms`` replays the graphs back to back first, as the bench warms up before
  its timed samples;
- with ``--state-ms N``, each timed variant's calls also run back to back for N ms while
  nvidia-smi samples the SM clock, power draw and throttle reasons (``bench.py``'s sustained
  state): whether a variant runs into the board's power cap.

Variant spec: ``NAME[:KEY=VALUE,...]`` with keys ``kt`` (the plan knob, 64 or 128), ``cps``
(columns per split, decode cluster plans only: a multiple of the tile, from half of top-k to
below it, within the shared memory; split 0 takes ``cps`` selected keys and split 1 the
rest, so an unequal split shows whether a CTA streams faster once its partner is done; the
bits differ from the shipped plan's), ``src``
(a path: an edited copy of ``index_share_ws.cu`` to A/B against the shipped one; the
package's headers still apply), ``trace`` (0/1), ``pdl`` (0: launch without programmatic
dependent launch) and ``D<NAME>`` (an extra ``-D<NAME>=VALUE`` for the build). Every variant
of a case runs on the same inputs, ``--rounds`` times interleaved (A B A B), so that
variants are compared within one session. ``--json FILE`` writes every number.

The kernel's timing-only diagnostics (``IS_DIAG``) and its ``IS_XSPLIT`` opt-out are no
longer in the source: ``DIS_DIAG`` / ``DIS_XSPLIT`` are refused (unless with ``src=``) with
a pointer to ``lab/index_share_ws_switches.md``, which names the commit that has them and
how to run that source as ``src=``.

Needs an sm_90 GPU and torch (inputs and the peer). The package is patched in-process
(its ws variant and compile hooks, the runtime's launch) only for the variants asked for.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import warnings
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench import _nonneg_ms  # noqa: E402

#: Names of the 16 stamps per CTA (WS_TRACE, lab/index_share_trace.cuh); w1/w2 = consumer
#: warpgroup 1/2 (the second one idles, and stamps only its loop end, at <= 64 heads).
PHASES = ("start", "index", "staged", "issued", "K0_w1", "K0_w2", "loop_w1", "loop_w2",
          "partner_w1", "partner_w2", "stored_w1", "stored_w2", "combined_w1",
          "combined_w2", "staged_w1", "staged_w2")
STAMPS = len(PHASES)
DEFAULT_VARIANTS = ("shipped", "shipped-trace:trace=1")
#: The trace header: compiled in place of the package's no-op one for ``trace=1``.
TRACE_HEADER = "index_share_trace.cuh"
TRACE_SRC = ROOT / "lab" / TRACE_HEADER
#: Defines of switches removed from the kernel (see lab/index_share_ws_switches.md).
REMOVED_DEFINES = ("IS_DIAG", "IS_XSPLIT")


@dataclass
class VariantSpec:
    """One build and plan of the ws cluster kernel to time or trace."""

    name: str
    knobs: dict[str, Any] = field(default_factory=dict)
    cps: int | None = None
    defines: dict[str, str] = field(default_factory=dict)
    src: str | None = None
    trace: bool = False
    pdl: bool = True


def parse_case(text: str) -> dict[str, Any]:
    """``n128c8k`` -> the bench's decode case dict (B 64, Sq 1, Nkv 1, cache 8192)."""
    m = re.fullmatch(r"n(\d+)c(\d+)k", text.strip())
    if not m:
        raise ValueError(f"case {text!r}: expected n<heads>c<cache in k>, e.g. n128c8k")
    return dict(kind="decode", b=64, sq=1, n=int(m.group(1)), nkv=1,
                cache=int(m.group(2)) * 1024)


def parse_variant(text: str) -> VariantSpec:
    """``NAME[:KEY=VALUE,...]`` -> :class:`VariantSpec` (see the module docstring)."""
    name, _, rest = text.partition(":")
    if not name:
        raise ValueError(f"variant {text!r}: empty name")
    spec = VariantSpec(name)
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"variant {text!r}: {item!r} is not KEY=VALUE")
        if key == "kt":
            spec.knobs["kt"] = int(value)
        elif key == "cps":
            spec.cps = int(value)
            if spec.cps < 1:
                raise ValueError(f"variant {text!r}: cps must be >= 1")
        elif key == "src":
            if not Path(value).is_file():
                raise ValueError(f"variant {text!r}: no file {value}")
            spec.src = value
        elif key in ("trace", "pdl"):
            if value not in ("0", "1"):
                raise ValueError(f"variant {text!r}: {key} must be 0 or 1")
            setattr(spec, key, value == "1")
        elif key.startswith("D") and re.fullmatch(r"D[A-Za-z_][A-Za-z0-9_]*", key):
            if key == "DIS_TRACE":
                raise ValueError(f"variant {text!r}: trace=1, not DIS_TRACE")
            spec.defines[key[1:]] = value
        else:
            raise ValueError(f"variant {text!r}: unknown key {key!r} "
                             "(kt, cps, src, trace, pdl, D<NAME>)")
    removed = sorted(set(spec.defines) & set(REMOVED_DEFINES))
    if removed and spec.src is None:
        raise ValueError(f"variant {text!r}: {', '.join(removed)} is no longer a switch of "
                         "index_share_ws.cu; lab/index_share_ws_switches.md says which commit "
                         "has it (pass that source as src=)")
    if spec.trace:  # (read by no source: it keys the traced build apart from the shipped one)
        spec.defines["IS_TRACE"] = "1"
    return spec


def trace_headers(trace: bool) -> dict[str, str]:
    """The package's headers, with :data:`TRACE_SRC` as :data:`TRACE_HEADER` if ``trace``."""
    from attnrt.ops import _common

    headers = _common.headers()
    if trace:
        headers[TRACE_HEADER] = TRACE_SRC.read_text()
    return headers


def ws_build(variant: Any, src: str | None, trace: bool) -> tuple[str, str]:
    """(module name, source text) of a ws variant: an edited copy ``src`` under its own
    module name, or the package's source."""
    from attnrt.ops import _common

    if src is not None:
        return f"{variant.module}_alt", Path(src).read_text()
    return variant.module, _common.source(variant.file)


class _Hooks:
    """The in-process patches: extra defines, an alternative source and the trace header for
    the ws build, the trace buffer as ``part_o`` and the programmatic flag of the attention
    launch."""

    def __init__(self, rt: Any) -> None:
        from attnrt.ops import _common
        from attnrt.ops.index_share import builds, kernel, splitk

        self.defines: dict[str, str] = {}
        self.src: str | None = None
        self.trace_ptr = 0
        self.pdl = True
        self.cps: int | None = None
        orig_variant, orig_get, orig_launch = (splitk._ws_variant, _common.get_function,
                                               rt.launch)
        orig_plan = kernel.make_plan

        def plan(g: Any, device: Any, **k: Any) -> Any:
            p = orig_plan(g, device, **k)
            if self.cps is None:
                return p
            if p.merge != "cluster" or p.splits != 2:
                raise ValueError(f"cps={self.cps}: applies to the two-CTA decode cluster plan; "
                                 f"this plan merges {p.merge!r} over {p.splits} splits")
            kt = p.knobs.get("kt") or builds._WS_KT
            # Two splits: split 0 takes cps columns, split 1 the other width - cps (the
            # kernel gives a split at most cps columns, so cps below half would drop keys).
            if self.cps % kt or not g.width <= 2 * self.cps < 2 * g.width:
                raise ValueError(f"cps={self.cps}: must be a multiple of the {kt}-key tile, "
                                 f"at least half of top-k {g.width} and below it")
            smem = builds._ws_smem(g.head_size, self.cps, 0, 1, kt)
            if smem > device.smem_max:
                raise ValueError(f"cps={self.cps}: the cluster build would need {smem} bytes "
                                 f"of shared memory; the device allows {device.smem_max}")
            return dataclasses.replace(p, cps=self.cps, smem=smem)

        def ws_variant(*a: Any, **k: Any) -> Any:
            v = orig_variant(*a, **k)
            if not self.defines and self.src is None:
                return v
            d = dict(v.defines)
            d.update(self.defines)
            if self.src is not None:  # a distinct module key per alternative source text
                d["NXRT_ALT_SRC"] = zlib.crc32(Path(self.src).read_bytes())
            return _common.Variant(v.file, v.entries, d, v.min_arch, v.arch_suffix)

        def get_function(rt_: Any, variant: Any, entry: str) -> Any:
            trace = str(variant.defines.get("IS_TRACE", "0")) == "1"
            if variant.file != "index_share_ws.cu" or (self.src is None and not trace):
                return orig_get(rt_, variant, entry)
            return rt_.nvrtc_function(*ws_build(variant, self.src, trace), entry,
                                      variant.options, headers=trace_headers(trace),
                                      arch=f"{rt_.arch}{variant.arch_suffix}")

        def launch(fn: Any, grid: Any, block: Any, args: Any, shared_mem: int = 0,
                   **kw: Any) -> None:
            if len(args) > 30:  # the attention kernel (IS_ATTN_PARAMS)
                if self.trace_ptr:
                    args = list(args)
                    args[8] = self.trace_ptr
                if not self.pdl:
                    kw["programmatic"] = False
            orig_launch(fn, grid, block, args, shared_mem, **kw)

        splitk._ws_variant = ws_variant  # (the planner builds its variants there)
        kernel.make_plan = plan
        _common.get_function = get_function
        rt.launch = launch


def _stats(stamps: Any, np: Any) -> dict[str, Any]:
    """Per-replay [cta, 16] stamps (ns, 0 = not stamped) -> phase medians and maxima (us)."""
    rel = []
    for a in stamps:
        a = a.astype(np.float64)
        r = (a - a[:, 0].min()) / 1e3
        r[a == 0] = np.nan
        rel.append(r)
    r = np.stack(rel)  # [replay, cta, phase]
    with warnings.catch_warnings():  # all-NaN columns: phases a build does not stamp
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(np.nanmedian(r, axis=1), axis=0)
        last = np.nanmedian(np.nanmax(r, axis=1), axis=0)
        loop_end = np.nanmax(r[:, :, 6:8], axis=2)
        skew = np.abs(loop_end[:, 0::2] - loop_end[:, 1::2])
        # Per cluster rank (CTA 2 j + rank = split `rank` of task j): the splits' medians.
        by_rank = [np.nanmedian(np.nanmedian(r[:, k::2], axis=1), axis=0) for k in (0, 1)]
    keep = [i for i in range(STAMPS) if med[i] == med[i]]
    # The timer's step: the smallest gap between distinct stamps of one replay.
    steps = [np.diff(np.unique(a[a > 0])) for a in stamps]
    steps = [d[d > 0].min() for d in steps if (d > 0).any()]
    ranks = {f"rank{k}": {PHASES[i]: round(float(m[i]), 3) for i in keep if m[i] == m[i]}
             for k, m in enumerate(by_rank)}
    return dict(median={PHASES[i]: round(float(med[i]), 3) for i in keep},
                rank_median=ranks,
                last={PHASES[i]: round(float(last[i]), 3) for i in keep},
                partner_skew_median=round(float(np.nanmedian(skew)), 3),
                partner_skew_max=round(float(np.nanmedian(np.nanmax(skew, axis=1))), 3),
                timer_step_ns=int(min(steps)) if steps else None)


def _sm_clock(stamps: Any, clocks: Any, np: Any, step_ns: int | None = None) -> dict[str, Any]:
    """The SM clock each CTA ran at: its %clock64 cycles over its %globaltimer ns between
    its first and last stamp (both counters are read at every stamp). A CTA whose stamps
    span less than 40 timer steps (``step_ns``, default 256 ns as on the H200), where the
    step would be more than 2.5 % of the span, is skipped. Median, min and max in MHz over
    CTAs and replays, None when no CTA qualifies; min and max carry the step's error."""
    min_ns = 40 * (step_ns or 256)
    mhz = []
    for t, c in zip(stamps, clocks):
        for tr, cr in zip(t, c):
            ok = tr > 0
            if ok.sum() < 2:
                continue
            i0 = int(np.argmin(np.where(ok, tr, np.iinfo(np.int64).max)))
            i1 = int(np.argmax(np.where(ok, tr, -1)))
            dt = float(tr[i1] - tr[i0])
            if dt >= min_ns:
                mhz.append(float(cr[i1] - cr[i0]) / dt * 1e3)
    if not mhz:
        return dict(sm_clock_mhz_median=None, sm_clock_mhz_min=None, sm_clock_mhz_max=None)
    return dict(sm_clock_mhz_median=round(float(np.median(mhz))),
                sm_clock_mhz_min=round(min(mhz)), sm_clock_mhz_max=round(max(mhz)))


#: Stamp SMID_STAMP's %clock64 word carries the CTA's SM id in its top 8 bits (the kernel's
#: WS_TRACE: the producer's "index landed" stamp, which every CTA of the cluster build makes).
SMID_STAMP, SMID_SHIFT = 1, 56


def _split_smid(clocks: Any) -> tuple[Any, Any]:
    """[cta, 16] %clock64 words -> (the cycle counts, each CTA's SM id): stamp SMID_STAMP's word
    keeps its low 56 bits and gives the SM from its top 8; a CTA without that stamp gets -1."""
    c = clocks.copy()
    k = SMID_STAMP
    smid = (c[:, k].view("uint64") >> SMID_SHIFT).astype("int64")
    c[:, k] = c[:, k] & ((1 << SMID_SHIFT) - 1)
    smid[clocks[:, k] == 0] = -1
    return c, smid


def _late_sms(stamps: Any, smids: Any, np: Any, sm_count: int, n: int = 4) -> dict[str, Any]:
    """Per replay, the SMs of the ``n`` CTAs whose last stamp came latest; how often each
    SM was among them over the replays (most often first), and the SMs (of ``sm_count``)
    no CTA ran on."""
    counts: Counter[int] = Counter()
    used: set[int] = set()
    for a, sm in zip(stamps, smids):
        end = np.where(a > 0, a, 0).max(axis=1)
        counts.update(int(sm[i]) for i in np.argsort(-end, kind="stable")[:n])
        used.update(int(x) for x in sm if x >= 0)
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return dict(latest_sms=[[sm, k] for sm, k in top],
                idle_sms=[i for i in range(sm_count) if i not in used])


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import bench_index_share as B
    import numpy as np
    import torch
    from bench import BenchContext

    import attnrt
    from attnrt.ops import index_share

    rt = attnrt.CudaRuntime()
    hooks = _Hooks(rt)
    ctx = BenchContext(rt, state_ms=args.state_ms)
    specs = [parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS)]
    results: list[dict[str, Any]] = []
    dumps: dict[str, dict[str, Any]] = {}

    def case_name(c: dict[str, Any]) -> str:
        return f"n{c['n']}c{c['cache'] // 1024}k"

    def one(c: dict[str, Any], sets: list[dict], ref: Any, spec: VariantSpec,
            first: Any) -> tuple[dict[str, Any], Any]:
        hooks.defines, hooks.src, hooks.pdl, hooks.cps = (spec.defines, spec.src, spec.pdl,
                                                           spec.cps)
        kern = index_share.IndexShareFactory(rt).create(B.node_for(c))
        kern.config = index_share.IndexShareConfig(**spec.knobs)
        bufs = [torch.zeros(rt.capabilities.sm_count * 2 * STAMPS, dtype=torch.int64,
                            device="cuda") for _ in sets] if spec.trace else []
        graphs: list = []

        def replay_all() -> None:
            for g in graphs:
                g.replay()

        try:
            if spec.trace:  # the plan first (eagerly, no stamps): only the cluster build
                ins, outs = B.views_of(sets[0])  # leaves part_o to the trace
                kern.execute(ins, outs)
                rt.synchronize()
                if kern.last_plan.merge != "cluster":
                    raise RuntimeError(f"{spec.name}: the trace needs the cluster build, this "
                                       f"plan merges {kern.last_plan.merge!r}")
            for i, s in enumerate(sets):
                hooks.trace_ptr = bufs[i].data_ptr() if spec.trace else 0
                graphs.append(B.capture(rt, kern, s))
            hooks.trace_ptr = 0
            plan = kern.last_plan
            out: dict[str, Any] = dict(case=case_name(c), variant=spec.name,
                                       kt=plan.knobs.get("kt"), merge=plan.merge)
            if spec.trace:
                grid = plan.grid
                stamps, clocks, smids, gaps = [], [], [], []
                if args.trace_warm_ms > 0:  # the bench's state before its timed samples
                    ctx.keep_busy(replay_all, rt.synchronize, args.trace_warm_ms)
                for rep in range(args.replays + 2):
                    for b in bufs:
                        b.zero_()
                    torch.cuda.synchronize()
                    graphs[0].replay()
                    graphs[1].replay()
                    rt.synchronize()
                    if rep < 2:  # warm-up replays
                        continue
                    # [cta, 32]: %globaltimer stamps, then %clock64 (the kernel's WS_TRACE)
                    full, full2 = (x.view(-1, 2 * STAMPS)[:grid].cpu().numpy() for x in bufs)
                    a, b2 = full[:, :STAMPS], full2[:, :STAMPS]
                    stamps.append(a)
                    cyc, sm = _split_smid(full[:, STAMPS:])
                    clocks.append(cyc)
                    smids.append(sm)
                    end_a = np.where(a[:, 10:12] > 0, a[:, 10:12], 0).max()
                    gaps.append((b2[:, 0].min() - end_a) / 1e3)
                st = _stats(stamps, np)
                out.update(st, back_to_back_gap_us=round(float(np.median(gaps)), 3),
                           **_sm_clock(stamps, clocks, np, st["timer_step_ns"]),
                           **_late_sms(stamps, smids, np, rt.capabilities.sm_count))
                if args.dump:
                    dumps[f"{case_name(c)}_{spec.name}"] = dict(
                        stamps=np.stack(stamps), clocks=np.stack(clocks), smid=np.stack(smids))
                line = " ".join(f"{k}={v:.2f}" for k, v in out["median"].items())
                print(f"{spec.name:20s} median: {line}")
                line = " ".join(f"{k}={v:.2f}" for k, v in out["last"].items())
                print(f"{spec.name:20s} latest: {line}")
                for rk, phases in out["rank_median"].items():
                    line = " ".join(f"{k}={v:.2f}" for k, v in phases.items()
                                    if k in ("staged", "issued", "loop_w1", "loop_w2",
                                             "partner_w1", "stored_w1"))
                    print(f"{spec.name:20s} {rk} median: {line}")
                print(f"{spec.name:20s} partner skew of the loop end: median "
                      f"{out['partner_skew_median']:.2f} max {out['partner_skew_max']:.2f}; "
                      f"back-to-back replays: last stamp -> next start "
                      f"{out['back_to_back_gap_us']:.2f} us; timer step "
                      f"{out['timer_step_ns']} ns", flush=True)
                print(f"{spec.name:20s} SM clock over each CTA's stamps: median "
                      f"{out['sm_clock_mhz_median']} MHz, min {out['sm_clock_mhz_min']}, "
                      f"max {out['sm_clock_mhz_max']}", flush=True)
                late = " ".join(f"{sm}:{k}" for sm, k in out["latest_sms"][:8])
                print(f"{spec.name:20s} SMs of the 4 latest CTAs (SM:replays of "
                      f"{len(stamps)}): {late}; idle SMs {out['idle_sms']}", flush=True)
                return out, first
            ms = ctx.time_ours(replay_all) / len(graphs)
            rt.latch.check()
            state = ctx.sustained_state(replay_all)
            graphs[0].replay()
            rt.synchronize()
            y = sets[0]["y"].clone()
            g8 = B.in_one_graph(ctx, kern, sets, None)  # the bench's in-graph row, ours only
            ms8 = g8["ms"]
            err = float(torch.linalg.vector_norm(ref - y.float()) / torch.linalg.vector_norm(ref))
            same = None if first is None else bool(torch.equal(first, y))
            check = f"err {err:.2e}   bitwise vs first {'-' if same is None else same}"
            out.update(single_us=round(ms * 1e3, 3), graph_us=round(ms8 * 1e3, 3),
                       rel_err_vs_torch=err, bitwise_vs_first=same)
            print(f"{spec.name:20s} single {ms * 1e3:7.2f} us   {g8['calls']} in one graph "
                  f"{ms8 * 1e3:7.2f} us   {check}   kt {out['kt']}", flush=True)
            if args.state_ms > 0:
                out.update(state=state, graph_state=g8["state"])
                print(f"{spec.name:20s} sustained: single {B.describe_state(state)}; in one graph "
                      f"{B.describe_state(g8['state'])}", flush=True)
            return out, (y if first is None else first)
        finally:
            hooks.trace_ptr = 0
            graphs.clear()
            kern.close()

    for text in args.cases.split(","):
        c = parse_case(text)
        sets = [B.make_inputs(torch, c, 1234 + i) for i in range(2)]
        torch.cuda.synchronize()
        ref = B.torch_peer(torch, c, sets[0])().float()
        print(f"== {text}: {c}", flush=True)
        first = None
        for rd in range(args.rounds):
            for spec in specs:
                if spec.trace and rd > 0:
                    continue
                out, first = one(c, sets, ref, spec, first)
                out["round"] = rd
                results.append(out)
        del sets
        torch.cuda.empty_cache()
    if args.dump:
        write_dump(args.dump, {f"{k}__{f}": v for k, d in dumps.items() for f, v in d.items()})
    return results


def write_dump(path: Path, arrays: dict[str, Any]) -> None:
    """Write ``--dump``: integer arrays by name, as ``.npz`` or, for a ``.json`` path, as one
    JSON object of nested lists. The JSON form is for readers on another numpy: an H200
    machine's numpy 2.5 pads ``.npz`` array headers with NUL bytes, which numpy 2.4's
    ``np.load`` refuses ("Cannot parse header")."""
    import numpy as np

    if path.suffix.lower() == ".json":
        path.write_text(json.dumps({k: np.asarray(v).tolist() for k, v in arrays.items()}))
    else:
        np.savez_compressed(path, **arrays)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Phase timeline (trace) and same-session A/B timing of the IndexShare "
                    "decode cluster kernel on the GPU.")
    ap.add_argument("--cases", default="n128c8k,n64c8k",
                    help="comma-separated n<heads>c<cache in k> (default n128c8k,n64c8k)")
    ap.add_argument("--variant", action="append",
                    help="NAME[:kt=..,cps=..,src=PATH,trace=0|1,pdl=0|1,D<NAME>=..] (repeatable; "
                         f"default {' '.join(DEFAULT_VARIANTS)})")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds per variant (default 2)")
    ap.add_argument("--replays", type=int, default=10, help="traced replays (default 10)")
    ap.add_argument("--state-ms", type=_nonneg_ms, default=0.0,
                    help="after each timed variant, run its calls back to back this long and "
                         "print the SM clock, power and throttle reasons nvidia-smi samples "
                         "(bench.py's sustained state; default 0: off)")
    ap.add_argument("--trace-warm-ms", type=_nonneg_ms, default=0.0,
                    help="before a traced variant's replays, replay its graphs back to back "
                         "this long (the bench's warm-up is 25 ms; default 0)")
    ap.add_argument("--json", type=Path, help="write every number here")
    ap.add_argument("--dump", type=Path,
                    help="write every traced CTA's raw stamps here (.npz, or JSON for a .json "
                         "name: per case and variant, <case>_<variant>__stamps / __clocks "
                         "[replay, cta, 16] and __smid [replay, cta])")
    args = ap.parse_args(argv)
    for v in args.variant or DEFAULT_VARIANTS:  # fail early on a bad spec
        parse_variant(v)
    for c in args.cases.split(","):
        parse_case(c)
    if args.rounds < 1 or args.replays < 1:
        ap.error("--rounds and --replays must be >= 1")
    results = run(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
