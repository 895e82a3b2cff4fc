"""What PagedAttention compiles: the variants of its three CUDA files and their launch facts.

``cuda/paged_small.cu`` (write phase and the CUDA-core ``simple`` read), ``cuda/paged_mla.cu``
(the mma.sync latent kernel and the split-KV combine), ``cuda/paged_mla_wg.cu`` and
``cuda/paged_mla_pair.cu`` (the sm_90a wgmma latent kernels: serial and paired schedules).
The shared-memory helpers mirror the layouts in those files.
"""

from __future__ import annotations

from attnrt.runtime.api import DataType

from .._common import Variant
from .schema import SUPPORTED

__all__ = ["MLA_SHAPES", "MLA_ROWS", "MLA_THREADS", "MLA_TILES", "WG_BLOCK_N", "SIMPLE_THREADS",
           "WRITE_THREADS", "COMBINE_THREADS", "mla_smem_bytes", "mla_wg_smem_bytes",
           "mla_pair_smem_bytes", "simple_smem_bytes", "small_variant", "mla_variant", "wg_variant",
           "compile_variants"]

MLA_SHAPES = ((576, 512),)  # (head_size, v_head_size) built for the tensor-core path
MLA_ROWS, MLA_THREADS = 64, 256
MLA_TILES = (64, 32)  # keys per tile of paged_mla.cu that are built, largest first
WG_BLOCK_N = 64  # keys per tile of paged_mla_wg.cu (fixed in the source)
SIMPLE_THREADS = WRITE_THREADS = COMBINE_THREADS = 128


def mla_smem_bytes(block_n: int, head_size: int = 576) -> int:
    """Dynamic shared memory of ``paged_mla_fwd`` (mirrors the layout in paged_mla.cu).

    Parameters
    ----------
    block_n
        Keys per tile.
    head_size
        Latent width.

    Returns
    -------
    int
        Bytes.
    """
    q = MLA_ROWS * head_size * 2
    kv = 2 * block_n * head_size * 2
    p = MLA_ROWS * block_n * 2
    red, rows = 4 * MLA_ROWS * 4, 3 * MLA_ROWS * 4
    valid = -(-2 * block_n // 16) * 16
    return q + kv + p + red + rows + valid + 32


def simple_smem_bytes(head_size: int, v_head_size: int) -> int:
    """Dynamic shared memory of ``paged_simple_*``: the f32 query row, 4 warps' f32 outputs.

    Parameters
    ----------
    head_size, v_head_size
        Key and value widths.

    Returns
    -------
    int
        Bytes.
    """
    return (head_size + 4 * v_head_size + 8) * 4


def mla_wg_smem_bytes(head_size: int = 576) -> int:
    """Dynamic shared memory of ``paged_mla_wg_fwd`` (mirrors SMEM_BYTES in paged_mla_wg.cu).

    Q and two stages of 64 keys in 1024-byte-aligned swizzle atoms, P, row data, plus 1 KiB
    of slack to align the base.

    Parameters
    ----------
    head_size
        Latent width.

    Returns
    -------
    int
        Bytes.
    """
    return _wg_tiles_bytes(head_size) + 2 * MLA_ROWS * 4 + 3 * MLA_ROWS * 4 + 2 * WG_BLOCK_N + 32


def mla_pair_smem_bytes(head_size: int = 576) -> int:
    """Dynamic shared memory of ``paged_mla_pair_fwd`` (mirrors SMEM_BYTES in paged_mla_pair.cu).

    Q and two 64-key tile buffers in 1024-byte-aligned swizzle atoms, the P of the second
    buffer (the first's lives in its rotary sub-tile), the row max, two rescale vectors and
    each warpgroup's exp max, one mbarrier per 64-channel sub-tile of each buffer, plus
    1 KiB of slack to align the base.

    Parameters
    ----------
    head_size
        Latent width.

    Returns
    -------
    int
        Bytes.
    """
    return _wg_tiles_bytes(head_size) + 5 * MLA_ROWS * 4 + 2 * (head_size // 64) * 8


def _wg_tiles_bytes(head_size: int) -> int:
    """What both wgmma kernels hold: Q, two 64-key tiles, one P tile, 1 KiB of base slack."""
    return (MLA_ROWS + 2 * WG_BLOCK_N) * head_size * 2 + MLA_ROWS * WG_BLOCK_N * 2 + 1024


def small_variant() -> Variant:
    """The write phase and the ``simple`` read path (both dtypes, one compile)."""
    return Variant("paged_small.cu", ("paged_write_f16", "paged_write_bf16", "paged_simple_f16",
                                      "paged_simple_bf16"))


def mla_variant(dtype: DataType, block_n: int, shape: tuple[int, int] = MLA_SHAPES[0]) -> Variant:
    """The mma.sync latent kernel and the combine for one dtype, tile and (head, value) width."""
    return Variant("paged_mla.cu", ("paged_mla_fwd", "paged_mla_combine"),
                   {"PA_BF16": int(dtype == DataType.BFLOAT16), "PA_BN": block_n,
                    "PA_HS": shape[0], "PA_VHS": shape[1]})


def wg_variant(dtype: DataType, shape: tuple[int, int] = MLA_SHAPES[0],
               schedule: str = "serial", softcap: bool = False) -> Variant:
    """The sm_90a wgmma latent kernel of one schedule (``serial`` or ``pair``) for one dtype
    and (head, value) width; ``softcap``: the pair kernel's build that applies one (the other
    leaves the tanh out of its loop; the serial kernel has one build for both)."""
    defines = {"PA_BF16": int(dtype == DataType.BFLOAT16), "PA_HS": shape[0],
               "PA_VHS": shape[1]}
    if schedule == "pair":
        return Variant("paged_mla_pair.cu", ("paged_mla_pair_fwd",),
                       {**defines, "PA_SOFTCAP": int(softcap)}, min_arch=90, arch_suffix="a")
    return Variant("paged_mla_wg.cu", ("paged_mla_wg_fwd",), defines, min_arch=90,
                   arch_suffix="a")


def compile_variants() -> list[Variant]:
    """Every (file, defines, entries) this op may launch (what ``attnrt warm`` compiles).

    Returns
    -------
    list of Variant
        The small kernels, then every mma.sync tile, then the wgmma kernels (both
        schedules).
    """
    return [small_variant()] + [mla_variant(dt, bn, sh) for sh in MLA_SHAPES
                                for dt in SUPPORTED for bn in MLA_TILES] + \
        [wg_variant(dt, sh, "serial") for sh in MLA_SHAPES for dt in SUPPORTED] + \
        [wg_variant(dt, sh, "pair", cap) for cap in (False, True) for sh in MLA_SHAPES
         for dt in SUPPORTED]
