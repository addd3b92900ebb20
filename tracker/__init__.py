"""tracker: a plugin-based experiment tracker and loss-analysis suite.

Public API::

    import tracker
    run = tracker.init(project="yolo", config={"lr": 0.01})
    run.log({"loss/box": 0.5, "loss/cls": 1.2})
    run.log_classes("loss/cls", per_class, step=10)
    run.finish()
    tracker.query("select * from curves where key = 'loss/box'")

Submodules are imported lazily so ``import tracker`` stays cheap: any submodule is
reachable as an attribute without importing it first (``tracker.store.release()``,
``tracker.torch.ClassWeightedBCEWithLogits``, ``tracker.weights.class_weights``);
it is imported on first access.
"""

from __future__ import annotations

import os
import sys
from importlib import import_module
from typing import Any

# numpy's OpenBLAS keeps one thread per core busy-waiting for about 0.1 s (2**28 cycles)
# after it loads and after every call. On a small machine that takes a core from the
# store's first read and from the flusher thread (the first query of a process on 2
# cores: about 30 ms with it, 21 ms without). 2**4 cycles lets those threads sleep at
# once; BLAS calls still use every thread. A value already set is kept, and once numpy
# is loaded the variable has no effect, so nothing is changed then.
if "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

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


def _submodule(name: str) -> str | None:
    """``"tracker.<name>"`` when that submodule exists (found without importing it), else None."""
    if name.startswith("_"):
        return None
    from importlib.util import find_spec

    try:
        return f"tracker.{name}" if find_spec(f"tracker.{name}") is not None else None
    except (ImportError, ValueError):
        return None


def __getattr__(name: str) -> Any:
    """The public names of ``_LAZY`` and every submodule, imported on first access."""
    target = _LAZY.get(name) or _submodule(name)
    if target is None:
        raise AttributeError(f"module 'tracker' has no attribute {name!r}")
    modname, _, attr = target.partition(":")
    module = import_module(modname)
    value = getattr(module, attr) if attr else module
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    from pkgutil import iter_modules

    return sorted({*globals(), *_LAZY, *(m.name for m in iter_modules(__path__) if not m.name.startswith("_"))})
