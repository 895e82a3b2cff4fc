"""``attnrt demo``: a small GLM/DeepSeek-style decode loop through :mod:`attnrt.runtime.executor`.

The model has seeded random weights and caches (the ops are the point, so each layer's
projections are the host's random numbers): ``layers`` layers alternating *dense* (MLA: one
LATENT ``com.microsoft::PagedAttention`` over a paged latent cache, head 576 / value 512,
block 64, RoPE on the last 64 channels) and *sparse* (``pkg.nxrt::IndexShare`` over a
fixed-capacity K/V cache, with one synthetic top-k that every sparse layer shares, as GLM's
IndexShare shares one indexer), for a batch of two sequences with different prompt lengths.

With a GPU (:func:`run_demo`):

1. Prefill: every layer attends causally over each prompt with ``pkg.nxrt::Attention`` (dense
   layers in the absorbed MLA form, all heads against the one latent, D = 576; sparse layers
   GQA at D = 128). The prompts' keys are the first rows of the decode caches.
2. Decode step 0 runs eagerly (it compiles or loads each kernel), then more eager steps time
   the eager path and warm every exact signature: PagedAttention captures only a signature
   that ran eagerly, and IndexShare's first eager call loads its kernels, including the
   device-side ``selected_indices`` validation it launches in place of its host check while
   the stream is capturing.
3. The step is captured into one CUDA graph and replayed ``steps`` times. Before every step
   the host writes all per-step inputs (queries, new keys, positions, slots, top-k rows, the
   bias frontier) into one staging buffer with one copy, so the graph's pointers never
   change; the ops append to their caches in place, so positions advance and caches fill.
   The error latch is checked after every step.
4. Every step's outputs and the final caches are compared with :mod:`attnrt.ops.reference`
   (float64, CPU). The report gives the largest relative error per op, eager vs replay time
   per step, kernels per step, compile-cache hits and compiles, and the memory ledger
   (zero live bytes at the end); ``ok`` is False when an error exceeds the tolerance or
   memory is left live.

Without a GPU, every kernel is compiled for sm_90 (``attnrt warm``), each node is claimed by
its factory, and the same prefill and decode steps run with the references on the CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from attnrt.runtime.api import DataType, TensorView
from attnrt.runtime.device import gpu_missing_reason
from attnrt.runtime.executor import Executor

from ..ops.attention import AttentionFactory
from ..ops.index_share import IndexShareFactory
from ..ops.paged_attention import PagedAttentionFactory

__all__ = ["DemoConfig", "DemoModel", "ReferenceRun", "attention_node", "decode_node", "rel_fro",
           "op_of", "run_demo", "format_report", "main", "TOL"]

from .demo_model import (  # noqa: F401 - re-exported
    _ALIGN,
    _OPS,
    BF16,
    TOL,
    DemoConfig,
    DemoModel,
    ReferenceRun,
    _randn,
    attention_node,
    decode_node,
    op_of,
    rel_fro,
)


class _Arena:
    """Named tensors packed into one allocation, with a host mirror for one-copy transfers."""

    def __init__(self, rt: Any, specs: Mapping[str, tuple[tuple[int, ...], DataType]]) -> None:
        self.rt, self.layout, off = rt, {}, 0
        for name, (shape, dt) in specs.items():
            self.layout[name] = (off, tuple(shape), dt)
            off += -(-math.prod(shape) * dt.itemsize // _ALIGN) * _ALIGN  # 256-byte aligned views
        self.host = np.zeros(max(off, _ALIGN), dtype=np.uint8)
        self.arrays = {n: np.ndarray(s, dt.numpy, buffer=self.host, offset=o)
                       for n, (o, s, dt) in self.layout.items()}
        self.ptr = rt.alloc_raw(self.host.nbytes)

    @classmethod
    def of(cls, rt: Any, arrays: Mapping[str, np.ndarray]) -> _Arena:
        return cls(rt, {n: (a.shape, DataType.from_numpy(a.dtype)) for n, a in arrays.items()})

    def view(self, name: str) -> TensorView:
        off, shape, dt = self.layout[name]
        return TensorView(self.ptr + off, dt, shape)

    def upload(self, values: Mapping[str, np.ndarray]) -> None:
        """Write ``values`` into the host mirror, then copy all of it with one ``htod``."""
        for n, v in values.items():
            self.arrays[n][...] = v
        self.rt.htod(self.ptr, self.host)

    def download(self) -> dict[str, np.ndarray]:
        self.rt.dtoh(self.host, self.ptr)
        return {n: a.copy() for n, a in self.arrays.items()}

    def free(self) -> None:
        if self.ptr:
            self.rt.free_raw(self.ptr)
            self.ptr = 0


def _close(ex: Executor) -> None:
    for st in ex.steps:
        close = getattr(st.kernel, "close", None)  # IndexShare's scratch pool
        if close is not None:
            close()
    ex.close()


def _paths(ex: Executor) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {}
    for st in ex.steps:
        plan = getattr(st.kernel, "last_plan", None)
        path = str(getattr(plan, "path", "?"))
        splits = getattr(plan, "splits", 1)
        out.setdefault(st.node.op_type, set()).add(path + (f" x{splits} splits" if splits > 1 else ""))
    return {k: sorted(v) for k, v in out.items()}


# --------------------------------------------------------------------------- GPU run
def _run_gpu(cfg: DemoConfig, rt: Any, say: Callable[[str], None]) -> dict[str, Any]:
    model = DemoModel(cfg)
    cache0, mem0 = rt.cache.stats.as_dict(), rt.memory_stats()
    arenas: list[_Arena] = []
    executors: list[Executor] = []
    rec: dict[str, Any] = {"eager": [], "replay": [], "outputs": []}
    try:
        state = _Arena.of(rt, {**model.const, **model.caches})
        arenas.append(state)
        state.upload({**model.const, **model.caches})
        # -- prefill: one Attention per (layer, prompt), eagerly, outputs checked below.
        nodes = [attention_node(cfg, i, b) for i in range(cfg.layers) for b in range(cfg.batch)]
        outs = {n.outputs[0]: model.prefill[n.inputs[0]] for n in nodes}  # output shape = Q's
        pre = _Arena.of(rt, {**model.prefill, **outs})
        arenas.append(pre)
        pre.upload(model.prefill)
        ex_p = Executor(rt)
        executors.append(ex_p)
        for name in pre.layout:
            ex_p.bind(name, pre.view(name))
        factory = AttentionFactory(rt)
        for n in nodes:
            ex_p.add(n, factory)
        say(f"prefill: {len(nodes)} Attention ops (first use compiles or loads their kernels) ...")
        t0 = time.perf_counter()
        ex_p.run()
        rt.synchronize()
        rec["prefill_s"] = time.perf_counter() - t0
        rt.latch.check()
        rec["prefill"] = {n: a for n, a in pre.download().items() if n.endswith("_o")}
        rec["paths"] = _paths(ex_p)
        _close(ex_p)
        executors.remove(ex_p)
        pre.free()
        # -- decode: the staging arena is rewritten with one copy before every step.
        stage = _Arena.of(rt, model.step_inputs(0))
        arenas.append(stage)
        out = _Arena(rt, {n: (s, BF16) for n, s in model.output_shapes().items()})
        arenas.append(out)
        ex = Executor(rt)
        executors.append(ex)
        for arena in (state, stage, out):
            for name in arena.layout:
                ex.bind(name, arena.view(name))
        factories = {True: PagedAttentionFactory(rt), False: IndexShareFactory(rt)}
        for i in range(cfg.layers):
            ex.add(decode_node(cfg, i), factories[cfg.dense(i)])

        def step(s: int, replay: bool) -> float:
            stage.upload(model.step_inputs(s))
            n0, t = rt.launch_count, time.perf_counter()
            if replay:
                ex.replay(check_latch=False)
            else:
                ex.run()
            rt.synchronize()
            t = time.perf_counter() - t
            rt.latch.check()  # raises CaptureError naming any bit a kernel latched
            rec["launches"] = rt.launch_count - n0
            rec["outputs"].append(out.download())
            return t

        say("decode step 0: eager (first use compiles or loads the decode kernels) ...")
        rec["first_step_s"] = step(0, False)
        kernels = rec["launches"]
        say(f"decode steps 1-{cfg.eager_steps}: eager (timed; warms every exact signature) ...")
        rec["eager"] = [step(s, False) for s in range(1, 1 + cfg.eager_steps)]
        rec["paths"].update(_paths(ex))
        graph = ex.capture(warmup=0)  # the eager steps were the warm-up
        nodes_in_graph = graph.num_nodes
        say(f"captured the decode step: {nodes_in_graph} graph nodes; replaying {cfg.steps} steps ...")
        first = 1 + cfg.eager_steps
        rec["replay"] = [step(s, True) for s in range(first, first + cfg.steps)]
        rec["caches"] = {n: a for n, a in state.download().items() if n in model.caches}
    finally:
        for e in executors:
            _close(e)
        for a in arenas:
            a.free()
    mem1 = rt.memory_stats()
    cache1 = rt.cache.stats.as_dict()
    say("checking every step against attnrt.ops.reference (float64, CPU) ...")
    errs = _verify(cfg, model, rec)
    eager_ms = 1e3 * float(np.mean(rec["eager"]))
    replay_ms = 1e3 * float(np.mean(rec["replay"]))
    live = mem1.live_bytes - mem0.live_bytes
    failures = [f"{phase} {op}: relative error {e:.2e} > {TOL:.0e}"
                for phase, per in errs.items() for op, e in per.items() if not e <= TOL]
    if live:
        failures.append(f"ledger: {live} bytes still live after teardown")
    caps = rt.capabilities
    return {
        "gpu": True, "device": caps.name, "arch": caps.arch, "model": _model_info(cfg),
        "prefill": {"ops": cfg.layers * cfg.batch, "seconds": round(rec["prefill_s"], 4)},
        "decode": {"first_step_s": round(rec["first_step_s"], 4), "eager_steps": len(rec["eager"]),
                   "replays": len(rec["replay"]), "kernels_per_step": kernels,
                   "graph_nodes": nodes_in_graph, "eager_ms_per_step": round(eager_ms, 4),
                   "replay_ms_per_step": round(replay_ms, 4),
                   "speedup": round(eager_ms / replay_ms, 2) if replay_ms > 0 else None},
        "paths": rec["paths"],
        "max_rel_err": {p: {op: float(f"{e:.3g}") for op, e in per.items()} for p, per in errs.items()},
        "tolerance": TOL,
        "latch_checks": 1 + len(rec["eager"]) + len(rec["replay"]) + 1,
        "cache": {k: (round(cache1[k] - cache0[k], 3) if isinstance(cache1[k], float)
                      else cache1[k] - cache0[k]) for k in cache1},
        "ledger": {"live_bytes": live, "peak_bytes": mem1.peak_bytes,
                   "allocations": mem1.total_allocs - mem0.total_allocs,
                   "frees": mem1.total_frees - mem0.total_frees},
        "failures": failures, "ok": not failures,
    }


def _verify(cfg: DemoConfig, model: DemoModel, rec: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Largest relative error per phase and op: prefill, eager steps, replays, final caches."""
    ref = ReferenceRun(model)
    errs: dict[str, dict[str, float]] = {"prefill": {}, "eager": {}, "replay": {}, "caches": {}}

    def note(phase: str, op: str, e: float) -> None:
        errs[phase][op] = max(errs[phase].get(op, 0.0), e)

    for name, want in ref.prefill().items():
        note("prefill", "Attention", rel_fro(rec["prefill"][name], want))
    for s, got in enumerate(rec["outputs"]):
        want = ref.step(model.step_inputs(s))
        for name, w in want.items():
            note("eager" if s <= cfg.eager_steps else "replay", op_of(cfg, name), rel_fro(got[name], w))
    for name, got in rec["caches"].items():
        note("caches", op_of(cfg, name), rel_fro(got, ref.caches[name]))
    return errs


