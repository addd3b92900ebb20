"""The YOLO trainings of the fault corpus: Ultralytics YOLO11n on the generated long-tail detection set.

Each run trains YOLO11n from ``yolo11n.yaml`` (no weights downloaded, Ultralytics
offline: :func:`tracker.integrations.yolo_demo.child_env`) on the synthetic COCO-long-tail set of
:mod:`tracker.integrations.yolo_synthetic`, tracked by
:func:`tracker.integrations.ultralytics.track` (which logs ``sys/data_time``), with
the system sampler on, in its own process. Faults:

``yolo``           healthy
``yolo_no_boxes``  every training label file empty (a conversion that wrote no boxes): the box
                   and DFL losses are 0 at every batch, no anchor is ever positive
``yolo_lr_high``   from ``onset_epoch`` (the warm-up's end), a callback multiplies every learning
                   rate by :data:`LR_STEP` (a step schedule's factor 300 where 1/300 was meant:
                   AdamW at 0.9 instead of 0.003). The train losses jump and stay up; labelled
                   divergence only when they end twice their best before it
                   (:mod:`bench.faults_labels`). Tried on this set and not diverging by that
                   rule (Ultralytics clips gradients at norm 10): SGD (momentum 0.937) without
                   warm-up at ``lr0`` 0.1, 0.3 and 0.5, and at 1 with the warm-up, AdamW at 0.1
                   without (cls spikes up to 1e4 and a loss that stalls above the healthy
                   run's), steps of x30 and x100 (rises of 0-25%); SGD at 1 and AdamW at 1
                   without warm-up and a step of x1000 leave no positive (every loss falls to 0)
``yolo_stall``     from ``onset_epoch``, every image read sleeps 4 ms (a slow network drive)
``yolo_leak``      from ``onset_epoch``, a callback keeps a copy of the model's weights after every
                   batch (a "snapshot for later" list)

Run one: ``python -m bench.faults_yolo SPEC_JSON`` in the environment of ``child_env``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FAULTS = ("yolo", "yolo_no_boxes", "yolo_lr_high", "yolo_stall", "yolo_leak")
LR0 = 0.003
LOSS_KEYS = ("train/box_loss", "train/cls_loss", "train/dfl_loss")
TRAIN_ARGS: dict[str, Any] = {"optimizer": "AdamW", "lr0": LR0}  # Ultralytics' optimizer arguments of every run
LR_STEP = 300.0  # yolo_lr_high: every learning rate times this from onset_epoch (AdamW's 0.003 becomes 0.9)


@dataclass
class YoloSpec:
    """One YOLO training."""

    workdir: str
    data: str
    fault: str = "yolo"
    seed: int = 0
    epochs: int = 8
    onset_epoch: int = 3
    imgsz: int = 64
    batch: int = 16
    project: str = "faults-yolo"
    args: dict[str, Any] = field(default_factory=dict)  # train arguments over TRAIN_ARGS
    lr_step: float | None = None  # the lr fault's factor (LR_STEP where None)

    def train_args(self) -> dict[str, Any]:
        """Ultralytics' optimizer arguments of this run: :data:`TRAIN_ARGS`, then ``args``."""
        return {**TRAIN_ARGS, **self.args}

    def step_factor(self) -> float | None:
        """The factor the lr fault multiplies every learning rate by from ``onset_epoch``; None for other faults."""
        if self.fault != "yolo_lr_high":
            return None
        return LR_STEP if self.lr_step is None else self.lr_step

    def label_name(self) -> str:
        """The run's name: ``<fault>-s<seed>``."""
        return f"{self.fault}-s{self.seed}"


def no_boxes_copy(data_root: Path, dest: Path) -> Path:
    """A copy of the dataset whose training label files are empty; returns its data.yaml."""
    shutil.copytree(data_root, dest, ignore=shutil.ignore_patterns("*.cache"))
    for label in (dest / "labels" / "train").glob("*.txt"):
        label.write_text("")
    text = (dest / "data.yaml").read_text().replace(f"path: {data_root}", f"path: {dest}")
    (dest / "data.yaml").write_text(text)
    return dest / "data.yaml"


def _fault_callbacks(spec: YoloSpec, model: Any) -> list[Any]:
    kept: list[Any] = []

    def on_train_epoch_start(trainer: Any) -> None:
        factor = spec.step_factor()
        if factor is not None and int(trainer.epoch) == spec.onset_epoch:  # before this epoch's scheduler step
            for group in trainer.optimizer.param_groups:
                group["initial_lr"] *= factor
            trainer.scheduler.base_lrs = [lr * factor for lr in trainer.scheduler.base_lrs]
        if spec.fault == "yolo_stall" and int(trainer.epoch) == spec.onset_epoch:
            dataset = trainer.train_loader.dataset
            base = type(dataset)

            class SlowRead(base):  # type: ignore[misc, valid-type]
                def load_image(self, i: int, *args: Any, **kwargs: Any) -> Any:
                    time.sleep(0.004)
                    return super().load_image(i, *args, **kwargs)

            dataset.__class__ = SlowRead

    def on_train_batch_end(trainer: Any) -> None:
        if spec.fault == "yolo_leak" and int(trainer.epoch) >= spec.onset_epoch:
            kept.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})

    model.add_callback("on_train_epoch_start", on_train_epoch_start)
    model.add_callback("on_train_batch_end", on_train_batch_end)
    return kept


