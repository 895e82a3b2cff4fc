"""PagedAttention (LATENT / MLA) benchmarks: ``tools/bench.py paged``.

Decode: B in {1, 32, 128}, 128 heads, latent 576 / value 512, L in {4k, 8k, 32k} cached
keys, block_size 64, bf16, one new token per sequence. Metric: effective GB/s = the latent
cache bytes read once (B * L * 576 * 2) / time, beside the measured copy bandwidth
("copy-bandwidth", with ``of_ceiling``) and a torch reference in the same run
("torch-gather-bmm": gather the paged rows, bmm, float softmax, bmm). Prefill: TFLOP/s of
causal attention (2 * (576 + 512) FLOP per visible (query head, key) pair) beside torch
SDPA with an explicit bottom-right causal mask.

Our op is timed as CUDA-graph replays of the whole op (write + attention + combine), several
per timed region, so host-side validation is not in the number; the torch peer runs eagerly.
Where one case's latent cache would sit in L2 (B=1), several copies of the inputs are
replayed in turn so that every replay reads HBM, as one layer of a real decode step does.
With ``ATTNRT_BENCH_PAGED_WG=1`` on compute capability 9.0 each decode case gets a second row
for the opt-in wgmma path (``path="wg"``, case suffix ``path=wg``) against the copy bandwidth;
off by default until tools/sweep_paged.py (which isolates it in a child process) has shown it
correct on the H200, since a device fault would poison the rest of the bench.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
from bench import BenchContext, row

from attnrt.ops.paged_attention import PagedAttentionConfig, PagedAttentionFactory
from attnrt.runtime.api import DataType, Node, TensorView, WorkspaceView
from attnrt.runtime.tensors import DeviceArray

HS, VHS, H, BS = 576, 512, 128, 64
SCALE = 1.0 / (192 ** 0.5)  # DeepSeek-style softmax scale of the un-absorbed head dim
INNER = 5  # replays per timed region


class _CAI:
    """Exposes a raw device buffer to torch through ``__cuda_array_interface__``."""

    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "version": 3, "strides": None}


class _Case:
    """Device inputs of one paged decode/prefill problem, filled on the device."""

    def __init__(self, ctx: BenchContext, B: int, q_len: int, past: int, seed: int = 0,
                 path: str = "auto") -> None:
        rt, rng = ctx.rt, np.random.default_rng(seed)
        self.ctx, self.B, self.q_len, self.past = ctx, B, q_len, past
        self.T, self.L = B * q_len, past + q_len
        mb = -(-self.L // BS)
        nb = B * mb
        bt = rng.permutation(nb).astype(np.int32).reshape(B, mb)
        pos = np.tile(np.arange(past, self.L), B)
        seq = np.repeat(np.arange(B), q_len)
        slot = (bt[seq, pos // BS] * BS + pos % BS).astype(np.int32)
        bf16 = DataType.BFLOAT16
        self.arrays = {
            0: DeviceArray(rt, (self.T, H * HS), bf16), 1: DeviceArray(rt, (self.T, HS), bf16),
            3: DeviceArray(rt, (nb, BS, 1, HS), bf16),
            5: DeviceArray.from_numpy(rt, np.arange(B + 1, dtype=np.int32) * q_len),
            6: DeviceArray.from_numpy(rt, np.full(B, past, dtype=np.int32)),
            7: DeviceArray.from_numpy(rt, bt), 10: DeviceArray.from_numpy(rt, slot)}
        self.out = DeviceArray(rt, (self.T, H * VHS), bf16)
        self.bt = bt
        for i in (0, 1, 3):
            self._fill(self.arrays[i])
        self.node = Node("PagedAttention", "com.microsoft",
                         {"kv_cache_layout": "LATENT", "num_heads": H, "kv_num_heads": 1,
                          "v_head_size": VHS, "scale": SCALE},
                         ["q", "k", None, "kc", None, "cu", "past", "bt", None, None, "slot"],
                         ["out"])
        self.kernel = PagedAttentionFactory(rt, config=PagedAttentionConfig(path=path)).create(self.node, [])
        req = self.kernel.workspace_requirement(self.views())
        self.ws = DeviceArray(rt, (req.nbytes,), np.uint8) if req.nbytes else None
        self.graph: Any = None

    def _fill(self, a: DeviceArray) -> None:
        torch = self.ctx.torch
        if torch is not None:
            self.torch_view(a).normal_()
            torch.cuda.synchronize()
        else:  # 0x3C3C: bf16 ~0.0115; values do not change tensor-core timing
            a.fill_bytes(0x3C)

    def torch_view(self, a: DeviceArray) -> Any:
        torch = self.ctx.torch
        t = torch.as_tensor(_CAI(a.ptr, a.shape, "<i2"), device="cuda")
        return t.view(torch.bfloat16)

    def views(self) -> list:
        return [self.arrays[i].view() if i in self.arrays else TensorView.absent_slot()
                for i in range(16)]

    def run(self) -> None:
        ws = WorkspaceView(self.ws.ptr, self.ws.nbytes) if self.ws is not None else None
        self.kernel.execute(self.views(), [self.out.mut()], ws)

    def capture(self) -> Any:
        rt = self.ctx.rt
        self.run()  # warm the signature
        rt.synchronize()
        with rt.capture() as g:
            self.run()
        self.graph = g
        return g

    def time_ms(self) -> float:
        return _time_graphs(self.ctx, [self.capture()])

    def torch_reference(self) -> Any:
        """Gather + bmm + softmax + bmm on the same buffers (decode and prefill)."""
        torch = self.ctx.torch
        q = self.torch_view(self.arrays[0]).view(self.B, self.q_len * H, HS)
        kc = self.torch_view(self.arrays[3])
        bt = torch.as_tensor(self.bt, device="cuda").long()

        def fn() -> Any:
            k = kc[bt].reshape(self.B, -1, HS)[:, :self.L]              # [B, L, 576]
            s = torch.bmm(q, k.transpose(1, 2)).float() * SCALE         # [B, q*H, L]
            if self.q_len > 1:
                qpos = torch.arange(self.past, self.L, device="cuda").repeat_interleave(H)
                s = s.masked_fill(torch.arange(self.L, device="cuda")[None, :] > qpos[:, None],
                                  float("-inf"))
            p = torch.softmax(s, dim=-1).to(torch.bfloat16)
            return torch.bmm(p, k[..., :VHS])
        return fn

    def free(self) -> None:
        if self.graph is not None:
            self.graph.destroy()
        for a in [*self.arrays.values(), self.out] + ([self.ws] if self.ws is not None else []):
            a.free()


def _time_graphs(ctx: BenchContext, graphs: list) -> float:
    """Milliseconds per replay, replaying ``graphs`` in turn (INNER rounds per timed region)."""

    def replays() -> None:
        for _ in range(INNER):
            for g in graphs:
                g.replay()

    ms = ctx.time_ours(replays, warmup=2, reps=10) / (INNER * len(graphs))
    ctx.rt.latch.check()
    return ms


def _decode_rows(ctx: BenchContext, B: int, L: int) -> list[dict]:
    kv_bytes = B * L * HS * 2
    # Copies of the inputs so that the latent caches replayed in turn exceed L2 three times.
    n_sets = int(min(8, max(1, math.ceil(3 * ctx.rt.capabilities.l2_bytes / kv_bytes))))
    flops = 2.0 * B * H * L * (HS + VHS)
    copy = ctx.ceilings.get("copy_GBps")
    case = f"decode bf16 B{B} H{H} L{L} d{HS}/{VHS} bs{BS}"
    wg = os.environ.get("ATTNRT_BENCH_PAGED_WG") == "1" and \
        tuple(ctx.rt.capabilities.compute_capability) == (9, 0)
    paths = ["auto"] + (["wg"] if wg else [])
    rows: list[dict] = []
    for path in paths:
        cases: list[_Case] = []
        try:
            for i in range(n_sets):
                cases.append(_Case(ctx, B, 1, L - 1, seed=i, path=path))
            ms = _time_graphs(ctx, [c.capture() for c in cases])
            gbps = kv_bytes / ms / 1e6
            c = cases[0]
            extra = {"ms": round(ms, 4), "TFLOPs": round(flops / ms / 1e9, 1),
                     "splits": c.kernel.last_plan.splits, "path": c.kernel.last_plan.path,
                     "input_sets": n_sets}
            name = case if path == "auto" else f"{case} path={path}"
            rows.append(row("paged", name, "GB/s", gbps, "copy-bandwidth", copy,
                            of_ceiling=None if not copy else round(gbps / copy, 3), **extra))
            if ctx.torch is not None and path == "auto":
                t_ms = ctx.time_torch(c.torch_reference(), warmup=2, reps=5)
                rows.append(row("paged", name, "GB/s", gbps, "torch-gather-bmm",
                                kv_bytes / t_ms / 1e6, **extra))
            ctx.log(f"{name}: {ms:.4f} ms, {gbps:.0f} GB/s, {extra['TFLOPs']} TFLOP/s, "
                    f"splits {extra['splits']}, {n_sets} input set(s)")
        except Exception as exc:  # the opt-in path must not hide the default's rows
            if path == "auto":
                raise
            ctx.log(f"{case} path={path}: FAILED: {type(exc).__name__}: {exc}")
            rows.append(row("paged", f"{case} path={path}", "error", 0, type(exc).__name__, None,
                            error=str(exc)[:300]))
        finally:
            for c in cases:
                c.free()
    return rows


def _prefill_rows(ctx: BenchContext, B: int, q_len: int, past: int) -> list[dict]:
    c = _Case(ctx, B, q_len, past)
    try:
        ms = c.time_ms()
        visible = B * H * sum(past + i + 1 for i in range(q_len))
        tflops = 2.0 * visible * (HS + VHS) / ms / 1e9
        case = f"prefill bf16 B{B} H{H} q{q_len} past{past} d{HS}/{VHS} bs{BS}"
        peer = None
        if ctx.torch is not None:
            peer = 2.0 * visible * (HS + VHS) / ctx.time_torch(c.torch_reference(), warmup=1,
                                                               reps=3) / 1e9
        ctx.log(f"{case}: {ms:.3f} ms, {tflops:.0f} TFLOP/s")
        return [row("paged", case, "TFLOP/s", tflops, "torch-gather-bmm" if peer else "none",
                    peer, ms=round(ms, 4))]
    finally:
        c.free()


def run(ctx: BenchContext) -> list[dict]:
    """Decode (GB/s of KV) and prefill (TFLOP/s) rows; ``ctx.quick`` runs a small subset."""
    batches, lengths = ((1, 32), (4096,)) if ctx.quick else ((1, 32, 128), (4096, 8192, 32768))
    rows: list[dict] = []
    for L in lengths:
        for B in batches:
            rows += _decode_rows(ctx, B, L)
    prefill = ((1, 256, 256),) if ctx.quick else ((2, 1024, 1024), (1, 2048, 0))
    for B, q, past in prefill:
        rows += _prefill_rows(ctx, B, q, past)
    return rows
