"""Cross-rank detectors: rank disagreement (fingerprints) and identical batches (per-rank losses).

Rank disagreement, rules:

* Convention: at the step each epoch starts, every rank logs
  ``{"rng/fingerprint": float(fp), "rng/epoch": float(epoch)}``; ranks seeded
  alike log equal fingerprints.
* Per epoch, the ranks are grouped by fingerprint. More than one group is a
  disagreement; the largest group (ties: the one holding the lowest rank) is taken
  as the reference and the others are named. A rank that logged nothing for an
  epoch is not judged for it.
* One event per distinct grouping, at the first epoch it appears; its data lists
  every epoch with that grouping. This runs over all ranks of a run, so offline
  (``tracker analyze``) only: a rank's own flusher never sees the other ranks.

Identical batches (:class:`IdenticalBatches`), rules:

* Under DDP the model is synchronised, so ranks fed the same batch compute the
  same loss at every step, bit for bit, while ranks fed different data almost
  never agree exactly. The detector reads every analysed loss key (``*loss*``)
  that at least two ranks of the run logged, at the steps every such rank logged.
* Ranks agree at a step when their values are within ``rtol`` of each other
  (relative; exact zeros on every rank say nothing and are skipped). Two ranks
  that agree at ``patience`` such steps in a row are flagged; one event per key
  names the groups of ranks that agree, at the step the first pair reached
  ``patience``, with its onset.
* The key must be each rank's own loss, taken before any all-reduce: a loss
  averaged across ranks before logging is identical by construction. So a key is
  judged only with evidence that it is per-rank: its ranks differed at some step of
  this run (a sampler that broke mid-run), or in another run of the same project,
  or the setting ``identical_batches.per_rank=1`` says so. How integrations log:
  a plain loop logs what each rank passes to ``run.log`` (``loss.item()`` on each
  rank is its own loss); the Ultralytics integration and Lightning's loggers log
  from rank 0 only, where there is nothing to compare (one rank never fires).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping

import numpy as np

from tracker.analysis.detectors import StreamContext, clean, fmt, run_lengths
from tracker.events import Event

FINGERPRINT_KEY = "rng/fingerprint"
EPOCH_KEY = "rng/epoch"

RankSeries = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Per rank: steps, fingerprints and epochs, aligned (one entry per epoch start)."""


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def _groups(by_rank: dict[int, float]) -> list[list[int]]:
    groups: dict[float, list[int]] = defaultdict(list)
    for rank, fp in sorted(by_rank.items()):
        groups[fp].append(rank)
    return sorted(groups.values(), key=lambda g: (-len(g), min(g)))


class RankDisagreement:
    """Cross-rank detector: ``detect`` takes every rank's fingerprint series."""

    def __init__(self, ctx: StreamContext) -> None:
        self.key = ctx.key or FINGERPRINT_KEY

    def detect(self, series: Mapping[int, RankSeries]) -> list[Event]:
        """Events for the epochs on which ranks disagree."""
        epochs: dict[int, dict[int, tuple[int, float]]] = defaultdict(dict)
        for rank, (steps, fps, eps) in series.items():
            for step, fp, ep in zip(np.asarray(steps).tolist(), np.asarray(fps).tolist(), np.asarray(eps).tolist()):
                if ep == ep and fp == fp:
                    epochs[int(ep)][int(rank)] = (int(step), float(fp))
        first: dict[tuple[tuple[int, ...], ...], dict[str, Any]] = {}
        for epoch in sorted(epochs):
            by_rank = epochs[epoch]
            groups = _groups({r: v[1] for r, v in by_rank.items()})
            if len(groups) < 2:
                continue
            signature = tuple(tuple(g) for g in groups)
            if signature in first:
                first[signature]["epochs"].append(epoch)
                continue
            first[signature] = {
                "epoch": epoch,
                "step": min(v[0] for v in by_rank.values()),
                "groups": groups,
                "fingerprints": [by_rank[g[0]][1] for g in groups],
                "epochs": [epoch],
            }
        return [self._event(found) for found in first.values()]

    def _event(self, found: dict[str, Any]) -> Event:
        groups: list[list[int]] = found["groups"]
        odd = sorted(r for g in groups[1:] for r in g)
        message = (
            f"ranks {_ranks(odd)} drew a different RNG fingerprint from ranks {_ranks(groups[0])} at epoch "
            f"{found['epoch']} (step {found['step']}): their samplers or augmentations are not seeded alike; "
            "give every rank the same base seed and derive per-rank streams from it"
        )
        return Event(
            step=int(found["step"]),
            kind="rank_disagreement",
            key=self.key,
            severity="error",
            message=message,
            data=clean(
                {
                    "epoch": found["epoch"],
                    "ranks": odd,
                    "reference_ranks": groups[0],
                    "groups": groups,
                    "fingerprints": [repr(f) for f in found["fingerprints"]],
                    "epochs": found["epochs"],
                }
            ),
        )


