"""The grouped chart in Chromium: the quick demo's training with two weighting schemes
(plain BCE, effective-number weighted BCE) over three sampler seeds each, grouped by
``loss.scheme`` with a ±std band. Saves ``artifacts/grouped-bands.png`` (copied to
docs/ with UPDATE_SCREENSHOT=1)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tracker.commands.ui import app_env, streamlit_command

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic"]
CHART = ".vega-embed canvas, .vega-embed svg.marks"
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


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 90.0) -> None:
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
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    home = tmp_path_factory.mktemp("grouped-browser") / "home"
    ids = _train(home)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    proc = subprocess.Popen(streamlit_command(port) + ["--server.fileWatcherType", "none"], env=app_env(home),
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield url, ids
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_grouped_bands_of_two_weighting_schemes_draw_in_chromium(served: tuple[str, list[str]],
                                                                 tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}; install it with `bash scripts/apt-deps.sh browser` or set CHROMIUM")
    from PIL import Image
    from playwright.sync_api import sync_playwright

    url, ids = served
    runs = "&".join(f"run={r}" for r in ids)
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                        headless=True, args=FLAGS,
                                                        viewport={"width": 1400, "height": 1000})
        try:
            page = context.new_page()
            page.goto(f"{url}/curves?{runs}&key=loss/total&group=loss.scheme&band=std", wait_until="domcontentloaded")
            page.wait_for_selector(CHART, state="visible", timeout=90_000)
            legend = page.get_by_text("loss.scheme=none (n=3)")
            legend.first.wait_for(timeout=30_000)
            assert page.get_by_text("loss.scheme=effective_number (n=3)").count() >= 1
            assert page.locator('[data-testid="stException"]').count() == 0
            page.wait_for_timeout(500)
            artifacts = ROOT / "artifacts"
            artifacts.mkdir(exist_ok=True)
            full = artifacts / "grouped-bands-full.png"
            page.screenshot(path=str(full))
        finally:
            context.close()
    shot = artifacts / "grouped-bands.png"
    with Image.open(full) as image:
        small = image.convert("RGB").resize((int(image.width * 0.75), int(image.height * 0.75)), Image.LANCZOS)
    small.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(shot, optimize=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "grouped-bands.png")
