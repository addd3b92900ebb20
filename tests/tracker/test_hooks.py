"""One test per hook: a small plugin implements it and the host uses what it gave."""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass
from typing import Any, Callable

import click
import numpy as np
from click.testing import CliRunner

import tracker
from tracker import hookimpl, hookspecs
from tracker.host import DEFAULT_PLUGINS, Host, make_plugin_manager, set_host
from tracker.losses import Kernel, LossResult, LossTerm


def use_plugin(**hooks: Callable[..., Any]) -> Host:
    """A host with the default plugins plus one made of ``hooks``; it becomes the process host."""
    plugin = types.ModuleType("hooked_plugin")
    for name, fn in hooks.items():
        setattr(plugin, name, hookimpl(fn))
    pm = make_plugin_manager(default_plugins=DEFAULT_PLUGINS, entry_points=False)
    pm.register(plugin, name="hooked_plugin")
    host = Host(pm)
    set_host(host)  # the autouse fixture restores the previous host
    return host


def _half_square(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, *, reduction: str) -> LossResult:
    d = logits.astype(np.float64) - targets
    per_class = 0.5 * (d * d).sum(axis=0)
    if grad is not None:
        grad += d.astype(grad.dtype)
    return LossResult(loss=float(per_class.sum()), per_class=per_class,
                      positives=(targets > 0).sum(axis=0).astype(np.int64))


def test_every_hook_has_a_test_here() -> None:
    names = {n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("tracker_")}
    tests = {n.removeprefix("test_hook_") for n in globals() if n.startswith("test_hook_")}
    assert names <= tests, f"hooks without a test_hook_<name>: {sorted(names - tests)}"


def test_hook_tracker_register_losses() -> None:
    def tracker_register_losses(register: Any) -> None:
        register(LossTerm(name="half_square", reference=_half_square))

    host = use_plugin(tracker_register_losses=tracker_register_losses)
    assert host.registry("losses").owners["half_square"] == "hooked_plugin"
    assert "half_square" in tracker.losses()
    grad = np.ones((2, 3), np.float32)
    r = tracker.loss("half_square", backend="reference", reduction="sum")(
        np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32), grad=grad)
    assert r.loss == 3.0 and np.all(grad == 0.0)  # 1 + (0 - 1): added, not assigned


def test_hook_tracker_register_kernels() -> None:
    calls = []

    def fast(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **kw: Any) -> LossResult:
        calls.append(kw)
        from plugins.losses import bce_numpy

        return bce_numpy(logits, targets, grad, **kw)

    def tracker_register_kernels(register: Any) -> None:
        register(Kernel(term="class_weighted_bce", backend="mine", fn=fast))

    use_plugin(tracker_register_kernels=tracker_register_kernels)
    r = tracker.loss("class_weighted_bce", backend="mine")(np.zeros((4, 2), np.float32), np.ones((4, 2), np.float32))
    assert calls and set(calls[0]) == {"weight", "pos_weight", "reduction"}
    assert abs(r.loss - np.log(2.0)) < 1e-6


def test_hook_tracker_register_samplers() -> None:
    from tracker.sampling import SamplerFactory, ShardedSampler

    class Identity(ShardedSampler):
        def __init__(self, n: int, **kw: Any) -> None:
            super().__init__(**kw)
            self.n = n

        def _draw(self, rng: np.random.Generator) -> np.ndarray:
            return np.arange(self.n)

    def tracker_register_samplers(register: Any) -> None:
        register(SamplerFactory("identity", Identity, "every index in order"))

    use_plugin(tracker_register_samplers=tracker_register_samplers)
    shard = tracker.sampler("identity", n=8, rank=1, world_size=2)
    assert list(shard) == [1, 3, 5, 7]


def test_hook_tracker_register_loggers() -> None:
    seen: list[int] = []

    @dataclass(frozen=True)
    class Counting:
        name: str = "counting"

        def open(self, run: Any) -> Any:
            return types.SimpleNamespace(write=lambda b: seen.append(b.metrics.num_rows), close=lambda status: seen.append(-1))

    def tracker_register_loggers(register: Any) -> None:
        register(Counting())

    use_plugin(tracker_register_loggers=tracker_register_loggers)
    run = tracker.init("p", loggers=["counting"])
    run.log({"a": 1.0, "b": 2.0}, step=0)
    run.finish()
    assert seen == [2, -1]


def test_hook_tracker_register_detectors() -> None:
    from tracker.analysis import DetectorSpec
    from tracker.events import Event

    class Negative:
        def __init__(self, ctx: Any) -> None:
            self.key = ctx.key

        def feed(self, chunk: Any) -> list[Event]:
            bad = np.flatnonzero(chunk.values < 0)
            return [Event(step=int(chunk.steps[i]), kind="negative", key=self.key, message="negative loss") for i in bad]

        def summary(self) -> dict[str, Any]:
            return {}

    def tracker_register_detectors(register: Any) -> None:
        register(DetectorSpec("negative", "scalar", Negative))

    use_plugin(tracker_register_detectors=tracker_register_detectors)
    run = tracker.init("p")
    for s, v in enumerate([1.0, 0.5, -0.1, 0.4]):
        run.log({"loss": v}, step=s)
    run.finish()
    assert tracker.query("SELECT step FROM events WHERE kind = 'negative'")["step"].to_list() == [2]


