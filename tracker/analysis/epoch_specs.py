"""The epoch judges' specs (detector scope ``epochs``) and their defaults.

The judges themselves are in :mod:`tracker.analysis.epoch_judges` and
:mod:`tracker.analysis.epoch_overfit`. ``overfitting`` and ``stopped_early`` follow
the label definitions written in the real corpus' manifest (``tests/data/real_runs``);
the other defaults were set on its tuning part with ``bench/analysis_real.py --tune``.
The fresh held-out batch scores them (``--fresh``); ``docs/analysis.md`` gives the
figures. Windows count points of the
history (one per epoch for an Ultralytics ``results.csv``).

``min_points=10``
    every judge needs a history of 10 points before it says anything.
``overfitting``
    the corpus' written label definition (``tests/data/real_runs/manifest.toml``):
    ``patience=3`` points after the minimum of the running median of 3, the last of
    them (``window=1``) ``min_rise=0.05`` above it (the end rise), the median of all
    of them ``settled=0.05`` above it (the lasting rise) and that rise
    ``give_back=0.1`` of the loss's range. The definition has the median of the last 3
    10% above and a twentieth of the range; ``bench/analysis_real.py --tune-eye`` found
    these three on the eye labels of the 256 seen runs of batches 4-12 (F1 0.76 to
    0.79), fixed before batch 13 was scored, where they did better than the
    definition's (F1 1.00 against 0.50), so they replaced them. Then three gates the definition lacks,
    set on batch 4's labels read by eye (``eye-labels.toml``: six of its 13
    definition positives were read as no overfitting): the train twin's median
    ``train_drop=0.05`` below its value at the minimum (a twin that "stays ~1.5" at
    -4% is not falling), the validation loss at least ``min_share=0.5`` of the mean
    of the run's validation losses (YOLOv5 obj/cls and pose kobj terms of 2-11% of
    their sum rise and fall as noise; it was 15% of the sum until batch 6's
    ``kposecoco-pose``, whose val/dfl_loss of 13% of five losses doubles), and
    ``min_confidence=0.9`` (the rise against its own noise: a noisy 21-point rise
    after single-epoch dips reads 0.85-0.90). On batches 1-3 this costs three
    definition positives (``skillforge-cls``: twin -4%; ``parking-cls``: confidence
    0.85; ``catdetector-cls`` was missed before). No verdict on a validation set
    without targets (every metric 0 throughout and a validation loss exactly 0 beside a
    train twin that is not: batch 6's ``handfist-det``). ``metric_gain`` and
    ``min_val_size`` stay, off (0). Measured with ``bench/analysis_real.py``.
``metric_collapse``
    ``patience=3`` points at 0 after a metric was above it; ``never_patience=5`` points
    at 0 from the start (a from-scratch model may score 0 for its first epochs);
    ``floor=1e-6`` (trainers write an exact 0 when nothing is detected);
    ``min_peak=0.01``: a metric that never reached 1% (a per-class mAP column at
    0.0002-0.0009) was never learnt. Judged on the whole history: a mask mAP back
    above 0 after 13 epochs at 0 has not collapsed, nor has one that came back from
    zero stretches before (batch 4's eye labels).
``zero_loss``
    ``patience=3`` points exactly 0 in a row (train or validation side, or every loss).
``stopped_early``
    ``min_remaining=3`` steps and ``min_fraction=0.1`` of the schedule left; ``lrf=0.01``
    (Ultralytics' final-lr fraction) when the config gives none. A finished
    Ultralytics schedule extrapolates to 1-2 epochs left. ``decay_points=4``: the
    step is the median of the last 3 steps down (the label definition's), all after
    the warm-up, so a run whose warm-up ended 2 epochs before it did (YOLOv5 on a
    small set: 100 warm-up iterations are many epochs) gets no verdict.
``epoch_divergence``
    ``factor=2`` times the minimum so far of the running median of 3 (a one-epoch dip
    to 0.40 among 0.8-1.1 is no minimum; batch 4) (the search's choice: a noisy train loss of a
    small set swings 1.5-1.9x its minimum without diverging), for ``patience=2`` points
    in a row, back up ``min_span=0.5`` of its fall before that minimum; ``min_jump=5``
    times the median step-to-step change of the points before the climb, where there
    are ``noise_points=5`` of them (portfolio-pose, batch 7: a climb of 3.6 times its
    noise; seabass-det's close_mosaic step is 70 times, judged by the mosaic gate).
"""

from __future__ import annotations

from tracker.analysis.detectors import DetectorSpec
from tracker.analysis.epoch_judges import EpochDivergence, HeadNeverLearnt, MetricCollapse, StoppedEarly, ZeroLoss
from tracker.analysis.epoch_overfit import Overfitting
from tracker.analysis.params import Param

_MIN = Param("min_points", 10, "points the history needs before any verdict", 3, None, True)

OVERFITTING = DetectorSpec(
    name="overfitting", scope="epochs", factory=Overfitting,
    description="a validation loss rising from its minimum while its train twin falls; names the best epoch",
    params=(
        _MIN,
        Param("patience", 3, "points after the validation minimum, at least", 1, None, True),
        Param("window", 1, "last points whose median is the end rise (1: the last point)", 1, None, True),
        Param("min_rise", 0.05, "the end rise: the last points' median at least this fraction above the minimum",
              0.0, None),
        Param("settled", 0.05, "the lasting rise: the median of every point since the minimum this fraction above it",
              0.0, None),
        Param("give_back", 0.1, "the lasting rise is at least this fraction of the loss's range (max - minimum)",
              0.0, 1.0),
        Param("train_drop", 0.05, "the train twin's median since the minimum this fraction below its value there",
              0.0, 1.0),
        Param("min_share", 0.5, "the validation loss's median at least this fraction of the mean of the run's "
              "validation losses' medians (a term tiny in the run's own scale rising is no verdict)", 0.0, None),
        Param("metric_gain", 0.0, "0: off; else no verdict when the fitness rose more than this fraction above "
              "its best up to the minimum", 0.0, None),
        Param("min_val_size", 0, "0: off; else no verdict when an accuracy's steps (1/N) say the validation set "
              "has fewer images", 0.0, None),
        Param("min_confidence", 0.9, "no verdict below this confidence (the rise against its noise)", 0.0, 1.0),
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
        Param("relative", 0.05, "or at or below this share of its best so far (practically zero)", 0.0, 1.0),
        Param("min_peak", 0.01, "a metric that fell: its peak before the fall at least this (below it, the "
              "metric was never learnt: no collapse)", 0.0, None),
    ),
)

HEAD_NEVER_LEARNT = DetectorSpec(
    name="head_never_learnt", scope="epochs", factory=HeadNeverLearnt,
    description="one head's metrics (pose, mask) at zero at every point while another head's are not",
    params=(
        _MIN,
        Param("patience", 10, "points at zero from the start, at least (a pose head can start late: 14 epochs "
              "at zero in a run that then learns, footballpitch-pose; the run as it stands decides)", 1, None, True),
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
        Param("min_jump", 5.0, "and at least this many times its median step-to-step change before the climb", 0.0,
              None),
        Param("noise_points", 5, "changes before the climb the noise gate needs (fewer: no noise gate)", 1, None,
              True),
    ),
)

EPOCH_DETECTORS: tuple[DetectorSpec, ...] = (OVERFITTING, METRIC_COLLAPSE, HEAD_NEVER_LEARNT, ZERO_LOSS, STOPPED_EARLY,
                                             EPOCH_DIVERGENCE)
