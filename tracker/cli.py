"""The ``tracker`` command line.

Core commands live in :mod:`tracker.commands` (one module per concern, each with a
``register(cli)`` function); plugins add theirs through ``tracker_register_commands``.
Errors surface as one clear line (``click.ClickException``), never a traceback.

The CLI starts at once: a command's module is imported only when that command runs
(click's lazy-group pattern), the command modules load polars, DuckDB and the store
only inside the functions that use them, and ``tracker --help`` lists the commands from
a kept listing (:mod:`tracker.commands._listing`) instead of loading every command and
the plugin host.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable

import click

from tracker.errors import TrackerError


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a TrackerError raised by a command into a one-line click error."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TrackerError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


# Core commands by name -> the tracker.commands module whose register() adds them. They
# are imported on first use, so `tracker analyze` does not pay for `tracker coco` or the
# plugins' imports; a test checks this map against what the modules register.
CORE_COMMANDS: dict[str, str] = {
    "advise": "advise",
    "analyze": "analyze",
    "check-plugins": "losses",
    "demo": "demo",
    "doctor": "doctor",
    "export": "runs",
    "import": "importing",
    "ingest": "runs",
    "lake": "lake",
    "notify": "notify",
    "plugins": "plugins",
    "runs": "runs",
    "sql": "sql",
    "ui": "ui",
    "weights": "losses",
}


class LazyGroup(click.Group):
    """A group that imports a command's module only when that command is used.

    ``--help`` lists the commands from :func:`tracker.commands._listing.listing`, which
    loads them only when its kept listing is missing or out of date.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loaded: set[str] = set()
        self._plugins_host: object | None = None  # the plugin host whose commands were added
        self._plugin_commands: set[str] = set()

    @property
    def plugins_loaded(self) -> bool:
        """True once the plugins' commands were added."""
        return self._plugins_host is not None

    def _load_module(self, module: str) -> None:
        if module not in self._loaded:
            self._loaded.add(module)
            importlib.import_module(f"tracker.commands.{module}").register(self)

    def load_plugins(self) -> None:
        """Add the commands of the process's plugin host; those of an earlier host (a test
        that set its own) are taken out first."""
        from tracker.host import get_host

        host = get_host()
        if host is self._plugins_host:
            return
        for name in self._plugin_commands:
            self.commands.pop(name, None)
            self._loaded.discard(CORE_COMMANDS.get(name, ""))  # a core command a plugin replaced comes back
        before = dict(self.commands)
        self._plugins_host = host
        _load_plugin_commands(self)
        self._plugin_commands = {n for n, c in self.commands.items() if before.get(n) is not c}

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in CORE_COMMANDS:
            self._load_module(CORE_COMMANDS[cmd_name])
        else:
            self.load_plugins()
        return super().get_command(ctx, cmd_name)

    def load_all(self) -> dict[str, click.Command]:
        """Every core and plugin command, loaded."""
        for module in sorted(set(CORE_COMMANDS.values())):
            self._load_module(module)
        self.load_plugins()
        return dict(self.commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self.load_all()
        return super().list_commands(ctx)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The help's command list, as click writes it, from the listing (see the module doc)."""
        from tracker.commands._listing import listing

        click.Group.format_commands(click.Group(self.name, commands=listing(self)), ctx, formatter)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tracker")
@click.option("--store", "store", default=None, metavar="SETTING",
              help="The store: 'ducklake:postgres:<libpq string>' for a lake (default: $TRACKER_STORE, "
                   "else the local DuckDB file).")
@click.option("--data-path", default=None, metavar="DIR",
              help="The lake's data directory (default: $TRACKER_DATA_PATH).")
@friendly
def cli(store: str | None, data_path: str | None) -> None:
    """Experiment tracker and loss analysis for detectors trained on imbalanced data."""
    if store is not None or data_path is not None:
        from tracker.store.settings import use

        use(store, data_path)


def core_command_modules() -> list[str]:
    """Every module of tracker.commands that registers commands."""
    import pkgutil

    import tracker.commands as pkg

    return sorted(
        info.name for info in pkgutil.iter_modules(pkg.__path__)
        if hasattr(importlib.import_module(f"tracker.commands.{info.name}"), "register")
    )


def _load_plugin_commands(group: click.Group) -> None:
    from tracker.host import get_host

    host = get_host()
    for impl in host.pm.hook.tracker_register_commands.get_hookimpls():
        try:
            impl.function(cli=group)
        except Exception as exc:
            host.disable(impl.plugin_name, f"tracker_register_commands raised {type(exc).__name__}: {exc}")


def build_cli() -> click.Group:
    """The root group; core and plugin commands are added on first use."""
    return cli


def main(argv: list[str] | None = None) -> None:
    build_cli()
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="tracker")


if __name__ == "__main__":  # python -m tracker.cli
    main()
