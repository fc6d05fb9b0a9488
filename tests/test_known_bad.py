"""Known-bad windows (issue 42, item 5): the release table's rows of (cuDNN,
compute capability, call shape) that must not be served, and the named
refusal they make at the controller (every door goes through it), in
``warm`` (a stored negative entry), ``warm --check`` and ``explain``.

The figures are pytorch#194927's ``check_cudnn_sdpa_decode`` ("cuDNN SDPA
decode is disabled for cuDNN versions 9.19-9.25.0 (except 9.24.1) on SM 10.x
and 11.x") and FlashInfer's 9.27 floor for single-token GQA ragged rows, as
/work/shared/notes/pytorch-door.md gives them.
"""

from __future__ import annotations

import pytest

from graphcache import GraphCache, Target
from graphcache.compilers.cudnn import releases
from graphcache.compilers.cudnn.release_rows import KNOWN_BAD
from graphcache.errors import KnownBad
from graphcache.ops import deploy
from graphcache.stores import DiskStore
from tests.clirun import cli
from tests.docs_examples import example
from tests.fakes import FakeCompiler, make_artifact, spec
from tests.test_docs_examples import run

B200 = "b200-sm100-cudnn9.20.0-fe1.32.0"
B200_MP = "b200-sm100-mp148-cudnn9.20.0-fe1.32.0"
B200_FIXED = "b200-sm100-cudnn9.26.0-fe1.32.0"
DECODE = {"batch": 1, "heads_q": 32, "heads_kv": 4, "seq_q": 1, "seq_kv": 700, "head_dim": 128, "mask": "none"}


def decode(**changes):  # noqa: ANN003
    return spec(**{**DECODE, **changes})


def test_the_decode_window_is_the_first_row_and_every_row_names_its_source():
    assert KNOWN_BAD[0].name == "cudnn_decode_sm10x"
    assert "pytorch#194927" in KNOWN_BAD[0].source
    assert all(row.source and row.what for row in KNOWN_BAD)


@pytest.mark.parametrize(
    ("cudnn", "cc", "refused"),
    [
        ("9.18.1", "10.0", False),
        ("9.19.0", "10.0", True),
        ("9.20.0", "10.0", True),  # torch 2.13's wheel on B200: pytorch#193893
        ("9.24.0", "10.3", True),  # torch 2.14.1's wheel
        ("9.24.1", "10.0", False),  # the exception
        ("9.25.0", "11.0", True),
        ("9.25.1", "10.0", False),
        ("9.26.0", "10.0", False),
        ("9.20.0", "9.0", False),  # H100 / H200: not SM 10.x or 11.x
        ("9.20.0", "12.0", False),
    ],
)
def test_the_decode_window_by_release_and_architecture(cudnn, cc, refused):
    sm = cc.replace(".", "")
    target = Target.parse(f"gpu-sm{sm}-cudnn{cudnn}-fe1.32.0")
    assert (releases.known_bad(decode(), target) is not None) is refused
    assert releases.known_bad(decode(seq_q=2), target) is None  # a prefill is never in it


def test_the_ragged_gqa_decode_row_keeps_thd_decode_batches_off_cudnn_below_9_27():
    thd = decode(layout="thd", seq_kv=4096, batch=8)
    assert releases.known_bad(thd, Target.parse("h200-sm90-cudnn9.26.0-fe1.32.0")).name == "cudnn_ragged_gqa_decode"
    assert releases.known_bad(thd, Target.parse("h200-sm90-cudnn9.27.0-fe1.32.0")) is None
    assert releases.known_bad(thd.replace(heads_kv=32), Target.parse("h200-sm90-cudnn9.26.0-fe1.32.0")) is None


def test_the_reference_compilers_target_runs_no_cudnn_so_no_window_refuses_it():
    # Its cuDNN "0.0.0" is below every floor; a CPU host's walk with --compiler reference
    # serves a ragged GQA decode (Falcon's padded batch on the backend route) all the same.
    from graphcache.compilers.reference import TARGET

    thd = decode(layout="thd", seq_kv=4096, batch=8)
    assert releases.known_bad(thd, Target.parse("h200-sm90-cudnn9.26.0-fe1.32.0")) is not None
    assert releases.known_bad(thd, TARGET) is None and releases.known_bad(decode(), TARGET) is None


def test_the_controller_refuses_before_any_stored_plan_and_builds_nothing(tmp_path):
    store = DiskStore(tmp_path)
    target = Target.parse(B200)
    compiler = FakeCompiler(target)
    cache = GraphCache(store, compiler)
    # A plan stored before the window was known (an older graphcache built it) is never served.
    store.put(cache.key(decode()), make_artifact(decode(), target).encode())
    with pytest.raises(KnownBad, match="pytorch#194927") as refused:
        cache.load(decode())
    assert refused.value.window == "cudnn_decode_sm10x" and refused.value.step == "known_bad"
    assert compiler.builds == 0 and cache.stats()["unsupported"] == 2  # its class refused, then the exact spec
    cache.load(decode(seq_q=16))  # a prefill on the same target is served
    fixed = GraphCache(DiskStore(tmp_path / "fixed"), FakeCompiler(Target.parse(B200_FIXED)))
    assert fixed.load(decode()).spec == fixed.serving_class(decode())  # built and served on cuDNN 9.26


