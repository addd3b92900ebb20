"""Benchmark: the cost of logging on the training thread, and reading it back.

Logs 1,000,000 scalar points (10 keys x 100,000 steps) plus an 80-class vector every
10 steps, then prints:

* microseconds per scalar point spent in ``run.log`` on the training thread;
* seconds from the last ``log()`` until every point is queryable;
* bytes on disk once ingested;
* milliseconds to read one key's full 100k-point series: warm (the same process,
  again and again); cold after imports (``tracker.query`` as the first query of a
  fresh process, its clock started after importing tracker, duckdb, polars and
  pyarrow); cold as a whole new interpreter (``python -c "import tracker;
  tracker.query(...)"``, wall clock measured from outside: interpreter start,
  imports and query); and ``tracker sql ... --format csv`` end to end (a new
  interpreter), each the median of 15 fresh processes.

The run here has the online analysis and the system sampler off, to time the
logging path alone; ``make bench-peers`` (bench/peers.py) runs ours at its defaults
beside the other trackers.

Targets: <= 2 us per point, <= 3 s until queryable, <= 50 ms to read one key warm,
<= 25 ms cold after imports, <= 0.5 s through the CLI.

Then a max-lag table: for logging rates from 10k to 1M points/s (10 keys per step,
paced), how old the newest durable row gets (the segment JSON's last step, sampled
every 20 ms, against when that step was logged) compared with the flush interval
(target: never older than 2 intervals), the rate ``log()`` actually sustained (it
waits when the loggers fall behind), and the process's peak RSS (bounded).

Run: ``.venv/bin/python bench/logging.py`` (``--lag-only``, ``--seconds N`` per rate,
``--rates 10000,1000000``).
"""

from __future__ import annotations

import sys

# This file is named like the standard library's ``logging``: keep its folder off the path.
_HERE = __file__.rsplit("/", 1)[0] if "/" in __file__ else "."
sys.path[:] = [p for p in sys.path if p not in ("", _HERE) and not p.endswith("/bench")]

import argparse
import json
import os
import statistics
import threading
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tracker  # noqa: E402
from tracker.run import MAX_BUFFERED_ROWS  # noqa: E402
from tracker.store import Store  # noqa: E402

