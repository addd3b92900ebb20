"""Shared fixtures: each test gets a fresh store folder and a fresh plugin host."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tracker.host import Host, set_host
from tests.harness import netaudit

pytest_plugins = ["tracker.testing.pytest_plugin"]

# No test, and no Python process a test starts, looks a name up or connects anywhere but
# this machine: an audit hook records and refuses it (tests/harness/netaudit.py), in this
# process and, through tests/netaudit/sitecustomize.py on PYTHONPATH, in every child.
NET_RECORD = Path(tempfile.mkdtemp(prefix="tracker-netaudit-")) / "network.log"
NET_RECORD.touch()
os.environ["TRACKER_TEST_NETAUDIT"] = str(NET_RECORD)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(Path(__file__).resolve().parent / "netaudit"), os.environ.get("PYTHONPATH")) if p)
netaudit.install(NET_RECORD, where=True)

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(autouse=True)
def no_network() -> Iterator[None]:
    """Fail the test that (or whose children) looked a name up or connected off this machine."""
    before = NET_RECORD.stat().st_size
    yield
    with NET_RECORD.open(encoding="utf-8") as fh:
        fh.seek(before)
        used = fh.read()
    assert not used, f"network use outside localhost (refused by the audit hook):\n{used}"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh TRACKER_HOME for every test; only the store logger unless a test says so."""
    h = tmp_path / "tracker-home"
    monkeypatch.setenv("TRACKER_HOME", str(h))
    monkeypatch.setenv("TRACKER_LOGGERS", "store")
    monkeypatch.delenv("TRACKER_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("TRACKER_RUN_ID", raising=False)
    # the system sampler adds sys/* rows on its own clock: tests that want it turn it on
    monkeypatch.setenv("TRACKER_SYSTEM", "0")
    monkeypatch.delenv("TRACKER_SYSTEM_INTERVAL", raising=False)
    return h


@pytest.fixture(autouse=True)
def fresh_host() -> Iterator[None]:
    """A new process-wide host per test (built lazily from the default plugins)."""
    old = set_host(None)
    yield
    set_host(old)
    from tracker.store import release

    release()


@pytest.fixture
def host() -> Host:
    from tracker.host import get_host

    return get_host()


@pytest.fixture
def coco_dir() -> Path:
    return DATA / "coco"
