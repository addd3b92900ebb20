"""Plugins add pages through tracker_register_panels; a fresh host registers one."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import streamlit as st

from tracker import hookimpl
from tracker.host import Host, make_plugin_manager, set_host
from webui.panels import Panel


def say_hello() -> None:
    st.markdown("hello from a plugin panel")
    st.metric("runs seen", 3)


def fail() -> None:
    raise RuntimeError("panel exploded")


class PanelPlugin:
    def __init__(self, panel: Panel):
        self.panel = panel

    @hookimpl
    def tracker_register_panels(self, register: Callable[[Any], None]) -> None:
        register(self.panel)


@pytest.fixture
def with_panel(store_home: Path) -> Iterator[Callable[[Panel], None]]:
    old: list[Host | None] = []

    def install(panel: Panel) -> None:
        pm = make_plugin_manager(default_plugins=("plugins.store_logger",), entry_points=False)
        pm.register(PanelPlugin(panel), name="panel_plugin")
        old.append(set_host(Host(pm)))

    yield install
    if old:
        set_host(old[0])


@pytest.fixture
def open_panel(app_page: Callable[..., Any]) -> Callable[[], Any]:
    """Run the app (the router learns the registered panels), then switch to the panel page."""

    def _open() -> Any:
        at = app_page()
        at.switch_page("views/panel.py").run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    return _open


def test_a_registered_panel_gets_its_page(with_panel: Callable[[Panel], None],
                                          open_panel: Callable[[], Any]) -> None:
    with_panel(Panel(name="hello", title="Hello panel", render=say_hello))
    from webui.panels import PanelPage, panel_specs

    assert panel_specs() == [PanelPage("hello", "Hello panel", "panel-hello")]
    at = open_panel()
    assert [m.value for m in at.markdown] == ["hello from a plugin panel"]
    assert at.metric[0].value == "3"


def test_a_failing_panel_shows_its_error_and_the_app_lives(with_panel: Callable[[Panel], None],
                                                          open_panel: Callable[[], Any]) -> None:
    with_panel(Panel(name="broken", title="Broken", render=fail))
    at = open_panel()
    assert "Panel 'broken' failed: RuntimeError: panel exploded" in at.error[0].value
    at.switch_page("views/runs.py").run()
    assert not at.exception and len(at.dataframe[0].value) == 3


def test_a_panel_without_a_name_is_refused_by_the_host(store_home: Path) -> None:
    pm = make_plugin_manager(default_plugins=(), entry_points=False)
    pm.register(PanelPlugin(Panel(name="no spaces allowed", title="x", render=say_hello)), name="bad_panels")
    host = Host(pm)
    assert host.items("panels") == {}
    assert "bad_panels" in host.failures
