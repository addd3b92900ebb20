"""The example's sampler, logger, detector and web UI panel.

* ``shuffled`` (sampler): a seeded shuffle of ``num_images`` indices, sharded across
  ranks by :class:`tracker.sampling.ShardedSampler` (same order on every rank).
* ``jsonl`` (logger): one JSON line per logged scalar in
  ``<run folder>/example-r<rank>.jsonl`` (or under ``$TRACKER_EXAMPLE_JSONL_DIR``),
  then a line with the final status.
* ``loss_ceiling`` (detector): a warning event when a value rises above ``ceiling``
  (once per episode above it).
* ``example`` (panel): a web UI page listing the ``loss_ceiling`` events.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tracker.analysis.detectors import Chunk, DetectorSpec, StreamContext
from tracker.analysis.params import Param
from tracker.errors import ConfigError
from tracker.events import Event
from tracker.loggers import Batch
from tracker.sampling import SamplerFactory, ShardedSampler

if TYPE_CHECKING:  # pragma: no cover
    import polars as pl

    from tracker.run import Run


class ShuffledSampler(ShardedSampler):
    """A seeded permutation of ``range(num_images)`` per epoch, sharded across ranks."""

    name = "shuffled"

    def __init__(self, num_images: int, seed: int = 0, rank: int | None = None, world_size: int | None = None,
                 drop_last: bool = False) -> None:
        super().__init__(seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        if isinstance(num_images, bool) or not isinstance(num_images, int) or num_images < 0:
            raise ConfigError(f"sampler 'shuffled': num_images is {num_images!r}; expected an integer >= 0")
        self.num_images = num_images

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        return rng.permutation(self.num_images)


SAMPLER = SamplerFactory("shuffled", ShuffledSampler, "a seeded shuffle, sharded across ranks")


def jsonl_path(run: "Run") -> Path:
    """Where the ``jsonl`` logger writes the rows of ``run``'s rank."""
    base = os.environ.get("TRACKER_EXAMPLE_JSONL_DIR")
    folder = Path(base) / run.run_id if base else Path(run.home) / "runs" / run.run_id
    return folder / f"example-r{run.rank}.jsonl"


class JsonlSession:
    """One run's open file; called on the run's flusher thread, never the training thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("a", encoding="utf-8")

    def write(self, batch: Batch) -> None:
        """Append the batch's scalar rows."""
        if batch.metrics is not None:
            for row in batch.metrics.select(["step", "key", "value"]).to_pylist():
                self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def close(self, status: str) -> None:
        """Write the final status and close the file."""
        self.file.write(json.dumps({"status": status}) + "\n")
        self.file.close()


@dataclass(frozen=True)
class JsonlLogger:
    """The ``jsonl`` logger: ``tracker.init(..., loggers=["store", "jsonl"])``."""

    name: str = "jsonl"
    description: str = "one JSON line per logged scalar, in the run's folder"

    def open(self, run: "Run") -> JsonlSession:
        """Open the run's file (called once, in ``tracker.init``)."""
        return JsonlSession(jsonl_path(run))


CEILING = Param("ceiling", 100.0, "a finite value above this is reported", minimum=0.0)


class CeilingStream:
    """One key's stream: an event when the value first rises above the ceiling, once per episode."""

    def __init__(self, ctx: StreamContext) -> None:
        self.key = ctx.key
        self.ceiling = float(ctx.params["ceiling"])
        self.above = False
        self.points_above = 0

    def feed(self, chunk: Chunk) -> list[Event]:
        """Events for the episodes above the ceiling that start in ``chunk`` (same for any chunking)."""
        over = chunk.finite & (chunk.values > self.ceiling)
        if not over.size:
            return []
        before = np.concatenate(([self.above], over[:-1]))
        events = []
        for i in np.flatnonzero(over & ~before):
            step, value = int(chunk.steps[i]), float(chunk.values[i])
            events.append(Event(
                step=step, kind="loss_ceiling", key=self.key, severity="warning",
                message=f"{self.key} is {value:.4g} at step {step}, above the ceiling {self.ceiling:g}",
                data={"value": value, "ceiling": self.ceiling},
            ))
        self.above = bool(over[-1])
        self.points_above += int(over.sum())
        return events

    def summary(self) -> dict[str, Any]:
        """What ``tracker analyze`` reports for this key."""
        return {"points_above_ceiling": self.points_above}


DETECTOR = DetectorSpec("loss_ceiling", "scalar", CeilingStream, (CEILING,), "a value above a fixed ceiling")


def ceiling_events() -> "pl.DataFrame":
    """Every ``loss_ceiling`` event in the store (what the panel shows)."""
    import tracker

    return tracker.query(
        "SELECT run_id, step, key, message FROM events WHERE kind = 'loss_ceiling' ORDER BY run_id, step"
    )


@dataclass(frozen=True)
class CeilingPanel:
    """The ``example`` page of the web UI (``render`` runs inside Streamlit)."""

    name: str = "example"
    title: str = "Loss ceiling"

    def render(self) -> None:
        """Draw the page; Streamlit is imported here, never when the plugin loads."""
        import streamlit as st

        st.header(self.title)
        events = ceiling_events()
        if events.is_empty():
            st.info("No value has risen above its ceiling.")
        else:
            st.dataframe(events, hide_index=True)


PANEL = CeilingPanel()
