"""The real corpus: published training logs with labels read off their curves, and their scoring.

Rules:

* The corpus is a folder of training folders (``results.csv``, maybe ``args.yaml``)
  and a ``manifest.toml`` with one ``[[run]]`` per folder: its source (repository,
  commit, path), licence, labels and whether it is held out of tuning (the held-out
  third was drawn before any threshold was set). The project's copy is
  ``tests/data/real_runs``.
* A label is ``{kind, onset, best?, key?, reason}``; kinds are :data:`KINDS`. A run
  without labels has no fault: any finding on it is a false positive.
* Runs are imported with the registered Ultralytics importer (the one
  ``tracker import ultralytics`` uses) and judged by ``tracker.analyze``.
* Scoring is per run and kind, by :func:`tracker.analysis.scoring.tally` (the rule
  the fault corpus scores with too): the first event of a kind is a true positive
  when the run has a label of that kind, else a false positive; a label without an
  event is a false negative. Lead time is the event's step minus the label's onset (how
  long the fault had lasted when the analysis said so; 0 for ``stopped_early``,
  which can only be told at the end). For overfitting the best epoch named is
  compared with the label's.
* A run's ``batch`` says when it joined the corpus (manifest key ``batch``; without
  it 1, or 2 for an entry marked ``added_after_draw``). Precision and recall are
  given apart for three parts (:data:`PARTS`): ``tuning`` (``holdout = false``),
  ``holdout`` (held out, of a batch below :data:`FRESH_BATCH`: these have been
  scored and their misses read, so they are held out but *seen*) and ``fresh``
  (held out, batch :data:`FRESH_BATCH` or later: runs no verdict has been run on
  before they are scored; the honest held-out score).
"""

from __future__ import annotations

import statistics
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from tracker.analysis.scoring import Score, Window, tally
from tracker.errors import DataError

KINDS = ("overfitting", "metric_collapse", "zero_loss", "stopped_early", "non_finite", "divergence")
PARTS = ("tuning", "holdout", "fresh")
FRESH_BATCH = 15  # batches 1-14 (418 runs) have all been scored; held-out runs of batch 15 on are fresh


@dataclass
class Label:
    """One fault of a real run, as read off its curves."""

    kind: str
    onset: int
    reason: str
    best: int | None = None
    key: str | None = None


@dataclass
class RealRun:
    """One published training folder of the corpus."""

    name: str
    folder: Path
    holdout: bool
    labels: dict[str, Label]
    source: dict[str, Any] = field(default_factory=dict)
    batch: int = 1

    @property
    def part(self) -> str:
        """``tuning``, ``holdout`` (held out, seen) or ``fresh`` (held out, batch ``FRESH_BATCH`` on)."""
        if not self.holdout:
            return "tuning"
        return "fresh" if self.batch >= FRESH_BATCH else "holdout"


def load_manifest(folder: Path) -> list[RealRun]:
    """The runs of ``folder/manifest.toml`` (a :class:`DataError` names a bad entry)."""
    path = Path(folder) / "manifest.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DataError(f"cannot read the corpus manifest {path}: {exc}") from None
    runs = []
    for entry in data.get("run", []):
        labels = _labels(entry, path)
        run_folder = Path(folder) / str(entry["name"])
        if not (run_folder / "results.csv").exists():
            raise DataError(f"{path}: run {entry['name']!r} has no {run_folder / 'results.csv'}")
        source = {k: entry[k] for k in ("repo", "commit", "path", "licence", "task", "format") if k in entry}
        batch = entry.get("batch", 2 if entry.get("added_after_draw") else 1)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise DataError(f"{path}: run {entry['name']!r} has batch = {batch!r}; a batch is a whole number "
                            "from 1 (leave it out for batch 1)")
        runs.append(RealRun(str(entry["name"]), run_folder, bool(entry.get("holdout")), labels, source, batch))
    return runs


def _labels(entry: Mapping[str, Any], path: Path) -> dict[str, Label]:
    """kind -> :class:`Label` of one ``[[run]]`` entry (a :class:`DataError` names a bad kind)."""
    labels = {}
    for raw in entry.get("labels", []):
        if raw.get("kind") not in KINDS:
            raise DataError(f"{path}: run {entry.get('name')!r} has label kind {raw.get('kind')!r}; "
                            f"kinds are {', '.join(KINDS)}")
        labels[raw["kind"]] = Label(raw["kind"], int(raw["onset"]), str(raw["reason"]), raw.get("best"),
                                    raw.get("key"))
    return labels


