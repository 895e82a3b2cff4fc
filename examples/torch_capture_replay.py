#!/usr/bin/env python3
"""Embedding attnrt in an executor that owns torch tensors: wrap, run, capture, replay.

    python examples/torch_capture_replay.py [--steps N] [--seed S]

Needs a CUDA GPU and torch with CUDA. Exit status: 0 clean; 1 a mismatch (an output, the
cache, the latch or the ledger); 2 this machine cannot run it (no GPU, no torch).

The program plays an inference executor that owns all of its memory through torch, and
runs one MLA decode op (LATENT ``com.microsoft::PagedAttention``: 16 heads, latent 576 /
value 512, block 64, RoPE) for three sequences of different lengths:

1. ``CudaRuntime(0)`` retains the device's primary context, the one torch uses, so device
   pointers pass freely between the two.
2. torch allocates everything: query, new latent key, the paged latent cache, the index
   tensors (``cumulative_sequence_length``, ``past_seqlens``, ``block_table``,
   ``slot_mapping``), the RoPE tables, the output and the op's workspace.
3. ``TensorView.from_array`` / ``TensorMut.from_array`` wrap them through DLPack: no copy,
   and the view keeps its tensor alive.
4. Ordering: attnrt launches on ``rt.stream`` (a non-blocking stream). After setup, everything
   torch does to these tensors runs on that same stream through
   ``torch.cuda.ExternalStream(rt.stream.ptr)``, so torch's in-place updates, attnrt's
   kernels and the graph replays are ordered by the stream itself, with no device-wide
   synchronization between them. (The blunt alternative: ``torch.cuda.synchronize()``
   before each replay.)
5. Claim (``unsupported_reason``), create, ``workspace_requirement`` (pure), one eager
   ``execute`` (PagedAttention captures only a signature that ran eagerly: the first run
   loads the modules and raises the shared-memory limit), then capture the op into a graph.
6. Between replays the inputs change in place: positions advance (``past_seqlens += 1``,
   ``slot_mapping`` recomputed from the block table on the device) and new query and key
   rows are written. The graph reads the same pointers, so it is never captured again.
7. After every replay ``rt.latch.check()`` waits for the stream and raises ``CaptureError``
   naming any error a kernel latched on the device; then the output and the cache are
   compared with the float64 reference (``attnrt.ops.reference``).
8. Teardown: the graph is destroyed and the ledger shows zero live bytes (torch owns every
   byte, and the op allocated nothing behind the executor's back).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import attnrt  # noqa: E402
from attnrt.ops import reference  # noqa: E402
from attnrt.ops.paged_attention import PagedAttentionFactory  # noqa: E402
from attnrt.runtime.api import DataType, Node, TensorMut, TensorView, WorkspaceView  # noqa: E402

H, HS, VHS, BS, ROPE = 16, 576, 512, 64, 64
PAST = (100, 7, 250)  # cached tokens per sequence before the first step
TOL = 1e-2  # relative Frobenius error, bf16


def mla_node() -> Node:
    """The LATENT PagedAttention node: RoPE on the latent's last 64 channels, DeepSeek scale."""
    attrs = {"kv_cache_layout": "LATENT", "num_heads": H, "kv_num_heads": 1, "v_head_size": VHS,
             "scale": 1.0 / math.sqrt(192), "do_rotary": 1, "rotary_interleaved": 0,
             "rotary_offset": HS - ROPE}
    inputs = ["query", "key", None, "key_cache", None, "cumulative_sequence_length",
              "past_seqlens", "block_table", "cos_cache", "sin_cache", "slot_mapping"]
    return Node("PagedAttention", "com.microsoft", attrs, inputs, ["output", "key_cache"])


def rel_fro(out: np.ndarray, ref: np.ndarray) -> float:
    o, r = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(o)):
        return math.inf
    return float(np.linalg.norm(o - r) / max(float(np.linalg.norm(r)), 1e-30))