def _model_info(cfg: DemoConfig) -> dict[str, Any]:
    return {"layers": cfg.kinds(), "batch": cfg.batch, "prompts": list(cfg.prompts), "dtype": "bfloat16",
            "dense": {"op": "PagedAttention LATENT", "heads": cfg.heads, "latent": cfg.latent,
                      "v_latent": cfg.v_latent, "rope": cfg.rope, "block_size": cfg.block},
            "sparse": {"op": "IndexShare (fixed capacity)", "heads": cfg.sparse_heads,
                       "kv_heads": cfg.sparse_kv_heads, "head_dim": cfg.head_dim, "topk": cfg.topk,
                       "capacity": cfg.capacity}}


# --------------------------------------------------------------------------- CPU run
GPU_WOULD_ADD = (
    "run the same prefill and decode steps with the attnrt kernels through attnrt.runtime.executor and check "
    "every op against these references (exit status 1 above the tolerance)",
    "warm up, capture the decode step into one CUDA graph and replay it, with positions advancing "
    "and caches filling in place, checking the error latch after every replay",
    "report eager vs replay time per step, kernels per step, compile-cache hits and compiles, "
    "and the memory ledger (zero live bytes at the end)",
)


def _claims(cfg: DemoConfig, model: DemoModel) -> dict[str, Any]:
    """Each node through its factory's claim-time gate (pure, no GPU)."""
    env = {**model.const, **model.caches, **model.prefill, **model.step_inputs(0)}
    factories = {"Attention": AttentionFactory(None), "PagedAttention": PagedAttentionFactory(None),
                 "IndexShare": IndexShareFactory(None)}
    nodes = [attention_node(cfg, i, b) for i in range(cfg.layers) for b in range(cfg.batch)]
    nodes += [decode_node(cfg, i) for i in range(cfg.layers)]
    counts: dict[str, int] = {}
    refused = []
    for n in nodes:
        shapes = [None if x is None else env[x].shape for x in n.inputs]
        dtypes = [None if x is None else DataType.from_numpy(env[x].dtype) for x in n.inputs]
        reason = factories[n.op_type].unsupported_reason(n, shapes, dtypes)
        if reason is not None:
            refused.append(f"{n.op_type} {n.outputs[0]}: {reason}")
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return {"nodes": counts, "refused": refused}


