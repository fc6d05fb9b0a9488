"""`key` and `explain` take a flat spec file or a manifest (every spec, or
one family with --name), as docs/examples/README.md shows."""

from __future__ import annotations

import shlex
from pathlib import Path

from graphcache import GraphCache, manifest
from graphcache.key import key_for
from graphcache.stores import DiskStore
from graphcache.target import Target
from tests.clirun import cli
from tests.docs_examples import example
from tests.fakes import TARGET, FakeCompiler

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"
LLAMA = str(EXAMPLES / "llama3-8b.yaml")
H200 = "h200-sm90-mp132-cudnn9.28.0-fe1.32.0"


def test_key_of_a_flat_spec_file_is_one_line():
    out = cli("key", str(EXAMPLES / "spec.yaml"), "--target", H200)
    assert out.returncode == 0, out.stderr
    from graphcache.cli.common import load_spec_file

    assert out.stdout.strip() == key_for(load_spec_file(str(EXAMPLES / "spec.yaml")), Target.parse(H200))


def test_key_of_a_manifest_prints_every_spec_or_one_family():
    specs = manifest.load(LLAMA)
    out = cli("key", LLAMA, "--target", H200)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [key_for(s, Target.parse(H200)) for s in specs]
    assert lines[0].endswith(specs[0].summary())
    family = cli("key", LLAMA, "--name", "chunked-prefill", "--target", H200)
    assert family.returncode == 0 and len(family.stdout.splitlines()) == 3  # seq_kv 1024, 2048, 4096
    unknown = cli("key", LLAMA, "--name", "prefil", "--target", H200)
    assert unknown.returncode == 1
    assert "no family named 'prefil'; --name takes one of: prefill, prefill-long, chunked-prefill" in unknown.stderr
    flat = cli("key", str(EXAMPLES / "spec.yaml"), "--name", "prefill", "--target", H200)
    assert flat.returncode == 1 and "--name picks a family of a manifest" in flat.stderr


def test_explain_a_manifest_explains_each_spec_and_fails_on_any_missing(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "defaults: {batch: 1, heads_q: 8, head_dim: 64, mask: causal}\n"
        "graphs:\n  - {name: short, seq_q: [128, 256]}\n  - {name: long, seq_q: 4096}\n"
    )
    store = DiskStore(tmp_path / "store")
    cache = GraphCache(store, FakeCompiler(), shape_classes="exact")
    for spec in manifest.load(path)[:2]:
        cache.get(spec)
    base = ("--target", str(TARGET), "--store", str(tmp_path / "store"))
    env = {"GRAPHCACHE_SHAPE_CLASSES": "exact"}
    every = cli("explain", str(path), *base, env=env)
    assert every.returncode == 1, every.stderr
    assert every.stdout.count("present: ") == 2 and every.stdout.count("missing: ") == 1
    assert "2/3 present on" in every.stdout
    family = cli("explain", str(path), "--name", "short", *base, env=env)
    assert family.returncode == 0 and "2/2 present" in family.stdout


def test_the_examples_readme_commands_run():
    commands = example("examples-key").commands()  # docs/examples/README.md
    assert len(commands) == 2 and all(c.startswith("graphcache key ") for c in commands)
    for command in commands:
        args = shlex.split(command)[1:]
        out = cli(*args, cwd=ROOT)
        assert out.returncode == 0, f"{command}: {out.stderr}"
        assert len(out.stdout.split()[0]) == 64
