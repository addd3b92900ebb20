"""Built-in plugin: the loss-analysis detectors (non-finite, divergence, spike,
plateau, stagnant classes, rank disagreement).

The detectors themselves live in :mod:`tracker.analysis`; this plugin only hands
them to the host, so they can be disabled (``TRACKER_DISABLE_PLUGINS=detectors``)
or joined by third-party detectors like any other plugin's.
"""

from __future__ import annotations

from tracker import hookimpl
from tracker.analysis.builtin import BUILTIN
from tracker.hookspecs import Register


@hookimpl
def tracker_register_detectors(register: Register) -> None:
    """Register every built-in detector spec."""
    for spec in BUILTIN:
        register(spec)
