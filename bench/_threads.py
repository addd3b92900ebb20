"""Per-thread CPU time of this process, and the estimators the step-time benchmarks share.

:func:`thread_cpu` reads every thread's on-CPU time from Linux's
``/proc/self/task/<tid>/schedstat`` (nanoseconds; ``stat``'s utime + stime in clock
ticks where schedstat is missing) and names it: ``main`` for the main thread, the
``threading`` name for other Python threads, ``native:<comm>`` for threads Python
does not know (torch's intra-op pool, OpenMP). It is empty elsewhere than Linux.

:func:`cpu_delta` subtracts two readings, :func:`paired_bootstrap` gives a
confidence interval of a ratio of medians by resampling whole rounds (the steps of
one training are not independent, the rounds are closer to it).

:func:`block_ratios` and :func:`median_interval` are the paired estimator: one ratio
per block of adjacent trainings (``a / b - 1`` of a statistic of each training's steps),
then the median of those ratios and a 95% bootstrap interval of that median over the
blocks. A drift of the machine's speed slower than a block cancels in each ratio.
:func:`outliers` counts the steps far above their training's median (reported, never
dropped: the mean keeps them).
"""

from __future__ import annotations

import os
import random
import statistics
import threading
from typing import Callable, Sequence

TASKS = "/proc/self/task"


def _on_cpu(tid: int) -> float | None:
    try:
        with open(f"{TASKS}/{tid}/schedstat") as fh:
            return int(fh.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"{TASKS}/{tid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def thread_cpu() -> dict[int, tuple[str, float]]:
    """``{tid: (name, on-CPU seconds)}`` of every live thread of this process (empty off Linux)."""
    if not os.path.isdir(TASKS):
        return {}
    main = threading.main_thread().native_id
    named = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[int, tuple[str, float]] = {}
    for entry in os.listdir(TASKS):
        tid = int(entry)
        seconds = _on_cpu(tid)
        if seconds is None:
            continue
        if tid == main:
            name = "main"
        elif tid in named:
            name = named[tid]
        else:
            try:
                with open(f"{TASKS}/{tid}/comm") as fh:
                    name = "native:" + fh.read().strip()
            except OSError:
                name = "native:?"
        out[tid] = (name, seconds)
    return out


def cpu_delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per thread name between two readings (threads that ended in between are not counted;
    threads of one name, e.g. a pool, are summed; a run id at the end of a name is cut off)."""
    out: dict[str, float] = {}
    for tid, (name, seconds) in after.items():
        spent = seconds - before.get(tid, (name, 0.0))[1]
        key = _generic(name)
        out[key] = out.get(key, 0.0) + spent
    return out


def _generic(name: str) -> str:
    """``tracker-flush-20261201-232022-61873c`` -> ``tracker-flush``; other names unchanged."""
    if name.startswith("tracker-"):
        parts = name.split("-")
        while len(parts) > 2 and (parts[-1].isdigit() or _hexish(parts[-1])):
            parts.pop()
        return "-".join(parts)
    return name


def _hexish(part: str) -> bool:
    return len(part) == 6 and all(c in "0123456789abcdef" for c in part)


def background(per_thread: dict[str, float]) -> float:
    """The CPU seconds of the threads that are not the training's own (main and native threads)."""
    return sum(v for k, v in per_thread.items() if k != "main" and not k.startswith("native:"))


def paired_bootstrap(a_rounds: Sequence[Sequence[float]], b_rounds: Sequence[Sequence[float]],
                     reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% interval of ``median(a) / median(b) - 1`` (pooled steps) over rounds resampled in pairs."""
    rng = random.Random(seed)
    n = len(a_rounds)
    ratios = []
    for _ in range(reps):
        pick = [rng.randrange(n) for _ in range(n)]
        a = [x for i in pick for x in a_rounds[i]]
        b = [x for i in pick for x in b_rounds[i]]
        ratios.append(statistics.median(a) / statistics.median(b) - 1)
    ratios.sort()
    return ratios[int(0.025 * reps)], ratios[int(0.975 * reps) - 1]


def block_ratios(a_blocks: Sequence[Sequence[float]], b_blocks: Sequence[Sequence[float]],
                 stat: Callable[[Sequence[float]], float] = statistics.median) -> list[float]:
    """``stat(a_i) / stat(b_i) - 1`` for each block ``i`` (the two trainings of one block)."""
    if len(a_blocks) != len(b_blocks):
        raise ValueError(f"{len(a_blocks)} blocks against {len(b_blocks)}; the blocks must pair up")
    return [stat(a) / stat(b) - 1 for a, b in zip(a_blocks, b_blocks) if a and b]


def median_interval(ratios: Sequence[float], reps: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """The median of ``ratios`` and a 95% percentile-bootstrap interval of it (blocks resampled)."""
    if not ratios:
        return float("nan"), float("nan"), float("nan")
    rng = random.Random(seed)
    n = len(ratios)
    meds = sorted(statistics.median(rng.choices(ratios, k=n)) for _ in range(reps))
    return statistics.median(ratios), meds[int(0.025 * reps)], meds[int(0.975 * reps) - 1]


def outliers(steps: Sequence[float], factor: float = 1.5) -> tuple[int, float]:
    """Steps above ``factor`` x the median of ``steps``: how many, and the share of the total time
    they take beyond that median."""
    if not steps:
        return 0, 0.0
    med = statistics.median(steps)
    slow = [s for s in steps if s > factor * med]
    return len(slow), sum(s - med for s in slow) / sum(steps)
