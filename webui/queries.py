"""Data for the web UI: plain functions over the store that return polars frames.

Rules:

* Every function takes a :data:`Source`: a :class:`~tracker.store.Store` (a short
  read-only connection is opened and closed for the call) or a connection from
  ``Store.reader()`` (to run several queries in one short connection). Nothing here
  keeps a connection, so the app never blocks a training process or a CLI query.
* Curves are downsampled in SQL, never in Python (see :mod:`webui.downsample`): at
  most ``buckets`` rows per series with min, max and mean, plus the true last point;
  a series with at most ``buckets`` points in the step range comes back point by
  point, so zooming in re-queries at full detail.
* Only visible rows are drawn (the ``curves`` view); the rows a resume superseded
  come from ``hidden_metrics`` on request. When no resume of the runs asked for
  superseded anything, the view equals its table and the table is read directly
  (the same rows, without the join).
* Nothing here imports Streamlit; the pages call these functions.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, Union

import duckdb
import numpy as np
import polars as pl

from tracker.analysis.smoothing import ema
from tracker.errors import ConfigError, StoreError
from tracker.store import Store
from webui.downsample import downsample

Source = Union[Store, duckdb.DuckDBPyConnection]

MAX_BUCKETS = 2000
DEFAULT_BUCKETS = 1000
LOSS_KEY_ORDER = ("loss/total", "loss", "train/loss", "loss/train")
RUN_SORTS = ("created_at", "updated_at", "name", "project", "status", "last_step", "best_loss", "duration_s")


@contextlib.contextmanager
def connection(src: Source) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection for ``src``: the one given, or a short reader of the store."""
    if isinstance(src, duckdb.DuckDBPyConnection):
        yield src
    else:
        with src.reader() as con:
            yield con


