"""The status page (GET /): what a store the test filled holds, the counters
since start and a manifest's coverage, in plain HTML, rendered by a real
headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from graphcache import GraphCache
from graphcache.settings import Settings
from graphcache.stores import DiskStore
from service.app import create_app
from tests.fakes import OTHER_TARGET, TARGET, FakeCompiler, spec
from tests.servers import ServerThread, chromium

MANIFEST = """defaults: {batch: 1, heads_q: 8, head_dim: 64}
graphs:
  - {name: prefill, mask: causal, seq_q: [128, 256]}
  - {name: windowed, mask: sliding_window, window_left: 64, window_right: 0, seq_q: 512}
"""


@pytest.fixture
def filled(tmp_path):
    """A store with 3 entries for TARGET (one pinned, one negative) and 1 for OTHER_TARGET."""
    store = DiskStore(tmp_path / "store")
    cache = GraphCache(store, FakeCompiler(TARGET, size=10_000, unsupported={"sliding_window"}), shape_classes="exact")
    keys = [cache.get(spec(seq_q=128)).key, cache.get(spec(seq_q=256)).key]
    try:
        cache.get(spec(seq_q=512, mask="sliding_window", window_left=64, window_right=0))
    except Exception:  # noqa: BLE001 - the negative entry is stored; the caller is told it is unsupported
        pass
    store.pin(keys[0])
    GraphCache(store, FakeCompiler(OTHER_TARGET, size=2048), shape_classes="exact").get(spec(seq_q=128))
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "llama.yaml").write_text(MANIFEST)
    (tmp_path / "secret.yaml").write_text(MANIFEST)
    settings = Settings(cache_dir=tmp_path / "store", manifests=tmp_path / "manifests", shape_classes="exact")
    return store, settings, keys


def cells(page: str, table: str) -> list[list[str]]:
    body = page.split(f"id={table}>", 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
    return [
        [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r, re.S)] for r in rows
    ]


def test_the_page_shows_the_store_its_targets_counters_and_a_named_manifests_coverage(filled):
    store, settings, keys = filled
    with ServerThread(create_app(settings, store=store)) as srv:
        assert httpx.get(f"{srv.url}/v1/artifacts/{keys[0]}").status_code == 200  # a hit
        assert httpx.get(f"{srv.url}/v1/artifacts/{'0' * 64}").status_code == 404  # a miss
        page = httpx.get(srv.url + "/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        text = page.text
        assert "<script" not in text and not re.search(r"(src|href)=['\"]?(https?:)?//", text)  # nothing external
        assert "DiskStore" in text and 'id=store-writable><span class="ok">yes' in text
        targets = {row[0]: row[1:] for row in cells(text, "targets")[1:]}
        # entries, bytes, pinned, negative
        assert targets[str(TARGET)][0] == "3" and targets[str(TARGET)][2:] == ["1", "1"]
        assert targets[str(OTHER_TARGET)][0] == "1" and targets[str(OTHER_TARGET)][2:] == ["0", "0"]
        counters = dict(cells(text, "counters"))
        assert counters["hits"] == "1" and counters["misses"] == "1" and counters["GPU seconds saved"] == "0.5"
        named = httpx.get(srv.url + "/", params={"manifest": "llama.yaml"}).text
        coverage = {row[0]: row[1:] for row in cells(named, "coverage")[1:]}
        assert coverage[str(TARGET)] == ["3", "3", "100%"]  # as warm --check counts: the negative entry is stored
        assert coverage[str(OTHER_TARGET)] == ["1", "3", "33%"]
        posted = httpx.post(srv.url + "/", data={"manifest": MANIFEST}).text
        assert cells(posted, "coverage") == cells(named, "coverage")
        for name, status in (("../secret.yaml", 400), ("/etc/passwd", 400), ("absent.yaml", 404), ("..", 400)):
            answer = httpx.get(srv.url + "/", params={"manifest": name})
            assert answer.status_code == status, (name, answer.text)
            assert "secret" not in answer.text or status == 400


def test_the_page_is_behind_read_tokens_when_they_are_set(filled):
    store, settings, _ = filled
    locked = Settings(cache_dir=settings.cache_dir, read_tokens=("r",), write_tokens=("w",))
    with ServerThread(create_app(locked, store=store)) as srv:
        assert httpx.get(srv.url + "/").status_code == 401
        assert httpx.post(srv.url + "/", content=MANIFEST).status_code == 401
        assert httpx.get(srv.url + "/", headers={"authorization": "Bearer r"}).status_code == 200


def test_the_page_renders_in_headless_chromium_with_the_stores_figures(filled, tmp_path):
    browser = chromium()
    shot = tmp_path / "status-page.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"]
    flags.append(f"--user-data-dir={tmp_path / 'profile'}")
    store, settings, keys = filled
    with ServerThread(create_app(settings, store=store)) as srv:
        for key in (keys[0], keys[1], keys[0], "0" * 64):  # 3 hits, 1 miss
            httpx.get(f"{srv.url}/v1/artifacts/{key}")
        url = f"{srv.url}/?manifest=llama.yaml"
        dom = subprocess.run([browser, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
        subprocess.run(
            [browser, *flags, "--window-size=1000,1250", f"--screenshot={shot}", url],
            capture_output=True,
            timeout=120,
        )
    assert dom.returncode == 0, dom.stderr[-2000:]
    rendered = dom.stdout
    targets = {row[0]: row[1:] for row in cells(rendered, '"targets"')[1:]}
    assert targets[str(TARGET)][0] == "3" and targets[str(OTHER_TARGET)][0] == "1"
    counters = dict(cells(rendered, '"counters"'))
    assert counters["hits"] == "3" and counters["misses"] == "1" and counters["GPU seconds saved"] == "1.5"
    assert "33%" in rendered
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    keep = os.environ.get("GRAPHCACHE_STATUS_SCREENSHOT")  # docs/status-page.png was made with this
    if keep:
        shutil.copy(shot, Path(keep))
