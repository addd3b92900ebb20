"""The per-class page's "Rare classes" section: gradient balance, boxes without a positive, AP against
frequency and the stagnant classes.

Data: :func:`rare_view` (plain, tested) over :mod:`tracker.rare_classes`'s SQL: the
cumulative pos/neg gradient ratio (EQL v2's indicator; computed in SQL when read), its
median per frequency group over steps, the share of GT boxes without a positive anchor,
``val/AP50-95`` against ``log10`` of the training count per epoch, and the classes the
analysis calls stagnant on ``train/cls_loss``. Groups are the page's thirds by count and
keep its colours (rare red, common amber, frequent blue).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import altair as alt
import numpy as np
import polars as pl
import streamlit as st

from tracker import rare_classes as rc

SHOWN_CLASSES = 8  # per-class ratio curves: the rarest classes that logged gradients


@dataclass
class RareView:
    """What the section draws."""

    groups: pl.DataFrame  # group, step, ratio (median over the group's classes)
    classes: pl.DataFrame  # class_name, group, step, ratio (the rarest SHOWN_CLASSES)
    no_pos: pl.DataFrame  # class_name, group, gt, gt_no_pos, share
    ap: pl.DataFrame  # class_name, group, epoch, ap, count, log_count
    stagnant: list[str] = field(default_factory=list)
    stagnant_step: int | None = None

    @property
    def empty(self) -> bool:
        """True when the run logged none of the signals."""
        return not (self.groups.height or self.no_pos.height or self.ap.height)


def _membership(counts: np.ndarray | None) -> pl.DataFrame:
    groups = rc.frequency_groups(counts) if counts is not None else {}
    return pl.DataFrame({"class_index": [i for idx in groups.values() for i in idx],
                         "group": [g for g, idx in groups.items() for _ in idx]},
                        schema={"class_index": pl.Int64, "group": pl.Utf8})


def rare_view(src: Any, run_id: str, *, with_stagnant: bool = True, home: Any = None) -> RareView:
    """The section's frames for ``run_id`` (see :class:`RareView`); ``src`` a store or a DuckDB connection."""
    names = rc.class_names(src, run_id)
    counts = rc.counts_of(rc.run_config(src, run_id), names)
    member = _membership(counts)
    ratio = rc.grad_ratio(src, run_id).with_columns(pl.col("class_index").cast(pl.Int64))
    ratio = ratio.join(member, on="class_index", how="inner").filter(pl.col("ratio").is_finite())
    groups = (ratio.group_by(["group", "step"]).agg(pl.col("ratio").median()).sort(["group", "step"])
              if ratio.height else pl.DataFrame(schema={"group": pl.Utf8, "step": pl.Int64, "ratio": pl.Float64}))
    rare = [i for i in (rc.frequency_groups(counts)["rare"] if counts is not None else [])
            if i in set(ratio["class_index"].to_list())][:SHOWN_CLASSES]
    classes = ratio.filter(pl.col("class_index").is_in(rare)).select("class_name", "group", "step", "ratio")
    share = rc.no_pos_share(src, run_id).with_columns(pl.col("class_index").cast(pl.Int64))
    no_pos = (share.join(member, on="class_index", how="left").filter(pl.col("gt") > 0)
              .select("class_name", pl.col("group").fill_null("no count"), "gt", "gt_no_pos", "share")
              .sort("share", descending=True))
    ap = rc.ap_frequency(src, run_id, counts)
    if ap.height and counts is not None:
        ap = (ap.with_columns(pl.col("class_index").cast(pl.Int64)).join(member, on="class_index", how="left")
              .filter(pl.col("ap").is_finite()).select("class_name", "group", "epoch", "ap", "count", "log_count"))
    else:
        ap = pl.DataFrame(schema={"class_name": pl.Utf8, "group": pl.Utf8, "epoch": pl.Int64, "ap": pl.Float64,
                                  "count": pl.Float64, "log_count": pl.Float64})
    view = RareView(groups, classes, no_pos, ap)
    if with_stagnant and not view.empty:  # the analysis reads train/cls_loss: only for runs with the signals
        view.stagnant_step, stuck = rc.stagnant(run_id, home=home)
        view.stagnant = [name for _, name, _, _ in stuck]
    return view


