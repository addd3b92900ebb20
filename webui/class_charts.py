"""Altair charts of the per-class page: heatmap, ranked bars, shares, rare versus frequent.

Rules, so the page reads at COCO's 80 classes:

* Every class is named: the class charts are ``ROW_PX`` pixels a class high
  (:func:`rows_height`) and their labels never overlap-hide nor shift to stay flush
  with the chart's edge (Streamlit's theme turns both on).
* One colour per group (rare, common, frequent) in every chart of the page
  (:data:`GROUP_SCALE`); the class weights are drawn in a colour of their own.
* Legends sit above the charts, so nothing is clipped at the right edge of a
  1,400-pixel window; concatenated charts have fixed widths that fit it.
* The share chart stacks the top classes, each in a colour of its own; ``other``
  (the rest) is told in the title and the tooltip rather than stacked on top.
"""

from __future__ import annotations

import altair as alt
import polars as pl

from webui.charts import tooltips
from webui.class_queries import GROUPS

ROW_PX = 14
GROUP_COLOURS = ("#d62728", "#e8a200", "#4c78a8")
GROUP_SCALE = alt.Scale(domain=list(GROUPS), range=list(GROUP_COLOURS))
WEIGHT_COLOUR = "#8c6bb1"
TOP_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6",
               "#9d755d", "#1f77b4")
_CLASS_AXIS = {"labelFontSize": 10, "labelOverlap": False, "labelFlush": False, "labelLimit": 160, "labelPadding": 4}


def rows_height(classes: int) -> int:
    """The height in pixels of a chart with one row per class."""
    return max(160, ROW_PX * classes)


def _group_colour(title: str = "classes") -> alt.Color:
    return alt.Color("group:N", title=title, scale=GROUP_SCALE, legend=alt.Legend(orient="top"))


def heatmap_chart(cells: pl.DataFrame, *, key: str, log_color: bool = False) -> alt.Chart:
    """Classes x step buckets, coloured by the bucket mean; one named row per class."""
    scale = alt.Scale(type="symlog" if log_color else "linear", scheme="viridis")
    cells = cells.sort(["class_index", "step"]).with_columns(
        pl.col("step").shift(-1).over("class_index").fill_null(pl.col("step_end") + 1).alias("step_next")
    )
    order = cells.group_by("class_name").agg(pl.col("class_index").min()).sort("class_index")["class_name"].to_list()
    return alt.Chart(cells).mark_rect().encode(
        x=alt.X("step:Q", title="step", scale=alt.Scale(zero=False, nice=False)),
        x2=alt.X2("step_next:Q"),
        y=alt.Y("class_name:N", sort=order, title="class", axis=alt.Axis(**_CLASS_AXIS)),
        color=alt.Color("value:Q", scale=scale, title=key,
                        legend=alt.Legend(orient="top", gradientLength=320, direction="horizontal")),
        tooltip=tooltips("class_name:N", "step:Q", "step_end:Q", "value:Q", "n:Q"),
    ).properties(height=rows_height(len(order)))


def ranking_chart(ranked: pl.DataFrame, *, key: str) -> alt.HConcatChart | alt.Chart:
    """Ranked bars of each class's recent mean (coloured by group), the class weights beside them."""
    order = ranked["class_name"].to_list()
    height = rows_height(len(order))
    has_weight = "weight" in ranked.columns
    grouped = "group" in ranked.columns
    tooltip = tooltips("class_name:N", "mean:Q", "share:Q", *(["group:N", "count:Q"] if grouped else []),
                    *(["weight:Q"] if has_weight else []))
    bars = alt.Chart(ranked).mark_bar().encode(
        x=alt.X("mean:Q", title=f"mean {key}", axis=alt.Axis(orient="top")),
        y=alt.Y("class_name:N", sort=order, title="class", axis=alt.Axis(**_CLASS_AXIS)),
        color=_group_colour() if grouped else alt.value(GROUP_COLOURS[2]),
        tooltip=tooltip,
    ).properties(height=height, width=520)
    if not has_weight:
        return bars
    weights = alt.Chart(ranked).mark_bar(color=WEIGHT_COLOUR).encode(
        x=alt.X("weight:Q", title="class weight", axis=alt.Axis(orient="top")),
        y=alt.Y("class_name:N", sort=order, axis=None),
        tooltip=tooltip,
    ).properties(height=height, width=220)
    return alt.hconcat(bars, weights, spacing=12)


def share_chart(share: pl.DataFrame, *, key: str, classes: int, height: int = 380) -> alt.Chart:
    """Stacked share of the total that each top class contributes over time (from ``class_queries.shares``).

    The top classes are stacked from the largest share up, each in a colour of its
    own; ``other`` (the remaining ``classes - top`` classes) is not stacked on top,
    where it would flatten the top classes into a sliver at 80 classes: its mean
    share is given in the title and its share per step in the tooltip.
    """
    means = share.group_by("class_name").agg(pl.col("share").mean().alias("_m"))
    top = means.filter(pl.col("class_name") != "other").sort(["_m", "class_name"], descending=[True, False])
    domain = top["class_name"].to_list()
    colours = [TOP_COLOURS[i % len(TOP_COLOURS)] for i in range(len(domain))]
    other = means.filter(pl.col("class_name") == "other")["_m"]
    rest = classes - len(domain)
    title = f"top {len(domain)} of {classes} classes"
    if rest > 0 and len(other):
        title += f"; the other {rest} carry {float(other[0]):.0%} of {key} on average"
    rank = {name: i for i, name in enumerate(domain)}
    others = share.filter(pl.col("class_name") == "other").select("bucket", pl.col("share").alias("other"))
    frame = (share.filter(pl.col("class_name") != "other")
             .with_columns(pl.col("class_name").replace_strict(rank, default=len(rank)).alias("stack"))
             .join(others, on="bucket", how="left"))
    return alt.Chart(frame, title=alt.Title(title, anchor="start", fontSize=12, fontWeight="normal")).mark_area(
        opacity=0.9).encode(
        x=alt.X("step:Q", title="step", scale=alt.Scale(zero=False, nice=False)),
        y=alt.Y("share:Q", stack="zero", title=f"share of {key}", axis=alt.Axis(format="%")),
        color=alt.Color("class_name:N", title="class", sort=domain, scale=alt.Scale(domain=domain, range=colours),
                        legend=alt.Legend(orient="right", labelLimit=160)),
        order=alt.Order("stack:Q", sort="ascending"),
        tooltip=tooltips("class_name:N", "step:Q", "share:Q", "other:Q"),
    ).properties(height=height)


def rare_frequent_chart(ranked: pl.DataFrame, groups: pl.DataFrame, *, key: str) -> alt.HConcatChart:
    """Recent mean against class count (log x), and each group's mean over time, in the group colours."""
    scatter = alt.Chart(ranked.filter(pl.col("count") > 0)).mark_circle(size=60, opacity=0.85).encode(
        x=alt.X("count:Q", scale=alt.Scale(type="log"), title="class instances"),
        y=alt.Y("mean:Q", title=f"recent mean {key}"),
        color=_group_colour(),
        tooltip=tooltips("class_name:N", "count:Q", "mean:Q", "group:N"),
    ).properties(height=320, width=400)
    lines = alt.Chart(groups).mark_line(strokeWidth=2).encode(
        x=alt.X("step:Q", title="step"),
        y=alt.Y("value:Q", title=f"mean {key} of the group"),
        color=_group_colour(),
        tooltip=tooltips("group:N", "step:Q", "value:Q"),
    ).properties(height=320, width=420)
    return alt.hconcat(scatter, lines, spacing=30)
