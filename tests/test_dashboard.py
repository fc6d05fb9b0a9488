"""docker/'s Grafana dashboard and Prometheus scrape config: every query
names a metric a live server's /metrics exports, and compose's monitoring
profile wires them to the replicas."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import yaml

from graphcache.settings import Settings
from graphcache.stores import DiskStore
from service.app import create_app
from tests.servers import ServerThread

DOCKER = Path(__file__).resolve().parent.parent / "docker"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "graphcache.json"


def queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


def exported(metrics_text: str) -> set[str]:
    """The series names a /metrics page exports, samples or not yet (a labelled
    counter shows only its TYPE line until a first sample)."""
    names = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )", metrics_text, re.M))
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", metrics_text, re.M):
        names.add(name)
        if kind == "histogram":
            names.update({f"{name}_bucket", f"{name}_count", f"{name}_sum"})
    return names


def test_every_dashboard_query_names_a_metric_the_server_exports(tmp_path):
    app = create_app(Settings(cache_dir=tmp_path), store=DiskStore(tmp_path))
    with ServerThread(app) as srv:
        httpx.get(f"{srv.url}/v1/artifacts/{'0' * 64}")  # a request and a miss on the page
        live = exported(httpx.get(f"{srv.url}/metrics").text)
    asked = queries()
    assert len(asked) >= 10
    named = {m for q in asked for m in re.findall(r"\bgraphcache_[a-z0-9_]+", q)}
    assert {"graphcache_hits_total", "graphcache_served_build_seconds_total", "graphcache_store_writable"} <= named
    assert named - live == set(), f"queried but not exported by /metrics: {sorted(named - live)}"
    for query in asked:
        assert query.count("(") == query.count(")"), query


def test_prometheus_scrapes_the_replicas_and_compose_runs_both_under_a_profile():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    scrape = yaml.safe_load((DOCKER / "prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["metrics_path"] == "/metrics"
    replicas = {name for name, s in services.items() if s.get("environment", {}).get("GRAPHCACHE_STORE")}
    assert set(scrape["static_configs"][0]["targets"]) == {f"{name}:8080" for name in replicas}
    assert '--port", "8080"' in (DOCKER / "Dockerfile").read_text()
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]
        for volume in services[name]["volumes"]:
            assert (DOCKER / volume.split(":")[0]).exists(), volume
    datasource = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    uids = {t["datasource"]["uid"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]}
    assert uids == {datasource["datasources"][0]["uid"]}
