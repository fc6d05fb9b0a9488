"""The ``graphcache`` command line.

Errors print one line (``error: ...``) and exit non-zero, never a traceback.
Verbs that need no GPU never import torch or cudnn.

One module per verb group: ``store`` (ls, inspect, get, rm, purge, pin, key),
``deploy`` (warm, prefetch, explain), ``launch`` (record, run: a program under
graphcache), ``manifest`` (a model's graphs
from its config.json), ``bench``, ``doctor`` and
``serve``; what they share (context, store opening, spec parsing, tables'
units, error mapping, the root group) is ``common``. Importing this package
registers every verb on ``main``; ``run`` is the console script's entry point.
"""

from __future__ import annotations

# Importing a verb module registers its verbs on ``main``.
from graphcache.cli import bench, deploy, doctor, launch, manifest, serve, store  # noqa: F401
from graphcache.cli.common import (
    Context,
    fail,
    load_spec_file,
    main,
    one_line,
    parse_spec_arg,
    resolve_key,
    run,
)

__all__ = ["Context", "fail", "load_spec_file", "main", "one_line", "parse_spec_arg", "resolve_key", "run"]
