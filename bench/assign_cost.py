"""What tracking costs a real YOLO11n training step: track() against no tracking, and the
assignment statistics and gradient balance against track() without them.

    python -m bench.assign_cost [--rounds 4] [--images 512] [--batch 8] [--imgsz 64] [--device cpu]

Three settings train YOLO11n (from ``yolo11n.yaml``, Ultralytics' defaults, no validation,
``workers=0``) on the same synthetic COCO-long-tail dataset, one epoch each, in interleaved
rounds (the order shuffled every round, so a load change hits all three alike):

* ``none``: no tracking at all;
* ``track``: ``track(model, assign_stats=False)``;
* ``assign``: ``track(model)``, the default (assignment statistics and gradient balance on).

A step is the time between two ``on_train_batch_start`` callbacks (data, forward, loss,
backward, optimizer and every callback). Printed: median and mean step time per setting
over all rounds (the first 3 steps of each training left out: warm-up), and the overheads
``track / none - 1`` and ``assign / track - 1`` on both. Because an A/B difference of a
fraction of a percent is below the noise of a loaded machine, the tracker's own time is
also measured directly in the ``assign`` setting: the seconds spent inside the tracker's
callbacks and inside the statistics (assigner and classification-loss probes, the copy
to the host and the logging) as a share of the step. Read back: the run's
``assign/gt`` rows must sum to the labels the assigner saw.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

WARMUP = 3
SETTINGS = ("none", "track", "assign")
BATCH_EVENTS = ("on_train_batch_start", "on_train_batch_end")


class Timer:
    """Accumulates the wall time of wrapped calls."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return timed


def _time_tracker_callbacks(model: Any, batch: Timer, other: Timer) -> None:
    """Wrap every callback that track() added (bound methods of its state object): the per-batch
    ones into ``batch``, the setup, per-epoch and end ones into ``other``."""
    from tracker.integrations.ultralytics import _Tracker

    for event, hooks in model.callbacks.items():
        for i, fn in enumerate(hooks):
            if isinstance(getattr(fn, "__self__", None), _Tracker):
                hooks[i] = (batch if event in BATCH_EVENTS else other).wrap(fn)


def _time_probes(model: Any, timer: Timer) -> None:
    """After track()'s setup, time the statistics' own work (probe methods and the per-batch write)."""
    from tracker.integrations import ultralytics_assign as ua

    def setup(trainer: Any) -> None:
        probe_cls = ua.AssignProbe
        probe_cls.on_assign = timer.wrap(probe_cls.__dict__["on_assign"])  # type: ignore[method-assign]
        probe_cls.on_cls_loss = timer.wrap(probe_cls.__dict__["on_cls_loss"])  # type: ignore[method-assign]
        ua.log_batch = timer.wrap(ua.__dict__["log_batch"])

    model.add_callback("on_pretrain_routine_start", setup)


def train_once(setting: str, data: Path, args: argparse.Namespace, workdir: Path, tag: str) -> dict[str, Any]:
    """One epoch under ``setting``; returns its step times and the tracker's measured seconds."""
    from ultralytics import YOLO

    from tracker.integrations.ultralytics import track

    model = YOLO("yolo11n.yaml")
    starts: list[float] = []
    model.add_callback("on_train_batch_start", lambda t: starts.append(time.perf_counter()))
    callbacks, other, stats = Timer(), Timer(), Timer()
    if setting != "none":
        track(model, project="bench-assign", name=f"{setting}-{tag}", assign_stats=setting == "assign")
        _time_tracker_callbacks(model, callbacks, other)
    if setting == "assign":
        _time_probes(model, stats)
    model.train(data=str(data), epochs=1, imgsz=args.imgsz, batch=args.batch, nbs=args.batch, device=args.device,
                workers=0, plots=False, val=False, project=str(workdir / "runs"), name=f"{setting}-{tag}",
                verbose=False, amp=False, seed=0, exist_ok=True)
    steps = [b - a for a, b in zip(starts, starts[1:])][WARMUP:]
    return {"steps": steps, "callbacks": callbacks.seconds, "other": other.seconds, "stats": stats.seconds,
            "total": starts[-1] - starts[WARMUP] if len(starts) > WARMUP + 1 else 0.0}


