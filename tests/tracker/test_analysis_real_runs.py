"""The analysis on real published training logs (tests/data/real_runs), imported with the real importer."""

from __future__ import annotations

import json
import random
import re
import tomllib
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pytest
from click.testing import CliRunner
from rich.console import Console

from tracker.analysis import analyze
from tracker.analysis.offline import find_run
from tracker.analysis.online import OnlineAnalyzer
from tracker.analysis.real_corpus import (
    FRESH_BATCH, KINDS, Detection, EyeLabels, Label, RealRun, import_corpus, load_eye_labels, load_eye_readers,
    load_manifest, majority, readers_agreement,
)
from tracker.cli import build_cli
from tracker.commands.analyze import render
from tracker.host import get_host
from tracker.store import open_store

CORPUS = Path(__file__).resolve().parents[1] / "data" / "real_runs"
USED = ("anemia-zero-box", "wheat-weed-v8", "fabric-cls", "handraising-y12", "coffee-train5-inf",
        "shahed-seg-y26", "streettype-cls", "dogcat-cls", "atpug-val-nolabels", "medicine-cls-zero",
        "cv2027-seg-y26", "paludo-cls", "valvision-cls", "smartdevice-cls", "test1802-y5", "messflow-seg-y26",
        "coffee-train4-inf", "warmcool-cls", "trafficsign-y5", "kickboard-v8", "yusuf-cls", "dl3-y26-det",
        "tfproject-pose", "fretvision-seg-y26", "cows-pose", "yoloproject-det", "cardamage-seg", "dlfinal-seg",
        "orchestration-y5", "droneview-obb", "kposecoco-pose", "handfist-det", "autoatc-pose", "strawberry-seg",
        "portfolio-pose", "seabass-det", "petwatch-y5", "figures-seg", "satelites-seg", "bcsdetermination-pose",
        "cows-pose", "bonefrac-obb", "sonorum-pose", "footballpitch-pose", "kanjisa-pose")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A handful of real runs imported once into their own store: (home, name -> run id)."""
    home = tmp_path_factory.mktemp("real-home")
    runs = [r for r in load_manifest(CORPUS) if r.name in USED]
    yield home, import_corpus(runs, home)


def findings(imported: tuple[Path, dict[str, str]], name: str) -> dict[str, Any]:
    home, ids = imported
    return {r.event.kind: r.event for r in analyze(ids[name], home=home).findings}


def test_the_manifest_names_source_licence_labels_and_a_held_out_third() -> None:
    runs = load_manifest(CORPUS)
    assert len(runs) >= 40
    assert all(r.source["repo"].count("/") == 1 and len(r.source["commit"]) == 40 for r in runs)
    assert all(r.source["path"].endswith("results.csv") and r.source["licence"] for r in runs)
    assert sum(r.holdout for r in runs) / len(runs) >= 1 / 3
    assert all(r.holdout for r in runs if r.batch >= 4) and sum(not r.holdout for r in runs) >= 40  # fresh batches
    # are held out whole; the tuning runs are batches 1-3's
    assert {r.batch for r in runs} >= {1, 2, 3} and all(r.part == "tuning" for r in runs if not r.holdout)
    assert {r.part for r in runs if r.holdout and r.batch < FRESH_BATCH} == {"holdout"}  # earlier batches are seen
    assert all(r.part == "fresh" for r in runs if r.holdout and r.batch >= FRESH_BATCH)
    assert {k for r in runs for k in r.labels} == set(KINDS)
    assert all(lab.best is not None for r in runs for k, lab in r.labels.items() if k == "overfitting")


def test_each_transcribed_file_has_the_character_count_its_note_records() -> None:
    entries = tomllib.loads((CORPUS / "manifest.toml").read_text())["run"]
    counted = 0
    for entry in entries:
        note = re.search(r"(\d+) characters", entry.get("note", ""))
        if note:
            counted += 1
            with open(CORPUS / entry["name"] / "results.csv", newline="") as fh:
                text = fh.read()  # CRLF files keep their line ends: the count is of the stored text
            assert len(text) == int(note.group(1)), entry["name"]
    assert counted >= 70 and sum(e["task"] == "detect" for e in entries) >= 45


def test_the_majority_of_three_readings_labels_a_kind_two_of_them_read_at_their_median_onset() -> None:
    def read(clear: bool = True, **onsets: int) -> EyeLabels:
        return EyeLabels({k: Label(k, o, f"{k} read at {o}", o - 1 if k == "overfitting" else None,
                                   "val/box_loss" if k == "overfitting" else None) for k, o in onsets.items()}, clear)

    m = majority({"a": read(overfitting=30, stopped_early=99), "b": read(overfitting=12), "c": read(stopped_early=99)})
    assert set(m.labels) == {"overfitting", "stopped_early"} and not m.clear  # the readers differ: borderline
    assert (m.labels["overfitting"].onset, m.labels["overfitting"].best) == (12, 11)  # median_low of two
    assert m.labels["overfitting"].key == "val/box_loss" and m.labels["overfitting"].reason.startswith("2 of 3")
    assert majority({"a": read(overfitting=5), "b": read(), "c": read()}).labels == {}  # one reader of three
    same = majority({"a": read(non_finite=7), "b": read(non_finite=9), "c": read(non_finite=8)})
    assert same.clear and same.labels["non_finite"].onset == 8
    assert not majority({"a": read(False), "b": read(), "c": read()}).clear  # one reader unsure
    with pytest.raises(ValueError):
        majority({})


def test_readers_are_scored_one_against_another_and_the_verdicts_against_each_reader() -> None:
    def read(**onsets: int) -> EyeLabels:
        return EyeLabels({k: Label(k, o, "read") for k, o in onsets.items()}, True)

    runs = [RealRun(n, CORPUS / n, True, {}, batch=99) for n in ("r1", "r2", "r3", "r4")]
    readers = {"a": {"r1": read(overfitting=5), "r2": read(overfitting=7), "r3": read(), "r4": read()},
               "b": {"r1": read(overfitting=6), "r2": read(), "r3": read(), "r4": read(stopped_early=9)},
               "c": {"r1": read(overfitting=5), "r2": read(overfitting=8), "r3": read(), "r4": read()},
               "d": {"r1": read()}}  # reads only r1: the runs every reader read are r1 alone
    three = {k: v for k, v in readers.items() if k != "d"}
    pairs = readers_agreement(runs, three)
    # overfitting: r1 by all three (6 ordered pairs agree), r2 by a and c (a-c, c-a agree; a-b, c-b false
    # positives, b-a, b-c misses)
    assert (pairs["overfitting"].tp, pairs["overfitting"].fp, pairs["overfitting"].fn) == (8, 2, 2)
    assert pairs["overfitting"].precision == pairs["overfitting"].recall == 0.8
    assert (pairs["stopped_early"].tp, pairs["stopped_early"].fp, pairs["stopped_early"].fn) == (0, 2, 2)
    assert pairs["zero_loss"].tp + pairs["zero_loss"].fp + pairs["zero_loss"].fn == 0
    found = {"r1": {"overfitting": Detection(5, None, {})}, "r3": {"overfitting": Detection(9, None, {})}}
    verdicts = readers_agreement(runs, three, found)
    # against a, b and c: r1 a hit thrice, r3 false thrice, r2 missed against a and c
    assert (verdicts["overfitting"].tp, verdicts["overfitting"].fp, verdicts["overfitting"].fn) == (3, 3, 2)
    assert verdicts["stopped_early"].fn == 1 and verdicts["stopped_early"].tp == 0
    pooled = readers_agreement(runs, three, found, into=readers_agreement(runs, {"x": three["a"], "y": three["b"]}))
    assert pooled["overfitting"].tp == 3 + 2 and pooled["overfitting"].fp == 3 + 1  # a-b: r1 agrees, r2 one way
    only = readers_agreement(runs, readers)  # with d, the runs every reader read are r1 alone
    assert (only["overfitting"].tp, only["overfitting"].fp, only["overfitting"].fn) == (6, 3, 3)  # d reads none
    assert runs[0].labels == {} and all(r.holdout for r in runs)  # the runs are not changed


def test_runs_read_by_several_readers_carry_their_majority_in_the_eye_labels() -> None:
    every, eye = load_eye_readers(CORPUS), load_eye_labels(CORPUS)
    groups = {who.split("-")[0] for who in every}  # batch7-a: reader a of batch 7
    assert len(groups) >= 1 and len(every) >= 3 * len(groups), "eye-readers/ holds three readers per batch"
    for group in groups:
        readers = {who: r for who, r in every.items() if who.split("-")[0] == group}
        names = set.intersection(*(set(r) for r in readers.values()))
        assert len(names) >= 20 and names <= set(eye), group
        for name in names:
            m = majority({who: r[name] for who, r in readers.items()})
            assert {k: (v.onset, v.best) for k, v in eye[name].labels.items()} == {
                k: (v.onset, v.best) for k, v in m.labels.items()}, name
            assert eye[name].clear == m.clear, name


def test_a_zero_box_loss_run_gets_the_zero_loss_and_collapse_verdicts(imported: Any) -> None:
    found = findings(imported, "anemia-zero-box")
    zero = found["zero_loss"]
    assert zero.severity == "error" and zero.key == "train/box_loss" and zero.data["onset"] == 1
    assert set(zero.data["keys"]) == {"train/box_loss", "train/dfl_loss"} and zero.data["twin_key"] == "val/box_loss"
    assert "label file" in zero.data["advice"]
    collapse = found["metric_collapse"]
    assert collapse.data["onset"] == 15 and collapse.step == 17 and "metrics/mAP50(B)" in collapse.data["keys"]


def test_a_validation_set_without_boxes_gets_the_zero_loss_verdict(imported: Any) -> None:
    zero = findings(imported, "atpug-val-nolabels")["zero_loss"]
    assert zero.data["side"] == "val" and set(zero.data["keys"]) == {"val/box_loss", "val/dfl_loss"}
    assert "validation images have no targets" in zero.message and "val split" in zero.data["advice"]


def test_a_term_at_zero_on_both_sides_with_every_metric_at_zero_is_a_zero_loss(imported: Any) -> None:
    # yolov8n-pose: box, pose, kobj and DFL losses 0 in training and validation, the class loss not, every metric 0
    found = findings(imported, "autoatc-pose")
    zero = found["zero_loss"]
    assert zero.severity == "error" and zero.data["side"] == "both" and zero.data["onset"] == 1
    assert set(zero.data["keys"]) == {"train/box_loss", "train/pose_loss", "train/kobj_loss", "train/dfl_loss"}
    assert "train/cls_loss is not" in zero.message and "label file" in zero.data["advice"]
    assert "metric_collapse" in found
    assert "zero_loss" not in findings(imported, "messflow-seg-y26")  # YOLO26 sem_loss at 0 in a run that learnt nothing


def test_a_validation_that_computes_none_of_its_losses_is_a_zero_loss_warning(imported: Any) -> None:
    # Ultralytics 8.0 segmentation: val box/seg/dfl 0 and val/cls inf at every epoch while mAP50 climbs to 0.9
    found = findings(imported, "strawberry-seg")
    zero = found["zero_loss"]
    assert zero.severity == "warning" and zero.data["side"] == "uncomputed" and zero.data["onset"] == 0
    assert set(zero.data["keys"]) == {"val/box_loss", "val/seg_loss", "val/cls_loss", "val/dfl_loss"}
    assert "none of its losses" in zero.message and "model.val()" in zero.data["advice"]
    assert "overfitting" not in found and "non_finite" in found


def test_an_unused_zero_term_is_no_finding(imported: Any) -> None:
    assert findings(imported, "shahed-seg-y26") == {}  # YOLO26 sem_loss: 0 in train and val alike


def test_every_loss_at_zero_is_a_zero_loss_and_an_uncomputed_val_term_is_not(imported: Any) -> None:
    zero = findings(imported, "medicine-cls-zero")["zero_loss"]  # one class: train/loss and val/loss 0 throughout
    assert zero.data["side"] == "all" and zero.data["onset"] == 1 and zero.step == 3
    assert set(zero.data["keys"]) == {"train/loss", "val/loss"} and "2+ classes" in zero.data["advice"]
    # YOLO26 segmentation: val/sem_loss is 0 at every epoch while train/sem_loss is not and the mAP is ~0.9
    assert "zero_loss" not in findings(imported, "cv2027-seg-y26")
    # YOLO26 pose (batch 10): val/rle_loss 0 at all 20 epochs, train/rle_loss 13.1 -> 5.2, pose mAP50 0.86. The
    # Pose26 head computes the sigmas of the RLE term in training only, so validation's RLE term is 0 by design
    pose = findings(imported, "bcsdetermination-pose")
    assert "zero_loss" not in pose and "val_losses_absent" not in pose


def test_no_overfitting_on_a_tiny_val_set_or_a_rise_of_nothing(imported: Any) -> None:
    # 17 validation images (accuracy moves in steps of 1/17): one image swings val/loss from 0.014 to 0.5 and back
    assert "overfitting" not in findings(imported, "paludo-cls")
    # val/loss fell from 0.41 to 0.0025 and "doubles" to 0.005: +100%, but under 3% of what it had fallen
    assert "overfitting" not in findings(imported, "valvision-cls")
    smart = findings(imported, "smartdevice-cls")["overfitting"]  # 0.58-0.62 at epochs 5-15, then 0.6-1.1
    # the rise is clear (confidence 0.9 against the loss's own noise) at epoch 20
    assert smart.data["best_step"] == 15 and smart.step == 20 and smart.data["settled_rise"] > 0.2
    assert smart.data["confidence"] >= 0.9


# The next three are runs of batch 4 whose eye labels (eye-labels.toml) read no overfitting where the
# written definition (label_runs.py) had one: the gates min_share, train_drop and min_confidence.
def test_no_overfitting_on_a_term_tiny_in_the_runs_scale_or_a_flat_train_twin(imported: Any) -> None:
    # YOLOv8-pose: val/kobj_loss creeps 0.672 -> 0.746 (+11%) but is 4% of the run's validation loss,
    # and train/kobj_loss stays at ~0.70 (-4%)
    assert "overfitting" not in findings(imported, "tfproject-pose")
    # YOLOv8-seg: val/seg_loss +12% after epoch 36 (the close_mosaic switch) while train/seg_loss moves -4%
    assert "overfitting" not in findings(imported, "fretvision-seg-y26")


def test_no_overfitting_on_a_rise_within_the_losses_noise(imported: Any) -> None:
    # YOLO26-pose, 85 epochs: val/box_loss is lowest at 64 after single-epoch dips; +32% in 21 noisy points
    # reads as confidence 0.88, under 0.9 (the eye: flat from epoch 43 on)
    assert "overfitting" not in findings(imported, "cows-pose")


def test_a_term_of_a_five_loss_pose_run_is_not_tiny_and_a_val_set_without_targets_has_no_overfitting(
        imported: Any) -> None:
    # YOLOv8-pose (batch 6): val/dfl_loss is 13% of five validation losses' sum, over half their mean,
    # and doubles from epoch 3 while train/dfl_loss falls 10%
    over = findings(imported, "kposecoco-pose")["overfitting"]
    assert over.key in ("val/dfl_loss", "val/box_loss") and over.data["best_step"] <= 5
    # val/box_loss and val/dfl_loss exactly 0, every metric 0 at all 100 epochs: the validation images have
    # no labels, and val/cls_loss's rise says nothing of overfitting; zero_loss tells what is wrong
    found = findings(imported, "handfist-det")
    assert "overfitting" not in found and found["zero_loss"].data["side"] == "val"


def test_a_slow_lasting_rise_of_a_main_term_is_overfitting(imported: Any) -> None:
    # YOLOv8n, 150 epochs: val/dfl_loss 1.71 at epoch 50, 1.90-2.01 over 90-150 while train/dfl_loss falls
    over = findings(imported, "yoloproject-det")["overfitting"]
    assert over.key == "val/dfl_loss" and over.data["best_step"] == 50 and over.data["confidence"] >= 0.9


def test_overfitting_on_one_yolov5_term_while_the_map_climbs(imported: Any) -> None:
    # val/cls_loss 0.0124 at epoch 12, 0.015-0.016 at 39-49 while val/box_loss and val/obj_loss fall and the
    # fitness climbs 0.20 -> 0.30: overfitting by the label definition, which reads each term. Told at epoch 42
    # (39 with batch 12's defaults: the end rise was then the median of the last 3 points, 10% above; since
    # batch 13 it is the last point, 5% above, and the lasting rise a tenth of the loss's range)
    found = findings(imported, "test1802-y5")["overfitting"]
    assert found.key == "val/cls_loss" and found.data["best_step"] == 12 and found.step == 42


def test_no_overfitting_on_a_late_blip_or_a_minimum_before_the_model_learnt(imported: Any) -> None:
    # val/box_loss 0.50-0.52 after its minimum at epoch 15, then 0.55-0.59 at 24-26 and back: no lasting rise
    assert "overfitting" not in findings(imported, "messflow-seg-y26")
    # val/box_loss lowest at epoch 1 (fitness 0.03), up 39% by epoch 7 while the fitness reaches 0.4: early noise
    assert "overfitting" not in findings(imported, "coffee-train4-inf")


def test_overfitting_while_the_lr_warms_up_and_a_small_yolov5_rise(imported: Any) -> None:
    warm = findings(imported, "warmcool-cls")
    # val/loss's running median is lowest at epoch 4 (1.137) and reads 1.31-1.99 after, the train loss falling
    # 1.47 -> 0.46, while the learning rate still warms up (to epoch 8): the definition has no warm-up gate
    over = warm["overfitting"]
    assert over.key == "val/loss" and over.data["best_step"] == 4 and over.data["onset"] == 5 and over.step == 10
    assert over.data["settled_rise"] > 0.3 and 0.5 < over.data["confidence"] <= 1.0
    assert warm["stopped_early"].data["how"] == "schedule unfinished"
    sign = findings(imported, "trafficsign-y5")
    # YOLOv5 val/obj_loss 0.0040 at epoch 14, 11% above it since while train/obj_loss falls and the mAP climbs
    over = sign["overfitting"]
    assert over.key == "val/obj_loss" and over.data["best_step"] == 14 and over.data["settled_rise"] > 0.1


def test_no_overfitting_on_swings_back_to_the_minimum_or_a_rise_of_under_5pct_of_the_range(imported: Any) -> None:
    # val/box_loss swings up at epochs 4-10, 13-14 and 20-23 and ends at its minimum: no minimum with a rise after
    assert "overfitting" not in findings(imported, "kickboard-v8")
    # val/loss fell from 1.57 to 0.01 and wanders 0.02-0.09: +0.05 is 3% of its range, under the definition's 5%
    assert "overfitting" not in findings(imported, "yusuf-cls")


def test_no_metric_collapse_when_the_metric_comes_back_flickers_or_was_never_learnt(imported: Any) -> None:
    # mask metrics exactly 0 over epochs 9-21, back above 0 from 22 to the end (mAP50(M) 0.09)
    assert "metric_collapse" not in findings(imported, "cardamage-seg")
    # a tiny mask val set: mask metrics 0 at 27-36 and 69-80 and back each time, then 0 over 88-100
    assert "metric_collapse" not in findings(imported, "dlfinal-seg")
    # a per-class column: metrics/eagle_mAP 0.0002-0.0009, then 0 from epoch 4: a class never learnt
    assert "metric_collapse" not in findings(imported, "orchestration-y5")
    # the real collapse stays: every metric 0 from epoch 15 to the end after mAP50 0.04 and recall 0.58
    collapse = findings(imported, "anemia-zero-box")["metric_collapse"]
    assert collapse.data["onset"] == 15 and {"metrics/mAP50(B)", "metrics/recall(B)"} <= set(collapse.data["keys"])


def test_a_pose_head_whose_metrics_never_leave_zero_beside_a_box_head_that_learns(imported: Any) -> None:
    # sonorum-pose: the four pose metrics exactly 0 at all 50 epochs, mAP50(B) up to 0.995
    found = findings(imported, "sonorum-pose")
    head = found["head_never_learnt"]
    assert head.severity == "warning" and head.data["head"] == "pose" and head.data["learnt"] == "box"
    assert head.step == 10 and head.data["onset"] == 1  # told once 10 epochs were at 0, from the first
    assert set(head.data["keys"]) == {"metrics/precision(P)", "metrics/recall(P)", "metrics/mAP50(P)",
                                      "metrics/mAP50-95(P)"}
    assert "kpt_shape" in head.data["advice"] and "metrics/mAP50(B)" in head.message and "0.995" in head.message
    assert "metric_collapse" not in found  # the box metrics learnt: not every metric is 0
    # kanjisa-pose (batch 12): 10 epochs, pose metrics 0 throughout, box metrics small and never 0 (mAP50 at
    # most 0.048): told at the 10th epoch, the first it can be; no metric fell, so no collapse
    small = findings(imported, "kanjisa-pose")
    assert small["head_never_learnt"].step == 9 and small["head_never_learnt"].data["learnt"] == "box"
    assert "metric_collapse" not in small
    # footballpitch-pose: pose metrics 0 at epochs 1-14, then up to mAP50(P) 0.995: a late start, no event
    assert "head_never_learnt" not in findings(imported, "footballpitch-pose")
    # one head only (box): anemia-zero-box's metrics at 0 from epoch 15 are a collapse, no head event
    assert "head_never_learnt" not in findings(imported, "anemia-zero-box")


def test_a_one_epoch_dip_is_no_minimum_a_divergence_is_measured_from(imported: Any) -> None:
    # YOLOv8-obb on a tiny set: train/box_loss jumps 0.4-1.3 epoch to epoch; 0.40 at epoch 14 is one epoch
    assert "divergence" not in findings(imported, "droneview-obb")


def test_a_climb_within_the_losses_noise_or_after_the_mosaic_closed_is_no_divergence(imported: Any) -> None:
    # YOLOv8-pose on coco8-pose (8 images): train/pose_loss swings 1.1-5.0 from epoch to epoch and sits at
    # 4.04 and 4.76 at epochs 18-19, 2.7x its running-median minimum: 3.6 times its median step, noise
    assert "divergence" not in findings(imported, "portfolio-pose")
    # YOLOv8n, 100 epochs, close_mosaic 10: every train loss steps up at epoch 91 (box 0.63 -> 1.33) and
    # stays there, 70 times its noise; the mosaic is off from epoch 91, a new minimum starts there
    assert "divergence" not in findings(imported, "seabass-det")
    # YOLOv8-seg: train/box_loss 0.64 at epoch 1, 2.09 at epoch 3 and over 1.28 until epoch 10 (two readers of
    # three: a divergence); too few points before the climb for a noise gate, and it is before any mosaic close
    div = findings(imported, "figures-seg")["divergence"]
    assert div.key == "train/box_loss" and div.step == 4 and div.data["onset"] == 3


def test_yolov9_dual_head_validation_without_losses_is_an_info_not_a_zero_loss(imported: Any) -> None:
    # WongKinYiu/yolov9's train_dual.py writes 0 for val/box, val/cls and val/dfl (its validator computes no
    # loss for the dual head, WongKinYiu/yolov9#132) while the mAP is real: known, not a fault of the data
    home, ids = imported
    events = {r.event.kind: r.event for r in analyze(ids["petwatch-y5"], home=home).findings}
    assert "zero_loss" not in events and "overfitting" not in events
    absent = events["val_losses_absent"]
    assert absent.severity == "info" and "yolov9#132" in absent.message
    assert set(absent.data["keys"]) == {"val/box_loss", "val/cls_loss", "val/dfl_loss"}


def test_stopped_early_is_not_judged_in_the_lr_warm_up(imported: Any) -> None:
    # YOLOv5's x/lr2 warms down from 0.097 until epoch 27 while x/lr0 and x/lr1 rise: three points of the
    # schedule after it are too few to read its step
    assert "stopped_early" not in findings(imported, "trafficsign-y5")
    # YOLO26's two rates at 3:1 from the start are no warm-up: the schedule after epoch 3 plans ~300 epochs
    stop = findings(imported, "dl3-y26-det")["stopped_early"]
    assert stop.step == 14 and stop.data["warmup_end"] == 3 and 250 <= stop.data["planned"] <= 350
    assert 0.9 < stop.data["confidence"] <= 1.0


def test_a_yolov5_opt_yaml_is_the_config_stopped_early_reads(tmp_path: Path) -> None:
    # trafficsign-y5's 30 epochs (0-29) beside the opt.yaml YOLOv5 writes (its keys, by the yaml library): the
    # planned epochs come from it, where the lr schedule alone (still in warm-up) gives no verdict
    import yaml

    folder = tmp_path / "runs" / "train" / "exp"
    folder.mkdir(parents=True)
    (folder / "results.csv").write_bytes((CORPUS / "trafficsign-y5" / "results.csv").read_bytes())
    (folder / "opt.yaml").write_text(yaml.safe_dump({"weights": "yolov5s.pt", "epochs": 50, "batch_size": 16,
                                                     "patience": 100, "project": "runs/train", "name": "exp"}))
    (run,) = [r for r in load_manifest(CORPUS) if r.name == "trafficsign-y5"]
    run.folder = folder
    home = tmp_path / "home"
    ids = import_corpus([run], home)
    stop = {r.event.kind: r.event for r in analyze(ids[run.name], home=home).findings}["stopped_early"]
    assert stop.data["how"] == "cut short" and stop.data["planned"] == 50 and stop.data["done"] == 30


def test_overfitting_names_its_best_epoch(imported: Any) -> None:
    fabric = findings(imported, "fabric-cls")["overfitting"]
    assert fabric.key == "val/loss" and fabric.data["best_step"] == 1 and fabric.data["onset"] == 2
    assert 0.9 < fabric.data["confidence"] <= 1.0 and "the best epoch is 1" in fabric.message
    wheat = findings(imported, "wheat-weed-v8")
    # val/cls_loss dips for one epoch (1.335, 1.203, 1.262 at epochs 1-3): no minimum; val/box_loss's running
    # median is lowest at epoch 2 (the label: 3) and its median after it 12% above, the largest lasting rise
    assert wheat["overfitting"].key == "val/box_loss" and wheat["overfitting"].data["best_step"] == 2
    stop = wheat["stopped_early"]
    assert stop.severity == "info" and stop.data["how"] == "early stopping" and stop.data["planned"] == 150


def test_stopped_early_from_the_lr_schedule_and_an_epoch_divergence(imported: Any) -> None:
    stop = findings(imported, "streettype-cls")["stopped_early"]
    assert stop.step == 19 and stop.data["how"] == "schedule unfinished" and 40 <= stop.data["planned"] <= 80
    div = findings(imported, "dogcat-cls")["divergence"]
    assert div.key == "train/loss" and div.data["onset"] == 4 and div.step == 5 and div.data["ratio"] > 2


def test_a_healthy_run_gets_no_finding_and_every_key_a_verdict(imported: Any) -> None:
    home, ids = imported
    result = analyze(ids["handraising-y12"], home=home)
    assert result.findings == []
    assert {r.verdict for r in result.keys} <= {"converging", "plateaued"}
    assert all(r.points == 100 for r in result.keys)


def test_an_imported_ultralytics_nan_is_told_to_turn_amp_off_on_old_cards(imported: Any) -> None:
    nan = findings(imported, "coffee-train5-inf")["non_finite"]
    assert nan.key == "val/cls_loss" and nan.step == 7
    assert "amp=False" in nan.data["advice"] and "bfloat16" in nan.data["advice"]


def test_cli_json_pipe_and_80_columns(imported: Any) -> None:
    home, ids = imported
    runner = CliRunner()
    out = runner.invoke(build_cli(), ["analyze", ids["anemia-zero-box"], "--home", str(home), "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert {f["kind"] for f in data["findings"]} >= {"zero_loss", "metric_collapse"}
    piped = runner.invoke(build_cli(), ["analyze", ids["anemia-zero-box"], "--home", str(home)])
    assert piped.exit_code == 0, piped.output
    lines = piped.stdout.splitlines()
    assert lines[0].split("\t") == ["step", "unit", "finding", "severity", "key", "confidence", "message",
                                    "what to do"]
    assert not re.search("[┏━┃│└]", piped.stdout) and lines[1].split("\t")[2] == "zero_loss"
    console = Console(width=80, record=True, force_terminal=True, color_system=None)
    render(analyze(ids["wheat-weed-v8"], home=home), console, terminal=True)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "what to do:" in text and "stopped early" in text and "val/box_loss" in text


def test_the_terminal_names_yolov9s_absent_validation_losses_in_words(imported: Any) -> None:
    home, ids = imported
    console = Console(width=80, record=True, force_terminal=True, color_system=None)
    render(analyze(ids["petwatch-y5"], home=home), console, terminal=True)
    text = console.export_text()
    assert "validation losses not computed" in text and "val_losses_absent" not in text


def test_a_metric_that_fell_to_practically_zero_has_collapsed(imported: Any) -> None:
    # YOLOv8-seg (batch 9, all three readers): mAP50-95(B) 0.744 at epoch 1, 0.003 at epoch 4 and 0.001-0.032
    # to the end (30 epochs); never exactly 0, and at most 4.3% of its best
    mc = findings(imported, "satelites-seg")["metric_collapse"]
    assert mc.key == "metrics/mAP50-95(B)" and mc.data["onset"] == 4 and mc.data["peak"] == pytest.approx(0.74437)
    # told at epoch 6, the first at which three such epochs stood: 0.0283 at most by then
    assert mc.step == 6 and "practically 0" in mc.message and mc.data["since_max"] == pytest.approx(0.02826)
    # an exact zero still reads as one
    assert "to 0 at epoch 15" in findings(imported, "anemia-zero-box")["metric_collapse"].message


def _online_zero_events(events: Any) -> list[tuple[str, int]]:
    events = [getattr(e, "event", e) for e in events]  # analyze() gives (rank, event) records
    return sorted((e.key, e.step) for e in events if e.kind == "zero_loss")


@pytest.mark.parametrize("name", ["bcsdetermination-pose", "cows-pose", "bonefrac-obb"])
def test_the_online_zero_loss_reads_a_validation_term_beside_a_metric_above_0_as_not_computed(
        imported: Any, name: str) -> None:
    # YOLO26 pose's val/rle_loss (the RLE term needs the keypoint sigmas the head computes in training only) and
    # OBB's val/dis_loss are 0 at every epoch beside the other val losses and an mAP above 0: what the epoch judge
    # reads as a term the validation does not compute, the online twin_zero_loss now reads the same way
    home, ids = imported
    result = analyze(ids[name], home=home)
    assert _online_zero_events(result.events) == [] and "zero_loss" not in {f.event.kind for f in result.findings}


def test_the_online_zero_loss_still_tells_a_validation_without_targets_or_losses(imported: Any) -> None:
    home, ids = imported
    # every metric 0 and val box/dfl at 0 beside their train twins: the validation images have no labels
    assert {k for k, _ in _online_zero_events(analyze(ids["handfist-det"], home=home).events)} >= {"val/box_loss"}
    # an Ultralytics 8.0 validation computing none of its losses while the mAP climbs: all val losses at 0
    keys = {k for k, _ in _online_zero_events(analyze(ids["strawberry-seg"], home=home).events)}
    assert keys == {"val/box_loss", "val/dfl_loss", "val/seg_loss"}
    # the same zeros from YOLOv9's train_dual.py (opt.yaml's cfg: a yolov9 model) are by design: no event
    assert _online_zero_events(analyze(ids["petwatch-y5"], home=home).events) == []


@pytest.mark.parametrize("name", ["bcsdetermination-pose", "bonefrac-obb", "strawberry-seg", "handfist-det",
                                  "petwatch-y5"])
def test_the_online_zero_loss_agrees_with_the_offline_one_whatever_the_flushes(imported: Any, name: str) -> None:
    """The run's stored rows fed as a training's flusher would, in cuts of a few epochs and rows in any order
    within a flush (the metrics after the losses too): the same zero-loss events as the offline analysis."""
    home, ids = imported
    run_id = ids[name]
    offline = _online_zero_events(analyze(run_id, home=home).events)
    store = open_store(home)
    rows = store.query("SELECT key, step, value FROM curves WHERE run_id = ? ORDER BY step, key", [run_id])
    config = dict(find_run(store, run_id)["config"])
    steps = sorted(set(rows["step"].to_list()))
    for seed in range(3):
        rng = random.Random(seed)
        cuts = sorted(rng.sample(steps[1:], min(len(steps) - 1, rng.randint(2, 8))))
        analyzer = OnlineAnalyzer(get_host().items("detectors"), config=config, run_id=run_id, strict=True)
        events = []
        for lo, hi in zip([steps[0], *cuts], [*cuts, steps[-1] + 1]):
            part = rows.filter((rows["step"] >= lo) & (rows["step"] < hi)).to_dicts()
            rng.shuffle(part)
            table = pa.table({"key": [r["key"] for r in part], "step": [r["step"] for r in part],
                              "value": [r["value"] for r in part]})
            events += analyzer.observe(table)
        assert _online_zero_events(events) == offline, (seed, cuts)
