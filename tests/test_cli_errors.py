"""What a user sees when something is wrong: one line of text, exit non-zero,
no traceback, and no silent wrong turn (nothing created, nothing guessed)."""

from __future__ import annotations

import json
import re
import shlex
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from graphcache import GraphCache
from graphcache.settings import Settings
from graphcache.stores import DiskStore
from service.app import create_app
from tests.clirun import cli
from tests.docs_examples import example
from tests.fakes import TARGET, FakeCompiler, make_artifact, spec
from tests.servers import ServerThread

NO_TORCH = ("torch", "cudnn")


def one_error_line(out) -> str:  # noqa: ANN001
    """The single stderr line of a failed command."""
    assert out.returncode != 0, out.stdout
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: "), out.stderr
    return lines[0]


@pytest.fixture
def populated(tmp_path):
    store = DiskStore(tmp_path / "c")
    cache = GraphCache(store, FakeCompiler())
    arts = [cache.get(spec(batch=b)) for b in (1, 2)]
    store.close()
    return tmp_path / "c", arts


@pytest.fixture
def server(tmp_path):
    store = DiskStore(tmp_path / "server")
    for s in (spec(), spec(batch=2), spec(batch=1, heads_q=32, seq_q=4096, head_dim=128, dtype="bfloat16")):
        art = make_artifact(s, size=256 * 1024)
        store.put(art.key, art.encode())
    settings = Settings(cache_dir=store.path, write_tokens=("w",), admin_tokens=("a",))
    with ServerThread(create_app(settings, store=store)) as srv:
        yield srv


def stats(srv) -> dict:  # noqa: ANN001
    return httpx.get(f"{srv.url}/v1/stats").json()


# -- printed as text, on one line ------------------------------------------------------


@pytest.mark.parametrize("name", ["[bold]x", "a[/x]b"])
def test_a_path_with_brackets_is_printed_as_it_is(tmp_path, name):
    folder = tmp_path / name  # "a[/x]b" is the folder "a[" holding "x]b": the path text holds "[/x]"
    folder.mkdir(parents=True)
    f = folder / "spec.json"
    f.write_text(json.dumps({"batch": 1, "heads_q": 8, "seq_q": 128, "head_dim": 60}))
    line = one_error_line(cli("key", str(f), "--target", str(TARGET)))
    assert str(f) in line and "head_dim=60" in line


def test_the_install_hint_keeps_its_extra(tmp_path):
    manifest = Path(__file__).parent.parent / "docs" / "examples" / "llama3-8b.yaml"
    line = one_error_line(cli("--cache-dir", str(tmp_path / "c"), "warm", str(manifest), hide=NO_TORCH))
    assert "pip install 'graphcache[gpu]'" in line


@pytest.mark.parametrize(
    "text, where",
    [("defaults:\n  dtype: [\n", ":3:1:"), ("graphs:\n  - name: x\n   heads_q: 8\n", ":3:4:")],
)
def test_malformed_yaml_is_one_line_naming_file_line_and_column(tmp_path, text, where):
    f = tmp_path / "m.yaml"
    f.write_text(text)
    line = one_error_line(cli("warm", str(f), "--check", "--target", str(TARGET), "--cache-dir", str(tmp_path)))
    assert f"{f}{where} not valid YAML" in line
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text("batch: 1\n  heads_q: [8\n")
    line = one_error_line(cli("key", str(spec_file), "--target", str(TARGET)))
    assert re.search(rf"{re.escape(str(spec_file))}:2:\d+: not valid YAML", line)


def test_a_server_that_is_down_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens here
    line = one_error_line(cli("ls", "--store", f"http://127.0.0.1:{port}"))
    assert f"127.0.0.1:{port}" in line and "did not answer" in line


def test_403_says_what_the_server_said(server):
    key = make_artifact(spec()).key
    line = one_error_line(cli("rm", key, "--store", server.url, env={"GRAPHCACHE_TOKEN": "w"}))
    assert "403" in line and "the token given is not an admin token" in line
    assert httpx.head(f"{server.url}/v1/artifacts/{key}").status_code == 200


