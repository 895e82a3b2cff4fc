"""pkg.nxrt::Attention single-kernel decode without a GPU: plan choice, splits, workspace
layout, shared memory, compiles (no spills) and launches checked against the PTX."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from attnrt.ops import _common, attention
from attnrt.ops.attention import (
    DEC_CLUSTERS,
    DEC_MAX_SPLITS,
    DEC_TILES,
    AttentionConfig,
    AttentionKernel,
    Attrs,
    Dims,
    builds,
    dec_cluster_reason,
    dec_smem_bytes,
    decode_layout,
    decode_reason,
    decode_splits,
    plan,
    split_layout,
)
from attnrt.runtime import compiler
from attnrt.runtime.api import DataType, Node, TensorMetadata, TensorMut, TensorView, WorkspaceView
from attnrt.runtime.errors import KernelError
from tests._attention_util import dec
from tests._nodes import attention_node

F32, F16, BF16 = DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16


def attrs(H=32, Hkv=8, **kw) -> Attrs:
    return Attrs(H, Hkv, kw.get("causal", False), None, kw.get("softcap", 0.0),
                 kw.get("window", -1))


def node(H=32, Hkv=8, mask=False, **a) -> Node:
    return attention_node({"num_heads": H, "kv_num_heads": Hkv, **a}, mask)


@pytest.fixture
def single() -> AttentionConfig:
    """The config that sends decode-sized ``auto`` calls to the one-launch kernel."""
    return AttentionConfig(decode_path="single")


# ------------------------------------------------------------------ planning (pure)
def test_default_keeps_tc_until_measured():
    assert AttentionConfig().decode_path in ("tc", "single")
    d = Dims(8, 32, 8, 1, 8192, 128, 0)
    p = plan(attrs(), d, BF16, 132, dec())
    assert p.path == "decode" and p.dp == 128


def test_auto_choice(single):
    a = attrs()
    for Sk in (1024, 8192, 32768):
        p = plan(a, Dims(8, 32, 8, 1, Sk, 128, 0), BF16, 132, single)
        assert (p.path, p.dp, p.splits) == ("decode", 128, 4)
    assert plan(a, Dims(8, 32, 8, 4, 4096, 128, 0), F16, 132, single).path == "decode"  # 16 rows
    assert plan(a, Dims(8, 32, 8, 5, 4096, 128, 0), F16, 132, single).path == "tc"  # 20 rows
    assert plan(a, Dims(1, 32, 8, 1, 4096, 128, 0), F32, 132, single).path == "simt"
    assert plan(a, Dims(1, 32, 8, 1, 4096, 128, 0), BF16, 132, single, tc_ok=False).path == "simt"
    assert plan(a, Dims(1, 32, 8, 1, 4096, 20, 0), BF16, 132, single).path == "simt"  # D % 8
    assert plan(a, Dims(1, 32, 8, 1, 4096, 320, 0), BF16, 132, single).path == "unfused"
    p = plan(a, Dims(1, 32, 8, 1, 4096, 72, 0), BF16, 132, single)
    assert (p.path, p.dp) == ("decode", 80)
    p = plan(a, Dims(1, 32, 8, 1, 4096, 256, 0), BF16, 132, single)
    assert (p.path, p.dp) == ("decode", 256)
    # MHA decode: one row per (batch, head)
    m = attrs(16, 16)
    assert plan(m, Dims(2, 16, 16, 1, 999, 64, 0), F16, 132, single).path == "decode"
    # the old route stays selectable
    assert plan(a, Dims(8, 32, 8, 1, 8192, 128, 0), BF16, 132, AttentionConfig(path="fused")).path == "tc"
    # prefill on cc 9.0 still goes to wg
    assert plan(attrs(8, 2), Dims(2, 8, 2, 1000, 1000, 128, 0), BF16, 132, single, cc=(9, 0)).path == "wg"


def test_forced_decode_refusals():
    a = attrs()
    for dims, dt, tc_ok, why in [
            (Dims(1, 32, 8, 1, 64, 128, 0), F32, True, "FLOAT"),
            (Dims(1, 32, 8, 1, 64, 36, 0), F16, True, "D = 36"),
            (Dims(1, 32, 8, 1, 64, 128, 0), F16, False, "strides"),
            (Dims(1, 32, 8, 8, 64, 128, 0), F16, True, "32 packed")]:
        assert decode_reason(dims, dt, tc_ok) is not None
        with pytest.raises(KernelError, match=why):
            plan(a, dims, dt, 132, dec(), tc_ok=tc_ok)


def test_decode_splits():
    assert decode_splits(Dims(8, 32, 8, 1, 1024, 128, 0), 128, 132) == 4  # 256 CTAs
    assert decode_splits(Dims(1, 32, 8, 1, 32768, 128, 0), 128, 132) == 33  # 264 CTAs
    assert decode_splits(Dims(1, 32, 8, 1, 1024, 128, 0), 128, 132) == 8  # 2 tiles per split
    assert decode_splits(Dims(1, 32, 8, 1, 200, 128, 0), 128, 132) == 2  # 4 tiles
    assert decode_splits(Dims(1, 32, 8, 1, 190, 128, 0), 128, 132) == 1  # 3 tiles
    assert decode_splits(Dims(1, 8, 1, 1, 10**6, 64, 0), 64, 132) == DEC_MAX_SPLITS
    assert decode_splits(Dims(64, 32, 8, 1, 32768, 128, 0), 128, 132) == 1  # 512 tasks
    # a window leaves few keys visible: few splits
    assert decode_splits(Dims(1, 32, 8, 1, 32768, 128, 0), 128, 132, window=100) == 1
    assert decode_splits(Dims(1, 32, 8, 1, 32768, 128, 0), 128, 132, window=1000) == 8
    # D 256 builds have 32-key tiles
    assert decode_splits(Dims(1, 32, 8, 1, 256, 256, 0), 256, 132) == 4
    for dims in (Dims(8, 32, 8, 1, 1024, 128, 0), Dims(3, 12, 4, 2, 5000, 64, 0)):
        s = decode_splits(dims, 128, 132)
        assert dims.B * dims.Hkv * s <= attention.DEC_CTAS_PER_SM * 132


def test_decode_splits_pairs():
    """With a cluster merge available, row tiles that fill half to all of the SMs once over
    take two splits (one CTA per SM); other counts keep the two-CTAs-per-SM rule."""
    for B, Hkv in ((8, 8), (6, 8), (4, 16), (66, 1), (45, 1)):
        dims = Dims(B, 4 * Hkv, Hkv, 1, 1024, 128, 0)
        assert decode_splits(dims, 128, 132, pairs=True) == 2, (B, Hkv)
    assert decode_splits(Dims(8, 32, 8, 1, 1024, 128, 0), 128, 132) == 4  # no pairs: 4
    assert decode_splits(Dims(44, 4, 1, 1, 1024, 128, 0), 128, 132, pairs=True) == 6  # 132 // 44
    assert decode_splits(Dims(4, 32, 8, 1, 1024, 128, 0), 128, 132, pairs=True) == 8
    assert decode_splits(Dims(16, 32, 8, 1, 1024, 128, 0), 128, 132, pairs=True) == 2
    assert decode_splits(Dims(8, 32, 8, 1, 190, 128, 0), 128, 132, pairs=True) == 1  # 3 tiles
    a = attrs()
    p = plan(a, Dims(8, 32, 8, 1, 1024, 128, 0), BF16, 132, dec(), cc=(9, 0))
    assert (p.splits, p.cluster, p.workspace, p.warp_ring) == (2, 2, 0, True)
    p = plan(a, Dims(8, 32, 8, 1, 1024, 128, 0), BF16, 132, dec(dec_merge="last"), cc=(9, 0))
    assert (p.splits, p.cluster, p.warp_ring) == (4, 0, False)
    p = plan(a, Dims(8, 32, 8, 1, 1024, 128, 0), BF16, 132, dec(), cc=(8, 0))
    assert (p.splits, p.cluster, p.warp_ring) == (4, 0, False)
    # the ring follows the grid: at most one CTA per SM
    assert plan(a, Dims(16, 32, 8, 1, 1024, 128, 0), BF16, 132, dec(),
                cc=(9, 0)).warp_ring is False  # 256 CTAs
    d = Dims(8, 32, 8, 1, 4097, 128, 0)
    assert plan(a, d, BF16, 132, dec(num_splits=2)).warp_ring is True  # 128 CTAs, memory merge
    assert plan(a, d, BF16, 132, dec(num_splits=3)).warp_ring is False  # 192 CTAs


def test_num_splits_forced_and_clamped():
    a = attrs()
    d = Dims(1, 32, 8, 1, 4097, 128, 0)
    assert plan(a, d, BF16, 132, dec(num_splits=3)).splits == 3
    assert plan(a, d, BF16, 132, dec(num_splits=1000)).splits == DEC_MAX_SPLITS
    p = plan(a, d, BF16, 132, dec(num_splits=1))
    assert (p.splits, p.workspace) == (1, 0)


H100 = (9, 0)


def clusters(*sizes: int) -> AttentionConfig:
    """Plan as if the decode cluster builds were ``sizes`` (the kernel takes up to 8)."""
    return AttentionConfig(dec_clusters=sizes)


def test_cluster_merge_plan():
    assert DEC_CLUSTERS == (2,)  # pairs only: 4 and 8 do not fit one wave (NOTES.md)
    a, d = attrs(), Dims(16, 32, 8, 1, 1024, 128, 0)  # B 16: 2 splits
    p = plan(a, d, BF16, 132, dec(), cc=H100)
    assert (p.splits, p.cluster, p.workspace, p.ws_ml, p.ws_cnt) == (2, 2, 0, 0, 0)
    assert plan(a, d, BF16, 132, dec(dec_merge="cluster"), cc=H100) == p
    assert plan(a, d, BF16, 132, cc=H100) == p  # auto
    for cc in (None, (8, 0), (8, 9)):  # no clusters before compute capability 9.0
        q = plan(a, d, BF16, 132, dec(), cc=cc)
        assert q.cluster == 0 and q.workspace == decode_layout(512, 128, 2, 128)[2]
        with pytest.raises(KernelError, match="compute capability"):
            plan(a, d, BF16, 132, dec(dec_merge="cluster"), cc=cc)
    q = plan(a, d, BF16, 132, dec(dec_merge="last"), cc=H100)
    assert q.cluster == 0 and q.workspace == decode_layout(512, 128, 2, 128)[2]
    # the bench rows (B 8) take pairs (test_decode_splits_pairs); B 4 (8 splits) merges
    # through memory
    q = plan(a, Dims(8, 32, 8, 1, 8192, 128, 0), BF16, 132, cc=H100)
    assert (q.splits, q.cluster, q.workspace) == (2, 2, 0)
    q = plan(a, Dims(4, 32, 8, 1, 8192, 128, 0), BF16, 132, cc=H100)
    assert (q.splits, q.cluster) == (8, 0) and q.workspace > 0
    # the cluster sizes; other split counts merge through memory (forced: refused)
    for splits in range(1, 12):
        q = plan(a, d, BF16, 132, dec(num_splits=splits), cc=H100)
        assert q.cluster == (splits if splits in DEC_CLUSTERS else 0)
        assert (q.workspace == 0) == (q.cluster > 0 or splits == 1)
        if splits not in DEC_CLUSTERS:
            with pytest.raises(KernelError, match="splits" if splits > 1 else "one split"):
                plan(a, d, BF16, 132, dec(num_splits=splits, dec_merge="cluster"), cc=H100)
    # prefill never clusters
    assert plan(a, Dims(1, 32, 8, 512, 8192, 128, 0), BF16, 132, cc=H100).path == "wg"
    with pytest.raises(ValueError, match="dec_merge"):
        plan(a, d, BF16, 132, AttentionConfig(dec_merge="atomic"), cc=H100)


def test_cluster_receive_area_bound():
    """Rank 0 receives splits x G·Sq rows of D f32 after its merge scratch (the kernel's bound;
    with pairs every build fits 16 rows of its full head dim)."""
    cc = H100
    full = Dims(1, 16, 1, 1, 8192, 256, 0)     # 16 packed rows of D 256
    assert dec_cluster_reason(full, 256, 2, cc) is None
    assert "ring" in dec_cluster_reason(Dims(1, 16, 1, 1, 8192, 128, 0), 128, 8, cc, clusters(2, 8))
    assert dec_cluster_reason(Dims(1, 15, 1, 1, 8192, 128, 0), 128, 8, cc, clusters(2, 8)) is None
    assert "cluster builds: 2" in dec_cluster_reason(Dims(1, 15, 1, 1, 8192, 128, 0), 128, 8, cc)
    for dp, (nwarps, stages) in DEC_TILES.items():  # the formula is the kernel's bound
        ring = stages * 2 * 16 * nwarps * (dp + 8) * 2
        scratch = nwarps * 16 * (dp + 8) + 2 * nwarps * 16 + 16 * (DEC_MAX_SPLITS + 1)
        for rows in (1, 4, 16):
            for c in (2, 4, 8):
                d = Dims(1, rows, 1, 1, 4096, dp, 0)
                fits = (scratch + c * rows * (dp + 2)) * 4 <= ring
                assert fits or c > 2
                assert (dec_cluster_reason(d, dp, c, cc, clusters(c)) is None) == fits


def test_dec_merge_validated():
    with pytest.raises(ValueError, match="dec_merge"):
        AttentionKernel(SimpleNamespace(), node(), AttentionConfig(dec_merge="global"))
    with pytest.raises(ValueError, match="dec_merge"):
        attention.AttentionFactory(SimpleNamespace(), AttentionConfig(dec_merge=""))
    f = attention.AttentionFactory(SimpleNamespace(), AttentionConfig(dec_merge="last"))
    assert f.create(node()).config.dec_merge == "last"


def test_decode_layout():
    assert decode_layout(32, 128, 1, 8) == (0, 0, 0)
    ml, cnt, total = decode_layout(32, 128, 4, 8)
    _, ml0, t0 = split_layout(32, 128, 4)
    assert ml == ml0 and cnt == -(-t0 // 256) * 256 and total == cnt + 256
    ml, cnt, total = decode_layout(3, 8, 5, 300)  # 1200 bytes of counters
    assert cnt % 256 == 0 and total == cnt + 1280


def test_workspace_requirement(single):
    k = AttentionKernel(SimpleNamespace(capabilities=SimpleNamespace(sm_count=132)), node(), single)
    meta = [TensorMetadata(BF16, (8, 32, 1, 128)), TensorMetadata(BF16, (8, 8, 8192, 128)),
            TensorMetadata(BF16, (8, 8, 8192, 128))]
    req = k.workspace_requirement(meta)
    assert req.nbytes == decode_layout(8 * 32, 128, 4, 64)[2] and req.alignment == 256
    # unsplit: no workspace
    meta = [TensorMetadata(BF16, (8, 32, 1, 128)), TensorMetadata(BF16, (8, 8, 100, 128)),
            TensorMetadata(BF16, (8, 8, 100, 128))]
    assert k.workspace_requirement(meta).nbytes == 0


def test_shared_memory_two_ctas_per_sm():
    # H100/H200: 228 KiB per SM, 1 KiB reserved per CTA, 227 KiB opt-in per CTA; the decode
    # builds' static shared memory is 272 bytes.
    for dp, (nwarps, stages) in DEC_TILES.items():
        smem = dec_smem_bytes(dp)
        assert smem == 16 * (dp + 8) * 2 + stages * 2 * 16 * nwarps * (dp + 8) * 2
        assert 2 * (smem + 272 + 1024) <= 228 * 1024, (dp, smem)
        assert smem + 272 <= 163 * 1024  # A100 opt-in: one CTA per SM there
        # the merge scratch (f32 per-warp O, max, sum, split weights) fits in the ring
        ring = stages * 2 * 16 * nwarps * (dp + 8) * 2
        merge = 4 * (nwarps * 16 * (dp + 8) + 2 * nwarps * 16 + 16 * (DEC_MAX_SPLITS + 1))
        assert merge <= ring
        # Little's law: (stages - 1) tiles of K and V in flight per CTA, two CTAs per SM
        assert 2 * (stages - 1) * 2 * 16 * nwarps * dp * 2 >= 64 * 1024


def test_variants_listed():
    dec = [v for v in attention.compile_variants() if "attn_decode" in v.entries]
    assert len(dec) == 2 * len(DEC_TILES) * (1 + len(DEC_CLUSTERS))
    for v in dec:
        c = v.defines.get("DEC_CLUSTER", 0)
        assert c in (0, *DEC_CLUSTERS)
        assert v.file == "attention_fused_tc.cu" and v.min_arch == (90 if c else 80)
        assert v.defines["BLOCK_N"] == 16 * v.defines["NWARPS"]


# ------------------------------------------------------------------ compiles and launches
# A bounded subset (tests/test_attention_cpu.py compiles every variant for both targets).
_COMPILE = [(BF16, 128, "sm_90", 0), (BF16, 128, "sm_80", 0), (F16, 256, "sm_80", 0),
            (F16, 80, "sm_90", 0), (BF16, 64, "sm_90", 0), (BF16, 128, "sm_90", 2),
            (F16, 256, "sm_90", 2), (F16, 64, "sm_90", 8)]
_PARAM_RE = re.compile(r"\.param\s+\.(\w+)")


@pytest.fixture(scope="module")
def ptx():
    """PTX of the bf16 D128 decode build (sm_90), for the launch checks."""
    v = builds.dec_variant(BF16, 128)
    r = compiler.compile_source(_common.source(v.file), v.file, "sm_90", v.options,
                                _common.headers())
    return r.ptx.decode()


@pytest.mark.parametrize("dt,dp,arch,cluster", _COMPILE,
                         ids=lambda x: getattr(x, "name", str(x)))
def test_decode_build_compiles_without_spills(dt, dp, arch, cluster):
    v = builds.dec_variant(dt, dp, cluster)
    r = compiler.compile_source(_common.source(v.file), v.file, arch,
                                v.options + ("--ptxas-options=-v",), _common.headers())
    assert b".entry attn_decode(" in r.ptx
    # the cluster shape is the kernel's (the launch passes none); memory builds use none
    assert (f".reqnctapercluster 1, {cluster}, 1".encode() in r.ptx) == bool(cluster)
    assert (b"barrier.cluster" in r.ptx) == bool(cluster)
    spills = [ln for ln in r.log.splitlines() if "spill stores" in ln]
    assert spills and all(" 0 bytes spill stores" in ln for ln in spills), r.log
    m = re.search(r"Used (\d+) registers", r.log)
    assert m and int(m.group(1)) * 32 * DEC_TILES[dp][0] * 2 <= 65536  # two CTAs per SM


class FakeRt:
    """Records launches/memsets/allocations; checks args against the decode PTX."""

    def __init__(self, ptx: str, capturing: bool = False, cc=None) -> None:
        start = ptx.index(".entry attn_decode(")
        self.types = _PARAM_RE.findall(ptx[start:ptx.index(")", start)])
        self.capabilities = SimpleNamespace(sm_count=132, max_shared_per_block_optin=232448,
                                            compute_capability=cc)
        self.options: list[tuple] = []
        self.capturing = capturing
        self.launches: list[tuple] = []
        self.memsets: list[tuple] = []
        self.live: set[int] = set()
        self.next = 0x7F0000000

    def nvrtc_function(self, module, source, entry, options=(), *, headers=None, arch=None):
        self.options.append(tuple(options))
        return SimpleNamespace(name=entry)

    def launch(self, fn, grid, block, args, shared_mem=0):
        if fn.name == "attn_decode":
            assert len(args) == len(self.types)
            for a, t in zip(args, self.types):
                if t == "f32":
                    assert type(a) is np.float32
                elif t in ("u32", "s32", "b32"):
                    assert type(a) is np.int32
                else:
                    assert type(a) in (int, np.int64)
            assert block[0] <= 128 and shared_mem <= 232448
        assert 1 <= grid[1] <= 65535
        self.launches.append((fn.name, grid, block, shared_mem, args))

    def memset(self, ptr, value, nbytes):
        self.memsets.append((ptr, value, nbytes))

    def is_capturing(self):
        return self.capturing

    def alloc_raw(self, n):
        assert not self.capturing
        self.next += 1 << 20
        self.live.add(self.next)
        return self.next

    def free_raw(self, p):
        self.live.remove(p)

    def synchronize(self):
        pass


def _views(B=8, H=32, Hkv=8, Sq=1, Sk=8192, D=128, dt=BF16, qptr=0x10000):
    # K, V and the output in ranges of their own: an output may not overlap an input.
    ins = [TensorView(qptr, dt, (B, H, Sq, D)), TensorView(1 << 36, dt, (B, Hkv, Sk, D)),
           TensorView(2 << 36, dt, (B, Hkv, Sk, D))]
    return ins, TensorMut(3 << 36, dt, (B, H, Sq, D))


def test_one_launch_and_counter_pool(ptx):
    rt = FakeRt(ptx)
    k = AttentionKernel(rt, node(), dec())
    ins, out = _views()
    req = k.workspace_requirement([t.meta for t in ins])
    ws = WorkspaceView(0x100000000, req.nbytes)
    k.execute(ins, [out], ws)
    assert [x[0] for x in rt.launches] == ["attn_decode"]
    _, grid, block, smem, args = rt.launches[0]
    assert grid == (64, 4, 1) and block == (128, 1, 1) and smem == dec_smem_bytes(128)
    p = k.last_plan
    assert args[5] == ws.ptr and args[6] == ws.ptr + p.ws_ml
    pool = args[-2]
    assert int(args[-1]) == 0  # 256 CTAs, two per SM: the CTA ring
    assert pool in rt.live and rt.memsets == [(pool, 0, 4096)]  # zeroed once
    k.execute(ins, [out], ws)
    assert rt.launches[1][4][-2] == pool and len(rt.memsets) == 1  # no memset on replays
    rt.capturing = True
    k.execute(ins, [out], ws)
    assert rt.launches[2][4][-2] == pool and len(rt.memsets) == 1
    rt.capturing = False
    k.close()
    assert not rt.live


def test_cluster_merge_launch(ptx):
    """Compute capability 9.0, 2 splits (B 16): the DEC_CLUSTER=2 build, no partials, no
    counters, no pool, no memset, no workspace (eager, capturing, and with a workspace passed
    anyway)."""
    rt = FakeRt(ptx, cc=(9, 0))
    k = AttentionKernel(rt, node(), dec())
    ins, out = _views(B=16, Sk=1024)
    assert k.workspace_requirement([t.meta for t in ins]).nbytes == 0
    k.execute(ins, [out], None)
    rt.capturing = True
    k.execute(ins, [out], WorkspaceView(0x100000000, 4096))
    for name, grid, block, smem, args in rt.launches:
        assert (name, grid, block, smem) == ("attn_decode", (128, 2, 1), (128, 1, 1),
                                             dec_smem_bytes(128))
        assert args[5] == 0 and args[6] == 0 and args[-2] == 0 and int(args[-3]) == 2
        assert int(args[-1]) == 0  # 256 CTAs: the CTA ring
    assert any("-DDEC_CLUSTER=2" in o for o in rt.options[0])
    assert k.last_plan.cluster == 2 and not rt.memsets and not rt.live
    assert not k._cnt_pool.ptr
    # dec_merge="last" on the same device: the memory build with its counters
    rt.capturing = False
    m = AttentionKernel(rt, node(), dec(dec_merge="last"))
    req = m.workspace_requirement([t.meta for t in ins])
    m.execute(ins, [out], WorkspaceView(0x100000000, req.nbytes))
    assert not any(o.startswith("-DDEC_CLUSTER") for o in rt.options[-1])
    assert rt.launches[-1][4][-2] != 0 and m.last_plan.cluster == 0
    m.close()


def test_pairs_launch_warp_ring(ptx):
    """B 8 x Hkv 8 on compute capability 9.0: two splits in cluster pairs, 128 CTAs, the
    per-warp ring; the memory merge of the same call keeps four splits and the CTA ring."""
    rt = FakeRt(ptx, cc=(9, 0))
    k = AttentionKernel(rt, node(), dec())
    ins, out = _views(B=8, Sk=1024)
    assert k.workspace_requirement([t.meta for t in ins]).nbytes == 0
    k.execute(ins, [out], None)
    name, grid, _, _, args = rt.launches[-1]
    assert grid == (64, 2, 1) and args[-2] == 0 and int(args[-3]) == 2 and int(args[-1]) == 1
    assert any("-DDEC_CLUSTER=2" in o for o in rt.options[-1])
    m = AttentionKernel(rt, node(), dec(dec_merge="last"))
    req = m.workspace_requirement([t.meta for t in ins])
    m.execute(ins, [out], WorkspaceView(0x100000000, req.nbytes))
    _, grid, _, _, args = rt.launches[-1]
    assert grid == (64, 4, 1) and int(args[-1]) == 0
    m.close()
    k.close()
    assert not rt.live


def test_capture_without_pool_uses_workspace_counters(ptx):
    rt = FakeRt(ptx, capturing=True)
    k = AttentionKernel(rt, node(), dec())
    ins, out = _views(Sk=1024)
    req = k.workspace_requirement([t.meta for t in ins])
    ws = WorkspaceView(0x100000000, req.nbytes)
    k.execute(ins, [out], ws)
    p = k.last_plan
    cnt = ws.ptr + p.ws_cnt
    assert rt.memsets == [(cnt, 0, 4 * 64)] and rt.launches[0][4][-2] == cnt
    assert p.ws_cnt + 4 * 64 <= req.nbytes and not rt.live
    # the workspace mode on request (eager too)
    rt.capturing = False
    k = AttentionKernel(rt, node(), dec(counter_pool=False))
    k.execute(ins, [out], ws)
    assert len(rt.memsets) == 2 and not rt.live and rt.launches[-1][4][-2] == cnt


def test_without_workspace_runs_unsplit(ptx):
    rt = FakeRt(ptx)
    k = AttentionKernel(rt, node(), dec())
    ins, out = _views(Sk=4097)
    k.execute(ins, [out], None)
    _, grid, _, _, args = rt.launches[0]
    assert grid == (64, 1, 1) and args[-2] == 0 and args[5] == 0 and not rt.memsets
    assert int(args[-1]) == 1  # 64 CTAs, at most one per SM: the warp ring
    assert not rt.live


def test_misaligned_pointer_falls_back_to_simt(ptx):
    rt = FakeRt(ptx)
    k = AttentionKernel(rt, node(), dec())
    ins, out = _views(qptr=0x10008)
    req = k.workspace_requirement([t.meta for t in ins])
    k.execute(ins, [out], WorkspaceView(0x100000000, req.nbytes))
    assert [x[0] for x in rt.launches] == ["attn_fused_simt", "attn_combine"]
    assert k.last_plan.path == "simt" and k.last_plan.splits == 4
    # a cluster plan has no partials buffer: its simt fallback runs unsplit
    rt = FakeRt(ptx, cc=(9, 0))
    k = AttentionKernel(rt, node(), dec())
    ins, out = _views(B=16, qptr=0x10008)
    k.execute(ins, [out], None)
    assert [x[0] for x in rt.launches] == ["attn_fused_simt"]
    assert k.last_plan.splits == 1 and rt.launches[0][1][1] == 1


def test_auto_with_flag(ptx, single):
    rt = FakeRt(ptx)
    k = AttentionKernel(rt, node(causal=1, softcap=5.0, local_window_size=3000, mask=True), single)
    ins, out = _views(Sk=32768)
    ins.append(TensorView(0x50000, BF16, (8, 1, 1, 32768)))
    req = k.workspace_requirement([t.meta for t in ins])
    k.execute(ins, [out], WorkspaceView(0x100000000, req.nbytes))
    assert [x[0] for x in rt.launches] == ["attn_decode"]
    args = rt.launches[0][4]
    assert args[3] == 0x50000 and int(args[-9]) == 8  # mask pointer, mask planes
    assert int(args[-8]) == 1 and int(args[-7]) == 3000  # causal, window
    assert float(args[-5]) == 5.0 and int(args[-4]) == 1  # softcap, row tiles
    k.close()
