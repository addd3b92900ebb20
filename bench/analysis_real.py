"""Benchmark: the loss analysis scored on real published training logs (``tests/data/real_runs``).

Every run of the corpus is imported with ``tracker import ultralytics``'s importer
into a fresh store and judged by ``tracker.analyze`` at its defaults. Prints, per
verdict, precision, recall and lead time (epochs from the labelled onset to the
event) of the run's *findings* (the epoch judges, and the streams' first NaN/inf and
divergence) in three parts, apart (:data:`tracker.analysis.real_corpus.PARTS`):

* **tuning** runs (``holdout = false``);
* **held out, seen**: the held-out runs of batches 1-14 (``FRESH_BATCH`` - 1), scored before and their
  misses read, so no longer a fair test;
* **fresh**: held-out runs of batch ``FRESH_BATCH`` (15) on, only with ``--fresh``.
  Without it those runs are not imported or judged at all: run ``--fresh`` once,
  when the batch is complete and read by eye (three readers apart, ``eye-readers/``,
  their majority in ``eye-labels.toml``), for the honest held-out score.

The held-out runs labelled by eye (batches 4 on; ``eye-labels.toml``: read off the
curves by someone who saw neither the written definitions, ``label_runs.py``'s labels
nor any verdict) are scored a second time against those labels, per part (the fresh batch
only with ``--fresh``; batches 4-14 are seen: the epoch judges' gates were set on the eye
labels of 4, 6 and 7), with a table of where the two label sets agree. The definitions'
labels and the verdicts share a rule, so a verdict
that follows its definition scores well against them by construction; the eye's labels
are the independent check.

Then, apart, the online detectors' events of the same kinds on the held-out runs;
then what a user asking ``tracker analyze`` at every epoch while the run trained
would have been told first (``overfitting`` on the history as it stood then: the
cost of judging without hindsight); then the verdicts on five runs. Targets:
P >= 0.9 and R >= 0.9 per verdict.

``--tune`` searches each epoch judge's parameters on every run but the fresh ones
(tuning and seen held-out), one parameter at a time over its grid from the current
defaults, twice round, and keeps a value only where it raises the F1 score (a tie
keeps the current value). It prints the best setting and its score.

``--tuning-only`` leaves the held-out runs out entirely.

Run: ``.venv/bin/python bench/analysis_real.py`` (``--tune`` for the search,
``--fresh`` for the fresh batch).
"""

from __future__ import annotations

import sys

_HERE = __file__.rsplit("/", 1)[0] if "/" in __file__ else "."
sys.path[:] = [p for p in sys.path if p not in ("", _HERE) and not p.endswith("/bench")]

import argparse  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import replace  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tracker  # noqa: E402
from tracker.analysis import analyze  # noqa: E402
from tracker.analysis.detectors import StreamContext  # noqa: E402
from tracker.analysis.epoch_run import histories  # noqa: E402
from tracker.analysis.epoch_specs import EPOCH_DETECTORS, OVERFITTING  # noqa: E402
from tracker.analysis.offline import _environment, _store, find_run  # noqa: E402
from tracker.analysis.epochs import History  # noqa: E402
from tracker.analysis.real_corpus import (  # noqa: E402
    FRESH_BATCH, KINDS, Detection, RealScore, detections, format_table, import_corpus, load_eye_labels,
    RealRun, load_eye_readers, load_manifest, readers_agreement, score,
)

CORPUS = ROOT / "tests" / "data" / "real_runs"
ONLINE_KINDS = ("overfitting", "zero_loss")
SHOWN = ("anemia-zero-box", "wheat-weed-v8", "fabric-cls", "coffee-train5-inf", "handraising-y12")
KIND_OF = {"overfitting": "overfitting", "metric_collapse": "metric_collapse", "zero_loss": "zero_loss",
           "stopped_early": "stopped_early", "epoch_divergence": "divergence"}
