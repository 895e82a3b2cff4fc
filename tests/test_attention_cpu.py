"""pkg.nxrt::Attention without a GPU: claim table, validation, reference, workspace, compiles."""

from __future__ import annotations

import dataclasses
import itertools
import math
import multiprocessing
import os
import pickle
import re
from concurrent.futures import ProcessPoolExecutor
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from attnrt.ops import _common, attention, factory_class, reference
from attnrt.ops.attention import (
    AttentionConfig,
    AttentionFactory,
    AttentionKernel,
    Attrs,
    Dims,
    builds,
    choose_splits,
    compile_variants,
    parse_attributes,
    plan,
    split_layout,
    unfused_layout,
)
from attnrt.runtime import compiler
from attnrt.runtime.api import (
    DataType,
    Node,
    TensorMetadata,
    TensorMut,
    TensorView,
    WorkspaceRequirement,
    WorkspaceView,
)
from attnrt.runtime.errors import CaptureError, KernelError, WorkspaceError
from tests._nodes import attention_node

F32, F16, BF16 = DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16


def node(**attrs) -> Node:
    attrs.setdefault("num_heads", 4)
    return attention_node(attrs)


def fake_rt(sm_count: int = 132):
    return SimpleNamespace(capabilities=SimpleNamespace(sm_count=sm_count))


_PTRS = itertools.count(1)


def view(shape, dtype=F16, strides=None, ptr=None, cls=TensorView):
    # Each view its own 64 GiB range: an output may not overlap an input (issue 37).
    return cls(next(_PTRS) << 36 if ptr is None else ptr, dtype, tuple(shape), strides)


# ------------------------------------------------------------------ registry and claim table
def test_registered():
    assert factory_class("pkg.nxrt", "Attention") is AttentionFactory


Q, KV = (2, 4, 5, 64), (2, 2, 7, 64)

CLAIM_TABLE = [
    # (attrs, shapes, dtypes, expected substring of the reason or None)
    ({}, [Q, (2, 4, 7, 64), (2, 4, 7, 64)], [F16] * 3, None),
    ({"kv_num_heads": 2}, [Q, KV, KV], [BF16] * 3, None),
    ({"kv_num_heads": 2}, [Q, KV, KV], [F32] * 3, None),
    ({"kv_num_heads": 2}, [Q, KV, KV, (1, 5, 7)], [F16] * 4, None),
    ({"kv_num_heads": 2}, [Q, KV, KV, (2, 4, 5, 7)], [F16] * 4, None),
    ({"kv_num_heads": 2}, [Q, KV, KV, (2, 1, 5, 7)], [F16] * 4, None),
    ({"kv_num_heads": 2, "head_dim_any": 1}, [(2, 4, 5, 300), (2, 2, 7, 300), (2, 2, 7, 300)],
     [F16] * 3, None),
    ({"kv_num_heads": 2}, [Q, KV, KV], [DataType.DOUBLE] * 3, "DOUBLE is not supported"),
    ({"kv_num_heads": 2}, [Q, KV, KV], [F16, F32, F16], "input K (1) dtype FLOAT"),
    ({"kv_num_heads": 2}, [Q, KV, KV, (5, 7)], [F16, F16, F16, F32], "input mask (3) dtype"),
    ({"kv_num_heads": 3}, [Q, KV, KV], [F16] * 3, "'kv_num_heads' = 3"),
    ({"num_heads": 0}, [Q, KV, KV], [F16] * 3, "'num_heads' = 0"),
    ({"kv_num_heads": 2}, [(4, 5, 64), KV, KV], [F16] * 3, "input Q (0) has shape [4, 5, 64]"),
    ({"kv_num_heads": 2}, [(2, 8, 5, 64), KV, KV], [F16] * 3, "input Q (0) has 8 heads"),
    ({"kv_num_heads": 2}, [Q, (2, 2, 7, 32), KV], [F16] * 3, "input K (1) has shape"),
    ({"kv_num_heads": 2}, [Q, KV, (2, 2, 6, 64)], [F16] * 3, "input V (2) has shape"),
    ({"kv_num_heads": 2}, [Q, KV, KV, (3, 5, 7)], [F16] * 4, "input mask (3)"),
    ({"kv_num_heads": 2}, [Q, KV, KV, (5, 6)], [F16] * 4, "input mask (3)"),
    ({"causal": 2}, [Q, KV, KV], [F16] * 3, "'causal' = 2"),
    ({"scale": -1.0}, [Q, KV, KV], [F16] * 3, "'scale' = -1.0"),
    ({"softcap": -0.5}, [Q, KV, KV], [F16] * 3, "'softcap' = -0.5"),
    ({"local_window_size": -2}, [Q, KV, KV], [F16] * 3, "'local_window_size' = -2"),
]


@pytest.mark.parametrize("attrs,shapes,dtypes,expect", CLAIM_TABLE)
def test_unsupported_reason_table(attrs, shapes, dtypes, expect):
    attrs = {k: v for k, v in attrs.items() if k != "head_dim_any"}
    n = node(**attrs)
    if len(shapes) == 4:
        n.inputs = ["q", "k", "v", "mask"]
    reason = AttentionFactory(fake_rt()).unsupported_reason(n, shapes, dtypes)
    if expect is None:
        assert reason is None
    else:
        assert reason is not None and expect in reason, reason


