"""Altair chart builders for the web UI. Inputs are the small frames of ``webui.queries``.

Curves are drawn as layers over one shared dataset (embedded once): the min/max band
of each bucket, the bucket means (faint when smoothing is on), the smoothed line,
the resume marks (a dashed rule at each segment start, with its reason in the
tooltip and a label), the rows a resume superseded (faded, on request) and an
optional focus rule (the step an event links to). With a log y axis, values <= 0
are left out of the drawing (a log scale has no place for them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import altair as alt
import polars as pl

X_AXES = {"step": "step", "wall time": "time", "relative time (s)": "elapsed_s"}
ZOOM = "zoom"


@dataclass
class CurveStyle:
    """How to draw a curve chart."""

    x: str = "step"
    log_y: bool = False
    smoothing: float = 0.0
    height: int = 420
    zoomable: bool = True


def _tips(*fields: str) -> list[alt.Tooltip]:
    """Tooltip channels; numbers shown with 5 significant digits (shares as percents).

    Channels are built as objects: Altair parses shorthand strings in a list by
    validating each against the schema, which costs ~15 ms a field.
    """
    out = []
    for f in fields:
        name, _, kind = f.partition(":")
        if kind == "Q" and name not in ("step", "step_end", "segment", "n", "count"):
            out.append(alt.Tooltip(f, format=".1%" if name == "share" else ".5g"))
        else:
            out.append(alt.Tooltip(f))
    return out


def _x_encoding(x: str) -> alt.X:
    field = X_AXES[x]
    if field == "time":
        return alt.X("time:T", title="wall time")
    return alt.X(f"{field}:Q", title=x, scale=alt.Scale(zero=False, nice=False))


def curve_frame(points: pl.DataFrame, labels: dict[str, str], *, log_y: bool) -> pl.DataFrame:
    """The curve rows ready to draw: ``run`` label, time axes, non-positive values dropped for log."""
    if points.is_empty():
        return points.with_columns(pl.lit("").alias("run"), pl.lit(None, pl.Datetime).alias("time"),
                                   pl.lit(None, pl.Float64).alias("elapsed_s"))
    multi_rank = points.select(pl.col("rank").n_unique()).item() > 1
    run = pl.col("run_id").replace_strict(labels, default=pl.col("run_id"))
    if multi_rank:
        run = pl.concat_str([run, pl.lit(" r"), pl.col("rank").cast(pl.Utf8)])
    frame = points.with_columns(
        run.alias("run"),
        pl.from_epoch((pl.col("wall_time") * 1e6).cast(pl.Int64), time_unit="us").alias("time"),
        (pl.col("wall_time") - pl.col("wall_time").min().over("run_id")).alias("elapsed_s"),
    )
    if log_y:
        cols = [c for c in ("lo", "hi", "mean", "smooth") if c in frame.columns]
        frame = frame.with_columns(pl.when(pl.col(c) > 0).then(pl.col(c)).otherwise(None).alias(c) for c in cols)
    return frame


def _marks_layer(marks: pl.DataFrame, labels: dict[str, str], x: str) -> alt.LayerChart:
    field = X_AXES[x]
    frame = marks.with_columns(
        pl.col("run_id").replace_strict(labels, default=pl.col("run_id")).alias("run"),
        pl.col("started_at").alias("time"),
    )
    enc_x = alt.X("time:T") if field == "time" else alt.X("step:Q")
    tooltip = _tips("run:N", "segment:Q", "step:Q", "reason:N", "started_at:T")
    rule = alt.Chart(frame).mark_rule(strokeDash=[4, 3], color="#888", strokeWidth=1.2).encode(
        x=enc_x, tooltip=tooltip
    )
    text = alt.Chart(frame).mark_text(align="left", dx=3, dy=-4, fontSize=10, color="#666", baseline="top").encode(
        x=enc_x, y=alt.value(2), text=alt.Text("reason:N"), tooltip=tooltip
    )
    return alt.layer(rule, text)


def curve_chart(
    frame: pl.DataFrame,
    style: CurveStyle,
    *,
    key: str,
    labels: dict[str, str] | None = None,
    marks: pl.DataFrame | None = None,
    hidden: pl.DataFrame | None = None,
    focus_step: int | None = None,
) -> alt.LayerChart:
    """Layered curve chart of one key for many runs (see module doc).

    ``frame`` and ``hidden`` come from :func:`curve_frame`; ``marks`` from
    ``queries.resume_marks``; ``labels`` maps run ids to legend labels.
    """
    x = _x_encoding(style.x)
    yscale = alt.Scale(type="log") if style.log_y else alt.Scale(zero=False)
    color = alt.Color("run:N", title="run", scale=alt.Scale(scheme="tableau10"),
                      legend=alt.Legend(orient="bottom", labelLimit=320, symbolOpacity=1))
    tooltip = _tips("run:N", "step:Q", "step_end:Q", "mean:Q", "lo:Q", "hi:Q", "n:Q")
    band = alt.Chart(frame).transform_filter("!datum.last").mark_area(opacity=0.18, interpolate="step-after").encode(
        x=x, y=alt.Y("lo:Q", scale=yscale, title=key), y2=alt.Y2("hi:Q"), color=color
    )
    raw_opacity = 0.35 if style.smoothing > 0 else 1.0
    line = alt.Chart(frame).mark_line(opacity=raw_opacity, strokeWidth=1.2).encode(
        x=x, y=alt.Y("mean:Q", scale=yscale, title=key), color=color, tooltip=tooltip,
        order=alt.Order("step:Q"),
    )
    if style.zoomable and style.x == "step":
        line = line.add_params(alt.selection_interval(name=ZOOM, encodings=["x"]))
    layers: list[alt.Chart | alt.LayerChart] = [band, line]
    if style.smoothing > 0 and "smooth" in frame.columns:
        layers.append(alt.Chart(frame).mark_line(strokeWidth=2).encode(
            x=x, y=alt.Y("smooth:Q", scale=yscale), color=color, order=alt.Order("step:Q"),
            tooltip=_tips("run:N", "step:Q", "smooth:Q"),
        ))
    if hidden is not None and not hidden.is_empty():
        layers.append(alt.Chart(hidden).mark_line(opacity=0.25, strokeDash=[2, 2]).encode(
            x=x, y=alt.Y("mean:Q", scale=yscale), color=color, detail=alt.Detail("segment:N"),
            order=alt.Order("step:Q"), tooltip=_tips("run:N", "segment:Q", "step:Q", "mean:Q"),
        ))
    if marks is not None and not marks.is_empty() and style.x != "relative time (s)":
        layers.append(_marks_layer(marks, labels or {}, style.x))
    if focus_step is not None and style.x == "step":
        focus = pl.DataFrame({"step": [focus_step]})
        layers.append(alt.Chart(focus).mark_rule(color="#d62728", strokeWidth=2).encode(x=alt.X("step:Q")))
    return alt.layer(*layers, height=style.height)


def heatmap_chart(cells: pl.DataFrame, *, key: str, log_color: bool = False, height: int = 640) -> alt.Chart:
    """Classes x step buckets, coloured by the bucket mean."""
    scale = alt.Scale(type="symlog" if log_color else "linear", scheme="viridis")
    cells = cells.sort(["class_index", "step"]).with_columns(
        pl.col("step").shift(-1).over("class_index").fill_null(pl.col("step_end") + 1).alias("step_next")
    )
    order = cells.group_by("class_name").agg(pl.col("class_index").min()).sort("class_index")["class_name"].to_list()
    return alt.Chart(cells).mark_rect().encode(
        x=alt.X("step:Q", title="step", scale=alt.Scale(zero=False, nice=False)),
        x2=alt.X2("step_next:Q"),
        y=alt.Y("class_name:N", sort=order, title="class", axis=alt.Axis(labelFontSize=9)),
        color=alt.Color("value:Q", scale=scale, title=key),
        tooltip=_tips("class_name:N", "step:Q", "step_end:Q", "value:Q", "n:Q"),
    ).properties(height=height)


def ranking_chart(ranked: pl.DataFrame, *, key: str, height: int = 640) -> alt.HConcatChart | alt.Chart:
    """Ranked bars of each class's recent mean, with the class weights beside them when known."""
    order = ranked["class_name"].to_list()
    has_weight = "weight" in ranked.columns
    tooltip = _tips("class_name:N", "mean:Q", "share:Q", *(["weight:Q"] if has_weight else []))
    bars = alt.Chart(ranked).mark_bar().encode(
        x=alt.X("mean:Q", title=f"mean {key}"),
        y=alt.Y("class_name:N", sort=order, title="class", axis=alt.Axis(labelFontSize=9)),
        color=alt.Color("group:N", title="classes") if "group" in ranked.columns else alt.value("#4c78a8"),
        tooltip=tooltip,
    ).properties(height=height)
    if not has_weight:
        return bars
    weights = alt.Chart(ranked).mark_bar(color="#f58518").encode(
        x=alt.X("weight:Q", title="class weight"),
        y=alt.Y("class_name:N", sort=order, axis=None),
        tooltip=tooltip,
    ).properties(height=height, width=160)
    return alt.hconcat(bars, weights)


