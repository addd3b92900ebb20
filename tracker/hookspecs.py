"""Every hook of the suite, as typed and documented stubs.

Rules (pluggy's and ours):

* every hook is prefixed ``tracker_``;
* hooks are called with keyword arguments only, and an implementation never gives a
  hook argument a default (pluggy would silently not pass it);
* registration hooks receive a ``register`` callback. The host validates what it is
  given, refuses a duplicate name with an error naming both plugins, and remembers
  which plugin registered what (``tracker plugins`` shows it). A plugin whose
  registration raises is reported with its name and error and disabled; it never
  takes the host down.

Plugins write ``from tracker import hookimpl``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    import click

    from tracker.protocols import RunLike

hookspec = pluggy.HookspecMarker("tracker")
hookimpl = pluggy.HookimplMarker("tracker")

Register = Callable[[Any], None]


@hookspec
def tracker_register_losses(register: Register) -> None:
    """Register loss terms.

    Fires once per plugin manager, when the registries are first built.
    Call ``register(term)`` for each :class:`tracker.losses.LossTerm`: a name, a
    reference implementation (numpy, float64 accumulation) and a parameter schema.
    Returns nothing.
    """


@hookspec
def tracker_register_kernels(register: Register) -> None:
    """Register fast implementations of a named loss term on a named backend.

    Fires once per plugin manager, after every loss term is registered. Call
    ``register(kernel)`` with a :class:`tracker.losses.Kernel` (``term``,
    ``backend`` such as ``numpy``/``torch``/``vulkan``, and the callable). The
    registry key is ``"<term>/<backend>"``. Every kernel is held to its term's
    reference by the conformance checks (:mod:`tracker.testing`). Returns nothing.
    """


@hookspec
def tracker_register_samplers(register: Register) -> None:
    """Register samplers and subset builders.

    Fires once per plugin manager. Call ``register(sampler_factory)``; the object
    has a ``name`` and builds an epoch-aware, rank-aware iterable of indices
    (COCO repeat-factor sampling, class-aware sampling, ...). Returns nothing.
    """


@hookspec
def tracker_register_loggers(register: Register) -> None:
    """Register run sinks (store, CSV, console, ...).

    Fires once per plugin manager. Call ``register(logger)`` with an object that
    has a ``name`` and an ``open(info)`` method returning a session with
    ``write(batch)`` and ``close(status)`` (see :mod:`tracker.loggers`). Each session
    is called from its own worker thread, never from the training thread; one that
    raises or hangs past the run's logger timeout is disabled with a warning naming
    it. Returns nothing.
    """


@hookspec
def tracker_register_detectors(register: Register) -> None:
    """Register online loss-analysis detectors.

    Fires once per plugin manager. Call ``register(detector)``; a detector has a
    ``name`` and turns logged values into events (NaN/inf, divergence, spikes,
    plateaus, ...). Detectors run on the run's analysis thread and offline in
    ``tracker analyze``. A :class:`tracker.analysis.DetectorSpec`'s scope says
    what its streams see: one scalar key, one per-class key, every rank,
    (``system``) every ``sys/*`` key of the run at once, or (``epochs``, offline
    only) a rank's whole few-point history. Returns nothing.
    """


@hookspec
def tracker_register_commands(cli: "click.Group") -> None:
    """Add commands to the ``tracker`` CLI.

    Fires when the CLI is built. ``cli`` is the root :class:`click.Group`; call
    ``cli.add_command(...)`` or decorate with ``@cli.command()``. Returns nothing.
    """


@hookspec
def tracker_register_importers(register: Register) -> None:
    """Register sources of history for ``tracker import``.

    Fires once per plugin manager, when ``tracker import`` is built. Call
    ``register(importer)`` with an object that has a ``name`` (the subcommand), a
    ``help`` line, ``params`` (the source's own ``click`` arguments and options) and
    ``read(reporter, **options)`` yielding :class:`tracker.importer.SourceRun`
    records. The host does the rest for every source alike: ``--project``,
    ``--dry-run``, the progress bar, the resume rule, idempotent re-imports and
    all-or-nothing writes (see :mod:`tracker.importer`). Returns nothing.
    """


@hookspec
def tracker_register_notifiers(register: Register) -> None:
    """Register notifiers: where alerts go (console, file, webhook, email, ...).

    Fires once per plugin manager, when a run or ``tracker notify`` first needs them.
    Call ``register(notifier)`` with an object that has a ``name`` (the ``NAME`` of a
    target ``NAME:ARGUMENT``), a ``help`` line, ``check(target)`` raising
    :class:`tracker.errors.ConfigError` for an argument it cannot use, and
    ``send(target, message)`` delivering one message dict (``title``, ``text``,
    ``kind``, ``severity``, ``key``, ``step``, ``run_id``, ``held_back``, ...) or
    raising. ``send`` runs on the notifier thread, never the training thread, and is
    retried with backoff when it raises (see :mod:`tracker.notify`). Returns nothing.
    """


@hookspec
def tracker_register_panels(register: Register) -> None:
    """Register extra pages for the web UI.

    Fires when the app builds its navigation. Call ``register(panel)`` with an
    object that has a ``name``, a ``title`` and a ``render()`` callable drawing the
    page with Streamlit. Returns nothing.
    """


@hookspec
def tracker_plugin_status() -> str | None:
    """Say whether this plugin can work here.

    Return ``None`` when it can, else a one-line reason naming the fix (for
    example ``"no Vulkan loader: apt-get install libvulkan1 mesa-vulkan-drivers"``).
    ``tracker plugins`` shows the reason beside the plugin.
    """


@hookspec
def tracker_run_start(run: "RunLike") -> None:
    """A run started or resumed.

    Fires in the training process, on the training thread, after the run's segment
    is opened and before ``init()`` returns. Keep it cheap. Returns nothing.
    """


@hookspec
def tracker_run_end(run: "RunLike", status: str) -> None:
    """A run ended with ``status`` (``finished``, ``crashed``, ``diverged``, ...).

    Fires in ``Run.finish()`` after the last flush. Returns nothing.
    """
