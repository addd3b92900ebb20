"""``track(model, on_error=...)``: act on an error-severity event of the tracked run.

* ``"stop"``: stop training cleanly through the trainer's own flag (``trainer.stop``,
  which Ultralytics 8.4 reads after each batch): it ends the epoch early, validates,
  saves ``last.pt`` (the run's rows flushed first, as for every checkpoint) and runs
  its end-of-training steps; the run records a ``training_stopped`` event.
* ``"checkpoint"``: save a checkpoint now, as ``weights/on_error.pt`` beside
  ``last.pt`` (the same content Ultralytics writes; ``last.pt`` and ``best.pt`` are
  left as they are, so a resume is not thrown off), and go on training. Once per
  training.

The event arrives on the run's notifier thread (:meth:`tracker.run.Run.on_event`);
the action itself runs on the training thread, at the end of the next batch.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path
from typing import Any

from tracker.errors import ConfigError
from tracker.events import Event

log = logging.getLogger(__name__)

ACTIONS = ("stop", "checkpoint")


def check_on_error(on_error: Any) -> str | None:
    """``on_error`` if valid (None, ``"stop"``, ``"checkpoint"``), else ConfigError."""
    if on_error is None or on_error in ACTIONS:
        return on_error
    raise ConfigError(f"on_error is {on_error!r}; expected None, 'stop' or 'checkpoint'")


class ErrorAction:
    """Watches a run's events and acts on the first error-severity one."""

    def __init__(self, run: Any, mode: str) -> None:
        self.run, self.mode = run, mode
        self.pending: Event | None = None
        self.done = False
        self._lock = threading.Lock()
        run.on_event(self.on_event)

    def on_event(self, ev: Event) -> None:
        """The notifier thread: remember the first error."""
        if ev.severity == "error" and ev.kind != "training_stopped":
            with self._lock:
                if self.pending is None and not self.done:
                    self.pending = ev

    def on_batch_end(self, trainer: Any) -> None:
        """The training thread: act, once."""
        with self._lock:
            ev, self.pending = self.pending, None
            if ev is None or self.done:
                return
            self.done = True
        where = f"{ev.kind}" + (f" on {ev.key}" if ev.key else "") + f" at step {ev.step}"
        if self.mode == "stop":
            trainer.stop = True
            msg = f"training stopped by on_error='stop' after {where}: {ev.message}"
            self.run.event("training_stopped", msg, severity="info",
                           data={"cause": ev.kind, "cause_step": ev.step, "epoch": int(trainer.epoch)})
            log.warning("tracker: %s; Ultralytics validates and saves last.pt before it ends", msg)
            return
        path = self.checkpoint(trainer)
        self.run.event("checkpoint_saved", f"checkpoint {path} saved by on_error='checkpoint' after {where}",
                       severity="info", data={"cause": ev.kind, "cause_step": ev.step, "path": str(path)})
        log.warning("tracker: on_error='checkpoint' saved %s after %s", path, where)

    def checkpoint(self, trainer: Any) -> Path:
        """Write Ultralytics' checkpoint to ``weights/on_error.pt``, keeping last.pt and best.pt."""
        wdir = Path(trainer.wdir)
        wdir.mkdir(parents=True, exist_ok=True)
        keep = {p: p.with_name(p.name + ".keep") for p in (Path(trainer.last), Path(trainer.best)) if p.exists()}
        for p, kept in keep.items():
            shutil.copy2(p, kept)
        target = wdir / "on_error.pt"
        period = trainer.save_period
        try:
            trainer.save_period = -1  # no epochN.pt for this one
            trainer.save_model()  # the tracked save: the run's rows are flushed first
            Path(trainer.last).replace(target)
            if Path(trainer.best).exists() and Path(trainer.best) not in keep:
                Path(trainer.best).unlink()  # written only because best_fitness == fitness mid-epoch
        finally:
            trainer.save_period = period
            for p, kept in keep.items():
                kept.replace(p)
        return target
