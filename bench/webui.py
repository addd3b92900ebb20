"""Web UI benchmark: curves and per-class views of a run with 10 keys x 1,000,000 steps.

Run: ``python bench/webui.py`` (options: ``--steps``, ``--rebuild``, ``--repeat``).
``python bench/webui.py many-runs`` times the pages at many runs instead (10,000 runs,
50 x 100k points overlaid, group bands over 200 runs: see bench/webui_runs.py).

The store is built once and kept in ``bench/out/webui-<steps>/``: one run of 10
scalar keys logged at every step and an 80-class key logged every 10 steps,
written as spool Parquet chunks in the spool's own schema and ingested by
``Store.ingest()`` (the path a finished run takes). Then, server side:

* the first render of the curves page for one key: the query functions and the
  chart build (cold, nothing cached), and a whole AppTest run of the page;
* a zoom into 1,000 steps (full detail) and into 100,000 steps (downsampled);
* the per-class heatmap (classes x 200 step buckets) and the whole per-class page.

Targets: first render <= 1.5 s, zoom <= 0.5 s, heatmap <= 1.5 s. The script prints
wall and CPU seconds (medians; the CPU figure counts every thread of the process, so
it tells how much work a view costs even when other processes share the machine)
and the ratio to the target, and never fails on a missed target.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as ``python bench/webui.py``: bench/ must not shadow the standard library
# (bench/logging.py would stand in for ``logging``), and the repository root must import.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

import argparse
import os
import time
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from bench._timing import ensure_store, report, timed  # noqa: E402
from tracker import spool  # noqa: E402
from tracker.spool import SegmentInfo  # noqa: E402
from tracker.store import Store  # noqa: E402

RUN = "bench-1m"
KEYS = ["loss/total", "loss/box", "loss/cls", "loss/dfl", "lr", "grad_norm", "map50", "map50_95",
        "gpu_mem", "throughput"]
CLASS_KEY = "loss/cls_per_class"
CLASSES = 80
CLASS_EVERY = 10
CHUNK = 1_000_000
TARGETS = {"first render": 1.5, "zoom": 0.5, "heatmap": 1.5}


def _series(rng: np.random.Generator, steps: np.ndarray, i: int) -> np.ndarray:
    decay = np.exp(-steps / (150_000.0 * (1 + i % 3)))
    return (1.0 + i) * (0.2 + decay) * (1 + 0.05 * rng.standard_normal(steps.size))


def _write_metrics(folder: Path, steps_n: int, rng: np.random.Generator, t0: float) -> int:
    seq = 0
    for start in range(0, steps_n, CHUNK // len(KEYS)):
        steps = np.arange(start, min(steps_n, start + CHUNK // len(KEYS)), dtype=np.int64)
        n = steps.size * len(KEYS)
        table = pa.Table.from_arrays([
            pa.array([RUN] * n, pa.string()), pa.array(np.zeros(n, np.int32)), pa.array(np.zeros(n, np.int32)),
            pa.array(np.repeat(steps, len(KEYS))), pa.array(np.tile(np.array(KEYS, dtype=object), steps.size)),
            pa.array(np.stack([_series(rng, steps, i) for i in range(len(KEYS))], axis=1).reshape(-1)),
            pa.array(np.repeat(t0 + steps * 0.05, len(KEYS))),
        ], schema=spool.METRICS_SCHEMA)
        spool.atomic_write_table(folder / f"r0-s0000-{seq:06d}.metrics.parquet", table)
        seq += 1
    return seq


def _write_classes(folder: Path, steps_n: int, rng: np.random.Generator, t0: float, seq: int) -> None:
    base = np.linspace(0.05, 1.5, CLASSES)
    per_chunk = CHUNK // CLASSES
    logged = np.arange(0, steps_n, CLASS_EVERY, dtype=np.int64)
    for start in range(0, logged.size, per_chunk):
        steps = logged[start:start + per_chunk]
        n = steps.size * CLASSES
        values = base[None, :] * (0.3 + np.exp(-steps / 300_000.0))[:, None]
        values = values * (1 + 0.1 * rng.standard_normal(values.shape))
        table = pa.Table.from_arrays([
            pa.array([RUN] * n, pa.string()), pa.array(np.zeros(n, np.int32)), pa.array(np.zeros(n, np.int32)),
            pa.array(np.repeat(steps, CLASSES)), pa.array([CLASS_KEY] * n, pa.string()),
            pa.array(np.tile(np.arange(CLASSES, dtype=np.int32), steps.size)), pa.array(values.reshape(-1)),
            pa.array(np.repeat(t0 + steps * 0.05, CLASSES)),
        ], schema=spool.CLASS_SCHEMA)
        spool.atomic_write_table(folder / f"r0-s0000-{seq:06d}.class_metrics.parquet", table)
        seq += 1


def build(home: Path, steps_n: int) -> None:
    """Write the benchmark run as spool files and ingest them."""
    classes = [f"class{i:02d}" for i in range(CLASSES)]
    counts = [round(198 * 1326 ** (1 - i / (CLASSES - 1))) for i in range(CLASSES)]  # COCO's 1326:1 spread
    folder = spool.run_dir(home, RUN)
    folder.mkdir(parents=True)
    t0 = time.time() - steps_n * 0.05
    rng = np.random.default_rng(0)
    seq = _write_metrics(folder, steps_n, rng, t0)
    _write_classes(folder, steps_n, rng, t0, seq)
    meta = {"run_id": RUN, "project": "bench", "name": "1M steps", "status": "finished", "tags": ["bench"],
            "config": {"class_counts": counts, "loss": "bce"}, "classes": classes, "world_size": 1,
            "created_at": t0, "updated_at": t0 + steps_n * 0.05}
    spool.atomic_write_json(folder / "run.json", meta)
    SegmentInfo(run_id=RUN, rank=0, segment=0, start_step=0, reason="start", started_at=t0,
                last_step=steps_n - 1, ended_at=t0 + steps_n * 0.05, heartbeat=t0 + steps_n * 0.05).save(home)
    ingested = Store(home).ingest(timeout=60)
    print(f"  ingested {ingested.rows:,} rows from {ingested.files} files")


def query_level(store: Store, repeat: int) -> dict[str, tuple[float, float]]:
    """The query functions plus the chart build, with Streamlit out of the way."""
    import altair as alt

    from webui import charts, class_charts, class_queries, queries

    alt.data_transformers.disable_max_rows()  # as in the app: Streamlit ships the rows as Arrow

    def first_render() -> Any:
        context = queries.curve_context(store, [RUN], "loss/total")
        view = queries.curve_view(store, [RUN], context.key or "", buckets=queries.DEFAULT_BUCKETS)
        labels = queries.run_labels(view.info)
        frame = charts.curve_frame(queries.smooth(view.points, 0.6), labels, log_y=False)
        return charts.curve_chart(frame, charts.CurveStyle(smoothing=0.6), key="loss/total", labels=labels,
                                  marks=view.marks).to_dict()

    def zoom(lo: int, hi: int) -> Callable[[], Any]:
        def run() -> Any:
            view = queries.curve_view(store, [RUN], "loss/total", lo=lo, hi=hi)
            points = queries.smooth(view.points, 0.6)
            return charts.curve_chart(charts.curve_frame(points, {RUN: "1M"}, log_y=False),
                                      charts.CurveStyle(smoothing=0.6), key="loss/total").to_dict()
        return run

    def heatmap() -> Any:
        view = class_queries.class_view(store, RUN, CLASS_KEY, buckets=200, last_steps=1000)
        return class_charts.heatmap_chart(view.cells, key=CLASS_KEY).to_dict()

    out = {}
    out["first render (query + chart)"] = timed(first_render, repeat)
    out["zoom 1,000 steps (full detail)"] = timed(zoom(500_000, 500_999), repeat)
    out["zoom 100,000 steps (downsampled)"] = timed(zoom(400_000, 499_999), repeat)
    out["heatmap 80 x 200 + ranking (query + chart)"] = timed(heatmap, repeat)
    return out


def app_level(home: Path) -> dict[str, tuple[float, float]]:
    """Whole AppTest runs of the pages (imports warmed up first; caches cleared)."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    app = str(ROOT / "webui" / "streamlit_app.py")
    os.environ["TRACKER_HOME"] = str(home)

    def page(name: str, **params: Any) -> AppTest:
        at = AppTest.from_file(app, default_timeout=120)
        at.query_params.update(params)
        at.switch_page(f"views/{name}.py")
        return at

    page("sql").run()  # imports and the first connection
    out = {}
    st.cache_data.clear()
    at = page("curves", run=RUN, key="loss/total")
    out["curves page, first render (AppTest)"] = timed(at.run, 1)
    slider = next(s for s in at.slider if s.label.startswith("Step range"))
    slider.set_value((500_000, 500_999))
    out["curves page, zoom to 1,000 steps (AppTest)"] = timed(at.run, 1)
    st.cache_data.clear()
    at = page("classes", run=RUN)
    out["per-class page, whole (AppTest)"] = timed(at.run, 1)
    assert not at.exception, [e.value for e in at.exception]
    return out


def main() -> None:
    """Build the store if needed, time the views, print figures and ratios to target."""
    if sys.argv[1:2] == ["many-runs"]:  # the many-runs figures: bench/webui_runs.py
        import importlib.util

        spec = importlib.util.spec_from_file_location("webui_runs", ROOT / "bench" / "webui_runs.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        module.main()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    home = ROOT / "bench" / "out" / f"webui-{args.steps}"
    ensure_store(home, args.rebuild, lambda h: build(h, args.steps))
    store = Store(home)
    n = store.query("SELECT count(*) AS n FROM metrics")["n"][0]
    c = store.query("SELECT count(*) AS n FROM class_metrics")["n"][0]
    print(f"store: {n:,} scalar rows ({len(KEYS)} keys x {args.steps:,} steps), {c:,} per-class rows")
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} CPUs, load average {load:.1f} at start (figures are medians of "
          f"{args.repeat}; other processes on the machine slow them down)")
    figures = {**query_level(store, args.repeat), **app_level(home)}
    report(figures, TARGETS, "CPU, both cores")


if __name__ == "__main__":
    main()
