"""The store behind one interface.

* :mod:`tracker.store.local`: one DuckDB file under ``TRACKER_HOME`` (the default);
* :mod:`tracker.store.lake`: DuckLake, catalog in PostgreSQL and Parquet files on
  shared storage, selected by ``TRACKER_STORE="ducklake:postgres:..."`` and
  ``TRACKER_DATA_PATH`` (:mod:`tracker.store.settings`).

``Store(home)`` is the selected backend's store. Every public name is re-exported
here, lazily, so ``import tracker.store`` stays cheap until a name is used.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Sequence

_NAMES = {
    **dict.fromkeys(("_MIGRATED", "_PROCESS_LOCK", "_READERS", "DB_NAME", "IngestReport", "Store", "open_store",
                     "release"), "tracker.store.local"),
    **dict.fromkeys(("META_TABLES", "STALE_HEARTBEAT_S", "spool_meta"), "tracker.store.spoolmeta"),
    "inline_params": "tracker.store.sqltext",
    "LakeStore": "tracker.store.lake",
}

__all__ = sorted({*(n for n in _NAMES if not n.startswith("_")), "query"})


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'tracker.store' has no attribute {name!r}")


def query(
    sql: str,
    params: Sequence[Any] | dict[str, Any] | None = None,
    home: str | os.PathLike[str] | None = None,
    snapshot: int | None = None,
) -> Any:
    """Run SQL over the store (stored rows and rows still in spool files); returns polars.

    ``snapshot=N`` reads the lake as of its snapshot N (DuckLake time travel), so a
    report can be reproduced exactly; it needs a lake store.
    """
    from tracker.errors import ConfigError
    from tracker.store.local import Store

    store = Store(home)
    if snapshot is None:
        return store.query(sql, params)
    if not hasattr(store, "snapshots"):
        raise ConfigError(
            f"snapshot={snapshot!r} needs the lake store (time travel); the local DuckDB file keeps no "
            "snapshots: set TRACKER_STORE='ducklake:postgres:...' or drop snapshot"
        )
    return store.query(sql, params, snapshot=snapshot)
