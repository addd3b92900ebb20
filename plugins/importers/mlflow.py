"""``tracker import mlflow --tracking-uri URI [--experiment NAME]``, through ``MlflowClient``.

Works with any store MLflow's client opens (sqlite, file store, a server). Per run:
params become the config (values that read as numbers, booleans or null are
converted), user tags become ``key=value`` tags, MLflow's own ``mlflow.*`` tags and
ids go to ``config["mlflow"]``, and every metric's full history is imported
(``get_metric_history`` pages through all of it), ordered by step then timestamp.
MLflow has no restarts, so every point lands in one segment; several values at one
step are all kept. Status: FINISHED -> finished, FAILED -> crashed, KILLED ->
killed, RUNNING/SCHEDULED -> running (import again when it has ended).
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import click
import numpy as np

from tracker.errors import ConfigError
from tracker.importer import Reporter, SourceRun, make_run_id, points_table

STATUS = {"FINISHED": "finished", "FAILED": "crashed", "KILLED": "killed", "RUNNING": "running",
          "SCHEDULED": "running"}


def param_value(text: str) -> Any:
    """An MLflow param (always a string) as the value it spells, when it spells one."""
    literals = {"True": True, "False": False, "None": None}
    if text in literals:
        return literals[text]
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (int, float, bool)) or value is None else text


def _client(uri: str) -> Any:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ConfigError("tracker import mlflow needs MLflow's client: pip install 'tracker[import]' "
                          "(mlflow-skinny)") from None
    return MlflowClient(tracking_uri=uri)


def _experiments(client: Any, uri: str, name: str | None) -> list[Any]:
    try:
        if name is None:
            return list(client.search_experiments())
        exp = client.get_experiment_by_name(name)
    except Exception as exc:
        raise ConfigError(f"cannot open MLflow tracking URI {uri!r}: {str(exc).splitlines()[0]}; "
                          "pass a sqlite:///path.db, file:///path/mlruns or http(s) URI") from None
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ConfigError(f"Unknown MLflow experiment {name!r} at {uri}; available: {', '.join(names) or 'none'}")
    return [exp]


def _runs(client: Any, experiment_id: str) -> Iterator[Any]:
    token = None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def read_run(client: Any, run: Any, experiment: Any) -> SourceRun:
    """One MLflow run with every metric's full history."""
    steps: list[int] = []
    keys: list[str] = []
    values: list[float] = []
    walls: list[float] = []
    for key in sorted(run.data.metrics):
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: (m.step, m.timestamp))
        steps.extend(m.step for m in history)
        values.extend(m.value for m in history)
        walls.extend(m.timestamp / 1000.0 for m in history)
        keys.extend([key] * len(history))
    tags = run.data.tags
    name = run.info.run_name or tags.get("mlflow.runName") or run.info.run_id
    config = {k: param_value(v) for k, v in run.data.params.items()}
    config["mlflow"] = {
        "run_id": run.info.run_id, "experiment_id": run.info.experiment_id,
        "artifact_uri": run.info.artifact_uri,
        "tags": {k: v for k, v in tags.items() if k.startswith("mlflow.")},
    }
    user_tags = [f"{k}={v}" if v else k for k, v in sorted(tags.items()) if not k.startswith("mlflow.")]
    return SourceRun(
        kind="mlflow", source=f"{experiment.name}/{run.info.run_id}",
        run_id=make_run_id("mlflow", name, run.info.run_id), name=name, project=experiment.name,
        points=points_table(np.asarray(steps, np.int64), keys, np.asarray(values, np.float64),
                            np.asarray(walls, np.float64)),
        config=config, tags=["import:mlflow", *user_tags], status=STATUS.get(run.info.status, "finished"),
        created_at=run.info.start_time / 1000.0 if run.info.start_time else None, restarts=False,
    )


class MlflowImporter:
    name = "mlflow"
    help = "Import MLflow runs through MlflowClient: params, tags, status, every metric's full history."
    params = [
        click.Option(["--tracking-uri"], required=True, help="sqlite:///mlflow.db, file:///path/mlruns or a server URL."),
        click.Option(["--experiment"], default=None, help="Only this experiment (default: every active one)."),
    ]

    def read(self, reporter: Reporter, tracking_uri: str, experiment: str | None = None,
             **_: Any) -> Iterator[SourceRun]:
        """Yield one run per MLflow run."""
        client = _client(tracking_uri)
        experiments = _experiments(client, tracking_uri, experiment)
        found = [(exp, run) for exp in experiments for run in _runs(client, exp.experiment_id)]
        reporter.start("reading MLflow runs", len(found))
        for exp, run in found:
            yield read_run(client, run, exp)
            reporter.advance(1)
