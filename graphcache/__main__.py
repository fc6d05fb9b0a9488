"""``python -m graphcache``: the CLI."""

from graphcache.cli import run

run()
