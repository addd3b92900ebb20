"""tracker import mlflow, on a sqlite store written by MlflowClient."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import tracker
from tracker.cli import cli


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, ["import", "mlflow", *args])


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("yolo-coco")
    t0 = int(time.time() * 1000)
    base = client.create_run(exp, run_name="baseline", tags={"team": "vision", "note": ""})
    metrics = [Metric("train/loss", 1.0 / (i + 1), t0 + i, i) for i in range(2500)]
    metrics += [Metric("val/map", 0.01 * i, t0 + 10 * i, 10 * i) for i in range(250)]
    metrics += [Metric("val/map", 0.5, t0 + 99_999, 0)]  # a second value at step 0, logged later
    for i in range(0, len(metrics), 1000):  # log_batch takes at most 1000 metrics
        client.log_batch(base.info.run_id, metrics=metrics[i:i + 1000])
    client.log_batch(base.info.run_id, params=[Param("lr0", "0.01"), Param("amp", "True"),
                                               Param("model", "yolo11n.yaml"), Param("epochs", "300")])
    client.set_terminated(base.info.run_id, "FINISHED")
    failed = client.create_run(exp, run_name="weighted")
    client.log_metric(failed.info.run_id, "train/loss", 2.0, step=0, timestamp=t0)
    client.set_terminated(failed.info.run_id, "FAILED")
    other = client.create_experiment("other")
    client.set_terminated(client.create_run(other, run_name="x").info.run_id, "KILLED")
    return {"uri": uri, "client": client, "base": base.info.run_id, "t0": t0}


def test_params_tags_status_and_every_metric_point(mlflow_store: dict[str, Any]) -> None:
    res = invoke("--tracking-uri", mlflow_store["uri"], "--experiment", "yolo-coco")
    assert res.exit_code == 0, res.output
    runs = tracker.query("SELECT name, project, status, config, tags FROM runs ORDER BY name")
    assert runs["name"].to_list() == ["baseline", "weighted"]
    assert runs["project"].to_list() == ["yolo-coco", "yolo-coco"]
    assert runs["status"].to_list() == ["finished", "crashed"]
    import json

    config = json.loads(runs["config"][0])
    assert {k: config[k] for k in ("lr0", "amp", "model", "epochs")} == {
        "lr0": 0.01, "amp": True, "model": "yolo11n.yaml", "epochs": 300}
    assert config["mlflow"]["run_id"] == mlflow_store["base"]
    assert {"team=vision", "note", "import:mlflow"} <= set(runs["tags"][0])
    pts = tracker.query("SELECT key, count(*) AS n, min(wall_time) AS w FROM curves c JOIN runs r USING (run_id) "
                        "WHERE r.name = 'baseline' GROUP BY key ORDER BY key")
    assert pts.rows() == [("train/loss", 2500, mlflow_store["t0"] / 1000), ("val/map", 251, mlflow_store["t0"] / 1000)]

    again = invoke("--tracking-uri", mlflow_store["uri"], "--experiment", "yolo-coco")
    assert again.output.count("unchanged") == 2


def test_a_grown_run_adds_only_new_points_and_other_experiments_come_too(mlflow_store: dict[str, Any]) -> None:
    from mlflow.entities import Metric

    uri, client = mlflow_store["uri"], mlflow_store["client"]
    assert invoke("--tracking-uri", uri, "--experiment", "yolo-coco").exit_code == 0
    client.log_batch(mlflow_store["base"], metrics=[Metric("train/loss", 0.0, mlflow_store["t0"] + 5000, 2500 + i)
                                                    for i in range(10)])
    res = invoke("--tracking-uri", uri)  # every experiment
    assert res.exit_code == 0, res.output
    assert tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 2500 + 251 + 10 + 1
    assert tracker.query("SELECT status FROM runs WHERE name = 'x'")["status"].to_list() == ["killed"]


def test_unknown_experiment_lists_the_known_ones(mlflow_store: dict[str, Any], home: Path) -> None:
    res = invoke("--tracking-uri", mlflow_store["uri"], "--experiment", "nope")
    assert res.exit_code == 1
    assert "Unknown MLflow experiment 'nope'" in res.output and "yolo-coco" in res.output
    assert not (home / "runs").exists()
