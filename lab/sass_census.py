#!/usr/bin/env python3
"""Count the SASS of a kernel by opcode and by loop, without a GPU: NVRTC builds the CUBIN here,
``nvdisasm`` (``pip download nvidia-cuda-nvdisasm``, then point ``NVDISASM`` at its binary)
disassembles it.

    NVDISASM=/path/nvdisasm python lab/sass_census.py pair [DEFINE=V,...]   # our pair kernel, bf16
    NVDISASM=/path/nvdisasm python lab/sass_census.py cubin FILE.cubin [SUBSTR]

``pair`` compiles ``paged_mla_pair.cu`` (bf16, d576/512, no softcap, sm_90a) with the shipped
defines plus any given; ``cubin`` reads a CUBIN (e.g. one pulled out of a peer's object file
with ``objcopy --only-section=.nv_fatbin``) and takes the first kernel whose name contains
SUBSTR. Prints the kernel's instruction count, its opcode classes, and every backward branch
(a loop) with the instructions between its target and itself, the loop's body by class.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

_INSN = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TEXT = re.compile(r"^\.text\.(\S+):")

CLASSES = [
    ("mma", ("HGMMA", "WARPGROUP")),
    ("tma/mbar", ("UTMALDG", "UTMASTG", "SYNCS", "UBLKCP")),
    ("barrier", ("BAR", "WARPSYNC", "MEMBAR", "DEPBAR")),
    ("exp", ("MUFU",)),
    ("fp32", ("FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL", "FCHK", "FSWZADD")),
    ("cvt", ("F2FP", "F2F", "I2F", "F2I", "F2IP", "I2FP")),
    ("shared", ("LDS", "STS", "LDSM", "STSM", "ATOMS")),
    ("global", ("LDG", "STG", "LD", "ST", "RED", "ATOMG", "LDGSTS", "CCTL")),
    ("shuffle/vote", ("SHFL", "VOTE", "VOTEU", "REDUX", "MATCH")),
    ("int", ("IADD3", "IMAD", "LEA", "LOP3", "SHF", "ISETP", "IMNMX", "SEL", "MOV", "IABS",
             "PRMT", "SGXT", "BMSK", "POPC", "FLO", "BREV", "IMUL", "CS2R", "S2R", "S2UR",
             "UIADD3", "UIMAD", "ULEA", "ULOP3", "USHF", "UISETP", "UMOV", "USEL", "R2UR",
             "UPRMT", "PLOP3", "P2R", "R2P", "UPLOP3", "ULDC", "LDC", "UFLO", "UPOPC",
             "USGXT", "UBMSK", "UIMNMX", "ISCADD", "VIADD", "UVIADD", "VIMNMX", "NOP")),
    ("branch", ("BRA", "BSSY", "BSYNC", "EXIT", "RET", "CALL", "BREAK", "YIELD", "WARPSYNC")),
]


def op_class(op: str) -> str:
    """The class of an opcode (its name up to the first dot)."""
    base = op.split(".", 1)[0]
    for name, ops in CLASSES:
        if base in ops:
            return name
    return "other:" + base


def disassemble(cubin: bytes) -> str:
    """nvdisasm's text of a CUBIN."""
    exe = os.environ.get("NVDISASM", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([exe, f.name], check=True, capture_output=True, text=True).stdout


def kernel_lines(text: str, substr: str) -> tuple[str, list[str]]:
    """(name, lines) of the first kernel whose mangled name contains ``substr``."""
    name, out = None, []
    for line in text.splitlines():
        m = _TEXT.match(line)
        if m:
            if name is not None:
                break
            if substr in m.group(1):
                name = m.group(1)
            continue
        if name is not None:
            out.append(line)
    if name is None:
        raise SystemExit(f"no kernel contains {substr!r}")
    return name, out


def census(lines: list[str]) -> list[tuple[int, int, int]]:
    """Print the totals and each loop's body by class; returns the loops as (first, last,
    HGMMA count), instruction indices."""
    insns, labels, pred = [], {}, []
    for line in lines:
        lm = _LABEL.match(line)
        if lm:
            labels[lm.group(1)] = len(insns)
            continue
        m = _INSN.match(line)
        if m:
            insns.append((int(m.group(1), 16), m.group(3), m.group(4)))
            pred.append(m.group(2))
    total = collections.Counter(op_class(op) for _, op, _ in insns)
    print(f"instructions: {len(insns)}")
    print("  " + ", ".join(f"{k} {v}" for k, v in total.most_common()))
    # ptxas puts the slow paths (an mbarrier wait's retry, a division's) after the body: a
    # short block whose unconditional branch jumps back into it. Those are not loops.
    last_mma = max((i for i, (_, op, _) in enumerate(insns) if op.startswith("HGMMA")), default=0)
    loops = []
    for i, (_, op, rest) in enumerate(insns):
        if not op.startswith("BRA"):
            continue
        t = re.search(r"(\.L_x_\d+)", rest)
        if not (t and t.group(1) in labels and labels[t.group(1)] <= i):
            continue
        block = i - max((j for j in labels.values() if j <= i), default=0)
        if i > last_mma and pred[i] is None and block <= 4:
            continue
        loops.append((labels[t.group(1)], i))
    print(f"backward branches: {len(loops)}")
    found = []
    for a, b in sorted(loops, key=lambda ab: ab[1] - ab[0], reverse=True):
        body = collections.Counter(op_class(op) for _, op, _ in insns[a:b + 1])
        mma = sum(1 for _, op, _ in insns[a:b + 1] if op.startswith("HGMMA"))
        found.append((a, b, mma))
        if b - a < 8 or not mma:
            continue  # spin loops (mbarrier try_wait), copy loops
        print(f"  [{a}..{b}] {b - a + 1} insns, {mma} HGMMA: "
              + ", ".join(f"{k} {v}" for k, v in body.most_common()))
    inner = [(a, b, h) for a, b, h in found if h and not any(
        h2 and a <= a2 and b2 <= b and (a2, b2) != (a, b) for a2, b2, h2 in found)]
    for a, b, h in inner:
        print(f"innermost loop with HGMMA: [{a}..{b}] {b - a + 1} insns, {h} HGMMA")
    return found


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("pair", "cubin"):
        print(__doc__)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    if argv[0] == "cubin":
        text = disassemble(Path(argv[1]).read_bytes())
        name, lines = kernel_lines(text, argv[2] if len(argv) > 2 else "")
    else:
        from attnrt.ops import _common
        from attnrt.ops.paged_attention import builds
        from attnrt.runtime import compiler
        from attnrt.runtime.api import DataType

        v = builds.wg_variant(DataType.BFLOAT16, schedule="pair")
        extra = dict(kv.split("=", 1) for kv in (argv[1] if len(argv) > 1 else "").split(",")
                     if kv)
        opts = _common.defines_to_options({**v.defines, **extra})
        got = compiler.compile_source(_common.source(v.file), v.module + ".cu", "sm_90a", opts,
                                      _common.headers(), warn=False)
        name, lines = kernel_lines(disassemble(bytes(got.cubin)), v.entries[0])
    print(name[:120])
    census(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
