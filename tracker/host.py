"""The plugin host: one pluggy manager, registries filled through ``register`` callbacks.

``make_plugin_manager()`` registers ``DEFAULT_PLUGINS`` (plain modules of
``plugins/``, registered by name so ``tracker/`` never imports them at import time),
then the installed entry points of group ``tracker``, honours
``TRACKER_DISABLE_PLUGINS=a,b`` and ends with ``check_pending()``.

``Host`` calls each plugin's registration hooks one plugin at a time, so it knows
who registered what; a plugin that raises while loading or registering is recorded
in ``Host.failures`` with its error and unregistered, never taking the host down.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pluggy

from tracker import hookspecs
from tracker.errors import PluginError

log = logging.getLogger(__name__)

DEFAULT_PLUGINS: tuple[str, ...] = (
    "plugins.store_logger",
    "plugins.csv_logger",
    "plugins.console_logger",
    "plugins.losses",
    "plugins.ssl_losses",
    "plugins.coco",
    "plugins.detectors",
    "plugins.vulkan_exec",
    "plugins.importers",
    "plugins.system",
    "plugins.notifiers",
)

ENTRY_POINT_GROUP = "tracker"
KINDS: tuple[str, ...] = ("losses", "kernels", "samplers", "loggers", "detectors", "panels", "importers", "notifiers")
SINGULAR: dict[str, str] = {
    "losses": "loss term",
    "kernels": "kernel",
    "samplers": "sampler",
    "loggers": "logger",
    "detectors": "detector",
    "panels": "panel",
    "importers": "importer",
    "notifiers": "notifier",
}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")


def _key_of(kind: str, item: Any) -> str:
    if kind == "kernels":
        term, backend = getattr(item, "term", None), getattr(item, "backend", None)
        if not isinstance(term, str) or not isinstance(backend, str):
            raise PluginError(
                f"kernel {item!r} needs string attributes 'term' and 'backend'; "
                f"got term={term!r}, backend={backend!r}"
            )
        return f"{term}/{backend}"
    name = getattr(item, "name", None)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise PluginError(
            f"{SINGULAR.get(kind, kind)} {item!r} needs a 'name' attribute of letters, digits, '_', '.', '-'; "
            f"got {name!r}"
        )
    return name


@dataclass
class Registry:
    """Items of one kind, keyed by name, each remembered with the plugin that gave it."""

    kind: str
    items: dict[str, Any] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)

    def add(self, item: Any, plugin: str) -> None:
        key = _key_of(self.kind, item)
        validate = getattr(item, "validate", None)
        if callable(validate):
            validate()
        if key in self.items:
            raise PluginError(
                f"duplicate {SINGULAR.get(self.kind, self.kind)} {key!r}: registered by plugin {self.owners[key]!r} "
                f"and again by plugin {plugin!r}; disable one with TRACKER_DISABLE_PLUGINS={plugin}"
            )
        self.items[key] = item
        self.owners[key] = plugin

    def get(self, key: str) -> Any:
        try:
            return self.items[key]
        except KeyError:
            available = ", ".join(sorted(self.items)) or "none"
            noun = "loss" if self.kind == "losses" else SINGULAR.get(self.kind, self.kind)
            raise PluginError(f"Unknown {noun} {key!r}; available: {available}") from None

    def by_plugin(self, plugin: str) -> list[str]:
        return sorted(k for k, p in self.owners.items() if p == plugin)


def disabled_plugins() -> set[str]:
    raw = os.environ.get("TRACKER_DISABLE_PLUGINS", "")
    return {p.strip() for p in raw.split(",") if p.strip()}


def make_plugin_manager(
    default_plugins: tuple[str, ...] = DEFAULT_PLUGINS,
    entry_points: bool = True,
    failures: dict[str, str] | None = None,
) -> pluggy.PluginManager:
    """Build the plugin manager: defaults, then entry points, minus disabled; check_pending().

    A plugin that fails to import is recorded in ``failures`` (name -> error) and skipped.
    """
    failures = {} if failures is None else failures
    pm = pluggy.PluginManager("tracker")
    pm.add_hookspecs(hookspecs)
    disabled = disabled_plugins()
    for modname in default_plugins:
        short = modname.rsplit(".", 1)[-1]
        if modname in disabled or short in disabled:
            pm.set_blocked(short)
            continue
        try:
            mod = importlib.import_module(modname)
        except Exception as exc:  # a broken plugin never takes the host down
            failures[short] = f"import failed: {type(exc).__name__}: {exc}"
            log.warning("plugin %s disabled: %s", short, failures[short])
            continue
        pm.register(mod, name=short)
    if entry_points:
        for ep in md.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in disabled or pm.is_registered(ep.name) or pm.get_plugin(ep.name):
                continue
            if ep.dist is not None:  # known even when loading fails
                _DIST_VERSIONS[ep.name] = ep.dist.version
            try:
                pm.register(ep.load(), name=ep.name)
            except Exception as exc:
                failures[ep.name] = f"load failed: {type(exc).__name__}: {exc}"
                log.warning("plugin %s disabled: %s", ep.name, failures[ep.name])
    _check_pending(pm, failures)
    return pm


def _check_pending(pm: pluggy.PluginManager, failures: dict[str, str]) -> None:
    """``pm.check_pending()``, but a plugin with a misspelled hook is disabled, not fatal."""
    while True:
        try:
            pm.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            name = pm.get_name(exc.plugin) or str(exc.plugin)
            failures[name] = f"invalid hook implementation: {exc}"
            log.warning("plugin %s disabled: %s", name, failures[name])
            pm.unregister(exc.plugin)


_DIST_VERSIONS: dict[str, str] = {}


def _plugin_version(pm: pluggy.PluginManager, name: str) -> str:
    """The version of plugin ``name``: its distribution's, its ``__version__``, else tracker's (built-ins)."""
    if name in _DIST_VERSIONS:
        return _DIST_VERSIONS[name]
    plugin = pm.get_plugin(name)
    if plugin is not None:
        for dist_plugin, dist in pm.list_plugin_distinfo():
            if dist_plugin is plugin:
                return dist.version
        version = getattr(plugin, "__version__", None)
        if version:
            return str(version)
    try:
        return md.version("tracker")
    except md.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0+unknown"


class Host:
    """A plugin manager plus the registries its plugins filled."""

    def __init__(self, pm: pluggy.PluginManager | None = None, failures: dict[str, str] | None = None):
        self.failures: dict[str, str] = dict(failures or {})
        self.versions: dict[str, str] = {}  # versions of disabled plugins, read before unregistering
        self.pm = pm if pm is not None else make_plugin_manager(failures=self.failures)
        self.registries: dict[str, Registry] = {k: Registry(k) for k in KINDS}
        self._lock = threading.RLock()
        self._filled: set[str] = set()

    # -- registration ------------------------------------------------------------
    def _fill(self, kinds: tuple[str, ...] = KINDS) -> None:
        """Call the registration hooks of ``kinds`` not yet filled (each kind on first use,
        so a command that needs detectors never probes a Vulkan device for kernels)."""
        with self._lock:
            for kind in kinds:
                if kind in self._filled:
                    continue
                self._filled.add(kind)
                if kind == "kernels":
                    self._fill(("losses",))  # kernels are registered after every term
                hook = getattr(self.pm.hook, f"tracker_register_{kind}")
                for impl in hook.get_hookimpls():  # registration order
                    if self.pm.get_name(impl.plugin) in self.failures:
                        continue
                    self._call_register(kind, impl)

    def _call_register(self, kind: str, impl: pluggy.HookImpl) -> None:
        name = impl.plugin_name
        registry = self.registries[kind]
        added: list[str] = []

        def register(item: Any) -> None:
            registry.add(item, name)
            added.append(_key_of(kind, item))

        try:
            impl.function(register=register)
        except Exception as exc:
            for key in added:  # roll back what this plugin registered
                registry.items.pop(key, None)
                registry.owners.pop(key, None)
            self.disable(name, f"tracker_register_{kind} raised {type(exc).__name__}: {exc}")

    def disable(self, name: str, reason: str) -> None:
        """Record ``reason`` for plugin ``name``, drop its registrations and unregister it."""
        self.failures[name] = reason
        log.warning("plugin %s disabled: %s", name, reason)
        for registry in self.registries.values():
            for key in registry.by_plugin(name):
                registry.items.pop(key, None)
                registry.owners.pop(key, None)
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.versions.setdefault(name, _plugin_version(self.pm, name))
            self.pm.unregister(plugin)

    def fill_all(self) -> dict[str, str]:
        """Run every registration hook now; return the plugins that failed to load or register."""
        self._fill()
        return dict(self.failures)

    def version(self, name: str) -> str:
        """Plugin ``name``'s version, also for a plugin disabled because it failed."""
        return self.versions.get(name) or _plugin_version(self.pm, name)

    # -- lookups -----------------------------------------------------------------
    def registry(self, kind: str) -> Registry:
        if kind not in self.registries:
            raise PluginError(f"Unknown registry kind {kind!r}; available: {', '.join(KINDS)}")
        self._fill((kind,))
        return self.registries[kind]

    def items(self, kind: str) -> dict[str, Any]:
        return dict(self.registry(kind).items)

    def get(self, kind: str, key: str) -> Any:
        return self.registry(kind).get(key)

    def owner(self, kind: str, key: str, item: Any = None) -> str | None:
        """The plugin that registered ``key`` of ``kind`` (None if none did, or, given ``item``,
        if what it registered is another object)."""
        registry = self.registry(kind)
        if key not in registry.items or (item is not None and registry.items[key] is not item):
            return None
        return registry.owners[key]

    def status(self, name: str) -> str | None:
        """None when plugin ``name`` is usable, else why not."""
        if name in self.failures:
            return self.failures[name]
        plugin = self.pm.get_plugin(name)
        fn = getattr(plugin, "tracker_plugin_status", None)
        if fn is None:
            return None
        try:
            return fn()
        except Exception as exc:
            return f"tracker_plugin_status raised {type(exc).__name__}: {exc}"

    def describe(self) -> Iterator[dict[str, Any]]:
        """One record per plugin: name, version, what it registered, and why it is unavailable."""
        self._fill()
        commands = self._commands_by_plugin()
        names = [n for n, _ in self.pm.list_name_plugin() if n and not self.pm.is_blocked(n)]
        for name in sorted(set(names) | set(self.failures)):
            registered = {
                kind: self.registries[kind].by_plugin(name)
                for kind in KINDS
                if self.registries[kind].by_plugin(name)
            }
            if commands.get(name):
                registered["commands"] = commands[name]
            yield {
                "name": name,
                "version": self.version(name),
                "registered": registered,
                "status": self.status(name),
            }

    def _commands_by_plugin(self) -> dict[str, list[str]]:
        """The CLI commands each plugin adds (its hook run on a scratch group)."""
        import click

        out: dict[str, list[str]] = {}
        for impl in self.pm.hook.tracker_register_commands.get_hookimpls():
            scratch = click.Group()
            try:
                impl.function(cli=scratch)
            except Exception:  # reported when the real CLI is built
                continue
            out[impl.plugin_name] = sorted(scratch.commands)
        return out


_HOST: Host | None = None
_HOST_LOCK = threading.Lock()


def get_host() -> Host:
    """The process-wide host, built on first use."""
    global _HOST
    with _HOST_LOCK:
        if _HOST is None:
            _HOST = Host()
        return _HOST


def set_host(host: Host | None) -> Host | None:
    """Replace the process-wide host (tests give each test a fresh one). Returns the old one."""
    global _HOST
    with _HOST_LOCK:
        old, _HOST = _HOST, host
        return old


def call_hook(name: str, **kwargs: Any) -> None:
    """Call an event hook on every plugin; a plugin that raises is disabled and reported."""
    host = get_host()
    hook = getattr(host.pm.hook, name)
    for impl in hook.get_hookimpls():
        try:
            impl.function(**{k: kwargs[k] for k in impl.argnames})
        except Exception as exc:
            host.disable(impl.plugin_name, f"{name} raised {type(exc).__name__}: {exc}")


def each_item(kind: str) -> dict[str, Any]:
    """Shortcut: the registered items of ``kind`` of the process-wide host."""
    return get_host().items(kind)


Factory = Callable[..., Any]
