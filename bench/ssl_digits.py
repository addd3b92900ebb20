"""Self-supervised trainings on scikit-learn's bundled digits, with Lightning, tracked by ``TrackerLogger``.

Each run trains for real (torch on the CPU, one thread) a small MLP on the 1,797
8x8 images of ``sklearn.datasets.load_digits`` with two augmented views per image
(a random shift of up to one pixel, 20% of the pixels dropped, Gaussian noise),
and logs through Lightning: ``train/loss`` (and the loss components) per step, and
the projector's outputs of the first view through :class:`TrackerCallback`
(``log_embeddings("proj", z)``: ``proj/rankme``, ``proj/std``, ``proj/dead_dims``).
At the end, :func:`knn_accuracy` of the backbone's features (5-NN, cosine, on a
held-out fifth of the images) tells collapsed from healthy representations
independently of those statistics.

Methods (:data:`METHODS`):

``simsiam``          SimSiam: predictor, ``negative_cosine`` with the stop-gradient on the target
``simsiam_nostop``   the same without the stop-gradient (SimSiam's Fig. 2: collapses at once)
``simsiam_nopred``   without the predictor (SimSiam's Table 1: collapses)
``simclr``           SimCLR: ``nt_xent`` (temperature 0.5), the healthy control
``vicreg``           VICReg with its default weights
``vicreg_inv``       VICReg with the variance and covariance terms off (mu = nu = 0): collapses
``barlow``           Barlow Twins

Run one: ``python -m bench.ssl_digits simsiam_nostop --steps 400`` (prints the record as JSON).
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

METHODS = ("simsiam", "simsiam_nostop", "simsiam_nopred", "simclr", "vicreg", "vicreg_inv", "barlow")
COLLAPSING = ("simsiam_nostop", "simsiam_nopred", "vicreg_inv")
BATCH = 256
DIM = 64
WINDOW = 4096


@dataclass
class Record:
    """What one training measured."""

    method: str
    seed: int
    steps: int
    run_id: str
    seconds: float
    knn_accuracy: float
    final: dict[str, float] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)


def digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train and held-out images (float32, in [0, 1]) and labels: a stratified 80/20 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xa, xb, ya, yb = train_test_split(x, y, test_size=0.2, stratify=y, random_state=seed)
    return xa, xb, ya, yb


def augment(x: Any, generator: Any) -> Any:
    """One random view of a batch of flattened 8x8 images (torch tensors)."""
    import torch

    n = x.shape[0]
    img = x.reshape(n, 8, 8)
    dx, dy = (int(v) for v in torch.randint(-1, 2, (2,), generator=generator))
    img = torch.roll(img, shifts=(dy, dx), dims=(1, 2))
    keep = (torch.rand(img.shape, generator=generator) > 0.2).to(img.dtype)
    return (img * keep + 0.1 * torch.randn(img.shape, generator=generator)).reshape(n, 64)


def _modules(method: str) -> tuple[Any, Any, Any]:
    from torch import nn

    backbone = nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 64))
    projector = nn.Sequential(nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, DIM))
    predictor = None
    if method in ("simsiam", "simsiam_nostop"):
        predictor = nn.Sequential(nn.Linear(DIM, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, DIM))
    return backbone, projector, predictor


def make_module(method: str, seed: int, lr: float = 0.05) -> Any:
    """The LightningModule of ``method``: it exposes ``tracker_embeddings`` after each step."""
    import lightning.pytorch as pl
    import torch

    from tracker import torch_ssl

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")

    class SSL(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.save_hyperparameters({"method": method, "seed": seed, "lr": lr, "batch": BATCH, "dim": DIM})
            torch.manual_seed(seed)
            self.backbone, self.projector, self.predictor = _modules(method)
            self.generator = torch.Generator().manual_seed(seed + 1)
            self.tracker_embeddings: dict[str, Any] | None = None
            if method.startswith("simsiam"):
                self.loss_fn: Any = torch_ssl.NegativeCosineLoss("none" if method == "simsiam_nostop" else "target")
            elif method == "simclr":
                self.loss_fn = torch_ssl.NTXentLoss(temperature=0.5)
            elif method == "vicreg":
                self.loss_fn = torch_ssl.VICRegLoss()
            elif method == "vicreg_inv":
                self.loss_fn = torch_ssl.VICRegLoss(mu=0.0, nu=0.0)
            else:
                self.loss_fn = torch_ssl.BarlowTwinsLoss()

        def embed(self, x: Any) -> Any:
            return self.projector(self.backbone(x))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            (x,) = batch
            z1, z2 = self.embed(augment(x, self.generator)), self.embed(augment(x, self.generator))
            if self.predictor is not None:
                p1, p2 = self.predictor(z1), self.predictor(z2)
                loss = 0.5 * (self.loss_fn(p1, z2) + self.loss_fn(p2, z1))
            elif method == "simsiam_nopred":
                loss = 0.5 * (self.loss_fn(z1, z2) + self.loss_fn(z2, z1))
            else:
                loss = self.loss_fn(z1, z2)
            self.log("train/loss", loss, on_step=True, prog_bar=False)
            self.tracker_embeddings = {"proj": z1.detach()}
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)

    return SSL()


def knn_accuracy(module: Any, seed: int, k: int = 5) -> float:
    """5-NN accuracy (cosine) of the backbone's features: held-out images against the training ones."""
    import torch
    from sklearn.neighbors import KNeighborsClassifier

    xa, xb, ya, yb = digits(seed)
    module.eval()
    with torch.no_grad():
        fa = module.backbone(torch.from_numpy(xa)).numpy()
        fb = module.backbone(torch.from_numpy(xb)).numpy()
    knn = KNeighborsClassifier(n_neighbors=k, metric="cosine").fit(fa, ya)
    return float(knn.score(fb, yb))


