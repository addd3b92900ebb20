"""The store's schema: numbered migrations and the views over visible rows.

Tables (documented in docs/store.md, "Tables and views"):

* ``runs``          one row per run: project, name, status, config (JSON), tags, provenance
* ``segments``      one row per (run, rank, segment): start step, last step, reason
* ``metrics``       scalar rows: run_id, rank, segment, step, key, value, wall_time
* ``class_metrics`` per-class rows: ... key, class_index, value ...
* ``classes``       class names per run
* ``events``        detector findings and ``run.event()`` rows
* ``ingested_files`` spool files whose rows are in the tables (idempotent ingestion)
* ``schema_migrations`` the migrations applied

Views: ``curves`` and ``class_curves`` (visible rows only: a row of segment s is hidden
when a later segment of the same run and rank starts at or before its step),
``hidden_metrics`` (the superseded rows), ``segment_bounds`` (``hidden_from``: the
step from which a later segment hides this one's rows; NULL when none does) and
``run_summary``.

Forks (``tracker.init(fork_from="RUN@STEP")``, docs/compare-and-fork.md) add two columns
to ``runs`` (``parent_run_id``, ``fork_step``; migration m004) and, in the local store,
make ``curves`` and ``class_curves`` show a fork's inherited rows: ``own_curves`` /
``own_class_curves`` are a run's own visible rows, ``run_lineage`` (run_id, ancestor_id,
upto, depth) names each ancestor whose visible rows a fork shows up to step ``upto``
(the fork step, or before the fork's own first segment when that starts earlier), and
``run_aggregates`` gives per run and key: points, min, max, last value and step, and
the step of the min and of the max. The lake keeps the views of m003
(:data:`VIEWS_SQL`; the local store uses :data:`LOCAL_VIEWS_SQL`).
The view SQL names tables unqualified, so the same text serves the database file
(for any SQL client) and a query connection's temp views that add the spool's rows.
"""

from __future__ import annotations

from typing import Callable

import duckdb

Migration = Callable[[duckdb.DuckDBPyConnection], None]
MIGRATIONS: list[tuple[str, Migration]] = []


def migration(fn: Migration) -> Migration:
    MIGRATIONS.append((fn.__name__, fn))
    return fn


TABLES_SQL = {
    "runs": """
        run_id VARCHAR PRIMARY KEY, project VARCHAR, name VARCHAR, status VARCHAR,
        created_at TIMESTAMP, updated_at TIMESTAMP, config JSON, tags VARCHAR[],
        host VARCHAR, git_commit VARCHAR, python VARCHAR, packages JSON, seed BIGINT,
        world_size INTEGER""",
    "segments": """
        run_id VARCHAR, rank INTEGER, segment INTEGER, start_step BIGINT, end_step BIGINT,
        started_at TIMESTAMP, ended_at TIMESTAMP, reason VARCHAR,
        PRIMARY KEY (run_id, rank, segment)""",
    "metrics": """
        run_id VARCHAR, rank INTEGER, segment INTEGER, step BIGINT, key VARCHAR,
        value DOUBLE, wall_time DOUBLE""",
    "class_metrics": """
        run_id VARCHAR, rank INTEGER, segment INTEGER, step BIGINT, key VARCHAR,
        class_index INTEGER, value DOUBLE, wall_time DOUBLE""",
    "classes": "run_id VARCHAR, class_index INTEGER, name VARCHAR, PRIMARY KEY (run_id, class_index)",
    "events": """
        run_id VARCHAR, rank INTEGER, segment INTEGER, step BIGINT, key VARCHAR, kind VARCHAR,
        severity VARCHAR, message VARCHAR, data JSON, wall_time DOUBLE""",
    "ingested_files": "name VARCHAR PRIMARY KEY, run_id VARCHAR, rows BIGINT, ingested_at TIMESTAMP",
}

