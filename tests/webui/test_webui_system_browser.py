"""A real browser draws the System page: `tracker ui`'s command serves it, headless Chromium opens it.

The store holds one run with a memory leak (its memory_growth event) logged as the
sampler would; the page must draw its memory chart (at least three lines) and its
time chart (one) without an exception, and a
screenshot goes to ``artifacts/system.png``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

import tracker
from tracker.analysis.system_corpus import system_cases
from webui.browser import wait_charts

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, app_server: Callable[[Path], str]) -> str:
    home = tmp_path_factory.mktemp("system-browser") / "home"
    case = next(c for c in system_cases(1, seed=11) if c.kind == "leak")
    run = tracker.init("sys", name="leaky", run_id="leaky", system=False, home=home, loggers=["store"],
                       config=case.config)
    rows: dict[int, dict[str, float]] = {}
    for key, (steps, values) in case.series.items():
        if key != "sys/data_time":
            for s, v in zip(steps.tolist(), values.tolist()):
                rows.setdefault(s, {})[key] = v
    for step in sorted(rows):
        run.log(rows[step], step=step)
    run.finish()
    return app_server(home)


def test_system_page_draws_in_chromium(server: str, chromium: Callable[..., Any],
                                       screenshot: Callable[..., Path]) -> None:
    page = chromium(1400, 1400).new_page()
    page.goto(f"{server}/system?run=leaky", wait_until="domcontentloaded")
    wait_charts(page, 2, "ink[0] >= 3 && ink[1] >= 1")
    assert page.get_by_role("heading", name="System").count() == 1
    assert page.get_by_role("heading", name="Memory").count() == 1
    assert page.locator('[data-testid="stException"]').count() == 0
    screenshot(page, "system.png", full_page=True, docs=False)
