"""Runs: every run with filters and sorting; the rows selected carry to the other pages."""

from __future__ import annotations

import polars as pl
import streamlit as st

from webui import queries, state

st.title("Runs")
everything = state.load("run_list", live=True)
if everything.is_empty():
    st.info(f"No runs yet under {state.store().home}. Log one with tracker.init(...), or run `tracker demo`.")
    st.stop()

tags = sorted({t for row in everything["tags"].to_list() for t in (row or [])})
c1, c2, c3, c4 = st.columns([2, 2, 2, 3])
projects = c1.multiselect("Project", sorted(everything["project"].drop_nulls().unique().to_list()))
statuses = c2.multiselect("Status", sorted(everything["status"].drop_nulls().unique().to_list()))
tag_pick = c3.multiselect("Tag", tags)
text = c4.text_input("Search name, id or config", placeholder="e.g. focal or lr")
c5, c6, c7 = st.columns([2, 1, 3])
sort = c5.selectbox("Sort by", queries.RUN_SORTS, format_func=lambda s: s.replace("_", " "))
descending = c6.toggle("Descending", value=True)
loss_key = c7.text_input("Loss key for best/last (empty: automatic)", value="")
live = bool((everything["status"] == "running").any())


@st.fragment(run_every=state.refresh_every(live))
def table() -> None:
    """The runs table (refreshed every 2 s while a run is running) and its selection."""
    runs = state.load(
        "runs_table", projects=projects, statuses=statuses, tags=tag_pick, text=text,
        loss_key=loss_key or None, sort=sort, descending=descending, live=True,
    )
    shown = queries.config_columns(runs).drop("config").with_columns(
        pl.col("duration_s").round(1), pl.col("tags").list.join(", ")
    )
    first = ["name", "project", "status", "created_at", "duration_s", "last_step", "loss_key", "best_loss",
             "max_loss", "last_loss", "tags"]
    shown = shown.select(*first, pl.exclude(first))
    st.caption(f"{runs.height} of {everything.height} runs" + (" · live" if live else ""))
    event = st.dataframe(
        shown, key="runs.table", on_select="rerun", selection_mode="multi-row", hide_index=True,
        column_config={
            "created_at": st.column_config.DatetimeColumn("started", format="YYYY-MM-DD HH:mm:ss"),
            "updated_at": st.column_config.DatetimeColumn("updated", format="YYYY-MM-DD HH:mm:ss"),
            "duration_s": st.column_config.NumberColumn("duration (s)"),
            "best_loss": st.column_config.NumberColumn("best loss", format="%.5g"),
            "max_loss": st.column_config.NumberColumn("max loss", format="%.5g"),
            "last_loss": st.column_config.NumberColumn("last loss", format="%.5g"),
            "best_step": st.column_config.NumberColumn("best step"),
            "fork_of": st.column_config.TextColumn("fork of", help="PARENT@STEP: shares the parent's rows up to STEP"),
        },
    )
    rows = list(event.selection.rows) if event is not None else []
    ids = runs["run_id"].to_list()
    picked = [ids[i] for i in rows if i < len(ids)]
    if picked and picked != st.session_state.get(state.RUNS):
        state.set_selected_runs(picked)
    current = st.session_state.get(state.RUNS) or []
    if current:
        st.markdown("**Selected:** " + ", ".join(f"`{r}`" for r in current))
        cols = st.columns(3)
        cols[0].page_link("views/curves.py", label="Curves", icon=":material/show_chart:")
        cols[1].page_link("views/classes.py", label="Per class", icon=":material/grid_on:")
        cols[2].page_link("views/events.py", label="Events", icon=":material/flag:")
    else:
        st.caption("Select rows to compare those runs on the other pages.")


table()
