"""A few real trainings of the fault corpus (bench/faults.py), short: the detectors fire on the faulty
runs and stay quiet on their healthy twins.

Each run trains the digits CNN of ``bench/faults_digits.py`` for real in this process (torch, one
thread, a few seconds), with the system sampler on where a system detector judges it; the labels
come from the fault (its injection step) or from what the run measured (its first non-finite loss).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

import tracker
from bench.faults import _child
from bench.faults_digits import DigitsSpec, train
from bench.faults_labels import DIVERGE_FACTOR
from bench.faults_score import report

pytestmark = pytest.mark.slow
FAST = 0.05  # the sampler's interval in these short runs (the default is 2 s)
# Trained in a process of their own, as a training is: a leak judged on the process' RSS is invisible in a
# test process whose heap earlier tests freed (the leak fills the free heap and the RSS does not rise)
OWN_PROCESS = ("leak_fast", "healthy_long")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("faults") / "home"
    specs = {
        "healthy": DigitsSpec("healthy", epochs=12, interval=FAST),
        "lr_high": DigitsSpec("lr_high", epochs=12, onset_epoch=3, interval=FAST),
        # the step schedule's factor at 1: the "fault" leaves the learning rate as it was, the loss keeps falling
        "lr_same": DigitsSpec("lr_high", epochs=6, onset_epoch=3, lr_factor=1.0, interval=FAST, name="digits-lr_same"),
        "fp16": DigitsSpec("fp16", epochs=1, interval=FAST),
        "fp16_scaled": DigitsSpec("fp16_scaled", epochs=1, interval=FAST),
        "healthy_long": DigitsSpec("healthy", epochs=34, interval=FAST, name="digits-healthy_long-s0"),
        "stall": DigitsSpec("stall", epochs=8, onset_epoch=3, interval=FAST),
        "leak_fast": DigitsSpec("leak_fast", epochs=34, onset_epoch=4, interval=FAST),
        "empty_class": DigitsSpec("empty_class", epochs=4, interval=FAST),
        "imbalance": DigitsSpec("imbalance", epochs=12, interval=FAST),
        "tiny": DigitsSpec("tiny", epochs=60, interval=FAST),
    }
    records = {name: _child("bench.faults_digits", asdict(spec), home) if name in OWN_PROCESS
               else train(spec, home=home) for name, spec in specs.items()}
    events = {name: [r.event for r in tracker.analyze(rec["run_id"], home=home).events]
              for name, rec in records.items()}
    return {"home": home, "records": records, "events": events}


def _kinds(runs: dict[str, Any], name: str) -> set[str]:
    return {e.kind for e in runs["events"][name]}


@pytest.mark.parametrize("fault, twin, kind", [
    ("lr_high", "healthy", "divergence"),
    ("fp16", "fp16_scaled", "non_finite"),
    ("stall", "healthy_long", "data_stall"),
    ("leak_fast", "healthy_long", "memory_growth"),
    ("empty_class", "healthy", "zero_loss"),
    ("imbalance", "healthy", "stagnant_classes"),
])
def test_the_detector_fires_on_the_fault_and_not_on_its_twin(runs: dict[str, Any], fault: str, twin: str,
                                                             kind: str) -> None:
    (label,) = [lb for lb in runs["records"][fault]["labels"] if lb["kind"] == kind]
    hits = [e for e in runs["events"][fault] if e.kind == kind and label["lo"] <= e.step <= label["hi"]]
    assert hits, (fault, label, [(e.kind, e.step, e.key) for e in runs["events"][fault]])
    assert not [e for e in runs["events"][fault] if e.kind == kind and e.step < label["lo"]], "before the fault"
    assert kind not in _kinds(runs, twin), [(e.kind, e.step, e.key, e.message) for e in runs["events"][twin]]


def test_the_labels_come_from_the_fault_and_the_run(runs: dict[str, Any]) -> None:
    records = runs["records"]
    assert records["fp16"]["first_nan"] is not None and records["fp16_scaled"]["first_nan"] is None
    per_epoch = records["lr_high"]["steps_per_epoch"]
    assert [lb["onset"] for lb in records["lr_high"]["labels"] if lb["kind"] == "divergence"] == [3 * per_epoch]
    assert records["leak_fast"]["kept_bytes"] > 50e6  # the kept features, ~60 KB a step
    assert {lb["kind"] for lb in records["healthy"]["labels"]} <= {"overfitting"}  # measured from val/loss


def test_a_divergence_label_needs_the_loss_to_grow(runs: dict[str, Any]) -> None:
    """The lr_high run's train loss ends far above its best before the onset: labelled and manifested; the same
    fault with a factor of 1 leaves the loss falling: no label, not manifested, left out of divergence's score."""
    high, same = runs["records"]["lr_high"], runs["records"]["lr_same"]
    assert high["manifested"] is True and high["unscored"] == []
    assert high["divergence_measured"]["train/loss"]["ratio"] >= DIVERGE_FACTOR
    assert same["manifested"] is False and same["unscored"] == ["divergence"]
    assert same["divergence_measured"]["train/loss"]["ratio"] < 1
    assert not [lb for lb in same["labels"] if lb["kind"] == "divergence"]


