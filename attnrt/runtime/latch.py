"""The error latch: one persistent 4-byte device word that kernels ``atomicOr`` into.

Kernels that find bad data they cannot report synchronously (inside a captured graph)
set a registered bit; the host reads and clears the word outside the captured region.
Bits are registered by their mask value (a power of two) and a name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .errors import CaptureError

if TYPE_CHECKING:
    from .runtime import CudaRuntime

__all__ = ["Latch", "WELL_KNOWN_BITS", "INDEX_SHARE_SELECTED_INDICES",
           "PAGED_SLOT_OUT_OF_RANGE", "PAGED_BLOCK_OUT_OF_RANGE", "PAGED_POSITION_OUT_OF_RANGE"]

#: IndexShare: a ``selected_indices`` row broke the index rules (reference design: 512).
INDEX_SHARE_SELECTED_INDICES = 512
#: PagedAttention: a ``slot_mapping`` entry points outside the key cache.
PAGED_SLOT_OUT_OF_RANGE = 1024
#: PagedAttention: a ``block_table`` entry points outside the key cache.
PAGED_BLOCK_OUT_OF_RANGE = 2048
#: PagedAttention: a RoPE position falls outside ``cos_cache``/``sin_cache``.
PAGED_POSITION_OUT_OF_RANGE = 4096

WELL_KNOWN_BITS: dict[int, str] = {
    INDEX_SHARE_SELECTED_INDICES: "IndexShare selected_indices invalid",
    PAGED_SLOT_OUT_OF_RANGE: "PagedAttention slot_mapping out of range",
    PAGED_BLOCK_OUT_OF_RANGE: "PagedAttention block_table out of range",
    PAGED_POSITION_OUT_OF_RANGE: "PagedAttention position outside cos/sin cache",
}


class Latch:
    """The latch word of one runtime."""

    def __init__(self, runtime: CudaRuntime, ptr: int) -> None:
        self._rt = runtime
        self.ptr = ptr
        self._names: dict[int, str] = dict(WELL_KNOWN_BITS)

    @property
    def names(self) -> dict[int, str]:
        return dict(self._names)

    def register(self, bit: int, name: str) -> int:
        """Register ``bit`` (a power of two) under ``name``; returns ``bit``.

        Registering the same name again is a no-op; another name on a taken bit is a
        ``ValueError``.
        """
        if not isinstance(bit, int) or isinstance(bit, bool) or bit <= 0 or bit & (bit - 1) or bit >= 2**32:
            raise ValueError(f"a latch bit is a power of two below 2**32, got {bit!r}")
        have = self._names.get(bit)
        if have is not None and have != name:
            raise ValueError(f"latch bit {bit} is already registered as {have!r}")
        self._names[bit] = str(name)
        return bit

    def decode(self, word: int) -> list[str]:
        """Names of every set bit (unregistered ones as ``bit 0x...``)."""
        out = []
        b = 1
        while b <= word:
            if word & b:
                out.append(self._names.get(b, f"unregistered bit 0x{b:x}"))
            b <<= 1
        return out

    def read(self, clear: bool = True) -> int:
        """Read the word (waits for the stream); clears it when ``clear``."""
        self._rt._refuse_while_capturing("latch.read")
        host = np.zeros(1, dtype=np.uint32)
        self._rt.dtoh(host, self.ptr)
        if clear and host[0]:
            self._rt.memset(self.ptr, 0, 4)
        return int(host[0])

    def check(self) -> None:
        """Read and clear the word; raise :class:`CaptureError` naming every set bit."""
        word = self.read(clear=True)
        if word:
            names = self.decode(word)
            raise CaptureError(f"device error latch is set (0x{word:x}): " + "; ".join(names),
                               bits=word, names=names)
