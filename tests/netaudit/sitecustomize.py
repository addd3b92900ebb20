"""Every Python child of the test run records and refuses network use (tests/conftest.py).

Python imports ``sitecustomize`` at start-up from ``sys.path``; tests/conftest.py puts this
folder on ``PYTHONPATH`` and names the record file in ``TRACKER_TEST_NETAUDIT``. The hook
is tests/harness/netaudit.py, loaded by its path so that a child does not import the
``tracker`` package before it asks for it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

_record = os.environ.get("TRACKER_TEST_NETAUDIT")
if _record:
    _path = Path(__file__).resolve().parents[2] / "tests" / "harness" / "netaudit.py"
    _spec = importlib.util.spec_from_file_location("_tracker_test_netaudit", _path)
    if _spec is not None and _spec.loader is not None:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
        _module.install(_record, where=True)
