"""What tracking costs a real YOLO11n training step: track() against no tracking, and the
assignment statistics and gradient balance against track() without them.

    python -m bench.assign_cost [--rounds 8] [--images 512] [--batch 8] [--imgsz 64] [--device cpu]
                                [--flush-interval S]

Three settings train YOLO11n (from ``yolo11n.yaml``, Ultralytics' defaults, no validation,
``workers=0``) on the same synthetic COCO-long-tail dataset, one epoch each:

* ``none``: no tracking at all;
* ``track``: ``track(model, assign_stats=False)``, every other default on (the store
  logger, the online analysis, the system sampler);
* ``assign``: ``track(model)``, the default (assignment statistics and gradient balance on).

First one untimed round of all three: a process pays once for imports that happen during
the first training (pyarrow loads pandas at its first array, torch its compiler at the first
optimizer step), and whichever setting came first would carry them. Its background CPU is
printed as the one-time cost. Then ``--rounds`` timed rounds in ABC CBA order (a drift of
the machine's load hits every setting alike), the threads a training leaves behind waited
for before the next.

A step is the time between two ``on_train_batch_start`` callbacks (data, forward, loss,
backward, optimizer and every callback); the first 3 steps of each training are left out.
Printed per setting: median, mean and p90 step over all rounds, the lowest per-round
median, the main thread's CPU per step and the time of its garbage collections; for the
overheads ``track / none - 1`` and ``assign / track - 1``: the pooled median and mean, the
ratio of the lowest round medians, and a 95% interval of the median's ratio from rounds
resampled in pairs. The load-independent figure is the CPU of the threads that are not the
training's (the run's flusher, logger lanes, online analysis, system sampler) per 100
steps, per thread, from ``/proc/self/task``: what they take from the cores and the GIL.
The tracker's own main-thread time is measured directly too: inside its callbacks, the
classification-loss bookkeeping and the statistics. Read back: the run's ``assign/gt``
rows must sum to the labels the assigner saw.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from bench._threads import background, cpu_delta, paired_bootstrap, thread_cpu

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


class GcTimer:
    """Seconds the main thread spends in garbage collections while ``on``."""

    def __init__(self) -> None:
        self.seconds, self.count, self.on, self._t0 = 0.0, 0, False, 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on or threading.current_thread() is not threading.main_thread():
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.count += 1

    def close(self) -> None:
        gc.callbacks.remove(self)


def _time_tracker_callbacks(model: Any, batch: Timer, other: Timer) -> None:
    """Wrap every callback that track() added (bound methods of its state object): the per-batch
    ones into ``batch``, the setup, per-epoch and end ones into ``other``."""
    from tracker.integrations.ultralytics import _Tracker

    for event, hooks in model.callbacks.items():
        for i, fn in enumerate(hooks):
            if isinstance(getattr(fn, "__self__", None), _Tracker):
                hooks[i] = (batch if event in BATCH_EVENTS else other).wrap(fn)


def _time_main_thread_work(model: Any, stats: Timer | None, bookkeeping: Timer) -> None:
    """After track()'s setup, time the statistics' own work (probe methods and the per-batch write)
    and the classification-loss wrapper's bookkeeping (its per-class breakdown)."""
    from tracker.integrations import ultralytics_assign as ua
    from tracker.integrations import ultralytics_loss as ul

    def setup(trainer: Any) -> None:
        if stats is not None:
            probe_cls = ua.AssignProbe
            probe_cls.on_assign = stats.wrap(probe_cls.__dict__["on_assign"])  # type: ignore[method-assign]
            probe_cls.on_cls_loss = stats.wrap(probe_cls.__dict__["on_cls_loss"])  # type: ignore[method-assign]
            ua.log_batch = stats.wrap(ua.__dict__["log_batch"])
        if _PLAIN_RECORD is not None:  # (a tree from before the bookkeeping was its own method: not timed)
            ul.ClassificationLoss.record = bookkeeping.wrap(_PLAIN_RECORD)  # type: ignore[method-assign]

    model.add_callback("on_pretrain_routine_start", setup)


