"""The service under uvicorn on 127.0.0.1, driven over real HTTP."""

from __future__ import annotations

import httpx
import pytest

from graphcache import Artifact
from graphcache.settings import Settings
from graphcache.stores import DiskStore
from service.app import create_app
from tests.fakes import TARGET, FakeCompiler, make_artifact, spec
from tests.servers import ServerThread

WRITE, READ, ADMIN = "w-token", "r-token", "a-token"


@pytest.fixture
def store(tmp_path):
    return DiskStore(tmp_path / "store")


def serve(store, **settings):
    app = create_app(Settings(cache_dir=store.path, **settings), store=store, compiler=settings.pop("compiler", None))
    return ServerThread(app)


@pytest.fixture
def server(store):
    with serve(store, write_tokens=(WRITE,), admin_tokens=(ADMIN,)) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def put(client, art: Artifact, token=WRITE, data=None):
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return client.put(f"/v1/artifacts/{art.key}", content=art.encode() if data is None else data, headers=headers)


def assert_error(response, status, code):
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code and body["detail"]


# -- GET / HEAD ---------------------------------------------------------------------------


def test_upload_then_download(client):
    art = make_artifact(spec(), size=300_000)
    response = put(client, art)
    assert response.status_code == 201 and response.json()["created"] is True
    got = client.get(f"/v1/artifacts/{art.key}")
    assert got.status_code == 200
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.headers["etag"] == f'"{art.payload_sha256}"'
    assert Artifact.decode(got.content, expected_key=art.key) == art


def test_large_artifacts_stream_intact_every_time(client):
    art = make_artifact(spec(), size=3 * 1024 * 1024 + 17)
    put(client, art)
    for _ in range(3):  # first verified in full, then streamed from the open file
        got = client.get(f"/v1/artifacts/{art.key}")
        assert got.status_code == 200
        assert int(got.headers["content-length"]) == len(got.content)
        assert Artifact.decode(got.content, expected_key=art.key).payload == art.payload
    assert client.head(f"/v1/artifacts/{art.key}").status_code == 200


def test_identical_upload_is_200(client):
    art = make_artifact(spec())
    assert put(client, art).status_code == 201
    again = put(client, art)
    assert again.status_code == 200 and again.json()["created"] is False


def test_if_none_match_gives_304(client):
    art = make_artifact(spec(), size=100_000)
    put(client, art)
    etag = client.get(f"/v1/artifacts/{art.key}").headers["etag"]
    cached = client.get(f"/v1/artifacts/{art.key}", headers={"if-none-match": etag})
    assert cached.status_code == 304 and cached.content == b""
    other = client.get(f"/v1/artifacts/{art.key}", headers={"if-none-match": '"abc"'})
    assert other.status_code == 200


def test_head(client):
    art = make_artifact(spec(), size=50_000)
    assert client.head(f"/v1/artifacts/{art.key}").status_code == 404
    put(client, art)
    head = client.head(f"/v1/artifacts/{art.key}")
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == len(art.encode())
    assert head.headers["etag"] == f'"{art.payload_sha256}"'


def test_absent_key_is_404_and_bad_key_is_400(client):
    assert_error(client.get("/v1/artifacts/" + "a" * 64), 404, "not_found")
    for bad in ("abc", "A" * 64, "g" * 64, "a" * 65, "..%2F..%2Fetc%2Fpasswd", "a" * 5000):
        assert_error(client.get(f"/v1/artifacts/{bad}"), 400, "invalid_key")


# -- upload verification --------------------------------------------------------------------


def test_upload_verification_refuses_every_bad_case(client, store):
    art = make_artifact(spec(), size=20_000)
    data = art.encode()
    other = make_artifact(spec(batch=2))
    flipped = bytearray(data)
    flipped[-5] ^= 1
    cases = {
        "bad_magic": b"NOPE!" + data[5:],
        "digest_mismatch": bytes(flipped),
        "truncated": data[:-100],
    }
    for code, bad in cases.items():
        assert_error(put(client, art, data=bad), 400, code)
    # a genuine artifact uploaded under another key
    assert_error(
        client.put(f"/v1/artifacts/{other.key}", content=data, headers={"authorization": f"Bearer {WRITE}"}),
        400,
        "key_mismatch",
    )
    # a header whose key is its own path key but does not recompute from its spec
    from graphcache.artifact import frame

    header = art.header()
    header["spec"]["batch"] = 3
    assert_error(put(client, art, data=frame(header, art.payload)), 400, "key_not_recomputable")
    assert list(store.keys()) == []  # nothing partial or wrong was stored
    metrics = client.get("/metrics").text
    assert 'graphcache_uploads_rejected_total{reason="digest_mismatch"} 1.0' in metrics


