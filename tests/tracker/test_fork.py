"""Forks: the visible rows of a fork (property tests over the store's own view SQL),
and real forks through ``tracker.init`` and ``tracker runs fork``."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import tracker
from tracker import schema
from tracker.errors import ConfigError, RunError
from tracker.fork import parse_fork_from
from tracker.store.local import Store

# one run: a list of segments, each (start step, steps it logged at or after its start)
segment_st = hs.tuples(hs.integers(0, 30), hs.lists(hs.integers(0, 12), max_size=8, unique=True))
run_st = hs.lists(segment_st, min_size=1, max_size=3)


_CON: list[duckdb.DuckDBPyConnection] = []


def _database(runs: dict[str, list[tuple[int, list[int]]]], lineage: dict[str, tuple[str, int]]) -> duckdb.DuckDBPyConnection:
    """An in-memory database with the store's tables and local views (made once) holding ``runs``.
    A row's value encodes (run, segment, step), so a visible row names where it came from."""
    if not _CON:
        _CON.append(duckdb.connect())
        schema.migrate(_CON[0])
    con = _CON[0]
    con.execute("DELETE FROM runs; DELETE FROM segments; DELETE FROM metrics")
    run_rows, seg_rows, metric_rows = [], [], []
    for run_id, segs in runs.items():
        parent, fork_step = lineage.get(run_id, (None, None))
        parent_sql = f"'{parent}'" if parent else "NULL"
        run_rows.append(f"('{run_id}', {parent_sql}, {fork_step if fork_step is not None else 'NULL'})")
        for seg, (start, offsets) in enumerate(segs):
            seg_rows.append(f"('{run_id}', 0, {seg}, {start})")
            metric_rows.extend(f"('{run_id}', 0, {seg}, {start + off}, 'loss', "
                               f"{float(len(run_id) * 10_000 + seg * 1000 + start + off)}, 0.0)" for off in offsets)
    con.execute(f"INSERT INTO runs (run_id, parent_run_id, fork_step) VALUES {', '.join(run_rows)}")
    con.execute(f"INSERT INTO segments (run_id, rank, segment, start_step) VALUES {', '.join(seg_rows)}")
    if metric_rows:
        con.execute(f"INSERT INTO metrics VALUES {', '.join(metric_rows)}")
    return con


def _own_visible(segs: list[tuple[int, list[int]]]) -> set[tuple[int, int]]:
    """(segment, step) of a run's own rows its resume rule shows: a later segment starting
    at or before a row's step hides it."""
    out = set()
    for seg, (start, offsets) in enumerate(segs):
        later = [s for s, _ in segs[seg + 1:]]
        out |= {(seg, start + o) for o in offsets if not any(ls <= start + o for ls in later)}
    return out


def _visible(con: duckdb.DuckDBPyConnection, run_id: str) -> set[tuple[int, int, float]]:
    return {tuple(r) for r in con.execute(  # type: ignore[misc]
        "SELECT segment, step, value FROM curves WHERE run_id = ?", [run_id]).fetchall()}


@settings(max_examples=30, deadline=None)
@given(parent=run_st, child=run_st, grandchild=run_st, data=hs.data())
def test_a_fork_shows_the_parents_visible_rows_up_to_its_step_and_then_its_own(
    parent: list[tuple[int, list[int]]], child: list[tuple[int, list[int]]],
    grandchild: list[tuple[int, list[int]]], data: hs.DataObject,
) -> None:
    fork1 = data.draw(hs.integers(0, 45), label="fork step of c")
    fork2 = data.draw(hs.integers(0, 45), label="fork step of gc")
    # a fork's first segment starts after its fork step (as tracker.init makes it); later ones may resume earlier
    child = [(fork1 + 1 + child[0][0] % 3, child[0][1]), *child[1:]]
    grandchild = [(fork2 + 1, grandchild[0][1]), *grandchild[1:]]
    runs = {"p": parent, "cc": child, "ggg": grandchild}
    con = _database(runs, {"cc": ("p", fork1), "ggg": ("cc", fork2)})

    parent_rows = _visible(con, "p")
    assert {(s, st) for s, st, _ in parent_rows} == _own_visible(parent)
    hidden = {(seg, start + o) for seg, (start, offs) in enumerate(parent) for o in offs} - _own_visible(parent)

    child_rows = _visible(con, "cc")
    own_child = {r for r in child_rows if r[2] >= 20_000}
    inherited = child_rows - own_child
    upto1 = min(fork1, min(s for s, _ in child) - 1)
    assert all(step <= fork1 for _, step, _ in inherited)  # never a parent's row after the fork step
    assert not {(s, st) for s, st, _ in inherited} & hidden  # never a row the parent's resume rule hides
    assert inherited == {r for r in parent_rows if r[1] <= upto1}
    assert {(s, st) for s, st, _ in own_child} == _own_visible(child)

    grand_rows = _visible(con, "ggg")
    upto2 = min(fork2, min(s for s, _ in grandchild) - 1)
    assert {r for r in grand_rows if r[2] < 30_000} == {r for r in child_rows if r[1] <= upto2}
    assert all(step <= min(fork1, fork2) for _, step, v in grand_rows if v < 20_000)
    steps = con.execute("SELECT step FROM curves WHERE run_id = 'ggg'").fetchall()
    assert len(steps) == len(grand_rows)  # one row per source row: nothing doubled by the recursion


