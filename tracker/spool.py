"""Crash-safe, append-only spool of a run's data, written off the training thread.

Layout under ``<home>/runs/<run_id>/``::

    run.json                          run metadata and status (rank 0 owns it)
    seg-r<rank>-s<segment>.json       one per segment: start step, reason, last step, heartbeat
    r<rank>-s<segment>-<seq>.<table>.parquet   data chunks, table in metrics|class_metrics|events

Rules:

* Every file is written to a temporary name ``.<name>.<pid>.tmp`` in the same folder,
  fsynced, then ``os.replace``d into place, so readers never see a torn file and a
  crash leaves at most a temp file (cleaned by ingestion once its writer is gone).
* Data files are immutable once renamed; ingestion records their names in the store
  in the same transaction as their rows and removes them only after the commit.
* Segment JSON files are never removed by ingestion: they are tiny and let a resuming
  process compute its segment number and resume step without opening the database.
* A segment JSON's ``last_step`` is written only after the chunk holding that step is
  in place (see :mod:`tracker.runmeta`), and records that chunk's sequence number as
  ``last_seq``. :func:`durable_segments` reads a segment's durable last step from
  both: the JSON, plus any chunk of the segment numbered above ``last_seq`` (a kill
  between the chunk's rename and the JSON's). Chunks ingested and removed from the
  spool are covered by the JSON, which was written before they could be ingested.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from tracker.errors import ConfigError, DataError

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

DATA_RE = re.compile(r"^r(?P<rank>\d+)-s(?P<segment>\d+)-(?P<seq>\d+)\.(?P<table>[a-z_]+)\.parquet$")
SEG_RE = re.compile(r"^seg-r(?P<rank>\d+)-s(?P<segment>\d+)\.json$")
TMP_RE = re.compile(r"^\..+\.(?P<pid>\d+)\.tmp$")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")

_KEY_COLUMNS = (("run_id", "string"), ("rank", "int32"), ("segment", "int32"), ("step", "int64"), ("key", "string"))
# each spool table's columns and their Arrow types (pyarrow type-factory names)
COLUMN_TYPES: dict[str, tuple[tuple[str, str], ...]] = {
    "metrics": (*_KEY_COLUMNS, ("value", "float64"), ("wall_time", "float64")),
    "class_metrics": (*_KEY_COLUMNS, ("class_index", "int32"), ("value", "float64"), ("wall_time", "float64")),
    "events": (*_KEY_COLUMNS, ("kind", "string"), ("severity", "string"), ("message", "string"),
               ("data", "string"), ("wall_time", "float64")),
}
TABLES = tuple(COLUMN_TYPES)


def column_names(table: str) -> tuple[str, ...]:
    """The columns of spool table ``table``, in file order (no pyarrow needed)."""
    return tuple(name for name, _ in COLUMN_TYPES[table])


@functools.cache
def _schemas() -> dict[str, pa.Schema]:
    import pyarrow as pa

    return {table: pa.schema([(name, getattr(pa, kind)()) for name, kind in cols])
            for table, cols in COLUMN_TYPES.items()}


_SCHEMA_NAMES = {"METRICS_SCHEMA": "metrics", "CLASS_SCHEMA": "class_metrics", "EVENTS_SCHEMA": "events"}


def __getattr__(name: str) -> Any:
    """``SCHEMAS`` and ``METRICS_SCHEMA``/``CLASS_SCHEMA``/``EVENTS_SCHEMA``, the spool files'
    Arrow schemas, made on first use: pyarrow (and numpy with it, about 0.1 s) loads only
    when spool files are written or read, not for a query of a store with none."""
    if name == "SCHEMAS":
        return _schemas()
    if name in _SCHEMA_NAMES:
        return _schemas()[_SCHEMA_NAMES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_run_id(run_id: str) -> str:
    """Validate a run id (it becomes a folder name)."""
    if not isinstance(run_id, str) or not _RUN_ID_RE.match(run_id):
        raise ConfigError(
            f"run_id {run_id!r} is not valid; use 1-128 letters, digits, '_', '.', '-' "
            "starting with a letter or digit"
        )
    return run_id


def home_dir(home: str | os.PathLike[str] | None = None) -> Path:
    """The store folder: ``home``, else ``$TRACKER_HOME``, else ``./.tracker``."""
    return Path(home or os.environ.get("TRACKER_HOME") or ".tracker").resolve()


def runs_dir(home: Path) -> Path:
    return Path(home) / "runs"


def run_dir(home: Path, run_id: str) -> Path:
    return runs_dir(home) / check_run_id(run_id)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in folder ``path`` durable (a no-op where folders have no fd)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` via a temp name, fsync and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any, durable: bool = True) -> None:
    atomic_write_bytes(path, json.dumps(obj, default=str, allow_nan=True).encode(), durable)


def atomic_write_table(path: Path, table: pa.Table) -> None:
    """Write an Arrow table as a Parquet file, crash-safely."""
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp, compression="snappy", use_dictionary=["run_id", "key"])
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # disk full mid-write: leave no half-written temp file behind
        _unlink_quietly(tmp)
        raise
    fsync_dir(path.parent)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def read_json(path: Path) -> dict[str, Any] | None:
    """Read a JSON file; None when it is missing or unreadable (a torn write cannot happen)."""
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except (OSError, ValueError):
        return None


@dataclass
class SegmentInfo:
    """One segment of one rank of a run: what ``seg-r<rank>-s<segment>.json`` holds."""

    run_id: str
    rank: int
    segment: int
    start_step: int
    reason: str
    started_at: float
    last_step: int | None = None
    last_seq: int | None = None
    ended_at: float | None = None
    heartbeat: float = field(default_factory=time.time)
    pid: int = field(default_factory=os.getpid)

    def path(self, home: Path) -> Path:
        return run_dir(home, self.run_id) / f"seg-r{self.rank}-s{self.segment:04d}.json"

    def save(self, home: Path, durable: bool = True) -> None:
        atomic_write_json(self.path(home), asdict(self), durable)


def list_segments(home: Path, run_id: str) -> list[SegmentInfo]:
    """All segments of a run found in its spool folder, ordered by (rank, segment).

    A segment file that is not a valid segment raises :class:`DataError` naming it
    (see :func:`parse_segment`): its number must not be reused, so it is never skipped here.
    """
    folder = run_dir(home, run_id)
    out: list[SegmentInfo] = []
    if not folder.is_dir():
        return out
    for entry in os.scandir(folder):
        if SEG_RE.match(entry.name):
            path = Path(entry.path)
            out.append(parse_segment(read_json(path), path))
    out.sort(key=lambda s: (s.rank, s.segment))
    return out


def _chunk_max_steps(home: Path, seg: SegmentInfo) -> dict[int, int]:
    """{seq: max step} of the segment's metric and per-class chunks still in the spool
    (from the Parquet footers' statistics; an unreadable chunk counts as not durable)."""
    folder = run_dir(home, seg.run_id)
    out: dict[int, int] = {}
    prefix = f"r{seg.rank}-s{seg.segment:04d}-"
    try:
        entries = [e.name for e in os.scandir(folder) if e.name.startswith(prefix)]
    except OSError:
        return out
    for name in entries:
        m = DATA_RE.match(name)
        if not m or m.group("table") == "events":
            continue
        seq = int(m.group("seq"))
        if seg.last_seq is not None and seq <= seg.last_seq and seg.last_step is not None:
            continue  # already counted by the JSON (new format: only later chunks matter)
        top = _parquet_max_step(folder / name)
        if top is not None:
            out[seq] = max(top, out.get(seq, top))
    return out


def _parquet_max_step(path: Path) -> int | None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
        col = meta.schema.names.index("step")
        tops = []
        for i in range(meta.num_row_groups):
            stats = meta.row_group(i).column(col).statistics
            if stats is None or not stats.has_min_max:
                tops.append(pq.read_table(path, columns=["step"]).column("step").to_numpy().max())
                break
            tops.append(stats.max)
        return int(max(tops)) if tops else None
    except (OSError, ValueError, pa.ArrowException):
        return None


def durable_segments(home: Path, run_id: str) -> list[SegmentInfo]:
    """:func:`list_segments` with each ``last_step`` set to what is durable (module doc).

    A segment JSON written before ``last_seq`` existed (older spools) is also capped by
    the largest step of its chunks still in the spool, when it has any."""
    out = list_segments(home, run_id)
    for seg in out:
        chunks = _chunk_max_steps(home, seg)
        if not chunks:
            continue
        top = max(chunks.values())
        if seg.last_step is not None and seg.last_seq is None:
            seg.last_step = min(seg.last_step, top)  # older spool: the JSON may be ahead
        else:
            seg.last_step = top if seg.last_step is None else max(seg.last_step, top)
    return out


def visible_last_step(segments: Iterable[SegmentInfo]) -> int | None:
    """The last step still visible after resumes: rows of a segment at or above a later
    segment's start step are hidden, so each segment contributes at most ``next_start - 1``."""
    segs = sorted(segments, key=lambda s: s.segment)
    best: int | None = None
    for i, seg in enumerate(segs):
        if seg.last_step is None:
            continue
        later = [s.start_step for s in segs[i + 1 :]]
        cut = min(later) if later else None
        last = seg.last_step if cut is None else min(seg.last_step, cut - 1)
        if last >= seg.start_step or cut is None:
            best = last if best is None else max(best, last)
    return best


def data_files(home: Path) -> list[Path]:
    """Every data chunk in the spool that its segment JSON accounts for, all runs,
    ordered by name (what queries read and ingestion takes).

    A chunk numbered above its segment's ``last_seq`` is left out while that segment is
    the rank's newest and not ended: it was just renamed into place and its JSON is a
    moment behind, or its writer was killed in between. Taking it then would make the
    store hold rows the run's record does not claim (a resume would start before them);
    a resume counts it (:func:`durable_segments`) and opens a later segment, after which
    it is taken. Segment JSON of older spools (no ``last_seq``) accounts for all chunks.
    """
    root = runs_dir(home)
    out: list[Path] = []
    if not root.is_dir():
        return out
    for run in os.scandir(root):
        if not run.is_dir():
            continue
        chunks = [(DATA_RE.match(e.name), e.path) for e in os.scandir(run.path)]
        chunks = [(m, p) for m, p in chunks if m]
        if not chunks:
            continue
        limits = _unclaimed_from(home, run.name)
        if limits is None:
            continue  # a bad segment file: the run's chunks wait until `tracker doctor --fix`
        for m, path in chunks:
            limit = limits.get((int(m.group("rank")), int(m.group("segment"))))
            if limit is None or int(m.group("seq")) <= limit:
                out.append(Path(path))
    out.sort()
    return out


def _unclaimed_from(home: Path, run_id: str) -> dict[tuple[int, int], int] | None:
    """{(rank, segment): last claimed seq} for segments whose later chunks are held back;
    None when a segment file of the run is bad (nothing of it can be said to be claimed)."""
    try:
        segs = list_segments(home, run_id)
    except DataError:
        return None
    except (ConfigError, OSError, TypeError):
        return {}
    newest: dict[int, int] = {}
    for seg in segs:
        newest[seg.rank] = max(newest.get(seg.rank, -1), seg.segment)
    out: dict[tuple[int, int], int] = {}
    for seg in segs:
        legacy = seg.last_seq is None and seg.last_step is not None
        if seg.segment == newest[seg.rank] and seg.ended_at is None and not legacy:
            out[(seg.rank, seg.segment)] = -1 if seg.last_seq is None else seg.last_seq
    return out


def table_of(path: Path) -> str:
    m = DATA_RE.match(path.name)
    return m.group("table") if m else ""


def stale_temp_files(home: Path, max_age_s: float = 3600.0) -> list[Path]:
    """Temp files whose writer process is gone (same host) or that are older than ``max_age_s``."""
    root = runs_dir(home)
    out: list[Path] = []
    if not root.is_dir():
        return out
    now = time.time()
    for run in os.scandir(root):
        if not run.is_dir():
            continue
        for entry in os.scandir(run.path):
            m = TMP_RE.match(entry.name)
            if not m:
                continue
            pid = int(m.group("pid"))
            try:
                age = now - entry.stat().st_mtime
            except OSError:
                continue
            if age > max_age_s or (pid != os.getpid() and not pid_alive(pid)):
                out.append(Path(entry.path))
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - someone else's live process
        return True
    return True


def meta_fingerprint(home: Path) -> str:
    """A digest of every run.json and segment JSON (names, sizes, mtimes) in the spool."""
    h = hashlib.blake2b(digest_size=16)
    root = runs_dir(home)
    if root.is_dir():
        for run in sorted(os.scandir(root), key=lambda e: e.name):
            if not run.is_dir():
                continue
            for entry in sorted(os.scandir(run.path), key=lambda e: e.name):
                if entry.name == "run.json" or SEG_RE.match(entry.name):
                    st = entry.stat()
                    h.update(f"{run.name}/{entry.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()


# -- validation of the spool's JSON files (a bad file must affect only its own run) ------
_INT64 = 2**63


def _is_int(value: Any, low: int = 0, high: int = _INT64) -> bool:
    return type(value) is int and low <= value < high


def _is_time(value: Any) -> bool:
    return type(value) in (int, float) and -1e10 < value < 1e11  # finite, a datetime can hold it


def _bad(path: Path, what: str, fix: str = "") -> DataError:
    return DataError(
        f"{path}: {what}; {fix or 'move it aside with `tracker doctor --fix` (it goes to <TRACKER_HOME>/corrupt/)'}"
    )


def parse_segment(raw: Any, path: Path) -> SegmentInfo:
    """The :class:`SegmentInfo` in a segment file's parsed JSON ``raw``, or :class:`DataError`.

    Checks every field's type and range, and that run id, rank and segment agree with
    the file's name and folder. Unknown keys are ignored.
    """
    if raw is None:
        raise _bad(path, "is not readable JSON")
    if not isinstance(raw, dict):
        raise _bad(path, f"is not a segment record (JSON object expected, got {type(raw).__name__})")
    m = SEG_RE.match(path.name)
    checks = {
        "run_id": raw.get("run_id") == path.parent.name,
        "rank": _is_int(raw.get("rank"), 0, 2**31) and (m is None or raw["rank"] == int(m.group("rank"))),
        "segment": _is_int(raw.get("segment"), 0, 2**31) and (m is None or raw["segment"] == int(m.group("segment"))),
        "start_step": _is_int(raw.get("start_step")),
        "reason": isinstance(raw.get("reason"), str),
        "started_at": _is_time(raw.get("started_at")),
        "last_step": raw.get("last_step") is None or _is_int(raw.get("last_step")),
        "last_seq": raw.get("last_seq") is None or _is_int(raw.get("last_seq"), 0, 2**63),
        "ended_at": raw.get("ended_at") is None or _is_time(raw.get("ended_at")),
        "heartbeat": _is_time(raw.get("heartbeat", 0.0)),
        "pid": _is_int(raw.get("pid", 0), 0, 2**31),
    }
    wrong = [k for k, ok in checks.items() if not ok]
    if wrong:
        shown = ", ".join(f"{k}={raw.get(k)!r}" for k in wrong)
        raise _bad(path, f"segment file has bad values ({shown})")
    fields = SegmentInfo.__dataclass_fields__
    return SegmentInfo(**{k: v for k, v in raw.items() if k in fields})


def _str_or_none(value: Any) -> bool:
    return value is None or isinstance(value, str)


def check_run_meta(raw: Any, path: Path) -> dict[str, Any]:
    """``raw`` (a parsed ``run.json``) when its fields have the types readers rely on, else :class:`DataError`."""
    if not isinstance(raw, dict):
        raise _bad(path, f"is not a run record (JSON object expected, got {type(raw).__name__})")
    checks = {
        "run_id": raw.get("run_id") == path.parent.name,
        "project": _str_or_none(raw.get("project")),
        "name": _str_or_none(raw.get("name")),
        "status": isinstance(raw.get("status", ""), str),
        "created_at": _is_time(raw.get("created_at", 0.0)),
        "updated_at": _is_time(raw.get("updated_at", 0.0)),
        "config": isinstance(raw.get("config", {}), dict),
        "tags": isinstance(raw.get("tags", []), list) and all(isinstance(t, str) for t in raw.get("tags", [])),
        "host": _str_or_none(raw.get("host")),
        "git_commit": _str_or_none(raw.get("git_commit")),
        "python": _str_or_none(raw.get("python")),
        "packages": isinstance(raw.get("packages", {}), dict),
        "world_size": raw.get("world_size") is None or _is_int(raw.get("world_size"), 1, 2**31),
        "classes": raw.get("classes") is None
        or (isinstance(raw["classes"], list) and all(isinstance(c, str) for c in raw["classes"])),
    }
    wrong = [k for k, ok in checks.items() if not ok]
    if wrong:
        shown = ", ".join(f"{k}={raw.get(k)!r}" for k in wrong)
        raise _bad(path, f"run.json has bad values ({shown}; expected run_id equal to the folder name)"
                   if "run_id" in wrong else f"run.json has bad values ({shown})")
    return raw


def read_run_meta(path: Path) -> dict[str, Any] | None:
    """A run's ``run.json``: None when missing, :class:`DataError` when present but invalid."""
    if not path.exists():
        return None
    raw = read_json(path)
    if raw is None:
        raise _bad(path, "is not readable JSON")
    return check_run_meta(raw, path)
