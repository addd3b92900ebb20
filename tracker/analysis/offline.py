"""Offline analysis: ``tracker.analyze(run_id)`` and ``tracker analyze RUN``.

Rules:

* The run's visible rows are read from the ``curves`` and ``class_curves`` views
  (rows hidden by a resume are not analysed), one query per table, and fed to the
  same :class:`~tracker.analysis.online.OnlineAnalyzer` the flusher uses, one
  analyzer per rank, each key in one chunk. Detector streams give the same events
  whatever the chunking, so offline and online agree on the same rows.
* Settings: the run's ``config["analysis"]``, then the call's overrides
  (``analyze(run, divergence={"factor": 2}, keys=["loss/*"])``). ``key=`` analyses
  that one key (any name, even one the key patterns would skip).
* System detectors (scope ``system``) get every ``sys/*`` key of a rank in one
  chunk (only when the whole run is analysed, or ``key`` is a ``sys/*`` key).
* Rank disagreement runs here, over every rank's ``rng/fingerprint`` and
  ``rng/epoch`` rows. Its events belong to rank 0.
* A run id may be given by a unique prefix.
* Epoch judges (scope ``epochs``, :mod:`tracker.analysis.epoch_judges`) get, per
  rank, every key with at most :data:`~tracker.analysis.epochs.MAX_POINTS` points
  (losses, metrics and learning rates alike; only when the whole run is analysed).
  Their events are the run's *findings* (:attr:`Analysis.findings`), with the first
  NaN/inf and divergence event of each key from the streaming detectors (an epoch
  divergence of a key the streaming detector already flagged is left out). Findings
  are not in :attr:`Analysis.events`, which stay what the run's flusher finds online;
  ``save_events`` stores both.
* Detectors see the run's recorded environment (``run.json`` in the spool: the GPUs),
  so the NaN hint fits the machine; an imported run records none.
"""

from __future__ import annotations

import glob
import json
from typing import Any, Mapping

import numpy as np
import polars as pl

from tracker.analysis.online import SYSTEM_PREFIX, OnlineAnalyzer, event_order, pivot_classes
from tracker.analysis.params import analysis_section, merge_overrides, resolve
from tracker.analysis.ranks import EPOCH_KEY, FINGERPRINT_KEY
from tracker.analysis.report import (
    TREND_PARAMS,
    Analysis,
    EventRecord,
    KeyReport,
    StagnantClass,
    StagnantReport,
    verdict,
)
from tracker.analysis.advice import ADVICE, precision_hint
from tracker.analysis.detectors import DetectorSpec, StreamContext
from tracker.analysis.epoch_run import ENVIRONMENT_KEYS, epoch_findings
from tracker.errors import ConfigError, RunError

FINDING_KINDS = ("non_finite", "divergence")
from tracker.events import Event


def _store(home: Any) -> Any:
    from tracker.store import open_store

    return open_store(home)


def find_run(store: Any, run_id: str) -> dict[str, Any]:
    """The run's row (run_id, project, name, status, config); a unique prefix will do."""
    df = store.query(
        "SELECT run_id, project, name, status, config, tags FROM runs WHERE starts_with(run_id, ?) ORDER BY run_id",
        [run_id],
    )
    exact = df.filter(pl.col("run_id") == run_id)
    if exact.height:
        df = exact
    if df.height != 1:
        recent = store.query("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 10")["run_id"].to_list()
        what = "is ambiguous" if df.height else "is unknown"
        raise RunError(f"Run {run_id!r} {what}; recent runs: {', '.join(recent) or 'none'}")
    row = df.row(0, named=True)
    config = row.get("config")
    row["config"] = json.loads(config) if isinstance(config, str) else dict(config or {})
    return row


def _groups(df: pl.DataFrame, keys: list[str]) -> list[tuple[int, str, slice]]:
    """(rank, key, row slice) of a frame sorted by rank and key code ``k`` (1-based in ``keys``)."""
    if df.height == 0:
        return []
    rank = df["rank"].to_numpy()
    code = df["k"].to_numpy()
    cuts = np.flatnonzero((np.diff(rank) != 0) | (np.diff(code) != 0)) + 1
    bounds = [0, *cuts.tolist(), df.height]
    return [(int(rank[a]), keys[int(code[a]) - 1], slice(a, b)) for a, b in zip(bounds, bounds[1:])]


