"""The one-statement guard of ``tracker sql`` and the web UI's SQL page.

:func:`single_statement` splits the text with DuckDB's own parser
(``duckdb.extract_statements``), so a second statement hidden after a comment or a
string is seen exactly as DuckDB would run it, and returns the one statement or
raises a :class:`~tracker.errors.ConfigError`. The caller words the errors for its
own surface (the CLI and the web page say different things); what is refused is
the same everywhere. DuckDB is imported when the guard runs, not with this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracker.errors import ConfigError

if TYPE_CHECKING:  # DuckDB loads when the guard runs
    import duckdb


def single_statement(
    query: str, *, empty: str, many: str, unparsed: str = "the query does not parse",
) -> duckdb.Statement:
    """The single statement in ``query``, or a ConfigError.

    ``unparsed`` starts the message for text DuckDB cannot parse (its first line of
    error follows), ``empty`` is the message for text with no statement, and
    ``many`` the one for several statements: a format string with ``{count}`` and
    ``{kinds}`` (the statement types, comma-separated).
    """
    import duckdb

    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise ConfigError(f"{unparsed}: {str(exc).splitlines()[0]}") from None
    if not statements:
        raise ConfigError(empty)
    if len(statements) > 1:
        kinds = ", ".join(s.type.name for s in statements)
        raise ConfigError(many.format(count=len(statements), kinds=kinds))
    return statements[0]
