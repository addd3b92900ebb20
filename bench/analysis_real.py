"""Benchmark: the loss analysis scored on real published training logs (``tests/data/real_runs``).

Every run of the corpus is imported with ``tracker import ultralytics``'s importer
into a fresh store and judged by ``tracker.analyze`` at its defaults. Prints, per
verdict, precision, recall and lead time (epochs from the labelled onset to the
event) of the run's *findings* (the epoch judges, and the streams' first NaN/inf and
divergence) on the held-out runs (drawn before tuning) and, separately, on the
tuning runs; then, apart, the online detectors' events of the same kinds on the
held-out runs; then the verdicts on five runs. Targets: P >= 0.9 and R >= 0.9 per
verdict.

``--tune`` searches each epoch judge's parameters on the tuning runs only, one
parameter at a time over its grid from the current defaults, twice round, and keeps
a value only where it raises the F1 score (a tie keeps the current value: with a few
positives per verdict, shaving lead time off them would only fit their noise). It
prints the best setting and its tuning score; the held-out runs play no part. The
defaults in ``tracker/analysis/epoch_specs.py`` are the result of that search and,
for ``overfitting``'s ``hold``, ``give_back``, ``min_val_size`` and ``alpha``, of
reading its false positives on the tuning runs (a one-epoch dip taken for a
minimum, a rise of nothing after a loss fell to ~0, a validation set of 17 images, a
noisy plateau) and a grid over those four on the tuning runs.

``--tuning-only`` leaves the held-out runs out entirely (while working on a judge).

Run: ``.venv/bin/python bench/analysis_real.py`` (``--tune`` for the search).
"""

from __future__ import annotations

import sys

_HERE = __file__.rsplit("/", 1)[0] if "/" in __file__ else "."
sys.path[:] = [p for p in sys.path if p not in ("", _HERE) and not p.endswith("/bench")]

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tracker  # noqa: E402
from tracker.analysis import analyze  # noqa: E402
from tracker.analysis.detectors import StreamContext  # noqa: E402
from tracker.analysis.epoch_run import histories  # noqa: E402
from tracker.analysis.epoch_specs import EPOCH_DETECTORS  # noqa: E402
from tracker.analysis.offline import _environment, _store, find_run  # noqa: E402
from tracker.analysis.real_corpus import (  # noqa: E402
    KINDS, Detection, detections, format_table, import_corpus, load_manifest, score,
)

CORPUS = ROOT / "tests" / "data" / "real_runs"
ONLINE_KINDS = ("overfitting", "zero_loss")
SHOWN = ("anemia-zero-box", "wheat-weed-v8", "fabric-cls", "coffee-train5-inf", "handraising-y12")
KIND_OF = {"overfitting": "overfitting", "metric_collapse": "metric_collapse", "zero_loss": "zero_loss",
           "stopped_early": "stopped_early", "epoch_divergence": "divergence"}
GRID: dict[str, dict[str, list[Any]]] = {
    "overfitting": {"patience": [2, 3, 4, 5, 7], "window": [1, 3, 5], "min_rise": [0.05, 0.1, 0.2, 0.3, 0.5],
                    "alpha": [0.05, 0.1, 0.2], "after_warmup": [0, 1], "train_drop": [0.0, 0.05, 0.1, 0.2],
                    "metric_gain": [0.05, 0.2, 0.5, 1.0, 2.0], "settled": [0.0, 0.02, 0.05, 0.1], "hold": [0.0, 0.15, 0.25, 0.35],
                    "give_back": [0.0, 0.02, 0.03, 0.05], "min_val_size": [0, 30, 50]},
    "metric_collapse": {"patience": [3, 2, 5], "never_patience": [5, 3, 8], "floor": [1e-6, 1e-4]},
    "zero_loss": {"patience": [3, 2, 5]},
    "stopped_early": {"min_remaining": [3, 2, 5], "min_fraction": [0.1, 0.05, 0.2]},
    "epoch_divergence": {"factor": [1.25, 1.5, 2.0, 3.0], "patience": [1, 2, 3], "min_span": [0.0, 0.25, 0.5, 1.0]},
}


