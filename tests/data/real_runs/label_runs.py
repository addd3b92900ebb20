"""Label real training logs by the manifest's written definitions (see manifest.toml, "Label definitions").

This script reads each folder's results.csv with the csv module only: it shares no
code with the analysis it is used to score (tracker/analysis). It judges with
hindsight, on the whole file, what a judge must decide causally.

Run: ``python tests/data/real_runs/label_runs.py FOLDER...``; prints one TOML
``labels = [...]`` block per folder. Folders named without a manifest entry are
labelled from scratch; for the others the output is a check against their labels.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
import sys
from pathlib import Path

VAL = ("val/", "val_")
TRAIN = ("train/", "train_")
METRIC = re.compile(r"map|acc|precision|recall", re.IGNORECASE)
LR = re.compile(r"^(lr/pg\d|x/lr\d)$")
RISE, SETTLED, MATERIAL, AFTER = 0.10, 0.05, 0.05, 3


def read(folder: Path) -> tuple[list[int], dict[str, list[float]]]:
    """Epochs and columns (NaN for blanks) of ``folder/results.csv``."""
    with open(folder / "results.csv", newline="") as fh:
        rows = [{k.strip(): v.strip() for k, v in r.items()} for r in csv.DictReader(fh)]
    cols: dict[str, list[float]] = {}
    for key in rows[0]:
        if key in ("epoch", "time"):
            continue
        vals = []
        for r in rows:
            try:
                vals.append(float(r[key]))
            except ValueError:
                vals.append(math.nan)
        cols[key] = vals
    return [int(float(r["epoch"])) for r in rows], cols


def twin(key: str, cols: dict[str, list[float]]) -> str | None:
    """The train twin of a val key or the val twin of a train key."""
    for a, b in ((VAL, TRAIN), (TRAIN, VAL)):
        for p in a:
            if key.startswith(p):
                for q in b:
                    if q + key[len(p):] in cols:
                        return q + key[len(p):]
    return None


def smooth(v: list[float]) -> list[float]:
    """Centred running median of 3 (the ends kept)."""
    return [v[0], *(statistics.median(v[i - 1:i + 2]) for i in range(1, len(v) - 1)), v[-1]] if len(v) > 2 else v


def overfitting(ep: list[int], cols: dict[str, list[float]]) -> dict | None:
    """Definition 1 (manifest): the val loss with the largest qualifying rise after its whole-run minimum."""
    best = None
    for key, v in cols.items():
        t = twin(key, cols)
        if "loss" not in key or not key.startswith(VAL) or t is None:
            continue
        ok = [i for i, x in enumerate(v) if math.isfinite(x)]
        if len(ok) < 10:
            continue
        v = dict(zip(ok, smooth([v[i] for i in ok])))  # a one-epoch dip is no minimum
        b = min(ok, key=lambda i: v[i])
        after = [v[i] for i in ok if i > b]
        tv = [cols[t][i] for i in ok if i > b and math.isfinite(cols[t][i])]
        if len(after) < AFTER or v[b] <= 0 or not tv or not math.isfinite(cols[t][b]):
            continue
        span = max(v[i] for i in ok) - v[b]
        med, last = statistics.median(after), statistics.median(after[-3:])
        if (med >= (1 + SETTLED) * v[b] and last >= (1 + RISE) * v[b] and med - v[b] >= MATERIAL * span
                and statistics.median(tv) < cols[t][b]):
            rise = med / v[b] - 1
            if best is None or rise > best[0]:
                best = (rise, key, b, med, last, v[b])
    if best is None:
        return None
    rise, key, b, med, last, low = best
    return {"kind": "overfitting", "onset": ep[b + 1], "best": ep[b], "key": key,
            "reason": f"{key} (running median of 3) is lowest at epoch {ep[b]} ({low:.4g}); after it its median is "
                      f"{med:.4g} (+{rise:.0%}) and its last 3 read {last:.4g}, while {twin(key, cols)} falls"}


def zero_run(v: list[float]) -> int | None:
    """Index of the first of 3+ exact zeros in a row, else None."""
    for i in range(len(v) - 2):
        if all(x == 0 for x in v[i:i + 3]):
            return i
    return None


def zero_loss(ep: list[int], cols: dict[str, list[float]]) -> dict | None:
    """Definition 3 (manifest)."""
    losses = [k for k in cols if "loss" in k]
    metrics = [k for k in cols if METRIC.search(k) and "loss" not in k]
    starts = {k: zero_run(cols[k]) for k in losses}
    if losses and all(s is not None for s in starts.values()):
        i = max(s for s in starts.values() if s is not None)
        return {"kind": "zero_loss", "onset": ep[i], "key": losses[0],
                "reason": f"every loss ({', '.join(losses)}) is exactly 0 from epoch {ep[i]}: nothing to learn"}
    for k in losses:
        i, t = starts[k], twin(k, cols)
        if i is None or t is None or statistics.median(x for x in cols[t] if math.isfinite(x)) <= 0:
            continue
        if k.startswith(VAL) and any(cols[m][i] > 0 for m in metrics):
            continue  # a term the validation does not compute (YOLO26 sem_loss), not missing targets
        return {"kind": "zero_loss", "onset": ep[i], "key": k,
                "reason": f"{k} is exactly 0 from epoch {ep[i]} while {t} is not"}
    return None


def metric_collapse(ep: list[int], cols: dict[str, list[float]]) -> dict | None:
    """Definition 2 (manifest)."""
    metrics = [k for k in cols if METRIC.search(k) and "loss" not in k and not LR.match(k)]
    if metrics and len(ep) >= 5 and all(all(x <= 1e-6 for x in cols[k]) for k in metrics):
        return {"kind": "metric_collapse", "onset": ep[0], "reason": "every metric is 0 at every epoch"}
    for k in metrics:
        v = cols[k]
        z = 0
        while z < len(v) and v[len(v) - 1 - z] <= 1e-6:
            z += 1
        if 3 <= z < len(v) and max(v[: len(v) - z]) > 1e-6:
            return {"kind": "metric_collapse", "onset": ep[len(v) - z], "key": k,
                    "reason": f"{k} is 0 from epoch {ep[len(v) - z]} to the end after reaching {max(v):.4g}"}
    return None


def non_finite(ep: list[int], cols: dict[str, list[float]]) -> dict | None:
    """Definition 4 (manifest): the first NaN/inf of any loss."""
    hits = [(i, k) for k in cols if "loss" in k for i, x in enumerate(cols[k]) if not math.isfinite(x)]
    if not hits:
        return None
    i, k = min(hits)
    return {"kind": "non_finite", "onset": ep[i], "key": k, "reason": f"{k} is {cols[k][i]} at epoch {ep[i]}"}


def divergence(ep: list[int], cols: dict[str, list[float]]) -> dict | None:
    """Definition 5 (manifest): a train loss above 2x its minimum so far for 2+ epochs in a row."""
    for k in cols:
        if "loss" not in k or not k.startswith(TRAIN):
            continue
        v, low = cols[k], math.inf
        for i in range(len(v) - 1):
            low = min(low, v[i]) if math.isfinite(v[i]) else low
            back = low + 0.5 * (v[0] - low)  # half of all it had gained, given back
            if (0 < low < math.inf and i + 2 < len(v)
                    and all(math.isfinite(x) and x > max(2 * low, back) for x in v[i + 1:i + 3])):
                return {"kind": "divergence", "onset": ep[i + 1], "key": k,
                        "reason": f"{k} is above twice its minimum so far ({low:.4g}) and back over half way to its "
                                  f"start ({v[0]:.4g}) at epochs {ep[i + 1]}-{ep[i + 2]}"}
    return None


def planned_epochs(folder: Path) -> int | None:
    """The ``epochs:`` line of the run's args.yaml (Ultralytics) or opt.yaml (YOLOv5), if it has one."""
    for name in ("args.yaml", "opt.yaml"):
        if (folder / name).exists():
            found = re.search(r"^epochs:\s*(\d+)\s*$", (folder / name).read_text(), re.MULTILINE)
            if found:
                return int(found.group(1))
    return None


