"""Detector parameters: defaults, per-run configuration and per-call overrides.

Rules:

* A detector declares its parameters as :class:`Param` records (name, default,
  bounds, one line of documentation). Nothing else is accepted: an unknown name
  is a :class:`~tracker.errors.ConfigError` listing the known ones.
* Values are resolved in three layers, later wins: the defaults, the run's
  ``config["analysis"][<detector>]`` mapping, then the per-call overrides
  (``tracker.analyze(run, divergence={"factor": 2})`` or
  ``tracker analyze RUN --set divergence.factor=2``).
* ``config["analysis"][<detector>] = False`` (or an override of ``False``) turns a
  detector off; ``config["analysis"] = False`` or ``config["analysis"]["enabled"]
  = False`` turns the online analysis off (``tracker analyze`` still runs);
  ``config["analysis"]["keys"]`` lists the glob patterns of the keys analysed
  (default ``["*loss*"]``: a learning rate or an mAP is not a loss);
  ``config["analysis"]["trend"]`` tunes the verdict's trend test.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Any, Mapping

from tracker.errors import ConfigError

DEFAULT_KEYS: tuple[str, ...] = ("*loss*",)
SECTION = "analysis"


@dataclass(frozen=True)
class Param:
    """One tunable of a detector."""

    name: str
    default: float
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    integer: bool = False

    def check(self, detector: str, value: Any) -> float | int:
        """Return ``value`` as a number within bounds, else raise ConfigError."""
        where = f"{detector}.{self.name}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{where} = {value!r} is not a number; default {self.default!r}") from None
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{where} = {value!r} must be finite; default {self.default!r}")
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"{where} = {value!r} is below its minimum {self.minimum!r}; default {self.default!r}")
        if self.maximum is not None and value > self.maximum:
            raise ConfigError(f"{where} = {value!r} is above its maximum {self.maximum!r}; default {self.default!r}")
        if self.integer:
            if value != int(value):
                raise ConfigError(f"{where} = {value!r} must be a whole number; default {self.default!r}")
            return int(value)
        return value


def analysis_section(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The run's ``config["analysis"]`` mapping (empty when absent)."""
    section = (config or {}).get(SECTION)
    if section is None or section is False:
        return {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"config[{SECTION!r}] = {section!r} must be a mapping of detector name -> settings")
    return dict(section)


def merge_overrides(section: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """``section`` with ``overrides`` laid over it, one level deep per detector."""
    merged: dict[str, Any] = dict(section)
    for name, value in (overrides or {}).items():
        base = merged.get(name)
        if isinstance(value, Mapping) and isinstance(base, Mapping):
            merged[name] = {**base, **value}
        else:
            merged[name] = value
    return merged


def resolve(detector: str, params: tuple[Param, ...], settings: Any) -> dict[str, float | int] | None:
    """The parameter values of ``detector`` given its settings; None when it is turned off."""
    if settings is False:
        return None
    if settings in (None, True):
        settings = {}
    if not isinstance(settings, Mapping):
        raise ConfigError(
            f"settings of detector {detector!r} = {settings!r} must be a mapping of parameter -> value, or false"
        )
    known = {p.name: p for p in params}
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise ConfigError(
            f"Unknown parameter {unknown[0]!r} of detector {detector!r}; "
            f"available: {', '.join(sorted(known)) or 'none'}"
        )
    return {p.name: p.check(detector, settings.get(p.name, p.default)) for p in params}


def key_patterns(settings: Mapping[str, Any]) -> tuple[str, ...]:
    """The glob patterns of the analysed keys."""
    keys = settings.get("keys", DEFAULT_KEYS)
    if isinstance(keys, str):
        keys = (keys,)
    if not isinstance(keys, (list, tuple)) or not all(isinstance(k, str) for k in keys):
        raise ConfigError(f"analysis keys {keys!r} must be a list of glob patterns such as ['*loss*']")
    return tuple(keys)


def key_selected(key: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``key`` matches one of the glob ``patterns`` (case-insensitive)."""
    low = key.lower()
    return any(fnmatch.fnmatchcase(low, p.lower()) for p in patterns)


def parse_assignment(text: str) -> tuple[str, str, Any]:
    """Parse ``detector.param=value`` (the CLI's ``--set``) into its three parts."""
    name, sep, raw = text.partition("=")
    detector, dot, param = name.strip().partition(".")
    if not sep or not dot or not detector or not param:
        raise ConfigError(f"--set {text!r} must look like detector.param=value, e.g. divergence.factor=2")
    raw = raw.strip()
    value: Any
    if raw.lower() in ("false", "off"):
        value = False
    else:
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"--set {text!r}: value {raw!r} is not a number") from None
    return detector, param, value


def uses_float16(config: Mapping[str, Any] | None) -> bool:
    """Whether the run's config says it trains in float16 or with automatic mixed precision."""
    config = config or {}
    if config.get("amp") is True or config.get("fp16") is True or config.get("half") is True:
        return True
    for name in ("dtype", "precision", "amp_dtype", "mixed_precision", "compute_dtype"):
        value = str(config.get(name, "")).lower().replace("torch.", "")
        if value in ("float16", "fp16", "half", "16", "16-mixed", "amp", "f16"):
            return True
    return False
