"""How the lake store reaches DuckLake: the extensions LOADed from the pinned
``duckdb-extension-*`` wheels (auto-install and auto-load off: nothing is downloaded),
and what a failure means (an unreachable catalog, a refused login, a commit conflict)."""

from __future__ import annotations

import importlib
from pathlib import Path

import duckdb

from tracker.errors import StoreError, StoreUnavailableError
from tracker.store.settings import LakeSetting

EXTENSIONS = (("postgres_scanner", "postgres_scanner"), ("ducklake", "ducklake"))
MAX_RETRY_COUNT = 100

_UNAVAILABLE = ("connection refused", "could not connect", "timeout expired", "server closed the connection",
                "could not translate host name", "no route to host", "connection timed out",
                "the database system is starting up", "the database system is shutting down",
                "terminating connection", "connection to server", "ssl syscall", "broken pipe",
                "no connection to the server", "connection reset")
_CONFLICT = ("conflict", "duplicate key value violates unique constraint")


def extension_file(package: str, name: str, version: str) -> Path:
    """The extension file shipped in the ``duckdb-extension-<package>`` wheel for ``version``."""
    try:
        mod = importlib.import_module(f"duckdb_extension_{package}")
    except ImportError:
        raise StoreError(
            f"the DuckDB extension {name!r} is not installed; install the cluster extra "
            f"(pip install 'tracker[cluster]'), which pins duckdb-extension-{package.replace('_', '-')}"
        ) from None
    path = Path(str(mod.__file__)).parent / "extensions" / version / f"{name}.duckdb_extension"
    if not path.is_file():
        raise StoreError(
            f"{path} is missing: duckdb-extension-{package.replace('_', '-')} does not match DuckDB {version}; "
            "install the versions pinned in the cluster extra"
        )
    return path


def offline_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with ducklake and postgres_scanner loaded from the wheels, no downloads."""
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    try:
        version = con.execute("PRAGMA version").fetchone()[0]
        for package, name in EXTENSIONS:
            con.execute(f"LOAD '{extension_file(package, name, version)}'")
        con.execute(f"SET ducklake_max_retry_count = {MAX_RETRY_COUNT}")
        con.execute("SET ducklake_retry_wait_ms = 20")
    except Exception:
        con.close()
        raise
    return con


def classify(setting: LakeSetting, exc: BaseException) -> StoreError:
    """A masked StoreError for ``exc``: StoreUnavailableError when the server is out of reach."""
    msg = setting.scrub(str(exc)).replace("\n", " ").replace("\t", " ").strip()
    detail = msg.rsplit('": ', 1)[-1][:300]  # libpq's own words, after the echoed connection string
    low = msg.lower()
    if "password authentication failed" in low or "authentication failed" in low or "does not exist" in low \
            and ("database" in low or "role" in low):
        return StoreError(
            f"the lake's catalog refused the connection of TRACKER_STORE={setting.masked()!r}: {detail}; "
            "check user, password and dbname"
        )
    if "creating a new ducklake is explicitly disabled" in low:
        return StoreError(
            f"the lake {setting.masked()} has no catalog yet; run `tracker lake init` (or log a run) first"
        )
    if "permission denied" in low:
        start = low.find("permission denied")
        return StoreError(
            f"the role of TRACKER_STORE={setting.masked()!r} may not write to the lake "
            f"({msg[start:start + 120]}); use a role with write grants for this command"
        )
    if any(s in low for s in _UNAVAILABLE):
        return StoreUnavailableError(
            f"the lake's catalog ({setting.masked()}) cannot be reached: {detail}; "
            "rows stay in the local spool and are committed when it is back"
        )
    return StoreError(f"lake {setting.masked()}: {msg[:500]}")


def is_conflict(exc: BaseException) -> bool:
    """Two committers raced (DuckLake's own conflict check, or the snapshot id taken twice)."""
    low = str(exc).lower()
    return "permission denied" not in low and any(s in low for s in _CONFLICT)
