"""COCO balancing at train2017 scale: `tracker coco stats` and `balance` against pycocotools.

    .venv/bin/python bench/coco.py            # full scale: 118,287 images, 860,001 annotations
    .venv/bin/python bench/coco.py --scale 0.1  # a quick run at a tenth of the size

The input is SYNTHETIC (tracker.coco.synthetic, seeded): the per-class instance
counts of MS COCO train2017 (../shared/data/coco/train2017_class_counts.json),
people in about 54% of the images, about 7.3 annotations per image, polygons of
10-40 points. It is written once to bench/out/ (git-ignored) and reused.

Each measured command runs in its own process; wall time and peak RSS
(``wait4``'s ``ru_maxrss``) are those of that process alone:

* ``tracker coco stats FILE --format json``
* pycocotools ``COCO(FILE)`` (the load alone)
* ``tracker coco balance FILE --max-images M --out OUT``

Then the balanced subset and a seeded random subset of the same size are compared.
Targets: stats >= 3x faster than the pycocotools load, peak RSS <= 3 GB, balance
<= 30 s, person <= 10% of instances, every class >= min(total, 150), normalised
entropy >= 0.95. The script reports; it never fails.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tracker import coco  # noqa: E402
from tracker.coco.synthetic import read_counts, scale_counts, write_synthetic  # noqa: E402

COUNTS = ROOT.parent / "shared" / "data" / "coco" / "train2017_class_counts.json"
FULL_IMAGES = 118_287


@dataclass
class Measure:
    """Wall seconds, CPU seconds (user + system) and peak resident memory of one child process."""

    seconds: float
    cpu_seconds: float
    peak_rss_mb: float
    ok: bool


def measure(cmd: list[str]) -> Measure:
    """Run ``cmd`` and return its wall time and peak RSS (Linux ``ru_maxrss`` is in KiB)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    ok = os.waitstatus_to_exitcode(status) == 0
    if not ok:
        print(f"  command failed: {' '.join(cmd)}\n{err}")
    return Measure(seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, ok)


def figures(counts: np.ndarray, person: int) -> dict[str, float]:
    """Person share, smallest class, max/min ratio and normalised entropy of ``counts``."""
    return {
        "instances": float(counts.sum()),
        "person_share": float(counts[person] / max(1, counts.sum())),
        "min_class": float(counts.min()),
        "ratio": coco.imbalance_ratio(counts),
        "entropy": coco.normalized_entropy(counts),
    }


def subset_counts(index: coco.CocoIndex, images: np.ndarray) -> np.ndarray:
    """Instances per class in the images ``images``."""
    mask = np.zeros(index.num_images, dtype=bool)
    mask[images] = True
    return np.bincount(index.ann_category[mask[index.ann_image]], minlength=index.num_categories)


def main() -> None:
    """Generate (once), measure, compare, print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of train2017's size")
    ap.add_argument("--max-images", type=int, default=None, help="balance budget (default 20000 x scale)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    n_images = round(FULL_IMAGES * args.scale)
    budget = args.max_images or round(20_000 * args.scale)
    src = args.out_dir / f"synthetic_train2017_s{args.scale:g}_seed{args.seed}.json"
    if not src.exists():
        print(f"generating {src.name} (synthetic, seed {args.seed}) ...", flush=True)
        t0 = time.perf_counter()
        counts = read_counts(COUNTS)
        write_synthetic(src, counts if args.scale == 1.0 else scale_counts(counts, args.scale),
                        n_images, seed=args.seed)
        print(f"  generated in {time.perf_counter() - t0:.1f} s")
    print(f"input: {src.name}: {src.stat().st_size / 1e6:,.0f} MB, {n_images:,} images")
    cli = [sys.executable, "-c", "from tracker.cli import main; main()", "coco"]
    out = args.out_dir / "balanced.json"
    stats_m = measure(cli + ["stats", str(src), "--format", "json"])
    ref_m = measure([sys.executable, "-c", f"from pycocotools.coco import COCO; COCO({str(src)!r})"])
    bal_m = measure(cli + ["balance", str(src), "--max-images", str(budget), "--out", str(out),
                           "--seed", str(args.seed)])
    print(f"\n{'command':44s} {'wall s':>8s} {'cpu s':>8s} {'peak RSS MB':>12s}")
    for name, m in (("tracker coco stats", stats_m), ("pycocotools COCO(path) load", ref_m),
                    (f"tracker coco balance --max-images {budget}", bal_m)):
        print(f"{name:44s} {m.seconds:8.2f} {m.cpu_seconds:8.2f} {m.peak_rss_mb:12,.0f}")
    speedup = ref_m.seconds / stats_m.seconds
    print(f"stats vs pycocotools load: {speedup:.1f}x faster in wall time, "
          f"{ref_m.cpu_seconds / stats_m.cpu_seconds:.1f}x in CPU time (target >= 3x); "
          f"stats peak RSS {stats_m.peak_rss_mb / 1024:.2f} GB (target <= 3 GB)")
    print(f"balance: {bal_m.seconds:.1f} s (target <= 30 s)")
    if not bal_m.ok:
        return
    compare(src, out, args.seed)


def compare(src: Path, out: Path, seed: int) -> None:
    """Print full set, balanced subset and random subset figures side by side."""
    index = coco.load(src)
    person = index.cat_names.index("person") if "person" in index.cat_names else int(
        np.argmax(index.instances_per_class()))
    balanced = coco.load(out)
    chosen = np.flatnonzero(np.isin(index.image_ids, balanced.image_ids))
    rng = np.random.default_rng(seed)
    random = rng.choice(index.num_images, size=len(chosen), replace=False)
    totals = index.instances_per_class()
    rows = {
        "full set": figures(totals, person),
        f"balanced ({len(chosen):,} images)": figures(subset_counts(index, chosen), person),
        f"random ({len(random):,} images)": figures(subset_counts(index, random), person),
    }
    print(f"\n{'subset':28s} {'instances':>10s} {'person':>7s} {'min class':>9s} "
          f"{'max/min':>8s} {'entropy':>8s}")
    for name, f in rows.items():
        print(f"{name:28s} {f['instances']:10,.0f} {100 * f['person_share']:6.1f}% {f['min_class']:9,.0f} "
              f"{f['ratio']:8,.1f} {f['entropy']:8.3f}")
    after = subset_counts(index, chosen)
    floor = np.minimum(totals, 150)
    short = [index.cat_names[i] for i in np.flatnonzero(after < floor)]
    print(f"every class >= min(total, 150) (a full-scale target): "
          f"{'yes' if not short else f'no, {len(short)} classes below'}")


if __name__ == "__main__":
    main()
