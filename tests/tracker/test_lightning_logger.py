"""TrackerLogger and TrackerCallback against Lightning's Logger API: version, hyperparameters,
rank-zero behaviour, finalize, and resume from a checkpoint (tiny models, real Trainer)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import polars as pl_frame
import pytest
import torch
from lightning.fabric.loggers.logger import _DummyExperiment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers.logger import Logger
from torch.utils.data import DataLoader, TensorDataset

import tracker
from tracker.errors import ConfigError
from tracker.integrations.lightning import TrackerCallback, TrackerLogger


class Tiny(pl.LightningModule):
    """A linear model that exposes its outputs as embeddings and a per-class loss vector."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(4, 3)
        self.tracker_embeddings: dict[str, Any] | None = None

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        out = self.layer(x)
        per_class = ((out - y) ** 2).mean(dim=0)
        self.log("train/loss", per_class.sum())
        self.tracker_embeddings = {"out": out.detach()}
        self.tracker_class_losses = lambda: {"train/cls": per_class.detach()}  # a method works too
        return per_class.sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    return DataLoader(TensorDataset(x, x[:, :3] * 2.0), batch_size=8)


def _fit(logger: TrackerLogger, steps: int, tmp: Path, ckpt_path: str | None = None, **trainer: Any) -> Any:
    trainer_ = pl.Trainer(max_steps=steps, logger=logger, callbacks=[TrackerCallback(window=64, every=16),
                                                                     *trainer.pop("callbacks", [])],
                          accelerator="cpu", devices=1, log_every_n_steps=1, enable_progress_bar=False,
                          enable_model_summary=False, default_root_dir=str(tmp), **trainer)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(does not have many workers|number of training batches).*")
        trainer_.fit(Tiny(), _loader(), ckpt_path=ckpt_path)
    return trainer_


def test_it_is_a_lightning_logger_and_logs_a_whole_training(tmp_path: Path) -> None:
    logger = TrackerLogger("tiny", name="first", config={"data": "random"}, system=False)
    assert isinstance(logger, Logger) and logger.name == "tiny" and logger.save_dir is None
    trainer = _fit(logger, 12, tmp_path, enable_checkpointing=False)
    run_id = logger.version
    assert logger.experiment is logger.run and logger.run.run_id == run_id
    runs = tracker.query("SELECT name, status, config FROM runs WHERE run_id = ?", [run_id])
    assert runs["name"][0] == "first" and runs["status"][0] == "finished"  # finalize("success")
    assert '"lr": 0.1' in runs["config"][0] and '"data": "random"' in runs["config"][0]
    curves = tracker.query("SELECT key, step FROM curves WHERE run_id = ? ORDER BY key, step", [run_id])
    loss = curves.filter(pl_frame.col("key") == "train/loss")["step"].to_list()
    assert loss == list(range(12)) and trainer.global_step == 12
    assert {"out/rankme", "out/std", "out/dead_dims", "epoch"} <= set(curves["key"])
    classes = tracker.query("SELECT step, class_index FROM class_curves WHERE run_id = ? AND key = 'train/cls'",
                            [run_id])
    assert classes.height == 12 * 3


def test_other_ranks_get_the_dummy_experiment_and_no_hyperparameters(monkeypatch: pytest.MonkeyPatch) -> None:
    logger = TrackerLogger("tiny", run_id="ranked", system=False)
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert isinstance(logger.experiment, _DummyExperiment)  # rank_zero_experiment's behaviour
    logger.log_hyperparams({"lr": 1.0})  # rank zero only: ignored here
    logger.log_metrics({"loss": 2.0}, step=0)  # every rank logs into its own segment
    assert logger.run is not None
    logger.finalize("failed")
    assert tracker.query("SELECT status, config FROM runs")["status"][0] == "crashed"
    assert '"lr"' not in tracker.query("SELECT config FROM runs")["config"][0]
    assert tracker.query("SELECT value FROM curves WHERE key = 'loss'")["value"].to_list() == [2.0]


def test_resume_from_a_checkpoint_hides_the_rows_logged_after_it(tmp_path: Path) -> None:
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=10, save_top_k=-1)
    first = TrackerLogger("tiny", run_id="resumable", system=False)
    _fit(first, 16, tmp_path, callbacks=[every])  # checkpoints at 10 batches, then 6 more rows: "crashed"
    checkpoint = tmp_path / "ckpt" / "epoch=1-step=10.ckpt"
    assert checkpoint.is_file()
    second = TrackerLogger("tiny", run_id="resumable", resume="must", system=False)
    assert second.pending  # waits for the checkpoint's step
    _fit(second, 24, tmp_path, ckpt_path=str(checkpoint))
    assert second.run is not None and second.run.start_step == 10
    steps = tracker.query("SELECT step FROM curves WHERE run_id = 'resumable' AND key = 'train/loss' ORDER BY step")
    assert steps["step"].to_list() == list(range(24))  # no duplicate of steps 10..15, no gap
    segments = tracker.query("SELECT segment, start_step FROM segments WHERE run_id = 'resumable' ORDER BY segment")
    assert segments.rows() == [(0, 0), (1, 10)]


def test_the_callback_needs_the_logger_and_a_sane_interval(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="every_n_steps is 0"):
        TrackerCallback(every_n_steps=0)
    trainer = pl.Trainer(max_steps=1, logger=False, callbacks=[TrackerCallback()], accelerator="cpu",
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"needs a TrackerLogger: Trainer\(logger=TrackerLogger"):
        trainer.fit(Tiny(), _loader())
