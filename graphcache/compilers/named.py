"""Compilers by name: ``cudnn`` (the real one, the default), ``reference``
(graphcache.compilers.reference: any machine, no GPU), or ``module:Class``
for one of your own. The CLI's ``--compiler``, ``GraphCache(...,
compiler=NAME)`` and ``GRAPHCACHE_COMPILER`` all read names here."""

from __future__ import annotations

import importlib

from graphcache.compilers.base import Compiler
from graphcache.compilers.cudnn import CudnnCompiler
from graphcache.compilers.reference import ReferenceCompiler
from graphcache.settings import COMPILER_HELP, SettingsError, check_compiler_name

HELP = COMPILER_HELP
# What GraphCache(compiler=...) takes: a compiler, or a name for one.
Named = Compiler | str


def compiler_named(name: str, source: str = "compiler") -> Compiler:
    """A new compiler for ``name`` (see the module). Raises SettingsError
    for a name that names none, or a module:Class that cannot be imported."""
    text = check_compiler_name(name, source)
    if text == "cudnn":
        return CudnnCompiler()
    if text == "reference":
        return ReferenceCompiler()
    module, _, attr = text.partition(":")
    try:
        made: Compiler = getattr(importlib.import_module(module), attr)()
    except (ImportError, AttributeError) as exc:
        raise SettingsError(f"{source}={name!r}: cannot load it ({exc})") from exc
    return made


def resolve(compiler: Named | None, source: str = "compiler") -> Compiler | None:
    """``compiler`` itself, or the compiler a name names (None stays None)."""
    return compiler_named(compiler, source) if isinstance(compiler, str) else compiler
