"""Loss kernels on Vulkan: class-weighted BCE with logits and sigmoid focal loss.

One call gives the per-class loss sums, the per-class positive counts (targets
> 0), their total, and optionally the gradient and the elementwise loss.

Rules:

* Inputs are (N, C) C-contiguous float32 or float16 logits with targets of the
  same dtype or float32; arithmetic and accumulation are float32.
* Two ways to reach memory, same results: ``texel`` reads inputs, and the gradient
  it adds to, through uniform texel buffers (the view's float16/float32 format
  converts) and writes the gradient, elementwise loss and partial sums through
  storage texel buffers of a declared float32 format (one shader per
  classes-per-invocation, 4, 2 or 1);
  ``storage`` uses storage buffers (float16 through 16-bit storage). ``texel`` is
  the default where the device supports the formats: on lavapipe a texel access is
  a vector gather while a storage-buffer access is a per-lane loop, several times
  slower.
* Per-class sums are a two-level reduction: every invocation owns 1, 2 or 4
  consecutive classes and adds 32 rows of them (an unrolled loop) into its own
  partial sums, written as rows of a partial matrix; then ``reduce_sum`` levels
  (16 rows per invocation, unrolled) fold it until one row is left. No shader loop
  runs near lavapipe's silent 65,535-iteration cap, and no subgroup operations
  are needed. The total is the float64 sum of the per-class sums.
* No binding exceeds ``maxStorageBufferRange`` (128 MiB on lavapipe) or
  ``maxTexelBufferElements``: tensors are bound in chunks of whole rows, at offsets
  aligned for both kinds of binding; one submission records every chunk and every
  reduction level.
* The gradient is added, never assigned. On device buffers the shader does
  ``grad += g`` (:meth:`LossKernels.run_buffers`, ``grad_mode="add"``). For numpy
  arrays, a float32 gradient of 1 MiB or more is imported in place
  (VK_EXT_external_memory_host) and the shader adds into the caller's memory;
  otherwise the shader stores ``g`` in a device buffer and the host adds it
  (``grad += g``, float32 or float64). Large inputs are imported the same way, so
  no input is copied.
* ``reduction`` "mean" scales the gradient by 1/(N*C), "sum" and "none" by 1.
"""

from __future__ import annotations

import math
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpu.buffers import Buffer, BufferRange, ImportedBuffer, can_import, texel, texel_features
from gpu.device import Device
from gpu.errors import GpuError
from gpu.pipeline import Commands, Pipeline

LOSSES = ("bce", "focal")
PATHS = ("texel", "storage")
REDUCTIONS = ("mean", "sum", "none")
GROUP_INVOCATIONS = 256
MAX_ROWS_PER_LANE = 256
REDUCE_ROWS_PER_LANE = 16
_GRAD_MODES = {"add": 1, "store": 2, None: 0}
_ALIGN = 256
IMPORT_MIN_BYTES = 1 << 20
_VARIANTS = {("float32", "float32"): "f32", ("float16", "float16"): "f16", ("float16", "float32"): "f16_f32"}


@dataclass
class LossOutput:
    """What one kernel call produced (the loss value itself depends on the reduction)."""

    total: float
    per_class: np.ndarray
    positives: np.ndarray
    elementwise: np.ndarray | None = None
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """How an (N, C) tensor is cut into chunks and work groups.

    Every invocation owns ``classes`` consecutive classes (a quad); a work group of
    ``local_size`` invocations holds ``quads_per_group`` quads times
    ``rows_per_step`` rows and covers ``rows_per_group`` rows, writing
    ``rows_per_step`` rows of partial sums. ``chunks`` are (first row, rows, first
    partial row).
    """

    rows: int
    cols: int
    classes: int
    quads_per_group: int
    rows_per_step: int
    groups_x: int
    chunk_rows: int
    chunks: tuple[tuple[int, int, int], ...]
    partial_rows: int

    @property
    def local_size(self) -> int:
        """Invocations per work group."""
        return self.quads_per_group * self.rows_per_step

    rows_per_lane: int = 64

    @property
    def rows_per_group(self) -> int:
        """Rows one work group covers."""
        return self.rows_per_step * self.rows_per_lane


