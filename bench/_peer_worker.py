"""One peer's run of the logging workload, in the peer's own interpreter (see bench/peers.py).

Standalone on purpose: it runs under each peer's venv, where ``tracker`` is not
installed (except for the ``tracker`` peer, run with the project's interpreter).
Three modes, each printing one ``RESULT`` JSON line:

* ``timed``: log the workload, close the run, make it readable, read one key back
  (timed), then read every key back and check it point for point against what was
  logged (count, steps, values). Prints log_s (training thread), close_s and
  queryable_s (from the last logging call), cpu_s (this process and every process it
  started, from the first logging call until queryable), read_s and the check.
* ``kill``: log the workload, print ``LOGGED`` and wait to be killed (bench/peers.py
  sends SIGKILL to this process and every process it started a fixed time later).
* ``read``: in a fresh process, read back what a killed ``kill`` run left and check
  that every surviving point is one that was logged (steps and values); prints the
  count that survived.

Run: ``python bench/_peer_worker.py PEER WORKDIR --keys 10 --steps 100000 [--mode M]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import time
from pathlib import Path
from typing import Any, Callable

Result = dict[str, Any]
Points = dict[str, list[tuple[int, float]]]  # key -> [(step, value)] in step order
KEY = "loss/k0"  # the key whose read-back is timed


def workload(keys: int, steps: int) -> list[dict[str, float]]:
    """One dict of ``keys`` floats per step (built before timing; the same for every peer)."""
    rng = random.Random(0)
    names = [f"loss/k{i}" for i in range(keys)]
    return [{k: rng.random() for k in names} for _ in range(steps)]


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _f32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def check(dicts: list[dict[str, float]], got: Points, stored: str, complete: bool) -> tuple[bool, str, int]:
    """(ok, what is wrong, points read) for ``got`` against the logged ``dicts``.

    Every point read must be one that was logged: its key, its step (once) and its
    value (compared exactly, after rounding to float32 where the peer stores float32).
    ``complete``: every logged point must be there too."""
    keys = list(dicts[0]) if dicts else []
    total = 0
    for key in sorted(got):
        if key not in keys:
            return False, f"key {key!r} was never logged", total
        seen: set[int] = set()
        for step, value in got[key]:
            if not 0 <= step < len(dicts):
                return False, f"{key} step {step} was never logged", total
            if step in seen:
                return False, f"{key} step {step} read twice", total
            seen.add(step)
            want = dicts[step][key]
            want = _f32(want) if stored == "float32" else want
            if value != want:
                return False, f"{key} step {step}: logged {want!r}, read {value!r}", total
        total += len(seen)
    if complete:
        for key in keys:
            n = len(got.get(key, ()))
            if n != len(dicts):
                return False, f"{key}: logged {len(dicts):,} points, read {n:,}", total
    return True, "", total


def proc_stats() -> dict[int, list[str]]:
    """``/proc/PID/stat`` of every live process by pid: the fields after the command name (state, ppid, ...)."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "stat").read_text()
            except OSError:
                continue
            stats[int(entry.name)] = text[text.rindex(")") + 2:].split()
    return stats


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process, its reaped children and its live descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = proc_stats()
    me = os.getpid()
    total, todo = 0.0, [me]
    while todo:
        pid = todo.pop()
        fields = stats.get(pid)
        if fields is None:
            continue
        # fields[11:15]: utime stime cutime cstime (children reaped by this one)
        total += sum(int(x) for x in fields[11:15]) / tick
        todo.extend(p for p, f in stats.items() if int(f[1]) == pid)
    return total


class Peer:
    """One tool's logging calls and its own reader. ``stored``: the precision it keeps."""

    stored = "float64"

    def __init__(self, work: Path):
        self.work = work

    def start(self) -> Callable[[dict[str, float], int], Any]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def make_queryable(self) -> None:
        """What a reader needs after ``close`` (most need nothing)."""

    def read(self, keys: list[str]) -> Points:
        raise NotImplementedError


