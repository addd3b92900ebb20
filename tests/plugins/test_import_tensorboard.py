"""tracker import tensorboard, on event files written by the real writers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

import tracker
from tracker.cli import cli


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, ["import", *args], catch_exceptions=False)


def torch_writer(folder: Path, suffix: str = "") -> object:
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(folder), max_queue=100_000, flush_secs=600, filename_suffix=suffix)


def test_every_point_of_every_run_as_tbparse_reads_them(tmp_path: Path) -> None:
    from tbparse import SummaryReader
    from tensorboard.summary import Writer

    logdir = tmp_path / "logs"
    w = torch_writer(logdir / "a")
    for step in range(12_000):  # more than EventAccumulator's default 10,000 per tag
        w.add_scalar("loss/box", 1.0 / (step + 1), step)
        if step % 10 == 0:
            w.add_scalar("loss/cls", step * 0.5, step)
    w.close()
    walls = 1.7e9 + np.arange(300) * 0.25
    tw = Writer(str(logdir / "b" / "c"))  # TensorBoard's own writer: tensor scalars with metadata
    for step in range(300):
        tw.add_scalar("val/map", step / 300, step, wall_time=float(walls[step]))
    tw.close()

    res = invoke("tensorboard", str(logdir))
    assert res.exit_code == 0, res.output
    everything = tracker.query(
        "SELECT r.name, c.key, c.step, c.value, c.wall_time FROM curves c JOIN runs r USING (run_id) "
        "ORDER BY r.name, c.key, c.step")
    ours = everything.filter(everything["name"] == "a")
    assert ours.height == 12_000 + 1_200
    # tbparse's .scalars holds the simple_value scalars (run a); b/c's tensor scalars are checked below
    theirs = SummaryReader(str(logdir), extra_columns={"dir_name", "wall_time"}).scalars
    theirs = theirs.sort_values(["dir_name", "tag", "step"])
    assert list(ours["name"]) == list(theirs["dir_name"])
    assert list(ours["key"]) == list(theirs["tag"]) and list(ours["step"]) == list(theirs["step"])
    assert np.array_equal(ours["value"].to_numpy(), theirs["value"].to_numpy())
    assert np.array_equal(ours["wall_time"].to_numpy(), theirs["wall_time"].to_numpy())
    b = everything.filter(everything["name"] == "b/c")
    assert b["step"].to_list() == list(range(300)) and set(b["key"]) == {"val/map"}
    assert np.array_equal(b["value"].to_numpy(), (np.arange(300) / 300).astype(np.float32))
    assert np.array_equal(b["wall_time"].to_numpy(), walls)  # wall times kept exactly
    assert set(tracker.query("SELECT project FROM runs")["project"]) == {"logs"}


def _restarted(logdir: Path) -> None:
    w = torch_writer(logdir / "job", ".1")
    for step in range(100):
        w.add_scalar("loss", float(step), step)
    w.close()
    w = torch_writer(logdir / "job", ".2")  # the job restarted from its step-50 checkpoint
    for step in range(50, 150):
        w.add_scalar("loss", 1000.0 + step, step)
    w.close()


def test_a_restarted_job_is_a_resume_segment_and_reimports_add_only_new_points(tmp_path: Path) -> None:
    logdir = tmp_path / "logs"
    _restarted(logdir)
    assert invoke("tensorboard", str(logdir)).exit_code == 0
    curve = tracker.query("SELECT step, value, segment FROM curves ORDER BY step")
    assert curve["step"].to_list() == list(range(150))
    assert curve["value"].to_list() == [float(s) for s in range(50)] + [1000.0 + s for s in range(50, 150)]
    assert tracker.query("SELECT count(*) AS n FROM hidden_metrics")["n"][0] == 50  # hidden, not deleted
    segs = tracker.query("SELECT segment, start_step, reason FROM segments ORDER BY segment")
    assert segs.rows() == [(0, 0, "start"), (1, 50, "resume")]

    again = invoke("tensorboard", str(logdir))
    assert "unchanged" in again.output
    assert tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 200

    w = torch_writer(logdir / "job", ".3")  # the job went on
    for step in range(150, 170):
        w.add_scalar("loss", 1000.0 + step, step)
    w.close()
    dry = invoke("tensorboard", str(logdir), "--dry-run")
    assert "add" in dry.output and tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 200
    assert invoke("tensorboard", str(logdir)).exit_code == 0
    assert tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 220
    assert tracker.query("SELECT max(step) AS s FROM curves")["s"][0] == 169
    assert tracker.query("SELECT count(*) AS n FROM segments")["n"][0] == 2


def test_a_damaged_file_names_the_record_and_imports_nothing(tmp_path: Path, home: Path) -> None:
    logdir = tmp_path / "logs"
    _restarted(logdir)
    bad = sorted((logdir / "job").iterdir())[1]
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    res = CliRunner().invoke(cli, ["import", "tensorboard", str(logdir)])
    assert res.exit_code == 1
    assert str(bad) in res.output and "record" in res.output and "truncate" in res.output
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def test_a_torn_last_record_is_left_for_the_next_import(tmp_path: Path) -> None:
    logdir = tmp_path / "logs"
    w = torch_writer(logdir / "live")
    for step in range(10):
        w.add_scalar("loss", float(step), step)
    w.close()
    path = next((logdir / "live").iterdir())
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])  # a writer mid-record
    assert invoke("tensorboard", str(logdir)).exit_code == 0
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 9
    path.write_bytes(whole)
    assert invoke("tensorboard", str(logdir)).exit_code == 0
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 10


@pytest.mark.parametrize("new_style", [False, True])
def test_both_scalar_styles_of_torch(tmp_path: Path, new_style: bool) -> None:
    w = torch_writer(tmp_path / "logs" / "r")
    for step in (0, 1, 127, 128, 20_000, 3_000_000_000):  # step varints of 0 to 5 bytes
        w.add_scalar("x/" + "t" * 100, step * 0.5, step, new_style=new_style)
    w.close()
    assert invoke("tensorboard", str(tmp_path / "logs")).exit_code == 0
    got = tracker.query("SELECT key, step, value FROM curves ORDER BY step")
    assert got["step"].to_list() == [0, 1, 127, 128, 20_000, 3_000_000_000]
    assert got["value"].to_list() == [0.0, 0.5, 63.5, 64.0, 10_000.0, 1.5e9]
    assert set(got["key"]) == {"x/" + "t" * 100}
