"""The demo: two small multi-label runs on synthetic data with COCO train2017's label frequencies.

Run A trains with plain BCE and uniform shuffling. Run B trains with class-weighted
BCE (effective-number weights) and repeat-factor sampling; it is interrupted (a
simulated preemption) and resumed from its last checkpoint, so its curve shows a
resume mark and no gap or duplicate. Both log the total loss, per-class losses and
the sampler's RNG fingerprint. The loss kernels run on Vulkan when a device is
available, else numpy.

The data is synthetic: label ``c`` is present in a sample with probability
``0.54 * n_c / n_person`` (person appears in about 54% of COCO images), and the
features are the sum of the present classes' prototype vectors plus noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable

import numpy as np

import tracker
from tracker.losses import kernels
from tracker.weights import load_counts

FEATURES = 48
SAMPLES = 4096
BATCH = 64
PERSON_IMAGE_SHARE = 0.54


class Preempted(RuntimeError):
    """The demo's simulated interruption of a training run."""


def coco_counts() -> tuple[list[str], np.ndarray]:
    """Class names and instance counts of COCO train2017 (shipped with the package)."""
    with resources.as_file(resources.files("tracker.data") / "coco_train2017_class_counts.json") as path:
        loaded = load_counts(path)
    return loaded.names, loaded.counts


@dataclass
class Dataset:
    x: np.ndarray
    y: np.ndarray
    names: list[str]
    counts: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.counts = self.y.sum(axis=0)

    def labels(self) -> list[np.ndarray]:
        return [np.flatnonzero(row) for row in self.y]


def make_dataset(seed: int = 0) -> Dataset:
    names, counts = coco_counts()
    rng = np.random.default_rng(seed)
    p = PERSON_IMAGE_SHARE * counts / counts.max()
    y = (rng.random((SAMPLES, len(names))) < p).astype(np.float32)
    prototypes = rng.normal(0.0, 1.0, (len(names), FEATURES)).astype(np.float32)
    x = y @ prototypes + rng.normal(0.0, 0.5, (SAMPLES, FEATURES)).astype(np.float32)
    return Dataset(x=x, y=y, names=names)


def pick_backend() -> str:
    """``vulkan`` when its kernel is registered and available here, else ``numpy``."""
    found = kernels("class_weighted_bce")
    vk = found.get("vulkan")
    return "vulkan" if vk is not None and vk.unavailable() is None else "numpy"


@dataclass
class Model:
    w: np.ndarray
    b: np.ndarray

    @classmethod
    def zeros(cls, classes: int) -> "Model":
        return cls(np.zeros((FEATURES, classes), np.float32), np.full(classes, -2.0, np.float32))

    def copy(self) -> "Model":
        return Model(self.w.copy(), self.b.copy())


def train(
    data: Dataset,
    *,
    run_id: str,
    name: str,
    loss_params: dict[str, Any],
    threshold: float,
    steps: int,
    backend: str,
    home: str | None,
    interrupt_at: int | None = None,
    resume_from: tuple[int, Model] | None = None,
    on_checkpoint: Callable[[int, Model], None] | None = None,
    lr: float = 0.5,
) -> None:
    """Train one run (or resume it from ``resume_from = (step, model)``)."""
    config = {"model": "linear multi-label", "lr": lr, "batch": BATCH, "loss": loss_params,
              "sampler": {"name": "repeat_factor", "threshold": threshold}, "backend": backend,
              "class_counts": dict(zip(data.names, data.counts.astype(int).tolist())), "seed": 0}
    loss = tracker.loss("class_weighted_bce", backend=backend, **loss_params)
    sampler = tracker.sampler("repeat_factor", labels=data.labels(), threshold=threshold, seed=0, rank=0, world_size=1)
    start, model = resume_from if resume_from else (0, Model.zeros(len(data.names)))
    model = model.copy()
    resume = "must" if resume_from else "never"
    with tracker.init("demo", name=name, run_id=run_id, config=config, home=home,
                      resume=resume, resume_step=start if resume_from else None) as run:
        run.set_classes(data.names)
        grad = np.zeros((BATCH, len(data.names)), np.float32)
        order: np.ndarray = np.zeros(0, np.int64)
        epoch_len = len(sampler) // BATCH
        for step in range(start, steps):
            epoch, pos = divmod(step, epoch_len)
            if pos == 0 or step == start:
                sampler.set_epoch(epoch)
                order = np.fromiter(iter(sampler), np.int64)
                sampler.log_fingerprint(run, step)
            idx = order[pos * BATCH:(pos + 1) * BATCH]
            x, y = data.x[idx], data.y[idx]
            logits = x @ model.w + model.b
            grad.fill(0.0)
            result = loss(logits, y, grad=grad)
            model.w -= lr * (x.T @ grad)
            model.b -= lr * grad.sum(axis=0)
            run.log({"loss/total": result.loss, "lr": lr}, step=step)
            if step % 10 == 0:
                run.log_classes("loss/cls", result.per_class / len(idx), step=step)
            if on_checkpoint and step % 50 == 0:
                on_checkpoint(step, model)
            if interrupt_at is not None and step == interrupt_at:
                raise Preempted(f"simulated preemption at step {step}")
