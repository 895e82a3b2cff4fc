"""IndexShare on the CPU: index rules (property-based), the float64 reference, bias
broadcast, geometry/claim checks, NVRTC compiles, and the CUDA kernels themselves run
through a host emulation (g++, fibers per thread) behind a fake runtime, so the real
``IndexShareKernel.execute`` path — eager, capture, poisoned replay — is exercised here.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import math
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnrt.ops import factory_class, index_share, reference
from attnrt.ops.index_share import (
    DeviceLimits,
    IndexShareConfig,
    SelectedIndicesError,
    builds,
    capacity_valid_lengths,
    find_index_violation,
    make_plan,
    splitk,
)
from attnrt.runtime.api import DataType, TensorMut, TensorView, WorkspaceView
from attnrt.runtime.errors import CaptureError, KernelError
from attnrt.runtime.latch import INDEX_SHARE_SELECTED_INDICES, Latch
from tests._nodes import index_share_node
from tests._util import TOL, rel_fro

BF16 = ml_dtypes.bfloat16


def node(n=4, nkv=None, scale=None, outputs=1):
    attrs = {"num_heads": n}
    if nkv is not None:
        attrs["kv_num_heads"] = nkv
    if scale is not None:
        attrs["scale"] = scale
    return index_share_node(attrs, outputs, names=("y", "pk", "pv"))


def sorted_rows(rng, shape, bound, k, fill=0.8):
    """[B, HI, Sq, K] strictly increasing rows with trailing -1 padding (>= 1 entry)."""
    out = np.full(shape[:3] + (k,), -1, dtype=np.int64)
    for pos in np.ndindex(*shape[:3]):
        b_ = bound[pos[0]] if np.ndim(bound) else bound
        n = int(rng.integers(1, min(k, b_) + 1)) if rng.random() > 1 - fill else min(k, b_)
        out[pos][:n] = np.sort(rng.choice(b_, size=n, replace=False))
    return out


# ---------------------------------------------------------------------------------------
# index rules
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("row,kind,col", [
    ([0, 3, -1, -1], None, None),
    ([0, 3, -2, -1], "sentinel", 2),
    ([0, -1, 4, -1], "after_padding", 2),
    ([0, 3, 9, -1], "out_of_range", 2),
    ([0, 3, 3, -1], "duplicate", 2),
    ([0, 5, 3, -1], "not_increasing", 2),
    ([-1, -1, -1, -1], "all_padding", 0),
    ([-1, 2, -1, -1], "after_padding", 1),
    ([-5, -1, -1, -1], "sentinel", 0),
])
def test_index_rules(row, kind, col):
    idx = np.zeros((2, 1, 3, 4), dtype=np.int32)
    idx[...] = [0, 1, 2, 3]
    idx[1, 0, 2] = row
    v = find_index_violation(idx, 9)
    if kind is None:
        assert v is None
        return
    assert (v.kind, v.coordinates) == (kind, (1, 0, 2, col))
    with pytest.raises(SelectedIndicesError, match=rf"\[batch=1, head=0, query=2, column={col}\]"):
        index_share.check_selected_indices(idx, 9)


def test_index_rules_first_violation_and_per_batch_bounds():
    idx = np.array([[[[0, 5, -1]]], [[[0, 5, -1]]]], dtype=np.int64)
    assert find_index_violation(idx, [6, 6]) is None
    v = find_index_violation(idx, [6, 5])
    assert v.coordinates == (1, 0, 0, 1) and v.kind == "out_of_range"
    idx[0, 0, 0] = [3, 2, -1]
    assert find_index_violation(idx, [6, 5]).coordinates == (0, 0, 0, 1)
    # chunking does not change the answer
    assert find_index_violation(idx, [6, 5], chunk_elems=1).coordinates == (0, 0, 0, 1)


@st.composite
def valid_case(draw):
    b, hi, sq = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    k = draw(st.integers(1, 9))
    bounds = [draw(st.integers(1, 20)) for _ in range(b)]
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    return sorted_rows(rng, (b, hi, sq), np.array(bounds), k), bounds


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_case(), st.sampled_from([np.int32, np.int64]))
def test_random_valid_rows_pass(case, dt):
    idx, bounds = case
    assert find_index_violation(idx.astype(dt), bounds) is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_case(), st.data())
def test_single_mutation_caught(case, data):
    idx, bounds = case
    b = data.draw(st.integers(0, idx.shape[0] - 1))
    h = data.draw(st.integers(0, idx.shape[1] - 1))
    q = data.draw(st.integers(0, idx.shape[2] - 1))
    row = idx[b, h, q]
    n = int((row != -1).sum())
    k = row.size
    kinds = ["sentinel", "out_of_range", "all_padding"]
    if n >= 2:
        kinds += ["duplicate", "not_increasing"]
    if n < k:
        kinds.append("after_padding")
    if n >= 1 and k >= 2:
        kinds.append("after_padding_gap")
    kind = data.draw(st.sampled_from(kinds))
    r = row.copy()
    if kind == "sentinel":
        c = data.draw(st.integers(0, k - 1))
        r[c] = data.draw(st.integers(-1000, -2))
        want = ("sentinel", c)
    elif kind == "out_of_range":
        c = data.draw(st.integers(0, n - 1)) if n else 0
        r[c] = bounds[b] + data.draw(st.integers(0, 50))
        want = ("out_of_range", c)
        if c + 1 < n:  # keep later entries increasing so only this rule fires at c
            r[c + 1:n] = r[c] + 1 + np.arange(n - c - 1)
        if n == 0:
            want = ("out_of_range", 0)
    elif kind == "all_padding":
        r[:] = -1
        want = ("all_padding", 0)
    elif kind == "duplicate":
        c = data.draw(st.integers(1, n - 1))
        r[c] = r[c - 1]
        want = ("duplicate", c)
    elif kind == "not_increasing":
        c = data.draw(st.integers(1, n - 1))
        r[c - 1], r[c] = r[c], r[c - 1]
        want = ("not_increasing", c)
    elif kind == "after_padding":
        c = data.draw(st.integers(n + 1, k)) if n + 1 <= k - 1 else n + 1
        if c >= k:  # a -1 right before the last column, then a valid index
            c = k - 1
            if c <= n:
                r[n] = -1
                c = n + 1 if n + 1 < k else None
        if c is None or c >= k or (r[:c] == -1).sum() == 0:
            return
        r[c] = min(bounds[b] - 1, max(0, int(r[:n].max(initial=-1)) + 1))
        want = ("after_padding", c)
    else:  # punch a -1 into the valid prefix
        c = data.draw(st.integers(0, n - 1))
        if c == n - 1:
            return
        r[c] = -1
        want = ("after_padding", c + 1) if c + 1 < n else None
        if c == 0 and n == 1:
            want = ("all_padding", 0)
    mutated = idx.copy()
    mutated[b, h, q] = r
    v = find_index_violation(mutated, bounds)
    assert v is not None
    # every row before (b, h, q) is untouched and valid, so the violation is in this row
    assert (v.batch, v.head, v.query) == (b, h, q)
    assert (v.kind, v.column) == want, (r.tolist(), bounds[b], v)


# ---------------------------------------------------------------------------------------
# the reference
# ---------------------------------------------------------------------------------------

def naive(q, kc, vc, idx, scale, bias4, group):
    """Independent float64 loops."""
    b_, n_, sq, h_ = q.shape
    y = np.zeros(q.shape)
    for b in range(b_):
        for h in range(n_):
            for i in range(sq):
                row = idx[b, 0 if idx.shape[1] == 1 else h, i]
                keys = [int(x) for x in row if x >= 0]
                s = [sum(float(q[b, h, i, d]) * float(kc[b, h // group, j, d]) for d in range(h_)) * scale
                     + (0.0 if bias4 is None else float(bias4[b, h, i, j])) for j in keys]
                m = max(s)
                if m == -math.inf:
                    continue
                p = [math.exp(x - m) for x in s]
                tot = sum(p)
                for j, pj in zip(keys, p):
                    y[b, h, i] += pj / tot * vc[b, h // group, j].astype(np.float64)
    return y


def make_case(rng, b=2, n=4, nkv=2, sq=3, cur=2, past=5, h=8, k=4, hi=1, dtype=np.float32,
              bias_shape=None, idx_dtype=np.int64, cache=None):
    q = rng.standard_normal((b, n, sq, h)).astype(dtype)
    kk = rng.standard_normal((b, nkv, cur, h)).astype(dtype)
    vv = rng.standard_normal((b, nkv, cur, h)).astype(dtype)
    pk = rng.standard_normal((b, nkv, past, h)).astype(dtype) if past else None
    pv = rng.standard_normal((b, nkv, past, h)).astype(dtype) if past else None
    total = cache if cache is not None else past + cur
    idx = sorted_rows(rng, (b, hi, sq), total, k).astype(idx_dtype)
    bias = None
    if bias_shape is not None:
        bias = rng.standard_normal(bias_shape).astype(dtype)
    return [q, kk, vv, pk, pv, idx, bias]


@pytest.mark.parametrize("bias_shape", [None, (), (8,), (1, 8), (3, 1), (2, 1, 3, 8), (4, 3, 1)])
@pytest.mark.parametrize("hi", [1, 4])
def test_reference_matches_naive(rng, bias_shape, hi):
    ins = make_case(rng, hi=hi, bias_shape=bias_shape, past=5, cur=3)
    y = reference.index_share(node(4, 2, scale=0.7), ins)[0]
    kc = np.concatenate([ins[3], ins[1]], axis=2)
    vc = np.concatenate([ins[4], ins[2]], axis=2)
    bias4 = None
    if bias_shape is not None:
        bias4 = np.broadcast_to(ins[6].reshape((1,) * (4 - len(bias_shape)) + bias_shape), (2, 4, 3, 8))
    want = naive(ins[0], kc, vc, ins[5], 0.7, bias4, 2)
    assert rel_fro(y, want) < 1e-6


def test_reference_masked_row_is_zero_and_concat_present(rng):
    ins = make_case(rng, bias_shape=(2, 4, 3, 7), past=4, cur=3)
    ins[6][0, 1, 2, :] = -np.inf
    y, pk, pv = reference.index_share(node(4, 2), ins, present="concat")
    assert np.all(y[0, 1, 2] == 0) and np.any(y[0, 1, 1] != 0)
    assert np.array_equal(pk, np.concatenate([ins[3], ins[1]], axis=2))
    assert np.array_equal(pv, np.concatenate([ins[4], ins[2]], axis=2))


def test_reference_capacity(rng):
    b, nkv, cap, cur = 3, 2, 9, 2
    ins = make_case(rng, b=b, nkv=nkv, past=cap, cur=cur, k=3, cache=4, bias_shape=(b, 1, 3, cap))
    lens = [5, 9, 1]
    for i, ln in enumerate(lens):
        ins[6][i, ..., ln:] = -np.inf
    ins[5] = sorted_rows(rng, (b, 1, 3), np.array(lens), 3)
    assert list(capacity_valid_lengths(ins[6], b, cap)) == lens
    y, pk, pv = reference.index_share(node(4, 2), ins, present="capacity")
    for i, ln in enumerate(lens):
        wp = max(ln - cur, 0)
        for c in range(cur):
            if wp + c < cap:
                assert np.array_equal(pk[i, :, wp + c], ins[1][i, :, c])
    assert np.array_equal(pk[0, :, :3], ins[3][0, :, :3])
    bad = ins[5].copy()
    bad[1, 0, 0, :] = [0, 1, 9]  # 9 is past batch 1's valid length of 9? no: == 9 -> out
    with pytest.raises(SelectedIndicesError, match="batch=1"):
        reference.index_share(node(4, 2), ins[:5] + [bad, ins[6]], present="capacity")


def test_capacity_frontier_broadcast_last_axis():
    bias = np.zeros((1, 1, 1, 1), dtype=np.float32)
    assert list(capacity_valid_lengths(bias, 3, 7)) == [7, 7, 7]
    bias[...] = -np.inf
    assert list(capacity_valid_lengths(bias, 2, 7)) == [0, 0]


@pytest.mark.parametrize("change,match", [
    (lambda i: i.__setitem__(0, i[0][:, :3]), "num_heads"),
    (lambda i: i.__setitem__(3, None), "together"),
    (lambda i: i.__setitem__(5, i[5][:, :, :2]), "selected_indices shape"),
    (lambda i: i.__setitem__(6, np.zeros((5,), np.float32)), "broadcastable"),
    (lambda i: i.__setitem__(1, i[1].astype(np.float16)), "must match"),
    (lambda i: i.__setitem__(5, i[5].astype(np.float32)), "INT32 or INT64"),
])
def test_reference_refuses(rng, change, match):
    ins = make_case(rng, bias_shape=(8,))
    change(ins)
    with pytest.raises(KernelError, match=match):
        reference.index_share(node(4, 2), ins)


def test_attributes_and_claims():
    f = factory_class("pkg.nxrt", "IndexShare")()
    shapes = [(1, 4, 2, 64), (1, 2, 3, 64), (1, 2, 3, 64), None, None, (1, 1, 2, 5)]
    dts = [DataType.BFLOAT16] * 3 + [None, None, DataType.INT32]
    assert f.unsupported_reason(node(4, 2), shapes, dts) is None
    assert "kv_num_heads" in f.unsupported_reason(node(4, 3), shapes, dts)
    assert "scale" in f.unsupported_reason(node(4, 2, scale=-1.0), shapes, dts)
    assert "INT32" in f.unsupported_reason(node(4, 2), shapes, dts[:5] + [DataType.FLOAT])
    big = [(1, 4, 2, 1024)] + [(1, 2, 3, 1024)] * 2 + [None, None, (1, 1, 2, 5)]
    assert "head size" in f.unsupported_reason(node(4, 2), big, dts)
    with pytest.raises(ValueError):
        f.create(node(4, 2), shapes)
    with pytest.raises(KernelError):
        index_share.IndexShareFactory(object()).create(node(0), shapes)


def test_compile_variants_listed_and_nvrtc_sample():
    from attnrt.ops import _common
    from attnrt.runtime import compiler

    vs = index_share.compile_variants()
    assert {v.file for v in vs} == {"index_share_aux.cu", "index_share_attn.cu",
                                    "index_share_mma.cu", "index_share_wg.cu",
                                    "index_share_ws.cu"}
    sample = [vs[0], next(v for v in vs if v.file == "index_share_attn.cu"),
              next(v for v in vs if v.file == "index_share_mma.cu"),
              next(v for v in vs if v.file == "index_share_wg.cu"),
              next(v for v in vs if v.file == "index_share_ws.cu")]
    for v in sample:
        for arch in ("sm_80", "sm_90"):
            if v.min_arch > int(arch[3:]):
                continue
            c = compiler.compile_source(_common.source(v.file), v.file, arch + v.arch_suffix,
                                        v.options, _common.headers())
            assert c.cubin and b".entry" in c.ptx
            if v.file in ("index_share_wg.cu", "index_share_ws.cu"):
                assert b"wgmma.mma_async" in c.ptx


# ---------------------------------------------------------------------------------------
# emulated kernels behind a fake runtime
# ---------------------------------------------------------------------------------------

_CXX = shutil.which("g++")


_EMU_FLAGS = ["-std=c++17", "-O1", "-fPIC", "-fno-strict-aliasing", "-U_FORTIFY_SOURCE",
              "-D_FORTIFY_SOURCE=0", "-DNXRT_EMU"]


def _compile_emu(builddir: Path, module: str, source: str, options, headers) -> Path:
    key = hashlib.sha256((source + repr(sorted(options)) + repr(sorted(headers.items()))).encode()
                         ).hexdigest()[:16]
    so = builddir / f"{module}-{key}.so"
    if so.exists():
        return so
    src = builddir / f"{module}-{key}.cu"
    src.write_text(source)
    for name, text in headers.items():
        # Rewrite a header only when it changed, atomically: a compile running in another
        # thread may be reading it (a truncated read was a flaky compile error).
        path = builddir / name
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(path.suffix + f".{threading.get_ident()}.tmp")
            tmp.write_text(text)
            tmp.replace(path)
    cmd = [_CXX, *_EMU_FLAGS, "-shared", f"-I{builddir}", "-x", "c++", *options, str(src),
           "-o", str(so) + ".tmp"]
    subprocess.run(cmd, check=True, capture_output=True)
    Path(str(so) + ".tmp").rename(so)
    return so


class _EmuFn:
    def __init__(self, lib, entry):
        self.name = entry
        self._launch = getattr(lib, f"emu_launch_{entry}")
        self._err = getattr(lib, f"emu_error_{entry}")
        self._err.restype = ctypes.c_char_p
        sizes = (ctypes.c_int * 64)()
        n = getattr(lib, f"emu_params_{entry}")(sizes)
        self.sizes = list(sizes[:n])

    def __call__(self, grid, block, args, smem):
        assert len(args) == len(self.sizes), f"{self.name}: {len(args)} args for {len(self.sizes)}"
        keep, ptrs = [], (ctypes.c_void_p * len(args))()
        for i, (a, size) in enumerate(zip(args, self.sizes)):
            if isinstance(a, np.generic):
                buf = ctypes.create_string_buffer(a.tobytes(), a.nbytes)
                assert a.nbytes == size, f"{self.name} arg {i}: {a.nbytes} bytes for a {size}-byte param"
            else:
                assert isinstance(a, int) and size == 8, f"{self.name} arg {i}: {a!r}"
                buf = ctypes.c_uint64(a)
            keep.append(buf)
            ptrs[i] = ctypes.addressof(buf)
        g = tuple(grid) + (1,) * (3 - len(grid)) if isinstance(grid, tuple) else (grid, 1, 1)
        b = (block, 1, 1) if isinstance(block, int) else tuple(block)
        rc = self._launch(ptrs, *[ctypes.c_uint(x) for x in g + b], ctypes.c_size_t(smem))
        if rc:
            raise AssertionError(f"emulated {self.name} failed: {self._err().decode()}")


class FakeRuntime:
    """The parts of CudaRuntime the IndexShare kernel uses, on host memory."""

    def __init__(self, builddir: Path, sm_count: int = 3):
        self.builddir = builddir
        # An sm_80 device: the emulation runs the mma.sync and CUDA-core kernels (the sm_90a
        # wgmma path has no host emulation; the GPU tests cover it).
        self.capabilities = SimpleNamespace(sm_count=sm_count, arch="sm_80",
                                            max_shared_per_block_optin=227 * 1024)
        self.arch = "sm_80"
        self._bufs: dict[int, np.ndarray] = {}
        self._libs: dict[Path, ctypes.CDLL] = {}
        self._fns: dict[tuple, _EmuFn] = {}
        self._rec: list | None = None
        self._latch_buf = np.zeros(16, dtype=np.uint32)
        self.latch = Latch(self, self._latch_buf.ctypes.data)
        self.launch_count = 0
        self.live = 0

    # memory
    def alloc_raw(self, n):
        self._refuse("alloc_raw")
        raw = np.zeros(n + 512, dtype=np.uint8)
        ptr = (raw.ctypes.data + 255) // 256 * 256
        self._bufs[ptr] = raw
        self.live += 1
        return ptr

    def free_raw(self, ptr):
        self._refuse("free_raw")
        del self._bufs[ptr]
        self.live -= 1

    def htod(self, ptr, host):
        self._refuse("htod")
        a = np.ascontiguousarray(host)
        ctypes.memmove(ptr, a.ctypes.data, a.nbytes)

    def dtoh(self, host, ptr):
        self._refuse("dtoh")
        ctypes.memmove(host.ctypes.data, ptr, host.nbytes)
        return host

    def dtod(self, dst, src, n):
        self._do(lambda: ctypes.memmove(dst, src, n))

    def memset(self, ptr, value, n):
        self._do(lambda: ctypes.memset(ptr, value, n))

    def synchronize(self):
        self._refuse("synchronize")

    # capture
    def is_capturing(self):
        return self._rec is not None

    def _refuse(self, what):
        if self._rec is not None:
            raise CaptureError(f"{what} is not allowed while the stream is capturing")

    def _refuse_while_capturing(self, what):
        self._refuse(what)

    def _do(self, op):
        if self._rec is not None:
            self._rec.append(op)
        else:
            op()

    def begin_capture(self):
        self._rec = []

    def end_capture(self):
        ops, self._rec = self._rec, None
        return SimpleNamespace(replay=lambda: [op() for op in ops], ops=ops)

    def capture_error_ptr(self):
        return self._latch_buf.ctypes.data

    # compile and launch
    def nvrtc_function(self, module, source, entry, options=(), *, headers=None, arch=None):
        so = _compile_emu(self.builddir, module, source, options, headers or {})
        lib = self._libs.get(so) or self._libs.setdefault(so, ctypes.CDLL(str(so)))
        key = (so, entry)
        if key not in self._fns:
            self._fns[key] = _EmuFn(lib, entry)
        return self._fns[key]

    def launch(self, fn, grid, block, args, shared_mem=0, *, programmatic=False):
        assert shared_mem <= self.capabilities.max_shared_per_block_optin
        # Only the warp-specialised build (which waits on griddepcontrol) may take it.
        assert not programmatic or fn.name == "is_attn_ws", fn.name
        self.launch_count += 1
        self._do(lambda: fn(grid, block, list(args), shared_mem))


class HostArray:
    """DeviceArray's role on the fake runtime."""

    def __init__(self, rt, arr):
        self.rt, self.arr = rt, np.ascontiguousarray(arr)
        self.dtype = DataType.from_numpy(self.arr.dtype)
        self.ptr = rt.alloc_raw(max(self.arr.nbytes, 1))
        rt.htod(self.ptr, self.arr)

    def view(self):
        return TensorView(self.ptr, self.dtype, self.arr.shape)

    def mut(self):
        return TensorMut(self.ptr, self.dtype, self.arr.shape)

    def numpy(self):
        out = np.empty_like(self.arr)
        return self.rt.dtoh(out, self.ptr)

    def poison(self):
        ctypes.memset(self.ptr, 0xFF, self.arr.nbytes)

    def free(self):
        self.rt.free_raw(self.ptr)


