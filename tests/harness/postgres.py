"""A throw-away PostgreSQL server for tests and benchmarks (``initdb`` + ``pg_ctl``).

The server runs from a temporary folder on 127.0.0.1 at a free port, with password
authentication for one database and one user, and can be stopped and started again
(fault tests restart it under a live run). Run as root, the server's commands run as
the ``postgres`` system user, since ``initdb`` refuses root.

``fsync`` is PostgreSQL's own default (on) unless ``fsync=False`` is passed: the test
suite turns it off for speed (a test server's data need not survive a power cut);
benchmarks keep the default, since that is what a real catalog runs with.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tracker.errors import TrackerError


def _bin_dir() -> Path:
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if not dirs:
        raise TrackerError(
            "PostgreSQL server binaries not found (no pg_ctl on PATH or under /usr/lib/postgresql/*/bin); "
            "install Debian's `postgresql` package (make apt)"
        )
    return Path(dirs[-1])


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One temporary cluster; ``start()``, ``stop()``, ``dsn``; ``cleanup()`` removes it.

    ``fsync``: PostgreSQL's ``fsync`` setting (its default, on, unless False)."""

    def __init__(self, database: str = "tracker", user: str = "tracker", fsync: bool = True) -> None:
        self.bin = _bin_dir()
        self.database, self.user, self.fsync = database, user, fsync
        self.password = "pw-" + secrets.token_hex(8)
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tracker-pg-"))
        self.data = self.root / "data"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._initdb()

    def _cmd(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=120, cwd=self.root)
        if check and proc.returncode != 0:
            raise TrackerError(f"{' '.join(args[:2])} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
        return proc

    def _initdb(self) -> None:
        self._cmd(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth-local=trust",
                  "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C")
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                    f"unix_socket_directories = '{self.root}'\nmax_connections = 200\n"
                    + ("" if self.fsync else "fsync = off\n"))
        self.start()
        sql = (f"CREATE ROLE {self.user} LOGIN PASSWORD '{self.password}';\n"
               f"CREATE DATABASE {self.database} OWNER {self.user};\n")
        self.psql(sql, database="postgres")

    def psql(self, sql: str, database: str | None = None) -> str:
        """Run ``sql`` as the superuser over the Unix socket; returns psql's output."""
        return self._cmd(str(self.bin / "psql"), "-v", "ON_ERROR_STOP=1", "-qAt", "-h", str(self.root),
                         "-p", str(self.port), "-U", "postgres", "-d", database or self.database,
                         input=sql).stdout

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._cmd(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-w",
                  "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``mode``: smart, fast or immediate)."""
        self._cmd(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def running(self) -> bool:
        return self._cmd(str(self.bin / "pg_ctl"), "-D", str(self.data), "status", check=False).returncode == 0

    def dsn(self, password: str | None = None, user: str | None = None) -> str:
        """A libpq connection string for the test user (or ``user``/``password``)."""
        return (f"dbname={self.database} host=127.0.0.1 port={self.port} user={user or self.user} "
                f"password={password or self.password}")

    def cleanup(self) -> None:
        """Stop the server and remove its folder."""
        self.stop("immediate")
        time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)
