"""Labels of the fault corpus: what each real run should make the detectors say, and from when.

A :class:`Label` names the event kind a detector should raise (``kind``), the step
the fault began (``onset``: its injection step, or the first step that shows it
where it is there from the start, e.g. the first non-finite loss), and the steps
an event may fall on to count (``lo``..``hi``). ``key`` and ``classes``, where
given, narrow what counts (a memory event on ``sys/proc/rss``; a stagnant-classes
event naming the rare class).

Labels come from the fault and from what the run measured independently of any
detector (the first non-finite loss, the validation loss' minimum, the rare class'
validation recall), never from a detector's output. A run may carry several labels
or none (a healthy twin). An ``optional`` label allows an event without asking for
one: a stalled loader makes every step slower, so a step-time regression there is
right, but ``data_stall`` is the detector that must name it.

Kinds without a built-in detector today are kept as labels, so the score names
them: ``zero_loss`` (a loss identically zero: no targets or no positives),
``overfitting`` (the validation loss rising from its minimum while the training
loss falls) and ``identical_batches`` (ranks drawing the same batches).

A fault that is meant to produce one outcome is labelled by that outcome only when
the run shows it; a run whose fault did not manifest is recorded with
``manifested: false`` and the kind in its ``unscored`` list, so it is neither a
positive nor a healthy control for that kind, and the score's printout names it.
(Overfitting is measured on every run, healthy ones included, so a tiny training
set that did not overfit by the rule below is a control like any other run.)

Divergence (the ``lr_high`` faults, digits and YOLO), written from what a divergence
is, a loss that grows instead of falling once the learning rate is too high:

* the run's train losses (digits ``train/loss``; YOLO ``train/box_loss``,
  ``train/cls_loss``, ``train/dfl_loss``), per logged step, each judged alone;
* a non-finite train loss: the run went past divergence to NaN/inf. It gets the
  ``non_finite`` label at its first such step, and an ``optional`` divergence label
  from the onset up to that step (a rise before the NaN is right, not required);
* else a key *diverged* when the level it ends at, the median of its last tenth
  of steps (at least :data:`DIVERGE_POINTS`), is at least :data:`DIVERGE_FACTOR`
  times its best before the fault: the minimum, over the steps up to the onset, of
  its trailing median of :data:`DIVERGE_POINTS` points (for a fault present from
  step 0, the first logged loss: the untrained model's). The label names the key
  when one key diverged, and any train loss when several did;
* no key diverged and none went non-finite: the fault did not manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

# an overfitting run: the last validation loss at least this much above its minimum,
# the minimum in the first OVERFIT_BEFORE of the run
OVERFIT_RISE = 1.25
OVERFIT_BEFORE = 0.8
RARE_RECALL = 0.5  # the rare class "never learns" below this validation recall
# a divergence: the train loss ends (median of the last tenth of the run) at least this many times its best before
# the fault (the minimum of its trailing median of DIVERGE_POINTS points, up to the onset)
DIVERGE_FACTOR = 2.0
DIVERGE_POINTS = 5
DIVERGE_TAIL = 0.1


@dataclass
class Label:
    """One expected event: ``kind`` at a step in ``[lo, hi]``; ``onset`` for the lead time."""

    kind: str
    onset: int
    lo: int
    hi: int
    key: str | None = None
    classes: list[int] = field(default_factory=list)
    note: str = ""
    optional: bool = False  # an event in [lo, hi] is right but not required: neither a hit nor a false alarm


def overfitting(val: list[tuple[int, float]], train: list[float], last: int) -> Label | None:
    """An ``overfitting`` label when the validation curve ``[(step, loss)]`` rose from an early minimum
    while the training loss (``train``: one mean per validation) kept falling."""
    if len(val) < 4 or len(train) != len(val):
        return None
    steps = np.array([s for s, _ in val])
    losses = np.array([v for _, v in val], dtype=np.float64)
    if not np.all(np.isfinite(losses)):
        return None
    best = int(np.argmin(losses))
    if best >= OVERFIT_BEFORE * len(val) or losses[-1] < OVERFIT_RISE * losses[best]:
        return None
    if not train[-1] < train[best]:
        return None
    onset = int(steps[best])
    return Label("overfitting", onset, onset, last, key="val/loss",
                 note=f"val/loss {losses[best]:.3g} at step {onset}, {losses[-1]:.3g} at the end")


def train_curves(run_id: str, keys: Sequence[str], home: Any = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per key of ``keys`` the run logged, its ``(steps, values)`` in step order, read back from the store."""
    import tracker

    marks = ", ".join("?" for _ in keys)
    df = tracker.query(f"SELECT key, step, value FROM curves WHERE run_id = ? AND key IN ({marks}) ORDER BY key, step",
                       [run_id, *keys], home=home)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key in keys:
        rows = df.filter(df["key"] == key)
        if rows.height:
            out[key] = (rows["step"].to_numpy().astype(np.int64), rows["value"].to_numpy().astype(np.float64))
    return out


