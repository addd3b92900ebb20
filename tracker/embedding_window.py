"""The collapse statistics of embeddings and the rolling window they are computed on.

* :func:`statistics` of a set of rows ``z`` (W, D): RankMe (from the singular
  values of ``z``, through the eigenvalues of its Gram matrix ``z^T z`` or ``z z^T``,
  whichever is smaller), the mean std of the L2-normalised rows, and the share of
  dimensions whose std is below ``gamma``. Everything accumulates in float64: a
  float32 Gram matrix blurs singular values below ~3e-4 of the largest, which is
  what a collapsing embedding is made of.
* :class:`Window` keeps the last ``window`` rows in a float32 ring and their
  sufficient statistics (:class:`Sums`) up to date as rows come and go: adding
  ``n`` rows costs ``n * D^2``, an evaluation ``D^3`` (the eigenvalues:
  :func:`eigenvalues`), instead of ``W * D^2`` for every
  evaluation. Every ``4 * window`` rows added the sums are
  recomputed from the ring, so rounding never drifts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from tracker.errors import ConfigError

RANKME_EPS = 1e-7
CHUNK_ROWS = 4096
REFRESH = 4  # sums recomputed from the ring every REFRESH * window rows added


def rankme(singular: np.ndarray) -> float:
    """RankMe of singular values ``singular`` (any order): ``exp(-sum p log p)``, ``p = s / sum(s) + 1e-7``."""
    s = np.asarray(singular, dtype=np.float64)
    total = s.sum()
    if not total > 0:
        return 1.0
    p = s / total + RANKME_EPS
    return float(np.exp(-(p * np.log(p)).sum()))


def eigenvalues(matrix: np.ndarray) -> np.ndarray:
    """The eigenvalues of the symmetric float64 ``matrix`` (numpy's ``eigvalsh``: its LAPACK call
    releases the GIL, so a training thread beside the worker never waits it out; on numpy 2.4,
    a thread waking every 0.5 ms beside a 30 ms decomposition of 768 x 768 was late by 0.1 ms
    at most, against 3.5-6.5 ms beside ``torch.linalg.eigvalsh``, which was also slower)."""
    return np.linalg.eigvalsh(matrix)


def _chunks(blocks: list[np.ndarray]) -> Iterator[np.ndarray]:
    for block in blocks:
        for a in range(0, block.shape[0], CHUNK_ROWS):
            yield np.asarray(block[a : a + CHUNK_ROWS], dtype=np.float32)


@dataclass
class Sums:
    """Sufficient statistics of a set of rows: per-dimension sums (raw and L2-normalised) and ``z^T z``."""

    dim: int
    gram: bool = True
    count: int = 0
    s1: np.ndarray = field(init=False)
    s2: np.ndarray = field(init=False)
    n1: np.ndarray = field(init=False)
    n2: np.ndarray = field(init=False)
    g: np.ndarray | None = field(init=False)

    def __post_init__(self) -> None:
        self.s1, self.s2, self.n1, self.n2 = (np.zeros(self.dim) for _ in range(4))
        self.g = np.zeros((self.dim, self.dim)) if self.gram else None
        self._work: dict[str, np.ndarray] = {}

    def _buffer(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A float64 work array of ``shape``, a view of one kept across calls (grown by rows as needed):
        no allocation per chunk, so no page faults and no ``munmap`` beside the training thread."""
        found = self._work.get(name)
        if found is None or found.shape[0] < shape[0]:
            found = self._work[name] = np.empty(shape)
        return found[: shape[0]]

    def update(self, blocks: list[np.ndarray], sign: float = 1.0) -> None:
        """Add (``sign=1``) or remove (``sign=-1``) the rows of ``blocks``."""
        for chunk in _chunks(blocks):
            n = chunk.shape[0]
            wide = self._buffer("wide", (n, self.dim))
            np.copyto(wide, chunk)
            norms = np.sqrt(np.einsum("ij,ij->i", wide, wide))
            unit = self._buffer("unit", (n, self.dim))
            np.divide(wide, np.maximum(norms, 1e-12)[:, None], out=unit)
            self.s1 += sign * wide.sum(axis=0)
            self.s2 += sign * np.einsum("ij,ij->j", wide, wide)
            self.n1 += sign * unit.sum(axis=0)
            self.n2 += sign * np.einsum("ij,ij->j", unit, unit)
            if self.g is not None:
                product = np.matmul(wide.T, wide, out=self._buffer("gram", (self.dim, self.dim)))
                if sign > 0:
                    self.g += product
                else:
                    self.g -= product
            self.count += int(sign) * n

    def result(self, gamma: float, blocks: list[np.ndarray] | None = None) -> dict[str, float]:
        """The statistics of the rows summed (``blocks``: the rows themselves, for ``z z^T`` when W < D)."""
        w = self.count
        if w < 2:
            raise ConfigError(f"statistics need at least 2 samples; got {w}")
        if self.g is not None and w >= self.dim:
            eig = eigenvalues(self.g)
        else:
            if blocks is None:
                raise ConfigError("fewer samples than dimensions: pass the rows for z z^T")
            small = np.concatenate(blocks).astype(np.float64)
            eig = eigenvalues(small @ small.T)
        raw_std = np.sqrt(np.maximum(self.s2 - self.s1 * self.s1 / w, 0.0) / (w - 1))
        unit_std = np.sqrt(np.maximum(self.n2 - self.n1 * self.n1 / w, 0.0) / (w - 1))
        return {
            "rankme": rankme(np.sqrt(np.maximum(eig, 0.0))),
            "std": float(unit_std.mean()),
            "dead_dims": float(np.mean(raw_std < gamma)),
        }


