"""graphcache.spec.layouts: each tensor's layout in a spec, its strides, its
one canonical text, and the inverse, reading layouts off a tensor's strides
(graphcache.spec.layout_fits).
The stride patterns are those the real modules hand torch's SDPA
(tests/test_torch_layouts.py runs the modules themselves)."""

from __future__ import annotations

import pytest

from graphcache import GraphSpec, ManifestError, Target, key_for, manifest
from graphcache.errors import SpecError
from graphcache.spec import layout_fits, layouts
from graphcache.spec.classes import class_of

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")


def spec(**fields: object) -> GraphSpec:
    return GraphSpec.from_dict({"batch": 4, "heads_q": 3, "seq_q": 197, "head_dim": 64, **fields})


def test_a_fused_projections_view_has_the_strides_timm_gives_it():
    # timm 1.0.31 Attention: qkv(x).reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
    vit = spec(layout="bs[3]hd")
    b, h, n, d = 4, 3, 197, 64
    assert vit.strides("q") == vit.strides("k") == vit.strides("v") == (n * 3 * h * d, d, 3 * h * d, 1)
    assert vit.strides("o") == (n * h * d, d, h * d, 1), "o is packed in q's order"
    assert vit.storage_shape("q") == (b, n, h, d)
    assert vit.summary() == "b4 h3 s197 d64 fp16 bs[3]hd none"


def test_sequence_first_and_a_heads_extended_row():
    mha = spec(layout="sbhd", heads_q=4, seq_q=10)
    assert mha.strides("k") == (4 * 64, 64, 4 * 4 * 64, 1)  # nn.MultiheadAttention's (s, b*h, d) views
    # gpt_bigcode's c_attn: each token's row holds q's 8 heads, then one key and one value head
    bigcode = GraphSpec(batch=2, heads_q=8, heads_kv=1, seq_q=9, head_dim=32, layout="bshd", layout_q="bs[+2]hd")
    assert bigcode.strides("q") == (9 * 320, 32, 320, 1) and bigcode.strides("o") == (9 * 256, 32, 256, 1)


def test_every_layout_has_one_text_and_defaults_are_left_out():
    # A whole multiple is written [N]; fields equal to their default are dropped.
    assert spec(layout="bs[+6]hd").layout == "bs[3]hd"
    same = spec(layout="bhsd", layout_q="bhsd", layout_v="bhsd", layout_o="bhsd")
    assert same == spec(layout="bhsd") and "layout_q" not in same.to_dict()
    hf = spec(layout="bhsd", layout_q="bshd")
    assert hf.layout_o is None and layouts.of(hf, "o") == "bshd", "o follows q's order"
    assert spec(layout="bhsd", layout_q="bshd", layout_o="bhsd").layout_o == "bhsd"


def test_specs_that_exist_keep_their_canonical_json_and_key():
    # Written before per-tensor layouts existed (main at f1e9111): byte for byte.
    bhsd = GraphSpec(batch=2, heads_q=8, seq_q=128, head_dim=32, dtype="bfloat16", layout="bhsd", bias="b1ss")
    assert bhsd.canonical_json() == (
        '{"attn_scale":0.17677669529663687,"batch":2,"bias":"b1ss","dropout":0.0,"dtype":"bfloat16",'
        '"generate_stats":false,"head_dim":32,"head_dim_v":32,"heads_kv":8,"heads_q":8,"layout":"bhsd",'
        '"mask":"none","padding":false,"seq_kv":128,"seq_q":128,"window_left":null,"window_right":null}'
    )
    assert key_for(bhsd, TARGET) == "ec07e5c1de97fc4ebd1789dab946967053d10b516a1b21e2af8ea69c409c66f1"