def plan(rows: int, cols: int, elem_sizes: tuple[int, ...], *, max_binding: int, align: int,
         max_groups: int, rows_per_lane: int = 64) -> Plan:
    """Chunks of whole rows, each binding at most ``max_binding`` bytes at ``align``-ed offsets."""
    if not 1 <= rows_per_lane <= MAX_ROWS_PER_LANE:
        raise GpuError(f"rows_per_lane {rows_per_lane} is outside 1..{MAX_ROWS_PER_LANE}")
    k = 4 if cols % 4 == 0 else 2 if cols % 2 == 0 else 1
    quads = cols // k
    per_group = min(quads, GROUP_INVOCATIONS)
    steps = max(1, min(GROUP_INVOCATIONS // per_group, -(-rows // rows_per_lane)))
    rows_per_group = steps * rows_per_lane
    step = 1
    for size in elem_sizes:
        step = math.lcm(step, align // math.gcd(align, cols * size))
    widest = cols * max(elem_sizes)
    chunk_rows = min(max_binding // widest, max_groups * rows_per_group) // step * step
    if chunk_rows == 0:
        raise GpuError(f"one row of {cols} classes needs {widest * step} bytes per binding; "
                       f"the device binds at most {max_binding} (maxStorageBufferRange)")
    chunks, part = [], 0
    for start in range(0, rows, chunk_rows):
        n = min(chunk_rows, rows - start)
        chunks.append((start, n, part))
        part += -(-n // rows_per_group) * steps
    return Plan(rows, cols, k, per_group, steps, -(-quads // per_group), chunk_rows, tuple(chunks), part,
                rows_per_lane)


def levels(rows: int) -> list[int]:
    """Row counts of each reduction level, from the partial rows down to 1."""
    out = [rows]
    while out[-1] > 1:
        out.append(-(-out[-1] // REDUCE_ROWS_PER_LANE))
    return out


def _check_inputs(logits: np.ndarray, targets: np.ndarray) -> str:
    if logits.ndim != 2 or logits.shape != targets.shape:
        raise GpuError(f"logits and targets must be (N, C) arrays of one shape; got {logits.shape} "
                       f"and {targets.shape}")
    key = (logits.dtype.name, targets.dtype.name)
    if key not in _VARIANTS:
        have = ", ".join(f"{a}/{b}" for a, b in _VARIANTS)
        raise GpuError(f"Unsupported logits/targets dtypes {key[0]}/{key[1]}; available: {have}")
    return _VARIANTS[key]


class LossKernels:
    """The loss pipelines of one device, with their dispatch logic.

    ``path`` is ``texel`` (inputs read through uniform texel buffers, outputs written
    through formatless storage texel buffers; the default where the device allows)
    or ``storage`` (storage buffers; float16 through 16-bit storage).
    ``import_host`` (default: where the device can) uses large host arrays in place;
    ``grad_in_place`` lets the shader add into an imported float32 gradient (else it
    stores ``g`` and the host adds). ``rows_per_lane`` is how many rows each
    invocation walks (1..256).
    ``max_binding`` lowers the chunk size below the device's maxStorageBufferRange
    (tests use it to cross chunk boundaries on small tensors).
    """

    def __init__(self, device: Device, *, path: str | None = None, max_binding: int | None = None,
                 import_host: bool | None = None, grad_in_place: bool = True, rows_per_lane: int = 64) -> None:
        info = device.info
        self.device = device
        texel_ok = texel_supported(device)
        self.path = path or ("texel" if texel_ok else "storage")
        if self.path not in PATHS:
            raise GpuError(f"Unknown kernel path {self.path!r}; available: {', '.join(PATHS)}")
        if self.path == "texel" and not texel_ok:
            raise GpuError(f"device {info.name!r} lacks texel-buffer support for the float formats; "
                           "use path='storage'")
        limit = info.max_storage_buffer_range
        if self.path == "texel":
            limit = min(limit, info.max_texel_buffer_elements * 4)
        self.max_binding = min(max_binding or limit, limit)
        self.import_host = can_import(device) if import_host is None else import_host and can_import(device)
        self.rows_per_lane = rows_per_lane
        self.grad_in_place = grad_in_place
        self._pipelines: dict[tuple[Any, ...], Pipeline] = {}
        self._lock = threading.Lock()

    def pipeline(self, shader: str, local_size: int, constants: tuple[int, ...] = ()) -> Pipeline:
        """The cached pipeline of ``shader`` at ``local_size``; ``constants`` are spec ids 1, 2, ..."""
        key = (shader, local_size, constants)
        pipe = self._pipelines.get(key)
        if pipe is None:
            if "_f16" in shader and not self.device.info.storage_buffer_16bit:
                raise GpuError(f"device {self.device.info.name!r} lacks storageBuffer16BitAccess; "
                               "pass float32 logits")
            spec = {1 + i: v for i, v in enumerate(constants)}
            pipe = Pipeline(self.device, shader, local_size=(local_size,), constants=spec)
            self._pipelines[key] = pipe
        return pipe

    # -- numpy in, numpy out -------------------------------------------------------
    def run(self, loss: str, logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None = None, *,
            weight: np.ndarray, pos_weight: np.ndarray | None = None, alpha: float = -1.0,
            gamma: float = 0.0, reduction: str = "mean", timestamps: bool = False) -> LossOutput:
        """Run ``loss`` on host arrays; ADD the gradient into ``grad`` (float32/float64) if given."""
        variant = _check_inputs(logits, targets)
        n, c = logits.shape
        _check_params(loss, c, weight, pos_weight, reduction, grad, logits.shape)
        if n == 0 or c == 0:
            return LossOutput(0.0, np.zeros(c, np.float64), np.zeros(c, np.int64),
                              np.zeros((n, c), np.float32) if reduction == "none" else None)
        with self._lock:
            return self._run_host(loss, variant, logits, targets, grad, weight, pos_weight,
                                  alpha, gamma, reduction, timestamps)

    def _imported(self, stack: ExitStack, array: np.ndarray) -> Buffer | None:
        """The array's own memory on the device, or None where it cannot or should not be imported."""
        info = self.device.info
        align = max(info.min_storage_buffer_offset_alignment, info.min_texel_buffer_offset_alignment)
        if not (self.import_host and array.nbytes >= IMPORT_MIN_BYTES and array.flags.c_contiguous
                and array.ctypes.data % align == 0):
            return None
        try:
            return stack.enter_context(ImportedBuffer(self.device, array))
        except GpuError:
            return None

    def _input(self, stack: ExitStack, array: np.ndarray) -> Buffer:
        """The array on the device: imported in place where possible, else copied."""
        buf = self._imported(stack, array)
        if buf is None:
            buf = stack.enter_context(Buffer(self.device, array.nbytes))
            buf.write(np.ascontiguousarray(array))
        return buf

    def _run_host(self, loss: str, variant: str, logits: np.ndarray, targets: np.ndarray,
                  grad: np.ndarray | None, weight: np.ndarray, pos_weight: np.ndarray | None,
                  alpha: float, gamma: float, reduction: str, timestamps: bool) -> LossOutput:
        dev, (n, c) = self.device, logits.shape
        pw_at = -(-c * 4 // _ALIGN) * _ALIGN
        t0 = time.perf_counter()
        with ExitStack() as stack:
            xb, yb = self._input(stack, logits), self._input(stack, targets)
            gb = None
            if grad is not None and grad.dtype == np.float32 and self.grad_in_place:
                gb = self._imported(stack, grad)
            in_place = gb is not None
            if grad is not None and gb is None:
                gb = stack.enter_context(Buffer(dev, n * c * 4))
            lb = stack.enter_context(Buffer(dev, n * c * 4)) if reduction == "none" else None
            wb = stack.enter_context(Buffer(dev, pw_at + c * 4))
            wb.write(np.asarray(weight, np.float32))
            wb.write(np.ones(c, np.float32) if pos_weight is None else np.asarray(pos_weight, np.float32), pw_at)
            t1 = time.perf_counter()
            out = self.run_buffers(
                loss, variant, xb, yb, rows=n, cols=c, weight=wb.range(0, c * 4),
                pos_weight=wb.range(pw_at, c * 4), grad=gb, grad_mode="add" if in_place else "store",
                loss_out=lb, alpha=alpha, gamma=gamma,
                grad_scale=1.0 / (n * c) if reduction == "mean" else 1.0, timestamps=timestamps)
            t2 = time.perf_counter()
            if gb is not None and not in_place:
                np.add(grad, gb.view(np.float32, (n, c)), out=grad)
            if lb is not None:
                out.elementwise = lb.read(np.float32, (n, c))
            t3 = time.perf_counter()
        out.timings.update(upload_ms=(t1 - t0) * 1e3, gpu_ms=(t2 - t1) * 1e3, download_ms=(t3 - t2) * 1e3)
        return out

    # -- device buffers ------------------------------------------------------------
    def run_buffers(self, loss: str, variant: str, logits: Buffer, targets: Buffer, *, rows: int, cols: int,
                    weight: Buffer | BufferRange, pos_weight: Buffer | BufferRange | None = None,
                    grad: Buffer | None = None, grad_mode: str | None = "add",
                    loss_out: Buffer | None = None, alpha: float = -1.0, gamma: float = 0.0,
                    grad_scale: float = 1.0, timestamps: bool = False) -> LossOutput:
        """Run ``loss`` on device buffers in one submission; ``grad_mode`` "add" does ``grad += g``.

        ``variant`` names the logits/targets dtypes: ``f32``, ``f16`` or ``f16_f32``.
        """
        grad_mode = grad_mode if grad is not None else None
        if grad_mode not in _GRAD_MODES or loss not in LOSSES or variant not in _VARIANTS.values():
            raise GpuError(f"Unknown loss {loss!r}, variant {variant!r} or grad_mode {grad_mode!r}; available: "
                           f"{', '.join(LOSSES)}; {', '.join(_VARIANTS.values())}; add, store")
        if loss == "bce" and pos_weight is None:
            raise GpuError("the bce kernel needs a pos_weight buffer (ones for none)")
        sizes = (2 if variant.startswith("f16") else 4, 2 if variant == "f16" else 4, 4)
        info = self.device.info
        align = max(info.min_storage_buffer_offset_alignment, info.min_texel_buffer_offset_alignment)
        p = plan(rows, cols, sizes, max_binding=self.max_binding, align=align,
                 max_groups=info.max_workgroup_count[1], rows_per_lane=self.rows_per_lane)
        shader = f"{loss}_texel{p.classes}" if self.path == "texel" else f"{loss}_{variant}"
        main = self.pipeline(shader, p.local_size, (p.quads_per_group, p.classes, _GRAD_MODES[grad_mode],
                                                    int(loss_out is not None), p.rows_per_lane))
        rows_per_level = levels(p.partial_rows)
        io = _ChunkIO(self.path, p, sizes, logits, targets, grad, loss_out)
        with _Partials(self.device, rows_per_level, cols) as parts, \
                Buffer(self.device, _DUMMY * 2 * len(p.chunks)) as dummy:
            with Commands(self.device, timestamps=timestamps) as cmd:
                if timestamps:
                    cmd.mark("start")
                for k, (first, n, part_row) in enumerate(p.chunks):
                    bindings = io.bindings(first, n, dummy, k)
                    bindings.update(io.shared(weight, pos_weight if loss == "bce" else None, parts))
                    cmd.dispatch(main, (p.groups_x, -(-n // p.rows_per_group)), bindings, {
                        "rows": n, "cols": cols, "part_row0": part_row, "grad_scale": grad_scale,
                        "alpha": float(alpha), "gamma": float(gamma)})
                self._record_reduction(cmd, parts, rows_per_level, cols)
                if timestamps:
                    cmd.mark("end")
            sums, counts = parts.levels[-1]
            per_class = sums.read(np.float32, (cols,)).astype(np.float64)
            positives = counts.read(np.uint32, (cols,)).astype(np.int64)
        out = LossOutput(float(per_class.sum()), per_class, positives)
        if timestamps and cmd.submission is not None:
            marks = cmd.submission.marks
            out.timings["kernel_ms"] = (marks["end"] - marks["start"]) / 1e6
        return out

    def _record_reduction(self, cmd: Commands, parts: _Partials, rows_per_level: list[int], cols: int) -> None:
        per_group = min(cols, GROUP_INVOCATIONS)
        reduce = self.pipeline("reduce_texel" if self.path == "texel" else "reduce_sum", per_group)
        for level in range(1, len(rows_per_level)):
            src, dst = parts.levels[level - 1], parts.levels[level]
            views: list[Any] = [src[0], src[1], dst[0], dst[1]]
            if self.path == "texel":
                views = [texel(v, f) for v, f in zip(views, ("r32f", "r32ui", "r32f", "r32ui"))]
            cmd.dispatch(reduce, (-(-cols // per_group), rows_per_level[level]), dict(enumerate(views)),
                         {"rows_in": rows_per_level[level - 1], "cols": cols})

    def close(self) -> None:
        """Destroy the pipelines (the device stays open). Idempotent."""
        for pipe in self._pipelines.values():
            pipe.close()
        self._pipelines.clear()

    def __enter__(self) -> LossKernels:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_params(loss: str, c: int, weight: np.ndarray, pos_weight: np.ndarray | None,
                  reduction: str, grad: np.ndarray | None, shape: tuple[int, ...]) -> None:
    if loss not in LOSSES:
        raise GpuError(f"Unknown loss kernel {loss!r}; available: {', '.join(LOSSES)}")
    if reduction not in REDUCTIONS:
        raise GpuError(f"Unknown reduction {reduction!r}; available: {', '.join(REDUCTIONS)}")
    if np.shape(weight) != (c,) or (pos_weight is not None and np.shape(pos_weight) != (c,)):
        raise GpuError(f"weight and pos_weight must have shape ({c},); got {np.shape(weight)} "
                       f"and {None if pos_weight is None else np.shape(pos_weight)}")
    if grad is not None and (grad.shape != shape or grad.dtype not in (np.float32, np.float64)
                             or not grad.flags.writeable):
        raise GpuError(f"grad must be a writable float32/float64 array of shape {shape}; "
                       f"got {grad.dtype} {grad.shape}")


_DUMMY = 256
_FORMATS = {(4, 4): "rgba32f", (4, 2): "rg32f", (4, 1): "r32f", (2, 4): "rgba16f", (2, 2): "rg16f", (2, 1): "r16f"}
_UINT_FORMATS = {4: "rgba32ui", 2: "rg32ui", 1: "r32ui"}


def texel_supported(device: Device) -> bool:
    """Whether the texel path runs on ``device``: every format it reads and writes is supported."""
    for (size, k), fmt in _FORMATS.items():
        features = texel_features(device, fmt)
        if "uniform_texel" not in features or (size == 4 and "storage_texel" not in features):
            return False
    return all({"uniform_texel", "storage_texel"} <= texel_features(device, f) for f in _UINT_FORMATS.values())


@dataclass
class _ChunkIO:
    """The per-chunk bindings of logits, targets, gradient and elementwise loss."""

    path: str
    plan: Plan
    sizes: tuple[int, ...]
    logits: Buffer
    targets: Buffer
    grad: Buffer | None
    loss_out: Buffer | None

    def bindings(self, first: int, n: int, dummy: Buffer, k: int) -> dict[int, Any]:
        c, classes = self.plan.cols, self.plan.classes
        xs, ys = self.sizes[0], self.sizes[1]
        spare = [dummy.range(_DUMMY * (2 * k + j), _DUMMY) for j in range(2)]
        x = self.logits.range(first * c * xs, n * c * xs)
        y = self.targets.range(first * c * ys, n * c * ys)
        g = self.grad.range(first * c * 4, n * c * 4) if self.grad is not None else spare[0]
        lo = self.loss_out.range(first * c * 4, n * c * 4) if self.loss_out is not None else spare[1]
        if self.path == "storage":
            return {0: x, 1: y, 2: g, 3: lo}
        out = _FORMATS[(4, classes)]
        return {0: texel(x, _FORMATS[(xs, classes)]), 1: texel(y, _FORMATS[(ys, classes)]), 2: texel(g, out),
                3: texel(lo, out), 8: texel(g, out)}

    def shared(self, weight: Buffer | BufferRange, pos_weight: Buffer | BufferRange | None,
               parts: _Partials) -> dict[int, Any]:
        """Bindings every chunk shares: class weights and the level-0 partials."""
        out: dict[int, Any] = {4: weight, 6: parts.levels[0][0], 7: parts.levels[0][1]}
        if pos_weight is not None:
            out[5] = pos_weight
        if self.path == "texel":
            k = self.plan.classes
            formats = {4: _FORMATS[(4, k)], 5: _FORMATS[(4, k)], 6: _FORMATS[(4, k)], 7: _UINT_FORMATS[k]}
            out = {b: texel(v, formats[b]) for b, v in out.items()}
        return out


class _Partials:
    """Per-level (sums, counts) buffers of the reduction; level 0 holds the work-group rows."""

    def __init__(self, device: Device, rows_per_level: list[int], cols: int) -> None:
        self.buffers = [Buffer(device, rows * cols * 4) for rows in rows_per_level for _ in range(2)]
        self.levels = [(self.buffers[2 * i], self.buffers[2 * i + 1]) for i in range(len(rows_per_level))]

    def __enter__(self) -> _Partials:
        return self

    def __exit__(self, *exc: object) -> None:
        for buf in self.buffers:
            buf.close()
