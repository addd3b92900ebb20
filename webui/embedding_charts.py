"""Altair charts of the Embeddings page: one chart per collapse statistic, the runs overlaid.

Each chart draws one line per (run, rank); the std chart a dashed rule at 1 (the
healthy ``1/sqrt(D)``, scaled) and at the collapse detector's threshold; the
collapse events as vertical rules at their step on the chart of the statistic that
fell, their message in the tooltip.
"""

from __future__ import annotations

import altair as alt
import polars as pl

from webui.embedding_queries import SUBTITLES, TITLES

STD_THRESHOLD = 0.3  # the collapse detector's default std_ratio
PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#eeca3b", "#9d755d", "#72b7b2", "#bab0ac"]  # no red


def chart_frames(points: pl.DataFrame, events: pl.DataFrame, labels: dict[str, str],
                 stat: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The line rows and event rows of ``stat``'s chart."""
    ranks = int(points["rank"].n_unique()) if not points.is_empty() else 1
    lines = points.filter(pl.col("stat") == stat).with_columns(
        pl.struct("run_id", "rank").map_elements(
            lambda r: labels.get(r["run_id"], r["run_id"]) + (f" · rank {r['rank']}" if ranks > 1 else ""),
            return_dtype=pl.Utf8).alias("run"))
    marks = events.filter(pl.col("stat") == stat).with_columns(
        pl.col("run_id").replace_strict(labels, default=pl.col("run_id")).alias("run"))
    return lines, marks


AXIS = {"std": "x 1/sqrt(D)", "rankme": "RankMe", "dead_dims": "share"}
DOMAIN = {"std": [0.0, 1.2], "dead_dims": [0.0, 1.0]}


def statistic_chart(points: pl.DataFrame, events: pl.DataFrame, labels: dict[str, str], stat: str,
                    height: int = 360) -> alt.LayerChart:
    """The chart of one statistic (``std``, ``rankme`` or ``dead_dims``); runs keep their colour
    across the three charts."""
    lines, marks = chart_frames(points, events, labels, stat)
    x = alt.X("step:Q", title="step")
    y_scale = alt.Scale(domain=DOMAIN[stat]) if stat in DOMAIN else alt.Scale(zero=True)
    runs = sorted(set(chart_frames(points, events, labels, "std")[0]["run"].to_list()) | set(lines["run"]))
    layers: list[alt.Chart] = [
        alt.Chart(lines.select("run", "step", "y", "value")).mark_line()
        .encode(x=x, y=alt.Y("y:Q", title=AXIS[stat], scale=y_scale),
                color=alt.Color("run:N", title=None, scale=alt.Scale(domain=runs, range=PALETTE),
                                legend=alt.Legend(orient="top", direction="horizontal")),
                tooltip=["run:N", "step:Q", alt.Tooltip("value:Q", format=".4g", title=stat)])
    ]
    if stat == "std":
        refs = pl.DataFrame({"y": [1.0, STD_THRESHOLD], "what": ["healthy: 1/sqrt(D)", "collapse threshold"]})
        layers.append(alt.Chart(refs).mark_rule(strokeDash=[6, 4], color="#888888")
                      .encode(y="y:Q", tooltip=["what:N", alt.Tooltip("y:Q", format=".2f")]))
    if not marks.is_empty():
        layers.append(alt.Chart(marks.select("run", "step", "stat", "message")).mark_rule(strokeWidth=2,
                                                                                        color="#e45756")
                      .encode(x="step:Q", tooltip=["run:N", "step:Q", "stat:N", "message:N"]))
    title = alt.TitleParams(TITLES[stat], subtitle=SUBTITLES[stat], anchor="start")
    return alt.layer(*layers).properties(height=height, title=title).interactive()
