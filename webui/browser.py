"""Serve the app and open it in headless Chromium: what the browser tests and the screenshot
scripts share.

* :func:`serve_app` starts the app as ``tracker ui`` does (``streamlit_command`` and
  ``app_env`` of ``tracker.commands.ui``, no file watcher) on a free loopback port, waits
  for its health check and stops it on leaving;
* :func:`launch_chromium` opens a persistent Playwright context of Debian's Chromium
  (``scripts/apt-deps.sh browser`` installs it; ``$CHROMIUM`` overrides the path);
* :func:`save_png` writes a page (or a clip of it) as a 256-colour PNG.

Playwright and Pillow come with the ``dev`` extra and are imported only when used, so
importing this module costs nothing. Failures raise :class:`~tracker.errors.TrackerError`
with a message that says what to do.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

from tracker.errors import TrackerError

ROOT = Path(__file__).resolve().parents[1]  # the server's working folder: the repository root in a checkout
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic")
CHART = ".vega-embed canvas, .vega-embed svg.marks"
# How much a chart drew (JavaScript, called with one CHART element): its line paths when
# vega-embed drew SVG, else its canvas's dark pixels / 500.
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


def wait_charts(page: Any, count: int, drawn: str, *, timeout_ms: int = 90_000) -> None:
    """Wait until ``page`` shows ``count`` charts or more and the JavaScript condition ``drawn``
    holds of ``ink``, the :data:`INK` of each chart in the page's order (``"ink.every(v => v >= 2)"``)."""
    page.wait_for_function(f"() => document.querySelectorAll('.vega-embed').length >= {count}", timeout=timeout_ms)
    page.wait_for_function(
        f"(sel) => {{ const ink = Array.from(document.querySelectorAll(sel)).map({INK});"
        f" return ink.length >= {count} && ({drawn}); }}",
        arg=CHART, timeout=30_000)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 90.0) -> None:
    """Return once the Streamlit server at ``url`` (run by ``proc``) answers its health check."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TrackerError(f"the server for {url} exited with status {proc.returncode} before it answered; "
                               "run its command by hand to see why")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TrackerError(f"the server did not answer on {url} within {timeout:.0f} s; "
                       "give it a longer timeout on a loaded machine")


def stop_server(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """Terminate ``proc``; kill it if it has not exited after ``timeout`` seconds."""
    from tracker.commands.ui import stop_process

    stop_process(proc, timeout)


@contextmanager
def serve_app(home: str | os.PathLike[str], *, timeout: float = 90.0) -> Iterator[str]:
    """Serve the app on the store ``home``; yields its URL once it answers, stops it on leaving."""
    from tracker.commands.ui import app_env, streamlit_command

    port = free_port()
    proc = subprocess.Popen(streamlit_command(port) + ["--server.fileWatcherType", "none"], env=app_env(home),
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout)
        yield url
    finally:
        stop_server(proc)


@contextmanager
def launch_chromium(profile: str | os.PathLike[str] | None = None, *, width: int = 1400,
                    height: int = 1000) -> Iterator[Any]:
    """Headless Chromium in a ``width`` x ``height`` window: a Playwright ``BrowserContext`` on the
    profile folder ``profile`` (a temporary one when None), closed on leaving."""
    if not Path(CHROMIUM).exists():
        raise TrackerError(f"no Chromium at {CHROMIUM}; install it with `bash scripts/apt-deps.sh browser` "
                           "or set CHROMIUM")
    from playwright.sync_api import sync_playwright

    with ExitStack() as stack:
        folder = profile if profile is not None else stack.enter_context(tempfile.TemporaryDirectory())
        pw = stack.enter_context(sync_playwright())
        context = pw.chromium.launch_persistent_context(str(folder), executable_path=CHROMIUM, headless=True,
                                                        args=list(FLAGS), viewport={"width": width, "height": height})
        try:
            yield context
        finally:
            context.close()


def save_png(page: Any, out: Path, *, scale: float = 1.0, clip: dict[str, float] | None = None,
             keep_full: bool = True) -> Path:
    """Save ``page`` (or its ``clip``) to ``out`` as a 256-colour PNG scaled by ``scale``; the
    original screenshot stays beside it as ``<stem>-full.png`` unless ``keep_full`` is False."""
    from PIL import Image

    full = out.with_name(out.stem + "-full.png")
    page.screenshot(path=str(full), clip=clip)
    with Image.open(full) as image:
        size = (int(image.width * scale), int(image.height * scale))
        rgb = image.convert("RGB").resize(size, Image.LANCZOS) if scale != 1.0 else image.convert("RGB")
    rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    if not keep_full:
        full.unlink()
    return out
