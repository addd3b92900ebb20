"""Benchmark of the loss kernels against torch's BCE-with-logits on one YOLO batch.

Workload: 16 x 8,400 x 80 float32 logits (one YOLOv11 batch at 640 px, 10.75 M
elements), 1% positive targets, reduction ``mean``. Both sides do the same work in
every call: the loss, the per-class loss sums (torch: its fastest idiom, float32
``sum(dim=0)``; ours: float64 accumulation, and positives per class on top), and
(with gradient) dL/dlogits, either into a **fresh** gradient buffer per call (ours:
``np.zeros_like``; torch: a new leaf, whose ``.grad`` autograd allocates) or into a
**reused** one (ours: the same array, added into; torch: the same leaf, whose
``.grad`` backward adds into). The thread counts are set (``--threads``, default the
usable CPUs: ``torch.set_num_threads``, our kernels' ``TRACKER_NUM_THREADS`` and
numpy's OpenBLAS through threadpoolctl) and printed. A check prints how far our
numpy kernel's loss and gradient are from torch's.

Then the path the Ultralytics integration takes per batch (tracker.integrations.
ultralytics_loss): its ``ClassificationLoss`` around the criterion's elementwise
``bce``, then Ultralytics' ``sum() / target_scores_sum`` and the backward, for the
stock ``BCEWithLogitsLoss`` (tracking only), a built-in term (torch ops through
tracker.torch) and ``HostTermFunction``, the bridge any other registered term takes
(host copies of logits and targets, a fresh gradient buffer, the kernel chosen by
``auto``, the loss and gradient copied back). On ``--device cpu`` the host copies
are no copies at all; ``--device cuda`` times the four host<->device copies too.

Calls run round-robin, best of ``--repeat`` rounds each (ratios: per round, median
and spread), wall time and process CPU time. For the numpy kernels it also prints
the peak extra memory of a call (tracemalloc) relative to the logits' size.

Run: ``.venv/bin/python -m bench.losses`` (``--help`` for sizes). It prints and never fails.
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

from tracker.losses import auto_kernel, kernels, loss  # noqa: E402

Calls = dict[str, Callable[[], Any]]
VARIANTS = ("forward", "fresh", "reused")
LABELS = {"forward": "forward", "fresh": "fresh grad", "reused": "reused grad"}


def set_threads(n: int) -> str:
    """Set every thread count the calls use to ``n``; the line that says so."""
    os.environ["TRACKER_NUM_THREADS"] = str(n)  # read by our kernels at each call
    parts = [f"our numpy kernels {n} (TRACKER_NUM_THREADS)"]
    try:
        import torch

        torch.set_num_threads(n)
        parts.insert(0, f"torch {torch.get_num_threads()} (torch.set_num_threads)")
    except ImportError:
        parts.insert(0, "torch not installed")
    try:
        from threadpoolctl import threadpool_info, threadpool_limits

        threadpool_limits(n)
        blas = sorted({f"{i['internal_api']} {i['num_threads']}" for i in threadpool_info() if i["user_api"] == "blas"})
        parts.append(f"BLAS {', '.join(blas) or 'none loaded'} (threadpoolctl)")
    except ImportError:
        parts.append("BLAS threads not set (threadpoolctl not installed)")
    return "threads: " + ", ".join(parts)


def interleaved_ms(calls: Calls, repeat: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
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


def torch_calls(x: np.ndarray, y: np.ndarray) -> Calls:
    """torch BCE-with-logits with per-class sums: forward, fresh and reused gradient.

    The per-class sums use torch's fastest idiom, ``sum(dim=0)`` in float32 (cascade
    summation, within 2e-7 of a float64 sum here; ``dtype=torch.float64`` costs it
    ~30 ms more); torch counts no positives (ours does, at no discount)."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return {}
    c = x.shape[-1]
    xt, yt = torch.from_numpy(x.reshape(-1, c)), torch.from_numpy(y.reshape(-1, c))  # rows x classes
    kept = xt.detach().clone().requires_grad_(True)

    def step(leaf: torch.Tensor) -> None:
        elementwise = F.binary_cross_entropy_with_logits(leaf, yt, reduction="none")
        elementwise.detach().sum(dim=0)
        if leaf.requires_grad:
            elementwise.mean().backward()
        else:
            elementwise.mean()

    def forward() -> None:
        with torch.no_grad():
            step(xt)

    return {"torch/forward": forward, "torch/fresh": lambda: step(xt.detach().requires_grad_(True)),
            "torch/reused": lambda: step(kept)}


