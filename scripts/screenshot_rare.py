"""Screenshot the per-class page's "Rare classes" section of a run in headless Chromium.

    python scripts/screenshot_rare.py --home HOME --run RUN_ID [--out docs/rare-classes.png]

Starts the web UI on ``HOME`` (as ``tracker ui`` does), opens ``classes?run=RUN_ID``,
waits for the section's charts and saves the section, from its heading down, as a
256-colour PNG. Chromium is Debian's (``scripts/apt-deps.sh browser``; ``$CHROMIUM``).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic"]
SECTION_BOTTOM = """() => {
  const heads = Array.from(document.querySelectorAll('h3')).filter(h => h.innerText.trim() === 'Rare classes');
  if (!heads.length) return null;
  const top = heads[0].getBoundingClientRect().top;
  const els = Array.from(document.querySelectorAll(
    '[data-testid="stMainBlockContainer"] [data-testid="stElementContainer"]'));
  return {top: top, bottom: Math.max(...els.map(el => el.getBoundingClientRect().bottom))};
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the web UI exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the web UI did not answer at {url} within {timeout:.0f} s")


def shoot(home: str, run_id: str, out: Path) -> Path:
    """Save the section of ``run_id`` in store ``home`` to ``out``; returns ``out``."""
    from PIL import Image
    from playwright.sync_api import sync_playwright

    from tracker.commands.ui import app_env, streamlit_command

    port = free_port()
    proc = subprocess.Popen(streamlit_command(port) + ["--server.fileWatcherType", "none"], env=app_env(home),
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
            ctx = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
                                                        viewport={"width": 1400, "height": 1000})
            page = ctx.new_page()
            page.goto(f"{url}/classes?run={run_id}", wait_until="domcontentloaded")
            page.get_by_role("heading", name="Rare classes").wait_for(timeout=120_000)
            page.wait_for_function("() => document.querySelectorAll('.vega-embed').length >= 7", timeout=120_000)
            height = page.evaluate("() => document.querySelector('[data-testid=\"stMainBlockContainer\"]')"
                                   ".scrollHeight")
            page.set_viewport_size({"width": 1400, "height": int(height) + 120})
            page.wait_for_timeout(3000)
            box = page.evaluate(SECTION_BOTTOM)
            full = out.with_name(out.stem + "-full.png")
            page.screenshot(path=str(full), clip={"x": 300, "y": box["top"] - 10, "width": 1100,
                                                  "height": box["bottom"] - box["top"] + 30})
            ctx.close()
        with Image.open(full) as image:
            image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
        full.unlink()
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--out", default=str(ROOT / "docs" / "rare-classes.png"))
    args = parser.parse_args()
    print(shoot(args.home, args.run, Path(args.out)))


if __name__ == "__main__":
    main()
