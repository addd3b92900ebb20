"""Benchmark: what ``run.log_embeddings`` costs the training thread, against a plain copy of z to host.

For each shape (a batch of N embeddings of D dimensions) and input kind (a numpy
array, a CPU torch tensor, a CUDA tensor where there is one), two measurements:

* tight loop: ``calls`` back-to-back calls of the plain copy of z to host that a
  user would make anyway (``np.array(z, copy=True)``, ``z.detach().clone()``,
  ``z.detach().cpu()``) against ``run.log_embeddings("z", z, step=i)`` at its
  defaults (window 25,600, an evaluation every 1,024 samples) with its worker
  running beside it: microseconds per call and the training thread's own CPU time
  per call. An upper bound: the worker competes for the GIL with a loop that does
  nothing else;
* training loop: each step waits ``STEP_MS`` for "the device" (a sleep, as a
  training thread waits for its GPU, GIL released), then makes the copy or calls
  ``log_embeddings``: the extra microseconds per step over a step that does
  neither, and their ratio (target: about 1, "at most the copy").

Medians of 5 alternating rounds. Read back: after ``finish()`` the store holds
three rows per evaluation the worker made. Then the worker's cost: adding a batch
of 256 rows to a full window and one evaluation (RankMe, std, dead dims), which
bound how fast a run it keeps up with.

Run: ``.venv/bin/python -m bench.embeddings`` (``--quick``: fewer calls and shapes).
"""

from __future__ import annotations

import os
import statistics as stats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = ((256, 128), (256, 2048), (1024, 2048))
CALLS = 200
ROUNDS = 5
STEP_MS = 5.0


def _inputs(n: int, d: int) -> dict[str, tuple[Any, Callable[[Any], Any]]]:
    """Input kind -> (z, the plain copy to host)."""
    z = np.random.default_rng(0).normal(size=(n, d)).astype(np.float32)
    out: dict[str, tuple[Any, Callable[[Any], Any]]] = {"numpy": (z, lambda a: np.array(a, copy=True))}
    try:
        import torch
    except ImportError:
        return out
    t = torch.from_numpy(z.copy())
    out["torch cpu"] = (t, lambda a: a.detach().clone())
    if torch.cuda.is_available():
        g = t.cuda()

        def to_host(a: Any) -> Any:
            return a.detach().cpu()

        out["torch cuda"] = (g, to_host)
    return out


def _tight(fn: Callable[[int], None], calls: int) -> tuple[float, float]:
    """(wall us per call, training-thread CPU us per call) of back-to-back calls."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - wall) / calls * 1e6, (time.thread_time() - cpu) / calls * 1e6


def _steps(fn: Callable[[int], None] | None, calls: int) -> float:
    """Wall us per training step: wait for the device, then ``fn`` (nothing when None)."""
    pause = STEP_MS / 1000
    t0 = time.perf_counter()
    for i in range(calls):
        time.sleep(pause)
        if fn is not None:
            fn(i)
    return (time.perf_counter() - t0) / calls * 1e6


def _logged(run: Any) -> int:
    """Statistic rows of ``run`` in the store, checked against the worker's evaluations."""
    import tracker

    rows = int(tracker.query("SELECT count(*) AS n FROM curves WHERE run_id = ? AND key LIKE 'z/%'",
                             [run.run_id])["n"][0])
    if rows != 3 * run._embeddings.evaluations:
        raise AssertionError(f"read back {rows} statistic rows for {run._embeddings.evaluations} evaluations")
    return rows


