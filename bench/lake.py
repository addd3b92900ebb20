"""Benchmark: many "hosts" writing one DuckLake (PostgreSQL catalog) at once.

Starts a throw-away PostgreSQL server (``tracker.testing.postgres``; or pass
``--store``/``--data-path``), then runs the same workload twice, in the same run:

1. ``--hosts`` writer processes, each with its own local DuckDB store (the baseline);
2. ``--hosts`` writer processes ("hosts": separate TRACKER_HOME spools) sharing only
   the lake's catalog and data path, while a reader queries the lake every second.

Each writer logs ``--keys`` keys x ``--steps`` steps. Prints: training-thread cost per
point on both stores and their ratio (target <= 1.5), seconds from the last log to all
rows visible in the lake (target <= 5), commits, conflicts retried, rows lost and
duplicated (0 and 0), reader queries, and one key's full-curve read latency on the
lake against the local store (same data).

The full size is ``--hosts 8 --keys 10 --steps 100000``; the default (2 hosts x 10
keys x 50,000 steps) runs in about a minute on a small shared machine. Runs much
shorter than that mostly measure one-off costs (loading the extensions, attaching).

Run: ``.venv/bin/python bench/lake.py [--hosts 8 --steps 100000]``
"""

from __future__ import annotations

import sys

# bench/ holds a module named like the standard library's ``logging``: keep it off the path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0]) and not p.endswith("/bench")]

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WRITER = """
import json, os, sys, time
import tracker
keys = [f"loss/k{i}" for i in range(int(os.environ["KEYS"]))]
steps = int(os.environ["STEPS"])
run = tracker.init("bench", run_id=os.environ["RUN_ID"], config={"analysis": False})
spent = 0.0
for step in range(steps):
    values = {k: 1.0 / (step + 1 + i) for i, k in enumerate(keys)}
    t = time.perf_counter()
    run.log(values, step=step)
    spent += time.perf_counter() - t
last_log = time.time()
run.finish()
finish_s = time.time() - last_log
out = {"ns_per_point": spent / (steps * len(keys)) * 1e9, "last_log": last_log, "done": time.time(),
       "finish_s": finish_s}
try:
    from tracker.store.lake import STATS
    out.update(STATS)
except ImportError:
    pass
print(json.dumps(out), flush=True)
"""

READER = """
import os, sys, time
from pathlib import Path
from tracker.store.lake import LakeStore
store = LakeStore(Path(sys.argv[1]))
n = 0; worst = 0.0
while not os.path.exists(sys.argv[2]):
    t = time.perf_counter()
    store.query("SELECT count(*) FROM lake.main.metrics")
    worst = max(worst, time.perf_counter() - t); n += 1
    time.sleep(max(0.0, 1.0 - (time.perf_counter() - t)))
print(n, worst, flush=True)
"""


