"""Routes over many artifacts: listing and purging a retired target."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Query, Request, Response

from graphcache.errors import CorruptArtifact
from graphcache.stores import Store, stored_header
from graphcache.target import Target
from service.errors import ServiceError, json_response
from service.models import KEY_RE, TARGET_RE, ArtifactPage, PurgeResult, error_responses
from service.scans import Stop
from service.state import State


def add_routes(app: FastAPI, state: State) -> None:
    @app.post(
        "/v1/purge",
        summary="Remove every artifact of a retired target, or the negative entries (admin token)",
        response_model=PurgeResult,
        responses=error_responses(400, 401, 403, 422, 503),
    )
    async def purge(
        request: Request,
        target: Annotated[str | None, Query(pattern=TARGET_RE, description="the retired target's text form")] = None,
        unsupported: Annotated[
            bool, Query(description="only negative entries (of target, or of every target without one)")
        ] = False,
        dry_run: bool = False,
    ) -> Response:
        state.auth.require(request, "admin")
        from graphcache.ops import purge as purge_entries

        if target is None and not unsupported:
            raise ServiceError(400, "bad_request", "give target=TARGET, unsupported=true, or both")
        tgt = None if target is None else Target.parse(target)
        # Many store calls, each bounded by the store's own timeout, in a
        # scan thread (service.scans), never the pool health and uploads use.
        removed = await state.scans.whole(
            lambda: purge_entries(state.store, tgt, unsupported=unsupported, dry_run=dry_run)
        )
        for key in removed:
            state.reader.forget(key)
        body = {"target": None if tgt is None else str(tgt), "removed": removed, "dry_run": dry_run}
        return json_response(200, {**body, "unsupported": unsupported})

    @app.get(
        "/v1/artifacts",
        summary="List artifacts (headers, or keys only), paged by key",
        response_model=ArtifactPage,
        responses=error_responses(401, 403, 422, 503),
    )
    async def list_artifacts(
        request: Request,
        target: Annotated[str | None, Query(pattern=TARGET_RE, description="only this target")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        cursor: Annotated[str | None, Query(pattern=KEY_RE, description="next_cursor of the previous page")] = None,
        keys_only: bool = False,
    ) -> Response:
        state.auth.require(request, "read")
        # A whole-store read (every key, sorted): in a scan thread, bounded (service.scans).
        items, next_cursor = await state.scans.run(_page, state.store, target, limit, cursor, keys_only, watch=request)
        return json_response(200, {"items": items, "next_cursor": next_cursor})


def _page(
    store: Store, target: str | None, limit: int, cursor: str | None, keys_only: bool, stop: Stop
) -> tuple[list[dict[str, Any]], str | None]:
    keys = sorted(k for k in store.keys() if cursor is None or k > cursor)
    if keys_only and target is None:
        page = keys[:limit]
        return [{"key": k} for k in page], (page[-1] if len(keys) > limit else None)
    items: list[dict[str, Any]] = []
    last = None
    is_pinned = getattr(store, "pinned", None)
    for key in keys:
        stop.check()
        try:
            header = stored_header(store, key)
        except CorruptArtifact as exc:
            last = key
            items.append({"key": key, "corrupt": str(exc)})
        else:
            if header is None:
                continue
            last = key
            if target is not None and header.get("target_text") != target:
                continue
            item: dict[str, Any] = {"key": key}
            if not keys_only:
                item.update(size=header["payload_size"], header=header)
                if is_pinned is not None:
                    item["pinned"] = bool(is_pinned(key))
            items.append(item)
        if len(items) >= limit:
            break
    more = last is not None and any(k > last for k in keys)
    return items, (last if more else None)
