"""Four rank processes log at once while another process runs queries; no rank waits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import tracker

RANK = textwrap.dedent(
    """
    import time, tracker
    run = tracker.init("ddp", run_id="shared", config={"tracker_flush_interval": 0.1})
    t0 = time.perf_counter(); worst = 0.0
    for step in range(3000):
        t = time.perf_counter()
        run.log({"loss": run.rank * 1000.0 + step}, step=step)
        worst = max(worst, time.perf_counter() - t)
        if step % 300 == 0:
            time.sleep(0.02)
    run.finish()
    print(f"{worst:.6f}", flush=True)
    """
)
READER = textwrap.dedent(
    """
    import os, sys, time, tracker
    n = 0; seen = 0
    while not os.path.exists(sys.argv[1]) or n < 3:
        seen = max(seen, tracker.query("SELECT count(*) AS n FROM curves")["n"][0])
        n += 1
    print(n, seen, flush=True)
    """
)


def test_four_ranks_and_a_reader(home: Path, tmp_path: Path) -> None:
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "reader.py").write_text(READER)
    base = {**os.environ, "TRACKER_HOME": str(home), "WORLD_SIZE": "4"}
    done = tmp_path / "ranks-done"
    reader = subprocess.Popen([sys.executable, str(tmp_path / "reader.py"), str(done)], env=base, stdout=subprocess.PIPE, text=True)
    ranks = [
        subprocess.Popen([sys.executable, str(tmp_path / "rank.py")], env={**base, "RANK": str(r)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(4)
    ]
    worst = []
    for p in ranks:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        worst.append(float(out.strip()))
    done.touch()
    rout, _ = reader.communicate(timeout=180)
    assert reader.returncode == 0
    n_queries, seen = map(int, rout.split())
    assert n_queries >= 3 and 0 <= seen <= 12000
    assert max(worst) < 0.25, f"a log() call blocked for {max(worst):.3f}s"
    df = tracker.query("SELECT rank, count(*) AS n, min(value) AS lo, max(step) AS last FROM curves GROUP BY rank ORDER BY rank")
    assert df["rank"].to_list() == [0, 1, 2, 3]
    assert df["n"].to_list() == [3000] * 4
    assert df["lo"].to_list() == [0.0, 1000.0, 2000.0, 3000.0]
    assert tracker.query("SELECT count(*) AS n FROM segments")["n"][0] == 4
    assert tracker.query("SELECT world_size FROM runs")["world_size"][0] == 4
