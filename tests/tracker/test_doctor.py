"""One bad spool file affects only its own run; ``tracker doctor`` lists and sets bad files aside."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracker
from tracker import spool
from tracker.cli import build_cli
from tracker.errors import DataError
from tracker.store import Store

BAD_RUN_JSON = {
    "wrong types": json.dumps({"run_id": 5, "tags": 3}),
    "tags not strings": None,  # filled from the real run.json below
    "not an object": "[1, 2, 3]",
    "not json": '{"run_id": "bad", ',
    "config a number": None,
    "created_at a string": None,
}
BAD_SEGMENT = {
    "not an object": "[]",
    "rank a string": None,
    "last_step a string": None,
    "step too large": None,
    "missing start_step": None,
}


def _seed(home: Path) -> None:
    for rid in ("good", "bad"):
        run = tracker.init("p", run_id=rid, tags=["t"])
        for s in range(5):
            run.log({"loss": float(s)}, step=s)
        run.finish()


def _break_run_json(home: Path, case: str) -> Path:
    path = spool.run_dir(home, "bad") / "run.json"
    meta = json.loads(path.read_text())
    text = BAD_RUN_JSON[case] or json.dumps(
        {**meta, **{"tags not strings": {"tags": [1, 2]}, "config a number": {"config": 3},
                    "created_at a string": {"created_at": "yesterday"}}[case]}
    )
    path.write_text(text)
    return path


def _break_segment(home: Path, case: str) -> Path:
    path = spool.run_dir(home, "bad") / "seg-r0-s0000.json"
    seg = json.loads(path.read_text())
    changes = {"rank a string": {"rank": "0"}, "last_step a string": {"last_step": "4"},
               "step too large": {"start_step": 2**64}, "missing start_step": {"start_step": None}}
    path.write_text(BAD_SEGMENT[case] or json.dumps({**seg, **changes[case]}))
    return path


def _assert_good_run_reads(caplog: pytest.LogCaptureFixture, bad: Path) -> None:
    for _ in range(3):  # every reader works, and the bad file is named once, not once per query
        got = tracker.query("SELECT run_id, count(*) AS n FROM curves WHERE run_id = 'good' GROUP BY run_id")
        assert got.rows() == [("good", 5)]
    res = CliRunner().invoke(build_cli(), ["runs", "list", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert "good" in {r["run_id"] for r in json.loads(res.stdout)}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and str(bad) in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "doctor --fix" in warnings[0].getMessage()
    assert bad.exists()  # readers never move or delete it


@pytest.mark.parametrize("case", sorted(BAD_RUN_JSON))
def test_a_bad_run_json_affects_only_its_run(case: str, home: Path, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TRACKER_INGEST_ON_FINISH", "0")  # the rows of both runs are still in the spool
    _seed(home)
    bad = _break_run_json(home, case)
    _assert_good_run_reads(caplog, bad)
    assert tracker.query("SELECT count(*) AS n FROM curves WHERE run_id = 'bad'")["n"][0] == 0
    Store().ingest()  # (`runs list` ingested the good run already)
    left = spool.data_files(home)
    assert left and {f.parent.name for f in left} == {"bad"}  # the bad run's chunks wait, untouched
    assert tracker.query("SELECT count(*) AS n FROM metrics WHERE run_id = 'good'")["n"][0] == 5
    other = tracker.init("p", run_id="good", resume="must")  # resuming another run works
    other.log({"loss": 9.0}, step=5)
    other.finish()
    with pytest.raises(DataError, match=r"run\.json"):
        tracker.init("p", run_id="bad", resume="must")
    before = bad.read_bytes()
    Store().set_status("bad", "killed")  # the database row changes; the bad file is left for doctor
    assert bad.read_bytes() == before


@pytest.mark.parametrize("case", sorted(BAD_SEGMENT))
def test_a_bad_segment_file_affects_only_its_run(case: str, home: Path, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TRACKER_INGEST_ON_FINISH", "0")
    _seed(home)
    bad = _break_segment(home, case)
    _assert_good_run_reads(caplog, bad)
    Store().ingest()
    with pytest.raises(DataError, match="seg-r0-s0000.json"):
        tracker.init("p", run_id="bad", resume="must")


def test_a_corrupt_chunk_is_left_out_of_readers(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TRACKER_INGEST_ON_FINISH", "0")
    _seed(home)
    bad = spool.run_dir(home, "bad") / "r0-s0000-000099.metrics.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    for _ in range(3):
        got = tracker.query("SELECT run_id, count(*) AS n FROM curves GROUP BY run_id ORDER BY run_id")
        assert got.rows() == [("bad", 5), ("good", 5)]
    with Store().reader(safe=True) as con:  # the sandboxed reader copies the spool: the same rows
        assert con.execute("SELECT count(*) FROM curves").fetchone() == (10,)
    assert len([r for r in caplog.records if str(bad) in r.getMessage()]) == 1
    assert bad.read_bytes() == b"PAR1 this is not parquet"


def test_doctor_lists_problems_and_fix_sets_them_aside(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_INGEST_ON_FINISH", "0")
    _seed(home)
    runner = CliRunner()
    res = runner.invoke(build_cli(), ["doctor"])
    assert res.exit_code == 0 and "no problems" in res.output
    Store().ingest()  # the segment's record is in the database now
    seg = _break_segment(home, "rank a string")
    chunk = spool.run_dir(home, "good") / "r0-s0000-000099.metrics.parquet"
    chunk.write_bytes(b"not parquet")
    res = runner.invoke(build_cli(), ["doctor"])
    assert res.exit_code == 1
    assert str(seg) in res.output and str(chunk) in res.output and "--fix" in res.stderr
    assert seg.exists() and chunk.exists()  # listing changes nothing

    res = runner.invoke(build_cli(), ["doctor", "--fix"])
    assert res.exit_code == 0, res.output
    assert (home / "corrupt" / "good" / chunk.name).read_bytes() == b"not parquet"
    assert '"rank": "0"' in (home / "corrupt" / "bad" / seg.name).read_text()
    restored = spool.parse_segment(json.loads(seg.read_text()), seg)  # the store's own record
    assert (restored.rank, restored.segment, restored.start_step, restored.last_step) == (0, 0, 0, 4)
    res = runner.invoke(build_cli(), ["doctor"])
    assert res.exit_code == 0 and "no problems" in res.output
    resumed = tracker.init("p", run_id="bad", resume="must")
    assert (resumed.segment, resumed.start_step) == (1, 5)
    resumed.finish()


def test_fix_keeps_the_number_of_a_segment_the_store_never_saw(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_INGEST_ON_FINISH", "0")
    _seed(home)
    resumed = tracker.init("p", run_id="bad", resume="must")
    resumed.log({"loss": 1.0}, step=5)
    resumed.finish()
    seg = spool.run_dir(home, "bad") / "seg-r0-s0001.json"
    seg.write_text("[]")
    assert CliRunner().invoke(build_cli(), ["doctor", "--fix"]).exit_code == 0
    again = tracker.init("p", run_id="bad", resume="must")
    assert again.segment == 2  # segment 1's chunks are never overwritten
    again.finish()
    rows = tracker.query("SELECT segment, step FROM metrics WHERE run_id = 'bad' ORDER BY segment, step").rows()
    assert (1, 5) in rows  # the placeholder claims no rows: segment 1's row stays
