"""graphcache.torch.record and ``graphcache record``: manifests from real model
runs (torch's own modules and a Hugging Face Llama), read back by warm."""

from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphSpec, ManifestError, SpecError, manifest  # noqa: E402
from graphcache.spec.classes import class_of  # noqa: E402
from tests.clirun import cli  # noqa: E402
from tests.fakes import TARGET  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch):
    # Exact specs here (the CLI's subprocesses inherit it); length classes
    # are recorded in tests/test_classes_llama.py and test_classes_ops.py.
    monkeypatch.setenv("GRAPHCACHE_SHAPE_CLASSES", "exact")
    gt.reset()
    yield
    gt.reset()


def spec(**fields) -> GraphSpec:  # noqa: ANN003
    return GraphSpec.from_dict({"dtype": "bfloat16", **fields})


def test_torch_modules_record_exactly_their_specs(tmp_path):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(256, 4, batch_first=True).eval()
    tel = torch.nn.TransformerEncoderLayer(256, 4, 512, batch_first=True).eval()
    one, two = torch.randn(1, 16, 256), torch.randn(2, 24, 256)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(16)
    path = tmp_path / "m.yaml"
    with torch.no_grad(), gt.record(path, dtype="bfloat16") as recorder:
        mha(one, one, one, need_weights=False)
        tel(one)
        tel(one, src_mask=causal, is_causal=True)
        mha(two, two, two, need_weights=False)
    # (s, b*h, d) views of the in-projection: sequence-first above batch 1, read where they lie; at batch 1
    # only the strides of the dims larger than 1 decide, and they are bshd's too (cuDNN runs both alike).
    base = dict(batch=1, heads_q=4, seq_q=16, head_dim=64, layout="bshd")
    two_spec = spec(**{**base, "batch": 2, "seq_q": 24, "layout": "sbhd"}, mask="none")
    assert manifest.load(path) == [spec(**base, mask="none"), spec(**base, mask="causal"), two_spec]
    assert recorder.specs == {spec(**base, mask="none"): 2, spec(**base, mask="causal"): 1, two_spec: 1}
    assert "# 4 SDPA call(s); 3 distinct" in path.read_text() and not recorder.ineligible


def test_record_round_trips_every_kind_of_spec(tmp_path):
    calls = [
        ((2, 8, 16, 64), (2, 8, 16, 64), (2, 8, 16, 64), {}),
        ((1, 8, 4, 128), (1, 2, 40, 128), (1, 2, 40, 128), {"is_causal": True, "enable_gqa": True}),
        ((1, 4, 8, 64), (1, 4, 8, 64), (1, 4, 8, 32), {"scale": 0.3}),
        ((1, 4, 8, 64), (1, 4, 8, 64), (1, 4, 8, 64), {"scale": 1e-05}),
    ]
    path = tmp_path / "m.yaml"
    with gt.record(path, dtype=torch.float16) as recorder:
        for qs, ks, vs, kwargs in calls:
            q, k, v = torch.randn(*qs), torch.randn(*ks), torch.randn(*vs)
            torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
            torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
    assert manifest.load(path) == list(recorder.specs)
    assert len(recorder.specs) == 4 and set(recorder.specs.values()) == {2}
    assert {s.dtype for s in recorder.specs} == {"float16"}


def test_a_recording_with_no_eligible_call_says_why_and_writes_nothing(tmp_path):
    path = tmp_path / "m.yaml"
    q = torch.randn(1, 4, 8, 64)
    with pytest.raises(ManifestError, match=r"dtype \(1 call\(s\)\): dtype torch.float32 .*dtype='bfloat16'"):
        with gt.record(path):
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert not path.exists()


def test_record_refuses_a_bad_dtype_or_folder_before_running(tmp_path):
    with pytest.raises(SpecError, match="dtype='fp8'.*float16, bfloat16"):
        with gt.record(tmp_path / "m.yaml", dtype="fp8"):
            pytest.fail("the block must not run")
    with pytest.raises(ManifestError, match="does not exist"):
        with gt.record(tmp_path / "nowhere" / "m.yaml"):
            pytest.fail("the block must not run")


