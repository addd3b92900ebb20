"""Pytest plugin: one conformance test per registered loss term and per kernel.

Enable it in the top-level ``conftest.py``::

    pytest_plugins = ["tracker.testing.pytest_plugin"]

It parametrizes two fixtures over what the process-wide host has registered
(built-in and third-party plugins alike): ``tracker_loss_term`` (a term name) and
``tracker_kernel`` (``"<term>/<backend>"``). Its own tests
:func:`test_tracker_loss_term` and :func:`test_tracker_kernel` use them; a plugin
author's test module collects them with::

    from tracker.testing.pytest_plugin import test_tracker_kernel, test_tracker_loss_term

An unavailable kernel (``Kernel.available()`` gives a reason) is skipped with that
reason; every other outcome is a pass or a failure naming term, backend, check and
worst element.
"""

from __future__ import annotations

from typing import Any

import pytest

from tracker.losses import kernels, losses
from tracker.testing.conformance import check_kernel, check_loss_term

TERM_FIXTURE = "tracker_loss_term"
KERNEL_FIXTURE = "tracker_kernel"


def registered() -> tuple[list[str], list[str]]:
    """Registered term names and ``term/backend`` kernel keys of the process-wide host."""
    terms = list(losses())
    keys = [f"{term}/{backend}" for term in terms for backend in kernels(term)]
    return terms, keys


def pytest_generate_tests(metafunc: Any) -> None:
    """Parametrize ``tracker_loss_term`` and ``tracker_kernel`` over the registries."""
    wanted = [name for name in (TERM_FIXTURE, KERNEL_FIXTURE) if name in metafunc.fixturenames]
    if not wanted:
        return
    terms, keys = registered()
    for name in wanted:
        values = terms if name == TERM_FIXTURE else keys
        metafunc.parametrize(name, values, ids=values)


def test_tracker_loss_term(tracker_loss_term: str) -> None:
    """The registered term's reference passes every conformance check."""
    check_loss_term(tracker_loss_term)


def test_tracker_kernel(tracker_kernel: str) -> None:
    """The registered kernel passes every conformance check (skipped when unavailable here)."""
    term, backend = tracker_kernel.split("/", 1)
    report = check_kernel(term, backend, raise_on_failure=False)
    skipped = [r for r in report.results if r.status == "skipped"]
    if skipped:
        pytest.skip(f"{tracker_kernel}: {skipped[0].message}")
    report.raise_if_failed()
