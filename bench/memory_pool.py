"""Memory-pool benchmark: replay a YOLO-like training allocation trace.

Run: ``python bench/memory_pool.py`` (options: ``--steps``, ``--batch``, ``--seed``).

Every step of the trace (batch 16 at 640 px, 8,400 anchors, 80 classes, float32):

* forward: fixed-size activations of a reduced-width backbone, neck and head,
  each followed by a same-size temporary freed once the next activation exists;
* loss inputs: predicted scores, distributions and boxes, target scores and
  boxes (fixed sizes);
* the assigner, sized by the data: every image has 0 to 60 boxes (seeded); the
  padded ``(batch, max boxes, 8400)`` overlap, alignment and positive-mask
  tensors with a score temporary freed mid-step, the padded box, label and
  mask companions, and per image with boxes a ``(boxes, 8400)`` IoU matrix and
  matching matrix kept to the end plus a cost matrix freed after matching;
* backward: gradients of the head outputs and of the predicted scores;
* the end of the step frees everything left in roughly reverse order.

The trace is replayed on :class:`gpu.pool.Pool`, on an exact-size free-list
pool and on a simulation of PyTorch's CUDA caching allocator
(:mod:`gpu.pool_sim`). Peak live is the peak of the bytes asked for, the
same for every pool. The targets: peak reserved / peak live at most 1.3, at
most the PyTorch-policy figure, and at least 2x better than the naive pool.
The script prints what it measured and never fails on a missed target.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gpu.pool import Pool, PoolStats
from gpu.pool_sim import NaivePool, TorchCachingPool

F32 = 4
ANCHORS = 8400
CLASSES = 80
REG_MAX = 16
MAX_TARGETS = 60
MiB = 1 << 20
TARGET_RATIO = 1.3
TARGET_VS_NAIVE = 2.0

BACKBONE = ((16, 320), (32, 160), (32, 160), (64, 80), (64, 80), (128, 40), (128, 40),
            (256, 20), (256, 20), (128, 40), (64, 80), (128, 40), (256, 20))
HEADS = ((CLASSES + 4 * REG_MAX, 80), (CLASSES + 4 * REG_MAX, 40), (CLASSES + 4 * REG_MAX, 20))

Trace = list[tuple[int, int]]


class _Allocator(Protocol):
    def alloc(self, nbytes: int) -> Any: ...
    def free(self, token: Any) -> None: ...
    def stats(self) -> PoolStats: ...


class _Step:
    """Builds one step's events: (id, size) allocates, (id, 0) frees."""

    def __init__(self, trace: Trace, first_id: int) -> None:
        self.trace = trace
        self.next_id = first_id
        self.kept: list[int] = []

    def alloc(self, nbytes: int, keep: bool = True) -> int:
        tid = self.next_id
        self.next_id += 1
        self.trace.append((tid, nbytes))
        if keep:
            self.kept.append(tid)
        return tid

    def free(self, tid: int) -> None:
        self.trace.append((tid, 0))


def _forward(step: _Step, batch: int) -> None:
    previous: int | None = None
    for channels, side in BACKBONE + HEADS:
        step.alloc(batch * channels * side * side * F32)
        if previous is not None:
            step.free(previous)
        previous = step.alloc(batch * channels * side * side * F32, keep=False)
    if previous is not None:
        step.free(previous)
    for width in (CLASSES, 4 * REG_MAX, 4):
        step.alloc(batch * ANCHORS * width * F32)


def _assign(step: _Step, targets: np.ndarray) -> None:
    batch, most = len(targets), int(targets.max())
    if most:
        for width in (4, 1, 1):
            step.alloc(batch * most * width * F32)
        padded = batch * most * ANCHORS * F32
        step.alloc(padded)
        scores = step.alloc(padded, keep=False)
        step.alloc(padded)
        step.free(scores)
        step.alloc(padded)
    for count in targets.tolist():
        if count:
            step.alloc(count * ANCHORS * F32)
            cost = step.alloc(count * ANCHORS * F32, keep=False)
            step.alloc(count * ANCHORS * F32)
            step.free(cost)
    for width in (CLASSES, 4, 1):
        step.alloc(batch * ANCHORS * width * F32)


