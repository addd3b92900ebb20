"""Importing history: runs read from other tools, written into the store like live runs.

An importer (registered through ``tracker_register_importers``) reads a source and
yields :class:`SourceRun` records: the run's identity, config, tags, status and
every scalar point, in the source's order. This module does the rest, the same
way for every source:

* **Segments.** With ``restarts=True`` the resume rule applies: a point whose key
  already has a point at the same or a later step *in the current segment* starts a
  new segment at its step (a restarted job, a CSV appended after a resume, an
  Ultralytics epoch written twice). Earlier rows at or after that step are hidden by
  the store's views, never deleted, so the curve looks as the source's own viewer
  draws it.
* **Idempotency.** The run id is derived from the source, so a re-import finds its
  run. The stored rows of each (segment, key) must be a prefix of the source's rows
  of that (segment, key); only the rest is written. Importing an unchanged source
  adds nothing; importing it after it grew adds only the new points. A source that
  changed in any other way is refused with the fix (remove the run, import again).
* **All or nothing.** Every source is read and validated before anything is
  written. A new run is staged in ``<home>/import-staging/`` and renamed into the
  spool in one ``os.rename``: it appears whole or not at all. Points added to an
  existing run go into one data file (atomic), followed by the segment records; an
  interruption between the two is completed by the next import of the same source.

Written runs are ordinary spool folders (:mod:`tracker.spool`): queries see them at
once and ingestion moves them into the database.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

import numpy as np
import polars as pl
import pyarrow as pa

from tracker import spool
from tracker.errors import DataError
from tracker.spool import METRICS_SCHEMA, SegmentInfo, atomic_write_json, atomic_write_table

POINTS_SCHEMA = pa.schema(
    [("step", pa.int64()), ("key", pa.string()), ("value", pa.float64()), ("wall_time", pa.float64())]
)
STAGING = "import-staging"
_SLUG_RE = re.compile(r"[^A-Za-z0-9_.\-]+")


@dataclass
class SourceRun:
    """One run read from a source, before anything is written.

    ``points`` has the columns of :data:`POINTS_SCHEMA` (``wall_time`` may be null) in
    the source's order. ``restarts`` applies the resume rule (module doc); without it
    every point lands in one segment.
    """

    kind: str
    source: str
    run_id: str
    name: str
    project: str
    points: pa.Table
    config: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    status: str = "finished"
    created_at: float | None = None
    restarts: bool = True


class Reporter(Protocol):
    """Progress of a read: ``start(label, total)`` then ``advance(amount)``."""

    def start(self, label: str, total: float) -> None: ...

    def advance(self, amount: float) -> None: ...


class NullReporter:
    """A reporter that shows nothing."""

    def start(self, label: str, total: float) -> None:
        return None

    def advance(self, amount: float) -> None:
        return None


class Importer(Protocol):
    """What ``tracker_register_importers`` registers: one ``tracker import <name>`` source."""

    name: str
    help: str
    params: Sequence[Any]  # click.Parameter objects: the source's own arguments and options

    def read(self, reporter: Reporter, **options: Any) -> Iterable[SourceRun]: ...


def make_run_id(kind: str, name: str, *identity: str) -> str:
    """A deterministic, readable run id: ``<kind>-<name slug>-<hash of identity>``."""
    digest = hashlib.blake2b("\x00".join((kind, *identity)).encode(), digest_size=5).hexdigest()
    slug = _SLUG_RE.sub("-", name).strip("-._")[:40] or "run"
    return spool.check_run_id(f"{kind}-{slug}-{digest}")


def points_table(steps: Any, keys: Any, values: Any, wall_times: Any) -> pa.Table:
    """Build a points table, checking the columns' lengths agree."""
    def arr(x: Any, t: pa.DataType) -> pa.Array:
        return x.cast(t) if isinstance(x, (pa.Array, pa.ChunkedArray)) else pa.array(x, t)

    cols = [arr(steps, pa.int64()), arr(keys, pa.string()), arr(values, pa.float64()), arr(wall_times, pa.float64())]
    return pa.Table.from_arrays(cols, schema=POINTS_SCHEMA)


