"""PagedAttention (LATENT / MLA) without a GPU: claim-time table, validation, planning,
the float64 reference against an independent computation, and NVRTC compiles.

``make_case`` builds seeded inputs (shuffled physical blocks, mixed past lengths); the GPU
tests import it.
"""

from __future__ import annotations

import math
import pickle
import warnings
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from attnrt.ops import _common, factory_class, reference
from attnrt.ops import paged_attention as pa
from attnrt.ops.paged_attention import PagedAttentionConfig, PagedAttentionFactory, PagedAttentionKernel
from attnrt.ops.paged_attention import plan as pplan
from attnrt.ops.paged_attention import schema as ps
from attnrt.runtime import compiler
from attnrt.runtime.api import DataType, Node, TensorMetadata, WorkspaceRequirement
from attnrt.runtime.errors import KernelError, Unsupported

BF16, F16 = DataType.BFLOAT16, DataType.FLOAT16
NP = {BF16: ml_dtypes.bfloat16, F16: np.float16}


# --------------------------------------------------------------------------- case builder
def make_node(H: int, *, vhs: int = 0, scale: float | None = None, rope: str | None = None,
              offset: int = 0, softcap: float = 0.0, window: int = -1, n_inputs: int = 11,
              **extra) -> Node:
    attrs = {"kv_cache_layout": "LATENT", "num_heads": H, "kv_num_heads": 1,
             "local_window_size": window, "softcap": softcap}
    if vhs:
        attrs["v_head_size"] = vhs
    if scale is not None:
        attrs["scale"] = scale
    if rope:
        attrs.update(do_rotary=1, rotary_interleaved=int(rope == "interleaved"),
                     rotary_offset=offset)
    attrs.update(extra)
    names = [ps.INPUT_NAMES[i] if i in ps.REQUIRED or (rope and i in (ps.IN_COS, ps.IN_SIN))
             else None for i in range(n_inputs)]
    return Node("PagedAttention", "com.microsoft", attrs, names, ["output", None])


