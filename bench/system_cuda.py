"""Check on a CUDA machine: the sampler's sys/gpu* keys against torch.cuda's own figures.

Trains a small convolutional model for a few hundred steps on ``cuda:0`` with the
system sampler on (0.1 s interval), takes one last sample after the last step, and
checks: ``sys/gpu0/max_allocated`` equals ``torch.cuda.max_memory_allocated(0)``;
allocated <= reserved <= total at every sample; ``sys/gpu0/total`` is the device's
memory; NVML's utilisation and memory appear when ``nvidia-ml-py`` is installed.
Prints the figures and exits 1 on a failed check, 2 without CUDA.

Run: ``.venv/bin/python bench/system_cuda.py [--steps 300]``.
"""

from __future__ import annotations

import sys

_HERE = __file__.rsplit("/", 1)[0] if "/" in __file__ else "."
sys.path[:] = [p for p in sys.path if p not in ("", _HERE) and not p.endswith("/bench")]

import argparse  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    """Train, sample, compare; print each check."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device here: nothing to check")
        return 2
    os.environ.setdefault("TRACKER_HOME", tempfile.mkdtemp(prefix="tracker-cuda-check-"))
    import tracker
    from plugins.system import sampler_for

    device = torch.device("cuda:0")
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10),
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = tracker.init("cuda-check", system=0.1, config={"planned_steps": args.steps})
    sampler = sampler_for(run)
    assert sampler is not None
    for step in range(args.steps):
        size = 64 + 32 * (step % 5)  # variable input sizes, as detection batches have
        x = torch.randn(32, 3, size, size, device=device)
        y = torch.randint(0, 10, (32,), device=device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss}, step=step)
    torch.cuda.synchronize()
    sampler.tick()
    peak = torch.cuda.max_memory_allocated(0)
    total = torch.cuda.get_device_properties(0).total_memory
    run.finish()
    rows = tracker.query(
        "SELECT step, key, value FROM curves WHERE run_id = ? AND starts_with(key, 'sys/gpu0/') ORDER BY step, key",
        [run.run_id],
    )
    wide = rows.pivot(on="key", index="step", values="value", aggregate_function="last").sort("step")
    print(f"{wide.height} samples of {sorted(set(rows['key'].to_list()))}")
    print(wide.tail(3))
    checks = [
        ("last sys/gpu0/max_allocated == torch.cuda.max_memory_allocated(0)",
         wide["sys/gpu0/max_allocated"][-1] == peak, f"{wide['sys/gpu0/max_allocated'][-1]:.0f} vs {peak}"),
        ("allocated <= reserved at every sample",
         bool((wide["sys/gpu0/allocated"] <= wide["sys/gpu0/reserved"]).all()), ""),
        ("reserved <= total at every sample", bool((wide["sys/gpu0/reserved"] <= total).all()), ""),
        ("sys/gpu0/total == total_memory", bool((wide["sys/gpu0/total"] == total).all()), f"{total}"),
        ("at least 5 samples", wide.height >= 5, f"{wide.height}"),
    ]
    if "sys/gpu0/util" in wide.columns:
        checks.append(("NVML utilisation in 0..100", bool(wide["sys/gpu0/util"].is_between(0, 100).all()), ""))
    else:
        print("no NVML figures (install the [nvml] extra for sys/gpu0/util and sys/gpu0/mem_used)")
    failed = 0
    for text, ok, detail in checks:
        print(f"  {'ok  ' if ok else 'FAIL'}  {text}  {detail}")
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
