"""The balanced subset builder.

Problem: choose a set of images whose per-class instance counts ``s`` come as
close as possible to target counts ``T``, under a budget. Images are bundles: a
skateboard comes with the people riding it, so classes cannot be picked
independently. Everything works on the sparse image x class count matrix
``X`` (rows: images with annotations; stored as (image, class, count) triples).

Objective: the relative squared deficit ``F(s) = sum_c ((T_c - s_c) / T_c)^2``.
Adding image ``i`` changes it by exactly
``gain_i = sum_c x_ic * (2 * d_c - x_ic) / T_c^2`` with ``d_c = T_c - s_c``: a
class below target rewards the image, a class above target (``d_c < 0``, often
``person``) penalises it, and ``- x_ic`` makes ten people in one image cost more
than ten times one. All gains are one ``bincount`` over the triples.

Targets:

* ``per_class=N``: ``T_c = min(total_c, N)`` (``target="sqrt"`` scales it by
  ``sqrt(total_c / max total)``); images are added while some image still has a
  positive gain (and ``max_images`` allows).
* ``max_images=M`` alone: ``T`` is the target distribution ``q`` (``uniform``:
  ``q_c = 1``; ``sqrt``: ``q_c = sqrt(total_c)``) water-filled to the instance count
  the subset is heading for: ``T_c = min(total_c, lam * q_c)``, with ``lam`` chosen
  so ``sum T = S_now * M / n_now``. It is recomputed before every batch.

Steps:

1. Seeding, rarest class first: every class ``c`` gets its floor
   ``min(total_c, min_per_class, lam * q_c / 2)`` from its own images, best gain
   first (so the hair drier image with one person beats the one with fifteen).
   ``lam * q_c`` is the uncapped target level for the size the subset is heading
   for (at first: the budget times the mean instances per annotated image); the
   half keeps a tight budget from being spent on floors whatever the images cost.
   ``min_per_class`` defaults to 150 with ``max_images`` alone and to 0 with
   ``per_class`` (where a floor would force every class to its cap whatever
   the images cost).
2. Greedy: add the best ``b`` images by gain (``b`` is 1% of the images chosen so
   far, at least 8), recompute ``d`` and the gains, repeat until the budget or, in
   ``per_class`` mode, no positive gain is left. Gains within 1% of each other
   are ordered by seeded noise, so ``seed`` picks among near-equivalent subsets.
3. Swap / prune: with ``T`` fixed, each round drops the ``k`` selected images
   whose removal helps most and adds the ``k`` best outsiders; a round that does
   not lower ``F``, or takes a class below its seeding floor, is undone and ``k``
   halves. In ``per_class`` mode only improving drops and adds are made, so the
   subset can shrink where co-occurrence overshoots a cap.

Images without annotations are never chosen. The result is deterministic for a
given file, parameters and ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from tracker.coco.index import CocoIndex, Progress
from tracker.coco.stats import imbalance_ratio, normalized_entropy
from tracker.errors import ConfigError

Target = Literal["uniform", "sqrt"]
TARGETS: tuple[str, ...] = ("uniform", "sqrt")
DEFAULT_FLOOR = 150


@dataclass(frozen=True)
class BalanceResult:
    """Chosen images (indices into the index, ascending) with before/after counts."""

    images: np.ndarray
    before: np.ndarray
    after: np.ndarray
    target: np.ndarray
    objective: float

    @property
    def num_images(self) -> int:
        """Number of images chosen."""
        return int(len(self.images))

    def summary(self) -> dict[str, dict[str, float]]:
        """Ratio, entropy and largest share before and after (uses all declared classes)."""
        out: dict[str, dict[str, float]] = {}
        for key, counts in (("before", self.before), ("after", self.after)):
            total = max(1, int(counts.sum()))
            out[key] = {
                "instances": float(counts.sum()),
                "imbalance_ratio": imbalance_ratio(counts),
                "normalized_entropy": normalized_entropy(counts, len(counts)),
                "max_share": float(counts.max() / total) if len(counts) else 0.0,
            }
        return out


@dataclass
class _Problem:
    """The triples of X and the running state of a selection."""

    img: np.ndarray
    cat: np.ndarray
    cnt: np.ndarray
    n_images: int
    totals: np.ndarray
    q: np.ndarray
    selected: np.ndarray
    counts: np.ndarray
    has_ann: np.ndarray

    def gains(self, target: np.ndarray) -> np.ndarray:
        """Exact change of -F when each image is added (selected images: -inf)."""
        d = target - self.counts
        per = self.cnt * (2.0 * d[self.cat] - self.cnt) / (target[self.cat] ** 2)
        g = np.bincount(self.img, weights=per, minlength=self.n_images).astype(np.float64)  # int when empty
        g[self.selected] = -np.inf
        return g

    def removal_deltas(self, target: np.ndarray) -> np.ndarray:
        """Change of -F when each selected image is removed (others: -inf)."""
        d = target - self.counts
        per = -self.cnt * (2.0 * d[self.cat] + self.cnt) / (target[self.cat] ** 2)
        g = np.bincount(self.img, weights=per, minlength=self.n_images).astype(np.float64)
        g[~self.selected] = -np.inf
        return g

    def add(self, images: np.ndarray) -> None:
        """Select ``images``."""
        self.selected[images] = True
        self._update(images, +1)

    def remove(self, images: np.ndarray) -> None:
        """Unselect ``images``."""
        self.selected[images] = False
        self._update(images, -1)

    def _update(self, images: np.ndarray, sign: int) -> None:
        mask = np.zeros(self.n_images, dtype=bool)
        mask[images] = True
        rows = mask[self.img]
        self.counts += sign * np.bincount(self.cat[rows], weights=self.cnt[rows],
                                          minlength=len(self.counts))


def objective(counts: np.ndarray, target: np.ndarray) -> float:
    """``F = sum ((T - s) / T)^2`` over classes with a positive target."""
    ok = target > 0
    return float((((target[ok] - counts[ok]) / target[ok]) ** 2).sum())


def water_level(totals: np.ndarray, q: np.ndarray, budget: float) -> np.ndarray:
    """``lam * q`` with ``lam`` such that ``sum(min(totals, lam * q)) == budget``.

    Infinite (where ``q > 0``) when the budget covers every instance.
    """
    totals = totals.astype(np.float64)
    if budget >= totals.sum():
        return np.where(q > 0, np.inf, 0.0)
    ratio = np.where(q > 0, totals / np.where(q > 0, q, 1), np.inf)
    capped, rest_q = 0.0, float(q.sum())
    lam = budget / rest_q if rest_q else 0.0
    for c in np.argsort(ratio):
        lam = (budget - capped) / rest_q if rest_q > 0 else 0.0
        if ratio[c] >= lam:
            break
        capped += totals[c]
        rest_q -= q[c]
    return lam * q


def waterfill(totals: np.ndarray, q: np.ndarray, budget: float) -> np.ndarray:
    """``min(totals, lam * q)`` with ``lam`` such that the sum is ``budget`` (or all of totals)."""
    return np.minimum(totals.astype(np.float64), water_level(totals, q, budget))


def _problem(index: CocoIndex, target: Target) -> _Problem:
    img, cat, cnt = index.image_class_counts()
    totals = index.instances_per_class().astype(np.float64)
    q = np.sqrt(totals) if target == "sqrt" else (totals > 0).astype(np.float64)
    has_ann = np.bincount(img, minlength=index.num_images) > 0
    return _Problem(img, cat, cnt.astype(np.float64), index.num_images, totals, q,
                    np.zeros(index.num_images, dtype=bool), np.zeros(index.num_categories), has_ann)


def _check_args(per_class: int | None, max_images: int | None, target: str, min_per_class: int) -> None:
    if per_class is None and max_images is None:
        raise ConfigError("balance needs --per-class N or --max-images M (or both); got neither")
    if per_class is not None and per_class < 1:
        raise ConfigError(f"per_class {per_class!r} must be >= 1")
    if max_images is not None and max_images < 1:
        raise ConfigError(f"max_images {max_images!r} must be >= 1")
    if target not in TARGETS:
        raise ConfigError(f"Unknown target {target!r}; available: {', '.join(TARGETS)}")
    if min_per_class < 0:
        raise ConfigError(f"min_per_class {min_per_class!r} must be >= 0")


def balance(
    index: CocoIndex, per_class: int | None = None, max_images: int | None = None,
    target: Target = "uniform", seed: int = 0, min_per_class: int | None = None,
    progress: Progress | None = None,
) -> BalanceResult:
    """Choose a class-balanced subset of the images of ``index`` (see the module doc)."""
    if min_per_class is None:
        min_per_class = DEFAULT_FLOOR if per_class is None else 0
    _check_args(per_class, max_images, target, min_per_class)
    rng = np.random.default_rng(seed)
    p = _problem(index, target)
    budget = index.num_images if max_images is None else min(max_images, index.num_images)
    noise = rng.random(p.n_images) * 0.01

    def level() -> np.ndarray:
        if per_class is not None:
            scale = p.q / p.q.max() if target == "sqrt" and p.q.size and p.q.max() > 0 else (p.totals > 0)
            return per_class * scale
        n_now = int(p.selected.sum())
        per_image = p.counts.sum() / n_now if n_now else p.totals.sum() / max(1, int(p.has_ann.sum()))
        return water_level(p.totals, p.q, per_image * budget)

    def targets() -> np.ndarray:
        return np.minimum(p.totals, level())

    floor = np.minimum(np.minimum(p.totals, float(min_per_class)), np.floor(level() / 2))
    _seed(p, targets(), floor, budget, noise)
    _greedy(p, targets, budget, per_class is not None, noise, progress)
    final = targets()
    _swap(p, final, floor, per_class is not None, budget)
    if progress:
        progress("balanced", 1.0)
    return BalanceResult(np.flatnonzero(p.selected), p.totals.astype(np.int64),
                         p.counts.astype(np.int64), final, objective(p.counts, final))


def _jitter(gains: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Raise each gain by up to ``noise`` of its magnitude (seeded tie-breaking)."""
    with np.errstate(invalid="ignore"):
        out = gains + np.abs(gains) * noise
    out[~np.isfinite(gains)] = -np.inf
    return out