def _run_cpu(cfg: DemoConfig, reason: str, say: Callable[[str], None]) -> dict[str, Any]:
    from attnrt.app.cli import warm
    from attnrt.runtime.cache import default_cache

    say(f"demo: no GPU ({reason}).")
    say("demo: compiling every kernel for sm_90, as a GPU run would load them (progress below):")
    t0 = time.perf_counter()
    ok_variants, _skipped, errors, advice = warm(["sm_90"])
    compile_s = time.perf_counter() - t0
    for vid, lines in sorted(advice.items()):  # compiled, but ptxas slowed it down
        say(f"demo: ptxas reports a performance loss in {vid}: {'; '.join(lines)}")
    model = DemoModel(cfg)
    claims = _claims(cfg, model)
    say(f"demo: running the prefill and {cfg.steps} decode steps with attnrt.ops.reference ...")
    ref = ReferenceRun(model)
    t0 = time.perf_counter()
    outs = list(ref.prefill().values())
    prefill_s = time.perf_counter() - t0
    times = []
    for s in range(cfg.steps):
        t0 = time.perf_counter()
        outs += list(ref.step(model.step_inputs(s)).values())
        times.append(time.perf_counter() - t0)
    finite = all(bool(np.all(np.isfinite(np.asarray(o, dtype=np.float64)))) for o in outs)
    failures = [f"compile: {e.splitlines()[0] if e else e}" for e in errors] + claims["refused"]
    if not finite:
        failures.append("reference: non-finite outputs")
    return {
        "gpu": False, "reason": reason, "model": _model_info(cfg),
        "compile": {"arch": "sm_90", "variants": ok_variants + len(errors), "failed": len(errors),
                    "performance_advisories": sorted(advice),
                    "seconds": round(compile_s, 2), "cache_dir": str(default_cache().directory)},
        "claims": claims,
        "cpu_reference": {"prefill_ops": cfg.layers * cfg.batch, "prefill_s": round(prefill_s, 4),
                          "decode_steps": len(times), "ops_per_step": cfg.layers,
                          "ms_per_step": round(1e3 * float(np.mean(times)), 3), "finite": finite},
        "gpu_would_add": list(GPU_WOULD_ADD),
        "failures": failures, "ok": not failures,
    }


