"""Values that cannot be stored are refused at log(), naming the key; a valid row is
never lost because of a bad one."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import tracker
from tracker.errors import RunError


def _stored(sql: str) -> list[tuple]:
    return tracker.query(sql).rows()


@pytest.mark.parametrize("bad", [10**400, -(10**400), Fraction(10**400, 3)])
def test_a_value_too_large_for_float64_is_refused_naming_the_key(bad: object) -> None:
    run = tracker.init("p", config={"analysis": False})
    run.log({"loss": 1.0}, step=0)
    with pytest.raises(ValueError, match="'huge'.*too large"):
        run.log({"loss": 2.0, "huge": bad}, step=1)
    run.log({"loss": 3.0}, step=2)
    run.finish()
    assert _stored("SELECT step, value FROM curves WHERE key = 'loss' ORDER BY step") == [(0, 1.0), (2, 3.0)]
    assert run.status == "finished"


def test_large_but_storable_ints_are_kept_as_floats() -> None:
    run = tracker.init("p", config={"analysis": False})
    run.log({"big": 2**70, "small": 3}, step=0)
    run.finish()
    assert dict(_stored("SELECT key, value FROM curves")) == {"big": float(2**70), "small": 3.0}


@pytest.mark.parametrize("step", [2**63, 2**64 + 5])
def test_a_step_too_large_for_int64_is_refused(step: int) -> None:
    run = tracker.init("p", config={"analysis": False})
    run.log({"loss": 1.0}, step=0)
    with pytest.raises(ValueError, match=r"step .* too large"):
        run.log({"loss": 2.0}, step=step)
    with pytest.raises(ValueError, match=r"step .* too large"):
        run.log_classes("loss/cls", [1.0, 2.0], step=step)
    with pytest.raises(ValueError, match=r"step .* too large"):
        run.event("note", "x", step=step)
    run.log({"loss": 3.0}, step=2**62)  # a large storable step is fine
    run.finish()
    assert _stored("SELECT step FROM curves ORDER BY step") == [(0,), (2**62,)]


def test_the_auto_step_after_the_largest_step_is_refused() -> None:
    run = tracker.init("p", config={"analysis": False})
    run.log({"loss": 1.0}, step=2**63 - 1)
    with pytest.raises(ValueError, match="too large"):
        run.log({"loss": 2.0})
    run.finish()
    assert _stored("SELECT step FROM metrics") == [(2**63 - 1,)]


def test_log_classes_refuses_overflow_and_empty_vectors_keeping_valid_rows() -> None:
    run = tracker.init("p", config={"analysis": False})
    run.log_classes("loss/cls", [1.0, 2.0], step=0)
    with pytest.raises(ValueError, match="'loss/cls'.*too large"):
        run.log_classes("loss/cls", [1.0, 10**400], step=1)
    with pytest.raises(ValueError, match="'loss/other'.*empty"):
        run.log_classes("loss/other", np.zeros(0), step=1)
    with pytest.raises(ValueError, match="'loss/other'.*empty"):
        run.log_classes("loss/other", [], step=1)
    run.log_classes("loss/other", [5.0, 6.0, 7.0], step=2)  # the empty call fixed no length
    run.log_classes("loss/cls", [3.0, 4.0], step=2)
    run.finish()
    rows = _stored("SELECT key, step, count(*) FROM class_curves GROUP BY ALL ORDER BY ALL")
    assert rows == [("loss/cls", 0, 2), ("loss/cls", 2, 2), ("loss/other", 2, 3)]


def test_event_after_finish_raises_like_log() -> None:
    run = tracker.init("p", config={"analysis": False})
    run.event("note", "before", step=0)
    run.finish()
    with pytest.raises(RunError, match="finished"):
        run.event("note", "after")
    with pytest.raises(RunError, match="finished"):
        run.log({"loss": 1.0})
    assert _stored("SELECT message FROM events") == [("before",)]


def test_a_row_at_the_largest_step_is_visible_in_the_views() -> None:
    run = tracker.init("p", run_id="edge", config={"analysis": False})
    run.log({"loss": 1.0}, step=2**63 - 1)
    run.log_classes("loss/cls", [1.0, 2.0], step=2**63 - 1)
    run.finish()
    assert _stored("SELECT step FROM curves") == [(2**63 - 1,)]
    assert _stored("SELECT count(*) FROM class_curves WHERE step = 9223372036854775807") == [(2,)]
    assert _stored("SELECT hidden_from FROM segment_bounds") == [(None,)]  # nothing hides it
    assert _stored("SELECT count(*) FROM hidden_metrics") == [(0,)]


def test_a_store_with_the_old_views_is_migrated(home) -> None:  # type: ignore[no-untyped-def]
    import duckdb

    from tracker import schema
    from tracker.store import Store, release

    run = tracker.init("p", run_id="edge", config={"analysis": False})
    run.log({"loss": 1.0}, step=2**63 - 1)
    run.finish()
    Store().ingest()
    release()
    with duckdb.connect(str(home / "tracker.duckdb")) as con:  # the views as the previous release made them
        con.execute("CREATE OR REPLACE VIEW segment_bounds AS SELECT run_id, rank, segment, start_step, "
                    "coalesce(min(start_step) OVER (PARTITION BY run_id, rank ORDER BY segment ROWS BETWEEN "
                    "1 FOLLOWING AND UNBOUNDED FOLLOWING), 9223372036854775807) AS hidden_from FROM segments")
        con.execute("CREATE OR REPLACE VIEW curves AS SELECT m.* FROM metrics m LEFT JOIN segment_bounds b "
                    "ON m.run_id = b.run_id AND m.rank = b.rank AND m.segment = b.segment "
                    "WHERE m.step < coalesce(b.hidden_from, 9223372036854775807)")
        con.execute("DELETE FROM schema_migrations WHERE name = 'm003_views_without_a_step_sentinel'")
        assert con.execute("SELECT count(*) FROM curves").fetchone() == (0,)  # the old bug
    from tracker.store import local

    local._MIGRATED.clear()
    assert _stored("SELECT step FROM curves") == [(2**63 - 1,)]
    release()
    with duckdb.connect(str(home / "tracker.duckdb"), read_only=True) as con:  # for any SQL client too
        assert con.execute("SELECT count(*) FROM curves").fetchone() == (1,)
        assert "m003_views_without_a_step_sentinel" in {r[0] for r in con.execute(
            "SELECT name FROM schema_migrations").fetchall()}
    assert "m003_views_without_a_step_sentinel" in [name for name, _ in schema.MIGRATIONS]
