"""Where a starting process lands: its run id (shared by every rank), its segment and
first step (the resume rule of DESIGN.md), and what ``run.json`` records of its
environment. Used by :func:`tracker.init`."""

from __future__ import annotations

import os
import platform
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tracker.errors import ConfigError, RunError
from tracker.spool import durable_segments, run_dir, visible_last_step

RESUME_MODES = ("never", "allow", "must")
_PACKAGES = ("tracker", "numpy", "torch", "duckdb", "pyarrow", "polars", "pluggy", "vulkan")


def git_commit() -> str | None:
    """The commit checked out in the working directory, or None."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=2, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def package_versions() -> dict[str, str]:
    """Installed versions of the packages a run's numbers depend on."""
    import importlib.metadata as md

    out: dict[str, str] = {}
    for name in _PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


def new_run_id() -> str:
    """A fresh run id: the local time and six random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def shared_run_id(world_size: int) -> str:
    """The run id every rank agrees on: TRACKER_RUN_ID, rank 0's broadcast, or a new one."""
    env = os.environ.get("TRACKER_RUN_ID")
    if env:
        return env
    dist = sys.modules.get("torch.distributed")
    if world_size > 1 and dist is not None and dist.is_initialized():
        box = [new_run_id()]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])
    if world_size > 1:
        raise ConfigError(
            f"world_size={world_size} but no run_id: every rank must log to the same run; "
            "pass run_id=..., set TRACKER_RUN_ID, or initialise torch.distributed first"
        )
    return new_run_id()


def plan_segment(home: Path, run_id: str, rank: int, resume: str, resume_step: int | None) -> tuple[int, int, str]:
    """(segment, start_step, reason) for this process."""
    if resume not in RESUME_MODES:
        raise ConfigError(f"resume={resume!r} is not one of {', '.join(RESUME_MODES)}")
    exists = (run_dir(home, run_id) / "run.json").exists()
    if not exists and resume == "must":
        raise RunError(
            f"cannot resume run {run_id!r}: no such run under {home}; "
            "check the run id (`tracker runs list`) and TRACKER_HOME, or pass resume='allow'"
        )
    segs = [s for s in durable_segments(home, run_id) if s.rank == rank]
    if not segs:  # this rank has not logged to the run yet (a new run, or another rank made it)
        if resume_step is not None and not exists:
            raise ConfigError("resume_step is only meaningful when resuming an existing run")
        return 0, resume_step or 0, "start"
    if resume == "never":
        raise RunError(
            f"run {run_id!r} already exists under {home}; pass resume='allow' to continue it "
            "or choose another run_id"
        )
    segment = max(s.segment for s in segs) + 1
    if resume_step is None:
        last = visible_last_step(segs)
        # nothing visible yet: where the run started (0, or a fork's step + 1)
        resume_step = min(s.start_step for s in segs) if last is None else last + 1
    if isinstance(resume_step, bool) or not isinstance(resume_step, int) or resume_step < 0:
        raise ConfigError(f"resume_step must be a non-negative int, got {resume_step!r}")
    return segment, resume_step, "resume"


def environment(seed: int | None, config: dict[str, Any]) -> dict[str, Any]:
    """What ``run.json`` records of the process: host, commit, Python, packages, seed, pid, GPUs
    (:func:`tracker.hardware.gpu_inventory`: name and compute capability, read without initialising CUDA)."""
    from tracker.hardware import gpu_inventory

    return {
        "host": socket.gethostname(),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "seed": seed if seed is not None else config.get("seed"),
        "pid": os.getpid(),
        "gpus": gpu_inventory(),
    }
