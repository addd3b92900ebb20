"""Altair chart builders for the curves, the events' curve and the SQL page's quick chart.

Curves are drawn as layers over one shared dataset (embedded once): the min/max band
of each bucket, the bucket means (faint when smoothing is on), the smoothed line,
the resume marks (a dashed rule at each segment start, with its reason in the
tooltip and a label), the rows a resume superseded (faded, on request), the flags
(a rule at each event's step and a triangle over each bucket holding NaN/inf values,
coloured by severity, the message in the tooltip) and an optional focus rule (the
step an event links to). With a log y axis, values <= 0 are left out of the drawing
(a log scale has no place for them).

Every x axis (step, wall time, relative time) carries the same marks: a mark at a
step is placed at the time of the first drawn point at or after that step, in its
run. On the time axes a run's line is broken at each resume (``piece``), so no line
is drawn across the time the run was stopped; wall time is held as epoch
milliseconds (the browser shows it in its local time) and relative time as seconds,
labelled m:ss or h:mm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import altair as alt
import polars as pl

X_AXES = {"step": "step", "wall time": "time", "relative time (s)": "elapsed_s"}
ZOOM = "zoom"
SEVERITIES = ("info", "warning", "error")
SEVERITY_COLOURS = ("#6b6ecf", "#e8a200", "#d62728")


@dataclass
class CurveStyle:
    """How to draw a curve chart."""

    x: str = "step"
    log_y: bool = False
    smoothing: float = 0.0
    height: int = 420
    zoomable: bool = True


def tooltips(*fields: str) -> list[alt.Tooltip]:
    """Tooltip channels; numbers shown with 5 significant digits (shares as percents).

    Channels are built as objects: Altair parses shorthand strings in a list by
    validating each against the schema, which costs ~15 ms a field.
    """
    out = []
    for f in fields:
        name, _, kind = f.partition(":")
        if kind == "Q" and name not in ("step", "step_end", "segment", "n", "count", "nonfinite"):
            out.append(alt.Tooltip(f, format=".1%" if name in ("share", "other") else ".5g"))
        elif kind == "T":
            out.append(alt.Tooltip(f, format="%Y-%m-%d %H:%M:%S", title="wall time"))
        else:
            out.append(alt.Tooltip(f))
    return out


def _span(frame: pl.DataFrame, column: str) -> float:
    """The extent of ``column`` in ``frame`` (0 when empty)."""
    if frame.is_empty() or column not in frame.columns:
        return 0.0
    lo, hi = frame.select(pl.col(column).min().alias("lo"), pl.col(column).max().alias("hi")).row(0)
    return float(hi - lo) if lo is not None and hi is not None else 0.0


def time_format(span_s: float) -> str:
    """A d3 time format for wall-time ticks over ``span_s`` seconds: seconds shown under an hour."""
    if span_s < 3600:
        return "%H:%M:%S"
    if span_s < 86400:
        return "%H:%M"
    return "%b %d %H:%M"


def elapsed_label(span_s: float) -> tuple[str, str]:
    """(Vega label expression, unit) for relative-time ticks: m:ss under an hour, else h:mm."""
    if span_s < 3600:
        return "floor(datum.value / 60) + ':' + pad(floor(datum.value % 60), 2, '0', 'left')", "m:ss"
    return "floor(datum.value / 3600) + ':' + pad(floor(datum.value % 3600 / 60), 2, '0', 'left')", "h:mm"


def _x_encoding(x: str, frame: pl.DataFrame) -> alt.X:
    field = X_AXES[x]
    if field == "time":
        axis = alt.Axis(format=time_format(_span(frame, "time") / 1000), labelAngle=0, labelOverlap=True)
        return alt.X("time:T", title="wall time", axis=axis, scale=alt.Scale(nice=False))
    if field == "elapsed_s":
        expr, unit = elapsed_label(_span(frame, "elapsed_s"))
        axis = alt.Axis(labelExpr=expr, labelOverlap=True, tickMinStep=1)
        return alt.X("elapsed_s:Q", title=f"time since the run started ({unit})", axis=axis,
                     scale=alt.Scale(zero=False, nice=False))
    return alt.X(f"{field}:Q", title=x, scale=alt.Scale(zero=False, nice=False))


def drawn_mark() -> pl.Expr:
    """The segment starts drawn as marks: every resume, and a fork's first segment (its
    rows before it are the parent's)."""
    return (pl.col("segment") > 0) | pl.col("reason").str.starts_with("fork of")