def test_upload_above_the_limit_is_413(store):
    with serve(store, max_upload=10_000) as srv, httpx.Client(base_url=srv.url) as c:
        art = make_artifact(spec(), size=20_000)
        assert_error(put(c, art, token=None), 413, "too_large")
        assert list(store.keys()) == []


# -- tokens -----------------------------------------------------------------------------------


def test_tokens(client):
    art = make_artifact(spec())
    assert_error(put(client, art, token=None), 401, "unauthorized")
    assert_error(put(client, art, token="wrong"), 403, "forbidden")
    assert put(client, art, token=ADMIN).status_code == 201  # admin tokens can write
    url = f"/v1/artifacts/{art.key}"
    assert_error(client.delete(url), 401, "unauthorized")
    assert_error(client.delete(url, headers={"authorization": f"Bearer {WRITE}"}), 403, "forbidden")
    assert client.delete(url, headers={"authorization": f"Bearer {ADMIN}"}).status_code == 204
    assert_error(client.delete(url, headers={"authorization": f"Bearer {ADMIN}"}), 404, "not_found")


def test_read_tokens_close_reads(store):
    with serve(store, read_tokens=(READ,), write_tokens=(WRITE,)) as srv, httpx.Client(base_url=srv.url) as c:
        art = make_artifact(spec())
        put(c, art)
        url = f"/v1/artifacts/{art.key}"
        assert_error(c.get(url), 401, "unauthorized")
        assert_error(c.get(url, headers={"authorization": "Bearer nope"}), 403, "forbidden")
        assert c.get(url, headers={"authorization": f"Bearer {READ}"}).status_code == 200
        assert c.get(url, headers={"authorization": f"Bearer {WRITE}"}).status_code == 200
        assert_error(c.get("/v1/artifacts"), 401, "unauthorized")


# -- resolve, list, build ----------------------------------------------------------------------


def test_resolve(client):
    art = make_artifact(spec())
    body = {"spec": spec().to_dict(), "target": str(TARGET)}
    first = client.post("/v1/resolve", json=body).json()
    assert first == {"key": art.key, "present": False, "target": str(TARGET), "spec": spec().to_dict()}
    put(client, art)
    assert client.post("/v1/resolve", json=body).json()["present"] is True


@pytest.mark.parametrize(
    "body, words",
    [
        ({"spec": {"batch": 1, "heads_q": 8, "seq_q": 128, "head_dim": 60}, "target": str(TARGET)}, "spec.head_dim"),
        (
            {"spec": {"batch": 1, "heads_q": 8, "seq_q": 128, "head_dim": 64, "mask": "diag"}, "target": str(TARGET)},
            "spec.mask",
        ),
        ({"spec": {"batch": 1, "heads_q": 8, "seq_q": 128, "head_dim": 64}, "target": "h200"}, "target"),
        ({"spec": {"batch": 1, "heads_q": 8, "seq_q": 128, "head_dim": 64}}, "target"),
        ({"target": str(TARGET)}, "spec"),
    ],
)
def test_resolve_422_names_the_field(client, body, words):
    response = client.post("/v1/resolve", json=body)
    assert response.status_code == 422
    assert words in response.json()["detail"]


def test_list_pages_and_filters_by_target(client):
    from tests.fakes import OTHER_TARGET

    arts = [make_artifact(spec(batch=b)) for b in range(1, 6)] + [make_artifact(spec(), OTHER_TARGET)]
    for art in arts:
        put(client, art)
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/artifacts", params=params).json()
        seen += [item["key"] for item in page["items"]]
        assert len(page["items"]) <= 2
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert sorted(seen) == sorted(a.key for a in arts)
    only = client.get("/v1/artifacts", params={"target": str(OTHER_TARGET)}).json()["items"]
    assert [i["key"] for i in only] == [arts[-1].key]
    assert only[0]["header"]["target_text"] == str(OTHER_TARGET)
    assert client.get("/v1/artifacts", params={"limit": 0}).status_code == 422


