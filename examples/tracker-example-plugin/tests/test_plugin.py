"""The example plugin, as its author tests it: registration, the loss, each extension point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

import tracker
from tracker.host import get_host
from tracker.losses import Kernel, LossResult
from tracker.testing import check_kernel, check_loss_term
from tracker_example.extras import PANEL, ceiling_events, jsonl_path
from tracker_example.poly1 import poly1_numpy


def test_the_entry_point_registers_everything() -> None:
    host = get_host()
    expected = {
        "losses": "poly1_bce", "kernels": "poly1_bce/numpy", "samplers": "shuffled",
        "loggers": "jsonl", "detectors": "loss_ceiling", "panels": "example",
    }
    for kind, key in expected.items():
        assert host.registry(kind).owners[key] == "example", kind
    assert "example" not in host.failures


def test_conformance_of_the_term_and_its_kernel() -> None:
    check_loss_term("poly1_bce")  # raises ConformanceError naming every failed check
    check_kernel("poly1_bce", "numpy")


def test_epsilon_zero_is_plain_bce() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(0, 3, (64, 80)).astype(np.float32)
    y = (rng.random((64, 80)) < 0.1).astype(np.float32)
    g_poly, g_bce = np.zeros_like(x), np.zeros_like(x)
    poly = tracker.loss("poly1_bce", epsilon=0.0, backend="numpy")(x, y, grad=g_poly)
    bce = tracker.loss("class_weighted_bce", backend="numpy")(x, y, grad=g_bce)
    np.testing.assert_allclose(poly.loss, bce.loss, rtol=1e-5)
    np.testing.assert_allclose(poly.per_class, bce.per_class, rtol=1e-4)
    np.testing.assert_allclose(g_poly, g_bce, rtol=1e-4, atol=1e-9)


def test_a_kernel_that_assigns_its_gradient_is_caught() -> None:
    def assigning(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **params: Any) -> LossResult:
        own = None if grad is None else np.zeros_like(grad)
        result = poly1_numpy(logits, targets, own, **params)
        if grad is not None:
            grad[...] = own  # the bug: assign instead of add
        return result

    report = check_kernel("poly1_bce", Kernel("poly1_bce", "assigning", assigning, ("float32", "float64")),
                          raise_on_failure=False)
    assert {r.check for r in report.failures} == {"accumulation"}
    assert "`grad += g`" in report.failures[0].message


def test_shuffled_sampler_shards_one_order_across_ranks() -> None:
    shards = [list(tracker.sampler("shuffled", num_images=10, seed=3, rank=r, world_size=2)) for r in (0, 1)]
    assert sorted(shards[0] + shards[1]) == list(range(10))
    assert shards[0] != sorted(shards[0]) or shards[1] != sorted(shards[1])


def test_jsonl_logger_and_loss_ceiling_detector_in_a_real_run() -> None:
    run = tracker.init("example", loggers=["store", "jsonl"],
                       config={"analysis": {"loss_ceiling": {"ceiling": 5.0}}})
    for step, value in enumerate([1.0, 2.0, 9.0, 9.5, 1.0, 7.0]):
        run.log({"loss": value}, step=step)
    run.finish()
    lines = [json.loads(line) for line in Path(jsonl_path(run)).read_text().splitlines()]
    assert [row["value"] for row in lines[:-1]] == [1.0, 2.0, 9.0, 9.5, 1.0, 7.0]
    assert lines[-1] == {"status": "finished"}
    events = ceiling_events()
    assert events["step"].to_list() == [2, 5]  # once per episode above the ceiling
    assert "above the ceiling 5" in events["message"][0]


def test_panel_is_a_named_page_with_a_render_callable() -> None:
    assert get_host().registry("panels").items["example"] is PANEL
    assert PANEL.title == "Loss ceiling" and callable(PANEL.render)
