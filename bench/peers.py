"""Benchmark: the same logging workload through our tracker and its peers, side by side.

The workload: 1,000,000 scalar points (10 keys x 100,000 steps, one dict per step),
logged through W&B (offline mode), MLflow (``log_batch`` per step, sqlite store),
tensorboardX, Aim and ours. Each peer runs in its own venv, created under a cache
folder (``--cache``, default ``$TRACKER_BENCH_CACHE`` or ``~/.cache/tracker-bench-peers``)
with pinned versions; a peer that does not install is reported with pip's reason.
Every run is a child process of this one (``bench/_peer_worker.py``), peers are
interleaved and the order rotates each round; the table shows medians:

* training-thread microseconds per point (time inside the logging calls);
* seconds from the last logging call until the data is durable, and queryable;
* bytes on disk; seconds to read one key's every point back with the peer's reader;
* each peer's ratio to ours (how many times slower / bigger).

Takes many minutes (MLflow and Aim alone take minutes per round): it is not part of
``make test`` or ``make bench``. Run ``make bench-peers`` on a quiet machine, or
``.venv/bin/python -m bench.peers --steps 1000 --peers tracker,mlflow`` for a taste.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "bench" / "_peer_worker.py"

# pinned so a table can be reproduced; tensorboard comes with tensorboardX for its reader
REQUIREMENTS: dict[str, list[str]] = {
    "wandb": ["wandb==0.30.0"],
    "mlflow": ["mlflow-skinny==3.17.2", "sqlalchemy==2.1.9", "alembic==1.20.1"],
    "tensorboardx": ["tensorboardX==2.6.5", "tensorboard==2.21.0"],
    "aim": ["aim==3.29.1"],
}
ORDER = ("tracker", "wandb", "mlflow", "tensorboardx", "aim")
FIELDS = (("us_per_point", "train-thread µs/pt"), ("durable_s", "durable s"), ("queryable_s", "queryable s"),
          ("disk_mb", "disk MB"), ("read_s", "read 1 key s"))


@dataclass
class Outcome:
    """What one peer gave over all rounds: results, or why it could not run."""

    peer: str
    results: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def median(self, name: str) -> float | None:
        vals = [r[name] for r in self.results if r.get(name) is not None]
        return statistics.median(vals) if vals else None


def default_cache() -> Path:
    return Path(os.environ.get("TRACKER_BENCH_CACHE") or Path.home() / ".cache" / "tracker-bench-peers")


def ensure_venv(peer: str, cache: Path, python: str) -> tuple[str | None, str | None]:
    """(the peer venv's python, None) or (None, why it could not be installed)."""
    if peer == "tracker":
        return sys.executable, None
    venv = cache / peer
    stamp = venv / ".installed"
    wanted = " ".join(REQUIREMENTS[peer])
    if stamp.exists() and stamp.read_text() == wanted:
        return str(venv / "bin" / "python"), None
    subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *REQUIREMENTS[peer]],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        tail = [ln for ln in (pip.stderr or pip.stdout).splitlines() if ln.strip()][-3:]
        return None, f"pip install {wanted} failed on Python {_version(python)}: " + " | ".join(tail)
    stamp.write_text(wanted)
    return str(venv / "bin" / "python"), None


def _version(python: str) -> str:
    out = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True)
    return out.stdout.strip() or python


def run_peer(python: str, peer: str, keys: int, steps: int, timeout: float) -> dict[str, Any]:
    """One run of the workload in a child process; its RESULT line as a dict (or an error)."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{peer}-") as work:
        env = {**os.environ, "PYTHONPATH": str(ROOT) if peer == "tracker" else ""}
        try:
            # -P keeps bench/ off sys.path (bench/logging.py would shadow the standard library's)
            cmd = [python, "-P", str(WORKER), peer, work, "--keys", str(keys), "--steps", str(steps)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=work)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip().strip("^~")][-2:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    result = json.loads(lines[-1].removeprefix("RESULT "))
    result["us_per_point"] = result["log_s"] / result["points_logged"] * 1e6
    result["disk_mb"] = result["disk_bytes"] / 1e6
    return result


def measure(peers: list[str], keys: int, steps: int, rounds: int, cache: Path, python: str,
            timeout: float) -> list[Outcome]:
    """Install what is missing, then run every peer once per round, interleaved, order rotating."""
    outcomes = {p: Outcome(p) for p in peers}
    pythons: dict[str, str] = {}
    for peer in peers:
        exe, why = ensure_venv(peer, cache, python)
        if exe is None:
            outcomes[peer].error = why
        else:
            pythons[peer] = exe
    ready = [p for p in peers if p in pythons]
    for r in range(rounds):
        for peer in ready[r % len(ready):] + ready[:r % len(ready)] if ready else []:
            result = run_peer(pythons[peer], peer, keys, steps, timeout)
            if "error" in result:
                outcomes[peer].error = result["error"]
            else:
                outcomes[peer].results.append(result)
            print(f"  round {r + 1}/{rounds} {peer}: "
                  f"{result.get('error') or '%.1f s logging' % result['log_s']}", file=sys.stderr, flush=True)
    return [outcomes[p] for p in peers]


def table(outcomes: list[Outcome], keys: int, steps: int, rounds: int) -> str:
    """The printed table: medians and each peer's ratio to ours."""
    ours = next((o for o in outcomes if o.peer == "tracker" and o.results), None)
    head = ["peer", *(label for _, label in FIELDS), "x ours (µs/pt)", "x ours (read)"]
    rows = [head]
    for o in outcomes:
        if not o.results:
            rows.append([o.peer, f"not measured: {o.error}"])
            continue
        cells = [o.peer] + [f"{o.median(name):.3g}" for name, _ in FIELDS]
        for name in ("us_per_point", "read_s"):
            mine, base = o.median(name), ours.median(name) if ours else None
            cells.append(f"{mine / base:.1f}" if mine is not None and base else "-")
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows if len(r) > i and len(r) == len(head)) for i in range(len(head))]
    out = [f"{keys * steps:,} points ({keys} keys x {steps:,} steps), median of {rounds} round(s), "
           f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs"]
    for r in rows:
        out.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                   if len(r) == len(head) else f"{r[0].ljust(widths[0])}  {r[1]}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", default=",".join(ORDER), help=f"comma-separated, of {', '.join(ORDER)}")
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=None, help="where the peers' venvs live")
    parser.add_argument("--python", default="python3.11", help="interpreter the peers' venvs are made from")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one peer's run may take")
    args = parser.parse_args(argv)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(peers) - set(ORDER))
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(ORDER)}")
    outcomes = measure(peers, args.keys, args.steps, args.rounds, args.cache or default_cache(),
                       args.python, args.timeout)
    print(table(outcomes, args.keys, args.steps, args.rounds))


if __name__ == "__main__":
    main()
