"""FlashMLA's dense sm90 MLA decode as a peer of ``tools/bench.py paged``.

The peer's sources stay outside the project: a copy of ``../shared/peers/flashmla`` in the
checkout's ignored ``.peers/flashmla`` (or ``$ATTNRT_FLASHMLA_DIR``), built here with its own
``build_flashmla.load`` (``--prebuilt``: links its prebuilt kernels and compiles only the
binding, ~30 s; a full build when that fails, ~2 min). It is called on the same torch
tensors as our op: the query [B * s_q, H * 576] viewed as [B, s_q, H, 576], the same latent
cache [num_blocks, 64, 1, 576] and block table, and seqlens = past + new tokens.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HS, VHS = 576, 512


def peer_dir() -> Path:
    """Where the peer's kit is looked for (the only place its location is decided)."""
    return Path(os.environ.get("ATTNRT_FLASHMLA_DIR") or ROOT / ".peers" / "flashmla")


def load(log: Callable[[str], None], compute_capability: tuple[int, int]) -> Any | None:
    """Build (incrementally) and import the peer; None, after one log line, when it cannot run.

    Parameters
    ----------
    log
        Where the one line about the peer goes.
    compute_capability
        The device's; FlashMLA's dense decode is sm_90a only.
    """
    d = peer_dir()
    if not (d / "build_flashmla.py").is_file():
        log(f"paged: FlashMLA peer not found at {d} (copy ../shared/peers/flashmla there); "
            "its columns stay empty")
        return None
    if tuple(compute_capability) != (9, 0):
        log(f"paged: FlashMLA's dense decode needs sm_90a, this device is sm_"
            f"{compute_capability[0]}{compute_capability[1]}; its columns stay empty")
        return None
    if str(d) not in sys.path:
        sys.path.insert(0, str(d))
    import build_flashmla  # the peer's own build script

    for prebuilt in (True, False):
        t0 = time.perf_counter()
        try:
            mod = build_flashmla.load(None, prebuilt, verbose=False)
        except Exception as exc:
            log(f"paged: FlashMLA build ({'prebuilt' if prebuilt else 'from source'}) failed: "
                f"{type(exc).__name__}: {str(exc)[-400:]}")
            continue
        log(f"paged: FlashMLA built ({'prebuilt' if prebuilt else 'from source'}) in "
            f"{time.perf_counter() - t0:.1f} s: {mod.__file__}")
        return mod
    log("paged: FlashMLA could not be built; its columns stay empty")
    return None


class FlashMLA:
    """One step shape of the peer: ``B`` sequences of ``s_q`` new tokens, ``H`` query heads.

    The first call runs FlashMLA's scheduling kernel for ``seqlens`` and keeps its metadata;
    later calls (eager or captured) pass it back, as a model does for all of its layers.
    """

    def __init__(self, mod: Any, seqlens: Any, B: int, s_q: int, H: int, scale: float) -> None:
        self.mod, self.seqlens = mod, seqlens
        self.B, self.s_q, self.H, self.scale = B, s_q, H, scale
        self.tile_md: Any = None
        self.num_splits: Any = None

    def __call__(self, q: Any, kcache: Any, block_table: Any) -> Any:
        """Output [B * s_q, H * 512] for our query layout [B * s_q, H * 576] (views only)."""
        out, _, md, ns = self.mod.dense_decode_fwd(
            q.view(self.B, self.s_q, self.H, HS), kcache, VHS, self.seqlens, block_table,
            self.scale, self.s_q > 1, self.tile_md, self.num_splits)
        if self.tile_md is None:
            self.tile_md, self.num_splits = md, ns
        return out.reshape(self.B * self.s_q, self.H * VHS)

    def capture(self, torch: Any, calls: list[tuple[Any, Any, Any]]) -> Any:
        """One torch CUDA graph of ``calls`` (q, kcache, block_table), after the metadata."""
        if self.tile_md is None:
            self(*calls[0])
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for c in calls:
                self(*c)
        return g
