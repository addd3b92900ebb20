"""A real PostgreSQL server for the lake tests (initdb + pg_ctl, stopped at the end).

``pg`` is one server per test session; ``lake`` gives each test a fresh database,
a fresh data path and the lake selected through ``TRACKER_STORE``/``TRACKER_DATA_PATH``;
``log_timed`` logs a short training and times its slowest ``run.log``.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.harness.postgres import PostgresServer

_DB = itertools.count()
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def pg() -> Iterator[PostgresServer]:
    server = PostgresServer(fsync=False)  # a test server's data need not survive a power cut
    try:
        yield server
    finally:
        server.cleanup()


@dataclass
class Lake:
    server: PostgresServer
    database: str
    data_path: Path
    root: Path

    @property
    def store(self) -> str:
        """The TRACKER_STORE setting of this test's lake."""
        s = self.server
        return (f"ducklake:postgres:dbname={self.database} host=127.0.0.1 port={s.port} "
                f"user={s.user} password={s.password}")

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        """The environment of a "host" process: its own spool, this lake."""
        return {**os.environ, "TRACKER_HOME": str(home), "TRACKER_STORE": self.store,
                "TRACKER_DATA_PATH": str(self.data_path), "PYTHONPATH": str(ROOT), **extra}

    def python(self, code: str, home: Path, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
        """Run ``code`` in a separate process ("host") with spool ``home``."""
        return subprocess.run([sys.executable, "-c", code], env=self.env(home, **extra), capture_output=True,
                              text=True, timeout=timeout)

    def cli(self, *args: str, home: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tracker.cli", *args], env=self.env(home),
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def lake(pg: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lake]:
    if not pg.running():
        pg.start()
    name = f"lake{os.getpid()}_{next(_DB)}"
    pg.psql(f"CREATE DATABASE {name} OWNER {pg.user};", database="postgres")
    found = Lake(pg, name, tmp_path / "lake-data", tmp_path)
    monkeypatch.setenv("TRACKER_STORE", found.store)
    monkeypatch.setenv("TRACKER_DATA_PATH", str(found.data_path))
    from tracker.store import settings

    settings.use(None, None)
    yield found
    from tracker.store import lakerun

    for committer in list(lakerun._COMMITTERS.values()):
        committer.users = 1
        lakerun.release(committer)
    from tracker.store.lake import release_shared

    release_shared()
    settings.use(None, None)
    if not pg.running():
        pg.start()


def _log_timed(run: Any, steps: int) -> float:
    """Log ``loss = 1/(step+1)`` at steps 0..steps-1; the slowest ``run.log`` call, in seconds."""
    worst = 0.0
    for step in range(steps):
        t = time.perf_counter()
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        worst = max(worst, time.perf_counter() - t)
    return worst


@pytest.fixture
def log_timed() -> Callable[[Any, int], float]:
    """``log_timed(run, steps)``: log ``loss = 1/(step+1)`` at steps 0..steps-1; the slowest ``run.log`` in seconds."""
    return _log_timed
