"""The store on a real DuckLake (PostgreSQL catalog, local data path), hosts as processes."""

from __future__ import annotations

import json
import shutil
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import tracker
from tracker import spool
from tracker.store import Store
from tracker.store.lake import LakeStore

LOG = textwrap.dedent(
    """
    import os, sys, time, tracker
    run = tracker.init("p", run_id=sys.argv[1] if len(sys.argv) > 1 else "r", resume="allow",
                       config={"tracker_flush_interval": 0.2, "lr": 0.01})
    first = run.start_step
    for step in range(first, first + int(os.environ.get("STEPS", "50"))):
        run.log({"loss/box": 1.0 / (step + 1), "loss/cls": 2.0}, step=step)
    if os.environ.get("CRASH"):  # killed once its rows are in the lake (its spool is empty)
        from tracker import spool
        run.flush(); deadline = time.time() + 60
        while spool.data_files(run.home) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(float(os.environ["CRASH"])); os._exit(1)
    run.finish()
    print(run.segment, first)
    """
)


def _lake_count(sql: str) -> int:
    """A count read from the lake alone (a fresh store with an empty spool)."""
    return int(LakeStore(Path("/nonexistent-spool")).query(sql).row(0)[0])


def test_rows_reach_the_lake_within_5_s_and_the_training_thread_never_waits(lake, home: Path, log_timed) -> None:  # type: ignore[no-untyped-def]
    run = tracker.init("p", run_id="live", config={"tracker_flush_interval": 0.2})
    worst = log_timed(run, 200)
    logged = time.monotonic()
    while _lake_count("SELECT count(*) FROM lake.main.metrics") < 200:
        assert time.monotonic() - logged < 5.0, "rows not in the lake 5 s after being logged"
        time.sleep(0.1)
    assert worst < 0.05
    assert not spool.data_files(home)  # committed chunks leave the spool
    run.finish()
    assert tracker.query("SELECT status FROM runs")["status"].to_list() == ["finished"]


