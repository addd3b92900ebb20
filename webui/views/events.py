"""Events: ``run.event()`` rows and detector findings by run and step, linked to the curve."""

from __future__ import annotations

from urllib.parse import urlencode

import polars as pl
import streamlit as st

from webui import charts, queries, state

WINDOW = 0.05  # the linked view spans 5% of the run's steps on each side, at least 25 steps

st.title("Events")
run_ids = state.run_picker(default_all=True)
everything = state.load("events_table", run_ids, live=True)
if everything.is_empty():
    st.info("No events for these runs. Detectors and run.event(...) record them.")
    st.stop()
c1, c2 = st.columns(2)
kinds = c1.multiselect("Kind", sorted(everything["kind"].unique().to_list()))
severities = c2.multiselect("Severity", sorted(everything["severity"].unique().to_list()))
live = state.load("running", run_ids, live=True)


def _link(row: dict[str, object]) -> str:
    params = {"run": row["run_id"], "step": row["step"]}
    if row.get("key"):
        params["key"] = row["key"]
    return "curves?" + urlencode(params)


def _window(run_id: str, key: str, step: int) -> tuple[int, int]:
    bounds = state.load("step_bounds", [run_id], key, live=live)
    lo, hi = int(bounds["lo"].min()), int(bounds["hi"].max())
    half = max(25, int((hi - lo) * WINDOW))
    return max(lo, step - half), min(hi, step + half)


@st.fragment(run_every=state.refresh_every(live))
def table() -> None:
    """The events table; a selected row shows its curve around the step."""
    events = state.load("events_table", run_ids, kinds=kinds, severities=severities, live=live)
    counts = events.group_by("severity").agg(pl.len()).sort("severity")
    cols = st.columns(max(1, counts.height))
    for col, (severity, n) in zip(cols, counts.iter_rows()):
        col.metric(severity, n)
    shown = events.with_columns(pl.Series("curve", [_link(r) for r in events.iter_rows(named=True)]))
    event = st.dataframe(
        shown.drop("wall_time"), key="events.table", on_select="rerun", selection_mode="single-row",
        hide_index=True,
        column_config={"curve": st.column_config.LinkColumn("curve", display_text="open")},
    )
    rows = list(event.selection.rows) if event is not None else []
    if not rows:
        st.caption("Select an event to see its curve at that step.")
        return
    row = events.row(rows[0], named=True)
    if not row["key"]:
        st.info("This event names no key; open the curves page to pick one.")
        return
    lo, hi = _window(row["run_id"], row["key"], int(row["step"]))
    labels = queries.run_labels(state.load("run_info", [row["run_id"]], live=live))
    points = state.load("curve", [row["run_id"]], row["key"], lo=lo, hi=hi, live=live)
    frame = charts.curve_frame(queries.smooth(points, 0.0), labels, log_y=False)
    style = charts.CurveStyle(zoomable=False, height=300)
    st.markdown(f"**{row['kind']}** at step {row['step']} of `{row['run_id']}`: {row['message']}")
    near = events.filter((pl.col("run_id") == row["run_id"]) & pl.col("step").is_between(lo, hi)
                         & (pl.col("key").is_null() | (pl.col("key") == row["key"])))
    chart = charts.curve_chart(frame, style, key=row["key"], labels=labels, focus_step=int(row["step"]), events=near)
    st.altair_chart(chart, width="stretch", key="events.chart")
    if st.button("Open on the Curves page", icon=":material/show_chart:"):
        state.set_selected_runs([row["run_id"]])
        st.switch_page(
            "views/curves.py",
            query_params={"run": row["run_id"], "key": row["key"], "step": str(row["step"]),
                          "lo": str(lo), "hi": str(hi)},
        )


table()
