"""``tools/bench.py attention``: pkg.nxrt::Attention against torch SDPA and the copy ceiling.

Prefill rows: TFLOP/s (4·B·H·S²·D, halved for causal) for bf16 and f16, D 64 and 128,
(B, H, S) in {(8, 32, 1024), (2, 32, 4096), (1, 32, 8192)}, causal and not, each beside
torch SDPA's flash and cuDNN backends measured in the same run. Decode rows: Sq = 1, GQA
32/8, D 128, bf16, Sk in {1k, 8k, 32k}, in GB/s of K/V (+ Q, O) bytes beside the measured
copy bandwidth (``"peer": "copy-bandwidth"``, ``"of_ceiling"``) and torch SDPA. One extra
row ("nxrt-unfused") measures the path heuristic: fused vs unfused at one prefill shape.

Our calls are timed as replays of a captured CUDA graph (the device time of our kernels, not
Python's host-side validation, which would otherwise sit between the timing events); torch
runs eagerly. Every case also checks our output against torch's (relative Frobenius error in
the row's ``err_vs_torch``).
"""

from __future__ import annotations

from typing import Any

from bench import row

from attnrt.ops.attention import AttentionConfig, AttentionKernel, wg_build
from attnrt.runtime.api import Node, TensorMut, TensorView, WorkspaceView

PREFILL_SHAPES = [(8, 32, 1024), (2, 32, 4096), (1, 32, 8192)]
DECODE_SK = [1024, 8192, 32768]
#: Decode calls captured into one graph for the "in a decode graph" rows.
STEP_CALLS = 8


def _node(H: int, Hkv: int, causal: bool) -> Node:
    return Node("Attention", "pkg.nxrt", {"num_heads": H, "kv_num_heads": Hkv,
                                          "causal": int(causal)}, ["q", "k", "v"], ["o"])


