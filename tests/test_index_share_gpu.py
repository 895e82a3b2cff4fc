"""IndexShare on the GPU against the float64 reference, determinism, and capture/replay
with valid and poisoned indices. Bounded parametrization (about 15 kernel variants)."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import attnrt
from attnrt.ops import index_share, reference
from attnrt.ops.index_share import IndexShareConfig, SelectedIndicesError, splitk
from attnrt.runtime import DeviceArray
from attnrt.runtime.api import DataType, TensorView
from attnrt.runtime.errors import CaptureError
from attnrt.runtime.latch import INDEX_SHARE_SELECTED_INDICES
from tests._nodes import index_share_node
from tests._util import TOL, rel_fro

pytestmark = pytest.mark.gpu

BF16 = ml_dtypes.bfloat16
F16, F32 = np.float16, np.float32


def make_node(n, nkv, outputs=1, scale=None):
    attrs = {"num_heads": n, "kv_num_heads": nkv}
    if scale is not None:
        attrs["scale"] = scale
    return index_share_node(attrs, outputs)


def rows(rng, shape, bound, k):
    """Strictly increasing index rows with trailing -1 padding; bound per batch or one int."""
    out = np.full(tuple(shape) + (k,), -1, dtype=np.int64)
    for pos in np.ndindex(*shape):
        bnd = int(bound[pos[0]]) if np.ndim(bound) else int(bound)
        n = min(k, bnd) if rng.random() < 0.5 else int(rng.integers(1, min(k, bnd) + 1))
        out[pos][:n] = np.sort(rng.choice(bnd, size=n, replace=False))
    return out


def case(rng, *, dtype, b, n, nkv, sq, cur, past, h, k, hi, bias, idt, mode):
    q = rng.standard_normal((b, n, sq, h)).astype(dtype)
    kk = rng.standard_normal((b, nkv, cur, h)).astype(dtype)
    vv = rng.standard_normal((b, nkv, cur, h)).astype(dtype)
    pk = rng.standard_normal((b, nkv, past, h)).astype(dtype) if past else None
    pv = rng.standard_normal((b, nkv, past, h)).astype(dtype) if past else None
    cache = past if mode == "capacity" else past + cur
    bounds: object = cache
    bb = None
    if bias is not None:
        shape = tuple(d if d != "C" else cache for d in bias)
        bb = (0.5 * rng.standard_normal(shape)).astype(dtype)
        if mode == "capacity":  # a per-batch valid length carried by the frontier
            lens = rng.integers(max(cur, k // 2 + 1), cache + 1, size=b)
            b4 = bb.reshape((1,) * (4 - bb.ndim) + bb.shape)
            full = np.broadcast_to(b4, (b,) + b4.shape[1:]).copy()
            for i, ln in enumerate(lens):
                full[i, ..., ln:] = -np.inf
            bb = full.astype(dtype)
            bounds = lens
        elif bb.size > 3:
            bb.reshape(-1)[1::5] = -np.inf  # masked entries
    idx = rows(rng, (b, hi, sq), bounds, k).astype(idt)
    return [q, kk, vv, pk, pv, idx, bb]


def upload(rt, ins):
    arrs = [None if a is None else DeviceArray.from_numpy(rt, a) for a in ins]
    views = [a.view() if a is not None else TensorView.absent_slot() for a in arrs]
    return arrs, views


def out_shapes(ins, mode):
    q, k, pk = ins[0], ins[1], ins[3]
    if mode == "none":
        return [q.shape]
    if mode == "concat":
        s = list(k.shape)
        s[2] += 0 if pk is None else pk.shape[2]
        return [q.shape, tuple(s), tuple(s)]
    return [q.shape, pk.shape, pk.shape]


def run(rt, kern, views, outs):
    for o in outs:
        o.fill_bytes(0xFF)  # NaN poison: every element must be written
    kern.execute(views, [o.mut() for o in outs])
    return [o.numpy() for o in outs]


def free(*groups):
    for g in groups:
        for a in g:
            if a is not None:
                a.free()


CASES = [
    # id, dtype, b, n, nkv, sq, cur, past, h, k, hi, bias, idx dtype, mode, path
    ("f32-gqa-rank1", F32, 2, 8, 2, 3, 2, 37, 32, 7, 1, ("C",), np.int32, "none", None),
    ("f16-mha-hiN-rank2", F16, 2, 4, 4, 3, 3, 61, 64, 64, 4, (3, "C"), np.int64, "concat", None),
    ("bf16-mma-wm1-rank4-cap", BF16, 2, 16, 2, 2, 2, 300, 64, 64, 1, (2, 1, 2, "C"), np.int32,
     "capacity", None),
    ("bf16-mma-wm4-k2048", BF16, 2, 64, 1, 2, 5, 2600, 128, 2048, 1, None, np.int64, "none",
     "mma"),
    ("f16-mma-wm4-rank3", F16, 1, 48, 1, 3, 3, 2100, 128, 2048, 1, (48, 1, "C"), np.int32,
     "concat", "mma"),
    # The wgmma path (sm_90a; elsewhere the planner takes mma and these still check that).
    ("bf16-wg-k2048", BF16, 2, 64, 1, 2, 5, 2600, 128, 2048, 1, None, np.int64, "none", None),
    ("f16-wg-g48-rank3", F16, 1, 48, 1, 3, 3, 2100, 128, 2048, 1, (48, 1, "C"), np.int32,
     "concat", None),
    ("bf16-wg-h64-g96-cap", BF16, 2, 96, 1, 1, 1, 3000, 64, 1500, 1, (2, 96, 1, "C"), np.int32,
     "capacity", None),
    # The warp-specialised build (groups above 64 heads on sm_90): int64 indices (one Q
    # slot), a rank-4 bias, GQA with two 128-head groups at H 64 (two Q slots).
    ("bf16-ws-g128-i64-rank4", BF16, 2, 128, 1, 2, 3, 2600, 128, 2048, 1, (2, 128, 2, "C"),
     np.int64, "concat", None),
    ("f16-ws-gqa2-g128-h64", F16, 1, 256, 2, 3, 3, 900, 64, 300, 1, None, np.int32, "none",
     None),
    ("f32-cap-hiN-k1", F32, 3, 6, 2, 2, 1, 50, 16, 1, 6, (3, 6, 2, "C"), np.int64, "capacity",
     None),
    ("bf16-odd-h72-rank3", BF16, 2, 6, 3, 3, 2, 40, 72, 7, 6, (1, 3, "C"), np.int32, "none",
     None),
    ("f16-narrow-h20", F16, 2, 4, 2, 2, 3, 90, 20, 64, 1, None, np.int64, "concat", None),
    ("f32-h256", F32, 1, 4, 2, 2, 2, 70, 256, 64, 1, (1, "C"), np.int32, "none", None),
    ("bf16-simt-forced-g16", BF16, 1, 16, 1, 2, 1, 2500, 128, 2048, 1, None, np.int32, "none",
     "simt"),
    ("f32-decode-splitk", F32, 2, 8, 8, 1, 1, 4000, 64, 2048, 1, ("C",), np.int64, "none", None),
]


@pytest.mark.parametrize("cfg", CASES, ids=[c[0] for c in CASES])
def test_matches_reference(rt, ledger, rng, cfg):
    _, dt, b, n, nkv, sq, cur, past, h, k, hi, bias, idt, mode, path = cfg
    ins = case(rng, dtype=dt, b=b, n=n, nkv=nkv, sq=sq, cur=cur, past=past, h=h, k=k, hi=hi,
               bias=bias, idt=idt, mode=mode)
    nd = make_node(n, nkv, outputs=1 if mode == "none" else 3, scale=0.3 if dt == F32 else None)
    want = reference.index_share(nd, ins, present=mode)
    arrs, views = upload(rt, ins)
    outs = [DeviceArray(rt, s, DataType.from_numpy(dt)) for s in out_shapes(ins, mode)]
    kern = index_share.IndexShareFactory(rt).create(nd)
    kern.config = dataclasses.replace(kern.config, path=path)
    try:
        got = run(rt, kern, views, outs)
        err = rel_fro(got[0], want[0])
        assert err < TOL[DataType.from_numpy(dt)], (kern.last_plan, err)
        for g, w in zip(got[1:], want[1:]):
            assert np.array_equal(g.view(np.uint8), w.view(np.uint8)), "present K/V must be exact"
        again = run(rt, kern, views, outs)
        assert np.array_equal(again[0].view(np.uint8), got[0].view(np.uint8)), "not deterministic"
    finally:
        kern.close()
        free(arrs, outs)


def test_paths_agree_and_are_deterministic(rt, ledger, rng):
    """The tensor-core and CUDA-core paths both match; each is bitwise stable run to run."""
    ins = case(rng, dtype=BF16, b=3, n=32, nkv=2, sq=1, cur=1, past=3000, h=128, k=2048, hi=1,
               bias=(3, 1, 1, "C"), idt=np.int32, mode="none")
    nd = make_node(32, 2)
    want = reference.index_share(nd, ins)[0]
    arrs, views = upload(rt, ins)
    y = DeviceArray(rt, ins[0].shape, DataType.BFLOAT16)
    kern = index_share.IndexShareFactory(rt).create(nd)
    try:
        for path in ("mma", "simt"):
            kern.config = dataclasses.replace(kern.config, path=path)
            a = run(rt, kern, views, [y])[0]
            assert kern.last_plan.path == path
            assert rel_fro(a, want) < TOL[DataType.BFLOAT16]
            for _ in range(3):
                assert np.array_equal(run(rt, kern, views, [y])[0].view(np.uint16), a.view(np.uint16))
    finally:
        kern.close()
        free(arrs, [y])


def test_eager_rejects_bad_rows_before_launch(rt, ledger, rng):
    ins = case(rng, dtype=F32, b=2, n=4, nkv=2, sq=3, cur=2, past=20, h=32, k=6, hi=1, bias=None,
               idt=np.int64, mode="concat")
    ins[5][1, 0, 2, :3] = [4, 4, 9]
    nd = make_node(4, 2, outputs=3)
    arrs, views = upload(rt, ins)
    outs = [DeviceArray(rt, s, DataType.FLOAT) for s in out_shapes(ins, "concat")]
    kern = index_share.IndexShareFactory(rt).create(nd)
    try:
        before = rt.launch_count
        with pytest.raises(SelectedIndicesError, match=r"batch=1, head=0, query=2, column=1\]: duplicate"):
            kern.execute(views, [o.mut() for o in outs])
        assert rt.launch_count == before
        with pytest.raises(SelectedIndicesError) as ref_err:
            reference.index_share(nd, ins, present="concat")
        assert ref_err.value.violation == kern_violation(kern, views, outs)
    finally:
        kern.close()
        free(arrs, outs)


def kern_violation(kern, views, outs):
    try:
        kern.execute(views, [o.mut() for o in outs])
    except SelectedIndicesError as exc:
        return exc.violation
    return None


@pytest.mark.parametrize("n,knobs", [(16, None), (64, None), (128, {"ws": 1, "ctas": 2}),
                                     (128, {"ws": 1, "splits": 2, "merge": "cluster"}),
                                     (128, {"ws": 1, "splits": 8, "merge": "cluster"}),
                                     (128, {"ws": 1, "splits": 4, "merge": "cluster"})],
                         ids=["mma", "wg", "ws", "ws-cluster", "ws-cluster8", "ws-cluster4"])
@pytest.mark.parametrize("mode", ["none", "capacity"])
def test_capture_replay_and_poisoned_indices(rt, ledger, rng, mode, n, knobs):
    # ws-cluster: two splits of 128 columns (the cluster merge needs two); ws-cluster8: eight.
    b, nkv, h, k = 2, 2, 64, 128 * knobs["splits"] if knobs and "splits" in knobs else 64
    past = max(500, 2 * k)
    ins = case(rng, dtype=BF16, b=b, n=n, nkv=nkv, sq=1, cur=1, past=past, h=h, k=k, hi=1,
               bias=(b, 1, 1, "C") if mode == "capacity" else None, idt=np.int32, mode=mode)
    nd = make_node(n, nkv, outputs=1 if mode == "none" else 3)
    arrs, views = upload(rt, ins)
    y = DeviceArray(rt, ins[0].shape, DataType.BFLOAT16)
    outs = [y] if mode == "none" else [y, arrs[3], arrs[4]]  # capacity: present aliases past
    kern = index_share.IndexShareFactory(rt).create(nd)
    if knobs and _wg_device(rt):
        kern.config = IndexShareConfig(path=kern.config.path, **(knobs or {}))
    graph = None
    try:
        assert not kern.capture_support()
        kern.execute(views, [o.mut() for o in outs])  # warm-up
        assert kern.capture_support()
        if mode == "capacity":
            arrs[3].copy_from(ins[3])
            arrs[4].copy_from(ins[4])
        rt.synchronize()
        with rt.capture() as graph:
            kern.execute(views, [o.mut() for o in outs])
        bounds = past + 1 if mode == "none" else None
        if mode == "capacity":
            fr = np.isfinite(ins[6].astype(np.float32))
            bounds = np.array([int(np.nonzero(fr[i].any(axis=(0, 1)))[0].max()) + 1 for i in range(b)])
        new_idx = rows(rng, (b, 1, 1), bounds, k).astype(np.int32)
        arrs[5].copy_from(new_idx)
        y.fill_bytes(0xFF)
        graph.replay()
        rt.latch.check()  # valid rows: nothing latched
        replayed = y.numpy()
        if mode == "capacity":
            arrs[3].copy_from(ins[3])
            arrs[4].copy_from(ins[4])
        y.fill_bytes(0xFF)  # (the capacity present is past itself: not poisoned)
        kern.execute(views, [o.mut() for o in outs])
        eager = y.numpy()
        assert np.array_equal(replayed.view(np.uint16), eager.view(np.uint16))
        want = reference.index_share(nd, ins[:5] + [new_idx, ins[6]], present=mode)[0]
        assert rel_fro(replayed, want) < TOL[DataType.BFLOAT16]
        for poison in ([2**31 - 1, 5], [-7, 3], [9, 9], [-1, 3]):
            bad = new_idx.copy()
            bad[1, 0, 0, :2] = poison
            arrs[5].copy_from(bad)
            graph.replay()
            with pytest.raises(CaptureError, match="IndexShare") as err:
                rt.latch.check()
            assert err.value.bits == INDEX_SHARE_SELECTED_INDICES
        rt.synchronize()  # no fault: the stream is healthy
        rt.latch.check()
    finally:
        del graph
        kern.close()
        free(arrs, [y])


def test_capture_before_warmup_is_refused(rt, ledger, rng):
    ins = case(rng, dtype=F16, b=1, n=4, nkv=2, sq=1, cur=1, past=30, h=64, k=8, hi=1,
               bias=None, idt=np.int32, mode="none")
    arrs, views = upload(rt, ins)
    y = DeviceArray(rt, ins[0].shape, DataType.FLOAT16)
    kern = index_share.IndexShareFactory(rt).create(make_node(4, 2))
    try:
        with pytest.raises(CaptureError, match="warm-up"):
            with rt.capture():
                kern.execute(views, [y.mut()])
        kern.execute(views, [y.mut()])  # the runtime stays usable
        rt.synchronize()
    finally:
        kern.close()
        free(arrs, [y])


def test_torch_tensors_and_workspace(rt, ledger, rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    ins = case(rng, dtype=F32, b=1, n=8, nkv=8, sq=1, cur=1, past=3000, h=64, k=1500, hi=1,
               bias=None, idt=np.int64, mode="none")
    nd = make_node(8, 8)
    ts = [None if a is None else torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in ins]
    y = torch.full(ins[0].shape, float("nan"), device="cuda")
    torch.cuda.synchronize()
    views = [TensorView.from_array(t) if t is not None else TensorView.absent_slot() for t in ts]
    kern = index_share.IndexShareFactory(rt).create(nd)
    req = kern.workspace_requirement([v.meta if not v.absent else v for v in views])
    ws = rt.alloc_raw(max(req.nbytes, 1))
    try:
        kern.execute(views, [attnrt.TensorMut.from_array(y)], attnrt.WorkspaceView(ws, req.nbytes))
        rt.synchronize()
        assert rel_fro(y.cpu().numpy(), reference.index_share(nd, ins)[0]) < TOL[DataType.FLOAT]
    finally:
        rt.free_raw(ws)
        kern.close()


def _plans_agree(rt, kern, views, y, want, plans, path, layout, tol, repeats=0):
    """Run ``kern`` with each plan override: every result matches ``want``; plans with the
    same layout knobs and split count give the same bits (whatever the depth, merge or
    loop); each result repeats bit for bit ``repeats`` more times."""
    got = {}
    for knobs in plans:
        kern.config = IndexShareConfig(path=kern.config.path, **(knobs or {}))
        a = run(rt, kern, views, [y])[0]
        plan = kern.last_plan
        assert plan.path == path, (knobs, plan)
        err = rel_fro(a, want)
        assert err < tol, (knobs, plan, err)
        key = tuple(plan.knobs[k] for k in layout) + (plan.splits,)
        if key in got:
            assert np.array_equal(got[key].view(np.uint16), a.view(np.uint16)), (knobs, plan)
        got[key] = a
        for _ in range(repeats):
            assert np.array_equal(run(rt, kern, views, [y])[0].view(np.uint16),
                                  a.view(np.uint16)), ("not deterministic", knobs, plan)


@pytest.mark.parametrize("shape", ["decode", "prefill"])
def test_mma_plans_agree(rt, ledger, rng, shape):
    """Every tensor-core layout, ring depth, split merge and per-tile pipeline matches the
    reference; the in-kernel split merge and is_combine, and pipes 1 and 2, give the same
    bits; repeated runs are bitwise equal (the last-CTA merge must not depend on which CTA
    finishes last)."""
    if shape == "decode":  # few tasks: the planner splits the 2048 keys over many CTAs
        b, sq, past, k = 3, 1, 5000, 2048
    else:  # many (query) tasks, a padded row
        b, sq, past, k = 1, 37, 700, 300
    ins = case(rng, dtype=BF16, b=b, n=128, nkv=1, sq=sq, cur=sq, past=past, h=128, k=k, hi=1,
               bias=(1, 128, sq, "C") if shape == "prefill" else None, idt=np.int32,
               mode="none")
    nd = make_node(128, 1)
    want = reference.index_share(nd, ins)[0]
    arrs, views = upload(rt, ins)
    y = DeviceArray(rt, ins[0].shape, DataType.BFLOAT16)
    kern = index_share.IndexShareFactory(rt).create(nd)
    kern.config = dataclasses.replace(kern.config, path="mma")
    plans = [None, {"merge": "kernel"}, {"wm": 4, "wn": 2}, {"wm": 4, "wn": 1, "stages": 2},
             {"stages": 3, "splits": 3}, {"stages": 3, "splits": 3, "merge": "kernel"},
             {"splits": 1},
             # The first per-tile pipeline: the same bits as the default (IS_PIPE 2) plans.
             {"pipe": 1}, {"pipe": 1, "wm": 4, "wn": 2}, {"pipe": 1, "stages": 3, "splits": 3}]
    try:
        _plans_agree(rt, kern, views, y, want, plans, "mma", ("wm", "wn"), TOL[DataType.BFLOAT16])
        kern.config = IndexShareConfig(path=kern.config.path)
        first = run(rt, kern, views, [y])[0]
        assert shape == "prefill" or kern.last_plan.splits > 1
        for _ in range(4):
            assert np.array_equal(run(rt, kern, views, [y])[0].view(np.uint16), first.view(np.uint16))
    finally:
        kern.close()
        free(arrs, [y])


def _wg_device(rt) -> bool:
    return rt.capabilities.arch == "sm_90"


@pytest.mark.parametrize("shape", ["decode-g64", "decode-g128-bias", "prefill-g96-f16-h64",
                                   "prefill-many-g128", "prefill-many-g64"])
def test_wg_plans_agree(rt, ledger, rng, shape):
    """The wgmma path (sm_90a): every layout (heads split across warpgroups, keys split
    across warpgroups, one warpgroup), ring depth, split count, split merge, loop (plain or
    overlapped) and register cap (minb) matches the reference; plans with the same layout
    and splits give the same bits whatever the depth, merge, loop or cap; repeated runs are
    bitwise equal; it is the default where it applies (above 64 heads per index row the
    warp-specialised build, with two Q slots when there is one split)."""
    if not _wg_device(rt):
        pytest.skip("the wgmma path needs an sm_90 device")
    dt, h, bias = BF16, 128, None
    if shape == "decode-g64":
        b, n, sq, past, k = 3, 64, 1, 5000, 2048
    elif shape == "decode-g128-bias":
        b, n, sq, past, k = 2, 128, 1, 3000, 1999
        bias = (2, 128, 1, "C")
    elif shape == "prefill-g96-f16-h64":  # two head blocks of 64 (one partial with mrows 128)
        b, n, sq, past, k, dt, h = 1, 96, 37, 700, 300, F16, 64
        bias = (96, 1, "C")
    elif shape == "prefill-many-g128":  # enough rows (>= 4 per SM): the prefill default
        b, n, sq, past, k = 1, 128, 601, 900, 257
    else:  # 64 heads in many rows: ws too (one consumer warpgroup idle)
        b, n, sq, past, k = 1, 64, 601, 900, 257
    ins = case(rng, dtype=dt, b=b, n=n, nkv=1, sq=sq, cur=sq, past=past, h=h, k=k, hi=1,
               bias=bias, idt=np.int32, mode="none")
    nd = make_node(n, 1)
    want = reference.index_share(nd, ins)[0]
    arrs, views = upload(rt, ins)
    y = DeviceArray(rt, ins[0].shape, DataType.from_numpy(dt))
    kern = index_share.IndexShareFactory(rt).create(nd)
    plans = [None, {"merge": "kernel"}, {"stages": 2}, {"splits": 1}, {"splits": 3},
             {"splits": 3, "merge": "kernel", "stages": 3},
             {"wgs": 1, "mrows": 64}, {"wgs": 1, "mrows": 64, "splits": 4},
             {"wgs": 2, "mrows": 64}, {"wgs": 2, "mrows": 64, "splits": 2},
             {"wgs": 2, "mrows": 128}, {"wgs": 2, "mrows": 128, "splits": 5},
             # The overlapped loop (IS_OVERLAP): the same arithmetic, so the same bits.
             {"overlap": 1}, {"overlap": 1, "wgs": 1, "mrows": 64, "stages": 3},
             {"overlap": 1, "wgs": 2, "mrows": 64, "splits": 2},
             {"overlap": 1, "wgs": 2, "mrows": 128, "splits": 5, "merge": "kernel"},
             # Q in registers (one warpgroup): S from the register A operand.
             {"wgs": 1, "mrows": 64, "qreg": 1},
             {"wgs": 1, "mrows": 64, "qreg": 1, "overlap": 1, "stages": 3, "splits": 4},
             # Registers capped at 168 (three CTAs per SM): same arithmetic, same bits.
             {"wgs": 1, "mrows": 64, "qreg": 1, "stages": 2, "minb": 3},
             {"wgs": 1, "mrows": 64, "qreg": 1, "stages": 2, "minb": 3, "splits": 4},
             # The warp-specialised persistent build (128-key tiles: its own bits, the same
             # for any grid or merge): capped grids make every CTA loop over many items.
             {"ws": 1}, {"ws": 1, "ctas": 3}, {"ws": 1, "splits": 3},
             {"ws": 1, "splits": 3, "ctas": 5}, {"ws": 1, "splits": 3, "merge": "kernel"},
             # One or two Q slots: the same arithmetic, the same bits.
             {"ws": 1, "splits": 1, "q2": 0}, {"ws": 1, "splits": 1, "q2": 1, "ctas": 3},
             # Two splits: decode rows (one item per CTA) merge in a two-CTA cluster by
             # default, with the bits of the last-arrival merge.
             {"ws": 1, "splits": 2, "kt": 128}, {"ws": 1, "splits": 2, "merge": "last"},
             # 64-key tiles (their own bits, the same for any grid or merge; the default of
             # cluster items of more than 64 heads at head size 128).
             {"ws": 1, "kt": 64}, {"ws": 1, "kt": 64, "ctas": 3},
             {"ws": 1, "kt": 64, "splits": 3, "merge": "kernel"},
             {"ws": 1, "kt": 64, "splits": 2}, {"ws": 1, "kt": 64, "splits": 2, "merge": "last"},
             # Eight splits (the decode default up to half the SMs): eight-CTA clusters
             # merging through distributed shared memory, is_combine (launched programmatically at
             # these grids) and the last-arrival merge, the same bits.
             {"ws": 1, "splits": 8}, {"ws": 1, "splits": 8, "merge": "kernel"},
             {"ws": 1, "splits": 8, "merge": "last"},
             # Four splits: four-CTA clusters (their default) and is_combine, the same bits.
             {"ws": 1, "splits": 4}, {"ws": 1, "splits": 4, "merge": "kernel"}]
    try:
        kern.config = IndexShareConfig(path=kern.config.path)
        run(rt, kern, views, [y])
        assert kern.last_plan.path == "wg", kern.last_plan
        kn = kern.last_plan.knobs
        if shape.startswith("decode"):  # 2-3 rows: ws, eight splits in eight-CTA clusters
            p = kern.last_plan
            assert (kn["ws"], p.splits, p.merge) == (1, 8, "cluster"), p
            assert p.variant.defines["IS_CMERGE"] == 8, p
        else:  # more than 64 heads share a row: the warp-specialised build
            assert kn["ws"] == 1 and kn["q2"] == (kern.last_plan.splits == 1), kn
        _plans_agree(rt, kern, views, y, want, plans, "wg", ("wgs", "mrows", "qreg", "kt"),
                     TOL[DataType.from_numpy(dt)], repeats=2)
        kern.config = IndexShareConfig(path=kern.config.path, ws=1, splits=2)  # cluster: one item per CTA
        run(rt, kern, views, [y])
        p = kern.last_plan
        assert p.merge == ("cluster" if 2 * p.tasks <= rt.capabilities.sm_count else "last"), p
    finally:
        kern.close()
        free(arrs, [y])


@pytest.mark.parametrize("n,k", [(64, 3001), (128, 2048)], ids=["g64-k3001", "g128-k2048"])
def test_decode_past_one_wave_of_clusters(rt, ledger, rng, n, k):
    """Decode rows past one wave of two-CTA clusters (70 rows, more than half the SMs) take
    the persistent warp-specialised build with ``_ws_persistent_splits``'s count (one split
    at top-k 2048; at 3001, three, merged by the last CTA to arrive), also at 64 heads
    (NOTES, IndexShare round 21): it matches the reference, repeats bit for bit, and (at
    3001) gives the same bits with is_combine and on a grid of 31 CTAs (several items per
    CTA); a grid of 9 (which takes another split count there) and the barrier-coupled build
    are checked against the reference only."""
    if not _wg_device(rt):
        pytest.skip("the wgmma path needs an sm_90 device")
    b, past = 70, 3100
    sm = rt.capabilities.sm_count
    ins = case(rng, dtype=BF16, b=b, n=n, nkv=1, sq=1, cur=1, past=past, h=128, k=k, hi=1,
               bias=None, idt=np.int32, mode="none")
    nd = make_node(n, 1)
    want = reference.index_share(nd, ins)[0]
    arrs, views = upload(rt, ins)
    y = DeviceArray(rt, ins[0].shape, DataType.BFLOAT16)
    kern = index_share.IndexShareFactory(rt).create(nd)
    try:
        run(rt, kern, views, [y])
        p = kern.last_plan
        if 2 * b > sm:  # (the H200's 132 SMs: always)
            splits = splitk._ws_persistent_splits(b, k, sm)
            assert (p.entry, p.splits, p.grid) == ("is_attn_ws", splits, min(sm, b * splits)), p
            assert p.merge == ("none" if splits == 1 else "last") and (splits > 1) == (k > 2048)
        plans = [None, {"ws": 1, "ctas": 9}, {"ws": 1, "splits": p.splits, "merge": "kernel"},
                 {"ws": 1, "splits": p.splits, "merge": "last", "ctas": 31}, {"ws": 0}]
        _plans_agree(rt, kern, views, y, want, plans, "wg", ("ws", "wgs", "mrows", "kt"),
                     TOL[DataType.BFLOAT16], repeats=1)
    finally:
        kern.close()
        free(arrs, [y])


def test_pinned_splits_are_batch_invariant(rt, ledger, rng):
    """The default plan depends on the batch size (and with it the bits); the
    warp-specialised build with a pinned split count does not: its rows' bits depend only on
    the split count and the tile, not on the batch, the grid or the merge (README,
    Guarantees). 70 rows (past one wave: the last-arrival merge over persistent items;
    random padded rows) against their first 3 alone (two-CTA clusters) and on a grid of 2
    CTAs."""
    if not _wg_device(rt):
        pytest.skip("the wgmma path needs an sm_90 device")
    big = case(rng, dtype=BF16, b=70, n=128, nkv=1, sq=1, cur=1, past=2100, h=128, k=2048,
               hi=1, bias=None, idt=np.int32, mode="none")
    small = [None if a is None else np.ascontiguousarray(a[:3]) for a in big]
    nd = make_node(128, 1)
    want = reference.index_share(nd, small)[0]
    got, plans = [], []
    for ins, knobs in ((big, {"ws": 1, "splits": 2}), (small, {"ws": 1, "splits": 2}),
                       (small, {"ws": 1, "splits": 2, "ctas": 2})):
        arrs, views = upload(rt, ins)
        y = DeviceArray(rt, ins[0].shape, DataType.BFLOAT16)
        kern = index_share.IndexShareFactory(rt).create(nd)
        try:
            # (as the README's recipe: path "wg", never another path quietly)
            kern.config = IndexShareConfig(path="wg", **knobs)
            got.append(run(rt, kern, views, [y])[0][:3])
            plans.append(kern.last_plan)
        finally:
            kern.close()
            free(arrs, [y])
    assert [p.splits for p in plans] == [2, 2, 2] and plans[1].merge == "cluster", plans
    assert plans[0].merge == "last" and plans[2].merge == "last" and plans[2].grid == 2, plans
    assert rel_fro(got[1], want) < TOL[DataType.BFLOAT16]
    for g in (got[0], got[2]):
        assert np.array_equal(g.view(np.uint16), got[1].view(np.uint16))


@pytest.mark.parametrize("size", [(4, 3000, 2048), (2, 700, 320)], ids=["k2048", "k320"])
@pytest.mark.parametrize("knobs", [{"ws": 1, "splits": 2}, {"ws": 1, "splits": 2, "merge": "last"},
                                   {"ws": 1, "splits": 4, "merge": "kernel"},
                                   {"ws": 1, "splits": 8, "merge": "cluster"},
                                   {"ws": 1, "splits": 4, "merge": "cluster"}],
                         ids=["ws-cluster", "ws-last", "ws-combine", "ws-cluster8", "ws-cluster4"])
def test_chained_calls_in_one_graph(rt, ledger, rng, knobs, size):
    """Three warp-specialised calls captured in one graph, each reading the previous one's
    output as its query and the last overwriting the first one's query (the ws build is
    launched with programmatic dependent launch, and so is is_combine after it at small
    grids (``ws-combine``): a read-after-write and a write-after-read across its graph
    edges; ``ws-cluster8``/``4``: clusters merging through distributed shared memory / from
    their partials in L2). The replay
    equals the eager sequence bitwise,
    and the first call matches the reference. ``k320`` (160 keys per split: one whole tile
    and one padded one per CTA) is the size racecheck can finish (tools/sanitize.sh)."""
    if not _wg_device(rt):
        pytest.skip("the warp-specialised build needs an sm_90 device")
    (b, past, k), n = size, 128
    if knobs["splits"] in (4, 8) and knobs.get("merge") == "cluster" and k < knobs["splits"] * 128:
        pytest.skip("four- or eight-CTA clusters need a 128-key tile per split")
    ins = case(rng, dtype=BF16, b=b, n=n, nkv=1, sq=1, cur=1, past=past, h=128, k=k, hi=1,
               bias=None, idt=np.int32, mode="none")
    nd = make_node(n, 1)
    arrs, views = upload(rt, ins)
    ya, yb = (DeviceArray(rt, ins[0].shape, DataType.BFLOAT16) for _ in range(2))
    kern = index_share.IndexShareFactory(rt).create(nd)
    kern.config = IndexShareConfig(path=kern.config.path, **(knobs or {}))
    graph = None

    def chain():
        kern.execute(views, [ya.mut()])                                  # ya = f(q)
        kern.execute([ya.view()] + views[1:], [yb.mut()])                # yb = f(ya)
        kern.execute([yb.view()] + views[1:], [arrs[0].mut()])           # q = f(yb)

    try:
        chain()  # warm-up (and the plan)
        assert kern.last_plan.entry == "is_attn_ws"
        assert kern.last_plan.merge == knobs.get("merge", "cluster")
        arrs[0].copy_from(ins[0])
        for o in (ya, yb):
            o.fill_bytes(0xFF)
        chain()
        eager = [ya.numpy(), yb.numpy(), arrs[0].numpy()]
        want = reference.index_share(nd, ins)[0]
        assert rel_fro(eager[0], want) < TOL[DataType.BFLOAT16]
        rt.synchronize()
        with rt.capture() as graph:
            chain()
        for _ in range(2):
            arrs[0].copy_from(ins[0])
            for o in (ya, yb):
                o.fill_bytes(0xFF)
            graph.replay()
            got = [ya.numpy(), yb.numpy(), arrs[0].numpy()]
            for e, g in zip(eager, got):
                assert np.array_equal(e.view(np.uint16), g.view(np.uint16))
        rt.latch.check()
    finally:
        del graph
        kern.close()
        free(arrs, [ya, yb])
