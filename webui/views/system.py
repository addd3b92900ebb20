"""System: memory (with the device limit), step and data time, utilisation, per run and rank."""

from __future__ import annotations

import polars as pl
import streamlit as st

from tracker.store import Store
from webui import queries, state
from webui.system_charts import system_chart
from webui.system_queries import SystemView, system_view

TITLES = {"memory": "Memory", "time": "Step and data time", "utilisation": "Utilisation", "other": "Other"}
DEFAULT_HIDDEN = ("max_allocated", "peak_live", "host/mem_used")


@st.cache_data(ttl=state.LIVE_TTL_S, show_spinner=False, max_entries=64)
def _view(home: str, run_ids: tuple[str, ...]) -> SystemView:
    return system_view(Store(home), run_ids)


st.title("System")
run_ids, live = state.picked_runs()


@st.fragment(run_every=state.refresh_every(live))
def page() -> None:
    """The charts of the picked runs (refreshed while one of them runs)."""
    view = _view(str(state.store().home), tuple(run_ids))
    if view.keys.is_empty():
        st.info("No system metrics for these runs. A run samples sys/* keys every 2 s unless it was "
                "started with system=False or TRACKER_SYSTEM=0.")
        return
    labels = queries.run_labels(view.info)
    points = view.points
    ranks = sorted(points["rank"].unique().to_list()) if not points.is_empty() else [0]
    events, limits = view.events, view.limits
    if len(ranks) > 1:
        picked = st.multiselect("Ranks", ranks, default=ranks, key="system.ranks")
        points = points.filter(pl.col("rank").is_in(picked))
        events, limits = events.filter(pl.col("rank").is_in(picked)), limits.filter(pl.col("rank").is_in(picked))
    if not events.is_empty():
        st.caption(f"{events.height} system event(s) marked on the curves; hover a mark for its message.")
    for group in ("memory", "time", "utilisation", "other"):
        keys = sorted(points.filter(pl.col("group") == group)["key"].unique().to_list())
        if not keys:
            continue
        st.subheader(TITLES[group])
        default = [k for k in keys if not any(k.endswith(h) for h in DEFAULT_HIDDEN)] or keys
        shown = st.multiselect("Keys", keys, default=default, key=f"system.keys.{group}",
                               format_func=lambda k: k.removeprefix("sys/"), label_visibility="collapsed")
        part = points.filter(pl.col("key").is_in(shown))
        st.altair_chart(system_chart(part, limits, events, labels, group, ranks=len(ranks)), width="stretch",
                        key=f"system.chart.{group}")
    if not events.is_empty():
        st.subheader("Events")
        st.dataframe(events.with_columns(pl.col("run_id").replace_strict(labels, default=pl.col("run_id"))
                                         .alias("run")).select("run", "rank", "step", "kind", "severity", "message"),
                     hide_index=True, key="system.events")


page()
