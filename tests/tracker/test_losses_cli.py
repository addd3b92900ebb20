"""``tracker weights`` and ``tracker check-plugins``."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from click.testing import CliRunner

from tracker import hookimpl
from tracker.cli import build_cli
from tracker.host import Host, make_plugin_manager, set_host
from tracker.losses import Kernel, LossResult, LossTerm, reduce_elementwise
from tracker.weights import class_weights, load_counts

COCO_COUNTS = Path(__file__).resolve().parents[1] / "data/coco/train2017_class_counts.json"


def _run(*args: str) -> Any:
    return CliRunner().invoke(build_cli(), list(args))


def test_weights_table_for_coco_counts() -> None:
    result = _run("weights", "--counts", str(COCO_COUNTS), "--scheme", "inverse")
    assert result.exit_code == 0, result.output
    assert "class weights: inverse, normalize mean" in result.output
    assert "person" in result.output and "262,465" in result.output
    assert "hair drier" in result.output


def test_weights_csv_matches_the_library() -> None:
    result = _run(
        "weights", "--counts", str(COCO_COUNTS), "--scheme", "effective_number", "--beta", "0.99", "--format", "csv"
    )
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.output)))
    counts = load_counts(COCO_COUNTS)
    assert [r["class"] for r in rows] == counts.names
    expected = class_weights(counts.counts, "effective_number", beta=0.99)
    np.testing.assert_allclose([float(r["weight"]) for r in rows], expected, rtol=1e-12)
    assert int(rows[0]["count"]) == int(counts.counts[0])


def test_weights_json_with_power_and_instance_normalisation(tmp_path: Path) -> None:
    path = tmp_path / "counts.json"
    path.write_text(json.dumps({"cat": 10, "dog": 1000, "eel": 0}))
    result = _run(
        "weights",
        "--counts",
        str(path),
        "--scheme",
        "power",
        "--power",
        "0.5",
        "--normalize",
        "instances",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert [c["class"] for c in payload["classes"]] == ["cat", "dog", "eel"]
    weights = np.array([c["weight"] for c in payload["classes"]])
    np.testing.assert_allclose(weights, class_weights([10, 1000, 0], "power", power=0.5, normalize="instances"))
    assert payload["title"] == "class weights: power, p 0.5, normalize instances"


def test_manual_weights_need_no_counts() -> None:
    result = _run("weights", "--scheme", "manual", "--weights", "1,3", "--format", "csv")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["class,count,weight", "0,,0.5", "1,,1.5"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--scheme", "inverse"), "Error: --scheme inverse needs --counts FILE"),
        (("--counts", "/nonexistent/counts.json"), "Error: counts file '/nonexistent/counts.json' does not exist"),
        (("--scheme", "manual", "--weights", "1,x"), "Error: --weights is '1,x'; expected comma-separated numbers"),
        (
            ("--counts", str(COCO_COUNTS), "--beta", "2", "--scheme", "effective_number"),
            "Error: beta is 2.0; expected 0 <= beta < 1",
        ),
    ],
)
def test_weights_errors_are_one_clean_line(args: tuple[str, ...], message: str) -> None:
    result = _run("weights", *args)
    assert result.exit_code == 1
    assert result.output.strip() == message or result.output.strip().startswith(message)
    assert "Traceback" not in result.output


def _square(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, *, reduction: str) -> LossResult:
    x, y = logits.astype(np.float64), targets.astype(np.float64)
    return reduce_elementwise((x - y) ** 2, 2 * (x - y), y, grad, reduction)


def _assigning(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, *, reduction: str) -> LossResult:
    g = None if grad is None else np.zeros(grad.shape)
    result = _square(logits, targets, g, reduction=reduction)
    if grad is not None and g is not None:
        grad[...] = g
    return result


class SquarePlugin:
    def __init__(self, broken: bool) -> None:
        self.broken = broken

    @hookimpl
    def tracker_register_losses(self, register: Any) -> None:
        register(LossTerm("square", _square))

    @hookimpl
    def tracker_register_kernels(self, register: Any) -> None:
        register(Kernel("square", "numpy", _assigning if self.broken else _square, ("float32", "float64")))


@pytest.fixture
def square_host(request: pytest.FixtureRequest) -> Iterator[Host]:
    pm = make_plugin_manager(default_plugins=(), entry_points=False)
    pm.register(SquarePlugin(broken=request.param), name="squares")
    fresh = Host(pm)
    old = set_host(fresh)
    yield fresh
    set_host(old)


@pytest.mark.parametrize("square_host", [False], indirect=True)
def test_check_plugins_passes_good_plugins(square_host: Host) -> None:
    result = _run("check-plugins")
    assert result.exit_code == 0, result.output
    assert "square" in result.output and "reference" in result.output and "squares" in result.output
    assert "ok" in result.output and "FAILED" not in result.output


@pytest.mark.parametrize("square_host", [True], indirect=True)
def test_check_plugins_fails_an_overwriting_kernel(square_host: Host) -> None:
    result = _run("check-plugins", "--term", "square")
    assert result.exit_code == 1
    assert "FAILED: accumulation" in result.output
    assert "square/numpy (plugin 'squares'): check 'accumulation' failed" in result.output
    message = next(line for line in result.output.splitlines() if "check 'accumulation' failed" in line)
    # in a plugin author's words, with the plugin named in the message itself
    assert "OVERWROTE the gradient instead of adding into it" in message
    assert "`grad += g`" in message and "`grad[...] = g`" in message
    assert "in plugin 'squares'" in message


@pytest.mark.parametrize("square_host", [False], indirect=True)
def test_check_plugins_unknown_term(square_host: Host) -> None:
    result = _run("check-plugins", "--term", "nope")
    assert result.exit_code == 1
    assert result.output.strip() == "Error: Unknown loss 'nope'; available: square"


class RaisingPlugin:
    """A loss plugin whose register hook raises half-way."""

    __version__ = "2.5.0"

    @hookimpl
    def tracker_register_losses(self, register: Any) -> None:
        register(LossTerm("cube", _square))
        raise RuntimeError("boom while registering cube")


class DuplicatePlugin:
    """A loss plugin that registers a term name another plugin already has."""

    __version__ = "0.3.1"

    @hookimpl
    def tracker_register_losses(self, register: Any) -> None:
        register(LossTerm("square", _square))


def _host_with(**plugins: object) -> Host:
    pm = make_plugin_manager(default_plugins=(), entry_points=False)
    for name, plugin in plugins.items():
        pm.register(plugin, name=name)
    return Host(pm)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (RaisingPlugin(), "RuntimeError: boom while registering cube"),
        (DuplicatePlugin(), "duplicate loss term 'square': registered by plugin 'squares' and again by plugin 'bad'"),
    ],
    ids=["raising-register-hook", "duplicate-term-name"],
)
def test_check_plugins_fails_when_a_plugin_failed_to_register(bad: object, reason: str) -> None:
    old = set_host(_host_with(squares=SquarePlugin(broken=False), bad=bad))
    try:
        result = _run("check-plugins")
    finally:
        set_host(old)
    assert result.exit_code == 1, result.output
    rows = [line.split("\t") for line in result.output.splitlines() if line.count("\t") == 4]
    bad_row = next(r for r in rows if r[2] == "bad")  # the table shows the failed plugin
    assert bad_row[:4] == ["-", "-", "bad", "load"]
    assert bad_row[4].startswith("FAILED: plugin disabled: tracker_register_losses raised") and reason in bad_row[4]
    assert ["square", "reference", "squares", "9", "ok"] in rows  # the good plugin is still checked
    assert "plugin 'bad' failed to load or register and was disabled: " in result.output
    assert "losse " not in result.output


def test_a_plugin_that_failed_to_register_keeps_its_version() -> None:
    old = set_host(_host_with(squares=SquarePlugin(broken=False), bad=RaisingPlugin()))
    try:
        result = _run("plugins", "--format", "json")
    finally:
        set_host(old)
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["bad"]["version"] == "2.5.0"
    assert "boom while registering cube" in rows["bad"]["status"]
