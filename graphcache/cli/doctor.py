"""The doctor verb: what this machine has, and what graphcache can do on it."""

from __future__ import annotations

import click
from rich.table import Table

from graphcache.cli.common import console, load_spec_file, main


@main.command("doctor")
@click.option(
    "--spec",
    "spec_file",
    default=None,
    help="JSON/YAML spec to check (default: float16 causal, 32 heads, seq 1024, dim 128).",
)
def doctor_cmd(spec_file: str | None) -> None:
    """What this machine has, and what graphcache can do on it."""
    from graphcache.ops.doctor import diagnose

    spec = load_spec_file(spec_file) if spec_file else None
    report = diagnose(spec)
    table = Table("check", "found")
    for name, value in report["rows"]:
        table.add_row(name, value)
    console.print(table)
    for line in report["verdict"]:
        console.print(line)
