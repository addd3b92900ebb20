"""Benchmark: what ``run.log_embeddings`` costs the training thread, against the copy of z to host memory.

The target (issue 29): the cost on the training thread is at most the copy of ``z``
to host memory. The copy is the cheapest correct one, into memory allocated once:
``np.copyto(buf, z)`` into a preallocated array for a numpy ``z``,
``buf.copy_(z)`` into a preallocated host tensor for a torch ``z`` (pinned for a
CUDA tensor, where there is one).

Both are timed inside a loop that looks like training: each step is a real SimSiam
step (torch on the CPU, one intra-op thread; a small MLP on scikit-learn's digits,
two augmented views, a predictor, negative cosine with the stop-gradient, SGD),
whose projector gives ``z`` of N x D; after the step the loop makes the copy, or
calls ``run.log_embeddings("z", z, step=i)`` at defaults (window 25,600, an
evaluation every 1,024 samples) with the run's worker running beside it, so the
worker's work overlaps real steps as it would. A third loop does neither. Each
timed call is bracketed by ``time.perf_counter()``; the figures are the median and
mean per call over ROUNDS alternating rounds of about SECONDS of steps each (the
log loop on a fresh run after ``window / N`` warm-up calls given WARM_S to go in:
its window is full, its recycled buffers exist, and a worker that cannot keep up
is busy, as it would be),
and the training step's median and mean (the call included) in each loop: what
log_embeddings adds to a step, beside what the copy adds.

Read back: every log loop's stored statistic rows are 3 per evaluation its worker
made; and for each input kind, a run of distinct batches (window 2,048, every 512,
waiting for the worker after each call so that nothing is dropped) whose stored
``z/rankme``, ``z/std`` and ``z/dead_dims`` must equal
:func:`tracker.embedding_window.statistics` of the last 2,048 rows at each
evaluation's step (relative 1e-6). Then the worker's own cost per D (a batch into a
full window, one evaluation), which bounds how often it can evaluate.

Run: ``.venv/bin/python -m bench.embeddings`` (about 2 minutes on 2 cores;
``--quick``: two shapes, fewer steps).
"""

from __future__ import annotations

import gc
import logging
import math
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

SHAPES = ((256, 128), (256, 512), (256, 2048), (1024, 2048))
ROUNDS = 3
SECONDS = 0.6  # of training per loop and round: 12 to 300 steps
WARM_S = 2.0  # the warm-up's window is given this long to go in before the timed steps
FINISH_S = 2.0  # finish() gives a worker still busy this long (half the logger timeout), then logs the last window
HIDDEN = 32  # the predictor's bottleneck

COPY = {"numpy": "np.copyto(buf, z)", "torch cpu": "buf.copy_(z)", "torch cuda": "buf.copy_(z), buf pinned"}


class SimSiam:
    """One SimSiam training on digits whose projector outputs ``dim`` dimensions for batches of ``n``."""

    def __init__(self, n: int, dim: int, seed: int = 0) -> None:
        import torch
        from torch import nn

        from bench.ssl_digits import digits

        torch.manual_seed(seed)
        self.x = torch.from_numpy(digits(seed)[0])
        self.n = n
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.backbone = nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 64))
        self.projector = nn.Sequential(nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, dim))
        self.predictor = nn.Sequential(nn.Linear(dim, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU(),
                                       nn.Linear(HIDDEN, dim))
        params = [p for m in (self.backbone, self.projector, self.predictor) for p in m.parameters()]
        self.optimizer = torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)

    def step(self) -> Any:
        """One training step; the projector's output of the first view, detached (N, D)."""
        import torch
        import torch.nn.functional as F

        from bench.ssl_digits import augment

        x = self.x[torch.randint(0, self.x.shape[0], (self.n,), generator=self.generator)]
        z1 = self.projector(self.backbone(augment(x, self.generator)))
        z2 = self.projector(self.backbone(augment(x, self.generator)))
        p1, p2 = self.predictor(z1), self.predictor(z2)
        loss = -0.5 * ((F.normalize(p1, dim=1) * F.normalize(z2.detach(), dim=1)).sum(1).mean()
                       + (F.normalize(p2, dim=1) * F.normalize(z1.detach(), dim=1)).sum(1).mean())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return z1.detach()


def _kinds() -> dict[str, Callable[[Any], Any]]:
    """Input kind -> z of that kind from the step's CPU tensor."""
    import torch

    out: dict[str, Callable[[Any], Any]] = {"numpy": lambda t: t.numpy(), "torch cpu": lambda t: t}
    if torch.cuda.is_available():
        out["torch cuda"] = lambda t: t.cuda()
    return out