VIEWS_SQL = {
    "segment_bounds": """
        SELECT run_id, rank, segment, start_step,
               min(start_step) OVER (
                   PARTITION BY run_id, rank ORDER BY segment
                   ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS hidden_from
        FROM segments""",
    "curves": """
        SELECT m.run_id, m.rank, m.segment, m.step, m.key, m.value, m.wall_time
        FROM metrics m LEFT JOIN segment_bounds b
          ON m.run_id = b.run_id AND m.rank = b.rank AND m.segment = b.segment
        WHERE b.hidden_from IS NULL OR m.step < b.hidden_from""",
    "hidden_metrics": """
        SELECT m.run_id, m.rank, m.segment, m.step, m.key, m.value, m.wall_time, b.hidden_from
        FROM metrics m JOIN segment_bounds b
          ON m.run_id = b.run_id AND m.rank = b.rank AND m.segment = b.segment
        WHERE m.step >= b.hidden_from""",
    "class_curves": """
        SELECT m.run_id, m.rank, m.segment, m.step, m.key, m.class_index,
               coalesce(c.name, CAST(m.class_index AS VARCHAR)) AS class_name, m.value, m.wall_time
        FROM class_metrics m
        LEFT JOIN segment_bounds b
          ON m.run_id = b.run_id AND m.rank = b.rank AND m.segment = b.segment
        LEFT JOIN classes c ON c.run_id = m.run_id AND c.class_index = m.class_index
        WHERE b.hidden_from IS NULL OR m.step < b.hidden_from""",
    "run_summary": """
        SELECT r.run_id, r.project, r.name, r.status, r.created_at, r.updated_at,
               date_diff('millisecond', r.created_at, r.updated_at) / 1000.0 AS duration_s,
               p.last_step, coalesce(p.n_points, 0) AS n_points,
               coalesce(g.segments, 0) AS segments, r.tags, r.config
        FROM runs r
        LEFT JOIN (SELECT run_id, max(step) AS last_step, count(*) AS n_points
                   FROM curves GROUP BY run_id) p ON p.run_id = r.run_id
        LEFT JOIN (SELECT run_id, count(*) AS segments FROM segments GROUP BY run_id) g
          ON g.run_id = r.run_id""",
}


# a fork's own first step minus one, capped by its fork step: the last step it inherits
_FORK_UPTO = """least(r.fork_step, coalesce(
    (SELECT min(s.start_step) FROM segments s WHERE s.run_id = r.run_id) - 1, r.fork_step))"""

# the resume rule of segment_bounds, for a row m of metrics or class_metrics
_VISIBLE = """NOT EXISTS (SELECT 1 FROM segments s WHERE s.run_id = m.run_id AND s.rank = m.rank
                          AND s.segment > m.segment AND s.start_step <= m.step)"""

LINEAGE_VIEWS_SQL = {
    "own_curves": VIEWS_SQL["curves"],
    "own_class_curves": VIEWS_SQL["class_curves"],
    "run_lineage": f"""
        WITH RECURSIVE forks AS (
            SELECT r.run_id, r.parent_run_id, {_FORK_UPTO} AS upto
            FROM runs r WHERE r.parent_run_id IS NOT NULL AND r.fork_step IS NOT NULL),
        chain(run_id, ancestor_id, upto, depth) AS (
            SELECT run_id, parent_run_id, upto, 1 FROM forks
            UNION ALL
            SELECT c.run_id, f.parent_run_id, least(c.upto, f.upto), c.depth + 1
            FROM chain c JOIN forks f ON f.run_id = c.ancestor_id
            WHERE c.depth < 64)
        SELECT run_id, ancestor_id, upto, depth FROM chain""",
    # the inherited rows read the tables, not own_curves: joined from run_lineage, the scan of
    # metrics is pruned to the ancestors' rows (all of it when there is no fork), where a
    # second pass over own_curves would cost as much as the first
    "curves": f"""
        SELECT run_id, rank, segment, step, key, value, wall_time FROM own_curves
        UNION ALL
        SELECT l.run_id, m.rank, m.segment, m.step, m.key, m.value, m.wall_time
        FROM run_lineage l JOIN metrics m ON m.run_id = l.ancestor_id AND m.step <= l.upto
        WHERE {_VISIBLE}""",
    "class_curves": f"""
        SELECT run_id, rank, segment, step, key, class_index, class_name, value, wall_time
        FROM own_class_curves
        UNION ALL
        SELECT l.run_id, m.rank, m.segment, m.step, m.key, m.class_index,
               coalesce(c.name, CAST(m.class_index AS VARCHAR)) AS class_name, m.value, m.wall_time
        FROM run_lineage l JOIN class_metrics m ON m.run_id = l.ancestor_id AND m.step <= l.upto
        LEFT JOIN classes c ON c.run_id = m.run_id AND c.class_index = m.class_index
        WHERE {_VISIBLE}""",
    "run_aggregates": """
        SELECT run_id, key, count(*) AS n_points, min(value) AS min, max(value) AS max,
               arg_max(value, step) AS last, max(step) AS last_step,
               arg_min(step, value) AS min_step, arg_max(step, value) AS max_step
        FROM curves WHERE NOT isnan(value) GROUP BY run_id, key""",
}
LOCAL_VIEWS_SQL = {
    **{k: v for k, v in VIEWS_SQL.items() if k not in ("curves", "class_curves", "run_summary")},
    **LINEAGE_VIEWS_SQL,
    "run_summary": VIEWS_SQL["run_summary"].replace(
        "r.tags, r.config", "r.tags, r.config, r.parent_run_id, r.fork_step"),
}