def _safe_target(t: np.ndarray) -> np.ndarray:
    return np.where(t > 0, t, 1e-9)


def _seed(p: _Problem, target: np.ndarray, floor: np.ndarray, budget: int, noise: np.ndarray) -> None:
    """Give every class its floor from its own images, rarest class first."""
    t = _safe_target(np.maximum(target, floor))
    for c in np.argsort(p.totals, kind="stable"):
        while p.counts[c] < floor[c] and p.selected.sum() < budget:
            rows = (p.cat == c) & ~p.selected[p.img]
            if not rows.any():
                break
            g = _jitter(p.gains(t), noise)
            cand = p.img[rows]
            need = floor[c] - p.counts[c]
            per_img = p.cnt[rows]
            order = np.argsort(-g[cand], kind="stable")
            take = np.searchsorted(np.cumsum(per_img[order]), need) + 1
            take = int(min(take, len(order), budget - p.selected.sum()))
            p.add(cand[order[:take]])


def _greedy(p: _Problem, targets: Callable[[], np.ndarray], budget: int, stop_at_zero: bool,
            noise: np.ndarray, progress: Progress | None) -> None:
    """Add the best images in growing batches until the budget (or no positive gain)."""
    while True:
        n_sel = int(p.selected.sum())
        left = budget - n_sel
        if left <= 0:
            return
        t = _safe_target(targets())
        g = _jitter(p.gains(t), noise)
        g[~p.has_ann] = -np.inf
        b = min(left, max(8, n_sel // 100))
        b = min(b, int(np.isfinite(g).sum()))
        if b <= 0:
            return
        best = np.argpartition(-g, b - 1)[:b]
        if stop_at_zero:
            best = best[g[best] > 0]
            if len(best) == 0:
                return
        p.add(best)
        if progress:
            progress("balancing", min(0.99, (n_sel + len(best)) / budget))


def _protected(p: _Problem, floor: np.ndarray) -> np.ndarray:
    """Selected images whose removal would take some class below its floor."""
    breaks = (p.counts[p.cat] - p.cnt < floor[p.cat]) & p.selected[p.img]
    return np.bincount(p.img, weights=breaks, minlength=p.n_images) > 0


def _swap(p: _Problem, target: np.ndarray, floor: np.ndarray, prune: bool, budget: int,
          rounds: int = 60) -> None:
    """Local search with ``target`` fixed: drop the worst ``k`` images, add the best ``k``.

    With ``prune`` only improving moves are made on each side (so the subset may
    shrink or grow); otherwise drops and adds are paired, keeping the size. A round
    that does not lower ``F`` or takes a class below its floor is undone and ``k``
    halves; the search ends when ``k`` reaches 0.
    """
    t = _safe_target(target)
    k = max(1, int(p.selected.sum()) // 100)
    for _ in range(rounds):
        if k == 0:
            return
        before = objective(p.counts, target)
        drop_gain = p.removal_deltas(t)
        drop_gain[_protected(p, floor)] = -np.inf
        outs = np.argsort(-drop_gain)[:k]
        outs = outs[np.isfinite(drop_gain[outs])]
        if prune:
            outs = outs[drop_gain[outs] > 0]
        p.remove(outs)
        add_gain = p.gains(t)
        add_gain[~p.has_ann] = -np.inf
        room = budget - int(p.selected.sum())
        ins = np.argsort(-add_gain)[:min(k, room) if prune else len(outs)]
        ins = ins[np.isfinite(add_gain[ins])]
        if prune:
            ins = ins[add_gain[ins] > 0]
        p.add(ins)
        if objective(p.counts, target) < before - 1e-12 and not (p.counts < floor).any():
            continue
        p.remove(ins)
        p.add(outs)
        k //= 2
