"""A training process killed with SIGKILL mid-run, then resumed: no duplicate, no gap,
nothing lost that had been flushed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import tracker
from tracker.spool import durable_segments, list_segments

TRAIN = textwrap.dedent(
    """
    import sys, time, tracker
    run = tracker.init("crash", run_id="victim", resume="allow", config={"tracker_flush_interval": 0.2})
    print("start", run.start_step, flush=True)
    step = run.start_step
    while step < int(sys.argv[1]):
        run.log({"loss": 1.0 / (step + 1), "lr": 0.01}, step=step)
        if step % 10 == 0:
            run.log_classes("loss/cls", [float(step)] * 3, step=step)
        step += 1
        time.sleep(0.0005)
    run.finish()
    print("done", flush=True)
    """
)


def test_sigkill_then_resume(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = {**os.environ, "TRACKER_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, str(script), "1000000"], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().split() == ["start", "0"]
    deadline = time.time() + 60
    flushed = None
    while time.time() < deadline:  # wait until at least two flushes landed
        segs = list_segments(home, "victim")
        if segs and segs[0].last_step is not None and segs[0].last_step > 500:
            flushed = segs[0].last_step
            break
        time.sleep(0.05)
    assert flushed is not None, "the flusher never wrote a segment"
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    claimed = list_segments(home, "victim")[0].last_step
    assert claimed is not None and claimed >= flushed
    # the kill may fall between a chunk's rename and its segment JSON's: that chunk is
    # durable (a resume continues after it) but shown only once a resume claims it
    durable = durable_segments(home, "victim")[0].last_step
    assert durable is not None and durable >= claimed

    before = tracker.query("SELECT max(step) AS m, count(*) AS n FROM curves WHERE key = 'loss'").row(0)
    assert before[0] == claimed  # every claimed row survived the kill
    assert before[1] == claimed + 1
    assert tracker.query("SELECT status FROM runs")["status"][0] == "crashed"

    target = durable + 300
    out = subprocess.run([sys.executable, str(script), str(target)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["start", str(durable + 1)]

    steps = tracker.query("SELECT step FROM curves WHERE key = 'loss' ORDER BY step")["step"].to_list()
    assert steps == list(range(target))  # no gap, no duplicate
    cls = tracker.query("SELECT step, count(*) AS n FROM class_curves GROUP BY step ORDER BY step")
    assert cls["step"].to_list() == list(range(0, target, 10))
    assert set(cls["n"].to_list()) == {3}
    segs = tracker.query("SELECT segment, start_step, reason FROM segments ORDER BY segment").rows()
    assert segs == [(0, 0, "start"), (1, durable + 1, "resume")]
    assert tracker.query("SELECT status FROM runs")["status"][0] == "finished"
