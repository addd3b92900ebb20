"""The plugin host: registration, duplicates, failures, disabling, entry points, hook docs."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path

import pluggy
import pytest

import tracker
from tracker import hookimpl, hookspecs
from tracker.errors import PluginError
from tracker.host import DEFAULT_PLUGINS, KINDS, Host, make_plugin_manager

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Item:
    name: str


def _module(name: str, **hooks: object) -> types.ModuleType:
    mod = types.ModuleType(name)
    for attr, fn in hooks.items():
        setattr(mod, attr, fn)
    return mod


def _host_with(*plugins: types.ModuleType) -> Host:
    pm = make_plugin_manager(default_plugins=(), entry_points=False)
    for p in plugins:
        pm.register(p, name=p.__name__)
    return Host(pm)


def test_default_plugins_are_registered(host: Host) -> None:
    names = {n for n, _ in host.pm.list_name_plugin()}
    assert {"store_logger", "csv_logger", "console_logger"} <= names
    assert {"store", "csv", "console"} <= set(host.items("loggers"))
    assert host.registry("loggers").owners["store"] == "store_logger"
    assert len(DEFAULT_PLUGINS) >= 3


def test_duplicate_name_names_both_plugins() -> None:
    @hookimpl
    def tracker_register_samplers(register):  # noqa: ANN001, ANN202
        register(Item("same"))

    a = _module("plugin_a", tracker_register_samplers=tracker_register_samplers)
    b = _module("plugin_b", tracker_register_samplers=tracker_register_samplers)
    host = _host_with(a, b)
    assert host.registry("samplers").owners["same"] == "plugin_a"
    assert "plugin_b" in host.failures
    assert "plugin_a" in host.failures["plugin_b"] and "plugin_b" in host.failures["plugin_b"]


def test_raising_plugin_is_disabled_not_fatal() -> None:
    @hookimpl
    def tracker_register_detectors(register):  # noqa: ANN001, ANN202
        register(Item("half"))
        raise RuntimeError("boom while registering")

    @hookimpl
    def tracker_register_loggers(register):  # noqa: ANN001, ANN202
        register(Item("fine"))

    bad = _module("bad_plugin", tracker_register_detectors=tracker_register_detectors)
    good = _module("good_plugin", tracker_register_loggers=tracker_register_loggers)
    host = _host_with(bad, good)
    assert "fine" in host.items("loggers")
    assert "half" not in host.items("detectors")  # rolled back
    assert "boom while registering" in host.failures["bad_plugin"]
    described = {d["name"]: d for d in host.describe()}
    assert "boom" in described["bad_plugin"]["status"]


def test_invalid_item_is_refused_with_its_name() -> None:
    @hookimpl
    def tracker_register_samplers(register):  # noqa: ANN001, ANN202
        register(Item("has space"))

    host = _host_with(_module("weird", tracker_register_samplers=tracker_register_samplers))
    assert host.items("samplers") == {}
    assert "'has space'" in host.failures["weird"]


def test_import_failure_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    failures: dict[str, str] = {}
    make_plugin_manager(default_plugins=("plugins.does_not_exist",), entry_points=False, failures=failures)
    assert "does_not_exist" in failures and "ModuleNotFoundError" in failures["does_not_exist"]


def test_disable_plugins_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_DISABLE_PLUGINS", "csv_logger, console_logger")
    host = Host()
    assert set(host.items("loggers")) == {"store"}


def test_misspelled_hookimpl_is_caught_by_check_pending() -> None:
    @hookimpl
    def tracker_register_lossess(register):  # noqa: ANN001, ANN202
        pass

    pm = make_plugin_manager(default_plugins=(), entry_points=False)
    pm.register(_module("typo", tracker_register_lossess=tracker_register_lossess), name="typo")
    with pytest.raises(pluggy.PluginValidationError):
        pm.check_pending()


def test_plugin_status_reason_is_listed() -> None:
    @hookimpl
    def tracker_plugin_status():  # noqa: ANN202
        return "no Vulkan loader: apt-get install libvulkan1"

    host = _host_with(_module("needs_gpu", tracker_plugin_status=tracker_plugin_status))
    described = {d["name"]: d for d in host.describe()}
    assert described["needs_gpu"]["status"].startswith("no Vulkan loader")


def test_unknown_item_error_lists_available(host: Host) -> None:
    with pytest.raises(PluginError, match=r"Unknown logger 'nope'; available: .*store"):
        host.get("loggers", "nope")


def test_every_hook_is_documented_and_prefixed() -> None:
    specs = [f for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("tracker_")]
    assert len(specs) >= 10
    for fn in specs:
        assert fn.__doc__ and len(fn.__doc__.strip()) > 40, fn.__name__
    pm = make_plugin_manager(default_plugins=(), entry_points=False)
    assert all(name.startswith("tracker_") for name in vars(pm.hook) if not name.startswith("_"))
    guide = (ROOT / "docs" / "plugins.md").read_text()  # the hook table moved there from the README
    for fn in specs:
        assert fn.__name__ in guide, f"{fn.__name__} is not documented in docs/plugins.md"


def test_registration_kinds_match_hooks() -> None:
    pm = make_plugin_manager(default_plugins=(), entry_points=False)
    for kind in KINDS:
        assert hasattr(pm.hook, f"tracker_register_{kind}")


def test_hookimpl_is_reexported() -> None:
    assert tracker.hookimpl is hookspecs.hookimpl


def test_third_party_plugin_through_entry_point(tmp_path: Path) -> None:
    """A plugin installed as a distribution with an entry point in group 'tracker'."""
    site = tmp_path / "site"
    (site / "thirdparty_plugin").mkdir(parents=True)
    (site / "thirdparty_plugin" / "__init__.py").write_text(textwrap.dedent('''
        from dataclasses import dataclass
        from tracker import hookimpl

        @dataclass(frozen=True)
        class Echo:
            name: str = "echo_sampler"

        @hookimpl
        def tracker_register_samplers(register):
            register(Echo())
    '''))
    dist = site / "thirdparty_plugin-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-plugin\nVersion: 1.2.3\n")
    (dist / "entry_points.txt").write_text("[tracker]\nthirdparty = thirdparty_plugin\n")
    code = (
        "from tracker.host import get_host; h = get_host();"
        "print(h.registry('samplers').owners['echo_sampler']);"
        "print([d['version'] for d in h.describe() if d['name']=='thirdparty'][0])"
    )
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["thirdparty", "1.2.3"]
    listing = subprocess.run(
        [sys.executable, "-m", "tracker.cli", "plugins", "--format", "json"], env=env,
        capture_output=True, text=True, timeout=120,
    )
    assert listing.returncode == 0, listing.stderr
    assert '"thirdparty"' in listing.stdout and "echo_sampler" in listing.stdout
