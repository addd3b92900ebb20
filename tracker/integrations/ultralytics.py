"""Track an Ultralytics YOLO training run: ``track(model)`` and then ``model.train(...)``.

Ultralytics is AGPL-3.0 and an optional extra (``pip install 'tracker[ultralytics]'``);
this module imports only tracker and ultralytics.

What :func:`track` logs (steps are global batch indices,
``epoch * batches_per_epoch + batch_index``):

* per batch: ``train/box_loss``, ``train/cls_loss``, ``train/dfl_loss`` (the
  criterion's loss items of that batch, the dict of 8.4 or the tensor of older
  releases), ``lr/pg0``... (each optimizer param group), and the per-class vector
  ``train/cls_loss`` (``run.log_classes``), which sums to ``train/cls_loss``; and
  ``sys/data_time``, the seconds the batch waited for the data loader (from the
  previous batch's end, or the epoch's start, to ``on_train_batch_start``);
  the assignment statistics and gradient balance per class (``assign/gt``,
  ``assign/pos``, ``assign/gt_no_pos``, ``grad/pos``, ``grad/neg``, and
  ``assign/pos/P3``... per pyramid level), from the criterion's own assigner
  (:mod:`tracker.integrations.ultralytics_assign`; ``assign_stats=False`` for none);
* per epoch, at the step of its last batch: every metric Ultralytics reports
  (``metrics/mAP50(B)``, ``metrics/mAP50-95(B)``, precision, recall, ``val/*``)
  and ``epoch`` (completed epochs, 1-based as in ``results.csv``), and the per-class
  vectors ``val/AP50`` and ``val/AP50-95`` from the validator. The evaluation
  of ``best.pt`` that Ultralytics runs after the last epoch (it fires the
  epoch-end callback once more) is logged as ``best/...`` at the last step, not
  as an extra epoch;
* config: the trainer's arguments, ``class_counts`` (instances per class in the
  training labels), ``class_weights`` when a weighting is in force,
  ``batches_per_epoch``, ``train_images``, ``rfs_threshold`` (with
  ``repeat_factor_trainer``) and ``loss`` (the term and its parameters); class names
  come from the dataset.

Resume: the run id is kept in ``<save_dir>/tracker.json``; ``YOLO(".../last.pt")
.train(resume=True)`` with ``track()`` attached resumes that run at the first
step of the epoch Ultralytics restarts from, so the batches it replays after an
interruption supersede the earlier rows (hidden, not deleted) and each curve has
no duplicate and no gap.

Durability: the per-batch rows are flushed (:meth:`tracker.run.Run.flush`, a barrier)
at ``on_train_epoch_end`` and again right before Ultralytics writes ``last.pt``, so a
kill at any moment after a checkpoint loses no row logged before it. Ultralytics
(8.4.190) logs an epoch's metrics only after its checkpoint, but writes them to
``results.csv`` before it: a resume logs the metrics of checkpointed epochs that
``results.csv`` holds and the run lacks (a kill between the save and their flush),
at their step, once (values as ``results.csv`` rounds them, 6 significant digits).

Background work: the run flushes every ``flush_interval`` seconds (5 by default for a
tracked training, against :func:`tracker.init`'s 1): each flush's Parquet files, online
analysis and table building cost about the same however many rows it holds, so fewer,
larger flushes take a quarter of the CPU (and the GIL) from the training
(``python -m bench.assign_cost``). The barriers above still make every row before a
checkpoint durable; a ``kill -9`` loses at most the last ``flush_interval`` of rows, which
a resume replays anyway. Before the first step, :func:`tracker.system.preload_background_imports`
imports on the training thread what the run's threads would import during the first
steps (pyarrow's pandas shim above all).

Random streams: :func:`kept_random_state` keeps Python's, numpy's and torch's global
generators across the tracker's setup, so a seeded training gets the same batches and
augmentations tracked as untracked (``tests/tracker/test_ultralytics_rng.py``).

Ultralytics' own loggers: its MLflow callback (on whenever ``mlflow`` is importable;
MLflow 3 then contacts its telemetry host and creates an experiment under the working
folder) is taken off the trainer for the tracked training only, with one log line,
unless ``MLFLOW_TRACKING_URI`` is set or ``track(..., ultralytics_loggers=True)``; the
user's Ultralytics settings are never written. Its other callbacks (W&B, Comet,
ClearML, DVC, Ray Tune, TensorBoard) run as the settings say.

Loss substitution (``loss="class_weighted_bce"`` or any registered term): see
:mod:`tracker.integrations.ultralytics_loss`. With a term, Ultralytics' own class
weights (``cls_pw > 0``) are refused: they would weight the classes a second
time; ``scheme="power", power=cls_pw`` gives the same inverse-frequency weights.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

import tracker
from tracker.errors import ConfigError, RunError

log = logging.getLogger(__name__)

STATE_FILE = "tracker.json"
EVENTS = ("on_pretrain_routine_start", "on_pretrain_routine_end", "on_train_epoch_start", "on_train_batch_start",
          "on_train_batch_end", "on_train_epoch_end", "on_fit_epoch_end", "on_train_end", "teardown")
MLFLOW_MODULE = "ultralytics.utils.callbacks.mlflow"
# results.csv columns that are not the epoch's metrics (logged per batch, or bookkeeping)
_NOT_EPOCH_METRICS = ("epoch", "time")
_PER_BATCH_PREFIXES = ("train/", "lr/")
FLUSH_INTERVAL_S = 5.0  # seconds between background flushes (tracker.init's default is 1 s)
MAX_FLUSH_INTERVAL_S = 60.0


def track(model: Any, *, project: str | None = None, name: str | None = None, run_id: str | None = None,
          loss: str | None = None, log_every: int = 1, ultralytics_loggers: bool = False,
          assign_stats: bool = True, on_error: str | None = None, flush_interval: float = FLUSH_INTERVAL_S,
          **loss_params: Any) -> None:
    """Attach tracking (and optionally a loss term) to an ``ultralytics.YOLO`` model; returns nothing.

    ``project`` defaults to the trainer's ``project`` folder name (else ``"yolo"``),
    ``name`` to its run name; ``run_id`` to a new id. ``loss`` names a registered
    loss term that computes the detector's classification loss, with
    ``loss_params`` (``scheme``, ``counts`` defaulting to the training labels'
    counts, ``beta``, ``power``, ``pos_weight``, ``gamma``, ``alpha``, ...).
    ``log_every`` logs the per-batch values every n-th batch. ``ultralytics_loggers=True``
    keeps Ultralytics' MLflow callback on (it is off for tracked trainings unless
    ``MLFLOW_TRACKING_URI`` is set; see the module doc). ``assign_stats=False`` turns off the
    assignment statistics and gradient balance (:mod:`tracker.integrations.ultralytics_assign`).
    ``on_error``: on an error-severity event, ``"stop"`` training cleanly or save a
    ``"checkpoint"`` (:mod:`tracker.integrations.ultralytics_actions`); default None.
    ``flush_interval``: seconds between the run's background flushes (the run config's
    ``tracker_flush_interval``; default :data:`FLUSH_INTERVAL_S`, see the module doc).
    """
    if not isinstance(ultralytics_loggers, bool):
        raise ConfigError(f"ultralytics_loggers is {ultralytics_loggers!r}; expected True or False")
    if not callable(getattr(model, "add_callback", None)):
        raise ConfigError(f"track() needs an ultralytics.YOLO model; got {type(model).__name__}")
    if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
        raise ConfigError(f"log_every is {log_every!r}; expected an int >= 1")
    if isinstance(flush_interval, bool) or not isinstance(flush_interval, (int, float)) or not (
            0 < flush_interval <= MAX_FLUSH_INTERVAL_S):
        raise ConfigError(f"flush_interval is {flush_interval!r}; expected seconds in (0, {MAX_FLUSH_INTERVAL_S}]")
    if loss is not None:
        from tracker.integrations.ultralytics_loss import check_loss

        check_loss(loss, {k: v for k, v in loss_params.items() if k != "counts"})
    elif loss_params:
        raise ConfigError(f"loss parameters {sorted(loss_params)} given without loss=...; name the loss term")
    state = _Tracker(project, name, run_id, loss, dict(loss_params), log_every)
    state.ultralytics_loggers = ultralytics_loggers
    state.flush_interval = float(flush_interval)
    state.assign_stats = bool(assign_stats)
    from tracker.integrations.ultralytics_actions import check_on_error

    state.on_error = check_on_error(on_error)
    for event in EVENTS:
        model.add_callback(event, getattr(state, event))


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def mlflow_off(trainer: Any) -> bool:
    """Take Ultralytics' MLflow callbacks off ``trainer`` (this training only: its callback
    lists are its own copies); True when there were some. Settings are not touched."""
    module = sys.modules.get(MLFLOW_MODULE)
    removed = False
    for event, fn in (getattr(module, "callbacks", None) or {}).items():
        hooks = trainer.callbacks.get(event, [])
        while fn in hooks:
            hooks.remove(fn)
            removed = True
    return removed


def epoch_rows(results: Path) -> dict[int, dict[str, float]]:
    """``{epoch: {metric: value}}`` from an Ultralytics ``results.csv`` (the epoch's metrics only:
    not ``time``, nor the per-batch ``train/*`` and ``lr/*`` columns); the last row of an epoch
    wins (an epoch replayed after a kill before its checkpoint appears twice). Empty when absent."""
    import csv

    try:
        with open(results, newline="", encoding="utf-8") as fh:
            table = list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error):
        return {}
    out: dict[int, dict[str, float]] = {}
    for row in table:
        row = {str(k).strip(): v for k, v in row.items() if k is not None}
        try:
            epoch = int(float(row["epoch"]))
            out[epoch] = {k: float(v) for k, v in row.items() if v not in (None, "")
                          and k not in _NOT_EPOCH_METRICS and not k.startswith(_PER_BATCH_PREFIXES)}
        except (KeyError, TypeError, ValueError):
            continue  # a torn last line (killed while appending): its epoch has no checkpoint
    return out


def loss_items(trainer: Any) -> dict[str, float]:
    """The last batch's loss items as ``{name: value}``: the dict of 8.4, or the tensor of older releases."""
    items = trainer.loss_items
    if isinstance(items, dict):
        return {str(k): float(v) for k, v in items.items()}
    values = items.detach().float().cpu().reshape(-1).tolist() if hasattr(items, "detach") else list(items)
    names = list(getattr(trainer, "loss_names", ()))
    if len(names) != len(values):
        raise RunError(f"Ultralytics gave {len(values)} loss items but {len(names)} loss names {names}")
    return dict(zip(names, values))


def label_counts(trainer: Any) -> np.ndarray:
    """Instances per class in the training labels (the dataset's own label list, before any resampling)."""
    nc = int(trainer.data["nc"])
    labels = trainer.train_loader.dataset.labels
    classes = [np.asarray(lb["cls"]).reshape(-1) for lb in labels]
    flat = np.concatenate(classes).astype(np.int64) if classes else np.zeros(0, np.int64)
    return np.bincount(flat, minlength=nc)[:nc].astype(np.int64)


@contextlib.contextmanager
def kept_random_state() -> Iterator[None]:
    """Python's, numpy's and torch's (CPU) global random streams as they were before the block.

    Ultralytics seeds them before the callbacks run, and its augmentations draw from them: a
    tracker setup that drew from them (the first in a process imports the plugins, and ``rich``
    draws ``random.getrandbits`` at import) would give a seeded training other batches than the
    same training untracked."""
    import random

    import torch

    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])


class _Tracker:
    """The callbacks' shared state for one model (reset at each training's start)."""

    def __init__(self, project: str | None, name: str | None, run_id: str | None, loss: str | None,
                 loss_params: dict[str, Any], log_every: int) -> None:
        self.project, self.name, self.run_id = project, name, run_id
        self.loss, self.loss_params, self.log_every = loss, loss_params, log_every
        self.run: Any = None
        self.per_class: Callable[[], Any] | None = None
        self.batches = 0
        self.batch = 0
        self.batch_done = 0.0  # perf_counter when the last batch ended (or the epoch started)
        self.data_time: float | None = None
        self.epoch_ended: int | None = None
        self.ultralytics_loggers = False
        self.flush_interval = FLUSH_INTERVAL_S
        self.assign_stats, self.assign = True, None
        self.on_error: str | None = None
        self.action: Any = None  # on_error's ErrorAction of the current training

    # -- setup -------------------------------------------------------------------
    def on_pretrain_routine_start(self, trainer: Any) -> None:
        """Refuse a second class weighting before anything is built."""
        self.run, self.per_class, self.epoch_ended = None, None, None
        cls_pw = float(getattr(trainer.args, "cls_pw", 0.0) or 0.0)
        if self.loss is not None and cls_pw > 0:
            raise ConfigError(
                f"track(loss={self.loss!r}) with Ultralytics' cls_pw={cls_pw} would weight the classes twice; "
                f"train with cls_pw=0 and pass scheme='power', power={cls_pw} to track() for the same "
                "inverse-frequency weights"
            )
        if not self.ultralytics_loggers and not os.environ.get("MLFLOW_TRACKING_URI") and mlflow_off(trainer):
            from ultralytics.utils import LOGGER

            LOGGER.info("tracker: Ultralytics' MLflow callback is off for this training (track() records it; "
                        "set MLFLOW_TRACKING_URI or pass track(..., ultralytics_loggers=True) to keep it)")

    def on_pretrain_routine_end(self, trainer: Any) -> None:
        """Substitute or observe the classification loss, then start or resume the run."""
        from ultralytics.utils import RANK
        from ultralytics.utils.torch_utils import unwrap_model

        if RANK > 0:
            return
        with kept_random_state():  # the tracker's setup draws nothing from the training's random streams
            self._setup(trainer, unwrap_model(trainer.model))

    def _setup(self, trainer: Any, model: Any) -> None:
        names = [str(trainer.data["names"][i]) for i in range(int(trainer.data["nc"]))]
        counts = label_counts(trainer)
        factory, weights = None, None
        if self.loss is not None:
            from tracker.integrations.ultralytics_loss import term_module

            _, weights = term_module(self.loss, self.loss_params, counts, len(names))  # checks now, before a batch

            def factory() -> Any:
                return term_module(self.loss, self.loss_params, counts, len(names))[0]
        from tracker.integrations.ultralytics_loss import install

        self.per_class = install(model, factory)
        if self.assign_stats:
            from tracker.integrations.ultralytics_assign import attach

            self.assign = attach(model)
        if trainer.ema is not None:
            install(trainer.ema.ema, factory)  # validation losses use the same term
        stock = getattr(model, "class_weights", None)
        if stock is not None:
            weights = stock.detach().cpu().double().numpy()
        self.batches = len(trainer.train_loader)
        from tracker.system import preload_background_imports, system_options

        preload_background_imports(system_options(None).enabled)  # not on the run's threads during the steps
        self._start_run(trainer, names, counts, weights)
        save = getattr(trainer, "save_model", None)
        if callable(save):  # the barrier right before last.pt is written (rows logged during validation too)
            run = self.run

            def save_model() -> Any:
                run.flush()
                return save()

            trainer.save_model = save_model

    def _start_run(self, trainer: Any, names: list[str], counts: np.ndarray, weights: Any) -> None:
        save_dir = Path(trainer.save_dir)
        state_file = save_dir / STATE_FILE
        state = json.loads(state_file.read_text()) if trainer.resume and state_file.is_file() else None
        config = _jsonable(vars(trainer.args))
        config.update(
            class_counts=dict(zip(names, counts.tolist())),
            batches_per_epoch=self.batches,
            loss={"term": self.loss or "ultralytics_bce", **_jsonable(self.loss_params)},
            train_images=len(trainer.train_loader.dataset),
            tracker_flush_interval=self.flush_interval,
        )
        if getattr(trainer, "rfs_threshold", None) is not None:  # repeat_factor_trainer's sampling
            config["rfs_threshold"] = float(trainer.rfs_threshold)
        if weights is not None:
            config["class_weights"] = np.asarray(weights, dtype=np.float64).tolist()
        start = int(trainer.start_epoch) * self.batches
        if state is not None:
            if int(state["batches_per_epoch"]) != self.batches:
                raise ConfigError(
                    f"resumed training has {self.batches} batches per epoch but run {state['run_id']!r} was logged "
                    f"with {state['batches_per_epoch']}; resume with the original batch size"
                )
            self.run = tracker.init(state["project"], config=config, run_id=state["run_id"], resume="must",
                                    resume_step=start, home=state["home"])
            self._backfill_epochs(save_dir / "results.csv", int(trainer.start_epoch))
        else:
            project = self.project or (Path(str(trainer.args.project)).name if trainer.args.project else "yolo")
            self.run = tracker.init(project, name=self.name or str(trainer.args.name), config=config,
                                    run_id=self.run_id, seed=int(trainer.args.seed))
            tmp = state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"run_id": self.run.run_id, "project": self.run.project,
                                       "home": str(self.run.home), "batches_per_epoch": self.batches}))
            os.replace(tmp, state_file)
        self.run.set_classes(names)
        if self.on_error is not None:
            from tracker.integrations.ultralytics_actions import ErrorAction

            self.action = ErrorAction(self.run, self.on_error)

    def _backfill_epochs(self, results: Path, epochs: int) -> None:
        """Log the metrics of checkpointed epochs (1..``epochs``) that ``results`` holds and
        the run lacks: Ultralytics writes them there before the checkpoint, and we log them
        after it, so a kill in between took them away. Never a duplicate: an epoch whose
        ``epoch`` row is visible is left alone, and nothing is logged when that cannot be read."""
        rows = {e: v for e, v in epoch_rows(results).items() if e <= epochs}
        if not rows:
            return
        try:
            from tracker.store import open_store

            have = set(open_store(self.run.home).query(
                "SELECT DISTINCT step FROM curves WHERE run_id = ? AND rank = ? AND key = 'epoch' AND step < ?",
                [self.run.run_id, self.run.rank, self.run.start_step],
            )["step"].to_list())
        except Exception as exc:
            log.warning("tracker: run %s: could not read which epochs it holds (%s); epoch metrics lost to an "
                        "earlier kill are not restored from %s", self.run.run_id, exc, results)
            return
        filled = []
        for epoch, values in sorted(rows.items()):
            step = epoch * self.batches - 1
            if step not in have:
                self.run._log_before_start({**values, "epoch": float(epoch)}, step=step)
                filled.append(epoch)
        if filled:
            log.warning("tracker: run %s: restored the metrics of epoch(s) %s from %s (lost to a kill after "
                        "their checkpoint)", self.run.run_id, ", ".join(map(str, filled)), results)

    # -- per batch ---------------------------------------------------------------
    def on_train_epoch_start(self, trainer: Any) -> None:
        """Count batches from 0 in each epoch."""
        self.batch = 0
        self.batch_done = time.perf_counter()

    def on_train_batch_start(self, trainer: Any) -> None:
        """The batch has arrived: the time since the last one ended is the wait for data."""
        self.data_time = time.perf_counter() - self.batch_done

    def on_train_batch_end(self, trainer: Any) -> None:
        """Log the batch's loss items, learning rates and per-class classification loss."""
        self.batch_done = time.perf_counter()  # the wait for the next batch starts now (logging takes microseconds)
        if self.run is None:
            return
        i = self.batch
        self.batch += 1
        step = int(trainer.epoch) * self.batches + i
        if self.action is not None:  # on_error: act on an error event of an earlier batch
            self.action.on_batch_end(trainer)
        if self.assign is not None:
            from tracker.integrations.ultralytics_assign import log_batch

            log_batch(self.assign, self.run, step, self.log_every)
        if step % self.log_every:
            return
        values = {f"train/{k}": v for k, v in loss_items(trainer).items()}
        for j, group in enumerate(trainer.optimizer.param_groups):
            values[f"lr/pg{j}"] = float(group["lr"])
        if self.data_time is not None:
            values["sys/data_time"] = self.data_time
        self.run.log(values, step=step)
        per_class = self.per_class() if self.per_class is not None else None
        if per_class is not None:  # float64 as computed (log_classes would round a tensor to float32)
            self.run.log_classes("train/cls_loss", per_class.detach().cpu().numpy(), step=step)

    # -- per epoch ---------------------------------------------------------------
    def on_train_epoch_end(self, trainer: Any) -> None:
        """Remember which epoch trained last (the final evaluation comes without one), and make
        the epoch's rows durable before Ultralytics validates and saves its checkpoint."""
        self.epoch_ended = int(trainer.epoch)
        if self.run is not None:
            self.run.flush()

    def on_fit_epoch_end(self, trainer: Any) -> None:
        """Log the epoch's metrics at its last batch's step; the final evaluation as ``best/...``."""
        if self.run is None:
            return
        metrics = {str(k): float(v) for k, v in (trainer.metrics or {}).items()
                   if isinstance(v, (int, float, np.generic)) or getattr(v, "ndim", 1) == 0}
        if self.epoch_ended is None or int(trainer.epoch) != self.epoch_ended:
            last = self.run.step if self.run.step is not None else self.run.start_step
            self.run.log({f"best/{k}": v for k, v in metrics.items()}, step=last)
            self._log_ap(trainer, last, "best/")
            return
        step = (self.epoch_ended + 1) * self.batches - 1
        self.run.log({**metrics, "epoch": float(self.epoch_ended + 1)}, step=step)
        self._log_ap(trainer, step, "val/")

    def _log_ap(self, trainer: Any, step: int, prefix: str) -> None:
        """Per-class ``AP50`` and ``AP50-95`` of the validation just run (``val/`` or ``best/``)."""
        from tracker.integrations.ultralytics_assign import log_val_ap

        log_val_ap(self.run, trainer, step, prefix)

    # -- end ---------------------------------------------------------------------
    def on_train_end(self, trainer: Any) -> None:
        """Finish the run."""
        if self.run is not None:
            self.run.finish()
            self.run = None

    def teardown(self, trainer: Any) -> None:
        """A training that ended without ``on_train_end``: mark the run killed or crashed."""
        if self.run is None:
            return
        exc = sys.exc_info()[0]
        self.run.finish("killed" if exc is not None and issubclass(exc, KeyboardInterrupt) else "crashed")
        self.run = None