def test_commit_is_idempotent_after_a_crash_between_commit_and_cleanup(lake, home: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = tracker.init("p", run_id="idem", loggers=["store"])
    for step in range(30):
        run.log({"a": float(step)}, step=step)
    run.flush()
    chunks = spool.data_files(home)
    kept = tmp_path / "kept"
    kept.mkdir()
    for p in chunks:
        shutil.copy(p, kept / p.name)
    store = Store()
    assert isinstance(store, LakeStore)
    assert store.ingest().rows == 30
    for p in chunks:  # as if the process died after COMMIT, before removing the files
        shutil.copy(kept / p.name, p)
    assert tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 30  # readers skip them too
    report = store.ingest()
    assert report.rows == 0 and not spool.data_files(home)
    run.finish()
    assert _lake_count("SELECT count(*) FROM lake.main.metrics") == 30
    assert _lake_count("SELECT count(DISTINCT name) - count(*) FROM lake.main.ingested_files") == 0


def test_a_run_preempted_on_host_a_resumes_on_host_b(lake, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, b = tmp_path / "hostA", tmp_path / "hostB"
    proc = lake.python(LOG, a, STEPS="50", CRASH="1.5")  # killed after its rows were committed
    assert proc.returncode == 1, proc.stderr
    proc = lake.python(LOG.replace('resume="allow"', 'resume="must"'), b, STEPS="30")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "50"]  # segment 1, from step 50: found in the lake, not in b's spool
    segs = tracker.query("SELECT segment, start_step, end_step, reason FROM segments ORDER BY segment")
    assert segs.rows() == [(0, 0, 49, "start"), (1, 50, 79, "resume")]
    curve = tracker.query("SELECT step FROM curves WHERE key = 'loss/box' ORDER BY step")["step"].to_list()
    assert curve == list(range(80))
    shown = lake.cli("runs", "show", "r", "--format", "json", home=tmp_path / "hostC")  # a third host
    assert shown.returncode == 0, shown.stderr
    out = json.loads(shown.stdout)
    assert (out["run"]["status"], out["run"]["last_step"], out["run"]["segments"]) == ("finished", 79, 2)
    assert [s["reason"] for s in out["segments"]] == ["start", "resume"]
    assert lake.server.password not in shown.stdout + shown.stderr


def test_ddp_ranks_on_two_hosts_write_one_run(lake, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    procs = [
        subprocess.Popen([sys.executable, "-c", LOG, "ddp"], env=lake.env(tmp_path / f"host{r}", RANK=str(r),
                         WORLD_SIZE="2", STEPS="40"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    rows = tracker.query("SELECT rank, count(*) AS n FROM curves WHERE run_id = 'ddp' GROUP BY rank ORDER BY rank")
    assert rows.rows() == [(0, 80), (1, 80)]
    assert tracker.query("SELECT status FROM runs WHERE run_id = 'ddp'")["status"].to_list() == ["finished"]
    assert tracker.query("SELECT count(*) AS n FROM segments WHERE run_id = 'ddp'")["n"][0] == 2


def test_time_travel_reads_an_older_snapshot(lake, home: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = lake.python(LOG, tmp_path / "h1", STEPS="20")
    assert proc.returncode == 0, proc.stderr
    store = Store()
    snap = int(store.snapshots()["snapshot_id"].max())
    proc = lake.python(LOG, tmp_path / "h1", STEPS="20")  # resumes: 20 more steps
    assert proc.returncode == 0, proc.stderr
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 80
    assert tracker.query("SELECT count(*) AS n FROM curves", snapshot=snap)["n"][0] == 40
    out = lake.cli("sql", "--snapshot", str(snap), "SELECT count(*) AS n FROM metrics", home=tmp_path / "h2")
    assert out.returncode == 0, out.stderr
    assert "40" in out.stdout


def test_local_store_refuses_a_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACKER_STORE", raising=False)
    with pytest.raises(tracker.errors.ConfigError, match="snapshot=3 needs the lake"):
        tracker.query("SELECT 1", snapshot=3)


def test_lake_commands_and_push_are_idempotent(lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    local = tmp_path / "local-store"
    env = {k: v for k, v in lake.env(local).items() if k not in ("TRACKER_STORE", "TRACKER_DATA_PATH")}
    import subprocess
    import sys

    # two trainings at once into one local store (each process waits its turn on the file lock)
    olds = [subprocess.Popen([sys.executable, "-c", LOG, rid], env={**env, "STEPS": "25"}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for rid in ("old1", "old2")]
    for proc in olds:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert (local / "tracker.duckdb").exists()
    h = tmp_path / "h"
    for _ in range(2):
        out = lake.cli("lake", "init", home=h)
        assert out.returncode == 0, out.stderr
        assert lake.server.password not in out.stdout and "password=***" in out.stdout
    first = lake.cli("lake", "push", "--from", str(local), home=h)
    assert first.returncode == 0, first.stderr
    assert "pushed 2 runs" in first.stdout
    again = lake.cli("lake", "push", "--from", str(local), home=h)
    assert "pushed 0 runs" in again.stdout and "2 already there" in again.stdout
    assert tracker.query("SELECT run_id, count(*) AS n FROM curves GROUP BY ALL ORDER BY 1").rows() == [
        ("old1", 50), ("old2", 50)]
    # five commands that do not depend on one another, two processes at a time (two hosts reading one lake):
    # check-plugins, the longest, beside the other four in turn
    with ThreadPoolExecutor(2) as pool:
        checked, status, listed, exported, analyzed = pool.map(lambda args: lake.cli(*args, home=h), [
            ("check-plugins",), ("lake", "status"), ("runs", "list"),
            ("export", "old2", "-o", str(tmp_path / "old2.csv")), ("analyze", "old2", "--save")])
    assert status.returncode == 0, status.stderr
    assert "snapshots:" in status.stdout and str(lake.data_path) in status.stdout
    assert lake.server.password not in status.stdout
    assert "old1" in listed.stdout and "old2" in listed.stdout
    assert exported.returncode == 0, exported.stderr
    assert len((tmp_path / "old2.csv").read_text().splitlines()) == 51
    assert analyzed.returncode == 0, analyzed.stderr
    assert checked.returncode == 0, checked.stderr
    removed = lake.cli("runs", "rm", "old1", "--yes", home=h)
    assert removed.returncode == 0, removed.stderr
    assert tracker.query("SELECT DISTINCT run_id FROM metrics")["run_id"].to_list() == ["old2"]


def test_password_never_reaches_the_run_config_or_the_logs(lake, home: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    import logging

    caplog.set_level(logging.DEBUG)
    run = tracker.init("p", run_id="secret", store=lake.store, data_path=str(lake.data_path), config={"a": 1})
    run.log({"x": 1.0}, step=0)
    run.finish()
    texts = [caplog.text, (home / "runs" / "secret" / "run.json").read_text(),
             json.dumps(tracker.query("SELECT * FROM runs").to_dicts(), default=str), repr(Store())]
    assert all(lake.server.password not in t for t in texts)


def test_a_follower_process_per_host_commits_for_its_training_processes(lake, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import signal
    import subprocess
    import sys

    host = tmp_path / "host"
    env = lake.env(host, TRACKER_LAKE_COMMITTER="follow")
    follower = subprocess.Popen([sys.executable, "-m", "tracker.cli", "lake", "follow", "--interval", "0.5"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        code = LOG + "\nfrom tracker.store.lakerun import _COMMITTERS\nassert not _COMMITTERS\n"
        proc = subprocess.run([sys.executable, "-c", code, "followed"], env={**env, "STEPS": "60"},
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        deadline = time.monotonic() + 30
        while _lake_count("SELECT count(*) FROM lake.main.metrics") < 120:
            assert time.monotonic() < deadline, "the follower did not commit the run's rows"
            time.sleep(0.2)
    finally:
        follower.send_signal(signal.SIGTERM)
        _, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    assert lake.server.password not in err and "password=***" in err
    assert not spool.data_files(host)
    assert tracker.query("SELECT status FROM runs WHERE run_id = 'followed'")["status"].to_list() == ["finished"]