_EMU_VARIANTS = [
    ("index_share_aux.cu", {"IS_DTYPE": 0}), ("index_share_aux.cu", {"IS_DTYPE": 2}),
    ("index_share_attn.cu", {"IS_DTYPE": 0, "IS_VEC": 4, "IS_CPL": 1, "IS_RB": 4}),
    ("index_share_attn.cu", {"IS_DTYPE": 2, "IS_VEC": 8, "IS_CPL": 1, "IS_RB": 1}),
    ("index_share_mma.cu", {"IS_DTYPE": 2, "IS_HD": 64, "IS_WM": 1, "IS_WN": 4}),
    ("index_share_mma.cu", {"IS_DTYPE": 1, "IS_HD": 128, "IS_WM": 4, "IS_WN": 2}),
    # The lean per-tile pipeline (IS_PIPE 2, the planner's default); the pipe-1 builds
    # above serve test_emulated_mma_pipes_bitwise_equal.
    ("index_share_mma.cu", {"IS_DTYPE": 2, "IS_HD": 64, "IS_WM": 1, "IS_WN": 4, "IS_PIPE": 2}),
    ("index_share_mma.cu", {"IS_DTYPE": 1, "IS_HD": 128, "IS_WM": 4, "IS_WN": 2, "IS_PIPE": 2}),
    ("index_share_mma.cu", {"IS_DTYPE": 2, "IS_HD": 64, "IS_WM": 4, "IS_WN": 1, "IS_PIPE": 2}),
]


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    if _CXX is None:
        pytest.skip("g++ is not installed: the kernel emulation tests need it")
    from attnrt.ops import _common

    d = tmp_path_factory.mktemp("index_share_emu")
    hdrs = _common.headers()
    probe = subprocess.run([_CXX, "-std=c++17", "-x", "c++", "-fsyntax-only", "-"],
                           input="_Float16 x = 1; int main(){}", text=True, capture_output=True)
    if probe.returncode:
        pytest.skip("this g++ has no _Float16 (needed by the emulation)")
    for name, text in hdrs.items():
        (d / name).write_text(text)
    # A precompiled emulation header halves each library's build time.
    subprocess.run([_CXX, *_EMU_FLAGS, "-x", "c++-header", str(d / "index_share_emu.cuh"), "-o",
                    str(d / "index_share_emu.cuh.gch")], capture_output=True)
    with ThreadPoolExecutor(2) as ex:  # pre-build the libraries in parallel
        list(ex.map(lambda fv: _compile_emu(d, Path(fv[0]).stem, _common.source(fv[0]),
                                            _common.defines_to_options(fv[1]), hdrs),
                    _EMU_VARIANTS))
    return FakeRuntime(d)


