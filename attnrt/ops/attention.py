"""``pkg.nxrt::Attention``: scaled-dot-product / grouped-query attention.

``O = softmax(softcap(scale · Q Kᵀ) + mask, keys) · V`` with Q [B, H, Sq, D], K and V
[B, Hkv, Sk, D], an optional additive mask of Q's dtype holding 1, B or B·H [Sq, Sk] planes,
and the output [B, H, Sq, D]; f32, f16, bf16. Query i sits at position ``p = Sk - Sq + i``
(bottom-right alignment); with ``causal`` it sees keys ``j <= p``, with
``local_window_size = w >= 0`` keys with ``p - j <= w``. A row that sees no key gives zeros.
Head ``h`` reads KV head ``h // (H / Hkv)``; K and V are never expanded.

Paths
-----
``tc``
    Fused, tensor cores (f16/bf16; ``cuda/attention_fused_tc.cu``): FlashAttention-2 style,
    64 packed query rows per CTA, mma.sync + ldmatrix + double-buffered cp.async, online
    softmax in registers. Needs D % 8 == 0, D <= 256, 16-byte aligned pointers and B/H/S
    strides that are multiples of 8 elements.
``simt``
    Fused, CUDA cores, fp32 math (``cuda/attention_fused_simt.cu``): the f32 path, and the
    f16/bf16 fallback for what ``tc`` cannot read. Any D <= 256, any strides.
``wg``
    Fused, Hopper warpgroup MMA (f16/bf16, D = 64 or 128, compute capability 9.0 only;
    ``cuda/attention_wg.cu``, compiled for sm_90a): 128 packed query rows per work item as two
    consumer warpgroups of 64 fed by a producer warpgroup (cp.async into mbarrier-guarded
    K/V rings), wgmma for S = Q Kᵀ (both operands from 128-byte-swizzled shared memory) and
    O += P V (P from registers), the two consumers ping-ponging the tensor cores; the same
    row packing, masking, split-KV partials and parameters as ``tc``. The shipped builds are
    persistent (at most one CTA per SM looping over the work items); which schedule and how
    many keys per tile a call gets is :func:`wg_build` (``WG_BUILD``, ``WG_CAUSAL``,
    ``WG_LONG``: measured per head dim, causal or not, and Sk). Forced with ``path="wg"``;
    ``auto`` takes it for prefill (module flag ``WG_DEFAULT``, on since the H200 sweep:
    1.36-1.47x ``tc`` on every bf16 prefill row of ``tools/sweep_attention.py``).
``decode``
    Single-kernel decode (f16/bf16, tensor-core-readable layout, at most ``DEC_MAX_ROWS`` =
    16 packed query rows G·Sq; ``cuda/attention_fused_tc.cu`` built with ``DEC_STAGES``):
    one 16-row mma block per CTA, every warp on its own 16 keys of each tile with its own
    online softmax, a ``DEC_TILES`` stages-deep cp.async ring (per warp, all stages in flight,
    when the grid has at most one CTA per SM; else per CTA), warps merged in shared memory,
    and split-KV merged in-kernel by the last CTA of each row tile (an atomic counter per
    (batch, kv head); fixed split order, so results are bitwise reproducible). One launch per
    call. Masks, softcap, causal and window as ``tc``. ``auto`` takes it for such calls when
    the module flag ``DECODE_PATH`` is ``"single"`` (``"tc"``: the mma.sync kernel + split-KV
    + ``attn_combine``, the measured route); ``path="decode"`` forces it. On compute
    capability 9.0+, when the split count is a cluster size of ``DEC_CLUSTERS`` (2), the
    split CTAs of a row tile form one thread-block cluster instead and merge through
    distributed shared memory (``dec_merge="cluster"``, the default there, see
    :func:`dec_cluster_reason`): no partials, counters or workspace, the same bits.
``unfused``
    ``S = scale · Q Kᵀ`` (f32) into the workspace, a masked softmax in place, then ``P V``
    (``cuda/attention_gemm.cu``, ``cuda/attention_rows.cu``). Any D.

GQA packing: the G = H / Hkv heads that share a KV head run in the same CTAs, row r of
the G·Sq packed rows being query r // G of head r % G, so decode (Sq = 1) still has G rows.

Split-KV: when the fused grid has fewer CTAs than the GPU has SMs (decode, small batches)
the key range is split over ``splits`` CTAs per row tile; each writes an unnormalised f32
partial O plus (max, sum) per row into the workspace and ``attn_combine`` merges them. That
partial buffer is the fused path's only workspace: ``workspace_requirement`` is NONE for
every fused call that does not split (all prefill shapes that fill the GPU) and exactly
``split_layout(...)`` bytes otherwise. Called without a workspace, the fused path does not
split (correct, slower; never allocates), so it is capture-safe either way.

Decode split counters (the memory merge, ``dec_merge="last"``): a CTA arrives on its row
tile's counter and the last one merges; the counters must be zero at launch and the merging
CTA re-arms them. They live in a small pool owned by the kernel (allocated and zeroed by the
first eager split call, freed by :meth:`AttentionKernel.close`), so graph replays need no
memset; a call that has no pool yet while capturing uses the tail of the workspace instead
and clears it with a memset first.

Path choice (``path="auto"``)
-----------------------------
1. D > 256 → ``unfused`` (the only path for such head dims).
1b. with ``WG_DEFAULT`` (on): compute capability 9.0, f16/bf16, D in (64, 128),
   tensor-core-readable layout and at least ``WG_MIN_ROWS`` packed query rows (prefill) →
   ``wg``.
1c. with ``DECODE_PATH == "single"``: f16/bf16, D % 8 == 0, tensor-core-readable layout and
   G·Sq <= ``DEC_MAX_ROWS`` → ``decode``.
2. f16/bf16 with D % 8 == 0 and tensor-core-readable strides/pointers → ``tc``.
3. otherwise → ``simt``.
The fused paths read Q, K, V once per row tile and write O once, while ``unfused`` writes and
reads B·H·Sq·Sk f32 scores three times and launches three kernels, so at every shape where a
fused kernel applies it moves less memory: fused is never slower by construction, and the
benchmarks (``tools/bench_attention.py``, row "nxrt-unfused") record the measured margin.
``path="fused"`` forces the fused kernels (``tc`` where possible, else ``simt``),
``path="simt"`` the CUDA-core fused kernel, ``path="wg"`` the wgmma kernel, ``path="decode"``
the single-kernel decode (each a :class:`KernelError` where it does not apply; a pointer that
is not 16-byte aligned at execute time falls back to ``simt`` as ``tc`` does),
``path="unfused"`` the three-kernel path; ``num_splits`` forces the split count (tests of the
combine step).

Capture: no path allocates, frees or synchronizes while the stream is capturing. The unfused
path needs the executor's workspace then (without one it is a :class:`CaptureError`; eager
calls without one allocate a buffer, synchronize and free it).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnrt.runtime.api import (
    CaptureSupport,
    DataType,
    Node,
    TensorMetadata,
    TensorMut,
    TensorView,
    WorkspaceRequirement,
    WorkspaceView,
)
from attnrt.runtime.errors import CaptureError, KernelError

from ._common import CTYPE, ScratchPool, Variant, check_workspace, get_function

__all__ = ["AttentionFactory", "AttentionKernel", "Attrs", "Dims", "Plan", "compile_variants",
           "parse_attributes", "check_dims", "plan", "split_layout", "unfused_layout",
           "choose_splits", "tc_head_dim", "tc_smem_bytes", "simt_smem_bytes", "wg_smem_bytes",
           "wg_reason", "WG_DEFAULT", "DECODE_PATH", "decode_reason", "decode_splits",
           "decode_layout", "dec_smem_bytes", "dec_cluster_reason", "DEC_CLUSTERS", "DEC_MERGES"]

OP = "pkg.nxrt::Attention"
DOMAIN, OP_TYPE = "pkg.nxrt", "Attention"
SUPPORTED = (DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16)
INPUT_NAMES = ("Q", "K", "V", "mask")
WS_ALIGN = 256
PATHS = ("auto", "fused", "simt", "unfused", "wg", "decode")

#: ``auto`` picks the wgmma kernel for prefill on compute capability 9.0 (H200 sweep:
#: 1.36-1.47x the mma.sync kernel, 0.83-1.0x torch's flash backend).
WG_DEFAULT = True
#: wgmma build per head dim: (schedule NXRT_WG_SCHED, keys per tile, min resident CTAs per SM).
#: Schedules (cuda/attention_wg.cu): 0 = S, softmax, PV in turn, 64-key tiles, 256 threads;
#: 1 = FA3-style overlap inside each warpgroup; 2 = 1 with 128-key tiles; 3 = 2 with a 3-stage
#: ring; 4 = warp-specialized: a producer warpgroup fills an mbarrier ring (setmaxnreg
#: 40/232), two consumer warpgroups run schedule 2's loop and ping-pong on named barriers
#: (384 threads, one CTA per SM); 5 = 4 with a 3-stage ring; 6 = 4 as a persistent kernel (one
#: CTA per SM looping over the work items: the producer streams the next item's Q and first
#: tiles under the consumers' last P V and store); 7 = 6 with the items dealt longest first in
#: snake order (causal balance). H200 sweeps (2026-11-30, benchmarks/NOTES.md, round 5): 6 is
#: 3-9 % faster than 4 at D128 without causal masking and 2-3 % slower at D64; 7 is 2-10 %
#: faster than 4 under causal masking (and 6-9 % slower than 6 without: its CTAs spread over
#: all heads, and L2 keeps fewer K/V rows). Calls without causal masking use WG_BUILD's
#: schedule, causal ones WG_CAUSAL's (schedule, keys per tile; min blocks as WG_BUILD). Keys
#: per tile: 128, or 176 (FA3's non-causal tile; schedules 4-7): fewer ping-pong turns, waits
#: and max/sum reductions per key, one more partial tile when Sk is no multiple of 176. H200
#: sweep: 176 is +5-9 % at D64 (every S) and at D128 +2-3 % at S8192, -2 % at S1024 and
#: S4096, hence WG_LONG: non-causal calls at D128 with Sk >= 8192 take 176-key tiles.
WG_BUILD: dict[int, tuple[int, int, int]] = {64: (6, 176, 1), 128: (6, 128, 1)}
WG_CAUSAL: dict[int, tuple[int, int]] = {64: (7, 128), 128: (7, 128)}
#: Non-causal calls with at least ``min_sk`` keys: head dim -> (min_sk, keys per tile).
WG_LONG: dict[int, tuple[int, int]] = {128: (8192, 176)}
WG_ROWS = 128
#: Cap on the CTAs of a persistent wgmma launch (None: one per SM). The GPU tests set it low
#: so that every CTA loops over many work items.
WG_MAX_CTAS: int | None = None
#: ``auto`` uses ``wg`` from this many packed query rows (G·Sq) on: a prefill shape.
WG_MIN_ROWS = 128

#: Tensor-core builds: padded head dim -> (warps per CTA, keys per tile). 16 rows per warp.
TC_TILES: dict[int, tuple[int, int]] = {64: (4, 64), 80: (4, 64), 128: (4, 64), 256: (4, 32)}
SIMT_DMAX = 256
SIMT_ROWS, SIMT_KEYS, SIMT_THREADS = 32, 32, 256
MAX_SPLITS = 64
_I32 = 2**31 - 1
_POS_MAX = 2**31 - 256  # int32 positions and row indices, with room for one tile past the end


#: ``auto`` for decode-sized calls (G·Sq <= DEC_MAX_ROWS): ``"single"`` = the one-launch decode
#: kernel (in-kernel split merge), ``"tc"`` = the mma.sync kernel + split-KV + ``attn_combine``.
#: H200 sweep (tools/sweep_attention_decode.py, bf16 D128 B8 H32/8): "single" 16.8 / 77.4 /
#: 272.9 us at Sk 1k / 8k / 32k against 21.8 / 81.5 / 283.4 for "tc".
DECODE_PATH = "single"
#: Decode builds: padded head dim -> (warps per CTA, cp.async ring stages). Keys per tile are
#: 16 per warp; shared memory (dec_smem_bytes) stays under 110 KiB so two CTAs fit an H100/H200
#: SM. Tiles in flight per CTA: ``stages`` with the per-warp ring (``Plan.warp_ring``, grids of
#: at most one CTA per SM), ``stages - 1`` with the CTA ring (two CTAs per SM).
DEC_TILES: dict[int, tuple[int, int]] = {64: (4, 4), 80: (4, 4), 128: (4, 3), 256: (2, 3)}
DEC_MAX_ROWS = 16         # packed query rows G·Sq of one CTA (one mma row block)
DEC_MAX_SPLITS = 64       # as DEC_MAX_SPLITS in attention_fused_tc.cu (weights in shared memory)
DEC_CTAS_PER_SM = 2       # resident decode CTAs per SM (H100/H200 shared memory)
DEC_MIN_TILES = 2         # key tiles per split at least (a split costs a partial and a merge)
#: Cluster sizes of the decode builds whose split CTAs merge through distributed shared memory
#: (compute capability 9.0+, build ``DEC_CLUSTER``): a decode plan whose split count is one of
#: these takes that merge unless ``dec_merge="last"``. Only pairs: a cluster's CTAs must be
#: co-resident, and on the H200 the driver places at most 62 clusters of 4 and 30 of 8 of
#: this kernel (2 CTAs per SM, 264 slots) but 132 of 2, so the grids ``decode_splits`` sizes
#: for 4 and 8 splits (64 x 4, 32 x 8 CTAs) would run a second wave: 1.4x / 1.2x slower at
#: Sk 8k in tools/sweep_attention_decode.py (NOTES.md). The kernel takes any size up to 8.
DEC_CLUSTERS = (2,)
#: ``dec_merge`` values: ``auto`` (cluster where :func:`dec_cluster_reason` allows, else the
#: last-arriving CTA through memory), ``last`` (always through memory), ``cluster`` (forced).
DEC_MERGES = ("auto", "last", "cluster")


# --------------------------------------------------------------------------- attributes
def _f32_finite(x: float) -> bool:
    # The kernels take float32 scalars: 1e39 is finite in Python and inf on the device.
    with np.errstate(over="ignore"):
        return math.isfinite(x) and bool(np.isfinite(np.float32(x)))


@dataclass(frozen=True)
class Attrs:
    """The node's attributes, validated."""

    num_heads: int
    kv_num_heads: int
    causal: bool
    scale: float | None  # None: 1/sqrt(D)
    softcap: float
    local_window_size: int


