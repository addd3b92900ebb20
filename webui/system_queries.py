"""Data for the System page: the ``sys/*`` curves, the device limits and the system detectors' events.

Rules:

* Plain functions over a :data:`~webui.queries.Source` returning polars frames;
  nothing here imports Streamlit. :func:`system_view` reads everything the page
  draws in one short connection.
* Curves are downsampled in SQL (:func:`webui.queries.curve`), one series per
  (run, rank, key), so a day of samples draws as fast as a minute of them.
* Keys are grouped into the page's charts by :data:`GROUPS` (memory, time,
  utilisation); a key of the sampler's naming the page does not know is listed
  under "other". Limits are the ``sys/gpu{i}/total`` and ``sys/host/mem_total``
  keys (their largest value per run and rank), drawn as lines on the memory chart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import polars as pl

from webui.queries import DEFAULT_BUCKETS, Source, connection, curve, fetch, one_of, run_info

PREFIX = "sys/"
SYSTEM_KINDS = ("memory_growth", "fragmentation", "step_time_regression", "data_stall")
LIMIT_KEYS = re.compile(r"^sys/(gpu\d+/total|host/mem_total|pool/limit)$")
GROUPS: dict[str, re.Pattern[str]] = {
    "memory": re.compile(r"^sys/(gpu\d+/(allocated|reserved|max_allocated|mem_used)|proc/rss|host/mem_used|"
                         r"pool/(reserved|live|peak_live))$"),
    "time": re.compile(r"^sys/(step_time|data_time)$"),
    "utilisation": re.compile(r"^sys/(gpu\d+/util|proc/cpu|host/cpu)$"),
}
UNITS = {"memory": "GiB", "time": "seconds", "utilisation": "percent"}
GiB = float(1 << 30)


@dataclass
class SystemView:
    """What the System page draws for a set of runs."""

    info: pl.DataFrame
    keys: pl.DataFrame
    points: pl.DataFrame
    limits: pl.DataFrame
    events: pl.DataFrame


def group_of(key: str) -> str:
    """The chart a ``sys/*`` key belongs to: memory, time, utilisation, limit or other."""
    if LIMIT_KEYS.match(key):
        return "limit"
    for name, pattern in GROUPS.items():
        if pattern.match(key):
            return name
    return "other"


def system_keys(src: Source, run_ids: Sequence[str]) -> pl.DataFrame:
    """The ``sys/*`` keys of the runs: key, group, ranks (how many ranks logged it)."""
    cond, params = one_of("run_id", run_ids)
    keys = fetch(
        src,
        f"SELECT key, count(DISTINCT rank) AS ranks FROM metrics WHERE {cond} AND starts_with(key, $p) "
        "GROUP BY key ORDER BY key",
        {**params, "p": PREFIX},
    )
    return keys.with_columns(pl.col("key").map_elements(group_of, return_dtype=pl.Utf8).alias("group"))


def device_limits(src: Source, run_ids: Sequence[str]) -> pl.DataFrame:
    """The memory limits of the runs: run_id, rank, key, limit (bytes) and limit_gib."""
    cond, params = one_of("run_id", run_ids)
    df = fetch(
        src,
        f"SELECT run_id, rank, key, max(value) AS limit FROM metrics WHERE {cond} "
        "AND regexp_full_match(key, $pattern) GROUP BY run_id, rank, key ORDER BY run_id, rank, key",
        {**params, "pattern": LIMIT_KEYS.pattern.strip("^$")},
    )
    return df.with_columns((pl.col("limit") / GiB).alias("limit_gib"))


def system_events(src: Source, run_ids: Sequence[str], kinds: Sequence[str] = SYSTEM_KINDS) -> pl.DataFrame:
    """Events of the system detectors (and any event on a ``sys/*`` key) for the runs."""
    cond, params = one_of("run_id", run_ids)
    kind_cond, kind_params = one_of("kind", kinds, "k")
    return fetch(
        src,
        f"SELECT run_id, rank, step, key, kind, severity, message FROM events WHERE {cond} "
        f"AND ({kind_cond} OR starts_with(coalesce(key, ''), $p)) ORDER BY run_id, rank, step",
        {**params, **kind_params, "p": PREFIX},
    )


def system_curves(src: Source, run_ids: Sequence[str], keys: Sequence[str],
                  buckets: int = DEFAULT_BUCKETS) -> pl.DataFrame:
    """Downsampled curves of ``keys``: run_id, rank, key, group, step, mean, lo, hi, and ``y``
    in the chart's unit (GiB for memory)."""
    parts = []
    for key in keys:
        points = curve(src, run_ids, key, buckets=buckets)
        if points.is_empty():
            continue
        parts.append(points.select("run_id", "rank", "step", "mean", "lo", "hi").with_columns(
            pl.lit(key).alias("key"), pl.lit(group_of(key)).alias("group")))
    if not parts:
        return pl.DataFrame(schema={"run_id": pl.Utf8, "rank": pl.Int32, "step": pl.Int64, "mean": pl.Float64,
                                    "lo": pl.Float64, "hi": pl.Float64, "key": pl.Utf8, "group": pl.Utf8,
                                    "y": pl.Float64})
    out = pl.concat(parts)
    scale = pl.when(pl.col("group") == "memory").then(1.0 / GiB).otherwise(1.0)
    return out.with_columns((pl.col("mean") * scale).alias("y"))


def system_view(src: Source, run_ids: Sequence[str], keys: Sequence[str] | None = None,
                buckets: int = DEFAULT_BUCKETS) -> SystemView:
    """Everything the System page needs, in one short connection; ``keys`` defaults to all sys/* keys."""
    with connection(src) as con:
        found = system_keys(con, run_ids)
        wanted = [k for k in (keys if keys is not None else found["key"].to_list()) if group_of(k) != "limit"]
        return SystemView(
            info=run_info(con, run_ids),
            keys=found,
            points=system_curves(con, run_ids, wanted, buckets),
            limits=device_limits(con, run_ids),
            events=system_events(con, run_ids),
        )
