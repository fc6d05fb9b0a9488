"""A worker on the cuDNN most PyTorch users have (9.19: torch 2.11's CUDA
wheels, no execute-time shape override), walked on this CPU: the reference
compiler stands in for that release (GRAPHCACHE_REFERENCE_CUDNN=9.19.0), so
classes are served by the padded mechanism, as on such a GPU.

Through the CLI and a fresh worker process, as a user drives it: a tiny
Llama's manifest traced from its config alone, warmed on 9.19 and on 9.26,
then generate after prompts of 37, 200 and 513 tokens and for a left-padded
batch of 3 under ``graphcache.torch.patch()``: the calls are served from the
store, nothing is built, the tokens are plain torch's, and the copies the
padded classes made are counted. (64 new tokens in
scripts/bench/bench_classes_padded.py's figure, the script this test runs; 4 here.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clirun import cli

pytest.importorskip("torch", reason="the worker runs a torch model")
pytest.importorskip("transformers", reason="the worker runs a transformers Llama")

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "docs" / "examples" / "configs" / "tiny-llama"


def test_a_tiny_llama_on_cudnn_9_19_decodes_from_its_manifest_alone_through_padded_classes(tmp_path):
    # scripts/bench/bench_classes_padded.py as a user runs it, with 4 new tokens: graphcache manifest, warm and
    # warm --check per release through the CLI, then a fresh worker process generating under patch().
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench" / "bench_classes_padded.py"), "--new-tokens", "4", "--json",
         str(tmp_path / "rows.json")],
        capture_output=True, text=True, timeout=1200, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    old, new = json.loads((tmp_path / "rows.json").read_text())
    assert old["mechanism"].startswith("length classes on reference-sm00-cudnn9.19.0-fe0.0.0: padded: no execute-time")
    assert new["mechanism"].startswith("length classes on reference-sm00-cudnn9.26.0-fe0.0.0: override")
    assert old["check"].startswith(f"{old['graphs_stored']}/{old['graphs_stored']} present")
    assert old["graphs_stored"] <= 2 * new["graphs_stored"]
    for row in (old, new):
        assert row["tokens_equal"] == [True] * 4, row
        assert row["built_here"] == 0 and row["served_from_store"] >= 0.95 * row["calls"], row
    assert old["copies"] > 0 and old["copied_bytes"] > 0 and new["copies"] == 0, "override reads in place"
    assert {"k", "v"} <= set(old["copied"]) and all("class_buffer" in r for r in old["copied"].values())
    assert "tokens equal" in out.stdout, "the table"


def test_a_reference_cudnn_that_is_no_release_is_refused_naming_the_variable(tmp_path):
    out = cli("warm", "--check", str(tmp_path / "m.yaml"), "--compiler", "reference", env={
        "GRAPHCACHE_REFERENCE_CUDNN": "nine"
    })  # fmt: skip
    assert out.returncode != 0
    assert "GRAPHCACHE_REFERENCE_CUDNN='nine' is not a release number; write it as 9.19.0" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_explain_says_which_mechanism_serves_a_class_on_a_target_and_why(tmp_path):
    spec = tmp_path / "decode.json"
    spec.write_text(
        json.dumps(
            {"batch": 3, "heads_q": 8, "heads_kv": 2, "seq_q": 1, "seq_kv": 300, "head_dim": 64, "dtype": "bfloat16"}
        )
    )
    klass = tmp_path / "class.yaml"
    klass.write_text(
        "graphs:\n  - {name: decode, batch: 4, heads_q: 8, heads_kv: 2, seq_q: 1, seq_kv: 512, head_dim: 64, dtype: bfloat16,"
        " shapes: class}\n"
    )
    store = ["--compiler", "reference", "--cache-dir", str(tmp_path / "s")]
    for cudnn, mechanism, why in (
        ("9.19.0", "padded serves", "no execute-time shape override (execute-time shape override needs cuDNN >= 9.21"),
        ("9.26.0", "override serves", "execute-time shape override (cuDNN >= 9.21 and cudnn-frontend >= 1.24"),
    ):
        env = {"GRAPHCACHE_REFERENCE_CUDNN": cudnn}
        assert cli("warm", str(klass), *store, env=env).returncode == 0
        out = cli("explain", str(spec), *store, env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        text = " ".join(out.stdout.split())
        assert f"mechanism: {mechanism} length classes on reference-sm00-cudnn{cudnn}-fe0.0.0: {why}" in text, text
        assert "is served by its class's graph" in text


@pytest.mark.parametrize(
    ("cudnn", "refused"),
    [("9.4.0", "a paged K/V cache needs cuDNN >= 9.5"), ("9.19.0", None)],
)
def test_a_reference_cudnn_refuses_at_preflight_what_that_release_cannot_build(cudnn, refused):
    # The reference compiler standing in for a release runs the cuDNN compiler's own preflight.
    from graphcache.compilers.reference import ReferenceCompiler
    from graphcache.errors import UnsupportedSpec
    from graphcache.spec import GraphSpec

    paged = GraphSpec.from_dict(
        dict(batch=4, heads_q=8, seq_q=1, seq_kv=256, head_dim=64, dtype="bfloat16", layout="thd",
             page_size=16, num_pages=64, pages_per_seq=16)
    )  # fmt: skip
    compiler = ReferenceCompiler(cudnn=cudnn, frontend="1.28.0")
    if refused is None:
        assert compiler.build(paged, compiler.target()).spec == paged
        return
    with pytest.raises(UnsupportedSpec, match=refused) as exc:
        compiler.build(paged, compiler.target())
    assert exc.value.step == "preflight" and f"cuDNN {cudnn}" in str(exc.value)