class _Ours:
    """One kernel bound to torch tensors, with its workspace (torch-allocated)."""

    def __init__(self, ctx: Any, node: Node, q: Any, k: Any, v: Any, path: str = "auto") -> None:
        torch = ctx.torch
        self.ctx = ctx
        self.out = torch.empty_like(q)
        self.ins = [TensorView.from_array(t) for t in (q, k, v)]
        self.outs = [TensorMut.from_array(self.out)]
        self.kernel = AttentionKernel(ctx.rt, node, config=AttentionConfig(path=path))
        req = self.kernel.workspace_requirement([t.meta for t in self.ins])
        self._ws_buf = None
        self.ws = None
        if req.nbytes:
            self._ws_buf = torch.empty(req.nbytes + req.alignment, dtype=torch.uint8, device="cuda")
            p = self._ws_buf.data_ptr()
            p = -(-p // req.alignment) * req.alignment
            self.ws = WorkspaceView(p, req.nbytes)
        torch.cuda.synchronize()

    def __call__(self) -> None:
        self.kernel.execute(self.ins, self.outs, self.ws)

    def time(self, reps: int = 20) -> float:
        """Median ms of the call replayed as a CUDA graph (device time, no Python overhead)."""
        rt = self.ctx.rt
        self()  # compile and warm up outside the capture
        rt.synchronize()
        with rt.capture() as graph:
            self()
        try:
            return self.ctx.time_ours(graph.replay, reps=reps)
        finally:
            graph.destroy()


def _rel(a: Any, b: Any) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _sdpa(ctx: Any, backend: Any, q: Any, k: Any, v: Any, causal: bool, gqa: bool = False):
    torch = ctx.torch
    from torch.nn.attention import sdpa_kernel

    F = torch.nn.functional

    def call():
        with sdpa_kernel(backend):
            if gqa:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    ref = call()  # raises here when the backend declines the case
    return call, ref


def _peers(ctx: Any) -> list[tuple[str, Any]]:
    from torch.nn.attention import SDPBackend

    return [("torch-sdpa-flash", SDPBackend.FLASH_ATTENTION),
            ("torch-sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)]


def _prefill(ctx: Any, rows: list[dict]) -> None:
    torch = ctx.torch
    dtypes = [torch.bfloat16] if ctx.quick else [torch.bfloat16, torch.float16]
    shapes = [(2, 32, 1024)] if ctx.quick else PREFILL_SHAPES
    reps = 5 if ctx.quick else 20
    for dt in dtypes:
        dname = "bf16" if dt == torch.bfloat16 else "f16"
        for D in (64, 128):
            for B, H, S in shapes:
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dt, generator=g)
                           for _ in range(3))
                for causal in (False, True):
                    case = f"{dname} D{D} B{B} H{H} S{S} causal={int(causal)}"
                    flops = 4 * B * H * S * S * D / (2 if causal else 1)
                    ours = _Ours(ctx, _node(H, H, causal), q, k, v)
                    ms = ours.time(reps)
                    tf = flops / ms / 1e9
                    path = ours.kernel.last_plan.path
                    if path == "wg":  # which wgmma build ran: schedule and keys per tile
                        sched, keys, _ = wg_build(D, causal, S)
                        path = f"wg s{sched} k{keys}"
                    for name, backend in _peers(ctx):
                        try:
                            call, ref = _sdpa(ctx, backend, q, k, v, causal)
                            torch.cuda.synchronize()
                            err = _rel(ours.out, ref)
                            pv = flops / ctx.time_torch(call, reps=reps) / 1e9
                        except Exception as exc:  # the backend declined this case
                            ctx.log(f"{case}: {name} unavailable: {type(exc).__name__}: {exc}")
                            err, pv = None, None
                        rows.append(row("attention", case, "TFLOP/s", tf, name, pv, path=path,
                                        err_vs_torch=None if err is None else round(err, 5)))
                    ctx.log(f"{case}: ours {tf:.1f} TFLOP/s ({path})")
                    del ours
                del q, k, v
    if ctx.quick:
        return
    # The heuristic's measurement: fused vs unfused at one shape (unfused needs B*H*S*S*4 bytes).
    B, H, S, D = 8, 32, 1024, 128
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    flops = 4 * B * H * S * S * D
    fused = _Ours(ctx, _node(H, H, False), q, k, v)
    unfused = _Ours(ctx, _node(H, H, False), q, k, v, path="unfused")
    tf_f = flops / fused.time() / 1e9
    tf_u = flops / unfused.time() / 1e9
    rows.append(row("attention", f"bf16 D{D} B{B} H{H} S{S} causal=0 fused vs unfused", "TFLOP/s",
                    tf_f, "nxrt-unfused", tf_u, err_vs_torch=round(_rel(fused.out, unfused.out), 5)))


def _decode(ctx: Any, rows: list[dict]) -> None:
    torch = ctx.torch
    B, H, Hkv, D = (2, 32, 8, 128) if ctx.quick else (8, 32, 8, 128)
    copy = ctx.ceilings.get("copy_GBps")
    for Sk in DECODE_SK[:2] if ctx.quick else DECODE_SK:
        g = torch.Generator(device="cuda").manual_seed(2)
        q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16, generator=g)
                for _ in range(2))
        nbytes = 2 * (q.numel() * 2 + k.numel() + v.numel())  # Q + O + K + V, 2 bytes each
        case = f"decode bf16 D{D} B{B} H{H}/{Hkv} Sk{Sk}"
        ours = _Ours(ctx, _node(H, Hkv, False), q, k, v)
        gbps = nbytes / ours.time() / 1e6
        plan = ours.kernel.last_plan
        rows.append(row("attention", case, "GB/s", gbps, "copy-bandwidth", copy,
                        of_ceiling=None if not copy else round(gbps / copy, 4),
                        path=plan.path, splits=plan.splits))
        try:
            from torch.nn.attention import SDPBackend

            call, ref = _sdpa(ctx, SDPBackend.FLASH_ATTENTION, q, k, v, False, gqa=True)
            torch.cuda.synchronize()
            err = _rel(ours.out, ref)
            rows.append(row("attention", case, "GB/s", gbps, "torch-sdpa-flash",
                            nbytes / ctx.time_torch(call) / 1e6, err_vs_torch=round(err, 5)))
        except Exception as exc:
            ctx.log(f"{case}: torch flash GQA decode unavailable: {type(exc).__name__}: {exc}")
        ctx.log(f"{case}: ours {gbps:.0f} GB/s ({plan.path}, {plan.splits} splits)")
        del ours, q, k, v
        _decode_steps(ctx, rows, B, H, Hkv, D, Sk, nbytes, copy)


