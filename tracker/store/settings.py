"""Which store a process uses: the local DuckDB file (default) or a DuckLake.

The setting is DuckLake's own spelling, ``ducklake:postgres:<libpq connection
string>`` (``TRACKER_STORE``, ``tracker.init(store=...)``, ``tracker --store``), with
the data files' directory in ``TRACKER_DATA_PATH`` (``data_path=``, ``--data-path``).
Unset, the store is today's DuckDB file under ``TRACKER_HOME``.

The password in the setting is never shown: :meth:`LakeSetting.masked` and
:meth:`LakeSetting.scrub` replace it with ``***`` in every message this package
writes, including errors passed on from DuckDB or libpq.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

from tracker.errors import ConfigError

PREFIX = "ducklake:postgres:"
# libpq's connection keywords (PostgreSQL 15, "Parameter Key Words")
LIBPQ_KEYS = frozenset(
    """host hostaddr port dbname user password passfile channel_binding connect_timeout
    client_encoding options application_name fallback_application_name keepalives
    keepalives_idle keepalives_interval keepalives_count tcp_user_timeout replication
    gssencmode sslmode requiressl sslcompression sslcert sslkey sslpassword sslrootcert
    sslcrl sslcrldir sslsni requirepeer ssl_min_protocol_version ssl_max_protocol_version
    krbsrvname gsslib service target_session_attrs load_balance_hosts""".split()
)
MASK = "***"

_override: tuple[str | None, str | None] | None = None


def _parse_conninfo(text: str, shown: str, strict: bool = True) -> dict[str, str]:
    """libpq ``key=value`` pairs (values may be single-quoted with backslash escapes).

    ``strict=False`` returns what it could read (to find the password to mask) instead of raising.
    """
    out: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            break
        j = text.find("=", i)
        if j < 0:
            if not strict:
                break
            raise ConfigError(
                f"TRACKER_STORE={shown!r}: {text[i:].split()[0]!r} is not key=value; "
                "write a libpq connection string such as "
                "'ducklake:postgres:dbname=tracker host=db port=5432 user=tracker password=...'"
            )
        key = text[i:j].strip()
        i = j + 1
        while i < n and text[i].isspace():
            i += 1
        value = []
        if i < n and text[i] == "'":
            i += 1
            while i < n and text[i] != "'":
                if text[i] == "\\" and i + 1 < n:
                    i += 1
                value.append(text[i])
                i += 1
            if i >= n and strict:
                raise ConfigError(f"TRACKER_STORE={shown!r}: unterminated quote in the value of {key!r}")
            i += 1
        else:
            while i < n and not text[i].isspace():
                value.append(text[i])
                i += 1
        if key not in LIBPQ_KEYS and strict:
            raise ConfigError(
                f"TRACKER_STORE={shown!r}: unknown connection keyword {key!r}; "
                "use libpq's keywords (dbname, host, port, user, password, sslmode, ...)"
            )
        out[key] = "".join(value)
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _quote(value: str) -> str:
    """A libpq value, quoted when it needs to be."""
    if value and not any(c.isspace() or c in "'\\" for c in value):
        return value
    return "'" + _escape(value) + "'"


@dataclass(frozen=True)
class LakeSetting:
    """A parsed ``ducklake:postgres:...`` setting and the data path."""

    conninfo: str = field(repr=False)
    params: dict[str, str] = field(repr=False)
    data_path: str

    @property
    def password(self) -> str | None:
        return self.params.get("password") or None

    def masked(self) -> str:
        """The setting, rebuilt from its keywords, with the password replaced by ``***``."""
        return PREFIX + " ".join(f"{k}={MASK if k == 'password' else _quote(v)}" for k, v in self.params.items())

    def scrub(self, text: str) -> str:
        """``text`` with every spelling of the password (quoted, escaped, raw) replaced by ``***``."""
        pw = self.password
        if not pw:
            return text
        for form in ("'" + _escape(pw) + "'", _escape(pw), pw):
            text = text.replace(form, MASK)
        return text

    def attach_target(self, connect_timeout: float | None = None) -> str:
        """The ``ducklake:postgres:...`` string to ATTACH (with a connect timeout added)."""
        info = self.conninfo
        if connect_timeout is not None and "connect_timeout" not in self.params:
            info += f" connect_timeout={max(1, int(connect_timeout))}"
        return PREFIX + info

    def __str__(self) -> str:
        return self.masked()

    def key(self) -> str:
        """An identity for caches: the setting and the data path, password masked."""
        return f"{self.masked()}|{self.data_path}"


def parse(store: str, data_path: str | None) -> LakeSetting:
    """Validate a store setting; errors name it with the password masked."""
    rest = store[len(PREFIX):]
    shown = store
    if store.startswith(PREFIX):
        params = _parse_conninfo(rest, "", strict=False)
        if params.get("password"):
            pw = params["password"]
            for form in ("'" + _escape(pw) + "'", _escape(pw), pw):
                shown = shown.replace(form, MASK)
        params = _parse_conninfo(rest, shown)
    else:
        from urllib.parse import urlsplit

        masked = store
        secret = _parse_conninfo(store.split(":", 2)[-1], "", strict=False).get("password")
        with contextlib.suppress(ValueError):
            secret = secret or urlsplit(store).password
        if secret:
            masked = masked.replace(secret, MASK)
        raise ConfigError(
            f"TRACKER_STORE={masked!r} is not a store setting; unset it for the local DuckDB file, or write "
            "'ducklake:postgres:dbname=... host=... port=... user=... password=...' (DuckLake's spelling)"
        )
    if "dbname" not in params:
        raise ConfigError(f"TRACKER_STORE={shown!r} names no database; add dbname=... to the connection string")
    if not data_path:
        raise ConfigError(
            f"TRACKER_STORE={shown!r} needs a data path for the lake's Parquet files: set TRACKER_DATA_PATH "
            "(or data_path=, --data-path) to a directory on shared storage or an s3:// path"
        )
    if "://" not in data_path:
        data_path = os.path.abspath(data_path)
    if not data_path.endswith("/"):
        data_path += "/"
    return LakeSetting(conninfo=rest.strip(), params=params, data_path=data_path)


def use(store: str | None, data_path: str | None = None) -> None:
    """Select the store for this process (overrides the environment); None, None: back to it."""
    global _override
    if store is None and data_path is None:
        _override = None
        return
    if store:
        parse(store, data_path or os.environ.get("TRACKER_DATA_PATH"))
    _override = (store, data_path)


def current() -> LakeSetting | None:
    """The lake selected for this process, or None for the local DuckDB file."""
    store, data_path = _override if _override is not None else (None, None)
    store = store if store is not None else os.environ.get("TRACKER_STORE") or None
    data_path = data_path or os.environ.get("TRACKER_DATA_PATH") or None
    if not store or store == "local":
        return None
    return parse(store, data_path)
