"""Benchmark of the loss kernels against torch's BCE-with-logits on one YOLO batch.

Workload: 16 x 8,400 x 80 float32 logits (one YOLOv11 batch at 640 px, 10.75 M
elements), 1% positive targets, reduction ``mean``. For every available backend
of each built-in term it prints the time of a call without gradient (loss plus
per-class sums and positives) and with gradient, as wall time and as process CPU
time; then the ratio of the with-gradient call to torch's
``binary_cross_entropy_with_logits`` forward plus backward on the CPU. Calls run
round-robin, best of N rounds each, so a busy machine slows them alike. For the numpy kernels it also prints the peak
extra memory of a call (tracemalloc) relative to the logits' size.

Run: ``.venv/bin/python bench/losses.py`` (``--help`` for sizes). It prints and
never fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a file, this folder heads sys.path; its sibling benchmarks (e.g. a
# bench/logging.py) must not shadow standard-library modules that torch imports.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse  # noqa: E402
import functools  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

from tracker.losses import kernels, loss  # noqa: E402


def interleaved_ms(calls: dict[str, Callable[[], Any]], repeat: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and process CPU time (all threads) of each call in each of ``repeat`` rounds, in ms.

    Every round runs every call once, so a busy machine slows them all alike; a
    ratio taken within one round compares calls under the same load.
    """
    for fn in calls.values():
        fn()
    wall: dict[str, list[float]] = {k: [] for k in calls}
    cpu: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(repeat):
        for name, fn in calls.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            cpu[name].append((time.process_time() - start_cpu) * 1e3)
            wall[name].append((time.perf_counter() - start) * 1e3)
    return wall, cpu


def ratio_spread(ours: list[float], anchor: list[float]) -> str:
    """Per-round ratios ``ours / anchor`` as ``median (min-max)``."""
    ratios = [a / b for a, b in zip(ours, anchor)]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def torch_calls(x: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], Any]]:
    """torch BCE-with-logits: forward, forward+backward, and with per-class sums (none when torch is missing)."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return {}
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def forward() -> None:
        with torch.no_grad():
            F.binary_cross_entropy_with_logits(xt, yt)

    def backward() -> None:
        leaf = xt.detach().requires_grad_(True)
        F.binary_cross_entropy_with_logits(leaf, yt).backward()

    def per_class() -> None:
        leaf = xt.detach().requires_grad_(True)
        elementwise = F.binary_cross_entropy_with_logits(leaf, yt, reduction="none")
        elementwise.detach().sum(dim=0, dtype=torch.float64)
        elementwise.mean().backward()

    return {"torch/forward": forward, "torch/forward+backward": backward, "torch/+per-class": per_class}


def peak_extra_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated through Python/numpy during ``fn()`` (tracemalloc)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def kernel_calls(x: np.ndarray, y: np.ndarray, grad: np.ndarray) -> tuple[dict[str, Callable[[], Any]], list[str]]:
    """Calls without and with gradient for every available backend of the built-in terms; unavailable ones."""
    calls: dict[str, Callable[[], Any]] = {}
    notes = []
    for term in ("class_weighted_bce", "sigmoid_focal"):
        for backend, kernel in kernels(term).items():
            reason = kernel.unavailable()
            if reason:
                notes.append(f"  {term:<20} {backend:<8} unavailable: {reason}")
                continue
            call = loss(term, backend=backend)
            calls[f"{term}/{backend}/forward"] = functools.partial(call, x, y)
            calls[f"{term}/{backend}/grad"] = functools.partial(call, x, y, grad)
    return calls, notes


def report(times: dict[str, float], cpu: dict[str, float], calls: dict[str, Callable[[], Any]], nbytes: int) -> None:
    """Print the torch baseline and one row per term and backend (wall ms, CPU ms in brackets)."""
    baseline = times.get("torch/forward+backward")
    if baseline is None:
        print("  torch not installed: no baseline")
    else:
        names = ("torch/forward", "torch/forward+backward", "torch/+per-class")
        print("  torch BCE-with-logits   " + "  ".join(f"{n[6:]} {times[n]:6.1f} ({cpu[n]:6.1f}) ms" for n in names))
    for key in [k[: -len("/forward")] for k in times if k.endswith("/forward") and not k.startswith("torch/")]:
        term, backend = key.split("/")
        forward, both = times[f"{key}/forward"], times[f"{key}/grad"]
        ratio = "n/a"
        if baseline:
            ratio = f"{both / baseline:4.2f}x ({cpu[f'{key}/grad'] / cpu['torch/forward+backward']:4.2f}x)"
        memory = "n/a (not traced)"
        if backend == "numpy":
            peak = peak_extra_bytes(calls[f"{key}/grad"])
            memory = f"{peak / 2**20:4.1f} MiB = {peak / nbytes:4.2f}x logits"
        print(
            f"  {term:<19} {backend:<7} forward {forward:6.1f} ({cpu[f'{key}/forward']:6.1f}) ms  "
            f"forward+grad {both:6.1f} ({cpu[f'{key}/grad']:6.1f}) ms  vs torch {ratio}  peak extra {memory}"
        )


def main() -> None:
    """Parse sizes, run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--anchors", type=int, default=8400)
    parser.add_argument("--classes", type=int, default=80)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n = args.batch * args.anchors
    x = (rng.standard_normal((n, args.classes), dtype=np.float32) * 3.0).reshape(args.batch, args.anchors, -1)
    y = (rng.random(x.shape) < 0.01).astype(np.float32)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"logits {x.shape} float32 = {x.size / 1e6:.2f} M elements ({x.nbytes / 2**20:.1f} MiB); "
        f"{cpus} CPUs, load average {load:.2f}; best of {args.repeat} interleaved rounds (ratios: per round)"
    )
    calls, notes = kernel_calls(x, y, np.zeros_like(x))
    calls = {**torch_calls(x.reshape(n, -1), y.reshape(n, -1)), **calls}
    samples, cpu_samples = interleaved_ms(calls, args.repeat)
    wall = {k: min(v) for k, v in samples.items()}
    cpu = {k: min(v) for k, v in cpu_samples.items()}
    report(wall, cpu, calls, x.nbytes)
    anchor = samples.get("torch/forward+backward")
    if anchor:
        print(f"  per-round ratio to torch forward+backward, median (min-max) over {args.repeat} rounds:")
        for key in (k for k in samples if k.endswith("/grad")):
            print(f"    {key[: -len('/grad')]:<30} {ratio_spread(samples[key], anchor)}")
        numpy_bce, vulkan_bce = samples.get("class_weighted_bce/numpy/grad"), samples.get("class_weighted_bce/vulkan/grad")
        if numpy_bce:
            print(f"  target: numpy class_weighted_bce <= 0.7x torch: {ratio_spread(numpy_bce, anchor)}")
        if numpy_bce and vulkan_bce:
            print(f"  target: vulkan class_weighted_bce <= 0.45x numpy: {ratio_spread(vulkan_bce, numpy_bce)}")
    for note in notes:
        print(note)
    print("wall ms (process CPU ms, all threads); ratio = our forward+grad (with per-class sums)")
    print("/ torch BCE forward+backward, wall (CPU); < 2x is the target")


if __name__ == "__main__":
    main()
