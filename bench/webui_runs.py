"""Web UI benchmark at many runs: the runs page and ``tracker runs list`` at 10,000 runs,
the curves page with 50 runs x 100,000 points overlaid, group bands over 200 runs.

Run: ``python bench/webui_runs.py`` (or ``python bench/webui.py many-runs ...``; options:
``--runs``, ``--repeat``, ``--rebuild``).

The store is built once in ``bench/out/webui-runs-<runs>/``, written straight into the
DuckDB file's tables (the state of a store whose runs are all ingested): ``--runs``
runs of 100 steps of ``loss`` and ``epoch`` with configs ``loss.scheme`` (4 values),
``loss.beta`` and ``seed``, plus 50 runs of 100,000 steps of ``loss``. Each figure is
the median of ``--repeat`` first renders (nothing cached): the query functions plus the
chart spec (``to_dict()``) or the table frame, and for the CLI the whole process.
Targets: runs page <= 1 s, runs list <= 1 s, curves 50 x 100k <= 1.5 s, bands over
200 runs <= 1.5 s. The script prints wall and CPU seconds, the ratio to the target and
where the time goes (query vs. frame/chart), and never fails on a missed target.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench._timing import ensure_store, report, timed  # noqa: E402
from tracker.store import Store  # noqa: E402

SCHEMES = ("ce", "focal", "eqlv2", "cw-bce")
LONG_RUNS, LONG_STEPS, SHORT_STEPS = 50, 100_000, 100
TARGETS = {"runs page": 1.0, "runs list": 1.0, "curves": 1.5, "bands": 1.5}


def _run_rows(n: int, t0: float) -> pa.Table:
    ids = [f"r{i:05d}" for i in range(n)] + [f"long{i:02d}" for i in range(LONG_RUNS)]
    configs = [json.dumps({"loss": {"scheme": SCHEMES[i % 4], "beta": 0.9 + 0.01 * (i % 3)}, "seed": i // 12,
                           "lr": 0.01, "epochs": 100}) for i in range(len(ids))]
    created = [t0 + i for i in range(len(ids))]
    ts = pa.array((np.array(created) * 1e6).astype(np.int64), pa.timestamp("us"))
    return pa.table({
        "run_id": ids, "project": ["bench"] * len(ids), "name": ids, "status": ["finished"] * len(ids),
        "created_at": ts, "updated_at": ts, "config": configs, "tags": [["bench"]] * len(ids),
    })


def build(home: Path, n: int) -> None:
    """Write ``n`` short runs and the long runs into the store's tables."""
    store = Store(home)
    t0 = time.time() - 86_400
    runs = _run_rows(n, t0)
    rng = np.random.default_rng(0)
    with store.connect(write=True) as con:
        con.register("_runs", runs)
        con.execute("INSERT INTO runs (run_id, project, name, status, created_at, updated_at, config, tags) "
                    "SELECT * FROM _runs")
        con.execute("INSERT INTO segments SELECT run_id, 0, 0, 0, NULL, created_at, updated_at, 'start' FROM _runs")
        con.unregister("_runs")
        ids = np.array([f"r{i:05d}" for i in range(n)], dtype=object)
        steps = np.tile(np.arange(SHORT_STEPS, dtype=np.int64), n)
        scheme_scale = np.repeat(1.0 + (np.arange(n) % 4) * 0.1, SHORT_STEPS)
        loss = scheme_scale / (1 + steps / 10) * (1 + 0.05 * rng.standard_normal(steps.size))
        for key, values in (("loss", loss), ("epoch", (steps // 10).astype(np.float64))):
            con.register("_m", pa.table({
                "run_id": np.repeat(ids, SHORT_STEPS), "rank": np.zeros(steps.size, np.int32),
                "segment": np.zeros(steps.size, np.int32), "step": steps, "key": [key] * steps.size,
                "value": values, "wall_time": t0 + steps.astype(np.float64)}))
            con.execute("INSERT INTO metrics SELECT * FROM _m ORDER BY run_id, key, step")
            con.unregister("_m")
        for i in range(LONG_RUNS):
            s = np.arange(LONG_STEPS, dtype=np.int64)
            con.register("_m", pa.table({
                "run_id": [f"long{i:02d}"] * s.size, "rank": np.zeros(s.size, np.int32),
                "segment": np.zeros(s.size, np.int32), "step": s, "key": ["loss"] * s.size,
                "value": (1 + i * 0.01) * (0.2 + np.exp(-s / 30_000)) * (1 + 0.05 * rng.standard_normal(s.size)),
                "wall_time": t0 + s * 0.05}))
            con.execute("INSERT INTO metrics SELECT * FROM _m")
            con.unregister("_m")
        con.execute("UPDATE segments SET end_step = CASE WHEN run_id LIKE 'long%' THEN "
                    f"{LONG_STEPS - 1} ELSE {SHORT_STEPS - 1} END")


def figures(home: Path, n: int, repeat: int) -> dict[str, tuple[float, float]]:
    """The four figures and their parts (query alone, the rest)."""
    import altair as alt

    from tracker.store.local import release
    from webui import charts, grouped, queries

    alt.data_transformers.disable_max_rows()
    store = Store(home)
    longs = [f"long{i:02d}" for i in range(LONG_RUNS)]
    band_runs = [f"r{i:05d}" for i in range(200)]

    def cold(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            release()  # no cached reader: each render opens the store as a fresh page load does
            return fn()
        return run

    def runs_page() -> Any:
        return queries.config_columns(queries.runs_table(store)).drop("config")

    def curves_query() -> Any:
        return queries.curve_view(store, longs, "loss", buckets=queries.DEFAULT_BUCKETS)

    def curves_page() -> Any:
        view = curves_query()
        labels = queries.run_labels(view.info)
        frame = charts.curve_frame(queries.smooth(view.points, 0.6), labels, log_y=False, marks=view.marks)
        return charts.curve_chart(frame, charts.CurveStyle(smoothing=0.6), key="loss", labels=labels,
                                  marks=view.marks).to_dict()

    def bands_query() -> Any:
        return grouped.group_bands(store, band_runs, ["loss.scheme"], "loss", buckets=200)

    def bands_page() -> Any:
        frame = grouped.band_frame(bands_query(), "minmax")
        return grouped.band_chart(frame, key="loss", x_title="step").to_dict()

    def cli() -> Any:
        env = {**os.environ, "TRACKER_HOME": str(home)}
        subprocess.run([sys.executable, "-m", "tracker.cli", "runs", "list", "--format", "csv"], env=env,
                       stdout=subprocess.DEVNULL, check=True)

    total = n + LONG_RUNS
    return {
        f"runs page, {total:,} runs (query + table frame)": timed(cold(runs_page), repeat),
        "  of which the runs_table query": timed(cold(lambda: queries.runs_table(store)), repeat),
        f"runs list, {total:,} runs (whole process)": timed(cli, repeat),
        f"curves, {LONG_RUNS} runs x {LONG_STEPS:,} points (query + chart)": timed(cold(curves_page), repeat),
        "  of which the curve_view query": timed(cold(curves_query), repeat),
        "bands over 200 runs, 4 groups (query + chart)": timed(cold(bands_page), repeat),
        "  of which the group_bands query": timed(cold(bands_query), repeat),
    }


def main() -> None:
    """Build the store if needed, time the views, print figures and ratios to target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000 - LONG_RUNS, help="short runs (plus 50 long ones)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args(sys.argv[2:] if sys.argv[1:2] == ["many-runs"] else None)
    home = ROOT / "bench" / "out" / f"webui-runs-{args.runs}"
    ensure_store(home, args.rebuild, lambda h: build(h, args.runs))
    n = Store(home).query("SELECT count(*) AS n FROM metrics")["n"][0]
    print(f"store: {args.runs + LONG_RUNS:,} runs, {n:,} scalar rows")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start "
          f"(medians of {args.repeat}; other processes on the machine slow them down)")
    report(figures(home, args.runs, args.repeat), TARGETS, "CPU, all threads")


if __name__ == "__main__":
    main()