def _decode_steps(ctx: Any, rows: list[dict], B: int, H: int, Hkv: int, D: int, Sk: int,
                  nbytes: int, copy: float | None) -> None:
    """Decode as it runs inside a captured decode step: one graph holding STEP_CALLS calls
    over input sets rotated so that their K/V exceed L2 (every call reads HBM), timed per
    call. The graph's launch cost is spread over the calls, as in a model's decode graph
    where attention is one node of many. torch flash and a same-size device copy (rt.dtod of
    the K/V bytes, read + write counted) are timed the same way."""
    torch, rt = ctx.torch, ctx.rt
    l2 = int(getattr(rt.capabilities, "l2_bytes", 0) or 50 << 20)
    nsets = max(2, min(4, -(-3 * l2 // nbytes)))
    reps = max(1, STEP_CALLS // nsets)
    g = torch.Generator(device="cuda").manual_seed(3)
    sets = [(torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=g),
             *(torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(2))) for _ in range(nsets)]
    ours = [_Ours(ctx, _node(H, Hkv, False), *s) for s in sets]
    case = f"decode bf16 D{D} B{B} H{H}/{Hkv} Sk{Sk}, {reps * nsets} calls in one graph"
    calls = reps * nsets
    try:
        for o in ours:
            o()
        rt.synchronize()
        with rt.capture() as graph:
            for _ in range(reps):
                for o in ours:
                    o()
        try:
            ms = ctx.time_ours(graph.replay) / calls
        finally:
            graph.destroy()
        gbps = nbytes / ms / 1e6
        rows.append(row("attention", case, "GB/s", gbps, "copy-bandwidth", copy,
                        of_ceiling=None if not copy else round(gbps / copy, 4),
                        sets=nsets, path=ours[0].kernel.last_plan.path))
        # The same bytes moved by the copy engine path we use for the ceiling, same method.
        kv = nbytes // 2  # K + V (+ Q, O) bytes: copied once, so read + write = nbytes
        bufs = [(rt.alloc_raw(kv), rt.alloc_raw(kv)) for _ in range(nsets)]
        try:
            for src, _ in bufs:
                rt.memset(src, 0x3C, kv)
            with rt.capture() as cg:
                for _ in range(reps):
                    for src, dst in bufs:
                        rt.dtod(dst, src, kv)
            try:
                cms = ctx.time_ours(cg.replay) / calls
            finally:
                cg.destroy()
        finally:
            for src, dst in bufs:
                rt.free_raw(src)
                rt.free_raw(dst)
        rows.append(row("attention", case, "GB/s", gbps, "same-size copy, same method",
                        nbytes / cms / 1e6))
        try:
            from torch.nn.attention import SDPBackend

            calls_t = [_sdpa(ctx, SDPBackend.FLASH_ATTENTION, *s, False, gqa=True)[0]
                       for s in sets]
            tms = ctx.time_torch_graph(calls_t, reps)
            rows.append(row("attention", case, "GB/s", gbps, "torch-sdpa-flash",
                            nbytes / tms / 1e6))
        except Exception as exc:
            ctx.log(f"{case}: torch flash in a graph unavailable: {type(exc).__name__}: {exc}")
        ctx.log(f"{case}: ours {gbps:.0f} GB/s over {nsets} input sets")
    finally:
        del ours, sets


def run(ctx: Any) -> list[dict]:
    """All attention rows (see the module docstring)."""
    rows: list[dict] = []
    if ctx.torch is None:
        ctx.log("attention: torch with CUDA is not importable; no peers and no inputs to wrap")
        return [row("attention", "skipped", "none", 0, "torch", None, error="torch unavailable")]
    _prefill(ctx, rows)
    _decode(ctx, rows)
    return rows

