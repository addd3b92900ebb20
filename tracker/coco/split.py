"""Class-stratified train/val split of a COCO index.

Images are multi-label (an image holds several classes), so a per-class random
split cannot be done independently. The split uses iterative stratification
(Sechidis, Tsoumakas and Vlahavas, 2011):

1. Each fold ``j`` (train, val) wants ``r_j * n`` images and, for each class ``l``,
   ``r_j * n_l`` of the images holding ``l``.
2. Take the class with the fewest images not yet assigned (the rarest first, so
   rare classes are spread before common ones fill the folds). Its unassigned
   images, in seeded random order, each go to the fold that still wants most
   images of that class; ties go to the fold that wants most images overall, then
   to the val fold. A fold that already has its share of images takes no more
   while the other still wants some, so the fold sizes hold. Every assignment
   lowers the wants of all the image's classes.
3. Repeat until every image with an annotation is placed. Images without
   annotations are then dealt out to keep the fold sizes at their ratio.

Classes are counted by *images* holding them (the unit that is split); the
instance shares follow closely. Deterministic for a given ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracker.coco.index import CocoIndex
from tracker.errors import ConfigError


@dataclass(frozen=True)
class SplitResult:
    """Image indices of each fold (ascending)."""

    train: np.ndarray
    val: np.ndarray


def stratified_split(index: CocoIndex, val: float, seed: int = 0) -> SplitResult:
    """Split ``index`` into train and val with ``val`` the share of images in val."""
    if not 0.0 < val < 1.0:
        raise ConfigError(f"val fraction {val!r} must be strictly between 0 and 1, e.g. 0.1")
    rng = np.random.default_rng(seed)
    indptr, classes = index.image_classes()
    n, k = index.num_images, index.num_categories
    ratios = np.array([1.0 - val, val])
    per_class = np.bincount(classes, minlength=k).astype(np.float64)
    wants_cls = ratios[:, None] * per_class[None, :]
    wants = ratios * n
    fold = np.full(n, -1, dtype=np.int64)
    remaining = per_class.copy()
    image_of = np.repeat(np.arange(n), np.diff(indptr))
    members = [np.flatnonzero(classes == c) for c in range(k)]
    while True:
        live = np.flatnonzero(remaining > 0)
        if len(live) == 0:
            break
        label = int(live[np.argmin(remaining[live])])
        imgs = image_of[members[label]]
        imgs = imgs[fold[imgs] < 0]
        for i in rng.permutation(imgs).tolist():
            j = _choose(wants_cls[:, label], wants)
            fold[i] = j
            labels = classes[indptr[i]:indptr[i + 1]]
            wants_cls[j, labels] -= 1
            wants[j] -= 1
            remaining[labels] -= 1
    empty = np.flatnonzero(fold < 0)
    for i in rng.permutation(empty).tolist():
        j = int(np.argmax(wants))
        fold[i] = j
        wants[j] -= 1
    return SplitResult(np.flatnonzero(fold == 0), np.flatnonzero(fold == 1))


def _choose(want_label: np.ndarray, wants: np.ndarray) -> int:
    if float(wants[0]) <= 0 < float(wants[1]):
        return 1
    if float(wants[1]) <= 0 < float(wants[0]):
        return 0
    a, b = float(want_label[0]), float(want_label[1])
    if a != b:
        return 0 if a > b else 1
    return 0 if float(wants[0]) > float(wants[1]) else 1