def stopped_early(ep: list[int], cols: dict[str, list[float]], planned: int | None = None) -> dict | None:
    """Definition 6 (manifest): with the run's args.yaml/opt.yaml, fewer epochs than its ``epochs``; without,
    the linear Ultralytics schedule (lrf 0.01) planned 3+ and 10%+ more epochs."""
    if planned is not None:
        done = len(set(ep))
        if done < planned:
            return {"kind": "stopped_early", "onset": ep[-1],
                    "reason": f"its settings file plans {planned} epochs; {done} were run"}
        return None
    keys = [k for k in cols if LR.match(k)]
    if not keys or len(ep) < 10:
        return None
    v = [statistics.median(cols[k][i] for k in keys) for i in range(len(ep))]
    peak = max(v)
    step = statistics.median(v[i] - v[i + 1] for i in range(len(v) - 4, len(v) - 1))
    if peak <= 0 or step <= peak * 1e-6:
        return None
    planned = round(peak * 0.99 / step)
    done = len(ep)
    if planned - done >= 3 and planned - done >= 0.1 * planned:
        return {"kind": "stopped_early", "onset": ep[-1],
                "reason": f"the lr falls {step:.3g} an epoch from a peak of {peak:.3g}: a schedule of ~{planned} "
                          f"epochs, stopped after {done}"}
    return None


JUDGES = (overfitting, metric_collapse, zero_loss, non_finite, divergence, stopped_early)


def labels(folder: Path) -> list[dict]:
    """Every label the definitions give ``folder``."""
    ep, cols = read(folder)
    found = [lab for judge in JUDGES[:-1] if (lab := judge(ep, cols)) is not None]
    stopped = stopped_early(ep, cols, planned_epochs(folder))
    return found + ([stopped] if stopped is not None else [])


def toml(lab: dict) -> str:
    """One inline TOML table."""
    parts = [f'kind = "{lab["kind"]}"', f'onset = {lab["onset"]}']
    if "best" in lab:
        parts.append(f'best = {lab["best"]}')
    if "key" in lab and lab["kind"] in ("overfitting", "zero_loss", "non_finite"):
        parts.append(f'key = "{lab["key"]}"')
    parts.append('reason = "' + lab["reason"].replace('"', "'") + '"')
    return "  { " + ", ".join(parts) + " },"


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        found = labels(Path(arg))
        print(f"# {Path(arg).name}")
        print("labels = [" + ("\n" + "\n".join(toml(lab) for lab in found) + "\n" if found else "") + "]")
