"""Chaos rounds: a training process (and an ingesting one) killed with SIGKILL at
random moments, then resumed, checking after every kill that the run has no
duplicate, no gap and lost nothing durable.

Used by the test suite (a few rounds) and by ``bench/chaos.py`` (many rounds).

A round starts the trainer (which resumes the run, or starts it) and, in most
rounds, an ingester looping ``Store.ingest`` on the same store, then kills both
at independent random moments: while Python starts, while ``tracker.init``
plans the resume, while logging, while ingesting. Checks after each round:

* the durable last step ``D`` (what the next resume continues from) never goes
  down: nothing durable is lost;
* the visible curve is exactly steps ``0..hi`` (no gap, no duplicate) with
  ``J <= hi <= D``, ``J`` the last step the segment JSON claims: every claimed row
  is visible and nothing past what a resume continues after (a chunk renamed into
  place just before the kill, ahead of its JSON, is counted in ``D`` and shown once a
  resume has claimed it);
* every per-class row matches its step;
* the next trainer starts at ``D + 1``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

TRAIN = textwrap.dedent(
    """
    import sys, time, tracker
    run = tracker.init("chaos", run_id="chaos", resume="allow",
                       config={"tracker_flush_interval": 0.05, "analysis": False}, loggers=["store"])
    print("start", run.start_step, flush=True)
    step, target = run.start_step, int(sys.argv[1])
    while step < target:
        run.log({"loss": 1.0 / (step + 1), "lr": 0.001, "step_copy": float(step)}, step=step)
        if step % 10 == 0:
            run.log_classes("loss/cls", [float(step)] * 4, step=step)
        step += 1
        if step % 50 == 0:
            time.sleep(0.001)
    run.finish()
    print("done", flush=True)
    """
)

INGEST = textwrap.dedent(
    """
    import random, time
    from tracker.store import Store
    while True:
        try:
            Store().ingest(timeout=5)
        except Exception as exc:
            print("ingest failed:", exc, flush=True)
        time.sleep(random.random() * 0.05)
    """
)


@dataclass
class ChaosReport:
    """What the rounds did and found."""

    rounds: int = 0
    killed_before_init: int = 0  # killed while starting or resuming (before init returned)
    killed_while_logging: int = 0
    ingester_kills: int = 0
    finished_early: int = 0
    waited_for_flush: int = 0  # logging rounds killed only after more rows were durable than before
    durable_steps: list[int] = field(default_factory=list)
    final_steps: int = 0

    def summary(self) -> str:
        return (
            f"{self.rounds} rounds: {self.killed_before_init} kills during start/resume, "
            f"{self.killed_while_logging} while logging, {self.ingester_kills} ingester kills, "
            f"{self.finished_early} finished before the kill, {self.waited_for_flush} after a flush; final curve {self.final_steps} steps, "
            "no duplicate, no gap, nothing durable lost"
        )


class ChaosError(AssertionError):
    """An invariant did not hold after a kill."""


def _durable(home: Path) -> int | None:
    from tracker.spool import durable_segments, visible_last_step

    return visible_last_step([s for s in durable_segments(home, "chaos") if s.rank == 0])


def check(home: Path, durable_before: int | None) -> int | None:
    """Check the invariants (module doc) and return the durable last step."""
    from tracker.spool import list_segments, visible_last_step
    from tracker.store import Store

    d = _durable(home)
    if durable_before is not None and (d is None or d < durable_before):
        raise ChaosError(f"durable last step went from {durable_before} to {d}: durable rows were lost")
    store = Store(home)
    n, distinct, lo, hi = store.query(
        "SELECT count(*), count(DISTINCT step), min(step), max(step) FROM curves "
        "WHERE run_id = 'chaos' AND key = 'loss'"
    ).row(0)
    if d is None:
        if n:
            raise ChaosError(f"no durable step, yet {n} rows are visible")
        return d
    if n != distinct:
        raise ChaosError(f"{n - distinct} duplicate steps in the visible curve")
    if lo != 0 or hi is None or n != hi + 1:
        raise ChaosError(f"a gap in the visible curve: {n} steps between {lo} and {hi}")
    claimed = visible_last_step([s for s in list_segments(home, "chaos") if s.rank == 0])
    if hi > d or (claimed is not None and hi < claimed):
        raise ChaosError(f"the visible curve ends at {hi}; the segment JSON claims {claimed}, a resume "
                         f"would continue after {d}")
    bad = store.query(
        "SELECT count(*) FROM class_curves WHERE run_id = 'chaos' AND (value <> step OR step % 10 <> 0)"
    ).item()
    if bad:
        raise ChaosError(f"{bad} per-class rows do not match their step")
    return d


def _wait_durable(home: Path, durable: int | None, proc: subprocess.Popen[str], timeout: float) -> bool:
    """Wait until a flush made more steps durable than ``durable`` (True), or the
    trainer ended, or ``timeout`` passed (False). On a loaded machine the first flush can
    come after a kill drawn at random, and a test would then never kill a run with rows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        d = _durable(home)
        if d is not None and (durable is None or d > durable):
            return True
        time.sleep(0.02)
    return False