def train_once(setting: str, data: Path, args: argparse.Namespace, workdir: Path, tag: str,
               gc_timer: GcTimer) -> dict[str, Any]:
    """One epoch under ``setting``; returns its step times, thread CPU and the tracker's measured seconds."""
    from ultralytics import YOLO

    from tracker.integrations.ultralytics import track

    model = YOLO("yolo11n.yaml")
    starts: list[float] = []
    cpu: dict[str, Any] = {}

    def batch_start(trainer: Any) -> None:
        starts.append(time.perf_counter())
        if len(starts) == WARMUP + 1:
            cpu["before"] = thread_cpu()
            gc_timer.on, gc_timer.seconds, gc_timer.count = True, 0.0, 0

    def epoch_end(trainer: Any) -> None:  # before track()'s own epoch end (its flush barrier)
        cpu["after"] = thread_cpu()
        gc_timer.on = False

    model.add_callback("on_train_batch_start", batch_start)
    model.add_callback("on_train_epoch_end", epoch_end)
    callbacks, other, stats, bookkeeping = Timer(), Timer(), Timer(), Timer()
    if setting != "none":
        extra = {} if args.flush_interval is None else {"flush_interval": args.flush_interval}
        if args.flush_interval is not None and "flush_interval" not in track.__code__.co_varnames:
            extra = {}  # (a tree from before track() had it: its run flushes at tracker.init's 1 s)
        track(model, project="bench-assign", name=f"{setting}-{tag}", assign_stats=setting == "assign", **extra)
        _time_tracker_callbacks(model, callbacks, other)
        _time_main_thread_work(model, stats if setting == "assign" else None, bookkeeping)
    model.train(data=str(data), epochs=1, imgsz=args.imgsz, batch=args.batch, nbs=args.batch, device=args.device,
                workers=0, plots=False, val=False, project=str(workdir / "runs"), name=f"{setting}-{tag}",
                verbose=False, amp=False, seed=0, exist_ok=True)
    steps = [b - a for a, b in zip(starts, starts[1:])][WARMUP:]
    threads = cpu_delta(cpu.get("before", {}), cpu.get("after", {}))
    return {"steps": steps, "callbacks": callbacks.seconds, "other": other.seconds, "stats": stats.seconds,
            "bookkeeping": bookkeeping.seconds, "threads": threads, "gc": gc_timer.seconds,
            "total": starts[-1] - starts[WARMUP] if len(starts) > WARMUP + 1 else 0.0}


def settle(baseline: set[int], timeout: float = 30.0) -> float:
    """Wait until the threads a training left behind (the tracker's flusher, Ultralytics' workers) have
    ended, so that their work does not land in the next training's steps; returns the seconds waited."""
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
    import tracker.integrations.ultralytics_loss as ul

    if _PLAIN_RECORD is not None:
        ul.ClassificationLoss.record = _PLAIN_RECORD  # type: ignore[method-assign]
    importlib.reload(ua)


_PLAIN_RECORD: Any = None


def read_back(home: Path) -> str:
    """The ``assign/gt`` rows of the ``assign`` runs: present and whole-numbered."""
    from tracker.store import Store

    df = Store(home).query("SELECT run_id, count(*) AS n, sum(value) AS boxes FROM class_curves "
                           "WHERE key = 'assign/gt' GROUP BY run_id ORDER BY run_id")
    if df.height == 0:
        return "read-back FAILED: no assign/gt rows"
    ok = all(float(b) == int(b) and b > 0 for b in df["boxes"].to_list())
    return f"read-back {'ok' if ok else 'FAILED'}: {df.height} runs with assign/gt, {int(df['boxes'].sum())} boxes"


def _prepare(args: argparse.Namespace) -> tuple[Path, Path, Path]:
    """A private offline Ultralytics folder, a tracker home at the defaults, and the dataset."""
    global _PLAIN_RECORD
    workdir = Path(tempfile.mkdtemp(prefix="bench-assign-"))
    home = workdir / "tracker-home"
    from tracker.integrations.ultralytics_env import apply_env, offline_config

    env = offline_config(workdir / "ultralytics-config")
    for key in ("TRACKER_LOGGERS", "TRACKER_SYSTEM", "TRACKER_SYSTEM_INTERVAL", "TRACKER_NOTIFY"):
        os.environ.pop(key, None)  # the defaults users get
    os.environ.update({**env, "TRACKER_HOME": str(home)})
    apply_env(env)
    import logging

    from ultralytics.utils import LOGGER

    from tracker.integrations import ultralytics_loss as ul

    _PLAIN_RECORD = ul.ClassificationLoss.__dict__.get("record")
    LOGGER.setLevel(logging.WARNING)  # the model summary and progress bars of 3 x rounds trainings
    from tracker.integrations.yolo_synthetic import make_dataset

    data = make_dataset(workdir / "data", train=args.images, val=8, imgsz=args.imgsz).yaml
    return workdir, home, data


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--flush-interval", type=float, default=None,
                        help="track(flush_interval=...) (default: track()'s own, 5 s)")
    args = parser.parse_args(argv)
    workdir, home, data = _prepare(args)
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
    baseline = {t.ident for t in threading.enumerate()}
    gc_timer = GcTimer()
    first: dict[str, dict[str, Any]] = {}
    for setting in SETTINGS:  # the untimed round: one-time imports of the process
        first[setting] = train_once(setting, data, args, workdir, "warmup", gc_timer)
        _restore_probes()
        settle(baseline)
    waited: dict[str, float] = {s: 0.0 for s in SETTINGS}
    for r in range(args.rounds):
        order = list(SETTINGS) if r % 2 == 0 else list(reversed(SETTINGS))
        for setting in order:
            results[setting].append(train_once(setting, data, args, workdir, f"r{r}", gc_timer))
            _restore_probes()
            waited[setting] += settle(baseline)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{s} {1000 * statistics.median(results[s][-1]['steps']):.1f} ms" for s in order), flush=True)
    gc_timer.close()
    report(results, args)
    report_threads(results, first)
    print("  threads left running after a training, waited for: " + ", ".join(
        f"{s} {waited[s] / args.rounds:.2f} s" for s in SETTINGS))
    print(read_back(home))