def run_emu(rt, nd, ins, mode, path=None, kernel=None, ws=None):
    """Upload, execute (poisoned outputs), download; returns (outs, kernel, arrays)."""
    arrs = [None if a is None else HostArray(rt, a) for a in ins]
    views = [a.view() if a is not None else TensorView.absent_slot() for a in arrs]
    q, pk = ins[0], ins[3]
    shapes = [q.shape]
    if mode == "concat":
        sh = list(ins[1].shape)
        sh[2] += 0 if pk is None else pk.shape[2]
        shapes += [tuple(sh)] * 2
    elif mode == "capacity":
        shapes += [pk.shape] * 2
    outs = [HostArray(rt, np.zeros(s, dtype=q.dtype)) for s in shapes]
    for o in outs:
        o.poison()
    k = kernel or index_share.IndexShareFactory(rt).create(nd)
    k.config = dataclasses.replace(k.config, path=path)
    k.execute(views, [o.mut() for o in outs], ws)
    res = [o.numpy() for o in outs]
    return res, k, arrs + outs


def _free(arrs):
    for a in arrs:
        if a is not None:
            a.free()


@pytest.mark.parametrize("cfg", [
    # (dtype, n, nkv, hi, h, k, bias_shape, mode, path, idx dtype)
    (np.float32, 8, 2, 1, 16, 37, (2, 1, 3, 45), "concat", "simt", np.int64),
    (np.float32, 4, 4, 4, 20, 9, (3, 45), "none", "simt", np.int32),
    (BF16, 4, 4, 1, 64, 70, None, "none", "simt", np.int32),
    (BF16, 8, 1, 1, 64, 70, (1, 8, 3, 1), "none", "mma", np.int64),
    (np.float16, 48, 1, 1, 128, 33, (45,), "concat", "mma", np.int32),
])
def test_emulated_kernels_match_reference(emu, rng, cfg):
    dt, n, nkv, hi, h, k, bias_shape, mode, path, idt = cfg
    ins = make_case(rng, b=2, n=n, nkv=nkv, sq=3, cur=4, past=41, h=h, k=k, hi=hi, dtype=dt,
                    bias_shape=bias_shape, idx_dtype=idt)
    if bias_shape is not None:
        ins[6].reshape(-1)[::7] = -np.inf  # masked columns
    nd = node(n, nkv, outputs=3 if mode != "none" else 1)
    outs, kern, arrs = run_emu(emu, nd, ins, mode, path)
    assert kern.last_plan.path == path
    want = reference.index_share(nd, ins, present=mode)
    tol = TOL[DataType.from_numpy(dt)]
    assert rel_fro(outs[0], want[0]) < tol, (kern.last_plan, rel_fro(outs[0], want[0]))
    for got, ref in zip(outs[1:], want[1:]):
        assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))
    again, _, arrs2 = run_emu(emu, nd, ins, mode, path, kernel=kern)
    assert np.array_equal(again[0].view(np.uint8), outs[0].view(np.uint8))  # deterministic
    kern.close()
    _free(arrs + arrs2)