def _spawn(script: Path, args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(script), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def _kill(proc: subprocess.Popen[str]) -> bool:
    """SIGKILL ``proc``; True when it was still running."""
    alive = proc.poll() is None
    if alive:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    return alive


def _read_line(proc: subprocess.Popen[str], timeout: float) -> list[str]:
    """The trainer's first line (``start N``), or nothing after ``timeout``."""
    import select

    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return [proc.stdout.readline()] if ready else []


def run_rounds(home: Path, rounds: int, *, seed: int = 0, target: int = 10**9, max_kill_s: float = 2.5,
               ingest_share: float = 0.7, early_share: float = 0.3, after_flush_share: float = 0.5,
               then_steps: int | None = None) -> ChaosReport:
    """Kill-and-resume ``rounds`` times (module doc); then, with ``then_steps``, log that
    many more steps without a kill and check the whole curve. Raises :class:`ChaosError`.

    A share ``after_flush_share`` of the rounds killed while logging waits for a flush that
    makes more rows durable before its random delay: a kill then always has rows behind it,
    however slow the machine is to write its first chunk."""
    rng = random.Random(seed)
    home.mkdir(parents=True, exist_ok=True)
    train, ingest = home / "chaos_train.py", home / "chaos_ingest.py"
    train.write_text(TRAIN)
    ingest.write_text(INGEST)
    env = {**os.environ, "TRACKER_HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path),
           "TRACKER_INGEST_ON_FINISH": "0"}
    report = ChaosReport()
    durable = _durable(home)
    for _ in range(rounds):
        proc = _spawn(train, [str(target)], env)
        ing = _spawn(ingest, [], env) if rng.random() < ingest_share else None
        t0 = time.monotonic()
        t_ing = rng.uniform(0.0, max_kill_s + 1.0)
        lines: list[str] = []
        if rng.random() < early_share:  # a kill while Python starts or tracker.init resumes
            time.sleep(rng.uniform(0.0, 0.3))  # within a quiet machine's start (about 0.4 s to init)
        else:  # a kill while logging (and flushing, and maybe ingesting)
            lines += _read_line(proc, 60.0)
            if rng.random() < after_flush_share:
                report.waited_for_flush += _wait_durable(home, durable, proc, 60.0)
            time.sleep(rng.uniform(0.0, max_kill_s))
        if ing is not None and time.monotonic() - t0 >= t_ing:
            report.ingester_kills += _kill(ing)
            ing = None
        _kill(proc)
        if ing is not None:
            time.sleep(max(0.0, t_ing - (time.monotonic() - t0)))
            report.ingester_kills += _kill(ing)
        assert proc.stdout is not None
        out = " ".join(lines).split() + proc.stdout.read().split()
        if "done" in out:
            report.finished_early += 1
        elif "start" in out:
            report.killed_while_logging += 1
        else:
            report.killed_before_init += 1
        if "start" in out:
            started = int(out[out.index("start") + 1])
            expected = 0 if durable is None else durable + 1
            if started != expected:
                raise ChaosError(f"the trainer resumed at step {started}; the durable state says {expected}")
        durable = check(home, durable)
        report.rounds += 1
        report.durable_steps.append(-1 if durable is None else durable)
    if then_steps is not None:
        finish_to = (-1 if durable is None else durable) + 1 + then_steps
        done = subprocess.run([sys.executable, str(train), str(finish_to)], env=env, capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            raise ChaosError(f"the final run failed: {done.stderr[-2000:]}")
        check(home, durable)
        from tracker.store import Store

        steps = Store(home).query(
            "SELECT step FROM curves WHERE run_id = 'chaos' AND key = 'loss' ORDER BY step"
        )["step"].to_list()
        if steps != list(range(finish_to)):
            raise ChaosError(f"the final curve is not steps 0..{finish_to - 1}")
        report.final_steps = len(steps)
    return report
