"""Transformers models warmed only from ``graphcache manifest`` for their
config (issue 26): no recording, then served on prompts of 50/300/700
tokens, a left-padded batch of 4 and 2-beam search, through each route
(``sdpa`` under ``graphcache.torch.patch()``, and the ``graphcache``
attention backend). The models and serving cases are issue 25's
(tests/hf_models.py); the CPU stand-in compiler executes every graph."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")
transformers = pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra)")

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache, manifest, ops  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from tests import hf_models  # noqa: E402
from tests.clirun import cli  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402

NEW_TOKENS = 8


@pytest.fixture(autouse=True)
def fresh_runtime():
    gt.reset()
    yield
    gt.reset()


def served(name: str, route: str, tmp_path) -> tuple[dict[str, hf_models.Case], int]:  # noqa: ANN001
    """Warm ``name`` from its manifest alone and serve issue 25's cases on ``route``."""
    model = hf_models.build(name, "sdpa")
    hf_models.config(name).save_pretrained(tmp_path / "model")  # config.json, as a model folder holds it
    out = tmp_path / "m.yaml"
    run = cli(
        "manifest", str(tmp_path / "model"), "--max-batch", "8", "--max-seq", "1024", "--route", route, "-o", str(out)
    )
    assert run.returncode == 0, run.stderr
    ops.warm(manifest.load(out), GraphCache(DiskStore(tmp_path / "store"), CpuGraphCompiler(), shape_classes="pow2"))
    compiler = CpuGraphCompiler()
    cache = GraphCache(DiskStore(tmp_path / "store"), compiler, shape_classes="pow2")
    found = {}
    for case, runs in hf_models.cases(hf_models.Lengths()).items():
        model.set_attn_implementation("sdpa")
        want = [hf_models.generate(model, p, NEW_TOKENS, beams) for p, beams in runs]
        model.set_attn_implementation(route)
        gt.reset()
        gt.configure(cache, device="cpu", on_miss="torch")
        with gt.patch() if route == "sdpa" else contextlib.nullcontext():
            got = [hf_models.generate(model, p, NEW_TOKENS, beams) for p, beams in runs]
        stats = gt.stats()
        equal = all(torch.equal(w, g) for w, g in zip(want, got, strict=True))
        found[case] = hf_models.Case(case, stats["calls"], stats["hits"], equal, dict(stats["fallbacks"]))
    model.set_attn_implementation("sdpa")
    return found, compiler.builds


@pytest.mark.parametrize(
    ("name", "route"),
    [
        ("llama", "sdpa"),
        ("llama", "graphcache"),
        ("bart", "sdpa"),
        ("bart", "graphcache"),
        ("mistral", "sdpa"),
        ("mistral", "graphcache"),
        ("t5", "sdpa"),  # its relative position bias on every call: bias graphs only, on either route
        ("t5", "graphcache"),
    ],
)
def test_a_model_warmed_only_from_its_config_serves_prompts_and_beams(tmp_path, name, route):
    found, builds = served(name, route, tmp_path)
    assert builds == 0, "served from what the manifest warmed"
    for case in ("other prompt lengths, b=1", "2-beam search"):
        result = found[case]
        assert result.calls and result.hits == result.calls, result
        assert result.equal, result
    # Route graphcache: ragged graphs; route sdpa: bias graphs (the decode
    # steps' as the GQA decode step the drop-in folds transformers' packed rows into).
    padded = found["padded batch of 4"]
    assert padded.fraction >= 0.95, padded