def train(method: str, steps: int = 300, seed: int = 0, *, project: str = "ssl-digits", window: int = WINDOW,
          every: int | None = None) -> Record:
    """Train ``method`` for ``steps`` steps with Lightning and the tracker; returns the record."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

    import tracker
    from tracker.integrations.lightning import TrackerCallback, TrackerLogger

    torch.set_num_threads(1)
    xa, _, _, _ = digits(seed)
    batches = BatchSampler(RandomSampler(range(len(xa)), generator=torch.Generator().manual_seed(seed)), BATCH,
                           drop_last=True)
    loader = DataLoader(TensorDataset(torch.from_numpy(xa)), batch_size=None, sampler=batches)  # one fetch a batch
    module = make_module(method, seed)
    logger = TrackerLogger(project, name=f"{method}-s{seed}", tags=[method], system=False)
    options: dict[str, Any] = {"window": window} | ({"every": every} if every else {})
    trainer = pl.Trainer(max_steps=steps, logger=logger, callbacks=[TrackerCallback(**options)],
                         accelerator="cpu", devices=1, log_every_n_steps=1, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(does not have many workers|number of training batches).*")
        trainer.fit(module, loader)
    seconds = time.perf_counter() - t0
    run_id = logger.version
    final = tracker.query(
        "SELECT key, arg_max(value, step) AS value FROM curves WHERE run_id = ? AND key LIKE 'proj/%' GROUP BY key",
        [run_id],
    )
    events = tracker.query("SELECT step, key, message FROM events WHERE run_id = ? AND kind = 'collapse' "
                           "ORDER BY step, key", [run_id])
    return Record(method, seed, steps, run_id, seconds, knn_accuracy(module, seed),
                  dict(zip(final["key"].to_list(), final["value"].to_list())), events.to_dicts())


def main(argv: list[str] | None = None) -> None:
    """Train one method and print its record as JSON."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("method", choices=METHODS)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("TRACKER_SYSTEM", "0")
    print(json.dumps(asdict(train(args.method, args.steps, args.seed)), indent=1))


if __name__ == "__main__":
    sys.exit(main())
