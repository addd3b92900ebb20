"""Typing protocols for the objects that low modules are handed but must not import.

:class:`RunLike` is what hook implementations, logger sessions and the run's
metadata writer read from a run. :class:`tracker.run.Run` satisfies it; modules
below the run in the import layers (:mod:`tracker.hookspecs`, :mod:`tracker.loggers`,
:mod:`tracker.runmeta`) type against this protocol instead of importing the run, so
the run can import them without a circle. It names only what those callers use:
add a member here when a hook or logger needs one more, not before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol


class RunLike(Protocol):
    """What a hook, a logger or the metadata writer reads from a run (one rank of it)."""

    project: str
    name: str
    run_id: str
    config: dict[str, Any]
    tags: list[str]
    home: Path
    rank: int
    world_size: int
    segment: int
    start_step: int
    reason: str
    meta: dict[str, Any]
    logger_timeout: float

    @property
    def step(self) -> int | None:
        """The last step logged in this process (None before the first log)."""
        ...

    def log(self, mapping: Mapping[str, Any], step: int | None = None) -> None:
        """Log scalar values at ``step`` (see :meth:`tracker.run.Run.log`)."""
        ...
