"""Printing tables from the CLI commands: a terminal table, plain text in a pipe, CSV or JSON.

Rules every command's table follows:

* On a terminal, a rich table fitted to the terminal's width. *Key* columns (run
  ids, names, term names) never wrap and are never cut; columns of prose a command
  names may narrow, wrapping at spaces (a status) or ending in "…" (tags); every
  other column (numbers, dates) is shown whole or, when the width runs out, left
  out (the least useful first), with a note naming the columns left out.
* When stdout is not a terminal (a pipe, a file, a CI log), tab-separated lines with
  a header: no box drawing, no colour, no wrapping, whole values, one row per line,
  so ``cut -f1`` or ``awk -F'\\t'`` read it; the title goes to stderr.
* ``--format csv`` and ``--format json`` give every column in full; list and struct
  columns are written as JSON text in CSV.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import click

if TYPE_CHECKING:  # polars and rich load when a table is printed, not when a command module is imported
    import polars as pl
    from rich.console import Console

FORMATS = ("table", "csv", "json")
format_option = click.option(
    "--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format."
)

MIN_SHRUNK_WIDTH = 6  # a shrinkable column is never narrower than this (or its content)
MIN_WRAPPED_WIDTH = 16  # nor a column that wraps
Styler = Callable[[str, str], str | None]


def cell(value: Any) -> str:
    """One value as table text: lists joined with ", ", mappings as JSON, None as ""."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ", ".join(cell(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, default=str)
    return str(value)


def stdout_is_terminal() -> bool:
    """True when stdout is an interactive terminal (not a pipe, file or test runner)."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def csv_ready(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with list, array and struct columns turned into JSON text (CSV takes flat columns)."""
    import polars as pl

    nested = [name for name, dtype in df.schema.items() if dtype.is_nested()]
    if not nested:
        return df
    return df.with_columns(
        pl.Series(name, [None if v is None else json.dumps(v, default=str) for v in df[name].to_list()], pl.String)
        for name in nested
    )


@dataclass
class Layout:
    """Widths of the shown columns (index -> width) and the names of the columns left out."""

    widths: dict[int, int] = field(default_factory=dict)
    hidden: list[str] = field(default_factory=list)


def table_overhead(n_columns: int) -> int:
    """Characters a rich table with edges and one space of padding adds to its columns."""
    return 3 * n_columns + 1 if n_columns else 0


