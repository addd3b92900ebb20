"""PyTorch Lightning: ``Trainer(logger=TrackerLogger(...), callbacks=[TrackerCallback()])``.

Lightning is an optional extra (``pip install 'tracker[lightning]'``); this module
imports only tracker and Lightning.

:class:`TrackerLogger` implements Lightning's ``Logger`` API
(``lightning.pytorch.loggers.logger.Logger``):

* ``name`` is the project, ``version`` the run id (so checkpoints land in
  ``<default_root_dir>/<project>/<run id>/checkpoints``), ``save_dir`` None;
* ``log_metrics(metrics, step)`` logs into the run on EVERY rank: each rank keeps
  its own segment of the run (the tracker's rule), so per-rank values stay
  apart; ``log_hyperparams`` (rank zero only) records the hyperparameters in the
  run's config; ``experiment`` is the :class:`tracker.Run` on rank zero and
  Lightning's dummy experiment elsewhere (``rank_zero_experiment``'s behaviour);
* ``save()`` does nothing: the run's flusher writes in the background (Lightning
  calls ``save`` after every ``log_metrics``); ``finalize(status)`` finishes the
  run: ``success`` -> ``finished``, ``failed`` -> ``crashed``, ``finished`` (a
  SLURM requeue) -> ``killed``;
* the run starts when Lightning first asks for the experiment (its setup), on
  every rank at once; without ``run_id`` the ranks agree on one through
  torch.distributed (or ``TRACKER_RUN_ID``).

Resume: ``TrackerLogger(run_id=..., resume="allow")`` with ``trainer.fit(model,
ckpt_path=...)``. The run then starts once the checkpoint is read: with the
:class:`TrackerCallback` at the step of the first batch trained after the
restore (the checkpoint's step), so the rows an interrupted attempt logged after
that checkpoint are hidden, not duplicated; without the callback at the first
step logged.

:class:`TrackerCallback` logs, every ``every_n_steps`` training batches, what the
LightningModule exposes (an attribute, or a method of no arguments, returning a
mapping; the callback reads and then clears an attribute):

* ``tracker_embeddings``: ``{key: (N, D) tensor}`` -> ``run.log_embeddings`` (the
  collapse statistics ``key/rankme``, ``key/std``, ``key/dead_dims``);
* ``tracker_class_losses``: ``{key: (C,) tensor}`` -> ``run.log_classes``.

It also flushes the run before each checkpoint is written (``run.flush()``), so a
checkpoint never holds a step whose rows a crash could lose, and keeps the run
id in the checkpoint (``checkpoint["callbacks"]``).
"""

from __future__ import annotations

import json
import logging
from argparse import Namespace
from typing import Any, Mapping

from lightning.fabric.loggers.logger import _DummyExperiment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers.logger import Logger

import tracker
from tracker.errors import ConfigError

log = logging.getLogger(__name__)

STATUS = {"success": "finished", "failed": "crashed", "finished": "killed"}
EMBEDDINGS_ATTR = "tracker_embeddings"
CLASS_LOSSES_ATTR = "tracker_class_losses"


def _jsonable(params: Mapping[str, Any]) -> dict[str, Any]:
    """Hyperparameters as JSON values (anything else as its str)."""
    return json.loads(json.dumps(dict(params), default=str))


