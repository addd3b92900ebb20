"""``track(model, on_error=...)`` on real YOLO11n trainings (synthetic data, offline, CPU):
a NaN forced into the logged loss stops the training cleanly, or saves a checkpoint."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

import tracker
from tracker.errors import ConfigError
from tracker.integrations.ultralytics_env import apply_env, offline_config
from tracker.integrations.yolo_synthetic import SyntheticDataset, make_dataset

pytestmark = pytest.mark.slow
BATCH, NAN_AT = 8, (0, 1)  # epoch, batch of the forced NaN


@pytest.fixture(scope="module")
def ultralytics_here(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Ultralytics imported in this process with a private offline configuration."""
    with pytest.MonkeyPatch.context() as mp:
        env = offline_config(tmp_path_factory.mktemp("ultralytics-config"))
        for key, value in env.items():
            mp.setenv(key, value)
        if "ultralytics" not in sys.modules:
            apply_env(env)
        import ultralytics

        yield ultralytics


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> SyntheticDataset:
    return make_dataset(tmp_path_factory.mktemp("yolo-data"), train=32, val=8, imgsz=64)


def _train(data: SyntheticDataset, tmp_path: Path, on_error: str, epochs: int) -> Any:
    from ultralytics import YOLO

    from tracker.integrations.ultralytics import track

    model = YOLO("yolo11n.yaml")
    seen = {"batch": 0}

    def force_nan(trainer: Any) -> None:  # before track()'s callback: the logged loss items are NaN once
        if (int(trainer.epoch), seen["batch"]) == NAN_AT:
            trainer.loss_items = {k: math.nan for k in trainer.loss_items}
        seen["batch"] += 1

    model.add_callback("on_train_epoch_start", lambda trainer: seen.update(batch=0))
    model.add_callback("on_train_batch_end", force_nan)
    track(model, project="actions", on_error=on_error)
    model.train(data=str(data.yaml), epochs=epochs, imgsz=64, batch=BATCH, nbs=BATCH, device="cpu", workers=0,
                plots=False, project=str(tmp_path / "runs"), name=on_error, verbose=False, amp=False, val=False)
    return model.trainer


def test_on_error_stop_ends_the_training_cleanly_with_its_checkpoint(ultralytics_here: Any, data: SyntheticDataset,
                                                                    tmp_path: Path) -> None:
    epochs = 10  # stopped after the first or second: the margin is for a slow machine
    trainer = _train(data, tmp_path, "stop", epochs)
    events = tracker.query("SELECT kind, step, message FROM events ORDER BY wall_time")
    kinds = events["kind"].to_list()
    assert "non_finite" in kinds and "training_stopped" in kinds, kinds
    stopped = events.row(kinds.index("training_stopped"))
    print("\nstopped:", stopped)
    with open(Path(trainer.save_dir) / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) < epochs and int(trainer.epoch) < epochs - 1  # it stopped early, at an epoch's end
    assert (Path(trainer.wdir) / "last.pt").is_file()  # the last checkpoint saved
    last = tracker.query("SELECT max(step) AS m FROM curves WHERE key = 'train/box_loss'")["m"][0]
    batches = int(tracker.query("SELECT config FROM runs").row(0)[0].split('"batches_per_epoch": ')[1].split(",")[0])
    assert last < (int(trainer.epoch) + 1) * batches  # no batch after the stop was trained
    assert tracker.query("SELECT status FROM runs")["status"][0] in ("finished", "diverged")


def test_on_error_checkpoint_saves_one_and_trains_on(ultralytics_here: Any, data: SyntheticDataset,
                                                     tmp_path: Path) -> None:
    trainer = _train(data, tmp_path, "checkpoint", 2)
    assert (Path(trainer.wdir) / "on_error.pt").is_file() and (Path(trainer.wdir) / "last.pt").is_file()
    kinds = tracker.query("SELECT kind FROM events")["kind"].to_list()
    assert kinds.count("checkpoint_saved") == 1 and "training_stopped" not in kinds
    assert int(trainer.epoch) == 1  # both epochs trained


def test_on_error_is_checked() -> None:
    from tracker.integrations.ultralytics import track

    class Model:
        def add_callback(self, *args: Any) -> None:
            return None

    with pytest.raises(ConfigError, match="on_error is 'halt'; expected None, 'stop' or 'checkpoint'"):
        track(Model(), on_error="halt")
