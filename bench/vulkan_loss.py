"""Benchmark: the Vulkan loss kernel against the numpy kernel and torch on the CPU.

Workload: one YOLO batch, 16 x 8,400 x 80 float32 logits (10.75 M elements), 1%
positive targets, ``class_weighted_bce`` with ``reduction="mean"``. Every call
gives the loss, the per-class sums and positive counts, and ADDS the gradient into
a float32 buffer. Measured in one run, round-robin, best of N rounds each (a busy
machine slows them alike):

* ``vulkan``: ``tracker.loss(..., backend="vulkan")``, transfers included (the
  inputs go to the device and the gradient comes back into the caller's array);
* ``vulkan kernel``: the GPU time of the same call alone (timestamp queries);
* ``vulkan kernel, no gradient``: the same kernel asked for the loss and the
  per-class sums only, so the gradient's read-add-write is the difference between
  the two kernel rows;
* ``numpy``: ``tracker.loss(..., backend="numpy")``;
* ``torch``: ``binary_cross_entropy_with_logits`` (``reduction="none"``, per-class
  sums, then mean) + ``backward()`` into a reused leaf's ``.grad``, like the reused
  buffers here (bench/losses.py's ``torch/reused``).

Targets on lavapipe: transfers included, <= 0.45x the numpy time and no slower than
torch. Run: ``.venv/bin/python bench/vulkan_loss.py`` (``--help`` for sizes). It
prints and never fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a file, this folder heads sys.path; sibling benchmarks (bench/logging.py)
# must not shadow standard-library modules.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import os  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

from bench.losses import interleaved_ms, ratio_spread, torch_calls  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--anchors", type=int, default=8400)
    parser.add_argument("--classes", type=int, default=80)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)

    import gpu
    import tracker
    from plugins import vulkan_exec

    ok, why = gpu.available()
    if not ok:
        print(f"vulkan unavailable: {why}")
        return
    rng = np.random.default_rng(0)
    shape = (args.batch, args.anchors, args.classes)
    x = rng.normal(0.0, 3.0, shape).astype(np.float32)
    y = (rng.random(shape) < 0.01).astype(np.float32)
    grads = {name: np.zeros(shape, np.float32) for name in ("vulkan", "numpy", "kernel")}
    losses = {name: tracker.loss("class_weighted_bce", backend=name) for name in ("vulkan", "numpy")}
    kernels = vulkan_exec.kernels()
    w = np.ones(args.classes, np.float32)
    timings: dict[str, float] = {}

    def kernel(grad: np.ndarray | None, best_key: str) -> Callable[[], None]:
        """One kernel call with timestamps, keeping its fastest kernel time under ``best_key``.

        The gradient call's timings are also the "last vulkan call" line's."""
        def call() -> None:
            out = kernels.run("bce", x.reshape(-1, args.classes), y.reshape(-1, args.classes),
                              None if grad is None else grad.reshape(-1, args.classes), weight=w, timestamps=True)
            if grad is not None:
                timings.update(out.timings)
            timings[best_key] = min(timings.get(best_key, float("inf")), out.timings["kernel_ms"])
        return call

    calls: dict[str, Callable[[], Any]] = {
        "vulkan": lambda: losses["vulkan"](x, y, grads["vulkan"]),
        "vulkan (timestamps)": kernel(grads["kernel"], "min_kernel_ms"),
        "vulkan (no gradient)": kernel(None, "min_kernel_no_grad_ms"),
        "numpy": lambda: losses["numpy"](x, y, grads["numpy"]),
        **{k: v for k, v in torch_calls(x, y).items() if k == "torch/reused"},
    }
    samples, cpu_samples = interleaved_ms(calls, args.rounds)
    best = {name: (min(samples[name]), min(cpu_samples[name])) for name in calls}
    dev = vulkan_exec.device()
    print(f"class_weighted_bce, mean, grad added, {' x '.join(map(str, shape))} float32 "
          f"({x.size / 1e6:.2f} M elements), 1% positives")
    print(f"device: {dev.info.name} ({dev.info.type}); cpus: {os.cpu_count()}; "
          f"LP_NUM_THREADS={os.environ.get('LP_NUM_THREADS', 'default')}; "
          f"load average: {os.getloadavg()[0]:.1f}; best of {args.rounds} rounds")
    numpy_ms = best["numpy"][0]
    torch_ms = best.get("torch/reused", (float("nan"),))[0]
    print(f"{'call':<22}{'wall ms':>10}{'cpu ms':>10}{'/ numpy':>10}{'/ torch':>10}")
    rows = [(name, *best[name]) for name in calls if not name.startswith("vulkan (")]
    rows.insert(1, ("vulkan kernel only", timings["min_kernel_ms"], float("nan")))
    rows.insert(2, ("  without gradient", timings["min_kernel_no_grad_ms"], float("nan")))
    for name, wall, cpu in rows:
        print(f"{name:<22}{wall:>10.1f}{cpu:>10.1f}{wall / numpy_ms:>10.2f}{wall / torch_ms:>10.2f}")
    print(f"last vulkan call: upload {timings['upload_ms']:.1f} ms, gpu {timings['gpu_ms']:.1f} ms, "
          f"gradient/readback {timings['download_ms']:.1f} ms; the gradient's read-add-write costs the kernel "
          f"{timings['min_kernel_ms'] - timings['min_kernel_no_grad_ms']:.1f} ms")
    vk_ms = best["vulkan"][0]
    print(f"per-round ratios, median (min-max) over {args.rounds} rounds: vulkan / numpy "
          f"{ratio_spread(samples['vulkan'], samples['numpy'])}"
          + (f", vulkan / torch {ratio_spread(samples['vulkan'], samples['torch/reused'])}"
             if "torch/reused" in samples else ""))
    print(f"targets: vulkan <= 0.45x numpy: {vk_ms / numpy_ms:.2f}x best "
          f"({'met' if vk_ms <= 0.45 * numpy_ms else 'missed'}); vulkan <= torch: {vk_ms / torch_ms:.2f}x "
          f"({'met' if vk_ms <= torch_ms else 'missed'})")
    # both gradients received the same rounds + 1 calls (one warm-up)
    diff = float(np.max(np.abs(grads["vulkan"] - grads["numpy"])) / np.max(np.abs(grads["numpy"])))
    print(f"gradient after {args.rounds + 1} calls each: max |vulkan - numpy| / max |numpy| = {diff:.1e}")


if __name__ == "__main__":
    main()