def test_an_exception_in_the_block_writes_no_manifest(tmp_path):
    path = tmp_path / "m.yaml"
    q = torch.randn(1, 4, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="model crashed"), gt.record(path):
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
        raise RuntimeError("model crashed")
    assert not path.exists() and not gt.enabled()


# -- a model nobody on this project wrote: Hugging Face Llama (GQA, "sdpa") ---------------


LLAMA = """
import sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM

prompt = int(sys.argv[1]) if len(sys.argv) > 1 else 12
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
    attn_implementation="sdpa",
)
model = LlamaForCausalLM(config).eval()
ids = torch.randint(0, 256, (1, prompt))
with torch.no_grad():  # a prefill and 3 cached decode steps
    out = model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
assert out.shape == (1, prompt + 4)
"""


def llama_expected(prompt: int) -> list[GraphSpec]:
    """What Llama's sdpa attention asks for: a causal prefill (q a transposed
    projection, bshd; k/v the contiguous cache, bhsd) and one-token decode
    steps over a growing cache (bhsd: a one-token q fits it); 8 query heads
    share 2 key/value heads; head_dim 256/8."""
    base = dict(batch=1, heads_q=8, heads_kv=2, head_dim=32, layout="bhsd")
    prefill = spec(**base, seq_q=prompt, mask="causal", layout_q="bshd")
    return [prefill] + [spec(**base, seq_q=1, seq_kv=prompt + n) for n in (1, 2, 3)]


def test_llama_records_exactly_its_prefill_and_decode_specs(tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra installs it)")
    script = tmp_path / "llama.py"
    script.write_text(LLAMA)
    path = tmp_path / "llama.yaml"
    # The in-process API: a float32 CPU run, recorded as the GPU will run it.
    import runpy
    import sys

    monkeypatch.setattr(sys, "argv", [str(script)])
    with gt.record(path, dtype="bfloat16") as recorder:
        runpy.run_path(str(script), run_name="__main__")
    assert manifest.load(path) == llama_expected(12)
    assert set(recorder.specs.values()) == {2}  # each spec once per layer
    assert recorder.ineligible == {}


def test_graphcache_record_cli_runs_the_script_and_warm_check_lists_the_specs(tmp_path):
    pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra installs it)")
    script = tmp_path / "llama.py"
    script.write_text(LLAMA)
    path = tmp_path / "llama.yaml"
    out = cli("record", "-o", str(path), "--dtype", "bfloat16", str(script), "20")  # ARGS reach the script
    assert out.returncode == 0, out.stderr
    assert "4 spec(s)" in out.stdout and str(path) in out.stdout
    assert manifest.load(path) == llama_expected(20)
    store = ["--cache-dir", str(tmp_path / "cache")]
    check = cli("warm", str(path), "--check", "--target", str(TARGET), *store)
    assert check.returncode == 1
    for s in llama_expected(20):
        assert s.summary() in check.stdout
    assert "0/4 present" in check.stdout
    warm = cli("warm", str(path), "--compiler", "tests.fakes:FakeCompiler", *store)  # the GPU's step, stood in
    assert warm.returncode == 0, warm.stderr
    check = cli("warm", str(path), "--check", "--target", str(TARGET), *store)
    assert check.returncode == 0 and "4/4 present" in check.stdout


