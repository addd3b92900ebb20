"""Runs of a dead host, notified once from any other host: the lake's half of :mod:`tracker.notify.recovery`.

A host that dies leaves its runs ``running`` in the lake with a heartbeat
(``runs.updated_at``) that no longer moves; readers show them ``crashed`` once it is older
than :func:`tracker.store.lake.stale_after_s`. Their spool and their outbox died with the
host, so the O_EXCL marker files of the local rule cannot elect a sender. Here:

* :func:`crashed_segments` lists, for each such run, the newest segment of each rank not
  ended in the lake;
* :func:`claim` elects the one process that notifies a (run, rank, segment) across all
  hosts: a row in ``tracker_crash_claims``, a small table in the lake's catalog database
  (PostgreSQL), written with ``INSERT ... ON CONFLICT DO NOTHING`` through DuckDB's
  postgres extension (``postgres_execute``), then read back: the process whose token is
  in the row won;
* :func:`check_lake` queues one ``run_crashed`` message per claimed segment, to the
  watch's own targets (the dead host's targets are not in the lake: they are never part
  of a run's config), in an outbox of this host's spool, ``<home>/lake-crashes/``, and
  sends it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tracker import spool
from tracker.notify import outbox
from tracker.notify.config import NotifyConfig, to_json

log = logging.getLogger(__name__)

TABLE = "tracker_crash_claims"
_ALIAS = "tracker_catalog"
_DDL = (f"CREATE TABLE IF NOT EXISTS {TABLE} (run_id text NOT NULL, rank integer NOT NULL, "
        "segment integer NOT NULL, claimed_by text NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now(), "
        "PRIMARY KEY (run_id, rank, segment))")
_READY: set[str] = set()  # catalogs whose claims table exists
_DECIDED: set[tuple[str, str, int, int]] = set()  # (lake, run, rank, segment) this process claimed or lost


def outbox_home(home: Path) -> Path:
    """Where a host keeps the messages it queued for runs of other hosts (a spool of its own)."""
    return Path(home) / "lake-crashes"


def _pg(text: str) -> str:
    """``text`` as a PostgreSQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _duck(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@contextlib.contextmanager
def _catalog(setting: Any) -> Any:
    """A DuckDB connection with the lake's catalog database attached as a PostgreSQL database."""
    from tracker.store.lakeconn import classify, offline_connection

    con = offline_connection()
    info = setting.conninfo if "connect_timeout" in setting.params else f"{setting.conninfo} connect_timeout=3"
    try:
        import duckdb

        try:
            con.execute(f"ATTACH {_duck(info)} AS {_ALIAS} (TYPE postgres)")
            if setting.key() not in _READY:
                for attempt in range(5):  # two hosts creating it at once: PostgreSQL may refuse one
                    try:
                        con.execute(f"CALL postgres_execute('{_ALIAS}', {_duck(_DDL)})")
                        break
                    except duckdb.Error as exc:
                        if attempt == 4 or "duplicate key" not in str(exc).lower():
                            raise
                        time.sleep(0.05 * (attempt + 1))
                _READY.add(setting.key())
        except duckdb.Error as exc:
            raise classify(setting, exc) from None
        yield con
    finally:
        con.close()


def claim(setting: Any, run_id: str, rank: int, segment: int) -> bool:
    """Claim the notification of (run, rank, segment) for this process; False when another has it.

    Atomic across hosts: PostgreSQL's primary key lets one INSERT in; every other one does
    nothing, and reading the row back tells each process whether its token is there."""
    with _catalog(setting) as con:
        return _claim(con, run_id, rank, segment)


def _claim(con: Any, run_id: str, rank: int, segment: int) -> bool:
    token = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:12]}"
    where = f"run_id = {_pg(run_id)} AND rank = {int(rank)} AND segment = {int(segment)}"
    insert = (f"INSERT INTO {TABLE} (run_id, rank, segment, claimed_by) VALUES "
              f"({_pg(run_id)}, {int(rank)}, {int(segment)}, {_pg(token)}) ON CONFLICT DO NOTHING")
    con.execute(f"CALL postgres_execute('{_ALIAS}', {_duck(insert)})")
    row = con.execute(f"SELECT claimed_by FROM postgres_query('{_ALIAS}', "
                      f"{_duck(f'SELECT claimed_by FROM {TABLE} WHERE {where}')})").fetchone()
    return row is not None and row[0] == token