def measure(z: Any, copy: Callable[[Any], Any], calls: int) -> dict[str, float]:
    """Median figures over ROUNDS alternating rounds of the copy and of log_embeddings."""
    import tracker

    figures: dict[str, list[float]] = {k: [] for k in ("copy", "log", "cpu", "base", "step_copy", "step_log")}
    logged = 0
    for _ in range(ROUNDS):
        figures["copy"].append(_tight(lambda i: copy(z), calls)[0])
        run = tracker.init("bench-embeddings", config={}, loggers=["store"], system=False)
        wall, cpu = _tight(lambda i: run.log_embeddings("z", z, step=i), calls)
        figures["log"].append(wall)
        figures["cpu"].append(cpu)
        run.finish()
        logged += _logged(run)
        figures["base"].append(_steps(None, calls))
        figures["step_copy"].append(_steps(lambda i: copy(z), calls))
        run = tracker.init("bench-embeddings", config={}, loggers=["store"], system=False)
        figures["step_log"].append(_steps(lambda i: run.log_embeddings("z", z, step=i), calls))
        run.finish()
        logged += _logged(run)
    m = {k: stats.median(v) for k, v in figures.items()}
    extra_copy, extra_log = m["step_copy"] - m["base"], m["step_log"] - m["base"]
    return {"copy_us": m["copy"], "log_us": m["log"], "cpu_us": m["cpu"], "ratio": m["log"] / m["copy"],
            "extra_copy": extra_copy, "extra_log": extra_log,
            "step_ratio": extra_log / extra_copy if extra_copy > 0 else float("nan"), "logged": logged}


def worker_cost(d: int, window: int = 25_600, batch: int = 256) -> tuple[float, float]:
    """Seconds for the worker to add a batch to a full window, and to evaluate the window."""
    from tracker.embedding_window import Window

    state = Window(key="z", dim=d, window=window, gamma=1.0, every=1024)
    rng = np.random.default_rng(1)
    for _ in range(window // batch + 1):
        state.add(rng.normal(size=(batch, d)).astype(np.float32))
    z = rng.normal(size=(batch, d)).astype(np.float32)
    t0 = time.perf_counter()
    state.add(z)
    add_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    state.evaluate()
    return add_s, time.perf_counter() - t0


def main() -> None:
    """Print the tables."""
    quick = "--quick" in sys.argv
    os.environ["TRACKER_HOME"] = tempfile.mkdtemp(prefix="tracker-bench-embeddings-")
    os.environ["TRACKER_SYSTEM"] = "0"
    shapes = SHAPES[:2] if quick else SHAPES
    calls = 50 if quick else CALLS
    print(f"run.log_embeddings on the training thread vs a plain copy of z to host ({calls} calls, median of "
          f"{ROUNDS} rounds; defaults: window 25,600, every 1,024 samples)")
    print(f"{'':19} {'tight loop, us per call':^44} | {f'training loop ({STEP_MS:g} ms steps), extra us':^36}")
    print(f"{'N x D':>12} {'input':>11} {'copy':>8} {'log':>9} {'thread CPU':>11} {'ratio':>6}     | "
          f"{'copy':>8} {'log':>9} {'ratio':>6} {'stats rows':>11}")
    for n, d in shapes:
        for kind, (z, copy) in _inputs(n, d).items():
            m = measure(z, copy, calls)
            print(f"{n:>5} x {d:<5} {kind:>11} {m['copy_us']:8.1f} {m['log_us']:9.1f} {m['cpu_us']:11.1f} "
                  f"{m['ratio']:6.2f}     | {m['extra_copy']:8.1f} {m['extra_log']:9.1f} {m['step_ratio']:6.2f} "
                  f"{m['logged']:11d}")
    print("\nthe worker, off the training thread (window 25,600 samples, batches of 256):")
    for d in (128, 512, 2048) if not quick else (128, 512):
        add_s, eval_s = worker_cost(d)
        per_sample = add_s / 256 + eval_s / 1024
        print(f"  D = {d:>4}: add a batch {add_s * 1e3:7.1f} ms, evaluate {eval_s * 1e3:8.1f} ms; keeps up with "
              f"{1 / per_sample:,.0f} samples/s at every=1,024 (more often than that, it evaluates less often)")


if __name__ == "__main__":
    main()
