"""The built-in detectors and their defaults.

Windows count logged points of the key: at one point per batch they are batches.
The defaults are meant for per-batch losses of a YOLO-style run (box, cls, dfl or
their sum; per-batch noise of 5-30% of the level; a COCO epoch is ~7,300 batches at
batch size 16) and are held to the labelled corpus (:mod:`tracker.analysis.corpus`,
precision and recall >= 0.95 per detector):

``non_finite``
    ``cooldown=100``: one event per episode of NaN/inf, at most one per 100 points,
    so a run that skips every other fp16 step does not flood the events.
``divergence``
    ``median=5``: the EMA is fed the trailing median of 5 points, so one huge
    batch loss (a 1000x spike lifts a plain EMA above any threshold for ~70 points)
    never reads as a divergence, while a lasting rise arrives two points late;
    ``smoothing=0.95`` (an EMA over ~20 points: per-batch noise of 30% shrinks to
    ~5%); ``factor=1.5``: the smoothed loss must be 50% above its running best,
    an order of magnitude above what noise gives the smoothed curve, and well below
    what a diverging run reaches (2x-100x, or inf); ``patience=25`` points in a row,
    so a burst of hard batches is not enough; ``warmup=50`` points before the
    running best counts (the first batches are wild); recovery when the smoothed
    loss is back within ``recover=0.5`` of that margin for ``patience`` points.
    Together, on the corpus: flagged 60-120 points after the onset of a
    divergence (mean ~75), never before it.
``spike``
    ``smoothing=0.9`` (a baseline over ~10 points, quick to follow a falling loss);
    ``threshold=6`` robust SDs of the log residual (1.4826 * median |ln(x / s)| over
    the previous 256 points, so nothing is judged in the first 256 points): log-
    normal batch noise passes 6 SDs about once in 10^9 points, while 2.5x spikes on
    15% noise are caught; heavy-tailed noise (Student t, 5 dof) passes it about
    once in 1,500 points, which ``cooldown=100`` points between spike events and
    ``budget=20`` events per key keep from flooding (the summary still counts
    every spike); ``min_rise=0.2``: at least 20% above the baseline, which matters
    once the scale is tiny.
``plateau``
    ``median=5`` as for divergence; ``smoothing=0.99`` (an EMA over ~100 points, as
    flat as a noisy per-batch curve gets); ``window=2000`` points (about a quarter
    of a COCO epoch) without an improvement of ``min_delta=0.005`` (0.5%) of the
    best and of ``noise_z=4`` SDs of the smoothed curve's own noise, so a flat
    noisy curve cannot improve by luck (``min_abs`` for losses near zero);
    reported only while the smoothed loss is within ``max_rise=0.15`` of the best;
    ``warmup=100`` points.
``stagnant_classes``
    ``window=200`` rows (per-class losses are logged less often), evaluated every
    ``every=200`` rows; the total must have fallen by ``total_drop=0.2`` and a class
    by less than ``class_drop=0.05`` to be named, or it lags: its loss where it
    occurs (``min_rows=3`` rows a window) ``lag=30`` times the median class's. On the
    fault corpus' tuning seeds a class with three training images sat at 180-280x
    the median while the classes of healthy runs reached at most 10x.
``rank_disagreement``
    no parameters: any difference of fingerprints between ranks is a finding.
``identical_batches``
    ``patience=20`` logged steps in a row at which two ranks' own losses agree
    within ``rtol=1e-6`` (float32 carries ~7 digits: ranks on the same batch agree
    to the last bit on CPU and to a few units of the last digit under GPU kernels
    that sum in a varying order, while ranks on different batches differ by their
    batch noise, 1-30%); a loss key is judged only with evidence that it is
    per-rank (``per_rank=1`` says so): see :mod:`tracker.analysis.ranks`.
``twin_zero_loss``, ``class_zero_loss``
    a zero loss while the run trains (:mod:`tracker.analysis.zeros`):
    ``patience=20`` batches exactly 0 (a YOLO batch without any positive is rare;
    twenty in a row do not happen with labels), ``val_patience=3`` epochs of a
    validation key (the epoch judge's), ``converged=0.02`` as for plateaus; a class
    exactly 0 for ``epochs=2`` epochs of batches (every image is drawn once an
    epoch) and ``min_rows=20`` rows.
``twin_overfitting``
    a causal rule judged at each validation point while the run trains
    (:mod:`tracker.analysis.twins`): ``patience=3`` points since the minimum so far,
    ``window=3``, ``alpha=0.001`` for a Mann-Kendall rise, the train twin
    ``train_drop=0.05`` lower and ``min_rise=0.15``. On the 162 seen real runs read
    by eye, ``alpha=0.05`` and ``min_rise=0.25`` (the epoch judge's old defaults) gave
    P 0.37, R 0.75 (18/31/6): a validation loss that rises for a few epochs early and
    comes back is significant at 0.05 after five points; at 0.001 and 0.15, P 0.57, R
    0.83 (20/15/4), and on the digits fault runs of held-out seeds 2-4 P 0.75, R 1.00
    (9/3/0) against P 0.73, R 0.89 (8/3/1). ``lasting=0.1``: the minimum must also be a
    tenth of the config's planned epochs old (at most its early-stopping ``patience``):
    early dips amid a noisy descent that came back, P 0.57 to 0.65 at R 0.83 (20/11/4).
``overfitting``, ``metric_collapse``, ``head_never_learnt``, ``zero_loss``, ``stopped_early``, ``epoch_divergence``
    the epoch judges over few-point histories (scope ``epochs``, ``tracker analyze``
    only): defaults and reasons in :mod:`tracker.analysis.epoch_specs`.
``memory_growth``, ``fragmentation``, ``step_time_regression``, ``data_stall``
    the system detectors over the ``sys/*`` keys: defaults and reasons in
    :mod:`tracker.analysis.system`.
``collapse``
    representation collapse in the statistics of ``run.log_embeddings``: defaults
    and reasons in :mod:`tracker.analysis.collapse`.
"""

