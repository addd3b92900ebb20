"""Events: what detectors and ``run.event()`` produce, stored in the ``events`` table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("info", "warning", "error")


@dataclass
class Event:
    """One finding at one step.

    ``status``, when set, changes the run's status (``"diverged"`` on divergence,
    ``"running"`` on a later recovery).
    """

    step: int
    kind: str
    message: str
    key: str | None = None
    severity: str = "warning"
    data: dict[str, Any] = field(default_factory=dict)
    status: str | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            from tracker.errors import ConfigError

            raise ConfigError(
                f"event severity {self.severity!r} is not one of {', '.join(SEVERITIES)}"
            )