# overfitting's setting `--tune-eye` finds on the eye labels of the seen runs, fixed before the next fresh batch is
# scored: `--fresh` scores it beside the defaults, and it replaces them only if its F1 on the fresh runs' eye labels
# is at least theirs (decided before the score). Before batch 11 (208 seen runs: F1 0.78 -> 0.83) it was
# {window 1, min_rise 0.05, settled 0, give_back 0.1}: 0.71 against the defaults' 0.77 on batch 11, so the defaults
# stayed; scored again on batch 12 with no decision hung on it, 0.60 against 0.60 (docs/analysis.md). Before batch 13
# (256 seen runs of batches 4-12: F1 0.76 -> 0.79) it was {window 1, min_rise 0.05, give_back 0.1}: 1.00 against the
# defaults' 0.50 on batch 13, so it replaced them (tracker/analysis/epoch_specs.py). Empty: nothing to score beside the
# defaults until `--tune-eye` finds a setting again on the seen runs and it is fixed here before a fresh score.
EYE_TUNED: dict[str, Any] = {}
GRID: dict[str, dict[str, list[Any]]] = {
    "overfitting": {"patience": [2, 3, 4, 5], "window": [1, 3, 5], "min_rise": [0.05, 0.1, 0.2],
                    "settled": [0.0, 0.02, 0.05, 0.1], "give_back": [0.0, 0.03, 0.05, 0.1],
                    "train_drop": [0.0, 0.05, 0.1], "metric_gain": [0.0, 0.5, 1.0, 2.0], "min_val_size": [0, 30],
                    "min_confidence": [0.0, 0.5, 0.9, 0.95]},
    "metric_collapse": {"patience": [3, 2, 5], "never_patience": [5, 3, 8], "floor": [1e-6, 1e-4]},
    "zero_loss": {"patience": [3, 2, 5]},
    "stopped_early": {"min_remaining": [3, 2, 5], "min_fraction": [0.1, 0.05, 0.2], "decay_points": [3, 4, 6]},
    "epoch_divergence": {"factor": [1.25, 1.5, 2.0, 3.0], "patience": [1, 2, 3], "min_span": [0.0, 0.25, 0.5, 1.0]},
}
EYE_PART = {"fresh": f"held-out runs, fresh (batch {FRESH_BATCH} on)",
            "holdout": f"held-out runs, seen (batches 4-{FRESH_BATCH - 1}; the epoch judges' gates were set on "
                       "the eye labels of batches 4, 6 and 7)"}
TITLES = {"tuning": "tuning runs",
          "holdout": f"held-out runs, seen (batches 1-{FRESH_BATCH - 1}: scored before, their misses read)",
          "fresh": f"held-out runs, fresh (batch {FRESH_BATCH} on: no verdict ran on them before)"}


def _judge_all(spec: Any, params: dict[str, Any], hists: dict[str, Any]) -> dict[str, dict[str, Detection]]:
    out: dict[str, dict[str, Detection]] = {}
    for name, (config, history) in hists.items():
        judge = spec.factory(StreamContext(key="", params=params, config=config))
        out[name] = detections(judge.judge(history))
    return out


def _f1(s: Any) -> float:
    p, r = s.precision or 0.0, s.recall or 0.0
    return 2 * p * r / (p + r) if p + r else (1.0 if s.fp == 0 and s.fn == 0 else 0.0)


def watched(hists: dict[str, Any]) -> dict[str, dict[str, Detection]]:
    """``overfitting`` as a user asking at every step while the run trained was first told it (no hindsight)."""
    out: dict[str, dict[str, Detection]] = {}
    for name, (config, history) in hists.items():
        judge = OVERFITTING.factory(StreamContext(key="", params=OVERFITTING.defaults(), config=config))
        out[name] = {}
        for step in history.steps:
            then = history.upto(int(step))
            got = judge.judge(History(then.series, then.config, then.environment, "running", then.imported))
            if got:
                out[name] = detections([replace(got[0], step=int(step))])
                break
    return out


