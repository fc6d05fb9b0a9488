"""Backward graphs through the CLI, as a user without a GPU walks it
(issue 42 item 2): ``graphcache record --backward`` of a training step,
``warm`` and ``warm --check`` with the reference compiler, ``explain``, the
warmed cache serving ``sdpa_backward``; ``graphcache manifest --backward``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphcache import GraphCache, manifest, ops
from graphcache.spec.backward import backward_of
from graphcache.stores import DiskStore
from tests.clirun import cli
from tests.docs_examples import ROOT, example

torch = pytest.importorskip("torch", reason="record runs the script with torch")


def test_record_backward_warm_check_explain_and_serve_a_training_step(tmp_path):
    """docs/backward.md's training script, recorded and warmed as the page writes it."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(example("backward-train").text)
    env = {**os.environ, "GRAPHCACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    block = example("backward-record")
    run = subprocess.run(
        ["bash", "-e", "-c", block.text], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, f"{block.where}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "2 spec(s) from 2 SDPA call(s), 4 graph(s) under shape classes pow2; 2 backward spec(s)" in run.stdout
    assert "4 built" in run.stdout and "4/4 present" in run.stdout, run.stdout
    path = work / "train.yaml"
    specs = manifest.load(path)
    assert sorted((s.kind, s.generate_stats, s.batch) for s in specs) == [
        ("backward", False, 1), ("backward", False, 2),  # each call's backward
        ("forward", False, 1),  # the evaluation call, as it was
        ("forward", True, 2),  # the training call's forward, writing the stats its backward reads
    ]  # fmt: skip
    assert all(s.is_class and (s.seq_q, s.heads_kv, s.mask) == (128, 2, "causal") for s in specs)
    assert "(graphcache record --backward): 2 backward spec(s)" in path.read_text()
    folder = ("--cache-dir", str(tmp_path / "cache"))
    asked = tmp_path / "spec.json"
    fields = dict(batch=2, heads_q=4, heads_kv=2, seq_q=100, head_dim=16, dtype="bfloat16", mask="causal")
    asked.write_text(json.dumps({**fields, "kind": "backward"}))
    explain = cli(*folder, "explain", str(asked), "--compiler", "reference")
    assert explain.returncode == 0 and "served by its class's graph" in explain.stdout, explain.stdout
    asked.write_text(json.dumps({**fields, "kind": "backward", "seq_q": 300}))
    explain = cli(*folder, "explain", str(asked), "--compiler", "reference")
    assert explain.returncode == 1 and "backward" in explain.stdout and "seq_q" in explain.stdout, explain.stdout

    # The warmed cache serves the training step's backward at another length of the class.
    import graphcache.torch as gt
    from graphcache.torch.backward import sdpa_backward

    gt.reset()
    try:
        gt.configure(GraphCache(DiskStore(tmp_path / "cache"), "reference"), device="cpu", on_miss="error")
        # (b, h, s, d) views of (b, s, h, d) tensors, as the script's projections make them (layout bshd)
        q, grad_out, out = (torch.randn(2, 33, 4, 16, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
        k, v = (torch.randn(2, 33, 2, 16, dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
        lse = torch.randn(2, 4, 33, dtype=torch.float32)
        dq, dk, dv = sdpa_backward(grad_out, q, k, v, out, lse, is_causal=True, enable_gqa=True)
        assert dk.shape == k.shape and gt.stats()["backward"]["hits"] == 1
    finally:
        gt.reset()


def test_manifest_backward_adds_each_specs_training_forward_and_backward(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            dict(model_type="llama", hidden_size=256, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=2)
        )
    )
    plain, train = tmp_path / "plain.yaml", tmp_path / "train.yaml"
    common = ("--max-batch", "2", "--max-seq", "256", "--no-decode", "--method", "config")
    assert cli("manifest", str(config), *common, "-o", str(plain)).returncode == 0
    run = cli("manifest", str(config), *common, "--backward", "-o", str(train))
    assert run.returncode == 0, run.stderr
    before, after = manifest.load(plain), manifest.load(train)
    backs = [s for s in after if s.kind == "backward"]
    assert set(backs) == {backward_of(s) for s in before}  # one backward per spec (in k's one layout)
    assert {s.replace(generate_stats=False) for s in after if s.generate_stats} == set(before)
    assert "--backward" in train.read_text() and "(backward)" in train.read_text()
    rows = ops.warm(after, GraphCache(DiskStore(tmp_path / "store"), "reference", shape_classes="pow2"))
    assert {r.status for r in rows} == {"built"} and len(rows) == 3 * len(before)