def test_build_without_gpu_is_503_with_the_reason(store):
    with serve(store, build=False) as srv, httpx.Client(base_url=srv.url) as c:
        response = c.post("/v1/build", json={"spec": spec().to_dict()})
        assert_error(response, 503, "no_gpu")
        assert "cannot build" in response.json()["detail"] or "disabled" in response.json()["detail"]


def test_build_with_a_compiler_stores_the_artifact(store):
    compiler = FakeCompiler()
    app = create_app(Settings(cache_dir=store.path, write_tokens=(WRITE,)), store=store, compiler=compiler)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url) as c:
        auth = {"authorization": f"Bearer {WRITE}"}
        assert c.post("/v1/build", json={"spec": spec().to_dict()}).status_code == 401
        first = c.post("/v1/build", json={"spec": spec().to_dict()}, headers=auth).json()
        assert first["built"] is True and store.exists(first["key"])
        second = c.post("/v1/build", json={"spec": spec().to_dict()}, headers=auth).json()
        assert second == {**first, "built": False} and compiler.builds == 1
        assert "graphcache_build_seconds_count 1.0" in c.get("/metrics").text


# -- health, metrics, stats, docs -----------------------------------------------------------------


def test_health_metrics_stats_and_docs(client):
    art = make_artifact(spec(), size=10_000)
    put(client, art)
    client.get(f"/v1/artifacts/{art.key}")
    client.get("/v1/artifacts/" + "b" * 64)
    assert client.get("/healthz").json()["status"] == "ok"
    metrics = client.get("/metrics").text
    assert "graphcache_hits_total 1.0" in metrics
    assert "graphcache_misses_total 1.0" in metrics
    assert f"graphcache_bytes_served_total {float(len(art.encode()))}" in metrics
    assert 'graphcache_requests_total{method="GET",route="/v1/artifacts/{key}",status="200"} 1.0' in metrics
    assert 'graphcache_uploads_total{result="created"} 1.0' in metrics
    stats = client.get("/v1/stats").json()
    assert (stats["hits"], stats["misses"], stats["uploads"]) == (1, 1, 1)
    assert (stats["counters"], stats["workers"]) == ("process", 1)  # one process: the server's figures
    assert client.get("/docs").status_code == 200
    schema = client.get("/openapi.json").json()
    assert "/v1/artifacts/{key}" in schema["paths"] and "/v1/resolve" in schema["paths"]


def test_unknown_route_is_json_404(client):
    assert_error(client.get("/nope"), 404, "not_found")


def test_corrupt_entry_on_disk_is_never_served(client, store):
    art = make_artifact(spec(), size=200_000)
    put(client, art)
    assert client.get(f"/v1/artifacts/{art.key}").status_code == 200  # verified and remembered
    data = bytearray(store.get(art.key))
    data[-1000] ^= 0xFF
    # rewrite the file in place, as bit rot or a bad disk would
    path = next(p for p in (store.path).rglob("*.val"))
    path.write_bytes(bytes(data))
    response = client.get(f"/v1/artifacts/{art.key}")
    assert_error(response, 404, "not_found")
    assert not store.exists(art.key)
    assert 'graphcache_quarantined_total{reason="digest_mismatch"} 1.0' in client.get("/metrics").text
    quarantined = list((store.path / "quarantine").iterdir())
    assert len(quarantined) == 1 and quarantined[0].read_bytes() == bytes(data), "the corrupt bytes, kept aside"
    # a good copy can be stored again and is served again
    assert put(client, art).status_code == 201
    assert client.get(f"/v1/artifacts/{art.key}").content == art.encode()


def test_the_served_size_histogram_reads_as_a_prometheus_histogram():
    """service.metrics.SizeHistogram takes a batch's sizes in one call; it is
    exposed exactly as prometheus_client's own Histogram with those buckets."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from service.metrics import Metrics

    ours = Metrics()
    registry = CollectorRegistry()
    theirs = Histogram(
        "graphcache_served_artifact_bytes",
        "sizes of the artifacts served (GET and batch)",
        buckets=ours.served_sizes.bounds,
        registry=registry,
    )
    sizes = [0, 10, 4096, 4097, 65_600, 65_536, 3 << 20, 1 << 30]
    ours.served_sizes.observe(sizes[0])
    ours.served_sizes.observe_many(sizes[1:])
    for size in sizes:
        theirs.observe(size)
    mine = [line for line in ours.render().decode().splitlines() if "served_artifact_bytes" in line]
    reference = [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]
    assert mine == reference
