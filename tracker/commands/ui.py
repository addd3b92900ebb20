"""``tracker ui``: start the Streamlit app on the store.

The app's folder is found with ``importlib.util.find_spec("webui")`` (``tracker``
never imports it) and run with ``python -m streamlit run <folder>``; the store is
passed to it as ``TRACKER_HOME``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import click

from tracker.cli import friendly
from tracker.errors import ConfigError


def app_dir() -> Path:
    """The folder of the web UI package (holding ``streamlit_app.py``)."""
    spec = importlib.util.find_spec("webui")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations or not (Path(locations[0]) / "streamlit_app.py").is_file():
        raise ConfigError("the web UI package 'webui' is not installed; install it with pip install 'tracker[webui]'")
    if importlib.util.find_spec("streamlit") is None:
        raise ConfigError("streamlit is not installed; install it with pip install 'tracker[webui]'")
    return Path(locations[0])


def streamlit_command(port: int, address: str = "127.0.0.1", headless: bool = True) -> list[str]:
    """The command line that serves the app on ``address:port``."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app_dir()),
        "--server.port",
        str(port),
        "--server.address",
        address,
        "--server.headless",
        "true" if headless else "false",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",
    ]


def app_env(home: str | os.PathLike[str] | None) -> dict[str, str]:
    """The environment of the app process: this one, with ``TRACKER_HOME`` set."""
    from tracker.spool import home_dir

    return {**os.environ, "TRACKER_HOME": str(home_dir(home))}


def register(cli: click.Group) -> None:
    """Add ``tracker ui`` to ``cli``."""

    @cli.command("ui")
    @click.option("--port", type=click.IntRange(1, 65535), default=8501, show_default=True, help="Port to serve on.")
    @click.option(
        "--home",
        type=click.Path(file_okay=False),
        default=None,
        help="Store folder (default: $TRACKER_HOME or ./.tracker).",
    )
    @click.option("--address", default="127.0.0.1", show_default=True, help="Address to bind.")
    @click.option("--open/--no-open", "open_browser", default=False, help="Open a browser tab.")
    @friendly
    def ui(port: int, home: str | None, address: str, open_browser: bool) -> None:
        """Serve the web UI (runs, curves, per-class views, events, SQL) on the store."""
        cmd = streamlit_command(port, address, headless=not open_browser)
        env = app_env(home)
        click.echo(f"tracker ui: http://{address}:{port}  (store {env['TRACKER_HOME']}; Ctrl+C to stop)")
        try:
            code = subprocess.call(cmd, env=env)
        except KeyboardInterrupt:
            code = 0
        if code:
            raise click.ClickException(f"streamlit exited with status {code}")
