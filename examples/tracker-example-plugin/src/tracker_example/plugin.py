"""The entry point ``example = "tracker_example.plugin"``: one ``@hookimpl`` per hook.

Each registration hook receives a ``register`` callback; the host validates what it
is given, refuses a name another plugin already has, and remembers that this
plugin (``example``) registered it. Hook arguments are passed by keyword: keep the
parameter names exactly as in ``tracker.hookspecs``, with no defaults.
"""

from __future__ import annotations

from typing import Any, Callable

from tracker import hookimpl
from tracker_example.extras import DETECTOR, PANEL, SAMPLER, JsonlLogger
from tracker_example.poly1 import POLY1, POLY1_NUMPY

Register = Callable[[Any], None]


@hookimpl
def tracker_register_losses(register: Register) -> None:
    """The ``poly1_bce`` term (its float64 reference and parameter schema)."""
    register(POLY1)


@hookimpl
def tracker_register_kernels(register: Register) -> None:
    """The numpy kernel of ``poly1_bce`` (called after every plugin registered its terms)."""
    register(POLY1_NUMPY)


@hookimpl
def tracker_register_samplers(register: Register) -> None:
    """The ``shuffled`` sampler."""
    register(SAMPLER)


@hookimpl
def tracker_register_loggers(register: Register) -> None:
    """The ``jsonl`` logger."""
    register(JsonlLogger())


@hookimpl
def tracker_register_detectors(register: Register) -> None:
    """The ``loss_ceiling`` detector."""
    register(DETECTOR)


@hookimpl
def tracker_register_panels(register: Register) -> None:
    """The ``example`` web UI page."""
    register(PANEL)


@hookimpl
def tracker_plugin_status() -> str | None:
    """Everything this plugin needs is numpy, so it always works."""
    return None
