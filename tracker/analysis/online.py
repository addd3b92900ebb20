"""The online analyzer: detectors run on the run's background analysis thread.

Rules:

* ``make_online_analyzer(run_id=..., config=..., detectors=...)`` is called once
  per run by the flusher; it returns None (no analysis) when
  ``config["analysis"]["enabled"]`` is false, when no scalar or per-class detector
  is left, or when the analysis settings are invalid (logged; ``tracker analyze``
  reports the same error as a clean message).
* ``observe(metrics, classes)`` takes one flushed batch: ``metrics`` a
  :class:`pyarrow.Table` (step int64, key string or dictionary, value float64,
  wall_time) sorted by step within each key; ``classes`` None or a table (step,
  key, class_index, value, wall_time) holding whole ``log_classes`` rows. It
  returns the events, sorted by (step, key, kind).
* Only keys matching ``config["analysis"]["keys"]`` (default ``*loss*``) are
  analysed. Each key gets one stream per detector, built on first sight.
* The same class does the offline analysis (``strict=True``: a detector that
  raises is an error). Online, a detector that raises is logged and dropped for
  that key, never taking the flusher down.
* System detectors (scope ``system``, :mod:`tracker.analysis.system`) get one
  stream per analyzer, fed every ``sys/*`` key of a batch at once
  (:meth:`OnlineAnalyzer.feed_system`), whatever the ``keys`` patterns say.
* Twin detectors (scope ``twins``: overfitting, a zero loss against its twin) get
  one stream per analyzer, fed every analysed scalar key's chunk with its name
  (a :class:`~tracker.analysis.detectors.KeyedChunk`) after that key's own streams; they judge a validation loss
  against its train twin, whichever arrives first. Those that define ``observe``
  also get the run's metric keys (mAP, accuracy, ...), analysed or not
  (:meth:`OnlineAnalyzer.watched`): ``twin_zero_loss`` reads a validation term at 0
  beside a metric above 0 as one the validation does not compute.
* Cross-rank detectors (scope ``ranks``) do not run here: one rank's flusher sees
  only its own rank; nor do the epoch judges (scope ``epochs``), which judge a
  whole history at once (``tracker analyze``).
* Streams get the run's recorded environment (``run.json``: the GPUs), so the
  NaN hint fits the machine (:mod:`tracker.analysis.advice`).
* Given the run (``make_online_analyzer(..., run=run)``), the analyzer names
  classes as ``run.set_classes`` did, and a resumed run is warmed up on the first
  batch: the run's visible rows before the resume step (this rank) are fed
  first and their events dropped (the earlier segment reported them), so the
  detectors continue where they were and online keeps agreeing with offline. A
  store that cannot be read then only costs the warm-up (logged).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracker.analysis.classes import ClassChunk
from tracker.analysis.detectors import Chunk, DetectorSpec, KeyedChunk, StreamContext
from tracker.analysis.epochs import is_metric
from tracker.analysis.params import analysis_section, key_patterns, key_selected, merge_overrides, resolve
from tracker.errors import ConfigError, TrackerError
from tracker.events import Event

log = logging.getLogger(__name__)

RESERVED = ("enabled", "keys", "trend")
SYSTEM_PREFIX = "sys/"


def event_order(event: Event) -> tuple[int, str, str]:
    """Sort key of events: step, key, kind."""
    return (event.step, event.key or "", event.kind)


def resolve_detectors(
    detectors: Mapping[str, DetectorSpec], settings: Mapping[str, Any]
) -> dict[str, tuple[DetectorSpec, dict[str, Any]]]:
    """The enabled detectors with their parameter values; unknown names are a ConfigError."""
    unknown = sorted(set(settings) - set(detectors) - set(RESERVED))
    if unknown:
        names = ", ".join(sorted([*detectors, *RESERVED]))
        raise ConfigError(f"Unknown detector {unknown[0]!r} in the analysis settings; available: {names}")
    out: dict[str, tuple[DetectorSpec, dict[str, Any]]] = {}
    for name, spec in detectors.items():
        params = resolve(name, spec.params, settings.get(name))
        if params is not None:
            out[name] = (spec, params)
    return out


def _key_groups(table: pa.Table) -> Iterator[tuple[str, np.ndarray]]:
    """(key, row indices) for each key of ``table`` in key order (as the offline analysis feeds them: a
    ``metrics/`` key before the ``val/`` losses of its step), rows in table order."""
    col = table.column("key")
    if pa.types.is_dictionary(col.type):
        col = col.cast(pa.string())
    encoded = pc.dictionary_encode(col.combine_chunks())
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    names = encoded.dictionary.to_pylist()
    if len(names) == 1:
        yield names[0], np.arange(codes.size)
        return
    rank = np.empty(len(names), dtype=np.int64)
    rank[np.argsort(np.array(names, dtype=object), kind="stable")] = np.arange(len(names))
    codes, names = rank[codes], sorted(names)
    order = np.argsort(codes, kind="stable")
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    for part in np.split(order, bounds):
        if part.size:
            yield names[int(codes[part[0]])], part


def _column(table: pa.Table, name: str, dtype: type) -> np.ndarray:
    return np.asarray(table.column(name).to_numpy(), dtype=dtype)


class OnlineAnalyzer:
    """Per-key detector streams fed batch by batch (online) or in one go (offline)."""

    def __init__(
        self,
        detectors: Mapping[str, DetectorSpec],
        config: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        overrides: Mapping[str, Any] | None = None,
        class_names: Mapping[int, str] | None = None,
        strict: bool = False,
        environment: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_id = run_id
        self.config = dict(config or {})
        self.environment: dict[str, Any] = dict(environment or {})
        settings = merge_overrides(analysis_section(self.config), overrides)
        self.settings = settings
        self.patterns = key_patterns(settings)
        self.detectors = resolve_detectors(detectors, settings)
        self.class_names: dict[int, str] = dict(class_names or {})
        self.strict = strict
        self.streams: dict[str, dict[str, Any]] = {}
        self.class_streams: dict[str, dict[str, Any]] = {}
        self.system_streams: dict[str, Any] | None = None
        self.twin_streams: dict[str, Any] | None = None
        self._selected: dict[str, bool] = {}
        self._watched: dict[str, bool] = {}
        self._run_ref: Any = None
        self._names_seen: Any = None
        self._warm = True

    def bind_run(self, run: Any) -> None:
        """Follow ``run``: its class names, and its history if it was resumed (see module doc)."""
        self._run_ref = weakref.ref(run)
        meta = getattr(run, "meta", None)
        if isinstance(meta, Mapping) and not self.environment:
            self.environment = dict(meta)
        self._warm = getattr(run, "reason", "start") != "resume" or not getattr(run, "start_step", 0)

    def _follow_run(self) -> None:
        run = self._run_ref() if self._run_ref is not None else None
        if run is None:
            return
        names = getattr(run, "classes", None)
        if names and names is not self._names_seen:
            self._names_seen = names
            self.set_class_names(list(names))
        if not self._warm:
            self._warm = True
            self.warm_up(run.home, run.run_id, run.rank, run.start_step)

    def warm_up(self, home: Any, run_id: str, rank: int, before: int) -> None:
        """Feed the stored visible rows of ``run_id``/``rank`` with step < ``before``; drop their events."""
        try:
            from tracker.store import open_store

            store = open_store(home)
            sql = "FROM {} WHERE run_id = ? AND rank = ? AND step < ? ORDER BY key, step{}"
            metrics = store.query("SELECT key, step, value " + sql.format("curves", ""), [run_id, rank, before])
            classes = store.query(
                "SELECT key, step, class_index, value " + sql.format("class_curves", ", class_index"),
                [run_id, rank, before],
            )
        except Exception as exc:
            log.warning("online analysis of run %s starts without its history: %s", run_id, exc)
            return
        system: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for (key,), part in metrics.group_by(["key"], maintain_order=True):
            self.feed(str(key), part["step"].to_numpy(), part["value"].to_numpy())
            if str(key).startswith(SYSTEM_PREFIX):
                system[str(key)] = (part["step"].to_numpy(), part["value"].to_numpy())
        self.feed_system(system)
        for (key,), part in classes.group_by(["key"], maintain_order=True):
            index = part["class_index"].to_numpy().astype(np.int64)
            steps, matrix = pivot_classes(part["step"].to_numpy(), index, part["value"].to_numpy())
            self.feed_classes(str(key), steps, matrix)

    @property
    def useful(self) -> bool:
        """Whether any scalar or per-class detector is enabled."""
        return any(spec.scope in ("scalar", "classes", "system", "twins") for spec, _ in self.detectors.values())

    def selected(self, key: str) -> bool:
        """Whether ``key`` is analysed."""
        hit = self._selected.get(key)
        if hit is None:
            hit = self._selected[key] = key_selected(key, self.patterns)
        return hit

    def watched(self, key: str) -> bool:
        """Whether ``key`` is a metric that is not analysed but shown to the twin detectors that observe metrics."""
        hit = self._watched.get(key)
        if hit is None:
            hit = self._watched[key] = not key.startswith(SYSTEM_PREFIX) and not self.selected(key) and is_metric(key)
        return hit

    def set_class_names(self, names: list[str] | Mapping[int, str]) -> None:
        """Name the class indices in later events (``run.set_classes`` order)."""
        mapping = dict(enumerate(names)) if isinstance(names, (list, tuple)) else dict(names)
        self.class_names.clear()
        self.class_names.update({int(k): str(v) for k, v in mapping.items()})

    def _build(self, key: str, scope: str) -> dict[str, Any]:
        streams: dict[str, Any] = {}
        for name, (spec, params) in self.detectors.items():
            if spec.scope == scope:
                ctx = StreamContext(
                    key=key, params=dict(params), config=self.config, class_names=self.class_names,
                    environment=self.environment,
                )
                streams[name] = spec.factory(ctx)
        return streams

    def _feed_streams(self, table: dict[str, Any], key: str, chunk: Any, method: str = "feed") -> list[Event]:
        events: list[Event] = []
        for name, stream in list(table.items()):
            if method != "feed" and not hasattr(stream, method):
                continue
            try:
                events.extend(getattr(stream, method)(chunk))
            except Exception as exc:
                if self.strict:
                    raise
                log.warning("detector %s dropped for key %s: %s: %s", name, key, type(exc).__name__, exc)
                del table[name]
        return events

    def feed(self, key: str, steps: np.ndarray, values: np.ndarray) -> list[Event]:
        """Feed the next points of scalar ``key`` (in step order); returns the events."""
        if not self.selected(key):
            if not self.watched(key):
                return []
            if self.twin_streams is None:
                self.twin_streams = self._build("", "twins")
            chunk = Chunk(np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64))
            return self._feed_streams(self.twin_streams, key, KeyedChunk(key, chunk), "observe")
        streams = self.streams.get(key)
        if streams is None:
            streams = self.streams[key] = self._build(key, "scalar")
        chunk = Chunk(np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64))
        events = self._feed_streams(streams, key, chunk)
        if self.twin_streams is None:
            self.twin_streams = self._build("", "twins")
        if self.twin_streams:
            events.extend(self._feed_streams(self.twin_streams, key, KeyedChunk(key, chunk)))
        return events

    def feed_classes(self, key: str, steps: np.ndarray, matrix: np.ndarray) -> list[Event]:
        """Feed the next rows of per-class ``key``: one row per step, one column per class index."""
        if not self.selected(key):
            return []
        streams = self.class_streams.get(key)
        if streams is None:
            streams = self.class_streams[key] = self._build(key, "classes")
        return self._feed_streams(streams, key, ClassChunk(np.asarray(steps, dtype=np.int64), matrix))

    def feed_system(self, series: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> list[Event]:
        """Feed the next points of the ``sys/*`` keys (key -> (steps, values), each in step order)."""
        if not series:
            return []
        if self.system_streams is None:
            self.system_streams = self._build(SYSTEM_PREFIX, "system")
        if not self.system_streams:
            return []
        from tracker.analysis.system import SystemChunk

        chunk = SystemChunk({
            key: Chunk(np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64)) for key, (s, v) in series.items()
        })
        return self._feed_streams(self.system_streams, SYSTEM_PREFIX, chunk)

    def observe(self, metrics: pa.Table | None, classes: pa.Table | None = None) -> list[Event]:
        """Run the detectors over one flushed batch; returns the new events."""
        if self._run_ref is not None:
            self._follow_run()
        events: list[Event] = []
        if metrics is not None and metrics.num_rows:
            steps = _column(metrics, "step", np.int64)
            values = _column(metrics, "value", np.float64)
            system: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            for key, rows in _key_groups(metrics):
                is_system = key.startswith(SYSTEM_PREFIX)
                fed = self.selected(key) or self.watched(key)
                if fed or is_system:
                    s, v = steps[rows], values[rows]
                    if s.size > 1 and np.any(s[1:] < s[:-1]):
                        order = np.argsort(s, kind="stable")
                        s, v = s[order], v[order]
                    if is_system:
                        system[key] = (s, v)
                    if fed:
                        events.extend(self.feed(key, s, v))
            events.extend(self.feed_system(system))
        if classes is not None and classes.num_rows:
            steps = _column(classes, "step", np.int64)
            index = _column(classes, "class_index", np.int64)
            values = _column(classes, "value", np.float64)
            for key, rows in _key_groups(classes):
                if self.selected(key):
                    row_steps, matrix = pivot_classes(steps[rows], index[rows], values[rows])
                    events.extend(self.feed_classes(key, row_steps, matrix))
        events.sort(key=event_order)
        return events


def pivot_classes(steps: np.ndarray, index: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Long (step, class_index, value) rows to (unique steps, matrix[step row, class index])."""
    if np.any(index < 0):
        raise ConfigError(f"class_index {int(index.min())} is negative; class indices start at 0")
    row_steps, rows = np.unique(steps, return_inverse=True)
    width = int(index.max()) + 1 if index.size else 0
    matrix = np.full((row_steps.size, width), np.nan)
    matrix[rows, index] = values
    return row_steps, matrix


def make_online_analyzer(
    run_id: str | None = None,
    config: Mapping[str, Any] | None = None,
    *,
    detectors: Mapping[str, DetectorSpec],
    class_names: list[str] | None = None,
    run: Any = None,
) -> OnlineAnalyzer | None:
    """The analyzer a run's flusher feeds, or None when the run opts out or nothing is enabled.

    ``detectors`` are the registered ones (the caller asks its host). Pass ``run`` to
    name classes as the run does and to warm up a resumed run.
    """
    settings = (config or {}).get("analysis")
    if settings is False or isinstance(settings, Mapping) and settings.get("enabled", True) is False:
        return None
    try:
        analyzer = OnlineAnalyzer(detectors, config=config, run_id=run_id)
    except TrackerError as exc:
        log.warning("online analysis of run %s is off: %s", run_id, exc)
        return None
    if class_names:
        analyzer.set_class_names(list(class_names))
    if run is not None:
        analyzer.bind_run(run)
    return analyzer if analyzer.useful else None
