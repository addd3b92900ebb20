"""``tracker import tensorboard LOGDIR``: every run folder, every scalar tag, every point.

A run is a folder under LOGDIR holding ``*tfevents*`` files; its name is the folder's
path relative to LOGDIR, as TensorBoard names it (LOGDIR itself, when it holds event
files, is named after its folder). Files are read in name order, as TensorBoard reads
them, with the bulk reader of :mod:`plugins.importers.tfrecord` (no cap on points per
tag, wall times kept). A restarted job (a point at or before its tag's last step) is
a resume: a new segment, earlier rows from that step on hidden, nothing deleted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import click
import numpy as np
import pyarrow as pa

from tracker.errors import ConfigError, DataError
from tracker.importer import Reporter, SourceRun, make_run_id, points_table
from plugins.importers.tfrecord import TagKinds, read_scalars


def find_runs(logdir: Path) -> list[tuple[str, list[Path]]]:
    """(relative run path, event files in name order) for every run folder under ``logdir``."""
    runs = []
    for folder, dirs, files in os.walk(logdir):
        dirs.sort()
        events = sorted(f for f in files if "tfevents" in f)
        if events:
            rel = os.path.relpath(folder, logdir)
            runs.append((rel, [Path(folder) / f for f in events]))
    return runs


def read_run(logdir: Path, rel: str, files: list[Path], project: str, reporter: Reporter) -> SourceRun:
    """One run folder's scalar points, all files concatenated in name order."""
    kinds = TagKinds()
    keys: dict[str, int] = {}
    parts: list[tuple[np.ndarray, ...]] = []
    for path in files:
        s = read_scalars(path, kinds)
        remap = np.asarray([keys.setdefault(k, len(keys)) for k in s.keys], np.int32)
        codes = remap[s.key_codes] if len(s.keys) else np.zeros(0, np.int32)
        parts.append((s.steps, codes, s.values, s.wall_times))
        reporter.advance(path.stat().st_size)
    steps, codes, values, walls = (np.concatenate([p[i] for p in parts]) for i in range(4))
    key_col = pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pa.array(list(keys), pa.string()))
    name = logdir.resolve().name if rel == "." else rel
    return SourceRun(
        kind="tensorboard", source=str(logdir / rel), run_id=make_run_id("tb", name, str(logdir.resolve()), rel),
        name=name, project=project, points=points_table(steps, key_col, values, walls),
        tags=["import:tensorboard"], created_at=float(walls.min()) if len(walls) else None,
    )


class TensorBoardImporter:
    name = "tensorboard"
    help = "Import every run folder under LOGDIR: every scalar tag, every point, wall times kept."
    params = [click.Argument(["logdir"], type=click.Path(exists=True, file_okay=False, path_type=Path))]

    def read(self, reporter: Reporter, logdir: Path, **_: Any) -> Iterator[SourceRun]:
        """Yield one run per folder holding event files."""
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("tracker import tensorboard needs the tensorboard package (for its compiled "
                              "Event proto): pip install 'tracker[import]'")
        found = find_runs(logdir)
        if not found:
            raise DataError(f"no TensorBoard event files (*tfevents*) under {logdir}; pass the folder "
                            "you give `tensorboard --logdir`")
        reporter.start("reading event files", sum(f.stat().st_size for _, files in found for f in files))
        project = logdir.resolve().name
        for rel, files in found:
            yield read_run(logdir, rel, files, project, reporter)
