"""Loss kernels against a float64 numpy reference, across dtypes, load paths and sizes."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest

import gpu
from gpu.kernels import LossKernels, levels, plan

pytestmark = pytest.mark.gpu


def softplus(z: np.ndarray) -> np.ndarray:
    return np.maximum(z, 0.0) + np.log1p(np.exp(-np.abs(z)))


def sigmoid(z: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0, e) / (1.0 + e)


def reference(loss: str, x: np.ndarray, y: np.ndarray, w: np.ndarray, pw: np.ndarray | None = None,
              alpha: float = -1.0, gamma: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Float64 elementwise loss and its derivative (the kernel contract's formulas)."""
    x, y, w = x.astype(np.float64), y.astype(np.float64), w.astype(np.float64)
    p = sigmoid(x)
    if loss == "bce":
        pw = np.ones_like(w) if pw is None else pw.astype(np.float64)
        return w * (pw * y * softplus(-x) + (1 - y) * softplus(x)), w * ((pw * y + 1 - y) * p - pw * y)
    ce = softplus(x) - x * y
    q = p * (1 - y) + (1 - p) * y
    a = alpha * y + (1 - alpha) * (1 - y) if alpha >= 0 else 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        q_gm1 = np.where(q > 0, q ** (gamma - 1.0), 0.0)
    grad = w * a * ((p - y) * q**gamma + ce * gamma * q_gm1 * p * (1 - p) * (1 - 2 * y))
    return w * a * ce * q**gamma, grad


def data(rng: np.random.Generator, n: int, c: int, dtype: str = "float32",
         target_dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(0.0, 3.0, (n, c))
    y = (rng.random((n, c)) < 0.3).astype(np.float64)
    y[rng.random((n, c)) < 0.1] = 0.5
    return x.astype(dtype), y.astype(target_dtype or dtype)


def close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-4) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.abs(want).max()), 1e-30)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-5 * scale)


@pytest.fixture(scope="module")
def kernels(device: gpu.Device) -> Iterator[LossKernels]:
    with LossKernels(device) as k:
        yield k


@pytest.fixture(scope="module")
def storage(device: gpu.Device) -> Iterator[LossKernels]:
    with LossKernels(device, path="storage", import_host=False) as k:
        yield k


def test_texel_path_is_the_default_on_lavapipe(kernels: LossKernels, storage: LossKernels) -> None:
    assert kernels.path == "texel" and storage.path == "storage"
    assert kernels.import_host and not storage.import_host


@pytest.mark.parametrize("dtypes", [("float32", "float32"), ("float16", "float16"), ("float16", "float32")])
@pytest.mark.parametrize("cols", [8, 6, 5])
@pytest.mark.parametrize("loss", ["bce", "focal"])
@pytest.mark.parametrize("path", ["kernels", "storage"])
def test_matches_reference(request: pytest.FixtureRequest, rng: np.random.Generator, loss: str, cols: int,
                           dtypes: tuple[str, str], path: str) -> None:
    k: LossKernels = request.getfixturevalue(path)
    x, y = data(rng, 203, cols, *dtypes)
    w = rng.uniform(0.2, 3.0, cols).astype(np.float32)
    pw = rng.uniform(0.5, 2.0, cols).astype(np.float32)
    params = {"pos_weight": pw} if loss == "bce" else {"alpha": 0.25, "gamma": 1.5}
    grad = np.zeros(x.shape, np.float32)
    out = k.run(loss, x, y, grad, weight=w, reduction="sum", **params)
    ref_params = {"pw": pw} if loss == "bce" else {"alpha": 0.25, "gamma": 1.5}
    l, g = reference(loss, x, y, w, **ref_params)
    close(out.per_class, l.sum(axis=0))
    close(out.total, l.sum())
    close(grad, g)
    assert out.positives.dtype == np.int64
    np.testing.assert_array_equal(out.positives, np.count_nonzero(y.astype(np.float64) > 0, axis=0))


@pytest.mark.parametrize("gamma", [0.0, 0.3, 1.0, 2.0])
@pytest.mark.parametrize("alpha", [-1.0, 0.25])
def test_focal_gamma_and_alpha(kernels: LossKernels, rng: np.random.Generator, gamma: float, alpha: float) -> None:
    x, y = data(rng, 64, 8)
    w = np.ones(8, np.float32)
    grad = np.zeros(x.shape, np.float64)
    out = kernels.run("focal", x, y, grad, weight=w, alpha=alpha, gamma=gamma, reduction="none")
    l, g = reference("focal", x, y, w, alpha=alpha, gamma=gamma)
    close(out.elementwise, l)
    close(grad, g)


@pytest.mark.parametrize("reduction, scale", [("mean", 1.0 / (40 * 8)), ("sum", 1.0), ("none", 1.0)])
def test_reductions_scale_the_gradient(kernels: LossKernels, rng: np.random.Generator,
                                       reduction: str, scale: float) -> None:
    x, y = data(rng, 40, 8)
    w = np.ones(8, np.float32)
    grad = np.zeros(x.shape, np.float32)
    out = kernels.run("bce", x, y, grad, weight=w, reduction=reduction)
    l, g = reference("bce", x, y, w)
    close(grad, g * scale)
    assert (out.elementwise is not None) == (reduction == "none")