class Tracker(Peer):
    """Ours at its defaults: the store logger, online analysis and the system sampler on,
    and the ingest into DuckDB that ``finish()`` does."""

    def start(self) -> Callable[[dict[str, float], int], Any]:
        os.environ["TRACKER_HOME"] = str(self.work)
        import tracker

        self.run = tracker.init("bench", run_id="peers")
        log = self.run.log
        return lambda d, step: log(d, step=step)

    def close(self) -> None:
        self.run.finish()

    def make_queryable(self) -> None:
        import tracker

        tracker.query("SELECT count(*) AS n FROM curves")

    def read(self, keys: list[str]) -> Points:
        os.environ["TRACKER_HOME"] = str(self.work)
        import tracker

        marks = ", ".join("?" for _ in keys)
        df = tracker.query(f"SELECT key, step, value FROM curves WHERE key IN ({marks}) ORDER BY key, step", keys)
        out: Points = {}
        for key, step, value in df.iter_rows():
            out.setdefault(key, []).append((step, value))
        return out


class Wandb(Peer):
    """W&B in offline mode (its service process writes the run's ``.wandb`` file)."""

    def start(self) -> Callable[[dict[str, float], int], Any]:
        os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(self.work))
        import wandb

        self.run = wandb.init(project="bench", dir=str(self.work), mode="offline")
        log = self.run.log
        return lambda d, step: log(d, step=step)

    def close(self) -> None:
        self.run.finish()  # the offline .wandb file is complete: the only reader works on it

    def read(self, keys: list[str]) -> Points:
        from wandb.proto import wandb_internal_pb2

        wanted = set(keys)
        out: Points = {}
        for path in sorted(self.work.rglob("*.wandb")):
            for data in wandb_records(path.read_bytes()):
                rec = wandb_internal_pb2.Record()
                try:
                    rec.ParseFromString(data)
                except Exception:  # a torn record at the end of a killed run's file
                    break
                if rec.WhichOneof("record_type") != "history":
                    continue
                items = {i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item}
                step = int(json.loads(items["_step"])) if "_step" in items else rec.history.step.num
                for key, value in items.items():
                    if key in wanted:
                        out.setdefault(key, []).append((step, json.loads(value)))
        return out


def wandb_records(data: bytes) -> Any:
    """The records of an offline ``.wandb`` file: a 7-byte W&B header, then LevelDB's log
    format (32 KiB blocks of records with a 7-byte header: CRC, length, type FULL=1,
    FIRST=2, MIDDLE=3, LAST=4). A record cut short (a killed writer) ends the file.
    W&B's own Python reader of it is gone (it moved to Go)."""
    block, pos, parts = 32768, 7, []
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:
            pos += room
            continue
        _, length, kind = struct.unpack_from("<IHB", data, pos)
        if pos + 7 + length > len(data):
            return
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


class Mlflow(Peer):
    """MLflow's ``log_batch`` per step into a sqlite store; ``synchronous=False`` is its
    asynchronous logging (a queue and a worker thread). ``MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS``
    makes that thread wait that long and merge what is queued into batches of up to 1,000
    items; unset (``mlflow-unbuffered``), it commits each step's batch alone, from a pool
    of 10 threads."""

    synchronous = False
    buffering_s: str | None = "1"

    def _client(self) -> Any:
        import mlflow
        from mlflow.tracking import MlflowClient

        mlflow.set_tracking_uri(f"sqlite:///{self.work / 'mlflow.db'}")
        return MlflowClient()

    def start(self) -> Callable[[dict[str, float], int], Any]:
        if not self.synchronous and self.buffering_s is not None:
            os.environ["MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"] = self.buffering_s
        from mlflow.entities import Metric

        self.client = self._client()
        self.run_id = self.client.create_run(self.client.create_experiment("bench")).info.run_id
        log_batch, run_id, sync = self.client.log_batch, self.run_id, self.synchronous

        def log(d: dict[str, float], step: int) -> None:
            ts = int(time.time() * 1000)
            log_batch(run_id, metrics=[Metric(k, v, ts, step) for k, v in d.items()], synchronous=sync)

        return log

    def close(self) -> None:
        import mlflow

        if not self.synchronous:
            mlflow.flush_async_logging()  # every queued batch committed
        self.client.set_terminated(self.run_id)

    def read(self, keys: list[str]) -> Points:
        client = self._client()
        exp = client.get_experiment_by_name("bench")
        out: Points = {}
        for run in client.search_runs([exp.experiment_id]) if exp else []:
            for key in keys:
                got = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
                if got:
                    out[key] = got
        return out


class MlflowUnbuffered(Mlflow):
    """MLflow's asynchronous logging without buffering: each step's batch committed alone."""

    buffering_s = None


class MlflowSync(Mlflow):
    """MLflow's default: ``log_batch`` returns once the batch is committed."""

    synchronous = True


