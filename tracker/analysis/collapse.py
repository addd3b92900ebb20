"""The collapse detector: representation collapse in the statistics ``run.log_embeddings`` logs.

Rules (those of :mod:`tracker.analysis.detectors`, plus):

* Scope ``scalar``, one stream per statistic key: ``<key>/std``, ``<key>/rankme`` and
  ``<key>/dead_dims`` of an embedding key ``<key>`` that ``log_embeddings``
  declared (``config["tracker_embeddings"]``, which also gives the dimension
  ``D``). The embeddings worker (:mod:`tracker.embeddings`) feeds these streams as
  it logs the statistics, and :func:`collapse_events` feeds them offline from the
  stored curves: the statistics are not losses, so the run's loss detectors never
  see them, and a stream built for any other key (the online analyzer builds one
  for every loss key) stays inert.
* Each event names the statistic that fell, its value against its healthy level
  and its own peak, and says what to do. One event per episode and statistic; an
  episode ends when the statistic is healthy again for ``patience`` points.
* Windows count logged points of the statistic (one per evaluation of the window).

Defaults (measured on real runs: SimSiam, SimCLR, VICReg and Barlow Twins on
scikit-learn's digits, ``bench/collapse.py``):

``std``
    collapsed when ``std * sqrt(D)`` (1 for embeddings spread evenly on the
    sphere, 0 for one point) is below ``std_ratio=0.3`` and below ``drop=0.5``
    of its own peak: SimSiam without its stop-gradient falls from ~0.8 to ~0.1,
    while healthy runs stay above 0.5.
``rankme``
    collapsed below ``rank_drop=0.3`` of its own peak (RankMe compares runs of one
    method, so the run is its own reference) and below ``rank_floor=0.05 * D``:
    embeddings on a line or in a few dimensions. Healthy VICReg and Barlow Twins
    runs end with RankMe at 10-15% of D (their embeddings share a large mean, which
    the uncentred spectrum counts), so RankMe alone is judged only near the bottom.
``dead_dims``
    collapsed when at least ``dead_share=0.9`` of the dimensions have a std below
    gamma and that share rose by ``dead_rise=0.5`` from its lowest: a share that
    was high from the start (embeddings at a small scale) is no finding.

All three need ``patience=3`` points in a row, after ``warmup=2`` points (the
first evaluations, at initialisation, set no peak).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tracker.analysis.detectors import Chunk, DetectorSpec, StreamContext, clean, fmt, run_lengths
from tracker.analysis.params import Param
from tracker.events import Event

CONFIG_KEY = "tracker_embeddings"  # the run config's record of log_embeddings keys (tracker.embeddings)
FEED_FLAG = "tracker_embeddings_feed"  # set in the config copy the embedding feeders build streams with
STATISTICS = ("rankme", "std", "dead_dims")

_COMMON = (
    "keep the stop-gradient on the target branch (SimSiam, BYOL) and the predictor head; use a larger batch "
    "or a higher temperature (SimCLR, DINO); or add variance and covariance terms (VICReg)"
)
HINTS = {
    "std": "the embeddings are converging to one point. What to do: " + _COMMON,
    "rankme": (
        "the embeddings span fewer and fewer dimensions (dimensional collapse). What to do: add covariance or "
        "decorrelation terms (VICReg's covariance, Barlow Twins), a larger batch or temperature, and check the "
        "stop-gradient and the predictor"
    ),
    "dead_dims": (
        "dimensions stopped varying. What to do: add VICReg's variance term (a hinge on each dimension's std), "
        "keep the stop-gradient and the predictor, or use a larger batch or temperature"
    ),
}


def embedding_key(key: str, config: dict[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
    """``(embedding key, statistic, its settings)`` when ``key`` is a declared statistic and fed, else None."""
    if not config.get(FEED_FLAG) or "/" not in key:
        return None
    prefix, stat = key.rsplit("/", 1)
    settings = (config.get(CONFIG_KEY) or {}).get(prefix)
    if stat not in STATISTICS or not isinstance(settings, dict) or not settings.get("dim"):
        return None
    return prefix, stat, settings


class Collapse:
    """One statistic of one embedding key: events when it falls to collapse levels."""

    def __init__(self, ctx: StreamContext) -> None:
        found = embedding_key(ctx.key, ctx.config)
        self.key = ctx.key
        self.active = found is not None
        self.prefix, self.stat, settings = found or ("", "", {"dim": 1})
        self.dim = int(settings["dim"])
        p = ctx.params
        self.patience, self.warmup = int(p["patience"]), int(p["warmup"])
        self.p = p
        self.count = 0
        self.peak = -math.inf
        self.low = math.inf
        self.run_bad = 0
        self.run_good = 0
        self.in_episode = False
        self.episodes = 0
        self.last: tuple[int, float] | None = None

    def _levels(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Collapsed mask, running peak and running low for the points ``v`` (after the warm-up)."""
        peak = np.maximum.accumulate(np.concatenate(([self.peak], v)))[1:]
        low = np.minimum.accumulate(np.concatenate(([self.low], v)))[1:]
        p = self.p
        if self.stat == "std":
            bad = (v * math.sqrt(self.dim) < p["std_ratio"]) & (v < p["drop"] * peak)
        elif self.stat == "rankme":
            bad = (v < p["rank_drop"] * peak) & (v < p["rank_floor"] * self.dim)
        else:
            bad = (v >= p["dead_share"]) & (v >= low + p["dead_rise"])
        return bad, peak, low

    def feed(self, chunk: Chunk) -> list[Event]:
        """Events for the collapse episodes that reach ``patience`` points in ``chunk``."""
        if not self.active or not chunk.fvalues.size:
            return []
        steps, values = chunk.fsteps, chunk.fvalues
        skip = max(0, min(values.size, self.warmup - self.count))
        self.count += values.size
        steps, values = steps[skip:], values[skip:]
        if not values.size:
            return []
        bad, peak, low = self._levels(values)
        bad_runs = run_lengths(bad, self.run_bad)
        good_runs = run_lengths(~bad, self.run_good)
        events: list[Event] = []
        i = 0
        while i < values.size:
            if not self.in_episode:
                hits = np.flatnonzero(bad_runs[i:] >= self.patience)
                if not hits.size:
                    break
                i += int(hits[0])
                self.in_episode = True
                self.episodes += 1
                events.append(self._event(int(steps[i]), float(values[i]), float(peak[i]), float(low[i])))
            else:
                ends = np.flatnonzero(good_runs[i:] >= self.patience)
                if not ends.size:
                    break
                i += int(ends[0])
                self.in_episode = False
            i += 1
        self.peak, self.low = float(peak[-1]), float(low[-1])
        self.run_bad, self.run_good = int(bad_runs[-1]), int(good_runs[-1])
        self.last = (int(steps[-1]), float(values[-1]))
        return events

    def _event(self, step: int, value: float, peak: float, low: float) -> Event:
        healthy = 1.0 / math.sqrt(self.dim)
        if self.stat == "std":
            what = (f"{self.key} fell to {fmt(value)} ({fmt(value / healthy)} x 1/sqrt(D) = {fmt(healthy)}; "
                    f"peak {fmt(peak)})")
        elif self.stat == "rankme":
            what = f"{self.key} fell to {fmt(value)} of D = {self.dim} dimensions (peak {fmt(peak)})"
        else:
            what = f"{self.key} rose to {fmt(100 * value)}% of the dimensions (lowest {fmt(100 * low)}%)"
        return Event(
            step=step, kind="collapse", key=self.key, severity="warning",
            message=f"representation collapse of {self.prefix!r}: {what}; {HINTS[self.stat]}",
            data=clean({"embedding": self.prefix, "statistic": self.stat, "value": value, "peak": peak,
                        "lowest": low, "dim": self.dim, "healthy_std": healthy}),
        )

    def summary(self) -> dict[str, Any]:
        """Counts for the report."""
        return {"collapse_episodes": self.episodes, "collapse_active": self.in_episode} if self.active else {}