def _copy(kind: str, z: Any) -> Callable[[Any], Any]:
    """The reference copy of :data:`COPY` for inputs like ``z``, into memory allocated here once."""
    import torch

    if kind == "numpy":
        buf = np.empty_like(z)
        return lambda a: np.copyto(buf, a)
    host = torch.empty(z.shape, dtype=z.dtype, pin_memory=bool(z.is_cuda))
    return lambda t: host.copy_(t)


def _loop(model: SimSiam, kind: str, make: Callable[[Any], Any], call: Callable[[Any, int], Any] | None,
          steps: int, start: int = 0) -> tuple[list[float], list[float]]:
    """Train ``steps`` steps, calling ``call(z, step)`` after each; (call seconds, step seconds)."""
    clock = time.perf_counter
    calls, totals = [], []
    for i in range(start, start + steps):
        t0 = clock()
        z = make(model.step())
        if kind == "torch cuda":
            import torch

            torch.cuda.synchronize()
        if call is not None:
            t1 = clock()
            call(z, i)
            calls.append(clock() - t1)
        totals.append(clock() - t0)
    return calls, totals


def _logged(run: Any) -> int:
    """Statistic rows of ``run`` in the store, checked against the worker's evaluations."""
    import tracker

    rows = int(tracker.query("SELECT count(*) AS n FROM curves WHERE run_id = ? AND key LIKE 'z/%'",
                             [run.run_id])["n"][0])
    if rows != 3 * run._embeddings.evaluations:
        raise AssertionError(f"read back {rows} statistic rows for {run._embeddings.evaluations} evaluations")
    return rows


def measure(n: int, d: int, kind: str, make: Callable[[Any], Any], steps: int) -> dict[str, Any]:
    """Per-call and per-step figures of the copy and of log_embeddings, ROUNDS alternating rounds."""
    import tracker
    from tracker.embeddings import wait

    model = SimSiam(n, d)
    z = make(model.step())
    copy = _copy(kind, z)
    warm = max(10, math.ceil(25_600 / n))
    copy_calls, log_calls, base, with_copy, with_log = [], [], [], [], []
    rows = evaluations = dropped = late = 0
    for _ in range(ROUNDS):
        base += _loop(model, kind, make, None, steps)[1]
        calls, totals = _loop(model, kind, make, lambda a, i: copy(a), steps)
        copy_calls += calls
        with_copy += totals
        run = tracker.init("bench-embeddings", config={"tracker_logger_timeout": FINISH_S * 2}, loggers=["store"],
                           system=False)
        log = run.log_embeddings
        for i in range(warm):  # a full window and the recycled buffers; the worker takes it in, or stays busy
            log("z", z, step=i)
        wait(run, WARM_S)
        calls, totals = _loop(model, kind, make, lambda a, i: log("z", a, step=i), steps, warm)
        log_calls += calls
        with_log += totals
        run.finish()
        rows += _logged(run)
        evaluations += run._embeddings.evaluations
        dropped += run._embeddings.dropped_rows
        late += run._embeddings._abandoned
        del run, log
        gc.collect()  # the run's window and buffers go now, not during the next loop
    us = 1e6
    out: dict[str, Any] = {"rows": rows, "evaluations": evaluations, "dropped": dropped, "late": late}
    for name, values in (("copy", copy_calls), ("log", log_calls), ("base", base), ("step_copy", with_copy),
                         ("step_log", with_log)):
        out[name] = (stats.median(values) * us, stats.fmean(values) * us)
    return out


def _steps(n: int, d: int, quick: bool) -> int:
    """Steps per loop and round: about SECONDS of this shape's training, 12 to 300."""
    model = SimSiam(n, d)
    model.step()
    t0 = time.perf_counter()
    for _ in range(5):
        model.step()
    per_step = (time.perf_counter() - t0) / 5
    return max(12 if not quick else 8, min(300 if not quick else 100, int(SECONDS / (1 + quick) / per_step)))


def check_statistics(kind: str, make: Callable[[Any], Any], n: int = 256, d: int = 128,
                     window: int = 2048, every: int = 512, calls: int = 24) -> int:
    """Log distinct batches, read the stored statistics back and compare each point with a direct
    computation on the last ``window`` rows at its step; the number of points compared."""
    import torch

    import tracker
    from tracker.embedding_window import statistics
    from tracker.embeddings import wait

    rng = np.random.default_rng(7)
    batches = [(rng.normal(size=(n, d)) * rng.uniform(0.2, 2.0, d)).astype(np.float32) for _ in range(calls)]
    run = tracker.init("bench-embeddings-check", config={}, loggers=["store"], system=False)
    for step, z in enumerate(batches):
        run.log_embeddings("z", make(torch.from_numpy(z)), step=step, window=window, every=every)
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


