"""The vulkan_exec plugin: registration, conformance, status, pool stats and its command."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest
from click.testing import CliRunner

import gpu
import tracker
from plugins import vulkan_exec
from tests.harness.hosts import host_fixture
from tests.harness.vulkan import collect_validation_messages
from tracker.host import Host, make_plugin_manager, set_host
from tracker.testing import check_kernel

pytestmark = pytest.mark.gpu
PLUGINS = ("plugins.losses", "plugins.vulkan_exec")


@pytest.fixture(scope="module", autouse=True)
def validated_device() -> Iterator[None]:
    """The plugin's process-wide device, created afresh under the validation layer."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRACKER_VULKAN_VALIDATION", "1")
    vulkan_exec.close()
    yield
    vulkan_exec.close()
    mp.undo()


@pytest.fixture(autouse=True)
def no_validation_messages() -> Iterator[None]:
    with collect_validation_messages() as messages:
        yield
    assert messages == [], "Vulkan validation messages:\n" + "\n".join(messages)


host = host_fixture(*PLUGINS)


def test_kernels_are_registered_under_vulkan(host: Host) -> None:
    kernels = host.items("kernels")
    for term in ("class_weighted_bce", "sigmoid_focal"):
        kernel = kernels[f"{term}/vulkan"]
        assert kernel.backend == "vulkan" and kernel.dtypes == ("float16", "float32")
        assert kernel.unavailable() is None
    assert host.status("vulkan_exec") is None


@pytest.mark.parametrize("term", ["class_weighted_bce", "sigmoid_focal"])
def test_conformance(host: Host, term: str) -> None:
    report = check_kernel(term, "vulkan", raise_on_failure=False)
    assert report.ok, "\n".join(r.message for r in report.failures)
    assert {r.check for r in report.results} >= {"accumulation", "agreement", "extremes", "empty"}


def test_agrees_with_the_numpy_kernel(host: Host) -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(0, 3, (2, 500, 80)).astype(np.float32)
    y = (rng.random(x.shape) < 0.02).astype(np.float32)
    counts = np.arange(1, 81, dtype=np.float64) ** 2
    results = {}
    for backend in ("vulkan", "numpy"):
        grad = np.full(x.shape, 0.5, np.float32)
        loss = tracker.loss("class_weighted_bce", backend=backend, scheme="inverse_sqrt", counts=counts)
        results[backend] = (loss(x, y, grad), grad)
    (rv, gv), (rn, gn) = results["vulkan"], results["numpy"]
    assert rv.loss == pytest.approx(rn.loss, rel=1e-5)
    np.testing.assert_allclose(rv.per_class, rn.per_class, rtol=1e-5)
    np.testing.assert_array_equal(rv.positives, rn.positives)
    np.testing.assert_allclose(gv, gn, rtol=1e-5, atol=1e-9)


def test_unknown_keyword_raises(host: Host) -> None:
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(TypeError):
        vulkan_exec.bce_vulkan(x, x, None, weight=np.ones(4, np.float32), pos_weight=None,
                               reduction="sum", gamma=2.0)


def test_registers_nothing_without_vulkan(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = "no Vulkan loader (libvulkan.so.1): install the Debian package libvulkan1"
    monkeypatch.setattr(gpu, "available", lambda: (False, reason))
    h = Host(make_plugin_manager(default_plugins=PLUGINS, entry_points=False))
    old = set_host(h)
    try:
        assert not [k for k in h.items("kernels") if k.endswith("/vulkan")]
        assert h.status("vulkan_exec") == reason
        listing = {p["name"]: p for p in h.describe()}["vulkan_exec"]
        assert listing["status"] == reason
        assert set(listing["registered"]) <= {"commands"}  # no kernel; `tracker gpu devices` still says why
    finally:
        set_host(old)


class FakeRun:
    def __init__(self) -> None:
        self.logged: list[tuple[dict[str, Any], int | None]] = []

    def log(self, values: dict[str, Any], step: int | None = None) -> None:
        self.logged.append((values, step))


def test_pool_stats_are_logged_under_gpu_pool(host: Host) -> None:
    x = np.zeros((64, 8), np.float32)
    tracker.loss("class_weighted_bce", backend="vulkan")(x, x)
    run = FakeRun()
    values = vulkan_exec.log_pool_stats(run, step=7)
    assert run.logged == [(values, 7)]
    assert {"gpu/pool/bytes_live", "gpu/pool/bytes_reserved", "gpu/pool/peak_live", "gpu/pool/peak_reserved",
            "gpu/pool/fragmentation", "gpu/pool/device_allocations"} <= set(values)
    assert values["gpu/pool/peak_live"] > 0 and values["gpu/pool/bytes_reserved"] >= values["gpu/pool/bytes_live"]
    assert all(isinstance(v, float) for v in values.values())


def test_pool_stats_land_in_a_real_run() -> None:
    run = tracker.init(project="gpu", name="pool")
    try:
        vulkan_exec.log_pool_stats(run, step=1)
    finally:
        run.finish()
    rows = tracker.query("select key from curves where key like 'gpu/pool/%'")
    assert "gpu/pool/bytes_reserved" in set(rows["key"].to_list())


def test_gpu_devices_command(host: Host) -> None:
    from tracker.cli import build_cli

    result = CliRunner().invoke(build_cli(), ["gpu", "devices"])
    assert result.exit_code == 0, result.output
    assert "*" in result.output and gpu.list_devices()[0].name in result.output


def test_auto_prefers_numpy_for_small_inputs_and_vulkan_for_large() -> None:
    from plugins.vulkan_exec import AUTO_MIN_ELEMENTS
    from tracker.losses import auto_kernel

    assert auto_kernel("class_weighted_bce", elements=1000).backend == "numpy"
    assert auto_kernel("class_weighted_bce", elements=AUTO_MIN_ELEMENTS).backend == "vulkan"
