"""The conformance checks, collected from tracker's pytest plugin."""

from tracker.testing.pytest_plugin import test_tracker_kernel, test_tracker_loss_term  # noqa: F401