def worker_cost(d: int, window: int = 25_600, batch: int = 1024) -> tuple[float, float]:
    """Seconds for the worker to add ``batch`` rows to a full window, and to evaluate the window."""
    from tracker.embedding_window import Window
    from tracker.embeddings import _one_blas_thread

    state = Window(key="z", dim=d, window=window, gamma=1.0, every=1024)
    rng = np.random.default_rng(1)
    z = rng.normal(size=(batch, d)).astype(np.float32)
    with _one_blas_thread():  # the worker's BLAS threads: a quarter of the cores
        for _ in range(window // batch + 1):
            state.add(z)
        t0 = time.perf_counter()
        state.add(z)
        add_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        state.evaluate()
        return add_s, time.perf_counter() - t0


def _ratio(a: float, b: float) -> str:
    return f"{a / b:5.2f}" if b > 0 else "  nan"


def main() -> None:
    """Print the tables."""
    import torch

    quick = "--quick" in sys.argv
    os.environ["TRACKER_HOME"] = tempfile.mkdtemp(prefix="tracker-bench-embeddings-")
    os.environ["TRACKER_SYSTEM"] = "0"
    torch.set_num_threads(1)
    logging.getLogger("tracker.embeddings").setLevel(logging.ERROR)  # a late worker: counted in the table
    began = time.perf_counter()
    print(f"run.log_embeddings in a SimSiam training loop (digits, torch CPU, 1 thread) vs the copy of z to host "
          f"memory; {ROUNDS} alternating rounds; defaults: window 25,600, every 1,024 samples; cores: "
          f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()}")
    print("the copy: " + "; ".join(f"{kind}: {COPY[kind]}" for kind in _kinds()) + ", into a buffer allocated once")
    print(f"{'':29}{'per call, us (median / mean)':^38} | {'training step, ms (median / mean)':^46} |")
    print(f"{'N x D':>12} {'input':>10} {'steps':>5} {'copy':>13} {'log_embeddings':>16} {'ratio':>6} | "
          f"{'no call':>13} {'copy':>13} {'log_embeddings':>15}  {'extra':>5} | {'evals':>5} {'dropped':>8} "
          f"{'late':>4}")
    for n, d in SHAPES[:2] if quick else SHAPES:
        steps = _steps(n, d, quick)
        for kind, make in _kinds().items():
            m = measure(n, d, kind, make, steps)
            (cm, ca), (lm, la) = m["copy"], m["log"]
            bm, ba = m["base"]
            extra_copy, extra_log = m["step_copy"][1] - ba, m["step_log"][1] - ba
            ms = 1e-3
            print(f"{n:>5} x {d:<5} {kind:>10} {steps:>5} {cm:6.1f} /{ca:6.1f} {lm:7.1f} /{la:7.1f} "
                  f"{_ratio(lm, cm)} | {bm * ms:5.2f} /{ba * ms:6.2f} {m['step_copy'][0] * ms:5.2f} /"
                  f"{m['step_copy'][1] * ms:6.2f} {m['step_log'][0] * ms:6.2f} /{m['step_log'][1] * ms:6.2f}  "
                  f"{_ratio(extra_log, extra_copy) if extra_copy > 0 else '    -'} | {m['evaluations']:>5} "
                  f"{m['dropped']:>8} {m['late']:>4}")
    print("(ratio: log_embeddings / copy, medians per call; extra: (mean log step - mean step) / (mean copy step - "
          "mean step), '-' where the copy's extra is within the noise; evals: evaluations logged in the timed and "
          "warm-up steps, read back 3 rows each; dropped: samples a worker behind dropped; late: runs whose "
          f"worker was still busy {FINISH_S:g} s into finish(), its last statistics left out)")
    print("\nread back: stored statistics against a direct computation on the window's rows (256 x 128 batches, "
          "window 2,048, every 512):")
    for kind, make in _kinds().items():
        print(f"  {kind:>10}: {check_statistics(kind, make)} stored points equal statistics() of the last 2,048 "
              "rows (rel 1e-6)")
    from tracker.embeddings import blas_threads

    print(f"\nthe worker, off the training thread (window 25,600 samples, 1,024 new rows, {blas_threads()} BLAS "
          "thread(s)):")
    for d in (128, 512, 2048) if not quick else (128, 512):
        add_s, eval_s = worker_cost(d)
        print(f"  D = {d:>4}: add 1,024 rows {add_s * 1e3:7.1f} ms, evaluate {eval_s * 1e3:8.1f} ms; at every=1,024 "
              f"it keeps up with {1024 / (add_s + eval_s):,.0f} samples/s (beyond, it evaluates less often)")
    print(f"\n{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
