"""Concrete changes for a run whose rare classes do not learn, each with its evidence.

From :func:`tracker.rare_classes.collect` (counts, cumulative gradient ratios,
assignment, AP), :func:`advise` proposes:

* **class weights** (``weights``): the positive-gradient mass of a class grows with its
  count as ``n^p``; ``p`` is the least-squares slope of ``log(cum grad/pos)`` on
  ``log(n)`` over the classes that occur, clipped to ``[0, 1]``. Weights ``(1/n)^p``
  (``scheme="power", power=p``) give every class the same positive-gradient mass. The
  effective-number ``beta`` whose weights are closest (in log) to those is given as an
  alternative;
* **positive weights** (``pos_weight``): EQL v2 raises a class's positive gradients
  when its cumulative pos/neg ratio is low; a class whose final ratio is below the
  frequent group's median gets ``pos_weight = median / ratio`` (clipped to ``[1, 10]``),
  which brings its ratio to that median (the positive gradient scales with it);
* **repeat-factor sampling** (``repeat``): threshold ``t`` = the image frequency of the
  rarest frequent class (``count / images``, an upper bound on the share of images that
  hold the class, so the repeat factors ``max(1, sqrt(t / f))`` are lower bounds); the
  effect is each group's share of the sampled instances before and after;
* **boxes without a positive** (``assignment``): the classes whose GT boxes got no
  positive anchor in more than 10% of cases, with a larger ``imgsz`` (twice, to a
  multiple of 32) or a stride-4 (P2) head.

Each advice carries the evidence (numbers and the steps they come from) and the
``track(...)``/``model.train(...)`` line to restart with.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tracker.rare_classes import RareClasses
from tracker.weights import class_weights

NO_POS_SHARE = 0.10
MAX_POS_WEIGHT = 10.0
BETAS = (0.9, 0.99, 0.995, 0.999, 0.9995, 0.9999)


@dataclass
class Advice:
    """One change: what, why (evidence with numbers and steps), and its parameters."""

    kind: str
    change: str
    evidence: list[str]
    params: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def _steps(span: tuple[int, int] | None) -> str:
    return "no steps" if span is None else f"steps {span[0]}-{span[1]}"


def _names(rc: RareClasses, idx: Any, limit: int = 8) -> str:
    idx = [int(i) for i in idx]
    shown = ", ".join(rc.names[i] if i < len(rc.names) else str(i) for i in idx[:limit])
    return shown + (f" and {len(idx) - limit} more" if len(idx) > limit else "")


def fit_power(counts: np.ndarray, cum_pos: np.ndarray) -> tuple[float, float, int] | None:
    """Slope ``p`` (clipped to [0, 1]), R² and n of ``log(cum_pos)`` on ``log(counts)``; None under 3 classes."""
    ok = (counts > 0) & np.isfinite(cum_pos) & (cum_pos > 0)
    if ok.sum() < 3 or np.ptp(np.log(counts[ok])) == 0:
        return None
    x, y = np.log(counts[ok]), np.log(cum_pos[ok])
    slope, intercept = np.polyfit(x, y, 1)
    fitted = slope * x + intercept
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - fitted) ** 2).sum()) / ss if ss > 0 else 0.0
    return float(min(1.0, max(0.0, slope))), r2, int(ok.sum())


def closest_beta(counts: np.ndarray, power: float) -> float:
    """The effective-number ``beta`` of :data:`BETAS` whose weights are closest in log to ``power``'s."""
    target = np.log(class_weights(counts, "power", power=power))
    err = [float(((np.log(class_weights(counts, "effective_number", beta=b)) - target) ** 2).mean()) for b in BETAS]
    return BETAS[int(np.argmin(err))]


def _weights_advice(rc: RareClasses, cum_pos: np.ndarray, stagnant: list[str]) -> Advice | None:
    if rc.counts is None:
        return None
    fit = fit_power(rc.counts, cum_pos)
    if fit is None or fit[0] <= 0.05:
        return None
    p, r2, n = fit
    beta = closest_beta(rc.counts, p)
    rare, freq = rc.groups["rare"], rc.groups["frequent"]
    ev = [f"positive-gradient mass grows as count^{p:.2f} (R²={r2:.2f} over {n} classes, {_steps(rc.ratio_steps)})"]
    if rare and freq:
        ev.append(f"median cumulative grad/pos: rare {np.nanmedian(cum_pos[rare]):.3g} vs frequent "
                  f"{np.nanmedian(cum_pos[freq]):.3g}")
    if stagnant:
        ev.append("stagnant on train/cls_loss: " + ", ".join(stagnant[:8]))
    current = (rc.config.get("loss") or {}).get("term")
    if current == "class_weighted_bce":
        ev.append(f"this run already weights classes ({(rc.config.get('loss') or {}).get('scheme')}); the fit is on "
                  "its weighted gradients, so the power adds to it")
    return Advice("weights", f"weight classes by (1/n)^{p:.2f}: scheme='power', power={p:.2f} "
                             f"(or scheme='effective_number', beta={beta})",
                  ev, {"scheme": "power", "power": round(p, 2), "beta": beta})