def test_emulated_split_k_and_capacity_capture(emu, rng):
    """Few SMs force split-K; capacity mode aliases past; capture then replay (good, bad)."""
    b, n, nkv, cap, cur, h, k = 2, 4, 2, 700, 2, 16, 280
    lens = np.array([650, 300])
    ins = make_case(rng, b=b, n=n, nkv=nkv, sq=2, cur=cur, past=cap, h=h, k=k,
                    bias_shape=(b, 1, 2, cap), cache=300)
    for i, ln in enumerate(lens):
        ins[6][i, ..., ln:] = -np.inf
    ins[5] = sorted_rows(rng, (b, 1, 2), lens, k)
    nd = node(n, nkv, outputs=3)
    arrs = [None if a is None else HostArray(emu, a) for a in ins]
    past_k, past_v = arrs[3], arrs[4]
    y = HostArray(emu, np.zeros(ins[0].shape, np.float32))
    kern = index_share.IndexShareFactory(emu).create(nd)
    assert not kern.capture_support()
    views = [a.view() for a in arrs]
    outs = [y.mut(), past_k.mut(), past_v.mut()]  # present aliases past (in place)
    y.poison()
    kern.execute(views, outs)
    assert kern.last_plan.splits > 1 and kern.capture_support()
    assert kern.workspace_requirement([v.meta for v in views]).nbytes >= kern.last_plan.nbytes
    want = reference.index_share(nd, ins, present="capacity")
    assert rel_fro(y.numpy(), want[0]) < 1e-5
    assert np.array_equal(past_k.numpy(), want[1]) and np.array_equal(past_v.numpy(), want[2])

    # capture with the same shapes; the replays read whatever the buffers hold then
    past_k.rt.htod(past_k.ptr, ins[3])
    past_v.rt.htod(past_v.ptr, ins[4])
    emu.begin_capture()
    kern.execute(views, outs)
    graph = emu.end_capture()
    new_idx = sorted_rows(rng, (b, 1, 2), lens, k)
    arrs[5].rt.htod(arrs[5].ptr, new_idx)
    y.poison()
    graph.replay()
    emu.latch.check()
    want2 = reference.index_share(nd, ins[:5] + [new_idx, ins[6]], present="capacity")
    assert rel_fro(y.numpy(), want2[0]) < 1e-5
    bad = new_idx.copy()
    bad[1, 0, 1, 3] = 10**6  # out of range: clamped on the device, latched
    arrs[5].rt.htod(arrs[5].ptr, bad)
    graph.replay()
    with pytest.raises(CaptureError, match="IndexShare") as ei:
        emu.latch.check()
    assert ei.value.bits == INDEX_SHARE_SELECTED_INDICES
    # eager with the bad row: refused before any output changes
    with pytest.raises(SelectedIndicesError, match=r"batch=1, head=0, query=1, column=3"):
        kern.execute(views, outs)
    kern.close()
    _free(arrs + [y])


def test_emulated_capture_before_warmup_and_growth(emu, rng):
    ins = make_case(rng, b=1, n=4, nkv=2, sq=1, cur=1, past=400, h=16, k=300)
    nd = node(4, 2)
    arrs = [None if a is None else HostArray(emu, a) for a in ins]
    y = HostArray(emu, np.zeros(ins[0].shape, np.float32))
    kern = index_share.IndexShareFactory(emu).create(nd)
    emu.begin_capture()
    with pytest.raises(CaptureError, match="warm-up"):
        kern.execute([a.view() if a else TensorView.absent_slot() for a in arrs], [y.mut()])
    emu.end_capture()
    kern.execute([a.view() if a else TensorView.absent_slot() for a in arrs], [y.mut()])
    assert kern.last_plan.splits > 1  # 3 fake SMs: the decode row is split
    need = kern.workspace_requirement([a.view().meta if a else TensorView.absent_slot() for a in arrs])
    assert need.nbytes >= kern.last_plan.nbytes > 0
    # a longer cache needs more splits → more scratch than the warm pool holds
    ins2 = make_case(rng, b=2, n=4, nkv=2, sq=1, cur=1, past=900, h=16, k=800)
    arrs2 = [None if a is None else HostArray(emu, a) for a in ins2]
    y2 = HostArray(emu, np.zeros(ins2[0].shape, np.float32))
    emu.begin_capture()
    with pytest.raises(CaptureError, match="missing warm-up"):
        kern.execute([a.view() if a else TensorView.absent_slot() for a in arrs2], [y2.mut()])
    emu.end_capture()
    kern.close()
    _free(arrs + arrs2 + [y, y2])
    assert emu.live == 0


@pytest.mark.parametrize("knobs", [
    {"wm": 1, "wn": 4, "stages": 2, "splits": 1},
    {"wm": 1, "wn": 4, "stages": 3, "splits": 2, "merge": "last"},
    {"wm": 4, "wn": 1, "stages": 5, "splits": 1},
    {"wm": 4, "wn": 1, "stages": 3, "splits": 2, "merge": "last"},
    {"wm": 4, "wn": 2, "stages": 3, "splits": 2, "merge": "last"},
    {"wm": 1, "wn": 4, "stages": 2, "splits": 11, "merge": "last"},
], ids=["ring2", "ring3-split-last", "ring5-wn1", "ring3-wn1-split-last", "f16-h128-4x2",
        "split11-last"])
def test_emulated_mma_ring_and_split_merge(emu, rng, knobs):
    """Ring depths that wrap several times, every warp-layout kind, split-K merged in-kernel;
    the is_combine merge gives the same bits (``split11``: its loads in two batches)."""
    if knobs["wn"] == 2:  # the 8-warp layout, on the f16 H 128 build
        dt, n, h, sq, k, past = np.float16, 48, 128, 1, 200, 300
    elif knobs["splits"] > 8:  # 11 splits of 64 columns
        dt, n, h, sq, k, past = BF16, 16, 64, 2, 700, 900
    else:
        dt, n, h, sq, k, past = BF16, 16, 64, 2, 300, 500
    ins = make_case(rng, b=1, n=n, nkv=1, sq=sq, cur=3, past=past, h=h, k=k, dtype=dt,
                    bias_shape=(1, n, sq, past + 3), idx_dtype=np.int32)
    ins[6].reshape(-1)[::11] = -np.inf
    ins[5][0, 0, sq - 1, k - 50:] = -1  # a shorter row: padded tail columns and a partial tile
    nd = node(n, 1)
    want = reference.index_share(nd, ins)[0]
    kern = index_share.IndexShareFactory(emu).create(nd)
    kern.config = IndexShareConfig(**knobs)
    outs, kern, arrs = run_emu(emu, nd, ins, "none", "mma", kernel=kern)
    plan = kern.last_plan
    assert (plan.path, plan.stages, plan.splits) == ("mma", knobs["stages"], knobs["splits"])
    assert plan.threads == 32 * knobs["wm"] * knobs["wn"]
    assert rel_fro(outs[0], want) < TOL[DataType.from_numpy(dt)], (plan, rel_fro(outs[0], want))
    if plan.splits > 1:
        assert plan.merge == "last"
        kern.config = IndexShareConfig(path="mma", **dict(knobs, merge="kernel"))
        again, _, arrs2 = run_emu(emu, nd, ins, "none", "mma", kernel=kern)
        assert kern.last_plan.merge == "kernel"
        assert np.array_equal(again[0].view(np.uint16), outs[0].view(np.uint16))
        _free(arrs2)
        # A caller's workspace full of junk: its split counters are cleared per call.
        kern.config = IndexShareConfig(path="mma", **knobs)
        metas = [a.view().meta if a is not None else TensorView.absent_slot() for a in arrs[:7]]
        req = kern.workspace_requirement(metas)
        ws = HostArray(emu, np.full(req.nbytes, 0xFF, dtype=np.uint8))
        again, _, arrs3 = run_emu(emu, nd, ins, "none", "mma", kernel=kern,
                                  ws=WorkspaceView(ws.ptr, req.nbytes))
        assert np.array_equal(again[0].view(np.uint16), outs[0].view(np.uint16))
        _free(arrs3 + [ws])
    kern.close()
    _free(arrs)


