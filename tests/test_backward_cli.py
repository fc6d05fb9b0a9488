"""Backward graphs through the CLI, as a user without a GPU walks it
(issue 42 item 2): ``graphcache record --backward`` of a training step,
``warm`` and ``warm --check`` with the reference compiler, ``explain``, the
warmed cache serving ``sdpa_backward``; ``graphcache manifest --backward``."""

from __future__ import annotations

import json

import pytest

from graphcache import GraphCache, manifest, ops
from graphcache.stores import DiskStore
from tests.clirun import cli

torch = pytest.importorskip("torch", reason="record runs the script with torch")

TRAIN = """
import sys
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = torch.nn.Linear(64, 64), torch.nn.Linear(64, 32), torch.nn.Linear(64, 32)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 4, 16).transpose(1, 2)
        k, v = (p(x).view(b, s, 2, 16).transpose(1, 2) for p in (self.k, self.v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(b, s, 64)


model = Attention()
x = torch.randn(2, int(sys.argv[1]), 64)
model(x).square().mean().backward()  # a training step
with torch.no_grad():
    model(x[:1, :5])  # and an evaluation call
"""


def test_record_backward_warm_check_explain_and_serve_a_training_step(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    path = tmp_path / "train.yaml"
    run = cli("record", "-o", str(path), "--dtype", "bfloat16", "--backward", str(script), "20")
    assert run.returncode == 0, run.stderr
    assert "2 spec(s) from 2 SDPA call(s), 4 graph(s) under shape classes pow2; 2 backward spec(s)" in run.stdout
    specs = manifest.load(path)
    assert sorted((s.kind, s.generate_stats, s.batch) for s in specs) == [
        ("backward", False, 1), ("backward", False, 2),  # each call's backward
        ("forward", False, 1),  # the evaluation call, as it was
        ("forward", True, 2),  # the training call's forward, writing the stats its backward reads
    ]  # fmt: skip
    assert all(s.is_class and (s.seq_q, s.heads_kv, s.mask) == (128, 2, "causal") for s in specs)
    assert "(graphcache record --backward): 2 backward spec(s)" in path.read_text()
    folder = ("--cache-dir", str(tmp_path / "cache"))
    warm = cli(*folder, "warm", str(path), "--compiler", "reference")
    assert warm.returncode == 0 and "4 built" in warm.stdout, warm.stdout + warm.stderr
    check = cli(*folder, "warm", str(path), "--check", "--compiler", "reference")
    assert check.returncode == 0 and "4/4 present" in check.stdout, check.stdout
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
    assert {s.replace(kind="forward") for s in backs} == set(before)  # one backward per spec
    assert {s.replace(generate_stats=False) for s in after if s.generate_stats} == set(before)
    assert "--backward" in train.read_text() and "(backward)" in train.read_text()
    rows = ops.warm(after, GraphCache(DiskStore(tmp_path / "store"), "reference", shape_classes="pow2"))
    assert {r.status for r in rows} == {"built"} and len(rows) == 3 * len(before)
