"""Real training, not generated curves: a small numpy MLP (multi-label, BCE with logits)
trained (a) healthily, (b) with a learning rate that makes it diverge, (c) with
float16 logits that overflow. Runs go through tracker.init, so the online detectors
run on the flusher; the same runs are then analysed offline and must agree."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

import ml_dtypes
import numpy as np
import pytest

import tracker
from tracker.analysis import analyze

STEPS = 1500
BAD_FROM = 800  # (b): the learning rate jumps here; (c): raw-unit batches start here
RAW_EVERY = 97
RAW_SCALE = 65536.0  # a shard stored in raw 16-bit sensor units instead of normalised


@dataclass
class Trained:
    """What the training loop saw, independent of the detectors."""

    run_id: str
    status: str
    losses: np.ndarray
    first_overflow: int | None
    raw_steps: list[int] = field(default_factory=list)


def _data(seed: int, n: int = 4096, d: int = 32, c: int = 20) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    w = rng.standard_normal((d, c)) / np.sqrt(d) * 3
    b = -np.linspace(0.5, 4.0, c)  # imbalanced: class 19 is rare
    y = (x @ w + b + 0.5 * rng.standard_normal((n, c)) > 0).astype(np.float64)
    return x, y


def _bce(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))


def train(
    config: dict[str, Any],
    lr: Callable[[int], float] = lambda step: 0.5,
    logits_dtype: Any = np.float64,
    raw_from: int | None = None,
    seed: int = 0,
    hidden: int = 32,
    batch: int = 64,
) -> Trained:
    """Train the MLP, logging loss and per-class loss; returns what the loop saw.

    Like torch.amp's GradScaler, a step whose gradients are not finite is skipped.
    Gradients are clipped to norm 1.
    """
    x, y = _data(seed)
    rng = np.random.default_rng(seed + 1)
    d, c = x.shape[1], y.shape[1]
    w1, b1 = rng.standard_normal((d, hidden)) * np.sqrt(2 / d), np.zeros(hidden)
    w2, b2 = rng.standard_normal((hidden, c)) * np.sqrt(1 / hidden), np.zeros(c)
    losses, raw_steps, first = [], [], None
    run = tracker.init("mlp", config={"tracker_flush_interval": 0.02, **config})
    run.set_classes([f"c{i}" for i in range(c)])
    for step in range(STEPS):
        idx = rng.integers(0, x.shape[0], batch)
        xb, yb = x[idx], y[idx]
        if raw_from is not None and step >= raw_from and step % RAW_EVERY == 0:
            xb = xb * RAW_SCALE
            raw_steps.append(step)
        with np.errstate(all="ignore"):
            h_pre = xb @ w1 + b1
            h = np.maximum(h_pre, 0)
            z = (h.astype(logits_dtype) @ w2.astype(logits_dtype) + b2.astype(logits_dtype)).astype(np.float64)
            per = _bce(z, yb)
            g = (1 / (1 + np.exp(-z)) - yb) / (batch * c)
        if first is None and not np.isfinite(z).all():
            first = step
        losses.append(float(per.mean()))
        run.log({"loss": losses[-1], "lr": lr(step)}, step=step)
        if step % 10 == 0:
            run.log_classes("loss/cls", per.mean(axis=0), step=step)
        if step % 137 == 0:
            run.flush()
        if not np.isfinite(g).all():
            continue
        gh = g @ w2.T * (h_pre > 0)
        grads = [xb.T @ gh, gh.sum(0), h.T @ g, g.sum(0)]
        rate = lr(step) * min(1.0, 1.0 / float(np.sqrt(sum((q * q).sum() for q in grads))))
        for p, q in zip((w1, b1, w2, b2), grads):
            p -= rate * q
    run.finish()
    return Trained(run.run_id, run.status, np.array(losses), first, raw_steps)


def stored_events(run_id: str) -> list[tuple[Any, ...]]:
    """The events the flusher stored for ``run_id``."""
    df = tracker.query(
        "SELECT step, key, kind, severity, message, data FROM events WHERE run_id = ? ORDER BY step, key, kind",
        [run_id],
    )
    return [(s, k, kind, sev, msg, json.loads(data)) for s, k, kind, sev, msg, data in df.iter_rows()]


def offline_events(run_id: str) -> list[tuple[Any, ...]]:
    """The events ``tracker.analyze`` finds on the stored rows."""
    found = analyze(run_id).events
    return [(r.event.step, r.event.key, r.event.kind, r.event.severity, r.event.message, r.event.data) for r in found]


def test_healthy_run_raises_nothing_and_converges() -> None:
    trained = train({"lr": 0.5})
    assert trained.status == "finished"
    assert trained.losses[-100:].mean() < 0.5 * trained.losses[:20].mean()
    assert stored_events(trained.run_id) == []
    result = analyze(trained.run_id)
    assert result.events == []
    (report,) = [r for r in result.keys if r.key == "loss"]
    assert report.verdict == "converging"
    assert report.trend is not None and report.trend.direction == "decreasing"


def test_learning_rate_jump_diverges_at_the_right_step() -> None:
    trained = train({"lr": "0.5 then 40"}, lr=lambda step: 0.5 if step < BAD_FROM else 40.0)
    jump = BAD_FROM + int(np.argmax(trained.losses[BAD_FROM:] > 3 * trained.losses[BAD_FROM - 100 : BAD_FROM].mean()))
    events = stored_events(trained.run_id)
    (divergence,) = [e for e in events if e[2] == "divergence"]
    step = divergence[0]
    assert BAD_FROM <= jump <= step <= BAD_FROM + 200
    assert not [e for e in events if e[0] < step]
    assert trained.status == "diverged"
    assert tracker.query("SELECT status FROM runs WHERE run_id = ?", [trained.run_id])["status"][0] == "diverged"
    assert events == offline_events(trained.run_id)
    (report,) = [r for r in analyze(trained.run_id).keys if r.key == "loss"]
    assert report.verdict == "diverging"


def test_float16_logits_overflow_is_flagged_at_that_step_with_the_bfloat16_hint() -> None:
    trained = train({"dtype": "float16"}, logits_dtype=np.float16, raw_from=BAD_FROM)
    assert trained.first_overflow is not None and trained.first_overflow >= BAD_FROM
    assert not np.isfinite(trained.losses[trained.first_overflow])
    events = stored_events(trained.run_id)
    non_finite = [e for e in events if e[2] == "non_finite"]
    assert non_finite[0][0] == trained.first_overflow
    assert "bfloat16" in non_finite[0][4] and "GradScaler" in non_finite[0][4]
    assert non_finite[0][3] == "error"
    assert not [e for e in events if e[0] < trained.first_overflow]
    assert events == offline_events(trained.run_id)


def test_the_same_run_in_bfloat16_has_no_non_finite_loss() -> None:
    trained = train({"dtype": "bfloat16"}, logits_dtype=ml_dtypes.bfloat16, raw_from=BAD_FROM)
    assert trained.first_overflow is None
    events = stored_events(trained.run_id)
    assert [e for e in events if e[2] in ("non_finite", "divergence")] == []
    spikes = [e[0] for e in events if e[2] == "spike"]
    assert spikes and set(spikes) <= set(trained.raw_steps)
    assert events == offline_events(trained.run_id)


@pytest.mark.slow
def test_online_and_offline_agree_when_flushes_cut_anywhere() -> None:
    trained = train({"dtype": "float16", "tracker_flush_interval": 0.001}, logits_dtype=np.float16, raw_from=300)
    assert stored_events(trained.run_id) == offline_events(trained.run_id)
