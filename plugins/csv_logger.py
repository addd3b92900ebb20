"""CSV logger: one wide CSV per run (and rank): ``step, wall_time, <key>...``.

* Each flush appends one row per step (keys logged at one step in one flush share a row).
* A key that appears mid-run adds a column: the file is rewritten once, atomically, with
  the new header, and the rows already written keep their values (empty in the new column).
* Resume follows the store's rule: rows with step >= the resume step are dropped
  (atomic rewrite) and the new segment appends after them.

The file is ``<home>/runs/<run_id>/metrics.csv`` (``metrics-r<rank>.csv`` for rank > 0),
or under ``$TRACKER_CSV_DIR`` when set.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from tracker import hookimpl
from tracker.loggers import Batch
from tracker.spool import atomic_write_bytes, run_dir

if TYPE_CHECKING:  # pragma: no cover
    from tracker.run import Run

FIXED = ["step", "wall_time"]


def csv_path(run: "Run") -> Path:
    base = Path(os.environ["TRACKER_CSV_DIR"]) / run.run_id if os.environ.get("TRACKER_CSV_DIR") else run_dir(run.home, run.run_id)
    base.mkdir(parents=True, exist_ok=True)
    return base / ("metrics.csv" if run.rank == 0 else f"metrics-r{run.rank}.csv")


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    return str(v)


class CsvSession:
    def __init__(self, run: "Run"):
        self.path = csv_path(run)
        self.columns: list[str] = list(FIXED)
        if self.path.exists():
            frame = self._read()
            self.columns = frame.columns or list(FIXED)
            if run.reason == "resume":
                self._rewrite(frame.filter(pl.col("step") < run.start_step), self.columns)

    def _read(self) -> pl.DataFrame:
        text = self.path.read_text()
        if not text.endswith("\n"):  # a crash mid-append: drop the torn last line
            text = text[: text.rfind("\n") + 1]
        if not text.strip():
            return pl.DataFrame({"step": [], "wall_time": []}, schema={"step": pl.Int64, "wall_time": pl.Float64})
        return pl.read_csv(io.StringIO(text), infer_schema_length=0).with_columns(pl.col("step").cast(pl.Int64))

    def _rewrite(self, frame: pl.DataFrame, columns: list[str]) -> None:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns)
        present = set(frame.columns)
        for row in frame.iter_rows(named=True):
            writer.writerow([row.get(c) if c in present and row.get(c) is not None else "" for c in columns])
        atomic_write_bytes(self.path, buf.getvalue().encode())
        self.columns = columns

    def write(self, batch: Batch) -> None:
        if batch.metrics is None or batch.metrics.num_rows == 0:
            return
        frame = pl.from_arrow(batch.metrics.select(["step", "key", "value", "wall_time"]))
        assert isinstance(frame, pl.DataFrame)
        new = [k for k in frame["key"].unique(maintain_order=True).to_list() if k not in self.columns]
        if new:
            old = self._read() if self.path.exists() else pl.DataFrame()
            self._rewrite(old, self.columns + new)
        wide = frame.pivot(on="key", index="step", values="value", aggregate_function="last").sort("step")
        walls = frame.group_by("step").agg(pl.col("wall_time").max()).sort("step")
        wide = wide.join(walls, on="step")
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        if not self.path.exists():
            writer.writerow(self.columns)
        have = set(wide.columns)
        for row in wide.iter_rows(named=True):
            writer.writerow([_fmt(row[c]) if c in have else "" for c in self.columns])
        with open(self.path, "a", newline="") as fh:
            fh.write(buf.getvalue())
            fh.flush()
            os.fsync(fh.fileno())

    def close(self, status: str) -> None:
        return None


@dataclass(frozen=True)
class CsvLogger:
    name: str = "csv"
    description: str = "one wide CSV per run, resume-safe"

    def open(self, run: "Run") -> CsvSession:
        return CsvSession(run)


@hookimpl
def tracker_register_loggers(register: Any) -> None:
    register(CsvLogger())