COLLAPSE = DetectorSpec(
    name="collapse",
    scope="scalar",
    factory=Collapse,
    description="representation collapse in log_embeddings' statistics (std, RankMe, dead dimensions)",
    params=(
        Param("std_ratio", 0.3, "std collapsed below this x 1/sqrt(D)", 0.0, None),
        Param("drop", 0.5, "and below this fraction of its own peak", 0.0, 1.0),
        Param("rank_drop", 0.3, "RankMe collapsed below this fraction of its own peak", 0.0, 1.0),
        Param("rank_floor", 0.05, "and below this fraction of D", 0.0, 1.0),
        Param("dead_share", 0.9, "dead_dims collapsed at or above this share", 0.0, 1.0),
        Param("dead_rise", 0.5, "and at least this much above its lowest share", 0.0, 1.0),
        Param("patience", 3, "points in a row at collapse level (and back to end an episode)", 1, None, True),
        Param("warmup", 2, "points ignored at the start", 0, None, True),
    ),
)


def collapse_events(run_id: str, home: Any = None, overrides: dict[str, Any] | None = None) -> list[Event]:
    """The collapse events of a stored run, judged offline from its statistic curves.

    The same streams the embeddings worker feeds online, fed each key's visible
    points in one chunk: on the same rows, online and offline give the same events.
    ``overrides`` sets parameters (``{"std_ratio": 0.2}``). Events are sorted by step.
    """
    import json

    from tracker.analysis.params import resolve
    from tracker.host import get_host
    from tracker.store import open_store

    store = open_store(home)
    row = store.query("SELECT config FROM runs WHERE run_id = ?", [run_id])
    if row.height == 0:
        from tracker.errors import RunError

        raise RunError(f"Run {run_id!r} is unknown; `tracker runs list` shows the runs")
    raw = row["config"][0]
    config = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
    spec = get_host().items("detectors").get("collapse", COLLAPSE)
    section = config.get("analysis") if isinstance(config.get("analysis"), dict) else {}
    settings = {**(section.get("collapse") or {}), **(overrides or {})}
    params = resolve("collapse", spec.params, settings)
    events: list[Event] = []
    fed = {**config, FEED_FLAG: True}
    for prefix in sorted(config.get(CONFIG_KEY) or {}):
        for stat in STATISTICS:
            key = f"{prefix}/{stat}"
            df = store.query("SELECT step, value FROM curves WHERE run_id = ? AND key = ? AND rank = 0 "
                             "ORDER BY step", [run_id, key])
            if df.height and params is not None:
                stream = spec.factory(StreamContext(key=key, params=dict(params), config=fed))
                events.extend(stream.feed(Chunk(df["step"].to_numpy().astype(np.int64),
                                                df["value"].to_numpy().astype(np.float64))))
    return sorted(events, key=lambda e: (e.step, e.key or ""))
