"""Many runs side by side: aggregates, groups with bands, compare, x axis by a logged key,
and their CLI commands, on real runs in a real store."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import tracker
from tracker import runsets
from tracker.errors import ConfigError, RunError
from tracker.store.local import Store



def _loss(scheme: str, seed: int, step: int) -> float:
    return (2.0 if scheme == "ce" else 1.0) / (step + 1) + seed * 0.01


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runsets")
    for scheme in ("ce", "focal"):
        for seed in range(3):
            run = tracker.init("p", home=root, system=False, run_id=f"{scheme}{seed}",
                               config={"loss": {"scheme": scheme, "beta": 0.9}, "seed": seed})
            for step in range(20):
                run.log({"loss": _loss(scheme, seed, step), "epoch": float(step // 5)}, step=step)
            run.set_classes(["rare", "common"])
            run.log_classes("val/AP50-95", [0.1 + seed * 0.1, 0.5 + (scheme == "focal") * 0.1], step=19)
            run.log_classes("assign/gt", [3.0, 300.0], step=19)
            run.finish()
    return root


def test_aggregates_match_the_logged_values(home: Path) -> None:
    agg = runsets.aggregates(Store(home), ["ce1"], ["loss"]).row(0, named=True)
    values = [_loss("ce", 1, s) for s in range(20)]
    assert agg["n_points"] == 20 and agg["last"] == pytest.approx(values[-1]) and agg["max"] == pytest.approx(values[0])
    assert agg["min_step"] == 19 and agg["max_step"] == 0 and agg["last_step"] == 19


def test_group_summary_and_bands(home: Path) -> None:
    store = Store(home)
    groups = runsets.group_summary(store, ["loss.scheme"], "loss").rows(named=True)
    assert [g["group"] for g in groups] == ["loss.scheme=focal", "loss.scheme=ce"]
    lasts = [_loss("ce", s, 19) for s in range(3)]
    assert groups[1]["n_runs"] == 3 and groups[1]["last_mean"] == pytest.approx(sum(lasts) / 3)
    assert groups[1]["last_std"] == pytest.approx(0.01) and groups[1]["runs"] == "ce0 ce1 ce2"
    bands = runsets.group_bands(store, ["ce0", "ce1", "ce2", "focal0"], ["loss.scheme"], "loss", buckets=20)
    ce = bands.filter(bands["group"] == "loss.scheme=ce (n=3)")
    assert ce.height == 20 and set(bands["group"]) == {"loss.scheme=ce (n=3)", "loss.scheme=focal (n=1)"}
    first = ce.row(0, named=True)
    assert first["mean"] == pytest.approx(sum(_loss("ce", s, 0) for s in range(3)) / 3)
    assert first["min"] == pytest.approx(_loss("ce", 0, 0)) and first["max"] == pytest.approx(_loss("ce", 2, 0))
    by_epoch = runsets.group_bands(store, ["ce0", "focal0"], ["loss.scheme", "loss.beta"], "loss", x_key="epoch", buckets=4)
    assert sorted(set(by_epoch["x"])) == [0.0, 1.0, 2.0, 3.0]
    epoch0 = by_epoch.filter((by_epoch["x"] == 0.0) & by_epoch["group"].str.starts_with("loss.scheme=ce"))
    assert epoch0["mean"][0] == pytest.approx(sum(_loss("ce", 0, s) for s in range(5)) / 5)
    with pytest.raises(ConfigError, match="config key"):
        runsets.group_summary(store, ["loss'; drop"], "loss")


def test_x_axis_sql_labels_every_row_with_the_last_value_at_or_before_it(home: Path) -> None:
    rows = Store(home).query(f"SELECT * FROM ({runsets.x_axis_sql('epoch')}) c WHERE c.run_id = 'ce0' AND c.key = 'loss' ORDER BY c.step")
    assert rows["x"].to_list() == [float(s // 5) for s in range(20)]


def test_epoch_as_x_takes_an_imported_historys_step(tmp_path: Path) -> None:
    home = tmp_path / "home"
    batch = tracker.init("p", home=home, system=False, run_id="batch")
    for step in range(12):  # 4 batches per epoch; epoch (completed, 1-based) logged at an epoch's last batch
        batch.log({"loss": 1.0 / (step + 1), **({"epoch": float((step + 1) // 4)} if step % 4 == 3 else {})}, step=step)
    batch.finish()
    imported = tracker.init("p", home=home, system=False, run_id="csv", tags=["import:ultralytics"])
    for epoch in (1, 2, 3):
        imported.log({"loss": 0.5 / epoch}, step=epoch)
    imported.finish()
    plain = tracker.init("p", home=home, system=False, run_id="other")
    plain.log({"loss": 1.0}, step=0)
    plain.finish()
    rows = Store(home).query(f"SELECT * FROM ({runsets.x_axis_sql('epoch')}) WHERE key = 'loss' ORDER BY run_id, step")
    by_run = {r: rows.filter(rows["run_id"] == r)["x"].to_list() for r in ("batch", "csv", "other")}
    assert by_run["batch"] == [1.0] * 4 + [2.0] * 4 + [3.0]  # steps 0-2 come before the first epoch row
    assert by_run["csv"] == [1.0, 2.0, 3.0] and by_run["other"] == []
    assert runsets.x_axis_sql("samples_seen").count("import:") == 0


def test_compare_shows_only_differences_and_side_by_side_metrics(home: Path) -> None:
    store = Store(home)
    diff = runsets.config_diff(store, ["ce0", "focal1"])
    assert diff.rows() == [("loss.scheme", '"ce"', '"focal"'), ("seed", "0", "1")]
    assert runsets.config_diff(store, ["ce0", "focal1"], only_differences=False).height == 3
    side = runsets.summary_side_by_side(store, ["ce0", "focal1"], ["loss"])
    last = side.filter(side["stat"] == "last").row(0, named=True)
    assert last["ce0"] == pytest.approx(_loss("ce", 0, 19)) and last["focal1"] == pytest.approx(_loss("focal", 1, 19))
    with pytest.raises(RunError, match="unknown run"):
        runsets.config_diff(store, ["ce0", "nobody"])
    with pytest.raises(ConfigError, match="two different runs"):
        runsets.config_diff(store, ["ce0", "ce0"])


def test_class_diff_puts_rare_classes_first(home: Path) -> None:
    diff = runsets.class_diff(Store(home), ["ce0", "focal2"])
    assert diff["class_name"].to_list() == ["rare", "common"]
    assert diff["Δ focal2"].to_list() == pytest.approx([0.2, 0.1])


def _cli(home: Path, *args: str) -> Any:
    from click.testing import CliRunner

    from tracker.cli import build_cli

    return CliRunner().invoke(build_cli(), [args[0], *args[1:], "--home", str(home)] if args[0] == "export"
                              else ["runs", *args, "--home", str(home)], catch_exceptions=False)


def test_cli_compare_and_groups(home: Path) -> None:
    out = _cli(home, "compare", "ce0", "focal2", "--key", "loss", "--format", "json")
    assert out.exit_code == 0, out.output
    made = json.loads(out.stdout)
    assert [c["key"] for c in made["config"]] == ["loss.scheme", "seed"]
    assert {m["stat"] for m in made["metrics"]} >= {"last", "min", "max"}
    assert [c["class_name"] for c in made["classes"]] == ["rare", "common"]
    table = _cli(home, "compare", "ce0", "focal2")
    assert table.exit_code == 0 and "loss.scheme" in table.stdout and "rarest first" in table.output
    out = _cli(home, "groups", "loss.scheme", "--key", "loss", "--format", "json")
    assert out.exit_code == 0, out.output
    groups = json.loads(out.stdout)
    assert [g["n_runs"] for g in groups] == [3, 3] and not math.isnan(groups[0]["last_std"])


def test_cli_export_with_a_logged_key_as_x(home: Path) -> None:
    out = _cli(home, "export", "ce1", "--x", "epoch")
    assert out.exit_code == 0, out.output
    lines = [line.split(",") for line in out.stdout.splitlines()]
    assert lines[0] == ["step", "key", "value", "wall_time", "rank", "x"]
    loss = [row for row in lines[1:] if row[1] == "loss"]
    assert [float(r[-1]) for r in loss] == [float(s // 5) for s in range(20)]
