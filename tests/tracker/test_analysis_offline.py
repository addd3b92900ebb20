"""``tracker.analyze`` and ``tracker analyze`` on runs in a real store."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import tracker
from tracker.analysis import analyze, save_events
from tracker.analysis.corpus import scalar_cases
from tracker.analysis.online import make_online_analyzer
from tracker.cli import build_cli
from tracker.errors import ConfigError, RunError
from tracker.host import get_host


def curve(kind: str, seed: int = 0) -> np.ndarray:
    return next(c for c in scalar_cases(1, seed=seed) if c.kind == kind).values


def log_run(
    curves: dict[str, np.ndarray], config: dict[str, Any] | None = None, flush_every: int = 0, **init: Any
) -> str:
    run = tracker.init("offline", config=config or {}, **init)
    n = max(v.size for v in curves.values())
    for step in range(n):
        run.log({k: float(v[step]) for k, v in curves.items() if step < v.size}, step=step)
        if flush_every and step % flush_every == flush_every - 1:
            run.flush()
    run.finish()
    return run.run_id


def stored(run_id: str) -> list[tuple[Any, ...]]:
    df = tracker.query(
        "SELECT step, key, kind, message, data FROM events WHERE run_id = ? ORDER BY step, key, kind", [run_id]
    )
    return [(s, k, kind, m, json.loads(d)) for s, k, kind, m, d in df.iter_rows()]


def offline(run_id: str, **kw: Any) -> list[tuple[Any, ...]]:
    found = analyze(run_id, **kw).events
    return [(r.event.step, r.event.key, r.event.kind, r.event.message, r.event.data) for r in found]


def test_verdicts_per_loss_key() -> None:
    run_id = log_run(
        {
            "loss/converging": curve("converging"),
            "loss/diverging": curve("diverging"),
            "loss/plateau": curve("plateau"),
            "loss/short": curve("converging")[:9],
            "loss/nan": np.where(np.arange(6000) < 5000, curve("converging", seed=1), np.nan),
            "lr": np.full(6000, 0.01),
        }
    )
    result = analyze(run_id)
    verdicts = {r.key: r.verdict for r in result.keys}
    assert verdicts == {
        "loss/converging": "converging",
        "loss/diverging": "diverging",
        "loss/plateau": "plateaued",
        "loss/short": "too short to tell",
        "loss/nan": "diverging",
    }
    assert next(r for r in result.keys if r.key == "loss/nan").reason == "the loss is NaN/inf from step 5000 to the end"
    conv = next(r for r in result.keys if r.key == "loss/converging")
    assert conv.trend is not None and conv.trend.confidence > 0.99 and conv.points == 6000 and conv.last_step == 5999
    assert "confidence" in conv.reason
    found = {(e.event.key, e.event.kind) for e in result.events}
    assert found >= {("loss/diverging", "divergence"), ("loss/plateau", "plateau")}
    data = json.loads(json.dumps(result.to_dict()))
    assert data["run_id"] == run_id and data["keys"][0]["trend"]["n"] <= 500


def test_online_and_offline_agree_on_the_same_run() -> None:
    values = curve("spikes", seed=2)
    values[[1234, 1235]] = np.nan
    run_id = log_run({"loss": values, "loss/d": curve("diverging", seed=2)}, flush_every=333)
    online = stored(run_id)
    assert {e[2] for e in online} >= {"spike", "non_finite", "divergence"}
    assert online == offline(run_id)


def test_resumed_rows_are_hidden_from_the_analysis() -> None:
    healthy = curve("converging", seed=4)
    bad = healthy.copy()
    bad[3000:] *= np.exp(np.arange(3000) / 50).clip(max=50)
    run_id = log_run({"loss": bad[:4000]})
    assert tracker.query("SELECT status FROM runs WHERE run_id = ?", [run_id])["status"][0] == "diverged"
    run = tracker.init("offline", run_id=run_id, resume="must", resume_step=2900)
    for step in range(2900, 6000):
        run.log({"loss": float(healthy[step])}, step=step)
    run.finish()
    result = analyze(run_id)
    assert [e for e in result.events if e.event.kind == "divergence"] == []
    assert result.keys[0].verdict == "converging" and result.keys[0].points == 6000


def test_stagnant_classes_are_reported_with_their_names() -> None:
    rng = np.random.default_rng(0)
    t = np.arange(600)[:, None]
    per_class = (1 + t / 10.0) ** -1.0 * np.ones((600, 6))
    per_class[:, [4, 5]] = 0.7
    per_class *= rng.lognormal(0, 0.1, per_class.shape)
    run = tracker.init("offline")
    run.set_classes(["person", "car", "dog", "cat", "toaster", "hair drier"])
    for step in range(600):
        run.log({"loss": float(per_class[step].sum())}, step=step)
        run.log_classes("loss/cls", per_class[step], step=step)
    run.finish()
    result = analyze(run.run_id, stagnant_classes={"window": 100, "every": 100})
    (report,) = result.stagnant
    assert report.key == "loss/cls" and [c.name for c in report.classes] == ["toaster", "hair drier"]
    assert report.total_change < -0.2 and all(abs(c.change) < 0.05 for c in report.classes)
    (event,) = [e.event for e in result.events if e.event.kind == "stagnant_classes"]
    assert "toaster, hair drier" in event.message


def test_rank_disagreement_across_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_RUN_ID", "ddp-run")
    monkeypatch.setenv("WORLD_SIZE", "3")
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        run = tracker.init("ddp", resume="allow")
        for epoch in range(5):
            fp = 1000.0 + epoch if rank != 2 or epoch < 3 else 7.0 + epoch
            run.log({"rng/fingerprint": fp, "rng/epoch": float(epoch)}, step=epoch * 100)
            run.log({"loss": 1.0 / (epoch + 1)}, step=epoch * 100 + 1)
        run.finish()
    result = analyze("ddp-run")
    (event,) = [r for r in result.events if r.event.kind == "rank_disagreement"]
    assert event.event.step == 300 and event.event.data["ranks"] == [2] and event.event.data["epochs"] == [3, 4]
    assert "ranks 2 drew a different RNG fingerprint from ranks 0, 1" in event.event.message
    assert {r.rank for r in result.keys} == {0, 1, 2}


def test_run_and_key_lookup() -> None:
    run_id = log_run({"loss": curve("converging")[:300], "lr": np.linspace(0.1, 0.01, 300)})
    assert analyze(run_id[:-2]).run_id == run_id
    with pytest.raises(RunError, match="Run 'nope' is unknown; recent runs: " + run_id):
        analyze("nope")
    with pytest.raises(ConfigError, match="Unknown key 'loss/x' in run .*; available: loss, lr"):
        analyze(run_id, key="loss/x")
    (lr,) = analyze(run_id, key="lr").keys
    assert lr.key == "lr" and lr.verdict == "converging"
    with pytest.raises(ConfigError, match="Unknown parameter 'fator'"):
        analyze(run_id, divergence={"fator": 2})


def test_save_adds_only_new_events() -> None:
    run_id = log_run({"loss": curve("non_finite")}, config={"analysis": False})
    assert stored(run_id) == []
    result = analyze(run_id)
    assert result.events
    assert save_events(result) == len(result.events)
    assert save_events(analyze(run_id)) == 0
    assert [e[:3] for e in stored(run_id)] == [(r.event.step, r.event.key, r.event.kind) for r in result.events]


def test_cli_table_json_set_and_save() -> None:
    values = curve("diverging", seed=5)
    run_id = log_run({"loss/box": values, "loss/cls": curve("converging", seed=5)}, config={"analysis": False})
    cli = build_cli()
    runner = CliRunner()
    table = runner.invoke(cli, ["analyze", run_id], terminal_width=200)
    assert table.exit_code == 0, table.output
    assert "diverging" in table.output and "converging" in table.output and "divergence" in table.output
    as_json = runner.invoke(cli, ["analyze", run_id, "--format", "json"])
    assert as_json.exit_code == 0
    data = json.loads(as_json.output)
    assert data == json.loads(json.dumps(analyze(run_id).to_dict(), default=str))
    as_json_with = ["analyze", run_id, "--format", "json", "--set"]
    loose = json.loads(runner.invoke(cli, [*as_json_with, "divergence.factor=1000"]).output)
    assert not [e for e in loose["events"] if e["kind"] == "divergence"]
    off = json.loads(runner.invoke(cli, [*as_json_with, "divergence.enabled=false"]).output)
    assert not [e for e in off["events"] if e["kind"] == "divergence"]
    one = json.loads(runner.invoke(cli, ["analyze", run_id, "--key", "loss/cls", "--format", "json"]).output)
    assert [k["key"] for k in one["keys"]] == ["loss/cls"]
    saved = runner.invoke(cli, ["analyze", run_id, "--save"], terminal_width=200)
    assert saved.exit_code == 0 and "saved 1 new event" in saved.output
    bad = runner.invoke(cli, ["analyze", run_id, "--set", "divergence.fator=2"])
    assert bad.exit_code == 1 and bad.output.startswith("Error: Unknown parameter 'fator'")
    assert "Traceback" not in bad.output
    missing = runner.invoke(cli, ["analyze", "no-such-run"])
    assert missing.exit_code == 1 and "Run 'no-such-run' is unknown" in missing.output


def test_a_bound_analyzer_names_classes_and_warms_up_after_a_resume() -> None:
    values = curve("spikes", seed=6)
    values[4500:] *= np.exp(np.arange(1500) / 80).clip(max=30)
    run_id = log_run({"loss": values[:4000]})
    resumed = tracker.init("offline", run_id=run_id, resume="must", resume_step=3000)
    resumed.set_classes(["a", "b"])
    analyzer = make_online_analyzer(run_id=run_id, config={}, detectors=get_host().items("detectors"), run=resumed)
    for step in range(3000, 6000):
        resumed.log({"loss": float(values[step])}, step=step)
    resumed.finish()
    tail = tracker.query(
        "SELECT step, key, value, wall_time FROM curves WHERE run_id = ? AND step >= 3000 ORDER BY step", [run_id]
    ).to_arrow()
    online = [e for lo in range(0, tail.num_rows, 700) for e in analyzer.observe(tail.slice(lo, 700))]
    assert analyzer.class_names == {0: "a", 1: "b"}
    expected = [r.event for r in analyze(run_id).events if r.event.step >= 3000]
    assert {e.kind for e in expected} >= {"divergence", "spike"}
    assert [(e.step, e.kind, e.message, e.data) for e in online] == [
        (e.step, e.kind, e.message, e.data) for e in expected
    ]
    cold = make_online_analyzer(run_id=run_id, config={}, detectors=get_host().items("detectors"))
    cold_events = [e for lo in range(0, tail.num_rows, 700) for e in cold.observe(tail.slice(lo, 700))]
    assert [(e.step, e.kind) for e in cold_events] != [(e.step, e.kind) for e in expected]
