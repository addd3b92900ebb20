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
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

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
UPDATE = os.environ.get("UPDATE_SCREENSHOT") == "1"

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    home = tmp_path_factory.mktemp("embeddings-browser") / "home"
    run_ids = _runs(home)
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
        yield url, run_ids
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_embeddings_page_draws_in_chromium(server: tuple[str, list[str]], tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}; install it with `bash scripts/apt-deps.sh browser` or set CHROMIUM")
    from playwright.sync_api import sync_playwright

    url, run_ids = server
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                        headless=True, args=FLAGS,
                                                        viewport={"width": 1500, "height": 760})
        try:
            page = context.new_page()
            page.goto(f"{url}/embeddings?" + "&".join(f"run={r}" for r in run_ids), wait_until="domcontentloaded")
            page.wait_for_function("() => document.querySelectorAll('.vega-embed').length >= 3", timeout=90_000)
            sel = ".vega-embed canvas, .vega-embed svg.marks"
            page.wait_for_function(
                f"(sel) => {{ const ink = Array.from(document.querySelectorAll(sel)).map({INK});"
                " return ink.length >= 3 && ink.every(v => v >= 2); }",
                arg=sel, timeout=30_000)
            assert page.get_by_role("heading", name="Embeddings").count() == 1
            assert page.get_by_role("heading", name="Collapse events").count() == 1
            assert page.locator('[data-testid="stException"]').count() == 0
            artifacts = ROOT / "artifacts"
            artifacts.mkdir(exist_ok=True)
            shot = artifacts / "embeddings.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            if UPDATE:
                shutil.copyfile(shot, ROOT / "docs" / "embeddings.png")
        finally:
            context.close()