class TensorboardX(Peer):
    """tensorboardX's ``SummaryWriter`` at its defaults (a writer thread, flushed every 120 s)."""

    stored = "float32"  # an event's simple_value is a float32

    def start(self) -> Callable[[dict[str, float], int], Any]:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(str(self.work))
        add = self.writer.add_scalar

        def log(d: dict[str, float], step: int) -> None:
            for k, v in d.items():
                add(k, v, step)

        return log

    def close(self) -> None:
        self.writer.close()

    def read(self, keys: list[str]) -> Points:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(self.work), size_guidance={"scalars": 0})
        acc.Reload()
        present = set(acc.Tags().get("scalars", ()))
        return {k: [(e.step, e.value) for e in acc.Scalars(k)] for k in keys if k in present}


class Aim(Peer):
    """Aim's ``Run.track`` at its defaults (system tracking every 10 s, terminal capture on)."""

    def start(self) -> Callable[[dict[str, float], int], Any]:
        from aim import Repo, Run

        Repo.from_path(str(self.work), init=True)
        self.run = Run(repo=str(self.work), experiment="bench")
        track = self.run.track
        return lambda d, step: track(d, step=step)

    def close(self) -> None:
        self.hash = self.run.hash
        self.run.close()  # the tracking queue drained, chunks written

    def make_queryable(self) -> None:
        # readers see a run once it is indexed (what `aim up` does in the background)
        from aim import Repo
        from aim.sdk.index_manager import RepoIndexManager

        RepoIndexManager.get_index_manager(Repo.from_path(str(self.work))).index(self.hash)

    def read(self, keys: list[str]) -> Points:
        from aim import Repo, Run
        from aim.sdk.index_manager import RepoIndexManager
        from aim.storage.context import Context

        repo = Repo.from_path(str(self.work))
        out: Points = {}
        for run_hash in repo.list_all_runs():
            RepoIndexManager.get_index_manager(repo).index(run_hash)
            run = Run(run_hash, repo=str(self.work), read_only=True)
            for key in keys:
                metric = run.get_metric(key, Context({}))
                if metric is not None:
                    # values.values_list() is in storage order, not step order: read (steps, values)
                    steps, (values, *_) = metric.data.items_list()
                    out[key] = sorted(zip(steps, values))
        return out


PEERS: dict[str, type[Peer]] = {
    "tracker": Tracker, "wandb": Wandb, "mlflow": Mlflow, "mlflow-sync": MlflowSync,
    "mlflow-unbuffered": MlflowUnbuffered, "tensorboardx": TensorboardX, "aim": Aim,
}


def timed(peer: Peer, dicts: list[dict[str, float]]) -> Result:
    """Log, close, make readable, read one key (timed), then check every point."""
    log = peer.start()
    cpu0 = tree_cpu_s()
    t0 = time.perf_counter()
    for step, d in enumerate(dicts):
        log(d, step)
    t_last = time.perf_counter()
    peer.close()
    t_close = time.perf_counter()
    peer.make_queryable()
    t_query = time.perf_counter()
    cpu = tree_cpu_s() - cpu0
    t = time.perf_counter()
    one = peer.read([KEY]).get(KEY, [])
    read_s = time.perf_counter() - t
    ok, why, n = check(dicts, peer.read(list(dicts[0])), peer.stored, complete=True)
    return {"log_s": t_last - t0, "close_s": t_close - t_last, "queryable_s": t_query - t_last, "cpu_s": cpu,
            "read_s": read_s, "read_points": len(one), "points": n, "check_ok": ok, "check": why}


def logged_then_wait(peer: Peer, dicts: list[dict[str, float]]) -> None:
    """Log everything, say so, and wait for the SIGKILL (never close)."""
    log = peer.start()
    for step, d in enumerate(dicts):
        log(d, step)
    print("LOGGED", flush=True)
    time.sleep(3600)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("peer", choices=sorted(PEERS))
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--mode", choices=("timed", "kill", "read"), default="timed")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    dicts = workload(args.keys, args.steps)
    peer = PEERS[args.peer](args.workdir)
    if args.mode == "kill":
        logged_then_wait(peer, dicts)
        return
    if args.mode == "read":
        ok, why, n = check(dicts, peer.read(list(dicts[0])), peer.stored, complete=False)
        result: Result = {"points": n, "check_ok": ok, "check": why}
    else:
        result = timed(peer, dicts)
    result.update(peer=args.peer, points_logged=args.keys * args.steps, disk_bytes=du(args.workdir),
                  python=sys.version.split()[0])
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
