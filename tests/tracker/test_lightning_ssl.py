"""Real self-supervised trainings with Lightning on scikit-learn's digits, tracked by TrackerLogger.

Three trainings run once per module (``bench.ssl_digits``, CPU, a small MLP):
SimSiam with its stop-gradient (healthy), the same without it (it collapses, as in
SimSiam's Fig. 2) and SimCLR with ``nt_xent`` (the healthy control). The larger
version, scored over methods and seeds, is ``bench/collapse.py``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterator

import polars as pl
import pytest

import tracker
from bench.ssl_digits import DIM, train
from tracker.analysis.collapse import collapse_events

pytestmark = pytest.mark.slow
STEPS = 120
EVERY = 512  # samples between two evaluations of the window: every other step


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("ssl-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACKER_HOME", str(home))
        mp.setenv("TRACKER_LOGGERS", "store")
        mp.setenv("TRACKER_SYSTEM", "0")
        records = {m: train(m, steps=STEPS, seed=0, every=EVERY) for m in ("simsiam", "simsiam_nostop", "simclr")}
        curves = tracker.query("SELECT run_id, step, key, value FROM curves ORDER BY run_id, key, step")
        runs = tracker.query("SELECT run_id, name, status, config FROM runs")
        events = tracker.query("SELECT run_id, step, key, kind, message, data FROM events")
        offline = {m: collapse_events(r.run_id) for m, r in records.items()}
        yield {"records": records, "curves": curves, "runs": runs, "events": events, "offline": offline,
               "home": home}
    from tracker.store import release

    release()


def _series(trained: dict[str, Any], method: str, key: str) -> pl.DataFrame:
    run_id = trained["records"][method].run_id
    return trained["curves"].filter((pl.col("run_id") == run_id) & (pl.col("key") == key))


def test_simsiam_with_the_stop_gradient_has_no_collapse_event(trained: dict[str, Any]) -> None:
    record = trained["records"]["simsiam"]
    assert record.events == []
    std = _series(trained, "simsiam", "proj/std")["value"]
    # every other step once the window holds 2 * D samples; fewer when the worker (nice +10) falls behind a
    # fast loop on a busy machine, and drops samples a window late
    assert std.len() >= 8
    assert std.min() * math.sqrt(DIM) > 0.6  # close to 1/sqrt(d) all along


def test_simsiam_without_the_stop_gradient_collapses_within_a_few_hundred_steps(trained: dict[str, Any]) -> None:
    record = trained["records"]["simsiam_nostop"]
    std_events = [e for e in record.events if e["key"] == "proj/std"]
    assert std_events and std_events[0]["step"] <= 150
    assert "stop-gradient" in std_events[0]["message"] and "1/sqrt(D)" in std_events[0]["message"]
    std = _series(trained, "simsiam_nostop", "proj/std")["value"]
    assert std[-1] * math.sqrt(DIM) < 0.3 < std[0] * math.sqrt(DIM)
    rankme = _series(trained, "simsiam_nostop", "proj/rankme")["value"]
    assert rankme[-1] < 0.5 * rankme.max()


def test_simclr_with_nt_xent_is_a_healthy_control(trained: dict[str, Any]) -> None:
    record = trained["records"]["simclr"]
    assert record.events == []
    healthy = record.final["proj/std"]
    collapsed = trained["records"]["simsiam_nostop"].final["proj/std"]
    assert healthy > 3 * collapsed
    assert record.knn_accuracy > 0.7  # the representation is useful: 5-NN on held-out digits


def test_the_events_are_stored_and_offline_analysis_agrees(trained: dict[str, Any]) -> None:
    events = trained["events"].filter(pl.col("kind") == "collapse")
    assert set(events["run_id"]) == {trained["records"]["simsiam_nostop"].run_id}
    for method, record in trained["records"].items():
        offline = [(e.step, e.key) for e in trained["offline"][method]]
        assert offline == [(e["step"], e["key"]) for e in record.events]


def test_the_logger_records_version_hyperparameters_and_metrics(trained: dict[str, Any]) -> None:
    record = trained["records"]["simsiam"]
    runs = trained["runs"].filter(pl.col("run_id") == record.run_id)
    assert runs["name"][0] == "simsiam-s0" and runs["status"][0] == "finished"
    config = runs["config"][0]
    assert '"method": "simsiam"' in config and '"tracker_embeddings"' in config and f'"dim": {DIM}' in config
    loss = _series(trained, "simsiam", "train/loss")
    assert loss["step"].to_list() == list(range(STEPS))  # Lightning's step, one row per batch
    assert loss["value"][-1] < loss["value"][0]  # negative cosine falls towards -1
    assert os.path.isdir(Path(trained["home"]) / "runs" / record.run_id)
