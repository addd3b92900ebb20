"""Stagnant classes: per-class losses that have not fallen while their total has.

Rules:

* Input is a ``log_classes`` key as a matrix, one row per logged step, one column
  per class index (NaN where a class is missing).
* A class is judged on the rows where it *occurs* (a finite value above 0): a
  per-class loss is 0 in a batch without that class, so a rare class's column is
  mostly 0 and its plain median says nothing. Per window, a class's level is the
  median of its occurring values, and needs ``min_rows`` of them (else the class is
  not judged in that window).
* The reference is the first ``window`` rows: per class, that level; for the
  total, the median of the row sums. Every ``every`` rows, once ``2 * window``
  rows exist, the last ``window`` rows are summarised the same way.
* The total has fallen when ``now <= (1 - total_drop) * ref``. A class is stagnant
  when, at such an evaluation, its ``ref > 0`` and ``now >= (1 - class_drop) * ref``
  (it fell less than ``class_drop``), or it *lags*: its level now is at least
  ``lag`` times the median of the judged classes' levels (a class with three
  images memorises them, so its loss falls, but stays hundreds of times the
  others'). An event names the classes that became stagnant at that evaluation; a
  class is reported once.
* Evaluations fall on fixed row counts, so results do not depend on chunking.
"""

from __future__ import annotations

import math
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
    lag: list[float] | None = None  # per named class: its level now / the median class level now


def occurring_median(rows: np.ndarray, min_rows: int) -> np.ndarray:
    """Per column, the median of its finite values above 0; NaN where fewer than ``min_rows`` occur."""
    with np.errstate(invalid="ignore"):
        occurs = np.isfinite(rows) & (rows > 0)
    counts = occurs.sum(axis=0)
    out = np.full(rows.shape[1], np.nan)
    for j in np.flatnonzero(counts >= max(1, min_rows)).tolist():
        out[j] = float(np.median(rows[occurs[:, j], j]))
    return out


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
        self.lag = float(p["lag"])
        self.min_rows = int(p["min_rows"])
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
            self.ref = occurring_median(rows, self.min_rows)
            self.ref_total = float(np.median(np.nansum(rows, axis=1)))
            self.ref_rows = []

    def _evaluate(self, rows: np.ndarray, step: int) -> ClassVerdict | None:
        """The stagnant classes over ``rows`` (the last window), or None if the total did not fall."""
        if self.ref is None or not self.ref_total > 0:
            return None
        total_now = float(np.median(np.nansum(rows, axis=1)))
        if not total_now <= (1.0 - self.total_drop) * self.ref_total:
            return None
        now = occurring_median(rows, self.min_rows)
        ref = self.ref
        if ref.size < now.size:
            ref = np.pad(ref, (0, now.size - ref.size), constant_values=np.nan)
        judged = now[np.isfinite(now)]
        typical = float(np.median(judged)) if judged.size else np.nan
        with np.errstate(invalid="ignore", divide="ignore"):
            stuck = np.isfinite(ref) & np.isfinite(now) & (ref > 0) & (now >= (1.0 - self.class_drop) * ref)
            ratio = now / typical if typical > 0 else np.full(now.shape, np.nan)
            lagging = np.isfinite(ratio) & (ratio >= self.lag) & (judged.size >= 3)
        idx = np.flatnonzero(stuck | lagging)
        return ClassVerdict(step, idx.tolist(), ref[idx].tolist(), now[idx].tolist(), self.ref_total, total_now,
                            ratio[idx].tolist())

    def _report(self, verdict: ClassVerdict) -> list[Event]:
        new = [k for k, c in enumerate(verdict.classes) if c not in self.reported]
        if not new:
            return []
        classes = [verdict.classes[k] for k in new]
        self.reported.update(classes)
        names = [self.names.get(c, f"class {c}") for c in classes]
        shown = ", ".join(names[:MAX_NAMED]) + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")
        drop = 1.0 - verdict.total_now / verdict.total_ref
        lag = [verdict.lag[k] for k in new] if verdict.lag is not None else [math.nan] * len(new)
        far = [f"{n} ({r:.0f}x the median class's loss)" for n, r in zip(names, lag) if r >= self.lag]
        if far:
            shown += f"; lagging: {', '.join(far[:MAX_NAMED])}"
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
                        "lag": lag,
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
