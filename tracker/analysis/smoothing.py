"""Smoothing and robust statistics for loss curves, fed in chunks.

Rules:

* The smoothed curve is TensorBoard's debiased exponential moving average:
  ``last = w * last + (1 - w) * x`` over the finite values only (a NaN or inf is
  skipped, as TensorBoard does), divided by ``1 - w**n`` where ``n`` counts the
  finite values seen, so the first points are not pulled towards zero.
* Chunk invariance. A stream is cut into blocks of ``BLOCK`` finite values counted
  from its first value. Inside a block the recurrence is solved by a log-step scan
  (``y[i] += w**s * y[i - s]`` for s = 1, 2, 4, ...) in which position ``i`` only
  ever reads positions ``<= i``; blocks are then chained by a carry. An open block
  at the end of a chunk is kept and recomputed whole with the next chunk. Every
  output value therefore comes from the same floating-point operations whether
  the stream arrives in one chunk or in many: the results are bit-identical.
* Robust scale uses the same blocks: the values of block ``k`` are judged by the
  median of block ``k - 1``, so a spike never inflates the scale it is judged by,
  and the statistic does not depend on where the chunks end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tracker.errors import ConfigError

BLOCK = 256
MAD_TO_SIGMA = 1.4826  # median(|z|) of a standard normal is 1 / 1.4826


def _check_weight(weight: float) -> float:
    weight = float(weight)
    if not 0.0 <= weight < 1.0:
        raise ConfigError(f"smoothing weight {weight!r} must be in [0, 1); 0.9 is a light, 0.99 a heavy smoothing")
    return weight


def _block_scan(weight: float) -> tuple[np.ndarray, float]:
    """Powers ``w**(i+1)`` for i in 0..BLOCK-1 (by repeated products) and ``w**BLOCK``."""
    powers = np.empty(BLOCK)
    acc = 1.0
    for i in range(BLOCK):
        acc *= weight
        powers[i] = acc
    return powers, acc


def _scan_inplace(y: np.ndarray, weight: float) -> None:
    """Solve ``y[i] = w * y[i-1] + y[i]`` along axis 1, starting from zero, in log steps."""
    shift, factor = 1, weight
    width = y.shape[1]
    tmp = np.empty_like(y)
    while shift < width:
        part = tmp[:, : width - shift]
        np.multiply(y[:, : width - shift], factor, out=part)
        y[:, shift:] += part
        shift *= 2
        factor *= factor


@dataclass
class Ema:
    """Streaming debiased EMA over finite values; ``update`` returns the smoothed values."""

    weight: float
    count: int = 0
    _carry: float = 0.0
    _carry_debias: float = 0.0
    _pending: np.ndarray = field(default_factory=lambda: np.empty(0))

    def __post_init__(self) -> None:
        self.weight = _check_weight(self.weight)
        self._powers, self._power_block = _block_scan(self.weight)
        ones = np.full((1, BLOCK), 1.0 - self.weight)
        _scan_inplace(ones, self.weight)
        self._debias_block = ones[0]

    def update(self, values: np.ndarray) -> np.ndarray:
        """Smoothed values for ``values`` (finite float64), continuing the stream."""
        values = np.asarray(values, dtype=np.float64)
        m = values.size
        if m == 0:
            return np.empty(0)
        p = self._pending.size
        data = np.concatenate([self._pending, values]) if p else values
        total = p + m
        nblocks = -(-total // BLOCK)
        y = np.zeros(nblocks * BLOCK)
        y[:total] = data
        y = y.reshape(nblocks, BLOCK)
        y *= 1.0 - self.weight
        _scan_inplace(y, self.weight)
        carry, carry_d = self._chain(y[:, BLOCK - 1].tolist())
        smoothed = (y + self._powers * carry[:, None]).reshape(-1)
        debias = (self._debias_block + self._powers * carry_d[:, None]).reshape(-1)
        out = smoothed[p:total] / debias[p:total]
        self.count += m
        if total % BLOCK:
            self._pending = data[(nblocks - 1) * BLOCK : total].copy()
            self._carry, self._carry_debias = float(carry[-1]), float(carry_d[-1])
        else:
            self._pending = np.empty(0)
            self._carry, self._carry_debias = self._end_carry
        return out

    def _chain(self, ends: list[float]) -> tuple[np.ndarray, np.ndarray]:
        """Carries into each block: the raw and debias EMA state at its start."""
        carry = np.empty(len(ends))
        carry_d = np.empty(len(ends))
        c, d = self._carry, self._carry_debias
        end_d, wb = float(self._debias_block[-1]), self._power_block
        for k, end in enumerate(ends):
            carry[k], carry_d[k] = c, d
            c = end + wb * c
            d = end_d + wb * d
        self._end_carry = (c, d)
        return carry, carry_d


def _median3(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))


def _window_medians(data: np.ndarray, width: int) -> np.ndarray:
    """Median of every window of ``width`` consecutive values (min/max networks for 3 and 5)."""
    n = data.size - width + 1
    cols = [data[i : i + n] for i in range(width)]
    if width == 3:
        return _median3(*cols)
    if width == 5:
        a, b, c, d, e = cols
        low = np.maximum(np.minimum(a, b), np.minimum(c, d))
        high = np.minimum(np.maximum(a, b), np.maximum(c, d))
        return _median3(e, low, high)
    windows = np.lib.stride_tricks.sliding_window_view(data, width)
    return np.partition(windows, width // 2, axis=1)[:, width // 2]


@dataclass
class RollingMedian:
    """Streaming trailing median over ``width`` points (odd): isolated outliers vanish.

    A median of 5 ignores up to two outliers among five points, so a single-batch
    spike never moves what follows it, while a lasting rise passes two points late.
    The first ``width - 1`` points of a stream get the median of the points so far.
    """

    width: int = 5
    _tail: np.ndarray = field(default_factory=lambda: np.empty(0))

    def __post_init__(self) -> None:
        if self.width < 1 or self.width % 2 == 0:
            raise ConfigError(f"median width {self.width!r} must be an odd number >= 1 (1 turns it off)")

    def update(self, values: np.ndarray) -> np.ndarray:
        """Trailing medians for ``values``, continuing the stream."""
        values = np.asarray(values, dtype=np.float64)
        w = self.width
        if w == 1 or values.size == 0:
            return values.copy()
        p = self._tail.size
        data = np.concatenate([self._tail, values]) if p else values
        out = np.empty(values.size)
        first = max(w - 1 - p, 0)
        for i in range(min(first, values.size)):
            out[i] = np.median(data[: p + i + 1])
        if data.size >= w:
            out[first:] = _window_medians(data, w)[p + first - (w - 1) :]
        self._tail = data[-(w - 1) :].copy()
        return out


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's debiased EMA of ``values``; non-finite values stay as they are."""
    values = np.asarray(values, dtype=np.float64)
    out = values.copy()
    finite = np.isfinite(values)
    out[finite] = Ema(weight).update(values[finite])
    return out


