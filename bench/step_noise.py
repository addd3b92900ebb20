"""Where the round-to-round swing of a YOLO11n CPU step comes from: a plain PyTorch loop.

    python -m bench.step_noise [--rounds 8] [--steps 60] [--batch 8] [--imgsz 64] [--threads 1]

The model is Ultralytics' YOLO11n (``DetectionModel("yolo11n.yaml")``, 80 classes), but
the loop is plain PyTorch: fixed random images, forward in train mode, the sum of squares
of the head's outputs as the loss, backward, AdamW step; no trainer, no data loader, no
augmentation, no callbacks, no EMA. Each round builds a fresh model with the same seed
(as each training of ``bench.assign_cost`` does), then ``--steps`` steps; the first 3 are
left out. Per step it records the wall time, the process CPU time (all threads), the
main thread's CPU time, the machine's steal time and the other processes' CPU (from
``/proc/stat``, all cores, minus this process) and the garbage collections. Printed per
round: median wall and CPU per step, the share of the wall the main thread was on a CPU,
steal and the others' CPU per step. If the wall swings and the CPU does not, the cores
were taken by something else (another process, the hypervisor); if both swing, the work
itself changed (denormals, memory layout). ``--same-model`` keeps one model over all
rounds; ``--flush-denormal`` sets ``torch.set_flush_denormal(True)``.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import time
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[float, float]:
    """(busy seconds of all cores, steal seconds) from ``/proc/stat``."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = f[:8]
    return (user + nice + system + irq + softirq) / TICK, steal / TICK


def self_ticks() -> float:
    """CPU seconds of this process from ``/proc/self/stat`` (the same clock as ``/proc/stat``)."""
    with open("/proc/self/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _tensors(out: object) -> list[Any]:
    """The tensors of a head's output (a tensor, or lists and dicts of them, as releases differ)."""
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _tensors(v)]
    return [out] if hasattr(out, "float") else []


def one_round(model: Any, x: Any, steps: int, gcs: list[int]) -> list[tuple[float, ...]]:
    """``steps`` plain forward/backward/AdamW steps; per step (the first 3 left out): wall, process CPU,
    main-thread CPU, steal, other processes' CPU, collections, page faults, system CPU, preemptions."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rows = []
    for _ in range(steps):
        w0, c0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
        b0, s0, m0, g0 = *machine_ticks(), self_ticks(), len(gcs)
        u0 = resource.getrusage(resource.RUSAGE_SELF)
        out = model(x)
        loss = sum((t.float() ** 2).mean() for t in _tensors(out))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        b1, s1 = machine_ticks()
        u1 = resource.getrusage(resource.RUSAGE_SELF)
        rows.append((time.perf_counter() - w0, time.process_time() - c0, time.thread_time() - t0,
                     s1 - s0, (b1 - b0) - (self_ticks() - m0), len(gcs) - g0, u1.ru_minflt - u0.ru_minflt,
                     u1.ru_stime - u0.ru_stime, u1.ru_nivcsw - u0.ru_nivcsw))
    return rows[3:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (Ultralytics sets "
                        "min(8, cpus - 1) for CPU training)")
    parser.add_argument("--same-model", action="store_true")
    parser.add_argument("--flush-denormal", action="store_true")
    args = parser.parse_args(argv)
    import logging

    import torch
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import LOGGER

    LOGGER.setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    if args.flush_denormal:
        torch.set_flush_denormal(True)
    gcs: list[int] = []
    gc.callbacks.append(lambda phase, info: gcs.append(1) if phase == "stop" else None)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(args.batch, 3, args.imgsz, args.imgsz, generator=g)
    print(f"plain PyTorch YOLO11n loop, batch {args.batch}, imgsz {args.imgsz}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, flush denormal "
          f"{args.flush_denormal}, {'one model' if args.same_model else 'a fresh model per round'}")
    model = None
    medians = []
    for r in range(args.rounds):
        if model is None or not args.same_model:
            torch.manual_seed(0)
            model = DetectionModel("yolo11n.yaml", nc=80, verbose=False).train()
        rows = one_round(model, x, args.steps, gcs)
        wall, cpu, main_cpu, steal, others, ngc, faults, sys_s, preempt = (list(c) for c in zip(*rows))
        n = len(rows)
        medians.append((statistics.median(wall), statistics.median(cpu)))
        print(f"round {r + 1}: wall median {1000 * statistics.median(wall):6.1f} ms (min {1000 * min(wall):5.1f}, "
              f"max {1000 * max(wall):6.1f})  process CPU median {1000 * statistics.median(cpu):6.1f} ms  "
              f"main thread on CPU {100 * sum(main_cpu) / sum(wall):5.1f}% of the wall  steal "
              f"{1000 * sum(steal) / n:5.1f} ms/step  other processes {1000 * sum(others) / n:6.1f} ms CPU/step  "
              f"gc {sum(ngc)}  page faults {sum(faults) / n:6.0f}/step  system CPU {1000 * sum(sys_s) / n:5.1f} "
              f"ms/step  preempted {sum(preempt) / n:4.1f}/step  load {os.getloadavg()[0]:.2f}", flush=True)
    walls, cpus = zip(*medians)
    print(f"round medians: wall {1000 * min(walls):.1f}-{1000 * max(walls):.1f} ms "
          f"(spread {100 * (max(walls) / min(walls) - 1):.1f}%), process CPU {1000 * min(cpus):.1f}-"
          f"{1000 * max(cpus):.1f} ms (spread {100 * (max(cpus) / min(cpus) - 1):.1f}%)")


if __name__ == "__main__":
    main()
