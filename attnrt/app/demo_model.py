"""The demo's model: its configuration, ONNX-style nodes, seeded weights and caches, and the
float64 reference chain the GPU run is checked against (see :mod:`attnrt.app.demo`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from attnrt.runtime.api import DataType, Node

from ..ops import reference

__all__ = ["DemoConfig", "DemoModel", "ReferenceRun", "attention_node", "decode_node", "rel_fro",
           "op_of", "TOL", "BF16"]

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
