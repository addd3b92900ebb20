"""A real browser draws the Embeddings page: `tracker ui`'s command serves it, headless Chromium opens it.

The store holds a collapsing and a healthy run (``log_pair`` of the page's AppTest);
the page must draw its three charts with both runs' lines, mark the collapse, and
show no exception. The screenshot goes to ``artifacts/embeddings.png``. With
``UPDATE_SCREENSHOT=1`` the runs are real ones instead, SimSiam on digits with and
without its stop-gradient trained with Lightning (``bench.ssl_digits``), and the
screenshot is copied to ``docs/embeddings.png`` for the README.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pytest

from webui.browser import wait_charts

UPDATE = os.environ.get("UPDATE_SCREENSHOT") == "1"

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _runs(home: Path) -> list[str]:
    """Log the two runs under ``home``; their ids, collapsing first."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACKER_HOME", str(home))
        mp.setenv("TRACKER_SYSTEM", "0")
        mp.setenv("TRACKER_LOGGERS", "store")
        if not UPDATE:
            from tests.webui.test_webui_embeddings import log_pair

            log_pair()
            return ["collapsing", "healthy"]
        from bench.ssl_digits import train

        return [train(method, steps=400, seed=0).run_id for method in ("simsiam_nostop", "simsiam")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory,
           app_server: Callable[[Path], str]) -> tuple[str, list[str]]:
    home = tmp_path_factory.mktemp("embeddings-browser") / "home"
    run_ids = _runs(home)
    return app_server(home), run_ids


def test_embeddings_page_draws_in_chromium(server: tuple[str, list[str]], chromium: Callable[..., Any],
                                           screenshot: Callable[..., Path]) -> None:
    url, run_ids = server
    page = chromium(1500, 760).new_page()
    page.goto(f"{url}/embeddings?" + "&".join(f"run={r}" for r in run_ids), wait_until="domcontentloaded")
    wait_charts(page, 3, "ink.every(v => v >= 2)")
    assert page.get_by_role("heading", name="Embeddings").count() == 1
    assert page.get_by_role("heading", name="Collapse events").count() == 1
    assert page.locator('[data-testid="stException"]').count() == 0
    screenshot(page, "embeddings.png", full_page=True)  # copied to docs/ with UPDATE_SCREENSHOT=1
