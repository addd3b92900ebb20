"""Benchmark: the loss analysis, online (the run's analysis thread) and offline (``tracker analyze``).

Prints:

* the labelled corpus table: precision, recall, labels, false positives and
  negatives per detector, and the divergence detection delay (target: precision and
  recall >= 0.95 each, divergence flagged within 200 steps of its onset);
* detector cost per logged point on the analysis thread (``OnlineAnalyzer.observe``
  on Arrow batches as the flusher builds them), for several batch sizes;
* the training-thread cost of ``run.log`` with the online analysis on and off
  (target: no measurable change; the analysis never runs on that thread);
* ``tracker analyze`` on a 1,000,000-point run (4 loss keys x 250,000 steps):
  in-process ``tracker.analyze`` and the ``tracker analyze RUN`` command end to end
  (target <= 2 s).

Run: ``.venv/bin/python bench/analysis.py`` (``--quick`` for a smaller corpus).
"""

from __future__ import annotations

import sys

# bench/ holds a logging.py: keep the folder off the path so the standard library's wins.
_HERE = __file__.rsplit("/", 1)[0] if "/" in __file__ else "."
sys.path[:] = [p for p in sys.path if p not in ("", _HERE) and not p.endswith("/bench")]

import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tracker  # noqa: E402
from tracker.analysis.builtin import builtin_detectors  # noqa: E402
from tracker.analysis.corpus import evaluate, format_table, scores_json  # noqa: E402
from tracker.analysis.online import OnlineAnalyzer  # noqa: E402
from tracker.analysis.system_corpus import evaluate_system  # noqa: E402

KEYS = ["loss/box", "loss/cls", "loss/dfl", "loss"]
STEPS = 250_000
TARGET_ANALYZE_S = 2.0


def curves(steps: int, seed: int = 0) -> np.ndarray:
    """Per-batch YOLO-like losses: one column per key."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)[:, None]
    base = np.array([2.0, 3.0, 1.5, 6.5]) * (1 + t / 5000.0) ** -0.4
    return base * rng.lognormal(0.0, 0.15, (steps, len(KEYS)))


def batch_table(values: np.ndarray, start: int) -> pa.Table:
    """One flushed batch as the run's flusher builds it (sorted by step, every key per step)."""
    n, k = values.shape
    steps = np.repeat(np.arange(start, start + n, dtype=np.int64), k + 1)
    keys = pa.DictionaryArray.from_arrays(
        pa.array(np.tile(np.arange(k + 1, dtype=np.int32), n)), pa.array([*KEYS, "lr"])
    ).cast(pa.string())
    vals = np.column_stack([values, np.full(n, 0.01)]).ravel()
    return pa.table({"step": steps, "key": keys, "value": vals, "wall_time": np.zeros(vals.size)})


def flusher_cost(values: np.ndarray) -> list[tuple[int, float]]:
    """(steps per batch, microseconds per analysed point) for the online analyzer."""
    out = []
    for per_batch in (100, 1_000, 10_000):
        tables = [batch_table(values[i : i + per_batch], i) for i in range(0, values.shape[0], per_batch)]
        analyzer = OnlineAnalyzer(builtin_detectors())
        t0 = time.perf_counter()
        for table in tables:
            analyzer.observe(table)
        dt = time.perf_counter() - t0
        out.append((per_batch, dt / values.size * 1e6))
    return out


def log_cost(steps: int, analysis: bool) -> float:
    """Microseconds per run.log call (5 keys) on the training thread."""
    values = curves(steps, seed=3).tolist()
    config = {} if analysis else {"analysis": False}
    run = tracker.init("bench", config=config, loggers=["store"], system=False)
    log = run.log
    t0 = time.perf_counter()
    for i, v in enumerate(values):
        log({"loss/box": v[0], "loss/cls": v[1], "loss/dfl": v[2], "loss": v[3], "lr": 0.01}, step=i)
    dt = time.perf_counter() - t0
    run.finish()
    return dt / steps * 1e6


def big_run(values: np.ndarray) -> str:
    """Log the 1M-point run; returns its id."""
    run = tracker.init("bench", run_id="analyze-1m", loggers=["store"], config={"analysis": False}, system=False)
    rows = values.tolist()
    log = run.log
    for i, v in enumerate(rows):
        log({"loss/box": v[0], "loss/cls": v[1], "loss/dfl": v[2], "loss": v[3]}, step=i)
    run.finish()
    return run.run_id


