"""The command listing of ``tracker --help``, kept so that the help loads no command.

The listing needs every top-level command's help text, and the plugins' commands
come from the plugin host (``tracker_register_commands``), whose load imports every
plugin module and, through them, numpy, polars, pyarrow and the analysis package
(about 0.3 s). So the listing is built the usual way once, by loading every command,
and kept as a small JSON file in the user's cache folder (``$XDG_CACHE_HOME/tracker``,
default ``~/.cache/tracker``). A later ``tracker --help`` reads it and imports no
command module and no plugin.

A kept listing is used only while nothing it was built from has changed: the
interpreter, ``sys.path`` and ``TRACKER_DISABLE_PLUGINS`` (these name the file), the
modification time of every ``sys.path`` folder (installing or removing a package, and
so an entry point, changes its folder), and the size and modification time of every
file that defined a listed command or a registered plugin (tracker's CLI modules, the
plugin host, each plugin's module). Anything else builds it again; a plugin that
failed to load is reported again from the kept listing, as when it was built. A
cache folder that cannot be written means no cache, never an error. Only the help
listing reads it: running a command always loads that command.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from tracker.cli import LazyGroup

FORMAT = 1  # bump when the file's layout changes
KEPT_FILES = 16  # listing files kept per cache folder (one per interpreter, sys.path and plugin setting)
ENTRY_FIELDS = ("help", "short_help", "hidden", "deprecated")  # what click's listing reads of a command
_ALWAYS = ("tracker.cli", "tracker.host", "tracker.hookspecs", __name__)  # their files are always checked


def cache_dir() -> Path:
    """The folder of the kept listings: ``$XDG_CACHE_HOME/tracker``, default ``~/.cache/tracker``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tracker"


def identity() -> dict[str, Any]:
    """What names a kept listing: the interpreter, ``sys.path`` and the disabled plugins."""
    return {
        "format": FORMAT,
        "python": sys.executable,
        "path": list(sys.path),
        "disabled": os.environ.get("TRACKER_DISABLE_PLUGINS", ""),
    }


def cache_file(ident: dict[str, Any]) -> Path:
    """The file of the listing kept for ``ident``."""
    digest = zlib.crc32(json.dumps(ident, sort_keys=True).encode())
    return cache_dir() / f"commands-{digest:08x}.json"


def _stamp(path: str) -> list[int] | None:
    try:
        st = os.stat(path or ".")
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def _module_file(name: str | None) -> str | None:
    module = sys.modules.get(name or "")
    return getattr(module, "__file__", None)


def _spec_file(modname: str) -> str | None:
    from importlib.util import find_spec

    try:
        spec = find_spec(modname)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.has_location else None


def plugin_modules() -> list[str]:
    """The modules the plugin host loads: the built-in plugins and the entry points' modules."""
    import importlib.metadata as md

    from tracker.host import DEFAULT_PLUGINS, ENTRY_POINT_GROUP

    return [*DEFAULT_PLUGINS, *(ep.module for ep in md.entry_points(group=ENTRY_POINT_GROUP))]


def source_files(commands: dict[str, click.Command], plugins: list[Any], modules: list[str]) -> list[str]:
    """The files whose change may change the listing: the CLI's modules, each plugin's
    module (also of one that failed to load) and the module of each command's callback."""
    names = [*_ALWAYS, *(m for m in sys.modules if m.startswith("tracker.commands."))]
    files = [_module_file(n) for n in names]
    files.extend(_module_file(m) or _spec_file(m) for m in modules)
    for plugin in plugins:
        files.append(getattr(plugin, "__file__", None) or _module_file(type(plugin).__module__))
    for cmd in commands.values():
        owner = cmd.callback if cmd.callback is not None else type(cmd)
        files.append(_module_file(getattr(owner, "__module__", None)))
    return sorted({f for f in files if f})


def record(ident: dict[str, Any], commands: dict[str, click.Command], plugins: list[Any], modules: list[str],
           failures: dict[str, str]) -> dict[str, Any] | None:
    """The listing to keep, or None when it cannot be kept faithfully (a command whose class
    computes its own short help)."""
    if any(type(c).get_short_help_str is not click.Command.get_short_help_str for c in commands.values()):
        return None
    return {
        "identity": ident,
        "dirs": {p: _stamp(p) for p in ident["path"]},
        "files": {f: _stamp(f) for f in source_files(commands, plugins, modules)},
        "commands": {name: {k: getattr(c, k) for k in ENTRY_FIELDS} for name, c in commands.items()},
        "failures": failures,
    }


def is_fresh(kept: dict[str, Any], ident: dict[str, Any]) -> bool:
    """True when nothing ``kept`` was built from has changed since."""
    if kept.get("identity") != ident:
        return False
    stamps = [*kept.get("dirs", {}).items(), *kept.get("files", {}).items()]
    return all(_stamp(path) == stamp for path, stamp in stamps)


def read(path: Path) -> dict[str, Any] | None:
    """The listing kept in ``path``, or None (missing, unreadable or not of this format)."""
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) and isinstance(kept.get("commands"), dict) else None


def write(path: Path, kept: dict[str, Any]) -> None:
    """Keep ``kept`` in ``path`` (atomically) and prune old listings; errors are ignored."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept), encoding="utf-8")
        os.replace(tmp, path)
        kept_files = sorted(path.parent.glob("commands-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept_files[KEPT_FILES:]:
            old.unlink()
    except OSError:
        pass


def stub(name: str, entry: dict[str, Any]) -> click.Command:
    """A command that lists like the one ``entry`` was taken from (it is never run)."""
    return click.Command(name, **{k: entry.get(k) for k in ("help", "short_help")},
                         hidden=bool(entry.get("hidden")), deprecated=entry.get("deprecated") or False)


def _report(failures: dict[str, str]) -> None:
    """The warnings the plugin host gave when the kept listing was built."""
    if failures:
        import logging

        log = logging.getLogger("tracker.host")
        for name, reason in failures.items():
            log.warning("plugin %s disabled: %s", name, reason)


def listing(group: LazyGroup) -> dict[str, click.Command]:
    """The top-level commands of ``group`` for its help: kept ones while fresh, else loaded.

    A process whose plugin host is already built (a test's own host, a command that used
    it) lists the commands it has, and keeps nothing.
    """
    host_module = sys.modules.get("tracker.host")
    if group.plugins_loaded or getattr(host_module, "_HOST", None) is not None:
        return group.load_all()
    ident = identity()
    path = cache_file(ident)
    kept = read(path)
    if kept is not None and is_fresh(kept, ident):
        _report(kept.get("failures") or {})
        return {name: stub(name, entry) for name, entry in kept["commands"].items()}
    commands = group.load_all()
    from tracker.host import get_host

    host = get_host()
    new = record(ident, commands, list(host.pm.get_plugins()), plugin_modules(), dict(host.failures))
    if new is not None:
        write(path, new)
    return commands
