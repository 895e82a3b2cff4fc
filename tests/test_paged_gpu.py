"""PagedAttention (LATENT / MLA) on the GPU against the float64 reference.

Decode and prefill with mixed past lengths and shuffled physical blocks, RoPE on/off
(half-split and interleaved, rotary_offset != 0), softcap, windows, f16/bf16, head 576/512
(tensor-core path, both tiles, split-KV + combine) and 80/64 (simple path); the cache after
the op; slot -1; capture + replay; out-of-range ids latch instead of faulting.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnrt.ops import reference
from attnrt.ops.paged_attention import (
    PAGED_POSITION_OUT_OF_RANGE,
    PagedAttentionConfig,
    PagedAttentionFactory,
)
from attnrt.runtime.api import DataType, TensorMut, TensorView, WorkspaceView
from attnrt.runtime.errors import KernelError
from attnrt.runtime.latch import PAGED_BLOCK_OUT_OF_RANGE, PAGED_SLOT_OUT_OF_RANGE
from attnrt.runtime.tensors import DeviceArray
from tests._util import TOL, rel_fro
from tests.test_paged_cpu import BF16, F16, make_case

pytestmark = pytest.mark.gpu


class Bound:
    """A case's inputs on the device, a poisoned output, and the kernel."""

    def __init__(self, rt, c, *, path="auto", num_splits=None, meta=None, cache_out=False,
                 workspace=True, programmatic=True, balanced=False, wg_schedule=None):
        self.rt, self.c, self.meta = rt, c, meta
        sched = {} if wg_schedule is None else {"wg_schedule": wg_schedule}
        cfg = PagedAttentionConfig(path=path, num_splits=num_splits, programmatic=programmatic,
                                   balanced=balanced, **sched)
        self.kernel = PagedAttentionFactory(rt, config=cfg).create(
            c.node, [None if x is None else x.shape for x in c.inputs[:16]])
        self.bufs = {i: DeviceArray.from_numpy(rt, x) for i, x in enumerate(c.inputs[:16])
                     if x is not None}
        self.out = DeviceArray(rt, (c.T, c.H * c.vhs), c.dtype)
        self.cache_out = cache_out
        req = self.kernel.workspace_requirement(self.views())
        self.ws = DeviceArray(rt, (req.nbytes,), np.uint8) if req.nbytes and workspace else None

    def views(self) -> list:
        return [self.bufs[i].view() if i in self.bufs else TensorView.absent_slot()
                for i in range(16)] + [self.meta]

    def load(self, c) -> None:
        """New contents, same shapes (capture + replay)."""
        self.c = c
        for i, buf in self.bufs.items():
            buf.copy_from(c.inputs[i])

    def execute(self) -> None:
        self.out.fill_bytes(0xFF)
        outs = [self.out.mut()] + ([self.bufs[3].mut()] if self.cache_out else [])
        ws = WorkspaceView(self.ws.ptr, self.ws.nbytes) if self.ws is not None else None
        self.kernel.execute(self.views(), outs, ws)

    def results(self):
        self.rt.synchronize()
        return self.out.numpy().copy(), self.bufs[3].numpy().copy()

    def free(self) -> None:
        for b in [*self.bufs.values(), self.out] + ([self.ws] if self.ws is not None else []):
            b.free()


def run(rt, c, **kw):
    bound = Bound(rt, c, **kw)
    try:
        bound.execute()
        out, cache = bound.results()
        return out, cache, bound.kernel.last_plan
    finally:
        bound.free()