def time_analyze(run_id: str) -> tuple[float, float, float, float]:
    """(first in-process, median in-process, CLI end to end, CLI start-up alone) seconds."""
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        result = tracker.analyze(run_id)
        times.append(time.perf_counter() - t0)
    stored = tracker.query("SELECT count(*) AS n FROM curves WHERE run_id = ?", [run_id])["n"][0]
    assert sum(r.points for r in result.keys) == stored
    if stored != STEPS * len(KEYS):
        print(f"  note: the store holds {stored:,} of the {STEPS * len(KEYS):,} points logged")
    from tracker.store import release

    release()
    cli = [str(Path(sys.executable).with_name("tracker")), "analyze", run_id, "--format", "json"]
    t0 = time.perf_counter()
    done = subprocess.run(cli, capture_output=True, text=True, env=os.environ.copy(), check=True)
    cli_s = time.perf_counter() - t0
    json.loads(done.stdout)
    t0 = time.perf_counter()
    subprocess.run([cli[0], "--help"], capture_output=True, env=os.environ.copy(), check=True)
    return times[0], statistics.median(times), cli_s, time.perf_counter() - t0


def main() -> None:
    """Run every measurement and print the figures."""
    quick = "--quick" in sys.argv
    home = Path(tempfile.mkdtemp(prefix="tracker-bench-analysis-"))
    os.environ["TRACKER_HOME"] = str(home)
    os.environ["TRACKER_LOGGERS"] = "store"
    t0 = time.perf_counter()
    scores = evaluate(per_kind=10 if quick else 30, seed=0)
    corpus_s = time.perf_counter() - t0
    curves_n = scores["divergence"].cases
    print(f"labelled corpus ({curves_n} curves of 6,000 points, {scores['stagnant_classes'].cases} per-class and "
          f"{scores['rank_disagreement'].cases} rank cases; {corpus_s:.1f} s; targets: precision and recall >= 0.95, "
          "divergence delay <= 200 steps)")
    print(format_table(scores))
    t0 = time.perf_counter()
    sys_scores, healthy = evaluate_system(per_kind=8 if quick else 20, seed=0)
    print(f"\nsystem detectors ({sys_scores['memory_growth'].cases} runs of 2,000 samples; "
          f"{time.perf_counter() - t0:.1f} s; delays in steps, 10 steps per sample; events on healthy runs: "
          f"{len(healthy)}, above info: {sum(e.severity != 'info' for e in healthy)})")
    print(format_table(sys_scores))
    values = curves(STEPS)
    print("\nonline detectors on the analysis thread (4 loss keys + lr, all built-in detectors):")
    for per_batch, us in flusher_cost(values):
        flush_ms = us * per_batch * len(KEYS) / 1000
        print(f"  {per_batch:>6} steps per flush: {us:6.3f} us per analysed point, {flush_ms:7.2f} ms per flush")
    pairs = [(log_cost(100_000, True), log_cost(100_000, False)) for _ in range(5)]
    on = statistics.median(p[0] for p in pairs)
    off = statistics.median(p[1] for p in pairs)
    print(f"\ntraining thread, run.log (5 keys), median of 5 alternating runs of 100,000 steps: {on:.2f} us with "
          f"online analysis, {off:.2f} us without (ratio {on / off:.2f}; the analysis runs on its own thread)")
    run_id = big_run(values)
    first, median, cli_s, start_s = time_analyze(run_id)
    print(f"\ntracker analyze on a {STEPS * len(KEYS):,}-point run ({len(KEYS)} keys x {STEPS:,} steps):")
    print(f"  tracker.analyze : {median:.2f} s median of 3 (first {first:.2f} s)   "
          f"(target <= {TARGET_ANALYZE_S}; ratio {median / TARGET_ANALYZE_S:.2f})")
    print(f"  CLI end to end  : {cli_s:.2f} s, of which {start_s:.2f} s is the CLI's start-up (tracker --help)   "
          f"(ratio {(cli_s - start_s) / TARGET_ANALYZE_S:.2f} without start-up)")
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "analysis_corpus.json").write_text(scores_json({**scores, **sys_scores}))


if __name__ == "__main__":
    main()
