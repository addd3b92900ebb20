"""track() leaves a seeded Ultralytics training its random streams: the same batches, the same losses.

The first tracked training of a process imports the tracker's plugins (``rich`` draws
from Python's ``random`` at import); Ultralytics seeds before the callbacks run and its
augmentations draw from that stream. A fresh child process (nothing of the tracker
imported yet) trains YOLO11n once untracked, then once tracked, and prints each step's loss.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracker.integrations.yolo_demo import child_env
from tracker.integrations.yolo_synthetic import make_dataset

pytestmark = pytest.mark.slow

CHILD = r"""
import json, sys
from ultralytics import YOLO
from ultralytics.utils import LOGGER
LOGGER.setLevel(40)
data, workdir = sys.argv[1], sys.argv[2]
out = {}
for setting in ("none", "track"):
    model = YOLO("yolo11n.yaml")
    losses = []
    model.add_callback("on_train_batch_end", lambda t: losses.append(float(t.loss.detach().sum())))
    if setting == "track":
        assert "tracker.host" not in sys.modules and "rich" not in sys.modules, "the child must start clean"
        from tracker.integrations.ultralytics import track
        track(model, project="rng", name=setting)
    model.train(data=data, epochs=1, imgsz=32, batch=4, nbs=4, device="cpu", workers=0, plots=False, val=False,
                project=workdir + "/runs", name=setting, verbose=False, amp=False, seed=0, exist_ok=True)
    out[setting] = losses
print("LOSSES " + json.dumps(out))
"""


def test_tracked_training_sees_the_same_batches_as_untracked(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data", train=12, val=4, imgsz=32)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(data.yaml), str(tmp_path)], capture_output=True,
                          text=True, env=child_env(tmp_path, tmp_path / "home"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("LOSSES "))
    losses = json.loads(line[len("LOSSES "):])
    assert len(losses["none"]) == 3
    assert losses["track"] == losses["none"]  # bit for bit: same augmentations, same computation