def kernel_calls(x: np.ndarray, y: np.ndarray) -> tuple[Calls, list[str]]:
    """Forward, fresh-buffer and reused-buffer calls for every available backend of the built-in terms."""
    calls: Calls = {}
    notes = []
    reused = np.zeros_like(x)
    for term in ("class_weighted_bce", "sigmoid_focal"):
        for backend, kernel in kernels(term).items():
            reason = kernel.unavailable()
            if reason:
                notes.append(f"  {term:<20} {backend:<8} unavailable: {reason}")
                continue
            call = loss(term, backend=backend)
            calls[f"{term}/{backend}/forward"] = functools.partial(call, x, y)
            calls[f"{term}/{backend}/fresh"] = lambda call=call: call(x, y, np.zeros_like(x))
            calls[f"{term}/{backend}/reused"] = functools.partial(call, x, y, reused)
    return calls, notes


def integration_calls(x: np.ndarray, y: np.ndarray, device: str) -> tuple[Calls, str]:
    """One batch through the Ultralytics integration's classification loss, three ways; the host path's kernel."""
    try:
        import torch
        from torch import nn

        from tracker.integrations.ultralytics_loss import ClassificationLoss, HostTermLoss, check_loss, term_module
        from tracker.losses import BoundLoss, get_term
    except ImportError as exc:
        return {}, f"not measured: {exc}"
    xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    total = yt.sum().clamp(min=1)
    c = x.shape[-1]
    builtin, _ = term_module("class_weighted_bce", {}, np.ones(c), c)
    host = HostTermLoss(BoundLoss(get_term("class_weighted_bce"), "auto", check_loss("class_weighted_bce", {})))
    modules = {"stock": nn.BCEWithLogitsLoss(reduction="none"), "builtin": builtin, "host": host}
    calls: Calls = {}
    for name, inner in modules.items():
        wrapper = ClassificationLoss(inner.to(device), gain=0.5, class_weights=None)

        def batch(wrapper: ClassificationLoss = wrapper) -> None:
            leaf = xt.detach().requires_grad_(True)
            (wrapper(leaf, yt).sum() / total).backward()
            if device != "cpu":
                torch.cuda.synchronize()

        calls[f"ultralytics/{name}"] = batch
    return calls, auto_kernel("class_weighted_bce", x.size).backend


def peak_extra_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated through Python/numpy during ``fn()`` (tracemalloc)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def agreement(x: np.ndarray, y: np.ndarray) -> str:
    """How far our numpy kernel's loss and gradient are from torch's on this batch."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return "same result: not checked (torch not installed)"
    grad = np.zeros_like(x)
    ours = loss("class_weighted_bce", backend="numpy")(x, y, grad)
    leaf = torch.from_numpy(x).requires_grad_(True)
    elementwise = F.binary_cross_entropy_with_logits(leaf, torch.from_numpy(y), reduction="none")
    elementwise.mean().backward()
    per_class = elementwise.detach().sum(dim=0, dtype=torch.float64).numpy()
    return (f"same result: numpy class_weighted_bce vs torch: loss {float(ours.loss):.7g} vs "
            f"{float(elementwise.detach().mean()):.7g}, per-class sums max rel diff "
            f"{np.max(np.abs(ours.per_class - per_class) / np.abs(per_class)):.1e}, gradient max abs diff "
            f"{np.max(np.abs(grad - leaf.grad.numpy())):.1e}")


def report(wall: dict[str, float], cpu: dict[str, float], calls: Calls, nbytes: int) -> None:
    """One row per term and backend: wall ms (CPU ms) per variant, ratio to torch's same variant."""
    cell = "{:>7.1f} ({:>6.1f})"
    print(f"  {'':<28} " + "  ".join(f"{LABELS[v] + ' ms (cpu)':>21}" for v in VARIANTS)
          + "   vs torch, wall (cpu): fresh / reused")
    print(f"  {'torch BCE-with-logits':<28} "
          + "  ".join(f"{cell.format(wall[f'torch/{v}'], cpu[f'torch/{v}']):>21}" for v in VARIANTS)
          if "torch/fresh" in wall else "  torch not installed: no baseline")
    for key in [k[: -len("/forward")] for k in wall if k.endswith("/forward") and not k.startswith("torch/")]:
        term, backend = key.split("/")
        ratios = []
        for v in ("fresh", "reused"):
            base = wall.get(f"torch/{v}")
            ratios.append(f"{wall[f'{key}/{v}'] / base:4.2f}x ({cpu[f'{key}/{v}'] / cpu[f'torch/{v}']:4.2f}x)"
                          if base else "n/a")
        memory = ""
        if backend == "numpy":
            fresh, reused = (peak_extra_bytes(calls[f"{key}/{v}"]) for v in ("fresh", "reused"))
            memory = f"  peak extra {fresh / nbytes:4.2f}x / {reused / nbytes:4.2f}x logits"
        print(f"  {term + ' ' + backend:<28} "
              + "  ".join(f"{cell.format(wall[f'{key}/{v}'], cpu[f'{key}/{v}']):>21}" for v in VARIANTS)
              + f"   {ratios[0]} / {ratios[1]}{memory}")