def train_here(spec: YoloSpec) -> None:
    """Train ``spec`` in this process (the child)."""
    from ultralytics import YOLO

    from tracker.integrations.ultralytics import track

    model = YOLO("yolo11n.yaml")
    track(model, project=spec.project, name=spec.label_name())
    _fault_callbacks(spec, model)
    model.train(data=spec.data, epochs=spec.epochs, imgsz=spec.imgsz, batch=spec.batch, nbs=spec.batch,
                device="cpu", workers=0, plots=False, project=str(Path(spec.workdir) / "runs"),
                name=spec.label_name(), exist_ok=True, verbose=False, amp=False, seed=spec.seed, val=True,
                **spec.train_args())


def train(spec: YoloSpec, home: Path, interval: float = 0.2, timeout: float = 1200) -> dict[str, Any]:
    """Train ``spec`` in a child process; returns the record with its labels."""
    from tracker.integrations.yolo_demo import child_env

    env = {**child_env(spec.workdir, home), "TRACKER_SYSTEM_INTERVAL": str(interval)}
    env.pop("TRACKER_SYSTEM", None)
    log = Path(spec.workdir) / f"{spec.label_name()}.log"
    t0 = time.perf_counter()
    with log.open("ab") as out:
        code = subprocess.run([sys.executable, "-m", "bench.faults_yolo", json.dumps(asdict(spec))], env=env,
                              cwd=os.getcwd(), stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
    if code != 0:
        raise RuntimeError(f"YOLO training {spec.label_name()} failed (exit {code}); see {log}")
    state = json.loads((Path(spec.workdir) / "runs" / spec.label_name() / "tracker.json").read_text())
    per_epoch = int(state["batches_per_epoch"])
    record = {"run_id": state["run_id"], "name": spec.label_name(), "model": "yolo11n", "fault": spec.fault,
              "seed": spec.seed, "spec": asdict(spec), "train_args": spec.train_args(), "lr_step": spec.step_factor(),
              "steps": spec.epochs * per_epoch, "steps_per_epoch": per_epoch, "onset": spec.onset_epoch * per_epoch,
              "seconds": time.perf_counter() - t0}
    record["labels"] = [asdict(lb) for lb in yolo_labels(record, home)]
    return record


def yolo_labels(record: dict[str, Any], home: Path) -> list[Any]:
    """The labels of one YOLO run (the first non-finite loss is read back from the store)."""
    import tracker
    from bench.faults_labels import Label, divergence_labels, train_curves

    fault, last, onset = record["fault"], int(record["steps"]) - 1, int(record["onset"])
    labels: list[Label] = []
    nan = tracker.query("SELECT min(step) AS s FROM curves WHERE run_id = ? AND key LIKE 'train/%loss' "
                        "AND NOT isfinite(value)", [record["run_id"]], home=home)["s"][0]
    if nan is not None:
        labels.append(Label("non_finite", int(nan), int(nan), int(nan), note="first non-finite loss"))
    if fault == "yolo_no_boxes":
        labels.append(Label("zero_loss", 0, 0, last, key="train/box_loss", note="no training box"))
    elif fault == "yolo_lr_high":
        if record.get("lr_step") is not None:
            start, note = onset, f"lr x{record['lr_step']:g} from this step"
        else:  # the first corpus' fault: lr0 x30 from the start
            start, note = 0, "lr0 x30"
        labels += divergence_labels(record, train_curves(record["run_id"], LOSS_KEYS, home), start, note)
    elif fault == "yolo_stall":
        labels.append(Label("data_stall", onset, onset, last, key="sys/data_time"))
        labels.append(Label("step_time_regression", onset, onset, last, key="sys/step_time", optional=True))
    elif fault == "yolo_leak":
        labels.append(Label("memory_growth", onset, onset, last, key="sys/proc/rss"))
    return labels


def main(argv: list[str]) -> int:
    """``python -m bench.faults_yolo SPEC_JSON``: train one run here."""
    if not argv:
        print("one training of the fault corpus: python -m bench.faults_yolo SPEC_JSON (python -m bench.faults builds "
              "the corpus)")
        return 0
    if len(argv) != 1:
        print("usage: python -m bench.faults_yolo SPEC_JSON", file=sys.stderr)
        return 2
    train_here(YoloSpec(**json.loads(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