def settle(baseline: set[int], timeout: float = 30.0) -> float:
    """Wait until the threads a training left behind (the tracker's flusher, Ultralytics' workers) have
    ended, so that their work does not land in the next training's steps; returns the seconds waited."""
    import gc
    import threading

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        extra = [t for t in threading.enumerate() if t.ident not in baseline and t.is_alive()]
        if not extra:
            break
        time.sleep(0.05)
    gc.collect()
    return time.perf_counter() - t0


def _restore_probes() -> None:
    import importlib

    import tracker.integrations.ultralytics_assign as ua

    importlib.reload(ua)


def read_back(home: Path) -> str:
    """The ``assign/gt`` rows of the last ``assign`` run: present and whole-numbered."""
    from tracker.store import Store

    df = Store(home).query("SELECT run_id, count(*) AS n, sum(value) AS boxes FROM class_curves "
                           "WHERE key = 'assign/gt' GROUP BY run_id ORDER BY run_id")
    if df.height == 0:
        return "read-back FAILED: no assign/gt rows"
    ok = all(float(b) == int(b) and b > 0 for b in df["boxes"].to_list())
    return f"read-back {'ok' if ok else 'FAILED'}: {df.height} runs with assign/gt, {int(df['boxes'].sum())} boxes"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-assign-"))
    home = workdir / "tracker-home"
    from tracker.integrations.ultralytics_env import apply_env, offline_config

    env = offline_config(workdir / "ultralytics-config")
    os.environ.update({**env, "TRACKER_HOME": str(home), "TRACKER_LOGGERS": "store", "TRACKER_SYSTEM": "0"})
    apply_env(env)
    import logging

    from ultralytics.utils import LOGGER

    LOGGER.setLevel(logging.WARNING)  # the model summary and progress bars of 3 x rounds trainings
    from tracker.integrations.yolo_synthetic import make_dataset

    data = make_dataset(workdir / "data", train=args.images, val=8, imgsz=args.imgsz).yaml
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
    rng = random.Random(0)
    import threading

    baseline = {t.ident for t in threading.enumerate()}
    waited: dict[str, float] = {s: 0.0 for s in SETTINGS}
    for r in range(args.rounds):
        order = list(SETTINGS)
        rng.shuffle(order)
        for setting in order:
            results[setting].append(train_once(setting, data, args, workdir, f"r{r}"))
            _restore_probes()
            waited[setting] += settle(baseline)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{s} {1000 * statistics.median(results[s][-1]['steps']):.1f} ms" for s in order), flush=True)
    report(results, args)
    print("  threads left running after a training, waited for: " + ", ".join(
        f"{s} {waited[s] / args.rounds:.2f} s" for s in SETTINGS))
    print(read_back(home))


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    """Print the medians, means and overheads, and the tracker's directly measured share."""
    print(f"\nYOLO11n, imgsz {args.imgsz}, batch {args.batch}, {args.images} images, device {args.device}, "
          f"{args.rounds} interleaved rounds (python {sys.version.split()[0]})")
    med, mean = {}, {}
    for s in SETTINGS:
        steps = [x for run in results[s] for x in run["steps"]]
        med[s], mean[s] = statistics.median(steps), statistics.fmean(steps)
        print(f"  {s:7s} {len(steps):5d} steps  median {1000 * med[s]:8.2f} ms  mean {1000 * mean[s]:8.2f} ms  "
              f"p90 {1000 * sorted(steps)[int(0.9 * len(steps))]:8.2f} ms")
    for a, b, target in (("track", "none", 1.0), ("assign", "track", 3.0)):
        print(f"  {a} vs {b}: median {100 * (med[a] / med[b] - 1):+.2f}%, mean {100 * (mean[a] / mean[b] - 1):+.2f}% "
              f"(target <= {target:.0f}%)")
    for s in ("track", "assign"):
        total = sum(run["total"] for run in results[s])
        cb = sum(run["callbacks"] for run in results[s])
        other = statistics.fmean(run["other"] for run in results[s])
        print(f"  measured inside the tracker's per-batch callbacks ({s}): {100 * cb / total:.3f}% of the step time "
              f"(target <= 1%); setup, epoch ends and finish: {other:.2f} s per training")
    total = sum(run["total"] for run in results["assign"])
    st = sum(run["stats"] for run in results["assign"])
    print(f"  measured inside the statistics (probes, copy, logging): {100 * st / total:.3f}% of the step time "
          "(target <= 3%)")


if __name__ == "__main__":
    main()