def check(c, out, cache, strict=True):
    ref_out, ref_cache = reference.paged_attention(c.node, c.inputs, strict=strict)
    err = rel_fro(out, ref_out)
    assert err < TOL[c.dtype], f"output rel_fro {err:.2e} >= {TOL[c.dtype]}"
    flat, rflat = cache.reshape(-1, c.hs), ref_cache.reshape(-1, c.hs)
    if c.rope:
        # Rotated channels of written rows: f32 rotation vs f64, one rounding each.
        written = c.inputs[10][(c.inputs[10] >= 0) & (c.inputs[10] < flat.shape[0])]
        rot = np.arange(c.offset, c.offset + c.rd)
        e = rel_fro(flat[np.ix_(written, rot)], rflat[np.ix_(written, rot)])
        assert e < TOL[c.dtype], f"rotated cache rows rel_fro {e:.2e}"
        flat, rflat = flat.copy(), rflat.copy()
        flat[np.ix_(written, rot)] = 0
        rflat[np.ix_(written, rot)] = 0
    # Everything else is bitwise: unrotated channels, untouched rows, slot -1 rows.
    np.testing.assert_array_equal(flat.view(np.uint16), rflat.view(np.uint16))


MLA = dict(H=128, hs=576, vhs=512, bs=64, rd=64, offset=512)
DECODE = {
    "bf16-half-rope": dict(dtype=BF16, rope="half"),
    "f16-interleaved-softcap": dict(dtype=F16, rope="interleaved", offset=500, softcap=30.0),
    "bf16-window-norope": dict(dtype=BF16, window=100, bs=16),
}


def _tensor_core_path(rt, path):
    """The read kernel ``path`` should plan: auto takes the wgmma kernel on compute capability 9.0."""
    if path == "auto":
        return "wg" if tuple(rt.capabilities.compute_capability) == (9, 0) else "mla"
    return path


@pytest.mark.parametrize("path", ["auto", "mla"])
@pytest.mark.parametrize("kw", DECODE.values(), ids=DECODE.keys())
def test_decode_mla(ledger, rng, kw, path):
    c = make_case(rng, **{**MLA, **kw}, q_lens=(1, 1, 1), past_lens=(0, 37, 700))
    out, cache, plan = run(ledger, c, path=path)
    assert plan.path == _tensor_core_path(ledger, path) and plan.block_n == 64
    check(c, out, cache)
    ledger.latch.check()


PREFILL = {
    "bf16-h16-rows-span-tokens": dict(H=16, dtype=BF16, rope="half", bs=16,
                                      q_lens=(37, 5, 1), past_lens=(0, 70, 129)),
    "f16-h128-window": dict(dtype=F16, rope="interleaved", bs=32, window=40,
                            q_lens=(9, 3), past_lens=(60, 0)),
    "bf16-h80-partial-blocks": dict(H=80, dtype=BF16, q_lens=(3, 4), past_lens=(10, 200),
                                    softcap=20.0),
}


@pytest.mark.parametrize("path", ["auto", "mla"])
@pytest.mark.parametrize("kw", PREFILL.values(), ids=PREFILL.keys())
def test_prefill_mla(ledger, rng, kw, path):
    c = make_case(rng, **{**MLA, **kw})
    out, cache, plan = run(ledger, c, path=path)
    assert plan.path == _tensor_core_path(ledger, path)
    check(c, out, cache)
    ledger.latch.check()


def test_mla_32_key_tiles(ledger, rng):
    c = make_case(rng, **{**MLA, "H": 16}, dtype=F16, rope="half", q_lens=(20, 1),
                  past_lens=(45, 300), window=150)
    out, cache, plan = run(ledger, c, path="mla32")
    assert plan.block_n == 32
    check(c, out, cache)
    ledger.latch.check()


def test_split_kv_decode_and_combine(ledger, rng):
    c = make_case(rng, **MLA, dtype=BF16, rope="half", q_lens=(1,), past_lens=(2900,))
    out, cache, plan = run(ledger, c)
    assert plan.path == _tensor_core_path(ledger, "auto") and plan.splits > 1  # split to fill the GPU
    check(c, out, cache)
    # Forced splits on prefill rows (some splits see no key for early tokens).
    p = make_case(rng, **{**MLA, "H": 64}, dtype=F16, q_lens=(30, 2), past_lens=(3, 400))
    out, cache, plan = run(ledger, p, num_splits=5)
    assert plan.splits == 5
    check(p, out, cache)
    # Without a workspace the op runs unsplit (correct, no allocation).
    out, cache, plan = run(ledger, c, workspace=False)
    assert plan.splits == 1
    check(c, out, cache)
    ledger.latch.check()


