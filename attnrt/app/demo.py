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
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnrt.runtime.api import DataType, Node, TensorView
from attnrt.runtime.device import gpu_missing_reason
from attnrt.runtime.executor import Executor

from ..ops import reference
from ..ops.attention import AttentionFactory
from ..ops.index_share import IndexShareFactory
from ..ops.paged_attention import PagedAttentionFactory

__all__ = ["DemoConfig", "DemoModel", "ReferenceRun", "attention_node", "decode_node", "rel_fro",
           "op_of", "run_demo", "format_report", "main", "TOL"]

BF16 = DataType.BFLOAT16
#: Largest relative Frobenius error accepted per op (bf16, as in the GPU tests).
TOL = 1e-2
_ALIGN = 256
_OPS = ("Attention", "PagedAttention", "IndexShare")


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo model; the defaults run in seconds."""

    layers: int = 4
    steps: int = 16  # replays (on the CPU: decode steps)
    seed: int = 0
    prompts: tuple[int, ...] = (61, 37)
    heads: int = 16  # dense: MLA query heads
    latent: int = 576
    v_latent: int = 512
    rope: int = 64  # dense: RoPE on channels [latent - rope, latent)
    block: int = 64
    sparse_heads: int = 16
    sparse_kv_heads: int = 2
    head_dim: int = 128
    topk: int = 32

    def __post_init__(self) -> None:
        if self.layers < 1 or self.steps < 1:
            raise ValueError(f"layers and steps must be >= 1, got {self.layers} and {self.steps}")
        if not self.prompts or min(self.prompts) < 1:
            raise ValueError(f"prompts must be non-empty lengths >= 1, got {self.prompts}")

    @property
    def batch(self) -> int:
        return len(self.prompts)

    @property
    def eager_steps(self) -> int:
        """Timed eager steps after step 0 (they also warm every signature for the capture)."""
        return max(2, min(self.steps, 8))

    @property
    def decode_steps(self) -> int:
        return 1 + self.eager_steps + self.steps

    @property
    def max_len(self) -> int:
        return max(self.prompts) + self.decode_steps

    @property
    def max_blocks(self) -> int:
        return -(-self.max_len // self.block)

    @property
    def num_blocks(self) -> int:
        return self.batch * self.max_blocks + 1  # one spare block that no table points to

    @property
    def capacity(self) -> int:
        return -(-self.max_len // 64) * 64

    @property
    def scale(self) -> float:
        # DeepSeek's softmax scale: 1/sqrt of the un-absorbed query-key head (128 + 64).
        return 1.0 / math.sqrt(192)

    def dense(self, layer: int) -> bool:
        return layer % 2 == 0

    def kinds(self) -> list[str]:
        return ["dense" if self.dense(i) else "sparse" for i in range(self.layers)]


# --------------------------------------------------------------------------- nodes
def attention_node(cfg: DemoConfig, layer: int, seq: int) -> Node:
    """Prefill of ``layer`` over prompt ``seq`` (dense: every head against the latent)."""
    t = f"p{layer}_{seq}"
    if cfg.dense(layer):
        attrs = {"num_heads": cfg.heads, "kv_num_heads": 1, "causal": 1, "scale": cfg.scale}
        return Node("Attention", "pkg.nxrt", attrs, [f"{t}_q", f"{t}_kv", f"{t}_kv"], [f"{t}_o"])
    attrs = {"num_heads": cfg.sparse_heads, "kv_num_heads": cfg.sparse_kv_heads, "causal": 1}
    return Node("Attention", "pkg.nxrt", attrs, [f"{t}_q", f"{t}_k", f"{t}_v"], [f"{t}_o"])


def decode_node(cfg: DemoConfig, layer: int) -> Node:
    """The decode op of ``layer``; its cache is both an input and an output (in place)."""
    q, o, kc = f"q{layer}", f"o{layer}", f"kc{layer}"
    if cfg.dense(layer):
        attrs = {"kv_cache_layout": "LATENT", "num_heads": cfg.heads, "kv_num_heads": 1,
                 "v_head_size": cfg.v_latent, "scale": cfg.scale, "do_rotary": 1,
                 "rotary_interleaved": 0, "rotary_offset": cfg.latent - cfg.rope}
        ins = [q, f"kv{layer}", None, kc, None, "cu", "past", "bt", "cos", "sin", "slot"]
        return Node("PagedAttention", "com.microsoft", attrs, ins, [o, kc])
    vc = f"vc{layer}"
    attrs = {"num_heads": cfg.sparse_heads, "kv_num_heads": cfg.sparse_kv_heads}
    return Node("IndexShare", "pkg.nxrt", attrs, [q, f"k{layer}", f"v{layer}", kc, vc, "idx", "bias"],
                [o, kc, vc])


def _randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32).astype(BF16.numpy)


# --------------------------------------------------------------------------- host data
class DemoModel:
    """Seeded host data: constants, initial caches, prefill inputs, and each step's inputs."""

    def __init__(self, cfg: DemoConfig) -> None:
        self.cfg = cfg
        rng = np.random.default_rng(cfg.seed)
        B, bs, mb = cfg.batch, cfg.block, cfg.max_blocks
        # Shuffled physical blocks: sequence b's logical block i lives at bt[b, i].
        self.bt = rng.permutation(cfg.num_blocks)[:B * mb].astype(np.int32).reshape(B, mb)
        half = cfg.rope // 2
        ang = np.arange(cfg.max_len)[:, None] / 10000.0 ** (np.arange(half)[None, :] / half)
        self.const = {"cu": np.arange(B + 1, dtype=np.int32), "bt": self.bt,
                      "cos": np.cos(ang).astype(BF16.numpy), "sin": np.sin(ang).astype(BF16.numpy)}
        self.caches: dict[str, np.ndarray] = {}
        self.prefill: dict[str, np.ndarray] = {}
        for layer in range(cfg.layers):
            if cfg.dense(layer):
                kc = _randn(rng, cfg.num_blocks, bs, 1, cfg.latent)
                for b, n in enumerate(cfg.prompts):
                    t = f"p{layer}_{b}"
                    self.prefill[f"{t}_q"] = _randn(rng, 1, cfg.heads, n, cfg.latent)
                    kv = self.prefill[f"{t}_kv"] = _randn(rng, 1, 1, n, cfg.latent)
                    kc.reshape(-1, cfg.latent)[self.slots(b, np.arange(n))] = kv[0, 0]
                self.caches[f"kc{layer}"] = kc
            else:
                shape = (B, cfg.sparse_kv_heads, cfg.capacity, cfg.head_dim)
                kc, vc = _randn(rng, *shape), _randn(rng, *shape)
                for b, n in enumerate(cfg.prompts):
                    t = f"p{layer}_{b}"
                    self.prefill[f"{t}_q"] = _randn(rng, 1, cfg.sparse_heads, n, cfg.head_dim)
                    k = self.prefill[f"{t}_k"] = _randn(rng, 1, cfg.sparse_kv_heads, n, cfg.head_dim)
                    v = self.prefill[f"{t}_v"] = _randn(rng, 1, cfg.sparse_kv_heads, n, cfg.head_dim)
                    kc[b, :, :n], vc[b, :, :n] = k[0], v[0]
                self.caches[f"kc{layer}"], self.caches[f"vc{layer}"] = kc, vc

    def slots(self, seq: int, pos: np.ndarray) -> np.ndarray:
        """Cache slots (block id * block_size + offset) of positions ``pos`` of ``seq``."""
        bs = self.cfg.block
        return (self.bt[seq, pos // bs].astype(np.int64) * bs + pos % bs).astype(np.int32)

    def positions(self, step: int) -> np.ndarray:
        return np.asarray(self.cfg.prompts, dtype=np.int64) + step

    def step_inputs(self, step: int) -> dict[str, np.ndarray]:
        """Every per-step input of decode step ``step`` (deterministic in the seed and step)."""
        cfg = self.cfg
        rng = np.random.default_rng((cfg.seed, 1 + step))
        B, pos = cfg.batch, self.positions(step)
        out = {"past": pos.astype(np.int32),
               "slot": np.array([self.slots(b, pos[b:b + 1])[0] for b in range(B)], np.int32)}
        # Synthetic top-k, shared by the sparse layers: the new token plus earlier positions,
        # strictly increasing, -1 padded; the bias frontier marks positions <= pos valid.
        idx = np.full((B, 1, 1, cfg.topk), -1, dtype=np.int32)
        bias = np.zeros((B, 1, 1, cfg.capacity), dtype=np.float32)
        for b in range(B):
            n = min(cfg.topk, int(pos[b]) + 1)
            pick = rng.choice(int(pos[b]), size=n - 1, replace=False)
            idx[b, 0, 0, :n] = np.sort(np.append(pick, pos[b]))
            bias[b, 0, 0, pos[b] + 1:] = -np.inf
        out["idx"], out["bias"] = idx, bias.astype(BF16.numpy)
        for layer in range(cfg.layers):
            if cfg.dense(layer):
                out[f"q{layer}"] = _randn(rng, B, cfg.heads * cfg.latent)
                out[f"kv{layer}"] = _randn(rng, B, cfg.latent)
            else:
                kvh = cfg.sparse_kv_heads
                out[f"q{layer}"] = _randn(rng, B, cfg.sparse_heads, 1, cfg.head_dim)
                out[f"k{layer}"] = _randn(rng, B, kvh, 1, cfg.head_dim)
                out[f"v{layer}"] = _randn(rng, B, kvh, 1, cfg.head_dim)
        return out

    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        """Decode outputs ``o<layer>``."""
        cfg = self.cfg
        return {f"o{i}": (cfg.batch, cfg.heads * cfg.v_latent) if cfg.dense(i)
                else (cfg.batch, cfg.sparse_heads, 1, cfg.head_dim) for i in range(cfg.layers)}


class ReferenceRun:
    """The float64 references of :mod:`attnrt.ops.reference`, step by step, on own caches."""

    def __init__(self, model: DemoModel) -> None:
        self.model, self.cfg = model, model.cfg
        self.caches = {k: v.copy() for k, v in model.caches.items()}

    def prefill(self) -> dict[str, np.ndarray]:
        out = {}
        for layer in range(self.cfg.layers):
            for b in range(self.cfg.batch):
                node = attention_node(self.cfg, layer, b)
                ins = [self.model.prefill[n] for n in node.inputs]  # type: ignore[index]
                out[node.outputs[0]] = reference.attention(node, ins, out_dtype=np.float64)
        return out  # type: ignore[return-value]

    def step(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One decode step; the caches advance as the ops' in-place outputs do."""
        env = {**self.model.const, **self.caches, **inputs}
        out = {}
        for layer in range(self.cfg.layers):
            node = decode_node(self.cfg, layer)
            ins = [None if n is None else env[n] for n in node.inputs]
            if self.cfg.dense(layer):
                o, kc = reference.paged_attention(node, ins)
                self.caches[f"kc{layer}"] = kc
            else:
                o, kc, vc = reference.index_share(node, ins, present="capacity", out_dtype=np.float64)
                self.caches[f"kc{layer}"], self.caches[f"vc{layer}"] = kc, vc
            out[f"o{layer}"] = o
        return out


def rel_fro(out: np.ndarray, ref: np.ndarray) -> float:
    """‖out − ref‖_F / ‖ref‖_F in float64 (a non-finite ``out`` gives inf)."""
    o, r = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(o)):
        return math.inf
    d = float(np.linalg.norm(r))
    return float(np.linalg.norm(o - r) / (d if d > 0 else 1.0))


def op_of(cfg: DemoConfig, name: str) -> str:
    """The op that produced decode output or cache ``name`` (``o3``, ``kc0``, ``vc1``)."""
    layer = int(name.lstrip("okvc"))
    return "PagedAttention" if cfg.dense(layer) else "IndexShare"


# --------------------------------------------------------------------------- device buffers
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
