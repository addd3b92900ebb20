"""Per-class data for the web UI: heatmaps, rankings, shares and rare-versus-frequent.

Rules:

* Aggregation is done in SQL over the ``class_curves`` view (visible rows only);
  Python only ever sees at most ``classes x buckets`` cells.
* Step buckets follow the curves' rule, in integer arithmetic:
  ``(step - lo) * buckets // (hi - lo + 1)`` over the steps found in the requested
  range; when that range spans at most ``buckets`` steps, each step is its own bucket.
* Like the curves, the plain table is read when no resume of the run superseded rows.
* Class counts come from the run's config (``class_counts``: a list in class order or
  a ``{name: count}`` mapping) or from a COCO file (an instances file, whose
  annotations are counted, or a class-count file). Counts are matched to the run's
  classes by name when both have names, else by index; the loss's own ``counts``
  (``config["loss"]["counts"]``) serve when nothing else names them.
* Class weights are read from where a run has them (:func:`class_weights_of`): a
  ``class_weights`` vector (or ``{name: weight}``) at the top of the config or in its
  ``loss`` section, else the loss section's weight parameters (``scheme``, ``counts``,
  ``beta``, ``power``, ``weights``, ``normalize``: what ``class_weighted_bce`` is given)
  run through :func:`tracker.weights.class_weights`, the function the loss itself uses.
* Rare and frequent: classes are split into thirds by count (rare, common, frequent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import duckdb
import numpy as np
import polars as pl

from tracker.errors import DataError
from webui.queries import Source, check_buckets, step_range, connection, fetch, hides_rows

GROUPS = ("rare", "common", "frequent")


def class_keys(src: Source, run_id: str) -> list[str]:
    """Keys logged with ``log_classes`` by ``run_id``, sorted."""
    df = fetch(src, "SELECT DISTINCT key FROM class_metrics WHERE run_id = ? ORDER BY key", [run_id])
    return df["key"].to_list()


def _class_table(con: duckdb.DuckDBPyConnection, run_id: str) -> str:
    """``class_curves`` when a resume of the run superseded rows, else the plain table."""
    return "class_curves" if hides_rows(con, [run_id]) else "class_metrics"


def heatmap(
    src: Source,
    run_id: str,
    key: str,
    *,
    lo: int | None = None,
    hi: int | None = None,
    buckets: int = 200,
) -> pl.DataFrame:
    """Mean of each class in each step bucket (visible rows; see module doc).

    Columns: class_index, bucket, step, step_end, value, n, class_name.
    """
    lo_, hi_ = step_range(lo, hi)
    params = {"run": run_id, "key": key, "lo": lo_, "hi": hi_, "nb": check_buckets(buckets)}
    where = "run_id = $run AND key = $key AND step BETWEEN $lo AND $hi"
    with connection(src) as con:
        table = _class_table(con, run_id)
        bounds = {k: params[k] for k in ("run", "key", "lo", "hi")}
        s0, s1 = con.execute(f"SELECT min(step), max(step) FROM {table} WHERE {where}", bounds).fetchone()
        if s0 is None:
            return pl.DataFrame(schema={"class_index": pl.Int32, "bucket": pl.Int64, "step": pl.Int64,
                                        "step_end": pl.Int64, "value": pl.Float64, "n": pl.Int64,
                                        "class_name": pl.Utf8})
        span = s1 - s0 + 1
        return fetch(
            con,
            f"""WITH cells AS (
                   SELECT class_index, (step - $s0) * $nb // $span AS bucket,
                          min(step) AS step, max(step) AS step_end,
                          avg(value) FILTER (WHERE isfinite(value)) AS value, count(*) AS n
                   FROM {table} WHERE {where} GROUP BY ALL)
               SELECT cells.*, coalesce(c.name, CAST(cells.class_index AS VARCHAR)) AS class_name
               FROM cells LEFT JOIN classes c ON c.run_id = $run AND c.class_index = cells.class_index
               ORDER BY cells.class_index, cells.bucket""",
            {**params, "s0": s0, "span": span, "nb": min(params["nb"], span)},
        )


def names_of(cells: pl.DataFrame) -> list[str]:
    """Class names by class index (``str(index)`` for a gap) from :func:`heatmap` cells."""
    if cells.is_empty():
        return []
    pairs = cells.select("class_index", "class_name").unique()
    names = [str(i) for i in range(int(pairs["class_index"].max()) + 1)]
    for index, name in pairs.iter_rows():
        names[index] = name
    return names


def ranking(src: Source, run_id: str, key: str, *, last_steps: int, last_step: int | None = None) -> pl.DataFrame:
    """Each class's mean over the steps after ``last_step - last_steps``, highest first.

    ``last_step`` defaults to the last visible step of ``key`` (pass it when known).
    Columns: class_index, class_name, mean, points, share (of the sum of the means).
    """
    params = {"run": run_id, "key": key, "n": int(last_steps)}
    with connection(src) as con:
        table = _class_table(con, run_id)
        if last_step is None:
            row = con.execute(f"SELECT max(step) FROM {table} WHERE run_id = $run AND key = $key",
                              {"run": run_id, "key": key}).fetchone()
            last_step = row[0] if row and row[0] is not None else 0
        params["s1"] = int(last_step)
        ranked = fetch(
            con,
            f"""SELECT m.class_index, coalesce(any_value(c.name), CAST(m.class_index AS VARCHAR)) AS class_name,
                      avg(m.value) FILTER (WHERE isfinite(m.value)) AS mean, count(*) AS points
               FROM {table} m LEFT JOIN classes c ON c.run_id = $run AND c.class_index = m.class_index
               WHERE m.run_id = $run AND m.key = $key AND m.step > $s1 - $n AND m.step <= $s1
               GROUP BY m.class_index
               ORDER BY mean DESC NULLS LAST, m.class_index""",
            params,
        )
    return ranked.with_columns((pl.col("mean") / pl.col("mean").sum()).alias("share"))


@dataclass
class ClassView:
    """What the per-class page draws for one run and key."""

    cells: pl.DataFrame
    ranked: pl.DataFrame
    names: list[str]


def class_view(src: Source, run_id: str, key: str, *, buckets: int, last_steps: int) -> ClassView:
    """Heatmap cells, ranking and class names of ``key`` in one short connection."""
    with connection(src) as con:
        cells = heatmap(con, run_id, key, buckets=buckets)
        last = int(cells["step_end"].max()) if not cells.is_empty() else None
        ranked = ranking(con, run_id, key, last_steps=last_steps, last_step=last)
    return ClassView(cells, ranked, names_of(cells))


def shares(cells: pl.DataFrame, *, top: int = 10) -> pl.DataFrame:
    """Share of each bucket's total that each class contributes, from :func:`heatmap` cells.

    The ``top`` classes by overall share keep their names; the others are summed as
    ``other``. Negative means count as zero. Columns: bucket, class_name, value, step, share.
    """
    if cells.is_empty():
        return pl.DataFrame(schema={"bucket": pl.Int64, "class_name": pl.Utf8, "value": pl.Float64,
                                    "step": pl.Int64, "share": pl.Float64})
    totals = cells.group_by("class_name").agg(pl.col("value").clip(lower_bound=0).sum().alias("t"))
    keep = totals.sort(["t", "class_name"], descending=[True, False]).head(top)["class_name"].to_list()
    named = cells.with_columns(
        pl.when(pl.col("class_name").is_in(keep)).then(pl.col("class_name")).otherwise(pl.lit("other"))
    )
    grouped = named.group_by(["bucket", "class_name"]).agg(pl.col("value").clip(lower_bound=0).sum())
    step_of = cells.group_by("bucket").agg(pl.col("step").min())
    return grouped.join(step_of, on="bucket").with_columns(
        (pl.col("value") / pl.col("value").sum().over("bucket")).fill_nan(None).alias("share")
    ).sort(["bucket", "class_name"])


def counts_vector(raw: Any, names: Sequence[str]) -> np.ndarray | None:
    """Counts aligned to ``names`` from a list (by index) or a mapping (by name)."""
    if isinstance(raw, dict):
        out = np.array([float(raw[n]) if n in raw else np.nan for n in names])
        return out if np.isfinite(out).any() else None
    if isinstance(raw, (list, tuple)) and raw and all(isinstance(v, (int, float)) for v in raw):
        out = np.full(len(names), np.nan)
        n = min(len(raw), len(names))
        out[:n] = np.asarray(raw[:n], dtype=np.float64)
        return out
    return None


def counts_from_config(config: dict[str, Any], names: Sequence[str]) -> np.ndarray | None:
    """Class counts from a run config (``class_counts`` list or mapping, else the loss's ``counts``)."""
    for field in ("class_counts", "counts"):
        if field in config:
            return counts_vector(config[field], names)
    loss = config.get("loss")
    if isinstance(loss, dict) and "counts" in loss:
        return counts_vector(loss["counts"], names)
    return None


@dataclass
class FoundWeights:
    """The class weights a run trained with (None when it had none) and where they were found."""

    weights: np.ndarray | None
    source: str


def _weight_vector(raw: Any, names: Sequence[str]) -> np.ndarray | None:
    if isinstance(raw, dict):
        vec = counts_vector(raw, names)
        return vec if vec is not None and np.isfinite(vec).all() else None
    if isinstance(raw, (list, tuple)) and len(raw) == len(names) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw):
        return np.asarray(raw, dtype=np.float64)
    return None


