"""Arrow tables of a run's buffered rows (built on the flusher thread).

The buffers hold what :meth:`tracker.run.Run.log` validated, so building a table does
not fail on a value; should it fail anyway, :func:`salvage` keeps every row that can
be stored and reports how many could not, so a bad row never costs the valid ones.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from tracker.spool import CLASS_SCHEMA, EVENTS_SCHEMA, METRICS_SCHEMA

MetricRow = tuple[int, float, tuple[str, ...], list[float]]
ClassRow = tuple[int, float, str, np.ndarray]


def const_columns(run_id: str, rank: int, segment: int, n: int) -> list[pa.Array]:
    """The run_id, rank and segment columns of ``n`` rows."""
    return [
        pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([run_id])).cast(pa.string()),
        pa.array(np.full(n, rank, np.int32)),
        pa.array(np.full(n, segment, np.int32)),
    ]


def metrics_table(ident: tuple[str, int, int], buf: Sequence[MetricRow]) -> pa.Table:
    """Long-format scalar rows (one per key and step), sorted by step."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, rec in enumerate(buf):
        groups.setdefault(rec[2], []).append(i)
    parts_step, parts_key, parts_val, parts_wall = [], [], [], []
    key_index: dict[str, int] = {}
    for keys, idx in groups.items():
        k = len(keys)
        if k == 0:
            continue
        rows = [buf[i] for i in idx]
        vals = np.array([r[3] for r in rows], dtype=np.float64).reshape(-1)
        steps = np.repeat(np.fromiter((r[0] for r in rows), np.int64, len(rows)), k)
        walls = np.repeat(np.fromiter((r[1] for r in rows), np.float64, len(rows)), k)
        codes = np.array([key_index.setdefault(key, len(key_index)) for key in keys], np.int32)
        parts_step.append(steps)
        parts_val.append(vals)
        parts_wall.append(walls)
        parts_key.append(np.tile(codes, len(rows)))
    steps = np.concatenate(parts_step) if parts_step else np.zeros(0, np.int64)
    order = np.argsort(steps, kind="stable")
    n = len(steps)
    keys_arr = pa.DictionaryArray.from_arrays(
        pa.array(np.concatenate(parts_key)[order] if n else np.zeros(0, np.int32)),
        pa.array(list(key_index), pa.string()),
    ).cast(pa.string())
    cols = const_columns(*ident, n) + [
        pa.array(steps[order]),
        keys_arr,
        pa.array(np.concatenate(parts_val)[order] if n else np.zeros(0)),
        pa.array(np.concatenate(parts_wall)[order] if n else np.zeros(0)),
    ]
    return pa.Table.from_arrays(cols, schema=METRICS_SCHEMA)


def class_table(ident: tuple[str, int, int], cbuf: Sequence[ClassRow]) -> pa.Table:
    """Per-class rows (one per key, step and class). The key column is built from one code per
    vector (a dictionary cast to strings in Arrow), not from a Python string per row."""
    sizes = np.fromiter((r[3].size for r in cbuf), np.int64, len(cbuf))
    steps = np.repeat(np.fromiter((r[0] for r in cbuf), np.int64, len(cbuf)), sizes)
    walls = np.repeat(np.fromiter((r[1] for r in cbuf), np.float64, len(cbuf)), sizes)
    if len(cbuf) and (sizes == sizes[0]).all():  # the usual case: every vector one per class
        cls = np.tile(np.arange(sizes[0], dtype=np.int32), len(cbuf))
    else:
        cls = np.concatenate([np.arange(r[3].size, dtype=np.int32) for r in cbuf])
    vals = np.concatenate([r[3] for r in cbuf])
    key_index: dict[str, int] = {}
    codes = np.fromiter((key_index.setdefault(r[2], len(key_index)) for r in cbuf), np.int32, len(cbuf))
    keys = pa.DictionaryArray.from_arrays(pa.array(np.repeat(codes, sizes)),
                                          pa.array(list(key_index), pa.string())).cast(pa.string())
    n = int(sizes.sum())
    cols = const_columns(*ident, n) + [pa.array(steps), keys, pa.array(cls), pa.array(vals), pa.array(walls)]
    return pa.Table.from_arrays(cols, schema=CLASS_SCHEMA)


def events_table(ident: tuple[str, int, int], ebuf: Sequence[tuple[Any, ...]]) -> pa.Table:
    """Event rows as built by ``Run._add_event``."""
    cols = list(zip(*ebuf))
    arrays = const_columns(*ident, len(ebuf)) + [
        pa.array(cols[0], pa.int64()),
        *(pa.array(c, pa.string()) for c in cols[1:6]),
        pa.array(cols[6], pa.float64()),
    ]
    return pa.Table.from_arrays(arrays, schema=EVENTS_SCHEMA)


def salvage(
    build: Callable[[tuple[str, int, int], Sequence[Any]], pa.Table],
    ident: tuple[str, int, int],
    rows: Sequence[Any],
) -> tuple[pa.Table | None, list[Any]]:
    """``build(ident, rows)``; when that fails, the table of the rows that can be built
    on their own, and the rows that cannot."""
    try:
        return build(ident, rows), []
    except (OverflowError, ValueError, TypeError, pa.ArrowException):
        good, bad = [], []
        for row in rows:
            try:
                build(ident, [row])
            except (OverflowError, ValueError, TypeError, pa.ArrowException):
                bad.append(row)
            else:
                good.append(row)
        return (build(ident, good) if good else None), bad
