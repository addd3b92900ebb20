"""Checkpoint-kill benchmark: trainings killed with SIGKILL right after a checkpoint, resumed.

* Ultralytics (:func:`tests.harness.ckpt_kill.yolo_rounds`): YOLO11n with ``track()``,
  20 rounds by default. Round i resumes from ``last.pt`` (round 0 starts), trains one
  epoch and is killed from inside ``on_model_save`` (``last.pt`` just written): at once
  in even rounds, after a random 0-0.4 s in odd ones; a last resume trains to the end.
  After every round the curves (``train/box_loss``, ``train/cls_loss``, ``lr/pg0``,
  ``epoch``) are checked: every step of the checkpointed epochs once, no gap, no
  duplicate, the epoch metrics of every epoch a resume has seen once. The trainings run
  with Ultralytics' default settings (MLflow callback on, MLflow installed) under an
  audit hook that records any name lookup or connection.
* The plain loop (:func:`tests.harness.ckpt_kill.plain_rounds`, two ranks), 20 rounds
  with ``run.flush()`` before each checkpoint and 20 without it (flush interval 1 s,
  the default), counting the rounds whose kill lost rows logged before the checkpoint.

Prints the rounds, the problems found (none expected with the barrier), the epoch
metrics restored from ``results.csv``, the network events, and the time taken.

Run: ``.venv/bin/python -m bench.ckpt_kill`` (``--rounds N``, ``--skip-yolo``, ``--seed S``).
Exits 1 when a round with the barrier lost or duplicated rows.
"""

from __future__ import annotations

import sys

# bench/logging.py shadows the standard library's ``logging``: keep this folder off the path.
_HERE = __file__.rsplit("/", 1)[0] if "/" in __file__ else "."
sys.path[:] = [p for p in sys.path if p not in ("", _HERE) and not p.endswith("/bench")]

import argparse  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.ckpt_kill import plain_rounds, yolo_env, yolo_rounds  # noqa: E402
from tests.harness.netaudit import settings_file  # noqa: E402


def yolo(rounds: int, seed: int) -> bool:
    root = Path(tempfile.mkdtemp(prefix="tracker-ckpt-kill-"))
    workdir, home = root / "work", root / "tracker-home"
    workdir.mkdir()
    env = yolo_env(workdir, home, user_settings=True)
    env["HOME"] = str(root / "user-home")
    before = settings_file(env).read_bytes()
    audit = root / "network-audit.txt"
    with open(root / "children.log", "ab") as log:
        report = yolo_rounds(workdir, home, rounds, seed=seed, log=log, env=env, audit=audit)
    events = audit.read_text().splitlines() if audit.exists() else []
    text = (root / "children.log").read_text(errors="replace")
    print(f"Ultralytics YOLO11n: {report.summary()}")
    print(f"  checkpointed epoch per round: {report.checkpoints}")
    print(f"  network: {len(events)} name lookups or connections ({'; '.join(events[:3]) or 'none'}); "
          f"settings file {'unchanged' if settings_file(env).read_bytes() == before else 'CHANGED'}; "
          f"'MLflow callback is off' said {text.count('MLflow callback is off')} times in "
          f"{report.rounds + 1} trainings")
    for problem in report.problems[:10]:
        print(f"  problem: {problem}")
    print(f"  files: {root}")
    return not report.problems and not events


def plain(rounds: int, seed: int) -> bool:
    root = Path(tempfile.mkdtemp(prefix="tracker-ckpt-plain-"))
    with_barrier = plain_rounds(root / "with", root / "home-with", rounds, world=2, seed=seed)
    print(f"plain loop, 2 ranks, run.flush() before each checkpoint: {with_barrier.summary()}")
    for problem in with_barrier.problems[:10]:
        print(f"  problem: {problem}")
    lost = 0
    for i in range(rounds):  # each round on a fresh run: a round that loses rows stops a sequence
        r = plain_rounds(root / f"without-{i}", root / f"home-without-{i}", 1, world=2, seed=seed + i,
                         barrier=False)
        lost += bool(r.problems)
    print(f"plain loop, 2 ranks, no run.flush(): {lost} of {rounds} kills right after a checkpoint lost rows "
          "logged before it (background flush every 1 s)")
    return not with_barrier.problems


def main() -> int:
    ap = argparse.ArgumentParser(description="checkpoint-kill rounds")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-yolo", action="store_true", help="only the plain loop")
    args = ap.parse_args()
    ok = plain(args.rounds, args.seed)
    if not args.skip_yolo:
        ok = yolo(args.rounds, args.seed) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
