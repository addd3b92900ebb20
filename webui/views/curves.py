"""Curves: one key for many runs, downsampled in SQL, smoothed, with resume marks and events.

Brushing a step range zooms on the step axis; on the time axes the slider zooms.

URL parameters: ``run`` (repeatable), ``key``, ``lo``/``hi`` (step range), ``step``
(a focus rule, e.g. from the Events page), ``x`` (step, wall time, relative time (s)),
``log`` (1 for a log y axis), ``smooth`` (EMA weight).
"""

from __future__ import annotations

import polars as pl
import streamlit as st

from webui import charts, grouped, queries, state

ZOOM = "tracker.zoom"

st.title("Curves")
run_ids = state.run_picker()
if not run_ids:
    st.info("Pick one or more runs in the sidebar (or select them on the Runs page).")
    st.stop()

context = state.load("curve_context", run_ids, state.query_param("key") or st.session_state.get("tracker.key"),
                     live=True)
keys = context.keys
if not keys:
    st.info("These runs have no scalar values logged yet.")
    st.stop()
c1, c2, c3, c4 = st.columns([3, 2, 1, 2])
key = c1.selectbox("Key", keys, index=keys.index(context.key))
x_axes = list(charts.X_AXES)
x_wanted = state.query_param("x", "step")
x_axis = c2.radio("x axis", x_axes, index=x_axes.index(x_wanted) if x_wanted in x_axes else 0, horizontal=True)
log_y = c3.toggle("log y", value=state.query_param("log") == "1")
weight = c4.slider("Smoothing (EMA)", 0.0, 0.99, float(state.query_param("smooth", "0.6") or 0.6), 0.01)
c5, c6, _ = st.columns([3, 2, 3])
show_hidden = c5.toggle("Show rows superseded by a resume", value=False)
buckets = c6.select_slider("Points per series", [250, 500, 1000, 2000], value=queries.DEFAULT_BUCKETS)
st.session_state["tracker.key"] = key
st.query_params.update({"key": key, "x": x_axis, "log": "1" if log_y else "0", "smooth": f"{weight:.2f}"})
g1, g2, g3 = st.columns([3, 2, 2])  # grouped bands and any logged key as x (webui/grouped.py)
group_options = state.load("group_config_keys", run_ids)
group_keys = g1.multiselect("Group by config", group_options,
                            default=[k for k in st.query_params.get_all("group") if k in group_options])
x_options = ["step", *[k for k in keys if k != key]]
x_key = g2.selectbox("Align by (x)", x_options, index=x_options.index(state.query_param("xkey", "step"))
                     if state.query_param("xkey", "step") in x_options else 0)
band = grouped.BANDS[g3.radio("Band", list(grouped.BANDS), horizontal=True,
                              index=1 if state.query_param("band") == "std" else 0)]
if group_keys or x_key != "step":
    st.query_params.update({"group": group_keys, "xkey": x_key, "band": band})
    grouped.show(run_ids, key, group_keys, None if x_key == "step" else x_key, band, buckets, log_y)
    st.stop()
forks = state.load("lineage", run_ids)
if forks:
    st.caption("Forks: " + " · ".join(f"`{r}` from `{p}` at step {s}" for r, (p, s) in forks.items()))

if key != context.key:
    context = state.load("curve_context", run_ids, key, live=True)
lo_all, hi_all = int(context.bounds["lo"].min()), int(context.bounds["hi"].max())
focus = state.int_param("step")
link = (state.int_param("lo"), state.int_param("hi"))
if link != st.session_state.get("_tracker.zoom_link") and (link[0] is not None or link[1] is not None):
    st.session_state[ZOOM] = (link[0] if link[0] is not None else lo_all, link[1] if link[1] is not None else hi_all)
    st.session_state["_tracker.zoom_link"] = link
zoom: tuple[int, int] | None = st.session_state.get(ZOOM)
if zoom is not None:  # a zoom kept from other runs or another key is clipped to this range
    zoom = (max(lo_all, zoom[0]), min(hi_all, zoom[1]))
    zoom = zoom if zoom[0] < zoom[1] and zoom != (lo_all, hi_all) else None
if hi_all > lo_all:
    z1, z2 = st.columns([6, 1])
    picked = z1.slider("Step range (zoom re-queries at full detail)", lo_all, hi_all, value=zoom or (lo_all, hi_all))
    if tuple(picked) != (zoom or (lo_all, hi_all)):
        zoom = None if tuple(picked) == (lo_all, hi_all) else (int(picked[0]), int(picked[1]))
        st.session_state[ZOOM] = zoom
    if z2.button("Reset zoom", disabled=zoom is None):
        st.session_state[ZOOM] = zoom = None
        st.query_params.pop("lo", None)
        st.query_params.pop("hi", None)
        st.rerun()
live = context.live


def _apply_brush(event: object) -> None:
    """Zoom to the step range brushed on the chart (a fresh chart key clears the brush).

    Only a chart drawn with ``on_select="rerun"`` returns a selection state (a dict);
    otherwise Streamlit returns the element itself, which has no selection to read.
    """
    selection = event.get("selection") if isinstance(event, dict) else None
    brushed = selection.get(charts.ZOOM) if isinstance(selection, dict) else None
    steps = brushed.get("step") if isinstance(brushed, dict) else None
    if steps and len(steps) == 2 and steps[1] > steps[0]:
        st.session_state[ZOOM] = (max(lo_all, int(steps[0])), min(hi_all, int(steps[1]) + 1))
        st.session_state["tracker.zoom_version"] = st.session_state.get("tracker.zoom_version", 0) + 1
        st.rerun(scope="app")


@st.fragment(run_every=state.refresh_every(live))
def draw() -> None:
    """The chart and the per-run summary (refreshed every 2 s while a run is running)."""
    lo, hi = zoom if zoom else (None, None)
    view = state.load("curve_view", run_ids, key, lo=lo, hi=hi, buckets=buckets, hidden=show_hidden, live=live)
    labels = queries.run_labels(view.info)
    points = queries.smooth(view.points, weight)
    marks = view.marks
    frame = charts.curve_frame(points, labels, log_y=log_y, marks=marks, origins=view.origins)
    hidden = None
    if view.hidden is not None and not view.hidden.is_empty():
        hidden = charts.curve_frame(view.hidden, labels, log_y=log_y)
    style = charts.CurveStyle(x=x_axis, log_y=log_y, smoothing=weight)
    chart = charts.curve_chart(frame, style, key=key, labels=labels, marks=marks, hidden=hidden, focus_step=focus,
                               events=view.events)
    version = st.session_state.get("tracker.zoom_version", 0)
    brushable = style.zoomable and x_axis == "step"
    event = st.altair_chart(chart, width="stretch", key=f"curves.chart.{x_axis}.{version}",
                            on_select="rerun" if brushable else "ignore")
    if brushable:
        _apply_brush(event)
    summary = frame.group_by("run", maintain_order=True).agg(
        pl.col("n").filter(~pl.col("last")).sum().alias("points in range"),
        pl.col("step").max().alias("last step"),
        pl.col("mean").filter(pl.col("last")).first().alias("last value"),
        pl.col("lo").min().alias("min"),
        pl.col("nonfinite").filter(~pl.col("last")).sum().alias("NaN/inf"),
        pl.col("raw").first().alias("full detail"),
    )
    st.dataframe(summary, hide_index=True)
    note = "full detail" if bool(points["raw"].all()) else f"downsampled in SQL to ≤ {buckets} buckets per series"
    st.caption(f"{key} · {note}" + (" · live, refreshing every 2 s" if live else ""))


draw()