def fetch(src: Source, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> pl.DataFrame:
    """Run ``sql`` on ``src`` and return a polars frame; DuckDB errors become StoreError."""
    with connection(src) as con:
        try:
            rel = con.execute(sql, params) if params is not None else con.execute(sql)
            return rel.pl()
        except duckdb.Error as exc:
            raise StoreError(f"query failed: {str(exc).splitlines()[0]}\n  in: {sql.strip()[:200]}") from None


def one_of(column: str, values: Sequence[Any], name: str = "v") -> tuple[str, dict[str, Any]]:
    """``column IN ($v0, $v1, ...)`` and its named parameters (FALSE for no values).

    A list of constants lets DuckDB push the filter into the table scan; an
    ``IN (SELECT unnest(?))`` would turn it into a join over every row.
    """
    params = {f"{name}{i}": v for i, v in enumerate(values)}
    if not params:
        return "FALSE", {}
    return f"{column} IN ({', '.join('$' + k for k in params)})", params


def _guarded(fn: Callable[..., pl.DataFrame], *args: Any) -> pl.DataFrame:
    """Call ``fn``; DuckDB errors become StoreError."""
    try:
        return fn(*args)
    except duckdb.Error as exc:
        raise StoreError(f"query failed: {str(exc).splitlines()[0]}") from None


def check_buckets(buckets: int) -> int:
    """``buckets`` if it is a usable bucket budget (2 to MAX_BUCKETS), else ConfigError."""
    if not isinstance(buckets, int) or isinstance(buckets, bool) or not 2 <= buckets <= MAX_BUCKETS:
        raise ConfigError(f"buckets {buckets!r} must be an int between 2 and {MAX_BUCKETS}")
    return buckets


# -- runs ------------------------------------------------------------------------------


def runs_table(
    src: Source,
    *,
    projects: Sequence[str] = (),
    statuses: Sequence[str] = (),
    tags: Sequence[str] = (),
    text: str = "",
    loss_key: str | None = None,
    sort: str = "created_at",
    descending: bool = True,
) -> pl.DataFrame:
    """The runs with their summary, loss key, best (lowest) loss and its step, highest and last loss and the
    fork they come from (``PARENT@STEP``), filtered and sorted.

    Filters combine with AND; within one filter any listed value matches. ``text``
    matches run id, name or config text, case-insensitively. The loss key of a run is
    ``loss_key`` or, by default, the first of ``LOSS_KEY_ORDER`` it logged, else its
    first ``loss/...`` key, else any key containing ``loss``.
    """
    if sort not in RUN_SORTS:
        raise ConfigError(f"Unknown sort column {sort!r}; available: {', '.join(RUN_SORTS)}")
    where, wparams = ["TRUE"], []
    if projects:
        where.append("s.project IN (SELECT unnest(?))")
        wparams.append(list(projects))
    if statuses:
        where.append("s.status IN (SELECT unnest(?))")
        wparams.append(list(statuses))
    if tags:
        where.append("len(list_intersect(s.tags, ?)) > 0")
        wparams.append(list(tags))
    if text:
        where.append("(s.run_id ILIKE ? OR s.name ILIKE ? OR CAST(s.config AS VARCHAR) ILIKE ?)")
        wparams.extend([f"%{text}%"] * 3)
    # one pass over curves: per run and key its points and rank 0's best and last value; the
    # loss key, the points and the last step per run are read from that (not three scans)
    pick_where = "key = ?" if loss_key else "key LIKE '%loss%'"
    order = " ".join(f"WHEN key = '{k}' THEN {i}" for i, k in enumerate(LOSS_KEY_ORDER))
    sql = f"""
        WITH per_key AS (
            SELECT run_id, key, count(*) AS n, max(step) AS last_step, count(*) FILTER (WHERE rank = 0) AS n0,
                   min(value) FILTER (WHERE rank = 0 AND isfinite(value)) AS best_loss,
                   max(value) FILTER (WHERE rank = 0 AND isfinite(value)) AS max_loss,
                   arg_min(step, value) FILTER (WHERE rank = 0 AND isfinite(value)) AS best_step,
                   arg_max(value, step) FILTER (WHERE rank = 0) AS last_loss
            FROM curves GROUP BY run_id, key),
        points AS (SELECT run_id, max(last_step) AS last_step, CAST(sum(n) AS BIGINT) AS n_points
                   FROM per_key GROUP BY run_id),
        pick AS (
            SELECT run_id, arg_min(key, (CASE {order} WHEN key LIKE 'loss/%' THEN 10 ELSE 20 END, key)) AS key
            FROM per_key WHERE {pick_where} GROUP BY run_id),
        loss AS (
            SELECT k.run_id, k.key AS loss_key, k.best_loss, k.best_step, k.max_loss, k.last_loss
            FROM per_key k JOIN pick p ON p.run_id = k.run_id AND p.key = k.key WHERE k.n0 > 0),
        segs AS (SELECT run_id, count(*) AS segments FROM segments GROUP BY run_id),
        forks AS (  -- lineage read by name: a lake's runs have no such columns (no forks there)
            SELECT run_id, json_extract_string(j, '$.parent_run_id') || '@' || json_extract_string(j, '$.fork_step')
                   AS fork_of
            FROM (SELECT r.run_id, to_json(r) AS j FROM runs r) WHERE json_extract_string(j, '$.parent_run_id') IS NOT NULL)
        SELECT s.run_id, s.project, s.name, s.status, s.created_at, s.updated_at,
               date_diff('millisecond', s.created_at, s.updated_at) / 1000.0 AS duration_s,
               pt.last_step, coalesce(pt.n_points, 0) AS n_points, coalesce(g.segments, 0) AS segments,
               l.loss_key, l.best_loss, l.best_step, l.max_loss, l.last_loss, f.fork_of,
               s.tags, CAST(s.config AS VARCHAR) AS config
        FROM runs s LEFT JOIN points pt ON pt.run_id = s.run_id LEFT JOIN segs g ON g.run_id = s.run_id
        LEFT JOIN loss l ON l.run_id = s.run_id LEFT JOIN forks f ON f.run_id = s.run_id
        WHERE {' AND '.join(where)}
        ORDER BY {sort} {'DESC' if descending else 'ASC'} NULLS LAST, run_id"""
    params = [loss_key] if loss_key else []
    return fetch(src, sql, params + wparams)


SHORT = 8  # lists and mappings longer than this are one summarised column


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def summarise(value: list[Any] | dict[str, Any]) -> str:
    """A short text for a long list or mapping of the config (class counts, weights, ...).

    ``80 values, 198 … 262465`` for numbers (a mapping keeps its size only), else
    ``80 items``/``80 keys``; a short list of scalars is written out.
    """
    values = list(value.values()) if isinstance(value, dict) else list(value)
    what = "keys" if isinstance(value, dict) else "items"
    if isinstance(value, list) and len(values) <= SHORT and all(v is None or isinstance(v, (bool, int, float, str))
                                                                for v in values):
        return "[" + ", ".join(str(v) for v in values) + "]"
    if values and all(_number(v) for v in values):
        lo, hi = min(values), max(values)
        return f"{len(values)} values, {lo:g} … {hi:g}"
    return f"{len(values)} {what}"


def _flat(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and len(value) > SHORT and all(
            v is None or isinstance(v, (bool, int, float, str)) for v in value.values()):
        out[prefix] = summarise(value)  # a vector keyed by name (class counts): one column
    elif isinstance(value, dict):
        for k, v in value.items():
            _flat(v, f"{prefix}.{k}", out)
    elif isinstance(value, (list, tuple)):
        out[prefix] = summarise(list(value))
    elif value is None or isinstance(value, (bool, int, float, str)):
        out[prefix] = value


def config_columns(runs: pl.DataFrame, max_columns: int = 40) -> pl.DataFrame:
    """``runs`` with its JSON config spread into ``config.<key>`` columns.

    Scalars get a column each; a list, or a mapping of more than ``SHORT`` scalars
    (class counts by name), stays one column holding its summary (:func:`summarise`).
    Values that differ in type across runs are shown as text.
    """
    if runs.is_empty() or "config" not in runs.columns:
        return runs
    flat: list[dict[str, Any]] = []
    for raw in runs["config"].to_list():
        row: dict[str, Any] = {}
        try:
            _flat(json.loads(raw) if raw else {}, "config", row)
        except ValueError:
            row = {}
        flat.append(row)
    names = list(dict.fromkeys(k for row in flat for k in row))[:max_columns]
    columns = {}
    for name in names:
        values = [row.get(name) for row in flat]
        kinds = {type(v) for v in values if v is not None}
        if len(kinds) > 1 and not kinds <= {int, float}:
            values = [None if v is None else str(v) for v in values]
        columns[name] = pl.Series(name, values, strict=False)
    return runs.with_columns(**columns) if columns else runs


def run_list(src: Source) -> pl.DataFrame:
    """Every run (id, name, project, status, tags), newest first: the pickers' and filters' options."""
    return fetch(src, "SELECT run_id, name, project, status, tags FROM runs ORDER BY created_at DESC, run_id")


def run_info(src: Source, run_ids: Sequence[str]) -> pl.DataFrame:
    """Name, status, project and config (text) of the given runs, in the given order."""
    cond, params = one_of("run_id", run_ids)
    df = fetch(src, f"SELECT run_id, project, name, status, CAST(config AS VARCHAR) AS config FROM runs WHERE {cond}",
               params)
    order = {r: i for i, r in enumerate(run_ids)}
    return df.with_columns(pl.col("run_id").replace_strict(order, default=len(order)).alias("_o")).sort("_o").drop("_o")


def run_labels(info: pl.DataFrame) -> dict[str, str]:
    """A legend label per run: its name, with the run id added where names repeat."""
    names = info["name"].to_list()
    ids = info["run_id"].to_list()
    out = {}
    for run_id, name in zip(ids, names):
        label = name or run_id
        out[run_id] = f"{label} ({run_id})" if names.count(name) > 1 or not name else label
    return out


def run_config(raw: str | None) -> dict[str, Any]:
    """A run's config parsed from its JSON text ({} when absent or unreadable)."""
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# -- curves ----------------------------------------------------------------------------


def metric_keys(src: Source, run_ids: Sequence[str]) -> pl.DataFrame:
    """Scalar keys logged by any of ``run_ids``: key, runs (how many), points (visible rows)."""
    cond, params = one_of("run_id", run_ids)
    return fetch(
        src,
        f"SELECT key, count(DISTINCT run_id) AS runs, count(*) AS points FROM curves WHERE {cond} "
        "GROUP BY key ORDER BY key",
        params,
    )


def key_names(src: Source, run_ids: Sequence[str]) -> list[str]:
    """The scalar keys of ``run_ids``, sorted (a cheap distinct scan, no counting)."""
    cond, params = one_of("run_id", run_ids)
    df = fetch(src, f"SELECT DISTINCT key FROM metrics WHERE {cond} ORDER BY key", params)
    return df["key"].to_list()


def step_bounds(src: Source, run_ids: Sequence[str], key: str) -> pl.DataFrame:
    """Per series (run, rank) of ``key``: first and last visible step and point count."""
    cond, params = one_of("run_id", run_ids)
    with connection(src) as con:
        table = "curves" if hides_rows(con, run_ids) else "metrics"
        return fetch(
            con,
            f"SELECT run_id, rank, min(step) AS lo, max(step) AS hi, count(*) AS n FROM {table} "
            f"WHERE key = $key AND {cond} GROUP BY run_id, rank ORDER BY run_id, rank",
            {**params, "key": key},
        )


def default_key(keys: Sequence[str], wanted: str | None = None) -> str | None:
    """``wanted`` when logged, else the preferred loss key, else any ``loss`` key, else the first."""
    if wanted in keys:
        return wanted
    preferred = [k for k in LOSS_KEY_ORDER if k in keys] + [k for k in keys if "loss" in k] + list(keys)
    return preferred[0] if preferred else None


@dataclass
class CurveContext:
    """What the curves page needs before drawing: keys, liveness, and the chosen key's step bounds."""

    keys: list[str]
    key: str | None
    live: bool
    bounds: pl.DataFrame


def curve_context(src: Source, run_ids: Sequence[str], wanted: str | None = None) -> CurveContext:
    """Keys of ``run_ids``, the key to show (``wanted`` if logged) and its bounds, in one connection."""
    with connection(src) as con:
        keys = key_names(con, run_ids)
        key = default_key(keys, wanted)
        bounds = step_bounds(con, run_ids, key) if key else pl.DataFrame()
        return CurveContext(keys, key, running(con, run_ids), bounds)


def hides_rows(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> bool:
    """Did a resume of any of ``run_ids`` supersede rows? (If not, the views equal the tables.)"""
    cond, params = one_of("run_id", run_ids)
    row = con.execute(f"SELECT count(*) FROM segment_bounds WHERE {cond} AND hidden_from IS NOT NULL",
                      params).fetchone()
    return bool(row and row[0])


def step_range(lo: int | None, hi: int | None) -> tuple[int, int]:
    """The step range ``lo..hi`` with open ends filled in; ConfigError when it is empty."""
    lo_ = 0 if lo is None else int(lo)
    hi_ = 2**62 if hi is None else int(hi)
    if hi_ < lo_:
        raise ConfigError(f"step range {lo_}..{hi_} is empty; the end must be >= the start")
    return lo_, hi_


def curve(
    src: Source,
    run_ids: Sequence[str],
    key: str,
    *,
    lo: int | None = None,
    hi: int | None = None,
    buckets: int = DEFAULT_BUCKETS,
) -> pl.DataFrame:
    """The downsampled visible curve of ``key`` for each run (and rank); see module doc.

    Columns: run_id, rank, bucket, step, step_end, wall_time, lo, hi, mean, n, nonfinite,
    raw, last. Rows are ordered by series and step; each series ends with its last point.
    """
    lo_, hi_ = step_range(lo, hi)
    nb = check_buckets(buckets)
    with connection(src) as con:
        table = "curves" if hides_rows(con, run_ids) else "metrics"
        return _guarded(downsample, con, table, run_ids, key, lo_, hi_, nb)


def hidden_curve(
    src: Source,
    run_ids: Sequence[str],
    key: str,
    *,
    lo: int | None = None,
    hi: int | None = None,
    buckets: int = DEFAULT_BUCKETS,
) -> pl.DataFrame:
    """The rows of ``key`` that a resume superseded, downsampled per (run, rank, segment)."""
    lo_, hi_ = step_range(lo, hi)
    nb = check_buckets(buckets)
    with connection(src) as con:
        return _guarded(downsample, con, "hidden_metrics", run_ids, key, lo_, hi_, nb, True)


@dataclass
class CurveView:
    """What the curves page draws: run info, the downsampled curve, superseded rows, resume marks."""

    info: pl.DataFrame
    points: pl.DataFrame
    hidden: pl.DataFrame | None
    marks: pl.DataFrame
    events: pl.DataFrame | None = None
    origins: dict[str, float] | None = None


def curve_view(
    src: Source,
    run_ids: Sequence[str],
    key: str,
    *,
    lo: int | None = None,
    hi: int | None = None,
    buckets: int = DEFAULT_BUCKETS,
    hidden: bool = False,
) -> CurveView:
    """Everything the curves page needs for ``key``, in one short connection."""
    with connection(src) as con:
        marks = resume_marks(con, run_ids)
        if lo is not None or hi is not None:
            lo_, hi_ = step_range(lo, hi)
            marks = marks.filter((pl.col("step") >= lo_) & (pl.col("step") <= hi_))
        return CurveView(
            info=run_info(con, run_ids),
            points=curve(con, run_ids, key, lo=lo, hi=hi, buckets=buckets),
            hidden=hidden_curve(con, run_ids, key, lo=lo, hi=hi, buckets=buckets) if hidden else None,
            marks=marks,
            events=curve_events(con, run_ids, key, lo=lo, hi=hi),
            origins=run_origins(con, run_ids, key) if lo is not None or hi is not None else None,
        )


def run_origins(src: Source, run_ids: Sequence[str], key: str) -> dict[str, float]:
    """The wall time of each run's first visible point of ``key``: where relative time starts,
    also when the view is zoomed past it."""
    cond, params = one_of("run_id", run_ids)
    with connection(src) as con:
        table = "curves" if hides_rows(con, run_ids) else "metrics"
        df = fetch(con, f"SELECT run_id, min(wall_time) AS t0 FROM {table} WHERE key = $key AND {cond} "
                        "GROUP BY run_id", {**params, "key": key})
    return dict(zip(df["run_id"].to_list(), df["t0"].to_list()))


def resume_marks(src: Source, run_ids: Sequence[str]) -> pl.DataFrame:
    """Segment starts of the runs (one per run and segment): step, reason, start time. A fork's
    first segment has reason ``fork of PARENT@STEP`` (the charts mark it like a resume)."""
    cond, params = one_of("run_id", run_ids)
    return fetch(
        src,
        "WITH m AS (SELECT run_id, segment, min(start_step) AS step, any_value(reason) AS reason, "
        f"min(started_at) AS started_at, count(*) AS ranks FROM segments WHERE {cond} GROUP BY run_id, segment), "
        "f AS (SELECT run_id, json_extract_string(j, '$.parent_run_id') || '@' || json_extract_string(j, '$.fork_step') "
        "AS fork_of FROM (SELECT r.run_id, to_json(r) AS j FROM runs r)) "  # by name: a lake's runs have no lineage
        "SELECT m.run_id, m.segment, m.step, CASE WHEN m.segment = 0 AND f.fork_of IS NOT NULL "
        "THEN 'fork of ' || f.fork_of ELSE m.reason END AS reason, m.started_at, m.ranks "
        "FROM m LEFT JOIN f ON f.run_id = m.run_id ORDER BY m.run_id, m.segment",
        params,
    )


def curve_events(
    src: Source, run_ids: Sequence[str], key: str, *, lo: int | None = None, hi: int | None = None
) -> pl.DataFrame:
    """Events of ``run_ids`` about ``key`` (or about no key) in the step range, to mark on its curve.

    Columns: run_id, step, key, kind, severity, message.
    """
    lo_, hi_ = step_range(lo, hi)
    cond, params = one_of("run_id", run_ids)
    return fetch(
        src,
        f"""SELECT run_id, step, key, kind, severity, message FROM events
            WHERE {cond} AND (key = $key OR key IS NULL) AND step BETWEEN $lo AND $hi
            ORDER BY run_id, step, kind""",
        {**params, "key": key, "lo": lo_, "hi": hi_},
    )


def smooth(frame: pl.DataFrame, weight: float, by: Sequence[str] = ("run_id", "rank")) -> pl.DataFrame:
    """Add ``smooth``: TensorBoard's debiased EMA of ``mean`` along each series.

    Runs on the downsampled line (at most a few thousand points per series).
    """
    if frame.is_empty():
        return frame.with_columns(pl.lit(None, pl.Float64).alias("smooth"))
    parts = []
    for _, part in frame.group_by(list(by), maintain_order=True):
        values = part["mean"].fill_null(float("nan")).to_numpy().astype(np.float64)
        parts.append(part.with_columns(pl.Series("smooth", ema(values, weight) if weight > 0 else values)))
    return pl.concat(parts).with_columns(
        pl.when(pl.col("smooth").is_nan()).then(None).otherwise(pl.col("smooth")).alias("smooth")
    )


def running(src: Source, run_ids: Sequence[str]) -> bool:
    """Is any of ``run_ids`` still running (its pages then refresh live)?"""
    if not run_ids:
        return False
    cond, params = one_of("run_id", run_ids)
    df = fetch(src, f"SELECT count(*) AS n FROM runs WHERE status = 'running' AND {cond}", params)
    return bool(df["n"][0])


# -- events ----------------------------------------------------------------------------


def events_table(
    src: Source,
    run_ids: Sequence[str] = (),
    *,
    kinds: Sequence[str] = (),
    severities: Sequence[str] = (),
    limit: int = 5000,
) -> pl.DataFrame:
    """Events (``run.event()`` rows and detector findings) by run and step."""
    where, params = ["TRUE"], {}
    for column, values in (("run_id", run_ids), ("kind", kinds), ("severity", severities)):
        if values:
            cond, named = one_of(f"e.{column}", values, column)
            where.append(cond)
            params.update(named)
    sql = f"""
        SELECT e.run_id, r.name, e.step, e.key, e.kind, e.severity, e.message,
               CAST(e.data AS VARCHAR) AS data, e.rank, e.segment, e.wall_time
        FROM events e LEFT JOIN runs r ON r.run_id = e.run_id
        WHERE {' AND '.join(where)}
        ORDER BY e.run_id, e.step, e.kind LIMIT {int(limit)}"""
    return fetch(src, sql, params)


def schema_info(src: Source) -> pl.DataFrame:
    """Tables and views users can query, with their columns and types."""
    return fetch(
        src,
        """SELECT table_name AS "table", column_name AS "column", data_type AS type
           FROM information_schema.columns
           WHERE table_name IN ('runs', 'segments', 'metrics', 'class_metrics', 'classes', 'events',
                                'curves', 'class_curves', 'hidden_metrics', 'segment_bounds', 'run_summary',
                                'run_aggregates', 'run_lineage')
           GROUP BY ALL ORDER BY "table", min(ordinal_position)""",
    )
