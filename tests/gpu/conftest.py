"""GPU test fixtures: validation on for every test, and zero validation messages allowed.

``TRACKER_VULKAN_VALIDATION=1`` is set for the whole session, so every device a
test creates (its own, or the vulkan plugin's) runs under
VK_LAYER_KHRONOS_validation; the ``validation_messages`` fixture (autouse) fails a
test that made the layer say anything. A test that provokes a message on purpose
takes the list and clears it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import gpu
from gpu.build_shaders import compile_shader
from tests.harness.vulkan import collect_validation_messages

os.environ["TRACKER_VULKAN_VALIDATION"] = "1"


@pytest.fixture(autouse=True)
def validation_messages() -> Iterator[list[str]]:
    """Messages the validation layer logged during the test; must be empty at the end."""
    with collect_validation_messages() as messages:
        yield messages
    assert messages == [], "Vulkan validation messages:\n" + "\n".join(messages)


@pytest.fixture(scope="session")
def device() -> Iterator[gpu.Device]:
    """One validated device for the session (lavapipe in CI)."""
    ok, why = gpu.available()
    assert ok, f"GPU tests need a Vulkan device: {why}"
    with gpu.Device(validation=True) as dev:
        yield dev


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


@pytest.fixture
def compile_glsl(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Compile a GLSL compute source given as text; returns SPIR-V bytes."""

    def build(source: str, name: str = "test") -> bytes:
        path = tmp_path / f"{name}.comp"
        path.write_text(source)
        return compile_shader(path)

    return build