def test_hook_tracker_register_commands() -> None:
    def tracker_register_commands(cli: click.Group) -> None:
        @cli.command("hello")
        def hello() -> None:
            click.echo("hello from a plugin")

    use_plugin(tracker_register_commands=tracker_register_commands)
    from tracker import cli as cli_mod

    group = click.Group(commands=dict(cli_mod.cli.commands))
    cli_mod._load_plugin_commands(group)
    assert CliRunner().invoke(group, ["hello"]).output == "hello from a plugin\n"


def test_hook_tracker_register_importers() -> None:
    from tracker.importer import SourceRun, make_run_id, points_table

    @dataclass(frozen=True)
    class Ramp:
        name: str = "ramp"
        help: str = "a made-up source: N points of a ramp"
        params: tuple[Any, ...] = (click.Argument(["n"], type=int),)

        def read(self, reporter: Any, n: int) -> Any:
            reporter.start("ramp", 1)
            yield SourceRun(kind="ramp", source=f"ramp:{n}", run_id=make_run_id("ramp", "r", "x"), name="r",
                            project="ramps", points=points_table(list(range(n)), ["loss"] * n,
                                                                 [float(i) for i in range(n)], [None] * n))

    def tracker_register_importers(register: Any) -> None:
        register(Ramp())

    host = use_plugin(tracker_register_importers=tracker_register_importers)
    assert host.registry("importers").owners["ramp"] == "hooked_plugin"
    from tracker import cli as cli_mod

    res = CliRunner().invoke(cli_mod.cli, ["import", "ramp", "5", "--project", "mine"])
    assert res.exit_code == 0, res.output
    assert tracker.query("SELECT project, n_points FROM run_summary").rows() == [("mine", 5)]
    assert "unchanged" in CliRunner().invoke(cli_mod.cli, ["import", "ramp", "5"]).output


def test_hook_tracker_register_panels() -> None:
    @dataclass(frozen=True)
    class Panel:
        name: str = "mine"
        title: str = "My page"

        def render(self) -> None:
            return None

    def tracker_register_panels(register: Any) -> None:
        register(Panel())

    host = use_plugin(tracker_register_panels=tracker_register_panels)
    assert host.items("panels")["mine"].title == "My page"


def test_hook_tracker_register_notifiers() -> None:
    import time

    got: list[tuple[str, dict[str, Any]]] = []

    @dataclass(frozen=True)
    class Memo:
        name: str = "memo"
        help: str = "keep messages in a list"

        def check(self, target: Any) -> None:
            return None

        def send(self, target: Any, message: dict[str, Any]) -> None:
            got.append((target.arg, message))

    def tracker_register_notifiers(register: Any) -> None:
        register(Memo())

    host = use_plugin(tracker_register_notifiers=tracker_register_notifiers)
    assert host.registry("notifiers").owners["memo"] == "hooked_plugin"
    assert host.registry("notifiers").owners["webhook"] == "notifiers"
    run = tracker.init("p", run_id="alerted", notify=["memo:ops"])
    run.log({"loss": 1.0}, step=0)
    run.event("custom", "something broke", severity="error")
    run.event("custom", "only a warning", severity="warning")  # the default rule sends errors only
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    run.finish()
    assert [(to, m["kind"], m["text"]) for to, m in got] == [("ops", "custom", "something broke")]


def test_hook_tracker_plugin_status() -> None:
    def tracker_plugin_status() -> str | None:
        return "needs a GPU: apt-get install mesa-vulkan-drivers"

    host = use_plugin(tracker_plugin_status=tracker_plugin_status)
    assert host.status("hooked_plugin") == "needs a GPU: apt-get install mesa-vulkan-drivers"
    assert host.status("store_logger") is None


def test_hook_tracker_run_start() -> None:
    started: list[tuple[str, int]] = []

    def tracker_run_start(run: Any) -> None:
        started.append((run.run_id, run.segment))

    use_plugin(tracker_run_start=tracker_run_start)
    tracker.init("p", run_id="s").finish()
    tracker.init("p", run_id="s", resume="allow").finish()
    assert started == [("s", 0), ("s", 1)]


def test_hook_tracker_run_end() -> None:
    ended: list[str] = []

    def tracker_run_end(run: Any, status: str) -> None:
        ended.append(status)

    use_plugin(tracker_run_end=tracker_run_end)
    tracker.init("p").finish()
    try:
        with tracker.init("p"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert ended == ["finished", "crashed"]


def test_a_raising_event_hook_disables_its_plugin_only() -> None:
    def tracker_run_start(run: Any) -> None:
        raise ValueError("bad plugin")

    host = use_plugin(tracker_run_start=tracker_run_start)
    run = tracker.init("p")
    run.log({"loss": 1.0}, step=0)
    run.finish()
    assert "bad plugin" in host.failures["hooked_plugin"]
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 1
