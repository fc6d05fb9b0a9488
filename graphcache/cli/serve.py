"""The serve verb: the HTTP service under uvicorn. The only verb that imports service/."""

from __future__ import annotations

import os

import click

from graphcache.cli.common import Context, err_console, main, pass_ctx, store_options
from graphcache.stores import check_location
from graphcache.stores.base import shown_url


@main.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535), help="TCP port, 1-65535.")
@click.option(
    "--workers",
    default=None,
    type=click.IntRange(1, 64),
    help="uvicorn worker processes (default: one per CPU this process may use, at most 8).",
)
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--limit-concurrency",
    default=1024,
    show_default=True,
    type=int,
    help="Connections served at once per worker; more get 503.",
)
@click.option(
    "--timeout-keep-alive",
    default=5,
    show_default=True,
    type=int,
    help="Seconds an idle keep-alive connection stays open.",
)
@store_options
@pass_ctx
def serve_cmd(
    ctx: Context,
    host: str,
    port: int,
    workers: int | None,
    log_level: str,
    limit_concurrency: int,
    timeout_keep_alive: int,
) -> None:
    """Run the HTTP service on the configured store (default: DiskStore in --cache-dir)."""
    import uvicorn

    from service.server import uvicorn_options
    from service.workers import counted_together

    if workers is None:
        # One event loop is one core: a single worker left the second core
        # idle and served 256 KiB GETs at 0.64x nginx, two at 0.99x
        # (docs/benchmarks.md). Capped: each worker holds its own hot cache.
        workers = min(len(os.sched_getaffinity(0)), 8)

    # Workers are separate processes: hand them the settings through the
    # environment, which create_app_from_env reads once at start.
    check_location(ctx.location if ctx.location is not None else ctx.settings.store)
    _check_upload_folder(ctx)
    os.environ["GRAPHCACHE_DIR"] = str(ctx.settings.cache_dir)
    if ctx.location is not None:
        if "://" in ctx.location and shown_url(ctx.location) != ctx.location:
            # The process's command line is every local user's to read (ps).
            err_console.print(
                "warning: --store holds a password or a query value, which every user of this machine sees in "
                "ps for as long as the server runs; give the URL in GRAPHCACHE_STORE, or in a file named by "
                "GRAPHCACHE_STORE_FILE, instead",
                highlight=False,
            )
        os.environ["GRAPHCACHE_STORE"] = ctx.location
        os.environ.pop("GRAPHCACHE_STORE_FILE", None)  # --store wins, in the workers too
    if not ctx.location and not ctx.settings.store:
        ctx.settings.cache_dir.mkdir(parents=True, exist_ok=True)
    where = (
        shown_url(ctx.location or ctx.settings.store)
        if (ctx.location or ctx.settings.store)
        else str(ctx.settings.cache_dir)
    )
    err_console.print(f"graphcache serving {where} on http://{host}:{port} ({workers} worker(s)); docs at /docs")
    # Several workers count in one folder (service.workers), so that the
    # status page, /v1/stats and /metrics are the server's, whichever answers.
    with counted_together(workers):
        uvicorn.run(
            "service.app:create_app_from_env",
            factory=True,
            **uvicorn_options(
                host=host,
                port=port,
                workers=workers,
                log_level=log_level,
                limit_concurrency=limit_concurrency,
                timeout_keep_alive=timeout_keep_alive,
            ),
        )


def _check_upload_folder(ctx: Context) -> None:
    """Refuse to start, in one line, where the folder uploads are written to
    while they arrive is not this server's own (service.upload.checked_folder):
    before any worker starts, not once in each."""
    from service.upload import checked_location

    checked_location(ctx.settings, ctx.location)
