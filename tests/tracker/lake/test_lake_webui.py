"""The web UI on the lake, connected with a read-only PostgreSQL role (docs/store.md's GRANT lines)."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tracker.errors import ConfigError, StoreError
from tracker.store.lake import LakeStore
from tracker.store.local import Store as LocalStore
from tracker.store.settings import parse

ROOT = Path(__file__).resolve().parents[3]
APP = ROOT / "webui" / "streamlit_app.py"
GRANTS = """
GRANT USAGE ON SCHEMA public TO tracker_ro;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO tracker_ro;
"""


def _seed_module() -> Any:
    spec = importlib.util.spec_from_file_location("webui_seed", ROOT / "tests" / "webui" / "conftest.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture
def ro_lake(lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:  # type: ignore[no-untyped-def]
    """The web UI's seeded runs pushed into the lake; TRACKER_STORE set to a read-only role."""
    local_home = tmp_path / "seeded"
    monkeypatch.delenv("TRACKER_STORE")
    _seed_module().seed(local_home)
    monkeypatch.setenv("TRACKER_STORE", lake.store)
    local = object.__new__(LocalStore)
    LocalStore.__init__(local, local_home)
    local.ingest()
    writer = LakeStore(tmp_path / "writer")
    for run_id in local.query("SELECT run_id FROM runs")["run_id"].to_list():
        assert writer.push_run(local.path, run_id)
    lake.server.psql("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tracker_ro') THEN "
                     "CREATE ROLE tracker_ro LOGIN PASSWORD 'ro-secret-1'; END IF; END $$;", database="postgres")
    lake.server.psql(GRANTS, database=lake.database)
    ro = lake.store.replace(f"user={lake.server.user} password={lake.server.password}",
                            "user=tracker_ro password=ro-secret-1")
    monkeypatch.setenv("TRACKER_STORE", ro)
    monkeypatch.setenv("TRACKER_HOME", str(tmp_path / "ui-home"))
    return ro


def test_read_only_role_reads_and_cannot_write(ro_lake: str, tmp_path: Path) -> None:
    store = LakeStore(tmp_path / "ui-home")
    assert store.query("SELECT count(*) AS n FROM runs")["n"][0] == 3
    with pytest.raises(StoreError, match="permission denied|read-only|read only"):
        store.set_status("run-bce", "x")
    with store.reader(safe=True) as con:
        assert con.execute("SELECT count(*) FROM curves").fetchone()[0] > 0
        for bad in ("DELETE FROM lake.main.metrics", "SELECT * FROM read_csv('/etc/passwd')",
                    "COPY (SELECT 1) TO '/tmp/tracker-lake-copy.csv'"):
            with pytest.raises(duckdb.Error):
                con.execute(bad)


def test_sql_page_engine_is_read_only_on_the_lake(ro_lake: str, tmp_path: Path) -> None:
    from webui.sql import run_sql

    store = LakeStore(tmp_path / "ui-home")
    assert run_sql(store, "SELECT count(DISTINCT run_id) AS n FROM metrics").frame["n"][0] == 3
    with pytest.raises(ConfigError):
        run_sql(store, "DROP TABLE metrics")
    with pytest.raises(StoreError):
        run_sql(store, "SELECT * FROM read_parquet('/etc/*')")


@pytest.mark.parametrize("page", ["runs", "curves", "classes", "events", "sql"])
def test_every_page_draws_from_the_lake(ro_lake: str, page: str) -> None:
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()
    at = AppTest.from_file(str(APP), default_timeout=90)
    at.query_params["run"] = ["run-bce", "run-w"]
    if page != "runs":
        at.switch_page(f"views/{page}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    text = " ".join(str(e.value) for e in [*at.markdown, *at.caption, *at.error, *at.warning, *at.info])
    assert parse(ro_lake, "/x").password not in text
    if page == "curves":
        assert at.get("vega_lite_chart"), "no curve drawn"
    if page == "runs":
        assert at.dataframe and at.dataframe[0].value.shape[0] == 3
    st.cache_data.clear()


LIVE = """
import os, sys, time, tracker
from pathlib import Path
go = Path(sys.argv[1])
run = tracker.init("yolo", name="live", run_id="run-live", config={"analysis": False, "tracker_flush_interval": 0.2})
for s in range(100):
    run.log({"loss/total": 1.0 / (s + 1)}, step=s)
while not (go / "more").exists(): time.sleep(0.05)
for s in range(100, 150):
    run.log({"loss/total": 1.0 / (s + 1)}, step=s)
while not (go / "finish").exists(): time.sleep(0.05)
run.finish()
"""


def test_live_run_on_another_host_refreshes(lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys
    import time

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("TRACKER_HOME", str(tmp_path / "ui-host"))
    from tracker.store import query

    with pytest.raises(StoreError, match="has no catalog yet; run `tracker lake init`"):
        query("SELECT 1")  # no training host has created the catalog yet
    writer = subprocess.Popen([sys.executable, "-c", LIVE, str(tmp_path)], env=lake.env(tmp_path / "train-host"),
                              stderr=subprocess.PIPE, text=True)

    def last_step(at: AppTest) -> int | None:
        st.cache_data.clear()  # what the 2 s time-to-live does between two refreshes
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at.dataframe[0].value["last step"].tolist()[0] if at.dataframe else None

    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(StoreError):
                if query("SELECT count(*) AS n FROM runs WHERE run_id = 'run-live'")["n"][0]:
                    break
            assert time.monotonic() < deadline, "the live run never reached the lake"
            time.sleep(0.3)
        at = AppTest.from_file(str(APP), default_timeout=90)
        at.query_params["run"] = "run-live"
        at.query_params["key"] = "loss/total"
        at.switch_page("views/curves.py")
        for target, signal in ((99, "more"), (149, "finish")):
            deadline = time.monotonic() + 30
            while last_step(at) != target:
                assert time.monotonic() < deadline, (f"step {target} never shown", [e.value for e in at.markdown][:5], [c.value for c in at.caption], [e.value for e in at.error], [e.value for e in at.warning], [e.value for e in at.info])
                time.sleep(0.5)
            assert any("live, refreshing" in c.value for c in at.caption)
            (tmp_path / signal).touch()
    finally:
        (tmp_path / "more").touch()
        (tmp_path / "finish").touch()
        writer.communicate(timeout=120)
    assert writer.returncode == 0
