"""The epoch judges' specs (detector scope ``epochs``) and their defaults.

The judges themselves are in :mod:`tracker.analysis.epoch_judges`. Their defaults
were set on the tuning part (two thirds, drawn before tuning) of the real corpus in
``tests/data/real_runs`` with ``bench/analysis_real.py --tune`` and are scored on the
held-out third; ``docs/analysis.md`` gives the figures. Windows count points of the
history (one per epoch for an Ultralytics ``results.csv``).

``min_points=10``
    every judge needs a history of 10 points before it says anything.
``overfitting``
    ``patience=3`` points since the minimum and ``hold=0.25`` of the points it took
    to reach it, ``window=3`` points in the recent median, ``min_rise=0.1`` (10% above
    the minimum, taken on the running median of 3) and ``give_back=0.03`` of the
    loss's range so far, ``alpha=0.05`` for the Mann-Kendall rise: real validation
    curves of small sets swing 20-50% from one epoch to the next, so the rise must be
    large, material and a trend; ``min_val_size=30``: no verdict on a validation set
    of fewer images (read from an accuracy's 1/N steps); ``after_warmup=1``: nothing
    is judged while the learning rate still rises. ``hold``, ``give_back``,
    ``min_val_size`` and ``alpha`` came from the false positives of the tuning runs
    (``bench/analysis_real.py`` docstring); the held-out runs played no part.
    ``settled=0.05`` is the label definition's own (the median of every point since
    the minimum 5% above it: a two-epoch blip late on a flat stretch is no lasting
    rise); ``metric_gain=1`` (the fitness at most doubled since the minimum; 0.05
    before) lets through the YOLOv5 runs whose one term rises 10-30% while the mAP
    still climbs 30-50%, which the labels call overfitting, and still stops a minimum
    reached at a fitness of 0.03 that went on to 0.4 (early-training noise). Both were
    read from the tuning runs (``bench/analysis_overfit_tuning.py``, which loads no
    held-out file).
``metric_collapse``
    ``patience=3`` points at 0 after a metric was above it; ``never_patience=5`` points
    at 0 from the start (a from-scratch model may score 0 for its first epochs);
    ``floor=1e-6`` (trainers write an exact 0 when nothing is detected).
``zero_loss``
    ``patience=3`` points exactly 0 in a row (train or validation side, or every loss).
``stopped_early``
    ``min_remaining=3`` steps and ``min_fraction=0.1`` of the schedule left; ``lrf=0.01``
    (Ultralytics' final-lr fraction) when the config gives none. A finished
    Ultralytics schedule extrapolates to 1-2 epochs left.
``epoch_divergence``
    ``factor=2`` times the minimum so far (the search's choice: a noisy train loss of a
    small set swings 1.5-1.9x its minimum without diverging), for ``patience=2`` points
    in a row, back up ``min_span=0.5`` of its fall before that minimum.
"""

from __future__ import annotations

from tracker.analysis.detectors import DetectorSpec
from tracker.analysis.epoch_judges import EpochDivergence, MetricCollapse, StoppedEarly, ZeroLoss
from tracker.analysis.epoch_overfit import Overfitting
from tracker.analysis.params import Param

_MIN = Param("min_points", 10, "points the history needs before any verdict", 3, None, True)

OVERFITTING = DetectorSpec(
    name="overfitting", scope="epochs", factory=Overfitting,
    description="a validation loss rising from its minimum while its train twin falls; names the best epoch",
    params=(
        _MIN,
        Param("patience", 3, "points after the validation minimum, at least", 1, None, True),
        Param("window", 3, "last points whose median is the end rise", 1, None, True),
        Param("min_rise", 0.1, "the end rise: the last points' median at least this fraction above the minimum",
              0.0, None),
        Param("settled", 0.05, "the lasting rise: the median of every point since the minimum this fraction above it",
              0.0, None),
        Param("give_back", 0.05, "the lasting rise is at least this fraction of the loss's range (max - minimum)",
              0.0, 1.0),
        Param("train_drop", 0.0, "the train twin's median since the minimum this fraction below its value there",
              0.0, 1.0),
        Param("metric_gain", 0.0, "0: off; else no verdict when the fitness rose more than this fraction above "
              "its best up to the minimum", 0.0, None),
        Param("min_val_size", 0, "0: off; else no verdict when an accuracy's steps (1/N) say the validation set "
              "has fewer images", 0.0, None),
        Param("min_confidence", 0.0, "no verdict below this confidence (the rise against its noise)", 0.0, 1.0),
    ),
)

METRIC_COLLAPSE = DetectorSpec(
    name="metric_collapse", scope="epochs", factory=MetricCollapse,
    description="a metric (mAP, accuracy, ...) that fell to zero and stayed, or never left zero",
    params=(
        _MIN,
        Param("patience", 3, "points at zero after the metric was above it", 1, None, True),
        Param("never_patience", 5, "points at zero from the start", 1, None, True),
        Param("floor", 1e-6, "a metric at or below this is zero", 0.0, None),
    ),
)

ZERO_LOSS = DetectorSpec(
    name="zero_loss", scope="epochs", factory=ZeroLoss,
    description="a loss exactly zero while its train/validation twin is not: no targets or positives",
    params=(_MIN, Param("patience", 3, "points exactly zero in a row", 1, None, True)),
)

STOPPED_EARLY = DetectorSpec(
    name="stopped_early", scope="epochs", factory=StoppedEarly,
    description="a run that ended before its planned epochs or its learning-rate schedule",
    params=(
        _MIN,
        Param("min_remaining", 3, "steps of the schedule left, at least", 0.0, None),
        Param("min_fraction", 0.1, "and at least this fraction of the schedule", 0.0, 1.0),
        Param("lrf", 0.01, "final learning rate as a fraction of the peak, when the config has no lrf", 0.0, 1.0),
        Param("decay_points", 4, "points after the lr warm-up the schedule's step is read from (and needs)", 2, None,
              True),
    ),
)

EPOCH_DIVERGENCE = DetectorSpec(
    name="epoch_divergence", scope="epochs", factory=EpochDivergence,
    description="a train loss far above its minimum so far for several points in a row (epoch histories)",
    params=(
        _MIN,
        Param("factor", 2.0, "above factor x the minimum so far", 1.0001, None),
        Param("patience", 2, "points in a row above it", 1, None, True),
        Param("min_span", 0.5, "and back up at least this fraction of its fall before the minimum", 0.0, None),
    ),
)

EPOCH_DETECTORS: tuple[DetectorSpec, ...] = (OVERFITTING, METRIC_COLLAPSE, ZERO_LOSS, STOPPED_EARLY, EPOCH_DIVERGENCE)
