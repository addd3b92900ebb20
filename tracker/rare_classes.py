"""Why a rare class does not learn: the per-class signals of a run, read back (SQL over the store).

Read from what :mod:`tracker.assign` and the Ultralytics integration log:

* :func:`grad_ratio`: EQL v2's indicator, the *cumulative* positive over negative
  gradient ratio of each class, ``sum(grad/pos) / sum(grad/neg)`` over the logged
  steps up to each step (a window sum in SQL; nothing of it is stored);
* :func:`no_pos_share`: per class, the share of its ground-truth boxes that got no
  positive anchor over the whole run (``sum(assign/gt_no_pos) / sum(assign/gt)``);
* :func:`ap_frequency`: ``val/AP50-95`` (and ``val/AP50``) per class and epoch step
  with the class's training count and ``log10`` of it;
* :func:`frequency_groups`: rare, common and frequent thirds of the classes that
  occur, by training count (the per-class page's rule);
* :func:`stagnant`: the classes the analysis calls stagnant on ``train/cls_loss``.

``src`` is anything with ``.query(sql, params)`` returning polars (a store) or a DuckDB
connection. Every query reads the ``class_curves`` view (visible rows only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import polars as pl

GROUPS = ("rare", "common", "frequent")


def fetch(src: Any, sql: str, params: Sequence[Any]) -> pl.DataFrame:
    """Run ``sql`` on a store (``.query``) or a DuckDB connection (``.execute``)."""
    if hasattr(src, "query") and not hasattr(src, "execute"):
        return src.query(sql, list(params))
    return src.execute(sql, list(params)).pl()


def grad_ratio(src: Any, run_id: str) -> pl.DataFrame:
    """Per class and logged step: ``pos``, ``neg`` (that step's summed |dL/dlogit|), their running
    sums ``cum_pos``, ``cum_neg`` and ``ratio = cum_pos / cum_neg`` (NaN while ``cum_neg`` is 0).

    Columns: class_index, class_name, step, pos, neg, cum_pos, cum_neg, ratio.
    """
    return fetch(src, """
        WITH g AS (
            SELECT class_index, any_value(class_name) AS class_name, step,
                   sum(value) FILTER (WHERE key = 'grad/pos') AS pos,
                   sum(value) FILTER (WHERE key = 'grad/neg') AS neg
            FROM class_curves WHERE run_id = ? AND key IN ('grad/pos', 'grad/neg')
            GROUP BY class_index, step),
        c AS (
            SELECT *, sum(pos) OVER w AS cum_pos, sum(neg) OVER w AS cum_neg FROM g
            WINDOW w AS (PARTITION BY class_index ORDER BY step ROWS UNBOUNDED PRECEDING))
        SELECT class_index, class_name, step, pos, neg, cum_pos, cum_neg,
               CASE WHEN cum_neg > 0 THEN cum_pos / cum_neg ELSE 'NaN'::DOUBLE END AS ratio
        FROM c ORDER BY class_index, step""", [run_id])


def no_pos_share(src: Any, run_id: str) -> pl.DataFrame:
    """Per class over the run: ``gt`` boxes, ``gt_no_pos`` boxes without a positive, ``share``, and the
    first and last logged steps. Columns: class_index, class_name, gt, gt_no_pos, share, first_step, last_step."""
    return fetch(src, """
        SELECT class_index, any_value(class_name) AS class_name,
               sum(value) FILTER (WHERE key = 'assign/gt') AS gt,
               sum(value) FILTER (WHERE key = 'assign/gt_no_pos') AS gt_no_pos,
               CASE WHEN sum(value) FILTER (WHERE key = 'assign/gt') > 0
                    THEN sum(value) FILTER (WHERE key = 'assign/gt_no_pos')
                         / sum(value) FILTER (WHERE key = 'assign/gt') ELSE 'NaN'::DOUBLE END AS share,
               min(step) AS first_step, max(step) AS last_step
        FROM class_curves WHERE run_id = ? AND key IN ('assign/gt', 'assign/gt_no_pos')
        GROUP BY class_index ORDER BY class_index""", [run_id])


def no_pos_over_steps(src: Any, run_id: str) -> pl.DataFrame:
    """Per class and logged step: ``gt``, ``gt_no_pos``. Columns: class_index, step, gt, gt_no_pos."""
    return fetch(src, """
        SELECT class_index, step, sum(value) FILTER (WHERE key = 'assign/gt') AS gt,
               sum(value) FILTER (WHERE key = 'assign/gt_no_pos') AS gt_no_pos
        FROM class_curves WHERE run_id = ? AND key IN ('assign/gt', 'assign/gt_no_pos')
        GROUP BY class_index, step ORDER BY class_index, step""", [run_id])


def run_config(src: Any, run_id: str) -> dict[str, Any]:
    """The run's config (``{}`` when it has none)."""
    df = fetch(src, "SELECT config FROM runs WHERE run_id = ?", [run_id])
    raw = df["config"][0] if df.height else None
    return json.loads(raw) if isinstance(raw, str) else dict(raw or {})


def class_names(src: Any, run_id: str) -> list[str]:
    """The run's class names in index order."""
    df = fetch(src, "SELECT class_index, name FROM classes WHERE run_id = ? ORDER BY class_index", [run_id])
    return [str(n) for n in df["name"].to_list()]


def counts_of(config: dict[str, Any], names: Sequence[str]) -> np.ndarray | None:
    """Training instances per class from the config's ``class_counts`` (a list, or ``{name: count}``)."""
    raw = config.get("class_counts")
    if isinstance(raw, dict):
        return np.array([float(raw.get(n, 0) or 0) for n in names]) if names else np.array(
            [float(v) for v in raw.values()])
    if isinstance(raw, list) and raw:
        return np.asarray(raw, dtype=np.float64)
    return None


def frequency_groups(counts: np.ndarray) -> dict[str, list[int]]:
    """Rare, common, frequent: the classes with a count > 0 split into thirds by count (rarest first)."""
    present = [int(i) for i in np.argsort(counts, kind="stable") if counts[i] > 0]
    n = len(present)
    cut = [0, n // 3, (2 * n) // 3, n] if n >= 3 else [0, n, n, n]
    return {g: present[cut[k]:cut[k + 1]] for k, g in enumerate(GROUPS)}


def ap_frequency(src: Any, run_id: str, counts: np.ndarray | None) -> pl.DataFrame:
    """Per class and validation step: ``ap`` (``val/AP50-95``), ``ap50``, ``count`` and ``log_count``
    (``log10`` of the training count; classes without a count are left out).
    Columns: class_index, class_name, step, epoch, ap, ap50, count, log_count."""
    df = fetch(src, """
        SELECT class_index, any_value(class_name) AS class_name, step,
               any_value(value) FILTER (WHERE key = 'val/AP50-95') AS ap,
               any_value(value) FILTER (WHERE key = 'val/AP50') AS ap50
        FROM class_curves WHERE run_id = ? AND key IN ('val/AP50-95', 'val/AP50')
        GROUP BY class_index, step ORDER BY step, class_index""", [run_id])
    if df.height == 0 or counts is None:
        return df.with_columns(pl.lit(None, pl.Float64).alias("count"), pl.lit(None, pl.Float64).alias("log_count"),
                               pl.lit(None, pl.Int64).alias("epoch"))
    steps = sorted(set(df["step"].to_list()))
    table = pl.DataFrame({"class_index": list(range(len(counts))), "count": counts.astype(np.float64)},
                         schema={"class_index": df.schema["class_index"], "count": pl.Float64})
    epochs = pl.DataFrame({"step": steps, "epoch": list(range(1, len(steps) + 1))},
                          schema={"step": df.schema["step"], "epoch": pl.Int64})
    return (df.join(table, on="class_index", how="inner").join(epochs, on="step", how="left")
            .filter(pl.col("count") > 0).with_columns(pl.col("count").log10().alias("log_count")))


def stagnant(run_id: str, home: Any = None) -> tuple[int | None, list[tuple[int, str, float, float]]]:
    """Step and ``(class_index, name, ref, now)`` of the classes the analysis calls stagnant on
    ``train/cls_loss`` (none when the key is absent or nothing is stagnant)."""
    from tracker.analysis.offline import analyze
    from tracker.errors import ConfigError

    try:
        result = analyze(run_id, key="train/cls_loss", home=home)
    except ConfigError:
        return None, []
    for report in result.stagnant:
        return report.step, [(c.index, c.name, float(c.ref), float(c.now)) for c in report.classes]
    return None, []


@dataclass
class RareClasses:
    """A run's rare-class signals, per class (index order)."""

    run_id: str
    names: list[str]
    counts: np.ndarray | None
    groups: dict[str, list[int]]
    ratio: np.ndarray  # final cumulative grad/pos over grad/neg (NaN: not logged)
    ratio_steps: tuple[int, int] | None
    gt: np.ndarray
    no_pos: np.ndarray
    assign_steps: tuple[int, int] | None
    ap: np.ndarray  # last validation's AP50-95 (NaN: none)
    ap_first: np.ndarray
    ap_steps: tuple[int, int] | None
    config: dict[str, Any] = field(default_factory=dict)
    cum_pos: np.ndarray | None = None  # final cumulative grad/pos


def _vector(df: pl.DataFrame, column: str, n: int) -> np.ndarray:
    out = np.full(n, np.nan)
    for i, v in zip(df["class_index"].to_list(), df[column].to_list()):
        if 0 <= int(i) < n and v is not None:
            out[int(i)] = float(v)
    return out


def collect(src: Any, run_id: str) -> RareClasses:
    """Everything :mod:`tracker.commands.advise` and the per-class page read, in one object."""
    names = class_names(src, run_id)
    config = run_config(src, run_id)
    counts = counts_of(config, names)
    n = len(names) or (len(counts) if counts is not None else 0)
    ratio_df = grad_ratio(src, run_id)
    last = (ratio_df.group_by("class_index").agg(pl.col("ratio").last(), pl.col("cum_pos").last())
            if ratio_df.height else ratio_df)
    share = no_pos_share(src, run_id)
    ap = ap_frequency(src, run_id, None)
    ap_steps = sorted(set(ap["step"].to_list())) if ap.height else []
    return RareClasses(
        run_id, names, counts, frequency_groups(counts) if counts is not None else {g: [] for g in GROUPS},
        _vector(last, "ratio", n) if ratio_df.height else np.full(n, np.nan),
        (int(ratio_df["step"].min()), int(ratio_df["step"].max())) if ratio_df.height else None,
        _vector(share, "gt", n) if share.height else np.zeros(n),
        _vector(share, "gt_no_pos", n) if share.height else np.zeros(n),
        (int(share["first_step"].min()), int(share["last_step"].max())) if share.height else None,
        _vector(ap.filter(pl.col("step") == ap_steps[-1]), "ap", n) if ap_steps else np.full(n, np.nan),
        _vector(ap.filter(pl.col("step") == ap_steps[0]), "ap", n) if ap_steps else np.full(n, np.nan),
        (ap_steps[0], ap_steps[-1]) if ap_steps else None,
        config,
        _vector(last, "cum_pos", n) if ratio_df.height else None,
    )