def _colour() -> alt.Color:
    from webui.class_charts import GROUP_SCALE

    return alt.Color("group:N", title="classes", scale=GROUP_SCALE, legend=alt.Legend(orient="top"))


def ratio_chart(view: RareView) -> alt.HConcatChart:
    """Cumulative pos/neg gradient ratio over steps: median per group, and the rarest classes."""
    y = alt.Y("ratio:Q", title="cumulative grad/pos ÷ grad/neg", scale=alt.Scale(type="symlog", constant=1e-3),
              axis=alt.Axis(values=[0, 0.001, 0.01, 0.1, 1, 10], format="~g", labelOverlap=False))  # 0: no positive yet
    left = alt.Chart(view.groups, title="by frequency group (median)").mark_line().encode(
        x=alt.X("step:Q"), y=y, color=_colour(), tooltip=["group", "step", alt.Tooltip("ratio:Q", format=".3g")])
    right = alt.Chart(view.classes, title=f"rarest {SHOWN_CLASSES} classes").mark_line().encode(
        x=alt.X("step:Q"), y=y,
        color=alt.Color("class_name:N", title="class", legend=alt.Legend(orient="top", columns=4)),
        tooltip=["class_name", "step", alt.Tooltip("ratio:Q", format=".3g")])
    return alt.hconcat(left.properties(width=330, height=240),
                       right.properties(width=330, height=240)).resolve_scale(color="independent")


def no_pos_chart(view: RareView, top: int = 20) -> alt.Chart:
    """Share of each class's GT boxes that got no positive anchor (the worst ``top``)."""
    rows = view.no_pos.head(top)
    return alt.Chart(rows).mark_bar().encode(
        x=alt.X("share:Q", title="share of GT boxes without a positive", axis=alt.Axis(format="%")),
        y=alt.Y("class_name:N", sort="-x", title=None, axis=alt.Axis(labelOverlap=False, labelLimit=160)),
        color=_colour(),
        tooltip=["class_name", "group", "gt", "gt_no_pos", alt.Tooltip("share:Q", format=".1%")],
    ).properties(width=560, height=max(120, 18 * rows.height))


def ap_chart(view: RareView) -> alt.Chart:
    """AP50-95 against log10 training count, one panel per epoch shown (first, middle, last)."""
    epochs = sorted(set(view.ap["epoch"].to_list()))
    shown = sorted({epochs[0], epochs[len(epochs) // 2], epochs[-1]}) if epochs else []
    data = view.ap.filter(pl.col("epoch").is_in(shown))
    return alt.Chart(data).mark_circle(size=40, opacity=0.8).encode(
        x=alt.X("log_count:Q", title="log10 training instances"), y=alt.Y("ap:Q", title="val AP50-95"),
        color=_colour(), tooltip=["class_name", "epoch", "count", alt.Tooltip("ap:Q", format=".3f")],
    ).properties(width=210, height=200).facet(column=alt.Column("epoch:O", title="epoch"))


def draw(run_id: str, home: str) -> None:
    """The section, under its own header (Streamlit)."""
    st.subheader("Rare classes")
    view = _cached_view(home, run_id)
    if view.empty:
        st.info("This run logged no assignment, gradient or per-class AP values: train with track() (they are on "
                "by default) or log them with run.log_assignments(...).")
        return
    if view.stagnant:
        st.warning(f"Stagnant on train/cls_loss at step {view.stagnant_step}: " + ", ".join(view.stagnant))
    else:
        st.caption("No class is stagnant on train/cls_loss.")
    if view.groups.height:
        st.markdown("**Gradient balance** (EQL v2): cumulative positive over negative |dL/dlogit| per class")
        st.altair_chart(ratio_chart(view), key="rare.ratio")
    if view.no_pos.height:
        lost = view.no_pos.filter(pl.col("gt_no_pos") > 0)
        st.markdown(f"**Ground-truth boxes without a positive anchor**: {lost.height} classes lose some")
        st.altair_chart(no_pos_chart(view), key="rare.no_pos")
    if view.ap.height:
        st.markdown("**AP against training frequency** across epochs")
        st.altair_chart(ap_chart(view), key="rare.ap")


@st.cache_data(ttl=5, show_spinner=False, max_entries=32)
def _cached_view(home: str, run_id: str) -> RareView:
    from tracker.store import Store

    return rare_view(Store(home), run_id, home=home)