def test_unsupported_reason_node_level():
    f = AttentionFactory(fake_rt())
    other = Node("Attention", "com.microsoft", {"num_heads": 4}, ["q", "k", "v"], ["o"])
    assert "not pkg.nxrt::Attention" in f.unsupported_reason(other, [Q, Q, Q], [F16] * 3)
    five = node()
    five.inputs = ["q", "k", "v", "m", "x"]
    assert "takes 3 inputs" in f.unsupported_reason(five, [Q] * 5, [F16] * 5)
    absent_k = node()
    absent_k.inputs = ["q", None, "v"]
    assert "input K (1) is required" in f.unsupported_reason(absent_k, [Q, None, Q], [F16] * 3)
    missing = Node("Attention", "pkg.nxrt", {}, ["q", "k", "v"], ["o"])
    assert "'num_heads'" in f.unsupported_reason(missing, [Q, Q, Q], [F16] * 3)
    # Unknown shapes (None) are claimed; the kernel validates at execute.
    assert f.unsupported_reason(node(), [None, None, None], [F16, None, None]) is None


# ------------------------------------------------------------------ attribute validation
@pytest.mark.parametrize("attrs,name", [
    ({"num_heads": -1}, "num_heads"),
    ({"num_heads": 4.0}, "num_heads"),
    ({"num_heads": 4, "kv_num_heads": 0}, "kv_num_heads"),
    ({"num_heads": 6, "kv_num_heads": 4}, "kv_num_heads"),
    ({"causal": True}, "causal"),
    ({"causal": -1}, "causal"),
    ({"scale": 0.0}, "scale"),
    ({"scale": math.inf}, "scale"),
    ({"scale": "x"}, "scale"),
    ({"scale": 1e39}, "scale"),  # inf in float32
    ({"scale": 1e-50}, "scale"),  # 0 in float32
    ({"softcap": 1e39}, "softcap"),
    ({"softcap": math.nan}, "softcap"),
    ({"local_window_size": -3}, "local_window_size"),
    ({"local_window_size": 2.5}, "local_window_size"),
])
def test_attribute_validation(attrs, name):
    with pytest.raises(KernelError, match=f"'{name}'"):
        AttentionKernel(fake_rt(), node(**attrs))
    with pytest.raises(KernelError, match=f"'{name}'"):
        AttentionFactory(fake_rt()).create(node(**attrs), [])


def test_attribute_defaults():
    a = parse_attributes(node(num_heads=8))
    assert (a.num_heads, a.kv_num_heads, a.causal, a.scale, a.softcap, a.local_window_size) == (
        8, 8, False, None, 0.0, -1)
    a = parse_attributes(node(num_heads=8, kv_num_heads=1, causal=1, scale=2, softcap=30.0,
                              local_window_size=0))
    assert (a.kv_num_heads, a.causal, a.scale, a.softcap, a.local_window_size) == (1, True, 2.0, 30.0, 0)


def test_bad_path_arguments():
    with pytest.raises(ValueError, match="path"):
        AttentionKernel(fake_rt(), node(), AttentionConfig(path="fast"))
    with pytest.raises(ValueError, match="num_splits"):
        AttentionKernel(fake_rt(), node(), AttentionConfig(num_splits=0))


# ------------------------------------------------------------------ execute-time validation (host only)
def _inputs(dtype=F16, q=Q, kv=KV, mask=None):
    ins = [view(q, dtype), view(kv, dtype), view(kv, dtype)]
    if mask is not None:
        ins.append(view(mask, dtype))
    return ins


@pytest.mark.parametrize("case,match", [
    ("absent_q", r"input Q \(0\) is required but absent"),
    ("k_dtype", r"input K \(1\) has dtype FLOAT; expected Q's FLOAT16"),
    ("out_dtype", r"output 0 has dtype BFLOAT16"),
    ("v_shape", r"input V \(2\) has shape \[2, 2, 8, 64\]"),
    ("out_shape", r"output 0 has shape \[2, 4, 5, 32\]"),
    ("q_rank", r"input Q \(0\) has shape \[4, 5, 64\] \(rank 3\)"),
    ("q_d_stride", r"input Q \(0\) has strides .*unit stride"),
    ("mask_planes", r"input mask \(3\) has shape \[3, 5, 7\]"),
    ("mask_dtype", r"input mask \(3\) has dtype FLOAT"),
    ("mask_strided", r"input mask \(3\) has strides"),
    ("too_many", r"expected 3 inputs"),
    ("q_dtype", r"input Q \(0\) has dtype INT32"),
])
def test_execute_validation(case, match):
    k = AttentionKernel(fake_rt(), node(kv_num_heads=2))
    ins = _inputs()
    out = view(Q, F16, cls=TensorMut)
    if case == "absent_q":
        ins[0] = TensorView.absent_slot(F16)
    elif case == "k_dtype":
        ins[1] = view(KV, F32)
    elif case == "out_dtype":
        out = view(Q, BF16, cls=TensorMut)
    elif case == "v_shape":
        ins[2] = view((2, 2, 8, 64))
    elif case == "out_shape":
        out = view((2, 4, 5, 32), cls=TensorMut)
    elif case == "q_rank":
        ins[0] = view((4, 5, 64))
    elif case == "q_d_stride":
        ins[0] = view(Q, strides=(4 * 5 * 128, 5 * 128, 128, 2))
    elif case == "mask_planes":
        ins.append(view((3, 5, 7)))
    elif case == "mask_dtype":
        ins.append(view((5, 7), F32))
    elif case == "mask_strided":
        ins.append(view((5, 7), strides=(1, 5)))
    elif case == "too_many":
        ins += [view((5, 7)), view((5, 7))]
    elif case == "q_dtype":
        ins = _inputs(DataType.INT32)
        out = view(Q, DataType.INT32, cls=TensorMut)
    with pytest.raises(KernelError, match=match):
        k.execute(ins, [out])