def tune(runs: list[Any], hists: dict[str, Any], eye: bool = False) -> None:
    """Grid search of each judge on every run but the fresh ones; prints the best setting and its score.

    ``eye``: against the eye labels (the readers' majority) of the seen held-out runs that have them
    (batches 4 to ``FRESH_BATCH - 1``), instead of the written definitions' labels of every seen run."""
    seen = [r for r in runs if r.part != "fresh"]
    if eye:
        labels = load_eye_labels(CORPUS)
        seen = [replace(r, labels=labels[r.name].labels) for r in seen if r.holdout and r.name in labels]
    against = (f"the eye labels of {len(seen)} seen held-out runs" if eye else
               "the tuning and seen held-out runs")
    for spec in EPOCH_DETECTORS:
        if spec.name not in KIND_OF:  # a kind no label scores (head_never_learnt): nothing to tune it against
            continue
        kind = KIND_OF[spec.name]
        judged = {r.name: hists[r.name] for r in seen}

        def objective(params: dict[str, Any]) -> float:
            scores = score(seen, _judge_all(spec, params, judged))
            both = scores["tuning"][kind]
            both.tp += scores["holdout"][kind].tp
            both.fp += scores["holdout"][kind].fp
            both.fn += scores["holdout"][kind].fn
            return -_f1(both)

        params = spec.defaults()
        start = best = objective(params)
        for _ in range(2):
            for name, values in GRID[spec.name].items():
                for value in values:
                    trial = {**params, name: value}
                    got = objective(trial)
                    if got < best:
                        best, params = got, trial
        changed = {k: v for k, v in params.items() if v != spec.defaults()[k]}
        print(f"{spec.name:16} F1 on {against}: defaults {-start:.2f}, best {-best:.2f}; changed from the "
              f"defaults: {changed or 'none'}")


def _eye_tuned(runs: list[Any], hists: dict[str, Any]) -> None:
    """overfitting with :data:`EYE_TUNED` beside the defaults, on the fresh runs' eye labels."""
    eye = load_eye_labels(CORPUS)
    fresh = [replace(r, labels=eye[r.name].labels) for r in runs if r.part == "fresh" and r.name in eye]
    if not fresh or not EYE_TUNED:
        return
    mine = {r.name: hists[r.name] for r in fresh}
    found = _judge_all(OVERFITTING, OVERFITTING.defaults(), mine)  # the judge alone both times: like with like
    tuned = _judge_all(OVERFITTING, {**OVERFITTING.defaults(), **EYE_TUNED}, mine)
    clear = [r for r in fresh if eye[r.name].clear]
    for subset, which in ((fresh, ""), (clear, " read as clear")):
        rows = {"defaults": score(subset, found)["fresh"]["overfitting"],
                "eye-tuned": score(subset, tuned)["fresh"]["overfitting"]}
        print(format_table(rows, f"{EYE_PART['fresh']}, labelled by eye ({len(subset)}{which}): overfitting with "
                                 f"the defaults and with {EYE_TUNED} (F1 {_f1(rows['defaults']):.2f} against "
                                 f"{_f1(rows['eye-tuned']):.2f})"))
        print()


def _print_five(shown: dict[str, Any]) -> None:
    print("verdicts on five real runs (tracker analyze; findings only):")
    for name in [n for n in SHOWN if n in shown]:
        a = shown[name]
        print(f"  {name}:")
        for rec in a.findings or []:
            e = rec.event
            print(f"    {e.kind} @ {e.data.get('unit', 'step')} {e.step}: {e.message}")
        if not a.findings:
            print("    no finding")


def _by_eye(runs: list[Any], *found: dict[str, dict[str, Detection]]) -> None:
    """The held-out runs labelled by eye (``eye-labels.toml``) scored against those labels, per part (fresh:
    no verdict ran on them before; seen: batches 4 to ``FRESH_BATCH`` - 1, the judges' gates set on those of
    4, 6 and 7), and how the two label sets agree: the definitions' labels and the verdicts share a rule, the
    eye's share nothing."""
    eye = load_eye_labels(CORPUS)
    read = [replace(r, labels=eye[r.name].labels) for r in runs if r.holdout and r.name in eye]
    if not read:
        print("no eye labels for the held-out runs (tests/data/real_runs/eye-labels.toml)\n")
        return
    by_name = {r.name: r for r in runs}
    clear = {name for name, e in eye.items() if e.clear}
    titles = ("findings", "the online detectors' events", "overfitting as first told at every epoch (no hindsight)")
    for part in ("fresh", "holdout"):
        labelled = [r for r in read if r.part == part]
        if not labelled:
            continue
        name = EYE_PART[part]
        print(f"{name} labelled by eye: {len(labelled)}; per kind, runs labelled by both / the definitions only / "
              "the eye only:")
        for kind in KINDS:
            both = [r.name for r in labelled if kind in r.labels and kind in by_name[r.name].labels]
            defs = [r.name for r in labelled if kind not in r.labels and kind in by_name[r.name].labels]
            eyes = [r.name for r in labelled if kind in r.labels and kind not in by_name[r.name].labels]
            print(f"  {kind:16s} {len(both):2d} / {len(defs):2d} / {len(eyes):2d}"
                  + (f"   definitions only: {', '.join(defs)}" if defs else "")
                  + (f"   eye only: {', '.join(eyes)}" if eyes else ""))
        print()
        for subset, which in ((labelled, ""), ([r for r in labelled if r.name in clear], " read as clear")):
            for what, title in zip(found, titles):
                scored = score(subset, what)[part]
                if title.startswith("overfitting"):
                    scored = {"overfitting": scored["overfitting"]}
                elif title.startswith("the online"):
                    scored = {k: v for k, v in scored.items() if k in ONLINE_KINDS}
                print(format_table(scored, f"{name}, labelled by eye ({len(subset)}{which}): {title}"))
                print()
        _by_reader(labelled, found[0], part)


