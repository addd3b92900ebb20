"""One bad logger never stalls the others or the run (each runs on its own thread)."""

from __future__ import annotations

import logging
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

import tracker
from tracker import hookimpl
from tracker.errors import RunError
from tracker.host import DEFAULT_PLUGINS, Host, make_plugin_manager, set_host


def use_logger(name: str, open_fn: Callable[[Any], Any]) -> None:
    """Make the process host the default plugins plus a logger ``name`` opened by ``open_fn``."""

    @dataclass(frozen=True)
    class Custom:
        name: str

        def open(self, run: Any) -> Any:
            return open_fn(run)

    def tracker_register_loggers(register: Any) -> None:
        register(Custom(name))

    plugin = types.ModuleType(f"plugin_{name}")
    plugin.tracker_register_loggers = hookimpl(tracker_register_loggers)  # type: ignore[attr-defined]
    pm = make_plugin_manager(default_plugins=DEFAULT_PLUGINS, entry_points=False)
    pm.register(plugin, name=f"plugin_{name}")
    set_host(Host(pm))  # the autouse fixture restores the previous host


def test_a_hung_logger_stalls_neither_the_others_nor_finish(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    gate = threading.Event()
    hung = threading.Event()

    def write(batch: Any) -> None:
        hung.set()
        gate.wait(60)  # hangs for the whole test

    use_logger("stuck", lambda run: types.SimpleNamespace(write=write, close=lambda status: gate.wait(60)))
    run = tracker.init(
        "p", run_id="iso", loggers=["stuck", "store", "csv"],
        config={"tracker_flush_interval": 0.1, "tracker_logger_timeout": 1.0, "analysis": False},
    )
    try:
        for s in range(2000):
            run.log({"loss": float(s)}, step=s)
        assert hung.wait(10)
        deadline = time.time() + 10  # the others write while 'stuck' hangs
        while time.time() < deadline and tracker.query("SELECT count(*) AS n FROM curves")["n"][0] < 2000:
            time.sleep(0.05)
        assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 2000
        for s in range(2000, 3000):
            run.log({"loss": float(s)}, step=s)
        t0 = time.monotonic()
        run.finish()
        took = time.monotonic() - t0
    finally:
        gate.set()
    assert took < 1.0 + 3.0, f"finish took {took:.1f} s with a hung logger (timeout 1 s)"
    assert "'stuck'" in caplog.text and "disabled" in caplog.text
    assert tracker.query("SELECT count(*) AS n, max(step) AS m FROM curves").row(0) == (3000, 2999)
    csv_rows = (home / "runs" / "iso" / "metrics.csv").read_text().splitlines()
    assert len(csv_rows) == 3001
    assert tracker.query("SELECT status FROM runs")["status"][0] == "finished"


def test_a_failing_logger_is_disabled_once_and_named(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def write(batch: Any) -> None:
        calls.append(batch.seq)
        raise RuntimeError("boom")

    use_logger("flaky", lambda run: types.SimpleNamespace(write=write, close=lambda status: None))
    run = tracker.init("p", loggers=["flaky", "store"], config={"tracker_flush_interval": 0.05, "analysis": False})
    for s in range(5):
        run.log({"loss": 1.0}, step=s)
        run.flush()
    run.finish()
    assert calls == [0]
    warnings = [r for r in caplog.records if "'flaky'" in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "boom" in warnings[0].getMessage()
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 5


def test_a_logger_whose_open_raises_is_left_out(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    def bad_open(run: Any) -> Any:
        raise PermissionError("no access to the dashboard")

    use_logger("dashboard", bad_open)
    run = tracker.init("p", run_id="half", loggers=["dashboard", "store"], config={"analysis": False})
    run.log({"loss": 1.0}, step=0)
    run.finish()
    assert "'dashboard'" in caplog.text and "no access to the dashboard" in caplog.text
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 1


def test_when_no_logger_opens_init_fails_and_leaves_no_run_behind(home: Path) -> None:
    def bad_open(run: Any) -> Any:
        raise OSError("read-only file system")

    use_logger("only", bad_open)
    with pytest.raises(RunError, match="'only'.*read-only file system"):
        tracker.init("p", run_id="ghost", loggers=["only"])
    assert not (home / "runs" / "ghost" / "run.json").exists()
    assert tracker.query("SELECT count(*) AS n FROM runs")["n"][0] == 0


def test_an_unknown_logger_leaves_no_run_json(home: Path) -> None:
    with pytest.raises(tracker.ConfigError if hasattr(tracker, "ConfigError") else Exception, match="nope"):
        tracker.init("p", run_id="typo", loggers=["store", "nope"])
    assert not (home / "runs" / "typo" / "run.json").exists()


EXIT_WITH_HUNG_LOGGER = """
import threading, types
from dataclasses import dataclass
import tracker
from tracker import hookimpl
from tracker.host import DEFAULT_PLUGINS, Host, make_plugin_manager, set_host

@dataclass(frozen=True)
class Stuck:
    name: str = "stuck"
    def open(self, run):
        return types.SimpleNamespace(write=lambda b: threading.Event().wait(), close=lambda s: None)

plugin = types.ModuleType("stuck_plugin")
plugin.tracker_register_loggers = hookimpl(lambda register: register(Stuck()))
pm = make_plugin_manager(default_plugins=DEFAULT_PLUGINS, entry_points=False)
pm.register(plugin, name="stuck_plugin")
set_host(Host(pm))
run = tracker.init("p", run_id="exit", loggers=["stuck", "store"],
                   config={"tracker_logger_timeout": 1.0, "analysis": False})
for s in range(100):
    run.log({"loss": 1.0}, step=s)
print("logged", flush=True)
"""  # exits without finish(): the exit hook finishes the run


def test_interpreter_exit_is_bounded_with_a_hung_logger(home: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    script.write_text(EXIT_WITH_HUNG_LOGGER)
    env = {**os.environ, "TRACKER_HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path)}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    assert took < 15, f"exit took {took:.1f} s"
    assert "'stuck'" in out.stderr
    assert tracker.query("SELECT count(*) AS n FROM curves WHERE run_id = 'exit'")["n"][0] == 100
    assert tracker.query("SELECT status FROM runs WHERE run_id = 'exit'")["status"][0] == "finished"
