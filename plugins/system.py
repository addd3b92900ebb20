"""Built-in plugin: the system sampler, a background thread that logs ``sys/*`` keys.

Rules:

* Started by ``tracker_run_start`` for every run unless ``tracker.init(system=False)``
  or ``TRACKER_SYSTEM=0`` (settings: :mod:`tracker.system`); stopped by
  ``tracker_run_end``. It runs on its own daemon thread: the training thread
  pays nothing (no hook in ``run.log``, no lock it could wait on). A sample
  taken while ``finish()`` runs may be dropped: ``finish()`` flushes before
  ``tracker_run_end`` stops the sampler.
* Every ``interval`` seconds (default 2) it takes one sample and logs it with
  ``run.log(values, step=run.step)``: ordinary metric rows at the run's current
  step, with their wall time, so every page, query and detector works on them.
  Nothing is logged before the run's first step (the step counter is the
  training thread's to start). ``run.log`` is safe from a second thread: its
  buffers are deques (appends are atomic) and a row at a step no later than the
  last one never moves the step counter.
* Keys (bytes are bytes, times are seconds, loads are percent):

  ``sys/proc/rss``, ``sys/proc/cpu`` (100 = one core busy), ``sys/host/mem_used``,
  ``sys/host/mem_total``, ``sys/host/cpu`` (all cores);

  ``sys/step_time``: wall seconds per step, the sampling interval divided by the
  steps the run's counter advanced in it (no row when it did not advance);
  ``sys/data_time`` is the user's or the integration's to log (seconds a step
  waited for its batch: the Ultralytics integration logs it, a plain loop times
  ``next(batches)``, see ``docs/system-metrics.md``); the detectors compare the two;

  per CUDA device ``i`` that this process has used (only when the program imported
  torch and initialised CUDA itself: the sampler never initialises it):
  ``sys/gpu{i}/allocated``, ``sys/gpu{i}/reserved``, ``sys/gpu{i}/max_allocated``
  (``torch.cuda.memory_stats``) and ``sys/gpu{i}/total`` (the device's memory,
  the limit the detectors project against); with ``nvidia-ml-py`` (extra
  ``[nvml]``) also ``sys/gpu{i}/util`` and ``sys/gpu{i}/mem_used`` (all processes),
  matched to CUDA devices by UUID;

  the Vulkan backend's device memory pool, when its device is live:
  ``sys/pool/reserved``, ``sys/pool/live``, ``sys/pool/peak_live``,
  ``sys/pool/allocations``, ``sys/pool/frees``, ``sys/pool/live_allocations``
  (:func:`gpu.pool.memory_stats`).
* A source that fails is dropped for the rest of the run (logged once); the
  sampler itself never raises into the program.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Callable

from tracker import hookimpl
from tracker.system import SystemOptions, system_options

log = logging.getLogger(__name__)

Source = Callable[[], dict[str, float]]
_SAMPLERS: dict[Any, "SystemSampler"] = {}


def process_source() -> Source:
    """RSS and CPU of this process, memory and CPU of the host (psutil)."""
    import psutil

    proc = psutil.Process()
    proc.cpu_percent(None)
    psutil.cpu_percent(None)

    def sample() -> dict[str, float]:
        mem = psutil.virtual_memory()
        return {
            "sys/proc/rss": float(proc.memory_info().rss),
            "sys/proc/cpu": float(proc.cpu_percent(None)),
            "sys/host/mem_used": float(mem.total - mem.available),
            "sys/host/mem_total": float(mem.total),
            "sys/host/cpu": float(psutil.cpu_percent(None)),
        }

    return sample


def _nvml_handle(pynvml: Any, torch: Any, index: int) -> Any:
    """The NVML handle of CUDA device ``index``, found by its UUID (CUDA and NVML number devices
    differently under CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER); None when it cannot be matched."""
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    except Exception as exc:
        log.info("system sampler: no NVML handle for CUDA device %d: %s", index, exc)
        return None


class CudaSource:
    """torch.cuda's allocator figures (and NVML's) for the CUDA devices this process uses.

    Reads ``torch.cuda.memory_stats(i)`` (the caching allocator's counters: no CUDA
    call, no context on a device the process does not use; the allocator's lock is
    held for microseconds) for each device with reserved memory, and
    ``get_device_properties(i).total_memory`` once per device. NVML is started
    once, on the sampler's thread, and shut down by :meth:`close`.
    """

    def __init__(self) -> None:
        self.torch: Any = None
        self.totals: dict[int, float] = {}
        self.pynvml: Any = None
        self.nvml_ok: bool | None = None
        self.handles: dict[int, Any] = {}

    def _devices(self) -> list[int]:
        torch = self.torch
        used = []
        for i in range(torch.cuda.device_count()):
            if i in self.totals or torch.cuda.memory_reserved(i) > 0:
                used.append(i)
                if i not in self.totals:
                    self.totals[i] = float(torch.cuda.get_device_properties(i).total_memory)
        return used

    def _nvml(self, devices: list[int]) -> dict[int, Any]:
        if self.nvml_ok is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                self.pynvml, self.nvml_ok = pynvml, True
            except Exception as exc:  # ImportError without the [nvml] extra, NVMLError without a driver
                log.info("system sampler: no NVML figures: %s", exc)
                self.nvml_ok = False
        if self.nvml_ok:
            for i in devices:
                if i not in self.handles:
                    self.handles[i] = _nvml_handle(self.pynvml, self.torch, i)
        return {i: h for i, h in self.handles.items() if h is not None}

    def __call__(self) -> dict[str, float]:
        """One sample; empty until the program has imported torch and initialised CUDA."""
        if self.torch is None:
            torch = sys.modules.get("torch")
            cuda = getattr(torch, "cuda", None)
            if cuda is None or not cuda.is_initialized():
                return {}
            self.torch = torch
        out: dict[str, float] = {}
        devices = self._devices()
        for i in devices:
            stats = self.torch.cuda.memory_stats(i)
            out[f"sys/gpu{i}/allocated"] = float(stats.get("allocated_bytes.all.current", 0))
            out[f"sys/gpu{i}/reserved"] = float(stats.get("reserved_bytes.all.current", 0))
            out[f"sys/gpu{i}/max_allocated"] = float(stats.get("allocated_bytes.all.peak", 0))
            out[f"sys/gpu{i}/total"] = self.totals[i]
        if devices:
            for i, handle in self._nvml(devices).items():
                out[f"sys/gpu{i}/util"] = float(self.pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                out[f"sys/gpu{i}/mem_used"] = float(self.pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        return out

    def close(self) -> None:
        """Shut NVML down if this source started it."""
        if self.nvml_ok:
            try:
                self.pynvml.nvmlShutdown()
            except Exception as exc:
                log.debug("system sampler: nvmlShutdown: %s", exc)
        self.nvml_ok, self.handles = None, {}


def vulkan_pool_source() -> dict[str, float]:
    """The Vulkan backend's device pool (only while its device is live; never opens one)."""
    backend = sys.modules.get("plugins.vulkan_exec")
    device = getattr(backend, "_shared", {}).get("device") if backend is not None else None
    pools = getattr(device, "pools", None)
    if not pools:
        return {}
    from gpu.pool import memory_stats

    stats = memory_stats(pools["device"]).as_dict()
    stats.pop("peak_reserved", None)
    if not stats["limit"]:  # no cap on the pool: nothing to draw
        del stats["limit"]
    return {f"sys/pool/{name}": float(value) for name, value in stats.items()}