from __future__ import annotations

from tracker.analysis.classes import StagnantClasses
from tracker.analysis.collapse import COLLAPSE
from tracker.analysis.detectors import DetectorSpec, NonFinite
from tracker.analysis.epoch_specs import EPOCH_DETECTORS, OVERFITTING
from tracker.analysis.params import Param
from tracker.analysis.ranks import IdenticalBatches, RankDisagreement
from tracker.analysis.spikes import Spike
from tracker.analysis.system import DataStall, Fragmentation, MemoryGrowth, StepTimeRegression
from tracker.analysis.system_memory import MEMORY_GROWTH_PARAMS
from tracker.analysis.trends import Divergence, Plateau
from tracker.analysis.twins import TwinOverfitting
from tracker.analysis.zeros import ClassZeroLoss, TwinZeroLoss

_SMOOTH = "weight of the debiased EMA (TensorBoard's smoothing), in [0, 1)"

NON_FINITE = DetectorSpec(
    name="non_finite",
    scope="scalar",
    factory=NonFinite,
    description="NaN or inf in a loss value; suggests bfloat16 and loss scaling on float16/AMP runs",
    params=(Param("cooldown", 100, "fewest points between two non-finite events", 0, None, True),),
)

DIVERGENCE = DetectorSpec(
    name="divergence",
    scope="scalar",
    factory=Divergence,
    description="the smoothed loss rises well above its running best and stays there; marks the run diverged",
    params=(
        Param("smoothing", 0.95, _SMOOTH, 0.0, 0.9999),
        Param("median", 5, "odd width of the trailing median taken before smoothing (1: none)", 1, 99, True),
        Param("factor", 1.5, "diverged above factor x the running best (factor > 1)", 1.0001, None),
        Param("patience", 25, "points in a row above (or back below) the threshold", 1, None, True),
        Param("warmup", 50, "points before the running best counts", 0, None, True),
        Param("recover", 0.5, "recovered below best + recover x margin", 0.0, 1.0),
        Param("min_delta", 1e-6, "smallest margin above the best, in loss units", 0.0, None),
        Param("floor", 0.05, "and at least this fraction of the curve's starting scale", 0.0, None),
    ),
)

