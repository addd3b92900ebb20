"""The per-class page's "Rare classes" section (AppTest) and its plain data function."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tracker
from webui.rare_section import rare_view

NAMES = ["person", "car", "dog", "drier"]
COUNTS = [300, 60, 12, 2]


def log_detector(home: Path) -> str:
    """6 steps of a detector whose driers never get a positive anchor, and 2 validations."""
    run = tracker.init("yolo", name="assigned", run_id="run-assign", home=home, loggers=["store"],
                       config={"class_counts": COUNTS, "analysis": False})
    run.set_classes(NAMES)
    gt = torch.tensor([[0, 0, 1, 3], [0, 1, 2, 3]])
    fg = torch.zeros(2, 12, dtype=torch.bool)
    matched = torch.zeros(2, 12, dtype=torch.long)
    for b, slots in enumerate([[0, 0, 0, 1, 1, 2], [0, 0, 0, 1, 1, 2, 2]]):
        fg[b, : len(slots)] = True
        matched[b, : len(slots)] = torch.tensor(slots) if b else torch.tensor([0, 0, 1, 1, 1, 2])
    targets = torch.zeros(2, 12, 4)
    for b in range(2):
        for a in range(12):
            if fg[b, a]:
                targets[b, a, int(gt[b, matched[b, a]])] = 1.0
    for step in range(6):
        logits = torch.full((2, 12, 4), -1.0 - step / 5)
        run.log_assignments(gt_labels=gt, gt_mask=torch.ones_like(gt, dtype=torch.bool), fg_mask=fg,
                            matched_gt=matched, logits=logits, targets=targets, step=step)
        if step % 3 == 2:
            run.log_classes("val/AP50-95", [0.5 + step / 100, 0.3, 0.1, math.nan], step=step)
            run.log_classes("val/AP50", [0.7, 0.5, 0.2, math.nan], step=step)
    run.finish()
    return run.run_id


def test_rare_view_groups_classes_and_shares(store_home: Path, store: Any) -> None:
    run_id = log_detector(store_home)
    view = rare_view(store, run_id, with_stagnant=False)
    assert set(view.groups["group"].to_list()) == {"rare", "common", "frequent"}
    assert sorted(set(view.groups["step"].to_list())) == list(range(6))
    drier = view.no_pos.filter(view.no_pos["class_name"] == "drier").row(0, named=True)
    assert drier["gt"] == 12 and drier["share"] == 1.0 and drier["group"] == "rare"
    assert view.no_pos["class_name"][0] == "drier"  # worst first
    assert sorted(set(view.ap["epoch"].to_list())) == [1, 2]
    np.testing.assert_allclose(sorted(set(view.ap["log_count"].to_list())), np.log10([12, 60, 300]))


def test_per_class_page_draws_the_rare_classes_section(open_page: Any, charts_of: Any, store_home: Path) -> None:
    run_id = log_detector(store_home)
    at = open_page("classes", run=run_id, key="grad/pos")
    assert not at.error
    assert any(h.value == "Rare classes" for h in at.subheader)
    specs = charts_of(at)
    ratio = next(s for s in specs if "hconcat" in s and any("ratio" in r for rows in s["_data"].values() for r in rows))
    rows = [r for rows in ratio["_data"].values() for r in rows]
    assert {r["group"] for r in rows if "group" in r} == {"rare", "common", "frequent"}
    no_pos = next(s for s in specs if any("gt_no_pos" in r for rows in s["_data"].values() for r in rows))
    assert {r["class_name"]: r["share"] for rows in no_pos["_data"].values() for r in rows}["drier"] == 1.0
    ap = next(s for s in specs if "facet" in s)
    assert {r["epoch"] for rows in ap["_data"].values() for r in rows} == {1, 2}
    assert any("No class is stagnant" in c.value for c in at.caption)


def test_a_run_without_the_signals_says_how_to_get_them(open_page: Any) -> None:
    at = open_page("classes", run="run-w")
    assert any("log them with run.log_assignments" in i.value for i in at.info)
