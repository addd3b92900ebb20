"""Benchmark: what ``run.log_embeddings`` costs the training thread, against a plain copy of z to host.

For each shape (a batch of N embeddings of D dimensions) and input kind (a numpy
array, a CPU torch tensor, a CUDA tensor where there is one), against the copy a
user would make anyway (named in the output: ``np.array(z, copy=True)`` for numpy,
``z.detach().clone()`` for a CPU tensor, whose ``.cpu()`` copies nothing, and
``z.detach().cpu()`` for a CUDA tensor):

* the parts of one call, each in a tight loop of ``calls`` calls: ``run.py``, the
  Run's own checks before it hands over (``run.log_embeddings`` with the monitor's
  ``submit`` a no-op: tracker/run.py, not this bench's subject), and ``submit``,
  what :mod:`tracker.embeddings` does on the training thread (the copy into a
  recycled buffer and the queue append) with no worker beside it, each buffer
  given back at once (as the copy's own memory goes back to malloc: both copy
  into memory the loop just used);
* tight loop: the whole call at defaults (window 25,600, an evaluation every 1,024
  samples) with the worker running, after ``calls`` warm-up calls the worker took
  in (a run's first calls allocate the buffers that later ones recycle): microseconds per call and the training thread's
  own CPU time per call. An upper bound: the worker competes for the GIL with a
  loop that does nothing else;
* training loop: each step waits ``STEP_MS`` for "the device" (a sleep, as a
  training thread waits for its GPU, GIL released), then makes the copy or calls
  ``log_embeddings``: the extra microseconds per step over a step that does
  neither, and their ratio (target: about 1, "at most the copy").

Medians of 5 alternating rounds. Read back: after ``finish()`` the store holds
three rows per evaluation the worker made; and for each input kind, a run of
distinct batches (window 2,048, every 512, waiting for the worker after each call
so that nothing is dropped) whose stored ``z/rankme``, ``z/std`` and
``z/dead_dims`` must equal :func:`tracker.embedding_window.statistics` of the last
2,048 rows at each evaluation's step (relative 1e-6). Then the worker's cost:
adding a batch of 256 rows to a full window and one evaluation (RankMe, std, dead
dims), which bound how fast a run it keeps up with.

Run: ``.venv/bin/python -m bench.embeddings`` (``--quick``: fewer calls and shapes).
"""

from __future__ import annotations

import math
import os
import statistics as stats
import sys
import tempfile
import threading
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
WARM_S = 5.0


REFERENCE = {"numpy": "np.array(z, copy=True)", "torch cpu": "z.detach().clone()",
             "torch cuda": "z.detach().cpu()"}


def _kinds() -> dict[str, Callable[[np.ndarray], Any]]:
    """Input kind -> how to make z of that kind from a float32 array."""
    out: dict[str, Callable[[np.ndarray], Any]] = {"numpy": lambda a: a.copy()}
    try:
        import torch
    except ImportError:
        return out
    out["torch cpu"] = lambda a: torch.from_numpy(a.copy())
    if torch.cuda.is_available():
        out["torch cuda"] = lambda a: torch.from_numpy(a.copy()).cuda()
    return out


def _copy_of(kind: str) -> Callable[[Any], Any]:
    """The plain copy to host of :data:`REFERENCE`."""
    if kind == "numpy":
        return lambda a: np.array(a, copy=True)
    if kind == "torch cpu":
        return lambda a: a.detach().clone()
    return lambda a: a.detach().cpu()


def _inputs(n: int, d: int) -> dict[str, tuple[Any, Callable[[Any], Any]]]:
    """Input kind -> (z, the plain copy to host)."""
    z = np.random.default_rng(0).normal(size=(n, d)).astype(np.float32)
    return {kind: (make(z), _copy_of(kind)) for kind, make in _kinds().items()}


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


def _parts(z: Any, calls: int) -> tuple[float, float]:
    """(us per call of run.py's part, us per call of the monitor's submit), no worker running."""
    import tracker
    from tracker.embeddings import monitor

    run = tracker.init("bench-embeddings", config={}, loggers=["store"], system=False)
    mon = monitor(run)
    mon._thread = threading.current_thread()  # no worker: finish() does its work on this thread
    submit = mon.submit
    mon.submit = lambda *args: None  # type: ignore[method-assign]
    run_py = _tight(lambda i: run.log_embeddings("z", z, step=i), calls)[0]
    mon.submit = submit  # type: ignore[method-assign]
    submit("z", z, 0)
    slot = mon._slots["z"]

    def recycled(i: int) -> None:  # the buffer comes back at once, as the copy's own memory does to malloc
        submit("z", z, i)
        while slot.queue:
                _, buf, rows, free = slot.queue.popleft()
                slot.taken += rows
                free.append(buf)

    own = _tight(recycled, calls)[0]
    run.finish()
    return run_py, own


def _warm(z: Any, calls: int) -> Any:
    """A run that logged ``calls`` batches of ``z``, given up to WARM_S for its worker to take
    them in: its recycled buffers exist, so the timed calls see the steady state (a run's first
    calls allocate them; at large D the worker cannot take them all in that time, and the timed
    calls also pay for what a worker that falls behind costs)."""
    import tracker
    from tracker.embeddings import wait

    run = tracker.init("bench-embeddings", config={}, loggers=["store"], system=False)
    for i in range(calls):
        run.log_embeddings("z", z, step=i)
    wait(run, WARM_S)
    return run