def parse_attributes(node: Node) -> Attrs:
    """Read and validate the attributes of an Attention node.

    Raises
    ------
    KernelError
        An attribute is missing, mistyped or out of range; the message names it.
    """
    def get(kind: str, name: str, default: Any = None) -> Any:
        try:
            return (node.attr_int if kind == "int" else node.attr_float)(
                name, *(() if default is None else (default,)))
        except (TypeError, ValueError) as exc:
            raise KernelError(f"{OP}: attribute {name!r}: {exc}") from None

    num_heads = get("int", "num_heads")
    if num_heads <= 0:
        raise KernelError(f"{OP}: attribute 'num_heads' = {num_heads}; expected a positive int")
    kv = get("int", "kv_num_heads", num_heads)
    if kv <= 0 or num_heads % kv:
        raise KernelError(f"{OP}: attribute 'kv_num_heads' = {kv}; expected a positive divisor "
                          f"of num_heads = {num_heads}")
    causal = get("int", "causal", 0)
    if causal not in (0, 1):
        raise KernelError(f"{OP}: attribute 'causal' = {causal}; expected 0 or 1")
    scale = get("float", "scale", math.nan) if node.has("scale") else None
    if scale is not None and not (_f32_finite(scale) and np.float32(scale) > 0):
        raise KernelError(f"{OP}: attribute 'scale' = {scale}; expected a value > 0 that is finite "
                          "in float32 (omit it for 1/sqrt(head_dim))")
    softcap = get("float", "softcap", 0.0)
    if not (_f32_finite(softcap) and softcap >= 0):
        raise KernelError(f"{OP}: attribute 'softcap' = {softcap}; expected a value >= 0 that is "
                          "finite in float32 (0 disables it)")
    window = get("int", "local_window_size", -1)
    if window < -1:
        raise KernelError(f"{OP}: attribute 'local_window_size' = {window}; expected -1 "
                          "(disabled) or a window >= 0")
    return Attrs(num_heads, kv, bool(causal), scale, softcap, window)