SPIKE = DetectorSpec(
    name="spike",
    scope="scalar",
    factory=Spike,
    description="a single-point outlier above the smoothed loss, judged by a robust scale",
    params=(
        Param("smoothing", 0.9, _SMOOTH, 0.0, 0.9999),
        Param("threshold", 6.0, "robust SDs of the log residual above the smoothed value", 1.0, None),
        Param("min_rise", 0.2, "and at least this fraction above it", 0.0, None),
        Param("cooldown", 100, "fewest points between two spike events", 0, None, True),
        Param("budget", 20, "most spike events per key", 0, None, True),
    ),
)

PLATEAU = DetectorSpec(
    name="plateau",
    scope="scalar",
    factory=Plateau,
    description="no improvement of the smoothed best over a window of points",
    params=(
        Param("smoothing", 0.99, _SMOOTH, 0.0, 0.9999),
        Param("median", 5, "odd width of the trailing median taken before smoothing (1: none)", 1, 99, True),
        Param("window", 2000, "points without improvement", 1, None, True),
        Param("min_delta", 0.005, "an improvement is at least this fraction of the best", 0.0, 1.0),
        Param("noise_z", 4.0, "and at least this many SDs of the smoothed curve's noise", 0.0, None),
        Param("min_abs", 0.0, "and at least this many loss units", 0.0, None),
        Param("max_rise", 0.15, "a plateau stays within this fraction above the best", 0.0, None),
        Param("warmup", 100, "points before the best counts", 0, None, True),
        Param("converged", 0.02, "no plateau once the best is below this fraction of the starting scale", 0.0, 1.0),
    ),
)

STAGNANT_CLASSES = DetectorSpec(
    name="stagnant_classes",
    scope="classes",
    factory=StagnantClasses,
    description="classes whose loss has not fallen while the total has, or lags far behind the other classes",
    params=(
        Param("window", 200, "rows in the reference and in the current window", 2, None, True),
        Param("every", 200, "rows between two evaluations", 1, None, True),
        Param("total_drop", 0.2, "the total must have fallen by this fraction", 0.0, 1.0),
        Param("class_drop", 0.05, "a class that fell less than this fraction is stagnant", 0.0, 1.0),
        Param("lag", 30.0, "or one whose loss is this many times the median class's", 1.0, None),
        Param("min_rows", 3, "rows of a window a class must occur in (value > 0) to be judged", 1, None, True),
    ),
)

RANK_DISAGREEMENT = DetectorSpec(
    name="rank_disagreement",
    scope="ranks",
    factory=RankDisagreement,
    description="ranks whose RNG fingerprints differ in an epoch (rng/fingerprint, rng/epoch)",
)

IDENTICAL_BATCHES = DetectorSpec(
    name="identical_batches",
    scope="ranks",
    factory=IdenticalBatches,
    description="ranks whose own losses are identical step after step: every rank trains on the same batches",
    params=(
        Param("patience", 20, "logged steps in a row at which two ranks agree", 2, None, True),
        Param("rtol", 1e-6, "ranks agree within this relative difference", 0.0, 0.01),
        Param("per_rank", 0, "1: the loss keys are each rank's own (judged without evidence)", 0, 1, True),
    ),
)

TWIN_ZERO_LOSS = DetectorSpec(
    name="twin_zero_loss", scope="twins", factory=TwinZeroLoss, kinds=("zero_loss",),
    description="a loss exactly 0 while its train/validation twin is not (no targets or positives), as it trains",
    params=(
        Param("patience", 20, "points exactly 0 in a row (a train key, one point per batch)", 1, None, True),
        Param("val_patience", 3, "points exactly 0 in a row (a validation key, one point per epoch)", 1, None, True),
        Param("converged", 0.02, "a zero run after a value below this fraction of the starting scale is convergence",
              0.0, 1.0),
    ),
)

CLASS_ZERO_LOSS = DetectorSpec(
    name="class_zero_loss", scope="classes", factory=ClassZeroLoss, kinds=("zero_loss",),
    description="classes whose loss is exactly 0 at every row while the others' is not: no image of them trains",
    params=(
        Param("min_rows", 20, "rows before any verdict", 1, None, True),
        Param("epochs", 2, "and this many epochs of steps (the config's steps_per_epoch or batches_per_epoch)",
              0.0, None),
        Param("span", 1000, "steps instead, when the config gives no epoch length", 0.0, None),
    ),
)