def share_chart(share: pl.DataFrame, *, key: str, height: int = 380) -> alt.Chart:
    """Stacked share of the total that each class (top ones, then 'other') contributes over time."""
    return alt.Chart(share).mark_area().encode(
        x=alt.X("step:Q", title="step", scale=alt.Scale(zero=False, nice=False)),
        y=alt.Y("share:Q", stack="normalize", title=f"share of {key}", axis=alt.Axis(format="%")),
        color=alt.Color("class_name:N", title="class"),
        tooltip=_tips("class_name:N", "step:Q", "share:Q"),
    ).properties(height=height)


def rare_frequent_chart(ranked: pl.DataFrame, groups: pl.DataFrame, *, key: str) -> alt.HConcatChart:
    """Recent mean against class count (log x), and each group's mean over time."""
    scatter = alt.Chart(ranked.filter(pl.col("count") > 0)).mark_circle(size=60).encode(
        x=alt.X("count:Q", scale=alt.Scale(type="log"), title="class instances"),
        y=alt.Y("mean:Q", title=f"recent mean {key}"),
        color=alt.Color("group:N", title="classes", sort=["rare", "common", "frequent"]),
        tooltip=_tips("class_name:N", "count:Q", "mean:Q", "group:N"),
    ).properties(height=320, width=360)
    lines = alt.Chart(groups).mark_line().encode(
        x=alt.X("step:Q", title="step"),
        y=alt.Y("value:Q", title=f"mean {key}"),
        color=alt.Color("group:N", title="classes", sort=["rare", "common", "frequent"]),
        tooltip=_tips("group:N", "step:Q", "value:Q"),
    ).properties(height=320, width=420)
    return alt.hconcat(scatter, lines)


def quick_chart(frame: pl.DataFrame, x: str, ys: Sequence[str], kind: str) -> alt.Chart:
    """A quick chart of a query result: ``kind`` in line, bar, point."""
    long = frame.select([x, *ys]).unpivot(index=x, on=list(ys), variable_name="column", value_name="value")
    mark = {"line": "mark_line", "bar": "mark_bar", "point": "mark_point"}[kind]
    return getattr(alt.Chart(long), mark)().encode(
        x=alt.X(x), y=alt.Y("value:Q"), color=alt.Color("column:N"),
        tooltip=[alt.Tooltip(x), *_tips("column:N", "value:Q")],
    )
