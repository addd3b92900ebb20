"""Real YOLO11n trainings with ``track()``, killed with SIGKILL right after Ultralytics
saved ``last.pt`` and resumed with ``YOLO(last.pt).train(resume=True)``: the curves have
no gap and no duplicate, and the epoch metrics a kill took away come back from
``results.csv`` once. The same trainings run as on a user's machine (Ultralytics'
default settings, MLflow installed, no CI markers) under an audit hook: they make no
name lookup and no connection, leave the settings file as it was, and say in one line
that Ultralytics' MLflow callback is off."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tracker
from tracker.integrations.ultralytics import MLFLOW_MODULE, _Tracker, epoch_rows, mlflow_off
from tracker.integrations.ultralytics_env import apply_env, offline_config
from tracker.store import Store
from tests.harness.ckpt_kill import RoundReport, yolo_env, yolo_rounds
from tests.harness.netaudit import settings_file

pytestmark = pytest.mark.slow
ROUNDS = 2
OFF_LINE = "tracker: Ultralytics' MLflow callback is off for this training"


@dataclass
class Killed:
    workdir: Path
    home: Path
    report: RoundReport
    audit: Path
    settings_before: bytes
    settings_after: bytes
    log: str


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Killed:
    workdir = tmp_path_factory.mktemp("ckpt-kill")
    home = workdir / "tracker-home"
    env = yolo_env(workdir, home, user_settings=True)
    env["HOME"] = str(tmp_path_factory.mktemp("user-home"))
    before = settings_file(env).read_bytes()
    audit = workdir / "network-audit.txt"
    with open(workdir / "children.log", "ab") as log:
        report = yolo_rounds(workdir, home, ROUNDS, seed=3, log=log, env=env, audit=audit)
    text = (workdir / "children.log").read_text(errors="replace")
    return Killed(workdir, home, report, audit, before, settings_file(env).read_bytes(), text)


def _run_id(k: Killed) -> str:
    import json

    return str(json.loads((k.workdir / "runs" / "ckpt-kill" / "tracker.json").read_text())["run_id"])


def test_kills_right_after_a_checkpoint_leave_no_gap_and_no_duplicate(killed: Killed) -> None:
    report = killed.report
    assert report.problems == [], killed.log[-3000:]
    assert report.rounds == ROUNDS and report.checkpoints == list(range(ROUNDS))
    assert report.restored_epochs >= 1  # round 0 was killed inside on_model_save: epoch 1's metrics came back
    run_id = _run_id(killed)
    store = Store(killed.home)
    segments = store.query("SELECT segment, start_step, reason FROM segments WHERE run_id = ? ORDER BY segment",
                           [run_id]).rows()
    assert segments == [(0, 0, "start"), (1, 2, "resume"), (2, 4, "resume")]  # 2 batches per epoch
    assert store.query("SELECT status FROM runs WHERE run_id = ?", [run_id]).item() == "finished"


def test_restored_epoch_metrics_are_those_of_results_csv(killed: Killed) -> None:
    run_id = _run_id(killed)
    with open(killed.workdir / "runs" / "ckpt-kill" / "results.csv", newline="") as fh:
        rows = {int(float(r["epoch"])): r for r in csv.DictReader(fh)}
    got = Store(killed.home).query(
        "SELECT key, value FROM curves WHERE run_id = ? AND step = 1 AND segment = 1", [run_id])
    values = dict(zip(got["key"].to_list(), got["value"].to_list()))
    assert values["epoch"] == 1.0
    assert values["metrics/mAP50-95(B)"] == pytest.approx(float(rows[1]["metrics/mAP50-95(B)"]), abs=1e-12)
    assert values["val/box_loss"] == pytest.approx(float(rows[1]["val/box_loss"]), abs=1e-12)
    assert not any(k.startswith(("train/", "lr/")) for k in values)  # per-batch keys: the batch rows hold them


def test_tracked_trainings_made_no_network_call_and_left_the_settings_alone(killed: Killed) -> None:
    assert not killed.audit.exists(), killed.audit.read_text()
    assert killed.settings_after == killed.settings_before
    assert b'"mlflow": true' in killed.settings_before  # Ultralytics' default: its MLflow callback was on
    assert killed.log.count(OFF_LINE) == ROUNDS + 1  # one line per training
    assert not list(killed.workdir.glob("**/mlruns")) and not list(killed.workdir.glob("**/mlflow.db"))


AUDITED = """
import socket, sys
from tests.harness.netaudit import install
install(sys.argv[1])
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)
socket.create_connection(server.getsockname(), timeout=5).close()  # localhost: allowed
for call in (lambda: socket.getaddrinfo("config.mlflow-telemetry.io", 443),
             lambda: socket.socket().connect(("192.0.2.1", 80)),
             lambda: __import__("requests").get("https://example.com/telemetry", timeout=1)):
    try:
        call()
    except OSError as exc:
        print("refused:", exc)
