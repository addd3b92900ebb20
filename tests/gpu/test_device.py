"""Device choice, availability, validation routing and lifetime."""

from __future__ import annotations

import builtins
import gc
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gpu
from gpu import device as device_mod
from gpu.device import DeviceInfo, choose

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def info(index: int, name: str, kind: str) -> DeviceInfo:
    return DeviceInfo(index, name, kind, "1.3.0", 128, 1 << 27, 16, (65535,) * 3, 1024, (1024,) * 3,
                      32768, 64, 1.0, True, True, True, 8, 4096, 1 << 27, 16)


DEVICES = [info(0, "llvmpipe (LLVM 15)", "cpu"), info(1, "Intel UHD 630", "integrated"),
           info(2, "NVIDIA H200", "discrete"), info(3, "NVIDIA T4", "discrete")]


def test_default_prefers_discrete_then_gpu_then_cpu() -> None:
    assert choose(DEVICES, None).name == "NVIDIA H200"
    assert choose(DEVICES[:2], None).name == "Intel UHD 630"
    assert choose(DEVICES[:1], "").name.startswith("llvmpipe")


def test_selector_by_index_or_name_substring() -> None:
    assert choose(DEVICES, "0").type == "cpu"
    assert choose(DEVICES, 3).name == "NVIDIA T4"
    assert choose(DEVICES, "t4").index == 3
    assert choose(DEVICES, "nvidia").index == 2  # several match: the preferred one


def test_bad_selector_lists_the_devices() -> None:
    with pytest.raises(gpu.GpuError, match=r"TRACKER_VULKAN_DEVICE='7': no Vulkan device 7; available: 0: llvmpipe"):
        choose(DEVICES, "7")
    with pytest.raises(gpu.GpuError, match=r"'radeon' matches no Vulkan device; available: .*3: NVIDIA T4"):
        choose(DEVICES, "radeon")


def test_available_names_the_device() -> None:
    ok, why = gpu.available()
    assert ok, why
    assert any(d.name in why for d in gpu.list_devices())


def test_env_selects_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    names = [d.name for d in gpu.list_devices()]
    monkeypatch.setenv("TRACKER_VULKAN_DEVICE", names[0][:5].upper())
    with gpu.Device() as dev:
        assert dev.info.name == names[0] and dev.validation
    monkeypatch.setenv("TRACKER_VULKAN_DEVICE", "no-such-gpu")
    with pytest.raises(gpu.GpuError, match="matches no Vulkan device"):
        gpu.Device()
    assert gpu.available() == (False, f"TRACKER_VULKAN_DEVICE='no-such-gpu' matches no Vulkan device; "
                                      f"available: {'; '.join(f'{d.index}: {d.name} ({d.type})' for d in gpu.list_devices())}")


def test_missing_loader_names_the_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_vulkan(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "vulkan":
            raise OSError("cannot load library 'libvulkan.so.1'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vulkan)
    with pytest.raises(gpu.VulkanUnavailable, match="install the Debian package libvulkan1") as exc:
        device_mod.load_vulkan()
    assert exc.value.package == "libvulkan1"
    device_mod._probe.cache_clear()
    try:
        ok, why = gpu.available()
    finally:
        monkeypatch.undo()
        device_mod._probe.cache_clear()
    assert not ok and "libvulkan1" in why


def test_no_driver_names_mesa_in_a_fresh_process(tmp_path: Path) -> None:
    env = dict(os.environ, VK_ICD_FILENAMES=str(tmp_path / "none.json"), VK_DRIVER_FILES=str(tmp_path / "none.json"))
    env.pop("TRACKER_VULKAN_VALIDATION", None)
    code = "import gpu; ok, why = gpu.available(); print(ok); print(why)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    ok, why = out.stdout.strip().splitlines()[:2]
    assert ok == "False" and "mesa-vulkan-drivers" in why


def test_missing_validation_layer_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    vk = device_mod.load_vulkan()
    monkeypatch.setattr(vk, "vkEnumerateInstanceLayerProperties", lambda: iter(()))
    with pytest.raises(gpu.VulkanUnavailable, match="vulkan-validationlayers") as exc:
        gpu.Device(validation=True)
    assert exc.value.package == "vulkan-validationlayers"


def test_validation_messages_reach_logging(device: gpu.Device, validation_messages: list[str]) -> None:
    vk = device.vk
    try:
        buffer = vk.vkCreateBuffer(device.handle, vk.VkBufferCreateInfo(
            size=0, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        vk.vkDestroyBuffer(device.handle, buffer, None)
    except vk.VkError:
        pass
    assert any("VkBufferCreateInfo-size" in m for m in validation_messages)
    validation_messages.clear()


def test_close_is_idempotent_and_closes_children() -> None:
    dev = gpu.Device()
    buf = gpu.Buffer(dev, 64)
    pipe = gpu.Compute(dev, "echo_tight")
    dev.close()
    dev.close()
    assert dev.closed and buf.closed
    buf.close()
    pipe.close()
    with pytest.raises(gpu.ClosedError, match="closed"):
        dev.handle
    with pytest.raises(gpu.ClosedError):
        buf.view()


def test_finalizer_releases_an_unclosed_device() -> None:
    dev = gpu.Device()
    state = dev._state
    gpu.Buffer(dev, 1024)  # dropped at once: its finalizer returns it to the pool
    del dev
    gc.collect()
    assert state.closed


def test_memory_is_freed_only_after_the_fence(device: gpu.Device) -> None:
    pool = device.pools["device"]
    with gpu.Compute(device, "echo_tight") as pipe:
        buf = gpu.Buffer(device, 4096)
        before = pool.stats().bytes_live
        cmd = gpu.Commands(device)
        cmd.dispatch(pipe, 1, {0: buf}, {"a": 1, "b": 2, "c": 3.0})
        with pytest.raises(gpu.GpuError, match="not submitted"):
            buf.close()
        submission = cmd.submit(wait=False)
        buf.close()
        assert pool.stats().bytes_live == before  # the GPU may still use it
        submission.wait()
        assert pool.stats().bytes_live == before - 4096
        assert submission.done


def test_pipeline_cache_is_saved_and_loaded(tmp_path: Path) -> None:
    path = tmp_path / "pipelines.bin"
    with gpu.Device(pipeline_cache=path) as dev:
        gpu.Compute(dev, "echo_push").close()
    assert path.stat().st_size > 0
    with gpu.Device(pipeline_cache=path) as dev:
        with gpu.Compute(dev, "echo_push") as pipe, gpu.Buffer(dev, 128) as out:
            gpu.dispatch(pipe, 1, {0: out}, dict(a=1, b=2, c=3.0, d=4, e=5.0, f=[6, 7, 8], g=9.0,
                                                  h=[1, 2, 3], k=[1.0, 2.0], m=[1, 2], n=3))
            assert out.view(np.uint32, 1)[0] == 1


def test_device_info_has_the_limits_the_library_uses(device: gpu.Device) -> None:
    i = device.info
    assert i.max_push_constants_size >= 128 and i.max_storage_buffer_range >= 1 << 27
    assert i.subgroup_size >= 1 and i.timestamp_period_ns > 0
    assert replace(i, name="x").name == "x"
    assert repr(device).startswith("<gpu.Device")
