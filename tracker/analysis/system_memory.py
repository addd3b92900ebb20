"""Memory growth: reserved or resident memory that keeps rising, judged as soon as the evidence is clear.

Keys: ``sys/gpu{i}/reserved`` (CUDA's caching allocator), ``sys/pool/reserved``
(the Vulkan pool) and ``sys/proc/rss`` (the process), one point per sampling
interval (:mod:`plugins.system`).

Rules:

* The rule is sequential: after ``warmup`` samples, windows of the last ``L``
  samples are judged for ``L`` on a ladder (``min_window``, twice that, ... up to
  ``window``), the window of length ``L`` every ``L // 8`` samples. Short windows
  settle fast growth within seconds of samples; long ones settle slow growth.
* A window shows growth when its ``segments`` medians rise at every cut, each cut
  by at least 0.75 / (segments - 1) of the whole rise (a step or two of the
  allocator, or one evaluation's buffers, is not growth), by at least ``min_bytes``.
* Growth is a finding when it is fast against the memory left or large against
  the level:

  - ``headroom``: the window's rise is at least this share of the memory that was
    left at its start (limit minus the first segment's median). At that rate the
    rest is gone within ``L / headroom`` samples: with the default 0.05 and
    windows from 12 samples, a leak that would exhaust memory in 10 minutes at
    2 s per sample is found within about 40 s of its start;
  - ``min_growth``: over a window of at least ``long_window`` samples, the rise is
    at least this fraction of the first segment's median (a slow leak far from
    the limit, or one with no known limit). Set on the real trainings of
    ``bench/faults.py``: their healthy runs' steadiest climbs after the warm-up
    reached 0.9% of the level (10 MB) over 24-96 samples; 1.5% and ``min_bytes``
    (16 MiB) stay clear of them.

  The same window length must find it at ``confirm`` evaluations in a row.
* The limit: ``sys/gpu{i}/total`` for a GPU, less what other processes hold when
  ``sys/gpu{i}/mem_used`` (NVML) is logged; ``sys/pool/limit`` for the pool; for
  the process, its RSS plus the host's available memory (``sys/host/mem_total -
  sys/host/mem_used``), else ``sys/host/mem_total``. Values are taken as of the
  window's last step: the sampler logs them in the same ``run.log`` call, so the
  events do not depend on how the points are chunked.
* The projection uses Sen's slope per step over the window; within the run's
  planned length (:func:`planned_steps`) the event is an error, otherwise a
  warning. ``sys/step_time``, when logged, turns steps into minutes for the
  message. One event per key.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from tracker.analysis.detectors import Chunk, StreamContext, clean
from tracker.analysis.params import Param
from tracker.analysis.trend import sens_slope
from tracker.events import Event

MEMORY_KEYS = re.compile(r"^sys/(?:(gpu\d+|pool)/reserved|proc/rss)$")
PLAN_KEYS = ("planned_steps", "max_steps", "total_steps")
PER_EPOCH_KEYS = ("steps_per_epoch", "batches_per_epoch")
STEP_TIME = "sys/step_time"
GiB = float(1 << 30)
STRIDES = 8  # a window of L samples is judged every L // STRIDES samples

_W = "samples of the key (one per sampling interval)"
MEMORY_GROWTH_PARAMS: tuple[Param, ...] = (
    Param("warmup", 10, f"{_W} ignored at the start (allocators and caches fill)", 0, None, True),
    Param("min_window", 12, f"shortest window judged, in {_W}", 4, None, True),
    Param("window", 768, f"longest window judged, in {_W}", 4, None, True),
    Param("segments", 4, "a window is cut into this many parts whose medians must all rise", 3, 20, True),
    Param("headroom", 0.05, "a rise of this share of the memory left at the window's start is a finding", 0.0, 1.0),
    Param("min_growth", 0.015, "or a rise of this fraction of the level over a long window", 0.0, None),
    Param("long_window", 24, f"{_W}: the shortest window judged by min_growth", 4, None, True),
    Param("min_bytes", float(16 << 20), "the least rise worth a finding", 0.0, None),
    Param("confirm", 2, "evaluations in a row of one window length that must find the growth", 1, None, True),
)


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def planned_steps(config: Mapping[str, Any]) -> int | None:
    """The run's planned length in steps from its config (``planned_steps``, ``max_steps``,
    ``total_steps``, or ``epochs`` x ``steps_per_epoch`` or ``batches_per_epoch``), or None."""
    for name in PLAN_KEYS:
        if _positive(config.get(name)):
            return int(config[name])
    epochs = config.get("epochs")
    per = next((config[k] for k in PER_EPOCH_KEYS if _positive(config.get(k))), None)
    if _positive(epochs) and per is not None:
        return int(epochs * per)
    return None


def size_text(nbytes: float) -> str:
    """Bytes as GiB (from 0.1 GiB) or MiB."""
    return f"{nbytes / GiB:.2f} GiB" if abs(nbytes) >= GiB / 10 else f"{nbytes / (1 << 20):.1f} MiB"


def append_tail(a: np.ndarray, b: np.ndarray, keep: int) -> np.ndarray:
    """``a`` then ``b``, only the last ``keep`` (0: all)."""
    out = np.concatenate([a, b]) if a.size else b.copy()
    return out[-keep:] if keep and out.size > keep else out


class AsOf:
    """Last value of a key at or before a step (the key's recent points)."""

    def __init__(self) -> None:
        self.steps = np.empty(0, np.int64)
        self.values = np.empty(0)

    def add(self, chunk: Chunk | None) -> None:
        """Remember the finite points of ``chunk``."""
        if chunk is not None and chunk.fvalues.size:
            self.steps = append_tail(self.steps, chunk.fsteps, 4096)
            self.values = append_tail(self.values, chunk.fvalues, 4096)

    def at(self, step: int, strict: bool = False) -> float | None:
        """The value at ``step`` (before it with ``strict``), or None."""
        i = int(np.searchsorted(self.steps, step, side="left" if strict else "right")) - 1
        return float(self.values[i]) if i >= 0 else None


@dataclass
class _Key:
    steps: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    values: np.ndarray = field(default_factory=lambda: np.empty(0))
    count: int = 0
    hits: dict[int, int] = field(default_factory=dict)
    reported: bool = False


@dataclass
class _Found:
    count: int
    length: int
    end: int  # index of the window's end (exclusive) in the key's data
    urgent: bool


class MemoryGrowth:
    """Reserved/RSS memory that keeps rising; projects when it reaches the limit (module doc)."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.warmup, self.window, self.segments = int(p["warmup"]), int(p["window"]), int(p["segments"])
        self.headroom, self.min_growth = float(p["headroom"]), float(p["min_growth"])
        self.long_window, self.min_bytes, self.confirm = int(p["long_window"]), float(p["min_bytes"]), int(p["confirm"])
        length, ladder = max(int(p["min_window"]), self.segments), []
        while length < self.window:
            ladder.append(length)
            length *= 2
        self.ladder = [*ladder, self.window]
        self.plan = planned_steps(ctx.config)
        self.keys: dict[str, _Key] = {}
        self.known: dict[str, AsOf] = {}
        self.found = 0

    def feed(self, chunk: Any) -> list[Event]:
        """Events for memory keys whose growth is established in ``chunk`` (a SystemChunk)."""
        for key, part in chunk.series.items():
            if key == STEP_TIME or key.endswith(("/total", "/mem_total", "/limit", "/mem_used")):
                self.known.setdefault(key, AsOf()).add(part)
        events = []
        for key, part in chunk.series.items():
            if MEMORY_KEYS.match(key) and part.fvalues.size:
                events.extend(self._feed_key(key, part))
        return events

    def limit(self, key: str, step: int, level: float) -> tuple[float | None, str]:
        """The memory ``key`` can reach at ``step`` (module doc), and where it comes from."""
        head = key.split("/")[1]
        if head == "proc":
            total = self._at("sys/host/mem_total", step)
            used = self._at("sys/host/mem_used", step)
            rss = self._at(key, step)
            if total is not None and used is not None:
                now = rss if rss is not None else level
                return now + max(total - used, 0.0), "sys/host/mem_total - sys/host/mem_used + sys/proc/rss"
            return total, "sys/host/mem_total"
        if head == "pool":
            return self._at("sys/pool/limit", step), "sys/pool/limit"
        total, used = self._at(f"sys/{head}/total", step), self._at(f"sys/{head}/mem_used", step)
        reserved = self._at(key, step) if used is not None else None
        if total is not None and used is not None and reserved is not None:
            return total - max(used - reserved, 0.0), f"sys/{head}/total less other processes"
        return total, f"sys/{head}/total"

    def _at(self, key: str, step: int) -> float | None:
        known = self.known.get(key)
        return known.at(step) if known is not None else None

    def _feed_key(self, key: str, part: Chunk) -> list[Event]:
        st = self.keys.setdefault(key, _Key())
        if key not in self.known:
            self.known[key] = AsOf()
        self.known[key].add(part)
        steps = np.concatenate([st.steps, part.fsteps])
        values = np.concatenate([st.values, part.fvalues])
        first = st.count - st.values.size  # global sample index of values[0]
        before, st.count = st.count, st.count + part.fvalues.size
        st.steps, st.values = steps[-self.window:], values[-self.window:]
        if st.reported:
            return []
        found = [f for f in (self._scan(key, st, steps, values, first, before, n) for n in self.ladder) if f]
        if not found:
            return []
        best = min(found, key=lambda f: (f.count, f.length))
        st.reported = True
        self.found += 1
        return [self._event(key, steps[best.end - best.length : best.end], values[best.end - best.length : best.end],
                            best.urgent)]

    def _scan(self, key: str, st: _Key, steps: np.ndarray, values: np.ndarray, first: int, before: int,
              length: int) -> _Found | None:
        """The first confirmed finding of windows of ``length`` samples ending in this chunk, or None."""
        stride = max(1, length // STRIDES)
        lo = max(before + 1, self.warmup + length)
        counts = np.arange(-(-lo // stride) * stride, st.count + 1, stride)
        if not counts.size:
            return None
        ends = counts - first
        seg = length // self.segments
        idx = ends[:, None] - seg * self.segments + np.arange(seg * self.segments)[None, :]
        meds = np.median(values[idx].reshape(counts.size, self.segments, seg), axis=2)
        rise = meds[:, -1] - meds[:, 0]
        cuts = np.diff(meds, axis=1)
        grows = (rise >= self.min_bytes) & np.all(cuts >= 0.75 * rise[:, None] / (self.segments - 1), axis=1)
        urgent = np.zeros(counts.size, bool)
        slow = grows & (length >= self.long_window) & (rise >= self.min_growth * np.maximum(meds[:, 0], 1.0))
        for k in np.flatnonzero(grows):
            limit, _ = self.limit(key, int(steps[ends[k] - 1]), float(meds[k, -1]))
            urgent[k] = limit is not None and limit > meds[k, 0] and rise[k] >= self.headroom * (limit - meds[k, 0])
        hits = st.hits.get(length, 0)
        for k, ok in enumerate((urgent | slow).tolist()):
            hits = hits + 1 if ok else 0
            if hits >= self.confirm:
                st.hits[length] = hits
                return _Found(int(counts[k]), length, int(ends[k]), bool(urgent[k]))
        st.hits[length] = hits
        return None

    def _event(self, key: str, steps: np.ndarray, values: np.ndarray, urgent: bool) -> Event:
        pick = np.linspace(0, values.size - 1, min(values.size, 120)).astype(int)
        slope = max(sens_slope(steps[pick], values[pick]), 0.0)
        step, now = int(steps[-1]), float(np.median(values[-max(values.size // self.segments, 1):]))
        limit, limit_key = self.limit(key, step, now)
        projected = step + int(math.ceil((limit - now) / slope)) if limit and limit > now and slope > 0 else None
        within = projected is not None and self.plan is not None and projected <= self.plan
        per_step = self._at(STEP_TIME, step)
        minutes = (projected - step) * per_step / 60.0 if projected is not None and per_step else None
        when = f" (in about {minutes:,.0f} minutes)" if minutes is not None else ""
        rate = (f"{key} grows by {size_text(slope * 1000)} per 1000 steps over the last {values.size} samples "
                f"({size_text(now)} now)")
        if projected is None:
            tail = "; no limit is known for it"
        elif within:
            tail = (f"; at this rate it reaches the limit ({size_text(limit or 0)}, {limit_key}) at about step "
                    f"{projected:,}{when}, before the run's planned end at step {self.plan:,}: expect an "
                    "out-of-memory error; look for tensors kept across steps (a loss history holding its graph, "
                    "outputs appended to a list, growing caches)")
        else:
            tail = f"; at this rate it reaches the limit ({size_text(limit or 0)}) at about step {projected:,}{when}"
        return Event(
            step=step, kind="memory_growth", key=key, severity="error" if within else "warning",
            message=rate + tail,
            data=clean({"slope_bytes_per_step": slope, "bytes": now, "limit": limit, "limit_key": limit_key,
                        "projected_step": projected, "planned_steps": self.plan, "oom_within_plan": within,
                        "minutes_to_limit": minutes, "window_samples": int(values.size),
                        "rule": "headroom" if urgent else "min_growth"}),
        )

    def summary(self) -> dict[str, Any]:
        """Counts for the report."""
        return {"memory_growth_keys": self.found}