def _mutations(rng, idx, bound):
    """(indices, expect_latch) pairs: valid rows and rows broken at split boundaries."""
    out = [(idx, False)]
    k = idx.shape[-1]
    for col in (0, 1, 64, 128, k - 1):  # 64-column splits: 64 and 128 start one
        for kind in ("dup", "dec", "sentinel", "range", "pad_gap", "lead_pad"):
            bad = idx.copy()
            row = bad[1, 0, 1]
            n = int((row != -1).sum())
            c = min(col, n - 1)
            if kind == "dup" and c > 0:
                row[c] = row[c - 1]
            elif kind == "dec" and c > 0:
                row[c - 1], row[c] = row[c], row[c - 1]
            elif kind == "sentinel":
                row[c] = -2 - int(rng.integers(0, 100))
            elif kind == "range":
                row[c:n] = bound + np.arange(n - c)
            elif kind == "pad_gap" and 0 < c < n - 1:
                row[c] = -1
            elif kind == "lead_pad":
                row[0] = -1
            else:
                continue
            out.append((bad, True))
    return out


def test_emulated_capture_validation_matches_host_rules(emu, rng):
    """During capture the attention kernels check every row rule on the device: a replay
    latches exactly when the host validator finds a violation (including at split
    boundaries, where a column's left neighbour belongs to another CTA), for both paths."""
    for path, n, nkv, dt, h in (("simt", 4, 2, np.float32, 16), ("mma", 8, 1, BF16, 64)):
        b, sq, past, k = 2, 2, 300, 200
        ins = make_case(rng, b=b, n=n, nkv=nkv, sq=sq, cur=1, past=past, h=h, k=k, dtype=dt,
                        idx_dtype=np.int64)
        ins[5][1, 0, 1] = np.sort(rng.choice(past + 1, size=k, replace=False))  # a full row
        nd = node(n, nkv)
        arrs = [None if a is None else HostArray(emu, a) for a in ins]
        views = [a.view() if a else TensorView.absent_slot() for a in arrs]
        y = HostArray(emu, np.zeros(ins[0].shape, dtype=dt))
        # 64-column splits: boundaries at 64, 128, ...
        kern = index_share.IndexShareFactory(emu, IndexShareConfig(path=path, splits=4)).create(nd)
        kern.execute(views, [y.mut()])
        assert kern.last_plan.splits == 4 and kern.last_plan.cps == 64
        emu.begin_capture()
        kern.execute(views, [y.mut()])
        graph = emu.end_capture()
        emu.latch.read(clear=True)
        for bad, expect in _mutations(rng, ins[5], past + 1):
            host = find_index_violation(bad, past + 1)
            assert (host is not None) == expect, (path, bad[1, 0, 1, :4], host)
            arrs[5].rt.htod(arrs[5].ptr, bad)
            graph.replay()
            bits = emu.latch.read(clear=True)
            assert bool(bits & INDEX_SHARE_SELECTED_INDICES) == expect, (path, host)
        kern.close()
        _free(arrs + [y])


@pytest.mark.parametrize("layout, bias", [((1, 4), False), ((1, 4), True), ((4, 2), False)],
                         ids=["1x4-plain-tiles", "1x4-bias", "4x2-plain-tiles"])
def test_emulated_mma_pipes_bitwise_equal(emu, rng, layout, bias):
    """IS_PIPE 2 (lean issue, unchecked scores on whole live tiles, skipped unit rescale)
    gives the bits of IS_PIPE 1: full and partial tiles, split-K, a padded row, bias."""
    wm, wn = layout
    if wn == 2:  # the 8-warp layout, on the f16 H 128 build
        dt, n, h, sq, k, past = np.float16, 48, 128, 1, 330, 400
    else:
        dt, n, h, sq, k, past = BF16, 16, 64, 2, 330, 600
    ins = make_case(rng, b=2, n=n, nkv=1, sq=sq, cur=2, past=past, h=h, k=k, dtype=dt,
                    bias_shape=(2, n, sq, past + 2) if bias else None, idx_dtype=np.int32)
    if bias:
        ins[6].reshape(-1)[::13] = -np.inf
    ins[5][1, 0, sq - 1, k - 70:] = -1  # padded tail: a partial last tile, fewer live tiles
    nd = node(n, 1)
    want = reference.index_share(nd, ins)[0]
    got = {}
    for pipe in (1, 2):
        kern = index_share.IndexShareFactory(emu).create(nd)
        kern.config = IndexShareConfig(wm=wm, wn=wn, stages=3, splits=2, pipe=pipe)
        outs, kern, arrs = run_emu(emu, nd, ins, "none", "mma", kernel=kern)
        assert kern.last_plan.knobs["pipe"] == pipe
        assert rel_fro(outs[0], want) < TOL[DataType.from_numpy(dt)]
        got[pipe] = outs[0]
        kern.close()
        _free(arrs)
    assert np.array_equal(got[1].view(np.uint16), got[2].view(np.uint16))


# ---------------------------------------------------------------------------------------
# the wgmma path's planning (pure: no GPU, no compile)
# ---------------------------------------------------------------------------------------

def _geom(n: int, nkv: int = 1, b: int = 64, sq: int = 1, k: int = 2048, h: int = 128,
          dt: DataType = DataType.BFLOAT16, hi: int = 1, idt: DataType = DataType.INT32):
    from attnrt.ops.index_share import parse_attributes, resolve_geometry

    past = 8191
    shapes = [(b, n, sq, h), (b, nkv, sq, h), (b, nkv, sq, h), (b, nkv, past, h),
              (b, nkv, past, h), (b, hi, sq, k)]
    dts = [dt] * 5 + [idt]
    return resolve_geometry(parse_attributes(node(n, nkv)), shapes, dts, "none")


def _plan(g, sm_count: int = 132, aligned16: bool = True, path: str | None = None,
          capacity: bool = False, *, knobs: dict | None = None, wg_arch: bool = False,
          smem_max: int = 227 * 1024):
    """``make_plan`` for a device of ``sm_count`` SMs (sm_90a code where ``wg_arch``) with
    ``IndexShareConfig(path=path, **knobs)``."""
    return make_plan(g, DeviceLimits(sm_count, smem_max, 228 * 1024, wg_arch),
                     aligned16=aligned16, capacity_scratch=capacity,
                     config=IndexShareConfig(path=path, **(knobs or {})))


def test_wg_plan_choice_and_layouts():
    plan = _plan
    # Decode N64 with the barrier-coupled build (ws=0; the default from 64 heads is ws, see
    # test_ws_plan_choice_grid_and_refusals): two warpgroups splitting each tile's keys.
    p = plan(_geom(64, b=100), 132, True, None, False, knobs={"ws": 0}, wg_arch=True)
    assert (p.path, p.knobs["wgs"], p.knobs["mrows"], p.knobs["overlap"]) == ("wg", 2, 64, 0)
    assert p.threads == 256 and p.heads_per_cta == 64 and p.knobs["ws"] == 0
    assert p.smem <= 227 * 1024 and p.stages >= 2
    assert p.smem == builds._wg_smem(128, 2, 64, p.stages, p.cps)
    # Prefill N64 (4096 rows) takes ws (below); with ws=0 one warpgroup with Q in
    # registers, a 2-stage ring and the 168-register build: three CTAs per SM.
    t = plan(_geom(64, b=1, sq=4096), 132, True, None, False, knobs={"ws": 0}, wg_arch=True)
    assert (t.path, t.knobs["wgs"], t.per_sm, t.splits) == ("wg", 1, 3, 1)
    assert (t.knobs["qreg"], t.knobs["overlap"], t.knobs["minb"], t.stages) == (1, 0, 3, 2)
    assert t.variant.defines["IS_MINB"] == 3 and 3 * (t.smem + 1024) <= 228 * 1024
    # Uncapped (minb 1): two CTAs per SM, which with Q in registers get a 3-stage ring and
    # the overlapped loop.
    q = plan(_geom(64, b=1, sq=4096), 132, True, None, False, knobs={"minb": 1}, wg_arch=True)
    assert (q.per_sm, q.knobs["qreg"], q.knobs["overlap"], q.stages) == (2, 1, 1, 3)
    assert "IS_MINB" not in q.variant.defines and 2 * (q.smem + 1024) <= 228 * 1024
    p = plan(_geom(64, b=1, sq=4096), 132, True, None, False, knobs={"qreg": 0, "overlap": 0},
             wg_arch=True)
    assert (p.per_sm, p.stages, p.knobs["minb"]) == (2, 2, 1)
    assert q.smem == p.smem - 16384 + 32768 and t.smem == p.smem - 16384
    # N128 with the barrier-coupled build (ws=0): decode takes one 128-head CTA; prefill two
    # 64-head blocks per row, three CTAs per SM; a pinned 128-head prefill CTA takes the
    # overlapped loop (>= 3 stages). (The default above 64 heads is ws: see below.)
    p = plan(_geom(128), 132, True, None, False, knobs={"ws": 0}, wg_arch=True)
    assert (p.knobs["wgs"], p.knobs["mrows"], p.knobs["overlap"]) == (2, 128, 0)
    p = plan(_geom(128, b=1, sq=4096), 132, True, None, False, knobs={"ws": 0}, wg_arch=True)
    assert (p.knobs["wgs"], p.knobs["mrows"], p.knobs["minb"], p.per_sm) == (1, 64, 3, 3)
    assert p.hbk == 2 and p.grid == 2 * 4096
    p = plan(_geom(128, b=1, sq=4096), 132, True, None, False, knobs={"ws": 0, "mrows": 128},
             wg_arch=True)
    assert (p.knobs["wgs"], p.knobs["mrows"], p.knobs["overlap"]) == (2, 128, 1)
    assert p.stages >= 3
    # Groups of 96 heads: one 128-row block (rows past 96 are dropped); 48: one 64-row block.
    assert plan(_geom(96), 132, True, None, False, knobs={"ws": 0}, wg_arch=True).hbk == 1
    p = plan(_geom(48), 132, True, None, False, wg_arch=True)
    assert (p.knobs["mrows"], p.hbk) == (64, 1)


