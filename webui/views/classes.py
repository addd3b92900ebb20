"""Per class: heatmap, ranked bars with class weights, shares over time, rare vs frequent, and the
"rare classes" section (gradient balance, boxes without a positive, AP against frequency; webui/rare_section.py).

Class counts for the rare-versus-frequent view come from the run's config
(``class_counts``, or the loss's ``counts``) or from a COCO instances or class-count
JSON file given here. Class weights come from where the run has them (see
``class_queries.class_weights_of``). Charts follow ``webui/class_charts.py``.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import streamlit as st

from tracker.errors import TrackerError
from webui import class_charts, class_queries, queries, rare_section, state

st.title("Per class")
picked = state.run_picker(multi=False, label="Run")
if not picked:
    st.info("Pick a run in the sidebar.")
    st.stop()
run_id = picked[0]
keys = state.load("class_keys", run_id, live=True)
if not keys:
    st.info(f"Run {run_id!r} logged no per-class values; use run.log_classes(key, vector, step=...).")
    st.stop()
info = state.load("run_info", [run_id], live=True)
config = queries.run_config(info["config"][0] if info.height else None)
live = bool(info.height and info["status"][0] == "running")

c1, c2, c3, c4 = st.columns([3, 2, 2, 2])
wanted = state.query_param("key")
key = c1.selectbox("Per-class key", keys, index=keys.index(wanted) if wanted in keys else 0)
buckets = c2.select_slider("Step buckets", [50, 100, 200, 400], value=200)
last_steps = c3.number_input("Rank over the last N steps", min_value=1, value=1000, step=100)
log_color = c4.toggle("Log colour scale", value=False)
counts_path = st.text_input(
    "Class counts file (COCO instances or class-count JSON; empty: the run's config)", value=""
)


def _counts(names: list[str]) -> tuple[np.ndarray | None, str]:
    if counts_path.strip():
        try:
            by_name = class_queries.load_counts_file(counts_path.strip())
        except TrackerError as exc:
            st.error(str(exc))
            return None, ""
        return class_queries.counts_vector(by_name, names), counts_path.strip()
    return class_queries.counts_from_config(config, names), "run config"


@st.fragment(run_every=state.refresh_every(live))
def draw() -> None:
    """All per-class views of ``key`` (refreshed every 2 s while the run is running)."""
    view = state.load("class_view", run_id, key, buckets=buckets, last_steps=int(last_steps), live=live)
    cells, names = view.cells, view.names
    st.subheader("Classes × steps")
    st.altair_chart(class_charts.heatmap_chart(cells, key=key, log_color=log_color), width="stretch",
                    key="classes.heatmap")
    counts, source = _counts(names)
    found = class_queries.class_weights_of(config, names)
    ranked = class_queries.with_counts(view.ranked, counts, found.weights)
    st.subheader(f"Ranked by mean over the last {int(last_steps)} steps")
    if found.weights is None:
        st.caption(f"{found.source}; bars show the loss only.")
    else:
        st.caption(f"Class weights beside the bars: {found.source}.")
    st.altair_chart(class_charts.ranking_chart(ranked, key=key), key="classes.ranking")
    st.subheader("Share of the total per class")
    share = class_queries.shares(cells)
    st.altair_chart(class_charts.share_chart(share, key=key, classes=len(names)), width="stretch", key="classes.share")
    st.subheader("Rare versus frequent classes")
    if counts is None or "group" not in ranked.columns:
        st.info("No class counts: add class_counts to the run's config or give a counts file above.")
        return
    groups = {g: ranked.filter(pl.col("group") == g)["class_index"].to_list() for g in class_queries.GROUPS}
    curves = class_queries.group_means(cells, groups)
    st.caption(f"Counts from {source}; classes split into thirds by count: "
               "rare (red), common (amber), frequent (blue) in every chart of this page.")
    st.altair_chart(class_charts.rare_frequent_chart(ranked, curves, key=key), key="classes.rare")
    table = ranked.group_by("group").agg(
        pl.len().alias("classes"), pl.col("count").sum().alias("instances"), pl.col("mean").mean().alias("mean loss")
    ).sort("instances")
    st.dataframe(table, hide_index=True)


draw()
rare_section.draw(run_id, str(state.store().home))
