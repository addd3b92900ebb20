"""The real-detector demo: YOLO11n trained with Ultralytics on a synthetic COCO-long-tail dataset.

Two runs train YOLO11n from ``yolo11n.yaml`` (no weights are downloaded): run A
with Ultralytics' stock BCE, run B with class-weighted BCE (effective-number
weights from the training labels) and repeat-factor sampling. Run B is killed
with SIGKILL in the middle of an epoch and resumed from its ``last.pt``; its
curves show one resume mark and no duplicate or gap.

Each training runs in a child process (``python -m tracker.integrations.yolo_demo train SPEC``)
so that the kill is a real ``kill -9``; the tests use the same entry point.
Everything is written under one work folder (the dataset, Ultralytics' runs and
its private offline configuration) and TRACKER_HOME.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tracker.errors import ConfigError, RunError

PAUSE_FILE = "paused-at"


@dataclass
class TrainSpec:
    """One training in a child process."""

    workdir: str
    data: str
    name: str
    epochs: int = 2
    imgsz: int = 64
    batch: int = 8
    loss: str | None = None
    loss_params: dict[str, Any] = field(default_factory=dict)
    rfs_threshold: float | None = None
    resume: bool = False
    pause_at: tuple[int, int] | None = None  # (epoch, batch): write PAUSE_FILE there and wait to be killed
    project: str = "yolo-demo"
    guard_network: bool = False
    seed: int = 0
    optimizer: str = "AdamW"
    lr0: float = 0.003
    flush_interval: float | None = None  # track()'s flush_interval; None: its default


def child_env(workdir: str | Path, home: str | Path) -> dict[str, str]:
    """The environment of a training child: offline Ultralytics config under ``workdir``, TRACKER_HOME."""
    from tracker.integrations.ultralytics_env import offline_config

    env = dict(os.environ)
    env.update(offline_config(Path(workdir) / "ultralytics-config"))
    env["TRACKER_HOME"] = str(Path(home).resolve())
    root = str(Path(__file__).resolve().parents[2])  # where `tracker` is importable from
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


NETWORK_LOG = "network-attempts.txt"


def _guard_network(workdir: str) -> None:
    """Make any outgoing connection or name lookup in this process raise, and record it in NETWORK_LOG.

    The record matters: Ultralytics catches most errors of its network probes.
    """
    import socket

    record = Path(workdir) / NETWORK_LOG

    def refuse(what: Any) -> Any:
        with record.open("a") as f:
            f.write(f"{what!r}\n")
        raise OSError(f"network access attempted during training: {what!r}")

    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guarded(original: Any) -> Any:
        def call(self: socket.socket, address: Any) -> Any:
            if self.family == socket.AF_UNIX:
                return original(self, address)
            return refuse(address)
        return call

    socket.create_connection = lambda address, *a, **k: refuse(address)  # type: ignore[assignment]
    socket.getaddrinfo = lambda host, *a, **k: refuse(host)  # type: ignore[assignment]
    socket.socket.connect = guarded(connect)  # type: ignore[method-assign]
    socket.socket.connect_ex = guarded(connect_ex)  # type: ignore[method-assign]


def _pause_callback(spec: TrainSpec) -> Any:
    epoch, batch = spec.pause_at or (-1, -1)
    seen = {"batch": 0}

    def on_train_epoch_start(trainer: Any) -> None:
        seen["batch"] = 0

    def on_train_batch_end(trainer: Any) -> None:
        seen["batch"] += 1
        if int(trainer.epoch) == epoch and seen["batch"] - 1 == batch:
            (Path(spec.workdir) / PAUSE_FILE).write_text(f"{epoch} {batch}\n")
            time.sleep(600)  # the parent kills this process with SIGKILL

    return on_train_epoch_start, on_train_batch_end


def train(spec: TrainSpec) -> None:
    """Run one training as ``spec`` says (in this process)."""
    if spec.guard_network:
        _guard_network(spec.workdir)
    from ultralytics import YOLO

    from tracker.integrations.ultralytics import track
    from tracker.integrations.ultralytics_data import repeat_factor_trainer

    runs = Path(spec.workdir) / "runs"
    trainer = repeat_factor_trainer(threshold=spec.rfs_threshold) if spec.rfs_threshold else None
    model = YOLO(str(runs / spec.name / "weights" / "last.pt") if spec.resume else "yolo11n.yaml")
    flush = {} if spec.flush_interval is None else {"flush_interval": spec.flush_interval}
    track(model, project=spec.project, name=spec.name, loss=spec.loss, **flush, **spec.loss_params)
    if spec.pause_at is not None:
        start, end = _pause_callback(spec)
        model.add_callback("on_train_epoch_start", start)
        model.add_callback("on_train_batch_end", end)
    if spec.resume:
        model.train(resume=True, trainer=trainer)
        return
    model.train(data=spec.data, epochs=spec.epochs, imgsz=spec.imgsz, batch=spec.batch, nbs=spec.batch,
                device="cpu", workers=0, plots=False, project=str(runs), name=spec.name, exist_ok=False,
                verbose=False, amp=False, seed=spec.seed, optimizer=spec.optimizer, lr0=spec.lr0,
                trainer=trainer)


def run_child(spec: TrainSpec, home: str | Path, *, kill_after_pause_s: float = 1.5,
              log: Any = None, timeout: float = 900, extra_env: dict[str, str] | None = None) -> int:
    """Train ``spec`` in a child process; with ``pause_at``, SIGKILL it once it pauses there.

    Returns the child's exit status (``-SIGKILL`` after a kill). ``kill_after_pause_s``
    lets the run's flusher write what was logged before the kill (it flushes every second).
    """
    marker = Path(spec.workdir) / PAUSE_FILE
    marker.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "tracker.integrations.yolo_demo", "train", json.dumps(asdict(spec))]
    env = {**child_env(spec.workdir, home), **(extra_env or {})}
    proc = subprocess.Popen(cmd, env=env, cwd=spec.workdir,
                            stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if spec.pause_at is not None and marker.exists():
                time.sleep(kill_after_pause_s)
                os.kill(proc.pid, signal.SIGKILL)
                return proc.wait()
            if time.monotonic() > deadline:
                raise RunError(f"training {spec.name!r} did not finish within {timeout:.0f} s")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if spec.pause_at is not None:
        raise RunError(f"training {spec.name!r} ended (status {proc.returncode}) before pausing at {spec.pause_at}")
    return proc.returncode


@dataclass
class DemoResult:
    """What the demo trained: the two run ids, where its files are, and the training time."""

    plain: str
    weighted: str
    workdir: Path
    seconds: float
    kill_status: int


def _run_id(workdir: Path, name: str) -> str:
    state = workdir / "runs" / name / "tracker.json"
    if not state.is_file():
        raise RunError(f"training {name!r} wrote no {state}; see {workdir / (name + '.log')}")
    return str(json.loads(state.read_text())["run_id"])


def run_demo(home: str | Path | None, tag: str, *, train_images: int = 256, val_images: int = 64,
             epochs: int = 10, imgsz: int = 64, batch: int = 16, rfs_threshold: float = 0.05,
             kill_at: tuple[int, int] | None = None, echo: Any = print) -> DemoResult:
    """Generate the dataset, train run A, train run B until killed mid-epoch, resume it.

    ``kill_at`` is (epoch index, batch index); by default the middle epoch, a few batches in.
    """
    if epochs < 2:
        raise ConfigError(f"epochs is {epochs!r}; the demo needs at least 2 to kill and resume run B")
    kill_at = kill_at or (epochs // 2, max(0, min(4, train_images // batch // 2 - 1)))
    from tracker.integrations.yolo_synthetic import make_dataset
    from tracker.spool import home_dir

    root = home_dir(home)
    workdir = root / "yolo-demo" / tag
    workdir.mkdir(parents=True, exist_ok=False)
    data = make_dataset(workdir / "data", train=train_images, val=val_images, imgsz=imgsz)
    present = int((data.train_counts > 0).sum())
    echo(f"dataset: {train_images} + {val_images} synthetic images of {imgsz}px, {int(data.train_counts.sum())} "
         f"training boxes in {present} of 80 COCO classes (person {int(data.train_counts[0])}); {workdir}")
    common = {"workdir": str(workdir), "data": str(data.yaml), "epochs": epochs, "imgsz": imgsz, "batch": batch}
    plain = TrainSpec(name=f"plain-{tag}", **common)
    weighted = TrainSpec(name=f"weighted-rfs-{tag}", loss="class_weighted_bce",
                         loss_params={"scheme": "effective_number", "beta": 0.999},
                         rfs_threshold=rfs_threshold, **common)
    t0 = time.perf_counter()
    for spec, what in ((plain, "stock BCE"), (weighted, "class-weighted BCE + repeat-factor sampling")):
        echo(f"training {spec.name}: YOLO11n from yolo11n.yaml, {what}, {epochs} epochs")
        with open(workdir / f"{spec.name}.log", "ab") as log:
            if spec is weighted:
                killed = run_child(TrainSpec(**{**asdict(spec), "pause_at": kill_at}), root, log=log)
                echo(f"  killed with SIGKILL in epoch {kill_at[0] + 1}, after batch {kill_at[1] + 1}; "
                     "resuming from last.pt")
                spec = TrainSpec(**{**asdict(spec), "resume": True})
            status = run_child(spec, root, log=log)
        if status != 0:
            raise RunError(f"training {spec.name!r} failed (exit {status}); see {workdir / (spec.name + '.log')}")
    seconds = time.perf_counter() - t0
    return DemoResult(_run_id(workdir, plain.name), _run_id(workdir, weighted.name), workdir, seconds, killed)


def main(argv: list[str]) -> int:
    """``python -m tracker.integrations.yolo_demo train SPEC_JSON``."""
    if len(argv) != 2 or argv[0] != "train":
        print("usage: python -m tracker.integrations.yolo_demo train SPEC_JSON", file=sys.stderr)
        return 2
    raw = json.loads(argv[1])
    if raw.get("pause_at") is not None:
        raw["pause_at"] = tuple(raw["pause_at"])
    train(TrainSpec(**raw))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
