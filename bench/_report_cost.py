"""The printed figures of ``bench/assign_cost.py``: settings, step times, paired ratios, measured shares.

``results[setting]`` is one dict a timed training (block order), as
``bench.assign_cost.train_once`` returns it: ``steps`` and ``cpu`` (seconds per timed step:
wall, and process CPU of all threads), ``losses`` (every step's loss), the tracker's
measured seconds, per-thread CPU, garbage collections, steal and the other processes' CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any, Sequence

from bench._threads import background, block_ratios, median_interval, outliers

PAIRS = (("track", "none", 1.0), ("assign", "track", 3.0), ("none2", "none", None))  # the last: --control
Results = dict[str, list[dict[str, Any]]]


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def report(results: Results, args: argparse.Namespace, settings: Sequence[str]) -> None:
    """Print every figure of the bench (see its module doc)."""
    print()
    print_settings(results, args, settings)
    print_steps(results, settings)
    print_overheads(results)
    print_like_with_like(results, settings)
    from tracker.integrations.ultralytics import FLUSH_INTERVAL_S

    print_measured(results, args.flush_interval or FLUSH_INTERVAL_S)
    print_threads(results)


def print_settings(results: Results, args: argparse.Namespace, settings: Sequence[str]) -> None:
    """What was compared, with which settings."""
    import torch
    import ultralytics

    from tracker.system import system_options

    threads = sorted({r["torch_threads"] for s in settings for r in results[s]} - {None})
    timed = len(results[settings[0]][0]["steps"])
    sampler = system_options(None)
    print(f"YOLO11n (yolo11n.yaml), imgsz {args.imgsz}, batch {args.batch} (nbs {args.batch}), {args.images} "
          f"images: {timed} timed steps per training after {3}; device {args.device}, workers 0, amp off, val off, "
          f"seed 0, one epoch")
    print(f"  {args.blocks} blocks of the {len(settings)} settings in ABC/CBA order after an untimed one; torch "
          f"threads "
          f"{', '.join(map(str, threads))} in every setting ("
          f"{'--threads' if args.threads is not None else 'Ultralytics: min(8, CPUs - 1)'}); {os.cpu_count()} CPUs")
    print(f"  track(): flush interval {args.flush_interval or 'default (5 s)'}, loggers "
          f"{os.environ.get('TRACKER_LOGGERS') or 'default (store)'}, online analysis on, system sampler "
          f"{'every %g s' % sampler.interval if sampler.enabled else 'off'}; torch {torch.__version__}, "
          f"ultralytics {ultralytics.__version__}")


def print_steps(results: Results, settings: Sequence[str]) -> None:
    """Per setting: pooled step statistics, slow steps, CPU per step, garbage collections, load."""
    for s in settings:
        runs = results[s]
        steps = [x for r in runs for x in r["steps"]]
        cpu = [x for r in runs for x in r["cpu"]]
        n = len(steps)
        slow = [outliers(r["steps"]) for r in runs]
        n_slow = sum(k for k, _ in slow)
        share = sum(f * r["total"] for (_, f), r in zip(slow, runs)) / max(sum(r["total"] for r in runs), 1e-9)
        gc_main = sum(r["gc"][0] for r in runs) / n
        gc_other = sum(r["gc"][2] for r in runs) / n
        full = sum(r["gc"][4] for r in runs)
        print(f"  {s:7s} {n:5d} steps  median {1000 * statistics.median(steps):7.2f} ms  mean "
              f"{1000 * _mean(steps):7.2f} ms  p90 {1000 * sorted(steps)[int(0.9 * n)]:7.2f} ms  max "
              f"{1000 * max(steps):7.1f} ms  process CPU {1000 * _mean(cpu):6.2f} ms/step")
        print(f"          slow steps (> 1.5x their training's median): {n_slow} ({100 * n_slow / n:.1f}%), "
              f"{100 * share:.2f}% of the time beyond the median; gc {1000 * gc_main:.2f} ms/step on the training "
              f"thread, {1000 * gc_other:.2f} on others, {full} full; steal "
              f"{1000 * sum(r['steal'] for r in runs) / n:.1f} ms/step, other processes "
              f"{1000 * sum(r['others_cpu'] for r in runs) / n:.0f} ms CPU/step")


def print_overheads(results: Results) -> None:
    """The paired estimator for each comparison, and the pooled ratios beside it."""
    print("  overheads: the median over blocks of each block's ratio [95% bootstrap interval over blocks]; pooled")
    for a, b, target in PAIRS:
        if a not in results:
            continue
        ra, rb = results[a], results[b]
        parts = []
        for label, key, stat in (("median step", "steps", statistics.median), ("mean step", "steps", _mean),
                                 ("process CPU per step", "cpu", _mean)):
            med, lo, hi = median_interval(block_ratios([r[key] for r in ra], [r[key] for r in rb], stat))
            pa = [x for r in ra for x in r[key]]
            pb = [x for r in rb for x in r[key]]
            parts.append(f"{label} {_pct(med)} [{_pct(lo)}, {_pct(hi)}] (pooled {_pct(stat(pa) / stat(pb) - 1)})")
        what = f"target <= {target:.0f}%" if target is not None else "A/A control: the same setting twice"
        print(f"  {a} vs {b} ({what}): " + "; ".join(parts))


def print_like_with_like(results: Results, settings: Sequence[str]) -> None:
    """Whether every setting trained on the same batches to the same losses (bit for bit)."""
    ref = results[settings[0]][0]["losses"]
    worst, same = 0.0, True
    for s in settings:
        for r in results[s]:
            same = same and r["losses"] == ref
            worst = max([worst, *(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(r["losses"], ref))])
    print(f"  like with like: every training's per-step losses {'are bit-identical' if same else 'DIFFER'} across "
          f"the settings ({len(ref)} steps each; largest relative difference {worst:.2g})")


def print_measured(results: Results, flush_interval: float) -> None:
    """The tracker's own time on the training thread, as a share of the step."""
    for s in ("track", "assign"):
        total = sum(r["total"] for r in results[s])
        cb = sum(r["callbacks"] for r in results[s])
        book = sum(r["bookkeeping"] for r in results[s])
        other = _mean([r["other"] for r in results[s]])
        print(f"  measured on the training thread ({s}): per-batch callbacks {100 * cb / total:.3f}%, "
              f"classification-loss bookkeeping {100 * book / total:.3f}% of the step time; "
              f"setup, epoch ends and finish: {other:.2f} s per training")
    total = sum(r["total"] for r in results["assign"])
    st = sum(r["stats"] for r in results["assign"])
    step = statistics.median([x for r in results["track"] for x in r["steps"]])
    parts = []
    for s in ("track", "assign"):
        n, steps = sum(r["flushes"] for r in results[s]), sum(len(r["steps"]) for r in results[s])
        parts.append(f"{s} {n / len(results[s]):.1f} per training" + (f" (one every {steps / n:.0f} steps)" if n else ""))
    print("  track()'s periodic flushes within the timed steps: " + ", ".join(parts)
          + f"; a long training at this step time: one every {flush_interval / step:.0f} steps")
    print("  untimed, per training: " + ", ".join(
        f"{s} {_mean([r['before_s'] for r in results[s]]):.2f} s before the first step and "
        f"{_mean([r['after_s'] for r in results[s]]):.2f} s after the last (validation, checkpoints, finish)"
        for s in results))
    print(f"  measured inside the statistics (probes, copy, logging): {100 * st / total:.3f}% of the step time "
          "(target <= 3%)")


def print_threads(results: Results) -> None:
    """The CPU of the threads that are not the training's, per 100 steps (load-independent)."""
    for s in ("track", "assign"):
        n = sum(len(r["steps"]) for r in results[s])
        wall = sum(r["total"] for r in results[s])
        names = sorted({k for r in results[s] for k in r["threads"]})
        per = {k: sum(r["threads"].get(k, 0.0) for r in results[s]) for k in names}
        bg = background(per)
        parts = ", ".join(f"{k} {1000 * v * 100 / n:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])
                          if k != "main" and not k.startswith("native:") and v > 0)
        print(f"  background threads ({s}): {1000 * bg * 100 / n:.1f} ms CPU per 100 steps, "
              f"{100 * bg / wall:.2f}% of the wall time ({parts or 'none'})")
