"""``python -m graphcache.cli``: the same CLI as ``python -m graphcache``."""

from graphcache.cli import run

run()