# -- no silent wrong turns ---------------------------------------------------------------


@pytest.mark.parametrize("how", ["option", "env"])
def test_an_unknown_store_scheme_is_an_error_naming_the_schemes(tmp_path, how):
    args, env = (["--store", "ftp://x"], {}) if how == "option" else ([], {"GRAPHCACHE_STORE": "ftp://x"})
    line = one_error_line(cli(*args, "ls", cwd=tmp_path, env=env))
    assert "ftp://" in line and "redis://" in line and "http://" in line
    assert list(tmp_path.iterdir()) == [], "nothing may be created for it"


READ_ONLY = [
    ["ls"],
    ["get", "abcdef12", "-o", "OUT"],
    ["inspect", "abcdef12"],
    ["rm", "abcdef12"],
    ["pin", "abcdef12"],
    ["pin", "abcdef12", "--off"],
    ["explain", "SPEC", "--target", str(TARGET)],
    ["purge", "--target", str(TARGET)],
]


@pytest.mark.parametrize("verb", READ_ONLY, ids=lambda v: " ".join(v[:3]))
def test_read_only_verbs_on_a_missing_cache_dir_say_so(tmp_path, verb):
    missing = tmp_path / "no-such-cache"
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec().to_dict()))
    args = [str(tmp_path / "out") if a == "OUT" else str(spec_file) if a == "SPEC" else a for a in verb]
    line = one_error_line(cli("--cache-dir", str(missing), *args))
    assert f"no cache folder at {missing}" in line
    assert not missing.exists()
    line = one_error_line(cli(*args, env={"GRAPHCACHE_DIR": str(missing)}))
    assert not missing.exists()


def test_key_needs_no_cache_dir_and_creates_none(tmp_path):
    missing = tmp_path / "no-such-cache"
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec().to_dict()))
    out = cli("--cache-dir", str(missing), "key", str(spec_file), "--target", str(TARGET))
    assert out.returncode == 0 and len(out.stdout.strip()) == 64
    assert not missing.exists()


def test_ls_with_a_malformed_target_shows_the_target_form(populated):
    folder, _ = populated
    line = one_error_line(cli("--cache-dir", str(folder), "ls", "--target", "garbage"))
    assert "'garbage'" in line and "GPU-smMAJORMINOR" in line and "for example h200-sm90" in line
    out = cli("--cache-dir", str(folder), "ls", "--target", str(TARGET))
    assert out.returncode == 0 and "2 artifact(s)" in out.stdout


def test_serve_refuses_a_port_out_of_range(tmp_path):
    t0 = time.monotonic()
    out = cli("serve", "--port", "99999", "--cache-dir", str(tmp_path / "c"), timeout=60)
    line = one_error_line(out)
    assert out.returncode == 2 and "99999" in line and "65535" in line
    assert "serving" not in out.stdout + out.stderr and time.monotonic() - t0 < 30


def test_inspect_of_a_missing_file_says_no_such_file(tmp_path):
    line = one_error_line(cli("inspect", str(tmp_path / "nope.gcart")))
    assert f"no such file: {tmp_path / 'nope.gcart'}" in line


# -- bench, and the docs' command ------------------------------------------------------


def test_bench_plot_without_matplotlib_fails_before_any_work(server, tmp_path):
    out = cli(
        "bench",
        "--spec",
        "batch=1,heads_q=8,seq_q=128,head_dim=64,mask=causal",
        "--server",
        server.url,
        "--target",
        str(TARGET),
        "--json",
        str(tmp_path / "r.json"),
        "--plot",
        str(tmp_path / "r.png"),
        hide=(*NO_TORCH, "matplotlib"),
    )
    line = one_error_line(out)
    assert "matplotlib" in line and "pip install 'graphcache[plot]'" in line
    assert not (tmp_path / "r.json").exists()
    assert stats(server)["hits"] == 0 and stats(server)["misses"] == 0, "nothing may be fetched first"