def _pieces(points: pl.DataFrame, marks: pl.DataFrame | None) -> pl.Series:
    """For each point, how many resumes of its run start at or before its step (0 before any)."""
    if marks is None or marks.is_empty():
        return pl.Series("piece", [0] * points.height, dtype=pl.Int32)
    starts = marks.filter(drawn_mark()).select("run_id", pl.col("step").alias("_start"))
    if starts.is_empty():
        return pl.Series("piece", [0] * points.height, dtype=pl.Int32)
    counted = (
        points.select("run_id", "step").with_row_index("_i")
        .join(starts, on="run_id", how="left")
        .group_by("_i").agg((pl.col("_start") <= pl.col("step")).sum().alias("piece"))
        .sort("_i")
    )
    return counted["piece"].cast(pl.Int32)


def _origin(origins: dict[str, float] | None) -> pl.Expr:
    first = pl.col("wall_time").min().over("run_id")
    if not origins:
        return first
    return pl.col("run_id").replace_strict(origins, default=None, return_dtype=pl.Float64).fill_null(first)


def curve_frame(points: pl.DataFrame, labels: dict[str, str], *, log_y: bool,
                marks: pl.DataFrame | None = None, origins: dict[str, float] | None = None) -> pl.DataFrame:
    """The curve rows ready to draw: ``run`` label, time axes, ``piece``, non-positive values dropped for log.

    ``time`` is the wall time in epoch milliseconds, ``elapsed_s`` the seconds since the
    run's first point (``origins``, by run id; by default its first drawn point),
    ``piece`` the number of resumes (``marks``) before the point.
    """
    if points.is_empty():
        return points.with_columns(pl.lit("").alias("run"), pl.lit(None, pl.Float64).alias("time"),
                                   pl.lit(None, pl.Float64).alias("elapsed_s"), pl.lit(0, pl.Int32).alias("piece"))
    multi_rank = points.select(pl.col("rank").n_unique()).item() > 1
    run = pl.col("run_id").replace_strict(labels, default=pl.col("run_id"))
    if multi_rank:
        run = pl.concat_str([run, pl.lit(" r"), pl.col("rank").cast(pl.Utf8)])
    frame = points.with_columns(
        run.alias("run"),
        (pl.col("wall_time") * 1000.0).alias("time"),
        (pl.col("wall_time") - _origin(origins)).alias("elapsed_s"),
        _pieces(points, marks),
    )
    if log_y:
        cols = [c for c in ("lo", "hi", "mean", "smooth") if c in frame.columns]
        frame = frame.with_columns(pl.when(pl.col(c) > 0).then(pl.col(c)).otherwise(None).alias(c) for c in cols)
    return frame


def place(rows: pl.DataFrame, frame: pl.DataFrame) -> pl.DataFrame:
    """``rows`` (run_id, step, ...) with ``time`` and ``elapsed_s`` of the first drawn point at or
    after each step in the same run (the last point before it when none follows)."""
    if rows.is_empty() or frame.is_empty():
        return rows.with_columns(pl.lit(None, pl.Float64).alias("time"), pl.lit(None, pl.Float64).alias("elapsed_s"))
    points = (frame.filter(pl.col("time").is_not_null()).select("run_id", "step", "time", "elapsed_s")
              .unique(["run_id", "step"]).sort("step"))
    keyed = rows.drop([c for c in ("time", "elapsed_s") if c in rows.columns]).with_row_index("_i")
    keyed = keyed.with_columns(pl.col("step").cast(pl.Int64)).sort("step")
    points = points.with_columns(pl.col("step").cast(pl.Int64))
    after = keyed.join_asof(points, on="step", by="run_id", strategy="forward", check_sortedness=False)
    before = keyed.join_asof(points.rename({"time": "_t", "elapsed_s": "_e"}), on="step", by="run_id",
                             strategy="backward", check_sortedness=False)
    placed = after.with_columns(
        pl.coalesce(pl.col("time"), before["_t"]).alias("time"),
        pl.coalesce(pl.col("elapsed_s"), before["_e"]).alias("elapsed_s"),
    )
    return placed.sort("_i").drop("_i")


def _rule_x(x: str) -> alt.X:
    field = X_AXES[x]
    return alt.X("time:T") if field == "time" else alt.X(f"{field}:Q")