def _pooled(runs: list[dict[str, Any]]) -> list[float]:
    return [x for run in runs for x in run["steps"]]


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    """Print the step times, the overheads by each estimator, and the tracker's directly measured share."""
    print(f"\nYOLO11n, imgsz {args.imgsz}, batch {args.batch}, {args.images} images, device {args.device}, "
          f"{args.rounds} rounds ABC/CBA after an untimed one, flush interval "
          f"{args.flush_interval or 'default'} (python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")
    med, mean, low = {}, {}, {}
    for s in SETTINGS:
        steps = _pooled(results[s])
        n = sum(len(run["steps"]) for run in results[s])
        med[s], mean[s] = statistics.median(steps), statistics.fmean(steps)
        low[s] = min(statistics.median(run["steps"]) for run in results[s])
        main_cpu = sum(run["threads"].get("main", 0.0) for run in results[s]) / n
        gc_s = sum(run["gc"] for run in results[s]) / n
        print(f"  {s:7s} {n:5d} steps  median {1000 * med[s]:7.2f} ms  mean {1000 * mean[s]:7.2f} ms  "
              f"p90 {1000 * sorted(steps)[int(0.9 * len(steps))]:7.2f} ms  lowest round median "
              f"{1000 * low[s]:7.2f} ms  main-thread CPU {1000 * main_cpu:6.2f} ms/step  gc {1000 * gc_s:5.2f} ms/step")
    for a, b, target in (("track", "none", 1.0), ("assign", "track", 3.0)):
        lo, hi = paired_bootstrap([r["steps"] for r in results[a]], [r["steps"] for r in results[b]])
        print(f"  {a} vs {b}: median {100 * (med[a] / med[b] - 1):+.2f}% (95% {100 * lo:+.2f}%..{100 * hi:+.2f}%), "
              f"mean {100 * (mean[a] / mean[b] - 1):+.2f}%, lowest round medians {100 * (low[a] / low[b] - 1):+.2f}% "
              f"(target <= {target:.0f}%)")
    for s in ("track", "assign"):
        total = sum(run["total"] for run in results[s])
        cb = sum(run["callbacks"] for run in results[s])
        book = sum(run["bookkeeping"] for run in results[s])
        other = statistics.fmean(run["other"] for run in results[s])
        print(f"  measured on the training thread ({s}): per-batch callbacks {100 * cb / total:.3f}%, "
              f"classification-loss bookkeeping {100 * book / total:.3f}% of the step time; "
              f"setup, epoch ends and finish: {other:.2f} s per training")
    total = sum(run["total"] for run in results["assign"])
    st = sum(run["stats"] for run in results["assign"])
    print(f"  measured inside the statistics (probes, copy, logging): {100 * st / total:.3f}% of the step time "
          "(target <= 3%)")


def report_threads(results: dict[str, list[dict[str, Any]]], first: dict[str, dict[str, Any]]) -> None:
    """Print the CPU of the threads that are not the training's, per 100 steps (load-independent)."""
    for s in ("track", "assign"):
        n = sum(len(run["steps"]) for run in results[s])
        wall = sum(run["total"] for run in results[s])
        names = sorted({k for run in results[s] for k in run["threads"]})
        per = {k: sum(run["threads"].get(k, 0.0) for run in results[s]) for k in names}
        bg = background(per)
        parts = ", ".join(f"{k} {1000 * v * 100 / n:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])
                          if k != "main" and not k.startswith("native:") and v > 0)
        print(f"  background threads ({s}): {1000 * bg * 100 / n:.1f} ms CPU per 100 steps, "
              f"{100 * bg / wall:.2f}% of the wall time ({parts or 'none'})")
        warm = first[s]
        warm_bg = background(warm["threads"])
        print(f"    first training of the process (untimed): {1000 * warm_bg * 100 / max(len(warm['steps']), 1):.1f} "
              f"ms per 100 steps")


if __name__ == "__main__":
    main()
