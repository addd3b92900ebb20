"""The curves page's grouped view: runs grouped by config keys, each group's mean with a
min–max or ±std band, aligned by step or by any logged key (``epoch``, ``samples_seen``).

The numbers come from :func:`tracker.runsets.group_bands` (SQL over the ``curves`` view,
bucketed over the x range); this module adds the loaders, the config keys worth grouping
by (those whose values differ between the runs) and the chart.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import altair as alt
import polars as pl

from tracker import runsets
from webui import queries

BANDS = {"min–max": "minmax", "±std": "std"}


def group_bands(src: Any, run_ids: Sequence[str], config_keys: Sequence[str], key: str,
                x_key: str | None = None, buckets: int = 200) -> pl.DataFrame:
    """Per group and bucket: x, mean, std, min, max, n_runs (see tracker.runsets)."""
    return runsets.group_bands(src, list(run_ids), list(config_keys), key, x_key=x_key, buckets=buckets)


def config_keys(src: Any, run_ids: Sequence[str]) -> list[str]:
    """The flattened config keys whose values differ between ``run_ids`` (sorted)."""
    info = queries.run_info(src, run_ids)
    flat = [runsets.flatten(json.loads(c) if c else {}) for c in info["config"].to_list()]
    keys = sorted({k for cfg in flat for k in cfg})
    differ = [k for k in keys if len({json.dumps(cfg.get(k), default=str) for cfg in flat}) > 1]
    return [k for k in differ if not k.startswith("tracker_")]


def lineage(src: Any, run_ids: Sequence[str]) -> dict[str, tuple[str, int]]:
    """{fork: (parent, fork step)} among ``run_ids`` (none in a lake: it has no lineage)."""
    name, params = queries.one_of("r.run_id", run_ids)
    rows = queries.fetch(src, f"""
        SELECT run_id, json_extract_string(j, '$.parent_run_id') AS parent,
               CAST(json_extract(j, '$.fork_step') AS BIGINT) AS step
        FROM (SELECT r.run_id, to_json(r) AS j FROM runs r WHERE {name})
        WHERE json_extract_string(j, '$.parent_run_id') IS NOT NULL""", params)
    return {r: (p, int(s)) for r, p, s in rows.iter_rows()}


def band_frame(bands: pl.DataFrame, band: str) -> pl.DataFrame:
    """``bands`` with ``lo``/``hi``: the group's min and max, or mean ± std."""
    if band not in BANDS.values():
        from tracker.errors import ConfigError

        raise ConfigError(f"band must be one of {', '.join(BANDS.values())}, got {band!r}")
    if band == "minmax":
        return bands.with_columns(pl.col("min").alias("lo"), pl.col("max").alias("hi"))
    return bands.with_columns((pl.col("mean") - pl.col("std")).alias("lo"), (pl.col("mean") + pl.col("std")).alias("hi"))


def band_chart(frame: pl.DataFrame, *, key: str, x_title: str, log_y: bool = False,
               forks: Sequence[tuple[str, float]] = ()) -> alt.LayerChart:
    """Each group's mean line over its band; the legend names the group and its run count.
    ``forks``: (label, x) of fork points, drawn as dotted rules."""
    color = alt.Color("group:N", title="group", scale=alt.Scale(scheme="tableau10"),
                      legend=alt.Legend(orient="bottom", labelLimit=420, symbolOpacity=1))
    yscale = alt.Scale(type="log") if log_y else alt.Scale(zero=False)
    x = alt.X("x:Q", title=x_title)
    tips = [alt.Tooltip("group:N"), alt.Tooltip("x:Q", format=".5g"), alt.Tooltip("mean:Q", format=".5g"),
            alt.Tooltip("lo:Q", format=".5g"), alt.Tooltip("hi:Q", format=".5g"), alt.Tooltip("n_runs:Q")]
    area = alt.Chart(frame).mark_area(opacity=0.2).encode(x=x, y=alt.Y("lo:Q", scale=yscale, title=key),
                                                          y2="hi:Q", color=color)
    line = alt.Chart(frame).mark_line(strokeWidth=1.6).encode(x=x, y=alt.Y("mean:Q", scale=yscale), color=color,
                                                              tooltip=tips)
    layers: list[Any] = [area, line]
    if forks:
        rules = pl.DataFrame({"fork": [f for f, _ in forks], "x": [float(s) for _, s in forks]})
        layers.append(alt.Chart(rules).mark_rule(strokeDash=[2, 3], color="#555").encode(
            x="x:Q", tooltip=[alt.Tooltip("fork:N"), alt.Tooltip("x:Q", title="fork step")]))
    return alt.layer(*layers).properties(height=420)


def show(run_ids: Sequence[str], key: str, group_keys: Sequence[str], x_key: str | None, band: str,
         buckets: int, log_y: bool) -> None:
    """Draw the grouped chart and its table on the curves page."""
    import streamlit as st

    from webui import state

    bands = state.load("group_bands", list(run_ids), list(group_keys), key, x_key=x_key, buckets=buckets, live=True)
    if bands.is_empty():
        st.info(f"No finite values of {key!r}" + (f" with {x_key!r} logged" if x_key else "") + " in these runs.")
        return
    frame = band_frame(bands, band)
    if log_y:
        frame = frame.filter(pl.col("lo") > 0)
    forks = [] if x_key else [(f"{r} from {p}@{s}", float(s)) for r, (p, s) in state.load("lineage", list(run_ids)).items()]
    chart = band_chart(frame, key=key, x_title=x_key or "step", log_y=log_y, forks=forks)
    st.altair_chart(chart, width="stretch", key=f"curves.grouped.{band}.{x_key or 'step'}")
    summary = frame.group_by("group", maintain_order=True).agg(
        pl.col("n_runs").max().alias("runs"), pl.col("mean").last().alias("last mean"),
        pl.col("lo").last().alias("last lo"), pl.col("hi").last().alias("last hi"),
        pl.col("mean").min().alias("best mean"))
    st.dataframe(summary, hide_index=True, key="curves.grouped.table")
    what = f"grouped by {', '.join(group_keys)}" if group_keys else "one line per run"
    st.caption(f"{key} · {what} · band: {band} · x: {x_key or 'step'} · ≤ {buckets} buckets over the x range")
