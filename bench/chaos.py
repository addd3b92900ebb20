"""Chaos benchmark: many kill -9 rounds, then a soak at full logging speed.

* Rounds (:mod:`tests.harness.chaos`): a trainer and an ingester killed with
  SIGKILL at random moments (while starting, resuming, logging, ingesting), each
  round checked for duplicates, gaps and lost durable rows; the counts are printed.
* Soak: one process logs 10 keys per step as fast as it can (no pacing) for a while;
  RSS is sampled every 0.5 s (start, peak, end and a timeline), with the points
  logged, the values dropped (none expected) and the newest durable row's lag.

Run: ``.venv/bin/python bench/chaos.py`` (``--rounds N``, ``--soak-s S``; defaults keep
it near a minute on a small machine).
"""

from __future__ import annotations

import sys

# bench/logging.py shadows the standard library's ``logging``: keep this folder off the path.
_HERE = __file__.rsplit("/", 1)[0] if "/" in __file__ else "."
sys.path[:] = [p for p in sys.path if p not in ("", _HERE) and not p.endswith("/bench")]

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tracker  # noqa: E402
from tests.harness.chaos import run_rounds  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def rounds(n: int, seed: int) -> None:
    home = Path(tempfile.mkdtemp(prefix="tracker-chaos-"))
    t0 = time.monotonic()
    report = run_rounds(home, n, seed=seed, max_kill_s=1.5, then_steps=1000)
    took = time.monotonic() - t0
    print(f"chaos: {report.summary()}")
    print(f"  {took:.1f} s; durable last step after each round: {report.durable_steps}")


def soak(seconds: float) -> None:
    home = Path(tempfile.mkdtemp(prefix="tracker-soak-"))
    os.environ["TRACKER_HOME"] = str(home)
    os.environ["TRACKER_INGEST_ON_FINISH"] = "0"
    run = tracker.init("soak", run_id="soak", loggers=["store"], config={"analysis": False})
    seg = home / "runs" / "soak" / "seg-r0-s0000.json"
    keys = [f"loss/k{i}" for i in range(10)]
    row = dict.fromkeys(keys, 0.5)
    timeline: list[tuple[float, float, int, int]] = []
    stop = threading.Event()
    box = {"step": 0}
    t0 = time.monotonic()

    def sample() -> None:
        while not stop.wait(0.5):
            try:
                durable = json.loads(seg.read_bytes()).get("last_step") or 0
            except (OSError, ValueError):
                durable = 0
            timeline.append((time.monotonic() - t0, rss_mb(), box["step"], durable))

    start_rss = rss_mb()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    log = run.log
    step = 0
    end = t0 + seconds
    while True:
        for _ in range(1000):
            log(row, step=step)
            step += 1
        box["step"] = step
        if time.monotonic() >= end:
            break
    elapsed = time.monotonic() - t0
    stop.set()
    sampler.join()
    run.finish()
    end_rss = rss_mb()
    peak = max([start_rss, end_rss, *(r for _, r, _, _ in timeline)])
    points = step * len(keys)
    worst = max((logged - durable for _, _, logged, durable in timeline), default=0)
    print(f"soak: {points:,} points in {elapsed:.1f} s ({points / elapsed:,.0f} points/s, unthrottled loop); "
          f"dropped {sum(run.dropped_rows.values()):,}; log() waited {run.backpressure_s:.1f} s for the writer")
    print(f"  RSS MB start {start_rss:.0f}, peak {peak:.0f}, end {end_rss:.0f}; "
          f"most steps logged but not yet durable at a sample: {worst:,}")
    print("  RSS timeline (s: MB): " + ", ".join(f"{t:.0f}: {r:.0f}" for t, r, _, _ in timeline[1::2]))


def main() -> None:
    ap = argparse.ArgumentParser(description="kill -9 rounds and a memory soak")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--soak-s", type=float, default=15.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print("figures from this machine (shared, loaded: read them as lower bounds)")
    if args.rounds:
        rounds(args.rounds, args.seed)
    if args.soak_s:
        soak(args.soak_s)


if __name__ == "__main__":
    main()
