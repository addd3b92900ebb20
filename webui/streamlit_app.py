"""The tracker web UI: a router over the pages in ``webui/views`` and the plugins' panels.

Run it with ``streamlit run webui`` (or ``tracker ui``); the store is the one under
``TRACKER_HOME``. Plugins add pages through ``tracker_register_panels(register)``:
a panel has a ``name`` (its URL path), a ``title`` and a ``render()`` callable.
Each panel is served by ``views/panel.py`` under the URL path ``panel-<name>``.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from webui.panels import PANEL_KEY, panel_pages, panel_specs

HERE = Path(__file__).parent


def build_pages() -> dict[str, list[st.Page]]:
    """The navigation: the core pages, then one page per registered panel."""
    pages = {
        "Runs": [
            st.Page(HERE / "views" / "runs.py", title="Runs", icon=":material/table_rows:", url_path="runs",
                    default=True),
        ],
        "Analysis": [
            st.Page(HERE / "views" / "curves.py", title="Curves", icon=":material/show_chart:", url_path="curves"),
            st.Page(HERE / "views" / "classes.py", title="Per class", icon=":material/grid_on:", url_path="classes"),
            st.Page(HERE / "views" / "events.py", title="Events", icon=":material/flag:", url_path="events"),
            st.Page(HERE / "views" / "system.py", title="System", icon=":material/memory:", url_path="system"),
            st.Page(HERE / "views" / "embeddings.py", title="Embeddings", icon=":material/scatter_plot:",
                    url_path="embeddings"),
            st.Page(HERE / "views" / "sql.py", title="SQL", icon=":material/database:", url_path="sql"),
        ],
    }
    plugin_pages = panel_pages(HERE / "views" / "panel.py")
    if plugin_pages:
        pages["Plugins"] = [page for page, _ in plugin_pages]
    return pages


def main() -> None:
    """Route to the current page; tell a panel page which panel it serves."""
    st.set_page_config(page_title="tracker", page_icon=":material/monitoring:", layout="wide")
    pages = build_pages()
    current = st.navigation(pages)
    served = {spec.url_path: spec.name for spec in panel_specs()}
    st.session_state[PANEL_KEY] = served.get(current.url_path)
    current.run()


main()
