"""The status page: ``GET /``, one HTML page for ops (no JavaScript, no
external assets) with the store, its entries by target, the counters since
this server process started, and a manifest's coverage.

A manifest is named (``GET /?manifest=NAME``: a file in the folder
GRAPHCACHE_MANIFESTS names, and only a plain file name listed there, so no
path leaves that folder) or posted (``POST /``: the manifest's YAML or JSON
as the body, or a form's ``manifest`` field, within the server's small-body
limit). Its coverage is given for every target the store holds entries of.
Behind read tokens when they are set, as every read route is.

Nothing here reads the whole store in the pool that health, uploads and
artifact reads use: the store's figures come from a snapshot read at most
every few seconds, and a manifest's coverage (bounded: GRAPHCACHE_MAX_SPECS,
its aliases) runs in a helper process of its own under `graphcache serve`,
else in a paced scan thread (service.checker), stopped at its deadline or
when its client goes away, within a budget of CPU time per check and per
client (service.quota: 413 ``manifest_budget``, 429 ``client_budget``).
"""

from __future__ import annotations

import html
import os
import re
import time
from typing import Any
from urllib.parse import parse_qs

import anyio
from fastapi import FastAPI, Request, Response

from graphcache.errors import GraphCacheError, ManifestTooLarge
from graphcache.stores.space import human
from service.checker import coverage
from service.errors import ServiceError
from service.models import error_responses
from service.routes.health import counters, scope
from service.scans import SCAN_DEADLINE, SNAPSHOT_AGE, Holdings, OverBudget, Stop
from service.state import State

