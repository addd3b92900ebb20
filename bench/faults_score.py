"""Score the detectors on the fault corpus: precision, recall and lead time per detector.

Reads ``labels.jsonl`` (one record per run: run id, fault, seed, role, labels) and the
store beside it (``<out>/home``), runs :func:`tracker.analyze` on every run with the
registered detectors at their defaults, and judges each (run, detector) pair:

* a hit (TP) when the run has a label of the detector's kind and an event of that kind
  falls in the label's ``[lo, hi]`` (on the label's key and naming its classes, where
  the label says); the lead time is the first such event's step minus the onset
  (steps, and seconds from the rows' wall times);
* a miss (FN) for a label without such an event (an ``optional`` label allows an
  event without asking for one);
* a false alarm (FP) when the run has an event of that kind and no label of that kind
  (a healthy twin flagged), or one before its labels' first step (a flag before the
  fault began): one per run.

Precision and recall are over runs, so a detector that says the same thing on two
keys of a run (``train/loss`` and ``val/loss`` both NaN) is not counted twice. A
run whose fault did not manifest (``manifested: false``, the kind in its
``unscored`` list: :mod:`bench.faults_labels`) is not judged for that kind, neither
a positive nor a healthy control; the printout names it under its table.
The tables are printed for the held-out runs (``role == "held-out"``: seeds never used
to set a threshold) and for the tuning runs apart. Kinds that no registered detector
raises are listed as such.

Run: ``python -m bench.faults_score [--out bench/out/faults] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable

from tracker.analysis.scoring import Score as DetectorScore
from tracker.analysis.scoring import Window, tally

OUT = Path(__file__).resolve().parent / "out" / "faults"
TARGET = 0.9


def load_records(out: Path) -> list[dict[str, Any]]:
    """The corpus' records (``labels.jsonl``), in file order."""
    path = out / "labels.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _matches(window: Window, e: Any) -> bool:
    """Whether event ``e`` is on the label's key and names its classes, where the label says."""
    label = window.label
    if label.get("key") and e.key != label["key"]:
        return False
    return not (label.get("classes") and not set(label["classes"]) <= set((e.data or {}).get("classes", [])))


def _seconds(home: Path, run_id: str, start: int, end: int) -> float | None:
    import tracker

    df = tracker.query("SELECT step, max(wall_time) AS t FROM curves WHERE run_id = ? AND step IN (?, ?) "
                       "GROUP BY step", [run_id, start, end], home=home)
    times = dict(zip(df["step"].to_list(), df["t"].to_list()))
    if start in times and end in times:
        return float(times[end] - times[start])
    return None


def judge(record: dict[str, Any], events: list[Any], kinds: Iterable[str], scores: dict[str, DetectorScore],
          home: Path) -> None:
    """Add one run's verdicts to ``scores`` (kind -> DetectorScore), by :func:`tracker.analysis.scoring.tally`."""
    for kind in kinds:
        score = scores.setdefault(kind, DetectorScore(kind))
        labels = [Window(lb["onset"], lb["lo"], lb["hi"], bool(lb.get("optional")), lb)
                  for lb in record["labels"] if lb["kind"] == kind]
        hits = tally(score, record["name"], labels, [e for e in events if e.kind == kind], _matches)
        for label, found in hits:
            seconds = _seconds(home, record["run_id"], label.onset, found.step)
            if seconds is not None:
                score.lead_seconds.append(seconds)


def raised_kinds() -> list[str]:
    """The event kinds the registered detectors raise (a detector's ``kinds``, else its name), sorted."""
    from tracker.host import get_host

    return sorted({kind for spec in get_host().items("detectors").values() for kind in spec.raises()})


def score(records: list[dict[str, Any]], home: Path) -> dict[str, dict[str, DetectorScore]]:
    """role -> kind -> DetectorScore over the records (every kind a registered detector raises, every labelled
    kind)."""
    import tracker

    registered = raised_kinds()
    labelled = sorted({lb["kind"] for r in records for lb in r["labels"]})
    kinds = [*registered, *[k for k in labelled if k not in registered]]
    out: dict[str, dict[str, DetectorScore]] = {}
    for record in records:
        analysis = tracker.analyze(record["run_id"], home=home)
        events = [rec.event for rec in analysis.events]
        excluded = set(record.get("unscored", []))
        judge(record, events, [k for k in kinds if k not in excluded], out.setdefault(record["role"], {}), home)
    return out


def not_manifested(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Run name -> the kinds it is not scored for, for the runs whose fault did not manifest."""
    return {r["name"]: list(r.get("unscored", [])) for r in records if r.get("manifested") is False}


def _num(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def format_scores(scores: dict[str, DetectorScore], registered: set[str]) -> str:
    """The table: detector, P, R, TP/FP/FN, median and max lead (steps, seconds)."""
    head = f"{'detector':<21} {'P':>5} {'R':>5} {'tp':>3} {'fp':>3} {'fn':>3}  {'lead steps med/max':>18}  " \
           f"{'lead s med/max':>14}"
    lines = [head]
    for kind, s in scores.items():
        if not s.tp + s.fp + s.fn and kind in registered:
            lines.append(f"{kind:<21} {'-':>5} {'-':>5} {0:>3} {0:>3} {0:>3}  (no labelled run, no event)")
            continue
        steps = f"{statistics.median(s.lead_steps):.0f}/{max(s.lead_steps)}" if s.lead_steps else "-"
        secs = f"{statistics.median(s.lead_seconds):.1f}/{max(s.lead_seconds):.1f}" if s.lead_seconds else "-"
        note = "" if kind in registered else "  no detector raises this kind"
        lines.append(f"{kind:<21} {_num(s.precision):>5} {_num(s.recall):>5} {s.tp:>3} {s.fp:>3} {s.fn:>3}  "
                     f"{steps:>18}  {secs:>14}{note}")
    return "\n".join(lines)


def report(out: Path, as_json: bool = False, echo: Any = print) -> dict[str, dict[str, DetectorScore]]:
    """Score the corpus under ``out`` and print the tables (held-out first)."""
    records = load_records(out)
    if not records:
        echo(f"no fault corpus under {out}: build it with python -m bench.faults")
        return {}
    scores = score(records, out / "home")
    registered = set(raised_kinds())
    tune = sorted({r["seed"] for r in records if r["role"] == "tune"})
    for role in ("held-out", "tune"):
        if role not in scores:
            continue
        runs = [r for r in records if r["role"] == role]
        seeds = sorted({r["seed"] for r in runs})
        echo(f"\n{role} runs: {len(runs)} (seeds {', '.join(map(str, seeds))}; thresholds set on seeds "
             f"{', '.join(map(str, tune)) or 'none'})")
        echo(format_scores(scores[role], registered))
        for kind, s in scores[role].items():
            if s.misses or s.alarms:
                echo(f"  {kind}: missed {', '.join(s.misses) or '-'}; false alarms {', '.join(s.alarms) or '-'}")
        for name, kinds in not_manifested(runs).items():
            echo(f"  not manifested (not scored for {', '.join(kinds)}: neither a positive nor a control): {name}")
    if as_json:
        payload: dict[str, Any] = {role: [s.to_dict() for s in table.values()] for role, table in scores.items()}
        payload["not_manifested"] = not_manifested(records)
        (out / "score.json").write_text(json.dumps(payload, indent=2))
        echo(f"\nwrote {out / 'score.json'}")
    return scores


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.faults_score``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the corpus folder (labels.jsonl, home/)")
    parser.add_argument("--json", action="store_true", help="also write score.json there")
    args = parser.parse_args(argv)
    report(args.out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