def test_strided_inputs_declared():
    k = AttentionKernel(fake_rt(), node())
    assert [k.supports_strided_input(i) for i in range(4)] == [True, True, True, False]
    assert k.capture_support().supported


# ------------------------------------------------------------------ workspace formula (pure)
def test_layout_helpers():
    assert unfused_layout(2, 3, 5, 7) == (0, 256 * math.ceil(2 * 3 * 5 * 7 * 4 / 256))
    assert unfused_layout(1, 1, 64, 64) == (0, 64 * 64 * 4)
    assert split_layout(10, 64, 1) == (0, 0, 0)
    o, ml, total = split_layout(10, 64, 3)
    assert o == 0 and ml == 3 * 10 * 64 * 4 and total == ml + 3 * 10 * 2 * 4
    o, ml, total = split_layout(3, 8, 5)  # 480 bytes of O: the (m, l) array starts at 512
    assert ml == 512 and total == 512 + 5 * 3 * 8


def test_choose_splits():
    decode = Dims(B=1, H=32, Hkv=8, Sq=1, Sk=32768, D=128, mask_planes=0)
    s = choose_splits(decode, 64, 64, 132)
    assert s == 33  # 8 CTAs x 33 splits = 264 = one wave of 2 CTAs per SM
    assert choose_splits(Dims(8, 32, 8, 1, 32768, 128, 0), 64, 64, 132) == 4  # 256 CTAs
    prefill = Dims(B=8, H=32, Hkv=32, Sq=1024, Sk=1024, D=128, mask_planes=0)
    assert choose_splits(prefill, 64, 64, 132) == 1
    short = Dims(B=1, H=8, Hkv=8, Sq=1, Sk=100, D=64, mask_planes=0)
    assert choose_splits(short, 64, 64, 132) == 1  # 2 key tiles: not worth a combine


def _meta(shape, dtype=BF16):
    return TensorMetadata(dtype, shape)


@pytest.mark.parametrize("path", ["auto", "fused", "unfused"])
def test_workspace_requirement_matches_formula(path):
    n = node(num_heads=32, kv_num_heads=8)
    k = AttentionKernel(fake_rt(132), n, AttentionConfig(path=path))
    # Prefill that fills the GPU: the fused path needs nothing.
    pre = [_meta((4, 32, 256, 128)), _meta((4, 8, 256, 128)), _meta((4, 8, 256, 128))]
    req = k.workspace_requirement(pre)
    if path == "unfused":
        assert req == WorkspaceRequirement(unfused_layout(4, 32, 256, 256)[1], 256)
    else:
        assert req.nbytes == 0
    # Decode: the fused path splits Sk and needs exactly the partials.
    dec = [_meta((1, 32, 1, 128)), _meta((1, 8, 8192, 128)), _meta((1, 8, 8192, 128))]
    req = k.workspace_requirement(dec)
    if path == "unfused":
        assert req.nbytes == unfused_layout(1, 32, 1, 8192)[1]
    elif path == "fused":
        dims = Dims(1, 32, 8, 1, 8192, 128, 0)
        splits = choose_splits(dims, 64, 64, 132)
        assert splits > 1
        assert req.nbytes == split_layout(32, 128, splits)[2] and req.alignment == 256
        p = plan(k.attrs, dims, BF16, 132, AttentionConfig(path=path))
        assert (p.path, p.dp, p.splits, p.workspace) == ("tc", 128, splits, req.nbytes)
    else:  # auto: the one-launch decode kernel (decode_path "single"): partials + counters
        assert AttentionConfig().decode_path == "single"
        dims = Dims(1, 32, 8, 1, 8192, 128, 0)
        splits = attention.decode_splits(dims, 128, 132)
        assert splits > 1
        assert req.nbytes == attention.decode_layout(32, 128, splits, 8)[2] and req.alignment == 256
        p = plan(k.attrs, dims, BF16, 132, AttentionConfig(path=path))
        assert (p.path, p.dp, p.splits, p.workspace) == ("decode", 128, splits, req.nbytes)


def test_plan_paths():
    a = parse_attributes(node(num_heads=4))
    d = Dims(2, 4, 4, 100, 100, 64, 0)
    assert plan(a, d, F16, 132).path == "tc"
    assert plan(a, d, F16, 132, tc_ok=False).path == "simt"
    assert plan(a, d, F32, 132).path == "simt"
    assert plan(a, d, BF16, 132, AttentionConfig(path="simt")).path == "simt"
    assert plan(a, d, BF16, 132, AttentionConfig(path="unfused")).path == "unfused"
    assert plan(a, Dims(2, 4, 4, 100, 100, 20, 0), F16, 132).path == "simt"  # D % 8 != 0
    p = plan(a, Dims(2, 4, 4, 100, 100, 72, 0), F16, 132)
    assert (p.path, p.dp) == ("tc", 80)
    assert plan(a, Dims(2, 4, 4, 100, 100, 320, 0), F16, 132).path == "unfused"
    with pytest.raises(KernelError, match="D = 320"):
        plan(a, Dims(2, 4, 4, 100, 100, 320, 0), F16, 132, AttentionConfig(path="fused"))
    assert plan(a, d, F16, 132, AttentionConfig(num_splits=3)).splits == 3