@dataclass
class EyeLabels:
    """One run's labels read by eye, and whether the reading was ``clear`` (else borderline)."""

    labels: dict[str, Label]
    clear: bool


def load_eye_labels(folder: Path) -> dict[str, EyeLabels]:
    """name -> :class:`EyeLabels` of ``folder/eye-labels.toml``: the fresh runs labelled a second time, by
    reading their curves without the written definitions, label_runs.py or any verdict ({} when there is
    no such file)."""
    path = Path(folder) / "eye-labels.toml"
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DataError(f"cannot read the eye labels {path}: {exc}") from None
    return {str(entry["name"]): EyeLabels(_labels(entry, path), entry.get("confidence") == "clear")
            for entry in data.get("run", [])}


def load_eye_readers(folder: Path) -> dict[str, dict[str, EyeLabels]]:
    """reader -> name -> :class:`EyeLabels` of ``folder/eye-readers/*.toml``: the runs read by several readers
    apart, one file per reader (the file's stem names the reader; {} when there is no such folder). Their
    majority (:func:`majority`) is what ``eye-labels.toml`` holds for those runs."""
    out = {}
    for path in sorted((Path(folder) / "eye-readers").glob("*.toml")):
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise DataError(f"cannot read the eye labels {path}: {exc}") from None
        out[path.stem] = {str(e["name"]): EyeLabels(_labels(e, path), e.get("confidence") == "clear")
                          for e in data.get("run", [])}
    return out


def majority(readings: Mapping[str, EyeLabels]) -> EyeLabels:
    """One run's labels from several independent readings (reader -> :class:`EyeLabels`): a kind is labelled
    when more than half the readers label it, at the median onset (and best epoch) of those that do, with
    their most common key; ``clear`` only when every reader gives the same kinds and calls its reading clear."""
    if not readings:
        raise ValueError("majority() needs at least one reading")
    n = len(readings)
    labels = {}
    for kind in KINDS:
        agree = [r.labels[kind] for r in readings.values() if kind in r.labels]
        if 2 * len(agree) <= n:
            continue
        keys = [a.key for a in agree if a.key]
        bests = [a.best for a in agree if a.best is not None]
        labels[kind] = Label(kind, int(statistics.median_low([a.onset for a in agree])),
                             f"{len(agree)} of {n} readers: {agree[0].reason}",
                             int(statistics.median_low(bests)) if bests else None,
                             max(keys, key=keys.count) if keys else None)
    kinds = {frozenset(r.labels) for r in readings.values()}
    return EyeLabels(labels, len(kinds) == 1 and all(r.clear for r in readings.values()))


def as_detections(labels: Mapping[str, Label]) -> dict[str, Detection]:
    """One reader's labels of a run as if they were findings (kind -> a :class:`Detection` at the label's
    onset, naming its key and best epoch), to score a reader like a verdict."""
    return {k: Detection(lab.onset, lab.key, {} if lab.best is None else {"best_step": lab.best})
            for k, lab in labels.items()}


def readers_agreement(runs: Iterable[RealRun], readers: Mapping[str, Mapping[str, EyeLabels]],
                      found: Mapping[str, Mapping[str, Detection]] | None = None,
                      into: dict[str, RealScore] | None = None) -> dict[str, RealScore]:
    """How far labellers agree, one against another, on the runs every reader of ``readers`` read.

    Without ``found``: each reader's labels scored as findings against each other reader's (every ordered
    pair, pooled: a label one reader gives and the other does not is a false positive one way and a miss
    the other, so the pooled precision equals the pooled recall, the readers' F1). With ``found`` (name ->
    kind -> :class:`Detection`, the verdicts): the verdicts scored against each reader in turn, pooled the
    same way. Both are one labeller against one other, on the same runs: what the verdicts reach against
    a single reader next to what a reader reaches against another. The runs' own labels are not read.
    ``into`` (kind -> :class:`RealScore`, as returned) adds to an earlier group's pooled scores."""
    runs = list(runs)
    names = set.intersection(*(set(r) for r in readers.values())) if readers else set()
    subset = [r for r in runs if r.name in names]
    pooled = into if into is not None else {k: RealScore(k) for k in KINDS}
    for truth, labels in readers.items():
        truth_runs = [replace(r, labels=labels[r.name].labels, holdout=False) for r in subset]
        judges = ([found] if found is not None else
                  [{n: as_detections(other[n].labels) for n in names} for who, other in readers.items()
                   if who != truth])
        for judge in judges:
            for kind, s in score(truth_runs, judge)["tuning"].items():
                p = pooled[kind]
                p.runs += s.runs
                p.tp, p.fp, p.fn = p.tp + s.tp, p.fp + s.fp, p.fn + s.fn
                p.lead_steps += s.lead_steps
                p.best_errors += s.best_errors
                p.misses += s.misses
                p.alarms += s.alarms
    return pooled


