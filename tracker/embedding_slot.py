"""The training thread's side of ``run.log_embeddings``: a key's hand-off and its bound fast path.

:func:`fast_path` is what a warm call costs (``run.log_embeddings`` calls it first):
type, shape, dtype and device compared with the key's current input, the step
checked as a plain int, then one copy into a recycled buffer and a deque append. No
lock, no wake-up, no allocation once warm; the queue is trimmed (oldest first) only
when the worker fell behind by more than 1.5 windows. :mod:`tracker.embeddings`
holds the worker.

A torch tensor already in host memory (on the CPU device) is not copied on the
training thread: the fast path queues the tensor itself (detached: no autograd graph
is kept) with its version counter, and the worker copies it. A tensor written in
place before the worker copied it (its ``_version`` moved: any in-place op, ``out=``
included) is left out of the window, counted in ``changed``, and the key copies on
the training thread from its next call on. Shared only: a tensor whose storage is at
most :data:`SHARE_STORAGE` times its own bytes (a ``chunk(2)`` half of the two views'
output, not a slice of something much larger), so what the queue holds stays within
its bound (checked when the key binds its input, then for views on each call).
Writes that bypass the version counter (``.data``, a numpy view of the tensor) are
not seen; a write still running while the worker copies is seen only if it finished
before the worker's check.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Callable

import numpy as np

from tracker.embedding_window import Window

MAX_STEP = 2**63 - 1  # the largest step a run stores (tracker.run.MAX_STEP)
SHARE_STORAGE = 2  # a host tensor is queued as is when its storage is at most this many times its bytes


class _Discard:
    """Where a shared tensor goes once the worker is done with it (nowhere: it was never a buffer)."""

    __slots__ = ()

    def append(self, item: Any) -> None:
        pass


DISCARD = _Discard()


class Slot:
    """One key's hand-off on the training thread's side, checked once per key and shape.

    ``kind``, ``shape``, ``dtype`` and ``cuda`` describe the input the fast path takes
    as is (:func:`fast_path`, bound per key and input; a call with anything else goes
    through :meth:`EmbeddingMonitor._prepare`, which validates it and makes it the
    current input); ``free`` holds recycled host buffers of that input (numpy arrays,
    or CPU tensors, pinned when ``z`` is on a CUDA device: the fastest device-to-host
    copy). The training thread appends copies to ``queue`` (a deque: no lock), counts
    their rows in ``submitted`` and the rows it drops in ``dropped``; the worker counts
    the rows it took in ``taken`` and those it is done with in ``done``. Each counter
    has one writer, so neither thread ever waits for the other. ``share`` says whether a host
    tensor is queued as is (the worker copies it); the worker turns it off, for good, when it
    finds one written in place before it copied it, and counts its rows in ``changed``.
    """

    __slots__ = ("state", "kind", "shape", "dtype", "cuda", "rows", "free", "pools", "queue", "submitted",
                 "dropped", "skipped", "taken", "done", "bound", "is_torch", "new", "share", "changed", "nbytes",
                 "by_ref")

    def __init__(self, state: Window) -> None:
        self.state = state
        self.kind: type | None = None
        self.shape: tuple[int, ...] = ()
        self.dtype: Any = None
        self.cuda = False
        self.is_torch = False
        self.rows = 0
        self.free: deque[Any] = deque()
        self.new: Any = None  # () -> a fresh buffer of the current input
        self.pools: dict[tuple[Any, ...], deque[Any]] = {}
        self.queue: deque[tuple[int, Any, int, deque[Any]]] = deque()
        self.submitted = self.dropped = 0  # rows (training thread)
        self.skipped = self.taken = self.done = 0  # rows (worker): dropped ones it forgot, taken, processed
        self.bound = state.window + state.window // 2  # queued rows past which the oldest are dropped
        self.share = True  # host tensors queued as is, until one is found written in place (worker)
        self.changed = 0  # rows of shared tensors written in place before the worker copied them (worker)
        self.nbytes = 0  # bytes of the current input
        self.by_ref = False  # the current input is queued as is (a shareable host tensor)

    def queued(self) -> int:
        """Rows in the queue (exact when read by either thread between its own updates)."""
        return self.submitted - self.dropped - self.taken

    def use(self, z: Any, torch: Any) -> None:
        """Make ``z``'s kind, shape, dtype and device the current input."""
        self.kind, self.shape, self.dtype = type(z), tuple(z.shape), z.dtype
        self.rows = math.prod(self.shape[:-1])
        self.nbytes = math.prod(self.shape) * int(z.element_size() if hasattr(z, "element_size") else z.itemsize)
        self.is_torch = torch is not None and isinstance(z, torch.Tensor)
        self.by_ref = False
        if self.is_torch:
            self.cuda = bool(z.is_cuda)
            self.by_ref = self.share and z.is_cpu and z.untyped_storage().nbytes() <= SHARE_STORAGE * self.nbytes
            shape, dtype, pin = self.shape, self.dtype, self.cuda
            self.new = lambda: torch.empty(shape, dtype=dtype, pin_memory=pin)
            pool = ("torch", shape, str(dtype), pin)
        else:
            shape, dtype = self.shape, self.dtype
            self.new = lambda: np.empty(shape, dtype=dtype)
            pool = ("numpy", shape, dtype.str)
        if pool not in self.pools:
            # as many buffers as the queue and the worker can hold (2.5 windows): once warm, no allocation
            self.pools[pool] = deque(maxlen=(self.bound + self.state.window) // max(1, self.rows) + 3)
        self.free = self.pools[pool]

    def trim(self) -> None:
        """Drop the oldest queued batches beyond the newest window of rows (they would leave the
        window unread; the worker's window forgets as many of its own). The training thread's,
        once the queue holds more than 1.5 windows: no lock (a batch the worker pops meanwhile
        is its own; each is popped once)."""
        queue, keep = self.queue, self.state.window
        try:
            while len(queue) > 1 and self.queued() - queue[0][2] >= keep:
                _, old, rows, free = queue.popleft()
                free.append(old)
                self.dropped += rows
        except IndexError:  # the worker emptied the queue meanwhile
            pass


def fast_path(monitor: Any, slot: Slot) -> Callable[[Any, Any], bool]:
    """The call of a key's current input, bound once per key and input: ``fast(z, step)`` copies
    ``z`` into a recycled buffer (or, a host tensor while ``slot.share``, holds it) and queues
    it, True; or, for anything it does not take as is (another kind, shape, dtype or device, a
    step that is not a plain int in range, a closed monitor, a tensor it no longer shares),
    does nothing and returns False (the full path checks the call)."""
    run, kind, shape, dtype, cuda, rows = monitor.run, slot.kind, slot.shape, slot.dtype, slot.cuda, slot.rows
    free, queue, new, bound, start = slot.free, slot.queue, slot.new, slot.bound, run.start_step
    pop, append = free.pop, queue.append

    def fast_numpy(z: Any, step: Any) -> bool:
        if type(z) is not kind or z.shape != shape or (z.dtype is not dtype and z.dtype != dtype) or monitor._closed:
            return False
        if step is None:
            step = run._last_step or start
        elif type(step) is not int or not start <= step <= MAX_STEP:
            return False
        buf = pop() if free else new()
        np.copyto(buf, z)
        append((step, buf, rows, free))
        slot.submitted += rows
        if slot.submitted - slot.dropped - slot.taken > bound:
            slot.trim()
        return True

    def fast_torch(z: Any, step: Any) -> bool:
        if type(z) is not kind or z.dtype is not dtype or z.shape != shape or z.is_cuda is not cuda \
                or monitor._closed:
            return False
        if step is None:
            step = run._last_step or start
        elif type(step) is not int or not start <= step <= MAX_STEP:
            return False
        buf = pop() if free else new()
        buf.copy_(z.detach() if z.requires_grad else z)
        append((step, buf, rows, free))
        slot.submitted += rows
        if slot.submitted - slot.dropped - slot.taken > bound:
            slot.trim()
        return True

    limit = SHARE_STORAGE * slot.nbytes

    def fast_shared(z: Any, step: Any) -> bool:
        if type(z) is not kind or z.dtype is not dtype or z.shape != shape or not z.is_cpu or monitor._closed \
                or not slot.share or (z._base is not None and z.untyped_storage().nbytes() > limit):
            return False
        if step is None:
            step = run._last_step or start
        elif type(step) is not int or not start <= step <= MAX_STEP:
            return False
        if z.requires_grad:
            z = z.detach()  # the same storage and version counter, no graph
        append((step, (z, z._version), rows, DISCARD))
        slot.submitted += rows
        if slot.submitted - slot.dropped - slot.taken > bound:
            slot.trim()
        return True

    if not slot.is_torch:
        return fast_numpy
    return fast_shared if slot.by_ref else fast_torch


def dispatcher(run: Any, monitor: Any) -> Callable[..., None]:
    """``run.log_embeddings`` for a run whose monitor exists: the same call, one frame shorter (a
    warm call goes straight to its key's fast path; anything else to the checked method)."""
    method = type(run).log_embeddings
    full, get = method.__get__(run), monitor.fast.get

    def log_embeddings(key: str, z: Any, step: int | None = None, *, window: int | None = None,
                       gamma: float | None = None, every: int | None = None) -> None:
        if window is None and gamma is None and every is None and type(key) is str:
            fast = get(key)
            if fast is not None and fast(z, step):
                return
        full(key, z, step, window=window, gamma=gamma, every=every)

    log_embeddings.__doc__, log_embeddings.__wrapped__ = method.__doc__, method  # type: ignore[attr-defined]
    return log_embeddings