def test_a_known_bad_class_on_a_target_with_override_goes_to_the_exact_graph_not_its_padded_form(tmp_path):
    # cuDNN 9.22 on B200: override and the padding mask, inside the decode window. The window is about
    # the call, not the mechanism: load refuses as warm does, without a padded try warm never made.
    compiler = FakeCompiler(Target.parse("b200-sm100-cudnn9.22.0-fe1.32.0"))
    cache = GraphCache(DiskStore(tmp_path), compiler)
    with pytest.raises(KnownBad, match="pytorch#194927"):
        cache.load(decode())
    assert compiler.builds == 0 and cache.stats()["unsupported"] == 2  # its class refused, then the exact spec


def test_warm_stores_the_refusal_as_a_named_negative_entry(tmp_path):
    store = DiskStore(tmp_path)
    target = Target.parse(B200)
    compiler = FakeCompiler(target)
    cache = GraphCache(store, compiler, shape_classes="exact")
    store.put(cache.key(decode()), make_artifact(decode(), target).encode())  # a plan of an older release
    rows = deploy.warm([decode(), decode(seq_q=64)], cache)
    assert [r.status for r in rows] == ["refused", "built"]
    assert "known-bad window cudnn_decode_sm10x" in rows[0].detail and "pytorch#194927" in rows[0].detail
    stored = cache.lookup(decode())
    assert stored.unsupported and stored.runtime["known_bad"] == "cudnn_decode_sm10x"
    refusal = stored.refusal()
    assert isinstance(refusal, KnownBad) and refusal.window == "cudnn_decode_sm10x"
    assert [r.status for r in deploy.warm([decode()], cache)] == ["refused"] and compiler.builds == 1


def test_check_and_explain_name_the_refusal_and_its_source(tmp_path):
    store = DiskStore(tmp_path)
    row = deploy.check([decode()], Target.parse(B200), store)[0]
    assert not row.present and "pytorch#194927" in row.refused
    assert "pytorch#194927" in deploy.explain(decode(), Target.parse(B200_MP), store).refused
    fixed = Target.parse(B200_FIXED)
    assert deploy.check([decode()], fixed, store, shape_classes="exact")[0].refused == ""
    assert deploy.explain(decode(), fixed, store, shape_classes="exact").refused == ""


def test_the_cli_refuses_a_b200_decode_spec_on_cudnn_9_20_and_serves_it_on_9_26(tmp_path):
    spec_file = tmp_path / "decode.yaml"  # a manifest: explain reads one too
    fields = ", ".join(f"{k}: {v}" for k, v in {**DECODE, "dtype": "bfloat16"}.items())
    spec_file.write_text(f"graphs:\n  - {{name: decode, {fields}}}\n")
    store = tmp_path / "store"
    DiskStore(store)  # an empty store: explain and warm --check open it read-only
    env = {"GRAPHCACHE_SHAPE_CLASSES": "exact"}
    for target in (B200, B200_MP):
        explained = cli("explain", str(spec_file), "--target", target, "--store", str(store), env=env)
        assert explained.returncode == 0, explained.stderr
        assert "refused:" in explained.stdout and "cudnn_decode_sm10x" in explained.stdout
        assert "pytorch#194927" in explained.stdout
        checked = cli("warm", str(spec_file), "--check", "--target", target, "--store", str(store), env=env)
        assert checked.returncode == 0, checked.stdout + checked.stderr  # refused is no miss: torch serves it
        assert "refused" in checked.stdout and "pytorch#194927" in checked.stdout
    from graphcache.ops import manifest

    (exact,) = manifest.load(spec_file)
    DiskStore(store).put(
        GraphCache(DiskStore(store), FakeCompiler(Target.parse(B200_FIXED))).key(exact),
        make_artifact(exact, Target.parse(B200_FIXED)).encode(),
    )
    explained = cli("explain", str(spec_file), "--target", B200_FIXED, "--store", str(store), env=env)
    assert explained.returncode == 0 and "present:" in explained.stdout and "refused" not in explained.stdout
    checked = cli("warm", str(spec_file), "--check", "--target", B200_FIXED, "--store", str(store), env=env)
    assert checked.returncode == 0 and "1/1 present" in checked.stdout


def test_the_two_doors_page_example_refuses_on_cudnn_9_20_and_looks_up_on_9_26(tmp_path):
    out = run(example("known-bad"), tmp_path).stdout
    assert "refused: b1 h32/4 s1/700" in out and "cudnn_decode_sm10x" in out and "pytorch#194927" in out
    assert "missing: b1 h32/4 s1/700 d128 bf16 bshd none on b200-sm100-cudnn9.26.0-fe1.32.0" in out