def report_ratios(samples: dict[str, list[float]], repeat: int) -> None:
    """Per-round ratios to torch's same variant, and the targets."""
    if "torch/fresh" not in samples:
        return
    print(f"  per-round ratio to torch's same variant, median (min-max) over {repeat} rounds:")
    for key in (k for k in samples if k.endswith("/fresh") and not k.startswith("torch/")):
        name = key[: -len("/fresh")]
        print(f"    {name:<30} fresh {ratio_spread(samples[key], samples['torch/fresh'])}   "
              f"reused {ratio_spread(samples[name + '/reused'], samples['torch/reused'])}")
    numpy_bce = "class_weighted_bce/numpy"
    if numpy_bce + "/fresh" in samples:
        print(f"  target: numpy class_weighted_bce <= 0.7x torch: fresh "
              f"{ratio_spread(samples[numpy_bce + '/fresh'], samples['torch/fresh'])}, reused "
              f"{ratio_spread(samples[numpy_bce + '/reused'], samples['torch/reused'])}")
    if "class_weighted_bce/vulkan/fresh" in samples:
        print(f"  target: vulkan class_weighted_bce <= 0.45x numpy (fresh): "
              f"{ratio_spread(samples['class_weighted_bce/vulkan/fresh'], samples[numpy_bce + '/fresh'])}")


def report_integration(samples: dict[str, list[float]], cpu: dict[str, float], host: str, device: str) -> None:
    """The Ultralytics path's three rows and their ratio to the stock BCE."""
    if "ultralytics/stock" not in samples:
        print(f"  Ultralytics integration path {host}")
        return
    print(f"  Ultralytics integration path on {device}: ClassificationLoss(bce)(logits, targets).sum() / "
          "target_scores_sum, backward (fresh leaf per batch):")
    rows = {"stock": "stock BCEWithLogitsLoss + per-class tracking",
            "builtin": "class_weighted_bce, built-in (tracker.torch ops)",
            "host": f"HostTermFunction bridge, auto -> {host} kernel"}
    base = samples["ultralytics/stock"]
    for name, label in rows.items():
        ms = samples[f"ultralytics/{name}"]
        print(f"    {label:<52} {min(ms):7.1f} ({cpu[f'ultralytics/{name}']:6.1f}) ms   "
              f"vs stock {ratio_spread(ms, base)}")
    if device == "cpu":
        print("    (on cpu the bridge's host<->device copies are no copies; --device cuda times them)")


def main() -> None:
    """Parse sizes, run the benchmark and print the figures."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--anchors", type=int, default=8400)
    parser.add_argument("--classes", type=int, default=80)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=cpus, help="threads for torch, our kernels and BLAS")
    parser.add_argument("--device", default="cpu", help="torch device of the Ultralytics path rows")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n = args.batch * args.anchors
    x = (rng.standard_normal((n, args.classes), dtype=np.float32) * 3.0).reshape(args.batch, args.anchors, -1)
    y = (rng.random(x.shape) < 0.01).astype(np.float32)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"logits {x.shape} float32 = {x.size / 1e6:.2f} M elements ({x.nbytes / 2**20:.1f} MiB); "
          f"{cpus} CPUs, load average {load:.2f}; best of {args.repeat} interleaved rounds (ratios: per round)")
    print(set_threads(args.threads))
    print("each call, both sides: loss (mean) + per-class loss sums (torch: float32 sum(dim=0), its fastest; ours: "
          "float64, plus positives per class); with gradient into a fresh buffer per call or a reused one (added "
          "into)")
    print(agreement(x.reshape(n, -1), y.reshape(n, -1)))
    calls, notes = kernel_calls(x, y)
    calls = {**torch_calls(x.reshape(n, -1), y.reshape(n, -1)), **calls}
    ultra, host = integration_calls(x, y, args.device)
    samples, cpu_samples = interleaved_ms({**calls, **ultra}, args.repeat)
    wall = {k: min(v) for k, v in samples.items()}
    cpu = {k: min(v) for k, v in cpu_samples.items()}
    report(wall, cpu, calls, x.nbytes)
    report_ratios(samples, args.repeat)
    report_integration(samples, cpu, host, args.device)
    for note in notes:
        print(note)
    print("wall ms (process CPU ms, all threads), best of the rounds; < 2x torch is the target")


if __name__ == "__main__":
    main()
