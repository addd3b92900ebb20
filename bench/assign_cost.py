"""What tracking costs a real YOLO11n training step: track() against no tracking, and the
assignment statistics and gradient balance against track() without them.

    python -m bench.assign_cost [--blocks 8] [--images 1200] [--batch 8] [--imgsz 64] [--device cpu]
                                [--threads N] [--flush-interval S] [--control] [--quick]

Three settings train YOLO11n (from ``yolo11n.yaml``, Ultralytics' defaults, ``val=False``,
``workers=0``, ``amp=False``, ``seed=0``) on the same synthetic COCO-long-tail dataset, one
epoch each, in one process:

* ``none``: no tracking at all;
* ``track``: ``track(model, assign_stats=False)``, every other default on (the store
  logger, the online analysis, the system sampler, the 5 s flush);
* ``assign``: ``track(model)``, the default (assignment statistics and gradient balance on).

First one untimed block of all three on a small dataset (a process pays once for imports
during its first training). Then ``--blocks`` timed blocks of three adjacent trainings, in
ABC and CBA order alternately, so ``track`` always sits next to both others; the threads a
training leaves behind are waited for before the next. A training is long enough (150
steps, about 12 s on a quiet 2-core machine) to hold track()'s periodic 5 s flushes at the
rate a long training has them (the bench prints how many fell in the timed steps): in a
shorter one they would fall after the last step and the comparison would leave them out.
The torch thread count is the same in every setting and printed (Ultralytics sets
``min(8, CPUs - 1)`` for a CPU training; ``--threads`` overrides it for all three alike).
Every setting sees the same batches and computes the same losses: the bench checks that
each step's loss is bit-identical across the settings. ``--control`` adds a fourth setting,
``none2``, untracked like ``none`` (blocks ``none track assign none2`` and reversed): its
ratio to ``none`` is what the bench reads when nothing differs, its own noise and any
order effect, against which the other ratios are read.

A step is the time between two ``on_train_batch_start`` callbacks (data, forward, loss,
backward, optimizer and every callback); the first 3 steps of each training are left out.
The estimator: per block, the ratio ``a / b - 1`` of the two trainings' median step, mean
step and process CPU per step (all threads: the training's and the tracker's); printed,
the median over blocks of each ratio with a 95% bootstrap interval over blocks, and the
pooled ratios beside. Slow steps (over 1.5x their training's median) are counted and
their share of the time printed; they stay in the means. Per block the machine's steal
time and the other processes' CPU (``/proc/stat``) say how loaded it was.

The load-independent figures: the tracker's own time on the training thread (its
callbacks, the classification-loss bookkeeping, the statistics) as a share of the step;
the CPU of the threads that are not the training's (the flusher, logger lane, online
analysis, system sampler) per 100 steps, from ``/proc/self/task``; the garbage
collections on every thread (one on a background thread stops the training too). Read
back: the ``assign`` runs' ``assign/gt`` rows are present and whole-numbered.
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

from bench._report_cost import report
from bench._threads import thread_cpu

WARMUP = 3
BLOCKS, IMAGES, WARM_IMAGES = 8, 1200, 48
SETTINGS = ("none", "track", "assign")
BATCH_EVENTS = ("on_train_batch_start", "on_train_batch_end")
TICK = os.sysconf("SC_CLK_TCK")


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
    """Garbage collections while ``on``, on every thread (one holds the GIL, whichever thread runs it):
    seconds and count on the training thread and on the others."""

    def __init__(self) -> None:
        self.on, self._t0 = False, 0.0
        self.reset()
        gc.callbacks.append(self)

    def reset(self) -> None:
        self.main_s = self.other_s = 0.0
        self.main_n = self.other_n = self.full_n = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        spent = time.perf_counter() - self._t0
        self.full_n += info.get("generation") == 2
        if threading.current_thread() is threading.main_thread():
            self.main_s, self.main_n = self.main_s + spent, self.main_n + 1
        else:
            self.other_s, self.other_n = self.other_s + spent, self.other_n + 1

    def close(self) -> None:
        gc.callbacks.remove(self)


def machine() -> tuple[float, float, float]:
    """(busy seconds of all cores, steal seconds, this process' CPU seconds), in ``/proc/stat`` ticks."""
    try:
        with open("/proc/stat") as fh:
            f = [int(x) for x in fh.readline().split()[1:9]]
        with open("/proc/self/stat") as fh:
            own = fh.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0, 0.0
    return (sum(f[:3]) + f[5] + f[6]) / TICK, f[7] / TICK, (int(own[11]) + int(own[12])) / TICK


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
        ul.ClassificationLoss.record = bookkeeping.wrap(_PLAIN_RECORD)  # type: ignore[method-assign]

    model.add_callback("on_pretrain_routine_start", setup)


class Probe:
    """The bench's own callbacks on one training: step starts, CPU and losses, readings around the steps."""

    def __init__(self, gc_timer: GcTimer, threads: int | None) -> None:
        self.starts: list[float] = []
        self.cpu: list[float] = []
        self.losses: list[float] = []
        self.marks: dict[str, Any] = {}
        self.gc_timer, self.threads = gc_timer, threads
        self.run: Callable[[], Any] = lambda: None  # the tracked run, once track()'s setup made it

    def flushes(self) -> int | None:
        """Batches the run's flusher has handed off so far (None untracked)."""
        run = self.run()
        return None if run is None else int(run._flusher._seq)

    def pretrain(self, trainer: Any) -> None:
        import torch

        if self.threads is not None:  # after Ultralytics' select_device, which set its own count
            torch.set_num_threads(self.threads)

    def batch_start(self, trainer: Any) -> None:
        self.starts.append(time.perf_counter())
        self.cpu.append(time.process_time())
        if len(self.starts) == WARMUP + 1:
            import torch

            self.marks.update(threads=thread_cpu(), machine=machine(), torch_threads=torch.get_num_threads(),
                              flushes=self.flushes())
            self.gc_timer.reset()
            self.gc_timer.on = True

    def batch_end(self, trainer: Any) -> None:
        self.losses.append(float(trainer.loss.detach().sum()))

    def epoch_end(self, trainer: Any) -> None:  # before track()'s own epoch end (its flush barrier)
        self.gc_timer.on = False
        self.marks.update(threads_after=thread_cpu(), machine_after=machine(), ended=time.perf_counter(),
                          flushes_after=self.flushes())


def train_once(setting: str, data: Path, args: argparse.Namespace, workdir: Path, tag: str,
               gc_timer: GcTimer) -> dict[str, Any]:
    """One epoch under ``setting``; returns its step times and CPU, losses, thread CPU and the
    tracker's measured seconds."""
    from ultralytics import YOLO

    from tracker.integrations.ultralytics import track

    model = YOLO("yolo11n.yaml")
    probe = Probe(gc_timer, args.threads)
    for event, fn in (("on_pretrain_routine_start", probe.pretrain), ("on_train_batch_start", probe.batch_start),
                      ("on_train_batch_end", probe.batch_end), ("on_train_epoch_end", probe.epoch_end)):
        model.add_callback(event, fn)
    callbacks, other, stats, bookkeeping = Timer(), Timer(), Timer(), Timer()
    if not setting.startswith("none"):
        extra = {} if args.flush_interval is None else {"flush_interval": args.flush_interval}
        track(model, project="bench-assign", name=f"{setting}-{tag}", assign_stats=setting == "assign", **extra)
        state = next(fn.__self__ for hooks in model.callbacks.values() for fn in hooks
                     if type(getattr(fn, "__self__", None)).__name__ == "_Tracker")
        probe.run = lambda: state.run
        _time_tracker_callbacks(model, callbacks, other)
        _time_main_thread_work(model, stats if setting == "assign" else None, bookkeeping)
    probe.marks["called"] = time.perf_counter()
    model.train(data=str(data), epochs=1, imgsz=args.imgsz, batch=args.batch, nbs=args.batch, device=args.device,
                workers=0, plots=False, val=False, project=str(workdir / "runs"), name=f"{setting}-{tag}",
                verbose=False, amp=False, seed=0, exist_ok=True)
    probe.marks["returned"] = time.perf_counter()
    return _result(probe, gc_timer, callbacks, other, stats, bookkeeping)


def _result(probe: Probe, gc_timer: GcTimer, callbacks: Timer, other: Timer, stats: Timer,
            bookkeeping: Timer) -> dict[str, Any]:
    from bench._threads import cpu_delta

    starts, cpu, marks = probe.starts, probe.cpu, probe.marks
    m0, m1 = marks.get("machine", (0.0, 0.0, 0.0)), marks.get("machine_after", (0.0, 0.0, 0.0))
    return {
        "steps": [b - a for a, b in zip(starts, starts[1:])][WARMUP:],
        "cpu": [b - a for a, b in zip(cpu, cpu[1:])][WARMUP:],
        "losses": probe.losses, "torch_threads": marks.get("torch_threads"),
        "callbacks": callbacks.seconds, "other": other.seconds, "stats": stats.seconds,
        "bookkeeping": bookkeeping.seconds,
        "threads": cpu_delta(marks.get("threads", {}), marks.get("threads_after", {})),
        "gc": (gc_timer.main_s, gc_timer.main_n, gc_timer.other_s, gc_timer.other_n, gc_timer.full_n),
        "steal": m1[1] - m0[1], "others_cpu": (m1[0] - m0[0]) - (m1[2] - m0[2]),
        "total": starts[-1] - starts[WARMUP] if len(starts) > WARMUP + 1 else 0.0,
        "before_s": starts[0] - marks["called"] if starts else 0.0,
        "after_s": marks["returned"] - marks.get("ended", marks["returned"]),
        "flushes": (marks["flushes_after"] - marks["flushes"]) if marks.get("flushes") is not None else None,
    }


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

    ul.ClassificationLoss.record = _PLAIN_RECORD  # type: ignore[method-assign]
    importlib.reload(ua)


_PLAIN_RECORD: Any = None


def bookkeeping_sums(batch: int, imgsz: int, reps: int) -> tuple[float, float]:
    """Process CPU seconds (medians of interleaved calls) of the classification-loss bookkeeping's two
    reductions on a ``(batch, anchors, 80)`` loss and targets: float32 sums (what
    ``ClassificationLoss.record`` does) against the float64 accumulation it did before."""
    import torch

    anchors = sum((imgsz // s) ** 2 for s in (8, 16, 32))
    gen = torch.Generator().manual_seed(0)
    out = torch.rand(batch, anchors, 80, generator=gen)
    targets = out * (torch.rand(batch, anchors, 80, generator=gen) < 0.01)
    ways = {"f32": lambda: (out.reshape(-1, 80).sum(dim=0), targets.sum()),
            "f64": lambda: (out.reshape(-1, 80).sum(dim=0, dtype=torch.float64), targets.sum(dtype=torch.float64))}
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(reps):
        for key, fn in ways.items():
            t0 = time.process_time()
            fn()
            times[key].append(time.process_time() - t0)
    return statistics.median(times["f32"]), statistics.median(times["f64"])


def print_bookkeeping(args: argparse.Namespace) -> None:
    """The bookkeeping's reductions at the bench's size and at Ultralytics' default imgsz 640, batch 16."""
    for batch, imgsz, reps in ((args.batch, args.imgsz, 400), (16, 640, 5 if args.quick else 15)):
        f32, f64 = bookkeeping_sums(batch, imgsz, reps)
        print(f"  classification-loss bookkeeping alone, batch {batch} at imgsz {imgsz} (CPU, torch threads "
              f"{__import__('torch').get_num_threads()}): float32 sums {1e6 * f32:.1f} us, the float64 accumulation "
              f"of before {1e6 * f64:.1f} us ({f64 / max(f32, 1e-9):.1f}x)")


def read_back(home: Path) -> str:
    """The ``assign/gt`` rows of the ``assign`` runs: present and whole-numbered."""
    from tracker.store import Store

    df = Store(home).query("SELECT run_id, count(*) AS n, sum(value) AS boxes FROM class_curves "
                           "WHERE key = 'assign/gt' GROUP BY run_id ORDER BY run_id")
    if df.height == 0:
        return "read-back FAILED: no assign/gt rows"
    ok = all(float(b) == int(b) and b > 0 for b in df["boxes"].to_list())
    return f"read-back {'ok' if ok else 'FAILED'}: {df.height} runs with assign/gt, {int(df['boxes'].sum())} boxes"


def _prepare(args: argparse.Namespace) -> tuple[Path, Path, Path, Path]:
    """A private offline Ultralytics folder, a tracker home at the defaults, the dataset, and a small one
    for the untimed block."""
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

    _PLAIN_RECORD = ul.ClassificationLoss.__dict__["record"]
    LOGGER.setLevel(logging.WARNING)  # the model summary and progress bars of every training
    from tracker.integrations.yolo_synthetic import make_dataset

    data = make_dataset(workdir / "data", train=args.images, val=8, imgsz=args.imgsz).yaml
    warm = make_dataset(workdir / "warm", train=WARM_IMAGES, val=8, imgsz=args.imgsz).yaml
    return workdir, home, data, warm


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The bench's arguments; ``--quick`` is a smoke test (2 blocks of short trainings)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=BLOCKS, help=f"timed blocks of the three settings "
                        f"(default {BLOCKS})")
    parser.add_argument("--images", type=int, default=IMAGES, help="training images: steps per training = images / "
                        f"batch (default {IMAGES}: 150 steps, 146 timed, 2-3 of track()'s 5 s flushes)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads for every setting (default: Ultralytics' own, min(8, CPUs - 1))")
    parser.add_argument("--flush-interval", type=float, default=None,
                        help="track(flush_interval=...) (default: track()'s own, 5 s)")
    parser.add_argument("--control", action="store_true", help="an A/A control: a second untracked setting, "
                        "none2, in every block (none2 vs none is the bench's own noise and order effect)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 blocks of 96 images (no periodic flush "
                        "falls in so short a training)")
    args = parser.parse_args(argv)
    if args.quick:
        args.blocks, args.images = 2, 96
    if args.blocks < 1 or args.images < (WARMUP + 3) * args.batch:
        parser.error(f"--blocks must be >= 1 and --images >= {(WARMUP + 3) * args.batch} (6 batches)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    t_start, load0 = time.perf_counter(), os.getloadavg()[0]
    workdir, home, data, warm = _prepare(args)
    settings = (*SETTINGS, "none2") if args.control else SETTINGS
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
    baseline = {t.ident for t in threading.enumerate()}
    gc_timer = GcTimer()
    for setting in settings:  # the untimed block: one-time imports of the process
        train_once(setting, warm, args, workdir, "warmup", gc_timer)
        _restore_probes()
        settle(baseline)
    waited: dict[str, float] = {s: 0.0 for s in settings}
    for b in range(args.blocks):
        order = list(settings) if b % 2 == 0 else list(reversed(settings))
        for setting in order:
            results[setting].append(train_once(setting, data, args, workdir, f"b{b}", gc_timer))
            _restore_probes()
            waited[setting] += settle(baseline)
        steps = sum(len(results[s][-1]["steps"]) for s in settings)
        print(f"block {b + 1}/{args.blocks}: " + ", ".join(
            f"{s} {1000 * statistics.median(results[s][-1]['steps']):.1f} ms" for s in order)
            + f"  (steal {1000 * sum(results[s][-1]['steal'] for s in settings) / steps:.1f} ms/step, other "
              f"processes {1000 * sum(results[s][-1]['others_cpu'] for s in settings) / steps:.0f} ms CPU/step)",
              flush=True)
    gc_timer.close()
    report(results, args, settings)
    print_bookkeeping(args)
    print("  threads left running after a training, waited for: " + ", ".join(
        f"{s} {waited[s] / args.blocks:.2f} s" for s in settings))
    print(read_back(home))
    print(f"load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
          f"{time.perf_counter() - t_start:.0f} s in all (python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