def import_corpus(runs: Iterable[RealRun], home: Path) -> dict[str, str]:
    """Import every run's folder into the store under ``home`` with the Ultralytics importer; name -> run id."""
    from tracker.host import get_host
    from tracker.importer import NullReporter, import_runs

    importer = get_host().items("importers")["ultralytics"]
    runs = list(runs)
    sources = list(importer.read(NullReporter(), dirs=tuple(r.folder for r in runs)))
    import_runs(sources, home)
    by_folder = {Path(s.source).resolve(): s.run_id for s in sources}
    return {r.name: by_folder[r.folder.resolve()] for r in runs}


@dataclass
class Detection:
    """The first event of one kind on one run."""

    step: int
    key: str | None
    data: dict[str, Any]


def detections(events: Iterable[Any]) -> dict[str, Detection]:
    """kind -> first :class:`Detection` among an analysis' events (``EventRecord`` or ``Event``)."""
    out: dict[str, Detection] = {}
    for rec in events:
        e = getattr(rec, "event", rec)
        if e.kind in KINDS and (e.kind not in out or e.step < out[e.kind].step):
            out[e.kind] = Detection(int(e.step), e.key, dict(e.data or {}))
    return out


@dataclass
class RealScore(Score):
    """A :class:`~tracker.analysis.scoring.Score` plus, for overfitting, how far the best epoch named is off."""

    best_errors: list[int] = field(default_factory=list)


def score(runs: Iterable[RealRun], found: Mapping[str, Mapping[str, Detection]]) -> dict[str, dict[str, RealScore]]:
    """``{part: {kind: RealScore}}`` for each of :data:`PARTS`, by :func:`tracker.analysis.scoring.tally`.

    ``tuning``: the runs not held out; ``holdout``: held out and seen (batches before
    :data:`FRESH_BATCH`); ``fresh``: held out, batch :data:`FRESH_BATCH` or later.
    """
    out = {part: {k: RealScore(k) for k in KINDS} for part in PARTS}
    for run in runs:
        part = out[run.part]
        got = found.get(run.name, {})
        for kind in KINDS:
            label, det = run.labels.get(kind), got.get(kind)
            windows = [Window(label.onset, label=label)] if label else []
            for lab, hit in tally(part[kind], run.name, windows, [det] if det else []):
                if kind == "overfitting" and lab.label.best is not None and hit.data.get("best_step") is not None:
                    part[kind].best_errors.append(abs(int(hit.data["best_step"]) - lab.label.best))
    return out


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def format_table(scores: Mapping[str, RealScore], title: str) -> str:
    """A plain-text table of one part's scores."""
    head = f"{'verdict':16} {'P':>5} {'R':>5} {'TP':>3} {'FP':>3} {'FN':>3} {'lead mean':>9} {'lead med':>8}  notes"
    lines = [title, head, "-" * len(head)]
    for kind, s in scores.items():
        mean = statistics.fmean(s.lead_steps) if s.lead_steps else None
        med = statistics.median(s.lead_steps) if s.lead_steps else None
        notes = []
        if s.best_errors:
            notes.append(f"best epoch within {max(s.best_errors)} of the label")
        if s.misses:
            notes.append("missed: " + ", ".join(s.misses))
        if s.alarms:
            notes.append("false: " + ", ".join(s.alarms))
        lines.append(f"{kind:16} {_num(s.precision):>5} {_num(s.recall):>5} {s.tp:>3} {s.fp:>3} {s.fn:>3} "
                     f"{_num(mean, 1):>9} {_num(med, 1):>8}  {'; '.join(notes)}")
    return "\n".join(lines)
