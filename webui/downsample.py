"""Downsampling of curves in SQL: at most ``buckets`` rows per series, never the raw points.

Rules:

* A series is one (run, rank) of a key, or one (run, rank, segment) for the rows a
  resume superseded. Its first and last step ``s0``/``s1`` and point count ``n`` come
  from one small aggregate query over the requested step range, its last point from
  a lookup at ``s1``.
* A series with ``n <= buckets`` comes back point by point (``raw``: each step is its
  own bucket). Otherwise ``bucket = (step - s0) * buckets // (s1 - s0 + 1)``, integer
  arithmetic, so there are at most ``buckets`` buckets of equal step width.
* Each bucket gives its first and last step, first wall time, min, max and mean over
  finite values, the point count and how many values were NaN or inf.
* The true last point of each series is added as its own row (``last``), so a line
  always ends on the last logged value, whatever the bucketing.
* One aggregate query runs per series with its bounds as literal parameters (a join
  with the bounds would keep DuckDB from pushing the filters down); the series of one
  chart are few, the points of each are many.
"""

from __future__ import annotations

from typing import Any, Sequence

import duckdb
import polars as pl

SCHEMA: dict[str, Any] = {
    "run_id": pl.Utf8, "rank": pl.Int32, "bucket": pl.Int64, "step": pl.Int64, "step_end": pl.Int64,
    "wall_time": pl.Float64, "lo": pl.Float64, "hi": pl.Float64, "mean": pl.Float64, "n": pl.Int64,
    "nonfinite": pl.Int64, "raw": pl.Boolean, "last": pl.Boolean,
}
_WHERE = "key = $key AND step BETWEEN $lo AND $hi"


def _bounds(con: duckdb.DuckDBPyConnection, table: str, by: list[str], run_ids: Sequence[str],
            params: dict[str, Any]) -> pl.DataFrame:
    """First and last step and count of each series, then its last point (a point lookup)."""
    cols = ", ".join(by)
    runs = {f"r{i}": r for i, r in enumerate(run_ids)}
    cond = f"run_id IN ({', '.join('$' + k for k in runs)})" if runs else "FALSE"
    bounds = con.execute(
        f"""SELECT {cols}, min(step) AS s0, max(step) AS s1, count(*) AS n
            FROM {table} WHERE {cond} AND {_WHERE} GROUP BY {cols} ORDER BY {cols}""",
        {**params, **runs},
    ).pl()
    last = []
    for series in bounds.iter_rows(named=True):
        keys = {k: series[k] for k in by}
        match = " AND ".join(f"{k} = ${k}" for k in keys)
        row = con.execute(
            f"SELECT value, wall_time FROM {table} WHERE {match} AND key = $key AND step = $s1 LIMIT 1",
            {**keys, "key": params["key"], "s1": series["s1"]},
        ).fetchone()
        last.append(row or (None, None))
    return bounds.with_columns(
        pl.Series("last_value", [r[0] for r in last], pl.Float64),
        pl.Series("last_wall", [r[1] for r in last], pl.Float64),
    )


def _series(con: duckdb.DuckDBPyConnection, table: str, series: dict[str, Any], params: dict[str, Any],
            buckets: int) -> pl.DataFrame:
    raw = series["n"] <= buckets
    span = series["s1"] - series["s0"] + 1
    keys = {k: series[k] for k in ("run_id", "rank", "segment") if k in series}
    match = " AND ".join(f"{k} = ${k}" for k in keys)
    return con.execute(
        f"""SELECT (step - $s0) * $nb // $span AS bucket, min(step) AS step, max(step) AS step_end,
                   min(wall_time) AS wall_time,
                   min(value) FILTER (WHERE isfinite(value)) AS lo,
                   max(value) FILTER (WHERE isfinite(value)) AS hi,
                   avg(value) FILTER (WHERE isfinite(value)) AS mean,
                   count(*) AS n, count(*) FILTER (WHERE NOT isfinite(value)) AS nonfinite
            FROM {table} WHERE {match} AND {_WHERE}
            GROUP BY bucket ORDER BY step""",
        {**params, **keys, "s0": series["s0"], "span": span, "nb": span if raw else buckets},
    ).pl().with_columns(
        *(pl.lit(v).alias(k) for k, v in keys.items()), pl.lit(raw).alias("raw"), pl.lit(False).alias("last")
    )


def _last_row(series: dict[str, Any], buckets: int) -> dict[str, Any]:
    value = series["last_value"]
    finite = value is not None and value == value and abs(value) != float("inf")
    row = {k: series[k] for k in ("run_id", "rank", "segment") if k in series}
    return {**row, "bucket": None, "step": series["s1"], "step_end": series["s1"], "wall_time": series["last_wall"],
            "lo": value if finite else None, "hi": value if finite else None, "mean": value if finite else None,
            "n": 1, "nonfinite": 0 if finite else 1, "raw": series["n"] <= buckets, "last": True}


def downsample(
    con: duckdb.DuckDBPyConnection,
    table: str,
    run_ids: Sequence[str],
    key: str,
    lo: int,
    hi: int,
    buckets: int,
    by_segment: bool = False,
) -> pl.DataFrame:
    """Bucketed rows of ``key`` from ``table`` for each series of ``run_ids``; see module doc.

    Columns: run_id, rank, (segment,) bucket, step, step_end, wall_time, lo, hi, mean, n,
    nonfinite, raw, last; ordered by series, then step, the last point at the end.
    """
    by = ["run_id", "rank", "segment"] if by_segment else ["run_id", "rank"]
    schema = {**SCHEMA, **({"segment": pl.Int32} if by_segment else {})}
    order = by + [c for c in SCHEMA if c not in by]
    params = {"key": key, "lo": lo, "hi": hi}
    parts = []
    for series in _bounds(con, table, by, run_ids, params).iter_rows(named=True):
        body = _series(con, table, series, params, buckets)
        last = pl.DataFrame([_last_row(series, buckets)], schema=schema)
        parts.append(pl.concat([body.select(order).cast(schema), last.select(order)]))
    if not parts:
        return pl.DataFrame(schema=schema).select(order)
    return pl.concat(parts)
