"""The lake has no lineage columns: a fork there is refused with an error naming the fix,
a local store's forks are left out of a push, and the lake answers the aggregates."""

from __future__ import annotations

from pathlib import Path

import pytest

import tracker
from tracker import spool
from tracker.errors import ConfigError


def test_fork_in_the_lake_is_refused_and_the_lake_keeps_working(lake, home: Path) -> None:  # type: ignore[no-untyped-def]
    run = tracker.init("p", run_id="base", system=False)
    for step in range(5):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    run.finish()
    with pytest.raises(ConfigError, match="not supported by the lake store.*unset TRACKER_STORE"):
        tracker.init("p", run_id="child", system=False, fork_from="base@2")
    assert not (spool.run_dir(home, "child") / "run.json").exists()  # nothing written
    rows = tracker.query("SELECT run_id, count(*) AS n FROM curves GROUP BY run_id").rows()
    assert rows == [("base", 5)]
    assert tracker.query("SELECT run_id, status FROM run_summary").rows() == [("base", "finished")]
    from tracker import runsets
    from tracker.store import Store

    agg = runsets.aggregates(Store(), ["base"], ["loss"]).row(0, named=True)  # the lake answers without the view
    assert agg["n_points"] == 5 and agg["last"] == 0.2 and agg["max_step"] == 0


def test_push_from_a_local_store_leaves_forks_out(lake, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    local = tmp_path / "local-store"
    env = {k: v for k, v in lake.env(local).items() if k not in ("TRACKER_STORE", "TRACKER_DATA_PATH")}
    code = ("import tracker\n"
            "r = tracker.init('p', run_id='base', system=False)\n"
            "[r.log({'loss': 1.0}, step=s) for s in range(4)]\nr.finish()\n"
            "f = tracker.init('p', run_id='kid', system=False, fork_from='base@1')\nf.log({'loss': 2.0})\nf.finish()\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = lake.cli("lake", "push", "--from", str(local), home=tmp_path / "h")
    assert out.returncode == 0, out.stderr
    assert "pushed 1 runs" in out.stdout and "1 fork(s) left out" in out.stdout
    assert tracker.query("SELECT run_id, count(*) AS n FROM curves GROUP BY ALL").rows() == [("base", 4)]