def crashed_segments(home: Path, since: float) -> list[dict[str, Any]]:
    """Segments of runs the lake reads ``crashed`` by the heartbeat rule while their row says
    ``running``, whose heartbeat stopped at ``since`` or later: the newest of each rank, not ended."""
    from tracker.store.lake import LakeStore, stale_after_s

    def stamp(t: float) -> str:
        return datetime.fromtimestamp(t, tz=timezone.utc).replace(tzinfo=None).isoformat(" ")

    sql = ("SELECT r.run_id, r.project, r.name, r.host, epoch(r.updated_at) AS heartbeat, s.rank, s.segment, "
           "s.start_step, s.end_step, epoch(s.started_at) AS started_at, s.reason "
           "FROM lake.main.runs r JOIN lake.main.segments s ON s.run_id = r.run_id "
           f"WHERE r.status = 'running' AND r.updated_at < TIMESTAMP '{stamp(time.time() - stale_after_s())}' "
           f"AND r.updated_at >= TIMESTAMP '{stamp(since)}' "
           "QUALIFY s.ended_at IS NULL AND s.segment = max(s.segment) OVER (PARTITION BY s.run_id, s.rank) "
           "ORDER BY r.run_id, s.rank, s.segment")
    return LakeStore(home).query(sql).to_dicts()


def check_lake(home: Path, setting: Any, fallback: NotifyConfig, since: float) -> list[str]:
    """Claim and queue a ``run_crashed`` message for each crashed segment :func:`crashed_segments`
    finds; returns the runs queued (their outboxes are under :func:`outbox_home`). A segment is
    claimed once per process: a later check skips it, whoever won."""
    queued: list[str] = []
    base = outbox_home(home)
    rows = [r for r in crashed_segments(home, since)
            if (setting.key(), r["run_id"], r["rank"], r["segment"]) not in _DECIDED]
    if not rows:
        return queued
    with _catalog(setting) as con:
        for row in rows:
            _DECIDED.add((setting.key(), row["run_id"], row["rank"], row["segment"]))
            if _claim(con, row["run_id"], row["rank"], row["segment"]):
                _queue(base, row, fallback)
                queued.append(row["run_id"])
            # else another process, on this host or another, notifies it
    return queued


def _queue(base: Path, row: dict[str, Any], fallback: NotifyConfig) -> None:
    """Queue the ``run_crashed`` message of a lake row in the outbox under ``base``."""
    from tracker.notify.recovery import _queue_crash
    from tracker.store.lake import stale_after_s

    meta = {"run_id": row["run_id"], "project": row["project"], "name": row["name"], "host": row["host"]}
    seg = spool.SegmentInfo(run_id=row["run_id"], rank=int(row["rank"]), segment=int(row["segment"]),
                            start_step=int(row["start_step"] or 0), reason=str(row["reason"] or ""),
                            started_at=float(row["started_at"] or 0.0), last_step=row["end_step"],
                            heartbeat=float(row["heartbeat"]), pid=0)
    outbox.save_config(base, row["run_id"], to_json(fallback))
    _queue_crash(base, meta, seg, fallback, stale_after_s())


def claim_local(run_id: str, rank: int, segment: int) -> bool:
    """For the local rule: when the store is a lake, also take the lake's claim, so a crash seen
    both on its own host and from the lake is sent once; True when there is no lake or it is out
    of reach (better twice than never)."""
    from tracker.store.settings import current

    setting = current()
    if setting is None:
        return True
    try:
        return claim(setting, run_id, rank, segment)
    except Exception as exc:
        log.warning("tracker: the lake's crash claims cannot be reached (%s); notifying run %s anyway",
                    setting.scrub(str(exc))[:200], run_id)
        return True