def _backward(step: _Step, batch: int, rng: np.random.Generator) -> None:
    for channels, side in HEADS:
        step.alloc(batch * channels * side * side * F32)
    step.alloc(batch * ANCHORS * CLASSES * F32)
    order = step.kept[::-1]
    for i in range(0, len(order) - 1, 2):
        if rng.random() < 0.3:
            order[i], order[i + 1] = order[i + 1], order[i]
    for tid in order:
        step.free(tid)


def build_trace(steps: int, batch: int, seed: int) -> Trace:
    """The allocation events of ``steps`` training steps, seeded."""
    rng = np.random.default_rng(seed)
    trace: Trace = []
    next_id = 0
    for _ in range(steps):
        step = _Step(trace, next_id)
        _forward(step, batch)
        _assign(step, rng.integers(0, MAX_TARGETS + 1, size=batch))
        _backward(step, batch, rng)
        next_id = step.next_id
    return trace


def replay(trace: Trace, pool: _Allocator) -> tuple[PoolStats, float]:
    """Run the trace on ``pool``; returns its stats and the seconds taken."""
    live: dict[int, Any] = {}
    alloc, free, pop = pool.alloc, pool.free, live.pop
    start = time.perf_counter()
    for tid, nbytes in trace:
        if nbytes:
            live[tid] = alloc(nbytes)
        else:
            free(pop(tid))
    return pool.stats(), time.perf_counter() - start


@dataclass(frozen=True)
class Result:
    """One pool's figures on the trace."""

    name: str
    stats: PoolStats
    seconds: float

    @property
    def ratio(self) -> float:
        """Peak reserved / peak live."""
        return self.stats.peak_reserved / self.stats.peak_live


def _ours() -> Pool:
    handles = iter(range(1, 1 << 62))
    return Pool(lambda nbytes: next(handles), lambda handle: None)


def run(trace: Trace) -> list[Result]:
    """Replay one trace on our pool, the PyTorch policy and the naive pool."""
    pools: list[tuple[str, _Allocator]] = [
        ("gpu.pool.Pool", _ours()),
        ("PyTorch caching policy", TorchCachingPool()),
        ("naive exact-size", NaivePool()),
    ]
    return [Result(name, *replay(trace, pool)) for name, pool in pools]


def report(results: list[Result], steps: int, batch: int, events: int) -> str:
    """The table and the target lines."""
    lines = [f"YOLO-like trace: {steps} steps, batch {batch}, {events} events",
             f"{'pool':<24}{'peak live MiB':>14}{'peak resv MiB':>14}{'resv/live':>10}"
             f"{'device allocs':>14}{'seconds':>9}"]
    for r in results:
        lines.append(f"{r.name:<24}{r.stats.peak_live / MiB:>14.1f}"
                     f"{r.stats.peak_reserved / MiB:>14.1f}{r.ratio:>10.3f}"
                     f"{r.stats.device_allocations:>14}{r.seconds:>9.2f}")
    ours, torch, naive = (r.ratio for r in results)
    checks = [
        (f"peak reserved / peak live {ours:.3f} <= {TARGET_RATIO}", ours <= TARGET_RATIO),
        (f"vs PyTorch policy {ours / torch:.3f}x (target <= 1.0)", ours <= torch),
        (f"naive / ours {naive / ours:.2f}x (target >= {TARGET_VS_NAIVE})",
         naive / ours >= TARGET_VS_NAIVE),
    ]
    lines += [f"  {'met ' if ok else 'MISSED'}  {text}" for text, ok in checks]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: print the table; exit 0 whatever the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    trace = build_trace(args.steps, args.batch, args.seed)
    results = run(trace)
    print(report(results, args.steps, args.batch, len(trace)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
