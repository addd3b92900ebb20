"""A real browser: `tracker ui`'s command serves the app, headless Chromium draws its pages.

Chromium is Debian's (``scripts/apt-deps.sh browser`` installs it; ``$CHROMIUM``
overrides the path), driven through Playwright's Python package, in a 1400 x 1000
window. The curves page is opened by URL with two runs preselected, on every x axis
(step, wall time, relative time); the test checks that vega-embed drew a chart (its
SVG holds the band and line of both runs, or its canvas has ink) and that no
exception is shown. Brushing a step range on the chart must zoom the page (a rerun
that re-queries the range). Every page is opened on the 80-class run too, and no
chart may be wider than its column (a clipped legend). Screenshots go to
``artifacts/`` (and to ``docs/`` when ``UPDATE_SCREENSHOT=1``, for the README):
``curves.png`` (step axis), ``curves-wall-time.png`` and ``per-class.png`` (the quick
demo's weighted run, trained here with ``tracker.demo.run_quick``).

The showcase runs are logged against a simulated clock (1.2 s a step; ``show-cw``
stopped at step 2,100 for 25 minutes, then resumed at 1,800), so the time axes have
a stop to show.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import tracker
from webui.browser import CHART

DRAWN = """(el) => {
  if (el.tagName.toLowerCase() === 'svg') {
    const marks = el.querySelectorAll('g.mark-line path, g.mark-area path');
    return Array.from(marks).filter(p => (p.getAttribute('d') || '').length > 200).length;
  }
  const ctx = el.getContext('2d');
  const data = ctx.getImageData(0, 0, el.width, el.height).data;
  let ink = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (data[i + 3] > 0 && (data[i] < 200 || data[i + 1] < 200 || data[i + 2] < 200)) ink++;
  }
  return Math.floor(ink / 500);
}"""

pytestmark = [pytest.mark.browser, pytest.mark.slow]


class SimulatedClock(ModuleType):
    """Stands in for the ``time`` module of ``tracker.run``: ``time()`` returns ``now``."""

    def __init__(self, start: float) -> None:
        super().__init__("time")
        self.now = start

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def seed_showcase(home: Path) -> None:
    """Two noisy runs for the screenshots; the second is stopped at 2,100 and resumed at 1,800.

    Wall times follow a simulated clock (see module doc); ``show-bce`` has one NaN
    (at step 2,400) and both have a few events, to be marked on the curves.
    """
    import tracker.run as run_module

    rng = np.random.default_rng(7)

    def loss(step: int, scale: float) -> float:
        return float(scale * (0.35 + 2.2 * np.exp(-step / 600)) * (1 + 0.08 * rng.standard_normal()))

    clock = SimulatedClock(1_764_500_000.0)  # 2025-11-30 10:53 UTC
    common = {"home": home, "loggers": ["store"], "config": {"analysis": False}}
    real, run_module.time = run_module.time, clock
    try:
        for run_id, name, scale, last in (("show-bce", "bce", 1.0, 3000), ("show-cw", "cw-bce + rfs", 0.8, 2100)):
            clock.now = 1_764_500_000.0 + (30 if run_id == "show-cw" else 0)
            run = tracker.init("yolo", name=name, run_id=run_id, **common)
            for step in range(last):
                clock.now += 1.2
                value = float("nan") if run_id == "show-bce" and step == 2400 else loss(step, scale)
                run.log({"loss/total": value}, step=step)
            if run_id == "show-bce":
                run.event("nan", "loss/total is NaN (fp16 overflow?)", step=2400, key="loss/total", severity="error")
                run.event("spike", "loss/total spiked 2.6x above its smoothed value", step=700, key="loss/total",
                          severity="warning")
            run.finish("finished" if last == 3000 else "killed")
        clock.now += 25 * 60
        run = tracker.init("yolo", run_id="show-cw", resume="allow", resume_step=1800, **common)
        for step in range(1800, 3000):
            clock.now += 1.2
            run.log({"loss/total": loss(step, 0.75)}, step=step)
        run.event("note", "learning rate lowered to 0.005 on resume", step=1800, key="loss/total", severity="info")
        run.finish()
    finally:
        run_module.time = real


@pytest.fixture(scope="module")
def server(seeded_template: Path, tmp_path_factory: pytest.TempPathFactory, seeders: Any,
           app_server: Callable[[Path], str]) -> str:
    home = tmp_path_factory.mktemp("browser") / "home"
    shutil.copytree(seeded_template, home)
    seed_showcase(home)
    seeders.coco(home)
    from tracker import demo

    demo.run_quick(400, str(home), "shot", say=lambda line: None)  # the quick demo's three runs, 80 classes
    return app_server(home)


@pytest.fixture(scope="module")
def browser(chromium: Callable[..., Any]) -> Any:
    return chromium(1400, 1000)


@pytest.fixture
def browser_page(browser: Any) -> Iterator[Any]:
    page = browser.new_page()
    try:
        yield page
    finally:
        page.close()


def test_curves_page_draws_in_chromium(server: str, browser_page: Any, screenshot: Any) -> None:
    page = browser_page
    page.goto(f"{server}/curves?run=show-cw&run=show-bce&key=loss/total&smooth=0.8", wait_until="domcontentloaded")
    chart = page.wait_for_selector(CHART, state="visible", timeout=90_000)
    page.wait_for_function(f"(sel) => {{ const el = document.querySelector(sel); return el && ({DRAWN})(el) >= 4; }}",
                           arg=CHART, timeout=30_000)
    assert chart.evaluate(DRAWN) >= 4  # a band and a line for each of the two runs
    assert page.get_by_role("heading", name="Curves").count() == 1
    assert page.locator('[data-testid="stException"]').count() == 0
    page.wait_for_timeout(500)
    screenshot(page, "curves.png", scale=0.75)


def test_brushing_the_chart_zooms_at_full_detail(server: str, browser_page: Any) -> None:
    page = browser_page
    page.goto(f"{server}/curves?run=run-bce&key=loss/total", wait_until="domcontentloaded")
    chart = page.wait_for_selector(CHART, state="visible", timeout=90_000)
    thumbs = page.locator('[data-testid="stSliderThumbValue"]')
    page.wait_for_function("() => document.querySelectorAll('[data-testid=\"stSliderThumbValue\"]').length >= 4")
    assert thumbs.all_inner_texts()[-2:] == ["0", "299"]
    box = chart.bounding_box()
    y = box["y"] + box["height"] * 0.4
    page.mouse.move(box["x"] + box["width"] * 0.4, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=12)
    page.mouse.up()
    page.wait_for_function(
        "() => { const t = document.querySelectorAll('[data-testid=\"stSliderThumbValue\"]');"
        " return t.length >= 4 && t[t.length - 1].innerText !== '299'; }", timeout=30_000)
    lo, hi = (int(v) for v in thumbs.all_inner_texts()[-2:])
    assert 0 < lo < hi < 299 and hi - lo < 150
    assert page.locator('[data-testid="stException"]').count() == 0


OVERFLOW = """() => Array.from(document.querySelectorAll('.vega-embed')).filter(
  el => el.scrollWidth > el.clientWidth + 2 || el.getBoundingClientRect().right > window.innerWidth + 2).length"""


def wait_drawn(page: Any, minimum: int) -> Any:
    chart = page.wait_for_selector(CHART, state="visible", timeout=90_000)
    page.wait_for_function(
        f"(sel) => {{ const el = document.querySelector(sel); return el && ({DRAWN})(el) >= {minimum}; }}",
        arg=CHART, timeout=30_000)
    return chart


@pytest.mark.parametrize("axis", ["step", "wall time", "relative time (s)"])
def test_curves_page_draws_on_every_x_axis(server: str, browser_page: Any, axis: str, screenshot: Any) -> None:
    page = browser_page
    x = axis.replace(" ", "+").replace("(", "%28").replace(")", "%29")
    page.goto(f"{server}/curves?run=show-cw&run=show-bce&key=loss/total&smooth=0.8&x={x}",
              wait_until="domcontentloaded")
    chart = wait_drawn(page, 4)
    assert chart.evaluate(DRAWN) >= 4
    radio = page.locator('[data-testid="stRadio"]').filter(has_text="x axis")
    assert radio.get_by_role("radio", name=axis).is_checked()
    page.wait_for_timeout(500)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert page.evaluate(OVERFLOW) == 0
    if axis == "wall time":
        screenshot(page, "curves-wall-time.png", scale=0.75)


@pytest.mark.parametrize("path", ["classes?run=demo-shot-weighted", "classes?run=run-coco",
                                  "curves?run=demo-shot-overwrite&run=demo-shot-weighted&x=wall+time",
                                  "events?run=demo-shot-overwrite", "curves?run=run-coco&x=wall+time",
                                  "curves?run=run-coco&x=relative+time+%28s%29", "events?run=run-coco",
                                  "runs?run=run-coco", "sql?run=run-coco"])
def test_every_page_at_80_classes(server: str, browser_page: Any, path: str, screenshot: Any) -> None:
    page = browser_page
    page.goto(f"{server}/{path}", wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stMainBlockContainer"] h1', timeout=90_000)
    if path.startswith(("classes", "curves")):
        count = 4 if path.startswith("classes") else 1
        page.wait_for_function(f"() => document.querySelectorAll('.vega-embed').length >= {count}", timeout=60_000)
        wait_drawn(page, 1)
    else:
        page.wait_for_selector('[data-testid="stMain"] [data-testid="stMarkdownContainer"]', timeout=60_000)
    page.wait_for_timeout(1500)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert page.evaluate(OVERFLOW) == 0  # no chart (or its legend) wider than its column
    if path == "classes?run=demo-shot-weighted":  # the whole page: the app scrolls inside its own container
        height = page.evaluate("() => document.querySelector('[data-testid=\"stMainBlockContainer\"]').scrollHeight")
        page.set_viewport_size({"width": 1400, "height": int(height) + 120})
        page.wait_for_timeout(2000)
        assert page.evaluate(OVERFLOW) == 0
        bottom = page.evaluate("() => Math.max(...Array.from(document.querySelectorAll("
                               "'[data-testid=\"stMainBlockContainer\"] [data-testid=\"stElementContainer\"]'))"
                               ".map(el => el.getBoundingClientRect().bottom))")
        screenshot(page, "per-class.png", scale=0.6, clip={"x": 0, "y": 0, "width": 1400, "height": bottom + 30})


@pytest.mark.parametrize("path, charts", [("classes?run=run-w", 4), ("events?run=run-w", 0), ("sql", 0), ("", 0)])
def test_other_pages_render_without_errors(server: str, browser_page: Any, path: str, charts: int) -> None:
    page = browser_page
    page.goto(f"{server}/{path}", wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stMainBlockContainer"] h1', timeout=90_000)
    if charts:
        page.wait_for_function(f"() => document.querySelectorAll('.vega-embed').length >= {charts}",
                               timeout=60_000)
    else:
        page.wait_for_selector('[data-testid="stDataFrame"]', timeout=60_000)
    assert page.locator('[data-testid="stException"]').count() == 0