def test_record_max_batch_writes_every_batch_class_of_each_call_seen_padded_too(tmp_path):
    pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra installs it)")
    script = tmp_path / "llama.py"
    script.write_text(LLAMA)
    path = tmp_path / "llama.yaml"
    out = cli(
        "record",
        "-o",
        str(path),
        "--dtype",
        "bfloat16",
        "--max-batch",
        "4",
        "--shape-classes",
        "pow2",
        str(script),
        "20",
    )
    assert out.returncode == 0, out.stderr
    specs = manifest.load(path)
    seen = {class_of(s, "pow2") for s in llama_expected(20)}
    assert seen <= set(specs)
    assert {s.batch for s in specs} == {1, 2, 4}
    # A padded batch's prompt through transformers' sdpa: a bias graph (its 4-D mask).
    assert any(s.bias == "b1ss" and s.batch == 4 and s.seq_q > 1 for s in specs)
    assert "# Widened to batches up to 4" in path.read_text()
    exact = cli("record", "-o", str(path), "--max-batch", "4", "--shape-classes", "exact", str(script), "20")
    assert exact.returncode != 0 and "shape classes pow2 (they are exact)" in exact.stderr


def test_graphcache_record_passes_a_failing_scripts_status_and_writes_nothing(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import torch
            q = torch.randn(1, 4, 8, 64, dtype=torch.bfloat16)
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
            sys.exit(int(sys.argv[1]))
            """
        )
    )
    path = tmp_path / "m.yaml"
    out = cli("record", "-o", str(path), str(script), "3")
    assert out.returncode == 3 and not path.exists()
    assert "no manifest written" in out.stderr
    # A status 0 writes the manifest: the CLI runs above and below (Llama,
    # --max-seq) assert it, so no second process here (each imports torch).


def test_graphcache_record_names_a_missing_script(tmp_path):
    out = cli("record", "-o", str(tmp_path / "m.yaml"), str(tmp_path / "nope.py"))
    assert out.returncode == 2 and "nope.py" in out.stderr


def test_graphcache_record_shows_a_raising_scripts_traceback_as_python_would(tmp_path):
    """The script's own exception is the script's: its traceback and exit 1,
    never "internal error" of graphcache; sys.argv and __file__ as python sets them."""
    script = tmp_path / "raises.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys
            print("argv", sys.argv)
            print("file_is_absolute", os.path.isabs(__file__))
            if sys.argv[1] == "raise":
                raise RuntimeError("boom from the script")
            sys.exit("a message, as sys.exit(str) gives")
            """
        )
    )
    path = tmp_path / "m.yaml"
    out = cli("record", "-o", str(path), str(script), "raise", "--flag")
    assert out.returncode == 1 and not path.exists()
    assert "Traceback" in out.stderr and "RuntimeError: boom from the script" in out.stderr
    assert "internal error" not in out.stderr and "no manifest written" in out.stderr
    assert f"argv ['{script}', 'raise', '--flag']" in out.stdout and "file_is_absolute True" in out.stdout
    out = cli("record", "-o", str(path), str(script), "exit")
    assert out.returncode == 1 and "a message, as sys.exit(str) gives" in out.stderr and not path.exists()


def test_lengthened_grows_each_call_shape_to_every_length_class_up_to_max_seq():
    from graphcache.models.specs import lengthened

    square = spec(batch=2, heads_q=8, seq_q=300, head_dim=64, layout="bshd", mask="none")
    assert {(s.seq_q, s.seq_kv) for s in lengthened(square, 1024)} == {(n, n) for n in (128, 256, 512, 1024)}
    assert all(s.is_class and s.batch == 2 for s in lengthened(square, 1024))
    decode = spec(batch=1, heads_q=8, heads_kv=2, seq_q=1, seq_kv=700, head_dim=64, layout="bhsd", mask="none")
    assert {(s.seq_q, s.seq_kv) for s in lengthened(decode, 300)} == {(1, 128), (1, 256), (1, 512), (1, 1024)}
    # Cross-attention (image tokens to 77 prompt tokens): either side may grow.
    cross = spec(batch=2, heads_q=8, seq_q=256, seq_kv=77, head_dim=64, layout="bshd", mask="none")
    grown = {(s.seq_q, s.seq_kv) for s in lengthened(cross, 512)}
    assert grown == {(q, kv) for q in (128, 256, 512) for kv in (128, 256, 512)}
    # The call's lengths say it is cross-attention, whatever classes they fall in: 64 queries to 24 keys
    # (both class 128) grow each side too, not along the diagonal.
    short = spec(batch=1, heads_q=8, seq_q=64, seq_kv=24, head_dim=64, layout="bhsd", mask="none")
    assert {(s.seq_q, s.seq_kv) for s in lengthened(short, 512)} == grown
    # A causal call with fewer queries than keys (a chunk on a cache) keeps fewer queries.
    chunk = spec(batch=1, heads_q=8, seq_q=100, seq_kv=300, head_dim=64, layout="bhsd", mask="causal_bottom_right")
    assert all(s.seq_q <= s.seq_kv for s in lengthened(chunk, 512))