def _marks_layer(marks: pl.DataFrame, frame: pl.DataFrame, labels: dict[str, str], x: str) -> alt.LayerChart | None:
    placed = place(marks.filter(drawn_mark()), frame).with_columns(
        pl.col("run_id").replace_strict(labels, default=pl.col("run_id")).alias("run"),
    )
    if X_AXES[x] != "step":
        placed = placed.filter(pl.col(X_AXES[x]).is_not_null())
    if placed.is_empty():
        return None
    tooltip = tooltips("run:N", "segment:Q", "step:Q", "reason:N", "started_at:T")
    rule = alt.Chart(placed).mark_rule(strokeDash=[4, 3], color="#888", strokeWidth=1.2).encode(
        x=_rule_x(x), tooltip=tooltip
    )
    text = alt.Chart(placed).mark_text(align="left", dx=3, dy=-4, fontSize=10, color="#666", baseline="top").encode(
        x=_rule_x(x), y=alt.value(2), text=alt.Text("reason:N"), tooltip=tooltip
    )
    return alt.layer(rule, text)


def flags(frame: pl.DataFrame, events: pl.DataFrame | None) -> pl.DataFrame:
    """What to flag on a curve: the events (``queries.curve_events``) and the buckets holding NaN/inf.

    Columns: run_id, step, kind, severity, message, mark (``rule`` for an event,
    ``point`` for non-finite values); wall and relative times are added by :func:`place`.
    """
    schema = {"run_id": pl.Utf8, "step": pl.Int64, "kind": pl.Utf8, "severity": pl.Utf8, "message": pl.Utf8,
              "mark": pl.Utf8}
    parts = [pl.DataFrame(schema=schema)]
    if events is not None and not events.is_empty():
        parts.append(events.select(
            "run_id", pl.col("step").cast(pl.Int64), "kind",
            pl.when(pl.col("severity").is_in(SEVERITIES)).then(pl.col("severity")).otherwise(pl.lit("info")),
            pl.col("message").fill_null(""), pl.lit("rule").alias("mark"),
        ))
    if not frame.is_empty() and "nonfinite" in frame.columns:
        bad = frame.filter((pl.col("nonfinite") > 0) & ~pl.col("last"))
        parts.append(bad.select(
            "run_id", pl.col("step").cast(pl.Int64), pl.lit("non-finite").alias("kind"),
            pl.lit("error").alias("severity"),
            pl.format("{} NaN/inf value(s) in steps {}..{}", pl.col("nonfinite"), pl.col("step"), pl.col("step_end"))
            .alias("message"),
            pl.lit("point").alias("mark"),
        ))
    return pl.concat([p.cast(schema) for p in parts])


def _flags_layer(found: pl.DataFrame, frame: pl.DataFrame, labels: dict[str, str], x: str) -> alt.LayerChart | None:
    if found.is_empty():
        return None
    placed = place(found, frame).with_columns(
        pl.col("run_id").replace_strict(labels, default=pl.col("run_id")).alias("run"),
    )
    if X_AXES[x] != "step":
        placed = placed.filter(pl.col(X_AXES[x]).is_not_null())
    colour = alt.Color("severity:N", title="events", scale=alt.Scale(domain=list(SEVERITIES),
                       range=list(SEVERITY_COLOURS)), legend=alt.Legend(orient="bottom", symbolType="stroke"))
    tooltip = tooltips("run:N", "step:Q", "kind:N", "severity:N", "message:N")
    rules = alt.Chart(placed).transform_filter("datum.mark === 'rule'").mark_rule(
        strokeWidth=1.6, strokeDash=[6, 2], opacity=0.85
    ).encode(x=_rule_x(x), color=colour, tooltip=tooltip)
    points = alt.Chart(placed).transform_filter("datum.mark === 'point'").mark_point(
        shape="triangle-down", size=90, filled=True, opacity=0.95
    ).encode(x=_rule_x(x), y=alt.value(10), color=colour, tooltip=tooltip)
    return alt.layer(rules, points)


