"""The digits trainings of the fault corpus: a small CNN on scikit-learn's bundled digits, one fault per run.

Each run trains for real (``torch``, one CPU thread) on the 1,797 8x8 images of
``sklearn.datasets.load_digits`` (split 80/20, stratified, by the run's seed) and
logs as a user's loop would: ``train/loss`` and ``lr`` per step, the per-class
vector ``train/cls_loss`` (each class's share of the batch loss: it sums to
``train/loss``), ``sys/data_time`` (seconds the step waited for its batch), and per
epoch ``val/loss``, ``metrics/accuracy`` and ``epoch``; the system sampler is on.

Faults (each made the way it happens in practice; :data:`TWINS` names each one's
healthy twin, the same run without the fault):

``lr_high``      a step schedule whose factor is 10 where 0.05 was meant, from ``onset``: the loss
                 diverges to chance level and stays there
``fp16``         the model in float16 throughout (``model.half()``: no float32 master weights, no
                 loss scaler) with Adam, whose epsilon (1e-8) is 0 in float16: the first update
                 overflows and the weights turn NaN (twin ``fp16_scaled``: autocast to float16
                 with float32 weights and a ``GradScaler``, the way AMP is meant to run)
``overwrite``    the loss is a custom ``torch.autograd.Function`` (cross-entropy plus a logit
                 penalty) whose backward assigns the penalty's gradient instead of adding it:
                 the cross-entropy's gradient is lost, the loss never falls (twin: ``+=``)
``leak_fast``    from ``onset``, each step's pooled features are kept in a list (~60 KB a step)
``leak_slow``    from ``onset``, each step's softmax outputs are kept in a list (~2 KB a step)
``stall``        from ``onset``, the dataset sleeps 0.1 ms per item (a slow disk or a network drive)
``slowdown``     from ``onset``, every step also scores the validation set (an early-stopping check
                 moved into the batch loop): each step takes about three times as long
``empty_class``  the training labels of one class are dropped (a filter bug)
``tiny``         a tiny training set (10 images per class) and no regularisation: overfitting
``imbalance``    one class keeps 3 training images: it never learns

Labels (:class:`bench.faults_labels.Label`) are written by the run itself: the
fault's injection step, or what it measured (the first non-finite loss, the epoch of
the best validation loss, the rare class's validation recall).

Run one training: ``python -m bench.faults_digits SPEC_JSON`` (prints the record as JSON).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

FAULTS = ("healthy", "lr_high", "fp16", "fp16_scaled", "overwrite", "overwrite_add", "leak_fast", "leak_slow",
          "stall", "slowdown", "empty_class", "tiny", "imbalance")
TWINS = {"fp16": "fp16_scaled", "overwrite": "overwrite_add"}
SYSTEM_FAULTS = ("leak_fast", "leak_slow", "stall", "slowdown")
EMPTY_CLASS = 8
RARE_CLASS = 8
BATCH = 32


@dataclass
class DigitsSpec:
    """One digits training: the fault, its seed, its length and when the fault starts."""

    fault: str = "healthy"
    seed: int = 0
    epochs: int = 60
    onset_epoch: int | None = None
    lr: float = 0.05
    lr_factor: float = 10.0
    interval: float = 0.2
    project: str = "faults-digits"
    name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def label_name(self) -> str:
        """The run's name: ``digits-<fault>-s<seed>``."""
        return self.name or f"digits-{self.fault}-s{self.seed}"


def _split(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    xt, xv, yt, yv = train_test_split(x, y, test_size=0.2, stratify=y, random_state=seed)
    return xt, xv, yt.astype(np.int64), yv.astype(np.int64)


def _subset(spec: DigitsSpec, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([spec.seed, 7])
    if spec.fault == "empty_class":
        keep = y != EMPTY_CLASS
    elif spec.fault == "tiny":
        keep = np.zeros(y.size, bool)
        for c in range(10):
            keep[rng.choice(np.flatnonzero(y == c), 10, replace=False)] = True
    elif spec.fault == "imbalance":
        keep = y != RARE_CLASS
        keep[rng.choice(np.flatnonzero(y == RARE_CLASS), 3, replace=False)] = True
    else:
        return x, y
    return x[keep], y[keep]


def _net() -> Any:
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10),
    )


