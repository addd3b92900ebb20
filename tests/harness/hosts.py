"""A test's own plugin host: just the named plugins, no entry points, installed for the test."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from tracker.host import Host, make_plugin_manager, set_host


def host_fixture(*plugins: str) -> Any:
    """A ``host`` fixture of a fresh host of ``plugins`` only, the process-wide host while the test runs.

    In a test module: ``host = host_fixture("plugins.losses")``.
    """

    @pytest.fixture
    def host() -> Iterator[Host]:
        """A fresh host of just the module's plugins (no entry points), installed for the test."""
        fresh = Host(make_plugin_manager(default_plugins=plugins, entry_points=False))
        old = set_host(fresh)
        yield fresh
        set_host(old)

    return host
