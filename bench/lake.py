"""Benchmark: many "hosts" writing one DuckLake (PostgreSQL catalog) at once, and one
host's sustained commit rate.

Starts a throw-away PostgreSQL server (``tests.harness.postgres``) with PostgreSQL's
default settings, ``fsync`` on as a real catalog runs (``--fsync off`` for comparison;
or pass ``--store``/``--data-path``), then:

1. ``--hosts`` writer processes, each with its own local DuckDB store (the baseline);
2. ``--hosts`` writer processes ("hosts": separate TRACKER_HOME spools) sharing only
   the lake's catalog and data path, while a reader queries the lake every second.
   Each writer logs ``--keys`` keys x ``--steps`` steps. Prints: training-thread cost
   per point on both stores and their ratio (target <= 1.5), seconds from the last log
   to all rows visible in the lake (target <= 5), commits, conflicts retried, rows lost
   and duplicated (0 and 0), reader queries, and one key's full-curve read latency on
   the lake against the local store (same data);
3. sustained commits: one host logging ``--sustained-keys`` keys paced at ``--rate``
   points/s (default 100,000) for ``--seconds`` (default 30), then the same host logging
   as fast as it can. Prints, after a 5 s warm-up, the rows/s its committer put into the
   lake, the largest backlog (rows logged and not yet committed, also in seconds of
   logging) and the seconds its store logger waited for commits (backpressure); the
   lake's rows are read back and counted (lost, duplicated).

The full size is ``--hosts 8 --keys 10 --steps 100000``; the default (2 hosts x 10
keys x 50,000 steps, plus 2 x 30 s sustained) runs in about two minutes on a small
shared machine. ``--sustained-only`` runs phase 3 alone.

Run: ``.venv/bin/python bench/lake.py [--hosts 8 --steps 100000] [--fsync off] [--sustained-only]``
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

SUSTAINED = """
import json, os, time, tracker
from tracker.store.lake import STATS
keys = [f"loss/k{i}" for i in range(int(os.environ["KEYS"]))]
rate, seconds = float(os.environ["RATE"]), float(os.environ["SECONDS"])
run = tracker.init("bench", run_id=os.environ["RUN_ID"], config={"analysis": False})
committer = next(s for n, s in run._sessions if n == "store").committer
t0 = time.monotonic(); step = 0; samples = []; due = 1.0
while True:
    elapsed = time.monotonic() - t0
    if elapsed >= seconds:
        break
    target = step + 2000 if rate <= 0 else min(int(elapsed * rate / len(keys)), step + 2000)
    while step < target:
        run.log({k: 1.0 / (step + 1 + i) for i, k in enumerate(keys)}, step=step)
        step += 1
    if elapsed >= due:  # (seconds, points logged, rows committed by this host's committer)
        samples.append((elapsed, step * len(keys), STATS["rows"]))
        due += 1.0
    if rate > 0 and step >= target:
        time.sleep(0.002)
t = time.monotonic()
run.finish()
print(json.dumps({"samples": samples, "points": step * len(keys), "finish_s": time.monotonic() - t,
                  "waited_s": getattr(committer, "waited_s", 0.0), "bound": getattr(committer, "max_backlog", 0),
                  "commits": STATS["commits"]}),
      flush=True)
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


WARMUP_S = 5.0