@pytest.mark.parametrize("n", [64, 128])
def test_ws_decode_split(n):
    """Decode rows with at most 66 tasks (132 SMs) take the warp-specialised build with one
    item per CTA (NOTES, IndexShare rounds 20-22): up to half the SMs, eight splits of two
    tiles as eight-CTA clusters merging through distributed shared memory (IS_CMERGE with
    IS_CMDS; fewer keys: five to seven splits merged by is_combine, four as four-CTA
    clusters), else four splits as four-CTA clusters merging from their partials in L2;
    else two splits per task as two-CTA clusters; past one wave of clusters, the wave model
    (and for 64 heads the barrier-coupled build)."""
    plan = _plan
    for b in (1, 3, 8):
        p = plan(_geom(n, b=b), 132, True, None, False, wg_arch=True)
        assert (p.entry, p.splits, p.merge, p.grid, p.cps) == ("is_attn_ws", 8, "cluster",
                                                                8 * b, 256), (b, p)
        d = p.variant.defines
        assert d["IS_CMERGE"] == 8 and d["IS_CMDS"] == 1 and "IS_CLUSTER" not in d
        # No partials and no split counters (no scratch at all); the shared memory of the
        # plain ws build (the partials land in the rings).
        assert not p.partials and p.nbytes == 0 and p.smem == builds._ws_smem(128, 256)
    for b in (9, 16):
        p = plan(_geom(n, b=b), 132, True, None, False, wg_arch=True)
        assert (p.entry, p.splits, p.merge, p.grid, p.cps) == ("is_attn_ws", 4, "cluster",
                                                                4 * b, 512), (b, p)
        assert p.variant.defines["IS_CMERGE"] == 4 and "IS_CMDS" not in p.variant.defines
        assert p.partials and p.nbytes == p.valid_off, p
    for b in (17, 33, 64, 66):
        p = plan(_geom(n, b=b), 132, True, None, False, wg_arch=True)
        assert (p.entry, p.splits, p.merge, p.grid) == ("is_attn_ws", 2, "cluster", 2 * b), (b, p)
    # Past one wave of two-CTA clusters: the persistent ws build with one split
    # (test_ws_persistent_splits).
    p = plan(_geom(n, b=67), 132, True, None, False, wg_arch=True)
    assert (p.entry, p.splits, p.merge, p.grid) == ("is_attn_ws", 1, "none", 67), p
    # The rule in tasks: two 128-head blocks per row (N 256) count twice; two index rows
    # per batch row (Sq 2) too; the ctas knob caps the SMs it may use.
    assert plan(_geom(256, b=4), 132, True, None, False, wg_arch=True).splits == 8
    assert plan(_geom(256, b=5), 132, True, None, False, wg_arch=True).splits == 4
    assert plan(_geom(256, b=9), 132, True, None, False, wg_arch=True).splits == 2
    assert plan(_geom(n, b=4, sq=2), 132, True, None, False, wg_arch=True).splits == 8
    p = plan(_geom(n, b=8), 132, True, None, False, knobs={"ctas": 64}, wg_arch=True)
    assert (p.splits, p.merge, p.grid) == (8, "cluster", 64)
    p = plan(_geom(n, b=8), 132, True, None, False, knobs={"ctas": 40}, wg_arch=True)
    assert (p.splits, p.merge, p.grid) == (4, "cluster", 32)
    # A plan's ws knobs pin it again (the ctas knob caps the grid as it does elsewhere).
    for b in (1, 8, 9, 16, 33):
        p = plan(_geom(n, b=b), 132, True, None, False, wg_arch=True)
        pin = {k: p.knobs[k] for k in ("ws", "splits", "merge", "ctas", "q2", "kt")}
        q = plan(_geom(n, b=b), 132, True, None, False, knobs=pin, wg_arch=True)
        assert (q.splits, q.merge, q.grid, q.variant) == (p.splits, p.merge, p.grid, p.variant)
    # Fewer keys: splits of at least two tiles (4 or more merged by is_combine), else two.
    for k, splits, merge in ((4096, 8, "cluster"), (1500, 6, "kernel"), (1024, 4, "cluster"),
                             (1100, 2, "cluster"), (512, 2, "cluster"), (200, 2, "cluster")):
        p = plan(_geom(n, b=1, k=k), 132, True, None, False, wg_arch=True)
        assert (p.splits, p.merge) == (splits, merge), (k, p)
    p = plan(_geom(n, b=1, k=64), 132, True, None, False, wg_arch=True)
    assert p.splits == 1 and p.merge == "none"
    # Pinned splits above two default to is_combine (four or eight: the four- or eight-CTA
    # clusters while they fit); the other merges stay knobs, and those clusters need
    # 128-key tiles.
    assert plan(_geom(n, b=2), 132, True, None, False, knobs={"splits": 6},
                wg_arch=True).merge == "kernel"
    assert plan(_geom(n, b=2), 132, True, None, False, knobs={"splits": 4},
                wg_arch=True).merge == "cluster"
    for merge in ("last", "kernel"):
        p = plan(_geom(n, b=2), 132, True, None, False, knobs={"splits": 8, "merge": merge},
                 wg_arch=True)
        assert p.merge == merge and "IS_CMERGE" not in p.variant.defines and p.partials
    assert plan(_geom(n, b=20), 132, True, None, False, knobs={"splits": 8},
                wg_arch=True).merge == "kernel"  # 160 items: more than one per CTA
    assert plan(_geom(n, b=9), 132, True, None, False, knobs={"splits": 8},
                wg_arch=True).merge == "kernel"  # 72 CTAs: more than half the SMs
    with pytest.raises(KernelError, match="at most 66"):
        plan(_geom(n, b=9), 132, True, None, False, knobs={"splits": 8, "merge": "cluster"},
             wg_arch=True)
    with pytest.raises(KernelError, match="or eight"):
        plan(_geom(n, b=2), 132, True, None, False, knobs={"splits": 8, "merge": "cluster",
                                                         "kt": 64}, wg_arch=True)
    # The helper alone.
    assert splitk._ws_decode_split(8, 2048, 132) == (8, "cluster")
    assert splitk._ws_decode_split(8, 1024, 132) == (4, "cluster")
    assert splitk._ws_decode_split(16, 2048, 132) == (4, "cluster")
    assert splitk._ws_decode_split(17, 2048, 132) == (2, "cluster")
    assert splitk._ws_decode_split(9, 2048, 132) == (4, "cluster")
    assert splitk._ws_decode_split(67, 2048, 132) is None
    assert splitk._ws_decode_split(1, 128, 132) is None
    # Only split counts the plan's 128-key column split gives exactly: 1100 keys in four
    # splits come out as three, 10000 in four as five (2048-column cap), 8192 in two as four.
    assert splitk._ws_decode_split(1, 1100, 132) == (2, "cluster")
    assert splitk._ws_decode_split(10, 10000, 132) is None
    assert splitk._ws_decode_split(40, 8192, 132) is None
    assert splitk._ws_decode_split(8, 2048, 132, cap=40) == (4, "cluster")
    # Prefill (many rows) keeps the last-arrival merge for pinned splits above two.
    assert plan(_geom(n, b=1, sq=4096), 132, True, None, False, knobs={"splits": 4},
                wg_arch=True).merge == "last"


