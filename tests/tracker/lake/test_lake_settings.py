"""The lake setting: DuckLake's spelling, clear errors with the password masked, no downloads."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

import tracker
from tracker.errors import ConfigError, StoreError
from tracker.store import settings
from tracker.store.settings import parse


def test_setting_is_parsed_and_masked() -> None:
    s = parse("ducklake:postgres:dbname=t host=db port=5433 user=u password='se cr\\'et'", "/shared/x")
    assert s.params == {"dbname": "t", "host": "db", "port": "5433", "user": "u", "password": "se cr'et"}
    assert s.data_path == "/shared/x/"
    assert "se cr" not in s.masked() and "password=*** " not in s.masked() and s.masked().endswith("password=***")
    assert "se cr" not in repr(s) and "se cr" not in str(s)
    assert parse("ducklake:postgres:dbname=t", "s3://bucket/lake").data_path == "s3://bucket/lake/"


@pytest.mark.parametrize(
    ("store", "data_path", "needle"),
    [
        ("ducklake:postgres:dbname=t password=hunter22 colour=blue", "/d", "unknown connection keyword 'colour'"),
        ("ducklake:postgres:host=h password=hunter22", "/d", "names no database"),
        ("ducklake:postgres:dbname=t password=hunter22", None, "TRACKER_DATA_PATH"),
        ("postgres:dbname=t password=hunter22", "/d", "not a store setting"),
        ("postgresql://u:hunter22@db/t", "/d", "not a store setting"),
        ("ducklake:postgres:dbname=t password='hunter22", "/d", "unterminated quote"),
    ],
)
def test_malformed_setting_fails_init_at_once_with_the_password_masked(
    store: str, data_path: str | None, needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRACKER_DATA_PATH", raising=False)
    try:
        with pytest.raises(ConfigError) as info:
            tracker.init("p", run_id="bad", store=store, data_path=data_path)
    finally:
        settings.use(None, None)
    message = str(info.value)
    assert needle in message
    assert "TRACKER_STORE" in message
    assert "hunter22" not in message


def test_environment_setting_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_STORE", "ducklake:postgres:dbname=t password=hunter22 nope=1")
    monkeypatch.setenv("TRACKER_DATA_PATH", "/tmp/x")
    with pytest.raises(ConfigError, match="'nope'") as info:
        tracker.query("SELECT 1")
    assert "hunter22" not in str(info.value)


def test_rejected_password_fails_init_at_once_masked(lake, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    bad = lake.store.replace(lake.server.password, "wrong-pw-123")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StoreError) as info:
        tracker.init("p", run_id="r", store=bad)
    settings.use(None, None)
    message = str(info.value)
    assert "password authentication failed" in message and "password=***" in message
    assert "wrong-pw-123" not in message and "wrong-pw-123" not in caplog.text


def test_extensions_load_from_the_wheels_without_network(lake, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A fresh HOME (no extension cache) and a dead proxy: the lake still attaches; unknown
    extensions are refused instead of fetched."""
    code = (
        "import duckdb\n"
        "from tracker.store.lake import LakeStore, offline_connection\n"
        "con = LakeStore().attach(read_only=False)\n"
        "print(con.execute(\"SELECT current_setting('autoinstall_known_extensions'), "
        "current_setting('autoload_known_extensions')\").fetchone())\n"
        "print(sorted(r[0] for r in con.execute(\"SELECT extension_name FROM duckdb_extensions() "
        "WHERE installed\").fetchall()))\n"
        "try:\n    con.execute(\"SELECT * FROM read_xlsx('x.xlsx')\")\n"
        "except duckdb.Error as e:\n    print('refused:', type(e).__name__)\n"
    )
    empty_home = tmp_path / "empty-home"
    empty_home.mkdir()
    proc = lake.python(code, tmp_path / "h", HOME=str(empty_home), http_proxy="http://127.0.0.1:9",
                       https_proxy="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9",
                       HTTPS_PROXY="http://127.0.0.1:9")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "(False, False)"
    assert "refused:" in lines[2]
    assert not list(empty_home.rglob("*.duckdb_extension"))  # nothing installed into the user's cache


def test_offline_connection_never_installs(tmp_path: Path) -> None:
    code = (
        "from tracker.store.lake import offline_connection\n"
        "con = offline_connection()\n"
        "print(sorted(r[0] for r in con.execute(\"SELECT extension_name FROM duckdb_extensions() WHERE loaded\")"
        ".fetchall()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert proc.returncode == 0, proc.stderr
    assert "ducklake" in proc.stdout and "postgres_scanner" in proc.stdout