def make_case(rng: np.random.Generator, *, dtype: DataType = BF16, H: int = 3, hs: int = 80,
              vhs: int = 64, bs: int = 16, q_lens=(3, 1), past_lens=(5, 20), rope: str | None = None,
              rd: int = 16, offset: int = 0, softcap: float = 0.0, window: int = -1,
              skip: tuple[int, ...] = (), extra_blocks: int = 2) -> SimpleNamespace:
    """Inputs (numpy, schema order, 17 slots) for sequences with these new/past lengths."""
    B, T = len(q_lens), int(sum(q_lens))
    kv = [p + q for p, q in zip(past_lens, q_lens)]
    nblk = [-(-k // bs) for k in kv]
    mb = max(nblk) + 1
    nb = sum(nblk) + extra_blocks
    perm = rng.permutation(nb).astype(np.int32)
    bt = np.full((B, mb), -1, dtype=np.int32)  # unused entries stay -1 and must not be read
    k = 0
    for b in range(B):
        bt[b, :nblk[b]] = perm[k:k + nblk[b]]
        k += nblk[b]
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    past = np.asarray(past_lens, dtype=np.int32)
    pos = np.concatenate([np.arange(p, p + q) for p, q in zip(past_lens, q_lens)]).astype(np.int64)
    seq = np.repeat(np.arange(B), q_lens)
    slot = (bt[seq, pos // bs].astype(np.int64) * bs + pos % bs).astype(np.int32)
    for t in skip:
        slot[t] = -1
    dt = NP[dtype]
    ins: list = [None] * 17
    ins[0] = rng.standard_normal((T, H * hs)).astype(dt)
    ins[1] = rng.standard_normal((T, hs)).astype(dt)
    ins[3] = rng.standard_normal((nb, bs, 1, hs)).astype(dt)
    ins[5], ins[6], ins[7], ins[10] = cu, past, bt, slot
    if rope:
        max_pos = max(kv) + 3
        inv = 1.0 / (10000.0 ** (np.arange(rd // 2) / (rd // 2)))
        ang = np.arange(max_pos)[:, None] * inv[None, :]
        ins[8], ins[9] = np.cos(ang).astype(dt), np.sin(ang).astype(dt)
    scale = 1.0 / math.sqrt(hs) if vhs != hs else None
    node = make_node(H, vhs=vhs if vhs != hs else 0, scale=scale, rope=rope, offset=offset,
                     softcap=softcap, window=window)
    return SimpleNamespace(node=node, inputs=ins, T=T, B=B, H=H, hs=hs, vhs=vhs, bs=bs, nb=nb,
                           pos=pos, seq=seq, dtype=dtype, rope=rope, offset=offset, rd=rd)


def metas(c: SimpleNamespace) -> list:
    return [None if x is None else TensorMetadata(DataType.from_numpy(x.dtype), x.shape)
            for x in c.inputs[:16]]


# --------------------------------------------------------------------------- independent f64
def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, off: int, interleaved: bool) -> np.ndarray:
    """RoPE written the "rotate_half" way: x*cos + rot(x)*sin on the rotary slice."""
    y = x.copy()
    r = x[..., off:off + 2 * cos.shape[-1]]
    if interleaved:
        c, s = np.repeat(cos, 2, axis=-1), np.repeat(sin, 2, axis=-1)
        rot = np.stack([-r[..., 1::2], r[..., 0::2]], axis=-1).reshape(r.shape)
    else:
        c, s = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)
        h = r.shape[-1] // 2
        rot = np.concatenate([-r[..., h:], r[..., :h]], -1)
    y[..., off:off + r.shape[-1]] = r * c + rot * s
    return y


def independent(c: SimpleNamespace) -> np.ndarray:
    """Dense per-sequence attention over the logical K sequence (no slot may be -1)."""
    q, key, kc, cu, past, bt = (c.inputs[i] for i in (0, 1, 3, 5, 6, 7))
    node = c.node
    # Float attributes (and the default scale) are the float32 values the kernels use.
    scale = float(np.float32(node.attributes.get("scale") or 1.0 / math.sqrt(c.hs)))
    softcap = float(np.float32(node.attributes["softcap"]))
    w = node.attributes["local_window_size"]
    il = node.attributes.get("rotary_interleaved", 0) == 1
    out = np.zeros((c.T, c.H, c.vhs))
    for b in range(c.B):
        q_len, p0 = int(cu[b + 1] - cu[b]), int(past[b])
        kv = p0 + q_len
        logical = np.stack([kc[bt[b, j // c.bs], j % c.bs, 0] for j in range(kv)]).astype(np.float64)
        newk = key[cu[b]:cu[b + 1]].astype(np.float64)
        qs = q[cu[b]:cu[b + 1]].astype(np.float64).reshape(q_len, c.H, c.hs)
        ps = np.arange(p0, kv)
        if c.rope:
            cs, sn = c.inputs[8][ps].astype(np.float64), c.inputs[9][ps].astype(np.float64)
            newk = _rotate(newk, cs, sn, c.offset, il).astype(NP[c.dtype]).astype(np.float64)
            qs = _rotate(qs, cs[:, None], sn[:, None], c.offset, il)
        logical[p0:] = newk
        s = np.einsum("qhd,kd->qhk", qs, logical) * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        j = np.arange(kv)[None, :]
        vis = (j <= ps[:, None]) & ((ps[:, None] - j <= w) if w >= 0 else True)
        s = np.where(vis[:, None, :], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[cu[b]:cu[b + 1]] = np.einsum("qhk,kd->qhd", p, logical[:, :c.vhs])
    return out.reshape(c.T, c.H * c.vhs)


# --------------------------------------------------------------------------- claim time
def test_registered():
    assert factory_class("com.microsoft", "PagedAttention") is PagedAttentionFactory


@pytest.mark.parametrize("dtype", [F16, BF16, None])
def test_accepts_latent(dtype):
    n = make_node(128, vhs=512, scale=0.1)
    i32 = None if dtype is None else DataType.INT32
    dts = [dtype, dtype, None, dtype, None, i32, i32, i32, None, None, i32]
    assert PagedAttentionFactory().unsupported_reason(n, [None] * 11, dts) is None
    assert isinstance(PagedAttentionFactory().create(n, []), PagedAttentionKernel)


def _with_input(i: int):
    def f(n: Node) -> None:
        n.inputs = n.inputs + [None] * (i + 1 - len(n.inputs))
        n.inputs[i] = f"in{i}"
    return f


def _without_input(i: int):
    def f(n: Node) -> None:
        n.inputs[i] = None
    return f


def _attr(**kv):
    return lambda n: n.attributes.update(kv)


DECLINED = [
    ("separate", _attr(kv_cache_layout="SEPARATE"), None, 'kv_cache_layout="SEPARATE"'),
    ("no-layout", lambda n: n.attributes.pop("kv_cache_layout"), None, "kv_cache_layout"),
    ("kv-heads", _attr(kv_num_heads=2), None, "kv_num_heads"),
    *[(f"quant-{a}", _attr(**{a: "int8"}), None, a) for a in ps.QUANT_ATTRS],
    ("value", _with_input(2), None, "'value'"),
    ("value-cache", _with_input(4), None, "'value_cache'"),
    ("head-sink", _with_input(11), None, "head_sink"),
    ("q-norm", _with_input(12), None, "q_norm"),
    ("k-norm", _with_input(13), None, "k_norm"),
    ("k-scale", _with_input(14), None, "k_scale"),
    ("v-scale", _with_input(15), None, "v_scale"),
    ("packed-qkv", _without_input(1), None, "packed QKV"),
    ("float32", None, {0: DataType.FLOAT}, "FLOAT"),
    ("float64", None, {0: DataType.DOUBLE}, "DOUBLE"),
    ("cache-int8", None, {3: DataType.INT8}, "INT8"),
    ("int64-index", None, {5: DataType.INT64}, "INT64"),
    ("no-heads", _attr(num_heads=0), None, "num_heads"),
]


@pytest.mark.parametrize("mutate,dtypes,needle", [d[1:] for d in DECLINED], ids=[d[0] for d in DECLINED])
def test_declined_modes_name_themselves(mutate, dtypes, needle):
    n = make_node(16, vhs=64, scale=0.1)
    if mutate:
        mutate(n)
    dts = [BF16, BF16, None, BF16, None] + [DataType.INT32] * 3 + [None, None, DataType.INT32]
    for i, d in (dtypes or {}).items():
        dts[i] = d
    reason = PagedAttentionFactory().unsupported_reason(n, [None] * len(n.inputs), dts)
    assert reason is not None and needle in reason, reason
    if dtypes is None:  # create() sees no dtypes, but refuses every attribute/input mode
        with pytest.raises((Unsupported, KernelError), match="PagedAttention"):
            PagedAttentionFactory().create(n, [])


def test_factory_argument_checks():
    with pytest.raises(ValueError):
        PagedAttentionConfig(path="fast")
    with pytest.raises(ValueError):
        PagedAttentionConfig(num_splits=0)
    with pytest.raises(ValueError):
        PagedAttentionConfig(mla_tiles=(48,))
    assert PagedAttentionFactory(config=PagedAttentionConfig(path="mla")).create(
        make_node(4), []).config.path == "mla"


# --------------------------------------------------------------------------- validation
def _kernel(c: SimpleNamespace, **kw) -> PagedAttentionKernel:
    return PagedAttentionFactory(None, config=PagedAttentionConfig(**kw)).create(c.node, [])


def _set(i: int, dtype=None, shape=None):
    def f(m: list) -> None:
        old = m[i]
        m[i] = TensorMetadata(dtype or old.dtype, old.shape if shape is None else shape)
    return f


def _drop(i: int):
    def f(m: list) -> None:
        m[i] = None
    return f


VALIDATION = [
    ("block-size-24", _set(3, shape=(9, 24, 1, 80)), "block_size 24"),
    ("block-size-8", _set(3, shape=(9, 8, 1, 80)), "power of two >= 16"),
    ("cache-heads", _set(3, shape=(9, 16, 2, 80)), "one latent head"),
    ("query-hidden", _set(0, shape=(4, 3 * 80 + 1)), "num_heads * head_size"),
    ("key-hidden", _set(1, shape=(4, 81)), "[tokens, head_size]"),
    ("key-tokens", _set(1, shape=(5, 80)), "[tokens, head_size]"),
    ("cu-length", _set(5, shape=(4,)), "[batch + 1]"),
    ("table-rows", _set(7, shape=(3, 3)), "[batch, max_blocks]"),
    ("slot-length", _set(10, shape=(3,)), "[tokens]"),
    ("key-dtype", _set(1, dtype=F16), "the query's BFLOAT16"),
    ("cache-dtype", _set(3, dtype=F16), "key_cache"),
    ("query-f32", _set(0, dtype=DataType.FLOAT), "FLOAT16 or BFLOAT16"),
    ("cu-int64", _set(5, dtype=DataType.INT64), "INT32"),
    ("slot-int64", _set(10, dtype=DataType.INT64), "INT32"),
    ("no-query", _drop(0), "'query' (0) is absent"),
    ("no-table", _drop(7), "'block_table' (7) is absent"),
    ("value-present", _set(2, dtype=BF16, shape=(4, 80)), "'value'"),
]


@pytest.mark.parametrize("mutate,needle", [v[1:] for v in VALIDATION], ids=[v[0] for v in VALIDATION])
def test_validation_errors(rng, mutate, needle):
    c = make_case(rng)
    m = metas(c)
    m[2] = TensorMetadata(DataType.FLOAT, ())  # absent, as the executor hands it over
    _kernel(c).validate(m)  # the unmutated case passes
    mutate(m)
    with pytest.raises(KernelError, match="PagedAttention") as ei:
        _kernel(c).workspace_requirement(m)
    assert needle in str(ei.value)


def test_rotary_validation(rng):
    c = make_case(rng, rope="half", rd=16, offset=64)  # 64 + 16 <= 80: fine
    _kernel(c).validate(metas(c))
    bad = make_case(rng, rope="half", rd=16, offset=70)
    with pytest.raises(KernelError, match="exceeds head_size 80"):
        _kernel(bad).validate(metas(bad))
    m = metas(c)
    m[8] = None
    with pytest.raises(KernelError, match="'cos_cache' .* is absent"):
        _kernel(c).validate(m)
    m = metas(c)
    m[9] = TensorMetadata(BF16, (m[8].shape[0] + 1, m[8].shape[1]))
    with pytest.raises(KernelError, match="sin_cache"):
        _kernel(c).validate(m)


def test_scale_required_when_value_head_differs(rng):
    c = make_case(rng)
    c.node.attributes.pop("scale")
    with pytest.raises(KernelError, match="'scale' is required"):
        _kernel(c).validate(metas(c))
    c.node.attributes["scale"] = 0.0  # the ONNX default means "not given"
    with pytest.raises(KernelError, match="'scale' is required"):
        _kernel(c).validate(metas(c))


def test_output_validation(rng):
    c = make_case(rng)
    m = metas(c)
    good = TensorMetadata(BF16, (c.T, c.H * c.vhs))
    _kernel(c).validate(m, [good, None])
    with pytest.raises(KernelError, match="output 0"):
        _kernel(c).validate(m, [TensorMetadata(BF16, (c.T, c.H * c.hs))])
    with pytest.raises(KernelError, match="output 0"):
        _kernel(c).validate(m, [TensorMetadata(F16, (c.T, c.H * c.vhs))])
    with pytest.raises(KernelError, match="key_cache_out"):
        _kernel(c).validate(m, [good, TensorMetadata(BF16, (1, 16, 1, 80))])


def test_strided_input_refused(rng):
    c = make_case(rng)
    m = metas(c)
    m[0] = TensorMetadata(BF16, m[0].shape, (m[0].shape[1] + 8, 1))
    with pytest.raises(KernelError, match="contiguous"):
        _kernel(c).validate(m)
    assert not _kernel(c).supports_strided_input(0)


def test_attribute_errors():
    n = make_node(8, window=-2)
    with pytest.raises(KernelError, match="local_window_size"):
        PagedAttentionFactory().create(n, [])
    n = make_node(8, softcap=-1.0)
    with pytest.raises(KernelError, match="softcap"):
        PagedAttentionFactory().create(n, [])


def test_execute_needs_a_runtime(rng):
    c = make_case(rng)
    with pytest.raises(KernelError, match="without a runtime"):
        _kernel(c).execute([], [])
    assert not _kernel(c).capture_support().supported


# --------------------------------------------------------------------------- planning
def _decode_metas(B: int, L: int, H: int = 128, bs: int = 64, dtype=BF16) -> list:
    mb = -(-L // bs)
    m: list = [None] * 17
    m[0] = TensorMetadata(dtype, (B, H * 576))
    m[1] = TensorMetadata(dtype, (B, 576))
    m[3] = TensorMetadata(dtype, (B * mb, bs, 1, 576))
    m[5] = TensorMetadata(DataType.INT32, (B + 1,))
    m[6] = TensorMetadata(DataType.INT32, (B,))
    m[7] = TensorMetadata(DataType.INT32, (B, mb))
    m[10] = TensorMetadata(DataType.INT32, (B,))
    return m


def _mla_kernel(H: int = 128, **kw) -> PagedAttentionKernel:
    kw.setdefault("path", "mla")  # these tests plan the mma.sync kernel; auto is tested below
    return PagedAttentionKernel(None, make_node(H, vhs=512, scale=0.07),
                                config=PagedAttentionConfig(**kw))


def test_plan_auto_takes_the_wgmma_kernel_on_compute_capability_9_0():
    p = _mla_kernel(path="auto").plan(_decode_metas(128, 8192))
    assert (p.path, p.block_n) == ("wg", 64)


def test_plan_decode_large_batch_does_not_split():
    p = _mla_kernel().plan(_decode_metas(128, 8192))
    assert (p.path, p.block_n, p.splits, p.grid_x) == ("mla", 64, 1, 256)
    assert _mla_kernel().workspace_requirement(_decode_metas(128, 8192)) == WorkspaceRequirement.NONE


def test_plan_decode_small_batch_splits_and_sizes_workspace():
    k = _mla_kernel()
    p = k.plan(_decode_metas(1, 8192))
    assert p.path == "mla" and p.grid_x == 2 and 32 <= p.splits <= PagedAttentionConfig().max_splits
    assert p.grid_x * p.splits <= 132  # one wave
    lse_off, total = pa.workspace_layout(128, 512, p.splits)
    assert (p.ws_lse_offset, p.ws_bytes) == (lse_off, total)
    assert lse_off >= 128 * p.splits * 512 * 4 and lse_off % 256 == 0
    req = k.workspace_requirement(_decode_metas(1, 8192))
    assert req.nbytes == total and req.alignment == 256
    # Host attention_metadata (index 16) may only lower the split count.
    m = _decode_metas(1, 8192)
    m[16] = np.array([1, 300], dtype=np.int32)
    assert k.plan(m).splits < p.splits
    m[16] = np.array([1, 10**6, 1], dtype=np.int32)
    assert k.plan(m).splits == p.splits
    m[16] = np.array([1.0, 2.0])
    with pytest.raises(KernelError, match="attention_metadata"):
        k.plan(m)


def test_plan_rows_of_several_tokens_per_cta():
    # 16 heads: a row block is 4 tokens x 16 heads; the grid adds one spare block per sequence.
    p = _mla_kernel(16).plan(_decode_metas(5, 1000, H=16))
    assert p.path == "mla" and p.grid_x == 5 * 16 // 64 + 5


def test_plan_paths():
    assert _mla_kernel(path="simple").plan(_decode_metas(2, 100)).path == "simple"
    assert _mla_kernel(path="mla32").plan(_decode_metas(2, 100)).block_n == 32
    assert _mla_kernel(path="auto").plan(_decode_metas(2, 100), aligned=False).path == "simple"
    forced = _mla_kernel(num_splits=3).plan(_decode_metas(2, 100))
    assert forced.splits == 3 and forced.ws_bytes == pa.workspace_layout(256, 512, 3)[1]
    a100 = _mla_kernel(path="auto")
    a100._caps = lambda: SimpleNamespace(sm_count=108, max_shared_per_block_optin=166912)
    assert a100.plan(_decode_metas(2, 100)).block_n == 32
    small = PagedAttentionKernel(None, make_node(4, vhs=64, scale=0.1),
                                 config=PagedAttentionConfig(path="mla"))
    c = make_case(np.random.default_rng(0), H=4)
    with pytest.raises(KernelError, match="path='mla'"):
        small.plan(metas(c))
    assert PagedAttentionKernel(None, c.node).plan(metas(c)).path == "simple"
    empty = _decode_metas(2, 100)
    empty[0] = TensorMetadata(BF16, (0, 128 * 576))
    empty[1] = TensorMetadata(BF16, (0, 576))
    empty[10] = TensorMetadata(DataType.INT32, (0,))
    assert _mla_kernel(path="auto").plan(empty).path == "none"


def test_mla_tile_fits_shared_memory():
    assert pa.mla_smem_bytes(64) <= 232448 < pa.mla_smem_bytes(64) + 2048  # sm_90: 227 KiB
    assert pa.mla_smem_bytes(32) <= 166912  # sm_80: 163 KiB


def test_choose_splits():
    assert pa.choose_splits(256, 128, 132, 16384) == 1    # B=128 decode: two full waves
    assert pa.choose_splits(64, 128, 132, 4096) == 2      # B=32: one wave of 128 CTAs
    s = pa.choose_splits(2, 512, 132, 128)                # B=1, 32k keys: fill the GPU
    assert 2 * s <= 132 and s >= 32
    assert pa.choose_splits(2, 16, 132, 128) < pa.choose_splits(2, 512, 132, 128)
    assert pa.choose_splits(2, 1, 132, 128) == 1
    for path in ("mla", "wg"):  # the wgmma path's cheaper tiles never split a full grid
        assert pa.choose_splits(256, 128, 132, 16384, path=path) == 1
        assert 2 * pa.choose_splits(2, 128, 132, 128, path=path) <= 132


def test_config_knobs_steer_the_planner():
    """Each PagedAttentionConfig field changes the plan it should, and nothing else does."""
    metas1 = _decode_metas(1, 8192)
    base = _mla_kernel().plan(metas1)
    assert base.splits > 4
    assert _mla_kernel(max_splits=4).plan(metas1).splits == 4
    assert _mla_kernel(mla_tiles=(32,)).plan(metas1).block_n == 32
    # Cheap tiles make splitting pay less; a slow combine read or launch even less.
    cheap = pa.SplitCost(0.5, 3.0, 1.0)
    assert 1 < _mla_kernel(mla_cost=cheap).plan(metas1).splits < base.splits
    assert 1 < _mla_kernel(combine_bytes_per_us=3e3).plan(metas1).splits < base.splits
    assert _mla_kernel(combine_launch_us=1000.0).plan(metas1).splits == 1
    # The wgmma cost model only steers the wgmma path.
    assert _mla_kernel(wg_cost=cheap).plan(metas1) == base
    assert _mla_kernel(path="wg", wg_cost=cheap).plan(metas1).splits < \
        _mla_kernel(path="wg").plan(metas1).splits
    cfg = PagedAttentionConfig(path="wg", num_splits=7)
    assert pickle.loads(pickle.dumps(cfg)) == cfg and hash(cfg) == hash(PagedAttentionConfig(
        path="wg", num_splits=7))
    assert PagedAttentionKernel(None, make_node(128, vhs=512, scale=0.07),
                                config=cfg).plan(metas1).splits == 7


def test_reference_math_is_independent_of_the_kernel_modules():
    import ast
    import inspect

    from attnrt.ops.paged_attention import reference as ref_mod

    tree = ast.parse(inspect.getsource(ref_mod))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom | ast.Import)
             for a in n.names} | {n.module or "" for n in ast.walk(tree)
                                  if isinstance(n, ast.ImportFrom)}
    assert not {"plan", "builds", "kernel"} & {x.rsplit(".", 1)[-1] for x in names}, names


def test_plan_wgmma_path():
    k = _mla_kernel(path="wg")
    p = k.plan(_decode_metas(1, 8192))
    assert (p.path, p.block_n, p.grid_x) == ("wg", 64, 2) and p.splits > 1
    assert not p.balanced and p.max_chunks == p.splits  # decode: balanced only when asked
    assert (p.ws_lse_offset, p.ws_bytes) == pa.workspace_layout(128, 512, p.splits)
    # Opted in, but one sequence has nothing to balance.
    assert not _mla_kernel(path="wg", balanced=True).plan(_decode_metas(1, 8192)).balanced
    # Two sequences, serial kernel: up to twice the model's count per sequence, chosen on
    # the device.
    b = _mla_kernel(path="wg", balanced=True, wg_schedule="serial").plan(_decode_metas(2, 8192))
    assert b.balanced and b.max_chunks == min(2 * b.splits, 64) >= b.splits > 1
    assert (b.ws_lse_offset, b.ws_bytes) == pa.workspace_layout(256, 512, b.max_chunks, True)
    assert b.ws_cnt_offset == pa.counts_offset(256, 512, b.max_chunks)
    assert b.ws_cnt_offset >= b.ws_lse_offset + 256 * b.max_chunks * 4
    assert b.ws_bytes == b.ws_cnt_offset + 256 * 4
    assert k.workspace_requirement(_decode_metas(1, 8192)).nbytes == p.ws_bytes
    # The pair kernel: the contiguous partition over one CTA per SM, its slots workspace.
    c = _mla_kernel(path="wg", balanced=True).plan(_decode_metas(2, 8192))
    # H128: two lanes (a token's two row blocks side by side), 66 parts each.
    assert c.balanced and c.part_ctas == c.max_chunks == 132 and c.grid_x == 4
    assert c.part_lanes == 2
    assert (c.ws_lse_offset, c.ws_cnt_offset, c.ws_bytes) == pa.partition_layout(256, 512, 140)
    assert c.ws_bytes == c.ws_cnt_offset + 2 * 256 * 4
    assert _mla_kernel(path="wg", balanced=True).workspace_requirement(
        _decode_metas(2, 8192)).nbytes == c.ws_bytes
    # More tokens than sequences (speculative decode): balanced by default, not when refused.
    spec = _decode_metas(8, 8192, H=16)
    spec[0] = TensorMetadata(BF16, (32, 16 * 576))
    spec[1] = TensorMetadata(BF16, (32, 576))
    spec[10] = TensorMetadata(DataType.INT32, (32,))
    d = _mla_kernel(path="wg", H=16).plan(spec)
    assert d.balanced and d.part_ctas == 132
    d = _mla_kernel(path="wg", H=16, wg_schedule="serial").plan(spec)
    assert d.balanced and d.splits > 1 and d.max_chunks == min(2 * d.splits, 64)
    assert not _mla_kernel(path="wg", H=16, balanced=False).plan(spec).balanced
    with pytest.raises(ValueError, match="balanced"):
        PagedAttentionConfig(balanced="yes")
    assert k.plan(_decode_metas(128, 8192)).splits == 1
    assert pa.mla_wg_smem_bytes() <= 232448  # sm_90 opt-in
    a100 = _mla_kernel(path="wg")
    a100._caps = lambda: SimpleNamespace(sm_count=108, max_shared_per_block_optin=166912,
                                         compute_capability=(8, 0))
    with pytest.raises(KernelError, match="path='wg'"):
        a100.plan(_decode_metas(2, 100))
    with pytest.raises(KernelError, match="path='wg'"):
        k.plan(_decode_metas(2, 100), aligned=False)
    small = PagedAttentionKernel(None, make_node(4, vhs=64, scale=0.1),
                                 config=PagedAttentionConfig(path="wg"))
    with pytest.raises(KernelError, match="path='wg'"):
        small.plan(metas(make_case(np.random.default_rng(0), H=4)))


# --------------------------------------------------------------------------- reference
REF_CASES = {
    "decode-norope": dict(q_lens=(1, 1, 1), past_lens=(0, 17, 40)),
    "prefill-half": dict(q_lens=(5, 2), past_lens=(0, 33), rope="half", rd=16, offset=8),
    "prefill-interleaved-f16": dict(dtype=F16, q_lens=(4, 3), past_lens=(12, 1),
                                    rope="interleaved", rd=32, offset=48),
    "softcap-window": dict(q_lens=(3, 6), past_lens=(30, 9), softcap=2.5, window=7, bs=32),
    "equal-heads": dict(hs=64, vhs=64, q_lens=(2,), past_lens=(3,), window=0),
}


@pytest.mark.parametrize("kw", REF_CASES.values(), ids=REF_CASES.keys())
def test_reference_matches_independent_f64(rng, kw):
    c = make_case(rng, **kw)
    before = [None if x is None else x.copy() for x in c.inputs]
    out, cache = reference.paged_attention(c.node, c.inputs)
    for x, y in zip(before, c.inputs):  # inputs untouched
        assert (x is None and y is None) or np.array_equal(x, y)
    assert out.dtype == NP[c.dtype] and out.shape == (c.T, c.H * c.vhs)
    want = independent(c)
    # The only difference left is the final rounding to the dtype.
    assert np.allclose(out.astype(np.float64), want, rtol=1e-2, atol=1e-2)
    exact, _ = _ref_f64(c)
    np.testing.assert_allclose(exact, want, rtol=1e-10, atol=1e-10)
    # Rows of tokens written without RoPE are bitwise the key rows.
    if not c.rope:
        slots = c.inputs[10]
        np.testing.assert_array_equal(cache.reshape(-1, c.hs)[slots], c.inputs[1])


def _ref_f64(c: SimpleNamespace):
    """The reference's output before the final cast."""
    return reference.paged_attention(c.node, c.inputs, out_dtype=np.float64)


def test_reference_slot_minus_one_skips_the_write(rng):
    c = make_case(rng, q_lens=(3,), past_lens=(4,), skip=(1,))
    _, cache = reference.paged_attention(c.node, c.inputs)
    flat_old, flat = c.inputs[3].reshape(-1, c.hs), cache.reshape(-1, c.hs)
    p = int(c.pos[1])
    skipped = c.inputs[7][0, p // c.bs] * c.bs + p % c.bs
    np.testing.assert_array_equal(flat[skipped], flat_old[skipped])
    written = c.inputs[10][[0, 2]]
    np.testing.assert_array_equal(flat[written], c.inputs[1][[0, 2]])


def test_reference_out_of_range(rng):
    c = make_case(rng, q_lens=(2,), past_lens=(40,))
    c.inputs[7] = c.inputs[7].copy()
    c.inputs[7][0, 1] = 10_000  # keys 16..31 point outside the cache
    with pytest.raises(ValueError, match="block_table"):
        reference.paged_attention(c.node, c.inputs)
    out, _ = reference.paged_attention(c.node, c.inputs, strict=False)
    assert np.all(np.isfinite(out.astype(np.float64)))
    c.inputs[10] = c.inputs[10].copy()
    c.inputs[10][0] = c.nb * c.bs
    with pytest.raises(ValueError, match="slot_mapping"):
        reference.paged_attention(c.node, c.inputs)
    r = make_case(rng, q_lens=(2,), past_lens=(3,), rope="half")
    r.inputs[6] = np.array([500], dtype=np.int32)  # positions past cos_cache
    with pytest.raises(ValueError, match="cos_cache"):
        reference.paged_attention(r.node, r.inputs)


# --------------------------------------------------------------------------- compiles
def test_every_variant_compiles_for_sm80_and_sm90():
    jobs = [(v, arch) for v in pa.compile_variants() for arch in ("sm_80", "sm_90")
            if int(arch[3:]) >= v.min_arch]

    def build(job):
        v, arch = job
        r = compiler.compile_source(_common.source(v.file), v.file, arch + v.arch_suffix * (arch == "sm_90"),
                                    v.options, _common.headers())
        return v, arch, r

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(build, jobs))
    variants = pa.compile_variants()
    assert len(results) == sum(2 if v.min_arch <= 80 else 1 for v in variants)
    assert any(v.arch_suffix == "a" and v.min_arch == 90 for v in variants)  # the wgmma path
    for v, arch, r in results:
        assert r.cubin.startswith(b"\x7fELF"), (v, arch)
        for e in v.entries:
            assert f".entry {e}(".encode() in r.ptx, (v.file, e)


@pytest.mark.parametrize("extra", [{"PA_PAIR_LEAN": 1}, {"PA_PAIR_STSM": 1}, {"PA_PAIR_TRIGGER": 1},
                                   {"PA_PAIR_LEAN": 1, "PA_PAIR_STSM": 1, "PA_SOFTCAP": 1}])
def test_pair_kernel_lab_switches_compile(extra):
    """The pair kernel's lab switches still build for sm_90a with no ptxas advisory (a
    serialized wgmma, C7511, would void the A/B they exist for); lab/device_ab_rows.sh times
    them."""
    from attnrt.ops.paged_attention import builds
    v = builds.wg_variant(BF16, schedule="pair")
    opts = _common.defines_to_options({**v.defines, **extra})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = compiler.compile_source(_common.source(v.file), v.file, "sm_90a", opts,
                                    _common.headers())
    assert f".entry {v.entries[0]}(".encode() in r.ptx
    assert not compiler.performance_loss(r.log), r.log


def test_pair_kernel_has_a_softcap_build():
    """The pair kernel is built with and without its softcap code (kernel.py picks by the
    softcap attribute); the serial kernel has one build for both."""
    from attnrt.ops.paged_attention import builds
    plain, cap = (builds.wg_variant(BF16, schedule="pair", softcap=x) for x in (False, True))
    assert (plain.defines["PA_SOFTCAP"], cap.defines["PA_SOFTCAP"]) == (0, 1)
    assert "PA_SOFTCAP" not in builds.wg_variant(BF16, schedule="serial", softcap=True).defines
    listed = pa.compile_variants()
    for dt in builds.SUPPORTED:
        for x in (False, True):
            assert builds.wg_variant(dt, schedule="pair", softcap=x) in listed, (dt, x)


def _meta_case(B: int, L: int, H: int = 16, bs: int = 64):
    """Shapes only (no data): B decode sequences of L keys, the latent widths."""
    c = SimpleNamespace(node=make_node(H, vhs=512, scale=0.1, rope="half", offset=512))
    nb = B * -(-L // bs) + 1
    shapes = {0: (B, H * 576), 1: (B, 576), 3: (nb, bs, 1, 576), 5: (B + 1,), 6: (B,),
              7: (B, -(-L // bs)), 8: (L + 4, 32), 9: (L + 4, 32), 10: (B,)}
    dtypes = {5: np.int32, 6: np.int32, 7: np.int32, 10: np.int32}
    c.metas = [TensorMetadata(DataType.from_numpy(np.dtype(dtypes.get(i, ml_dtypes.bfloat16))),
                              shapes[i]) if i in shapes else None for i in range(11)]
    return c


@pytest.mark.parametrize("B, L, bs, schedule, want", [
    (128, 8192, 64, "auto", "pair"),     # one split of 128 tiles
    (1, 8192, 64, "auto", "pair"),       # 64 splits of 2 tiles
    (8, 8192, 128, "auto", "pair"),      # pages of two tiles
    (128, 8192, 32, "auto", "serial"),   # pages of 32 keys: no whole-page TMA box
    (8, 8192, 16, "auto", "serial"),
    (1, 8192, 64, "pair", "pair"),       # forced
    (1, 8192, 16, "pair", "serial"),     # forced, but the block size rules it out
    (128, 8192, 128, "serial", "serial"),
])
def test_wg_schedule_rule(B, L, bs, schedule, want):
    c = _meta_case(B, L, bs=bs)
    cfg = PagedAttentionConfig(path="wg", wg_schedule=schedule)
    kernel = PagedAttentionFactory(None, config=cfg).create(c.node)
    geo = kernel.validate(c.metas)
    plan = kernel.plan(c.metas)
    assert plan.path == "wg"
    assert pplan.wg_schedule(geo, cfg) == want, (plan.splits, geo.max_blocks)


def test_wg_schedule_knob_is_validated():
    with pytest.raises(ValueError, match="wg_schedule"):
        PagedAttentionConfig(wg_schedule="fast")


def test_default_config_takes_the_pair_kernel_for_whole_pages():
    # The default is "auto": the pair kernel for pages of 64 keys, long splits or short
    # (B128: one split of 128 tiles, B8: 16 splits of 8), the serial one for pages of 32.
    assert PagedAttentionConfig().wg_schedule == "auto"
    cfg = PagedAttentionConfig()
    for B, bs, want in ((128, 64, "pair"), (8, 64, "pair"), (8, 32, "serial")):
        c = _meta_case(B, 8192, bs=bs)
        kernel = PagedAttentionFactory(None, config=cfg).create(c.node)
        geo = kernel.validate(c.metas)
        plan = kernel.plan(c.metas)
        assert plan.path == "wg" and pplan.wg_schedule(geo, cfg) == want, (B, bs)
