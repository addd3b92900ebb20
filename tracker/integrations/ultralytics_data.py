"""Balanced data for Ultralytics: repeat-factor sampling, and COCO subsets as YOLO datasets.

* :func:`repeat_factor_trainer` returns a subclass of Ultralytics'
  ``DetectionTrainer`` whose training dataloader draws images with
  :class:`tracker.sampling.RepeatFactorSampler` (detectron2's / LVIS's rule:
  image repeat factor ``max over its classes of max(1, sqrt(t / f(c)))``). Pass it
  as ``model.train(trainer=repeat_factor_trainer(threshold=0.1), ...)``; the
  model stays Ultralytics' own ``DetectionModel``, so checkpoints load anywhere.
  Every epoch has the same length, ``ceil(sum of repeat factors)`` draws (the
  epoch's stochastic rounding is cut or wrapped to it), so the global step
  ``epoch * batches_per_epoch + batch`` is stable across epochs and resumes. The
  sampler advances its epoch on each pass and starts at Ultralytics' start epoch,
  also when loader workers prefetch the next epoch.
* :func:`coco_to_yolo` turns a COCO instances file (e.g. the output of
  ``tracker coco balance``) into YOLO labels with Ultralytics' own
  ``ultralytics.data.converter.convert_coco`` and writes a ``data.yaml``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from tracker.errors import ConfigError, DataError
from tracker.sampling import RepeatFactorSampler


class EpochSampler:
    """A :class:`RepeatFactorSampler` with a fixed epoch length that advances its epoch itself."""

    def __init__(self, labels: list[np.ndarray], threshold: float, seed: int, rank: int, world_size: int) -> None:
        self.inner = RepeatFactorSampler(labels, threshold=threshold, seed=seed, rank=rank, world_size=world_size)
        total = math.ceil(float(self.inner.repeat_factors.sum()))
        self.length = -(-total // world_size)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass draws."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        self.inner.set_epoch(self.epoch)
        self.epoch += 1
        shard = self.inner.shard()
        return iter(np.resize(shard, self.length).tolist() if len(shard) else [])

    def __len__(self) -> int:
        return self.length


def repeat_factor_trainer(threshold: float = 0.001, seed: int = 0, base: Any = None) -> type:
    """A ``DetectionTrainer`` subclass (or of ``base``) that trains with repeat-factor sampling."""
    if not threshold > 0:
        raise ConfigError(f"repeat-factor threshold {threshold!r} must be > 0 (LVIS uses 0.001)")
    from ultralytics.data.build import InfiniteDataLoader, seed_worker
    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.utils import RANK

    parent = base or DetectionTrainer

    class RepeatFactorTrainer(parent):  # type: ignore[valid-type, misc]
        """Ultralytics' detection trainer with a repeat-factor sampler on the training set."""

        rfs_threshold, rfs_seed = float(threshold), int(seed)

        def get_dataloader(self, dataset_path: str, batch_size: int = 16, rank: int = 0, mode: str = "train") -> Any:
            loader = super().get_dataloader(dataset_path, batch_size, rank, mode)
            if mode != "train":
                return loader
            dataset = loader.dataset
            labels = [np.asarray(lb["cls"]).reshape(-1).astype(np.int64) for lb in dataset.labels]
            world = max(self.world_size, 1)
            sampler = EpochSampler(labels, self.rfs_threshold, self.rfs_seed + int(self.args.seed),
                                   max(RANK, 0), world)
            sampler.set_epoch(0)
            self._rfs_sampler = sampler
            close = getattr(loader, "close", None)
            if close is not None:
                close()
            return InfiniteDataLoader(
                dataset=dataset, batch_size=loader.batch_size, num_workers=loader.num_workers, sampler=sampler,
                pin_memory=loader.pin_memory, collate_fn=getattr(dataset, "collate_fn", None),
                worker_init_fn=seed_worker, drop_last=loader.drop_last,
                prefetch_factor=4 if loader.num_workers > 0 else None,
            )

        def resume_training(self, ckpt: Any) -> None:
            super().resume_training(ckpt)
            sampler = getattr(self, "_rfs_sampler", None)
            if sampler is not None:
                sampler.set_epoch(self.start_epoch)

    return RepeatFactorTrainer


def coco_to_yolo(annotations: str | os.PathLike[str], out: str | os.PathLike[str], *, split: str = "train",
                 images: str | os.PathLike[str] | None = None) -> Path:
    """Convert a COCO instances file to YOLO labels under ``out`` (new folder); return its ``data.yaml``.

    Class ids follow Ultralytics' 80-class COCO mapping when the categories are
    COCO's, else ``category_id - 1``. With ``images``, the images the file lists
    are symlinked into ``out/images/<split>``; else put them there yourself. The
    ``data.yaml`` validates on the same split: point ``val`` at your own
    validation images.
    """
    from ultralytics.data.converter import coco91_to_coco80_class, convert_coco

    src = Path(annotations).resolve()
    target = Path(out).resolve()
    if not src.is_file():
        raise DataError(f"COCO file {str(src)!r} does not exist; pass the instances JSON (e.g. from 'tracker coco balance')")
    if target.exists():
        raise ConfigError(f"output folder {str(target)!r} exists; pass a new folder (convert_coco would rename it)")
    data = json.loads(src.read_text())
    categories = sorted(data.get("categories") or [], key=lambda c: int(c["id"]))
    if not categories:
        raise DataError(f"COCO file {str(src)!r} has no categories; expected the 'categories' list")
    coco80 = coco91_to_coco80_class()
    ids = [int(c["id"]) for c in categories]
    is_coco = all(1 <= i <= len(coco80) and coco80[i - 1] is not None for i in ids)
    names: dict[int, str] = {}
    for c in categories:
        index = coco80[int(c["id"]) - 1] if is_coco else int(c["id"]) - 1
        names[int(index)] = str(c["name"])
    with tempfile.TemporaryDirectory(dir=target.parent) as staging:
        (Path(staging) / f"instances_{split}.json").symlink_to(src)
        convert_coco(labels_dir=staging, save_dir=str(target), cls91to80=is_coco)
    if images is not None:
        folder = target / "images" / split
        folder.mkdir(parents=True, exist_ok=True)
        for image in data.get("images", []):
            file = Path(images) / image["file_name"]
            if file.exists() and not (folder / file.name).exists():
                (folder / file.name).symlink_to(file.resolve())
    nc = max(names) + 1
    lines = [f"path: {target}", f"train: images/{split}", f"val: images/{split}", f"nc: {nc}", "names:"]
    lines += [f"  {i}: {names.get(i, f'class{i}')}" for i in range(nc)]
    yaml = target / "data.yaml"
    yaml.write_text("\n".join(lines) + "\n")
    return yaml
