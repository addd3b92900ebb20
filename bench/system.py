"""Benchmark: the system sampler's own cost, and its cost to the training thread.

Prints:

* the sampler's CPU time per sample (every source on: psutil's process and host
  figures, CUDA where torch initialised it, the Vulkan pool where live) and what
  that is at the default 2 s interval, as a share of one core (target < 1%);
  then the same measured over a real stretch of a run at the default interval;
* the training thread's ``run.log`` cost with the sampler on (at 0.05 s, forty
  times the default rate, so any contention shows) and off, median of alternating
  runs (target: no change; nothing in ``run.log`` knows the sampler).

``--pool-trace``: instead, replays a YOLO-like variable-size allocation trace
(``bench/memory_pool.py``) step by step on our pool, the PyTorch caching policy
and an exact-size cache, logs each as a run of ``sys/pool/*`` keys under
``$TRACKER_HOME`` (project ``pool-trace``) and prints their run ids: open the web
UI's System page to see the curves and the fragmentation events.

Run: ``.venv/bin/python bench/system.py`` (``--seconds 20``, ``--pool-trace --steps 600``).
"""

from __future__ import annotations

import sys

# bench/ holds a logging.py: keep the folder off the path so the standard library's wins.
_HERE = __file__.rsplit("/", 1)[0] if "/" in __file__ else "."
sys.path[:] = [p for p in sys.path if p not in ("", _HERE) and not p.endswith("/bench")]

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tracker  # noqa: E402
from plugins.system import SystemSampler, log_pool_replay, sampler_for  # noqa: E402
from tracker.system import DEFAULT_INTERVAL_S  # noqa: E402

TARGET_SHARE = 0.01


def per_sample_cost(samples: int = 300) -> tuple[float, int]:
    """(CPU seconds per sample, keys per sample) of the sampler with every source, back to back."""
    run = tracker.init("bench-system", system=False, loggers=["store"])
    run.log({"loss": 1.0}, step=0)
    sampler = SystemSampler(run, DEFAULT_INTERVAL_S)
    sampler.tick()  # builds the sources
    keys = len(sampler.sample())
    sampler.cpu_seconds, sampler.samples = 0.0, 0
    for step in range(1, samples + 1):
        run.log({"loss": 1.0}, step=step)
        sampler.tick()
    run.finish()
    return sampler.cpu_seconds / samples, keys


def real_stretch(seconds: float) -> tuple[float, int, float]:
    """(sampler CPU seconds, samples, wall seconds) over a run at the default interval."""
    run = tracker.init("bench-system", system=True, loggers=["store"])
    sampler = sampler_for(run)
    assert sampler is not None and sampler.interval == DEFAULT_INTERVAL_S
    t0 = time.perf_counter()
    step = 0
    while time.perf_counter() - t0 < seconds:
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        step += 1
        time.sleep(0.005)
    wall = time.perf_counter() - t0
    cpu, samples = sampler.cpu_seconds, sampler.samples
    run.finish()
    return cpu, samples, wall


def log_cost(steps: int, system: bool | float) -> float:
    """Microseconds per run.log call (5 keys) on the training thread."""
    run = tracker.init("bench-system", system=system, loggers=["store"], config={"analysis": False})
    log = run.log
    t0 = time.perf_counter()
    for i in range(steps):
        log({"loss/box": 1.0, "loss/cls": 2.0, "loss/dfl": 0.5, "loss": 3.5, "lr": 0.01}, step=i)
    dt = time.perf_counter() - t0
    run.finish()
    return dt / steps * 1e6


def pool_trace(steps: int, seed: int) -> None:
    """Log the variable-size trace on three pools as three runs; print their ids and figures."""
    spec = importlib.util.spec_from_file_location("bench_memory_pool", ROOT / "bench" / "memory_pool.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    from gpu.pool import Pool
    from gpu.pool_sim import NaivePool, TorchCachingPool

    handles = iter(range(1, 1 << 62))
    per_step = [bench.build_trace(1, 16, seed * 1_000_003 + i) for i in range(steps)]
    print(f"variable-size trace: {steps} steps, batch 16 (bench/memory_pool.py), logged under {os.environ['TRACKER_HOME']}")
    for name, pool in (("gpu.pool.Pool", Pool(lambda n: next(handles), lambda h: None)),
                       ("PyTorch caching policy", TorchCachingPool()), ("exact-size cache", NaivePool())):
        run = tracker.init("pool-trace", name=name, system=False, loggers=["store"])
        log_pool_replay(run, per_step, pool)
        run.finish()
        stats = pool.memory_stats()
        print(f"  {name:<24} run {run.run_id}  peak live {stats.peak_live / 2**20:8.1f} MiB  "
              f"reserved {stats.reserved / 2**20:8.1f} MiB  ratio {stats.reserved / stats.peak_live:5.2f}")


def main() -> None:
    """Run the measurements and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the real stretch")
    parser.add_argument("--pool-trace", action="store_true", help="log the pool trace runs instead")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("TRACKER_HOME", tempfile.mkdtemp(prefix="tracker-bench-system-"))
    os.environ["TRACKER_LOGGERS"] = "store"
    if args.pool_trace:
        pool_trace(args.steps, args.seed)
        return
    cost, keys = per_sample_cost()
    share = cost / DEFAULT_INTERVAL_S
    print(f"sampler: {cost * 1e3:.2f} ms CPU per sample ({keys} keys, incl. run.log), "
          f"{share:.3%} of one core at the default {DEFAULT_INTERVAL_S:g} s interval "
          f"(target < {TARGET_SHARE:.0%}; ratio {share / TARGET_SHARE:.3f})")
    cpu, samples, wall = real_stretch(args.seconds)
    print(f"sampler over a real {wall:.1f} s stretch at {DEFAULT_INTERVAL_S:g} s: {samples} samples, "
          f"{cpu * 1e3:.1f} ms CPU in all, {cpu / wall:.3%} of one core")
    pairs = [(log_cost(100_000, 0.05), log_cost(100_000, False)) for _ in range(5)]
    on, off = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    print(f"training thread, run.log (5 keys), median of 5 alternating runs of 100,000 steps: {on:.2f} us with "
          f"the sampler at 0.05 s, {off:.2f} us without (ratio {on / off:.2f}; the sampler has its own thread "
          "and run.log has no code for it)")


if __name__ == "__main__":
    main()
