"""The SQL page's engine: one read-only SELECT over the store, in a child process with hard limits.

Rules (independent layers; each alone refuses every write or file access):

1. :func:`check_sql` parses the text with DuckDB's own parser
   (``duckdb.extract_statements``, through :func:`tracker.sqlguard.single_statement`,
   the guard ``tracker sql`` uses too) and accepts exactly one statement, of type SELECT
   (which covers ``WITH``, ``FROM``-first, ``VALUES``, ``TABLE``, ``DESCRIBE``, ``SHOW``,
   ``SUMMARIZE`` and ``PRAGMA table_info``/``show_tables``/``version``), or an
   ``EXPLAIN [ANALYZE]`` of one. Anything else (INSERT, UPDATE, DELETE, CREATE, DROP,
   ATTACH, INSTALL, LOAD, COPY, EXPORT, SET, RESET, USE, CALL, CHECKPOINT, a second
   statement hidden after a comment, ...) is refused with a
   :class:`~tracker.errors.ConfigError` naming the kind. The statement's syntax tree
   (DuckDB's ``json_serialize_sql``) is then searched for functions that reveal the
   store's path or settings (``duckdb_*()``, ``pragma_*()`` beyond the allowed
   pragmas, ``current_setting``, ...), which are refused too.
2. :func:`run_sql` runs the statement in a child process (``webui.sql_worker``) on
   ``Store.reader(safe=True)``: a read-only connection whose spool rows are copied into
   temp tables before external access is switched off and the configuration locked,
   with a DuckDB ``memory_limit`` and an address-space limit on the process. The
   child is killed when the time limit passes; at most ``max_rows`` rows and
   ``max_bytes`` bytes come back. A crash of DuckDB ends only the child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import duckdb
import polars as pl
import pyarrow as pa

from tracker.errors import ConfigError, StoreError
from tracker.sqlguard import single_statement
from tracker.store import Store

PRAGMAS = ("table_info", "show_tables", "show_tables_expanded", "version")
HIDDEN_PREFIXES = ("duckdb_", "pragma_")
HIDDEN_FUNCTIONS = frozenset({"current_setting", "getenv", "enable_logging", "disable_logging", "which_secret"})
MEMORY_MB = 1024
MAX_BYTES = 256 * 2**20
_READS = "use SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN or PRAGMA table_info"


@dataclass
class SqlResult:
    """Rows of a query (at most ``max_rows``) and whether more were cut off."""

    frame: pl.DataFrame
    truncated: bool
    sql: str


def _words(text: str) -> list[str]:
    """The statement's tokens as DuckDB's tokenizer splits them (comments dropped)."""
    tokens = duckdb.tokenize(text)
    ends = [pos for pos, _ in tokens[1:]] + [len(text)]
    return [text[pos:end].strip() for (pos, _kind), end in zip(tokens, ends)]


def _refuse(text: str, kind: str) -> ConfigError:
    words = _words(text)
    first = words[0].upper() if words else kind
    if first == "PRAGMA" and len(words) > 1:
        return ConfigError(f"PRAGMA {words[1]} is refused on the SQL page; allowed: {', '.join(PRAGMAS)}")
    shown = first if first == kind else f"{first} ({kind})"
    return ConfigError(f"The SQL page is read-only: {shown} statements are refused; {_READS}")


def _explained(text: str) -> str:
    """The statement after ``EXPLAIN [ANALYZE]``, found with DuckDB's tokenizer."""
    words = _words(text)
    skip = 2 if len(words) > 1 and words[1].upper() == "ANALYZE" else 1
    tokens = duckdb.tokenize(text)
    return text[tokens[skip][0]:] if skip < len(tokens) else ""


def _functions(node: Any) -> Iterator[str]:
    """Every function and table name in a serialized syntax tree."""
    if isinstance(node, dict):
        name = node.get("function_name")
        if node.get("type") == "BASE_TABLE":  # DuckDB also calls `FROM duckdb_settings` without ()
            name = node.get("table_name")
        if isinstance(name, str):
            yield name.lower()
        for value in node.values():
            yield from _functions(value)
    elif isinstance(node, list):
        for value in node:
            yield from _functions(value)


def _check_functions(text: str) -> None:
    con = duckdb.connect()
    try:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [text]).fetchone()[0])
    finally:
        con.close()
    if tree.get("error"):
        raise ConfigError(f"The query cannot be checked: {tree.get('error_message', 'unknown error')}")
    for name in _functions(tree):
        allowed = name.removeprefix("pragma_") in PRAGMAS
        if name in HIDDEN_FUNCTIONS or (name.startswith(HIDDEN_PREFIXES) and not allowed):
            raise ConfigError(
                f"{name}() is refused on the SQL page: it shows the server's files and settings; "
                "query the store's tables and views (SHOW TABLES lists them)"
            )


def _check_one(statement: duckdb.Statement) -> str:
    kind = statement.type.name
    text = statement.query.strip().rstrip(";").strip()
    if kind == "EXPLAIN":
        inner = duckdb.extract_statements(_explained(text))
        if len(inner) != 1:
            raise ConfigError("EXPLAIN needs exactly one statement after it; e.g. EXPLAIN SELECT ...")
        _check_one(inner[0])
        return text
    if kind != "SELECT":
        raise _refuse(text, kind)
    _check_functions(text)
    return text


def check_sql(sql: str) -> str:
    """Return the one read statement in ``sql`` (as DuckDB parsed it), or refuse it; see module doc."""
    if not isinstance(sql, str):
        raise ConfigError(f"The query must be text, got {type(sql).__name__}")
    statement = single_statement(
        sql,
        unparsed="The query does not parse",
        empty="The query is empty; type a SELECT, e.g. SELECT * FROM run_summary",
        many="The SQL page runs one statement at a time; got {count} ({kinds}). "
             "Remove the extra ';'-separated statements (a comment ends at a line break or carriage return)",
    )
    return _check_one(statement)


def run_sql(
    store: Store, sql: str, *, max_rows: int = 10_000, timeout: float = 20.0,
    memory_mb: int = MEMORY_MB, max_bytes: int = MAX_BYTES,
) -> SqlResult:
    """Check ``sql`` and run it read-only and sandboxed in a child process; see module doc."""
    text = check_sql(sql)
    job = {"home": str(store.home), "sql": text, "max_rows": max_rows, "max_bytes": max_bytes,
           "memory_mb": memory_mb}
    root = str(Path(__file__).resolve().parents[1])  # where `webui` is importable from
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "webui.sql_worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=env,
    )
    try:
        out, err = proc.communicate(json.dumps(job).encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise StoreError(
            f"query refused: the query ran past its time limit ({timeout:g} s) and was stopped; "
            "narrow it (WHERE, LIMIT) or aggregate"
        ) from None
    if proc.returncode == 3:
        raise StoreError(json.loads(out)["message"])
    if proc.returncode != 0:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        raise StoreError(
            f"query failed: the query process ended abnormally ({last[0]}); "
            f"it may have run past its memory limit ({memory_mb} MB): narrow or aggregate it"
        )
    with pa.ipc.open_stream(out) as reader:
        table = reader.read_all()
        truncated = (reader.schema.metadata or {}).get(b"truncated") == b"1"
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return SqlResult(frame, truncated, text)
