"""The child process of the SQL page: runs one checked statement under hard limits.

Reads a JSON job (home, sql, max_rows, max_bytes, memory_mb) on stdin and writes the
rows as an Arrow IPC stream on stdout (schema metadata ``truncated`` = ``1`` when rows
were cut at ``max_rows`` or ``max_bytes``); exit status 3 with ``{"message": ...}`` on
stdout when DuckDB refuses or fails the query. The process's address space is limited
to what it holds after start-up plus twice ``memory_mb``, and DuckDB's own
``memory_limit`` is ``memory_mb``, so a query that builds huge values fails here
instead of growing the app. Run by :func:`webui.sql.run_sql`; not a public interface.
"""

from __future__ import annotations

import json
import resource
import sys
from typing import Any

import duckdb
import pyarrow as pa

from tracker.errors import TrackerError
from tracker.store import Store


def _address_space() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _limit_memory(memory_mb: int) -> None:
    size = _address_space()
    if size:
        limit = size + 2 * memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _why(exc: duckdb.Error) -> str:
    first = str(exc).splitlines()[0]
    low = first.lower()
    if "disabled by configuration" in low or "permission" in low:
        return f"query refused: file access and settings are switched off on the SQL page ({first})"
    if "read-only" in low or "read only" in low:
        return f"query refused: the store is opened read-only ({first})"
    if isinstance(exc, duckdb.OutOfMemoryException) or "out of memory" in low:
        return f"query refused: it needs more memory than the SQL page allows; narrow it (WHERE, LIMIT) or aggregate ({first})"
    return f"query failed: {first}"


def _one_read(sql: str) -> duckdb.Statement:
    """The one SELECT/EXPLAIN statement in ``sql``; run as a parsed statement, so nothing else can run."""
    statements = duckdb.extract_statements(sql)
    if len(statements) != 1 or statements[0].type.name not in ("SELECT", "EXPLAIN"):
        raise TrackerError(f"query refused: exactly one SELECT is run on the SQL page, got {len(statements)} statements")
    return statements[0]


def _run(job: dict[str, Any]) -> tuple[pa.Table, bool]:
    memory_mb, max_rows, max_bytes = int(job["memory_mb"]), int(job["max_rows"]), int(job["max_bytes"])
    store = Store(job["home"])
    with store.reader(safe=True, memory_limit=f"{memory_mb}MB") as con:
        _limit_memory(memory_mb)
        reader = con.execute(_one_read(job["sql"])).fetch_record_batch(1024)
        batches, rows, size, cut = [], 0, 0, False
        for batch in reader:
            if rows + batch.num_rows > max_rows:
                batch, cut = batch.slice(0, max_rows - rows), True
            size += batch.nbytes
            if size > max_bytes:
                cut = True
                break
            batches.append(batch)
            rows += batch.num_rows
            if cut:
                break
        table = pa.Table.from_batches(batches, schema=reader.schema)
    return table, cut


def main() -> int:
    job = json.loads(sys.stdin.buffer.read())
    try:
        table, cut = _run(job)
    except (duckdb.Error, TrackerError, MemoryError) as exc:
        message = _why(exc) if isinstance(exc, duckdb.Error) else (
            "query refused: it needs more memory than the SQL page allows; narrow it (WHERE, LIMIT) or aggregate"
            if isinstance(exc, MemoryError) else str(exc)
        )
        sys.stdout.write(json.dumps({"message": message}))
        return 3
    table = table.replace_schema_metadata({"truncated": "1" if cut else "0"})
    with pa.ipc.new_stream(sys.stdout.buffer, table.schema) as writer:
        writer.write_table(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
