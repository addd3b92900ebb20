"""TrackerLogger and TrackerCallback under real multi-process DDP: a Lightning Trainer with
``strategy="ddp"`` on two CPU processes (gloo on 127.0.0.1), then a resume of the same run from
a checkpoint. Lightning's rank-zero rules (hyperparameters once, one version) and the
tracker's (each rank its own segments, rows and statistics) are both checked."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import polars as pl

import tracker

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent(
    """
    import json, os, sys, warnings
    from pathlib import Path

    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    from tracker.integrations.lightning import TrackerCallback, TrackerLogger

    class Tiny(pl.LightningModule):
        def __init__(self, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(4, 3)

        def training_step(self, batch, batch_idx):
            x, y = batch
            out = self.layer(x)
            per_class = ((out - y) ** 2).mean(dim=0)
            self.log("train/loss", per_class.sum())  # this rank's own loss (no sync_dist)
            self.tracker_embeddings = {"out": out.detach()}
            self.tracker_class_losses = {"train/cls": per_class.detach()}
            return per_class.sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    phase, root = sys.argv[1], Path(sys.argv[2])
    torch.manual_seed(0)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, x[:, :3] * 2.0), batch_size=4)
    if phase == "resume" and "DDP_RUN_ID" not in os.environ:  # rank 0, started early: imported, waits for the id
        os.environ["DDP_RUN_ID"] = sys.stdin.readline().strip()  # rank 1 (started by Lightning) inherits it
    resume = {} if phase == "first" else {"run_id": os.environ["DDP_RUN_ID"], "resume": "must"}
    logger = TrackerLogger("ddp", name="tiny", system=False, **resume)
    checkpoints = ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=2, save_top_k=-1)
    trainer = pl.Trainer(
        max_steps=4 if phase == "first" else 6, strategy="ddp", accelerator="cpu", devices=2, logger=logger,
        callbacks=[TrackerCallback(window=8, every=8), checkpoints], log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=root,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(does not have many workers|number of training batches).*")
        trainer.fit(Tiny(), loader, ckpt_path=None if phase == "first" else str(root / "ckpt" / "epoch=0-step=2.ckpt"))
    run = logger.run
    print("RESULT " + json.dumps({
        "global_rank": trainer.global_rank, "version": logger.version, "rank": run.rank, "world": run.world_size,
        "segment": run.segment, "start_step": run.start_step, "hparams": "lr" in run.config,
        "experiment_is_run": logger.experiment is run, "status": run.status,
    }), flush=True)
    """
)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (each socket is held until all are found)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _start(script: Path, phase: str, tmp: Path, env: dict[str, str], port: int) -> subprocess.Popen[str]:
    """Start rank 0 of one two-rank training (Lightning starts rank 1 when it fits)."""
    env = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return subprocess.Popen([sys.executable, str(script), phase, str(tmp)], env=env, cwd=str(tmp),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _results(proc: subprocess.Popen[str], stdin: str = "") -> list[dict[str, Any]]:
    """Wait for one two-rank training (``stdin``: what its rank 0 reads); each rank's RESULT line, by rank."""
    try:
        out, err = proc.communicate(stdin, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:] + err[-6000:]
    results = [json.loads(line[len("RESULT "):]) for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 2, out[-3000:] + err[-3000:]
    return sorted(results, key=lambda r: r["global_rank"])


def test_two_rank_ddp_then_resume(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "ddp_fit.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "TRACKER_HOME": str(home), "PYTHONWARNINGS": "ignore"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TRACKER_RUN_ID"):
        env.pop(name, None)

    # the resume's rank 0 starts now and does its imports (seconds) while the first training runs; it reads the
    # run id, and so begins its own training, only once both ranks of the first training have exited
    first_port, resume_port = _free_ports(2)
    resume = _start(script, "resume", tmp_path, env, resume_port)
    try:
        first = _results(_start(script, "first", tmp_path, env, first_port))
        run_id = first[0]["version"]
        assert [r["version"] for r in first] == [run_id, run_id]  # one run: version = run id on both ranks
        assert [(r["rank"], r["world"], r["segment"], r["start_step"]) for r in first] == [
            (0, 2, 0, 0), (1, 2, 0, 0)]
        assert [r["hparams"] for r in first] == [True, False]  # log_hyperparams: rank zero's, as Lightning's are
        assert [r["experiment_is_run"] for r in first] == [True, False]  # the dummy experiment on rank 1
        assert (tmp_path / "ckpt" / "epoch=0-step=2.ckpt").is_file()
    except BaseException:
        resume.kill()
        resume.communicate()
        raise

    second = _results(resume, run_id + "\n")
    assert [(r["version"], r["rank"], r["segment"], r["start_step"]) for r in second] == [
        (run_id, 0, 1, 2), (run_id, 1, 1, 2)]  # each rank resumes its own segments at the checkpoint's step

    runs = tracker.query("SELECT run_id, name, status, config FROM runs")
    assert runs["run_id"].to_list() == [run_id] and runs["status"][0] == "finished"
    config = json.loads(runs["config"][0])
    assert config["lr"] == 0.1 and config["tracker_embeddings"]["out"] == {"dim": 3, "window": 8, "gamma": 1.0,
                                                                          "every": 8}
    segments = tracker.query("SELECT rank, segment, start_step FROM segments WHERE run_id = ? ORDER BY rank, segment",
                             [run_id])
    assert segments.rows() == [(0, 0, 0), (0, 1, 2), (1, 0, 0), (1, 1, 2)]

    curves = tracker.query("SELECT rank, segment, step, key, value FROM curves WHERE run_id = ?", [run_id])
    loss = curves.filter(pl.col("key") == "train/loss").sort("rank", "step")
    for rank in (0, 1):
        mine = loss.filter(pl.col("rank") == rank)
        assert mine["step"].to_list() == list(range(6))  # no duplicate of steps 2, 3; no gap
        assert mine["segment"].to_list() == [0, 0, 1, 1, 1, 1]
    by_step = loss.pivot(on="rank", index="step", values="value")
    assert (by_step["0"] != by_step["1"]).all()  # each rank logged its own batches' loss
    assert curves.group_by("rank", "step", "key").len()["len"].max() == 1  # no duplicate row anywhere

    stats = curves.filter(pl.col("key").str.starts_with("out/"))
    for rank in (0, 1):  # every rank's callback fed its own embeddings worker: 8 rows each 2 steps
        mine = stats.filter(pl.col("rank") == rank)
        assert set(mine["key"]) == {"out/rankme", "out/std", "out/dead_dims"}
        assert sorted(set(mine["step"])) == [1, 3, 5]
    classes = tracker.query("SELECT rank, step, class_index FROM class_curves WHERE run_id = ? AND key = 'train/cls'",
                            [run_id])
    assert classes.group_by("rank").len().sort("rank").rows() == [(0, 6 * 3), (1, 6 * 3)]
