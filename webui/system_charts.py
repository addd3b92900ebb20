"""Altair charts of the System page: one layered chart per group of ``sys/*`` keys.

Each chart draws one line per (run, rank, key), the device limits as dashed
horizontal rules (memory), and the system detectors' events as vertical rules
at their step, coloured by severity, their message in the tooltip.
"""

from __future__ import annotations

import altair as alt
import polars as pl

from webui.system_queries import UNITS, group_of

EVENT_GROUP = {"memory_growth": "memory", "fragmentation": "memory", "step_time_regression": "time",
               "data_stall": "time"}
SEVERITY_COLORS = alt.Scale(domain=["info", "warning", "error"], range=["#4c78a8", "#f58518", "#e45756"])


def series_label(run: str, rank: int, key: str, ranks: int) -> str:
    """The legend entry of one series: run, rank (when the runs have several) and the key."""
    short = key.removeprefix("sys/")
    return f"{run} · rank {rank} · {short}" if ranks > 1 else f"{run} · {short}"


def chart_frames(points: pl.DataFrame, limits: pl.DataFrame, events: pl.DataFrame, labels: dict[str, str],
                 group: str, ranks: int | None = None) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The line, limit and event rows of ``group``'s chart; ``ranks`` (default: those in
    ``points``) above 1 names the rank in the legend."""
    if ranks is None:
        ranks = int(points["rank"].n_unique()) if not points.is_empty() else 1
    lines = points.filter(pl.col("group") == group).with_columns(
        pl.struct("run_id", "rank", "key").map_elements(
            lambda r: series_label(labels.get(r["run_id"], r["run_id"]), r["rank"], r["key"], ranks),
            return_dtype=pl.Utf8).alias("series"))
    rules = limits.head(0)
    if group == "memory" and not limits.is_empty():
        rules = limits.with_columns(
            pl.struct("run_id", "rank", "key").map_elements(
                lambda r: f"limit: {series_label(labels.get(r['run_id'], r['run_id']), r['rank'], r['key'], ranks)}",
                return_dtype=pl.Utf8).alias("series"))
    marks = events.filter(
        pl.col("kind").replace_strict(EVENT_GROUP, default=None).fill_null(
            pl.col("key").fill_null("").map_elements(group_of, return_dtype=pl.Utf8)) == group
    ).with_columns(pl.col("run_id").replace_strict(labels, default=pl.col("run_id")).alias("run"))
    return lines, rules, marks


def system_chart(points: pl.DataFrame, limits: pl.DataFrame, events: pl.DataFrame, labels: dict[str, str],
                 group: str, height: int = 300, ranks: int | None = None) -> alt.LayerChart:
    """The chart of ``group`` (memory, time, utilisation, other)."""
    lines, rules, marks = chart_frames(points, limits, events, labels, group, ranks)
    unit = UNITS.get(group, "value")
    x = alt.X("step:Q", title="step")
    layers: list[alt.Chart] = [
        alt.Chart(lines.select("series", "step", "y", "key", "run_id", "rank")).mark_line(interpolate="step-after")
        .encode(x=x, y=alt.Y("y:Q", title=unit), color=alt.Color("series:N", title=None,
                                                                 legend=alt.Legend(orient="bottom", columns=2)),
                tooltip=["series:N", "step:Q", alt.Tooltip("y:Q", format=".4g", title=unit)])
    ]
    if not rules.is_empty():
        layers.append(
            alt.Chart(rules.select("series", "limit_gib")).mark_rule(strokeDash=[6, 4], color="#e45756")
            .encode(y="limit_gib:Q", tooltip=["series:N", alt.Tooltip("limit_gib:Q", format=".2f", title="GiB")])
        )
    if not marks.is_empty():
        layers.append(
            alt.Chart(marks.select("run", "rank", "step", "kind", "severity", "message")).mark_rule(strokeWidth=2)
            .encode(x="step:Q", color=alt.Color("severity:N", scale=SEVERITY_COLORS, legend=None),
                    tooltip=["run:N", "rank:Q", "step:Q", "kind:N", "severity:N", "message:N"])
        )
    return alt.layer(*layers).resolve_scale(color="independent").properties(height=height).interactive()