class SystemSampler:
    """Samples every ``interval`` seconds on a daemon thread and logs into ``run``."""

    def __init__(self, run: Any, interval: float, sources: list[Source] | None = None) -> None:
        self.run = run
        self.interval = float(interval)
        self.cuda = CudaSource()
        self.sources: list[Source] | None = sources
        self.samples = 0
        self.cpu_seconds = 0.0
        self._last: tuple[float, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (the first sample comes one interval later)."""
        name = f"tracker-system-{getattr(self.run, 'run_id', 'run')}"
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it. Safe to call twice."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self.cuda.close()

    def sample(self) -> dict[str, float]:
        """One sample of every source, plus ``sys/step_time`` since the previous one."""
        if self.sources is None:  # built here, on the sampler's thread (psutil's import is not free)
            self.sources = [process_source(), self.cuda, vulkan_pool_source]
        values: dict[str, float] = {}
        for source in list(self.sources):
            try:
                values.update(source())
            except Exception as exc:
                log.warning("system sampler: source %s dropped: %s: %s",
                            getattr(source, "__name__", type(source).__name__), type(exc).__name__, exc)
                self.sources.remove(source)
        step, now = self.run.step, time.time()
        if step is not None:
            if self._last is not None and step > self._last[1]:
                values["sys/step_time"] = (now - self._last[0]) / (step - self._last[1])
            if self._last is None or step > self._last[1]:
                self._last = (now, step)
        return values

    def tick(self) -> bool:
        """Take one sample and log it; False once the run no longer takes rows."""
        t0 = time.thread_time()
        values = self.sample()
        step = self.run.step
        try:
            if values and step is not None:
                self.run.log(values, step=step)
                self.samples += 1
        except Exception as exc:  # the run finished between the check and the log
            log.debug("system sampler of run %s stops: %s", getattr(self.run, "run_id", "?"), exc)
            return False
        finally:
            self.cpu_seconds += time.thread_time() - t0
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if getattr(self.run, "_finished", False) or not self.tick():
                break


def log_pool_replay(run: Any, steps: Any, pool: Any, first_step: int = 0) -> int:
    """Replay a per-step allocation trace on ``pool`` and log its figures as ``sys/pool/*``.

    ``steps`` and ``pool`` are those of :func:`gpu.pool_sim.replay_steps` (our
    :class:`gpu.pool.Pool` or a simulated policy); one row per step, as the
    sampler would log the Vulkan backend's pool. Returns the steps logged.
    """
    from gpu.pool_sim import replay_steps

    count = 0
    for count, stats in enumerate(replay_steps(steps, pool), start=1):
        figures = stats.as_dict()
        if not figures["limit"]:
            del figures["limit"]
        run.log({f"sys/pool/{name}": float(value) for name, value in figures.items()}, step=first_step + count - 1)
    return count


def sampler_for(run: Any) -> SystemSampler | None:
    """The sampler running for ``run``, if any."""
    return _SAMPLERS.get(run)


@hookimpl
def tracker_run_start(run: Any) -> None:
    """Start the run's sampler unless the run or the environment turned it off."""
    options: SystemOptions = getattr(run, "system", None) or system_options(None)
    if not options.enabled or run in _SAMPLERS:
        return
    sampler = SystemSampler(run, options.interval)
    _SAMPLERS[run] = sampler
    sampler.start()


@hookimpl
def tracker_run_end(run: Any, status: str) -> None:
    """Stop the run's sampler."""
    sampler = _SAMPLERS.pop(run, None)
    if sampler is not None:
        sampler.stop()