def test_attention_metadata_input(ledger, rng):
    c = make_case(rng, **MLA, dtype=BF16, q_lens=(1, 1), past_lens=(500, 20))
    meta = np.array([1, 501], dtype=np.int32)
    out, cache, _ = run(ledger, c, meta=meta)
    check(c, out, cache)


SIMPLE = {
    "bf16-interleaved-window": dict(dtype=BF16, rope="interleaved", offset=16, rd=32, window=9),
    "f16-half-softcap": dict(dtype=F16, rope="half", offset=0, rd=80, softcap=5.0, bs=32),
}


@pytest.mark.parametrize("kw", SIMPLE.values(), ids=SIMPLE.keys())
def test_simple_odd_head(ledger, rng, kw):
    c = make_case(rng, H=5, hs=80, vhs=64, q_lens=(7, 1, 3), past_lens=(0, 45, 18), **kw)
    out, cache, plan = run(ledger, c)
    assert plan.path == "simple"
    check(c, out, cache)
    ledger.latch.check()


def test_simple_path_on_mla_shapes(ledger, rng):
    c = make_case(rng, **{**MLA, "H": 8}, dtype=BF16, rope="half", q_lens=(2, 1),
                  past_lens=(33, 90))
    out, cache, plan = run(ledger, c, path="simple")
    assert plan.path == "simple"
    check(c, out, cache)


