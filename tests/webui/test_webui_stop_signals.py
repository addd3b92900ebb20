"""``tracker ui`` and ``tracker demo`` stop their Streamlit server when they are told to stop.

A real server is started through the real command in a child process; the signal goes to
the command's process alone (as a service manager or ``kill`` sends it), never to its
process group, and afterwards no process of the server is left and its port is free.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from webui.browser import free_port, wait_healthy

TRACKER = str(Path(sys.executable).with_name("tracker"))


def _listening(port: int) -> bool:
    """Whether any socket listens on ``port`` (the health check's own TIME_WAIT sockets aside)."""
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
               for c in psutil.net_connections(kind="tcp"))


def _serve(args: list[str], home: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {**os.environ, "TRACKER_HOME": str(home)}
    proc = subprocess.Popen([TRACKER, *args, "--port", str(port)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "signum"),
    [
        (["ui"], signal.SIGTERM),
        (["ui"], signal.SIGHUP),
        (["ui"], signal.SIGINT),
        (["demo", "--quick", "--steps", "60"], signal.SIGTERM),
    ],
    ids=["ui-TERM", "ui-HUP", "ui-INT", "demo-TERM"],
)
def test_a_stop_signal_stops_the_server_too(args: list[str], signum: int, tmp_path: Path) -> None:
    proc, port = _serve(args, tmp_path / "home")
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=120.0)
        servers = psutil.Process(proc.pid).children(recursive=True)
        assert servers, "the command started no server process"
        os.kill(proc.pid, signum)  # the command alone, not its process group
        assert proc.wait(timeout=30) == 0
        gone, alive = psutil.wait_procs(servers, timeout=15)
        assert alive == [], f"server processes left running: {[p.pid for p in alive]}"
        assert not _listening(port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