def test_workspace_requirement_absent_inputs():
    n = node(num_heads=4)
    k = AttentionKernel(fake_rt(), n)
    q, kv = _meta((1, 4, 8, 64), F16), _meta((1, 4, 16, 64), F16)
    assert k.workspace_requirement([q, kv, kv, None]).nbytes == 0
    with pytest.raises(KernelError, match=r"input K \(1\) is required but absent"):
        k.workspace_requirement([q, None, kv])


@pytest.mark.parametrize("dims,path,match", [
    (Dims(1, 65536, 65536, 4, 64, 320, 0), "auto", "B\\*num_heads = 65536"),
    (Dims(4096, 4096, 4096, 8192, 64, 64, 0), "fused", "row tiles"),
])
def test_plan_refuses_grids_beyond_limits(dims, path, match):
    a = Attrs(dims.H, dims.Hkv, False, None, 0.0, -1)
    with pytest.raises(KernelError, match=match):
        plan(a, dims, BF16, 132, AttentionConfig(path=path))


def test_int32_limits_are_refused_by_shape_checks():
    a = parse_attributes(node(num_heads=1))
    with pytest.raises(KernelError, match="Sk = 2147483648"):
        attention.check_dims(a, (1, 1, 1, 8), (1, 1, 2**31, 8), (1, 1, 2**31, 8))
    with pytest.raises(KernelError, match="Sq \\+ Sk"):
        attention.check_dims(a, (1, 1, 2**30, 8), (1, 1, 2**30, 8), (1, 1, 2**30, 8))


def test_tc_plan_needs_aligned_strides():
    k = AttentionKernel(fake_rt(), node(num_heads=4))
    odd = TensorMetadata(F16, (1, 4, 1, 64), (4 * 100 + 4, 100, 64, 1))  # H stride 100: not % 8
    kv = _meta((1, 4, 4096, 64), F16)
    # Only the SIMT kernel can read it; its tile sizes pick the splits.
    req = k.workspace_requirement([odd, kv, kv])
    splits = choose_splits(Dims(1, 4, 4, 1, 4096, 64, 0), 32, 32, 132)
    assert req.nbytes == split_layout(4, 64, splits)[2]


def test_shared_memory_fits():
    # sm_80 (A100) allows 163 KiB per block, sm_90 227 KiB.
    for dp in attention.TC_TILES:
        assert attention.tc_smem_bytes(dp) <= 166912
    assert attention.simt_smem_bytes(256) <= 166912


