"""Embeddings: the collapse statistics of log_embeddings (std, RankMe, dead dimensions) with the collapse events."""

from __future__ import annotations

import polars as pl
import streamlit as st

from tracker.store import Store
from webui import queries, state
from webui.embedding_charts import statistic_chart
from webui.embedding_queries import STATISTICS, EmbeddingView, embedding_view


@st.cache_data(ttl=state.LIVE_TTL_S, show_spinner=False, max_entries=64)
def _view(home: str, run_ids: tuple[str, ...], key: str | None) -> EmbeddingView:
    return embedding_view(Store(home), run_ids, key)


st.title("Embeddings")
run_ids, live = state.picked_runs()


@st.fragment(run_every=state.refresh_every(live))
def page() -> None:
    """The statistics of one embedding key of the picked runs (refreshed while one of them runs)."""
    home = str(state.store().home)
    keys = _view(home, tuple(run_ids), None).keys
    if keys.is_empty():
        st.info("No embedding statistics for these runs: log them with run.log_embeddings(key, z), "
                "or TrackerCallback with a LightningModule that exposes tracker_embeddings.")
        return
    names = sorted(keys["key"].unique().to_list())
    key = st.selectbox("Embedding", names, index=0, key="embeddings.key") if len(names) > 1 else names[0]
    view = _view(home, tuple(run_ids), key)
    labels = queries.run_labels(view.info)
    dims = keys.filter(pl.col("key") == key)
    st.caption(" · ".join(f"{labels.get(r, r)}: D = {d}, window {w:,}" for r, d, w in
                          dims.select("run_id", "dim", "window").rows()))
    if not view.events.is_empty():
        st.caption(f"{view.events.height} collapse event(s) marked in red; hover a mark for its message.")
    for column, stat in zip(st.columns(len(STATISTICS)), STATISTICS):
        with column:
            st.altair_chart(statistic_chart(view.points, view.events, labels, stat), width="stretch",
                            key=f"embeddings.chart.{stat}")
    if not view.events.is_empty():
        st.subheader("Collapse events")
        st.dataframe(view.events.with_columns(pl.col("run_id").replace_strict(labels, default=pl.col("run_id"))
                                              .alias("run")).select("run", "rank", "step", "stat", "message"),
                     hide_index=True, key="embeddings.events")


page()