def test_gradient_is_added_into_host_arrays(kernels: LossKernels, rng: np.random.Generator) -> None:
    x, y = data(rng, 300, 80)
    w = np.ones(80, np.float32)
    start = rng.normal(0, 1, x.shape).astype(np.float32)
    grad = start.copy()
    kernels.run("bce", x, y, grad, weight=w, reduction="sum")
    kernels.run("bce", x, y, grad, weight=w, reduction="sum")
    _, g = reference("bce", x, y, w)
    close(grad - start, 2 * g)


@pytest.mark.parametrize("in_place", [True, False])
def test_large_host_arrays_are_imported_and_added_into(device: gpu.Device, rng: np.random.Generator,
                                                       in_place: bool) -> None:
    x, y = data(rng, 4000, 80)  # 1.28 MB each: imported, not copied
    w = rng.uniform(0.5, 2, 80).astype(np.float32)
    x0, y0 = x.copy(), y.copy()
    start = rng.normal(0, 1, x.shape).astype(np.float32)
    grad = start.copy()
    with LossKernels(device, grad_in_place=in_place) as k:
        assert k.import_host
        out = k.run("focal", x, y, grad, weight=w, alpha=0.25, gamma=2.0, reduction="mean")
    l, g = reference("focal", x, y, w, alpha=0.25, gamma=2.0)
    np.testing.assert_allclose(grad, start + g / x.size, rtol=1e-6, atol=2e-7)
    assert np.abs(grad - start).max() > 1e-6  # the gradient did arrive
    close(out.total / x.size, l.mean())
    assert np.array_equal(x, x0) and np.array_equal(y, y0)


def test_strided_unaligned_and_fortran_inputs_are_copied(kernels: LossKernels, rng: np.random.Generator) -> None:
    x, y = data(rng, 4000, 160)
    xs, ys = x[:, ::2], np.asfortranarray(y[:, ::2])
    grad = np.zeros(4000 * 80 + 1, np.float32)[1:].reshape(4000, 80)  # 4 bytes off alignment
    assert grad.ctypes.data % 16
    out = kernels.run("bce", np.ascontiguousarray(xs), ys, grad, weight=np.ones(80, np.float32),
                      reduction="sum")
    l, g = reference("bce", xs, ys, np.ones(80, np.float32))
    close(out.per_class, l.sum(axis=0))
    close(grad, g)


@pytest.mark.parametrize("path", ["texel", "storage"])
def test_device_kernel_adds_into_the_gradient_buffer(device: gpu.Device, rng: np.random.Generator,
                                                     path: str) -> None:
    n, c = 97, 12
    x, y = data(rng, n, c)
    w = rng.uniform(0.5, 2, c).astype(np.float32)
    start = rng.normal(0, 1, (n, c)).astype(np.float32)
    with LossKernels(device, path=path) as k, gpu.Buffer(device, x.nbytes) as xb, \
            gpu.Buffer(device, y.nbytes) as yb, gpu.Buffer(device, start.nbytes) as gb, \
            gpu.Buffer(device, 2 * c * 4 + 256) as wb:
        xb.write(x)
        yb.write(y)
        gb.write(start)
        wb.write(w)
        wb.write(np.ones(c, np.float32), 256)
        for _ in range(2):
            out = k.run_buffers("bce", "f32", xb, yb, rows=n, cols=c, weight=wb.range(0, c * 4),
                                pos_weight=wb.range(256, c * 4), grad=gb, grad_mode="add")
        got = gb.read(np.float32, (n, c))
    l, g = reference("bce", x, y, w)
    close(got - start, 2 * g)
    close(out.per_class, l.sum(axis=0))


def test_extreme_logits_stay_finite(kernels: LossKernels, rng: np.random.Generator) -> None:
    values = np.array([1e4, -1e4, 1e3, -1e3, 100, -100, 30, -30, 17, -17, 0, 1e-3], np.float64)
    x = np.resize(values, (12, 8))
    y = rng.choice([0.0, 1.0, 0.5], size=x.shape)
    w = np.ones(8, np.float32)
    for dtype in ("float32", "float16"):
        for loss, params in (("bce", {}), ("focal", {"alpha": 0.25, "gamma": 0.5})):
            grad = np.zeros(x.shape, np.float32)
            xx, yy = x.astype(dtype), y.astype(dtype)
            out = kernels.run(loss, xx, yy, grad, weight=w, reduction="none", **params)
            assert np.all(np.isfinite(out.elementwise)) and np.all(np.isfinite(grad))
            l, g = reference(loss, xx, yy, w, **params)
            close(out.elementwise, l)
            close(grad, g)


