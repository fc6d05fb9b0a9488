from __future__ import annotations

import pytest

from graphcache import GraphSpec, ManifestError, manifest


def write(tmp_path, text: str):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return path


def test_families_expand_as_a_cross_product_with_defaults(tmp_path):
    path = write(
        tmp_path,
        """
defaults: {dtype: bfloat16}
graphs:
  - name: llama
    heads_q: 32
    heads_kv: 8
    head_dim: 128
    mask: causal
    batch: [1, 2, 4, 8]
    seq_q: [128, 256, 512, 1024, 2048, 4096]
""",
    )
    specs = manifest.load(path)
    assert len(specs) == 24
    assert all(s.dtype == "bfloat16" and s.heads_kv == 8 and s.mask == "causal" for s in specs)
    assert {(s.batch, s.seq_q) for s in specs} == {
        (b, q) for b in (1, 2, 4, 8) for q in (128, 256, 512, 1024, 2048, 4096)
    }


def test_family_fields_override_defaults_and_duplicates_collapse(tmp_path):
    path = write(
        tmp_path,
        """
defaults: {dtype: float16, heads_q: 8, head_dim: 64, seq_q: 128}
graphs:
  - {name: a, batch: [1, 2], dtype: bfloat16}
  - {name: b, batch: [2, 1], dtype: bfloat16}
  - {name: c, batch: 1, seq_kv: 128}
""",
    )
    specs = manifest.load(path)
    # b repeats a's specs in another order: they collapse; c differs in dtype
    assert [(s.batch, s.dtype) for s in specs] == [(1, "bfloat16"), (2, "bfloat16"), (1, "float16")]


def test_example_manifests_load():
    llama = manifest.load("docs/examples/llama3-8b.yaml")
    bert = manifest.load("docs/examples/bert-base.yaml")
    assert all(s.heads_q == 32 and s.heads_kv == 8 and s.head_dim == 128 for s in llama)
    assert {s.mask for s in llama} == {"causal", "causal_bottom_right"}
    assert all(s.heads_q == 12 and s.head_dim == 64 and s.mask == "none" for s in bert)
    assert len(set(llama)) == len(llama) and len(bert) == 11


@pytest.mark.parametrize(
    "text, words",
    [
        ("graphs: []", "non-empty list"),
        ("defaults: {}\n", "non-empty list"),
        ("- 1", "is a mapping"),
        ("graphs: [{batch: 1}]", "graphs[0] needs a 'name'"),
        ("graphs: [{name: x, batch: 1, heads_q: 8, seq_q: 128, head_dim: 60}]", "graphs[0] (x): field 'head_dim'"),
        ("graphs: [{name: x, batch: [], heads_q: 8, seq_q: 128, head_dim: 64}]", "field 'batch' is an empty list"),
        ("graphs: [{name: x, btach: 1}]", "unknown field 'btach'; did you mean 'batch'"),
        ("defaults: {dtpye: float16}\ngraphs: [{name: x}]", "defaults: unknown field 'dtpye'"),
        ("graph: []", "unknown top-level key"),
        (
            "graphs: [{name: x, batch: 1, heads_q: 8, seq_q: 128, head_dim: 64}, {name: x, batch: 2, heads_q: 8, seq_q: 128, head_dim: 64}]",
            "used twice",
        ),
        ("graphs: [{name: x, batch: 1, heads_q: 8, seq_q: 128}]", "field 'head_dim'"),
        ("graphs: [: bad", "not valid YAML"),
    ],
)
def test_errors_name_the_file_the_entry_and_the_field(tmp_path, text, words):
    path = write(tmp_path, text)
    with pytest.raises(ManifestError) as info:
        manifest.load(path)
    assert str(path) in str(info.value)
    assert words in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ManifestError, match="cannot read"):
        manifest.load(tmp_path / "nope.yaml")


def test_specs_are_graph_specs(tmp_path):
    specs = manifest.load(write(tmp_path, "graphs: [{name: x, batch: 1, heads_q: 8, seq_q: 128, head_dim: 64}]"))
    assert specs == [GraphSpec(batch=1, heads_q=8, seq_q=128, head_dim=64)]
