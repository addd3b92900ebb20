"""The logger (run sink) interface.

A logger is registered through ``tracker_register_loggers(register)``. It has a
``name`` and ``open(run) -> LoggerSession``; ``open`` is called once per run in
``tracker.init`` (it may do a little I/O, such as writing the run's metadata), and
every other call happens on the run's background flusher thread:

* ``write(batch)`` with the rows logged since the last flush, and
* ``close(status)`` once, after the last ``write``.

A session that raises is reported once and dropped; it never stops the run or the
other loggers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

if TYPE_CHECKING:  # pragma: no cover
    from tracker.run import Run

DEFAULT_LOGGERS = ("store",)


@dataclass
class Batch:
    """Rows logged since the previous flush (Arrow tables in the spool's schemas)."""

    seq: int
    metrics: pa.Table | None
    class_metrics: pa.Table | None
    events: pa.Table | None
    last_step: int | None
    status: str | None = None  # set when the run's status changed in this flush

    @property
    def empty(self) -> bool:
        return self.metrics is None and self.class_metrics is None and self.events is None


class LoggerSession(Protocol):
    def write(self, batch: Batch) -> None: ...

    def close(self, status: str) -> None: ...


class Logger(Protocol):
    name: str

    def open(self, run: "Run") -> LoggerSession: ...
