"""Checkpoint-kill rounds: a training killed with SIGKILL right after it saved a
checkpoint, then resumed from that checkpoint, checking after every round that the
run's curves have no gap and no duplicate and hold every row logged before the save.

Two trainings, each in child processes so the kill is a real ``kill -9``:

* a plain PyTorch-style loop (:func:`plain_rounds`, fast: used by the test suite with
  20 rounds). Every ``EVERY`` steps each rank calls ``run.flush()``, waits for the
  other ranks (a file barrier standing in for ``torch.distributed.barrier()``), and
  rank 0 saves the checkpoint (temp file, fsync, rename: what ``torch.save`` to a
  temporary name and ``os.replace`` do); after 1 to 3 saves rank 0 kills itself a
  random 0 to ``EVERY - 1`` steps and 0 to 20 ms after a save, and the parent kills the
  other ranks at once. The next round resumes every rank at the checkpoint's step.
  ``barrier=False`` leaves ``run.flush()`` out (the control: rows are lost);
* a real Ultralytics YOLO11n training (:func:`yolo_rounds`: a few rounds in the test
  suite, 20 in ``bench/ckpt_kill.py``), killed from inside ``on_model_save`` (right
  after ``last.pt`` is written) at once or after a random delay of up to
  ``max_delay_s``, then resumed with ``YOLO(last.pt).train(resume=True)``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

EVERY = 40
RUN_ID = "ckpt-kill"
# the plain loop needs the store logger only: without these each start takes a third of the time
LOOP_UNUSED_PLUGINS = "csv_logger,losses,ssl_losses,coco,detectors,vulkan_exec,importers"

PLAIN = textwrap.dedent(
    """
    import json, os, random, signal, sys, time
    import tracker
    folder, rank, world, tag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    seed, stop_at, every = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    barrier = os.environ.get("CKPT_BARRIER", "1") == "1"
    rng = random.Random(seed)
    ckpt_path = os.path.join(folder, "ckpt.json")
    ckpt = json.load(open(ckpt_path)) if os.path.exists(ckpt_path) else None
    start = ckpt["step"] if ckpt else 0
    run = tracker.init("ckpt-kill", run_id="ckpt-kill", resume="allow", resume_step=start if ckpt else None,
                       config={"analysis": False, "tracker_flush_interval": float(os.environ.get("CKPT_FLUSH_S", 1))},
                       loggers=["store"], system=False)
    assert run.start_step == start, (run.start_step, start)
    saves, kill_after_saves = 0, rng.randint(1, 3)
    kill_at, nap = None, rng.random() * 0.02
    step = start
    while stop_at < 0 or step < stop_at:
        run.log({"loss": 1.0 / (step + 1) + rank, "lr": 0.01}, step=step)
        step += 1
        if step % every == 0:
            if barrier and not run.flush():
                sys.exit(3)
            open(os.path.join(folder, f"flushed-{tag}-r{rank}-{step}"), "w").close()
            while not all(os.path.exists(os.path.join(folder, f"flushed-{tag}-r{r}-{step}")) for r in range(world)):
                time.sleep(0.001)
            if rank == 0:  # the checkpoint: written to a temp name, fsynced, renamed into place
                tmp = ckpt_path + ".tmp"
                with open(tmp, "w") as fh:
                    json.dump({"step": step}, fh)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, ckpt_path)
                saves += 1
                if stop_at < 0 and saves == kill_after_saves:
                    kill_at = step + rng.randint(0, every - 1)
        if step == kill_at:
            time.sleep(nap)
            os.kill(os.getpid(), signal.SIGKILL)
    run.finish()
    """
)


@dataclass
class RoundReport:
    """What the rounds did and what the checks found (``problems`` empty: no gap, no duplicate)."""

    rounds: int = 0
    checkpoints: list[int] = field(default_factory=list)  # the checkpoint's step (plain) or epoch (YOLO) per round
    problems: list[str] = field(default_factory=list)
    restored_epochs: int = 0  # YOLO: epoch metrics restored from results.csv on resume
    final_steps: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        """One line for humans."""
        verdict = "no gap, no duplicate" if not self.problems else f"{len(self.problems)} problems"
        extra = f", {self.restored_epochs} epoch rows restored from results.csv" if self.restored_epochs else ""
        return (f"{self.rounds} kill rounds right after a checkpoint{extra}; final curve {self.final_steps} steps; "
                f"{verdict} ({self.seconds:.1f} s)")


def curve_problems(home: Path, key: str, rank: int, at_least: int, run_id: str = RUN_ID) -> list[str]:
    """Problems of ``key``'s visible curve on ``rank``: it must be steps ``0..n-1`` once each,
    with ``n >= at_least`` (every row logged before the checkpoint at step ``at_least``)."""
    from tracker.store import Store

    steps = Store(home).query("SELECT step FROM curves WHERE run_id = ? AND rank = ? AND key = ? ORDER BY step",
                              [run_id, rank, key])["step"].to_list()
    out = []
    if len(steps) != len(set(steps)):
        out.append(f"{key} rank {rank}: {len(steps) - len(set(steps))} duplicate steps")
    if sorted(set(steps)) != list(range(len(set(steps)))):
        missing = sorted(set(range(max(steps) + 1)) - set(steps)) if steps else []
        out.append(f"{key} rank {rank}: a gap, steps {missing[:5]}... are missing")
    if len(set(steps)) < at_least:
        out.append(f"{key} rank {rank}: the curve ends at step {len(set(steps)) - 1}, but the checkpoint is at "
                   f"step {at_least}: rows logged before it were lost")
    return out


def _plain_procs(script: Path, folder: Path, env: dict[str, str], world: int, tag: str, seed: int,
                 stop_at: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, str(script), str(folder), str(rank), str(world), tag,
                              str(seed * 100 + rank), str(stop_at), str(EVERY)],
                             env={**env, "RANK": str(rank), "WORLD_SIZE": str(world)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for rank in range(world)]


def _reap(procs: list[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    """Wait for rank 0, then SIGKILL the other ranks (the job dies with it); their statuses."""
    procs[0].wait(timeout=timeout)
    for proc in procs[1:]:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    return [p.returncode for p in procs]


def plain_rounds(folder: Path, home: Path, rounds: int, *, world: int = 2, seed: int = 0, barrier: bool = True,
                 flush_interval_s: float = 1.0, then_steps: int = 2 * EVERY) -> RoundReport:
    """Run ``rounds`` kill-after-checkpoint rounds of the plain loop (module doc), checking the
    curves after each; then one round that finishes ``then_steps`` past the last checkpoint."""
    t0 = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "plain_loop.py"
    script.write_text(PLAIN)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "TRACKER_HOME": str(home), "TRACKER_RUN_ID": RUN_ID, "TRACKER_INGEST_ON_FINISH": "0",
           "TRACKER_DISABLE_PLUGINS": LOOP_UNUSED_PLUGINS,
           "CKPT_BARRIER": "1" if barrier else "0", "CKPT_FLUSH_S": str(flush_interval_s),
           "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    report = RoundReport()
    for i in range(rounds):
        procs = _plain_procs(script, folder, env, world, f"k{i}", seed * 1000 + i, -1)
        codes = _reap(procs, timeout=120)
        if codes[0] != -signal.SIGKILL:
            err = procs[0].stderr.read().decode()[-2000:] if procs[0].stderr else ""
            report.problems.append(f"round {i}: rank 0 ended with status {codes[0]}, not killed: {err}")
            break
        step = json.loads((folder / "ckpt.json").read_text())["step"]
        report.checkpoints.append(step)
        for rank in range(world):
            report.problems += [f"round {i}: {p}" for p in curve_problems(home, "loss", rank, step)]
        report.rounds += 1
    if not report.problems:
        stop = json.loads((folder / "ckpt.json").read_text())["step"] + then_steps if report.rounds else then_steps
        procs = _plain_procs(script, folder, env, world, "final", seed, stop)
        codes = [p.wait(timeout=120) for p in procs]
        if codes != [0] * world:
            report.problems.append(f"the final round ended with statuses {codes}")
        for rank in range(world):
            report.problems += [f"final: {p}" for p in curve_problems(home, "loss", rank, stop)]
            report.problems += [f"final: {p}" for p in curve_problems(home, "lr", rank, stop)]
        report.final_steps = stop
    report.seconds = time.perf_counter() - t0
    return report


# -- Ultralytics --------------------------------------------------------------------------
@dataclass
class YoloSpec:
    """One YOLO11n training in a child process, killed after the checkpoint of ``kill_epoch``."""

    workdir: str
    data: str
    name: str = "ckpt-kill"
    epochs: int = 3
    batch: int = 8
    resume: bool = False
    kill_epoch: int | None = None
    kill_delay_s: float = 0.0
    audit: str | None = None  # record (and refuse) network use in this file (tests.harness.netaudit)


def yolo_child(spec: YoloSpec, audited: bool = False) -> None:
    """Train as ``spec`` says, in this process (``python -m tests.harness.ckpt_kill yolo SPEC``)."""
    if spec.audit and not audited:
        from tests.harness.netaudit import install

        install(spec.audit)
    from ultralytics import YOLO

    from tracker.integrations.ultralytics import track

    last = Path(spec.workdir) / "runs" / spec.name / "weights" / "last.pt"
    model = YOLO(str(last) if spec.resume else "yolo11n.yaml")
    track(model, project="ckpt-kill", name=spec.name)

    def on_model_save(trainer: Any) -> None:  # last.pt is written when this runs
        if int(trainer.epoch) != spec.kill_epoch:
            return
        if spec.kill_delay_s <= 0:
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Timer(spec.kill_delay_s, os.kill, (os.getpid(), signal.SIGKILL)).start()

    model.add_callback("on_model_save", on_model_save)
    if spec.resume:
        model.train(resume=True)
        return
    model.train(data=spec.data, epochs=spec.epochs, imgsz=64, batch=spec.batch, nbs=spec.batch, device="cpu",
                workers=0, plots=False, project=str(Path(spec.workdir) / "runs"), name=spec.name, exist_ok=False,
                verbose=False, amp=False, seed=0, val=True)


def yolo_env(workdir: Path, home: Path, user_settings: bool) -> dict[str, str]:
    """A training child's environment: the tests' offline Ultralytics configuration, or with
    ``user_settings`` the one a user has by default (:func:`tests.harness.netaudit.user_env`)."""
    from tracker.integrations.yolo_demo import child_env

    env = {**child_env(workdir, home), "TRACKER_SYSTEM": "0", "TRACKER_INGEST_ON_FINISH": "0"}
    if user_settings:
        from tests.harness.netaudit import user_env

        env = user_env(workdir / "ultralytics-config", base=env)
    return env


def yolo_waiting(audit: str | None) -> None:
    """Import Ultralytics and the tracker, then read a spec line from stdin and train as it says
    (``python -m tests.harness.ckpt_kill yolo-next [AUDIT]``); no line: exit. A round's child is
    started while the round before it trains, so that its imports (seconds) overlap that training."""
    if audit:
        from tests.harness.netaudit import install

        install(audit)  # before the imports, as in yolo_child
    import ultralytics  # noqa: F401

    import tracker.integrations.ultralytics  # noqa: F401

    line = sys.stdin.readline()
    if line.strip():
        yolo_child(YoloSpec(**json.loads(line)), audited=True)


def _yolo_start(workdir: Path, env: dict[str, str], log: Any, audit: Path | None) -> subprocess.Popen[str]:
    """The next round's child (:func:`yolo_waiting`), importing while it waits for its spec."""
    cmd = [sys.executable, "-m", "tests.harness.ckpt_kill", "yolo-next", *([str(audit)] if audit else [])]
    return subprocess.Popen(cmd, env=env, cwd=str(workdir), stdin=subprocess.PIPE, stdout=log,
                            stderr=subprocess.STDOUT, text=True)