MANIFEST_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*\.(yaml|yml|json)$")
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em; color: #1d1d1f; background: #fafafa; }
h1 { font-size: 1.5em; margin: 0 0 .2em; } h2 { font-size: 1.15em; margin: 1.6em 0 .4em; }
table { border-collapse: collapse; background: #fff; min-width: 30em; }
th, td { border: 1px solid #d0d0d5; padding: .3em .7em; text-align: left; }
th { background: #eef0f4; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.ok { color: #11703a; font-weight: 600; } .bad { color: #b00020; font-weight: 600; }
.muted { color: #666; } textarea { width: 40em; height: 8em; font-family: monospace; }
"""


HTML_PAGE: dict[str, Any] = {
    "content": {"text/html": {"schema": {"type": "string"}}},
    "description": "the status page",
}


def add_routes(app: FastAPI, state: State) -> None:
    @app.get(
        "/",
        response_class=Response,
        summary="Status page (HTML): store, entries by target, counters, a named manifest's coverage",
        responses={200: HTML_PAGE, **error_responses(400, 401, 403, 404, 413, 429, 503)},
    )
    async def status_page(request: Request, manifest: str | None = None) -> Response:
        state.auth.require(request, "read")
        text, source = None, None
        if manifest is not None:
            text, source = _named_manifest(state, manifest), manifest
        return await _page(state, request, text, source)

    @app.post(
        "/",
        response_class=Response,
        summary="Status page (HTML) with the coverage of the manifest in the body",
        responses={200: HTML_PAGE, **error_responses(400, 401, 403, 413, 429, 503)},
    )
    async def status_posted(request: Request) -> Response:
        state.auth.require(request, "read")
        body = (await request.body()).decode("utf-8", "replace")
        if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            body = (parse_qs(body).get("manifest") or [""])[0]
        return await _page(state, request, body, "posted manifest")


async def _page(state: State, request: Request, manifest_text: str | None, source: str | None) -> Response:
    # Whole-store reads in threads of their own, bounded (service.scans):
    # the holdings from a snapshot at most a few seconds old.
    holdings = await state.scans.snapshot()
    rows: list[tuple[str, int, int]] | None = None
    problem = None
    if manifest_text is not None:
        # Reserved from the client's share before any work; what it did not use is given back.
        grant = state.quota.take(request.client.host if request.client else "unknown")
        stop = Stop(SCAN_DEADLINE, budget=grant.seconds)
        targets = list(holdings.targets)
        try:
            if state.checker.available:  # a process of its own: the event loop never waits on it
                rows = await state.checker.check(
                    manifest_text, targets, state.settings.max_specs, state.settings.shape_classes, stop, request
                )
            else:
                rows = await state.scans.run(_coverage, manifest_text, targets, state, watch=request, stop=stop)
        except OverBudget as exc:
            raise ServiceError(
                413,
                "manifest_budget",
                f"checking this manifest's coverage took more than the {exc.budget:g} s of CPU time one check may "
                f"take (GRAPHCACHE_MANIFEST_SECONDS) over the {len(holdings.targets)} target(s) stored; it was "
                "stopped. Check fewer specs at once (split the manifest), or use graphcache warm --check "
                "MANIFEST --target TARGET, on your own machine's time",
                extra={"limit_seconds": exc.budget},
            ) from exc
        except ManifestTooLarge as exc:
            raise ServiceError(413, "too_many_specs", str(exc), extra={"limit": exc.limit}) from exc
        except GraphCacheError as exc:
            problem = str(exc)
        finally:
            state.quota.settle(grant, stop.spent)
    figures = await anyio.to_thread.run_sync(_counters, state)  # reads every worker's file
    page = _render(state, holdings.store, holdings, figures, rows, source, problem)
    return Response(page, media_type="text/html; charset=utf-8", headers={"cache-control": "no-store"})


def _named_manifest(state: State, name: str) -> str:
    """The text of manifest ``name`` in GRAPHCACHE_MANIFESTS: a plain file
    name listed in that folder (404 otherwise, 400 for a name that is not one)."""
    folder = state.settings.manifests
    if folder is None:
        raise ServiceError(
            404, "not_found", "this server names no manifests: start it with GRAPHCACHE_MANIFESTS=DIR, or POST one to /"
        )
    if not MANIFEST_NAME.match(name):
        raise ServiceError(
            400, "bad_request", f"manifest={name!r} must be a file name in GRAPHCACHE_MANIFESTS (NAME.yaml), no path"
        )
    base = folder.resolve()
    names = set(os.listdir(base)) if base.is_dir() else set()
    path = (base / name).resolve()
    if name not in names or path.parent != base or not path.is_file():
        listed = ", ".join(sorted(n for n in names if MANIFEST_NAME.match(n))) or "none"
        raise ServiceError(404, "not_found", f"no manifest {name!r} in GRAPHCACHE_MANIFESTS (it has: {listed})")
    return path.read_text()


def _coverage(text: str, targets: list[str], state: State, stop: Stop) -> list[tuple[str, int, int]]:
    """``service.checker.coverage`` in a scan thread (a store no helper
    process can open again), paced by ``stop``."""
    settings = state.settings
    return coverage(text, targets, state.store, settings.max_specs, settings.shape_classes, stop)


def _counters(state: State) -> dict[str, Any]:
    totals = state.metrics.totals()
    figures = counters(totals)
    return {
        "hits": figures["hits"],
        "misses": figures["misses"],
        "uploads": figures["uploads"],
        "quarantined": figures["quarantined"],
        "gpu_seconds_saved": totals.value("graphcache_served_build_seconds_total"),
        **scope(state, totals.scope),
    }


def _whose(counters: dict[str, Any]) -> str:
    if counters["counters"] == "server":
        return f"this server, {counters['workers']} worker processes (this page from pid {counters['worker']['pid']})"
    return "this server process"


def _counted_by(counters: dict[str, Any]) -> str:
    if counters["counters"] == "server":
        return f"every figure here is summed over the {counters['workers']} workers of this server"
    return "every figure here is this server process's own"


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


def _size(n: int | None) -> str:
    return "unknown" if n is None else human(n)


def _render(
    state: State,
    store: dict[str, Any],
    holdings: Holdings,
    counters: dict[str, Any],
    coverage: list[tuple[str, int, int]] | None,
    source: str | None,
    problem: str | None,
) -> str:
    e = html.escape
    writable = (
        '<span class="ok">yes</span>'
        if store["writable"]
        else f'<span class="bad">no</span> <span class="muted">({e(store["reason"] or "")})</span>'
    )
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<meta name=viewport content='width=device-width, initial-scale=1'>",
        f"<title>graphcache status</title><style>{STYLE}</style></head><body>",
        "<h1>graphcache</h1>",
        f"<p class=muted id=scope>{e(_whose(counters))}, up {counters['uptime_seconds'] / 60:.0f} min; "
        f"counters as of this page's load, the store's figures as of {_clock(holdings.taken)} "
        f"(read again at most every {SNAPSHOT_AGE:g} s, less often on a large store; reload to refresh)</p>",
        "<h2>Store</h2><table>",
        f"<tr><th>kind</th><td id=store-kind>{e(store['kind'])}</td></tr>",
        f"<tr><th>where</th><td>{e(store['where'])}</td></tr>",
        f"<tr><th>size</th><td id=store-size>{_size(store['size'])}</td></tr>",
        f"<tr><th>free space</th><td id=store-free>{_size(store['free'])}</td></tr>",
        f"<tr><th>writable</th><td id=store-writable>{writable}</td></tr></table>",
        "<h2>Entries by target</h2>",
    ]
    if holdings.targets:
        parts.append(
            "<table id=targets><tr><th>target</th><th>entries</th><th>bytes</th><th>pinned</th><th>negative</th></tr>"
        )
        for target, row in sorted(holdings.targets.items()):
            parts.append(
                f"<tr><td>{e(target)}</td><td class=n>{row.count}</td><td class=n>{e(_size(row.bytes))}</td>"
                f"<td class=n>{row.pinned}</td><td class=n>{row.negative}</td></tr>"
            )
        parts.append("</table>")
    else:
        parts.append("<p>The store holds no entries yet (graphcache warm MANIFEST uploads them).</p>")
    if holdings.corrupt:
        parts.append(f"<p class=bad>{holdings.corrupt} corrupt entr{'y' if holdings.corrupt == 1 else 'ies'}</p>")
    parts += [
        "<h2>Since this server started</h2><table id=counters>",
        f"<tr><th>hits</th><td class=n>{counters['hits']:.0f}</td></tr>",
        f"<tr><th>misses</th><td class=n>{counters['misses']:.0f}</td></tr>",
        f"<tr><th>uploads</th><td class=n>{counters['uploads']:.0f}</td></tr>",
        f"<tr><th>quarantined</th><td class=n>{counters['quarantined']:.0f}</td></tr>",
        f"<tr><th>GPU seconds saved</th><td class=n>{counters['gpu_seconds_saved']:.1f}</td></tr>",
        f"</table><p class=muted>GPU seconds saved: the build seconds of every artifact served; "
        f"{e(_counted_by(counters))}</p>",
        "<h2>Manifest coverage</h2>",
    ]
    if problem is not None:
        parts.append(f"<p class=bad>{e(source or 'manifest')}: {e(problem)}</p>")
    elif coverage is not None:
        parts.append(f"<p>{e(source or 'manifest')}</p><table id=coverage>")
        parts.append("<tr><th>target</th><th>present</th><th>specs</th><th>coverage</th></tr>")
        for target, present, total in coverage:
            mark = "ok" if present == total else "bad"
            parts.append(
                f"<tr><td>{e(target)}</td><td class=n>{present}</td><td class=n>{total}</td>"
                f"<td class='n {mark}'>{100 * present / total if total else 0:.0f}%</td></tr>"
            )
        parts.append("</table>" if coverage else "</table><p>No target holds entries to check against.</p>")
    named = state.settings.manifests is not None
    parts.append(
        "<p class=muted>Name one of GRAPHCACHE_MANIFESTS with <code>/?manifest=NAME.yaml</code>, or post one:</p>"
        if named
        else "<p class=muted>Post a manifest (or start the server with GRAPHCACHE_MANIFESTS=DIR and open "
        "<code>/?manifest=NAME.yaml</code>):</p>"
    )
    parts += [
        "<form method=post action='/'><textarea name=manifest placeholder='defaults: ...&#10;graphs: ...'>"
        "</textarea><br><button type=submit>check coverage</button></form>",
        "<p class=muted><a href='/metrics'>/metrics</a> · <a href='/v1/stats'>/v1/stats</a> · "
        "<a href='/healthz'>/healthz</a> · <a href='/docs'>/docs</a></p></body></html>",
    ]
    return "\n".join(parts)