# ------------------------------------------------------------------ reference vs float64 loops
def naive(q, k, v, mask, num_heads, kv_heads, causal=0, scale=None, softcap=0.0, window=-1):
    """Row by row, straight from the definition."""
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    G = num_heads // kv_heads
    # Attributes are float32 values (the kernels' and the reference's; issue 37, class 8).
    scale = 1 / math.sqrt(D) if scale is None else float(np.float32(scale))
    softcap = float(np.float32(softcap))
    out = np.zeros((B, H, Sq, D))
    planes = 0 if mask is None else mask.size // (Sq * Sk)
    for b in range(B):
        for h in range(H):
            for i in range(Sq):
                p = Sk - Sq + i
                logits = []
                for j in range(Sk):
                    if causal and j > p:
                        continue
                    if window >= 0 and p - j > window:
                        continue
                    s = scale * float(np.dot(q[b, h, i].astype(np.float64),
                                             k[b, h // G, j].astype(np.float64)))
                    if softcap:
                        s = softcap * math.tanh(s / softcap)
                    if planes:
                        plane = {1: 0, B: b, B * H: b * H + h}[planes] if planes != B * H else b * H + h
                        s += float(mask.reshape(planes, Sq, Sk)[plane, i, j])
                    logits.append((j, s))
                if not logits or all(s == -math.inf for _, s in logits):
                    continue
                mx = max(s for _, s in logits)
                w = [(j, math.exp(s - mx)) for j, s in logits]
                tot = sum(x for _, x in w)
                for j, x in w:
                    out[b, h, i] += x / tot * v[b, h // G, j].astype(np.float64)
    return out


REF_CASES = [
    # B, H, Hkv, Sq, Sk, D, attrs, mask planes
    (2, 2, 2, 3, 5, 8, {}, 0),
    (1, 4, 2, 4, 6, 8, {}, 0),                         # GQA
    (2, 3, 1, 3, 4, 4, {}, 0),                         # MQA
    (1, 2, 2, 3, 7, 8, {"causal": 1}, 0),              # causal, Sq < Sk
    (1, 2, 1, 6, 4, 8, {"causal": 1}, 0),              # Sq > Sk: first rows see nothing
    (1, 2, 2, 5, 9, 8, {"local_window_size": 2}, 0),
    (1, 2, 2, 5, 9, 8, {"causal": 1, "local_window_size": 0}, 0),
    (1, 2, 2, 4, 6, 8, {"softcap": 0.7, "scale": 1.3}, 0),
    (2, 2, 1, 3, 5, 8, {}, 1),
    (2, 2, 1, 3, 5, 8, {}, 2),
    (2, 2, 1, 3, 5, 8, {"causal": 1}, 4),
]


@pytest.mark.parametrize("B,H,Hkv,Sq,Sk,D,attrs,planes", REF_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_reference_matches_loops(B, H, Hkv, Sq, Sk, D, attrs, planes, dtype, rng):
    q = rng.standard_normal((B, H, Sq, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Sk, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Sk, D)).astype(dtype)
    mask = rng.standard_normal((planes, Sq, Sk)).astype(dtype) if planes else None
    n = node(num_heads=H, kv_num_heads=Hkv, **attrs)
    got = reference.attention(n, [q, k, v, mask], out_dtype=np.float64)
    want = naive(q, k, v, mask, H, Hkv, attrs.get("causal", 0), attrs.get("scale"),
                 attrs.get("softcap", 0.0), attrs.get("local_window_size", -1))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert reference.attention(n, [q, k, v, mask]).dtype == dtype


def test_reference_fully_masked_rows_are_zero(rng):
    q = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    v = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    mask = np.zeros((1, 3, 4), np.float32)
    mask[0, 1, :] = -np.inf  # row 1 sees nothing
    out = reference.attention(node(num_heads=2), [q, k, v, mask])
    assert np.all(out[:, :, 1] == 0) and np.all(np.isfinite(out))
    assert np.all(np.abs(out[:, :, 0]) > 0)
    # Causal with Sq > Sk: query i < Sq - Sk has position < 0 and sees no key.
    q6 = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)
    out = reference.attention(node(num_heads=2, causal=1), [q6, k, v])
    assert np.all(out[:, :, :2] == 0) and np.all(np.abs(out[:, :, 2:]) > 0)


def test_reference_bf16_and_empty_keys(rng):
    q = rng.standard_normal((1, 2, 3, 8)).astype(ml_dtypes.bfloat16)
    k = np.zeros((1, 2, 0, 8), ml_dtypes.bfloat16)
    out = reference.attention(node(num_heads=2), [q, k, k])
    assert out.dtype == ml_dtypes.bfloat16 and out.shape == (1, 2, 3, 8)
    assert np.all(out.astype(np.float32) == 0)


# ------------------------------------------------------------------ every variant compiles
VARIANTS = compile_variants()


def _compile(file: str, options: tuple, arch: str) -> tuple[str, bytes]:
    """Worker: NVRTC log (with ptxas -v) and PTX of one variant."""
    r = compiler.compile_source(_common.source(file), file, arch, options + ("--ptxas-options=-v",),
                                _common.headers())
    return r.log, r.ptx


@pytest.fixture(scope="module")
def compiled():
    """Every variant for sm_80 and sm_90, compiled at once in worker processes (NVRTC does
    not compile in parallel in threads): (id(variant), arch) -> (log, ptx) or the error."""
    jobs = [(v, a) for v in VARIANTS for a in ("sm_80", "sm_90") if int(a[3:]) >= v.min_arch]
    out = {}
    try:
        pool = ProcessPoolExecutor(max_workers=min(4, os.cpu_count() or 1),
                                   mp_context=multiprocessing.get_context("spawn"))
    except OSError:  # no worker processes here: compile in-process
        pool = None
    futures = {}
    for v, a in jobs:
        target = a + v.arch_suffix
        if pool is not None:
            futures[(id(v), a)] = pool.submit(_compile, v.file, v.options, target)
        else:
            try:
                out[(id(v), a)] = (*_compile(v.file, v.options, target), None)
            except Exception as exc:  # reported per variant
                out[(id(v), a)] = ("", b"", exc)
    for key, fut in futures.items():
        try:
            out[key] = (*fut.result(), None)
        except Exception as exc:  # reported per variant
            out[key] = ("", b"", exc)
    if pool is not None:
        pool.shutdown()
    return out


def test_variant_list():
    files = {v.file for v in VARIANTS}
    assert files == {"attention_fused_tc.cu", "attention_fused_simt.cu", "attention_rows.cu",
                     "attention_gemm.cu", "attention_wg.cu"}
    wg = [v for v in VARIANTS if v.file == "attention_wg.cu"]
    # per dtype and head dim: the builds without causal masking (D128: two tile widths) and
    # the causal one
    builds = sum(len(attention.wg_builds(D)) for D in attention.WG_BUILD)
    assert len(wg) == 2 * builds and all(v.min_arch == 90 and v.arch_suffix == "a" for v in wg)
    assert len({(v.file, v.options) for v in VARIANTS}) == len(VARIANTS)


@pytest.mark.slow  # the `compiled` fixture builds every variant twice: minutes on two cores
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: f"{v.module}[{','.join(map(str, v.defines.values()))}]")
def test_variant_compiles(v, arch, compiled):
    if int(arch[3:]) < v.min_arch:
        pytest.skip(f"{v.file} needs sm_{v.min_arch}{v.arch_suffix}")
    log, _, err = compiled[(id(v), arch)]
    if err is not None:
        raise err
    # No local-memory spills: they would cost more than the registers they save.
    assert "bytes spill stores" in log
    # wgmma issued in order (no "wgmma serialization" fallback by ptxas).
    assert "wgmma" not in log.lower(), log
    for line in log.splitlines():
        if "spill stores" in line:
            assert " 0 bytes spill stores" in line, line


# ------------------------------------------------------------------ launches match the kernels
_PARAM_RE = re.compile(r"\.param\s+\.(\w+)")
_SIZES = {"u64": 8, "s64": 8, "b64": 8, "f64": 8, "u32": 4, "s32": 4, "b32": 4, "f32": 4}


def _ptx_entry(ptx: str, entry: str) -> tuple[list[str], int]:
    """Parameter types and .maxntid of ``entry`` in a PTX module."""
    start = ptx.index(f".entry {entry}(")
    head = ptx[start:ptx.index(")", start)]
    types = _PARAM_RE.findall(head)
    m = re.search(r"\.maxntid\s+(\d+)", ptx[start:start + len(head) + 200])
    return types, int(m.group(1)) if m else 1024


class FakeRuntime:
    """Records launches and checks them against the compiled PTX (no GPU needed)."""

    def __init__(self, compiled, capturing=False):
        self._ptx = {(v.module, v.options): compiled[(id(v), "sm_90")][1].decode()
                     for v in VARIANTS}
        self.capabilities = SimpleNamespace(sm_count=132, max_shared_per_block_optin=232448)
        self.arch = "sm_90"
        self.launches: list[tuple] = []
        self.allocs = 0
        self.memsets: list[tuple] = []
        self.capturing = capturing

    def nvrtc_function(self, module, source, entry, options=(), *, headers=None, arch=None):
        types, maxntid = _ptx_entry(self._ptx[(module, tuple(options))], entry)
        return SimpleNamespace(name=entry, types=types, maxntid=maxntid, module=module)

    def launch(self, fn, grid, block, args, shared_mem=0):
        assert len(args) == len(fn.types), f"{fn.name}: {len(args)} args for {len(fn.types)} params"
        for i, (a, t) in enumerate(zip(args, fn.types)):
            if t == "f32":
                assert type(a) is np.float32, f"{fn.name} arg {i}: {type(a).__name__} for .f32"
            elif _SIZES[t] == 4:
                assert type(a) is np.int32, f"{fn.name} arg {i}: {type(a).__name__} for .{t}"
            else:
                assert type(a) is int or type(a) is np.int64, f"{fn.name} arg {i}: {type(a)} for .{t}"
        gx, gy, gz = grid
        assert 1 <= gx < 2**31 and 1 <= gy <= 65535 and 1 <= gz <= 65535, grid
        assert block[0] * block[1] * block[2] <= fn.maxntid, (fn.name, block, fn.maxntid)
        assert shared_mem <= self.capabilities.max_shared_per_block_optin
        self.launches.append((fn.name, grid, block, shared_mem, args))

    def is_capturing(self):
        return self.capturing

    def alloc_raw(self, n):
        self.allocs += 1
        return 0x7F0000000

    def free_raw(self, p):
        self.allocs -= 1

    def memset(self, ptr, value, nbytes):
        self.memsets.append((ptr, value, nbytes))

    def synchronize(self):
        pass


LAUNCH_CASES = [
    # dtype, path, B, H, Hkv, Sq, Sk, D, attrs, mask, splits -> entries launched
    (F16, "auto", 8, 16, 4, 100, 300, 128, {"causal": 1}, False, None, ["attn_fused_tc"]),
    (BF16, "fused", 1, 32, 8, 1, 8192, 128, {}, False, None, ["attn_fused_tc", "attn_combine"]),
    (BF16, "fused", 1, 4, 4, 7, 50, 80, {"softcap": 3.0}, True, None, ["attn_fused_tc"]),
    (F16, "fused", 1, 2, 1, 5, 9, 256, {}, False, 2, ["attn_fused_tc", "attn_combine"]),
    # auto with G·Sq <= 16: the one-launch decode kernel, splits merged in the kernel
    (BF16, "auto", 1, 32, 8, 1, 8192, 128, {}, False, None, ["attn_decode"]),
    (BF16, "auto", 1, 4, 4, 7, 50, 80, {"softcap": 3.0}, True, None, ["attn_decode"]),
    (F16, "auto", 1, 2, 1, 5, 9, 256, {}, False, 2, ["attn_decode"]),
    (F32, "auto", 2, 4, 2, 17, 130, 64, {"local_window_size": 3}, True, None,
     ["attn_fused_simt", "attn_combine"]),
    (F32, "fused", 1, 8, 1, 1, 4096, 256, {}, False, None, ["attn_fused_simt", "attn_combine"]),
    (F16, "simt", 1, 2, 2, 3, 4, 20, {}, False, None, ["attn_fused_simt"]),
    (F16, "auto", 1, 2, 2, 3, 4, 300, {}, True, None, ["attn_qk", "attn_softmax", "attn_pv"]),
    (F32, "unfused", 2, 4, 2, 65, 129, 72, {"causal": 1}, False, None,
     ["attn_qk", "attn_softmax", "attn_pv"]),
    (BF16, "unfused", 1, 2, 2, 3, 0, 64, {}, False, None, ["attn_pv"]),
    (BF16, "wg", 8, 16, 4, 600, 700, 128, {"causal": 1}, False, None, ["attn_fused_wg"]),
    (BF16, "wg", 1, 8, 2, 300, 9000, 128, {}, False, None,  # WG_LONG, split
     ["attn_fused_wg", "attn_combine"]),
    (F16, "wg", 1, 4, 4, 17, 1000, 64, {"softcap": 2.0}, True, None,
     ["attn_fused_wg", "attn_combine"]),
    (BF16, "wg", 1, 8, 1, 1, 1000, 64, {}, False, 3, ["attn_fused_wg", "attn_combine"]),
]


@pytest.mark.parametrize("case", LAUNCH_CASES, ids=lambda c: f"{c[0].name}-{c[1]}-D{c[7]}-S{c[5]}x{c[6]}")
def test_launches_match_kernel_signatures(case, compiled):
    dtype, path, B, H, Hkv, Sq, Sk, D, attrs, with_mask, splits, entries = case
    rt = FakeRuntime(compiled)
    n = node(num_heads=H, kv_num_heads=Hkv, **attrs)
    ins = [view((B, H, Sq, D), dtype), view((B, Hkv, Sk, D), dtype), view((B, Hkv, Sk, D), dtype)]
    if with_mask:
        n.inputs = ["q", "k", "v", "mask"]
        ins.append(view((B, 1, Sq, Sk), dtype))
    out = view((B, H, Sq, D), dtype, cls=TensorMut)
    kern = AttentionKernel(rt, n, AttentionConfig(path=path, num_splits=splits))
    req = kern.workspace_requirement([t.meta for t in ins])
    ws = WorkspaceView(0x100000000, req.nbytes) if req.nbytes else None
    kern.execute(ins, [out], ws)
    assert [name for name, *_ in rt.launches] == entries
    if entries == ["attn_decode"] and kern.last_plan.splits > 1:
        # split counters: a small pool, zeroed once when allocated, freed by close()
        assert rt.allocs == 1 and len(rt.memsets) == 1
        kern.close()
    assert rt.allocs == 0
    if "attn_combine" in entries:
        assert kern.last_plan.splits > 1 and req.nbytes == kern.last_plan.workspace
    fused = rt.launches[0]
    if fused[0] == "attn_decode":
        assert fused[3] == attention.dec_smem_bytes(kern.last_plan.dp)
    elif fused[0] == "attn_fused_tc":
        assert fused[3] == attention.tc_smem_bytes(kern.last_plan.dp)
    elif fused[0] == "attn_fused_simt":
        assert fused[3] == attention.simt_smem_bytes(D)
    elif fused[0] == "attn_fused_wg":
        causal = bool(attrs.get("causal", 0))
        assert fused[3] == attention.wg_smem_bytes(D, causal, Sk)
        assert fused[2] == (attention.wg_threads(D, causal), 1, 1)
        items = B * Hkv * -(-(H // Hkv) * Sq // 128) * kern.last_plan.splits
        if attention.wg_persistent(D, causal):  # one CTA per SM at most, looping over the items
            assert fused[1] == (attention.wg_grid(items, rt.capabilities.sm_count), 1, 1)
        else:
            assert fused[1][0] * fused[1][1] == items


def test_wg_planning():
    """path='wg' is refused where the kernel cannot run; auto takes it (prefill) with wg_default."""
    a = attention.Attrs(8, 2, True, None, 0.0, -1)
    pre = attention.Dims(2, 8, 2, 1000, 1000, 128, 0)
    dec = attention.Dims(2, 8, 2, 1, 1000, 128, 0)
    h100 = (9, 0)
    p = attention.plan(a, pre, BF16, 132, AttentionConfig(path="wg"), cc=h100)
    assert p.path == "wg" and p.dp == 128
    for dims, dt, cc, tc_ok, why in [
            (pre, F32, h100, True, "FLOAT"),
            (attention.Dims(1, 8, 2, 64, 64, 80, 0), F16, h100, True, "D = 80"),
            (pre, BF16, (8, 0), True, "compute capability"),
            (pre, BF16, (10, 0), True, "compute capability"),
            (pre, F16, h100, False, "strides")]:
        with pytest.raises(KernelError, match=why):
            attention.plan(a, dims, dt, 132, AttentionConfig(path="wg"), tc_ok=tc_ok, cc=cc)
    assert AttentionConfig().wg_default  # on since the H200 sweep
    p = attention.plan(a, pre, BF16, 132, cc=h100)
    assert p.path == "wg" and p.config == AttentionConfig()
    no_wg = AttentionConfig(wg_default=False)
    p = attention.plan(a, pre, BF16, 132, no_wg, cc=h100)
    assert p.path == "tc" and p.config is no_wg and "wg_default=False" in repr(p)
    assert attention.plan(a, pre, BF16, 132, cc=(8, 9)).path == "tc"
    assert attention.plan(a, pre, BF16, 132).path == "tc"  # unknown device
    assert attention.plan(a, dec, BF16, 132, cc=h100).path == "decode"  # the one-launch kernel
    tc = AttentionConfig(decode_path="tc")
    assert attention.plan(a, dec, BF16, 132, tc, cc=h100).path == "tc"  # tc + splits + combine
    assert attention.plan(a, pre, F32, 132, cc=h100).path == "simt"


def test_unfused_owns_a_buffer_only_eagerly(compiled):
    n = node(num_heads=2)
    ins = [view((1, 2, 3, 64)), view((1, 2, 5, 64)), view((1, 2, 5, 64))]
    out = view((1, 2, 3, 64), cls=TensorMut)
    rt = FakeRuntime(compiled)
    AttentionKernel.unfused(rt, n).execute(ins, [out])
    assert len(rt.launches) == 3 and rt.allocs == 0  # allocated, used, freed
    rt = FakeRuntime(compiled, capturing=True)
    with pytest.raises(CaptureError, match="workspace"):
        AttentionKernel.unfused(rt, n).execute(ins, [out])
    assert rt.launches == []
    # The fused path never allocates: without its partials buffer it runs unsplit.
    AttentionKernel.fused(rt, n, AttentionConfig(num_splits=4)).execute(ins, [out])
    assert [x[0] for x in rt.launches] == ["attn_fused_tc"] and rt.launches[0][1][1] == 1


def test_short_workspace_refused_before_launch(compiled):
    rt = FakeRuntime(compiled)
    n = node(num_heads=2)
    ins = [view((1, 2, 3, 64)), view((1, 2, 5, 64)), view((1, 2, 5, 64))]
    out = view((1, 2, 3, 64), cls=TensorMut)
    k = AttentionKernel.unfused(rt, n)
    need = k.workspace_requirement([t.meta for t in ins]).nbytes
    with pytest.raises(WorkspaceError):
        k.execute(ins, [out], WorkspaceView(0x100000000, need - 1))
    with pytest.raises(WorkspaceError):
        k.execute(ins, [out], WorkspaceView(0x100000000 + 8, need))  # misaligned
    assert rt.launches == []


def test_wg_schedule_choice():
    """Causal calls take WG_CAUSAL's schedule, the others WG_BUILD's; persistent grids are one
    CTA per SM at most (AttentionConfig.wg_max_ctas caps them); both builds are compiled."""
    for D in attention.WG_BUILD:
        assert attention.wg_sched(D) == attention.WG_BUILD[D][0]
        want = attention.WG_CAUSAL[D][0] if D in attention.WG_CAUSAL else attention.WG_BUILD[D][0]
        assert attention.wg_sched(D, True) == want
        assert attention.wg_persistent(D, True) == (attention.wg_sched(D, True) >= 6)
    assert attention.wg_grid(5000, 132) == 132 and attention.wg_grid(7, 132) == 7
    assert attention.wg_grid(0, 132) == 1
    assert attention.wg_grid(5000, 132, 3) == 3 and attention.wg_grid(2, 132, 3) == 2
    scheds = {(v.defines["HEAD_DIM"], v.defines["NXRT_BF16"], v.defines.get("NXRT_WG_SCHED", 0))
              for v in attention.compile_variants() if v.file == "attention_wg.cu"}
    for D in attention.WG_BUILD:
        for bf16 in (0, 1):
            assert (D, bf16, attention.wg_sched(D)) in scheds
            assert (D, bf16, attention.wg_sched(D, True)) in scheds
    # Long non-causal calls at D128 take WG_LONG's tile width; causal and short ones do not.
    min_sk, keys = attention.WG_LONG[128]
    assert attention.wg_keys(128, False, min_sk) == keys
    assert attention.wg_keys(128, False, min_sk - 1) == attention.WG_BUILD[128][1]
    assert attention.wg_keys(128, True, min_sk) == attention.WG_CAUSAL[128][1]
    assert attention.wg_smem_bytes(128, False, min_sk) <= 232448  # sm_90 opt-in
    v = builds.wg_variant(BF16, 128, False, min_sk)
    assert v.defines.get("NXRT_WG_BN") == keys
    assert "NXRT_WG_BN" not in builds.wg_variant(BF16, 128, True, min_sk).defines
    no_causal = AttentionConfig(wg_causal={})
    assert attention.wg_sched(128, True, no_causal) == attention.WG_BUILD[128][0]
    assert attention.wg_sched(128, True) == attention.WG_CAUSAL[128][0]  # nothing was mutated


# ------------------------------------------------------------------ AttentionConfig
def test_config_is_data():
    """The knobs are a frozen, picklable value; tables normalise; bad values are refused."""
    cfg = AttentionConfig(path="wg", wg_max_ctas=3, wg_build={128: (6, 128, 1), 64: [7, 128, 1]})
    assert cfg.wg_build == ((64, (7, 128, 1)), (128, (6, 128, 1)))
    assert pickle.loads(pickle.dumps(cfg)) == cfg and hash(cfg) == hash(pickle.loads(pickle.dumps(cfg)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.path = "auto"  # type: ignore[misc]
    assert AttentionConfig() == AttentionConfig(wg_build=attention.WG_BUILD)
    for bad in ({"decode_path": "fast"}, {"wg_max_ctas": 0}, {"num_splits": 65536}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AttentionConfig(**bad)


@pytest.mark.parametrize("cap", [None, 3, 7])
def test_wg_max_ctas_caps_the_persistent_grid(cap):
    """A kernel built with ``wg_max_ctas`` launches at most that many CTAs, and its plan
    shows the config; the shipped tables are untouched."""
    from tests._fakes import FakeRuntime as Fake  # the fuzz suites' fake: no PTX checks

    rt = Fake()  # sm_90, 132 SMs
    B, H, Hkv, Sq, Sk, D = 3, 8, 2, 999, 1001, 128
    n = node(num_heads=H, kv_num_heads=Hkv, causal=1)
    ins = [rt.view((B, H, Sq, D), BF16), rt.view((B, Hkv, Sk, D), BF16),
           rt.view((B, Hkv, Sk, D), BF16)]
    out = rt.view((B, H, Sq, D), BF16, mut=True)
    cfg = AttentionConfig(path="wg", wg_max_ctas=cap)
    kern = AttentionKernel(rt, n, cfg)
    assert kern.workspace_requirement([t.meta for t in ins]).nbytes == 0
    kern.execute(ins, [out])
    items = B * Hkv * -(-(H // Hkv) * Sq // 128)
    assert rt.launches[-1].grid == (min(items, 132, cap or items), 1, 1)
    assert kern.last_plan.config is cfg and f"wg_max_ctas={cap}" in repr(kern.last_plan)


@pytest.mark.parametrize("kw", [{"num_splits": 2.5}, {"num_splits": True}, {"wg_build": {64: (4, 128, 1)}},
                                {"wg_causal": {128: (0, 128)}}])
def test_config_refuses_non_integer_splits_and_unbuilt_schedules(kw):
    # Refused when the config is built, not at the first compile or launch.
    with pytest.raises(ValueError):
        AttentionConfig(**kw)
