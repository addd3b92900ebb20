"""Samplers: epoch-aware, rank-aware iterables of image indices.

Rules every sampler here follows (and the rank-consistency checks rely on):

* The *global order* of an epoch is a function of ``(seed, epoch)`` and the data
  only: it is drawn from ``numpy.random.default_rng([seed, epoch])``. Every rank
  draws the same order, whatever its rank, so ranks never disagree on an epoch.
* Rank ``r`` of ``w`` takes ``order[r::w]`` after the order is padded, by wrapping
  around its start, to a multiple of ``w`` (as ``torch.utils.data.DistributedSampler``
  does); with ``drop_last=True`` the tail is cut instead. So the shards are
  disjoint positions of one order, of equal length, and cover it.
* ``rank`` and ``world_size`` default to :func:`tracker.dist.rank_world` (the
  initialised ``torch.distributed`` group, else ``RANK`` / ``WORLD_SIZE``).
* ``set_epoch(e)`` must be called before each epoch (as with torch's sampler);
  iteration yields plain ``int`` so the object drops into
  ``torch.utils.data.DataLoader(dataset, sampler=...)``.
* ``fingerprint()`` hashes ``(seed, epoch, global order)`` into ``[0, 2**53)`` (exact
  in a float64); ``log_fingerprint(run, step)`` logs it as ``rng/fingerprint`` with
  ``rng/epoch``, so ranks whose random state disagrees are caught from the logs.

Samplers are registered by plugins (``tracker_register_samplers``) as
:class:`SamplerFactory` objects; :func:`samplers` lists them and :func:`sampler`
builds one by name.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from tracker.dist import rank_world
from tracker.errors import ConfigError, PluginError

FINGERPRINT_BITS = 53


class _Logs(Protocol):
    def log(self, values: dict[str, float], step: int | None = None) -> Any: ...


Labels = Any
"""A :class:`tracker.coco.CocoIndex`, or one sequence of class ids per image."""


def as_csr(labels: Labels) -> tuple[np.ndarray, np.ndarray, int]:
    """``(indptr, classes, num_images)`` of the classes present in each image.

    Classes are remapped to ``0..K-1`` when given as arbitrary ids; duplicates in
    an image are counted once.
    """
    if hasattr(labels, "image_classes"):
        indptr, classes = labels.image_classes()
        return indptr, classes, int(labels.num_images)
    rows = [np.unique(np.asarray(r, dtype=np.int64)) for r in labels]
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    flat = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    _, classes = np.unique(flat, return_inverse=True)
    return indptr, classes.astype(np.int64), len(rows)


class ShardedSampler:
    """Base class: a seeded global order per epoch, sharded across ranks."""

    name = "sharded"

    def __init__(self, seed: int = 0, rank: int | None = None, world_size: int | None = None,
                 drop_last: bool = False) -> None:
        env_rank, env_world = rank_world()
        self.rank = env_rank if rank is None else int(rank)
        self.world_size = env_world if world_size is None else int(world_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"rank {self.rank!r} / world_size {self.world_size!r} is not a valid placement; "
                "expected world_size >= 1 and 0 <= rank < world_size"
            )
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._cache: tuple[int, np.ndarray] | None = None

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from now on."""
        self.epoch = int(epoch)

    def global_order(self) -> np.ndarray:
        """The order of the current epoch, the same on every rank."""
        if self._cache is None or self._cache[0] != self.epoch:
            rng = np.random.default_rng([self.seed, self.epoch])
            self._cache = (self.epoch, np.asarray(self._draw(rng), dtype=np.int64))
        return self._cache[1]

    def _total(self, n: int) -> int:
        if self.drop_last:
            return (n // self.world_size) * self.world_size
        return -(-n // self.world_size) * self.world_size if n else 0

    def shard(self) -> np.ndarray:
        """This rank's indices for the current epoch."""
        order = self.global_order()
        padded = np.resize(order, self._total(len(order))) if len(order) else order
        return padded[self.rank::self.world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self.shard().tolist())

    def __len__(self) -> int:
        return self._total(len(self.global_order())) // self.world_size

    def fingerprint(self) -> int:
        """Hash of ``(seed, epoch, global order)`` in ``[0, 2**53)``."""
        h = hashlib.blake2b(digest_size=8)
        h.update(np.array([self.seed, self.epoch], dtype="<i8").tobytes())
        h.update(self.global_order().astype("<i8").tobytes())
        return int.from_bytes(h.digest(), "little") >> (64 - FINGERPRINT_BITS)

    def log_fingerprint(self, run: _Logs, step: int) -> None:
        """Log ``rng/fingerprint`` and ``rng/epoch`` to ``run`` at ``step``."""
        run.log({"rng/fingerprint": float(self.fingerprint()), "rng/epoch": float(self.epoch)},
                step=step)


def repeat_factors(indptr: np.ndarray, classes: np.ndarray, num_images: int,
                   threshold: float) -> np.ndarray:
    """Per-image repeat factor of LVIS: ``max over its classes of max(1, sqrt(t / f(c)))``.

    ``f(c)`` is the fraction of images holding class ``c``; an image without
    annotations gets 1.
    """
    if not threshold > 0:
        raise ConfigError(f"repeat-factor threshold {threshold!r} must be > 0 (LVIS uses 0.001)")
    k = int(classes.max()) + 1 if len(classes) else 0
    freq = np.bincount(classes, minlength=k) / max(1, num_images)
    with np.errstate(divide="ignore"):
        per_class = np.maximum(1.0, np.sqrt(threshold / freq))
    out = np.ones(num_images)
    counts = np.diff(indptr)
    if len(classes):
        img = np.repeat(np.arange(num_images), counts)
        np.maximum.at(out, img, per_class[classes])
    return out


class RepeatFactorSampler(ShardedSampler):
    """Repeat-factor sampling (LVIS, Gupta et al. 2019; as in detectron2).

    Each epoch image ``i`` appears ``floor(r_i)`` times, plus once more with
    probability ``r_i - floor(r_i)`` (stochastic rounding drawn from the epoch's
    generator), then the whole list is shuffled. The epoch length varies a little
    from epoch to epoch; it is the same on every rank.
    """

    name = "repeat_factor"

    def __init__(self, labels: Labels, threshold: float = 0.001, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None,
                 drop_last: bool = False) -> None:
        super().__init__(seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        indptr, classes, n = as_csr(labels)
        self.threshold = float(threshold)
        self.repeat_factors = repeat_factors(indptr, classes, n, self.threshold)

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        r = self.repeat_factors
        whole = np.floor(r)
        reps = (whole + (rng.random(len(r)) < r - whole)).astype(np.int64)
        return rng.permutation(np.repeat(np.arange(len(r)), reps))


class ClassAwareSampler(ShardedSampler):
    """Class-aware sampling: each draw picks a class uniformly, then one of its images.

    Only classes with at least one image are drawn. ``num_samples`` draws make an
    epoch (default: the number of images).
    """

    name = "class_aware"

    def __init__(self, labels: Labels, num_samples: int | None = None, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None,
                 drop_last: bool = False) -> None:
        super().__init__(seed=seed, rank=rank, world_size=world_size, drop_last=drop_last)
        indptr, classes, n = as_csr(labels)
        img = np.repeat(np.arange(n), np.diff(indptr))
        order = np.argsort(classes, kind="stable")
        self._images = img[order]
        per_class = np.bincount(classes) if len(classes) else np.zeros(0, dtype=np.int64)
        self._sizes = per_class[per_class > 0]
        self._starts = (np.cumsum(per_class) - per_class)[per_class > 0]
        self.num_samples = n if num_samples is None else int(num_samples)
        if self.num_samples < 0:
            raise ConfigError(f"num_samples {num_samples!r} must be >= 0")
        if self.num_samples and not len(self._sizes):
            raise ConfigError("class-aware sampling needs at least one image with a class; got none")

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        cls = rng.integers(0, len(self._sizes), size=self.num_samples) if self.num_samples else \
            np.zeros(0, dtype=np.int64)
        pick = self._starts[cls] + (rng.random(len(cls)) * self._sizes[cls]).astype(np.int64)
        return self._images[pick]


@dataclass(frozen=True)
class SamplerFactory:
    """What plugins register: a named builder of samplers."""

    name: str
    build: Callable[..., ShardedSampler]
    summary: str = ""

    def validate(self) -> None:
        """Refuse a factory without a callable builder."""
        if not callable(self.build):
            raise PluginError(f"sampler {self.name!r}: build {self.build!r} is not callable")

    def __call__(self, **kwargs: Any) -> ShardedSampler:
        return self.build(**kwargs)


def samplers() -> dict[str, SamplerFactory]:
    """The registered samplers, by name."""
    from tracker.host import get_host

    return get_host().items("samplers")


def sampler(name: str, **kwargs: Any) -> ShardedSampler:
    """Build the registered sampler ``name`` with ``kwargs`` (e.g. ``labels=index``)."""
    from tracker.host import get_host

    factory = get_host().get("samplers", name)
    try:
        inspect.signature(factory.build).bind(**kwargs)
    except TypeError as exc:
        params = ", ".join(inspect.signature(factory.build).parameters)
        raise ConfigError(f"sampler {name!r}: {exc}; it takes {params}") from None
    return factory(**kwargs)