def _judge_all(spec: Any, params: dict[str, Any], hists: dict[str, Any]) -> dict[str, dict[str, Detection]]:
    out: dict[str, dict[str, Detection]] = {}
    for name, (config, history) in hists.items():
        judge = spec.factory(StreamContext(key="", params=params, config=config))
        out[name] = detections(judge.judge(history))
    return out


def _f1(s: Any) -> float:
    p, r = s.precision or 0.0, s.recall or 0.0
    return 2 * p * r / (p + r) if p + r else (1.0 if s.fp == 0 and s.fn == 0 else 0.0)


def tune(runs: list[Any], hists: dict[str, Any]) -> None:
    """Grid search of each judge on the tuning runs; prints the best setting and its held-out score."""
    tuning = [r for r in runs if not r.holdout]
    for spec in EPOCH_DETECTORS:
        kind = KIND_OF[spec.name]

        def objective(params: dict[str, Any]) -> float:
            return -_f1(score(tuning, _judge_all(spec, params, hists))["tuning"][kind])

        params = spec.defaults()
        best = objective(params)
        for _ in range(2):
            for name, values in GRID[spec.name].items():
                for value in values:
                    trial = {**params, name: value}
                    got = objective(trial)
                    if got < best:
                        best, params = got, trial
        changed = {k: v for k, v in params.items() if v != spec.defaults()[k]}
        print(f"{spec.name:16} best F1 on the tuning runs {-best:.2f}; changed from the defaults: {changed or 'none'}")


def main() -> None:
    """Import, analyse, score, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tune", action="store_true", help="grid-search the epoch judges on the tuning runs")
    parser.add_argument("--tuning-only", action="store_true",
                        help="leave the held-out runs out entirely (while working on the judges)")
    args = parser.parse_args()
    runs = load_manifest(CORPUS)
    if args.tuning_only:
        runs = [r for r in runs if not r.holdout]
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        t0 = time.perf_counter()
        ids = import_corpus(runs, home)
        t1 = time.perf_counter()
        found, online, shown, hists = {}, {}, {}, {}
        store = _store(home)
        for run in runs:
            analysis = analyze(ids[run.name], home=home)
            found[run.name] = detections(analysis.findings)
            online[run.name] = detections([r for r in analysis.events if r.event.kind in ONLINE_KINDS])
            if run.name in SHOWN:
                shown[run.name] = analysis
            row = find_run(store, ids[run.name])
            (history,) = histories(store, row, _environment(home, row["run_id"])).values()
            hists[run.name] = (row["config"], history)
        t2 = time.perf_counter()
        n_hold = sum(r.holdout for r in runs)
        print(f"real corpus: {len(runs)} runs ({n_hold} held out, {len(runs) - n_hold} for tuning), "
              f"imported in {t1 - t0:.1f} s, analysed in {t2 - t1:.1f} s ({(t2 - t1) / len(runs) * 1e3:.0f} ms a run)")
        positives = {k: sum(k in r.labels for r in runs) for k in KINDS}
        print("labelled faults: " + ", ".join(f"{k} {n}" for k, n in positives.items()) +
              f"; no fault: {sum(not r.labels for r in runs)}")
        scores = score(runs, found)
        print()
        if not args.tuning_only:
            print(format_table(scores["holdout"], "held-out runs (not used to set any threshold)"))
            print()
        print(format_table(scores["tuning"], "tuning runs"))
        print()
        if not args.tuning_only:
            also = {k: s for k, s in score(runs, online)["holdout"].items() if k in ONLINE_KINDS}
            print(format_table(also, "held-out runs: the online detectors' events of the same kinds "
                                     "(twin_overfitting, twin_zero_loss, class_zero_loss; events, not findings)"))
            print()
        print("verdicts on five real runs (tracker analyze; findings only):")
        for name in [n for n in SHOWN if n in shown]:
            a = shown[name]
            print(f"  {name}:")
            for rec in a.findings or []:
                e = rec.event
                print(f"    {e.kind} @ {e.data.get('unit', 'step')} {e.step}: {e.message}")
            if not a.findings:
                print("    no finding")
        if args.tune:
            print()
            tune(runs, hists)



if __name__ == "__main__":
    main()
