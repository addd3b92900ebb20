"""Settings of the system sampler (``plugins/system.py``): on or off, and how often.

A run samples its process, its host and its accelerators every ``interval``
seconds on a background thread, unless told not to. The settings come from
``tracker.init(system=...)``, else from the environment:

* ``system=False`` (or ``TRACKER_SYSTEM=0``/``false``/``off``/``no``): no sampler;
* ``system=True`` or ``None`` (default): on, every ``TRACKER_SYSTEM_INTERVAL``
  seconds (default :data:`DEFAULT_INTERVAL_S`);
* ``system=<seconds>``: on, at that interval.

The interval is at least :data:`MIN_INTERVAL_S`: the sampler's own cost must stay
well under 1% of one core.

:func:`preload_background_imports` imports, on the calling thread, what a run's
background threads would otherwise import during the first seconds of training:
pyarrow's pandas shim (pyarrow imports pandas at its first ``pa.array`` of a numpy
array, about 180 modules, 0.2-0.8 s on the flusher thread, holding the import lock and
mostly the GIL), ``pyarrow.parquet`` (the store logger's first write) and ``psutil``
(the system sampler's first sample). Measured with ``python -m bench.assign_cost``:
without it the first training of a process spends several times the steady CPU of
those threads, during its first steps. A training loop calls it at setup, before the
first step (the Ultralytics integration does).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

from tracker.errors import ConfigError

DEFAULT_INTERVAL_S = 2.0
MIN_INTERVAL_S = 0.05
ENV_ON = "TRACKER_SYSTEM"
ENV_INTERVAL = "TRACKER_SYSTEM_INTERVAL"
_OFF = ("0", "false", "off", "no")
_ON = ("1", "true", "on", "yes", "")


@dataclass(frozen=True)
class SystemOptions:
    """Whether the sampler runs, and its interval in seconds."""

    enabled: bool
    interval: float


def _interval(value: Any, where: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds < MIN_INTERVAL_S:
        raise ConfigError(
            f"{where} = {value!r} is not a sampling interval; give seconds >= {MIN_INTERVAL_S} "
            f"(default {DEFAULT_INTERVAL_S}), or turn the sampler off with system=False / {ENV_ON}=0"
        )
    return seconds


def preload_background_imports(system: bool = True) -> float:
    """Import what the run's background threads import lazily (see the module doc) on this thread,
    before the training steps; returns the seconds it took (0 when all was imported already)."""
    import sys
    import time

    t0 = time.perf_counter()
    try:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute  # noqa: F401  (the flusher's casts)
        import pyarrow.parquet  # noqa: F401  (the store logger's writes)

        if "pandas" not in sys.modules:
            pa.array(np.zeros(1))  # pyarrow's pandas shim: imports pandas once, when installed
    except ImportError:
        pass
    if system:
        try:
            import psutil  # noqa: F401  (the system sampler's first sample)
        except ImportError:
            pass
    return time.perf_counter() - t0


def system_options(value: Any = None, environ: Mapping[str, str] | None = None) -> SystemOptions:
    """Resolve ``tracker.init(system=value)`` and the environment into :class:`SystemOptions`."""
    env = os.environ if environ is None else environ
    if value is False:
        return SystemOptions(False, DEFAULT_INTERVAL_S)
    if value is None:
        flag = env.get(ENV_ON, "").strip().lower()
        if flag in _OFF:
            return SystemOptions(False, DEFAULT_INTERVAL_S)
        if flag not in _ON:
            raise ConfigError(
                f"{ENV_ON}={env.get(ENV_ON)!r} is not a switch; use 1 (sample, the default) or 0 (no sampler)"
            )
    if value is None or value is True:
        raw = env.get(ENV_INTERVAL)
        seconds = _interval(raw, ENV_INTERVAL) if raw not in (None, "") else DEFAULT_INTERVAL_S
        return SystemOptions(True, seconds)
    return SystemOptions(True, _interval(value, "system"))
