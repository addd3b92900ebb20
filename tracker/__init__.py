"""tracker: a plugin-based experiment tracker and loss-analysis suite.

Public API::

    import tracker
    run = tracker.init(project="yolo", config={"lr": 0.01})
    run.log({"loss/box": 0.5, "loss/cls": 1.2})
    run.log_classes("loss/cls", per_class, step=10)
    run.finish()
    tracker.query("select * from curves where key = 'loss/box'")

Submodules are imported lazily so ``import tracker`` stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from tracker.errors import (
    ConfigError,
    DataError,
    PluginError,
    RunError,
    StoreError,
    StoreLockedError,
    TrackerError,
)
from tracker.hookspecs import hookimpl

__version__ = "0.1.0"

# name -> "module:attribute" (or "module" for a submodule)
_LAZY: dict[str, str] = {
    "init": "tracker.run:init",
    "Run": "tracker.run:Run",
    "query": "tracker.store:query",
    "open_store": "tracker.store:open_store",
    "losses": "tracker.losses:losses",
    "loss": "tracker.losses:loss",
    "samplers": "tracker.sampling:samplers",
    "sampler": "tracker.sampling:sampler",
    "analyze": "tracker.analysis:analyze",
    "coco": "tracker.coco",
    "testing": "tracker.testing",
}

__all__ = [
    "ConfigError",
    "DataError",
    "PluginError",
    "RunError",
    "StoreError",
    "StoreLockedError",
    "TrackerError",
    "hookimpl",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'tracker' has no attribute {name!r}")
    modname, _, attr = target.partition(":")
    module = import_module(modname)
    value = getattr(module, attr) if attr else module
    globals()[name] = value
    return value
