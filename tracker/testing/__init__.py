"""Public test helpers for loss plugins: the conformance checks.

``check_loss_term(term)`` and ``check_kernel(term, backend)`` raise
:class:`ConformanceError` naming every failed check; the pytest plugin
``tracker.testing.pytest_plugin`` runs them on every registered term and kernel.
"""

from __future__ import annotations

from tracker.testing.conformance import (
    CheckResult,
    ConformanceError,
    ConformanceReport,
    check_all,
    check_kernel,
    check_loss_term,
)

__all__ = [
    "CheckResult",
    "ConformanceError",
    "ConformanceReport",
    "check_all",
    "check_kernel",
    "check_loss_term",
]