def _sustained(env: dict[str, str], home: Path, run_id: str, rate: float, seconds: float, keys: int,
               probe) -> str:  # type: ignore[no-untyped-def]
    """One host logging at ``rate`` points/s (0: as fast as it can); a line of figures."""
    proc = subprocess.run([sys.executable, "-c", SUSTAINED], capture_output=True, text=True, timeout=3600,
                          env={**env, "TRACKER_HOME": str(home), "RUN_ID": run_id, "RATE": str(rate),
                               "SECONDS": str(seconds), "KEYS": str(keys)})
    if proc.returncode != 0:
        raise SystemExit(f"sustained writer failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    warm = [s for s in out["samples"] if s[0] >= WARMUP_S]
    if len(warm) < 2:
        return f"{run_id}: too short to measure (--seconds must exceed {WARMUP_S + 2:.0f})"
    span = warm[-1][0] - warm[0][0]
    logged = (warm[-1][1] - warm[0][1]) / span
    committed = (warm[-1][2] - warm[0][2]) / span
    worst = max(s[1] - s[2] for s in warm)
    n, d = probe.query("SELECT count(*) AS n, count(DISTINCT (key, step)) AS d FROM lake.main.metrics "
                       "WHERE run_id = ? AND key LIKE 'loss/%'", [run_id]).row(0)
    paced = f"paced at {rate:,.0f} points/s" if rate > 0 else "as fast as it logs"
    warned = " (backpressure warned)" if "backpressure" in proc.stderr else ""
    return (f"{paced}, {keys} keys, {seconds:.0f} s: logged {logged:,.0f} points/s, committed {committed:,.0f} rows/s "
            f"(ratio {committed / logged:.2f}); backlog at most {worst:,} rows ({worst / logged:.1f} s of logging), "
            f"{warm[-1][1] - warm[-1][2]:,} at the end; logger waited {out['waited_s']:.1f} s for commits "
            f"(bound {out['bound']:,} rows){warned}; {out['commits']} commits; finish() {out['finish_s']:.2f} s; "
            f"read back: {n:,} rows, lost {out['points'] - d}, duplicated {n - d}")


def _one_commit(env: dict[str, str], home: Path, keys: int, probe) -> str:  # type: ignore[no-untyped-def]
    """The committer alone: a spool filled for 5 s with no commits, then one commit of all of it."""
    from tracker.store.lake import LakeStore

    proc = subprocess.run([sys.executable, "-c", SUSTAINED], capture_output=True, text=True, timeout=600,
                          env={**env, "TRACKER_HOME": str(home), "RUN_ID": "backlog", "RATE": "0", "SECONDS": "5",
                               "KEYS": str(keys), "TRACKER_LAKE_COMMITTER": "follow"})
    if proc.returncode != 0:
        raise SystemExit(f"backlog writer failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    store = LakeStore(home)
    con = store.attach(read_only=False)  # as a committer holds it (attaching is not part of a commit)
    try:
        con.execute("SET threads = 1")
        t = time.perf_counter()
        report = store.ingest(con=con)
        spent = time.perf_counter() - t
    finally:
        con.close()
    n = probe.query("SELECT count(*) AS n FROM lake.main.metrics WHERE run_id = 'backlog'")["n"][0]
    return (f"one commit of a 5 s backlog (one DuckDB thread, nothing else running): {report.rows:,} rows "
            f"({report.files} chunks) in {spent:.2f} s = {report.rows / spent:,.0f} rows/s; read back {n:,} metric rows")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--keys", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50000)
    ap.add_argument("--committer", choices=("thread", "follow"), default="thread",
                    help="commit from each run's committer thread, or from one `tracker lake follow` per host")
    ap.add_argument("--rate", type=float, default=100_000, help="points/s of the paced sustained writer")
    ap.add_argument("--seconds", type=float, default=30, help="how long each sustained writer logs")
    ap.add_argument("--sustained-keys", type=int, default=2, help="keys per step of the sustained writers")
    ap.add_argument("--sustained-only", action="store_true", help="run the sustained phase alone")
    ap.add_argument("--fsync", choices=("on", "off"), default="on",
                    help="the throw-away PostgreSQL's fsync (on: its default, what a real catalog runs with)")
    ap.add_argument("--store", default=None, help="an existing lake (default: a throw-away PostgreSQL)")
    ap.add_argument("--data-path", default=None)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tracker-bench-lake-"))
    server = None
    if args.store is None:
        from tests.harness.postgres import PostgresServer

        server = PostgresServer(fsync=args.fsync == "on")
        store, data_path = "ducklake:postgres:" + server.dsn(), str(tmp / "lake-data")
        print(f"catalog: a throw-away PostgreSQL ({server.bin.parent.name}), fsync={args.fsync}")
    else:
        store, data_path = args.store, args.data_path or str(tmp / "lake-data")
        print("catalog: the lake given by --store")
    base = {**os.environ, "PYTHONPATH": str(ROOT), "KEYS": str(args.keys), "STEPS": str(args.steps),
            "TRACKER_LOGGERS": "store"}
    base.pop("TRACKER_STORE", None)
    lake_env = {**base, "TRACKER_STORE": store, "TRACKER_DATA_PATH": data_path}
    os.environ.update(TRACKER_STORE=store, TRACKER_DATA_PATH=data_path)
    try:
        from tracker.store.lake import LakeStore

        LakeStore(tmp / "reader").init()
        probe = LakeStore(tmp / "probe")
        if not args.sustained_only:
            _hosts(args, base, lake_env, tmp, probe)
        print("sustained commits of one host:")
        for rate, name in ((args.rate, "paced"), (0.0, "unthrottled")):
            print("  " + _sustained(lake_env, tmp / f"sustained-{name}", name, rate, args.seconds,
                                    args.sustained_keys, probe), flush=True)
        print("  " + _one_commit(lake_env, tmp / "backlog", args.sustained_keys, probe), flush=True)
    finally:
        if server is not None:
            server.cleanup()


def _hosts(args: argparse.Namespace, base: dict[str, str], lake_env: dict[str, str], tmp: Path,
           probe) -> None:  # type: ignore[no-untyped-def]
    """Phases 1 and 2 of the module doc."""
    points = args.hosts * args.keys * args.steps
    print(f"{args.hosts} hosts x {args.keys} keys x {args.steps} steps = {points:,} points per store")
    local = _writers(args.hosts, base, [tmp / f"local{i}" for i in range(args.hosts)], "local")
    stop = tmp / "stop"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(tmp / "reader"), str(stop)], env=lake_env,
                              stdout=subprocess.PIPE, text=True)
    visible_at: list[float] = []
    ours = "key LIKE 'loss/%' AND run_id LIKE 'host%'"  # the workload's rows (system metrics ride along)

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
    env = dict(lake_env)
    if args.committer == "follow":
        env["TRACKER_LAKE_COMMITTER"] = "follow"
        followers = [subprocess.Popen([sys.executable, "-m", "tracker.cli", "lake", "follow", "--home", str(h)],
                                      env=env, stderr=subprocess.PIPE, text=True) for h in homes]
    lake = _writers(args.hosts, env, homes, "host")
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
    _report_hosts(args, local, lake, probe, tmp, visible_at, conflicts, counts, (reads, worst_read))


def _report_hosts(args: argparse.Namespace, local: list[dict[str, float]], lake: list[dict[str, float]], probe,  # type: ignore[no-untyped-def]
                  tmp: Path, visible_at: list[float], conflicts: int, counts: tuple[int, int],
                  reader: tuple[str, str]) -> None:
    points = args.hosts * args.keys * args.steps
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
    print(f"reader: {reader[0]} queries, slowest {float(reader[1]) * 1000:.0f} ms")
    print(f"one key's curve ({args.steps:,} points): lake {ms_lake:.1f} ms, local {ms_local:.1f} ms "
          f"(ratio {ms_lake / ms_local:.1f})")


if __name__ == "__main__":
    main()