def statistics(z: np.ndarray | list[np.ndarray], gamma: float = 1.0) -> dict[str, float]:
    """RankMe, std of the L2-normalised rows and share of dims with std < ``gamma``, of ``z`` (W, D).

    ``z`` may be a list of row blocks of one width (a ring buffer's two halves): the
    statistics do not depend on the order of the rows.
    """
    blocks = list(z) if isinstance(z, (list, tuple)) else [z]
    w, d = sum(b.shape[0] for b in blocks), blocks[0].shape[1]
    sums = Sums(d, gram=w >= d)
    sums.update(blocks)
    return sums.result(gamma, blocks)


def _newest(blocks: list[np.ndarray], rows: int) -> list[np.ndarray]:
    """The blocks that hold the newest ``rows`` rows of ``blocks`` (the first one cut)."""
    out: list[np.ndarray] = []
    for block in reversed(blocks):
        if rows <= 0:
            break
        out.append(block[-rows:] if block.shape[0] > rows else block)
        rows -= block.shape[0]
    return out[::-1]


@dataclass
class Window:
    """The last ``window`` rows of one embedding key in a ring, with their sums kept up to date."""

    key: str
    dim: int
    window: int
    gamma: float
    every: int
    rows: np.ndarray = field(init=False, repr=False)
    sums: Sums = field(init=False, repr=False)
    filled: int = 0
    head: int = 0
    since: int = 0
    added: int = 0
    dropped: int = 0
    non_finite: int = 0
    streams: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.rows = np.zeros((self.window, self.dim), dtype=np.float32)
        self.sums = Sums(self.dim, gram=self.window >= self.dim)

    @property
    def min_samples(self) -> int:
        """Samples the window must hold before the first evaluation."""
        return min(self.window, max(2 * self.dim, 256))

    def _oldest(self, count: int) -> list[np.ndarray]:
        """The ``count`` oldest rows of the window (one or two slices)."""
        start = (self.head - self.filled) % self.window
        end = start + count
        if end <= self.window:
            return [self.rows[start:end]]
        return [self.rows[start:], self.rows[: end - self.window]]

    def add(self, z: np.ndarray | list[np.ndarray]) -> None:
        """Put the rows of ``z`` (an array, or a list of row blocks in order) into the ring (the
        newest ``window`` of them at most). Rows it pushes out leave the sums; when all of the
        window's rows go, the sums start afresh instead (half the work)."""
        blocks = []
        for block in [z] if isinstance(z, np.ndarray) else z:
            good = np.isfinite(block).all(axis=1)
            if not good.all():
                self.non_finite += int((~good).sum())
                block = block[good]
            blocks.append(np.asarray(block, dtype=np.float32))
        came = sum(block.shape[0] for block in blocks)  # all count towards the next evaluation
        blocks = _newest(blocks, self.window)
        n = sum(block.shape[0] for block in blocks)
        evicted = max(0, self.filled + n - self.window)
        if evicted and evicted >= self.filled:
            self.sums = Sums(self.dim, gram=self.window >= self.dim)
            self.filled = 0
        elif evicted:
            self.sums.update(self._oldest(evicted), -1.0)
            self.filled -= evicted
        for block in blocks:
            self._write(block)
        self.sums.update(blocks)
        self.filled += n
        self.since += came
        self.added += n
        if self.added >= REFRESH * self.window:
            self.added = 0
            self.sums = Sums(self.dim, gram=self.window >= self.dim)
            self.sums.update(self.blocks())

    def _write(self, z: np.ndarray) -> None:
        """Copy the rows of ``z`` (at most a window) into the ring at ``head``."""
        n = z.shape[0]
        end = self.head + n
        if end <= self.window:
            self.rows[self.head : end] = z
        else:
            cut = self.window - self.head
            self.rows[self.head :] = z[:cut]
            self.rows[: n - cut] = z[cut:]
        self.head = end % self.window

    def skip(self, rows: int) -> None:
        """Forget the oldest samples that ``rows`` newer ones, dropped unread, would have pushed out
        (they count towards the next evaluation: ``every`` counts the samples that came)."""
        keep = max(0, min(self.filled, self.window - rows))
        if keep == 0 and self.filled:
            self.sums = Sums(self.dim, gram=self.window >= self.dim)
            self.filled = 0
        elif keep < self.filled:
            self.sums.update(self._oldest(self.filled - keep), -1.0)
            self.filled = keep
        self.since += rows
        self.dropped += rows

    def blocks(self) -> list[np.ndarray]:
        """The samples in the window: the ``filled`` rows that end at ``head`` (one or two slices)."""
        return self._oldest(self.filled)

    def due(self) -> bool:
        """Whether an evaluation is due."""
        return self.filled >= self.min_samples and self.since >= self.every

    def evaluate(self) -> dict[str, float]:
        """The statistics of the samples in the window."""
        self.since = 0
        return self.sums.result(self.gamma, self.blocks() if self.filled < self.dim else None)

    def settings(self) -> dict[str, Any]:
        """What the run's config records of this key."""
        return {"dim": self.dim, "window": self.window, "gamma": self.gamma, "every": self.every}
