"""Benchmark: how long the ``tracker`` command takes to start, as a user runs it.

Times, as whole processes (wall clock from outside, the installed ``tracker`` script
with its output to a pipe), interleaved over ``--rounds`` rounds (5 by default):

* ``tracker --help``, with the command listing already kept (every call after the
  first); target at most 150 ms;
* ``tracker runs list`` on a fresh store of 10 finished runs (100 steps, 3 keys each);
  target at most 300 ms;
* ``python -c pass`` with the same interpreter: the floor any Python command pays.

It prints the median, min and max of each, and, once, the first ``tracker --help`` of a
fresh cache folder (it loads every command and the plugin host and keeps the listing:
what the first call after installing or changing a plugin pays). Read-back is checked:
the help lists every command, the run list has the 10 runs. The store and the cache
folder are temporary (``TRACKER_HOME`` and ``XDG_CACHE_HOME`` point into them).

Run: ``.venv/bin/python -m bench.cli [--rounds 5]``
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RUNS, STEPS, KEYS = 10, 100, ("loss/box", "loss/cls", "loss/dfl")
TARGETS = {"tracker --help": 0.150, "tracker runs list": 0.300}
HEAVY = ("polars", "pyarrow", "duckdb", "numpy", "tracker.analysis", "tracker.host")


def tracker_command() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m tracker.cli``."""
    script = Path(sys.executable).parent / "tracker"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tracker.cli"]


def seed(home: Path) -> list[str]:
    """Log ``RUNS`` finished runs into ``home`` in a child process; their run ids."""
    code = (
        "import tracker\n"
        f"for i in range({RUNS}):\n"
        "    run = tracker.init(project='bench', name=f'run-{i}', config={'lr': 0.01, 'i': i})\n"
        f"    for s in range({STEPS}):\n"
        f"        run.log({{k: 1.0 / (s + 1) for k in {KEYS!r}}}, step=s)\n"
        "    run.finish()\n"
        "    print(run.run_id)\n"
    )
    env = {**_env(home), "TRACKER_SYSTEM": "0"}  # no sys/* rows: the runs hold only their loss keys
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def _env(home: Path, cache: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "TRACKER_HOME": str(home)}
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    return env


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall-clock seconds of one whole process, its CPU seconds (user + system) and its
    stdout (it must succeed)."""
    cpu0 = _child_cpu()
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return dt, _child_cpu() - cpu0, out.stdout


def help_names(text: str) -> set[str]:
    """The command names of a ``--help`` output's Commands section."""
    lines = text.split("Commands:\n", 1)[-1].splitlines()
    return {line.split()[0] for line in lines if line.startswith("  ") and not line.startswith("   ")}


def loaded_by_help(env: dict[str, str]) -> list[str]:
    """Which of ``HEAVY`` a ``tracker --help`` with a kept listing imports (``tracker.cli.main``
    in a child; the first call keeps the listing for that interpreter's sys.path)."""
    code = (
        "import sys\nfrom tracker.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print('loaded:' + '|'.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
    )
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return [m for m in out.stderr.strip().splitlines()[-1].removeprefix("loaded:").split("|") if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tracker-bench-cli-"))
    try:
        home, cache = root / "home", root / "cache"
        run_ids = seed(home)
        env = _env(home, cache)
        tracker = tracker_command()
        cmds = {"tracker --help": [*tracker, "--help"], "tracker runs list": [*tracker, "runs", "list"],
                "python -c pass": [sys.executable, "-c", "pass"]}
        first_help, _, text = timed(cmds["tracker --help"], env)  # builds and keeps the listing
        timed(cmds["tracker runs list"], env)  # warm-up: ingests whatever the runs left in the spool
        times: dict[str, list[float]] = {label: [] for label in cmds}
        cpu: dict[str, list[float]] = {label: [] for label in cmds}
        outputs: dict[str, str] = {}
        for _ in range(args.rounds):
            for label, cmd in cmds.items():
                dt, used, outputs[label] = timed(cmd, env)
                times[label].append(dt)
                cpu[label].append(used)
        names = help_names(outputs["tracker --help"])
        assert names == help_names(text) and {"runs", "sql", "coco", "gpu"} <= names, sorted(names)
        listed = [line.split("\t")[0] for line in outputs["tracker runs list"].splitlines()[1:]]
        assert sorted(listed) == sorted(run_ids), (listed, run_ids)
        heavy = loaded_by_help(env)
        print(f"CLI start, whole process (wall clock from outside, {' '.join(tracker)}), "
              f"median of {args.rounds} interleaved rounds, output to a pipe")
        for label, ts in times.items():
            med = statistics.median(ts)
            target = TARGETS.get(label)
            verdict = f"  target <= {target * 1e3:.0f} ms: {'met' if med <= target else 'MISSED'}" if target else ""
            print(f"  {label:<18} {med * 1e3:7.1f} ms  (min {min(ts) * 1e3:6.1f}, max {max(ts) * 1e3:6.1f}; "
                  f"CPU {statistics.median(cpu[label]) * 1e3:5.1f} ms){verdict}")
        print(f"  first tracker --help of a fresh cache folder (builds the kept listing): {first_help * 1e3:.1f} ms")
        loads = ", ".join(heavy) if heavy else "none of " + ", ".join(HEAVY)
        print(f"  {len(names)} commands listed; runs list shows {len(listed)} runs; --help imports {loads}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
