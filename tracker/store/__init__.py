"""The store behind one interface.

``local`` is one DuckDB file under ``TRACKER_HOME`` (the default). Every public
name of the store is re-exported here, so ``from tracker.store import Store``
keeps working whichever backend module defines it.
"""

from __future__ import annotations

from tracker.store.local import (
    _MIGRATED,
    _PROCESS_LOCK,
    _READERS,
    DB_NAME,
    META_TABLES,
    STALE_HEARTBEAT_S,
    IngestReport,
    Store,
    inline_params,
    open_store,
    query,
    release,
    spool_meta,
)

__all__ = [
    "DB_NAME",
    "META_TABLES",
    "STALE_HEARTBEAT_S",
    "IngestReport",
    "Store",
    "inline_params",
    "open_store",
    "query",
    "release",
    "spool_meta",
]