def curve_chart(
    frame: pl.DataFrame,
    style: CurveStyle,
    *,
    key: str,
    labels: dict[str, str] | None = None,
    marks: pl.DataFrame | None = None,
    hidden: pl.DataFrame | None = None,
    focus_step: int | None = None,
    events: pl.DataFrame | None = None,
) -> alt.LayerChart:
    """Layered curve chart of one key for many runs (see module doc).

    ``frame`` and ``hidden`` come from :func:`curve_frame`; ``marks`` from
    ``queries.resume_marks``; ``events`` from ``queries.curve_events``; ``labels``
    maps run ids to legend labels.
    """
    labels = labels or {}
    x = _x_encoding(style.x, frame)
    on_time = style.x != "step"
    yscale = alt.Scale(type="log") if style.log_y else alt.Scale(zero=False)
    color = alt.Color("run:N", title="run", scale=alt.Scale(scheme="tableau10"),
                      legend=alt.Legend(orient="bottom", labelLimit=320, symbolOpacity=1))
    detail = {"detail": alt.Detail("piece:N")} if on_time else {}
    time_tip = ("time:T",) if on_time else ()
    tooltip = tooltips("run:N", "step:Q", "step_end:Q", *time_tip, "mean:Q", "lo:Q", "hi:Q", "n:Q", "nonfinite:Q")
    band = alt.Chart(frame).transform_filter("!datum.last").mark_area(opacity=0.18, interpolate="step-after").encode(
        x=x, y=alt.Y("lo:Q", scale=yscale, title=key), y2=alt.Y2("hi:Q"), color=color, **detail
    )
    raw_opacity = 0.35 if style.smoothing > 0 else 1.0
    line = alt.Chart(frame).mark_line(opacity=raw_opacity, strokeWidth=1.2).encode(
        x=x, y=alt.Y("mean:Q", scale=yscale, title=key), color=color, tooltip=tooltip,
        order=alt.Order("step:Q"), **detail,
    )
    if style.zoomable and style.x == "step":
        line = line.add_params(alt.selection_interval(name=ZOOM, encodings=["x"]))
    layers: list[alt.Chart | alt.LayerChart] = [band, line]
    if style.smoothing > 0 and "smooth" in frame.columns:
        layers.append(alt.Chart(frame).mark_line(strokeWidth=2).encode(
            x=x, y=alt.Y("smooth:Q", scale=yscale), color=color, order=alt.Order("step:Q"),
            tooltip=tooltips("run:N", "step:Q", *time_tip, "smooth:Q"), **detail,
        ))
    if hidden is not None and not hidden.is_empty():
        layers.append(alt.Chart(hidden).mark_line(opacity=0.25, strokeDash=[2, 2]).encode(
            x=x, y=alt.Y("mean:Q", scale=yscale), color=color, detail=alt.Detail("segment:N"),
            order=alt.Order("step:Q"), tooltip=tooltips("run:N", "segment:Q", "step:Q", "mean:Q"),
        ))
    if marks is not None and not marks.is_empty():
        layer = _marks_layer(marks, frame, labels, style.x)
        if layer is not None:
            layers.append(layer)
    if focus_step is not None:
        focus = pl.DataFrame({"step": [focus_step]})
        if on_time:
            runs = frame.select("run_id").unique(maintain_order=True).head(1)
            focus = place(runs.with_columns(pl.lit(focus_step, pl.Int64).alias("step")), frame).select(
                "step", X_AXES[style.x])
        layers.append(alt.Chart(focus).mark_rule(color="#d62728", strokeWidth=2).encode(x=_rule_x(style.x)))
    flagged = _flags_layer(flags(frame, events), frame, labels, style.x)
    if flagged is None:
        return alt.layer(*layers, height=style.height)
    # the runs' layers share one colour scale; the flags' severity colours are a scale of their own
    return alt.layer(alt.layer(*layers), flagged, height=style.height).resolve_scale(color="independent")


def quick_chart(frame: pl.DataFrame, x: str, ys: Sequence[str], kind: str) -> alt.Chart:
    """A quick chart of a query result: ``kind`` in line, bar, point.

    The y columns are stacked into one long frame (``series``, ``y``) under names
    that cannot collide with the result's own columns, so a column called ``value``
    or ``column`` charts like any other.
    """
    names = set(frame.columns)
    series, y = "series", "y"
    while series in names:
        series = f"_{series}"
    while y in names or y == series:
        y = f"_{y}"
    xs = "_x" if x in ys else x
    base = frame.select(pl.col(x).alias(xs), *ys)
    long = base.unpivot(index=xs, on=list(ys), variable_name=series, value_name=y)
    mark = {"line": "mark_line", "bar": "mark_bar", "point": "mark_point"}[kind]
    return getattr(alt.Chart(long), mark)().encode(
        x=alt.X(xs, title=x), y=alt.Y(f"{y}:Q", title=ys[0] if len(ys) == 1 else "value"),
        color=alt.Color(f"{series}:N", title="column"),
        tooltip=[alt.Tooltip(xs, title=x), alt.Tooltip(f"{series}:N", title="column"),
                 alt.Tooltip(f"{y}:Q", title="value")],
    )
