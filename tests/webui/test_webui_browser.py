"""A real browser: `tracker ui`'s command serves the app, headless Chromium draws its pages.

Chromium is Debian's (``scripts/apt-deps.sh browser`` installs it; ``$CHROMIUM``
overrides the path), driven through Playwright's Python package. The curves page is
opened by URL with two runs preselected; the test checks that vega-embed drew a
chart (its SVG holds the band and line of both runs, or its canvas has ink) and
saves a screenshot to ``artifacts/curves.png`` (and to ``docs/curves.png`` when
``UPDATE_SCREENSHOT=1``, for the README). Brushing a step range on the chart must
zoom the page (a rerun that re-queries the range), and the other pages must draw
without an exception.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import tracker
from tracker.commands.ui import app_env, streamlit_command

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic",
]
CHART = ".vega-embed canvas, .vega-embed svg.marks"
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


def seed_showcase(home: Path) -> None:
    """Two noisy runs for the screenshot; the second is stopped at 2,100 and resumed at 1,800."""
    rng = np.random.default_rng(7)

    def loss(step: int, scale: float) -> float:
        return float(scale * (0.35 + 2.2 * np.exp(-step / 600)) * (1 + 0.08 * rng.standard_normal()))

    common = {"home": home, "loggers": ["store"], "config": {"analysis": False}}
    for run_id, name, scale, last in (("show-bce", "bce", 1.0, 3000), ("show-cw", "cw-bce + rfs", 0.8, 2100)):
        run = tracker.init("yolo", name=name, run_id=run_id, **common)
        for step in range(last):
            run.log({"loss/total": loss(step, scale)}, step=step)
        run.finish("finished" if last == 3000 else "killed")
    run = tracker.init("yolo", run_id="show-cw", resume="allow", resume_step=1800, **common)
    for step in range(1800, 3000):
        run.log({"loss/total": loss(step, 0.75)}, step=step)
    run.finish()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"streamlit exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"streamlit did not answer on {url} within {timeout:.0f} s")


@pytest.fixture(scope="module")
def server(seeded_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("browser") / "home"
    shutil.copytree(seeded_template, home)
    seed_showcase(home)
    port = free_port()
    cmd = streamlit_command(port) + ["--server.fileWatcherType", "none"]
    proc = subprocess.Popen(cmd, env=app_env(home), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}; install it with `bash scripts/apt-deps.sh browser` or set CHROMIUM")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
            args=FLAGS, viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def browser_page(browser: Any) -> Iterator[Any]:
    page = browser.new_page()
    try:
        yield page
    finally:
        page.close()


def test_curves_page_draws_in_chromium(server: str, browser_page: Any) -> None:
    page = browser_page
    page.goto(f"{server}/curves?run=show-cw&run=show-bce&key=loss/total&smooth=0.8", wait_until="domcontentloaded")
    chart = page.wait_for_selector(CHART, state="visible", timeout=90_000)
    page.wait_for_function(f"(sel) => {{ const el = document.querySelector(sel); return el && ({DRAWN})(el) >= 4; }}",
                           arg=CHART, timeout=30_000)
    assert chart.evaluate(DRAWN) >= 4  # a band and a line for each of the two runs
    assert page.get_by_role("heading", name="Curves").count() == 1
    assert page.locator('[data-testid="stException"]').count() == 0
    page.wait_for_timeout(500)
    artifacts = ROOT / "artifacts"
    artifacts.mkdir(exist_ok=True)
    shot = artifacts / "curves.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get("UPDATE_SCREENSHOT") == "1":
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copyfile(shot, ROOT / "docs" / "curves.png")


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
