"""Reading a wide CSV of loss columns (one row per step) into points, in file order.

Used by ``tracker import csv`` and ``tracker import ultralytics``. Cells are trimmed
(older Ultralytics versions pad them); an empty cell is no point; ``nan``, ``inf``
and ``-inf`` are values. Anything else that is not a number is an error naming the
file, the line, the column and the fix; nothing is imported from that file.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from tracker.errors import DataError
from tracker.importer import points_table


def _read_strings(path: Path) -> pl.DataFrame:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read CSV {path}: {exc.strerror}") from None
    if not raw.strip():
        raise DataError(f"CSV {path} is empty; it needs a header line and one row per step")
    if not raw.endswith(b"\n") and b"\n" in raw:  # a writer killed mid-line: drop the torn last line
        raw = raw[: raw.rfind(b"\n") + 1]
    try:
        frame = pl.read_csv(io.BytesIO(raw), infer_schema_length=0, truncate_ragged_lines=False)
    except pl.exceptions.PolarsError as exc:
        raise DataError(f"CSV {path} cannot be parsed: {str(exc).splitlines()[0]}; "
                        "check that every line has as many fields as the header") from None
    frame = frame.rename({c: c.strip() for c in frame.columns})
    return frame.with_columns(pl.all().str.strip_chars())


def _bad_cell(path: Path, frame: pl.DataFrame, column: str, parsed: pl.Series, what: str, fix: str) -> DataError:
    raw = frame.get_column(column)
    bad = (parsed.is_null() & raw.is_not_null() & (raw != "")).arg_true()
    i = int(bad[0])
    return DataError(f"{path}, line {i + 2}, column {column!r}: {raw[i]!r} is not {what}; {fix}")


def _column(path: Path, frame: pl.DataFrame, name: str, option: str) -> None:
    if name not in frame.columns:
        raise DataError(f"CSV {path} has no column {name!r} ({option}); its columns are: "
                        f"{', '.join(frame.columns)}")


def _times(path: Path, frame: pl.DataFrame, column: str) -> pl.Series:
    raw = frame.get_column(column)
    num = raw.cast(pl.Float64, strict=False)
    if not (num.is_null() & (raw.fill_null("") != "")).any():
        return num
    try:
        return raw.str.to_datetime(time_zone="UTC").dt.epoch("us").cast(pl.Float64) / 1e6
    except pl.exceptions.PolarsError:
        raise _bad_cell(path, frame, column, num, "a time (Unix seconds or an ISO 8601 date and time)",
                        "fix the cell or leave --time-column out") from None


def read_wide_csv(
    path: Path, step_column: str, time_column: str | None = None, time_offset: float | None = None,
) -> tuple[pa.Table, list[str]]:
    """(points in file order, the key columns). ``time_offset`` is added to the time column."""
    frame = _read_strings(path)
    _column(path, frame, step_column, "--step-column")
    steps_raw = frame.get_column(step_column)
    steps = steps_raw.cast(pl.Float64, strict=False)
    whole = steps.is_not_null() & (steps == steps.floor()) & (steps >= 0)
    if not whole.all():
        i = int((~whole).arg_true()[0])
        raise DataError(f"{path}, line {i + 2}, column {step_column!r}: step {steps_raw[i]!r} is not a "
                        "non-negative whole number; fix the row or choose the step column with --step-column")
    walls = pl.Series([None] * frame.height, dtype=pl.Float64)
    if time_column is not None:
        _column(path, frame, time_column, "--time-column")
        walls = _times(path, frame, time_column)
        if time_offset is not None:
            walls = walls + time_offset
    keys = [c for c in frame.columns if c not in (step_column, time_column)]
    if not keys:
        raise DataError(f"CSV {path} has no value columns besides {step_column!r}; nothing to import")
    values = []
    for key in keys:
        col = frame.get_column(key)
        parsed = col.cast(pl.Float64, strict=False)
        if (parsed.is_null() & col.is_not_null() & (col != "")).any():
            raise _bad_cell(path, frame, key, parsed, "a number",
                            "fix the cell (empty means no value; nan and inf are allowed)")
        values.append(parsed.to_numpy())
    grid = np.column_stack(values)  # rows x keys, NaN where missing or nan
    present = np.column_stack([frame.get_column(k).fill_null("").ne("").to_numpy() for k in keys])
    rows, cols = np.nonzero(present)  # row-major: file order
    step_arr = steps.cast(pl.Int64).to_numpy()
    wall_arr = walls.to_numpy()
    key_arr = np.asarray(keys, dtype=object)
    walls_out = (pa.array(wall_arr[rows], pa.float64(), from_pandas=True) if time_column
                 else pa.nulls(len(rows), pa.float64()))
    table = points_table(step_arr[rows], key_arr[cols], grid[rows, cols], walls_out)
    return table, keys