def _writers(n: int, env: dict[str, str], homes: list[Path], prefix: str) -> list[dict[str, float]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER], env={**env, "TRACKER_HOME": str(h), "RUN_ID": f"{prefix}{i}"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, h in enumerate(homes[:n])
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise SystemExit(f"writer failed ({p.returncode}):\n{err[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _read_ms(fn, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--keys", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50000)
    ap.add_argument("--committer", choices=("thread", "follow"), default="thread",
                    help="commit from each run's committer thread, or from one `tracker lake follow` per host")
    ap.add_argument("--store", default=None, help="an existing lake (default: a throw-away PostgreSQL)")
    ap.add_argument("--data-path", default=None)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tracker-bench-lake-"))
    server = None
    if args.store is None:
        from tracker.testing.postgres import PostgresServer

        server = PostgresServer()
        store, data_path = "ducklake:postgres:" + server.dsn(), str(tmp / "lake-data")
    else:
        store, data_path = args.store, args.data_path or str(tmp / "lake-data")
    base = {**os.environ, "PYTHONPATH": str(ROOT), "KEYS": str(args.keys), "STEPS": str(args.steps),
            "TRACKER_LOGGERS": "store"}
    base.pop("TRACKER_STORE", None)
    try:
        points = args.hosts * args.keys * args.steps
        print(f"{args.hosts} hosts x {args.keys} keys x {args.steps} steps = {points:,} points per store")
        local = _writers(args.hosts, base, [tmp / f"local{i}" for i in range(args.hosts)], "local")

        lake_env = {**base, "TRACKER_STORE": store, "TRACKER_DATA_PATH": data_path}
        os.environ.update(TRACKER_STORE=store, TRACKER_DATA_PATH=data_path)
        from tracker.store.lake import LakeStore

        LakeStore(tmp / "reader").init()
        stop = tmp / "stop"
        reader = subprocess.Popen([sys.executable, "-c", READER, str(tmp / "reader"), str(stop)], env=lake_env,
                                  stdout=subprocess.PIPE, text=True)
        visible_at: list[float] = []
        ours = "key LIKE 'loss/%'"  # the workload's keys (system metrics ride along)
        probe = LakeStore(tmp / "probe")

        def poll() -> None:
            while not visible_at and not stop.exists():
                if probe.query(f"SELECT count(*) AS n FROM lake.main.metrics WHERE {ours}")["n"][0] >= points:
                    visible_at.append(time.time())
                    return
                time.sleep(0.1)

        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        homes = [tmp / f"host{i}" for i in range(args.hosts)]
        followers = []
        if args.committer == "follow":
            lake_env["TRACKER_LAKE_COMMITTER"] = "follow"
            followers = [subprocess.Popen([sys.executable, "-m", "tracker.cli", "lake", "follow", "--home", str(h)],
                                          env=lake_env, stderr=subprocess.PIPE, text=True) for h in homes]
        lake = _writers(args.hosts, lake_env, homes, "host")
        watcher.join(120)
        conflicts = sum(int(r.get("conflicts", 0)) for r in lake)
        for f in followers:
            f.terminate()
            last = (f.communicate(timeout=120)[1].strip().splitlines() or [""])[-1]
            if last.startswith("stopped:"):  # "stopped: N commits, M conflicts retried"
                conflicts += int(last.split(",")[1].split()[0])
        stop.touch()
        reads, worst_read = reader.communicate(timeout=60)[0].split()

        counts = probe.query("SELECT count(*) AS n, count(DISTINCT (run_id, rank, key, step)) AS d "
                             f"FROM lake.main.metrics WHERE {ours}").row(0)
        ns_local = statistics.mean(r["ns_per_point"] for r in local)
        ns_lake = statistics.mean(r["ns_per_point"] for r in lake)
        last_log = max(r["last_log"] for r in lake)
        import tracker.store.local as local_mod

        local_store = object.__new__(local_mod.Store)
        local_mod.Store.__init__(local_store, tmp / "local0")
        curve = "SELECT step, value FROM curves WHERE run_id = ? AND key = 'loss/k0' ORDER BY step"
        ms_local = _read_ms(lambda: local_store.query(curve, ["local0"]))
        ms_lake = _read_ms(lambda: probe.query(curve, ["host0"]))
        print(f"training-thread cost per point: local {ns_local:,.0f} ns, lake {ns_lake:,.0f} ns "
              f"(ratio {ns_lake / ns_local:.2f}, target <= 1.5)")
        delay = (visible_at[0] - last_log) if visible_at else float("nan")
        print(f"last log -> all rows visible in the lake: {delay:.2f} s (target <= 5)")
        snaps = probe.snapshots()["changes"].to_list()
        commits = sum("ingested_files" in c or "inlined_insert" in c or "tables_inserted_into" in c for c in snaps)
        split = (f" (rows: {sum(int(r.get('conflicts_rows', 0)) for r in lake)}, "
                 f"run metadata: {sum(int(r.get('conflicts_meta', 0)) for r in lake)})") if args.committer == "thread" else ""
        print(f"committer: {args.committer}; commits: {commits} snapshots with rows, conflicts retried: {conflicts}{split}")
        if args.committer == "thread":
            spent = [r.get("commit_s", 0.0) / max(r.get("commits", 0), 1) for r in lake]
            print(f"commit transactions: {sum(int(r.get('commits', 0)) for r in lake)}, "
                  f"mean {statistics.mean(spent):.2f} s, slowest {max(r.get('commit_max_s', 0.0) for r in lake):.2f} s; "
                  f"finish() incl. the last commit: mean {statistics.mean(r['finish_s'] for r in lake):.2f} s, "
                  f"slowest {max(r['finish_s'] for r in lake):.2f} s")
        print(f"rows lost: {points - counts[1]}, rows duplicated: {counts[0] - counts[1]}")
        print(f"reader: {reads} queries, slowest {float(worst_read) * 1000:.0f} ms")
        print(f"one key's curve ({args.steps:,} points): lake {ms_lake:.1f} ms, local {ms_local:.1f} ms "
              f"(ratio {ms_lake / ms_local:.1f})")
    finally:
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    main()
