#!/usr/bin/env python3
"""Record what the three ops launch for a grid of calls: ``python tools/op_snapshot.py OUT.txt``.

For checking a change that should not change any op's host behaviour (a rename, a moved
module, a restructured planner): run it before and after, then ``cmp`` the two files.
No GPU is needed: every call runs against ``tests/_fakes.py``'s ``FakeRuntime`` (a fresh
one per case), as the fuzz suites drive it.

Each case (``pkg.nxrt::Attention``, ``com.microsoft::PagedAttention`` (LATENT),
``pkg.nxrt::IndexShare``) runs the executor's sequence: the factory's
``unsupported_reason``, ``create``, the kernel's ``workspace_requirement``, then
``execute`` (with a workspace of the required bytes, or none), and for some cases a
second ``execute`` while the fake stream is capturing. One line per case::

    <op> <device> <case description> => claim=<None|reason> | ws=<bytes>/<alignment>
        | <event> ; <event> ; ... [| !<stage> <ErrorType>: <message>] | live=<bytes>

Events are the runtime calls in order: every launch (entry, module, compile options,
arch, grid, block, dynamic shared memory, programmatic flag, arguments), and the memory
calls (``alloc``, ``free``, ``memset``, ``dtod``, ``dtoh``, ``htod``). Pointers are
symbolic: ``<tensor>+<byte offset>`` where the tensor is ``in<i>`` / ``out<i>`` (the
call's tensors), ``ws`` (the workspace), ``latch``, or ``a<n>`` (the n-th ``alloc_raw`` of
the case); ``0`` is the null pointer. Numpy scalars print as ``<dtype>:<value>``. Hex
pointers inside error messages are replaced the same way. ``live`` is what the runtime
still has allocated after the kernel's ``close()``.

The grid per op: a main product (shapes with decode, prefill and odd sizes, every dtype
the op takes, attribute sets, every ``path``) on both devices, a secondary one (masks,
strided and misaligned layouts, no workspace, forced splits and merges, host/device
metadata, aliased caches, bias ranks, capture, bad indices) and, for IndexShare, a sweep of
``plan_override`` knob sets on ``h200`` that reaches every build ``compile_variants()``
lists; there a refused ``workspace_requirement`` is recorded as ``ws!<ErrorType>: ...``
and ``execute`` still runs without a workspace, as the sweeps and benchmarks call it.

Devices: ``h200`` (the fake's default: sm_90, 132 SMs, 227 KiB shared memory) and
``a100`` (sm_80, 108 SMs, 163 KiB). ``--quick`` runs
every 10th case. Project names are imported only in :func:`_imports`; the other contact
points are the fake's public surface (``view``, ``address``, ``launches``, ``write``,
``capabilities``, the capture calls) and the ops' factory arguments and kernel knobs.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import itertools
import math
import os
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _imports() -> SimpleNamespace:
    """Every project name this tool uses (the only place to edit after a rename)."""
    import dataclasses

    import attnrt.ops as nxrt_kernels
    from attnrt.ops.attention import AttentionConfig
    from attnrt.ops.attention import AttentionFactory as _AttentionFactory
    from attnrt.ops.index_share import IndexShareConfig, IndexShareKernel
    from attnrt.ops.index_share import IndexShareFactory as _IndexShareFactory
    from attnrt.ops.paged_attention import PagedAttentionConfig
    from attnrt.ops.paged_attention import PagedAttentionFactory as _Paged
    from attnrt.runtime.api import DataType, Node, TensorMut, TensorView, WorkspaceView
    from tests._fakes import FakeRuntime

    def PagedAttentionFactory(rt, *, path="auto", num_splits=None):  # noqa: N802 - a factory
        return _Paged(rt, config=PagedAttentionConfig(path=path, num_splits=num_splits))

    def AttentionFactory(rt: Any, **kw: Any) -> Any:  # noqa: N802 - the old factory's signature
        # the knobs are an AttentionConfig now; an invalid one still refuses at "factory"
        return _AttentionFactory(rt, AttentionConfig(**kw))

    class _OldKnobsKernel(IndexShareKernel):
        """The cases' old knob spelling, mapped onto the kernel's IndexShareConfig."""

        @property
        def path_override(self) -> Any:
            return self.config.path

        @path_override.setter
        def path_override(self, path: Any) -> None:
            self.config = dataclasses.replace(self.config, path=path)

        @property
        def plan_override(self) -> Any:
            return None

        @plan_override.setter
        def plan_override(self, knobs: Any) -> None:
            self.config = IndexShareConfig(path=self.config.path, **(knobs or {}))

    class IndexShareFactory(_IndexShareFactory):
        def create(self, node: Any, input_shapes: Any = ()) -> Any:
            kern = super().create(node, input_shapes)
            kern.__class__ = _OldKnobsKernel
            return kern

    return SimpleNamespace(
        DataType=DataType, Node=Node, TensorMut=TensorMut, TensorView=TensorView,
        WorkspaceView=WorkspaceView, FakeRuntime=FakeRuntime,
        AttentionFactory=AttentionFactory,          # (rt, path=, num_splits=, dec_merge=)
        PagedAttentionFactory=PagedAttentionFactory,  # (rt, path=, num_splits=)
        IndexShareFactory=IndexShareFactory,        # (rt); kernel.path_override / plan_override
        # entry (substring) of IndexShare's frontier kernel, whose args[1] receives the
        # per-batch valid lengths in fixed-capacity mode (the fake runs no kernel)
        frontier_entry="is_frontier",
        kernels_file=nxrt_kernels.__file__,
    )


NS: SimpleNamespace | None = None


def ns() -> SimpleNamespace:
    global NS
    if NS is None:
        NS = _imports()
    return NS


# ------------------------------------------------------------------------------ recording
DEVICES = {
    "h200": None,  # the fake's defaults
    "a100": dict(arch="sm_80", compute_capability=(8, 0), sm_count=108,
                 max_shared_per_block_optin=166912, l2_bytes=40 << 20, name="fake A100"),
}

_RT_CLASS: Any = None


def _runtime_class() -> Any:
    """FakeRuntime plus an event log with symbolic pointers."""
    global _RT_CLASS
    if _RT_CLASS is not None:
        return _RT_CLASS
    base = ns().FakeRuntime

    class Recorder(base):  # type: ignore[misc, valid-type]
        def __init__(self, device: str) -> None:
            super().__init__()
            over = DEVICES[device]
            if over:
                for k, v in over.items():
                    setattr(self.capabilities, k, v)
                self.arch = over["arch"]
            self.events: list[str] = []
            self.frontier_lens: np.ndarray | None = None
            self._tag_starts: list[int] = []
            self._tags: dict[int, tuple[str, int]] = {}
            self._n_alloc = 0
            self.tag(self.latch.ptr, 4, "latch")

        # -- symbolic pointers ---------------------------------------------------------
        def tag(self, ptr: int, nbytes: int, name: str) -> None:
            ptr = int(ptr)
            if ptr == 0 or ptr in self._tags:
                return  # an alias keeps the first name (inputs are tagged before outputs)
            self._tags[ptr] = (name, int(nbytes))
            bisect.insort(self._tag_starts, ptr)

        def sym(self, ptr: int) -> str:
            ptr = int(ptr)
            if ptr == 0:
                return "0"
            i = bisect.bisect_right(self._tag_starts, ptr) - 1
            if i < 0:
                return "?"
            start = self._tag_starts[i]
            return f"{self._tags[start][0]}+{ptr - start}"

        def arg(self, a: Any) -> str:
            if type(a) is int:
                return self.sym(a)
            if isinstance(a, np.generic):
                v = a.item()
                return f"{a.dtype.name}:{v!r}"
            return f"{type(a).__name__}:{a!r}"

        # -- the runtime surface, recorded -----------------------------------------------
        def alloc_raw(self, nbytes: int) -> int:
            ptr = super().alloc_raw(nbytes)
            name = f"a{self._n_alloc}"
            self._n_alloc += 1
            self.tag(ptr, int(nbytes), name)
            self.events.append(f"alloc({name},{int(nbytes)})")
            return ptr

        def free_raw(self, ptr: int) -> None:
            s = self.sym(ptr)
            super().free_raw(ptr)
            self.events.append(f"free({s})")

        def memset(self, ptr: int, value: int, nbytes: int) -> None:
            self.events.append(f"memset({self.sym(ptr)},{int(value)},{int(nbytes)})"
                               + ("@cap" if self.is_capturing() else ""))
            super().memset(ptr, value, nbytes)

        def dtod(self, dst: int, src: int, nbytes: int) -> None:
            self.events.append(f"dtod({self.sym(dst)},{self.sym(src)},{int(nbytes)})"
                               + ("@cap" if self.is_capturing() else ""))
            super().dtod(dst, src, nbytes)

        def htod(self, ptr: int, host: Any) -> None:
            self.events.append(f"htod({self.sym(ptr)},{np.asarray(host).nbytes})")
            super().htod(ptr, host)

        def dtoh(self, host: np.ndarray, ptr: int) -> np.ndarray:
            self.events.append(f"dtoh({self.sym(ptr)},{host.nbytes})")
            return super().dtoh(host, ptr)

        def launch(self, fn: Any, grid: Any, block: Any, args: Any, shared_mem: int = 0, *,
                   programmatic: bool = False) -> None:
            super().launch(fn, grid, block, args, shared_mem, programmatic=programmatic)
            rec = self.launches[-1]
            self.events.append(
                f"L {fn.name} {fn.module} [{' '.join(fn.options)}] arch={fn.arch} "
                f"grid={rec.grid} block={rec.block} smem={rec.shared_mem} "
                f"prog={int(rec.programmatic)}{' @cap' if rec.captured else ''} "
                f"args=[{', '.join(self.arg(a) for a in rec.args)}]")
            if (self.frontier_lens is not None and not rec.captured
                    and ns().frontier_entry in fn.name):
                self.write(int(rec.args[1]), self.frontier_lens)  # play the frontier kernel

    _RT_CLASS = Recorder
    return Recorder


_HEX = re.compile(r"0x[0-9a-fA-F]{6,}")


def _clean(msg: str, rt: Any) -> str:
    msg = _HEX.sub(lambda m: "<" + rt.sym(int(m.group(0), 16)) + ">", str(msg))
    return " ".join(msg.split())


def _absent(t: Any) -> bool:
    return t is None or getattr(t, "absent", False)


def run_case(rt: Any, factory: Any, node: Any, inputs: list, outputs: list, *,
             use_ws: bool, claim_inputs: list | None = None, ws_inputs: Any = None,
             setup: Any = None, capture: bool = False, execute_anyway: bool = False) -> str:
    """The executor's sequence on one case; the record after '=>'.

    ``execute_anyway``: a refused ``workspace_requirement`` is recorded and ``execute``
    still runs, without a workspace (how the sweeps and benchmarks call pinned plans).
    """
    n = ns()
    parts: list[str] = []
    ci = inputs if claim_inputs is None else claim_inputs
    try:
        reason = factory.unsupported_reason(node, [None if _absent(t) else t.shape for t in ci],
                                            [None if _absent(t) else t.dtype for t in ci])
        parts.append(f"claim={_clean(reason, rt) if reason is not None else None}")
    except Exception as exc:  # noqa: BLE001 - a raising claim is part of the record
        parts.append(f"claim!{type(exc).__name__}: {_clean(exc, rt)}")
    stage, kern, err = "create", None, None
    try:
        kern = factory.create(node, [None if _absent(t) else t.shape for t in ci])
        if setup is not None:
            setup(kern)
        stage = "workspace"
        wsi = ws_inputs if ws_inputs is not None else [
            None if _absent(t) else t.meta for t in inputs]
        try:
            req = kern.workspace_requirement(wsi)
        except Exception as exc:  # noqa: BLE001
            if not execute_anyway:
                raise
            # as a benchmark calls it: no planned workspace, the kernel's own scratch
            parts.append(f"ws!{type(exc).__name__}: {_clean(exc, rt)}")
            req = None
        else:
            parts.append(f"ws={req.nbytes}/{req.alignment}")
        ws = None
        if req is not None and req.nbytes and use_ws:
            ptr = rt.address(req.nbytes)
            rt.tag(ptr, req.nbytes, "ws")
            ws = n.WorkspaceView(ptr, req.nbytes)
        stage = "execute"
        kern.execute(inputs, outputs, ws)
        if capture:
            stage = "capture"
            rt.events.append("CAPTURE")
            rt.begin_capture()
            try:
                kern.execute(inputs, outputs, ws)
            finally:
                if rt.is_capturing():
                    rt.end_capture()
    except Exception as exc:  # noqa: BLE001 - every refusal is part of the record
        err = f"!{stage} {type(exc).__name__}: {_clean(exc, rt)}"
    finally:
        if kern is not None and hasattr(kern, "close"):
            try:
                kern.close()
            except Exception as exc:  # noqa: BLE001
                err = (err or "") + f" !close {type(exc).__name__}: {_clean(exc, rt)}"
    parts.append(" ; ".join(rt.events) if rt.events else "-")
    if err:
        parts.append(err)
    parts.append(f"live={rt.memory_stats().live_bytes}")
    return " | ".join(parts)


def _fmt(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_fmt(x)}" for k, x in sorted(v.items())) + "}"
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(_fmt(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if hasattr(v, "name") and not isinstance(v, str):
        return str(v.name)
    return repr(v) if isinstance(v, (str, float)) else str(v)


def describe(fields: dict) -> str:
    return " ".join(f"{k}={_fmt(v)}" for k, v in fields.items())


# ------------------------------------------------------------------------------ Attention
ATT_SHAPES = [
    # B, H, Hkv, Sq, Sk, D: decode
    (1, 32, 8, 1, 1024, 128), (8, 32, 8, 1, 4096, 128), (4, 8, 1, 1, 300, 64),
    (2, 16, 16, 1, 777, 80), (1, 4, 2, 3, 5000, 256), (64, 32, 8, 1, 2048, 128),
    (3, 6, 2, 2, 100, 72), (1, 2, 1, 1, 1, 40), (1, 16, 1, 1, 65, 128), (1, 32, 1, 1, 8192, 64),
    # prefill and odd sizes
    (1, 8, 8, 512, 512, 64), (2, 16, 4, 1024, 1024, 128), (1, 4, 4, 129, 8200, 128),
    (1, 2, 1, 77, 333, 96), (2, 3, 3, 33, 47, 20), (1, 1, 1, 300, 3000, 257),
    (1, 4, 2, 0, 10, 64), (1, 4, 2, 5, 0, 64), (1, 2, 2, 17, 19, 1), (1, 8, 2, 64, 4096, 256),
    (1, 4, 4, 128, 128, 136), (3, 5, 5, 1000, 999, 8),
    # decode with the two-CTA cluster merge at the padded head dims 80 and 256
    (48, 8, 1, 1, 2048, 80), (48, 4, 1, 1, 4096, 256),
]
ATT_ATTRS = [
    {},
    {"causal": 1},
    {"causal": 1, "local_window_size": 37, "softcap": 30.0},
    {"local_window_size": 0, "scale": 0.3},
    {"softcap": 50.0, "scale": 0.125, "causal": 0, "local_window_size": -1},
]
ATT_PATHS = ["auto", "fused", "simt", "unfused", "wg", "decode"]
ATT_SECONDARY_SHAPES = [(8, 32, 8, 1, 4096, 128), (1, 4, 2, 3, 5000, 256),
                        (2, 16, 4, 1024, 1024, 128), (2, 3, 3, 33, 47, 20),
                        (1, 1, 1, 300, 3000, 257), (3, 6, 2, 2, 100, 72)]


def _att_strides(shape: tuple, layout: str) -> tuple[tuple | None, int]:
    """(strides of the logical [B, X, S, D] view or None, byte offset of the pointer)."""
    B, X, S, D = shape
    if layout == "bshd":  # memory [B, S, X, D]
        return (S * X * D, D, X * D, 1), 0
    if layout.startswith("pad"):
        P = D + int(layout[3:])
        return (X * S * P, S * P, P, 1), 0
    if layout == "mis":
        return None, -1  # offset: one element
    return None, 0


def attention_cases() -> list[dict]:
    cases = []
    for dev in DEVICES:
        for shape, dt, attrs, path in itertools.product(
                ATT_SHAPES, ("FLOAT", "FLOAT16", "BFLOAT16"), ATT_ATTRS, ATT_PATHS):
            cases.append(dict(dev=dev, shape=shape, dtype=dt, attrs=attrs, path=path))
        variations: list[dict] = []
        for planes, style in itertools.product(("1", "B", "BH"), ("3d", "4d")):
            variations.append(dict(mask=planes, mask_style=style))
        for lay in (("bshd", "bshd", "bshd", "contig"), ("pad8", "pad8", "pad8", "pad8"),
                    ("pad3", "contig", "contig", "contig"), ("contig", "contig", "contig", "pad3"),
                    ("mis", "contig", "contig", "contig"), ("contig", "contig", "contig", "mis"),
                    ("contig", "bshd", "pad8", "bshd")):
            variations.append(dict(layouts=lay))
        variations += [dict(use_ws=False), dict(num_splits=1), dict(num_splits=3),
                       dict(num_splits=70), dict(dec_merge="last"), dict(dec_merge="cluster"),
                       dict(capture=True), dict(capture=True, use_ws=False),
                       dict(mask="B", mask_style="4d", layouts=("bshd",) * 4, use_ws=False)]
        for shape, (dt, path), var in itertools.product(
                ATT_SECONDARY_SHAPES, (("FLOAT", "auto"), ("FLOAT", "unfused"),
                                       ("BFLOAT16", "auto"), ("BFLOAT16", "fused"),
                                       ("BFLOAT16", "decode")), variations):
            cases.append(dict(dev=dev, shape=shape, dtype=dt, attrs={"causal": 1}, path=path,
                              **var))
    return cases


def attention_run(c: dict) -> str:
    n = ns()
    rt = _runtime_class()(c["dev"])
    dt = n.DataType[c["dtype"]]
    B, H, Hkv, Sq, Sk, D = c["shape"]
    attrs = {"num_heads": H, **({"kv_num_heads": Hkv} if Hkv != H else {}), **c["attrs"]}
    mask = c.get("mask")
    names = ["q", "k", "v"] + (["mask"] if mask else [])
    node = n.Node("Attention", "pkg.nxrt", attrs, names, ["o"])
    layouts = c.get("layouts", ("contig",) * 4)
    shapes = [(B, H, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D), (B, H, Sq, D)]
    views = []
    for i, shp in enumerate(shapes):
        strides, off = _att_strides(shp, layouts[i])
        off = dt.itemsize if off < 0 else off
        t = rt.view(shp, dt, strides, mut=i == 3, offset=off)
        views.append(t)
    inputs, out = views[:3], views[3]
    if mask:
        planes = {"1": 1, "B": B, "BH": B * H}[mask]
        if c.get("mask_style", "3d") == "3d":
            mshape: tuple = (planes, Sq, Sk)
        else:
            lead = (B, H) if mask == "BH" else (B, 1) if mask == "B" else (1, 1)
            mshape = (*lead, Sq, Sk)
        inputs.append(rt.view(mshape, dt))
    for i, t in enumerate(inputs):
        rt.tag(t.ptr, max(t.nbytes, 1), f"in{i}")
    rt.tag(out.ptr, max(out.nbytes, 1), "out0")
    kw: dict[str, Any] = {"path": c["path"]}
    if "num_splits" in c:
        kw["num_splits"] = c["num_splits"]
    if "dec_merge" in c:
        kw["dec_merge"] = c["dec_merge"]
    try:
        fac = n.AttentionFactory(rt, **kw)
    except Exception as exc:  # noqa: BLE001
        return f"!factory {type(exc).__name__}: {_clean(exc, rt)}"
    return run_case(rt, fac, node, inputs, [out], use_ws=c.get("use_ws", True),
                    capture=c.get("capture", False))


# ------------------------------------------------------------------------------ PagedAttention
PAGED_NAMES = ("query", "key", "value", "key_cache", "value_cache", "cumulative_sequence_length",
               "past_seqlens", "block_table", "cos_cache", "sin_cache", "slot_mapping",
               "head_sink", "q_norm_weight", "k_norm_weight", "k_scale", "v_scale",
               "attention_metadata")
P_QUERY, P_KEY, P_KC, P_CU, P_PAST, P_BT, P_COS, P_SIN, P_SLOT = 0, 1, 3, 5, 6, 7, 8, 9, 10
P_REQUIRED = (P_QUERY, P_KEY, P_KC, P_CU, P_PAST, P_BT, P_SLOT)
P_INDEX = (P_CU, P_PAST, P_BT, P_SLOT)

PAGED_SHAPES = [
    # head_size, v_head_size, heads, block_size, new tokens per sequence, past lengths
    (576, 512, 16, 64, (1, 1, 1, 1), (100, 2000, 37, 513)),
    (576, 512, 128, 64, (1,) * 8, (4096,) * 8),
    (576, 512, 1, 16, (1,), (0,)),
    (576, 512, 20, 32, (3, 1), (5, 300)),
    (576, 512, 128, 64, (64,), (0,)),
    (576, 512, 5, 128, (2, 0, 1), (7, 9, 0)),
    (64, 64, 8, 16, (1, 1), (30, 200)),
    (128, 64, 3, 32, (4, 2), (50, 0)),
    (33, 33, 2, 16, (5,), (11,)),
    (7, 1, 1, 16, (1,), (3,)),
    (640, 320, 2, 64, (2,), (100,)),
    (9000, 9000, 1, 16, (1,), (1,)),
    (80, 80, 24, 128, (0, 0), (5, 5)),
]
PAGED_ATTRS = ["plain", "rope_half", "rope_interleaved", "softcap_window5", "window0_scale"]
PAGED_PATHS = ["auto", "mla", "mla64", "mla32", "wg", "simple"]


def paged_cases() -> list[dict]:
    cases = []
    for dev in DEVICES:
        for shape, dt, attrs, path in itertools.product(
                PAGED_SHAPES, ("FLOAT16", "BFLOAT16"), PAGED_ATTRS, PAGED_PATHS):
            cases.append(dict(dev=dev, shape=shape, dtype=dt, attrs=attrs, path=path))
        variations = [dict(meta="host"), dict(meta="device"), dict(num_splits=1),
                      dict(num_splits=2), dict(num_splits=5), dict(use_ws=False),
                      dict(cache_out=True), dict(n_inputs=17), dict(extra_cols=3),
                      dict(capture=True), dict(capture=True, use_ws=False), dict(mis=True),
                      dict(meta="host", num_splits=5, cache_out=True, n_inputs=17)]
        for si, dt, path, var in itertools.product(
                (0, 1, 3, 4, 7), ("BFLOAT16",), ("auto", "mla", "simple"), variations):
            cases.append(dict(dev=dev, shape=PAGED_SHAPES[si], dtype=dt, attrs="rope_half",
                              path=path, **var))
    return cases


def paged_run(c: dict) -> str:
    n = ns()
    rt = _runtime_class()(c["dev"])
    dt = n.DataType[c["dtype"]]
    I32 = n.DataType.INT32
    hs, vhs, H, bs, q_lens, past_lens = c["shape"]
    T, B = sum(q_lens), len(q_lens)
    nblk = [-(-(p + q) // bs) for p, q in zip(past_lens, q_lens)]
    nb, mb = sum(nblk) + 2, max(nblk) + 1 + c.get("extra_cols", 0)
    max_pos = max(p + q for p, q in zip(past_lens, q_lens)) + 3
    kind = c["attrs"]
    attrs: dict[str, Any] = {"kv_cache_layout": "LATENT", "num_heads": H, "kv_num_heads": 1,
                             "local_window_size": -1, "softcap": 0.0}
    if vhs != hs:
        attrs["v_head_size"] = vhs
        attrs["scale"] = 1.0 / math.sqrt(hs)
    rope, rd, off = None, 0, 0
    if kind.startswith("rope") and hs >= 2:
        rope = kind[5:]
        if (hs, vhs) == (576, 512) and rope == "half":
            rd, off = 64, 512
        elif rope == "half":
            rd = 2 * max(1, hs // 4)
            off = hs - rd
        else:
            rd, off = hs - hs % 2, 0
        attrs.update(do_rotary=1, rotary_interleaved=int(rope == "interleaved"),
                     rotary_offset=off)
    elif kind == "softcap_window5":
        attrs.update(softcap=30.0, local_window_size=5)
    elif kind == "window0_scale":
        attrs.update(local_window_size=0, scale=0.07)
    n_inputs = c.get("n_inputs", 11)
    names = [PAGED_NAMES[i] if i in P_REQUIRED or (rope and i in (P_COS, P_SIN)) else None
             for i in range(n_inputs)]
    node = n.Node("PagedAttention", "com.microsoft", attrs, names, ["output", None])
    shapes: list = [None] * 16
    shapes[P_QUERY], shapes[P_KEY] = (T, H * hs), (T, hs)
    shapes[P_KC] = (nb, bs, 1, hs)
    shapes[P_CU], shapes[P_PAST], shapes[P_BT], shapes[P_SLOT] = (B + 1,), (B,), (B, mb), (T,)
    if rope:
        shapes[P_COS] = shapes[P_SIN] = (max_pos, rd // 2)
    ins: list[Any] = []
    for i, shp in enumerate(shapes):
        if shp is None:
            ins.append(n.TensorView.absent_slot())
            continue
        off_b = dt.itemsize if (c.get("mis") and i == P_QUERY) else 0
        t = rt.view(shp, I32 if i in P_INDEX else dt, offset=off_b)
        rt.tag(t.ptr, max(t.nbytes, 1), f"in{i}")
        ins.append(t)
    meta: Any = None
    if c.get("meta") == "host":
        meta = np.array([max(q_lens), max(p + q for p, q in zip(past_lens, q_lens))], np.int32)
    elif c.get("meta") == "device":
        meta = rt.view((2,), I32)
        rt.tag(meta.ptr, 8, "in16")
    ins.append(meta)
    out = rt.view((T, H * vhs), dt, mut=True)
    rt.tag(out.ptr, max(out.nbytes, 1), "out0")
    outs: list[Any] = [out]
    if c.get("cache_out"):
        kc = ins[P_KC]
        outs.append(n.TensorMut(kc.ptr, kc.dtype, kc.shape))
    try:
        fac = n.PagedAttentionFactory(rt, path=c["path"], num_splits=c.get("num_splits"))
    except Exception as exc:  # noqa: BLE001
        return f"!factory {type(exc).__name__}: {_clean(exc, rt)}"
    return run_case(rt, fac, node, ins, outs, use_ws=c.get("use_ws", True),
                    claim_inputs=ins[:16], ws_inputs=ins, capture=c.get("capture", False))


# ------------------------------------------------------------------------------ IndexShare
IS_SHAPES = [
    # B, N, Nkv, Sq, cur, past, H, K, index heads
    (1, 64, 1, 1, 1, 2047, 128, 2048, 1),
    (64, 128, 1, 1, 1, 1023, 64, 512, 1),
    (2, 16, 2, 3, 2, 60, 64, 32, 1),
    (3, 8, 8, 2, 1, 0, 100, 5, 8),
    (1, 32, 1, 4, 4, 500, 128, 256, 1),
    (2, 4, 1, 1, 1, 40, 7, 17, 4),
    (1, 2, 2, 0, 3, 10, 16, 4, 2),
    (1, 8, 1, 1, 2, 0, 512, 1, 1),
    (2, 64, 1, 128, 128, 0, 64, 1024, 1),
    (1, 128, 2, 16, 16, 2000, 128, 2048, 1),
    (5, 16, 1, 1, 1, 9, 72, 64, 16),
    (133, 64, 1, 1, 1, 255, 128, 256, 1),
    # CUDA-core builds: wide heads, one-element vectors
    (2, 8, 2, 2, 1, 30, 256, 16, 1),
    (1, 4, 4, 1, 1, 50, 512, 8, 4),
    (3, 1, 1, 1, 1, 20, 4, 5, 1),
    (1, 4, 4, 1, 1, 50, 200, 8, 4),
    (2, 6, 2, 1, 1, 33, 12, 9, 1),
]
IS_PATHS = [None, "simt", "mma", "wg"]
#: The knob sweep (h200, f16/bf16): shapes for the tensor-core, wgmma and warp-specialised
#: builds, and plan_override sets that pick each build (impossible ones are refused).
IS_KNOB_SHAPES = [
    (2, 16, 2, 3, 2, 60, 64, 32, 1),
    (4, 16, 1, 2, 1, 300, 64, 128, 1),
    (1, 32, 1, 4, 4, 500, 128, 256, 1),
    (1, 64, 1, 1, 1, 2047, 128, 2048, 1),
    (1, 64, 1, 1, 1, 2047, 64, 2048, 1),
    (12, 64, 1, 1, 1, 2047, 64, 2048, 1),
    (12, 64, 1, 1, 1, 2047, 128, 2048, 1),
    (2, 64, 1, 128, 128, 0, 64, 1024, 1),
    (1, 128, 2, 16, 16, 2000, 128, 2048, 1),
]
IS_KNOBS = [
    {"wm": 1, "wn": 4}, {"wm": 4, "wn": 1}, {"wm": 4, "wn": 2}, {"wm": 8, "wn": 1},
    {"pipe": 1}, {"pipe": 1, "wm": 1, "wn": 4}, {"pipe": 1, "wm": 4, "wn": 1},
    {"pipe": 1, "wm": 4, "wn": 2}, {"pipe": 1, "wm": 8, "wn": 1}, {"stages": 3},
    {"splits": 3}, {"merge": "kernel"}, {"merge": "last"},
    {"wgs": 1, "mrows": 64}, {"wgs": 2, "mrows": 64}, {"wgs": 2, "mrows": 128},
    {"wgs": 2, "mrows": 64, "overlap": 1}, {"wgs": 2, "mrows": 128, "overlap": 0},
    {"wgs": 2, "mrows": 128, "overlap": 1},
    {"wgs": 1, "mrows": 64, "overlap": 1}, {"wgs": 1, "mrows": 64, "qreg": 1},
    {"wgs": 1, "mrows": 64, "qreg": 1, "overlap": 1},
    {"wgs": 1, "mrows": 64, "qreg": 1, "minb": 3},
    {"ws": 1}, {"ws": 1, "kt": 64}, {"ws": 1, "q2": 1}, {"ws": 1, "q2": 0},
    {"ws": 1, "merge": "cluster"}, {"ws": 1, "splits": 2}, {"ws": 1, "splits": 4},
    {"ws": 1, "splits": 8}, {"ws": 1, "splits": 4, "merge": "kernel"}, {"ws": 1, "ctas": 40},
    {"ws": 1, "kt": 64, "merge": "cluster"}, {"ws": 0},
]


def index_share_cases() -> list[dict]:
    cases = []
    for dev in DEVICES:
        for shape, dt, idt, mode, path in itertools.product(
                IS_SHAPES, ("FLOAT", "FLOAT16", "BFLOAT16"), ("INT32", "INT64"),
                ("none", "concat", "capacity"), IS_PATHS):
            if mode == "capacity" and shape[5] == 0:
                continue
            cases.append(dict(dev=dev, shape=shape, dtype=dt, idt=idt, mode=mode, path=path))
        variations = [dict(bias=("C",)), dict(bias=("Sq", "C")), dict(bias=("B", "N", "Sq", "C")),
                      dict(bias=(1, 1, 1, "C")), dict(alias=True), dict(use_ws=False),
                      dict(scale=0.3), dict(knobs={"splits": 4}), dict(knobs={"ws": 0}),
                      dict(knobs={"merge": "kernel"}), dict(knobs={"ctas": 40}), dict(mis=True),
                      dict(bad_index=True), dict(capture=True), dict(capture=True, use_ws=False),
                      dict(alias=True, use_ws=False, bias=("B", 1, "Sq", "C"))]
        for si, (dt, path), mode, var in itertools.product(
                (0, 1, 2, 4, 5, 9), (("BFLOAT16", None), ("BFLOAT16", "wg"), ("FLOAT", None)),
                ("concat", "capacity"), variations):
            if var.get("alias") and mode != "capacity":
                continue
            cases.append(dict(dev=dev, shape=IS_SHAPES[si], dtype=dt, idt="INT32", mode=mode,
                              path=path, **var))
    for shape, dt, path, knobs in itertools.product(
            IS_KNOB_SHAPES, ("FLOAT16", "BFLOAT16"), (None, "mma", "wg"), [None] + IS_KNOBS):
        cases.append(dict(dev="h200", shape=shape, dtype=dt, idt="INT32", mode="none",
                          path=path, knobs=knobs, sweep=True))
    return cases


def index_share_run(c: dict) -> str:
    n = ns()
    rt = _runtime_class()(c["dev"])
    dt, idt = n.DataType[c["dtype"]], n.DataType[c["idt"]]
    B, N, Nkv, Sq, cur, past, H, K, hi = c["shape"]
    mode = c["mode"]
    cache = past if mode == "capacity" else past + cur
    bias_spec = c.get("bias", (B, 1, 1, "C") if mode == "capacity" else None)
    dims = {"B": B, "N": N, "Sq": Sq, "C": cache}
    bias_shape = None if bias_spec is None else tuple(dims.get(d, d) for d in bias_spec)
    attrs: dict[str, Any] = {"num_heads": N, "kv_num_heads": Nkv}
    if "scale" in c:
        attrs["scale"] = c["scale"]
    outs_n = ["y"] if mode == "none" else ["y", "pk_out", "pv_out"]
    node = n.Node("IndexShare", "pkg.nxrt", attrs, ["q", "k", "v", "pk", "pv", "idx", "b"], outs_n)
    # selected_indices: per row the first min(K, bound) keys in order, then -1 padding
    if mode == "capacity":
        lo = max(1, min(cur, cache))
        lens = np.array([max(lo, cache - 3 * b) for b in range(B)], dtype=np.int32)
    else:
        lens = np.full(B, cache, dtype=np.int32)
    idx = np.full((B, hi, Sq, K), -1, dtype=np.int64)
    cols = np.arange(K)
    for b in range(B):
        nv = min(K, int(lens[b]))
        idx[b, ..., :nv] = cols[:nv]
    if c.get("bad_index") and idx.size:
        idx.reshape(-1)[0] = int(lens[0])  # out of range
    shapes = [(B, N, Sq, H), (B, Nkv, cur, H), (B, Nkv, cur, H),
              (B, Nkv, past, H) if past else None, (B, Nkv, past, H) if past else None,
              (B, hi, Sq, K), bias_shape]
    ins: list[Any] = []
    for i, shp in enumerate(shapes):
        if shp is None:
            ins.append(n.TensorView.absent_slot())
            continue
        if i == 5:
            t = rt.view(shp, idt, data=idx.astype(idt.numpy))
        else:
            t = rt.view(shp, dt, offset=dt.itemsize if (c.get("mis") and i == 0) else 0)
        rt.tag(t.ptr, max(t.nbytes, 1), f"in{i}")
        ins.append(t)
    out_shapes = [(B, N, Sq, H)] + ([] if mode == "none" else [(B, Nkv, cache, H)] * 2)
    outs = []
    for i, shp in enumerate(out_shapes):
        if c.get("alias") and i in (1, 2):
            src = ins[2 + i]
            outs.append(n.TensorMut(src.ptr, dt, src.shape))
            continue
        t = rt.view(shp, dt, mut=True)
        rt.tag(t.ptr, max(t.nbytes, 1), f"out{i}")
        outs.append(t)
    if mode == "capacity":
        rt.frontier_lens = lens
    path, knobs = c["path"], c.get("knobs")

    def setup(kern: Any) -> None:
        kern.path_override = path
        if knobs is not None:
            kern.plan_override = dict(knobs)

    fac = n.IndexShareFactory(rt)
    return run_case(rt, fac, node, ins, outs, use_ws=c.get("use_ws", True), setup=setup,
                    capture=c.get("capture", False), execute_anyway=c.get("sweep", False))


# ------------------------------------------------------------------------------ main
OPS = [
    ("pkg.nxrt::Attention", attention_cases, attention_run),
    ("com.microsoft::PagedAttention", paged_cases, paged_run),
    ("pkg.nxrt::IndexShare", index_share_cases, index_share_run),
]


def snapshot(quick: bool = False, progress: bool = False) -> list[str]:
    out = []
    for op, cases_fn, run in OPS:
        cases = cases_fn()
        if quick:
            cases = cases[::10]
        t = time.perf_counter()
        for i, c in enumerate(cases):
            if i % 50 == 0:
                gc.collect()  # each case's fake runtime is a reference cycle holding its memory
            desc = describe({k: v for k, v in c.items() if k != "dev"})
            try:
                rec = run(c)
            except Exception as exc:  # noqa: BLE001 - a harness failure is recorded, not fatal
                rec = f"!harness {type(exc).__name__}: {' '.join(str(exc).split())}"
            out.append(f"{op} {c['dev']} {desc} => {rec}")
        if progress:
            print(f"op_snapshot: {op}: {len(cases)} cases in {time.perf_counter() - t:.1f} s",
                  file=sys.stderr)
    return out


def _lazy_zero_pages() -> None:
    """Keep glibc from serving the fake's large zeroed ranges from the heap (where calloc
    must write the zeros: hundreds of MB resident); mmap'd pages stay untouched."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD: fixed at 1 MiB
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="write the snapshot here (one line per case)")
    ap.add_argument("--quick", action="store_true", help="every 10th case")
    args = ap.parse_args(argv)
    # The ops read these; pin them so the snapshot does not depend on the caller's shell.
    for var in ("NXRT_INDEX_SHARE_WG",):
        os.environ.pop(var, None)
    _lazy_zero_pages()
    t0 = time.perf_counter()
    print(f"op_snapshot: kernels from {Path(ns().kernels_file).parent}", file=sys.stderr)
    lines = snapshot(args.quick, progress=True)
    args.out.write_text("\n".join(lines) + "\n")
    errors = sum(" | !" in s or "=> !" in s for s in lines)
    launches = sum(s.count(" ; L ") + (" | L " in s) for s in lines)
    print(f"op_snapshot: {len(lines)} cases ({errors} with an error, {launches} launch records) "
          f"in {time.perf_counter() - t0:.1f} s -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
