"""Tuning aid for the ``overfitting`` judge: every run of ``tests/data/real_runs`` but the fresh ones.

Imports the tuning runs and the seen held-out runs (batches 1-3: all scored before;
the fresh held-out runs, batch ``FRESH_BATCH`` on, are never read), judges each with
the ``overfitting`` judge at the defaults (or ``--set name=value``) and prints, per
miss, false alarm and hit, the judge's event and the label, then the score per part.

Run: ``.venv/bin/python bench/analysis_overfit_tuning.py [--set min_rise=0.1 ...]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if not p.endswith("/bench")]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import tempfile  # noqa: E402

from tracker.analysis.detectors import StreamContext  # noqa: E402
from tracker.analysis.epoch_run import histories  # noqa: E402
from tracker.analysis.epoch_specs import OVERFITTING  # noqa: E402
from tracker.analysis.offline import _environment, _store, find_run  # noqa: E402
from tracker.analysis.real_corpus import detections, import_corpus, load_manifest, score  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "real_runs"


def main() -> None:
    """Import the tuning runs, judge, score, print the misses and alarms."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", action="append", default=[], help="name=value of an overfitting parameter")
    args = ap.parse_args()
    params = OVERFITTING.defaults()
    for item in args.set:
        k, v = item.split("=", 1)
        params[k] = float(v)
    runs = [r for r in load_manifest(CORPUS) if r.part != "fresh"]
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        ids = import_corpus(runs, home)
        store = _store(home)
        found = {}
        for run in runs:
            row = find_run(store, ids[run.name])
            (h,) = histories(store, row, _environment(home, row["run_id"])).values()
            judge = OVERFITTING.factory(StreamContext(key="", params=params, config=row["config"]))
            events = judge.judge(h)
            found[run.name] = detections(events)
            lab = run.labels.get("overfitting")
            if bool(events) != bool(lab) or (events and lab):
                got = f"{events[0].step}: {events[0].message}" if events else "none"
                print(f"{run.name}: label {lab}\n    judge {got}")
    s = score(runs, {n: {k: d for k, d in f.items() if k == "overfitting"} for n, f in found.items()})
    for part in ("tuning", "holdout"):
        t = s[part]["overfitting"]
        print(f"{part} overfitting: P {t.precision} R {t.recall} TP {t.tp} FP {t.fp} FN {t.fn} lead {t.lead_steps}")


if __name__ == "__main__":
    main()
