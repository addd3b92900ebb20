"""The grouped chart in Chromium: the quick demo's training with two weighting schemes
(plain BCE, effective-number weighted BCE) over three sampler seeds each, grouped by
``loss.scheme`` with a ±std band. Saves ``artifacts/grouped-bands.png`` (copied to
docs/ with UPDATE_SCREENSHOT=1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from webui.browser import CHART

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SEEDS = (1, 2, 3)
STEPS = 90


def _train(home: Path) -> list[str]:
    from tracker import demo

    data = demo.make_dataset()
    weighted = {"scheme": "effective_number", "beta": 0.999, "counts": data.counts.tolist()}
    ids = []
    for scheme, params in (("plain", {"scheme": "none"}), ("weighted", weighted)):
        for seed in SEEDS:
            run_id = f"{scheme}-s{seed}"
            demo.train(data, run_id=run_id, name=f"{scheme} BCE seed {seed}", loss_params=params, threshold=1e-9,
                       steps=STEPS, backend="numpy", home=str(home), seed=seed)
            ids.append(run_id)
    return ids


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, app_server: Callable[[Path], str]) -> tuple[str, list[str]]:
    home = tmp_path_factory.mktemp("grouped-browser") / "home"
    ids = _train(home)
    return app_server(home), ids


def test_grouped_bands_of_two_weighting_schemes_draw_in_chromium(served: tuple[str, list[str]],
                                                                 chromium: Callable[..., Any],
                                                                 screenshot: Callable[..., Path]) -> None:
    url, ids = served
    runs = "&".join(f"run={r}" for r in ids)
    page = chromium(1400, 1000).new_page()
    page.goto(f"{url}/curves?{runs}&key=loss/total&group=loss.scheme&band=std", wait_until="domcontentloaded")
    page.wait_for_selector(CHART, state="visible", timeout=90_000)
    legend = page.get_by_text("loss.scheme=none (n=3)")
    legend.first.wait_for(timeout=30_000)
    assert page.get_by_text("loss.scheme=effective_number (n=3)").count() >= 1
    assert page.locator('[data-testid="stException"]').count() == 0
    page.wait_for_timeout(500)
    screenshot(page, "grouped-bands.png", scale=0.75)
