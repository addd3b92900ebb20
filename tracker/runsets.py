"""Many runs side by side: per-run aggregates, groups of runs by config keys with mean and
min-max / std bands, comparison of 2-N runs, and any logged key as the x axis.

All of it is SQL over the store's views (``curves``, ``runs``; the SQL of ``run_aggregates``
is written in, so the lake, whose views are older, answers too), so it
sees spool rows and ingested rows alike, and a fork's inherited rows. A config key is a
dotted path into the run's JSON config (``loss.scheme`` reads ``{"loss": {"scheme": ...}}``;
a top-level key holding a dot, ``{"loss.scheme": ...}``, is read as well).
See docs/compare-and-fork.md.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Sequence

from tracker.errors import ConfigError, RunError
from tracker.schema import LINEAGE_VIEWS_SQL

if TYPE_CHECKING:  # pragma: no cover
    import polars as pl

    from tracker.store import Store

BANDS = ("minmax", "std")
_AGGREGATES = LINEAGE_VIEWS_SQL["run_aggregates"]  # the view's SQL (a lake has no such view)
_KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-/]*$")


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """``config`` with nested mappings flattened to dotted keys; lists stay values."""
    out: dict[str, Any] = {}
    if isinstance(config, dict):
        for k, v in config.items():
            name = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(flatten(v, name))
            else:
                out[name] = v
    elif prefix:
        out[prefix] = config
    return out


def check_config_key(key: str) -> str:
    """``key`` if it is a usable dotted config key, else ConfigError naming it."""
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ConfigError(f"config key {key!r} is not a dotted name like 'loss.scheme'; use letters, digits, _ . - /")
    return key


def config_value_sql(key: str, column: str = "r.config") -> str:
    """SQL reading config ``key`` (dotted path, or a top-level key holding dots) as text."""
    check_config_key(key)
    path = "$." + ".".join(f'"{part}"' for part in key.split("."))
    return (f"coalesce(json_extract_string({column}, '{path}'), "
            f"json_extract_string({column}, '$.\"{key}\"'))")


def x_axis_sql(x_key: str) -> str:
    """The SQL of each visible row of ``curves`` with ``x``, the value of ``x_key`` (e.g.
    ``epoch``) last logged at or before its step by the same run and rank (an ASOF join,
    so ``epoch`` logged once per epoch still labels every batch row). Rows before the
    key's first row have no x and are left out. For ``epoch``, an imported history (a
    run tagged ``import:...``, whose steps are epochs: a results.csv) that never logged
    ``epoch`` takes its step as x, so it shares the axis with a run tracked per batch.
    Use it as a subquery: ``SELECT ... FROM ({x_axis_sql('epoch')}) c WHERE ...``."""
    key = _key_text(x_key)
    fallback = "FALSE"
    if x_key == "epoch":
        fallback = (f"c.run_id IN (SELECT run_id FROM runs WHERE len(list_filter(tags, t -> starts_with(t, 'import:'))) > 0 "
                    f"AND run_id NOT IN (SELECT DISTINCT run_id FROM curves WHERE key = '{key}'))")
    return f"""
        SELECT * FROM (
            SELECT c.run_id, c.rank, c.step, c.key, c.value, c.wall_time,
                   CASE WHEN {fallback} THEN CAST(c.step AS DOUBLE) ELSE xs.value END AS x
            FROM curves c ASOF LEFT JOIN (SELECT run_id, rank, step, value FROM curves WHERE key = '{key}') xs
              ON c.run_id = xs.run_id AND c.rank = xs.rank AND c.step >= xs.step)
        WHERE x IS NOT NULL"""


def _key_text(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ConfigError(f"metric key must be a non-empty str, got {key!r}")
    return key.replace("'", "''")


def _ids_sql(run_ids: Sequence[str]) -> str:
    return "[" + ", ".join("'" + r.replace("'", "''") + "'" for r in run_ids) + "]"


def aggregates(store: Store, run_ids: Sequence[str] | None = None, keys: Sequence[str] | None = None) -> pl.DataFrame:
    """Per run and key: n_points, min, max, last, last_step, min_step, max_step (the
    ``run_aggregates`` view; NaN rows left out)."""
    where = []
    if run_ids is not None:
        where.append(f"list_contains({_ids_sql(run_ids)}, run_id)")
    if keys is not None:
        where.append(f"list_contains({_ids_sql(keys)}, key)")
    sql = f"SELECT * FROM ({_AGGREGATES})" + (" WHERE " + " AND ".join(where) if where else "")
    return store.query(sql + " ORDER BY run_id, key")


def _check_runs(store: Store, run_ids: Sequence[str]) -> pl.DataFrame:
    if len(run_ids) < 1:
        raise ConfigError("name at least one run")
    info = store.query(f"SELECT run_id, name, config FROM runs WHERE list_contains({_ids_sql(run_ids)}, run_id)")
    missing = sorted(set(run_ids) - set(info["run_id"].to_list()))
    if missing:
        raise RunError(f"unknown run(s) {', '.join(map(repr, missing))}; see `tracker runs list`")
    return info


def config_diff(store: Store, run_ids: Sequence[str], only_differences: bool = True) -> pl.DataFrame:
    """One row per flattened config key, one column per run (values as JSON text);
    only the keys whose values differ unless ``only_differences=False``."""
    import polars as pl

    if len(set(run_ids)) < 2:
        raise ConfigError(f"compare needs at least two different runs, got {list(run_ids)}")
    info = _check_runs(store, run_ids)
    configs = {r: flatten(json.loads(c) if c else {}) for r, c in zip(info["run_id"], info["config"])}
    keys = sorted({k for cfg in configs.values() for k in cfg})
    rows = []
    for key in keys:
        values = [json.dumps(configs[r].get(key), default=str) if key in configs[r] else "—" for r in run_ids]
        if not only_differences or len(set(values)) > 1:
            rows.append([key, *values])
    return pl.DataFrame(rows, schema=["key", *run_ids], orient="row")


def summary_side_by_side(store: Store, run_ids: Sequence[str], keys: Sequence[str] | None = None) -> pl.DataFrame:
    """Per key (default: the keys every run logged) and statistic (last, min, max, best
    step): one column per run."""
    import polars as pl

    _check_runs(store, run_ids)
    agg = aggregates(store, run_ids, keys)
    if keys is None:
        counts = agg.group_by("key").agg(pl.col("run_id").n_unique().alias("n"))
        shared = set(counts.filter(pl.col("n") == len(set(run_ids)))["key"].to_list())
        agg = agg.filter(pl.col("key").is_in(sorted(shared)))
    stats = ("last", "min", "max", "min_step", "last_step")
    long = agg.select("run_id", "key", *[pl.col(s).cast(pl.Float64) for s in stats]).unpivot(
        index=["run_id", "key"], on=list(stats), variable_name="stat")
    if long.is_empty():
        return pl.DataFrame(schema={"key": pl.String, "stat": pl.String, **{r: pl.Float64 for r in run_ids}})
    wide = long.pivot(on="run_id", index=["key", "stat"], values="value")
    for r in run_ids:
        if r not in wide.columns:
            wide = wide.with_columns(pl.lit(None, pl.Float64).alias(r))
    order = {s: i for i, s in enumerate(stats)}
    return (wide.with_columns(pl.col("stat").replace_strict(order, return_dtype=pl.Int32).alias("_o"))
            .sort("key", "_o").select("key", "stat", *run_ids))


def _group_sql(config_keys: Sequence[str], per_run: bool = False) -> str:
    if not config_keys and per_run:  # no grouping: one "group" per run, named like the run
        return "coalesce(r.name, r.run_id)"
    if not config_keys:
        raise ConfigError("group by at least one config key, e.g. loss.scheme")
    parts = [f"'{k}=' || coalesce({config_value_sql(k)}, '∅')" for k in config_keys]
    return " || ', ' || ".join(parts)


def group_summary(store: Store, config_keys: Sequence[str], key: str = "loss",
                  project: str | None = None, run_ids: Sequence[str] | None = None) -> pl.DataFrame:
    """Per group of runs sharing the values of ``config_keys``: n_runs, the runs, and the
    mean, std, min and max over the group of each run's last and best (min) ``key``."""
    where = [f"a.key = '{_key_text(key)}'"]
    if project is not None:
        where.append(f"r.project = '{_key_text(project)}'")
    if run_ids is not None:
        where.append(f"list_contains({_ids_sql(run_ids)}, r.run_id)")
    sql = f"""
        SELECT {_group_sql(config_keys)} AS "group", count(*) AS n_runs,
               avg(a.last) AS last_mean, stddev_samp(a.last) AS last_std,
               min(a.last) AS last_min, max(a.last) AS last_max,
               avg(a.min) AS best_mean, stddev_samp(a.min) AS best_std, min(a.min) AS best_min,
               string_agg(r.run_id, ' ' ORDER BY r.run_id) AS runs
        FROM runs r JOIN ({_AGGREGATES}) a ON a.run_id = r.run_id
        WHERE {' AND '.join(where)}
        GROUP BY 1 ORDER BY last_mean"""
    return store.query(sql)


