"""Screenshot the per-class page's "Rare classes" section of a run in headless Chromium.

    python scripts/screenshot_rare.py --home HOME --run RUN_ID [--out docs/rare-classes.png]

Starts the web UI on ``HOME`` (as ``tracker ui`` does), opens ``classes?run=RUN_ID``,
waits for the section's charts and saves the section, from its heading down, as a
256-colour PNG. Chromium is Debian's (``scripts/apt-deps.sh browser``; ``$CHROMIUM``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SECTION_BOTTOM = """() => {
  const heads = Array.from(document.querySelectorAll('h3')).filter(h => h.innerText.trim() === 'Rare classes');
  if (!heads.length) return null;
  const top = heads[0].getBoundingClientRect().top;
  const els = Array.from(document.querySelectorAll(
    '[data-testid="stMainBlockContainer"] [data-testid="stElementContainer"]'));
  return {top: top, bottom: Math.max(...els.map(el => el.getBoundingClientRect().bottom))};
}"""


def shoot(home: str, run_id: str, out: Path) -> Path:
    """Save the section of ``run_id`` in store ``home`` to ``out``; returns ``out``."""
    from webui.browser import launch_chromium, save_png, serve_app

    with launch_chromium() as ctx, serve_app(home, timeout=120) as url:
        page = ctx.new_page()
        page.goto(f"{url}/classes?run={run_id}", wait_until="domcontentloaded")
        page.get_by_role("heading", name="Rare classes").wait_for(timeout=120_000)
        page.wait_for_function("() => document.querySelectorAll('.vega-embed').length >= 7", timeout=120_000)
        height = page.evaluate("() => document.querySelector('[data-testid=\"stMainBlockContainer\"]')"
                               ".scrollHeight")
        page.set_viewport_size({"width": 1400, "height": int(height) + 120})
        page.wait_for_timeout(3000)
        box = page.evaluate(SECTION_BOTTOM)
        clip = {"x": 300, "y": box["top"] - 10, "width": 1100, "height": box["bottom"] - box["top"] + 30}
        return save_png(page, out, clip=clip, keep_full=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--out", default=str(ROOT / "docs" / "rare-classes.png"))
    args = parser.parse_args()
    from tracker.errors import TrackerError

    try:
        print(shoot(args.home, args.run, Path(args.out)))
    except TrackerError as error:  # no Chromium, or the web UI did not come up: one line, no traceback
        raise SystemExit(str(error)) from None


if __name__ == "__main__":
    main()
