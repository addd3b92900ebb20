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


# How frameworks spell "this run computes in float16": dtype strings (PyTorch, JAX),
# Lightning's precision ("16-mixed", "16-true", 16), accelerate's mixed_precision="fp16",
# a dtype given to an AMP switch (amp="float16").
FLOAT16_SPELLINGS = frozenset({"float16", "fp16", "half", "f16", "16", "16-mixed", "16-true", "16_mixed", "amp"})
BFLOAT16_SPELLINGS = frozenset({"bfloat16", "bf16", "bf16-mixed", "bf16-true", "bf16_mixed"})
DTYPE_KEYS = (
    "dtype", "precision", "amp", "amp_dtype", "autocast_dtype", "mixed_precision", "compute_dtype", "torch_dtype",
)
FLOAT16_FLAGS = ("fp16", "half", "use_amp", "use_fp16")  # Hugging Face fp16=True, Ultralytics half=True, ...
NON_CUDA_DEVICES = ("cpu", "mps")  # where PyTorch autocast (and Ultralytics' amp) does not use float16
_NESTED_DEPTH = 3


def _spelling(value: Any) -> str:
    text = str(value).strip().lower()
    return text.removeprefix("torch.").removeprefix("jnp.").removeprefix("np.")


def _amp_switch_means_float16(config: Mapping[str, Any]) -> bool:
    """``amp=True``: float16 on CUDA (Ultralytics and torch.autocast's default), unless a bfloat16
    autocast dtype or a CPU/MPS device says otherwise."""
    if config.get("amp") is not True:
        return False
    for key in ("amp_dtype", "autocast_dtype"):
        if key in config and _spelling(config[key]) in BFLOAT16_SPELLINGS:
            return False
    device = config.get("device")
    if isinstance(device, str) and _spelling(device).split(":")[0] in NON_CUDA_DEVICES:
        return False
    return True


def _mapping_uses_float16(config: Mapping[str, Any], depth: int) -> bool:
    if _amp_switch_means_float16(config) or any(config.get(flag) is True for flag in FLOAT16_FLAGS):
        return True
    for key in DTYPE_KEYS:
        value = config.get(key)
        if value is not None and not isinstance(value, (bool, Mapping)) and _spelling(value) in FLOAT16_SPELLINGS:
            return True
    if depth >= _NESTED_DEPTH:
        return False
    return any(
        isinstance(value, Mapping) and _mapping_uses_float16(value, depth + 1)
        for key, value in config.items()
        if key != "analysis"
    )


def uses_float16(config: Mapping[str, Any] | None) -> bool:
    """Whether the run's config says it trains in float16 (mixed precision included).

    Recognised, at the top level or in a nested section (``{"trainer": {...}}``):
    ``amp``/``dtype``/``precision``/``amp_dtype``/``autocast_dtype``/``mixed_precision``/
    ``compute_dtype``/``torch_dtype`` spelled ``float16``, ``torch.float16``, ``fp16``,
    ``half``, ``16``, ``16-mixed`` or ``16-true`` (Lightning), ``mixed_precision="fp16"``
    (accelerate); the flags ``fp16=True`` (Hugging Face), ``half=True``, ``use_amp=True``;
    and ``amp=True`` (Ultralytics, torch.autocast on CUDA) unless ``device`` is ``cpu`` or
    ``mps`` or the autocast dtype is bfloat16.
    """
    return bool(config) and _mapping_uses_float16(config, 0)  # type: ignore[arg-type]