@migration
def m001_initial(con: duckdb.DuckDBPyConnection) -> None:
    for name, cols in TABLES_SQL.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {name} ({cols})")
    for name, sql in VIEWS_SQL.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")


@migration
def m002_spool_state(con: duckdb.DuckDBPyConnection) -> None:
    """Remember the spool metadata last ingested, so readers can skip the spool when current."""
    con.execute("CREATE TABLE IF NOT EXISTS spool_state (id INTEGER PRIMARY KEY, fingerprint VARCHAR)")


@migration
def m003_views_without_a_step_sentinel(con: duckdb.DuckDBPyConnection) -> None:
    """``segment_bounds.hidden_from`` is NULL where no later segment hides anything (it was
    2**63 - 1, which hid a row logged at that very step)."""
    for name, sql in VIEWS_SQL.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
    if _has_lineage(con):  # re-applied after m004 (a store mended by hand): keep the fork views
        for name, sql in LOCAL_VIEWS_SQL.items():
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")


def _has_lineage(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'runs' "
                            "AND column_name = 'parent_run_id' AND table_catalog = current_database()").fetchone()[0])


@migration
def m004_run_lineage(con: duckdb.DuckDBPyConnection) -> None:
    """Forks: ``runs.parent_run_id`` and ``runs.fork_step``; ``curves`` and ``class_curves``
    with inherited rows, ``run_lineage`` and ``run_aggregates`` (see the module doc)."""
    con.execute("ALTER TABLE runs ADD COLUMN IF NOT EXISTS parent_run_id VARCHAR")
    con.execute("ALTER TABLE runs ADD COLUMN IF NOT EXISTS fork_step BIGINT")
    for name in ("run_summary", "curves", "class_curves"):
        con.execute(f"DROP VIEW IF EXISTS {name}")
    for name, sql in LOCAL_VIEWS_SQL.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")


@migration
def m005_fork_views_without_a_second_pass(con: duckdb.DuckDBPyConnection) -> None:
    """``curves`` and ``class_curves`` read a fork's inherited rows from the tables (m004's
    views passed over ``own_curves`` twice: four times slower with no fork at all)."""
    for name, sql in LOCAL_VIEWS_SQL.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")


def migrate(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Apply the migrations not yet recorded; returns their names."""
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP)"
    )
    done = {r[0] for r in con.execute("SELECT name FROM schema_migrations").fetchall()}
    applied = []
    for name, fn in MIGRATIONS:
        if name in done:
            continue
        con.execute("BEGIN")
        fn(con)
        con.execute("INSERT INTO schema_migrations VALUES (?, now())", [name])
        con.execute("COMMIT")
        applied.append(name)
    return applied


def is_current(con: duckdb.DuckDBPyConnection) -> bool:
    try:
        done = {r[0] for r in con.execute("SELECT name FROM schema_migrations").fetchall()}
    except duckdb.Error:
        return False
    return all(name in done for name, _ in MIGRATIONS)