TWIN_OVERFITTING = DetectorSpec(
    name="twin_overfitting", scope="twins", factory=TwinOverfitting, kinds=("overfitting",),
    description="a validation loss rising from its minimum while its train twin falls, as it trains",
    params=(
        OVERFITTING.params[0],  # min_points, shared with the epoch judges
        Param("patience", 3, "points since the validation minimum before judging", 1, None, True),
        Param("lasting", 0.1, "and this share of the config's planned epochs, as points, when it plans them",
              0.0, 1.0),
        Param("window", 3, "recent points whose median is compared with the minimum", 1, None, True),
        Param("min_rise", 0.15, "the recent median is at least this fraction above the minimum", 0.0, None),
        Param("alpha", 0.001, "Mann-Kendall significance of the rise since the minimum", 1e-6, 0.5),
        Param("train_drop", 0.05, "the train twin fell at least this fraction since the minimum", 0.0, 1.0),
    ),
)

_W = "samples of the key (one per sampling interval)"

MEMORY_GROWTH = DetectorSpec(
    name="memory_growth", scope="system", factory=MemoryGrowth,
    description="reserved/RSS memory rising after the warm-up; the step at which it reaches the limit",
    params=MEMORY_GROWTH_PARAMS,
)

FRAGMENTATION = DetectorSpec(
    name="fragmentation", scope="system", factory=Fragmentation,
    description="reserved memory well above the peak of live memory for a long stretch",
    params=(
        Param("threshold", 1.5, "reserved / peak live at or above this", 1.0, None),
        Param("window", 30, f"{_W} over which live memory's peak is taken", 1, None, True),
        Param("patience", 150, f"{_W} in a row above the threshold", 1, None, True),
        Param("warmup", 30, f"{_W} ignored at the start", 0, None, True),
        Param("min_bytes", float(64 << 20), "least reserved bytes worth a finding", 0.0, None),
        Param("recover", 0.8, "an episode ends below recover x threshold", 0.0, 1.0),
    ),
)

STEP_TIME_REGRESSION = DetectorSpec(
    name="step_time_regression", scope="system", factory=StepTimeRegression,
    description="a lasting rise of sys/step_time (a change point)",
    params=(
        Param("window", 31, f"{_W} per side of the comparison (odd)", 3, None, True),
        Param("factor", 1.25, "the new median is at least factor x the old one", 1.0001, None),
        Param("warmup", 30, f"{_W} ignored at the start", 0, None, True),
        Param("busy", 90.0, "host CPU percent from which other processes may explain a slowdown", 0.0, 100.0),
        Param("busy_factor", 2.0, "on a busy host, this process' CPU time per step must rise this much", 1.0, None),
    ),
)

DATA_STALL = DetectorSpec(
    name="data_stall", scope="system", factory=DataStall,
    description="sys/data_time a large share of the step time: the data loader starves training",
    params=(
        Param("share", 0.4, "median share of the step time spent waiting for data", 0.0, 1.0),
        Param("window", 51, "points of sys/data_time in the median (odd)", 1, None, True),
        Param("warmup", 30, "points of sys/data_time ignored at the start", 0, None, True),
        Param("recover", 0.5, "an episode ends below recover x share", 0.0, 1.0),
    ),
)

SYSTEM_DETECTORS: tuple[DetectorSpec, ...] = (MEMORY_GROWTH, FRAGMENTATION, STEP_TIME_REGRESSION, DATA_STALL)

BUILTIN: tuple[DetectorSpec, ...] = (
    NON_FINITE, DIVERGENCE, SPIKE, PLATEAU, STAGNANT_CLASSES, RANK_DISAGREEMENT, IDENTICAL_BATCHES, TWIN_ZERO_LOSS,
    CLASS_ZERO_LOSS, TWIN_OVERFITTING, *SYSTEM_DETECTORS, COLLAPSE,
    *EPOCH_DETECTORS,
)


def builtin_detectors() -> dict[str, DetectorSpec]:
    """The built-in detector specs by name."""
    return {spec.name: spec for spec in BUILTIN}
