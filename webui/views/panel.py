"""A plugin's panel (see ``webui/panels.py``)."""

from __future__ import annotations

from webui.panels import render_current

render_current()
