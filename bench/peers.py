"""Benchmark: the same logging workload through our tracker and its peers, side by side.

The workload: 1,000,000 scalar points (10 keys x 100,000 steps, one dict per step),
logged through each tool at its documented fastest setting, and ours at its defaults
(``SETTINGS`` names each). Each peer runs in its own venv, created under a cache
folder (``--cache``, default ``$TRACKER_BENCH_CACHE`` or ``~/.cache/tracker-bench-peers``)
with pinned versions; a peer that does not install is reported with pip's reason.
Every run is a child process of this one (``bench/_peer_worker.py``) with no
``TRACKER_*``, ``WANDB_*`` or ``MLFLOW_*`` variable of ours; peers are interleaved and
the order rotates each round. The table shows medians of the timed rounds:

* training-thread microseconds per point (time inside the logging calls), and the CPU
  seconds of the whole process tree (helper threads and processes included) until
  the data is queryable;
* seconds from the last logging call until the close/finish call returned, and until
  the peer's reader sees the run (ours: ``finish()`` with its ingest into DuckDB);
* the share of points that survive a SIGKILL of the writer (the process and every
  process it started, W&B's service included) ``--kill-after`` seconds (1 and 5) after
  its last logging call, read back by a fresh process (``--kill-rounds``, default 1);
* bytes on disk; seconds to read one key's every point back with the peer's reader;
* each peer's ratio to ours.

Every read-back is checked point for point against what was logged (count, steps
and values; float32 where the peer stores float32): a peer that fails it prints
FAILED with the first difference, and its figures are not shown.

Takes a long while (MLflow's synchronous mode takes about 10 minutes per run): it is
not part of ``make test`` or ``make bench``. The table in docs/benchmarks.md comes from
``make bench-peers`` (this module at its defaults) on a quiet machine; for a quick
taste, ``.venv/bin/python -m bench.peers --steps 1000 --peers tracker,mlflow``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from bench._peer_worker import proc_stats

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "bench" / "_peer_worker.py"

# pinned so a table can be reproduced; tensorboard comes with tensorboardX for its reader
REQUIREMENTS: dict[str, list[str]] = {
    "wandb": ["wandb==0.30.0"],
    "mlflow": ["mlflow-skinny==3.17.2", "sqlalchemy==2.1.9", "alembic==1.20.1"],
    "tensorboardx": ["tensorboardX==2.6.5", "tensorboard==2.21.0"],
    "aim": ["aim==3.29.1"],
}
VENV = {"mlflow-sync": "mlflow", "mlflow-unbuffered": "mlflow"}  # peers that share another's venv
ORDER = ("tracker", "wandb", "mlflow", "mlflow-sync", "tensorboardx", "aim")
EXTRA = ("mlflow-unbuffered",)  # on request only: a slower setting, to show why the default row has its setting
SETTINGS = {
    "tracker": "ours at defaults: store logger, online analysis and system sampler on, finish() ingests",
    "wandb": "W&B 0.30.0 offline (WANDB_MODE=offline; its wandb-core service process writes)",
    "mlflow": "MLflow 3.17.2 log_batch(synchronous=False) per step, MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS=1 "
              "(its async queue merges batches), sqlite store",
    "mlflow-sync": "MLflow 3.17.2 log_batch per step, synchronous (its default), sqlite store",
    "mlflow-unbuffered": "MLflow 3.17.2 log_batch(synchronous=False) per step, no buffering (each step its own "
                         "commit), sqlite store",
    "tensorboardx": "tensorboardX 2.6.5 SummaryWriter defaults (writer thread, flush every 120 s)",
    "aim": "Aim 3.29.1 Run defaults (system tracking every 10 s); indexed before reading",
}
FIELDS = (("us_per_point", "train-thread µs/pt"), ("cpu_s", "CPU s"), ("close_s", "close s"),
          ("queryable_s", "queryable s"), ("disk_mb", "disk MB"), ("read_s", "read 1 key s"))


@dataclass
class Outcome:
    """What one peer gave over all rounds: results, kill results, or why it could not run or failed."""

    peer: str
    results: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    kills: list[dict[str, Any]] = field(default_factory=list)
    failed: str | None = None
    notes: list[str] = field(default_factory=list)  # errors of single rounds

    def median(self, name: str) -> float | None:
        vals = [r[name] for r in self.results if r.get(name) is not None]
        return statistics.median(vals) if vals else None

    def kept(self, kill_after: float) -> float | None:
        """The median share of points that survived a kill ``kill_after`` s after the last log call."""
        vals = [k["points"] / k["points_logged"] for k in self.kills if k["kill_after_s"] == kill_after]
        return statistics.median(vals) if vals else None


def default_cache() -> Path:
    return Path(os.environ.get("TRACKER_BENCH_CACHE") or Path.home() / ".cache" / "tracker-bench-peers")


def ensure_venv(peer: str, cache: Path, python: str) -> tuple[str | None, str | None]:
    """(the peer venv's python, None) or (None, why it could not be installed)."""
    if peer == "tracker":
        return sys.executable, None
    name = VENV.get(peer, peer)
    venv = cache / name
    stamp = venv / ".installed"
    wanted = " ".join(REQUIREMENTS[name])
    if stamp.exists() and stamp.read_text() == wanted:
        return str(venv / "bin" / "python"), None
    subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *REQUIREMENTS[name]],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        tail = [ln for ln in (pip.stderr or pip.stdout).splitlines() if ln.strip()][-3:]
        return None, f"pip install {wanted} failed on Python {_version(python)}: " + " | ".join(tail)
    stamp.write_text(wanted)
    return str(venv / "bin" / "python"), None