def _trailing_median(values: np.ndarray, points: int) -> np.ndarray:
    """The median of each point and the ``points - 1`` before it (fewer at the start)."""
    head = [float(np.median(values[: i + 1])) for i in range(min(points - 1, values.size))]
    if values.size < points:
        return np.array(head)
    tail = np.median(np.lib.stride_tricks.sliding_window_view(values, points), axis=1)
    return np.concatenate([np.array(head), tail])


def loss_rise(steps: np.ndarray, values: np.ndarray, onset: int) -> dict[str, float]:
    """How far a finite train loss ends above its best before ``onset`` (module doc): ``best``, ``end``, ``ratio``."""
    best_curve = _trailing_median(values, DIVERGE_POINTS)
    before = best_curve[steps <= onset]
    best = float(before.min() if before.size else best_curve[0])
    tail = max(DIVERGE_POINTS, int(round(DIVERGE_TAIL * values.size)))
    end = float(np.median(values[-tail:]))
    return {"best": best, "end": end, "ratio": end / best if best > 0 else float("inf")}


def divergence_labels(record: dict[str, Any], curves: dict[str, tuple[np.ndarray, np.ndarray]], onset: int,
                      note: str) -> list[Label]:
    """The divergence outcome of a learning-rate fault (module doc); records ``manifested`` and the rise per key.

    The ``non_finite`` label itself comes from the caller (the first non-finite loss).
    """
    last = int(record["steps"]) - 1
    bad = [int(s[~np.isfinite(v)][0]) for s, v in curves.values() if not np.all(np.isfinite(v))]
    if bad:
        _manifest(record, "divergence", True, {"first_non_finite": min(bad)})
        return [Label("divergence", onset, onset, max(onset, min(bad)), optional=True,
                      note=f"{note}; the loss went non-finite at step {min(bad)}")]
    rises = {key: loss_rise(s, v, onset) for key, (s, v) in curves.items()}
    grown = [key for key, r in rises.items() if r["end"] >= DIVERGE_FACTOR * r["best"]]
    _manifest(record, "divergence", bool(grown), rises)
    if not grown:
        return []
    said = ", ".join(f"{k} {rises[k]['best']:.3g} -> {rises[k]['end']:.3g}" for k in grown)
    return [Label("divergence", onset, onset, last, key=grown[0] if len(grown) == 1 else None,
                  note=f"{note}; {said}")]


def _manifest(record: dict[str, Any], kind: str, shown: bool, measured: Any = None) -> None:
    """Record whether the run's fault showed as ``kind``; a fault that did not is left out of ``kind``'s score."""
    record["manifested"] = shown
    if measured is not None:
        record[f"{kind}_measured"] = measured
    unscored = [k for k in record.get("unscored", []) if k != kind]
    record["unscored"] = unscored if shown else [*unscored, kind]


def digits_labels(record: dict[str, Any], home: Any = None) -> list[Label]:
    """The labels of one digits run from its record (see :mod:`bench.faults_digits`); the ``lr_high`` runs' train
    loss is read back from the store under ``home``."""
    fault, last, onset = record["fault"], int(record["steps"]) - 1, record.get("onset")
    labels: list[Label] = []
    if record.get("first_nan") is not None:
        s = int(record["first_nan"])
        labels.append(Label("non_finite", s, s, s, note="first non-finite loss"))
    if fault == "lr_high":
        curves = train_curves(record["run_id"], ["train/loss"], home)
        labels += divergence_labels(record, curves, int(onset), "lr x10 from this step")
    elif fault == "fp16":
        _manifest(record, "non_finite", record.get("first_nan") is not None)
    elif fault == "overwrite":
        labels.append(Label("plateau", 0, 0, last, key="train/loss", note="the loss never falls"))
    elif fault in ("leak_fast", "leak_slow"):
        labels.append(Label("memory_growth", onset, onset, last, key="sys/proc/rss",
                            note=f"{record.get('kept_bytes', 0) / 1e6:.0f} MB of tensors kept"))
    elif fault == "stall":
        labels.append(Label("data_stall", onset, onset, last, key="sys/data_time"))
        labels.append(Label("step_time_regression", onset, onset, last, key="sys/step_time", optional=True,
                            note="waiting for data makes every step longer (data_stall names the cause)"))
    elif fault == "slowdown":
        labels.append(Label("step_time_regression", onset, onset, last, key="sys/step_time",
                            note="the validation set scored at every step"))
    elif fault == "empty_class":
        labels.append(Label("zero_loss", 0, 0, last, key="train/cls_loss", classes=[8],
                            note="class 8 has no training label"))
    elif fault == "imbalance":
        shown = (record.get("rare_recall") or 0.0) < RARE_RECALL
        _manifest(record, "stagnant_classes", shown)
        if shown:
            labels.append(Label("stagnant_classes", 0, 0, last, key="train/cls_loss", classes=[8],
                                note=f"class 8 validation recall {record.get('rare_recall'):.2f}"))
    found = overfitting([tuple(v) for v in record.get("val", [])], record.get("train", []), last)
    if found is not None:
        labels.append(found)
    return labels