def group_bands(store: Store, run_ids: Sequence[str], config_keys: Sequence[str], key: str,
                x_key: str | None = None, buckets: int = 200) -> pl.DataFrame:
    """Per group and x bucket: x (bucket mean), mean, std, min, max and n_runs of ``key``.

    Runs are aligned by step, or by ``x_key`` (any logged key, e.g. ``epoch``; see
    :func:`x_axis_sql`). Each run's rows are first averaged within a bucket of the x
    range, then the group's statistics are taken over its runs. ``group`` names the
    config values and how many runs the group holds; with no ``config_keys`` each run
    is its own group (its name).
    """
    if not run_ids:
        raise ConfigError("pick at least one run to group")
    if not 2 <= int(buckets) <= 100_000:
        raise ConfigError(f"buckets must be 2..100000, got {buckets!r}")
    source = (x_axis_sql(x_key) if x_key else "SELECT run_id, rank, step, key, value, CAST(step AS DOUBLE) AS x FROM curves")
    ids = _ids_sql(run_ids)
    sql = f"""
        WITH pts AS (
            SELECT s.run_id, s.x, s.value FROM ({source}) s
            WHERE s.key = '{_key_text(key)}' AND list_contains({ids}, s.run_id) AND isfinite(s.value)),
        bounds AS (SELECT min(x) AS lo, max(x) AS hi FROM pts),
        per_run AS (
            SELECT p.run_id,
                   CASE WHEN b.hi = b.lo THEN 0 ELSE least({int(buckets) - 1},
                        CAST(floor((p.x - b.lo) / (b.hi - b.lo) * {int(buckets)}) AS BIGINT)) END AS bucket,
                   avg(p.x) AS x, avg(p.value) AS value
            FROM pts p, bounds b GROUP BY ALL),
        grouped AS (
            SELECT {_group_sql(config_keys, per_run=True)} AS label, p.* FROM per_run p JOIN runs r ON r.run_id = p.run_id)
        SELECT g.label || ' (n=' || CAST(n.n AS VARCHAR) || ')' AS "group", g.bucket, avg(g.x) AS x,
               avg(g.value) AS mean, coalesce(stddev_samp(g.value), 0) AS std,
               min(g.value) AS min, max(g.value) AS max, count(*) AS n_runs
        FROM grouped g JOIN (SELECT label, count(DISTINCT run_id) AS n FROM grouped GROUP BY label) n
          ON n.label = g.label
        GROUP BY g.label, n.n, g.bucket ORDER BY "group", g.bucket"""
    return store.query(sql)