STEPS = 100_000
KEYS = [f"loss/k{i}" for i in range(10)]
CLASSES = 80


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def lag_at_rate(rate: int, seconds: float) -> dict[str, float]:
    """Log ``rate`` points/s (10 keys per step) for ``seconds``; the lag and RSS figures."""
    home = Path(tempfile.mkdtemp(prefix="tracker-lag-"))
    os.environ["TRACKER_HOME"] = str(home)
    run = tracker.init("bench", run_id=f"lag{rate}", loggers=["store"], config={"analysis": False})
    seg = home / "runs" / run.run_id / "seg-r0-s0000.json"
    steps_per_s = rate / len(KEYS)
    logged_at = np.full(int(steps_per_s * seconds) + 10, np.nan)
    stop = threading.Event()
    lags: list[float] = []
    peak = [rss_mb()]
    t0 = time.monotonic()

    def sample() -> None:
        while not stop.wait(0.02):
            now = time.monotonic()
            try:
                last = json.loads(seg.read_bytes()).get("last_step")
            except (OSError, ValueError):
                last = None
            lags.append(now - (t0 if last is None else logged_at[last]))
            peak[0] = max(peak[0], rss_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    log = run.log
    row = dict.fromkeys(KEYS, 0.5)
    step = 0
    end = t0 + seconds
    while True:
        now = time.monotonic()
        if now >= end:
            break
        due = min(int((now - t0) * steps_per_s) + 1, len(logged_at))
        while step < due:
            logged_at[step] = time.monotonic()
            log(row, step=step)
            step += 1
        if step >= due:
            time.sleep(0.0005)
    elapsed = time.monotonic() - t0
    stop.set()  # the lag counts while logging: afterwards the newest row only ages
    sampler.join()
    run.finish()
    return {
        "rate": rate,
        "achieved": step * len(KEYS) / elapsed,
        "max_lag_s": max(lags),
        "p99_lag_s": float(np.percentile(lags, 99)),
        "interval_s": run.flush_interval,
        "peak_rss_mb": peak[0],
        "dropped": sum(run.dropped_rows.values()),
    }


def lag_table(rates: list[int], seconds: float) -> None:
    os.environ["TRACKER_INGEST_ON_FINISH"] = "0"
    print(f"max lag of the newest durable row ({seconds:g} s per rate, flush interval 1 s, target <= 2 intervals)")
    print(f"  {'rate pts/s':>11} {'achieved':>11} {'max lag s':>9} {'p99 lag s':>9} {'x interval':>10} "
          f"{'peak RSS MB':>11} {'dropped':>7}")
    for rate in rates:
        r = lag_at_rate(rate, seconds)
        print(f"  {rate:>11,} {r['achieved']:>11,.0f} {r['max_lag_s']:>9.2f} {r['p99_lag_s']:>9.2f} "
              f"{r['max_lag_s'] / r['interval_s']:>10.2f} {r['peak_rss_mb']:>11.0f} {r['dropped']:>7,}")


_COLD = """
import os, sys, time
import tracker, tracker.store.local, duckdb, polars, pyarrow
t0 = time.perf_counter()
df = tracker.query(sys.argv[1])
print(time.perf_counter() - t0, df.height)
"""


_WHOLE = "import sys, tracker; assert tracker.query(sys.argv[1]).height"


def cold_reads(home: Path, sql: str, rounds: int = 15) -> tuple[list[float], list[float], list[float]]:
    """Seconds of the first query in fresh processes after their imports, of a whole new
    interpreter that imports tracker and queries (timed from outside), and of `tracker sql`."""
    import subprocess

    env = {**os.environ, "TRACKER_HOME": str(home)}
    first, whole, cli = [], [], []
    for _ in range(rounds):
        out = subprocess.run([sys.executable, "-c", _COLD, sql], env=env, capture_output=True, text=True, check=True)
        first.append(float(out.stdout.split()[0]))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", _WHOLE, sql], env=env, check=True)
        whole.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tracker.cli", "sql", sql, "--format", "csv"], env=env,
                       stdout=subprocess.DEVNULL, check=True)
        cli.append(time.perf_counter() - t0)
    return first, whole, cli


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="tracker-bench-"))
    os.environ["TRACKER_HOME"] = str(home)
    run = tracker.init("bench", run_id="logging", loggers=["store"], config={"analysis": False},
                        system=False)
    per_class = np.random.default_rng(0).random(CLASSES)
    values = np.random.default_rng(1).random((1000, len(KEYS))).tolist()
    log, log_classes = run.log, run.log_classes
    t_scalar = 0.0
    t_class = 0.0
    for block in range(STEPS // 1000):
        base = block * 1000
        t0 = time.perf_counter()
        for i in range(1000):
            v = values[i]
            log({KEYS[0]: v[0], KEYS[1]: v[1], KEYS[2]: v[2], KEYS[3]: v[3], KEYS[4]: v[4],
                 KEYS[5]: v[5], KEYS[6]: v[6], KEYS[7]: v[7], KEYS[8]: v[8], KEYS[9]: v[9]}, step=base + i)
        t1 = time.perf_counter()
        for i in range(0, 1000, 10):
            log_classes("loss/cls", per_class, step=base + i)
        t_scalar += t1 - t0
        t_class += time.perf_counter() - t1
    t_last = time.perf_counter()
    store = Store(home)
    expected = STEPS * len(KEYS)
    while True:
        n = store.query("SELECT (SELECT count(*) FROM curves) AS n, (SELECT count(*) FROM class_curves) AS c").row(0)
        if n[0] == expected and n[1] == STEPS // 10 * CLASSES:
            break
        time.sleep(0.05)
    queryable_s = time.perf_counter() - t_last
    run.finish()
    store.ingest()
    disk = du(home)
    sql = "SELECT step, value FROM curves WHERE run_id = 'logging' AND key = 'loss/k3' ORDER BY step"
    reads = []
    for _ in range(7):
        t0 = time.perf_counter()
        df = store.query(sql)
        reads.append(time.perf_counter() - t0)
    assert df.height == STEPS
    us_point = t_scalar / expected * 1e6
    us_class = t_class / (STEPS // 10) * 1e6
    read_ms = statistics.median(reads) * 1000
    print(f"logged {expected:,} scalar points + {STEPS // 10:,} x {CLASSES}-class vectors")
    print(f"  training thread : {us_point:6.2f} us per scalar point   (target <= 2.0; ratio {us_point / 2.0:.2f})")
    print(f"                    {us_class:6.2f} us per log_classes call ({CLASSES} values)")
    print(f"                    {t_scalar + t_class:6.2f} s in log()/log_classes() in all "
          "(online analysis and system sampler off; other trackers: make bench-peers)")
    print(f"                    {run.backpressure_s:6.2f} s of it waiting for the writer (buffer bound "
          f"{MAX_BUFFERED_ROWS:,} values); {(t_scalar + t_class - run.backpressure_s) / expected * 1e6:.2f} us "
          "per point without it")
    print(f"  queryable after : {queryable_s:6.2f} s from the last log()   (target <= 3.0; ratio {queryable_s / 3.0:.2f})")
    print(f"  bytes on disk   : {disk / 1e6:6.1f} MB ({disk / (expected + STEPS // 10 * CLASSES):.1f} B per point)")
    print(f"  read one key    : {read_ms:6.1f} ms median of 7 (first {reads[0] * 1000:.1f} ms) for {STEPS:,} points"
          f"   (target <= 50; ratio {read_ms / 50:.2f})")
    from tracker.store import release

    release()
    os.sync()  # the store's file was just written: let its write-back finish before timing reads
    print_cold_reads(home, sql)


def print_cold_reads(home: Path, sql: str) -> None:
    """The cold-read lines: after imports, a whole new interpreter, and `tracker sql`."""
    first, whole, cli = cold_reads(home, sql)
    cold_ms = statistics.median(first) * 1000
    print(f"  cold read, after imports: {cold_ms:6.1f} ms median of {len(first)} fresh processes "
          f"({min(first) * 1000:.1f}-{max(first) * 1000:.1f}), the first query, clock started after importing "
          f"tracker, duckdb, polars, pyarrow   (target <= 25; ratio {cold_ms / 25:.2f})")
    print(f"  cold read, whole process: {statistics.median(whole):6.2f} s median of {len(whole)} "
          f"({min(whole):.2f}-{max(whole):.2f}), python -c \"import tracker; tracker.query(...)\" timed from "
          "outside: interpreter start, imports and query")
    print(f"  tracker sql     : {statistics.median(cli):6.2f} s median of {len(cli)}, a new interpreter to CSV on "
          f"stdout ({min(cli):.2f}-{max(cli):.2f})   (target <= 0.5; ratio {statistics.median(cli) / 0.5:.2f})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="logging benchmark")
    ap.add_argument("--lag-only", action="store_true", help="only the max-lag table")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds of logging per rate in the lag table")
    ap.add_argument("--rates", default="10000,100000,300000,1000000", help="points/s, comma-separated")
    args = ap.parse_args()
    if not args.lag_only:
        main()
    lag_table([int(x) for x in args.rates.split(",")], args.seconds)
