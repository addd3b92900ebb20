"""Benchmark: importing TensorBoard history against tbparse reading it, in one run.

Writes one run of 100,000 scalar points (10 tags x 10,000 steps) with PyTorch's
``SummaryWriter`` and copies its event file into ``--runs`` run folders (10 by
default: 1,000,000 points), then times, interleaved over ``--rounds`` rounds:

* ``tbparse.SummaryReader(logdir).scalars`` (reads every point into pandas);
* ``tracker import tensorboard logdir`` in-process: read, check, plan and write
  the runs into a fresh store, where they are queryable at once;
* the same plus ingestion into the DuckDB file.

Target: the import at least 3x faster than tbparse.

Run: ``.venv/bin/python -m bench.imports [--runs 10] [--rounds 1]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracker.importer import NullReporter, import_runs  # noqa: E402

STEPS, TAGS = 10_000, 10


def write_logdir(root: Path, runs: int) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    logdir = root / "logs"
    w = SummaryWriter(str(logdir / "run-0"), max_queue=100_000, flush_secs=600)
    for step in range(STEPS):
        for k in range(TAGS):
            w.add_scalar(f"loss/k{k}", 1.0 / (step + 1) + k, step)
    w.close()
    event = next((logdir / "run-0").iterdir())
    for i in range(1, runs):
        (logdir / f"run-{i}").mkdir()
        shutil.copy(event, logdir / f"run-{i}" / event.name)
    return logdir


def time_tbparse(logdir: Path) -> tuple[float, int]:
    from tbparse import SummaryReader

    t0 = time.perf_counter()
    n = len(SummaryReader(str(logdir)).scalars)
    return time.perf_counter() - t0, n


def time_import(logdir: Path, ingest: bool) -> tuple[float, int]:
    from plugins.importers.tensorboard import TensorBoardImporter
    from tracker.store import Store, release

    home = Path(tempfile.mkdtemp(prefix="tracker-import-"))
    try:
        t0 = time.perf_counter()
        runs = list(TensorBoardImporter().read(NullReporter(), logdir=logdir))
        plans = import_runs(runs, home)
        if ingest:
            Store(home).ingest()
        dt = time.perf_counter() - t0
        n = int(Store(home).query("SELECT count(*) AS n FROM curves")["n"][0])
        release()
        assert n == sum(p.points for p in plans)
        return dt, n
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tracker-bench-tb-"))
    try:
        logdir = write_logdir(root, args.runs)
        times: dict[str, list[float]] = {"tbparse .scalars": [], "tracker import": [], "tracker import + ingest": []}
        points = {}
        for _ in range(args.rounds):
            for label, fn in (("tbparse .scalars", lambda: time_tbparse(logdir)),
                              ("tracker import", lambda: time_import(logdir, False)),
                              ("tracker import + ingest", lambda: time_import(logdir, True))):
                dt, n = fn()
                times[label].append(dt)
                points[label] = n
        base = statistics.median(times["tbparse .scalars"])
        print(f"{args.runs * STEPS * TAGS:,} points in {args.runs} runs, median of {args.rounds} round(s)")
        for label, ts in times.items():
            med = statistics.median(ts)
            print(f"  {label:<26} {med:7.2f} s  {points[label]:>9,} points  {base / med:5.1f}x tbparse")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
