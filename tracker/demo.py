"""The quick demo: three small multi-label runs on synthetic data with COCO train2017's label frequencies.

Run A trains with plain BCE and uniform shuffling. Run B trains with class-weighted
BCE (effective-number weights) and repeat-factor sampling; it is interrupted (a
simulated preemption) and resumed from its last checkpoint with a new sampler seed,
so its curve shows a resume mark, no gap or duplicate, and the rows the resume
superseded differ from the ones that replace them. Run C is run B's recipe plus an
L2 penalty on the logits switched on at 40% of the steps, whose gradient kernel has
the classic bug: it overwrites the gradient buffer (``grad[...] = g``) instead of
adding into it (``grad += g``), so from then on the classification gradient is
thrown away, the loss climbs back (about 3x by the end of 400 steps) and the online
divergence detector records it. Added correctly, the same penalty raises the loss by
about a third and no detector fires. Every run logs ``loss/total`` (the
classification loss, so the three compare), per-class losses and the sampler's RNG
fingerprint; run C logs ``loss/logit_penalty`` beside them. The loss kernels run on
Vulkan when a device is available, else numpy.

The data is synthetic: label ``c`` is present in a sample with probability
``0.54 * n_c / n_person`` (person appears in about 54% of COCO images), and the
features are the sum of the present classes' prototype vectors plus noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import tracker
from tracker.coco.counts import coco_train2017_counts
from tracker.losses import kernels

FEATURES = 48
SAMPLES = 4096
BATCH = 64
PERSON_IMAGE_SHARE = 0.54
PENALTY_WEIGHT = 0.03
RESUME_SEED = 1


class Preempted(RuntimeError):
    """The demo's simulated interruption of a training run."""


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
    names, counts = coco_train2017_counts()
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


@dataclass
class Penalty:
    """``weight * mean(logits**2)``: an L2 penalty on the logits, applied from step ``start`` on.

    It keeps logits from saturating. Its gradient kernel must ADD
    ``2 * weight * logits / logits.size`` into the gradient the classification loss
    already holds; with ``overwrite`` it reproduces the bug of writing it in place of
    that gradient (``grad[...] = g``), so only the penalty is left to train on.
    """

    weight: float
    start: int
    overwrite: bool = False

    def __call__(self, logits: np.ndarray, grad: np.ndarray) -> float:
        """The penalty of ``logits``; its gradient goes into ``grad`` (see class doc)."""
        g = (2.0 * self.weight / logits.size) * logits
        if self.overwrite:
            grad[...] = g  # the bug: the classification loss's gradient is lost
        else:
            grad += g
        return float(self.weight * np.mean(np.square(logits, dtype=np.float64)))


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
    seed: int = 0,
    penalty: Penalty | None = None,
) -> None:
    """Train one run (or resume it from ``resume_from = (step, model)``) with sampler ``seed``.

    ``penalty``: a logit penalty added to the loss from its ``start`` step on.
    """
    config: dict[str, Any] = {
        "model": "linear multi-label", "lr": lr, "batch": BATCH, "loss": loss_params,
        "sampler": {"name": "repeat_factor", "threshold": threshold}, "backend": backend,
        "class_counts": dict(zip(data.names, data.counts.astype(int).tolist())), "seed": seed,
    }
    if penalty is not None:
        config["logit_penalty"] = {"weight": penalty.weight, "from_step": penalty.start,
                                   "kernel": "overwrites grad" if penalty.overwrite else "adds into grad"}
    loss = tracker.loss("class_weighted_bce", backend=backend, **loss_params)
    sampler = tracker.sampler("repeat_factor", labels=data.labels(), threshold=threshold, seed=seed, rank=0,
                              world_size=1)
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
            values = {"loss/total": result.loss, "lr": lr}
            if penalty is not None and step >= penalty.start:
                values["loss/logit_penalty"] = penalty(logits, grad)
            model.w -= lr * (x.T @ grad)
            model.b -= lr * grad.sum(axis=0)
            run.log(values, step=step)
            if step % 10 == 0:
                run.log_classes("loss/cls", result.per_class / len(idx), step=step)
            if on_checkpoint and step % 50 == 0:
                on_checkpoint(step, model)
            if interrupt_at is not None and step == interrupt_at:
                raise Preempted(f"simulated preemption at step {step}")


@dataclass
class QuickDemo:
    """The run ids of the quick demo's three runs."""

    plain: str
    weighted: str
    overwrite: str

    @property
    def run_ids(self) -> list[str]:
        return [self.plain, self.weighted, self.overwrite]


def run_quick(steps: int, home: str | None, tag: str, say: Callable[[str], None] = print) -> QuickDemo:
    """Train the three runs of the module doc (``steps`` each) under ``home``; ``say`` tells the story.

    Run ids are ``demo-<tag>-plain``, ``-weighted`` and ``-overwrite``. Run B is
    interrupted at 45% of ``steps`` and resumed from its last checkpoint (every 50
    steps) with sampler seed ``RESUME_SEED``; run C's penalty starts at 40% of ``steps``.
    """
    data = make_dataset()
    backend = pick_backend()
    where = "Vulkan compute" if backend == "vulkan" else "numpy (no Vulkan device here)"
    say(f"[bold]tracker demo[/]: {len(data.names)} classes with COCO train2017 frequencies, "
        f"{SAMPLES} synthetic samples; loss kernels on [cyan]{where}[/]")
    demo = QuickDemo(f"demo-{tag}-plain", f"demo-{tag}-weighted", f"demo-{tag}-overwrite")
    say(f"run 1 [cyan]{demo.plain}[/]: plain BCE, uniform shuffling (every repeat factor is 1)")
    train(data, run_id=demo.plain, name="plain BCE", loss_params={"scheme": "none"}, threshold=1e-9,
          steps=steps, backend=backend, home=home)
    checkpoints: dict[int, Model] = {}
    weighted = {"scheme": "effective_number", "beta": 0.999, "counts": data.counts.tolist()}
    say(f"run 2 [cyan]{demo.weighted}[/]: class-weighted BCE (effective number) + repeat-factor sampling")
    try:
        train(data, run_id=demo.weighted, name="weighted BCE + RFS", loss_params=weighted, threshold=0.02,
              steps=steps, backend=backend, home=home, interrupt_at=steps * 45 // 100,
              on_checkpoint=lambda s, m: checkpoints.__setitem__(s, m.copy()))
    except Preempted as exc:
        resume_step = max(checkpoints)
        say(f"  [yellow]interrupted[/]: {exc}; resuming from the checkpoint of step {resume_step} "
            f"with sampler seed {RESUME_SEED}")
        train(data, run_id=demo.weighted, name="weighted BCE + RFS", loss_params=weighted, threshold=0.02,
              steps=steps, backend=backend, home=home, resume_from=(resume_step, checkpoints[resume_step]),
              seed=RESUME_SEED)
    penalty = Penalty(PENALTY_WEIGHT, start=steps * 40 // 100, overwrite=True)
    say(f"run 3 [cyan]{demo.overwrite}[/]: run 2's recipe + a logit penalty from step {penalty.start} whose "
        "kernel overwrites the gradient instead of adding into it (grad[...] = g, not grad += g)")
    train(data, run_id=demo.overwrite, name="weighted BCE + penalty (grad overwrite bug)", loss_params=weighted,
          threshold=0.02, steps=steps, backend=backend, home=home, penalty=penalty)
    return demo
