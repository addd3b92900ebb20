"""A real browser draws the System page: `tracker ui`'s command serves it, headless Chromium opens it.

The store holds one run with a memory leak (its memory_growth event) logged as the
sampler would; the page must draw its memory chart (at least three lines) and its
time chart (one) without an exception, and a
screenshot goes to ``artifacts/system.png``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

import tracker
from tracker.analysis.system_corpus import system_cases
from tracker.commands.ui import app_env, streamlit_command

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic"]
INK = """(el) => {
  if (el.tagName.toLowerCase() === 'svg') {
    return el.querySelectorAll('g.mark-line path').length;
  }
  const data = el.getContext('2d').getImageData(0, 0, el.width, el.height).data;
  let ink = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (data[i + 3] > 0 && (data[i] < 200 || data[i + 1] < 200 || data[i + 2] < 200)) ink++;
  }
  return Math.floor(ink / 500);
}"""

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
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
    port = _port()
    proc = subprocess.Popen(streamlit_command(port) + ["--server.fileWatcherType", "none"], env=app_env(home),
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"streamlit exited with status {proc.returncode}"
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                assert time.monotonic() < deadline, "streamlit did not answer within 90 s"
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_system_page_draws_in_chromium(server: str, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}; install it with `bash scripts/apt-deps.sh browser` or set CHROMIUM")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                        headless=True, args=FLAGS,
                                                        viewport={"width": 1400, "height": 1400})
        try:
            page = context.new_page()
            page.goto(f"{server}/system?run=leaky", wait_until="domcontentloaded")
            page.wait_for_function("() => document.querySelectorAll('.vega-embed').length >= 2", timeout=90_000)
            sel = ".vega-embed canvas, .vega-embed svg.marks"
            page.wait_for_function(
                f"(sel) => {{ const ink = Array.from(document.querySelectorAll(sel)).map({INK});"
                " return ink.length >= 2 && ink[0] >= 3 && ink[1] >= 1; }",
                arg=sel, timeout=30_000)
            assert page.get_by_role("heading", name="System").count() == 1
            assert page.get_by_role("heading", name="Memory").count() == 1
            assert page.locator('[data-testid="stException"]').count() == 0
            artifacts = ROOT / "artifacts"
            artifacts.mkdir(exist_ok=True)
            page.screenshot(path=str(artifacts / "system.png"), full_page=True)
            assert (artifacts / "system.png").stat().st_size > 10_000
        finally:
            context.close()