def test_a_new_layout_is_a_new_key_and_a_class_keeps_it():
    plain = spec(layout="bshd")
    keys = {key_for(plain.replace(**f), TARGET) for f in ({}, {"layout": "sbhd"}, {"layout_q": "bs[3]hd"})}
    assert len(keys) == 3
    klass = class_of(spec(layout="sbhd", batch=3, seq_q=100), "pow2")
    assert klass.layout == "sbhd" and klass.covers(spec(layout="sbhd", batch=1, seq_q=10))
    assert not klass.covers(spec(layout="bshd", batch=1, seq_q=10))


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"layout": "bsd"}, "layout", "each of b, h, s, d once"),
        ({"layout": "bshd[3]"}, "layout", "head dim must be innermost"),
        ({"layout_v": "b[+0]shd"}, "layout_v", "N >= 1"),
        ({"layout_o": "bs[3]hd"}, "layout_o", "use bshd"),
    ],
)
def test_a_bad_layout_names_the_field_in_a_manifest(tmp_path, fields, field, words):
    path = tmp_path / "m.yaml"
    lines = [f"    {k}: '{v}'" for k, v in fields.items()]
    path.write_text(
        "graphs:\n  - name: vit\n    batch: 1\n    heads_q: 3\n    seq_q: 197\n    head_dim: 64\n" + "\n".join(lines)
    )
    with pytest.raises(ManifestError, match=rf"field '{field}'.*{words}"):
        manifest.load(path)
    with pytest.raises(SpecError) as raised:
        spec(**fields)
    assert raised.value.field == field


def test_a_manifest_takes_layouts_unquoted():
    found = manifest.expand(
        {"graphs": [{"name": "vit", "batch": [1, 4], "heads_q": 3, "seq_q": 197, "head_dim": 64, "layout": "bs[3]hd"}]}
    )
    assert [s.layout for s in found] == ["bs[3]hd", "bs[3]hd"]


@pytest.mark.parametrize(
    ("shape", "stride", "best"),
    [
        ((4, 3, 197, 64), (197 * 576, 64, 576, 1), "bs[3]hd"),  # timm, batch 4
        ((4, 4, 10, 64), (256, 64, 1024, 1), "sbhd"),  # nn.MultiheadAttention, batch 4
        ((2, 8, 9, 32), (2880, 32, 320, 1), "bs[+2]hd"),  # gpt_bigcode's q
        ((2, 4, 16, 64), (8192, 2048, 128, 1), "bhs[2]d"),  # every other row: k[:, :, ::2]
    ],
)
def test_read_finds_the_layout_of_real_strides(shape, stride, best):
    fits = layout_fits.read(shape, stride)
    assert [f.text for f in fits] == [best]
    assert layouts.parse(best).strides(shape) == stride


def test_size_one_batch_strides_say_which_layout_a_larger_batch_has():
    # nn.MultiheadAttention at batch 1 fits bshd too; its batch stride says sbhd, as at batch 4.
    fits = {f.text: f.exact for f in layout_fits.read((1, 4, 10, 64), (256, 64, 256, 1))}
    assert fits["sbhd"] and not fits["bshd"]
    # timm at batch 1: the fused group is read off the batch stride too.
    fits = {f.text: f.exact for f in layout_fits.read((1, 3, 197, 64), (197 * 576, 64, 576, 1))}
    assert [t for t, exact in fits.items() if exact] == ["bs[3]hd"]


@pytest.mark.parametrize(
    ("shape", "stride", "reason"),
    [
        ((1, 4, 10, 64), (2560, 640, 1, 10), "head_dim_stride"),
        ((2, 4, 10, 64), (0, 640, 64, 1), "broadcast"),
        ((2, 4, 10, 64), (64, 64, 64, 1), "overlap"),
        ((2, 4, 10, 64), (4000, 1000, 64, 1), "strides"),  # two padded slots: no layout text
    ],
)
def test_what_no_graph_reads_is_named(shape, stride, reason):
    with pytest.raises(layout_fits.NoLayout) as raised:
        layout_fits.read(shape, stride)
    assert raised.value.reason == reason


def test_a_ragged_spec_takes_no_tensor_layout():
    with pytest.raises(SpecError, match="layout_q"):
        GraphSpec(batch=2, heads_q=8, seq_q=64, head_dim=64, layout="thd", layout_q="bshd")


def test_the_json_schema_takes_layout_texts():
    schema = GraphSpec.json_schema()["properties"]
    import re

    for text in ("bshd", "bhsd", "thd", "sbhd", "bs[3]hd", "bs[+2]hd"):
        assert re.match(schema["layout"]["pattern"], text), text
    assert re.match(schema["layout_q"]["pattern"], "bsh[3]d")


def test_the_manifest_docs_layouts_example_expands_to_the_layouts_it_names():
    from pathlib import Path

    import yaml

    text = (Path(__file__).parent.parent / "docs" / "manifests.md").read_text()
    block = text.split("### Tensor layouts", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    found = {(s.layout, s.layout_q) for s in manifest.expand(yaml.safe_load(block))}
    assert found == {("bs[3]hd", None), ("bhsd", "bshd"), ("sbhd", None)}