def run(torch: Any, rt: attnrt.CudaRuntime, steps: int, seed: int) -> list[str]:
    """The embedding itself; returns the mismatches found (empty: clean)."""
    dev, bf16 = torch.device("cuda", 0), torch.bfloat16
    B = len(PAST)
    max_len = max(PAST) + steps + 1
    mb = -(-max_len // BS)
    nb = B * mb + 2
    g = torch.Generator().manual_seed(seed)
    gd = torch.Generator(device=dev).manual_seed(seed)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, generator=g).to(dev, bf16)

    # -- 2. torch owns the memory --------------------------------------------------------
    half = ROPE // 2
    ang = torch.arange(max_len, dtype=torch.float64)[:, None] / 10000.0 ** (
        torch.arange(half, dtype=torch.float64)[None, :] / half)
    t = {"query": randn(B, H * HS), "key": randn(B, HS), "key_cache": randn(nb, BS, 1, HS),
         "cumulative_sequence_length": torch.arange(B + 1, dtype=torch.int32, device=dev),
         "past_seqlens": torch.tensor(PAST, dtype=torch.int32, device=dev),
         "block_table": torch.randperm(nb, generator=g)[:B * mb].reshape(B, mb).to(dev, torch.int32),
         "cos_cache": ang.cos().to(dev, bf16), "sin_cache": ang.sin().to(dev, bf16),
         "slot_mapping": torch.empty(B, dtype=torch.int32, device=dev),
         "output": torch.empty(B, H * VHS, dtype=bf16, device=dev)}
    rows = torch.arange(B, device=dev)

    def advance(first: bool) -> None:
        """New token per sequence: positions, slots, query and key rows, all in place."""
        past, slot = t["past_seqlens"], t["slot_mapping"]
        if not first:
            past += 1
        p = past.long()
        slot.copy_(t["block_table"][rows, p // BS].long() * BS + p % BS)
        t["query"].copy_(torch.randn(B, H * HS, generator=gd, device=dev))
        t["key"].copy_(torch.randn(B, HS, generator=gd, device=dev))
        t["output"].fill_(float("nan"))  # poison: the op must write every element

    advance(first=True)
    torch.cuda.synchronize()  # setup ran on torch's stream; from here on only rt.stream is used
    stream = torch.cuda.ExternalStream(rt.stream.ptr)

    # -- 3. DLPack views (no copies) -----------------------------------------------------
    node = mla_node()
    views = [TensorView.absent_slot() if n is None else TensorView.from_array(t[n]) for n in node.inputs]
    outs = [TensorMut.from_array(t["output"]), TensorMut.from_array(t["key_cache"])]
    assert views[0].dtype == DataType.BFLOAT16 and outs[1].ptr == views[3].ptr

    # -- 5. claim, create, workspace, eager run ------------------------------------------
    factory = PagedAttentionFactory(rt)
    shapes = [None if v.absent else v.shape for v in views]
    reason = factory.unsupported_reason(node, shapes, [None if v.absent else v.dtype for v in views])
    if reason is not None:
        return [f"the factory declined the node: {reason}"]
    kernel = factory.create(node, shapes)
    req = kernel.workspace_requirement([None if v.absent else v.meta for v in views])
    ws_tensor = torch.empty(max(req.nbytes, 1), dtype=torch.uint8, device=dev)
    assert ws_tensor.data_ptr() % req.alignment == 0  # torch blocks are 512-byte aligned
    ws = WorkspaceView(ws_tensor.data_ptr(), req.nbytes) if req.nbytes else None
    torch.cuda.synchronize()

    host_cache = to_numpy(t["key_cache"])  # the reference's cache, advanced step by step
    problems: list[str] = []

    def check(label: str) -> None:
        nonlocal host_cache
        rt.latch.check()  # waits for rt.stream; raises CaptureError naming latched bits
        with torch.cuda.stream(stream):  # read back on the stream that wrote them
            got = {n: to_numpy(x) for n, x in t.items()}
        ins = [None if n is None else got[n] for n in node.inputs]
        ins[3] = host_cache
        want_out, want_cache = reference.paged_attention(node, ins)
        err = rel_fro(got["output"], want_out)
        # Only this step's rows may change, and they must match the reference bit for bit
        # outside RoPE's channels (the rotation itself rounds once in f32 vs f64).
        diff = (got["key_cache"].view(np.uint16) != want_cache.view(np.uint16)).reshape(-1, HS)
        written = set(got["slot_mapping"].tolist())
        stray = sorted(set(np.nonzero(diff.any(axis=1))[0].tolist()) - written)
        nope = int(diff[:, :HS - ROPE].sum())
        cache_err = rel_fro(got["key_cache"], want_cache)
        print(f"{label:>9}: past_seqlens {got['past_seqlens'].tolist()}, slots {sorted(written)}, "
              f"output rel err {err:.2e}, cache rel err {cache_err:.1e}", flush=True)
        if not err <= TOL:
            problems.append(f"{label}: output relative error {err:.2e} > {TOL}")
        if stray or nope or not cache_err <= TOL:
            problems.append(f"{label}: cache mismatch (rows outside the slots {stray[:8]}, "
                            f"{nope} unrotated channels differ, rel err {cache_err:.1e})")
        host_cache = want_cache

    kernel.execute(views, outs, ws)  # eager: loads modules, warms this exact signature
    check("eager")

    # -- capture once, then replay with changing inputs ----------------------------------
    with rt.capture() as graph:
        kernel.execute(views, outs, ws)  # recorded, not run
    try:
        for i in range(steps):
            with torch.cuda.stream(stream):  # 4./6.: in-place updates, ordered before the replay
                advance(first=False)
            graph.replay()
            check(f"replay {i + 1}")
    finally:
        graph.destroy()
    rt.synchronize()
    live = rt.memory_stats().live_bytes
    if live:
        problems.append(f"ledger: {live} bytes live at teardown")
    print(f"   ledger: {live} live bytes; graph replays: {graph.replays}; "
          f"kernels per eager execute: {2 + (kernel.last_plan.splits > 1)}", flush=True)
    return problems


def to_numpy(x: Any) -> np.ndarray:
    """A torch tensor's values as numpy (bfloat16 through float32, which is exact)."""
    if str(x.dtype) == "torch.bfloat16":
        return x.float().cpu().numpy().astype(ml_dtypes.bfloat16)
    return x.cpu().numpy()


def main(argv: list[str] | None = None) -> int:
    """Parse options, check the machine, run; the exit status (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=8, help="graph replays (positions advance each)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        import torch
    except Exception as exc:  # absent or broken: this example cannot run here
        print(f"capture_replay: cannot run: torch is not importable ({exc})")
        return 2
    reason = attnrt.gpu_missing_reason()
    if reason is not None or not torch.cuda.is_available():
        print(f"capture_replay: cannot run: {reason or 'torch has no CUDA'}")
        return 2
    torch.zeros(1, device="cuda")  # torch's context first; attnrt then retains the same one
    rt = attnrt.CudaRuntime(0)
    try:
        problems = run(torch, rt, args.steps, args.seed)
    except attnrt.AttnrtError as exc:  # a refused input, or a latched device error after a replay
        problems = [f"{type(exc).__name__}: {exc}"]
    finally:
        rt.close()
    for msg in problems:
        print(f"MISMATCH {msg}")
    print("capture_replay: " + ("OK" if not problems else f"FAILED ({len(problems)} problems)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
