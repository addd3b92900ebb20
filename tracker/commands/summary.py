"""A run's record as (field, value) lines, long config values summarised (``tracker runs show``).

A config holds small settings (``lr``) next to long ones (80 class counts, a
mapping of class names). Each setting gets one line, nested mappings are spelled
with dots (``config.analysis.divergence.factor``), and a value longer than the
width is summarised: a list as ``[80 values: 262465, 7113, 43867, …]``, a large
mapping as ``{80 keys: 'person', 'bicycle', …}``, a long string cut with its length.
``full=True`` keeps every value whole (JSON for lists and mappings).
"""

from __future__ import annotations

import json
from typing import Any, Iterator

MAX_FLATTENED_KEYS = 12  # a mapping with more keys is summarised as one value, not spread over lines


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def summarise(value: Any, width: int | None) -> str:
    """``value`` as text of at most ``width`` characters (None: whole)."""
    text = value if isinstance(value, str) else _json(value)
    if width is None or len(text) <= width:
        return text
    if isinstance(value, (list, tuple)):
        head = f"[{len(value)} values: "
        parts: list[str] = []
        for item in value:
            piece = _json(item)
            if len(head) + len(", ".join([*parts, piece])) + len(", …]") > width:
                break
            parts.append(piece)
        return head + ", ".join([*parts, "…"]) + "]"
    if isinstance(value, dict):
        head = f"{{{len(value)} keys: "
        parts = []
        for key in value:
            piece = repr(str(key))
            if len(head) + len(", ".join([*parts, piece])) + len(", …}") > width:
                break
            parts.append(piece)
        return head + ", ".join([*parts, "…"]) + "}"
    suffix = f"… ({len(text)} chars)"
    return text[: max(1, width - len(suffix))] + suffix


def _flatten(prefix: str, value: Any, full: bool) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value and (full or len(value) <= MAX_FLATTENED_KEYS):
        for key, item in value.items():
            yield from _flatten(f"{prefix}.{key}", item, full)
    else:
        yield prefix, value


def run_fields(record: dict[str, Any], *, full: bool = False, width: int | None = 60) -> list[tuple[str, str]]:
    """The fields of a ``run_summary`` row, config spread one setting per line and summarised to ``width``."""
    rows: list[tuple[str, str]] = []
    for name, value in record.items():
        if name == "config":
            config = json.loads(value) if isinstance(value, str) else value
            flat = isinstance(config, dict) and config
            items = list(_flatten("config", config, full)) if flat else [("config", config)]
            rows.extend((key, "" if item is None else summarise(item, None if full else width)) for key, item in items)
        elif isinstance(value, (list, tuple)):
            rows.append((name, ", ".join(str(v) for v in value)))
        else:
            rows.append((name, "" if value is None else str(value)))
    return rows
