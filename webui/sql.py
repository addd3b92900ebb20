"""The SQL page's engine: one read-only statement over the store, refused unless safe.

Rules (two independent layers; either alone refuses every write or file access):

1. :func:`check_sql` parses the text with DuckDB's own parser and accepts exactly one
   statement of a read kind: ``SELECT``/``WITH``/``FROM``/``VALUES``/``TABLE``,
   ``DESCRIBE``/``SHOW``/``SUMMARIZE``, ``PRAGMA table_info``/``show_tables``/``version``
   and ``EXPLAIN`` (with ``ANALYZE``) of one of those. Anything else (INSERT, UPDATE,
   DELETE, CREATE, DROP, ATTACH, DETACH, INSTALL, LOAD, COPY, EXPORT, SET, RESET, USE,
   CALL, CHECKPOINT, ...) is refused with a :class:`~tracker.errors.ConfigError`
   naming the kind of statement.
2. :func:`run_sql` runs it on ``Store.reader(safe=True)``: a read-only connection
   whose spool rows are copied into temp tables before external access is switched
   off and the configuration locked, so ``read_csv``/``read_parquet``/``glob`` of
   any file, ``COPY`` and ``SET`` fail inside DuckDB too. DuckDB's refusal is turned
   into a :class:`~tracker.errors.StoreError` that says why.

A query runs for at most ``timeout`` seconds (it is interrupted after that) and at
most ``max_rows`` rows come back, so one heavy query cannot stall the app.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import duckdb
import polars as pl
import pyarrow as pa

from tracker.errors import ConfigError, StoreError
from tracker.store import Store

READ_KEYWORDS = ("select", "with", "from", "values", "table", "describe", "show", "summarize", "pragma", "(")
PRAGMAS = ("table_info", "show_tables", "show_tables_expanded", "version", "database_size")
_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.S)
_EXPLAIN = re.compile(r"^\s*explain\s+(analyze\s+)?(\([^)]*\)\s*)?", re.I)


@dataclass
class SqlResult:
    """Rows of a query (at most ``max_rows``) and whether more were cut off."""

    frame: pl.DataFrame
    truncated: bool
    sql: str


def _first_word(text: str) -> str:
    body = _COMMENT.sub(" ", text).strip().lower()
    if body.startswith("("):
        return "("
    match = re.match(r"[a-z_]+", body)
    return match.group(0) if match else ""


def _check_one(text: str, statement: duckdb.Statement) -> None:
    kind = statement.type.name
    if kind == "EXPLAIN":
        inner = _EXPLAIN.sub("", _COMMENT.sub(" ", text), count=1)
        parsed = duckdb.extract_statements(inner)
        if len(parsed) != 1:
            raise ConfigError("EXPLAIN needs exactly one statement after it; e.g. EXPLAIN SELECT ...")
        _check_one(inner, parsed[0])
        return
    word = _first_word(text)
    if word == "pragma" or kind != "SELECT" or word not in READ_KEYWORDS:
        _refuse_kind(text, kind, word)


def _refuse_kind(text: str, kind: str, word: str) -> None:
    """Refuse a statement that is not a plain read; a PRAGMA passes when it only reads."""
    if word == "pragma":
        name = re.match(r"\s*pragma\s+([a-z_]+)", _COMMENT.sub(" ", text), re.I)
        if kind == "SELECT" and name and name.group(1).lower() in PRAGMAS:
            return
        got = name.group(1) if name else "?"
        raise ConfigError(f"PRAGMA {got} is refused on the SQL page; allowed: {', '.join(PRAGMAS)}")
    shown = word.upper() if word and word != "(" else kind
    if kind not in ("SELECT", shown):
        shown = f"{shown} ({kind})"
    raise ConfigError(
        f"The SQL page is read-only: {shown} statements are refused; "
        "use SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN or PRAGMA table_info"
    )


def check_sql(sql: str) -> str:
    """Return the one read statement in ``sql`` (without a trailing ``;``), or refuse it."""
    if not isinstance(sql, str) or not _COMMENT.sub("", sql).strip(" \n\t;"):
        raise ConfigError("The query is empty; type a SELECT, e.g. SELECT * FROM run_summary")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ConfigError(f"The query does not parse: {str(exc).splitlines()[0]}") from None
    texts = [s for s in statements if _COMMENT.sub("", s.query).strip(" \n\t;")]
    if len(texts) != 1:
        raise ConfigError(
            f"The SQL page runs one statement at a time; got {len(texts)}. Remove the extra ';'-separated statements"
        )
    original = sql.strip().rstrip(";").strip()
    _check_one(original, texts[0])
    return original


def _refusal(exc: duckdb.Error) -> StoreError:
    first = str(exc).splitlines()[0]
    low = first.lower()
    if "disabled by configuration" in low or "permission" in low:
        why = "file access and settings are switched off on the SQL page"
    elif "read-only" in low or "read only" in low:
        why = "the store is opened read-only"
    elif "interrupt" in low:
        why = "the query ran past its time limit; narrow it (WHERE, LIMIT) or aggregate"
    else:
        return StoreError(f"query failed: {first}")
    return StoreError(f"query refused: {why} ({first})")


def run_sql(store: Store, sql: str, *, max_rows: int = 10_000, timeout: float = 20.0) -> SqlResult:
    """Check ``sql`` and run it read-only and sandboxed; see module doc."""
    text = check_sql(sql)
    with store.reader(safe=True) as con:
        timer = threading.Timer(timeout, con.interrupt)
        timer.start()
        try:
            cursor = con.execute(text)
            reader = cursor.to_arrow_reader(min(max_rows + 1, 100_000))
            batches, rows = [], 0
            for batch in reader:
                batches.append(batch)
                rows += batch.num_rows
                if rows > max_rows:
                    break
            frame = pl.from_arrow(pa.Table.from_batches(batches, schema=reader.schema))
        except duckdb.Error as exc:
            raise _refusal(exc) from None
        finally:
            timer.cancel()
    assert isinstance(frame, pl.DataFrame)
    truncated = frame.height > max_rows
    return SqlResult(frame.head(max_rows), truncated, text)