def _pos_weight_advice(rc: RareClasses) -> Advice | None:
    freq = [i for i in rc.groups["frequent"] if np.isfinite(rc.ratio[i]) and rc.ratio[i] > 0]
    if not freq:
        return None
    target = float(np.median(rc.ratio[freq]))
    low = [i for i in range(len(rc.ratio)) if np.isfinite(rc.ratio[i]) and 0 < rc.ratio[i] < target / 2
           and rc.counts is not None and rc.counts[i] > 0]
    if not low:
        return None
    pw = np.ones(len(rc.ratio))
    pw[low] = np.clip(target / rc.ratio[low], 1.0, MAX_POS_WEIGHT)
    worst = sorted(low, key=lambda i: rc.ratio[i])[:5]
    ev = [f"frequent classes' median cumulative pos/neg gradient ratio {target:.3g} ({_steps(rc.ratio_steps)})",
          f"{len(low)} class(es) below half of it: " + ", ".join(f"{rc.names[i]} {rc.ratio[i]:.3g}" for i in worst)]
    return Advice("pos_weight", f"raise the positive gradients of {len(low)} class(es) (pos_weight up to "
                                f"{pw.max():.1f}, EQL v2's balance)", ev,
                  {"pos_weight": [round(float(v), 2) for v in pw], "classes": [rc.names[i] for i in low]})


def _repeat_advice(rc: RareClasses) -> Advice | None:
    if rc.counts is None or not rc.groups["frequent"] or not rc.groups["rare"]:
        return None
    images = float(rc.config.get("train_images", 0) or 0)
    where = f"{images:.0f} training images"
    if images <= 0:  # older runs: batches times batch size (more than the images under repeat-factor sampling)
        images = float(rc.config.get("batches_per_epoch", 0) or 0) * float(rc.config.get("batch", 0) or 0)
        where = f"about {images:.0f} training images ({rc.config.get('batches_per_epoch')} batches of " \
                f"{rc.config.get('batch')})"
    if images <= 0:
        return None
    f = np.minimum(1.0, rc.counts / images)
    t = float(f[rc.groups["frequent"]].min())
    r = np.where(rc.counts > 0, np.maximum(1.0, np.sqrt(t / np.where(f > 0, f, 1.0))), 1.0)
    before = rc.counts / rc.counts.sum()
    after = rc.counts * r / (rc.counts * r).sum()
    current = rc.config.get("rfs_threshold")
    if current is not None and float(current) >= t:
        return None  # the run already samples at least as hard
    ev = [where + ("" if current is None else f"; this run sampled with threshold {float(current):.3g}")]
    parts = {}
    for g, idx in rc.groups.items():
        if idx:
            parts[g] = {"share_before": round(float(before[idx].sum()), 4),
                        "share_after": round(float(after[idx].sum()), 4),
                        "mean_repeat": round(float(r[idx].mean()), 2)}
            ev.append(f"{g}: {100 * before[idx].sum():.1f}% of instances -> {100 * after[idx].sum():.1f}%, "
                      f"repeat x{r[idx].mean():.2f} on average")
    growth = float((rc.counts * r).sum() / rc.counts.sum())
    ev.append(f"an epoch grows about x{growth:.2f}")
    return Advice("repeat", f"repeat-factor sampling with threshold {t:.3g} (the rarest frequent class' "
                            "image frequency)", ev, {"threshold": round(t, 4), "groups": parts,
                                                    "epoch_growth": round(growth, 2)})


def _assign_advice(rc: RareClasses) -> Advice | None:
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(rc.gt > 0, rc.no_pos / np.where(rc.gt > 0, rc.gt, 1), np.nan)
    bad = [i for i in range(len(share)) if np.isfinite(share[i]) and share[i] > NO_POS_SHARE]
    if not bad:
        return None
    bad.sort(key=lambda i: -share[i])
    imgsz = int(rc.config.get("imgsz", 640) or 640)
    bigger = int(math.ceil(2 * imgsz / 32) * 32)
    total = float(rc.no_pos.sum()) / max(float(rc.gt.sum()), 1.0)
    ev = [f"{100 * total:.1f}% of all GT boxes got no positive anchor ({_steps(rc.assign_steps)})",
          "worst: " + ", ".join(f"{rc.names[i]} {100 * share[i]:.0f}% of {rc.gt[i]:.0f}" for i in bad[:6])]
    return Advice("assignment", f"train at imgsz={bigger} (now {imgsz}) or with a stride-4 (P2) head: "
                                f"{len(bad)} classes lose boxes without a positive ({_names(rc, bad)})",
                  ev, {"imgsz": bigger, "classes": [rc.names[i] for i in bad],
                       "share": {rc.names[i]: round(float(share[i]), 3) for i in bad}})


