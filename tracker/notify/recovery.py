"""Messages dead runs left behind, and runs that died: sent by whichever process sees them.

:func:`recover` goes through every run of a store that has an outbox:

* a run whose delivering process is gone (``kill -9``, a crash, a finish that could
  not deliver in time): its queued messages are sent now;
* when the store is a lake and the caller gives targets of its own (``tracker notify
  watch``): the runs of other hosts that the lake reads ``crashed``, claimed once across
  all hosts in the lake's catalog (:mod:`tracker.notify.lakecrash`);
* a run that is shown ``crashed`` by the heartbeat rule (:mod:`tracker.store.spoolmeta`:
  no heartbeat for two ``TRACKER_HEARTBEAT_S`` intervals, or its process gone on this
  host) while ``run.json`` still says ``running``: one ``run_crashed`` message per dead
  segment. The marker file ``notify/crashed-r<rank>-s<segment>`` is created with
  ``O_EXCL`` first, so of all the processes that see it only one notifies. A resume
  opens a new segment (the run is ``running`` again) and a later crash notifies again.

:func:`recover_soon` runs it on a daemon thread, at most every few seconds per store,
when a run starts or a store is opened; interpreter exit waits for it briefly.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from tracker import spool
from tracker.events import Event
from tracker.notify import outbox
from tracker.notify.config import NotifyConfig

log = logging.getLogger(__name__)

EVERY_S = 5.0
EXIT_WAIT_S = 3.0
_LAST: dict[Path, float] = {}
_THREADS: list[threading.Thread] = []
_LOCK = threading.Lock()


def recover_soon(home: Path) -> None:
    """Run :func:`recover` for ``home`` on a daemon thread (at most every 5 s per store)."""
    home = Path(home)
    with _LOCK:
        now = time.monotonic()
        if now - _LAST.get(home, -EVERY_S) < EVERY_S or not spool.runs_dir(home).is_dir():
            return
        _LAST[home] = now
        thread = threading.Thread(target=_recover_quietly, args=(home,), name="tracker-notify-recover", daemon=True)
        _THREADS.append(thread)
    thread.start()


def _recover_quietly(home: Path) -> None:
    try:
        recover(home)
    except Exception:  # never in anyone's way
        log.exception("tracker: delivering the notifications left in %s failed", home)


@atexit.register
def _wait_at_exit() -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    for thread in list(_THREADS):
        thread.join(max(deadline - time.monotonic(), 0))


def recover(home: Path, notifiers: dict[str, Any] | None = None,
            fallback: NotifyConfig | None = None, since: float = 0.0) -> dict[str, int]:
    """Send what dead runs left queued, and notify newly crashed runs; counts of what it did.

    ``fallback`` (``tracker notify watch``'s own targets): runs without targets of their
    own are checked too, and their crashes sent there, for segments that were still
    beating at ``since`` (a watch started today does not report last year's crashes)."""
    home = Path(home)
    counts = {"sent": 0, "failed": 0, "crashed": 0}
    runs = outbox.runs_with_outbox(home)
    if fallback is not None and fallback.targets:
        counts["crashed"] += _check_lake(home, notifiers, fallback, since, counts)
        for run_id in sorted(set(_all_runs(home)) - set(runs)):
            if check_crashed(home, run_id, fallback, since):
                counts["crashed"] += 1
                runs.append(run_id)
    if not runs:  # the common case: nothing to load (a store's reader stays light)
        return counts
    if notifiers is None:
        from tracker.host import get_host

        notifiers = get_host().items("notifiers")
    from tracker.notify.dispatch import LIVE

    for run_id in runs:
        cfg = outbox.run_config(home, run_id) or fallback
        if cfg is None or (home, run_id) in LIVE:
            continue
        outbox.release_stale_claims(home, run_id)
        counts["crashed"] += check_crashed(home, run_id, cfg)
        if outbox.owner_alive(home, run_id) and not _crashed_here(home, run_id):
            continue
        for path in outbox.pending(home, run_id):
            result = outbox.deliver(path, notifiers, force=True)
            if result is not None:
                counts["sent" if result else "failed"] += 1
    return counts


def _check_lake(home: Path, notifiers: dict[str, Any] | None, fallback: NotifyConfig, since: float,
                counts: dict[str, int]) -> int:
    """When the store is a lake: notify the crashes of other hosts' runs (:mod:`tracker.notify.lakecrash`),
    stale in the lake since ``since`` less the lake's limit, and send what this host queued for them."""
    from tracker.store.settings import current

    setting = current()
    if setting is None or home.name == "lake-crashes":
        return 0
    from tracker.notify.lakecrash import check_lake, outbox_home
    from tracker.store.lake import stale_after_s

    try:
        found = len(check_lake(home, setting, fallback, since - stale_after_s() if since else 0.0))
    except Exception as exc:  # an unreachable catalog: the next check tries again
        log.warning("tracker: checking the lake for crashed runs failed: %s", setting.scrub(str(exc))[:300])
        found = 0
    sub = recover(outbox_home(home), notifiers)
    counts["sent"] += sub["sent"]
    counts["failed"] += sub["failed"]
    return found


def _all_runs(home: Path) -> list[str]:
    try:
        return [e.name for e in os.scandir(spool.runs_dir(home)) if e.is_dir() and not e.name.startswith(".")]
    except FileNotFoundError:
        return []


def _crashed_here(home: Path, run_id: str) -> bool:
    folder = outbox.folder(home, run_id)
    return any(p.name.startswith("crashed-") for p in folder.iterdir()) if folder.is_dir() else False


def check_crashed(home: Path, run_id: str, cfg: NotifyConfig, since: float = 0.0) -> int:
    """Queue one ``run_crashed`` message per dead segment of a run still recorded ``running``."""
    from tracker.store.spoolmeta import run_row, stale_after_s

    folder = spool.run_dir(home, run_id)
    meta = spool.read_json(folder / "run.json")
    if not meta or meta.get("status", "running") != "running":
        return 0
    segs = spool.list_segments(home, run_id)
    if not segs or run_row(meta, segs)["status"] != "crashed":
        return 0
    found = 0
    for seg in segs:
        if seg.ended_at is not None or seg.heartbeat < since:
            continue
        marker = outbox.folder(home, run_id) / f"crashed-r{seg.rank}-s{seg.segment}"
        marker.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue  # another process saw it first
        os.write(fd, f"{os.getpid()} {time.time():.3f}\n".encode())
        os.fsync(fd)
        os.close(fd)
        from tracker.notify.lakecrash import claim_local

        if not claim_local(meta["run_id"], seg.rank, seg.segment):
            continue  # a host reading the lake notified it already
        found += 1
        _queue_crash(home, meta, seg, cfg, stale_after_s())
    return found


def _queue_crash(home: Path, meta: dict[str, Any], seg: spool.SegmentInfo, cfg: NotifyConfig, stale: float) -> None:
    from tracker.notify.dispatch import compose

    age = time.time() - seg.heartbeat
    ev = Event(step=seg.last_step if seg.last_step is not None else seg.start_step, kind="run_crashed",
               severity="error", key=None,
               message=(f"run {meta.get('name') or meta['run_id']} (rank {seg.rank}, segment {seg.segment}) stopped "
                        f"without finishing: no heartbeat for {age:.0f} s (limit {stale:g} s) "
                        + (f"or its process {seg.pid} on {meta.get('host')} is gone" if seg.pid > 0 else
                           f"in the lake: its host {meta.get('host')} committed nothing more")
                        + f"; last durable step {seg.last_step}"),
               data={"rank": seg.rank, "segment": seg.segment, "pid": seg.pid, "heartbeat_age_s": round(age, 1)})
    info = {"run_id": meta["run_id"], "project": meta.get("project"), "name": meta.get("name"), "rank": seg.rank,
            "host": meta.get("host"), "pid": seg.pid}
    key = outbox.idempotency_key(meta["run_id"], "run_crashed", seg.rank, seg.segment)
    for target in cfg.targets:
        rule = next((r for r in cfg.rules if r.sends_to(target) and r.matches(ev.kind, ev.severity, None)), None)
        if rule is not None:
            outbox.enqueue(home, meta["run_id"], key, target, compose(info, ev, rule))
