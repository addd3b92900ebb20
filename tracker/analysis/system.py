"""System detectors: memory growth, fragmentation, step-time regression, data-loader stall.

They read the ``sys/*`` keys the system sampler logs (``plugins/system.py``; key
list there) and ``sys/data_time`` when the program or an integration logs it.

Rules (those of :mod:`tracker.analysis.detectors`, plus):

* Scope ``system``: one stream per run and rank sees every ``sys/*`` key of a
  batch at once (a :class:`SystemChunk`), because its findings join keys: reserved
  with live memory, memory with the device's size, data time with step time. The
  ``analysis.keys`` patterns do not apply to them.
* Windows count sampled points of a key (one per sampling interval, 2 s by default).
* Same events whatever the chunking: joins are as-of joins on steps of keys
  logged in the same ``run.log`` call (one flush holds a call whole), and the stall
  detector decides on a ``sys/data_time`` point only once a ``sys/step_time`` point
  at that step or later has arrived.
* Healthy runs get no event: each finding needs a margin, a duration and a shape.

Defaults (registered in :mod:`tracker.analysis.builtin`; set on the real trainings of
``bench/faults.py`` and held to the labelled corpus of :mod:`tracker.analysis.system_corpus`):

``memory_growth``
    a sequential rule in :mod:`tracker.analysis.system_memory`: windows of 12 to 768
    samples after a ``warmup`` of 10; growth that uses 5% of the memory left within a
    window, or 1.5% of the level over at least 24 samples, at two evaluations in a row.
    The projection is an error within the run's planned length. One event per key.
``fragmentation``
    reserved / peak live over the last ``window=30`` samples at least
    ``threshold=1.5`` for ``patience=150`` samples in a row (5 minutes), with at
    least ``min_bytes`` (64 MiB) reserved, after ``warmup=30``; a new episode only
    after the ratio fell below ``recover=0.8`` x threshold. Live memory is
    ``sys/pool/live`` for the Vulkan pool and ``sys/gpu{i}/allocated`` for CUDA;
    the peak over a window, because one sample may fall between two steps.
``step_time_regression``
    the median of the last ``window=31`` samples of ``sys/step_time`` at least
    ``factor=1.25`` x the median of the 31 before, and the first quartile of the
    new window above the third quartile of the old one (a shift, not noise); after
    ``warmup=30`` samples (compilation, cudnn autotuning). After an event the new
    level, from the change point on, is the reference. Speed-ups are not reported,
    nor a slowdown that other processes explain: the host's CPU (``sys/host/cpu``)
    at ``busy=90``% or more in the new window while this process' CPU time per step
    (step time x ``sys/proc/cpu``) rose less than ``busy_factor=2``. On the shared
    two-core machine of ``bench/faults.py`` a neighbour taking a core made healthy
    runs' step time 1.4-2x longer and their CPU time per step 1.25-1.55x; the real
    regressions there made the CPU time per step 3-5x.
``data_stall``
    the median over ``window=51`` points of ``sys/data_time`` / step time (the
    last ``sys/step_time`` before the point) at least ``share=0.4``, after
    ``warmup=30`` points (workers starting); the episode ends below
    ``recover=0.5`` x share.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from tracker.analysis.detectors import Chunk, StreamContext, clean, fmt, run_lengths
from tracker.analysis.system_memory import MEMORY_KEYS, AsOf, MemoryGrowth, planned_steps, size_text
from tracker.events import Event

__all__ = ["MEMORY_KEYS", "DataStall", "Fragmentation", "MemoryGrowth", "StepTimeRegression", "SystemChunk",
           "planned_steps"]

STEP_TIME = "sys/step_time"
DATA_TIME = "sys/data_time"
PROC_CPU = "sys/proc/cpu"
HOST_CPU = "sys/host/cpu"
LIVE_OF = {"pool": "live"}


@dataclass
class SystemChunk:
    """The next points of every ``sys/*`` key of one batch: key -> :class:`Chunk`."""

    series: dict[str, Chunk] = field(default_factory=dict)

    def get(self, key: str) -> Chunk | None:
        """The points of ``key``, or None."""
        return self.series.get(key)


# -- fragmentation -----------------------------------------------------------------
@dataclass
class _Frag:
    live_tail: np.ndarray = field(default_factory=lambda: np.empty(0))
    count: int = 0
    run: int = 0
    in_episode: bool = False


class Fragmentation:
    """Reserved memory well above the recent peak of live memory, for a long stretch."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.threshold, self.window = float(p["threshold"]), int(p["window"])
        self.patience, self.warmup = int(p["patience"]), int(p["warmup"])
        self.min_bytes, self.recover = float(p["min_bytes"]), float(p["recover"])
        self.pairs: dict[str, _Frag] = {}
        self.episodes = 0

    def feed(self, chunk: SystemChunk) -> list[Event]:
        """Events for episodes whose patience runs out in ``chunk``."""
        events = []
        for key, part in chunk.series.items():
            m = re.match(r"^sys/(gpu\d+|pool)/reserved$", key)
            if not m:
                continue
            head = m.group(1)
            live = chunk.get(f"sys/{head}/{LIVE_OF.get(head, 'allocated')}")
            if live is None or live.values.size != part.values.size:
                continue
            events.extend(self._feed_pair(head, key, part, live))
        return events

    def _feed_pair(self, head: str, key: str, reserved: Chunk, live: Chunk) -> list[Event]:
        st = self.pairs.setdefault(head, _Frag())
        lv = np.nan_to_num(live.values, nan=0.0)
        data = np.concatenate([st.live_tail, lv])
        pad = np.concatenate([np.zeros(max(self.window - 1 - st.live_tail.size, 0)), data])
        peak = np.lib.stride_tricks.sliding_window_view(pad, self.window).max(axis=1)[-lv.size:]
        ratio = reserved.values / np.maximum(peak, 1.0)
        index = st.count + np.arange(lv.size)
        st.count += lv.size
        st.live_tail = data[-(self.window - 1):] if self.window > 1 else np.empty(0)
        high = (ratio >= self.threshold) & (reserved.values >= self.min_bytes) & (index >= self.warmup)
        low = ratio < self.threshold * self.recover
        events = []
        i = 0
        while i < lv.size:
            if st.in_episode:
                ends = np.flatnonzero(low[i:])
                if not ends.size:
                    break
                st.in_episode, st.run, i = False, 0, i + int(ends[0])
                continue
            runs = run_lengths(high[i:], st.run)
            hit = np.flatnonzero(runs >= self.patience)
            if not hit.size:
                st.run = int(runs[-1]) if runs.size else st.run
                break
            j = i + int(hit[0])
            st.in_episode, st.run = True, 0
            self.episodes += 1
            events.append(self._event(head, key, int(reserved.steps[j]), float(reserved.values[j]),
                                      float(peak[j]), float(ratio[j])))
            i = j + 1
        return events

    def _event(self, head: str, key: str, step: int, reserved: float, live: float, ratio: float) -> Event:
        span = f"{self.patience} samples"
        hint = ("the pool caches blocks its requests no longer fit: variable-size tensors; call trim() "
                "between phases" if head == "pool" else
                "the caching allocator holds blocks that variable-size tensors cannot reuse: try "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or pad shapes to a few sizes")
        return Event(
            step=step, kind="fragmentation", key=key, severity="warning",
            message=(f"{key} is {ratio:.2f}x the peak live memory ({size_text(reserved)} reserved for "
                     f"{size_text(live)} live) for {span}; {hint}"),
            data=clean({"reserved": reserved, "peak_live": live, "ratio": ratio, "source": head}),
        )

    def summary(self) -> dict[str, Any]:
        """Counts for the report."""
        return {"fragmentation_episodes": self.episodes}


# -- step-time regression ----------------------------------------------------------
class StepTimeRegression:
    """A lasting rise of ``sys/step_time``: the median of a window against the one before it."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.window, self.warmup = int(p["window"]) | 1, int(p["warmup"])
        self.factor, self.busy, self.busy_factor = float(p["factor"]), float(p["busy"]), float(p["busy_factor"])
        self.tail_steps = np.empty(0, np.int64)
        self.tail = np.empty(0)
        self.own_tail = np.empty(0)  # log of the step's CPU time: step time x this process' CPU share
        self.host_tail = np.empty(0)
        self.cpu, self.host = AsOf(), AsOf()
        self.count = 0
        self.start = self.warmup  # first point of the reference window
        self.found = 0
        self.contended = 0

    def feed(self, chunk: SystemChunk) -> list[Event]:
        """Events for regressions established in ``chunk``."""
        part = chunk.get(STEP_TIME)
        if part is None:
            return []
        self.cpu.add(chunk.get(PROC_CPU))
        self.host.add(chunk.get(HOST_CPU))
        good = part.finite & (part.values > 0)
        steps, x = part.steps[good], np.log(part.values[good])
        w, keep = self.window, 2 * self.window - 1
        own, host = self._load(steps, x)
        data, dsteps = np.concatenate([self.tail, x]), np.concatenate([self.tail_steps, steps])
        own, host = np.concatenate([self.own_tail, own]), np.concatenate([self.host_tail, host])
        first = self.count - self.tail.size  # global index of data[0]
        self.count += x.size
        self.tail, self.tail_steps = data[-keep:], dsteps[-keep:]
        self.own_tail, self.host_tail = own[-keep:], host[-keep:]
        events: list[Event] = []
        if data.size < 2 * w:
            return events
        win = np.lib.stride_tricks.sliding_window_view(data, w)
        med = np.partition(win, w // 2, axis=1)[:, w // 2]
        lo_q = np.partition(win, w // 4, axis=1)[:, w // 4]
        hi_q = np.partition(win, w - 1 - w // 4, axis=1)[:, w - 1 - w // 4]
        ref, cur = slice(0, med.size - w), slice(w, med.size)
        ends = first + np.arange(w, med.size) + w - 1  # global index of the current window's last point
        jump = med[cur] - med[ref]
        cond = (jump >= math.log(self.factor)) & (lo_q[cur] > hi_q[ref])
        new = ends >= self.count - x.size
        for k in np.flatnonzero(cond & new):
            end = int(ends[k])
            if end - 2 * w + 1 < self.start:
                continue
            local = end - first
            if self._contended(own, host, local, w):
                self.contended += 1
                continue
            event, change = self._event(dsteps, data, local, w)
            self.start = first + change  # the new level is the reference from the change on
            self.found += 1
            events.append(event)
        return events

    def _load(self, steps: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per point: log of its CPU time per step and the host's CPU load (NaN where unknown)."""
        cpu = np.array([self.cpu.at(int(s)) if self.cpu.steps.size else None for s in steps], dtype=float)
        host = np.array([self.host.at(int(s)) if self.host.steps.size else None for s in steps], dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            own = x + np.log(np.where(cpu > 0, cpu, np.nan) / 100.0)
        return own, host

    def _contended(self, own: np.ndarray, host: np.ndarray, end: int, w: int) -> bool:
        """The host saturated and this process' CPU time per step up less than ``busy_factor``: other
        processes took the CPU (they also slow its own work a little: caches, memory bandwidth)."""
        ref, cur = own[end - 2 * w + 1 : end - w + 1], own[end - w + 1 : end + 1]
        busy = host[end - w + 1 : end + 1]
        ref, cur, busy = ref[np.isfinite(ref)], cur[np.isfinite(cur)], busy[np.isfinite(busy)]
        if min(ref.size, cur.size, busy.size) <= w // 2:  # the CPU figures are missing (or 0: not sampled yet)
            return False
        return bool(np.median(busy) >= self.busy and np.median(cur) - np.median(ref) < math.log(self.busy_factor))

    def _event(self, steps: np.ndarray, data: np.ndarray, end: int, w: int) -> tuple[Event, int]:
        seg = data[end - 2 * w + 1 : end + 1]
        cusum = np.cumsum(seg - seg.mean())
        change = end - 2 * w + 1 + int(np.argmin(cusum)) + 1
        before, after = float(np.exp(np.median(seg[:w]))), float(np.exp(np.median(seg[w:])))
        step, since = int(steps[end]), int(steps[min(change, end)])
        return Event(
            step=step, kind="step_time_regression", key=STEP_TIME, severity="warning",
            message=(f"step time rose {after / before:.2f}x, from {fmt(before)} s to {fmt(after)} s per step, "
                     f"around step {since:,}; look at what changed then (a code or data change, a slower "
                     "node, thermal throttling, a larger batch or image size)"),
            data=clean({"before_s": before, "after_s": after, "ratio": after / before, "change_step": since}),
        ), change

    def summary(self) -> dict[str, Any]:
        """Counts for the report."""
        return {"step_time_regressions": self.found, "step_time_contended": self.contended}


# -- data-loader stall ---------------------------------------------------------------
class DataStall:
    """``sys/data_time`` a large share of step time for a stretch: the data loader starves training."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.share, self.window = float(p["share"]), int(p["window"]) | 1
        self.warmup, self.recover = int(p["warmup"]), float(p["recover"])
        self.step_time = AsOf()
        self.pending_steps = np.empty(0, np.int64)
        self.pending = np.empty(0)
        self.tail = np.empty(0)
        self.count = 0
        self.in_episode = False
        self.episodes = 0

    def feed(self, chunk: SystemChunk) -> list[Event]:
        """Events for stalls decided in ``chunk``."""
        self.step_time.add(chunk.get(STEP_TIME))
        part = chunk.get(DATA_TIME)
        if part is not None and part.fvalues.size:
            self.pending_steps = np.concatenate([self.pending_steps, part.fsteps])
            self.pending = np.concatenate([self.pending, part.fvalues])
        if not self.pending.size or not self.step_time.steps.size:
            return []
        ready = int(np.searchsorted(self.pending_steps, self.step_time.steps[-1], side="right"))
        steps, data = self.pending_steps[:ready], self.pending[:ready]
        self.pending_steps, self.pending = self.pending_steps[ready:], self.pending[ready:]
        idx = np.searchsorted(self.step_time.steps, steps, side="left") - 1
        base = np.where(idx >= 0, self.step_time.values[np.maximum(idx, 0)], np.nan)
        share = np.where(base > 0, data / np.where(base > 0, base, 1.0), np.nan)
        share = np.nan_to_num(share, nan=0.0)
        return self._judge(steps, share)

    def _judge(self, steps: np.ndarray, share: np.ndarray) -> list[Event]:
        w = self.window
        data = np.concatenate([self.tail, share])
        index = self.count + np.arange(share.size)
        self.count += share.size
        pad = np.concatenate([np.zeros(max(w - 1 - self.tail.size, 0)), data])
        med = np.median(np.lib.stride_tricks.sliding_window_view(pad, w), axis=1)[-share.size:] if share.size else share
        self.tail = data[-(w - 1):] if w > 1 else np.empty(0)
        high = (med >= self.share) & (index >= self.warmup + w - 1)
        low = med < self.share * self.recover
        events, i = [], 0
        while i < share.size:
            if self.in_episode:
                ends = np.flatnonzero(low[i:])
                if not ends.size:
                    break
                self.in_episode, i = False, i + int(ends[0])
                continue
            hits = np.flatnonzero(high[i:])
            if not hits.size:
                break
            j = i + int(hits[0])
            self.in_episode = True
            self.episodes += 1
            events.append(Event(
                step=int(steps[j]), kind="data_stall", key=DATA_TIME, severity="warning",
                message=(f"waiting for data takes {med[j]:.0%} of the step time (median of the last {w} steps); "
                         "the data loader starves the accelerator: more workers, pinned memory, "
                         "persistent_workers=True, a cached or smaller dataset"),
                data=clean({"share": float(med[j]), "window": w}),
            ))
            i = j + 1
        return events

    def summary(self) -> dict[str, Any]:
        """Counts for the report."""
        return {"data_stall_episodes": self.episodes}

