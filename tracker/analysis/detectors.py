"""Detectors: streaming state machines that turn a key's logged values into events.

Rules:

* A detector is registered as a :class:`DetectorSpec` (name, scope, parameters,
  factory). Its factory builds one *stream* per analysed key; the stream's
  ``feed(chunk)`` takes the next :class:`Chunk` of ``(steps, values)`` of that key,
  in step order, and returns the events it can decide on.
* Identical results whatever the chunking: streams keep all state between
  chunks, all windows count logged points of the key (not steps), all smoothing
  and scales come from :mod:`tracker.analysis.smoothing` (bit-identical across
  chunkings), and a decision that needs a later point (is this spike isolated?)
  waits for that point. Feeding a curve in one chunk or point by point gives the
  same events, which is what makes online (flusher) and offline
  (``tracker analyze``) analysis agree.
* Work per chunk is vectorised with numpy; Python loops run only per event or
  per state change (divergence, recovery, plateau improvement), never per point.
* Non-finite values are seen only by the non-finite detector; the others skip
  them, as TensorBoard's smoothing does.
* Event ``data`` holds only JSON-ready values (non-finite floats become strings).

This module holds the shared types and helpers and the non-finite detector;
:mod:`tracker.analysis.trends` holds divergence and plateau (both judge the smoothed
best), :mod:`tracker.analysis.spikes` the spike detector,
:mod:`tracker.analysis.classes` and :mod:`tracker.analysis.ranks` the per-class and
cross-rank ones; their default parameters, and why, are in
:mod:`tracker.analysis.builtin`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

import numpy as np

from tracker.analysis.advice import precision_hint
from tracker.analysis.params import Param, uses_float16
from tracker.errors import PluginError
from tracker.events import Event

SCOPES = ("scalar", "classes", "ranks", "system", "epochs", "twins")
TINY = 1e-12


@dataclass
class StreamContext:
    """What a stream is built with: its key, resolved parameters and the run's config."""

    key: str
    params: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    class_names: dict[int, str] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)  # run.json's record of the machine (gpus, ...)


@dataclass(frozen=True)
class DetectorSpec:
    """A registered detector: ``factory(context)`` builds a stream for one key."""

    name: str
    scope: str
    factory: Callable[[StreamContext], Any]
    params: tuple[Param, ...] = ()
    description: str = ""
    kinds: tuple[str, ...] = ()  # the event kinds it raises, where they are not its name

    def raises(self) -> tuple[str, ...]:
        """The event kinds this detector raises (``kinds``, else its name)."""
        return self.kinds or (self.name,)

    def validate(self) -> None:
        """Refuse a spec the analyzer could not run (called by the host on register)."""
        if self.scope not in SCOPES:
            raise PluginError(f"detector {self.name!r}: scope {self.scope!r} is not one of {', '.join(SCOPES)}")
        if not callable(self.factory):
            raise PluginError(f"detector {self.name!r}: factory {self.factory!r} is not callable")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise PluginError(f"detector {self.name!r}: parameter names {names!r} repeat")

    def defaults(self) -> dict[str, Any]:
        """Parameter name -> default value."""
        return {p.name: p.default for p in self.params}


@dataclass
class Chunk:
    """The next points of one key: steps (int64) and values (float64), in step order."""

    steps: np.ndarray
    values: np.ndarray

    @cached_property
    def finite(self) -> np.ndarray:
        """Mask of the finite values."""
        return np.isfinite(self.values)

    @cached_property
    def fsteps(self) -> np.ndarray:
        """Steps of the finite values."""
        return self.steps if self.all_finite else self.steps[self.finite]

    @cached_property
    def fvalues(self) -> np.ndarray:
        """The finite values."""
        return self.values if self.all_finite else self.values[self.finite]

    @cached_property
    def all_finite(self) -> bool:
        """Whether no value is NaN or inf."""
        return bool(self.finite.all())


@dataclass
class KeyedChunk:
    """A scalar key's next points with the key's name: what a ``twins``-scope stream's ``feed`` takes."""

    key: str
    chunk: Chunk


