"""Pages added by plugins through ``tracker_register_panels(register)``.

A panel is any object with a ``name`` (letters, digits, ``_ . -``), a ``title`` and a
``render()`` callable that draws the page with Streamlit. The router serves every
panel with ``views/panel.py`` under the URL path ``panel-<name>``; a panel whose
``render()`` raises shows the error on its page and leaves the rest of the app alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import streamlit as st

from tracker.host import get_host

PANEL_KEY = "tracker.panel"


@dataclass
class Panel:
    """A simple panel record plugins may use: ``register(Panel("name", "Title", render))``."""

    name: str
    title: str
    render: Callable[[], Any]


def registered() -> dict[str, Any]:
    """The panels registered by plugins, by name."""
    return get_host().items("panels")


@dataclass(frozen=True)
class PanelPage:
    """Where a panel appears in the navigation."""

    name: str
    title: str
    url_path: str


def panel_specs() -> list[PanelPage]:
    """The navigation entries of the registered panels, by name."""
    return [
        PanelPage(name, str(getattr(panel, "title", name)), f"panel-{name}")
        for name, panel in sorted(registered().items())
    ]


def panel_pages(script: Path) -> list[tuple[st.Page, str]]:
    """One ``st.Page`` per panel (served by ``script``), with the panel's name."""
    return [
        (st.Page(script, title=spec.title, icon=":material/extension:", url_path=spec.url_path), spec.name)
        for spec in panel_specs()
    ]


def render_current() -> None:
    """Draw the panel the router chose for this page."""
    name = st.session_state.get(PANEL_KEY)
    panels = registered()
    panel = panels.get(name) if name else None
    if panel is None:
        st.error(f"No panel {name!r}; available: {', '.join(sorted(panels)) or 'none'}")
        return
    try:
        panel.render()
    except Exception as exc:  # a broken plugin page must not break the app
        st.error(f"Panel {name!r} failed: {type(exc).__name__}: {exc}")
