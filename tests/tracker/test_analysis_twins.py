"""The online overfitting and zero-loss detectors (twins and per-class), on hand-made curves."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracker.analysis.builtin import builtin_detectors
from tracker.analysis.online import OnlineAnalyzer

PER_EPOCH = 40


def analyzer(**overrides: Any) -> OnlineAnalyzer:
    return OnlineAnalyzer(builtin_detectors(), config={"steps_per_epoch": PER_EPOCH}, overrides=overrides,
                          strict=True)


def overfit_curves(epochs: int = 40, rise: bool = True, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A train loss falling per batch; a val loss per epoch falling to its minimum at epoch 10, then rising."""
    rng = np.random.default_rng(seed)
    steps = np.arange(epochs * PER_EPOCH)
    train = 2.0 * np.exp(-steps / 300.0) * rng.lognormal(0, 0.2, steps.size) + 1e-4
    e = np.arange(epochs)
    val = 1.0 * np.exp(-e / 4.0) + 0.2 + (0.03 * np.clip(e - 10, 0, None) if rise else 0.0)
    val = val * rng.lognormal(0, 0.01, epochs)
    vsteps = (e + 1) * PER_EPOCH - 1
    return {"train/loss": (steps, train), "val/loss": (vsteps, val)}


def feed(a: OnlineAnalyzer, curves: dict[str, tuple[np.ndarray, np.ndarray]], order: list[str],
         chunk: int | None = None) -> list[tuple[Any, ...]]:
    """Feed whole keys in ``order``, or (``chunk``) interleaved by step windows as a flusher does."""
    events = []
    if chunk is None:
        for key in order:
            events += a.feed(key, *curves[key])
    else:
        top = max(int(s[-1]) for s, _ in curves.values())
        for lo in range(0, top + 1, chunk):
            for key in order:
                s, v = curves[key]
                m = (s >= lo) & (s < lo + chunk)
                if m.any():
                    events += a.feed(key, s[m], v[m])
    return sorted((e.step, e.kind, e.key, e.message) for e in events if e.kind in ("overfitting", "zero_loss"))


def test_overfitting_is_flagged_while_training_whatever_the_order_and_chunking() -> None:
    curves = overfit_curves()
    one = feed(analyzer(), curves, ["train/loss", "val/loss"])
    assert [(s, k, key) for s, k, key, _ in one] == [(one[0][0], "overfitting", "val/loss")]
    assert "the best step is 439" in one[0][3]  # epoch 11's last batch: the minimum
    assert one == feed(analyzer(), curves, ["val/loss", "train/loss"])
    assert one == feed(analyzer(), curves, ["train/loss", "val/loss"], chunk=97)
    assert feed(analyzer(), overfit_curves(rise=False), ["train/loss", "val/loss"]) == []


def test_no_overfitting_when_the_train_loss_does_not_fall_with_it() -> None:
    curves = overfit_curves()
    steps, _ = curves["train/loss"]
    curves["train/loss"] = (steps, np.full(steps.size, 0.5))
    assert feed(analyzer(), curves, ["train/loss", "val/loss"]) == []


def yolo_like(box_zero: bool, val_zero: bool = False, epochs: int = 6) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    steps = np.arange(epochs * PER_EPOCH)
    vsteps = np.arange(1, epochs + 1) * PER_EPOCH - 1
    box = np.zeros(steps.size) if box_zero else 3.0 * rng.lognormal(0, 0.2, steps.size)
    return {
        "train/box_loss": (steps, box),
        "train/cls_loss": (steps, 2.0 * rng.lognormal(0, 0.2, steps.size)),
        "val/box_loss": (vsteps, np.zeros(epochs) if val_zero else np.full(epochs, 1.3)),
    }


@pytest.mark.parametrize("order", [["train/box_loss", "train/cls_loss", "val/box_loss"],
                                   ["val/box_loss", "train/cls_loss", "train/box_loss"]])
def test_a_train_loss_at_zero_while_its_val_twin_is_not(order: list[str]) -> None:
    found = feed(analyzer(), yolo_like(True), order)
    assert [(s, k, key) for s, k, key, _ in found] == [(19, "zero_loss", "train/box_loss")]
    assert "while val/box_loss is not" in found[0][3] and "label file" in found[0][3]
    assert found == feed(analyzer(), yolo_like(True), order, chunk=13)
    assert feed(analyzer(), yolo_like(False), order) == []
    assert feed(analyzer(), yolo_like(True, val_zero=True), order) == []  # an unused term: 0 in train and val


