"""The crash-safe outbox of a run's notifications, in its spool folder, and their delivery.

Layout under ``<home>/runs/<run_id>/notify/``::

    targets.json        the run's targets and rules (specs as written: ``${VAR}`` unexpanded)
    owner.json          host and pid of the process delivering for the run
    out/<id>.json       a message waiting for one target (attempts, next try)
    sent/<id>           sent: an identical event is never sent twice to that target
    failed/<id>.json    given up after TRACKER_NOTIFY_MAX_AGE_S (default one day)

Every file is written by :func:`tracker.spool.atomic_write_json` (temp, fsync, rename).
A message's ``id`` is its idempotency key (a digest of the run, rank, segment, step,
kind, key and text of the event) plus a digest of the target. A failed send is
retried with exponential backoff and jitter (``TRACKER_NOTIFY_RETRY_S``, default 2 s,
doubling up to 5 minutes). Messages left when the process dies are sent by the next
process that opens the store (:func:`recover_soon`), or by ``tracker notify watch``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import socket
import time
from pathlib import Path
from typing import Any, Mapping

from tracker import spool
from tracker.notify.config import NotifyConfig, Target, from_json, mask, parse_target

log = logging.getLogger(__name__)

RETRY_CAP_S = 300.0
_WARNED: set[str] = set()


def _env_float(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, "") or default)
    except ValueError:
        return default
    return value if value >= 0 else default


def retry_base_s() -> float:
    return _env_float("TRACKER_NOTIFY_RETRY_S", 2.0)


def max_age_s() -> float:
    return _env_float("TRACKER_NOTIFY_MAX_AGE_S", 86400.0)


def folder(home: Path, run_id: str) -> Path:
    """The run's notify folder."""
    return spool.run_dir(home, run_id) / "notify"


def idempotency_key(*parts: Any) -> str:
    """A stable digest of ``parts``: the same event gives the same key in any process."""
    return hashlib.blake2b(json.dumps(parts, default=str).encode(), digest_size=12).hexdigest()


def message_id(key: str, target: Target) -> str:
    return f"{key}-{hashlib.blake2b(target.spec.encode(), digest_size=4).hexdigest()}"


def backoff(attempts: int) -> float:
    """Seconds before retry number ``attempts``: exponential, capped, with jitter (half to full)."""
    delay = min(RETRY_CAP_S, retry_base_s() * 2 ** max(attempts - 1, 0))
    return delay / 2 + random.uniform(0, delay / 2)


def save_config(home: Path, run_id: str, raw: Mapping[str, Any]) -> None:
    """Keep the run's targets and rules, and who delivers, for another process."""
    base = folder(home, run_id)
    for sub in ("out", "sent", "failed"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    spool.atomic_write_json(base / "targets.json", dict(raw))
    spool.atomic_write_json(base / "owner.json", {"host": socket.gethostname(), "pid": os.getpid()})


def enqueue(home: Path, run_id: str, key: str, target: Target, message: Mapping[str, Any]) -> Path | None:
    """Write one message for ``target`` into the outbox; None when it is already queued or sent."""
    base = folder(home, run_id)
    mid = message_id(key, target)
    path = base / "out" / f"{mid}.json"
    if (base / "sent" / mid).exists() or path.exists() or (base / "failed" / f"{mid}.json").exists():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    now = time.time()
    spool.atomic_write_json(path, {"id": mid, "key": key, "target": target.spec, "message": dict(message),
                                   "attempts": 0, "next_at": now, "created": now})
    return path


def pending(home: Path, run_id: str) -> list[Path]:
    """The run's queued messages, oldest first."""
    out = folder(home, run_id) / "out"
    try:
        return sorted((p for p in out.iterdir() if p.name.endswith(".json") and not p.name.startswith(".")),
                      key=lambda p: p.stat().st_mtime)
    except (FileNotFoundError, NotADirectoryError):
        return []


def sent_ids(home: Path, run_id: str) -> set[str]:
    try:
        return {p.name for p in (folder(home, run_id) / "sent").iterdir()}
    except FileNotFoundError:
        return set()


def deliver(path: Path, notifiers: Mapping[str, Any], *, force: bool = False) -> bool | None:
    """Try to send the queued message at ``path``: True sent, False failed (rescheduled),
    None not due yet or taken by another process."""
    claimed = path.with_name(f"{path.name}.claim-{os.getpid()}")
    try:
        item = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not force and item.get("next_at", 0) > time.time():
        return None
    try:
        os.rename(path, claimed)  # one process sends it
    except OSError:
        return None
    target = parse_target(item["target"])
    base = path.parent.parent
    try:
        notifier = notifiers.get(target.notifier)
        if notifier is None:
            raise LookupError(f"no notifier {target.notifier!r} is registered here")
        notifier.send(target, item["message"])
    except Exception as exc:  # any failure: keep it and retry later
        item["attempts"] = int(item.get("attempts", 0)) + 1
        item["error"] = mask(f"{type(exc).__name__}: {exc}")
        item["next_at"] = time.time() + backoff(item["attempts"])
        if time.time() - float(item.get("created", 0)) > max_age_s():
            spool.atomic_write_json(base / "failed" / path.name, item)
            os.unlink(claimed)
            log.warning("tracker: notification to %s given up after %d tries: %s", target.shown,
                        item["attempts"], item["error"])
            return False
        spool.atomic_write_json(path, item)
        os.unlink(claimed)
        _warn_once(target, item["error"], base)
        return False
    (base / "sent").mkdir(exist_ok=True)
    (base / "sent" / item["id"]).touch()
    os.unlink(claimed)
    _WARNED.discard(target.spec)
    return True


def _warn_once(target: Target, error: str, base: Path) -> None:
    if target.spec in _WARNED:
        return
    _WARNED.add(target.spec)
    log.warning("tracker: notification to %s failed (%s); it is kept in %s and retried in the background, "
                "training goes on", target.shown, error, base / "out")


def release_stale_claims(home: Path, run_id: str) -> None:
    """Put back messages claimed by a process that is gone (killed while sending)."""
    out = folder(home, run_id) / "out"
    if not out.is_dir():
        return
    for p in out.iterdir():
        name, sep, pid = p.name.rpartition(".claim-")
        if sep and pid.isdigit() and int(pid) != os.getpid() and not spool.pid_alive(int(pid)):
            try:
                os.rename(p, p.with_name(name))
            except OSError:
                pass


def owner_alive(home: Path, run_id: str) -> bool:
    """Is another live process on this host delivering for the run?"""
    owner = spool.read_json(folder(home, run_id) / "owner.json") or {}
    pid = owner.get("pid")
    return (owner.get("host") == socket.gethostname() and isinstance(pid, int) and pid != os.getpid()
            and spool.pid_alive(pid))


def run_config(home: Path, run_id: str) -> NotifyConfig | None:
    raw = spool.read_json(folder(home, run_id) / "targets.json")
    if raw is None:
        return None
    try:
        return from_json(raw)
    except Exception as exc:  # a bad file must not stop the others
        log.warning("tracker: %s: %s", folder(home, run_id) / "targets.json", mask(str(exc)))
        return None


def runs_with_outbox(home: Path) -> list[str]:
    """The runs of ``home`` that have notify targets."""
    root = spool.runs_dir(home)
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    return [e.name for e in entries if e.is_dir() and os.path.isfile(os.path.join(e.path, "notify", "targets.json"))]
