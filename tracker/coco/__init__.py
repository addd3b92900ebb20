"""COCO instances files: a fast columnar index, class statistics, balanced subsets and splits.

    from tracker import coco
    index = coco.load("instances_train2017.json")      # numpy columns, no polygons kept
    table = coco.stats(index)                           # per-class table + ratio, entropy
    counts = coco.class_counts("instances_train2017.json")  # {name: instances}
    chosen = coco.balance(index, max_images=20000)
    coco.write_subset("instances_train2017.json", index, chosen.images, "balanced.json")
    parts = coco.stratified_split(index, val=0.1)
"""

from __future__ import annotations

from tracker.coco.balance import BalanceResult, balance, waterfill
from tracker.coco.index import CocoIndex, Skipped, from_dict, load
from tracker.coco.io import atomic_write_bytes, atomic_writer
from tracker.coco.split import SplitResult, stratified_split
from tracker.coco.stats import (
    ClassStats,
    DatasetStats,
    class_counts,
    file_stats,
    imbalance_ratio,
    normalized_entropy,
    stats,
)
from tracker.coco.subset import write_subset, write_subsets

__all__ = [
    "BalanceResult",
    "ClassStats",
    "CocoIndex",
    "DatasetStats",
    "Skipped",
    "SplitResult",
    "atomic_write_bytes",
    "atomic_writer",
    "balance",
    "class_counts",
    "file_stats",
    "from_dict",
    "imbalance_ratio",
    "load",
    "normalized_entropy",
    "stats",
    "stratified_split",
    "waterfill",
    "write_subset",
    "write_subsets",
]