@dataclass
class BlockMedian:
    """Streaming per-block median: each value gets the median of the previous whole block.

    ``update`` returns, for each new value, the median of the block before the one
    it falls in (NaN in the first block).
    """

    count: int = 0
    _previous: float = float("nan")
    _pending: np.ndarray = field(default_factory=lambda: np.empty(0))

    def update(self, values: np.ndarray) -> np.ndarray:
        """Previous-block medians for ``values``, continuing the stream."""
        values = np.asarray(values, dtype=np.float64)
        m = values.size
        if m == 0:
            return np.empty(0)
        p = self._pending.size
        data = np.concatenate([self._pending, values]) if p else values
        full = data.size // BLOCK
        medians = np.empty(full + 1)
        medians[0] = self._previous
        if full:
            medians[1:] = np.median(data[: full * BLOCK].reshape(full, BLOCK), axis=1)
        block_of = np.arange(p, p + m) // BLOCK
        out = medians[block_of]
        self._previous = float(medians[-1])
        self._pending = data[full * BLOCK :].copy()
        self.count += m
        return out


def mad(values: np.ndarray) -> float:
    """Median absolute deviation of the finite ``values``, scaled to a normal SD (NaN if none)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan")
    return float(MAD_TO_SIGMA * np.median(np.abs(values - np.median(values))))


def bucket_medians(steps: np.ndarray, values: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Downsample to at most ``max_points`` buckets of consecutive finite points.

    Each bucket gives the median step and the median value of its points; bucket
    medians keep the noise of different buckets independent and ignore spikes.
    """
    if max_points < 3:
        raise ConfigError(f"max_points {max_points!r} must be at least 3")
    finite = np.isfinite(values)
    steps = np.asarray(steps, dtype=np.float64)[finite]
    values = np.asarray(values, dtype=np.float64)[finite]
    n = values.size
    if n <= max_points:
        return steps, values
    size = -(-n // max_points)
    full = n // size
    xs = np.median(steps[: full * size].reshape(full, size), axis=1)
    ys = np.median(values[: full * size].reshape(full, size), axis=1)
    if n > full * size:
        xs = np.append(xs, np.median(steps[full * size :]))
        ys = np.append(ys, np.median(values[full * size :]))
    return xs, ys
