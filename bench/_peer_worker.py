"""One peer's run of the logging workload, in the peer's own interpreter (see bench/peers.py).

Standalone on purpose: it runs under each peer's venv, where ``tracker`` is not
installed (except for the ``tracker`` peer, run with the project's interpreter).
Prints one JSON line: log_s (training thread), durable_s and queryable_s (from the
last logging call), disk_bytes, read_s (one key's every point) and read_points.

Run: ``python bench/_peer_worker.py PEER WORKDIR --keys 10 --steps 100000``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable

Result = dict[str, Any]


def workload(keys: int, steps: int) -> list[dict[str, float]]:
    """One dict of ``keys`` floats per step (built before timing)."""
    rng = random.Random(0)
    names = [f"loss/k{i}" for i in range(keys)]
    return [{k: rng.random() for k in names} for _ in range(steps)]


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_tracker(work: Path, dicts: list[dict[str, float]], key: str) -> Result:
    os.environ.update(TRACKER_HOME=str(work), TRACKER_INGEST_ON_FINISH="0")
    import tracker

    run = tracker.init("bench", run_id="peers", loggers=["store"], config={"analysis": False})
    log = run.log
    t0 = time.perf_counter()
    for step, d in enumerate(dicts):
        log(d, step=step)
    t_last = time.perf_counter()
    run.finish()  # every chunk written and fsynced
    durable = time.perf_counter()
    n = int(tracker.query("SELECT count(*) AS n FROM curves")["n"][0])
    queryable = time.perf_counter()
    from tracker.store import Store, release

    release()
    Store(work).ingest()
    t = time.perf_counter()
    got = tracker.query("SELECT step, value FROM curves WHERE key = ? ORDER BY step", [key])
    read = time.perf_counter() - t
    return {"log_s": t_last - t0, "durable_s": durable - t_last, "queryable_s": queryable - t_last,
            "points": n, "read_s": read, "read_points": got.height}


def run_wandb(work: Path, dicts: list[dict[str, float]], key: str) -> Result:
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(work), WANDB_CONSOLE="off",
                      WANDB_DISABLE_GIT="true", WANDB_DISABLE_CODE="true")
    import wandb

    run = wandb.init(project="bench", dir=str(work), mode="offline")
    log = run.log
    t0 = time.perf_counter()
    for step, d in enumerate(dicts):
        log(d, step=step)
    t_last = time.perf_counter()
    run.finish()  # the offline .wandb file is complete: the only reader works on it
    done = time.perf_counter() - t_last
    from wandb.proto import wandb_internal_pb2

    t = time.perf_counter()
    values = []
    for path in work.rglob("*.wandb"):
        for data in wandb_records(path.read_bytes()):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(data)
            if rec.WhichOneof("record_type") == "history":
                values.extend(json.loads(i.value_json) for i in rec.history.item if i.key == key)
    return {"log_s": t_last - t0, "durable_s": done, "queryable_s": done, "read_s": time.perf_counter() - t,
            "read_points": len(values)}


def wandb_records(data: bytes) -> Any:
    """The records of an offline ``.wandb`` file: a 7-byte W&B header, then LevelDB's log
    format (32 KiB blocks of records with a 7-byte header: CRC, length, type FULL=1,
    FIRST=2, MIDDLE=3, LAST=4). W&B's own Python reader of it is gone (it moved to Go)."""
    import struct

    block, pos, parts = 32768, 7, []
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:
            pos += room
            continue
        _, length, kind = struct.unpack_from("<IHB", data, pos)
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:  # zero padding at a block's end
            pos += block - pos % block if pos % block else 0
            continue
        if kind in (1, 2):
            parts = [chunk]
        else:
            parts.append(chunk)
        if kind in (1, 4):
            yield b"".join(parts)
            parts = []


def run_mlflow(work: Path, dicts: list[dict[str, float]], key: str) -> Result:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("bench")).info.run_id
    log_batch = client.log_batch
    t0 = time.perf_counter()
    for step, d in enumerate(dicts):
        ts = int(time.time() * 1000)
        log_batch(run_id, metrics=[Metric(k, v, ts, step) for k, v in d.items()])
    t_last = time.perf_counter()
    client.set_terminated(run_id)  # log_batch commits synchronously: durable and queryable already
    done = time.perf_counter() - t_last
    t = time.perf_counter()
    got = client.get_metric_history(run_id, key)
    return {"log_s": t_last - t0, "durable_s": done, "queryable_s": done, "read_s": time.perf_counter() - t,
            "read_points": len(got)}


def run_tensorboardx(work: Path, dicts: list[dict[str, float]], key: str) -> Result:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(work))
    add = writer.add_scalar
    t0 = time.perf_counter()
    for step, d in enumerate(dicts):
        for k, v in d.items():
            add(k, v, step)
    t_last = time.perf_counter()
    writer.close()  # flushed and closed
    done = time.perf_counter() - t_last
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = time.perf_counter()
    acc = EventAccumulator(str(work), size_guidance={"scalars": 0})
    acc.Reload()
    got = acc.Scalars(key)
    return {"log_s": t_last - t0, "durable_s": done, "queryable_s": done, "read_s": time.perf_counter() - t,
            "read_points": len(got)}


def run_aim(work: Path, dicts: list[dict[str, float]], key: str) -> Result:
    from aim import Repo, Run
    from aim.sdk.index_manager import RepoIndexManager
    from aim.storage.context import Context

    Repo.from_path(str(work), init=True)
    run = Run(repo=str(work), experiment="bench", system_tracking_interval=None, capture_terminal_logs=False)
    track = run.track
    t0 = time.perf_counter()
    for step, d in enumerate(dicts):
        track(d, step=step)
    t_last = time.perf_counter()
    run_hash = run.hash
    run.close()  # the tracking queue drained, chunks written
    durable = time.perf_counter() - t_last
    # readers see a run once it is indexed (what `aim up` does in the background)
    RepoIndexManager.get_index_manager(Repo.from_path(str(work))).index(run_hash)
    queryable = time.perf_counter() - t_last
    t = time.perf_counter()
    metric = Run(run_hash, repo=str(work), read_only=True).get_metric(key, Context({}))
    values = metric.values.values_list()
    return {"log_s": t_last - t0, "durable_s": durable, "queryable_s": queryable, "read_s": time.perf_counter() - t,
            "read_points": len(values)}


PEERS: dict[str, Callable[[Path, list[dict[str, float]], str], Result]] = {
    "tracker": run_tracker, "wandb": run_wandb, "mlflow": run_mlflow,
    "tensorboardx": run_tensorboardx, "aim": run_aim,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("peer", choices=sorted(PEERS))
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    dicts = workload(args.keys, args.steps)
    result = PEERS[args.peer](args.workdir, dicts, "loss/k0")
    result.update(peer=args.peer, points_logged=args.keys * args.steps, disk_bytes=du(args.workdir),
                  python=sys.version.split()[0])
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
