"""The ``tracker`` command line.

Core commands live in :mod:`tracker.commands` (one module per concern, each with a
``register(cli)`` function); plugins add theirs through ``tracker_register_commands``.
Errors surface as one clear line (``click.ClickException``), never a traceback.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tracker")
def cli() -> None:
    """Experiment tracker and loss analysis for detectors trained on imbalanced data."""


def _load_core_commands(group: click.Group) -> None:
    import tracker.commands as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"tracker.commands.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(group)


def _load_plugin_commands(group: click.Group) -> None:
    from tracker.host import get_host

    host = get_host()
    for impl in host.pm.hook.tracker_register_commands.get_hookimpls():
        try:
            impl.function(cli=group)
        except Exception as exc:
            host.disable(impl.plugin_name, f"tracker_register_commands raised {type(exc).__name__}: {exc}")


_BUILT = False


def build_cli() -> click.Group:
    """The root group with core and plugin commands added (once per process)."""
    global _BUILT
    if not _BUILT:
        _BUILT = True
        _load_core_commands(cli)
        _load_plugin_commands(cli)
    return cli


def main(argv: list[str] | None = None) -> None:
    build_cli()
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="tracker")


if __name__ == "__main__":  # python -m tracker.cli
    main()