def test_the_docs_bench_command_for_a_host_without_gpu_runs_as_written(tmp_path):
    (command,) = example("bench-without-gpu").commands()  # docs/ops.md
    argv = shlex.split(command)[1:]
    assert argv[0] == "bench" and "--target" in argv
    # the service the command names, holding the artifact of its spec and target
    from graphcache import Target
    from graphcache.cli import parse_spec_arg

    store = DiskStore(tmp_path / "server")
    art = make_artifact(parse_spec_arg(argv[argv.index("--spec") + 1]), Target.parse(argv[argv.index("--target") + 1]))
    store.put(art.key, art.encode())
    with ServerThread(create_app(Settings(cache_dir=store.path), store=store)) as srv:
        argv = [srv.url if a == "http://cache:8080" else a for a in argv]
        out = cli(*argv, cwd=tmp_path, hide=NO_TORCH)
        assert stats(srv)["hits"] > 0
    assert out.returncode == 0, out.stderr
    for name in ("--json", "--plot"):
        if name in argv:
            assert (tmp_path / argv[argv.index(name) + 1]).stat().st_size > 0


# -- the service as a store ---------------------------------------------------------------


def test_ls_against_a_server_reads_headers_and_downloads_nothing(server):
    out = cli("ls", "--store", server.url)
    assert out.returncode == 0, out.stderr
    assert "3 artifact(s)" in out.stdout and "b2 h8 s128 d64" in out.stdout
    assert stats(server)["bytes_served"] == 0 and stats(server)["hits"] == 0
    only = cli("ls", "--json", "--target", str(TARGET), "--store", server.url)
    assert len(only.stdout.splitlines()) == 3
    assert stats(server)["bytes_served"] == 0


def test_pin_off_against_a_server(tmp_path):
    store = DiskStore(tmp_path / "s")
    art = make_artifact(spec())
    store.put(art.key, art.encode(), pin=True)
    with ServerThread(create_app(Settings(cache_dir=store.path, write_tokens=("w",)), store=store)) as srv:
        env = {"GRAPHCACHE_TOKEN": "w"}
        out = cli("pin", art.key[:10], "--off", "--store", srv.url, env=env)
        assert out.returncode == 0, out.stderr
        assert f"unpinned {art.key}" in out.stdout and not store.pinned(art.key)
        assert cli("pin", art.key, "--store", srv.url, env=env).returncode == 0 and store.pinned(art.key)
        line = one_error_line(cli("pin", "f" * 64, "--off", "--store", srv.url, env=env))
        assert "not stored" in line
        denied = one_error_line(cli("pin", art.key, "--off", "--store", srv.url))
        assert "401" in denied and store.pinned(art.key)


def test_a_cache_folder_whose_index_is_not_sqlite_is_one_line(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "cache.db").write_bytes(b"not a database, " * 100)
    for verb in (["ls"], ["inspect", "abcdef12"]):
        line = one_error_line(cli("--cache-dir", str(folder), *verb))
        assert f"{folder / 'cache.db'} is not a diskcache index" in line
    assert (folder / "cache.db").read_bytes() == b"not a database, " * 100, "nothing changed"


# -- what a newcomer trips on names the fix, and the fix works (issue 39) -----------------------

TINY = str(Path(__file__).parent.parent / "docs" / "examples" / "tiny.yaml")
SPEC_FILE = str(Path(__file__).parent.parent / "docs" / "examples" / "spec.yaml")


