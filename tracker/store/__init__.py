"""The store behind one interface (:class:`tracker.store.base.Store`), chosen in one place.

* :mod:`tracker.store.local`: one DuckDB file under ``TRACKER_HOME`` (the default);
* :mod:`tracker.store.lake`: DuckLake, catalog in PostgreSQL and Parquet files on
  shared storage, selected by ``TRACKER_STORE="ducklake:postgres:..."`` and
  ``TRACKER_DATA_PATH`` (:mod:`tracker.store.settings`).

:func:`open_store` is the one place that chooses the backend; ``Store(home)`` is the
same call, kept for callers written before. Every public name is re-exported here,
lazily, so ``import tracker.store`` stays cheap until a name is used (a training
process on the local store never loads DuckDB).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any, Sequence

from tracker.store.base import IngestReport, Store, release_all

if TYPE_CHECKING:  # pragma: no cover
    from tracker.store.settings import LakeSetting

_NAMES = {
    **dict.fromkeys(("_MIGRATED", "_PROCESS_LOCK", "_READERS", "LocalStore"), "tracker.store.local"),
    **dict.fromkeys(("DB_NAME", "SpoolStore"), "tracker.store.spoolstore"),
    **dict.fromkeys(("META_TABLES", "STALE_HEARTBEAT_S", "spool_meta"), "tracker.store.spoolmeta"),
    "inline_params": "tracker.store.sqltext",
    "LakeStore": "tracker.store.lake",
}

__all__ = sorted({*(n for n in _NAMES if not n.startswith("_")), "IngestReport", "Store", "open_store", "prepare_run",
                  "query", "release"})

_SELECTED: Any = object()  # open_store's default: the setting of this process (tracker.store.settings.current)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'tracker.store' has no attribute {name!r}")


def _setting(setting: Any) -> LakeSetting | None:
    if setting is _SELECTED:
        from tracker.store.settings import current

        return current()
    return setting


def open_store(home: str | os.PathLike[str] | None = None, setting: LakeSetting | None = _SELECTED) -> Store:
    """The store under ``home`` (default ``$TRACKER_HOME`` or ``./.tracker``): the lake of
    ``setting`` (default: the one this process selected, ``TRACKER_STORE``), else the local
    DuckDB file. The one place that chooses the backend."""
    found = _setting(setting)
    if found is None:
        from tracker.store.local import LocalStore

        return LocalStore(home)
    from tracker.store.lake import LakeStore

    return LakeStore(home, found)


def prepare_run(home: str | os.PathLike[str] | None, run_id: str, rank: int, resume: str) -> None:
    """The selected backend prepares run ``run_id`` before its first file is written
    (``tracker.init``): ``open_store(home).prepare_run(...)``. The local store's does
    nothing, so without a lake no store is opened (a training process never loads DuckDB)."""
    found = _setting(_SELECTED)
    if found is not None:
        open_store(home, found).prepare_run(run_id, rank, resume)


def release() -> None:
    """Close this process's idle cached connections of every backend now (before another
    tool opens the file, or a lake is dropped)."""
    release_all()


def query(
    sql: str,
    params: Sequence[Any] | dict[str, Any] | None = None,
    home: str | os.PathLike[str] | None = None,
    snapshot: int | None = None,
) -> Any:
    """Run SQL over the store (stored rows and rows still in spool files); returns polars.

    ``snapshot=N`` reads the lake as of its snapshot N (DuckLake time travel), so a
    report can be reproduced exactly; it needs a lake store (a ConfigError otherwise).
    """
    store = open_store(home)
    if snapshot is None:
        return store.query(sql, params)
    return store.query(sql, params, snapshot=snapshot)