def _by_reader(labelled: list[Any], found: dict[str, dict[str, Detection]], part: str) -> None:
    """The findings scored against each reader of ``eye-readers/`` apart, for the runs every reader read: how
    far the score depends on who read the curves (the tables above use their majority); then, pooled over
    the groups, one reader against another next to the findings against one reader: how far careful readers
    agree, the most a verdict can be asked to agree with any of them."""
    every = load_eye_readers(CORPUS)
    readers_pooled: dict[str, Any] = {k: RealScore(k) for k in KINDS}
    found_pooled: dict[str, Any] = {k: RealScore(k) for k in KINDS}
    groups = []
    for group in sorted({who.split("-")[0] for who in every}):  # batch7-a, batch7-b, ...: one group per batch
        readers = {who: r for who, r in every.items() if who.split("-")[0] == group}
        names = {r.name for r in labelled}.intersection(*map(set, readers.values()))
        if names:
            groups.append(group)
            _print_readers(labelled, found, part, readers, names)
            readers_agreement(labelled, readers, into=readers_pooled)
            readers_agreement(labelled, readers, found, into=found_pooled)
    if groups:
        print(f"{EYE_PART[part]}, the runs read by three readers apart ({', '.join(groups)}): one labeller "
              "against one other, every ordered pair pooled, P / R (TP/FP/FN)")
        print(f"  {'verdict':16s} {'a reader against another':>26s} {'the findings against a reader':>31s}")
        for kind in KINDS:
            r, f = readers_pooled[kind], found_pooled[kind]
            if r.tp + r.fp + r.fn + f.tp + f.fp + f.fn:
                print(f"  {kind:16s} {_pr(r):>26s} {_pr(f):>31s}")
        print()


def _print_readers(labelled: list[Any], found: dict[str, dict[str, Detection]], part: str,
                   readers: dict[str, Any], names: set[str]) -> None:
    """One group's table of :func:`_by_reader`."""
    print(f"{EYE_PART[part]}, {len(names)} runs read by {len(readers)} readers apart: the findings against each "
          "reader's labels, P / R (TP/FP/FN)")
    per = {who: score([replace(r, labels=labels[r.name].labels) for r in labelled if r.name in names], found)[part]
           for who, labels in readers.items()}
    print(f"  {'verdict':16s} " + "".join(f"{who:>22s}" for who in per))
    for kind in KINDS:
        cells = [per[who][kind] for who in per]
        if not any(c.tp + c.fn + c.fp for c in cells):
            continue
        print(f"  {kind:16s} " + "".join(f"{_pr(c):>22s}" for c in cells))
    print()


def _pr(s: Any) -> str:
    """``P / R (tp/fp/fn)`` of one score, ``-`` for an undefined ratio."""
    p, r = ("-" if v is None else f"{v:.2f}" for v in (s.precision, s.recall))
    return f"{p} / {r} ({s.tp}/{s.fp}/{s.fn})"