def test_warm_without_a_gpu_names_the_reference_compiler_and_that_runs(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    line = one_error_line(cli("--cache-dir", str(tmp_path / "c"), "warm", TINY))
    assert "no CUDA GPU found" in line and "--compiler reference" in line
    fixed = cli("--cache-dir", str(tmp_path / "c"), "warm", TINY, "--compiler", "reference")
    assert fixed.returncode == 0 and "2 built" in fixed.stdout, fixed.stderr


def test_warm_against_a_server_that_is_down_says_why_before_building_anything(tmp_path):
    pytest.importorskip("torch")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens here
    started = time.monotonic()
    out = cli("warm", TINY, "--compiler", "reference", "--server", f"http://127.0.0.1:{port}")
    *asked_again, last = out.stderr.strip().splitlines()
    # Asked again three times, each saying why, then one error line naming the fix.
    assert [line.rsplit("; ", 1)[1] for line in asked_again] == [f"asking again in {n} s" for n in (1, 2, 4)]
    assert all("Connection refused" in line for line in asked_again), asked_again
    line = one_error_line(type(out)(out.args, out.returncode, out.stdout, last))
    assert f"http://127.0.0.1:{port} did not answer" in line and "Connection refused" in line
    assert "start the service there (graphcache serve)" in line and "nothing was built" in line
    assert "failed recently" not in out.stderr and out.stdout == ""
    assert time.monotonic() - started < 60


def test_warm_started_before_its_server_answers_asks_again_and_warms_once_it_does(tmp_path):
    pytest.importorskip("torch")
    settings = Settings(cache_dir=tmp_path / "server", write_tokens=("w",))
    srv = ServerThread(create_app(settings, store=DiskStore(tmp_path / "server")))  # its port bound, not listening
    starting = threading.Timer(1.5, srv.start)  # the service comes up while warm waits
    starting.start()
    try:
        out = cli("warm", TINY, "--compiler", "reference", "--server", srv.url, env={"GRAPHCACHE_TOKEN": "w"})
    finally:
        starting.join()
        srv.stop()
    assert out.returncode == 0 and "2 built" in out.stdout, out.stderr
    assert "Connection refused" in out.stderr and "asking again in 1 s" in out.stderr


def test_warm_without_a_write_token_names_graphcache_token_before_building_and_the_token_fixes_it(server):
    pytest.importorskip("torch")
    before = stats(server)
    line = one_error_line(cli("warm", TINY, "--compiler", "reference", "--server", server.url))
    assert "401" in line and "GRAPHCACHE_TOKEN, is not set" in line and "GRAPHCACHE_WRITE_TOKENS" in line
    assert "nothing was built" in line
    wrong = one_error_line(
        cli("warm", TINY, "--compiler", "reference", "--server", server.url, env={"GRAPHCACHE_TOKEN": "r"})
    )
    assert "403" in wrong and "GRAPHCACHE_TOKEN, is not one the server takes" in wrong
    after = stats(server)
    assert (after["uploads"], after["uploads_rejected"]) == (before["uploads"], before["uploads_rejected"])
    fixed = cli("warm", TINY, "--compiler", "reference", "--server", server.url, env={"GRAPHCACHE_TOKEN": "w"})
    assert fixed.returncode == 0 and "2 built" in fixed.stdout, fixed.stderr


@pytest.mark.parametrize("verb", [("warm", "--compiler", "reference"), ("prefetch", "--compiler", "reference")])
def test_a_spec_file_given_for_a_manifest_is_named_as_one_with_the_fix(tmp_path, verb):
    line = one_error_line(cli("--cache-dir", str(tmp_path / "c"), verb[0], SPEC_FILE, *verb[1:]))
    assert "this is a spec file (one GraphSpec" in line and "takes a manifest" in line
    assert "graphs: [{name: mine, batch: 1, ...}]" in line
    # The fix as the line words it: the same fields as one family under graphs:.
    import yaml

    from graphcache import manifest

    family = {"name": "mine", **yaml.safe_load(Path(SPEC_FILE).read_text())}
    wrapped = tmp_path / "manifest.yaml"
    wrapped.write_text(yaml.safe_dump({"graphs": [family]}))
    assert len(manifest.load(wrapped)) == 1
