"""The rare-class read-back (cumulative gradient ratio, boxes without a positive, AP against frequency)
and ``tracker advise`` on a run logged through ``run.log_assignments``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import tracker
from tracker.cli import build_cli
from tracker.rare_advice import advise, closest_beta, fit_power
from tracker.rare_classes import ap_frequency, collect, frequency_groups, grad_ratio, no_pos_share
from tracker.store import Store

NAMES = ["person", "car", "dog", "cat", "kite", "drier"]
COUNTS = [400, 200, 100, 40, 12, 3]


def _log_run(steps: int = 6) -> str:
    """A detector whose positives follow the counts and whose 'drier' boxes never get a positive."""
    run = tracker.init("rare", name="detector", config={"class_counts": dict(zip(NAMES, COUNTS)),
                                                       "batches_per_epoch": 3, "batch": 8, "imgsz": 64})
    run.set_classes(NAMES)
    rng = np.random.default_rng(0)
    for step in range(steps):
        gt = torch.tensor([[0, 0, 1, 2, 3, 5], [0, 1, 1, 2, 4, 5]])
        mask = torch.ones_like(gt, dtype=torch.bool)
        anchors = 40
        fg = torch.zeros(2, anchors, dtype=torch.bool)
        matched = torch.zeros(2, anchors, dtype=torch.long)
        a = 0
        for b in range(2):
            for slot in range(5):  # slot 5 (a drier) is never matched
                k = {0: 6, 1: 4, 2: 3, 3: 2, 4: 1}[int(gt[b, slot])]
                fg[b, a:a + k], matched[b, a:a + k] = True, slot
                a += k
            a = 0
        logits = torch.tensor(rng.normal(-2, 1, size=(2, anchors, 6)), dtype=torch.float32)
        targets = torch.zeros(2, anchors, 6)
        for b in range(2):
            for i in range(anchors):
                if fg[b, i]:
                    targets[b, i, int(gt[b, matched[b, i]])] = 1.0
        run.log_assignments(gt_labels=gt, gt_mask=mask, fg_mask=fg, matched_gt=matched, logits=logits,
                            targets=targets, step=step, anchor_strides=torch.tensor([8.0] * 32 + [16.0] * 8))
        if step % 3 == 2:
            ap = np.array([0.6, 0.5, 0.4, 0.2, 0.05, np.nan]) * (1 + step / 10)
            run.log_classes("val/AP50-95", ap, step=step)
            run.log_classes("val/AP50", np.minimum(1, ap * 1.5), step=step)
    run.finish()
    return run.run_id


def test_cumulative_ratio_and_no_positive_share_are_derived_in_sql() -> None:
    run_id = _log_run()
    store = Store()
    ratio = grad_ratio(store, run_id)
    raw = store.query("SELECT step, class_index, key, value FROM class_curves WHERE run_id = ? AND "
                      "starts_with(key, 'grad/')", [run_id])
    for c in range(len(NAMES)):
        mine = raw.filter(raw["class_index"] == c).sort("step")
        pos = np.cumsum(mine.filter(mine["key"] == "grad/pos")["value"].to_numpy())
        neg = np.cumsum(mine.filter(mine["key"] == "grad/neg")["value"].to_numpy())
        got = ratio.filter(ratio["class_index"] == c).sort("step")
        np.testing.assert_allclose(got["ratio"].to_numpy(), pos / neg, rtol=1e-12)
    share = no_pos_share(store, run_id)
    drier = share.filter(share["class_name"] == "drier").row(0, named=True)
    assert drier["gt"] == 12 and drier["gt_no_pos"] == 12 and drier["share"] == 1.0  # 2 a step, 6 steps
    person = share.filter(share["class_name"] == "person").row(0, named=True)
    assert person["gt"] == 18 and person["gt_no_pos"] == 0
    ap = ap_frequency(store, run_id, np.array(COUNTS, dtype=float))
    assert sorted(set(ap["epoch"].to_list())) == [1, 2]
    np.testing.assert_allclose(ap.filter(ap["class_name"] == "person")["log_count"].to_numpy(), np.log10(400))


def test_frequency_groups_and_fits() -> None:
    groups = frequency_groups(np.array([0, 5, 50, 500, 1, 10, 100.0]))
    assert groups == {"rare": [4, 1], "common": [5, 2], "frequent": [6, 3]}
    counts = np.array([1000, 300, 100, 30, 10, 3.0])
    p, r2, n = fit_power(counts, 0.2 * counts ** 0.7)
    assert p == pytest.approx(0.7) and r2 == pytest.approx(1.0) and n == 6
    assert fit_power(counts[:2], counts[:2]) is None
    assert closest_beta(counts, 1.0) > closest_beta(counts, 0.1)


def test_advise_names_changes_with_their_evidence() -> None:
    run_id = _log_run()
    rc = collect(Store(), run_id)
    kinds = {a.kind: a for a in advise(rc)}
    assert {"weights", "repeat", "assignment"} <= set(kinds)
    assert "drier" in kinds["assignment"].params["classes"] and kinds["assignment"].params["imgsz"] == 128
    assert kinds["weights"].params["scheme"] == "power" and 0 < kinds["weights"].params["power"] <= 1
    assert any("steps 0-5" in e for e in kinds["weights"].evidence)
    groups = kinds["repeat"].params["groups"]
    assert groups["rare"]["share_after"] > groups["rare"]["share_before"]
    assert groups["frequent"]["share_after"] < groups["frequent"]["share_before"]


def test_tracker_advise_json_and_exit_status(home: Path) -> None:
    run_id = _log_run()
    runner = CliRunner()
    res = runner.invoke(build_cli(), ["advise", run_id, "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["run_id"] == run_id and out["advice"]
    kinds = {a["kind"] for a in out["advice"]}
    assert ("pos_weight" in kinds) != any(c.startswith("positive weights") for c in out["checked"])
    assert "track(model, loss=\"class_weighted_bce\", scheme='power'" in out["restart"]
    text = runner.invoke(build_cli(), ["advise", run_id])
    assert text.exit_code == 0 and "restart with:" in text.output and "drier" in text.output
    bare = tracker.init("rare", name="no-signals")
    bare.log({"loss": 1.0}, step=0)
    bare.finish()
    res = runner.invoke(build_cli(), ["advise", bare.run_id])
    assert res.exit_code == 3 and "no assignment" in res.output
    res = runner.invoke(build_cli(), ["advise", "no-such-run"])
    assert res.exit_code == 1 and "unknown" in res.output
    assert "Exit status" in runner.invoke(build_cli(), ["advise", "--help"]).output