def _print_unscored(runs: list[RealRun], unscored: dict[str, list[str]], parts: list[str]) -> None:
    """The findings of kinds no label has (``head_never_learnt``), per part, beside the run's eye labels."""
    eye = load_eye_labels(CORPUS)
    print("findings of kinds no label scores (told, not scored), with the run's eye labels where it has them:")
    for part in parts:
        told = [(r.name, unscored[r.name]) for r in runs if r.part == part and unscored.get(r.name)]
        print(f"  {TITLES[part]}: " + (", ".join(
            f"{name} ({', '.join(kinds)}; eye: {', '.join(sorted(eye[name].labels)) or 'none'})" if name in eye
            else f"{name} ({', '.join(kinds)})" for name, kinds in told) or "none"))
    print()


def main() -> None:
    """Import, analyse, score, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tune", action="store_true",
                        help="grid-search the epoch judges on the tuning and seen held-out runs")
    parser.add_argument("--tune-eye", action="store_true",
                        help="only grid-search the epoch judges against the eye labels of the seen held-out runs")
    parser.add_argument("--tuning-only", action="store_true",
                        help="leave the held-out runs out entirely (while working on the judges)")
    parser.add_argument("--fresh", action="store_true",
                        help=f"also judge and score the fresh held-out runs (batch {FRESH_BATCH} on): once, at the end")
    args = parser.parse_args()
    runs = [r for r in load_manifest(CORPUS) if args.fresh or r.part != "fresh"]
    if args.tuning_only:
        runs = [r for r in runs if not r.holdout]
    parts = ["tuning"] + ([] if args.tuning_only else ["holdout"] + (["fresh"] if args.fresh else []))
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        t0 = time.perf_counter()
        ids = import_corpus(runs, home)
        t1 = time.perf_counter()
        found, online, shown, hists, unscored = {}, {}, {}, {}, {}
        store = _store(home)
        for run in runs:
            row = find_run(store, ids[run.name])
            (history,) = histories(store, row, _environment(home, row["run_id"])).values()
            hists[run.name] = (row["config"], history)
        if args.tune_eye:  # the judges alone, on the histories: no analysis, no tables
            tune(runs, hists, eye=True)
            return
        for run in runs:
            analysis = analyze(ids[run.name], home=home)
            found[run.name] = detections(analysis.findings)
            online[run.name] = detections([r for r in analysis.events if r.event.kind in ONLINE_KINDS])
            unscored[run.name] = sorted({r.event.kind for r in analysis.findings} - set(KINDS))
            if run.name in SHOWN:
                shown[run.name] = analysis
        t2 = time.perf_counter()
        counts = ", ".join(f"{sum(r.part == p for r in runs)} {p}" for p in parts)
        print(f"real corpus: {len(runs)} runs ({counts}), imported in {t1 - t0:.1f} s, analysed in {t2 - t1:.1f} s "
              f"({(t2 - t1) / len(runs) * 1e3:.0f} ms a run)")
        if args.fresh and not any(r.part == "fresh" for r in runs):
            print(f"no fresh run: held-out runs of batch {FRESH_BATCH} or later are fresh (batches "
                  f"1-{FRESH_BATCH - 1} are scored and seen); append the new runs with batch = {FRESH_BATCH}")
        positives = {k: sum(k in r.labels for r in runs) for k in KINDS}
        print("labelled faults: " + ", ".join(f"{k} {n}" for k, n in positives.items()) +
              f"; no fault: {sum(not r.labels for r in runs)}")
        scores = score(runs, found)
        print()
        for part in parts:
            print(format_table(scores[part], TITLES[part]))
            print()
        online_scores = score(runs, online)
        watch = score(runs, watched(hists))
        for part in parts[1:]:
            also = {k: s for k, s in online_scores[part].items() if k in ONLINE_KINDS}
            print(format_table(also, f"{TITLES[part]}: the online detectors' events of the same kinds "
                                     "(twin_overfitting, twin_zero_loss, class_zero_loss; events, not findings)"))
            print()
        for part in parts:
            print(format_table({"overfitting": watch[part]["overfitting"]},
                               f"{TITLES[part]}: overfitting as first told to a user asking at every epoch while "
                               "the run trained (no hindsight)"))
            print()
        _by_eye(runs, found, online, watched(hists))
        _print_unscored(runs, unscored, parts)
        if args.fresh:
            _eye_tuned(runs, hists)
        _print_five(shown)
        if args.tune:
            print()
            tune(runs, hists)


if __name__ == "__main__":
    main()