class _Images:
    """A map-style dataset that can be told to sleep per item (the stall fault)."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        import torch

        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.sleep = 0.0

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        if self.sleep:
            time.sleep(self.sleep)
        return self.x[i], self.y[i]


def _fused_loss(assign: bool) -> Any:
    """Cross-entropy + 1e-3 * mean squared logit as one autograd.Function that fills one gradient buffer."""
    import torch

    class FusedLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, logits: Any, target: Any) -> Any:
            p = torch.softmax(logits, dim=1)
            ctx.save_for_backward(logits, p, target)
            ce = torch.nn.functional.cross_entropy(logits, target)
            return ce + 1e-3 * (logits ** 2).mean()

        @staticmethod
        def backward(ctx: Any, out: Any) -> Any:
            logits, p, target = ctx.saved_tensors
            n = logits.shape[0]
            grad = torch.zeros_like(logits)
            grad += (p - torch.nn.functional.one_hot(target, logits.shape[1]).to(p.dtype)) / n
            penalty = 2e-3 * logits / logits.numel()
            if assign:
                grad[...] = penalty  # the bug: = where += was meant; the cross-entropy's gradient is gone
            else:
                grad += penalty
            return grad * out, None

    return FusedLoss.apply


@dataclass
class _State:
    step: int = 0
    kept: list[Any] = field(default_factory=list)
    train: list[float] = field(default_factory=list)
    first_nan: int | None = None
    val: list[tuple[int, float]] = field(default_factory=list)
    rare_recall: float | None = None


def _lr(spec: DigitsSpec, epoch: int) -> float:
    decay = int(spec.epochs * 2 / 3)
    factor = spec.lr_factor if spec.fault == "lr_high" else 0.05
    at = spec.onset_epoch if spec.fault == "lr_high" and spec.onset_epoch is not None else decay
    return spec.lr * (factor if epoch >= at else 1.0)


def _optimizer(spec: DigitsSpec, model: Any) -> Any:
    import torch

    if spec.fault in ("fp16", "fp16_scaled"):
        return torch.optim.Adam(model.parameters(), lr=1e-3)
    return torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=0.9)


def _evaluate(model: Any, xv: Any, yv: Any) -> tuple[float, float, np.ndarray]:
    import torch

    with torch.no_grad():
        logits = model(xv.to(next(model.parameters()).dtype)).float()
        loss = float(torch.nn.functional.cross_entropy(logits, yv))
        pred = logits.argmax(1)
    hit = (pred == yv).numpy()
    recall = np.array([hit[yv.numpy() == c].mean() for c in range(10)])
    return loss, float(hit.mean()), recall


def _step(spec: DigitsSpec, model: Any, opt: Any, scaler: Any, loss_fn: Any, xb: Any, yb: Any) -> tuple[Any, Any, Any]:
    """Forward, backward and update; returns (loss, logits, pooled features)."""
    import torch

    if spec.fault == "fp16":
        feats = model[:6](xb.half())
        logits = model[6:](feats)
        loss = torch.nn.functional.cross_entropy(logits, yb)
    elif spec.fault == "fp16_scaled":
        with torch.autocast("cpu", dtype=torch.float16):
            feats = model[:6](xb)
            logits = model[6:](feats)
        loss = torch.nn.functional.cross_entropy(logits.float(), yb)
    else:
        feats = model[:6](xb)
        logits = model[6:](feats)
        loss = loss_fn(logits, yb)
    opt.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()
    return loss.detach(), logits.detach(), feats.detach()


def _inject(spec: DigitsSpec, st: _State, dataset: _Images, onset: int | None) -> None:
    if onset is None or st.step != onset:
        return
    if spec.fault == "stall":
        dataset.sleep = 0.0001


def _per_class(logits: Any, yb: Any) -> np.ndarray:
    import torch

    ce = torch.nn.functional.cross_entropy(logits.float(), yb, reduction="none").numpy().astype(np.float64)
    return np.bincount(yb.numpy(), weights=ce, minlength=10)[:10] / yb.shape[0]


class _Training:
    """One run's model, optimiser, data and tracker run, stepped epoch by epoch."""

    def __init__(self, spec: DigitsSpec, home: Any) -> None:
        import torch

        import tracker

        self.spec, self.torch, self.home = spec, torch, home
        xt, xv, yt, yv = _split(spec.seed)
        xt, yt = _subset(spec, xt, yt)
        self.dataset = _Images(xt, yt)
        self.loader = torch.utils.data.DataLoader(self.dataset, batch_size=min(BATCH, len(self.dataset)),
                                                  shuffle=True, generator=torch.Generator().manual_seed(spec.seed),
                                                  drop_last=True)
        self.per_epoch = len(self.loader)
        self.onset = spec.onset_epoch * self.per_epoch if spec.onset_epoch is not None else None
        self.model = _net().half() if spec.fault == "fp16" else _net()
        self.opt = _optimizer(spec, self.model)
        self.scaler = torch.amp.GradScaler("cpu") if spec.fault == "fp16_scaled" else None
        self.loss_fn = _fused_loss(spec.fault == "overwrite") if spec.fault.startswith("overwrite") else \
            torch.nn.functional.cross_entropy
        self.xv, self.yv = torch.from_numpy(xv), torch.from_numpy(yv)
        config = {"fault": spec.fault, "seed": spec.seed, "epochs": spec.epochs, "steps_per_epoch": self.per_epoch,
                  "planned_steps": spec.epochs * self.per_epoch, "batch": BATCH, "lr0": spec.lr,
                  "train_images": len(self.dataset)}
        self.run = tracker.init(spec.project, name=spec.label_name(), config=config, system=spec.interval,
                                seed=spec.seed, home=home)
        self.run.set_classes([str(c) for c in range(10)])
        self.st = _State()

    def faulty(self) -> bool:
        """Whether the fault has begun (for faults with an onset)."""
        return self.onset is not None and self.st.step >= self.onset

    def epoch(self, epoch: int) -> None:
        """Train one epoch, then score the validation set."""
        spec, st, run = self.spec, self.st, self.run
        if not spec.fault.startswith("fp16"):
            for group in self.opt.param_groups:
                group["lr"] = _lr(spec, epoch)
        self.model.train()
        batches = iter(self.loader)
        losses: list[float] = []
        while True:
            _inject(spec, st, self.dataset, self.onset)
            wait = time.perf_counter()
            batch = next(batches, None)
            data_time = time.perf_counter() - wait
            if batch is None:
                break
            losses.append(self.batch(batch, data_time))
        self.model.eval()
        vloss, acc, recall = _evaluate(self.model, self.xv, self.yv)
        st.val.append((st.step - 1, vloss))
        st.train.append(float(np.mean(losses)) if losses else float("nan"))
        st.rare_recall = float(recall[RARE_CLASS])
        run.log({"val/loss": vloss, "metrics/accuracy": acc, "epoch": float(epoch + 1)}, step=st.step - 1)

    def batch(self, batch: Any, data_time: float) -> float:
        """One step: train, keep what a leak keeps, log as a user's loop does; returns the loss."""
        spec, st = self.spec, self.st
        loss, logits, feats = _step(spec, self.model, self.opt, self.scaler, self.loss_fn, *batch)
        if self.faulty() and spec.fault == "leak_fast":
            st.kept.append(feats.clone())
        elif self.faulty() and spec.fault == "leak_slow":
            st.kept.append(self.torch.softmax(logits, 1).clone())
        value = float(loss)
        if not np.isfinite(value) and st.first_nan is None:
            st.first_nan = st.step
        self.run.log({"train/loss": value, "lr": self.opt.param_groups[0]["lr"], "sys/data_time": data_time},
                     step=st.step)
        self.run.log_classes("train/cls_loss", _per_class(logits, batch[1]), step=st.step)
        if spec.fault == "slowdown" and self.faulty():
            self.run.log({"val/running_accuracy": _evaluate(self.model, self.xv, self.yv)[1]}, step=st.step)
        st.step += 1
        return value

    def record(self, seconds: float) -> dict[str, Any]:
        """What the run was and measured, with its labels."""
        from bench.faults_labels import digits_labels

        spec, st = self.spec, self.st
        record = {"run_id": self.run.run_id, "name": spec.label_name(), "model": "digits", "fault": spec.fault,
                  "seed": spec.seed, "spec": asdict(spec), "steps": st.step, "steps_per_epoch": self.per_epoch,
                  "onset": self.onset, "first_nan": st.first_nan, "val": st.val, "train": st.train,
                  "rare_recall": st.rare_recall, "seconds": seconds,
                  "kept_bytes": int(sum(t.numel() * t.element_size() for t in st.kept))}
        record["labels"] = [asdict(lb) for lb in digits_labels(record, self.home)]
        return record


def train(spec: DigitsSpec, home: Any = None) -> dict[str, Any]:
    """Train ``spec`` in this process; returns the record (run id, name, labels, what was measured)."""
    import torch

    if spec.fault not in FAULTS:
        raise ValueError(f"unknown fault {spec.fault!r}; one of {', '.join(FAULTS)}")
    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)
    training = _Training(spec, home)
    t0 = time.perf_counter()
    for epoch in range(spec.epochs):
        training.epoch(epoch)
    training.run.finish()
    return training.record(time.perf_counter() - t0)


def main(argv: list[str]) -> int:
    """``python -m bench.faults_digits SPEC_JSON``: train one run, print its record as JSON."""
    if not argv:
        print("one training of the fault corpus: python -m bench.faults_digits SPEC_JSON "
              "(python -m bench.faults builds the corpus)")
        return 0
    if len(argv) != 1:
        print("usage: python -m bench.faults_digits SPEC_JSON", file=sys.stderr)
        return 2
    record = train(DigitsSpec(**json.loads(argv[0])))
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
