"""Printing polars frames as a rich table, CSV or JSON (shared by the CLI commands)."""

from __future__ import annotations

import sys

import click
import polars as pl
from rich.console import Console
from rich.table import Table

FORMATS = ("table", "csv", "json")
format_option = click.option(
    "--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format."
)


def print_frame(df: pl.DataFrame, fmt: str, title: str | None = None, max_rows: int = 200) -> None:
    """Print ``df`` to stdout in ``fmt``."""
    if fmt == "csv":
        flat = df.with_columns([pl.col(c).cast(pl.String) for c, t in df.schema.items() if t.is_nested()])
        sys.stdout.write(flat.write_csv())
    elif fmt == "json":
        sys.stdout.write(df.write_json() + "\n")
    else:
        table = Table(title=title, show_lines=False)
        for col in df.columns:
            table.add_column(col, overflow="fold")
        for row in df.head(max_rows).iter_rows():
            table.add_row(*("" if v is None else str(v) for v in row))
        console = Console()
        console.print(table)
        if df.height > max_rows:
            console.print(f"[dim]... {df.height - max_rows} more rows (use --format csv for all)[/]")