def class_weights_of(config: dict[str, Any], names: Sequence[str]) -> FoundWeights:
    """The class weights of a run, read from its config (see module doc for where)."""
    from tracker.errors import TrackerError
    from tracker.weights import COUNT_SCHEMES, SCHEMES, class_weights

    loss = config.get("loss") if isinstance(config.get("loss"), dict) else {}
    for where, section in (("class_weights", config), ("loss.class_weights", loss)):
        found = _weight_vector(section.get("class_weights"), names)
        if found is not None:
            return FoundWeights(found, f"the run's config ({where})")
    scheme = loss.get("scheme")
    if scheme not in SCHEMES:
        return FoundWeights(None, "The run's config names no class weights (class_weights, or a loss scheme)")
    if scheme == "none":
        return FoundWeights(None, "The run's loss is unweighted (loss.scheme 'none'): every class weighs 1")
    counts = counts_vector(loss["counts"], names) if "counts" in loss else counts_from_config(config, names)
    if scheme in COUNT_SCHEMES and (counts is None or not np.isfinite(counts).all()):
        return FoundWeights(None, f"The run's loss uses scheme {scheme!r} but its config holds no class counts")
    params = {k: loss[k] for k in ("beta", "power", "normalize") if k in loss}
    try:
        weights = class_weights(counts, scheme, weights=loss.get("weights"), num_classes=len(names), **params)
    except (TrackerError, TypeError, ValueError) as exc:
        return FoundWeights(None, f"The run's loss weights could not be recomputed: {exc}")
    shown = ", ".join(f"{k} {v}" for k, v in params.items())
    return FoundWeights(weights, f"loss.scheme {scheme!r}" + (f" ({shown})" if shown else "") +
                        " over the run's class counts, as the loss computes them")


