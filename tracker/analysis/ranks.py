"""Rank disagreement: ranks whose samplers drew different random numbers in an epoch.

Rules:

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
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping

import numpy as np

from tracker.analysis.detectors import StreamContext, clean
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