def measure(z: Any, copy: Callable[[Any], Any], calls: int) -> dict[str, float]:
    """Median figures over ROUNDS alternating rounds of the copy and of log_embeddings."""
    import tracker

    names = ("copy", "run_py", "submit", "log", "cpu", "base", "step_copy", "step_log")
    figures: dict[str, list[float]] = {k: [] for k in names}
    logged = 0
    for _ in range(ROUNDS):
        figures["copy"].append(_tight(lambda i: copy(z), calls)[0])
        run_py, own = _parts(z, calls)
        figures["run_py"].append(run_py)
        figures["submit"].append(own)
        run = _warm(z, calls)
        wall, cpu = _tight(lambda i: run.log_embeddings("z", z, step=calls + i), calls)
        figures["log"].append(wall)
        figures["cpu"].append(cpu)
        run.finish()
        logged += _logged(run)
        figures["base"].append(_steps(None, calls))
        figures["step_copy"].append(_steps(lambda i: copy(z), calls))
        run = _warm(z, calls)
        figures["step_log"].append(_steps(lambda i: run.log_embeddings("z", z, step=calls + i), calls))
        run.finish()
        logged += _logged(run)
    m = {k: stats.median(v) for k, v in figures.items()}
    extra_copy, extra_log = m["step_copy"] - m["base"], m["step_log"] - m["base"]
    return {"copy_us": m["copy"], "run_py_us": m["run_py"], "submit_us": m["submit"], "log_us": m["log"],
            "cpu_us": m["cpu"], "ratio": m["log"] / m["copy"], "submit_ratio": m["submit"] / m["copy"],
            "extra_copy": extra_copy, "extra_log": extra_log,
            "step_ratio": extra_log / extra_copy if extra_copy > 0 else float("nan"), "logged": logged}


def check_statistics(kind: str, make: Callable[[np.ndarray], Any], n: int = 256, d: int = 128,
                     window: int = 2048, every: int = 512, calls: int = 24) -> int:
    """Log distinct batches, read the stored statistics back and compare each point with a direct
    computation on the last ``window`` rows at its step; the number of points compared."""
    import tracker
    from tracker.embedding_window import statistics
    from tracker.embeddings import wait

    rng = np.random.default_rng(7)
    batches = [(rng.normal(size=(n, d)) * rng.uniform(0.2, 2.0, d)).astype(np.float32) for _ in range(calls)]
    run = tracker.init("bench-embeddings-check", config={}, loggers=["store"], system=False)
    for step, z in enumerate(batches):
        run.log_embeddings("z", make(z), step=step, window=window, every=every)
        if not wait(run):
            raise AssertionError("the embeddings worker did not keep up within 30 s")
    run.finish()
    stored = tracker.query("SELECT step, key, value FROM curves WHERE run_id = ? AND key LIKE 'z/%' ORDER BY step",
                           [run.run_id])
    points = 0
    for step in sorted(set(stored["step"].to_list())):
        rows = np.concatenate(batches[: step + 1])[-window:]
        expected = statistics(rows, gamma=1.0)
        at = stored.filter(stored["step"] == step)
        got = dict(zip((k.split("/", 1)[1] for k in at["key"]), at["value"]))
        for name, value in expected.items():
            if not math.isclose(got.get(name, math.nan), value, rel_tol=1e-6, abs_tol=1e-12):
                raise AssertionError(f"{kind}: stored z/{name} at step {step} is {got.get(name)}; a direct "
                                     f"computation on the last {window} rows gives {value}")
            points += 1
    if points != 3 * (calls * n // every):  # n < every: one evaluation each `every` samples, none dropped
        raise AssertionError(f"{kind}: only {points // 3} evaluations stored for {calls * n} samples, every {every}")
    return points


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
    print("the copy: " + "; ".join(f"{kind}: {REFERENCE[kind]}" for kind in _kinds()))
    print(f"{'':25} {'parts of a call, no worker, us':^35} | {'whole call, worker running, us':^36} | "
          f"{f'training loop ({STEP_MS:g} ms steps), extra us':^33}")
    print(f"{'N x D':>12} {'input':>11} {'copy':>8} {'run.py':>8} {'submit':>8} {'ratio':>7}  | {'log':>9} "
          f"{'thread CPU':>11} {'ratio':>6}       | {'copy':>8} {'log':>9} {'ratio':>6} {'stats rows':>11}")
    for n, d in shapes:
        for kind, (z, copy) in _inputs(n, d).items():
            m = measure(z, copy, calls)
            print(f"{n:>5} x {d:<5} {kind:>11} {m['copy_us']:8.1f} {m['run_py_us']:8.1f} {m['submit_us']:8.1f} "
                  f"{m['submit_ratio']:7.2f}  | {m['log_us']:9.1f} {m['cpu_us']:11.1f} {m['ratio']:6.2f}       | "
                  f"{m['extra_copy']:8.1f} {m['extra_log']:9.1f} {m['step_ratio']:6.2f} {m['logged']:11d}")
    print("(ratio: submit / copy, log / copy; run.py: the Run's checks before it hands z over, tracker/run.py)")
    print("\nread back: stored statistics against a direct computation on the window's rows (256 x 128 batches, "
          "window 2,048, every 512):")
    for kind, make in _kinds().items():
        print(f"  {kind:>11}: {check_statistics(kind, make)} stored points equal statistics() of the last 2,048 "
              "rows (rel 1e-6)")
    print("\nthe worker, off the training thread (window 25,600 samples, batches of 256):")
    for d in (128, 512, 2048) if not quick else (128, 512):
        add_s, eval_s = worker_cost(d)
        per_sample = add_s / 256 + eval_s / 1024
        print(f"  D = {d:>4}: add a batch {add_s * 1e3:7.1f} ms, evaluate {eval_s * 1e3:8.1f} ms; keeps up with "
              f"{1 / per_sample:,.0f} samples/s at every=1,024 (more often than that, it evaluates less often)")


if __name__ == "__main__":
    main()
