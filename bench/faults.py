"""Benchmark: the detectors on real trainings with real faults, scored per detector.

Builds the fault corpus under ``--out`` (default ``bench/out/faults``, git-ignored):
a tracker store (``home/``) and ``labels.jsonl``, one record per run (run id, model,
fault, seed, role, labels with their onset steps). Every run trains for real in its
own process:

* digits (:mod:`bench.faults_digits`): a small CNN on scikit-learn's digits, per seed
  the healthy runs and one run per fault with its twin (learning rate too high,
  float16 without a loss scaler, a gradient overwritten in a custom autograd
  Function, a fast and a slow leak, a stalling data loader, a step that slows, an
  emptied class, a tiny training set, a rare class), the system sampler on every
  ``--interval`` seconds (0.2 by default: the runs last seconds to a minute); and
  once a fast leak and its twin at the sampler's default 2 s;
* two-rank DDP on gloo (:mod:`bench.faults_ddp`): healthy, the sampler seeded per
  rank, every rank drawing the same batches;
* Ultralytics YOLO11n on the generated long-tail set (:mod:`bench.faults_yolo`),
  once: healthy, no boxes, a learning rate too high, a slow loader, a leak.

Seeds ``--tune`` (default 0 and 1) are the ones the system detectors' thresholds were
set on; every other seed's runs, and the YOLO runs, are held out. Then it scores
(:mod:`bench.faults_score`): per detector, precision, recall and lead time on the
held-out runs, then on the tuning runs. A run already in ``labels.jsonl`` is not
trained again (``--fresh`` starts over; to retrain one run, delete its line from
``labels.jsonl`` and its folder under ``yolo/runs``). Labels are functions of the
fault and of what the run measured (:mod:`bench.faults_labels`), so ``--relabel``
recomputes them for the runs already there after a label rule changes. A fault
meant to produce an outcome is labelled by it only when the run shows it (a
learning rate too high: the train loss ends at least twice its best before the
fault, or goes non-finite); one that did not manifest is recorded with
``manifested: false``, scored neither as a positive nor as a control for that
kind, and named under the score's table.

Run: ``python -m bench.faults`` (about an hour on two busy cores), ``--only digits``,
``--seeds 0,1``, ``--score-only``, ``--relabel``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from bench.faults_digits import DigitsSpec
from bench.faults_score import OUT, load_records, report

SEEDS = (0, 1, 2, 3, 4)
TUNE = (0, 1)
YOLO_SEED = 2
# epochs of the system-fault runs and the fault's first epoch: 250 epochs are 16-44 s at 1.5-4 ms a step, past
# the step-time detector's warm-up and first window (61 samples at 0.2 s)
LONG, LONG_ONSET, SLOW_RUN = 500, 250, 290


def digits_specs(seed: int, interval: float) -> list[DigitsSpec]:
    """The digits runs of one seed: every fault and its healthy twin."""
    common = {"seed": seed, "interval": interval}
    return [
        DigitsSpec("healthy", **common),
        DigitsSpec("lr_high", onset_epoch=3, epochs=40, **common),
        DigitsSpec("healthy", epochs=40, name=f"digits-healthy40-s{seed}", **common),
        DigitsSpec("fp16", epochs=8, **common),
        DigitsSpec("fp16_scaled", epochs=8, **common),
        DigitsSpec("overwrite", **common),
        DigitsSpec("overwrite_add", **common),
        DigitsSpec("empty_class", **common),
        DigitsSpec("imbalance", **common),
        DigitsSpec("tiny", epochs=200, **common),
        DigitsSpec("healthy", epochs=LONG, name=f"digits-healthy_long-s{seed}", **common),
        DigitsSpec("leak_fast", epochs=LONG, onset_epoch=LONG_ONSET, **common),
        DigitsSpec("leak_slow", epochs=LONG, onset_epoch=LONG_ONSET, **common),
        DigitsSpec("stall", epochs=SLOW_RUN, onset_epoch=LONG_ONSET, **common),
        DigitsSpec("slowdown", epochs=SLOW_RUN, onset_epoch=LONG_ONSET, **common),
    ]


def default_interval_specs(seed: int) -> list[DigitsSpec]:
    """A fast leak and its twin sampled at the sampler's default 2 s (each 1-2.5 minutes)."""
    common = {"seed": seed, "interval": 2.0, "epochs": 900}
    return [DigitsSpec("leak_fast", onset_epoch=400, name=f"digits-leak_fast_2s-s{seed}", **common),
            DigitsSpec("healthy", name=f"digits-healthy_2s-s{seed}", **common)]


