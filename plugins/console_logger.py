"""Console logger (rich): a line per interval with the step, the rate and the latest values."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tracker import hookimpl
from tracker.loggers import Batch

if TYPE_CHECKING:  # pragma: no cover
    from tracker.run import Run

MAX_KEYS = 6


class ConsoleSession:
    def __init__(self, run: "Run", console: Console, every_s: float):
        self.run, self.console, self.every_s = run, console, every_s
        self.latest: dict[str, float] = {}
        self.last_print = 0.0
        self.t0 = time.monotonic()
        self.first_step = run.start_step
        verb = "resumed" if run.reason == "resume" else "started"
        console.print(
            f"[bold]tracker[/] run [cyan]{run.run_id}[/] ({run.project}/{run.name}) {verb} at step {run.start_step}"
        )

    def write(self, batch: Batch) -> None:
        if batch.metrics is not None and batch.metrics.num_rows:
            keys = batch.metrics.column("key").to_pylist()
            values = batch.metrics.column("value").to_pylist()
            self.latest.update(zip(keys, values))
        for ev in (batch.events.to_pylist() if batch.events is not None else []):
            color = {"error": "red", "warning": "yellow"}.get(ev["severity"], "blue")
            self.console.print(f"[{color}]{ev['kind']}[/] step {ev['step']} {ev['key'] or ''}: {ev['message']}")
        now = time.monotonic()
        if batch.last_step is not None and now - self.last_print >= self.every_s:
            self.last_print = now
            self.console.print(self._line(batch.last_step, now))

    def _line(self, step: int, now: float) -> str:
        rate = (step - self.first_step + 1) / max(now - self.t0, 1e-9)
        shown = sorted(self.latest.items())[:MAX_KEYS]
        vals = "  ".join(f"{k}={v:.4g}" if math.isfinite(v) else f"{k}=[red]{v}[/]" for k, v in shown)
        return f"[dim]{self.run.run_id}[/] step {step:>8} {rate:8.1f} steps/s  {vals}"

    def close(self, status: str) -> None:
        color = "green" if status == "finished" else "red"
        self.console.print(f"[bold]tracker[/] run [cyan]{self.run.run_id}[/] [{color}]{status}[/]")


@dataclass(frozen=True)
class ConsoleLogger:
    name: str = "console"
    description: str = "progress and latest values on the terminal (rich)"
    every_s: float = 2.0

    def open(self, run: "Run") -> ConsoleSession:
        return ConsoleSession(run, Console(stderr=True), self.every_s)


@hookimpl
def tracker_register_loggers(register: Any) -> None:
    register(ConsoleLogger())
