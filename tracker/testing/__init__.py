"""Public API for plugin authors: the conformance checks of loss terms and kernels.

``check_loss_term(term)`` and ``check_kernel(term, backend)`` raise
:class:`ConformanceError` naming every failed check; the pytest plugin
``tracker.testing.pytest_plugin`` runs them on every registered term and kernel.
This package ships because third-party plugins test themselves with it (see
docs/plugins.md and examples/tracker-example-plugin) and ``tracker losses check``
runs the same checks: :mod:`tracker.testing.conformance` (logits terms),
:mod:`tracker.testing.pair_checks` (pair terms) and
:mod:`tracker.testing.pytest_plugin`. The suite's own harness (kill rounds, the
network audit, a throw-away PostgreSQL) lives in ``tests/harness/``, outside the
package.
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
