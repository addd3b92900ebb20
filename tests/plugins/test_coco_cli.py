"""The coco plugin: its hooks and the ``tracker coco`` commands, checked with real COCO clients."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import click
import orjson
import pytest
from click.testing import CliRunner
from pycocotools.coco import COCO

import plugins.coco as plugin
from tests.harness.coco import VAL100, check_with_real_clients, write_scaled_synthetic
from tracker import coco
from tracker.cli import build_cli
from tracker.host import Host, make_plugin_manager


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_scaled_synthetic(tmp_path_factory.mktemp("cli") / "syn.json", 0.01, 1200, seed=2)


def run(*args: str) -> click.testing.Result:
    return CliRunner().invoke(build_cli(), [str(a) for a in args], catch_exceptions=False)


def test_hooks_register_samplers_and_commands() -> None:
    host = Host(make_plugin_manager(default_plugins=("plugins.coco",), entry_points=False))
    assert set(host.items("samplers")) == {"repeat_factor", "class_aware"}
    assert host.status("coco") is None
    group = click.Group("root")
    plugin.tracker_register_commands(cli=group)
    assert set(group.commands["coco"].commands) == {"stats", "balance", "split"}


def test_stats_csv_matches_pycocotools() -> None:
    result = run("coco", "stats", VAL100, "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.output)))
    ref = COCO(str(VAL100))
    assert [int(r["id"]) for r in rows] == sorted(ref.getCatIds())
    for r in rows:
        assert int(r["instances"]) == len(ref.getAnnIds(catIds=[int(r["id"])], iscrowd=None))
        assert r["name"] == ref.loadCats(int(r["id"]))[0]["name"]


def test_stats_json_and_table(synthetic: Path) -> None:
    result = run("coco", "stats", synthetic, "--format", "json", "--sort", "instances")
    data = json.loads(result.output)
    ours = coco.stats(coco.load(synthetic))
    assert data["normalized_entropy"] == pytest.approx(ours.normalized_entropy)
    assert data["num_annotations"] == ours.num_annotations
    assert [c["instances"] for c in data["classes"]] == sorted((c.instances for c in ours.classes), reverse=True)
    table = run("coco", "stats", synthetic).output
    assert "Distribution of instances among all categories" in table
    assert f"normalised entropy: {ours.normalized_entropy:.3f}" in table
    assert f"max/min ratio: {ours.imbalance_ratio:,.1f}:1" in table
    assert "hair drier" in table and "images without annotations" in table


def test_balance_writes_valid_coco_and_prints_before_after(synthetic: Path, tmp_path: Path) -> None:
    out = tmp_path / "balanced.json"
    result = run("coco", "balance", synthetic, "--out", out, "--max-images", 300, "--seed", 1)
    assert result.exit_code == 0, result.output
    assert "before and after balancing" in result.output and f"wrote {out}" in result.output
    check_with_real_clients(out)
    written = orjson.loads(out.read_bytes())
    assert len(written["images"]) == 300
    src = orjson.loads(synthetic.read_bytes())
    assert written["categories"] == src["categories"] and written["info"] == src["info"]
    image_ids = {i["id"] for i in written["images"]}
    assert all(a["image_id"] in image_ids for a in written["annotations"])
    stats = coco.stats(coco.load(out))
    assert stats.normalized_entropy > coco.stats(coco.load(synthetic)).normalized_entropy + 0.1
    assert f"normalised entropy: 0.785 -> {stats.normalized_entropy:.3f}" in result.output


def test_balance_per_class_and_sqrt(synthetic: Path, tmp_path: Path) -> None:
    out = tmp_path / "pc.json"
    result = run("coco", "balance", synthetic, "--out", out, "--per-class", 30, "--target", "sqrt")
    assert result.exit_code == 0, result.output
    check_with_real_clients(out)
    assert max(coco.class_counts(out).values()) < max(coco.class_counts(synthetic).values()) / 10


def test_split_writes_two_valid_disjoint_files(synthetic: Path, tmp_path: Path) -> None:
    result = run("coco", "split", synthetic, "--val", 0.25, "--out-dir", tmp_path / "parts")
    assert result.exit_code == 0, result.output
    train, val = tmp_path / "parts" / "syn_train.json", tmp_path / "parts" / "syn_val.json"
    for part in (train, val):
        check_with_real_clients(part)
    t_ids = {i["id"] for i in orjson.loads(train.read_bytes())["images"]}
    v_ids = {i["id"] for i in orjson.loads(val.read_bytes())["images"]}
    all_ids = {i["id"] for i in orjson.loads(synthetic.read_bytes())["images"]}
    assert not t_ids & v_ids and t_ids | v_ids == all_ids
    assert len(v_ids) == pytest.approx(0.25 * len(all_ids), abs=3)
    total = coco.stats(coco.load(synthetic)).num_annotations
    assert coco.stats(coco.load(train)).num_annotations + coco.stats(coco.load(val)).num_annotations == total


def test_errors_are_one_clean_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    data = orjson.loads(VAL100.read_bytes())
    data["annotations"][3]["bbox"] = [0, 0, -5, 2]
    bad.write_bytes(orjson.dumps(data))
    result = CliRunner().invoke(build_cli(), ["coco", "stats", str(bad)])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and "annotation #3" in result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1
    lenient = CliRunner().invoke(build_cli(), ["coco", "stats", str(bad), "--skip-invalid", "--format", "json"])
    assert lenient.exit_code == 0
    assert "skipped 1 invalid annotations (first: annotation #3" in lenient.output
    no_budget = CliRunner().invoke(build_cli(), ["coco", "balance", str(VAL100), "--out", str(tmp_path / "x.json")])
    assert no_budget.exit_code == 1 and "needs --per-class N or --max-images M" in no_budget.output
    missing_dir = CliRunner().invoke(build_cli(), ["coco", "balance", str(VAL100), "--per-class", "5",
                                                   "--out", str(tmp_path / "nope" / "x.json")])
    assert missing_dir.exit_code == 1 and "does not exist; create it first" in missing_dir.output
    assert not (tmp_path / "x.json").exists()
