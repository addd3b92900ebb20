"""Every registered loss term and kernel passes the conformance checks (one test each).

The tests are parametrized by ``tracker.testing.pytest_plugin`` over what the
installed plugins registered, built-in and third-party alike.
"""

from __future__ import annotations

from tracker.testing import check_kernel, check_loss_term


def test_registered_loss_term(tracker_loss_term: str) -> None:
    check_loss_term(tracker_loss_term)


def test_registered_kernel(tracker_kernel: str) -> None:
    term, backend = tracker_kernel.split("/", 1)
    report = check_kernel(term, backend, raise_on_failure=False)
    unavailable = [r.message for r in report.results if r.status == "skipped"]
    # here every registered kernel must run: make test installs what they need (lavapipe too)
    assert not unavailable, f"{tracker_kernel} is registered but unavailable: {unavailable[0]}"
    report.raise_if_failed()
