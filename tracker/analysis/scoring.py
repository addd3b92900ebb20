"""Precision, recall and lead time of one verdict over labelled runs: the scoring rule of every corpus.

Both the fault corpus (``bench/faults_score.py``: real trainings with injected
faults) and the real corpus (:mod:`tracker.analysis.real_corpus`: published logs)
score with :func:`tally`, one run and one kind at a time:

* each label (a :class:`Window`: onset and the ``[lo, hi]`` steps an event may fall
  in) is a hit (TP) when an event of the kind falls in its window and ``match``
  accepts it, else a miss (FN); an ``optional`` label allows an event without
  asking for one. The lead time is the first such event's step minus the onset;
* the run has a false alarm (FP, one per run at most) when it has an event of the
  kind and no label of it, or one before its labels' earliest ``lo`` (a flag
  before the fault began).

Precision and recall are over runs: a verdict said twice on one run (``train/loss``
and ``val/loss`` both NaN) is not counted twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence


@dataclass
class Window:
    """A label as scoring sees it: where the fault began and where an event may fall."""

    onset: int
    lo: float = -math.inf
    hi: float = math.inf
    optional: bool = False
    label: Any = None  # the caller's own label record, for ``match``


@dataclass
class Score:
    """Hits, misses, false alarms and lead times of one verdict over a set of runs."""

    kind: str
    tp: int = 0
    fp: int = 0
    fn: int = 0
    runs: int = 0
    lead_steps: list[int] = field(default_factory=list)
    lead_seconds: list[float] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    alarms: list[str] = field(default_factory=list)

    @property
    def precision(self) -> float | None:
        """tp / (tp + fp); None when nothing was flagged."""
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        """tp / (tp + fn); None when nothing was labelled."""
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    def to_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        return {"detector": self.kind, "precision": self.precision, "recall": self.recall, "tp": self.tp,
                "fp": self.fp, "fn": self.fn, "runs": self.runs, "lead_steps": self.lead_steps,
                "lead_seconds": self.lead_seconds, "misses": self.misses, "false_alarms": self.alarms}


def tally(score: Score, run: str, labels: Sequence[Window], events: Iterable[Any],
          match: Callable[[Window, Any], bool] | None = None) -> list[tuple[Window, Any]]:
    """Add one run's verdict to ``score`` (module doc); ``events`` are that kind's, each with a ``step``.

    Returns the hits as ``(label, first matching event)`` pairs, for what a caller
    measures beyond the lead in steps (seconds, the best epoch named).
    """
    score.runs += 1
    mine = sorted(events, key=lambda e: e.step)
    hits: list[tuple[Window, Any]] = []
    for label in labels:
        if label.optional:
            continue
        found = [e for e in mine if label.lo <= e.step <= label.hi and (match is None or match(label, e))]
        if not found:
            score.fn += 1
            score.misses.append(run)
            continue
        score.tp += 1
        score.lead_steps.append(int(found[0].step) - int(label.onset))
        hits.append((label, found[0]))
    start = min((label.lo for label in labels), default=None)
    stray = [e for e in mine if start is None or e.step < start]
    if stray:
        score.fp += 1
        score.alarms.append(f"{run}@{stray[0].step}")
    return hits