def plan_layout(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    keys: Sequence[str],
    width: int,
    drop_order: Sequence[str] = (),
    wrap: Sequence[str] = (),
    shrink: Sequence[str] = (),
) -> Layout:
    """Fit the columns into ``width``.

    Key columns keep their full width. Columns in ``wrap`` or ``shrink`` may narrow
    (to 16 or 6 characters); every other column is shown whole (a number cut short
    would mislead) or left out: those in ``drop_order`` first, in that order, then the
    others from the right.
    """
    from rich.cells import cell_len

    natural = [max([cell_len(h)] + [cell_len(r[i]) for r in rows]) for i, h in enumerate(columns)]
    is_key = [c in keys for c in columns]
    floor = [
        n if k else min(n, MIN_WRAPPED_WIDTH) if c in wrap else min(n, MIN_SHRUNK_WIDTH) if c in shrink else n
        for n, k, c in zip(natural, is_key, columns)
    ]
    kept = list(range(len(columns)))
    while sum(floor[i] for i in kept) + table_overhead(len(kept)) > width:
        droppable = [i for i in kept if not is_key[i]]
        if not droppable or len(kept) == 1:  # the last column stays, narrowed if it can be
            break
        first = [columns.index(c) for c in drop_order if c in columns and columns.index(c) in droppable]
        kept.remove(first[0] if first else droppable[-1])
    widths = {i: natural[i] for i in kept}
    excess = sum(widths.values()) + table_overhead(len(kept)) - width
    while excess > 0:
        narrowable = [i for i in kept if widths[i] > floor[i]]
        if not narrowable:
            break
        widest = max(narrowable, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return Layout(widths, [columns[i] for i in range(len(columns)) if i not in widths])


def print_rows(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    keys: Sequence[str] = (),
    drop_order: Sequence[str] = (),
    wrap: Sequence[str] = (),
    shrink: Sequence[str] = (),
    style: Styler | None = None,
    console: Console | None = None,
    terminal: bool | None = None,
) -> None:
    """Print string ``rows`` under ``columns``: a fitted table on a terminal, tab-separated text otherwise.

    ``keys`` name the columns that are never cut; ``drop_order`` the columns to leave out
    first when the terminal is too narrow; ``wrap`` the columns that wrap rather than end
    in "…" when narrowed; ``shrink`` the columns that may end in "…"; other columns are
    shown whole or left out; ``style(column, value)`` may give a
    rich style for a cell (terminal only).
    """
    if not (stdout_is_terminal() if terminal is None else terminal):
        out = console.file if console is not None else sys.stdout
        if title:
            sys.stderr.write(f"{title}\n")
        clean = [[v.replace("\t", " ").replace("\n", " ") for v in row] for row in [list(columns), *rows]]
        out.write("".join("\t".join(row) + "\n" for row in clean))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    layout = plan_layout(columns, rows, keys, console.width, drop_order, wrap, shrink)
    table = Table(title=title, title_justify="left")
    for i, name in enumerate(columns):
        if i in layout.widths:
            wraps = name in wrap and name not in keys
            table.add_column(
                name, width=layout.widths[i], no_wrap=not wraps, overflow="fold" if wraps else "ellipsis"
            )
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            if i in layout.widths:
                cells.append(Text(value, style=(style(columns[i], value) if style else None) or ""))
        table.add_row(*cells)
    total = sum(layout.widths.values()) + table_overhead(len(layout.widths))
    console.print(table, width=max(total, console.width), crop=False)
    if layout.hidden:
        console.print(
            f"[dim]columns left out at this width: {', '.join(layout.hidden)} "
            "(widen the terminal, or use --format csv or json)[/]"
        )


def print_frame(
    df: pl.DataFrame,
    fmt: str,
    title: str | None = None,
    max_rows: int = 200,
    keys: Sequence[str] = (),
    drop_order: Sequence[str] = (),
    shrink: Sequence[str] = (),
) -> None:
    """Print ``df`` to stdout in ``fmt`` (``table`` follows the rules of this module)."""
    import polars as pl

    if fmt == "csv":
        sys.stdout.write(csv_ready(df).write_csv())
    elif fmt == "json":
        sys.stdout.write(df.write_json() + "\n")
    else:
        terminal = stdout_is_terminal()
        if not shrink and not keys:  # a query's result: its text columns may end in "…"
            shrink = [c for c, t in df.schema.items() if t == pl.String or t.is_nested()]
        shown = df if not terminal else df.head(max_rows)
        rows = [[cell(v) for v in row] for row in shown.iter_rows()]
        print_rows(
            df.columns, rows, title=title, keys=keys, drop_order=drop_order, shrink=shrink, terminal=terminal
        )
        if terminal and df.height > max_rows:
            from rich.console import Console

            Console().print(f"[dim]... {df.height - max_rows} more rows (use --format csv for all)[/]")


def tracker_command() -> str:
    """How to spell this installation's ``tracker`` command in a hint the user pastes into a shell.

    ``tracker`` when that name on PATH is this installation's script (an activated
    environment); else the script's path, relative to the working directory when it
    lies below it (``.venv/bin/tracker``), so the hint works in a fresh shell.
    """
    script = Path(sys.executable).parent / "tracker"
    on_path = shutil.which("tracker")
    if on_path and script.exists() and os.path.samefile(on_path, script):
        return "tracker"
    if not script.exists():
        return f"{shlex.quote(sys.executable)} -m tracker.cli"
    return shlex.quote(_relative(script))


def activate_hint() -> str | None:
    """``. .venv/bin/activate`` (the environment of this interpreter) when it is not active, else None."""
    activate = Path(sys.executable).parent / "activate"
    if tracker_command() == "tracker" or not activate.exists():
        return None
    return f". {shlex.quote(_relative(activate))}"


def _relative(path: Path) -> str:
    """``path`` relative to the working directory when below it (never resolving the venv's symlinks)."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)