IDENTICAL_ADVICE = (
    "give each rank its own shard: a DistributedSampler (it reads the rank and world size) with shuffle=True "
    "and sampler.set_epoch(epoch) every epoch, or seed each rank's data order with seed + rank"
)


def _aligned(by_rank: Mapping[int, tuple[np.ndarray, np.ndarray]]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Ranks, the steps all of them logged, and values[rank row, step] there (last value of a repeated step)."""
    ranks = sorted(by_rank)
    common: np.ndarray | None = None
    for r in ranks:
        s = np.asarray(by_rank[r][0], dtype=np.int64)
        common = s if common is None else np.intersect1d(common, s)
    steps = np.unique(common) if common is not None else np.zeros(0, np.int64)
    grid = np.empty((len(ranks), steps.size))
    for i, r in enumerate(ranks):
        s, v = np.asarray(by_rank[r][0], dtype=np.int64), np.asarray(by_rank[r][1], dtype=np.float64)
        idx = np.searchsorted(s, steps, side="right") - 1
        grid[i] = v[idx]
    return ranks, steps, grid


def _informative(grid: np.ndarray) -> np.ndarray:
    """Steps where every rank's value is finite and some rank's is not 0."""
    return np.isfinite(grid).all(axis=0) & (np.abs(grid) > 0).any(axis=0)


def _components(pairs: list[tuple[int, int]]) -> list[list[int]]:
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for a, b in pairs:
        parent[root(a)] = root(b)
    groups: dict[int, list[int]] = defaultdict(list)
    for x in list(parent):
        groups[root(x)].append(x)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])


class IdenticalBatches:
    """Cross-rank detector: ranks whose per-rank losses are identical step after step (module doc)."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.rtol = float(p["rtol"])
        self.patience = int(p["patience"])
        self.per_rank = bool(p["per_rank"])

    def read(self, store: Any, run_id: str, probe: Any) -> dict[str, Any]:
        """This run's analysed loss keys logged by 2+ ranks, per rank, and which of them are known per-rank."""
        counts = store.query(
            "SELECT key, count(DISTINCT rank) AS n FROM curves WHERE run_id = ? GROUP BY key", [run_id]
        )
        keys = sorted(k for k, n in zip(counts["key"].to_list(), counts["n"].to_list())
                      if n >= 2 and "loss" in k.lower() and probe.selected(k))
        if not keys:
            return {"series": {}, "evidence": {}}
        df = store.query(
            "SELECT key, rank, step, value FROM curves WHERE run_id = ? AND list_contains(?, key) "
            "ORDER BY key, rank, step", [run_id, keys],
        )
        series: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = defaultdict(dict)
        for (key, rank), part in df.group_by(["key", "rank"], maintain_order=True):
            series[str(key)][int(rank)] = (part["step"].to_numpy(), part["value"].to_numpy().astype(np.float64))
        evidence = {k: "the per_rank setting" for k in keys} if self.per_rank else {}
        pending = [k for k in keys if k not in evidence and self._differ(series[k])]
        evidence.update({k: "its ranks differ at other steps of this run" for k in pending})
        rest = [k for k in keys if k not in evidence]
        if rest:
            evidence.update(self._other_runs(store, run_id, rest))
        return {"series": dict(series), "evidence": evidence}

    def _differ(self, by_rank: Mapping[int, tuple[np.ndarray, np.ndarray]]) -> bool:
        """Whether some rank's value differs from rank 0's at an informative common step."""
        _, steps, grid = _aligned(by_rank)
        grid = grid[:, _informative(grid)]
        top = np.max(np.abs(grid), axis=0)
        return bool(np.any(np.abs(grid - grid[0]) > self.rtol * top))

    def _other_runs(self, store: Any, run_id: str, keys: list[str]) -> dict[str, str]:
        """Keys whose ranks differ at a common step in another run of this run's project."""
        df = store.query(
            "SELECT a.key, min(a.run_id) AS other FROM curves a JOIN curves b ON a.run_id = b.run_id "
            "AND a.key = b.key AND a.step = b.step AND a.rank < b.rank "
            "WHERE a.run_id IN (SELECT run_id FROM runs WHERE project = (SELECT project FROM runs WHERE run_id = ?) "
            "AND run_id <> ?) AND list_contains(?, a.key) AND isfinite(a.value) AND isfinite(b.value) "
            "AND abs(a.value - b.value) > ? * greatest(abs(a.value), abs(b.value)) GROUP BY a.key",
            [run_id, run_id, keys, self.rtol],
        )
        return {str(k): f"its ranks differ in run {o} of this project" for k, o in
                zip(df["key"].to_list(), df["other"].to_list())}

    def detect(self, found: Mapping[str, Any]) -> list[Event]:
        """One event per per-rank loss key whose ranks agree ``patience`` steps in a row."""
        events = []
        for key, by_rank in sorted(found.get("series", {}).items()):
            why = found.get("evidence", {}).get(key)
            if why is None or len(by_rank) < 2:
                continue
            event = self._key(key, by_rank, why)
            if event is not None:
                events.append(event)
        return events

    def _key(self, key: str, by_rank: Mapping[int, tuple[np.ndarray, np.ndarray]], why: str) -> Event | None:
        ranks, steps, grid = _aligned(by_rank)
        if steps.size < self.patience:
            return None
        keep = _informative(grid)
        steps, grid = steps[keep], grid[:, keep]
        first: tuple[int, int] | None = None
        pairs: list[tuple[int, int]] = []
        top = np.max(np.abs(grid), axis=0)
        for i in range(len(ranks)):
            for j in range(i + 1, len(ranks)):
                same = np.abs(grid[i] - grid[j]) <= self.rtol * top
                hits = np.flatnonzero(run_lengths(same, 0) >= self.patience)
                if hits.size:
                    pairs.append((ranks[i], ranks[j]))
                    at = int(hits[0])
                    if first is None or at < first[0]:
                        first = (at, at - self.patience + 1)
        if first is None:
            return None
        at, start = first
        groups = _components(pairs)
        step, onset = int(steps[at]), int(steps[start])
        shown = "; ".join(", ".join(str(r) for r in g) for g in groups)
        message = (
            f"ranks {shown} logged the same {key} at {self.patience} steps in a row from step {onset} "
            f"(within {self.rtol:g}, e.g. {fmt(float(grid[0, at]))} at step {step}): they train on the same "
            f"batches; {IDENTICAL_ADVICE}"
        )
        return Event(
            step=step, kind="identical_batches", key=key, severity="error", message=message,
            data=clean({"groups": groups, "onset": onset, "patience": self.patience, "rtol": self.rtol,
                        "evidence": why, "advice": IDENTICAL_ADVICE, "confidence": 1.0}),
        )