def weights_from_config(config: dict[str, Any], n: int) -> np.ndarray | None:
    """The class weights in use when the config lists them (``class_weights``), length ``n``."""
    raw = config.get("class_weights")
    if isinstance(raw, (list, tuple)) and len(raw) == n and all(isinstance(v, (int, float)) for v in raw):
        return np.asarray(raw, dtype=np.float64)
    return None


def load_counts_file(path: str | Path) -> dict[str, float]:
    """Class counts ``{name: count}`` from a COCO instances file or a class-count file."""
    file = Path(path)
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise DataError(
            f"counts file {str(file)!r} does not exist; pass a COCO instances or class-count JSON"
        ) from None
    except ValueError as exc:
        raise DataError(f"counts file {str(file)!r} is not valid JSON ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("annotations"), list) and "categories" in data:
        ids = {int(c["id"]): str(c["name"]) for c in data["categories"]}
        counts = dict.fromkeys(ids.values(), 0.0)
        for ann in data["annotations"]:
            name = ids.get(int(ann.get("category_id", -1)))
            if name is not None:
                counts[name] += 1.0
        return counts
    from tracker.weights import load_counts

    loaded = load_counts(file)
    return {n: float(c) for n, c in zip(loaded.names, loaded.counts)}


def with_counts(ranked: pl.DataFrame, counts: np.ndarray | None, weights: np.ndarray | None) -> pl.DataFrame:
    """Add ``count``, ``weight`` and ``group`` (rare/common/frequent by count thirds) by class index."""
    idx = ranked["class_index"].to_numpy()
    out = ranked
    if weights is not None:
        out = out.with_columns(pl.Series("weight", [float(weights[i]) if i < len(weights) else None for i in idx]))
    if counts is None:
        return out
    count = [float(counts[i]) if i < len(counts) and np.isfinite(counts[i]) else None for i in idx]
    out = out.with_columns(pl.Series("count", count, dtype=pl.Float64))
    known = out.filter(pl.col("count").is_not_null())
    if known.is_empty():
        return out.with_columns(pl.lit(None, pl.Utf8).alias("group"))
    cuts = np.quantile(known["count"].to_numpy(), [1 / 3, 2 / 3])
    return out.with_columns(
        pl.when(pl.col("count").is_null()).then(None)
        .when(pl.col("count") <= cuts[0]).then(pl.lit(GROUPS[0]))
        .when(pl.col("count") <= cuts[1]).then(pl.lit(GROUPS[1]))
        .otherwise(pl.lit(GROUPS[2])).alias("group")
    )


def group_means(
    cells: pl.DataFrame, groups: Mapping[str, Sequence[int]] | Sequence[tuple[str, Sequence[int]]]
) -> pl.DataFrame:
    """Mean per group of classes (e.g. rare vs frequent) over the :func:`heatmap` buckets.

    ``groups`` maps a group name to class indices. Each class counts once per bucket.
    Columns: group, bucket, step, value.
    """
    groups = dict(groups)
    member = pl.DataFrame(
        {"class_index": [i for idx in groups.values() for i in idx],
         "group": [g for g, idx in groups.items() for _ in idx]},
        schema={"class_index": pl.Int32, "group": pl.Utf8},
    )
    return (
        cells.join(member, on="class_index", how="inner")
        .group_by(["group", "bucket"])
        .agg(pl.col("step").min(), pl.col("value").mean())
        .sort(["group", "bucket"])
    )
