"""Benchmark: the collapse detector scored on real self-supervised trainings (``bench.ssl_digits``).

Every method of :data:`bench.ssl_digits.METHODS` trains ``--seeds`` times for
``--steps`` steps with Lightning on scikit-learn's digits, logging its projector's
outputs through ``TrackerCallback`` (``log_embeddings``, window 4,096 samples).
Labels come from the method, not from our statistics: SimSiam without its
stop-gradient (SimSiam's Fig. 2), SimSiam without its predictor (its Table 1) and
VICReg without its variance and covariance terms collapse; SimSiam, SimCLR
(``nt_xent``), VICReg and Barlow Twins are healthy. The end-of-run
``std * sqrt(D)`` and the backbone's 5-NN accuracy are printed beside each run.

Scores, per run (a run is flagged when it has a collapse event):

* precision and recall over the runs, overall and per statistic;
* detection step: the step of the first event;
* lead time: steps from the first event to full collapse, the first step at which
  ``std * sqrt(D)`` is below 0.1 (a tenth of its healthy level), i.e. how long
  before the end of a collapse the detector warns (``>= n`` when the run ended
  before full collapse).

Prints the table of the runs, the statistics of the collapsing and healthy runs
side by side, and the scores; writes ``bench/out/collapse.json``.

Run: ``.venv/bin/python -m bench.collapse`` (``--quick``: one seed, 300 steps).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics as stats
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FULL = 0.1  # std * sqrt(D) below this: fully collapsed


def _curve(run_id: str, key: str) -> tuple[list[int], list[float]]:
    import tracker

    df = tracker.query("SELECT step, value FROM curves WHERE run_id = ? AND key = ? ORDER BY step", [run_id, key])
    return df["step"].to_list(), df["value"].to_list()


def score_run(record: Any, collapsing: bool, dim: int) -> dict[str, Any]:
    """One run's label, detection, lead time and end-of-run statistics."""
    steps, std = _curve(record.run_id, "proj/std")
    ratio = [v * math.sqrt(dim) for v in std]
    full = next((s for s, r in zip(steps, ratio) if r < FULL), None)
    first = min((e["step"] for e in record.events), default=None)
    lead = None if first is None else (full if full is not None else record.steps) - first
    return {
        "method": record.method, "seed": record.seed, "collapsing": collapsing, "flagged": first is not None,
        "first_event": first, "statistics": sorted({e["key"].rsplit("/", 1)[1] for e in record.events}),
        "full_collapse": full, "lead": lead, "lead_lower_bound": full is None and first is not None,
        "std_ratio_end": ratio[-1] if ratio else None, "rankme_end": record.final.get("proj/rankme"),
        "dead_dims_end": record.final.get("proj/dead_dims"), "knn": record.knn_accuracy, "seconds": record.seconds,
    }


def scores(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Precision, recall, detection step and lead time over the runs (and per statistic)."""
    out: dict[str, Any] = {}
    for stat in ("any", "std", "rankme", "dead_dims"):
        flagged = [r["flagged"] and (stat == "any" or stat in r["statistics"]) for r in rows]
        tp = sum(f and r["collapsing"] for f, r in zip(flagged, rows))
        fp = sum(f and not r["collapsing"] for f, r in zip(flagged, rows))
        fn = sum(not f and r["collapsing"] for f, r in zip(flagged, rows))
        out[stat] = {"tp": tp, "fp": fp, "fn": fn, "precision": tp / (tp + fp) if tp + fp else float("nan"),
                     "recall": tp / (tp + fn) if tp + fn else float("nan")}
    hits = [r for r in rows if r["flagged"] and r["collapsing"]]
    out["detection_step"] = [r["first_event"] for r in hits]
    out["lead"] = [r["lead"] for r in hits]
    return out


def side_by_side(rows: list[dict[str, Any]]) -> str:
    """Mean end-of-run statistics of the collapsing and the healthy runs."""
    lines = [f"{'':24} {'std * sqrt(D)':>14} {'RankMe':>8} {'dead dims':>10} {'5-NN acc':>9} {'runs':>5}"]
    for label, group in (("collapsing", [r for r in rows if r["collapsing"]]),
                         ("healthy", [r for r in rows if not r["collapsing"]])):
        if group:
            mean = {k: stats.mean(r[k] for r in group) for k in ("std_ratio_end", "rankme_end", "dead_dims_end", "knn")}
            lines.append(f"{label:24} {mean['std_ratio_end']:14.3f} {mean['rankme_end']:8.1f} "
                         f"{mean['dead_dims_end']:10.2f} {mean['knn']:9.3f} {len(group):5d}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Train, score and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    seeds, steps = (1, 300) if args.quick else (args.seeds, args.steps)
    os.environ["TRACKER_HOME"] = tempfile.mkdtemp(prefix="tracker-bench-collapse-")
    os.environ["TRACKER_SYSTEM"] = "0"
    os.environ["TRACKER_LOGGERS"] = "store"
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    from bench.ssl_digits import COLLAPSING, DIM, METHODS, WINDOW, train

    rows = []
    print(f"{len(METHODS)} methods x {seeds} seeds x {steps} steps on digits (batch 256, D = {DIM}, window {WINDOW})")
    print(f"{'method':16} {'seed':>4} {'label':>10} {'1st event':>9} {'statistics':>16} {'full':>5} {'lead':>6} "
          f"{'std*sqrtD':>9} {'RankMe':>7} {'dead':>5} {'5-NN':>6} {'s':>5}")
    for seed in range(seeds):
        for method in METHODS:
            row = score_run(train(method, steps=steps, seed=seed), method in COLLAPSING, DIM)
            rows.append(row)
            lead = "" if row["lead"] is None else (">=" if row["lead_lower_bound"] else "") + str(row["lead"])
            print(f"{method:16} {seed:4d} {'collapse' if row['collapsing'] else 'healthy':>10} "
                  f"{'' if row['first_event'] is None else row['first_event']:>9} {','.join(row['statistics']):>16} "
                  f"{'' if row['full_collapse'] is None else row['full_collapse']:>5} {lead:>6} "
                  f"{row['std_ratio_end']:9.3f} {row['rankme_end']:7.1f} {row['dead_dims_end']:5.2f} "
                  f"{row['knn']:6.3f} {row['seconds']:5.1f}")
    result = scores(rows)
    print("\nend-of-run statistics, collapsing vs healthy runs (means):")
    print(side_by_side(rows))
    print("\ncollapse detector (a run is flagged by its first collapse event):")
    print(f"{'statistic':10} {'precision':>9} {'recall':>7} {'tp':>4} {'fp':>4} {'fn':>4}")
    for stat in ("any", "std", "rankme", "dead_dims"):
        s = result[stat]
        print(f"{stat:10} {s['precision']:9.2f} {s['recall']:7.2f} {s['tp']:4d} {s['fp']:4d} {s['fn']:4d}")
    if result["lead"]:
        print(f"detection step: median {stats.median(result['detection_step']):.0f} (max "
              f"{max(result['detection_step'])}); lead time to full collapse: median "
              f"{stats.median(result['lead']):.0f} steps (min {min(result['lead'])})")
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "collapse.json").write_text(json.dumps({"runs": rows, "scores": result}, indent=1, default=str))


if __name__ == "__main__":
    main()
