"""What every store does: the interface that callers see, whatever the backend.

Two backends implement it (chosen in one place, :func:`tracker.store.open_store`):
:class:`tracker.store.local.LocalStore` (one DuckDB file) and
:class:`tracker.store.lake.LakeStore` (DuckLake). Both hold the spool of this host's
live runs under ``home`` and share what they do with it through
:class:`tracker.store.spoolstore.SpoolStore`.

A caller never asks which backend it has: a capability one backend lacks answers
with a :class:`tracker.errors.ConfigError` that says how to get it (``snapshot=`` on
the local store, for one).

``Store(home)`` is kept as a shorthand for ``open_store(home)``, for callers written
when ``Store`` was the store class; the name is also the type to annotate with.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import duckdb
    import polars as pl

    from tracker.events import Event

_RELEASERS: list[Callable[[], None]] = []
_SHUTDOWNS: list[Callable[[], None]] = []
_RELEASERS_LOCK = threading.Lock()


@dataclass
class IngestReport:
    """What one :meth:`Store.ingest` did."""

    files: int = 0
    rows: int = 0
    corrupt: int = 0
    skipped_locked: bool = False


def on_release(release: Callable[[], None]) -> Callable[[], None]:
    """Register a backend's ``release`` (close its cached connections); called by :func:`release_all`."""
    with _RELEASERS_LOCK:
        if release not in _RELEASERS:
            _RELEASERS.append(release)
    return release


def release_all() -> None:
    """Close every cached connection of this process, of every backend loaded (before another
    tool opens the file, or a test drops its lake)."""
    with _RELEASERS_LOCK:
        found = list(_RELEASERS)
    for release in found:
        release()


def on_shutdown(stop: Callable[[], None]) -> Callable[[], None]:
    """Register a backend's work to stop at interpreter exit (its threads inside DuckDB);
    called by :func:`shutdown_all` after the live runs are finished."""
    with _RELEASERS_LOCK:
        if stop not in _SHUTDOWNS:
            _SHUTDOWNS.append(stop)
    return stop


def shutdown_all() -> None:
    """At interpreter exit: stop what the backends registered (no thread may be inside DuckDB then)."""
    with _RELEASERS_LOCK:
        found = list(_SHUTDOWNS)
    for stop in found:
        stop()


class _Chooser(abc.ABCMeta):
    """``Store(home)`` is ``open_store(home)``; a backend class is built as usual."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is Store:
            from tracker.store import open_store

            return open_store(*args, **kwargs)
        return super().__call__(*args, **kwargs)


class Store(metaclass=_Chooser):
    """The store under ``home`` (see the module doc)."""

    home: Path

    @abc.abstractmethod
    def ingest(self, timeout: float | None = None) -> IngestReport:
        """Move the spool's pending rows into the store (idempotent, crash-safe)."""

    @abc.abstractmethod
    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None,
              snapshot: int | None = None) -> pl.DataFrame:
        """Run ``sql`` over everything logged so far (stored rows and rows still in the spool);
        ``snapshot=N`` reads the store as of its snapshot N where the backend keeps snapshots."""

    @abc.abstractmethod
    def reader(self, safe: bool = False, memory_limit: str | None = None
               ) -> contextlib.AbstractContextManager[duckdb.DuckDBPyConnection]:
        """A read-only connection whose tables and views include the spool's rows
        (``safe``: sandboxed for user-typed SQL, with DuckDB's ``memory_limit`` when given)."""

    @abc.abstractmethod
    def connect(self, write: bool = False, timeout: float | None = None
                ) -> contextlib.AbstractContextManager[duckdb.DuckDBPyConnection]:
        """A short connection to the stored tables; read-only unless ``write``."""

    @abc.abstractmethod
    def add_events(self, run_id: str, events: Sequence[Event], rank: int = 0, segment: int | None = None) -> int:
        """Insert events for a run (offline analysis); returns how many."""

    @abc.abstractmethod
    def set_status(self, run_id: str, status: str) -> None:
        """Set a run's status in its spool metadata (if here) and in the store."""

    @abc.abstractmethod
    def delete_run(self, run_id: str) -> int:
        """Remove a run everywhere (tables and spool folder); returns the rows removed."""

    def runs(self) -> pl.DataFrame:
        """Every run's row of the ``runs`` table, oldest first."""
        return self.query("SELECT * FROM runs ORDER BY created_at, run_id")

    def prepare_run(self, run_id: str, rank: int, resume: str) -> None:
        """What the backend does before a run's first file is written (``tracker.init``):
        nothing by default."""

    def snapshots(self) -> pl.DataFrame:
        """The store's snapshots (id, time, changes), where the backend keeps them."""
        from tracker.errors import ConfigError

        raise ConfigError(
            "snapshots need the lake store (time travel); the local DuckDB file keeps no "
            "snapshots: set TRACKER_STORE='ducklake:postgres:...'"
        )

    def release(self) -> None:
        """Close this process's cached connections (:func:`release_all`)."""
        release_all()

