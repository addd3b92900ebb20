"""Streamlit glue shared by the pages: the store, cached loaders, the run selection.

Rules:

* The app never keeps a DuckDB connection: the store is rebuilt from
  ``TRACKER_HOME`` (cheap, no I/O) and every loader opens a short reader.
* Results are cached with ``st.cache_data``: 2 s while a run is live (``live=True``),
  30 s otherwise. Loaders are named functions of :mod:`webui.queries` and
  :mod:`webui.class_queries`, called with plain, hashable arguments.
* The selected runs live in ``st.session_state["tracker.runs"]`` so every page sees
  what the Runs page selected. A URL with ``?run=<id>&run=<id>`` selects those runs,
  and the pages write their selection back to the URL, so a link reopens the view.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import streamlit as st

from tracker.store import Store
from webui import class_queries, grouped, queries

RUNS = "tracker.runs"
LIVE_TTL_S = 2
STATIC_TTL_S = 30
REFRESH_S = 2

_LOADERS: dict[str, Callable[..., Any]] = {
    "runs_table": queries.runs_table,
    "run_list": queries.run_list,
    "run_info": queries.run_info,
    "curve_context": queries.curve_context,
    "step_bounds": queries.step_bounds,
    "curve": queries.curve,
    "curve_view": queries.curve_view,
    "running": queries.running,
    "events_table": queries.events_table,
    "schema_info": queries.schema_info,
    "class_keys": class_queries.class_keys,
    "class_view": class_queries.class_view,
    "group_bands": grouped.group_bands,
    "group_config_keys": grouped.config_keys,
    "lineage": grouped.lineage,
}


def store() -> Store:
    """The store under ``TRACKER_HOME`` (a plain object; it holds no connection)."""
    return Store()


def _call(home: str, name: str, args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...]) -> Any:
    return _LOADERS[name](Store(home), *args, **dict(kwargs))


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False, max_entries=512)
def _load_live(home: str, name: str, args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...]) -> Any:
    return _call(home, name, args, kwargs)


@st.cache_data(ttl=STATIC_TTL_S, show_spinner=False, max_entries=512)
def _load_static(home: str, name: str, args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...]) -> Any:
    return _call(home, name, args, kwargs)


def load(name: str, *args: Any, live: bool = False, **kwargs: Any) -> Any:
    """Call loader ``name`` with ``args`` on the store, through the cache."""
    fn = _load_live if live else _load_static
    return fn(str(store().home), name, args, tuple(sorted(kwargs.items())))


def all_runs() -> list[dict[str, Any]]:
    """Every run (id, name, project, status, tags), newest first; cached for 2 s."""
    return load("run_list", live=True).to_dicts()


def _apply_link(options: Sequence[str]) -> None:
    linked = st.query_params.get_all("run")
    if linked and linked != st.session_state.get("_tracker.linked"):
        st.session_state[RUNS] = [r for r in linked if r in options]
        st.session_state["_tracker.linked"] = linked


def selected_runs(options: Sequence[str]) -> list[str]:
    """The runs selected so far (by a link, the Runs page or another page), among ``options``."""
    _apply_link(options)
    return [r for r in st.session_state.get(RUNS, []) if r in options]


def set_selected_runs(run_ids: Sequence[str]) -> None:
    """Make ``run_ids`` the selection every page starts from, and put it in the URL."""
    st.session_state[RUNS] = list(run_ids)
    st.session_state["_tracker.linked"] = list(run_ids)
    st.query_params["run"] = list(run_ids)


def run_picker(*, multi: bool = True, label: str = "Runs", default_all: bool = False) -> list[str]:
    """A sidebar picker of runs seeded with the selection; returns the runs picked.

    With nothing selected yet it starts from the newest run (every run with
    ``default_all``). A single picker (``multi=False``) moves its run to the front of the selection
    and keeps the others, so the multi-run pages still see them.
    """
    runs = all_runs()
    options = [r["run_id"] for r in runs]
    names = {r["run_id"]: f"{r['name']} · {r['status']}" for r in runs}
    fresh = RUNS not in st.session_state and not st.query_params.get_all("run")
    chosen = (list(options) if default_all else options[:1]) if fresh else selected_runs(options)
    if multi:
        picked = st.sidebar.multiselect(label, options, default=chosen, format_func=lambda r: names.get(r, r))
        if picked != chosen:
            set_selected_runs(picked)
        return picked
    first = chosen[0] if chosen else (options[0] if options else None)
    one = st.sidebar.selectbox(
        label, options, index=options.index(first) if first in options else None,
        format_func=lambda r: names.get(r, r),
    )
    if one is not None and one != first:
        set_selected_runs([one, *(r for r in chosen if r != one)])
    return [one] if one is not None else []


def picked_runs() -> tuple[list[str], bool]:
    """The runs picked in the sidebar and whether one of them is running; with none picked, say so and stop the page."""
    run_ids = run_picker()
    if not run_ids:
        st.info("Pick one or more runs in the sidebar.")
        st.stop()
    return run_ids, load("running", run_ids, live=True)


def query_param(name: str, default: str | None = None) -> str | None:
    """One URL query parameter (the last value when repeated)."""
    values = st.query_params.get_all(name)
    return values[-1] if values else default


def int_param(name: str) -> int | None:
    """A URL query parameter as an int, None when absent or not a number."""
    raw = query_param(name)
    try:
        return int(float(raw)) if raw is not None else None
    except ValueError:
        return None


def refresh_every(live: bool) -> int | None:
    """The fragment refresh period: every 2 s while a shown run is running."""
    return REFRESH_S if live else None