class TrackerLogger(Logger):
    """Lightning logger writing into a tracker run (see the module doc)."""

    def __init__(
        self,
        project: str = "lightning",
        name: str | None = None,
        *,
        run_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        tags: tuple[str, ...] | list[str] = (),
        resume: str = "never",
        resume_step: int | None = None,
        **init_kwargs: Any,
    ) -> None:
        super().__init__()
        if resume not in ("never", "allow", "must"):
            raise ConfigError(f"resume={resume!r} is not one of never, allow, must")
        self._project, self._name, self._run_id = project, name, run_id
        self._config = dict(config or {})
        self._tags, self._resume, self._resume_step = list(tags), resume, resume_step
        self._init_kwargs = init_kwargs
        self._hparams: dict[str, Any] = {}
        self._run: tracker.Run | None = None
        self._status: str | None = None

    # -- the run -----------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """True while the run waits for a checkpoint's step to resume at."""
        return self._run is None and self._resume != "never" and self._resume_step is None

    def resume_at(self, step: int) -> None:
        """Resume the run at ``step`` (the callback calls this with the checkpoint's step)."""
        if self._run is None:
            self._resume_step = int(step)

    def start(self, first_step: int | None = None) -> tracker.Run:
        """The run, started on first use (``first_step``: where a pending resume starts)."""
        if self._run is None:
            step = self._resume_step if self._resume_step is not None else first_step
            resume_step = step if self._resume != "never" and step is not None else None
            try:
                self._run = self._init(resume_step)
            except ConfigError:
                if resume_step is None or self._exists():
                    raise
                self._run = self._init(None)  # resume="allow" of a run that does not exist yet: a new one
            self._run_id = self._run.run_id
        return self._run

    def _init(self, resume_step: int | None) -> tracker.Run:
        return tracker.init(self._project, name=self._name, config={**self._config, **self._hparams},
                            tags=self._tags, run_id=self._run_id, resume=self._resume, resume_step=resume_step,
                            **self._init_kwargs)

    def _exists(self) -> bool:
        from tracker.spool import home_dir, run_dir

        home = self._init_kwargs.get("home")
        return self._run_id is not None and (run_dir(home_dir(home), self._run_id) / "run.json").exists()

    @property
    def run(self) -> tracker.Run | None:
        """The run of this rank (None before it started)."""
        return self._run

    # -- Lightning's Logger API ----------------------------------------------------------
    @property
    def name(self) -> str:
        """The project (Lightning's experiment name)."""
        return self._project

    @property
    def version(self) -> str:
        """The run id (starts the run when no ``run_id`` was given)."""
        if self._run_id is None:
            self.start()
        assert self._run_id is not None
        return self._run_id

    @property
    def experiment(self) -> Any:
        """The :class:`tracker.Run` on rank zero, Lightning's dummy experiment on the other ranks."""
        if not self.pending:
            self.start()
        if rank_zero_only.rank > 0:
            return _DummyExperiment()
        return self._run if self._run is not None else _DummyExperiment()

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        """Record the hyperparameters in the run's config (rank zero)."""
        values = vars(params) if isinstance(params, Namespace) else dict(params or {})
        self._hparams.update(_jsonable(values))
        if self._run is not None:
            self._run.config.update(self._hparams)
            meta = getattr(self._run, "_meta", None)
            if meta is not None:
                meta.update(config=self._run.config)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Log ``metrics`` at ``step`` into this rank's segment of the run."""
        run = self.start(first_step=step)
        values = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) or hasattr(v, "item")}
        if values:
            run.log(values, step=step)

    def save(self) -> None:
        """Nothing: the run's flusher writes in the background."""

    def finalize(self, status: str) -> None:
        """Finish the run with the tracker status of Lightning's ``status``."""
        if self._run is not None:
            self._run.finish(STATUS.get(status, "finished"))
        self._status = status


def _exposed(module: Any, attr: str) -> Mapping[str, Any] | None:
    """What ``module.<attr>`` gives (a method is called); an attribute is cleared once read."""
    value = getattr(module, attr, None)
    if value is None:
        return None
    if callable(value):
        value = value()
    else:
        setattr(module, attr, None)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{type(module).__name__}.{attr} is {type(value).__name__}; expected a mapping "
                          "{key: tensor}")
    return value


class TrackerCallback(Callback):
    """Logs the module's embeddings and per-class losses; flushes before checkpoints (see the module doc)."""

    def __init__(self, every_n_steps: int = 1, embeddings: str = EMBEDDINGS_ATTR,
                 class_losses: str = CLASS_LOSSES_ATTR, **embedding_options: Any) -> None:
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ConfigError(f"every_n_steps is {every_n_steps!r}; expected an int >= 1")
        self.every_n_steps = every_n_steps
        self.embeddings_attr, self.class_losses_attr = embeddings, class_losses
        self.embedding_options = embedding_options

    @staticmethod
    def logger_of(trainer: Any) -> TrackerLogger:
        """The trainer's TrackerLogger."""
        for logger in trainer.loggers:
            if isinstance(logger, TrackerLogger):
                return logger
        raise ConfigError("TrackerCallback needs a TrackerLogger: Trainer(logger=TrackerLogger(...), "
                          "callbacks=[TrackerCallback()])")

    @staticmethod
    def step_of(trainer: Any) -> int:
        """The step Lightning logs this batch's metrics at (batches that stepped so far)."""
        loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        return int(getattr(loop, "_batches_that_stepped", trainer.global_step))

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Check that a TrackerLogger is there."""
        self.logger_of(trainer)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Log what the module exposes, every ``every_n_steps`` batches."""
        step = self.step_of(trainer)
        embeddings = _exposed(pl_module, self.embeddings_attr)
        class_losses = _exposed(pl_module, self.class_losses_attr)
        if step % self.every_n_steps or not (embeddings or class_losses):
            return
        run = self.logger_of(trainer).start(first_step=step)
        for key, z in (embeddings or {}).items():
            run.log_embeddings(key, z, step=step, **self.embedding_options)
        for key, values in (class_losses or {}).items():
            run.log_classes(key, values, step=step)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Flush the run before the checkpoint is written."""
        run = self.logger_of(trainer).run
        if run is not None:
            run.flush()

    def state_dict(self) -> dict[str, Any]:
        """The run this training logs into (kept in checkpoints)."""
        logger = getattr(self, "_logger", None)
        return {"run_id": logger._run_id} if logger is not None else {}

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Remember the logger for ``state_dict``."""
        self._logger = self.logger_of(trainer)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        """Start a pending resume at the step this batch logs at (the checkpoint is restored by now)."""
        logger = self.logger_of(trainer)
        if logger.pending:
            logger.resume_at(self.step_of(trainer))
            logger.start()