def _fetch(store: Any, table: str, run_id: str, keys: list[str], extra: str = "") -> pl.DataFrame:
    """Visible rows of ``keys``, sorted by rank, key and step (keys ordered by an integer code: fast)."""
    cols = f"rank, list_position(?, key)::INTEGER AS k, step, {extra}value"
    order = "rank, k, step" + (", class_index" if extra else "")
    return store.query(
        f"SELECT {cols} FROM {table} WHERE run_id = ? AND list_contains(?, key) ORDER BY {order}",
        [keys, run_id, keys],
    )


def _rank_series(store: Any, run_id: str) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    df = store.query(
        "SELECT f.rank, f.step, f.value AS fp, e.value AS epoch FROM curves f JOIN curves e "
        "ON e.run_id = f.run_id AND e.rank = f.rank AND e.step = f.step AND e.key = ? "
        "WHERE f.run_id = ? AND f.key = ? ORDER BY f.rank, f.step",
        [EPOCH_KEY, run_id, FINGERPRINT_KEY],
    )
    out = {}
    for (rank,), part in df.group_by(["rank"], maintain_order=True):
        out[int(rank)] = (part["step"].to_numpy(), part["fp"].to_numpy(), part["epoch"].to_numpy())
    return out


def _settings(config: Mapping[str, Any], key: str | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
    settings = merge_overrides(analysis_section(config), overrides)
    settings.pop("enabled", None)
    if key is not None:
        settings["keys"] = [glob.escape(key)]
    return settings


def _keys(store: Any, run_id: str, table: str) -> list[str]:
    return store.query(f"SELECT DISTINCT key FROM {table} WHERE run_id = ? ORDER BY key", [run_id])["key"].to_list()


def analyze(
    run_id: str,
    key: str | None = None,
    home: Any = None,
    detectors: Mapping[str, DetectorSpec] | None = None,
    **overrides: Any,
) -> Analysis:
    """Analyse run ``run_id`` (or one ``key`` of it): verdicts, events, stagnant classes."""
    store = _store(home)
    run = find_run(store, run_id)
    run_id = run["run_id"]
    if detectors is None:
        from tracker.host import get_host

        detectors = get_host().items("detectors")
    settings = _settings(run["config"], key, overrides)
    trend_params = resolve("trend", TREND_PARAMS, settings.get("trend"))
    env = _environment(home, run_id)
    cfg = {**run["config"], "analysis": settings}
    probe = OnlineAnalyzer(detectors, config=cfg, run_id=run_id, strict=True, environment=env)
    curve_keys = _keys(store, run_id, "curves")
    scalar_keys = [k for k in curve_keys if probe.selected(k)]
    class_keys = [k for k in _keys(store, run_id, "class_curves") if probe.selected(k)]
    if key is not None and not scalar_keys and not class_keys:
        names = ", ".join(curve_keys) or "none"
        raise ConfigError(f"Unknown key {key!r} in run {run_id!r}; available: {names}")
    names = _class_names(store, run_id)
    analyzers: dict[int, OnlineAnalyzer] = {}

    def analyzer_for(rank: int) -> OnlineAnalyzer:
        """One analyzer per rank, as each rank's flusher has its own."""
        if rank not in analyzers:
            analyzers[rank] = OnlineAnalyzer(
                detectors, config=cfg, run_id=run_id, class_names=names, strict=True, environment=env
            )
        return analyzers[rank]

    records: list[EventRecord] = []
    reports: list[KeyReport] = []
    # the metrics that twin detectors observe come first in each rank (mAP beside a validation loss at 0)
    watched = [k for k in curve_keys if probe.watched(k)] if key is None and scalar_keys else []
    if scalar_keys:
        fed = watched + scalar_keys
        df = _fetch(store, "curves", run_id, fed)
        all_steps, all_values = df["step"].to_numpy(), df["value"].to_numpy().astype(np.float64)
        for rank, k, rows in _groups(df, fed):
            a = analyzer_for(rank)
            steps, values = all_steps[rows], all_values[rows]
            records.extend(EventRecord(rank, e) for e in a.feed(k, steps, values))
            if k not in watched:
                reports.append(_key_report(a, k, rank, steps, values, trend_params, _unit(run)))
    stagnant = _class_analysis(store, run_id, class_keys, analyzer_for, records)
    if key is None or key.startswith(SYSTEM_PREFIX):
        _system_analysis(store, run_id, probe, analyzer_for, records)
    if key is None and any(spec.scope == "ranks" for spec, _ in probe.detectors.values()):
        records.extend(_rank_events(store, run_id, probe))
    findings = _findings(store, run, probe, env, records, whole=key is None)
    records.sort(key=lambda r: (*event_order(r.event), r.rank))
    reports.sort(key=lambda r: (r.key, r.rank))
    return Analysis(
        run_id, run.get("project"), run.get("name"), run.get("status"), reports, records, stagnant, settings,
        findings=sorted(findings, key=lambda r: (r.event.step, r.event.kind, r.rank)), environment=env,
        unit=_unit(run),
    )


def _unit(run: Mapping[str, Any]) -> str:
    """``epoch`` for an imported run (its steps are the file's epochs), else ``step``."""
    return "epoch" if any(str(t).startswith("import:") for t in run.get("tags") or []) else "step"


def _findings(
    store: Any, run: Mapping[str, Any], probe: OnlineAnalyzer, env: dict[str, Any], records: list[EventRecord],
    whole: bool,
) -> list[EventRecord]:
    """The run's findings: the streams' first NaN/inf and divergence per key, then the epoch judges' events
    (only when the whole run is analysed; an epoch divergence of a key the stream flagged is left out)."""
    found = _stream_findings(records)
    if whole:
        streamed = {(r.rank, r.event.key, r.event.kind) for r in found}
        found.extend(
            r for r in epoch_findings(store, run, probe, env) if (r.rank, r.event.key, r.event.kind) not in streamed
        )
    return found


def _stream_findings(records: list[EventRecord]) -> list[EventRecord]:
    """The streaming detectors' events that are findings too: the first NaN/inf and divergence of each key."""
    seen: set[tuple[int, str | None, str]] = set()
    out = []
    for rec in sorted(records, key=lambda r: r.event.step):
        e = rec.event
        if e.kind in FINDING_KINDS and e.data.get("level") != "epoch" and (rec.rank, e.key, e.kind) not in seen:
            seen.add((rec.rank, e.key, e.kind))
            out.append(rec)
    return out


def _environment(home: Any, run_id: str) -> dict[str, Any]:
    """What the run recorded of its machine (``run.json``: gpus, host, ...); empty when unknown."""
    from tracker.spool import home_dir, read_json, run_dir

    meta = read_json(run_dir(home_dir(home), run_id) / "run.json")
    if not isinstance(meta, dict):
        return {}
    return {k: meta[k] for k in ENVIRONMENT_KEYS if k in meta}


def _system_analysis(
    store: Any, run_id: str, probe: OnlineAnalyzer, analyzer_for: Any, records: list[EventRecord]
) -> None:
    """Feed each rank's ``sys/*`` keys to its analyzer's system detectors, in one chunk."""
    if not any(spec.scope == "system" for spec, _ in probe.detectors.values()):
        return
    keys = store.query(
        "SELECT DISTINCT key FROM curves WHERE run_id = ? AND starts_with(key, ?) ORDER BY key", [run_id, SYSTEM_PREFIX]
    )["key"].to_list()
    if not keys:
        return
    df = _fetch(store, "curves", run_id, keys)
    steps, values = df["step"].to_numpy(), df["value"].to_numpy().astype(np.float64)
    by_rank: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for rank, k, rows in _groups(df, keys):
        by_rank.setdefault(rank, {})[k] = (steps[rows], values[rows])
    for rank, series in sorted(by_rank.items()):
        records.extend(EventRecord(rank, e) for e in analyzer_for(rank).feed_system(series))


def _class_names(store: Any, run_id: str) -> dict[int, str]:
    df = store.query("SELECT class_index, name FROM classes WHERE run_id = ?", [run_id])
    return {int(i): str(n) for i, n in zip(df["class_index"].to_list(), df["name"].to_list())}


def _key_report(
    analyzer: OnlineAnalyzer, key: str, rank: int, steps: np.ndarray, values: np.ndarray, params: dict[str, Any],
    unit: str = "step",
) -> KeyReport:
    summary: dict[str, Any] = {}
    for stream in analyzer.streams.get(key, {}).values():
        summary.update(stream.summary())
    word, reason, found = verdict(steps, values, summary, params, unit)
    advice = None
    if summary.get("non_finite_active"):
        advice = precision_hint(analyzer.config, analyzer.environment)
    elif word in ADVICE:
        advice = ADVICE[word]
    finite = np.isfinite(values)
    return KeyReport(
        key=key,
        rank=rank,
        points=int(values.size),
        non_finite=int(values.size - finite.sum()),
        first_step=int(steps[0]) if steps.size else None,
        last_step=int(steps[-1]) if steps.size else None,
        last_value=float(values[-1]) if values.size else None,
        verdict=word,
        reason=reason,
        trend=found,
        detectors=summary,
        advice=advice,
    )


def _class_analysis(
    store: Any, run_id: str, keys: list[str], analyzer_for: Any, records: list[EventRecord]
) -> list[StagnantReport]:
    if not keys:
        return []
    df = _fetch(store, "class_curves", run_id, keys, extra="class_index, ")
    all_steps, all_index = df["step"].to_numpy(), df["class_index"].to_numpy().astype(np.int64)
    all_values = df["value"].to_numpy().astype(np.float64)
    out: list[StagnantReport] = []
    for rank, key, rows in _groups(df, keys):
        analyzer = analyzer_for(rank)
        steps, matrix = pivot_classes(all_steps[rows], all_index[rows], all_values[rows])
        records.extend(EventRecord(rank, e) for e in analyzer.feed_classes(key, steps, matrix))
        stream = analyzer.class_streams.get(key, {}).get("stagnant_classes")
        final = stream.final() if stream is not None else None
        if final is None or not final.classes:
            continue
        classes = [
            StagnantClass(c, analyzer.class_names.get(c, f"class {c}"), r, n)
            for c, r, n in zip(final.classes, final.ref, final.now)
        ]
        out.append(StagnantReport(key, rank, final.step, final.total_now / final.total_ref - 1.0, classes))
    return out


def _rank_events(store: Any, run_id: str, probe: OnlineAnalyzer) -> list[EventRecord]:
    """Cross-rank events: a detector with ``read(store, run_id, probe)`` reads its own rows (identical_batches),
    the others get the fingerprint series of 2+ ranks."""
    series: dict[int, Any] | None = None
    events: list[Event] = []
    for name, (spec, params) in probe.detectors.items():
        if spec.scope == "ranks":
            detector = spec.factory(StreamContext(key=FINGERPRINT_KEY, params=dict(params), config=probe.config))
            read = getattr(detector, "read", None)
            if read is not None:
                events.extend(detector.detect(read(store, run_id, probe)))
                continue
            series = _rank_series(store, run_id) if series is None else series
            if len(series) >= 2:
                events.extend(detector.detect(series))
    return [EventRecord(0, e) for e in events]


def save_events(analysis: Analysis, home: Any = None) -> int:
    """Store the analysis' events and findings that the run's events table lacks; returns how many were added."""
    store = _store(home)
    have = store.query("SELECT rank, step, key, kind FROM events WHERE run_id = ?", [analysis.run_id])
    seen = {(int(r), int(s), k, kind) for r, s, k, kind in have.iter_rows()}
    by_rank: dict[int, list[Event]] = {}
    for rec in [*analysis.events, *analysis.findings]:
        e = rec.event
        if (rec.rank, e.step, e.key, e.kind) not in seen:
            seen.add((rec.rank, e.step, e.key, e.kind))
            by_rank.setdefault(rec.rank, []).append(e)
    return sum(store.add_events(analysis.run_id, evs, rank=rank) for rank, evs in by_rank.items())