def _version(python: str) -> str:
    out = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True)
    return out.stdout.strip() or python


def child_env(peer: str) -> dict[str, str]:
    """The environment of a worker: ours stripped of every setting a tracker reads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACKER_", "WANDB_", "MLFLOW_"))}
    env["PYTHONPATH"] = str(ROOT) if peer == "tracker" else ""
    return env


def worker_cmd(python: str, peer: str, work: str, keys: int, steps: int, mode: str) -> list[str]:
    # -P keeps bench/ off sys.path (bench/logging.py would shadow the standard library's)
    return [python, "-P", str(WORKER), peer, work, "--keys", str(keys), "--steps", str(steps), "--mode", mode]


def parse_result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """A worker's RESULT line as a dict, or ``{"error": ...}``."""
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip().strip("^~")][-2:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1].removeprefix("RESULT "))


def run_peer(python: str, peer: str, keys: int, steps: int, timeout: float) -> dict[str, Any]:
    """One timed run of the workload in a child process; its RESULT as a dict (or an error)."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{peer}-") as work:
        try:
            proc = subprocess.run(worker_cmd(python, peer, work, keys, steps, "timed"), capture_output=True,
                                  text=True, timeout=timeout, env=child_env(peer), cwd=work)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
    result = parse_result(proc)
    if "error" not in result:
        result["us_per_point"] = result["log_s"] / result["points_logged"] * 1e6
        result["disk_mb"] = result["disk_bytes"] / 1e6
    return result


def process_tree(root: int) -> list[int]:
    """``root`` and every live process descended from it (through /proc's parent ids)."""
    parents = {pid: int(fields[1]) for pid, fields in proc_stats().items()}
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(p for p, ppid in parents.items() if ppid == pid)
    return tree


def kill_tree(root: int) -> None:
    """SIGSTOP ``root`` and its descendants (so none forks or writes on), then SIGKILL them all."""
    stopped: list[int] = []
    for _ in range(2):
        for pid in process_tree(root):
            if pid not in stopped:
                try:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
                except ProcessLookupError:
                    pass
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_peer(python: str, peer: str, keys: int, steps: int, kill_after: float, timeout: float) -> dict[str, Any]:
    """Log the workload, SIGKILL the writer's process tree ``kill_after`` s after its last
    logging call, then count (and check) what a fresh reader finds."""
    with tempfile.TemporaryDirectory(prefix=f"bench-kill-{peer}-") as work:
        env = child_env(peer)
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(worker_cmd(python, peer, work, keys, steps, "kill"), stdout=subprocess.PIPE,
                                    stderr=err, text=True, env=env, cwd=work)
            timer = threading.Timer(timeout, kill_tree, [proc.pid])
            timer.start()
            assert proc.stdout is not None
            logged = any(line.strip() == "LOGGED" for line in iter(proc.stdout.readline, ""))
            if logged:
                time.sleep(kill_after)
            timer.cancel()
            kill_tree(proc.pid)
            proc.wait()
            proc.stdout.close()
            if not logged:
                err.seek(0)
                tail = [ln.strip() for ln in err.read().splitlines() if ln.strip()][-2:]
                return {"error": f"the writer stopped before its last log call: {' | '.join(tail)}"}
        try:
            read = subprocess.run(worker_cmd(python, peer, work, keys, steps, "read"), capture_output=True,
                                  text=True, timeout=timeout, env=env, cwd=work)
        except subprocess.TimeoutExpired:
            return {"error": f"reading the killed run timed out after {timeout:.0f} s"}
    result = parse_result(read)
    if "error" in result:
        result["error"] = "reading the killed run: " + result["error"]
    result["kill_after_s"] = kill_after
    return result


def measure(peers: list[str], keys: int, steps: int, rounds: int, cache: Path, python: str,
            timeout: float, kill_rounds: int = 1, kill_after: Sequence[float] = (1.0,)) -> list[Outcome]:
    """Install what is missing, then run every peer once per round, interleaved, order rotating;
    then the kill rounds the same way."""
    outcomes = {p: Outcome(p) for p in peers}
    pythons: dict[str, str] = {}
    for peer in peers:
        exe, why = ensure_venv(peer, cache, python)
        if exe is None:
            outcomes[peer].error = why
        else:
            pythons[peer] = exe
    ready = [p for p in peers if p in pythons]
    plan = [("timed", r, rounds, 0.0) for r in range(rounds)]
    plan += [("kill", r, kill_rounds, t) for r in range(kill_rounds) for t in kill_after]
    for mode, r, total, after in plan:
        for peer in ready[r % len(ready):] + ready[:r % len(ready)] if ready else []:
            out = outcomes[peer]
            if mode == "timed":
                result = run_peer(pythons[peer], peer, keys, steps, timeout)
                note = result.get("error") or "%.1f s logging" % result["log_s"]
            else:
                result = kill_peer(pythons[peer], peer, keys, steps, after, timeout)
                note = result.get("error") or f"{result['points']:,} points kept, killed {after:g} s after"
            if "error" in result:
                out.error = result["error"]
                out.notes.append(f"{mode} round {r + 1}{f' (+{after:g} s)' if mode == 'kill' else ''}: "
                                 f"{result['error']}")
            elif not result["check_ok"]:
                out.failed = out.failed or f"{mode} round {r + 1}: {result['check']}"
                note = f"FAILED read-back: {result['check']}"
            else:
                (out.results if mode == "timed" else out.kills).append(result)
            print(f"  {mode} round {r + 1}/{total} {peer}: {note}", file=sys.stderr, flush=True)
    return [outcomes[p] for p in peers]


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def _kept(share: float | None) -> str:
    """A share of points as a percentage that reads 100% only when nothing was lost (rounded down)."""
    if share is None:
        return "-"
    return "100%" if share >= 1 else f"{math.floor(share * 10_000) / 100:.2f}%"


def table(outcomes: list[Outcome], keys: int, steps: int, rounds: int,
          kill_after: Sequence[float] = (1.0,)) -> str:
    """The printed table: medians, each peer's ratio to ours, and each peer's setting."""
    ours = next((o for o in outcomes if o.peer == "tracker" and o.results and not o.failed), None)
    head = ["peer", *(label for _, label in FIELDS), *(f"kill -9 +{t:g}s kept" for t in kill_after),
            "x ours (µs/pt)", "x ours (read)"]
    rows = [head]
    for o in outcomes:
        if o.failed:
            rows.append([o.peer, f"FAILED read-back check ({o.failed})"])
            continue
        if not o.results:
            rows.append([o.peer, f"not measured: {o.error}"])
            continue
        cells = [o.peer] + [_fmt(o.median(name), "{:.3g}") for name, _ in FIELDS]
        cells += [_kept(o.kept(t)) for t in kill_after]
        for name in ("us_per_point", "read_s"):
            mine, base = o.median(name), ours.median(name) if ours else None
            cells.append(f"{mine / base:.1f}" if mine is not None and base else "-")
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows if len(r) == len(head)) for i in range(len(head))]
    out = [f"{keys * steps:,} points ({keys} keys x {steps:,} steps), median of {rounds} round(s), "
           f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs"]
    for r in rows:
        out.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                   if len(r) == len(head) else f"{r[0].ljust(widths[0])}  {r[1]}")
    if kill_after:
        out.append("kill -9 +Ts kept: the share of points a fresh reader found after SIGKILL of the writer's "
                   "process tree T s after its last logging call")
    out.append("every read-back checked point for point against what was logged (count, steps, values)")
    out += [f"  {o.peer}: {SETTINGS[o.peer]}" for o in outcomes if o.peer in SETTINGS]
    out += [f"  {o.peer} not measured in {note}" for o in outcomes if o.results and not o.failed
            for note in o.notes]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", default=",".join(ORDER),
                        help=f"comma-separated, of {', '.join(ORDER + EXTRA)}")
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds")
    parser.add_argument("--kill-rounds", type=int, default=1, help="rounds of the kill -9 test (0: none)")
    parser.add_argument("--kill-after", default="1,5", help="seconds after the last log call, comma-separated")
    parser.add_argument("--cache", type=Path, default=None, help="where the peers' venvs live")
    parser.add_argument("--python", default="python3.11", help="interpreter the peers' venvs are made from")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one peer's run may take")
    args = parser.parse_args(argv)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(peers) - set(ORDER + EXTRA))
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(ORDER + EXTRA)}")
    try:
        kill_after = [float(t) for t in args.kill_after.split(",") if t.strip()] if args.kill_rounds else []
    except ValueError:
        parser.error(f"--kill-after takes seconds separated by commas, got {args.kill_after!r}")
    outcomes = measure(peers, args.keys, args.steps, args.rounds, args.cache or default_cache(),
                       args.python, args.timeout, args.kill_rounds, kill_after)
    print(table(outcomes, args.keys, args.steps, args.rounds, kill_after))


if __name__ == "__main__":
    main()