def restart_line(advice: list[Advice], rc: RareClasses) -> str:
    """The ``track(...)`` and ``model.train(...)`` lines that apply ``advice``."""
    kw: dict[str, Any] = {}
    for a in advice:
        if a.kind == "weights":
            kw.update(scheme="power", power=a.params["power"])
        elif a.kind == "pos_weight":
            kw["pos_weight"] = a.params["pos_weight"]
    lines = []
    loss = dict(rc.config.get("loss") or {})
    if loss.get("term") == "class_weighted_bce" and "scheme" not in kw:  # keep the run's own weighting
        kw.update({k: loss[k] for k in ("scheme", "beta", "power") if loss.get(k) is not None})
    pw = kw.pop("pos_weight", None)
    if pw is not None:
        lines.append(f"pos_weight = [1.0] * {len(pw)}")
        lines += [f"pos_weight[{i}] = {v}  # {rc.names[i] if i < len(rc.names) else i}"
                  for i, v in enumerate(pw) if v != 1.0]
    args = "".join(f", {k}={v!r}" for k, v in kw.items()) + (", pos_weight=pos_weight" if pw is not None else "")
    lines.append(f"track(model, loss=\"class_weighted_bce\"{args})" if args else "track(model)")
    train = []
    if rc.config.get("rfs_threshold") is not None and not any(a.kind == "repeat" for a in advice):
        train.append(f"trainer=repeat_factor_trainer(threshold={rc.config['rfs_threshold']})")
    for a in advice:
        if a.kind == "assignment":
            train.append(f"imgsz={a.params['imgsz']}")
        if a.kind == "repeat":
            train.append(f"trainer=repeat_factor_trainer(threshold={a.params['threshold']})")
    if any(a.kind == "repeat" for a in advice) or rc.config.get("rfs_threshold") is not None:
        lines.insert(0, "from tracker.integrations.ultralytics_data import repeat_factor_trainer")
    lines.insert(0, "from tracker.integrations.ultralytics import track")
    if train:
        lines.append(f"model.train(data={rc.config.get('data', '...')!r}, " + ", ".join(train) + ", ...)")
    return "\n".join(lines)


def advise(rc: RareClasses, stagnant: list[str] | None = None) -> list[Advice]:
    """The changes the run's signals support (possibly none)."""
    cum_pos = np.full(len(rc.names), np.nan)
    if rc.cum_pos is not None:
        cum_pos = rc.cum_pos
    found = [_weights_advice(rc, cum_pos, stagnant or []), _pos_weight_advice(rc), _repeat_advice(rc),
             _assign_advice(rc)]
    return [a for a in found if a is not None]


def notes(rc: RareClasses, advice: list[Advice]) -> list[str]:
    """What was checked and needs no change (the kinds of advice that did not fire), with the numbers."""
    kinds = {a.kind for a in advice}
    out: list[str] = []
    if "weights" not in kinds and rc.counts is not None and rc.cum_pos is not None:
        fit = fit_power(rc.counts, rc.cum_pos)
        if fit is not None:
            out.append(f"class weights: positive-gradient mass grows as count^{fit[0]:.2f} (R²={fit[1]:.2f}, "
                       f"{_steps(rc.ratio_steps)}): the classes get alike positive gradients already")
    if "pos_weight" not in kinds and rc.ratio_steps is not None:
        out.append("positive weights: no class's cumulative pos/neg ratio is below half the frequent group's median")
    if "repeat" not in kinds and rc.config.get("rfs_threshold") is not None:
        out.append(f"repeat-factor sampling: this run samples with threshold {rc.config['rfs_threshold']}, at least "
                   "the rarest frequent class' image frequency")
    if "assignment" not in kinds and rc.assign_steps is not None:
        share = float(rc.no_pos.sum()) / max(float(rc.gt.sum()), 1.0)
        out.append(f"assignment: no class loses more than {100 * NO_POS_SHARE:.0f}% of its boxes to no positive "
                   f"({100 * share:.1f}% of all, {_steps(rc.assign_steps)})")
    return out
