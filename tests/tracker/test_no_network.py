"""The test run's own guard: a child of a test that looks a name up is refused and recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import socket
for what, call in (("lookup", lambda: socket.getaddrinfo("example.org", 443)),
                   ("connect", lambda: socket.socket().connect(("192.0.2.1", 9)))):
    try:
        call()
    except OSError as exc:
        print(what, "refused" if "audit hook" in str(exc) else f"failed otherwise: {exc}")
    else:
        print(what, "allowed")
socket.getaddrinfo("localhost", 80)
print("localhost allowed")
"""


def test_a_child_process_is_watched_and_refused(tmp_path: Path) -> None:
    record = tmp_path / "child-network.log"
    env = {**os.environ, "TRACKER_TEST_NETAUDIT": str(record)}  # its own record, not the session's
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["lookup refused", "connect refused", "localhost allowed"]
    lines = record.read_text().splitlines()
    assert [" ".join(line.split()[:2]) for line in lines] == ["socket.getaddrinfo 'example.org'",
                                                               "socket.connect '192.0.2.1'"]
    assert all(" from <string>:" in line for line in lines)  # where the call came from