# -- segments -----------------------------------------------------------------------------
def assign_segments(steps: np.ndarray, key_codes: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """The resume rule over points in source order: (segment per point, start step per segment).

    A point starts a new segment when its key's previous point lies in the current
    segment at the same or a later step. Vectorised: candidates are found with one
    sort; only they are walked in Python.
    """
    n = len(steps)
    if n == 0:
        return np.zeros(0, np.int32), [0]
    order = np.lexsort((np.arange(n), key_codes))
    same = np.zeros(n, bool)
    same[1:] = key_codes[order][1:] == key_codes[order][:-1]
    prev = np.full(n, -1, np.int64)
    prev[order[1:][same[1:]]] = order[:-1][same[1:]]
    has_prev = prev >= 0
    cand = np.flatnonzero(has_prev & (steps[np.where(has_prev, prev, 0)] >= steps))
    starts_rows: list[int] = []
    seg_first = 0
    for r in cand.tolist():
        if prev[r] >= seg_first:
            starts_rows.append(r)
            seg_first = r
    seg = np.zeros(n, np.int32)
    if starts_rows:
        seg = np.searchsorted(np.asarray(starts_rows), np.arange(n), side="right").astype(np.int32)
    first = int(steps[:starts_rows[0]].min()) if starts_rows else int(steps.min())
    return seg, [first, *(int(steps[r]) for r in starts_rows)]


@dataclass
class SegmentPlan:
    segment: int
    start_step: int
    last_step: int | None
    started_at: float
    ended_at: float


@dataclass
class ImportPlan:
    """What importing one :class:`SourceRun` would do."""

    run: SourceRun
    action: str  # new | add | unchanged
    segments: list[SegmentPlan]
    rows: pa.Table  # the rows to write, in METRICS_SCHEMA
    keys: int
    points: int

    @property
    def new_points(self) -> int:
        return self.rows.num_rows


def _frame(run: SourceRun) -> tuple[pl.DataFrame, list[int]]:
    """The points with their segment and index within (segment, key); the segments' starts."""
    frame = pl.from_arrow(run.points)
    assert isinstance(frame, pl.DataFrame)
    codes = frame.get_column("key").cast(pl.Categorical).to_physical().to_numpy()
    steps = frame.get_column("step").to_numpy()
    if run.restarts:
        seg, starts = assign_segments(steps, codes)
    else:
        seg, starts = np.zeros(len(steps), np.int32), [int(steps.min()) if len(steps) else 0]
    return frame.with_columns(pl.Series("segment", seg, pl.Int32)).with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).over(["segment", "key"]).alias("_idx")
    ), starts


def _segment_plans(frame: pl.DataFrame, starts: list[int], created_at: float) -> list[SegmentPlan]:
    stats = {
        r["segment"]: r
        for r in frame.group_by("segment").agg(
            pl.col("step").max().alias("last"), pl.col("wall_time").min().alias("t0"),
            pl.col("wall_time").max().alias("t1"),
        ).to_dicts()
    }
    out = []
    for i, start in enumerate(starts):
        s = stats.get(i, {})
        t0 = s.get("t0") if s.get("t0") is not None else created_at
        t1 = s.get("t1") if s.get("t1") is not None else t0
        out.append(SegmentPlan(i, start, s.get("last"), float(t0), float(t1)))
    return out


def plan(runs: Sequence[SourceRun], home: Path) -> list[ImportPlan]:
    """Compare each source run with the store under ``home``; nothing is written."""
    from tracker.store import Store

    ids = [r.run_id for r in runs]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise DataError(f"two sources map to the same run id {sorted(dupes)[0]!r}; import them separately")
    stored = _stored_counts(Store(home), ids) if ids else pl.DataFrame()
    plans = []
    for run in runs:
        frame, starts = _frame(run)
        walls = frame.get_column("wall_time").drop_nulls()
        created = run.created_at if run.created_at is not None else (
            float(walls.min()) if len(walls) else time.time())
        run.created_at = created
        segs = _segment_plans(frame, starts, created)
        mine = stored.filter(pl.col("run_id") == run.run_id) if stored.height else stored
        old_segs = [s for s in spool.list_segments(home, run.run_id) if s.rank == 0]
        exists = bool(old_segs) or bool(mine.height) or (spool.run_dir(home, run.run_id) / "run.json").exists()
        new = frame if not exists else _new_rows(run, frame, mine, old_segs, starts)
        action = "new" if not exists else ("add" if new.height or len(old_segs) < len(segs) else "unchanged")
        rows = _metrics_rows(run.run_id, new)
        plans.append(ImportPlan(run, action, segs, rows, frame.get_column("key").n_unique(), frame.height))
    return plans


def _stored_counts(store: Any, ids: list[str]) -> pl.DataFrame:
    if not store.path.exists() and not spool.runs_dir(store.home).exists():
        return pl.DataFrame()
    return store.query(
        "SELECT run_id, segment, key, count(*) AS n, max(step) AS last FROM metrics "
        "WHERE rank = 0 AND run_id IN (SELECT unnest(?)) GROUP BY ALL",
        [ids],
    )


def _changed(run: SourceRun, why: str) -> DataError:
    return DataError(
        f"{run.kind} source {run.source} no longer matches run {run.run_id!r} imported from it "
        f"({why}): it changed in a way other than growing. Remove the run "
        f"(`tracker runs rm {run.run_id}`) and import it again"
    )