def test_slot_minus_one_leaves_the_cache(ledger, rng):
    c = make_case(rng, **MLA, dtype=BF16, q_lens=(3, 1), past_lens=(10, 64), skip=(1, 3))
    out, cache, _ = run(ledger, c, cache_out=True)
    check(c, out, cache)
    flat, old = cache.reshape(-1, c.hs), c.inputs[3].reshape(-1, c.hs)
    for t in (1, 3):
        b, p = c.seq[t], c.pos[t]
        s = c.inputs[7][b, p // c.bs] * c.bs + p % c.bs
        np.testing.assert_array_equal(flat[s].view(np.uint16), old[s].view(np.uint16))


def test_capture_replay_with_new_contents(ledger, rng):
    kw = dict(**MLA, dtype=BF16, rope="half", q_lens=(1,), past_lens=(1500,))
    c = make_case(rng, **kw)
    bound = Bound(ledger, c)
    try:
        assert not bound.kernel.capture_support().supported
        with pytest.raises(KernelError, match="warm"):
            with ledger.capture():
                bound.execute()
        bound.execute()  # warm the exact signature
        bound.results()
        assert bound.kernel.capture_support().supported
        assert bound.kernel.last_plan.splits > 1  # the graph holds fwd + combine
        with ledger.capture() as g:
            bound.execute()
        for seed in (1, 2):
            c2 = make_case(np.random.default_rng(seed), **kw)
            c2.inputs[6] = c.inputs[6]  # same lengths, new contents
            c2.inputs[7], c2.inputs[10] = c.inputs[7], c.inputs[10]
            bound.load(c2)
            bound.out.fill_bytes(0xFF)
            g.replay()
            out, cache = bound.results()
            check(c2, out, cache)
        g.destroy()
        ledger.latch.check()
    finally:
        bound.free()


@pytest.mark.parametrize("path", ["auto", "simple"])
def test_out_of_range_ids_latch(ledger, rng, path):
    c = make_case(rng, **{**MLA, "H": 16}, dtype=BF16, q_lens=(2, 1), past_lens=(100, 70))
    c.inputs[7] = c.inputs[7].copy()
    c.inputs[7][0, 0] = c.nb + 5      # a block past the cache
    c.inputs[7][1, 1] = -7            # a negative block id
    c.inputs[10] = c.inputs[10].copy()
    c.inputs[10][2] = c.nb * c.bs     # a slot past the cache
    out, cache, _ = run(ledger, c, path=path)
    word = ledger.latch.read(clear=True)
    assert word & PAGED_BLOCK_OUT_OF_RANGE and word & PAGED_SLOT_OUT_OF_RANGE, hex(word)
    check(c, out, cache, strict=False)  # the bad keys and the bad write were skipped


def test_position_outside_rotary_table_latches(ledger, rng):
    c = make_case(rng, **{**MLA, "H": 16}, dtype=F16, rope="half", q_lens=(2,), past_lens=(5,))
    c.inputs[8], c.inputs[9] = c.inputs[8][:6], c.inputs[9][:6]  # positions 5, 6: 6 is outside
    out, cache, _ = run(ledger, c)
    assert ledger.latch.read(clear=True) & PAGED_POSITION_OUT_OF_RANGE
    check(c, out, cache, strict=False)
    assert np.all(out[1].astype(np.float64) == 0.0)


def test_unaligned_pointer_falls_back(ledger, rng):
    c = make_case(rng, **{**MLA, "H": 8}, dtype=BF16, q_lens=(1,), past_lens=(30,))
    bound = Bound(ledger, c)
    n = c.T * c.H * c.vhs
    extra = DeviceArray(ledger, (n + 8,), c.dtype)
    try:
        extra.fill_bytes(0xFF)
        out_view = TensorMut(extra.ptr + 2, c.dtype, (c.T, c.H * c.vhs))  # 2-byte aligned only
        bound.kernel.execute(bound.views(), [out_view], None)
        assert bound.kernel.last_plan.path == "simple"
        _, cache = bound.results()
        check(c, extra.numpy()[1:1 + n].reshape(c.T, c.H * c.vhs), cache)
    finally:
        extra.free()
        bound.free()


def test_dtype_mismatch_is_refused_before_launch(ledger, rng):
    c = make_case(rng, **{**MLA, "H": 8}, dtype=BF16, q_lens=(1,), past_lens=(3,))
    bound = Bound(ledger, c)
    try:
        before = ledger.launch_count
        bad = DeviceArray(ledger, (c.T, c.H * c.vhs), DataType.FLOAT16)
        with pytest.raises(KernelError, match="output 0"):
            bound.kernel.execute(bound.views(), [bad.mut()], None)
        assert ledger.launch_count == before
        bad.free()
    finally:
        bound.free()


# --------------------------------------------------------------------------- wgmma (path="wg")
# The opt-in sm_90a path runs in a child process with its own CUDA context: until it has been
# measured on the H200, a device fault there must not poison the session's runtime (and with
# it every GPU test after this file).
WG_CASES = {
    "decode-bf16-half-rope": dict(dtype=BF16, rope="half", q_lens=(1, 1, 1),
                                  past_lens=(0, 37, 700)),
    "prefill-f16-interleaved-softcap-window": dict(dtype=F16, rope="interleaved", offset=500,
                                                   softcap=30.0, bs=32, window=40,
                                                   q_lens=(9, 3), past_lens=(60, 0)),
    "prefill-bf16-h16-rows-span-tokens": dict(H=16, dtype=BF16, rope="half", bs=16,
                                              q_lens=(37, 5, 1), past_lens=(0, 70, 129)),
    "decode-bf16-split": dict(dtype=BF16, rope="half", q_lens=(1,), past_lens=(2900,)),
    # Lengths 1, 63, 64, 65, 128, 129 (tile and block boundaries) in one batch.
    "decode-bf16-h16-boundary-lengths": dict(H=16, dtype=BF16, rope="half", bs=64,
                                             q_lens=(1,) * 6, past_lens=(0, 62, 63, 64, 127, 128)),
    # Ragged: one sequence 100x longer than the rest.
    "decode-bf16-h32-ragged-100x": dict(H=32, dtype=BF16, rope="half", bs=64, q_lens=(1,) * 4,
                                        past_lens=(40, 4099, 37, 41)),
    "spec-f16-h64-q3-window": dict(H=64, dtype=F16, rope="half", bs=64, window=70,
                                   q_lens=(3, 3), past_lens=(190, 1)),
    # Softcap on 64-key pages (the pair kernel's softcap build), with a window.
    "spec-f16-h32-softcap-window-bs64": dict(H=32, dtype=F16, rope="interleaved", offset=7,
                                             softcap=25.0, bs=64, window=300, q_lens=(2, 1),
                                             past_lens=(700, 90)),
    # Pages of 128 keys: two 64-key tiles per page.
    "decode-bf16-h64-bs128": dict(H=64, dtype=BF16, rope="half", bs=128, q_lens=(1, 1, 1),
                                  past_lens=(300, 5, 1000)),
    # Balanced split-KV: unequal lengths, some sequences split, some not, one with no token.
    "spec-bf16-h16-q2-ragged": dict(H=16, dtype=BF16, rope="half", bs=64,
                                    q_lens=(2, 2, 0, 2, 2, 2), past_lens=(10, 900, 5, 2500, 64, 300)),
}


def _wg_child(schedule: str = "serial") -> None:
    """Child-process body of test_wgmma_path: every case on a fresh runtime, with the wgmma
    kernel of ``schedule``; raises on failure."""
    import zlib

    import attnrt

    rt = attnrt.CudaRuntime(0)
    before = rt.memory_stats().live_bytes
    failures = []

    def case(name, fn):
        try:
            fn(np.random.default_rng(zlib.crc32(name.encode())))
            print(f"wg-{schedule} {name}: ok", flush=True)
        except Exception as exc:  # keep going: report every failing case
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            print(f"wg-{schedule} {name}: FAILED {exc}", flush=True)

    def run_wg(c, **kw):
        bound = Bound(rt, c, path="wg", wg_schedule=schedule, **kw)
        try:
            bound.execute()
            out, cache = bound.results()
            # The pair schedule runs where the block size allows it (else the serial kernel).
            files = {key[0] for key in bound.kernel._fns}
            want = "paged_mla_pair.cu" if schedule == "pair" and c.bs % 64 == 0 \
                else "paged_mla_wg.cu"
            assert want in files, (want, files)
            if want == "paged_mla_pair.cu":  # the softcap build exactly when there is one
                cap = float(c.node.attributes.get("softcap", 0.0)) > 0
                opts = {o for key in bound.kernel._fns if key[0] == want for o in key[1]}
                assert f"-DPA_SOFTCAP={int(cap)}" in opts, opts
            return out, cache, bound.kernel.last_plan
        finally:
            bound.free()

    def plain(kw, new):
        def fn(rng):
            c = make_case(rng, **{**MLA, **kw})
            out, cache, plan = run_wg(c, programmatic=new, balanced=new)
            assert plan.path == "wg" and plan.block_n == 64, plan
            # Balanced needs two or more sequences (one has nothing to balance); the pair
            # kernel's contiguous partition also cuts launches the model leaves whole.
            pair = schedule == "pair" and c.bs % 64 == 0
            assert plan.balanced == (new and len(c.inputs[6]) > 1
                                     and (pair or plan.splits > 1)), plan
            assert bool(plan.part_ctas) == (plan.balanced and pair), plan
            check(c, out, cache)
            rt.latch.check()
        return fn

    # PDL with balanced split-KV (opt-in), and plain stream order with equal splits.
    for new in (True, False):
        for name, kw in WG_CASES.items():
            case(f"{name}-{'pdl-balanced' if new else 'plain'}", plain(kw, new))

    def forced_splits(pdl):
        def fn(rng):
            p = make_case(rng, **{**MLA, "H": 64}, dtype=F16, q_lens=(30, 2), past_lens=(3, 400))
            out, cache, plan = run_wg(p, num_splits=5, programmatic=pdl)
            assert plan.splits == 5
            check(p, out, cache)
            rt.latch.check()
        return fn

    def one_split(rng):
        # Many tiles in one CTA: odd and even tile counts, the last tile partial.
        c = make_case(rng, **{**MLA, "H": 32}, dtype=BF16, rope="half",
                      q_lens=(1, 1, 2), past_lens=(1470, 1535, 1000))
        out, cache, plan = run_wg(c, num_splits=1)
        assert plan.splits == 1
        check(c, out, cache)
        rt.latch.check()

    def out_of_range(pdl):
        def fn(rng):
            bad = make_case(rng, **{**MLA, "H": 16}, dtype=BF16, q_lens=(2, 1),
                            past_lens=(100, 70))
            bad.inputs[7] = bad.inputs[7].copy()
            bad.inputs[7][0, 0] = bad.nb + 5
            bad.inputs[7][1, 1] = -7
            out, cache, _ = run_wg(bad, programmatic=pdl)
            assert rt.latch.read(clear=True) & PAGED_BLOCK_OUT_OF_RANGE
            check(bad, out, cache, strict=False)
        return fn

    def few_sms(sms, H, q_lens, past_lens):
        # Balanced split-KV planned for a device of `sms` SMs: each of the pair kernel's CTAs
        # walks several row blocks of its range (cut ones among them), of odd and even tile
        # counts, on the same mbarriers.
        def fn(rng):
            from dataclasses import replace

            from attnrt.ops.paged_attention import plan as pp
            from tests.test_paged_balanced_cpu import partition

            c = make_case(rng, **{**MLA, "H": H, "bs": 64}, dtype=BF16, rope="half",
                          q_lens=q_lens, past_lens=past_lens)
            bound = Bound(rt, c, path="wg", wg_schedule=schedule, balanced=True)
            small = replace(rt.capabilities, sm_count=sms)
            bound.kernel._caps = lambda: small
            try:
                bound.execute()
                out, cache = bound.results()
                p = bound.kernel.last_plan
                if schedule == "pair":
                    assert p.balanced, p
                    assert p.part_ctas == sms - sms % p.part_lanes, p
                    lengths = np.add(q_lens, past_lens)
                    s = partition(np.asarray(q_lens), lengths, H, -1, c.inputs[7].shape[1] * 64,
                                  p.block_n, p.part_ctas, pp.partition_overhead(bound.kernel.config),
                                  p.part_lanes)
                    walked = [len(u) for u in s["ctas"]]
                    cut = [u[2] for units in s["ctas"] for u in units]
                    assert max(walked) > 2 and (sms == 1 or max(cut) > 1), (walked, cut)
                else:  # the serial kernel balances only where the model splits
                    assert p.balanced or p.splits == 1, p
                check(c, out, cache)
                rt.latch.check()
            finally:
                bound.free()
        return fn

    for pdl in (True, False):
        case(f"forced-splits-prefill-pdl{int(pdl)}", forced_splits(pdl))
        case(f"out-of-range-ids-pdl{int(pdl)}", out_of_range(pdl))
    case("one-split-many-tiles", one_split)
    case("balanced-planned-for-4-sms", few_sms(4, 16, (1, 2, 1, 1, 1, 2, 1),
                                                 (900, 61, 2500, 64, 1300, 700, 190)))
    # One CTA walks every row block; then 40 ragged sequences of H128 (two row blocks each)
    # on 7 SMs, one 100x the others.
    case("balanced-planned-for-1-sm", few_sms(1, 32, (1, 1, 2, 1), (3000, 5, 64, 700)))
    ragged = tuple(int(v) for v in np.random.default_rng(40).integers(1, 300, size=40))
    case("balanced-planned-for-7-sms-h128-ragged",
         few_sms(7, 128, (1,) * 40, ragged[:-1] + (100 * ragged[-1],)))
    rt.synchronize()
    leaked = rt.memory_stats().live_bytes - before
    rt.close()
    assert not failures and leaked == 0, f"{failures}; leaked {leaked} bytes"


@pytest.mark.parametrize("schedule", ["serial", "pair"])
def test_wgmma_path_in_child_process(rt, schedule):
    if tuple(rt.capabilities.compute_capability) != (9, 0):
        pytest.skip("path='wg' (sm_90a wgmma) needs compute capability 9.0")
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    body = f"from tests.test_paged_gpu import _wg_child; _wg_child({schedule!r})"
    r = subprocess.run([sys.executable, "-c", body],
                       cwd=root, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"child exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
