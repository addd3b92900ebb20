"""The commands the demo prints work when pasted, as printed, into a fresh shell."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracker.cli import build_cli
from tracker.commands._output import activate_hint, tracker_command

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _fresh_shell_env(home: Path) -> dict[str, str]:
    """A login shell's environment: no venv on PATH, no TRACKER_HOME; the source tree importable."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRACKER_HOME", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != VENV_BIN)
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_the_demo_hint_works_as_printed_in_a_fresh_shell(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(VENV_BIN.parents[1])  # where `make demo` runs: the folder holding .venv
    env = _fresh_shell_env(home)
    monkeypatch.setenv("PATH", env["PATH"])
    res = CliRunner().invoke(build_cli(), ["demo", "--quick", "--no-ui", "--steps", "60", "--home", str(home)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    hint = lines[lines.index("look at it with:") + 1:]
    commands = [line.strip() for line in hint if line.startswith("  ")]
    assert len(commands) == 4 and commands[-1].endswith(" ui")
    assert all(" tracker " not in f" {c} " for c in commands)  # never a bare `tracker` the shell cannot find
    assert tracker_command() == os.path.relpath(VENV_BIN / "tracker")
    assert f"(or activate the environment first, `{activate_hint()}`, and type plain `tracker`)" in res.output
    for command in commands[:-1]:  # the last one starts the web UI and does not return
        out = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=120,
                             cwd=VENV_BIN.parents[1])
        assert out.returncode == 0, f"{command!r}: {out.stderr}"
        assert "demo-" in out.stdout + out.stderr  # analyze names its run on stderr when piped
    activated = subprocess.run(
        ["bash", "-c", f"{activate_hint()} && command -v tracker"], env=env, capture_output=True, text=True,
        cwd=VENV_BIN.parents[1], timeout=60,
    )
    assert activated.returncode == 0 and Path(activated.stdout.strip()) == VENV_BIN / "tracker"