def test_ws_persistent_splits():
    """Decode rows past one wave of cluster plans: the persistent ws build's split count
    minimises its busiest CTA's items x (tiles + _WS_SPLIT_ITEM_TILES for a split item),
    as measured on the H200 (NOTES, IndexShare round 21)."""
    f = splitk._ws_persistent_splits
    # Top-k 1024 and 2048: one split at every batch measured (67-264).
    for b in (67, 96, 132, 133, 160, 198, 264):
        assert f(b, 2048, 132) == 1 and f(b, 1024, 132) == 1, b
    # Top-k 4096 (two splits at least): three at B 67 (201 items, two per CTA of 11 tiles),
    # two at B 96 and 160.
    assert (f(67, 4096, 132), f(96, 4096, 132), f(160, 4096, 132)) == (3, 2, 2)
    # The item cost by hand: ceil(T s / P) x (tiles + 8 if split).
    def cost(t, k, s):
        cps = builds._round_up(-(-k // s), 128)
        return -(-t * s // 132) * (cps // 128 + (8 if s > 1 else 0))
    for t, k in ((67, 4096), (100, 4096), (199, 4096), (40, 8192), (300, 6000)):
        s, lo = f(t, k, 132), -(-k // 2048)
        exact = [o for o in range(lo, 9)
                 if -(-k // min(builds._round_up(-(-k // o), 128), 2048)) == o]
        assert s in exact, (t, k, s)
        # the least cost, and the fewest splits on a tie
        assert all(cost(t, k, s) < cost(t, k, o) for o in exact if o < s), (t, k)
        assert all(cost(t, k, s) <= cost(t, k, o) for o in exact if o > s), (t, k)
    # Only exact split counts (the plan's column rounding gives that many), at least the
    # fewest 2048-column splits, and the slots are the grid's (the ctas knob).
    assert f(1, 16384, 132) == 8 and f(500, 2100, 132) == 2
    assert f(20, 4096, 10) == 2
    plan = _plan
    for n in (64, 128):
        for b, k, splits, merge in ((133, 2048, 1, "none"), (160, 2048, 1, "none"),
                                    (67, 4096, 3, "last"), (96, 4096, 2, "last")):
            p = plan(_geom(n, b=b, k=k), 132, True, None, False, wg_arch=True)
            assert (p.entry, p.splits, p.merge, p.grid) == ("is_attn_ws", splits, merge,
                                                            min(132, b * splits)), (n, b, k, p)
        # The ctas knob caps the slots the rule counts.
        p = plan(_geom(n, b=67, k=4096), 132, True, None, False, knobs={"ctas": 67},
                 wg_arch=True)
        assert (p.splits, p.grid) == (2, 67), p


def test_ws_plan_choice_grid_and_refusals():
    """The warp-specialised persistent build: the default from 64 heads per index row,
    one CTA per SM (or the ctas cap) looping over tasks x splits items, two Q slots where
    they fit (one split, int32 indices), shared memory as the kernel lays it out."""
    plan = _plan
    # Decode N128: 64 tasks split in two (128 items on 132 SMs), one Q slot; one item per
    # CTA, so the two splits of a task merge in a two-CTA cluster (no partials, no counters).
    p = plan(_geom(128), 132, True, None, False, wg_arch=True)
    assert (p.path, p.entry, p.threads, p.heads_per_cta) == ("wg", "is_attn_ws", 384, 128)
    assert (p.knobs["ws"], p.knobs["q2"], p.splits, p.merge) == (1, 0, 2, "cluster")
    assert p.variant.defines["IS_CLUSTER"] == 1 and p.nbytes == 0
    assert p.grid == p.tasks * p.splits == 128 and p.cps == 1024
    assert p.smem == builds._ws_smem(128, 1024, 0, 1) <= 227 * 1024
    # ... in 128-key tiles; pinned to 64, twice the ring slots in the same bytes (WS_KTS).
    assert p.knobs["kt"] == 128 and "IS_KT" not in p.variant.defines and p.stages == 2
    q = plan(_geom(128), 132, True, None, False, knobs={"kt": 64}, wg_arch=True)
    assert q.knobs["kt"] == 64 and q.variant.defines["IS_NST"] == 4 and q.stages == 4
    assert q.smem == p.smem
    # Decode N64 (B 64): the same in 128-key tiles; with fewer SMs than items, or pinned,
    # the last-arrival merge.
    p = plan(_geom(64), 132, True, None, False, wg_arch=True)
    assert (p.knobs["ws"], p.splits, p.merge, p.grid, p.knobs["kt"]) == (1, 2, "cluster", 128, 128)
    p = plan(_geom(128), 100, True, None, False, knobs={"splits": 2}, wg_arch=True)
    assert (p.merge, p.grid) == ("last", 100) and "IS_CLUSTER" not in p.variant.defines
    p = plan(_geom(128), 132, True, None, False, knobs={"merge": "last"}, wg_arch=True)
    assert p.merge == "last" and p.nbytes > 0 and "IS_CLUSTER" not in p.variant.defines
    # Prefill N128: 4096 items on 132 CTAs, two Q slots; int64 indices keep one.
    p = plan(_geom(128, b=1, sq=4096), 132, True, None, False, wg_arch=True)
    assert (p.knobs["q2"], p.splits, p.grid, p.tasks) == (1, 1, 132, 4096)
    assert p.variant.defines["IS_Q2"] == 1 and p.smem == builds._ws_smem(128, 2048, 1)
    assert p.smem <= 227 * 1024 < builds._ws_smem(128, 2048, 1) + 128 * 9 * 4 + 8192
    p64 = plan(_geom(128, b=1, sq=4096, idt=DataType.INT64), 132, True, None, False,
               wg_arch=True)
    assert p64.knobs["q2"] == 0 and "IS_Q2" not in p64.variant.defines
    # H 64: four ring slots; GQA: one item per (kv head, 128-head block).
    p = plan(_geom(256, nkv=2, b=1, sq=50, k=300, h=64), 132, True, None, False, wg_arch=True)
    assert p.variant.defines["IS_NST"] == 4 and p.units == 2 and p.tasks == 100
    # Knobs: a capped grid, pinned splits and merge, one Q slot.
    p = plan(_geom(128), 132, True, None, False, knobs={"ctas": 5, "splits": 3,
                                                         "merge": "kernel"}, wg_arch=True)
    assert (p.grid, p.splits, p.merge, p.knobs["ctas"]) == (5, 3, "kernel", 5)
    assert plan(_geom(128, b=1, sq=4096), 132, True, None, False, knobs={"q2": 0},
                wg_arch=True).knobs["q2"] == 0
    # Knobs of the barrier-coupled build pin it.
    assert plan(_geom(128), 132, True, None, False, knobs={"stages": 3},
                wg_arch=True).knobs["ws"] == 0
    # More than 8 x 2048 columns, or fewer than 64 heads per index row, keep the
    # barrier-coupled build unless asked; 64 heads take ws in every row count (decode past
    # one wave of two-CTA clusters too: NOTES, IndexShare round 21).
    assert plan(_geom(128, k=9 * 2048), 132, True, None, False, wg_arch=True).knobs["ws"] == 0
    assert plan(_geom(64, b=100), 132, True, None, False, wg_arch=True).knobs["ws"] == 1
    assert plan(_geom(64, b=300), 132, True, None, False, wg_arch=True).knobs["ws"] == 1
    assert plan(_geom(48, b=100), 132, True, None, False, wg_arch=True).knobs["ws"] == 0
    assert plan(_geom(64, b=3), 132, True, None, False, wg_arch=True).knobs["ws"] == 1
    assert plan(_geom(64, b=1, sq=4096), 132, True, None, False, wg_arch=True).knobs["ws"] == 1
    assert plan(_geom(48, b=1, sq=4096), 132, True, None, False, wg_arch=True).knobs["ws"] == 0
    assert plan(_geom(64), 132, True, None, False, knobs={"ws": 1}, wg_arch=True).grid == 128
    for knobs, geom, match in (
            ({"ws": 1, "wgs": 2}, _geom(128), "takes only the knobs"),
            ({"ws": 2}, _geom(128), "ws=2 must be 0 or 1"),
            ({"ws": 0, "ctas": 4}, _geom(128), "ctas applies"),
            ({"ws": 0, "q2": 1}, _geom(128), "q2 applies"),
            ({"ctas": 0}, _geom(128), "ctas=0 must be"),
            ({"q2": 1}, _geom(128), "q2=1 must be 0, or 1 with one split"),
            ({"q2": 1}, _geom(128, b=1, sq=4096, idt=DataType.INT64), "int32 indices"),
            ({"ws": 1}, _geom(128, k=9 * 2048), "at most 8 splits"),
            ({"merge": "cluster", "splits": 3}, _geom(128), "two splits .* or eight"),
            ({"merge": "cluster", "ctas": 100, "splits": 2}, _geom(128),
             "one work item per CTA, at most 100"),
            ({"merge": "cluster", "ws": 0}, _geom(128), "needs the warp-specialised build"),
            ({"kt": 96}, _geom(128), "kt=96 must be one of"),
            ({"kt": 64, "ws": 0}, _geom(128), "kt applies to the warp-specialised build"),
            ({"merge": "bogus"}, _geom(128), "must be 'last', 'kernel' or 'cluster'")):
        with pytest.raises(KernelError, match=match):
            plan(geom, 132, True, None, False, knobs=knobs, wg_arch=True)


def test_wg_plan_declines_and_refusals():
    plan = _plan
    # Not Hopper, fewer than WG_MIN_GROUP heads per index row, f32, per-head index rows,
    # unaligned tensors: the planner keeps the other paths.
    assert plan(_geom(64), 132, True, None, False, wg_arch=False).path == "mma"
    assert plan(_geom(16), 132, True, None, False, wg_arch=True).path == "mma"
    assert plan(_geom(64, dt=DataType.FLOAT, h=64), 132, True, None, False,
                wg_arch=True).path == "simt"
    assert plan(_geom(64, hi=64), 132, True, None, False, wg_arch=True).path == "simt"
    assert plan(_geom(64), 132, False, None, False, wg_arch=True).path == "simt"
    # A pinned ws build off the wgmma path (another arch, unaligned tensors, too few heads)
    # is refused, not quietly replaced by another plan; ws=0 there is what runs anyway.
    for geom, aligned, arch in ((_geom(128), True, False), (_geom(128), False, True),
                                (_geom(16), True, True)):
        with pytest.raises(KernelError, match="ws=1 asks for the warp-specialised build"):
            plan(geom, 132, aligned, None, False, knobs={"ws": 1, "splits": 2}, wg_arch=arch)
        assert plan(geom, 132, aligned, None, False, knobs={"ws": 0}, wg_arch=arch).path != "wg"
    # Forcing it where it cannot run, or knobs without a build, is a KernelError.
    with pytest.raises(KernelError, match="wgmma path needs an sm_90"):
        plan(_geom(64), 132, True, "wg", False, wg_arch=False)
    with pytest.raises(KernelError, match="wgmma path needs"):
        plan(_geom(16), 132, True, "wg", False, wg_arch=True)
    for knobs, match in (({"wgs": 1, "mrows": 128}, "no build"), ({"overlap": 2}, "overlap"),
                         ({"overlap": 1, "stages": 2}, r"stages=2 must be in \[3, 8\]"),
                         ({"stages": 9}, "stages"),
                         ({"qreg": 1, "wgs": 2}, "qreg=1 must be"),
                         ({"minb": 2}, "minb=2 must be"), ({"minb": 3}, "minb=3 must be"),
                         ({"minb": 3, "wgs": 2, "qreg": 0}, "minb=3 must be")):
        with pytest.raises(KernelError, match=match):
            plan(_geom(64), 132, True, "wg", False, knobs=knobs, wg_arch=True)
    # Three CTAs per SM cannot hold 3-stage rings: refused, not silently two per SM.
    with pytest.raises(KernelError, match="leave room for fewer"):
        plan(_geom(64, b=1, sq=4096), 132, True, "wg", False,
             knobs={"minb": 3, "wgs": 1, "qreg": 1, "stages": 3}, wg_arch=True)
    # Too many columns per split for shared memory: a clear refusal, not a bad launch.
    with pytest.raises(KernelError, match="shared memory"):
        plan(_geom(64, k=2048), 132, True, "wg", False, smem_max=100 * 1024,
             knobs={"splits": 1, "stages": 3}, wg_arch=True)


def test_config_is_data_and_shows_in_the_plan():
    """IndexShareConfig is the one way to pin a plan: frozen, picklable, typed fields only
    (an unknown knob or path is refused at construction), its repr names what it pins, and
    every plan carries the config it was made with."""
    import pickle

    cfg = IndexShareConfig(ws=1, splits=2)
    assert pickle.loads(pickle.dumps(cfg)) == cfg and hash(cfg) == hash(IndexShareConfig(splits=2, ws=1))
    assert repr(cfg) == "IndexShareConfig(splits=2, ws=1)"
    assert repr(IndexShareConfig()) == "IndexShareConfig()"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.splits = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match="prefetch"):
        IndexShareConfig(prefetch=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="path must be None, 'simt', 'mma' or 'wg'"):
        IndexShareConfig(path="tensor")
    p = _plan(_geom(128, b=9), 132, True, None, False, knobs={"ws": 1, "splits": 2}, wg_arch=True)
    assert p.config == cfg and "config=IndexShareConfig(splits=2, ws=1)" in repr(p)
    assert (p.splits, p.merge) == (2, "cluster") and p.knobs["ws"] == 1
    # The factory hands its config to every kernel it creates.
    kern = index_share.IndexShareFactory(object(), cfg).create(node(128, 1))
    assert kern.config is cfg


def test_wg_workspace_covers_the_wg_plan():
    """workspace_requirement plans the wg path on sm_90 (pure: the runtime is a stand-in)."""
    from types import SimpleNamespace

    from attnrt.runtime.api import TensorMetadata

    rt = SimpleNamespace(capabilities=SimpleNamespace(sm_count=132, arch="sm_90",
                                                      max_shared_per_block_optin=227 * 1024))
    kern = index_share.IndexShareKernel.__new__(index_share.IndexShareKernel)
    kern.rt, kern.node, kern.config = rt, node(64, 1), IndexShareConfig()
    from attnrt.ops.index_share import parse_attributes

    kern.attrs = parse_attributes(node(64, 1))
    # B 12: four-CTA clusters merging from their partials in L2 (B 17-66 takes the two-CTA
    # cluster merge: no scratch).
    g = _geom(64, b=12)
    metas = [TensorMetadata(d, s) for s, d in zip(
        [(12, 64, 1, 128), (12, 1, 1, 128), (12, 1, 1, 128), (12, 1, 8191, 128),
         (12, 1, 8191, 128), (12, 1, 1, 2048)], [DataType.BFLOAT16] * 5 + [DataType.INT32])]
    need = kern.workspace_requirement(metas).nbytes
    wg = _plan(g, 132, True, "wg", False, wg_arch=True)
    assert need >= wg.nbytes > 0
    # wgmma=False keeps the kernel off the wgmma path on sm_90 too (and its workspace with it).
    assert kern._make_plan(g, True, None, False).path == "wg"
    kern.config = IndexShareConfig(wgmma=False)
    assert kern._make_plan(g, True, None, False).path == "mma"
    assert kern.workspace_requirement(metas).nbytes == max(
        _plan(g, 132, True, p, False).nbytes for p in ("simt", "mma"))


@pytest.mark.parametrize("n,path,want,b,knobs", [
    (128, None, True, 4, None), (128, None, True, 4, {"splits": 6}),
    (128, None, True, 16, {"splits": 6}), (128, "mma", False, 4, None), (8, None, False, 4, None)])
def test_programmatic_launch_only_for_the_ws_build(n, path, want, b, knobs):
    """The warp-specialised build (which waits on ``griddepcontrol`` before it touches
    global memory) launches with programmatic dependent launch, and so does the is_combine
    after it (which waits likewise) where the ws grid leaves three quarters of the SMs free
    (6 splits of B 4: 24 CTAs; of B 16: 96, an ordinary launch); no other kernel does. (B 4
    by default: eight-CTA clusters, no is_combine.)"""
    from tests._fakes import FakeRuntime

    rt = FakeRuntime()  # an H200: cc 9.0, 132 SMs
    rng = np.random.default_rng(7)
    past, k, h = 3000, 2048, 128
    bf = DataType.BFLOAT16
    idx = np.stack([np.sort(rng.choice(past + 1, k, replace=False)) for _ in range(b)])
    ins = [rt.view((b, n, 1, h), bf), rt.view((b, 1, 1, h), bf), rt.view((b, 1, 1, h), bf),
           rt.view((b, 1, past, h), bf), rt.view((b, 1, past, h), bf),
           rt.view((b, 1, 1, k), DataType.INT32, data=idx.astype(np.int32).reshape(b, 1, 1, k))]
    out = rt.view((b, n, 1, h), bf, mut=True)
    kern = index_share.IndexShareFactory(rt, IndexShareConfig(path=path, **(knobs or {}))).create(
        node(n, 1))
    try:
        kern.execute(ins, [out])
    finally:
        kern.close()
    attn = [x for x in rt.launches if x.name.startswith("is_attn")]
    assert len(attn) == 1 and (attn[0].name == "is_attn_ws") == want, rt.names()
    ws_grid = kern.last_plan.grid if want else 0
    if want:  # eight splits in eight-CTA clusters, or the pinned six and is_combine
        splits = (knobs or {}).get("splits", 8)
        assert ws_grid == splits * b and kern.last_plan.merge == (
            "kernel" if knobs else "cluster"), kern.last_plan
        assert rt.names().count("is_combine") == (1 if knobs else 0), rt.names()
    assert [x.programmatic for x in rt.launches] == [
        x.name == "is_attn_ws" or (x.name == "is_combine" and 0 < 4 * ws_grid <= 132)
        for x in rt.launches]
    assert attn[0].programmatic == want
