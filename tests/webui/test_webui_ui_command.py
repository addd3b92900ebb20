"""``tracker ui`` starts ``streamlit run <webui folder>`` with TRACKER_HOME set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tracker.cli import build_cli
from tracker.commands import ui

WEBUI = Path(__file__).resolve().parents[2] / "webui"


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def fake_call(cmd: list[str], env: dict[str, str]) -> int:
        seen.append({"cmd": cmd, "env": env})
        return 0

    monkeypatch.setattr(ui, "run_app", fake_call)
    return seen


def test_ui_runs_streamlit_on_the_webui_folder(calls: list[dict[str, Any]], tmp_path: Path) -> None:
    result = CliRunner().invoke(build_cli(), ["ui", "--port", "8612", "--home", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    assert "http://127.0.0.1:8612" in result.output
    (call,) = calls
    cmd = call["cmd"]
    assert cmd[1:4] == ["-m", "streamlit", "run"] and Path(cmd[4]) == WEBUI
    assert cmd[cmd.index("--server.port") + 1] == "8612"
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--browser.gatherUsageStats") + 1] == "false"
    assert call["env"]["TRACKER_HOME"] == str((tmp_path / "store").resolve())


def test_ui_defaults_to_tracker_home(calls: list[dict[str, Any]], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_HOME", str(tmp_path / "from-env"))
    result = CliRunner().invoke(build_cli(), ["ui"])
    assert result.exit_code == 0, result.output
    assert calls[0]["env"]["TRACKER_HOME"] == str((tmp_path / "from-env").resolve())
    assert calls[0]["cmd"][calls[0]["cmd"].index("--server.port") + 1] == "8501"


def test_ui_reports_a_missing_webui_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ui.importlib.util, "find_spec", lambda name: None)
    result = CliRunner().invoke(build_cli(), ["ui"])
    assert result.exit_code == 1
    assert "Error: the web UI package 'webui' is not installed; install it with pip install" in result.output
    assert "Traceback" not in result.output


def test_ui_reports_a_failed_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ui, "run_app", lambda cmd, env: 3)
    result = CliRunner().invoke(build_cli(), ["ui", "--port", "1"])
    assert result.exit_code == 1 and "streamlit exited with status 3" in result.output


def test_ui_refuses_a_bad_port() -> None:
    result = CliRunner().invoke(build_cli(), ["ui", "--port", "70000"])
    assert result.exit_code == 2 and "70000" in result.output


def _listening(port: int) -> set[str]:
    """Local addresses with a socket listening on ``port`` (hex, as /proc/net/tcp* writes them)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_the_shipped_config_applies_to_a_bare_streamlit_run(tmp_path: Path) -> None:
    """What `streamlit run webui` reads, from any working directory: loopback, no usage statistics."""
    import subprocess
    import sys

    probe = (
        "import streamlit.config as c, sys; c._main_script_path = sys.argv[1]; "
        "c.get_config_options(force_reparse=True); "
        "print(c.get_option('server.address'), c.get_option('browser.gatherUsageStats'), "
        "c.get_option('server.headless'))"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(WEBUI / "streamlit_app.py")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["127.0.0.1", "False", "True"]


@pytest.mark.slow
def test_a_bare_streamlit_run_binds_only_the_loopback(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from webui.browser import free_port, stop_server, wait_healthy

    port = free_port()
    env = {**os.environ, "TRACKER_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(WEBUI), "--server.port", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=60)
        assert _listening(port) == {"0100007F"}  # 127.0.0.1 only: not 0.0.0.0, not ::
    finally:
        stop_server(proc)