def _yolo_go(proc: subprocess.Popen[str], spec: YoloSpec) -> int:
    """Hand ``spec`` to a started child; its exit status."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(asdict(spec)) + "\n")
        proc.stdin.close()
        return proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _yolo_drop(proc: subprocess.Popen[str]) -> None:
    """End a started child that no round needs (it reads no spec and exits)."""
    assert proc.stdin is not None
    try:
        proc.stdin.close()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def yolo_problems(home: Path, run_id: str, batches: int, done_epochs: int, resumed_epochs: int) -> list[str]:
    """Problems after a round: the per-batch curves hold every step of the ``done_epochs``
    checkpointed epochs, once, without a gap; ``epoch`` holds each epoch a resume has seen
    (``1..resumed_epochs``) once, at its last batch, and nothing else but maybe the next one."""
    from tracker.store import Store

    out = []
    for key in ("train/box_loss", "train/cls_loss", "lr/pg0"):
        out += curve_problems(home, key, 0, done_epochs * batches, run_id=run_id)
    steps = Store(home).query("SELECT step FROM curves WHERE run_id = ? AND key = 'epoch' ORDER BY step",
                              [run_id])["step"].to_list()
    every = [e * batches - 1 for e in range(1, done_epochs + 2)]
    if steps != every[: len(steps)] or not resumed_epochs <= len(steps) <= done_epochs:
        out.append(f"epoch rows at steps {steps}; expected {every[:resumed_epochs]}, then at most "
                   f"{every[resumed_epochs:done_epochs]}")
    return out


def yolo_rounds(workdir: Path, home: Path, rounds: int, *, seed: int = 0, max_delay_s: float = 0.4,
                log: Any = None, env: dict[str, str] | None = None, audit: Path | None = None) -> RoundReport:
    """``rounds`` real YOLO11n kill-after-checkpoint rounds (module doc) on a synthetic dataset
    (16 training images, 2 batches per epoch), one epoch each, then a resume to the end.
    ``env``: the children's environment (default :func:`yolo_env` without user settings);
    ``audit``: record their network use there."""
    from tracker.integrations.yolo_synthetic import make_dataset

    t0 = time.perf_counter()
    rng = random.Random(seed)
    env = env or yolo_env(workdir, home, user_settings=False)
    data = make_dataset(workdir / "data", train=16, val=8, imgsz=64)
    spec = YoloSpec(workdir=str(workdir), data=str(data.yaml), epochs=rounds + 1,
                    audit=str(audit) if audit else None)
    report = RoundReport()
    run_id, batches = None, 2
    # each child is started one round early and waits, imported, for its spec (yolo_waiting); it begins
    # training only after the round before it was killed and checked
    following = _yolo_start(workdir, env, log, audit)
    try:
        for i in range(rounds):
            delay = 0.0 if i % 2 == 0 else rng.uniform(0.0, max_delay_s)
            child, following = following, _yolo_start(workdir, env, log, audit)
            status = _yolo_go(child, YoloSpec(**{**asdict(spec), "resume": i > 0, "kill_epoch": i,
                                                 "kill_delay_s": delay}))
            if status != -signal.SIGKILL:
                report.problems.append(f"round {i}: the training ended with status {status}, not killed")
                break
            state = json.loads((workdir / "runs" / spec.name / "tracker.json").read_text())
            run_id, batches = state["run_id"], int(state["batches_per_epoch"])
            report.checkpoints.append(i)
            report.problems += [f"round {i}: {p}" for p in yolo_problems(home, run_id, batches, i + 1, i)]
            report.rounds += 1
        if not report.problems:
            child, following = following, None
            status = _yolo_go(child, YoloSpec(**{**asdict(spec), "resume": rounds > 0}))
            if status != 0:
                report.problems.append(f"the final resume ended with status {status}")
            state = json.loads((workdir / "runs" / spec.name / "tracker.json").read_text())
            run_id, batches = state["run_id"], int(state["batches_per_epoch"])
            report.problems += [f"final: {p}" for p in yolo_problems(home, run_id, batches, spec.epochs,
                                                                     spec.epochs)]
            report.final_steps = spec.epochs * batches
    finally:
        if following is not None:
            _yolo_drop(following)
    if run_id is not None:
        from tracker.store import Store

        report.restored_epochs = int(Store(home).query(
            "SELECT count(*) FROM curves WHERE run_id = ? AND key = 'epoch' AND segment > 0 "
            "AND step < (SELECT start_step FROM segments s WHERE s.run_id = curves.run_id AND s.rank = 0 "
            "AND s.segment = curves.segment)", [run_id]).item())
    report.seconds = time.perf_counter() - t0
    return report


def main(argv: list[str]) -> int:
    """``python -m tests.harness.ckpt_kill yolo SPEC_JSON`` (or ``yolo-next [AUDIT]``: the spec on stdin)."""
    if argv[:1] == ["yolo-next"] and len(argv) <= 2:
        yolo_waiting(argv[1] if len(argv) == 2 else None)
        return 0
    if len(argv) != 2 or argv[0] != "yolo":
        print("usage: python -m tests.harness.ckpt_kill yolo SPEC_JSON | yolo-next [AUDIT]", file=sys.stderr)
        return 2
    yolo_child(YoloSpec(**json.loads(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
