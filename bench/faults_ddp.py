"""The data-parallel trainings of the fault corpus: two ranks on CPU (``torch.distributed``, gloo).

Each rank trains the digits CNN of :mod:`bench.faults_digits` under
``DistributedDataParallel`` and draws its batches from :class:`tracker.sampling.ShardedSampler`,
logging ``rng/fingerprint`` and ``rng/epoch`` at each epoch's start (the convention
of :mod:`tracker.analysis.ranks`) and a hash of the batch indices it drew in that
epoch as ``rng/batches``. Faults:

``ddp``            healthy: every rank seeds the sampler alike and takes its own shard
``ddp_seed_rank``  the sampler seeded with ``seed + rank`` (the whole program seeded per rank):
                   the ranks' orders differ, so their shards overlap and miss images
``ddp_identical``  the sampler built without the rank and world size (``rank=0, world_size=1``
                   on every rank): every rank draws the same batches

Run: ``python -m bench.faults_ddp SPEC_JSON`` starts both ranks and prints the record.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

FAULTS = ("ddp", "ddp_seed_rank", "ddp_identical")
WORLD = 2


@dataclass
class DdpSpec:
    """One two-rank training."""

    fault: str = "ddp"
    seed: int = 0
    epochs: int = 12
    project: str = "faults-ddp"

    def label_name(self) -> str:
        """The run's name: ``ddp-<fault>-s<seed>``."""
        return f"ddp-{self.fault}-s{self.seed}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sampler(spec: DdpSpec, rank: int, n: int) -> Any:
    from tracker.sampling import ShardedSampler

    class Indices(ShardedSampler):
        def _draw(self, rng: np.random.Generator) -> np.ndarray:
            return rng.permutation(n)

    if spec.fault == "ddp_identical":
        return Indices(seed=spec.seed, rank=0, world_size=1)
    seed = spec.seed + rank if spec.fault == "ddp_seed_rank" else spec.seed
    return Indices(seed=seed, rank=rank, world_size=WORLD)


def _digest(indices: list[int]) -> float:
    h = hashlib.blake2b(np.asarray(indices, dtype="<i8").tobytes(), digest_size=8)
    return float(int.from_bytes(h.digest(), "little") >> 11)


def rank_main(spec: DdpSpec, rank: int) -> None:
    """One rank's training (``RANK``, ``WORLD_SIZE``, ``MASTER_*``, ``TRACKER_RUN_ID`` set by the parent)."""
    import torch
    import torch.distributed as dist

    import tracker
    from bench.faults_digits import _net, _split

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(spec.seed)
    xt, _, yt, _ = _split(spec.seed)
    x, y = torch.from_numpy(xt), torch.from_numpy(yt)
    model = torch.nn.parallel.DistributedDataParallel(_net())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = _sampler(spec, rank, len(y))
    per_epoch = len(sampler) // 32
    run = tracker.init(spec.project, name=spec.label_name(), system=False, seed=spec.seed,
                       config={"fault": spec.fault, "seed": spec.seed, "epochs": spec.epochs,
                               "steps_per_epoch": per_epoch, "world_size": WORLD})
    step = 0
    for epoch in range(spec.epochs):
        sampler.set_epoch(epoch)
        order = list(sampler)[: per_epoch * 32]
        sampler.log_fingerprint(run, step)
        run.log({"rng/batches": _digest(order)}, step=step)
        for b in range(per_epoch):
            idx = torch.tensor(order[b * 32 : (b + 1) * 32])
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.log({"train/loss": loss.item()}, step=step)
            step += 1
    run.finish()
    dist.destroy_process_group()


def train(spec: DdpSpec, home: Any = None, timeout: float = 600) -> dict[str, Any]:
    """Start both ranks as child processes and wait; returns the record with its labels."""
    from tracker.runplan import new_run_id

    run_id = new_run_id()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(WORLD),
               TRACKER_RUN_ID=run_id, TRACKER_SYSTEM="0")
    if home is not None:
        env["TRACKER_HOME"] = str(home)
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "bench.faults_ddp", "rank", str(r), json.dumps(asdict(spec))],
                              env={**env, "RANK": str(r)}) for r in range(WORLD)]
    codes = [p.wait(timeout=timeout) for p in procs]
    if any(codes):
        raise RuntimeError(f"DDP training {spec.label_name()} failed: exit codes {codes}")
    record = {"run_id": run_id, "name": spec.label_name(), "model": "digits-ddp", "fault": spec.fault,
              "seed": spec.seed, "spec": asdict(spec), "seconds": time.perf_counter() - t0}
    record["steps"] = last_step(run_id, home) + 1
    record["labels"] = [asdict(lb) for lb in ddp_labels(spec, record["steps"] - 1)]
    return record


def last_step(run_id: str, home: Any = None) -> int:
    """The last step a rank of the run logged ``train/loss`` at."""
    import tracker

    df = tracker.query("SELECT max(step) AS s FROM curves WHERE run_id = ? AND key = 'train/loss'", [run_id],
                       home=home)
    return int(df["s"][0])


def ddp_labels(spec: DdpSpec, last: int) -> list[Any]:
    """``rank_disagreement`` at step 0 for seeds that differ per rank; ``identical_batches`` (any step of the run,
    on the per-rank ``train/loss``: the batches are the same from the first) for one shard."""
    from bench.faults_labels import Label

    if spec.fault == "ddp_seed_rank":
        return [Label("rank_disagreement", 0, 0, 0, key="rng/fingerprint", note="sampler seeded seed + rank")]
    if spec.fault == "ddp_identical":
        return [Label("identical_batches", 0, 0, last, key="train/loss",
                      note="every rank drew the same batches (rng/batches equal at every epoch)")]
    return []


def main(argv: list[str]) -> int:
    """``python -m bench.faults_ddp SPEC_JSON`` (the parent) or ``rank R SPEC_JSON`` (a rank)."""
    if len(argv) == 3 and argv[0] == "rank":
        rank_main(DdpSpec(**json.loads(argv[2])), int(argv[1]))
        return 0
    if len(argv) == 1:
        print(json.dumps(train(DdpSpec(**json.loads(argv[0])))))
        return 0
    if not argv:
        print("one training of the fault corpus: python -m bench.faults_ddp SPEC_JSON (python -m bench.faults "
              "builds the corpus)")
        return 0
    print("usage: python -m bench.faults_ddp SPEC_JSON", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