def _child(module: str, spec: dict[str, Any], home: Path, timeout: float = 1800) -> dict[str, Any]:
    env = dict(os.environ, TRACKER_HOME=str(home), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("TRACKER_SYSTEM", None)
    done = subprocess.run([sys.executable, "-m", module, json.dumps(spec)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{module} {spec} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class Corpus:
    """The corpus folder: trains what is missing and appends its records."""

    def __init__(self, out: Path, tune: tuple[int, ...], echo: Callable[[str], None] = print) -> None:
        self.out, self.tune, self.echo = out, tune, echo
        self.home = out / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.have = {r["name"] for r in load_records(out)}

    def add(self, name: str, train: Callable[[], dict[str, Any]], held_out: bool = False) -> None:
        """Train one run unless it is there; append its record."""
        if name in self.have:
            return
        t0 = time.perf_counter()
        record = train()
        record["role"] = "held-out" if held_out or record["seed"] not in self.tune else "tune"
        with (self.out / "labels.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        self.have.add(name)
        kinds = ", ".join(f"{lb['kind']}@{lb['onset']}" for lb in record["labels"]) or "no label"
        self.echo(f"  {name:<32} {time.perf_counter() - t0:6.1f} s  {kinds}")

    def digits(self, seeds: list[int], interval: float) -> None:
        """The digits runs of ``seeds``, and the default-interval pair on the first held-out seed."""
        for seed in seeds:
            specs = digits_specs(seed, interval)
            if seed not in self.tune and seed == min(s for s in seeds if s not in self.tune):
                specs += default_interval_specs(seed)
            for spec in specs:
                self.add(spec.label_name(), lambda spec=spec: _child("bench.faults_digits", asdict(spec), self.home))

    def ddp(self, seeds: list[int]) -> None:
        """The two-rank runs of ``seeds``."""
        from bench.faults_ddp import FAULTS, DdpSpec

        for seed in seeds:
            for fault in FAULTS:
                spec = DdpSpec(fault, seed)
                self.add(spec.label_name(), lambda spec=spec: _ddp(spec, self.home))

    def yolo(self, interval: float) -> None:
        """The YOLO runs (once, held out)."""
        from bench.faults_yolo import FAULTS, YoloSpec, no_boxes_copy, train
        from tracker.integrations.yolo_synthetic import make_dataset

        work = self.out / "yolo"
        data = work / "data"
        if not (data / "data.yaml").is_file():
            shutil.rmtree(work, ignore_errors=True)
            make_dataset(data, train=256, val=64, imgsz=64, seed=YOLO_SEED)
            no_boxes_copy(data, work / "data-no-boxes")
        for fault in FAULTS:
            yaml = work / ("data-no-boxes" if fault == "yolo_no_boxes" else "data") / "data.yaml"
            spec = YoloSpec(str(work), str(yaml), fault=fault, seed=YOLO_SEED)
            self.add(spec.label_name(), lambda spec=spec: train(spec, self.home, interval), held_out=True)


def relabel(out: Path, echo: Callable[[str], None] = print) -> int:
    """Recompute every record's labels from its fault and measurements; rewrite ``labels.jsonl``; returns changes."""
    from bench.faults_ddp import DdpSpec, ddp_labels, last_step
    from bench.faults_labels import digits_labels
    from bench.faults_yolo import yolo_labels

    home, changed, lines = out / "home", 0, []
    for record in load_records(out):
        if record["model"] == "digits":
            labels = digits_labels(record, home)
        elif record["model"] == "digits-ddp":
            record["steps"] = last_step(record["run_id"], home) + 1
            labels = ddp_labels(DdpSpec(**record["spec"]), record["steps"] - 1)
        else:
            labels = yolo_labels(record, home)
        new = [asdict(lb) for lb in labels]
        if new != record["labels"]:
            changed += 1
            echo(f"  relabelled {record['name']}: {record['labels']} -> {new}")
        record["labels"] = new
        lines.append(json.dumps(record))
    tmp = out / "labels.jsonl.tmp"
    tmp.write_text("".join(line + "\n" for line in lines))
    tmp.replace(out / "labels.jsonl")
    return changed


def _ddp(spec: Any, home: Path) -> dict[str, Any]:
    from bench.faults_ddp import train

    return train(spec, home)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.faults``: build what is missing of the corpus, then score it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="digits and DDP seeds")
    parser.add_argument("--tune", default=",".join(map(str, TUNE)), help="seeds the thresholds were set on")
    parser.add_argument("--only", default="digits,ddp,yolo", help="which families to train")
    parser.add_argument("--interval", type=float, default=0.2, help="system sampler interval of the runs (s)")
    parser.add_argument("--fresh", action="store_true", help="delete the corpus first")
    parser.add_argument("--score-only", action="store_true", help="train nothing")
    parser.add_argument("--relabel", action="store_true", help="recompute the labels of the runs already there")
    args = parser.parse_args(argv)
    if args.fresh:
        shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    corpus = Corpus(args.out, tuple(int(s) for s in args.tune.split(",") if s))
    only = set(args.only.split(","))
    if args.relabel:
        print(f"relabelled {relabel(args.out)} runs")
    if not args.score_only:
        print(f"fault corpus under {args.out} (sampler every {args.interval} s)")
        if "digits" in only:
            corpus.digits(seeds, args.interval)
        if "ddp" in only:
            corpus.ddp(seeds)
        if "yolo" in only:
            corpus.yolo(args.interval)
    report(args.out, as_json=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
