"""Data for the Embeddings page: the collapse statistics of ``run.log_embeddings`` and the collapse events.

Rules:

* Plain functions over a :data:`~webui.queries.Source` returning polars frames;
  nothing here imports Streamlit. :func:`embedding_view` reads everything the page
  draws in one short connection.
* The embedding keys of a run and their dimension ``D`` come from the run's config
  (``tracker_embeddings``, recorded by ``log_embeddings``); the statistics are the
  scalar keys ``<key>/rankme``, ``<key>/std`` and ``<key>/dead_dims``, downsampled
  in SQL like every curve (:func:`webui.queries.curve`).
* ``std`` is drawn as logged and as ``std * sqrt(D)`` (1 for embeddings spread over
  the sphere, 0 for one point), so runs of different ``D`` share one scale; each
  run's healthy level ``1/sqrt(D)`` is a reference rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import polars as pl

from webui.queries import DEFAULT_BUCKETS, Source, connection, curve, fetch, one_of, run_config, run_info

CONFIG_KEY = "tracker_embeddings"
STATISTICS = ("std", "rankme", "dead_dims")
TITLES = {"std": "std x sqrt(D)", "rankme": "RankMe", "dead_dims": "dead dimensions"}
SUBTITLES = {"std": "L2-normalised; 1 healthy, 0 one point", "rankme": "effective rank, 1 to D",
             "dead_dims": "share of dimensions with std < gamma"}
_POINTS = {"run_id": pl.Utf8, "rank": pl.Int32, "stat": pl.Utf8, "step": pl.Int64, "value": pl.Float64,
           "y": pl.Float64}


@dataclass
class EmbeddingView:
    """What the Embeddings page draws for one embedding key of a set of runs."""

    info: pl.DataFrame
    keys: pl.DataFrame
    points: pl.DataFrame
    events: pl.DataFrame


def embedding_keys(info: pl.DataFrame) -> pl.DataFrame:
    """The embedding keys of the runs in ``info`` (run_info's frame): run_id, key, dim, window, gamma."""
    rows = []
    for run_id, raw in zip(info["run_id"].to_list(), info["config"].to_list()):
        declared = run_config(raw).get(CONFIG_KEY)
        for key, settings in (declared.items() if isinstance(declared, dict) else []):
            if isinstance(settings, dict) and settings.get("dim"):
                rows.append({"run_id": run_id, "key": str(key), "dim": int(settings["dim"]),
                             "window": int(settings.get("window") or 0), "gamma": float(settings.get("gamma", 1.0))})
    schema = {"run_id": pl.Utf8, "key": pl.Utf8, "dim": pl.Int64, "window": pl.Int64, "gamma": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def statistic_curves(src: Source, keys: pl.DataFrame, key: str, buckets: int = DEFAULT_BUCKETS) -> pl.DataFrame:
    """The downsampled statistics of embedding ``key``: run_id, rank, stat, step, value and ``y``
    (``std * sqrt(D)`` for std, the value for the others)."""
    dims = dict(zip(*keys.filter(pl.col("key") == key).select("run_id", "dim").to_dict(as_series=False).values()))
    if not dims:
        return pl.DataFrame(schema=_POINTS)
    parts = []
    for stat in STATISTICS:
        points = curve(src, list(dims), f"{key}/{stat}", buckets=buckets)
        if points.is_empty():
            continue
        scale = pl.col("run_id").replace_strict({r: math.sqrt(d) for r, d in dims.items()}, default=1.0)
        parts.append(points.select("run_id", "rank", "step", pl.col("mean").alias("value")).with_columns(
            pl.lit(stat).alias("stat"),
            (pl.col("value") * (scale if stat == "std" else 1.0)).alias("y")))
    return pl.concat(parts).select(list(_POINTS)) if parts else pl.DataFrame(schema=_POINTS)


def collapse_events(src: Source, run_ids: Sequence[str], key: str) -> pl.DataFrame:
    """The collapse events of embedding ``key``: run_id, rank, step, stat, severity, message."""
    cond, params = one_of("run_id", run_ids)
    df = fetch(
        src,
        f"SELECT run_id, rank, step, key, severity, message FROM events WHERE {cond} AND kind = 'collapse' "
        "AND starts_with(key, $prefix) ORDER BY run_id, rank, step",
        {**params, "prefix": f"{key}/"},
    )
    return df.with_columns(pl.col("key").str.slice(len(key) + 1).alias("stat")).drop("key")


def embedding_view(src: Source, run_ids: Sequence[str], key: str | None = None,
                   buckets: int = DEFAULT_BUCKETS) -> EmbeddingView:
    """Everything the Embeddings page needs, in one short connection; ``key`` defaults to the first one."""
    with connection(src) as con:
        info = run_info(con, run_ids)
        keys = embedding_keys(info)
        if key is None and not keys.is_empty():
            key = str(keys["key"][0])
        if key is None:
            return EmbeddingView(info, keys, pl.DataFrame(schema=_POINTS), collapse_events(con, [], ""))
        return EmbeddingView(info, keys, statistic_curves(con, keys, key, buckets), collapse_events(con, run_ids, key))