def test_the_score_names_a_fault_that_did_not_manifest(runs: dict[str, Any]) -> None:
    """Scored as a corpus, the run whose fault did not manifest is named and judged for no divergence: neither a
    miss nor a control."""
    out: Path = runs["home"].parent
    records = [dict(runs["records"][name], role="held-out") for name in ("lr_high", "lr_same")]
    (out / "labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    lines: list[str] = []
    scores = report(out, echo=lines.append)
    divergence = scores["held-out"]["divergence"]
    assert (divergence.tp, divergence.fn, divergence.runs) == (1, 0, 1), divergence
    assert [line for line in lines if "not manifested" in line and "digits-lr_same" in line], lines


def test_the_runs_log_what_a_user_loop_logs(runs: dict[str, Any]) -> None:
    home: Path = runs["home"]
    rid = runs["records"]["stall"]["run_id"]
    keys = set(tracker.query("SELECT DISTINCT key FROM curves WHERE run_id = ?", [rid], home=home)["key"].to_list())
    assert {"train/loss", "lr", "sys/data_time", "sys/step_time", "sys/proc/rss", "val/loss", "epoch"} <= keys
    per_class = tracker.query("SELECT count(DISTINCT class_index) AS n FROM class_curves WHERE run_id = ?", [rid],
                              home=home)["n"][0]
    assert per_class == 10


def test_online_overfitting_and_converged_losses(runs: dict[str, Any]) -> None:
    """The tiny training set overfits (its label is measured from val/loss) and is flagged in its window; no run
    without that label is; the healthy runs converge to ~1e-4 with 2x batch noise and are neither diverging nor
    plateaued."""
    records, events = runs["records"], runs["events"]
    (label,) = [lb for lb in records["tiny"]["labels"] if lb["kind"] == "overfitting"]
    hits = [e for e in events["tiny"] if e.kind == "overfitting" and label["lo"] <= e.step <= label["hi"]]
    assert hits and hits[0].key == "val/loss", [(e.kind, e.step) for e in events["tiny"]]
    for name, record in records.items():
        if not any(lb["kind"] == "overfitting" for lb in record["labels"]):
            assert "overfitting" not in _kinds(runs, name), name
    for name in ("healthy", "healthy_long"):
        assert not _kinds(runs, name) & {"divergence", "plateau"}, [(e.kind, e.step) for e in events[name]]


@pytest.mark.parametrize("name, kind", [("empty_class", "zero_loss"), ("tiny", "overfitting"),
                                        ("imbalance", "stagnant_classes")])
def test_the_flusher_raised_them_online(runs: dict[str, Any], name: str, kind: str) -> None:
    """The run's own flusher stored the same events while it trained as tracker.analyze finds afterwards."""
    rid = runs["records"][name]["run_id"]
    online = tracker.query("SELECT step, key FROM events WHERE run_id = ? AND kind = ? ORDER BY step", [rid, kind],
                           home=runs["home"])
    offline = [(e.step, e.key) for e in runs["events"][name] if e.kind == kind]
    assert offline and [tuple(r) for r in online.iter_rows()] == offline