# --------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class Dims:
    """Problem sizes: batch, heads, kv heads, query/key lengths, head dim, mask planes."""

    B: int
    H: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    mask_planes: int  # 0: no mask

    @property
    def group(self) -> int:
        return self.H // self.Hkv

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.B, self.H, self.Sq, self.D)

    @property
    def empty(self) -> bool:
        return self.B * self.H * self.Sq * self.D == 0


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def check_dims(attrs: Attrs, q: Sequence[int], k: Sequence[int], v: Sequence[int],
               mask: Sequence[int] | None = None, out: Sequence[int] | None = None) -> Dims:
    """Validate the shapes of Q, K, V (and the mask and output when given).

    Raises
    ------
    KernelError
        A shape does not fit; the message names the input, its shape and the expectation.
    """
    q, k, v = tuple(q), tuple(k), tuple(v)
    for name, idx, s in (("Q", 0, q), ("K", 1, k), ("V", 2, v)):
        if len(s) != 4:
            raise KernelError(f"{OP}: input {name} ({idx}) has shape {_fmt(s)} (rank {len(s)}); "
                              "expected rank 4 [batch, heads, seq, head_dim]")
    B, H, Sq, D = q
    if H != attrs.num_heads:
        raise KernelError(f"{OP}: input Q (0) has {H} heads (shape {_fmt(q)}); expected "
                          f"num_heads = {attrs.num_heads}")
    want_k = (B, attrs.kv_num_heads, k[2], D)
    if k != want_k:
        raise KernelError(f"{OP}: input K (1) has shape {_fmt(k)}; expected [B={B}, "
                          f"kv_num_heads={attrs.kv_num_heads}, Sk, D={D}]")
    Sk = k[2]
    if v != k:
        raise KernelError(f"{OP}: input V (2) has shape {_fmt(v)}; expected K's shape {_fmt(k)}")
    # The kernels index rows, positions and heads in int32 (offsets are 64-bit).
    for what, val in (("B", B), ("num_heads", H), ("Sq", Sq), ("Sk", Sk), ("head_dim D", D),
                      ("B*num_heads", B * H)):
        if val > _I32:
            raise KernelError(f"{OP}: {what} = {val}; expected at most 2**31-1")
    if Sq + Sk > _POS_MAX:
        raise KernelError(f"{OP}: Sq + Sk = {Sq + Sk} positions; expected at most {_POS_MAX}")
    if H // attrs.kv_num_heads * Sq > _POS_MAX:
        raise KernelError(f"{OP}: (num_heads/kv_num_heads) * Sq = "
                          f"{H // attrs.kv_num_heads * Sq} packed query rows; expected at most "
                          f"{_POS_MAX}")
    planes = 0
    if mask is not None:
        n = math.prod(mask)
        plane = Sq * Sk
        ok = (n == 0) if plane == 0 else (n % plane == 0 and n // plane in (1, B, B * H))
        if not ok:
            raise KernelError(
                f"{OP}: input mask (3) has shape {_fmt(mask)} ({n} elements); expected 1, B={B} "
                f"or B*H={B * H} planes of [Sq={Sq}, Sk={Sk}] = {plane} elements each")
        planes = n // plane if plane else 1
    dims = Dims(B, H, attrs.kv_num_heads, Sq, Sk, D, planes)
    if out is not None and tuple(out) != dims.out_shape:
        raise KernelError(f"{OP}: output 0 has shape {_fmt(out)}; expected {_fmt(dims.out_shape)}")
    return dims


# --------------------------------------------------------------------------- planning
def tc_head_dim(D: int) -> int | None:
    """The tensor-core build for head dim D (the smallest padded dim >= D), or None."""
    if D <= 0 or D % 8:
        return None
    return next((dp for dp in sorted(TC_TILES) if dp >= D), None)


def tc_smem_bytes(dp: int) -> int:
    """Dynamic shared memory of the tensor-core build ``dp`` (as in attention_fused_tc.cu)."""
    nwarps, bn = TC_TILES[dp]
    bm = 16 * nwarps
    return (bm + 4 * bn) * (dp + 8) * 2 + bm * ((bn + 4) * 4 + 8)


def wg_build(D: int, causal: bool = False, Sk: int = 0) -> tuple[int, int, int]:
    """(schedule, keys per tile, min blocks) of the wgmma build for a call at head dim D with
    Sk keys: :data:`WG_BUILD`'s; with causal masking :data:`WG_CAUSAL`'s schedule and keys
    when it names D; without, :data:`WG_LONG`'s keys from its ``min_sk`` on."""
    sched, keys, min_blocks = WG_BUILD[D]
    if causal:
        if D in WG_CAUSAL:
            sched, keys = WG_CAUSAL[D]
    elif D in WG_LONG and Sk >= WG_LONG[D][0]:
        keys = WG_LONG[D][1]
    return sched, keys, min_blocks


def wg_builds(D: int) -> list[tuple[int, int, int]]:
    """Every distinct build :func:`wg_build` may return at head dim D."""
    out: list[tuple[int, int, int]] = []
    for b in (wg_build(D), wg_build(D, True), wg_build(D, False, 1 << 62)):
        if b not in out:
            out.append(b)
    return out


def wg_keys(D: int, causal: bool = False, Sk: int = 0) -> int:
    """Keys per tile of the wgmma build for a call at head dim D."""
    return wg_build(D, causal, Sk)[1]


def wg_sched(D: int, causal: bool = False) -> int:
    """attention_wg.cu schedule of the wgmma build at head dim D (``causal``: for a call with
    causal masking, :data:`WG_CAUSAL`'s when it names one)."""
    return wg_build(D, causal)[0]


def wg_threads(D: int, causal: bool = False) -> int:
    """Threads per CTA of the wgmma build at head dim D (384 for the warp-specialized ones;
    the keys per tile never change it)."""
    return _wg_threads(wg_sched(D, causal))


def _wg_threads(sched: int) -> int:
    return 384 if sched >= 4 else 256


def wg_persistent(D: int, causal: bool = False) -> bool:
    """Whether the wgmma build at head dim D is persistent (schedules 6-7: a grid of at most
    one CTA per SM, each looping over work items)."""
    return _wg_persistent(wg_sched(D, causal))


def _wg_persistent(sched: int) -> bool:
    return sched >= 6


def wg_grid(items: int, sm_count: int) -> int:
    """CTAs of a persistent wgmma launch over ``items`` work items: one per SM, at most
    :data:`WG_MAX_CTAS` when that is set."""
    n = min(items, sm_count)
    if WG_MAX_CTAS is not None:
        n = min(n, WG_MAX_CTAS)
    return max(1, n)


def wg_smem_bytes(D: int, causal: bool = False, Sk: int = 0) -> int:
    """Dynamic shared memory of the wgmma kernel at head dim D (as SMEM_BYTES in
    attention_wg.cu): Q [128 x D] and 2 (3 for schedules 3 and 5) stages of K and V
    [keys x D], the mbarriers of schedules 4-7, plus 1024 bytes of slack to align the
    swizzle atoms."""
    return _wg_smem(D, wg_build(D, causal, Sk))


def _wg_smem(D: int, build: tuple[int, int, int]) -> int:
    sched, keys, _ = build
    stages = 3 if sched in (3, 5) else 2
    barriers = 256 if sched >= 4 else 0  # the producer/consumer mbarriers
    return (D // 64) * (WG_ROWS * 128 + 2 * stages * keys * 128) + barriers + 1024


def wg_reason(dims: Dims, dtype: DataType, tc_ok: bool, cc: tuple[int, int] | None) -> str | None:
    """Why the wgmma kernel cannot run this call (None: it can)."""
    if cc is not None and tuple(cc) != (9, 0):
        return f"compute capability {tuple(cc)} (wgmma/sm_90a needs exactly 9.0)"
    if dtype == DataType.FLOAT:
        return "dtype FLOAT (wgmma takes f16/bf16)"
    if dims.D not in WG_BUILD:
        return f"head_dim D = {dims.D} (wgmma builds: {sorted(WG_BUILD)})"
    if not tc_ok:
        return "Q/K/V strides that are not multiples of 8 elements (16-byte rows)"
    return None


def _dec_ring_bytes(dp: int) -> int:
    """The decode build's K/V ring (DEC_RING_BYTES): ``stages`` tiles of K and V."""
    nwarps, stages = DEC_TILES[dp]
    return stages * 2 * 16 * nwarps * (dp + 8) * 2


def dec_smem_bytes(dp: int) -> int:
    """Dynamic shared memory of the decode build ``dp`` (as DEC_SMEM_BYTES in
    attention_fused_tc.cu): the 16-row Q tile plus ``stages`` tiles of K and V."""
    return 16 * (dp + 8) * 2 + _dec_ring_bytes(dp)


def dec_cluster_reason(dims: Dims, dp: int, splits: int,
                       cc: tuple[int, int] | None) -> str | None:
    """Why the decode split merge of this call cannot run in a thread-block cluster (None: it
    can). Rank 0 receives every split's partial (O [splits][G·Sq][D] and (max, sum) in f32) in
    its idle K/V ring, after the warp-merge scratch (as the receive area in
    attention_fused_tc.cu)."""
    if cc is None or tuple(cc) < (9, 0):
        return f"compute capability {cc} (thread-block clusters need 9.0+)"
    if splits not in DEC_CLUSTERS:
        return f"{splits} splits (cluster builds: {', '.join(map(str, DEC_CLUSTERS))})"
    nwarps = DEC_TILES[dp][0]
    ring = _dec_ring_bytes(dp)
    # DEC_MERGE_FLOATS: per-warp O rows, per-warp (max, sum), split weights
    scratch = nwarps * 16 * (dp + 8) + 2 * nwarps * 16 + 16 * (DEC_MAX_SPLITS + 1)
    rows = dims.group * dims.Sq
    need = (scratch + splits * rows * (dims.D + 2)) * 4
    if need > ring:
        return (f"{splits} partials of {rows} rows x D {dims.D} need {need} bytes of rank 0's "
                f"{ring}-byte ring")
    return None


def decode_reason(dims: Dims, dtype: DataType, tc_ok: bool) -> str | None:
    """Why the single-kernel decode cannot run this call (None: it can)."""
    if dtype == DataType.FLOAT:
        return "dtype FLOAT (the decode kernel takes f16/bf16)"
    if tc_head_dim(dims.D) is None:
        return f"head_dim D = {dims.D} (needs D % 8 == 0 and D <= 256)"
    if not tc_ok:
        return "Q/K/V strides that are not multiples of 8 elements (16-byte rows)"
    if dims.group * dims.Sq > DEC_MAX_ROWS:
        return (f"(num_heads/kv_num_heads) * Sq = {dims.group * dims.Sq} packed query rows "
                f"(at most {DEC_MAX_ROWS})")
    return None


def decode_splits(dims: Dims, dp: int, sm_count: int, window: int = -1,
                  pairs: bool = False) -> int:
    """Key splits of the decode kernel: one wave of ``DEC_CTAS_PER_SM * sm_count`` CTAs over
    the B·Hkv row tiles, at least ``DEC_MIN_TILES`` key tiles per split (of the keys a local
    window of ``window`` >= 0 leaves visible), at most ``DEC_MAX_SPLITS``.

    ``pairs``: the call can merge two splits in a cluster (:func:`dec_cluster_reason`). Then
    row tiles that fill between half and all of the SMs once over (``sm_count // tasks ==
    2``, e.g. B 8 x Hkv 8 on 132 SMs) take two splits, one CTA per SM, instead of four at two
    per SM: measured on the H200 (bf16 D128 B8 H32/8) 13.9 vs 15.1 us per call in a graph at
    Sk 1k, 22.1 vs 23.4 at 2k, 265.7 vs 267.2 at 32k (NOTES.md, Attention round 7)."""
    nwarps, _ = DEC_TILES[dp]
    tasks = dims.B * dims.Hkv
    keys = dims.Sk if window < 0 else min(dims.Sk, window + dims.Sq + 1)
    n_tiles = -(-keys // (16 * nwarps))
    if tasks == 0 or tasks >= sm_count or n_tiles < 2 * DEC_MIN_TILES:
        return 1
    if pairs and sm_count // tasks == 2:
        return 2
    return max(1, min(DEC_CTAS_PER_SM * sm_count // tasks, n_tiles // DEC_MIN_TILES,
                      DEC_MAX_SPLITS))


def _dec_warp_ring(dims: Dims, splits: int, sm_count: int) -> bool:
    """The decode ring schedule (``Plan.warp_ring``): the per-warp ring (all stages in flight)
    for grids of at most one CTA per SM, the CTA ring for two per SM (measured, see the
    kernel's header)."""
    return dims.B * dims.Hkv * splits <= sm_count


def decode_layout(rows: int, D: int, splits: int, tasks: int) -> tuple[int, int, int]:
    """Decode workspace: (offset of f32 (m, l), offset of the u32 split counters [tasks],
    total bytes). The partials are :func:`split_layout`'s (so a ``simt`` fallback can use
    the same workspace); the counters follow. No bytes when splits == 1."""
    if splits <= 1:
        return 0, 0, 0
    _, ml, total = split_layout(rows, D, splits)
    cnt = _align(total)
    return ml, cnt, cnt + _align(4 * tasks)


def simt_smem_bytes(D: int) -> int:
    """Dynamic shared memory of the SIMT kernel at head dim D (as in attention_fused_simt.cu)."""
    kp = D | 1
    return 4 * (SIMT_ROWS * D + SIMT_KEYS * kp + SIMT_KEYS * D + 8 * 4 * SIMT_KEYS)


def _align(n: int, a: int = WS_ALIGN) -> int:
    return -(-n // a) * a


def split_layout(rows: int, D: int, splits: int) -> tuple[int, int, int]:
    """Split-KV partials: (offset of f32 O [splits, rows, D], offset of f32 (m, l)
    [splits, rows, 2], total bytes). ``rows`` = B·H·Sq. No bytes when splits == 1."""
    if splits <= 1:
        return 0, 0, 0
    ml = _align(splits * rows * D * 4)
    return 0, ml, ml + splits * rows * 2 * 4


def unfused_layout(B: int, H: int, Sq: int, Sk: int) -> tuple[int, int]:
    """Unfused scores: (offset, total bytes) of f32 S/P [B·H, Sq, Sk] (row pitch Sk)."""
    return 0, _align(B * H * Sq * Sk * 4)


#: Resident CTAs per SM of both fused kernels (registers and shared memory allow two).
CTAS_PER_SM = 2


def choose_splits(dims: Dims, rows_per_cta: int, keys_per_tile: int, sm_count: int,
                  ctas_per_sm: int = CTAS_PER_SM) -> int:
    """Key splits per row tile for a grid smaller than the GPU.

    As many splits as fit one full wave (``ctas_per_sm * sm_count`` resident CTAs) without
    starting a second, partial one, and at least two key tiles per split (a split also
    costs its partial write and the combine's read).
    """
    row_tiles = -(-dims.group * dims.Sq // rows_per_cta)
    ctas = row_tiles * dims.B * dims.Hkv
    n_tiles = -(-dims.Sk // keys_per_tile)
    if ctas == 0 or ctas >= sm_count or n_tiles < 4:
        return 1
    return max(1, min(ctas_per_sm * sm_count // ctas, n_tiles // 2, MAX_SPLITS))


def _check_fused_grid(dims: Dims) -> None:
    # Checked for the SIMT kernel's 32-row tiles (the larger grid), so that execute may
    # switch a tensor-core plan to it.
    row_tiles = -(-dims.group * dims.Sq // SIMT_ROWS)
    n_ctas = row_tiles * dims.B * dims.Hkv
    if n_ctas > _I32 or -(-dims.B * dims.H * dims.Sq // 4) > _I32:
        raise KernelError(f"{OP}: {n_ctas} row tiles (B={dims.B}, kv heads={dims.Hkv}, "
                          f"{dims.group} x Sq={dims.Sq} packed rows) exceed the fused grid "
                          "limit of 2**31-1 CTAs")


def _check_unfused_grid(dims: Dims) -> None:
    bh = dims.B * dims.H
    if bh > 65535 or -(-dims.Sq // 64) > 65535 or bh * dims.Sq > _I32:
        raise KernelError(f"{OP}: B*num_heads = {bh}, Sq = {dims.Sq} exceed the unfused path's "
                          "grid limits (B*num_heads <= 65535, Sq <= 4194240, "
                          "B*num_heads*Sq <= 2**31-1)")


@dataclass(frozen=True)
class Plan:
    """What one call runs: the path, the tensor-core build, splits, workspace bytes."""

    path: str            # "tc" | "wg" | "decode" | "simt" | "unfused"
    dp: int              # tensor-core (padded) head dim of "tc" / "wg" / "decode", else 0
    splits: int
    workspace: int       # bytes
    ws_ml: int = 0       # offset of the split (m, l) array in the workspace
    ws_cnt: int = 0      # "decode": offset of the split counters in the workspace
    cluster: int = 0     # "decode": CTAs per cluster of the cluster split merge (0: memory)
    warp_ring: bool = False  # "decode": per-warp K/V ring (grids of <= one CTA per SM)


def _tc_layout_ok(meta: TensorMetadata | TensorView) -> bool:
    st = meta.element_strides
    return st[3] == 1 and all(s % 8 == 0 or d == 1 for s, d in zip(st[:3], meta.shape[:3]))


def plan(attrs: Attrs, dims: Dims, dtype: DataType, sm_count: int, *, path: str = "auto",
         tc_ok: bool = True, num_splits: int | None = None,
         cc: tuple[int, int] | None = None, dec_merge: str = "auto") -> Plan:
    """Choose the path, splits and workspace for one call (pure; see the module docstring).

    ``tc_ok``: the operands' strides and pointers suit the tensor-core kernel. ``cc``: the
    device's compute capability (None: unknown; ``auto`` then never takes ``wg``, and decode
    merges splits through memory). The ``decode`` path clamps ``num_splits`` to
    ``DEC_MAX_SPLITS``; ``dec_merge`` (one of ``DEC_MERGES``) picks its split merge.

    Raises
    ------
    KernelError
        A fused path is forced on a head dim it cannot take (D > 256), ``path="wg"`` on a
        call the wgmma kernel cannot run (see :func:`wg_reason`), or ``path="decode"`` on one
        the decode kernel cannot run (see :func:`decode_reason`), or ``dec_merge="cluster"``
        on a decode call whose merge cannot run in a cluster (see :func:`dec_cluster_reason`).
    """
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if dec_merge not in DEC_MERGES:
        raise ValueError(f"dec_merge must be one of {DEC_MERGES}, got {dec_merge!r}")
    D = dims.D
    if path == "unfused" or (path == "auto" and D > SIMT_DMAX):
        _check_unfused_grid(dims)
        return Plan("unfused", 0, 1, unfused_layout(dims.B, dims.H, dims.Sq, dims.Sk)[1])
    if D > SIMT_DMAX:
        raise KernelError(f"{OP}: head_dim D = {D} with path={path!r}; the fused kernels take "
                          f"D <= {SIMT_DMAX} (use path='auto' or 'unfused')")
    _check_fused_grid(dims)
    use_wg = path == "wg"
    if use_wg:
        why = wg_reason(dims, dtype, tc_ok, cc)
        if why is not None:
            raise KernelError(f"{OP}: path='wg' cannot run this call: {why}; use path='auto'")
    elif path == "auto" and WG_DEFAULT and cc is not None:
        use_wg = (wg_reason(dims, dtype, tc_ok, cc) is None
                  and dims.group * dims.Sq >= WG_MIN_ROWS)
    if use_wg:
        splits = (max(1, int(num_splits)) if num_splits is not None
                  else choose_splits(dims, WG_ROWS, wg_keys(D, bool(attrs.causal), dims.Sk),
                                     sm_count, WG_BUILD[D][2]))
        _, ml, total = split_layout(dims.B * dims.H * dims.Sq, D, splits)
        return Plan("wg", D, splits, total, ml)
    use_dec = False
    if path == "decode":
        why = decode_reason(dims, dtype, tc_ok)
        if why is not None:
            raise KernelError(f"{OP}: path='decode' cannot run this call: {why}; use path='auto'")
        use_dec = True
    elif path == "auto" and DECODE_PATH == "single":
        use_dec = decode_reason(dims, dtype, tc_ok) is None
    if use_dec:
        dp = tc_head_dim(D)
        assert dp is not None  # decode_reason checked it
        w = attrs.local_window_size
        pairs = dec_merge != "last" and dec_cluster_reason(dims, dp, 2, cc) is None
        splits = (min(max(1, int(num_splits)), DEC_MAX_SPLITS) if num_splits is not None
                  else decode_splits(dims, dp, sm_count, -1 if w < 0 or w >= dims.Sk else w,
                                     pairs))
        wring = _dec_warp_ring(dims, splits, sm_count)
        if dec_merge != "last" and splits > 1:
            why = dec_cluster_reason(dims, dp, splits, cc)
            if why is None:
                return Plan("decode", dp, splits, 0, cluster=splits, warp_ring=wring)
            if dec_merge == "cluster":
                raise KernelError(f"{OP}: dec_merge='cluster' cannot run this call: {why}")
        elif dec_merge == "cluster":
            raise KernelError(f"{OP}: dec_merge='cluster' cannot run this call: one split "
                              "(nothing to merge)")
        ml, cnt, total = decode_layout(dims.B * dims.H * dims.Sq, D, splits, dims.B * dims.Hkv)
        return Plan("decode", dp, splits, total, ml, cnt, warp_ring=wring)
    dp = tc_head_dim(D) if dtype != DataType.FLOAT and path != "simt" and tc_ok else None
    if dp is not None:
        nwarps, bn = TC_TILES[dp]
        kind, bm = "tc", 16 * nwarps
    else:
        kind, bm, bn, dp = "simt", SIMT_ROWS, SIMT_KEYS, 0
    if num_splits is not None:
        splits = max(1, int(num_splits))
    else:
        splits = choose_splits(dims, bm, bn, sm_count)
    _, ml, total = split_layout(dims.B * dims.H * dims.Sq, D, splits)
    return Plan(kind, dp, splits, total, ml)


# --------------------------------------------------------------------------- variants
def _tc_variant(dtype: DataType, dp: int) -> Variant:
    nwarps, bn = TC_TILES[dp]
    return Variant("attention_fused_tc.cu", ("attn_fused_tc",),
                   {"NXRT_T": CTYPE[dtype], "HEAD_DIM": dp, "BLOCK_N": bn, "NWARPS": nwarps})


def _wg_variant(dtype: DataType, D: int, causal: bool = False, Sk: int = 0) -> Variant:
    return _wg_build_variant(dtype, D, wg_build(D, causal, Sk))


def _wg_build_variant(dtype: DataType, D: int, build: tuple[int, int, int]) -> Variant:
    sched, keys, min_blocks = build
    defines = {"NXRT_BF16": int(dtype == DataType.BFLOAT16), "HEAD_DIM": D, "MIN_BLOCKS": min_blocks}
    if sched:
        defines["NXRT_WG_SCHED"] = sched
    if keys != (128 if sched >= 2 else 64):
        defines["NXRT_WG_BN"] = keys
    return Variant("attention_wg.cu", ("attn_fused_wg",), defines, min_arch=90, arch_suffix="a")


def _dec_variant(dtype: DataType, dp: int, cluster: int = 0) -> Variant:
    nwarps, stages = DEC_TILES[dp]
    defines: dict[str, object] = {"NXRT_T": CTYPE[dtype], "HEAD_DIM": dp, "BLOCK_N": 16 * nwarps,
                                  "NWARPS": nwarps, "DEC_STAGES": stages}
    if cluster:
        defines["DEC_CLUSTER"] = cluster  # thread-block clusters: sm_90+
    return Variant("attention_fused_tc.cu", ("attn_decode",), defines,
                   min_arch=90 if cluster else 80)


def _simt_variant(dtype: DataType) -> Variant:
    return Variant("attention_fused_simt.cu", ("attn_fused_simt",),
                   {"NXRT_T": CTYPE[dtype], "DMAX": SIMT_DMAX})


def _rows_variant(dtype: DataType) -> Variant:
    return Variant("attention_rows.cu", ("attn_softmax", "attn_combine"), {"NXRT_T": CTYPE[dtype]})


def _gemm_variant(dtype: DataType) -> Variant:
    defines: dict[str, object] = {"NXRT_T": CTYPE[dtype]}
    if dtype == DataType.FLOAT:
        defines["NXRT_F32"] = 1
    return Variant("attention_gemm.cu", ("attn_qk", "attn_pv"), defines)


def compile_variants() -> list[Variant]:
    """Every (file, defines, entries) this op may launch."""
    out = [_tc_variant(dt, dp) for dt in (DataType.FLOAT16, DataType.BFLOAT16) for dp in TC_TILES]
    for dt in SUPPORTED:
        out += [_simt_variant(dt), _rows_variant(dt), _gemm_variant(dt)]
    out += [_wg_build_variant(dt, D, b) for dt in (DataType.FLOAT16, DataType.BFLOAT16)
            for D in WG_BUILD for b in wg_builds(D)]
    out += [_dec_variant(dt, dp, c) for dt in (DataType.FLOAT16, DataType.BFLOAT16)
            for dp in DEC_TILES for c in (0, *DEC_CLUSTERS)]
    return out


# --------------------------------------------------------------------------- factory
class AttentionFactory:
    """Claims ``pkg.nxrt::Attention`` nodes and creates :class:`AttentionKernel`.

    ``path``, ``num_splits`` and ``dec_merge`` are passed to every kernel it creates (see the
    module docstring); the defaults choose by the heuristic.
    """

    def __init__(self, rt: Any, *, path: str = "auto", num_splits: int | None = None,
                 dec_merge: str = "auto") -> None:
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        if dec_merge not in DEC_MERGES:
            raise ValueError(f"dec_merge must be one of {DEC_MERGES}, got {dec_merge!r}")
        self.rt = rt
        self.path = path
        self.num_splits = num_splits
        self.dec_merge = dec_merge

    def unsupported_reason(self, node: Node, shapes: Sequence[Sequence[int] | None],
                           dtypes: Sequence[DataType | None]) -> str | None:
        """Pure, no GPU: None when this factory takes the node, else why not."""
        return unsupported_reason(node, shapes, dtypes)

    def create(self, node: Node, input_shapes: Sequence[Sequence[int] | None] = ()) -> AttentionKernel:
        """Create the kernel (attributes are validated here).

        Raises
        ------
        KernelError
            An attribute is invalid.
        """
        return AttentionKernel(self.rt, node, path=self.path, num_splits=self.num_splits,
                               dec_merge=self.dec_merge)


def unsupported_reason(node: Node, shapes: Sequence[Sequence[int] | None],
                       dtypes: Sequence[DataType | None]) -> str | None:
    """Why this op declines ``node`` with these input shapes/dtypes (None: it takes it)."""
    if (node.domain, node.op_type) != (DOMAIN, OP_TYPE):
        return f"not {OP} (got {node.domain}::{node.op_type})"
    try:
        attrs = parse_attributes(node)
    except KernelError as exc:
        return str(exc)
    n_in = len(node.inputs) if node.inputs else len(shapes)
    if n_in not in (3, 4):
        return f"{OP} takes 3 inputs (Q, K, V) or 4 (Q, K, V, mask); the node has {n_in}"
    if len(node.outputs) > 1:
        return f"{OP} has one output; the node has {len(node.outputs)}"
    for i in range(3):
        if node.inputs and not node.input_present(i):
            return f"input {INPUT_NAMES[i]} ({i}) is required but absent"
    dts = list(dtypes) + [None] * (4 - len(dtypes))
    if dts[0] is not None and DataType(dts[0]) not in SUPPORTED:
        return (f"Q dtype {DataType(dts[0]).name} is not supported (supported: "
                f"{', '.join(d.name for d in SUPPORTED)})")
    mask_present = len(shapes) > 3 and shapes[3] is not None and (
        not node.inputs or node.input_present(3))
    for i in (1, 2, 3):
        if i == 3 and not mask_present:
            continue
        if dts[0] is not None and dts[i] is not None and dts[i] != dts[0]:
            return (f"input {INPUT_NAMES[i]} ({i}) dtype {DataType(dts[i]).name} differs from "
                    f"Q's {DataType(dts[0]).name}")
    if len(shapes) >= 3 and all(s is not None for s in shapes[:3]):
        try:
            check_dims(attrs, shapes[0], shapes[1], shapes[2],  # type: ignore[arg-type]
                       shapes[3] if mask_present else None)
        except KernelError as exc:
            return str(exc)
    return None


# --------------------------------------------------------------------------- kernel
class AttentionKernel:
    """One Attention node on one runtime.

    Parameters
    ----------
    rt
        The :class:`~attnrt.CudaRuntime`.
    node
        The ``pkg.nxrt::Attention`` node (attributes are validated here).
    path
        ``"auto"`` (the heuristic), ``"fused"``, ``"simt"``, ``"unfused"``, ``"wg"`` or
        ``"decode"``.
    num_splits
        Force the split-KV count of the fused paths (None: heuristic; ``decode`` clamps it
        to ``DEC_MAX_SPLITS``).
    dec_merge
        The ``decode`` path's split merge: ``"auto"`` (a thread-block cluster where
        :func:`dec_cluster_reason` allows, else through memory), ``"last"`` (the last-arriving
        CTA through memory) or ``"cluster"`` (a :class:`KernelError` where it cannot run).

    The ``decode`` path's memory merge keeps its split counters in a small pool (see the
    module docstring); :meth:`close` frees it.

    Raises
    ------
    KernelError
        An attribute is invalid.
    """

    def __init__(self, rt: Any, node: Node, *, path: str = "auto",
                 num_splits: int | None = None, dec_merge: str = "auto") -> None:
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        if num_splits is not None and not 1 <= int(num_splits) <= 65535:
            raise ValueError(f"num_splits must be in [1, 65535], got {num_splits!r}")
        if dec_merge not in DEC_MERGES:
            raise ValueError(f"dec_merge must be one of {DEC_MERGES}, got {dec_merge!r}")
        self.rt = rt
        self.node = node
        self.attrs = parse_attributes(node)
        self.path = path
        self.num_splits = num_splits
        self.dec_merge = dec_merge
        self.last_plan: Plan | None = None
        self._fns: dict[tuple, Any] = {}
        # Decode split counters: a zeroed pool (ptr, bytes) that every launch leaves at zero.
        # With use_counter_pool False the counters always come from the workspace (memset per
        # call; the sweep measures both).
        self.use_counter_pool = True
        self._cnt_pool = ScratchPool(rt, OP, zeroed=True)

    def close(self) -> None:
        """Free the decode split-counter pool (the kernel stays usable; the next eager split
        decode call allocates it again)."""
        pool = getattr(self, "_cnt_pool", None)  # __init__ may have raised before setting it
        if pool is not None:
            pool.release()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception as exc:  # never raise from a finaliser
            warnings.warn(f"{OP}: decode counters not freed: {exc}", ResourceWarning, stacklevel=1)

    @classmethod
    def fused(cls, rt: Any, node: Node, **kw: Any) -> AttentionKernel:
        """A kernel that always runs a fused path (tensor cores where possible)."""
        return cls(rt, node, path="fused", **kw)

    @classmethod
    def unfused(cls, rt: Any, node: Node) -> AttentionKernel:
        """A kernel that always runs the three-kernel (scores in the workspace) path."""
        return cls(rt, node, path="unfused")

    # -- protocol ------------------------------------------------------------------------
    def capture_support(self) -> CaptureSupport:
        # Every path launches only; the unfused path takes its scores from the executor's
        # workspace (execute refuses to allocate one while capturing).
        return CaptureSupport.yes()

    def supports_strided_input(self, index: int) -> bool:
        """Q, K, V: any B/H/S strides with a unit D stride. The mask must be contiguous."""
        return index in (0, 1, 2)

    def workspace_requirement(self, inputs: Sequence[TensorMetadata | None]) -> WorkspaceRequirement:
        """Exact bytes for these inputs (pure: no allocation, no state change; None: absent).

        Raises
        ------
        KernelError
            The inputs do not fit the node.
        """
        dims, dtype = self._validate_meta(list(inputs), None)
        p = self._plan(dims, dtype, all(_tc_layout_ok(m) for m in inputs[:3]))
        return WorkspaceRequirement(p.workspace, WS_ALIGN) if p.workspace else WorkspaceRequirement.NONE

    def execute(self, inputs: Sequence[TensorView], outputs: Sequence[TensorMut],
                workspace: WorkspaceView | None = None) -> None:
        """Validate on the host, then launch on ``rt.stream``.

        Raises
        ------
        KernelError
            A shape, dtype, stride or attribute does not fit; nothing was launched.
        WorkspaceError
            ``workspace`` is shorter than :meth:`workspace_requirement` (or misaligned).
        CaptureError
            The unfused path is called without a workspace while the stream is capturing.
        """
        inputs, outputs = list(inputs), list(outputs)
        if len(outputs) != 1 or outputs[0].absent:
            raise KernelError(f"{OP}: expected 1 output, got {len(outputs)}"
                              + (" (absent)" if outputs and outputs[0].absent else ""))
        dims, dtype = self._validate_meta(inputs, outputs[0])
        q, k, v = inputs[:3]
        mask = inputs[3] if len(inputs) > 3 and not inputs[3].absent else None
        out = outputs[0]
        # Plan from metadata exactly as workspace_requirement does (same splits and bytes);
        # pointers or an output layout the tensor-core kernel cannot take switch the kernel
        # to the SIMT one, which shares the split layout.
        p = self._plan(dims, dtype, all(_tc_layout_ok(t) for t in (q, k, v)))
        if p.path in ("tc", "wg", "decode") and not all(_tc_layout_ok(t) and t.ptr % 16 == 0
                                                        for t in (q, k, v, out)):
            # (A cluster-merge decode plan has no partials buffer: simt runs it unsplit.)
            p = Plan("simt", 0, p.splits if p.workspace else 1, p.workspace, p.ws_ml)
        if dims.empty:
            self.last_plan = p
            return
        if p.workspace and workspace is None and p.path != "unfused":
            # Without the executor's partials buffer, run the fused path unsplit.
            p = Plan(p.path, p.dp, 1, 0, 0, warp_ring=p.path == "decode" and _dec_warp_ring(
                dims, 1, int(self.rt.capabilities.sm_count)))
        if p.workspace:
            if workspace is None:
                if self.rt.is_capturing():
                    raise CaptureError(f"{OP}: the unfused path needs a workspace of {p.workspace} "
                                       "bytes while capturing; pass the executor's workspace "
                                       "(workspace_requirement) instead of None")
                self._run_owned(p, dims, dtype, q, k, v, mask, out)
                self.last_plan = p
                return
            check_workspace(OP, WorkspaceRequirement(p.workspace, WS_ALIGN), workspace)
        self.last_plan = p
        self._launch(p, dims, dtype, q, k, v, mask, out, workspace.ptr if workspace else 0)

    # -- validation ----------------------------------------------------------------------
    def _validate_meta(self, inputs: list, out: TensorView | None) -> tuple[Dims, DataType]:
        if not 3 <= len(inputs) <= 4:
            raise KernelError(f"{OP}: expected 3 inputs (Q, K, V) or 4 (Q, K, V, mask), "
                              f"got {len(inputs)}")
        for i in range(3):
            if inputs[i] is None or getattr(inputs[i], "absent", False):
                raise KernelError(f"{OP}: input {INPUT_NAMES[i]} ({i}) is required but absent")
        mask = None
        if len(inputs) == 4 and inputs[3] is not None:
            m = inputs[3]
            # Planning gets None (or, from older executors, the absent slot's metadata).
            present = (not m.absent) if isinstance(m, TensorView) else self.node.input_present(3)
            mask = m if present else None
        dtype = inputs[0].dtype
        if dtype not in SUPPORTED:
            raise KernelError(f"{OP}: input Q (0) has dtype {dtype.name}; expected one of "
                              f"{', '.join(d.name for d in SUPPORTED)}")
        named = [(INPUT_NAMES[i], f"input {INPUT_NAMES[i]} ({i})", inputs[i]) for i in (1, 2)]
        if mask is not None:
            named.append(("mask", "input mask (3)", mask))
        if out is not None:
            named.append(("output", "output 0", out))
        for _, label, t in named:
            if t.dtype != dtype:
                raise KernelError(f"{OP}: {label} has dtype {t.dtype.name}; expected Q's "
                                  f"{dtype.name}")
        dims = check_dims(self.attrs, inputs[0].shape, inputs[1].shape, inputs[2].shape,
                          None if mask is None else mask.shape,
                          None if out is None else out.shape)
        strided = [("input Q (0)", inputs[0]), ("input K (1)", inputs[1]),
                   ("input V (2)", inputs[2])] + ([("output 0", out)] if out is not None else [])
        for label, t in strided:
            st = t.element_strides
            if t.shape[3] > 1 and st[3] != 1:
                raise KernelError(f"{OP}: {label} has strides {_fmt(st)} (elements); expected a "
                                  "unit stride on the last (head_dim) axis — make it contiguous")
        if mask is not None and not mask.is_contiguous:
            raise KernelError(f"{OP}: input mask (3) has strides {_fmt(mask.element_strides)}; "
                              "expected a contiguous mask (supports_strided_input(3) is False)")
        return dims, dtype

    def _plan(self, dims: Dims, dtype: DataType, tc_ok: bool) -> Plan:
        sm = int(self.rt.capabilities.sm_count)
        # Every compute capability 9.0 part (H100/H200) has 227 KiB of opt-in shared memory,
        # far above what the wgmma build uses (wg_smem_bytes).
        cc = getattr(self.rt.capabilities, "compute_capability", None)
        cc = tuple(cc) if cc is not None else None
        return plan(self.attrs, dims, dtype, sm, path=self.path, tc_ok=tc_ok,
                    num_splits=self.num_splits, cc=cc, dec_merge=self.dec_merge)

    # -- launching -----------------------------------------------------------------------
    def _fn(self, variant: Variant, entry: str) -> Any:
        key = (variant.file, tuple(sorted(variant.defines.items())), entry)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = get_function(self.rt, variant, entry)
        return fn

    def _scale(self, dims: Dims) -> float:
        return self.attrs.scale if self.attrs.scale is not None else 1.0 / math.sqrt(dims.D)

    def _window(self, dims: Dims) -> int:
        # w >= Sk - 1 lets every query see every earlier key: the same as no window, and it
        # keeps the int32 kernel arithmetic far from overflow.
        w = self.attrs.local_window_size
        return -1 if w < 0 or w >= dims.Sk else w

    def _run_owned(self, p: Plan, dims: Dims, dtype: DataType, q: TensorView, k: TensorView,
                   v: TensorView, mask: TensorView | None, out: TensorView) -> None:
        ptr = self.rt.alloc_raw(p.workspace)
        try:
            self._launch(p, dims, dtype, q, k, v, mask, out, ptr)
            self.rt.synchronize()
        finally:
            self.rt.free_raw(ptr)

    def _launch(self, p: Plan, dims: Dims, dtype: DataType, q: TensorView, k: TensorView,
                v: TensorView, mask: TensorView | None, out: TensorView, ws: int) -> None:
        if p.path == "unfused":
            self._launch_unfused(dims, dtype, q, k, v, mask, out, ws)
        elif p.path == "decode":
            self._launch_decode(p, dims, dtype, q, k, v, mask, out, ws)
        else:
            self._launch_fused(p, dims, dtype, q, k, v, mask, out, ws)

    def _launch_fused(self, p: Plan, dims: Dims, dtype: DataType, q: TensorView, k: TensorView,
                      v: TensorView, mask: TensorView | None, out: TensorView, ws: int) -> None:
        i32, i64, f32 = np.int32, np.int64, np.float32
        if p.path == "wg":
            build = wg_build(p.dp, bool(self.attrs.causal), dims.Sk)  # (schedule, keys, _)
            variant, entry = _wg_build_variant(dtype, p.dp, build), "attn_fused_wg"
            bm, threads, smem = WG_ROWS, _wg_threads(build[0]), _wg_smem(p.dp, build)
        elif p.path == "tc":
            nwarps, _ = TC_TILES[p.dp]
            variant, entry = _tc_variant(dtype, p.dp), "attn_fused_tc"
            bm, threads, smem = 16 * nwarps, 32 * nwarps, tc_smem_bytes(p.dp)
        else:
            variant, entry = _simt_variant(dtype), "attn_fused_simt"
            bm, threads, smem = SIMT_ROWS, SIMT_THREADS, simt_smem_bytes(dims.D)
        row_tiles = -(-dims.group * dims.Sq // bm)
        n_ctas = row_tiles * dims.B * dims.Hkv  # within limits: plan() checked
        grid = (n_ctas, p.splits, 1)
        if p.path == "wg" and _wg_persistent(build[0]):
            grid = (wg_grid(n_ctas * p.splits, int(self.rt.capabilities.sm_count)), 1, 1)
        split_o, split_ml = (ws, ws + p.ws_ml) if p.splits > 1 else (0, 0)
        strides = [i64(s) for t in (q, k, v, out) for s in t.element_strides[:3]]
        args = [q.ptr, k.ptr, v.ptr, mask.ptr if mask is not None else 0, out.ptr, split_o,
                split_ml, i32(dims.B), i32(dims.H), i32(dims.Hkv), i32(dims.Sq), i32(dims.Sk),
                i32(dims.D), *strides, i32(dims.mask_planes), i32(int(self.attrs.causal)),
                i32(self._window(dims)), f32(self._scale(dims)), f32(self.attrs.softcap),
                i32(row_tiles), i32(p.splits)]
        self.rt.launch(self._fn(variant, entry), grid, (threads, 1, 1), args, shared_mem=smem)
        if p.splits > 1:
            rows = dims.B * dims.H * dims.Sq
            ost = [i64(s) for s in out.element_strides[:3]]
            self.rt.launch(self._fn(_rows_variant(dtype), "attn_combine"), (-(-rows // 4), 1, 1),
                           (128, 1, 1), [split_o, split_ml, out.ptr, i32(dims.B), i32(dims.H),
                                         i32(dims.Sq), i32(dims.D), i32(p.splits), *ost])

    def _counters(self, p: Plan, tasks: int, ws: int) -> int:
        """Zeroed split counters for one decode launch: the pool (allocated and zeroed by the
        first eager call), else the workspace's tail, cleared on the stream."""
        need = 4 * tasks
        pool = self._cnt_pool
        if self.use_counter_pool and (pool.nbytes >= need or not self.rt.is_capturing()):
            return pool.ensure(max(need, 4096), capturing=False)
        cnt = ws + p.ws_cnt
        self.rt.memset(cnt, 0, need)
        return cnt

    def _launch_decode(self, p: Plan, dims: Dims, dtype: DataType, q: TensorView, k: TensorView,
                       v: TensorView, mask: TensorView | None, out: TensorView, ws: int) -> None:
        i32, i64, f32 = np.int32, np.int64, np.float32
        nwarps, _ = DEC_TILES[p.dp]
        tasks = dims.B * dims.Hkv  # one row tile each (G·Sq <= DEC_MAX_ROWS)
        splits = min(p.splits, DEC_MAX_SPLITS)
        split_o, split_ml, cnt = 0, 0, 0
        if splits > 1 and not p.cluster:
            split_o, split_ml = ws, ws + p.ws_ml
            cnt = self._counters(p, tasks, ws)
        strides = [i64(s) for t in (q, k, v, out) for s in t.element_strides[:3]]
        args = [q.ptr, k.ptr, v.ptr, mask.ptr if mask is not None else 0, out.ptr, split_o,
                split_ml, i32(dims.B), i32(dims.H), i32(dims.Hkv), i32(dims.Sq), i32(dims.Sk),
                i32(dims.D), *strides, i32(dims.mask_planes), i32(int(self.attrs.causal)),
                i32(self._window(dims)), f32(self._scale(dims)), f32(self.attrs.softcap),
                i32(1), i32(splits), cnt, i32(int(p.warp_ring))]
        self.rt.launch(self._fn(_dec_variant(dtype, p.dp, p.cluster), "attn_decode"),
                       (tasks, splits, 1),
                       (32 * nwarps, 1, 1), args, shared_mem=dec_smem_bytes(p.dp))

    def _launch_unfused(self, dims: Dims, dtype: DataType, q: TensorView, k: TensorView,
                        v: TensorView, mask: TensorView | None, out: TensorView, ws: int) -> None:
        i32, i64, f32 = np.int32, np.int64, np.float32
        bh = dims.B * dims.H
        m_tiles = -(-dims.Sq // 64)  # grid limits: plan() checked
        gemm = _gemm_variant(dtype)
        threads = 256 if dtype == DataType.FLOAT else 128
        s_ptr = ws + unfused_layout(dims.B, dims.H, dims.Sq, dims.Sk)[0]
        qs, ks, vs, os_ = ([i64(s) for s in t.element_strides[:3]] for t in (q, k, v, out))
        if dims.Sk > 0:
            self.rt.launch(self._fn(gemm, "attn_qk"), (-(-dims.Sk // 64), m_tiles, bh),
                           (threads, 1, 1),
                           [q.ptr, k.ptr, s_ptr, i32(dims.H), i32(dims.Hkv), i32(dims.Sq),
                            i32(dims.Sk), i32(dims.D), *qs, *ks, f32(self._scale(dims))])
            self.rt.launch(self._fn(_rows_variant(dtype), "attn_softmax"), (bh * dims.Sq, 1, 1),
                           (256, 1, 1),
                           [s_ptr, mask.ptr if mask is not None else 0, i32(dims.B), i32(dims.H),
                            i32(dims.Sq), i32(dims.Sk), i32(dims.mask_planes),
                            i32(int(self.attrs.causal)), i32(self._window(dims)),
                            f32(self.attrs.softcap)])
        self.rt.launch(self._fn(gemm, "attn_pv"), (-(-dims.D // 64), m_tiles, bh), (threads, 1, 1),
                       [s_ptr, v.ptr, out.ptr, i32(dims.H), i32(dims.Hkv), i32(dims.Sq),
                        i32(dims.Sk), i32(dims.D), *vs, *os_])
