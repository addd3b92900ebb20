"""tracker import csv / ultralytics: our CSV logger's files and Ultralytics' own writers."""

from __future__ import annotations

import math
import os
import sys
import time
import types
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import tracker
from tracker.cli import cli


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, ["import", *args])


def _rows(sql: str) -> list[tuple[object, ...]]:
    return [tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in r)
            for r in tracker.query(sql).rows()]


def test_our_csv_logger_round_trips_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_CSV_DIR", str(tmp_path / "csv"))
    run = tracker.init("p", run_id="orig", loggers=["store", "csv"])
    for step in range(30):
        values = {"loss/box": 1.0 / (step + 1), "loss/cls": float("nan") if step == 7 else step * 0.1}
        if step >= 10:
            values["loss/dfl"] = step * 1e-7  # a key that appears mid-run
        run.log(values, step=step)
    run.finish()
    run = tracker.init("p", run_id="orig", resume="must", resume_step=20, loggers=["store", "csv"])
    for step in range(20, 40):
        run.log({"loss/box": -step * 1.5, "loss/cls": 1e300, "loss/dfl": float("inf")}, step=step)
    run.finish()

    csv = tmp_path / "csv" / "orig" / "metrics.csv"
    res = invoke("csv", str(csv), "--step-column", "step", "--time-column", "wall_time", "--name", "copy")
    assert res.exit_code == 0, res.output
    copy = tracker.query("SELECT run_id FROM runs WHERE name = 'copy'")["run_id"][0]
    q = "SELECT step, key, value, wall_time FROM curves WHERE run_id = '{}' ORDER BY key, step"
    assert _rows(q.format(copy)) == _rows(q.format("orig"))
    assert len(_rows(q.format(copy))) == 40 + 40 + 30


def test_a_log_appended_after_resume_follows_the_resume_rule(tmp_path: Path) -> None:
    log = tmp_path / "train.csv"
    log.write_text("step,loss,lr\n0,1.0,0.1\n1,0.9,0.1\n2,0.8,0.1\n1,0.85,0.1\n2,0.75,\n3,0.7,0.05\n")
    assert invoke("csv", str(log), "--step-column", "step").exit_code == 0
    assert _rows("SELECT key, step, value FROM curves ORDER BY key, step") == [
        ("loss", 0, 1.0), ("loss", 1, 0.85), ("loss", 2, 0.75), ("loss", 3, 0.7),
        ("lr", 0, 0.1), ("lr", 1, 0.1), ("lr", 3, 0.05),  # lr at step 2 was logged before the resume only
    ]
    assert _rows("SELECT segment, start_step FROM segments ORDER BY segment") == [(0, 0), (1, 1)]
    assert tracker.query("SELECT count(*) AS n FROM hidden_metrics")["n"][0] == 4

    assert "unchanged" in invoke("csv", str(log), "--step-column", "step").output
    with open(log, "a") as fh:
        fh.write("4,0.6,0.05\n")
    assert invoke("csv", str(log), "--step-column", "step").exit_code == 0
    assert tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 11 + 2


def test_a_bad_cell_names_file_line_column_and_imports_nothing(tmp_path: Path, home: Path) -> None:
    good = tmp_path / "good.csv"
    good.write_text("step,loss\n0,1.0\n1,0.5\n")
    bad = tmp_path / "bad.csv"
    bad.write_text("step,loss\n0,1.0\n1,0.5\n2,oops\n")
    res = invoke("csv", str(good), str(bad), "--step-column", "step")
    assert res.exit_code == 1
    assert f"{bad}, line 4, column 'loss': 'oops' is not a number" in res.output
    assert not (home / "runs").exists()
    res = invoke("csv", str(good), "--step-column", "epoch")
    assert res.exit_code == 1 and "no column 'epoch'" in res.output and "step, loss" in res.output


def _ultralytics_folder(folder: Path, epochs: list[int]) -> None:
    from ultralytics.cfg import get_cfg
    from ultralytics.engine.trainer import BaseTrainer
    from ultralytics.utils import YAML

    folder.mkdir(parents=True)
    cfg = get_cfg()
    cfg.epochs, cfg.name = 5, folder.name
    YAML.save(folder / "args.yaml", vars(cfg))
    os.utime(folder / "args.yaml", (1.7e9, 1.7e9))
    trainer = types.SimpleNamespace(csv=folder / "results.csv", train_time_start=time.time())
    for epoch in epochs:  # BaseTrainer.save_metrics writes results.csv as a training does
        trainer.epoch = epoch
        metrics = {"train/box_loss": 1.0 + epoch, "train/cls_loss": 2.0 + epoch, "metrics/mAP50-95(B)": 0.1 * epoch,
                   "lr/pg0": 0.01}
        BaseTrainer.save_metrics(trainer, metrics)


def test_ultralytics_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracker.integrations.ultralytics_env import apply_env, offline_config

    env = offline_config(tmp_path / "yolo")  # with the font: later trainings in this process check it
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if "ultralytics" not in sys.modules:
        apply_env(env)
    runs = tmp_path / "runs" / "detect"
    _ultralytics_folder(runs / "train", [0, 1, 2])
    _ultralytics_folder(runs / "train2", [0, 1, 2, 2, 3])  # killed while saving epoch 3: written twice
    res = invoke("ultralytics", str(runs))
    assert res.exit_code == 0, res.output
    info = tracker.query("SELECT name, project, config->>'$.epochs' AS epochs, status FROM runs ORDER BY name")
    assert info.rows() == [("train", "detect", "5", "finished"), ("train2", "detect", "5", "finished")]
    keys = tracker.query("SELECT DISTINCT key FROM curves ORDER BY key")["key"].to_list()
    assert keys == ["lr/pg0", "metrics/mAP50-95(B)", "train/box_loss", "train/cls_loss"]
    curve = _rows("SELECT step, value FROM curves c JOIN runs r USING (run_id) "
                  "WHERE r.name = 'train2' AND key = 'train/box_loss' ORDER BY step")
    assert curve == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]  # epochs as Ultralytics numbers them
    walls = tracker.query("SELECT min(wall_time) AS w FROM curves")["w"][0]
    assert 1.7e9 <= walls < 1.7e9 + 60  # args.yaml's time plus the elapsed-time column
    assert "unchanged" in invoke("ultralytics", str(runs / "train"), str(runs / "train2")).output


def test_padded_cells_iso_times_and_a_torn_last_line(tmp_path: Path) -> None:
    log = tmp_path / "old.csv"  # older Ultralytics versions pad every cell
    log.write_text("      epoch,  train/box_loss,      when\n"
                   "          1,         1.5,  2026-01-01T00:00:00\n"
                   "          2,         1.25, 2026-01-01T00:01:30.5\n"
                   "          3,         1.0")  # a writer killed mid-line
    res = invoke("csv", str(log), "--step-column", "epoch", "--time-column", "when")
    assert res.exit_code == 0, res.output
    assert _rows("SELECT key, step, value, wall_time FROM curves ORDER BY step") == [
        ("train/box_loss", 1, 1.5, 1767225600.0), ("train/box_loss", 2, 1.25, 1767225690.5)]
    bad = tmp_path / "bad_time.csv"
    bad.write_text("step,loss,t\n0,1.0,yesterday\n")
    res = invoke("csv", str(bad), "--step-column", "step", "--time-column", "t")
    assert res.exit_code == 1 and "line 2, column 't': 'yesterday' is not a time" in res.output