def _new_rows(
    run: SourceRun, frame: pl.DataFrame, stored: pl.DataFrame, old_segs: list[SegmentInfo], starts: list[int]
) -> pl.DataFrame:
    """The source rows not yet stored, after checking the stored ones are a prefix."""
    for old in old_segs:
        if old.segment >= len(starts):
            raise _changed(run, f"the store has segment {old.segment}, the source {len(starts)} segment(s)")
        if old.segment > 0 and old.start_step != starts[old.segment]:
            raise _changed(run, f"segment {old.segment} starts at step {old.start_step} in the store, "
                                f"{starts[old.segment]} in the source")
    if not stored.height:
        return frame
    have = stored.select(
        pl.col("segment").cast(pl.Int32), "key", pl.col("n").cast(pl.Int64), pl.col("last").cast(pl.Int64))
    joined = frame.join(have, on=["segment", "key"], how="left")
    check = joined.filter(pl.col("_idx") == pl.col("n") - 1)
    bad = check.filter(pl.col("step") != pl.col("last"))
    if bad.height or check.height != have.height:
        row = bad.row(0, named=True) if bad.height else None
        why = (f"key {row['key']!r} of segment {row['segment']} ends at step {row['last']} in the store, "
               f"the source has step {row['step']} there") if row else "a stored key has fewer points in the source"
        raise _changed(run, why)
    return joined.filter(pl.col("n").is_null() | (pl.col("_idx") >= pl.col("n"))).drop("n", "last")


def _metrics_rows(run_id: str, frame: pl.DataFrame) -> pa.Table:
    n = frame.height
    arrow = frame.select("step", "key", "value", "wall_time", "segment").to_arrow()
    cols = [
        pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([run_id])).cast(pa.string()),
        pa.array(np.zeros(n, np.int32)),
        arrow.column("segment").cast(pa.int32()),
        arrow.column("step").cast(pa.int64()),
        arrow.column("key").cast(pa.string()),
        arrow.column("value").cast(pa.float64()),
        arrow.column("wall_time").cast(pa.float64()),
    ]
    return pa.Table.from_arrays(cols, schema=METRICS_SCHEMA).combine_chunks()


# -- writing ------------------------------------------------------------------------------
def _run_json(p: ImportPlan, old: dict[str, Any] | None) -> dict[str, Any]:
    run = p.run
    updated = max([s.ended_at for s in p.segments] + [run.created_at or 0.0])
    return {
        **(old or {}),
        "run_id": run.run_id, "project": run.project, "name": run.name, "status": run.status,
        "config": run.config, "tags": list(dict.fromkeys(run.tags)), "world_size": 1,
        "created_at": run.created_at, "updated_at": updated,
        "imported_from": {"kind": run.kind, "source": run.source, "imported_at": time.time()},
    }


def _segment_infos(p: ImportPlan) -> list[SegmentInfo]:
    return [
        SegmentInfo(run_id=p.run.run_id, rank=0, segment=s.segment, start_step=s.start_step,
                    reason="start" if s.segment == 0 else "resume", started_at=s.started_at,
                    last_step=s.last_step, ended_at=s.ended_at, heartbeat=s.ended_at)
        for s in p.segments
    ]


def write(p: ImportPlan, home: Path) -> None:
    """Write one planned run into the spool under ``home`` (see the module doc)."""
    if p.action == "unchanged":
        return
    folder = spool.run_dir(home, p.run.run_id)
    seq = time.time_ns() // 1000
    last_seg = p.segments[-1].segment
    data_name = f"r0-s{last_seg:04d}-{seq}.metrics.parquet"
    if p.action == "new":
        stage = home / STAGING / f"{p.run.run_id}.{os.getpid()}"
        if stage.exists():
            shutil.rmtree(stage)
        stage.mkdir(parents=True)
        try:
            if p.rows.num_rows:
                atomic_write_table(stage / data_name, p.rows)
            for info in _segment_infos(p):
                atomic_write_json(stage / info.path(home).name, _seg_dict(info))
            atomic_write_json(stage / "run.json", _run_json(p, None))
            spool.runs_dir(home).mkdir(parents=True, exist_ok=True)
            try:
                os.rename(stage, folder)
            except OSError as exc:
                raise DataError(f"cannot place imported run {p.run.run_id!r} at {folder}: {exc}; "
                                "is another import of the same source running?") from None
            spool.fsync_dir(folder.parent)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return
    if p.rows.num_rows:
        atomic_write_table(folder / data_name, p.rows)
    for info in _segment_infos(p):
        info.save(home)
    atomic_write_json(folder / "run.json", _run_json(p, spool.read_json(folder / "run.json")))


def _seg_dict(info: SegmentInfo) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(info)


def clean_staging(home: Path) -> None:
    """Remove staging folders left by interrupted imports whose process is gone."""
    root = home / STAGING
    if not root.is_dir():
        return
    for entry in root.iterdir():
        pid = entry.name.rsplit(".", 1)[-1]
        if not pid.isdigit() or not spool.pid_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def import_runs(
    runs: Sequence[SourceRun], home: Path, *, dry_run: bool = False,
    on_write: Callable[[ImportPlan], None] | None = None,
) -> list[ImportPlan]:
    """Plan every run, then (unless ``dry_run``) write them one by one. Returns the plans."""
    plans = plan(runs, home)
    if dry_run:
        return plans
    clean_staging(home)
    for p in plans:
        write(p, home)
        if on_write is not None:
            on_write(p)
    return plans
