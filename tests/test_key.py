from __future__ import annotations

import json
import subprocess
import sys

import pytest

from graphcache import GraphSpec, Target, UidMap, key_for
from graphcache.key import is_key

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")
LLAMA = GraphSpec(batch=1, heads_q=32, heads_kv=8, seq_q=4096, head_dim=128, dtype="bfloat16", mask="causal")
BERT = GraphSpec(batch=8, heads_q=12, seq_q=512, head_dim=64)

# Golden keys: if one of these changes, the key encoding changed. That must be
# deliberate and must bump FORMAT_VERSION, or every deployed cache misses.
GOLDEN = {
    # Format 2 (2026-11-30): the key covers the graph recipe version and the
    # GPU's multiprocessor count (issue 10). Format 1 keys: a903749f..., 6fb7a7de...
    "llama": "b32f7ea9a79e0da872684f3c2159eab908033c4aa8a61ba68dccdb656d123938",
    "bert": "3d9405f5e77ff40336bd16de04d7f483aaf38aa93d4fc90cb77147313ebbe60d",
}


def test_key_is_64_lowercase_hex():
    key = key_for(LLAMA, TARGET)
    assert is_key(key) and len(key) == 64
    assert not is_key(key.upper()) and not is_key(key + "\n") and not is_key(key[:-1])


def test_golden_keys():
    assert key_for(LLAMA, TARGET) == GOLDEN["llama"]
    assert key_for(BERT, TARGET) == GOLDEN["bert"]


def test_key_is_sha256_of_the_documented_encoding():
    import hashlib

    from graphcache.compilers.cudnn import RECIPE_VERSION

    document = {
        "format": 2,
        "recipe": RECIPE_VERSION,
        "spec": BERT.to_dict(),
        "target": TARGET.to_dict(),
        "uids": UidMap.default().to_dict(),
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    assert key_for(BERT, TARGET) == hashlib.sha256(text.encode()).hexdigest()


def test_key_is_the_same_in_a_fresh_process():
    code = (
        "import json,sys; from graphcache import *; "
        "s=GraphSpec.from_dict(json.loads(sys.argv[1])); print(key_for(s, Target.parse(sys.argv[2])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, LLAMA.canonical_json(), str(TARGET)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == key_for(LLAMA, TARGET)


SPEC_CHANGES = [
    ("batch", 2),
    ("heads_q", 64),
    ("heads_kv", 4),
    ("seq_q", 2048),
    ("seq_kv", 8192),
    ("head_dim", 64),
    ("head_dim_v", 64),
    ("dtype", "float16"),
    ("layout", "bhsd"),
    ("mask", "causal_bottom_right"),
    ("attn_scale", 0.1),
    ("generate_stats", True),
    ("padding", True),
    ("dropout", 0.1),
]


@pytest.mark.parametrize("field, value", SPEC_CHANGES)
def test_every_spec_field_changes_the_key(field, value):
    assert key_for(LLAMA.replace(**{field: value}), TARGET) != key_for(LLAMA, TARGET)


def test_window_bounds_change_the_key():
    a = LLAMA.replace(mask="sliding_window", window_left=128)
    assert key_for(a, TARGET) != key_for(a.replace(window_left=256), TARGET)
    assert key_for(a, TARGET) != key_for(a.replace(window_right=4), TARGET)


@pytest.mark.parametrize(
    "field, value",
    [
        ("gpu", "h100_sxm"),
        ("compute_capability", "8.9"),
        ("cudnn", "9.27.0"),
        ("frontend", "1.31.0"),
        ("sm_count", 132),
    ],
)
def test_every_target_field_changes_the_key(field, value):
    other = Target(**{**TARGET.to_dict(), field: value})
    assert key_for(LLAMA, other) != key_for(LLAMA, TARGET)


def test_uid_map_changes_the_key():
    uids = UidMap({**UidMap.default().to_dict(), "o": 40})
    assert key_for(LLAMA, TARGET, uids) != key_for(LLAMA, TARGET)
    assert key_for(LLAMA, TARGET, UidMap.default()) == key_for(LLAMA, TARGET)


def test_uid_map_refuses_duplicates_and_missing_roles():
    with pytest.raises(ValueError, match="duplicate"):
        UidMap({"q": 1, "k": 1, "v": 3, "o": 4})
    with pytest.raises(ValueError, match="lacks roles"):
        UidMap({"q": 1, "k": 2, "v": 3})
    assert json.dumps(UidMap.default().to_dict())


def test_a_gpu_of_the_same_name_with_fewer_multiprocessors_has_other_keys():
    # A MIG slice or a smaller SKU reports the same name and compute capability.
    full = Target.parse("h100_sxm-sm90-mp132-cudnn9.28.0-fe1.32.0")
    slice_ = Target.parse("h100_sxm-sm90-mp16-cudnn9.28.0-fe1.32.0")
    assert full.sm_count == 132 and str(full) == "h100_sxm-sm90-mp132-cudnn9.28.0-fe1.32.0"
    assert key_for(LLAMA, full) != key_for(LLAMA, slice_)


def test_a_new_graph_recipe_changes_every_key(monkeypatch):
    import graphcache.key

    before = key_for(LLAMA, TARGET)
    monkeypatch.setattr(graphcache.key, "RECIPE_VERSION", graphcache.key.RECIPE_VERSION + 1)
    assert key_for(LLAMA, TARGET) != before