def class_diff(store: Store, run_ids: Sequence[str], key: str = "val/AP50-95",
               count_key: str = "assign/gt") -> pl.DataFrame:
    """Per class: the last ``key`` of each run and each run's difference from the first run,
    rarest classes first (by the first run's total ``count_key``; classes without counts last)."""
    import polars as pl

    _check_runs(store, run_ids)
    ids = _ids_sql(run_ids)
    last = store.query(f"""
        SELECT run_id, class_index, any_value(class_name) AS class_name, arg_max(value, step) AS value
        FROM class_curves WHERE key = '{_key_text(key)}' AND list_contains({ids}, run_id) GROUP BY ALL""")
    if last.is_empty():
        raise RunError(f"none of the runs logged the per-class key {key!r}; pick one with `tracker runs show RUN`")
    counts = store.query(f"""
        SELECT class_index, sum(value) AS count FROM class_curves
        WHERE key = '{_key_text(count_key)}' AND run_id = '{_key_text(run_ids[0])}' GROUP BY ALL""")
    wide = last.pivot(on="run_id", index=["class_index", "class_name"], values="value")
    for r in run_ids:
        if r not in wide.columns:
            wide = wide.with_columns(pl.lit(None, pl.Float64).alias(r))
    wide = wide.join(counts, on="class_index", how="left")
    diffs = [(pl.col(r) - pl.col(run_ids[0])).alias(f"Δ {r}") for r in run_ids[1:]]
    return (wide.with_columns(*diffs).sort("count", "class_index", nulls_last=True)
            .select("class_index", "class_name", "count", *run_ids, *[f"Δ {r}" for r in run_ids[1:]]))