"""


def test_the_audit_hook_sees_lookups_and_connections_and_allows_localhost(tmp_path: Path) -> None:
    record = tmp_path / "audit.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", AUDITED, str(record)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = record.read_text().splitlines()
    assert lines == ["socket.getaddrinfo 'config.mlflow-telemetry.io'", "socket.connect '192.0.2.1'",
                     "socket.getaddrinfo 'example.com'"]


# -- the MLflow switch, without a training --------------------------------------------------
@pytest.fixture
def fake_mlflow(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Ultralytics imported with an offline configuration, and a stand-in for its MLflow callbacks module."""
    env = offline_config(tmp_path_factory.mktemp("ultralytics-config"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if "ultralytics" not in sys.modules:
        apply_env(env)
    module = types.ModuleType(MLFLOW_MODULE)
    hooks = {"on_pretrain_routine_end": lambda t: None, "on_fit_epoch_end": lambda t: None}
    module.callbacks = hooks  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MLFLOW_MODULE, module)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return module


def _trainer(module: Any) -> Any:
    callbacks = {"on_pretrain_routine_end": [print, module.callbacks["on_pretrain_routine_end"]],
                 "on_fit_epoch_end": [module.callbacks["on_fit_epoch_end"]], "on_train_end": [print]}
    return types.SimpleNamespace(args=types.SimpleNamespace(cls_pw=0.0), callbacks=callbacks)


def _kept(state: _Tracker, trainer: Any) -> bool:
    state.on_pretrain_routine_start(trainer)
    return any(fn in trainer.callbacks[e] for e, fn in sys.modules[MLFLOW_MODULE].callbacks.items())


def test_mlflow_callback_is_off_unless_configured_or_asked_for(fake_mlflow: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    state = _Tracker(None, None, None, None, {}, 1)
    trainer = _trainer(fake_mlflow)
    assert not _kept(state, trainer)
    assert trainer.callbacks == {"on_pretrain_routine_end": [print], "on_fit_epoch_end": [], "on_train_end": [print]}
    state.ultralytics_loggers = True
    assert _kept(state, _trainer(fake_mlflow))
    state.ultralytics_loggers = False
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert _kept(state, _trainer(fake_mlflow))
    assert mlflow_off(types.SimpleNamespace(callbacks={})) is False  # nothing to take off: no log line


def test_track_refuses_a_bad_ultralytics_loggers_value() -> None:
    from tracker.errors import ConfigError
    from tracker.integrations.ultralytics import track

    with pytest.raises(ConfigError, match="ultralytics_loggers is 'yes'; expected True or False"):
        track(types.SimpleNamespace(add_callback=print), ultralytics_loggers="yes")  # type: ignore[arg-type]


# -- the backfill, without a training ---------------------------------------------------------
RESULTS = (
    "epoch,time,train/box_loss,metrics/mAP50(B),val/box_loss,lr/pg0\n"
    "1,1.5,2.5,0.125,3.25,0.01\n"
    "2,3.0,2.25,0.25,3.0,0.009\n"
    "3,4.5,2.0,0.0,9.0,0.008\n"  # epoch 3, then killed before its checkpoint: replayed below
    "3,6.0,2.0,0.375,2.75,0.008\n"
    "4,7.5,1.75,0.5,2.5,0.007\n"  # not checkpointed: never restored
    "5,9.0,1.5,0.6"  # a torn last line
)


def test_epoch_rows_keep_the_epoch_metrics_and_the_last_row_of_an_epoch(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    path.write_text(RESULTS)
    rows = epoch_rows(path)
    assert rows[3] == {"metrics/mAP50(B)": 0.375, "val/box_loss": 2.75}
    assert sorted(rows) == [1, 2, 3, 4, 5] and rows[5] == {"metrics/mAP50(B)": 0.6}
    assert epoch_rows(tmp_path / "absent.csv") == {}


def test_backfill_restores_only_missing_checkpointed_epochs_and_never_twice(home: Path, tmp_path: Path) -> None:
    results = tmp_path / "results.csv"
    results.write_text(RESULTS)
    batches = 4
    run = tracker.init("p", run_id="bf", config={"analysis": False})
    for step in range(3 * batches):  # three epochs of batches; the metrics of epochs 1 and 2 only
        run.log({"train/box_loss": 2.0, "lr/pg0": 0.01}, step=step)
    for epoch in (1, 2):
        run.log({"metrics/mAP50(B)": 0.1 * epoch, "epoch": float(epoch)}, step=epoch * batches - 1)
    run.finish("killed")
    for _ in range(2):  # two resumes after the checkpoint of epoch 3: the second finds it restored
        state = _Tracker(None, None, None, None, {}, 1)
        state.batches = batches
        state.run = tracker.init("p", run_id="bf", resume="must", resume_step=3 * batches,
                                 config={"analysis": False})
        state._backfill_epochs(results, 3)
        state.run.finish()
    curves = tracker.query("SELECT key, step, value FROM curves WHERE run_id = 'bf' AND key IN "
                           "('epoch', 'metrics/mAP50(B)', 'val/box_loss') ORDER BY key, step")
    assert curves.rows() == [("epoch", 3, 1.0), ("epoch", 7, 2.0), ("epoch", 11, 3.0),
                             ("metrics/mAP50(B)", 3, 0.1), ("metrics/mAP50(B)", 7, 0.2),
                             ("metrics/mAP50(B)", 11, 0.375), ("val/box_loss", 11, 2.75)]
    assert tracker.query("SELECT count(*) FROM curves WHERE run_id = 'bf' AND step = 11 "
                         "AND key IN ('train/box_loss', 'lr/pg0')").item() == 1 * 2  # the batch's own rows only
