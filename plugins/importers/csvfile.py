"""``tracker import csv FILE --step-column COL [--time-column COL]``: wide CSV loss logs.

One row per step, one column per key (our CSV logger's format among others: it
round-trips exactly). A log appended after a resume repeats steps: the resume rule
makes the repeat a new segment, hiding the earlier rows from that step on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import click

from tracker.errors import ConfigError
from tracker.importer import Reporter, SourceRun, make_run_id
from plugins.importers.widecsv import read_wide_csv


class CsvImporter:
    name = "csv"
    help = "Import wide CSV loss logs (one row per step, one column per key)."
    params = [
        click.Argument(["files"], nargs=-1, required=True,
                       type=click.Path(exists=True, dir_okay=False, path_type=Path)),
        click.Option(["--step-column"], required=True, help="The column holding the step."),
        click.Option(["--time-column"], default=None,
                     help="A column of wall times (Unix seconds or ISO 8601); else wall times stay empty."),
        click.Option(["--name"], default=None, help="Run name (one FILE only; default: the file's stem)."),
    ]

    def read(self, reporter: Reporter, files: tuple[Path, ...], step_column: str,
             time_column: str | None = None, name: str | None = None, **_: Any) -> Iterator[SourceRun]:
        """Yield one run per file."""
        if name and len(files) > 1:
            raise ConfigError(f"--name {name!r} names one run but {len(files)} files were given; "
                              "import them one at a time or leave --name out")
        reporter.start("reading CSV files", len(files))
        for path in files:
            points, _ = read_wide_csv(path, step_column, time_column)
            run_name = name or path.stem
            reporter.advance(1)
            yield SourceRun(kind="csv", source=str(path), run_id=make_run_id("csv", run_name, str(path.resolve())),
                            name=run_name, project="imported", points=points, tags=["import:csv"],
                            created_at=None if time_column else path.stat().st_mtime)