# --------------------------------------------------------------------------- entry points
def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_demo(cfg: DemoConfig | None = None, rt: Any = None,
             say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the demo and return its report (a JSON-able dict; ``report["ok"]`` is the verdict).

    Parameters
    ----------
    cfg
        Sizes and seed (default :class:`DemoConfig()`).
    rt
        A :class:`~attnrt.CudaRuntime` to run on (its ledger must come back to where it was);
        default: a runtime on device 0 when a GPU is present, else the CPU path.
    say
        Progress sink (default: stderr).

    Raises
    ------
    AttnrtError
        A kernel refused its inputs, a compile failed, or the latch was set after a step.
    """
    cfg = cfg or DemoConfig()
    say = say or _stderr
    if rt is not None:
        return _run_gpu(cfg, rt, say)
    reason = gpu_missing_reason()
    if reason is not None:
        return _run_cpu(cfg, reason, say)
    from attnrt.runtime.runtime import CudaRuntime

    with CudaRuntime(0) as own:
        return _run_gpu(cfg, own, say)


def _e(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def format_report(r: dict[str, Any]) -> str:
    """The human-readable report of :func:`run_demo`."""
    m = r["model"]
    d, s = m["dense"], m["sparse"]
    lines = [f"model      {len(m['layers'])} layers ({', '.join(m['layers'])}), batch {m['batch']}, "
             f"prompts {'/'.join(map(str, m['prompts']))}, {m['dtype']}",
             f"           dense: {d['op']}, {d['heads']} heads, latent {d['latent']} / value "
             f"{d['v_latent']}, block {d['block_size']}, RoPE {d['rope']}",
             f"           sparse: {s['op']}, {s['heads']} heads / {s['kv_heads']} kv, head "
             f"{s['head_dim']}, shared top-{s['topk']}, capacity {s['capacity']}"]
    if not r["gpu"]:
        c, ref = r["compile"], r["cpu_reference"]
        lines = [f"attnrt demo: no GPU ({r['reason']})", *lines,
                 f"compiled   {c['variants']} kernel variants for {c['arch']} in {c['seconds']} s "
                 f"({c['failed']} failed), cache {c['cache_dir']}",
                 f"claimed    {', '.join(f'{v} {k}' for k, v in r['claims']['nodes'].items())} nodes "
                 f"({len(r['claims']['refused'])} refused)",
                 f"reference  numpy float64 on the CPU: prefill ({ref['prefill_ops']} Attention) in "
                 f"{ref['prefill_s']} s; {ref['decode_steps']} decode steps of {ref['ops_per_step']} "
                 f"ops, {ref['ms_per_step']} ms/step",
                 "with a GPU, `attnrt demo` would also:",
                 *[f"  - {t}" for t in r["gpu_would_add"]]]
    else:
        dec, c, led = r["decode"], r["cache"], r["ledger"]
        paths = "; ".join(f"{op} {', '.join(p)}" for op, p in r["paths"].items())
        lines = [f"attnrt demo: decode loop through the executor on {r['device']} ({r['arch']})", *lines,
                 f"prefill    {r['prefill']['ops']} Attention ops in {r['prefill']['seconds']:.3f} s "
                 "(first run: includes compiles)",
                 f"decode     step 0 eager in {dec['first_step_s']:.3f} s (compiles/loads), "
                 f"{dec['eager_steps']} timed eager steps, {dec['replays']} replays",
                 f"kernels    {dec['kernels_per_step']} launches per eager step; the graph has "
                 f"{dec['graph_nodes']} nodes",
                 f"paths      {paths}",
                 f"eager      {dec['eager_ms_per_step']:.3f} ms/step",
                 f"replay     {dec['replay_ms_per_step']:.3f} ms/step ({dec['speedup']}x faster)",
                 f"reference  max relative error (tolerance {r['tolerance']:.0e}):",
                 f"  {'op':<16}{'prefill':>9}{'eager':>9}{'replay':>9}{'caches':>9}"]
        err = r["max_rel_err"]
        for op in _OPS:
            lines.append(f"  {op:<16}" + "".join(f"{_e(err[p].get(op)):>9}"
                                                  for p in ("prefill", "eager", "replay", "caches")))
        lines += [f"latch      clear after every step ({r['latch_checks']} checks)",
                  f"cache      {c['hits']} hits, {c['compiles']} compiles ({c['compile_seconds']} s)",
                  f"ledger     {led['live_bytes']} live bytes at the end (peak {led['peak_bytes']} B, "
                  f"{led['allocations']} allocations, {led['frees']} frees)"]
    lines += [f"FAILED     {f}" for f in r["failures"]]
    lines.append("result     " + ("OK" if r["ok"] else "FAILED")
                 + ("" if r["gpu"] else " (no GPU: compiled, claimed and ran the references)"))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """``attnrt demo [--steps N] [--layers L] [--seed S] [--json]``: 0 ok, 1 failed, 2 bad options."""
    try:
        cfg = DemoConfig(layers=args.layers, steps=args.steps, seed=getattr(args, "seed", 0))
    except ValueError as exc:
        print(f"attnrt demo: {exc}", file=sys.stderr)
        return 2
    report = run_demo(cfg)
    print(json.dumps(report, indent=1) if args.json else format_report(report), flush=True)
    return 0 if report["ok"] else 1
