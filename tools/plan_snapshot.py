#!/usr/bin/env python3
"""Print IndexShare's plan for a grid of shapes: ``python tools/plan_snapshot.py OUT.txt``.

For checking a planner change that should not change any plan (a refactor, a moved
helper): run it before and after, then ``cmp`` the two files. Each line is one call of
``make_plan`` (the function ``workspace_requirement`` and ``execute`` use): the geometry,
path, knobs and device flags, then the plan or the error it raised. No GPU is needed (the
device is described by its SM count, 132, and sm_90 code).

The lines keep the spelling of the planner before ``IndexShareConfig`` (so that snapshots
of either compare): ``path=... knobs={...}`` is the config ``IndexShareConfig(path=...,
**knobs)``, and a plan prints as ``_Plan(...)`` with every field but ``config`` (which the
key already states).

The grid (``--quick``: a tenth of it, for tests): heads 8-256, kv heads 1-2, batch 1-300,
query rows 1-4096, top-k 1-4096, head size 64/72/128, the three float dtypes, int32 and int64
indices, one or per-head index rows, the four path choices, aligned or not, capacity
scratch or not, and the knob sets of the plan overrides the tests use.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attnrt.ops.index_share import (  # noqa: E402
    DeviceLimits,
    IndexShareConfig,
    make_plan,
    parse_attributes,
    resolve_geometry,
)
from attnrt.runtime.api import DataType, Node  # noqa: E402

#: The device of every line: 132 SMs, 227 KiB of shared memory per block, sm_90a code.
DEVICE = DeviceLimits(132, sm90a=True)


def plan_line(plan: object) -> str:
    """A plan as the snapshot prints it: ``_Plan(<field>=<repr>, ...)`` without ``config``."""
    fields = [f"{f.name}={getattr(plan, f.name)!r}" for f in dataclasses.fields(plan)
              if f.name != "config"]
    return f"_Plan({', '.join(fields)})"


def _geometry(n: int, nkv: int, b: int, sq: int, k: int, h: int, dt: DataType,
              idt: DataType, per_head: bool):
    node = Node("IndexShare", "pkg.nxrt", {"num_heads": n, "kv_num_heads": nkv},
                ["q", "k", "v", "pk", "pv", "idx"], ["y"])
    past = 8191
    shapes = [(b, n, sq, h), (b, nkv, sq, h), (b, nkv, sq, h), (b, nkv, past, h),
              (b, nkv, past, h), (b, n if per_head else 1, sq, k)]
    return resolve_geometry(parse_attributes(node), shapes, [dt] * 5 + [idt], "none")


def snapshot(quick: bool = False) -> list[str]:
    """One line per (geometry, path, knobs, flags) of the grid."""
    f32, f16, bf16 = DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16
    i32, i64 = DataType.INT32, DataType.INT64
    grids = [
        # heads, kv heads, batch, query rows, top-k, head size, dtype, index dtype, per-head
        dict(n=(8, 32, 64, 96, 128, 256), nkv=(1,), b=(1, 3, 8, 16, 33, 64, 67, 132, 133, 300),
             sq=(1, 2, 4096), k=(1, 64, 1100, 2048, 4096), h=(128,), dt=(bf16,), idt=(i32,),
             per_head=(False,)),
        dict(n=(16, 64, 128), nkv=(1, 2), b=(1, 9, 64, 70), sq=(1, 3), k=(7, 2048, 3000),
             h=(64, 72, 128), dt=(f32, f16, bf16), idt=(i32, i64), per_head=(False, True)),
    ]
    knob_sets = (None, {"ws": 0}, {"splits": 4}, {"ctas": 40})
    out = []
    for grid in grids:
        combos = list(itertools.product(*grid.values()))
        if quick:
            combos = combos[::10]
        for values in combos:
            shape = dict(zip(grid.keys(), values))
            for path, knobs, aligned, cap in itertools.product(
                    (None, "simt", "mma", "wg"), knob_sets, (True, False), (False, True)):
                key = f"{shape} path={path} knobs={knobs} aligned={aligned} capacity={cap}"
                try:
                    g = _geometry(**shape)
                    cfg = IndexShareConfig(path=path, **(knobs or {}))
                    res = plan_line(make_plan(g, DEVICE, aligned16=aligned, capacity_scratch=cap,
                                              config=cfg))
                except Exception as exc:  # a refused plan is part of the snapshot
                    res = f"{type(exc).__name__}: {exc}"
                out.append(f"{key} -> {res}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="write the snapshot here (one line per call)")
    ap.add_argument("--quick", action="store_true", help="a tenth of the grid")
    args = ap.parse_args(argv)
    lines = snapshot(args.quick)
    args.out.write_text("\n".join(lines) + "\n")
    errors = sum(not s.split(" -> ", 1)[1].startswith("_Plan(") for s in lines)
    print(f"plan_snapshot: {len(lines)} calls ({errors} refused) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
