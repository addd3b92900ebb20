"""``tracker ui``: start the Streamlit app on the store.

The app's folder is found with ``importlib.util.find_spec("webui")`` (``tracker``
never imports it) and run with ``python -m streamlit run <folder>``; the store is
passed to it as ``TRACKER_HOME``. While the server runs, SIGTERM, SIGINT and SIGHUP
sent to this process stop the server too (:func:`run_app`), so no orphan keeps the port.
"""

from __future__ import annotations

import importlib.util
import os
import signal
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


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def stop_process(proc: subprocess.Popen, grace_s: float) -> None:  # type: ignore[type-arg]
    """Terminate ``proc``; kill it if it has not exited after ``grace_s`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_app(cmd: list[str], env: dict[str, str], grace_s: float = 10.0) -> int:
    """Run the server ``cmd`` until it exits or this process gets a stop signal.

    SIGTERM, SIGINT and SIGHUP are passed on to the server as SIGTERM (it shuts down
    cleanly); one that has not exited after ``grace_s`` is killed. The handlers are
    restored on return. Returns the server's exit status, or 0 when it was stopped on
    request.
    """
    proc = subprocess.Popen(cmd, env=env)
    stopped: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        stopped.append(signum)
        if proc.poll() is None:
            proc.terminate()

    try:
        previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    except ValueError:  # not the main thread: no handlers, the caller stops the server
        previous = {}
    try:
        code = proc.wait()
    except KeyboardInterrupt:  # a SIGINT that arrived before the handler was set
        stopped.append(signal.SIGINT)
        code = 0
    finally:
        if proc.poll() is None:
            stop_process(proc, grace_s)
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0 if stopped else code


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
        code = run_app(cmd, env)
        if code:
            raise click.ClickException(f"streamlit exited with status {code}")
