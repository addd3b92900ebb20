"""SQL text for DuckDB: string literals, parameters written in as literals, and the
lock-down of a connection that runs user-typed SQL. Shared by both store backends."""

from __future__ import annotations

from typing import Any

import duckdb


def sql_text(text: str) -> str:
    """``text`` as a DuckDB string literal."""
    return "'" + text.replace("'", "''") + "'"


def _literal(value: Any) -> str | None:
    """``value`` as a DuckDB SQL literal of the type binding would give, or None."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if type(value) is int and -(2**63) <= value < 2**63:
        return f"CAST({value} AS BIGINT)" if not -(2**31) <= value < 2**31 else str(value)
    if type(value) is float:
        return f"CAST('{value!r}' AS DOUBLE)"
    if type(value) is str and "\x00" not in value:
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (list, tuple)) and value and len({type(v) for v in value}) == 1:
        items = [_literal(v) for v in value]
        return None if None in items else "[" + ", ".join(items) + "]"  # type: ignore[arg-type]
    return None


def inline_params(sql: str, params: Any) -> tuple[str, Any]:
    """Write simple positional parameters into ``sql`` as literals, using DuckDB's tokenizer.

    DuckDB imports pandas (over half a second) the first time it binds any
    parameter; inlining str, int, float, bool, None and flat lists of one of them
    keeps a CLI call from paying for it. Anything else is left to DuckDB's binding.
    """
    if not params or isinstance(params, dict):
        return sql, params
    literals = [_literal(v) for v in params]
    if None in literals:
        return sql, params
    try:
        tokens = duckdb.tokenize(sql)
    except Exception:
        return sql, params
    ends = [pos for pos, _ in tokens[1:]] + [len(sql)]
    holes = [pos for (pos, kind), end in zip(tokens, ends)
             if kind == duckdb.token_type.operator and sql[pos:end].strip() == "?"]
    if len(holes) != len(literals):
        return sql, params
    out, last = [], 0
    for pos, literal in zip(holes, literals):
        out.append(sql[last:pos])
        out.append(literal)  # type: ignore[arg-type]
        last = pos + 1
    out.append(sql[last:])
    return "".join(out), None


def lock_down(con: duckdb.DuckDBPyConnection, memory_limit: str | None = None) -> None:
    """Make ``con`` fit for user-typed SQL: DuckDB's ``memory_limit`` (no spilling) when
    given, external access off, and the configuration locked so no statement undoes it."""
    if memory_limit:
        con.execute(*inline_params("SET memory_limit = ?", [memory_limit]))
        con.execute("SET temp_directory = ''")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
