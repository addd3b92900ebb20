"""What the web UI benchmarks share: the store built once, median timing, the figures table.

``bench/webui.py`` and ``bench/webui_runs.py`` time plain calls with :func:`timed` and
print them with :func:`report`: one row a figure, wall and CPU seconds (medians; the CPU
figure counts every thread of the process) and the ratio to the figure's target. A row
whose name starts with two spaces is a part of the row above it and gets no ratio.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds (all threads of this process) of ``repeat`` calls."""
    walls, cpus = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def ensure_store(home: Path, rebuild: bool, build: Callable[[Path], None]) -> None:
    """Build the store in ``home`` with ``build`` unless it holds one already (or ``rebuild``)."""
    if rebuild and home.exists():
        shutil.rmtree(home)
    if not (home / "tracker.duckdb").exists():
        if home.exists():
            shutil.rmtree(home)
        print(f"building the store in {home} (once) ...")
        t = time.perf_counter()
        build(home)
        print(f"  built in {time.perf_counter() - t:.1f} s")


def report(figures: Mapping[str, tuple[float, float]], targets: Mapping[str, float], cpu_title: str) -> None:
    """Print the load at the end and a row a figure; ``targets`` maps a part of a name to seconds."""
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    width = max(map(len, figures))
    print(f"  {'':<{width}}     wall    ({cpu_title})")
    for name, (seconds, cpu) in figures.items():
        target = None if name.startswith("  ") else next((v for k, v in targets.items() if k in name), None)
        ratio = f"  {seconds / target:.2f} x the {target:g} s target" if target else ""
        print(f"  {name:<{width}}  {seconds:6.3f} s  ({cpu:6.3f} s){ratio}")