def test_record_max_seq_writes_every_length_class_so_a_longer_input_is_served(tmp_path):
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    path = tmp_path / "m.yaml"
    with torch.no_grad(), gt.record(path, dtype="bfloat16", shape_classes="pow2", max_seq=600):
        mha(*(torch.randn(1, 100, 64),) * 3, need_weights=False)
    specs = manifest.load(path)
    assert {(s.batch, s.seq_q, s.seq_kv) for s in specs} == {(1, n, n) for n in (128, 256, 512, 1024)}
    assert "# Widened to lengths up to 600 (graphcache record --max-seq)" in path.read_text()
    longer = GraphSpec.from_dict({**specs[0].to_dict(), "seq_q": 900, "seq_kv": 900, "shapes": "exact"})
    assert class_of(longer, "pow2") in specs  # a call of 900 tokens finds its class
    with pytest.raises(ManifestError, match="max_seq=600: widening to length classes needs .* pow2"):
        with gt.record(tmp_path / "x.yaml", shape_classes="exact", max_seq=600):
            pass


def test_graphcache_record_max_seq_and_max_batch_widen_together(tmp_path):
    script = tmp_path / "attend.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            q = torch.randn(1, 4, 256, 32, dtype=torch.bfloat16)
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
            """
        )
    )
    path = tmp_path / "m.yaml"
    args = ("--max-seq", "1024", "--max-batch", "2", "--shape-classes", "pow2")
    out = cli("record", "-o", str(path), *args, str(script))
    assert out.returncode == 0, out.stderr
    specs = manifest.load(path)
    dense = {(s.batch, s.seq_q) for s in specs if s.bias is None}
    assert dense == {(b, n) for b in (1, 2) for n in (128, 256, 512, 1024)}
    # Batch 2 may be a padded batch: transformers' sdpa passes its mask, a bias graph, at every length too.
    assert {(s.batch, s.seq_q) for s in specs if s.bias} == {(2, n) for n in (128, 256, 512, 1024)}


def test_cross_attention_recorded_with_max_seq_serves_longer_queries_over_the_same_keys(tmp_path):
    """q of 64 rows over 24 keys (both in the class of 128), recorded with
    --max-seq 1024, then run with q of 1024: each side grows to every class."""
    from graphcache import GraphCache, ops
    from graphcache.stores import DiskStore

    script = tmp_path / "cross.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import torch
            g = torch.Generator().manual_seed(0)
            q = torch.randn(1, 8, int(sys.argv[1]), 64, generator=g).to(torch.bfloat16)
            k, v = (torch.randn(1, 8, 24, 64, generator=g).to(torch.bfloat16) for _ in range(2))
            torch.nn.functional.scaled_dot_product_attention(q, k, v)
            """
        )
    )
    path = tmp_path / "m.yaml"
    out = cli("record", "-o", str(path), "--max-seq", "1024", "--shape-classes", "pow2", str(script), "64")
    assert out.returncode == 0, out.stderr
    store = DiskStore(tmp_path / "store")
    ops.warm(manifest.load(path), GraphCache(store, "reference", shape_classes="pow2"))
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 8, 1024, 64, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(1, 8, 24, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    gt.configure(GraphCache(store, "reference", shape_classes="pow2"), device="cpu", on_miss="torch")
    with gt.patch():
        got = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    stats = gt.stats()
    assert (stats["calls"], stats["hits"]) == (1, 1), stats
    assert torch.allclose(got.float(), want.float(), atol=2e-2)
