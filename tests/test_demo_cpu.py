"""``attnrt demo`` without a GPU: the command compiles every kernel and runs the CPU references;
the demo's model, reference chain and verification bookkeeping; the layering rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attnrt
from attnrt.app import demo
from attnrt.app.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent
SMALL = demo.DemoConfig(layers=2, steps=1, prompts=(19, 6), heads=4, sparse_heads=8, topk=8)


def test_runtime_layer_does_not_import_the_kernels():
    code = "import sys, attnrt, attnrt.app.cli; print('attnrt.ops' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_bad_options_exit_2_before_compiling(capsys):
    assert cli_main(["demo", "--steps", "0"]) == 2
    assert "steps must be >= 1" in capsys.readouterr().err


def test_step_inputs_are_deterministic_and_valid():
    a, b = demo.DemoModel(SMALL), demo.DemoModel(SMALL)
    for s in range(SMALL.decode_steps):
        x, y = a.step_inputs(s), b.step_inputs(s)
        assert x.keys() == y.keys()
        for k in x:
            assert np.array_equal(x[k].view(np.uint8), y[k].view(np.uint8)), k
        pos = a.positions(s)
        assert np.array_equal(x["past"], pos)
        for i, p in enumerate(pos):
            row = x["idx"][i, 0, 0]
            sel = row[row >= 0]
            assert sel[-1] == p and np.all(np.diff(sel) > 0) and np.all(row[len(sel):] == -1)
            bias = x["bias"][i, 0, 0].astype(np.float32)
            assert np.all(np.isfinite(bias[:p + 1])) and np.all(np.isneginf(bias[p + 1:]))
    # Every slot of every sequence is distinct (no two tokens share a cache row).
    slots = [a.slots(i, np.arange(SMALL.max_len)) for i in range(SMALL.batch)]
    flat = np.concatenate(slots)
    assert len(set(flat.tolist())) == flat.size


def test_reference_caches_fill_at_the_positions():
    model = demo.DemoModel(SMALL)
    ref = demo.ReferenceRun(model)
    prefill = ref.prefill()
    assert all(np.all(np.isfinite(v)) for v in prefill.values())
    for s in range(3):
        before = {k: v.copy() for k, v in ref.caches.items()}
        ins = model.step_inputs(s)
        out = ref.step(ins)
        assert all(np.all(np.isfinite(np.asarray(v, np.float64))) for v in out.values())
        for i, p in enumerate(model.positions(s)):
            for layer in range(SMALL.layers):
                if SMALL.dense(layer):
                    flat = ref.caches[f"kc{layer}"].reshape(-1, SMALL.latent)
                    old = before[f"kc{layer}"].reshape(-1, SMALL.latent)
                    slot = ins["slot"][i]
                    changed = np.nonzero((flat != old).any(axis=1))[0]
                    assert slot in changed and len(changed) <= SMALL.batch
                    # The unrotated channels are the new key as given.
                    nope = SMALL.latent - SMALL.rope
                    assert np.array_equal(flat[slot, :nope], ins[f"kv{layer}"][i, :nope])
                else:
                    kc = ref.caches[f"kc{layer}"]
                    assert np.array_equal(kc[i, :, p], ins[f"k{layer}"][i, :, 0])


def _recorded(model: demo.DemoModel) -> dict:
    """What the GPU run records, filled with the references themselves."""
    ref = demo.ReferenceRun(model)
    rec = {"prefill": ref.prefill(), "outputs": []}
    for s in range(model.cfg.decode_steps):
        rec["outputs"].append(ref.step(model.step_inputs(s)))
    rec["caches"] = dict(ref.caches)
    return rec


def test_verification_bookkeeping():
    model = demo.DemoModel(SMALL)
    rec = _recorded(model)
    errs = demo._verify(SMALL, model, rec)
    assert set(errs) == {"prefill", "eager", "replay", "caches"}
    assert set(errs["eager"]) == {"PagedAttention", "IndexShare"}
    assert all(e == 0.0 for per in errs.values() for e in per.values()), errs
    # A wrong replay output of the sparse layer is charged to IndexShare in the replays only.
    last = rec["outputs"][-1]
    last["o1"] = last["o1"] * 1.1
    errs = demo._verify(SMALL, model, rec)
    assert errs["replay"]["IndexShare"] > demo.TOL
    assert errs["replay"]["PagedAttention"] == 0.0 and errs["eager"]["IndexShare"] == 0.0
    rec["caches"]["kc0"] = rec["caches"]["kc0"] * 0  # a cache that never filled
    assert demo._verify(SMALL, model, rec)["caches"]["PagedAttention"] > demo.TOL


def test_every_node_is_claimed():
    claims = demo._claims(demo.DemoConfig(), demo.DemoModel(demo.DemoConfig()))
    assert claims["refused"] == []
    assert claims["nodes"] == {"Attention": 8, "PagedAttention": 2, "IndexShare": 2}


@pytest.mark.slow
def test_cli_demo_without_gpu_compiles_and_runs_the_references():
    if attnrt.gpu_missing_reason() is None:
        pytest.skip("a GPU is present: tests/test_demo_gpu.py runs the GPU path")
    # The session's cache directory (tests/conftest.py), shared with the kernel-source
    # compile tests, so a session compiles each variant once.
    env = {**os.environ, "ATTNRT_CACHE_DIR": os.environ["ATTNRT_CACHE_DIR"]}
    res = subprocess.run([sys.executable, "-m", "attnrt.app.cli", "demo", "--steps", "2", "--json"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    report = json.loads(res.stdout)
    assert report["gpu"] is False and report["ok"], report["failures"]
    assert report["compile"]["failed"] == 0 and report["compile"]["variants"] >= 10
    assert report["claims"]["refused"] == []
    ref = report["cpu_reference"]
    assert ref["decode_steps"] == 2 and ref["ops_per_step"] == 4 and ref["finite"]
    assert len(report["gpu_would_add"]) == 3
    assert "warm:" in res.stderr and "no GPU" in res.stderr  # progress went to stderr
    text = demo.format_report(report)
    assert "result     OK" in text and "would also" in text