def test_empty_input(kernels: LossKernels) -> None:
    grad = np.zeros((0, 8), np.float32)
    out = kernels.run("bce", np.zeros((0, 8), np.float32), np.zeros((0, 8), np.float32), grad,
                      weight=np.ones(8, np.float32), reduction="none")
    assert out.total == 0.0 and out.elementwise.shape == (0, 8)
    assert not out.per_class.any() and not out.positives.any()


def test_counts_past_the_loop_cap(kernels: LossKernels, storage: LossKernels, rng: np.random.Generator) -> None:
    """70,000 rows: one invocation walking a column would stop at 65,535 on lavapipe."""
    n = 70_000
    for k, cols in ((kernels, 2), (storage, 1), (kernels, 1)):
        x, y = data(rng, n, cols)
        y[:, 0] = 1.0
        out = k.run("bce", x, y, None, weight=np.ones(cols, np.float32), reduction="sum")
        assert out.positives[0] == n
        l, _ = reference("bce", x, y, np.ones(cols, np.float32))
        close(out.per_class, l.sum(axis=0), rtol=1e-5)


def test_chunks_smaller_than_the_binding_limit(device: gpu.Device, rng: np.random.Generator) -> None:
    n, c = 3000, 10
    x, y = data(rng, n, c)
    w = rng.uniform(0.5, 2, c).astype(np.float32)
    with LossKernels(device, max_binding=16 << 10) as k:
        p = plan(n, c, (4, 4, 4), max_binding=k.max_binding, align=device.info.min_storage_buffer_offset_alignment,
                 max_groups=65535)
        assert len(p.chunks) >= 7
        grad = np.zeros(x.shape, np.float32)
        out = k.run("focal", x, y, grad, weight=w, alpha=0.25, gamma=2.0, reduction="none")
    l, g = reference("focal", x, y, w, alpha=0.25, gamma=2.0)
    close(out.per_class, l.sum(axis=0))
    close(out.elementwise, l)
    close(grad, g)


@pytest.mark.slow
def test_tensor_over_128_mib(kernels: LossKernels, rng: np.random.Generator) -> None:
    """One (N, 80) float32 tensor of more than 128 MiB: bound in chunks, checked chunk-wise."""
    n, c = 420_000, 80
    assert n * c * 4 > kernels.device.info.max_storage_buffer_range
    x = rng.normal(0.0, 3.0, (n, c)).astype(np.float32)
    y = (rng.random((n, c)) < 0.05).astype(np.float32)
    w = np.linspace(0.5, 2.0, c, dtype=np.float32)
    grad = np.zeros((n, c), np.float32)
    out = kernels.run("bce", x, y, grad, weight=w, reduction="sum")
    per_class = np.zeros(c)
    for start in range(0, n, 60_000):
        sl = slice(start, start + 60_000)
        l, g = reference("bce", x[sl], y[sl], w)
        per_class += l.sum(axis=0)
        close(grad[sl], g)
    close(out.per_class, per_class, rtol=1e-5)
    np.testing.assert_array_equal(out.positives, np.count_nonzero(y, axis=0))


def test_plan_keeps_bindings_aligned_and_bounded() -> None:
    p = plan(10_000, 80, (2, 4, 4), max_binding=1 << 20, align=256, max_groups=65535)
    assert p.classes == 4 and p.quads_per_group == 20 and p.local_size == 240
    starts = [first for first, _, _ in p.chunks]
    assert all((s * 80 * 2) % 256 == 0 and (s * 80 * 4) % 256 == 0 for s in starts)
    assert all(rows * 80 * 4 <= (1 << 20) for _, rows, _ in p.chunks)
    assert sum(rows for _, rows, _ in p.chunks) == 10_000
    assert p.rows_per_group == 12 * 64
    assert p.partial_rows == sum(-(-rows // p.rows_per_group) * 12 for _, rows, _ in p.chunks)
    assert levels(5000) == [5000, 313, 20, 2, 1]
    with pytest.raises(gpu.GpuError, match="maxStorageBufferRange"):
        plan(10, 1 << 20, (4,), max_binding=1 << 20, align=256, max_groups=65535)


def test_bad_inputs_are_refused(kernels: LossKernels) -> None:
    x = np.zeros((4, 8), np.float32)
    w = np.ones(8, np.float32)
    with pytest.raises(gpu.GpuError, match="Unknown loss kernel 'mse'; available: bce, focal"):
        kernels.run("mse", x, x, weight=w)
    with pytest.raises(gpu.GpuError, match="Unsupported logits/targets dtypes float32/float16"):
        kernels.run("bce", x, x.astype(np.float16), weight=w)
    with pytest.raises(gpu.GpuError, match=r"weight and pos_weight must have shape \(8,\)"):
        kernels.run("bce", x, x, weight=np.ones(3, np.float32))
    with pytest.raises(gpu.GpuError, match="grad must be a writable float32/float64 array"):
        kernels.run("bce", x, x, np.zeros((4, 8), np.int32), weight=w)
    with pytest.raises(gpu.GpuError, match="Unknown reduction 'avg'"):
        kernels.run("bce", x, x, weight=w, reduction="avg")