def test_parse_fork_from() -> None:
    assert parse_fork_from("a@b@12") == parse_fork_from(" a@b@12 ")
    assert parse_fork_from("a@b@12").run_id == "a@b" and parse_fork_from("a@b@12").step == 12
    assert parse_fork_from("run").step is None
    for bad in ("", "run@", "run@-1", "run@x", "@5", 5):
        with pytest.raises(ConfigError, match="fork_from"):
            parse_fork_from(bad)  # type: ignore[arg-type]


def test_init_forks_a_running_run_and_a_fork_of_a_fork(tmp_path: Path) -> None:
    home = tmp_path / "home"
    parent = tracker.init("p", run_id="parent", home=home, system=False, config={"lr": 0.1, "seed": 1})
    parent.set_classes(["a", "b"])
    for step in range(10):
        parent.log({"loss": float(step)}, step=step)
        parent.log_classes("ap", [step, -step], step=step)
    parent.flush()  # the parent keeps running: its rows are in the spool only
    with pytest.raises(RunError, match="last visible step is 9"):
        tracker.init("p", home=home, system=False, fork_from="parent@50")
    with pytest.raises(RunError, match="no such run"):
        tracker.init("p", home=home, system=False, fork_from="nobody@1")
    child = tracker.init("p", run_id="child", home=home, system=False, config={"lr": 0.2}, fork_from="parent@4")
    assert child.start_step == 5 and child.config == {"lr": 0.2, "seed": 1}
    child.log({"loss": 50.0})
    child.finish()
    for step in range(10, 12):
        parent.log({"loss": float(step)}, step=step)
    parent.finish()
    grand = tracker.init("p", run_id="grand", home=home, system=False, fork_from="child")
    assert grand.start_step == 6
    grand.log({"loss": 60.0})
    grand.finish()
    with pytest.raises(ConfigError, match="not a fork of"):
        tracker.init("p", run_id="grand", home=home, system=False, resume="allow", fork_from="parent@4")

    store = Store(home)
    rows = store.query("SELECT run_id, step, value FROM curves ORDER BY run_id, step")
    by_run = {r: rows.filter(rows["run_id"] == r)["value"].to_list() for r in ("parent", "child", "grand")}
    assert by_run["child"] == [0.0, 1.0, 2.0, 3.0, 4.0, 50.0]
    assert by_run["grand"] == [0.0, 1.0, 2.0, 3.0, 4.0, 50.0, 60.0]
    assert len(by_run["parent"]) == 12
    classes = store.query("SELECT step, class_name, value FROM class_curves WHERE run_id = 'grand' ORDER BY step, class_name")
    assert classes.rows() == [(s, n, float(v)) for s in range(5) for n, v in (("a", s), ("b", -s))]
    assert store.query("SELECT count(*) AS n FROM metrics WHERE run_id != 'parent'")["n"][0] == 2  # nothing copied
    store.ingest()
    lineage = store.query("SELECT run_id, parent_run_id, fork_step FROM run_summary ORDER BY run_id").rows()
    assert lineage == [("child", "parent", 4), ("grand", "child", 5), ("parent", None, None)]
    again = store.query("SELECT count(*) AS n FROM curves WHERE run_id = 'grand'")["n"][0]
    assert again == 7  # the same after ingestion as from the spool


def test_cli_runs_fork(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run = tracker.init("p", run_id="base", name="base", home=home, system=False)
    for step in range(6):
        run.log({"loss": 1.0 + step}, step=step)
    run.finish()
    from click.testing import CliRunner

    from tracker.cli import build_cli

    out = CliRunner().invoke(build_cli(), ["runs", "fork", "base@3", "--run-id", "f1", "--format", "json",
                                           "--home", str(home)], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    made = json.loads(out.stdout)
    assert made["run_id"] == "f1" and made["parent_run_id"] == "base" and made["fork_step"] == 3
    assert made["start_step"] == 4 and made["name"] == "base@3"
    rows = Store(home).query("SELECT step FROM curves WHERE run_id = 'f1' ORDER BY step")["step"].to_list()
    assert rows == [0, 1, 2, 3]
    bad = CliRunner().invoke(build_cli(), ["runs", "fork", "base@x", "--home", str(home)])
    assert bad.exit_code != 0 and "fork_from='base@x'" in bad.output
    resumed = tracker.init("p", run_id="f1", home=home, system=False, resume="must")
    assert resumed.start_step == 4
    resumed.finish()
