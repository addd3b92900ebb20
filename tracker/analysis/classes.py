"""Stagnant classes: per-class losses that have not fallen while their total has.

Rules:

* Input is a ``log_classes`` key as a matrix, one row per logged step, one column
  per class index (NaN where a class is missing).
* The reference is the first ``window`` rows: per class, the median of its values;
  for the total, the median of the row sums. Every ``every`` rows, once ``2 *
  window`` rows exist, the last ``window`` rows are summarised the same way.
* The total has fallen when ``now <= (1 - total_drop) * ref``. A class is stagnant
  when, at such an evaluation, its ``ref > 0`` and ``now >= (1 - class_drop) * ref``
  (it fell less than ``class_drop``). An event names the classes that became
  stagnant at that evaluation; a class is reported once.
* Evaluations fall on fixed row counts, so results do not depend on chunking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tracker.analysis.detectors import StreamContext, clean
from tracker.events import Event

MAX_NAMED = 12


@dataclass
class ClassChunk:
    """The next rows of one per-class key: steps (n,) and values (n, classes)."""

    steps: np.ndarray
    values: np.ndarray


@dataclass
class ClassVerdict:
    """Stagnant classes at one evaluation, with their reference and current values."""

    step: int
    classes: list[int]
    ref: list[float]
    now: list[float]
    total_ref: float
    total_now: float


class StagnantClasses:
    """Per-class stream of the stagnant-classes detector."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.key = ctx.key
        self.names = ctx.class_names
        self.window = int(p["window"])
        self.every = int(p["every"])
        self.total_drop = float(p["total_drop"])
        self.class_drop = float(p["class_drop"])
        self.rows = 0
        self.width = 0
        self.ref_rows: list[np.ndarray] = []
        self.ref: np.ndarray | None = None
        self.ref_total = float("nan")
        self.recent = np.empty((0, 0))
        self.recent_steps = np.empty(0, dtype=np.int64)
        self.reported: set[int] = set()

    def _widen(self, width: int) -> None:
        if width <= self.width:
            return
        pad = width - self.width
        self.recent = np.pad(self.recent, ((0, 0), (0, pad)), constant_values=np.nan)
        self.ref_rows = [np.pad(r, ((0, 0), (0, pad)), constant_values=np.nan) for r in self.ref_rows]
        if self.ref is not None:
            self.ref = np.pad(self.ref, (0, pad), constant_values=np.nan)
        self.width = width

    def feed(self, chunk: ClassChunk) -> list[Event]:
        """Events for the evaluations that fall in ``chunk``."""
        values = np.asarray(chunk.values, dtype=np.float64)
        n = values.shape[0]
        if n == 0:
            return []
        self._widen(values.shape[1])
        if values.shape[1] < self.width:
            values = np.pad(values, ((0, 0), (0, self.width - values.shape[1])), constant_values=np.nan)
        self._fill_reference(values)
        data = np.concatenate([self.recent, values])
        data_steps = np.concatenate([self.recent_steps, np.asarray(chunk.steps, dtype=np.int64)])
        offset = self.recent.shape[0]
        counts = self.rows + np.arange(1, n + 1)
        due = np.flatnonzero((counts >= 2 * self.window) & (counts % self.every == 0))
        events: list[Event] = []
        for i in due.tolist():
            end = offset + i + 1
            verdict = self._evaluate(data[end - self.window : end], int(data_steps[end - 1]))
            if verdict is not None:
                events.extend(self._report(verdict))
        self.recent = data[-self.window :]
        self.recent_steps = data_steps[-self.window :]
        self.rows += n
        return events

    def _fill_reference(self, values: np.ndarray) -> None:
        if self.ref is not None:
            return
        have = sum(r.shape[0] for r in self.ref_rows)
        self.ref_rows.append(values[: self.window - have])
        if have + self.ref_rows[-1].shape[0] >= self.window:
            rows = np.concatenate(self.ref_rows)
            self.ref = np.median(rows, axis=0)
            self.ref_total = float(np.median(np.nansum(rows, axis=1)))
            self.ref_rows = []

    def _evaluate(self, rows: np.ndarray, step: int) -> ClassVerdict | None:
        """The stagnant classes over ``rows`` (the last window), or None if the total did not fall."""
        if self.ref is None or not self.ref_total > 0:
            return None
        total_now = float(np.median(np.nansum(rows, axis=1)))
        if not total_now <= (1.0 - self.total_drop) * self.ref_total:
            return None
        now = np.median(rows, axis=0)
        ref = self.ref
        with np.errstate(invalid="ignore"):
            stuck = np.isfinite(ref) & np.isfinite(now) & (ref > 0) & (now >= (1.0 - self.class_drop) * ref)
        idx = np.flatnonzero(stuck)
        return ClassVerdict(step, idx.tolist(), ref[idx].tolist(), now[idx].tolist(), self.ref_total, total_now)

    def _report(self, verdict: ClassVerdict) -> list[Event]:
        new = [k for k, c in enumerate(verdict.classes) if c not in self.reported]
        if not new:
            return []
        classes = [verdict.classes[k] for k in new]
        self.reported.update(classes)
        names = [self.names.get(c, f"class {c}") for c in classes]
        shown = ", ".join(names[:MAX_NAMED]) + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")
        drop = 1.0 - verdict.total_now / verdict.total_ref
        return [
            Event(
                step=verdict.step,
                kind="stagnant_classes",
                key=self.key,
                severity="warning",
                message=(
                    f"{self.key}: {len(classes)} class{'es have' if len(classes) > 1 else ' has'} not learned while "
                    f"the total fell {drop:.0%}: {shown}; sample them more often (repeat-factor sampling) or "
                    "weight them up"
                ),
                data=clean(
                    {
                        "classes": classes,
                        "names": names,
                        "ref": [verdict.ref[k] for k in new],
                        "now": [verdict.now[k] for k in new],
                        "total_ref": verdict.total_ref,
                        "total_now": verdict.total_now,
                    }
                ),
            )
        ]

    def final(self) -> ClassVerdict | None:
        """The stagnant classes over the last window at the end of the stream (for the report)."""
        if self.rows < 2 * self.window or self.recent.shape[0] < self.window:
            return None
        return self._evaluate(self.recent, int(self.recent_steps[-1]))

    def summary(self) -> dict[str, Any]:
        """Classes reported so far."""
        return {"stagnant_reported": sorted(self.reported)}
