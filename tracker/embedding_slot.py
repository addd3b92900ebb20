"""The training thread's side of ``run.log_embeddings``: a key's hand-off and its bound fast path.

:func:`fast_path` is what a warm call costs (``run.log_embeddings`` calls it first):
type, shape, dtype and device compared with the key's current input, the step
checked as a plain int, then one copy into a recycled buffer and a deque append. No
lock, no wake-up, no allocation once warm; the queue is trimmed (oldest first) only
when the worker fell behind by more than 1.5 windows. :mod:`tracker.embeddings`
holds the worker.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Callable

import numpy as np

from tracker.embedding_window import Window

MAX_STEP = 2**63 - 1  # the largest step a run stores (tracker.run.MAX_STEP)


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
    has one writer, so neither thread ever waits for the other.
    """

    __slots__ = ("state", "kind", "shape", "dtype", "cuda", "rows", "free", "pools", "queue", "submitted",
                 "dropped", "skipped", "taken", "done", "bound", "is_torch", "new")

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

    def queued(self) -> int:
        """Rows in the queue (exact when read by either thread between its own updates)."""
        return self.submitted - self.dropped - self.taken

    def use(self, z: Any, torch: Any) -> None:
        """Make ``z``'s kind, shape, dtype and device the current input."""
        self.kind, self.shape, self.dtype = type(z), tuple(z.shape), z.dtype
        self.rows = math.prod(self.shape[:-1])
        self.is_torch = torch is not None and isinstance(z, torch.Tensor)
        if self.is_torch:
            self.cuda = bool(z.is_cuda)
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
    ``z`` into a recycled buffer and queues it, True; or, for anything it does not take as is
    (another kind, shape, dtype or device, a step that is not a plain int in range, a closed
    monitor), does nothing and returns False (the full path checks the call)."""
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

    return fast_torch if slot.is_torch else fast_numpy