def clean(value: Any) -> Any:
    """A JSON-ready copy of ``value``: numpy scalars to Python, non-finite floats to strings."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [clean(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else repr(value)
    return value


def fmt(value: float) -> str:
    """A number for a message: four significant digits."""
    return f"{value:.4g}"


def run_lengths(cond: np.ndarray, carry: int) -> np.ndarray:
    """Length of the run of True ending at each position; ``carry`` continues a run from before."""
    idx = np.arange(cond.size)
    last_false = np.maximum.accumulate(np.where(cond, -1 - carry, idx))
    return idx - last_false


@dataclass
class RateLimit:
    """Keeps events of one kind at least ``cooldown`` points apart and at most ``budget`` in all.

    ``pick`` takes the candidates of a chunk (sorted global point indices) and
    returns the positions kept and, for each, how many candidates were passed over
    since the previous kept one (earlier chunks included).
    """

    cooldown: int
    budget: int
    last: float = -math.inf
    kept: int = 0
    passed: int = 0

    def pick(self, candidates: np.ndarray) -> tuple[list[int], list[int]]:
        """Positions in ``candidates`` to report, and the candidates passed over before each."""
        picked: list[int] = []
        skipped: list[int] = []
        prev = 0
        while self.kept < self.budget:
            pos = int(np.searchsorted(candidates, self.last + self.cooldown, side="left"))
            pos = max(pos, prev)
            if pos >= candidates.size:
                break
            picked.append(pos)
            skipped.append(self.passed + pos - prev)
            self.passed = 0
            self.kept += 1
            self.last, prev = float(candidates[pos]), pos + 1
        self.passed += candidates.size - prev
        return picked, skipped


class NonFinite:
    """NaN or inf in a value: one event per episode of non-finite values, rate limited."""

    def __init__(self, ctx: StreamContext) -> None:
        self.key = ctx.key
        self.cooldown = int(ctx.params["cooldown"])
        self.float16 = uses_float16(ctx.config)
        self.hint = precision_hint(ctx.config, ctx.environment)
        self.count = 0
        self.in_episode = False
        self.episode_step: int | None = None
        self.limit = RateLimit(self.cooldown, budget=2**62)
        self.episodes = 0
        self.last_finite: tuple[int, float] | None = None

    def feed(self, chunk: Chunk) -> list[Event]:
        """Events for the episodes that start in ``chunk``."""
        n = chunk.values.size
        base = self.count
        self.count += n
        if chunk.all_finite:
            self.in_episode = False
            if n:
                self.last_finite = (int(chunk.steps[-1]), float(chunk.values[-1]))
            return []
        bad = ~chunk.finite
        before = np.concatenate(([self.in_episode], bad[:-1]))
        starts = np.flatnonzero(bad & ~before)
        self.episodes += starts.size
        picked, skipped = self.limit.pick(starts + base)
        events = [self._event(chunk, int(starts[k]), skip) for k, skip in zip(picked, skipped)]
        if starts.size:
            self.episode_step = int(chunk.steps[starts[-1]])
        self.in_episode = bool(bad[-1])
        good = np.flatnonzero(chunk.finite)
        if good.size:
            self.last_finite = (int(chunk.steps[good[-1]]), float(chunk.values[good[-1]]))
        return events

    def _event(self, chunk: Chunk, i: int, skipped: int) -> Event:
        value = float(chunk.values[i])
        step = int(chunk.steps[i])
        finite_before = chunk.finite[:i]
        last = None
        if finite_before.any():
            j = int(np.flatnonzero(finite_before)[-1])
            last = (int(chunk.steps[j]), float(chunk.values[j]))
        elif self.last_finite is not None:
            last = self.last_finite
        what = "NaN" if math.isnan(value) else ("+inf" if value > 0 else "-inf")
        hint = self.hint
        after = f" (last finite {fmt(last[1])} at step {last[0]})" if last else ""
        return Event(
            step=step,
            kind="non_finite",
            key=self.key,
            severity="error",
            message=f"{self.key} is {what} at step {step}{after}; {hint}",
            data=clean(
                {
                    "value": what,
                    "last_finite_step": last[0] if last else None,
                    "last_finite_value": last[1] if last else None,
                    "float16": self.float16,
                    "episodes_skipped": skipped,
                    "advice": hint,
                }
            ),
        )

    def summary(self) -> dict[str, Any]:
        """Counts for the report."""
        return {
            "non_finite_episodes": self.episodes,
            "non_finite_active": self.in_episode,
            "non_finite_since": self.episode_step if self.in_episode else None,
        }
