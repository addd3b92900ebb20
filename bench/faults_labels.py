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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# an overfitting run: the last validation loss at least this much above its minimum,
# the minimum in the first OVERFIT_BEFORE of the run
OVERFIT_RISE = 1.25
OVERFIT_BEFORE = 0.8
RARE_RECALL = 0.5  # the rare class "never learns" below this validation recall


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


def digits_labels(record: dict[str, Any]) -> list[Label]:
    """The labels of one digits run from its record (see :mod:`bench.faults_digits`)."""
    fault, last, onset = record["fault"], int(record["steps"]) - 1, record.get("onset")
    labels: list[Label] = []
    if record.get("first_nan") is not None:
        s = int(record["first_nan"])
        labels.append(Label("non_finite", s, s, s, note="first non-finite loss"))
    if fault == "lr_high" and record.get("first_nan") is None:
        labels.append(Label("divergence", onset, onset, last, key="train/loss", note="lr x10 from this step"))
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
    elif fault == "imbalance" and (record.get("rare_recall") or 0.0) < RARE_RECALL:
        labels.append(Label("stagnant_classes", 0, 0, last, key="train/cls_loss", classes=[8],
                            note=f"class 8 validation recall {record.get('rare_recall'):.2f}"))
    found = overfitting([tuple(v) for v in record.get("val", [])], record.get("train", []), last)
    if found is not None:
        labels.append(found)
    return labels