def test_a_loss_that_converged_to_an_exact_zero_is_not_a_zero_loss() -> None:
    steps = np.arange(400)
    train = np.where(steps < 300, 2.0 * np.exp(-steps / 20.0), 0.0)  # 2 -> 6e-7, then float32 rounds it to 0
    curves = {"train/loss": (steps, train), "val/loss": (np.array([199, 399]), np.array([0.1, 0.1]))}
    assert feed(analyzer(), curves, ["train/loss", "val/loss"]) == []
    curves["train/loss"] = (steps, np.where(steps < 300, 2.0, 0.0))  # from 2 straight to 0: targets lost
    assert [k for _, k, _, _ in feed(analyzer(), curves, ["train/loss", "val/loss"])] == ["zero_loss"]


def test_a_class_never_in_the_loss_is_a_zero_loss_and_a_rare_one_is_not() -> None:
    rng = np.random.default_rng(2)
    rows = 6 * PER_EPOCH
    m = rng.lognormal(0, 0.3, (rows, 5)) * 0.1
    m[:, 3] = np.where(rng.random(rows) < 1 / 15, m[:, 3], 0.0)  # rare: in one batch of 15
    m[:, 4] = 0.0  # its labels were dropped
    a = analyzer()
    a.set_class_names(["zero", "one", "two", "three", "four"])
    (event,) = [e for e in a.feed_classes("train/cls_loss", np.arange(rows), m) if e.kind == "zero_loss"]
    assert event.data["classes"] == [4] and event.step == 2 * PER_EPOCH and "four is exactly 0" in event.message
    chunked = analyzer()
    steps = np.arange(rows)
    events = [e for lo in range(0, rows, 7) for e in chunked.feed_classes("train/cls_loss", steps[lo:lo + 7], m[lo:lo + 7])
              if e.kind == "zero_loss"]
    assert [(e.step, e.data["classes"]) for e in events] == [(event.step, [4])]


REAL_RUNS = Path(__file__).resolve().parents[1] / "data" / "real_runs"


def real_losses(name: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A real run's loss columns (its results.csv), one point per epoch at the epoch's number."""
    with open(REAL_RUNS / name / "results.csv", newline="") as f:
        rows = [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(f)]
    steps = np.array([int(r["epoch"]) for r in rows])
    return {k: (steps, np.array([float(r[k]) for r in rows])) for k in rows[0] if "loss" in k}


def twin_events(curves: dict[str, tuple[np.ndarray, np.ndarray]], config: dict[str, Any]) -> list[tuple[int, str]]:
    a = OnlineAnalyzer(builtin_detectors(), config=config, strict=True)
    events = [e for key in sorted(curves, key=lambda k: k.startswith("val")) for e in a.feed(key, *curves[key])]
    return [(e.step, e.key) for e in events if e.kind == "overfitting"]


def test_a_rise_must_last_a_tenth_of_the_planned_epochs_capped_by_the_early_stopping_patience() -> None:
    # circledetect-y5 (YOLOv5, 300 epochs, patience 100): val/obj_loss is lowest at epoch 63, 2x above it 13
    # epochs later while the training falls, then falls for the rest of the run to its minimum at epoch 298 (no
    # reader calls it overfitting). Judged once the minimum is 30 epochs old (a tenth of 300), it is none.
    curves = real_losses("circledetect-y5")
    assert (76, "val/obj_loss") in twin_events(curves, {})  # without a plan: patience alone
    assert twin_events(curves, {"epochs": 300, "patience": 100}) == []
    assert twin_events(curves, {"epochs": "300"}) == []  # a config value read back as text
    # boture-pose (100 epochs): val/box_loss rises from its minimum at epoch 2 to the end; still found, 10 on
    boture = real_losses("boture-pose")
    found = twin_events(boture, {"epochs": 100})
    assert found and found[0][1] == "val/box_loss" and found[0][0] >= 2 + 10
    # a plan of 5,000 epochs would wait 500; the trainer's early-stopping patience of 50 caps the wait
    assert twin_events(boture, {"epochs": 5000}) == []
    capped = twin_events(boture, {"epochs": 5000, "patience": 50})
    assert capped and capped[0][1] == "val/box_loss" and 2 + 50 <= capped[0][0] < 100
